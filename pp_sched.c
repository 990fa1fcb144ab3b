/* pp_sched.c: pipeline schedules, their timeline and the articles' figure of them.
 *
 * auto-parallel-partitioning.txt, 3.2 流水线并行, draws three pictures:
 *
 *  - the naive split, "数据一次只能在一个节点上运行": one micro-batch goes
 *    down the stages and back up before the next one starts, so at any
 *    time one stage works and P-1 wait. Each micro-batch takes 2P slots of
 *    which a stage works 2: the bubble is (P-1)/P whatever M is.
 *  - GPipe (微批法): all M forwards stream down the pipe, then all M
 *    backwards stream up. The pipe fills in P-1 slots and drains in P-1,
 *    so a stage is idle 2(P-1) of 2(M+P-1) slots: (P-1)/(M+P-1). Every
 *    stage holds the activations of all M micro-batches at the end of the
 *    forwards (内存占用大), the cost 1F1B removes.
 *  - PipeDream's 1F1B, in its flushing form (PipeDream-Flush, Megatron's
 *    non-interleaved schedule): stage s runs min(P-1-s, M) warm-up
 *    forwards, then alternates one forward and one backward, then runs the
 *    remaining backwards. The backward of a micro-batch starts as soon as
 *    it can, so stage s holds at most P-s micro-batches (stage 0: P, not
 *    M) and the bubble is GPipe's.
 *
 * GPipe's backward order. The GPipe paper's figure drains the last stage
 * B(M-1) .. B0; we run B0 .. B(M-1). The timeline is the same either way:
 * on the last stage every backward is ready once its forward is done, so
 * whichever micro-batch it starts with, it starts right after F(M-1), and
 * each stage above follows one slot behind with the same micro-batch. What
 * the order does change is the order gradients accumulate in: 0 .. M-1 is
 * the order of 1F1B and of one rank accumulating M micro-batches, so GPipe
 * and 1F1B sum the same float32 numbers in the same order (the same bits),
 * and micro-batch 0, held longest, is freed first. PyTorch's ScheduleGPipe
 * does the same.
 *
 * The timeline is a unit-slot simulation (F and B one slot each, no
 * transfer time), enough to print the figure and to check the schedules'
 * dependencies and bubbles; the real bubble, with real F and B times,
 * comes from trace.c.
 */
#include <stdlib.h>
#include <string.h>
#include "pp_sched.h"

int pp_schedule_parse(const char *s) {
    if (!s) return -1;
    if (!strcmp(s, "naive")) return PP_NAIVE;
    if (!strcmp(s, "gpipe")) return PP_GPIPE;
    if (!strcmp(s, "1f1b")) return PP_1F1B;
    if (!strcmp(s, "interleaved")) return PP_INTERLEAVED;
    if (!strcmp(s, "zb-h1")) return PP_ZBH1;
    if (!strcmp(s, "zb-h2")) return PP_ZBH2;
    return -1;
}

const char *pp_schedule_name(PPSchedule s) {
    switch (s) {
    case PP_NAIVE: return "naive";
    case PP_GPIPE: return "gpipe";
    case PP_1F1B: return "1f1b";
    case PP_INTERLEAVED: return "interleaved";
    case PP_ZBH1: return "zb-h1";
    case PP_ZBH2: return "zb-h2";
    }
    return "?";
}

int pp_schedule_splits(PPSchedule s) { return s == PP_ZBH1 || s == PP_ZBH2; }

int pp_schedule_check(PPSchedule s, int P, int M, int V, char *err, size_t errlen) {
    if (P < 1 || M < 1 || V < 1) {
        snprintf(err, errlen, "a pipeline needs P, M and V >= 1 (got P %d, M %d, V %d)", P, M, V);
        return -1;
    }
    if (s != PP_NAIVE && s != PP_GPIPE && s != PP_1F1B) {
        snprintf(err, errlen, "schedule %s is not built yet", pp_schedule_name(s));
        return -1;
    }
    if (V > 1) {
        snprintf(err, errlen, "--virtual %d needs --schedule interleaved", V);
        return -1;
    }
    return 0;
}

int pp_num_actions(PPSchedule s, int P, int M, int V) {
    char err[128];
    if (pp_schedule_check(s, P, M, V, err, sizeof err) != 0) return -1;
    return pp_schedule_splits(s) ? 3 * M * V : 2 * M * V;
}

static PPAction fwd(int m) { return (PPAction){PP_FORWARD, m, 0}; }
static PPAction bwd(int m) { return (PPAction){PP_BACKWARD, m, 0}; }

