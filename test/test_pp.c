/* test/test_pp.c: the pipeline schedules, read back from their printed figure, and the trace writer.
 *
 * Schedules. For naive, gpipe and 1f1b with P in 2, 4 and M in 1, 4, 8 (and
 * P = 4, M = 2, fewer micro-batches than stages), pp_show prints the figure
 * to a temporary file and everything below is derived from that text, the
 * way a reader checks the articles' figure by eye (auto-parallel-
 * partitioning.txt, 3.2 流水线并行):
 *  - counts: every stage runs each micro-batch's F once and its B once;
 *  - order: on every stage F m sits in an earlier slot than B m;
 *  - sends: every send has its receive: F m on stage s is in an earlier
 *    slot than F m on stage s+1 (activations), B m on stage s+1 earlier
 *    than B m on stage s (their gradients);
 *  - in flight: the peak of forwards minus backwards along stage 0's row is
 *    1 for naive, M for gpipe and min(P, M) <= P for 1f1b (stage s:
 *    min(P-s, M)), and the printed in-flight line agrees with the rows;
 *  - bubble: the blank cells over all cells equal the printed idle count,
 *    and the printed fraction equals (P-1)/(M+P-1) for gpipe and 1f1b and
 *    (P-1)/P for naive, to the 3 decimals printed.
 *
 * Trace. Two ranks' traces in test/out/ with nested compute spans, a
 * communication span, an escaped name, spans nested deeper than the
 * 16-deep stack and spans left open at close; merged, the file must parse
 * as JSON (a small validator below), hold the expected number of complete
 * events, nest them as written, and the part files must be gone.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"
#include "pp.h"
#include "trace.h"

#define MAXP 8
#define MAXM 16

/* What the printed figure says, cell by cell. */
typedef struct Shown {
    int P, M, T;                    /* stages seen, micro-batches, columns of the rows */
    int f_slot[MAXP][MAXM];         /* slot of F m on stage s, -1 if not seen */
    int b_slot[MAXP][MAXM];         /* slot of B m on stage s, -1 if not seen */
    int nf[MAXP], nb[MAXP];         /* cells F and B on a stage */
    int repeats;                    /* an F m or B m seen twice on one stage, or m out of range */
    int peak[MAXP];                 /* forwards minus backwards along the row, at most */
    int blank;                      /* blank cells in all rows */
    int idle, total;                /* from the bubble line */
    char measured[16], formula[16]; /* the two fractions printed there */
    int printed_peak[MAXP];         /* the in-flight line, -1 if absent */
} Shown;

/* Reads one stage row: "stage 3 |F0|  |B0|...". */
static void read_row(Shown *sh, const char *line) {
    int s = atoi(line + 6);
    const char *p = strchr(line, '|');
    if (s < 0 || s >= MAXP || !p) return;
    if (s + 1 > sh->P) sh->P = s + 1;
    int t = 0, now = 0;
    for (p++; *p && *p != '\n'; t++) {
        const char *end = strchr(p, '|');
        if (!end) break;
        char cell[16] = "";
        int n = 0;
        for (const char *q = p; q < end && n < 15; q++)
            if (*q != ' ') cell[n++] = *q;
        cell[n] = '\0';
        p = end + 1;
        if (!n) {
            sh->blank++;
            continue;
        }
        int m = atoi(cell + 1);
        if (m < 0 || m >= sh->M || (cell[0] != 'F' && cell[0] != 'B')) {
            sh->repeats++;
            continue;
        }
        int *slot = cell[0] == 'F' ? &sh->f_slot[s][m] : &sh->b_slot[s][m];
        if (*slot >= 0) {
            sh->repeats++;
            continue;
        }
        *slot = t;
        if (cell[0] == 'F') sh->nf[s]++, now++;
        else sh->nb[s]++, now--;
        if (now > sh->peak[s]) sh->peak[s] = now;
    }
    sh->T = t;
}

