/* test/test_comm.c: the launcher, groups, mesh and operations of comm.c,
 * each against a serial computation.
 *
 *   test_comm                   the suite on 8 forked ranks (make test)
 *   test_comm --ranks N         the suite on N ranks
 *   test_comm --device cuda     buffers on the GPU (shared memory, staged through the host)
 *   test_comm --nccl            the NCCL backend (GPU buffers)
 *   test_comm --soak S [--ranks N] [--fail-rank R --fail-after T]
 *                               collectives in a loop for S seconds, printing "rank r pid P"
 *                               first; rank R exits with status 3 after T s (test_fault.sh)
 * Under torchrun-style variables (RANK, WORLD_SIZE, ...) and without --ranks,
 * each process is one rank of that world.
 *
 * The ranks launch through comm_launch like `train` does. Every check is
 * collective: each rank counts what it found wrong, the counts are summed
 * over the world, and rank 0 prints one PASS or FAIL line with the total,
 * so a failure on any rank shows at rank 0. Values are small integers (or
 * sums of them), exact in float32 and bfloat16, so results must be equal,
 * not close; the one test with rounding (random floats) asks for the same
 * bits as a serial left-to-right sum.
 */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "comm.h"
#include "check.h"

#define BIG 1000003
static const size_t lengths[] = { 0, 1, 7, BIG };
#define NLEN (sizeof lengths / sizeof lengths[0])

typedef struct T {
    Comm *c;
    Dev *d;
    Checks checks;
    int rank, world;
    float *h, *e;                /* host scratch: [BIG] values, [BIG] expected */
    void *x, *y;                 /* device buffers: [BIG] elements of 4 bytes */
} T;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* Member j's element k: small integers, so any sum of 8 is exact. */
static float val(int j, size_t k) { return (float)((int)(k % 61) - 30 + 3 * j); }
static float val16(int j, size_t k) { return (float)((int)(k % 7) - 3 + j); }   /* exact in bf16 */
static int32_t vali(int j, size_t k) { return (int32_t)((uint32_t)(k * 7 + 1) * (uint32_t)(j + 1)); }

static uint16_t bf16(float f) { uint32_t u; memcpy(&u, &f, 4); return (uint16_t)(u >> 16); }  /* exact inputs */
static float from_bf16(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }

/* Host <-> the test's device, after anything queued on the comm stream. */
static void put(T *t, void *dst, const void *src, size_t bytes) {
    comm_wait(t->c, t->d);
    if (bytes) dev_from_host(t->d, dst, src, bytes);
    dev_sync(t->d);
}

static void get(T *t, void *dst, const void *src, size_t bytes) {
    comm_wait(t->c, t->d);
    if (bytes) dev_to_host(t->d, dst, src, bytes);
    dev_sync(t->d);
}

