/* comm.c: launching ranks, the process mesh, and the collectives of comm.h.
 *
 * This is the floor every parallel dimension of hybrid-parallelism.txt stands
 * on (DESIGN.md, "Processes" and "Errors"): DP reduces gradients over the dp
 * group, TP all-reduces activations inside the tp group, PP sends activations
 * between neighbouring stages of the pp group, and the tied embedding sums
 * its gradient over the first and last stage (the embed group). The mesh puts
 * rank r at (pp, dp, tp) with r = tp_rank + tp * (dp_rank + dp * pp_rank).
 *
 * Launching. `--ranks N` forks N ranks; the process that forked them stays
 * as their supervisor. It relays their output, reaps them, and when one
 * fails it raises the abort flag in the shared segment, prints which rank
 * died and how, and SIGKILLs whoever has not stopped GRACE_S later. Ranks
 * die with it (PR_SET_PDEATHSIG). Under torchrun, srun or mpirun one
 * process is one rank; rank 0 hands out what the others need (the NCCL id,
 * or the name of the shared segment) over TCP.
 *
 * The shared-memory backend. Every rank owns three staging areas in one
 * segment (IN, OUT, P2P; area_bytes each) and a slot of counters. Rank r
 * "publishes" an area to rank q by bumping r.pub[q][area]; q "consumes" it
 * by bumping q.con[r][area] once it has read it. r may refill an area only
 * when every rank has consumed everything r published from it. Counting
 * per pair of ranks (not per group) is what lets groups overlap freely:
 * two ranks execute their common operations in the same order, whichever
 * groups those belong to, so the n-th publication r made for q is the one q
 * expects n-th. A group needs no shared state of its own, and comm_split is
 * only an exchange of colors.
 *
 * An all-reduce, chunk by chunk: every member copies its chunk into IN;
 * member i sums slice i of the chunk over all INs in group order into its
 * OUT; every member copies all OUT slices back. Each element is summed once,
 * in the order index 0 + 1 + ... on one rank, and copied everywhere: every
 * member holds the same bits, and the sum does not depend on the chunk size.
 * Reduce-scatter, all-gather, broadcast and reduce are the halves of that.
 * Sends and receives go through a small progress engine that moves whatever
 * chunk can move, so a batch of them (a ring, a pipeline's two neighbours)
 * completes in any order. GPU buffers are staged with dev_to_host and
 * dev_from_host, which is how several ranks share one GPU.
 *
 * Waiting: spin a little, then yield the core, then sleep on a futex (this
 * rank's "bell", rung by whoever changes a counter it may wait for), waking
 * every SLEEP_NS to look at the abort flag and at the rank it waits for.
 * Tests run 8 ranks on 2 cores, where a pure spin would starve the rank
 * being waited for.
 *
 * The NCCL backend maps each call onto its NCCL collective on a
 * communication stream that first waits for the compute stream (an event);
 * comm_wait makes the compute stream wait back. Groups are ncclCommSplit of
 * the world communicator. Lengths that do not divide by the group size are
 * padded to equal shards in a scratch buffer, and host buffers are staged
 * through it too.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include "comm.h"

#ifdef USE_NCCL
#ifndef USE_CUDA
#error "USE_NCCL needs USE_CUDA"
#endif
#include <cuda_runtime_api.h>
#include <nccl.h>
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "comm.c needs NCCL 2.18 or later (ncclCommSplit)"
#endif
#endif

/* Measured on 2 cores (test_comm: 8 ranks; bench_comm: 1 KB all-reduce):
 * 64 spins + 16 yields: suite 5.0 s, 2.0 us with 2 ranks, 58 us with 8;
 * sleeping at once: 4.7 s, 14.5 us, 105 us; spinning 20000 times: 11.3 s,
 * 686 us, 4329 us (the spinner starves the rank it waits for). */
#define SPINS 64                 /* busy polls before yielding the core */
#define YIELDS 16                /* sched_yield polls before sleeping */
#define SLEEP_NS 10000000L       /* a sleeping waiter looks at the abort flag this often */
#define PID_CHECK_S 0.5          /* external launcher: how often a waiter checks its peer's process */
#define GRACE_S 3.0              /* supervisor: SIGKILL ranks still running this long after a failure */
#define RENDEZVOUS_S 120         /* external launcher: how long ranks wait for rank 0 */
#define TILE 1024                /* elements reduced at a time */

/* ---- small things ---------------------------------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }
static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

size_t comm_dtype_size(CommDtype t) { return t == COMM_BF16 ? 2 : 4; }

void comm_shard(size_t n, int size, int index, size_t *offset, size_t *count) {
    size_t base = n / (size_t)size, extra = n % (size_t)size, i = (size_t)index;
    *count = base + (i < extra);
    *offset = i * base + min_sz(i, extra);
}

static int on_gpu(const Dev *d) { return d && d->kind == DEV_CUDA; }

/* How a rank ended: an exit status >= 0, -signal, or CODE_GONE (its process
 * vanished and nobody saw how: an external launcher, no supervisor). */
#define CODE_GONE (-1000)

static void describe_status(int code, char *buf, size_t len) {
    if (code == CODE_GONE) snprintf(buf, len, "its process is gone");
    else if (code < 0) snprintf(buf, len, "killed by signal %d", -code);
    else snprintf(buf, len, "exit status %d", code);
}

/* ---- the shared segment ---------------------------------------------------- */

enum { AREA_IN, AREA_OUT, AREA_P2P, AREA_BARRIER, AREAS };
#define DATA_AREAS 3             /* the barrier "area" is counters only */
#define SHM_MAGIC 0x636f6d6d2d747261ULL

/* One rank's counters. pub is written only by its owner, con only by its
 * owner; the other side reads them. */
typedef struct ShmSlot {
    _Alignas(64) _Atomic uint32_t bell;   /* futex word: bumped when a counter this rank waits on moves */
    _Atomic uint32_t sleeping;            /* 1 while the owner sleeps on bell */
    _Atomic int32_t pid;
    _Atomic int32_t exited;               /* 1 once the rank has left (exit_code says how) */
    _Atomic int32_t exit_code;            /* exit status, or -signal */
    _Atomic uint64_t pub[COMM_MAX_RANKS][AREAS];  /* times the owner filled area a for rank q */
    _Atomic uint64_t con[COMM_MAX_RANKS][AREAS];  /* times the owner finished reading rank q's area a */
} ShmSlot;

typedef struct ShmHeader {
    uint64_t magic;
    int32_t world;
    uint64_t area_bytes;                  /* one staging area */
    uint64_t data_offset;                 /* where the areas start: [rank][area][area_bytes] */
    _Atomic int64_t abort_word;           /* 0, or ((rank + 2) << 32 | (uint32_t)code) of the first failure */
    _Atomic int32_t mapped;               /* external launcher: ranks that mapped the segment */
    _Atomic uint64_t nccl_id_ready;       /* fork + NCCL: 1 once rank 0 wrote nccl_id */
    unsigned char nccl_id[128];
    ShmSlot slot[];                       /* [world] */
} ShmHeader;

/* 512 KB: a chunk stays in cache between the phases of an all-reduce
 * (bench_comm measured 2 ranks at about 2.0 GB/s bus bandwidth for 64-256 MB
 * against about 1.4 with 4 MB areas), and 64 ranks map 96 MB at most. */
static size_t shm_area_bytes(int world) { (void)world; return (size_t)512 << 10; }

static size_t shm_header_bytes(int world) {
    size_t b = sizeof(ShmHeader) + (size_t)world * sizeof(ShmSlot);
    return (b + 4095) & ~(size_t)4095;
}

static size_t shm_segment_bytes(int world) {
    return shm_header_bytes(world) + (size_t)world * DATA_AREAS * shm_area_bytes(world);
}

/* The segment comes zeroed (anonymous or ftruncated memory); set the sizes. */
static void shm_header_init(ShmHeader *h, int world) {
    h->world = world;
    h->area_bytes = shm_area_bytes(world);
    h->data_offset = shm_header_bytes(world);
    atomic_thread_fence(memory_order_release);
    h->magic = SHM_MAGIC;
}

static char *shm_area(ShmHeader *h, int rank, int area) {
    return (char *)h + h->data_offset + ((size_t)rank * DATA_AREAS + (size_t)area) * h->area_bytes;
}

