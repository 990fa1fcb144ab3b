/* test/test_cp.c: context parallelism's ring attention (cp.c) against
 * ops.c's attention over the whole sequence.
 *
 * For N = 1, 2, 4 (and a head size and sequence that leave no slack), the N
 * ranks of a ring are played in one process: rank r's rows are the
 * sequence's positions cp_position(N, r, T, i), each rank meets every
 * rank's block of keys and values in ring order, and the outputs, the
 * log-sum-exp and every gradient of q, k, v are compared with
 * cpu_attention_forward / _backward over the whole sequence, for both
 * ways cp.c computes a block: the plain loops (the specification) and the
 * fast path the ring runs (chunk pairs through gemm.c), including chunks
 * longer than its blocks of query rows. Then the balance: the (query, key)
 * scores each rank computes, counted, equal within 1%; and the fast path's
 * bits the same on 1 thread as on 3. test/test_cp_mutants.sh builds this
 * test over cp.c with a bug planted and expects it to fail.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "tensor.h"
#include "cp.h"
#include "check.h"

typedef float real;
#define OP(name) cpu_##name
#include "ops.h"

static double max_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= m)) m = d;   /* a NaN counts */
    }
    return m;
}

typedef void (*BlockForward)(float *, float *, const float *, const float *, int, int, int, int, int, int, int,
                             uint64_t *);
typedef void (*BlockBackward)(float *, float *, const float *, const float *, const float *, const float *,
                              const float *, const float *, int, int, int, int, int, int, int);

/* What a ring of N ranks computes, each rank's rows in its order. */
typedef struct {
    float *out, *lse, *D, *dq, *dkv;   /* [N][B,Tl,C], [N][B,NH,Tl] x2, [N][B,Tl,3C], [N][B,Tl,2C] */
    uint64_t pairs[4];                 /* scores each rank computed */
} Ring;

/* The N ranks played in one process: rank r's queries q [N][B,Tl,3C] meet
 * every rank's keys and values in ring order, forward then backward with
 * the gradients g [N][B,Tl,C], through fwd and bwd. */
static void ring(Ring *x, BlockForward fwd, BlockBackward bwd, const float *q, const float *g, const float *kv,
                 int B, int T, int C, int NH, int N) {
    int Tl = T / N;
    size_t lq = (size_t)B * Tl * 3 * C, lo = (size_t)B * Tl * C, lk = (size_t)B * Tl * 2 * C, ll = (size_t)B * NH * Tl;
    x->out = check_xmalloc(N * lo * 4); x->lse = check_xmalloc(N * ll * 4); x->D = check_xmalloc(N * ll * 4);
    x->dq = check_xmalloc(N * lq * 4); x->dkv = check_xmalloc(N * lk * 4);
    memset(x->pairs, 0, sizeof x->pairs);
    for (int r = 0; r < N; r++) {
        memset(x->out + r * lo, 0, lo * 4);
        for (size_t i = 0; i < ll; i++) x->lse[r * ll + i] = -INFINITY;
        for (int step = 0; step < N; step++) {
            int s = (r + N - step) % N;
            fwd(x->out + r * lo, x->lse + r * ll, q + r * lq, kv + s * lk, B, T, C, NH, N, r, s, &x->pairs[r]);
        }
    }
    memset(x->dq, 0, N * lq * 4);
    memset(x->dkv, 0, N * lk * 4);
    for (int r = 0; r < N; r++) {
        cp_backward_prep(x->D + r * ll, x->out + r * lo, g + r * lo, B, Tl, C, NH);
        for (int step = 0; step < N; step++) {
            int s = (r + N - step) % N;
            bwd(x->dq + r * lq, x->dkv + s * lk, q + r * lq, kv + s * lk, x->out + r * lo, x->lse + r * ll,
                x->D + r * ll, g + r * lo, B, T, C, NH, N, r, s);
        }
    }
    for (int r = 0; r < N; r++) cp_unpack_dkv(x->dq + r * lq, x->dkv + r * lk, B, Tl, C);
}

static void ring_free(Ring *x) { free(x->out); free(x->lse); free(x->D); free(x->dq); free(x->dkv); }

/* A ring's outputs and gradients against the whole sequence's (out_ref,
 * dqkv_ref, the probabilities att), and its balance. */
