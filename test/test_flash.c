/* test/test_flash.c: the fused bf16 flash attention of attention.cu
 * (tc_flash_forward / tc_flash_backward) against a float64 host reference.
 *
 * Inputs are random bf16 (uniform in [-amp, amp) rounded to bf16); the
 * reference computes, in double and from exactly those bf16 values, the
 * causal softmax of q.k / sqrt(hs), out, the log-sum-exp of each row, and
 * the backward dq, dk, dv for a random bf16 dout. The figures:
 *   out, dq, dk, dv: max |gpu - ref| / max |ref|, tolerance 1e-2 (bf16
 *                    outputs, bf16 probabilities inside the kernels);
 *   lse:             max |gpu - ref|, tolerance 1e-3 (fp32 statistics).
 * out and lse start as NaN on the GPU, so an element the kernel forgets to
 * write fails; dqkv starts as NaN too (the backward writes every element,
 * tensor.h), so a kernel that reads it or leaves one fails; the scratch
 * starts as NaN, so a dQ accumulator that is not zeroed fails. Forward
 * runs twice and its bits must match (it uses no atomics; the default
 * backward's dq does, so it is not checked for bits). The deterministic
 * backward (no atomics) runs twice from the same start, scratch NaN again
 * each time: the same figures as the backward, and the same bits both
 * times. Shapes are ragged (T = 37, 200) and GPT-2's (T 1024, 12 heads
 * of 64), with amp 4 for peaky rows.
 *
 * The ring's chunk pairs (tc_flash_pair_forward / _backward, context
 * parallelism's steps) have their own section below, run_pair_case.
 *
 * attention_sm90.cu's forward (tc_flash_forward_sm90: TMA, mbarriers,
 * wgmma) and backward (tc_flash_backward_sm90), head sizes 64 and 128,
 * have a block of their own ("flash sm90"): out and lse
 * against the same reference and tolerances, out within 1e-2 of
 * attention.cu's tc_flash_forward, dq, dk, dv written over a NaN dqkv
 * (scratch NaN too), the same bits run to run, over shapes
 * with odd B*NH and T not a multiple of its 128-row tiles (one to eight
 * query blocks, so its two-stage ring wraps). Where it cannot run (not an
 * sm_90a build on a compute capability 9.0 device; under the emulation
 * unless EMU_ARCH=sm_90a) it prints one SKIP line. FLASH_ONLY=sm90 runs
 * only that block (test/test_flash_sm90_emu.sh uses it).
 *
 * Without a CUDA build or a visible GPU every group prints one SKIP line.
 *
 * Built with -DFLASH_EMU and linked against test/emu/ (test/test_flash_emu),
 * the same checks run attention.cu's kernels under the CPU emulation; every
 * name then ends in "(cpu emulation, ...)" with the emulation's settings, and
 * the two GPT-2 shapes become one head of T 1024 (amp 4) unless
 * FLASH_EMU_FULL=1 is set (about 25 s more on 2 cores).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tensor.h"
#include "tc.h"
#include "check.h"

#ifdef FLASH_EMU
const char *emu_describe(void); /* test/emu/emu_rt.cpp: "cpu emulation, cp.async late, ..." */
#define FLASH_TAG_FMT " (%s)"
#define FLASH_TAG emu_describe()
#else
#define FLASH_TAG_FMT "%s"
#define FLASH_TAG ""
#endif

static const char *const groups[] = {"flash forward", "flash backward", "flash determinism", "flash pair",
                                      "flash sm90"};

#ifdef USE_CUDA

#define TOL_REL 1e-2
#define TOL_LSE 1e-3

typedef struct Rng { unsigned long long s; } Rng;  /* xorshift64* state */

static float urand(Rng *r) { return check_urand(&r->s); }  /* uniform in [-1, 1) */

#define xmalloc check_xmalloc

/* The float64 reference, one (b, h) pair per iteration: each pair owns its
 * channels of dqkv at every position, so the pairs never write the same
 * element. qkv [B,T,3C], dout [B,T,C] as floats (exact bf16 values);
 * out [B,T,C], lse [B,NH,T] written; dqkv [B,T,3C] accumulated (+=) onto
 * the zeros the caller gives. */
static void reference(int B, int T, int C, int NH, const float *qkv, const float *dout,
                      double *out, double *lse, double *dqkv) {
    const int hs = C / NH;
    const double scale = 1.0 / sqrt((double)hs);
    const size_t C3 = (size_t)3 * C;
#ifdef _OPENMP
#pragma omp parallel for collapse(2) schedule(dynamic)
#endif
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            double *p = xmalloc((size_t)T * sizeof(double));
            double *dp = xmalloc((size_t)T * sizeof(double));
            for (int t = 0; t < T; t++) {
                const float *q = qkv + ((size_t)b * T + t) * C3 + (size_t)h * hs;
                double m = -INFINITY;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *k = qkv + ((size_t)b * T + t2) * C3 + C + (size_t)h * hs;
                    double s = 0;
                    for (int i = 0; i < hs; i++) s += (double)q[i] * k[i];
                    p[t2] = s * scale;
                    if (p[t2] > m) m = p[t2];
                }
                double sum = 0;
                for (int t2 = 0; t2 <= t; t2++) { p[t2] = exp(p[t2] - m); sum += p[t2]; }
                for (int t2 = 0; t2 <= t; t2++) p[t2] /= sum;
                lse[((size_t)b * NH + h) * T + t] = m + log(sum);

                double *o = out + ((size_t)b * T + t) * C + (size_t)h * hs;
                const float *g = dout + ((size_t)b * T + t) * C + (size_t)h * hs;
                for (int i = 0; i < hs; i++) o[i] = 0;
                double D = 0;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *v = qkv + ((size_t)b * T + t2) * C3 + 2 * (size_t)C + (size_t)h * hs;
                    double *dv = dqkv + ((size_t)b * T + t2) * C3 + 2 * (size_t)C + (size_t)h * hs;
                    double s = 0;
                    for (int i = 0; i < hs; i++) {
                        o[i] += p[t2] * v[i];
                        s += (double)g[i] * v[i];
                        dv[i] += p[t2] * g[i];
                    }
                    dp[t2] = s;
                    D += p[t2] * s;
                }
                double *dq = dqkv + ((size_t)b * T + t) * C3 + (size_t)h * hs;
                for (int t2 = 0; t2 <= t; t2++) {
                    const double ds = p[t2] * (dp[t2] - D) * scale;
                    const float *k = qkv + ((size_t)b * T + t2) * C3 + C + (size_t)h * hs;
                    double *dk = dqkv + ((size_t)b * T + t2) * C3 + C + (size_t)h * hs;
                    for (int i = 0; i < hs; i++) {
                        dq[i] += ds * k[i];
                        dk[i] += ds * q[i];
                    }
                }
            }
            free(p);
            free(dp);
        }
    }
}

