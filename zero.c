/* zero.c: ZeRO-1, 2, 3 and ZeRO-Offload: who owns what, and the optimizer over it.
 *
 * The articles' FSDP / ZeRO (auto-parallel-partitioning.txt 2.3;
 * hybrid-parallelism.txt, DP+PP+TP+ZeRO): the optimizer state, then the
 * gradients, then the parameters are split over the dp ranks instead of
 * copied on each. This rank owns shard `rank` of every bucket (comm_shard's
 * rule: sizes need not divide, shards need not align with tensors), and
 * only the owned elements ever meet the optimizer:
 *   stage 1: Adam moments of the owned elements; gradients reduce-scattered
 *            to their owners, parameters all-gathered after the update;
 *   stage 2: the gradients too: each unit's gradients exist only from its
 *            backward to its reduce-scatter, then only the owned shard stays;
 *   stage 3: the parameters too: a unit is all-gathered just before its
 *            forward and again before its backward, and freed after.
 * With --offload the moments and a float32 master copy of the owned
 * parameters live in host memory and AdamW runs on the CPU: gradients come
 * down, parameters go back up. DDP (stage 0) and the parameter server are
 * the same code with "owns everything" and "rank 0 owns everything".
 *
 * Waits are per operation (comm.h's CommOp): a unit's compute waits for its
 * own gather, not for the prefetch queued behind it; a unit's reduced shard
 * is added one unit later, so the reduction runs under the next unit's
 * backward. Transient buffers come from a pool and are never freed in a
 * step (cudaFree would synchronise the device).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "zero.h"
#include "layout.h"

void zero_layout(Zero *z, ZeroBucket *buckets, int nbuckets, const int *unit_bucket) {
    size_t S = 0;
    z->buckets = buckets;
    z->nbuckets = nbuckets;
    z->unit_bucket = unit_bucket;
    for (int i = 0; i < nbuckets; i++) {
        ZeroBucket *b = &buckets[i];
        if (z->owners == ZERO_MASTER) {
            b->own_off = 0;
            b->own_n = z->rank == 0 ? b->n : 0;
        } else if (z->owners == ZERO_ALL) {
            b->own_off = 0;
            b->own_n = b->n;
        } else {
            comm_shard(b->n, z->D, z->rank, &b->own_off, &b->own_n);
        }
        b->state_off = S;
        S += b->own_n;
    }
    z->owned = S;
}

/* ---- the pool of transient buffers ---------------------------------------- */

static float *pool_get(Zero *z, size_t bytes) {
    for (int i = 0; i < z->npool; i++)
        if (!z->pool[i].used && z->pool[i].bytes == bytes) {
            z->pool[i].used = 1;
            return z->pool[i].p;
        }
    ZeroPoolBlock *p = realloc(z->pool, (size_t)(z->npool + 1) * sizeof *p);
    if (!p) { fprintf(stderr, "error: out of memory growing ZeRO's buffer pool\n"); exit(1); }
    z->pool = p;
    z->pool[z->npool] = (ZeroPoolBlock){dev_alloc(z->dev, bytes), bytes, 1};
    return z->pool[z->npool++].p;
}

static void pool_put(Zero *z, float *buf) {
    for (int i = 0; i < z->npool; i++)
        if (z->pool[i].p == buf) { z->pool[i].used = 0; return; }
    fprintf(stderr, "error: ZeRO: a buffer given back that the pool never gave\n");
    exit(1);
}

static size_t unit_bytes(const Zero *z, int u) {
    size_t uo, un;
    gpt_unit_range(z->m, u, &uo, &un);
    return un * sizeof(float);
}

static float *transient_get(Zero *z, int u) {
    size_t bytes = unit_bytes(z, u);
    z->transient += bytes;
    if (z->transient > z->transient_peak) z->transient_peak = z->transient;
    return pool_get(z, bytes);
}

static void transient_put(Zero *z, int u, float *buf) {
    z->transient -= unit_bytes(z, u);
    pool_put(z, buf);
}

