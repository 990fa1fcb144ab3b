/* ops.c: the plain-C reference of every op of the GPT-2 (CPU, OpenMP).
 *
 * This file is the specification: kernels.cu is tested against it, and it is
 * tested against finite differences (test/test_ops.c, from a float64 build
 * of this same file) and, through the whole model, against PyTorch
 * (test/reference.py). It is also what CI trains with and what people
 * without a GPU use, so the matmuls are register-blocked and their inner
 * loops vectorise (`omp simd`), and every loop that writes a shared output
 * is split so that each output element is summed by one thread in a fixed
 * order: the result does not depend on the thread count, which is what lets
 * the parallel layouts of the articles be compared with one rank exactly.
 *
 * Forward and backward of each op sit side by side, as in llm.c.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "tensor.h"

#ifdef OPS_REAL
typedef OPS_REAL real;
#define OP(name) cpu64_##name
#else
typedef float real;
#define OP(name) cpu_##name
#endif
#include "ops.h"

/* Type-generic math for the two builds: float calls stay float. */
#define R_EXP(x)  (sizeof(real) == sizeof(float) ? (real)expf((float)(x)) : (real)exp((double)(x)))
#define R_SQRT(x) (sizeof(real) == sizeof(float) ? (real)sqrtf((float)(x)) : (real)sqrt((double)(x)))

/* ---------------------------------------------------------------------------
 * Embedding: token row plus position row. */

void OP(encoder_forward)(Dev *d, real *out, const int *tokens, const real *wte, const real *wpe,
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
void OP(encoder_backward)(Dev *d, real *dwte, real *dwpe, const real *dout, const int *tokens,
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

void OP(layernorm_forward)(Dev *d, real *out, real *mean, real *rstd, const real *inp,
                           const real *w, const real *b, int N, int C) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const real *x = inp + (size_t)n * C;  /* [C] */
        real *o = out + (size_t)n * C;        /* [C] */
        double s = 0.0;
        for (int c = 0; c < C; c++) s += x[c];
        real m = (real)(s / C);
        double v = 0.0;
        for (int c = 0; c < C; c++) { double dx = x[c] - m; v += dx * dx; }
        real r = (real)(1.0 / sqrt(v / C + 1e-5));
        for (int c = 0; c < C; c++) o[c] = (x[c] - m) * r * w[c] + b[c];
        mean[n] = m;
        rstd[n] = r;
    }
}

