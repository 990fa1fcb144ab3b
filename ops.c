/* ops.c: the plain-C reference of every op of the GPT-2 (CPU, OpenMP).
 *
 * This file is the specification: kernels.cu is tested against it, and it is
 * tested against finite differences (test/test_ops.c) and, through the whole
 * model, against PyTorch (test/reference.py). It is also what CI trains with
 * and what people without a GPU use. Forward and backward of each op sit
 * side by side, as in llm.c, each op as the loops that say what it computes.
 *
 * The matrix products are the exception, being most of a step's time (the
 * linears' 86% of GPT-2 124M's step: docs/cpu.md): the linear layer and
 * attention each have their plain loops, cpu_matmul_forward_naive and friends
 * (llm.c's matmul_forward_naive), written first, and beside them the op
 * `train` runs, cpu_matmul_forward and friends, which hands the same products
 * to gemm.c's packed, register-blocked GEMM as strided views (nothing is
 * transposed in memory). test/test_cpu_gemm.c holds each fast op to its
 * plain loops.
 *
 * Every function is named as its callers name it: grep finds the definition
 * of cpu_layernorm_forward at "void cpu_layernorm_forward(". The table
 * gpt.c calls through (cpu_ops, at the end; tensor.h's Ops) points at them.
 *
 * Two builds of this one file:
 *  - float32, `real` = float: what `train` runs; the functions are
 *    extern (ops.h), and cpu_ops and ops_bf16.c's cpu_bf16_ops wrap them;
 *  - float64, OPS_REAL defined as double: the same loops in double, for the
 *    finite-difference tests, whose differences are then accurate to ~1e-9.
 *    A test includes this file after `#define OPS_REAL double`
 *    (test/test_ops.c, test/exact64.c); every function is then static to
 *    it (OPS_PUBLIC below), so the test links ops.o's float32 ones beside.
 *    The fast paths and the gradient norm's float32 bit passes are left out.
 * Every loop that writes a shared output is split so that each output
 * element is summed by one thread in a fixed order: the result does not
 * depend on the thread count, which is what lets the parallel layouts of
 * the articles be compared with one rank exactly.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "tensor.h"
#include "gemm.h"

#ifdef OPS_REAL
typedef OPS_REAL real;
#define OPS_PUBLIC static __attribute__((unused))  /* the including test's own */
#else
typedef float real;
#define OPS_PUBLIC         /* ops.o: extern, as ops.h declares */
#include "ops.h"
#endif

/* Type-generic math for the two builds: float calls stay float. */
#ifdef OPS_REAL
#define R_EXP(x)  ((real)exp((double)(x)))
#define R_SQRT(x) ((real)sqrt((double)(x)))
#define R_FMA(a, b, c) fma(a, b, c)
#else
#define R_EXP(x)  exp_f32((float)(x))  /* below, before attention */
#define R_SQRT(x) sqrtf((float)(x))   /* one instruction: ops.o is built with -fno-math-errno */
#define R_FMA(a, b, c) fmaf(a, b, c)
#endif

/* ---------------------------------------------------------------------------
 * Embedding: token row plus position row. */

OPS_PUBLIC
void cpu_encoder_forward(Dev *d, real *out, const int *tokens, const real *wte, const real *wpe,
                         int B, int T, int C) {
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            real *o = out + ((size_t)b * T + t) * C;  /* [C] */
            int tok = tokens[b * T + t];
            const real *te = tok >= 0 ? wte + (size_t)tok * C : NULL;  /* [C] */
            const real *pe = wpe ? wpe + (size_t)t * C : NULL;         /* [C] */
            for (int c = 0; c < C; c++) o[c] = (te ? te[c] : 0) + (pe ? pe[c] : 0);
        }
    }
}

/* Several positions may hold the same token, so threads split the channels,
 * never the positions: each dwte element is summed by one thread in order. */
OPS_PUBLIC
void cpu_encoder_backward(Dev *d, real *dwte, real *dwpe, const real *dout, const int *tokens,
                          int B, int T, int C) {
    #pragma omp parallel for
    for (int c0 = 0; c0 < C; c0 += 16) {
        int c1 = c0 + 16 < C ? c0 + 16 : C;
        for (int b = 0; b < B; b++) {
            for (int t = 0; t < T; t++) {
                const real *g = dout + ((size_t)b * T + t) * C;
                int tok = tokens[b * T + t];
                if (tok >= 0) {
                    real *dte = dwte + (size_t)tok * C;
                    for (int c = c0; c < c1; c++) dte[c] += g[c];
                }
                if (dwpe) {
                    real *dpe = dwpe + (size_t)t * C;
                    for (int c = c0; c < c1; c++) dpe[c] += g[c];
                }
            }
        }
    }
}

/* ---------------------------------------------------------------------------
 * LayerNorm over the channels of each row, eps 1e-5, biased variance. */

