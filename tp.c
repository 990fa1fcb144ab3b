/* tp.c: tensor parallelism, Megatron's way (auto-parallel-partitioning.txt,
 * 3.1 张量并行: a layer's matrices cut by rows and by columns, 行切分 / 列切分;
 * the TP of hybrid-parallelism.txt's DP+PP+TP). picotron's tensor_parallel
 * module, in C.
 *
 * tp ranks split every layer: a rank holds NH/tp heads, 4C/tp of the MLP's
 * hidden units and Vp/tp rows of the vocabulary (layout.c's table says which
 * elements of which tensor). Each pair of linears is cut so that only its
 * ends talk (Shoeybi et al. 2019, Megatron-LM, section 3):
 *  - the column-parallel linear (qkv, fc; Megatron's A cut by columns, our
 *    [out, in] weight by rows) computes its own outputs from the whole
 *    input, with no communication; attention on the rank's heads and GELU
 *    on its hidden units need none either;
 *  - the row-parallel linear (attproj, fcproj) reads those outputs and
 *    produces a partial sum of the layer's output, which the ranks sum.
 * Megatron names the collectives at the two ends f and g, each the other's
 * conjugate: f, before the column-parallel linear, is nothing in forward
 * and an all-reduce of the input's gradient in backward; g, after the
 * row-parallel one, is an all-reduce in forward and nothing in backward.
 * Two a layer in each direction, and none inside.
 *
 * Sequence parallelism (--sp; Korthikanti et al. 2022) cuts what lies
 * between the pairs (the LayerNorms, the residual adds) along the tokens:
 * each rank keeps B*T/tp rows of the residual stream (tp_stream_rows). An
 * all-reduce is a reduce-scatter then an all-gather, so g becomes a
 * reduce-scatter into this rank's rows and f an all-gather out of them
 * (backward swaps the two): the same bytes, and a tp-th of the activations
 * outside the linears. A LayerNorm then sees only its rows, so its
 * weights' gradients are partial and summed over the group.
 *
 * The vocabulary is split too: each rank's embedding looks up the tokens of
 * its slice (the slices' lookups add up through g), and the loss is taken
 * from three numbers a row per rank (its max, its sum of exponentials, the
 * target's logit if it holds it) without gathering the logits.
 *
 * gpt.c calls the functions below where llm.c's train_gpt2.c calls its
 * layernorm and matmul. Beneath them, the group's collectives are bound to
 * the mesh's tp group (TP innermost: one box's NVLink neighbours,
 * DESIGN.md), each consumer waiting for its own collective only, not for
 * the gradient buckets data parallelism has in flight on its own group.
 */
#include <stdio.h>
#include "tp.h"

static CommDtype comm_type(DType t) { return t == DT_BF16 ? COMM_BF16 : COMM_F32; }

static void all_reduce(void *ctx, void *buf, size_t n, DType t) {
    TPGroup *g = ctx;
    comm_op_wait(comm_all_reduce(g->g, g->dev, buf, n, comm_type(t), COMM_SUM), g->dev);
}

static void all_gather(void *ctx, void *out, const void *in, size_t n, DType t) {
    TPGroup *g = ctx;
    comm_op_wait(comm_all_gather(g->g, g->dev, out, in, n * g->g->size, comm_type(t)), g->dev);
}

static void reduce_scatter(void *ctx, void *out, const void *in, size_t n, DType t) {
    TPGroup *g = ctx;
    comm_op_wait(comm_reduce_scatter(g->g, g->dev, out, in, n * g->g->size, comm_type(t), COMM_SUM), g->dev);
}

void tp_attach(GPT *m, TPGroup *t, CommGroup *g, Dev *dev, int sp) {
    t->g = g;
    t->dev = dev;
    m->tpc = (GPTTensorParallel){.sp = sp && m->tp > 1, .ctx = t, .all_reduce = all_reduce,
                                 .all_gather = all_gather, .reduce_scatter = reduce_scatter};
}

/* ---------------------------------------------------------------------------
 * The residual stream's rows, and Megatron's f and g. */

/* Element k of an activation buffer, which holds the dev's dtype. */
static void *elem(const GPT *m, const void *p, size_t k) { return (char *)p + k * m->esz; }

static int sp_on(const GPT *m) { return m->tp > 1 && m->tpc.sp; }

