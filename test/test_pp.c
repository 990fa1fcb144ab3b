/* test/test_pp.c: the pipeline schedules, read back from their printed figure, and the trace writer.
 *
 * Schedules. pp_show prints each schedule's figure to a temporary file and
 * everything below is derived from that text, the way a reader checks the
 * articles' figure by eye (auto-parallel-partitioning.txt, 3.2 流水线并行;
 * Megatron-LM 2021, 2.2.2, for interleaved; Qi et al. 2023, 3.1, for
 * ZB-H1 and ZB-H2). Cells are "F3", "B3", "W3" (micro-batch 3), "F3.1"
 * with chunks (micro-batch 3 on chunk 1). Layouts: naive, gpipe and 1f1b
 * with P in 2, 4 and M in 1, 4, 8 (and P = 4, M = 2); interleaved with
 * P = 2, 4, V = 2, 3 and M = P, 2P (and V = 1, which is 1f1b); zb-h1 and
 * zb-h2 with P = 2, 4 and M = 4, 8 (and P = 4, M = 2).
 *  - counts: every stage runs each (micro-batch, chunk)'s F once and its B
 *    once, and its W once exactly when the schedule splits the backward;
 *  - order: on every stage F before B before W of the same pair;
 *  - sends: every send has its receive in a later slot: F(s,c,m) after
 *    F(s-1,c,m), or on stage 0 after F(P-1,c-1,m) (the wrap of
 *    interleaved); B(s,c,m) after B(s+1,c,m), or on the last stage after
 *    B(0,c+1,m): 2(VP-1)M sends;
 *  - in flight: the peak of sets taken (F) minus given back (B, or W when
 *    split) along each row is the schedule's formula (naive 1, gpipe M,
 *    1f1b min(P-s, M), interleaved min(2(P-s-1) + (V-1)P + 1, MV), zb-h1
 *    min(P, M), zb-h2 min(2P-1, M)), and the printed in-flight line agrees;
 *  - bubble: the blank cells equal the printed idle count and the closed
 *    form of the idle slots (2MP(P-1) naive, 2P(P-1) gpipe, 1f1b and
 *    interleaved whatever V, P(P-1+max(0,P-M)) zero-bubble), and the
 *    printed fraction and formula equal the formula to the 3 decimals;
 *    for zb-h1 and zb-h2 also the idle between a stage's first and last
 *    action (P(P-1)/2 and (P-1-x)(P-x)/2 with x = min(P-1, M-P)).
 * Bad arguments (V > 1 without interleaved, M not a multiple of P for
 * interleaved, V < 1) give -1 everywhere, with one line of reason.
 *
 * Picture. plot_schedule_svg of the new schedules (P = 4, M = 8: interleaved
 * V = 2, zb-h1, zb-h2) read back: one box a timeline slot with its stage,
 * slot, kind, micro-batch and chunk, and 2(VP-1)M send lines each joining
 * an action to the one that waits for it (test_schedule_svg.sh checks the
 * same through ./train once it runs these schedules).
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
#include "plot.h"
#include "pp_sched.h"
#include "trace.h"

#define MAXP 8
#define MAXM 16
#define MAXV 3

/* What the printed figure says, cell by cell. */
typedef struct Shown {
    int P, M, V, T;                       /* stages seen, micro-batches, chunks, columns of the rows */
    int slot[3][MAXP][MAXV][MAXM];        /* slot of F/B/W (chunk c, micro m) on stage s, -1 if not seen */
    int n[3][MAXP];                       /* cells F, B, W on a stage */
    int repeats;                          /* a cell seen twice on one stage, or out of range */
    int peak[MAXP];                       /* sets taken minus given back along the row, at most */
    int blank;                            /* blank cells in all rows */
    int inside;                           /* blank cells between a row's first and last action */
    int idle, total;                      /* from the bubble line */
    int printed_inside;                   /* from the line under it, -1 if absent */
    char measured[16], formula[16];       /* the two fractions printed there */
    int printed_peak[MAXP];               /* the in-flight line, -1 if absent */
} Shown;