OPS_PUBLIC
void cpu_layernorm_forward(Dev *d, real *out, real *mean, real *rstd, const real *inp,
                           const real *w, const real *b, int N, int C) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const real *x = inp + (size_t)n * C;  /* [C] */
        real *o = out + (size_t)n * C;        /* [C] */
        double s = 0.0;
        #pragma omp simd reduction(+:s)
        for (int c = 0; c < C; c++) s += x[c];
        real m = (real)(s / C);
        double v = 0.0;
        #pragma omp simd reduction(+:v)
        for (int c = 0; c < C; c++) { double dx = x[c] - m; v += dx * dx; }
        real r = (real)(1.0 / sqrt(v / C + 1e-5));
        #pragma omp simd
        for (int c = 0; c < C; c++) o[c] = (x[c] - m) * r * w[c] + b[c];
        mean[n] = m;
        rstd[n] = r;
    }
}

OPS_PUBLIC
void cpu_layernorm_backward(Dev *d, real *dinp, real *dw, real *db, const real *dout,
                            const real *inp, const real *w, const real *mean, const real *rstd,
                            int N, int C) {
    /* dinp: rows are independent. NULL: the weights' gradients alone. */
    int drows = dinp ? N : 0;
    #pragma omp parallel for
    for (int n = 0; n < drows; n++) {
        const real *g = dout + (size_t)n * C;
        const real *x = inp + (size_t)n * C;
        real *dx = dinp + (size_t)n * C;
        real m = mean[n], r = rstd[n];
        double gsum = 0.0, gnsum = 0.0;  /* mean of dnorm and of dnorm * norm */
        #pragma omp simd reduction(+:gsum, gnsum)
        for (int c = 0; c < C; c++) {
            real dnorm = g[c] * w[c];
            gsum += dnorm;
            gnsum += dnorm * (x[c] - m) * r;
        }
        real gmean = (real)(gsum / C), gnmean = (real)(gnsum / C);
        #pragma omp simd
        for (int c = 0; c < C; c++) {
            real norm = (x[c] - m) * r;
            dx[c] += (g[c] * w[c] - gmean - norm * gnmean) * r;
        }
    }
    /* dw, db: sums over rows, so threads split the channels. NULL: the
     * input gradient alone. */
    if (!dw) return;
    #pragma omp parallel for
    for (int c0 = 0; c0 < C; c0 += 16) {
        int c1 = c0 + 16 < C ? c0 + 16 : C;
        for (int n = 0; n < N; n++) {
            const real *g = dout + (size_t)n * C;
            const real *x = inp + (size_t)n * C;
            for (int c = c0; c < c1; c++) {
                dw[c] += g[c] * (x[c] - mean[n]) * rstd[n];
                db[c] += g[c];
            }
        }
    }
}

/* ---------------------------------------------------------------------------
 * Linear layer: out[N,OC] = inp[N,C] @ w[OC,C]^T + bias, and its backward
 * dinp[N,C] += dout @ w, dw[OC,C] += dout^T @ inp, dbias[OC] += sum_n dout.
 * First the plain loops, which say what the products are; then the op
 * `train` runs, the same products by gemm.c. */

OPS_PUBLIC
void cpu_matmul_forward_naive(Dev *d, real *out, const real *inp, const real *w, const real *bias,
                              int N, int C, int OC) {
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            real s = 0;
            for (int c = 0; c < C; c++) s += inp[(size_t)n * C + c] * w[(size_t)o * C + c];
            out[(size_t)n * OC + o] = s + (bias ? bias[o] : 0);
        }
}

/* dbias[OC] += the column sums of dout [N,OC], both versions' (no product
 * to speed up): threads split the columns in 64s; each sums its rows in order. */
static void matmul_dbias(real *dbias, const real *dout, int N, int OC) {
    #pragma omp parallel for schedule(static)
    for (int o0 = 0; o0 < OC; o0 += 64) {
        int o1 = o0 + 64 < OC ? o0 + 64 : OC;
        real s[64] = {0};
        for (int n = 0; n < N; n++)
            #pragma omp simd
            for (int o = o0; o < o1; o++) s[o - o0] += dout[(size_t)n * OC + o];
        for (int o = o0; o < o1; o++) dbias[o] += s[o - o0];
    }
}

OPS_PUBLIC
void cpu_matmul_backward_naive(Dev *d, real *dinp, real *dw, real *dbias, const real *dout,
                               const real *inp, const real *w, int N, int C, int OC) {
    if (dinp) {
        #pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++)
            for (int c = 0; c < C; c++) {
                real s = 0;
                for (int o = 0; o < OC; o++) s += dout[(size_t)n * OC + o] * w[(size_t)o * C + c];
                dinp[(size_t)n * C + c] = s;
            }
    }
    if (dw) {
        #pragma omp parallel for schedule(static)
        for (int o = 0; o < OC; o++)
            for (int c = 0; c < C; c++) {
                real s = 0;
                for (int n = 0; n < N; n++) s += dout[(size_t)n * OC + o] * inp[(size_t)n * C + c];
                dw[(size_t)o * C + c] += s;
            }
    }
    if (dbias) matmul_dbias(dbias, dout, N, OC);
}

#ifndef OPS_REAL
/* What runs: each product one gemm() call, C = A B (+ C) (+ bias), whose
 * operands are strided views (row stride, column stride): w [OC,C] read as
 * w^T [C,OC] is w with strides (1, C), dout [N,OC] read as dout^T is dout
 * with strides (1, OC). */