static void against(Checks *c, const char *path, Ring *x, const float *qkv, const float *out_ref,
                    const float *dqkv_ref, const float *att, int B, int T, int C, int NH, int N) {
    int Tl = T / N, hs = C / NH;
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C;
    size_t lq = (size_t)B * Tl * 3 * C, lo = (size_t)B * Tl * C, ll = (size_t)B * NH * Tl;
    /* back to the sequence's order, and the log-sum-exp from the reference's probabilities */
    float *o_all = check_xmalloc(nout * 4), *d_all = check_xmalloc(nqkv * 4);
    double lse_err = 0;
    for (int r = 0; r < N; r++)
        for (int b = 0; b < B; b++)
            for (int i = 0; i < Tl; i++) {
                int p = cp_position(N, r, T, i);
                size_t at = (size_t)b * T + p, row = (size_t)b * Tl + i;
                memcpy(o_all + at * C, x->out + r * lo + row * C, (size_t)C * 4);
                memcpy(d_all + at * 3 * C, x->dq + r * lq + row * 3 * C, 3 * (size_t)C * 4);
                /* lse = s_pp - log P[p][p]: the diagonal's score against its probability */
                for (int h = 0; h < NH; h++) {
                    const float *qq = qkv + at * 3 * C + h * hs, *kk = qq + C;
                    double s = 0;
                    for (int z = 0; z < hs; z++) s += (double)qq[z] * kk[z];
                    s /= sqrt((double)hs);
                    double want = s - log((double)att[(((size_t)b * NH + h) * T + p) * T + p]);
                    double e = fabs(want - x->lse[r * ll + ((size_t)b * NH + h) * Tl + i]);
                    if (!(e <= lse_err)) lse_err = e;
                }
            }
    char name[160];
    double eo = max_diff(o_all, out_ref, nout), ed = max_diff(d_all, dqkv_ref, nqkv);
    snprintf(name, sizeof name, "cp %d ring attention forward, %s (B %d T %d C %d NH %d)", N, path, B, T, C, NH);
    check(c, eo < 2e-5, name, "max |out - whole sequence| %.2e (bound 2e-5)", eo);
    snprintf(name, sizeof name, "cp %d ring log-sum-exp, %s (B %d T %d C %d NH %d)", N, path, B, T, C, NH);
    check(c, lse_err < 1e-4, name, "max |lse - s_pp + log P_pp| %.2e (bound 1e-4)", lse_err);
    snprintf(name, sizeof name, "cp %d ring attention backward, dq dk dv, %s (B %d T %d C %d NH %d)", N, path, B,
             T, C, NH);
    check(c, ed < 5e-5, name, "max |dqkv - whole sequence| %.2e (bound 5e-5)", ed);
    uint64_t lo_p = x->pairs[0], hi_p = x->pairs[0], total = 0;
    for (int r = 0; r < N; r++) {
        if (x->pairs[r] < lo_p) lo_p = x->pairs[r];
        if (x->pairs[r] > hi_p) hi_p = x->pairs[r];
        total += x->pairs[r];
    }
    uint64_t want = (uint64_t)B * NH * T * (T + 1) / 2;
    snprintf(name, sizeof name, "cp %d balance: every rank's attention work, %s (T %d)", N, path, T);
    check(c, total == want && (double)(hi_p - lo_p) <= 0.01 * (double)hi_p, name,
          "scores a rank %llu .. %llu (spread %.3f%%), %llu in all (the causal triangle: %llu)",
          (unsigned long long)lo_p, (unsigned long long)hi_p, 100.0 * (double)(hi_p - lo_p) / (double)hi_p,
          (unsigned long long)total, (unsigned long long)want);
    free(o_all); free(d_all);
}

