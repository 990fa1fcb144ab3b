/* optim.h: AdamW, the learning-rate schedule and gradient clipping. */
#ifndef OPTIM_H
#define OPTIM_H

#include "gpt.h"

typedef struct OptConfig {
    float lr, lr_min;    /* peak and floor of the schedule */
    int warmup;          /* steps of linear warmup */
    int cosine;          /* 1: cosine decay to lr_min after warmup; 0: constant */
    int steps;           /* length of the run, for the cosine */
    float beta1, beta2, eps, wd;
    float clip;          /* max global gradient norm, 0 = off */
} OptConfig;

/* AdamW state for n parameters: moments m and v on dev, and the step count.
 * The pieces of a step are gathered by adam_update and run by adam_flush,
 * in one launch on a GPU. */
typedef struct Adam {
    Dev *dev;
    size_t n;
    float *m, *v;   /* [n] */
    int t;
    AdamSeg *segs;  /* [cap] the pieces waiting for adam_flush */
    int nsegs, cap;
    float lr, grad_scale;  /* of the waiting pieces */
    const OptConfig *o;
} Adam;

/* Learning rate of step s (0-based): (s+1)/warmup of lr while warming up,
 * then constant or lr_min + (lr - lr_min)(1 + cos(pi p))/2 with
 * p = (s - warmup)/(steps - warmup). */
float optim_lr(const OptConfig *o, int step);

/* torch.nn.utils.clip_grad_norm_'s factor: min(1, clip / (norm + 1e-6)), 1 when off. */
float optim_clip_scale(const OptConfig *o, double norm);

/* ---- The gradient norm ------------------------------------------------------
 * The same bits on every layout and thread count, so that a clipped step of
 * ZeRO-1 equals one of ZeRO-3 with offload (or of tp x pp) exactly: a sum of
 * squares in floating point depends on its order, and each layout adds its
 * shards in another. Instead, in two passes over the gradients each rank
 * holds (dp.c's global_norm): the largest exponent over all ranks (an int32
 * max), which fixes a grid; each square is cut into three parts on that
 * grid (Ops.norm_add), whose sums are whole numbers of units, exact in
 * double in any order; a rank's three sums travel as NORM_LIMBS int32
 * limbs, whose all-reduce is exact too (a low limb is below 2^16, so their
 * int32 sums hold for up to 32,768 ranks). What the grid drops lies 69 bits
 * (124M elements; fewer for more) below the largest square. The grid pass
 * finds the largest exponent as well, so optim_norm guesses the grid from
 * the last step's exponent and sums on it in the first pass; only when the
 * exponent found differs (the first step, or the largest gradient crossing
 * a power of 2) is a second pass's work done. The bits are those of the two
 * passes either way.
 *
 * On a GPU all of it stays on the device (tensor.h, NormAcc): the passes
 * add into the rank's NormAcc, its exponent and limbs are combined over
 * the ranks there, and the device, not the host, decides whether the
 * second pass reads the gradients (norm_redo's kernels return at once
 * where the guess held). The host reads back once, the exponent and the
 * limbs together: a training step's one wait (main.c). */
#define OPTIM_NORM_LIMBS NORM_LIMBS

/* The grid for e, the largest biased float exponent (0..254) among all the
 * n gradient elements the norm counts (every rank's). */
NormGrid optim_norm_grid(int e, size_t n);
/* The sum of squares from the limbs summed over every rank. */
double optim_norm_unpack(const int32_t limbs[NORM_LIMBS], const NormGrid *g);

/* What optim_norm calls for each run of gradients (float32, on the Dev)
 * a rank counts, with the arg it was given. */
typedef void OptimNormVisit(void *arg, const float *x, size_t n);
/* How a rank walks its runs: visit(arg, x, n) for each, in any order. */
typedef void OptimNormRuns(void *ctx, OptimNormVisit *visit, void *arg);
/* How it combines n int32s in the Dev's memory with the other ranks holding
 * gradients: their largest (max 1) or their sum (max 0), the Dev's later
 * work ordered after it, the host not waiting. */
typedef void OptimNormReduce(void *ctx, int32_t *x, int n, int max);
/* The global gradient norm of n elements in all (NAN when one is Inf or
 * NaN), on d with acc (d's memory) as its working state, with a grid
 * guessed from *guess, the last call's exponent (-1 for none), which it
 * updates. The host waits once, for the result. The same bits on every
 * rank and layout. */
double optim_norm(Dev *d, NormAcc *acc, int *guess, size_t n, OptimNormRuns *runs,
                  OptimNormReduce *reduce, void *ctx);

void adam_build(Adam *a, Dev *dev, size_t n);
void adam_free(Adam *a);

/* Starts an optimizer step: the bias corrections move to step t + 1. */
void adam_begin(Adam *a);

/* AdamW on the elements [offset, offset + count) of m's layout, whose
 * moments sit at a->m[state + k]: param[k] and grad[k] hold element
 * offset + k (a shard, or the whole model with offset 0); lp, when not
 * NULL, is param's bf16 compute copy, written too (AdamSeg). Gradients are
 * multiplied by grad_scale; weight decay only on the 2-D weights, wherever
 * the range cuts the tensors. */
void adam_update(Adam *a, size_t state, const GPT *m, float *param, void *lp, const float *grad,
                 size_t offset, size_t count, const OptConfig *o, float lr, float grad_scale);
/* Runs every piece adam_update gathered since the last flush (one launch on
 * a GPU); their buffers must stay where they are until then. Every update
 * of a step must use the same lr, grad_scale and config. */
void adam_flush(Adam *a);

#endif
