/* test/test_kernels.c: every CUDA kernel of kernels.cu against the plain-C
 * reference of ops.c.
 *
 * Each op runs twice on the same random inputs, once through cpu_ops on host
 * buffers and once through the CUDA Dev's table on device buffers, and the
 * outputs are compared as max |gpu - cpu| / max |cpu| (the figure printed).
 * Sizes are multiples of nothing (N=37, C=45, OC=77, T=37...), so every
 * kernel's edge handling is exercised, and each op has one realistic GPT-2
 * shape besides. Pure outputs start as NaN on the GPU, so an element a kernel
 * forgets to write shows up; accumulated outputs start from the same random
 * values on both sides, so a kernel that overwrites instead of adding shows
 * up too. The embedding's backward runs twice: without a plan (atomics) and
 * through dev_embed_plan's (whose grouping is checked first), the latter
 * twice from the same start for the same bits.
 *
 * Without a CUDA build or a visible GPU every group prints one SKIP line.
 *
 * Built with -DKERNELS_EMU and linked against test/emu/ (test/test_kernels_emu,
 * run by test/test_emu.sh), the same checks run kernels.cu (and through the
 * bf16 table attention.cu and matmul.cu) under the CPU emulation of
 * test/emu/emu.h, an sm_80 device with 108 SMs (EMU_ARCH=sm_90a: an H100,
 * whose bf16 matmuls take the wgmma kernel); every name then ends in
 * "(cpu emulation, ...)" with the emulation's settings. The shapes that
 * cost seconds there are replaced by smaller ones taking the same code path
 * (GPU_OR_EMU below; KERNELS_EMU_FULL=1 runs the GPU's, about 30 s on 2 cores).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include "tensor.h"
#include "ops.h"
#include "check.h"

#ifdef KERNELS_EMU
const char *emu_describe(void); /* test/emu/emu_rt.cpp: "cpu emulation, cp.async early, ..." */
#define TAG_FMT " (%s)"
#define TAG emu_describe()
#else
#define TAG_FMT "%s"
#define TAG ""
#endif

/* A check's name as printed: under the CPU emulation it ends in the
 * emulation's settings, so an emulated pass is never read as a GPU's.
 * (One static buffer: each name is used before the next is made.) */
static const char *tagged(const char *name) {
    static char buf[256];
    snprintf(buf, sizeof buf, "%s" TAG_FMT, name, TAG);
    return buf;
}

/* float32 against float32: the two sides differ only in summation order.
 * Errors are relative to the largest reference value, so even the longest
 * dot products here (K = 2304) stay near 1e-6, far inside this bound. */
#define TOL 1e-4

typedef struct Test {
    Dev cpu, gpu;
    Checks checks;
    unsigned long long rng;  /* xorshift64* state */
} Test;

/* ---------------------------------------------------------------------------
 * Host and device buffers. */

static float urand(Test *r) { return check_urand(&r->rng); }  /* uniform in [-1, 1) */

#define xmalloc check_xmalloc

static float *host_rand(Test *t, size_t n, float scale) {
    float *x = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = scale * urand(t);
    return x;
}

static float *host_nan(size_t n) {
    float *x = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = NAN;
    return x;
}

static float *host_copy(const float *src, size_t n) {
    float *x = xmalloc(n * sizeof(float));
    memcpy(x, src, n * sizeof(float));
    return x;
}

static int *host_tokens(Test *t, size_t n, int range) {
    int *x = xmalloc(n * sizeof(int));
    for (size_t i = 0; i < n; i++) {
        int v = (int)((urand(t) + 1.0f) * 0.5f * range);
        x[i] = v < range ? v : range - 1;
    }
    return x;
}

/* A new device buffer holding bytes of src. */
static void *gpu_put(Test *t, const void *src, size_t bytes) {
    void *p = dev_alloc(&t->gpu, bytes);
    dev_from_host(&t->gpu, p, src, bytes);
    return p;
}

/* A new host copy of n floats of device buffer src. */
static float *gpu_get(Test *t, const float *src, size_t n) {
    float *x = xmalloc(n * sizeof(float));
    dev_to_host(&t->gpu, x, src, n * sizeof(float));
    return x;
}

static void gpu_drop(Test *t, void *p, size_t bytes) { dev_free(&t->gpu, p, bytes); }

/* max |got - want| / max |want|; infinite if got holds a NaN the reference
 * does not (an element the kernel never wrote). */
static double max_rel_err(const float *got, const float *want, size_t n) {
    double diff = 0.0, ref = 1e-6;
    for (size_t i = 0; i < n; i++) {
        if (!!isnan(got[i]) != !!isnan(want[i])) return INFINITY;
        double e = fabs((double)got[i] - want[i]);
        if (e > diff) diff = e;
        if (fabs(want[i]) > ref) ref = fabs(want[i]);
    }
    return diff / ref;
}

/* One check line: op and what was compared, the shape, the figure. */
static void compare(Test *t, const char *op, const char *what, const char *shape,
                    const float *got, const float *want, size_t n) {
    char name[128];
    snprintf(name, sizeof name, "%s %s" TAG_FMT, op, what, TAG);
    double err = max_rel_err(got, want, n);
    check(&t->checks, err <= TOL, name, "%s: max rel err %.2e over %zu values (tol %.0e)", shape,
          err, n, TOL);
}

/* Downloads n floats of gpu_buf and compares them with the host reference. */
static void compare_gpu(Test *t, const char *op, const char *what, const char *shape,
                        const float *gpu_buf, const float *want, size_t n) {
    float *got = gpu_get(t, gpu_buf, n);
    compare(t, op, what, shape, got, want, n);
    free(got);
}

/* ---------------------------------------------------------------------------
 * One test per op group, one call per shape. */

/* sliced: about a third of the tokens are -1 (not in this rank's slice of
 * the vocabulary: no wte row read, no dwte row updated); no_wpe: wpe and
 * dwpe are NULL (no position term), as on a vocabulary-parallel rank. */
static void test_encoder(Test *t, int B, int T, int C, int Vp, int sliced, int no_wpe) {
    char shape[128];
    snprintf(shape, sizeof shape, "B=%d T=%d C=%d Vp=%d%s%s", B, T, C, Vp,
             sliced ? " (tokens -1)" : "", no_wpe ? " (no wpe)" : "");
    size_t BTC = (size_t)B * T * C, VC = (size_t)Vp * C, TC = (size_t)T * C;
    int *tokens = host_tokens(t, (size_t)B * T, Vp);
    if (sliced)
        for (size_t i = 0; i < (size_t)B * T; i++) if (urand(t) < -0.33f) tokens[i] = -1;
    float *wte = host_rand(t, VC, 1.0f), *wpe = no_wpe ? NULL : host_rand(t, TC, 1.0f);
    float *out = host_nan(BTC);
    int *g_tokens = gpu_put(t, tokens, (size_t)B * T * sizeof(int));
    float *g_wte = gpu_put(t, wte, VC * 4), *g_wpe = wpe ? gpu_put(t, wpe, TC * 4) : NULL;
    float *g_out = gpu_put(t, out, BTC * 4);
    cpu_ops.encoder_forward(&t->cpu, out, tokens, wte, wpe, B, T, C);
    t->gpu.ops->encoder_forward(&t->gpu, g_out, g_tokens, g_wte, g_wpe, B, T, C);
    compare_gpu(t, "encoder_forward", "out", shape, g_out, out, BTC);

    /* backward: wte and wpe become the accumulated gradients */
    float *dout = host_rand(t, BTC, 1.0f);
    float *g_dout = gpu_put(t, dout, BTC * 4);
    float *wte0 = gpu_get(t, g_wte, VC), *wpe0 = wpe ? gpu_get(t, g_wpe, TC) : NULL;
    cpu_ops.encoder_backward(&t->cpu, wte, wpe, dout, tokens, NULL, -1, B, T, C);
    t->gpu.ops->encoder_backward(&t->gpu, g_wte, g_wpe, g_dout, g_tokens, NULL, -1, B, T, C);
    compare_gpu(t, "encoder_backward", "dwte", shape, g_wte, wte, VC);
    if (wpe) compare_gpu(t, "encoder_backward", "dwpe", shape, g_wpe, wpe, TC);

    /* Through dev_embed_plan (as training on a GPU runs it): the plan itself
     * (every position with a token once, grouped by ascending token, each
     * group in position order), then dwte from the same start twice, the
     * same bits both times. */
    const int BT = B * T;
    int *plan = xmalloc((2 * (size_t)BT + 1) * sizeof(int));
    const int runs = dev_embed_plan(tokens, BT, plan);
    const int *pos = plan + runs + 1;
    int plan_ok = plan[0] == 0, m = 0, last = -1;
    for (int i = 0; i < BT; i++) m += tokens[i] >= 0;
    plan_ok = plan_ok && plan[runs] == m;
    for (int r = 0; r < runs && plan_ok; r++) {
        const int s = plan[r], e = plan[r + 1], tok = tokens[pos[s]];
        plan_ok = s < e && tok > last;
        last = tok;
        for (int j = s; j < e && plan_ok; j++)
            plan_ok = tokens[pos[j]] == tok && (j == s || pos[j] > pos[j - 1]);
    }
    char name[128];
    snprintf(name, sizeof name, "encoder_backward plan" TAG_FMT, TAG);
    check(&t->checks, plan_ok, name, "%s: %d groups of %d positions %s", shape, runs, m,
          plan_ok ? "by ascending token, each in position order" : "wrong");
    int *g_plan = gpu_put(t, plan, ((size_t)runs + 1 + m) * sizeof(int));
    float *got[2];
    for (int k = 0; k < 2; k++) {
        dev_from_host(&t->gpu, g_wte, wte0, VC * 4);
        t->gpu.ops->encoder_backward(&t->gpu, g_wte, NULL, g_dout, g_tokens, g_plan, runs, B, T, C);
        got[k] = gpu_get(t, g_wte, VC);
    }
    compare(t, "encoder_backward planned", "dwte", shape, got[0], wte, VC);
    snprintf(name, sizeof name, "encoder_backward planned deterministic" TAG_FMT, TAG);
    check(&t->checks, memcmp(got[0], got[1], VC * 4) == 0, name, "%s: two runs %s", shape,
          memcmp(got[0], got[1], VC * 4) == 0 ? "bitwise equal" : "differ");
    gpu_drop(t, g_plan, ((size_t)runs + 1 + m) * sizeof(int));
    free(plan); free(got[0]); free(got[1]); free(wte0); free(wpe0);

    gpu_drop(t, g_tokens, (size_t)B * T * sizeof(int));
    gpu_drop(t, g_wte, VC * 4); gpu_drop(t, g_wpe, TC * 4);
    gpu_drop(t, g_out, BTC * 4); gpu_drop(t, g_dout, BTC * 4);
    free(tokens); free(wte); free(wpe); free(out); free(dout);
}

