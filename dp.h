/* dp.h: data parallelism (DDP, the parameter server) and ZeRO, over one dp group.
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
 *   zero 2        reduce-scatter per micro-batch, unowned grads freed  all-gather params
 *   zero 3        as 2; params sharded too, gathered around each unit's use
 */
#ifndef DP_H
#define DP_H

#include "comm.h"
#include "gpt.h"
#include "optim.h"

typedef enum { DP_ALLREDUCE = 0, DP_PS = 1 } DPMode;

typedef struct DPConfig {
    DPMode mode;
    int zero;           /* 0, 1, 2, 3 */
    int offload;        /* optimizer state and step on the host */
    double bucket_mb;   /* DDP and ZeRO-1 bucket size, MB of float32 gradients */
} DPConfig;

/* A run of consecutive units, reduced as one message. */
typedef struct DPBucket {
    size_t off, n;           /* elements [off, off + n) of the layout */
    int unit_lo, unit_hi;    /* the units it covers */
    int pending;             /* units of it not yet ready in this micro-batch */
    size_t own_off, own_n;   /* this rank owns [off + own_off, off + own_off + own_n) */
    size_t state_off;        /* where the owned part starts in shard buffers */
} DPBucket;

/* Bytes this rank holds, measured from its allocations, and the ZeRO
 * paper's formula for them (float32 training: 4 + 4 + 8 bytes a parameter). */
typedef struct DPMemory {
    double params, grads, optim, optim_host;   /* measured */
    double f_params, f_grads, f_optim;         /* formula */
    double transient_peak;                     /* gathered and reduced units, at most */
} DPMemory;

typedef struct DP {
    DPConfig cfg;
    GPT *m;
    Dev *dev;
    Comm *comm;
    CommGroup *g;              /* the dp group */
    CommGroup *tp;             /* the tp group: the norm sums over it too (NULL: none) */
    CommGroup *pp;             /* the pp group: and over it (NULL: none) */
    CommGroup *embed;          /* first and last stage: the tied wte's gradients (NULL: none) */
    int D, rank;               /* its size and this rank's index */
    const OptConfig *opt;
    int nbuckets;
    DPBucket *buckets;         /* [nbuckets], in backward order */
    int *unit_bucket;          /* [nunits] */
    int reducing;              /* reduce in this micro-batch's backward */
    size_t owned;              /* elements this rank owns, S */
    Adam adam;                 /* moments of the owned elements [S] (on host with offload) */
    Dev host;                  /* the CPU, for offload */
    float *grad_shard;         /* zero >= 2: [S] on dev */
    float *param_shard;        /* zero 3: [S] on dev */
    float *host_master;        /* offload: [S] float32 master weights on the host */
    float *host_grads;         /* offload: [S] gradients brought down */
    float *stage;              /* ps rank 0: [largest bucket] received gradients */
    size_t stage_n;
    int *param_refs;           /* zero 3: [nunits] users of each gathered unit */
    int last_unit;             /* zero 3: the unit acquired last (which way the pass runs) */
    int prefetch_unit;         /* zero 3: the unit being gathered ahead, -1 when none */
    float *prefetch_buf;       /* zero 3: its buffer */
    size_t transient, transient_peak;  /* bytes of gathered / reduced units */
} DP;

/* Sets up data parallelism over group g for model m (built whole, its
 * parameters initialised, identical on every rank): buckets, ownership,
 * optimizer state; with zero 2/3 it frees m's full gradients (and
 * parameters) and installs m's hooks. Returns 0, or -1 with err. */
int dp_build(DP *dp, const DPConfig *cfg, GPT *m, Comm *c, CommMesh *mesh, const OptConfig *opt,
             char *err, size_t errlen);
void dp_free(DP *dp);

/* A step: dp_step_begin, then per micro-batch dp_micro_batch and the model's
 * forward and backward, then dp_step_end, which waits for the reductions,
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

/* Sum of squares of grads[k] = gradient of element offset + k, k < count,
 * counting a tensor every tp rank holds whole only on tp rank 0, and the
 * tied wte only on the first stage. */
double dp_sumsq(DP *dp, const float *grads, size_t offset, size_t count);

/* zero.c: ownership, the sharded optimizer, ZeRO-3's gathers, memory. */
void zero_layout(DP *dp);
int zero_build(DP *dp, char *err, size_t errlen);
void zero_free(DP *dp);
/* Reduces bucket b's gradients (grads: its n elements on dev) into what this rank owns. */
void zero_reduce_bucket(DP *dp, DPBucket *b, float *grads);
/* Sum of squares of the owned gradients of this rank. */
double zero_owned_sumsq(DP *dp);
/* Where the owned gradients of bucket b are after its reduction. */
float *zero_owned_grads(DP *dp, DPBucket *b);
/* AdamW on the owned elements, then parameters back on every rank. */
void zero_update(DP *dp, float lr, float grad_scale);
void zero_params_acquire(void *ctx, GPT *m, int unit);
void zero_params_release(void *ctx, GPT *m, int unit);
/* Drops a prefetched unit (before an update makes it stale; at the end). */
void zero_prefetch_drop(DP *dp);
void zero_memory(const DP *dp, DPMemory *mem);

#endif
