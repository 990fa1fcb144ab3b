/* comm.h: ranks, the process mesh and its groups, collectives and point-to-point.
 *
 * A run is a set of ranks, one process each (DESIGN.md, "Processes"). This
 * header gives them three things:
 *
 *  1. Launching. comm_launch_plan reads --ranks and the variables of an
 *     existing launcher (torchrun, srun, mpirun) and says who this process
 *     is; comm_launch_start forks the ranks of `--ranks N` and turns the
 *     calling process into their supervisor (it relays their output and
 *     takes them all down when one dies).
 *  2. Communicators. A Comm is this rank's end of the world; a CommGroup is
 *     an ordered subset of the world (comm_split); a CommMesh is the
 *     dp x tp x pp layout of hybrid-parallelism.txt with its tp, dp, pp and
 *     embed groups, rank = tp_rank + tp * (dp_rank + dp * pp_rank).
 *  3. Operations on a group: all-reduce, reduce-scatter, all-gather,
 *     broadcast, reduce, send/recv (batched: deadlock-free in any order),
 *     barrier. Each counts the bytes it moves, the way nccl-tests does.
 *
 * Two backends sit behind one API. NCCL (GPU buffers; CPU buffers are
 * staged through the GPU) when built with USE_NCCL, and shared memory:
 * ranks of one host that exchange through a segment every rank maps (CPU
 * buffers, and GPU buffers staged through host memory, so several ranks can
 * share one GPU).
 *
 * Conventions of every operation:
 *  - `g` first; `d` is the device the buffers live on (NULL means host
 *    memory). Counts n are elements of dtype t, never bytes.
 *  - roots and peers are indices in the group (0 .. g->size-1), not world
 *    ranks. Every member calls the same operations in the same order with
 *    the same n; a rank that is not a member of g (g->index < 0) may call
 *    any operation: it returns at once.
 *  - Shards: reduce-scatter and all-gather split n elements by comm_shard.
 *  - Host buffers and the shared-memory backend: the call returns when this
 *    rank's part is done. GPU buffers with NCCL: the call waits (on the
 *    GPU) for work queued on d's compute stream, queues the operation on
 *    its group's communication stream and returns a CommOp; the buffers
 *    belong to the communication until comm_op_wait(op, d) (that operation)
 *    or comm_wait(c, d) (every group's).
 *  - Faults are not returned: a peer that died, an NCCL or CUDA error, or a
 *    misuse (root outside the group) prints one line naming the cause and
 *    exits the process with status 1, after telling the other ranks.
 *  - Reductions: sums run in group order (index 0 + 1 + ... + size-1) on
 *    the shared-memory backend, and every member receives the same bits.
 *    COMM_AVG is that sum divided by the group size; COMM_MAX (int32 only)
 *    the largest member's value.
 *  - One thread per rank uses its Comm. Free groups and meshes before
 *    comm_free.
 */
#ifndef COMM_H
#define COMM_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "tensor.h"
#include "rendezvous.h"

#define COMM_MAX_RANKS 64    /* ranks of one --ranks job, and of the shared-memory backend */
#define COMM_NO_COLOR (-1)   /* comm_split: this rank joins no group */
#define COMM_MAX_STATS 64    /* (kind, group) rows of the byte accounting */
#define COMM_MAX_BATCH 64    /* sends and receives between comm_p2p_begin and _end */

typedef enum { COMM_F32 = 0, COMM_BF16 = 1, COMM_I32 = 2 } CommDtype;
typedef enum { COMM_SUM = 0, COMM_AVG = 1, COMM_MAX = 2 } CommRed;   /* AVG: float types; MAX: int32 */
typedef enum { COMM_SHM = 0, COMM_NCCL = 1 } CommBackend;
typedef enum { COMM_LAUNCH_SINGLE, COMM_LAUNCH_FORK, COMM_LAUNCH_ENV } CommLaunchKind;
typedef enum {
    COMM_ALL_REDUCE, COMM_REDUCE_SCATTER, COMM_ALL_GATHER, COMM_BROADCAST,
    COMM_REDUCE, COMM_SEND, COMM_RECV, COMM_BARRIER, COMM_KINDS
} CommKind;