/* ---- building ----------------------------------------------------------- */

/* Copies the owned elements of params (whole layout) to dst [S] on the
 * device (or to the host with to_host). */
static void gather_owned(Zero *z, float *dst, const float *params, int to_host) {
    for (int i = 0; i < z->nbuckets; i++) {
        ZeroBucket *b = &z->buckets[i];
        const float *src = params + b->off + b->own_off;
        if (to_host) dev_to_host(z->dev, dst + b->state_off, src, b->own_n * sizeof(float));
        else dev_copy(z->dev, dst + b->state_off, src, b->own_n * sizeof(float));
    }
}

int zero_build(Zero *z, char *err, size_t errlen) {
    GPT *m = z->m;
    size_t S = z->owned;
    Dev *opt_dev = z->dev;
    z->pending.unit = -1;
    z->prefetch_unit = -1;
    z->last_unit = -1;
    if (z->offload) {
        if (dev_open(&z->host, DEV_CPU, 0, err, errlen) != 0) return -1;
        z->host.pinned = z->dev->kind == DEV_CUDA;  /* gradients down, parameters up: pinned */
        opt_dev = &z->host;
        z->host_master = dev_alloc(&z->host, S * sizeof(float));
        z->host_grads = dev_alloc(&z->host, S * sizeof(float));
        gather_owned(z, z->host_master, m->params, 1);
    }
    adam_build(&z->adam, opt_dev, S);
    if (z->stage >= 2) {
        z->grad_shard = dev_alloc(z->dev, S * sizeof(float));
        dev_free(z->dev, m->grads, m->num_params * sizeof(float));
        m->grads = NULL;
    }
    if (z->stage == 3) {
        z->param_shard = dev_alloc(z->dev, S * sizeof(float));
        gather_owned(z, z->param_shard, m->params, 0);
        dev_sync(z->dev);
        dev_free(z->dev, m->params, m->num_params * sizeof(float));
        m->params = NULL;
        z->param_refs = calloc(m->nunits, sizeof(int));
        if (!z->param_refs) { snprintf(err, errlen, "out of memory"); return -1; }
    }
    gpt_units_default(m);
    return 0;
}

void zero_free(Zero *z) {
    size_t S = z->owned;
    if (z->stage >= 2) zero_finish_reductions(z);
    if (z->stage == 3) zero_prefetch_drop(z);
    adam_free(&z->adam);
    if (z->host_master) dev_free(&z->host, z->host_master, S * sizeof(float));
    if (z->host_grads) dev_free(&z->host, z->host_grads, S * sizeof(float));
    if (z->grad_shard) dev_free(z->dev, z->grad_shard, S * sizeof(float));
    if (z->param_shard) dev_free(z->dev, z->param_shard, S * sizeof(float));
    if (z->npool) dev_sync(z->dev);
    for (int i = 0; i < z->npool; i++) dev_free(z->dev, z->pool[i].p, z->pool[i].bytes);
    free(z->pool);
    free(z->param_refs);
    memset(z, 0, sizeof *z);
}

/* ---- gradients ---------------------------------------------------------- */

typedef struct NormRuns {
    const Zero *z;
    const float *grads;
    size_t offset;
    OptimNormVisit *visit;
    void *arg;
    size_t run_off, run_n;   /* counted elements not yet visited, in one run */
} NormRuns;

/* Visits the pending run: one visit for as many tensors as lie end to end
 * (all of them on one rank without tp), so a GPU launches once a run, not
 * once a tensor. The sums are exact: runs change no bit. */
static void norm_flush(NormRuns *q) {
    if (!q->run_n) return;
    q->visit(q->arg, q->grads + (q->run_off - q->offset), q->run_n);
    q->run_n = 0;
}

static void norm_segment(void *ctx, size_t off, size_t n, int tensor) {
    NormRuns *q = ctx;
    if (!layout_counts(q->z->m, tensor)) return;   /* a tp replica, or the tied wte's second copy */
    if (q->run_n && off != q->run_off + q->run_n) norm_flush(q);
    if (!q->run_n) q->run_off = off;
    q->run_n += n;
}

