/* dp.h: data parallelism (DDP, the parameter server) over one dp group,
 * with ZeRO (zero.h) deciding what each rank keeps.
 *
 * dp.c cuts the gradients into buckets and reduces each as soon as backward
 * has finished it; zero.c decides which part of each bucket this rank owns
 * and keeps the optimizer state (and with ZeRO-2/3 the gradients and
 * parameters) of that part only. One mechanism serves every mode:
 *
 *   mode          reduce a bucket            owner of a bucket     after the update
 *   DDP, zero 0   all-reduce                 every rank, all of it  nothing
 *   --dp-mode ps  send to rank 0, it sums    rank 0, all of it      rank 0 sends params
 *   zero 1        reduce-scatter             shard r to rank r      all-gather params
 *   zero 2        reduce-scatter per micro-batch, unowned grads dropped  all-gather params
 *   zero 3        as 2; params sharded too, gathered around each unit's use
 */
#ifndef DP_H
#define DP_H

#include "comm.h"
#include "gpt.h"
#include "optim.h"
#include "zero.h"
#include "layout.h"   /* DPMode, and the Layout dp_build reads */

/* Bytes this rank holds (zero.h's accounting) and the parameter server's
 * staging buffer among the transient ones. */
typedef ZeroMemory DPMemory;

typedef struct DP {
    DPMode mode;               /* the layout's: DDP or the parameter server */
    int zero;                  /* the layout's ZeRO stage (0-3; its offload is z.offload) */
    double bucket_mb;          /* DDP and ZeRO-1 bucket size, MB of float32 gradients */
    GPT *m;
    Dev *dev;
    Comm *comm;
    CommGroup *g;              /* the dp group */
    CommGroup *tp;             /* the tp group: the norm sums over it too (NULL: none) */
    CommGroup *pp;             /* the pp group: and over it (NULL: none) */
    CommGroup *embed;          /* first and last stage: the tied wte's gradients (NULL: none) */
    int D, rank;               /* its size and this rank's index */
    int nbuckets;
    ZeroBucket *buckets;       /* [nbuckets], in backward order */
    int *pending;              /* [nbuckets] units of each not yet ready in this micro-batch */
    int *unit_bucket;          /* [nunits] */
    int reducing;              /* reduce in this micro-batch's backward */
    Zero z;                    /* ownership and the optimizer */
    float *stage;              /* ps rank 0: [largest bucket] received gradients */
    size_t stage_n;
    int norm_e;                /* the last step's largest gradient exponent, the next grid's guess (-1: none) */
    NormAcc *norm_acc;         /* the norm's working state, on dev (optim_norm) */
} DP;

/* Sets up data parallelism over the mesh's dp group for model m (built
 * whole, its parameters initialised, identical on every rank) as layout l
 * says (its dp mode, ZeRO stage and offload; layout_check has passed it),
 * gradients reduced in buckets of bucket_mb: buckets, ownership, optimizer
 * state; with zero 2/3 it frees m's full gradients (and parameters) and
 * installs m's hooks. Returns 0, or -1 with err (out of memory). */
int dp_build(DP *dp, const Layout *l, double bucket_mb, GPT *m, Comm *c, CommMesh *mesh, const OptConfig *opt,
             char *err, size_t errlen);
void dp_free(DP *dp);

/* A step: dp_step_begin, then per micro-batch the model's forward and
 * backward, dp_micro_batch before each backward (before each B and each W
 * of a pipeline's split backward; last: no later one writes the gradients
 * this one writes), then dp_step_end, which waits for the reductions,
 * takes the global gradient norm (each element counted once), clips,
 * updates the owned part and brings every rank's parameters up to date.
 * Returns the norm before clipping. */
void dp_step_begin(DP *dp);
void dp_micro_batch(DP *dp, int last);
double dp_step_end(DP *dp, float lr);

/* The whole model's parameters on dev, for saving: m->params, or with
 * ZeRO-3 a gathered copy (collective) that dp_full_params_free releases. */
float *dp_full_params(DP *dp);
void dp_full_params_free(DP *dp, float *p);

/* What this rank holds, measured and by the formula. */
void dp_memory(const DP *dp, DPMemory *mem);

#endif
