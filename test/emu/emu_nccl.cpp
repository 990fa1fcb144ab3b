/* test/emu/emu_nccl.cpp: an emulated NCCL, linked instead of libnccl into
 * test builds of the real comm.c (its USE_NCCL backend), so that code runs
 * on machines without a GPU, against NCCL's documented semantics, with the
 * mistakes a real NCCL answers with a hang or with wrong numbers made loud.
 * Types and prototypes are the real header's (nccl.h, 2.28).
 *
 * Processes and memory. Every rank is its own process with its own emulated
 * device memory (process memory, emu_rt.cpp). ncclGetUniqueId names a file
 * (a magic, a path under $TMPDIR or /tmp, a random tag); ncclCommInitRank
 * maps it MAP_SHARED (the first caller sizes it, sparse) and waits up to 60 s
 * for all ranks, then every rank unlinks it, so a crash later leaves nothing
 * in /tmp. The mapping (ShWorld) is the only state shared between processes:
 * per world rank its pid, an exited flag, a count of NCCL calls, a staging
 * area (EMU_NCCL_STAGE_MB, default 64) that its outgoing data is copied
 * into, and the operations it has pending (for deadlock detection); and a
 * table of communicators (uid 0 is the world; ncclCommSplit adds more), each
 * with its members as world ranks and, per member, the counters and the
 * descriptor of its latest collective and of every send channel to a peer.
 *
 * Operations. Each ncclAllReduce, ..., ncclSend, ncclRecv is one EmuStreamOp
 * on the given stream (emu_stream.h), never done in the calling thread; its
 * step() never blocks. A collective posts this rank's part (copies sendbuff
 * into the stage, writes a descriptor, bumps `posted`), waits for every
 * member's post, compares all descriptors, computes its own output from the
 * stages, bumps `done`, and completes once every member is done (so a stage
 * is reused only after everyone read it). A send posts into the channel and
 * completes when the receiver has copied it (rendezvous); a receive waits for
 * the matching post (the n-th send from A to B matches B's n-th receive from
 * A). Reductions run in member order 0 + 1 + ... + n-1 in float32 (bf16
 * widened, summed, divided for avg, rounded to nearest even once; int32 in
 * wrapping integer arithmetic, or its max for ncclMax, on int32 only), so
 * every member gets the same bits. ncclAvg is the sum divided by n (NCCL
 * does not document its rounding). Operations of one communicator run in
 * the order this process issued them, whatever the streams (as NCCL
 * serialises a communicator's work). A group (ncclGroup
 * Start/End, nestable) is one stream op, at the outermost End, that posts
 * all its parts at once (collectives of one comm inside it still in order)
 * and completes when every part has.
 *
 * Loud failures ("emulated NCCL: rank R: ...", then the process exits 1):
 * argument errors; buffers not device memory of the comm's GPU; send and
 * receive ranges overlapping other than in NCCL's in-place forms; members
 * calling different collectives, counts, types, ops or roots at the same
 * collective; send/recv count or type mismatch; an op bigger than the stage;
 * deadlocks; a dead peer nobody aborted for. The rules:
 *  - Deadlock: a pending op publishes which ranks it waits to arrive (not yet
 *    posted their part). After 250 ms pending, a rank looks for a cycle
 *    through itself in the wait-for graph of every rank's published ops;
 *    found twice, 50 ms apart, with the same entries and no NCCL call made
 *    meanwhile by any rank of the cycle, it is a deadlock: the message names
 *    every rank of the cycle and what it waits in. Every rank of the cycle
 *    must also have its host stuck in a blocking wait (emu_host_blocked):
 *    a rank still computing may yet issue the missing op on another stream
 *    (comm.c gives each group its own), so it is never counted.
 *  - Dead peer: every 0.5 s a pending op checks that the ranks it waits for
 *    (to post or to finish reading) live: pid present and not a zombie, no
 *    exit recorded. A dead one sets the comm's async error ncclRemoteError
 *    (reported by ncclCommGetAsyncError, printed once); if nobody calls
 *    ncclCommAbort within EMU_NCCL_ABORT_GRACE seconds (default 3), the op
 *    fails loudly. The same grace applies to every async error (an injected
 *    one too), so an unwatched failure never hangs.
 *  - ncclCommAbort marks the comm aborted in the shared table: this rank's
 *    pending ops on it complete with nothing done (a stuck stream drains), as
 *    do the other members' (which record ncclRemoteError, "comm aborted by
 *    rank R"). Later operations on a comm with an async error return it.
 *    Comm objects are never freed (Destroy and Abort only mark them), so an
 *    op still queued never sees freed memory.
 *
 * Fault injection (EMU_NCCL_FAIL / _STALL / _EXIT = "rank=R,op=K"; K counts
 * this process's operations, collectives and send/recv alike, from 1): FAIL
 * makes rank R's K-th op record ncclSystemError ("injected") and never post
 * nor complete (until aborted); STALL makes rank R sleep for ever inside its
 * K-th operation call; EXIT makes rank R's K-th op post its part and then
 * _exit(3), a rank dying mid-collective.
 */
#include <nccl.h>

#include "emu_stream.h"

#include <algorithm>
#include <atomic>
#include <errno.h>
#include <fcntl.h>
#include <map>
#include <mutex>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <string>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <vector>

