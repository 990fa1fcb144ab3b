#!/bin/sh
# test/gpu_session.sh: what a session with a GPU runs first, in one call of at
# most 10 minutes, with every log kept (in $OUT when set, the device tool's
# folder that comes back; else test/out/gpu).
#
#   sh test/gpu_session.sh tests   build (with the NCCL the Makefile finds), then the GPU
#                                  tests in the order to read them: test_gemm (the
#                                  tensor-core GEMM), test_flash, test_kernels (every
#                                  op, fp32 and bf16), test_model (CUDA vs PyTorch,
#                                  fp32 and bf16), test_3d (layouts on the GPU),
#                                  the NCCL backend over every GPU (test_comm)
#   sh test/gpu_session.sh bench   make bench (kernels vs cuBLAS/SDPA, end to end vs
#                                  PyTorch); record its table in bench/NOTES.md
#   sh test/gpu_session.sh all     both in one call (on an H200, 2026-11-26: build 14 s,
#                                  tests 52-56 s, bench 69-90 s), 8 logs
#   sh test/gpu_session.sh profile ncu on the kernels that matter only (issue 42): the
#                                  wgmma GEMMs (ping-pong, cooperative, cluster) at fcproj
#                                  dinp and attproj dinp, cuBLAS's beside them, training's
#                                  fused fcproj dinp+gelu' with and without fc's bias sums,
#                                  attention's forward and deterministic backward and
#                                  attention_sm90.cu's, picked in bench_gpu by their NVTX
#                                  ranges (--nvtx-include) and --launch-count, and the
#                                  LayerNorm and crossentropy kernels by name: tensor pipe utilisation,
#                                  stall reasons, occupancy, memory (about 3 minutes)
#   sh test/gpu_session.sh profile-all  ncu's time a kernel name over 2 training steps of
#                                  make bench's model (about 7 minutes)
#   sh test/gpu_session.sh lease   what a lease of 15 minutes runs, in one call under 10
#                                  minutes: all (the GPU tests, make bench with PyTorch
#                                  beside it), 20 steps of make bench's model with and
#                                  without TRAIN_ATTN_SM90=1, then profile; then cpu only in what is
#                                  left (5 minutes or more), its A/B of loop orders last and
#                                  only if the call's 10 minutes leave a minute for it;
#                                  its logs packed into one gpu_logs.tar.gz (under $OUT the
#                                  device tool brings back 8 files at most), packed again
#                                  after each step, so a call cut short keeps what ran
#   sh test/gpu_session.sh cpu     the host's CPU, for issue 23 (an AVX-512 Xeon on the H200
#                                  host of 2026-11-26), on 2 pinned cores: test_cpu_gemm,
#                                  the AVX-512 kernel's other loop order
#                                  (-DAVX512_A_OUTER=1) in one process (bench/gemm_ab.sh
#                                  --flags), make bench-cpu, bench_ops with cold
#                                  caches (--cold), the 124M step's spans (--trace),
#                                  then perf's samples by symbol over the step and its
#                                  page faults, context switches and migrations (where
#                                  perf is); OpenBLAS from the image's numpy (BLAS=path
#                                  to choose another). About 5 minutes on the Zen 3
#                                  (bench-cpu 149 s; 124 s on the Xeon); 8 logs at most
#                                  (the device tool brings back 8).
#
# Nothing here changes the card's clocks, power or modes. Each step has a time
# limit, so one hang cannot eat the session's device time.
cd "$(dirname "$0")/.." || exit 2
began=$(date +%s)
part=${1:-tests}
logs=${OUT:-test/out/gpu}
pack=""
if [ "$part" = lease ]; then  # every log in one archive where the logs would have gone
    mkdir -p "$logs"; pack=$logs/gpu_logs.tar.gz; logs=$(mktemp -d) || exit 2
    trap 'rm -rf "$logs"' EXIT
