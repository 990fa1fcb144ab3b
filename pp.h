/* pp.h: running a pipeline schedule on one stage (pp.c).
 *
 * The articles' inter-layer split (auto-parallel-partitioning.txt, 3.2
 * 流水线并行; hybrid-parallelism.txt's DP+PP): the L layers sit on P stages
 * and the batch is cut into M micro-batches. pp_sched.h says in what order
 * each stage runs its forwards and backwards (and weight passes, and on
 * which chunk); this module runs them with the model and the pp group's
 * sends and receives.
 */
#ifndef PP_H
#define PP_H

#include <stdio.h>
#include "comm.h"
#include "gpt.h"
#include "pp_sched.h"
#include "trace.h"

/* ---- running a schedule on one stage ------------------------------------ */

/* Called by pp_run: fill micro-batch `micro`'s tokens and targets into a
 * (before the forwards that read them: chunk 0 on stage 0, the last chunk on
 * the last stage); and before each backward, and each W of a split backward,
 * of micro-batch `micro`. last: no later action of this stage writes the
 * gradients this one writes (those of its chunk's units; dp.c reduces them
 * then, gpt_unit_writer says which units those are). */
typedef struct PPCallbacks {
    void *ctx;
    void (*batch)(void *ctx, int micro, GPTActs *a);
    void (*before_backward)(void *ctx, int micro, int last);
} PPCallbacks;

/* One action of this stage in the plan pp_build makes from the schedule's
 * timeline: when it runs, what it receives first, and when (in which
 * round) its output goes to the stage that waits for it. */
typedef struct PPStep {
    PPAction act;
    int slot;              /* its time slot in pp_timeline */
    int recv_peer;         /* the stage it receives its input from, -1: none */
    int send_peer;         /* the stage its output goes to, -1: none */
    int send_slot;         /* the slot of the action that waits for it: it goes out in that round */
    int last;              /* B or W: the last of its kind and chunk here (PPCallbacks' last) */
} PPStep;

typedef struct PPStage {
    GPT *m;
    CommGroup *g;          /* the pp group: stage = g->index, P = g->size */
    Dev *dev;
    int P, stage, M, V;    /* V: chunks a stage (1 but for interleaved) */
    int B, T;              /* a micro-batch */
    PPSchedule sched;
    int nsteps;
    PPStep *steps;         /* [nsteps] this stage's actions in schedule order */
    int *send_order;       /* [nsteps] the steps that send, by send_slot */
    int nsends;
    int nslots;            /* the timeline's length: rounds of pp_run */
    /* activation sets: taken at F, given back at B (at W when split). The
     * last stage's last chunk takes a set with the head's buffers; the rest
     * take sets without (the logits are the largest buffer there is) */
    int nsets;             /* head sets first, then the others */
    int nhead_sets;
    GPTActs **acts;        /* [nsets] */
    int *set_busy;         /* [nsets] */
    int *set_of;           /* [V*M] the set (chunk c, micro m) holds now, [c*M + m], -1 */
    /* input gradients made by a B, held until their round (m->dx is reused at once) */
    int ngrad_bufs;
    void **grad_bufs;      /* [ngrad_bufs], [rows,C] each */
    int *grad_busy;        /* [ngrad_bufs] */
    int *grad_of;          /* [nsteps] the buffer holding step i's output, -1 */
    const void **out;      /* [nsteps] step i's output until its round: in its set (F), a buffer (B) */
    Trace *trace;
} PPStage;

/* The activation sets stage `stage` of P allocates (pp_build, and the
 * planner): *head_sets with the head's buffers (the last stage's last
 * chunk's: the logits are the largest buffer there is, and only that chunk
 * needs them), *other_sets without; each the peak in flight of the actions
 * that use it (pp_in_flight_peak), at least one set in all. Their sum is
 * pp_sets_in_flight but on an interleaved last stage, where the two kinds
 * peak apart (one set more, or so). Returns 0, or -1 for a schedule
 * pp_schedule_check refuses. */
int pp_stage_sets(PPSchedule sched, int P, int M, int V, int stage, int *head_sets, int *other_sets);

/* Builds stage g->index of a pipeline over group g running `sched` with M
 * micro-batches of B x T and m->nchunks chunks a stage: its plan and the
 * activation sets it needs. Returns 0, or -1 with err (the schedule cannot
 * run P, M, V: pp_schedule_check's line). */
int pp_build(PPStage *s, GPT *m, CommGroup *g, Dev *dev, PPSchedule sched, int M, int B, int T,
             Trace *trace, char *err, size_t errlen);
void pp_free(PPStage *s);
/* Activation bytes held by the stage: its sets, the B->W stash included.
 * Not counted, as the backward's scratch (m->dx and the rest, gpt.h) is
 * not: the ngrad_bufs input gradients waiting for their round, [rows,C]
 * each (one on every stage but the first under 1f1b, a few interleaved). */
size_t pp_acts_bytes(const PPStage *s);
/* The B->W stash's part of it (0 unless the schedule splits the backward). */
size_t pp_stash_bytes(const PPStage *s);
/* One step: every forward, backward (and W) of this stage in schedule
 * order, activations and their gradients exchanged with the other stages.
 * Every W of the step is done when it returns, so what reads the gradients
 * after (the clip's norm, the optimizer) sees them all. dloss scales the
 * loss (1 / tokens of the global batch). Returns the sum over micro-batches
 * of their mean loss on the last stage, 0 elsewhere. */
double pp_run(PPStage *s, float dloss, const PPCallbacks *cb);

/* Forward only of one B x T batch already in a (acts of this stage; a head
 * set on the last stage: acts[0]), through every stage and chunk: the last
 * stage leaves the logits in a and, with targets, returns the mean loss (0
 * elsewhere). */
double pp_forward(PPStage *s, GPTActs *a, int B, int T, int with_loss);

#endif
