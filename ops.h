/* ops.h: the plain-C reference ops, declared for one precision.
 *
 * ops.c is compiled twice: as float (`real` = float, names cpu_*), which is
 * what `train` runs and what the cpu_ops table points to, and as double
 * (-DOPS_REAL=double, names cpu64_*), which only the finite-difference tests
 * link. So this header has no include guard: the includer defines `real` and
 * OP(name) first. Contracts are the Ops comments in tensor.h.
 */
void OP(encoder_forward)(Dev *d, real *out, const int *tokens, const real *wte, const real *wpe,
                         int B, int T, int C);
void OP(encoder_backward)(Dev *d, real *dwte, real *dwpe, const real *dout, const int *tokens,
                          int B, int T, int C);
void OP(layernorm_forward)(Dev *d, real *out, real *mean, real *rstd, const real *inp,
                           const real *w, const real *b, int N, int C);
void OP(layernorm_backward)(Dev *d, real *dinp, real *dw, real *db, const real *dout,
                            const real *inp, const real *w, const real *mean, const real *rstd,
                            int N, int C);
void OP(matmul_forward)(Dev *d, real *out, const real *inp, const real *w, const real *bias,
                        int N, int C, int OC);
void OP(matmul_backward)(Dev *d, real *dinp, real *dw, real *dbias, const real *dout,
                         const real *inp, const real *w, int N, int C, int OC);
void OP(attention_forward)(Dev *d, real *out, real *att, const real *qkv, int B, int T, int C,
                           int NH);
void OP(attention_backward)(Dev *d, real *dqkv, real *datt, const real *dout, const real *qkv,
                            const real *att, int B, int T, int C, int NH);
void OP(gelu_forward)(Dev *d, real *out, const real *inp, size_t n);
void OP(gelu_backward)(Dev *d, real *dinp, const real *inp, const real *dout, size_t n);
void OP(add)(Dev *d, real *out, const real *a, const real *b, size_t n);
void OP(accumulate)(Dev *d, real *dst, const real *src, size_t n);
void OP(crossentropy)(Dev *d, real *losses, real *logits, const int *targets, int N, int V, int Vp,
                      real dloss);
void OP(xent_stats)(Dev *d, real *stats, const real *logits, const int *targets, int N, int v0,
                    int nvalid, int Vl);
void OP(xent_combine)(Dev *d, real *losses, real *lse, const real *gathered, int N, int R);
void OP(xent_grad)(Dev *d, real *logits, const real *lse, const int *targets, int N, int v0,
                   int nvalid, int Vl, real dloss);
void OP(adamw)(Dev *d, real *param, const real *grad, real *m, real *v, size_t n, real lr,
               real beta1, real beta2, real eps, real wd, real bc1, real bc2, real grad_scale);
double OP(sumsq)(Dev *d, const real *x, size_t n);
double OP(sum)(Dev *d, const real *x, size_t n);
/* Float32 elements of the reference attention's state and scratch (both [B,NH,T,T]). */
size_t cpu_attention_floats(int B, int T, int C, int NH, size_t *scratch_floats);
/* The float32 table's exp_max and sumsq_grid (the bf16 table's too). */
int cpu_exp_max(Dev *d, const float *x, size_t n);
int cpu_sumsq_grid(Dev *d, const float *x, size_t n, const NormGrid *g, double acc[3]);
/* adamw over each of nsegs segments (the float32 table's adamw_segs). */
void cpu_adamw_segs(Dev *d, const AdamSeg *segs, int nsegs, float lr, float beta1, float beta2,
                    float eps, float bc1, float bc2, float grad_scale);
