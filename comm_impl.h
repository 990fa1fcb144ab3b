/* comm_impl.h: what the parts of comm.h's implementation share; included
 * by comm.c, comm_launch.c, comm_shm.c and comm_nccl.c only, never elsewhere.
 * (DESIGN.md, "Processes" and "Errors": the floor under every parallel
 * dimension of hybrid-parallelism.txt.)
 *
 *   comm.c         communicators, groups, the mesh; every operation's checks,
 *                  byte accounting and dispatch to a backend
 *   comm_launch.c  who this process is (launcher variables, the job token),
 *                  the fork launcher and its supervisor
 *   comm_shm.c     the shared segment's areas, its collectives and p2p engine
 *   comm_nccl.c    the NCCL backend (built with USE_NCCL)
 *   rendezvous.c   rank 0 hands the segment's name or the NCCL id to the
 *                  ranks that prove the job token (not a comm file: it knows
 *                  nothing of Comm, and calls only the C library)
 *
 * Calls go down only, and never sideways between the backends:
 *
 *   comm.c -> comm_shm.c  -> rendezvous.c
 *          -> comm_nccl.c -> rendezvous.c
 *   comm_launch.c         -> rendezvous.c (the token)
 *
 * What several of them need, the segment's header, the abort word, the way
 * a rank dies (comm_die) and the rendezvous' settings from a CommLaunch,
 * lives here as inline code, below them all, so that no part calls back up
 * into the one that called it nor across to its sibling.
 *
 * Backend entry points are called by comm.c after its checks: this rank is
 * a member of g, n > 0, and for shm_ collectives g->size > 1. Faults inside
 * them exit through comm_die, like everything else in comm.h.
 */
#ifndef COMM_IMPL_H
#define COMM_IMPL_H

#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include "comm.h"
#include "rendezvous.h"

/* ---- small things every part uses ----------------------------------------- */

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static inline size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }
static inline size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }
static inline int on_gpu(const Dev *d) { return d && d->kind == DEV_CUDA; }

/* ---- the shared segment's layout ---------------------------------------------- */

#define NCCL_MAX_QUEUES 16    /* NCCL groups of one rank: the world and its splits */

enum { AREA_IN, AREA_OUT, AREA_P2P, AREA_BARRIER, AREAS };

/* One rank's counters. pub is written only by its owner, con only by its
 * owner; the other side reads them. */
typedef struct ShmSlot {
    _Alignas(64) _Atomic uint32_t bell;   /* futex word: bumped when a counter this rank waits on moves */
    _Atomic uint32_t sleeping;            /* 1 while the owner sleeps on bell */
    _Atomic int32_t pid;
    _Atomic int32_t exited;               /* 1 once the rank has left (exit_code says how) */
    _Atomic int32_t exit_code;            /* exit status, or -signal */
    _Atomic int32_t nccl_init;            /* NCCL: 1 inside ncclCommInitRank, 2 once it returned */
    _Atomic uint64_t pub[COMM_MAX_RANKS][AREAS];  /* times the owner filled area a for rank q */
    _Atomic uint64_t con[COMM_MAX_RANKS][AREAS];  /* times the owner finished reading rank q's area a */
    _Atomic uint64_t nccl_issued[NCCL_MAX_QUEUES]; /* NCCL: operations the owner queued on each group
                                                     (by creation order), for peers' watchdogs */
} ShmSlot;

typedef struct ShmHeader {
    uint64_t magic;
    int32_t world;
    uint64_t area_bytes;                  /* one staging area */
    uint64_t data_offset;                 /* where the areas start: [rank][area][area_bytes] */
    _Atomic int64_t abort_word;           /* 0, or ((rank + 2) << 32 | (uint32_t)code) of the first failure */
    _Atomic int32_t mapped;               /* external launcher: ranks that mapped the segment */
    _Atomic int32_t served;               /* external launcher: 1 once rank 0 served every rank */
    _Atomic uint64_t nccl_id_ready;       /* fork + NCCL: 1 once rank 0 wrote nccl_id */
    unsigned char nccl_id[128];
    ShmSlot slot[];                       /* [world] */
} ShmHeader;

/* ---- the communicator's private state --------------------------------------- */

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
    struct NcclState *nccl;      /* comm_nccl.c's streams, events and scratch; NULL on shared memory */
};

/* ---- the segment's header and the abort word ----------------------------------- */

#define DATA_AREAS 3             /* IN, OUT, P2P; the barrier "area" is counters only */
#define SHM_MAGIC 0x636f6d6d2d747261ULL

/* How a rank ended: an exit status >= 0, -signal, or CODE_GONE (its process
 * vanished and nobody saw how: an external launcher, no supervisor). */
#define CODE_GONE (-1000)

