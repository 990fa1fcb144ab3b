/* ops_bf16.c: the CPU reference with bf16 storage (cpu_bf16_ops).
 *
 * Mixed precision on a GPU (--dtype bf16) stores activations and the
 * compute copy of the parameters as bfloat16, computes in float32 and rounds
 * each output once, when it is stored; the master parameters, their
 * gradients, Adam's moments, LayerNorm statistics and losses stay float32
 * (the ZeRO paper's mixed-precision accounting; DESIGN.md, "Numbers").
 *
 * This table does the same arithmetic on the CPU: each op widens its bf16
 * inputs to float32, runs the float32 reference of ops.c, and rounds its
 * bf16 outputs to nearest even. So the whole bf16 data path of gpt.c, and
 * every parallel layout's handling of it (bf16 activations sent between
 * pipeline stages, all-reduced in tensor-parallel groups), runs and is
 * tested in CI on a machine without a GPU, and the CUDA bf16 kernels have a
 * reference with the same rounding points. It is a specification, not a
 * fast path: every call allocates float32 copies of its operands.
 *
 * "Accumulates" keeps its meaning: an accumulated bf16 output is widened,
 * added to in float32, and rounded once.
 */
#include <stdio.h>
#include <stdlib.h>
#include "ops.h"

/* A new float32 buffer of n zeros. */
static float *zeros(size_t n) {
    float *f = calloc(n + 1, sizeof(float));
    if (!f) { fprintf(stderr, "error: out of host memory (%zu floats)\n", n); exit(1); }
    return f;
}

/* n bf16 values widened into a new float32 buffer (NULL stays NULL). */
static float *wide(const void *src, size_t n) {
    if (!src) return NULL;
    float *f = zeros(n);  /* zeroed: gcc cannot see the loop fills it */
    const uint16_t *h = src;
    for (size_t i = 0; i < n; i++) f[i] = bf16_to_f32(h[i]);
    return f;
}

/* f [n] rounded into dst (bf16), then freed. */
static void narrow_free(void *dst, float *f, size_t n) {
    uint16_t *h = dst;
    for (size_t i = 0; i < n; i++) h[i] = bf16_from_f32(f[i]);
    free(f);
}

static void b_encoder_forward(Dev *d, void *out, const int *tok, const void *wte, const void *wpe,
                              int B, int T, int C) {
    /* the whole tables: a token may be any row; a position any of T rows */
    int Vmax = 0;
    for (int i = 0; i < B * T; i++) if (tok[i] + 1 > Vmax) Vmax = tok[i] + 1;
    size_t n = (size_t)B * T * C;
    float *fo = malloc(n * sizeof(float) + 1), *fte = wide(wte, (size_t)Vmax * C);
    float *fpe = wide(wpe, (size_t)T * C);
    cpu_encoder_forward(d, fo, tok, fte, fpe, B, T, C);
    narrow_free(out, fo, n);
    free(fte);
    free(fpe);
}

static void b_encoder_backward(Dev *d, float *dwte, float *dwpe, const void *dout, const int *tok,
                               const int *plan, int runs, int B, int T, int C) {
    float *g = wide(dout, (size_t)B * T * C);
    cpu_encoder_backward(d, dwte, dwpe, g, tok, B, T, C);
    free(g);
}

static void b_layernorm_forward(Dev *d, void *out, float *mean, float *rstd, const void *inp,
                                const void *w, const void *b, int N, int C) {
    size_t n = (size_t)N * C;
    float *fo = malloc(n * sizeof(float) + 1), *fx = wide(inp, n), *fw = wide(w, C), *fb = wide(b, C);
    cpu_layernorm_forward(d, fo, mean, rstd, fx, fw, fb, N, C);
    narrow_free(out, fo, n);
    free(fx); free(fw); free(fb);
}

