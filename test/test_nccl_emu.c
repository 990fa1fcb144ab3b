/* test/test_nccl_emu.c: the emulated NCCL (test/emu/emu_nccl.cpp) against
 * NCCL's documented semantics, over the emulated CUDA runtime, no GPU.
 *
 * Each run forks 2..8 ranks, one emulated GPU each (EMU_GPUS=8,
 * cudaSetDevice(rank)); rank 0 makes the unique id and hands it to the others
 * through pipes, as comm.c hands it over its shared segment. The ranks fill
 * device buffers with cudaMemcpyAsync, call NCCL on a stream of their own,
 * and compare what comes back, bit for bit, with a host reference computed
 * from every member's inputs (sums in member order in float32, avg the sum
 * over n, bf16 rounded once to nearest even: the emulation's documented
 * order, so every member must get these exact bits). Counts of checks and
 * the first mismatch of each rank come back through a shared mapping.
 *
 * Then the loud failures, each a job of its own (a process group whose
 * ranks' output is captured): the job must exit non-zero and its output
 * must contain the emulation's message. They run concurrently, each bounded
 * by a deadline, so a failure the emulation missed shows as a hang caught.
 */
#define _GNU_SOURCE
#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

#define MAXN 8
#define MAXLEN 1000

typedef struct Shared {         /* per rank, across fork */
    int checks[MAXN], fails[MAXN];
    char detail[MAXN][320];
} Shared;

typedef struct Ctx {
    int rank, n;
    ncclComm_t world;
    cudaStream_t s;
    Shared *sh;
} Ctx;

typedef void (*RankFn)(Ctx *c);

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void die(const char *what) {
    fprintf(stderr, "test_nccl_emu: %s\n", what);
    fflush(stdout);
    exit(2);
}

#define CU(call) do { if ((call) != cudaSuccess) die(#call); } while (0)
#define NC(call) do { ncclResult_t r_ = (call); if (r_ != ncclSuccess) { \
    fprintf(stderr, "%s: %s\n", #call, ncclGetErrorString(r_)); die("NCCL call failed"); } } while (0)

/* Records one check of this rank; the first failure's detail is kept. */
static void rank_check(Ctx *c, int ok, const char *fmt, ...) {
    c->sh->checks[c->rank]++;
    if (ok) return;
    if (!c->sh->fails[c->rank]++) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->sh->detail[c->rank], sizeof c->sh->detail[c->rank], fmt, ap);
        va_end(ap);
    }
}

/* ---- running ranks ----------------------------------------------------------------- */

/* Forks n ranks running fn, each with its own device, stream and world
 * comm; returns 0 when all exited 0, else the first non-zero status. With
 * reap_early (failure jobs), once one rank failed the others get 2.5 s and
 * are then killed (a rank told to stall never returns). */
static int run_ranks(int n, RankFn fn, Shared *sh, int reap_early) {
    int pipes[MAXN][2];
    pid_t pids[MAXN];
    for (int r = 1; r < n; r++)
        if (pipe(pipes[r])) die("pipe");
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        if (pids[r] < 0) die("fork");
        if (pids[r]) continue;
        ncclUniqueId id;
        if (r == 0) {
            NC(ncclGetUniqueId(&id));
            for (int q = 1; q < n; q++)
                if (write(pipes[q][1], &id, sizeof id) != (ssize_t)sizeof id) die("write id");
        } else if (read(pipes[r][0], &id, sizeof id) != (ssize_t)sizeof id) {
            die("read id");
        }
        Ctx c = {r, n, NULL, NULL, sh};
        CU(cudaSetDevice(r));
        CU(cudaStreamCreateWithFlags(&c.s, cudaStreamNonBlocking));
        NC(ncclCommInitRank(&c.world, n, id, r));
        fn(&c);
        CU(cudaStreamSynchronize(c.s));
        NC(ncclCommDestroy(c.world));
        fflush(stdout);
        exit(sh && sh->fails[r] ? 1 : 0);
    }
    for (int r = 1; r < n; r++) {
        close(pipes[r][0]);
        close(pipes[r][1]);
    }
    int status = 0, left = n;
    double kill_at = 0;
    while (left) {
        int progressed = 0;
        for (int r = 0; r < n; r++) {
            int st;
            if (!pids[r] || waitpid(pids[r], &st, WNOHANG) != pids[r]) continue;  /* its own ranks only */
            int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            if (code && !status) status = code;
            if (code && reap_early) printf("(rank %d exited with status %d)\n", r, code);
            if (code && reap_early && !kill_at) kill_at = now_s() + 2.5;
            pids[r] = 0;
            left--;
            progressed = 1;
        }
        if (kill_at && now_s() > kill_at) {
            for (int r = 0; r < n; r++)
                if (pids[r]) kill(pids[r], SIGKILL);
            kill_at = now_s() + 1e9;
        }
        if (!progressed) usleep(5000);
    }
    fflush(stdout);
    return status;
}

