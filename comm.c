/* comm.c: communicators, groups and the process mesh of comm.h, and the
 * entry points of its operations (checks, byte accounting, dispatch to a
 * backend).
 *
 * This is the floor every parallel dimension of hybrid-parallelism.txt stands
 * on (DESIGN.md, "Processes" and "Errors"): DP reduces gradients over the dp
 * group, TP all-reduces activations inside the tp group, PP sends activations
 * between neighbouring stages of the pp group, and the tied embedding sums
 * its gradient over the first and last stage (the embed group). The mesh puts
 * rank r at (pp, dp, tp) with r = tp_rank + tp * (dp_rank + dp * pp_rank).
 *
 * The rest of comm.h lives beside this file (comm_impl.h is what they share):
 * comm_launch.c makes the ranks, comm_shm.c and comm_nccl.c are the two
 * backends, rendezvous.c (beneath both) lets the ranks of one job find each
 * other. Calls go down only: this file calls the backends, never the
 * other way; the way a rank dies (comm_die) is comm_impl.h's, below them all. Each operation here returns at once on a rank outside the group,
 * checks its arguments, counts its bus bytes the way nccl-tests does, then
 * hands the call to the backend of the communicator (size-1 groups and empty
 * buffers stop here on shared memory).
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "comm_impl.h"

/* ---- communicators ------------------------------------------------------------- */

int comm_init(Comm *c, const CommLaunch *l, CommBackend backend, Dev *gpu, char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    c->rank = l->rank;
    c->world_size = l->world_size;
    c->local_rank = l->local_rank;
    c->backend = backend;
    c->impl = calloc(1, sizeof *c->impl);
    c->world.ranks = calloc((size_t)c->world_size, sizeof(int));
    if (!c->impl || !c->world.ranks) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    CommGroup *w = &c->world;
    w->comm = c;
    snprintf(w->name, sizeof w->name, "world");
    w->size = c->world_size;
    w->index = c->rank;
    for (int r = 0; r < c->world_size; r++) w->ranks[r] = r;
    CommImpl *im = c->impl;
    int rc = -1;
    if (l->kind == COMM_LAUNCH_FORK) {          /* the launcher's segment, inherited (NCCL too) */
        im->shm = l->shared;
        im->shm_bytes = l->shared_bytes;
    } else if (backend == COMM_SHM && c->world_size == 1) {
        /* one rank still gets areas, so sends to itself work like any other */
        if (shm_map_private(c, err, errlen)) goto fail;
    }
    if (backend == COMM_SHM && c->world_size > COMM_MAX_RANKS) {
        snprintf(err, errlen, "the shared-memory backend takes at most %d ranks, not %d", COMM_MAX_RANKS,
                 c->world_size);
        goto fail;
    }
    if (backend == COMM_NCCL) {
#ifdef USE_NCCL
        if ((rc = nccl_init(c, l, gpu, err, errlen)) != 0) goto fail;
#else
        (void)gpu;
        snprintf(err, errlen, "the NCCL backend is not built in (nccl.h was not found at build time)");
        goto fail;
#endif
    } else if (l->kind == COMM_LAUNCH_ENV) {
        if ((rc = shm_join(c, l, err, errlen)) != 0) goto fail;
    }
    return 0;
fail:
    comm_free(c);
    return rc == RDZV_MISMATCH ? rc : -1;
}

void comm_free(Comm *c) {
    CommImpl *im = c->impl;
    if (im) {
#ifdef USE_NCCL
        if (c->backend == COMM_NCCL) nccl_free(c);
#endif
        if (im->shm) shm_leave(c);
        free(im);
    }
    free(c->world.ranks);
    memset(c, 0, sizeof *c);
}

/* An operation complete on return (shared memory, host buffers, n = 0). */
#define NO_OP ((CommOp){NULL, 0})

static CommOp op_all_gather(CommGroup *g, Dev *d, void *out, const void *in, size_t n, CommDtype t);

