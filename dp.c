/* dp.c: data parallelism: DDP's bucketed all-reduce and the parameter server.
 *
 * The articles' data-parallel family (auto-parallel-partitioning.txt, 2.1 DP
 * and 2.2 DDP): every dp rank holds the model, takes its share of the global
 * batch and the gradients are summed over the ranks before the update.
 *
 *  - DDP: the gradients are cut into buckets of consecutive units (layers)
 *    in the order backward finishes them; the moment a bucket's last unit is
 *    done, its all-reduce starts (on the communication stream on GPUs, so it
 *    overlaps the rest of backward). Only the last micro-batch of a step
 *    reduces: earlier ones accumulate locally.
 *  - Parameter server (--dp-mode ps): the article's DP with GPU 0 as master:
 *    every rank sends its gradients to rank 0, which sums them, runs the
 *    optimizer alone and sends the parameters back: rank 0's traffic grows
 *    with the number of ranks, DDP's does not.
 *  - ZeRO (zero.c): the same buckets, reduce-scattered to their owners.
 *
 * Waits are per operation: the parameter server's master waits for each
 * receive before adding it, not for the whole communication stream.
 *
 * The buckets hang off gpt.c's unit hooks; gpt.c never learns why.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dp.h"

/* Buckets of consecutive units in backward order (head first, embedding
 * last), each closed once it reaches bucket_mb; ZeRO-2 and 3 reduce (and
 * drop) unit by unit, so each unit is its own bucket there. The tied wte is
 * always a bucket of its own, so its shards are the same on the first and
 * the last pipeline stage. A bucket never spans two writers
 * (gpt_unit_writer: the backwards of two chunks of an interleaved stage, or
 * a split backward's B and W): each writer's last action of the step
 * (pp.c's last) finishes its buckets whole. */
static int make_buckets(DP *dp) {
    GPT *m = dp->m;
    size_t limit = (size_t)(dp->bucket_mb * 1e6 / sizeof(float));
    if (dp->zero >= 2 || limit == 0) limit = 1;
    dp->buckets = calloc(m->nunits, sizeof(ZeroBucket));
    dp->pending = calloc(m->nunits, sizeof(int));
    dp->unit_bucket = calloc(m->nunits, sizeof(int));
    if (!dp->buckets || !dp->pending || !dp->unit_bucket) return -1;
    dp->nbuckets = 0;
    ZeroBucket *b = NULL;
    for (int u = m->nunits - 1; u >= 0; u--) {
        size_t uo, un;
        gpt_unit_range(m, u, &uo, &un);
        int alone = u == m->unit_wte;
        if (!b || b->n >= limit || alone || b->unit_lo == m->unit_wte ||
            gpt_unit_writer(m, u) != gpt_unit_writer(m, b->unit_lo)) {
            b = &dp->buckets[dp->nbuckets++];
            b->unit_hi = u;
        }
        b->unit_lo = u;
        b->off = uo;
        b->n += un;
        dp->unit_bucket[u] = (int)(b - dp->buckets);
    }
    return 0;
}

/* The article's master GPU: everyone's gradients summed on rank 0, in rank
 * order (0 + 1 + ... + D-1, the order the all-reduce uses too). Each add
 * reads what its receive wrote, so it waits for that receive. */
static void ps_reduce(DP *dp, float *grads, size_t n) {
    if (dp->rank != 0) {
        comm_send(dp->g, dp->dev, grads, n, COMM_F32, 0);
        return;
    }
    for (int k = 1; k < dp->D; k++) {
        comm_op_wait(comm_recv(dp->g, dp->dev, dp->stage, n, COMM_F32, k), dp->dev);
        dp->dev->ops->accumulate(dp->dev, grads, dp->stage, n);
    }
}

static void reduce_bucket(DP *dp, ZeroBucket *b) {
    GPT *m = dp->m;
    /* with ZeRO-2/3 a bucket is one unit and its gradients are transient */
    float *grads = dp->zero >= 2 ? m->ugrads[b->unit_lo] : m->grads + b->off;
    if (dp->mode == DP_PS) ps_reduce(dp, grads, b->n);
    else if (dp->zero == 0) comm_all_reduce(dp->g, dp->dev, grads, b->n, COMM_F32, COMM_SUM);
    else zero_reduce_bucket(&dp->z, b, grads);
}

