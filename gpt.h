/* gpt.h: the GPT-2 model: configuration, parameter layout, forward, backward.
 *
 * A GPT holds the parameters (and their gradients) of one pipeline stage:
 * its layers, plus the embedding on the first stage and the final LayerNorm
 * and head on the last. On one rank that is the whole model. A stage's
 * layers come in chunks: one range [layer0, layer0 + nlayers) for the plain
 * schedules, V ranges for Megatron's interleaved one (stage s of P holds
 * chunks s, s+P, ..., s+(V-1)P of the model's P*V; its chunk c is the
 * model's chunk c*P + s). Activations live apart, in GPTActs, because a
 * pipeline keeps one set per micro-batch and chunk in flight.
 *
 * The backward of a chunk runs whole (gpt_chunk_backward), or split in two
 * for the zero-bubble schedules (Qi et al. 2023): B, the input gradient
 * (gpt_chunk_backward_input), which the previous stage waits for, and W, the
 * weight gradients (gpt_chunk_backward_weights), which nobody waits for and
 * which the schedule moves into the bubble. B leaves W what it needs in the
 * set (its stash: the gradients of each linear's and LayerNorm's output).
 */
#ifndef GPT_H
#define GPT_H

#include <stdint.h>
#include "tensor.h"

typedef struct GPTConfig {
    int max_seq;       /* maxT: rows of wpe */
    int vocab;         /* V: real vocabulary, the classes of the loss */
    int padded_vocab;  /* Vp: rows of wte, V rounded up */
    int layers;        /* L */
    int heads;         /* NH */
    int dim;           /* C */
} GPTConfig;

/* The parameter tensors, named in llm.c's order (the order of checkpoint
 * files, where per-layer tensors are stacked over layers). In memory the
 * layout is layer-major instead, one contiguous unit per piece of work:
 *   [wte] [wpe] [layer l0: ln1w .. fcprojb] ... [lnfw, lnfb] [wte]
 * so a layer's parameters and gradients are one range: what a DDP bucket,
 * a ZeRO-3 gather and a pipeline stage need. The first stage holds the
 * leading wte and wpe, the last the lnf unit and, when it is not also the
 * first, the trailing wte: the tied copy, a unit of its own on both ends so
 * that the two copies' gradients can be summed shard for shard.
 * layout_llmc_copy converts to and from llm.c's order. */
enum {
    GPT_WTE,       /* [Vp, C] */
    GPT_WPE,       /* [maxT, C] */
    GPT_LN1W,      /* [L, C] */
    GPT_LN1B,      /* [L, C] */
    GPT_QKVW,      /* [L, 3C, C] */
    GPT_QKVB,      /* [L, 3C] */
    GPT_ATTPROJW,  /* [L, C, C] */
    GPT_ATTPROJB,  /* [L, C] */
    GPT_LN2W,      /* [L, C] */
    GPT_LN2B,      /* [L, C] */
    GPT_FCW,       /* [L, 4C, C] */
    GPT_FCB,       /* [L, 4C] */
    GPT_FCPROJW,   /* [L, C, 4C] */
    GPT_FCPROJB,   /* [L, C] */
    GPT_LNFW,      /* [C] */
    GPT_LNFB,      /* [C] */
    GPT_NTENSORS
};

typedef struct GPT GPT;

/* Chunks a stage may hold (--virtual). */
#define GPT_MAX_CHUNKS 32

/* What a rank holds of the model: a pipeline stage's layers (and the
 * embedding and the head at the ends) and a tensor-parallel shard of each:
 * heads, MLP columns and vocabulary rows split over tp ranks, Megatron's way. */
typedef struct GPTShard {
    int layer0, nlayers;       /* the layers this stage holds (nlayers: all its chunks') */
    int has_embed, has_head;   /* first stage: wte, wpe; last stage: wte, lnf */
    int tp, tp_rank;           /* tensor-parallel group size and this rank's place */
    /* interleaved pipelines: nchunks ranges of layers, chunk c the model's
     * layers [chunk_layer0[c], + chunk_nlayers[c]), adding up to nlayers;
     * 0 (or 1) = the one range [layer0, layer0 + nlayers) */
    int nchunks;
    int chunk_layer0[GPT_MAX_CHUNKS], chunk_nlayers[GPT_MAX_CHUNKS];
    int split_backward;        /* zero-bubble schedules: the backward runs as B, then W */
} GPTShard;

/* The tensor-parallel group's collectives (tp.c binds them to comm), and
 * whether activations outside the linears are split along the sequence.
 * n counts elements of type t (activations travel in the dev's dtype,
 * gradients and loss statistics in float32); all_gather takes in[n] from
 * each rank into out[n*size], reduce_scatter sums in[n*size] and keeps this
 * rank's out[n]. */