void comm_split(Comm *c, int color, int key, const char *name, CommGroup *g) {
    int W = c->world_size, mine[2] = { color < 0 ? COMM_NO_COLOR : color, key };
    int *all = malloc((size_t)W * 2 * sizeof(int));
    memset(g, 0, sizeof *g);
    g->comm = c;
    g->index = -1;
    snprintf(g->name, sizeof g->name, "%s", name);
    if (!all) comm_die(c, "error: out of memory in comm_split");
    op_all_gather(&c->world, NULL, all, mine, (size_t)W * 2, COMM_I32);
    if (color >= 0) {
        g->ranks = malloc((size_t)W * sizeof(int));
        if (!g->ranks) comm_die(c, "error: out of memory in comm_split");
        for (int q = 0; q < W; q++) {   /* insertion by (key, world rank) */
            if (all[2 * q] != color) continue;
            int i = g->size++;
            while (i > 0 && all[2 * g->ranks[i - 1] + 1] > all[2 * q + 1]) { g->ranks[i] = g->ranks[i - 1]; i--; }
            g->ranks[i] = q;
        }
        for (int i = 0; i < g->size; i++)
            if (g->ranks[i] == c->rank) g->index = i;
    }
    free(all);
#ifdef USE_NCCL
    if (c->backend == COMM_NCCL) nccl_split(c, color, key, g);
#endif
}

void comm_group_free(CommGroup *g) {
#ifdef USE_NCCL
    if (g->nccl) nccl_group_free(g);
#endif
    free(g->ranks);
    memset(g, 0, sizeof *g);
    g->index = -1;
}

int comm_mesh_shape(int world_size, int *dp, int *tp, int *pp, char *err, size_t errlen) {
    static const char *names[3] = { "--dp", "--tp", "--pp" };
    int *v[3] = { dp, tp, pp }, infer = -1;
    for (int i = 0; i < 3; i++) {
        if (*v[i] < 0) {
            snprintf(err, errlen, "%s %d: must be at least 1 (or 0 to infer it)", names[i], *v[i]);
            return -1;
        }
        if (*v[i] == 0 && infer < 0) infer = i;
    }
    for (int i = 0; i < 3; i++)
        if (*v[i] == 0 && i != infer) *v[i] = 1;
    if (infer >= 0) {
        int a = (infer + 1) % 3, b = (infer + 2) % 3, rest = *v[a] * *v[b];
        if (rest > world_size || world_size % rest) {
            snprintf(err, errlen, "%s %d %s %d multiply to %d, which does not divide the %d ranks (%s is inferred)",
                     names[a], *v[a], names[b], *v[b], rest, world_size, names[infer]);
            return -1;
        }
        *v[infer] = world_size / rest;
    }
    long product = (long)*dp * *tp * *pp;
    if (product != world_size) {
        snprintf(err, errlen, "--dp %d --tp %d --pp %d multiply to %ld, not the %d ranks", *dp, *tp, *pp,
                 product, world_size);
        return -1;
    }
    return 0;
}

int comm_mesh_rank(const CommMesh *m, int dp_rank, int cp_rank, int tp_rank, int pp_rank) {
    return tp_rank + m->tp * (cp_rank + m->cp * (dp_rank + m->dp * pp_rank));
}

int comm_mesh_build(Comm *c, int dp, int cp, int tp, int pp, CommMesh *m, char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    if (cp < 1 || c->world_size % cp) {
        snprintf(err, errlen, "--cp %d does not divide the %d ranks", cp, c->world_size);
        return -1;
    }
    if (comm_mesh_shape(c->world_size / cp, &dp, &tp, &pp, err, errlen)) return -1;
    int r = c->rank;
    m->dp = dp; m->cp = cp; m->tp = tp; m->pp = pp;
    m->tp_rank = r % tp;
    m->cp_rank = r / tp % cp;
    m->dp_rank = r / (tp * cp) % dp;
    m->pp_rank = r / (tp * cp * dp);
    int end_stage = m->pp_rank == 0 || m->pp_rank == pp - 1;
    int dc = m->cp_rank + cp * m->dp_rank;   /* the place in dp x cp */
    /* colors: the coordinates a group's members share, folded into one number */
    comm_split(c, dc + dp * cp * m->pp_rank, m->tp_rank, "tp", &m->tp_group);
    comm_split(c, m->tp_rank + tp * m->pp_rank, dc, "dp", &m->dp_group);
    if (cp > 1)   /* a communicator only where there is a ring (NCCL's, and its emulation's, are counted) */
        comm_split(c, m->tp_rank + tp * (m->dp_rank + dp * m->pp_rank), m->cp_rank, "cp", &m->cp_group);
    else
        m->cp_group = (CommGroup){.comm = c, .name = "cp", .size = 1, .index = 0, .ranks = NULL};
    comm_split(c, m->tp_rank + tp * dc, m->pp_rank, "pp", &m->pp_group);
    comm_split(c, end_stage ? m->tp_rank + tp * dc : COMM_NO_COLOR, m->pp_rank, "embed", &m->embed_group);
    return 0;
}

