/* bench/bench_comm.c (make bench-comm): all-reduce bus bandwidth of the
 * shared-memory backend, 1 KB to 256 MB, beside the host's memcpy bandwidth.
 *
 *   bench_comm [--ranks N] [--max-mb M]     N ranks (default 2), sizes up to M MB (256)
 *
 * Each size: two warm-up calls, then enough timed calls for about 0.3 s
 * (at least 5), each started right after a barrier; the table gives rank
 * 0's median. algbw = bytes / time; busbw = algbw * 2(n-1)/n, the nccl-tests
 * figure that can be compared across rank counts. The memcpy line is one
 * thread copying 256 MB (median of 5), measured by rank 0 while the others
 * wait: the staging copies of the shared-memory backend are memcpys, so it
 * is the ceiling to compare busbw with.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "comm.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double memcpy_gbps(size_t bytes) {
    char *src = malloc(bytes), *dst = malloc(bytes);
    double t[5];
    if (!src || !dst) return 0;
    memset(src, 1, bytes);
    memset(dst, 2, bytes);
    for (int i = 0; i < 5; i++) {
        double t0 = now_s();
        memcpy(dst, src, bytes);
        t[i] = now_s() - t0;
    }
    volatile char sink = dst[bytes / 2];
    (void)sink;
    free(src);
    free(dst);
    return bytes / median(t, 5) / 1e9;
}

int main(int argc, char **argv) {
    int ranks = 2;
    size_t max_bytes = (size_t)256 << 20;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ranks") && i + 1 < argc) ranks = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--max-mb") && i + 1 < argc) max_bytes = (size_t)atol(argv[++i]) << 20;
        else { fprintf(stderr, "usage: %s [--ranks N] [--max-mb M]\n", argv[0]); return 2; }
    }
    CommLaunch l;
    Comm c;
    char err[512];
    if (comm_launch(ranks, &l, err, sizeof err) || comm_init(&c, &l, COMM_SHM, NULL, err, sizeof err)) {
        fprintf(stderr, "bench_comm: %s\n", err);
        return 1;
    }
    CommGroup *w = &c.world;
    int G = c.world_size;
    double copy = 0;
    if (c.rank == 0) copy = memcpy_gbps((size_t)256 << 20);
    comm_barrier(w);
    float *buf = malloc(max_bytes);
    if (!buf) { fprintf(stderr, "bench_comm: out of memory for %zu bytes\n", max_bytes); return 1; }
    memset(buf, 0, max_bytes);
    if (c.rank == 0) {
        printf("bench_comm: all-reduce (sum, float32) over %d ranks, shared-memory backend, %ld cores\n", G,
               sysconf(_SC_NPROCESSORS_ONLN));
        printf("%12s %8s %12s %12s %12s\n", "bytes", "calls", "time (us)", "algbw GB/s", "busbw GB/s");
    }
    double *t = malloc(2000 * sizeof *t);
    for (size_t bytes = 1024; bytes <= max_bytes; bytes *= 4) {
        size_t n = bytes / sizeof(float);
        double t0 = now_s();
        for (int i = 0; i < 2; i++) comm_all_reduce(w, NULL, buf, n, COMM_F32, COMM_SUM);
        int32_t calls = (int32_t)(0.3 / ((now_s() - t0) / 2 + 1e-9));   /* rank 0 decides for all */
        calls = calls < 5 ? 5 : calls > 2000 ? 2000 : calls;
        comm_broadcast(w, NULL, &calls, 1, COMM_I32, 0);
        for (int i = 0; i < calls; i++) {
            comm_barrier(w);
            double s = now_s();
            comm_all_reduce(w, NULL, buf, n, COMM_F32, COMM_SUM);
            t[i] = now_s() - s;
        }
        if (c.rank == 0) {
            double m = median(t, calls), alg = bytes / m / 1e9;
            printf("%12zu %8d %12.1f %12.3f %12.3f\n", bytes, calls, m * 1e6, alg, alg * 2.0 * (G - 1) / G);
        }
    }
    if (c.rank == 0) printf("host memcpy, 1 thread, 256 MB: %.3f GB/s\n", copy);
    free(t);
    free(buf);
    comm_free(&c);
    return 0;
}
