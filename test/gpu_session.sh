#!/bin/sh
# test/gpu_session.sh: what a session with a GPU runs first, in one call of at
# most 10 minutes, with every log kept (in $OUT when set, the device tool's
# folder that comes back; else test/out/gpu).
#
#   sh test/gpu_session.sh tests   build with NCCL from PyTorch's wheel, then the GPU
#                                  tests in the order to read them: test_gemm (the
#                                  tensor-core GEMM), test_flash, test_kernels (every
#                                  op, fp32 and bf16), test_model (CUDA vs PyTorch,
#                                  fp32 and bf16), test_3d (layouts on the GPU),
#                                  the NCCL backend over every GPU (test_comm)
#   sh test/gpu_session.sh bench   make bench (kernels vs cuBLAS/SDPA, end to end vs
#                                  PyTorch); record its table in bench/NOTES.md
#
# Nothing here changes the card's clocks, power or modes. Each step has a time
# limit, so one hang cannot eat the session's device time.
cd "$(dirname "$0")/.." || exit 2
part=${1:-tests}
logs=${OUT:-test/out/gpu}
mkdir -p "$logs"
NCCL_HOME=$(python3 -c "import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))" 2>/dev/null)
[ -n "$NCCL_HOME" ] && [ -d "$NCCL_HOME/include" ] || NCCL_HOME=/usr/local/cuda
export NCCL_HOME
step() {  # step NAME SECONDS COMMAND...: runs it, keeps its log, prints a summary line
    name=$1; secs=$2; shift 2
    start=$(date +%s)
    timeout "$secs" "$@" > "$logs/$name.log" 2>&1
    rc=$?
    p=$(grep -c '^PASS ' "$logs/$name.log"); f=$(grep -c '^FAIL ' "$logs/$name.log")
    s=$(grep -c '^SKIP ' "$logs/$name.log")
    echo "$name: exit $rc, $p passed, $f failed, $s skipped ($(( $(date +%s) - start )) s)"
    grep -E '^(FAIL|CUDA error|NCCL error)' "$logs/$name.log" | head -20
}

{ nvidia-smi -L; nvcc --version | tail -1; echo "NCCL_HOME=$NCCL_HOME"; } > "$logs/machine.log" 2>&1
cat "$logs/machine.log"
step build 300 make -j16 build tests NCCL_HOME="$NCCL_HOME"
./train --version >> "$logs/machine.log" 2>&1
tail -4 "$logs/machine.log"
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[ "$GPUS" -ge 1 ] || GPUS=1
case "$part" in
tests)
    for t in test_gemm test_flash test_kernels; do step "$t" 120 "./test/$t"; done
    step test_model 120 ./test/test_model
    step test_comm_nccl 60 ./test/test_comm --nccl --ranks "$GPUS"
    step test_3d 240 ./test/test_3d
    ;;
bench)
    step bench 540 make bench NCCL_HOME="$NCCL_HOME"
    tail -60 "$logs/bench.log"
    ;;
*)
    echo "usage: sh test/gpu_session.sh tests|bench"; exit 2 ;;
esac