void comm_mesh_free(CommMesh *m) {
    comm_group_free(&m->tp_group);
    comm_group_free(&m->dp_group);
    comm_group_free(&m->cp_group);
    comm_group_free(&m->pp_group);
    comm_group_free(&m->embed_group);
}

/* ---- operations: checks, accounting, then the backend ------------------------------------ */

static const char *kind_names[COMM_KINDS] = {
    "all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "send", "recv", "barrier",
};

const char *comm_kind_name(CommKind k) { return k < COMM_KINDS ? kind_names[k] : "?"; }

static uint64_t bus_bytes(CommKind k, int n, uint64_t b) {
    switch (k) {
    case COMM_ALL_REDUCE: return 2 * (uint64_t)(n - 1) * b / (uint64_t)n;
    case COMM_REDUCE_SCATTER:
    case COMM_ALL_GATHER: return (uint64_t)(n - 1) * b / (uint64_t)n;
    case COMM_BROADCAST:
    case COMM_REDUCE: return n > 1 ? b : 0;
    case COMM_SEND:
    case COMM_RECV: return b;
    default: return 0;
    }
}

static void count(CommGroup *g, CommKind k, size_t n, CommDtype t) {
    Comm *c = g->comm;
    uint64_t b = bus_bytes(k, g->size, (uint64_t)n * comm_dtype_size(t));
    int i = 0;
    while (i < c->nstats && !(c->stats[i].kind == k && !strcmp(c->stats[i].group, g->name))) i++;
    if (i == COMM_MAX_STATS) i = COMM_MAX_STATS - 1;   /* full: the last row takes the rest */
    if (i == c->nstats) {
        c->stats[i].kind = k;
        snprintf(c->stats[i].group, sizeof c->stats[i].group, "%s", g->name);
        c->nstats++;
    }
    c->stats[i].calls++;
    c->stats[i].bytes += b;
}

static void check_args(CommGroup *g, const char *op, CommDtype t, CommRed red, int member) {
    Comm *c = g->comm;
    if ((unsigned)t > COMM_I32)
        comm_die(c, "error: rank %d: %s on group %s: unknown dtype %d", c->rank, op, g->name, (int)t);
    if (red == COMM_AVG && t == COMM_I32)
        comm_die(c, "error: rank %d: %s on group %s: COMM_AVG needs a float dtype", c->rank, op, g->name);
    if (red == COMM_MAX && t != COMM_I32)
        comm_die(c, "error: rank %d: %s on group %s: COMM_MAX needs COMM_I32", c->rank, op, g->name);
    if (member < 0 || member >= g->size)
        comm_die(c, "error: rank %d: %s on group %s: member %d is outside its %d ranks", c->rank, op,
                 g->name, member, g->size);
}

static CommOp op_all_gather(CommGroup *g, Dev *d, void *out, const void *in, size_t n, CommDtype t) {
#ifdef USE_NCCL
    if (g->comm->backend == COMM_NCCL) return n ? nccl_all_gather(g, d, out, in, n, t) : NO_OP;
#endif
    if (n && g->size == 1) {
        if (on_gpu(d)) dev_copy(d, out, in, n * comm_dtype_size(t));
        else memmove(out, in, n * comm_dtype_size(t));
    } else if (n) {
        shm_all_gather(g, d, out, in, n, t);
    }
    return NO_OP;
}