static void futex_wait(_Atomic uint32_t *w, uint32_t seen, long ns) {
    struct timespec ts = { 0, ns };
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT, seen, &ts, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *w) {
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Tells rank q that something it may wait for has changed. */
static void shm_ring(ShmHeader *h, int q) {
    ShmSlot *s = &h->slot[q];
    atomic_fetch_add(&s->bell, 1);
    if (atomic_load(&s->sleeping)) futex_wake(&s->bell);
}

static void shm_ring_all(ShmHeader *h) {
    for (int q = 0; q < h->world; q++) shm_ring(h, q);
}

/* Records the first failure of the job (rank -1: the launcher was interrupted). */
static void shm_abort_set(ShmHeader *h, int rank, int code) {
    int64_t expect = 0, word = ((int64_t)(rank + 2) << 32) | (uint32_t)code;
    atomic_compare_exchange_strong(&h->abort_word, &expect, word);
    shm_ring_all(h);
}

/* ---- the communicator's private state ------------------------------------- */

typedef struct P2POp {
    int send, peer;              /* peer: world rank */
    Dev *d;
    char *buf;
    size_t bytes, done;
} P2POp;

struct CommImpl {
    ShmHeader *shm;              /* NULL with NCCL under an external launcher */
    size_t shm_bytes;
    char shm_name[64];           /* rank 0, external launcher: unlinked if the others never came */
    int check_pids;              /* no supervisor: waiters watch their peer's process themselves */
    double next_pid_check[COMM_MAX_RANKS];
    int batching, nbatch;        /* comm_p2p_begin depth, queued operations */
    P2POp batch[COMM_MAX_BATCH];
#ifdef USE_NCCL
    cudaStream_t stream;         /* communication stream */
    cudaEvent_t compute_done, comm_done;
    char *scratch;               /* device staging: host buffers, padded shards */
    size_t scratch_bytes;
#endif
};

/* Prints the line, records the failure for the other ranks (the first one
 * recorded wins: `culprit` is the rank that started it, with its code), and
 * exits 1. */
static void comm_fail(Comm *c, int culprit, int code, const char *fmt, va_list ap) __attribute__((noreturn));
static void comm_fail(Comm *c, int culprit, int code, const char *fmt, va_list ap) {
    fflush(stdout);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    if (c && c->impl && c->impl->shm) {
        ShmHeader *h = c->impl->shm;
        shm_abort_set(h, culprit, code);
        if (c->impl->shm_name[0] && atomic_load(&h->mapped) < h->world) shm_unlink(c->impl->shm_name);
    }
    exit(1);
}

/* This rank's own fatal error. */
static void comm_die(Comm *c, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
static void comm_die(Comm *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    comm_fail(c, c->rank, 1, fmt, ap);
}

/* Stopping because rank `culprit` ended with `code`. */
static void comm_die_for(Comm *c, int culprit, int code, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 4, 5)));
static void comm_die_for(Comm *c, int culprit, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    comm_fail(c, culprit, code, fmt, ap);
}

/* ---- waiting ----------------------------------------------------------------- */

static int process_alive(int pid) {
    if (pid <= 0) return 1;                /* not known yet */
    if (kill(pid, 0) != 0 && errno == ESRCH) return 0;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');           /* "pid (comm) S ...": the state follows the name */
    return !(p && (p[2] == 'Z' || p[2] == 'X'));
}

/* Exits when the job is aborting. */
static void shm_check_abort(Comm *c) {
    int64_t w = atomic_load(&c->impl->shm->abort_word);
    if (!w) return;
    int rank = (int)(w >> 32) - 2, code = (int32_t)(uint32_t)w;
    char how[64];
    describe_status(code, how, sizeof how);
    if (rank < 0)
        comm_die_for(c, rank, code, "error: rank %d stops: the launcher was interrupted (signal %d)", c->rank, -code);
    comm_die_for(c, rank, code, "error: rank %d stops: rank %d died (%s)", c->rank, rank, how);
}

/* Exits when the job aborts, or when `peer` has left and *p can no longer
 * reach v (p NULL: no such condition, the peer is simply needed). */
static void shm_check_peer(Comm *c, int peer, _Atomic uint64_t *p, uint64_t v) {
    CommImpl *im = c->impl;
    shm_check_abort(c);
    if (peer < 0 || peer == c->rank || (p && atomic_load(p) >= v)) return;
    ShmSlot *s = &im->shm->slot[peer];
    int code;
    if (atomic_load(&s->exited)) {
        code = atomic_load(&s->exit_code);
    } else if (im->check_pids && now_s() >= im->next_pid_check[peer]) {
        im->next_pid_check[peer] = now_s() + PID_CHECK_S;
        if (process_alive(atomic_load(&s->pid))) return;
        code = CODE_GONE;
    } else {
        return;
    }
    if (p && atomic_load(p) >= v) return;    /* it finished what we needed on its way out */
    char how[64];
    describe_status(code, how, sizeof how);
    comm_die_for(c, peer, code, "error: rank %d stops: rank %d died (%s) while rank %d waited for it",
                 c->rank, peer, code == 0 ? "finished" : how, c->rank);
}

/* One step of waiting, each step longer: spin, yield the core, then sleep
 * until this rank's bell moves past bell_seen (or SLEEP_NS passes). */
static void shm_pause(Comm *c, int idle, uint32_t bell_seen) {
    if (idle < SPINS) { cpu_relax(); return; }
    if (idle < SPINS + YIELDS) { sched_yield(); return; }
    ShmSlot *me = &c->impl->shm->slot[c->rank];
    atomic_store(&me->sleeping, 1);
    futex_wait(&me->bell, bell_seen, SLEEP_NS);
    atomic_store(&me->sleeping, 0);
}

/* Waits until *p >= v; `peer` is the rank that moves *p. The bell is read
 * before the counter so that a ring between the two wakes the sleep. */
static void shm_wait_geq(Comm *c, _Atomic uint64_t *p, uint64_t v, int peer) {
    if (atomic_load(p) >= v) return;
    ShmSlot *me = &c->impl->shm->slot[c->rank];
    for (int idle = 0;; idle += idle < INT_MAX) {
        uint32_t b = atomic_load(&me->bell);
        if (atomic_load(p) >= v) return;
        if (peer == c->rank && idle >= SPINS)
            comm_die(c, "error: rank %d waits for itself: a send to itself needs comm_p2p_begin/end",
                     c->rank);
        if (idle >= SPINS + YIELDS) shm_check_peer(c, peer, p, v);
        shm_pause(c, idle, b);
    }
}

/* ---- publishing and consuming ------------------------------------------------ */

/* Makes my area a readable by ranks[0..n) except ranks[skip]. */
static void shm_publish(Comm *c, int area, const int *ranks, int n, int skip) {
    ShmHeader *h = c->impl->shm;
    ShmSlot *me = &h->slot[c->rank];
    for (int i = 0; i < n; i++)
        if (i != skip) atomic_fetch_add(&me->pub[ranks[i]][area], 1);
    for (int i = 0; i < n; i++)
        if (i != skip && ranks[i] != c->rank) shm_ring(h, ranks[i]);
}

/* Waits until every rank has read everything I published from area a. */
static void shm_wait_free(Comm *c, int area) {
    ShmHeader *h = c->impl->shm;
    ShmSlot *me = &h->slot[c->rank];
    for (int q = 0; q < h->world; q++)
        shm_wait_geq(c, &h->slot[q].con[c->rank][area], atomic_load(&me->pub[q][area]), q);
}

static int shm_area_free(Comm *c, int area) {
    ShmHeader *h = c->impl->shm;
    ShmSlot *me = &h->slot[c->rank];
    for (int q = 0; q < h->world; q++)
        if (atomic_load(&h->slot[q].con[c->rank][area]) < atomic_load(&me->pub[q][area])) return 0;
    return 1;
}

/* Waits for rank j's next publication of area a to me. */
static void shm_wait_pub(Comm *c, int j, int area) {
    ShmHeader *h = c->impl->shm;
    uint64_t want = atomic_load(&h->slot[c->rank].con[j][area]) + 1;
    shm_wait_geq(c, &h->slot[j].pub[c->rank][area], want, j);
}

static int shm_has_pub(Comm *c, int j, int area) {
    ShmHeader *h = c->impl->shm;
    return atomic_load(&h->slot[j].pub[c->rank][area]) > atomic_load(&h->slot[c->rank].con[j][area]);
}

/* I am done reading rank j's area a. */
static void shm_consume(Comm *c, int j, int area) {
    ShmHeader *h = c->impl->shm;
    atomic_fetch_add(&h->slot[c->rank].con[j][area], 1);
    if (j != c->rank) shm_ring(h, j);
}

/* Buffers of d to and from host memory; complete on return. */
static void stage_in(Dev *d, void *host_dst, const void *src, size_t bytes) {
    if (!bytes) return;
    if (on_gpu(d)) { dev_to_host(d, host_dst, src, bytes); dev_sync(d); }
    else memcpy(host_dst, src, bytes);
}

static void stage_out(Dev *d, void *dst, const void *host_src, size_t bytes) {
    if (!bytes) return;
    if (on_gpu(d)) { dev_from_host(d, dst, host_src, bytes); dev_sync(d); }
    else memcpy(dst, host_src, bytes);
}

/* ---- reduction: dst[n] = src[0] + src[1] + ... + src[ns-1], left to right --- */

/* bf16 conversions: tensor.h (round to nearest even; NaN stays NaN). */

