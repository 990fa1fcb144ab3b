/* test/train_run.h: running ./train from a test and reading what it left.
 *
 * The equivalence tests (test_dp, test_tp, test_3d) all do the same two
 * things: run a command line, keep everything it printed and the loss of
 * each "step S/N" line; and read the parameters of a saved llm.c model file.
 */
#ifndef TRAIN_RUN_H
#define TRAIN_RUN_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TRAIN_MAX_STEPS 64

typedef struct TrainRun {
    int rc;                          /* exit status from pclose (0 = success) */
    int nsteps;                      /* step lines seen */
    double loss[TRAIN_MAX_STEPS];    /* their losses */
    char *out;                       /* everything printed, stdout and stderr */
} TrainRun;

/* Runs cmd (a shell command line; add "2>&1" to keep stderr) to the end. */
static inline void train_run(TrainRun *r, const char *cmd) {
    memset(r, 0, sizeof *r);
    FILE *p = popen(cmd, "r");
    size_t cap = 1 << 16, len = 0;
    r->out = malloc(cap);
    r->out[0] = 0;
    char line[1024];
    while (p && fgets(line, sizeof line, p)) {
        size_t n = strlen(line);
        if (len + n + 1 > cap) r->out = realloc(r->out, cap *= 2);
        memcpy(r->out + len, line, n + 1);
        len += n;
        const char *l = strstr(line, "| loss ");
        if (!strncmp(line, "step ", 5) && l && r->nsteps < TRAIN_MAX_STEPS)
            r->loss[r->nsteps++] = atof(l + 7);
    }
    r->rc = p ? pclose(p) : -1;
}

static inline void train_run_free(TrainRun *r) {
    free(r->out);
    r->out = NULL;
}

/* The n parameters of an llm.c model file (after its 1024-byte header),
 * or NULL when the file is missing or short. The caller frees. */
static inline float *train_load_params(const char *path, size_t n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    float *p = malloc(n * sizeof(float) + 1);
    int ok = fseek(f, 1024, SEEK_SET) == 0 && fread(p, 4, n, f) == n;
    fclose(f);
    if (!ok) { free(p); return NULL; }
    return p;
}

/* Bytes of row (kind, group) of a --comm-stats table in out: the row that
 * follows `prefix` ("\n  " for rank 0's, "[rank r]   " for rank r's);
 * 0 when there is none. */
static inline double train_comm_bytes(const char *out, const char *prefix, const char *kind,
                                      const char *group) {
    const char *p = out;
    while ((p = strstr(p, prefix))) {
        p += strlen(prefix);
        char k[32], g[32];
        unsigned long long calls, bytes;
        if (sscanf(p, "%31s %31s %llu %llu", k, g, &calls, &bytes) == 4 && !strcmp(k, kind) &&
            !strcmp(g, group))
            return (double)bytes;
    }
    return 0;
}

#endif