/* Collective: sums `bad` over the world; rank 0 prints the line. */
static void report(T *t, const char *name, long bad, const char *fmt, ...) {
    int32_t b = bad > INT32_MAX ? INT32_MAX : (int32_t)bad;
    char detail[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    comm_all_reduce(&t->c->world, NULL, &b, 1, COMM_I32, COMM_SUM);
    if (t->rank == 0) check(&t->checks, b == 0, name, "%s; %d wrong over %d ranks", detail, b, t->world);
    else if (b) t->checks.failed++;
}

/* ---- every operation on groups of 1..world ranks ------------------------------ */

enum { OP_SUM, OP_AVG, OP_RS, OP_RS_INPLACE, OP_AG, OP_AG_INPLACE, OP_BCAST, OP_REDUCE, OP_BF16, OP_I32, OP_I32_MAX, NOPS };
static const char *op_names[NOPS] = {
    "all_reduce_sum", "all_reduce_avg", "reduce_scatter", "reduce_scatter_inplace", "all_gather",
    "all_gather_inplace", "broadcast", "reduce", "all_reduce_bf16", "all_reduce_i32", "all_reduce_i32_max",
};

/* A non-member's buffer must come back as it went in. */
static long untouched(T *t, size_t n) {
    long bad = 0;
    get(t, t->h, t->x, n * 4);
    for (size_t k = 0; k < n; k++) bad += t->h[k] != -7.0f;
    return bad;
}

static void sentinel(T *t, size_t n) {
    for (size_t k = 0; k < n; k++) t->h[k] = -7.0f;
    put(t, t->x, t->h, n * 4);
}

static long run_op(T *t, CommGroup *g, int op, size_t n) {
    int G = g->size, i = g->index, member = i >= 0;
    int bcast_root = G - 1, reduce_root = G / 2;
    float *h = t->h, *e = t->e;
    long bad = 0;
    size_t off = 0, cnt = 0;
    if (member) comm_shard(n, G, i, &off, &cnt);
    if (!member) {   /* every call must return at once and leave the buffer alone */
        sentinel(t, n);
        switch (op) {
        case OP_SUM: case OP_BF16: case OP_I32: comm_all_reduce(g, t->d, t->x, n, COMM_F32, COMM_SUM); break;
        case OP_I32_MAX: comm_all_reduce(g, t->d, t->x, n, COMM_I32, COMM_MAX); break;
        case OP_AVG: comm_all_reduce(g, t->d, t->x, n, COMM_F32, COMM_AVG); break;
        case OP_RS: case OP_RS_INPLACE: comm_reduce_scatter(g, t->d, t->x, t->x, n, COMM_F32, COMM_SUM); break;
        case OP_AG: case OP_AG_INPLACE: comm_all_gather(g, t->d, t->x, t->x, n, COMM_F32); break;
        case OP_BCAST: comm_broadcast(g, t->d, t->x, n, COMM_F32, 0); break;
        case OP_REDUCE: comm_reduce(g, t->d, t->x, n, COMM_F32, COMM_SUM, 0); break;
        }
        return untouched(t, n);
    }
    /* expected sums, left to right over the members */
    for (size_t k = 0; k < n; k++) {
        float s = val(0, k);
        for (int j = 1; j < G; j++) s += val(j, k);
        e[k] = s;
    }
    switch (op) {
    case OP_SUM:
    case OP_AVG:
        for (size_t k = 0; k < n; k++) h[k] = val(i, k);
        put(t, t->x, h, n * 4);
        comm_all_reduce(g, t->d, t->x, n, COMM_F32, op == OP_AVG ? COMM_AVG : COMM_SUM);
        get(t, h, t->x, n * 4);
        for (size_t k = 0; k < n; k++) bad += h[k] != (op == OP_AVG ? e[k] / (float)G : e[k]);
        break;
    case OP_RS:
    case OP_RS_INPLACE: {
        float *out = (float *)t->x + (op == OP_RS_INPLACE ? off : 0);
        void *dst = op == OP_RS_INPLACE ? out : t->y;
        for (size_t k = 0; k < n; k++) h[k] = val(i, k);
        put(t, t->x, h, n * 4);
        comm_reduce_scatter(g, t->d, dst, t->x, n, COMM_F32, COMM_SUM);
        get(t, h, dst, cnt * 4);
        for (size_t k = 0; k < cnt; k++) bad += h[k] != e[off + k];
        break;
    }
    case OP_AG:
    case OP_AG_INPLACE: {
        void *src = op == OP_AG_INPLACE ? (void *)((float *)t->x + off) : t->y;
        for (size_t k = 0; k < n; k++) h[k] = -7.0f;
        put(t, t->x, h, n * 4);
        for (size_t k = 0; k < cnt; k++) h[k] = val(i, off + k);
        put(t, src, h, cnt * 4);
        comm_all_gather(g, t->d, t->x, src, n, COMM_F32);
        get(t, h, t->x, n * 4);
        for (int j = 0; j < G; j++) {
            size_t oj, cj;
            comm_shard(n, G, j, &oj, &cj);
            for (size_t k = oj; k < oj + cj; k++) bad += h[k] != val(j, k);
        }
        break;
    }
    case OP_BCAST:
        for (size_t k = 0; k < n; k++) h[k] = i == bcast_root ? val(i, k) : -7.0f;
        put(t, t->x, h, n * 4);
        comm_broadcast(g, t->d, t->x, n, COMM_F32, bcast_root);
        get(t, h, t->x, n * 4);
        for (size_t k = 0; k < n; k++) bad += h[k] != val(bcast_root, k);
        break;
    case OP_REDUCE:
        for (size_t k = 0; k < n; k++) h[k] = val(i, k);
        put(t, t->x, h, n * 4);
        comm_reduce(g, t->d, t->x, n, COMM_F32, COMM_SUM, reduce_root);
        get(t, h, t->x, n * 4);
        for (size_t k = 0; k < n; k++) bad += h[k] != (i == reduce_root ? e[k] : val(i, k));
        break;
    case OP_BF16: {
        uint16_t *b = (uint16_t *)h;
        for (size_t k = 0; k < n; k++) b[k] = bf16(val16(i, k));
        put(t, t->x, b, n * 2);
        comm_all_reduce(g, t->d, t->x, n, COMM_BF16, COMM_SUM);
        get(t, b, t->x, n * 2);
        for (size_t k = 0; k < n; k++) {
            float s = 0;
            for (int j = 0; j < G; j++) s += val16(j, k);
            bad += from_bf16(b[k]) != s;
        }
        break;
    }
    case OP_I32:
    case OP_I32_MAX: {   /* signed: vali wraps to negative values too */
        int mx = op == OP_I32_MAX;
        int32_t *v = (int32_t *)h;
        for (size_t k = 0; k < n; k++) v[k] = vali(i, k);
        put(t, t->x, v, n * 4);
        comm_all_reduce(g, t->d, t->x, n, COMM_I32, mx ? COMM_MAX : COMM_SUM);
        get(t, v, t->x, n * 4);
        for (size_t k = 0; k < n; k++) {
            uint32_t s = (uint32_t)vali(0, k);
            for (int j = 1; j < G; j++)
                s = mx ? (uint32_t)(vali(j, k) > (int32_t)s ? vali(j, k) : (int32_t)s) : s + (uint32_t)vali(j, k);
            bad += (uint32_t)v[k] != s;
        }
        break;
    }
    }
    return bad;
}

static void test_group_ops(T *t, int G) {
    Comm *c = t->c;
    CommGroup g;
    char name[16], line[64];
    snprintf(name, sizeof name, "first%d", G);
    /* members: world ranks 0..G-1 in reverse order, so index != world rank */
    comm_split(c, t->rank < G ? 0 : COMM_NO_COLOR, G - 1 - t->rank, name, &g);
    long bad = 0;
    if (t->rank < G) {
        bad += g.size != G || g.index != G - 1 - t->rank;
        for (int j = 0; j < g.size && !bad; j++) bad += g.ranks[j] != G - 1 - j;
    } else {
        bad += g.size != 0 || g.index != -1;
    }
    snprintf(line, sizeof line, "split g=%d", G);
    report(t, line, bad, "group of world ranks %d..0 has size %d, index = %d - world rank; others size 0", G - 1, G, G - 1);
    for (int op = 0; op < NOPS; op++) {
        double t0 = now_s();
        bad = 0;
        for (size_t li = 0; li < NLEN; li++) bad += run_op(t, &g, op, lengths[li]);
        snprintf(line, sizeof line, "%s g=%d", op_names[op], G);
        report(t, line, bad, "lengths 0,1,7,%d on %d of %d ranks, exact (%.2f s)", BIG, G, t->world, now_s() - t0);
    }
    comm_group_free(&g);
}

/* ---- bits: every rank holds the serial sum of random floats ------------------- */

static float rnd(int r, size_t k) {
    uint32_t h = (uint32_t)k * 2654435761u ^ (uint32_t)(r + 1) * 0x9E3779B9u;
    h ^= h >> 15; h *= 0x2c1b3c6du; h ^= h >> 12; h *= 0x297a2d39u; h ^= h >> 15;
    return (float)(h >> 8) / 16777216.0f * 2.0f - 1.0f;
}

/* Host buffers longer than the NCCL backend's staging chunk (4 MiB): an
 * all-reduce and a broadcast of 2.5M floats (3 chunks), as saving a model
 * does; small integers, so every order of the sum gives the same bits. */
static void test_host_chunks(T *t) {
    size_t n = 2500000;
    float *a = malloc(n * sizeof(float));
    long bad = 0;
    for (size_t k = 0; k < n; k++) a[k] = (float)((k * 7 + t->rank) % 1000);
    comm_all_reduce(&t->c->world, NULL, a, n, COMM_F32, COMM_SUM);
    for (size_t k = 0; k < n; k++) {
        double s = 0;
        for (int r = 0; r < t->world; r++) s += (double)((k * 7 + r) % 1000);
        bad += a[k] != (float)s;
    }
    report(t, "host_all_reduce_chunks", bad, "%zu floats of host memory summed in chunks, exact", n);
    for (size_t k = 0; k < n; k++) a[k] = t->rank == t->world - 1 ? (float)(k % 4099) : -1.0f;
    comm_broadcast(&t->c->world, NULL, a, n, COMM_F32, t->world - 1);
    bad = 0;
    for (size_t k = 0; k < n; k++) bad += a[k] != (float)(k % 4099);
    report(t, "host_broadcast_chunks", bad, "%zu floats of host memory from the last rank, exact", n);
    free(a);
}

static void test_identical(T *t) {
    size_t n = BIG;
    float *h = t->h;
    for (size_t k = 0; k < n; k++) h[k] = rnd(t->rank, k);
    put(t, t->x, h, n * 4);
    comm_all_reduce(&t->c->world, t->d, t->x, n, COMM_F32, COMM_SUM);
    get(t, h, t->x, n * 4);
    long bad = 0;
    double worst = 0;
    int nccl = t->c->backend == COMM_NCCL;
    for (size_t k = 0; k < n; k++) {
        float s = rnd(0, k);
        for (int r = 1; r < t->world; r++) s += rnd(r, k);
        if (nccl) {   /* NCCL sums in its own order */
            double rel = (h[k] - s) / (fabsf(s) + 1e-3);
            worst = rel > worst ? rel : -rel > worst ? -rel : worst;
            bad += rel > 1e-5 || rel < -1e-5;
        } else {
            bad += memcmp(&h[k], &s, 4) != 0;
        }
    }
    if (nccl) report(t, "all_reduce_serial", bad, "%d random floats within 1e-5 of the serial sum (worst %.1e)",
                     BIG, worst);
    else report(t, "all_reduce_serial_bits", bad, "%d random floats: the same bits as the serial sum rank 0 + 1 + ...",
                BIG);
    uint32_t hash = 2166136261u;   /* FNV-1a of the result */
    const unsigned char *p = (const unsigned char *)h;
    for (size_t k = 0; k < n * 4; k++) hash = (hash ^ p[k]) * 16777619u;
    int32_t *all = malloc((size_t)t->world * sizeof *all), mine = (int32_t)hash;
    comm_all_gather(&t->c->world, NULL, all, &mine, (size_t)t->world, COMM_I32);
    bad = 0;
    for (int r = 0; r < t->world; r++) bad += all[r] != all[0];
    report(t, "all_reduce_identical", bad, "every rank's result hashes to %08x", (uint32_t)all[0]);
    free(all);
}

/* ---- the mesh ---------------------------------------------------------------- */

static void test_mesh_shape(T *t) {
    static const struct { int dp, tp, pp; const char *want; } cases[] = {
        { 2, 2, 3, "--dp 2 --tp 2 --pp 3 multiply to 12, not the 8 ranks" },
        { 1, 1, 1, "--dp 1 --tp 1 --pp 1 multiply to 1, not the 8 ranks" },
        { 0, 3, 1, "--tp 3 --pp 1 multiply to 3, which does not divide the 8 ranks (--dp is inferred)" },
        { -1, 1, 1, "--dp -1: must be at least 1 (or 0 to infer it)" },
        { 0, 2, 2, "2 2 2" }, { 0, 0, 0, "8 1 1" }, { 2, 0, 0, "2 4 1" }, { 2, 2, 0, "2 2 2" },
        { 0, 0, 4, "2 1 4" }, { 8, 1, 1, "8 1 1" },
    };
    long bad = 0;
    char err[256], got[256], first[256] = "";
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int dp = cases[i].dp, tp = cases[i].tp, pp = cases[i].pp;
        if (comm_mesh_shape(8, &dp, &tp, &pp, err, sizeof err)) snprintf(got, sizeof got, "%s", err);
        else snprintf(got, sizeof got, "%d %d %d", dp, tp, pp);
        if (strcmp(got, cases[i].want)) {
            bad++;
            if (t->rank == 0) printf("  mesh_shape(8, %d, %d, %d): got \"%s\", want \"%s\"\n", cases[i].dp,
                                     cases[i].tp, cases[i].pp, got, cases[i].want);
        }
        if (i == 0) snprintf(first, sizeof first, "%s", got);
    }
    report(t, "mesh_shape", bad, "%zu shapes of 8 ranks inferred or refused, e.g. \"%s\"",
           sizeof cases / sizeof cases[0], first);
}

