#!/bin/sh
# test/test_plan.sh: ./train --plan: a choice line for a real request, and
# one line on stderr and exit 2 for impossible ones (no layout fits, more
# GPUs than the batch allows, an unknown preset, a malformed or out-of-range
# number).
cd "$(dirname "$0")/.." || exit 2
ok() { echo "PASS $1: $2"; }
no() { echo "FAIL $1: $2"; }
out=$(./train --plan --model gpt3-175b --cluster a100x1024 --global-batch 1536); rc=$?
last=$(echo "$out" | tail -n 1)
case "$last" in "plan: --dp "*) [ $rc -eq 0 ] && ok "gpt3-175b on 1024 A100s" "$last" || no "gpt3-175b" "rc $rc";; *) no "gpt3-175b" "last line: $last";; esac
bad() {   # NAME WORDS FLAGS...: exit 2, one line on stderr holding WORDS
    name=$1; want=$2; shift 2
    err=$(./train --plan "$@" 2>&1 >/dev/null); rc=$?
    lines=$(echo "$err" | wc -l)
    if [ $rc -eq 2 ] && [ "$lines" -eq 1 ] && echo "$err" | grep -q -- "$want"; then ok "$name" "exit 2: $err"
    else no "$name" "exit $rc, $lines lines on stderr, want '$want': $err"; fi
}
bad "unknown model preset" "no model preset 'gpt5'" --model gpt5 --cluster h100x8
bad "unknown cluster preset" "no cluster preset 'tpu9x8'" --model gpt2 --cluster tpu9x8
bad "more GPUs than the batch allows" "cannot share a global batch" --layers 2 --heads 1 --dim 64 --gpus 64 --global-batch 1
bad "a model that fits no layout" "no layout fits" --model gpt3-175b --cluster h100x8 --global-batch 8
bad "a malformed number" "--gpus expects a number" --gpus x8
bad "a dimension out of range" "--layers expects a number in 1..1024" --layers 100000
bad "--cpu-cores without --device cpu" "--cpu-cores is for CPU ranks" --gpus 4 --cpu-cores 2
bad "--cpu-cores 0" "--cpu-cores expects a number in 1" --device cpu --gpus 4 --cpu-cores 0

# CPU ranks sharing cores (the planner's model for make bench-plan): with
# a core a rank, naive pp 4's compute takes 4 times dp 4's (one stage busy
# at a time); with 4 ranks on 2 cores only twice (dp 4 runs at half speed,
# naive's one busy rank at full speed, leaving a core idle); gpipe's ramp
# costs something between.
S="--plan --device cpu --layers 4 --heads 4 --dim 128 --seq 64 --vocab 256 --max-seq 64 --gpus 4 --gpus-per-node 4
   --gpu-tflops 0.05 --intra-gbs 1000 --inter-gbs 1000 --latency-us 0 --global-batch 16 --top 100000"
step_of() {   # PLAN-OUTPUT DP PP M SCHED: the predicted step of that layout (zero 0, no recompute, no sp)
    echo "$1" | awk -v dp=$2 -v pp=$3 -v M=$4 -v s=$5 '$1 == "dp" && $2 == dp && $4 == 1 && $6 == pp && $8 == 0 &&
        $10 == M && $13 == s && $14 == "|" { for (i = 1; i <= NF; i++) if ($i == "step") print $(i + 1) }'
}
for cores in 4 2; do
    out=$(./train $S --cpu-cores $cores)
    d=$(step_of "$out" 4 1 1 1f1b); n=$(step_of "$out" 1 4 4 naive); g=$(step_of "$out" 1 4 4 gpipe)
    want=$cores
    if [ -n "$d" ] && [ -n "$n" ] && [ -n "$g" ] &&
       awk -v d=$d -v n=$n -v g=$g -v w=$want 'BEGIN { r = n / d; exit !(r > 0.97 * w && r < 1.03 * w && g > d && g < n) }'; then
        ok "4 ranks on $cores cores" "naive pp 4 / dp 4 = $n / $d s (want $want), gpipe M 4 $g s between"
    else no "4 ranks on $cores cores" "dp 4 '$d', naive pp 4 '$n', gpipe pp 4 '$g' (want naive = $want x dp)"; fi
done

# --layout auto: train asks the planner for this run's layout, prints it and
# trains with it. A global batch of 2 on 4 ranks forces model parallelism;
# the same flags given by hand give the very same losses. An impossible
# request and a layout flag beside auto: one line, exit 2.
T="--device cpu --data test/fixtures/ref_tokens.bin --layers 4 --heads 4 --dim 32 --max-seq 16 --vocab 61 --seq 8
   --steps 3 --lr 1e-3 --ranks 4"
for all in "" --all-schedules; do
    auto=$(./train $T --layout auto --global-batch 2 $all 2>&1); rc=$?
    flags=$(echo "$auto" | sed -n 's/^layout auto: \(--dp [^(]*\) (planner.*/\1/p')
    case "$flags" in "--dp 1 "*|"--dp 2 "*) small=1;; *) small=0;; esac
    hand=$(./train $T $flags 2>&1)
    la=$(echo "$auto" | grep '^step ' | cut -d'|' -f1-3); lh=$(echo "$hand" | grep '^step ' | cut -d'|' -f1-3)
    if [ $rc -eq 0 ] && [ -n "$flags" ] && [ $small -eq 1 ] && [ "$(echo "$la" | wc -l)" -eq 3 ] && [ "$la" = "$lh" ]; then
        ok "--layout auto $all" "chose $flags; 3 losses equal the run given those flags"
    else no "--layout auto $all" "rc $rc, flags '$flags', losses '$la' vs '$lh'"; fi
