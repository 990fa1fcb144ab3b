/* zero.h: ZeRO-1, 2, 3 and ZeRO-Offload over one dp group: who owns which
 * part of each bucket, the optimizer over the owned part, and ZeRO-3's
 * gathers (auto-parallel-partitioning.txt 2.3; hybrid-parallelism.txt,
 * DP+PP+TP+ZeRO).
 *
 * The caller (dp.c) cuts the layout into buckets of consecutive units and
 * says when a bucket's gradients are ready; this module decides what each
 * rank keeps of it and does everything with what it keeps:
 *
 *   owners        a bucket's owner           after the update
 *   ZERO_ALL      every rank, all of it      nothing (DDP: all-reduced grads)
 *   ZERO_MASTER   rank 0, all of it          rank 0 sends params (the parameter server)
 *   ZERO_SHARD    shard r to rank r          all-gather params (stages 1, 2; 3 gathers on use)
 */
#ifndef ZERO_H
#define ZERO_H

#include "comm.h"
#include "gpt.h"
#include "optim.h"

/* A run of consecutive units, reduced as one message. */
typedef struct ZeroBucket {
    size_t off, n;           /* elements [off, off + n) of the layout */
    int unit_lo, unit_hi;    /* the units it covers */
    size_t own_off, own_n;   /* this rank owns [off + own_off, off + own_off + own_n) */
    size_t state_off;        /* where the owned part starts in shard buffers */
} ZeroBucket;

typedef enum { ZERO_ALL = 0, ZERO_MASTER = 1, ZERO_SHARD = 2 } ZeroOwners;

/* Buffers that come and go within a step (ZeRO-2's unit gradients, ZeRO-3's
 * gathered units), kept for reuse instead of freed: a cudaFree synchronises
 * the whole device, which would undo every overlap. Blocks are matched by
 * exact size (a model has a few unit sizes). */
typedef struct ZeroPoolBlock {
    float *p;
    size_t bytes;
    int used;
} ZeroPoolBlock;

/* A unit's reduced shard waiting to be added into grad_shard: the add reads
 * what the reduce-scatter wrote, so it waits for that operation; deferring
 * it to the next unit lets the reduction run under that unit's backward. */
typedef struct ZeroPending {
    int unit;                /* -1: none */
    float *buf;              /* the unit's gradients [n]; the shard sits at own_off */
    int bucket;
    CommOp op;               /* the reduce-scatter */
} ZeroPending;

typedef struct Zero {
    int stage;                 /* 0 .. 3 (0 with ZERO_ALL or ZERO_MASTER) */
    ZeroOwners owners;
    int offload;               /* optimizer state and step on the host */
    GPT *m;
    Dev *dev;
    CommGroup *g;              /* the dp group */
    int D, rank;               /* its size and this rank's index */
    const OptConfig *opt;
    ZeroBucket *buckets;       /* [nbuckets] the caller's, in backward order */
    int nbuckets;
    const int *unit_bucket;    /* [nunits] the caller's */
    size_t owned;              /* elements this rank owns, S */
    Adam adam;                 /* moments of the owned elements [S] (on the host with offload) */
    Dev host;                  /* the CPU, for offload */
    float *grad_shard;         /* stage >= 2: [S] on dev */
    float *param_shard;        /* stage 3: [S] on dev */
    float *host_master;        /* offload: [S] float32 master weights on the host */
    float *host_grads;         /* offload: [S] gradients brought down */
    int *param_refs;           /* stage 3: [nunits] users of each gathered unit */
    int last_unit;             /* stage 3: the unit acquired last (which way the pass runs) */
    int prefetch_unit;         /* stage 3: the unit being gathered ahead, -1 when none */
    float *prefetch_buf;       /* stage 3: its buffer */
    CommOp prefetch_op;        /* stage 3: its gather */
    ZeroPending pending;       /* stage >= 2: the last unit's shard, not yet added */
    ZeroPoolBlock *pool;       /* [npool] stage >= 2: transient buffers */
    int npool;
    size_t transient, transient_peak;  /* bytes of transient buffers in use */
} Zero;

