/* test/test_tp.c: tensor parallelism against one rank, through ./train.
 *
 *  - equivalence: tp 2 and 4 (and 3 on a model whose sizes allow it), with
 *    and without --sp, alone and with dp 2 under ZeRO 1 and 3: 10 steps of
 *    losses within 1e-5 relative of one rank's, with clipping active; the
 *    first step's gradients, gathered into one model (--dump-grads), within
 *    1e-4 per tensor (max abs difference over max abs value);
 *  - the pieces against their unsplit versions: the column-parallel linears
 *    (qkv, fc), the row-parallel ones (attproj, fcproj) and the vocab-
 *    parallel embedding and cross-entropy each own tensors of the gradient
 *    file, so their per-tensor gradients (forward and backward both feed
 *    them) are reported one by one;
 *  - communication: bytes a step in the tp group equal Megatron's count:
 *    without --sp, all-reduces of B*T*C activations: 4 a layer, one for the
 *    embedding, one for the head; with --sp the same number of all-gathers
 *    and of reduce-scatters (4L + 2 each) and the LayerNorms' small
 *    all-reduces; plus the loss's 3 numbers a row gathered.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "layout.h"
#include "train_run.h"
#include "gpt.h"
#include "optim.h"
#include "tensor.h"

#define STEPS 10
#define OUT "test/out/tp"

typedef struct Model {
    const char *flags;   /* model and batch for one rank */
    GPTConfig cfg;
    int N;               /* B*T of a step on one rank */
} Model;

typedef TrainRun Result;

static void run(Result *r, const Model *md, const char *flags, int steps) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "./train %s --steps %d --device cpu --clip 0.5 --lr 0.005 %s 2>&1",
             md->flags, steps, flags);
    train_run(r, cmd);
}

static float *load(const char *path, size_t n) { return train_load_params(path, n); }

/* Worst per-tensor max |a - b| / max |b|; names the tensor in *which. */
static double grad_diff(const GPTConfig *cfg, const float *a, const float *b, int *which) {
    double worst = 0;
    size_t off = 0;
    for (int i = 0; i < GPT_NTENSORS; i++) {
        size_t n = layout_tensor_size(cfg, i, cfg->layers, 1, 1, 1);
        double diff = 0, mag = 0;
        for (size_t k = 0; k < n; k++) {
            diff = fmax(diff, fabs((double)a[off + k] - b[off + k]));
            mag = fmax(mag, fabs(b[off + k]));
        }
        double r = mag > 0 ? diff / mag : diff;
        if (r > worst || isnan(r)) { worst = isnan(r) ? INFINITY : r; *which = i; }
        off += n;
    }
    return worst;
}

/* Bytes of (kind, group tp) in rank 0's comm table. */
static double comm_bytes(const char *out, const char *kind) {
    return train_comm_bytes(out, "\n  ", kind, "tp");
}

static void equivalence(Checks *c, const Model *md, int tp, int sp, int dp, int zero,
                        const Result *ref, const float *gref) {
    char flags[512], name[256], dump[256];
    snprintf(dump, sizeof dump, OUT "/grads_tp%d_sp%d_dp%d_z%d.bin", tp, sp, dp, zero);
    remove(dump);
    snprintf(flags, sizeof flags, "--ranks %d --tp %d --dp %d --zero %d%s%s%s", tp * dp, tp, dp,
             zero, sp ? " --sp" : "", zero ? "" : " --dump-grads ", zero ? "" : dump);
    Result r;
    run(&r, md, flags, STEPS);
    double lw = 0;
    for (int s = 0; s < r.nsteps; s++) lw = fmax(lw, fabs(r.loss[s] - ref->loss[s]) / ref->loss[s]);
    static const char *zeros[] = {"0", "1", "2", "3"};
    snprintf(name, sizeof name, "tp %d%s%s%s, dim %d, heads %d: losses", tp, sp ? " sp" : "",
             dp > 1 ? ", dp 2, zero " : "", dp > 1 ? zeros[zero] : "", md->cfg.dim, md->cfg.heads);
    check(c, r.rc == 0 && r.nsteps == STEPS && lw <= 1e-5, name,
          "%d steps within %.2e relative of one rank (bound 1e-5)%s", r.nsteps, lw,
          r.rc ? ", run failed" : "");
    if (!zero) {
        float *g = load(dump, gpt_total_params(&md->cfg));
        int which = 0;
        double gw = g ? grad_diff(&md->cfg, g, gref, &which) : INFINITY;
        snprintf(name, sizeof name, "tp %d%s%s, dim %d: first step's gradients", tp, sp ? " sp" : "",
                 dp > 1 ? ", dp 2" : "", md->cfg.dim);
        check(c, gw <= 1e-4, name, "gathered, every tensor within %.2e of one rank's (bound 1e-4; worst %s)",
              gw, gpt_tensor_name(which));
        free(g);
    }
    free(r.out);
}