#ifdef USE_NCCL
#define NCCL_ROUTE(call) do { if (g->comm->backend == COMM_NCCL) return n ? call : NO_OP; } while (0)
#else
#define NCCL_ROUTE(call) do { } while (0)
#endif

CommOp comm_all_reduce(CommGroup *g, Dev *d, void *buf, size_t n, CommDtype t, CommRed op) {
    if (g->index < 0) return NO_OP;
    check_args(g, "comm_all_reduce", t, op, 0);
    count(g, COMM_ALL_REDUCE, n, t);
    NCCL_ROUTE(nccl_all_reduce(g, d, buf, n, t, op));
    if (n && g->size > 1) shm_all_reduce(g, d, buf, n, t, op);
    return NO_OP;
}

CommOp comm_reduce_scatter(CommGroup *g, Dev *d, void *out, const void *in, size_t n, CommDtype t, CommRed op) {
    if (g->index < 0) return NO_OP;
    check_args(g, "comm_reduce_scatter", t, op, 0);
    count(g, COMM_REDUCE_SCATTER, n, t);
    NCCL_ROUTE(nccl_reduce_scatter(g, d, out, in, n, t, op));
    if (n && g->size == 1) {
        if (on_gpu(d)) dev_copy(d, out, in, n * comm_dtype_size(t));
        else memmove(out, in, n * comm_dtype_size(t));
    } else if (n) {
        shm_reduce_scatter(g, d, out, in, n, t, op);
    }
    return NO_OP;
}

CommOp comm_all_gather(CommGroup *g, Dev *d, void *out, const void *in, size_t n, CommDtype t) {
    if (g->index < 0) return NO_OP;
    check_args(g, "comm_all_gather", t, COMM_SUM, 0);
    count(g, COMM_ALL_GATHER, n, t);
    return op_all_gather(g, d, out, in, n, t);
}

CommOp comm_broadcast(CommGroup *g, Dev *d, void *buf, size_t n, CommDtype t, int root) {
    if (g->index < 0) return NO_OP;
    check_args(g, "comm_broadcast", t, COMM_SUM, root);
    count(g, COMM_BROADCAST, n, t);
    NCCL_ROUTE(nccl_broadcast(g, d, buf, n, t, root));
    if (n && g->size > 1) shm_broadcast(g, d, buf, n, t, root);
    return NO_OP;
}

CommOp comm_reduce(CommGroup *g, Dev *d, void *buf, size_t n, CommDtype t, CommRed op, int root) {
    if (g->index < 0) return NO_OP;
    check_args(g, "comm_reduce", t, op, root);
    count(g, COMM_REDUCE, n, t);
    NCCL_ROUTE(nccl_reduce(g, d, buf, n, t, op, root));
    if (n && g->size > 1) shm_reduce(g, d, buf, n, t, op, root);
    return NO_OP;
}

static CommOp p2p(CommGroup *g, Dev *d, void *buf, size_t n, CommDtype t, int peer, int send) {
    Comm *c = g->comm;
    if (g->index < 0) return NO_OP;
    check_args(g, send ? "comm_send" : "comm_recv", t, COMM_SUM, peer);
    count(g, send ? COMM_SEND : COMM_RECV, n, t);
    NCCL_ROUTE(nccl_p2p(g, d, buf, n, t, peer, send));
    CommImpl *im = c->impl;
    P2POp op = { send, g->ranks[peer], d, buf, n * comm_dtype_size(t), 0 };
    if (!im->batching) { shm_p2p_run(c, &op, 1); return NO_OP; }
    if (im->nbatch == COMM_MAX_BATCH)
        comm_die(c, "error: rank %d: more than %d sends and receives in one comm_p2p_begin/end", c->rank,
                 COMM_MAX_BATCH);
    im->batch[im->nbatch++] = op;
    return NO_OP;
}

