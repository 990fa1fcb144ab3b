/* ops.h: ops.c's float32 functions, the CPU reference `train` runs.
 *
 * The cpu_ops table (tensor.h) wraps them for gpt.c, and ops_bf16.c's
 * cpu_bf16_ops calls them on widened copies; the tests call them directly.
 * Contracts are the Ops comments in tensor.h; the activations typed `void *`
 * there are float here. A *_naive function is the plain loops of the op of
 * the same name, the specification its gemm.c version is tested against
 * (test/test_cpu_gemm.c). The same loops in double are ops.c included by a
 * test under OPS_REAL (ops.c's header, "Two builds").
 */
#ifndef OPS_H
#define OPS_H

#include "tensor.h"

void cpu_encoder_forward(Dev *d, float *out, const int *tokens, const float *wte, const float *wpe,
                         int B, int T, int C);
void cpu_encoder_backward(Dev *d, float *dwte, float *dwpe, const float *dout, const int *tokens,
                          int B, int T, int C);
void cpu_layernorm_forward(Dev *d, float *out, float *mean, float *rstd, const float *inp,
                           const float *w, const float *b, int N, int C);
void cpu_layernorm_backward(Dev *d, float *dinp, float *dw, float *db, const float *dout,
                            const float *inp, const float *w, const float *mean, const float *rstd,
                            int N, int C);
void cpu_matmul_forward_naive(Dev *d, float *out, const float *inp, const float *w,
                              const float *bias, int N, int C, int OC);
void cpu_matmul_forward(Dev *d, float *out, const float *inp, const float *w, const float *bias,
                        int N, int C, int OC);
void cpu_matmul_backward_naive(Dev *d, float *dinp, float *dw, float *dbias, const float *dout,
                               const float *inp, const float *w, int N, int C, int OC);
void cpu_matmul_backward(Dev *d, float *dinp, float *dw, float *dbias, const float *dout,
                         const float *inp, const float *w, int N, int C, int OC);
/* att [B,NH,T,T]: the probabilities (forward's output, backward's input);
 * datt [B,NH,T,T]: backward's scratch. */
void cpu_attention_forward_naive(Dev *d, float *out, float *att, const float *qkv, int B, int T,
                                 int C, int NH);
void cpu_attention_forward(Dev *d, float *out, float *att, const float *qkv, int B, int T, int C,
                           int NH);
void cpu_attention_backward_naive(Dev *d, float *dqkv, float *datt, const float *dout,
                                  const float *qkv, const float *att, int B, int T, int C, int NH);
void cpu_attention_backward(Dev *d, float *dqkv, float *datt, const float *dout, const float *qkv,
                            const float *att, int B, int T, int C, int NH);
/* Ops.matmul_backward_gelu as the two ops of table o in sequence (tensor.h
 * has the contract): the specification of the fused forms, and the entry
 * of the tables without one. */
void ops_matmul_backward_gelu_seq(const Ops *o, Dev *d, void *dfch, float *dbias, void *tmp, const void *dout,
                                  const void *w, const void *fch, int N, int C, int OC);
/* Ops.matmul_forward_gelu as table o's matmul_forward then gelu_forward. */
void ops_matmul_forward_gelu_seq(const Ops *o, Dev *d, void *out, void *gout, const void *inp, const void *w,
                                 const void *bias, int N, int C, int OC);
void cpu_gelu_forward(Dev *d, float *out, const float *inp, size_t n);
void cpu_gelu_backward(Dev *d, float *dinp, const float *inp, const float *dout, size_t n);
void cpu_add(Dev *d, float *out, const float *a, const float *b, size_t n);
void cpu_accumulate(Dev *d, float *dst, const float *src, size_t n);
void cpu_crossentropy(Dev *d, float *losses, float *logits, const int *targets, int N, int V,
                      int Vp, float dloss);
void cpu_xent_stats(Dev *d, float *stats, const float *logits, const int *targets, int N, int v0,
                    int nvalid, int Vl);
void cpu_xent_combine(Dev *d, float *losses, float *lse, const float *gathered, int N, int R);
void cpu_xent_grad(Dev *d, float *logits, const float *lse, const int *targets, int N, int v0,
                   int nvalid, int Vl, float dloss);
void cpu_adamw(Dev *d, float *param, const float *grad, float *m, float *v, size_t n, float lr,
               float beta1, float beta2, float eps, float wd, float bc1, float bc2,
               float grad_scale);
/* adamw over each of nsegs segments (the table's adamw_segs). */
void cpu_adamw_segs(Dev *d, const AdamSeg *segs, int nsegs, float lr, float beta1, float beta2,
                    float eps, float bc1, float bc2, float grad_scale);
double cpu_sumsq(Dev *d, const float *x, size_t n);
double cpu_sum(Dev *d, const float *x, size_t n);
/* The gradient norm's two passes over x[n] (optim.h): the largest biased exponent, and the
 * parts' sums on grid g added to acc, returning the exponent too. */
int cpu_exp_max(Dev *d, const float *x, size_t n);
int cpu_sumsq_grid(Dev *d, const float *x, size_t n, const NormGrid *g, double acc[3]);
/* Ops.norm_add, norm_redo and norm_pack on a NormAcc in host memory. */
void cpu_norm_add(Dev *d, NormAcc *a, const NormRun *runs, int nruns, const NormGrid *g);
void cpu_norm_redo(Dev *d, NormAcc *a, const NormRun *runs, int nruns, int guess, int bits);
void cpu_norm_pack(Dev *d, NormAcc *a, int guess, int bits);
/* Float32 elements of the reference attention's state and scratch (both [B,NH,T,T]). */
size_t cpu_attention_floats(int B, int T, int C, int NH, size_t *scratch_floats);

#endif