/* Per-tensor gradients of the split pieces, tp 2 with and without sp. */
static void pieces(Checks *c, const Model *md, const float *gref) {
    static const struct { const char *piece; int tensors[3]; } parts[] = {
        {"column-parallel linears (qkv, fc)", {GPT_QKVW, GPT_FCW, GPT_FCB}},
        {"row-parallel linears (attproj, fcproj)", {GPT_ATTPROJW, GPT_FCPROJW, GPT_FCPROJB}},
        {"vocab-parallel embedding and head (wte, lnf)", {GPT_WTE, GPT_LNFW, GPT_LNFB}},
    };
    for (int sp = 0; sp <= 1; sp++) {
        char path[256];
        snprintf(path, sizeof path, OUT "/grads_tp2_sp%d_dp1_z0.bin", sp);
        float *g = load(path, gpt_total_params(&md->cfg));
        for (int k = 0; k < 3; k++) {
            double worst = 0;
            for (int j = 0; j < 3 && g; j++) {
                int i = parts[k].tensors[j];
                size_t off = 0;
                for (int t = 0; t < i; t++) off += layout_tensor_size(&md->cfg, t, md->cfg.layers, 1, 1, 1);
                size_t n = layout_tensor_size(&md->cfg, i, md->cfg.layers, 1, 1, 1);
                double diff = 0, mag = 0;
                for (size_t e = 0; e < n; e++) {
                    diff = fmax(diff, fabs((double)g[off + e] - gref[off + e]));
                    mag = fmax(mag, fabs(gref[off + e]));
                }
                worst = fmax(worst, mag > 0 ? diff / mag : diff);
            }
            char name[256];
            snprintf(name, sizeof name, "tp 2%s: %s vs unsplit", sp ? " sp" : "", parts[k].piece);
            check(c, g && worst <= 1e-4, name, "forward and backward through their gradients: %.2e (bound 1e-4)", worst);
        }
        free(g);
    }
}

/* Bytes a step in the tp group against the formula. */
static void comm(Checks *c, const Model *md, int tp, int sp) {
    char flags[256], name[256];
    snprintf(flags, sizeof flags, "--ranks %d --tp %d --comm-stats%s", tp, tp, sp ? " --sp" : "");
    Result r;
    run(&r, md, flags, 2);
    double N = md->N, C = md->cfg.dim, L = md->cfg.layers, f = (double)(tp - 1) / tp;
    double act = N * C * 4;                        /* one B*T*C activation, bytes */
    double stats = f * 3 * N * tp * 4;             /* the loss's 3 numbers a row, gathered */
    /* the gradient norm's exponent and its limbs (optim.h) */
    double norm = floor(2 * f * 4) + floor(2 * f * 4 * OPTIM_NORM_LIMBS);
    double ar = comm_bytes(r.out, "all_reduce") / 2, ag = comm_bytes(r.out, "all_gather") / 2;
    double rs = comm_bytes(r.out, "reduce_scatter") / 2;
    double want_ar, want_ag, want_rs;  /* compared to a byte: (tp-1)/tp is inexact in binary */
    if (!sp) {
        want_ar = (4 * L + 2) * 2 * f * act + norm;
        want_ag = stats;
        want_rs = 0;
    } else {
        want_ar = (2 * L + 1) * floor(2 * f * 2 * C * 4) + norm;  /* LayerNorm weight and bias */
        want_ag = (4 * L + 2) * f * act + stats;
        want_rs = (4 * L + 2) * f * act;
    }
    snprintf(name, sizeof name, "tp %d%s comm bytes", tp, sp ? " sp" : "");
    check(c, r.rc == 0 && fabs(ar - want_ar) < 1 && fabs(ag - want_ag) < 1 && fabs(rs - want_rs) < 1, name,
          "a step in the tp group: all-reduce %.0f (formula %.0f), all-gather %.0f (%.0f), reduce-scatter %.0f (%.0f)",
          ar, want_ar, ag, want_ag, rs, want_rs);
    free(r.out);
}

