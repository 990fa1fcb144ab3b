/* test/test_gemm.c: matmul.cu's bf16 GEMM, every implementation, against a
 * float64 host reference; and tc_bias_grad against host column sums.
 *
 * The three products of a linear layer (tc.h), and the forward into float32,
 * each at four shapes:
 *   forward  D = A B + bias   A [M][K], B [N][K]   D bf16, written (starts NaN)
 *   dinp     D += A B         A [M][K], B [K][N]   D bf16, accumulated
 *   dw       D += A B         A [K][M], B [K][N]   D float32, accumulated
 *   forward fp32              as forward, D float32 (bias into a float32 D)
 *   bias+accumulate D += A B + bias   as dinp, with bias (both in one epilogue)
 * shapes: M=37 N=77 K=45 (multiples of nothing: the tensor-core kernels must
 * refuse every product, TC_AUTO must fall back), M=37 N=77 K=48 (the
 * forward's contiguous dimension K is aligned, so the tensor-core kernels run
 * it with partial tiles and an odd N: the scalar epilogue), M=328 N=136 K=72
 * (aligned, but no dimension a multiple of a tile; 3 tiles of 128 rows, the
 * last partial: an odd count), and GPT-2's fc layer
 * M=1024 N=3072 K=768.
 *
 * Inputs are uniform in [-1, 1) rounded to bf16; the reference is computed
 * in double from those same bf16 values, so the only errors left are float32
 * summation (fp32 D, tolerance 1e-4) and the final rounding to bf16 (bf16 D,
 * tolerance 1e-2; the rounding alone is up to 2^-9 of a value). The figure is
 * max |gpu - ref| / max |ref|. Written outputs start as NaN (bf16 0xFFFF,
 * float NaN), so an element a kernel forgets to write fails; accumulated
 * outputs start from random values, so a kernel that overwrites fails.
 *
 * Each product runs through TC_SIMPLE, TC_MMA, TC_WGMMA (ping-pong),
 * TC_WGMMA_COOP (cooperative), TC_WGMMA_CLUSTER (ping-pong in clusters of
 * two CTAs along M sharing a multicast B tile) and TC_AUTO, which must run
 * what tc_gemm_auto says it runs. Each wgmma kernel that runs a product
 * unsplit is run again in three tile orders (tc_gemm_order: bands of 1 and
 * 2 m-tiles, and the m-fastest order), each of which must give tc_gemm's
 * bits ("... tile order"); the forward products with N % 8 == 0 go through
 * the ping-pong and cluster kernels' TMA stores. Stream-K (the float32 D's
 * last wave shared out by k-blocks) runs where the plan takes it ("stream-K
 * chosen") and forced through tc_gemm_streamk on every wgmma kernel, its
 * bits checked against the walkers' parts computed apart (test_streamk). An
 * explicit implementation that returns -1 prints SKIP with the reason (and
 * FAILs if it wrote anything anyway); TC_MMA refusing an aligned shape on an
 * sm_80+ GPU is a FAIL, since it must take those.
 *
 * Without a CUDA build or a visible GPU every group prints one SKIP line.
 *
 * Built with -DGEMM_EMU and linked against test/emu/ (test/test_gemm_emu),
 * the same checks run matmul.cu's kernels under the CPU emulation: an sm_80
 * device by default (TC_WGMMA SKIPs: not sm_90), an H100 with
 * EMU_ARCH=sm_90a (TC_WGMMA's TMA, mbarriers and wgmma emulated; EMU_SMS=1
 * makes one persistent block walk every tile); every name then ends in
 * "(cpu emulation, ...)" with the emulation's settings, and GPT-2's fc
 * shape becomes M=256 N=384 K=288 (TC_MMA: 2 x 3 tiles, 9 k-tiles through
 * its 4-stage pipeline; TC_WGMMA_COOP: 2 x 2 tiles of 128 x 256, 5 k-blocks
 * of 64, the last half outside K, so the stages' phases wrap; TC_WGMMA: 2 x
 * 3 tiles of 128 x 128, which with EMU_SMS=1 or 3 one block walks in turns
 * of its two consumer warpgroups, 30 or 10 k-blocks through its 6 stages;
 * TC_WGMMA_CLUSTER: 3 columns of 2 tiles, which with EMU_SMS=3 one cluster
 * walks (1 SM: refused, SKIP: a cluster of 2 needs 2 SMs)). Its odd
 * cases: M=37 and the split-K shapes have one m-tile, so the cluster's
 * second CTA computes a tile wholly past M (stores nothing) and still
 * multicasts its half of B and releases the peer's stages; M=328's three
 * m-tiles make a whole pair and a pair whose second tile is past M, after
 * a partial first (rows 256-327).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tensor.h"
#include "check.h"
#ifdef GEMM_EMU
const char *emu_describe(void); /* test/emu/emu_rt.cpp: "cpu emulation, cp.async late, ..." */
#define GEMM_TAG_FMT " (%s)"
#define GEMM_TAG emu_describe()
#else
#define GEMM_TAG_FMT "%s"
#define GEMM_TAG ""
#endif
#ifdef USE_CUDA
#include <cuda_runtime_api.h>
#include "tc.h"
#endif

static const char *groups[] = {"gemm simple", "gemm mma", "gemm wgmma", "gemm wgmma-coop", "gemm wgmma-cluster",
                               "gemm auto", "gemm dinp+gelu'", "gemm fwd+gelu", "bias_grad"};

#ifdef USE_CUDA

#define TOL_BF16 1e-2
#define TOL_FP32 1e-4

typedef struct Test {
    Dev gpu;
    Checks checks;
    int cc_major;            /* compute capability of the GPU */
    int sms;                 /* its SM count */
    unsigned long long rng;  /* xorshift64* state */
} Test;

/* Split-K's room, as training gives it: DEV_SCRATCH_BYTES of float32. */
#define WORK_FLOATS (DEV_SCRATCH_BYTES / sizeof(float))

static float urand(Test *r) { return check_urand(&r->rng); }  /* uniform in [-1, 1) */

#define xmalloc check_xmalloc

/* n random bf16 values, uniform in [-1, 1) rounded. */
static uint16_t *host_bf16(Test *t, size_t n) {
    uint16_t *x = xmalloc(n * 2);
    for (size_t i = 0; i < n; i++) x[i] = bf16_from_f32(urand(t));
    return x;
}

static void *gpu_put(Test *t, const void *src, size_t bytes) {
    void *p = dev_alloc(&t->gpu, bytes);
    dev_from_host(&t->gpu, p, src, bytes);
    return p;
}

/* ---------------------------------------------------------------------------
 * GEMM. */

typedef struct Product {
    const char *name;
    int a_kmajor, b_kmajor, bias, accumulate, d_fp32;
} Product;

#define NPRODUCTS 5
static const Product products[NPRODUCTS] = {
    {"forward", 1, 1, 1, 0, 0},
    {"dinp", 1, 0, 0, 1, 0},
    {"dw", 0, 0, 0, 1, 1},
    {"forward fp32", 1, 1, 1, 0, 1},  /* no layer of train's, but tc.h allows it: bias into float32 */
    {"bias+accumulate", 1, 0, 1, 1, 0}, /* nor this: bias and the old D in one epilogue */
};

