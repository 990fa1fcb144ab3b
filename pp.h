/* pp.h: running a pipeline schedule on one stage (pp.c).
 *
 * The articles' inter-layer split (auto-parallel-partitioning.txt, 3.2
 * 流水线并行; hybrid-parallelism.txt's DP+PP): the L layers sit on P stages
 * and the batch is cut into M micro-batches. pp_sched.h says in what order
 * each stage runs its forwards and backwards; this module runs them with
 * the model and the pp group's sends and receives.
 */
#ifndef PP_H
#define PP_H

#include <stdio.h>
#include "comm.h"
#include "gpt.h"
#include "pp_sched.h"
#include "trace.h"

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
