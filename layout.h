/* layout.h: the parallel layout of a run, as one type (混合并行, the
 * hybrid-parallelism article's DP+PP+TP+ZeRO).
 *
 * A Layout says how the ranks of a job divide one training step: dp x cp x
 * tp x pp ranks (comm.c's mesh: rank = tp_rank + tp x (cp_rank + cp x
 * (dp_rank + dp x pp_rank))), how many ranks split each sequence (context
 * parallelism, cp.c), what data parallelism does over dp (DDP or the
 * parameter server, a ZeRO stage, the optimizer on the host), how the pipeline runs (a schedule, M
 * micro-batches, V chunks a stage, the stages' layers), what the tp group
 * splits (sequence parallelism) and what backward recomputes, together with
 * the step's shape that the planner and a checkpoint record with it (batch,
 * sequence, dtype). The flags fill one (args.c), setup.c checks it once
 * (layout_check: every rule and its message live there), the planner
 * searches over them (plan.c), a checkpoint's manifest records one
 * (checkpoint.c), and the model asks it for a rank's shard
 * (layout_stage_shard). The second half of this header is how every
 * tensor is cut over tp: one table, and one walk over a shard's runs.
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

/* The flag that asks for recompute mode m, with a space before it: "" for
 * none, " --recompute-mode gelu", " --recompute-mode norm", " --recompute". */
const char *layout_recompute_flag(RecomputeMode m);

/* The mesh's omitted dimension (a 0 among dp, tp, pp) inferred from the
 * world's ranks over cp (comm_mesh_shape's rule). Returns 0, or -1 with one
 * line in err. */
int layout_infer_mesh(Layout *l, int world, char *err, size_t errlen);

/* Whether model cfg can run under layout l on `world` ranks: every rule of
 * a layout, checked here only (layout.c lists them). world 0: no ranks to
 * match (the planner, a manifest that records none); cfg NULL: the rules
 * that need no model (--show-schedule). Returns 0, or -1 with one line in
 * err naming the flag and the rule ("--tp 3 does not divide 2 heads");
 * err may be NULL (the planner asks quietly). Reads dp, cp, tp, pp, sp,
 * dp_mode, zero, schedule, virtual_chunks, micro_batches, the stage layers,
 * batch and seq (a manifest's layout has them all, with V 1 and one range
 * a stage). */
int layout_check(const Layout *l, const GPTConfig *cfg, int world, char *err, size_t errlen);

/* Stage st of P's layers into s (layer0, nlayers and the chunks; nothing
 * else touched): the model's K = P x V chunks are ranges[K] (--stage-layers)
 * or, when ranges is NULL, as even as possible (V = 1: the first stages
 * take one more when P does not divide L; V > 1: L / K each, the caller
 * having checked that K divides L); stage st holds chunks st, st + P, ...
 * (Megatron's interleaving: its chunk c is the model's chunk c*P + st).
 * layout_stage_shard's, and the checkpoint's record of the stages. */
void layout_stage_layers(int L, int P, int V, const int *ranges, int st, GPTShard *s);
/* The shard a rank of stage `stage` (0..pp-1) and tp rank tp_rank holds
 * under layout l (which layout_check passed): its stage's layers
 * (layout_stage_layers: the stage layers, or as even as possible, V chunks a
 * stage), its tp slice, the embedding on the first stage, the head on the
 * last, and a split backward under the zero-bubble schedules. */
void layout_stage_shard(const Layout *l, const GPTConfig *cfg, int stage, int tp_rank, GPTShard *s);

/* ---- how every tensor is cut: the table and the walk over a shard (layout.c) ----
 *
 * The article's 3.1 张量并行 shows a layer's matrix cut by rows (行切分), by
 * columns (列切分), or copied whole (复制). Every tensor of GPT-2 is one of
 * those, and layout_cut's table says which, with a line on why. A tensor is
 * stored row-major as [rows, cols] (a vector as [n, 1]), one layer's slice
 * at a time for the per-layer tensors. From the table come a shard's sizes
 * (layout_piece_size), which copy of a tensor counts once (layout_counts),
 * and its runs: the pieces of the shard that are contiguous both here and
 * in the unsplit model (layout_runs_start / layout_runs_next), which the
 * model's --save and load (layout_llmc_copy), the initialisation and the
 * checkpoints walk.
 */

