#!/bin/sh
# test/test_emu.sh: the CUDA kernels under the CPU emulation (test/emu/emu.h),
# on any machine with CUDA's headers, GPU or not: test/test_flash_emu
# (attention.cu), test/test_gemm_emu (matmul.cu's TC_MMA path) and
# test/test_kernels_emu (kernels.cu's float32 and bf16 tables, the latter
# through attention.cu and matmul.cu, over tensor.c's Dev), each in the four
# settings of the emulation (cp.async landing early or late, the first warp
# after a barrier the lowest or the highest). Their check names end in
# "(cpu emulation, ...)". Then the training program's CUDA path (below).
# Without the binaries (no CUDA headers where make ran) each prints one SKIP
# line.
cd "$(dirname "$0")/.." || exit 2
mkdir -p test/out
tmp=test/out/test_emu.tmp
status=0
for t in test/test_flash_emu test/test_gemm_emu test/test_kernels_emu; do
    name=$(basename "$t" _emu)
    if [ ! -x "$t" ]; then
        echo "SKIP ${name#test_} (cpu emulation): not built (no \$CUDA_HOME/include/cuda_bf16.h where make ran)"
        continue
    fi
    for cp in early late; do
        for order in up down; do
            EMU_CP=$cp EMU_ORDER=$order "./$t" > "$tmp" 2>&1
            rc=$?
            cat "$tmp"
            [ "$rc" -eq 0 ] && continue
            status=1
            grep -q '^FAIL ' "$tmp" ||
                echo "FAIL ${name#test_} (cpu emulation, cp.async $cp, warps $order): $t exited with status $rc"
        done
    done
done
# The whole training program's CUDA path: test/test_model_emu (the model on
# --device cuda, fp32 and bf16, against the PyTorch fixture, in-process and
# through test/train_emu) and test/test_3d_emu (test_3d's CUDA layouts, the
# ranks sharing the emulated GPU over the shared-memory backend, against the
# CPU's one rank), once each, in the default settings: the kernels' four
# settings are test_kernels_emu's above.
for t in test/test_model_emu test/test_3d_emu; do
    name=$(basename "$t" _emu)
    if [ ! -x "$t" ] || [ ! -x test/train_emu ]; then
        echo "SKIP ${name#test_} (cpu emulation): not built (no \$CUDA_HOME/include/cuda_bf16.h where make ran)"
        continue
    fi
    EMU_CP=early EMU_ORDER=up "./$t" > "$tmp" 2>&1
    rc=$?
    cat "$tmp"
    [ "$rc" -eq 0 ] && continue
    status=1
    grep -q '^FAIL ' "$tmp" || echo "FAIL ${name#test_} (cpu emulation): $t exited with status $rc"
done
rm -f "$tmp"
exit $status
