/* pp.h: pipeline schedules: which forward or backward each stage runs, in what order.
 *
 * The articles' inter-layer split (auto-parallel-partitioning.txt, 3.2
 * 流水线并行, its GPipe and PipeDream figures; hybrid-parallelism.txt's
 * DP+PP): the L layers sit on P stages, the batch is cut into M
 * micro-batches, and F3 / B3 are the forward / backward of micro-batch 3 on
 * one stage. A schedule is, for each stage, the order of its 2M actions;
 * the data dependencies (F on stage s needs F on s-1, B on s needs B on
 * s+1) decide when each can run. This module is that order and nothing
 * else: no communication, no model. The training loop walks pp_actions and
 * does the sends and receives around each action.
 *
 *   schedule  order on stage s                      bubble (idle fraction)  in flight on stage 0
 *   naive     F0 B0 F1 B1 ... (one micro-batch in   (P-1)/P                  1
 *             the pipe at a time)
 *   gpipe     F0 .. F(M-1), then B0 .. B(M-1)       (P-1)/(M+P-1)            M
 *   1f1b      min(P-1-s, M) forwards, then one F    (P-1)/(M+P-1)            min(P, M)
 *             one B while forwards remain, then the
 *             rest of the B (PipeDream-Flush)
 *
 * The bubble fractions hold when F and B take one time slot each, as the
 * articles draw them; pp_timeline places the actions in such slots and
 * pp_show prints the figure with the idle fraction it measures.
 */
#ifndef PP_H
#define PP_H

#include <stdio.h>
#include "comm.h"
#include "gpt.h"
#include "trace.h"

typedef enum { PP_NAIVE, PP_GPIPE, PP_1F1B } PPSchedule;   /* (interleaved later) */

/* PP_IDLE appears only in a timeline's slots, never in an action list. */
typedef enum { PP_FORWARD, PP_BACKWARD, PP_IDLE } PPKind;

typedef struct PPAction {
    PPKind kind;
    int micro;          /* micro-batch 0 .. M-1; -1 in an idle slot */
} PPAction;

/* The actions of every stage placed in unit time slots (F and B one slot each). */
typedef struct PPTimeline {
    int P, M;           /* stages, micro-batches */
    int T;              /* time slots from the first action to the last */
    PPAction *slots;    /* [P][T]: stage s at slot t is slots[s * T + t] */
} PPTimeline;

/* "naive" | "gpipe" | "1f1b" -> its PPSchedule; -1 if s is none of them (or NULL). */
int pp_schedule_parse(const char *s);

/* The name pp_schedule_parse reads; "?" for a value outside the enum. */
const char *pp_schedule_name(PPSchedule s);

/* Writes the ordered actions of stage `stage` (0 .. P-1) for M micro-batches
 * into out[2M] and returns 2M: each micro-batch's forward once and its
 * backward once. Returns -1 (out untouched) if P < 1, M < 1, stage is out
 * of range or s is unknown. */
int pp_actions(PPSchedule s, int P, int M, int stage, PPAction *out);

/* The largest number of micro-batches whose forward is done and backward
 * not yet, over the prefixes of acts[n]: the activations a stage holds at
 * its peak. 0 for n = 0. */
int pp_in_flight_peak(const PPAction *acts, int n);

/* The bubble the articles give for s: (P-1)/(M+P-1) for gpipe and 1f1b,
 * (P-1)/P for naive (each micro-batch crosses the whole pipe alone: 2P
 * slots, of which each stage works 2). -1 for bad arguments. */
double pp_bubble_formula(PPSchedule s, int P, int M);

/* Places every stage's actions, in its own pp_actions order, in unit time
 * slots: an action runs in the first slot after all it depends on has
 * finished (F(s,m) after F(s-1,m); B(s,m) after B(s+1,m), and on the last
 * stage after F(P-1,m)); a stage runs at most one action a slot. Fills t
 * (free it with pp_timeline_free) and returns 0; returns -1 with t zeroed
 * for bad arguments, if allocation fails or if the schedule deadlocks. */
int pp_timeline(PPSchedule s, int P, int M, PPTimeline *t);
void pp_timeline_free(PPTimeline *t);

/* pp_bubble_formula as text, "(P-1)/(M+P-1) = 3/10 = 0.300" (naive:
 * "(P-1)/P = 1/2 = 0.500"): what pp_show and the SVG of --show-schedule
 * print. 0, or -1 (buf untouched) for bad arguments. */
int pp_bubble_text(PPSchedule s, int P, int M, char *buf, size_t len);

/* Prints the schedule as the articles draw it: a title line, a ruler of
 * slot numbers, one row per stage ("stage 0 |F0|F1|  |B0|...", fixed-width
 * cells, idle cells blank), the measured bubble ("idle 24 of 56 slots =
 * 0.429") beside its formula, and each stage's peak micro-batches in
 * flight. Returns 0, or -1 (printing nothing) for bad arguments. */
int pp_show(FILE *f, PPSchedule s, int P, int M);

/* ---- running a schedule on one stage ------------------------------------ */

/* Called by pp_run: fill micro-batch `micro`'s tokens and targets into a;
 * and before micro-batch `micro`'s backward (last: it is the step's last). */
typedef struct PPCallbacks {
    void *ctx;
    void (*batch)(void *ctx, int micro, GPTActs *a);
    void (*before_backward)(void *ctx, int micro, int last);
} PPCallbacks;

typedef struct PPStage {
    GPT *m;
    CommGroup *g;          /* the pp group: stage = g->index, P = g->size */
    Dev *dev;
    int P, stage, M;
    PPSchedule sched;
    PPAction *actions;     /* [2M] this stage's order */
    int nsets;             /* activation sets kept: the peak of micro-batches in flight */
    GPTActs **acts;        /* [nsets]; micro-batch m uses acts[m % nsets] */
    Trace *trace;
    /* a send waiting to be paired with this stage's next receive */
    const void *send_buf;
    size_t send_n;
    int send_peer;
} PPStage;

/* Builds stage g->index of a pipeline over group g running `sched` with M
 * micro-batches of B x T: its action list and the activation sets it needs.
 * Returns 0, or -1 with err. */
int pp_build(PPStage *s, GPT *m, CommGroup *g, Dev *dev, PPSchedule sched, int M, int B, int T,
             Trace *trace, char *err, size_t errlen);
void pp_free(PPStage *s);
/* Activation bytes held by the stage. */
size_t pp_acts_bytes(const PPStage *s);
/* Sets of activations stage keeps (pp_build's nsets: the schedule's peak of
 * micro-batches in flight, at least 1); the planner's too. */
int pp_sets_in_flight(PPSchedule sched, int P, int M, int stage);

/* One step: every forward and backward of this stage in schedule order,
 * activations and their gradients exchanged with the neighbouring stages.
 * dloss scales the loss (1 / tokens of the global batch). Returns the sum
 * over micro-batches of their mean loss on the last stage, 0 elsewhere. */
double pp_run(PPStage *s, float dloss, const PPCallbacks *cb);

/* Forward only of one B x T batch already in a (acts of this stage), through
 * every stage: the last stage leaves the logits in a and, with targets,
 * returns the mean loss (0 elsewhere). */
double pp_forward(PPStage *s, GPTActs *a, int B, int T, int with_loss);

#endif
