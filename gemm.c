/* gemm.c: the CPU's matrix product, as BLIS builds one (the driver, the
 * packing, the threads, the plain kernel and the plain-loop specification).
 *
 * C[M,N] (+)= A[M,K] B[K,N] in five loops around a micro-kernel (Van Zee
 * and van de Geijn, "BLIS: A Framework for Rapidly Instantiating BLAS
 * Functionality", 2015):
 *
 *   for jc over N in steps of nc          B's panel: kc x nc, packed, in L3
 *     for pc over K in steps of kc        the K block: fixed by the kernel
 *       pack B[pc:pc+kc, jc:jc+nc] into nr-wide micro-panels
 *       for ic over M in steps of mc      A's block: mc x kc, packed, in L2
 *         pack A[ic:ic+mc, pc:pc+kc] into mr-tall micro-panels
 *         for jr over nc in steps of nr   a micro-panel of B stays in L1
 *           for ir over mc in steps of mr
 *             micro-kernel: C[mr x nr] += Ap[mr x kc] Bp[kc x nr]
 *
 * Packing makes every operand contiguous in the order the micro-kernel
 * reads it, whatever its strides: X W^T, dY W, dY^T X and attention's
 * strided heads are all the same loops. Edges are padded with zeros in the
 * packed panels, and a partial block of C goes through a small buffer, so
 * the micro-kernel (and its arithmetic) is the same for every element.
 *
 * Threads split the output, never K: the team divides the longer of M and
 * N into one contiguous range a thread, each thread runs the five loops on
 * its part with its own packing buffers, and no two threads write the same
 * element. Each element is summed over the same K blocks in the same order
 * by the same kernel whichever thread has it, so the result is the same
 * bits for 1, 2 or 3 threads. (Splitting the longer side makes the
 * operand every thread packs again the smaller one.)
 *
 * The kernel is chosen once, on the first call: TRAIN_GEMM if set, else
 * AVX-512, else AVX2 with FMA (__builtin_cpu_supports), else the plain C
 * kernel below. That pointer, set once under pthread_once, is this file's
 * only state.
 */
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "gemm.h"
#include "gemm_kernel.h"

/* ---------------------------------------------------------------------------
 * The specification: three loops, each element summed in k order. */

void gemm_reference(int M, int N, int K, const float *A, size_t a_rs, size_t a_cs,
                    const float *B, size_t b_rs, size_t b_cs, float *C, size_t ldc,
                    int accumulate, const float *bias) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float s = 0;
            for (int k = 0; k < K; k++) s += A[i * a_rs + k * a_cs] * B[k * b_rs + j * b_cs];
            float *c = C + (size_t)i * ldc + j;
            *c = (accumulate ? *c : 0) + (bias ? bias[j] : 0) + s;
        }
}

/* ---------------------------------------------------------------------------
 * The plain kernel: 4 x 16 in C, vectorised by the compiler for whatever the
 * build targets (the fallback on a CPU with neither AVX2 nor AVX-512). */

#define PLAIN_MR 4
#define PLAIN_NR 16

static void plain_4x16(int kc, const float *Ap, const float *Bp, float *C, size_t ldc,
                       int load_c) {
    float acc[PLAIN_MR][PLAIN_NR] = {{0}};
    for (int k = 0; k < kc; k++, Ap += PLAIN_MR, Bp += PLAIN_NR)
        for (int i = 0; i < PLAIN_MR; i++)
            #pragma omp simd
            for (int j = 0; j < PLAIN_NR; j++) acc[i][j] += Ap[i] * Bp[j];
    for (int i = 0; i < PLAIN_MR; i++)
        for (int j = 0; j < PLAIN_NR; j++)
            C[i * ldc + j] = (load_c ? C[i * ldc + j] : 0) + acc[i][j];
}

static const GemmKernel plain_kernel = {"plain", PLAIN_MR, PLAIN_NR, 256, 128, 2048, plain_4x16};

/* ---------------------------------------------------------------------------
 * Choosing the kernel, once. */

static const GemmKernel *chosen;  /* set once by gemm_choose, under pthread_once */
static pthread_once_t chosen_once = PTHREAD_ONCE_INIT;

static int kernel_runs(const GemmKernel *k) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (!k->run) return 0;
    if (k == &gemm_avx512_kernel) return __builtin_cpu_supports("avx512f");
    if (k == &gemm_avx2_kernel) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return 1;
#else
    return k->run != NULL && k == &plain_kernel;
#endif
}

static void gemm_choose(void) {
    const GemmKernel *all[] = {&gemm_avx512_kernel, &gemm_avx2_kernel, &plain_kernel};
    const char *want = getenv("TRAIN_GEMM");
    if (want && *want) {
        for (int i = 0; i < 3; i++)
            if (!strcmp(want, all[i]->name)) {
                if (kernel_runs(all[i])) { chosen = all[i]; return; }
                fprintf(stderr, "gemm: TRAIN_GEMM=%s: this CPU or build cannot run it; using the best it can\n", want);
                break;
            }
        if (!chosen && strcmp(want, "avx512") && strcmp(want, "avx2") && strcmp(want, "plain"))
            fprintf(stderr, "gemm: TRAIN_GEMM=%s: not avx512, avx2 or plain; using the best this CPU can\n", want);
    }
    for (int i = 0; i < 3; i++)
        if (kernel_runs(all[i])) { chosen = all[i]; return; }
}

