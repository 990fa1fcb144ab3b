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
 * Two rounds more, from the papers the articles point to:
 *
 *  - Interleaved 1F1B (Narayanan et al. 2021, Megatron-LM, 2.2.2): a stage
 *    holds V chunks of layers (chunk c of stage s is the model's chunk
 *    c*P + s), so a micro-batch goes round the P stages V times. 1F1B runs
 *    over (micro-batch, chunk) pairs, P micro-batches at a time through a
 *    chunk; the fill and the drain still take P-1 slots each, but now of
 *    chunk-sized work, so the bubble is 2P(P-1) idle slots of 2(VM+P-1)P:
 *    (P-1)/(VM+P-1), V times smaller. The price: 2(VP-1) sends a
 *    micro-batch instead of 2(P-1) (V times the p2p traffic) and a deeper
 *    warm-up, min(2(P-s-1) + (V-1)P + 1, MV) chunk sets in flight on stage
 *    s, each 1/V of a stage's activations. M must be a multiple of P.
 *  - Zero bubble (Qi et al. 2023, 3.1): the backward split into B (the
 *    gradient of the input, which the stage before waits for) and W (the
 *    gradient of the weights, which nobody waits for), one slot each.
 *    ZB-H1 holds back W's so that the B's run up the pipe two slots apart
 *    and the held-back W's fill the drain: every stage idles P-1 slots
 *    (the paper's (p-1)(T_F+T_B-T_W) with unit times) instead of 1F1B's
 *    3(P-1) (its backward, B and W together, two slots), the whole step
 *    is 3M+P-1 slots and the bubble
 *    (P-1)/(3M+P-1), with min(P, M) sets in flight on every stage (1F1B's
 *    stage 0: its peak memory). ZB-H2 adds up to P-1 warm-up forwards
 *    (2P-1 on stage 0, the paper's (2p-1) activations) so nothing waits for
 *    the first B, and holds back 2s W's on stage s: each stage works from
 *    its first slot to its last without a gap (the paper's parallelogram,
 *    (p-1)(T_F+T_B-2T_W) = 0). The idle slots do not go away, they move to
 *    the edges: stage s waits s slots to start and stops P-1-s before the
 *    end, and a step that ends with every stage's optimizer waiting for
 *    the others still takes 3M+P-1 slots, the same (P-1)/(3M+P-1) as
 *    ZB-H1 (no order of 3M unit actions can end sooner: the last stage
 *    cannot start before slot P-1). The paper's zero is what the edges
 *    become when one step's drain overlaps the next step's fill, which
 *    needs its optimizer post-validation instead of a synchronous step;
 *    we keep the step synchronous, so here ZB-H2 spends min(2P-1, M) sets
 *    for a gapless row, not for time. With M < P the pipe never fills,
 *    both take 2M+2P-1 slots: (2P-M-1)/(2M+2P-1).
 *
 *   schedule     bubble (unit slots)     in flight on stage s (sets)           p2p a micro-batch
 *   naive        (P-1)/P                 1                                     2(P-1)
 *   gpipe        (P-1)/(M+P-1)           M                                     2(P-1)
 *   1f1b         (P-1)/(M+P-1)           min(P-s, M)                           2(P-1)
 *   interleaved  (P-1)/(VM+P-1)          min(2(P-s-1)+(V-1)P+1, MV) chunks     2(VP-1)
 *   zb-h1        (P-1)/(3M+P-1)          min(P, M)                             2(P-1)
 *   zb-h2        (P-1)/(3M+P-1), 0 in    min(2P-1, M)                          2(P-1)
 *                a stage's busy span
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
 * The timeline is a unit-slot simulation (F, B and W one slot each, one
 * chunk's action one slot, no transfer time), enough to print the figure
 * and to check the schedules' dependencies and bubbles; the real bubble,
 * with real F, B and W times, comes from trace.c.
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

int pp_next_stage(int P, int V, int st, int c, int *nc) {
    *nc = st < P - 1 ? c : c + 1;
    return st < P - 1 ? st + 1 : c < V - 1 ? 0 : -1;
}

int pp_prev_stage(int P, int st, int c, int *pc) {
    *pc = st > 0 ? c : c - 1;
    return st > 0 ? st - 1 : c > 0 ? P - 1 : -1;
}

int pp_send_target(PPAction a, int st, int P, int V, int *chunk) {
    if (a.kind == PP_FORWARD) return pp_next_stage(P, V, st, a.chunk, chunk);
    if (a.kind == PP_BACKWARD) return pp_prev_stage(P, st, a.chunk, chunk);
    *chunk = a.chunk;
    return -1;
}

int pp_schedule_splits(PPSchedule s) { return s == PP_ZBH1 || s == PP_ZBH2; }

int pp_schedule_check(PPSchedule s, int P, int M, int V, char *err, size_t errlen) {
    if (P < 1 || M < 1 || V < 1) {
        snprintf(err, errlen, "a pipeline needs P, M and V >= 1 (got P %d, M %d, V %d)", P, M, V);
        return -1;
    }
    if ((int)s < PP_NAIVE || (int)s > PP_ZBH2) {
        snprintf(err, errlen, "unknown schedule %d", (int)s);
        return -1;
    }
    if (V > 1 && s != PP_INTERLEAVED) {
        snprintf(err, errlen, "--virtual %d needs --schedule interleaved", V);
        return -1;
    }
    if (s == PP_INTERLEAVED && M % P != 0) {
        snprintf(err, errlen, "--schedule interleaved needs the micro-batches (M %d) to be a multiple of "
                 "the stages (P %d)", M, P);
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
static PPAction wgt(int m) { return (PPAction){PP_WEIGHT, m, 0}; }
static int imin(int a, int b) { return a < b ? a : b; }

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
    int warmup = imin(P - 1 - stage, M);
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

/* The k-th (micro-batch, chunk) pair a stage of the interleaved schedule
 * runs forward (k = 0 .. MV-1): groups of P micro-batches go through chunk
 * 0, then the same P through chunk 1, ..., then the next P micro-batches.
 * The backwards take the same pairs in the same order, chunks reversed. */
static PPAction interleaved_pair(PPKind kind, int P, int V, int k) {
    int chunk = (k / P) % V;
    return (PPAction){kind, (k / (P * V)) * P + k % P, kind == PP_FORWARD ? chunk : V - 1 - chunk};
}

/* Megatron's forward_backward_pipelining_with_interleaving: the warm-up of
 * 1F1B over (micro-batch, chunk) pairs is (P - s - 1)*2 + (V - 1)*P
 * forwards (the (V-1)*P fill the other chunks before the first backward
 * comes back round), then one forward one backward, then the cool-down.
 * V = 1 is 1f1b itself (Megatron's doubled warm-up would only hold more). */
static int interleaved_actions(int P, int M, int V, int stage, PPAction *out) {
    if (V == 1) return onef1b_actions(P, M, stage, out);
    int total = M * V;
    int warmup = imin((P - stage - 1) * 2 + (V - 1) * P, total);
    int n = 0;
    for (int k = 0; k < warmup; k++) out[n++] = interleaved_pair(PP_FORWARD, P, V, k);
    for (int k = 0; k < total - warmup; k++) {
        out[n++] = interleaved_pair(PP_FORWARD, P, V, k + warmup);
        out[n++] = interleaved_pair(PP_BACKWARD, P, V, k);
    }
    for (int k = total - warmup; k < total; k++) out[n++] = interleaved_pair(PP_BACKWARD, P, V, k);
    return n;
}

/* The zero-bubble orders: stage s runs `warmup` forwards, then for each
 * backward B b: B b, then the oldest W unless `owed` W's are still held
 * back (W's wait until b >= owed), then the next F if any; the W's still
 * owed close the stage, where 1F1B would sit idle waiting for the last
 * backwards. Sets in flight (F to W) peak at warmup + owed. */
static int zb_actions(int M, int warmup, int owed, PPAction *out) {
    int n = 0, f = 0, w = 0;   /* next forward, next weight gradient */
    while (f < warmup) out[n++] = fwd(f++);
    for (int b = 0; b < M; b++) {
        out[n++] = bwd(b);
        if (b >= owed) out[n++] = wgt(w++);
        if (f < M) out[n++] = fwd(f++);
    }
    while (w < M) out[n++] = wgt(w++);
    return n;
}

/* ZB-H1 (Qi et al. 2023, 3.1, memory efficient): 1F1B's min(P - s, M)
 * warm-up forwards, stage s holding back s W's: its B's then come every
 * two slots instead of three while the pipe drains and the owed W's fill
 * the tail. In flight: min(P, M) on every stage, 1F1B's stage 0. */
static int zbh1_actions(int P, int M, int stage, PPAction *out) {
    return zb_actions(M, imin(P - stage, M), stage, out);
}

/* ZB-H2 (3.1, zero bubble): x = min(P-1, M-P) more warm-up forwards, so
 * stage s runs P - s + min(x, P-1-s) of them (stage 0: up to 2P-1) and the
 * wait for the first B disappears; stage s owes s + x - min(x, P-1-s) W's
 * (2s when x = P-1), which turns the trapezoid into a parallelogram:
 * stage s works without a gap from slot s to 3M + s - 1 once M >= 2P-1.
 * In flight: min(2P-1, M) on every stage. With M < P there is nothing to
 * add (x = 0) and it is ZB-H1. */
static int zbh2_actions(int P, int M, int stage, PPAction *out) {
    int x = M - P < 0 ? 0 : imin(P - 1, M - P);
    int extra = imin(x, P - 1 - stage);
    return zb_actions(M, imin(P - stage + extra, M), stage + x - extra, out);
}

int pp_actions(PPSchedule s, int P, int M, int V, int stage, PPAction *out) {
    if (pp_num_actions(s, P, M, V) < 0 || stage < 0 || stage >= P) return -1;
    switch (s) {
    case PP_NAIVE: return naive_actions(M, out);
    case PP_GPIPE: return gpipe_actions(M, out);
    case PP_1F1B: return onef1b_actions(P, M, stage, out);
    case PP_INTERLEAVED: return interleaved_actions(P, M, V, stage, out);
    case PP_ZBH1: return zbh1_actions(P, M, stage, out);
    case PP_ZBH2: return zbh2_actions(P, M, stage, out);
    }
    return -1;
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
    case PP_INTERLEAVED: return (double)(P - 1) / (V * M + P - 1);
    case PP_ZBH1:
    case PP_ZBH2: {
        int extra = P > M ? P - M : 0;   /* fewer micro-batches than stages: the chain is the span */
        return (double)(P - 1 + extra) / (3 * M + P - 1 + extra);
    }
    }
    return -1;
}

/* Index of action (kind, stage, chunk, micro) in a timeline's done table
 * [3][P][V][M]: the slot it ran in, -1 while not run. */
static int done_at(PPKind kind, int s, int c, int m, int P, int M, int V) {
    return ((kind * P + s) * V + c) * M + m;
}

/* Has what action a on stage s waits for finished in a slot before t?
 * F(s,c,m) waits for the F whose output it takes (pp_prev_stage: F(s-1,c,m),
 * on stage 0 F(P-1,c-1,m), the previous chunk's output wrapping round from
 * the last stage); B(s,c,m) for the B whose input gradient it takes
 * (pp_next_stage: B(s+1,c,m), on the last stage B(0,c+1,m)), or in the
 * model's last chunk for its own F (the loss); W(s,c,m) waits for B(s,c,m)
 * on the same stage. done is the [3][P][V][M] table of done_at. */
static int ready(PPAction a, int s, int P, int M, int V, const int *done, int t) {
    int c = a.chunk, m = a.micro, dep, peer, pc;
    if (a.kind == PP_FORWARD) {
        if ((peer = pp_prev_stage(P, s, c, &pc)) < 0) return 1;
        dep = done[done_at(PP_FORWARD, peer, pc, m, P, M, V)];
    } else if (a.kind == PP_BACKWARD) {
        if ((peer = pp_next_stage(P, V, s, c, &pc)) >= 0) dep = done[done_at(PP_BACKWARD, peer, pc, m, P, M, V)];
        else dep = done[done_at(PP_FORWARD, s, c, m, P, M, V)];
    } else {
        dep = done[done_at(PP_BACKWARD, s, c, m, P, M, V)];
    }
    return dep >= 0 && dep < t;
}

int pp_timeline(PPSchedule s, int P, int M, int V, PPTimeline *t) {
    memset(t, 0, sizeof *t);
    if (pp_bubble_formula(s, P, M, V) < 0) return -1;
    int n = pp_num_actions(s, P, M, V);
    int tmax = n * P;   /* every action of every stage one after another: no schedule is longer */
    PPAction *acts = malloc(sizeof(PPAction) * (size_t)P * n);      /* [P][n] */
    PPAction *grid = malloc(sizeof(PPAction) * (size_t)P * tmax);   /* [P][tmax] */
    int *done = malloc(sizeof(int) * 3 * (size_t)P * V * M);         /* [3][P][V][M] */
    int *next = calloc((size_t)P, sizeof(int));                     /* [P] */
    int rc = -1, T = 0, left = P * n;
    if (!acts || !grid || !done || !next) goto out;
    for (int st = 0; st < P; st++) pp_actions(s, P, M, V, st, acts + st * n);
    for (int i = 0; i < 3 * P * V * M; i++) done[i] = -1;
    for (; left > 0 && T < tmax; T++) {
        int ran = 0;
        for (int st = 0; st < P; st++) {
            PPAction *cell = &grid[st * tmax + T];
            *cell = (PPAction){PP_IDLE, -1, -1};
            if (next[st] == n) continue;
            PPAction a = acts[st * n + next[st]];
            if (!ready(a, st, P, M, V, done, T)) continue;
            *cell = a;
            done[done_at(a.kind, st, a.chunk, a.micro, P, M, V)] = T;
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
    free(done);
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
    switch (s) {
    case PP_NAIVE: snprintf(buf, len, "(P-1)/P = %d/%d = %.3f", P - 1, P, v); break;
    case PP_INTERLEAVED:
        snprintf(buf, len, "(P-1)/(V*M+P-1) = %d/%d = %.3f", P - 1, V * M + P - 1, v);
        break;
    case PP_ZBH1:
    case PP_ZBH2:
        if (M >= P) snprintf(buf, len, "(P-1)/(3M+P-1) = %d/%d = %.3f", P - 1, 3 * M + P - 1, v);
        else snprintf(buf, len, "(2P-M-1)/(2M+2P-1) = %d/%d = %.3f", 2 * P - M - 1, 2 * M + 2 * P - 1, v);
        break;
    default: snprintf(buf, len, "(P-1)/(M+P-1) = %d/%d = %.3f", P - 1, M + P - 1, v); break;
    }
    return 0;
}

int pp_show_title(PPSchedule s, int P, int M, int V, int T, char *buf, size_t len) {
    if (pp_num_actions(s, P, M, V) < 0 || len == 0) return -1;
    if (pp_schedule_splits(s))
        snprintf(buf, len, "%s schedule: P = %d stages, M = %d micro-batches, %d time slots "
                 "(F, B and W one slot each)", pp_schedule_name(s), P, M, T);
    else if (V > 1)
        snprintf(buf, len, "%s schedule: P = %d stages, M = %d micro-batches, V = %d chunks a stage, %d time "
                 "slots (F3.1: micro-batch 3, chunk 1; one slot each)", pp_schedule_name(s),
                 P, M, V, T);
    else
        snprintf(buf, len, "%s schedule: P = %d stages, M = %d micro-batches, %d time slots "
                 "(F and B one slot each)", pp_schedule_name(s), P, M, T);
    return 0;
}

int pp_cell_text(PPAction a, int V, char *buf, size_t len) {
    if (len == 0) return -1;
    if (a.kind == PP_IDLE) {
        buf[0] = '\0';
        return 0;
    }
    char k = a.kind == PP_FORWARD ? 'F' : a.kind == PP_BACKWARD ? 'B' : 'W';
    if (V > 1) snprintf(buf, len, "%c%d.%d", k, a.micro, a.chunk);
    else snprintf(buf, len, "%c%d", k, a.micro);
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
    int w = 1 + digits(M - 1) + (V > 1 ? 1 + digits(V - 1) : 0);   /* a cell: "F7", "B12", "W3", "F3.1" */
    if (digits(T - 1) > w) w = digits(T - 1);                    /* wide enough for the ruler too */
    int lw = 6 + digits(P - 1);                                  /* "stage 3" */
    char line[256];
    pp_show_title(s, P, M, V, T, line, sizeof line);
    fprintf(f, "%s\n", line);
    fprintf(f, "%-*s |", lw, "slot");
    for (int t = 0; t < T; t++) fprintf(f, "%-*d|", w, t);
    fprintf(f, "\n");
    int idle = 0, inside = 0;   /* idle slots; those between a stage's first and last action */
    for (int st = 0; st < P; st++) {
        fprintf(f, "stage %-*d |", lw - 6, st);
        int first = -1, last = -1, row_idle = 0;
        for (int t = 0; t < T; t++) {
            PPAction a = tl.slots[st * T + t];
            char cell[24];
            pp_cell_text(a, V, cell, sizeof cell);
            if (a.kind == PP_IDLE) row_idle++;
            else last = t, first = first < 0 ? t : first;
            fprintf(f, "%-*s|", w, cell);
        }
        idle += row_idle;
        inside += row_idle - first - (T - 1 - last);
        fprintf(f, "\n");
    }
    int total = P * T;
    char formula[96];
    pp_bubble_text(s, P, M, V, formula, sizeof formula);
    fprintf(f, "bubble: idle %d of %d slots = %.3f (%s formula %s)\n", idle, total,
            (double)idle / total, pp_schedule_name(s), formula);
    fprintf(f, "idle between a stage's first and last action: %d slots (the rest is the pipe filling and "
               "draining%s)\n", inside, inside == 0 && idle > 0 ? ": zero bubble once a step's drain overlaps "
               "the next one's fill" : "");
    fprintf(f, "in flight (peak activation sets held, F to %s%s):", pp_schedule_splits(s) ? "W" : "B",
            V > 1 ? "; a set is one micro-batch through one chunk" : "");
    for (int st = 0; st < P; st++) {
        int n = pp_actions(s, P, M, V, st, acts);
        fprintf(f, "%s stage %d: %d", st ? "," : "", st, pp_in_flight_peak(acts, n));
    }
    fprintf(f, "\n");
    if (V > 1)
        fprintf(f, "p2p per micro-batch: 2(VP-1) = %d sends (stage %d wraps to stage 0), %.2f times 1f1b's "
                   "2(P-1) = %d, about V\n", 2 * (V * P - 1), P - 1, P > 1 ? (double)(V * P - 1) / (P - 1) : 0.0,
                2 * (P - 1));
    else
        fprintf(f, "p2p per micro-batch: 2(P-1) = %d sends (activations down, gradients up)\n", 2 * (P - 1));
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