/* ZeRO-2/3: a unit's gradients live in a buffer of their own from the
 * moment backward starts writing them until they are reduced. */
static void grads_acquire(void *ctx, GPT *m, int u) {
    DP *dp = ctx;
    if (dp->zero < 2 || m->ugrads[u]) return;
    m->ugrads[u] = zero_grads_acquire(&dp->z, u);
}

static void params_acquire(void *ctx, GPT *m, int u) { (void)m; zero_params_acquire(&((DP *)ctx)->z, u); }
static void params_release(void *ctx, GPT *m, int u) { (void)m; zero_params_release(&((DP *)ctx)->z, u); }

static void grads_ready(void *ctx, GPT *m, int u) {
    DP *dp = ctx;
    int i = dp->unit_bucket[u];
    (void)m;
    if (!dp->reducing || --dp->pending[i] > 0) return;
    reduce_bucket(dp, &dp->buckets[i]);
}

int dp_build(DP *dp, const Layout *l, double bucket_mb, GPT *m, Comm *c, CommMesh *mesh, const OptConfig *opt,
             char *err, size_t errlen) {
    CommGroup *g = &mesh->dp_group;
    memset(dp, 0, sizeof *dp);
    dp->norm_e = -1;   /* the first step's norm finds its grid first */
    dp->norm_acc = dev_alloc(m->dev, sizeof *dp->norm_acc);
    dp->mode = l->dp_mode;
    dp->zero = l->zero;
    dp->bucket_mb = bucket_mb;
    dp->m = m;
    dp->dev = m->dev;
    dp->comm = c;
    dp->g = g;
    dp->tp = mesh->tp_group.size > 1 ? &mesh->tp_group : NULL;
    dp->pp = mesh->pp_group.size > 1 ? &mesh->pp_group : NULL;
    dp->embed = mesh->embed_group.size > 1 ? &mesh->embed_group : NULL;
    dp->D = g->size;
    dp->rank = g->index;
    if (make_buckets(dp)) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    Zero *z = &dp->z;
    z->stage = dp->zero;
    z->owners = dp->mode == DP_PS ? ZERO_MASTER : dp->zero ? ZERO_SHARD : ZERO_ALL;
    z->offload = l->offload;
    z->m = m;
    z->dev = dp->dev;
    z->g = g;
    z->D = dp->D;
    z->rank = dp->rank;
    z->opt = opt;
    zero_layout(z, dp->buckets, dp->nbuckets, dp->unit_bucket);
    if (dp->mode == DP_PS && dp->rank == 0) {
        for (int i = 0; i < dp->nbuckets; i++)
            if (dp->buckets[i].n > dp->stage_n) dp->stage_n = dp->buckets[i].n;
        dp->stage = dev_alloc(dp->dev, dp->stage_n * sizeof(float));
    }
    if (zero_build(z, err, errlen) != 0) return -1;
    m->hooks.ctx = dp;
    m->hooks.grads_acquire = grads_acquire;
    m->hooks.grads_ready = grads_ready;
    if (dp->zero == 3) {
        m->hooks.params_acquire = params_acquire;
        m->hooks.params_release = params_release;
    }
    return 0;
}

void dp_free(DP *dp) {
    zero_free(&dp->z);
    if (dp->norm_acc) dev_free(dp->dev, dp->norm_acc, sizeof *dp->norm_acc);
    if (dp->stage) dev_free(dp->dev, dp->stage, dp->stage_n * sizeof(float));
    memset(&dp->m->hooks, 0, sizeof dp->m->hooks);
    free(dp->buckets);
    free(dp->pending);
    free(dp->unit_bucket);
    memset(dp, 0, sizeof *dp);
}

void dp_step_begin(DP *dp) {
    if (dp->m->grads) dev_zero(dp->dev, dp->m->grads, dp->m->num_params * sizeof(float));
    if (dp->z.grad_shard) dev_zero(dp->dev, dp->z.grad_shard, dp->z.owned * sizeof(float));
}

