/* test/exact64.c: test/exact64.h's two functions, on ops.c's plain loops
 * built in double: ops.c is included here after `#define OPS_REAL double`
 * (its header, "Two builds"), so its cpu_* functions are this file's,
 * static, with every float buffer double. */
#include <stdlib.h>
#define OPS_REAL double
#include "ops.c"
#include "exact64.h"

/* x[n] as doubles, in a new buffer */
static double *exact64_widen(const float *x, size_t n) {
    double *d = malloc((n ? n : 1) * sizeof(double));
    if (!d) abort();
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

void exact64_linear(double *out, double *dx, double *dw, double *db, const float *x,
                    const float *w, const float *b, const float *g, int N, int C, int OC) {
    Dev d = {0};
    double *X = exact64_widen(x, (size_t)N * C), *W = exact64_widen(w, (size_t)OC * C);
    double *Bi = exact64_widen(b, OC), *G = exact64_widen(g, (size_t)N * OC);
    cpu_matmul_forward_naive(&d, out, X, W, Bi, N, C, OC);
    cpu_matmul_backward_naive(&d, dx, dw, db, G, X, W, N, C, OC);
    free(X); free(W); free(Bi); free(G);
}

void exact64_attention(double *o, double *dqkv, const float *qkv, const float *go,
                       int B, int T, int C, int NH) {
    Dev d = {0};
    size_t nq = (size_t)B * T * 3 * C, na = (size_t)B * NH * T * T;
    double *QKV = exact64_widen(qkv, nq), *GO = exact64_widen(go, (size_t)B * T * C);
    double *att = calloc(na, sizeof(double)), *scratch = calloc(na, sizeof(double));
    if (!att || !scratch) abort();
    cpu_attention_forward_naive(&d, o, att, QKV, B, T, C, NH);  /* att [B,NH,T,T]: probabilities */
    cpu_attention_backward_naive(&d, dqkv, scratch, GO, QKV, att, B, T, C, NH);
    free(QKV); free(GO); free(att); free(scratch);
}