static Shared *shared_new(void) {
    Shared *s = mmap(NULL, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (s == MAP_FAILED) die("mmap");
    memset(s, 0, sizeof *s);
    return s;
}

/* Runs fn on n ranks and reports one check line from what they recorded. */
static void run_checked(Checks *ck, const char *name, int n, RankFn fn, const char *what) {
    Shared *sh = shared_new();
    double t0 = now_s();
    int status = run_ranks(n, fn, sh, 0);
    int checks = 0, fails = 0, first = -1;
    for (int r = 0; r < n; r++) {
        checks += sh->checks[r];
        fails += sh->fails[r];
        if (sh->fails[r] && first < 0) first = r;
    }
    if (first >= 0)
        check(ck, 0, name, "%d of %d checks failed; rank %d: %s", fails, checks, first, sh->detail[first]);
    else
        check(ck, status == 0 && checks > 0, name, "%d checks on %d ranks, %s (exit status %d, %.2f s)", checks, n, what,
              status, now_s() - t0);
    munmap(sh, sizeof *sh);
}

/* ---- inputs and the host reference -------------------------------------------------- */

static uint32_t hash3(uint32_t a, uint32_t b, uint32_t c) {
    uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 1) * 0xC2B2AE3D27D4EB4Full ^ (c + 7) * 0x165667B19E3779F9ull;
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 32;
    return (uint32_t)x;
}

