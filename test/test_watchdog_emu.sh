#!/bin/sh
# test/test_watchdog_emu.sh: comm_nccl.c's watchdog over the emulated NCCL
# (test/train_nccl_emu, one emulated GPU a rank). A real NCCL hangs when a
# peer stops calling or dies; the watchdog must end every rank with a line
# naming the operation, the group and (in a fork job) the rank that never
# called it, within --comm-timeout. The faults come from the emulated NCCL
# (EMU_NCCL_STALL, _EXIT, _FAIL: rank 1's 12th NCCL operation, mid-training):
#  - fork job (--ranks 2): a rank that stops calling, a rank that dies inside
#    a collective, an injected asynchronous NCCL error;
#  - torchrun-style world (two processes, no supervisor): a rank that stops
#    calling (the other times out alone; the launcher would kill the rest),
#    and a rank that dies (the other sees NCCL's remote error).
# Each case: exit status not 0, the expected line, and done within the
# timeout plus a margin.
cd "$(dirname "$0")/.." || exit 2
if [ ! -x test/train_nccl_emu ]; then
    echo "SKIP watchdog (emulated NCCL): test/train_nccl_emu not built (no nccl.h or CUDA headers where make ran)"
    exit 0
fi
mkdir -p test/out
L=test/out/watchdog
TIMEOUT=2
M="--data test/fixtures/ref_tokens.bin --layers 2 --heads 2 --dim 32 --max-seq 16 --vocab 61 --seq 8 --steps 20
   --device cuda --dtype fp32 --no-self-test --batch 2 --comm-timeout $TIMEOUT"
pass=0
fail=0
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
# verdict NAME RC SECS LOG PATTERN
verdict() {
    line=$(grep -m1 -E "$5" "$4")
    if [ "$2" -ne 0 ] && [ -n "$line" ] && awk -v s="$3" -v t=$TIMEOUT 'BEGIN { exit !(s < t + 8) }'; then
        echo "PASS watchdog: $1: exit $2 after $3 s: $line"
        pass=$((pass + 1))
    else
        echo "FAIL watchdog: $1: exit $2 after $3 s, want a non-zero exit within $((TIMEOUT + 8)) s and /$5/; got: $(tail -n 3 "$4" | tr '\n' '|')"
        fail=$((fail + 1))
    fi
}

fork_case() {   # NAME FAULT PATTERN
    s=$(now)
    env EMU_GPUS=8 $2 timeout 60 ./test/train_nccl_emu $M --ranks 2 > $L.log 2>&1
    rc=$?
    verdict "$1" $rc "$(elapsed $s)" $L.log "$3"
}
fork_case "fork job, rank 1 stops calling" "EMU_NCCL_STALL=rank=1,op=12" \
    "error: rank 0: ncclAllReduce #[0-9]+ on group dp \(2 ranks\) did not complete within $TIMEOUT s \(--comm-timeout\); not called by rank 1"
fork_case "fork job, rank 1 dies in a collective" "EMU_NCCL_EXIT=rank=1,op=12" \
    "rank 0 stops: rank 1 died"
fork_case "fork job, an NCCL error on rank 1" "EMU_NCCL_FAIL=rank=1,op=12" \
    "error: rank 1: NCCL error on group dp \(2 ranks\): unhandled system error.*injected"

cases=0
env_case() {    # NAME FAULT PATTERN: two processes with torchrun's variables; rank 0's verdict
    port=$((20000 + ($$ * 7) % 30000 + cases))   # a port of this run's own, one a case
    cases=$((cases + 1))
    s=$(now)
    for r in 0 1; do
        env EMU_GPUS=8 $2 TORCHELASTIC_RUN_ID=watchdog$$-$port RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
            MASTER_PORT=$port timeout 60 ./test/train_nccl_emu $M > $L.$r.log 2>&1 &
        eval "pid$r=\$!"
    done
    wait $pid0
    rc=$?
    secs=$(elapsed $s)
    kill $pid1 2>/dev/null   # what the launcher does to the rest once one rank failed
    wait $pid1 2>/dev/null
    verdict "$1" $rc "$secs" $L.0.log "$3"
}
env_case "torchrun world, rank 1 stops calling" "EMU_NCCL_STALL=rank=1,op=12" \
    "error: rank 0: ncclAllReduce #[0-9]+ on group dp \(2 ranks\) did not complete within $TIMEOUT s"
env_case "torchrun world, rank 1 dies in a collective" "EMU_NCCL_EXIT=rank=1,op=12" \
    "error: rank 0: NCCL error on group dp \(2 ranks\): remote process exited.*rank 1 exited"
echo "watchdog: $pass passed, $fail failed"
[ $fail -eq 0 ]
