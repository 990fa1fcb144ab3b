#!/bin/sh
# test/test_reliability.sh: no failure quietly spoils a run (issue 40; docs/cli.md's exit
# statuses, docs/checkpoints.md's stops).
#   1. a NaN or an Inf in --init's model file: exit 2, one line naming the file and the
#      tensor, no checkpoint published;
#   2. divergence: a model that overflows in its first forward (--init with huge weights)
#      exits 1 naming step 1 and publishes nothing; a run whose weights blow up (--lr 10
#      --wd 10) exits 1 naming the step, with `latest` left on the checkpoint before it and
#      nothing of the step on disk: on one rank, and on --ranks 2 --pp 2 with
#      --checkpoint-async, and under an external launcher (both ranks exit 1, none hangs);
#   3. SIGTERM to each rank in turn of a 4-rank job under an external launcher (torchrun's
#      variables): every rank exits 75 each time, and the resumed run's --save is bitwise
#      a straight run's;
#   4. a full disk (a small tmpfs where mounting is allowed, else `ulimit -f`) for --log,
#      --plot and --trace: one line, training to the end, exit 1; for a checkpoint: exit 1,
#      the previous checkpoint intact and resumable;
#   5. a byte file named .bin says so in one line before training; a bad-input exit after a
#      warning (--val sharing --data) is the one line of the error.
# Every wait is for an event (a line in a log, a process gone), bounded only as a failure.
# NO_MOUNT=1 tries the ulimit -f fallback of 4. where mounting works.
. "$(dirname "$0")/lib.sh"
t_init reliability
t_need_python3 reliability "to write the damaged model files"
D="--data test/fixtures/ref_tokens.bin --seq 8 --device cpu --batch 4"
M="--layers 2 --heads 2 --dim 16 --max-seq 16 --vocab 61"

# no_ckpt DIR: DIR holds no published checkpoint (no latest, no step-N)
no_ckpt() { [ ! -e "$1/latest" ] && [ -z "$(ls "$1" 2>/dev/null | grep '^step-')" ]; }
# alive PID: a process that exists and is not a zombie
alive() { s=$(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null) && [ "$s" != Z ] && [ "$s" != X ]; }
# wait_gone SECONDS PID...: until every PID is gone (1 if some outlived SECONDS: a hang)
wait_gone() {
    lim=$(($1 * 20)); shift
    while [ $lim -gt 0 ]; do
        left=""
        for p in "$@"; do alive "$p" && left="$left $p"; done
        [ -z "$left" ] && return 0
        sleep 0.05; lim=$((lim - 1))
    done
    return 1
}
# wait_line SECONDS FILE PATTERN: until FILE holds a line matching PATTERN
wait_line() {
    lim=$(($1 * 20))
    while [ $lim -gt 0 ]; do grep -q -- "$3" "$2" 2>/dev/null && return 0; sleep 0.05; lim=$((lim - 1)); done
    return 1
}
port=$((21000 + $$ % 20000))
UNSET="-u SLURM_PROCID -u SLURM_NTASKS -u SLURM_STEP_ID -u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE -u PMI_RANK -u PMI_SIZE"
# ext WORLD LOGPREFIX ARGS...: starts WORLD ranks under torchrun's variables; pids in $pids
ext() {
    world=$1; pre=$2; shift 2
    port=$((port + 1)); pids=""; r=0
    while [ $r -lt "$world" ]; do
        # shellcheck disable=SC2086
        env $UNSET TORCHELASTIC_RUN_ID=reliability-$$ RANK=$r WORLD_SIZE=$world LOCAL_RANK=$r LOCAL_WORLD_SIZE=$world MASTER_ADDR=127.0.0.1 \
            MASTER_PORT=$port ./train "$@" > "$pre.$r.log" 2>&1 &
        pids="$pids $!"; r=$((r + 1))
    done
}
# ext_wait: the exit statuses of $pids in rank order, in $codes ("hang" and killed if past 120 s)
ext_wait() {
    codes=""
    if ! wait_gone 120 $pids; then for p in $pids; do kill -9 "$p" 2>/dev/null; done; codes="hang"; fi
    for p in $pids; do wait "$p"; codes="$codes $?"; done
    codes=$(echo $codes)
}

# ---- 1. a non-finite value in --init's file -------------------------------------------
./train $D $M --steps 0 --save $OUT/init.bin > $OUT/init.log 2>&1 || bad "writing the model file: $(tail -n 1 $OUT/init.log)"
python3 - "$OUT" << 'EOF'
import array, sys
out = sys.argv[1]
raw = open(out + "/init.bin", "rb").read()
head, w = raw[:1024], array.array("f")
w.frombytes(raw[1024:])
def put(name, vals):
    open(out + "/" + name, "wb").write(head + vals.tobytes())
