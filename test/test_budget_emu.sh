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
# Layouts: one rank; and on 2 ranks over the emulated NCCL (one emulated GPU
# a rank) DDP, the parameter server, ZeRO-1, 2, 3 and 3 with offload, tp
# with sp, a 1F1B pipeline, cp; fp32 and bf16; one rank with two
# micro-batches; and with streams late (EMU_STREAMS). Asserted from the
# second step on: no allocation, and at most one blocking synchronization a
# step (the loss and the norm read back together; with ZeRO-Offload the
# gradients' copy down comes with them); and on the first step, whose norm
# always takes its second pass (no exponent to guess from yet), one read-back
# from the device (the pass is decided on the device, optim_norm).
# Then the check is shown to catch three deliberate bugs patched into a
# scratch copy (test/emu/scratch.sh): a dev_sync between the backward and the
# optimizer in main.c's train_step (one more blocking read-back a step), a
# device buffer allocated and freed inside every step, and optim_norm reading
# the combined exponent back to decide the second pass on the host (caught
# on a 2-rank ZeRO-1 layout).
cd "$(dirname "$0")/.." || exit 2
SCRATCH=budget
. test/emu/scratch.sh
MODEL="--data test/fixtures/ref_tokens.bin --layers 2 --heads 2 --dim 32 --max-seq 16 --vocab 61 --seq 8 --steps 4 --device cuda --no-self-test"
# The budget, issue 42's: one blocking synchronization a step after the
# first, the gradient norm's read-back before the clip (optim_norm: its
# exponent and limbs, combined over the ranks on the device), which brings
# the step's loss with it (score_loss_queue: the loss summed on the device,
# dev_loss_*, averaged over dp and sent from the last stage there too).
# What went, each a wait a step (one rank: 7 before 2026-11-27; 5 to 9 on
# the other layouts before 2026-11-28): the three uploads of a micro-batch's
# tokens, embedding plan and targets (dev_from_host goes through pinned
# staging), the loss's own read-back (ops->sum), AdamW's segment table (kept
# on the device), the end of the step (run_train's dev_sync); the loss's
# all-reduce and pp broadcast staged through the host; the norm's read-back
# of each run's partials (ZeRO: each owned bucket; tp: each run between
# replicated tensors), its exponent and limbs combined through host memory,
# and the host's decision on its second pass.
SYNCS=1

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
            if (st == 1) { first_s = s; first_a = al; d2h = gsub(/D2H/, "D2H"); if (d2h > 1 && !bad) { bad = 1; what = "step 1: " d2h " read-backs: " $0 } }
        }
        END {
            lines = 0
            for (d in n) { if (n[d] != steps) short = 1; lines++ }
            if (lines != ranks || short) {
                printf "FAIL budget %s: %d ranks gave step counts (want %d ranks, %d steps each): EMU_STEP_COUNTS or the NVTX ranges are broken\n", label, lines, ranks, steps
                exit 1
            }
            if (bad) {
                printf "FAIL budget %s: over the budget (at most %d blocking synchronizations, no allocation, a step after the first; one read-back in the first): %s\n", label, syncs, what
                exit 1
            }
            printf "PASS budget %s: steps 2-%d: at most %d blocking synchronizations a step (budget %d), %d allocations (step 1: %d and %d, one read-back)\n", label, steps, worst_s, syncs, worst_a, first_s, first_a
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

# row LABEL RANKS FLAGS...: one budget run, counted
row() {
    label=$1 ranks=$2
    shift 2
    budget "$label" $SYNCS "$ranks" "$@"
    cat "$S/check.out"; [ $rc -eq 0 ] && pass=$((pass + 1)) || fail=$((fail + 1))
}
for dt in fp32 bf16; do
    row "one rank, $dt" 1 --batch 4 --dtype $dt
    row "ddp 2, $dt" 2 --ranks 2 --batch 2 --dtype $dt
done
row "ps 2, fp32" 2 --ranks 2 --dp-mode ps --batch 2 --dtype fp32
row "zero-1 2, bf16" 2 --ranks 2 --zero 1 --batch 2 --dtype bf16
row "zero-2 2, fp32" 2 --ranks 2 --zero 2 --batch 2 --dtype fp32
row "zero-3 2 with offload, bf16" 2 --ranks 2 --zero 3 --offload --batch 2 --dtype bf16
row "tp 2 with sp, bf16" 2 --ranks 2 --tp 2 --sp --batch 4 --dtype bf16
row "pp 2 (1F1B, 2 micro-batches), fp32" 2 --ranks 2 --pp 2 --schedule 1f1b --batch 4 --micro-batches 2 --dtype fp32
row "cp 2, bf16" 2 --ranks 2 --cp 2 --batch 4 --dtype bf16
# two micro-batches (the loss added up on the device over both), and the streams late (the
# compute stream runs only when the host waits, the communication streams only when waited
# for: the host as far ahead of the device as it can be)
row "one rank, 2 micro-batches, fp32" 1 --batch 2 --micro-batches 2 --dtype fp32
WHEN=first-late row "one rank, bf16, compute stream late" 1 --batch 4 --dtype bf16
WHEN=rest-late row "ddp 2, bf16, communication streams late" 2 --ranks 2 --batch 2 --dtype bf16
WHEN=rest-late row "zero-3 2, fp32, communication streams late" 2 --ranks 2 --zero 3 --batch 2 --dtype fp32
WHEN=first-late row "pp 2, bf16, compute stream late" 2 --ranks 2 --pp 2 --batch 4 --micro-batches 2 --dtype bf16

# The deliberate bugs: each must be caught (a FAIL from check, naming the call).
# caught NAME WANT LABEL RANKS FLAGS: after a patch and a rebuild, the run of
# the layout FLAGS (one string) on RANKS must fail the check with WANT in its line.
caught() {
    if ! rebuild; then
        echo "FAIL budget: could not rebuild with $1: $(grep -m1 error "$S/build.log")"
        fail=$((fail + 1))
        return
    fi
    budget "$3, $1" $SYNCS $4 $5 --dtype fp32
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
    caught "a dev_sync between backward and the optimizer" "cudaStreamSynchronize(stream 1, after" \
        "one rank" 1 "--batch 4"
else
    echo "FAIL budget: could not patch main.c (train_step changed?)"; fail=$((fail + 1))
fi
cp "$S/main.c.orig" "$S/main.c"
if patch_in main.c '    dp_step_begin(&r->dp);' '    dev_free(&r->dev, dev_alloc(&r->dev, 4096), 4096);
    dp_step_begin(&r->dp);'; then
    caught "a buffer allocated and freed inside each step" "cudaMalloc(4096 bytes)" "one rank" 1 "--batch 4"
else
    echo "FAIL budget: could not patch main.c (train_step changed?)"; fail=$((fail + 1))
fi
cp "$S/main.c.orig" "$S/main.c"
if patch_in optim.c '    d->ops->norm_redo(d, acc, q.r, q.n, g0, g.bits);' '    int32_t e_host;
    dev_to_host(d, &e_host, &acc->e, sizeof e_host);   /* the second pass decided on the host */
    d->ops->norm_redo(d, acc, q.r, q.n, g0, g.bits);'; then
    caught "the norm's exponent read back before its second pass" "cudaMemcpyAsync(D2H, 4 bytes)" \
        "zero-1 2" 2 "--ranks 2 --zero 1 --batch 2"
else
    echo "FAIL budget: could not patch optim.c (optim_norm changed?)"; fail=$((fail + 1))
fi
echo "budget (cpu emulation): $pass passed, $fail failed"
rm -rf "$S"
[ $fail -eq 0 ]
