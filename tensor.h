/* tensor.h: where buffers live and the table of ops that computes on them.
 *
 * A Dev is one device of one rank: the CPU, or one CUDA GPU with its compute
 * stream. Memory is allocated, zeroed and copied through dev_* so the rest of
 * the program never asks where a pointer lives. Every op of the model sits in
 * an Ops table: ops.c holds the plain-C reference (float32 in `train`, and a
 * float64 build of the same file for the finite-difference tests), kernels.cu
 * the CUDA kernels with the same contracts. gpt.c only ever calls d->ops->x.
 *
 * Contracts shared by both tables (B batch, T time, C channels, NH heads,
 * N = B*T rows, V real vocabulary, Vp padded vocabulary):
 *  - every pointer is on the op's device; sizes are element counts;
 *  - "accumulates" means the op adds into its outputs (+=): callers zero
 *    gradient buffers once per step, so micro-batches accumulate for free;
 *  - offsets are computed in size_t: N*Vp and B*NH*T*T exceed int range
 *    for real models.
 */
#ifndef TENSOR_H
#define TENSOR_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum { DEV_CPU = 0, DEV_CUDA = 1 } DevKind;

/* bfloat16 on the host: the top 16 bits of a float32. Conversion to bf16
 * rounds to nearest, ties to even; a NaN stays a NaN. */