nan = array.array("f", w); nan[3000] = float("nan"); put("nan.bin", nan)
inf = array.array("f", w); inf[len(w) - 5] = float("-inf"); put("inf.bin", inf)
put("huge.bin", array.array("f", [x * 1e30 for x in w]))
EOF
for what in "nan.bin:NaN in qkvw of layer 0" "inf.bin:-Inf in lnfb"; do
    f=${what%%:*}; want=${what#*:}
    rm -rf $OUT/ck_$f
    ./train $D --init $OUT/$f --steps 3 --checkpoint-dir $OUT/ck_$f > $OUT/$f.out 2> $OUT/$f.err
    rc=$?
    if [ $rc -eq 2 ] && [ "$(wc -l < $OUT/$f.err)" -eq 1 ] && grep -q "model file $OUT/$f: $want, element" $OUT/$f.err &&
       ! grep -q '^step ' $OUT/$f.out && no_ckpt $OUT/ck_$f; then
        ok "--init with $want: exit 2, '$(cat $OUT/$f.err)', no step trained, no checkpoint"
    else bad "--init $f: exit $rc, stderr '$(head -n 2 $OUT/$f.err | tr '\n' ' ')', $(grep -c '^step ' $OUT/$f.out) steps"; fi
done

# ---- 2. divergence --------------------------------------------------------------------
rm -rf $OUT/ck_huge
./train $D --init $OUT/huge.bin --steps 3 --checkpoint-dir $OUT/ck_huge --checkpoint-every 1 > $OUT/huge.out 2> $OUT/huge.err
rc=$?
if [ $rc -eq 1 ] && [ "$(wc -l < $OUT/huge.err)" -eq 1 ] && grep -q '^train: step 1 diverged: the loss is' $OUT/huge.err &&
   no_ckpt $OUT/ck_huge; then ok "weights that overflow the forward: exit 1, '$(cat $OUT/huge.err)', nothing published"
else bad "overflowing weights: exit $rc, stderr '$(head -n 2 $OUT/huge.err | tr '\n' ' ')', $(ls $OUT/ck_huge 2>&1 | tr '\n' ' ')"; fi

# --lr 10 --wd 10 multiplies the matrices by -99 a step: a few finite steps (each
# checkpointed, --keep 2), then a NaN gradient norm or loss
BLOW="--lr 10 --wd 10 --lr-decay none --steps 40 --checkpoint-every 1 --keep 2"
# diverged_ok NAME CKDIR ERRFILE RC [ASYNC]: exit 1; latest the step before the one named (with
# ASYNC, whose save of that step is still in flight, the one before it), nothing of it or later
diverged_ok() {
    n=$(sed -n 's/^train: step \([0-9]*\) diverged: .*/\1/p' "$3" | head -n 1)
    latest=$(cat "$2/latest" 2>/dev/null)
    after=$(ls -a "$2" | sed -n 's/^\.\{0,1\}step-\([0-9]*\).*/\1/p' | awk -v n="${n:-0}" '$1 >= n' | tr '\n' ' ')
    want="step-$((${n:-0} - 1 - ${5:-0}))"
    if [ "$4" -eq 1 ] && [ -n "$n" ] && [ "$n" -gt 2 ] && [ "$latest" = "$want" ] && [ -z "$after" ]; then
        ok "$1: exit 1 at step $n ('$(grep diverged "$3")'), latest is $latest, nothing of step $n or later on disk"
    else bad "$1: exit $4, diverged at '${n}', latest '$latest', step directories from it on: '$after' (see $3)"; fi
}
rm -rf $OUT/ck_blow
./train $D $M $BLOW --checkpoint-dir $OUT/ck_blow > $OUT/blow.out 2> $OUT/blow.err
diverged_ok "a run that blows up, one rank" $OUT/ck_blow $OUT/blow.err $?
rm -rf $OUT/ck_blow2
timeout 120 ./train $D $M $BLOW --ranks 2 --pp 2 --micro-batches 2 --checkpoint-async --checkpoint-dir $OUT/ck_blow2 \
    > $OUT/blow2.out 2> $OUT/blow2.err
diverged_ok "a run that blows up, --ranks 2 --pp 2, --checkpoint-async" $OUT/ck_blow2 $OUT/blow2.err $? 1
# under an external launcher: no supervisor, each rank must stop by itself at the same step
rm -rf $OUT/ck_blow3
ext 2 $OUT/blow3 $D $M $BLOW --pp 2 --micro-batches 2 --checkpoint-dir $OUT/ck_blow3
ext_wait
if [ "$codes" = "1 1" ] && ! grep -q 'died\|another rank' $OUT/blow3.0.log $OUT/blow3.1.log; then
    diverged_ok "a run that blows up, 2 ranks under torchrun's variables (both exit 1, neither names the other)" \
        $OUT/ck_blow3 $OUT/blow3.0.log 1
else bad "blow-up under an external launcher: exit statuses '$codes' (see $OUT/blow3.*.log)"; fi

# ---- 3. SIGTERM to each rank in turn of a 4-rank external job ------------------------------
S4="$D --layers 2 --heads 2 --dim 16 --max-seq 16 --vocab 61 --batch 2 --tp 2 --pp 2 --micro-batches 2 --lr-decay none"
rm -rf $OUT/ck_term
allstop=1; said=""
for victim in 0 1 2 3; do
    ext 4 $OUT/term$victim $S4 --steps 100000 --checkpoint-dir $OUT/ck_term --checkpoint-every 50 --resume
    # the event: rank 0 has printed a step of this run (every rank is in the loop, handlers in place)
    if wait_line 60 $OUT/term$victim.0.log '^step '; then
        kill -TERM "$(echo $pids | cut -d' ' -f$((victim + 1)))"
    fi
    ext_wait
    said="$said $(sed -n 's/^stopped by signal 15 after step \([0-9]*\) (.*, on rank \([0-9]\))$/\1@\2/p' $OUT/term$victim.0.log)"
    [ "$codes" = "75 75 75 75" ] && grep -q "on rank $victim)" $OUT/term$victim.0.log || {
        allstop=0; bad "SIGTERM to rank $victim of 4: exit statuses '$codes' (see $OUT/term$victim.*.log)"; }
done
k=$(sed -n 's/^step-//p' $OUT/ck_term/latest 2>/dev/null)
if [ $allstop = 1 ] && [ -n "$k" ]; then
    ok "SIGTERM to each rank in turn of 4 under torchrun's variables: every rank exited 75 each time (step@rank:$said)"
    end=$((k + 3))
    timeout 300 ./train $S4 --ranks 4 --steps $end --save $OUT/term_straight.bin > $OUT/term_straight.log 2>&1
    ext 4 $OUT/term_resume $S4 --steps $end --checkpoint-dir $OUT/ck_term --resume --save $OUT/term_resumed.bin
    ext_wait
    if [ "$codes" = "0 0 0 0" ] && cmp -s $OUT/term_straight.bin $OUT/term_resumed.bin; then
        ok "the resume from step $k to $end after the four stops: --save bitwise the straight run's"
    else bad "resume after the stops: exit statuses '$codes', $(cmp $OUT/term_straight.bin $OUT/term_resumed.bin 2>&1)"; fi
fi

# ---- 4. a full disk ---------------------------------------------------------------------
FS=$OUT/fs
mkdir -p $FS
if [ -z "$NO_MOUNT" ] && mount -t tmpfs -o size=64k tmpfs $FS 2> /dev/null; then how="a 64 KiB tmpfs"
else how="ulimit -f (8 KiB a file)"; fi
# each case: 300 steps writing one file into the full disk, stdout piped (never limited by
# ulimit -f): one line on rank 0 naming the flag, training to the end, exit 1
for case in "log:--log:--log $FS/out.jsonl" "plot:--plot:--plot $FS/out.svg" "trace:--trace:--trace $FS/out.json --ranks 2"; do
    name=${case%%:*}; rest=${case#*:}; flag=${rest%%:*}; flags=${rest#*:}
    rm -f $FS/out* $FS/fill
    [ "$how" = "a 64 KiB tmpfs" ] && dd if=/dev/zero of=$FS/fill bs=1k count=56 2> /dev/null   # 8 KiB left
    # shellcheck disable=SC2086
    if [ "$how" = "a 64 KiB tmpfs" ]; then sh -c "./train $D $M --steps 300 $flags 2> $OUT/full_$name.err; echo \$? > $OUT/full_$name.rc" |
        tail -n 3 > $OUT/full_$name.out
    else sh -c "ulimit -f 16; ./train $D $M --steps 300 $flags 2> $OUT/full_$name.err; echo \$? > $OUT/full_$name.rc" |
        tail -n 3 > $OUT/full_$name.out; fi
    rc=$(cat $OUT/full_$name.rc)
    if [ "$rc" -eq 1 ] && grep -q "^summary: " $OUT/full_$name.out &&
       [ "$(grep -c -e "^train: rank 0: $flag" -e "^train: $flag" $OUT/full_$name.err)" -eq 1 ] &&
       grep -q "the run goes on without it and will exit 1\|the run goes on and will exit 1" $OUT/full_$name.err; then
        ok "$flag on a full disk ($how): one line on rank 0 ('$(grep -m1 -e "^train: .*$flag" $OUT/full_$name.err)'), 300 steps, exit 1"
    else bad "$flag on a full disk ($how): exit $rc, stderr '$(head -n 3 $OUT/full_$name.err | tr '\n' ' ')'"; fi
done
rm -f $FS/out* $FS/fill
if grep -q 'plot not written' $OUT/full_plot.out; then ok "the summary names no plot that was not written"
else bad "summary after a failed --plot: $(tail -n 1 $OUT/full_plot.out)"; fi
if [ "$how" = "a 64 KiB tmpfs" ]; then
    umount $FS
    # 128 KiB holds one checkpoint of this model (80 KiB with its lock and latest), not two
    mount -t tmpfs -o size=128k tmpfs $FS
    M1="--layers 1 --heads 2 --dim 16 --max-seq 16 --vocab 61"
    ./train $D $M1 --steps 6 --checkpoint-dir $FS/ck --checkpoint-every 2 --keep 1 > $OUT/full_ck.out 2> $OUT/full_ck.err
    rc=$?
    rm -rf $OUT/full_ck_copy
    cp -r $FS/ck $OUT/full_ck_copy 2> /dev/null
    umount $FS
    rm -f $OUT/full_ck_copy/.lock
    latest=$(cat $OUT/full_ck_copy/latest 2> /dev/null)
    ./train $D $M1 --steps 3 --checkpoint-dir $OUT/full_ck_copy --resume > $OUT/full_ck_resume.out 2>&1
    rc2=$?
    if [ $rc -eq 1 ] && [ "$(wc -l < $OUT/full_ck.err)" -eq 1 ] && [ "$latest" = step-2 ] &&
       [ $rc2 -eq 0 ] && grep -q '^resumed from .*step-2 at step 2' $OUT/full_ck_resume.out; then
        ok "a checkpoint on a full disk: exit 1, '$(cat $OUT/full_ck.err)'; latest still step-2, which resumes"
    else bad "a checkpoint on a full disk: exit $rc ($(cat $OUT/full_ck.err)), latest $latest, resume exit $rc2"; fi
else
    umount $FS 2> /dev/null
    echo "SKIP a checkpoint on a full disk: no tmpfs can be mounted here (ulimit -f would stop the first checkpoint too)"
fi
rmdir $FS 2> /dev/null

# ---- 5. lines before training ---------------------------------------------------------------
tail -c +5 test/fixtures/ref_tokens.bin > $OUT/bytes.bin   # the magic cut off: read as bytes
./train --data $OUT/bytes.bin --seq 8 --device cpu --batch 4 $M --vocab 256 --steps 1 > $OUT/bytes.out 2> $OUT/bytes.err
rc=$?
./train $D $M --steps 1 > $OUT/tokens.out 2> $OUT/tokens.err
if [ $rc -eq 0 ] && [ "$(wc -l < $OUT/bytes.err)" -eq 1 ] &&
   grep -q "^train: --data: $OUT/bytes.bin has no llm.c token header (magic 20240520): read as bytes" $OUT/bytes.err &&
   grep -q '^step 1/1' $OUT/bytes.out && [ ! -s $OUT/tokens.err ]; then
    ok "a .bin file read as bytes says so before training: '$(cat $OUT/bytes.err)'; a token file says nothing"
else bad "a .bin byte file: exit $rc, stderr '$(cat $OUT/bytes.err)', token file's stderr '$(cat $OUT/tokens.err)'"; fi
./train $D $M --val test/fixtures/ref_tokens.bin --ranks 3 --tp 3 --steps 1 > $OUT/warn.out 2> $OUT/warn.err
rc=$?
if [ $rc -eq 2 ] && [ "$(wc -l < $OUT/warn.err)" -eq 1 ] && ! grep -q warning $OUT/warn.err; then
    ok "a bad-input exit after a warning is one line: '$(cat $OUT/warn.err)'"
else bad "a bad-input exit after a warning: exit $rc, $(wc -l < $OUT/warn.err) lines: $(tr '\n' '|' < $OUT/warn.err)"; fi
./train $D $M --val test/fixtures/ref_tokens.bin --val-batches 1 --steps 1 > $OUT/warn2.out 2> $OUT/warn2.err
if [ $? -eq 0 ] && grep -q '^train: warning: the training data and the validation data share 1 file' $OUT/warn2.err; then
    ok "the warning itself still comes, once the checks have passed"
else bad "the overlap warning is gone: $(cat $OUT/warn2.err)"; fi
t_end reliability
