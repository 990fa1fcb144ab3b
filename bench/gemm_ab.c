/* bench/gemm_ab.c: two builds of our CPU GEMM in one process, called in turn.
 *
 *   bench/gemm_ab [--pairs N] [--rows R] [--splits]   (built and run by bench/gemm_ab.sh)
 *
 * A is gemm() as linked in (gemm.c at some git revision, or built with other
 * flags), B is gemm_b(): the same source files compiled again with every
 * exported name given a _b (gemm_ab.sh does both). At GPT-2 124M's shapes
 * (the four linears and the head, forward, dX and dW at R rows, 256 by
 * default) each product runs 2N + 2 times, A and B in the order A B B A A B
 * ..., the first two of each warming up; the best time of each counts (and,
 * after "mean", the ratio of the mean times: what a step pays when one
 * thread is slowed, which the best call hides). On a
 * shared VM whose speed moves by 10-20% from minute to minute (the 2-core
 * machines of this project), two runs of bench_gemm minutes apart cannot tell
 * a 3% change from the noise, while calls a few milliseconds apart share the
 * machine's state: an A against A run (gemm_ab.sh HEAD with a clean tree)
 * gave 0.95-1.08 shape by shape and 1.01 over the step on the Zen 3.
 *
 * --splits: A and B are both the second build, C split between the threads
 * by rows (A) and by columns (B) (gemm_split), whatever gemm() would choose.
 *
 * Prints a line a product (A's GFLOP/s, B's, B over A) and a step line: the
 * flops of a training step's matmuls (each block linear 12 times, the head
 * once) over their summed best times. Threads: OMP_NUM_THREADS.
 */
#include <getopt.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include "gemm.h"

typedef void Gemm(int M, int N, int K, const float *A, size_t a_rs, size_t a_cs, const float *B,
                  size_t b_rs, size_t b_cs, float *C, size_t ldc, int accumulate, const float *bias);
Gemm gemm_b;  /* B: the second build (gemm_ab.sh renames its symbols) */
void gemm_b_split(GemmSplit split, int M, int N, int K, const float *A, size_t a_rs, size_t a_cs,
                  const float *B, size_t b_rs, size_t b_cs, float *C, size_t ldc, int accumulate,
                  const float *bias);

/* --splits: the second build, by rows and by columns */
static void by_rows(int M, int N, int K, const float *A, size_t a_rs, size_t a_cs, const float *B,
                    size_t b_rs, size_t b_cs, float *C, size_t ldc, int accumulate, const float *bias) {
    gemm_b_split(GEMM_SPLIT_ROWS, M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, ldc, accumulate, bias);
}
static void by_cols(int M, int N, int K, const float *A, size_t a_rs, size_t a_cs, const float *B,
                    size_t b_rs, size_t b_cs, float *C, size_t ldc, int accumulate, const float *bias) {
    gemm_b_split(GEMM_SPLIT_COLS, M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, ldc, accumulate, bias);
}

/* On a 64-byte line, as train's host buffers are (tensor.c) */
static float *filled(size_t n) {
    float *p = NULL;
    if (posix_memalign((void **)&p, 64, n * sizeof(float))) { fprintf(stderr, "gemm_ab: out of memory\n"); exit(2); }
    for (size_t i = 0; i < n; i++) p[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    return p;
}

int main(int argc, char **argv) {
    int pairs = 10, R = 256, splits = 0;
    static const struct option longopts[] = {{"pairs", required_argument, NULL, 'p'},
                                              {"rows", required_argument, NULL, 'r'},
                                              {"splits", no_argument, NULL, 's'},
                                              {NULL, 0, NULL, 0}};
    int ch;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, ":", longopts, NULL)) != -1) {
        char *end = NULL;
        long v = optarg ? strtol(optarg, &end, 10) : 0;
        if ((ch == 'p' || ch == 'r') && (*end || end == optarg || v < 1 || v > 100000)) {
            fprintf(stderr, "gemm_ab: --%s %s: expected a count >= 1\n", ch == 'p' ? "pairs" : "rows", optarg);
            return 2;
        }
        if (ch == 'p') pairs = (int)v;
        else if (ch == 'r') R = (int)v;
        else if (ch == 's') splits = 1;
        else {
            fprintf(stderr, "gemm_ab: bad flag %s\nusage: gemm_ab [--pairs N] [--rows R] [--splits]\n",
                    argv[optind - 1]);
            return 2;
        }
    }
    printf("gemm_ab: %s, %d threads, %d pairs, kernel %s\n",
           splits ? "A the second build by rows, B by columns" : "A gemm(), B gemm_b()", omp_get_max_threads(),
           pairs, gemm_kernel_name());
    struct { const char *name; int C, OC; } lin[] = {
        {"qkv", 768, 2304}, {"attproj", 768, 768}, {"fc", 768, 3072}, {"fcproj", 3072, 768}, {"head", 768, 50304},
    };
    Gemm *g[2] = {splits ? by_rows : gemm, splits ? by_cols : gemm_b};
    double T[2] = {0, 0}, Tm[2] = {0, 0}, F = 0;  /* best and mean times, weighted as a step */
    for (int l = 0; l < 5; l++) {
        int C = lin[l].C, OC = lin[l].OC;
        float *X = filled((size_t)R * C), *W = filled((size_t)OC * C), *Y = filled((size_t)R * OC);  /* [R,C] [OC,C] [R,OC] */
        float *dX = filled((size_t)R * C), *dW = filled((size_t)OC * C);                            /* [R,C] [OC,C] */
        for (int p = 0; p < 3; p++) {
            int M = p == 2 ? OC : R, N = p == 0 ? OC : C, K = p == 0 ? C : p == 1 ? OC : R;
            int n = l == 4 ? pairs / 2 + 2 : pairs;  /* the head's products are 20 times a layer's */
            double best[2] = {1e30, 1e30}, sum[2] = {0, 0};
            for (int r = 0; r < 2 * n + 2; r++) {
                int s = (r & 1) ^ ((r >> 1) & 1);  /* A B B A A B B A ... */
                double t = omp_get_wtime();
                if (p == 0) g[s](R, OC, C, X, C, 1, W, 1, C, Y, OC, 0, NULL);   /* Y = X W^T */
                if (p == 1) g[s](R, C, OC, Y, OC, 1, W, C, 1, dX, C, 1, NULL);  /* dX += dY W */
                if (p == 2) g[s](OC, C, R, Y, 1, OC, X, C, 1, dW, C, 1, NULL);  /* dW += dY^T X */
                t = omp_get_wtime() - t;
                if (r >= 2 && t < best[s]) best[s] = t;
                if (r >= 2) sum[s] += t;
            }
            double f = 2.0 * M * N * K, times = l < 4 ? 12 : 1;
            T[0] += times * best[0];
            T[1] += times * best[1];
            Tm[0] += times * sum[0] / n;
            Tm[1] += times * sum[1] / n;
            F += times * f;
            printf("%-8s %-4s A %7.1f  B %7.1f  B/A %.3f  mean %.3f\n", lin[l].name,
                   p == 0 ? "fwd" : p == 1 ? "dX" : "dW", f / best[0] / 1e9, f / best[1] / 1e9, best[0] / best[1],
                   sum[0] / sum[1]);
            fflush(stdout);
        }
        free(X); free(W); free(Y); free(dX); free(dW);
    }
    printf("%-13s A %7.1f  B %7.1f  B/A %.3f  mean %.3f\n", "step", F / T[0] / 1e9, F / T[1] / 1e9, T[0] / T[1],
           Tm[0] / Tm[1]);
    return 0;
}