/* Parses pp_show's text into sh. */
static void read_figure(Shown *sh, const char *text, int M) {
    memset(sh, 0, sizeof *sh);
    sh->M = M;
    memset(sh->f_slot, -1, sizeof sh->f_slot);
    memset(sh->b_slot, -1, sizeof sh->b_slot);
    memset(sh->printed_peak, -1, sizeof sh->printed_peak);
    for (const char *line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        if (!strncmp(line, "stage ", 6)) {
            read_row(sh, line);
        } else if (!strncmp(line, "bubble: ", 8)) {
            sscanf(line, "bubble: idle %d of %d slots = %15s", &sh->idle, &sh->total, sh->measured);
            const char *eq = line, *e;
            const char *nl = strchr(line, '\n');
            while ((e = strstr(eq, " = ")) && (!nl || e < nl)) eq = e + 3;   /* the last " = " */
            sscanf(eq, "%15[0-9.]", sh->formula);
        } else if (!strncmp(line, "in flight", 9)) {
            const char *nl = strchr(line, '\n');
            for (const char *p = strstr(line, "stage "); p && (!nl || p < nl); p = strstr(p + 6, "stage ")) {
                int s, v;
                if (sscanf(p, "stage %d: %d", &s, &v) == 2 && s >= 0 && s < MAXP) sh->printed_peak[s] = v;
            }
        }
    }
}

/* pp_show's output as a string (malloc'd), through a tmpfile. */
static char *show_text(PPSchedule s, int P, int M) {
    FILE *f = tmpfile();
    if (!f) return NULL;
    if (pp_show(f, s, P, M, 1) != 0) {
        fclose(f);
        return NULL;
    }
    long n = ftell(f);
    rewind(f);
    char *text = calloc((size_t)n + 1, 1);
    if (text && fread(text, 1, (size_t)n, f) != (size_t)n) text[0] = '\0';
    fclose(f);
    return text;
}

static int imin(int a, int b) { return a < b ? a : b; }