void cpu_matmul_forward(Dev *d, float *out, const float *inp, const float *w, const float *bias,
                        int N, int C, int OC) {
    gemm(N, OC, C, inp, C, 1, w, 1, C, out, OC, 0, bias);  /* inp [N,C] times w^T [C,OC] */
}

void cpu_matmul_backward(Dev *d, float *dinp, float *dw, float *dbias, const float *dout,
                         const float *inp, const float *w, int N, int C, int OC) {
    if (dinp) gemm(N, C, OC, dout, OC, 1, w, C, 1, dinp, C, 0, NULL);  /* dout [N,OC] w [OC,C], written */
    if (dw) gemm(OC, C, N, dout, 1, OC, inp, C, 1, dw, C, 1, NULL);    /* dout^T [OC,N] inp [N,C] */
    if (dbias) matmul_dbias(dbias, dout, N, OC);
}
#endif

#ifndef OPS_REAL  /* the float64 build calls exp() */
/* ---------------------------------------------------------------------------
 * e^x in float as plain arithmetic, so that a loop calling it vectorises:
 * exp_f32, in exp_f32.h (cp.c's ring attention calls it too). */
#include "exp_f32.h"
#endif

/* ---------------------------------------------------------------------------
 * Causal self-attention. First the plain loops: one (batch, head, query
 * position) row at a time, scores, softmax, the weighted sum of values. Then
 * what runs: the same per (batch, head) pair as matrix products over qkv's
 * strided rows (Q K^T, then P V; backward dP = dO V^T, dV += P^T dO,
 * dQ += dS K, dK += dS^T Q), in blocks of AT_ROWS query rows so that the
 * products skip most of the masked upper triangle. */

OPS_PUBLIC
void cpu_attention_forward_naive(Dev *d, real *out, real *att, const real *qkv, int B, int T,
                                 int C, int NH) {
    int hs = C / NH;
    real scale = (real)(1.0 / sqrt((double)hs));
    #pragma omp parallel for collapse(3)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++) {
                const real *q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;  /* [hs] */
                real *a = att + (((size_t)b * NH + h) * T + t) * T;         /* [T] */
                real maxv = -INFINITY;
                for (int t2 = 0; t2 <= t; t2++) {
                    const real *k = qkv + ((size_t)b * T + t2) * 3 * C + C + h * hs;
                    real s = 0;
                    for (int i = 0; i < hs; i++) s += q[i] * k[i];
                    a[t2] = s * scale;
                    if (a[t2] > maxv) maxv = a[t2];
                }
                double sum = 0.0;
                for (int t2 = 0; t2 <= t; t2++) { a[t2] = R_EXP(a[t2] - maxv); sum += a[t2]; }
                real inv = (real)(1.0 / sum);
                for (int t2 = 0; t2 <= t; t2++) a[t2] *= inv;
                for (int t2 = t + 1; t2 < T; t2++) a[t2] = 0;
                real *o = out + ((size_t)b * T + t) * C + h * hs;  /* [hs] */
                for (int i = 0; i < hs; i++) o[i] = 0;
                for (int t2 = 0; t2 <= t; t2++) {
                    const real *v = qkv + ((size_t)b * T + t2) * 3 * C + 2 * C + h * hs;
                    for (int i = 0; i < hs; i++) o[i] += a[t2] * v[i];
                }
            }
        }
    }
}

/* A (batch, head) pair owns its channels of dqkv at every position, so the
 * threads split pairs and no two ever write the same element; each pair
 * zeroes its channels, then sums into them. */
OPS_PUBLIC
void cpu_attention_backward_naive(Dev *d, real *dqkv, real *datt, const real *dout,
                                  const real *qkv, const real *att, int B, int T, int C, int NH) {
    int hs = C / NH;
    real scale = (real)(1.0 / sqrt((double)hs));
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++)
                for (int part = 0; part < 3; part++)
                    memset(dqkv + ((size_t)b * T + t) * 3 * C + part * C + h * hs, 0, hs * sizeof(real));
            for (int t = 0; t < T; t++) {
                size_t row = (((size_t)b * NH + h) * T + t) * T;
                const real *a = att + row;  /* [T] */
                real *da = datt + row;      /* [T] */
                const real *g = dout + ((size_t)b * T + t) * C + h * hs;
                const real *q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                real *dq = dqkv + ((size_t)b * T + t) * 3 * C + h * hs;
                /* out = att @ v */
                for (int t2 = 0; t2 <= t; t2++) {
                    const real *v = qkv + ((size_t)b * T + t2) * 3 * C + 2 * C + h * hs;
                    real *dv = dqkv + ((size_t)b * T + t2) * 3 * C + 2 * C + h * hs;
                    real s = 0;
                    for (int i = 0; i < hs; i++) { s += v[i] * g[i]; dv[i] += a[t2] * g[i]; }
                    da[t2] = s;
                }
                /* softmax: dpre = att * (datt - sum(att * datt)) */
                double dot = 0.0;
                for (int t2 = 0; t2 <= t; t2++) dot += a[t2] * da[t2];
                for (int t2 = 0; t2 <= t; t2++) {
                    real dpre = a[t2] * (da[t2] - (real)dot) * scale;
                    const real *k = qkv + ((size_t)b * T + t2) * 3 * C + C + h * hs;
                    real *dk = dqkv + ((size_t)b * T + t2) * 3 * C + C + h * hs;
                    for (int i = 0; i < hs; i++) { dq[i] += dpre * k[i]; dk[i] += dpre * q[i]; }
                }
            }
        }
    }
}