#define NIMPLS 6
static const struct { TcImpl impl; const char *name; } impls[NIMPLS] = {
    {TC_SIMPLE, "simple"}, {TC_MMA, "mma"}, {TC_WGMMA, "wgmma"}, {TC_WGMMA_COOP, "wgmma-coop"},
    {TC_WGMMA_CLUSTER, "wgmma-cluster"}, {TC_AUTO, "auto"},
};

static const char *impl_name(int r) {
    switch (r) {
    case TC_SIMPLE: return "simple";
    case TC_MMA: return "mma";
    case TC_WGMMA: return "wgmma";
    case TC_WGMMA_COOP: return "wgmma-coop";
    case TC_WGMMA_CLUSTER: return "wgmma-cluster";
    case TC_AUTO: return "auto";
    default: return "none (-1)";
    }
}

/* ref [M][N] = A B (+ bias) (+ D0) in double, on rows 0, step, 2 step, ...
 * (the others are left unset). A is [M][K] (a_kmajor) or [K][M]; B is
 * [N][K] (b_kmajor) or [K][N]; bias [N] or NULL; D0 [M][N] (bf16 or float)
 * or NULL. */
static double *reference(const Product *p, const uint16_t *A, const uint16_t *B,
                         const uint16_t *bias, const void *D0, int M, int N, int K, int step) {
    size_t MN = (size_t)M * N;
    double *ref = xmalloc(MN * sizeof(double));
    double *bt = xmalloc((size_t)K * N * sizeof(double));  /* B as [K][N] */
    for (int k = 0; k < K; k++)
        for (int n = 0; n < N; n++)
            bt[(size_t)k * N + n] =
                bf16_to_f32(p->b_kmajor ? B[(size_t)n * K + k] : B[(size_t)k * N + n]);
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int m = 0; m < M; m += step) {
        double *restrict row = ref + (size_t)m * N;
        for (int n = 0; n < N; n++) {
            double v = 0.0;
            if (bias) v += bf16_to_f32(bias[n]);
            if (D0) {
                size_t i = (size_t)m * N + n;
                v += p->d_fp32 ? (double)((const float *)D0)[i]
                               : (double)bf16_to_f32(((const uint16_t *)D0)[i]);
            }
            row[n] = v;
        }
        for (int k = 0; k < K; k++) {
            const double a = bf16_to_f32(p->a_kmajor ? A[(size_t)m * K + k] : A[(size_t)k * M + m]);
            const double *restrict b = bt + (size_t)k * N;
            for (int n = 0; n < N; n++) row[n] += a * b[n];
        }
    }
    free(bt);
    return ref;
}

/* max |got - ref| / max |ref| over the reference's rows (every `step`-th);
 * infinite on a NaN anywhere (an element never written). */
static double max_rel_err(const Product *p, const void *got, const double *ref, int M, int N,
                          int step) {
    double diff = 0.0, scale = 1e-6;
    for (size_t i = 0; i < (size_t)M * N; i++) {
        double g = p->d_fp32 ? (double)((const float *)got)[i]
                             : (double)bf16_to_f32(((const uint16_t *)got)[i]);
        if (isnan(g)) return INFINITY;
        if ((i / N) % step) continue;
        double e = fabs(g - ref[i]);
        if (e > diff) diff = e;
        if (fabs(ref[i]) > scale) scale = fabs(ref[i]);
    }
    return diff / scale;
}

/* Why an explicit implementation may refuse this product here. */
static const char *refusal(const Test *t, TcImpl impl, const Product *p, int M, int N, int K,
                           int *expected) {
    int aligned = (p->a_kmajor ? K : M) % 8 == 0 && (p->b_kmajor ? K : N) % 8 == 0;
    *expected = 1;
    if (!aligned) return "a contiguous dimension is not a multiple of 8 elements (16-byte rows for cp.async / TMA)";
    if (impl == TC_WGMMA_CLUSTER && t->cc_major == 9 && t->sms < 2)
        return "a cluster of 2 CTAs (one an SM) needs 2 SMs; this device has 1";
    if (impl == TC_WGMMA || impl == TC_WGMMA_COOP || impl == TC_WGMMA_CLUSTER)
        return t->cc_major == 9 ? "no sm_90a kernels in this build (needs -gencode "
                                  "arch=compute_90a,code=sm_90a), or the driver has no tensor-map encoder"
                                : "the GPU is not sm_90";
    *expected = t->cc_major < 8;
    return t->cc_major < 8 ? "the GPU is older than sm_80" : "refused an aligned shape on an sm_80+ GPU";
}

/* A wgmma kernel's tile order (tc_gemm_order) changes no value: bands of
 * 1 and 2 m-tiles (n fastest; pairs, with a narrower last band where the
 * m-tiles are odd) and the m-fastest order (one band of every m-tile) must
 * each give the bits `got` (tc_gemm's own order, MN_bytes of D), from the
 * same start d0. */
static void test_order(Test *t, const Product *p, TcImpl impl, const char *iname, const char *shape,
                       const void *got, const void *d0, size_t MN_bytes, void *gD, void *gA, void *gB,
                       void *gbias, int M, int N, int K) {
    static const int groups[3] = {1, 2, 1 << 30};
    void *again = xmalloc(MN_bytes);
    int same = 1, ran = 1;
    for (int i = 0; i < 3; i++) {
        dev_from_host(&t->gpu, gD, d0, MN_bytes);
        ran &= tc_gemm_order(impl, groups[i], gD, p->d_fp32, p->accumulate, gA, p->a_kmajor, gB, p->b_kmajor,
                             gbias, M, N, K, NULL, 0, t->gpu.stream) == (int)impl;
        dev_sync(&t->gpu);
        dev_to_host(&t->gpu, again, gD, MN_bytes);
        same &= memcmp(got, again, MN_bytes) == 0;
    }
    free(again);
    char n2[200];
    snprintf(n2, sizeof n2, "gemm %s %s tile order" GEMM_TAG_FMT, iname, p->name, GEMM_TAG);
    check(&t->checks, same && ran, n2, "%s: bands of 1, 2 and all m-tiles %s tc_gemm's bits%s", shape,
          same ? "give" : "DIFFER from", ran ? "" : " (an order did not run the same kernel)");
}

/* split: pass tc_gemm a work buffer (starting as NaN), as training does for
 * dw, and name the check "... split-k"; each tensor-core implementation
 * must then cut this shape's K into parts (or, a wgmma kernel, run it
 * stream-K) where the device has SMs to spare (16 or more here), and two
 * runs must give the same bits. split 2 also puts D one element past an
 * allocation's start ("split-k odd D"), so no pair or float4 of it is
 * aligned: the scalar stores and sum. split 3 ("stream-K chosen"): a shape
 * whose tiles overfill one wave of 132 by one, where each wgmma kernel's
 * plan must take stream-K on a device of 132 SMs. */
