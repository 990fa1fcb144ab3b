#!/bin/sh
# test/test_budget_emu.sh: a GPU training step's blocking synchronizations
# and device allocations, counted under the CUDA emulation (issue 42, "Account
# for the whole step"). test/train_nccl_emu trains a small model for 4 steps
# with EMU_STEP_COUNTS=1: train opens an NVTX range around each step
# (main.c, dev_range_push), and at its end the emulated runtime prints what
# the rank's thread did inside it (test/emu/emu_rt.cpp, "A step's
# synchronizations"): each call that made the host wait for device work it
# had not waited for (cudaStreamSynchronize, cudaEventSynchronize, a copy to
# or from pageable memory, cudaFree...) and each allocation, named.
# Layouts: one rank, and 2-rank DDP over the emulated NCCL (one emulated GPU
# a rank), fp32 and bf16; one rank with two micro-batches; and both with
# streams late (EMU_STREAMS). (ZeRO, tp and pp still wait more: the norm's
# sums are combined over their groups through host memory, a read-back per
# owned run, and pp broadcasts the loss from the host: 5 to 7 a step.) Asserted from the second step on: no allocation, and at most one
# blocking synchronization a step (the loss and the norm read back together).
# Then the check is shown to catch two deliberate bugs patched into a scratch
# copy of main.c's train_step (test/emu/scratch.sh): a dev_sync between the
# backward and the optimizer (one more blocking read-back a step), and a
# device buffer allocated and freed inside every step.
cd "$(dirname "$0")/.." || exit 2
SCRATCH=budget
. test/emu/scratch.sh
MODEL="--data test/fixtures/ref_tokens.bin --layers 2 --heads 2 --dim 32 --max-seq 16 --vocab 61 --seq 8 --steps 4 --device cuda --no-self-test"
# The budget, issue 42's: one blocking synchronization a step after the
# first, the gradient norm's read-back before the clip (zero_norm's
# sumsq_grid), which brings the step's loss with it (main.c's loss_queue:
# the loss summed on the device, dev_loss_*, averaged over dp there too).
# What went, each a wait a step (one rank: 7 before): the three uploads of a
# micro-batch's tokens, embedding plan and targets (dev_from_host goes
# through pinned staging), the loss's own read-back (ops->sum), AdamW's
# segment table (kept on the device), the end of the step (run_train's
# dev_sync); with DDP also the loss's all-reduce staged through the host (2).
SYNCS_1=1
SYNCS_DDP=1

# check LOG LABEL SYNCS RANKS: the step lines of every rank in LOG against the
# budget; prints PASS or FAIL lines, returns 1 on a FAIL.
check() {
    awk -v label="$2" -v syncs="$3" -v ranks="$4" -v steps=4 '
        /emu: device [0-9]+: step [0-9]+: / {
            sub(/^\[rank [0-9]+\] /, "")
            dev = $3; sub(/:$/, "", dev); st = $5; sub(/:$/, "", st)
            n[dev]++; s = $6; al = $9
            if (st > 1 && s > worst_s) worst_s = s
            if (st > 1 && al > worst_a) worst_a = al
            if (st > 1 && (s > syncs || al > 0) && !bad) { bad = 1; what = $0 }
            if (st == 1) { first_s = s; first_a = al }
        }
        END {
            lines = 0
            for (d in n) { if (n[d] != steps) short = 1; lines++ }
            if (lines != ranks || short) {
                printf "FAIL budget %s: %d ranks gave step counts (want %d ranks, %d steps each): EMU_STEP_COUNTS or the NVTX ranges are broken\n", label, lines, ranks, steps
                exit 1
            }
            if (bad) {
                printf "FAIL budget %s: over the budget (at most %d blocking synchronizations, no allocation, a step after the first): %s\n", label, syncs, what
                exit 1
            }
            printf "PASS budget %s: steps 2-%d: at most %d blocking synchronizations a step (budget %d), %d allocations (step 1: %d and %d)\n", label, steps, worst_s, syncs, worst_a, first_s, first_a
        }' "$1"
}

