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

#endif