/* h[n] = bf16 of amp * uniform(-1, 1) (urand), f[n] = the floats they are exactly. */
static void bf16_random(uint16_t *h, float *f, size_t n, float amp, Rng *rng) {
    for (size_t i = 0; i < n; i++) {
        h[i] = bf16_from_f32(amp * urand(rng));
        f[i] = bf16_to_f32(h[i]);
    }
}

/* max |got - want| / max |ref| over n values with stride `step` between rows
 * of `width` values (a channel range of a [rows][step] buffer); infinite on
 * a NaN. got is bf16; want is what got should hold, ref the magnitude scale. */
static double rel_err_bf16(const uint16_t *got, const double *want, const double *ref, size_t rows,
                           size_t step, size_t off, size_t width) {
    double diff = 0, mag = 1e-30;
    for (size_t r = 0; r < rows; r++) {
        for (size_t i = 0; i < width; i++) {
            size_t j = r * step + off + i;
            double x = bf16_to_f32(got[j]);
            if (isnan(x)) return INFINITY;
            double e = fabs(x - want[j]);
            if (e > diff) diff = e;
            if (fabs(ref[j]) > mag) mag = fabs(ref[j]);
        }
    }
    return diff / mag;
}

static double max_abs(const double *x, size_t rows, size_t step, size_t off, size_t width) {
    double m = 0;
    for (size_t r = 0; r < rows; r++)
        for (size_t i = 0; i < width; i++)
            if (fabs(x[r * step + off + i]) > m) m = fabs(x[r * step + off + i]);
    return m;
}

/* dqkv16 [BT,3C]: backward's starting values, NaN (the backward writes
 * every element, tensor.h); want = rgrad. */
static void dqkv_start(uint16_t *dqkv16, double *want, const double *rgrad, size_t BT, int C) {
    for (size_t i = 0; i < BT * 3 * C; i++) {
        dqkv16[i] = 0xFFFF;
        want[i] = rgrad[i];
    }
}

static void *gpu_fill(Dev *d, size_t bytes, int byte) {
    void *host = xmalloc(bytes);
    memset(host, byte, bytes);
    void *p = dev_alloc(d, bytes);
    dev_from_host(d, p, host, bytes);
    free(host);
    return p;
}

static void *gpu_put(Dev *d, const void *src, size_t bytes) {
    void *p = dev_alloc(d, bytes);
    dev_from_host(d, p, src, bytes);
    return p;
}

