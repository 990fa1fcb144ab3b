/* test/test_cpu_gemm.c: the CPU GEMM (gemm.c) against its plain loops, under every kernel.
 *
 * Run without TRAIN_GEMM, the program runs itself again once for each
 * kernel (avx512, avx2, plain) with TRAIN_GEMM set; a kernel this CPU
 * cannot run prints SKIP. Under one kernel it checks:
 *  - gemm() against gemm_reference() over a table of shapes (tiny, odd,
 *    tall, wide, every transposed form, strided views as attention's heads
 *    in qkv, K not a multiple of the K block, accumulate, bias), each
 *    element within 4 K eps of sum_k |a b| (the two differ only in the
 *    order of rounding);
 *  - the same bits for 1, 2 and 3 threads, C split by rows (B packed by
 *    the team), by columns (A packed by the team: whole, once, or again
 *    for each block of columns) and as gemm() chooses;
 *    once more under OMP_THREAD_LIMIT=2, where 3 threads asked are 2 given;
 *  - the float32 ops built on it (matmul forward and backward, attention
 *    forward and backward) against the float64 plain loops of ops.c
 *    (test/exact64.h).
 * Built as test_cpu_gemm_simde (Makefile), the avx512 kernel runs over
 * SIMDe on any AVX2 machine; test/test_cpu_gemm_simde.sh runs it with
 * TRAIN_GEMM=avx512, and its names say "(SIMDe emulation)".
 * Once, beside the kernels: the float32 plain loops of the same ops
 * (cpu_*_naive, their specification) against float64 likewise; the
 * gradient norm's sum on its grid (optim.h) gives the same bits over 1, 2 and 3 threads and cut into pieces as ranks
 * cut it (their limbs summed as int32), and lies within 1e-15 of a long
 * double sum; and dev_alloc's host buffers, the operands, start on a
 * 64-byte line.
 */
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"
#include "gemm.h"
#include "ops.h"
#include "exact64.h"
#include "optim.h"

static float *urand(size_t n, unsigned long long *s) {
    float *x = check_xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = check_urand(s);
    return x;
}

/* One product of the table: A is M x K and B is K x N, each stored plain
 * (row-major) or transposed, with a leading dimension padded by pad. */
typedef struct { const char *what; int M, N, K, at, bt, pad, acc, bias; } Shape;

/* Largest |got - ref| / (sum_k |a b| + 1e-30) over C, relative to K eps. */
static double gemm_case(const Shape *s, unsigned long long *seed, double *worst) {
    int M = s->M, N = s->N, K = s->K;
    size_t lda = (size_t)(s->at ? M : K) + s->pad, ldb = (size_t)(s->bt ? K : N) + s->pad;
    size_t ldc = (size_t)N + s->pad;
    float *A = urand((size_t)(s->at ? K : M) * lda + 1, seed);
    float *B = urand((size_t)(s->bt ? N : K) * ldb + 1, seed);
    float *C0 = urand((size_t)M * ldc + 1, seed), *bias = urand((size_t)N + 1, seed);
    float *C = check_xmalloc(((size_t)M * ldc + 1) * sizeof(float));
    float *R = check_xmalloc(((size_t)M * ldc + 1) * sizeof(float));
    memcpy(C, C0, ((size_t)M * ldc + 1) * sizeof(float));
    memcpy(R, C0, ((size_t)M * ldc + 1) * sizeof(float));
    size_t a_rs = s->at ? 1 : lda, a_cs = s->at ? lda : 1;
    size_t b_rs = s->bt ? 1 : ldb, b_cs = s->bt ? ldb : 1;
    gemm(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, ldc, s->acc, s->bias ? bias : NULL);
    gemm_reference(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, R, ldc, s->acc, s->bias ? bias : NULL);
    double err = 0;
    int untouched = 1;
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) {
            double absdot = fabs(s->acc ? C0[(size_t)i * ldc + j] : 0) + fabs(s->bias ? bias[j] : 0);
            for (int k = 0; k < K; k++)
                absdot += fabs((double)A[i * a_rs + k * a_cs] * B[k * b_rs + j * b_cs]);
            double e = fabs((double)C[(size_t)i * ldc + j] - R[(size_t)i * ldc + j]) / (absdot + 1e-30);
            if (e > err) err = e;
        }
        for (size_t j = N; j < ldc && i < M - 1; j++)  /* padding of C is not written */
            if (C[(size_t)i * ldc + j] != C0[(size_t)i * ldc + j]) untouched = 0;
    }
    free(A); free(B); free(C0); free(bias); free(C); free(R);
    *worst = err / ((K + 2) * (double)FLT_EPSILON);
    return untouched;
}

