/* optim.c: AdamW with bias correction, warmup + cosine schedule, clipping.
 *
 * torch.optim.AdamW's arithmetic (decoupled weight decay), the schedule of
 * nanoGPT and llm.c, clipping as torch.nn.utils.clip_grad_norm_. The ZeRO
 * stages (zero.c) shard the state this file keeps whole.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "optim.h"

float optim_lr(const OptConfig *o, int step) {
    if (step < o->warmup) return o->lr * (float)(step + 1) / (float)o->warmup;
    if (!o->cosine || o->steps <= o->warmup) return o->lr;
    double p = (double)(step - o->warmup) / (double)(o->steps - o->warmup);
    return (float)(o->lr_min + 0.5 * (o->lr - o->lr_min) * (1.0 + cos(M_PI * p)));
}

float optim_clip_scale(const OptConfig *o, double norm) {
    if (o->clip <= 0) return 1.0f;
    double s = o->clip / (norm + 1e-6);
    return s < 1.0 ? (float)s : 1.0f;
}

NormGrid optim_norm_grid(int e, size_t n) {
    int b = 1;
    while (b < 63 && (n >> b)) b++;               /* n < 2^b */
    NormGrid g = {.bits = 50 - b < 4 ? 4 : 50 - b};  /* n x 2^bits < 2^50 */
    if (e < 1) e = 1;                             /* |x| < 2^(e-126), x^2 < 2^(2e-252) */
    g.scale = ldexp(1.0, g.bits - (2 * e - 252)); /* x^2 * scale < 2^bits */
    for (int k = 0; k < 3; k++) g.c[k] = ldexp(1.5, 52 - k * g.bits);
    return g;
}

void optim_norm_pack(const double acc[3], const NormGrid *g, int32_t limbs[OPTIM_NORM_LIMBS]) {
    for (int k = 0; k < 3; k++) {
        int64_t v = (int64_t)ldexp(acc[k], k * g->bits);   /* whole units, |v| < 2^50 */
        for (int j = 0; j < 3; j++) limbs[4 * k + j] = (int32_t)((uint64_t)v >> (16 * j) & 0xffff);
        /* the rest, floor(v / 2^48) in -4..3: shifted while non-negative (>> of a
         * negative int is implementation-defined) */
        limbs[4 * k + 3] = (int32_t)(((v + ((int64_t)1 << 50)) >> 48) - 4);
    }
}

double optim_norm_unpack(const int32_t limbs[OPTIM_NORM_LIMBS], const NormGrid *g) {
    double s = 0;
    for (int k = 2; k >= 0; k--) {
        int64_t v = 0;
        for (int j = 0; j < 4; j++) v += (int64_t)limbs[4 * k + j] * ((int64_t)1 << (16 * j));
        s = ldexp(s, -g->bits) + (double)v;
    }
    return s / g->scale;
}

double optim_norm(int *guess, size_t n, OptimNormPass *pass, OptimNormReduce *reduce, void *ctx) {
    /* Every rank takes the same branch: the guess and the exponent found
     * (after the max over ranks) are the same on all of them. */
    int g0 = *guess;
    NormGrid g = optim_norm_grid(g0, n);
    double acc[3] = {0, 0, 0};
    int32_t e = pass(ctx, g0 >= 0 ? &g : NULL, acc), limbs[OPTIM_NORM_LIMBS];
    reduce(ctx, &e, 1, 1);
    *guess = e;
    if (e == 255) return NAN;   /* an Inf or NaN gradient somewhere */
    if (e != g0) {              /* no guess, or a wrong one: again on the right grid */
        g = optim_norm_grid(e, n);
        acc[0] = acc[1] = acc[2] = 0;
        pass(ctx, &g, acc);
    }
    optim_norm_pack(acc, &g, limbs);
    reduce(ctx, limbs, OPTIM_NORM_LIMBS, 0);
    return sqrt(optim_norm_unpack(limbs, &g));
}

void adam_build(Adam *a, Dev *dev, size_t n) {
    memset(a, 0, sizeof *a);
    a->dev = dev;
    a->n = n;
    a->m = dev_alloc(dev, n * sizeof(float));
    a->v = dev_alloc(dev, n * sizeof(float));
}

void adam_free(Adam *a) {
    dev_free(a->dev, a->m, a->n * sizeof(float));
    dev_free(a->dev, a->v, a->n * sizeof(float));
    free(a->segs);
    memset(a, 0, sizeof *a);
}

typedef struct AdamStep {
    Adam *a;
    size_t state;
    float *param;
    const float *grad;
    size_t offset;
} AdamStep;

/* One piece of the range inside one tensor: weight decay is the tensor's. */
static void adam_segment(void *ctx, size_t off, size_t n, int tensor) {
    AdamStep *s = ctx;
    Adam *a = s->a;
    size_t k = off - s->offset, st = s->state + k;
    if (a->nsegs == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 64;
        a->segs = realloc(a->segs, (size_t)a->cap * sizeof *a->segs);
        if (!a->segs) { fprintf(stderr, "error: out of host memory (optimizer segments)\n"); exit(1); }
    }
    a->segs[a->nsegs++] = (AdamSeg){s->param + k, s->grad + k, a->m + st, a->v + st, n,
                                    gpt_tensor_decays(tensor) ? a->o->wd : 0.0f};
}

void adam_begin(Adam *a) { a->t++; }

void adam_update(Adam *a, size_t state, const GPT *m, float *param, const float *grad,
                 size_t offset, size_t count, const OptConfig *o, float lr, float grad_scale) {
    a->o = o;
    a->lr = lr;
    a->grad_scale = grad_scale;
    AdamStep s = {a, state, param, grad, offset};
    gpt_segments(m, offset, count, adam_segment, &s);
}

void adam_flush(Adam *a) {
    if (!a->nsegs) return;
    const OptConfig *o = a->o;
    float bc1 = (float)(1.0 - pow(o->beta1, a->t)), bc2 = (float)(1.0 - pow(o->beta2, a->t));
    a->dev->ops->adamw_segs(a->dev, a->segs, a->nsegs, a->lr, o->beta1, o->beta2, o->eps, bc1, bc2,
                            a->grad_scale);
    a->nsegs = 0;
}
