#!/bin/sh
# test/test_emu.sh: the CUDA kernels under the CPU emulation (test/emu/emu.h),
# on any machine with CUDA's headers, GPU or not: test/test_flash_emu
# (attention.cu), test/test_gemm_emu (matmul.cu's TC_MMA path; then, on an
# emulated sm_90a, its TC_WGMMA path) and
# test/test_kernels_emu (kernels.cu's float32 and bf16 tables, the latter
# through attention.cu and matmul.cu, over tensor.c's Dev), each in the four
# settings of the emulation (cp.async landing early or late, the first warp
# after a barrier the lowest or the highest; test_kernels_emu in two of
# them, early-up and late-down, each timing and each order once). Their check names end in
# "(cpu emulation, ...)". Beside them, the training program's CUDA path and
# the emulated NCCL (below).
# Without the binaries (no CUDA headers where make ran) each prints one SKIP
# line. The runs are independent processes, so they run on every core (a
# pool, longest first), and their outputs are printed in a fixed order, each
# with its seconds.
cd "$(dirname "$0")/.." || exit 2
mkdir -p test/out
tmp=test/out/test_emu.tmp
status=0
# queue NAME PROGRAM SETTINGS...: adds a run to the queue, which flush runs
# on every core, a new run starting as soon as one ends (each run is one
# process, one OpenMP thread; a FIFO holds a token a free core), and prints
# in the queue's order: each run's output, a line "time NAME (SETTINGS): Ns"
# (where the suite's minutes go), and a FAIL line of its own when it
# exited non-zero without printing one (an emu: error). Queue the longest
# runs first: the last to start then end together.
jobs=test/out/test_emu.jobs
: > "$jobs"
nproc=$(nproc 2>/dev/null || echo 2)
queue() { echo "$*" >> "$jobs"; }
flush() {
    rm -f "$tmp.fifo"; mkfifo "$tmp.fifo"; exec 3<>"$tmp.fifo"; rm -f "$tmp.fifo"
    k=0; while [ $k -lt "$nproc" ]; do echo >&3; k=$((k + 1)); done
    i=0
    while read -r label prog settings; do
        i=$((i + 1))
        read -r _ <&3   # a free core
        # shellcheck disable=SC2086
        (t0=$(date +%s); env OMP_NUM_THREADS=1 $settings "./$prog" < /dev/null > "$tmp.$i" 2>&1
         echo $? > "$tmp.$i.rc"; echo $(($(date +%s) - t0)) > "$tmp.$i.s"; echo >&3) &
    done < "$jobs"
    wait
    exec 3>&-
    i=0
    while read -r label prog settings; do
        i=$((i + 1))
        cat "$tmp.$i"
        echo "time $label ($settings): $(cat "$tmp.$i.s")s"
        rc=$(cat "$tmp.$i.rc")
        if [ "$rc" -ne 0 ]; then
            status=1
            grep -q '^FAIL ' "$tmp.$i" || echo "FAIL $label ($settings): $prog exited with status $rc"
        fi
        rm -f "$tmp.$i" "$tmp.$i.rc" "$tmp.$i.s"
    done < "$jobs"
    : > "$jobs"
}
# The multi-GPU path, queued first (the longest run, its ranks on every
# core): test/test_3d_nccl_emu, test_3d's GPU layouts (DDP, the parameter
# server, ZeRO 1-3, offload, tp, sp, each schedule, make train's 4- and
# 8-GPU layouts) over comm_nccl.c and the emulated NCCL, one emulated GPU a
# rank, in two stream timings, against the CPU's one rank.
if [ -x test/test_3d_nccl_emu ]; then
    queue 3d_nccl test/test_3d_nccl_emu
else
    echo "SKIP 3d (emulated NCCL): not built (no nccl.h or no \$CUDA_HOME/include/cuda_bf16.h where make ran)"
fi
# The whole training program's CUDA path: test/test_3d_emu (test_3d's CUDA
# layouts, the ranks sharing the emulated GPU over the shared-memory
# backend, against the CPU's one rank; the next longest run) and
# test/test_model_emu (the model on --device cuda, fp32 and bf16, against
# the PyTorch fixture, in-process and through test/train_emu), once each,
# in the default settings: the kernels' four settings are test_kernels_emu's
# below. Then the kernels, longest runs first.
for t in test/test_3d_emu test/test_model_emu test/test_selftest_emu; do
    name=$(basename "$t" _emu)
    if [ ! -x "$t" ] || [ ! -x test/train_emu ]; then
        echo "SKIP ${name#test_} (cpu emulation): not built (no \$CUDA_HOME/include/cuda_bf16.h where make ran)"
        continue
    fi
    queue "${name#test_}" "$t" EMU_CP=early EMU_ORDER=up