#ifndef OPS_REAL
#define AT_ROWS 96  /* query rows a block: the products stop at the block's last column */

/* Rows [r0, r1) of one (batch, head) pair's probabilities: s [r1 - r0, T]
 * holds the scores of columns < r1 on entry and P (zero past t) on exit. */
static void at_softmax_rows(float *s, int r0, int r1, int T, float scale) {
    for (int t = r0; t < r1; t++) {
        float *a = s + (size_t)(t - r0) * T;  /* [T] */
        float maxv = -INFINITY;
        #pragma omp simd reduction(max:maxv)
        for (int t2 = 0; t2 <= t; t2++) {
            a[t2] *= scale;
            maxv = a[t2] > maxv ? a[t2] : maxv;
        }
        double sum = 0.0;
        #pragma omp simd reduction(+:sum)
        for (int t2 = 0; t2 <= t; t2++) { a[t2] = exp_f32(a[t2] - maxv); sum += a[t2]; }
        float inv = (float)(1.0 / sum);
        #pragma omp simd
        for (int t2 = 0; t2 <= t; t2++) a[t2] *= inv;
        for (int t2 = t + 1; t2 < T; t2++) a[t2] = 0;
    }
}

void cpu_attention_forward(Dev *d, float *out, float *att, const float *qkv, int B, int T, int C,
                           int NH) {
    int hs = C / NH;
    size_t ld = 3 * (size_t)C;  /* a row of qkv */
    float scale = (float)(1.0 / sqrt((double)hs));
    #pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)b * T * ld + h * hs, *k = q + C, *v = q + 2 * C;  /* [T,hs] at ld */
            float *a = att + ((size_t)b * NH + h) * T * T;  /* [T,T] */
            float *o = out + (size_t)b * T * C + h * hs;    /* [T,hs] at C */
            for (int r0 = 0; r0 < T; r0 += AT_ROWS) {
                int r1 = r0 + AT_ROWS < T ? r0 + AT_ROWS : T;
                gemm(r1 - r0, r1, hs, q + r0 * ld, ld, 1, k, 1, ld, a + (size_t)r0 * T, T, 0, NULL);
                at_softmax_rows(a + (size_t)r0 * T, r0, r1, T, scale);
                gemm(r1 - r0, hs, r1, a + (size_t)r0 * T, T, 1, v, ld, 1, o + r0 * (size_t)C, C, 0, NULL);
            }
        }
}

/* A (batch, head) pair owns its channels of dqkv at every position, so the
 * threads split pairs and no two ever write the same element; each pair
 * zeroes its channels, then the products sum into them. */
void cpu_attention_backward(Dev *d, float *dqkv, float *datt, const float *dout, const float *qkv,
                            const float *att, int B, int T, int C, int NH) {
    int hs = C / NH;
    size_t ld = 3 * (size_t)C;
    float scale = (float)(1.0 / sqrt((double)hs));
    #pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            size_t qo = (size_t)b * T * ld + h * hs;
            const float *q = qkv + qo, *k = q + C, *v = q + 2 * C;   /* [T,hs] at ld */
            float *dq = dqkv + qo, *dk = dq + C, *dv = dq + 2 * C;    /* [T,hs] at ld */
            const float *g = dout + (size_t)b * T * C + h * hs;       /* [T,hs] at C */
            const float *a = att + ((size_t)b * NH + h) * T * T;     /* [T,T] */
            float *ds = datt + ((size_t)b * NH + h) * T * T;         /* [T,T] */
            for (int t = 0; t < T; t++)
                for (int part = 0; part < 3; part++) memset(dq + t * ld + part * C, 0, hs * sizeof(float));
            /* dP = dO V^T, then dS = P * (dP - sum P dP) * scale, zero past t */
            for (int r0 = 0; r0 < T; r0 += AT_ROWS) {
                int r1 = r0 + AT_ROWS < T ? r0 + AT_ROWS : T;
                gemm(r1 - r0, r1, hs, g + r0 * (size_t)C, C, 1, v, 1, ld, ds + (size_t)r0 * T, T, 0, NULL);
                for (int t = r0; t < r1; t++) {
                    const float *p = a + (size_t)t * T;
                    float *e = ds + (size_t)t * T;
                    double dot = 0.0;
                    #pragma omp simd reduction(+:dot)
                    for (int t2 = 0; t2 <= t; t2++) dot += p[t2] * e[t2];
                    #pragma omp simd
                    for (int t2 = 0; t2 <= t; t2++) e[t2] = p[t2] * (e[t2] - (float)dot) * scale;
                    for (int t2 = t + 1; t2 < T; t2++) e[t2] = 0;
                }
            }
            /* dQ += dS K over columns < r1; dK += dS^T Q and dV += P^T dO over rows >= r0 */
            for (int r0 = 0; r0 < T; r0 += AT_ROWS) {
                int r1 = r0 + AT_ROWS < T ? r0 + AT_ROWS : T;
                gemm(r1 - r0, hs, r1, ds + (size_t)r0 * T, T, 1, k, ld, 1, dq + r0 * ld, ld, 1, NULL);
                gemm(r1 - r0, hs, T - r0, ds + (size_t)r0 * T + r0, 1, T, q + r0 * ld, ld, 1,
                     dk + r0 * ld, ld, 1, NULL);
                gemm(r1 - r0, hs, T - r0, a + (size_t)r0 * T + r0, 1, T, g + r0 * (size_t)C, C, 1,
                     dv + r0 * ld, ld, 1, NULL);
            }
        }
}
#endif