static void test_layernorm(Test *t, int N, int C) {
    char shape[64];
    snprintf(shape, sizeof shape, "N=%d C=%d", N, C);
    size_t NC = (size_t)N * C;
    float *inp = host_rand(t, NC, 2.0f);
    for (size_t i = 0; i < NC; i++) inp[i] += 0.3f;  /* a row mean away from 0 */
    float *w = host_rand(t, C, 1.0f), *b = host_rand(t, C, 1.0f);
    float *out = host_nan(NC), *mean = host_nan(N), *rstd = host_nan(N);
    float *g_inp = gpu_put(t, inp, NC * 4), *g_w = gpu_put(t, w, C * 4), *g_b = gpu_put(t, b, C * 4);
    float *g_out = gpu_put(t, out, NC * 4), *g_mean = gpu_put(t, mean, N * 4), *g_rstd = gpu_put(t, rstd, N * 4);
    cpu_ops.layernorm_forward(&t->cpu, out, mean, rstd, inp, w, b, N, C);
    t->gpu.ops->layernorm_forward(&t->gpu, g_out, g_mean, g_rstd, g_inp, g_w, g_b, N, C);
    compare_gpu(t, "layernorm_forward", "out", shape, g_out, out, NC);
    compare_gpu(t, "layernorm_forward", "mean", shape, g_mean, mean, N);
    compare_gpu(t, "layernorm_forward", "rstd", shape, g_rstd, rstd, N);

    /* backward from the same saved statistics on both sides */
    dev_from_host(&t->gpu, g_mean, mean, N * 4);
    dev_from_host(&t->gpu, g_rstd, rstd, N * 4);
    float *dout = host_rand(t, NC, 1.0f);
    float *dinp = host_rand(t, NC, 0.5f), *dw = host_rand(t, C, 0.5f), *db = host_rand(t, C, 0.5f);
    float *g_dout = gpu_put(t, dout, NC * 4), *g_dinp = gpu_put(t, dinp, NC * 4);
    float *g_dw = gpu_put(t, dw, C * 4), *g_db = gpu_put(t, db, C * 4);
    cpu_ops.layernorm_backward(&t->cpu, dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    t->gpu.ops->layernorm_backward(&t->gpu, g_dinp, g_dw, g_db, g_dout, g_inp, g_w, g_mean, g_rstd, N, C);
    compare_gpu(t, "layernorm_backward", "dinp", shape, g_dinp, dinp, NC);
    compare_gpu(t, "layernorm_backward", "dw", shape, g_dw, dw, C);
    compare_gpu(t, "layernorm_backward", "db", shape, g_db, db, C);

    gpu_drop(t, g_inp, NC * 4); gpu_drop(t, g_w, C * 4); gpu_drop(t, g_b, C * 4);
    gpu_drop(t, g_out, NC * 4); gpu_drop(t, g_mean, N * 4); gpu_drop(t, g_rstd, N * 4);
    gpu_drop(t, g_dout, NC * 4); gpu_drop(t, g_dinp, NC * 4); gpu_drop(t, g_dw, C * 4); gpu_drop(t, g_db, C * 4);
    free(inp); free(w); free(b); free(out); free(mean); free(rstd);
    free(dout); free(dinp); free(dw); free(db);
}

/* with_optional: bias in the forward, dinp and dbias in the backward; without
 * them the NULL paths run. */
static void test_matmul(Test *t, int N, int C, int OC, int with_optional) {
    char shape[96];
    snprintf(shape, sizeof shape, "N=%d C=%d OC=%d%s", N, C, OC, with_optional ? "" : " (no bias, no dinp)");
    size_t NC = (size_t)N * C, NO = (size_t)N * OC, OCC = (size_t)OC * C;
    float *inp = host_rand(t, NC, 1.0f), *w = host_rand(t, OCC, 1.0f);
    float *bias = with_optional ? host_rand(t, OC, 1.0f) : NULL;
    float *out = host_nan(NO);
    float *g_inp = gpu_put(t, inp, NC * 4), *g_w = gpu_put(t, w, OCC * 4), *g_out = gpu_put(t, out, NO * 4);
    float *g_bias = bias ? gpu_put(t, bias, OC * 4) : NULL;
    cpu_ops.matmul_forward(&t->cpu, out, inp, w, bias, N, C, OC);
    t->gpu.ops->matmul_forward(&t->gpu, g_out, g_inp, g_w, g_bias, N, C, OC);
    compare_gpu(t, "matmul_forward", "out", shape, g_out, out, NO);
    /* fc's product and GELU in one op */
    float *gout = host_nan(NO), *g_gout = gpu_put(t, gout, NO * 4);
    cpu_ops.matmul_forward_gelu(&t->cpu, out, gout, inp, w, bias, N, C, OC);
    t->gpu.ops->matmul_forward_gelu(&t->gpu, g_out, g_gout, g_inp, g_w, g_bias, N, C, OC);
    compare_gpu(t, "matmul_forward_gelu", "out", shape, g_out, out, NO);
    compare_gpu(t, "matmul_forward_gelu", "gout", shape, g_gout, gout, NO);
    gpu_drop(t, g_gout, NO * 4);
    free(gout);

    float *dout = host_rand(t, NO, 1.0f), *dw = host_rand(t, OCC, 0.5f);
    float *dinp = with_optional ? host_rand(t, NC, 0.5f) : NULL;
    float *dbias = with_optional ? host_rand(t, OC, 0.5f) : NULL;
    float *g_dout = gpu_put(t, dout, NO * 4), *g_dw = gpu_put(t, dw, OCC * 4);
    float *g_dinp = dinp ? gpu_put(t, dinp, NC * 4) : NULL;
    float *g_dbias = dbias ? gpu_put(t, dbias, OC * 4) : NULL;
    cpu_ops.matmul_backward(&t->cpu, dinp, dw, dbias, dout, inp, w, N, C, OC);
    t->gpu.ops->matmul_backward(&t->gpu, g_dinp, g_dw, g_dbias, g_dout, g_inp, g_w, N, C, OC);
    if (dinp) compare_gpu(t, "matmul_backward", "dinp", shape, g_dinp, dinp, NC);
    compare_gpu(t, "matmul_backward", "dw", shape, g_dw, dw, OCC);
    if (dbias) compare_gpu(t, "matmul_backward", "dbias", shape, g_dbias, dbias, OC);
    /* fcproj's input gradient through GELU's backward (fch [N,C] GELU's input; dfch written) */
    float *fch = host_rand(t, NC, 4.0f), *dfch = host_nan(NC), *tmp = host_nan(NC);
    float *g_fch = gpu_put(t, fch, NC * 4), *g_dfch = gpu_put(t, dfch, NC * 4), *g_tmp = gpu_put(t, tmp, NC * 4);
    /* with_optional: fc's bias gradient too, accumulated into random values */
    float *fdb = with_optional ? host_rand(t, C, 0.5f) : NULL, *g_fdb = fdb ? gpu_put(t, fdb, C * 4) : NULL;
    cpu_ops.matmul_backward_gelu(&t->cpu, dfch, fdb, tmp, dout, w, fch, N, C, OC);
    t->gpu.ops->matmul_backward_gelu(&t->gpu, g_dfch, g_fdb, g_tmp, g_dout, g_w, g_fch, N, C, OC);
    compare_gpu(t, "matmul_backward_gelu", "dfch", shape, g_dfch, dfch, NC);
    if (fdb) compare_gpu(t, "matmul_backward_gelu", "dbias", shape, g_fdb, fdb, C);
    gpu_drop(t, g_fch, NC * 4); gpu_drop(t, g_dfch, NC * 4); gpu_drop(t, g_tmp, NC * 4);
    if (fdb) gpu_drop(t, g_fdb, C * 4);
    free(fch); free(dfch); free(tmp); free(fdb);

    gpu_drop(t, g_inp, NC * 4); gpu_drop(t, g_w, OCC * 4); gpu_drop(t, g_out, NO * 4);
    gpu_drop(t, g_bias, OC * 4); gpu_drop(t, g_dout, NO * 4); gpu_drop(t, g_dw, OCC * 4);
    gpu_drop(t, g_dinp, NC * 4); gpu_drop(t, g_dbias, OC * 4);
    free(inp); free(w); free(bias); free(out); free(dout); free(dw); free(dinp); free(dbias);
}

/* The columns [offset, offset+width) of each of rows rows of stride floats. */
static float *columns(const float *x, size_t rows, int stride, int offset, int width) {
    float *y = xmalloc(rows * width * sizeof(float));
    for (size_t r = 0; r < rows; r++) memcpy(y + r * width, x + r * stride + offset, width * sizeof(float));
    return y;
}

static void test_attention(Test *t, int B, int T, int C, int NH) {
    char shape[96];
    snprintf(shape, sizeof shape, "B=%d T=%d C=%d NH=%d (hs=%d)", B, T, C, NH, C / NH);
    size_t BT = (size_t)B * T, QKV = BT * 3 * C, BTC = BT * C, ATT = (size_t)B * NH * T * T;
    float *qkv = host_rand(t, QKV, 1.5f);
    float *out = host_nan(BTC), *att = host_nan(ATT);
    float *g_qkv = gpu_put(t, qkv, QKV * 4), *g_out = gpu_put(t, out, BTC * 4), *g_att = gpu_put(t, att, ATT * 4);
    cpu_ops.attention_forward(&t->cpu, out, att, qkv, B, T, C, NH);
    t->gpu.ops->attention_forward(&t->gpu, g_out, g_att, g_qkv, B, T, C, NH);
    compare_gpu(t, "attention_forward", "out", shape, g_out, out, BTC);
    compare_gpu(t, "attention_forward", "att", shape, g_att, att, ATT);  /* zeros above the diagonal too */

    /* backward from the reference's att on both sides; datt is scratch */
    dev_from_host(&t->gpu, g_att, att, ATT * 4);
    float *dout = host_rand(t, BTC, 1.0f), *dqkv = host_nan(QKV);   /* written: NaN before */
    float *datt = host_nan(ATT);
    float *g_dout = gpu_put(t, dout, BTC * 4), *g_dqkv = gpu_put(t, dqkv, QKV * 4);
    float *g_datt = gpu_put(t, datt, ATT * 4);
    cpu_ops.attention_backward(&t->cpu, dqkv, datt, dout, qkv, out, att, B, T, C, NH);
    t->gpu.ops->attention_backward(&t->gpu, g_dqkv, g_datt, g_dout, g_qkv, g_out, g_att, B, T, C, NH);
    /* dq, dk and dv apart: each relative to its own size */
    float *got = gpu_get(t, g_dqkv, QKV);
    const char *part[3] = {"dq", "dk", "dv"};
    for (int p = 0; p < 3; p++) {
        float *g = columns(got, BT, 3 * C, p * C, C), *w = columns(dqkv, BT, 3 * C, p * C, C);
        compare(t, "attention_backward", part[p], shape, g, w, BTC);
        free(g); free(w);
    }
    free(got);

    gpu_drop(t, g_qkv, QKV * 4); gpu_drop(t, g_out, BTC * 4); gpu_drop(t, g_att, ATT * 4);
    gpu_drop(t, g_dout, BTC * 4); gpu_drop(t, g_dqkv, QKV * 4); gpu_drop(t, g_datt, ATT * 4);
    free(qkv); free(out); free(att); free(dout); free(dqkv); free(datt);
}

/* gelu forward and backward, add (also in place), accumulate. */
static void test_elementwise(Test *t, size_t n) {
    char shape[64];
    snprintf(shape, sizeof shape, "n=%zu", n);
    float *x = host_rand(t, n, 4.0f), *y = host_rand(t, n, 1.0f), *out = host_nan(n);
    float *g_x = gpu_put(t, x, n * 4), *g_y = gpu_put(t, y, n * 4), *g_out = gpu_put(t, out, n * 4);
    cpu_ops.gelu_forward(&t->cpu, out, x, n);
    t->gpu.ops->gelu_forward(&t->gpu, g_out, g_x, n);
    compare_gpu(t, "gelu_forward", "out", shape, g_out, out, n);

    float *dinp = host_rand(t, n, 0.5f);  /* dinp += gelu'(x) * y */
    float *g_dinp = gpu_put(t, dinp, n * 4);
    cpu_ops.gelu_backward(&t->cpu, dinp, x, y, n);
    t->gpu.ops->gelu_backward(&t->gpu, g_dinp, g_x, g_y, n);
    compare_gpu(t, "gelu_backward", "dinp", shape, g_dinp, dinp, n);

    for (size_t i = 0; i < n; i++) out[i] = NAN;
    dev_from_host(&t->gpu, g_out, out, n * 4);
    cpu_ops.add(&t->cpu, out, x, y, n);
    t->gpu.ops->add(&t->gpu, g_out, g_x, g_y, n);
    compare_gpu(t, "add", "out", shape, g_out, out, n);
    /* in place, out = out + y, as the residual stream does */
    cpu_ops.add(&t->cpu, out, out, y, n);
    t->gpu.ops->add(&t->gpu, g_out, g_out, g_y, n);
    compare_gpu(t, "add", "out aliasing a", shape, g_out, out, n);

    cpu_ops.accumulate(&t->cpu, dinp, x, n);
    t->gpu.ops->accumulate(&t->gpu, g_dinp, g_x, n);
    compare_gpu(t, "accumulate", "dst", shape, g_dinp, dinp, n);

    gpu_drop(t, g_x, n * 4); gpu_drop(t, g_y, n * 4); gpu_drop(t, g_out, n * 4); gpu_drop(t, g_dinp, n * 4);
    free(x); free(y); free(out); free(dinp);
}

static void test_crossentropy(Test *t, int N, int V, int Vp) {
    char shape[64];
    snprintf(shape, sizeof shape, "N=%d V=%d Vp=%d", N, V, Vp);
    size_t NV = (size_t)N * Vp;
    float *logits = host_rand(t, NV, 5.0f);  /* padded columns random: the kernel must zero them */
    int *targets = host_tokens(t, N, V);
    float *losses = host_nan(N);
    float *g_logits = gpu_put(t, logits, NV * 4), *g_losses = gpu_put(t, losses, N * 4);
    int *g_targets = gpu_put(t, targets, N * sizeof(int));

    /* dloss = 0: losses only, logits untouched */
    float *orig = host_copy(logits, NV);
    cpu_ops.crossentropy(&t->cpu, losses, logits, targets, N, V, Vp, 0.0f);
    t->gpu.ops->crossentropy(&t->gpu, g_losses, g_logits, g_targets, N, V, Vp, 0.0f);
    compare_gpu(t, "crossentropy", "losses (dloss 0)", shape, g_losses, losses, N);
    compare_gpu(t, "crossentropy", "logits untouched (dloss 0)", shape, g_logits, orig, NV);

    /* dloss = 1/N: the row becomes its gradient */
    float dloss = 1.0f / N;
    for (int i = 0; i < N; i++) losses[i] = NAN;
    dev_from_host(&t->gpu, g_losses, losses, N * 4);
    cpu_ops.crossentropy(&t->cpu, losses, logits, targets, N, V, Vp, dloss);
    t->gpu.ops->crossentropy(&t->gpu, g_losses, g_logits, g_targets, N, V, Vp, dloss);
    compare_gpu(t, "crossentropy", "losses", shape, g_losses, losses, N);
    compare_gpu(t, "crossentropy", "dlogits", shape, g_logits, logits, NV);

    gpu_drop(t, g_logits, NV * 4); gpu_drop(t, g_losses, N * 4); gpu_drop(t, g_targets, N * sizeof(int));
    free(logits); free(targets); free(losses); free(orig);
}

/* The vocabulary-parallel cross-entropy as R ranks run it: the vocabulary
 * of V ids is cut into R slices of Vl columns, rank r holding ids
 * [r*Vl, r*Vl + Vl) of which nvalid = clamp(V - r*Vl, 0, Vl) are real, so
 * later ranks have v0 > 0, the last real one nvalid < Vl, and ranks past the
 * end nvalid = 0 (R*Vl well above V). Each op is checked alone: combine
 * and grad take the reference's stats and lse, not the GPU's. shift moves
 * every logit: at -200 an exp(max - 0) of an empty rank's max 0 would be 0
 * in float, so a combine that does not skip empty ranks returns -inf. */
static void test_xent(Test *t, int N, int V, int R, int Vl, float shift) {
    char shape[128];
    snprintf(shape, sizeof shape, "N=%d V=%d R=%d Vl=%d shift=%g", N, V, R, Vl, shift);
    size_t NV = (size_t)N * Vl, N3 = (size_t)N * 3;
    int *targets = host_tokens(t, N, V);
    int *g_targets = gpu_put(t, targets, N * sizeof(int));
    float *logits[R], *g_logits[R];
    float *gathered = host_nan(R * N3);  /* the reference's stats of every rank, [R,N,3] */
    for (int r = 0; r < R; r++) {
        int v0 = r * Vl, nvalid = V - v0 < 0 ? 0 : V - v0 < Vl ? V - v0 : Vl;
        char rshape[192];
        snprintf(rshape, sizeof rshape, "%s rank %d v0=%d nvalid=%d", shape, r, v0, nvalid);
        logits[r] = host_rand(t, NV, 5.0f);  /* padding random too: stats must not read it */
        for (size_t i = 0; i < NV; i++) logits[r][i] += shift;
        g_logits[r] = gpu_put(t, logits[r], NV * 4);
        float *stats = gathered + r * N3, *poison = host_nan(N3);
        float *g_stats = gpu_put(t, poison, N3 * 4);
        cpu_ops.xent_stats(&t->cpu, stats, logits[r], targets, N, v0, nvalid, Vl);
        t->gpu.ops->xent_stats(&t->gpu, g_stats, g_logits[r], g_targets, N, v0, nvalid, Vl);
        compare_gpu(t, "xent_stats", "stats", rshape, g_stats, stats, N3);
        gpu_drop(t, g_stats, N3 * 4);
        free(poison);
    }

    float *losses = host_nan(N), *lse = host_nan(N);
    float *g_gathered = gpu_put(t, gathered, R * N3 * 4);
    float *g_losses = gpu_put(t, losses, N * 4), *g_lse = gpu_put(t, lse, N * 4);
    cpu_ops.xent_combine(&t->cpu, losses, lse, gathered, N, R);
    t->gpu.ops->xent_combine(&t->gpu, g_losses, g_lse, g_gathered, N, R);
    compare_gpu(t, "xent_combine", "losses", shape, g_losses, losses, N);
    compare_gpu(t, "xent_combine", "lse", shape, g_lse, lse, N);

    /* each rank's slice becomes its gradient, from the reference's lse */
    dev_from_host(&t->gpu, g_lse, lse, N * 4);
    float dloss = 1.0f / N;
    for (int r = 0; r < R; r++) {
        int v0 = r * Vl, nvalid = V - v0 < 0 ? 0 : V - v0 < Vl ? V - v0 : Vl;
        char rshape[192];
        snprintf(rshape, sizeof rshape, "%s rank %d v0=%d nvalid=%d", shape, r, v0, nvalid);
        cpu_ops.xent_grad(&t->cpu, logits[r], lse, targets, N, v0, nvalid, Vl, dloss);
        t->gpu.ops->xent_grad(&t->gpu, g_logits[r], g_lse, g_targets, N, v0, nvalid, Vl, dloss);
        compare_gpu(t, "xent_grad", "dlogits", rshape, g_logits[r], logits[r], NV);
        gpu_drop(t, g_logits[r], NV * 4);
        free(logits[r]);
    }

    gpu_drop(t, g_targets, N * sizeof(int)); gpu_drop(t, g_gathered, R * N3 * 4);
    gpu_drop(t, g_losses, N * 4); gpu_drop(t, g_lse, N * 4);
    free(targets); free(gathered); free(losses); free(lse);
}

/* Three steps of AdamW from random state, with decay and a gradient scale. */
static void test_adamw(Test *t, size_t n) {
    char shape[64];
    snprintf(shape, sizeof shape, "n=%zu, 3 steps", n);
    float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, wd = 0.1f, grad_scale = 0.5f;
    float *param = host_rand(t, n, 1.0f), *m = host_rand(t, n, 0.01f), *v = host_rand(t, n, 1e-4f);
    for (size_t i = 0; i < n; i++) v[i] = fabsf(v[i]);
    float *g_param = gpu_put(t, param, n * 4), *g_m = gpu_put(t, m, n * 4), *g_v = gpu_put(t, v, n * 4);
    float *g_grad = dev_alloc(&t->gpu, n * 4);
    for (int step = 1; step <= 3; step++) {
        float *grad = host_rand(t, n, 0.1f);
        dev_from_host(&t->gpu, g_grad, grad, n * 4);
        float bc1 = 1.0f - powf(beta1, step), bc2 = 1.0f - powf(beta2, step);
        cpu_ops.adamw(&t->cpu, param, grad, m, v, n, lr, beta1, beta2, eps, wd, bc1, bc2, grad_scale);
        t->gpu.ops->adamw(&t->gpu, g_param, g_grad, g_m, g_v, n, lr, beta1, beta2, eps, wd, bc1, bc2, grad_scale);
        free(grad);
    }
    compare_gpu(t, "adamw", "param", shape, g_param, param, n);
    compare_gpu(t, "adamw", "m", shape, g_m, m, n);
    compare_gpu(t, "adamw", "v", shape, g_v, v, n);
    gpu_drop(t, g_param, n * 4); gpu_drop(t, g_m, n * 4); gpu_drop(t, g_v, n * 4); gpu_drop(t, g_grad, n * 4);
    free(param); free(m); free(v);
}

/* The one-launch AdamW over segments of different sizes and decays, some
 * larger than a block's chunk, one empty, against cpu_ops.adamw on each:
 * the arithmetic is the same, so the bound is adamw's. */
static void test_adamw_segs(Test *t) {
    static const size_t sizes[] = {7, 0, 40000, 1, 16384, 100003};
    enum { NS = sizeof sizes / sizeof sizes[0] };
    size_t total = 0;
    for (int k = 0; k < NS; k++) total += sizes[k];
    float *param = host_rand(t, total, 1.0f), *grad = host_rand(t, total, 0.1f);
    float *m = host_rand(t, total, 0.01f), *v = host_rand(t, total, 1e-4f);
    for (size_t i = 0; i < total; i++) v[i] = fabsf(v[i]);
    float *g_param = gpu_put(t, param, total * 4), *g_grad = gpu_put(t, grad, total * 4);
    float *g_m = gpu_put(t, m, total * 4), *g_v = gpu_put(t, v, total * 4);
    uint16_t *lp = malloc(total * 2);   /* [total] the bf16 copies: the even segments' */
    for (size_t i = 0; i < total; i++) lp[i] = 0xffff;   /* a NaN: what no segment may write */
    uint16_t *g_lp = gpu_put(t, lp, total * 2);
    AdamSeg segs[NS];
    size_t off = 0;
    for (int k = 0; k < NS; k++) {
        float wd = k % 2 ? 0.0f : 0.1f;
        segs[k] = (AdamSeg){g_param + off, g_grad + off, g_m + off, g_v + off, sizes[k], wd,
                            k % 2 ? NULL : g_lp + off};
        cpu_ops.adamw(&t->cpu, param + off, grad + off, m + off, v + off, sizes[k], 1e-3f, 0.9f,
                      0.95f, 1e-8f, wd, 0.1f, 0.05f, 0.5f);
        off += sizes[k];
    }
    t->gpu.ops->adamw_segs(&t->gpu, segs, NS, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.05f, 0.5f);
    char shape[64];
    snprintf(shape, sizeof shape, "%d segments, %zu elements", NS, total);
    compare_gpu(t, "adamw_segs", "param", shape, g_param, param, total);
    compare_gpu(t, "adamw_segs", "m", shape, g_m, m, total);
    compare_gpu(t, "adamw_segs", "v", shape, g_v, v, total);
    /* the bf16 copies: the even segments' the GPU's new parameters as Ops.cast rounds them (the
     * CPU's bf16_from_f32), the odd segments' untouched */
    float *got = malloc(total * 4);
    dev_to_host(&t->gpu, got, g_param, total * 4);
    dev_to_host(&t->gpu, lp, g_lp, total * 2);
    size_t bad = 0, first = total;
    off = 0;
    for (int k = 0; k < NS; k++) {
        for (size_t i = off; i < off + sizes[k]; i++) {
            uint16_t want = k % 2 ? 0xffff : bf16_from_f32(got[i]);
            if (lp[i] != want && !bad++) first = i;
        }
        off += sizes[k];
    }
    check(&t->checks, bad == 0, tagged("adamw_segs bf16 copy"), "%s: %zu of %zu elements differ (first %zd)",
          shape, bad, total, bad ? (ssize_t)first : (ssize_t)-1);
    free(got);
    gpu_drop(t, g_lp, total * 2);
    gpu_drop(t, g_param, total * 4); gpu_drop(t, g_grad, total * 4);
    gpu_drop(t, g_m, total * 4); gpu_drop(t, g_v, total * 4);
    free(param); free(grad); free(m); free(v); free(lp);
}

/* One norm's steps on both tables over x [n] (g_x on the GPU), as
 * optim_norm takes them: the CPU's x as two runs, the GPU's as `cuts`
 * runs (300: more than one launch takes, some of them empty where n is
 * small); the exponents alone (no guess), then with a guess right and one
 * wrong (3 binades low, so its first pass's sums round and only e, r and
 * the limbs must agree), each followed by the redo and the pack (any grid
 * will do: 20 bits a part). Checks the GPU's NormAcc has the CPU's bits:
 * the sums are exact, so no cut of the runs changes them. */
static void test_norm_steps(Test *t, const char *shape, const float *x, const float *g_x, size_t n, int cuts) {
    Dev *c = &t->cpu, *g = &t->gpu;
    NormAcc want, got, *g_acc = dev_alloc(g, sizeof *g_acc);
    size_t h = n / 2;
    const NormRun two[2] = {{x, h}, {x + h, n - h}};
    NormRun *gr = xmalloc((size_t)cuts * sizeof *gr);
    for (int k = 0; k < cuts; k++) gr[k] = (NormRun){g_x + n * k / cuts, n * (k + 1) / cuts - n * k / cuts};
    memset(&want, 0, sizeof want);
    cpu_ops.norm_add(c, &want, two, 2, NULL);
    const int e = want.e;
    const int guesses[3] = {-1, e, e - 3};
    int ok = 1;
    char what[256] = "";
    for (int i = 0; i < 3; i++) {
        const NormGrid grid = norm_grid_at(guesses[i], 20);
        const NormGrid *gp = guesses[i] < 0 ? NULL : &grid;
        memset(&want, 0, sizeof want);
        dev_zero(g, g_acc, sizeof *g_acc);
        cpu_ops.norm_add(c, &want, two, 2, gp);
        g->ops->norm_add(g, g_acc, gr, cuts, gp);
        cpu_ops.norm_redo(c, &want, two, 2, guesses[i], 20);   /* one rank: its exponent is everyone's */
        g->ops->norm_redo(g, g_acc, gr, cuts, guesses[i], 20);
        cpu_ops.norm_pack(c, &want, guesses[i], 20);
        g->ops->norm_pack(g, g_acc, guesses[i], 20);
        dev_to_host(g, &got, g_acc, sizeof got);
        int same = got.e == want.e && !memcmp(got.r, want.r, sizeof got.r) &&
                   !memcmp(got.limbs, want.limbs, sizeof got.limbs) &&
                   (guesses[i] != e || e == 255 || !memcmp(got.s, want.s, sizeof got.s));
        ok &= same;
        snprintf(what + strlen(what), sizeof what - strlen(what), "%s guess %d: e %d (cpu %d), limb0 %d (cpu %d)",
                 i ? ";" : "", guesses[i], got.e, want.e, got.limbs[0], want.limbs[0]);
    }
    check(&t->checks, ok, tagged("norm_add/redo/pack"), "%s, the GPU's as %d runs: %s", shape, cuts, what);
    gpu_drop(t, g_acc, sizeof *g_acc);
    free(gr);
}

/* Sums in double against a double host loop. The GPU adds in another order,
 * so the error is measured against the sum of |terms|, about 1e-16 * log n
 * of it; 1e-12 leaves room and still catches a float accumulation (1e-7). */
static void test_sums(Test *t, size_t n) {
    char shape[64];
    snprintf(shape, sizeof shape, "n=%zu", n);
    float *x = host_rand(t, n, 1.0f);
    float *g_x = gpu_put(t, x, n * 4);
    /* the reference in long double: a double loop over 2^24 squares drifts
     * by ~3e-12 itself (x is a multiple of 2^-23, so the squares' low bits
     * round one way), more than the bound */
    long double lsum = 0, lsumsq = 0, lsum_abs = 0;
    for (size_t i = 0; i < n; i++) {
        lsum += x[i];
        lsumsq += (long double)x[i] * x[i];
        lsum_abs += fabsl((long double)x[i]);
    }
    double sum = (double)lsum, sumsq = (double)lsumsq, sum_abs = (double)lsum_abs;
    double got_sum = t->gpu.ops->sum(&t->gpu, g_x, n), got_sumsq = t->gpu.ops->sumsq(&t->gpu, g_x, n);
    double e_sum = fabs(got_sum - sum) / (sum_abs > 0 ? sum_abs : 1);
    double e_sumsq = fabs(got_sumsq - sumsq) / (sumsq > 0 ? sumsq : 1);
    check(&t->checks, e_sum <= 1e-12, tagged("sum"), "%s: %.10g vs host %.10g, err %.1e of sum|x|", shape, got_sum, sum, e_sum);
    check(&t->checks, e_sumsq <= 1e-12, tagged("sumsq"), "%s: %.10g vs host %.10g, rel err %.1e", shape, got_sumsq, sumsq, e_sumsq);
    /* the gradient norm's steps: the CPU's bits (optim.h, "The gradient norm") */
    if (n) x[n / 3] = -1e3f;   /* the largest exponent in the middle of a block */
    dev_from_host(&t->gpu, g_x, x, n * 4);
    test_norm_steps(t, shape, x, g_x, n, 2);
    test_norm_steps(t, shape, x, g_x, n, 300);
    if (n) {   /* an Inf: exponent 255, and nothing summed or packed */
        x[n / 2] = INFINITY;
        dev_from_host(&t->gpu, g_x, x, n * 4);
        test_norm_steps(t, shape, x, g_x, n, 300);
    }
    gpu_drop(t, g_x, n * 4);
    free(x);
}

/* Every op with a zero size: nothing may be launched (a zero grid is a
 * launch error, which would exit), and nothing is touched. */
static void test_zero_sizes(Test *t) {
    Dev *g = &t->gpu;
    const Ops *o = g->ops;
    o->encoder_forward(g, NULL, NULL, NULL, NULL, 0, 4, 8);
    o->encoder_backward(g, NULL, NULL, NULL, NULL, NULL, -1, 0, 4, 8);  /* dwpe NULL too */
    o->layernorm_forward(g, NULL, NULL, NULL, NULL, NULL, NULL, 0, 8);
    o->layernorm_backward(g, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, 8);
    o->matmul_forward(g, NULL, NULL, NULL, NULL, 0, 8, 8);
    o->matmul_backward(g, NULL, NULL, NULL, NULL, NULL, NULL, 0, 8, 8);  /* dw += nothing */
    o->attention_forward(g, NULL, NULL, NULL, 0, 4, 8, 2);
    o->attention_backward(g, NULL, NULL, NULL, NULL, NULL, NULL, 0, 4, 8, 2);
    o->gelu_forward(g, NULL, NULL, 0);
    o->gelu_backward(g, NULL, NULL, NULL, 0);
    o->add(g, NULL, NULL, NULL, 0);
    o->accumulate(g, NULL, NULL, 0);
    o->crossentropy(g, NULL, NULL, NULL, 0, 8, 8, 1.0f);
    o->xent_stats(g, NULL, NULL, NULL, 0, 8, 8, 8);
    o->xent_combine(g, NULL, NULL, NULL, 0, 3);
    o->xent_grad(g, NULL, NULL, NULL, 0, 8, 8, 8, 1.0f);
    o->adamw(g, NULL, NULL, NULL, NULL, 0, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 0.1f, 0.001f, 1.0f);
    NormGrid grid = norm_grid_at(1, 20);
    const NormRun empty[2] = {{NULL, 0}, {NULL, 0}};
    o->norm_add(g, NULL, empty, 2, &grid);   /* NULL: an acc touched would fault */
    o->norm_add(g, NULL, empty, 2, NULL);
    o->norm_redo(g, NULL, empty, 2, 1, 20);
    o->norm_add(g, NULL, NULL, 0, NULL);
    double s = o->sum(g, NULL, 0) + o->sumsq(g, NULL, 0);
    dev_sync(g);
    check(&t->checks, s == 0.0, tagged("zero sizes"), "every op with n = 0 or N = 0 returned, sums %g", s);
}

/* ---------------------------------------------------------------------------
 * The bf16 table (cuda_bf16_ops) against the CPU's bf16 table (cpu_bf16_ops,
 * ops_bf16.c): the same bf16 inputs, float32 arithmetic on both sides, each
 * output rounded to bf16 once. The two differ by summation order and by one
 * bf16 rounding of an output (2^-9 relative), and the fused attention keeps
 * its probabilities in registers where the reference stores them, so the
 * bound is bf16's: 1e-2 of the largest reference value. */

#define TOL16 1e-2

/* n bf16 values, uniform in [-scale, scale) rounded. */
static uint16_t *h16_rand(Test *t, size_t n, float scale) {
    uint16_t *x = xmalloc(n * 2);
    for (size_t i = 0; i < n; i++) x[i] = bf16_from_f32(scale * urand(t));
    return x;
}
static uint16_t *h16_nan(size_t n) {
    uint16_t *x = xmalloc(n * 2);
    for (size_t i = 0; i < n; i++) x[i] = 0x7fc0;  /* a quiet NaN */
    return x;
}
static float *widen16(const uint16_t *x, size_t n) {
    float *f = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) f[i] = bf16_to_f32(x[i]);
    return f;
}