static void b_layernorm_backward(Dev *d, void *dinp, float *dw, float *db, const void *dout,
                                 const void *inp, const void *w, const float *mean,
                                 const float *rstd, int N, int C) {
    size_t n = (size_t)N * C;
    float *fdx = wide(dinp, n), *fg = wide(dout, n), *fx = wide(inp, n), *fw = wide(w, C);
    cpu_layernorm_backward(d, fdx, dw, db, fg, fx, fw, mean, rstd, N, C);
    if (dinp) narrow_free(dinp, fdx, n);
    free(fg); free(fx); free(fw);
}

/* The residual is rounded to bf16 before the LayerNorm reads it, as the
 * fused kernel normalises the value it stores. */
static void b_add_layernorm_forward(Dev *d, void *res, void *out, float *mean, float *rstd,
                                    const void *a, const void *b, const void *w, const void *bias,
                                    int N, int C) {
    size_t n = (size_t)N * C;
    float *fa = wide(a, n), *fb = wide(b, n);
    for (size_t i = 0; i < n; i++) fa[i] = bf16_round(fa[i] + fb[i]);
    float *fo = malloc(n * sizeof(float) + 1), *fw = wide(w, C), *fbias = wide(bias, C);
    cpu_layernorm_forward(d, fo, mean, rstd, fa, fw, fbias, N, C);
    narrow_free(res, fa, n);
    narrow_free(out, fo, n);
    free(fb); free(fw); free(fbias);
}

static void b_matmul_forward(Dev *d, void *out, const void *inp, const void *w, const void *bias,
                             int N, int C, int OC) {
    size_t no = (size_t)N * OC;
    float *fo = malloc(no * sizeof(float) + 1), *fx = wide(inp, (size_t)N * C);
    float *fw = wide(w, (size_t)OC * C), *fb = wide(bias, OC);
    cpu_matmul_forward(d, fo, fx, fw, fb, N, C, OC);
    narrow_free(out, fo, no);
    free(fx); free(fw); free(fb);
}

static void b_matmul_backward(Dev *d, void *dinp, float *dw, float *dbias, const void *dout,
                              const void *inp, const void *w, int N, int C, int OC) {
    size_t ni = (size_t)N * C;
    float *fdx = dinp ? zeros(ni) : NULL;  /* written: nothing to widen */
    float *fg = wide(dout, (size_t)N * OC), *fx = wide(inp, ni);
    float *fw = dinp ? wide(w, (size_t)OC * C) : NULL;  /* only the input gradient reads w */
    cpu_matmul_backward(d, fdx, dw, dbias, fg, fx, fw, N, C, OC);
    if (dinp) narrow_free(dinp, fdx, ni);
    free(fg); free(fx); free(fw);
}

static void b_attention_forward(Dev *d, void *out, float *state, const void *qkv, int B, int T,
                                int C, int NH) {
    size_t n = (size_t)B * T * C;
    float *fo = malloc(n * sizeof(float) + 1), *fq = wide(qkv, 3 * n);
    cpu_attention_forward(d, fo, state, fq, B, T, C, NH);
    narrow_free(out, fo, n);
    free(fq);
}

static void b_attention_backward(Dev *d, void *dqkv, float *scratch, const void *dout,
                                 const void *qkv, const void *out, const float *state, int B,
                                 int T, int C, int NH) {
    size_t n = (size_t)B * T * C;
    float *fd = zeros(3 * n), *fg = wide(dout, n), *fq = wide(qkv, 3 * n);  /* dqkv written: nothing to widen */
    cpu_attention_backward(d, fd, scratch, fg, fq, state, B, T, C, NH);
    narrow_free(dqkv, fd, 3 * n);
    free(fg); free(fq);
}

static void b_matmul_forward_gelu(Dev *d, void *out, void *gout, const void *inp, const void *w, const void *bias,
                                  int N, int C, int OC) {
    ops_matmul_forward_gelu_seq(&cpu_bf16_ops, d, out, gout, inp, w, bias, N, C, OC);
}

static void b_matmul_backward_gelu(Dev *d, void *dfch, float *dbias, void *tmp, const void *dout, const void *w,
                                   const void *fch, int N, int C, int OC) {
    ops_matmul_backward_gelu_seq(&cpu_bf16_ops, d, dfch, dbias, tmp, dout, w, fch, N, C, OC);
}