void OP(layernorm_backward)(Dev *d, real *dinp, real *dw, real *db, const real *dout,
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
        for (int c = 0; c < C; c++) {
            real dnorm = g[c] * w[c];
            gsum += dnorm;
            gnsum += dnorm * (x[c] - m) * r;
        }
        real gmean = (real)(gsum / C), gnmean = (real)(gnsum / C);
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
 * Linear layer: out[N,OC] = inp[N,C] @ w[OC,C]^T + bias.
 *
 * Both operands are read along C, so each output is a dot product of two
 * contiguous rows. A 4x4 block of outputs shares its loads: per 16 channels,
 * 8 vector loads feed 16 vector multiply-adds into 16 accumulators (GCC's
 * vector extension keeps them in registers), reduced across lanes at the end. */

#define MM_TILE 4

/* One 64-byte vector of reals (16 floats): the accumulators are registers
 * (zmm with AVX-512, ymm pairs with AVX2). */
typedef real vreal __attribute__((vector_size(64)));
#define VL ((int)(sizeof(vreal) / sizeof(real)))

static inline vreal vload(const real *p) { vreal v; memcpy(&v, p, sizeof v); return v; }
static inline void vstore(real *p, vreal v) { memcpy(p, &v, sizeof v); }
static inline real vsum(vreal v) {
    real s = 0;
    for (int i = 0; i < VL; i++) s += v[i];
    return s;
}

static void mm_block(real *out, const real *inp, const real *w, const real *bias,
                     int n0, int o0, int C, int OC) {
    vreal acc[MM_TILE][MM_TILE];
    memset(acc, 0, sizeof acc);
    const real *x = inp + (size_t)n0 * C, *wr = w + (size_t)o0 * C;
    int Cv = C / VL * VL;
    for (int c = 0; c < Cv; c += VL) {
        vreal xv[MM_TILE], wv[MM_TILE];
        #pragma GCC unroll 4
        for (int i = 0; i < MM_TILE; i++) {
            xv[i] = vload(x + (size_t)i * C + c);
            wv[i] = vload(wr + (size_t)i * C + c);
        }
        #pragma GCC unroll 4
        for (int i = 0; i < MM_TILE; i++)
            #pragma GCC unroll 4
            for (int j = 0; j < MM_TILE; j++) acc[i][j] += xv[i] * wv[j];
    }
    for (int i = 0; i < MM_TILE; i++) {
        for (int j = 0; j < MM_TILE; j++) {
            real s = vsum(acc[i][j]);
            for (int c = Cv; c < C; c++) s += x[(size_t)i * C + c] * wr[(size_t)j * C + c];
            out[(size_t)(n0 + i) * OC + o0 + j] = s + (bias ? bias[o0 + j] : 0);
        }
    }
}

static real mm_dot(const real *x, const real *wr, int C) {
    real a = 0;
    #pragma omp simd reduction(+:a)
    for (int c = 0; c < C; c++) a += x[c] * wr[c];
    return a;
}

void OP(matmul_forward)(Dev *d, real *out, const real *inp, const real *w, const real *bias,
                        int N, int C, int OC) {
    int Nb = N / MM_TILE * MM_TILE, OCb = OC / MM_TILE * MM_TILE;
    #pragma omp parallel for collapse(2) schedule(static)
    for (int n0 = 0; n0 < Nb; n0 += MM_TILE)
        for (int o0 = 0; o0 < OCb; o0 += MM_TILE)
            mm_block(out, inp, w, bias, n0, o0, C, OC);
    /* The ragged edges, one dot product each (same order of summation per
     * output as far as a single reduction goes; exactness across layouts
     * only needs the same shapes to give the same answer). */
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        int ostart = n < Nb ? OCb : 0;
        for (int o = ostart; o < OC; o++)
            out[(size_t)n * OC + o] = mm_dot(inp + (size_t)n * C, w + (size_t)o * C, C) +
                                      (bias ? bias[o] : 0);
    }
}

/* Both backward products have the outer-product form
 *     out[i, c] += sum_k A(i, k) * Bm[k, c],   A(i, k) = A[i*a_si + k*a_sk],
 * with Bm and out contiguous along c: dinp (i = n, k = o, Bm = w) and dw
 * (i = o, k = n, Bm = inp). A block of 4 rows x VL columns stays in
 * registers while k streams: per k, one row of Bm and 4 scalars of A feed
 * 4 * VL multiply-adds. Every output adds its terms in k order, in the
 * block and on the ragged edges alike. */
static void mm_outer_block(real *out, size_t ldo, const real *A, size_t a_si, size_t a_sk,
                           const real *Bm, size_t ldb, int K, int i0, int c0) {
    real *o0 = out + (size_t)i0 * ldo + c0, *o1 = o0 + ldo, *o2 = o1 + ldo, *o3 = o2 + ldo;
    vreal acc0 = vload(o0), acc1 = vload(o1), acc2 = vload(o2), acc3 = vload(o3);
    const real *a0 = A + (size_t)i0 * a_si, *a1 = a0 + a_si, *a2 = a1 + a_si, *a3 = a2 + a_si;
    for (int k = 0; k < K; k++) {
        vreal b = vload(Bm + (size_t)k * ldb + c0);
        size_t ak = (size_t)k * a_sk;
        acc0 += a0[ak] * b; acc1 += a1[ak] * b;
        acc2 += a2[ak] * b; acc3 += a3[ak] * b;
    }
    vstore(o0, acc0); vstore(o1, acc1); vstore(o2, acc2); vstore(o3, acc3);
}

/* k runs in chunks of MM_KB: a chunk of the column strip of Bm (MM_KB rows
 * of one vector) stays in L1 while every row block uses it, instead of the
 * whole strip (for the head's dinp, 50304 rows of wte) streaming again for
 * each block. Each output still adds its terms in k order. */
#define MM_KB 256

