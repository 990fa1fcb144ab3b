/* comm_nccl.c: the NCCL backend of comm.h, built with USE_NCCL (DESIGN.md,
 * "Processes": one rank a GPU; rank 0 hands the NCCL unique id to the others):
 * the same collectives and sends as comm_shm.c, for the articles' GPUs. It
 * calls down only: comm_impl.h (comm_die, the segment's header, which the
 * watchdog reads) and rendezvous.c, never comm.c nor the shared-memory
 * backend.
 *
 * Queues. Every group (the world, and each comm_split: tp, dp, pp, embed)
 * has its own NCCL communicator and its own communication stream, so the
 * tp group's all-reduce inside a layer does not queue behind the gradient
 * buckets the dp group is reducing (NCCL runs collectives of different
 * communicators on different streams concurrently). An operation first
 * makes its group's stream wait for what the compute stream has queued
 * (an event), then queues the NCCL call, then records an event of its own:
 * comm_op_wait makes the compute stream wait for that event only, and
 * comm_wait for every group's last one. Operations of several
 * communicators may run at once on one GPU only if every rank launches
 * them in one order: NCCL 2.26 and later keep that order themselves when
 * NCCL_LAUNCH_ORDER_IMPLICIT=1, which nccl_init sets (the program issues
 * every operation from one thread, in the same order on every rank); with
 * an older NCCL each operation's stream first waits for the operation
 * issued before it, so NCCL's kernels run one at a time, in program order,
 * still beside the compute stream.
 *
 * Lengths that do not divide by the group size are padded to equal shards
 * in the group's scratch buffer; host buffers are staged through it too,
 * in chunks of HOST_CHUNK bytes for the operations that allow it (saving
 * all-reduces the whole model from host memory: the scratch stays small).
 * The world's id travels through the shared segment of a fork job, else
 * over the TCP rendezvous (rendezvous.c), to the ranks that prove the job
 * token. Joining has a deadline (init_world): NCCL's init waits for every
 * rank without one, so a thread beside it ends the rank when it is passed,
 * naming the ranks that have not joined, and at once when one of them dies
 * (init_watch).
 *
 * The watchdog. NCCL does not fail when a peer hangs or dies: its kernels
 * wait, and so does every stream behind them. A thread on every rank looks
 * every WATCH_S at each group's oldest operation not yet seen complete
 * (cudaEventQuery), at ncclCommGetAsyncError, and, in a fork job, at the
 * supervisor's abort word. An operation older than --comm-timeout, an NCCL
 * error, or a dead peer ends the rank: one line naming the operation, the
 * group and, in a fork job, the ranks that never called it (each rank
 * publishes how many operations it queued on each group), then
 * ncclCommAbort of every communicator and exit 1.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "comm_impl.h"

#ifdef USE_NCCL
#ifndef USE_CUDA
#error "USE_NCCL needs USE_CUDA"
#endif
#include <cuda_runtime_api.h>
#include <nccl.h>
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "comm_nccl.c needs NCCL 2.18 or later (ncclCommSplit)"
#endif

#define RING 256                        /* events a queue keeps: operations in flight at most */
#define HOST_CHUNK ((size_t)4 << 20)    /* bytes of a host buffer staged at a time */
#define WATCH_S 0.05                    /* how often the watchdog looks */
#define DEFAULT_TIMEOUT_S 300.0         /* --comm-timeout when not given */

/* One group's communicator, stream, scratch, and the events of its last
 * RING operations (operation k, counted from 1, recorded ev[(k-1) % RING]). */
typedef struct NcclQueue {
    ncclComm_t comm;
    cudaStream_t stream;
    cudaEvent_t ev[RING];
    uint64_t issued, done;       /* operations queued; seen complete by the watchdog */
    double started[RING];        /* when each was queued */
    const char *what[RING];      /* and which NCCL call it was */
    char *scratch;               /* device staging: host buffers, padded shards */
    size_t scratch_bytes;
    int slot;                    /* creation order: the same group has the same slot on every rank */
    char name[16];               /* the group's */
    int size, *ranks;            /* its members, world ranks */
} NcclQueue;

/* An operation on q's communicator that failed: the group and NCCL's own
 * last words (an async error a peer raised comes back here, when the host
 * calls again before the watchdog has looked), as the watchdog says it. */
static void nccl_qcheck(Comm *c, const NcclQueue *q, ncclResult_t r, const char *call, const char *file, int line) {
    if (r == ncclSuccess) return;
    const char *detail = ncclGetLastError(q->comm);
    comm_die(c, "error: rank %d: NCCL error on group %s (%d ranks): %s%s%s (%s at %s:%d)", c->rank, q->name, q->size,
             ncclGetErrorString(r), detail && *detail ? ": " : "", detail ? detail : "", call, file, line);
}
#define NCCL_QCHECK(c, q, call) nccl_qcheck((c), (q), (call), #call, __FILE__, __LINE__)