/* ---- unit tests: the split pieces computed slice by slice with the CPU
 * ops and combined as the tp collectives combine them (concatenate for an
 * all-gather, sum for an all-reduce), against the unsplit op. */

static double rnd(unsigned *s) { *s = *s * 1103515245u + 12345u; return ((*s >> 8) & 0xffff) / 32768.0 - 1.0; }
static float *rand_buf(size_t n, unsigned *s) {
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = (float)rnd(s);
    return x;
}
static double rel(const float *a, const float *b, size_t n) {
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) { d = fmax(d, fabs((double)a[i] - b[i])); m = fmax(m, fabs(b[i])); }
    return m > 0 ? d / m : d;
}

static void unit_linears(Checks *c) {
    const Ops *o = &cpu_ops;
    int N = 7, C = 12, OC = 20, tp = 4;
    unsigned s = 7;
    float *x = rand_buf((size_t)N * C, &s), *w = rand_buf((size_t)OC * C, &s), *b = rand_buf(OC, &s);
    float *dy = rand_buf((size_t)N * OC, &s);
    float *y = calloc((size_t)N * OC, 4), *dx = calloc((size_t)N * C, 4), *dw = calloc((size_t)OC * C, 4), *db = calloc(OC, 4);
    o->matmul_forward(NULL, y, x, w, b, N, C, OC);
    o->matmul_backward(NULL, dx, dw, db, dy, x, w, N, C, OC);
    /* column-parallel: rank r holds output rows [r*OCl, (r+1)*OCl) of w and b */
    int OCl = OC / tp, Cl = C / tp;
    float *yc = calloc((size_t)N * OC, 4), *dxc = calloc((size_t)N * C, 4), *dwc = calloc((size_t)OC * C, 4), *dbc = calloc(OC, 4);
    float *yr = calloc((size_t)N * OCl, 4), *dyr = calloc((size_t)N * OCl, 4), *dxp = calloc((size_t)N * C, 4);
    for (int r = 0; r < tp; r++) {
        o->matmul_forward(NULL, yr, x, w + (size_t)r * OCl * C, b + r * OCl, N, C, OCl);
        for (int n = 0; n < N; n++)
            for (int k = 0; k < OCl; k++) {
                yc[(size_t)n * OC + r * OCl + k] = yr[(size_t)n * OCl + k];   /* all-gather of columns */
                dyr[(size_t)n * OCl + k] = dy[(size_t)n * OC + r * OCl + k];
            }
        /* backward: dx partial sums (rank r's written, then f's all-reduce), dw and db rows local */
        o->matmul_backward(NULL, dxp, dwc + (size_t)r * OCl * C, dbc + r * OCl, dyr, x,
                           w + (size_t)r * OCl * C, N, C, OCl);
        for (size_t i = 0; i < (size_t)N * C; i++) dxc[i] += dxp[i];
    }
    double e1 = fmax(rel(yc, y, (size_t)N * OC), fmax(rel(dxc, dx, (size_t)N * C), fmax(rel(dwc, dw, (size_t)OC * C), rel(dbc, db, OC))));
    check(c, e1 <= 1e-6, "unit: column-parallel linear, 4 slices",
          "forward output and backward dx (summed), dw, db (sliced) vs unsplit: %.2e (bound 1e-6)", e1);
    /* row-parallel: rank r holds input columns [r*Cl, (r+1)*Cl) of w; rank 0 adds b */
    float *yrow = calloc((size_t)N * OC, 4), *part = calloc((size_t)N * OC, 4);
    float *xr = calloc((size_t)N * Cl, 4), *wr = calloc((size_t)OC * Cl, 4), *dxr = calloc((size_t)N * Cl, 4);
    float *dxrow = calloc((size_t)N * C, 4), *dwrow = calloc((size_t)OC * C, 4), *dbrow = calloc(OC, 4), *dwr = calloc((size_t)OC * Cl, 4);
    for (int r = 0; r < tp; r++) {
        for (int n = 0; n < N; n++) for (int k = 0; k < Cl; k++) xr[(size_t)n * Cl + k] = x[(size_t)n * C + r * Cl + k];
        for (int q = 0; q < OC; q++) for (int k = 0; k < Cl; k++) wr[(size_t)q * Cl + k] = w[(size_t)q * C + r * Cl + k];
        o->matmul_forward(NULL, part, xr, wr, r == 0 ? b : NULL, N, Cl, OC);
        o->accumulate(NULL, yrow, part, (size_t)N * OC);                    /* g's all-reduce */
        memset(dxr, 0, (size_t)N * Cl * 4);
        memset(dwr, 0, (size_t)OC * Cl * 4);
        memset(dbrow, 0, OC * 4);
        o->matmul_backward(NULL, dxr, dwr, dbrow, dy, xr, wr, N, Cl, OC);   /* dy whole on every rank */
        for (int n = 0; n < N; n++) for (int k = 0; k < Cl; k++) dxrow[(size_t)n * C + r * Cl + k] = dxr[(size_t)n * Cl + k];
        for (int q = 0; q < OC; q++) for (int k = 0; k < Cl; k++) dwrow[(size_t)q * C + r * Cl + k] = dwr[(size_t)q * Cl + k];
    }
    double e2 = fmax(rel(yrow, y, (size_t)N * OC), fmax(rel(dxrow, dx, (size_t)N * C), fmax(rel(dwrow, dw, (size_t)OC * C), rel(dbrow, db, OC))));
    check(c, e2 <= 1e-6, "unit: row-parallel linear, 4 slices",
          "forward output (summed, bias once) and backward dx, dw (sliced), db (every rank) vs unsplit: %.2e (bound 1e-6)", e2);
    free(x); free(w); free(b); free(dy); free(y); free(dx); free(dw); free(db); free(yc); free(dxc);
    free(dwc); free(dbc); free(yr); free(dyr); free(dxp); free(yrow); free(part); free(xr); free(wr); free(dxr);
    free(dxrow); free(dwrow); free(dbrow); free(dwr);
}