static void one(Checks *c, int B, int T, int C, int NH, int N, unsigned long long seed) {
    int Tl = T / N;
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C;
    float *qkv = check_xmalloc(nqkv * 4), *dout = check_xmalloc(nout * 4);
    for (size_t i = 0; i < nqkv; i++) qkv[i] = check_urand(&seed);
    for (size_t i = 0; i < nout; i++) dout[i] = check_urand(&seed);
    /* the reference over the whole sequence */
    size_t scratch, nstate = cpu_attention_floats(B, T, C, NH, &scratch);
    float *att = check_xmalloc(nstate * 4), *datt = check_xmalloc(scratch * 4);
    float *out_ref = check_xmalloc(nout * 4), *dqkv_ref = check_xmalloc(nqkv * 4);
    cpu_attention_forward(NULL, out_ref, att, qkv, B, T, C, NH);
    memset(dqkv_ref, 0, nqkv * 4);
    cpu_attention_backward(NULL, dqkv_ref, datt, dout, qkv, att, B, T, C, NH);
    /* each rank's rows, in its order */
    size_t lq = (size_t)B * Tl * 3 * C, lo = (size_t)B * Tl * C, lk = (size_t)B * Tl * 2 * C, ll = (size_t)B * NH * Tl;
    float *q = check_xmalloc(N * lq * 4), *g = check_xmalloc(N * lo * 4), *kv = check_xmalloc(N * lk * 4);
    for (int r = 0; r < N; r++)
        for (int b = 0; b < B; b++)
            for (int i = 0; i < Tl; i++) {
                size_t at = (size_t)b * T + cp_position(N, r, T, i), row = (size_t)b * Tl + i;
                memcpy(q + r * lq + row * 3 * C, qkv + at * 3 * C, 3 * (size_t)C * 4);
                memcpy(g + r * lo + row * C, dout + at * C, (size_t)C * 4);
            }
    for (int r = 0; r < N; r++) cp_pack_kv(kv + r * lk, q + r * lq, B, Tl, C);
    Ring naive, fast, one_thread;
    ring(&naive, cp_block_forward_naive, cp_block_backward_naive, q, g, kv, B, T, C, NH, N);
    against(c, "plain loops", &naive, qkv, out_ref, dqkv_ref, att, B, T, C, NH, N);
    int threads = omp_get_max_threads();
    omp_set_num_threads(3);
    ring(&fast, cp_block_forward, cp_block_backward, q, g, kv, B, T, C, NH, N);
    against(c, "fast path", &fast, qkv, out_ref, dqkv_ref, att, B, T, C, NH, N);
    /* the fast path on one thread: the same bits */
    omp_set_num_threads(1);
    ring(&one_thread, cp_block_forward, cp_block_backward, q, g, kv, B, T, C, NH, N);
    omp_set_num_threads(threads);
    int same = !memcmp(fast.out, one_thread.out, N * lo * 4) && !memcmp(fast.lse, one_thread.lse, N * ll * 4) &&
               !memcmp(fast.dq, one_thread.dq, N * lq * 4);
    char name[160];
    snprintf(name, sizeof name, "cp %d fast path: 1 thread gives the bits of 3 (B %d T %d C %d NH %d)", N, B, T, C, NH);
    check(c, same, name, "out, lse, dq dk dv %s", same ? "bit-identical" : "DIFFER");
    ring_free(&naive); ring_free(&fast); ring_free(&one_thread);
    free(qkv); free(dout); free(att); free(datt); free(out_ref); free(dqkv_ref); free(q); free(g); free(kv);
}

int main(void) {
    Checks c = {0};
    char err[256];
    one(&c, 2, 16, 16, 2, 1, 1);
    one(&c, 2, 16, 16, 2, 2, 2);
    one(&c, 2, 32, 32, 4, 4, 3);
    one(&c, 1, 24, 24, 3, 2, 4);   /* head size 8, 6-token chunks */
    one(&c, 1, 520, 32, 2, 2, 5);  /* 130-token chunks: a fast-path block of 96 rows and one of 34 */
    one(&c, 2, 384, 32, 2, 4, 6);  /* 48-token chunks: a block shorter than 96, ending at its chunk */
    one(&c, 1, 250, 32, 2, 1, 7);  /* one rank, one run of 250 rows (odd chunks impossible, so no pairs) */
    int r1 = cp_check(4, 24, err, sizeof err);
    int r2 = cp_check(4, 20, err, sizeof err);
    check(&c, r1 == 0 && r2 != 0 && strstr(err, "2 x 4 = 8"), "cp_check: --seq must be a multiple of 2N",
          "24 over 4 ranks %s, 20 refused: %s", r1 == 0 ? "accepted" : "REFUSED", err);
    /* the deal: rank r holds chunks r and 2N-1-r; every position exactly once */
    int seen[64] = {0}, ok = 1;
    for (int r = 0; r < 4; r++)
        for (int i = 0; i < 16; i++) seen[cp_position(4, r, 64, i)]++;
    for (int p = 0; p < 64; p++) ok &= seen[p] == 1;
    check(&c, ok && cp_position(4, 1, 64, 8) == 6 * 8 && cp_position(4, 0, 64, 15) == 7 * 8 + 7,
          "cp positions: 8 chunks dealt in pairs (r, 2N-1-r), each position once", "rank 1 row 8 at %d, rank 0 row 15 at %d",
          cp_position(4, 1, 64, 8), cp_position(4, 0, 64, 15));
    return check_done(&c);
}
