/* test/test_dp.c: data parallelism and ZeRO against one rank, through ./train.
 *
 * The same global batch of 8 sequences, 10 steps with clipping active:
 *  - equivalence: for D in 1, 2, 4, one and two micro-batches, ZeRO 0..3,
 *    with and without --offload, and the parameter server: each step's loss
 *    within 1e-5 relative of one rank's, the final parameters within 1e-5
 *    (absolute; the key biases left out, see param_diff). The sums over
 *    ranks round differently from one rank's, and Adam divides each
 *    gradient by its own size, so an element whose gradient is nearly zero
 *    (a GELU unit that is almost never on) moves by a fraction of lr on
 *    rounding alone: at lr 1e-2 the worst element drifts 1.4e-5, at the
 *    5e-3 used here about half that;
 *  - memory: every rank's measured parameter, gradient and optimizer bytes
 *    within 1% of the ZeRO paper's formula;
 *  - communication: each rank's bytes a step equal the formula of its mode
 *    (nccl-tests bus bytes): DDP all-reduce 2(D-1)/D of the gradient bytes;
 *    ZeRO-1/2 reduce-scatter and all-gather (D-1)/D each; ZeRO-3 one more
 *    all-gather (less wpe, which backward does not read); the parameter server's rank 0 receives (D-1) x the gradients.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "optim.h"
#include "train_run.h"

#define STEPS 10
#define G 8
#define OUT "test/out/dp"
/* tiny GPT-2: 2 layers, 4 heads, 32 wide, vocabulary 61 padded to 128 */
#define MODEL "--data test/fixtures/ref_tokens.bin --layers 2 --heads 4 --dim 32 --max-seq 16 " \
              "--vocab 61 --seq 8 --lr 0.005 --warmup 2 --clip 0.5 --device cpu"
#define NPARAMS 30080

typedef struct Result {
    int rc, nsteps, clipped;
    double loss[STEPS];
    char *out;            /* everything the run printed */
} Result;

static void run(Result *r, const char *flags, const char *save) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "./train " MODEL " --steps %d --comm-stats --save %s %s 2>&1", STEPS,
             save, flags);
    TrainRun t;
    train_run(&t, cmd);
    memset(r, 0, sizeof *r);
    r->rc = t.rc;
    r->nsteps = t.nsteps < STEPS ? t.nsteps : STEPS;
    memcpy(r->loss, t.loss, r->nsteps * sizeof(double));
    r->out = t.out;
    /* steps whose norm (before clipping) is above --clip 0.5 */
    for (const char *p = t.out; (p = strstr(p, "| norm ")); p++)
        if (atof(p + 7) > 0.5) r->clipped++;
}

/* Parameters of a saved model, in file order. */
static float *load_params(const char *path) { return train_load_params(path, NPARAMS); }

/* max |a - b| over the parameters, leaving out the key biases: their
 * gradient is exactly zero in exact arithmetic (a shift of every score of a
 * query), so it is pure rounding, which a different summation order changes
 * and Adam's normalisation turns into steps of its own size. */
static double param_diff(const float *a, const float *b) {
    const int C = 32, L = 2, Vp = 128, T = 16;
    size_t qkvb = (size_t)Vp * C + T * C + 2 * L * C + (size_t)L * 3 * C * C;
    double worst = 0;
    for (size_t i = 0; i < NPARAMS; i++) {
        if (i >= qkvb && i < qkvb + (size_t)L * 3 * C && (i - qkvb) % (3 * C) >= (size_t)C &&
            (i - qkvb) % (3 * C) < (size_t)2 * C)
            continue;
        double d = fabs((double)a[i] - b[i]);
        if (d > worst || isnan(d)) worst = isnan(d) ? INFINITY : d;
    }
    return worst;
}

/* Bytes of (kind, group dp) in the comm table of `rank` (0 when absent). */
static double comm_bytes(const char *out, int rank, const char *kind) {
    char prefix[32];
    snprintf(prefix, sizeof prefix, rank ? "[rank %d]   " : "\n  ", rank);
    return train_comm_bytes(out, prefix, kind, "dp");
}

/* Checks every rank's memory line against its formula (1%). */
static void check_memory(Checks *c, const Result *r, int D, const char *name) {
    double worst = 0;
    int lines = 0;
    for (int rank = 0; rank < D; rank++) {
        char key[64];
        snprintf(key, sizeof key, "memory rank %d: params", rank);
        const char *p = strstr(r->out, key);
        double v[6];
        if (!p || sscanf(p + strlen(key), " %lf MB (formula %lf), grads %lf MB (formula %lf), optimizer %lf",
                         &v[0], &v[1], &v[2], &v[3], &v[4]) != 5)
            continue;
        const char *f = strstr(p, "optimizer");
        f = f ? strstr(f, "(formula ") : NULL;
        if (!f || sscanf(f, "(formula %lf)", &v[5]) != 1) continue;
        lines++;
        for (int k = 0; k < 6; k += 2) {
            double meas = v[k == 4 ? 4 : k], form = v[k == 4 ? 5 : k + 1];
            double err = form > 0 ? fabs(meas - form) / form : (meas == 0 ? 0 : INFINITY);
            if (err > worst) worst = err;
        }
    }
    check(c, lines == D && worst <= 0.01, name,
          "%d ranks' params, grads, optimizer vs the ZeRO formula: worst relative difference %.2e (bound 1e-2)",
          lines, worst);
}