/* Compares n bf16 values of gpu_buf with the host's want16. */
static void compare16(Test *t, const char *op, const char *what, const char *shape,
                      const void *gpu_buf, const uint16_t *want16, size_t n) {
    uint16_t *got16 = xmalloc(n * 2);
    dev_to_host(&t->gpu, got16, gpu_buf, n * 2);
    float *got = widen16(got16, n), *want = widen16(want16, n);
    char name[128];
    snprintf(name, sizeof name, "bf16 %s %s" TAG_FMT, op, what, TAG);
    double err = max_rel_err(got, want, n);
    check(&t->checks, err <= TOL16, name, "%s: max rel err %.2e over %zu values (tol %.0e)", shape,
          err, n, TOL16);
    free(got16); free(got); free(want);
}
/* Float32 outputs of the bf16 table (gradients of parameters, statistics). */
static void compare16f(Test *t, const char *op, const char *what, const char *shape,
                       const float *gpu_buf, const float *want, size_t n) {
    float *got = gpu_get(t, gpu_buf, n);
    char name[128];
    snprintf(name, sizeof name, "bf16 %s %s" TAG_FMT, op, what, TAG);
    double err = max_rel_err(got, want, n);
    check(&t->checks, err <= TOL16, name, "%s: max rel err %.2e over %zu values (tol %.0e)", shape,
          err, n, TOL16);
    free(got);
}