/* Bytes this rank holds, measured from its allocations, and the ZeRO
 * paper's formula for them (float32 training: 4 + 4 + 8 bytes a parameter). */
typedef struct ZeroMemory {
    double params, grads, optim, optim_host;   /* measured */
    double f_params, f_grads, f_optim;         /* formula */
    double transient_peak;                     /* gathered and reduced units in use, at most */
    double transient_pool;                     /* what the pool holds for them */
} ZeroMemory;

/* Decides ownership of buckets[nbuckets] (filling own_off, own_n and
 * state_off) and sets z->owned; nothing is allocated. */
void zero_layout(Zero *z, ZeroBucket *buckets, int nbuckets, const int *unit_bucket);
/* Allocates the owned state (moments, shards, host copies) from m's
 * parameters, which must be identical on every rank; stage 2 frees m's full
 * gradients and stage 3 its parameters. Returns 0, or -1 with err. */
int zero_build(Zero *z, char *err, size_t errlen);
void zero_free(Zero *z);

/* The runs of the gradient norm (optim.h, "The gradient norm") in
 * grads[k] = gradient of element offset + k, k < count, counting a tensor
 * every tp rank holds whole only on tp rank 0, and the tied wte only on the
 * first stage: visit(arg, x, n) for each run of counted elements that lie
 * end to end. zero_owned_norm_runs: the same over this rank's owned
 * gradients, bucket by bucket. */
void zero_norm_runs(const Zero *z, const float *grads, size_t offset, size_t count, OptimNormVisit *visit,
                    void *arg);
void zero_owned_norm_runs(Zero *z, OptimNormVisit *visit, void *arg);
/* ZeRO-Offload: queues every owned gradient's copy down to pinned host
 * memory, not waiting (the norm's read-back after it does); zero_update's
 * host AdamW reads them. Nothing without offload. */
void zero_offload_grads_down(Zero *z);
/* Where the owned gradients of bucket b are after its reduction. */
float *zero_owned_grads(Zero *z, const ZeroBucket *b);

/* Stage >= 2: the buffer unit u's gradients accumulate into until its
 * reduction (from the pool). */
float *zero_grads_acquire(Zero *z, int u);
/* Reduces bucket b's gradients (grads: its n elements on dev) into what this
 * rank owns; stage >= 2 then adds the shard into grad_shard and gives the
 * unit's buffer back, one unit later (zero_finish_reductions: at once). */
void zero_reduce_bucket(Zero *z, ZeroBucket *b, float *grads);
/* Completes every deferred add (before the gradients are read). */
void zero_finish_reductions(Zero *z);

/* AdamW on the owned elements, then parameters back on every rank; tells
 * m its parameters changed (gpt_params_changed, or gpt_params_cast where
 * AdamW wrote the bf16 copy of all of them). */
void zero_update(Zero *z, float lr, float grad_scale);
/* Parameters back on every rank from their owners' masters, as after an
 * update (checkpoint.c, after loading what each rank owns). Collective. */
void zero_params_sync(Zero *z);
/* Stage 3: around each use of unit u (gpt.c's hooks, through dp.c): its
 * parameters gathered into m->uparams[u], and given back after the last user. */
void zero_params_acquire(Zero *z, int u);
void zero_params_release(Zero *z, int u);
/* Drops a prefetched unit (before an update makes it stale; at the end). */
void zero_prefetch_drop(Zero *z);
/* The whole model's parameters on dev, for saving: m->params, or with
 * stage 3 a gathered copy (collective) that zero_full_params_free releases. */
float *zero_full_params(Zero *z);
void zero_full_params_free(Zero *z, float *p);
void zero_memory(const Zero *z, ZeroMemory *mem);
/* The ZeRO paper's accounting alone (f_params, f_grads, f_optim of mem) for
 * N parameters over D ranks: zero_memory's and the planner's (plan.c). */
void zero_memory_formula(double N, int D, int stage, int bf16, int master, int rank, ZeroMemory *mem);

#endif