# budget LABEL SYNCS RANKS FLAGS...: trains in the scratch copy and checks; $rc from the check
budget() {
    label=$1 syncs=$2 ranks=$3
    shift 3
    (cd "$S" && EMU_GPUS=2 EMU_STEP_COUNTS=1 EMU_STREAMS=${WHEN:-eager} OMP_NUM_THREADS=1 timeout 120 \
        ./test/train_nccl_emu $MODEL "$@") > "$S/run.log" 2>&1
    runrc=$?
    if [ $runrc -ne 0 ]; then
        echo "FAIL budget $label: train_nccl_emu exited $runrc: $(grep -m1 -i 'error' "$S/run.log")"
        rc=1
        return
    fi
    check "$S/run.log" "$label" "$syncs" "$ranks" > "$S/check.out"
    rc=$?
}

for dt in fp32 bf16; do
    budget "one rank, $dt" $SYNCS_1 1 --batch 4 --dtype $dt
    cat "$S/check.out"; [ $rc -eq 0 ] && pass=$((pass + 1)) || fail=$((fail + 1))
    budget "ddp 2, $dt" $SYNCS_DDP 2 --ranks 2 --batch 2 --dtype $dt
    cat "$S/check.out"; [ $rc -eq 0 ] && pass=$((pass + 1)) || fail=$((fail + 1))
done
# two micro-batches (the loss added up on the device over both), and the streams late (the
# compute stream runs only when the host waits, the communication streams only when waited
# for: the host as far ahead of the device as it can be)
budget "one rank, 2 micro-batches, fp32" $SYNCS_1 1 --batch 2 --micro-batches 2 --dtype fp32
cat "$S/check.out"; [ $rc -eq 0 ] && pass=$((pass + 1)) || fail=$((fail + 1))
WHEN=first-late budget "one rank, bf16, compute stream late" $SYNCS_1 1 --batch 4 --dtype bf16
cat "$S/check.out"; [ $rc -eq 0 ] && pass=$((pass + 1)) || fail=$((fail + 1))
WHEN=rest-late budget "ddp 2, bf16, communication streams late" $SYNCS_DDP 2 --ranks 2 --batch 2 --dtype bf16
cat "$S/check.out"; [ $rc -eq 0 ] && pass=$((pass + 1)) || fail=$((fail + 1))

# The deliberate bugs: each must be caught (a FAIL from check, naming the call).
# caught NAME WANT: after a patch and a rebuild, the one-rank run must fail the
# check with WANT in its line.
caught() {
    if ! rebuild; then
        echo "FAIL budget: could not rebuild with $1: $(grep -m1 error "$S/build.log")"
        fail=$((fail + 1))
        return
    fi
    budget "one rank, fp32, $1" $SYNCS_1 1 --batch 4 --dtype fp32
    if [ $rc -ne 0 ] && grep -q "$2" "$S/check.out"; then
        echo "PASS budget: $1 is caught: $(cut -c1-200 "$S/check.out")"
        pass=$((pass + 1))
    else
        echo "FAIL budget: $1 is not caught: $(cat "$S/check.out")"
        fail=$((fail + 1))
    fi
}
cp "$S/main.c" "$S/main.c.orig"
if patch_in main.c '    *lr = optim_lr(&a->opt, step);' '    dev_sync(&r->dev);
    *lr = optim_lr(&a->opt, step);'; then
    caught "a dev_sync between backward and the optimizer" "cudaStreamSynchronize(stream 1, after"
else
    echo "FAIL budget: could not patch main.c (train_step changed?)"; fail=$((fail + 1))
fi
cp "$S/main.c.orig" "$S/main.c"
if patch_in main.c '    dp_step_begin(&r->dp);' '    dev_free(&r->dev, dev_alloc(&r->dev, 4096), 4096);
    dp_step_begin(&r->dp);'; then
    caught "a buffer allocated and freed inside each step" "cudaMalloc(4096 bytes)"
else
    echo "FAIL budget: could not patch main.c (train_step changed?)"; fail=$((fail + 1))
fi
echo "budget (cpu emulation): $pass passed, $fail failed"
rm -rf "$S"
[ $fail -eq 0 ]