/* "exit status 3", "killed by signal 9", or "its process is gone". */
static inline void shm_describe_status(int code, char *buf, size_t len) {
    if (code == CODE_GONE) snprintf(buf, len, "its process is gone");
    else if (code < 0) snprintf(buf, len, "killed by signal %d", -code);
    else snprintf(buf, len, "exit status %d", code);
}

/* -1 with err "rank R stops: rank F failed <when> (<how>)" once a rank has
 * set h's abort word (the waits of the join and of NCCL's id), else 0. */
static inline int shm_abort_said(ShmHeader *h, int rank, const char *when, char *err, size_t errlen) {
    int64_t w = atomic_load(&h->abort_word);
    if (!w) return 0;
    char how[64];
    shm_describe_status((int32_t)(uint32_t)w, how, sizeof how);
    snprintf(err, errlen, "rank %d stops: rank %d failed %s (%s)", rank, (int)(w >> 32) - 2, when, how);
    return -1;
}

/* One staging area: 512 KB, so a chunk stays in cache between the phases of
 * an all-reduce (bench_comm measured 2 ranks at about 2.0 GB/s bus bandwidth
 * for 64-256 MB against about 1.4 with 4 MB areas), and 64 ranks map 96 MB
 * at most. */
static inline size_t shm_area_bytes(int world) { (void)world; return (size_t)512 << 10; }

/* The header and the slots, rounded up to a page: where the areas start. */
static inline size_t shm_header_bytes(int world) {
    size_t b = sizeof(ShmHeader) + (size_t)world * sizeof(ShmSlot);
    return (b + 4095) & ~(size_t)4095;
}

/* Bytes of the segment of a world of this many ranks (header and areas). */
static inline size_t shm_segment_bytes(int world) {
    return shm_header_bytes(world) + (size_t)world * DATA_AREAS * shm_area_bytes(world);
}

/* Sets the sizes of a zeroed segment (anonymous or ftruncated memory) and
 * marks it valid. */
static inline void shm_header_init(ShmHeader *h, int world) {
    h->world = world;
    h->area_bytes = shm_area_bytes(world);
    h->data_offset = shm_header_bytes(world);
    atomic_thread_fence(memory_order_release);
    h->magic = SHM_MAGIC;
}

