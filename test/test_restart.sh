#!/bin/sh
# test/test_restart.sh: one command line, from the first run to the last
# (docs/checkpoints.md, "Runs that stop and start").
#   1. the loop: the same ./train line (--init, --resume, a short --time-limit)
#      run again and again from an empty checkpoint directory until it exits
#      0, with one SIGUSR1 and one kill -9 on the way: every early stop exits
#      75, and the final --save is bitwise the uninterrupted run's; on one
#      rank and on --dp 2 --tp 2 --pp 2 --zero 1, each with and without
#      --checkpoint-async;
#   2. flags that disagree with the model file or the checkpoint: one line
#      naming both values, exit 2; equal flags accepted;
#   3. the lock: a second run on the same directory is refused, naming the first;
#   4. slurm/train.sbatch under a faked Slurm (its variables, a requeue as a
#      loop, the signal sbatch --signal=USR1 sends), ending on the same model.
. "$(dirname "$0")/lib.sh"
t_init restart
D="--data test/fixtures/ref_tokens.bin --seq 8 --device cpu"
MODEL="--layers 2 --heads 4 --dim 128 --max-seq 16 --vocab 61"
# the model file every run starts from (--init): 2 layers, 64 wide, written by train itself
./train $D $MODEL --steps 0 --save $OUT/init.bin > $OUT/init.log 2>&1 || bad "writing the --init file: $(tail -n 1 $OUT/init.log)"
STEPS=40

# waits until no process of a run on $1 is left (a kill -9'd supervisor's ranks die by PDEATHSIG)
wait_gone() { for i in $(seq 1 100); do pgrep -f -- "--checkpoint-dir $1 " > /dev/null || return 0; sleep 0.1; done; }

loop() {   # name, layout flags, checkpoint flags, steps
    name=$1; layout=$2; ckflags=$3; steps=$4; d=$OUT/$(echo "$name" | tr -c 'a-z0-9\n' '_')
    mkdir -p $d
    timeout 600 ./train $D --init $OUT/init.bin $MODEL $layout --steps $steps --save $d/straight.bin > $d/straight.log 2>&1 ||
        { bad "$name: the straight run failed (see $d/straight.log)"; return; }
    # the one command line; its --time-limit shorter than any step, so that every run stops
    # after exactly one step (stop.c: once a step is done and the clock says so) and the loop
    # takes `steps` runs on any machine. (A limit from the straight run's time did not: a
    # straight run slowed by a loaded machine gave the later runs, on a quieter one, a limit
    # longer than all their steps: 75 137 0, no run stopped by the clock.) The signals of the
    # first two runs come before their first step ends whatever the limit (signal_held).
    tl=0.00001
    set -- ./train $D --init $OUT/init.bin $MODEL $layout --steps $steps --checkpoint-dir $d/ck --checkpoint-every 3 \
        $ckflags --resume --time-limit $tl --save $d/final.bin
    codes=""
    nr=$(echo "$layout" | sed -n 's/.*--ranks \([0-9]*\).*/\1/p')
    signal_held USR1 $d/run1.log $d/ck ${nr:-0} "$@"; codes="$codes $?"
    signal_held KILL $d/run2.log $d/ck ${nr:-0} "$@"; codes="$codes $?"
    wait_gone $d/ck
    # until a run exits other than 75; each run that stops must have trained further than the
    # last (a time-limit stop comes after a step), so the loop ends within steps runs however
    # slow the machine (a fixed count of runs did not: at a load of 16 on 2 cores a step took
    # seconds, a run made one, and 80 runs ended at step 95 of 200)
    n=2; last=-1; stalled=""
    while :; do
        n=$((n + 1))
        timeout 600 "$@" > $d/run$n.log 2>&1
        rc=$?
        codes="$codes $rc"
        [ $rc -eq 75 ] || break
        at=$(sed -n 's/^stopped at step \([0-9]*\):.*/\1/p' $d/run$n.log)
        if [ -z "$at" ] || [ "$at" -le "$last" ]; then stalled="run $n stopped at step ${at:-?}, the one before at $last; "; break; fi
        last=$at
    done
    early=$(echo $codes | tr ' ' '\n' | head -n -1)
    bad_early=$(echo "$early" | grep -v -x -e 75 -e 137 | tr '\n' ' ')
    fresh=$(grep -c '^resume: no checkpoint' $d/run1.log)
    stops=$(cat $d/run*.log | grep -c 'the same command continues')
    if [ $rc -eq 0 ] && [ -z "$stalled" ] && [ -z "$bad_early" ] && [ "$fresh" = 1 ] && cmp -s $d/final.bin $d/straight.bin &&
       echo $codes | grep -q '^75 137 ' && grep -q 'stopped by signal 10' $d/run1.log &&
       grep -q '^stopped by --time-limit' $d/run*.log; then
        ok "$name: one command line, $n runs (exit statuses$codes), $stops stops with a checkpoint; the final model is bitwise the straight run's"
    else
        bad "$name: ${stalled}exit statuses$codes (last $rc), fresh start said $fresh times, final model $(cmp $d/final.bin $d/straight.bin 2>&1 | head -c 80) (see $d)"
    fi
}
# (a run a step: 24 steps on one rank, 12 on eight, so that the loop stays short)
loop "one rank" "--batch 4" "" 24
loop "one rank, --checkpoint-async" "--batch 4" --checkpoint-async 24
loop "dp 2 x tp 2 x pp 2, zero 1" "--ranks 8 --dp 2 --tp 2 --pp 2 --zero 1 --batch 2 --micro-batches 2" "" 12
loop "dp 2 x tp 2 x pp 2, zero 1, --checkpoint-async" \
    "--ranks 8 --dp 2 --tp 2 --pp 2 --zero 1 --batch 2 --micro-batches 2" --checkpoint-async 12

