/* comm_impl.h: what the four parts of comm.h's implementation share; included
 * by comm.c, comm_launch.c, comm_shm.c and comm_nccl.c only, never elsewhere.
 *
 *   comm.c         communicators, groups, the mesh; every operation's checks,
 *                  byte accounting and dispatch to a backend; comm_die
 *   comm_launch.c  who this process is (launcher variables), the fork
 *                  launcher and its supervisor, the TCP rendezvous
 *   comm_shm.c     the shared segment, its collectives and p2p engine
 *   comm_nccl.c    the NCCL backend (built with USE_NCCL)
 *
 * Backend entry points are called by comm.c after its checks: this rank is
 * a member of g, n > 0, and for shm_ collectives g->size > 1. Faults inside
 * them exit through comm_die, like everything else in comm.h.
 */
#ifndef COMM_IMPL_H
#define COMM_IMPL_H

#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#include "comm.h"

/* ---- small things every part uses ----------------------------------------- */

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static inline size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }
static inline size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }
static inline int on_gpu(const Dev *d) { return d && d->kind == DEV_CUDA; }

/* ---- the shared segment (comm_shm.c) ---------------------------------------- */

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

/* ---- dying (comm.c) ------------------------------------------------------------ */

/* This rank's own fatal error: prints the line, records the failure in the
 * segment for the other ranks (the first one recorded wins) and exits 1. */
void comm_die(Comm *c, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
/* Stopping because rank `culprit` ended with `code` (exit status, -signal). */
void comm_die_for(Comm *c, int culprit, int code, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 4, 5)));

/* ---- the rendezvous (comm_launch.c) ------------------------------------------- */

/* Rank 0 of l serves blob[len] at MASTER_ADDR:rendezvous_port until every
 * other rank fetched it; the others fetch it into blob. Returns 0, or -1 with
 * err: MASTER_PORT or (not rank 0) MASTER_ADDR unset, nobody/rank 0 not
 * reached within the rendezvous timeout, port taken. */
int tcp_bcast(const CommLaunch *l, void *blob, size_t len, char *err, size_t errlen);

/* ---- the shared-memory backend (comm_shm.c) ------------------------------------ */

/* Bytes of the segment of a world of this many ranks (header and areas). */
size_t shm_segment_bytes(int world);
/* Sets the sizes of a zeroed segment and marks it valid. */
void shm_header_init(ShmHeader *h, int world);
/* Wakes every rank that may sleep on a counter. */
void shm_ring_all(ShmHeader *h);
/* Records the first failure of the job (rank -1: the launcher was interrupted)
 * and wakes everyone; later calls change nothing. */
void shm_abort_set(ShmHeader *h, int rank, int code);
/* "exit status 3", "killed by signal 9", or "its process is gone". */
void shm_describe_status(int code, char *buf, size_t len);
/* Waits until *p >= v, `peer` being the rank that moves it; exits (comm_die)
 * when the job aborts or peer left without getting there. */
void shm_wait_geq(Comm *c, _Atomic uint64_t *p, uint64_t v, int peer);
/* One rank alone: a private segment, so sends to itself work like any other.
 * 0, or -1 with err. */
int shm_map_private(Comm *c, char *err, size_t errlen);
/* External launcher: rank 0 makes a named segment, hands its name out over
 * tcp_bcast, and the name is unlinked once all mapped it. 0, or -1 with err. */
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
 * rank (through the segment when forked, else tcp_bcast) and joins. 0, or -1
 * with err (no CUDA device, rendezvous failed); NCCL errors exit. */
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
