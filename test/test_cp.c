/* test/test_cp.c: context parallelism's ring attention (cp.c) against
 * ops.c's attention over the whole sequence.
 *
 * For N = 1, 2, 4 (and a head size and sequence that leave no slack), the N
 * ranks of a ring are played in one process: rank r's rows are the
 * sequence's positions cp_position(N, r, T, i), each rank meets every
 * rank's block of keys and values in ring order, and the outputs, the
 * log-sum-exp and every gradient of q, k, v are compared with
 * cpu_attention_forward / _backward over the whole sequence. Then the
 * balance: the (query, key) scores each rank computes, counted, equal
 * within 1%. test/test_cp_mutants.sh builds this test over cp.c with a bug
 * planted and expects it to fail.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
    float *out = check_xmalloc(N * lo * 4), *lse = check_xmalloc(N * ll * 4), *D = check_xmalloc(N * ll * 4);
    float *dq = check_xmalloc(N * lq * 4), *dkv = check_xmalloc(N * lk * 4);
    for (int r = 0; r < N; r++)
        for (int b = 0; b < B; b++)
            for (int i = 0; i < Tl; i++) {
                size_t at = (size_t)b * T + cp_position(N, r, T, i), row = (size_t)b * Tl + i;
                memcpy(q + r * lq + row * 3 * C, qkv + at * 3 * C, 3 * (size_t)C * 4);
                memcpy(g + r * lo + row * C, dout + at * C, (size_t)C * 4);
            }
    uint64_t pairs[4] = {0};
    for (int r = 0; r < N; r++) cp_pack_kv(kv + r * lk, q + r * lq, B, Tl, C);
    for (int r = 0; r < N; r++) {
        memset(out + r * lo, 0, lo * 4);
        for (size_t i = 0; i < ll; i++) lse[r * ll + i] = -INFINITY;
        for (int step = 0; step < N; step++) {
            int s = (r + N - step) % N;
            cp_block_forward(out + r * lo, lse + r * ll, q + r * lq, kv + s * lk, B, T, C, NH, N, r, s, &pairs[r]);
        }
    }
    memset(dq, 0, N * lq * 4);
    memset(dkv, 0, N * lk * 4);
    for (int r = 0; r < N; r++) {
        cp_backward_prep(D + r * ll, out + r * lo, g + r * lo, B, Tl, C, NH);
        for (int step = 0; step < N; step++) {
            int s = (r + N - step) % N;
            cp_block_backward(dq + r * lq, dkv + s * lk, q + r * lq, kv + s * lk, out + r * lo, lse + r * ll,
                              D + r * ll, g + r * lo, B, T, C, NH, N, r, s);
        }
    }
    for (int r = 0; r < N; r++) cp_unpack_dkv(dq + r * lq, dkv + r * lk, B, Tl, C);
    /* back to the sequence's order, and the log-sum-exp from the reference's probabilities */
    float *o_all = check_xmalloc(nout * 4), *d_all = check_xmalloc(nqkv * 4);
    double lse_err = 0;
    for (int r = 0; r < N; r++)
        for (int b = 0; b < B; b++)
            for (int i = 0; i < Tl; i++) {
                int p = cp_position(N, r, T, i);
                size_t at = (size_t)b * T + p, row = (size_t)b * Tl + i;
                memcpy(o_all + at * C, out + r * lo + row * C, (size_t)C * 4);
                memcpy(d_all + at * 3 * C, dq + r * lq + row * 3 * C, 3 * (size_t)C * 4);
                /* lse = s_pp - log P[p][p]: the diagonal's score against its probability */
                for (int h = 0; h < NH; h++) {
                    int hs = C / NH;
                    const float *qq = qkv + at * 3 * C + h * hs, *kk = qq + C;
                    double s = 0;
                    for (int x = 0; x < hs; x++) s += (double)qq[x] * kk[x];
                    s /= sqrt((double)hs);
                    double want = s - log((double)att[(((size_t)b * NH + h) * T + p) * T + p]);
                    double e = fabs(want - lse[r * ll + ((size_t)b * NH + h) * Tl + i]);
                    if (!(e <= lse_err)) lse_err = e;
                }
            }
    char name[128];
    double eo = max_diff(o_all, out_ref, nout), ed = max_diff(d_all, dqkv_ref, nqkv);
    snprintf(name, sizeof name, "cp %d ring attention forward (B %d T %d C %d NH %d)", N, B, T, C, NH);
    check(c, eo < 2e-5, name, "max |out - whole sequence| %.2e (bound 2e-5)", eo);
    snprintf(name, sizeof name, "cp %d ring log-sum-exp (B %d T %d C %d NH %d)", N, B, T, C, NH);
    check(c, lse_err < 1e-4, name, "max |lse - s_pp + log P_pp| %.2e (bound 1e-4)", lse_err);
    snprintf(name, sizeof name, "cp %d ring attention backward, dq dk dv (B %d T %d C %d NH %d)", N, B, T, C, NH);
    check(c, ed < 5e-5, name, "max |dqkv - whole sequence| %.2e (bound 5e-5)", ed);
    uint64_t lo_p = pairs[0], hi_p = pairs[0], total = 0;
    for (int r = 0; r < N; r++) {
        if (pairs[r] < lo_p) lo_p = pairs[r];
        if (pairs[r] > hi_p) hi_p = pairs[r];
        total += pairs[r];
    }
    uint64_t want = (uint64_t)B * NH * T * (T + 1) / 2;
    snprintf(name, sizeof name, "cp %d balance: every rank's attention work (T %d)", N, T);
    check(c, total == want && (double)(hi_p - lo_p) <= 0.01 * (double)hi_p, name,
          "scores a rank %llu .. %llu (spread %.3f%%), %llu in all (the causal triangle: %llu)",
          (unsigned long long)lo_p, (unsigned long long)hi_p, 100.0 * (double)(hi_p - lo_p) / (double)hi_p,
          (unsigned long long)total, (unsigned long long)want);
    free(qkv); free(dout); free(att); free(datt); free(out_ref); free(dqkv_ref); free(q); free(g); free(kv);
    free(out); free(lse); free(D); free(dq); free(dkv); free(o_all); free(d_all);
}

int main(void) {
    Checks c = {0};
    char err[256];
    one(&c, 2, 16, 16, 2, 1, 1);
    one(&c, 2, 16, 16, 2, 2, 2);
    one(&c, 2, 32, 32, 4, 4, 3);
    one(&c, 1, 24, 24, 3, 2, 4);   /* head size 8, 6-token chunks */
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