int tp_stream_rows(const GPT *m, int N) { return m->tpc.sp ? N / m->tp : N; }

/* This rank's first row of the stream's N. */
static size_t first_row(const GPT *m, int N) { return sp_on(m) ? (size_t)m->tp_rank * N / m->tp : 0; }

void tp_g_forward(GPT *m, void *out, void *partial, int N) {
    size_t C = m->cfg.dim;
    DType t = m->dev->dtype;
    if (m->tp == 1) { if (out != partial) dev_copy(m->dev, out, partial, (size_t)N * C * m->esz); return; }
    if (sp_on(m)) {   /* out of place: partial [N,C] is the scratch, out gets this rank's rows */
        m->tpc.reduce_scatter(m->tpc.ctx, out, partial, (size_t)N / m->tp * C, t);
    } else {
        m->tpc.all_reduce(m->tpc.ctx, partial, (size_t)N * C, t);
        if (out != partial) dev_copy(m->dev, out, partial, (size_t)N * C * m->esz);
    }
}

const void *tp_g_backward(GPT *m, void *keep, const void *dx, int N) {
    size_t C = m->cfg.dim;
    if (sp_on(m)) {
        void *whole = keep ? keep : m->full;
        m->tpc.all_gather(m->tpc.ctx, whole, dx, (size_t)N / m->tp * C, m->dev->dtype);
        return whole;
    }
    if (!keep) return dx;
    dev_copy(m->dev, keep, dx, (size_t)N * C * m->esz);
    return keep;
}

void tp_layernorm_forward(GPT *m, void *out, float *mean, float *rstd, void *res, const void *x,
                          const void *y, const void *w, const void *b, int N) {
    int C = m->cfg.dim, rows = tp_stream_rows(m, N);
    void *mine = elem(m, out, first_row(m, N) * C);
    if (res) m->dev->ops->add_layernorm_forward(m->dev, res, mine, mean, rstd, x, y, w, b, rows, C);
    else m->dev->ops->layernorm_forward(m->dev, mine, mean, rstd, x, w, b, rows, C);
    if (sp_on(m)) {  /* f: every rank's rows into the whole of out */
        size_t n = (size_t)N / m->tp * C;
        m->tpc.all_gather(m->tpc.ctx, out, elem(m, out, m->tp_rank * n), n, m->dev->dtype);
    }
}

/* A LayerNorm's backward on its rows from dln [rows,C]: the input gradient
 * into dx (NULL: none; w is read only for it), its weights' gradients added
 * into dw, db (NULL: none). With sequence parallelism those are partial,
 * this rank's rows' share, and summed over the group before they are added. */
static void layernorm_grads(GPT *m, void *dx, float *dw, float *db, const void *dln, const void *x,
                            const void *w, const float *mean, const float *rstd, int rows) {
    int C = m->cfg.dim;
    Dev *d = m->dev;
    if (!dw) {
        d->ops->layernorm_backward(d, dx, NULL, NULL, dln, x, w, mean, rstd, rows, C);
    } else if (sp_on(m)) {
        dev_zero(d, m->sp_dw, 2 * (size_t)C * 4);
        d->ops->layernorm_backward(d, dx, m->sp_dw, m->sp_dw + C, dln, x, w, mean, rstd, rows, C);
        m->tpc.all_reduce(m->tpc.ctx, m->sp_dw, 2 * (size_t)C, DT_F32);
        if (db == dw + C) {   /* side by side, as the model lays them out: one add */
            d->ops->accumulate(d, dw, m->sp_dw, 2 * (size_t)C);
        } else {
            d->ops->accumulate(d, dw, m->sp_dw, C);
            d->ops->accumulate(d, db, m->sp_dw + C, C);
        }
    } else {
        d->ops->layernorm_backward(d, dx, dw, db, dln, x, w, mean, rstd, rows, C);
    }
}

void tp_layernorm_backward(GPT *m, void *dx, void *dfull, void *keep, const void *x, const void *w,
                           float *dw, float *db, const float *mean, const float *rstd, int N) {
    int C = m->cfg.dim, rows = tp_stream_rows(m, N);
    void *dln = dfull;
    if (sp_on(m)) {  /* f backward: the partial sums reduce-scattered into this rank's rows */
        dln = keep ? keep : m->dln;
        m->tpc.reduce_scatter(m->tpc.ctx, dln, dfull, (size_t)rows * C, m->dev->dtype);
    } else if (m->tp > 1) {  /* f backward: all-reduced, in place */
        m->tpc.all_reduce(m->tpc.ctx, dfull, (size_t)N * C, m->dev->dtype);
    }
    layernorm_grads(m, dx, dw, db, dln, x, w, mean, rstd, rows);
}

