/* gemm_avx512.c: the AVX-512 micro-kernel of gemm.c, 12 x 32.
 *
 * Compiled with -mavx512f -mavx2 -mfma (Makefile) and chosen only where the
 * CPU reports avx512f. 24 zmm accumulators (12 rows x two 16-float
 * halves), two vectors of B and one broadcast of A: 27 of the 32 zmm
 * registers. Per k: 2 loads of B, 12 broadcasts, 24 FMAs, so the two
 * 512-bit FMA ports of a Skylake-SP or Sapphire Rapids core (one on some
 * client parts) stay the bottleneck rather than the loads.
 *
 * Blocking: kc 256 keeps a B micro-panel (256 x 32 floats, 32 KB) and an A
 * micro-panel (12 x 256, 12 KB) within the 48 KB L1 of a Sapphire Rapids
 * core; the mc x kc block of A (240 x 256 floats, 240 KB) and the kc x nc
 * panel of B (256 x 1024, 1 MB) sit in its 2 MB L2. Measured on 2 cores of
 * a Sapphire Rapids Xeon (2026-11-26, bench/NOTES.md): kc 128 (the first
 * guess) read and wrote C six times for K = 768, and 0.83 of OpenBLAS over
 * a step's matmuls; kc 256 with mc 240, nc 1024 0.89, the best of six
 * blockings tried, though the spread among them (0.79-0.89) was within
 * that machine's run-to-run noise.
 *
 * test_cpu_gemm runs it against the plain loops on any machine that has
 * AVX-512 (64 checks passed there).
 *
 * Built with -DGEMM_AVX512_SIMDE (and AVX2/FMA flags, not -mavx512f), the
 * same source is compiled over SIMDe's AVX-512 header (Debian's
 * libsimde-dev), whose native aliases make each _mm512_ intrinsic a
 * function on two ymm halves (_mm512_fmadd_ps two fused _mm256_fmadd_ps):
 * that build is for test/test_cpu_gemm_simde, which runs test_cpu_gemm's
 * checks of this kernel and its 12 x 32 blocking on a machine without
 * AVX-512. It tests the code, not its speed.
 */
#include "gemm_kernel.h"

#if defined(GEMM_AVX512_SIMDE)
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#elif defined(__x86_64__) && defined(__AVX512F__)
#include <immintrin.h>
#endif

#if defined(GEMM_AVX512_SIMDE) || (defined(__x86_64__) && defined(__AVX512F__))

#define MR 12
#define NR 32
/* the blocking (kc, mc, nc); -DAVX512_KC=... on this file's compile line tries
 * another (bench/gemm_blockings.sh measures several side by side) */
#ifndef AVX512_KC
#define AVX512_KC 256
#endif
#ifndef AVX512_MC
#define AVX512_MC 240
#endif
#ifndef AVX512_NC
#define AVX512_NC 1024
#endif
/* -DAVX512_A_OUTER=1: the 12-wide A micro-panel (12 KB at kc 256) stays in L1
 * and the 32-wide B micro-panels stream from L2, as BLIS orders its loops
 * on Skylake-X; by default the B micro-panel (32 KB) stays, beside 12 KB of
 * streaming A in a 48 KB L1. Not yet measured on an AVX-512 machine
 * (test/gpu_session.sh cpu compares the two). */
#ifndef AVX512_A_OUTER
#define AVX512_A_OUTER 0
#endif

static void avx512_12x32(int kc, const float *Ap, const float *Bp, float *C, size_t ldc,
                         int load_c) {
    for (int i = 0; i < MR; i++) {  /* C's rows arrive while the k loop runs */
        _mm_prefetch((const char *)(C + i * ldc), _MM_HINT_T0);
        _mm_prefetch((const char *)(C + i * ldc + NR - 1), _MM_HINT_T0);
    }
    __m512 c[MR][2];  /* [row][half]: registers once the loops below are unrolled */
    #pragma GCC unroll 12
    for (int i = 0; i < MR; i++) c[i][0] = c[i][1] = _mm512_setzero_ps();
    for (int k = 0; k < kc; k++) {
        __m512 b0 = _mm512_loadu_ps(Bp), b1 = _mm512_loadu_ps(Bp + 16);  /* B[k, 0:32] */
        #pragma GCC unroll 12
        for (int i = 0; i < MR; i++) {
            __m512 a = _mm512_set1_ps(Ap[i]);
            c[i][0] = _mm512_fmadd_ps(a, b0, c[i][0]);
            c[i][1] = _mm512_fmadd_ps(a, b1, c[i][1]);
        }
        Ap += MR;
        Bp += NR;
    }
    #pragma GCC unroll 12
    for (int i = 0; i < MR; i++) {
        float *r = C + (size_t)i * ldc;
        if (load_c) {
            c[i][0] = _mm512_add_ps(_mm512_loadu_ps(r), c[i][0]);
            c[i][1] = _mm512_add_ps(_mm512_loadu_ps(r + 16), c[i][1]);
        }
        _mm512_storeu_ps(r, c[i][0]);
        _mm512_storeu_ps(r + 16, c[i][1]);
    }
}

const GemmKernel gemm_avx512_kernel = {"avx512", MR, NR, AVX512_KC, AVX512_MC, AVX512_NC, AVX512_A_OUTER,
                                         avx512_12x32, gemm_avx2_pack_t};
#else
const GemmKernel gemm_avx512_kernel = {"avx512", 12, 32, 256, 240, 1024, 0, NULL, NULL};
#endif