/* This rank's NCCL state beside CommImpl (c->impl->nccl). */
typedef struct NcclState {
    Comm *c;
    int gpu;
    cudaEvent_t compute_done;
    NcclQueue *q[NCCL_MAX_QUEUES];   /* [nq]; q[0] the world's */
    int nq, nsplits;
    int ordered;                 /* NCCL before 2.26: every operation waits for the one issued before
                                    it, on whichever stream (one global order of NCCL kernels) */
    cudaEvent_t last_op;         /* then: the event after the last operation issued */
    int any_op;
    NcclQueue *batch_q;          /* the last queue a p2p batch used, and its group */
    CommGroup *batch_g;
    pthread_mutex_t lock;        /* the queues' counters: the watchdog reads them */
    pthread_t watchdog;
    int watching;
    _Atomic int stop;
    double timeout_s;
} NcclState;

#define CUDA_CHECK(c, call) cuda_check((c), (call), #call, __FILE__, __LINE__)
#define NCCL_CHECK(c, call) nccl_check((c), (call), #call, __FILE__, __LINE__)

static void cuda_check(Comm *c, cudaError_t e, const char *call, const char *file, int line) {
    if (e != cudaSuccess) comm_die(c, "CUDA error: %s at %s:%d: %s", call, file, line, cudaGetErrorString(e));
}

static void nccl_check(Comm *c, ncclResult_t r, const char *call, const char *file, int line) {
    if (r != ncclSuccess) comm_die(c, "NCCL error: %s at %s:%d: %s", call, file, line, ncclGetErrorString(r));
}

static ncclDataType_t nccl_type(CommDtype t) {
    return t == COMM_F32 ? ncclFloat32 : t == COMM_BF16 ? ncclBfloat16 : ncclInt32;
}

static ncclRedOp_t nccl_op(CommRed op) { return op == COMM_AVG ? ncclAvg : op == COMM_MAX ? ncclMax : ncclSum; }

static NcclQueue *queue_of(CommGroup *g) { return g->nccl; }

static size_t align256(size_t b) { return (b + 255) & ~(size_t)255; }

/* At least `bytes` of q's device scratch; only q's stream uses it. Growing
 * it synchronises that stream (and cudaFree the device): it happens once
 * per size, not per step. */
static char *scratch_of(Comm *c, NcclQueue *q, size_t bytes) {
    if (bytes > q->scratch_bytes) {
        CUDA_CHECK(c, cudaStreamSynchronize(q->stream));
        if (q->scratch) CUDA_CHECK(c, cudaFree(q->scratch));
        q->scratch_bytes = max_sz(bytes, (size_t)1 << 20);
        CUDA_CHECK(c, cudaMalloc((void **)&q->scratch, q->scratch_bytes));
    }
    return q->scratch;
}

/* q's stream waits for what d's compute stream has queued so far (and,
 * before NCCL 2.26, for the operation issued last on any stream). */
static void after_compute(Comm *c, NcclQueue *q, Dev *d) {
    NcclState *s = c->impl->nccl;
    if (s->ordered && s->any_op) CUDA_CHECK(c, cudaStreamWaitEvent(q->stream, s->last_op, 0));
    if (!on_gpu(d)) return;
    CUDA_CHECK(c, cudaEventRecord(s->compute_done, (cudaStream_t)d->stream));
    CUDA_CHECK(c, cudaStreamWaitEvent(q->stream, s->compute_done, 0));
}

/* Records the operation just queued on q: its event, its time, and this
 * rank's count of operations on the group for the peers' watchdogs. */
static CommOp queued(Comm *c, CommGroup *g, NcclQueue *q, const char *what) {
    NcclState *s = c->impl->nccl;
    pthread_mutex_lock(&s->lock);
    if (q->issued - q->done >= RING) {   /* the ring is full: the oldest must be done first */
        pthread_mutex_unlock(&s->lock);
        CUDA_CHECK(c, cudaEventSynchronize(q->ev[q->done % RING]));
        pthread_mutex_lock(&s->lock);
        if (q->issued - q->done >= RING) q->done++;
    }
    uint64_t k = q->issued % RING;
    CUDA_CHECK(c, cudaEventRecord(q->ev[k], q->stream));
    if (s->ordered) {
        CUDA_CHECK(c, cudaEventRecord(s->last_op, q->stream));
        s->any_op = 1;
    }
    q->started[k] = now_s();
    q->what[k] = what;
    q->issued++;
    if (c->impl->shm && q->slot < NCCL_MAX_QUEUES)
        atomic_store(&c->impl->shm->slot[c->rank].nccl_issued[q->slot], q->issued);
    pthread_mutex_unlock(&s->lock);
    return (CommOp){g, q->issued};
}