void tp_layernorm_weights(GPT *m, float *dw, float *db, const void *dln, const void *x,
                          const float *mean, const float *rstd, int N) {
    layernorm_grads(m, NULL, dw, db, dln, x, NULL, mean, rstd, tp_stream_rows(m, N));
}

/* ---------------------------------------------------------------------------
 * The two linears: out[N,OC] = in[N,IC] @ w[OC,IC]^T + b on this rank's
 * part of w. */

void tp_column_forward(GPT *m, void *out, const void *in, const void *w, const void *b, int N, int IC,
                       int OC) {
    m->dev->ops->matmul_forward(m->dev, out, in, w, b, N, IC, OC);
}

/* With sequence parallelism the partial sums go to the scratch m->full and
 * are reduce-scattered from there into out's first N/tp rows (NCCL's
 * out-of-place form: no copy after it); else all-reduced in out. */
void tp_row_forward(GPT *m, void *out, const void *in, const void *w, const void *b, int N, int IC,
                    int OC) {
    void *partial = sp_on(m) ? m->full : out;
    m->dev->ops->matmul_forward(m->dev, partial, in, w, m->tp_rank == 0 ? b : NULL, N, IC, OC);
    tp_g_forward(m, out, partial, N);
}

/* Both linears' backward is the same matmul (dinp written, dw and db
 * added to): the collectives are their callers' (f's after a
 * column-parallel one, g's before a row-parallel one). */
static void linear_backward(GPT *m, void *dinp, float *dw, float *db, const void *dout, const void *inp,
                            const void *w, int N, int IC, int OC) {
    m->dev->ops->matmul_backward(m->dev, dinp, dw, db, dout, inp, w, N, IC, OC);
}

void tp_column_backward(GPT *m, void *dinp, float *dw, float *db, const void *dout, const void *inp,
                        const void *w, int N, int IC, int OC) {
    linear_backward(m, dinp, dw, db, dout, inp, w, N, IC, OC);
}

void tp_row_backward(GPT *m, void *dinp, float *dw, float *db, const void *dout, const void *inp,
                     const void *w, int N, int IC, int OC) {
    linear_backward(m, dinp, dw, db, dout, inp, w, N, IC, OC);
}

/* ---------------------------------------------------------------------------
 * The vocabulary-parallel embedding and loss. */

void tp_vocab_tokens(const GPT *m, int *local, const int *tokens, size_t n) {
    int Vl = m->cfg.padded_vocab / m->tp, v0 = m->tp_rank * Vl;
    for (size_t k = 0; k < n; k++) local[k] = tokens[k] >= v0 && tokens[k] < v0 + Vl ? tokens[k] - v0 : -1;
}

void tp_cross_entropy(GPT *m, GPTActs *a, int N, float dloss) {
    const Ops *o = m->dev->ops;
    int V = m->cfg.vocab, Vp = m->cfg.padded_vocab;
    if (m->tp == 1) {
        o->crossentropy(m->dev, a->losses, a->logits, a->targets, N, V, Vp, dloss);
        return;
    }
    /* this rank's slice [v0, v0 + Vl) of the padded vocabulary, of which nvalid are real tokens */
    int Vl = Vp / m->tp, v0 = m->tp_rank * Vl, nvalid = V - v0 < 0 ? 0 : (V - v0 > Vl ? Vl : V - v0);
    float *mine = a->xstats + (size_t)m->tp_rank * N * 3;
    o->xent_stats(m->dev, mine, a->logits, a->targets, N, v0, nvalid, Vl);
    m->tpc.all_gather(m->tpc.ctx, a->xstats, mine, (size_t)N * 3, DT_F32);
    o->xent_combine(m->dev, a->losses, a->lse, a->xstats, N, m->tp);
    if (dloss != 0) o->xent_grad(m->dev, a->logits, a->lse, a->targets, N, v0, nvalid, Vl, dloss);
}