/* One group of the mesh: structure, then an all-reduce of world rank ids. */
static long mesh_group(T *t, CommGroup *g, int member, int size, int index, const int *want_ranks) {
    long bad = 0;
    if (!member) return (g->size != 0) + (g->index != -1);
    bad += g->size != size || g->index != index;
    for (int j = 0; j < size && !bad; j++) bad += g->ranks[j] != want_ranks[j];
    float sum = 0, x = (float)t->rank;
    for (int j = 0; j < size; j++) sum += (float)want_ranks[j];
    comm_all_reduce(g, NULL, &x, 1, COMM_F32, COMM_SUM);
    bad += x != sum;
    return bad;
}

static void test_mesh(T *t, int dp, int tp, int pp) {
    CommMesh m;
    char err[256], line[64];
    long bad = 0;
    if (comm_mesh_build(t->c, dp, 1, tp, pp, &m, err, sizeof err)) {
        snprintf(line, sizeof line, "mesh dp=%d tp=%d pp=%d", dp, tp, pp);
        report(t, line, 1, "%s", err);
        return;
    }
    int r = t->rank, tr = r % tp, dr = r / tp % dp, pr = r / (tp * dp), want[COMM_MAX_RANKS];
    bad += m.dp != dp || m.tp != tp || m.pp != pp || m.tp_rank != tr || m.dp_rank != dr || m.pp_rank != pr;
    bad += comm_mesh_rank(&m, dr, 0, tr, pr) != r;
    for (int j = 0; j < tp; j++) want[j] = j + tp * (dr + dp * pr);
    bad += mesh_group(t, &m.tp_group, 1, tp, tr, want);
    for (int j = 0; j < dp; j++) want[j] = tr + tp * (j + dp * pr);
    bad += mesh_group(t, &m.dp_group, 1, dp, dr, want);
    for (int j = 0; j < pp; j++) want[j] = tr + tp * (dr + dp * j);
    bad += mesh_group(t, &m.pp_group, 1, pp, pr, want);
    int ends = pp == 1 ? 1 : 2;
    want[0] = tr + tp * dr;
    want[1] = tr + tp * (dr + dp * (pp - 1));
    bad += mesh_group(t, &m.embed_group, pr == 0 || pr == pp - 1, ends, pr == 0 ? 0 : 1, want);
    snprintf(line, sizeof line, "mesh dp=%d tp=%d pp=%d", dp, tp, pp);
    report(t, line, bad, "coordinates, tp/dp/pp/embed groups, and all-reduced world rank ids per group");
    comm_mesh_free(&m);
}

