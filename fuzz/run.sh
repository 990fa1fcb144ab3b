#!/bin/sh
# fuzz/run.sh SECONDS: runs each libFuzzer target of fuzz/build for SECONDS,
# all seven at once, from its seed corpus (fuzz/seeds.sh; the corpus grows in
# fuzz/build/corpus/<target>). One line a target: PASS with its executions,
# or FAIL with the input that crashed it (fuzz/build/crash-*).
cd "$(dirname "$0")/.." || exit 2
secs=${1:-60}
B=${FUZZ_BUILD:-fuzz/build}
sh fuzz/seeds.sh $B/seeds || { echo "FAIL fuzz: cannot make the seed corpus"; exit 1; }
status=0
# the seven at once (each for SECONDS of wall time, sharing the cores), then one line each
for t in model tokens tokenizer args eval manifest log; do
    corpus=$B/corpus/$t
    mkdir -p $corpus
    cp $B/seeds/$t/* $corpus/
    ($B/fuzz_$t $corpus -max_total_time=$secs -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
        -artifact_prefix=$B/ -print_final_stats=1 > $B/fuzz_$t.log 2>&1; echo $? > $B/fuzz_$t.rc) &
done
wait
for t in model tokens tokenizer args eval manifest log; do
    corpus=$B/corpus/$t
    log=$B/fuzz_$t.log
    rc=$(cat $B/fuzz_$t.rc)
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' $log | tail -n 1)
    if [ $rc -eq 0 ]; then
        echo "PASS fuzz $t: ${runs:-?} executions in ${secs}s, no finding ($(ls $corpus | wc -l) inputs in the corpus)"
    else
        status=1
        echo "FAIL fuzz $t: exit $rc after ${runs:-?} executions: $(grep -m1 -E 'ERROR|SUMMARY|runtime error' $log) (see $log)"
    fi
done
exit $status
