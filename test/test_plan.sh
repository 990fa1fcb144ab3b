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