fi
mkdir -p "$logs"
# NCCL: the one the Makefile finds (NCCL_HOME, CUDA_HOME, the system's, then
# PyTorch's wheel; docs/gpu.md), or NCCL_HOME=dir from the caller
NCCL_ARG=${NCCL_HOME:+NCCL_HOME=$NCCL_HOME}
# step NAME SECONDS COMMAND...: runs it, keeps its log, prints a summary line. In a lease
# no step runs past 585 s of the call (its limit is cut to what is left, and a step with
# under 10 s left is not started), so the call ends by itself, its logs packed, before the
# device tool's 600 s.
step() {
    name=$1; secs=$2; shift 2
    start=$(date +%s)
    if [ -n "$pack" ]; then
        left=$(( 585 - (start - began) ))
        if [ "$left" -lt 10 ]; then echo "$name: not run, ${left} s left of the call"; return 1; fi
        [ "$secs" -le "$left" ] || secs=$left
    fi
    timeout "$secs" "$@" > "$logs/$name.log" 2>&1
    rc=$?
    p=$(grep -c '^PASS ' "$logs/$name.log"); f=$(grep -c '^FAIL ' "$logs/$name.log")
    s=$(grep -c '^SKIP ' "$logs/$name.log")
    echo "$name: exit $rc, $p passed, $f failed, $s skipped ($(( $(date +%s) - start )) s)"
    grep -E '^(FAIL|CUDA error|NCCL error)' "$logs/$name.log" | head -20
    [ -z "$pack" ] || tar czf "$pack" -C "$logs" .
}

case "$part" in tests|bench|all|lease|profile|profile-all|cpu) ;; *) echo "usage: sh test/gpu_session.sh tests|bench|all|lease|profile|profile-all|cpu"; exit 2 ;; esac
# the machine, the build and --version in one log (the device tool brings 8 files back)
step build 300 sh -c "nvidia-smi -L; nvcc --version | tail -1; make -j16 build tests $NCCL_ARG && ./train --version"
grep -E '^GPU 0|^Build|^train: NCCL|^CPU GEMM|^CUDA|^GPU arch|^NCCL' "$logs/build.log"
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[ "$GPUS" -ge 1 ] || GPUS=1
# ncu's sections for a kernel that should be faster: SpeedOfLight, the pipes' utilisation
# (tensor included: ComputeWorkloadAnalysis), stall reasons (WarpStateStats,
# SchedulerStats), occupancy, launch shape, memory
NCU_SECTIONS="--section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
    --section SchedulerStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis"
profile() {  # the kernels issue 42 names, and nothing else: bench_gpu's rows by their NVTX ranges
    make -s bench/bench_gpu $NCCL_ARG > /dev/null || { echo "profile: bench/bench_gpu does not build"; return 1; }
    # shellcheck disable=SC2086
    step profile_gemm 240 ncu --clock-control none --nvtx \
        --nvtx-include "gemm fcproj dinp wgmma/" --nvtx-include "gemm attproj dinp wgmma/" \
        --nvtx-include "gemm fcproj dinp cublas/" --nvtx-include "gemm attproj dinp cublas/" \
        --nvtx-include "gemm fcproj dinp wg-coop/" --nvtx-include "gemm attproj dinp wg-coop/" \
        --nvtx-include "gemm fcproj dinp wg-clus/" --nvtx-include "gemm attproj dinp wg-clus/" \
        --nvtx-include "gemm fcproj dinp+gelu' wgmma/" --nvtx-include "gemm fcproj dinp+gelu' nosum wgmma/" \
        --launch-count 30 $NCU_SECTIONS ./bench/bench_gpu --only gemm --reps 1 --warmup 0
    grep -E '^  [A-Za-z_].*\(|Compute \(SM\) Throughput|Memory Throughput|Duration|Issue Slots Busy|Tensor|Stall|Achieved Occupancy|Registers Per' \
        "$logs/profile_gemm.log" | head -80
    # shellcheck disable=SC2086
    step profile_attention 180 ncu --clock-control none --nvtx --nvtx-include "attention fwd+bwd deterministic/" \
        --nvtx-include "attention forward sm90/" --nvtx-include "attention fwd+bwd sm90/" \
        --launch-count 10 $NCU_SECTIONS ./bench/bench_gpu --only attention --reps 1 --warmup 0
    grep -E '^  [A-Za-z_].*\(|Compute \(SM\) Throughput|Memory Throughput|Duration|Issue Slots Busy|Tensor|Stall|Achieved Occupancy|Registers Per' \
        "$logs/profile_attention.log" | head -60
    # the LayerNorm backward (its rows kernel and the partials' sum): DRAM throughput, bank
    # conflicts, warps in flight (bench/NOTES.md, "Third round")
    # shellcheck disable=SC2086
    step profile_lnb 120 ncu --clock-control none --kernel-name regex:layernorm_ --launch-count 6 \
        $NCU_SECTIONS ./bench/bench_gpu --only memory --reps 1 --warmup 0
    grep -E '^  [A-Za-z_].*\(|Memory Throughput|DRAM Throughput|Duration|Bank Conflicts|Achieved Occupancy|Registers Per' \
        "$logs/profile_lnb.log" | head -40
    # crossentropy, the largest memory-bound row (57.7% of copy on the H200): its exp chain
    # or its memory (compute against memory throughput, the pipes, stalls)
    # shellcheck disable=SC2086
    step profile_xent 60 ncu --clock-control none --kernel-name regex:crossentropy_kernel --launch-count 1 \
        $NCU_SECTIONS ./bench/bench_gpu --only memory --reps 1 --warmup 0
    grep -E '^  [A-Za-z_].*\(|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Duration|Issue Slots Busy|Stall|Achieved Occupancy|Registers Per' \
        "$logs/profile_xent.log" | head -30
}
if [ "$part" = profile ]; then profile; exit 0; fi
if [ "$part" = profile-all ]; then
    # every kernel of 2 steps of make bench's model, its time summed by name (ncu replays each
    # kernel once for the one metric; the device image has ncu, not nsys). Written before a
    # session with a GPU could run it.
    make -s data/tinyshakespeare.txt > /dev/null
    step profile 400 ncu --clock-control none --metrics gpu__time_duration.sum --print-summary per-kernel \
        ./train --data data/tinyshakespeare.txt --vocab 50257 --layers 12 --heads 12 --dim 768 \
        --max-seq 1024 --seq 1024 --batch 16 --steps 2 --warmup 0 --dtype bf16 --device cuda
    grep -E 'gpu__time_duration|^  [a-z_]|Kernel|^ +[A-Za-z_]' "$logs/profile.log" | tail -120
    exit 0