/* gemm of one shape with t threads, C split as asked, into a fresh C; the caller frees it. */
static float *gemm_threads(const Shape *s, int t, GemmSplit split) {
    unsigned long long seed = 7;
    int M = s->M, N = s->N, K = s->K;
    size_t lda = (size_t)(s->at ? M : K), ldb = (size_t)(s->bt ? K : N);
    float *A = urand((size_t)M * K, &seed), *B = urand((size_t)K * N, &seed);
    float *C = urand((size_t)M * N, &seed), *bias = urand((size_t)N, &seed);
    omp_set_num_threads(t);
    gemm_split(split, M, N, K, A, s->at ? 1 : lda, s->at ? lda : 1, B, s->bt ? 1 : ldb, s->bt ? ldb : 1,
               C, N, s->acc, s->bias ? bias : NULL);
    free(A); free(B); free(bias);
    return C;
}

/* Largest |f - d| / (max |d| + 1e-30) over n elements. */
static double rel_err(const float *f, const double *d, size_t n) {
    double e = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(f[i])) return INFINITY;   /* never written */
        if (fabs(d[i]) > m) m = fabs(d[i]);
        if (fabs(f[i] - d[i]) > e) e = fabs(f[i] - d[i]);
    }
    return e / (m + 1e-30);
}
/* The float32 linear layer and attention of ops.c: the ones built on
 * gemm(), or their plain loops (the *_naive functions). */
typedef struct {
    void (*matmul_forward)(Dev *d, float *out, const float *inp, const float *w, const float *bias,
                           int N, int C, int OC);
    void (*matmul_backward)(Dev *d, float *dinp, float *dw, float *dbias, const float *dout,
                            const float *inp, const float *w, int N, int C, int OC);
    void (*attention_forward)(Dev *d, float *out, float *att, const float *qkv, int B, int T, int C,
                              int NH);
    void (*attention_backward)(Dev *d, float *dqkv, float *datt, const float *dout,
                               const float *qkv, const float *att, int B, int T, int C, int NH);
} F32Ops;
static const F32Ops on_gemm = {cpu_matmul_forward, cpu_matmul_backward, cpu_attention_forward,
                               cpu_attention_backward};
static const F32Ops plain_loops = {cpu_matmul_forward_naive, cpu_matmul_backward_naive,
                                   cpu_attention_forward_naive, cpu_attention_backward_naive};