int main(void) {
    Checks c = {0};
    char flags[512], save[256], name[256];
    int rc = system("mkdir -p " OUT);
    (void)rc;
    Result ref;
    run(&ref, "--batch 8", OUT "/ref.bin");
    float *pref = load_params(OUT "/ref.bin");
    if (!check(&c, ref.rc == 0 && ref.nsteps == STEPS && pref, "one-rank reference",
               "exit %d, %d steps, clipping active in %d of them", ref.rc, ref.nsteps, ref.clipped))
        return check_done(&c);

    static const int Ds[] = {1, 2, 4};
    for (int di = 0; di < 3; di++) {
        int D = Ds[di];
        for (int M = 1; M <= 2; M++) {
            for (int zero = 0; zero <= 3; zero++) {
                for (int off = 0; off <= 1; off++) {
                    snprintf(flags, sizeof flags, "--ranks %d --batch %d --micro-batches %d --zero %d%s",
                             D, G / D / M, M, zero, off ? " --offload" : "");
                    snprintf(save, sizeof save, OUT "/d%dm%dz%d%s.bin", D, M, zero, off ? "o" : "");
                    snprintf(name, sizeof name, "dp %d, %d micro-batch%s, zero %d%s", D, M,
                             M > 1 ? "es" : "", zero, off ? ", offload" : "");
                    Result r;
                    run(&r, flags, save);
                    double lw = 0;
                    for (int s = 0; s < r.nsteps; s++)
                        lw = fmax(lw, fabs(r.loss[s] - ref.loss[s]) / ref.loss[s]);
                    float *p = load_params(save);
                    double pw = p ? param_diff(p, pref) : INFINITY;
                    check(&c, r.rc == 0 && r.nsteps == STEPS && lw <= 1e-5 && pw <= 1e-5, name,
                          "losses within %.2e relative (bound 1e-5), parameters within %.2e (bound 1e-5)%s",
                          lw, pw, r.rc ? ", run failed" : "");
                    if (M == 1 && !off) {
                        snprintf(name, sizeof name, "memory dp %d zero %d", D, zero);
                        check_memory(&c, &r, D, name);
                    }
                    if (M == 1 && !off && D > 1) {
                        /* bus bytes a step; scalars (loss, norm) are 4 bytes a call; with
                         * ZeRO-3 --save gathers the model once more at the end */
                        double N4 = 4.0 * NPARAMS, frac = (double)(D - 1) / D;
                        double ar = comm_bytes(r.out, 0, "all_reduce") / STEPS;
                        double rs = comm_bytes(r.out, 0, "reduce_scatter") / STEPS;
                        double ag = (comm_bytes(r.out, 0, "all_gather") - (zero == 3 ? frac * N4 : 0)) / STEPS;
                        /* with ZeRO the norm's exponent and limbs (optim.h) */
                        double want_ar = zero == 0 ? 2 * frac * N4 : 2 * frac * (4 + 4 * OPTIM_NORM_LIMBS);
                        double want_rs = zero ? frac * N4 : 0, want_ag = (zero == 3 ? 2 : zero ? 1 : 0) * frac * N4;
                        /* ZeRO-3 gathers a unit before its forward and its backward; the
                         * position embedding (16 x 32) has no use in backward: once */
                        if (zero == 3) want_ag -= frac * 4.0 * 16 * 32;
                        /* the loss's all-reduce adds under 16 bytes a step */
                        int ok = fabs(ar - want_ar) <= 16 && fabs(rs - want_rs) <= 1 && fabs(ag - want_ag) <= 1;
                        snprintf(name, sizeof name, "comm bytes dp %d zero %d", D, zero);
                        check(&c, ok, name,
                              "a step: all-reduce %.0f (formula %.0f), reduce-scatter %.0f (%.0f), all-gather %.0f (%.0f)",
                              ar, want_ar, rs, want_rs, ag, want_ag);
                    }
                    free(p);
                    free(r.out);
                }
            }
        }
    }
    for (int D = 2; D <= 4; D += 2) {
        snprintf(flags, sizeof flags, "--ranks %d --batch %d --dp-mode ps", D, G / D);
        snprintf(save, sizeof save, OUT "/ps%d.bin", D);
        Result r;
        run(&r, flags, save);
        double lw = 0;
        for (int s = 0; s < r.nsteps; s++) lw = fmax(lw, fabs(r.loss[s] - ref.loss[s]) / ref.loss[s]);
        float *p = load_params(save);
        double pw = p ? param_diff(p, pref) : INFINITY;
        snprintf(name, sizeof name, "parameter server, dp %d", D);
        check(&c, r.rc == 0 && r.nsteps == STEPS && lw <= 1e-5 && pw <= 1e-5, name,
              "losses within %.2e relative (bound 1e-5), parameters within %.2e (bound 1e-5)", lw, pw);
        snprintf(name, sizeof name, "memory parameter server dp %d", D);
        check_memory(&c, &r, D, name);
        double N4 = 4.0 * NPARAMS;
        double recv0 = comm_bytes(r.out, 0, "recv") / STEPS, send0 = comm_bytes(r.out, 0, "send") / STEPS;
        double recv1 = comm_bytes(r.out, 1, "recv") / STEPS, send1 = comm_bytes(r.out, 1, "send") / STEPS;
        snprintf(name, sizeof name, "comm bytes parameter server dp %d", D);
        check(&c, recv0 == (D - 1) * N4 && send0 == (D - 1) * N4 && recv1 == N4 && send1 == N4, name,
              "a step: rank 0 receives %.0f and sends %.0f (formula (D-1) x %.0f = %.0f); rank 1 sends %.0f, receives %.0f",
              recv0, send0, N4, (D - 1) * N4, send1, recv1);
        free(p);
        free(r.out);
    }
    free(pref);
    free(ref.out);
    return check_done(&c);
}