done
bad_auto() {   # NAME WORDS FLAGS...
    name=$1; want=$2; shift 2
    err=$(./train $T --layout auto "$@" 2>&1 >/dev/null); rc=$?
    if [ $rc -eq 2 ] && [ "$(echo "$err" | wc -l)" -eq 1 ] && echo "$err" | grep -q -- "$want"; then ok "$name" "exit 2: $err"
    else no "$name" "exit $rc, want '$want': $err"; fi
}
bad_auto "--layout auto, no layout possible" "no layout of 4 ranks fits" --global-batch 1 --heads 1 --layers 2
bad_auto "--layout auto beside --dp" "chooses --dp, --tp, --pp" --dp 2
err=$(./train $T --all-schedules 2>&1 >/dev/null); rc=$?
[ $rc -eq 2 ] && echo "$err" | grep -q "give --layout auto" && ok "--all-schedules alone" "exit 2: $err" ||
    no "--all-schedules alone" "exit $rc: $err"

# Context parallelism: searched when no layout without it fits in memory.
# GPT-2 XL's 25 heads leave tp 1 on 8 GPUs; at 524288 tokens a sequence
# nothing fits without cp, and the plan splits the sequence (--cp 8); at
# 1024 tokens it does not. --layout auto takes cp for CPU ranks only (the
# GPU's ring kernels are a plain first version): on 4 CPU ranks a sequence of 262144
# tokens, whose softmax probabilities (275 GB) no rank holds, gets --cp; on GPUs
# the same request that --plan answers with cp is refused.
XL="--layers 48 --heads 25 --dim 1600 --vocab 50257 --max-seq 524288 --global-batch 1"
long=$(./train --plan $XL --cluster h100x8 --seq 524288 | tail -n 1)
short=$(./train --plan $XL --cluster h100x8 --seq 1024 | tail -n 1)
case "$long" in "plan: --dp 1 --cp 8 "*) lc=1;; *) lc=0;; esac
case "$short" in *" --cp "*) sc=1;; "plan: --dp "*) sc=0;; *) sc=1;; esac
[ $lc -eq 1 ] && [ $sc -eq 0 ] && ok "--plan chooses cp for a sequence too long without it" "$long; at 1024 tokens: $short" ||
    no "--plan and cp" "524288 tokens: '$long'; 1024 tokens: '$short'"
# Selective recompute: GPT-2 XL at 4096 tokens, 8 sequences a GPU on 8 H100s: keeping every
# activation does not fit at one micro-batch, recomputing the GELU does (llm.c's -r 1) and costs
# no matmul, so the plan takes --recompute-mode gelu, not the whole --recompute nor 8 micro-batches;
# with one sequence a GPU nothing is recomputed.
X4="--layers 48 --heads 25 --dim 1600 --vocab 50257 --max-seq 4096 --seq 4096 --cluster h100x8"
big=$(./train --plan $X4 --global-batch 64 | tail -n 1); one=$(./train --plan $X4 --global-batch 8 | tail -n 1)
case "$big" in *" --micro-batches 1 --recompute-mode gelu "*) bg=1;; *) bg=0;; esac
case "$one" in "plan: --dp "*" --recompute"*) og=0;; "plan: --dp "*) og=1;; *) og=0;; esac
[ $bg -eq 1 ] && [ $og -eq 1 ] && ok "--plan chooses --recompute-mode gelu where keeping everything does not fit" "$big; 1 a GPU: $one" ||
    no "--plan and --recompute-mode" "64 sequences: '$big'; 8: '$one'"
C="--layers 4 --heads 1 --dim 8 --vocab 61 --global-batch 1 --ranks 4 --layout auto --plan-layout"
cpu=$(./train --device cpu $C --max-seq 262144 --seq 262144 | head -n 1)
few=$(./train --device cpu $C --max-seq 16 --seq 16 | head -n 1)
gpu=$(./train --device cuda $XL --ranks 8 --seq 524288 --layout auto --plan-layout 2>&1 | head -n 1)
case "$cpu" in "layout auto: --dp "*" --cp "*) cc=1;; *) cc=0;; esac
case "$few" in "layout auto: --dp "*" --cp "*) fc=1;; "layout auto: --dp "*) fc=0;; *) fc=1;; esac
case "$gpu" in *"no layout of 8 ranks fits"*) gc=1;; *) gc=0;; esac
[ $cc -eq 1 ] && [ $fc -eq 0 ] && [ $gc -eq 1 ] && ok "--layout auto and cp" "CPU, 262144 tokens: $cpu; 16 tokens: $few; GPUs: $gpu" ||
    no "--layout auto and cp" "CPU 262144: '$cpu'; CPU 16: '$few'; GPUs: '$gpu'"