/* How tp ranks cut a tensor stored [R, K]; rank r of tp holds: */
typedef enum {
    LAYOUT_REPLICATED,  /* all of it, like every other rank (复制) */
    LAYOUT_ROWS,        /* rows [r R/tp, (r+1) R/tp): one contiguous slice */
    LAYOUT_COLUMNS,     /* columns [r K/tp, (r+1) K/tp) of each of the R rows */
    LAYOUT_QKV,         /* rows [q | k | v]: its R/3/tp rows of each third */
    LAYOUT_VOCAB,       /* wte's vocabulary rows [r Vp/tp, (r+1) Vp/tp) */
} LayoutCut;

/* The cut of tensor i (GPT_WTE .. GPT_LNFB), from the table. */
LayoutCut layout_cut(int i);

/* The unsplit shape of tensor i, one layer's slice for the per-layer ones:
 * *rows x *cols (a vector is [n, 1]). */
void layout_shape(const GPTConfig *cfg, int i, size_t *rows, size_t *cols);

/* Elements of one piece of tensor i on a rank of tp: one layer's slice for
 * the per-layer tensors, the whole tensor for the others. */
size_t layout_piece_size(const GPTConfig *cfg, int i, int tp);

/* Elements of tensor i on a stage of nlayers layers, with the embedding
 * and/or the head, on a rank of tp (0 when the stage does not hold it). */
size_t layout_tensor_size(const GPTConfig *cfg, int i, int nlayers, int has_embed, int has_head, int tp);

/* 1 when tp > 1 and every tp rank holds all of tensor i. */
int layout_replicated(int tp, int i);

/* The one home of "count each element once": 1 when this rank's copy of
 * tensor i is the one that counts; 0 for a replicated tensor on tp ranks
 * other than 0, and for the last stage's tied copy of wte (the first
 * stage's counts). What --save writes, what the gradient norm sums (zero.c)
 * and what a checkpoint's shards hold. */
int layout_counts(const GPT *m, int i);

/* Where tensor i of global layer l (l ignored for whole-model tensors)
 * starts in llm.c's order of the unsplit model. */
size_t layout_global_offset(const GPTConfig *cfg, int i, int l);

/* Where element k of this rank's piece of tensor i (one layer's, or the
 * whole-model tensor's) sits in the unsplit piece; *run (NULL: not wanted)
 * gets how many elements from k on stay contiguous in both. */
size_t layout_piece_index(const GPT *m, int i, size_t k, size_t *run);

/* One run of a shard: elements [local, local + n) of the rank's layout
 * (m->params, m->grads) are [global, global + n) of llm.c's order of the
 * whole model; they belong to tensor `tensor`, local layer `layer` (0 for
 * whole-model tensors). */
typedef struct LayoutRun {
    int tensor, layer;
    size_t local, global, n;
} LayoutRun;

/* The walk's place: tensor by tensor in llm.c's order, layer by layer, run
 * by run. Read nothing in it. */
typedef struct LayoutRuns {
    const GPT *m;
    int tensor, layer;
    size_t run, nruns;           /* the run of this piece, and how many it has */
    size_t len, first, stride;   /* runs of len, the b-th at first + b x stride in the piece */
    size_t local, global;        /* where the piece starts here and in llm.c's order */
} LayoutRuns;

/* Starts a walk over every element m holds (tied copy and tp replicas
 * included: the caller asks layout_counts when it needs the ones that
 * count); layout_runs_next fills *r with the next run and returns 1, or
 * returns 0 at the end. The runs come in llm.c's order of tensors, then
 * layers, and each tensor's layer in order of the unsplit index:
 *   for (layout_runs_start(&w, m); layout_runs_next(&w, &r);) ... r.local, r.global, r.n ... */
void layout_runs_start(LayoutRuns *w, const GPT *m);
int layout_runs_next(LayoutRuns *w, LayoutRun *r);

/* Copies between this shard's layout (internal [num_params]) and llm.c's
 * order of the whole model (llmc [gpt_total_params], host memory both),
 * run by run (layout.h's layout_runs_next): to_llmc 1 fills this shard's
 * elements of llmc (only the copies that count, layout_counts, so a sum
 * over tp ranks assembles the model), 0 fills internal from them. */
void layout_llmc_copy(const GPT *m, float *internal, float *llmc, int to_llmc);

#endif