static void run_case(Checks *c, Dev *d, Rng *rng, int B, int T, int NH, int hs, float amp) {
    char shape[160], name[224];
    snprintf(shape, sizeof shape, "B=%d T=%d NH=%d hs=%d amp=%g" FLASH_TAG_FMT, B, T, NH, hs, amp,
             FLASH_TAG);
    if (!tc_flash_supports(hs)) {
        snprintf(name, sizeof name, "flash %s", shape);
        check_skip(c, name, "head size not supported by attention.cu");
        return;
    }
    const int C = NH * hs;
    const size_t BT = (size_t)B * T, nqkv = BT * 3 * C, nout = BT * C, nlse = (size_t)B * NH * T;

    /* inputs, as bf16 and as the floats they are exactly */
    uint16_t *qkv16 = xmalloc(nqkv * 2), *dout16 = xmalloc(nout * 2);
    float *qkvf = xmalloc(nqkv * sizeof(float)), *doutf = xmalloc(nout * sizeof(float));
    bf16_random(qkv16, qkvf, nqkv, amp, rng);
    bf16_random(dout16, doutf, nout, 1.0f, rng);

    double *rout = calloc(nout, sizeof(double)), *rlse = calloc(nlse, sizeof(double));
    double *rgrad = calloc(nqkv, sizeof(double));
    if (!rout || !rlse || !rgrad) { fprintf(stderr, "test_flash: out of host memory\n"); exit(1); }
    reference(B, T, C, NH, qkvf, doutf, rout, rlse, rgrad);

    /* dqkv's starting values: NaN */
    uint16_t *dqkv16 = xmalloc(nqkv * 2);
    double *want = xmalloc(nqkv * sizeof(double));
    dqkv_start(dqkv16, want, rgrad, BT, C);

    void *g_qkv = gpu_put(d, qkv16, nqkv * 2);
    void *g_dout = gpu_put(d, dout16, nout * 2);
    void *g_out = gpu_fill(d, nout * 2, 0xFF);                /* bf16 0xFFFF: NaN */
    float *g_lse = gpu_fill(d, nlse * sizeof(float), 0xFF);   /* NaN */
    void *g_out2 = gpu_fill(d, nout * 2, 0xFF);
    float *g_lse2 = gpu_fill(d, nlse * sizeof(float), 0xFF);
    void *g_dqkv = gpu_put(d, dqkv16, nqkv * 2);
    const size_t nscratch = tc_flash_scratch_floats(B, T, C, NH);
    float *g_scratch = gpu_fill(d, nscratch * sizeof(float), 0xFF);  /* NaN: must be zeroed */

    uint16_t *out16 = xmalloc(nout * 2), *out16b = xmalloc(nout * 2), *res16 = xmalloc(nqkv * 2);
    float *lse = xmalloc(nlse * sizeof(float)), *lseb = xmalloc(nlse * sizeof(float));

    int r = tc_flash_forward(g_out, g_lse, g_qkv, B, T, C, NH, d->stream);
    if (r != 0) {
        snprintf(name, sizeof name, "flash forward %s", shape);
        check(c, 0, name, "tc_flash_forward returned %d for a supported head size", r);
        goto done;
    }
    dev_sync(d);
    dev_to_host(d, out16, g_out, nout * 2);
    dev_to_host(d, lse, g_lse, nlse * sizeof(float));

    snprintf(name, sizeof name, "flash forward out %s", shape);
    double e_out = rel_err_bf16(out16, rout, rout, BT, C, 0, C);
    check(c, e_out <= TOL_REL, name, "max rel err %.2e over %zu values (tol %.0e)", e_out, nout,
          TOL_REL);

    double e_lse = 0;
    for (size_t i = 0; i < nlse; i++) {
        double e = isnan(lse[i]) ? INFINITY : fabs((double)lse[i] - rlse[i]);
        if (e > e_lse) e_lse = e;
    }
    snprintf(name, sizeof name, "flash forward lse %s", shape);
    check(c, e_lse <= TOL_LSE, name, "max abs err %.2e over %zu rows (tol %.0e)", e_lse, nlse,
          TOL_LSE);

    r = tc_flash_forward(g_out2, g_lse2, g_qkv, B, T, C, NH, d->stream);
    dev_sync(d);
    dev_to_host(d, out16b, g_out2, nout * 2);
    dev_to_host(d, lseb, g_lse2, nlse * sizeof(float));
    size_t ndiff = 0;
    for (size_t i = 0; i < nout; i++) ndiff += out16[i] != out16b[i];
    for (size_t i = 0; i < nlse; i++) ndiff += memcmp(&lse[i], &lseb[i], sizeof(float)) != 0;
    snprintf(name, sizeof name, "flash determinism forward %s", shape);
    check(c, r == 0 && ndiff == 0, name, "%zu of %zu out and lse values differ between two runs",
          ndiff, nout + nlse);

    r = tc_flash_backward(g_dqkv, g_scratch, g_dout, g_qkv, g_out, g_lse, B, T, C, NH, 0, d->stream);
    dev_sync(d);
    dev_to_host(d, res16, g_dqkv, nqkv * 2);
    static const char *const parts[3] = {"dq", "dk", "dv"};
    for (int p = 0; p < 3; p++) {
        double e = r == 0 ? rel_err_bf16(res16, want, rgrad, BT, 3 * (size_t)C, (size_t)p * C, C)
                          : INFINITY;
        snprintf(name, sizeof name, "flash backward %s %s", parts[p], shape);
        check(c, e <= TOL_REL, name,
              "max rel err %.2e over %zu values, written over NaN (tol %.0e)", e, nout,
              TOL_REL);
    }

    /* The deterministic backward (dq without atomics), twice from the same
     * start (the scratch NaN again: it must not read what the first left):
     * the same figures, and the same bits both times. */
    uint16_t *det[2] = {xmalloc(nqkv * 2), xmalloc(nqkv * 2)};
    int rd = 0;
    for (int k = 0; k < 2; k++) {
        dev_from_host(d, g_dqkv, dqkv16, nqkv * 2);
        void *nan = xmalloc(nscratch * sizeof(float));
        memset(nan, 0xFF, nscratch * sizeof(float));
        dev_from_host(d, g_scratch, nan, nscratch * sizeof(float));
        free(nan);
        rd |= tc_flash_backward(g_dqkv, g_scratch, g_dout, g_qkv, g_out, g_lse, B, T, C, NH, 1,
                                d->stream);
        dev_sync(d);
        dev_to_host(d, det[k], g_dqkv, nqkv * 2);
    }
    for (int p = 0; p < 3; p++) {
        double e = rd == 0 ? rel_err_bf16(det[0], want, rgrad, BT, 3 * (size_t)C, (size_t)p * C, C)
                           : INFINITY;
        snprintf(name, sizeof name, "flash backward deterministic %s %s", parts[p], shape);
        check(c, e <= TOL_REL, name,
              "max rel err %.2e over %zu values, written over NaN (tol %.0e)", e, nout,
              TOL_REL);
    }
    size_t ddiff = 0;
    for (size_t i = 0; i < nqkv; i++) ddiff += det[0][i] != det[1][i];
    snprintf(name, sizeof name, "flash determinism backward %s", shape);
    check(c, rd == 0 && ddiff == 0, name,
          "deterministic: %zu of %zu dqkv values differ between two runs", ddiff, nqkv);
    free(det[0]);
    free(det[1]);

done:
    dev_free(d, g_qkv, nqkv * 2);
    dev_free(d, g_dout, nout * 2);
    dev_free(d, g_out, nout * 2);
    dev_free(d, g_lse, nlse * sizeof(float));
    dev_free(d, g_out2, nout * 2);
    dev_free(d, g_lse2, nlse * sizeof(float));
    dev_free(d, g_dqkv, nqkv * 2);
    dev_free(d, g_scratch, nscratch * sizeof(float));
    free(qkv16); free(dout16); free(qkvf); free(doutf);
    free(rout); free(rlse); free(rgrad); free(dqkv16); free(want);
    free(out16); free(out16b); free(res16); free(lse); free(lseb);
}

/* ---------------------------------------------------------------------------
 * The ring's chunk pairs (tc_flash_pair_forward / _backward, context
 * parallelism's steps on these kernels). A sequence of T = 2N Tc tokens,
 * rank r holding chunks r and 2N-1-r (cp.c's cp_position); every pair (r, s)
 * of query rank and key rank is run alone and checked against a float64
 * specification of one block (cp.c's cp_block_*_naive, in double): the
 * softmax over the keys of rank s that rank r's query sees (key position <=
 * query position). The pairs fall in three kinds, each checked apart:
 *   s = r  diagonal: each half sees its own chunk causally, the second
 *          half also the first chunk whole;
 *   s < r  earlier keys: both halves see chunk s whole, nothing of 2N-1-s;
 *   s > r  later keys: the first half sees nothing (out 0, lse -inf), the
 *          second both chunks whole.
 * Forward: acc and lse of one step with `first` (acc and lse start as NaN,
 * so every row must be written), out within 1e-2 of max |ref| (fp32 out
 * from bf16 probabilities), lse within 1e-3. Then each rank's whole ring
 * (steps s = r, r-1, ...: the merge) against the full sequence's reference
 * out and lse at that rank's positions. Backward: each pair's dq, dk, dv
 * added onto random fp32 starting values, given the full reference's lse
 * and D = dout . out, within 1e-2 of the pair's own max |gradient|. Chunks
 * of 37, 45, 20, 70 tokens leave ragged tiles and chunk boundaries inside a
 * 64-row tile; 64 lines the chunks up with the tiles (whole query blocks
 * that see nothing). */

static int pair_pos(int N, int r, int T, int i) {
    const int Tc = T / (2 * N);
    return (i < Tc ? r : 2 * N - 1 - r) * Tc + i % Tc;
}