/* ---- point-to-point on the world --------------------------------------------- */

static long expect(T *t, const void *buf, size_t n, int j, float add) {
    long bad = 0;
    get(t, t->h, buf, n * 4);
    for (size_t k = 0; k < n; k++) bad += t->h[k] != val(j, k) + add;
    return bad;
}

static void fill(T *t, void *buf, size_t n, int j, float add) {
    for (size_t k = 0; k < n; k++) t->h[k] = val(j, k) + add;
    put(t, buf, t->h, n * 4);
}

static void test_p2p(T *t) {
    CommGroup *w = &t->c->world;
    int W = t->world, r = t->rank, right = (r + 1) % W, left = (r + W - 1) % W;
    size_t ns[2] = { 7, BIG };
    long bad = 0;
    /* a ring through comm_sendrecv */
    for (int i = 0; i < 2; i++) {
        fill(t, t->x, ns[i], r, 0);
        comm_sendrecv(w, t->d, t->x, right, t->y, left, ns[i], COMM_F32);
        bad += expect(t, t->y, ns[i], left, 0);
    }
    report(t, "ring_sendrecv", bad, "lengths 7 and %d to the right, from the left, %d ranks", BIG, W);

    /* the same ring with plain send/recv: even ranks send first, odd ranks receive first */
    bad = 0;
    for (int i = 0; i < 2 && W > 1; i++) {
        fill(t, t->x, ns[i], r, 1);
        if (r % 2 == 0) {
            comm_send(w, t->d, t->x, ns[i], COMM_F32, right);
            comm_recv(w, t->d, t->y, ns[i], COMM_F32, left);
        } else {
            comm_recv(w, t->d, t->y, ns[i], COMM_F32, left);
            comm_send(w, t->d, t->x, ns[i], COMM_F32, right);
        }
        bad += expect(t, t->y, ns[i], left, 1);
    }
    report(t, "ring_send_recv", bad, "lengths 7 and %d, even ranks send first", BIG);

    /* back and forth between neighbours (0,1), (2,3), ...: 3 rounds */
    bad = 0;
    int partner = r ^ 1;
    if (partner < W) {
        for (int round = 0; round < 3; round++) {
            if (r % 2 == 0) {
                fill(t, t->x, BIG, r, (float)round);
                comm_send(w, t->d, t->x, BIG, COMM_F32, partner);
                comm_recv(w, t->d, t->y, BIG, COMM_F32, partner);
                bad += expect(t, t->y, BIG, partner, (float)round + 10);
            } else {
                comm_recv(w, t->d, t->y, BIG, COMM_F32, partner);
                bad += expect(t, t->y, BIG, partner, (float)round);
                fill(t, t->x, BIG, r, (float)round + 10);
                comm_send(w, t->d, t->x, BIG, COMM_F32, partner);
            }
        }
    }
    report(t, "neighbour_ping_pong", bad, "3 round trips of %d floats between ranks 2i and 2i+1", BIG);

    /* a pipeline: forward down the chain, then backward up it, plain send/recv */
    bad = 0;
    if (r == 0) fill(t, t->x, BIG, 0, 0);
    else comm_recv(w, t->d, t->x, BIG, COMM_F32, r - 1);
    get(t, t->h, t->x, BIG * 4);
    for (size_t k = 0; k < BIG; k++) {   /* stage r got val + r */
        bad += t->h[k] != val(0, k) + (float)r;
        t->h[k] += 1;
    }
    put(t, t->x, t->h, BIG * 4);
    if (r < W - 1) comm_send(w, t->d, t->x, BIG, COMM_F32, r + 1);
    if (r < W - 1) comm_recv(w, t->d, t->x, BIG, COMM_F32, r + 1);
    get(t, t->h, t->x, BIG * 4);
    for (size_t k = 0; k < BIG; k++) {   /* W adds on the way down, W-1-r on the way up */
        bad += t->h[k] != val(0, k) + (float)(2 * W - 1 - r);
        t->h[k] += 1;
    }
    put(t, t->x, t->h, BIG * 4);
    if (r > 0) comm_send(w, t->d, t->x, BIG, COMM_F32, r - 1);
    report(t, "pipeline_chain", bad, "%d floats forward through %d stages and back, each adding 1", BIG, W);

    /* both neighbours at once, in one batch (an interleaved pipeline's exchange) */
    bad = 0;
    void *to_left = (float *)t->y + BIG / 2;   /* y holds 2 messages of BIG/2 */
    size_t half = BIG / 2;
    fill(t, t->x, half, r, 0);
    fill(t, to_left, half, r, 1000);
    float *from_left = (float *)t->x + half, *from_right = (float *)t->y;
    comm_p2p_begin(t->c);
    comm_send(w, t->d, t->x, half, COMM_F32, right);
    comm_send(w, t->d, to_left, half, COMM_F32, left);
    comm_recv(w, t->d, from_left, half, COMM_F32, left);
    comm_recv(w, t->d, from_right, half, COMM_F32, right);
    comm_p2p_end(t->c);
    bad += expect(t, from_left, half, left, 0);
    bad += expect(t, from_right, half, right, 1000);
    report(t, "batch_both_neighbours", bad, "%zu floats to and from both neighbours in one comm_p2p_begin/end", half);

    /* a rank sending to itself, several chunks, batched */
    bad = 0;
    fill(t, t->x, BIG, r, 5);
    comm_p2p_begin(t->c);
    comm_send(w, t->d, t->x, BIG, COMM_F32, r);
    comm_recv(w, t->d, t->y, BIG, COMM_F32, r);
    comm_p2p_end(t->c);
    bad += expect(t, t->y, BIG, r, 5);
    report(t, "batch_self", bad, "%d floats from each rank to itself", BIG);
}

