/* pp.c: running a pipeline schedule on one stage (流水线并行).
 *
 * auto-parallel-partitioning.txt, 3.2 流水线并行: pp_sched.c decides the
 * order of each stage's forwards and backwards; this file carries them out
 * with the model (gpt.c) and the pp group's point-to-point operations. The
 * same code runs every schedule: naive, GPipe, 1F1B, Megatron's interleaved
 * 1F1B (V chunks a stage, the last stage's chunk c feeding stage 0's chunk
 * c+1) and the zero-bubble ZB-H1 and ZB-H2 (each backward split into B, the
 * input gradient the previous stage waits for, and W, the weight gradients,
 * run later from what B stashed).
 *
 * What an action does:
 *   F(m,c)  takes an activation set; receives chunk c's input from the stage
 *           before (stage 0's chunk 0 embeds its tokens instead; stage 0's
 *           chunk c > 0 gets the last stage's chunk c-1); runs chunk c's
 *           layers; its output goes on later (the last stage's last chunk
 *           takes the loss instead);
 *   B(m,c)  receives the gradient of chunk c's output (the last chunk on the
 *           last stage starts from the loss); runs the chunk's layers
 *           backward, whole, or only their input gradient when the schedule
 *           splits the backward; the input's gradient goes back later
 *           (stage 0's chunk 0 ends in the embedding); gives the set back
 *           unless a W is still to come;
 *   W(m,c)  the weight gradients of chunk c's layers, from the set's stash;
 *           gives the set back.
 *
 * When messages go: in rounds. pp_build places every stage's actions in the
 * schedule's unit-slot timeline (pp_timeline: the same on every stage) and
 * gives each message a round, the slot of the action that waits for it.
 * Before its action of slot t each stage runs round t: one batch
 * (comm_p2p_begin/end) of the sends whose consumer runs at t and the receive
 * its own action at t needs. Both ends of every message are in the same
 * round of their stages, and a stage only waits inside a batch, for the
 * other ends of that round's messages; by induction on the round no
 * arrangement of stages, chunks or split backwards can deadlock, however
 * far apart a message's two ends are in the schedule. Until its round an F's
 * output stays in its set (given back only by a later B, which waits for the
 * consumer's F), a B's input gradient in a buffer of its own (m->dx serves
 * the next B at once).
 */
#include <stdlib.h>
#include <string.h>
#include "pp.h"
#include "safe.h"
#include "tp.h"

/* ---------------------------------------------------------------------------
 * The plan: which stage and chunk each message goes between (pp_sched.h's
 * pp_next_stage and pp_prev_stage, the one home of that rule), and when. */

/* [3][P][V][M]: the timeline slot of every action of every stage. */
static int *timeline_slots(const PPTimeline *tl) {
    int P = tl->P, V = tl->V, M = tl->M;
    int *at = malloc(sizeof(int) * 3 * (size_t)P * V * M);
    if (!at) return NULL;
    for (int st = 0; st < P; st++)
        for (int t = 0; t < tl->T; t++) {
            PPAction a = tl->slots[st * tl->T + t];
            if (a.kind != PP_IDLE) at[((a.kind * P + st) * V + a.chunk) * M + a.micro] = t;
        }
    return at;
}

/* Whether an action of this stage uses the head's set (the last chunk of the last stage). */
static int head_set(const PPStage *s, PPAction a) { return s->m->has_head && a.chunk == s->V - 1; }

int pp_stage_sets(PPSchedule sched, int P, int M, int V, int stage, int *head_sets, int *other_sets) {
    int n = pp_num_actions(sched, P, M, V), k[2] = {0, 0};
    PPAction *acts = n > 0 ? malloc(sizeof(PPAction) * (size_t)n) : NULL;
    PPAction *part = n > 0 ? malloc(sizeof(PPAction) * (size_t)n) : NULL;
    if (!acts || !part || pp_actions(sched, P, M, V, stage, acts) != n || stage < 0 || stage >= P) {
        free(acts);
        free(part);
        return -1;
    }
    for (int head = 0; head <= 1; head++) {
        int np = 0;
        for (int i = 0; i < n; i++)
            if ((stage == P - 1 && acts[i].chunk == V - 1) == head) part[np++] = acts[i];
        k[head] = pp_in_flight_peak(part, np);
    }
    /* at least one set: acts[0], which pp_forward uses, is the head's on the last stage */
    if (stage == P - 1 && k[1] < 1) k[1] = 1;
    if (stage < P - 1 && k[0] < 1) k[0] = 1;
    *head_sets = k[1];
    *other_sets = k[0];
    free(acts);
    free(part);
    return 0;
}

