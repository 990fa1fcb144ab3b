/* pp.c: running a pipeline schedule on one stage (流水线并行).
 *
 * auto-parallel-partitioning.txt, 3.2 流水线并行: pp_sched.c decides the
 * order of each stage's forwards and backwards; this file carries them out
 * with the model (gpt.c) and the pp group's point-to-point operations.
 */
#include <stdlib.h>
#include <string.h>
#include "pp.h"

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
    if (pp_actions(sched, s->P, M, 1, s->stage, s->actions) != 2 * M) {
        snprintf(err, errlen, "no %s schedule for %d stages and %d micro-batches",
                 pp_schedule_name(sched), s->P, M);
        return -1;
    }
    s->nsets = pp_sets_in_flight(sched, s->P, M, 1, s->stage);
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