static void test16_layernorm(Test *t, Dev *c16, int N, int C) {
    char shape[64];
    snprintf(shape, sizeof shape, "N=%d C=%d", N, C);
    size_t NC = (size_t)N * C;
    uint16_t *a = h16_rand(t, NC, 2.0f), *b = h16_rand(t, NC, 1.0f);
    uint16_t *w = h16_rand(t, C, 1.0f), *bias = h16_rand(t, C, 1.0f);
    uint16_t *res = h16_nan(NC), *out = h16_nan(NC);
    float *mean = host_nan(N), *rstd = host_nan(N);
    void *g_a = gpu_put(t, a, NC * 2), *g_b = gpu_put(t, b, NC * 2), *g_w = gpu_put(t, w, C * 2);
    void *g_bias = gpu_put(t, bias, C * 2), *g_res = gpu_put(t, res, NC * 2), *g_out = gpu_put(t, out, NC * 2);
    float *g_mean = gpu_put(t, mean, N * 4), *g_rstd = gpu_put(t, rstd, N * 4);
    c16->ops->layernorm_forward(c16, out, mean, rstd, a, w, bias, N, C);
    t->gpu.ops->layernorm_forward(&t->gpu, g_out, g_mean, g_rstd, g_a, g_w, g_bias, N, C);
    compare16(t, "layernorm_forward", "out", shape, g_out, out, NC);
    compare16f(t, "layernorm_forward", "rstd", shape, g_rstd, rstd, N);
    c16->ops->add_layernorm_forward(c16, res, out, mean, rstd, a, b, w, bias, N, C);
    t->gpu.ops->add_layernorm_forward(&t->gpu, g_res, g_out, g_mean, g_rstd, g_a, g_b, g_w, g_bias, N, C);
    compare16(t, "add_layernorm_forward", "res", shape, g_res, res, NC);
    compare16(t, "add_layernorm_forward", "out", shape, g_out, out, NC);
    /* backward of the LayerNorm of res, from the same statistics */
    dev_from_host(&t->gpu, g_mean, mean, N * 4);
    dev_from_host(&t->gpu, g_rstd, rstd, N * 4);
    uint16_t *dout = h16_rand(t, NC, 1.0f), *dinp = h16_rand(t, NC, 0.5f);
    float *dw = host_rand(t, C, 0.5f), *db = host_rand(t, C, 0.5f);
    void *g_dout = gpu_put(t, dout, NC * 2), *g_dinp = gpu_put(t, dinp, NC * 2);
    float *g_dw = gpu_put(t, dw, C * 4), *g_db = gpu_put(t, db, C * 4);
    c16->ops->layernorm_backward(c16, dinp, dw, db, dout, res, w, mean, rstd, N, C);
    t->gpu.ops->layernorm_backward(&t->gpu, g_dinp, g_dw, g_db, g_dout, g_res, g_w, g_mean, g_rstd, N, C);
    compare16(t, "layernorm_backward", "dinp", shape, g_dinp, dinp, NC);
    compare16f(t, "layernorm_backward", "dw", shape, g_dw, dw, C);
    compare16f(t, "layernorm_backward", "db", shape, g_db, db, C);
    gpu_drop(t, g_a, NC * 2); gpu_drop(t, g_b, NC * 2); gpu_drop(t, g_w, C * 2); gpu_drop(t, g_bias, C * 2);
    gpu_drop(t, g_res, NC * 2); gpu_drop(t, g_out, NC * 2); gpu_drop(t, g_mean, N * 4); gpu_drop(t, g_rstd, N * 4);
    gpu_drop(t, g_dout, NC * 2); gpu_drop(t, g_dinp, NC * 2); gpu_drop(t, g_dw, C * 4); gpu_drop(t, g_db, C * 4);
    free(a); free(b); free(w); free(bias); free(res); free(out); free(mean); free(rstd);
    free(dout); free(dinp); free(dw); free(db);
}