/* Input gradients of B waiting for their round at once, at most. */
static int grad_bufs_needed(const PPStage *s) {
    int live = 0, peak = 0, ns = 0, i = 0;
    for (int t = 0; t < s->nslots; t++) {
        for (; ns < s->nsends && s->steps[s->send_order[ns]].send_slot == t; ns++)
            if (s->steps[s->send_order[ns]].act.kind == PP_BACKWARD) live--;
        if (i < s->nsteps && s->steps[i].slot == t) {
            if (s->steps[i].act.kind == PP_BACKWARD && s->steps[i].send_peer >= 0 && ++live > peak) peak = live;
            i++;
        }
    }
    return peak;
}

/* The steps of this stage from the timeline. Returns 0, or -1 with err. */
static int make_plan(PPStage *s, const PPTimeline *tl, char *err, size_t errlen) {
    int P = s->P, V = s->V, M = s->M, st = s->stage;
    int *at = timeline_slots(tl);
    PPAction *acts = malloc(sizeof(PPAction) * (size_t)s->nsteps);
    if (!at || !acts) {
        free(at);
        free(acts);
        snprintf(err, errlen, "out of memory planning the pipeline");
        return -1;
    }
    pp_actions(s->sched, P, M, V, st, acts);
#define SLOT(kind, stage, c, m) at[(((kind) * P + (stage)) * V + (c)) * M + (m)]
    for (int i = 0; i < s->nsteps; i++) {
        PPAction a = acts[i];
        PPStep *p = &s->steps[i];
        int pc, nc, prev = pp_prev_stage(P, st, a.chunk, &pc), next = pp_next_stage(P, V, st, a.chunk, &nc);
        *p = (PPStep){a, SLOT(a.kind, st, a.chunk, a.micro), -1, -1, -1, 0};
        if (a.kind == PP_FORWARD) {
            p->recv_peer = prev;
            p->send_peer = next;
            if (next >= 0) p->send_slot = SLOT(PP_FORWARD, next, nc, a.micro);
        } else if (a.kind == PP_BACKWARD) {
            p->recv_peer = next;
            p->send_peer = prev;
            if (prev >= 0) p->send_slot = SLOT(PP_BACKWARD, prev, pc, a.micro);
        }
    }
    /* the last B and the last W of each chunk */
    for (int i = 0; i < s->nsteps; i++) {
        PPAction a = s->steps[i].act;
        s->steps[i].last = a.kind != PP_FORWARD;
        for (int j = i + 1; j < s->nsteps && s->steps[i].last; j++)
            if (s->steps[j].act.kind == a.kind && s->steps[j].act.chunk == a.chunk) s->steps[i].last = 0;
    }
    /* the sends by round */
    for (int t = 0; t < s->nslots; t++)
        for (int i = 0; i < s->nsteps; i++)
            if (s->steps[i].send_peer >= 0 && s->steps[i].send_slot == t) s->send_order[s->nsends++] = i;
    /* an F's output is sent from its set: the set must still be held then */
    int rc = 0, split = pp_schedule_splits(s->sched);
    for (int i = 0; i < s->nsteps && !rc; i++) {
        PPAction a = acts[i];
        if (a.kind != PP_FORWARD || s->steps[i].send_peer < 0) continue;
        int back = SLOT(split ? PP_WEIGHT : PP_BACKWARD, st, a.chunk, a.micro);
        if (s->steps[i].send_slot >= back) {
            snprintf(err, errlen, "%s schedule: stage %d gives back micro-batch %d's set before sending it",
                     pp_schedule_name(s->sched), st, a.micro);
            rc = -1;
        }
    }
#undef SLOT
    free(at);
    free(acts);
    return rc;
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
    s->V = m->nchunks;
    s->B = B;
    s->T = T;
    s->sched = sched;
    s->trace = trace;
    if (pp_schedule_check(sched, s->P, M, s->V, err, errlen) != 0) return -1;
    PPTimeline tl;
    if (pp_timeline(sched, s->P, M, s->V, &tl) != 0) {
        snprintf(err, errlen, "no %s timeline for %d stages, %d micro-batches and %d chunks a stage",
                 pp_schedule_name(sched), s->P, M, s->V);
        return -1;
    }
    s->nslots = tl.T;
    s->nsteps = pp_num_actions(sched, s->P, M, s->V);
    s->steps = calloc(s->nsteps, sizeof(PPStep));
    s->send_order = calloc(s->nsteps, sizeof(int));
    s->grad_of = malloc(sizeof(int) * s->nsteps);
    s->out = calloc(s->nsteps, sizeof(void *));
    s->set_of = malloc(sizeof(int) * (size_t)s->V * M);
    int rc = s->steps && s->send_order && s->grad_of && s->out && s->set_of ? make_plan(s, &tl, err, errlen) : -1;
    pp_timeline_free(&tl);
    if (rc != 0) return -1;
    for (int i = 0; i < s->nsteps; i++) s->grad_of[i] = -1;
    for (int i = 0; i < s->V * M; i++) s->set_of[i] = -1;
    /* the head's sets first: acts[0] serves pp_forward on every stage */
    int head, rest;
    pp_stage_sets(sched, s->P, M, s->V, s->stage, &head, &rest);
    s->nhead_sets = head;
    s->nsets = head + rest;
    s->acts = safe_calloc(s->nsets, sizeof(GPTActs *), "the pipeline's activation sets");
    s->set_busy = safe_calloc(s->nsets, sizeof(int), "the pipeline's activation sets");
    for (int i = 0; i < s->nsets; i++) s->acts[i] = gpt_acts_build_part(m, B, T, i < head);
    s->ngrad_bufs = grad_bufs_needed(s);
    s->grad_bufs = safe_calloc(s->ngrad_bufs + 1, sizeof(void *), "the pipeline's gradient buffers");
    s->grad_busy = safe_calloc(s->ngrad_bufs + 1, sizeof(int), "the pipeline's gradient buffers");
    for (int i = 0; i < s->ngrad_bufs; i++)
        s->grad_bufs[i] = dev_alloc(dev, (size_t)s->acts[0]->rows * m->cfg.dim * m->esz);
    return 0;
}