static void mm_outer(real *out, const real *A, size_t a_si, size_t a_sk, const real *Bm, int I,
                     int K, int Cn) {
    int Ib = I / MM_TILE * MM_TILE, Cb = Cn / VL * VL;
    for (int k0 = 0; k0 < K; k0 += MM_KB) {
        int kn = K - k0 < MM_KB ? K - k0 : MM_KB;
        const real *Ak = A + (size_t)k0 * a_sk, *Bk = Bm + (size_t)k0 * Cn;
        #pragma omp parallel for collapse(2) schedule(static)
        for (int c0 = 0; c0 < Cb; c0 += VL)
            for (int i0 = 0; i0 < Ib; i0 += MM_TILE)
                mm_outer_block(out, Cn, Ak, a_si, a_sk, Bk, Cn, kn, i0, c0);
        #pragma omp parallel for schedule(static)
        for (int i = 0; i < I; i++) {
            int cstart = i < Ib ? Cb : 0;
            for (int c = cstart; c < Cn; c++) {
                real sacc = out[(size_t)i * Cn + c];
                for (int k = 0; k < kn; k++)
                    sacc += Ak[(size_t)i * a_si + (size_t)k * a_sk] * Bk[(size_t)k * Cn + c];
                out[(size_t)i * Cn + c] = sacc;
            }
        }
    }
}

void OP(matmul_backward)(Dev *d, real *dinp, real *dw, real *dbias, const real *dout,
                         const real *inp, const real *w, int N, int C, int OC) {
    /* dinp[n,c] += sum_o dout[n,o] w[o,c] */
    if (dinp) mm_outer(dinp, dout, OC, 1, w, N, OC, C);
    /* dw[o,c] += sum_n dout[n,o] inp[n,c]. dout is read by columns here, OC
     * floats apart (the head's 50304): transposed once, each block's four
     * rows of it are contiguous and stay in cache across the column blocks. */
    if (dw) {
        real *doutT = malloc((size_t)N * OC * sizeof(real) + 1);  /* [OC,N] */
        #pragma omp parallel for schedule(static)
        for (int o0 = 0; o0 < OC; o0 += 64) {
            int o1 = o0 + 64 < OC ? o0 + 64 : OC;
            for (int n = 0; n < N; n++)
                for (int o = o0; o < o1; o++) doutT[(size_t)o * N + n] = dout[(size_t)n * OC + o];
        }
        mm_outer(dw, doutT, N, 1, inp, OC, N, C);
        free(doutT);
    }
    if (dbias) {
        #pragma omp parallel for schedule(static)
        for (int o = 0; o < OC; o++) {
            real s = 0;
            for (int n = 0; n < N; n++) s += dout[(size_t)n * OC + o];
            dbias[o] += s;
        }
    }
}

/* ---------------------------------------------------------------------------
 * Causal self-attention, one (batch, head, query position) row at a time. */