typedef struct GPTTensorParallel {
    int sp;
    void *ctx;
    void (*all_reduce)(void *ctx, void *buf, size_t n, DType t);
    void (*all_gather)(void *ctx, void *out, const void *in, size_t n, DType t);
    void (*reduce_scatter)(void *ctx, void *out, const void *in, size_t n, DType t);
} GPTTensorParallel;

/* Called at the edges of units; any may be NULL. Unit u's parameters are
 * read through m->uparams[u] and its gradients written through
 * m->ugrads[u]: by default slices of m->params and m->grads, but the
 * data-parallel modules may point them at gathered or transient buffers
 * from the hooks, which fire:
 *   forward:  params_acquire(u) ... params_release(u)
 *   backward: params_acquire(u), grads_acquire(u) ... grads_ready(u), params_release(u)
 *   split:    B: params_acquire(u) ... params_release(u) (no gradient of u is written)
 *             W: grads_acquire(u) ... grads_ready(u) (parameters only to recompute)
 * On a stage holding both ends the one wte serves the embedding and the
 * head: it stays acquired from the embedding's forward to the end of the
 * head's, and its gradients from the head's backward to the end of the
 * embedding's. Under mixed precision the layers read a bf16 copy, made
 * from uparams[u] at the acquire when the float32 values may have changed:
 * a new epoch (an optimizer step), or another source buffer (a ZeRO-3
 * gather); within a step a unit is rounded once, however often it is used. */
typedef struct GPTHooks {
    void *ctx;
    void (*params_acquire)(void *ctx, GPT *m, int unit);
    void (*params_release)(void *ctx, GPT *m, int unit);
    void (*grads_acquire)(void *ctx, GPT *m, int unit);
    void (*grads_ready)(void *ctx, GPT *m, int unit);
} GPTHooks;

struct GPT {
    GPTConfig cfg;
    Dev *dev;
    int layer0, nlayers;       /* the first chunk's first (global) layer; local layers, all chunks */
    /* the chunks: local layers [chunk_first[c], chunk_first[c+1]) are the
     * model's layers from chunk_layer0[c] on; one chunk but for interleaved
     * pipelines. Parameters stay one unit a local layer, in chunk order. */
    int nchunks;
    int chunk_layer0[GPT_MAX_CHUNKS];
    int chunk_first[GPT_MAX_CHUNKS + 1];
    int split_backward;        /* the backward runs as B, then W (zero-bubble schedules):
                                  activation sets carry the stash, and a DP bucket
                                  never mixes units B writes with units W writes */
    int has_embed, has_head;   /* first stage: wte, wpe; last stage: wte, lnf */
    int tp, tp_rank;           /* tensor-parallel shard (1, 0 on one rank) */
    GPTTensorParallel tpc;     /* its collectives; unused when tp == 1 */
    struct CP *cp;             /* context parallelism (cp.c): each sequence's T tokens are this
                                  rank's T/N, attention a ring over the cp group; NULL: none */
    int recompute;             /* layout.h's RecomputeMode: what backward makes again rather
                                  than keeps: nothing, the GELU output, also the LayerNorms'
                                  outputs, or all but the layer inputs (full; again in W
                                  when the backward is split, where W alone needs the others) */
    size_t sizes[GPT_NTENSORS];     /* elements of each tensor held here (0 if absent) */
    size_t offsets[GPT_NTENSORS];   /* where each starts in params / grads; for per-layer
                                       tensors, in the first local layer's unit */
    size_t layer_stride;            /* elements of one layer's unit */
    size_t num_params;
    int nunits;                     /* units in layout (= forward) order */
    size_t *unit_off;               /* [nunits + 1] where each unit starts */
    int unit_wte, unit_wpe, unit_lnf;  /* their units, -1 when not held */
    float *params;   /* [num_params] on dev, the tensors back to back (NULL when sharded) */
    float *grads;    /* [num_params] on dev, same layout (NULL when sharded) */
    float **uparams; /* [nunits] where unit u's parameters are read from now */
    float **ugrads;  /* [nunits] where unit u's gradients are accumulated now */
    /* Mixed precision (dev dtype bf16): the layers read a bf16 compute copy
     * of the float32 parameters, made unit by unit when a unit is acquired
     * and its float32 source has changed since (a new epoch, or another
     * buffer, as a ZeRO-3 gather). In float32 the layers read uparams. */
    size_t esz;               /* bytes of an activation element: dt_size(dev->dtype) */
    void *lp;                 /* [num_params] bf16 compute copy, same layout; NULL in fp32 */
    unsigned epoch;           /* bumped by gpt_params_changed */
    unsigned *lp_epoch;       /* [nunits] the epoch unit u's copy was made in */
    const float **lp_src;     /* [nunits] the buffer it was made from */
    GPTHooks hooks;
    /* Backward scratch, one layer's worth, reused layer after layer;
     * sized for max_bt = B*T rows. */
    int max_bt;
    /* activations' gradients, in the dev's dtype */
    void *dx;        /* [B,T,C]  gradient of the residual stream */
    void *dln;       /* [B,T,C]  gradient of a LayerNorm output */
    void *datty;     /* [B,T,C/tp]  gradient of the attention output */
    void *dqkv;      /* [B,T,3C/tp] */
    void *dfch;      /* [B,T,4C/tp] gradient of the fc output (pre-GELU) */
    void *dfchg;     /* [B,T,4C/tp] gradient of the GELU output: matmul_backward_gelu's scratch (unused by the CUDA bf16 table's fused op) */
    void *full;      /* [B,T,C] sequence parallelism: a gathered or to-be-scattered copy */
    float *datt;     /* [datt_floats] attention backward scratch (ops->attention_floats) */
    size_t datt_floats;
    float *sp_dw;    /* [2C] sequence parallelism: a LayerNorm's weight and bias gradients */
};