static void d2d(Comm *c, NcclQueue *q, void *dst, const void *src, size_t bytes) {
    if (bytes) CUDA_CHECK(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, q->stream));
}

static void *stage_in(Comm *c, NcclQueue *q, void *dev_dst, const void *host_src, size_t bytes) {
    if (bytes) CUDA_CHECK(c, cudaMemcpyAsync(dev_dst, host_src, bytes, cudaMemcpyHostToDevice, q->stream));
    return dev_dst;
}

static void stage_out(Comm *c, NcclQueue *q, void *host_dst, const void *dev_src, size_t bytes) {
    if (bytes) CUDA_CHECK(c, cudaMemcpyAsync(host_dst, dev_src, bytes, cudaMemcpyDeviceToHost, q->stream));
    CUDA_CHECK(c, cudaStreamSynchronize(q->stream));
}

/* ---- the operations (comm.c made sure: member, n > 0) ----------------------------- */

/* The in-place collectives (all-reduce, broadcast, reduce) of buf[n]: on
 * the device as they are; host buffers chunk by chunk through the scratch. */
typedef enum { INPLACE_ALL_REDUCE, INPLACE_BROADCAST, INPLACE_REDUCE } InPlace;

static void inplace_call(Comm *c, NcclQueue *q, InPlace k, void *p, size_t n, CommDtype t, CommRed op,
                         int root) {
    if (k == INPLACE_ALL_REDUCE)
        NCCL_QCHECK(c, q, ncclAllReduce(p, p, n, nccl_type(t), nccl_op(op), q->comm, q->stream));
    else if (k == INPLACE_BROADCAST)
        NCCL_QCHECK(c, q, ncclBroadcast(p, p, n, nccl_type(t), root, q->comm, q->stream));
    else
        NCCL_QCHECK(c, q, ncclReduce(p, p, n, nccl_type(t), nccl_op(op), root, q->comm, q->stream));
}

static const char *inplace_names[] = {"ncclAllReduce", "ncclBroadcast", "ncclReduce"};

static CommOp inplace(CommGroup *g, Dev *d, InPlace k, void *buf, size_t n, CommDtype t, CommRed op, int root) {
    Comm *c = g->comm;
    NcclQueue *q = queue_of(g);
    size_t es = comm_dtype_size(t);
    after_compute(c, q, d);
    if (on_gpu(d)) {
        inplace_call(c, q, k, buf, n, t, op, root);
        return queued(c, g, q, inplace_names[k]);
    }
    size_t chunk = HOST_CHUNK / es;
    char *p = scratch_of(c, q, chunk * es);
    for (size_t i = 0; i < n; i += chunk) {
        size_t m = min_sz(chunk, n - i);
        stage_in(c, q, p, (char *)buf + i * es, m * es);
        inplace_call(c, q, k, p, m, t, op, root);
        queued(c, g, q, inplace_names[k]);
        stage_out(c, q, (char *)buf + i * es, p, m * es);   /* waits for the chunk */
    }
    return (CommOp){NULL, 0};   /* host buffers: done on return */
}

CommOp nccl_all_reduce(CommGroup *g, Dev *d, void *buf, size_t n, CommDtype t, CommRed op) {
    return inplace(g, d, INPLACE_ALL_REDUCE, buf, n, t, op, 0);
}

CommOp nccl_broadcast(CommGroup *g, Dev *d, void *buf, size_t n, CommDtype t, int root) {
    return inplace(g, d, INPLACE_BROADCAST, buf, n, t, COMM_SUM, root);
}

CommOp nccl_reduce(CommGroup *g, Dev *d, void *buf, size_t n, CommDtype t, CommRed op, int root) {
    return inplace(g, d, INPLACE_REDUCE, buf, n, t, op, root);
}

/* Uneven lengths: shard j sits at j * maxc of a padded buffer; shards
 * 0..extra-1 are maxc long and already in place, the rest are maxc - 1 long
 * and move with one 2D copy (pitch maxc - 1 packed, maxc padded). Host
 * buffers (small: comm_split's colours) are staged whole. */