CommOp comm_send(CommGroup *g, Dev *d, const void *buf, size_t n, CommDtype t, int peer) {
    return p2p(g, d, (void *)buf, n, t, peer, 1);
}

CommOp comm_recv(CommGroup *g, Dev *d, void *buf, size_t n, CommDtype t, int peer) {
    return p2p(g, d, buf, n, t, peer, 0);
}

void comm_p2p_begin(Comm *c) {
    if (c->impl->batching++) return;
#ifdef USE_NCCL
    if (c->backend == COMM_NCCL) nccl_group_start(c);
#endif
}

CommOp comm_p2p_end(Comm *c) {
    CommImpl *im = c->impl;
    if (im->batching <= 0) comm_die(c, "error: rank %d: comm_p2p_end without comm_p2p_begin", c->rank);
    if (--im->batching) return NO_OP;
#ifdef USE_NCCL
    if (c->backend == COMM_NCCL) return nccl_group_end(c);
#endif
    im->batching = 1;            /* sends to itself are legal while the batch runs */
    shm_p2p_run(c, im->batch, im->nbatch);
    im->batching = 0;
    im->nbatch = 0;
    return NO_OP;
}

CommOp comm_sendrecv(CommGroup *g, Dev *d, const void *sendbuf, int dst, void *recvbuf, int src,
                   size_t n, CommDtype t) {
    comm_p2p_begin(g->comm);
    comm_send(g, d, sendbuf, n, t, dst);
    comm_recv(g, d, recvbuf, n, t, src);
    return comm_p2p_end(g->comm);
}

void comm_barrier(CommGroup *g) {
    if (g->index < 0) return;
    count(g, COMM_BARRIER, 0, COMM_F32);
#ifdef USE_NCCL
    if (g->comm->backend == COMM_NCCL) { nccl_barrier(g); return; }
#endif
    if (g->size > 1) shm_barrier(g);
}

void comm_wait(Comm *c, Dev *d) {
#ifdef USE_NCCL
    if (c->backend == COMM_NCCL) nccl_wait(c, d);
#else
    (void)c; (void)d;
#endif
}

void comm_describe(const Comm *c, char *buf, size_t len) {
#ifdef USE_NCCL
    if (c->backend == COMM_NCCL) { nccl_describe(c, buf, len); return; }
#endif
    snprintf(buf, len, "shared memory%s", c->world_size > 1 ? "" : " (one rank)");
}

void comm_op_wait(CommOp op, Dev *d) {
#ifdef USE_NCCL
    if (op.g && op.g->comm->backend == COMM_NCCL) nccl_op_wait(op, d);
#else
    (void)op; (void)d;
#endif
}

/* ---- accounting ---------------------------------------------------------------------------- */

uint64_t comm_stats_bytes(const Comm *c, CommKind k, const char *group, uint64_t *calls) {
    for (int i = 0; i < c->nstats; i++)
        if (c->stats[i].kind == k && !strcmp(c->stats[i].group, group)) {
            if (calls) *calls = c->stats[i].calls;
            return c->stats[i].bytes;
        }
    if (calls) *calls = 0;
    return 0;
}

void comm_stats_reset(Comm *c) {
    memset(c->stats, 0, sizeof c->stats);
    c->nstats = 0;
}

void comm_stats_print(const Comm *c, FILE *f) {
    uint64_t total = 0;
    fprintf(f, "comm stats of rank %d (bus bytes per rank, nccl-tests convention)\n", c->rank);
    fprintf(f, "  %-15s %-8s %10s %16s %10s\n", "kind", "group", "calls", "bytes", "MB");
    for (int i = 0; i < c->nstats; i++) {
        const CommStat *s = &c->stats[i];
        fprintf(f, "  %-15s %-8s %10llu %16llu %10.2f\n", comm_kind_name(s->kind), s->group,
                (unsigned long long)s->calls, (unsigned long long)s->bytes, s->bytes / 1e6);
        total += s->bytes;
    }
    fprintf(f, "  %-15s %-8s %10s %16llu %10.2f\n", "total", "", "", (unsigned long long)total, total / 1e6);
}