/* ---- accounting ----------------------------------------------------------------- */

static void test_stats(T *t) {
    Comm *c = t->c;
    CommGroup *w = &c->world, g3;
    int W = t->world, r = t->rank;
    size_t n = 1000, off, cnt;
    uint64_t B = n * 4, calls;
    long bad = 0;
    comm_split(c, r < 3 ? 0 : COMM_NO_COLOR, r, "first3", &g3);
    comm_stats_reset(c);
    comm_shard(n, W, r, &off, &cnt);
    comm_all_reduce(w, t->d, t->x, n, COMM_F32, COMM_SUM);
    comm_reduce_scatter(w, t->d, t->y, t->x, n, COMM_F32, COMM_SUM);
    comm_all_gather(w, t->d, t->x, t->y, n, COMM_F32);
    comm_broadcast(w, t->d, t->x, n, COMM_F32, 0);
    comm_reduce(w, t->d, t->x, n, COMM_F32, COMM_SUM, 0);
    comm_sendrecv(w, t->d, t->x, (r + 1) % W, t->y, (r + W - 1) % W, n, COMM_F32);
    comm_barrier(w);
    comm_barrier(w);
    for (int i = 0; i < 3; i++) comm_all_reduce(&g3, t->d, t->x, 7, COMM_F32, COMM_AVG);
    get(t, t->h, t->x, 4);
    struct { CommKind k; const char *g; uint64_t calls, bytes; } want[] = {
        { COMM_ALL_REDUCE, "world", 1, 2 * (uint64_t)(W - 1) * B / (uint64_t)W },
        { COMM_REDUCE_SCATTER, "world", 1, (uint64_t)(W - 1) * B / (uint64_t)W },
        { COMM_ALL_GATHER, "world", 1, (uint64_t)(W - 1) * B / (uint64_t)W },
        { COMM_BROADCAST, "world", 1, W > 1 ? B : 0 },
        { COMM_REDUCE, "world", 1, W > 1 ? B : 0 },
        { COMM_SEND, "world", 1, B },
        { COMM_RECV, "world", 1, B },
        { COMM_BARRIER, "world", 2, 0 },
        { COMM_ALL_REDUCE, "first3", r < 3 ? 3 : 0, r < 3 ? 3 * (2 * (uint64_t)(g3.size - 1) * 28 / (uint64_t)g3.size) : 0 },
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        uint64_t b = comm_stats_bytes(c, want[i].k, want[i].g, &calls);
        if (b != want[i].bytes || calls != want[i].calls) {
            bad++;
            printf("  %s %s: %llu calls %llu bytes, want %llu and %llu\n", comm_kind_name(want[i].k), want[i].g,
                   (unsigned long long)calls, (unsigned long long)b, (unsigned long long)want[i].calls,
                   (unsigned long long)want[i].bytes);
        }
    }
    if (r == 0) comm_stats_print(c, stdout);
    report(t, "byte_counts", bad, "%zu (kind, group) rows against 2(n-1)/n B, (n-1)/n B, B; B = %llu bytes, n = %d",
           sizeof want / sizeof want[0], (unsigned long long)B, W);
    comm_group_free(&g3);
}

