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
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dp.h"

void zero_layout(DP *dp) {
    size_t S = 0;
    for (int i = 0; i < dp->nbuckets; i++) {
        DPBucket *b = &dp->buckets[i];
        if (dp->cfg.mode == DP_PS) {
            b->own_off = 0;
            b->own_n = dp->rank == 0 ? b->n : 0;
        } else if (dp->cfg.zero == 0) {
            b->own_off = 0;
            b->own_n = b->n;
        } else {
            comm_shard(b->n, dp->D, dp->rank, &b->own_off, &b->own_n);
        }
        b->state_off = S;
        S += b->own_n;
    }
    dp->owned = S;
}

/* Copies the owned elements of params (whole layout) to dst [S] on the
 * device (or to the host with to_host). */
static void gather_owned(DP *dp, float *dst, const float *params, int to_host) {
    for (int i = 0; i < dp->nbuckets; i++) {
        DPBucket *b = &dp->buckets[i];
        const float *src = params + b->off + b->own_off;
        if (to_host) dev_to_host(dp->dev, dst + b->state_off, src, b->own_n * sizeof(float));
        else dev_copy(dp->dev, dst + b->state_off, src, b->own_n * sizeof(float));
    }
}

int zero_build(DP *dp, char *err, size_t errlen) {
    GPT *m = dp->m;
    size_t S = dp->owned;
    Dev *opt_dev = dp->dev;
    if (dp->cfg.offload) {
        if (dev_open(&dp->host, DEV_CPU, 0, err, errlen) != 0) return -1;
        dp->host.pinned = dp->dev->kind == DEV_CUDA;  /* gradients down, parameters up: pinned */
        opt_dev = &dp->host;
        dp->host_master = dev_alloc(&dp->host, S * sizeof(float));
        dp->host_grads = dev_alloc(&dp->host, S * sizeof(float));
        gather_owned(dp, dp->host_master, m->params, 1);
    }
    adam_build(&dp->adam, opt_dev, S);
    if (dp->cfg.zero >= 2) {
        dp->grad_shard = dev_alloc(dp->dev, S * sizeof(float));
        dev_free(dp->dev, m->grads, m->num_params * sizeof(float));
        m->grads = NULL;
    }
    if (dp->cfg.zero == 3) {
        dp->param_shard = dev_alloc(dp->dev, S * sizeof(float));
        gather_owned(dp, dp->param_shard, m->params, 0);
        dev_sync(dp->dev);
        dev_free(dp->dev, m->params, m->num_params * sizeof(float));
        m->params = NULL;
        dp->param_refs = calloc(m->nunits, sizeof(int));
        dp->prefetch_unit = -1;
        dp->last_unit = -1;
    }
    gpt_units_default(m);
    return 0;
}

void zero_free(DP *dp) {
    size_t S = dp->owned;
    if (dp->cfg.zero == 3) zero_prefetch_drop(dp);
    adam_free(&dp->adam);
    if (dp->host_master) dev_free(&dp->host, dp->host_master, S * sizeof(float));
    if (dp->host_grads) dev_free(&dp->host, dp->host_grads, S * sizeof(float));
    if (dp->grad_shard) dev_free(dp->dev, dp->grad_shard, S * sizeof(float));
    if (dp->param_shard) dev_free(dp->dev, dp->param_shard, S * sizeof(float));
    free(dp->param_refs);
}

void zero_reduce_bucket(DP *dp, DPBucket *b, float *grads) {
    float *own = grads + b->own_off;  /* reduce-scatter may write its shard in place */
    comm_reduce_scatter(dp->g, dp->dev, own, grads, b->n, COMM_F32, COMM_SUM);
    if (dp->cfg.zero >= 2) {
        /* micro-batches add up in the owned shard; the unit's buffer goes */
        comm_wait(dp->comm, dp->dev);
        dp->dev->ops->accumulate(dp->dev, dp->grad_shard + b->state_off, own, b->own_n);
    }
}

float *zero_owned_grads(DP *dp, DPBucket *b) {
    return dp->grad_shard ? dp->grad_shard + b->state_off : dp->m->grads + b->off + b->own_off;
}

double zero_owned_sumsq(DP *dp) {
    double s = 0;
    for (int i = 0; i < dp->nbuckets; i++) {
        DPBucket *b = &dp->buckets[i];
        if (b->own_n) s += dp_sumsq(dp, zero_owned_grads(dp, b), b->off + b->own_off, b->own_n);
    }
    return s;
}

/* Parameters back on every rank after the owners' update. */
static void sync_params(DP *dp) {
    GPT *m = dp->m;
    if (dp->cfg.mode == DP_PS) {
        if (dp->rank == 0)
            for (int k = 1; k < dp->D; k++)
                comm_send(dp->g, dp->dev, m->params, m->num_params, COMM_F32, k);
        else
            comm_recv(dp->g, dp->dev, m->params, m->num_params, COMM_F32, 0);
    } else if (dp->cfg.zero == 1 || dp->cfg.zero == 2) {
        for (int i = 0; i < dp->nbuckets; i++) {
            DPBucket *b = &dp->buckets[i];
            comm_all_gather(dp->g, dp->dev, m->params + b->off, m->params + b->off + b->own_off,
                            b->n, COMM_F32);
        }
    }
    /* zero 0 updated everything everywhere; zero 3 gathers on the next use */
    comm_wait(dp->comm, dp->dev);
}