# ---- --log across restarts: every step once, and the plot of the whole run ----
d=$OUT/log
mkdir -p $d
timeout 300 ./train $D $MODEL --batch 4 --steps $STEPS --val test/fixtures/ref_tokens.bin --val-every 5 --val-batches 1 \
    --log $d/straight.jsonl --plot $d/straight.svg > $d/straight.log 2>&1
# a --time-limit shorter than any step: each run stops after exactly one step (stop.c stops
# once a step is done and the clock says so), so the number of runs is $STEPS on any machine
# (a quarter of the straight run's time was not: a run on a machine quieter than the straight
# run's did all 40 steps inside it)
tl=0.00001
n=0; rc=75
while [ $rc -eq 75 ] && [ $n -le $STEPS ]; do
    n=$((n + 1))
    timeout 300 ./train $D $MODEL --batch 4 --steps $STEPS --val test/fixtures/ref_tokens.bin --val-every 5 --val-batches 1 \
        --log $d/run.jsonl --plot $d/run.svg --checkpoint-dir $d/ck --checkpoint-every 4 --resume --time-limit $tl \
        > $d/run$n.log 2>&1
    rc=$?
done
steps=$(grep -c '"type":"step"' $d/run.jsonl)
uniq=$(grep '"type":"step"' $d/run.jsonl | sed 's/.*"step":\([0-9]*\).*/\1/' | sort -n | uniq | tr '\n' ' ')
want=$(seq 1 $STEPS | tr '\n' ' ')
runs=$(grep -c '"type":"run"' $d/run.jsonl)
if [ $rc -eq 0 ] && [ $n -eq $STEPS ] && [ $steps -eq $STEPS ] && [ "$uniq" = "$want" ] && [ $runs -eq $n ] &&
   python3 -c "import json,sys; [json.loads(l) for l in open(sys.argv[1])]" $d/run.jsonl &&
   cmp -s $d/run.svg $d/straight.svg; then
    ok "--log over $n runs: every step once ($steps records), a run record each start, valid JSON; the plot equals the straight run's"
else
    bad "--log over $n runs (exit $rc): $steps step records, $runs run records, plot $(cmp $d/run.svg $d/straight.svg 2>&1 | head -c 60)"
fi

# ---- flags that disagree ------------------------------------------------------
CK=$OUT/agree
timeout 120 ./train $D $MODEL --batch 4 --steps 2 --checkpoint-dir $CK > $OUT/agree.log 2>&1
refused() {   # name, both values' words (a grep -E pattern), flags
    name=$1; want=$2; shift 2
    timeout 60 ./train $D "$@" > $OUT/refused.out 2> $OUT/refused.err
    rc=$?
    if [ $rc -eq 2 ] && [ "$(wc -l < $OUT/refused.err)" -eq 1 ] && grep -q -E -- "$want" $OUT/refused.err &&
       ! grep -q '^step ' $OUT/refused.out; then ok "$name: exit 2, '$(cat $OUT/refused.err)'"
    else bad "$name: exit $rc, wanted one line matching '$want': $(cat $OUT/refused.err)"; fi
}
refused "--init with another width" "--dim 256, but .*init.bin holds dim 128" --init $OUT/init.bin --layers 2 --dim 256 --steps 1
refused "--init with other heads" "--heads 2, but .*init.bin holds heads 4" --init $OUT/init.bin --heads 2 --steps 1
refused "resume with another width" "--dim 256, but the checkpoint .* holds dim 128" $MODEL --dim 256 --batch 4 --steps 4 --checkpoint-dir $CK --resume
refused "resume with more layers" "--layers 3, but the checkpoint .* holds layers 2" --layers 3 --heads 4 --dim 128 --max-seq 16 --vocab 61 --batch 4 --steps 4 --checkpoint-dir $CK --resume
refused "resume with another global batch" "global batch of 8 .*written with 4" $MODEL --batch 8 --steps 4 --checkpoint-dir $CK --resume
refused "resume with another global batch (dp)" "global batch of 8 .*written with 4" $MODEL --batch 4 --ranks 2 --steps 4 --checkpoint-dir $CK --resume
refused "resume with another --seq" "--seq 4, but .* --seq 8" $MODEL --batch 4 --seq 4 --steps 4 --checkpoint-dir $CK --resume
refused "resume with another --seed" "--seed 7, but .* --seed 1337" $MODEL --batch 4 --seed 7 --steps 4 --checkpoint-dir $CK --resume
refused "resume with --shuffle" "--shuffle, but .* without it" $MODEL --batch 4 --shuffle --steps 4 --checkpoint-dir $CK --resume
refused "resume under a layout the model cannot take" "--tp 3 does not divide" $MODEL --batch 4 --ranks 3 --tp 3 --steps 4 --checkpoint-dir $CK --resume
mkdir -p $OUT/steps_only/step-2
refused "step directories but no latest" "latest is missing" $MODEL --batch 4 --steps 4 --checkpoint-dir $OUT/steps_only --resume
timeout 60 ./train $D --init $OUT/init.bin $MODEL --batch 4 --steps 1 > $OUT/equal.log 2>&1 && grep -q '^step 1/1' $OUT/equal.log &&
    ok "--init with model flags equal to the file's is accepted" || bad "--init with equal model flags: $(tail -n 1 $OUT/equal.log)"