CommOp nccl_reduce_scatter(CommGroup *g, Dev *d, void *out, const void *in, size_t n,
                           CommDtype t, CommRed op) {
    Comm *c = g->comm;
    NcclQueue *q = queue_of(g);
    cudaStream_t st = q->stream;
    int G = g->size, host = !on_gpu(d);
    size_t es = comm_dtype_size(t), off, cnt, maxc = (n + G - 1) / G, extra = n % G;
    comm_shard(n, G, g->index, &off, &cnt);
    size_t a = host ? align256(n * es) : 0, p = extra ? align256(G * maxc * es) : 0;
    char *base = scratch_of(c, q, a + p + (host ? maxc * es : 0) + 1);
    after_compute(c, q, d);
    const char *src = host ? stage_in(c, q, base, in, n * es) : in;
    char *dst = host ? base + a + p : out;
    if (!extra) {
        NCCL_QCHECK(c, q, ncclReduceScatter(src, dst, maxc, nccl_type(t), nccl_op(op), q->comm, st));
    } else {
        char *pad = base + a, *mine = pad + g->index * maxc * es;
        d2d(c, q, pad, src, extra * maxc * es);
        if (maxc > 1)
            CUDA_CHECK(c, cudaMemcpy2DAsync(pad + extra * maxc * es, maxc * es, src + extra * maxc * es,
                                            (maxc - 1) * es, (maxc - 1) * es, G - extra,
                                            cudaMemcpyDeviceToDevice, st));
        NCCL_QCHECK(c, q, ncclReduceScatter(pad, mine, maxc, nccl_type(t), nccl_op(op), q->comm, st));
        d2d(c, q, dst, mine, cnt * es);
    }
    CommOp o = queued(c, g, q, "ncclReduceScatter");
    if (!host) return o;
    stage_out(c, q, out, dst, cnt * es);
    return (CommOp){NULL, 0};
}

CommOp nccl_all_gather(CommGroup *g, Dev *d, void *out, const void *in, size_t n, CommDtype t) {
    Comm *c = g->comm;
    NcclQueue *q = queue_of(g);
    cudaStream_t st = q->stream;
    int G = g->size, host = !on_gpu(d);
    size_t es = comm_dtype_size(t), off, cnt, maxc = (n + G - 1) / G, extra = n % G;
    comm_shard(n, G, g->index, &off, &cnt);
    size_t a = host ? align256(maxc * es) : 0, p = extra ? align256(G * maxc * es) : 0;
    char *base = scratch_of(c, q, a + p + (host ? n * es : 0) + 1);
    after_compute(c, q, d);
    const char *src = host ? stage_in(c, q, base, in, cnt * es) : in;
    char *dst = host ? base + a + p : out;
    if (!extra) {
        NCCL_QCHECK(c, q, ncclAllGather(src, dst, maxc, nccl_type(t), q->comm, st));
    } else {
        char *pad = base + a, *mine = pad + g->index * maxc * es;
        d2d(c, q, mine, src, cnt * es);
        NCCL_QCHECK(c, q, ncclAllGather(mine, pad, maxc, nccl_type(t), q->comm, st));
        d2d(c, q, dst, pad, extra * maxc * es);
        if (maxc > 1)
            CUDA_CHECK(c, cudaMemcpy2DAsync(dst + extra * maxc * es, (maxc - 1) * es, pad + extra * maxc * es,
                                            maxc * es, (maxc - 1) * es, G - extra,
                                            cudaMemcpyDeviceToDevice, st));
    }
    CommOp o = queued(c, g, q, "ncclAllGather");
    if (!host) return o;
    stage_out(c, q, out, dst, n * es);
    return (CommOp){NULL, 0};
}

/* Inside a batch (comm_p2p_begin/end, ncclGroupStart/End) the event is
 * recorded at the batch's end, when NCCL has queued the whole group. */
CommOp nccl_p2p(CommGroup *g, Dev *d, void *buf, size_t n, CommDtype t, int peer, int send) {
    Comm *c = g->comm;
    NcclQueue *q = queue_of(g);
    if (!on_gpu(d))
        comm_die(c, "error: rank %d: comm_%s on the NCCL backend needs a GPU buffer", c->rank,
                 send ? "send" : "recv");
    after_compute(c, q, d);
    if (send) NCCL_QCHECK(c, q, ncclSend(buf, n, nccl_type(t), peer, q->comm, q->stream));
    else NCCL_QCHECK(c, q, ncclRecv(buf, n, nccl_type(t), peer, q->comm, q->stream));
    if (c->impl->batching) {
        c->impl->nccl->batch_q = q;
        c->impl->nccl->batch_g = g;
        return (CommOp){NULL, 0};
    }
    return queued(c, g, q, send ? "ncclSend" : "ncclRecv");
}

void nccl_barrier(CommGroup *g) {
    Comm *c = g->comm;
    NcclQueue *q = queue_of(g);
    char *one = scratch_of(c, q, 4);
    NCCL_QCHECK(c, q, ncclAllReduce(one, one, 1, ncclInt32, ncclSum, q->comm, q->stream));
    queued(c, g, q, "ncclAllReduce (barrier)");
    CUDA_CHECK(c, cudaStreamSynchronize(q->stream));
}

/* ---- joining, splitting, leaving ----------------------------------------------- */

