/* selftest.c: every op of a GPU's table against the CPU reference, on a
 * tiny problem, before step 1 of every --device cuda run.
 *
 * test/test_kernels.c checks the kernels thoroughly, where a GPU runs the
 * tests; this is its smoke alarm for the machine a run actually lands on,
 * in well under a second. The idea is the same: the CPU table is the
 * specification the kernels are held to, and each op runs on both devices
 * from the same seeded inputs:
 *  - sizes are awkward (N = B*T = 18 rows, a vocabulary of 130 padded to
 *    256, 72 and 77 output columns, counts that are no multiple of 8), and
 *    attention runs at a plain-kernel head size (16) and a fused one (64);
 *  - pure outputs start as NaN on the GPU, so an element never written
 *    shows; accumulated ones start from the same random values on both
 *    sides, so a kernel that overwrites instead of adding shows too;
 *  - each op is checked alone: a backward takes the reference's saved
 *    statistics (or, for attention, each side its own state), so the first
 *    failure names the op that is wrong, not the one that noticed.
 * The figure is max |gpu - cpu| / max |cpu| over an output, bounded per
 * dtype as test_kernels bounds it: 1e-4 where both sides compute in float32
 * and differ by summation order, 1e-2 where the table stores bf16 (one
 * bf16 rounding of an output is 2^-9). Ops whose inputs and outputs are
 * float32 in every table (accumulate, adamw, xent_combine, the sums) keep
 * 1e-4 in both.
 * Then a 2-layer GPT (gpt.c, C 64, 2 heads, the same vocabulary) runs one
 * forward and backward on both devices from the same initialisation and
 * batch: the loss and the gradient norm must agree within the same bounds.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "selftest.h"
#include "safe.h"
#include "gpt.h"

#define TOL_F32 1e-4   /* float32 on both sides: summation order only */
#define TOL_BF16 1e-2  /* bf16 storage: an output's rounding, 2^-9, and its neighbours' */

/* The problem: B sequences of T tokens, C channels, a vocabulary of V
 * padded to VP; OC1 and OC output columns, a multiple of 8 and not; NE a
 * count of elements that is no multiple of 8 (the elementwise kernels'
 * scalar tail). */
enum { B = 2, T = 9, N = B * T, C = 64, NH = 4, V = 130, VP = 256, OC1 = 72, OC = 77, NE = 1155 };
enum { MAX_BUFS = 256 };

typedef struct Selftest {
    Dev *gpu;                 /* the device under test: gpu->ops is the table checked */
    Dev cpu;                  /* the reference: the CPU's table of gpu->dtype */
    size_t esz;               /* bytes of an activation element */
    double tol;               /* the bound of ops that store the dtype */
    unsigned long long rng;   /* xorshift64* state */
    SelftestResult *res;
    void *gbuf[MAX_BUFS];     /* device buffers, freed at the end */
    size_t gbytes[MAX_BUFS];
    int ngbuf;
    void *hbuf[MAX_BUFS];     /* host buffers, freed at the end */
    int nhbuf;
} Selftest;

/* ---------------------------------------------------------------------------
 * Buffers: host ones hold the reference's inputs and outputs, device ones
 * copies of the inputs; all are freed together when the test ends. */

/* Uniform in [-1, 1). */
static float urand(Selftest *s) {
    s->rng ^= s->rng >> 12;
    s->rng ^= s->rng << 25;
    s->rng ^= s->rng >> 27;
    return (float)((double)((s->rng * 2685821657736338717ULL) >> 40) / 8388608.0 - 1.0);
}

static void *h_alloc(Selftest *s, size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p || s->nhbuf == MAX_BUFS) {
        fprintf(stderr, "self-test: out of host memory\n");
        exit(1);
    }
    return s->hbuf[s->nhbuf++] = p;
}

/* n float32 values uniform in [offset - scale, offset + scale). */
static float *h_f32(Selftest *s, size_t n, float scale, float offset) {
    float *x = h_alloc(s, n * 4);
    for (size_t i = 0; i < n; i++) x[i] = offset + scale * urand(s);
    return x;
}

static float *h_f32_nan(Selftest *s, size_t n) {
    float *x = h_alloc(s, n * 4);
    for (size_t i = 0; i < n; i++) x[i] = NAN;
    return x;
}