namespace {

/* ---------------------------------------------------------------------------
 * The shared mapping. Plain integers read and written with __atomic builtins
 * (acquire/release): a post writes its descriptor, then releases its counter. */

constexpr uint64_t ID_MAGIC = 0x4c43434e2d554d45ull;   /* "EMU-NCCL" */
constexpr int MAXR = 64;        /* world ranks per id: a wait set is a uint64_t */
constexpr int MAXC = 256;       /* communicators per world */
constexpr int MAXP = 8;         /* pending ops a rank publishes at once */
constexpr size_t STAGE_ALIGN = 64;

struct ShDesc {                 /* a member's latest collective */
    int32_t kind, dtype, redop, root;
    uint64_t count, opnum, stage_off;
};
struct ShMember {
    uint64_t posted, done;      /* collective sequence numbers */
    ShDesc desc;
    uint64_t split_posted, split_done, split_result_seq;
    int32_t color, key, split_result;  /* split_result: the new comm's uid, or -1 */
    int32_t pad;
};
struct ShChan {                 /* sends from one member to another, in order */
    uint64_t posted, done;
    uint64_t count, opnum, stage_off;
    int32_t dtype, pad;
};
struct ShComm {
    int32_t ready, nranks, parent, aborted_by;  /* aborted_by: world rank + 1 */
    int32_t members[MAXR];      /* member index -> world rank */
    ShMember m[MAXR];
    ShChan ch[MAXR][MAXR];      /* [sender][receiver], member indices */
};
/* One thing a pending op waits for: a counter of the shared table still
 * below seq. A checker re-reads the counter, so an entry its owner has not
 * refreshed yet (its stream not stepped lately) never gives a false edge. */
enum { W_POSTED, W_CHAN_POSTED, W_CHAN_DONE, W_HOST };
struct ShCond {
    int32_t comm, type, a, b;   /* member a (posted); channel a -> b; W_HOST: always */
    uint64_t seq;
    int32_t wrank, pad;         /* the world rank this waits for */
};
constexpr int MAXW = 32;
struct ShPending {
    uint64_t gen;               /* bumped at every change */
    int32_t active, comm, ncond, pad;
    uint64_t opnum;
    ShCond cond[MAXW];
    char what[160];
};
struct ShRank {
    int32_t pid, exited;
    uint64_t calls;             /* NCCL calls made: the deadlock check's "no progress" */
    int32_t host_blocked, pad2; /* the host sat in a blocking wait when last seen (emu_host_blocked) */
    ShPending pend[MAXP];
};
struct ShWorld {
    uint64_t magic, tag;
    int32_t nranks, joined, next_comm, pad;
    uint64_t stage_bytes;
    ShRank rank[MAXR];
};

template <class T> T ld(const T &x) { return __atomic_load_n(&x, __ATOMIC_ACQUIRE); }
template <class T> void st(T &x, T v) { __atomic_store_n(&x, v, __ATOMIC_RELEASE); }

size_t page_up(size_t b) { return (b + 4095) & ~(size_t)4095; }
size_t comms_off() { return page_up(sizeof(ShWorld)); }
size_t stages_off() { return comms_off() + page_up(sizeof(ShComm) * MAXC); }

double now_s() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------------------
 * Per-process state: the worlds this process joined (each one mapping) and
 * the settings read from the environment. A forked child starts afresh. */

struct Inject { int rank = -1; uint64_t op = 0; };

struct World {
    ShWorld *h;
    char *base;
    size_t bytes;
    int rank, nranks;
    uint64_t stage_bytes;
    std::mutex lock;                      /* the stage allocator and the pending slots */
    std::map<uint64_t, uint64_t> used;    /* stage offset -> bytes */
    bool slot_used[MAXP] = {};
    ShComm *comm(int uid) { return (ShComm *)(base + comms_off()) + uid; }
    char *stage(int wrank) { return base + stages_off() + (size_t)wrank * stage_bytes; }
};

struct Proc {
    pid_t pid = 0;
    std::mutex lock;
    std::vector<World *> worlds;
    std::atomic<uint64_t> ops{0};         /* operations issued, for fault injection */
    Inject fail, stall, exit_at;
    double grace = 3;
    char last_error[1024] = "";
};
Proc *g_proc;

void parse_inject(const char *var, Inject *in) {
    const char *s = getenv(var);
    if (!s || !*s) return;
    int r;
    unsigned long long k;
    if (sscanf(s, "rank=%d,op=%llu", &r, &k) != 2 || r < 0 || k < 1) {
        fprintf(stderr, "emulated NCCL: %s must be rank=R,op=K (K from 1), not \"%s\"\n", var, s);
        _exit(1);
    }
    in->rank = r;
    in->op = k;
}

void at_exit_mark(void);

Proc *proc() {
    static std::mutex init_lock;
    std::lock_guard<std::mutex> g(init_lock);
    if (!g_proc || g_proc->pid != getpid()) {
        /* a fork's child: the parent's worlds are not this process's */
        bool first = !g_proc;
        g_proc = new Proc;
        g_proc->pid = getpid();
        parse_inject("EMU_NCCL_FAIL", &g_proc->fail);
        parse_inject("EMU_NCCL_STALL", &g_proc->stall);
        parse_inject("EMU_NCCL_EXIT", &g_proc->exit_at);
        if (const char *s = getenv("EMU_NCCL_ABORT_GRACE")) g_proc->grace = atof(s);
        if (first) atexit(at_exit_mark);
    }
    return g_proc;
}

/* A process that exits says so in every world it joined, so peers waiting
 * for it fail at once rather than at the next liveness check. */
void mark_exited(void) {
    if (!g_proc || g_proc->pid != getpid()) return;
    for (World *w : g_proc->worlds) st(w->h->rank[w->rank].exited, 1);
}
void at_exit_mark(void) { mark_exited(); }

void set_last_error(const char *msg) {
    Proc *p = proc();
    std::lock_guard<std::mutex> g(p->lock);
    snprintf(p->last_error, sizeof p->last_error, "%s", msg);
}

/* The loud failure: one line on stderr, then exit 1. _exit, not exit: this
 * may run on a stream's thread while the runtime's other threads run, and
 * static destructors under their feet would only blur the message. */
[[noreturn]] __attribute__((format(printf, 2, 3))) void nccl_fail(int rank, const char *fmt, ...) {
    char msg[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fflush(stdout);
    if (rank >= 0) fprintf(stderr, "emulated NCCL: rank %d: %s\n", rank, msg);
    else fprintf(stderr, "emulated NCCL: %s\n", msg);
    fflush(stderr);
    mark_exited();
    _exit(1);
}

/* Whether world rank r's process still runs: its exit not recorded, its pid
 * present and not a zombie (a forked sibling nobody reaped yet). */
bool rank_alive(World *w, int r) {
    if (ld(w->h->rank[r].exited)) return false;
    pid_t pid = ld(w->h->rank[r].pid);
    if (pid <= 0) return true;  /* not joined yet: the init timeout covers it */
    if (kill(pid, 0) != 0 && errno == ESRCH) return false;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return true;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *close_paren = strrchr(buf, ')');
    return !(close_paren && close_paren[1] == ' ' && (close_paren[2] == 'Z' || close_paren[2] == 'X'));
}

const char *dtype_name(int t) {
    switch (t) {
    case ncclFloat32: return "float32";
    case ncclBfloat16: return "bfloat16";
    case ncclInt32: return "int32";
    default: return "an unsupported type";
    }
}
size_t dtype_size(int t) { return t == ncclBfloat16 ? 2 : 4; }
const char *redop_name(int op) { return op == ncclSum ? "sum" : op == ncclAvg ? "avg" : op == ncclMax ? "max" : "unsupported op"; }

enum Kind { K_ALLREDUCE, K_REDUCESCATTER, K_ALLGATHER, K_BROADCAST, K_REDUCE, K_SEND, K_RECV };
const char *kind_name(int k) {
    static const char *names[] = {"ncclAllReduce", "ncclReduceScatter", "ncclAllGather", "ncclBroadcast",
                                  "ncclReduce", "ncclSend", "ncclRecv"};
    return k >= 0 && k <= K_RECV ? names[k] : "?";
}

/* "ncclAllReduce(count 1024, float32, sum)" */
std::string describe(int kind, uint64_t count, int dt, int op, int root, int peer) {
    char b[160];
    switch (kind) {
    case K_ALLREDUCE: snprintf(b, sizeof b, "ncclAllReduce(count %llu, %s, %s)", (unsigned long long)count, dtype_name(dt), redop_name(op)); break;
    case K_REDUCESCATTER: snprintf(b, sizeof b, "ncclReduceScatter(recvcount %llu, %s, %s)", (unsigned long long)count, dtype_name(dt), redop_name(op)); break;
    case K_ALLGATHER: snprintf(b, sizeof b, "ncclAllGather(sendcount %llu, %s)", (unsigned long long)count, dtype_name(dt)); break;
    case K_BROADCAST: snprintf(b, sizeof b, "ncclBroadcast(count %llu, %s, root %d)", (unsigned long long)count, dtype_name(dt), root); break;
    case K_REDUCE: snprintf(b, sizeof b, "ncclReduce(count %llu, %s, %s, root %d)", (unsigned long long)count, dtype_name(dt), redop_name(op), root); break;
    case K_SEND: snprintf(b, sizeof b, "ncclSend(count %llu, %s, to peer %d)", (unsigned long long)count, dtype_name(dt), peer); break;
    default: snprintf(b, sizeof b, "ncclRecv(count %llu, %s, from peer %d)", (unsigned long long)count, dtype_name(dt), peer); break;
    }
    return b;
}

std::string rank_list(uint64_t mask) {
    std::string s;
    for (int r = 0; r < MAXR; r++)
        if (mask >> r & 1) s += (s.empty() ? "" : ", ") + std::to_string(r);
    return s;
}

}  // namespace

/* ---------------------------------------------------------------------------
 * A communicator as this process holds it. */

struct ncclComm {
    World *w;
    int uid, rank, nranks, dev;
    std::vector<int> world;                 /* member index -> world rank */
    /* issue-time counters, touched only by the issuing thread */
    uint64_t ops = 0, colls = 0, splits = 0, tickets = 0;
    std::vector<uint64_t> sends, recvs;     /* per peer */
    /* touched by stream ops too */
    std::atomic<uint64_t> tickets_done{0};
    std::atomic<int> async_err{ncclSuccess};
    std::atomic<bool> aborted{false}, destroyed{false};
    std::mutex err_lock;
    double err_time = 0;
    std::string err_msg;