/* F0 B0 F1 B1 ...: the same on every stage; the dependencies do the rest. */
static int naive_actions(int M, PPAction *out) {
    int n = 0;
    for (int m = 0; m < M; m++) {
        out[n++] = fwd(m);
        out[n++] = bwd(m);
    }
    return n;
}

/* All forwards, then all backwards in micro-batch order (see the header). */
static int gpipe_actions(int M, PPAction *out) {
    int n = 0;
    for (int m = 0; m < M; m++) out[n++] = fwd(m);
    for (int m = 0; m < M; m++) out[n++] = bwd(m);
    return n;
}

/* Megatron's forward_backward_pipelining_without_interleaving: warm-up,
 * steady one-forward-one-backward, cool-down. */
static int onef1b_actions(int P, int M, int stage, PPAction *out) {
    int warmup = P - 1 - stage < M ? P - 1 - stage : M;
    int steady = M - warmup;
    int n = 0, f = 0, b = 0;   /* next forward, next backward */
    for (int i = 0; i < warmup; i++) out[n++] = fwd(f++);
    for (int i = 0; i < steady; i++) {
        out[n++] = fwd(f++);
        out[n++] = bwd(b++);
    }
    while (b < M) out[n++] = bwd(b++);
    return n;
}

int pp_actions(PPSchedule s, int P, int M, int V, int stage, PPAction *out) {
    if (pp_num_actions(s, P, M, V) < 0 || stage < 0 || stage >= P) return -1;
    switch (s) {
    case PP_NAIVE: return naive_actions(M, out);
    case PP_GPIPE: return gpipe_actions(M, out);
    case PP_1F1B: return onef1b_actions(P, M, stage, out);
    default: return -1;
    }
}

int pp_in_flight_peak(const PPAction *acts, int n) {
    int now = 0, peak = 0, split = 0;
    for (int i = 0; i < n; i++) split |= acts[i].kind == PP_WEIGHT;
    for (int i = 0; i < n; i++) {
        if (acts[i].kind == PP_FORWARD) now++;
        else if (acts[i].kind == (split ? PP_WEIGHT : PP_BACKWARD)) now--;
        if (now > peak) peak = now;
    }
    return peak;
}

double pp_bubble_formula(PPSchedule s, int P, int M, int V) {
    if (pp_num_actions(s, P, M, V) < 0) return -1;
    switch (s) {
    case PP_NAIVE: return (double)(P - 1) / P;
    case PP_GPIPE:
    case PP_1F1B: return (double)(P - 1) / (M + P - 1);
    default: return -1;
    }
}

/* Has the action that a on stage s waits for (on a neighbour stage, or the
 * last stage's own forward) finished in a slot before t? done_f and done_b
 * are [P][M] slots, -1 while not run. */
static int ready(PPAction a, int s, int P, int M, const int *done_f, const int *done_b, int t) {
    int dep;
    if (a.kind == PP_FORWARD) {
        if (s == 0) return 1;
        dep = done_f[(s - 1) * M + a.micro];
    } else if (s == P - 1) {
        dep = done_f[s * M + a.micro];
    } else {
        dep = done_b[(s + 1) * M + a.micro];
    }
    return dep >= 0 && dep < t;
}

int pp_timeline(PPSchedule s, int P, int M, int V, PPTimeline *t) {
    memset(t, 0, sizeof *t);
    if (pp_bubble_formula(s, P, M, V) < 0) return -1;
    int n = pp_num_actions(s, P, M, V);
    int tmax = n * P;   /* the naive schedule's length, the longest without a deadlock */
    PPAction *acts = malloc(sizeof(PPAction) * (size_t)P * n);      /* [P][2M] */
    PPAction *grid = malloc(sizeof(PPAction) * (size_t)P * tmax);   /* [P][tmax] */
    int *done_f = malloc(sizeof(int) * (size_t)P * M);              /* [P][M] */
    int *done_b = malloc(sizeof(int) * (size_t)P * M);              /* [P][M] */
    int *next = calloc((size_t)P, sizeof(int));                     /* [P] */
    int rc = -1, T = 0, left = P * n;
    if (!acts || !grid || !done_f || !done_b || !next) goto out;
    for (int st = 0; st < P; st++) pp_actions(s, P, M, V, st, acts + st * n);
    for (int i = 0; i < P * M; i++) done_f[i] = done_b[i] = -1;
    for (; left > 0 && T < tmax; T++) {
        int ran = 0;
        for (int st = 0; st < P; st++) {
            PPAction *cell = &grid[st * tmax + T];
            *cell = (PPAction){PP_IDLE, -1, -1};
            if (next[st] == n) continue;
            PPAction a = acts[st * n + next[st]];
            if (!ready(a, st, P, M, done_f, done_b, T)) continue;
            *cell = a;
            (a.kind == PP_FORWARD ? done_f : done_b)[st * M + a.micro] = T;
            next[st]++;
            ran++;
        }
        if (!ran) goto out;   /* nothing can ever run: the schedule deadlocks */
        left -= ran;
    }
    if (left > 0) goto out;
    t->slots = malloc(sizeof(PPAction) * (size_t)P * T);
    if (!t->slots) goto out;
    for (int st = 0; st < P; st++)
        memcpy(t->slots + st * T, grid + st * tmax, sizeof(PPAction) * T);
    t->P = P;
    t->M = M;
    t->V = V;
    t->T = T;
    rc = 0;
out:
    free(acts);
    free(grid);
    free(done_f);
    free(done_b);
    free(next);
    return rc;
}