static void test_gemm(Test *t, const Product *p, int M, int N, int K, int split) {
    char shape[96];
    snprintf(shape, sizeof shape, "M=%d N=%d K=%d", M, N, K);
    const size_t MN = (size_t)M * N, esz = p->d_fp32 ? 4 : 2;
    uint16_t *A = host_bf16(t, (size_t)M * K), *B = host_bf16(t, (size_t)K * N);
    uint16_t *bias = p->bias ? host_bf16(t, N) : NULL;
    void *d0 = xmalloc(MN * esz), *got = xmalloc(MN * esz);
    for (size_t i = 0; i < MN; i++) {
        if (p->d_fp32) ((float *)d0)[i] = p->accumulate ? urand(t) : NAN;
        else ((uint16_t *)d0)[i] = p->accumulate ? bf16_from_f32(urand(t)) : 0xFFFF;
    }
    /* The GPT-2 shape's reference takes every 5th row (5 is odd, so the
     * rows still fall in every residue of every power-of-two tile size);
     * every element is still checked for NaN. */
    const int step = (double)M * N * K > 1e8 ? 5 : 1;
    double *ref = reference(p, A, B, bias, p->accumulate ? d0 : NULL, M, N, K, step);

    void *gA = gpu_put(t, A, (size_t)M * K * 2), *gB = gpu_put(t, B, (size_t)K * N * 2);
    void *gbias = bias ? gpu_put(t, bias, (size_t)N * 2) : NULL;
    const size_t dpad = split == 2 ? esz : 0;
    void *gD_alloc = dev_alloc(&t->gpu, MN * esz + dpad), *gD = (char *)gD_alloc + dpad;
    float *work = NULL;
    if (split) {
        void *nan = xmalloc(WORK_FLOATS * sizeof(float));
        memset(nan, 0xFF, WORK_FLOATS * sizeof(float));  /* a part never written shows */
        work = gpu_put(t, nan, WORK_FLOATS * sizeof(float));
        free(nan);
    }
    const double tol = p->d_fp32 ? TOL_FP32 : TOL_BF16;

    for (int ii = 0; ii < NIMPLS; ii++) {
        char name[160];
        snprintf(name, sizeof name, "gemm %s %s%s" GEMM_TAG_FMT, impls[ii].name, p->name,
                 split == 3 ? " stream-K chosen" : split == 2 ? " split-k odd D" : split ? " split-k" : "", GEMM_TAG);
        dev_from_host(&t->gpu, gD, d0, MN * esz);
        int r = tc_gemm(impls[ii].impl, gD, p->d_fp32, p->accumulate, gA, p->a_kmajor, gB,
                        p->b_kmajor, gbias, M, N, K, work, split ? WORK_FLOATS : 0, t->gpu.stream);
        dev_sync(&t->gpu);
        dev_to_host(&t->gpu, got, gD, MN * esz);
        if (r == -1 && impls[ii].impl != TC_SIMPLE && impls[ii].impl != TC_AUTO) {
            int expected;
            const char *why = refusal(t, impls[ii].impl, p, M, N, K, &expected);
            int untouched = memcmp(got, d0, MN * esz) == 0;
            if (!untouched)
                check(&t->checks, 0, name, "%s: returned -1 but wrote the output", shape);
            else if (!expected)
                check(&t->checks, 0, name, "%s: returned -1: %s", shape, why);
            else {
                char line[320];
                snprintf(line, sizeof line, "%s: returned -1: %s", shape, why);
                check_skip(&t->checks, name, line);
            }
            continue;
        }
        /* TC_AUTO must run what tc_gemm_auto says it runs */
        const int auto_says = tc_gemm_auto(p->d_fp32, gA, p->a_kmajor, gB, p->b_kmajor, M, N, K,
                                           split ? WORK_FLOATS : 0, t->gpu.stream);
        int right_impl = impls[ii].impl == TC_AUTO ? r == auto_says : r == (int)impls[ii].impl;
        double err = max_rel_err(p, got, ref, M, N, step);
        if (!split) {
            check(&t->checks, right_impl && err <= tol, name,
                  "%s: ran %s%s, max rel err %.2e over %zu values%s (tol %.0e)", shape, impl_name(r),
                  right_impl ? "" : " (not the implementation asked for, or not what tc_gemm_auto says)",
                  err, (size_t)((M + step - 1) / step) * N, step > 1 ? " (every 5th row)" : "", tol);
            if (r == (int)impls[ii].impl && (r == TC_WGMMA || r == TC_WGMMA_COOP || r == TC_WGMMA_CLUSTER))
                test_order(t, p, impls[ii].impl, impls[ii].name, shape, got, d0, MN * esz, gD, gA, gB, gbias, M, N, K);
            continue;
        }
        const int tcore = r == TC_MMA || r == TC_WGMMA || r == TC_WGMMA_COOP || r == TC_WGMMA_CLUSTER;
        const int parts = tc_gemm_splits((TcImpl)r, p->d_fp32, gA, p->a_kmajor, gB, p->b_kmajor,
                                         M, N, K, WORK_FLOATS, t->gpu.stream);
        /* again from the same start: the parts are added in a fixed order */
        void *again = xmalloc(MN * esz);
        dev_from_host(&t->gpu, gD, d0, MN * esz);
        tc_gemm(impls[ii].impl, gD, p->d_fp32, p->accumulate, gA, p->a_kmajor, gB, p->b_kmajor,
                gbias, M, N, K, work, WORK_FLOATS, t->gpu.stream);
        dev_sync(&t->gpu);
        dev_to_host(&t->gpu, again, gD, MN * esz);
        const int same = memcmp(got, again, MN * esz) == 0;
        free(again);
        const int wg = r == TC_WGMMA || r == TC_WGMMA_COOP || r == TC_WGMMA_CLUSTER;
        const int split_ok = split == 3 ? !wg || t->sms != 132 || parts == 0 : !tcore || t->sms < 16 || parts != 1;
        char how[48];
        if (parts == 0) snprintf(how, sizeof how, "stream-K");
        else snprintf(how, sizeof how, "%d part%s of K", parts, parts == 1 ? "" : "s");
        check(&t->checks, right_impl && err <= tol && same && split_ok, name,
              "%s: ran %s in %s%s, max rel err %.2e over %zu values (tol %.0e), two runs %s",
              shape, impl_name(r), how,
              split_ok ? "" : split == 3 ? " (a wgmma kernel on 132 SMs must take stream-K here)"
                                         : " (a tensor-core kernel with SMs to spare must split)", err,
              (size_t)((M + step - 1) / step) * N, tol, same ? "bitwise equal" : "differ");
    }

    dev_free(&t->gpu, gA, (size_t)M * K * 2);
    dev_free(&t->gpu, gB, (size_t)K * N * 2);
    if (gbias) dev_free(&t->gpu, gbias, (size_t)N * 2);
    dev_free(&t->gpu, gD_alloc, MN * esz + dpad);
    if (work) dev_free(&t->gpu, work, WORK_FLOATS * sizeof(float));
    free(A); free(B); free(bias); free(d0); free(got); free(ref);
}