static const char *const pair_kinds[3] = {"diagonal s = r", "earlier keys s < r", "later keys s > r"};
static int pair_kind(int r, int s) { return s == r ? 0 : s < r ? 1 : 2; }

/* max |got - want| / mag over n fp32 values; infinite on a NaN. */
static double rel_err_f32(const float *got, const double *want, size_t n, double mag) {
    double diff = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i])) return INFINITY;
        const double e = fabs((double)got[i] - want[i]);
        if (e > diff) diff = e;
    }
    return diff / (mag > 1e-30 ? mag : 1e-30);
}

/* max |got - want| over log-sum-exps, -inf only where -inf is wanted. */
static double lse_err(const float *got, const double *want, size_t n) {
    double diff = 0;
    for (size_t i = 0; i < n; i++) {
        if (isinf(want[i]) || isinf(got[i])) {
            if (!(isinf(want[i]) && isinf(got[i]) && got[i] < 0)) return INFINITY;
            continue;
        }
        const double e = isnan(got[i]) ? INFINITY : fabs((double)got[i] - want[i]);
        if (e > diff) diff = e;
    }
    return diff;
}

static double max_abs_n(const double *x, size_t n) { return max_abs(x, 1, n, 0, n); }

/* One pair in float64: rank r's queries q [B,Tl,3C] against rank s's block
 * kv [B,Tl,2C]. Forward: out [B,Tl,C] the softmax over the visible keys
 * (0 for a row that sees none) and lse [B,NH,Tl] (-inf there). Backward,
 * from the given lse and D [B,NH,Tl]: dq [B,Tl,C] and dkv [B,Tl,2C]
 * accumulated (+=). */
static void pair_reference(int B, int T, int C, int NH, int N, int r, int s, const float *q,
                           const float *kv, const float *dout, const float *lse_in,
                           const float *D, double *out, double *lse, double *dq, double *dkv) {
    const int Tl = T / N, hs = C / NH;
    const double scale = 1.0 / sqrt((double)hs);
    double *sc = xmalloc((size_t)Tl * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < Tl; t++) {
                const float *qt = q + ((size_t)b * Tl + t) * 3 * C + (size_t)h * hs;
                const float *gt = dout + ((size_t)b * Tl + t) * C + (size_t)h * hs;
                const size_t row = ((size_t)b * NH + h) * Tl + t;
                double m = -INFINITY, sum = 0;
                for (int j = 0; j < Tl; j++) {
                    sc[j] = -INFINITY;
                    if (pair_pos(N, s, T, j) > pair_pos(N, r, T, t)) continue;
                    const float *k = kv + ((size_t)b * Tl + j) * 2 * C + (size_t)h * hs;
                    double dot = 0;
                    for (int i = 0; i < hs; i++) dot += (double)qt[i] * k[i];
                    sc[j] = dot * scale;
                    if (sc[j] > m) m = sc[j];
                }
                double *o = out + ((size_t)b * Tl + t) * C + (size_t)h * hs;
                for (int i = 0; i < hs; i++) o[i] = 0;
                lse[row] = -INFINITY;
                if (m == -INFINITY) continue;
                for (int j = 0; j < Tl; j++) sum += sc[j] == -INFINITY ? 0 : exp(sc[j] - m);
                lse[row] = m + log(sum);
                for (int j = 0; j < Tl; j++) {
                    if (sc[j] == -INFINITY) continue;
                    const float *k = kv + ((size_t)b * Tl + j) * 2 * C + (size_t)h * hs, *v = k + C;
                    const double p = exp(sc[j] - m) / sum;              /* the pair's own softmax */
                    const double pg = exp(sc[j] - (double)lse_in[row]); /* the whole row's */
                    double dp = 0;
                    for (int i = 0; i < hs; i++) {
                        o[i] += p * v[i];
                        dp += (double)gt[i] * v[i];
                    }
                    const double ds = pg * (dp - D[row]) * scale;
                    double *dk = dkv + ((size_t)b * Tl + j) * 2 * C + (size_t)h * hs, *dv = dk + C;
                    double *dqt = dq + ((size_t)b * Tl + t) * C + (size_t)h * hs;
                    for (int i = 0; i < hs; i++) {
                        dqt[i] += ds * k[i];
                        dk[i] += ds * qt[i];
                        dv[i] += pg * gt[i];
                    }
                }
            }
    free(sc);
}

/* Rows of rank r (Tl of each batch row) gathered from a [B,T,width] buffer. */
static void gather_rows(void *dst, const void *src, size_t esz, int B, int T, int N, int r,
                        size_t width, size_t off, size_t w) {
    const int Tl = T / N;
    for (int b = 0; b < B; b++)
        for (int i = 0; i < Tl; i++)
            memcpy((char *)dst + ((size_t)b * Tl + i) * w * esz,
                   (const char *)src + (((size_t)b * T + pair_pos(N, r, T, i)) * width + off) * esz,
                   w * esz);
}
static void gather_lse(double *dst, const double *src, int B, int NH, int T, int N, int r) {
    const int Tl = T / N;
    for (size_t bh = 0; bh < (size_t)B * NH; bh++)
        for (int i = 0; i < Tl; i++) dst[bh * Tl + i] = src[bh * T + pair_pos(N, r, T, i)];
}

static void fill_f32(float *x, size_t n, float v) { for (size_t i = 0; i < n; i++) x[i] = v; }