static void reduce_into(void *dst, const void *const *src, int ns, size_t n, CommDtype t, CommRed op) {
    for (size_t k0 = 0; k0 < n; k0 += TILE) {
        size_t m = min_sz(TILE, n - k0);
        if (t == COMM_F32) {
            float *o = (float *)dst + k0;
            memcpy(o, (const float *)src[0] + k0, m * sizeof(float));
            for (int j = 1; j < ns; j++) {
                const float *s = (const float *)src[j] + k0;
                for (size_t k = 0; k < m; k++) o[k] += s[k];
            }
            if (op == COMM_AVG)
                for (size_t k = 0; k < m; k++) o[k] /= (float)ns;
        } else if (t == COMM_BF16) {
            float acc[TILE];
            for (size_t k = 0; k < m; k++) acc[k] = bf16_to_f32(((const uint16_t *)src[0])[k0 + k]);
            for (int j = 1; j < ns; j++)
                for (size_t k = 0; k < m; k++) acc[k] += bf16_to_f32(((const uint16_t *)src[j])[k0 + k]);
            for (size_t k = 0; k < m; k++) {
                if (op == COMM_AVG) acc[k] /= (float)ns;
                ((uint16_t *)dst)[k0 + k] = bf16_from_f32(acc[k]);
            }
        } else {  /* COMM_I32: wraps around on overflow, like NCCL */
            uint32_t *o = (uint32_t *)dst + k0;
            memcpy(o, (const uint32_t *)src[0] + k0, m * sizeof(uint32_t));
            for (int j = 1; j < ns; j++) {
                const uint32_t *s = (const uint32_t *)src[j] + k0;
                for (size_t k = 0; k < m; k++) o[k] += s[k];
            }
        }
    }
}

/* ---- shared-memory collectives (callers made sure: member, size > 1, n > 0) --- */

static size_t chunk_elems(Comm *c, CommDtype t) { return c->impl->shm->area_bytes / comm_dtype_size(t); }

static void shm_all_reduce(CommGroup *g, Dev *d, void *buf, size_t n, CommDtype t, CommRed op) {
    Comm *c = g->comm;
    ShmHeader *h = c->impl->shm;
    size_t es = comm_dtype_size(t), cap = chunk_elems(c, t), o, k;
    int G = g->size, me = c->rank;
    const void *src[COMM_MAX_RANKS];
    for (size_t s = 0; s < n; s += cap) {
        size_t len = min_sz(cap, n - s);
        char *x = (char *)buf + s * es;
        /* 1. my chunk into IN, for everyone */
        shm_wait_free(c, AREA_IN);
        stage_in(d, shm_area(h, me, AREA_IN), x, len * es);
        shm_publish(c, AREA_IN, g->ranks, G, -1);
        /* 2. my slice, summed over every IN in group order, into OUT */
        comm_shard(len, G, g->index, &o, &k);
        shm_wait_free(c, AREA_OUT);
        for (int j = 0; j < G; j++) {
            shm_wait_pub(c, g->ranks[j], AREA_IN);
            src[j] = shm_area(h, g->ranks[j], AREA_IN) + o * es;
        }
        reduce_into(shm_area(h, me, AREA_OUT) + o * es, src, G, k, t, op);
        for (int j = 0; j < G; j++) shm_consume(c, g->ranks[j], AREA_IN);
        shm_publish(c, AREA_OUT, g->ranks, G, -1);
        /* 3. every slice back, starting from my own (spreads the readers) */
        for (int i = 0; i < G; i++) {
            int j = (g->index + i) % G, r = g->ranks[j];
            comm_shard(len, G, j, &o, &k);
            shm_wait_pub(c, r, AREA_OUT);
            stage_out(d, x + o * es, shm_area(h, r, AREA_OUT) + o * es, k * es);
            shm_consume(c, r, AREA_OUT);
        }
    }
}

static void shm_reduce_scatter(CommGroup *g, Dev *d, void *out, const void *in, size_t n,
                               CommDtype t, CommRed op) {
    Comm *c = g->comm;
    ShmHeader *h = c->impl->shm;
    size_t es = comm_dtype_size(t), cap = chunk_elems(c, t), off, cnt;
    int G = g->size, me = c->rank;
    const void *src[COMM_MAX_RANKS];
    comm_shard(n, G, g->index, &off, &cnt);
    for (size_t s = 0; s < n; s += cap) {
        size_t len = min_sz(cap, n - s);
        size_t lo = max_sz(s, off), hi = min_sz(s + len, off + cnt);
        shm_wait_free(c, AREA_IN);
        stage_in(d, shm_area(h, me, AREA_IN), (const char *)in + s * es, len * es);
        shm_publish(c, AREA_IN, g->ranks, G, -1);
        for (int j = 0; j < G; j++) {
            shm_wait_pub(c, g->ranks[j], AREA_IN);
            src[j] = shm_area(h, g->ranks[j], AREA_IN) + (lo - s) * es;
        }
        if (hi > lo) {
            char *dst = (char *)out + (lo - off) * es;
            if (on_gpu(d)) {   /* sum into my OUT, then up to the GPU */
                shm_wait_free(c, AREA_OUT);
                reduce_into(shm_area(h, me, AREA_OUT), src, G, hi - lo, t, op);
                stage_out(d, dst, shm_area(h, me, AREA_OUT), (hi - lo) * es);
            } else {
                reduce_into(dst, src, G, hi - lo, t, op);
            }
        }
        for (int j = 0; j < G; j++) shm_consume(c, g->ranks[j], AREA_IN);
    }
}

static void shm_all_gather(CommGroup *g, Dev *d, void *out, const void *in, size_t n, CommDtype t) {
    Comm *c = g->comm;
    ShmHeader *h = c->impl->shm;
    size_t es = comm_dtype_size(t), cap = chunk_elems(c, t), off, cnt;
    int G = g->size, me = c->rank;
    comm_shard(n, G, g->index, &off, &cnt);
    for (size_t s = 0; s < n; s += cap) {
        size_t len = min_sz(cap, n - s);
        size_t lo = max_sz(s, off), hi = min_sz(s + len, off + cnt);
        if (hi > lo) {   /* my shard's part of this chunk, at its place in IN */
            shm_wait_free(c, AREA_IN);
            stage_in(d, shm_area(h, me, AREA_IN) + (lo - s) * es, (const char *)in + (lo - off) * es,
                     (hi - lo) * es);
            shm_publish(c, AREA_IN, g->ranks, G, -1);
        }
        for (int i = 0; i < G; i++) {
            int j = (g->index + i) % G, r = g->ranks[j];
            size_t oj, cj;
            comm_shard(n, G, j, &oj, &cj);
            size_t lj = max_sz(s, oj), hj = min_sz(s + len, oj + cj);
            if (hj <= lj) continue;
            shm_wait_pub(c, r, AREA_IN);
            stage_out(d, (char *)out + lj * es, shm_area(h, r, AREA_IN) + (lj - s) * es, (hj - lj) * es);
            shm_consume(c, r, AREA_IN);
        }
    }
}

static void shm_broadcast(CommGroup *g, Dev *d, void *buf, size_t n, CommDtype t, int root) {
    Comm *c = g->comm;
    ShmHeader *h = c->impl->shm;
    size_t es = comm_dtype_size(t), cap = chunk_elems(c, t);
    int rr = g->ranks[root];
    for (size_t s = 0; s < n; s += cap) {
        size_t len = min_sz(cap, n - s);
        char *x = (char *)buf + s * es;
        if (g->index == root) {
            shm_wait_free(c, AREA_IN);
            stage_in(d, shm_area(h, rr, AREA_IN), x, len * es);
            shm_publish(c, AREA_IN, g->ranks, g->size, root);
        } else {
            shm_wait_pub(c, rr, AREA_IN);
            stage_out(d, x, shm_area(h, rr, AREA_IN), len * es);
            shm_consume(c, rr, AREA_IN);
        }
    }
}

static void shm_reduce(CommGroup *g, Dev *d, void *buf, size_t n, CommDtype t, CommRed op, int root) {
    Comm *c = g->comm;
    ShmHeader *h = c->impl->shm;
    size_t es = comm_dtype_size(t), cap = chunk_elems(c, t);
    int G = g->size, me = c->rank;
    const void *src[COMM_MAX_RANKS];
    for (size_t s = 0; s < n; s += cap) {
        size_t len = min_sz(cap, n - s);
        char *x = (char *)buf + s * es;
        shm_wait_free(c, AREA_IN);
        stage_in(d, shm_area(h, me, AREA_IN), x, len * es);
        shm_publish(c, AREA_IN, &g->ranks[root], 1, -1);
        if (g->index != root) continue;
        for (int j = 0; j < G; j++) {
            shm_wait_pub(c, g->ranks[j], AREA_IN);
            src[j] = shm_area(h, g->ranks[j], AREA_IN);
        }
        if (on_gpu(d)) {
            shm_wait_free(c, AREA_OUT);
            reduce_into(shm_area(h, me, AREA_OUT), src, G, len, t, op);
            stage_out(d, x, shm_area(h, me, AREA_OUT), len * es);
        } else {
            reduce_into(x, src, G, len, t, op);
        }
        for (int j = 0; j < G; j++) shm_consume(c, g->ranks[j], AREA_IN);
    }
}

