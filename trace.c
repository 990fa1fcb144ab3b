/* trace.c: per-rank span recording, the merge into one Chrome trace, and
 * the merged trace drawn as an SVG timeline.
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
 *  - The SVG timeline (trace.h) is drawn from the lines the merge copies,
 *    parsed back (our own writer's lines: keys found by name, times kept
 *    as exact nanoseconds, so data-ts and data-dur print as in the JSON).
 *    It is the measured counterpart of plot.c's --show-schedule figure
 *    (3.2 流水线并行), drawn with plot.h's SVG helpers: the same micro-batch
 *    hues, but a box is as wide as the
 *    span took, and the bubble is the blank between boxes. Depth, not
 *    "outermost only": a span is drawn inset over the one around it, so a
 *    "step" span wrapping F and B boxes hides neither.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "trace.h"
#include "plot.h"
#include "pp_sched.h"
#include "safe.h"

#define TRACE_DEPTH 16
#define TRACE_NAME 64

typedef struct TraceSpan {
    char name[TRACE_NAME];
    char cat[TRACE_NAME];
    int64_t start_ns;
} TraceSpan;

struct Trace {
    FILE *f;                        /* <path>.<rank>.part; NULL after a failed write */
    char *part;                     /* its name */
    int rank;
    int failed;                     /* a write failed (said once; nothing more is written) */
    int depth;                      /* spans opened and not ended, recorded or not */
    TraceSpan open[TRACE_DEPTH];    /* the recorded ones: open[0 .. min(depth, 16) - 1] */
};

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

double trace_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
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
        fprintf(stderr, "train: rank %d: --trace: cannot create %s (%s): the run goes on without it and will exit 1\n",
                rank, name, strerror(errno));
        free(name);
        free(t);
        return NULL;
    }
    t->part = name;
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

/* A write of the part failed (e: its errno): said once, and the part is closed. */
static void trace_failed(Trace *t, int e) {
    fprintf(stderr, "train: rank %d: --trace: writing %s failed (%s): the run goes on without it and will exit 1\n",
            t->rank, t->part, strerror(e ? e : EIO));
    if (t->f) fclose(t->f);
    t->f = NULL;
    t->failed = 1;
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
    if (t->depth >= TRACE_DEPTH || !t->f) return;   /* opened too deep, or the part failed: not recorded */
    const TraceSpan *sp = &t->open[t->depth];
    errno = 0;
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
    if (ferror(t->f)) trace_failed(t, errno);   /* the buffer's write, when it fills, failed */
}

int trace_close(Trace *t) {
    if (!t) return 0;
    while (t->depth > 0) trace_end(t);
    errno = 0;
    if (t->f && fclose(t->f) != 0) {
        t->f = NULL;
        trace_failed(t, errno);
    }
    int rc = t->failed ? -1 : 0;
    free(t->part);
    free(t);
    return rc;
}


/* ---------------------------------------------------------------------------
 * The measured timeline (<path>.svg, trace.h): the merged complete events,
 * read back from the part lines as they are copied, drawn as the pipeline
 * figure of 3.2 with real widths. */

#define TRACE_SVG_MAX_BOXES 4000    /* the earliest spans drawn; the rest cut, and said so */
#define TRACE_SVG_MAX_ROWS 1024     /* ranks drawn */

typedef struct TraceBox {           /* one complete ("X") event */
    char name[TRACE_NAME];
    char cat[TRACE_NAME];
    int rank;                       /* pid */
    int lane;                       /* tid: 0 compute, 1 comm */
    int depth;                      /* spans of the same rank and lane around it */
    int64_t ts_ns, dur_ns;          /* as in the JSON, in nanoseconds */
} TraceBox;

typedef struct TraceBoxes {
    TraceBox *b;                    /* (n) */
    int n, cap;
    int oom;                        /* a box could not be kept: no drawing */
} TraceBoxes;

typedef struct TraceUse {           /* one rank's drawn spans */
    int64_t first_ns, last_ns;      /* its window: its first span's start to its last span's end */
    int64_t compute_ns;             /* covered by compute spans (lane 0, nested counted once) */
    int64_t comm_ns;                /* covered by comm spans */
    int spans;
} TraceUse;