/* n activations in the table's dtype, from float32 values x. */
static void *h_act_from(Selftest *s, const float *x, size_t n) {
    void *a = h_alloc(s, n * s->esz);
    if (s->esz == 2)
        for (size_t i = 0; i < n; i++) ((uint16_t *)a)[i] = bf16_from_f32(x[i]);
    else
        memcpy(a, x, n * 4);
    return a;
}

static void *h_act(Selftest *s, size_t n, float scale, float offset) {
    return h_act_from(s, h_f32(s, n, scale, offset), n);
}

static void *h_act_nan(Selftest *s, size_t n) { return h_act_from(s, h_f32_nan(s, n), n); }

/* n tokens in [0, range). */
static int *h_tokens(Selftest *s, size_t n, int range) {
    int *x = h_alloc(s, n * sizeof(int));
    for (size_t i = 0; i < n; i++) {
        int v = (int)((urand(s) + 1.0f) * 0.5f * range);
        x[i] = v < range ? v : range - 1;
    }
    return x;
}

/* A device copy of bytes of host. */
static void *g_put(Selftest *s, const void *host, size_t bytes) {
    if (s->ngbuf == MAX_BUFS) {
        fprintf(stderr, "self-test: too many buffers\n");
        exit(1);
    }
    void *p = dev_alloc(s->gpu, bytes);
    if (host) dev_from_host(s->gpu, p, host, bytes);
    s->gbuf[s->ngbuf] = p;
    s->gbytes[s->ngbuf++] = bytes;
    return p;
}

static float widen(Selftest *s, const void *x, size_t i, int act) {
    if (act && s->esz == 2) return bf16_to_f32(((const uint16_t *)x)[i]);
    return ((const float *)x)[i];
}

/* ---------------------------------------------------------------------------
 * Comparisons. */

/* Records one figure: the worst so far, and the first failure. */
static int record(Selftest *s, const char *op, const char *what, double err, double tol) {
    SelftestResult *r = s->res;
    if (err > r->worst || isnan(err)) r->worst = isnan(err) ? INFINITY : err;
    if (err <= tol) return 1;
    if (!r->failed[0]) {
        snprintf(r->failed, sizeof r->failed, "%s (%s)", op, what);
        r->err = err;
        r->tol = tol;
    }
    return 0;
}

/* Compares n elements of device buffer got (activations of the dtype when
 * act, else float32) with the reference want on the host:
 * max |got - want| / max |want|, infinite where got holds a NaN want does
 * not (an element never written). */
static int compare(Selftest *s, const char *op, const char *what, const void *got_dev,
                   const void *want, size_t n, int act, double tol) {
    size_t bytes = n * (act ? s->esz : 4);
    void *got = h_alloc(s, bytes);
    dev_to_host(s->gpu, got, got_dev, bytes);
    double diff = 0.0, ref = 1e-6;
    for (size_t i = 0; i < n; i++) {
        double g = widen(s, got, i, act), w = widen(s, want, i, act);
        if (!!isnan(g) != !!isnan(w)) { diff = INFINITY; break; }
        if (fabs(g - w) > diff) diff = fabs(g - w);
        if (fabs(w) > ref) ref = fabs(w);
    }
    return record(s, op, what, diff / ref, tol);
}

/* An output in the dtype, and a float32 one computed from dtype inputs. */
static int cmp_act(Selftest *s, const char *op, const char *what, const void *got, const void *want, size_t n) {
    return compare(s, op, what, got, want, n, 1, s->tol);
}
static int cmp_f32(Selftest *s, const char *op, const char *what, const void *got, const void *want, size_t n) {
    return compare(s, op, what, got, want, n, 0, s->tol);
}
/* A float32 output of float32 inputs: the same arithmetic in every table. */
static int cmp_exact(Selftest *s, const char *op, const char *what, const void *got, const void *want, size_t n) {
    return compare(s, op, what, got, want, n, 0, TOL_F32);
}

/* ---------------------------------------------------------------------------
 * The ops, a group at a time. Each returns 0 when every output matched.
 * Shorthands: s->cpu's table is R, the GPU's is G. */

#define R (s->cpu.ops)
#define G (s->gpu->ops)
#define CPU (&s->cpu)
#define GPU (s->gpu)
#define A(n) ((size_t)(n) * s->esz)