/* A queue for communicator nc of group g (its name and members copied). */
static NcclQueue *queue_new(Comm *c, ncclComm_t nc, CommGroup *g, int slot) {
    NcclQueue *q = calloc(1, sizeof *q);
    if (q) q->ranks = malloc((size_t)g->size * sizeof(int));
    if (!q || !q->ranks) comm_die(c, "error: rank %d: out of memory making an NCCL queue", c->rank);
    q->comm = nc;
    q->slot = slot;
    snprintf(q->name, sizeof q->name, "%s", g->name);
    q->size = g->size;
    memcpy(q->ranks, g->ranks, (size_t)g->size * sizeof(int));
    CUDA_CHECK(c, cudaStreamCreateWithFlags(&q->stream, cudaStreamNonBlocking));
    for (int i = 0; i < RING; i++) CUDA_CHECK(c, cudaEventCreateWithFlags(&q->ev[i], cudaEventDisableTiming));
    NcclState *s = c->impl->nccl;
    pthread_mutex_lock(&s->lock);
    if (s->nq == NCCL_MAX_QUEUES) comm_die(c, "error: rank %d: more than %d NCCL groups", c->rank, NCCL_MAX_QUEUES);
    s->q[s->nq++] = q;
    pthread_mutex_unlock(&s->lock);
    return q;
}

/* Waits for q's work and frees it (not its communicator). */
static void queue_free(NcclQueue *q) {
    if (q->stream) cudaStreamSynchronize(q->stream);
    if (q->scratch) cudaFree(q->scratch);
    for (int i = 0; i < RING; i++)
        if (q->ev[i]) cudaEventDestroy(q->ev[i]);
    if (q->stream) cudaStreamDestroy(q->stream);
    free(q->ranks);
    free(q);
}

static void queue_drop(NcclState *s, NcclQueue *q) {
    pthread_mutex_lock(&s->lock);
    for (int i = 0; i < s->nq; i++)
        if (s->q[i] == q) s->q[i] = s->q[--s->nq];
    pthread_mutex_unlock(&s->lock);
    queue_free(q);
}

/* ---- the watchdog ------------------------------------------------------------ */

/* Ends the rank from the watchdog's thread: the line, every communicator
 * aborted (so no NCCL kernel waits on), the failure recorded for the
 * supervisor and the other ranks of a fork job, exit 1. */
/* A rank's last words: fmt's line on stderr, after whatever stdout holds. */
static void last_line(const char *fmt, va_list ap) {
    fflush(stdout);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    fflush(stderr);
}

static void watchdog_fail(NcclState *s, int culprit, int code, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 4, 5)));
static void watchdog_fail(NcclState *s, int culprit, int code, const char *fmt, ...) {
    Comm *c = s->c;
    va_list ap;
    va_start(ap, fmt);
    last_line(fmt, ap);
    va_end(ap);
    for (int i = 0; i < s->nq; i++) ncclCommAbort(s->q[i]->comm);
    if (c->impl->shm) shm_abort_set(c->impl->shm, culprit, code);
    _exit(1);
}

/* "ranks 3 and 5 have not called it": the members of q's group whose
 * published count of operations on it is below k (fork jobs only). */
static void missing_ranks(NcclState *s, NcclQueue *q, uint64_t k, char *buf, size_t len) {
    ShmHeader *h = s->c->impl->shm;
    buf[0] = 0;
    if (!h || q->slot >= NCCL_MAX_QUEUES) return;
    size_t n = 0;
    int found = 0;
    for (int i = 0; i < q->size && n + 32 < len; i++) {
        int r = q->ranks[i];
        uint64_t v = atomic_load(&h->slot[r].nccl_issued[q->slot]);
        if (r == s->c->rank || v >= k) continue;
        n += (size_t)snprintf(buf + n, len - n, "%s%d (it queued %llu)", found++ ? ", rank " : "; not called by rank ",
                              r, (unsigned long long)v);
    }
}

static void watch_queue(NcclState *s, NcclQueue *q, double now) {
    Comm *c = s->c;
    ncclResult_t ar = ncclSuccess;
    if (ncclCommGetAsyncError(q->comm, &ar) == ncclSuccess && ar != ncclSuccess && ar != ncclInProgress) {
        const char *detail = ncclGetLastError(q->comm);
        watchdog_fail(s, c->rank, 1, "error: rank %d: NCCL error on group %s (%d ranks): %s%s%s; aborting", c->rank,
                      q->name, q->size, ncclGetErrorString(ar), detail && *detail ? ": " : "", detail ? detail : "");
    }
    while (q->done < q->issued) {
        uint64_t k = q->done % RING;
        cudaError_t e = cudaEventQuery(q->ev[k]);
        if (e == cudaSuccess) { q->done++; continue; }
        if (e != cudaErrorNotReady)
            watchdog_fail(s, c->rank, 1, "error: rank %d: CUDA error waiting for %s #%llu on group %s: %s", c->rank,
                          q->what[k], (unsigned long long)q->done + 1, q->name, cudaGetErrorString(e));
        if (now - q->started[k] > s->timeout_s) {
            char who[256];
            missing_ranks(s, q, q->done + 1, who, sizeof who);
            watchdog_fail(s, c->rank, 1,
                          "error: rank %d: %s #%llu on group %s (%d ranks) did not complete within %g s "
                          "(--comm-timeout)%s; aborting", c->rank, q->what[k], (unsigned long long)q->done + 1,
                          q->name, q->size, s->timeout_s, who);
        }
        break;
    }
}

