/* test/test_selftest_emu.c: the start-up self-test (selftest.c) under the
 * CPU emulation of CUDA (test/emu/emu.h), linked against the same objects as
 * test/train_emu.
 *
 * For each table (cuda_ops, cuda_bf16_ops): the real table passes, with its
 * worst error and time; then, one at a time, a copy of it with one entry
 * replaced by a deliberately wrong kernel (the real one, then one element
 * of its output moved by a tenth of the output's largest value) must fail,
 * and the first failure, and the error line, must name that kernel. Then
 * test/train_emu itself: a --device cuda run prints the self-test's line
 * before step 1, and --no-self-test leaves it out.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tensor.h"
#include "selftest.h"
#include "check.h"

static const Ops *real;  /* the table the wrong kernels wrap */

/* Moves element n-1 of buf (n elements, of the dtype when act, else float32)
 * by a tenth of the largest |value| plus 0.1: a kernel wrong at one edge. */
static void perturb(Dev *d, void *buf, size_t n, int act) {
    size_t esz = act ? dt_size(d->dtype) : 4;
    unsigned char *h = malloc(n * esz);
    dev_to_host(d, h, buf, n * esz);
    float mx = 0, last;
    for (size_t i = 0; i < n; i++) {
        float v = esz == 2 ? bf16_to_f32(((uint16_t *)h)[i]) : ((float *)h)[i];
        if (fabsf(v) > mx) mx = fabsf(v);
    }
    last = (esz == 2 ? bf16_to_f32(((uint16_t *)h)[n - 1]) : ((float *)h)[n - 1]) + 0.1f * mx + 0.1f;
    if (esz == 2) ((uint16_t *)h)[n - 1] = bf16_from_f32(last);
    else ((float *)h)[n - 1] = last;
    dev_from_host(d, buf, h, n * esz);
    free(h);
}

static void bad_gelu_forward(Dev *d, void *out, const void *inp, size_t n) {
    real->gelu_forward(d, out, inp, n);
    perturb(d, out, n, 1);
}
static void bad_matmul_backward(Dev *d, void *dinp, float *dw, float *dbias, const void *dout,
                                const void *inp, const void *w, int N, int C, int OC) {
    real->matmul_backward(d, dinp, dw, dbias, dout, inp, w, N, C, OC);
    perturb(d, dw, (size_t)OC * C, 0);
}
static void bad_attention_forward(Dev *d, void *out, float *state, const void *qkv, int B, int T,
                                  int C, int NH) {
    real->attention_forward(d, out, state, qkv, B, T, C, NH);
    perturb(d, out, (size_t)B * T * C, 1);
}
static void bad_layernorm_backward(Dev *d, void *dinp, float *dw, float *db, const void *dout,
                                   const void *inp, const void *w, const float *mean,
                                   const float *rstd, int N, int C) {
    real->layernorm_backward(d, dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    perturb(d, dinp, (size_t)N * C, 1);
}

/* One wrong kernel: `name` is what the failure must start with. */
typedef struct Bug {
    const char *name;
    void (*plant)(Ops *o);
} Bug;
static void plant_gelu(Ops *o) { o->gelu_forward = bad_gelu_forward; }
static void plant_matmul(Ops *o) { o->matmul_backward = bad_matmul_backward; }
static void plant_attention(Ops *o) { o->attention_forward = bad_attention_forward; }
static void plant_layernorm(Ops *o) { o->layernorm_backward = bad_layernorm_backward; }
static const Bug bugs[] = {
    {"gelu_forward", plant_gelu},
    {"matmul_backward (dw)", plant_matmul},
    {"attention_forward", plant_attention},
    {"layernorm_backward", plant_layernorm},
};

static void check_table(Checks *c, Dev *d, DType dt) {
    char name[128], line[512];
    dev_set_dtype(d, dt);
    real = d->ops;
    SelftestResult res;
    int rc = selftest_run(d, &res);
    selftest_line(&res, d, line, sizeof line);
    snprintf(name, sizeof name, "selftest %s passes (cpu emulation)", dt_name(dt));
    check(c, rc == 0 && res.ops == 25 && res.model_layers == 2, name,
          "%d ops and a %d-layer step, worst rel. error %.2e, %.2f s: %s", res.ops,
          res.model_layers, res.worst, res.seconds, line);
    for (size_t i = 0; i < sizeof bugs / sizeof bugs[0]; i++) {
        Ops bad = *real;
        bugs[i].plant(&bad);
        d->ops = &bad;
        rc = selftest_run(d, &res);
        d->ops = real;
        selftest_line(&res, d, line, sizeof line);
        char want[128];
        snprintf(want, sizeof want, "error: self-test: kernel %s", bugs[i].name);
        snprintf(name, sizeof name, "selftest %s names a wrong %s (cpu emulation)", dt_name(dt),
                 bugs[i].name);
        check(c, rc != 0 && strncmp(res.failed, bugs[i].name, strlen(bugs[i].name)) == 0 &&
                 !strncmp(line, want, strlen(want)) && strstr(line, "differs from the CPU reference"),
              name, "%.2f s: %s", res.seconds, line);
    }
    snprintf(name, sizeof name, "selftest %s frees what it allocates (cpu emulation)", dt_name(dt));
    check(c, d->bytes_live == 0, name, "%zu device bytes still live", d->bytes_live);
}

/* test/train_emu with flags: its exit status, whether it printed the
 * self-test's line, and whether that came before the first step line. */
static void train_emu(const char *flags, int *rc, int *has_line, int *before_step) {
    char cmd[1024], out[1 << 12];
    snprintf(cmd, sizeof cmd,
             "./test/train_emu --data README.md --device cuda --layers 1 --heads 2 --dim 32 "
             "--seq 8 --batch 2 --steps 1 %s 2>&1", flags);
    FILE *p = popen(cmd, "r");
    int step = 0;
    *has_line = *before_step = 0;
    while (p && fgets(out, sizeof out, p)) {
        if (!strncmp(out, "self-test: ", 11) && strstr(out, " kernels and a 2-layer step match")) {
            *has_line = 1;
            *before_step = !step;
        }
        if (!strncmp(out, "step ", 5)) step = 1;
    }
    *rc = p ? pclose(p) : -1;
}

int main(void) {
    Checks c = {0};
    char err[256];
    Dev d;
    if (dev_gpu_count() == 0 || dev_open(&d, DEV_CUDA, 0, err, sizeof err) != 0) {
        check_skip(&c, "selftest (cpu emulation)", "the emulated GPU did not open");
        return check_done(&c);
    }
    check_table(&c, &d, DT_F32);
    check_table(&c, &d, DT_BF16);
    dev_close(&d);

    int rc, has, first;
    train_emu("", &rc, &has, &first);
    check(&c, rc == 0 && has && first, "train --device cuda prints the self-test line before step 1 (cpu emulation)",
          "exit %d, line %s%s", rc, has ? "printed" : "missing", has && !first ? " (after a step)" : "");
    train_emu("--no-self-test", &rc, &has, &first);
    check(&c, rc == 0 && !has, "train --no-self-test skips it (cpu emulation)", "exit %d, line %s", rc,
          has ? "printed" : "absent");
    return check_done(&c);
}