static int kind_of(char k) { return k == 'F' ? 0 : k == 'B' ? 1 : k == 'W' ? 2 : -1; }

/* Reads one stage row: "stage 3 |F0|  |B0|W0|..." or "|F3.1|". Sets are
 * given back at W when the figure has any W (split), else at B. */
static void read_row(Shown *sh, const char *line, int split) {
    int s = atoi(line + 6);
    const char *p = strchr(line, '|');
    if (s < 0 || s >= MAXP || !p) return;
    if (s + 1 > sh->P) sh->P = s + 1;
    int t = 0, now = 0, first = -1, last = -1, blank = 0;
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
            blank++;
            continue;
        }
        if (first < 0) first = t;
        last = t;
        int k = kind_of(cell[0]), m = atoi(cell + 1), c = 0;
        const char *dot = strchr(cell, '.');
        if (dot) c = atoi(dot + 1);
        if (k < 0 || m < 0 || m >= sh->M || c < 0 || c >= sh->V || (dot != NULL) != (sh->V > 1)) {
            sh->repeats++;
            continue;
        }
        int *slot = &sh->slot[k][s][c][m];
        if (*slot >= 0) {
            sh->repeats++;
            continue;
        }
        *slot = t;
        sh->n[k][s]++;
        if (k == 0) now++;
        else if (k == (split ? 2 : 1)) now--;
        if (now > sh->peak[s]) sh->peak[s] = now;
    }
    sh->blank += blank;
    if (first >= 0) sh->inside += blank - first - (t - 1 - last);
    sh->T = t;
}