static void *watchdog(void *arg) {
    NcclState *s = arg;
    Comm *c = s->c;
    struct timespec ts = {0, (long)(WATCH_S * 1e9)};
    cudaSetDevice(s->gpu);   /* the current device is per thread: this rank's, for its events */
    while (!atomic_load(&s->stop)) {
        nanosleep(&ts, NULL);
        ShmHeader *h = c->impl->shm;
        int64_t w = h ? atomic_load(&h->abort_word) : 0;
        if (w) {   /* the supervisor (or another rank) stopped the job */
            int rank = (int)(w >> 32) - 2, code = (int32_t)(uint32_t)w;
            char how[64];
            shm_describe_status(code, how, sizeof how);
            if (rank < 0) watchdog_fail(s, rank, code, "error: rank %d stops: the launcher was interrupted", c->rank);
            watchdog_fail(s, rank, code, "error: rank %d stops: rank %d %s (%s); aborting its NCCL communicators",
                          c->rank, rank, code == 1 ? "failed" : "died", how);
        }
        pthread_mutex_lock(&s->lock);
        double now = now_s();
        for (int i = 0; i < s->nq; i++) watch_queue(s, s->q[i], now);
        pthread_mutex_unlock(&s->lock);
    }
    return NULL;
}

/* ---- joining ------------------------------------------------------------------ */

/* Fork job, rank > 0: waits for rank 0 to write the world's id into the
 * segment, by JOIN_S. 0, or -1 with err (the job aborting, the deadline). */
static int id_from_segment(Comm *c, ncclUniqueId *id, char *err, size_t errlen) {
    ShmHeader *h = c->impl->shm;
    double by = now_s() + JOIN_S;
    while (!atomic_load(&h->nccl_id_ready)) {
        if (shm_abort_said(h, c->rank, "before NCCL's id was out", err, errlen)) return -1;
        if (now_s() >= by) {
            snprintf(err, errlen, "rank %d: rank 0 did not hand out NCCL's id within %g s", c->rank, JOIN_S);
            return -1;
        }
        nanosleep(&(struct timespec){ 0, 1000000L }, NULL);
    }
    memcpy(id, h->nccl_id, sizeof *id);
    return 0;
}

/* The deadline of ncclCommInitRank, which has none of its own: a thread
 * beside it watches who has joined, through the fork job's segment (each
 * rank marks its slot before and after) or, under an external launcher,
 * through the rendezvous' connections, which rank 0 and each rank hold
 * until every rank has joined (each sends rank 0 the same two marks; a rank
 * that dies closes its end). A rank gone before it joined ends the job at
 * once; past the deadline (--comm-timeout, at least RENDEZVOUS_S: joining a
 * big world takes time), the ranks that have not joined are named. */
enum { JOIN_CALLING = 1, JOIN_DONE = 2 };
static const char *const join_marks[] = { "never called ncclCommInitRank", "inside ncclCommInitRank", "joined" };

typedef struct InitWatch {
    Comm *c;
    RdzvHold *hold;              /* external launcher; NULL when forked */
    double limit_s, deadline;
    _Atomic int self_done;       /* this rank's ncclCommInitRank returned */
    _Atomic int all_done;        /* rank 0: every rank has joined (the others: this rank) */
} InitWatch;

