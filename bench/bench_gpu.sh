#!/bin/sh
# bench/bench_gpu.sh (make bench): the GPU benchmark, kernels then end to end.
#
#   1. python3 bench/sdpa.py: PyTorch's SDPA at GPT-2's attention shape,
#      written to a file for bench_gpu's attention yardstick;
#   2. ./bench/bench_gpu --sdpa FILE: every kernel beside its yardstick
#      (cuBLAS, the measured copy bandwidth, SDPA), errors beside speeds;
#   3. end to end, GPT-2 124M (12 layers, 12 heads, 768 wide, vocabulary
#      50257 padded to 50304, T = 1024) at batch B on one GPU:
#      python3 bench/torch_gpt2.py (torch.compile, fused AdamW, flash SDPA)
#      and ./train --dtype bf16 on the same model, in this one call, then
#      the ratio of their tokens per second and train's MFU; and train
#      once more with --atomic-dq (attention's dq summed with atomics, the
#      backward train ran by default before 2026-11-26's measurements found
#      the deterministic one faster), to compare the two in tokens per second;
#   4. the step accounted for (issue 42): train's measured step (median ms)
#      beside the sum of its kernels' own times by phase, measured by ncu
#      over train's step 3 where ncu is (else bench_gpu's "step kernels",
#      its rows times their calls a step), and the remainder, the host's
#      share. SKIP_STEP_PROFILE=1 leaves ncu out.
# At the end issue 42's targets: >= 1.0x torch.compile's tokens/s, MFU >=
# 40% (6N + 6LCT), the step minus its kernels <= 2% of the step (bench_gpu
# prints the wgmma >= 80% of cuBLAS and attention <= 1.2x SDPA ones).
#
# Both end-to-end runs take the median of the steps after the 10th (the
# first steps pay for compilation and allocation). train reads
# tinyshakespeare one byte a token: byte values are valid ids below 50257
# and the compute of a step does not depend on the ids.
#
# Environment: BATCH=B (default 16; BATCH=auto tries 64, 32, 16 with 2 steps
# of train and takes the largest that runs), STEPS=N (default 30),
# DATA=path (text for train), PEAK=F (bf16 dense FLOP/s, default 989.4e12,
# H100 SXM), SKIP_KERNELS=1 or SKIP_E2E=1 to run one half.
#
# It builds nothing: `make bench` builds bench/bench_gpu and train first.
# Parts that need python3 with torch and a CUDA GPU print a SKIP line
# without them. Exit 0 when everything ran (a missed target is not a
# failure), 1 when a run failed, 2 when something to run is missing.
cd "$(dirname "$0")/.." || exit 2
STEPS=${STEPS:-30}
PEAK=${PEAK:-989.4e12}
BATCH=${BATCH:-16}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/bench_gpu.XXXXXX") || exit 2
trap 'rm -rf "$TMP"' EXIT INT TERM
status=0

have_torch=0
if command -v python3 >/dev/null 2>&1 &&
   python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
    have_torch=1
else
    echo "bench: SKIP the PyTorch yardsticks (SDPA, torch_gpt2): no python3 with torch that sees a CUDA GPU"
fi

# ---- kernels --------------------------------------------------------------
if [ -z "$SKIP_KERNELS" ]; then
    [ -x bench/bench_gpu ] || { echo "bench: bench/bench_gpu is not built (make bench builds it)"; exit 2; }
    SDPA_ARG=""
    if [ "$have_torch" = 1 ]; then
        echo "bench: python3 bench/sdpa.py --out $TMP/sdpa.txt"
        if python3 bench/sdpa.py --out "$TMP/sdpa.txt"; then
            SDPA_ARG="--sdpa $TMP/sdpa.txt"
        else
            echo "bench: sdpa.py failed: the attention rows have no yardstick"
            status=1
        fi
    fi
    echo "bench: ./bench/bench_gpu $SDPA_ARG"
    # shellcheck disable=SC2086
    ./bench/bench_gpu $SDPA_ARG > "$TMP/kernels.txt" 2>&1 || { echo "bench: bench_gpu failed"; status=1; }
    cat "$TMP/kernels.txt"
fi

# ---- end to end -----------------------------------------------------------
[ -n "$SKIP_E2E" ] && exit $status
[ -x ./train ] || { echo "bench: ./train is not built (make bench builds it)"; exit 2; }
if [ -z "$DATA" ]; then
    for f in data/tinyshakespeare.txt ../shared/data/tinyshakespeare.txt data/tinyshakespeare_train.txt; do
        [ -f "$f" ] && { DATA=$f; break; }
    done
fi
if [ -z "$DATA" ] || [ ! -f "$DATA" ]; then echo "bench: no text for train (DATA=path, or make data/tinyshakespeare.txt)"; exit 2; fi

train_run() {   # train_run B STEPS [FLAGS]: GPT-2 124M in bf16 on one GPU
    b=$1 n=$2
    shift 2
    ./train --data "$DATA" --vocab 50257 --layers 12 --heads 12 --dim 768 --max-seq 1024 \
        --seq 1024 --batch "$b" --steps "$n" --warmup 0 --dtype bf16 --device cuda "$@"
}

