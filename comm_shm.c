/* comm_shm.c: the shared-memory backend of comm.h: one segment every rank of
 * a host maps, its collectives and its point-to-point engine (DESIGN.md,
 * "Processes": CPU ranks, and several ranks sharing one GPU). Its
 * all-reduce is 2.2 DDP's (auto-parallel-partitioning.txt), its sends are
 * 3.2 流水线并行's. It calls down only: comm_impl.h (the segment's header,
 * comm_die) and rendezvous.c, never comm.c nor the NCCL backend.
 *
 * Every rank owns three staging areas in one segment (IN, OUT, P2P;
 * area_bytes each) and a slot of counters (ShmSlot, comm_impl.h). Rank r
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
 * The segment comes from the fork launcher (comm_launch.c, anonymous and
 * inherited), from shm_join under an external launcher (named, handed out
 * over the TCP rendezvous to the ranks that prove the job token, unlinked
 * once every rank mapped it), or from shm_map_private for a rank alone.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include "comm_impl.h"

/* Measured on 2 cores (test_comm: 8 ranks; bench_comm: 1 KB all-reduce):
 * 64 spins + 16 yields: suite 5.0 s, 2.0 us with 2 ranks, 58 us with 8;
 * sleeping at once: 4.7 s, 14.5 us, 105 us; spinning 20000 times: 11.3 s,
 * 686 us, 4329 us (the spinner starves the rank it waits for). */
#define SPINS 64                 /* busy polls before yielding the core */
#define YIELDS 16                /* sched_yield polls before sleeping */
#define SLEEP_NS 10000000L       /* a sleeping waiter looks at the abort flag this often */
#define PID_CHECK_S 0.5          /* external launcher: how often a waiter checks its peer's process */
#define TILE 1024                /* elements reduced at a time */

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* ---- the shared segment (its header: comm_impl.h) ------------------------------ */

static char *shm_area(ShmHeader *h, int rank, int area) {
    return (char *)h + h->data_offset + ((size_t)rank * DATA_AREAS + (size_t)area) * h->area_bytes;
}