/* LayerNorm's backward alone, in the Dev's dtype against ref (cpu_ops for
 * float32, the CPU's bf16 table for bf16), as training calls it: the whole
 * (dinp, dw, db accumulated), the input gradient alone (dw, db NULL: a split
 * backward's first half), the weights' alone (dinp NULL: its deferred half);
 * then the whole twice more from the same start, the same bits both times
 * (under the emulation, whose schedule is itself fixed, this checks that no
 * output depends on anything but the inputs: a GPU's run-to-run determinism
 * needs the lease). The shapes pick kernels.cu's paths: C <= 1024 the rows
 * kernel (16-byte vectors where C is a multiple of the width, scalar where
 * not, or where mis starts dinp, dout and inp one element past an aligned
 * address), wider the older ones; N past 64 gives several blocks' partials. */
static void test_lnb(Test *t, Dev *ref, int N, int C, int mis) {
    const int bf = ref->ops->dtype == DT_BF16;
    const size_t es = bf ? 2 : 4, NC = (size_t)N * C;
    char shape[96];
    snprintf(shape, sizeof shape, "N=%d C=%d%s (backward alone)", N, C, mis ? " misaligned" : "");
    /* host: inp [N,C] (a mean away from 0), w [C], dout [N,C], dinp0 [N,C], in
     * the dtype; dw0, db0 [C] float; mean, rstd [N] from ref's forward */
    void *inp = xmalloc(NC * es), *w = xmalloc(C * es), *dout = xmalloc(NC * es), *dinp0 = xmalloc(NC * es);
    void *out = xmalloc(NC * es), *bias = xmalloc(C * es);
    void *arrays[6] = {inp, w, dout, dinp0, out, bias};
    const size_t counts[6] = {NC, (size_t)C, NC, NC, NC, (size_t)C};
    const float scales[6] = {2.0f, 1.0f, 1.0f, 0.5f, 0.0f, 1.0f}, shifts[6] = {0.3f, 0, 0, 0, 0, 0};
    for (int a = 0; a < 6; a++)
        for (size_t i = 0; i < counts[a]; i++) {
            const float v = scales[a] * urand(t) + shifts[a];
            if (bf) ((uint16_t *)arrays[a])[i] = bf16_from_f32(v);
            else ((float *)arrays[a])[i] = v;
        }
    float *dw0 = host_rand(t, C, 0.5f), *db0 = host_rand(t, C, 0.5f);
    float *mean = host_nan(N), *rstd = host_nan(N);
    ref->ops->layernorm_forward(ref, out, mean, rstd, inp, w, bias, N, C);

    /* device: the row arrays mis elements past their allocation's start */
    const size_t off = mis ? es : 0;
    char *a_inp = dev_alloc(&t->gpu, NC * es + 16), *a_dout = dev_alloc(&t->gpu, NC * es + 16);
    char *a_dinp = dev_alloc(&t->gpu, NC * es + 16);
    void *g_inp = a_inp + off, *g_dout = a_dout + off, *g_dinp = a_dinp + off;
    dev_from_host(&t->gpu, g_inp, inp, NC * es);
    dev_from_host(&t->gpu, g_dout, dout, NC * es);
    void *g_w = gpu_put(t, w, C * es);
    float *g_mean = gpu_put(t, mean, N * 4), *g_rstd = gpu_put(t, rstd, N * 4);
    float *g_dw = gpu_put(t, dw0, C * 4), *g_db = gpu_put(t, db0, C * 4);

    void *dinp = xmalloc(NC * es);
    float *dw = xmalloc(C * 4), *db = xmalloc(C * 4);
    const char *modes[3] = {"", " (dw, db NULL)", " (dinp NULL)"};
    void *got[2][3] = {{NULL}};  /* two runs of the whole: dinp, dw, db as bytes */
    for (int mode = 0; mode < 5; mode++) {
        const int m = mode < 3 ? mode : 0;  /* 3, 4: the whole again, for the bits */
        memcpy(dinp, dinp0, NC * es);
        memcpy(dw, dw0, C * 4);
        memcpy(db, db0, C * 4);
        dev_from_host(&t->gpu, g_dinp, dinp0, NC * es);
        dev_from_host(&t->gpu, g_dw, dw0, C * 4);
        dev_from_host(&t->gpu, g_db, db0, C * 4);
        void *rd = m == 2 ? NULL : dinp, *gd = m == 2 ? NULL : g_dinp;
        float *rw = m == 1 ? NULL : dw, *rb = m == 1 ? NULL : db;
        float *gw = m == 1 ? NULL : g_dw, *gb = m == 1 ? NULL : g_db;
        t->gpu.ops->layernorm_backward(&t->gpu, gd, gw, gb, g_dout, g_inp, g_w, g_mean, g_rstd, N, C);
        if (mode >= 3) {
            void **r = got[mode - 3];
            r[0] = xmalloc(NC * es), r[1] = xmalloc(C * 4), r[2] = xmalloc(C * 4);
            dev_to_host(&t->gpu, r[0], g_dinp, NC * es);
            dev_to_host(&t->gpu, r[1], g_dw, C * 4);
            dev_to_host(&t->gpu, r[2], g_db, C * 4);
            continue;
        }
        ref->ops->layernorm_backward(ref, rd, rw, rb, dout, inp, w, mean, rstd, N, C);
        char what[64];
        snprintf(what, sizeof what, "dinp%s", modes[m]);
        if (bf) compare16(t, "layernorm_backward", what, shape, g_dinp, dinp, NC);  /* m 2: unchanged */
        else compare_gpu(t, "layernorm_backward", what, shape, g_dinp, dinp, NC);
        snprintf(what, sizeof what, "dw%s", modes[m]);
        (bf ? compare16f : compare_gpu)(t, "layernorm_backward", what, shape, g_dw, dw, C);
        snprintf(what, sizeof what, "db%s", modes[m]);
        (bf ? compare16f : compare_gpu)(t, "layernorm_backward", what, shape, g_db, db, C);
    }
    const int same = memcmp(got[0][0], got[1][0], NC * es) == 0 && memcmp(got[0][1], got[1][1], C * 4) == 0 &&
                     memcmp(got[0][2], got[1][2], C * 4) == 0;
    char name[128];
    snprintf(name, sizeof name, "%slayernorm_backward deterministic" TAG_FMT, bf ? "bf16 " : "", TAG);
    check(&t->checks, same, name, "%s: dinp, dw, db of two runs %s", shape, same ? "bitwise equal" : "differ");

    dev_free(&t->gpu, a_inp, NC * es + 16); dev_free(&t->gpu, a_dout, NC * es + 16);
    dev_free(&t->gpu, a_dinp, NC * es + 16);
    gpu_drop(t, g_w, C * es); gpu_drop(t, g_mean, N * 4); gpu_drop(t, g_rstd, N * 4);
    gpu_drop(t, g_dw, C * 4); gpu_drop(t, g_db, C * 4);
    for (int a = 0; a < 6; a++) free(arrays[a]);
    for (int r = 0; r < 2; r++) for (int k = 0; k < 3; k++) free(got[r][k]);
    free(dw0); free(db0); free(mean); free(rstd); free(dinp); free(dw); free(db);
}