/* The float32 ops f (named kn) against the float64 plain loops. */
static void check_ops(Checks *c, const char *kn, const F32Ops *f) {
    unsigned long long seed = 11;
    char name[200];
    Dev d = {0};
    int N = 37, Cn = 72, OC = 53;  /* odd, and not multiples of any block */
    float *x = urand((size_t)N * Cn, &seed), *w = urand((size_t)OC * Cn, &seed), *b = urand(OC, &seed);
    float *g = urand((size_t)N * OC, &seed);
    float *out = calloc((size_t)N * OC, 4), *dx = calloc((size_t)N * Cn, 4);
    float *dw = calloc((size_t)OC * Cn, 4), *db = calloc(OC, 4);
    double *OUT = calloc((size_t)N * OC, 8), *DX = calloc((size_t)N * Cn, 8);
    double *DW = calloc((size_t)OC * Cn, 8), *DB = calloc(OC, 8);
    f->matmul_forward(&d, out, x, w, b, N, Cn, OC);
    f->matmul_backward(&d, dx, dw, db, g, x, w, N, Cn, OC);
    exact64_linear(OUT, DX, DW, DB, x, w, b, g, N, Cn, OC);
    double e1 = rel_err(out, OUT, (size_t)N * OC), e2 = rel_err(dx, DX, (size_t)N * Cn);
    double e3 = rel_err(dw, DW, (size_t)OC * Cn), e4 = rel_err(db, DB, OC);
    snprintf(name, sizeof name, "%s: matmul forward, dinp, dw, dbias against float64", kn);
    check(c, e1 < 1e-5 && e2 < 1e-5 && e3 < 1e-5 && e4 < 1e-5, name,
          "37 x 72 -> 53: relative errors %.2g %.2g %.2g %.2g (bound 1e-5)", e1, e2, e3, e4);
    free(x); free(w); free(b); free(g); free(out); free(dx); free(dw); free(db);
    free(OUT); free(DX); free(DW); free(DB);

    int B = 2, T = 45, C = 48, NH = 3;  /* hs 16; T past one row block of attention */
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, na = (size_t)B * NH * T * T;
    float *qkv = urand(nq, &seed), *go = urand(no, &seed), *dq = malloc(nq * 4);
    float *o = calloc(no, 4), *att = calloc(na, 4), *scr = calloc(na, 4);
    double *O = calloc(no, 8), *DQ = malloc(nq * 8);
    memset(dq, 0xFF, nq * 4);   /* NaN: the backward writes every element */
    exact64_attention(O, DQ, qkv, go, B, T, C, NH);
    f->attention_forward(&d, o, att, qkv, B, T, C, NH);
    f->attention_backward(&d, dq, scr, go, qkv, att, B, T, C, NH);
    double a1 = rel_err(o, O, no), a2 = rel_err(dq, DQ, nq);
    snprintf(name, sizeof name, "%s: attention forward and backward against float64", kn);
    check(c, a1 < 1e-5 && a2 < 1e-5, name, "B 2, T 45, C 48, 3 heads: relative errors %.2g %.2g (bound 1e-5)",
          a1, a2);
    free(qkv); free(go); free(dq); free(o); free(att); free(scr);
    free(DQ); free(O);
}