/* ---------------------------------------------------------------------------
 * Stream-K (tc_gemm_streamk; matmul.cu's header, "Stream-K"): a wgmma
 * kernel forced into the stream-K form over W walkers, tiles in bands of
 * `group`. Its plan, restated here from the contract: tiles / W full waves
 * of whole tiles first (tiles 0 .. dp - 1 of the banded order), then the
 * other left = tiles - dp tiles' left x nk (tile, k-block) pairs in shares
 * of L = ceil(left nk / W), walker b the pairs [b L, (b + 1) L); tile x of
 * them is met by walkers b0 = x nk / L .. b1 = ((x + 1) nk - 1) / L, and
 * its value is (D0 + P(b0)) + ((P(b0 + 1) + P(b0 + 2)) + ... + P(b1)), P(b)
 * the float32 product over walker b's k-blocks of the tile.
 *
 * On the dw product (A [K][M], B [K][N]: a range of k-blocks is a pointer
 * offset) each P is computed apart, by the same kernel on that slice of K
 * (its k-blocks from zero, as the walker's), and the result must be that
 * expression's bits exactly: so a part dropped, summed twice or out of
 * order, or a walker's range off by a block, cannot pass. Tiles done whole
 * must be the plain run's bits. Every product is also held to the float64
 * reference, and run twice for the same bits. W for which the tiles are a
 * multiple (no last wave) must be refused. */

static const struct { TcImpl impl; const char *name; int tm, tn; } sk_impls[3] = {
    {TC_WGMMA, "wgmma", 128, 128}, {TC_WGMMA_COOP, "wgmma-coop", 128, 256}, {TC_WGMMA_CLUSTER, "wgmma-cluster", 256, 128},
};

/* Tile t of tiles_m x tiles_n in bands of `group` m-tiles (tc_gemm_order's walk) at (*mt, *nt). */
static void band_tile(int t, int tiles_m, int tiles_n, int group, int *mt, int *nt) {
    if (group > tiles_m) group = tiles_m;
    const int first = t / (group * tiles_n) * group, r = t - first * tiles_n;
    const int g = group < tiles_m - first ? group : tiles_m - first;
    *mt = first + r % g;
    *nt = r / g;
}

/* The dw product over k-blocks [kb0, kb1) of K into a new host [M][N] (impl's kernel, no work: one part). */
static float *slice_product(Test *t, TcImpl impl, const void *gA, const void *gB, int M, int N, int K, int kb0,
                            int kb1, int *ran) {
    const size_t MN = (size_t)M * N;
    const int k0 = kb0 * 64, k1 = kb1 * 64 < K ? kb1 * 64 : K;
    float *gS = dev_alloc(&t->gpu, MN * 4), *S = xmalloc(MN * 4);
    *ran = tc_gemm(impl, gS, 1, 0, (const char *)gA + (size_t)k0 * M * 2, 0, (const char *)gB + (size_t)k0 * N * 2,
                   0, NULL, M, N, k1 - k0, NULL, 0, t->gpu.stream) == (int)impl;
    dev_sync(&t->gpu);
    dev_to_host(&t->gpu, S, gS, MN * 4);
    dev_free(&t->gpu, gS, MN * 4);
    return S;
}

static void test_streamk(Test *t, const Product *p, int M, int N, int K, int si, int W, int group) {
    const TcImpl impl = sk_impls[si].impl;
    const int tiles_m = (M + sk_impls[si].tm - 1) / sk_impls[si].tm, tiles_n = (N + sk_impls[si].tn - 1) / sk_impls[si].tn;
    const int tiles = tiles_m * tiles_n, nk = (K + 63) / 64, exact = p->d_fp32 && p->accumulate && !p->a_kmajor;
    const int dp = tiles / W * W, left = tiles - dp;
    const long long L = left ? ((long long)left * nk + W - 1) / W : 0;
    char name[200], shape[96];
    snprintf(name, sizeof name, "gemm %s %s stream-K, %d walker%s, bands of %d" GEMM_TAG_FMT, sk_impls[si].name,
             p->name, W, W == 1 ? "" : "s", group, GEMM_TAG);
    snprintf(shape, sizeof shape, "M=%d N=%d K=%d", M, N, K);
    const size_t MN = (size_t)M * N;
    uint16_t *A = host_bf16(t, (size_t)M * K), *B = host_bf16(t, (size_t)K * N);
    uint16_t *bias = p->bias ? host_bf16(t, N) : NULL;
    float *d0 = xmalloc(MN * 4), *got = xmalloc(MN * 4), *again = xmalloc(MN * 4), *whole = xmalloc(MN * 4);
    for (size_t i = 0; i < MN; i++) d0[i] = p->accumulate ? urand(t) : NAN;
    double *ref = reference(p, A, B, bias, p->accumulate ? d0 : NULL, M, N, K, 1);
    void *gA = gpu_put(t, A, (size_t)M * K * 2), *gB = gpu_put(t, B, (size_t)K * N * 2);
    void *gbias = bias ? gpu_put(t, bias, (size_t)N * 2) : NULL;
    float *gD = dev_alloc(&t->gpu, MN * 4), *work = xmalloc(WORK_FLOATS * 4);
    memset(work, 0xFF, WORK_FLOATS * 4);  /* NaN: a slot read but never written shows */
    float *gwork = gpu_put(t, work, WORK_FLOATS * 4);
    free(work);

    /* the plain run: what the tiles done whole must give, and whether the kernel runs here */
    dev_from_host(&t->gpu, gD, d0, MN * 4);
    const int plain = tc_gemm(impl, gD, 1, p->accumulate, gA, p->a_kmajor, gB, p->b_kmajor, gbias, M, N, K, NULL, 0,
                              t->gpu.stream);
    dev_sync(&t->gpu);
    dev_to_host(&t->gpu, whole, gD, MN * 4);
    int r[2] = {-1, -1};
    for (int run = 0; run < 2 && plain == (int)impl; run++) {
        dev_from_host(&t->gpu, gD, d0, MN * 4);
        r[run] = tc_gemm_streamk(impl, W, group, gD, 1, p->accumulate, gA, p->a_kmajor, gB, p->b_kmajor, gbias, M, N,
                                 K, gwork, WORK_FLOATS, t->gpu.stream);
        dev_sync(&t->gpu);
        dev_to_host(&t->gpu, run ? again : got, gD, MN * 4);
    }
    if (plain != (int)impl) {
        int expected;
        char line[320];
        snprintf(line, sizeof line, "%s: the kernel returned -1: %s", shape, refusal(t, impl, p, M, N, K, &expected));
        if (expected) check_skip(&t->checks, name, line);
        else check(&t->checks, 0, name, "%s", line);
    } else if (left == 0) {
        check(&t->checks, r[0] == -1 && memcmp(got, d0, MN * 4) == 0, name,
              "%s: %d tile%s, a multiple of %d walker%s: %s", shape, tiles, tiles == 1 ? "" : "s", W, W == 1 ? "" : "s",
              r[0] == -1 && memcmp(got, d0, MN * 4) == 0 ? "refused, nothing written" : "not refused, or D written");
    } else {
        /* the expected bits, tile by tile of the last wave, from the walkers' parts computed apart */
        float *expect = xmalloc(MN * 4);
        memcpy(expect, whole, MN * 4);
        int slices_ok = 1, parts_summed = 0;
        for (int x = 0; exact && x < left; x++) {
            const int b0 = (int)((long long)x * nk / L), b1 = (int)(((long long)(x + 1) * nk - 1) / L);
            float *P[64];
            if (b1 - b0 >= 64) { slices_ok = 0; break; }
            for (int b = b0; b <= b1; b++) {
                const long long lo = b * L - (long long)x * nk, hi = (b + 1) * L - (long long)x * nk;
                int ran;
                P[b - b0] = slice_product(t, impl, gA, gB, M, N, K, lo > 0 ? (int)lo : 0, hi < nk ? (int)hi : nk, &ran);
                slices_ok &= ran;
            }
            parts_summed += b1 - b0;
            int mt, nt;
            band_tile(dp + x, tiles_m, tiles_n, group, &mt, &nt);
            for (int m = mt * sk_impls[si].tm; m < M && m < (mt + 1) * sk_impls[si].tm; m++)
                for (int n = nt * sk_impls[si].tn; n < N && n < (nt + 1) * sk_impls[si].tn; n++) {
                    const size_t i = (size_t)m * N + n;
                    float v = d0[i] + P[0][i];
                    if (b1 > b0) {
                        float sum = P[1][i];
                        for (int b = b0 + 2; b <= b1; b++) sum += P[b - b0][i];
                        v += sum;
                    }
                    expect[i] = v;
                }
            for (int b = b0; b <= b1; b++) free(P[b - b0]);
        }
        double diff = 0.0, scale = 1e-6;
        for (size_t i = 0; i < MN; i++) {
            const double e = isnan(got[i]) ? INFINITY : fabs(got[i] - ref[i]);
            if (e > diff) diff = e;
            if (fabs(ref[i]) > scale) scale = fabs(ref[i]);
        }
        const double err = diff / scale;
        const int same = memcmp(got, again, MN * 4) == 0, bits = !exact || memcmp(got, expect, MN * 4) == 0;
        char how[160] = "";
        if (exact)
            snprintf(how, sizeof how, "; bits against the walkers' parts computed apart on slices of K, %d added in "
                     "walker order after the first: %s", parts_summed, !slices_ok ? "a slice did not run" : bits ? "equal" : "DIFFER");
        check(&t->checks, r[0] == (int)impl && r[1] == (int)impl && err <= TOL_FP32 && same && bits && slices_ok, name,
              "%s: %d tile%s, %d whole, %d tile%s %d k-blocks over %d walkers of %lld%s; max rel err %.2e (tol %.0e), "
              "two runs %s%s",
              shape, tiles, tiles == 1 ? "" : "s", dp, left, left == 1 ? "'s" : "s'", left * nk, W, L, r[0] == (int)impl ? "" : " (tc_gemm_streamk refused)", err,
              TOL_FP32, same ? "bitwise equal" : "differ", how);
        free(expect);
    }
    dev_free(&t->gpu, gA, (size_t)M * K * 2);
    dev_free(&t->gpu, gB, (size_t)K * N * 2);
    if (gbias) dev_free(&t->gpu, gbias, (size_t)N * 2);
    dev_free(&t->gpu, gD, MN * 4);
    dev_free(&t->gpu, gwork, WORK_FLOATS * 4);
    free(A); free(B); free(bias); free(d0); free(got); free(again); free(whole); free(ref);
}