    int wrank() const { return w->rank; }
    ShComm *sh() { return w->comm(uid); }
    /* Records the first async error; later ones are only consequences. */
    void set_error(ncclResult_t e, const std::string &msg) {
        std::lock_guard<std::mutex> g(err_lock);
        if (async_err.load() != ncclSuccess) return;
        err_msg = msg;
        err_time = now_s();
        async_err.store(e);
        fprintf(stderr, "emulated NCCL: rank %d: async error %s on comm %d: %s (ncclCommAbort within %g s, or this fails)\n",
                wrank(), ncclGetErrorString(e), uid, msg.c_str(), proc()->grace);
        set_last_error(msg.c_str());
    }
    /* The grace rule: an async error nobody aborted for fails loudly. */
    void check_grace() {
        if (async_err.load() == ncclSuccess || aborted.load()) return;
        double t;
        std::string m;
        {
            std::lock_guard<std::mutex> g(err_lock);
            t = err_time;
            m = err_msg;
        }
        if (now_s() - t > proc()->grace)
            nccl_fail(wrank(), "comm %d: %s; nobody called ncclCommAbort within %g s of the async error %s "
                      "(EMU_NCCL_ABORT_GRACE)", uid, m.c_str(), proc()->grace,
                      ncclGetErrorString((ncclResult_t)async_err.load()));
    }
    bool shared_aborted() { return ld(sh()->aborted_by) != 0; }
};

namespace {

/* ---------------------------------------------------------------------------
 * The stage allocator: this process's own staging area of one world, first
 * fit. Only this process writes its stage; peers read it. */

bool stage_alloc(World *w, uint64_t bytes, uint64_t *off) {
    bytes = (bytes + STAGE_ALIGN - 1) / STAGE_ALIGN * STAGE_ALIGN;
    std::lock_guard<std::mutex> g(w->lock);
    uint64_t at = 0;
    for (auto &u : w->used) {
        if (u.first - at >= bytes) break;
        at = u.first + u.second;
    }
    if (at + bytes > w->stage_bytes) return false;
    w->used[at] = bytes;
    *off = at;
    return true;
}
void stage_free(World *w, uint64_t off) {
    std::lock_guard<std::mutex> g(w->lock);
    w->used.erase(off);
}

void stage_check(ncclComm *c, uint64_t bytes, const std::string &name) {
    if (bytes > c->w->stage_bytes)
        nccl_fail(c->wrank(), "%s: %llu bytes per rank exceed the %llu MiB staging area; set EMU_NCCL_STAGE_MB "
                  "higher", name.c_str(), (unsigned long long)bytes,
                  (unsigned long long)(c->w->stage_bytes >> 20));
}

/* ---------------------------------------------------------------------------
 * Waiting: publishing what a rank waits for, and the dead-peer and deadlock
 * checks, shared by stream ops and by the blocking host calls (split). */

struct Waiter {
    World *w = nullptr;
    int slot = -1;
    double t0 = 0, last_dead = 0, snap_time = -1;
    std::vector<uint64_t> snap;  /* rank, calls, active, gen of each entry of the cycle seen */
    std::vector<ShCond> last;
    bool published = false;

    void start(World *world) {
        w = world;
        t0 = last_dead = now_s();
        std::lock_guard<std::mutex> g(w->lock);
        for (int i = 0; i < MAXP; i++)
            if (!w->slot_used[i]) {
                w->slot_used[i] = true;
                slot = i;
                break;
            }
    }
    void publish(int comm, uint64_t opnum, const std::string &what, const std::vector<ShCond> &conds) {
        auto same = [](const ShCond &x, const ShCond &y) { return !memcmp(&x, &y, sizeof x); };
        if (slot < 0 || (published && conds.size() == last.size() && std::equal(conds.begin(), conds.end(), last.begin(), same)))
            return;
        ShPending &p = w->h->rank[w->rank].pend[slot];
        st(p.active, 0);
        p.comm = comm;
        p.opnum = opnum;
        p.ncond = (int32_t)std::min(conds.size(), (size_t)MAXW);  /* beyond MAXW: fewer edges, never false ones */
        std::copy(conds.begin(), conds.begin() + p.ncond, p.cond);
        snprintf(p.what, sizeof p.what, "%s", what.c_str());
        __atomic_fetch_add(&p.gen, 1, __ATOMIC_ACQ_REL);
        st(p.active, 1);
        last = conds;
        published = true;
    }
    /* Whether what c waits for is still missing, read from the table now. */
    bool live(const ShCond &c) {
        if (c.type == W_HOST) return true;
        if (c.comm < 0 || c.comm >= MAXC || c.a < 0 || c.a >= MAXR || c.b < 0 || c.b >= MAXR) return false;
        ShComm *sc = w->comm(c.comm);
        switch (c.type) {
        case W_POSTED: return ld(sc->m[c.a].posted) < c.seq;
        case W_CHAN_POSTED: return ld(sc->ch[c.a][c.b].posted) < c.seq;
        default: return ld(sc->ch[c.a][c.b].done) < c.seq;
        }
    }
    void finish() {
        if (!w || slot < 0) return;
        ShPending &p = w->h->rank[w->rank].pend[slot];
        st(p.active, 0);
        __atomic_fetch_add(&p.gen, 1, __ATOMIC_ACQ_REL);
        std::lock_guard<std::mutex> g(w->lock);
        w->slot_used[slot] = false;
        slot = -1;
    }
    /* Every ~0.5 s: the first dead rank of `mask`, or -1. */
    int dead_peer(uint64_t mask) {
        double t = now_s();
        if (t - last_dead < 0.5) return -1;
        last_dead = t;
        for (int r = 0; r < w->nranks; r++)
            if ((mask >> r & 1) && r != w->rank && !rank_alive(w, r)) return r;
        return -1;
    }
    /* The ranks entry p of a rank waits for, as far as still true. */
    uint64_t entry_edges(const ShPending &p) {
        uint64_t m = 0;
        if (!ld(p.active)) return 0;
        int nc = std::min(ld(p.ncond), MAXW);
        for (int k = 0; k < nc; k++)
            if (p.cond[k].wrank >= 0 && p.cond[k].wrank < w->nranks && live(p.cond[k])) m |= 1ull << p.cond[k].wrank;
        return m;
    }
    uint64_t edges(int r) {
        uint64_t m = 0;
        for (int i = 0; i < MAXP; i++) m |= entry_edges(w->h->rank[r].pend[i]);
        return m;
    }
    /* A cycle of the wait-for graph through this rank, as the ranks in order. */
    std::vector<int> cycle() {
        int n = w->nranks, me = w->rank;
        std::vector<int> from(n, -1);
        std::vector<int> queue{me};
        std::vector<bool> seen(n, false);
        for (size_t qi = 0; qi < queue.size(); qi++) {
            int a = queue[qi];
            uint64_t e = edges(a);
            for (int b = 0; b < n; b++) {
                if (!(e >> b & 1)) continue;
                if (b == me) {
                    std::vector<int> path;
                    for (int x = a; x != -1; x = from[x]) path.push_back(x);
                    std::reverse(path.begin(), path.end());
                    return path;
                }
                if (!seen[b]) {
                    seen[b] = true;
                    from[b] = a;
                    queue.push_back(b);
                }
            }
        }
        return {};
    }
    std::vector<uint64_t> snapshot(const std::vector<int> &cyc) {
        std::vector<uint64_t> s;
        for (int r : cyc) {
            s.push_back(r);
            s.push_back(ld(w->h->rank[r].calls));
            s.push_back(ld(w->h->rank[r].host_blocked));
            for (int i = 0; i < MAXP; i++) {
                s.push_back(ld(w->h->rank[r].pend[i].active));
                s.push_back(ld(w->h->rank[r].pend[i].gen));
            }
        }
        return s;
    }
    /* After 250 ms waiting: a cycle seen twice 50 ms apart, unchanged, fails. */
    void deadlock_check() {
        double t = now_s();
        if (t - t0 < 0.25 || (snap_time >= 0 && t - snap_time < 0.05)) return;
        __atomic_store_n(&w->h->rank[w->rank].host_blocked, (int32_t)emu_host_blocked(), __ATOMIC_RELEASE);
        std::vector<int> cyc = cycle();
        /* a rank whose host is not stuck in a wait may still issue what the
         * cycle lacks (on another stream): not a deadlock yet */
        bool all_blocked = !cyc.empty();
        for (int r : cyc) all_blocked = all_blocked && __atomic_load_n(&w->h->rank[r].host_blocked, __ATOMIC_ACQUIRE);
        if (!all_blocked) {
            snap_time = -1;
            return;
        }
        std::vector<uint64_t> s = snapshot(cyc);
        if (snap_time < 0 || s != snap) {
            snap = s;
            snap_time = t;
            return;
        }
        std::string msg;
        for (size_t i = 0; i < cyc.size(); i++) {
            int a = cyc[i], b = cyc[(i + 1) % cyc.size()];
            for (int k = 0; k < MAXP; k++) {
                const ShPending &p = w->h->rank[a].pend[k];
                if (entry_edges(p) >> b & 1) {
                    char line[400];
                    snprintf(line, sizeof line, "%srank %d waits in %s for rank %d", msg.empty() ? "" : "; ", a,
                             p.what, b);
                    msg += line;
                    break;
                }
            }
        }
        nccl_fail(w->rank, "deadlock (a cycle of ranks each waiting for the next, unchanged for 50 ms; NCCL would "
                  "hang): %s", msg.c_str());
    }
};

/* ---------------------------------------------------------------------------
 * Reductions, in member order, in float32 (or wrapping int32). */

float bf16_to_f(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
uint16_t f_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1);                                             /* nearest even */
    return (uint16_t)(u >> 16);
}

void reduce_into(void *out, const std::vector<const char *> &in, size_t count, int dt, int op) {
    size_t n = in.size();
    for (size_t e = 0; e < count; e++) {
        if (dt == ncclInt32 && op == ncclMax) {
            int32_t acc = 0, v;
            for (size_t j = 0; j < n; j++) {
                memcpy(&v, in[j] + 4 * e, 4);
                acc = j == 0 || v > acc ? v : acc;
            }
            memcpy((char *)out + 4 * e, &acc, 4);
            continue;
        }
        if (dt == ncclInt32) {
            uint32_t acc = 0, v;
            for (size_t j = 0; j < n; j++) {
                memcpy(&v, in[j] + 4 * e, 4);
                acc += v;
            }
            memcpy((char *)out + 4 * e, &acc, 4);
            continue;
        }
        float acc = 0;
        for (size_t j = 0; j < n; j++) {
            float v;
            if (dt == ncclFloat32) memcpy(&v, in[j] + 4 * e, 4);
            else {
                uint16_t b;
                memcpy(&b, in[j] + 2 * e, 2);
                v = bf16_to_f(b);
            }
            acc = j ? acc + v : v;  /* starting from v keeps -0 + -0 = -0 */
        }
        if (op == ncclAvg) acc /= (float)n;
        if (dt == ncclFloat32) memcpy((char *)out + 4 * e, &acc, 4);
        else {
            uint16_t b = f_to_bf16(acc);
            memcpy((char *)out + 2 * e, &b, 2);
        }
    }
}

/* ---------------------------------------------------------------------------
 * One operation of one communicator (a part of a stream op). */

struct Part {
    ncclComm *c;
    int kind;
    const char *send;
    char *recv;
    size_t count;
    int dt, op, root, peer;
    uint64_t seq;        /* collective number on c, or the n-th send/recv with peer */
    uint64_t opnum;      /* this rank's operation number on c, for messages */
    uint64_t index;      /* this process's operation number, for fault injection */
    int prev = -1;       /* the group's part this one must follow (same comm: a collective, a send to the same peer) */
    int state = 0;       /* 0 not posted, 1 posted, 2 read, 3 complete */
    bool staged = false;
    uint64_t stage_off = 0;
    std::string name;    /* "ncclAllReduce(...) on comm 2 #7" */