/* Rank u's fraction of its window not covered by compute (1 without spans),
 * and covered by communication. */
static double use_idle(const TraceUse *u) {
    return u->last_ns > u->first_ns ? 1.0 - (double)u->compute_ns / (double)(u->last_ns - u->first_ns) : 1.0;
}
static double use_comm(const TraceUse *u) {
    return u->last_ns > u->first_ns ? (double)u->comm_ns / (double)(u->last_ns - u->first_ns) : 0.0;
}

/* The value after `"key":` in an event line, or NULL. Keys cannot match
 * inside a string value: every quote there is escaped. */
static const char *json_field(const char *line, const char *key) {
    char pat[32];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(line, pat);
    return p ? p + strlen(pat) : NULL;
}

static int hex_value(int c) {
    return isdigit(c) ? c - '0' : tolower(c) - 'a' + 10;
}

/* The JSON string opening at p into out (cut to len - 1 bytes; a \u
 * escape beyond ASCII becomes '?'). 0, or -1 if p holds no string. */
static int json_string(const char *p, char *out, size_t len) {
    if (!p || *p != '"') return -1;
    size_t n = 0;
    for (p++; *p && *p != '"'; p++) {
        int c = (unsigned char)*p;
        if (c == '\\') {
            c = (unsigned char)*++p;
            if (c == 'u') {
                unsigned v = 0;
                for (int i = 0; i < 4; i++) {
                    if (!isxdigit((unsigned char)p[1])) return -1;
                    v = v * 16 + hex_value((unsigned char)*++p);
                }
                c = v < 0x80 ? (int)v : '?';
            } else if (c == 'n' || c == 't' || c == 'r' || c == 'b' || c == 'f') {
                c = c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c == 'b' ? '\b' : '\f';
            } else if (c == '\0') {
                return -1;
            }
        }
        if (n + 1 < len) out[n++] = (char)c;
    }
    if (*p != '"') return -1;
    out[n] = '\0';
    return 0;
}

/* Microseconds "123.456" (decimals past the third ignored) as nanoseconds,
 * exactly. 0, or -1 if p holds no non-negative number that fits. */
static int json_us(const char *p, int64_t *ns) {
    if (!p || !isdigit((unsigned char)*p)) return -1;
    int64_t us = 0, frac = 0;
    for (; isdigit((unsigned char)*p); p++) {
        if (us > (INT64_MAX / 1000 - 9) / 10) return -1;
        us = us * 10 + (*p - '0');
    }
    int k = 0;
    if (*p == '.')
        for (p++; isdigit((unsigned char)*p); p++)
            if (k < 3) frac = frac * 10 + (*p - '0'), k++;
    for (; k < 3; k++) frac *= 10;
    *ns = us * 1000 + frac;
    return 0;
}

/* A part line as a box; 0, or -1 if it is not a complete event. */
static int parse_box(const char *line, TraceBox *b) {
    const char *ph = json_field(line, "ph"), *pid = json_field(line, "pid"), *tid = json_field(line, "tid");
    if (!ph || strncmp(ph, "\"X\"", 3) != 0 || !pid || !tid) return -1;
    if (json_string(json_field(line, "name"), b->name, sizeof b->name) != 0) return -1;
    if (json_string(json_field(line, "cat"), b->cat, sizeof b->cat) != 0) b->cat[0] = '\0';
    if (json_us(json_field(line, "ts"), &b->ts_ns) != 0 || json_us(json_field(line, "dur"), &b->dur_ns) != 0)
        return -1;
    b->rank = atoi(pid);
    b->lane = atoi(tid) == 1 ? 1 : 0;
    b->depth = 0;
    return 0;
}

static void boxes_add(TraceBoxes *bx, const char *line) {
    TraceBox b;
    if (!bx || bx->oom || parse_box(line, &b) != 0) return;
    if (bx->n == bx->cap) {
        int cap = bx->cap ? 2 * bx->cap : 1024;
        TraceBox *nb = cap > bx->cap ? realloc(bx->b, (size_t)cap * sizeof *nb) : NULL;
        if (!nb) { bx->oom = 1; return; }
        bx->b = nb;
        bx->cap = cap;
    }
    bx->b[bx->n++] = b;
}

