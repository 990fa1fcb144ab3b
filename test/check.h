/* test/check.h: the one convention every test follows.
 *
 * Each check prints one line, "PASS name: detail" or "FAIL name: detail",
 * or "SKIP name: why" when it cannot run here (no GPU, say). test/run.sh
 * counts the lines of every test program and script; a program that exits
 * non-zero without printing a FAIL counts as one failure. Details carry the
 * figure measured (an error, a count), so the log says what was checked.
 */
#ifndef CHECK_H
#define CHECK_H

#include <stdio.h>
#include <stdarg.h>
#include <stdlib.h>

typedef struct Checks { int passed, failed, skipped; } Checks;

/* Records one check: ok decides PASS or FAIL; the rest is a printf detail. */
static inline int check(Checks *c, int ok, const char *name, const char *fmt, ...) {
    va_list ap;
    printf("%s %s: ", ok ? "PASS" : "FAIL", name);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    if (ok) c->passed++; else c->failed++;
    return ok;
}

static inline void check_skip(Checks *c, const char *name, const char *why) {
    printf("SKIP %s: %s\n", name, why);
    fflush(stdout);
    c->skipped++;
}

/* Exit status of a test program: 0 when nothing failed. */
static inline int check_done(const Checks *c) {
    return c->failed ? 1 : 0;
}

/* Uniform in [-1, 1), from an xorshift64* state: the GPU tests' random inputs. */
static inline float check_urand(unsigned long long *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return (float)((double)((*s * 2685821657736338717ULL) >> 40) / 8388608.0 - 1.0);
}

/* malloc that never returns NULL: a test out of host memory stops, saying so. */
static inline void *check_xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "out of host memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

#endif