void pp_free(PPStage *s) {
    /* the gradient buffers' size is read from acts[0]: freed before the sets */
    for (int i = 0; i < s->ngrad_bufs; i++)
        dev_free(s->dev, s->grad_bufs[i], (size_t)s->acts[0]->rows * s->m->cfg.dim * s->m->esz);
    for (int i = 0; i < s->nsets; i++) gpt_acts_free(s->m, s->acts[i]);
    free(s->acts);
    free(s->set_busy);
    free(s->set_of);
    free(s->grad_bufs);
    free(s->grad_busy);
    free(s->grad_of);
    free(s->out);
    free(s->steps);
    free(s->send_order);
    memset(s, 0, sizeof *s);
}

size_t pp_acts_bytes(const PPStage *s) {
    size_t b = 0;
    for (int i = 0; i < s->nsets; i++) b += s->acts[i]->bytes;
    return b;
}

size_t pp_stash_bytes(const PPStage *s) {
    size_t b = 0;
    for (int i = 0; i < s->nsets; i++) b += s->acts[i]->stash_bytes;
    return b;
}

/* ---------------------------------------------------------------------------
 * Running the plan. */

/* One message of a round: a buffer and the stage at the other end. */
typedef struct PPXfer {
    const void *buf;
    int peer;
} PPXfer;