static void test_barrier(T *t) {
    int last = t->world - 1;
    if (t->rank == last) nanosleep(&(struct timespec){ 0, 300000000L }, NULL);
    double t0 = now_s();
    comm_barrier(&t->c->world);
    double waited = now_s() - t0;
    report(t, "barrier", t->rank != last && waited < 0.15, "ranks waited for rank %d's 0.3 s nap (rank 0: %.2f s)",
           last, waited);
}

/* ---- launch plans (before any rank exists) ------------------------------------- */

static const char *launch_vars[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
    "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_USE_AGENT_STORE", "SLURM_STEP_ID", "SLURM_STEPID", "SLURM_STEP_NUM_TASKS", "PMI_RANK",
    "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "TRAIN_JOB_TOKEN",
    "OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE",
};

static void clear_launch_env(void) {
    for (size_t i = 0; i < sizeof launch_vars / sizeof launch_vars[0]; i++) unsetenv(launch_vars[i]);
}

static void test_plans(Checks *ck) {
    CommLaunch l;
    char err[256] = "";
    int rc;
    clear_launch_env();
    rc = comm_launch_plan(8, &l, err, sizeof err);
    check(ck, !rc && l.kind == COMM_LAUNCH_FORK && l.world_size == 8, "plan_fork", "--ranks 8: fork %d ranks",
          l.world_size);
    rc = comm_launch_plan(0, &l, err, sizeof err);
    check(ck, !rc && l.kind == COMM_LAUNCH_SINGLE && l.world_size == 1, "plan_single", "no launcher: %s rank",
          l.source);
    rc = comm_launch_plan(100, &l, err, sizeof err);
    check(ck, rc && !strcmp(err, "--ranks 100: must be 1 to 64"), "plan_too_many", "\"%s\"", err);
    setenv("RANK", "2", 1); setenv("WORLD_SIZE", "4", 1); setenv("LOCAL_RANK", "2", 1);
    setenv("MASTER_ADDR", "node7", 1); setenv("MASTER_PORT", "29500", 1); setenv("TORCHELASTIC_RUN_ID", "r1", 1);
    rc = comm_launch_plan(0, &l, err, sizeof err);
    check(ck, !rc && l.kind == COMM_LAUNCH_ENV && l.rank == 2 && l.world_size == 4 && l.local_rank == 2 &&
              !strcmp(l.source, "torchrun") && !strcmp(l.master_addr, "node7") && l.rendezvous_port == 29500,
          "plan_torchrun", "rank %d of %d, local %d, rendezvous %s:%d", l.rank, l.world_size, l.local_rank,
          l.master_addr, l.rendezvous_port);
    setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
    rc = comm_launch_plan(0, &l, err, sizeof err);
    check(ck, !rc && l.rendezvous_port == 29501, "plan_agent_store",
          "torchrun's agent holds MASTER_PORT: rank 0 listens on %d", l.rendezvous_port);
    rc = comm_launch_plan(8, &l, err, sizeof err);
    check(ck, rc && !strcmp(err, "--ranks 8 cannot be used inside a launcher that started 4 ranks (WORLD_SIZE=4)"),
          "plan_conflict", "\"%s\"", err);
    setenv("RANK", "x", 1);
    rc = comm_launch_plan(0, &l, err, sizeof err);
    check(ck, rc && !strcmp(err, "RANK=x is not a whole number"), "plan_malformed", "\"%s\"", err);
    clear_launch_env();
    setenv("SLURM_PROCID", "5", 1); setenv("SLURM_NTASKS", "16", 1); setenv("SLURM_LOCALID", "1", 1);
    setenv("SLURM_NTASKS_PER_NODE", "8", 1);
    rc = comm_launch_plan(0, &l, err, sizeof err);
    check(ck, !rc && l.kind == COMM_LAUNCH_SINGLE && l.world_size == 1, "plan_slurm_batch",
          "SLURM_PROCID/SLURM_NTASKS without SLURM_STEP_ID (a batch script's shell): %s rank", l.source);
    setenv("SLURM_STEP_ID", "0", 1); setenv("MASTER_PORT", "29500", 1); setenv("MASTER_ADDR", "node7", 1);
    setenv("SLURM_JOB_ID", "42", 1);
    rc = comm_launch_plan(0, &l, err, sizeof err);
    check(ck, !rc && l.kind == COMM_LAUNCH_ENV && l.rank == 5 && l.world_size == 16 && l.local_rank == 1 &&
              l.local_size == 8 && !strcmp(l.source, "slurm"),
          "plan_slurm", "srun task (SLURM_STEP_ID=0): rank %d of %d, local %d of %d", l.rank, l.world_size,
          l.local_rank, l.local_size);
    clear_launch_env();
    setenv("OMPI_COMM_WORLD_RANK", "3", 1); setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    rc = comm_launch_plan(0, &l, err, sizeof err);
    check(ck, rc && strstr(err, "is not a rank of the world"), "plan_bad_rank", "\"%s\"", err);
    clear_launch_env();
}