/* The embedding, forward and backward; one token is -1 (not in this rank's
 * vocabulary slice). The GPU's backward goes through dev_embed_plan's plan,
 * as training runs it. */
static int test_encoder(Selftest *s) {
    int *tok = h_tokens(s, N, V);
    tok[4] = -1;
    void *wte = h_act(s, (size_t)VP * C, 1.0f, 0), *wpe = h_act(s, (size_t)T * C, 1.0f, 0);
    void *out = h_act_nan(s, (size_t)N * C);
    int *g_tok = g_put(s, tok, N * sizeof(int));
    void *g_wte = g_put(s, wte, A(VP * C)), *g_wpe = g_put(s, wpe, A(T * C));
    void *g_out = g_put(s, out, A(N * C));
    R->encoder_forward(CPU, out, tok, wte, wpe, B, T, C);
    G->encoder_forward(GPU, g_out, g_tok, g_wte, g_wpe, B, T, C);
    if (!cmp_act(s, "encoder_forward", "out", g_out, out, (size_t)N * C)) return -1;
    s->res->ops++;

    float *dwte = h_f32(s, (size_t)VP * C, 0.5f, 0), *dwpe = h_f32(s, (size_t)T * C, 0.5f, 0);
    void *dout = h_act(s, (size_t)N * C, 1.0f, 0);
    float *g_dwte = g_put(s, dwte, (size_t)VP * C * 4), *g_dwpe = g_put(s, dwpe, (size_t)T * C * 4);
    void *g_dout = g_put(s, dout, A(N * C));
    int *plan = h_alloc(s, (2 * N + 1) * sizeof(int));
    int runs = dev_embed_plan(tok, N, plan);
    int *g_plan = g_put(s, plan, ((size_t)runs + 1 + plan[runs]) * sizeof(int));
    R->encoder_backward(CPU, dwte, dwpe, dout, tok, NULL, -1, B, T, C);
    G->encoder_backward(GPU, g_dwte, g_dwpe, g_dout, g_tok, g_plan, runs, B, T, C);
    if (!cmp_f32(s, "encoder_backward", "dwte", g_dwte, dwte, (size_t)VP * C) ||
        !cmp_f32(s, "encoder_backward", "dwpe", g_dwpe, dwpe, (size_t)T * C))
        return -1;
    s->res->ops++;
    return 0;
}

/* LayerNorm forward, the fused residual add + LayerNorm, and the backward
 * from the reference's statistics. Rows have a mean away from 0. */