static float bf16_to_f(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t f_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static size_t esize(ncclDataType_t t) { return t == ncclBfloat16 ? 2 : 4; }

/* Element e of world rank w's input to test op opi: floats of mixed
 * magnitudes (so the order of a sum shows in the bits), any int32. */
static void gen(ncclDataType_t t, int w, int opi, size_t n, void *out) {
    for (size_t e = 0; e < n; e++) {
        uint32_t h = hash3((uint32_t)w, (uint32_t)opi, (uint32_t)e);
        float v = ((float)(h % 2000001u) - 1000000.0f) / 1000000.0f * (float)(1u << (h >> 28 & 7));
        if (t == ncclFloat32) memcpy((char *)out + 4 * e, &v, 4);
        else if (t == ncclBfloat16) { uint16_t b = f_to_bf16(v); memcpy((char *)out + 2 * e, &b, 2); }
        else memcpy((char *)out + 4 * e, &h, 4);
    }
}

/* out[e] = in[0][off + e] + ... + in[k-1][off + e], in member order. */
static void ref_reduce(void *out, char *in[], int k, size_t off, size_t n, ncclDataType_t t, ncclRedOp_t op) {
    for (size_t e = off; e < off + n; e++) {
        if (t == ncclInt32) {
            uint32_t acc = 0, v;
            for (int j = 0; j < k; j++) { memcpy(&v, in[j] + 4 * e, 4); acc += v; }
            memcpy((char *)out + 4 * (e - off), &acc, 4);
            continue;
        }
        float acc = 0, v;
        for (int j = 0; j < k; j++) {
            if (t == ncclFloat32) memcpy(&v, in[j] + 4 * e, 4);
            else { uint16_t b; memcpy(&b, in[j] + 2 * e, 2); v = bf16_to_f(b); }
            acc = j ? acc + v : v;
        }
        if (op == ncclAvg) acc /= (float)k;
        if (t == ncclFloat32) memcpy((char *)out + 4 * (e - off), &acc, 4);
        else { uint16_t b = f_to_bf16(acc); memcpy((char *)out + 2 * (e - off), &b, 2); }
    }
}

/* ---- the collectives ---------------------------------------------------------------- */

enum { ALLREDUCE, REDUCESCATTER, ALLGATHER, BROADCAST, REDUCE };
static const char *coll_names[] = {"allreduce", "reducescatter", "allgather", "broadcast", "reduce"};
static const char *type_name(ncclDataType_t t) { return t == ncclFloat32 ? "float32" : t == ncclBfloat16 ? "bfloat16" : "int32"; }

typedef struct Bufs { char *dsend, *drecv, *hin[MAXN], *hout, *href; } Bufs;

/* One collective on comm (k members, this rank member me, member j world
 * rank world[j]), checked against the reference; in place when asked. */
static void coll_case(Ctx *c, Bufs *b, ncclComm_t comm, int k, int me, const int *world, int kind, ncclDataType_t t,
                      ncclRedOp_t op, size_t len, int inplace, int opi) {
    size_t es = esize(t);
    size_t nin = kind == REDUCESCATTER ? len * k : len;
    size_t nout = kind == ALLGATHER ? len * k : len;
    int root = kind == BROADCAST ? (int)(len % k) : (int)((len + 1) % k);
    for (int j = 0; j < k; j++) gen(t, world[j], opi, nin, b->hin[j]);
    /* the receive buffer starts as a pattern the result must overwrite */
    memset(b->hout, 0xAB, MAXLEN * MAXN * 4);
    CU(cudaMemcpyAsync(b->drecv, b->hout, nout * es, cudaMemcpyHostToDevice, c->s));
    char *send = b->dsend, *recv = b->drecv;
    if (inplace) {
        if (kind == REDUCESCATTER) recv = send + me * len * es;
        else if (kind == ALLGATHER) send = recv + me * len * es;
        else recv = send;
    }
    CU(cudaMemcpyAsync(send, b->hin[me], nin * es, cudaMemcpyHostToDevice, c->s));
    switch (kind) {
    case ALLREDUCE: NC(ncclAllReduce(send, recv, len, t, op, comm, c->s)); break;
    case REDUCESCATTER: NC(ncclReduceScatter(send, recv, len, t, op, comm, c->s)); break;
    case ALLGATHER: NC(ncclAllGather(send, recv, len, t, comm, c->s)); break;
    case BROADCAST: NC(ncclBroadcast(send, recv, len, t, root, comm, c->s)); break;
    case REDUCE: NC(ncclReduce(send, recv, len, t, op, root, comm, c->s)); break;
    }
    if (kind == REDUCE && me != root) {
        CU(cudaStreamSynchronize(c->s));
        return;
    }
    CU(cudaMemcpyAsync(b->hout, recv, nout * es, cudaMemcpyDeviceToHost, c->s));
    CU(cudaStreamSynchronize(c->s));
    switch (kind) {
    case ALLREDUCE: case REDUCE: ref_reduce(b->href, b->hin, k, 0, len, t, op); break;
    case REDUCESCATTER: ref_reduce(b->href, b->hin, k, me * len, len, t, op); break;
    case ALLGATHER: for (int j = 0; j < k; j++) memcpy(b->href + j * len * es, b->hin[j], len * es); break;
    case BROADCAST: memcpy(b->href, b->hin[root], len * es); break;
    }
    size_t bad = nout;
    for (size_t e = 0; e < nout && bad == nout; e++)
        if (memcmp(b->hout + e * es, b->href + e * es, es)) bad = e;
    uint32_t got = 0, want = 0;
    if (bad < nout) {
        memcpy(&got, b->hout + bad * es, es);
        memcpy(&want, b->href + bad * es, es);
    }
    rank_check(c, bad == nout, "%s %s %s, %d ranks, length %zu%s: element %zu is 0x%x, the reference 0x%x",
               coll_names[kind], type_name(t), op == ncclAvg ? "avg" : "sum", k, len, inplace ? " in place" : "", bad,
               got, want);
}

/* Every collective, type and op on comms of 1..8 members split off the
 * world (keys reversed, so member j is world rank k-1-j), lengths 0, 1, 7
 * and 1000, in and out of place. */
static void rank_collectives(Ctx *c) {
    Bufs b;
    CU(cudaMalloc((void **)&b.dsend, MAXLEN * MAXN * 4));
    CU(cudaMalloc((void **)&b.drecv, MAXLEN * MAXN * 4));
    for (int j = 0; j < MAXN; j++) b.hin[j] = check_xmalloc(MAXLEN * MAXN * 4);
    b.hout = check_xmalloc(MAXLEN * MAXN * 4);
    b.href = check_xmalloc(MAXLEN * MAXN * 4);
    static const size_t lens[] = {0, 1, 7, 1000};
    static const ncclDataType_t types[] = {ncclFloat32, ncclBfloat16, ncclInt32};
    int opi = 0;
    for (int k = 1; k <= c->n; k++) {
        opi = 1000 * k;  /* the same numbering on every member, whichever groups it sat out */
        ncclComm_t comm;
        NC(ncclCommSplit(c->world, c->rank < k ? 0 : NCCL_SPLIT_NOCOLOR, k - c->rank, &comm, NULL));
        if (c->rank >= k) {
            rank_check(c, comm == NULL, "NCCL_SPLIT_NOCOLOR gave a communicator");
            continue;
        }
        int count, me, dev, world[MAXN];
        NC(ncclCommCount(comm, &count));
        NC(ncclCommUserRank(comm, &me));
        NC(ncclCommCuDevice(comm, &dev));
        rank_check(c, count == k && me == k - 1 - c->rank && dev == c->rank,
                   "split of %d: count %d, rank %d, device %d", k, count, me, dev);
        for (int j = 0; j < k; j++) world[j] = k - 1 - j;
        for (int li = 0; li < 4; li++)
            for (int kind = 0; kind < 5; kind++)
                for (int ti = 0; ti < 3; ti++)
                    for (int oi = 0; oi < 2; oi++) {
                        ncclRedOp_t op = oi ? ncclAvg : ncclSum;
                        int reduces = kind == ALLREDUCE || kind == REDUCESCATTER || kind == REDUCE;
                        if (oi && (!reduces || types[ti] == ncclInt32)) continue;
                        coll_case(c, &b, comm, k, me, world, kind, types[ti], op, lens[li], (li + ti + oi) & 1, opi++);
                    }
        NC(ncclCommDestroy(comm));
    }
    CU(cudaFree(b.dsend));
    CU(cudaFree(b.drecv));
}

/* ---- split ------------------------------------------------------------------------- */

/* The members (world ranks) of colour col, ordered by (key, world rank). */
static int members_of(const int *color, const int *key, int n, int col, int *out) {
    int m = 0;
    for (int r = 0; r < n; r++)
        if (color[r] == col) {
            int i = m++;
            while (i > 0 && key[out[i - 1]] > key[r]) { out[i] = out[i - 1]; i--; }
            out[i] = r;
        }
    return m;
}

/* Checks comm's size, this rank's place, and its membership order through
 * an all-gather of world ranks. */
static void check_members(Ctx *c, ncclComm_t comm, const int *expect, int m, const char *what) {
    int count, me, *d;
    NC(ncclCommCount(comm, &count));
    NC(ncclCommUserRank(comm, &me));
    int pos = -1;
    for (int i = 0; i < m; i++) if (expect[i] == c->rank) pos = i;
    rank_check(c, count == m && me == pos, "%s: count %d rank %d, expected %d and %d", what, count, me, m, pos);
    CU(cudaMalloc((void **)&d, 4 * (m + 1)));
    int got[MAXN];
    CU(cudaMemcpyAsync(d + me, &c->rank, 4, cudaMemcpyHostToDevice, c->s));
    NC(ncclAllGather(d + me, d, 1, ncclInt32, comm, c->s));
    CU(cudaMemcpyAsync(got, d, 4 * m, cudaMemcpyDeviceToHost, c->s));
    CU(cudaStreamSynchronize(c->s));
    rank_check(c, !memcmp(got, expect, 4 * m), "%s: the members' order differs", what);
    CU(cudaFree(d));
}

static void rank_split(Ctx *c) {
    int color[MAXN], key[MAXN], mem[MAXN];
    for (int r = 0; r < c->n; r++) {
        color[r] = r == c->n - 1 ? NCCL_SPLIT_NOCOLOR : r % 3;
        key[r] = (r * 5) % 4;  /* ties: broken by the parent rank */
    }
    ncclComm_t a, b;
    NC(ncclCommSplit(c->world, color[c->rank], key[c->rank], &a, NULL));
    if (color[c->rank] == NCCL_SPLIT_NOCOLOR) {
        rank_check(c, a == NULL, "NCCL_SPLIT_NOCOLOR gave a communicator");
    } else {
        int m = members_of(color, key, c->n, color[c->rank], mem);
        check_members(c, a, mem, m, "split by colour");
        /* split again: the parent's ranks are now positions in a */
        int me, pcolor[MAXN], pkey[MAXN], sub[MAXN], world_sub[MAXN];
        NC(ncclCommUserRank(a, &me));
        for (int i = 0; i < m; i++) { pcolor[i] = i % 2; pkey[i] = -i; }
        NC(ncclCommSplit(a, pcolor[me], pkey[me], &b, NULL));
        int ms = members_of(pcolor, pkey, m, pcolor[me], sub);
        for (int i = 0; i < ms; i++) world_sub[i] = mem[sub[i]];
        check_members(c, b, world_sub, ms, "split of a split");
        NC(ncclCommDestroy(b));
        NC(ncclCommDestroy(a));
    }
}

/* ---- send / recv -------------------------------------------------------------------- */

/* In one group: a ring forwards, a ring backwards, two sends to the same
 * peer (the n-th send matches the n-th recv), and a send to itself; then a
 * ring on a split comm whose order is the world's reversed. */
static void rank_p2p(Ctx *c) {
    const size_t len = 1000;
    int n = c->n, r = c->rank, next = (r + 1) % n, prev = (r + n - 1) % n;
    float *d;
    CU(cudaMalloc((void **)&d, 7 * len * 4));
    float *h = check_xmalloc(7 * len * 4), *want = check_xmalloc(len * 4);
    gen(ncclFloat32, r, 100, len, h);
    gen(ncclFloat32, r, 101, len, h + len);
    gen(ncclFloat32, r, 102, len, h + 2 * len);
    CU(cudaMemcpyAsync(d, h, 3 * len * 4, cudaMemcpyHostToDevice, c->s));
    NC(ncclGroupStart());
    NC(ncclSend(d, len, ncclFloat32, next, c->world, c->s));
    NC(ncclGroupStart());  /* nested: one group all the same */
    NC(ncclRecv(d + 3 * len, len, ncclFloat32, prev, c->world, c->s));
    NC(ncclSend(d + len, len, ncclFloat32, prev, c->world, c->s));
    NC(ncclGroupEnd());
    NC(ncclRecv(d + 4 * len, len, ncclFloat32, next, c->world, c->s));
    NC(ncclSend(d + 2 * len, 3, ncclFloat32, next, c->world, c->s));     /* 2nd send to next */
    NC(ncclRecv(d + 5 * len, 3, ncclFloat32, prev, c->world, c->s));     /* 2nd recv from prev */
    NC(ncclSend(d, 5, ncclFloat32, r, c->world, c->s));
    NC(ncclRecv(d + 6 * len, 5, ncclFloat32, r, c->world, c->s));
    NC(ncclGroupEnd());
    CU(cudaMemcpyAsync(h + 3 * len, d + 3 * len, 4 * len * 4, cudaMemcpyDeviceToHost, c->s));
    CU(cudaStreamSynchronize(c->s));
    gen(ncclFloat32, prev, 100, len, want);
    rank_check(c, !memcmp(h + 3 * len, want, len * 4), "ring forwards: data from rank %d differs", prev);
    gen(ncclFloat32, next, 101, len, want);
    rank_check(c, !memcmp(h + 4 * len, want, len * 4), "ring backwards: data from rank %d differs", next);
    gen(ncclFloat32, prev, 102, 3, want);
    rank_check(c, !memcmp(h + 5 * len, want, 3 * 4), "second send to the same peer: data differs");
    gen(ncclFloat32, r, 100, 5, want);
    rank_check(c, !memcmp(h + 6 * len, want, 5 * 4), "send to itself: data differs");
    /* a ring on a comm whose member i is world rank n-1-i, in bf16 */
    ncclComm_t rev;
    NC(ncclCommSplit(c->world, 0, -r, &rev, NULL));
    int me;
    NC(ncclCommUserRank(rev, &me));
    gen(ncclBfloat16, r, 103, len, h);
    CU(cudaMemcpyAsync(d, h, len * 2, cudaMemcpyHostToDevice, c->s));
    NC(ncclGroupStart());
    NC(ncclRecv(d + len, len, ncclBfloat16, (me + n - 1) % n, rev, c->s));
    NC(ncclSend(d, len, ncclBfloat16, (me + 1) % n, rev, c->s));
    NC(ncclGroupEnd());
    CU(cudaMemcpyAsync(h, d + len, len * 2, cudaMemcpyDeviceToHost, c->s));
    CU(cudaStreamSynchronize(c->s));
    gen(ncclBfloat16, n - 1 - (me + n - 1) % n, 103, len, want);
    rank_check(c, !memcmp(h, want, len * 2), "ring on a reversed comm: data differs");
    NC(ncclCommDestroy(rev));
    CU(cudaFree(d));
}

/* A group of collectives: two all-reduces on the world (in issue order) and
 * an all-gather on a split comm, one stream op. */
static void rank_group_colls(Ctx *c) {
    int n = c->n, *d, h[3 * MAXN];
    ncclComm_t half;
    NC(ncclCommSplit(c->world, c->rank % 2, c->rank, &half, NULL));
    int hn, hme;
    NC(ncclCommCount(half, &hn));
    NC(ncclCommUserRank(half, &hme));
    CU(cudaMalloc((void **)&d, 4 * (3 + MAXN)));
    int in[3] = {c->rank + 1, 10 * (c->rank + 1), c->rank};
    CU(cudaMemcpyAsync(d, in, 12, cudaMemcpyHostToDevice, c->s));
    NC(ncclGroupStart());
    NC(ncclAllReduce(d, d, 1, ncclInt32, ncclSum, c->world, c->s));
    NC(ncclAllReduce(d + 1, d + 1, 1, ncclInt32, ncclSum, c->world, c->s));
    NC(ncclAllGather(d + 2, d + 3, 1, ncclInt32, half, c->s));
    NC(ncclGroupEnd());
    CU(cudaMemcpyAsync(h, d, 4 * (3 + hn), cudaMemcpyDeviceToHost, c->s));
    CU(cudaStreamSynchronize(c->s));
    int ok = h[0] == n * (n + 1) / 2 && h[1] == 10 * n * (n + 1) / 2;
    for (int i = 0; i < hn; i++) ok &= h[3 + i] == 2 * i + c->rank % 2;
    rank_check(c, ok, "grouped collectives: sums %d %d", h[0], h[1]);
    NC(ncclCommDestroy(half));
    CU(cudaFree(d));
}

/* ---- loud failures ------------------------------------------------------------------ */

static const char *result_name(ncclResult_t r) {
    static const char *names[] = {"ncclSuccess", "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
                                  "ncclInvalidArgument", "ncclInvalidUsage", "ncclRemoteError", "ncclInProgress"};
    return r >= 0 && r < 8 ? names[r] : "?";
}

/* A watchdog as comm.c's will be: polls ncclCommGetAsyncError while the
 * main thread waits on the stream; on an error (or after `limit` s without
 * one, for a stalled peer) it says so and aborts the comm, which drains the
 * stream. */
typedef struct Watch { ncclComm_t comm; int rank; double limit; volatile int stop, fired; } Watch;

static void *watch_main(void *arg) {
    Watch *w = arg;
    double t0 = now_s();
    while (!w->stop) {
        ncclResult_t e;
        NC(ncclCommGetAsyncError(w->comm, &e));
        if (e != ncclSuccess || (w->limit > 0 && now_s() - t0 > w->limit)) {
            if (e != ncclSuccess) printf("rank %d: ncclCommGetAsyncError gave %s (%s)\n", w->rank, result_name(e), ncclGetLastError(w->comm));
            else printf("rank %d: no async error after %g s; aborting\n", w->rank, w->limit);
            fflush(stdout);
            NC(ncclCommAbort(w->comm));
            w->fired = 1;
            return NULL;
        }
        usleep(5000);
    }
    return NULL;
}

/* Two all-reduces of 4 floats, the second under a watchdog. */
static void watched(Ctx *c, double limit) {
    float *d;
    CU(cudaMalloc((void **)&d, 16));
    CU(cudaMemsetAsync(d, 0, 16, c->s));
    NC(ncclAllReduce(d, d, 4, ncclFloat32, ncclSum, c->world, c->s));
    CU(cudaStreamSynchronize(c->s));
    Watch w = {c->world, c->rank, limit, 0, 0};
    pthread_t th;
    pthread_create(&th, NULL, watch_main, &w);
    NC(ncclAllReduce(d, d, 4, ncclFloat32, ncclSum, c->world, c->s));
    CU(cudaStreamSynchronize(c->s));
    w.stop = 1;
    pthread_join(th, NULL);
    if (w.fired) exit(2);
}
static void f_injected(Ctx *c) { watched(c, 0); }
static void f_stall(Ctx *c) { watched(c, c->rank == 0 ? 0.5 : 0); }

static void f_unwatched(Ctx *c) {
    float *d;
    CU(cudaMalloc((void **)&d, 16));
    for (int i = 0; i < 2; i++) NC(ncclAllReduce(d, d, 4, ncclFloat32, ncclSum, c->world, c->s));
    CU(cudaStreamSynchronize(c->s));
}

static void f_count(Ctx *c) {
    float *d;
    CU(cudaMalloc((void **)&d, 64));
    NC(ncclAllReduce(d, d, c->rank ? 16 : 8, ncclFloat32, ncclSum, c->world, c->s));
}

static void f_collective(Ctx *c) {
    float *d;
    CU(cudaMalloc((void **)&d, 64));
    if (c->rank) NC(ncclAllGather(d, d + 4 * c->rank, 4, ncclFloat32, c->world, c->s));
    else NC(ncclAllReduce(d, d, 4, ncclFloat32, ncclSum, c->world, c->s));
}

static void f_root(Ctx *c) {
    float *d;
    CU(cudaMalloc((void **)&d, 64));
    NC(ncclBroadcast(d, d, 4, ncclFloat32, c->rank ? 1 : 0, c->world, c->s));
}

static void f_opposite(Ctx *c) {
    float *d;
    ncclComm_t other;
    CU(cudaMalloc((void **)&d, 64));
    NC(ncclCommSplit(c->world, 0, c->rank, &other, NULL));
    ncclComm_t first = c->rank ? other : c->world, second = c->rank ? c->world : other;
    NC(ncclAllReduce(d, d, 4, ncclFloat32, ncclSum, first, c->s));
    NC(ncclAllReduce(d, d, 4, ncclFloat32, ncclSum, second, c->s));
}

static void f_ring(Ctx *c) {
    float *d;
    CU(cudaMalloc((void **)&d, 64));
    NC(ncclSend(d, 4, ncclFloat32, (c->rank + 1) % c->n, c->world, c->s));
    NC(ncclRecv(d + 4, 4, ncclFloat32, (c->rank + c->n - 1) % c->n, c->world, c->s));
}

static void f_p2p_count(Ctx *c) {
    float *d;
    CU(cudaMalloc((void **)&d, 64));
    if (c->rank == 0) NC(ncclSend(d, 4, ncclFloat32, 1, c->world, c->s));
    else NC(ncclRecv(d, 5, ncclFloat32, 0, c->world, c->s));
}

static void f_overlap(Ctx *c) {
    float *d;
    CU(cudaMalloc((void **)&d, 64));
    NC(ncclAllReduce(d, d + (c->rank ? 1 : 0), 4, ncclFloat32, ncclSum, c->world, c->s));
}

static void f_overlap_ag(Ctx *c) {
    float *d;
    CU(cudaMalloc((void **)&d, 64));
    NC(ncclAllGather(d, d, 4, ncclFloat32, c->world, c->s));  /* in place needs d + 4 * rank on rank 1 */
}

static void f_host_mem(Ctx *c) {
    static float h[4];
    float *d;
    CU(cudaMalloc((void **)&d, 64));
    NC(ncclAllReduce(c->rank ? h : d, d, 4, ncclFloat32, ncclSum, c->world, c->s));
}

static void f_stage(Ctx *c) {
    float *d;
    CU(cudaMalloc((void **)&d, 4u << 20));
    NC(ncclAllReduce(d, d, 1u << 20, ncclFloat32, ncclSum, c->world, c->s));
}

typedef struct Job {
    const char *name;
    int n;
    RankFn fn;
    const char *env;      /* "VAR=value ..." */
    const char *expect;   /* in the output */
    pid_t pid;
    FILE *out;
    int status;
} Job;

#define JOB(name, n, fn, env, expect) {name, n, fn, env, expect, 0, NULL, 0}

static void job_start(Job *j) {
    j->out = tmpfile();
    if (!j->out) die("tmpfile");
    fflush(stdout);
    j->pid = fork();
    if (j->pid < 0) die("fork");
    if (j->pid) return;
    setpgid(0, 0);
    dup2(fileno(j->out), 1);
    dup2(fileno(j->out), 2);
    char env[256];
    snprintf(env, sizeof env, "EMU_NCCL_ABORT_GRACE=0.5 %s", j->env);
    for (char *tok = strtok(env, " "); tok; tok = strtok(NULL, " ")) putenv(strdup(tok));
    int st = run_ranks(j->n, j->fn, NULL, 1);
    fflush(stdout);
    _exit(st ? 1 : 0);
}

/* Waits for the job (at most until deadline; then kills its process group)
 * and checks its status and output. */
static void job_finish(Checks *ck, Job *j, double deadline) {
    int st = 0, hung = 0;
    for (;;) {
        pid_t p = waitpid(j->pid, &st, WNOHANG);
        if (p == j->pid) break;
        if (now_s() > deadline) {
            kill(-j->pid, SIGKILL);
            waitpid(j->pid, &st, 0);
            hung = 1;
            break;
        }
        usleep(20000);
    }
    char out[16384];
    fseek(j->out, 0, SEEK_SET);
    size_t n = fread(out, 1, sizeof out - 1, j->out);
    out[n] = 0;
    fclose(j->out);
    char name[96];
    snprintf(name, sizeof name, "nccl loud failure: %s (cpu emulation)", j->name);
    const char *hit = strstr(out, j->expect);
    if (hung || !hit || !WIFEXITED(st) || WEXITSTATUS(st) == 0) {
        check(ck, 0, name, "%s; status %d; expected \"%s\" in: %.600s", hung ? "hung (killed)" : "no loud failure",
              WIFEXITED(st) ? WEXITSTATUS(st) : -1, j->expect, out);
        return;
    }
    const char *b = hit, *e = hit;
    while (b > out && b[-1] != '\n') b--;
    while (*e && *e != '\n') e++;
    check(ck, 1, name, "exit status %d, said: %.*s", WEXITSTATUS(st), (int)(e - b > 300 ? 300 : e - b), b);
}

int main(void) {
    setenv("EMU_GPUS", "8", 1);
    setvbuf(stdout, NULL, _IOLBF, 0);
    Checks ck = {0, 0, 0};
    double t0 = now_s();
    /* the failure jobs run in the background while the checks of results do */
    static Job jobs[] = {
        JOB("mismatched count", 2, f_count, "", "different counts"),
        JOB("mismatched collective", 2, f_collective, "", "different collectives"),
        JOB("mismatched root", 2, f_root, "", "different roots"),
        JOB("opposite orders on two comms", 2, f_opposite, "", "deadlock"),
        JOB("ungrouped send/recv ring", 3, f_ring, "", "deadlock"),
        JOB("send/recv count mismatch", 2, f_p2p_count, "", "send/recv mismatch"),
        JOB("overlapping all-reduce buffers", 2, f_overlap, "", "in place needs recvbuff == sendbuff"),
        JOB("overlapping all-gather buffers", 2, f_overlap_ag, "", "in place needs sendbuff == recvbuff + rank"),
        JOB("host memory passed as device memory", 2, f_host_mem, "", "is not device memory of GPU 1"),
        JOB("op larger than the stage", 2, f_stage, "EMU_NCCL_STAGE_MB=1", "EMU_NCCL_STAGE_MB"),
        JOB("injected error seen by ncclCommGetAsyncError", 2, f_injected, "EMU_NCCL_FAIL=rank=1,op=2",
         "ncclCommGetAsyncError gave ncclSystemError"),
        JOB("dead peer seen by ncclCommGetAsyncError", 3, f_injected, "EMU_NCCL_EXIT=rank=2,op=2",
         "ncclCommGetAsyncError gave ncclRemoteError"),
        JOB("dead peer nobody aborted for", 2, f_unwatched, "EMU_NCCL_EXIT=rank=1,op=2", "nobody called ncclCommAbort"),
        JOB("stalled peer", 2, f_stall, "EMU_NCCL_STALL=rank=1,op=2", "no async error after"),
    };
    int njobs = sizeof jobs / sizeof jobs[0];
    for (int i = 0; i < njobs; i++) job_start(&jobs[i]);
    run_checked(&ck, "nccl collectives (cpu emulation)", 8, rank_collectives,
                "all-reduce, reduce-scatter, all-gather, broadcast, reduce on comms of 1..8 ranks, lengths 0 1 7 "
                "1000, float32 bfloat16 int32, sum and avg, in and out of place, exact bits");
    run_checked(&ck, "nccl split (cpu emulation)", 8, rank_split,
                "colours, tied keys, NCCL_SPLIT_NOCOLOR, a split of a split");
    for (int n = 2; n <= 8; n += 3)
        run_checked(&ck, "nccl grouped send/recv (cpu emulation)", n, rank_p2p,
                    "rings both ways, repeated and self sends in one nested group, a ring on a reversed comm");
    run_checked(&ck, "nccl grouped collectives (cpu emulation)", 4, rank_group_colls,
                "two all-reduces on one comm and an all-gather on another in one group");
    int version = 0;
    NC(ncclGetVersion(&version));
    check(&ck, version == NCCL_VERSION_CODE && !strcmp(ncclGetErrorString(ncclSuccess), "no error") &&
              strstr(ncclGetErrorString(ncclRemoteError), "remote"),
          "nccl version and error strings (cpu emulation)", "ncclGetVersion %d, nccl.h's NCCL_VERSION_CODE %d", version,
          NCCL_VERSION_CODE);
    double deadline = now_s() + 20;
    for (int i = 0; i < njobs; i++) job_finish(&ck, &jobs[i], deadline);
    printf("test_nccl_emu: %d passed, %d failed in %.1f s\n", ck.passed, ck.failed, now_s() - t0);
    return check_done(&ck);
}