static void shm_barrier(CommGroup *g) {
    Comm *c = g->comm;
    shm_publish(c, AREA_BARRIER, g->ranks, g->size, g->index);
    for (int j = 0; j < g->size; j++) {
        if (j == g->index) continue;
        shm_wait_pub(c, g->ranks[j], AREA_BARRIER);
        shm_consume(c, g->ranks[j], AREA_BARRIER);
    }
}

/* The point-to-point engine: moves any chunk that can move until all of ops
 * are done. Sends share my one P2P area, so they go one after another;
 * receives from different ranks proceed together, from one rank in order. */
static void shm_p2p_run(Comm *c, P2POp *ops, int n) {
    ShmHeader *h = c->impl->shm;
    ShmSlot *me = &h->slot[c->rank];
    size_t cap = h->area_bytes;
    for (int idle = 0;;) {
        uint32_t bell = atomic_load(&me->bell);
        int pending = 0, progressed = 0, send_seen = 0;
        for (int i = 0; i < n; i++) {
            P2POp *o = &ops[i];
            if (o->done == o->bytes) continue;
            pending++;
            if (o->send) {
                if (send_seen++ || !shm_area_free(c, AREA_P2P)) continue;
                size_t len = min_sz(cap, o->bytes - o->done);
                stage_in(o->d, shm_area(h, c->rank, AREA_P2P), o->buf + o->done, len);
                shm_publish(c, AREA_P2P, &o->peer, 1, -1);
                o->done += len;
                progressed = 1;
            } else {
                int earlier = 0;
                for (int e = 0; e < i; e++)
                    earlier |= !ops[e].send && ops[e].peer == o->peer && ops[e].done < ops[e].bytes;
                if (earlier || !shm_has_pub(c, o->peer, AREA_P2P)) continue;
                size_t len = min_sz(cap, o->bytes - o->done);
                stage_out(o->d, o->buf + o->done, shm_area(h, o->peer, AREA_P2P), len);
                shm_consume(c, o->peer, AREA_P2P);
                o->done += len;
                progressed = 1;
            }
        }
        if (!pending) return;
        if (progressed) { idle = 0; continue; }
        if (idle >= SPINS + YIELDS) {   /* stuck: is whoever we need still there? */
            for (int i = 0; i < n; i++)
                if (ops[i].done < ops[i].bytes && !ops[i].send)
                    shm_check_peer(c, ops[i].peer, &h->slot[ops[i].peer].pub[c->rank][AREA_P2P],
                                   atomic_load(&me->con[ops[i].peer][AREA_P2P]) + 1);
            for (int q = 0; q < h->world; q++) {
                uint64_t v = atomic_load(&me->pub[q][AREA_P2P]);
                if (q == c->rank && atomic_load(&me->con[q][AREA_P2P]) < v && !c->impl->batching)
                    comm_die(c, "error: rank %d sent to itself outside comm_p2p_begin/end", c->rank);
                shm_check_peer(c, q, &h->slot[q].con[c->rank][AREA_P2P], v);
            }
        }
        shm_pause(c, idle, bell);
        idle += idle < INT_MAX;
    }
}

/* ---- NCCL ------------------------------------------------------------------------ */

#ifdef USE_NCCL
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

static ncclRedOp_t nccl_op(CommRed op) { return op == COMM_AVG ? ncclAvg : ncclSum; }

static size_t align256(size_t b) { return (b + 255) & ~(size_t)255; }

/* At least `bytes` of device scratch; only this rank's comm stream uses it. */
static char *nccl_scratch(Comm *c, size_t bytes) {
    CommImpl *im = c->impl;
    if (bytes > im->scratch_bytes) {
        CUDA_CHECK(c, cudaStreamSynchronize(im->stream));
        if (im->scratch) CUDA_CHECK(c, cudaFree(im->scratch));
        im->scratch_bytes = max_sz(bytes, (size_t)1 << 20);
        CUDA_CHECK(c, cudaMalloc((void **)&im->scratch, im->scratch_bytes));
    }
    return im->scratch;
}

/* The comm stream waits for what d's compute stream has queued so far. */
static void nccl_after_compute(Comm *c, Dev *d) {
    if (!on_gpu(d)) return;
    CUDA_CHECK(c, cudaEventRecord(c->impl->compute_done, (cudaStream_t)d->stream));
    CUDA_CHECK(c, cudaStreamWaitEvent(c->impl->stream, c->impl->compute_done, 0));
}

static void d2d(Comm *c, void *dst, const void *src, size_t bytes) {
    if (bytes) CUDA_CHECK(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->impl->stream));
}

static void *nccl_in(Comm *c, void *dev_dst, const void *host_src, size_t bytes) {
    if (bytes) CUDA_CHECK(c, cudaMemcpyAsync(dev_dst, host_src, bytes, cudaMemcpyHostToDevice, c->impl->stream));
    return dev_dst;
}

static void nccl_out(Comm *c, void *host_dst, const void *dev_src, size_t bytes) {
    if (bytes) CUDA_CHECK(c, cudaMemcpyAsync(host_dst, dev_src, bytes, cudaMemcpyDeviceToHost, c->impl->stream));
    CUDA_CHECK(c, cudaStreamSynchronize(c->impl->stream));
}

static void nccl_all_reduce(CommGroup *g, Dev *d, void *buf, size_t n, CommDtype t, CommRed op) {
    Comm *c = g->comm;
    size_t bytes = n * comm_dtype_size(t);
    nccl_after_compute(c, d);
    void *p = on_gpu(d) ? buf : nccl_in(c, nccl_scratch(c, bytes), buf, bytes);
    NCCL_CHECK(c, ncclAllReduce(p, p, n, nccl_type(t), nccl_op(op), (ncclComm_t)g->nccl, c->impl->stream));
    if (!on_gpu(d)) nccl_out(c, buf, p, bytes);
}

static void nccl_broadcast(CommGroup *g, Dev *d, void *buf, size_t n, CommDtype t, int root) {
    Comm *c = g->comm;
    size_t bytes = n * comm_dtype_size(t);
    nccl_after_compute(c, d);
    void *p = on_gpu(d) ? buf : nccl_in(c, nccl_scratch(c, bytes), buf, bytes);
    NCCL_CHECK(c, ncclBroadcast(p, p, n, nccl_type(t), root, (ncclComm_t)g->nccl, c->impl->stream));
    if (!on_gpu(d)) nccl_out(c, buf, p, bytes);
}

static void nccl_reduce(CommGroup *g, Dev *d, void *buf, size_t n, CommDtype t, CommRed op, int root) {
    Comm *c = g->comm;
    size_t bytes = n * comm_dtype_size(t);
    nccl_after_compute(c, d);
    void *p = on_gpu(d) ? buf : nccl_in(c, nccl_scratch(c, bytes), buf, bytes);
    NCCL_CHECK(c, ncclReduce(p, p, n, nccl_type(t), nccl_op(op), root, (ncclComm_t)g->nccl, c->impl->stream));
    if (!on_gpu(d)) nccl_out(c, buf, p, bytes);
}

/* Uneven lengths: shard j sits at j * maxc of a padded buffer; shards
 * 0..extra-1 are maxc long and already in place, the rest are maxc - 1 long
 * and move with one 2D copy (pitch maxc - 1 packed, maxc padded). */
static void nccl_reduce_scatter(CommGroup *g, Dev *d, void *out, const void *in, size_t n,
                                CommDtype t, CommRed op) {
    Comm *c = g->comm;
    cudaStream_t st = c->impl->stream;
    int G = g->size, host = !on_gpu(d);
    size_t es = comm_dtype_size(t), off, cnt, maxc = (n + G - 1) / G, extra = n % G;
    comm_shard(n, G, g->index, &off, &cnt);
    size_t a = host ? align256(n * es) : 0, p = extra ? align256(G * maxc * es) : 0;
    char *base = nccl_scratch(c, a + p + (host ? maxc * es : 0) + 1);
    nccl_after_compute(c, d);
    const char *src = host ? nccl_in(c, base, in, n * es) : in;
    char *dst = host ? base + a + p : out;
    if (!extra) {
        NCCL_CHECK(c, ncclReduceScatter(src, dst, maxc, nccl_type(t), nccl_op(op), (ncclComm_t)g->nccl, st));
    } else {
        char *pad = base + a, *mine = pad + g->index * maxc * es;
        d2d(c, pad, src, extra * maxc * es);
        if (maxc > 1)
            CUDA_CHECK(c, cudaMemcpy2DAsync(pad + extra * maxc * es, maxc * es, src + extra * maxc * es,
                                            (maxc - 1) * es, (maxc - 1) * es, G - extra,
                                            cudaMemcpyDeviceToDevice, st));
        NCCL_CHECK(c, ncclReduceScatter(pad, mine, maxc, nccl_type(t), nccl_op(op), (ncclComm_t)g->nccl, st));
        d2d(c, dst, mine, cnt * es);
    }
    if (host) nccl_out(c, out, dst, cnt * es);
}