static const GemmKernel *gemm_kernel(void) {
    pthread_once(&chosen_once, gemm_choose);
    return chosen;
}

const char *gemm_kernel_name(void) { return gemm_kernel()->name; }

void gemm_cpu_describe(char *model, size_t len, const char **isa) {
    snprintf(model, len, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10)) continue;
        char *v = strchr(line, ':');
        if (!v) break;
        v += 1 + (v[1] == ' ');
        v[strcspn(v, "\n")] = 0;
        snprintf(model, len, "%s", v);
        break;
    }
    if (f) fclose(f);
    *isa = "none";
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (__builtin_cpu_supports("avx512f")) *isa = "AVX-512";
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) *isa = "AVX2+FMA";
#endif
}

/* ---------------------------------------------------------------------------
 * Packing. */

/* Ap <- A[0:m, 0:kc] (element (i,k) at A[i*rs + k*cs]) as micro-panels of
 * mr rows, k-major, rows past m zero. */
static void pack_a(int m, int kc, const float *A, size_t rs, size_t cs, int mr, float *Ap) {
    int full = rs == 1 ? m / mr * mr : 0;
    /* columns of A contiguous (dY^T): a row of A's storage feeds 16 panels at
     * once, read in one sweep (a panel alone would read one short run a page) */
    for (int i0 = 0; i0 < full; i0 += 16 * mr) {
        int i1 = i0 + 16 * mr < full ? i0 + 16 * mr : full;
        for (int k = 0; k < kc; k++)
            for (int p = i0; p < i1; p += mr) {
                float *dst = Ap + (size_t)p * kc + (size_t)k * mr;
                const float *src = A + p + k * cs;
                for (int i = 0; i < mr; i++) dst[i] = src[i];
            }
    }
    Ap += (size_t)full * kc;
    for (int i0 = full; i0 < m; i0 += mr, Ap += (size_t)mr * kc) {
        int rows = m - i0 < mr ? m - i0 : mr;
        const float *a = A + (size_t)i0 * rs;
        if (cs == 1) {  /* rows contiguous (X): each row read once, strided writes */
            for (int i = 0; i < rows; i++)
                for (int k = 0; k < kc; k++) Ap[(size_t)k * mr + i] = a[i * rs + k];
            for (int i = rows; i < mr; i++)
                for (int k = 0; k < kc; k++) Ap[(size_t)k * mr + i] = 0;
        } else {
            for (int k = 0; k < kc; k++)
                for (int i = 0; i < mr; i++) Ap[(size_t)k * mr + i] = i < rows ? a[i * rs + k * cs] : 0;
        }
    }
}

/* Bp <- B[0:kc, 0:n] (element (k,j) at B[k*rs + j*cs]) as micro-panels of
 * nr columns, k-major, columns past n zero. */
static void pack_b(int kc, int n, const float *B, size_t rs, size_t cs, int nr, float *Bp) {
    int full = cs == 1 ? n / nr * nr : 0;
    /* rows of B contiguous (dY W, X in dW): a row feeds 16 panels in one sweep */
    for (int j0 = 0; j0 < full; j0 += 16 * nr) {
        int j1 = j0 + 16 * nr < full ? j0 + 16 * nr : full;
        for (int k = 0; k < kc; k++)
            for (int p = j0; p < j1; p += nr) {
                float *dst = Bp + (size_t)p * kc + (size_t)k * nr;
                const float *src = B + p + k * rs;
                for (int j = 0; j < nr; j++) dst[j] = src[j];
            }
    }
    Bp += (size_t)full * kc;
    for (int j0 = full; j0 < n; j0 += nr, Bp += (size_t)nr * kc) {
        int cols = n - j0 < nr ? n - j0 : nr;
        const float *b = B + (size_t)j0 * cs;
        if (rs == 1) {  /* columns contiguous (W^T): 8 k at a time across the nr columns */
            for (int k0 = 0; k0 < kc; k0 += 8) {
                int kn = kc - k0 < 8 ? kc - k0 : 8;
                for (int j = 0; j < cols; j++)
                    for (int k = k0; k < k0 + kn; k++) Bp[(size_t)k * nr + j] = b[j * cs + k];
            }
            for (int j = cols; j < nr; j++)
                for (int k = 0; k < kc; k++) Bp[(size_t)k * nr + j] = 0;
        } else {
            for (int k = 0; k < kc; k++)
                for (int j = 0; j < nr; j++) Bp[(size_t)k * nr + j] = j < cols ? b[k * rs + j * cs] : 0;
        }
    }
}

/* ---------------------------------------------------------------------------
 * The five loops, over one thread's part of C. */

typedef struct {
    int M, N, K;
    const float *A, *B;
    size_t a_rs, a_cs, b_rs, b_cs, ldc;
    float *C;
    int accumulate;  /* C holds what the first K block adds to */
} GemmJob;