/* Who this process is, before any communicator exists. */
typedef struct CommLaunch {
    CommLaunchKind kind;
    int rank, world_size;
    int local_rank;         /* on this host: pick GPU local_rank % dev_gpu_count() */
    int local_size;         /* ranks on this host, 0 when the launcher does not say */
    const char *source;     /* "single", "--ranks", "torchrun", "openmpi", "mpich" or "slurm" */
    char master_addr[256];  /* MASTER_ADDR, "" when unset */
    int master_port;        /* MASTER_PORT, 0 when unset */
    int rendezvous_port;    /* where rank 0 listens: MASTER_PORT, or MASTER_PORT + 1 under
                               torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE=True),
                               which already holds MASTER_PORT */
    double comm_timeout_s;  /* --comm-timeout: how long an NCCL operation may take before the
                               rank's watchdog stops it (0: 300 s); set before comm_init */
    int graceful_stop;      /* --ranks: the first SIGINT/SIGTERM is passed to the ranks, which
                               finish their step and checkpoint; the second kills them */
    void *shared;           /* fork: the segment mapped before the fork, inherited */
    size_t shared_bytes;
    unsigned char job_token[RDZV_TOKEN_BYTES];  /* shared by this job's ranks only (rendezvous.h): from
                               the launcher's job identity and TRAIN_JOB_TOKEN, or random (--ranks) */
    char job_token_from[96];    /* what it came from, for messages: "TORCHELASTIC_RUN_ID", ... */
    const char *const *agree;   /* [nagree] "name=value": what every rank must agree on (world,
                                   model, layout, data, version); set before comm_init; may be NULL */
    int nagree;
} CommLaunch;

typedef struct Comm Comm;
typedef struct CommImpl CommImpl;  /* backend state, private to comm.c */

/* An ordered subset of the world. */
typedef struct CommGroup {
    Comm *comm;
    char name[16];          /* "world", "tp", "dp", "pp", "embed", ...: the stats row */
    int size;               /* members; 0 when this rank is not one */
    int index;              /* this rank's position in ranks, -1 when not a member */
    int *ranks;             /* [size] world ranks in group order */
    void *nccl;             /* comm_nccl.c's queue (communicator, stream, events), NULL on shared memory */
} CommGroup;

/* Bus bytes, nccl-tests convention, per rank (n = group size, B = buffer bytes,
 * for reduce-scatter and all-gather B is the full, unsharded buffer):
 *   all-reduce 2(n-1)/n B; reduce-scatter, all-gather (n-1)/n B;
 *   broadcast, reduce B (0 when n = 1); send, recv the message; barrier 0.
 * Fractions are rounded down to whole bytes per call. */
typedef struct CommStat {
    CommKind kind;
    char group[16];
    uint64_t calls, bytes;
} CommStat;

/* This rank's end of the world. Must not move after comm_init (groups point
 * to it). */
struct Comm {
    int rank, world_size, local_rank;
    CommBackend backend;
    CommGroup world;        /* every rank, in rank order */
    CommImpl *impl;
    CommStat stats[COMM_MAX_STATS];
    int nstats;
};

/* The 4D layout: rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp *
 * pp_rank)). TP is innermost (one box's neighbours), cp next to it (its
 * ring passes keys and values every layer, so it wants the same fast
 * links), PP outermost (stages across boxes). dp_group holds the dp x cp
 * ranks of one (tp_rank, pp_rank), ordered by dp_rank then cp_rank: the
 * gradients reduce over it, and ZeRO shards over it (the cp ranks of a
 * sequence each hold a part of its gradient); data.c's sequences follow
 * dp_rank alone, every cp rank of a dp slot reading the same ones.
 * embed_group: the first and last pipeline stages with this rank's dp_rank
 * and tp_rank (the tied embedding); one rank when pp == 1, 2 ranks
 * otherwise; middle stages are not members (size 0, index -1). */
typedef struct CommMesh {
    int dp, cp, tp, pp;
    int dp_rank, cp_rank, tp_rank, pp_rank;
    CommGroup dp_group, cp_group, tp_group, pp_group, embed_group;   /* cp_group: a group of its own
                                                                         only when cp > 1 */
} CommMesh;

/* ---- launching ---------------------------------------------------------- */

/* Decides how this process becomes a rank; forks nothing. ranks is --ranks
 * (0 when not given). Under a launcher of several ranks: one rank of that
 * world. The launcher is the first found of torchrun (RANK, WORLD_SIZE,
 * LOCAL_RANK, LOCAL_WORLD_SIZE), mpirun (OMPI_COMM_WORLD_RANK, _SIZE,
 * _LOCAL_RANK, _LOCAL_SIZE; MPICH's PMI_RANK, PMI_SIZE, MPI_LOCALRANKID,
 * MPI_LOCALNRANKS) and an srun task (SLURM_PROCID, SLURM_STEP_NUM_TASKS or
 * SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE; only with a step id in
 * SLURM_STEP_ID: a batch script's shell has Slurm's variables but is no
 * task). Else, with ranks > 1, a fork job of that many ranks; else a single
 * rank. Every variable read is checked here: returns 0, or -1 with one line
 * in err naming the variable (not a number, rank outside the world, local
 * rank not below the local size, a world over COMM_MAX_RANKS without NCCL,
 * no MASTER_PORT for a launcher of several ranks, MASTER_PORT not a port,
 * a launcher of several ranks that names no job without TRAIN_JOB_TOKEN:
 * the job token, l->job_token, comes from them),
 * or --ranks outside 1..COMM_MAX_RANKS, or --ranks beside a launcher of
 * another number of ranks. */