static void nccl_all_gather(CommGroup *g, Dev *d, void *out, const void *in, size_t n, CommDtype t) {
    Comm *c = g->comm;
    cudaStream_t st = c->impl->stream;
    int G = g->size, host = !on_gpu(d);
    size_t es = comm_dtype_size(t), off, cnt, maxc = (n + G - 1) / G, extra = n % G;
    comm_shard(n, G, g->index, &off, &cnt);
    size_t a = host ? align256(maxc * es) : 0, p = extra ? align256(G * maxc * es) : 0;
    char *base = nccl_scratch(c, a + p + (host ? n * es : 0) + 1);
    nccl_after_compute(c, d);
    const char *src = host ? nccl_in(c, base, in, cnt * es) : in;
    char *dst = host ? base + a + p : out;
    if (!extra) {
        NCCL_CHECK(c, ncclAllGather(src, dst, maxc, nccl_type(t), (ncclComm_t)g->nccl, st));
    } else {
        char *pad = base + a, *mine = pad + g->index * maxc * es;
        d2d(c, mine, src, cnt * es);
        NCCL_CHECK(c, ncclAllGather(mine, pad, maxc, nccl_type(t), (ncclComm_t)g->nccl, st));
        d2d(c, dst, pad, extra * maxc * es);
        if (maxc > 1)
            CUDA_CHECK(c, cudaMemcpy2DAsync(dst + extra * maxc * es, (maxc - 1) * es, pad + extra * maxc * es,
                                            maxc * es, (maxc - 1) * es, G - extra,
                                            cudaMemcpyDeviceToDevice, st));
    }
    if (host) nccl_out(c, out, dst, n * es);
}

static void nccl_p2p(CommGroup *g, Dev *d, void *buf, size_t n, CommDtype t, int peer, int send) {
    Comm *c = g->comm;
    if (!on_gpu(d))
        comm_die(c, "error: rank %d: comm_%s on the NCCL backend needs a GPU buffer", c->rank,
                 send ? "send" : "recv");
    nccl_after_compute(c, d);
    if (send) NCCL_CHECK(c, ncclSend(buf, n, nccl_type(t), peer, (ncclComm_t)g->nccl, c->impl->stream));
    else NCCL_CHECK(c, ncclRecv(buf, n, nccl_type(t), peer, (ncclComm_t)g->nccl, c->impl->stream));
}

static void nccl_barrier(CommGroup *g) {
    Comm *c = g->comm;
    char *one = nccl_scratch(c, 4);
    NCCL_CHECK(c, ncclAllReduce(one, one, 1, ncclInt32, ncclSum, (ncclComm_t)g->nccl, c->impl->stream));
    CUDA_CHECK(c, cudaStreamSynchronize(c->impl->stream));
}

static int tcp_bcast(const CommLaunch *l, void *blob, size_t len, char *err, size_t errlen);

static int nccl_init(Comm *c, const CommLaunch *l, Dev *gpu, char *err, size_t errlen) {
    CommImpl *im = c->impl;
    if (!on_gpu(gpu)) {
        snprintf(err, errlen, "the NCCL backend needs a CUDA device (--device cuda)");
        return -1;
    }
    CUDA_CHECK(c, cudaSetDevice(gpu->gpu));
    CUDA_CHECK(c, cudaStreamCreateWithFlags(&im->stream, cudaStreamNonBlocking));
    CUDA_CHECK(c, cudaEventCreateWithFlags(&im->compute_done, cudaEventDisableTiming));
    CUDA_CHECK(c, cudaEventCreateWithFlags(&im->comm_done, cudaEventDisableTiming));
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (c->rank == 0) NCCL_CHECK(c, ncclGetUniqueId(&id));
    if (c->world_size > 1 && im->shm) {           /* forked: through the inherited segment */
        ShmHeader *h = im->shm;
        if (c->rank == 0) {
            memcpy(h->nccl_id, &id, sizeof id);
            atomic_store(&h->nccl_id_ready, 1);
            shm_ring_all(h);
        } else {
            shm_wait_geq(c, &h->nccl_id_ready, 1, 0);
            memcpy(&id, h->nccl_id, sizeof id);
        }
    } else if (c->world_size > 1) {               /* external launcher: over TCP */
        if (tcp_bcast(l, &id, sizeof id, err, errlen)) return -1;
    }
    ncclComm_t w;
    NCCL_CHECK(c, ncclCommInitRank(&w, c->world_size, id, c->rank));
    c->world.nccl = w;
    return 0;
}

static void nccl_free(Comm *c) {
    CommImpl *im = c->impl;
    if (c->world.nccl) ncclCommDestroy((ncclComm_t)c->world.nccl);
    c->world.nccl = NULL;
    if (im->scratch) cudaFree(im->scratch);
    if (im->compute_done) cudaEventDestroy(im->compute_done);
    if (im->comm_done) cudaEventDestroy(im->comm_done);
    if (im->stream) cudaStreamDestroy(im->stream);
}
#endif /* USE_NCCL */

/* ---- TCP rendezvous: rank 0 hands a blob to every other rank -------------------- */

static int io_full(int fd, void *p, size_t n, int writing, double deadline) {
    char *b = p;
    while (n) {
        struct pollfd pf = { fd, writing ? POLLOUT : POLLIN, 0 };
        int ms = (int)((deadline - now_s()) * 1000);
        if (ms <= 0) { errno = ETIMEDOUT; return -1; }
        if (poll(&pf, 1, ms) <= 0) continue;
        ssize_t k = writing ? send(fd, b, n, MSG_NOSIGNAL) : recv(fd, b, n, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) { if (k == 0) errno = ECONNRESET; return -1; }
        b += k;
        n -= (size_t)k;
    }
    return 0;
}

static int tcp_serve(const CommLaunch *l, void *blob, size_t len, char *err, size_t errlen) {
    int port = l->rendezvous_port, fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_ANY) };
    if (fd < 0) { snprintf(err, errlen, "socket: %s", strerror(errno)); return -1; }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 128) != 0) {
        snprintf(err, errlen, "rank 0 cannot listen on port %d (MASTER_PORT%s): %s", port,
                 port != l->master_port ? " + 1" : "", strerror(errno));
        close(fd);
        return -1;
    }
    char *served = calloc((size_t)l->world_size, 1);
    int nserved = 0, nwant = l->world_size - 1;
    double deadline = now_s() + RENDEZVOUS_S;
    while (nserved < nwant) {
        struct pollfd pf = { fd, POLLIN, 0 };
        if (now_s() > deadline) {
            snprintf(err, errlen, "only %d of the other %d ranks reached rank 0 on port %d within %d s",
                     nserved, nwant, port, RENDEZVOUS_S);
            close(fd);
            free(served);
            return -1;
        }
        if (poll(&pf, 1, 1000) <= 0) continue;
        int s = accept4(fd, NULL, NULL, SOCK_CLOEXEC);
        if (s < 0) continue;
        int32_t r = -1;
        double t = now_s() + 10;
        if (io_full(s, &r, sizeof r, 0, t) == 0 && r > 0 && r < l->world_size &&
            io_full(s, blob, len, 1, t) == 0 && !served[r]) {
            served[r] = 1;
            nserved++;
        }
        close(s);
    }
    close(fd);
    free(served);
    return 0;
}

static int tcp_fetch(const CommLaunch *l, void *blob, size_t len, char *err, size_t errlen) {
    char port[16], why[128] = "no answer";
    snprintf(port, sizeof port, "%d", l->rendezvous_port);
    struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *ai = NULL;
    double deadline = now_s() + RENDEZVOUS_S;
    for (;;) {
        int rc = getaddrinfo(l->master_addr, port, &hints, &ai);
        if (rc != 0) {
            snprintf(why, sizeof why, "%s", gai_strerror(rc));
        } else {
            int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
            int32_t r = l->rank;
            if (s >= 0 && connect(s, ai->ai_addr, ai->ai_addrlen) == 0 &&
                io_full(s, &r, sizeof r, 1, now_s() + 10) == 0 &&
                io_full(s, blob, len, 0, now_s() + 30) == 0) {
                close(s);
                freeaddrinfo(ai);
                return 0;
            }
            snprintf(why, sizeof why, "%s", strerror(errno));
            if (s >= 0) close(s);
            freeaddrinfo(ai);
        }
        if (now_s() > deadline) {
            snprintf(err, errlen, "rank %d cannot reach rank 0 at %s:%d (MASTER_ADDR:MASTER_PORT%s) within %d s: %s",
                     l->rank, l->master_addr, l->rendezvous_port,
                     l->rendezvous_port != l->master_port ? " + 1" : "", RENDEZVOUS_S, why);
            return -1;
        }
        nanosleep(&(struct timespec){ 0, 200000000L }, NULL);
    }
}