/* One round: the sends and the receive (if any) in one batch, n elements each. */
static void exchange(PPStage *s, const PPXfer *sends, int nsend, void *recv_buf, int recv_peer, size_t n) {
    if (!nsend && !recv_buf) return;
    trace_begin(s->trace, recv_buf ? "recv" : "send", "comm");
    comm_p2p_begin(s->g->comm);
    /* activations and their gradients travel in the dev's dtype */
    CommDtype t = s->dev->dtype == DT_BF16 ? COMM_BF16 : COMM_F32;
    for (int k = 0; k < nsend; k++) comm_send(s->g, s->dev, sends[k].buf, n, t, sends[k].peer);
    if (recv_buf) comm_recv(s->g, s->dev, recv_buf, n, t, recv_peer);
    comm_op_wait(comm_p2p_end(s->g->comm), s->dev);
    trace_end(s->trace);
}

/* Elements of the residual stream one stage hands the next for B x T tokens:
 * this rank's rows (all B*T, or B*T/tp with sequence parallelism) of C. */
static size_t stream_floats(const PPStage *s, int B, int T) {
    return (size_t)tp_stream_rows(s->m, B * T) * s->m->cfg.dim;
}

static int first_chunk(const PPStage *s, int c) { return s->stage == 0 && c == 0; }
static int last_chunk(const PPStage *s, int c) { return s->stage == s->P - 1 && c == s->V - 1; }

/* A free set of the kind action a takes, now held by (a.chunk, a.micro). */
static GPTActs *take_set(PPStage *s, PPAction a) {
    int lo = head_set(s, a) ? 0 : s->nhead_sets, hi = head_set(s, a) ? s->nhead_sets : s->nsets;
    for (int i = lo; i < hi; i++)
        if (!s->set_busy[i]) {
            s->set_busy[i] = 1;
            s->set_of[a.chunk * s->M + a.micro] = i;
            return s->acts[i];
        }
    fprintf(stderr, "error: pipeline stage %d: no free activation set for micro-batch %d, chunk %d\n",
            s->stage, a.micro, a.chunk);
    exit(1);
}

static void give_back_set(PPStage *s, PPAction a) {
    int *i = &s->set_of[a.chunk * s->M + a.micro];
    s->set_busy[*i] = 0;
    *i = -1;
}

/* m->dx (an input gradient) copied to a free buffer, to wait there for its round. */
static int hold_grad(PPStage *s, size_t n) {
    for (int k = 0; k < s->ngrad_bufs; k++)
        if (!s->grad_busy[k]) {
            s->grad_busy[k] = 1;
            dev_copy(s->dev, s->grad_bufs[k], s->m->dx, n * s->m->esz);
            return k;
        }
    fprintf(stderr, "error: pipeline stage %d: no free buffer for an input gradient\n", s->stage);
    exit(1);
}

/* Step i: its set (taken at F), and the buffer its round's receive fills. */
static GPTActs *prepare(PPStage *s, int i, const PPCallbacks *cb, void **recv_buf) {
    PPAction a = s->steps[i].act;
    GPTActs *set;
    if (a.kind == PP_FORWARD) {
        set = take_set(s, a);
        if (first_chunk(s, a.chunk) || last_chunk(s, a.chunk)) cb->batch(cb->ctx, a.micro, set);
    } else {
        set = s->acts[s->set_of[a.chunk * s->M + a.micro]];
    }
    *recv_buf = NULL;
    if (s->steps[i].recv_peer >= 0) *recv_buf = a.kind == PP_FORWARD ? set->x_in : s->m->dx;
    return set;
}