/* ---- soak: collectives in a loop, for the fault test --------------------------- */

static int soak(T *t, double seconds, int fail_rank, double fail_after) {
    CommGroup *w = &t->c->world;
    size_t n = 1 << 18;
    int W = t->world, r = t->rank, iters = 0;
    printf("rank %d pid %d\n", r, (int)getpid());
    fflush(stdout);
    double t0 = now_s();
    for (int32_t go = 1; go; iters++) {
        fill(t, t->x, n, r, 0);
        comm_all_reduce(w, t->d, t->x, n, COMM_F32, COMM_SUM);
        comm_sendrecv(w, t->d, t->x, (r + 1) % W, t->y, (r + W - 1) % W, n, COMM_F32);
        comm_barrier(w);
        go = now_s() - t0 < seconds;
        comm_broadcast(w, NULL, &go, 1, COMM_I32, 0);
        if (r == fail_rank && now_s() - t0 >= fail_after) {
            fprintf(stderr, "rank %d exits with status 3 on purpose\n", r);
            exit(3);
        }
    }
    if (r == 0) printf("soak: %d iterations on %d ranks in %.1f s\n", iters, W, now_s() - t0);
    return 0;
}

int main(int argc, char **argv) {
    int ranks = -1, fail_rank = -1, use_nccl = 0;
    double soak_s = 0, fail_after = 0;
    DevKind kind = DEV_CPU;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--ranks") && v) ranks = atoi(v), i++;
        else if (!strcmp(a, "--soak") && v) soak_s = atof(v), i++;
        else if (!strcmp(a, "--fail-rank") && v) fail_rank = atoi(v), i++;
        else if (!strcmp(a, "--fail-after") && v) fail_after = atof(v), i++;
        else if (!strcmp(a, "--device") && v) kind = strcmp(v, "cuda") ? DEV_CPU : DEV_CUDA, i++;
        else if (!strcmp(a, "--nccl")) use_nccl = 1, kind = DEV_CUDA;
        else { fprintf(stderr, "usage: %s [--ranks N] [--device cpu|cuda] [--nccl] [--soak S [--fail-rank R --fail-after T]]\n", argv[0]); return 2; }
    }
    int under_launcher = getenv("WORLD_SIZE") || getenv("SLURM_NTASKS") || getenv("OMPI_COMM_WORLD_SIZE");
    if (ranks < 0) ranks = under_launcher ? 0 : soak_s > 0 ? 4 : 8;

    Checks pre = { 0, 0, 0 };
    if (!under_launcher && soak_s == 0) test_plans(&pre);   /* one process yet: plain lines */

    CommLaunch l;
    char err[512];
    if (comm_launch(ranks, &l, err, sizeof err)) { printf("FAIL launch: %s\n", err); return 1; }
    Dev dev;
    int gpus = dev_gpu_count();
    if (kind == DEV_CUDA && gpus == 0) {
        if (l.rank == 0) check_skip(&pre, "comm_cuda", "no GPU visible");
        return 0;
    }
    if (dev_open(&dev, kind, kind == DEV_CUDA ? l.local_rank % gpus : -1, err, sizeof err)) {
        printf("FAIL device: %s\n", err);
        return 1;
    }
    Comm c;
    if (comm_init(&c, &l, use_nccl ? COMM_NCCL : COMM_SHM, &dev, err, sizeof err)) {
        printf("FAIL comm_init rank %d: %s\n", l.rank, err);
        return 1;
    }
    T t = { .c = &c, .d = &dev, .rank = c.rank, .world = c.world_size };
    t.h = malloc(BIG * sizeof(float));
    t.e = malloc(BIG * sizeof(float));
    t.x = dev_alloc(&dev, BIG * sizeof(float));
    t.y = dev_alloc(&dev, BIG * sizeof(float));
    int rc = 0;
    if (soak_s > 0) {
        rc = soak(&t, soak_s, fail_rank, fail_after);
    } else {
        double t0 = now_s();
        if (t.rank == 0)
            printf("test_comm: %d ranks (%s), %s backend, buffers on %s\n", t.world, l.source,
                   use_nccl ? "NCCL" : "shared-memory", kind == DEV_CUDA ? "the GPU" : "the CPU");
        test_mesh_shape(&t);
        for (int G = 1; G <= t.world; G++) test_group_ops(&t, G);
        test_identical(&t);
        test_host_chunks(&t);
        for (int dp = 1; dp <= t.world; dp++)
            for (int tp = 1; dp * tp <= t.world; tp++)
                if (t.world % (dp * tp) == 0) test_mesh(&t, dp, tp, t.world / (dp * tp));
        test_p2p(&t);
        test_stats(&t);
        test_barrier(&t);
        if (t.rank == 0)
            printf("test_comm: %d passed, %d failed on %d ranks in %.1f s\n", t.checks.passed + pre.passed,
                   t.checks.failed + pre.failed, t.world, now_s() - t0);
        rc = t.rank == 0 ? (t.checks.failed || pre.failed) : 0;   /* rank 0 speaks for all */
    }
    dev_free(&dev, t.x, BIG * sizeof(float));
    dev_free(&dev, t.y, BIG * sizeof(float));
    free(t.h);
    free(t.e);
    comm_free(&c);
    dev_close(&dev);
    return rc;
}