static int tcp_bcast(const CommLaunch *l, void *blob, size_t len, char *err, size_t errlen) {
    if (l->rendezvous_port <= 0) {
        snprintf(err, errlen, "%s started %d ranks but MASTER_PORT is not set: rank 0 needs a port "
                 "to hand out the rendezvous (export MASTER_ADDR and MASTER_PORT)", l->source, l->world_size);
        return -1;
    }
    if (l->rank != 0 && !l->master_addr[0]) {
        snprintf(err, errlen, "%s started %d ranks but MASTER_ADDR is not set: the other ranks need "
                 "rank 0's host (export MASTER_ADDR and MASTER_PORT)", l->source, l->world_size);
        return -1;
    }
    return l->rank == 0 ? tcp_serve(l, blob, len, err, errlen) : tcp_fetch(l, blob, len, err, errlen);
}

/* ---- launching ---------------------------------------------------------------------- */

typedef struct EnvNames { const char *source, *rank, *size, *local_rank, *local_size; } EnvNames;

static const EnvNames env_launchers[] = {
    { "torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE" },
    { "slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE" },
    { "openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
      "OMPI_COMM_WORLD_LOCAL_SIZE" },
};

/* 0 unset, 1 set (in *v), -1 not a whole number (err says so). */
static int env_int(const char *name, int *v, char *err, size_t errlen) {
    const char *s = getenv(name);
    if (!s || !*s) return 0;
    char *end;
    errno = 0;
    long x = strtol(s, &end, 10);
    if (*end || errno || x < INT_MIN || x > INT_MAX) {
        snprintf(err, errlen, "%s=%s is not a whole number", name, s);
        return -1;
    }
    *v = (int)x;
    return 1;
}

int comm_launch_plan(int ranks, CommLaunch *l, char *err, size_t errlen) {
    memset(l, 0, sizeof *l);
    l->kind = COMM_LAUNCH_SINGLE;
    l->world_size = l->local_size = 1;
    l->source = "single";
    if (ranks < 0 || ranks > COMM_MAX_RANKS) {
        snprintf(err, errlen, "--ranks %d: must be 1 to %d", ranks, COMM_MAX_RANKS);
        return -1;
    }
    for (size_t i = 0; i < sizeof env_launchers / sizeof env_launchers[0]; i++) {
        const EnvNames *e = &env_launchers[i];
        int rank = 0, size = 0, local = 0, rc;
        if (!getenv(e->rank) || !getenv(e->size)) continue;
        if (env_int(e->rank, &rank, err, errlen) < 0 || env_int(e->size, &size, err, errlen) < 0 ||
            (rc = env_int(e->local_rank, &local, err, errlen)) < 0)
            return -1;
        if (size < 1 || rank < 0 || rank >= size || local < 0) {
            snprintf(err, errlen, "%s=%d %s=%d %s=%d is not a rank of the world", e->rank, rank, e->size,
                     size, e->local_rank, local);
            return -1;
        }
        if (size > 1 && ranks > 1 && ranks != size) {
            snprintf(err, errlen, "--ranks %d cannot be used inside a launcher that started %d ranks (%s=%d)",
                     ranks, size, e->size, size);
            return -1;
        }
        if (size > 1) {
            const char *ls = getenv(e->local_size);
            l->kind = COMM_LAUNCH_ENV;
            l->source = e->source;
            l->rank = rank;
            l->world_size = size;
            l->local_rank = rc ? local : 0;
            l->local_size = ls ? atoi(ls) : 0;   /* "8(x2)" from slurm reads as 8 */
        }
        break;
    }
    if (l->kind == COMM_LAUNCH_SINGLE && ranks > 1) {
        l->kind = COMM_LAUNCH_FORK;
        l->source = "--ranks";
        l->world_size = l->local_size = ranks;
    }
    const char *addr = getenv("MASTER_ADDR"), *agent = getenv("TORCHELASTIC_USE_AGENT_STORE");
    if (addr) snprintf(l->master_addr, sizeof l->master_addr, "%s", addr);
    int port = 0;
    if (env_int("MASTER_PORT", &port, err, errlen) < 0) return -1;
    if (port < 0 || port > 65534) {
        snprintf(err, errlen, "MASTER_PORT=%d is not a port", port);
        return -1;
    }
    l->master_port = port;
    l->rendezvous_port = port && agent && !strcmp(agent, "True") ? port + 1 : port;
    return 0;
}

/* Supervisor: one rank's output pipe (stdout or stderr), relayed by lines. */
typedef struct Relay {
    int fd, rank, out;           /* read end (-1 once closed), whose, where to (1 or 2) */
    size_t len;
    char buf[8192];
} Relay;

typedef struct Supervisor {
    int world, nalive, nrelay, sfd;
    pid_t *pid;
    int *alive;
    Relay *relay;
    ShmHeader *h;
    int first_fail, fail_code, interrupted_by;
    double kill_at;              /* > 0: SIGKILL whoever is left at this time */
} Supervisor;

static void write_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        p += w;
        n -= (size_t)w;
    }
}

/* Writes "[rank r] line" in one write, so lines of different ranks never mix. */
static void relay_emit(Relay *r, const char *line, size_t n) {
    char out[sizeof r->buf + 32];
    int k = snprintf(out, 32, "[rank %d] ", r->rank);
    memcpy(out + k, line, n);
    if (n == 0 || line[n - 1] != '\n') out[k + n++] = '\n';
    write_all(r->out, out, (size_t)k + n);
}

/* Reads what is there; returns 1 if it read anything. */
static int relay_pump(Relay *r) {
    ssize_t got = read(r->fd, r->buf + r->len, sizeof r->buf - r->len);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) return 0;
    if (got <= 0) {
        if (r->len) relay_emit(r, r->buf, r->len);
        r->len = 0;
        close(r->fd);
        r->fd = -1;
        return 0;
    }
    r->len += (size_t)got;
    char *start = r->buf, *end = r->buf + r->len, *nl;
    while ((nl = memchr(start, '\n', (size_t)(end - start)))) {
        relay_emit(r, start, (size_t)(nl + 1 - start));
        start = nl + 1;
    }
    r->len = (size_t)(end - start);
    memmove(r->buf, start, r->len);
    if (r->len == sizeof r->buf) { relay_emit(r, r->buf, r->len); r->len = 0; }
    return 1;
}

static void sup_kill_all(Supervisor *s, int sig) {
    for (int r = 0; r < s->world; r++)
        if (s->alive[r]) kill(s->pid[r], sig);
}

static void sup_reap(Supervisor *s) {
    int st;
    pid_t p;
    while ((p = waitpid(-1, &st, WNOHANG)) > 0) {
        int r = 0;
        while (r < s->world && s->pid[r] != p) r++;
        if (r == s->world || !s->alive[r]) continue;
        for (int i = 0; i < s->nrelay; i++)   /* its last words before the verdict */
            while (s->relay[i].rank == r && s->relay[i].fd >= 0 && relay_pump(&s->relay[i])) {}
        int code = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
        s->alive[r] = 0;
        s->nalive--;
        atomic_store(&s->h->slot[r].exit_code, code);
        atomic_store(&s->h->slot[r].exited, 1);
        if (code != 0 && s->first_fail < 0) {
            s->first_fail = r;
            s->fail_code = code;
            if (!s->interrupted_by) {
                char how[64];
                describe_status(code, how, sizeof how);
                shm_abort_set(s->h, r, code);
                fprintf(stderr, "error: rank %d died (%s); stopping the other ranks\n", r, how);
                s->kill_at = now_s() + GRACE_S;
            }
        }
        shm_ring_all(s->h);
    }
}

static void sup_interrupt(Supervisor *s, int sig) {
    if (s->interrupted_by) { sup_kill_all(s, SIGKILL); return; }   /* a second Ctrl-C */
    s->interrupted_by = sig;
    shm_abort_set(s->h, -1, -sig);
    fprintf(stderr, "error: interrupted by signal %d; stopping all ranks\n", sig);
    sup_kill_all(s, SIGTERM);
    s->kill_at = now_s() + GRACE_S;
}

/* Runs until every rank has been reaped; returns the job's exit status. */
static int supervise(Supervisor *s) {
    struct pollfd pf[1 + 2 * COMM_MAX_RANKS];
    int which[1 + 2 * COMM_MAX_RANKS];
    while (s->nalive > 0) {
        int np = 0;
        pf[np++] = (struct pollfd){ s->sfd, POLLIN, 0 };
        for (int i = 0; i < s->nrelay; i++)
            if (s->relay[i].fd >= 0) { which[np] = i; pf[np++] = (struct pollfd){ s->relay[i].fd, POLLIN, 0 }; }
        int ms = -1;
        if (s->kill_at > 0) {
            double left = s->kill_at - now_s();
            ms = left <= 0 ? 0 : (int)(left * 1000) + 1;
        }
        poll(pf, (nfds_t)np, ms);
        if (pf[0].revents & POLLIN) {
            struct signalfd_siginfo si[16];
            ssize_t got = read(s->sfd, si, sizeof si);
            for (ssize_t i = 0; got > 0 && i < got / (ssize_t)sizeof si[0]; i++)
                if (si[i].ssi_signo != SIGCHLD) sup_interrupt(s, (int)si[i].ssi_signo);
        }
        sup_reap(s);
        for (int i = 1; i < np; i++)
            if (pf[i].revents && s->relay[which[i]].fd >= 0) relay_pump(&s->relay[which[i]]);
        if (s->kill_at > 0 && now_s() >= s->kill_at) {
            sup_kill_all(s, SIGKILL);
            s->kill_at = 0;
        }
    }
    for (int i = 0; i < s->nrelay; i++) {   /* what the ranks wrote last */
        Relay *r = &s->relay[i];
        while (r->fd >= 0 && relay_pump(r)) {}
        if (r->fd >= 0) { if (r->len) relay_emit(r, r->buf, r->len); close(r->fd); r->fd = -1; }
    }
    if (s->interrupted_by) return 128 + s->interrupted_by;
    if (s->first_fail >= 0) return s->fail_code > 0 ? s->fail_code : 128 - s->fail_code;
    return 0;
}