static void check_schedule(Checks *c, PPSchedule sched, int P, int M) {
    char name[64];
    const char *sn = pp_schedule_name(sched);
    char *text = show_text(sched, P, M);
    snprintf(name, sizeof name, "%s P=%d M=%d figure", sn, P, M);
    if (!check(c, text != NULL, name, "pp_show printed %zu bytes", text ? strlen(text) : 0)) return;
    if (sched == PP_1F1B && P == 4 && M == 8) printf("%s", text);
    Shown sh;
    read_figure(&sh, text, M);

    /* counts */
    int bad = sh.repeats + (sh.P != P);
    for (int s = 0; s < P; s++) bad += (sh.nf[s] != M) + (sh.nb[s] != M);
    snprintf(name, sizeof name, "%s P=%d M=%d counts", sn, P, M);
    check(c, bad == 0, name, "%d rows, each %d F and %d B expected; %d rows wrong or cells repeated",
          sh.P, M, M, bad);

    /* every F before its B on the same stage */
    int pairs = 0, late = 0, gap = 1 << 30;
    for (int s = 0; s < P; s++)
        for (int m = 0; m < M; m++) {
            int f = sh.f_slot[s][m], b = sh.b_slot[s][m];
            pairs++;
            if (f < 0 || b < 0 || f >= b) late++;
            else if (b - f < gap) gap = b - f;
        }
    snprintf(name, sizeof name, "%s P=%d M=%d F before B", sn, P, M);
    check(c, late == 0, name, "%d of %d (stage, micro-batch) pairs with F before B, closest %d slot(s)",
          pairs - late, pairs, gap);

    /* every send received in a later slot */
    int sends = 0, unmatched = 0;
    for (int s = 0; s + 1 < P; s++)
        for (int m = 0; m < M; m++) {
            int fa = sh.f_slot[s][m], fb = sh.f_slot[s + 1][m];
            int ba = sh.b_slot[s + 1][m], bb = sh.b_slot[s][m];
            sends += 2;
            unmatched += (fa < 0 || fb < 0 || fa >= fb) + (ba < 0 || bb < 0 || ba >= bb);
        }
    snprintf(name, sizeof name, "%s P=%d M=%d sends", sn, P, M);
    check(c, unmatched == 0, name,
          "%d sends (activations down, gradients up), %d without a receive in a later slot",
          sends, unmatched);

    /* micro-batches in flight */
    int want0 = sched == PP_NAIVE ? 1 : sched == PP_GPIPE ? M : imin(P, M);
    int wrong = (sh.peak[0] != want0);
    char got[128] = "";
    for (int s = 0; s < P; s++) {
        int want = sched == PP_NAIVE ? 1 : sched == PP_GPIPE ? M : imin(P - s, M);
        wrong += (sh.peak[s] != want) + (sh.printed_peak[s] != sh.peak[s]);
        if (sched == PP_1F1B) wrong += sh.peak[s] > P;
        size_t len = strlen(got);
        snprintf(got + len, sizeof got - len, "%s%d", s ? " " : "", sh.peak[s]);
    }
    snprintf(name, sizeof name, "%s P=%d M=%d in flight", sn, P, M);
    check(c, wrong == 0, name, "peak per stage %s from the rows (stage 0: %d expected%s), printed line agrees",
          got, want0, sched == PP_1F1B ? ", min(P, M) <= P" : sched == PP_GPIPE ? ", M" : "");

    /* bubble */
    double want = sched == PP_NAIVE ? (double)(P - 1) / P : (double)(P - 1) / (M + P - 1);
    char want_s[16];
    snprintf(want_s, sizeof want_s, "%.3f", want);
    int ok = sh.blank == sh.idle && sh.total == P * sh.T && !strcmp(sh.measured, want_s) &&
             !strcmp(sh.formula, want_s);
    snprintf(name, sizeof name, "%s P=%d M=%d bubble", sn, P, M);
    check(c, ok, name, "%d blank of %d cells, printed idle %d of %d = %s, formula %s, %s %s",
          sh.blank, P * sh.T, sh.idle, sh.total, sh.measured, sh.formula,
          sched == PP_NAIVE ? "(P-1)/P =" : "(P-1)/(M+P-1) =", want_s);
    free(text);
}

static void check_api(Checks *c) {
    const char *names[] = {"naive", "gpipe", "1f1b"};
    int ok = 1;
    for (int i = 0; i < 3; i++)
        ok &= pp_schedule_parse(names[i]) == i && !strcmp(pp_schedule_name((PPSchedule)i), names[i]);
    ok &= pp_schedule_parse("zigzag") == -1 && pp_schedule_parse(NULL) == -1;
    PPAction a[16];
    ok &= pp_actions(PP_1F1B, 4, 8, 1, 4, a) == -1 && pp_actions(PP_GPIPE, 0, 8, 1, 0, a) == -1 &&
          pp_actions(PP_NAIVE, 2, 0, 1, 0, a) == -1 && pp_actions(PP_1F1B, 4, 8, 1, 3, a) == 16;
    PPTimeline t;
    ok &= pp_timeline(PP_GPIPE, 2, 0, 1, &t) == -1 && t.slots == NULL;
    ok &= pp_show(stdout, (PPSchedule)7, 2, 2, 1) == -1;
    check(c, ok, "pp api", "parse/name round trip of 3 schedules, unknown -> -1, bad P/M/stage -> -1");
}

/* ---- the trace ---- */

/* A small JSON validator: value := object | array | string | number | literal. */
static const char *json_value(const char *p, int depth);

static const char *json_ws(const char *p) {
    while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t') p++;
    return p;
}

