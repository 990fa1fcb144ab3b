/* trace.c: per-rank span recording and the merge into one Chrome trace.
 *
 * The format and the protocol (a part file per rank, merged by rank 0) are
 * described in trace.h. Design choices:
 *  - A span is written when it ends, as one complete event ("ph":"X", a
 *    start and a duration), not as a begin/end pair: half the lines, and a
 *    rank that dies mid-span leaves no unmatched "B" event behind.
 *  - Times come from CLOCK_REALTIME, taken in integer nanoseconds and
 *    printed as microseconds with three decimals by integer arithmetic: a
 *    double holds today's 1.7e15 microseconds only to a quarter of one.
 *  - The open spans are a fixed stack of 16 in the Trace: no allocation
 *    between trace_open and trace_close.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "trace.h"
#include "safe.h"

#define TRACE_DEPTH 16
#define TRACE_NAME 64

typedef struct TraceSpan {
    char name[TRACE_NAME];
    char cat[TRACE_NAME];
    int64_t start_ns;
} TraceSpan;

struct Trace {
    FILE *f;                        /* <path>.<rank>.part */
    int rank;
    int depth;                      /* spans opened and not ended, recorded or not */
    TraceSpan open[TRACE_DEPTH];    /* the recorded ones: open[0 .. min(depth, 16) - 1] */
};

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* <path>.<rank>.part, malloc'd (NULL when memory runs out). */
static char *part_path(const char *path, int rank) {
    size_t n = strlen(path) + 24;
    char *out = malloc(n);
    if (out) snprintf(out, n, "%s.%d.part", path, rank);
    return out;
}

/* s as a JSON string body: quote, backslash and control bytes escaped. */
static void put_json_string(FILE *f, const char *s) {
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
}

/* Nanoseconds as microseconds with three decimals, exactly. */
static void put_us(FILE *f, int64_t ns) {
    fprintf(f, "%lld.%03d", (long long)(ns / 1000), (int)(ns % 1000));
}

static void put_meta(FILE *f, const char *what, int rank, int tid, const char *value) {
    fprintf(f, "{\"name\":\"%s\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"", what,
            rank, tid);
    put_json_string(f, value);
    fprintf(f, "\"}}\n");
}

Trace *trace_open(const char *path, int rank, int world) {
    if (!path || !*path) return NULL;
    char *name = part_path(path, rank);
    Trace *t = name ? calloc(1, sizeof *t) : NULL;
    if (!t) { free(name); return NULL; }
    t->f = fopen(name, "w");
    if (!t->f) {
        fprintf(stderr, "trace: cannot create %s: %s\n", name, strerror(errno));
        free(name);
        free(t);
        return NULL;
    }
    free(name);
    setvbuf(t->f, NULL, _IOFBF, 1 << 20);
    t->rank = rank;
    char label[32];
    snprintf(label, sizeof label, "rank %d", rank);
    put_meta(t->f, "process_name", rank, 0, label);
    fprintf(t->f, "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
                  "\"args\":{\"sort_index\":%d}}\n", rank, rank);
    put_meta(t->f, "thread_name", rank, 0, "compute");
    put_meta(t->f, "thread_name", rank, 1, "comm");
    (void)world;   /* the merge needs it, the part does not */
    return t;
}

void trace_begin(Trace *t, const char *name, const char *cat) {
    if (!t) return;
    if (t->depth < TRACE_DEPTH) {
        TraceSpan *sp = &t->open[t->depth];
        snprintf(sp->name, sizeof sp->name, "%s", name ? name : "");
        snprintf(sp->cat, sizeof sp->cat, "%s", cat ? cat : "");
        sp->start_ns = now_ns();
    }
    t->depth++;
}

void trace_end(Trace *t) {
    if (!t || t->depth == 0) return;
    int64_t end = now_ns();
    t->depth--;
    if (t->depth >= TRACE_DEPTH) return;   /* opened too deep: not recorded */
    const TraceSpan *sp = &t->open[t->depth];
    fprintf(t->f, "{\"name\":\"");
    put_json_string(t->f, sp->name);
    fprintf(t->f, "\",\"cat\":\"");
    put_json_string(t->f, sp->cat);
    fprintf(t->f, "\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":", t->rank,
            strcmp(sp->cat, "comm") == 0 ? 1 : 0);
    put_us(t->f, sp->start_ns);
    fprintf(t->f, ",\"dur\":");
    put_us(t->f, end - sp->start_ns);
    fprintf(t->f, "}\n");
}

void trace_close(Trace *t) {
    if (!t) return;
    while (t->depth > 0) trace_end(t);
    if (fclose(t->f) != 0) fprintf(stderr, "trace: writing rank %d's part: %s\n", t->rank,
                                   strerror(errno));
    free(t);
}

/* Appends the whole lines of part file `part` to out, each after a ",\n"
 * when one came before (*first tells). Returns the lines copied, -1 if
 * part cannot be opened. */
static int copy_part(FILE *out, const char *part, int *first) {
    FILE *in = fopen(part, "r");
    if (!in) return -1;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int n = 0;
    while ((len = getline(&line, &cap, in)) > 0) {
        if (line[len - 1] != '\n') break;                 /* torn: its rank died writing it */
        line[--len] = '\0';
        if (len < 2 || line[0] != '{' || line[len - 1] != '}') continue;
        fprintf(out, "%s%s", *first ? "" : ",\n", line);
        *first = 0;
        n++;
    }
    free(line);
    fclose(in);
    return n;
}

int trace_merge(const char *path, int world) {
    if (!path || !*path) return -1;
    SafeOut o;
    char err[512];
    if (safe_out_open(&o, path, err, sizeof err) != 0) {
        fprintf(stderr, "trace: %s\n", err);
        return -1;
    }
    FILE *out = o.f;
    fprintf(out, "{\"traceEvents\":[\n");
    int first = 1, events = 0, missing = 0;
    for (int r = 0; r < world; r++) {
        char *part = part_path(path, r);
        int n = part ? copy_part(out, part, &first) : -1;
        if (n < 0) {
            fprintf(stderr, "trace: rank %d's part %s is missing: %s\n", r, part ? part : path, strerror(errno));
            missing++;
        } else {
            events += n;
        }
        free(part);
    }
    fprintf(out, "\n]}\n");
    if (safe_out_commit(&o, err, sizeof err) != 0) {
        fprintf(stderr, "trace: %s\n", err);
        return -1;
    }
    for (int r = 0; r < world; r++) {
        char *part = part_path(path, r);
        if (part) remove(part);
        free(part);
    }
    return missing ? -1 : events;
}