/* In a freshly forked rank: die with the supervisor, restore signals, wire output. */
static void rank_setup(Supervisor *s, int r, pid_t sup, const sigset_t *old, int out[2], int errp[2]) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != sup) _exit(1);
    sigprocmask(SIG_SETMASK, old, NULL);
    for (int i = 0; i < s->nrelay; i++) close(s->relay[i].fd);
    if (r > 0) {
        dup2(out[1], 1);
        dup2(errp[1], 2);
        close(out[0]); close(out[1]); close(errp[0]); close(errp[1]);
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    atomic_store(&s->h->slot[r].pid, (int32_t)getpid());
    free(s->pid);
    free(s->alive);
    free(s->relay);
}

int comm_launch_start(CommLaunch *l, char *err, size_t errlen) {
    if (l->kind != COMM_LAUNCH_FORK) return 0;
    int W = l->world_size;
    size_t bytes = shm_segment_bytes(W);
    /* Anonymous shared memory: the ranks inherit it, and no name exists that
     * could outlive the job, whatever kills it. */
    void *seg = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (seg == MAP_FAILED) {
        snprintf(err, errlen, "cannot map %zu bytes of shared memory for %d ranks: %s", bytes, W, strerror(errno));
        return -1;
    }
    shm_header_init(seg, W);
    l->shared = seg;
    l->shared_bytes = bytes;

    Supervisor s = { .world = W, .first_fail = -1, .h = seg };
    s.pid = calloc((size_t)W, sizeof *s.pid);
    s.alive = calloc((size_t)W, sizeof *s.alive);
    s.relay = calloc((size_t)(2 * W), sizeof *s.relay);
    if (!s.pid || !s.alive || !s.relay) {
        snprintf(err, errlen, "out of memory starting %d ranks", W);
        return -1;
    }
    /* Signals reach the supervisor through a signalfd: blocked here (the
     * ranks restore the old mask), not ignored (a shell may have ignored
     * SIGINT for a background job). */
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGCHLD);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGHUP);
    sigprocmask(SIG_BLOCK, &block, &old);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGCHLD, SIG_DFL);
    fflush(NULL);
    pid_t sup = getpid();
    for (int r = 0; r < W; r++) {
        int out[2] = { -1, -1 }, errp[2] = { -1, -1 };
        pid_t pid = -1;
        if (r == 0 || (pipe(out) == 0 && pipe(errp) == 0)) pid = fork();
        if (pid == 0) {
            rank_setup(&s, r, sup, &old, out, errp);
            l->rank = l->local_rank = r;
            return 0;
        }
        if (pid < 0) {
            snprintf(err, errlen, "cannot start rank %d of %d: %s", r, W, strerror(errno));
            sup_kill_all(&s, SIGKILL);
            while (wait(NULL) > 0) {}
            sigprocmask(SIG_SETMASK, &old, NULL);
            munmap(seg, bytes);
            return -1;
        }
        s.pid[r] = pid;
        s.alive[r] = 1;
        s.nalive++;
        atomic_store(&s.h->slot[r].pid, (int32_t)pid);
        if (r > 0) {
            close(out[1]);
            close(errp[1]);
            fcntl(out[0], F_SETFL, O_NONBLOCK);
            fcntl(errp[0], F_SETFL, O_NONBLOCK);
            s.relay[s.nrelay++] = (Relay){ .fd = out[0], .rank = r, .out = 1 };
            s.relay[s.nrelay++] = (Relay){ .fd = errp[0], .rank = r, .out = 2 };
        }
    }
    s.sfd = signalfd(-1, &block, SFD_CLOEXEC);
    signal(SIGPIPE, SIG_IGN);
    exit(supervise(&s));
}

int comm_launch(int ranks, CommLaunch *l, char *err, size_t errlen) {
    if (comm_launch_plan(ranks, l, err, errlen)) return -1;
    return comm_launch_start(l, err, errlen);
}

CommBackend comm_default_backend(const CommLaunch *l, DevKind dev, int gpus) {
#ifdef USE_NCCL
    int local = l->local_size > 0 ? l->local_size : 1;
    if (dev == DEV_CUDA && gpus > 0 && local <= gpus) return COMM_NCCL;
#else
    (void)l; (void)dev; (void)gpus;
#endif
    return COMM_SHM;
}

/* ---- communicators -------------------------------------------------------------------- */

/* External launcher on one host: rank 0 makes a named segment and hands its
 * name out over TCP; the last rank to map it unlinks it. */
static int shm_join(Comm *c, const CommLaunch *l, char *err, size_t errlen) {
    CommImpl *im = c->impl;
    CommLaunch la = *l;
    int W = c->world_size;
    size_t bytes = shm_segment_bytes(W);
    char name[64] = "";
    if (!la.master_addr[0]) snprintf(la.master_addr, sizeof la.master_addr, "127.0.0.1");
    if (c->rank == 0) {
        snprintf(name, sizeof name, "/train-%d-%d", (int)getpid(), l->master_port);
        int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
        if (fd < 0) {
            snprintf(err, errlen, "cannot create shared memory %s: %s", name, strerror(errno));
            return -1;
        }
        snprintf(im->shm_name, sizeof im->shm_name, "%s", name);
        void *p = ftruncate(fd, (off_t)bytes) == 0
                      ? mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
        close(fd);
        if (p == MAP_FAILED) {
            snprintf(err, errlen, "cannot map %zu bytes of shared memory %s: %s", bytes, name, strerror(errno));
            shm_unlink(name);
            return -1;
        }
        shm_header_init(p, W);
        im->shm = p;
    }
    if (tcp_bcast(&la, name, sizeof name, err, errlen)) {
        if (c->rank == 0) shm_unlink(name);
        return -1;
    }
    if (c->rank != 0) {
        struct stat st;
        int fd = shm_open(name, O_RDWR, 0);
        if (fd < 0) {
            snprintf(err, errlen, "cannot open shared memory %s made by rank 0: %s (the shared-memory "
                     "backend needs every rank on one host)", name, strerror(errno));
            return -1;
        }
        void *p = fstat(fd, &st) == 0 && (size_t)st.st_size == bytes
                      ? mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
        close(fd);
        if (p == MAP_FAILED || ((ShmHeader *)p)->magic != SHM_MAGIC || ((ShmHeader *)p)->world != W) {
            snprintf(err, errlen, "shared memory %s is not the segment of a %d-rank job", name, W);
            if (p != MAP_FAILED) munmap(p, bytes);
            return -1;
        }
        im->shm = p;
    }
    im->shm_bytes = bytes;
    im->check_pids = 1;
    atomic_store(&im->shm->slot[c->rank].pid, (int32_t)getpid());
    if (atomic_fetch_add(&im->shm->mapped, 1) + 1 == W) shm_unlink(name);
    shm_barrier(&c->world);          /* everyone mapped: the name is gone */
    im->shm_name[0] = 0;
    return 0;
}

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
    if (l->kind == COMM_LAUNCH_FORK) {
        im->shm = l->shared;
        im->shm_bytes = l->shared_bytes;
    } else if (backend == COMM_SHM && c->world_size == 1) {
        /* one rank still gets areas, so sends to itself work like any other */
        im->shm_bytes = shm_segment_bytes(1);
        im->shm = mmap(NULL, im->shm_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (im->shm == MAP_FAILED) {
            im->shm = NULL;
            snprintf(err, errlen, "cannot map %zu bytes: %s", im->shm_bytes, strerror(errno));
            goto fail;
        }
        shm_header_init(im->shm, 1);
    }
    if (backend == COMM_SHM && c->world_size > COMM_MAX_RANKS) {
        snprintf(err, errlen, "the shared-memory backend takes at most %d ranks, not %d", COMM_MAX_RANKS,
                 c->world_size);
        goto fail;
    }
    if (backend == COMM_NCCL) {
#ifdef USE_NCCL
        if (nccl_init(c, l, gpu, err, errlen)) goto fail;
#else
        (void)gpu;
        snprintf(err, errlen, "the NCCL backend is not built in (nccl.h was not found at build time)");
        goto fail;
#endif
    } else if (l->kind == COMM_LAUNCH_ENV) {
        if (shm_join(c, l, err, errlen)) goto fail;
    }
    return 0;
fail:
    comm_free(c);
    return -1;
}