done
# matmul.cu's sm_90a kernel (TC_WGMMA: TMA, mbarriers, warp-specialised
# wgmma, a persistent grid) on an emulated H100: test_gemm_emu in the four
# settings, with 132 SMs (a block a tile) and with 1 (one block walks every
# tile, the pipeline's phases carried from tile to tile); test_kernels_emu's
# bf16 table, whose matmuls then take TC_WGMMA, in two.
if [ -x test/test_gemm_emu ]; then
    for cp in early late; do
        for order in up down; do
            for sms in 132 1; do
                # the 20-second shape whose plan takes stream-K (streamk-plan) runs once, at 132
                # SMs (with one SM no plan takes it; the forced stream-K checks run in every setting)
                parts=TEST_GEMM_PARTS=products,streamk,gelu,bias
                [ $sms -eq 132 ] && [ $cp$order = earlyup ] && parts=
                queue gemm_sm_90a test/test_gemm_emu EMU_ARCH=sm_90a EMU_SMS=$sms EMU_CP=$cp EMU_ORDER=$order $parts
            done
        done
    done
fi
if [ -x test/test_kernels_emu ]; then
    queue kernels_sm_90a test/test_kernels_emu EMU_ARCH=sm_90a EMU_CP=early EMU_ORDER=up
    queue kernels_sm_90a test/test_kernels_emu EMU_ARCH=sm_90a EMU_CP=late EMU_ORDER=down
fi
for t in test/test_kernels_emu test/test_gemm_emu test/test_flash_emu; do   # longest first
    name=$(basename "$t" _emu)
    if [ ! -x "$t" ]; then
        echo "SKIP ${name#test_} (cpu emulation): not built (no \$CUDA_HOME/include/cuda_bf16.h where make ran)"
        continue
    fi
    for cp in early late; do
        for order in up down; do
            # test_kernels_emu (the longest of the three) in two of the four, as on sm_90a
            # below: each copy timing and each warp order once (early up, late down)
            case "$t$cp$order" in *kernels_emu*earlydown|*kernels_emu*lateup) continue ;; esac
            queue "${name#test_}" "$t" EMU_CP=$cp EMU_ORDER=$order
        done
    done
done
# The runtime's asynchronous streams, timings and race detector, with
# deliberate bugs (test/test_streams_emu.cpp), in each timing; once with
# three emulated GPUs.
if [ -x test/test_streams_emu ]; then
    for timing in eager first-late rest-late; do
        queue streams test/test_streams_emu EMU_STREAMS=$timing
    done
    queue streams test/test_streams_emu EMU_STREAMS=eager EMU_GPUS=3
else
    echo "SKIP streams (cpu emulation): not built (no \$CUDA_HOME/include/cuda_bf16.h where make ran)"
fi
flush
# The model once more with its compute stream late (EMU_STREAMS=first-late:
# kernels run only when the host synchronizes), which tensor.c's copies
# must survive (a flush of its own: the runs share their files).
if [ -x test/test_model_emu ] && [ -x test/train_emu ]; then
    queue model test/test_model_emu EMU_CP=early EMU_ORDER=up EMU_STREAMS=first-late
    flush
fi
# The emulated NCCL (test/emu/emu_nccl.cpp): test/test_nccl_emu forks its
# own ranks (one emulated GPU each), so it runs alone: its loud-failure jobs
# are timed (deadlock after 250 ms, dead peers within a second).
if [ -x test/test_nccl_emu ]; then
    queue nccl_emu test/test_nccl_emu
    flush
else
    echo "SKIP nccl_emu (cpu emulation): not built (no nccl.h or no \$CUDA_HOME/include/cuda_bf16.h where make ran)"
fi
# comm_nccl.c over the emulated NCCL, one emulated GPU a rank: test_comm's
# whole table over it (8 ranks), alone (its ranks fill every core).
if [ -x test/test_comm_nccl_emu ]; then
    t0=$(date +%s)
    EMU_GPUS=8 OMP_NUM_THREADS=1 ./test/test_comm_nccl_emu --nccl --ranks 8 > "$tmp" 2>&1
    rc=$?
    cat "$tmp"
    echo "time comm (emulated NCCL): $(($(date +%s) - t0))s"
    if [ "$rc" -ne 0 ]; then
        status=1
        grep -q '^FAIL ' "$tmp" || echo "FAIL comm (emulated NCCL): test/test_comm_nccl_emu exited with status $rc"
    fi
else
    echo "SKIP comm (emulated NCCL): not built (no nccl.h or no \$CUDA_HOME/include/cuda_bf16.h where make ran)"
fi
# The model once more on the emulated H100, its matmuls through TC_WGMMA
# (its names say so: test_model's own tag is a constant), on one SM: each
# persistent block then takes every tile, so the ping-pong kernel's two
# consumer warpgroups alternate inside training (with 132 SMs these small
# products give a block one tile, and only the first warpgroup runs).
if [ -x test/test_model_emu ] && [ -x test/train_emu ]; then
    t0=$(date +%s)
    EMU_ARCH=sm_90a EMU_SMS=1 EMU_CP=late EMU_ORDER=down ./test/test_model_emu > "$tmp" 2>&1
    rc=$?
    sed 's/(cpu emulation)/(cpu emulation of sm_90a)/' "$tmp"
    echo "time model (cpu emulation of sm_90a, 1 SM): $(($(date +%s) - t0))s"
    if [ "$rc" -ne 0 ]; then
        status=1
        grep -q '^FAIL ' "$tmp" || echo "FAIL model (cpu emulation of sm_90a): test/test_model_emu exited with status $rc"
    fi
fi
rm -f "$tmp"
exit $status