static void unit_vocab_xent(Checks *c) {
    const Ops *o = &cpu_ops;
    int N = 5, V = 50, Vp = 64, tp = 4, Vl = Vp / tp;
    unsigned s = 11;
    float *z = rand_buf((size_t)N * Vp, &s), *zs = malloc((size_t)N * Vp * 4);
    for (int i = 0; i < N * Vp; i++) z[i] *= 4;
    int targets[5] = {0, 49, 17, 33, 16};
    float loss[5], loss_tp[5], lse[5], stats[4 * 5 * 3];
    memcpy(zs, z, (size_t)N * Vp * 4);
    o->crossentropy(NULL, loss, z, targets, N, V, Vp, 0.5f);     /* z becomes its gradient */
    float *slice = malloc((size_t)N * Vl * 4), *grad = malloc((size_t)N * Vp * 4);
    for (int r = 0; r < tp; r++) {
        int v0 = r * Vl, nvalid = V - v0 < 0 ? 0 : (V - v0 > Vl ? Vl : V - v0);
        for (int n = 0; n < N; n++) memcpy(slice + (size_t)n * Vl, zs + (size_t)n * Vp + v0, Vl * 4);
        o->xent_stats(NULL, stats + (size_t)r * N * 3, slice, targets, N, v0, nvalid, Vl);
    }
    o->xent_combine(NULL, loss_tp, lse, stats, N, tp);                /* after the all-gather */
    for (int r = 0; r < tp; r++) {
        int v0 = r * Vl, nvalid = V - v0 < 0 ? 0 : (V - v0 > Vl ? Vl : V - v0);
        for (int n = 0; n < N; n++) memcpy(slice + (size_t)n * Vl, zs + (size_t)n * Vp + v0, Vl * 4);
        o->xent_grad(NULL, slice, lse, targets, N, v0, nvalid, Vl, 0.5f);
        for (int n = 0; n < N; n++) memcpy(grad + (size_t)n * Vp + v0, slice + (size_t)n * Vl, Vl * 4);
    }
    double e = fmax(rel(loss_tp, loss, N), rel(grad, z, (size_t)N * Vp));
    check(c, e <= 1e-6, "unit: vocab-parallel cross-entropy, 4 slices of 16, 50 real of 64",
          "losses and gradients (padding 0) vs the fused unsplit op: %.2e (bound 1e-6)", e);
    free(z); free(zs); free(slice); free(grad);
}