void comm_free(Comm *c) {
    CommImpl *im = c->impl;
    if (im) {
#ifdef USE_NCCL
        if (c->backend == COMM_NCCL) nccl_free(c);
#endif
        if (im->shm) {
            ShmSlot *me = &im->shm->slot[c->rank];
            if (!atomic_load(&me->exited)) {   /* tell peers still waiting that I am gone */
                atomic_store(&me->exit_code, 0);
                atomic_store(&me->exited, 1);
                shm_ring_all(im->shm);
            }
            if (im->shm_name[0]) shm_unlink(im->shm_name);
            munmap(im->shm, im->shm_bytes);
        }
        free(im);
    }
    free(c->world.ranks);
    memset(c, 0, sizeof *c);
}

static void op_all_gather(CommGroup *g, Dev *d, void *out, const void *in, size_t n, CommDtype t);

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
    if (c->backend == COMM_NCCL) {
        ncclComm_t nc = NULL;
        NCCL_CHECK(c, ncclCommSplit((ncclComm_t)c->world.nccl, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key,
                                    &nc, NULL));
        g->nccl = nc;
    }
#endif
}

void comm_group_free(CommGroup *g) {
#ifdef USE_NCCL
    if (g->nccl) ncclCommDestroy((ncclComm_t)g->nccl);
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

int comm_mesh_rank(const CommMesh *m, int dp_rank, int tp_rank, int pp_rank) {
    return tp_rank + m->tp * (dp_rank + m->dp * pp_rank);
}

int comm_mesh_build(Comm *c, int dp, int tp, int pp, CommMesh *m, char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    if (comm_mesh_shape(c->world_size, &dp, &tp, &pp, err, errlen)) return -1;
    int r = c->rank;
    m->dp = dp; m->tp = tp; m->pp = pp;
    m->tp_rank = r % tp;
    m->dp_rank = r / tp % dp;
    m->pp_rank = r / (tp * dp);
    int end_stage = m->pp_rank == 0 || m->pp_rank == pp - 1;
    /* colors: the coordinates a group's members share, folded into one number */
    comm_split(c, m->dp_rank + dp * m->pp_rank, m->tp_rank, "tp", &m->tp_group);
    comm_split(c, m->tp_rank + tp * m->pp_rank, m->dp_rank, "dp", &m->dp_group);
    comm_split(c, m->tp_rank + tp * m->dp_rank, m->pp_rank, "pp", &m->pp_group);
    comm_split(c, end_stage ? m->tp_rank + tp * m->dp_rank : COMM_NO_COLOR, m->pp_rank, "embed", &m->embed_group);
    return 0;
}

void comm_mesh_free(CommMesh *m) {
    comm_group_free(&m->tp_group);
    comm_group_free(&m->dp_group);
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
    if (member < 0 || member >= g->size)
        comm_die(c, "error: rank %d: %s on group %s: member %d is outside its %d ranks", c->rank, op,
                 g->name, member, g->size);
}

static void op_all_gather(CommGroup *g, Dev *d, void *out, const void *in, size_t n, CommDtype t) {
#ifdef USE_NCCL
    if (g->comm->backend == COMM_NCCL) { if (n) nccl_all_gather(g, d, out, in, n, t); return; }
#endif
    if (n && g->size == 1) {
        if (on_gpu(d)) dev_copy(d, out, in, n * comm_dtype_size(t));
        else memmove(out, in, n * comm_dtype_size(t));
    } else if (n) {
        shm_all_gather(g, d, out, in, n, t);
    }
}

#ifdef USE_NCCL
#define NCCL_ROUTE(call) do { if (g->comm->backend == COMM_NCCL) { if (n) call; return; } } while (0)
#else
#define NCCL_ROUTE(call) do { } while (0)
#endif

void comm_all_reduce(CommGroup *g, Dev *d, void *buf, size_t n, CommDtype t, CommRed op) {
    if (g->index < 0) return;
    check_args(g, "comm_all_reduce", t, op, 0);
    count(g, COMM_ALL_REDUCE, n, t);
    NCCL_ROUTE(nccl_all_reduce(g, d, buf, n, t, op));
    if (n && g->size > 1) shm_all_reduce(g, d, buf, n, t, op);
}

void comm_reduce_scatter(CommGroup *g, Dev *d, void *out, const void *in, size_t n, CommDtype t, CommRed op) {
    if (g->index < 0) return;
    check_args(g, "comm_reduce_scatter", t, op, 0);
    count(g, COMM_REDUCE_SCATTER, n, t);
    NCCL_ROUTE(nccl_reduce_scatter(g, d, out, in, n, t, op));
    if (n && g->size == 1) {
        if (on_gpu(d)) dev_copy(d, out, in, n * comm_dtype_size(t));
        else memmove(out, in, n * comm_dtype_size(t));
    } else if (n) {
        shm_reduce_scatter(g, d, out, in, n, t, op);
    }
}

void comm_all_gather(CommGroup *g, Dev *d, void *out, const void *in, size_t n, CommDtype t) {
    if (g->index < 0) return;
    check_args(g, "comm_all_gather", t, COMM_SUM, 0);
    count(g, COMM_ALL_GATHER, n, t);
    op_all_gather(g, d, out, in, n, t);
}

void comm_broadcast(CommGroup *g, Dev *d, void *buf, size_t n, CommDtype t, int root) {
    if (g->index < 0) return;
    check_args(g, "comm_broadcast", t, COMM_SUM, root);
    count(g, COMM_BROADCAST, n, t);
    NCCL_ROUTE(nccl_broadcast(g, d, buf, n, t, root));
    if (n && g->size > 1) shm_broadcast(g, d, buf, n, t, root);
}

void comm_reduce(CommGroup *g, Dev *d, void *buf, size_t n, CommDtype t, CommRed op, int root) {
    if (g->index < 0) return;
    check_args(g, "comm_reduce", t, op, root);
    count(g, COMM_REDUCE, n, t);
    NCCL_ROUTE(nccl_reduce(g, d, buf, n, t, op, root));
    if (n && g->size > 1) shm_reduce(g, d, buf, n, t, op, root);
}

static void p2p(CommGroup *g, Dev *d, void *buf, size_t n, CommDtype t, int peer, int send) {
    Comm *c = g->comm;
    if (g->index < 0) return;
    check_args(g, send ? "comm_send" : "comm_recv", t, COMM_SUM, peer);
    count(g, send ? COMM_SEND : COMM_RECV, n, t);
    NCCL_ROUTE(nccl_p2p(g, d, buf, n, t, peer, send));
    CommImpl *im = c->impl;
    P2POp op = { send, g->ranks[peer], d, buf, n * comm_dtype_size(t), 0 };
    if (!im->batching) { shm_p2p_run(c, &op, 1); return; }
    if (im->nbatch == COMM_MAX_BATCH)
        comm_die(c, "error: rank %d: more than %d sends and receives in one comm_p2p_begin/end", c->rank,
                 COMM_MAX_BATCH);
    im->batch[im->nbatch++] = op;
}

void comm_send(CommGroup *g, Dev *d, const void *buf, size_t n, CommDtype t, int peer) {
    p2p(g, d, (void *)buf, n, t, peer, 1);
}

void comm_recv(CommGroup *g, Dev *d, void *buf, size_t n, CommDtype t, int peer) {
    p2p(g, d, buf, n, t, peer, 0);
}

void comm_p2p_begin(Comm *c) {
    if (c->impl->batching++) return;
#ifdef USE_NCCL
    if (c->backend == COMM_NCCL) NCCL_CHECK(c, ncclGroupStart());
#endif
}

void comm_p2p_end(Comm *c) {
    CommImpl *im = c->impl;
    if (im->batching <= 0) comm_die(c, "error: rank %d: comm_p2p_end without comm_p2p_begin", c->rank);
    if (--im->batching) return;
#ifdef USE_NCCL
    if (c->backend == COMM_NCCL) { NCCL_CHECK(c, ncclGroupEnd()); return; }
#endif
    im->batching = 1;            /* sends to itself are legal while the batch runs */
    shm_p2p_run(c, im->batch, im->nbatch);
    im->batching = 0;
    im->nbatch = 0;
}

void comm_sendrecv(CommGroup *g, Dev *d, const void *sendbuf, int dst, void *recvbuf, int src,
                   size_t n, CommDtype t) {
    comm_p2p_begin(g->comm);
    comm_send(g, d, sendbuf, n, t, dst);
    comm_recv(g, d, recvbuf, n, t, src);
    comm_p2p_end(g->comm);
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
    if (c->backend == COMM_NCCL && on_gpu(d)) {
        CUDA_CHECK(c, cudaEventRecord(c->impl->comm_done, c->impl->stream));
        CUDA_CHECK(c, cudaStreamWaitEvent((cudaStream_t)d->stream, c->impl->comm_done, 0));
    }
#else
    (void)c; (void)d;
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