/* Activations of one micro-batch of B sequences of T tokens through one
 * chunk of a stage (the stage's one chunk but for interleaved pipelines).
 * A set is sized for the stage's largest chunk, so any chunk can use it; nl
 * below is that chunk's layer count. `void *` buffers hold the dev's dtype
 * (bf16 under mixed precision), `float *` ones are float32 always. */
typedef struct GPTActs {
    int B, T;
    int chunk;       /* the chunk whose forward filled it last */
    size_t esz;      /* bytes of an element of the void * buffers */
    size_t att_stride;  /* floats of one layer's attention state */
    int rows;        /* rows of the residual stream here: B*T, or B*T/tp with sequence parallelism */
    int kept;        /* layers whose inner activations are kept: nl, or 1 with full recompute */
    int kept_norm;   /* layers whose ln1 and ln2 are kept: nl, or 1 recomputing norm or full */
    int kept_gelu;   /* layers whose fchg is kept: nl, or 1 with any recompute */
    int has_head;    /* holds the head's buffers (lnf .. lse), else those are NULL */
    int *tokens;     /* [B,T] inputs on dev (first stage); with tp, ids local to this rank's vocabulary slice */
    int *targets;    /* [B,T] on dev (last stage) */
    int *embed_plan; /* [2BT+1] on dev: dev_embed_plan of tokens, for a deterministic embedding backward on GPUs */
    int embed_runs;  /* its run count, -1 when there is none (CPU, or no tokens set) */
    void *x_in;      /* [rows,C] the stage's input: the embedding, or what the previous stage sent */
    /* per layer, stacked over the stage's layers (nl = kept layers for all but res3;
       kept_norm for ln1 and ln2, kept_gelu for fchg) */
    void *ln1;       /* [nl,B,T,C] (all rows, gathered, with sequence parallelism) */
    float *ln1_mean, *ln1_rstd;  /* [nl,rows] */
    void *qkv;       /* [nl,B,T,3C/tp] this rank's heads' q, k, v */
    void *atty;      /* [nl,B,T,C/tp] attention output of this rank's heads */
    float *att;      /* [nl,att_stride] what attention keeps for backward: the softmax
                        probabilities [B,NH/tp,T,T], or a log-sum-exp a row [B,NH/tp,T] */
    void *res2;      /* [nl,rows,C] residual stream after attention */
    void *ln2;       /* [nl,B,T,C] */
    float *ln2_mean, *ln2_rstd;  /* [nl,rows] */
    void *fch;       /* [nl,B,T,4C/tp] fc output, pre-GELU */
    void *fchg;      /* [nl,B,T,4C/tp] GELU output */
    void *res3;      /* [nl,rows,C] the layer's output */
    void *proj;      /* [B,T,C] scratch: a projection before its residual add */
    /* head */
    void *lnf;       /* [B,T,C] */
    float *lnf_mean, *lnf_rstd;  /* [rows] */
    void *logits;    /* [B,T,Vp/tp] logits of this rank's vocabulary slice, then their gradient */
    float *losses;   /* [B,T] */
    float *xstats;   /* [tp,B,T,3] vocab-parallel cross-entropy: every rank's row statistics */
    float *lse;      /* [B,T] log-sum-exp over the whole vocabulary */
    /* the split backward's stash (split_backward only, else NULL): what B
     * leaves for W, a layer at a time: the gradient of each linear's and
     * LayerNorm's output, all summed over the tp group where needed */
    void *g_fcproj;  /* [nl,B,T,C] gradient of fcproj's output (all rows) */
    void *g_fch;     /* [nl,B,T,4C/tp] gradient of fc's output (pre-GELU) */
    void *g_ln2;     /* [nl,rows,C] gradient of ln2's output, this rank's rows */
    void *g_attproj; /* [nl,B,T,C] gradient of attproj's output (all rows) */
    void *g_qkv;     /* [nl,B,T,3C/tp] gradient of qkv's output */
    void *g_ln1;     /* [nl,rows,C] gradient of ln1's output, this rank's rows */
    size_t bytes;    /* what this set holds on dev */
    size_t stash_bytes;  /* of which the stash */
} GPTActs;

