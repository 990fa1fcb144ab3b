#!/bin/sh
# test/test_emu.sh: the CUDA kernels under the CPU emulation (test/emu/emu.h),
# on any machine with CUDA's headers, GPU or not: test/test_flash_emu
# (attention.cu), test/test_gemm_emu (matmul.cu's TC_MMA path) and
# test/test_kernels_emu (kernels.cu's float32 and bf16 tables, the latter
# through attention.cu and matmul.cu, over tensor.c's Dev), each in the four
# settings of the emulation (cp.async landing early or late, the first warp
# after a barrier the lowest or the highest). Their check names end in
# "(cpu emulation, ...)". Without the binaries (no CUDA headers where make
# ran) each prints one SKIP line.
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
rm -f "$tmp"
exit $status