fi
a_outer() {  # SECONDS: the AVX-512 kernel's two loop orders in one process (in cpu, below)
    step cpu_a_outer "$1" $pin env B_FLAGS=-DAVX512_A_OUTER=1 sh bench/gemm_ab.sh --flags 20
    tail -17 "$logs/cpu_a_outer.log"
}
cpu() {
    # 2 cores, as issue 23's figures are taken; the first two this shell may use
    cores=$(python3 -c 'import os; print(",".join(map(str, sorted(os.sched_getaffinity(0))[:2])))')
    BLAS=${BLAS:-$(python3 -c 'import glob, os, numpy
d = os.path.join(os.path.dirname(os.path.dirname(numpy.__file__)), "numpy.libs")
print((sorted(glob.glob(d + "/libscipy_openblas*.so")) + [""])[0])' 2>/dev/null)}
    echo "cpu: cores $cores; OpenBLAS ${BLAS:-not found}"; grep -m1 'model name' /proc/cpuinfo
    make -s bench/bench_gemm bench/bench_ops > /dev/null || return 1
    pin="env OMP_NUM_THREADS=2 taskset -c $cores"
    step cpu_gemm_test 120 $pin ./test/test_cpu_gemm
    [ -n "$BLAS" ] || { echo "cpu: no OpenBLAS in the image's numpy: give BLAS=path"; return 1; }
    # The AVX-512 kernel's loops as BLIS orders them on Skylake-X (an A micro-panel in L1,
    # B's streaming) against the default (gemm_avx512.c), in one process, calls in turn
    # (bench/gemm_ab.c): 1.017 in 10 pairs on 2026-11-26 (fourth session); 20 pairs to settle it.
    # (That session also settled the split, by rows or columns, and A packed whole: NOTES.)
    # (A lease runs it last, in what is left of its call: below.)
    [ "$part" = cpu ] && a_outer 200
    step bench_cpu 300 $pin env BLAS="$BLAS" make bench-cpu
    grep -E '^(CPU GEMM|step |bench-cpu: GPT|bench-cpu: targets|matmuls|sum)' "$logs/bench_cpu.log"
    # The 4 x 64 step spent 210 ms more than bench_ops' ops (2026-11-26). bench_ops again
    # with every cache flushed before each call (--cold), as a step's weights and
    # gradients come from memory: which ops the cold caches cost (on the Zen 3, 2026-11-26:
    # the matmuls alike, the small ops' sum 20-25 ms more)
    step cpu_ops_cold 150 $pin ./bench/bench_ops --layers 12 --heads 12 --dim 768 --vocab 50257 \
        --max-seq 1024 --batch 4 --seq 64 --cold
    tail -34 "$logs/cpu_ops_cold.log"
    # the step's forward, backward and optimizer spans (--trace), step by step
    step cpu_step 120 sh -c "$pin ./train --data data/tinyshakespeare_train.txt --vocab 50257 --layers 12 \
        --heads 12 --dim 768 --max-seq 1024 --batch 4 --seq 64 --steps 6 --device cpu --trace /tmp/step.json &&
        python3 -c 'import json; d = json.load(open(\"/tmp/step.json\")); e = d[\"traceEvents\"] if isinstance(d, dict) else d
print(\" \".join(\"%s %.0f\" % (x[\"name\"], x[\"dur\"] / 1e3) for x in e if x.get(\"ph\") == \"X\"))'"
    tail -3 "$logs/cpu_step.log"
    # where the step's time goes by symbol (kernel, packing, OpenMP's waits, the
    # optimizer), from 12 s in (past the start and the first step), if perf is there
    if command -v perf > /dev/null; then
        step cpu_perf 150 sh -c "$pin perf record -q -D 12000 -o /tmp/step.perf ./train --data \
            data/tinyshakespeare_train.txt --vocab 50257 --layers 12 --heads 12 --dim 768 --max-seq 1024 \
            --batch 4 --seq 64 --steps 16 --device cpu > /dev/null &&
            perf report -i /tmp/step.perf --stdio --sort dso,sym | grep -v '^#' | head -40"
        head -25 "$logs/cpu_perf.log"
        # what the OS does to a step: page faults, context switches and migrations over 3
        # steps and over 8 (the difference, over 5 steps, is what a step pays; on the Zen 3,
        # 2026-11-26: the two runs' faults within 200 of each other, about 60 switches a step)
        step cpu_os 120 sh -c "for s in 3 8; do $pin perf stat -e page-faults,context-switches,cpu-migrations \
            ./train --data data/tinyshakespeare_train.txt --vocab 50257 --layers 12 --heads 12 --dim 768 \
            --max-seq 1024 --batch 4 --seq 64 --steps \$s --device cpu 2>&1 | grep -E 'steps|faults|switches|migrations|elapsed'; done"
        cat "$logs/cpu_os.log"
    else
        echo "cpu: no perf here: no profile"
    fi
}
if [ "$part" = cpu ]; then cpu; exit 0; fi
if [ "$part" != bench ]; then
    for t in test_gemm test_flash test_kernels; do step "$t" 120 "./test/$t"; done
    step test_model 120 ./test/test_model
    step test_comm_nccl 60 ./test/test_comm --nccl --ranks "$GPUS"
    step test_3d 240 ./test/test_3d
fi
if [ "$part" != tests ]; then
    step bench 540 make bench $NCCL_ARG
    tail -60 "$logs/bench.log"
fi
if [ "$part" = lease ]; then
    # the step on attention_sm90.cu's kernels (opt-in, TRAIN_ATTN_SM90=1) beside the default,
    # make bench's model and batch, 20 steps each
    sm90="--device cuda --dtype bf16 --layers 12 --heads 12 --dim 768 --vocab 50257 --max-seq 1024 --seq 1024 \
        --batch 16 --steps 20 --warmup 0 --data data/tinyshakespeare.txt"
    # shellcheck disable=SC2086
    step step_default 120 ./train $sm90
    # shellcheck disable=SC2086
    step step_sm90 120 env TRAIN_ATTN_SM90=1 ./train $sm90
    grep -h '^step 20/' "$logs/step_default.log" "$logs/step_sm90.log"
    profile
    # the host's CPU (issue 23) only in what is left of the call's 10 minutes
    left=$(( 570 - ($(date +%s) - began) ))
    if [ "$left" -lt 300 ]; then
        echo "cpu: not run, $left s left of the call (it takes about 5 minutes)"
    # the loop orders' A/B (18 s on the Zen 3) if the call's 10 minutes leave room
    elif cpu; then
        left=$(( 570 - ($(date +%s) - began) ))
        if [ "$left" -ge 60 ]; then a_outer "$left"; else echo "cpu_a_outer: no time left ($left s)"; fi
    fi
    echo "logs: $pack"
fi