    size_t es() const { return dtype_size(dt); }
    /* This rank's outgoing bytes, copied into its stage. */
    uint64_t out_bytes() const {
        switch (kind) {
        case K_REDUCESCATTER: return (uint64_t)count * c->nranks * es();
        case K_BROADCAST: return c->rank == root ? count * es() : 0;
        case K_RECV: return 0;
        default: return count * es();
        }
    }
};

struct NcclOp : EmuStreamOp {
    std::vector<Part> parts;
    std::vector<std::pair<ncclComm *, uint64_t>> tickets;  /* comm, this op's ticket on it */
    bool started = false, injected = false;
    Waiter waiter;

    bool step() override;
    bool advance(Part &p, std::vector<ShCond> *waits, uint64_t *all);
    void post(Part &p);
    void compute(Part &p);
    void check_descs(Part &p);
    void release(Part &p) {
        if (p.staged) stage_free(p.c->w, p.stage_off);
        p.staged = false;
        p.state = 3;
    }
};

void NcclOp::post(Part &p) {
    uint64_t bytes = p.out_bytes();
    if (bytes) {
        memcpy(p.c->w->stage(p.c->wrank()) + p.stage_off, p.send, bytes);
    }
    ShComm *sc = p.c->sh();
    if (p.kind == K_SEND) {
        ShChan &ch = sc->ch[p.c->rank][p.peer];
        ch.count = p.count;
        ch.dtype = p.dt;
        ch.opnum = p.opnum;
        ch.stage_off = p.stage_off;
        st(ch.posted, p.seq);
    } else {
        ShMember &m = sc->m[p.c->rank];
        m.desc = ShDesc{p.kind, p.dt, p.op, p.root, p.count, p.opnum, p.stage_off};
        st(m.posted, p.seq);
    }
}

/* Every member has posted collective p.seq: all must have called the same
 * collective with the same count, type, op and root. */
void NcclOp::check_descs(Part &p) {
    ShComm *sc = p.c->sh();
    const ShDesc &a = sc->m[0].desc;
    for (int j = 1; j < p.c->nranks; j++) {
        const ShDesc &b = sc->m[j].desc;
        std::string diff;
        if (a.kind != b.kind) diff = "different collectives";
        else if (a.count != b.count) diff = "different counts";
        else if (a.dtype != b.dtype) diff = "different datatypes";
        else if (a.redop != b.redop) diff = "different reduction ops";
        else if (a.root != b.root) diff = "different roots";
        else continue;
        nccl_fail(p.c->wrank(), "comm %d, collective %llu: members called %s: rank %d (comm rank 0) called %s as its op #%llu, "
                  "rank %d (comm rank %d) called %s as its op #%llu", p.c->uid, (unsigned long long)p.seq,
                  diff.c_str(), p.c->world[0], describe(a.kind, a.count, a.dtype, a.redop, a.root, -1).c_str(),
                  (unsigned long long)a.opnum, p.c->world[j], j,
                  describe(b.kind, b.count, b.dtype, b.redop, b.root, -1).c_str(), (unsigned long long)b.opnum);
    }
}

void NcclOp::compute(Part &p) {
    ncclComm *c = p.c;
    World *w = c->w;
    ShComm *sc = c->sh();
    int n = c->nranks;
    size_t es = p.es();
    auto stage_of = [&](int j) { return (const char *)w->stage(c->world[j]) + sc->m[j].desc.stage_off; };
    std::vector<const char *> in(n);
    switch (p.kind) {
    case K_ALLREDUCE:
        for (int j = 0; j < n; j++) in[j] = stage_of(j);
        reduce_into(p.recv, in, p.count, p.dt, p.op);
        break;
    case K_REDUCE:
        if (c->rank != p.root) break;
        for (int j = 0; j < n; j++) in[j] = stage_of(j);
        reduce_into(p.recv, in, p.count, p.dt, p.op);
        break;
    case K_REDUCESCATTER:
        for (int j = 0; j < n; j++) in[j] = stage_of(j) + (size_t)c->rank * p.count * es;
        reduce_into(p.recv, in, p.count, p.dt, p.op);
        break;
    case K_ALLGATHER:
        for (int j = 0; j < n; j++) memcpy(p.recv + (size_t)j * p.count * es, stage_of(j), p.count * es);
        break;
    case K_BROADCAST:
        memcpy(p.recv, stage_of(p.root), p.count * es);
        break;
    }
}

/* Moves one part on as far as it can without waiting. waits gets what it
 * waits for other ranks to post (the deadlock graph's edges), all every rank
 * it waits for in any way (the dead-peer check). True when complete. */
bool NcclOp::advance(Part &p, std::vector<ShCond> *waits, uint64_t *all) {
    ncclComm *c = p.c;
    ShComm *sc = c->sh();
    if (p.state == 3) return true;
    if (c->aborted.load() || c->shared_aborted()) {
        if (!c->aborted.load()) {
            int by = ld(sc->aborted_by) - 1;
            c->set_error(ncclRemoteError, "comm aborted by rank " + std::to_string(by) + " while " + p.name + " was pending");
        }
        release(p);
        return true;
    }
    if (p.state == 0) {
        if (p.prev >= 0 && parts[p.prev].state != 3) return false;
        uint64_t bytes = p.out_bytes();
        if (bytes && !stage_alloc(c->w, bytes, &p.stage_off)) return false;  /* other ops hold the stage */
        p.staged = bytes != 0;
        if (p.kind != K_RECV) post(p);
        p.state = 1;
        if (proc()->exit_at.rank == c->wrank() && proc()->exit_at.op == p.index) {
            fprintf(stderr, "emulated NCCL: rank %d: exiting with status 3 inside %s, its part posted (EMU_NCCL_EXIT)\n",
                    c->wrank(), p.name.c_str());
            fflush(stderr);
            _exit(3);
        }
    }
    if (p.kind == K_SEND) {
        ShChan &ch = sc->ch[c->rank][p.peer];
        if (ld(ch.done) < p.seq) {
            waits->push_back(ShCond{c->uid, W_CHAN_DONE, c->rank, p.peer, p.seq, c->world[p.peer], 0});
            *all |= 1ull << c->world[p.peer];
            return false;
        }
        release(p);
        return true;
    }
    if (p.kind == K_RECV) {
        ShChan &ch = sc->ch[p.peer][c->rank];
        if (ld(ch.posted) < p.seq) {
            waits->push_back(ShCond{c->uid, W_CHAN_POSTED, p.peer, c->rank, p.seq, c->world[p.peer], 0});
            *all |= 1ull << c->world[p.peer];
            return false;
        }
        if (ch.count != p.count || ch.dtype != p.dt)
            nccl_fail(c->wrank(), "comm %d: send/recv mismatch: rank %d's %s as its op #%llu is matched by rank %d's %s as "
                      "its op #%llu (send number %llu between them): different %s", c->uid, c->world[p.peer],
                      describe(K_SEND, ch.count, ch.dtype, 0, 0, c->rank).c_str(), (unsigned long long)ch.opnum,
                      c->wrank(), describe(K_RECV, p.count, p.dt, 0, 0, p.peer).c_str(), (unsigned long long)p.opnum,
                      (unsigned long long)p.seq, ch.count != p.count ? "counts" : "datatypes");
        if (p.count) memcpy(p.recv, c->w->stage(c->world[p.peer]) + ch.stage_off, p.count * p.es());
        st(ch.done, p.seq);
        p.state = 3;
        return true;
    }
    if (p.state == 1) {
        uint64_t missing = 0;
        for (int j = 0; j < c->nranks; j++)
            if (ld(sc->m[j].posted) < p.seq) {
                missing |= 1ull << c->world[j];
                waits->push_back(ShCond{c->uid, W_POSTED, j, 0, p.seq, c->world[j], 0});
            }
        if (missing) {
            *all |= missing;
            return false;
        }
        check_descs(p);
        compute(p);
        st(sc->m[c->rank].done, p.seq);
        p.state = 2;
    }
    uint64_t reading = 0;
    for (int j = 0; j < c->nranks; j++)
        if (ld(sc->m[j].done) < p.seq) reading |= 1ull << c->world[j];
    if (reading) {
        *all |= reading;
        return false;
    }
    release(p);
    return true;
}

bool NcclOp::step() {
    Proc *pr = proc();
    if (!started) {
        for (auto &t : tickets)  /* this process's earlier ops on the same comms first */
            if (t.first->tickets_done.load() != t.second - 1) return false;
        started = true;
        waiter.start(parts[0].c->w);
        for (Part &p : parts)
            if (pr->fail.rank == p.c->wrank() && pr->fail.op == p.index) {
                injected = true;
                p.c->set_error(ncclSystemError, "injected by EMU_NCCL_FAIL=rank=" + std::to_string(pr->fail.rank) +
                               ",op=" + std::to_string(pr->fail.op) + " at " + p.name);
            }
    }
    std::vector<ShCond> waits;
    uint64_t all = 0;
    bool done = true;
    if (injected) {
        /* never posts, never completes: only an abort drains it */
        done = parts[0].c->aborted.load();
        if (!done) parts[0].c->check_grace();
    } else {
        for (Part &p : parts) done &= advance(p, &waits, &all);
    }
    auto complete = [&]() {
        for (Part &p : parts) release(p);
        waiter.finish();
        for (auto &t : tickets) t.first->tickets_done.store(t.second);
        return true;
    };
    if (done) return complete();
    ncclComm *c = parts[0].c;
    std::string what = name.size() > 150 ? name.substr(0, 147) + "..." : name;
    waiter.publish(c->uid, parts[0].opnum, what, waits);
    int dead = waiter.dead_peer(all);
    if (dead >= 0 && !injected) {
        /* it may have done its part and left since advance looked: look again */
        std::vector<ShCond> again;
        uint64_t all2 = 0;
        bool done2 = true;
        for (Part &p : parts) done2 &= advance(p, &again, &all2);
        if (done2) return complete();
        if (!(all2 >> dead & 1)) dead = -1;
    }
    if (dead >= 0) {
        for (Part &p : parts) {
            bool waits_for = false;
            for (int j = 0; j < p.c->nranks; j++) waits_for |= p.c->world[j] == dead;
            if (waits_for)
                p.c->set_error(ncclRemoteError, "rank " + std::to_string(dead) + " exited without completing its part of " +
                               name + " (rank " + std::to_string(p.c->wrank()) + " waits for it)");
        }
    }
    for (Part &p : parts) p.c->check_grace();
    if (!waits.empty()) waiter.deadlock_check();
    return false;
}

/* ---------------------------------------------------------------------------
 * Issuing: argument checks, then a stream op (or a part of the open group). */

struct GroupState {
    pid_t pid = 0;
    int depth = 0;
    std::vector<Part> parts;
    cudaStream_t stream = nullptr;
};
thread_local GroupState t_group;

GroupState &group() {
    if (t_group.pid != getpid()) {  /* forked inside a group: the child starts without one */
        t_group = GroupState();
        t_group.pid = getpid();
    }
    return t_group;
}

void count_call(ncclComm *c) {
    if (!c || !c->w) return;
    __atomic_fetch_add(&c->w->h->rank[c->w->rank].calls, 1, __ATOMIC_ACQ_REL);
    __atomic_store_n(&c->w->h->rank[c->w->rank].host_blocked, 0, __ATOMIC_RELEASE);  /* the host is issuing */
}

void check_comm(ncclComm *c, const char *fn) {
    if (!c) nccl_fail(-1, "%s: comm is NULL", fn);
    if (c->destroyed.load()) nccl_fail(c->wrank(), "%s: comm %d was destroyed", fn, c->uid);
    if (c->aborted.load()) nccl_fail(c->wrank(), "%s: comm %d was aborted", fn, c->uid);
}

void check_buf(ncclComm *c, const char *fn, const char *which, const void *p, size_t bytes) {
    if (!bytes) return;
    int owner = emu_dev_owner(p, bytes);
    if (owner != c->dev) {
        char where[64];
        if (owner < 0) snprintf(where, sizeof where, "not inside one live device allocation");
        else snprintf(where, sizeof where, "memory of GPU %d", owner);
        nccl_fail(c->wrank(), "%s on comm %d: %s %p (%zu bytes) is not device memory of GPU %d (it is %s)", fn, c->uid,
                  which, p, bytes, c->dev, where);
    }
}

bool overlaps(const void *a, size_t an, const void *b, size_t bn) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return an && bn && x < y + bn && y < x + an;
}