static void run_pair_case(Checks *c, Dev *d, Rng *rng, int B, int N, int NH, int hs, int Tc, float amp) {
    char shape[192], name[288];
    const int T = 2 * N * Tc, Tl = T / N, C = NH * hs;
    snprintf(shape, sizeof shape, "N=%d B=%d NH=%d hs=%d chunk=%d amp=%g" FLASH_TAG_FMT, N, B, NH, hs,
             Tc, amp, FLASH_TAG);
    const size_t BT = (size_t)B * T, nqkv = BT * 3 * C, nout = BT * C, nlse = (size_t)B * NH * T;
    const size_t lq = (size_t)B * Tl * 3 * C, lkv = (size_t)B * Tl * 2 * C, lo = (size_t)B * Tl * C,
                 ll = (size_t)B * NH * Tl;

    /* the whole sequence, its float64 reference, and D = dout . out */
    uint16_t *qkv16 = xmalloc(nqkv * 2), *dout16 = xmalloc(nout * 2);
    float *qkvf = xmalloc(nqkv * sizeof(float)), *doutf = xmalloc(nout * sizeof(float));
    for (size_t i = 0; i < nqkv; i++) { qkv16[i] = bf16_from_f32(amp * urand(rng)); qkvf[i] = bf16_to_f32(qkv16[i]); }
    for (size_t i = 0; i < nout; i++) { dout16[i] = bf16_from_f32(urand(rng)); doutf[i] = bf16_to_f32(dout16[i]); }
    double *rout = calloc(nout, sizeof(double)), *rlse = calloc(nlse, sizeof(double));
    double *rgrad = calloc(nqkv, sizeof(double));
    if (!rout || !rlse || !rgrad) { fprintf(stderr, "test_flash: out of host memory\n"); exit(1); }
    reference(B, T, C, NH, qkvf, doutf, rout, rlse, rgrad);
    float *lsef = xmalloc(nlse * sizeof(float)), *Df = xmalloc(nlse * sizeof(float));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const size_t row = ((size_t)b * NH + h) * T + t, o = ((size_t)b * T + t) * C + (size_t)h * hs;
                double dd = 0;
                for (int i = 0; i < hs; i++) dd += rout[o + i] * doutf[o + i];
                lsef[row] = (float)rlse[row];
                Df[row] = (float)dd;
            }

    /* per rank: q rows (bf16 and float), the kv block, dout, lse, D */
    uint16_t **q16 = xmalloc(N * sizeof *q16), **kv16 = xmalloc(N * sizeof *kv16), **g16 = xmalloc(N * sizeof *g16);
    float **qf = xmalloc(N * sizeof *qf), **kvf = xmalloc(N * sizeof *kvf), **gf = xmalloc(N * sizeof *gf);
    float **lsel = xmalloc(N * sizeof *lsel), **Dl = xmalloc(N * sizeof *Dl);
    void **g_q = xmalloc(N * sizeof *g_q), **g_kv = xmalloc(N * sizeof *g_kv), **g_g = xmalloc(N * sizeof *g_g);
    float **g_lse = xmalloc(N * sizeof *g_lse), **g_D = xmalloc(N * sizeof *g_D);
    for (int r = 0; r < N; r++) {
        q16[r] = xmalloc(lq * 2); kv16[r] = xmalloc(lkv * 2); g16[r] = xmalloc(lo * 2);
        qf[r] = xmalloc(lq * 4); kvf[r] = xmalloc(lkv * 4); gf[r] = xmalloc(lo * 4);
        lsel[r] = xmalloc(ll * 4); Dl[r] = xmalloc(ll * 4);
        gather_rows(q16[r], qkv16, 2, B, T, N, r, 3 * (size_t)C, 0, 3 * (size_t)C);
        gather_rows(qf[r], qkvf, 4, B, T, N, r, 3 * (size_t)C, 0, 3 * (size_t)C);
        gather_rows(kv16[r], qkv16, 2, B, T, N, r, 3 * (size_t)C, C, 2 * (size_t)C);
        gather_rows(kvf[r], qkvf, 4, B, T, N, r, 3 * (size_t)C, C, 2 * (size_t)C);
        gather_rows(g16[r], dout16, 2, B, T, N, r, C, 0, C);
        gather_rows(gf[r], doutf, 4, B, T, N, r, C, 0, C);
        for (size_t bh = 0; bh < (size_t)B * NH; bh++)
            for (int i = 0; i < Tl; i++) {
                lsel[r][bh * Tl + i] = lsef[bh * T + pair_pos(N, r, T, i)];
                Dl[r][bh * Tl + i] = Df[bh * T + pair_pos(N, r, T, i)];
            }
        g_q[r] = gpu_put(d, q16[r], lq * 2);
        g_kv[r] = gpu_put(d, kv16[r], lkv * 2);
        g_g[r] = gpu_put(d, g16[r], lo * 2);
        g_lse[r] = gpu_put(d, lsel[r], ll * 4);
        g_D[r] = gpu_put(d, Dl[r], ll * 4);
    }
    float *g_acc = dev_alloc(d, lo * 4), *g_l = dev_alloc(d, ll * 4);
    float *g_dq = dev_alloc(d, lo * 4), *g_dkv = dev_alloc(d, lkv * 4);
    float *acc = xmalloc(lo * 4), *lsg = xmalloc(ll * 4), *dq = xmalloc(lo * 4), *dkv = xmalloc(lkv * 4);
    float *dq0 = xmalloc(lo * 4), *dkv0 = xmalloc(lkv * 4);
    double *pout = xmalloc(lo * 8), *plse = xmalloc(ll * 8), *pdq = xmalloc(lo * 8), *pdkv = xmalloc(lkv * 8);
    double *wdq = xmalloc(lo * 8), *wdkv = xmalloc(lkv * 8);

    /* worst figures of each kind: forward out, lse; backward dq, dk, dv */
    double worst[3][5] = {{0}};
    int seen[3] = {0, 0, 0}, rc = 0;
    for (int r = 0; r < N; r++)
        for (int s = 0; s < N; s++) {
            const int kind = pair_kind(r, s);
            seen[kind] = 1;
            memset(pdq, 0, lo * 8);
            memset(pdkv, 0, lkv * 8);
            pair_reference(B, T, C, NH, N, r, s, qf[r], kvf[s], gf[r], lsel[r], Dl[r], pout, plse, pdq, pdkv);

            fill_f32(acc, lo, NAN);
            fill_f32(lsg, ll, NAN);
            dev_from_host(d, g_acc, acc, lo * 4);
            dev_from_host(d, g_l, lsg, ll * 4);
            rc |= tc_flash_pair_forward(g_acc, g_l, g_q[r], g_kv[s], B, T, C, NH, N, r, s, 1, d->stream);
            dev_sync(d);
            dev_to_host(d, acc, g_acc, lo * 4);
            dev_to_host(d, lsg, g_l, ll * 4);
            double e = rel_err_f32(acc, pout, lo, max_abs_n(pout, lo));
            if (e > worst[kind][0]) worst[kind][0] = e;
            e = lse_err(lsg, plse, ll);
            if (e > worst[kind][1]) worst[kind][1] = e;

            /* backward onto random starting values (a quarter of the scale) */
            const double sq = max_abs_n(pdq, lo), skv = max_abs_n(pdkv, lkv);
            for (size_t i = 0; i < lo; i++) { dq0[i] = (float)(0.25 * sq) * urand(rng); wdq[i] = dq0[i] + pdq[i]; }
            for (size_t i = 0; i < lkv; i++) { dkv0[i] = (float)(0.25 * skv) * urand(rng); wdkv[i] = dkv0[i] + pdkv[i]; }
            dev_from_host(d, g_dq, dq0, lo * 4);
            dev_from_host(d, g_dkv, dkv0, lkv * 4);
            rc |= tc_flash_pair_backward(g_dq, g_dkv, g_q[r], g_kv[s], g_lse[r], g_D[r], g_g[r], B, T, C, NH,
                                         N, r, s, d->stream);
            dev_sync(d);
            dev_to_host(d, dq, g_dq, lo * 4);
            dev_to_host(d, dkv, g_dkv, lkv * 4);
            e = rel_err_f32(dq, wdq, lo, sq);
            if (e > worst[kind][2]) worst[kind][2] = e;
            /* dk and dv: the two halves of each dkv row, each against its own scale */
            for (int part = 0; part < 2; part++) {
                double diff = 0, mag = 1e-30;
                for (size_t row = 0; row < (size_t)B * Tl; row++)
                    for (int i = 0; i < C; i++) {
                        const size_t k = row * 2 * C + (size_t)part * C + i;
                        if (fabs(pdkv[k]) > mag) mag = fabs(pdkv[k]);
                        diff = isnan(dkv[k]) ? INFINITY : fmax(diff, fabs(dkv[k] - wdkv[k]));
                        if (isinf(diff)) break;
                    }
                e = diff / mag;
                if (e > worst[kind][3 + part]) worst[kind][3 + part] = e;
            }
        }
    static const char *const what[5] = {"forward out", "forward lse", "backward dq", "backward dk", "backward dv"};
    for (int k = 0; k < 3; k++) {
        if (!seen[k]) continue;
        for (int w = 0; w < 5; w++) {
            const double tol = w == 1 ? TOL_LSE : TOL_REL;
            snprintf(name, sizeof name, "flash pair %s, %s %s", what[w], pair_kinds[k], shape);
            check(c, rc == 0 && worst[k][w] <= tol, name, "worst over the kind's pairs %.2e (tol %.0e)%s",
                  worst[k][w], tol, rc ? ", a call returned -1" : "");
        }
    }

    /* each rank's whole ring: the merge of its N steps, against the full reference */
    double e_out = 0, e_lse = 0;
    double *wout = xmalloc(lo * 8), *wlse = xmalloc(ll * 8);
    const double mag = max_abs_n(rout, nout);
    for (int r = 0; r < N; r++) {
        for (int step = 0; step < N; step++) {
            const int s = (r + N - step) % N;
            rc |= tc_flash_pair_forward(g_acc, g_l, g_q[r], g_kv[s], B, T, C, NH, N, r, s, step == 0, d->stream);
        }
        dev_sync(d);
        dev_to_host(d, acc, g_acc, lo * 4);
        dev_to_host(d, lsg, g_l, ll * 4);
        for (int b = 0; b < B; b++)
            for (int i = 0; i < Tl; i++)
                for (int ch = 0; ch < C; ch++)
                    wout[((size_t)b * Tl + i) * C + ch] = rout[((size_t)b * T + pair_pos(N, r, T, i)) * C + ch];
        gather_lse(wlse, rlse, B, NH, T, N, r);
        e_out = fmax(e_out, rel_err_f32(acc, wout, lo, mag));
        e_lse = fmax(e_lse, lse_err(lsg, wlse, ll));
    }
    snprintf(name, sizeof name, "flash pair ring merge out %s", shape);
    check(c, rc == 0 && e_out <= TOL_REL, name, "every rank's %d steps merged: max rel err %.2e (tol %.0e)", N,
          e_out, TOL_REL);
    snprintf(name, sizeof name, "flash pair ring merge lse %s", shape);
    check(c, rc == 0 && e_lse <= TOL_LSE, name, "max abs err %.2e (tol %.0e)", e_lse, TOL_LSE);

    free(wout); free(wlse);
    for (int r = 0; r < N; r++) {
        dev_free(d, g_q[r], lq * 2); dev_free(d, g_kv[r], lkv * 2); dev_free(d, g_g[r], lo * 2);
        dev_free(d, g_lse[r], ll * 4); dev_free(d, g_D[r], ll * 4);
        free(q16[r]); free(kv16[r]); free(g16[r]); free(qf[r]); free(kvf[r]); free(gf[r]);
        free(lsel[r]); free(Dl[r]);
    }
    free(q16); free(kv16); free(g16); free(qf); free(kvf); free(gf); free(lsel); free(Dl);
    free(g_q); free(g_kv); free(g_g); free(g_lse); free(g_D);
    dev_free(d, g_acc, lo * 4); dev_free(d, g_l, ll * 4); dev_free(d, g_dq, lo * 4); dev_free(d, g_dkv, lkv * 4);
    free(acc); free(lsg); free(dq); free(dkv); free(dq0); free(dkv0);
    free(pout); free(plse); free(pdq); free(pdkv); free(wdq); free(wdkv);
    free(qkv16); free(dout16); free(qkvf); free(doutf); free(rout); free(rlse); free(rgrad); free(lsef); free(Df);
}