static inline void futex_wake(_Atomic uint32_t *w) {
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Tells rank q that something it may wait for has changed. */
static inline void shm_ring(ShmHeader *h, int q) {
    ShmSlot *s = &h->slot[q];
    atomic_fetch_add(&s->bell, 1);
    if (atomic_load(&s->sleeping)) futex_wake(&s->bell);
}

/* Wakes every rank that may sleep on a counter. */
static inline void shm_ring_all(ShmHeader *h) {
    for (int q = 0; q < h->world; q++) shm_ring(h, q);
}

/* Records the first failure of the job (rank -1: the launcher was interrupted)
 * and wakes everyone; later calls change nothing. */
static inline void shm_abort_set(ShmHeader *h, int rank, int code) {
    int64_t expect = 0, word = ((int64_t)(rank + 2) << 32) | (uint32_t)code;
    atomic_compare_exchange_strong(&h->abort_word, &expect, word);
    shm_ring_all(h);
}

/* ---- dying ------------------------------------------------------------------------ */

/* Prints the line, records the failure for the other ranks (the first one
 * recorded wins: `culprit` is the rank that started it, with its code),
 * unlinks a named segment the others never all mapped, and exits 1. */
static inline __attribute__((noreturn)) void comm_fail(Comm *c, int culprit, int code, const char *fmt,
                                                       va_list ap) {
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

/* This rank's own fatal error: prints the line, records the failure in the
 * segment for the other ranks (the first one recorded wins) and exits 1. */
static inline __attribute__((noreturn, format(printf, 2, 3))) void comm_die(Comm *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    comm_fail(c, c->rank, 1, fmt, ap);
}

/* Stopping because rank `culprit` ended with `code` (exit status, -signal). */
static inline __attribute__((noreturn, format(printf, 4, 5))) void comm_die_for(Comm *c, int culprit, int code,
                                                                               const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    comm_fail(c, culprit, code, fmt, ap);
}

/* ---- the rendezvous' settings ------------------------------------------------- */

#define RENDEZVOUS_S 120.0       /* external launcher: how long rank 0 waits for the others, and they for it */
#define JOIN_S 30.0              /* then: how long mapping the segment (or NCCL's id, forked) may take */

/* The rendezvous of launch l (rendezvous.h): rank 0 at addr (MASTER_ADDR;
 * the backend's default when unset), the job's token and agreement items. */
static inline void comm_rdzv_job(const CommLaunch *l, const char *addr, RdzvJob *j) {
    j->rank = l->rank;
    j->world_size = l->world_size;
    j->addr = addr;
    j->port = l->rendezvous_port;
    j->port_name = l->rendezvous_port != l->master_port ? "MASTER_PORT + 1" : "MASTER_PORT";
    j->token = l->job_token;
    j->token_from = l->job_token_from[0] ? l->job_token_from : "nothing";
    j->items = l->agree;
    j->nitems = l->agree ? l->nagree : 0;
    j->timeout_s = RENDEZVOUS_S;
}

/* ---- the shared-memory backend (comm_shm.c) ------------------------------------ */

/* One rank alone: a private segment, so sends to itself work like any other.
 * 0, or -1 with err. */
int shm_map_private(Comm *c, char *err, size_t errlen);
/* External launcher: rank 0 makes a named segment, hands its name out over
 * the rendezvous (rdzv_bcast), and the name is unlinked once all mapped it;
 * every wait has a deadline and names the ranks missing, and no failed start
 * leaves the name behind. 0; RDZV_MISMATCH (the ranks disagree) or -1, with
 * err. */
int shm_join(Comm *c, const CommLaunch *l, char *err, size_t errlen);
/* Tells the peers this rank left (exit code 0) and unmaps the segment. */
void shm_leave(Comm *c);

/* The operations of comm.h on the segment; contracts as there. */
void shm_all_reduce(CommGroup *g, Dev *d, void *buf, size_t n, CommDtype t, CommRed op);
void shm_reduce_scatter(CommGroup *g, Dev *d, void *out, const void *in, size_t n, CommDtype t, CommRed op);
void shm_all_gather(CommGroup *g, Dev *d, void *out, const void *in, size_t n, CommDtype t);
void shm_broadcast(CommGroup *g, Dev *d, void *buf, size_t n, CommDtype t, int root);
void shm_reduce(CommGroup *g, Dev *d, void *buf, size_t n, CommDtype t, CommRed op, int root);
void shm_barrier(CommGroup *g);
/* Completes every send and receive of ops[n] together, in any order they can move. */
void shm_p2p_run(Comm *c, P2POp *ops, int n);

/* ---- the NCCL backend (comm_nccl.c, USE_NCCL builds only) ---------------------- */

#ifdef USE_NCCL
/* Creates the stream and events on gpu, gets the world's NCCL id to every
 * rank (through the segment when forked, else rdzv_bcast_hold) and joins, by
 * a deadline (--comm-timeout, at least RENDEZVOUS_S; past it, or when a rank
 * dies first: one line naming the ranks that have not joined, exit 1). 0; RDZV_MISMATCH or -1 with err (no
 * CUDA device, rendezvous failed); NCCL errors exit. */
int nccl_init(Comm *c, const CommLaunch *l, Dev *gpu, char *err, size_t errlen);
/* Destroys the world communicator, stream, events and scratch (any part made). */
void nccl_free(Comm *c);
/* g->nccl = ncclCommSplit of the world (color < 0: none); collective. */
void nccl_split(Comm *c, int color, int key, CommGroup *g);
void nccl_group_free(CommGroup *g);
/* The operations, each on its group's stream; they return the CommOp to wait
 * for (GPU buffers), or no operation (host buffers: complete on return). */
CommOp nccl_all_reduce(CommGroup *g, Dev *d, void *buf, size_t n, CommDtype t, CommRed op);
CommOp nccl_reduce_scatter(CommGroup *g, Dev *d, void *out, const void *in, size_t n, CommDtype t, CommRed op);
CommOp nccl_all_gather(CommGroup *g, Dev *d, void *out, const void *in, size_t n, CommDtype t);
CommOp nccl_broadcast(CommGroup *g, Dev *d, void *buf, size_t n, CommDtype t, int root);
CommOp nccl_reduce(CommGroup *g, Dev *d, void *buf, size_t n, CommDtype t, CommRed op, int root);
/* One send (send = 1) or receive; GPU buffers only (exits otherwise). In a
 * batch it returns no operation: nccl_group_end returns the batch's. */
CommOp nccl_p2p(CommGroup *g, Dev *d, void *buf, size_t n, CommDtype t, int peer, int send);
void nccl_barrier(CommGroup *g);
/* ncclGroupStart / ncclGroupEnd: the p2p batch. */
void nccl_group_start(Comm *c);
CommOp nccl_group_end(Comm *c);
/* d's compute stream waits for every group's last operation (GPU d only). */
void nccl_wait(Comm *c, Dev *d);
/* d's compute stream waits for op only. */
void nccl_op_wait(CommOp op, Dev *d);
/* "NCCL 2.28.9 (...)": the library's version, the streams, the watchdog. */
void nccl_describe(const Comm *c, char *buf, size_t len);
#endif

#endif
