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

void adam_build(Adam *a, Dev *dev, size_t n);
void adam_free(Adam *a);

/* Starts an optimizer step: the bias corrections move to step t + 1. */
void adam_begin(Adam *a);

/* AdamW on the elements [offset, offset + count) of m's layout, whose
 * moments sit at a->m[state + k]: param[k] and grad[k] hold element
 * offset + k (a shard, or the whole model with offset 0). Gradients are
 * multiplied by grad_scale; weight decay only on the 2-D weights, wherever
 * the range cuts the tensors. */
void adam_update(Adam *a, size_t state, const GPT *m, float *param, const float *grad,
                 size_t offset, size_t count, const OptConfig *o, float lr, float grad_scale);
/* Runs every piece adam_update gathered since the last flush (one launch on
 * a GPU); their buffers must stay where they are until then. Every update
 * of a step must use the same lr, grad_scale and config. */
void adam_flush(Adam *a);

#endif
