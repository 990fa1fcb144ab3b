/* bench/bench_data.c: the data loader's memory and speed (make bench-data).
 *
 *   bench_data make DIR N TOKENS       writes N token files DIR/shard_%06d.bin of TOKENS random ids
 *   bench_data read SPEC T G [shuffle] reads every sequence of SPEC once through data_batch, G
 *                                      sequences of T a call (one rank taking the whole batch), and
 *                                      prints tokens a second, then this process's RSS and PSS
 *                                      (/proc/self/smaps_rollup) and peak RSS (VmHWM)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "data.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* A "Key: N kB" line of a /proc file, in MB (-1 when absent). */
static double proc_mb(const char *file, const char *key) {
    FILE *f = fopen(file, "r");
    char line[256];
    double mb = -1;
    size_t n = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, n) && line[n] == ':') mb = strtod(line + n + 1, NULL) / 1024.0;
    if (f) fclose(f);
    return mb;
}

static int make_shards(const char *dir, int n, long tokens) {
    uint16_t *t = malloc((size_t)tokens * 2);
    unsigned long long s = 88172645463325252ULL;
    for (int k = 0; k < n; k++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/shard_%06d.bin", dir, k);
        for (long i = 0; i < tokens; i++) {
            s ^= s << 13; s ^= s >> 7; s ^= s << 17;
            t[i] = (uint16_t)(s % 50257);
        }
        int32_t h[256] = {20240520, 1, (int32_t)tokens};
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(h, 4, 256, f) != 256 || fwrite(t, 2, (size_t)tokens, f) != (size_t)tokens || fclose(f)) {
            perror(path);
            return 1;
        }
    }
    free(t);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 5 && !strcmp(argv[1], "make")) return make_shards(argv[2], atoi(argv[3]), atol(argv[4]));
    if (argc < 5 || strcmp(argv[1], "read")) {
        fprintf(stderr, "usage: bench_data make DIR N TOKENS | bench_data read SPEC T G [shuffle]\n");
        return 2;
    }
    const char *spec = argv[2];
    int T = atoi(argv[3]), G = atoi(argv[4]), shuffle = argc > 5;
    char err[512];
    DataSet ds;
    double t0 = now();
    if (data_load(&ds, spec, err, sizeof err) != 0 || data_prepare(&ds, spec, T, shuffle, 1337, err, sizeof err) != 0 ||
        data_check_vocab(&ds, 50257, err, sizeof err) != 0) {
        fprintf(stderr, "bench_data: %s\n", err);
        return 2;
    }
    double t1 = now();
    int *in = malloc(sizeof(int) * G * T), *tg = malloc(sizeof(int) * G * T);
    long steps = (long)(ds.n_seqs / G);
    long long sum = 0;
    for (long s = 0; s < steps; s++) {
        if (data_batch(&ds, s, G, 0, G, in, tg, err, sizeof err) != 0) {
            fprintf(stderr, "bench_data: %s\n", err);
            return 2;
        }
        sum += in[0] + tg[G * T - 1];   /* keeps the copies */
    }
    double t2 = now(), tok = (double)steps * G * T;
    printf("%d shard%s of %zu tokens%s: load %.3f s (ids %s), read %.0f tokens in %.3f s = %.1fM tokens/s "
           "(%.0fx the 1.2M tokens/s of one H100 at 100%% MFU for 124M); RSS %.1f MB, PSS %.1f MB, peak RSS %.1f MB, "
           "%d mapped at the end [%lld]\n",
           ds.n_shards, ds.n_shards > 1 ? "s" : "", ds.shards[0].n_tokens, shuffle ? ", --shuffle" : "", t1 - t0,
           ds.scanned ? "scanned at load" : "checked per sequence", tok, t2 - t1, tok / (t2 - t1) / 1e6,
           tok / (t2 - t1) / 1.2e6, proc_mb("/proc/self/smaps_rollup", "Rss"),
           proc_mb("/proc/self/smaps_rollup", "Pss"), proc_mb("/proc/self/status", "VmHWM"), ds.n_mapped, sum % 10);
    free(in);
    free(tg);
    data_free(&ds);
    return 0;
}
