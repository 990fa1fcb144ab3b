/* layout.h: the parallel layout of a run, as one type (混合并行, the
 * hybrid-parallelism article's DP+PP+TP+ZeRO).
 *
 * A Layout says how the ranks of a job divide one training step: dp x tp x
 * pp ranks (comm.c's mesh: rank = tp_rank + tp x (dp_rank + dp x pp_rank)),
 * what data parallelism does over dp (DDP or the parameter server, a ZeRO
 * stage, the optimizer on the host), how the pipeline runs (a schedule, M
 * micro-batches, V chunks a stage, the stages' layers), what the tp group
 * splits (sequence parallelism) and what backward recomputes, together with
 * the step's shape that the planner and a checkpoint record with it (batch,
 * sequence, dtype). The flags fill one (args.c), setup.c checks it once
 * (layout_check: every rule and its message live there), the planner
 * searches over them (plan.c), a checkpoint's manifest records one
 * (checkpoint.c), and the model asks it for a rank's shard
 * (layout_stage_shard).
 */
#ifndef LAYOUT_H
#define LAYOUT_H
#include <stddef.h>
#include "tensor.h"
#include "gpt.h"
#include "comm.h"
#include "pp_sched.h"

/* How gradients meet over dp: all-reduced (DDP), or sent to dp rank 0, the
 * parameter server, which updates and sends the parameters back. */
typedef enum { DP_ALLREDUCE = 0, DP_PS = 1 } DPMode;

typedef struct Layout {
    /* the mesh: dp x tp x pp = the job's ranks */
    int dp, tp, pp;
    int sp;                  /* Megatron's sequence parallelism inside the tp group */
    DPMode dp_mode;          /* DDP or the parameter server */
    int zero;                /* ZeRO stage over dp: 0 none, 1 optimizer state, 2 + gradients, 3 + parameters */
    int offload;             /* ZeRO-Offload: optimizer state and AdamW on the host */
    PPSchedule schedule;     /* the order of the micro-batches' forwards and backwards */
    int virtual_chunks;      /* V: chunks of layers a stage (interleaved); 1 otherwise */
    int micro_batches;       /* M: micro-batches a step (gradient accumulation, pipeline depth) */
    int nstage_layers;       /* entries of stage_layers; 0: the layers split as evenly as possible */
    int stage_layers[COMM_MAX_RANKS];  /* [pp x V] layers of each chunk, the model's chunks in order */
    int recompute;           /* keep each layer's input only; recompute the rest in backward */
    /* the step's shape, recorded with the layout */
    int batch;               /* B: sequences a micro-batch on each dp rank */
    int seq;                 /* T: tokens a sequence */
    DType dtype;             /* activations and the compute copy of the parameters */
} Layout;

#endif