/* ---------------------------------------------------------------------------
 * GELU, tanh approximation (GPT-2's). */

#define GELU_S 0.7978845608028654  /* sqrt(2/pi) */

/* tanh through one exp, which vectorises where libm's tanhf does not:
 * tanh(u) = 1 - 2 / (e^(2u) + 1); e^(2u) -> inf gives 1, -> 0 gives -1. The
 * absolute error near 0 is ~1e-7, and GELU multiplies tanh by x/2. */
static inline real fast_tanh(real u) { return 1 - 2 / (R_EXP(2 * u) + 1); }

OPS_PUBLIC
void cpu_gelu_forward(Dev *d, real *out, const real *inp, size_t n) {
    #pragma omp parallel for simd
    for (size_t i = 0; i < n; i++) {
        real x = inp[i];
        out[i] = (real)0.5 * x * (1 + fast_tanh((real)GELU_S * (x + (real)0.044715 * x * x * x)));
    }
}

OPS_PUBLIC
void cpu_gelu_backward(Dev *d, real *dinp, const real *inp, const real *dout, size_t n) {
    #pragma omp parallel for simd
    for (size_t i = 0; i < n; i++) {
        real x = inp[i];
        real th = fast_tanh((real)GELU_S * (x + (real)0.044715 * x * x * x));
        real sech2 = 1 - th * th;
        real grad = (real)0.5 * (1 + th) +
                    (real)0.5 * x * sech2 * (real)GELU_S * (1 + 3 * (real)0.044715 * x * x);
        dinp[i] += grad * dout[i];
    }
}

/* ---------------------------------------------------------------------------
 * The residual connection and its backward. */

OPS_PUBLIC
void cpu_add(Dev *d, real *out, const real *a, const real *b, size_t n) {
    #pragma omp parallel for simd
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

OPS_PUBLIC
void cpu_accumulate(Dev *d, real *dst, const real *src, size_t n) {
    #pragma omp parallel for simd
    for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

/* ---------------------------------------------------------------------------
 * Softmax + cross-entropy, fused: the probabilities are never stored apart,
 * the logits row becomes its own gradient. Padded columns are not classes. */

OPS_PUBLIC
void cpu_crossentropy(Dev *d, real *losses, real *logits, const int *targets, int N, int V, int Vp,
                      real dloss) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        real *z = logits + (size_t)n * Vp;  /* [Vp] */
        real maxv = -INFINITY;
        #pragma omp simd reduction(max:maxv)
        for (int v = 0; v < V; v++) maxv = z[v] > maxv ? z[v] : maxv;
        double sum = 0.0;
        #pragma omp simd reduction(+:sum)
        for (int v = 0; v < V; v++) sum += R_EXP(z[v] - maxv);
        real logsum = (real)log(sum) + maxv;
        int y = targets[n];
        losses[n] = logsum - z[y];
        if (dloss != 0) {
            #pragma omp simd
            for (int v = 0; v < V; v++) z[v] = dloss * R_EXP(z[v] - logsum);
            z[y] -= dloss;
            for (int v = V; v < Vp; v++) z[v] = 0;
        }
    }
}

/* The same loss with the vocabulary split over ranks (Megatron's
 * vocab-parallel cross-entropy): no rank ever holds a whole row of logits;
 * three numbers a row travel instead. */

OPS_PUBLIC
void cpu_xent_stats(Dev *d, real *stats, const real *logits, const int *targets, int N, int v0,
                    int nvalid, int Vl) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const real *z = logits + (size_t)n * Vl;  /* [Vl] */
        real maxv = -INFINITY;
        #pragma omp simd reduction(max:maxv)
        for (int v = 0; v < nvalid; v++) maxv = z[v] > maxv ? z[v] : maxv;
        double sum = 0.0;
        #pragma omp simd reduction(+:sum)
        for (int v = 0; v < nvalid; v++) sum += R_EXP(z[v] - maxv);
        int y = targets[n] - v0;
        stats[3 * n] = nvalid > 0 ? maxv : 0;
        stats[3 * n + 1] = (real)sum;
        stats[3 * n + 2] = y >= 0 && y < nvalid ? z[y] : 0;
    }
}