/* Parses pp_show's text into sh. */
static void read_figure(Shown *sh, const char *text, int M, int V) {
    memset(sh, 0, sizeof *sh);
    sh->M = M;
    sh->V = V;
    memset(sh->slot, -1, sizeof sh->slot);
    memset(sh->printed_peak, -1, sizeof sh->printed_peak);
    sh->printed_inside = -1;
    int split = 0;   /* any W cell in the rows */
    for (const char *line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        const char *nl = strchr(line, '\n');
        if (!strncmp(line, "stage ", 6))
            for (const char *p = line; *p && p != nl; p++) split |= p[0] == '|' && p[1] == 'W';
    }
    for (const char *line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        if (!strncmp(line, "stage ", 6)) {
            read_row(sh, line, split);
        } else if (!strncmp(line, "bubble: ", 8)) {
            sscanf(line, "bubble: idle %d of %d slots = %15s", &sh->idle, &sh->total, sh->measured);
            const char *eq = line, *e;
            const char *nl = strchr(line, '\n');
            while ((e = strstr(eq, " = ")) && (!nl || e < nl)) eq = e + 3;   /* the last " = " */
            sscanf(eq, "%15[0-9.]", sh->formula);
        } else if (!strncmp(line, "idle between", 12)) {
            sscanf(line, "idle between a stage's first and last action: %d", &sh->printed_inside);
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
static char *show_text(PPSchedule s, int P, int M, int V) {
    FILE *f = tmpfile();
    if (!f) return NULL;
    if (pp_show(f, s, P, M, V) != 0) {
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
static int imax(int a, int b) { return a > b ? a : b; }

/* The peak sets in flight on stage s, as each schedule's description says. */
static int want_in_flight(PPSchedule sched, int P, int M, int V, int s) {
    switch (sched) {
    case PP_NAIVE: return 1;
    case PP_GPIPE: return M;
    case PP_INTERLEAVED:
        if (V > 1) return imin(2 * (P - s - 1) + (V - 1) * P + 1, M * V);
        return imin(P - s, M);
    case PP_ZBH1: return imin(P, M);
    case PP_ZBH2: return imin(2 * P - 1, M);
    default: return imin(P - s, M);
    }
}

/* Idle slots of the whole figure, closed form, and the bubble fraction. */
static int want_idle(PPSchedule sched, int P, int M) {
    switch (sched) {
    case PP_NAIVE: return 2 * M * P * (P - 1);
    case PP_ZBH1:
    case PP_ZBH2: return P * (P - 1 + imax(0, P - M));
    default: return 2 * P * (P - 1);   /* gpipe, 1f1b, interleaved for every V */
    }
}

static double want_bubble(PPSchedule sched, int P, int M, int V) {
    int e = imax(0, P - M);
    switch (sched) {
    case PP_NAIVE: return (double)(P - 1) / P;
    case PP_INTERLEAVED: return (double)(P - 1) / (V * M + P - 1);
    case PP_ZBH1:
    case PP_ZBH2: return (double)(P - 1 + e) / (3 * M + P - 1 + e);
    default: return (double)(P - 1) / (M + P - 1);
    }
}

static void check_schedule(Checks *c, PPSchedule sched, int P, int M, int V) {
    char name[80], lay[48];
    const char *sn = pp_schedule_name(sched);
    int split = pp_schedule_splits(sched);
    if (V > 1) snprintf(lay, sizeof lay, "P=%d M=%d V=%d", P, M, V);
    else snprintf(lay, sizeof lay, "P=%d M=%d", P, M);
    char *text = show_text(sched, P, M, V);
    snprintf(name, sizeof name, "%s %s figure", sn, lay);
    if (!check(c, text != NULL, name, "pp_show printed %zu bytes", text ? strlen(text) : 0)) return;
    if (P == 4 && M == 8 && (sched == PP_1F1B || (sched == PP_INTERLEAVED && V == 2) || split)) printf("%s", text);
    Shown sh;
    read_figure(&sh, text, M, V);

    /* counts */
    int bad = sh.repeats + (sh.P != P);
    for (int s = 0; s < P; s++)
        bad += (sh.n[0][s] != M * V) + (sh.n[1][s] != M * V) + (sh.n[2][s] != (split ? M * V : 0));
    snprintf(name, sizeof name, "%s %s counts", sn, lay);
    check(c, bad == 0, name, "%d rows, each %d F, %d B and %d W expected; %d rows wrong or cells repeated",
          sh.P, M * V, M * V, split ? M * V : 0, bad);

    /* F before B before W on the same stage */
    int pairs = 0, late = 0, gap = 1 << 30;
    for (int s = 0; s < P; s++)
        for (int ch = 0; ch < V; ch++)
            for (int m = 0; m < M; m++) {
                int f = sh.slot[0][s][ch][m], b = sh.slot[1][s][ch][m], w = sh.slot[2][s][ch][m];
                pairs++;
                if (f < 0 || b < 0 || f >= b || (split && (w < 0 || b >= w))) late++;
                else if (b - f < gap) gap = b - f;
            }
    snprintf(name, sizeof name, "%s %s F before B%s", sn, lay, split ? " before W" : "");
    check(c, late == 0, name, "%d of %d (stage, chunk, micro-batch) in order, F to B closest %d slot(s)",
          pairs - late, pairs, gap);

    /* every send received in a later slot, by the dependency rules */
    int sends = 0, unmatched = 0, wraps = 0;
    for (int s = 0; s < P; s++)
        for (int ch = 0; ch < V; ch++)
            for (int m = 0; m < M; m++) {
                int f = sh.slot[0][s][ch][m], b = sh.slot[1][s][ch][m];
                int fs = -2, bs = -2;   /* the slot of what each waits for, if it is a send */
                if (s > 0) fs = sh.slot[0][s - 1][ch][m];
                else if (ch > 0) fs = sh.slot[0][P - 1][ch - 1][m], wraps++;
                if (s < P - 1) bs = sh.slot[1][s + 1][ch][m];
                else if (ch < V - 1) bs = sh.slot[1][0][ch + 1][m], wraps++;
                if (fs != -2) sends++, unmatched += fs < 0 || f < 0 || fs >= f;
                if (bs != -2) sends++, unmatched += bs < 0 || b < 0 || bs >= b;
            }
    snprintf(name, sizeof name, "%s %s sends", sn, lay);
    check(c, unmatched == 0 && sends == 2 * (V * P - 1) * M, name,
          "%d sends (2(VP-1)M = %d: activations down, gradients up, %d wrapping between stage %d and 0), "
          "%d without a receive in a later slot", sends, 2 * (V * P - 1) * M, wraps, P - 1, unmatched);

    /* sets in flight */
    int want0 = want_in_flight(sched, P, M, V, 0);
    int wrong = 0;
    char got[128] = "";
    for (int s = 0; s < P; s++) {
        wrong += (sh.peak[s] != want_in_flight(sched, P, M, V, s)) + (sh.printed_peak[s] != sh.peak[s]);
        if (sched == PP_1F1B || sched == PP_ZBH1) wrong += sh.peak[s] > P;
        size_t len = strlen(got);
        snprintf(got + len, sizeof got - len, "%s%d", s ? " " : "", sh.peak[s]);
    }
    snprintf(name, sizeof name, "%s %s in flight", sn, lay);
    check(c, wrong == 0, name, "peak per stage %s from the rows (stage 0: %d expected, %s), printed line agrees",
          got, want0,
          sched == PP_NAIVE ? "1" : sched == PP_GPIPE ? "M" : sched == PP_ZBH1 ? "min(P, M) on every stage"
          : sched == PP_ZBH2 ? "min(2P-1, M) on every stage"
          : sched == PP_INTERLEAVED && V > 1 ? "min(2(P-s-1) + (V-1)P + 1, MV) on stage s" : "min(P-s, M) <= P");

    /* bubble */
    double want = want_bubble(sched, P, M, V);
    int idle = want_idle(sched, P, M);
    char want_s[16];
    snprintf(want_s, sizeof want_s, "%.3f", want);
    int ok = sh.blank == sh.idle && sh.idle == idle && sh.total == P * sh.T && !strcmp(sh.measured, want_s) &&
             !strcmp(sh.formula, want_s) && sh.printed_inside == sh.inside;
    snprintf(name, sizeof name, "%s %s bubble", sn, lay);
    check(c, ok, name, "%d blank of %d cells (closed form %d), printed idle %d of %d = %s, formula %s, want %s",
          sh.blank, P * sh.T, idle, sh.idle, sh.total, sh.measured, sh.formula, want_s);
    if (split && M >= P) {
        int x = imin(P - 1, M - P);
        int inside = sched == PP_ZBH1 ? P * (P - 1) / 2 : (P - 1 - x) * (P - x) / 2;
        snprintf(name, sizeof name, "%s %s idle inside", sn, lay);
        check(c, sh.inside == inside, name, "%d idle slots between a stage's first and last action, %s = %d%s",
              sh.inside, sched == PP_ZBH1 ? "P(P-1)/2" : "(P-1-x)(P-x)/2, x = min(P-1, M-P),", inside,
              sched == PP_ZBH2 && inside == 0 ? " (the parallelogram)" : "");
    }
    free(text);
}

static void check_api(Checks *c) {
    const char *names[] = {"naive", "gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2"};
    int ok = 1;
    for (int i = 0; i < 6; i++)
        ok &= pp_schedule_parse(names[i]) == i && !strcmp(pp_schedule_name((PPSchedule)i), names[i]);
    ok &= pp_schedule_parse("zigzag") == -1 && pp_schedule_parse(NULL) == -1;
    PPAction a[64];
    ok &= pp_actions(PP_1F1B, 4, 8, 1, 4, a) == -1 && pp_actions(PP_GPIPE, 0, 8, 1, 0, a) == -1 &&
          pp_actions(PP_NAIVE, 2, 0, 1, 0, a) == -1 && pp_actions(PP_1F1B, 4, 8, 1, 3, a) == 16 &&
          pp_actions(PP_INTERLEAVED, 4, 8, 2, 3, a) == 32 && pp_actions(PP_ZBH1, 4, 8, 1, 0, a) == 24 &&
          pp_actions(PP_ZBH2, 4, 8, 1, 3, a) == 24 && pp_num_actions(PP_ZBH2, 2, 4, 1) == 12;
    PPTimeline t;
    ok &= pp_timeline(PP_GPIPE, 2, 0, 1, &t) == -1 && t.slots == NULL;
    ok &= pp_show(stdout, (PPSchedule)7, 2, 2, 1) == -1;
    check(c, ok, "pp api", "parse/name round trip of 6 schedules, unknown -> -1, bad P/M/stage -> -1, "
          "2MV or 3M actions a stage");

    /* bad arguments: -1 everywhere, one line of reason */
    struct { PPSchedule s; int P, M, V; const char *says; } bad[] = {
        {PP_1F1B, 4, 8, 2, "needs --schedule interleaved"},
        {PP_ZBH1, 4, 8, 2, "needs --schedule interleaved"},
        {PP_GPIPE, 2, 4, 3, "needs --schedule interleaved"},
        {PP_INTERLEAVED, 4, 6, 2, "multiple of the stages"},
        {PP_INTERLEAVED, 4, 6, 1, "multiple of the stages"},
        {PP_INTERLEAVED, 4, 8, 0, ">= 1"},
        {PP_ZBH2, 4, 8, 0, ">= 1"},
    };
    int nbad = sizeof bad / sizeof bad[0], refused = 0;
    char err[160] = "", last[160] = "";
    for (int i = 0; i < nbad; i++) {
        FILE *devnull = fopen("/dev/null", "w");
        int r = pp_schedule_check(bad[i].s, bad[i].P, bad[i].M, bad[i].V, err, sizeof err) == -1 &&
                strstr(err, bad[i].says) && !strchr(err, '\n') &&
                pp_num_actions(bad[i].s, bad[i].P, bad[i].M, bad[i].V) == -1 &&
                pp_actions(bad[i].s, bad[i].P, bad[i].M, bad[i].V, 0, a) == -1 &&
                pp_bubble_formula(bad[i].s, bad[i].P, bad[i].M, bad[i].V) == -1 &&
                pp_timeline(bad[i].s, bad[i].P, bad[i].M, bad[i].V, &t) == -1 && t.slots == NULL &&
                devnull && pp_show(devnull, bad[i].s, bad[i].P, bad[i].M, bad[i].V) == -1 && ftell(devnull) == 0;
        if (devnull) fclose(devnull);
        refused += r;
        if (bad[i].s == PP_INTERLEAVED && bad[i].V == 2) snprintf(last, sizeof last, "%s", err);
    }
    check(c, refused == nbad && pp_schedule_check(PP_INTERLEAVED, 4, 8, 3, err, sizeof err) == 0, "pp bad arguments",
          "%d of %d refused (V > 1 without interleaved, M %% P != 0 for interleaved, V < 1), e.g. \"%s\"; "
          "interleaved P 4 M 8 V 3 accepted", refused, nbad, last);
}

/* The SVG of a timeline read back against the timeline: boxes, sends. */
static void check_svg(Checks *c, PPSchedule sched, int P, int M, int V) {
    char name[80], path[128], formula[96], err[256];
    const char *sn = pp_schedule_name(sched);
    snprintf(name, sizeof name, "%s P=%d M=%d V=%d svg", sn, P, M, V);
    snprintf(path, sizeof path, "test/out/test_pp_schedule_%s.svg", sn);
    mkdir("test", 0755);
    mkdir("test/out", 0755);
    PPTimeline t;
    if (!check(c, pp_timeline(sched, P, M, V, &t) == 0 && pp_bubble_text(sched, P, M, V, formula, sizeof formula) == 0 &&
               plot_schedule_svg(path, &t, sn, formula, err, sizeof err) == 0, name, "written to %s", path))
        return;
    FILE *f = fopen(path, "r");
    char *text = NULL;
    long n = 0;
    if (f && fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) > 0) {
        rewind(f);
        text = calloc((size_t)n + 1, 1);
        if (text && fread(text, 1, (size_t)n, f) != (size_t)n) text[0] = '\0';
    }
    if (f) fclose(f);
    int boxes = 0, wrong = 0, sends = 0, bad_sends = 0, wraps = 0, actions = 0;
    for (int i = 0; i < P * t.T; i++) actions += t.slots[i].kind != PP_IDLE;
    for (const char *p = text; p && (p = strstr(p, "<rect class=\"slot\"")); p++) {
        int s, sl, m, ch;
        char k;
        const char *d = strstr(p, "data-stage=");
        boxes++;
        if (!d || sscanf(d, "data-stage=\"%d\" data-slot=\"%d\" data-kind=\"%c\" data-micro=\"%d\" data-chunk=\"%d\"",
                         &s, &sl, &k, &m, &ch) != 5 || s < 0 || s >= P || sl < 0 || sl >= t.T) {
            wrong++;
            continue;
        }
        PPAction a = t.slots[s * t.T + sl];
        wrong += a.kind == PP_IDLE || "FBW"[a.kind] != k || a.micro != m || a.chunk != ch;
    }
    for (const char *p = text; p && (p = strstr(p, "<line class=\"send\"")); p++) {
        int m, ch, from, to, rch, sl, rsl;
        char k;
        const char *d = strstr(p, "data-kind=");
        sends++;
        if (!d || sscanf(d, "data-kind=\"%c\" data-micro=\"%d\" data-chunk=\"%d\" data-from=\"%d\" data-to=\"%d\" "
                         "data-recv-chunk=\"%d\" data-slot=\"%d\" data-recv-slot=\"%d\"",
                         &k, &m, &ch, &from, &to, &rch, &sl, &rsl) != 8 ||
            from < 0 || from >= P || to < 0 || to >= P || sl < 0 || sl >= t.T || rsl < 0 || rsl >= t.T) {
            bad_sends++;
            continue;
        }
        int rule = k == 'F' ? (to == from + 1 && rch == ch) || (from == P - 1 && to == 0 && rch == ch + 1)
                            : (to == from - 1 && rch == ch) || (from == 0 && to == P - 1 && rch == ch - 1);
        PPAction a = t.slots[from * t.T + sl], b = t.slots[to * t.T + rsl];
        PPKind want = k == 'F' ? PP_FORWARD : PP_BACKWARD;
        bad_sends += !rule || a.kind != want || b.kind != want || a.micro != m || b.micro != m || a.chunk != ch ||
                     b.chunk != rch || sl >= rsl;
        wraps += rch != ch;
    }
    snprintf(name, sizeof name, "%s P=%d M=%d V=%d svg boxes and sends", sn, P, M, V);
    check(c, text && boxes == actions && !wrong && sends == 2 * (V * P - 1) * M && !bad_sends, name,
          "%d boxes (%d actions in the timeline, %d unlike their slot), %d sends (2(VP-1)M = %d, %d wrapping, "
          "%d off the dependency rules)", boxes, actions, wrong, sends, 2 * (V * P - 1) * M, wraps, bad_sends);
    free(text);
    pp_timeline_free(&t);
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
            check_schedule(&c, scheds[k], layouts[i][0], layouts[i][1], 1);
    for (int P = 2; P <= 4; P += 2)
        for (int V = 2; V <= 3; V++)
            for (int M = P; M <= 2 * P; M += P) check_schedule(&c, PP_INTERLEAVED, P, M, V);
    check_schedule(&c, PP_INTERLEAVED, 4, 8, 1);
    const int zb[][2] = {{2, 4}, {2, 8}, {4, 2}, {4, 4}, {4, 8}};
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < sizeof zb / sizeof zb[0]; i++)
            check_schedule(&c, k ? PP_ZBH2 : PP_ZBH1, zb[i][0], zb[i][1], 1);
    check_svg(&c, PP_INTERLEAVED, 4, 8, 2);
    check_svg(&c, PP_ZBH1, 4, 8, 1);
    check_svg(&c, PP_ZBH2, 4, 8, 1);
    check_trace(&c);
    printf("%d passed, %d failed\n", c.passed, c.failed);
    return check_done(&c);
}