/* attention_sm90.cu's forward, its checks in a block of their own: out and
 * lse against the float64 reference (out and lse start as NaN), out against
 * attention.cu's forward, and the same bits on a second run. Returns 0, or
 * -1 when tc_flash_forward_sm90 does not run here (one SKIP line). */
static int run_case_sm90(Checks *c, Dev *d, Rng *rng, int B, int T, int NH, int hs, float amp) {
    char shape[160], name[224];
    snprintf(shape, sizeof shape, "B=%d T=%d NH=%d hs=%d amp=%g" FLASH_TAG_FMT, B, T, NH, hs, amp,
             FLASH_TAG);
    const int C = NH * hs;
    const size_t BT = (size_t)B * T, nqkv = BT * 3 * C, nout = BT * C, nlse = (size_t)B * NH * T;
    uint16_t *qkv16 = xmalloc(nqkv * 2), *dout16 = xmalloc(nout * 2), *dqkv16 = xmalloc(nqkv * 2);
    float *qkvf = xmalloc(nqkv * sizeof(float)), *doutf = xmalloc(nout * sizeof(float));
    double *rout = calloc(nout, sizeof(double)), *rlse = calloc(nlse, sizeof(double));
    double *rgrad = calloc(nqkv, sizeof(double)), *want = xmalloc(nqkv * sizeof(double));
    if (!rout || !rlse || !rgrad) { fprintf(stderr, "test_flash: out of host memory\n"); exit(1); }
    bf16_random(qkv16, qkvf, nqkv, amp, rng);
    bf16_random(dout16, doutf, nout, 1.0f, rng);
    void *g_qkv = gpu_put(d, qkv16, nqkv * 2);
    void *g_dout = gpu_put(d, dout16, nout * 2);
    void *g_dqkv = gpu_fill(d, nqkv * 2, 0);
    const size_t nscratch = tc_flash_scratch_floats(B, T, C, NH);
    float *g_scratch = gpu_fill(d, nscratch * sizeof(float), 0xFF);  /* NaN */
    uint16_t *res16[2] = {xmalloc(nqkv * 2), xmalloc(nqkv * 2)};
    void *g_out[2] = {gpu_fill(d, nout * 2, 0xFF), gpu_fill(d, nout * 2, 0xFF)};  /* NaN */
    float *g_lse[2] = {gpu_fill(d, nlse * sizeof(float), 0xFF), gpu_fill(d, nlse * sizeof(float), 0xFF)};
    void *g_ref = gpu_fill(d, nout * 2, 0xFF);
    float *g_rlse = gpu_fill(d, nlse * sizeof(float), 0xFF);
    uint16_t *out16[2] = {xmalloc(nout * 2), xmalloc(nout * 2)}, *ref16 = xmalloc(nout * 2);
    float *lse[2] = {xmalloc(nlse * sizeof(float)), xmalloc(nlse * sizeof(float))};
    int r = 0;
    for (int k = 0; k < 2 && r == 0; k++) {
        r = tc_flash_forward_sm90(g_out[k], g_lse[k], g_qkv, B, T, C, NH, d->stream);
        dev_sync(d);
        dev_to_host(d, out16[k], g_out[k], nout * 2);
        dev_to_host(d, lse[k], g_lse[k], nlse * sizeof(float));
    }
    if (r != 0) {
        snprintf(name, sizeof name, "flash sm90 %s", shape);
        check_skip(c, name, "tc_flash_forward_sm90 does not run here (an sm_90a build on a 9.0 device; "
                            "EMU_ARCH=sm_90a under the emulation)");
        goto done;
    }
    reference(B, T, C, NH, qkvf, doutf, rout, rlse, rgrad);
    snprintf(name, sizeof name, "flash sm90 forward out %s", shape);
    double e_out = rel_err_bf16(out16[0], rout, rout, BT, C, 0, C);
    check(c, e_out <= TOL_REL, name, "max rel err %.2e over %zu values (tol %.0e)", e_out, nout, TOL_REL);
    double e_lse = 0;
    for (size_t i = 0; i < nlse; i++) {
        double e = isnan(lse[0][i]) ? INFINITY : fabs((double)lse[0][i] - rlse[i]);
        if (e > e_lse) e_lse = e;
    }
    snprintf(name, sizeof name, "flash sm90 forward lse %s", shape);
    check(c, e_lse <= TOL_LSE, name, "max abs err %.2e over %zu rows (tol %.0e)", e_lse, nlse, TOL_LSE);

    /* beside attention.cu's forward: the same rounding points, another order of sums */
    int rr = tc_flash_forward(g_ref, g_rlse, g_qkv, B, T, C, NH, d->stream);
    dev_sync(d);
    dev_to_host(d, ref16, g_ref, nout * 2);
    double *refd = xmalloc(nout * sizeof(double));
    for (size_t i = 0; i < nout; i++) refd[i] = bf16_to_f32(ref16[i]);
    double e_mma = rr == 0 ? rel_err_bf16(out16[0], refd, rout, BT, C, 0, C) : INFINITY;
    free(refd);
    snprintf(name, sizeof name, "flash sm90 forward vs tc_flash_forward %s", shape);
    check(c, e_mma <= TOL_REL, name, "max diff %.2e relative to max |out| over %zu values (tol %.0e)", e_mma,
          nout, TOL_REL);

    size_t ndiff = 0;
    for (size_t i = 0; i < nout; i++) ndiff += out16[0][i] != out16[1][i];
    for (size_t i = 0; i < nlse; i++) ndiff += memcmp(&lse[0][i], &lse[1][i], sizeof(float)) != 0;
    snprintf(name, sizeof name, "flash sm90 determinism forward %s", shape);
    check(c, ndiff == 0, name, "%zu of %zu out and lse values differ between two runs", ndiff, nout + nlse);

    /* The backward (heads of 64 and 128), from this forward's out and lse, over a
     * NaN dqkv (every element written), the scratch NaN each time; twice,
     * for the bits. */
    {
        dqkv_start(dqkv16, want, rgrad, BT, C);
        void *nan = xmalloc(nscratch * sizeof(float));
        memset(nan, 0xFF, nscratch * sizeof(float));
        int rb = 0;
        for (int k = 0; k < 2 && rb == 0; k++) {
            dev_from_host(d, g_dqkv, dqkv16, nqkv * 2);
            dev_from_host(d, g_scratch, nan, nscratch * sizeof(float));
            rb = tc_flash_backward_sm90(g_dqkv, g_scratch, g_dout, g_qkv, g_out[0], g_lse[0], B, T, C, NH,
                                        d->stream);
            dev_sync(d);
            dev_to_host(d, res16[k], g_dqkv, nqkv * 2);
        }
        free(nan);
        if (rb != 0) {
            snprintf(name, sizeof name, "flash sm90 backward %s", shape);
            check(c, 0, name, "tc_flash_backward_sm90 returned -1 where its forward ran (the same head sizes)");
        } else {
            static const char *const parts[3] = {"dq", "dk", "dv"};
            for (int p = 0; p < 3; p++) {
                double e = rel_err_bf16(res16[0], want, rgrad, BT, 3 * (size_t)C, (size_t)p * C, C);
                snprintf(name, sizeof name, "flash sm90 backward %s %s", parts[p], shape);
                check(c, e <= TOL_REL, name, "max rel err %.2e over %zu values, written over NaN (tol %.0e)",
                      e, nout, TOL_REL);
            }
            size_t bdiff = 0;
            for (size_t i = 0; i < nqkv; i++) bdiff += res16[0][i] != res16[1][i];
            snprintf(name, sizeof name, "flash sm90 determinism backward %s", shape);
            check(c, bdiff == 0, name, "%zu of %zu dqkv values differ between two runs", bdiff, nqkv);
        }
    }

done:
    dev_free(d, g_qkv, nqkv * 2);
    for (int k = 0; k < 2; k++) {
        dev_free(d, g_out[k], nout * 2);
        dev_free(d, g_lse[k], nlse * sizeof(float));
        free(out16[k]);
        free(lse[k]);
    }
    dev_free(d, g_ref, nout * 2);
    dev_free(d, g_rlse, nlse * sizeof(float));
    dev_free(d, g_dout, nout * 2);
    dev_free(d, g_dqkv, nqkv * 2);
    dev_free(d, g_scratch, nscratch * sizeof(float));
    free(qkv16); free(qkvf); free(doutf); free(rout); free(rlse); free(rgrad); free(ref16);
    free(dout16); free(dqkv16); free(want); free(res16[0]); free(res16[1]);
    return r == 0 ? 0 : -1;
}