void enqueue(cudaStream_t s, std::vector<Part> parts) {
    NcclOp *op = new NcclOp;
    std::map<ncclComm *, uint64_t> seen;
    std::map<ncclComm *, uint64_t> stage;
    for (size_t i = 0; i < parts.size(); i++) {
        Part &p = parts[i];
        if (!seen.count(p.c)) seen[p.c] = ++p.c->tickets;
        stage[p.c] += (p.out_bytes() + STAGE_ALIGN - 1) / STAGE_ALIGN * STAGE_ALIGN;
        /* in order after the group's previous collective of the same comm, or
         * its previous send to the same peer: a channel and a member's
         * descriptor hold one operation at a time */
        auto coll = [](const Part &x) { return x.kind != K_SEND && x.kind != K_RECV; };
        if (p.kind != K_RECV)
            for (int j = (int)i - 1; j >= 0; j--)
                if (parts[j].c == p.c && ((coll(p) && coll(parts[j])) ||
                                          (p.kind == K_SEND && parts[j].kind == K_SEND && parts[j].peer == p.peer))) {
                    p.prev = j;
                    break;
                }
        size_t es = p.es();
        switch (p.kind) {
        case K_SEND: op->access.push_back({p.send, p.count * es, false}); break;
        case K_RECV: op->access.push_back({p.recv, p.count * es, true}); break;
        case K_ALLREDUCE: case K_REDUCESCATTER: case K_ALLGATHER: case K_REDUCE: case K_BROADCAST: {
            size_t in = p.kind == K_REDUCESCATTER ? p.count * p.c->nranks * es : p.count * es;
            size_t out = p.kind == K_ALLGATHER ? p.count * p.c->nranks * es : p.count * es;
            bool reads = p.kind != K_BROADCAST || p.c->rank == p.root;
            bool writes = p.kind != K_REDUCE || p.c->rank == p.root;
            if (reads && in) op->access.push_back({p.send, in, false});
            if (writes && out) op->access.push_back({p.recv, out, true});
            break;
        }
        }
        op->name += (i ? "; " : "") + p.name;
    }
    /* a group's parts are posted together: all of its stage at once */
    for (auto &sb : stage)
        if (sb.second > sb.first->w->stage_bytes)
            stage_check(sb.first, sb.second, parts.size() > 1 ? "group {" + op->name + "}" : op->name);
    if (parts.size() > 1) op->name = "group {" + op->name + "}";
    for (auto &t : seen) op->tickets.push_back(t);
    op->parts = std::move(parts);
    emu_stream_enqueue(s, op);
}

