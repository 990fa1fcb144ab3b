/* gemm_avx2.c: the AVX2/FMA micro-kernel of gemm.c, 6 x 16 (BLIS's shape for Haswell and Zen),
 * and the transposing pack in 8 x 8 ymm transposes (gemm_avx2_pack_t, at the end).
 *
 * Compiled with -mavx2 -mfma -mno-avx512f (Makefile), so it uses the 16 ymm
 * registers an AVX2 machine has, also when the rest of the build targets
 * an AVX-512 machine: 12 accumulators (6 rows x two 8-float halves), two
 * vectors of B and one broadcast of A. Per k: 2 loads of B, 6 broadcasts,
 * 12 FMAs, which keeps both FMA pipes of a Haswell or Zen core busy.
 *
 * Blocking: a B micro-panel (kc x 16 floats = 16 KB at kc 256) stays in
 * the 32 KB L1 while the A micro-panels (6 x kc) stream from L2, which
 * holds the mc x kc block of A (144 x 256 floats = 144 KB).
 */
#include "gemm_kernel.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#define MR 6
#define NR 16
/* the blocking (kc, mc, nc); -DAVX2_KC=... on this file's compile line tries
 * another (bench/gemm_blockings.sh measures several side by side) */
#ifndef AVX2_KC
#define AVX2_KC 256
#endif
#ifndef AVX2_MC
#define AVX2_MC 144
#endif
#ifndef AVX2_NC
#define AVX2_NC 3072
#endif
#ifndef AVX2_A_OUTER  /* 1: the A micro-panel stays in L1, B's stream (GemmKernel.a_outer) */
#define AVX2_A_OUTER 0
#endif

static void avx2_6x16(int kc, const float *Ap, const float *Bp, float *C, size_t ldc, int load_c) {
    for (int i = 0; i < MR; i++) {  /* C's rows arrive while the k loop runs */
        _mm_prefetch((const char *)(C + i * ldc), _MM_HINT_T0);
        _mm_prefetch((const char *)(C + i * ldc + NR - 1), _MM_HINT_T0);
    }
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    #pragma GCC unroll 4
    for (int k = 0; k < kc; k++) {
        __m256 b0 = _mm256_loadu_ps(Bp), b1 = _mm256_loadu_ps(Bp + 8);  /* B[k, 0:16] */
        __m256 a;
        a = _mm256_broadcast_ss(Ap + 0); c00 = _mm256_fmadd_ps(a, b0, c00); c01 = _mm256_fmadd_ps(a, b1, c01);
        a = _mm256_broadcast_ss(Ap + 1); c10 = _mm256_fmadd_ps(a, b0, c10); c11 = _mm256_fmadd_ps(a, b1, c11);
        a = _mm256_broadcast_ss(Ap + 2); c20 = _mm256_fmadd_ps(a, b0, c20); c21 = _mm256_fmadd_ps(a, b1, c21);
        a = _mm256_broadcast_ss(Ap + 3); c30 = _mm256_fmadd_ps(a, b0, c30); c31 = _mm256_fmadd_ps(a, b1, c31);
        a = _mm256_broadcast_ss(Ap + 4); c40 = _mm256_fmadd_ps(a, b0, c40); c41 = _mm256_fmadd_ps(a, b1, c41);
        a = _mm256_broadcast_ss(Ap + 5); c50 = _mm256_fmadd_ps(a, b0, c50); c51 = _mm256_fmadd_ps(a, b1, c51);
        Ap += MR;
        Bp += NR;
    }
#define STORE_ROW(i, lo, hi)                                                           \
    do {                                                                               \
        float *r = C + (size_t)(i) * ldc;                                              \
        if (load_c) {                                                                  \
            lo = _mm256_add_ps(_mm256_loadu_ps(r), lo);                                \
            hi = _mm256_add_ps(_mm256_loadu_ps(r + 8), hi);                            \
        }                                                                              \
        _mm256_storeu_ps(r, lo);                                                       \
        _mm256_storeu_ps(r + 8, hi);                                                   \
    } while (0)
    STORE_ROW(0, c00, c01); STORE_ROW(1, c10, c11); STORE_ROW(2, c20, c21);
    STORE_ROW(3, c30, c31); STORE_ROW(4, c40, c41); STORE_ROW(5, c50, c51);
#undef STORE_ROW
}