/* The sm90 block's shapes: odd B*NH, T off the 128-row tile, one to eight
 * query blocks (the two-stage ring wraps from three on); heads of 128 with
 * B > 1 and several heads, T off the backward's 64-row tiles too. */
static void run_sm90(Checks *c, Dev *d, Rng *rng) {
    if (run_case_sm90(c, d, rng, 1, 37, 3, 64, 1.0f) != 0) return;  /* one ragged block; SKIP once */
    run_case_sm90(c, d, rng, 3, 200, 1, 64, 4.0f);    /* two blocks, a 72-row tail, peaky */
    run_case_sm90(c, d, rng, 1, 520, 1, 64, 1.0f);    /* five blocks, an 8-row tail */
    run_case_sm90(c, d, rng, 1, 130, 3, 128, 1.0f);   /* hs 128, a 2-row tail */
    run_case_sm90(c, d, rng, 1, 300, 1, 128, 4.0f);   /* hs 128, three blocks */
    run_case_sm90(c, d, rng, 3, 201, 3, 128, 4.0f);   /* hs 128, B 3 x 3 heads, a 9-row tail */
    run_case_sm90(c, d, rng, 2, 65, 5, 128, 1.0f);    /* hs 128, one block, a 1-row tail */
    run_case_sm90(c, d, rng, 1, 1024, 1, 64, 4.0f);   /* GPT-2's T, one head */
#ifndef FLASH_EMU
    run_case_sm90(c, d, rng, 2, 1024, 12, 64, 1.0f);  /* GPT-2 small */
#endif
}