int main(void) {
    Checks c = {0};
    unit_linears(&c);
    unit_vocab_xent(&c);
    int rc = system("mkdir -p " OUT);
    (void)rc;
    Model models[2] = {
        {"--data test/fixtures/ref_tokens.bin --layers 2 --heads 4 --dim 32 --max-seq 16 --vocab 61 --seq 8 --batch 4",
         {16, 61, 128, 2, 4, 32}, 32},
        {"--data test/fixtures/ref_tokens.bin --layers 2 --heads 6 --dim 48 --max-seq 16 --vocab 300 --seq 6 --batch 4",
         {16, 300, 384, 2, 6, 48}, 24},
    };
    for (int mi = 0; mi < 2; mi++) {
        const Model *md = &models[mi];
        char ref_dump[256];
        snprintf(ref_dump, sizeof ref_dump, OUT "/grads_ref%d.bin", mi);
        char flags[300];
        snprintf(flags, sizeof flags, "--dump-grads %s", ref_dump);
        Result ref;
        run(&ref, md, flags, STEPS);
        float *gref = load(ref_dump, gpt_total_params(&md->cfg));
        if (!check(&c, ref.rc == 0 && ref.nsteps == STEPS && gref, mi ? "one rank, tp-3 model" : "one rank",
                   "exit %d, %d steps, gradients dumped", ref.rc, ref.nsteps))
            continue;
        if (mi == 0) {
            /* dp 2 halves the batch a rank takes; the global batch stays 4 */
            Model half = *md;
            half.flags = "--data test/fixtures/ref_tokens.bin --layers 2 --heads 4 --dim 32 --max-seq 16 --vocab 61 --seq 8 --batch 2";
            for (int tp = 2; tp <= 4; tp += 2)
                for (int sp = 0; sp <= 1; sp++) equivalence(&c, md, tp, sp, 1, 0, &ref, gref);
            for (int sp = 0; sp <= 1; sp++)
                for (int zero = 0; zero <= 3; zero += zero ? 2 : 1) equivalence(&c, &half, 2, sp, 2, zero, &ref, gref);
            equivalence(&c, &half, 4, 1, 2, 1, &ref, gref);
            pieces(&c, md, gref);
            for (int tp = 2; tp <= 4; tp += 2)
                for (int sp = 0; sp <= 1; sp++) comm(&c, md, tp, sp);
        } else {
            for (int sp = 0; sp <= 1; sp++) equivalence(&c, md, 3, sp, 1, 0, &ref, gref);
            comm(&c, md, 3, 1);
        }
        free(gref);
        free(ref.out);
    }
    return check_done(&c);
}