/* The shapes of test_lnb, in the Dev's dtype (its comment says what each takes). */
static void test_lnb_shapes(Test *t, Dev *ref) {
    test_lnb(t, ref, 37, 45, 0);     /* C odd: scalar */
    test_lnb(t, ref, 130, 768, 0);   /* GPT-2's C; 3 chunks, the last of 2 rows */
    test_lnb(t, ref, 200, 776, 0);   /* 3 * 256 + 8: the last vector column reached by few lanes */
    test_lnb(t, ref, 67, 1020, 0);   /* float32 vectors (8 a lane, the last partial); bf16 scalar */
    test_lnb(t, ref, 70, 1024, 0);   /* the widest the rows kernel takes */
    test_lnb(t, ref, 66, 250, 0);    /* not whole vectors in either dtype: scalar, 8 a lane */
    test_lnb(t, ref, 37, 768, 1);    /* misaligned rows: scalar, 24 a lane */
    test_lnb(t, ref, 1, 8, 0);       /* one row: 7 of a block's 8 warps have none */
    test_lnb(t, ref, 2100, 72, 0);   /* 33 blocks' partials: each of the sum's 16 lanes adds 2 or 3 */
    test_lnb(t, ref, 65, 1032, 0);   /* wider: the older one-pass kernel */
}

static void test16_matmul(Test *t, Dev *c16, int N, int C, int OC) {
    char shape[64];
    snprintf(shape, sizeof shape, "N=%d C=%d OC=%d", N, C, OC);
    size_t NC = (size_t)N * C, NO = (size_t)N * OC, OCC = (size_t)OC * C;
    uint16_t *inp = h16_rand(t, NC, 1.0f), *w = h16_rand(t, OCC, 1.0f), *bias = h16_rand(t, OC, 1.0f);
    uint16_t *out = h16_nan(NO);
    void *g_inp = gpu_put(t, inp, NC * 2), *g_w = gpu_put(t, w, OCC * 2), *g_bias = gpu_put(t, bias, OC * 2);
    void *g_out = gpu_put(t, out, NO * 2);
    c16->ops->matmul_forward(c16, out, inp, w, bias, N, C, OC);
    t->gpu.ops->matmul_forward(&t->gpu, g_out, g_inp, g_w, g_bias, N, C, OC);
    compare16(t, "matmul_forward", "out", shape, g_out, out, NO);
    /* fc's product and GELU in one op: against the CPU bf16 table, and against this table's
     * matmul_forward then gelu_forward on the device, bit for bit (both outputs) */
    {
        uint16_t *gout = h16_nan(NO), *f_out = xmalloc(NO * 2), *f_g = xmalloc(NO * 2), *s_out = xmalloc(NO * 2),
                 *s_g = xmalloc(NO * 2);
        void *g_gout = gpu_put(t, gout, NO * 2);
        c16->ops->matmul_forward_gelu(c16, out, gout, inp, w, bias, N, C, OC);
        t->gpu.ops->matmul_forward_gelu(&t->gpu, g_out, g_gout, g_inp, g_w, g_bias, N, C, OC);
        compare16(t, "matmul_forward_gelu", "out", shape, g_out, out, NO);
        compare16(t, "matmul_forward_gelu", "gout", shape, g_gout, gout, NO);
        dev_to_host(&t->gpu, f_out, g_out, NO * 2);
        dev_to_host(&t->gpu, f_g, g_gout, NO * 2);
        ops_matmul_forward_gelu_seq(t->gpu.ops, &t->gpu, g_out, g_gout, g_inp, g_w, g_bias, N, C, OC);
        dev_to_host(&t->gpu, s_out, g_out, NO * 2);
        dev_to_host(&t->gpu, s_g, g_gout, NO * 2);
        size_t d_out = 0, d_g = 0;
        for (size_t i = 0; i < NO; i++) d_out += f_out[i] != s_out[i], d_g += f_g[i] != s_g[i];
        check(&t->checks, d_out == 0 && d_g == 0, tagged("bf16 matmul_forward_gelu bits"),
              "%s: %zu (out) and %zu (gout) of %zu values differ from matmul_forward then gelu_forward on the "
              "device (must be 0)", shape, d_out, d_g, NO);
        gpu_drop(t, g_gout, NO * 2);
        free(gout); free(f_out); free(f_g); free(s_out); free(s_g);
    }
    uint16_t *dout = h16_rand(t, NO, 1.0f), *dinp = h16_rand(t, NC, 0.5f);
    float *dw = host_rand(t, OCC, 0.5f), *dbias = host_rand(t, OC, 0.5f);
    void *g_dout = gpu_put(t, dout, NO * 2), *g_dinp = gpu_put(t, dinp, NC * 2);
    float *g_dw = gpu_put(t, dw, OCC * 4), *g_dbias = gpu_put(t, dbias, OC * 4);
    c16->ops->matmul_backward(c16, dinp, dw, dbias, dout, inp, w, N, C, OC);
    t->gpu.ops->matmul_backward(&t->gpu, g_dinp, g_dw, g_dbias, g_dout, g_inp, g_w, N, C, OC);
    compare16(t, "matmul_backward", "dinp", shape, g_dinp, dinp, NC);
    compare16f(t, "matmul_backward", "dw", shape, g_dw, dw, OCC);
    compare16f(t, "matmul_backward", "dbias", shape, g_dbias, dbias, OC);
    /* fcproj's input gradient through GELU's backward: against the CPU bf16
     * table (its own tanh: bf16's bound), and against the two ops of this
     * table in sequence on the device (ops_matmul_backward_gelu_seq: the
     * product into a zeroed buffer, then gelu_backward), bit for bit: the
     * fused epilogue's promise */
    uint16_t *fch = h16_rand(t, NC, 4.0f), *dfch = h16_nan(NC), *tmp = h16_nan(NC);
    void *g_fch = gpu_put(t, fch, NC * 2), *g_dfch = gpu_put(t, dfch, NC * 2), *g_tmp = gpu_put(t, tmp, NC * 2);
    void *g_seq = gpu_put(t, dfch, NC * 2);
    c16->ops->matmul_backward_gelu(c16, dfch, NULL, tmp, dout, w, fch, N, C, OC);
    t->gpu.ops->matmul_backward_gelu(&t->gpu, g_dfch, NULL, g_tmp, g_dout, g_w, g_fch, N, C, OC);
    compare16(t, "matmul_backward_gelu", "dfch", shape, g_dfch, dfch, NC);
    uint16_t *fused = xmalloc(NC * 2), *seq = xmalloc(NC * 2), *tmp_after = xmalloc(NC * 2);
    dev_to_host(&t->gpu, fused, g_dfch, NC * 2);
    dev_to_host(&t->gpu, tmp_after, g_tmp, NC * 2);
    ops_matmul_backward_gelu_seq(t->gpu.ops, &t->gpu, g_seq, NULL, g_tmp, g_dout, g_w, g_fch, N, C, OC);
    dev_to_host(&t->gpu, seq, g_seq, NC * 2);
    size_t differ = 0;
    for (size_t i = 0; i < NC; i++) differ += fused[i] != seq[i];
    uint16_t *nan16 = h16_nan(NC);
    const int tmp_kept = memcmp(tmp_after, nan16, NC * 2) == 0;  /* g_tmp started as these NaNs */
    check(&t->checks, differ == 0 && tmp_kept, tagged("bf16 matmul_backward_gelu bits"),
          "%s: %zu of %zu values differ from matmul_backward into zeros then gelu_backward on the device "
          "(must be 0); the scratch %s", shape, differ, NC, tmp_kept ? "untouched" : "WRITTEN (the fused form never writes it)");
    /* with fc's bias gradient (dbias [C] accumulated into random values):
     * against the CPU bf16 table, and bit for bit against this table's own
     * sequence (the product, gelu_backward, then matmul_backward's column
     * sums of the stored dfch); dfch's bits as without it */
    float *fdb = host_rand(t, C, 0.5f);
    float *g_fdb = gpu_put(t, fdb, C * 4), *g_sdb = gpu_put(t, fdb, C * 4);
    dev_from_host(&t->gpu, g_dfch, nan16, NC * 2);
    c16->ops->matmul_backward_gelu(c16, dfch, fdb, tmp, dout, w, fch, N, C, OC);
    t->gpu.ops->matmul_backward_gelu(&t->gpu, g_dfch, g_fdb, g_tmp, g_dout, g_w, g_fch, N, C, OC);
    compare16f(t, "matmul_backward_gelu", "dbias", shape, g_fdb, fdb, C);
    ops_matmul_backward_gelu_seq(t->gpu.ops, &t->gpu, g_seq, g_sdb, g_tmp, g_dout, g_w, g_fch, N, C, OC);
    float *f_db = xmalloc(C * 4), *s_db = xmalloc(C * 4);
    dev_to_host(&t->gpu, fused, g_dfch, NC * 2);
    dev_to_host(&t->gpu, seq, g_seq, NC * 2);
    dev_to_host(&t->gpu, f_db, g_fdb, C * 4);
    dev_to_host(&t->gpu, s_db, g_sdb, C * 4);
    size_t d_dfch = 0, d_db = 0;
    for (size_t i = 0; i < NC; i++) d_dfch += fused[i] != seq[i];
    for (int i = 0; i < C; i++) d_db += memcmp(&f_db[i], &s_db[i], 4) != 0;
    check(&t->checks, d_dfch == 0 && d_db == 0, tagged("bf16 matmul_backward_gelu bias bits"),
          "%s: %zu of %d bias sums and %zu of %zu dfch values differ from the product, gelu_backward, then "
          "matmul_backward's bias sums on the device (must be 0)", shape, d_db, C, d_dfch, NC);
    gpu_drop(t, g_fdb, C * 4); gpu_drop(t, g_sdb, C * 4);
    free(fdb); free(f_db); free(s_db); free(nan16);
    gpu_drop(t, g_fch, NC * 2); gpu_drop(t, g_dfch, NC * 2); gpu_drop(t, g_tmp, NC * 2); gpu_drop(t, g_seq, NC * 2);
    free(fch); free(dfch); free(tmp); free(fused); free(seq); free(tmp_after);
    gpu_drop(t, g_inp, NC * 2); gpu_drop(t, g_w, OCC * 2); gpu_drop(t, g_bias, OC * 2); gpu_drop(t, g_out, NO * 2);
    gpu_drop(t, g_dout, NO * 2); gpu_drop(t, g_dinp, NC * 2); gpu_drop(t, g_dw, OCC * 4); gpu_drop(t, g_dbias, OC * 4);
    free(inp); free(w); free(bias); free(out); free(dout); free(dinp); free(dw); free(dbias);
}