void dp_micro_batch(DP *dp, int last) {
    /* Called before each backward (and each W of a split one); last: no
     * later one writes the gradients this one writes, so each bucket it
     * finishes is reduced. A bucket's units all have one writer (see
     * make_buckets), so counting afresh here cannot lose one half-counted.
     * The last micro-batch's deferred add comes before this one writes
     * gradients. */
    zero_finish_reductions(&dp->z);
    dp->reducing = last || dp->zero >= 2;
    for (int i = 0; i < dp->nbuckets; i++)
        dp->pending[i] = dp->buckets[i].unit_hi - dp->buckets[i].unit_lo + 1;
}

/* The runs of the norm on this rank (zero_norm_runs' contract): with
 * DP_PS only the master has the summed gradients, the others nothing; with
 * ZeRO each element is owned by exactly one dp rank. */
static void norm_runs(void *ctx, OptimNormVisit *visit, void *arg) {
    DP *dp = ctx;
    if (dp->mode == DP_PS && dp->rank != 0) return;
    if (dp->zero) zero_owned_norm_runs(&dp->z, visit, arg);
    else zero_norm_runs(&dp->z, dp->m->grads, 0, dp->m->num_params, visit, arg);
}

/* Combines n int32s (on the Dev) over the ranks that hold parts of the
 * gradients: the master's to its dp group (DP_PS), every owner's (ZeRO),
 * nothing over dp when each dp rank holds them all; then over tp and pp.
 * On GPUs each waits for the one before on the device, not on the host. */
static void norm_reduce(void *ctx, int32_t *x, int n, int max) {
    DP *dp = ctx;
    Dev *d = dp->dev;
    CommRed op = max ? COMM_MAX : COMM_SUM;
    if (dp->mode == DP_PS) comm_op_wait(comm_broadcast(dp->g, d, x, n, COMM_I32, 0), d);
    else if (dp->zero) comm_op_wait(comm_all_reduce(dp->g, d, x, n, COMM_I32, op), d);
    if (dp->tp) comm_op_wait(comm_all_reduce(dp->tp, d, x, n, COMM_I32, op), d);
    if (dp->pp) comm_op_wait(comm_all_reduce(dp->pp, d, x, n, COMM_I32, op), d);
}

/* The global gradient norm: each distinct gradient element counted once,
 * whichever ranks hold it (dp owners, tp shards, tp-replicated tensors),
 * with the same bits on every layout (optim.h, "The gradient norm"), on a
 * grid guessed from the last step's. */
static double global_norm(DP *dp) {
    return optim_norm(dp->dev, dp->norm_acc, &dp->norm_e, gpt_total_params(&dp->m->cfg), norm_runs,
                      norm_reduce, dp);
}

/* The tied embedding: the first stage's wte and the last stage's copy got
 * different gradients (the lookup's and the head's); each takes their sum,
 * so the two copies take the same step and stay equal. Both ends own the
 * same shard of it (a bucket of its own, the same size), whatever the stage. */
static void tie_embedding(DP *dp) {
    if (!dp->embed || dp->m->unit_wte < 0) return;
    ZeroBucket *b = &dp->buckets[dp->unit_bucket[dp->m->unit_wte]];
    if (b->own_n)
        comm_op_wait(comm_all_reduce(dp->embed, dp->dev, zero_owned_grads(&dp->z, b), b->own_n, COMM_F32,
                                     COMM_SUM), dp->dev);
}

double dp_step_end(DP *dp, float lr) {
    zero_finish_reductions(&dp->z);
    comm_wait(dp->comm, dp->dev);
    tie_embedding(dp);
    zero_offload_grads_down(&dp->z);   /* with offload: down under the norm, one wait for both */
    double norm = global_norm(dp);
    zero_update(&dp->z, lr, optim_clip_scale(dp->z.opt, norm));
    return norm;
}

float *dp_full_params(DP *dp) { return zero_full_params(&dp->z); }

void dp_full_params_free(DP *dp, float *p) { zero_full_params_free(&dp->z, p); }

void dp_memory(const DP *dp, DPMemory *mem) {
    zero_memory(&dp->z, mem);
    mem->transient_peak += (double)dp->stage_n * 4;
}