static int run_kernel(Checks *c, const char *want) {
    char name[200], label[64];
    const char *limit = getenv("OMP_THREAD_LIMIT");
#ifdef GEMM_AVX512_EMULATED  /* test_cpu_gemm_simde: its avx512 kernel runs over SIMDe */
    int emulated = !strcmp(gemm_kernel_name(), "avx512");
#else
    int emulated = 0;
#endif
    snprintf(label, sizeof label, "%s%s%s%s", gemm_kernel_name(), emulated ? " (SIMDe emulation)" : "",
             limit ? " under OMP_THREAD_LIMIT=" : "", limit ? limit : "");
    const char *kn = label;
    if (strcmp(gemm_kernel_name(), want)) {
        snprintf(name, sizeof name, "gemm %s", want);
        check_skip(c, name, "this CPU or build cannot run it");
        return 0;
    }
    const Shape table[] = {
        {"1 x 1 x 1", 1, 1, 1, 0, 0, 0, 0, 0},
        {"tiny 3 x 5 x 7", 3, 5, 7, 0, 0, 0, 0, 0},
        {"odd 37 x 53 x 71, X W^T", 37, 53, 71, 0, 1, 0, 0, 1},
        {"odd 37 x 53 x 71, dY^T X", 37, 53, 71, 1, 0, 0, 1, 0},
        {"odd 37 x 53 x 71, A^T B^T", 37, 53, 71, 1, 1, 0, 1, 1},
        {"K past one block, 50 x 40 x 600 (acc)", 50, 40, 600, 0, 0, 0, 1, 0},
        {"K 129 and 257 (block + 1), 13 x 33 x 257", 13, 33, 257, 0, 1, 0, 0, 0},
        {"K 129, 29 x 65 x 129", 29, 65, 129, 1, 0, 0, 0, 0},
        {"tall 700 x 20 x 64", 700, 20, 64, 0, 0, 0, 0, 1},
        {"wide 7 x 5000 x 33", 7, 5000, 33, 0, 1, 0, 1, 0},
        {"strided views (ld + 19), 45 x 16 x 45", 45, 16, 45, 0, 0, 19, 1, 0},
        {"strided transposed (ld + 5), 45 x 45 x 16", 45, 45, 16, 0, 1, 5, 0, 0},
        {"K 0 with bias", 5, 9, 0, 0, 0, 0, 0, 1},
        {"GPT-2 qkv at 1/12, 64 x 192 x 64", 64, 192, 64, 0, 1, 0, 0, 1},
    };
    unsigned long long seed = 1;
    for (size_t i = 0; i < sizeof table / sizeof *table; i++) {
        double worst;
        int untouched = gemm_case(&table[i], &seed, &worst);
        snprintf(name, sizeof name, "gemm %s: %s", kn, table[i].what);
        check(c, worst <= 4 && untouched, name, "largest error %.3g K eps of sum |a b| (bound 4)%s", worst,
              untouched ? "" : "; wrote past N in C's padding");
    }
    /* Each under both splits (by columns, A packed whole and a block at a
     * time) and gemm()'s own choice, with 2 and 3 threads, against one
     * thread's bits (gemm()'s choice). */
    const Shape split[] = {
        {"301 x 47 x 300 (M > N; M past one row block)", 301, 47, 300, 1, 0, 0, 1, 0},
        {"29 x 517 x 290 (N > M)", 29, 517, 290, 0, 1, 0, 0, 1},
        {"13 x 3100 x 300 (N past one column block)", 13, 3100, 300, 0, 1, 0, 1, 0},
        {"3 x 517 x 290 (fewer row blocks than threads)", 3, 517, 290, 1, 1, 0, 0, 1},
        /* by columns on 2 threads, one thread's columns end on a whole block
         * (nc 1024, 2048, 3072) and the other's need one more: it packs its
         * share of A for a block in which it has no columns */
        {"30 x 2080 x 70 (avx512: one thread's columns end on its nc)", 30, 2080, 70, 0, 1, 0, 0, 0},
        {"30 x 4112 x 70 (plain: one thread's columns end on its nc)", 30, 4112, 70, 0, 1, 0, 0, 0},
        {"30 x 6160 x 70 (avx2: one thread's columns end on its nc)", 30, 6160, 70, 0, 1, 0, 0, 0},
    };
    const GemmSplit splits[] = {GEMM_SPLIT_AUTO, GEMM_SPLIT_ROWS, GEMM_SPLIT_COLS, GEMM_SPLIT_COLS_BLOCKS};
    const char *split_names[] = {"gemm()'s choice", "by rows", "by columns", "by columns, A packed a block at a time"};
    for (size_t i = 0; i < sizeof split / sizeof *split; i++) {
        float *c1 = gemm_threads(&split[i], 1, GEMM_SPLIT_AUTO);
        size_t n = (size_t)split[i].M * split[i].N;
        for (int sp = 0; sp < 4; sp++) {
            float *c2 = gemm_threads(&split[i], 2, splits[sp]), *c3 = gemm_threads(&split[i], 3, splits[sp]);
            snprintf(name, sizeof name, "gemm %s: same bits with 1, 2, 3 threads, %s, %s", kn, split_names[sp],
                     split[i].what);
            check(c, !memcmp(c1, c2, n * 4) && !memcmp(c1, c3, n * 4), name, "%zu elements compared", n);
            free(c2); free(c3);
        }
        free(c1);
    }
    omp_set_num_threads(2);
    check_ops(c, kn, &on_gemm);
    return 0;
}

/* The norm of x[n] as pieces cut at the given points (each piece a rank's:
 * its parts packed to limbs, the limbs summed as the int32 all-reduce does),
 * with t threads. */
static double norm_pieces(const float *x, size_t n, const size_t *cuts, int ncuts, int t) {
    omp_set_num_threads(t);
    int e = 0;
    for (int i = 0; i <= ncuts; i++) {
        size_t lo = i ? cuts[i - 1] : 0, hi = i < ncuts ? cuts[i] : n;
        int pe = cpu_exp_max(NULL, x + lo, hi - lo);
        e = pe > e ? pe : e;
    }
    NormGrid g = optim_norm_grid(e, n);
    int32_t sum[OPTIM_NORM_LIMBS] = {0}, limbs[OPTIM_NORM_LIMBS];
    for (int i = 0; i <= ncuts; i++) {
        size_t lo = i ? cuts[i - 1] : 0, hi = i < ncuts ? cuts[i] : n;
        double acc[3] = {0, 0, 0};
        cpu_sumsq_grid(NULL, x + lo, hi - lo, &g, acc);
        norm_pack_limbs(acc, &g, limbs);
        for (int k = 0; k < OPTIM_NORM_LIMBS; k++) sum[k] = (int32_t)((uint32_t)sum[k] + (uint32_t)limbs[k]);
    }
    return optim_norm_unpack(sum, &g);
}