if [ "$BATCH" = auto ]; then
    BATCH=""
    for b in 64 32 16 8; do
        if train_run "$b" 2 >"$TMP/probe.txt" 2>&1; then BATCH=$b; break; fi
        echo "bench: batch $b does not run: $(grep -v '^step ' "$TMP/probe.txt" | tail -n 1)"
    done
    [ -n "$BATCH" ] || { echo "bench: no batch from 64 down to 8 runs train"; exit 1; }
    echo "bench: BATCH=auto: largest batch that runs train: $BATCH"
fi

# median of column-free numbers on stdin, "-" when there are none
median() {
    sort -n | awk '{v[NR] = $1} END {if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2];
                   else print (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}

# a step line's field that ends in $2 (tok/s) or starts with $2 (mfu), for steps after the 10th
step_field() {   # step_field FILE tok/s|mfu
    grep '^step ' "$1" | awk -F' [|] ' -v want="$2" '{
        split($1, s, "[ /]"); if (s[2] + 0 <= 10) next;
        for (i = 2; i <= NF; i++) {
            if (want == "tok/s" && $i ~ / tok\/s$/) { split($i, a, " "); print a[1] }
            if (want == "mfu" && $i ~ /^mfu /) { split($i, a, " "); sub("%", "", a[2]); print a[2] }
            if (want == "ms" && $i ~ / ms$/) { split($i, a, " "); print a[1] }
        }
    }' | median
}

echo
echo "== end to end: GPT-2 124M, batch $BATCH x T 1024 = $((BATCH * 1024)) tokens a step, $STEPS steps, one GPU"
torch_tps="-"
torch_mfu="-"
if [ "$have_torch" = 1 ]; then
    echo "bench: python3 bench/torch_gpt2.py --batch $BATCH --steps $STEPS --peak $PEAK"
    python3 bench/torch_gpt2.py --batch "$BATCH" --steps "$STEPS" --peak "$PEAK" >"$TMP/torch.txt" 2>&1
    rc=$?
    cat "$TMP/torch.txt"
    if [ $rc = 0 ]; then
        torch_tps=$(awk '/^torch tokens\/s/ {print $3}' "$TMP/torch.txt")
        torch_mfu=$(awk '/^torch tokens\/s/ {sub("%", "", $5); print $5}' "$TMP/torch.txt")
    else
        echo "bench: torch_gpt2.py failed (exit $rc$([ $rc = 3 ] && echo ': out of memory at this batch'))"
        status=1
    fi
fi

echo "bench: ./train ... --batch $BATCH --steps $STEPS --dtype bf16 --device cuda (data $DATA)"
train_run "$BATCH" "$STEPS" >"$TMP/train.txt" 2>&1
rc=$?
cat "$TMP/train.txt"
train_tps="-"
train_mfu="-"
train_ms="-"
if [ $rc = 0 ]; then
    train_tps=$(step_field "$TMP/train.txt" tok/s)
    train_ms=$(step_field "$TMP/train.txt" ms)
    train_mfu=$(step_field "$TMP/train.txt" mfu)
    if [ "$train_mfu" = "-" ] && [ "$train_tps" != "-" ]; then   # the step line has no mfu: compute it
        train_mfu=$(awk -v t="$train_tps" -v p="$PEAK" \
            'BEGIN {printf "%.1f", 100 * t * (6 * 124475904 + 6 * 12 * 768 * 1024) / p}')
    fi
else
    echo "bench: train failed (exit $rc)"
    status=1
fi

# the same with --atomic-dq (flash backward's dq summed with atomics): the other backward
echo "bench: ./train ... --atomic-dq"
train_run "$BATCH" "$STEPS" --atomic-dq >"$TMP/train_atomic.txt" 2>&1
rc=$?
atomic_tps="-"
if [ $rc = 0 ]; then
    atomic_tps=$(step_field "$TMP/train_atomic.txt" tok/s)
    grep '^step ' "$TMP/train_atomic.txt" | tail -n 1
else
    tail -n 3 "$TMP/train_atomic.txt"
    echo "bench: train --atomic-dq failed (exit $rc)"
    status=1
fi

echo
echo "== end to end summary (median of steps 11..$STEPS; MFU = tokens/s x (6N + 6LCT) / $PEAK, N = 124475904)"
pct() { [ "$1" = "-" ] && echo "-" || echo "$1%"; }
printf '%-8s %14s %8s\n' "run" "tokens/s" "MFU"
printf '%-8s %14s %8s\n' "train" "$train_tps" "$(pct "$train_mfu")"
printf '%-8s %14s %8s\n' "torch" "$torch_tps" "$(pct "$torch_mfu")"
printf '%-8s %14s %8s   (train --atomic-dq)\n' "atomic" "$atomic_tps" "-"
if [ "$train_tps" != "-" ] && [ "$torch_tps" != "-" ] && [ -n "$torch_tps" ]; then
    awk -v a="$train_tps" -v b="$torch_tps" 'BEGIN {
        r = a / b; printf "target tokens/s >= 1.0x torch.compile: %.3fx (train %.0f / torch %.0f) %s\n", r, a, b, (r >= 1.0 ? "PASS" : "MISS") }'