/* ---------------------------------------------------------------------------
 * The GELU-backward epilogue (tc_gemm_gelu_back): fcproj's input gradient
 * D [M][N] = gelu'(pre) * (A B), A [M][K] k-major (dout), B [K][N] (w), pre
 * [M][N] bf16 uniform in [-4, 4) (GELU's curved part and its tails). The
 * specification is the two passes it replaces: the same implementation's
 * plain product into a zeroed bf16 D (tc_gemm, accumulate), then GELU's
 * backward into a zeroed buffer, here on the host in float from the
 * product's bf16: bf16(0 + gelu'(pre) * prod), gelu' kernels.cu's
 * expression (gelu.cuh) uncontracted, as the emulation's host compiler
 * builds it. Under the emulation the device's tanhf is this host's, so the
 * fused output must be those bits exactly; on a GPU (CUDA's tanhf, within
 * 2 ulp, and nvcc's contractions) within 1e-2 of the largest value, the
 * bits there being test_kernels' check (the fused op against the two ops
 * on the GPU). Written output starts as NaN; the implementation that runs
 * must be the one the plain product ran (TC_AUTO's choice unchanged). odd:
 * D and pre one element past an allocation's start (no pair or 16-byte
 * piece aligned: the scalar epilogue on every kernel). */

/* The fused products' bar: the bits under the emulation (the device's
 * tanhf is this host's), bf16's tolerance on a GPU. */
#ifdef GEMM_EMU
#define GELU_BITS 1
#else
#define GELU_BITS 0
#endif

/* A fused product's line where the plain one (product p) was refused: a
 * SKIP when the fused one returned -1 too (r), wrote nothing (untouched)
 * and the refusal is expected here, else a FAIL. */
static void gelu_refused(Test *t, const char *name, const char *shape, TcImpl impl, const Product *p, int M, int N,
                         int K, int r, int untouched) {
    int expected;
    const char *why = refusal(t, impl, p, M, N, K, &expected);
    char line[320];
    snprintf(line, sizeof line, "%s: returned %d (the plain product -1: %s)%s", shape, r, why,
             untouched ? "" : ", but wrote an output");
    if (r == -1 && untouched && expected) check_skip(&t->checks, name, line);
    else check(&t->checks, 0, name, "%s", line);
}

/* The plain product for a fused one's specification: D (MN bf16) set to
 * start, tc_gemm with impl (A k-major; B k-major or not; bias), D read back
 * into host; returns tc_gemm's answer. */
static int gelu_plain(Test *t, TcImpl impl, void *gD, const void *start, int accumulate, const void *gA, const void *gB,
                      int b_kmajor, const void *gbias, int M, int N, int K, void *host) {
    const size_t bytes = (size_t)M * N * 2;
    dev_from_host(&t->gpu, gD, start, bytes);
    const int r = tc_gemm(impl, gD, 0, accumulate, gA, 1, gB, b_kmajor, gbias, M, N, K, NULL, 0, t->gpu.stream);
    dev_sync(&t->gpu);
    dev_to_host(&t->gpu, host, gD, bytes);
    return r;
}

__attribute__((optimize("fp-contract=off")))
static float host_gelu_grad(float x) {
    const float s = 0.7978845608028654f;
    float th = tanhf(s * (x + 0.044715f * x * x * x));
    float sech2 = 1.0f - th * th;
    return 0.5f * (1.0f + th) + 0.5f * x * sech2 * s * (1.0f + 3.0f * 0.044715f * x * x);
}
__attribute__((optimize("fp-contract=off")))
static uint16_t host_gelu_back(uint16_t pre, uint16_t prod) {
    return bf16_from_f32(0.0f + host_gelu_grad(bf16_to_f32(pre)) * bf16_to_f32(prod));
}