#endif /* USE_CUDA */

int main(void) {
    Checks c;
    memset(&c, 0, sizeof c);
#ifndef USE_CUDA
    for (size_t i = 0; i < sizeof groups / sizeof groups[0]; i++)
        check_skip(&c, groups[i], "this build has no CUDA (nvcc was not found); run on a GPU machine");
    return check_done(&c);
#else
    Dev d;
    char err[256] = "";
    if (dev_gpu_count() == 0 || dev_open(&d, DEV_CUDA, 0, err, sizeof err) != 0) {
        for (size_t i = 0; i < sizeof groups / sizeof groups[0]; i++)
            check_skip(&c, groups[i], "no CUDA GPU visible; run on a GPU machine");
        return check_done(&c);
    }
    Rng rng = {0x9E3779B97F4A7C15ULL};
    const char *only = getenv("FLASH_ONLY");
    if (only && strcmp(only, "sm90") == 0) {
        Rng r90 = {0x2545F4914F6CDD1DULL};
        run_sm90(&c, &d, &r90);
        dev_close(&d);
        return check_done(&c);
    }

    /* an unsupported head size is refused and nothing runs */
    int r = tc_flash_forward(NULL, NULL, NULL, 1, 4, 40, 5, d.stream);
    char name[96];
    snprintf(name, sizeof name, "flash refuses hs=8" FLASH_TAG_FMT, FLASH_TAG);
    check(&c, r == -1 && !tc_flash_supports(8), name, "tc_flash_forward returned %d", r);

    run_case(&c, &d, &rng, 2, 37, 3, 64, 1.0f);    /* one ragged query block */
    run_case(&c, &d, &rng, 2, 37, 3, 64, 4.0f);    /* ... peaky softmax */
    run_case(&c, &d, &rng, 1, 128, 2, 64, 1.0f);   /* two full blocks */
    run_case(&c, &d, &rng, 1, 128, 2, 64, 4.0f);
    run_case(&c, &d, &rng, 1, 200, 4, 32, 1.0f);   /* hs 32, ragged fourth block */
    run_case(&c, &d, &rng, 1, 130, 2, 128, 1.0f);  /* hs 128 (32-row backward blocks) */

    /* the ring's chunk pairs: N 2 and 4, odd B and NH, heads of 32, 64, 128
     * (their own random stream: the whole-sequence cases keep their inputs) */
    Rng prng = {0xD1B54A32D192ED03ULL};
    run_pair_case(&c, &d, &prng, 3, 2, 1, 64, 37, 1.0f);   /* chunk boundary inside a tile */
    run_pair_case(&c, &d, &prng, 1, 2, 3, 32, 45, 4.0f);
    run_pair_case(&c, &d, &prng, 1, 2, 1, 64, 64, 4.0f);   /* chunks on tile boundaries */
    run_pair_case(&c, &d, &prng, 1, 4, 3, 64, 20, 1.0f);   /* a rank's rows in one tile */
    run_pair_case(&c, &d, &prng, 3, 4, 1, 32, 70, 4.0f);
    run_pair_case(&c, &d, &prng, 1, 2, 1, 128, 33, 1.0f);  /* hs 128 */
#ifdef FLASH_EMU
    const char *full = getenv("FLASH_EMU_FULL");
    if (!full || strcmp(full, "1") != 0) {
        run_case(&c, &d, &rng, 1, 1024, 1, 64, 4.0f); /* GPT-2's T, one head */
        Rng r90 = {0x2545F4914F6CDD1DULL};
        run_sm90(&c, &d, &r90);
        dev_close(&d);
        return check_done(&c);
    }
#endif
    run_case(&c, &d, &rng, 2, 1024, 12, 64, 1.0f); /* GPT-2 small */
    run_case(&c, &d, &rng, 2, 1024, 12, 64, 4.0f);
    Rng r90 = {0x2545F4914F6CDD1DULL};
    run_sm90(&c, &d, &r90);

    dev_close(&d);
    return check_done(&c);
#endif
}