void zero_norm_runs(const Zero *z, const float *grads, size_t offset, size_t count, OptimNormVisit *visit,
                    void *arg) {
    NormRuns q = {z, grads, offset, visit, arg, 0, 0};
    gpt_segments(z->m, offset, count, norm_segment, &q);
    norm_flush(&q);
}

float *zero_owned_grads(Zero *z, const ZeroBucket *b) {
    return z->grad_shard ? z->grad_shard + b->state_off : z->m->grads + b->off + b->own_off;
}

void zero_owned_norm_runs(Zero *z, OptimNormVisit *visit, void *arg) {
    for (int i = 0; i < z->nbuckets; i++) {
        ZeroBucket *b = &z->buckets[i];
        if (b->own_n) zero_norm_runs(z, zero_owned_grads(z, b), b->off + b->own_off, b->own_n, visit, arg);
    }
}

float *zero_grads_acquire(Zero *z, int u) {
    float *g = transient_get(z, u);
    dev_zero(z->dev, g, unit_bytes(z, u));
    return g;
}

/* The deferred add of the last unit's shard: waits for its reduce-scatter
 * only, then the unit's buffer goes back to the pool (the add, on the
 * compute stream, is its last reader). */
static void finish_pending(Zero *z) {
    ZeroPending *p = &z->pending;
    if (p->unit < 0) return;
    ZeroBucket *b = &z->buckets[p->bucket];
    comm_op_wait(p->op, z->dev);
    z->dev->ops->accumulate(z->dev, z->grad_shard + b->state_off, p->buf + b->own_off, b->own_n);
    z->m->ugrads[p->unit] = NULL;
    transient_put(z, p->unit, p->buf);
    p->unit = -1;
}

void zero_finish_reductions(Zero *z) { finish_pending(z); }

void zero_reduce_bucket(Zero *z, ZeroBucket *b, float *grads) {
    float *own = grads + b->own_off;  /* the in-place form: the shard lands where it sits */
    CommOp op = comm_reduce_scatter(z->g, z->dev, own, grads, b->n, COMM_F32, COMM_SUM);
    if (z->stage < 2) return;
    /* micro-batches add up in the owned shard; this unit's add waits for the next unit */
    finish_pending(z);
    z->pending = (ZeroPending){b->unit_lo, grads, (int)(b - z->buckets), op};
}

/* ---- the update --------------------------------------------------------- */

/* Parameters back on every rank after the owners' update. */
static void sync_params(Zero *z) {
    GPT *m = z->m;
    if (z->owners == ZERO_MASTER) {
        if (z->rank == 0)
            for (int k = 1; k < z->D; k++)
                comm_send(z->g, z->dev, m->params, m->num_params, COMM_F32, k);
        else
            comm_recv(z->g, z->dev, m->params, m->num_params, COMM_F32, 0);
    } else if (z->stage == 1 || z->stage == 2) {
        for (int i = 0; i < z->nbuckets; i++) {
            ZeroBucket *b = &z->buckets[i];
            comm_all_gather(z->g, z->dev, m->params + b->off, m->params + b->off + b->own_off,
                            b->n, COMM_F32);
        }
    }
    /* stage 0 updated everything everywhere; stage 3 gathers on the next use */
    comm_wait(z->g->comm, z->dev);
}

void zero_params_sync(Zero *z) { sync_params(z); }

void zero_offload_grads_down(Zero *z) {
    if (!z->offload) return;
    for (int i = 0; i < z->nbuckets; i++) {
        ZeroBucket *b = &z->buckets[i];
        if (b->own_n)
            dev_to_host_async(z->dev, z->host_grads + b->state_off, zero_owned_grads(z, b),
                              b->own_n * sizeof(float));
    }
}