/* optim_norm's guessed grid (one rank, x as two runs; the reduce leaves its
 * numbers as they are): a run of gradients whose largest exponent stays,
 * jumps up 40 binades, and down 80, each norm the same bits as the two
 * passes', with one read of the gradients where the guess holds and two
 * where it does not (a read seen by what it adds: norm_add always reads its
 * runs; norm_redo reads them when r changes). Each pass is one call with
 * both runs (Ops.norm_add's contract: a GPU launches once a pass). */
static int norm_reads;   /* runs read by the two steps below, this test's only */
static int norm_calls;   /* calls of the two */
static void counting_add(Dev *d, NormAcc *a, const NormRun *runs, int nruns, const NormGrid *g) {
    norm_reads += nruns;
    norm_calls++;
    cpu_norm_add(d, a, runs, nruns, g);
}
static void counting_redo(Dev *d, NormAcc *a, const NormRun *runs, int nruns, int guess, int bits) {
    double r[3];
    memcpy(r, a->r, sizeof r);
    cpu_norm_redo(d, a, runs, nruns, guess, bits);
    norm_reads += memcmp(r, a->r, sizeof r) != 0 ? nruns : 0;
    norm_calls++;
}
typedef struct { const float *x; size_t n; } GuessCtx;
static void guess_runs(void *ctx, OptimNormVisit *visit, void *arg) {
    GuessCtx *q = ctx;
    visit(arg, q->x, q->n / 2);
    visit(arg, q->x + q->n / 2, q->n - q->n / 2);
}
static void guess_reduce(void *ctx, int32_t *x, int n, int max) { (void)ctx, (void)x, (void)n, (void)max; }

static void test_norm_guess(Checks *c, const float *x, size_t n) {
    float *up = malloc(n * sizeof *up), *down = malloc(n * sizeof *down);
    for (size_t i = 0; i < n; i++) up[i] = ldexpf(x[i], 40), down[i] = ldexpf(x[i], -40);
    const float *run[] = {x, x, up, down, down, x};
    const int want_passes[] = {2, 1, 2, 2, 1, 2};
    Ops ops = cpu_ops;
    ops.norm_add = counting_add;
    ops.norm_redo = counting_redo;
    Dev d = {.kind = DEV_CPU, .ops = &ops};
    NormAcc acc;
    int guess = -1, same = 1, passes_ok = 1, calls_ok = 1;
    char got_passes[32] = "";
    for (int k = 0; k < 6; k++) {
        GuessCtx q = {run[k], n};
        norm_reads = 0;
        norm_calls = 0;
        double got = optim_norm(&d, &acc, &guess, n, guess_runs, guess_reduce, &q);
        calls_ok &= norm_calls == 2;
        double want = sqrt(norm_pieces(run[k], n, NULL, 0, 2));
        same &= !memcmp(&got, &want, sizeof got);
        passes_ok &= norm_reads == 2 * want_passes[k];
        snprintf(got_passes + strlen(got_passes), sizeof got_passes - strlen(got_passes), " %g", norm_reads / 2.0);
    }
    check(c, same && passes_ok && calls_ok, "norm: a guessed grid, right or wrong, gives the two passes' bits",
          "6 steps, the exponent kept, up 40, down 80: same bits %d, passes%s (want 2 1 2 2 1 2), "
          "one call a pass for both runs %d", same, got_passes, calls_ok);
    free(up);
    free(down);
}

