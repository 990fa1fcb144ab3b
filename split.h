/* split.h: how every tensor of the model is cut over the tensor-parallel
 * ranks, and the one walk over a rank's shard from its own layout to llm.c's
 * order of the whole model.
 *
 * The article's 3.1 张量并行 shows a layer's matrix cut by rows (行切分), by
 * columns (列切分), or copied whole (复制). Every tensor of GPT-2 is one of
 * those, and layout_cut's table says which, with a line on why. A tensor is
 * stored row-major as [rows, cols] (a vector as [n, 1]), one layer's slice
 * at a time for the per-layer tensors. From the table come a shard's sizes
 * (layout_piece_size), which copy of a tensor counts once (layout_counts),
 * and its runs: the pieces of the shard that are contiguous both here and
 * in the unsplit model (layout_runs_start / layout_runs_next), which the
 * model's --save and load (gpt_llmc_copy), the initialisation and the
 * checkpoints walk.
 */
#ifndef SPLIT_H
#define SPLIT_H

#include <stddef.h>
#include "gpt.h"

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

#endif