static void futex_wait(_Atomic uint32_t *w, uint32_t seen, long ns) {
    struct timespec ts = { 0, ns };
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT, seen, &ts, NULL, 0);
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
    shm_describe_status(code, how, sizeof how);
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
    shm_describe_status(code, how, sizeof how);
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
 * before the counter so that a ring between the two wakes the sleep. Exits
 * (comm_die) when the job aborts or peer left without getting there. */
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
        } else if (op == COMM_MAX) {  /* COMM_I32 */
            int32_t *o = (int32_t *)dst + k0;
            memcpy(o, (const int32_t *)src[0] + k0, m * sizeof(int32_t));
            for (int j = 1; j < ns; j++) {
                const int32_t *s = (const int32_t *)src[j] + k0;
                for (size_t k = 0; k < m; k++) o[k] = s[k] > o[k] ? s[k] : o[k];
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

/* ---- the collectives (comm.c made sure: member, size > 1, n > 0) ----------- */

static size_t chunk_elems(Comm *c, CommDtype t) { return c->impl->shm->area_bytes / comm_dtype_size(t); }

void shm_all_reduce(CommGroup *g, Dev *d, void *buf, size_t n, CommDtype t, CommRed op) {
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

void shm_reduce_scatter(CommGroup *g, Dev *d, void *out, const void *in, size_t n,
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

void shm_all_gather(CommGroup *g, Dev *d, void *out, const void *in, size_t n, CommDtype t) {
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

void shm_broadcast(CommGroup *g, Dev *d, void *buf, size_t n, CommDtype t, int root) {
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

void shm_reduce(CommGroup *g, Dev *d, void *buf, size_t n, CommDtype t, CommRed op, int root) {
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

void shm_barrier(CommGroup *g) {
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
void shm_p2p_run(Comm *c, P2POp *ops, int n) {
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

/* ---- mapping the segment, leaving it --------------------------------------------- */

/* "ranks 2 and 3": the ranks whose pid is still 0 in the segment (those
 * that have not mapped it). */
static void unmapped_ranks(ShmHeader *h, char *buf, size_t len) {
    int n = 0, shown = 0;
    for (int r = 0; r < h->world; r++) n += !atomic_load(&h->slot[r].pid);
    size_t k = (size_t)snprintf(buf, len, "rank%s", n > 1 ? "s" : "");
    for (int r = 0; r < h->world && k + 16 < len; r++)
        if (!atomic_load(&h->slot[r].pid)) {
            shown++;
            k += (size_t)snprintf(buf + k, len - k, "%s%d", shown == 1 ? " " : shown == n ? " and " : ", ", r);
        }
}

/* After the rendezvous: waits, by a deadline, until rank 0 has served every
 * rank (ranks other than 0) and every rank has mapped the segment. 0, or -1
 * with err naming whom it waited for (the job aborting; rank 0 gone; the
 * ranks that never mapped it). */
static int shm_wait_joined(Comm *c, char *err, size_t errlen) {
    ShmHeader *h = c->impl->shm;
    int W = h->world;
    double served_by = now_s() + RENDEZVOUS_S + JOIN_S, mapped_by = now_s() + JOIN_S, next_check = 0;
    for (;;) {
        if (shm_abort_said(h, c->rank, "while the ranks joined", err, errlen)) return -1;
        int served = atomic_load(&h->served), mapped = atomic_load(&h->mapped);
        if (served && mapped == W) return 0;
        double now = now_s();
        if (!served) {
            mapped_by = now + JOIN_S;   /* the others map it once rank 0 served them */
            int32_t pid0 = atomic_load(&h->slot[0].pid);
            if (now >= next_check) {
                next_check = now + PID_CHECK_S;
                if (!process_alive(pid0)) {
                    snprintf(err, errlen, "rank %d stops: rank 0 (pid %d) is gone before it served every rank",
                             c->rank, (int)pid0);
                    return -1;
                }
            }
            if (now >= served_by) {
                snprintf(err, errlen, "rank %d stops: rank 0 did not serve every rank within %g s", c->rank,
                         RENDEZVOUS_S + JOIN_S);
                return -1;
            }
        } else if (now >= mapped_by) {
            char who[160];
            unmapped_ranks(h, who, sizeof who);
            snprintf(err, errlen, "%s of %d got the shared segment's name from rank 0 but did not map it within "
                     "%g s", who, W, JOIN_S);
            return -1;
        }
        nanosleep(&(struct timespec){ 0, 2000000L }, NULL);
    }
}

/* The named segment, made (rank 0) or opened (the others) at im->shm. */
static int shm_create(Comm *c, const char *name, size_t bytes, char *err, size_t errlen) {
    CommImpl *im = c->impl;
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
        snprintf(err, errlen, "cannot create shared memory %s: %s", name, strerror(errno));
        return -1;
    }
    snprintf(im->shm_name, sizeof im->shm_name, "%s", name);
    void *p = ftruncate(fd, (off_t)bytes) == 0 ? mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                                               : MAP_FAILED;
    close(fd);
    if (p == MAP_FAILED) {
        snprintf(err, errlen, "cannot map %zu bytes of shared memory %s: %s", bytes, name, strerror(errno));
        shm_unlink(name);
        im->shm_name[0] = 0;
        return -1;
    }
    shm_header_init(p, c->world_size);
    im->shm = p;
    im->shm_bytes = bytes;
    return 0;
}

static int shm_open_theirs(Comm *c, const char *name, size_t bytes, char *err, size_t errlen) {
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
    if (p == MAP_FAILED || ((ShmHeader *)p)->magic != SHM_MAGIC || ((ShmHeader *)p)->world != c->world_size) {
        snprintf(err, errlen, "shared memory %s is not the segment of a %d-rank job", name, c->world_size);
        if (p != MAP_FAILED) munmap(p, bytes);
        return -1;
    }
    c->impl->shm = p;
    c->impl->shm_bytes = bytes;
    return 0;
}

/* External launcher on one host: rank 0 makes a named segment and hands its
 * name out over the rendezvous (to this job's ranks only); each rank maps it
 * and writes its pid; the name is unlinked once all mapped it, or when the
 * start fails on rank 0, which then also raises the abort word for those
 * that mapped it already. */
int shm_join(Comm *c, const CommLaunch *l, char *err, size_t errlen) {
    CommImpl *im = c->impl;
    int W = c->world_size, rc;
    size_t bytes = shm_segment_bytes(W);
    char name[64] = "";
    RdzvJob j;
    comm_rdzv_job(l, l->master_addr[0] ? l->master_addr : "127.0.0.1", &j);
    if (c->rank == 0) {
        snprintf(name, sizeof name, "/train-%d-%d", (int)getpid(), l->master_port);
        if (shm_create(c, name, bytes, err, errlen)) return -1;
        atomic_store(&im->shm->slot[0].pid, (int32_t)getpid());
        atomic_store(&im->shm->mapped, 1);
    }
    if ((rc = rdzv_bcast(&j, name, sizeof name, err, errlen)) != 0) {
        if (c->rank == 0) {   /* those served already stop at their wait below */
            shm_abort_set(im->shm, 0, rc == RDZV_MISMATCH ? 2 : 1);
            shm_unlink(name);
            im->shm_name[0] = 0;
        }
        return rc;
    }
    name[sizeof name - 1] = 0;
    if (c->rank != 0) {
        if (shm_open_theirs(c, name, bytes, err, errlen)) return -1;
        atomic_store(&im->shm->slot[c->rank].pid, (int32_t)getpid());
        if (atomic_fetch_add(&im->shm->mapped, 1) + 1 == W) shm_unlink(name);
    } else {
        atomic_store(&im->shm->served, 1);
    }
    im->check_pids = 1;
    rc = shm_wait_joined(c, err, errlen);
    if (rc && c->rank == 0) shm_abort_set(im->shm, 0, 1);
    if (rc || c->rank == 0) {   /* mapped by all, or never to be (whoever is left): the name goes */
        shm_unlink(name);
        im->shm_name[0] = 0;
    }
    return rc;
}

int shm_map_private(Comm *c, char *err, size_t errlen) {
    CommImpl *im = c->impl;
    im->shm_bytes = shm_segment_bytes(1);
    im->shm = mmap(NULL, im->shm_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (im->shm == MAP_FAILED) {
        im->shm = NULL;
        snprintf(err, errlen, "cannot map %zu bytes: %s", im->shm_bytes, strerror(errno));
        return -1;
    }
    shm_header_init(im->shm, 1);
    return 0;
}

void shm_leave(Comm *c) {
    CommImpl *im = c->impl;
    ShmSlot *me = &im->shm->slot[c->rank];
    if (!atomic_load(&me->exited)) {   /* tell peers still waiting that I am gone */
        atomic_store(&me->exit_code, 0);
        atomic_store(&me->exited, 1);
        shm_ring_all(im->shm);
    }
    if (im->shm_name[0]) shm_unlink(im->shm_name);
    munmap(im->shm, im->shm_bytes);
}