/* Step i's computation, after its round. Returns its loss (the last chunk of the last stage). */
static double run_step(PPStage *s, int i, GPTActs *a, float dloss, const PPCallbacks *cb) {
    GPT *m = s->m;
    PPStep *st = &s->steps[i];
    PPAction act = st->act;
    int c = act.chunk, B = s->B, T = s->T, split = pp_schedule_splits(s->sched);
    char name[32];
    char k = act.kind == PP_FORWARD ? 'F' : act.kind == PP_BACKWARD ? 'B' : 'W';
    if (s->V > 1) snprintf(name, sizeof name, "%c%dc%d", k, act.micro, c);
    else snprintf(name, sizeof name, "%c%d", k, act.micro);
    double loss = 0;
    if (act.kind == PP_FORWARD) {
        trace_begin(s->trace, name, "forward");
        if (first_chunk(s, c)) gpt_embed_forward(m, a, B, T);
        s->out[i] = gpt_chunk_forward(m, a, c, B, T);
        if (last_chunk(s, c)) loss = gpt_head_forward(m, a, B, T, dloss);
    } else if (act.kind == PP_BACKWARD) {
        cb->before_backward(cb->ctx, act.micro, st->last);
        trace_begin(s->trace, name, "backward");
        if (last_chunk(s, c)) gpt_head_backward(m, a, B, T);
        if (split) gpt_chunk_backward_input(m, a, c, B, T);
        else gpt_chunk_backward(m, a, c, B, T);
        if (st->send_peer >= 0) {
            s->grad_of[i] = hold_grad(s, stream_floats(s, B, T));
            s->out[i] = s->grad_bufs[s->grad_of[i]];
        }
        if (first_chunk(s, c)) gpt_embed_backward(m, a, B, T);
        if (!split) give_back_set(s, act);
    } else {
        cb->before_backward(cb->ctx, act.micro, st->last);
        trace_begin(s->trace, name, "backward");
        gpt_chunk_backward_weights(m, a, c, B, T);
        give_back_set(s, act);
    }
    trace_end(s->trace);
    return loss;
}

double pp_run(PPStage *s, float dloss, const PPCallbacks *cb) {
    double loss = 0;
    size_t n = stream_floats(s, s->B, s->T);
    PPXfer sends[COMM_MAX_BATCH];
    int next = 0, ns = 0;   /* the next step to run, the next send */
    for (int t = 0; t < s->nslots; t++) {
        /* round t: the outputs whose consumers run at t, and this stage's receive */
        int nsend = 0, sent0 = ns;
        for (; ns < s->nsends && s->steps[s->send_order[ns]].send_slot == t; ns++)
            sends[nsend++] = (PPXfer){s->out[s->send_order[ns]], s->steps[s->send_order[ns]].send_peer};
        int i = next < s->nsteps && s->steps[next].slot == t ? next : -1;
        void *recv_buf = NULL;
        GPTActs *a = i >= 0 ? prepare(s, i, cb, &recv_buf) : NULL;
        exchange(s, sends, nsend, recv_buf, i >= 0 ? s->steps[i].recv_peer : -1, n);
        for (int k = sent0; k < ns; k++) {
            int *g = &s->grad_of[s->send_order[k]];
            if (*g >= 0) s->grad_busy[*g] = 0;
            *g = -1;
        }
        if (i >= 0) {
            loss += run_step(s, i, a, dloss, cb);
            next++;
        }
    }
    return loss;
}

double pp_forward(PPStage *s, GPTActs *a, int B, int T, int with_loss) {
    GPT *m = s->m;
    size_t n = stream_floats(s, B, T);
    PPXfer out = {NULL, -1};   /* the last chunk's output, sent with the next receive */
    for (int c = 0; c < s->V; c++) {
        int pc, nc, prev = pp_prev_stage(s->P, s->stage, c, &pc);
        if (first_chunk(s, c)) gpt_embed_forward(m, a, B, T);
        else exchange(s, &out, out.buf != NULL, a->x_in, prev, n);
        out.buf = NULL;
        void *y = gpt_chunk_forward(m, a, c, B, T);
        if (!last_chunk(s, c)) out = (PPXfer){y, pp_next_stage(s->P, s->V, s->stage, c, &nc)};
    }
    exchange(s, &out, out.buf != NULL, NULL, -1, n);
    if (!m->has_head) return 0;
    if (!with_loss) {
        gpt_head_logits(m, a, B, T);
        return 0;
    }
    return gpt_head_forward(m, a, B, T, 0.0f);
}