static void test_gelu_back(Test *t, int M, int N, int K, int odd) {
    char shape[96];
    snprintf(shape, sizeof shape, "M=%d N=%d K=%d%s", M, N, K, odd ? ", D and pre unaligned" : "");
    const size_t MN = (size_t)M * N, pad = odd ? 2 : 0;
    uint16_t *A = host_bf16(t, (size_t)M * K), *B = host_bf16(t, (size_t)K * N), *pre = xmalloc(MN * 2);
    for (size_t i = 0; i < MN; i++) pre[i] = bf16_from_f32(4.0f * urand(t));
    uint16_t *zero = xmalloc(MN * 2), *nan = xmalloc(MN * 2), *prod = xmalloc(MN * 2), *got = xmalloc(MN * 2),
             *spec = xmalloc(MN * 2);
    memset(zero, 0, MN * 2);
    memset(nan, 0xFF, MN * 2);
    void *gA = gpu_put(t, A, (size_t)M * K * 2), *gB = gpu_put(t, B, (size_t)K * N * 2);
    char *gpre_alloc = dev_alloc(&t->gpu, MN * 2 + pad), *gD_alloc = dev_alloc(&t->gpu, MN * 2 + pad);
    void *gpre = gpre_alloc + pad, *gD = gD_alloc + pad;
    dev_from_host(&t->gpu, gpre, pre, MN * 2);
    /* the bias sums' dbias [N] (its start db0) and work */
    float *db0 = xmalloc((size_t)N * 4), *db_fused = xmalloc((size_t)N * 4), *db_spec = xmalloc((size_t)N * 4),
          *wnan = xmalloc(WORK_FLOATS * 4);
    for (int i = 0; i < N; i++) db0[i] = urand(t);
    memset(wnan, 0xFF, WORK_FLOATS * 4);
    uint16_t *got_b = xmalloc(MN * 2);
    float *gdb = dev_alloc(&t->gpu, (size_t)N * 4), *gwork = dev_alloc(&t->gpu, WORK_FLOATS * 4);
    for (int ii = 0; ii < NIMPLS; ii++) {
        char name[160];
        snprintf(name, sizeof name, "gemm %s dinp+gelu'" GEMM_TAG_FMT, impls[ii].name, GEMM_TAG);
        const int plain = gelu_plain(t, impls[ii].impl, gD, zero, 1, gA, gB, 0, NULL, M, N, K, prod);
        dev_from_host(&t->gpu, gD, nan, MN * 2);
        const int r = tc_gemm_gelu_back(impls[ii].impl, gD, gA, 1, gB, 0, gpre, NULL, M, N, K, NULL, 0,
                                        t->gpu.stream);
        dev_sync(&t->gpu);
        dev_to_host(&t->gpu, got, gD, MN * 2);
        if (plain == -1) {
            gelu_refused(t, name, shape, impls[ii].impl, &products[1], M, N, K, r, memcmp(got, nan, MN * 2) == 0);
            continue;
        }
        size_t differ = 0;
        double diff = 0.0, scale = 1e-6;
        for (size_t i = 0; i < MN; i++) {
            spec[i] = host_gelu_back(pre[i], prod[i]);
            differ += got[i] != spec[i];
            const double g = bf16_to_f32(got[i]), e = isnan(g) ? INFINITY : fabs(g - bf16_to_f32(spec[i]));
            if (e > diff) diff = e;
            if (fabs(bf16_to_f32(spec[i])) > scale) scale = fabs(bf16_to_f32(spec[i]));
        }
        const int ok = GELU_BITS ? differ == 0 : diff / scale <= TOL_BF16;
        check(&t->checks, ok && r == plain, name,
              "%s: ran %s%s; %zu of %zu values differ in their bits from the plain product then gelu' "
              "(max rel err %.2e; %s)", shape, impl_name(r), r == plain ? "" : " (not what the plain product ran)",
              differ, MN, diff / scale, GELU_BITS ? "the bits must be equal" : "tol 1e-2 on a GPU");

        /* fc's bias gradient from the same product (dbias random, accumulated; the
         * Dev's scratch as work, NaN-filled): the bits of tc_bias_grad of the
         * stored D after it, and D's bits as without it */
        snprintf(name, sizeof name, "gemm %s dinp+gelu' bias sums" GEMM_TAG_FMT, impls[ii].name, GEMM_TAG);
        dev_from_host(&t->gpu, gD, nan, MN * 2);
        dev_from_host(&t->gpu, gdb, db0, (size_t)N * 4);
        dev_from_host(&t->gpu, gwork, wnan, WORK_FLOATS * 4);
        const int rb = tc_gemm_gelu_back(impls[ii].impl, gD, gA, 1, gB, 0, gpre, gdb, M, N, K, gwork, WORK_FLOATS,
                                         t->gpu.stream);
        dev_sync(&t->gpu);
        dev_to_host(&t->gpu, got_b, gD, MN * 2);
        dev_to_host(&t->gpu, db_fused, gdb, (size_t)N * 4);
        dev_from_host(&t->gpu, gdb, db0, (size_t)N * 4);
        tc_bias_grad(gdb, gD, 0, M, N, gwork, WORK_FLOATS, t->gpu.stream);
        dev_sync(&t->gpu);
        dev_to_host(&t->gpu, db_spec, gdb, (size_t)N * 4);
        size_t d_db = 0;
        for (int i = 0; i < N; i++) d_db += memcmp(&db_fused[i], &db_spec[i], 4) != 0;
        const int same_d = memcmp(got_b, got, MN * 2) == 0;
        check(&t->checks, rb == r && same_d && d_db == 0, name,
              "%s: ran %s%s; %zu of %d bias sums differ in their bits from tc_bias_grad of the stored D "
              "(must be 0); D %s", shape, impl_name(rb), rb == r ? "" : " (not what it ran without the sums)",
              d_db, N, same_d ? "as without the sums" : "DIFFERS from the product without the sums");
    }
    dev_free(&t->gpu, gA, (size_t)M * K * 2);
    dev_free(&t->gpu, gB, (size_t)K * N * 2);
    dev_free(&t->gpu, gpre_alloc, MN * 2 + pad);
    dev_free(&t->gpu, gD_alloc, MN * 2 + pad);
    dev_free(&t->gpu, gdb, (size_t)N * 4);
    dev_free(&t->gpu, gwork, WORK_FLOATS * 4);
    free(A); free(B); free(pre); free(zero); free(nan); free(prod); free(got); free(spec);
    free(got_b); free(db0); free(db_fused); free(db_spec); free(wnan);
}

/* The GELU-forward epilogue (tc_gemm_gelu): fc's product D [M][N] = A B +
 * bias (A [M][K], B [N][K] k-major, written) and G = GELU of D as stored.
 * The specification: the same implementation's plain forward (tc_gemm),
 * whose bits D must have, then GELU on the host in float from D's bf16
 * (kernels.cu's expression, gelu.cuh, uncontracted), rounded once: G's
 * bits under the emulation, within 1e-2 on a GPU (test_kernels holds the
 * device's bits there). Both outputs start as NaN; odd: D and G one
 * element past an allocation's start (the scalar epilogue). */
__attribute__((optimize("fp-contract=off")))
static uint16_t host_gelu(uint16_t x16) {
    const float s = 0.7978845608028654f, x = bf16_to_f32(x16);
    return bf16_from_f32(0.5f * x * (1.0f + tanhf(s * (x + 0.044715f * x * x * x))));
}