else
    echo "target tokens/s >= 1.0x torch.compile: n/a (one of the runs is missing)"
fi
if [ "$train_mfu" != "-" ]; then
    awk -v m="$train_mfu" 'BEGIN { printf "target MFU (6N + 6LCT) >= 40%%: %.1f%% %s\n", m, (m >= 40 ? "PASS" : "MISS") }'
else
    echo "target MFU (6N + 6LCT) >= 40%: n/a (train did not run)"
fi
# the step accounted for: train's measured step beside the sum of its kernels' own times. Where
# ncu is, those are measured: every kernel of train's step 3 (its NVTX range "step 3"), one
# metric (gpu__time_duration), each kernel put in its phase in launch order: forward up to
# the loss (crossentropy), then backward; the norm's steps (norm_kernel, norm_pack_kernel), AdamW, and
# NCCL's kernels (the gradient reduction) by name. Else bench_gpu's rows times their calls a
# step (B 16 only).
echo
echo "== the step accounted for (B $BATCH)"
kern_ms=""
kern_from=""
if command -v ncu > /dev/null 2>&1 && [ -z "$SKIP_STEP_PROFILE" ]; then
    echo "bench: ncu --nvtx --nvtx-include 'step 3/' --metrics gpu__time_duration.sum ./train ... --steps 3"
    timeout 300 ncu --clock-control none --nvtx --nvtx-include "step 3/" --metrics gpu__time_duration.sum \
        --csv --print-units base ./train --data "$DATA" --vocab 50257 --layers 12 --heads 12 --dim 768 \
        --max-seq 1024 --seq 1024 --batch "$BATCH" --steps 3 --warmup 0 --dtype bf16 --device cuda \
        > "$TMP/step_ncu.csv" 2> "$TMP/step_ncu.err"
    awk -F'","' '
        /"Kernel Name"/ { for (i = 1; i <= NF; i++) { f = $i; gsub(/"/, "", f); col[f] = i }; next }
        col["Metric Name"] && $col["Metric Name"] == "gpu__time_duration.sum" {
            name = $col["Kernel Name"]; unit = $col["Metric Unit"]; v = $col["Metric Value"]
            gsub(/[",]/, "", v); gsub(/"/, "", unit)
            ns = v * (unit == "second" ? 1e9 : unit == "msecond" ? 1e6 : unit == "usecond" ? 1e3 : 1)
            if (name ~ /nccl/) p = "reduction"
            else if (name ~ /norm_kernel|norm_pack_kernel/) p = "norm"
            else if (name ~ /adamw/) p = "optimizer"
            else p = seen_loss ? "backward" : "forward"
            if (name ~ /crossentropy|xent/) seen_loss = 1
            ms[p] += ns / 1e6; n[p]++; total += ns / 1e6; kernels++
        }
        END {
            if (!kernels) exit 1
            printf "%-10s %10s %8s\n", "phase", "kernels ms", "kernels"
            split("forward backward reduction norm optimizer", ph, " ")
            for (i = 1; i <= 5; i++) printf "%-10s %10.3f %8d\n", ph[i], ms[ph[i]], n[ph[i]]
            printf "step kernels (ncu, step 3): sum %.3f ms over %d kernels\n", total, kernels
        }' "$TMP/step_ncu.csv" > "$TMP/step_phases.txt" && cat "$TMP/step_phases.txt" &&
        kern_ms=$(awk '/^step kernels \(ncu/ {print $7}' "$TMP/step_phases.txt") && kern_from="ncu, train's step 3"
    [ -n "$kern_ms" ] || { echo "bench: ncu gave no kernel times: $(tail -n 2 "$TMP/step_ncu.err" | tr '\n' ' ')"; }
fi
[ -f "$TMP/kernels.txt" ] && sed -n '/^== the step.s kernels/,/^step kernels:/p' "$TMP/kernels.txt"
if [ -z "$kern_ms" ] && [ "$BATCH" = 16 ]; then
    kern_ms=$(awk '/^step kernels: sum / {print $4}' "$TMP/kernels.txt" 2>/dev/null)
    kern_from="bench_gpu's rows x calls"
fi
if [ "$train_ms" != "-" ] && [ -n "$kern_ms" ]; then
    awk -v s="$train_ms" -v k="$kern_ms" -v from="$kern_from" 'BEGIN {
        r = s - k; printf "step: measured %.2f ms (train, median), kernels %.2f ms (%s), remainder %.2f ms (%.1f%% of the step)\n", s, k, from, r, 100 * r / s
        printf "target step minus its kernels <= 2%% of the step: %.1f%% %s\n", 100 * r / s, (100 * r / s <= 2 ? "PASS" : "MISS") }'
else
    echo "target step minus its kernels <= 2% of the step: n/a (no ncu, and bench_gpu's rows need BATCH=16 and a full run)"
fi
exit $status