ncclResult_t issue(Part p, cudaStream_t s) {
    const char *fn = kind_name(p.kind);
    ncclComm *c = p.c;
    check_comm(c, fn);
    count_call(c);
    Proc *pr = proc();
    p.index = ++pr->ops;
    if (pr->stall.rank == c->wrank() && pr->stall.op == p.index) {
        fprintf(stderr, "emulated NCCL: rank %d: stalling for ever in its operation %llu, %s on comm %d (EMU_NCCL_STALL)\n",
                c->wrank(), (unsigned long long)p.index, fn, c->uid);
        fflush(stderr);
        for (;;) pause();
    }
    if (p.dt != ncclFloat32 && p.dt != ncclBfloat16 && p.dt != ncclInt32)
        nccl_fail(c->wrank(), "%s on comm %d: datatype %d is not emulated (float32, bfloat16 and int32 are)", fn, c->uid, p.dt);
    bool reduces = p.kind == K_ALLREDUCE || p.kind == K_REDUCESCATTER || p.kind == K_REDUCE;
    if (reduces && p.op != ncclSum && p.op != ncclAvg && p.op != ncclMax)
        nccl_fail(c->wrank(), "%s on comm %d: reduction op %d is not emulated (sum, avg and max are)", fn, c->uid, p.op);
    if (reduces && p.op == ncclMax && p.dt != ncclInt32)
        nccl_fail(c->wrank(), "%s on comm %d: ncclMax on floats is not emulated (int32 only)", fn, c->uid);
    if (reduces && p.op == ncclAvg && p.dt == ncclInt32)
        nccl_fail(c->wrank(), "%s on comm %d: ncclAvg on int32 is not emulated (float types only)", fn, c->uid);
    if (!reduces) p.op = -1;
    if ((p.kind == K_BROADCAST || p.kind == K_REDUCE) && (p.root < 0 || p.root >= c->nranks))
        nccl_fail(c->wrank(), "%s on comm %d: root %d outside 0..%d", fn, c->uid, p.root, c->nranks - 1);
    if (p.kind != K_BROADCAST && p.kind != K_REDUCE) p.root = -1;
    if ((p.kind == K_SEND || p.kind == K_RECV) && (p.peer < 0 || p.peer >= c->nranks))
        nccl_fail(c->wrank(), "%s on comm %d: peer %d outside 0..%d", fn, c->uid, p.peer, c->nranks - 1);
    int err = c->async_err.load();
    if (err != ncclSuccess) {
        set_last_error(("comm has an async error: " + c->err_msg).c_str());
        return (ncclResult_t)err;
    }
    p.opnum = ++c->ops;
    if (p.kind == K_SEND) p.seq = ++c->sends[p.peer];
    else if (p.kind == K_RECV) p.seq = ++c->recvs[p.peer];
    else p.seq = ++c->colls;
    p.name = describe(p.kind, p.count, p.dt, p.op, p.root, p.peer) + " on comm " + std::to_string(c->uid) + " #" +
             std::to_string(p.opnum);
    /* buffers: device memory of the comm's GPU, overlapping only in NCCL's in-place forms */
    size_t es = p.es(), n = c->nranks;
    switch (p.kind) {
    case K_SEND: check_buf(c, fn, "sendbuff", p.send, p.count * es); break;
    case K_RECV: check_buf(c, fn, "recvbuff", p.recv, p.count * es); break;
    case K_ALLREDUCE: case K_BROADCAST: case K_REDUCE: {
        bool reads = p.kind != K_BROADCAST || c->rank == p.root;
        bool writes = p.kind != K_REDUCE || c->rank == p.root;
        if (reads) check_buf(c, fn, "sendbuff", p.send, p.count * es);
        if (writes) check_buf(c, fn, "recvbuff", p.recv, p.count * es);
        if (reads && writes && p.send != p.recv && overlaps(p.send, p.count * es, p.recv, p.count * es))
            nccl_fail(c->wrank(), "%s: recvbuff %p overlaps sendbuff %p (%zu bytes each); in place needs recvbuff == "
                      "sendbuff", p.name.c_str(), (void *)p.recv, (const void *)p.send, p.count * es);
        break;
    }
    case K_REDUCESCATTER:
        check_buf(c, fn, "sendbuff", p.send, p.count * n * es);
        check_buf(c, fn, "recvbuff", p.recv, p.count * es);
        if (overlaps(p.send, p.count * n * es, p.recv, p.count * es) && p.recv != p.send + c->rank * p.count * es)
            nccl_fail(c->wrank(), "%s: recvbuff %p overlaps sendbuff %p; in place needs recvbuff == sendbuff + rank * "
                      "recvcount (rank %d)", p.name.c_str(), (void *)p.recv, (const void *)p.send, c->rank);
        break;
    case K_ALLGATHER:
        check_buf(c, fn, "sendbuff", p.send, p.count * es);
        check_buf(c, fn, "recvbuff", p.recv, p.count * n * es);
        if (overlaps(p.send, p.count * es, p.recv, p.count * n * es) && p.send != p.recv + c->rank * p.count * es)
            nccl_fail(c->wrank(), "%s: recvbuff %p overlaps sendbuff %p; in place needs sendbuff == recvbuff + rank * "
                      "sendcount (rank %d)", p.name.c_str(), (void *)p.recv, (const void *)p.send, c->rank);
        break;
    }
    stage_check(c, p.out_bytes(), p.name);
    GroupState &g = group();
    if (g.depth > 0) {
        if (!g.parts.empty() && g.stream != s)
            nccl_fail(c->wrank(), "%s: the operations of one group on different streams are not emulated", p.name.c_str());
        g.stream = s;
        g.parts.push_back(p);
        return ncclSuccess;
    }
    enqueue(s, {p});
    return ncclSuccess;
}