/* C[i0:i1, j0:j1] of the job, with buffers Ap [mc*kc], Bp [kc*nc] and a [mr*nr] edge tile. */
static void gemm_part(const GemmKernel *kn, const GemmJob *g, int i0, int i1, int j0, int j1,
                      float *Ap, float *Bp, float *edge) {
    const int mr = kn->mr, nr = kn->nr;
    for (int jc = j0; jc < j1; jc += kn->nc) {
        int nc = j1 - jc < kn->nc ? j1 - jc : kn->nc;
        for (int pc = 0; pc < g->K; pc += kn->kc) {
            int kc = g->K - pc < kn->kc ? g->K - pc : kn->kc;
            int load_c = pc > 0 || g->accumulate;
            pack_b(kc, nc, g->B + pc * g->b_rs + jc * g->b_cs, g->b_rs, g->b_cs, nr, Bp);
            for (int ic = i0; ic < i1; ic += kn->mc) {
                int mc = i1 - ic < kn->mc ? i1 - ic : kn->mc;
                pack_a(mc, kc, g->A + ic * g->a_rs + pc * g->a_cs, g->a_rs, g->a_cs, mr, Ap);
                for (int jr = 0; jr < nc; jr += nr) {
                    const float *bp = Bp + (size_t)jr * kc;
                    int cols = nc - jr < nr ? nc - jr : nr;
                    for (int ir = 0; ir < mc; ir += mr) {
                        const float *ap = Ap + (size_t)ir * kc;
                        int rows = mc - ir < mr ? mc - ir : mr;
                        float *c = g->C + (size_t)(ic + ir) * g->ldc + jc + jr;
                        if (rows == mr && cols == nr) { kn->run(kc, ap, bp, c, g->ldc, load_c); continue; }
                        /* a partial block: through the edge tile, same arithmetic */
                        for (int i = 0; i < rows; i++)
                            if (load_c) memcpy(edge + i * nr, c + i * g->ldc, cols * sizeof(float));
                        kn->run(kc, ap, bp, edge, nr, load_c);
                        for (int i = 0; i < rows; i++) memcpy(c + i * g->ldc, edge + i * nr, cols * sizeof(float));
                    }
                }
            }
        }
    }
}

/* Rounded up to a multiple of m. */
static int round_up(int x, int m) { return (x + m - 1) / m * m; }

void gemm(int M, int N, int K, const float *A, size_t a_rs, size_t a_cs, const float *B,
          size_t b_rs, size_t b_cs, float *C, size_t ldc, int accumulate, const float *bias) {
    if (M <= 0 || N <= 0) return;
    const GemmKernel *kn = gemm_kernel();
    if (bias || (!accumulate && K <= 0)) {  /* C starts at bias (or 0) and accumulates */
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++)
                C[(size_t)i * ldc + j] = (accumulate ? C[(size_t)i * ldc + j] : 0) + (bias ? bias[j] : 0);
        accumulate = 1;
    }
    if (K <= 0) return;
    GemmJob g = {M, N, K, A, B, a_rs, a_cs, b_rs, b_cs, ldc, C, accumulate};
    /* Threads: the longer side split in contiguous ranges of whole micro-blocks. */
    int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
    int split_m = (M + kn->mr - 1) / kn->mr > (N + kn->nr - 1) / kn->nr;
    int blocks = split_m ? (M + kn->mr - 1) / kn->mr : (N + kn->nr - 1) / kn->nr;
    if (nt > blocks) nt = blocks;
    int per = (blocks + nt - 1) / nt * (split_m ? kn->mr : kn->nr);  /* elements a thread */
    int len = split_m ? M : N;
    int ilen = split_m ? per : M, jlen = split_m ? N : per;  /* a thread's part at most */
    int mc = kn->mc < round_up(ilen, kn->mr) ? kn->mc : round_up(ilen, kn->mr);
    int nc = kn->nc < round_up(jlen, kn->nr) ? kn->nc : round_up(jlen, kn->nr);
    int kc = kn->kc < K ? kn->kc : K;
    size_t a_floats = round_up(mc * kc, 16), b_floats = round_up(kc * nc, 16);  /* 64-byte aligned parts */
    size_t floats = a_floats + b_floats + (size_t)kn->mr * kn->nr;
    #pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num();
        int lo = t * per, hi = lo + per < len ? lo + per : len;
        if (lo < hi) {
            void *mem = NULL;
            if (posix_memalign(&mem, 64, floats * sizeof(float))) {
                fprintf(stderr, "error: out of host memory (gemm buffers, %zu floats)\n", floats);
                exit(1);
            }
            float *Ap = mem, *Bp = Ap + a_floats, *edge = Bp + b_floats;  /* [mc*kc], [kc*nc], [mr*nr] */
            if (split_m) gemm_part(kn, &g, lo, hi, 0, N, Ap, Bp, edge);
            else gemm_part(kn, &g, 0, M, lo, hi, Ap, Bp, edge);
            free(mem);
        }
    }
}
