/* pp.c: pipeline schedules, their timeline and the articles' figure of them.
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
#include "pp.h"

int pp_schedule_parse(const char *s) {
    if (!s) return -1;
    if (!strcmp(s, "naive")) return PP_NAIVE;
    if (!strcmp(s, "gpipe")) return PP_GPIPE;
    if (!strcmp(s, "1f1b")) return PP_1F1B;
    return -1;
}

const char *pp_schedule_name(PPSchedule s) {
    switch (s) {
    case PP_NAIVE: return "naive";
    case PP_GPIPE: return "gpipe";
    case PP_1F1B: return "1f1b";
    }
    return "?";
}

static PPAction fwd(int m) { return (PPAction){PP_FORWARD, m}; }
static PPAction bwd(int m) { return (PPAction){PP_BACKWARD, m}; }

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

int pp_actions(PPSchedule s, int P, int M, int stage, PPAction *out) {
    if (P < 1 || M < 1 || stage < 0 || stage >= P) return -1;
    switch (s) {
    case PP_NAIVE: return naive_actions(M, out);
    case PP_GPIPE: return gpipe_actions(M, out);
    case PP_1F1B: return onef1b_actions(P, M, stage, out);
    }
    return -1;
}

int pp_in_flight_peak(const PPAction *acts, int n) {
    int now = 0, peak = 0;
    for (int i = 0; i < n; i++) {
        if (acts[i].kind == PP_FORWARD) now++;
        else if (acts[i].kind == PP_BACKWARD) now--;
        if (now > peak) peak = now;
    }
    return peak;
}

double pp_bubble_formula(PPSchedule s, int P, int M) {
    if (P < 1 || M < 1) return -1;
    switch (s) {
    case PP_NAIVE: return (double)(P - 1) / P;
    case PP_GPIPE:
    case PP_1F1B: return (double)(P - 1) / (M + P - 1);
    }
    return -1;
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

int pp_timeline(PPSchedule s, int P, int M, PPTimeline *t) {
    memset(t, 0, sizeof *t);
    if (pp_bubble_formula(s, P, M) < 0) return -1;
    int n = 2 * M;
    int tmax = n * P;   /* the naive schedule's length, the longest without a deadlock */
    PPAction *acts = malloc(sizeof(PPAction) * (size_t)P * n);      /* [P][2M] */
    PPAction *grid = malloc(sizeof(PPAction) * (size_t)P * tmax);   /* [P][tmax] */
    int *done_f = malloc(sizeof(int) * (size_t)P * M);              /* [P][M] */
    int *done_b = malloc(sizeof(int) * (size_t)P * M);              /* [P][M] */
    int *next = calloc((size_t)P, sizeof(int));                     /* [P] */
    int rc = -1, T = 0, left = P * n;
    if (!acts || !grid || !done_f || !done_b || !next) goto out;
    for (int st = 0; st < P; st++) pp_actions(s, P, M, st, acts + st * n);
    for (int i = 0; i < P * M; i++) done_f[i] = done_b[i] = -1;
    for (; left > 0 && T < tmax; T++) {
        int ran = 0;
        for (int st = 0; st < P; st++) {
            PPAction *cell = &grid[st * tmax + T];
            *cell = (PPAction){PP_IDLE, -1};
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

int pp_bubble_text(PPSchedule s, int P, int M, char *buf, size_t len) {
    double v = pp_bubble_formula(s, P, M);
    if (v < 0 || len == 0) return -1;
    if (s == PP_NAIVE) snprintf(buf, len, "(P-1)/P = %d/%d = %.3f", P - 1, P, v);
    else snprintf(buf, len, "(P-1)/(M+P-1) = %d/%d = %.3f", P - 1, M + P - 1, v);
    return 0;
}

int pp_show(FILE *f, PPSchedule s, int P, int M) {
    PPTimeline tl;
    if (pp_timeline(s, P, M, &tl) != 0) return -1;
    PPAction *acts = malloc(sizeof(PPAction) * 2 * M);   /* [2M], one stage's actions */
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
    pp_bubble_text(s, P, M, formula, sizeof formula);
    fprintf(f, "bubble: idle %d of %d slots = %.3f (%s formula %s)\n", idle, total,
            (double)idle / total, pp_schedule_name(s), formula);
    fprintf(f, "in flight (peak micro-batches of activations held):");
    for (int st = 0; st < P; st++) {
        int n = pp_actions(s, P, M, st, acts);
        fprintf(f, "%s stage %d: %d", st ? "," : "", st, pp_in_flight_peak(acts, n));
    }
    fprintf(f, "\n");
    free(acts);
    pp_timeline_free(&tl);
    return 0;
}

/* ---------------------------------------------------------------------------
 * Running the schedule (流水线并行): a forward receives the previous stage's
 * activations (stage 0 embeds its tokens instead), runs this stage's layers
 * and sends the result on (the last stage takes the loss); a backward
 * receives the next stage's gradient (the last stage starts from the loss),
 * runs the layers backward and sends the input's gradient back (stage 0
 * ends in the embedding). Each send waits and goes out in one batch with
 * the stage's next receive: after a forward that is Megatron's
 * send-forward-recv-backward, after a backward send-backward-recv-forward;
 * a batch completes in any order, so no arrangement of stages deadlocks. */

int pp_sets_in_flight(PPSchedule sched, int P, int M, int stage) {
    PPAction *acts = malloc(2 * (size_t)M * sizeof(PPAction));
    int n = acts && pp_actions(sched, P, M, stage, acts) == 2 * M ? pp_in_flight_peak(acts, 2 * M) : 0;
    free(acts);
    return n < 1 ? 1 : n;
}

int pp_build(PPStage *s, GPT *m, CommGroup *g, Dev *dev, PPSchedule sched, int M, int B, int T,
             Trace *trace, char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    s->m = m;
    s->g = g;
    s->dev = dev;
    s->P = g->size;
    s->stage = g->index;
    s->M = M;
    s->sched = sched;
    s->trace = trace;
    s->actions = malloc(2 * (size_t)M * sizeof(PPAction));
    if (pp_actions(sched, s->P, M, s->stage, s->actions) != 2 * M) {
        snprintf(err, errlen, "no %s schedule for %d stages and %d micro-batches",
                 pp_schedule_name(sched), s->P, M);
        return -1;
    }
    s->nsets = pp_sets_in_flight(sched, s->P, M, s->stage);
    s->acts = calloc(s->nsets, sizeof(GPTActs *));
    for (int i = 0; i < s->nsets; i++) s->acts[i] = gpt_acts_build(m, B, T);
    return 0;
}

void pp_free(PPStage *s) {
    for (int i = 0; i < s->nsets; i++) gpt_acts_free(s->m, s->acts[i]);
    free(s->acts);
    free(s->actions);
    memset(s, 0, sizeof *s);
}

size_t pp_acts_bytes(const PPStage *s) {
    size_t b = 0;
    for (int i = 0; i < s->nsets; i++) b += s->acts[i]->bytes;
    return b;
}

/* Sends out the waiting send, with the receive (if any) in the same batch. */
static void exchange(PPStage *s, void *recv_buf, size_t recv_n, int recv_peer) {
    if (!s->send_buf && !recv_buf) return;
    trace_begin(s->trace, recv_buf ? "recv" : "send", "comm");
    comm_p2p_begin(s->g->comm);
    /* activations and their gradients travel in the dev's dtype */
    CommDtype t = s->dev->dtype == DT_BF16 ? COMM_BF16 : COMM_F32;
    if (s->send_buf) comm_send(s->g, s->dev, s->send_buf, s->send_n, t, s->send_peer);
    if (recv_buf) comm_recv(s->g, s->dev, recv_buf, recv_n, t, recv_peer);
    comm_op_wait(comm_p2p_end(s->g->comm), s->dev);
    trace_end(s->trace);
    s->send_buf = NULL;
}

static void defer_send(PPStage *s, const void *buf, size_t n, int peer) {
    if (s->send_buf) exchange(s, NULL, 0, 0);
    s->send_buf = buf;
    s->send_n = n;
    s->send_peer = peer;
}

/* Elements of the residual stream one stage hands the next for B x T tokens:
 * this rank's rows (all B*T, or B*T/tp with sequence parallelism) of C. */
static size_t stream_floats(const PPStage *s, int B, int T) {
    const GPT *m = s->m;
    size_t rows = m->tpc.sp ? (size_t)B * T / m->tp : (size_t)B * T;
    return rows * m->cfg.dim;
}

static double forward(PPStage *s, GPTActs *a, int B, int T, float dloss, int with_loss) {
    GPT *m = s->m;
    size_t n = stream_floats(s, B, T);
    if (s->stage == 0) gpt_embed_forward(m, a, B, T);
    else exchange(s, a->x_in, n, s->stage - 1);
    void *out = gpt_layers_forward(m, a, B, T);
    if (s->stage < s->P - 1) {
        defer_send(s, out, n, s->stage + 1);
        return 0;
    }
    if (!with_loss) {
        gpt_head_logits(m, a, B, T);
        return 0;
    }
    return gpt_head_forward(m, a, B, T, dloss);
}

static void backward(PPStage *s, GPTActs *a, int B, int T) {
    GPT *m = s->m;
    size_t n = stream_floats(s, B, T);
    /* two backwards in a row: the first's gradient leaves before m->dx is reused */
    if (s->send_buf == m->dx) exchange(s, NULL, 0, 0);
    if (s->stage == s->P - 1) gpt_head_backward(m, a, B, T);
    else exchange(s, m->dx, n, s->stage + 1);
    gpt_layers_backward(m, a, B, T);
    if (s->stage > 0) defer_send(s, m->dx, n, s->stage - 1);
    else gpt_embed_backward(m, a, B, T);
}

double pp_run(PPStage *s, float dloss, const PPCallbacks *cb) {
    double loss = 0;
    char name[16];
    for (int i = 0; i < 2 * s->M; i++) {
        PPAction act = s->actions[i];
        GPTActs *a = s->acts[act.micro % s->nsets];
        snprintf(name, sizeof name, "%c%d", act.kind == PP_FORWARD ? 'F' : 'B', act.micro);
        if (act.kind == PP_FORWARD) {
            cb->batch(cb->ctx, act.micro, a);
            trace_begin(s->trace, name, "forward");
            loss += forward(s, a, a->B, a->T, dloss, 1);
        } else {
            cb->before_backward(cb->ctx, act.micro, act.micro == s->M - 1);
            trace_begin(s->trace, name, "backward");
            backward(s, a, a->B, a->T);
        }
        trace_end(s->trace);
    }
    exchange(s, NULL, 0, 0);  /* the last send */
    return loss;
}

double pp_forward(PPStage *s, GPTActs *a, int B, int T, int with_loss) {
    double loss = forward(s, a, B, T, 0.0f, with_loss);
    exchange(s, NULL, 0, 0);
    return loss;
}