timeout 60 ./train $D $MODEL --batch 4 --steps 4 --lr 1e-3 --checkpoint-dir $CK --resume > $OUT/sched.log 2>&1
if [ $? -eq 0 ] && grep -q -- '^resume: the schedule changes .*--steps 4 (was 2), --lr 0.001 (was 0.0003)' $OUT/sched.log &&
   grep -q '^step 4/4' $OUT/sched.log; then ok "a resume with another --steps and --lr says so in one line and continues"
else bad "schedule change on resume: $(grep -m1 resume $OUT/sched.log)"; fi
rm -rf $OUT/empty
timeout 60 ./train $D $MODEL --batch 4 --steps 1 --checkpoint-dir $OUT/empty --resume > $OUT/empty.log 2>&1
if [ $? -eq 0 ] && head -n 1 $OUT/empty.log | grep -q '^resume: no checkpoint in .*empty yet: starting at step 0'; then
    ok "--resume on an empty directory starts fresh and says so first"
else bad "--resume on an empty directory: $(head -n 1 $OUT/empty.log)"; fi

# ---- the lock -----------------------------------------------------------------
rm -rf $OUT/locked
./train $D $MODEL --batch 4 --steps 100000 --checkpoint-dir $OUT/locked > $OUT/lock1.log 2>&1 &
pid=$!
# the event: the lock names it (no fixed wait: on a loaded machine it may take a while)
i=0; until grep -q "pid $pid\$" $OUT/locked/.lock 2> /dev/null || [ $i -ge 30000 ] || [ ! -d /proc/$pid ]; do i=$((i + 1)); sleep 0.01; done
timeout 60 ./train $D $MODEL --batch 4 --steps 2 --checkpoint-dir $OUT/locked --resume > $OUT/lock2.out 2> $OUT/lock2.err
rc=$?
kill -INT $pid; wait $pid; rc1=$?
if [ $rc -eq 2 ] && grep -q "is in use by another run (host .* pid $pid)" $OUT/lock2.err && [ $rc1 -eq 75 ]; then
    ok "a second run on the same directory is refused naming the first's host and pid; Ctrl-C stops the first with 75"
else bad "the lock: second run exit $rc ($(cat $OUT/lock2.err)), first exit $rc1"; fi

# ---- the Slurm script under a faked Slurm -------------------------------------
if [ -f slurm/train.sbatch ]; then
    d=$OUT/slurm
    mkdir -p $d
    # 12 steps, a job a step (a --time-limit shorter than any step, as in loop above)
    timeout 300 ./train $D --init $OUT/init.bin $MODEL --batch 4 --steps 12 --save $d/straight.bin > $d/straight.log 2>&1
    # the job as sbatch would run it: its variables; scontrol requeue is the loop around it
    n=0; rc=75
    while [ $rc -eq 75 ] && [ $n -lt 12 ]; do
        n=$((n + 1))
        SLURM_JOB_ID=4242 SLURM_RESTART_COUNT=$((n - 1)) SLURM_NTASKS=1 SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NODEID=0 \
        SLURM_JOB_NODELIST=localhost SLURM_FAKE_REQUEUE=1 TRAIN_FLAGS="--time-limit 0.00001" CKPT=$d/ck \
        TRAIN_ARGS="$D --init $OUT/init.bin $MODEL --batch 4 --steps 12 --save $d/final.bin" \
            sh slurm/train.sbatch >> $d/job.log 2>&1
        rc=$?
    done
    if [ $rc -eq 0 ] && [ $n -eq 12 ] && cmp -s $d/final.bin $d/straight.bin && grep -q 'requeue' $d/job.log; then
        ok "slurm/train.sbatch under a faked Slurm: $n jobs (requeued on 75), the final model is the straight run's"
    else bad "slurm/train.sbatch: $n jobs, last exit $rc (see $d/job.log)"; fi
else
    bad "slurm/train.sbatch is missing"
fi
t_end restart