/* ZeRO-Offload's step: every owned gradient came down at once
 * (zero_offload_grads_down, into pinned host memory, queued before the
 * norm, whose read-back waits for it: nothing is left for dev_sync to wait
 * for), then AdamW runs on the host bucket by bucket and each bucket's
 * parameters go up while the next one's AdamW runs. Nothing waits for the
 * copies up on the host: the master weights are written again only after
 * the next step's gradients came down on the same stream, and what reads
 * the parameters on the GPU is ordered after them (the compute stream
 * itself; the communication streams through their event on it). */
static void offload_update(Zero *z, float lr, float grad_scale) {
    GPT *m = z->m;
    dev_sync(z->dev);
    for (int i = 0; i < z->nbuckets; i++) {
        ZeroBucket *b = &z->buckets[i];
        if (!b->own_n) continue;
        float *param = z->param_shard ? z->param_shard + b->state_off : m->params + b->off + b->own_off;
        float *hg = z->host_grads + b->state_off, *hp = z->host_master + b->state_off;
        adam_update(&z->adam, b->state_off, m, hp, NULL, hg, b->off + b->own_off, b->own_n, z->opt, lr, grad_scale);
        adam_flush(&z->adam);  /* on the host, before the copy up */
        dev_from_host_async(z->dev, param, hp, b->own_n * sizeof(float));
    }
}

/* Under mixed precision, where this rank updates its whole model (no
 * ZeRO sharding, no parameter server, no offload), AdamW writes the bf16
 * compute copy as it goes (one pass over the parameters less a step: the
 * cast at each unit's next use), and the model is told its copy is fresh;
 * elsewhere the copy is remade at the next use. */
void zero_update(Zero *z, float lr, float grad_scale) {
    GPT *m = z->m;
    if (z->stage == 3) zero_prefetch_drop(z);
    adam_begin(&z->adam);
    size_t cast = 0;   /* elements whose bf16 copy AdamW wrote */
    if (z->offload) {
        offload_update(z, lr, grad_scale);
    } else {
        const int fuse = m->lp && z->owners == ZERO_ALL && !z->param_shard;
        for (int i = 0; i < z->nbuckets; i++) {
            ZeroBucket *b = &z->buckets[i];
            if (!b->own_n) continue;
            size_t off = b->off + b->own_off;
            float *param = z->param_shard ? z->param_shard + b->state_off : m->params + off;
            void *lp = fuse ? (char *)m->lp + off * m->esz : NULL;
            adam_update(&z->adam, b->state_off, m, param, lp, zero_owned_grads(z, b), off, b->own_n, z->opt, lr,
                        grad_scale);
            cast += fuse ? b->own_n : 0;
        }
        adam_flush(&z->adam);  /* every owned piece of every bucket, one launch */
    }
    sync_params(z);
    if (cast == m->num_params) gpt_params_cast(m);
    else gpt_params_changed(m);
}

/* ---- ZeRO-3: parameters gathered around their use -------------------------
 *
 * A unit is gathered for its first user and given back after its last.
 * Gathering unit u also starts the gather of the unit that will be wanted
 * next (u+1 going forward, u-1 going backward): on GPUs it runs on the
 * communication stream while u computes, and u's compute waits for u's
 * gather only. Every dp rank walks the same units in the same order, so the
 * prefetches pair up. A prefetch still unused at the optimizer step is
 * dropped there: it holds the old parameters. */

static float *gather_unit(Zero *z, int u, CommOp *op) {
    const ZeroBucket *b = &z->buckets[z->unit_bucket[u]];  /* one unit a bucket in stage 3 */
    float *buf = transient_get(z, u);
    *op = comm_all_gather(z->g, z->dev, buf, z->param_shard + b->state_off, b->n, COMM_F32);
    return buf;
}

void zero_prefetch_drop(Zero *z) {
    if (z->prefetch_buf) {
        /* the gather still writes it: the next user of the block must come after */
        comm_op_wait(z->prefetch_op, z->dev);
        transient_put(z, z->prefetch_unit, z->prefetch_buf);
    }
    z->prefetch_buf = NULL;
    z->prefetch_unit = -1;
}