static void init_fail(InitWatch *w, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
static void init_fail(InitWatch *w, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    last_line(fmt, ap);
    va_end(ap);
    if (w->c->impl->shm) shm_abort_set(w->c->impl->shm, w->c->rank, 1);
    _exit(1);   /* the held connections close with it: the other ranks learn at once */
}

/* Fork job: "rank 2 (never called ncclCommInitRank), ..." from the slots. */
static void unjoined_slots(ShmHeader *h, char *buf, size_t len) {
    size_t k = 0;
    int n = 0;
    buf[0] = 0;
    for (int r = 0; r < h->world && k + 48 < len; r++) {
        int m = atomic_load(&h->slot[r].nccl_init);
        if (m < JOIN_DONE)
            k += (size_t)snprintf(buf + k, len - k, "%srank %d (%s)", n++ ? ", " : "", r, join_marks[m]);
    }
}

static void *init_watch(void *arg) {
    InitWatch *w = arg;
    Comm *c = w->c;
    ShmHeader *h = c->impl->shm;
    char who[512];
    for (;;) {
        if (w->hold && c->rank == 0) {
            int gone = rdzv_poll(w->hold, JOIN_DONE);
            if (gone > 0)
                init_fail(w, "error: rank 0: rank %d left before it joined NCCL's world (its connection to rank 0 "
                          "closed); stopping", gone);
            if (atomic_load(&w->self_done) && rdzv_all_marked(w->hold, JOIN_DONE)) {
                atomic_store(&w->all_done, 1);
                return NULL;
            }
        } else if (w->hold) {
            if (atomic_load(&w->self_done)) { atomic_store(&w->all_done, 1); return NULL; }
            if (rdzv_poll(w->hold, JOIN_DONE) == 0)
                init_fail(w, "error: rank %d: rank 0 left before every rank joined NCCL's world (it closed its "
                          "connection); stopping", c->rank);
        } else if (atomic_load(&w->self_done)) {
            atomic_store(&w->all_done, 1);
            return NULL;
        }
        int64_t ab = h ? atomic_load(&h->abort_word) : 0;
        if (ab) {   /* forked: the supervisor saw a rank die */
            shm_describe_status((int32_t)(uint32_t)ab, who, sizeof who);
            init_fail(w, "error: rank %d stops: rank %d died (%s) before every rank joined NCCL's world", c->rank,
                      (int)(ab >> 32) - 2, who);
        }
        if (now_s() >= w->deadline) {
            who[0] = 0;
            if (h) unjoined_slots(h, who, sizeof who);
            else if (w->hold && c->rank == 0) rdzv_missing(w->hold, JOIN_DONE, join_marks, who, sizeof who);
            init_fail(w, "error: rank %d: NCCL's world of %d ranks was not joined within %g s%s%s",
                      c->rank, c->world_size, w->limit_s, who[0] ? ": not joined: " : "",
                      who[0] ? who : c->rank == 0 ? "" : "; rank 0 knows who is missing");
        }
        nanosleep(&(struct timespec){ 0, 20000000L }, NULL);
    }
}

/* ncclCommInitRank of the world by --comm-timeout, watched (InitWatch);
 * hold: the rendezvous' connections (NULL when forked), released here. */
static ncclComm_t init_world(Comm *c, ncclUniqueId id, RdzvHold *hold) {
    NcclState *ns = c->impl->nccl;
    ShmHeader *h = c->impl->shm;
    double limit = ns->timeout_s > RENDEZVOUS_S ? ns->timeout_s : RENDEZVOUS_S;
    InitWatch w = { .c = c, .hold = hold, .limit_s = limit, .deadline = now_s() + limit };
    pthread_t th;
    int watched = c->world_size > 1 && pthread_create(&th, NULL, init_watch, &w) == 0;
    if (h) atomic_store(&h->slot[c->rank].nccl_init, JOIN_CALLING);
    if (hold) rdzv_mark(hold, JOIN_CALLING);
    ncclComm_t world;
    NCCL_CHECK(c, ncclCommInitRank(&world, c->world_size, id, c->rank));
    if (h) atomic_store(&h->slot[c->rank].nccl_init, JOIN_DONE);
    if (hold) rdzv_mark(hold, JOIN_DONE);
    atomic_store(&w.self_done, 1);
    if (watched) pthread_join(th, NULL);   /* rank 0: until every rank has joined */
    if (hold) rdzv_release(hold);
    return world;
}

int nccl_init(Comm *c, const CommLaunch *l, Dev *gpu, char *err, size_t errlen) {
    CommImpl *im = c->impl;
    if (!on_gpu(gpu)) {
        snprintf(err, errlen, "the NCCL backend needs a CUDA device (--device cuda)");
        return -1;
    }
    NcclState *ns = im->nccl = calloc(1, sizeof *im->nccl);
    if (!ns) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    ns->c = c;
    ns->gpu = gpu->gpu;
    ns->timeout_s = l->comm_timeout_s > 0 ? l->comm_timeout_s : DEFAULT_TIMEOUT_S;
    pthread_mutex_init(&ns->lock, NULL);
    CUDA_CHECK(c, cudaSetDevice(gpu->gpu));
    CUDA_CHECK(c, cudaEventCreateWithFlags(&ns->compute_done, cudaEventDisableTiming));
    int version = 0;
    ncclGetVersion(&version);
    ns->ordered = version < NCCL_VERSION(2, 26, 0);
    if (!ns->ordered) setenv("NCCL_LAUNCH_ORDER_IMPLICIT", "1", 0);   /* before NCCL reads its environment; a user's value wins */
    else CUDA_CHECK(c, cudaEventCreateWithFlags(&ns->last_op, cudaEventDisableTiming));
    ncclUniqueId id;
    RdzvHold hold, *held = NULL;
    memset(&id, 0, sizeof id);
    if (c->rank == 0) NCCL_CHECK(c, ncclGetUniqueId(&id));
    if (c->world_size > 1 && im->shm) {           /* forked: through the inherited segment */
        ShmHeader *h = im->shm;
        if (c->rank == 0) {
            memcpy(h->nccl_id, &id, sizeof id);
            atomic_store(&h->nccl_id_ready, 1);
            shm_ring_all(h);
        } else if (id_from_segment(c, &id, err, errlen)) {
            return -1;
        }
    } else if (c->world_size > 1) {               /* external launcher: over TCP, to this job's ranks */
        RdzvJob j;
        comm_rdzv_job(l, l->master_addr, &j);
        int rc = rdzv_bcast_hold(&j, &id, sizeof id, &hold, err, errlen);
        if (rc) return rc;
        held = &hold;
    }
    ncclComm_t w = init_world(c, id, held);
    c->world.nccl = queue_new(c, w, &c->world, ns->nsplits++);
    if (pthread_create(&ns->watchdog, NULL, watchdog, ns) != 0) {
        snprintf(err, errlen, "cannot start the NCCL watchdog thread");
        return -1;
    }
    ns->watching = 1;
    return 0;
}

void nccl_free(Comm *c) {
    NcclState *ns = c->impl->nccl;
    if (!ns) return;
    if (ns->watching) {
        atomic_store(&ns->stop, 1);
        pthread_join(ns->watchdog, NULL);
    }
    if (c->world.nccl) {
        NcclQueue *q = c->world.nccl;
        ncclComm_t comm = q->comm;
        queue_drop(ns, q);
        ncclCommDestroy(comm);
    }
    c->world.nccl = NULL;
    if (ns->compute_done) cudaEventDestroy(ns->compute_done);
    if (ns->last_op) cudaEventDestroy(ns->last_op);
    pthread_mutex_destroy(&ns->lock);
    free(ns);
    c->impl->nccl = NULL;
}

void nccl_split(Comm *c, int color, int key, CommGroup *g) {
    NcclState *s = c->impl->nccl;
    ncclComm_t nc = NULL;
    NcclQueue *w = c->world.nccl;
    int slot = s->nsplits++;   /* every rank counts every split: the slots agree */
    NCCL_CHECK(c, ncclCommSplit(w->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &nc, NULL));
    g->nccl = nc ? queue_new(c, nc, g, slot) : NULL;
}

void nccl_group_free(CommGroup *g) {
    NcclQueue *q = g->nccl;
    ncclComm_t comm = q->comm;
    queue_drop(g->comm->impl->nccl, q);
    ncclCommDestroy(comm);
}

void nccl_group_start(Comm *c) {
    c->impl->nccl->batch_q = NULL;
    NCCL_CHECK(c, ncclGroupStart());
}

CommOp nccl_group_end(Comm *c) {
    NcclState *s = c->impl->nccl;
    NCCL_CHECK(c, ncclGroupEnd());
    if (!s->batch_q) return (CommOp){NULL, 0};
    return queued(c, s->batch_g, s->batch_q, "ncclSend/ncclRecv group");
}

void nccl_wait(Comm *c, Dev *d) {
    if (!on_gpu(d)) return;
    NcclState *s = c->impl->nccl;
    pthread_mutex_lock(&s->lock);
    for (int i = 0; i < s->nq; i++) {
        NcclQueue *q = s->q[i];
        if (q->issued) CUDA_CHECK(c, cudaStreamWaitEvent((cudaStream_t)d->stream, q->ev[(q->issued - 1) % RING], 0));
    }
    pthread_mutex_unlock(&s->lock);
}

void nccl_describe(const Comm *c, char *buf, size_t len) {
    int v = 0;
    ncclGetVersion(&v);
    /* from 2.9 the code is major * 10000 + minor * 100 + patch */
    snprintf(buf, len, "NCCL %d.%d.%d (a communicator and a stream a group, watchdog %g s)", v / 10000,
             v / 100 % 100, v % 100, c->impl->nccl->timeout_s);
}

void nccl_op_wait(CommOp op, Dev *d) {
    if (!on_gpu(d) || !op.g->nccl) return;
    NcclQueue *q = op.g->nccl;
    /* an event recorded again since (more than RING operations later) stands
     * for a later operation: waiting for it is waiting longer, never less */
    CUDA_CHECK(op.g->comm, cudaStreamWaitEvent((cudaStream_t)d->stream, q->ev[(op.seq - 1) % RING], 0));
}
#endif /* USE_NCCL */