/* r[x] holds row x's 8 values (k0..k0+7); afterwards r[k] holds rows 0..7 at k0 + k. */
static inline void transpose8(__m256 r[8]) {
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    /* s0: rows 0-3 at k 0 | 4; s1: at 1 | 5; s2: at 2 | 6; s3: at 3 | 7; s4-s7: rows 4-7 */
    __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(s0, s4, 0x20); r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
    r[1] = _mm256_permute2f128_ps(s1, s5, 0x20); r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    r[2] = _mm256_permute2f128_ps(s2, s6, 0x20); r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
    r[3] = _mm256_permute2f128_ps(s3, s7, 0x20); r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

/* GemmPackT: groups of 8 rows x 8 k, loaded as 8 rows, transposed, stored as
 * 8 k-rows of the panel (8, or the 6 or 4 left of a panel 6 or 12 wide);
 * the last kc % 8 values one at a time. Each row is one run of kc floats
 * (a KB at kc 256), too short for the hardware's prefetcher to find before
 * it ends, so while a group is transposed the next 8 rows (this panel's or
 * the next one's) are asked for, a line of each every 16 k: a group ahead. */
void gemm_avx2_pack_t(int rows, int w, int kc, const float *src, size_t ld, int ahead, float *dst) {
    int k8 = kc / 8 * 8;
    for (int x0 = 0; x0 < w; x0 += 8) {
        int n = w - x0 < 8 ? w - x0 : 8;                             /* panel columns this group fills */
        int valid = rows - x0 < 0 ? 0 : rows - x0 < 8 ? rows - x0 : 8;  /* of them, rows that exist */
        int next = x0 + n, more = rows + ahead - next;                /* the next group's rows, how many */
        if (more > 8) more = 8;
        for (int k0 = 0; k0 < k8; k0 += 8) {
            if (k0 % 16 == 0)
                for (int x = 0; x < more; x++)
                    _mm_prefetch((const char *)(src + (size_t)(next + x) * ld + k0), _MM_HINT_T0);
            __m256 r[8];
            for (int x = 0; x < 8; x++)
                r[x] = x < valid ? _mm256_loadu_ps(src + (size_t)(x0 + x) * ld + k0) : _mm256_setzero_ps();
            transpose8(r);
            float *d = dst + (size_t)k0 * w + x0;
            if (n == 8)
                for (int k = 0; k < 8; k++, d += w) _mm256_storeu_ps(d, r[k]);
            else if (n == 6)  /* the AVX2 kernel's A panels: 4 floats, then 2 */
                for (int k = 0; k < 8; k++, d += w) {
                    _mm_storeu_ps(d, _mm256_castps256_ps128(r[k]));
                    _mm_storel_pi((__m64 *)(d + 4), _mm256_extractf128_ps(r[k], 1));
                }
            else if (n == 4)  /* the AVX-512 kernel's A panels (12 = 8 + 4) */
                for (int k = 0; k < 8; k++, d += w) _mm_storeu_ps(d, _mm256_castps256_ps128(r[k]));
            else
                for (int k = 0; k < 8; k++, d += w) {
                    float t[8];
                    _mm256_storeu_ps(t, r[k]);
                    for (int x = 0; x < n; x++) d[x] = t[x];
                }
        }
    }
    for (int k = k8; k < kc; k++)
        for (int x = 0; x < w; x++) dst[(size_t)k * w + x] = x < rows ? src[(size_t)x * ld + k] : 0;
}

const GemmKernel gemm_avx2_kernel = {"avx2", MR, NR, AVX2_KC, AVX2_MC, AVX2_NC, AVX2_A_OUTER, avx2_6x16,
                                     gemm_avx2_pack_t};
#else
const GemmKernel gemm_avx2_kernel = {"avx2", 6, 16, 256, 144, 3072, 0, NULL, NULL};
#endif
