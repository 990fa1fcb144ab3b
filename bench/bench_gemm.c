/* bench/bench_gemm.c: our CPU GEMM (gemm.c) beside OpenBLAS's sgemm, at GPT-2 124M's shapes.
 *
 *   bench/bench_gemm --blas /path/to/libopenblas.so [--rows R] [--reps N] [--rounds N] [--cpu-clock]
 *                    [--split auto|rows|cols]
 *
 * For each linear of GPT-2 124M (qkv 768 -> 2304, attproj 768 -> 768, fc
 * 768 -> 3072, fcproj 3072 -> 768, the head 768 -> 50304) at R rows (batch
 * x seq, 256 by default): the forward Y = X W^T, dX += dY W and
 * dW += dY^T X, each timed as our gemm() and as cblas_sgemm on the same
 * buffers, layouts and beta, best of all its timed runs, in rounds (10
 * unless --rounds) of N runs (2 unless --reps) of each library after one
 * untimed, the two taking turns to go first, with a pause after each
 * (so that neither library's threads, spinning after a call, take a core
 * from the other's runs). On a VM whose neighbours come and go, a library's
 * speed moves by 10-40% over seconds (2026-11-26: the same shape's ratio
 * 0.49-0.99 over five runs of 2 rounds x 5 on an AVX-512 host); many short
 * turns give both libraries chances at the same quiet moments (on the Zen 3
 * VM, a run's worst shape 0.85-0.88 with 3 rounds x 5 and 0.88-0.94 with
 * 10 x 2, three runs each, the means alike). OpenBLAS
 * is loaded with dlopen (no link-time dependency): Debian's libopenblas or
 * the one inside pip's numpy wheel (its symbols carry a scipy_ prefix and
 * a 64_ suffix, and 64-bit integers). A library without openblas_get_config
 * (the reference netlib BLAS, say) is refused: it is no yardstick.
 *
 * --cpu-clock times with the process's CPU clock instead of the wall clock:
 * on a loaded machine, with one thread (OMP_NUM_THREADS=1), it counts only
 * the time the product really ran (with more threads it would count their
 * sum, spinning included, so it is refused there).
 *
 * --split rows or cols forces how our gemm divides C between its threads
 * (gemm_split in gemm.h), to compare the two on a machine; auto, the
 * default, is what training does.
 *
 * Prints one line a product, then a "step" line: the flops of a training
 * step's matmuls (each block linear 12 times, the head once) over their
 * summed time, for each side (the BLAS-bound step in bench_cpu.sh uses
 * OpenBLAS's).
 */
#include <dlfcn.h>
#include <getopt.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "gemm.h"

enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };
typedef void Sgemm32(int, int, int, int, int, int, float, const float *, int, const float *, int,
                     float, float *, int);
typedef void Sgemm64(int, int, int, int64_t, int64_t, int64_t, float, const float *, int64_t,
                     const float *, int64_t, float, float *, int64_t);

typedef struct {
    Sgemm32 *s32;
    Sgemm64 *s64;
    const char *config;
    int threads;
} Blas;

static void *sym(void *h, const char *const *names) {
    for (; *names; names++) {
        void *p = dlsym(h, *names);
        if (p) return p;
    }
    return NULL;
}

/* Loads OpenBLAS from path with threads threads; exits 2 with a line on failure. */
static void blas_open(Blas *b, const char *path, int threads) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) { fprintf(stderr, "bench_gemm: cannot load %s: %s\n", path, dlerror()); exit(2); }
    const char *cfg_names[] = {"openblas_get_config", "openblas_get_config64_", "scipy_openblas_get_config64_", NULL};
    const char *set_names[] = {"openblas_set_num_threads", "openblas_set_num_threads64_",
                               "scipy_openblas_set_num_threads64_", NULL};
    const char *get_names[] = {"openblas_get_num_threads", "openblas_get_num_threads64_",
                               "scipy_openblas_get_num_threads64_", NULL};
    const char *s32_names[] = {"cblas_sgemm", NULL};
    const char *s64_names[] = {"cblas_sgemm64_", "scipy_cblas_sgemm64_", NULL};
    char *(*cfg)(void) = (char *(*)(void))sym(h, cfg_names);
    if (!cfg) {
        fprintf(stderr, "bench_gemm: %s is not OpenBLAS (no openblas_get_config): refusing to measure against it\n", path);
        exit(2);
    }
    void (*set)(int) = (void (*)(int))sym(h, set_names);
    int (*get)(void) = (int (*)(void))sym(h, get_names);
    if (set) set(threads);
    b->s64 = (Sgemm64 *)sym(h, s64_names);
    b->s32 = b->s64 ? NULL : (Sgemm32 *)sym(h, s32_names);
    if (!b->s32 && !b->s64) { fprintf(stderr, "bench_gemm: %s has no cblas_sgemm\n", path); exit(2); }
    b->config = cfg();
    b->threads = get ? get() : -1;
}