OPS_PUBLIC
void cpu_xent_combine(Dev *d, real *losses, real *lse, const real *gathered, int N, int R) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        real maxv = -INFINITY, zy = 0;
        for (int r = 0; r < R; r++) {
            const real *s = gathered + ((size_t)r * N + n) * 3;
            if (s[1] > 0 && s[0] > maxv) maxv = s[0];
        }
        double sum = 0.0;
        for (int r = 0; r < R; r++) {
            const real *s = gathered + ((size_t)r * N + n) * 3;
            if (s[1] > 0) sum += s[1] * R_EXP(s[0] - maxv);
            zy += s[2];
        }
        lse[n] = (real)log(sum) + maxv;
        losses[n] = lse[n] - zy;
    }
}

OPS_PUBLIC
void cpu_xent_grad(Dev *d, real *logits, const real *lse, const int *targets, int N, int v0,
                   int nvalid, int Vl, real dloss) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        real *z = logits + (size_t)n * Vl;
        int y = targets[n] - v0;
        #pragma omp simd
        for (int v = 0; v < nvalid; v++) z[v] = dloss * R_EXP(z[v] - lse[n]);
        if (y >= 0 && y < nvalid) z[y] -= dloss;
        for (int v = nvalid < 0 ? 0 : nvalid; v < Vl; v++) z[v] = 0;
    }
}

/* ---------------------------------------------------------------------------
 * AdamW, torch.optim.AdamW's arithmetic (decoupled weight decay).
 *
 * Vectorised, with each multiply-add fused where written (R_FMA) and
 * nowhere else: left to the compiler, the vector body and the scalar
 * remainder may fuse differently, and an element's update would then depend
 * on where its shard starts, which ZeRO stages and offload cut differently. */

OPS_PUBLIC
void cpu_adamw(Dev *d, real *param, const real *grad, real *m, real *v, size_t n, real lr,
               real beta1, real beta2, real eps, real wd, real bc1, real bc2, real grad_scale) {
    real step = lr / bc1, rbc2 = 1 / R_SQRT(bc2), decay = 1 - lr * wd;
    real omb1 = 1 - beta1, omb2 = 1 - beta2;
    #pragma omp parallel for simd
    for (size_t i = 0; i < n; i++) {
        real g = grad[i] * grad_scale;
        real mi = R_FMA(beta1, m[i], omb1 * g);
        real vi = R_FMA(beta2, v[i], omb2 * g * g);
        real q = step * mi / R_FMA(R_SQRT(vi), rbc2, eps);
        param[i] = R_FMA(param[i], decay, -q);
        m[i] = mi;
        v[i] = vi;
    }
}

/* ---------------------------------------------------------------------------
 * Reductions for the gradient norm and the loss, in double. */

OPS_PUBLIC
double cpu_sumsq(Dev *d, const real *x, size_t n) {
    double s = 0.0;
    #pragma omp parallel for simd reduction(+:s)
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return s;
}

OPS_PUBLIC
double cpu_sum(Dev *d, const real *x, size_t n) {
    double s = 0.0;
    #pragma omp parallel for simd reduction(+:s)
    for (size_t i = 0; i < n; i++) s += x[i];
    return s;
}

#ifndef OPS_REAL
/* ---------------------------------------------------------------------------
 * The gradient norm's passes (optim.h, "The gradient norm"): each
 * element's parts depend on it and the grid alone, and the sums of parts
 * are exact, so threads, shards and ranks may add them in any order. The
 * grid pass finds the largest exponent as well, at no cost where it waits
 * on memory: a step whose grid, guessed from the last step's, proves right
 * reads the gradients once. */

/* v's exponent field, in place (bits 23..30): compared as is, shifted once at the end */
static inline uint32_t exp_field(float v) {
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    return b & 0x7f800000u;
}

int cpu_exp_max(Dev *d, const float *x, size_t n) {
    uint32_t e = 0;
    #pragma omp parallel for simd reduction(max:e)
    for (size_t i = 0; i < n; i++) {
        uint32_t b = exp_field(x[i]);
        e = b > e ? b : e;
    }
    return (int)(e >> 23);
}

/* One element's share of the grid pass: the parts of v^2 on the grid, and
 * its exponent into the largest so far. */
typedef struct NormParts {
    double s0, s1, s2;
    uint32_t e;   /* the largest exponent field seen (bits 23..30) */
} NormParts;

static inline void norm_grid_add(NormParts *p, float v, double scale, double c0, double c1, double c2) {
    uint32_t b = exp_field(v);
    p->e = b > p->e ? b : p->e;
    double y = (double)v * v * scale;   /* exact: 48 bits, a power of 2 */
    double p0 = (y + c0) - c0;
    y -= p0;
    double p1 = (y + c1) - c1;
    y -= p1;
    p->s0 += p0;
    p->s1 += p1;
    p->s2 += (y + c2) - c2;
}

/* x is read as four quarters side by side, four streams a thread: where one
 * stream a core is bound by memory latency (the Xeon of 2026-11-26 read
 * one at about 10 GB/s) more are in flight; 4-8% faster on the Zen 3, and
 * the sums are exact, so the order changes no bit. */
