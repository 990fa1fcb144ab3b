/* tp.h: tensor parallelism: the checks on a --tp layout and the tp group's
 * collectives for gpt.c. */
#ifndef TP_H
#define TP_H

#include "comm.h"
#include "gpt.h"

/* Context of the collectives: the tp group and the device of the buffers. */
typedef struct TPGroup {
    CommGroup *g;
    Dev *dev;
} TPGroup;

/* Makes m use group g (of m->tp ranks) for its Megatron collectives. */
void tp_attach(GPT *m, TPGroup *t, CommGroup *g, Dev *dev, int sp);

/* Megatron's split of a layer (tp.c's essay), as gpt.c's layers call it. N
 * is the B*T tokens of a micro-batch; "rows" is this rank's share of them,
 * tp_stream_rows(m, N). Buffers hold the dev's dtype, but for the float32
 * LayerNorm statistics and parameter gradients. */

/* Rows of the residual stream this rank keeps for N tokens: all N, or N/tp
 * with sequence parallelism. */
int tp_stream_rows(const GPT *m, int N);

/* g, after a row-parallel linear: partial [N,C] summed over the tp group,
 * this rank's rows of the sum into out [rows,C] (out may be partial
 * without sequence parallelism; with it, out and partial do not overlap). */
void tp_g_forward(GPT *m, void *out, void *partial, int N);
/* g's backward: the gradient of the stream dx [rows,C] made whole [N,C]
 * for the row-parallel linear's backward, into keep when not NULL (a split
 * backward's stash), else into scratch or, already whole, left in dx.
 * Returns where it is. */
const void *tp_g_backward(GPT *m, void *keep, const void *dx, int N);

/* A LayerNorm and f, before a column-parallel linear: this rank's rows of
 * the stream x [rows,C] normalised into its rows of out [N,C] (with res not
 * NULL, the stream res = x + y made first, in the same pass), then f: out
 * made whole on every rank (sequence parallelism's all-gather; without it
 * every rank computed all rows). */
void tp_layernorm_forward(GPT *m, void *out, float *mean, float *rstd, void *res, const void *x,
                          const void *y, const void *w, const void *b, int N);
/* Its backward: f's (dfull [N,C], the column-parallel linear's partial
 * input gradients, summed over the group: all-reduced in place, or
 * reduce-scattered into this rank's rows), then the LayerNorm's, whose
 * input gradient is added into dx [rows,C] and weights' gradients into dw,
 * db (NULL, NULL: none, for a split backward's B, which keeps the summed
 * output gradient for W in keep [rows,C], or in dfull itself without
 * sequence parallelism). */
void tp_layernorm_backward(GPT *m, void *dx, void *dfull, void *keep, const void *x, const void *w,
                           float *dw, float *db, const float *mean, const float *rstd, int N);
/* A split backward's W of a LayerNorm: its weights' gradients from dln
 * [rows,C], the summed output gradient that B kept. */
void tp_layernorm_weights(GPT *m, float *dw, float *db, const void *dln, const void *x,
                          const float *mean, const float *rstd, int N);

/* The column-parallel linear: out [N,OC] = in [N,IC] @ w^T + b with this
 * rank's OC outputs (w [OC,IC], b [OC]); no communication. */
void tp_column_forward(GPT *m, void *out, const void *in, const void *w, const void *b, int N, int IC,
                       int OC);
/* Its backward: dinp [N,IC] (NULL: none) overwritten with this rank's
 * partial input gradient (f's backward sums it: tp_layernorm_backward), dw,
 * db (NULL: none) accumulated. */
void tp_column_backward(GPT *m, void *dinp, float *dw, float *db, const void *dout, const void *inp,
                        const void *w, int N, int IC, int OC);
/* The row-parallel linear: in [N,IC] holds this rank's IC inputs (w
 * [OC,IC] its columns); the product, a partial sum, is summed by g into
 * the first rows of out [N,OC] (OC = C), this rank's rows of the stream.
 * Rank 0 alone adds the bias. */
void tp_row_forward(GPT *m, void *out, const void *in, const void *w, const void *b, int N, int IC,
                    int OC);
/* Its backward from dout [N,OC], made whole by tp_g_backward: dinp [N,IC]
 * (NULL: none) overwritten, dw, db (NULL: none) accumulated. */
void tp_row_backward(GPT *m, void *dinp, float *dw, float *db, const void *dout, const void *inp,
                     const void *w, int N, int IC, int OC);

/* The vocabulary-parallel embedding's ids: local[k] = tokens[k] - v0 for
 * the tokens in this rank's slice [v0, v0 + Vp/tp), -1 for the others. */
void tp_vocab_tokens(const GPT *m, int *local, const int *tokens, size_t n);
/* The cross-entropy of a->logits [N,Vp/tp] against a->targets into
 * a->losses [N]: fused on one rank; over the tp group each rank's three
 * numbers a row are all-gathered and combined. With dloss != 0 the logits
 * become their gradient, scaled by dloss. */
void tp_cross_entropy(GPT *m, GPTActs *a, int N, float dloss);

#endif