static void blas_sgemm(const Blas *b, int ta, int tb, int M, int N, int K, const float *A, int lda,
                       const float *B, int ldb, float beta, float *C, int ldc) {
    if (b->s64) b->s64(ROW_MAJOR, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
    else b->s32(ROW_MAJOR, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
}

static double now(clockid_t clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Sleep for s seconds: the other library's threads stop spinning. */
static void idle(double s) {
    struct timespec t = {(time_t)s, (long)((s - (time_t)s) * 1e9)};
    nanosleep(&t, NULL);
}

/* On a 64-byte line, as train's host buffers are (tensor.c) */
static float *filled(size_t n) {
    float *p = NULL;
    if (posix_memalign((void **)&p, 64, n * sizeof(float))) { fprintf(stderr, "bench_gemm: out of memory\n"); exit(2); }
    for (size_t i = 0; i < n; i++) p[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    return p;
}

int main(int argc, char **argv) {
    const char *path = NULL;
    int R = 256, reps = 2, rounds = 10;
    GemmSplit split = GEMM_SPLIT_AUTO;
    const char *split_names[] = {"auto", "rows", "cols"};
    clockid_t clock = CLOCK_MONOTONIC;
    static const struct option longopts[] = {
        {"blas", required_argument, NULL, 'b'}, {"rows", required_argument, NULL, 'r'},
        {"reps", required_argument, NULL, 'n'}, {"rounds", required_argument, NULL, 'o'},
        {"cpu-clock", no_argument, NULL, 'c'},  {"split", required_argument, NULL, 's'},
        {NULL, 0, NULL, 0}};
    const char *usage = "usage: bench_gemm --blas LIBOPENBLAS.so [--rows R] [--reps N] [--rounds N] [--cpu-clock]"
                        " [--split auto|rows|cols]\n";
    int ch;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, ":", longopts, NULL)) != -1) {
        char *end = NULL;
        long v = optarg ? strtol(optarg, &end, 10) : 0;
        int bad_count = optarg && (*end || end == optarg || v < 1 || v > 1000000);
        switch (ch) {
        case 'b': path = optarg; break;
        case 'c': clock = CLOCK_PROCESS_CPUTIME_ID; break;
        case 's': {
            int i = 0;
            while (i < 3 && strcmp(optarg, split_names[i])) i++;
            if (i == 3) {
                fprintf(stderr, "bench_gemm: --split %s: expected auto, rows or cols\n", optarg);
                return 2;
            }
            split = (GemmSplit)i;
            break;
        }
        case 'r': case 'n': case 'o':
            if (bad_count) {
                fprintf(stderr, "bench_gemm: --%s %s: expected a count >= 1\n",
                        ch == 'r' ? "rows" : ch == 'n' ? "reps" : "rounds", optarg);
                return 2;
            }
            if (ch == 'r') R = (int)v;
            else if (ch == 'n') reps = (int)v;
            else rounds = (int)v;
            break;
        case ':': fprintf(stderr, "bench_gemm: %s needs a value\n", argv[optind - 1]); return 2;
        default: fprintf(stderr, "bench_gemm: unknown flag %s\n%s", argv[optind - 1], usage); return 2;
        }
    }
    if (optind < argc) { fprintf(stderr, "bench_gemm: unexpected argument '%s'\n%s", argv[optind], usage); return 2; }
    if (!path) {
        fprintf(stderr, "%s", usage);
        return 2;
    }
    int threads = omp_get_max_threads();
    if (clock != CLOCK_MONOTONIC && threads != 1) {
        fprintf(stderr, "bench_gemm: --cpu-clock needs OMP_NUM_THREADS=1\n");
        return 2;
    }
    Blas blas;
    blas_open(&blas, path, threads);
    char cpu[128];
    const char *isa;
    gemm_cpu_describe(cpu, sizeof cpu, &isa);
    printf("cpu: %s, %s; our kernel %s, %d threads, C split %s; %s clock\n", cpu, isa, gemm_kernel_name(),
           threads, split_names[split], clock == CLOCK_MONOTONIC ? "wall" : "process CPU");
    printf("blas: %s (%s), %d threads\n", blas.config, path, blas.threads);
    printf("%-8s %-5s %6s %6s %6s %9s %9s %6s\n", "linear", "prod", "M", "N", "K", "ours", "openblas", "ratio");
    struct { const char *name; int C, OC; } lin[] = {
        {"qkv", 768, 2304}, {"attproj", 768, 768}, {"fc", 768, 3072}, {"fcproj", 3072, 768}, {"head", 768, 50304},
    };
    double t_ours = 0, t_blas = 0, flops_all = 0;
    for (int l = 0; l < 5; l++) {
        int C = lin[l].C, OC = lin[l].OC;
        float *X = filled((size_t)R * C), *W = filled((size_t)OC * C), *Y = filled((size_t)R * OC);
        float *dX = filled((size_t)R * C), *dW = filled((size_t)OC * C);
        for (int p = 0; p < 3; p++) {
            int M = p == 2 ? OC : R, N = p == 0 ? OC : C, K = p == 0 ? C : p == 1 ? OC : R;
            double best[2] = {1e30, 1e30};
            /* Rounds of: one library reps + 1 times, a pause, the other's,
             * a pause; the first to go alternates. A library's threads spin
             * for a while after a call (libgomp's briefly, OpenBLAS's about
             * 2^28 cycles) and would take a core from the other if their
             * runs alternated call by call: the pause after OpenBLAS is the
             * longer. */
            for (int round = 0; round < rounds; round++)
            for (int turn = 0; turn < 2; turn++) {
                int side = (round + turn) % 2;  /* 0 ours, 1 OpenBLAS */
                for (int r = 0; r < reps + 1; r++) {  /* the first run of each warms up */
                    double t0 = now(clock);
                    if (p == 0 && side == 0) gemm_split(split, R, OC, C, X, C, 1, W, 1, C, Y, OC, 0, NULL);
                    if (p == 0 && side == 1) blas_sgemm(&blas, NO_TRANS, TRANS, R, OC, C, X, C, W, C, 0, Y, OC);
                    if (p == 1 && side == 0) gemm_split(split, R, C, OC, Y, OC, 1, W, C, 1, dX, C, 1, NULL);
                    if (p == 1 && side == 1) blas_sgemm(&blas, NO_TRANS, NO_TRANS, R, C, OC, Y, OC, W, C, 1, dX, C);
                    if (p == 2 && side == 0) gemm_split(split, OC, C, R, Y, 1, OC, X, C, 1, dW, C, 1, NULL);
                    if (p == 2 && side == 1) blas_sgemm(&blas, TRANS, NO_TRANS, OC, C, R, Y, OC, X, C, 1, dW, C);
                    double t = now(clock) - t0;
                    if (r > 0 && t < best[side]) best[side] = t;
                }
                idle(side == 1 ? 0.3 : 0.05);
            }
            double flops = 2.0 * M * N * K;
            double times = l < 4 ? 12 : 1;  /* 12 layers, one head */
            t_ours += times * best[0];
            t_blas += times * best[1];
            flops_all += times * flops;
            printf("%-8s %-5s %6d %6d %6d %9.1f %9.1f %6.2f\n", lin[l].name, p == 0 ? "fwd" : p == 1 ? "dX" : "dW",
                   M, N, K, flops / best[0] / 1e9, flops / best[1] / 1e9, best[1] / best[0]);
            fflush(stdout);
        }
        free(X); free(W); free(Y); free(dX); free(dW);
    }
    printf("%-8s %-5s %6s %6s %6s %9.1f %9.1f %6.2f\n", "step", "", "", "", "", flops_all / t_ours / 1e9,
           flops_all / t_blas / 1e9, t_blas / t_ours);
    return 0;
}
