/* fuzz/fuzz_manifest.c: a sharded checkpoint's manifest and its shard
 * reader (checkpoint.c's checkpoint_open). The input is a manifest up to
 * its "end" line followed by the shard files, each starting at its
 * "TRAINSHD" magic: they are written into a scratch checkpoint directory
 * (DIR/latest naming step-<N>, N from the input's "step" line;
 * DIR/step-<N>/manifest.txt, shard-00000.bin, ...) and opened, which
 * parses the manifest, checks it against the model and the shards, and
 * reads every block of every shard. Seed: fuzz/seeds.sh's tiny checkpoints
 * saved by train. */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "checkpoint.h"

#define MAX_SHARDS 8

/* Removes every file of dir/name and the directory. */
static void clear_step(const char *dir, const char *name) {
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    DIR *d = opendir(p);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        char f[4500];
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(f, sizeof f, "%s/%s", p, e->d_name);
        unlink(f);
    }
    closedir(d);
    rmdir(p);
}

static void put(const char *path, const uint8_t *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    if (n) fwrite(data, 1, n, f);
    fclose(f);
}

static const uint8_t *find(const uint8_t *a, size_t n, const char *s) {
    return memmem(a, n, s, strlen(s));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static char dir[64];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/fuzz_manifest.XXXXXX");
        if (!mkdtemp(dir)) abort();
    }
    /* the step directory's name: from the "step N" line, so that the manifest can match it */
    long step = 0;
    const uint8_t *sl = find(data, size, "\nstep ");
    if (sl) {
        char num[24] = "";
        size_t k = 0;
        for (sl += 6; k < sizeof num - 1 && sl < data + size && *sl >= '0' && *sl <= '9'; sl++) num[k++] = (char)*sl;
        step = strtol(num, NULL, 10);
    }
    char name[64], p[4200];
    snprintf(name, sizeof name, "step-%ld", step);
    snprintf(p, sizeof p, "%s/%s", dir, name);
    mkdir(p, 0700);
    const uint8_t *end = find(data, size, "\nend\n");
    size_t mlen = end ? (size_t)(end - data) + 5 : size;
    snprintf(p, sizeof p, "%s/%s/manifest.txt", dir, name);
    put(p, data, mlen);
    const uint8_t *at = data + mlen, *stop = data + size;
    for (int s = 0; s < MAX_SHARDS && at < stop; s++) {   /* each shard from its magic to the next */
        const uint8_t *next = at + 8 <= stop ? find(at + 8, (size_t)(stop - at - 8), "TRAINSHD") : NULL;
        size_t n = next ? (size_t)(next - at) : (size_t)(stop - at);
        snprintf(p, sizeof p, "%s/%s/shard-%05d.bin", dir, name, s);
        put(p, at, n);
        at += n;
    }
    snprintf(p, sizeof p, "%s/latest", dir);
    FILE *f = fopen(p, "w");
    if (f) { fprintf(f, "%s\n", name); fclose(f); }
    Checkpoint ck;
    char err[512];
    if (checkpoint_open(dir, &ck, err, sizeof err) == 0) checkpoint_free(&ck);
    clear_step(dir, name);
    return 0;
}
