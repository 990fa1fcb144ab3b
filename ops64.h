/* ops64.h: the float64 reference set, ops.c's plain loops built in double.
 *
 * ops64.o is ops.c compiled with -DOPS_REAL=double (the Makefile): every
 * function there is static and this table is the one name it exports, so a
 * test links it beside the float32 ops.o. Only the finite-difference tests
 * use it (test/test_ops.c, and test/test_cpu_gemm.c as the exact answer for
 * the float32 GEMM path): in double the central differences are accurate to
 * ~1e-9, so their bound can be tight. Each member is the plain-loop op of
 * ops.h's name (the linear layer and attention: cpu_*_naive), with every
 * float buffer double; contracts are tensor.h's Ops comments.
 */
#ifndef OPS64_H
#define OPS64_H

#include "tensor.h"

typedef struct Ops64 {
    void (*encoder_forward)(Dev *d, double *out, const int *tokens, const double *wte,
                            const double *wpe, int B, int T, int C);
    void (*encoder_backward)(Dev *d, double *dwte, double *dwpe, const double *dout,
                             const int *tokens, int B, int T, int C);
    void (*layernorm_forward)(Dev *d, double *out, double *mean, double *rstd, const double *inp,
                              const double *w, const double *b, int N, int C);
    void (*layernorm_backward)(Dev *d, double *dinp, double *dw, double *db, const double *dout,
                               const double *inp, const double *w, const double *mean,
                               const double *rstd, int N, int C);
    void (*matmul_forward)(Dev *d, double *out, const double *inp, const double *w,
                           const double *bias, int N, int C, int OC);
    void (*matmul_backward)(Dev *d, double *dinp, double *dw, double *dbias, const double *dout,
                            const double *inp, const double *w, int N, int C, int OC);
    /* att [B,NH,T,T]: the probabilities; datt [B,NH,T,T]: backward's scratch */
    void (*attention_forward)(Dev *d, double *out, double *att, const double *qkv, int B, int T,
                              int C, int NH);
    void (*attention_backward)(Dev *d, double *dqkv, double *datt, const double *dout,
                               const double *qkv, const double *att, int B, int T, int C, int NH);
    void (*gelu_forward)(Dev *d, double *out, const double *inp, size_t n);
    void (*gelu_backward)(Dev *d, double *dinp, const double *inp, const double *dout, size_t n);
    void (*add)(Dev *d, double *out, const double *a, const double *b, size_t n);
    void (*accumulate)(Dev *d, double *dst, const double *src, size_t n);
    void (*crossentropy)(Dev *d, double *losses, double *logits, const int *targets, int N, int V,
                         int Vp, double dloss);
    void (*xent_stats)(Dev *d, double *stats, const double *logits, const int *targets, int N,
                       int v0, int nvalid, int Vl);
    void (*xent_combine)(Dev *d, double *losses, double *lse, const double *gathered, int N, int R);
    void (*xent_grad)(Dev *d, double *logits, const double *lse, const int *targets, int N, int v0,
                      int nvalid, int Vl, double dloss);
    void (*adamw)(Dev *d, double *param, const double *grad, double *m, double *v, size_t n,
                  double lr, double beta1, double beta2, double eps, double wd, double bc1,
                  double bc2, double grad_scale);
    double (*sumsq)(Dev *d, const double *x, size_t n);
    double (*sum)(Dev *d, const double *x, size_t n);
} Ops64;

extern const Ops64 cpu64_ops;   /* ops.c, built as ops64.o */

#endif