/* Fills padded_vocab (V rounded up to a multiple of 128 when 0) and checks
 * the sizes. Returns 0, or -1 with one line in err naming the rule broken. */
int gpt_config_check(GPTConfig *cfg, char *err, size_t errlen);

/* The names gpt_preset knows, for error lines. */
#define GPT_PRESETS "gpt2 (d12), gpt2-medium (d24), gpt2-large (d36), gpt2-xl (d48), gpt3-125m .. gpt3-175b"
/* A named model (GPT2/GPT-3 sizes, 50257 tokens) into cfg (its vocab not yet
 * padded: gpt_config_check does that). Returns 0, or -1 for an unknown name. */
int gpt_preset(const char *name, GPTConfig *cfg);

/* Parameters shard s holds (gpt_build's num_params), without building it. */
size_t gpt_shard_params(const GPTConfig *cfg, const GPTShard *s);
/* Bytes of one set of activations (gpt_acts_build's), from the shape alone:
 * m needs cfg, tp, tpc.sp, nlayers, has_head, recompute (the mode) and esz; nchunks
 * (0: one chunk of nlayers) and chunk_first size the set for the largest
 * chunk, split_backward adds the B->W stash. */
size_t gpt_acts_formula(const GPT *m, int B, int T, size_t att_stride, int cuda);
/* The B->W stash's part of it (0 without split_backward). */
size_t gpt_stash_formula(const GPT *m, int B, int T);
/* Bytes of the backward's scratch, kept beside the sets and shared by them
 * (gpt.c's scratch_rows: 15 C (tp 1) elements a token of B*T in the dtype,
 * sp_dw's 2C floats; and att_scratch floats of attention's backward, the
 * ops' attention_floats scratch, 0 under cp): from the shape alone (m as
 * for gpt_acts_formula: cfg, tp, esz). gpt_scratch_bytes: what m holds now
 * (0 before its first set of activations). */
size_t gpt_scratch_formula(const GPT *m, int B, int T, size_t att_scratch);
size_t gpt_scratch_bytes(const GPT *m);

/* The shard of one rank holding everything. */
GPTShard gpt_whole(const GPTConfig *cfg);

/* Allocates the parameters and gradients of shard s on dev, zeroed. The
 * shard must divide the model (tp_check). Exits only when memory runs out. */
void gpt_build(GPT *m, const GPTConfig *cfg, Dev *dev, const GPTShard *s);
void gpt_free(GPT *m);
/* Points uparams and ugrads back at slices of params and grads. */
void gpt_units_default(GPT *m);

/* Unit u (0 .. nunits-1, in forward order) is [*offset, *offset + *count)
 * of params and grads. */
void gpt_unit_range(const GPT *m, int u, size_t *offset, size_t *count);

/* The model's (global) layer of local layer l, through the chunks. */
int gpt_layer_global(const GPT *m, int l);
/* Layers of chunk c. */
int gpt_chunk_layers(const GPT *m, int c);

/* Which piece of the backward writes unit u's gradients: 2c for the
 * backward (or, split, the B) of chunk c, 2c + 1 for the W of chunk c. The
 * embedding's units belong to chunk 0, the head's to the last chunk, and
 * with the backward split they are written by B (a layer's by W). A DP
 * bucket is a run of units with one writer, so that the last backward of a
 * step that writes them finishes all of it (dp.c). */
int gpt_unit_writer(const GPT *m, int u);

/* Where tensor i of local layer l (l ignored for whole-model tensors)
 * starts in this shard's layout (m->params, m->grads), in elements. */