static void test_gelu_fwd(Test *t, int M, int N, int K, int odd) {
    char shape[96];
    snprintf(shape, sizeof shape, "M=%d N=%d K=%d%s", M, N, K, odd ? ", D and G unaligned" : "");
    const size_t MN = (size_t)M * N, pad = odd ? 2 : 0;
    uint16_t *A = host_bf16(t, (size_t)M * K), *B = host_bf16(t, (size_t)K * N), *bias = host_bf16(t, N);
    uint16_t *nan = xmalloc(MN * 2), *plain_d = xmalloc(MN * 2), *got_d = xmalloc(MN * 2), *got_g = xmalloc(MN * 2);
    memset(nan, 0xFF, MN * 2);
    void *gA = gpu_put(t, A, (size_t)M * K * 2), *gB = gpu_put(t, B, (size_t)K * N * 2), *gbias = gpu_put(t, bias, N * 2);
    char *gD_alloc = dev_alloc(&t->gpu, MN * 2 + pad), *gG_alloc = dev_alloc(&t->gpu, MN * 2 + pad);
    void *gD = gD_alloc + pad, *gG = gG_alloc + pad;
    for (int ii = 0; ii < NIMPLS; ii++) {
        char name[160];
        snprintf(name, sizeof name, "gemm %s fwd+gelu" GEMM_TAG_FMT, impls[ii].name, GEMM_TAG);
        const int plain = gelu_plain(t, impls[ii].impl, gD, nan, 0, gA, gB, 1, gbias, M, N, K, plain_d);
        dev_from_host(&t->gpu, gD, nan, MN * 2);
        dev_from_host(&t->gpu, gG, nan, MN * 2);
        const int r = tc_gemm_gelu(impls[ii].impl, gD, gG, gA, 1, gB, 1, gbias, M, N, K, t->gpu.stream);
        dev_sync(&t->gpu);
        dev_to_host(&t->gpu, got_d, gD, MN * 2);
        dev_to_host(&t->gpu, got_g, gG, MN * 2);
        if (plain == -1) {
            gelu_refused(t, name, shape, impls[ii].impl, &products[0], M, N, K, r,
                         memcmp(got_d, nan, MN * 2) == 0 && memcmp(got_g, nan, MN * 2) == 0);
            continue;
        }
        size_t d_differ = 0, g_differ = 0;
        double diff = 0.0, scale = 1e-6;
        for (size_t i = 0; i < MN; i++) {
            const uint16_t want = host_gelu(plain_d[i]);
            d_differ += got_d[i] != plain_d[i];
            g_differ += got_g[i] != want;
            const double g = bf16_to_f32(got_g[i]), e = isnan(g) ? INFINITY : fabs(g - bf16_to_f32(want));
            if (e > diff) diff = e;
            if (fabs(bf16_to_f32(want)) > scale) scale = fabs(bf16_to_f32(want));
        }
        const int ok = d_differ == 0 && (GELU_BITS ? g_differ == 0 : diff / scale <= TOL_BF16);
        check(&t->checks, ok && r == plain, name,
              "%s: ran %s%s; the pre-activation: %zu of %zu values differ from the plain product's bits; GELU's "
              "output: %zu differ from gelu of it (max rel err %.2e; %s)", shape, impl_name(r),
              r == plain ? "" : " (not what the plain product ran)", d_differ, MN, g_differ, diff / scale,
              GELU_BITS ? "the bits must be equal" : "the pre-activation's bits, GELU's tol 1e-2 on a GPU");
    }
    dev_free(&t->gpu, gA, (size_t)M * K * 2);
    dev_free(&t->gpu, gB, (size_t)K * N * 2);
    dev_free(&t->gpu, gbias, (size_t)N * 2);
    dev_free(&t->gpu, gD_alloc, MN * 2 + pad);
    dev_free(&t->gpu, gG_alloc, MN * 2 + pad);
    free(A); free(B); free(bias); free(nan); free(plain_d); free(got_d); free(got_g);
}

/* ---------------------------------------------------------------------------
 * Bias gradient: dbias[N] += column sums of dout [M][N], dout bf16 (the bf16
 * table's) or float32 (the fp32 table's), without a work buffer (a block a
 * 32 columns over all rows) and with one (chunks of 128 rows in parallel,
 * then the chunks in order by tc_partials_add, where N % 8 == 0), each twice
 * from the same start to check the result is the same bits (no atomics). */

static void test_bias_grad(Test *t, int M, int N, int fp32) {
    char shape[80], name[160];
    const size_t MN = (size_t)M * N, esz = fp32 ? 4 : 2;
    uint16_t *dout16 = fp32 ? NULL : host_bf16(t, MN);
    float *dout32 = fp32 ? xmalloc(MN * 4) : NULL;
    for (size_t i = 0; fp32 && i < MN; i++) dout32[i] = urand(t);
    float *db0 = xmalloc((size_t)N * 4), *got = xmalloc((size_t)N * 4), *again = xmalloc((size_t)N * 4);
    double *ref = xmalloc((size_t)N * sizeof(double));
    for (int n = 0; n < N; n++) ref[n] = db0[n] = urand(t);
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            size_t i = (size_t)m * N + n;
            ref[n] += fp32 ? dout32[i] : bf16_to_f32(dout16[i]);
        }

    size_t work_floats = (size_t)((M + 127) / 128) * N;
    void *gdout = gpu_put(t, fp32 ? (void *)dout32 : (void *)dout16, MN * esz);
    float *gdb = gpu_put(t, db0, (size_t)N * 4), *gwork = dev_alloc(&t->gpu, work_floats * 4);
    for (int split = 0; split < 2; split++) {
        float *w = split ? gwork : NULL;
        const char *how = split ? (N % 8 == 0 && M > 128 ? ", rows in chunks" : ", work unused") : "";
        snprintf(shape, sizeof shape, "%s M=%d N=%d%s", fp32 ? "fp32" : "bf16", M, N, how);
        dev_from_host(&t->gpu, gdb, db0, (size_t)N * 4);
        tc_bias_grad(gdb, gdout, fp32, M, N, w, work_floats, t->gpu.stream);
        dev_to_host(&t->gpu, got, gdb, (size_t)N * 4);
        dev_from_host(&t->gpu, gdb, db0, (size_t)N * 4);
        tc_bias_grad(gdb, gdout, fp32, M, N, w, work_floats, t->gpu.stream);
        dev_to_host(&t->gpu, again, gdb, (size_t)N * 4);

        double diff = 0.0, scale = 1e-6;
        for (int n = 0; n < N; n++) {
            double e = isnan(got[n]) ? INFINITY : fabs(got[n] - ref[n]);
            if (e > diff) diff = e;
            if (fabs(ref[n]) > scale) scale = fabs(ref[n]);
        }
        snprintf(name, sizeof name, "bias_grad" GEMM_TAG_FMT, GEMM_TAG);
        check(&t->checks, diff / scale <= TOL_FP32, name, "%s: max rel err %.2e over %d values (tol %.0e)",
              shape, diff / scale, N, TOL_FP32);
        snprintf(name, sizeof name, "bias_grad deterministic" GEMM_TAG_FMT, GEMM_TAG);
        check(&t->checks, memcmp(got, again, (size_t)N * 4) == 0, name, "%s: two runs %s", shape,
              memcmp(got, again, (size_t)N * 4) == 0 ? "bitwise equal" : "differ");
    }

    dev_free(&t->gpu, gdout, MN * esz);
    dev_free(&t->gpu, gdb, (size_t)N * 4);
    dev_free(&t->gpu, gwork, work_floats * 4);
    free(dout16); free(dout32); free(db0); free(got); free(again); free(ref);
}

