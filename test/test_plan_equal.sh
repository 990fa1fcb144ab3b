#!/bin/sh
# test/test_plan_equal.sh: the planner counts what train allocates and moves.
#
# For every factorization of 8 ranks into dp x tp x pp with ZeRO 0-3, for
# pipelines (P = 2, 4; gpipe, 1f1b, interleaved, zb-h1, zb-h2) with and
# without --recompute, with --sp, and for context parallelism (--cp 2, 4,
# composed with dp, tp and sp, pp, ZeRO), ./train runs one step with --comm-stats and prints every rank's
# memory line; ./train --plan-layout, given the same flags, prints what
# plan.c predicts for each rank. They must agree:
#  - params, grads, optimizer, activations and the backward's scratch of
#    every rank: the memory line's measured bytes (what gpt.c, zero.c, pp.c
#    and cp.c allocated) equal the planner's to the 6 digits printed (the
#    scratch, which the planner did not count before issue 41's memory
#    table found the resident saving short of it, included);
#  - every --comm-stats row (operation, group) of every rank: bus bytes equal
#    the planner's exactly, rows absent on one side counted as 0.
# The same on the emulated GPU (test/train_emu, built by make test when the
# CUDA headers are there; SKIP without it), bf16 with flash attention: the
# backward's scratch holds flash's dq accumulator and D rather than the
# probabilities' gradient, and cp's ring its blocks in bf16, their
# gradients and the accumulator in float32 (which the planner once counted
# in bf16, and without the accumulator).
# ZeRO-2/3's transient unit buffers (a peak measured after the run, which
# depends on when each bucket's reduction completes) are compared apart: the
# planner's bound may not be below what the run needed (it must not promise
# memory the run then takes), nor more than 2.5 times it.
cd "$(dirname "$0")/.." || exit 2
mkdir -p test/out
OUT=test/out/plan_equal
M="--data test/fixtures/ref_tokens.bin --layers 8 --heads 8 --dim 32 --max-seq 16 --vocab 61 --seq 8 --batch 2 --steps 1 --device cpu"

# Normalises train's output to "rank key value" lines: memory in MB as
# printed, comm rows in bytes.
from_train() {
    awk '
    { line = $0; rank = 0 }
    /^\[rank [0-9]+\] / { rank = substr($2, 1, length($2) - 1) + 0; sub(/^\[rank [0-9]+\] /, "", line) }
    line ~ /^memory rank [0-9]+: params / {
        n = split(line, w, /[ ,]+/)
        for (i = 1; i < n; i++) if (w[i] == "params" || w[i] == "grads" || w[i] == "optimizer" || w[i] == "activations" || w[i] == "scratch")
            print rank, w[i], w[i + 1]
    }
    line ~ /^memory rank [0-9]+: transient/ { n = split(line, w, " "); print rank, "transient", w[n - 1] }
    line ~ /^  (all_reduce|all_gather|reduce_scatter|broadcast|send|recv) / {
        split(line, w, " "); if (w[4] + 0 > 0) print rank, w[1] "/" w[2], w[4]
    }' | sort
}

from_plan() {
    awk '
    /^plan rank [0-9]+: params / {
        rank = $3 + 0; n = split($0, w, /[ ,]+/)
        for (i = 1; i < n; i++) if (w[i] == "params" || w[i] == "grads" || w[i] == "optimizer" || w[i] == "activations" || w[i] == "scratch" || w[i] == "transient")
            if (w[i] != "transient" || w[i + 1] + 0 > 0) print rank, w[i], w[i + 1]
        next
    }
    /^plan rank [0-9]+: / { print $3 + 0, $4 "/" $5, $6 }' | sort
}