static void b_gelu_forward(Dev *d, void *out, const void *inp, size_t n) {
    float *fx = wide(inp, n), *fo = malloc(n * sizeof(float) + 1);
    cpu_gelu_forward(d, fo, fx, n);
    narrow_free(out, fo, n);
    free(fx);
}

static void b_gelu_backward(Dev *d, void *dinp, const void *inp, const void *dout, size_t n) {
    float *fdx = wide(dinp, n), *fx = wide(inp, n), *fg = wide(dout, n);
    cpu_gelu_backward(d, fdx, fx, fg, n);
    narrow_free(dinp, fdx, n);
    free(fx); free(fg);
}

static void b_add(Dev *d, void *out, const void *a, const void *b, size_t n) {
    float *fa = wide(a, n), *fb = wide(b, n);
    cpu_add(d, fa, fa, fb, n);
    narrow_free(out, fa, n);
    free(fb);
}

static void b_cast(Dev *d, void *dst, const float *src, size_t n) {
    uint16_t *h = dst;
    for (size_t i = 0; i < n; i++) h[i] = bf16_from_f32(src[i]);
}

static void b_widen(Dev *d, float *dst, const void *src, size_t n) {
    const uint16_t *h = src;
    for (size_t i = 0; i < n; i++) dst[i] = bf16_to_f32(h[i]);
}

static void b_crossentropy(Dev *d, float *losses, void *logits, const int *targets, int N, int V,
                           int Vp, float dloss) {
    size_t n = (size_t)N * Vp;
    float *fz = wide(logits, n);
    cpu_crossentropy(d, losses, fz, targets, N, V, Vp, dloss);
    if (dloss != 0) narrow_free(logits, fz, n);
    else free(fz);
}

static void b_xent_stats(Dev *d, float *stats, const void *logits, const int *targets, int N,
                         int v0, int nvalid, int Vl) {
    float *fz = wide(logits, (size_t)N * Vl);
    cpu_xent_stats(d, stats, fz, targets, N, v0, nvalid, Vl);
    free(fz);
}

static void b_xent_grad(Dev *d, void *logits, const float *lse, const int *targets, int N, int v0,
                        int nvalid, int Vl, float dloss) {
    size_t n = (size_t)N * Vl;
    float *fz = wide(logits, n);
    cpu_xent_grad(d, fz, lse, targets, N, v0, nvalid, Vl, dloss);
    narrow_free(logits, fz, n);
}

const Ops cpu_bf16_ops = {
    .dtype = DT_BF16,
    .name = "cpu bf16",
    .encoder_forward = b_encoder_forward,
    .encoder_backward = b_encoder_backward,
    .layernorm_forward = b_layernorm_forward,
    .layernorm_backward = b_layernorm_backward,
    .add_layernorm_forward = b_add_layernorm_forward,
    .matmul_forward = b_matmul_forward,
    .matmul_forward_gelu = b_matmul_forward_gelu,
    .matmul_backward = b_matmul_backward,
    .matmul_backward_gelu = b_matmul_backward_gelu,
    .attention_forward = b_attention_forward,
    .attention_backward = b_attention_backward,
    .attention_floats = cpu_attention_floats,
    .gelu_forward = b_gelu_forward,
    .gelu_backward = b_gelu_backward,
    .add = b_add,
    .accumulate = cpu_accumulate,
    .cast = b_cast,
    .widen = b_widen,
    .crossentropy = b_crossentropy,
    .xent_stats = b_xent_stats,
    .xent_combine = cpu_xent_combine,
    .xent_grad = b_xent_grad,
    .adamw = cpu_adamw,
    .adamw_segs = cpu_adamw_segs,
    .sumsq = cpu_sumsq,
    .sum = cpu_sum,
    .norm_add = cpu_norm_add,
    .norm_redo = cpu_norm_redo,
    .norm_pack = cpu_norm_pack,
};
