/* test/exact64.h: the exact answers test/test_cpu_gemm.c holds ops.c's
 * float32 linear layer and attention to: the same ops' plain loops run in
 * double (test/exact64.c) on the float32 inputs, widened exactly. */
#ifndef EXACT64_H
#define EXACT64_H

/* out[N,OC] = x[N,C] w[OC,C]^T + b[OC]; then, from dout g[N,OC], dx[N,C],
 * dw[OC,C] and db[OC] (the caller zeroes them: the backward accumulates). */
void exact64_linear(double *out, double *dx, double *dw, double *db, const float *x,
                    const float *w, const float *b, const float *g, int N, int C, int OC);

/* o[B,T,C] = causal attention of qkv[B,T,3C] over NH heads; then
 * dqkv[B,T,3C] = the gradient of qkv from dout go[B,T,C]. */
void exact64_attention(double *o, double *dqkv, const float *qkv, const float *go,
                       int B, int T, int C, int NH);

#endif