static const char *json_string(const char *p) {
    if (*p++ != '"') return NULL;
    for (; *p != '"'; p++) {
        if ((unsigned char)*p < 0x20) return NULL;
        if (*p == '\\') {
            p++;
            if (*p == 'u') {
                for (int i = 1; i <= 4; i++)
                    if (!strchr("0123456789abcdefABCDEF", p[i]) || !p[i]) return NULL;
                p += 4;
            } else if (!*p || !strchr("\"\\/bfnrt", *p)) {
                return NULL;
            }
        }
    }
    return p + 1;
}

static const char *json_number(const char *p) {
    const char *start = p;
    if (*p == '-') p++;
    if (*p < '0' || *p > '9') return NULL;
    while ((*p >= '0' && *p <= '9') || *p == '.' || *p == 'e' || *p == 'E' || *p == '+' || *p == '-') p++;
    char *end;
    strtod(start, &end);
    return end == p ? p : NULL;
}

static const char *json_list(const char *p, char close, int object, int depth) {
    p = json_ws(p + 1);
    if (*p == close) return p + 1;
    for (;;) {
        if (object) {
            if (!(p = json_string(p))) return NULL;
            p = json_ws(p);
            if (*p++ != ':') return NULL;
        }
        if (!(p = json_value(json_ws(p), depth + 1))) return NULL;
        p = json_ws(p);
        if (*p == close) return p + 1;
        if (*p++ != ',') return NULL;
        p = json_ws(p);
    }
}

static const char *json_value(const char *p, int depth) {
    if (depth > 64) return NULL;
    if (*p == '{') return json_list(p, '}', 1, depth);
    if (*p == '[') return json_list(p, ']', 0, depth);
    if (*p == '"') return json_string(p);
    if (!strncmp(p, "true", 4)) return p + 4;
    if (!strncmp(p, "false", 5)) return p + 5;
    if (!strncmp(p, "null", 4)) return p + 4;
    return json_number(p);
}

static int json_valid(const char *text) {
    const char *p = json_value(json_ws(text), 0);
    return p && *json_ws(p) == '\0';
}

static int count(const char *text, const char *needle) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

/* Start and end in nanoseconds of the event line holding `key`; 0 if found. */
static int span_of(const char *text, const char *key, int64_t *start, int64_t *end) {
    const char *p = strstr(text, key);
    if (!p) return -1;
    const char *ts = strstr(p, "\"ts\":"), *dur = strstr(p, "\"dur\":");
    if (!ts || !dur) return -1;
    long long a, b;
    int af, bf;
    if (sscanf(ts + 5, "%lld.%3d", &a, &af) != 2 || sscanf(dur + 6, "%lld.%3d", &b, &bf) != 2) return -1;
    *start = a * 1000 + af;
    *end = *start + b * 1000 + bf;
    return 0;
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *text = calloc((size_t)n + 1, 1);
    if (text && fread(text, 1, (size_t)n, f) != (size_t)n) text[0] = '\0';
    fclose(f);
    return text;
}

