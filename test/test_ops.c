/* test/test_ops.c: every op's backward against central finite differences.
 *
 * Runs on ops.c's plain loops built in double (included below), so the differences are
 * accurate to ~1e-9 and the bound can be tight. For an op y = f(x) we take
 * the scalar L = sum(y * r) with random r, give the backward dy = r, and
 * compare each input's gradient with (L(x + h) - L(x - h)) / 2h, h = 1e-5,
 * over every element of small random inputs of awkward sizes. Backward ops
 * accumulate, so their gradient buffers start from random values that are
 * subtracted after, which checks the += as well; where an op writes a
 * gradient instead (matmul's dinp) nothing is subtracted, which checks that
 * it overwrites. AdamW is checked against
 * torch's formula written out by hand, the float32 table against the
 * float64 one, and the float32 e^x on NaN and infinite inputs.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include "check.h"
/* ops.c itself, its loops in double: every cpu_* function named below is
 * that file's, static here, with each float buffer double (ops.c's header,
 * "Two builds"). The float32 tables cpu_ops and cpu_bf16_ops are ops.o's. */
#define OPS_REAL double
#include "ops.c"

#define H 1e-5
#define BOUND 1e-6

/* The one piece of mutable state, in a test only: a fixed-seed generator. */
static uint64_t rng = 42;
static double randn(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    double u1 = ((rng >> 11) + 1.0) / 9007199254740993.0;
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    double u2 = (rng >> 11) / 9007199254740992.0;
    return sqrt(-2 * log(u1)) * cos(2 * M_PI * u2);
}
static double *rand_buf(size_t n, double scale) {
    double *x = malloc((n + 1) * sizeof(double));
    for (size_t i = 0; i < n; i++) x[i] = randn() * scale;
    return x;
}

/* One op under test: forward computes L = sum(out * r); backward adds the
 * gradient of L into the gradient buffers of the inputs, or writes it
 * there for the inputs in `written` (bit j: input j). */
typedef struct Case {
    const char *name;
    int nin, written;
    double *in[4];        /* inputs */
    size_t n[4];          /* their sizes */
    double *grad[4];      /* their gradients, from backward */
    double (*loss)(struct Case *);
    void (*backward)(struct Case *);
    int B, T, C, NH, N, OC, V, Vp;
    int *tokens;
    double *r, *out, *aux1, *aux2, *aux3;  /* upstream weights, output, saved state */
} Case;