static inline float bf16_to_f32(uint16_t b) {
    union { uint32_t u; float f; } x = {.u = (uint32_t)b << 16};
    return x.f;
}
static inline uint16_t bf16_from_f32(float f) {
    union { float f; uint32_t u; } x = {.f = f};
    uint32_t u = x.u;
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  /* quiet NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}
/* x rounded to the nearest bf16, as a float. */
static inline float bf16_round(float f) { return bf16_to_f32(bf16_from_f32(f)); }

/* The element type of activations and of the compute copy of the
 * parameters on a Dev. Master parameters, their gradients, the optimizer
 * state, LayerNorm statistics and losses are float32 whatever it is. */
typedef enum { DT_F32 = 0, DT_BF16 = 1 } DType;
static inline size_t dt_size(DType t) { return t == DT_BF16 ? 2 : 4; }
static inline const char *dt_name(DType t) { return t == DT_BF16 ? "bf16" : "fp32"; }

typedef struct Ops Ops;

/* One piece of an optimizer step: n float32 elements of param, grad, m, v
 * (each pointer at the piece's first element), with weight decay wd; lp,
 * when not NULL, the piece's bf16 compute copy [n], which gets the new
 * values rounded as Ops.cast rounds (the copy the next use would make:
 * llm.c's AdamW kernel writes it likewise). */
typedef struct AdamSeg {
    float *param;
    const float *grad;
    float *m, *v;
    size_t n;
    float wd;
    void *lp;
} AdamSeg;

/* The fixed grid of the gradient norm's sum of squares (optim_norm_grid):
 * y = x^2 * scale is cut into three parts, each a multiple of its unit
 * (1, 2^-bits, 2^-2bits), part k = (rest + c[k]) - c[k] with c[k] = 1.5 *
 * 2^52 * unit k (round to nearest on that grid), rest what earlier parts
 * left. Each part's sum is a whole number of units below 2^50: exact. */
typedef struct NormGrid {
    double scale, c[3];
    int bits;
} NormGrid;

/* A run of float32 gradients, x [n], that the norm counts: a rank passes
 * all of its runs to one call of Ops.norm_add and of norm_redo, so that a
 * GPU launches once a pass however the layout cuts its gradients. */
typedef struct NormRun {
    const float *x;
    size_t n;
} NormRun;

/* The gradient norm's working state on a rank, where its gradients live
 * (device memory on a GPU), so that the passes, the combining over ranks
 * and the choice between the guessed grid and the found one all happen
 * there and the host reads back once (optim_norm; optim.h, "The gradient
 * norm"). Zeroed before each norm. */
#define NORM_LIMBS 12   /* 3 parts x 4 limbs of 16 bits */
typedef struct NormAcc {
    double s[3];               /* the parts' sums on the guessed grid (pass 1) */
    double r[3];               /* on the found exponent's grid (pass 2, when the guess was wrong) */
    int32_t e;                 /* the largest biased exponent: this rank's, then, combined, everyone's */
    int32_t limbs[NORM_LIMBS]; /* s or r as limbs (Ops.norm_pack), then summed over the ranks */
} NormAcc;

#ifdef __CUDACC__
#define NORM_HD __host__ __device__
#else
#define NORM_HD
#endif
/* The grid for e, the largest biased exponent (0..254) of the elements
 * counted, bits from their number (optim_norm_grid): x^2 * scale < 2^bits
 * for every |x| < 2^(e-126). One definition for the host and the kernels. */
static inline NORM_HD NormGrid norm_grid_at(int e, int bits) {
    NormGrid g;
    g.bits = bits;
    if (e < 1) e = 1;
    g.scale = ldexp(1.0, bits - (2 * e - 252));
    for (int k = 0; k < 3; k++) g.c[k] = ldexp(1.5, 52 - k * bits);
    return g;
}
/* Sums s on grid g as limbs whose int32 sums over ranks are the sums of
 * the parts: each part in whole units (|v| < 2^50), three limbs of 16 bits
 * and the rest, floor(v / 2^48) in -4..3, shifted while non-negative (>> of
 * a negative integer is implementation-defined). */
static inline NORM_HD void norm_pack_limbs(const double s[3], const NormGrid *g, int32_t limbs[NORM_LIMBS]) {
    for (int k = 0; k < 3; k++) {
        int64_t v = (int64_t)ldexp(s[k], k * g->bits);
        for (int j = 0; j < 3; j++) limbs[4 * k + j] = (int32_t)((uint64_t)v >> (16 * j) & 0xffff);
        limbs[4 * k + 3] = (int32_t)(((v + ((int64_t)1 << 50)) >> 48) - 4);
    }
}

/* A Dev's scratch: reductions' partials, the optimizer's segment table, and
 * split-K's parts of a weight gradient (tc.h: GPT-2 small's 768 x 768 in 7
 * parts is 6 x 2.25 MiB). */
#define DEV_SCRATCH_BYTES (32 << 20)

typedef struct Dev {
    DevKind kind;
    int gpu;               /* CUDA device index, -1 on the CPU */
    void *stream;          /* cudaStream_t of compute, NULL on the CPU */
    void *scratch;         /* CUDA: DEV_SCRATCH_BYTES of device memory for reductions */
    const Ops *ops;        /* cpu_ops, cpu_bf16_ops, cuda_ops or cuda_bf16_ops */
    DType dtype;           /* ops->dtype: activations and the compute copy of parameters */
    int pinned;            /* CPU only: allocate page-locked memory (host side of a GPU's copies) */
    int atomic_dq;         /* CUDA: attention's backward sums dq with atomics (--atomic-dq): the
                            * one kernel whose bits may change run to run; 0, the default: none */
    void *staging;         /* CUDA: pinned slots that small dev_from_host copies go through */
    int loss_deferred;     /* CUDA: ops->sum adds to the step's loss on the device (dev_loss_*) */
    void *loss_dev;        /* CUDA: [sum double, mean double, mean float] on the device */
    void *loss_host;       /* CUDA: the same, pinned: where dev_loss_queue copies it */
    void *loss_event;      /* CUDA: recorded after that copy */
    void *adam_table;      /* CUDA: AdamW's segment table on the device, kept between steps */
    void *adam_table_host; /* and the host's copy of what it holds, to upload only a change */
    size_t adam_table_bytes, adam_table_cap;
    size_t bytes_live;     /* bytes allocated through dev_alloc and not freed */
    size_t bytes_peak;     /* high-water mark of bytes_live */
} Dev;

struct Ops {
    /* Pointer types say what a buffer holds: `void *` is an activation or a
     * compute copy of parameters, in the table's dtype (4-byte floats in
     * cpu_ops and cuda_ops, 2-byte bf16 in cpu_bf16_ops and cuda_bf16_ops);
     * `float *` is always float32 (parameter gradients, statistics, losses).
     * Arithmetic is float32 in every table: inputs are widened, sums are
     * float32, and each output is rounded to the dtype once, when stored. */
    DType dtype;
    const char *name;      /* "cpu fp32", "cuda bf16", ... */
    /* out[B,T,C] = wte[tokens[b,t]] + wpe[t]. wte [Vp,C], wpe [maxT,C]. A
     * token < 0 (not in this rank's slice of the vocabulary) has no wte row;
     * wpe may be NULL (no position term). */
    void (*encoder_forward)(Dev *d, void *out, const int *tokens, const void *wte,
                            const void *wpe, int B, int T, int C);
    /* dwte[tokens[b,t]] += dout[b,t] (tokens >= 0), dwpe[t] += dout[b,t] (dwpe may
     * be NULL). Accumulates. plan: dev_embed_plan's of these tokens, on d,
     * with its run count; the CUDA tables then add each token's rows in
     * position order (no atomics: the same bits every run). NULL: any order. */
    void (*encoder_backward)(Dev *d, float *dwte, float *dwpe, const void *dout,
                             const int *tokens, const int *plan, int runs, int B, int T,
                             int C);
    /* out[N,C] = (inp - mean) * rstd * w + b, eps 1e-5 (biased variance);
     * mean[N], rstd[N] saved for backward. */
    void (*layernorm_forward)(Dev *d, void *out, float *mean, float *rstd, const void *inp,
                              const void *w, const void *b, int N, int C);
    /* Accumulates dinp[N,C], dw[C], db[C]. Either part may be left out: dinp
     * NULL computes the weights' gradients alone (w is then not read), dw and
     * db both NULL the input gradient alone; a pipeline's split backward
     * (pp.c's zero-bubble schedules) takes the one now and the other later. */
    void (*layernorm_backward)(Dev *d, void *dinp, float *dw, float *db, const void *dout,
                               const void *inp, const void *w, const float *mean,
                               const float *rstd, int N, int C);
    /* The residual add fused with the LayerNorm that follows it:
     * res[N,C] = a + b, then out = layernorm(res) as layernorm_forward. */
    void (*add_layernorm_forward)(Dev *d, void *res, void *out, float *mean, float *rstd,
                                  const void *a, const void *b, const void *w,
                                  const void *bias, int N, int C);
    /* out[N,OC] = inp[N,C] @ w[OC,C]^T + bias[OC]; bias may be NULL. */
    void (*matmul_forward)(Dev *d, void *out, const void *inp, const void *w,
                           const void *bias, int N, int C, int OC);
    /* fc's product and GELU in one op: out[N,OC] = inp[N,C] @ w[OC,C]^T +
     * bias[OC] (bias may be NULL), and gout[N,OC] = gelu(out) from out as
     * stored (rounded to the dtype): the bits of matmul_forward then
     * gelu_forward (ops_matmul_forward_gelu_seq, what the CPU tables run). */
    void (*matmul_forward_gelu)(Dev *d, void *out, void *gout, const void *inp, const void *w,
                                const void *bias, int N, int C, int OC);
    /* Writes dinp[N,C] = dout @ w (its old contents ignored); accumulates
     * dw[OC,C] += dout^T @ inp, dbias[OC] += sum_n dout. Any of dinp, dw,
     * dbias may be NULL to skip it (w is read only for dinp, inp only for
     * dw): the input gradient now and the weights' later is the split
     * backward of the zero-bubble schedules. dinp is written, not added to,
     * so that no pass zeroes it first and the GPU's product stores it
     * without reading it (matmul.cu's TMA-store epilogue): the same bits as
     * a product into zeros, 0 + x being x. */
    void (*matmul_backward)(Dev *d, void *dinp, float *dw, float *dbias, const void *dout,
                            const void *inp, const void *w, int N, int C, int OC);
    /* The MLP's fcproj input gradient through GELU's backward, in one op:
     * dfch[N,C] (written) = gelu'(fch) * (dout[N,OC] @ w[OC,C]), fch [N,C]
     * GELU's input. The bits are those of the two ops in sequence
     * (ops_matmul_backward_gelu_seq, what the CPU tables run): tmp zeroed,
     * matmul_backward(tmp, NULL, NULL, dout, NULL, w), dfch zeroed,
     * gelu_backward(dfch, fch, tmp): the product rounded to the dtype, then
     * the derivative's product rounded once. tmp [N,C] of the dtype: scratch
     * that the op may overwrite (the CUDA bf16 table's fused GEMM epilogue
     * never touches it). dbias [C] float32 or NULL: the bias gradient of
     * the layer that made fch too, dbias[c] += sum_n dfch[n,c], with the
     * bits of matmul_backward(NULL, NULL, dbias, dfch) after the rest
     * (the CUDA bf16 table sums the tiles it stores in the epilogue, in
     * that op's order). fcproj's weight and bias gradients stay
     * matmul_backward's (dinp NULL). */
    void (*matmul_backward_gelu)(Dev *d, void *dfch, float *dbias, void *tmp, const void *dout, const void *w,
                                 const void *fch, int N, int C, int OC);
    /* Causal self-attention. qkv [B,T,3C] holds q, k, v at channel offsets
     * 0, C, 2C; head h uses channels [h*hs, (h+1)*hs), hs = C/NH;
     * out [B,T,C] = softmax(q.k / sqrt(hs)) over t2 <= t, times v, heads
     * side by side. What forward keeps for backward is the table's own
     * business: `state` is float32 of attention_floats() elements (the
     * reference keeps the probabilities [B,NH,T,T]; the fused kernel keeps
     * one log-sum-exp a row, [B,NH,T]). */
    void (*attention_forward)(Dev *d, void *out, float *state, const void *qkv,
                              int B, int T, int C, int NH);
    /* Writes dqkv [B,T,3C] (every element: each head's q, k and v
     * channels at every position), given forward's qkv, out and state; as
     * if accumulated onto zeros, so a kernel that adds into its output
     * stores 0 + its sum and the bits match the zeroed buffer's.
     * scratch is float32 of *scratch_floats elements that the op may overwrite. */
    void (*attention_backward)(Dev *d, void *dqkv, float *scratch, const void *dout,
                               const void *qkv, const void *out, const float *state,
                               int B, int T, int C, int NH);
    /* The float32 elements of attention's state (returned) and backward scratch. */
    size_t (*attention_floats)(int B, int T, int C, int NH, size_t *scratch_floats);
    /* out[n] = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
    void (*gelu_forward)(Dev *d, void *out, const void *inp, size_t n);
    /* Accumulates dinp[n] += gelu'(inp) * dout. */
    void (*gelu_backward)(Dev *d, void *dinp, const void *inp, const void *dout, size_t n);
    /* out[n] = a + b (the residual connection; out may alias a or b). */
    void (*add)(Dev *d, void *out, const void *a, const void *b, size_t n);
    /* dst[n] += src, float32 (gradients). */
    void (*accumulate)(Dev *d, float *dst, const float *src, size_t n);
    /* dst[n] = src rounded to the table's dtype (the compute copy of parameters). */
    void (*cast)(Dev *d, void *dst, const float *src, size_t n);
    /* dst[n] = src widened to float32 (logits for sampling, tests). */
    void (*widen)(Dev *d, float *dst, const void *src, size_t n);
    /* Fused softmax + cross-entropy over the first V of Vp columns of
     * logits [N,Vp]: losses[N] = -log softmax(logits[n])[targets[n]].
     * If dloss != 0, logits is overwritten with its gradient
     * dloss * (softmax - onehot(target)), padded columns [V,Vp) set to 0. */
    void (*crossentropy)(Dev *d, float *losses, void *logits, const int *targets,
                         int N, int V, int Vp, float dloss);
    /* The vocabulary-parallel cross-entropy, in three parts. Each rank holds
     * logits [N,Vl] for vocabulary ids [v0, v0 + Vl), of which the first
     * nvalid are real classes (the rest padding).
     * stats [N,3]: per row the local max, the sum of exp(z - local max), and
     * the target's logit when the target is in this slice (else 0). */
    void (*xent_stats)(Dev *d, float *stats, const void *logits, const int *targets, int N,
                       int v0, int nvalid, int Vl);
    /* From every rank's stats, gathered [R,N,3]: lse[N] = log sum exp over
     * the whole vocabulary, losses[N] = lse - the target's logit. */
    void (*xent_combine)(Dev *d, float *losses, float *lse, const float *gathered, int N, int R);
    /* logits [N,Vl] overwritten with dloss * (softmax - onehot(target)) over
     * the valid columns, 0 in the padding. */
    void (*xent_grad)(Dev *d, void *logits, const float *lse, const int *targets, int N, int v0,
                      int nvalid, int Vl, float dloss);
    /* torch.optim.AdamW on n float32 elements, with g = grad * grad_scale:
     * p -= lr*wd*p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
     * p -= lr * (m/bc1) / (sqrt(v/bc2) + eps), bc1 = 1-b1^t, bc2 = 1-b2^t. */
    void (*adamw)(Dev *d, float *param, const float *grad, float *m, float *v, size_t n,
                  float lr, float beta1, float beta2, float eps, float wd,
                  float bc1, float bc2, float grad_scale);
    /* adamw over every segment, in one launch on a GPU (the segments of a
     * whole step: every tensor piece of every bucket this rank owns). */
    void (*adamw_segs)(Dev *d, const AdamSeg *segs, int nsegs, float lr, float beta1,
                       float beta2, float eps, float bc1, float bc2, float grad_scale);
    /* Sum of squares and plain sum of x[n] (float32), accumulated in double,
     * returned to the host. */
    double (*sumsq)(Dev *d, const float *x, size_t n);
    double (*sum)(Dev *d, const float *x, size_t n);
    /* The global gradient norm's steps (optim.h, "The gradient norm"), on
     * a NormAcc in the op's device memory, nothing read back, over the
     * rank's nruns runs (host array; the gradients in the op's memory).
     * norm_add: a->e = max(a->e, the largest biased exponent (0..255, 255
     * for an Inf or NaN) among the runs' floats), and with a grid g,
     * a->s[k] += the sum over them of part k of x^2 on g, exact, so any
     * order gives the same bits. norm_redo, once a->e holds every rank's
     * exponent: where it differs from guess (the exponent g was made for)
     * and is not 255, a->r[k] += the same sums on the grid of a->e
     * (norm_grid_at(a->e, bits)); else nothing. norm_pack: a->limbs = the
     * sums of that grid (a->s when a->e is guess, else a->r) as limbs,
     * zero for 255. */
    void (*norm_add)(Dev *d, NormAcc *a, const NormRun *runs, int nruns, const NormGrid *g);
    void (*norm_redo)(Dev *d, NormAcc *a, const NormRun *runs, int nruns, int guess, int bits);
    void (*norm_pack)(Dev *d, NormAcc *a, int guess, int bits);
};

extern const Ops cpu_ops;        /* ops.c: the float32 reference */
extern const Ops cpu_bf16_ops;   /* ops_bf16.c: the reference with bf16 storage */
extern const Ops cuda_ops;       /* kernels.cu, only when built with CUDA */
extern const Ops cuda_bf16_ops;  /* kernels.cu: bf16 storage, tensor cores */

/* Opens device `kind` (gpu index for CUDA). Returns 0, or -1 with a one-line
 * reason in err (no CUDA in this build, no GPU, bad index). */
int dev_open(Dev *d, DevKind kind, int gpu, char *err, size_t errlen);
/* Chooses the dtype of d's activations (DT_F32 after dev_open): swaps the
 * ops table. Call before anything is allocated for the model. */
void dev_set_dtype(Dev *d, DType t);
void dev_close(Dev *d);
/* The device's name into buf: "cpu", or the GPU's (cudaGetDeviceProperties). */
void dev_name(Dev *d, char *buf, size_t len);
/* Number of CUDA GPUs visible, 0 without CUDA or without a driver. */
int dev_gpu_count(void);

/* Allocates bytes on d, zeroed. Exits with a message naming the size on failure. */
void *dev_alloc(Dev *d, size_t bytes);
void dev_free(Dev *d, void *p, size_t bytes);
void dev_zero(Dev *d, void *p, size_t bytes);
void dev_to_host(Dev *d, void *host_dst, const void *dev_src, size_t bytes);
/* On return host_src may be reused. On a GPU a copy of up to 1 MiB is not
 * waited for: it goes through pinned staging (a micro-batch's tokens and
 * targets), queued on d's compute stream like a kernel; a larger one waits. */
void dev_from_host(Dev *d, void *dev_dst, const void *host_src, size_t bytes);
void dev_copy(Dev *d, void *dst, const void *src, size_t bytes);
/* dev_to_host and dev_from_host queued on d's compute stream without
 * waiting for them: the host buffer must be pinned (from a Dev with pinned
 * set) and left alone until dev_sync(d), or a later synchronous copy, says
 * the copy is done. On the CPU they are dev_to_host and dev_from_host. */
void dev_to_host_async(Dev *d, void *host_dst, const void *dev_src, size_t bytes);
void dev_from_host_async(Dev *d, void *dev_dst, const void *host_src, size_t bytes);
/* Waits for all work queued on d's compute stream. */
void dev_sync(Dev *d);
/* A GPU step's loss without a read-back of its own (issue 42: one read-back a
 * step, the loss and the norm together). After dev_loss_defer (whose first
 * call allocates the buffers) and until dev_loss_finish, a GPU's
 * ops->sum(x, n) adds sum / n on the device to the step's loss (the
 * arithmetic of gpt_head_forward's sum / N added up by pp_run, in the same
 * order, so the same bits) and returns 0. dev_loss_finish(d, M) turns it into
 * the step's mean, sum / M (a double, and a float as score_share_loss rounds
 * it), zeroes the sum and returns the float's device address (for an
 * all-reduce over dp); dev_loss_queue copies both to pinned memory without
 * waiting; dev_loss_read gives them (double, or the float), waiting for the
 * copy, which costs nothing when a wait for the stream has passed since (the
 * norm's read-back; a rank without one, the parameter server's workers,
 * waits here). GPU only. */
void dev_loss_defer(Dev *d);
float *dev_loss_finish(Dev *d, int M);
void dev_loss_queue(Dev *d);
double dev_loss_read(Dev *d, int as_float);
/* A named range of the host's work on d (a training step: "step S"), for
 * the tools: NVTX on a GPU (nsys, ncu --nvtx), the emulation's per-step
 * count of synchronizations (EMU_STEP_COUNTS); nothing on the CPU. Ranges
 * nest; each push needs its pop, on the same thread. */
void dev_range_push(Dev *d, const char *name);
void dev_range_pop(Dev *d);

/* The embedding backward's plan, on the host: the positions i < n with
 * tokens[i] >= 0 grouped by token (ascending), each group in position
 * order. plan [2n + 1] ints receives the R + 1 group starts, then the m
 * grouped positions: group r is plan[R + 1 + plan[r] .. R + 1 + plan[r + 1]).
 * Returns R, the number of distinct tokens; R + 1 + m ints are written. */
int dev_embed_plan(const int *tokens, int n, int *plan);

/* CUDA side, implemented in kernels.cu (extern "C"); tensor.c calls these
 * only in a CUDA build. Each checks its CUDA call and exits with
 * "CUDA error: <call> at <file>:<line>: <reason>" on failure. They act on
 * the calling thread's current device, which cuda_open sets: call them from
 * the thread that opened the Dev. Everything is queued on the compute
 * stream; another stream (communication) must wait on it with an event
 * before it reads what the ops wrote. */
int cuda_device_count(void);
/* Selects GPU `gpu`, creates the compute stream and DEV_SCRATCH_BYTES of scratch. */
int cuda_open(int gpu, void **stream, void **scratch, char *err, size_t errlen);
void cuda_close(void *stream, void *scratch);
void cuda_device_name(int gpu, char *buf, size_t len);
void *cuda_malloc(size_t bytes);
void cuda_free(void *p);
/* Page-locked host memory (cudaMallocHost), for fast copies to and from a GPU. */
void *cuda_malloc_host(size_t bytes);
void cuda_free_host(void *p);
void cuda_memset0(void *p, size_t bytes, void *stream);
void cuda_copy_d2h(void *host, const void *dev, size_t bytes, void *stream);
void cuda_copy_h2d(void *dev, const void *host, size_t bytes, void *stream);
void cuda_copy_d2d(void *dst, const void *src, size_t bytes, void *stream);
/* Queued only (pinned host memory): done when the stream gets there. */
void cuda_copy_d2h_async(void *host, const void *dev, size_t bytes, void *stream);
void cuda_copy_h2d_async(void *dev, const void *host, size_t bytes, void *stream);
void cuda_sync(void *stream);
/* cuda_copy_h2d without the wait for a copy of up to 1 MiB: host is copied
 * into the next of 16 pinned slots (*staging, made at the first call), whose
 * last copy is waited for first (long done, as a rule), and the slot's copy
 * is queued. cuda_staging_free frees them (after the stream's work). */
void cuda_copy_h2d_staged(void **staging, void *dev, const void *host, size_t bytes, void *stream);
void cuda_staging_free(void *staging);
/* dev_loss_*'s device side: sum_mean [3 doubles] (sum, mean; the mean's
 * float in the third's first 4 bytes) */
void cuda_loss_finish(void *sum_mean, int M, void *stream);
/* An event (timing off): made, recorded on a stream, waited for by the host, destroyed. */
void *cuda_event_new(void);
void cuda_event_record(void *event, void *stream);
void cuda_event_wait(void *event);
void cuda_event_free(void *event);
/* Context parallelism's ring on a GPU (cp.c), t the dtype of qkv, kv, out
 * and dout; everything else float32; queued on stream. One block step
 * forward: rank r's rows of qkv [B,Tl,3C] (Tl = T/N) against rank s's kv
 * [B,Tl,2C], merged by log-sum-exp into acc [B,Tl,C] and lse [B,NH,Tl]
 * (first: they hold nothing yet). Backward: dq [B,Tl,C] and dkv [B,Tl,2C]
 * accumulate, given the merged lse and D [B,NH,Tl] = cuda_cp_prep's dO . O. */
void cuda_cp_block_forward(float *acc, float *lse, const void *qkv, const void *kv, int B, int T, int C, int NH,
                           int N, int r, int s, int first, DType t, void *stream);
void cuda_cp_block_backward(float *dq, float *dkv, const void *qkv, const void *kv, const float *lse,
                            const float *D, const void *dout, int B, int T, int C, int NH, int N, int r, int s,
                            DType t, void *stream);
void cuda_cp_prep(float *D, const void *out, const void *dout, int B, int Tl, int C, int NH, DType t, void *stream);
/* dst [rows,ldd] columns off..off+w (dtype td) = src [rows,lds] columns offs.. (dtype ts), converted. */
void cuda_cp_copy_cols(void *dst, DType td, size_t ldd, size_t off, const void *src, DType ts, size_t lds,
                       size_t offs, size_t w, size_t rows, void *stream);
/* nvtxRangePushA / nvtxRangePop: free when no tool listens. */
void cuda_range_push(const char *name);
void cuda_range_pop(void);

#endif