/* A micro-batch span's name: F3, B3, W3, or with a model chunk F3c1.
 * Returns the kind letter (0 for any other name) and fills *micro, *chunk
 * (-1 without one). */
static char span_kind(const char *name, int *micro, int *chunk) {
    char k = name[0];
    if ((k != 'F' && k != 'B' && k != 'W') || !isdigit((unsigned char)name[1])) return 0;
    char *end;
    long m = strtol(name + 1, &end, 10), c = -1;
    if (*end == 'c' && isdigit((unsigned char)end[1])) c = strtol(end + 1, &end, 10);
    if (*end || m > 1000000 || c > 1000000) return 0;
    *micro = (int)m;
    *chunk = (int)c;
    return k;
}

/* Micro-batch m's colour for a span of kind 'F', 'B' or 'W': plot.c's, so
 * the measured figure and the schedule's colour micro-batches alike. */
static void micro_colour(int m, int M, char kind, char *buf, size_t len) {
    plot_micro_colour(m, M, kind == 'B' ? PP_BACKWARD : kind == 'W' ? PP_WEIGHT : PP_FORWARD, buf, len);
}

static int64_t box_end(const TraceBox *b) { return b->ts_ns + b->dur_ns; }

static int cmp_i64(int64_t a, int64_t b) { return a < b ? -1 : a > b; }

/* Earlier first; at the same start the longer (an enclosing span) first. */
static int by_start(const void *pa, const void *pb) {
    const TraceBox *a = pa, *b = pb;
    int c = cmp_i64(a->ts_ns, b->ts_ns);
    return c ? c : -cmp_i64(a->dur_ns, b->dur_ns);
}

static int by_lane(const void *pa, const void *pb) {
    const TraceBox *a = pa, *b = pb;
    if (a->rank != b->rank) return a->rank < b->rank ? -1 : 1;
    if (a->lane != b->lane) return a->lane < b->lane ? -1 : 1;
    return by_start(pa, pb);
}

/* Gives each box its depth (the spans of its rank and lane still open when
 * it starts) and sums each rank's covered time per lane, a nested span
 * counted once. b is sorted by_lane; use has `rows` entries. */
static void boxes_nest(TraceBox *b, int n, TraceUse *use, int rows) {
    int64_t open[64];   /* the ends of the enclosing spans, innermost last */
    int depth = 0;
    int64_t covered_to = 0;
    for (int i = 0; i < n; i++) {
        if (i == 0 || b[i].rank != b[i - 1].rank || b[i].lane != b[i - 1].lane) depth = 0, covered_to = 0;
        while (depth > 0 && open[depth - 1] <= b[i].ts_ns) depth--;
        b[i].depth = depth;
        if (depth < 64) open[depth++] = box_end(&b[i]);
        int64_t from = b[i].ts_ns > covered_to ? b[i].ts_ns : covered_to;
        int64_t add = box_end(&b[i]) > from ? box_end(&b[i]) - from : 0;
        if (box_end(&b[i]) > covered_to) covered_to = box_end(&b[i]);
        if (b[i].rank < 0 || b[i].rank >= rows) continue;
        TraceUse *u = &use[b[i].rank];
        if (u->spans == 0 || b[i].ts_ns < u->first_ns) u->first_ns = b[i].ts_ns;
        if (u->spans == 0 || box_end(&b[i]) > u->last_ns) u->last_ns = box_end(&b[i]);
        if (b[i].lane == 0) u->compute_ns += add;
        else u->comm_ns += add;
        u->spans++;
    }
}

/* The picture's frame, in SVG user units: a row a rank, its compute lane
 * over a thinner comm lane. */
enum {
    SVG_W = 1280, SVG_LEFT = 160, SVG_RIGHT = 30, SVG_TOP = 92,
    LANE_H = 26, COMM_H = 10, LANE_GAP = 2, ROW_GAP = 16, ROW_H = LANE_H + LANE_GAP + COMM_H + ROW_GAP
};