int cpu_sumsq_grid(Dev *d, const float *x, size_t n, const NormGrid *g, double acc[3]) {
    const double scale = g->scale, c0 = g->c[0], c1 = g->c[1], c2 = g->c[2];
    size_t q = n / 4;
    double s0 = 0, s1 = 0, s2 = 0;
    uint32_t e = 0;
    #pragma omp parallel for simd reduction(+:s0, s1, s2) reduction(max:e)
    for (size_t i = 0; i < q; i++) {
        NormParts p = {0, 0, 0, 0};
        for (int k = 0; k < 4; k++) norm_grid_add(&p, x[k * q + i], scale, c0, c1, c2);
        s0 += p.s0;
        s1 += p.s1;
        s2 += p.s2;
        e = p.e > e ? p.e : e;
    }
    NormParts t = {s0, s1, s2, e};
    for (size_t i = 4 * q; i < n; i++) norm_grid_add(&t, x[i], scale, c0, c1, c2);
    acc[0] += t.s0;
    acc[1] += t.s1;
    acc[2] += t.s2;
    return (int)(t.e >> 23);
}

/* The Ops steps of the norm on the CPU, run by run: the NormAcc is in host memory. */
void cpu_norm_add(Dev *d, NormAcc *a, const NormRun *runs, int nruns, const NormGrid *g) {
    for (int k = 0; k < nruns; k++) {
        int e = g ? cpu_sumsq_grid(d, runs[k].x, runs[k].n, g, a->s) : cpu_exp_max(d, runs[k].x, runs[k].n);
        if (e > a->e) a->e = e;
    }
}

void cpu_norm_redo(Dev *d, NormAcc *a, const NormRun *runs, int nruns, int guess, int bits) {
    if (a->e == guess || a->e == 255) return;
    const NormGrid g = norm_grid_at(a->e, bits);
    for (int k = 0; k < nruns; k++) cpu_sumsq_grid(d, runs[k].x, runs[k].n, &g, a->r);
}

void cpu_norm_pack(Dev *d, NormAcc *a, int guess, int bits) {
    (void)d;
    const NormGrid g = norm_grid_at(a->e, bits);
    if (a->e == 255) memset(a->limbs, 0, sizeof a->limbs);
    else norm_pack_limbs(a->e == guess ? a->s : a->r, &g, a->limbs);
}

/* ---------------------------------------------------------------------------
 * The float32 table. The Ops contract types activations as void * (they are
 * bf16 in the bf16 tables); here they are floats, so each entry is the
 * function above with its pointers converted. Attention keeps its
 * probabilities [B,NH,T,T] as its state and needs as much scratch. */

