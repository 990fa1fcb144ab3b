/* optim.c: AdamW with bias correction, warmup + cosine schedule, clipping.
 *
 * torch.optim.AdamW's arithmetic (decoupled weight decay), the schedule of
 * nanoGPT and llm.c, clipping as torch.nn.utils.clip_grad_norm_. The ZeRO
 * stages (zero.c) shard the state this file keeps whole.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "optim.h"
#include "safe.h"

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
    while (b < 63 && (n >> b)) b++;                   /* n < 2^b */
    return norm_grid_at(e, 50 - b < 4 ? 4 : 50 - b);  /* n x 2^bits < 2^50 */
}

double optim_norm_unpack(const int32_t limbs[NORM_LIMBS], const NormGrid *g) {
    double s = 0;
    for (int k = 2; k >= 0; k--) {
        int64_t v = 0;
        for (int j = 0; j < 4; j++) v += (int64_t)limbs[4 * k + j] * ((int64_t)1 << (16 * j));
        s = ldexp(s, -g->bits) + (double)v;
    }
    return s / g->scale;
}

/* The rank's runs, gathered for the two passes (each one Ops call). */
typedef struct NormRunList {
    NormRun *r;
    int n, cap;
} NormRunList;

static void norm_gather(void *arg, const float *x, size_t n) {
    NormRunList *q = arg;
    if (q->n == q->cap) {
        q->cap = q->cap ? 2 * q->cap : 16;
        q->r = safe_realloc(q->r, (size_t)q->cap * sizeof *q->r, "the norm's runs");
    }
    q->r[q->n++] = (NormRun){x, n};
}

_Static_assert(offsetof(NormAcc, limbs) == offsetof(NormAcc, e) + sizeof(int32_t),
               "optim_norm reads NormAcc's e and limbs back in one copy");

double optim_norm(Dev *d, NormAcc *acc, int *guess, size_t n, OptimNormRuns *runs,
                  OptimNormReduce *reduce, void *ctx) {
    /* Every rank takes the same steps: what differs with the guess's truth
     * is decided from the combined exponent, the same on all of them. */
    const int g0 = *guess;
    const NormGrid g = optim_norm_grid(g0, n);
    NormRunList q = {NULL, 0, 0};
    runs(ctx, norm_gather, &q);
    dev_zero(d, acc, sizeof *acc);
    d->ops->norm_add(d, acc, q.r, q.n, g0 >= 0 ? &g : NULL);  /* exponents, and the sums on the guessed grid */
    reduce(ctx, &acc->e, 1, 1);                               /* everyone's largest exponent */
    d->ops->norm_redo(d, acc, q.r, q.n, g0, g.bits);          /* again on its grid, where the guess was wrong */
    free(q.r);
    d->ops->norm_pack(d, acc, g0, g.bits);
    reduce(ctx, acc->limbs, NORM_LIMBS, 0);
    int32_t out[1 + NORM_LIMBS];               /* e, then the limbs: contiguous in NormAcc */
    dev_to_host(d, out, &acc->e, sizeof out);  /* the host's one wait */
    *guess = out[0];
    if (out[0] == 255) return NAN;             /* an Inf or NaN gradient somewhere */
    const NormGrid ge = optim_norm_grid(out[0], n);
    return sqrt(optim_norm_unpack(out + 1, &ge));
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
    uint16_t *lp;   /* param's bf16 copy, or NULL */
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
        a->segs = safe_realloc(a->segs, (size_t)a->cap * sizeof *a->segs, "the optimizer's segments");
    }
    a->segs[a->nsegs++] = (AdamSeg){s->param + k, s->grad + k, a->m + st, a->v + st, n,
                                    gpt_tensor_decays(tensor) ? a->o->wd : 0.0f, s->lp ? s->lp + k : NULL};
}

void adam_begin(Adam *a) { a->t++; }

void adam_update(Adam *a, size_t state, const GPT *m, float *param, void *lp, const float *grad,
                 size_t offset, size_t count, const OptConfig *o, float lr, float grad_scale) {
    a->o = o;
    a->lr = lr;
    a->grad_scale = grad_scale;
    AdamStep s = {a, state, param, lp, grad, offset};
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