/* Each side keeps its own state (probabilities on the CPU, a log-sum-exp a
 * row in the fused kernel); out and dqkv are compared. */
static void test16_attention(Test *t, Dev *c16, int B, int T, int C, int NH) {
    char shape[96];
    snprintf(shape, sizeof shape, "B=%d T=%d C=%d NH=%d (hs=%d)", B, T, C, NH, C / NH);
    size_t BTC = (size_t)B * T * C, QKV = 3 * BTC, sc = 0, gsc = 0;
    size_t st = c16->ops->attention_floats(B, T, C, NH, &sc);
    size_t gst = t->gpu.ops->attention_floats(B, T, C, NH, &gsc);
    uint16_t *qkv = h16_rand(t, QKV, 1.5f), *out = h16_nan(BTC);
    float *state = host_nan(st), *scratch = host_nan(sc);
    void *g_qkv = gpu_put(t, qkv, QKV * 2), *g_out = gpu_put(t, out, BTC * 2);
    float *g_state = dev_alloc(&t->gpu, gst * 4), *g_scratch = dev_alloc(&t->gpu, gsc * 4);
    c16->ops->attention_forward(c16, out, state, qkv, B, T, C, NH);
    t->gpu.ops->attention_forward(&t->gpu, g_out, g_state, g_qkv, B, T, C, NH);
    compare16(t, "attention_forward", "out", shape, g_out, out, BTC);
    uint16_t *dout = h16_rand(t, BTC, 1.0f), *dqkv = h16_nan(QKV);   /* written: NaN before */
    void *g_dout = gpu_put(t, dout, BTC * 2), *g_dqkv = gpu_put(t, dqkv, QKV * 2);
    dev_from_host(&t->gpu, g_out, out, BTC * 2);  /* the GPU's state with the CPU's out: within bf16 */
    c16->ops->attention_backward(c16, dqkv, scratch, dout, qkv, out, state, B, T, C, NH);
    t->gpu.ops->attention_backward(&t->gpu, g_dqkv, g_scratch, g_dout, g_qkv, g_out, g_state, B, T, C, NH);
    compare16(t, "attention_backward", "dqkv", shape, g_dqkv, dqkv, QKV);
    gpu_drop(t, g_qkv, QKV * 2); gpu_drop(t, g_out, BTC * 2); gpu_drop(t, g_state, gst * 4);
    gpu_drop(t, g_scratch, gsc * 4); gpu_drop(t, g_dout, BTC * 2); gpu_drop(t, g_dqkv, QKV * 2);
    free(qkv); free(out); free(state); free(scratch); free(dout); free(dqkv);
}

/* gelu, add, cast, widen, the encoder, cross-entropy and the vocab-parallel
 * pieces on one rank's slice. */
static void test16_rest(Test *t, Dev *c16, size_t n, int N, int V, int Vp, int C) {
    char shape[96];
    snprintf(shape, sizeof shape, "n=%zu", n);
    uint16_t *x = h16_rand(t, n, 4.0f), *y = h16_rand(t, n, 1.0f), *out = h16_nan(n), *dx = h16_rand(t, n, 0.5f);
    void *g_x = gpu_put(t, x, n * 2), *g_y = gpu_put(t, y, n * 2), *g_out = gpu_put(t, out, n * 2);
    void *g_dx = gpu_put(t, dx, n * 2);
    c16->ops->gelu_forward(c16, out, x, n);
    t->gpu.ops->gelu_forward(&t->gpu, g_out, g_x, n);
    compare16(t, "gelu_forward", "out", shape, g_out, out, n);
    c16->ops->gelu_backward(c16, dx, x, y, n);
    t->gpu.ops->gelu_backward(&t->gpu, g_dx, g_x, g_y, n);
    compare16(t, "gelu_backward", "dinp", shape, g_dx, dx, n);
    c16->ops->add(c16, out, x, y, n);
    t->gpu.ops->add(&t->gpu, g_out, g_x, g_y, n);
    compare16(t, "add", "out", shape, g_out, out, n);
    float *f = host_rand(t, n, 3.0f), *fw = host_nan(n);
    float *g_f = gpu_put(t, f, n * 4), *g_fw = gpu_put(t, fw, n * 4);
    c16->ops->cast(c16, out, f, n);
    t->gpu.ops->cast(&t->gpu, g_out, g_f, n);
    compare16(t, "cast", "out", shape, g_out, out, n);
    c16->ops->widen(c16, fw, out, n);
    t->gpu.ops->widen(&t->gpu, g_fw, g_out, n);
    compare16f(t, "widen", "out", shape, g_fw, fw, n);
    gpu_drop(t, g_x, n * 2); gpu_drop(t, g_y, n * 2); gpu_drop(t, g_out, n * 2); gpu_drop(t, g_dx, n * 2);
    gpu_drop(t, g_f, n * 4); gpu_drop(t, g_fw, n * 4);
    free(x); free(y); free(out); free(dx); free(f); free(fw);

    /* the encoder: tokens of a vocabulary of V, T = N / 2 positions, batch 2 */
    int Tn = N / 2 > 0 ? N / 2 : 1, B = 2;
    size_t BTC = (size_t)B * Tn * C;
    snprintf(shape, sizeof shape, "B=%d T=%d C=%d V=%d", B, Tn, C, V);
    int *tok = host_tokens(t, (size_t)B * Tn, V);
    uint16_t *wte = h16_rand(t, (size_t)V * C, 1.0f), *wpe = h16_rand(t, (size_t)Tn * C, 1.0f), *emb = h16_nan(BTC);
    float *dwte = host_rand(t, (size_t)V * C, 0.5f), *dwpe = host_rand(t, (size_t)Tn * C, 0.5f);
    int *g_tok = gpu_put(t, tok, (size_t)B * Tn * sizeof(int));
    void *g_wte = gpu_put(t, wte, (size_t)V * C * 2), *g_wpe = gpu_put(t, wpe, (size_t)Tn * C * 2);
    void *g_emb = gpu_put(t, emb, BTC * 2);
    float *g_dwte = gpu_put(t, dwte, (size_t)V * C * 4), *g_dwpe = gpu_put(t, dwpe, (size_t)Tn * C * 4);
    c16->ops->encoder_forward(c16, emb, tok, wte, wpe, B, Tn, C);
    t->gpu.ops->encoder_forward(&t->gpu, g_emb, g_tok, g_wte, g_wpe, B, Tn, C);
    compare16(t, "encoder_forward", "out", shape, g_emb, emb, BTC);
    /* the GPU through dev_embed_plan, as training runs it */
    int *plan = xmalloc(((size_t)2 * B * Tn + 1) * sizeof(int));
    const int runs = dev_embed_plan(tok, B * Tn, plan);
    const size_t plan_n = (size_t)runs + 1 + plan[runs];
    int *g_plan = gpu_put(t, plan, plan_n * sizeof(int));
    c16->ops->encoder_backward(c16, dwte, dwpe, emb, tok, NULL, -1, B, Tn, C);
    t->gpu.ops->encoder_backward(&t->gpu, g_dwte, g_dwpe, g_emb, g_tok, g_plan, runs, B, Tn, C);
    gpu_drop(t, g_plan, plan_n * sizeof(int));
    free(plan);
    compare16f(t, "encoder_backward", "dwte", shape, g_dwte, dwte, (size_t)V * C);
    compare16f(t, "encoder_backward", "dwpe", shape, g_dwpe, dwpe, (size_t)Tn * C);
    gpu_drop(t, g_tok, (size_t)B * Tn * sizeof(int)); gpu_drop(t, g_wte, (size_t)V * C * 2);
    gpu_drop(t, g_wpe, (size_t)Tn * C * 2); gpu_drop(t, g_emb, BTC * 2);
    gpu_drop(t, g_dwte, (size_t)V * C * 4); gpu_drop(t, g_dwpe, (size_t)Tn * C * 4);
    free(tok); free(wte); free(wpe); free(emb); free(dwte); free(dwpe);

    /* cross-entropy over [N,Vp], and the vocab-parallel stats and grad of the whole row */
    snprintf(shape, sizeof shape, "N=%d V=%d Vp=%d", N, V, Vp);
    size_t NV = (size_t)N * Vp;
    uint16_t *lg = h16_rand(t, NV, 5.0f), *lg2 = xmalloc(NV * 2);
    memcpy(lg2, lg, NV * 2);
    int *tg = host_tokens(t, N, V);
    float *losses = host_nan(N), *stats = host_nan((size_t)N * 3), *lse = host_nan(N);
    void *g_lg = gpu_put(t, lg, NV * 2), *g_lg2 = gpu_put(t, lg, NV * 2);
    int *g_tg = gpu_put(t, tg, N * sizeof(int));
    float *g_losses = gpu_put(t, losses, N * 4), *g_stats = gpu_put(t, stats, (size_t)N * 12);
    float *g_lse = gpu_put(t, lse, N * 4);
    c16->ops->xent_stats(c16, stats, lg2, tg, N, 0, V, Vp);
    t->gpu.ops->xent_stats(&t->gpu, g_stats, g_lg2, g_tg, N, 0, V, Vp);
    compare16f(t, "xent_stats", "stats", shape, g_stats, stats, (size_t)N * 3);
    c16->ops->crossentropy(c16, losses, lg, tg, N, V, Vp, 1.0f / N);
    t->gpu.ops->crossentropy(&t->gpu, g_losses, g_lg, g_tg, N, V, Vp, 1.0f / N);
    compare16f(t, "crossentropy", "losses", shape, g_losses, losses, N);
    compare16(t, "crossentropy", "dlogits", shape, g_lg, lg, NV);
    c16->ops->xent_combine(c16, losses, lse, stats, N, 1);
    dev_from_host(&t->gpu, g_lse, lse, N * 4);
    c16->ops->xent_grad(c16, lg2, lse, tg, N, 0, V, Vp, 1.0f / N);
    t->gpu.ops->xent_grad(&t->gpu, g_lg2, g_lse, g_tg, N, 0, V, Vp, 1.0f / N);
    compare16(t, "xent_grad", "dlogits", shape, g_lg2, lg2, NV);
    gpu_drop(t, g_lg, NV * 2); gpu_drop(t, g_lg2, NV * 2); gpu_drop(t, g_tg, N * sizeof(int));
    gpu_drop(t, g_losses, N * 4); gpu_drop(t, g_stats, (size_t)N * 12); gpu_drop(t, g_lse, N * 4);
    free(lg); free(lg2); free(tg); free(losses); free(stats); free(lse);
}

