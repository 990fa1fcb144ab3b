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

/* What backward recomputes rather than keeps (重计算; --recompute-mode):
 * nothing; the MLP's GELU output, [B,T,4C/tp] a layer, from its input
 * (llm.c's -r 1); that and the two LayerNorms' outputs, [B,T,C] each, from
 * their inputs (-r 2); or everything but each layer's input (--recompute).
 * The modes nest, and each gives the bits of none: a recompute runs the
 * forward's op on the forward's input. gpt.c's GPT.recompute holds one. */
typedef enum { RECOMPUTE_NONE = 0, RECOMPUTE_GELU, RECOMPUTE_NORM, RECOMPUTE_FULL } RecomputeMode;

typedef struct Layout {
    /* the mesh: dp x cp x tp x pp = the job's ranks (the flags may leave one of
       dp, tp, pp at 0: setup.c infers it, comm_mesh_shape's rule, before layout_check) */
    int dp, tp, pp;
    int cp;                  /* context parallelism: ranks that split each sequence (cp.c); 1 none */
    int sp;                  /* Megatron's sequence parallelism inside the tp group */
    DPMode dp_mode;          /* DDP or the parameter server */
    int zero;                /* ZeRO stage over dp: 0 none, 1 optimizer state, 2 + gradients, 3 + parameters */
    int offload;             /* ZeRO-Offload: optimizer state and AdamW on the host */
    PPSchedule schedule;     /* the order of the micro-batches' forwards and backwards */
    int virtual_chunks;      /* V: chunks of layers a stage (interleaved); 1 otherwise */
    int micro_batches;       /* M: micro-batches a step (gradient accumulation, pipeline depth) */
    int nstage_layers;       /* entries of stage_layers; 0: the layers split as evenly as possible */
    int stage_layers[COMM_MAX_RANKS];  /* [pp x V] layers of each chunk, the model's chunks in order */
    RecomputeMode recompute; /* what backward recomputes: none, gelu, norm, or full (keep each
                                layer's input only; recompute the rest) */
    /* the step's shape, recorded with the layout */
    int batch;               /* B: sequences a micro-batch on each dp rank */
    int seq;                 /* T: tokens a sequence */
    DType dtype;             /* activations and the compute copy of the parameters */
} Layout;

/* Whether model cfg can run under layout l on `world` ranks: every rule of
 * a layout, checked here only (layout.c lists them). world 0: no ranks to
 * match (the planner, a manifest that records none); cfg NULL: the rules
 * that need no model (--show-schedule). Returns 0, or -1 with one line in
 * err naming the flag and the rule ("--tp 3 does not divide 2 heads");
 * err may be NULL (the planner asks quietly). Reads dp, tp, pp, sp,
 * dp_mode, zero, schedule, virtual_chunks, micro_batches, the stage layers,
 * batch and seq (a manifest's layout has them all, with V 1 and one range
 * a stage). */
/* The mesh's omitted dimension (a 0 among dp, tp, pp) inferred from the
 * world's ranks over cp (comm_mesh_shape's rule). Returns 0, or -1 with one
 * line in err. */
int layout_infer_mesh(Layout *l, int world, char *err, size_t errlen);

int layout_check(const Layout *l, const GPTConfig *cfg, int world, char *err, size_t errlen);

/* The shard a rank of stage `stage` (0..pp-1) and tp rank tp_rank holds
 * under layout l (which layout_check passed): its stage's layers
 * (gpt_stage_layers: the stage layers, or as even as possible, V chunks a
 * stage), its tp slice, the embedding on the first stage, the head on the
 * last, and a split backward under the zero-bubble schedules. */
void layout_stage_shard(const Layout *l, const GPTConfig *cfg, int stage, int tp_rank, GPTShard *s);

#endif