int comm_launch_plan(int ranks, CommLaunch *l, char *err, size_t errlen);

/* Fork plans: maps the shared segment, forks l->world_size ranks and
 * returns 0 in each of them with l->rank set (local rank = rank). The
 * calling process becomes the supervisor and never returns: it relays rank
 * 0's output as is and other ranks' lines prefixed "[rank r] ", stops all
 * ranks when one fails ("error: rank 2 died (killed by signal 9); ...": the
 * others stop at their next wait, and SIGKILL comes 3 s later) or on
 * SIGINT/SIGTERM/SIGHUP, and exits 0 when all succeeded, else with the
 * first failing rank's exit status (128 + signal when it was killed, or
 * when the supervisor was interrupted). Ranks die with the supervisor. The
 * segment is anonymous: nothing in /dev/shm. Other plans: returns 0 at
 * once. -1 with err when the segment or a fork cannot be made (the ranks
 * already forked are killed). */
int comm_launch_start(CommLaunch *l, char *err, size_t errlen);

/* One call for both: plan, then start. */
int comm_launch(int ranks, CommLaunch *l, char *err, size_t errlen);

/* NCCL when it is built in and dev is CUDA, unless the ranks of a fork job
 * must share GPUs (more ranks than gpus); else shared memory. --backend
 * overrides it. */
CommBackend comm_default_backend(const CommLaunch *l, DevKind dev, int gpus);

/* ---- communicators ------------------------------------------------------- */

/* Joins the world of l. gpu: this rank's CUDA device for COMM_NCCL (its
 * compute stream orders the operations), ignored for COMM_SHM. Under an
 * external launcher rank 0 hands out the NCCL id, or the name of the shared
 * segment it made (/dev/shm/train-<pid>-<port>, unlinked as soon as every
 * rank has mapped it), over TCP at MASTER_ADDR:rendezvous_port (MASTER_ADDR
 * defaults to 127.0.0.1 for COMM_SHM); the others retry for 120 s. Without
 * a supervisor, a waiting rank notices a vanished peer within a second.
 * Only ranks that prove l's job token are served, and only when their
 * l->agree items equal rank 0's. Returns 0; RDZV_MISMATCH (-2) with one line
 * in err naming the first item on which this rank and rank 0 disagree (on
 * both ranks); or -1 with one line in err: NCCL not built, no GPU, more than
 * COMM_MAX_RANKS for COMM_SHM, rendezvous failed (address and port named,
 * or another job's token), segment cannot be made or opened (ranks on
 * several hosts), a rank that never joined (named). NCCL errors
 * during init exit like any NCCL error. */
int comm_init(Comm *c, const CommLaunch *l, CommBackend backend, Dev *gpu,
              char *err, size_t errlen);
/* Leaves the world: frees groups' memory of c, the segment mapping, NCCL. */
void comm_free(Comm *c);

/* Collective over the world: the ranks passing the same color >= 0 form a
 * group ordered by (key, world rank), named `name`; COMM_NO_COLOR joins none
 * (g->size 0). */
void comm_split(Comm *c, int color, int key, const char *name, CommGroup *g);
void comm_group_free(CommGroup *g);

/* Fills in dp, tp, pp for world ranks: values of 0 are inferred (dp first,
 * then tp, then pp; the others left out are 1). Returns 0, or -1 with err
 * naming the numbers: "--dp 2 --tp 2 --pp 3 multiply to 12, not the 8
 * ranks", or a value below 0, or a product that does not divide the ranks. */
int comm_mesh_shape(int world_size, int *dp, int *tp, int *pp, char *err, size_t errlen);
/* Collective: shapes the mesh (as comm_mesh_shape over the world's ranks
 * / cp) and makes its groups. Returns 0, or -1 with err (nothing made). */
int comm_mesh_build(Comm *c, int dp, int cp, int tp, int pp, CommMesh *m, char *err, size_t errlen);
void comm_mesh_free(CommMesh *m);
/* The world rank at these coordinates. */
int comm_mesh_rank(const CommMesh *m, int dp_rank, int cp_rank, int tp_rank, int pp_rank);