static void test_norm(Checks *c) {
    size_t n = 100003;
    unsigned long long seed = 11;
    float *x = urand(n, &seed);
    long double exact = 0;
    int want_e = 0;
    for (size_t i = 0; i < n; i++) {   /* magnitudes from 2^-60 to 2^40, zeros, a subnormal */
        x[i] = i % 97 == 0 ? 0.0f : ldexpf(x[i], (int)(i * 7919 % 101) - 60);
        if (i == 5) x[i] = 1e-40f;
        exact += (long double)x[i] * x[i];
        int e = x[i] == 0 ? 0 : ilogbf(x[i]) + 127;
        want_e = e > want_e ? e : want_e;
    }
    check(c, cpu_exp_max(NULL, x, n) == want_e, "norm: largest exponent", "%d, want %d",
          cpu_exp_max(NULL, x, n), want_e);
    size_t cuts_a[] = {1, 7, 50000, 50001, 99000}, cuts_b[] = {33333, 66666};
    double one = norm_pieces(x, n, NULL, 0, 1);
    double pieces[] = {norm_pieces(x, n, NULL, 0, 2), norm_pieces(x, n, NULL, 0, 3),
                       norm_pieces(x, n, cuts_a, 5, 2), norm_pieces(x, n, cuts_b, 2, 3)};
    int same = 1;
    for (int i = 0; i < 4; i++) same &= !memcmp(&one, &pieces[i], sizeof one);
    check(c, same, "norm: same bits on 1, 2, 3 threads and cut as ranks cut", "%.17g", one);
    double rel = fabs((double)(((long double)one - exact) / exact));
    check(c, rel <= 1e-15, "norm: sum of squares against long double", "relative error %.2e (bound 1e-15)", rel);
    float big[3] = {3e38f, 1.0f, -3e38f};   /* the largest squares: no overflow on the grid */
    double want = 2.0 * ((double)big[0] * big[0]) + 1.0;
    double got = norm_pieces(big, 3, NULL, 0, 1);
    check(c, fabs(got - want) / want <= 1e-15, "norm: squares near FLT_MAX", "%.17g, want %.17g", got, want);
    int grid_e = cpu_sumsq_grid(NULL, x, n, &(NormGrid){0}, (double[3]){0});
    check(c, grid_e == want_e, "norm: the grid pass finds the largest exponent too", "%d, want %d", grid_e, want_e);
    test_norm_guess(c, x, n);
    free(x);
}

/* dev_alloc's host buffers (tensor.c) start on a 64-byte line, zeroed, and
 * go back through dev_free: every row the GEMM reads starts where a line does
 * when the row's length is a multiple of 16 floats. */
static void test_host_alloc(Checks *c) {
    Dev d = {0};
    const size_t sizes[] = {1, 100, 4096, 1 << 20, 3 << 22};
    int aligned = 1, zero = 1;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        unsigned char *p = dev_alloc(&d, sizes[i]);
        aligned &= ((uintptr_t)p & 63) == 0;
        for (size_t k = 0; k < sizes[i]; k += 997) zero &= p[k] == 0;
        zero &= p[sizes[i] - 1] == 0;
        memset(p, 0xab, sizes[i]);  /* all of it is ours */
        dev_free(&d, p, sizes[i]);
    }
    check(c, aligned && zero && d.bytes_live == 0, "host buffers: on a 64-byte line, zeroed, all freed",
          "5 sizes, 1 B to 12 MB: aligned %d, zeroed %d, %zu bytes live after", aligned, zero, d.bytes_live);
}

int main(int argc, char **argv) {
    Checks c = {0};
    const char *want = getenv("TRAIN_GEMM");
    if (want && *want) {
        run_kernel(&c, want);
        return check_done(&c);
    }
    /* Once a kernel, each in a process of its own (the choice is made once a
     * process); then the best kernel again under OMP_THREAD_LIMIT=2, so that
     * the split checks' 3 threads get a team of 2 (gemm must plan again for
     * the team it got: split for 3, it left a third of C uncomputed). */
    const char *kernels[] = {"avx512", "avx2", "plain", gemm_kernel_name()};
    int bad = 0;
    for (int i = 0; i < 4; i++) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            setenv("TRAIN_GEMM", kernels[i], 1);
            if (i == 3) setenv("OMP_THREAD_LIMIT", "2", 1);
            execv("/proc/self/exe", argv);
            _exit(127);
        }
        int st = 0;
        waitpid(pid, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            printf("FAIL gemm %s%s: the run exited with status %d\n", kernels[i],
                   i == 3 ? " under OMP_THREAD_LIMIT=2" : "", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
            bad = 1;
        }
    }
    (void)argc;
    check_ops(&c, "float32 plain loops", &plain_loops);
    test_norm(&c);
    test_host_alloc(&c);
    return check_done(&c) || bad;
}