void pp_timeline_free(PPTimeline *t) {
    free(t->slots);
    memset(t, 0, sizeof *t);
}

static int digits(int x) {
    int d = 1;
    while (x >= 10) x /= 10, d++;
    return d;
}

int pp_bubble_text(PPSchedule s, int P, int M, int V, char *buf, size_t len) {
    double v = pp_bubble_formula(s, P, M, V);
    if (v < 0 || len == 0) return -1;
    if (s == PP_NAIVE) snprintf(buf, len, "(P-1)/P = %d/%d = %.3f", P - 1, P, v);
    else snprintf(buf, len, "(P-1)/(M+P-1) = %d/%d = %.3f", P - 1, M + P - 1, v);
    return 0;
}

int pp_show(FILE *f, PPSchedule s, int P, int M, int V) {
    PPTimeline tl;
    if (pp_timeline(s, P, M, V, &tl) != 0) return -1;
    PPAction *acts = malloc(sizeof(PPAction) * pp_num_actions(s, P, M, V));   /* one stage's actions */
    if (!acts) {
        pp_timeline_free(&tl);
        return -1;
    }
    int T = tl.T;
    int w = 1 + digits(M - 1);                  /* a cell: "F7", "B12" */
    if (digits(T - 1) > w) w = digits(T - 1);   /* wide enough for the ruler too */
    int lw = 6 + digits(P - 1);                 /* "stage 3" */
    fprintf(f, "%s schedule: P = %d stages, M = %d micro-batches, %d time slots "
               "(F and B one slot each)\n", pp_schedule_name(s), P, M, T);
    fprintf(f, "%-*s |", lw, "slot");
    for (int t = 0; t < T; t++) fprintf(f, "%-*d|", w, t);
    fprintf(f, "\n");
    int idle = 0;
    for (int st = 0; st < P; st++) {
        fprintf(f, "stage %-*d |", lw - 6, st);
        for (int t = 0; t < T; t++) {
            PPAction a = tl.slots[st * T + t];
            char cell[16] = "";
            if (a.kind == PP_IDLE) idle++;
            else snprintf(cell, sizeof cell, "%c%d", a.kind == PP_FORWARD ? 'F' : 'B', a.micro);
            fprintf(f, "%-*s|", w, cell);
        }
        fprintf(f, "\n");
    }
    int total = P * T;
    char formula[96];
    pp_bubble_text(s, P, M, V, formula, sizeof formula);
    fprintf(f, "bubble: idle %d of %d slots = %.3f (%s formula %s)\n", idle, total,
            (double)idle / total, pp_schedule_name(s), formula);
    fprintf(f, "in flight (peak micro-batches of activations held):");
    for (int st = 0; st < P; st++) {
        int n = pp_actions(s, P, M, V, st, acts);
        fprintf(f, "%s stage %d: %d", st ? "," : "", st, pp_in_flight_peak(acts, n));
    }
    fprintf(f, "\n");
    free(acts);
    pp_timeline_free(&tl);
    return 0;
}

int pp_sets_in_flight(PPSchedule sched, int P, int M, int V, int stage) {
    int k = pp_num_actions(sched, P, M, V);
    PPAction *acts = k > 0 ? malloc((size_t)k * sizeof(PPAction)) : NULL;
    int n = acts && pp_actions(sched, P, M, V, stage, acts) == k ? pp_in_flight_peak(acts, k) : 0;
    free(acts);
    return n < 1 ? 1 : n;
}