size_t gpt_tensor_offset(const GPT *m, int i, int l);
/* Pointer to tensor i of local layer l (l ignored for whole-model tensors)
 * inside base, which is m->params, m->grads or any buffer of the same layout. */
float *gpt_tensor(const GPT *m, float *base, int i, int l);

/* Calls fn(ctx, off, n, tensor) for each piece of [offset, offset + count)
 * of this stage's layout that lies in one tensor of one layer, in order:
 * how a range that ignores tensor boundaries (a ZeRO shard) learns which
 * elements get weight decay. */
void gpt_segments(const GPT *m, size_t offset, size_t count,
                  void (*fn)(void *ctx, size_t off, size_t n, int tensor), void *ctx);

/* The number of parameters of the whole model (padded rows included). */
size_t gpt_total_params(const GPTConfig *cfg);
const char *gpt_tensor_name(int i);
/* Whether tensor i gets weight decay (the 2-D weights). */
int gpt_tensor_decays(int i);
/* Whether tensor i has one slice a layer (ln1w .. fcprojb) rather than one
 * for the whole model (wte, wpe, lnfw, lnfb). */
int gpt_tensor_per_layer(int i);

/* GPT-2 initialisation: N(0, 0.02) weights, 0.02/sqrt(2L) for the two
 * residual projections, zero biases, unit LayerNorm. Each element's value
 * depends only on (seed, tensor, its index in the whole model), so every
 * parallel layout starts from the same model. */
void gpt_init_random(GPT *m, uint64_t seed);

/* Says the float32 parameters changed (an optimizer step, a load): the bf16
 * compute copy of each unit is remade at its next acquire. */
void gpt_params_changed(GPT *m);
/* The same, where every parameter's bf16 copy in m->lp was written with
 * its new value (zero_update's AdamW): no unit recasts at its next use. */
void gpt_params_cast(GPT *m);

/* A set sized for the largest chunk, with the head's buffers when m has
 * the head (gpt_acts_build_part: when with_head, for the sets of a stage
 * whose other chunks need none), and the stash when the backward is split. */
GPTActs *gpt_acts_build(GPT *m, int B, int T);
GPTActs *gpt_acts_build_part(GPT *m, int B, int T, int with_head);
void gpt_acts_free(GPT *m, GPTActs *a);

/* Copies B*T host tokens and targets (either may be NULL) into a. */
void gpt_set_batch(GPT *m, GPTActs *a, const int *tokens, const int *targets, int B, int T);

/* Forward pieces; B, T may be smaller than what a was built for. */
void gpt_embed_forward(GPT *m, GPTActs *a, int B, int T);
/* Runs chunk c's layers on a->x_in; returns the output [rows,C] (in a). */
void *gpt_chunk_forward(GPT *m, GPTActs *a, int c, int B, int T);
/* Final LayerNorm, tied head, cross-entropy on the output of the last chunk.
 * Returns the mean loss over the B*T positions. With dloss != 0 the logits
 * become their gradient, scaled by dloss, ready for gpt_head_backward. */
double gpt_head_forward(GPT *m, GPTActs *a, int B, int T, float dloss);
/* Like gpt_head_forward without targets: leaves the logits [B,T,Vp] in a->logits. */
void gpt_head_logits(GPT *m, GPTActs *a, int B, int T);

/* Backward pieces; each accumulates into m->grads. The residual gradient
 * travels in m->dx: head_backward writes it, a chunk's backward takes the
 * chunk output's gradient there and leaves the chunk input's.
 * gpt_chunk_backward does all of it; split, gpt_chunk_backward_input (B)
 * does the input gradient and stashes in a what
 * gpt_chunk_backward_weights (W) needs later for the layers' parameter
 * gradients; W reads nothing but a (and, with recompute, the parameters,
 * to run the layers' forward, or their LayerNorms, again), and a must not
 * be reused in between.
 * The head's and the embedding's gradients are B's (they need no stash). */
void gpt_head_backward(GPT *m, GPTActs *a, int B, int T);
void gpt_chunk_backward(GPT *m, GPTActs *a, int c, int B, int T);
void gpt_chunk_backward_input(GPT *m, GPTActs *a, int c, int B, int T);
void gpt_chunk_backward_weights(GPT *m, GPTActs *a, int c, int B, int T);
void gpt_embed_backward(GPT *m, GPTActs *a, int B, int T);

/* The whole model on one stage of one chunk: forward, loss, backward.
 * Returns the mean loss. */
double gpt_forward_backward(GPT *m, GPTActs *a, int B, int T, float dloss);
/* Forward only: the mean loss. */
double gpt_forward_loss(GPT *m, GPTActs *a, int B, int T);

#endif