typedef struct TraceFrame {
    int64_t t0, t1;     /* the drawn window: the first drawn span's start to the last end */
    int rows;           /* ranks drawn */
    int M;              /* micro-batches seen (colours) */
    int has_w;          /* a W span was seen (the legend's third tone) */
    int chunks;         /* a span of a chunk past 0 was seen (the legend's hatching) */
} TraceFrame;

static double frame_x(const TraceFrame *fr, int64_t ns) {
    return SVG_LEFT + (double)(ns - fr->t0) / (double)(fr->t1 - fr->t0) * (SVG_W - SVG_LEFT - SVG_RIGHT);
}

static double frame_ms(const TraceFrame *fr, int64_t ns) { return (double)(ns - fr->t0) / 1e6; }

static const char *comm_colour(const char *name) {
    return !strcmp(name, "send") ? "#7b61a8" : !strcmp(name, "recv") ? "#e08a2c" : "#8a8a8a";
}

static void draw_title(FILE *f, const char *json, const TraceFrame *fr, const TraceUse *use, int spans,
                       int drawn) {
    fprintf(f, "<text x=\"%d\" y=\"26\" font-size=\"15\">measured timeline of ", SVG_LEFT);
    plot_xml_text(f, json);
    fprintf(f, ": %d ranks, %.3f ms, %d spans</text>\n", fr->rows, frame_ms(fr, fr->t1), spans);
    fprintf(f, "<text x=\"%d\" y=\"46\" class=\"idle\">idle (time from a rank's first span to its "
            "last not covered by a compute span):", SVG_LEFT);
    double sum = 0, lo = 2, hi = -1;
    int rlo = 0, rhi = 0;
    for (int r = 0; r < fr->rows; r++) {
        double idle = use_idle(&use[r]);
        sum += idle;
        if (idle < lo) lo = idle, rlo = r;
        if (idle > hi) hi = idle, rhi = r;
        if (fr->rows <= 8) fprintf(f, "%s rank %d %.1f%%", r ? "," : "", r, 100 * idle);
    }
    if (fr->rows > 8)
        fprintf(f, " mean %.1f%%, least %.1f%% (rank %d), most %.1f%% (rank %d)", 100 * sum / fr->rows,
                100 * lo, rlo, 100 * hi, rhi);
    fprintf(f, "</text>\n");
    if (drawn < spans)
        fprintf(f, "<text x=\"%d\" y=\"66\" fill=\"#b00\" class=\"cut\">large trace: only the first %d of %d "
                "spans are drawn (the first %.3f ms); the JSON holds them all</text>\n", SVG_LEFT, drawn, spans,
                frame_ms(fr, fr->t1));
}

/* The ms ruler under the rows, with faint lines up through them. */
static void draw_axis(FILE *f, const TraceFrame *fr) {
    int y = SVG_TOP + fr->rows * ROW_H - ROW_GAP + 6;
    double span = frame_ms(fr, fr->t1), d = plot_nice_step(span, 10);
    fprintf(f, "<g class=\"axis\" font-size=\"11\" text-anchor=\"middle\">\n");
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#444\"/>\n", SVG_LEFT, y, SVG_W - SVG_RIGHT, y);
    for (double v = 0; v <= span * (1 + 1e-9); v += d) {
        double x = frame_x(fr, fr->t0 + (int64_t)llround(v * 1e6));
        fprintf(f, "<line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\" stroke=\"#eee\"/>", x, SVG_TOP - 6, x, y);
        fprintf(f, "<line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\" stroke=\"#444\"/>", x, y, x, y + 5);
        fprintf(f, "<text x=\"%.2f\" y=\"%d\">%g</text>\n", x, y + 18, v);
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%d\">ms since the first span</text>\n</g>\n",
            (SVG_LEFT + SVG_W - SVG_RIGHT) / 2.0, y + 36);
}