static void t_encoder_forward(Dev *d, void *out, const int *tok, const void *wte, const void *wpe,
                              int B, int T, int C) {
    cpu_encoder_forward(d, out, tok, wte, wpe, B, T, C);
}
static void t_encoder_backward(Dev *d, float *dwte, float *dwpe, const void *dout, const int *tok,
                               const int *plan, int runs, int B, int T, int C) {
    cpu_encoder_backward(d, dwte, dwpe, dout, tok, B, T, C);
}
static void t_layernorm_forward(Dev *d, void *out, float *mean, float *rstd, const void *inp,
                                const void *w, const void *b, int N, int C) {
    cpu_layernorm_forward(d, out, mean, rstd, inp, w, b, N, C);
}
static void t_layernorm_backward(Dev *d, void *dinp, float *dw, float *db, const void *dout,
                                 const void *inp, const void *w, const float *mean,
                                 const float *rstd, int N, int C) {
    cpu_layernorm_backward(d, dinp, dw, db, dout, inp, w, mean, rstd, N, C);
}
static void t_add_layernorm_forward(Dev *d, void *res, void *out, float *mean, float *rstd,
                                    const void *a, const void *b, const void *w, const void *bias,
                                    int N, int C) {
    cpu_add(d, res, a, b, (size_t)N * C);
    cpu_layernorm_forward(d, out, mean, rstd, res, w, bias, N, C);
}
static void t_matmul_forward(Dev *d, void *out, const void *inp, const void *w, const void *bias,
                             int N, int C, int OC) {
    cpu_matmul_forward(d, out, inp, w, bias, N, C, OC);
}
static void t_matmul_backward(Dev *d, void *dinp, float *dw, float *dbias, const void *dout,
                              const void *inp, const void *w, int N, int C, int OC) {
    cpu_matmul_backward(d, dinp, dw, dbias, dout, inp, w, N, C, OC);
}
static void t_attention_forward(Dev *d, void *out, float *state, const void *qkv, int B, int T,
                                int C, int NH) {
    cpu_attention_forward(d, out, state, qkv, B, T, C, NH);
}
static void t_attention_backward(Dev *d, void *dqkv, float *scratch, const void *dout,
                                 const void *qkv, const void *out, const float *state, int B,
                                 int T, int C, int NH) {
    cpu_attention_backward(d, dqkv, scratch, dout, qkv, state, B, T, C, NH);
}
size_t cpu_attention_floats(int B, int T, int C, int NH, size_t *scratch_floats) {
    size_t n = (size_t)B * NH * T * T;  /* the probabilities, and their gradient */
    if (scratch_floats) *scratch_floats = n;
    return n;
}
void ops_matmul_forward_gelu_seq(const Ops *o, Dev *d, void *out, void *gout, const void *inp, const void *w,
                                 const void *bias, int N, int C, int OC) {
    o->matmul_forward(d, out, inp, w, bias, N, C, OC);
    o->gelu_forward(d, gout, out, (size_t)N * OC);
}
static void t_matmul_forward_gelu(Dev *d, void *out, void *gout, const void *inp, const void *w, const void *bias,
                                  int N, int C, int OC) {
    ops_matmul_forward_gelu_seq(&cpu_ops, d, out, gout, inp, w, bias, N, C, OC);
}
void ops_matmul_backward_gelu_seq(const Ops *o, Dev *d, void *dfch, float *dbias, void *tmp, const void *dout,
                                  const void *w, const void *fch, int N, int C, int OC) {
    size_t n = (size_t)N * C, bytes = n * dt_size(o->dtype);
    o->matmul_backward(d, tmp, NULL, NULL, dout, NULL, w, N, C, OC);   /* tmp written */
    dev_zero(d, dfch, bytes);
    o->gelu_backward(d, dfch, fch, tmp, n);
    /* the bias of the layer whose output is fch: dfch [N,C] is its dout */
    if (dbias) o->matmul_backward(d, NULL, NULL, dbias, dfch, NULL, NULL, N, C, C);
}
static void t_matmul_backward_gelu(Dev *d, void *dfch, float *dbias, void *tmp, const void *dout, const void *w,
                                   const void *fch, int N, int C, int OC) {
    ops_matmul_backward_gelu_seq(&cpu_ops, d, dfch, dbias, tmp, dout, w, fch, N, C, OC);
}
static void t_gelu_forward(Dev *d, void *out, const void *inp, size_t n) {
    cpu_gelu_forward(d, out, inp, n);
}
static void t_gelu_backward(Dev *d, void *dinp, const void *inp, const void *dout, size_t n) {
    cpu_gelu_backward(d, dinp, inp, dout, n);
}
static void t_add(Dev *d, void *out, const void *a, const void *b, size_t n) {
    cpu_add(d, out, a, b, n);
}
static void t_copy(Dev *d, void *dst, const float *src, size_t n) {
    if (dst != src) memmove(dst, src, n * sizeof(float));
}
static void t_widen(Dev *d, float *dst, const void *src, size_t n) {
    if (dst != src) memmove(dst, src, n * sizeof(float));
}
static void t_crossentropy(Dev *d, float *losses, void *logits, const int *targets, int N, int V,
                           int Vp, float dloss) {
    cpu_crossentropy(d, losses, logits, targets, N, V, Vp, dloss);
}
static void t_xent_stats(Dev *d, float *stats, const void *logits, const int *targets, int N,
                         int v0, int nvalid, int Vl) {
    cpu_xent_stats(d, stats, logits, targets, N, v0, nvalid, Vl);
}
static void t_xent_grad(Dev *d, void *logits, const float *lse, const int *targets, int N, int v0,
                        int nvalid, int Vl, float dloss) {
    cpu_xent_grad(d, logits, lse, targets, N, v0, nvalid, Vl, dloss);
}

void cpu_adamw_segs(Dev *d, const AdamSeg *segs, int nsegs, float lr, float beta1, float beta2,
                    float eps, float bc1, float bc2, float grad_scale) {
    for (int k = 0; k < nsegs; k++) {
        const AdamSeg *s = &segs[k];
        cpu_adamw(d, s->param, s->grad, s->m, s->v, s->n, lr, beta1, beta2, eps, s->wd, bc1, bc2, grad_scale);
        uint16_t *lp = s->lp;   /* [n] bf16, or NULL */
        if (lp) {
            #pragma omp parallel for
            for (size_t i = 0; i < s->n; i++) lp[i] = bf16_from_f32(s->param[i]);
        }
    }
}

const Ops cpu_ops = {
    .dtype = DT_F32,
    .name = "cpu fp32",
    .encoder_forward = t_encoder_forward,
    .encoder_backward = t_encoder_backward,
    .layernorm_forward = t_layernorm_forward,
    .layernorm_backward = t_layernorm_backward,
    .add_layernorm_forward = t_add_layernorm_forward,
    .matmul_forward = t_matmul_forward,
    .matmul_forward_gelu = t_matmul_forward_gelu,
    .matmul_backward = t_matmul_backward,
    .matmul_backward_gelu = t_matmul_backward_gelu,
    .attention_forward = t_attention_forward,
    .attention_backward = t_attention_backward,
    .attention_floats = cpu_attention_floats,
    .gelu_forward = t_gelu_forward,
    .gelu_backward = t_gelu_backward,
    .add = t_add,
    .accumulate = cpu_accumulate,
    .cast = t_copy,
    .widen = t_widen,
    .crossentropy = t_crossentropy,
    .xent_stats = t_xent_stats,
    .xent_combine = cpu_xent_combine,
    .xent_grad = t_xent_grad,
    .adamw = cpu_adamw,
    .adamw_segs = cpu_adamw_segs,
    .sumsq = cpu_sumsq,
    .sum = cpu_sum,
    .norm_add = cpu_norm_add,
    .norm_redo = cpu_norm_redo,
    .norm_pack = cpu_norm_pack,
};

#endif