Part make(int kind, const void *send, void *recv, size_t count, ncclDataType_t dt, int op, int root, int peer,
          ncclComm_t comm) {
    Part p;
    p.c = comm;
    p.kind = kind;
    p.send = (const char *)send;
    p.recv = (char *)recv;
    p.count = count;
    p.dt = dt;
    p.op = op;
    p.root = root;
    p.peer = peer;
    p.seq = p.opnum = p.index = 0;
    return p;
}

/* ---------------------------------------------------------------------------
 * Joining a world, and splitting communicators: blocking host calls. */

void parse_id(const ncclUniqueId &id, uint64_t *tag, std::string *path) {
    uint64_t magic;
    memcpy(&magic, id.internal, 8);
    memcpy(tag, id.internal + 8, 8);
    if (magic != ID_MAGIC || !memchr(id.internal + 16, 0, NCCL_UNIQUE_ID_BYTES - 16))
        nccl_fail(-1, "ncclCommInitRank: the id is not one from ncclGetUniqueId (an id handed over wrongly?)");
    *path = id.internal + 16;
}

ncclComm *new_comm(World *w, int uid, int rank) {
    ncclComm *c = new ncclComm;
    ShComm *sc = w->comm(uid);
    c->w = w;
    c->uid = uid;
    c->rank = rank;
    c->nranks = ld(sc->nranks);
    c->dev = emu_current_device();
    c->world.assign(sc->members, sc->members + c->nranks);
    c->sends.assign(c->nranks, 0);
    c->recvs.assign(c->nranks, 0);
    return c;
}

/* Waits (blocking the calling thread) until ok(); fails naming what never
 * came after `timeout` s, or at once when a rank it waits for died. */
template <class F>
void host_wait(World *w, int comm, const std::string &what, double timeout, F missing, const char *unlink_path = nullptr) {
    Waiter wt;
    wt.start(w);
    double t0 = now_s();
    for (long round = 0;; round++) {
        uint64_t m = missing();
        if (!m) break;
        std::vector<ShCond> conds;
        for (int r = 0; r < w->nranks; r++)
            if (m >> r & 1) conds.push_back(ShCond{comm, W_HOST, 0, 0, 0, r, 0});
        wt.publish(comm, 0, what, conds);
        int dead = wt.dead_peer(m);
        if (dead >= 0) {
            wt.finish();
            nccl_fail(w->rank, "rank %d exited without calling its part of %s (ranks %s missing)", dead, what.c_str(),
                      rank_list(m).c_str());
        }
        wt.deadlock_check();
        if (now_s() - t0 > timeout) {
            wt.finish();
            if (unlink_path) unlink(unlink_path);  /* nobody else may come to do it */
            nccl_fail(w->rank, "%s: ranks %s never came (waited %g s)", what.c_str(), rank_list(m).c_str(), timeout);
        }
        usleep(round < 100 ? 100 : round < 1000 ? 1000 : 10000);
    }
    wt.finish();
}

}  // namespace

/* ---------------------------------------------------------------------------
 * NCCL's API. */

