#!/bin/sh
# test/test_cpu_gemm_simde.sh: test_cpu_gemm's checks of the AVX-512 kernel
# (gemm_avx512.c, 12 x 32, and its blocking) on a machine without AVX-512:
# test/test_cpu_gemm_simde is test_cpu_gemm built with that kernel over
# SIMDe (Makefile), run with TRAIN_GEMM=avx512 and once more under
# OMP_THREAD_LIMIT=2 (3 threads asked, 2 given). Its names say "(SIMDe
# emulation)". Without SIMDe's headers (Debian's libsimde-dev) or off
# x86-64 it prints one SKIP line.
cd "$(dirname "$0")/.." || exit 2
h=/usr/include/simde/x86/avx512.h
if [ "$(uname -m)" != x86_64 ]; then echo "SKIP gemm avx512 (SIMDe emulation): not x86-64"; exit 0; fi
if [ ! -f $h ]; then echo "SKIP gemm avx512 (SIMDe emulation): no $h (Debian's libsimde-dev)"; exit 0; fi
if [ ! -x test/test_cpu_gemm_simde ]; then
    echo "FAIL gemm avx512 (SIMDe emulation): $h is here but test/test_cpu_gemm_simde is not built"; exit 1
fi
status=0
TRAIN_GEMM=avx512 ./test/test_cpu_gemm_simde || status=1
TRAIN_GEMM=avx512 OMP_THREAD_LIMIT=2 ./test/test_cpu_gemm_simde || status=1
exit $status