#endif /* USE_CUDA */

/* Whether the part `name` of this test runs: TEST_GEMM_PARTS, a comma-separated list of
 * products (every product on four shapes, split-K, the tile orders), streamk-plan (a shape
 * whose plan takes stream-K: 20 s of the emulation's 30), streamk (forced), gelu and bias,
 * says which (unset or empty: all), so that test_gemm_mutants.sh runs for each planted bug
 * only the part that watches it. */
static int part_on(const char *name) {
    const char *s = getenv("TEST_GEMM_PARTS");
    size_t n = strlen(name);
    if (!s || !*s) return 1;
    for (const char *p = s; (p = strstr(p, name)) != NULL; p += n)
        if ((p == s || p[-1] == ',') && (p[n] == ',' || p[n] == '\0')) return 1;
    return 0;
}

int main(void) {
    Checks checks = {0, 0, 0};
#ifdef USE_CUDA
    Test t;
    memset(&t, 0, sizeof t);
    t.rng = 0x9E3779B97F4A7C15ULL;
    char err[256] = "";
    if (dev_gpu_count() == 0 || dev_open(&t.gpu, DEV_CUDA, 0, err, sizeof err) != 0) {
        const char *why = err[0] ? err : "no CUDA GPU visible; run on a GPU machine";
        for (size_t i = 0; i < sizeof groups / sizeof groups[0]; i++) check_skip(&checks, groups[i], why);
        return check_done(&checks);
    }
    if (cudaDeviceGetAttribute(&t.cc_major, cudaDevAttrComputeCapabilityMajor, t.gpu.gpu) != cudaSuccess)
        t.cc_major = 0;
    if (cudaDeviceGetAttribute(&t.sms, cudaDevAttrMultiProcessorCount, t.gpu.gpu) != cudaSuccess)
        t.sms = 0;

    static const int shapes[4][3] = {
        {37, 77, 45},      /* multiples of nothing: every tensor-core product refused */
        {37, 77, 48},      /* forward aligned on K: partial tiles, odd N, scalar epilogue */
        {328, 136, 72},    /* aligned, no dimension a tile multiple, 3 m-tiles */
#ifdef GEMM_EMU
        {256, 384, 288},   /* under emulation: 2 x 3 tiles, 9 k-tiles */
#else
        {1024, 3072, 768}, /* GPT-2 small's fc layer */
#endif
    };
    for (int s = 0; s < 4 && part_on("products"); s++)
        for (int p = 0; p < NPRODUCTS; p++)
            test_gemm(&t, &products[p], shapes[s][0], shapes[s][1], shapes[s][2], 0);
    /* Split-K, on weight gradients with few output tiles and a long K: an
     * awkward one, and (on a GPU) GPT-2 small's attention projection. */
    if (part_on("products")) {
        test_gemm(&t, &products[2], 128, 264, 1000, 1);
        test_gemm(&t, &products[2], 64, 136, 520, 2);
#ifndef GEMM_EMU
        test_gemm(&t, &products[2], 768, 768, 16384, 1);
#endif
    }
    /* Stream-K where the plan takes it (133 tiles of 128 x 128, 67 columns
     * of the cluster's: one wave and one tile; 16 k-blocks: the last tile's
     * over 16 walkers), then forced: one tile of
     * every kernel (M, N under a tile, K 9.6 k-blocks: walkers of 5, 4, 3,
     * 2 and 1 k-blocks; 1 walker is refused), and 3 m-tiles (the last
     * partial) of every kernel, tiles of the full waves whole, bands of 2
     * (the last one narrower) and m-fastest; the fp32 forward (bias, D
     * written) held to the reference. */
    if (part_on("streamk-plan")) test_gemm(&t, &products[2], 17024, 8, 1024, 3);
    for (int si = 0; si < 3 && part_on("streamk"); si++) {
        /* 328 x 136 is 6 tiles (ping-pong), 3 (cooperative), 4 (columns of the cluster's): the first
         * count leaves whole tiles, a full wave, before the last */
        static const int one_tile[6] = {1, 2, 3, 4, 7, 13};
        static const int three[3][5] = {{4, 5, 7, 9, 11}, {2, 4, 5, 7, 11}, {3, 5, 6, 7, 11}};
        for (int w = 0; w < 6; w++) test_streamk(&t, &products[2], 104, 72, 616, si, one_tile[w], 1);
        for (int w = 0; w < 5; w++) test_streamk(&t, &products[2], 328, 136, 1000, si, three[si][w], w % 2 ? 1 << 30 : 2);
        test_streamk(&t, &products[3], 328, 136, 1000, si, three[si][0], 2);
    }

    /* The GELU epilogues (M, N, K, D unaligned): backward, unaligned N (every
     * tensor-core kernel refuses, TC_AUTO falls back), partial tiles in M and
     * N (N % 8 == 0, not a multiple of 128), the emulation's fc shape /
     * GPT-2's fcproj dinp (N = 4C, K = C), the scalar epilogue (D, pre
     * unaligned); forward, the same kinds, K unaligned first, and fc fwd's
     * shape on a GPU (N 4C, K C). */
#ifdef GEMM_EMU
#define GEMM_FC 256, 384, 288
#else
#define GEMM_FC 1024, 3072, 768
#endif
    static const int gelu_back[5][4] = {{37, 77, 48, 0}, {328, 136, 72, 0}, {130, 40, 64, 0}, {GEMM_FC, 0},
                                        {328, 136, 72, 1}};
    static const int gelu_fwd[5][4] = {{37, 77, 45, 0}, {37, 77, 48, 0}, {328, 136, 72, 0}, {GEMM_FC, 0},
                                       {328, 136, 72, 1}};
    for (int i = 0; i < 5 && part_on("gelu"); i++)
        test_gelu_back(&t, gelu_back[i][0], gelu_back[i][1], gelu_back[i][2], gelu_back[i][3]);
    for (int i = 0; i < 5 && part_on("gelu"); i++)
        test_gelu_fwd(&t, gelu_fwd[i][0], gelu_fwd[i][1], gelu_fwd[i][2], gelu_fwd[i][3]);

    for (int fp32 = 0; fp32 < 2 && part_on("bias"); fp32++) {
        test_bias_grad(&t, 37, 77, fp32);
        test_bias_grad(&t, 1, 5, fp32);
        test_bias_grad(&t, 1024, 3072, fp32);
        test_bias_grad(&t, 8192, 768, fp32);
        test_bias_grad(&t, 200, 64, fp32);  /* 2 chunks, the last part-filled */
    }

    char leaks[96];
    snprintf(leaks, sizeof leaks, "gemm no leaks" GEMM_TAG_FMT, GEMM_TAG);
    check(&t.checks, t.gpu.bytes_live == 0, leaks, "%zu device bytes still live", t.gpu.bytes_live);
    dev_close(&t.gpu);
    checks = t.checks;
#else
    for (size_t i = 0; i < sizeof groups / sizeof groups[0]; i++)
        check_skip(&checks, groups[i], "this build has no CUDA (nvcc was not found); run on a GPU machine");
#endif
    return check_done(&checks);
}