extern "C" {

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

/* The last error this process recorded (the comm is not consulted). */
const char *ncclGetLastError(ncclComm_t) { return proc()->last_error; }

/* The header's version, or EMU_NCCL_VERSION (a code such as 22500) to play
 * an older library: comm_nccl.c orders its groups' streams itself before
 * NCCL 2.26. */
ncclResult_t ncclGetVersion(int *version) {
    if (!version) return ncclInvalidArgument;
    const char *v = getenv("EMU_NCCL_VERSION");
    *version = v ? atoi(v) : NCCL_VERSION_CODE;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    if (!id) nccl_fail(-1, "ncclGetUniqueId: id is NULL");
    memset(id, 0, sizeof *id);
    uint64_t tag = 0;
    while (tag == 0)
        if (getrandom(&tag, sizeof tag, 0) != (ssize_t)sizeof tag) tag = ((uint64_t)getpid() << 32) ^ (uint64_t)(now_s() * 1e9);
    const char *dir = getenv("TMPDIR");
    char path[NCCL_UNIQUE_ID_BYTES];
    int n = dir && *dir ? snprintf(path, sizeof path, "%s/emu_nccl.%d.%016llx", dir, (int)getpid(), (unsigned long long)tag) : -1;
    if (n < 0 || n >= (int)sizeof path - 16)  /* a long $TMPDIR does not fit the id */
        snprintf(path, sizeof path, "/tmp/emu_nccl.%d.%016llx", (int)getpid(), (unsigned long long)tag);
    memcpy(id->internal, &ID_MAGIC, 8);
    memcpy(id->internal + 8, &tag, 8);
    memcpy(id->internal + 16, path, strlen(path) + 1);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank) {
    if (!out) nccl_fail(rank, "ncclCommInitRank: comm is NULL");
    if (nranks < 1 || nranks > MAXR) nccl_fail(rank, "ncclCommInitRank: nranks %d outside 1..%d", nranks, MAXR);
    if (rank < 0 || rank >= nranks) nccl_fail(rank, "ncclCommInitRank: rank %d outside 0..%d", rank, nranks - 1);
    Proc *pr = proc();
    uint64_t tag;
    std::string path;
    parse_id(id, &tag, &path);
    uint64_t stage_mb = 64;
    if (const char *s = getenv("EMU_NCCL_STAGE_MB")) {
        char *end;
        stage_mb = strtoull(s, &end, 10);
        if (!*s || *end || stage_mb < 1 || stage_mb > 65536) nccl_fail(rank, "EMU_NCCL_STAGE_MB must be 1..65536, not %s", s);
    }
    uint64_t stage_bytes = stage_mb << 20;
    size_t bytes = stages_off() + stage_bytes * nranks;
    int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) nccl_fail(rank, "ncclCommInitRank: cannot open %s: %s", path.c_str(), strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) == 0 && (size_t)sb.st_size < bytes && ftruncate(fd, bytes) != 0)
        nccl_fail(rank, "ncclCommInitRank: cannot size %s to %zu bytes: %s", path.c_str(), bytes, strerror(errno));
    void *m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) nccl_fail(rank, "ncclCommInitRank: cannot map %s: %s", path.c_str(), strerror(errno));
    ShWorld *h = (ShWorld *)m;
    /* the first to come sets the world's shape; the others must agree */
    uint64_t zero64 = 0;
    int32_t zero = 0;
    __atomic_compare_exchange_n(&h->tag, &zero64, tag, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    if (ld(h->tag) != tag) nccl_fail(rank, "ncclCommInitRank: %s belongs to another id", path.c_str());
    __atomic_compare_exchange_n(&h->nranks, &zero, nranks, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    if (ld(h->nranks) != nranks)
        nccl_fail(rank, "ncclCommInitRank: this rank says nranks %d, an earlier one said %d", nranks, ld(h->nranks));
    zero64 = 0;
    __atomic_compare_exchange_n(&h->stage_bytes, &zero64, stage_bytes, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    if (ld(h->stage_bytes) != stage_bytes)
        nccl_fail(rank, "ncclCommInitRank: EMU_NCCL_STAGE_MB differs between ranks (%llu here, %llu MiB before)",
                  (unsigned long long)stage_mb, (unsigned long long)(ld(h->stage_bytes) >> 20));
    zero = 0;
    if (!__atomic_compare_exchange_n(&h->rank[rank].pid, &zero, (int32_t)getpid(), false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        nccl_fail(rank, "ncclCommInitRank: rank %d joined twice (pids %d and %d)", rank, (int)ld(h->rank[rank].pid), (int)getpid());
    World *w = new World;
    w->h = h;
    w->base = (char *)m;
    w->bytes = bytes;
    w->rank = rank;
    w->nranks = nranks;
    w->stage_bytes = stage_bytes;
    ShComm *world = w->comm(0);
    world->nranks = nranks;
    world->members[rank] = rank;
    world->parent = -1;
    {
        std::lock_guard<std::mutex> g(pr->lock);
        pr->worlds.push_back(w);
    }
    __atomic_fetch_add(&h->joined, 1, __ATOMIC_ACQ_REL);
    host_wait(w, 0, "ncclCommInitRank(nranks " + std::to_string(nranks) + ")", 60, [&] {
        uint64_t miss = 0;
        if (ld(h->joined) == nranks) return miss;
        for (int r = 0; r < nranks; r++)
            if (!ld(h->rank[r].pid)) miss |= 1ull << r;
        /* every pid is in but some rank is still filling its part of the table */
        return miss ? miss : (uint64_t)((nranks == 64 ? ~0ull : (1ull << nranks) - 1) & ~(1ull << rank));
    }, path.c_str());
    unlink(path.c_str());  /* every rank mapped it: no file is left behind, whatever happens next */
    st(world->ready, 1);
    *out = new_comm(w, 0, rank);
    return ncclSuccess;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *) {
    check_comm(comm, "ncclCommSplit");
    count_call(comm);
    if (!newcomm) nccl_fail(comm->wrank(), "ncclCommSplit: newcomm is NULL");
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
        nccl_fail(comm->wrank(), "ncclCommSplit on comm %d: color %d (non-negative, or NCCL_SPLIT_NOCOLOR)", comm->uid, color);
    World *w = comm->w;
    ShComm *sc = comm->sh();
    int n = comm->nranks, me = comm->rank;
    uint64_t s = ++comm->splits;
    std::string what = "ncclCommSplit #" + std::to_string(s) + " of comm " + std::to_string(comm->uid);
    ShMember &mine = sc->m[me];
    mine.color = color;
    mine.key = key;
    st(mine.split_posted, s);
    auto missing = [&](uint64_t ShMember::*field) {
        return [&, field] {
            uint64_t miss = 0;
            for (int j = 0; j < n; j++)
                if (ld(sc->m[j].*field) < s) miss |= 1ull << comm->world[j];
            return miss;
        };
    };
    host_wait(w, comm->uid, what, 60, missing(&ShMember::split_posted));
    /* members of my colour, ordered by (key, parent rank) */
    std::vector<int> mem;
    for (int j = 0; j < n; j++)
        if (color != NCCL_SPLIT_NOCOLOR && sc->m[j].color == color) mem.push_back(j);
    std::stable_sort(mem.begin(), mem.end(), [&](int a, int b) { return sc->m[a].key < sc->m[b].key; });
    ncclComm *nc = nullptr;
    if (!mem.empty()) {
        int leader = mem[0];
        if (leader == me) {
            int uid = __atomic_fetch_add(&w->h->next_comm, 1, __ATOMIC_ACQ_REL) + 1;
            if (uid >= MAXC) nccl_fail(w->rank, "%s: more than %d communicators in one world", what.c_str(), MAXC - 1);
            ShComm *nsc = w->comm(uid);
            nsc->nranks = (int)mem.size();
            nsc->parent = comm->uid;
            for (size_t i = 0; i < mem.size(); i++) nsc->members[i] = comm->world[mem[i]];
            st(nsc->ready, 1);
            mine.split_result = uid;
            st(mine.split_result_seq, s);
        }
        host_wait(w, comm->uid, what, 60, [&] {
            return ld(sc->m[leader].split_result_seq) < s ? 1ull << comm->world[leader] : 0;
        });
        int uid = sc->m[leader].split_result;
        int pos = (int)(std::find(mem.begin(), mem.end(), me) - mem.begin());
        nc = new_comm(w, uid, pos);
        nc->dev = comm->dev;
    }
    st(mine.split_done, s);  /* every member read the others' colours: the slots may be reused */
    host_wait(w, comm->uid, what, 60, missing(&ShMember::split_done));
    *newcomm = nc;
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
    check_comm(comm, "ncclCommCount");
    *count = comm->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
    check_comm(comm, "ncclCommUserRank");
    *rank = comm->rank;
    return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
    check_comm(comm, "ncclCommCuDevice");
    *device = comm->dev;
    return ncclSuccess;
}

/* Marks the comm destroyed; the object stays (an op still queued on a
 * stream may refer to it), and so does the mapping. */
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    if (comm->destroyed.exchange(true)) nccl_fail(comm->wrank(), "ncclCommDestroy: comm %d destroyed twice", comm->uid);
    return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
    check_comm(comm, "ncclCommFinalize");
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    int32_t zero = 0;
    __atomic_compare_exchange_n(&comm->sh()->aborted_by, &zero, comm->wrank() + 1, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    comm->aborted.store(true);
    comm->destroyed.store(true);
    return ncclSuccess;
}

/* The comm's async error. Also looks, itself, whether a rank the comm's
 * pending op waits for died, so a watchdog that polls while no thread
 * drives the stream still learns it. */
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *err) {
    if (!comm) nccl_fail(-1, "ncclCommGetAsyncError: comm is NULL");
    if (!err) nccl_fail(comm->wrank(), "ncclCommGetAsyncError: asyncError is NULL");
    /* dead peers are found by the pending op itself (a watchdog's event
     * queries step it), against what it still waits for at that moment: a
     * mask kept here could be stale by the time a peer leaves */
    *err = (ncclResult_t)comm->async_err.load();
    return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
    group().depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
    GroupState &g = group();
    if (g.depth <= 0) nccl_fail(-1, "ncclGroupEnd without ncclGroupStart");
    if (--g.depth) return ncclSuccess;
    std::vector<Part> parts;
    parts.swap(g.parts);
    if (!parts.empty()) enqueue(g.stream, std::move(parts));
    g.stream = nullptr;
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
    return issue(make(K_ALLREDUCE, sendbuff, recvbuff, count, datatype, op, 0, 0, comm), stream);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    return issue(make(K_REDUCESCATTER, sendbuff, recvbuff, recvcount, datatype, op, 0, 0, comm), stream);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
    return issue(make(K_ALLGATHER, sendbuff, recvbuff, sendcount, datatype, 0, 0, 0, comm), stream);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
    return issue(make(K_BROADCAST, sendbuff, recvbuff, count, datatype, 0, root, 0, comm), stream);
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
    return issue(make(K_REDUCE, sendbuff, recvbuff, count, datatype, op, root, 0, comm), stream);
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    return issue(make(K_SEND, sendbuff, nullptr, count, datatype, 0, 0, peer, comm), stream);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    return issue(make(K_RECV, nullptr, recvbuff, count, datatype, 0, 0, peer, comm), stream);
}

}  // extern "C"
