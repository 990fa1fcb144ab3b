#!/bin/sh
# bench/bench_pipeline.sh (make bench-pipeline): the pipeline bubble, measured.
# P = 4 stages, M = 4, 8, 16 micro-batches, under each schedule ./train runs:
# gpipe, 1f1b, interleaved (--virtual 2), zb-h1 and zb-h2 (pp_sched.h), on
# the CPU with each rank pinned to its own cores when the host has enough;
# each stage's idle fraction over the steps after the first, read from the
# Chrome trace (compute = forward, backward and weight-gradient spans less
# the waits for neighbours inside them), beside the schedule's formula in
# unit slots (pp_bubble_formula: F, B and W, or a chunk's F and B, one slot
# each; real times differ, so expect the order of the schedules more than
# the digits). What the host must have: a core per rank (P = 4 here) with
# --pin-cores, or the ranks time-share cores and an idle stage is only a
# stage waiting for a core: the table then says so. A schedule ./train
# does not accept yet is reported as "not supported by ./train yet".
cd "$(dirname "$0")/.." || exit 2
DATA=${DATA:-../shared/data/tinyshakespeare.txt}
[ -f "$DATA" ] || DATA=data/tinyshakespeare_train.txt
P=4
STEPS=${STEPS:-4}
MS=${MS:-"4 8 16"}
SCHEDULES=${SCHEDULES:-"gpipe 1f1b interleaved zb-h1 zb-h2"}
MODEL="--layers 8 --heads 4 --dim 128 --seq 64 --batch 2 --vocab 256 --device cpu"
mkdir -p test/out
echo "bench-pipeline: P=$P, $(nproc) cores, model: $MODEL, $STEPS steps (the first not counted)"
echo "needs: $P cores or more (one a rank, pinned) for the idle figures to measure the bubble"
[ "$(nproc)" -lt $P ] && echo "note: $(nproc) cores for $P ranks: stages share cores, so idle time is not a bubble measurement"
printf "%-16s %4s %-26s %s\n" schedule M "formula (unit slots)" "measured idle per stage (0..3), mean"
for sched in $SCHEDULES; do
    V=1
    EXTRA=""
    if [ $sched = interleaved ]; then V=2; EXTRA="--virtual $V"; fi
    for M in $MS; do
        out=test/out/bench_pipeline_${sched}_$M.json
        log=test/out/bench_pipeline_${sched}_$M.log
        ./train --data "$DATA" $MODEL --ranks $P --pp $P --schedule $sched $EXTRA --micro-batches $M \
            --steps "$STEPS" --pin-cores --trace "$out" > "$log" 2>&1
        rc=$?
        if [ $rc -ne 0 ]; then
            label=$sched
            [ $V -gt 1 ] && label="$sched V=$V"
            why=$(grep -i -m 1 -e "unknown flag" -e "unrecognized" -e "not built yet" -e "no $sched schedule" \
                -e "schedule must be" "$log")
            if [ -n "$why" ]; then
                printf "%-16s %4s %s\n" "$label" $M "not supported by ./train yet ($why)"
            else
                printf "%-16s %4s %s\n" "$label" $M "failed (exit $rc): $(tail -n 1 "$log")"
            fi
            continue
        fi
        python3 bench/pipeline_idle.py "$out" $P $M $sched $V
    done
done