static void draw_rows(FILE *f, const TraceFrame *fr, const TraceUse *use) {
    for (int r = 0; r < fr->rows; r++) {
        int y = SVG_TOP + r * ROW_H, yc = y + LANE_H + LANE_GAP;
        double idle = use_idle(&use[r]), comm = use_comm(&use[r]);
        fprintf(f, "<g class=\"rank\" data-rank=\"%d\" data-idle=\"%.6f\" data-comm=\"%.6f\" data-spans=\"%d\" "
                "data-window=\"", r, idle, comm, use[r].spans);
        put_us(f, use[r].last_ns - use[r].first_ns);
        fprintf(f, "\">\n");
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"white\" stroke=\"#e2e2e2\"/>\n",
                SVG_LEFT, y, SVG_W - SVG_LEFT - SVG_RIGHT, LANE_H);
        double x0 = frame_x(fr, use[r].first_ns), x1 = frame_x(fr, use[r].last_ns);
        if (use[r].spans)   /* the rank's window, where what is empty is idle */
            fprintf(f, "<rect class=\"window\" x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"%d\" "
                    "fill=\"#f1f1f1\"/>\n", x0, y, x1 - x0, LANE_H);
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#fcfcfc\" stroke=\"#eee\"/>\n",
                SVG_LEFT, yc, SVG_W - SVG_LEFT - SVG_RIGHT, COMM_H);
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">rank %d</text>\n", SVG_LEFT - 8, y + 17, r);
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\" font-size=\"10\" fill=\"#666\">idle %.1f%%, "
                "comm %.1f%%</text>\n</g>\n", SVG_LEFT - 8, yc + 9, 100 * idle, 100 * comm);
    }
}

static void draw_box(FILE *f, const TraceFrame *fr, const TraceBox *b) {
    int micro = 0, chunk = -1, inset = b->depth < 4 ? b->depth : 4;
    char kind = b->lane == 0 ? span_kind(b->name, &micro, &chunk) : 0, fill[8];
    double x = frame_x(fr, b->ts_ns), w = frame_x(fr, box_end(b)) - x;
    double y = SVG_TOP + b->rank * ROW_H, h = LANE_H;
    if (b->lane == 1) y += LANE_H + LANE_GAP, h = COMM_H;
    y += inset * (b->lane ? 1.5 : 4.0), h -= inset * (b->lane ? 1.5 : 4.0);
    if (kind) micro_colour(micro, fr->M, kind, fill, sizeof fill);
    fprintf(f, "<rect class=\"span\" x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\"%s "
            "data-rank=\"%d\" data-lane=\"%s\" data-depth=\"%d\" data-name=\"", x, y, w, h,
            kind ? fill : b->lane ? comm_colour(b->name) : b->depth ? "#a9a9a9" : "#c4c4c4",
            w >= 3 ? " stroke=\"#333\" stroke-opacity=\"0.35\" stroke-width=\"0.5\"" : "", b->rank,
            b->lane ? "comm" : "compute", b->depth);
    plot_xml_text(f, b->name);
    fprintf(f, "\" data-cat=\"");
    plot_xml_text(f, b->cat);
    fprintf(f, "\" data-ts=\"");
    put_us(f, b->ts_ns);
    fprintf(f, "\" data-dur=\"");
    put_us(f, b->dur_ns);
    fprintf(f, "\"");
    if (kind) fprintf(f, " data-kind=\"%c\" data-micro=\"%d\" data-chunk=\"%d\"", kind, micro, chunk);
    fprintf(f, "><title>");
    plot_xml_text(f, b->name);
    fprintf(f, " (");
    plot_xml_text(f, b->cat);
    fprintf(f, ") on rank %d: starts at %.3f ms, lasts %.3f ms</title></rect>\n", b->rank, frame_ms(fr, b->ts_ns),
            b->dur_ns / 1e6);
    if (chunk > 0)   /* a later model chunk: hatched over its colour */
        fprintf(f, "<rect class=\"chunk\" x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" "
                "fill=\"url(#chunk%d)\"/>\n", x, y, w, h, chunk % 2);
    if (b->lane == 0 && w >= 6.2 * strlen(b->name) + 4) {
        fprintf(f, "<text class=\"label\" x=\"%.2f\" y=\"%.1f\" fill=\"%s\">", x + w / 2, y + h / 2 + 3.5,
                kind == 'B' ? "white" : "#222");
        plot_xml_text(f, b->name);
        fprintf(f, "</text>\n");
    }
}