/* ---- operations (contracts: see the top of this file) --------------------- */

/* What every operation returns: the queue it went on (its group's) and its
 * place there. comm_op_wait(op, d) makes d's compute stream wait for that
 * one operation (and for what its group queued before it), not for the other
 * groups' operations in flight. On the shared-memory backend, and for host
 * buffers, an operation is complete when it returns and waiting is free. */
typedef struct CommOp {
    CommGroup *g;            /* NULL: nothing to wait for */
    uint64_t seq;            /* 1, 2, ... on the group's queue */
} CommOp;

/* The shard rule: n elements over size shards, the first n % size shards
 * one element longer. Shard `index` is [*offset, *offset + *count). */
static inline void comm_shard(size_t n, int size, int index, size_t *offset, size_t *count) {
    size_t base = n / (size_t)size, extra = n % (size_t)size, i = (size_t)index;
    *count = base + (i < extra);
    *offset = i * base + (i < extra ? i : extra);
}
/* Bytes of one element of t: 2 for COMM_BF16, 4 for the others. */
static inline size_t comm_dtype_size(CommDtype t) { return t == COMM_BF16 ? 2 : 4; }

/* buf[n] = op over members of buf[n]. */
CommOp comm_all_reduce(CommGroup *g, Dev *d, void *buf, size_t n, CommDtype t, CommRed op);
/* out[shard count] = op over members of in[n], this member's shard. out may be
 * in + shard offset. */
CommOp comm_reduce_scatter(CommGroup *g, Dev *d, void *out, const void *in, size_t n,
                         CommDtype t, CommRed op);
/* out[n] = every member's in[shard count] at its shard offset. in may be
 * out + shard offset. */
CommOp comm_all_gather(CommGroup *g, Dev *d, void *out, const void *in, size_t n, CommDtype t);
/* buf[n] of member root copied to every member. */
CommOp comm_broadcast(CommGroup *g, Dev *d, void *buf, size_t n, CommDtype t, int root);
/* buf[n] of member root = op over members of buf[n]; others' buf unchanged. */
CommOp comm_reduce(CommGroup *g, Dev *d, void *buf, size_t n, CommDtype t, CommRed op, int root);
/* Point-to-point with member peer; counts and dtypes of a pair must match,
 * and messages between two members arrive in the order they were sent.
 * Alone, a send returns once its last chunk is staged (a receiver must come);
 * a recv returns with the data. Between comm_p2p_begin and comm_p2p_end the
 * calls only queue, and _end completes them all together, so any set of
 * exchanges (a ring, both pipeline neighbours, a rank and itself) cannot
 * deadlock. On NCCL: GPU buffers only (exits otherwise), and the batch is
 * ncclGroupStart/End. */
CommOp comm_send(CommGroup *g, Dev *d, const void *buf, size_t n, CommDtype t, int peer);
CommOp comm_recv(CommGroup *g, Dev *d, void *buf, size_t n, CommDtype t, int peer);
void comm_p2p_begin(Comm *c);
/* Returns the batch's operation (on NCCL: its last group's queue; a batch
 * across groups is waited for with comm_wait). */
CommOp comm_p2p_end(Comm *c);
/* Sends sendbuf[n] to member dst and receives recvbuf[n] from member src, batched. */
CommOp comm_sendrecv(CommGroup *g, Dev *d, const void *sendbuf, int dst, void *recvbuf, int src,
                   size_t n, CommDtype t);
/* Returns when every member has called it. */
void comm_barrier(CommGroup *g);
/* Makes d's compute stream wait for the operations queued so far (NCCL and
 * GPU buffers); nothing to do otherwise. */
void comm_wait(Comm *c, Dev *d);
/* Makes d's compute stream wait for op only (see CommOp). */
void comm_op_wait(CommOp op, Dev *d);

/* "NCCL 2.28.9 (a stream a group, watchdog 300 s)" or "shared memory", for
 * the run's header. */
void comm_describe(const Comm *c, char *buf, size_t len);

/* ---- accounting ----------------------------------------------------------- */

/* The operation's name as --comm-stats prints it ("all_reduce", "send", ...). */
const char *comm_kind_name(CommKind k);
/* Bytes counted for (kind, group name); *calls too when calls is not NULL. */
uint64_t comm_stats_bytes(const Comm *c, CommKind k, const char *group, uint64_t *calls);
void comm_stats_reset(Comm *c);
/* The table: kind, group, calls, bytes, one row per (kind, group) used. */
void comm_stats_print(const Comm *c, FILE *f);

#endif