pass=0
TRAIN=./train
check() {   # NAME FLAGS...
    name=$1; shift
    if ! $TRAIN $M "$@" --comm-stats > $OUT.run 2>&1; then
        echo "FAIL $name: train exited non-zero: $(grep -v '^\[rank' $OUT.run | tail -n 1)"; return
    fi
    if ! $TRAIN $M "$@" --plan-layout > $OUT.plan 2> $OUT.err; then
        echo "FAIL $name: --plan-layout: $(cat $OUT.err)"; return
    fi
    from_train < $OUT.run > $OUT.t
    from_plan < $OUT.plan > $OUT.p
    # join on "rank key": exact for bytes and for the MB figures printed;
    # the transient peak: the plan's at least 99% of the run's
    bad=$(awk '
        FNR == NR { t[$1 " " $2] = $3; next }
        { p[$1 " " $2] = $3 }
        END {
            for (k in t) keys[k] = 1
            for (k in p) keys[k] = 1
            for (k in keys) {
                tv = (k in t) ? t[k] : 0; pv = (k in p) ? p[k] : 0
                if (k ~ / transient$/) { if (pv < tv || pv > 2.5 * tv) print k ": run " tv " plan " pv; continue }
                if (tv != pv) print k ": run " tv " plan " pv
            }
        }' $OUT.t $OUT.p | sort | head -n 4)
    rows=$(wc -l < $OUT.t)
    if [ -n "$bad" ] || [ "$rows" -lt 8 ]; then
        echo "FAIL $name: $rows figures from the run; differ: $(echo "$bad" | tr '\n' ';')"
    else
        echo "PASS $name: $rows figures (memory of every rank, every --comm-stats row) equal the planner's"
    fi
}

for l in "8 1 1" "4 2 1" "4 1 2" "2 4 1" "2 2 2" "2 1 4" "1 8 1" "1 4 2" "1 2 4" "1 1 8"; do
    set -- $l
    for z in 0 1 2 3; do
        check "dp $1 tp $2 pp $3 zero $z" --ranks 8 --dp $1 --tp $2 --pp $3 --zero $z --micro-batches 4
    done
done
for p in 2 4; do
    for s in gpipe 1f1b; do
        for rc in "" --recompute; do
            check "dp 2 pp $p $s M 4 $rc" --ranks $((2 * p)) --dp 2 --pp $p --schedule $s --micro-batches 4 $rc
        done
    done
done
for rc in "" --recompute; do   # the schedules of pipelines round 2: chunks, the B->W stash
    check "pp 2 interleaved V 2 $rc" --ranks 2 --pp 2 --schedule interleaved --virtual 2 --micro-batches 4 $rc
    check "dp 2 pp 4 interleaved V 2 $rc" --ranks 8 --dp 2 --pp 4 --schedule interleaved --virtual 2 --micro-batches 4 $rc
    check "pp 2 zb-h1 $rc" --ranks 2 --pp 2 --schedule zb-h1 --micro-batches 4 $rc
    check "dp 2 pp 4 zb-h2 $rc" --ranks 8 --dp 2 --pp 4 --schedule zb-h2 --micro-batches 8 $rc
    check "dp 2 tp 2 pp 2 zero 1 zb-h1 --sp $rc" --ranks 8 --dp 2 --tp 2 --pp 2 --zero 1 --sp --schedule zb-h1 --micro-batches 4 $rc
    check "dp 2 tp 2 pp 2 zero 1 interleaved V 2 $rc" --ranks 8 --dp 2 --tp 2 --pp 2 --zero 1 --schedule interleaved --virtual 2 --micro-batches 4 $rc
done
check "tp 2 --sp, pp 2, zero 1" --ranks 8 --dp 2 --tp 2 --pp 2 --zero 1 --sp --micro-batches 2
check "tp 4 --sp, zero 3" --ranks 8 --dp 2 --tp 4 --zero 3 --sp --micro-batches 2
check "offload, zero 2" --ranks 4 --dp 4 --zero 2 --offload --micro-batches 2
check "--stage-layers 5,3, zero 1" --ranks 4 --dp 2 --pp 2 --stage-layers 5,3 --zero 1 --micro-batches 4
# chunks of one layer: --recompute has nothing to recompute there (the
# layer's own activations are the kept ones), so no tp collective repeats
check "one-layer stages, tp 2 --recompute" --ranks 8 --layers 4 --tp 2 --pp 4 --micro-batches 4 --recompute
check "one-layer chunks, tp 2 interleaved --recompute" --ranks 4 --layers 4 --tp 2 --pp 2 --schedule interleaved \
      --virtual 2 --micro-batches 2 --recompute
check "--stage-layers 1,3, tp 2 zb-h1 --recompute" --ranks 4 --tp 2 --pp 2 --layers 4 --stage-layers 1,3 \
      --schedule zb-h1 --micro-batches 2 --recompute
# context parallelism (cp.c): each rank holds seq / cp tokens of every
# sequence (--seq 16: 2 cp divides it); activations and attention's
# log-sum-exp for those, the ring's kv and dkv blocks and the position rows
# among the activations, ZeRO and the dp rows over dp x cp, and the ring's
# send and recv rows of the cp group
C="--seq 16"
check "cp 2" --ranks 2 --cp 2 $C --micro-batches 2
check "cp 4, recompute" --ranks 4 --cp 4 $C --recompute
check "dp 2 x cp 2" --ranks 4 --dp 2 --cp 2 $C --micro-batches 2
check "cp 2 x tp 2 --sp" --ranks 4 --cp 2 --tp 2 --sp $C --micro-batches 2
check "cp 2 x pp 2 zero 1" --ranks 4 --cp 2 --pp 2 --zero 1 $C --micro-batches 4
check "dp 2 x cp 2 zero 3" --ranks 4 --dp 2 --cp 2 --zero 3 $C --micro-batches 2
check "cp 2 x pp 2 zb-h1 --recompute" --ranks 4 --cp 2 --pp 2 --schedule zb-h1 $C --micro-batches 4 --recompute
check "dp 2 x cp 2 x tp 2 --sp zero 1" --ranks 8 --dp 2 --cp 2 --tp 2 --sp --zero 1 $C
# the dtype the run was given, not the device's usual one: bf16 on the CPU
# (the planner once sized it as float32: activations 1.8x, no bf16 copy)
check "cpu bf16, dp 2 tp 2 zero 1" --ranks 4 --dp 2 --tp 2 --zero 1 --dtype bf16 --micro-batches 2
# the emulated GPU, bf16: head size 64, so that attention is the flash kernels
if [ -x test/train_emu ]; then
    TRAIN=test/train_emu
    M="--data test/fixtures/ref_tokens.bin --layers 2 --heads 2 --dim 128 --max-seq 32 --vocab 61 --seq 32 --batch 2 --steps 1 --device cuda"
    check "cuda bf16, dp 2" --ranks 2 --dp 2
    check "cuda bf16, tp 2" --ranks 2 --tp 2
    check "cuda bf16, cp 2" --ranks 2 --cp 2
    check "cuda bf16, cp 2 --recompute" --ranks 2 --cp 2 --recompute
    check "cuda bf16, cp 2 x tp 2 --sp" --ranks 4 --cp 2 --tp 2 --sp
    # float32 on a GPU: the plain attention kernels' probabilities, the
    # embedding plan, cp's float32 accumulator (the planner once sized it
    # as a CPU run, without the last two)
    check "cuda fp32, cp 2" --ranks 2 --cp 2 --dtype fp32
    # heads of 16, which the flash kernels do not take: bf16 on the plain ones
    check "cuda bf16, heads of 16, dp 2" --ranks 2 --dp 2 --heads 8
else
    echo "SKIP cuda bf16 (the emulated GPU): test/train_emu not built (no CUDA headers where make ran)"
fi