static void draw_legend(FILE *f, const TraceFrame *fr) {
    int y = SVG_TOP + fr->rows * ROW_H - ROW_GAP + 64, x = SVG_LEFT;
    char col[8];
    fprintf(f, "<g class=\"legend\" font-size=\"11\">\n<text x=\"%d\" y=\"%d\">micro-batch:</text>\n", x, y + 10);
    x += 80;
    for (int m = 0; m < fr->M && x < SVG_W - 120; m++, x += fr->has_w ? 44 : 32) {
        const char *kinds = fr->has_w ? "FWB" : "FB";
        for (int k = 0; kinds[k]; k++) {
            micro_colour(m, fr->M, kinds[k], col, sizeof col);
            fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"12\" fill=\"%s\"/>", x + 12 * k, y, col);
        }
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%d</text>\n", x + (fr->has_w ? 18 : 12), y + 26, m);
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\">F light, %sB dark%s</text>\n", x + 8, y + 10, fr->has_w ? "W middle, " : "",
            fr->chunks ? "; hatched: a later model chunk (F3c1: micro-batch 3, chunk 1)" : "");
    y += 40, x = SVG_LEFT;
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"24\" height=\"12\" fill=\"#c4c4c4\"/><text x=\"%d\" y=\"%d\">"
            "other compute (optimizer, ...)</text>\n", x, y, x + 30, y + 10);
    x += 200;
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"24\" height=\"6\" fill=\"#7b61a8\"/><text x=\"%d\" y=\"%d\">send"
            "</text>\n", x, y + 3, x + 30, y + 10);
    x += 70;
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"24\" height=\"6\" fill=\"#e08a2c\"/><text x=\"%d\" y=\"%d\">recv"
            " (the thin lane: communication)</text>\n", x, y + 3, x + 30, y + 10);
    x += 250;
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"24\" height=\"12\" fill=\"#f1f1f1\" stroke=\"#ccc\"/>"
            "<text x=\"%d\" y=\"%d\">empty: idle (shaded: the rank's window); nested: inset</text>\n</g>\n",
            x, y, x + 30, y + 10);
}

/* Writes the timeline of the boxes (sorted here; at most
 * TRACE_SVG_MAX_BOXES of them drawn) to svg. 0, or -1 with err. */