static void check_trace(Checks *c) {
    const char *path = "test/out/test_pp_trace.json";
    mkdir("test", 0755);
    mkdir("test/out", 0755);
    remove(path);

    /* tracing off: NULL everywhere, nothing written */
    Trace *off = trace_open(NULL, 0, 1);
    trace_begin(off, "F0", "compute");
    trace_end(off);
    trace_close(off);
    check(c, off == NULL && trace_open("", 0, 1) == NULL, "trace off", "NULL path gives a NULL Trace; calls on it do nothing");

    Trace *r0 = trace_open(path, 0, 2), *r1 = trace_open(path, 1, 2);
    if (!check(c, r0 && r1, "trace open", "two ranks' parts created under test/out")) return;
    int x = 0;                                          /* complete events written */
    trace_begin(r0, "step", "compute");
    trace_begin(r0, "F0", "compute");
    usleep(200);
    trace_end(r0), x++;
    trace_begin(r0, "send act", "comm");
    trace_end(r0), x++;
    trace_begin(r0, "B0", "compute");
    trace_end(r0), x++;
    trace_end(r0), x++;                                 /* step */
    trace_end(r0);                                      /* nothing open: ignored */
    for (int i = 0; i < 18; i++) trace_begin(r1, "deep", "compute");
    for (int i = 0; i < 18; i++) trace_end(r1);
    x += 16;                                            /* two beyond the stack are not recorded */
    trace_begin(r1, "odd \"name\" \\ \t", "optimizer");
    trace_end(r1), x++;
    trace_begin(r1, "left open", "compute");
    trace_begin(r1, "allreduce dp", "comm");
    x += 2;                                             /* trace_close ends them */
    trace_close(r0);
    trace_close(r1);

    int events = trace_merge(path, 2);
    char part0[256], part1[256];
    snprintf(part0, sizeof part0, "%s.0.part", path);
    snprintf(part1, sizeof part1, "%s.1.part", path);
    char *text = read_file(path);
    if (!check(c, text != NULL, "trace merge", "merge returned %d; %s %s", events, path,
               text ? "written" : "missing"))
        return;
    size_t n = strlen(text);
    while (n && (text[n - 1] == '\n' || text[n - 1] == ' ')) n--;
    int framed = !strncmp(text, "{\"traceEvents\":[", 16) && n >= 2 && !strncmp(text + n - 2, "]}", 2);
    int xs = count(text, "\"ph\":\"X\"");
    int metas = count(text, "\"ph\":\"M\"");
    check(c, framed && json_valid(text) && xs == x && events == xs + metas, "trace json",
          "%s, %s, %d complete events (%d expected), %d metadata, merge counted %d",
          framed ? "{\"traceEvents\":[ ... ]}" : "not framed", json_valid(text) ? "valid JSON" : "INVALID JSON",
          xs, x, metas, events);

    int64_t s0, s1, f0, f1, b0, b1;
    int nested = !span_of(text, "\"name\":\"step\"", &s0, &s1) && !span_of(text, "\"name\":\"F0\"", &f0, &f1) &&
                 !span_of(text, "\"name\":\"B0\"", &b0, &b1) && s0 <= f0 && f1 <= b0 && b1 <= s1 &&
                 f1 - f0 >= 200000;
    const char *send = strstr(text, "\"name\":\"send act\"");
    int comm_tid = send && strstr(send, "\"tid\":1") && strstr(send, "\"tid\":1") < strchr(send, '\n');
    int ranks = strstr(text, "\"args\":{\"name\":\"rank 0\"}") && strstr(text, "\"args\":{\"name\":\"rank 1\"}");
    int escaped = strstr(text, "\"name\":\"odd \\\"name\\\" \\\\ \\u0009\"") != NULL;
    check(c, nested && comm_tid && ranks && escaped, "trace spans",
          "F0 (%.0f us) and B0 inside step: %s; comm on tid 1: %s; process names rank 0/1: %s; name escaped: %s",
          (f1 - f0) / 1e3, nested ? "yes" : "no", comm_tid ? "yes" : "no", ranks ? "yes" : "no",
          escaped ? "yes" : "no");
    check(c, access(part0, F_OK) != 0 && access(part1, F_OK) != 0 && access("test/out/test_pp_trace.json.tmp", F_OK) != 0,
          "trace parts removed", "%s, %s and the .tmp are gone after the merge", part0, part1);
    free(text);
}

int main(void) {
    Checks c = {0};
    check_api(&c);
    const int layouts[][2] = {{2, 1}, {2, 4}, {2, 8}, {4, 1}, {4, 2}, {4, 4}, {4, 8}};
    const PPSchedule scheds[] = {PP_NAIVE, PP_GPIPE, PP_1F1B};
    for (int k = 0; k < 3; k++)
        for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++)
            check_schedule(&c, scheds[k], layouts[i][0], layouts[i][1]);
    check_trace(&c);
    printf("%d passed, %d failed\n", c.passed, c.failed);
    return check_done(&c);
}