void zero_update(DP *dp, float lr, float grad_scale) {
    GPT *m = dp->m;
    if (dp->cfg.zero == 3) zero_prefetch_drop(dp);
    adam_begin(&dp->adam);
    for (int i = 0; i < dp->nbuckets; i++) {
        DPBucket *b = &dp->buckets[i];
        if (!b->own_n) continue;
        float *param = dp->param_shard ? dp->param_shard + b->state_off
                                       : m->params + b->off + b->own_off;
        float *grad = zero_owned_grads(dp, b);
        size_t offset = b->off + b->own_off, bytes = b->own_n * sizeof(float);
        if (dp->cfg.offload) {
            float *hg = dp->host_grads + b->state_off, *hp = dp->host_master + b->state_off;
            dev_to_host(dp->dev, hg, grad, bytes);
            adam_update(&dp->adam, b->state_off, m, hp, hg, offset, b->own_n, dp->opt, lr,
                        grad_scale);
            adam_flush(&dp->adam);  /* on the host, before the copy back */
            dev_from_host(dp->dev, param, hp, bytes);
        } else {
            adam_update(&dp->adam, b->state_off, m, param, grad, offset, b->own_n, dp->opt, lr,
                        grad_scale);
        }
    }
    adam_flush(&dp->adam);  /* every owned piece of every bucket, one launch */
    sync_params(dp);
}

/* ZeRO-3: a unit is gathered for its first user and freed after its last.
 * Gathering unit u also starts the gather of the unit that will be wanted
 * next (u+1 going forward, u-1 going backward): on GPUs it runs on the
 * communication stream while u computes. Every dp rank walks the same units
 * in the same order, so the prefetches pair up. A prefetch still unused at
 * the optimizer step is dropped there: it holds the old parameters. */

static float *gather_unit(DP *dp, int u) {
    size_t uo, un;
    gpt_unit_range(dp->m, u, &uo, &un);
    DPBucket *b = &dp->buckets[dp->unit_bucket[u]];  /* one unit a bucket in stage 3 */
    float *buf = dev_alloc(dp->dev, un * sizeof(float));
    dp->transient += un * sizeof(float);
    if (dp->transient > dp->transient_peak) dp->transient_peak = dp->transient;
    comm_all_gather(dp->g, dp->dev, buf, dp->param_shard + b->state_off, un, COMM_F32);
    return buf;
}

static void drop_unit(DP *dp, int u, float *buf) {
    size_t uo, un;
    gpt_unit_range(dp->m, u, &uo, &un);
    dev_free(dp->dev, buf, un * sizeof(float));
    dp->transient -= un * sizeof(float);
}

void zero_prefetch_drop(DP *dp) {
    if (dp->prefetch_buf) {
        comm_wait(dp->comm, dp->dev);
        drop_unit(dp, dp->prefetch_unit, dp->prefetch_buf);
    }
    dp->prefetch_buf = NULL;
    dp->prefetch_unit = -1;
}

void zero_params_acquire(void *ctx, GPT *m, int u) {
    DP *dp = ctx;
    /* the tied wte is taken out of turn (by the head): it says nothing of the
     * direction, and the embedding's units are never worth guessing */
    int embedding = u == m->unit_wte || u == m->unit_wpe;
    int going_up = u > dp->last_unit;
    if (u != m->unit_wte) dp->last_unit = u;
    if (dp->param_refs[u]++ > 0) return;
    float *buf;
    if (dp->prefetch_buf && dp->prefetch_unit == u) {
        buf = dp->prefetch_buf;
        dp->prefetch_buf = NULL;
        dp->prefetch_unit = -1;
    } else {
        buf = gather_unit(dp, u);
    }
    int next = going_up ? u + 1 : u - 1;
    if (!embedding && !dp->prefetch_buf && next >= 0 && next < m->nunits &&
        next != m->unit_wte && next != m->unit_wpe && dp->param_refs[next] == 0) {
        dp->prefetch_buf = gather_unit(dp, next);
        dp->prefetch_unit = next;
    }
    comm_wait(dp->comm, dp->dev);  /* u's gather (and the prefetch queued behind it) */
    m->uparams[u] = buf;
}

void zero_params_release(void *ctx, GPT *m, int u) {
    DP *dp = ctx;
    if (--dp->param_refs[u] > 0) return;
    drop_unit(dp, u, m->uparams[u]);
    m->uparams[u] = NULL;
}

/* Measured from what is allocated, beside the ZeRO paper's float32
 * accounting: 4 bytes of parameters, 4 of gradients, 8 of Adam moments a
 * parameter, each divided by D once its stage shards it. Under bf16 the
 * parameters add the compute copy, 2 bytes a parameter of this stage,
 * which gpt.c keeps whole (a ZeRO-3 rank too: see README). */
void zero_memory(const DP *dp, DPMemory *mem) {
    const GPT *m = dp->m;
    double N = (double)m->num_params, D = dp->D, S = (double)dp->owned;
    memset(mem, 0, sizeof *mem);
    mem->params = (m->params ? 4 * N : 0) + (dp->param_shard ? 4 * S : 0) + (m->lp ? m->esz * N : 0);
    mem->grads = (m->grads ? 4 * N : 0) + (dp->grad_shard ? 4 * S : 0);
    if (dp->cfg.offload) mem->optim_host = 8 * S;
    else mem->optim = 8 * S;
    int z = dp->cfg.zero;
    mem->f_params = (z == 3 ? 4 * N / D : 4 * N) + (m->lp ? 2 * N : 0);
    mem->f_grads = z >= 2 ? 4 * N / D : 4 * N;
    if (dp->cfg.mode == DP_PS) mem->f_optim = dp->rank == 0 ? 8 * N : 0;
    else mem->f_optim = z >= 1 ? 8 * N / D : 8 * N;
    mem->transient_peak = (double)dp->transient_peak + (double)dp->stage_n * 4;
}