static int draw_timeline(const char *svg, const char *json, TraceBoxes *bx, int world, char *err, size_t errlen) {
    TraceFrame fr = {0, 0, world < TRACE_SVG_MAX_ROWS ? world : TRACE_SVG_MAX_ROWS, 1, 0, 0};
    int spans = bx->n, drawn = bx->n < TRACE_SVG_MAX_BOXES ? bx->n : TRACE_SVG_MAX_BOXES;
    if (bx->n) qsort(bx->b, bx->n, sizeof *bx->b, by_start);
    fr.t0 = drawn ? bx->b[0].ts_ns : 0;
    fr.t1 = fr.t0;
    for (int i = 0; i < drawn; i++) {
        int m, c;
        char k = bx->b[i].lane == 0 ? span_kind(bx->b[i].name, &m, &c) : 0;
        if (k && m + 1 > fr.M) fr.M = m + 1;
        if (k == 'W') fr.has_w = 1;
        if (k && c > 0) fr.chunks = 1;
        if (box_end(&bx->b[i]) > fr.t1) fr.t1 = box_end(&bx->b[i]);
    }
    if (fr.t1 - fr.t0 < 1000) fr.t1 = fr.t0 + 1000;   /* an empty or instant trace: a microsecond wide */
    TraceUse *use = calloc(fr.rows ? fr.rows : 1, sizeof *use);
    if (!use) { snprintf(err, errlen, "%s: out of memory", svg); return -1; }
    if (drawn) qsort(bx->b, drawn, sizeof *bx->b, by_lane);
    boxes_nest(bx->b, drawn, use, fr.rows);
    if (drawn) qsort(bx->b, drawn, sizeof *bx->b, by_start);   /* draw enclosing spans first, nested ones over them */

    SafeOut o;
    if (safe_out_open(&o, svg, err, errlen) != 0) { free(use); return -1; }
    FILE *f = o.f;
    int height = SVG_TOP + fr.rows * ROW_H - ROW_GAP + 64 + 60;
    plot_svg_begin(f, SVG_W, height);
    fprintf(f, " data-ranks=\"%d\" data-spans=\"%d\" data-drawn=\"%d\" data-cap=\"%d\" data-t0=\"", fr.rows, spans,
            drawn, TRACE_SVG_MAX_BOXES);
    put_us(f, fr.t0);
    fprintf(f, "\" data-window=\"");
    put_us(f, fr.t1 - fr.t0);
    fprintf(f, "\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n<defs>\n");
    for (int k = 0; k < 2; k++)   /* the hatching of even and of odd later chunks */
        fprintf(f, "<pattern id=\"chunk%d\" width=\"5\" height=\"5\" patternUnits=\"userSpaceOnUse\" "
                "patternTransform=\"rotate(%d)\"><line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"5\" stroke=\"black\" "
                "stroke-opacity=\"0.3\" stroke-width=\"1.6\"/></pattern>\n", k, k ? 45 : -45);
    fprintf(f, "</defs>\n");
    draw_title(f, json, &fr, use, spans, drawn);
    draw_rows(f, &fr, use);
    draw_axis(f, &fr);
    fprintf(f, "<g class=\"spans\" font-size=\"10\" text-anchor=\"middle\">\n");
    for (int i = 0; i < drawn; i++)
        if (bx->b[i].rank >= 0 && bx->b[i].rank < fr.rows) draw_box(f, &fr, &bx->b[i]);
    fprintf(f, "</g>\n");
    draw_legend(f, &fr);
    fprintf(f, "</svg>\n");
    free(use);
    if (ferror(f)) {
        snprintf(err, errlen, "%s: write error", svg);
        safe_out_abort(&o);
        return -1;
    }
    return safe_out_commit(&o, err, errlen);
}

/* path with a final ".json" replaced by ".svg", else path + ".svg"; malloc'd. */
static char *svg_path(const char *path) {
    size_t n = strlen(path);
    char *out = malloc(n + 5);
    if (!out) return NULL;
    if (n > 5 && !strcmp(path + n - 5, ".json")) n -= 5;
    memcpy(out, path, n);
    strcpy(out + n, ".svg");
    return out;
}

/* Appends the whole lines of part file `part` to out, each after a ",\n"
 * when one came before (*first tells), and the complete events among them
 * to bx. Returns the lines copied, -1 if part cannot be opened. */
static int copy_part(FILE *out, const char *part, int *first, TraceBoxes *bx) {
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
        boxes_add(bx, line);
        *first = 0;
        n++;
    }
    free(line);
    fclose(in);
    return n;
}

/* Draws the merged trace `path`'s boxes beside it and says where. */
static void trace_draw(const char *path, TraceBoxes *bx, int world) {
    char err[512], *svg = svg_path(path);
    if (!svg || bx->oom) {
        fprintf(stderr, "trace: out of memory: no timeline drawn for %s\n", path);
    } else if (draw_timeline(svg, path, bx, world, err, sizeof err) != 0) {
        fprintf(stderr, "trace: timeline not drawn: %s\n", err);
    } else {
        printf("trace drawn in %s\n", svg);
    }
    free(svg);
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
    TraceBoxes bx = {0};
    for (int r = 0; r < world; r++) {
        char *part = part_path(path, r);
        int n = part ? copy_part(out, part, &first, &bx) : -1;
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
        free(bx.b);
        return -1;
    }
    for (int r = 0; r < world; r++) {
        char *part = part_path(path, r);
        if (part) remove(part);
        free(part);
    }
    trace_draw(path, &bx, world);
    free(bx.b);
    return missing ? -1 : events;
}
