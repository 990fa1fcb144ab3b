/* gemm_avx512.c: the AVX-512 micro-kernel of gemm.c, 12 x 32.
 *
 * Compiled with -mavx512f -mavx2 -mfma (Makefile) and chosen only where the
 * CPU reports avx512f. 24 zmm accumulators (12 rows x two 16-float
 * halves), two vectors of B and one broadcast of A: 27 of the 32 zmm
 * registers. Per k: 2 loads of B, 12 broadcasts, 24 FMAs, so the two
 * 512-bit FMA ports of a Skylake-SP or Sapphire Rapids core (one on some
 * client parts) stay the bottleneck rather than the loads.
 *
 * Blocking: kc 128 keeps a B micro-panel (128 x 32 floats, 16 KB) and an A
 * micro-panel (12 x 128, 6 KB) together within a 32 KB or 48 KB L1; the
 * mc x kc block of A (144 x 128 floats, 72 KB) sits in L2.
 *
 * This kernel was written and compiled on an AVX2 machine and could not be
 * run there: its arithmetic is the AVX2 kernel's, with twice the width and
 * rows, and test_cpu_gemm runs it against the plain loops on any machine
 * that has AVX-512.
 */
#include "gemm_kernel.h"

#if defined(__x86_64__) && defined(__AVX512F__)
#include <immintrin.h>

#define MR 12
#define NR 32

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

const GemmKernel gemm_avx512_kernel = {"avx512", MR, NR, 128, 144, 3072, avx512_12x32, gemm_avx2_pack_t};
#else
const GemmKernel gemm_avx512_kernel = {"avx512", 12, 32, 128, 144, 3072, NULL, NULL};
#endif