void OP(attention_forward)(Dev *d, real *out, real *att, const real *qkv, int B, int T, int C,
                           int NH) {
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
 * threads split pairs and no two ever write the same element. */
void OP(attention_backward)(Dev *d, real *dqkv, real *datt, const real *dout, const real *qkv,
                            const real *att, int B, int T, int C, int NH) {
    int hs = C / NH;
    real scale = (real)(1.0 / sqrt((double)hs));
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
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

/* ---------------------------------------------------------------------------
 * GELU, tanh approximation (GPT-2's). */

#define GELU_S 0.7978845608028654  /* sqrt(2/pi) */

/* tanh through one exp, which vectorises where libm's tanhf does not:
 * tanh(u) = 1 - 2 / (e^(2u) + 1); e^(2u) -> inf gives 1, -> 0 gives -1. The
 * absolute error near 0 is ~1e-7, and GELU multiplies tanh by x/2. */
static inline real fast_tanh(real u) { return 1 - 2 / (R_EXP(2 * u) + 1); }

void OP(gelu_forward)(Dev *d, real *out, const real *inp, size_t n) {
    #pragma omp parallel for simd
    for (size_t i = 0; i < n; i++) {
        real x = inp[i];
        out[i] = (real)0.5 * x * (1 + fast_tanh((real)GELU_S * (x + (real)0.044715 * x * x * x)));
    }
}

void OP(gelu_backward)(Dev *d, real *dinp, const real *inp, const real *dout, size_t n) {
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

void OP(add)(Dev *d, real *out, const real *a, const real *b, size_t n) {
    #pragma omp parallel for simd
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void OP(accumulate)(Dev *d, real *dst, const real *src, size_t n) {
    #pragma omp parallel for simd
    for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

/* ---------------------------------------------------------------------------
 * Softmax + cross-entropy, fused: the probabilities are never stored apart,
 * the logits row becomes its own gradient. Padded columns are not classes. */

void OP(crossentropy)(Dev *d, real *losses, real *logits, const int *targets, int N, int V, int Vp,
                      real dloss) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        real *z = logits + (size_t)n * Vp;  /* [Vp] */
        real maxv = -INFINITY;
        for (int v = 0; v < V; v++) if (z[v] > maxv) maxv = z[v];
        double sum = 0.0;
        for (int v = 0; v < V; v++) sum += R_EXP(z[v] - maxv);
        real logsum = (real)log(sum) + maxv;
        int y = targets[n];
        losses[n] = logsum - z[y];
        if (dloss != 0) {
            for (int v = 0; v < V; v++) z[v] = dloss * (R_EXP(z[v] - logsum) - (v == y ? 1 : 0));
            for (int v = V; v < Vp; v++) z[v] = 0;
        }
    }
}

/* The same loss with the vocabulary split over ranks (Megatron's
 * vocab-parallel cross-entropy): no rank ever holds a whole row of logits;
 * three numbers a row travel instead. */

void OP(xent_stats)(Dev *d, real *stats, const real *logits, const int *targets, int N, int v0,
                    int nvalid, int Vl) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const real *z = logits + (size_t)n * Vl;  /* [Vl] */
        real maxv = -INFINITY;
        for (int v = 0; v < nvalid; v++) if (z[v] > maxv) maxv = z[v];
        double sum = 0.0;
        for (int v = 0; v < nvalid; v++) sum += R_EXP(z[v] - maxv);
        int y = targets[n] - v0;
        stats[3 * n] = nvalid > 0 ? maxv : 0;
        stats[3 * n + 1] = (real)sum;
        stats[3 * n + 2] = y >= 0 && y < nvalid ? z[y] : 0;
    }
}

void OP(xent_combine)(Dev *d, real *losses, real *lse, const real *gathered, int N, int R) {
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

void OP(xent_grad)(Dev *d, real *logits, const real *lse, const int *targets, int N, int v0,
                   int nvalid, int Vl, real dloss) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        real *z = logits + (size_t)n * Vl;
        int y = targets[n] - v0;
        for (int v = 0; v < nvalid; v++) z[v] = dloss * (R_EXP(z[v] - lse[n]) - (v == y ? 1 : 0));
        for (int v = nvalid < 0 ? 0 : nvalid; v < Vl; v++) z[v] = 0;
    }
}

/* ---------------------------------------------------------------------------
 * AdamW, torch.optim.AdamW's arithmetic (decoupled weight decay). */

void OP(adamw)(Dev *d, real *param, const real *grad, real *m, real *v, size_t n, real lr,
               real beta1, real beta2, real eps, real wd, real bc1, real bc2, real grad_scale) {
    real step = lr / bc1, rbc2 = 1 / R_SQRT(bc2);
    #pragma omp parallel for simd
    for (size_t i = 0; i < n; i++) {
        real g = grad[i] * grad_scale;
        real p = param[i] * (1 - lr * wd);
        real mi = beta1 * m[i] + (1 - beta1) * g;
        real vi = beta2 * v[i] + (1 - beta2) * g * g;
        param[i] = p - step * mi / (R_SQRT(vi) * rbc2 + eps);
        m[i] = mi;
        v[i] = vi;
    }
}

/* ---------------------------------------------------------------------------
 * Reductions for the gradient norm and the loss, in double. */

double OP(sumsq)(Dev *d, const real *x, size_t n) {
    double s = 0.0;
    #pragma omp parallel for reduction(+:s)
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return s;
}

double OP(sum)(Dev *d, const real *x, size_t n) {
    double s = 0.0;
    #pragma omp parallel for reduction(+:s)
    for (size_t i = 0; i < n; i++) s += x[i];
    return s;
}

#ifndef OPS_REAL
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
    for (int k = 0; k < nsegs; k++)
        cpu_adamw(d, segs[k].param, segs[k].grad, segs[k].m, segs[k].v, segs[k].n, lr, beta1, beta2,
                  eps, segs[k].wd, bc1, bc2, grad_scale);
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
    .matmul_backward = t_matmul_backward,
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
};
#endif