static const char *groups[] = {
    "encoder", "layernorm", "matmul", "attention", "gelu/add/accumulate",
    "crossentropy", "xent_stats/combine/grad", "adamw", "sum/sumsq/norm_add/redo/pack", "zero sizes",
    "bf16 layernorm", "bf16 matmul", "bf16 attention", "bf16 elementwise/encoder/cross-entropy",
};

int main(void) {
    Test t;
    memset(&t, 0, sizeof t);
    t.rng = 0x9E3779B97F4A7C15ULL;
    char err[256] = "";
    if (dev_gpu_count() == 0 || dev_open(&t.gpu, DEV_CUDA, 0, err, sizeof err) != 0) {
#ifdef USE_CUDA
        const char *why = "no CUDA GPU visible; run on a GPU machine";
#else
        const char *why = "this build has no CUDA (nvcc was not found); run on a GPU machine";
#endif
        for (size_t i = 0; i < sizeof groups / sizeof groups[0]; i++) check_skip(&t.checks, tagged(groups[i]), why);
        return check_done(&t.checks);
    }
    dev_open(&t.cpu, DEV_CPU, 0, err, sizeof err);

    /* GPU_OR_EMU(call, gpu shape, emulation shape): under the CPU emulation
     * a shape that would cost seconds there is replaced by a smaller one
     * taking the same code path, as each comment says. */
#ifdef KERNELS_EMU
    const int emu_small = !getenv("KERNELS_EMU_FULL");
#else
    const int emu_small = 0;
#endif
#define GPU_OR_EMU(call, gpu, emu) (emu_small ? call emu : call gpu)

    test_encoder(&t, 3, 37, 45, 10, 0, 0);     /* few tokens: many positions share a dwte row */
    test_encoder(&t, 4, 256, 768, 5000, 0, 0);
    test_encoder(&t, 3, 37, 45, 10, 1, 1);     /* a vocabulary-parallel rank: tokens -1, no wpe */
    test_encoder(&t, 2, 33, 70, 7, 1, 0);
    test_encoder(&t, 2, 33, 70, 7, 0, 1);
    test_encoder(&t, 4, 256, 768, 16768, 1, 1);
    test_encoder(&t, 2, 64, 128, 300, 1, 0);   /* whole vectors: tokens -1 with wpe */

    test_layernorm(&t, 37, 45);
    test_layernorm(&t, 111, 40);
    test_layernorm(&t, 1, 1);
    test_layernorm(&t, 1024, 768);
    test_layernorm(&t, 3, 4000);  /* too wide for the one-pass backward's shared memory: two kernels */
    test_lnb_shapes(&t, &t.cpu);

    test_matmul(&t, 37, 45, 77, 1);
    test_matmul(&t, 37, 45, 77, 0);
    test_matmul(&t, 1, 1, 1, 1);
    test_matmul(&t, 5, 3, 130, 1);
    /* GPT-2 small's qkv projection; emulated, its proportions (OC = 3C),
     * 64x64 tiles in all three products (the emulated GPU's 108 SMs would
     * give dw's 18 x 6 the large tile at the GPU shape) */
    GPU_OR_EMU(test_matmul, (&t, 256, 768, 2304, 1), (&t, 128, 192, 576, 1));
    /* Each of these has more than 132 tiles of 128x128 in one product
     * (forward, dinp, dw in turn), so the large-tile kernel runs on an
     * H100 for all three operand layouts; the other products take 64x64.
     * Emulated (108 SMs): 11 x 10 = 110 >= 108 tiles, partial at both edges. */
    GPU_OR_EMU(test_matmul, (&t, 1500, 45, 1500, 1), (&t, 1290, 45, 1190, 1));
    GPU_OR_EMU(test_matmul, (&t, 1500, 1500, 45, 1), (&t, 1290, 1190, 45, 1));
    GPU_OR_EMU(test_matmul, (&t, 45, 1500, 1500, 1), (&t, 45, 1190, 1290, 1));

    test_attention(&t, 3, 37, 40, 5);    /* hs = 8: a warp spans several heads */
    test_attention(&t, 2, 64, 96, 3);
    test_attention(&t, 1, 130, 256, 2);  /* hs = 128 */
    GPU_OR_EMU(test_attention, (&t, 2, 256, 768, 12), (&t, 2, 128, 768, 12)); /* GPT-2 small's heads */
    GPU_OR_EMU(test_attention, (&t, 1, 1024, 64, 1), (&t, 1, 512, 64, 1));    /* the longest context */

    test_elementwise(&t, 1);
    test_elementwise(&t, 1000);
    GPU_OR_EMU(test_elementwise, (&t, 1000003), (&t, 100003)); /* not a multiple of 4: the scalar path */

    test_crossentropy(&t, 4, 50257, 50304);  /* GPT-2's vocabulary, padded */
    test_crossentropy(&t, 37, 45, 64);
    test_crossentropy(&t, 3, 1000, 1000);
    test_crossentropy(&t, 2, 1, 32);
    test_crossentropy(&t, 5, 29, 30);        /* a row not whole vectors: the scalar kernel */

    test_xent(&t, 37, 70, 3, 37, 0.0f);         /* nvalid 37, 33, 0 */
    test_xent(&t, 37, 70, 3, 37, -200.0f);      /* ... where not skipping rank 2 gives -inf */
    test_xent(&t, 5, 1, 3, 32, 0.0f);           /* nvalid 1, 0, 0 */
    test_xent(&t, 11, 1000, 3, 345, 0.0f);      /* nvalid 345, 345, 310 */
    test_xent(&t, 4, 50257, 3, 16768, 0.0f);    /* GPT-2's vocabulary on 3 ranks */
    test_xent(&t, 3, 50257, 1, 50304, 0.0f);    /* one rank: the whole padded row */

    test_adamw(&t, 7);
    GPU_OR_EMU(test_adamw, (&t, 1000003), (&t, 100003));
    test_adamw_segs(&t);

    test_sums(&t, 0);
    test_sums(&t, 1);
    test_sums(&t, 1000003);
    /* both past 1024 blocks of 256: the capped grid, several elements a thread */
    GPU_OR_EMU(test_sums, (&t, (size_t)1 << 24), (&t, (size_t)1 << 21));

    test_zero_sizes(&t);

    /* the bf16 tables: awkward sizes (the plain and scalar paths), aligned
     * ones (16-byte vectors, tensor cores, the fused attention) and GPT-2's */
    Dev c16;
    dev_open(&c16, DEV_CPU, 0, err, sizeof err);
    dev_set_dtype(&c16, DT_BF16);
    dev_set_dtype(&t.gpu, DT_BF16);
    test16_layernorm(&t, &c16, 37, 45);
    test16_layernorm(&t, &c16, 64, 256);
    test16_layernorm(&t, &c16, 1024, 768);
    test_lnb_shapes(&t, &c16);
    test16_matmul(&t, &c16, 37, 45, 77);
    test16_matmul(&t, &c16, 200, 72, 136);
    /* emulated: the qkv proportions, and test_gemm's emulated fc shape
     * (forward 2 x 3 tiles of 128, 9 k-tiles through the 4-stage pipeline) */
    GPU_OR_EMU(test16_matmul, (&t, &c16, 256, 768, 2304), (&t, &c16, 128, 192, 576));
    GPU_OR_EMU(test16_matmul, (&t, &c16, 1024, 3072, 768), (&t, &c16, 256, 288, 384));
    test16_attention(&t, &c16, 2, 37, 40, 5);    /* hs 8: the plain kernels */
    test16_attention(&t, &c16, 2, 37, 192, 3);   /* hs 64, ragged T: the fused ones */
    /* GPT-2's heads; emulated, T = 128: 2 x 2 tiles of 64, masked and not */
    GPU_OR_EMU(test16_attention, (&t, &c16, 1, 256, 768, 12), (&t, &c16, 1, 128, 768, 12));
    /* n not a multiple of 8: the scalar path; then 2^k: the vector path, and
     * GPT-2's padded vocabulary (emulated, wte [V,C] at C = 64) */
    GPU_OR_EMU(test16_rest, (&t, &c16, 1000003, 37, 45, 64, 45), (&t, &c16, 100003, 37, 45, 64, 45));
    GPU_OR_EMU(test16_rest, (&t, &c16, 1 << 20, 8, 50257, 50304, 768), (&t, &c16, 1 << 17, 8, 50257, 50304, 64));
    dev_set_dtype(&t.gpu, DT_F32);
    dev_close(&c16);

    check(&t.checks, t.gpu.bytes_live == 0, tagged("no leaks"), "%zu device bytes still live", t.gpu.bytes_live);
    dev_close(&t.gpu);
    dev_close(&t.cpu);
    return check_done(&t.checks);
}
