#!/bin/sh
# test/test_plan.sh: ./train --plan: a choice line for a real request, and
# one line and exit 2 for impossible ones (no layout fits, more GPUs than
# the batch allows, an unknown preset).
cd "$(dirname "$0")/.." || exit 2
ok() { echo "PASS $1: $2"; }
no() { echo "FAIL $1: $2"; }
out=$(./train --plan --model gpt3-175b --cluster a100x1024 --global-batch 1536); rc=$?
last=$(echo "$out" | tail -n 1)
case "$last" in "plan: --dp "*) [ $rc -eq 0 ] && ok "gpt3-175b on 1024 A100s" "$last" || no "gpt3-175b" "rc $rc";; *) no "gpt3-175b" "last line: $last";; esac
bad() {
    name=$1; shift
    out=$(./train --plan "$@"); rc=$?
    lines=$(echo "$out" | wc -l)
    if [ $rc -eq 2 ] && [ "$lines" -le 4 ]; then ok "$name" "exit 2: $(echo "$out" | tail -n 1)"; else no "$name" "exit $rc, $lines lines"; fi
}
bad "unknown model preset" --model gpt5 --cluster h100x8
bad "unknown cluster preset" --model gpt2 --cluster tpu9x8
bad "more GPUs than the batch allows" --layers 2 --heads 1 --dim 64 --gpus 64 --global-batch 1
bad "a model that fits no layout" --model gpt3-175b --cluster h100x8 --global-batch 8