void zero_params_acquire(Zero *z, int u) {
    GPT *m = z->m;
    /* the tied wte is taken out of turn (by the head): it says nothing of the
     * direction, and the embedding's units are never worth guessing */
    int embedding = u == m->unit_wte || u == m->unit_wpe;
    int going_up = u > z->last_unit;
    if (u != m->unit_wte) z->last_unit = u;
    if (z->param_refs[u]++ > 0) return;
    float *buf;
    CommOp op;
    if (z->prefetch_buf && z->prefetch_unit == u) {
        buf = z->prefetch_buf;
        op = z->prefetch_op;
        z->prefetch_buf = NULL;
        z->prefetch_unit = -1;
    } else {
        buf = gather_unit(z, u, &op);
    }
    int next = going_up ? u + 1 : u - 1;
    if (!embedding && !z->prefetch_buf && next >= 0 && next < m->nunits &&
        next != m->unit_wte && next != m->unit_wpe && z->param_refs[next] == 0) {
        z->prefetch_buf = gather_unit(z, next, &z->prefetch_op);
        z->prefetch_unit = next;
    }
    comm_op_wait(op, z->dev);  /* u's gather, not the prefetch queued behind it */
    m->uparams[u] = buf;
}

void zero_params_release(Zero *z, int u) {
    GPT *m = z->m;
    if (--z->param_refs[u] > 0) return;
    transient_put(z, u, m->uparams[u]);
    m->uparams[u] = NULL;
}

float *zero_full_params(Zero *z) {
    if (z->stage < 3) return z->m->params;
    float *p = dev_alloc(z->dev, z->m->num_params * sizeof(float));
    for (int i = 0; i < z->nbuckets; i++) {
        ZeroBucket *b = &z->buckets[i];
        comm_all_gather(z->g, z->dev, p + b->off, z->param_shard + b->state_off, b->n, COMM_F32);
    }
    comm_wait(z->g->comm, z->dev);
    return p;
}

void zero_full_params_free(Zero *z, float *p) {
    if (p != z->m->params) dev_free(z->dev, p, z->m->num_params * sizeof(float));
}

/* Measured from what is allocated, beside the ZeRO paper's float32
 * accounting: 4 bytes of parameters, 4 of gradients, 8 of Adam moments a
 * parameter, each divided by D once its stage shards it. Under bf16 the
 * parameters add the compute copy, 2 bytes a parameter of this stage,
 * which gpt.c keeps whole (a ZeRO-3 rank too: see docs/gpu.md, "Mixed precision"). */
void zero_memory_formula(double N, int D, int stage, int bf16, int master, int rank, ZeroMemory *mem) {
    mem->f_params = (stage == 3 ? 4 * N / D : 4 * N) + (bf16 ? 2 * N : 0);
    mem->f_grads = stage >= 2 ? 4 * N / D : 4 * N;
    if (master) mem->f_optim = rank == 0 ? 8 * N : 0;
    else mem->f_optim = stage >= 1 ? 8 * N / D : 8 * N;
}

void zero_memory(const Zero *z, ZeroMemory *mem) {
    const GPT *m = z->m;
    double N = (double)m->num_params, S = (double)z->owned;
    memset(mem, 0, sizeof *mem);
    mem->params = (m->params ? 4 * N : 0) + (z->param_shard ? 4 * S : 0) + (m->lp ? m->esz * N : 0);
    mem->grads = (m->grads ? 4 * N : 0) + (z->grad_shard ? 4 * S : 0);
    if (z->offload) mem->optim_host = 8 * S;
    else mem->optim = 8 * S;
    zero_memory_formula(N, z->D, z->stage, m->lp != NULL, z->owners == ZERO_MASTER, z->rank, mem);
    mem->transient_peak = (double)z->transient_peak;
    for (int i = 0; i < z->npool; i++) mem->transient_pool += (double)z->pool[i].bytes;
}
