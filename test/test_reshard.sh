#!/bin/sh
# test/test_reshard.sh: resume on another layout (checkpoint.c, "Loading").
#
# For each pair (first layout, second layout; context parallelism among
# them: cp 2 to one rank and to cp 4), both with the same global
# batch: N steps straight on the second layout; N steps on the first that
# checkpoint every S, with `latest` pointed back at step S; --resume on the
# second layout to N. The losses of steps S+1..N must be within 1e-5
# relative of the straight run's, and the final parameters within 5e-5
# (the layouts sum in different orders: float32 noise only). Under bf16 two
# layouts round differently (test_3d.c bounds their losses by 1e-3 relative
# and does not bound their parameters): pairs that change the arithmetic
# get that bound; a pair that only moves the optimizer state must be equal
# bit for bit (AdamW's update of an element does not depend on where its
# shard starts, and the clipped step's norm has the same bits on every
# layout: optim.h, "The gradient norm").
cd "$(dirname "$0")/.." || exit 2
. test/lib.sh
t_ckpt_init reshard

losses() { grep '^step ' "$1" | sed 's/.*| loss \([^ ]*\) .*/\1/'; }
params() { od -An -v -j1024 -tf4 -w4 "$1"; }

pair() {   # name, model, first layout's flags, second layout's flags[, loss bound, parameter bound]
    name=$1; lb=${5:-1e-5}; pb=${6:-5e-5}
    t_stop_resume "$1" "$2" "$3" "$4" "the first layout's run" || return 0
    losses "$d/straight.log" | tail -n $((N - S)) > "$d/straight.loss"
    losses "$d/resumed.log" > "$d/resumed.loss"
    lrel=$(paste "$d/straight.loss" "$d/resumed.loss" | awk '
        { n++; d = $1 - $2; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1); if (r > m) m = r }
        END { if (n != '$((N - S))') print "missing"; else printf "%.3g", m }')
    pmax=$(paste "$(params "$d/straight.bin" > "$d/a.txt"; echo "$d/a.txt")" \
                 "$(params "$d/resumed.bin" > "$d/b.txt"; echo "$d/b.txt")" | awk '
        { n++; d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d }
        END { if (n == 0) print "missing"; else printf "%.3g", m }')
    rm -f "$d/a.txt" "$d/b.txt"
    if [ "$lrel" = missing ] || [ "$pmax" = missing ]; then
        echo "FAIL $name: step lines or model file missing (see $d)"
    elif awk "BEGIN { exit !($lrel <= $lb && $pmax <= $pb) }"; then
        echo "PASS $name: losses within $lrel relative (<= $lb), parameters within $pmax (<= $pb)"
    else
        echo "FAIL $name: losses within $lrel relative (want <= $lb), parameters within $pmax (want <= $pb)"
    fi
}

# context parallelism: a checkpoint does not depend on the layout, cp included
CP16=$(echo "$SMALL" | sed 's/--seq 8/--seq 16/')
pair "cp 2 -> 1 rank" "$CP16" "--ranks 2 --cp 2 --batch 4" "--batch 4"
pair "cp 2 -> cp 4" "$CP16" "--ranks 2 --cp 2 --batch 4" "--ranks 4 --cp 4 --batch 4"
pair "1 rank -> dp 2 x tp 2 x pp 2, zero 1 (8 ranks)" "$BIG" \
    "--batch 8" "--ranks 8 --dp 2 --tp 2 --pp 2 --zero 1 --batch 2 --micro-batches 2"
pair "dp 2 x tp 2 x pp 2, zero 1 (8 ranks) -> 1 rank" "$BIG" \
    "--ranks 8 --dp 2 --tp 2 --pp 2 --zero 1 --batch 2 --micro-batches 2" "--batch 8"
pair "dp 2 x pp 2, zero 1 -> dp 4 x tp 2, zero 2 (every one of dp, tp, pp, zero)" "$SMALL" \
    "--ranks 4 --dp 2 --pp 2 --zero 1 --batch 2 --micro-batches 2" "--ranks 8 --dp 4 --tp 2 --zero 2 --batch 2"
pair "zero 3 -> zero 0" "$SMALL" "--ranks 2 --zero 3 --batch 4" "--ranks 2 --zero 0 --batch 4"
pair "tp 2 -> pp 2" "$SMALL" "--ranks 2 --tp 2 --batch 8" "--ranks 2 --pp 2 --batch 2 --micro-batches 4"
pair "4 ranks -> 3 ranks (dp 4 -> dp 3, zero 1)" "$SMALL" "--ranks 4 --zero 1 --batch 3" "--ranks 3 --zero 1 --batch 4"
pair "zero 1 with offload -> dp 2 x tp 2, zero 3" "$SMALL" \
    "--ranks 2 --zero 1 --offload --batch 4" "--ranks 4 --dp 2 --tp 2 --zero 3 --batch 4"
pair "1 rank -> zero 3 with offload" "$SMALL" "--batch 8" "--ranks 2 --zero 3 --offload --batch 4"
pair "parameter server -> zero 2" "$SMALL" "--ranks 2 --dp-mode ps --batch 4" "--ranks 2 --zero 2 --batch 4"
pair "pp 2, stage layers 3,1 -> pp 4 (tied wte on both ends)" "$SMALL" \
    "--ranks 2 --pp 2 --stage-layers 3,1 --batch 2 --micro-batches 4" "--ranks 4 --pp 4 --batch 2 --micro-batches 4"
pair "bf16: dp 2, zero 1 -> dp 2, zero 3, offload (same arithmetic)" "$SMALL" \
    "--ranks 2 --zero 1 --batch 4 --dtype bf16" "--ranks 2 --zero 3 --offload --batch 4 --dtype bf16" 0 0
pair "bf16: 1 rank -> tp 2, sp" "$SMALL" "--batch 8 --dtype bf16" "--ranks 2 --tp 2 --sp --batch 8 --dtype bf16" 1e-3 1
pair "bf16: dp 2, zero 1 -> pp 2" "$SMALL" "--ranks 2 --zero 1 --batch 4 --dtype bf16" \
    "--ranks 2 --pp 2 --batch 2 --micro-batches 4 --dtype bf16" 1e-3 1