static int test_layernorm(Selftest *s) {
    const size_t NC = (size_t)N * C;
    void *inp = h_act(s, NC, 2.0f, 0.3f), *b2 = h_act(s, NC, 1.0f, 0);
    void *w = h_act(s, C, 1.0f, 0), *bias = h_act(s, C, 1.0f, 0);
    void *out = h_act_nan(s, NC), *res = h_act_nan(s, NC);
    float *mean = h_f32_nan(s, N), *rstd = h_f32_nan(s, N);
    void *g_inp = g_put(s, inp, A(NC)), *g_b2 = g_put(s, b2, A(NC));
    void *g_w = g_put(s, w, A(C)), *g_bias = g_put(s, bias, A(C));
    void *g_out = g_put(s, out, A(NC)), *g_res = g_put(s, res, A(NC));
    float *g_mean = g_put(s, mean, N * 4), *g_rstd = g_put(s, rstd, N * 4);
    R->layernorm_forward(CPU, out, mean, rstd, inp, w, bias, N, C);
    G->layernorm_forward(GPU, g_out, g_mean, g_rstd, g_inp, g_w, g_bias, N, C);
    if (!cmp_act(s, "layernorm_forward", "out", g_out, out, NC) ||
        !cmp_f32(s, "layernorm_forward", "mean", g_mean, mean, N) ||
        !cmp_f32(s, "layernorm_forward", "rstd", g_rstd, rstd, N))
        return -1;
    s->res->ops++;

    float *dw = h_f32(s, C, 0.5f, 0), *db = h_f32(s, C, 0.5f, 0);
    void *dout = h_act(s, NC, 1.0f, 0), *dinp = h_act(s, NC, 0.5f, 0);
    float *g_dw = g_put(s, dw, C * 4), *g_db = g_put(s, db, C * 4);
    void *g_dout = g_put(s, dout, A(NC)), *g_dinp = g_put(s, dinp, A(NC));
    dev_from_host(GPU, g_mean, mean, N * 4);
    dev_from_host(GPU, g_rstd, rstd, N * 4);
    R->layernorm_backward(CPU, dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    G->layernorm_backward(GPU, g_dinp, g_dw, g_db, g_dout, g_inp, g_w, g_mean, g_rstd, N, C);
    if (!cmp_act(s, "layernorm_backward", "dinp", g_dinp, dinp, NC) ||
        !cmp_f32(s, "layernorm_backward", "dw", g_dw, dw, C) ||
        !cmp_f32(s, "layernorm_backward", "db", g_db, db, C))
        return -1;
    s->res->ops++;

    float *mean2 = h_f32_nan(s, N), *rstd2 = h_f32_nan(s, N);
    float *g_mean2 = g_put(s, mean2, N * 4), *g_rstd2 = g_put(s, rstd2, N * 4);
    void *out2 = h_act_nan(s, NC);
    void *g_out2 = g_put(s, out2, A(NC));
    R->add_layernorm_forward(CPU, res, out2, mean2, rstd2, inp, b2, w, bias, N, C);
    G->add_layernorm_forward(GPU, g_res, g_out2, g_mean2, g_rstd2, g_inp, g_b2, g_w, g_bias, N, C);
    if (!cmp_act(s, "add_layernorm_forward", "res", g_res, res, NC) ||
        !cmp_act(s, "add_layernorm_forward", "out", g_out2, out2, NC) ||
        !cmp_f32(s, "add_layernorm_forward", "rstd", g_rstd2, rstd2, N))
        return -1;
    s->res->ops++;
    return 0;
}

/* The linear layer at N x C -> oc with a bias; backward writes dinp (NaN
 * before it) and accumulates dw and dbias. */
static int test_matmul_at(Selftest *s, int oc) {
    const size_t NC = (size_t)N * C, NO = (size_t)N * oc, OCC = (size_t)oc * C;
    void *inp = h_act(s, NC, 1.0f, 0), *w = h_act(s, OCC, 1.0f, 0), *bias = h_act(s, oc, 1.0f, 0);
    void *out = h_act_nan(s, NO);
    void *g_inp = g_put(s, inp, A(NC)), *g_w = g_put(s, w, A(OCC)), *g_bias = g_put(s, bias, A(oc));
    void *g_out = g_put(s, out, A(NO));
    R->matmul_forward(CPU, out, inp, w, bias, N, C, oc);
    G->matmul_forward(GPU, g_out, g_inp, g_w, g_bias, N, C, oc);
    if (!cmp_act(s, "matmul_forward", "out", g_out, out, NO)) return -1;

    void *dout = h_act(s, NO, 1.0f, 0), *dinp = h_act_nan(s, NC);
    float *dw = h_f32(s, OCC, 0.5f, 0), *dbias = h_f32(s, oc, 0.5f, 0);
    void *g_dout = g_put(s, dout, A(NO)), *g_dinp = g_put(s, dinp, A(NC));
    float *g_dw = g_put(s, dw, OCC * 4), *g_dbias = g_put(s, dbias, oc * 4);
    R->matmul_backward(CPU, dinp, dw, dbias, dout, inp, w, N, C, oc);
    G->matmul_backward(GPU, g_dinp, g_dw, g_dbias, g_dout, g_inp, g_w, N, C, oc);
    if (!cmp_act(s, "matmul_backward", "dinp", g_dinp, dinp, NC) ||
        !cmp_f32(s, "matmul_backward", "dw", g_dw, dw, OCC) ||
        !cmp_f32(s, "matmul_backward", "dbias", g_dbias, dbias, oc))
        return -1;

    /* the fused forms: fc's product and GELU of it (both outputs pure), and
     * an input gradient through GELU's derivative (dfch [N,C] pure, fch its
     * GELU input), without and with the bias gradient of fch's layer (dbias
     * [C] accumulated); tmp is scratch */
    void *out2 = h_act_nan(s, NO), *gout = h_act_nan(s, NO);
    void *g_out2 = g_put(s, out2, A(NO)), *g_gout = g_put(s, gout, A(NO));
    R->matmul_forward_gelu(CPU, out2, gout, inp, w, bias, N, C, oc);
    G->matmul_forward_gelu(GPU, g_out2, g_gout, g_inp, g_w, g_bias, N, C, oc);
    if (!cmp_act(s, "matmul_forward_gelu", "out", g_out2, out2, NO) ||
        !cmp_act(s, "matmul_forward_gelu", "gout", g_gout, gout, NO))
        return -1;
    void *fch = h_act(s, NC, 4.0f, 0), *tmp = h_act_nan(s, NC);
    void *g_fch = g_put(s, fch, A(NC)), *g_tmp = g_put(s, tmp, A(NC));
    float *fdb = h_f32(s, C, 0.5f, 0), *g_fdb = g_put(s, fdb, C * 4);
    for (int with_db = 0; with_db < 2; with_db++) {
        void *dfch = h_act_nan(s, NC), *g_dfch = g_put(s, dfch, A(NC));
        R->matmul_backward_gelu(CPU, dfch, with_db ? fdb : NULL, tmp, dout, w, fch, N, C, oc);
        G->matmul_backward_gelu(GPU, g_dfch, with_db ? g_fdb : NULL, g_tmp, g_dout, g_w, g_fch, N, C, oc);
        if (!cmp_act(s, "matmul_backward_gelu", "dfch", g_dfch, dfch, NC) ||
            (with_db && !cmp_f32(s, "matmul_backward_gelu", "dbias", g_fdb, fdb, C)))
            return -1;
    }
    return 0;
}

/* OC1 columns, a multiple of 8 (the bf16 table's tensor cores, partial
 * tiles), and OC (the path for rows that are not 16 bytes). */
static int test_matmul(Selftest *s) {
    if (test_matmul_at(s, OC1) || test_matmul_at(s, OC)) return -1;
    s->res->ops += 4;  /* matmul_forward, matmul_backward and the two fused forms */
    return 0;
}

/* Causal attention at channels c over nh heads. Each side keeps its own
 * state (probabilities, or a log-sum-exp a row); backward takes the
 * reference's out on both, as test_kernels does. */
static int test_attention_at(Selftest *s, int c, int nh) {
    const size_t BTC = (size_t)N * c, QKV = 3 * BTC;
    size_t sc = 0, gsc = 0;
    size_t st = R->attention_floats(B, T, c, nh, &sc), gst = G->attention_floats(B, T, c, nh, &gsc);
    void *qkv = h_act(s, QKV, 1.5f, 0), *out = h_act_nan(s, BTC);
    float *state = h_f32_nan(s, st), *scratch = h_f32_nan(s, sc);
    void *g_qkv = g_put(s, qkv, A(QKV)), *g_out = g_put(s, out, A(BTC));
    float *g_state = g_put(s, NULL, gst * 4), *g_scratch = g_put(s, NULL, gsc * 4);
    R->attention_forward(CPU, out, state, qkv, B, T, c, nh);
    G->attention_forward(GPU, g_out, g_state, g_qkv, B, T, c, nh);
    if (!cmp_act(s, "attention_forward", "out", g_out, out, BTC)) return -1;

    void *dout = h_act(s, BTC, 1.0f, 0), *dqkv = h_act_nan(s, QKV);   /* written: NaN before */
    void *g_dout = g_put(s, dout, A(BTC)), *g_dqkv = g_put(s, dqkv, A(QKV));
    dev_from_host(GPU, g_out, out, A(BTC));
    R->attention_backward(CPU, dqkv, scratch, dout, qkv, out, state, B, T, c, nh);
    G->attention_backward(GPU, g_dqkv, g_scratch, g_dout, g_qkv, g_out, g_state, B, T, c, nh);
    return cmp_act(s, "attention_backward", "dqkv", g_dqkv, dqkv, QKV) ? 0 : -1;
}

/* Head size 16 (the plain kernels in both tables) and 64 (the bf16 table's
 * fused flash kernels). */
static int test_attention(Selftest *s) {
    if (test_attention_at(s, C, NH) || test_attention_at(s, 2 * C, 2)) return -1;
    s->res->ops += 2;
    return 0;
}

/* gelu, add, accumulate, cast and widen on NE elements. */
static int test_elementwise(Selftest *s) {
    void *x = h_act(s, NE, 4.0f, 0), *y = h_act(s, NE, 1.0f, 0), *out = h_act_nan(s, NE);
    void *dx = h_act(s, NE, 0.5f, 0);
    void *g_x = g_put(s, x, A(NE)), *g_y = g_put(s, y, A(NE)), *g_out = g_put(s, out, A(NE));
    void *g_dx = g_put(s, dx, A(NE));
    R->gelu_forward(CPU, out, x, NE);
    G->gelu_forward(GPU, g_out, g_x, NE);
    if (!cmp_act(s, "gelu_forward", "out", g_out, out, NE)) return -1;
    R->gelu_backward(CPU, dx, x, y, NE);
    G->gelu_backward(GPU, g_dx, g_x, g_y, NE);
    if (!cmp_act(s, "gelu_backward", "dinp", g_dx, dx, NE)) return -1;
    void *sum = h_act_nan(s, NE);
    void *g_sum = g_put(s, sum, A(NE));
    R->add(CPU, sum, x, y, NE);
    G->add(GPU, g_sum, g_x, g_y, NE);
    if (!cmp_act(s, "add", "out", g_sum, sum, NE)) return -1;

    float *dst = h_f32(s, NE, 1.0f, 0), *src = h_f32(s, NE, 3.0f, 0);
    float *g_dst = g_put(s, dst, NE * 4), *g_src = g_put(s, src, NE * 4);
    R->accumulate(CPU, dst, src, NE);
    G->accumulate(GPU, g_dst, g_src, NE);
    if (!cmp_exact(s, "accumulate", "dst", g_dst, dst, NE)) return -1;
    void *cast = h_act_nan(s, NE);
    void *g_cast = g_put(s, cast, A(NE));
    R->cast(CPU, cast, src, NE);
    G->cast(GPU, g_cast, g_src, NE);
    if (!cmp_act(s, "cast", "out", g_cast, cast, NE)) return -1;
    float *wide = h_f32_nan(s, NE);
    float *g_wide = g_put(s, wide, NE * 4);
    R->widen(CPU, wide, x, NE);
    G->widen(GPU, g_wide, g_x, NE);
    if (!cmp_f32(s, "widen", "out", g_wide, wide, NE)) return -1;
    s->res->ops += 6;
    return 0;
}

/* The fused cross-entropy over [N, VP] (padding random: it must become 0),
 * then the vocabulary-parallel one as two ranks of 128 columns hold it:
 * rank 0 all real, rank 1 two real columns and 126 of padding. */
static int test_crossentropy(Selftest *s) {
    const size_t NV = (size_t)N * VP;
    const float dloss = 1.0f / N;
    void *lg = h_act(s, NV, 5.0f, 0);
    int *tg = h_tokens(s, N, V);
    float *losses = h_f32_nan(s, N);
    void *g_lg = g_put(s, lg, A(NV));
    int *g_tg = g_put(s, tg, N * sizeof(int));
    float *g_losses = g_put(s, losses, N * 4);
    R->crossentropy(CPU, losses, lg, tg, N, V, VP, dloss);
    G->crossentropy(GPU, g_losses, g_lg, g_tg, N, V, VP, dloss);
    if (!cmp_f32(s, "crossentropy", "losses", g_losses, losses, N) ||
        !cmp_act(s, "crossentropy", "dlogits", g_lg, lg, NV))
        return -1;
    s->res->ops++;

    enum { RANKS = 2, VL = VP / RANKS };
    void *slice[RANKS], *g_slice[RANKS];
    float *gathered = h_f32_nan(s, (size_t)RANKS * N * 3);  /* the reference's stats, [R,N,3] */
    for (int r = 0; r < RANKS; r++) {
        int v0 = r * VL, nvalid = V - v0 < VL ? V - v0 : VL;
        slice[r] = h_act(s, (size_t)N * VL, 5.0f, 0);
        g_slice[r] = g_put(s, slice[r], A(N * VL));
        float *stats = gathered + (size_t)r * N * 3;
        float *g_stats = g_put(s, h_f32_nan(s, (size_t)N * 3), (size_t)N * 12);
        R->xent_stats(CPU, stats, slice[r], tg, N, v0, nvalid, VL);
        G->xent_stats(GPU, g_stats, g_slice[r], g_tg, N, v0, nvalid, VL);
        if (!cmp_f32(s, "xent_stats", "stats", g_stats, stats, (size_t)N * 3)) return -1;
    }
    float *lse = h_f32_nan(s, N);
    float *g_gathered = g_put(s, gathered, (size_t)RANKS * N * 12);
    float *g_lse = g_put(s, lse, N * 4);
    R->xent_combine(CPU, losses, lse, gathered, N, RANKS);
    G->xent_combine(GPU, g_losses, g_lse, g_gathered, N, RANKS);
    if (!cmp_exact(s, "xent_combine", "losses", g_losses, losses, N) ||
        !cmp_exact(s, "xent_combine", "lse", g_lse, lse, N))
        return -1;
    dev_from_host(GPU, g_lse, lse, N * 4);
    for (int r = 0; r < RANKS; r++) {
        int v0 = r * VL, nvalid = V - v0 < VL ? V - v0 : VL;
        R->xent_grad(CPU, slice[r], lse, tg, N, v0, nvalid, VL, dloss);
        G->xent_grad(GPU, g_slice[r], g_lse, g_tg, N, v0, nvalid, VL, dloss);
        if (!cmp_act(s, "xent_grad", "dlogits", g_slice[r], slice[r], (size_t)N * VL)) return -1;
    }
    s->res->ops += 3;
    return 0;
}

/* One AdamW step with decay and a gradient scale, then the one-launch
 * form over segments (one empty) against the reference's adamw on each;
 * then the two sums, relative to the sum of |x| and to the sum of squares. */
static int test_optimizer(Selftest *s) {
    const float lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, scale = 0.5f;
    const float bc1 = 1.0f - b1, bc2 = 1.0f - b2;  /* step 1 */
    float *p = h_f32(s, NE, 1.0f, 0), *g = h_f32(s, NE, 0.1f, 0);
    float *m = h_f32(s, NE, 0.01f, 0), *v = h_f32(s, NE, 1e-4f, 0);
    for (int i = 0; i < NE; i++) v[i] = fabsf(v[i]);
    float *g_p = g_put(s, p, NE * 4), *g_g = g_put(s, g, NE * 4);
    float *g_m = g_put(s, m, NE * 4), *g_v = g_put(s, v, NE * 4);
    R->adamw(CPU, p, g, m, v, NE, lr, b1, b2, eps, wd, bc1, bc2, scale);
    G->adamw(GPU, g_p, g_g, g_m, g_v, NE, lr, b1, b2, eps, wd, bc1, bc2, scale);
    if (!cmp_exact(s, "adamw", "param", g_p, p, NE) || !cmp_exact(s, "adamw", "m", g_m, m, NE) ||
        !cmp_exact(s, "adamw", "v", g_v, v, NE))
        return -1;

    static const size_t sizes[] = {7, 0, 300, NE - 307};
    enum { NS = sizeof sizes / sizeof sizes[0] };
    AdamSeg segs[NS];
    size_t off = 0;
    for (int k = 0; k < NS; k++) {
        float wdk = k % 2 ? 0.0f : wd;
        segs[k] = (AdamSeg){g_p + off, g_g + off, g_m + off, g_v + off, sizes[k], wdk, NULL};
        R->adamw(CPU, p + off, g + off, m + off, v + off, sizes[k], lr, b1, b2, eps, wdk,
                 0.19f, 0.0975f, scale);  /* step 2 */
        off += sizes[k];
    }
    G->adamw_segs(GPU, segs, NS, lr, b1, b2, eps, 0.19f, 0.0975f, scale);
    if (!cmp_exact(s, "adamw_segs", "param", g_p, p, NE) ||
        !cmp_exact(s, "adamw_segs", "m", g_m, m, NE) || !cmp_exact(s, "adamw_segs", "v", g_v, v, NE))
        return -1;

    double sum_abs = 0;
    for (int i = 0; i < NE; i++) sum_abs += fabs(p[i]);
    double want_sq = R->sumsq(CPU, p, NE), want = R->sum(CPU, p, NE);
    double got_sq = G->sumsq(GPU, g_p, NE), got = G->sum(GPU, g_p, NE);
    if (!record(s, "sumsq", "sum", fabs(got_sq - want_sq) / want_sq, TOL_F32) ||
        !record(s, "sum", "sum", fabs(got - want) / sum_abs, TOL_F32))
        return -1;
    s->res->ops += 4;
    return 0;
}

/* ---------------------------------------------------------------------------
 * The whole model: 2 layers, C 64 in 2 heads (head size 32: the bf16
 * table's fused attention), the same vocabulary, one forward and backward
 * of B x T tokens from the same initialisation on both devices. */

/* Loss and gradient norm of one step of cfg on dev. */
static void model_step(Dev *dev, const GPTConfig *cfg, const int *tok, const int *tg,
                       double *loss, double *norm) {
    GPT m;
    GPTShard whole = gpt_whole(cfg);
    gpt_build(&m, cfg, dev, &whole);
    gpt_init_random(&m, 1337);
    GPTActs *a = gpt_acts_build(&m, B, T);
    gpt_set_batch(&m, a, tok, tg, B, T);
    *loss = gpt_forward_backward(&m, a, B, T, 1.0f / N);
    *norm = sqrt(dev->ops->sumsq(dev, m.grads, m.num_params));
    gpt_acts_free(&m, a);
    gpt_free(&m);
}

static int test_model(Selftest *s) {
    GPTConfig cfg = {.max_seq = 16, .vocab = V, .layers = 2, .heads = 2, .dim = C};
    char err[256];
    if (gpt_config_check(&cfg, err, sizeof err) != 0) {
        fprintf(stderr, "self-test: %s\n", err);
        exit(1);
    }
    int *tok = h_tokens(s, N, V), *tg = h_tokens(s, N, V);
    double loss, norm, g_loss, g_norm;
    model_step(CPU, &cfg, tok, tg, &loss, &norm);
    model_step(GPU, &cfg, tok, tg, &g_loss, &g_norm);
    if (!record(s, "gpt 2-layer step", "loss", fabs(g_loss - loss) / fabs(loss), s->tol) ||
        !record(s, "gpt 2-layer step", "gradient norm", fabs(g_norm - norm) / norm, s->tol))
        return -1;
    s->res->model_layers = cfg.layers;
    return 0;
}

#undef R
#undef G
#undef CPU
#undef GPU
#undef A

/* ---------------------------------------------------------------------------
 * Running it, and its line. */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int selftest_run(Dev *d, SelftestResult *res) {
    double t0 = now_s();
    memset(res, 0, sizeof *res);
    res->dtype = d->dtype;
    Selftest *s = safe_calloc(1, sizeof *s, "the self-test");
    char err[128];
    s->gpu = d;
    s->res = res;
    s->esz = dt_size(d->dtype);
    s->tol = d->dtype == DT_BF16 ? TOL_BF16 : TOL_F32;
    s->rng = 0x9E3779B97F4A7C15ULL;
    dev_open(&s->cpu, DEV_CPU, 0, err, sizeof err);
    dev_set_dtype(&s->cpu, d->dtype);
    size_t peak = d->bytes_peak;
    int (*const groups[])(Selftest *) = {test_encoder, test_layernorm, test_matmul, test_attention,
                                         test_elementwise, test_crossentropy, test_optimizer,
                                         test_model};
    int rc = 0;
    for (size_t i = 0; i < sizeof groups / sizeof groups[0] && rc == 0; i++) rc = groups[i](s);
    dev_sync(d);
    for (int i = 0; i < s->ngbuf; i++) dev_free(d, s->gbuf[i], s->gbytes[i]);
    for (int i = 0; i < s->nhbuf; i++) free(s->hbuf[i]);
    d->bytes_peak = peak;  /* the run's own high-water mark starts after this */
    dev_close(&s->cpu);
    free(s);
    res->seconds = now_s() - t0;
    return rc;
}

void selftest_line(const SelftestResult *res, Dev *d, char *buf, size_t len) {
    char gpu[256];
    dev_name(d, gpu, sizeof gpu);
    if (res->failed[0])
        snprintf(buf, len, "error: self-test: kernel %s differs from the CPU reference: "
                 "rel. error %.1e > tolerance %.0e (GPU %s)", res->failed, res->err, res->tol, gpu);
    else
        snprintf(buf, len, "self-test: %d kernels and a %d-layer step match the CPU "
                 "(worst rel. error %.1e, %s, %.2f s)", res->ops, res->model_layers, res->worst,
                 dt_name(res->dtype), res->seconds);
}

int selftest_startup(Dev *d, int say) {
    SelftestResult res;
    char line[512];
    int rc = selftest_run(d, &res);
    selftest_line(&res, d, line, sizeof line);
    if (rc != 0) fprintf(stderr, "%s\n", line);
    else if (say) printf("%s\n", line);
    fflush(stdout);
    return rc;
}