static double dot(const double *a, const double *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* Runs backward (on top of random starting gradients), then finite
 * differences on every input element; reports the worst relative error. */
static void run_case(Checks *c, Case *k) {
    double *start[4];
    for (int j = 0; j < k->nin; j++) {
        start[j] = rand_buf(k->n[j], 1.0);
        k->grad[j] = malloc(k->n[j] * sizeof(double));
        memcpy(k->grad[j], start[j], k->n[j] * sizeof(double));
    }
    k->loss(k);
    k->backward(k);
    double worst = 0;
    for (int j = 0; j < k->nin; j++) {
        double diff = 0, mag = 0;
        for (size_t i = 0; i < k->n[j]; i++) {
            double x = k->in[j][i];
            k->in[j][i] = x + H;
            double up = k->loss(k);
            k->in[j][i] = x - H;
            double down = k->loss(k);
            k->in[j][i] = x;
            double fd = (up - down) / (2 * H), ad = k->grad[j][i] - (k->written >> j & 1 ? 0 : start[j][i]);
            diff = fmax(diff, fabs(fd - ad));
            mag = fmax(mag, fabs(fd));
        }
        double rel = diff / fmax(mag, 1e-12);
        worst = fmax(worst, rel);
        free(start[j]);
        free(k->grad[j]);
    }
    check(c, worst <= BOUND, k->name, "worst relative error vs finite differences %.2e (bound %.0e)",
          worst, BOUND);
}

/* Frees what main allocated for a case: its inputs, output, upstream
 * weights and saved state (free(NULL) for those a case does not use). */
static void case_free(Case *k) {
    for (int j = 0; j < k->nin; j++) free(k->in[j]);
    free(k->r); free(k->out); free(k->aux1); free(k->aux2); free(k->aux3);
}

/* --- encoder: inputs wte [V,C], wpe [T,C] */
static double enc_loss(Case *k) {
    cpu_encoder_forward(NULL, k->out, k->tokens, k->in[0], k->in[1], k->B, k->T, k->C);
    return dot(k->out, k->r, (size_t)k->B * k->T * k->C);
}
static void enc_back(Case *k) {
    cpu_encoder_backward(NULL, k->grad[0], k->grad[1], k->r, k->tokens, k->B, k->T, k->C);
}

/* --- layernorm: inputs x [N,C], w [C], b [C] */
static double ln_loss(Case *k) {
    cpu_layernorm_forward(NULL, k->out, k->aux1, k->aux2, k->in[0], k->in[1], k->in[2], k->N, k->C);
    return dot(k->out, k->r, (size_t)k->N * k->C);
}
static void ln_back(Case *k) {
    cpu_layernorm_backward(NULL, k->grad[0], k->grad[1], k->grad[2], k->r, k->in[0], k->in[1],
                             k->aux1, k->aux2, k->N, k->C);
}

/* --- matmul: inputs x [N,C], w [OC,C], bias [OC] */
static double mm_loss(Case *k) {
    cpu_matmul_forward_naive(NULL, k->out, k->in[0], k->in[1], k->in[2], k->N, k->C, k->OC);
    return dot(k->out, k->r, (size_t)k->N * k->OC);
}
static void mm_back(Case *k) {
    cpu_matmul_backward_naive(NULL, k->grad[0], k->grad[1], k->grad[2], k->r, k->in[0], k->in[1],
                          k->N, k->C, k->OC);
}

/* --- attention: input qkv [B,T,3C]; aux1 = att [B,NH,T,T], aux2 = scratch */
static double att_loss(Case *k) {
    cpu_attention_forward_naive(NULL, k->out, k->aux1, k->in[0], k->B, k->T, k->C, k->NH);
    return dot(k->out, k->r, (size_t)k->B * k->T * k->C);
}
static void att_back(Case *k) {
    cpu_attention_backward_naive(NULL, k->grad[0], k->aux2, k->r, k->in[0], k->aux1, k->B, k->T, k->C,
                             k->NH);
}

/* --- gelu: input x [N] */
static double gelu_loss(Case *k) {
    cpu_gelu_forward(NULL, k->out, k->in[0], k->N);
    return dot(k->out, k->r, k->N);
}
static void gelu_back(Case *k) { cpu_gelu_backward(NULL, k->grad[0], k->in[0], k->r, k->N); }

/* --- residual: inputs a [N], b [N]; backward is accumulate into both */
static double add_loss(Case *k) {
    cpu_add(NULL, k->out, k->in[0], k->in[1], k->N);
    return dot(k->out, k->r, k->N);
}
static void add_back(Case *k) {
    cpu_accumulate(NULL, k->grad[0], k->r, k->N);
    cpu_accumulate(NULL, k->grad[1], k->r, k->N);
}

/* --- crossentropy: input logits [N,Vp]; L = sum_n r[n] * loss[n], and the
 * fused backward with dloss = r... takes one scalar, so r is constant. */
static double ce_loss(Case *k) {
    memcpy(k->aux1, k->in[0], (size_t)k->N * k->Vp * sizeof(double));
    cpu_crossentropy(NULL, k->out, k->aux1, k->tokens, k->N, k->V, k->Vp, 0);
    double s = 0;
    for (int n = 0; n < k->N; n++) s += k->out[n] * k->r[0];
    return s;
}
static void ce_back(Case *k) {
    memcpy(k->aux1, k->in[0], (size_t)k->N * k->Vp * sizeof(double));
    cpu_crossentropy(NULL, k->out, k->aux1, k->tokens, k->N, k->V, k->Vp, k->r[0]);
    cpu_accumulate(NULL, k->grad[0], k->aux1, (size_t)k->N * k->Vp);
}

static void test_adamw(Checks *c) {
    size_t n = 37;
    double *p = rand_buf(n, 1), *g = rand_buf(n, 1), *m = rand_buf(n, 0.1), *v = rand_buf(n, 0.1);
    double *p2 = malloc(n * 8), *m2 = malloc(n * 8), *v2 = malloc(n * 8);
    for (size_t i = 0; i < n; i++) { v[i] = fabs(v[i]); p2[i] = p[i]; m2[i] = m[i]; v2[i] = v[i]; }
    double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, scale = 0.5;
    int t = 3;
    double bc1 = 1 - pow(b1, t), bc2 = 1 - pow(b2, t);
    cpu_adamw(NULL, p, g, m, v, n, lr, b1, b2, eps, wd, bc1, bc2, scale);
    double worst = 0;
    for (size_t i = 0; i < n; i++) {  /* torch.optim.AdamW, step by step */
        double gi = g[i] * scale;
        p2[i] *= 1 - lr * wd;
        m2[i] = b1 * m2[i] + (1 - b1) * gi;
        v2[i] = b2 * v2[i] + (1 - b2) * gi * gi;
        double denom = sqrt(v2[i]) / sqrt(bc2) + eps;
        p2[i] -= (lr / bc1) * m2[i] / denom;
        worst = fmax(worst, fabs(p[i] - p2[i]) + fabs(m[i] - m2[i]) + fabs(v[i] - v2[i]));
    }
    check(c, worst < 1e-14, "adamw", "max difference from torch's formula %.2e (bound 1e-14)", worst);
    free(p); free(g); free(m); free(v); free(p2); free(m2); free(v2);
}

/* The float32 table (what train runs) against the float64 one on a matmul
 * with ragged edges: catches a float path that diverges from the reference. */
static void test_f32_matches_f64(Checks *c) {
    int N = 37, C = 45, OC = 77;
    double *x = rand_buf(N * C, 1), *w = rand_buf(OC * C, 1), *b = rand_buf(OC, 1);
    double *y = malloc(N * OC * 8);
    float *xf = malloc(N * C * 4), *wf = malloc(OC * C * 4), *bf = malloc(OC * 4), *yf = malloc(N * OC * 4);
    for (int i = 0; i < N * C; i++) xf[i] = (float)x[i];
    for (int i = 0; i < OC * C; i++) wf[i] = (float)w[i];
    for (int i = 0; i < OC; i++) bf[i] = (float)b[i];
    for (int i = 0; i < N * C; i++) x[i] = xf[i];
    for (int i = 0; i < OC * C; i++) w[i] = wf[i];
    for (int i = 0; i < OC; i++) b[i] = bf[i];
    cpu_matmul_forward_naive(NULL, y, x, w, b, N, C, OC);
    cpu_ops.matmul_forward(NULL, yf, xf, wf, bf, N, C, OC);
    double diff = 0, mag = 0;
    for (int i = 0; i < N * OC; i++) { diff = fmax(diff, fabs(yf[i] - y[i])); mag = fmax(mag, fabs(y[i])); }
    check(c, diff / mag < 1e-6, "float32 matmul vs float64", "relative error %.2e (bound 1e-6)", diff / mag);
    free(x); free(w); free(b); free(y); free(xf); free(wf); free(bf); free(yf);
}

/* Non-finite and huge inputs through the float32 ops that call e^x (GELU,
 * the loss): a NaN gives a NaN, a huge finite value a finite result (e^x
 * clamps its argument). Under make sanitize this is also the check that
 * e^x's bit tricks are defined behaviour on a NaN (issue 40: the exponent's
 * shift overflowed an int there). */
static void test_nonfinite(Checks *c) {
    const float x[8] = {NAN, -NAN, INFINITY, -INFINITY, 1e30f, -1e30f, 88.5f, -100.0f};
    float y[8];
    cpu_ops.gelu_forward(NULL, y, x, 8);
    int gelu_ok = isnan(y[0]) && isnan(y[1]) && y[2] == INFINITY;
    for (int i = 4; i < 8; i++) gelu_ok &= isfinite(y[i]);
    /* row 0 holds a NaN logit; row 1 logits 1e30 apart, its target the largest */
    float z[8] = {0, NAN, 1, 2, 1e30f, -1e30f, -INFINITY, 5}, loss[2];
    int tg[2] = {2, 0};
    cpu_ops.crossentropy(NULL, loss, z, tg, 2, 4, 4, 0.5f);
    int xent_ok = isnan(loss[0]) && loss[1] == 0;
    for (int v = 4; v < 8; v++) xent_ok &= isfinite(z[v]);
    check(c, gelu_ok && xent_ok, "float32 e^x on NaN, infinities and huge values",
          "gelu(NaN, -NaN, inf) = %g %g %g, gelu(+-1e30, 88.5, -100) finite; loss of a NaN row %g, "
          "of a row 1e30 apart %g with a finite gradient", y[0], y[1], y[2], loss[0], loss[1]);
}

/* Table t's buffer of n elements of its dtype holding x (float32 or bf16). */
static void *act_buf(const Ops *t, const double *x, size_t n) {
    void *p = malloc(n * 4 + 4);
    for (size_t i = 0; i < n; i++) {
        if (t->dtype == DT_BF16) ((uint16_t *)p)[i] = bf16_from_f32((float)x[i]);
        else ((float *)p)[i] = (float)x[i];
    }
    return p;
}

static float *f32_buf(const double *x, size_t n) {
    float *p = malloc(n * 4 + 4);
    for (size_t i = 0; i < n; i++) p[i] = (float)x[i];
    return p;
}

/* The split backward (pp.c's zero-bubble schedules): matmul_backward and
 * layernorm_backward called once for the input gradient (the weights' NULL)
 * and once for the weights' gradients (dinp NULL, and nothing the call does
 * not need: w for the matmul's, w for the LayerNorm's) give the same bits as
 * one call for both, in the float32 and the bf16 tables. */
static void test_split_backward(Checks *c) {
    const Ops *tables[] = {&cpu_ops, &cpu_bf16_ops};
    int N = 13, C = 19, OC = 23;
    double *x = rand_buf(N * C, 1), *w = rand_buf(OC * C, 1), *g = rand_buf(N * OC, 1);
    double *lw = rand_buf(C, 1), *lb = rand_buf(C, 1), *lg = rand_buf(N * C, 1), *acc = rand_buf(OC * C, 1);
    for (int ti = 0; ti < 2; ti++) {
        const Ops *t = tables[ti];
        size_t e = dt_size(t->dtype);
        void *X = act_buf(t, x, N * C), *W = act_buf(t, w, OC * C), *G = act_buf(t, g, N * OC);
        void *dx1 = act_buf(t, acc, N * C), *dx2 = act_buf(t, acc, N * C);
        float *dw1 = f32_buf(acc, OC * C), *dw2 = f32_buf(acc, OC * C), *db1 = f32_buf(acc, OC), *db2 = f32_buf(acc, OC);
        t->matmul_backward(NULL, dx1, dw1, db1, G, X, W, N, C, OC);
        t->matmul_backward(NULL, dx2, NULL, NULL, G, NULL, W, N, C, OC);
        t->matmul_backward(NULL, NULL, dw2, db2, G, X, NULL, N, C, OC);
        int mm_same = !memcmp(dx1, dx2, N * C * e) && !memcmp(dw1, dw2, OC * C * 4) && !memcmp(db1, db2, OC * 4);
        /* LayerNorm: the forward's statistics, then the two ways */
        void *LW = act_buf(t, lw, C), *LB = act_buf(t, lb, C), *LG = act_buf(t, lg, N * C), *out = act_buf(t, x, N * C);
        float *mean = malloc(N * 4), *rstd = malloc(N * 4);
        t->layernorm_forward(NULL, out, mean, rstd, X, LW, LB, N, C);
        float *lw1 = f32_buf(acc, C), *lw2 = f32_buf(acc, C), *lb1 = f32_buf(acc, C), *lb2 = f32_buf(acc, C);
        memcpy(dx1, dx2, N * C * e);
        t->layernorm_backward(NULL, dx1, lw1, lb1, LG, X, LW, mean, rstd, N, C);
        t->layernorm_backward(NULL, dx2, NULL, NULL, LG, X, LW, mean, rstd, N, C);
        t->layernorm_backward(NULL, NULL, lw2, lb2, LG, X, NULL, mean, rstd, N, C);
        int ln_same = !memcmp(dx1, dx2, N * C * e) && !memcmp(lw1, lw2, C * 4) && !memcmp(lb1, lb2, C * 4);
        check(c, mm_same && ln_same, t->name, "split backward (input gradient, then the weights' with dinp "
              "NULL) equals one call: matmul %s, layernorm %s", mm_same ? "same bits" : "DIFFERS",
              ln_same ? "same bits" : "DIFFERS");
        free(X); free(W); free(G); free(dx1); free(dx2); free(dw1); free(dw2); free(db1); free(db2);
        free(LW); free(LB); free(LG); free(out); free(mean); free(rstd);
        free(lw1); free(lw2); free(lb1); free(lb2);
    }
    free(x); free(w); free(g); free(lw); free(lb); free(lg); free(acc);
}

int main(void) {
    Checks c = {0};
    Case k;

    memset(&k, 0, sizeof k);  /* encoder: B=2, T=5, C=7, vocab 11 with a repeated token */
    k.name = "encoder backward"; k.B = 2; k.T = 5; k.C = 7;
    int toks[10] = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3};
    k.tokens = toks;
    k.nin = 2; k.n[0] = 11 * 7; k.n[1] = 5 * 7;
    k.in[0] = rand_buf(k.n[0], 1); k.in[1] = rand_buf(k.n[1], 1);
    k.out = malloc(70 * 8); k.r = rand_buf(70, 1);
    k.loss = enc_loss; k.backward = enc_back;
    run_case(&c, &k);

    case_free(&k);
    memset(&k, 0, sizeof k);  /* layernorm: N=6, C=13 */
    k.name = "layernorm backward"; k.N = 6; k.C = 13;
    k.nin = 3; k.n[0] = 78; k.n[1] = 13; k.n[2] = 13;
    k.in[0] = rand_buf(78, 2); k.in[1] = rand_buf(13, 1); k.in[2] = rand_buf(13, 1);
    k.out = malloc(78 * 8); k.aux1 = malloc(6 * 8); k.aux2 = malloc(6 * 8); k.r = rand_buf(78, 1);
    k.loss = ln_loss; k.backward = ln_back;
    run_case(&c, &k);

    case_free(&k);
    memset(&k, 0, sizeof k);  /* matmul: N=9, C=11, OC=7 (ragged against the 4x4 blocks) */
    k.name = "matmul backward"; k.N = 9; k.C = 11; k.OC = 7;
    k.nin = 3; k.n[0] = 99; k.n[1] = 77; k.n[2] = 7;
    k.in[0] = rand_buf(99, 1); k.in[1] = rand_buf(77, 1); k.in[2] = rand_buf(7, 1);
    k.out = malloc(63 * 8); k.r = rand_buf(63, 1);
    k.loss = mm_loss; k.backward = mm_back; k.written = 1;   /* dinp written, dw and db added to */
    run_case(&c, &k);

    case_free(&k);
    memset(&k, 0, sizeof k);  /* attention: B=2, T=5, C=6, NH=2 */
    k.name = "attention backward"; k.B = 2; k.T = 5; k.C = 6; k.NH = 2;
    k.nin = 1; k.n[0] = 2 * 5 * 18;
    k.in[0] = rand_buf(k.n[0], 1);
    k.out = malloc(60 * 8); k.r = rand_buf(60, 1);
    k.aux1 = malloc(2 * 2 * 25 * 8); k.aux2 = malloc(2 * 2 * 25 * 8);
    k.loss = att_loss; k.backward = att_back; k.written = 1;   /* dqkv written */
    run_case(&c, &k);

    case_free(&k);
    memset(&k, 0, sizeof k);  /* gelu: 53 values over [-6, 6] */
    k.name = "gelu backward"; k.N = 53;
    k.nin = 1; k.n[0] = 53; k.in[0] = rand_buf(53, 2.5);
    k.out = malloc(53 * 8); k.r = rand_buf(53, 1);
    k.loss = gelu_loss; k.backward = gelu_back;
    run_case(&c, &k);

    case_free(&k);
    memset(&k, 0, sizeof k);
    k.name = "residual backward"; k.N = 17;
    k.nin = 2; k.n[0] = 17; k.n[1] = 17; k.in[0] = rand_buf(17, 1); k.in[1] = rand_buf(17, 1);
    k.out = malloc(17 * 8); k.r = rand_buf(17, 1);
    k.loss = add_loss; k.backward = add_back;
    run_case(&c, &k);

    case_free(&k);
    memset(&k, 0, sizeof k);  /* crossentropy: N=4 rows, V=9 real of Vp=12 */
    k.name = "crossentropy backward"; k.N = 4; k.V = 9; k.Vp = 12;
    int tg[4] = {0, 8, 3, 3};
    k.tokens = tg;
    k.nin = 1; k.n[0] = 48; k.in[0] = rand_buf(48, 2);
    k.out = malloc(4 * 8); k.aux1 = malloc(48 * 8); k.r = rand_buf(1, 1);
    k.loss = ce_loss; k.backward = ce_back;
    run_case(&c, &k);
    /* padded columns: no gradient, and they do not change the loss */
    memcpy(k.aux1, k.in[0], 48 * 8);
    cpu_crossentropy(NULL, k.out, k.aux1, tg, 4, 9, 12, 1.0);
    double padded = 0;
    for (int n = 0; n < 4; n++) for (int v = 9; v < 12; v++) padded = fmax(padded, fabs(k.aux1[n * 12 + v]));
    check(&c, padded == 0, "crossentropy padded columns", "max |gradient| in padded columns %.1e", padded);
    case_free(&k);

    test_adamw(&c);
    test_f32_matches_f64(&c);
    test_nonfinite(&c);
    test_split_backward(&c);
    return check_done(&c);
}
