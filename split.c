/* split.c: every tensor's tensor-parallel cut, in one table, and the walk
 * over a rank's shard, run by run (auto-parallel-partitioning.txt, 3.1
 * 张量并行: 行切分, 列切分, 复制).
 *
 * Megatron writes a linear as Y = X A with A [in, out]; llm.c, and so this
 * program, stores the weight as w = A^T, [out, in], one output per row. So
 * Megatron's column-parallel linear (A cut by columns: each rank computes
 * some outputs) is our w cut by rows, and its row-parallel linear (A cut by
 * rows: each rank reads some inputs, and the partial outputs are summed) is
 * our w cut by columns. The table below names each tensor's cut in the
 * stored tensor's terms and says, case by case, why. tp.c runs the linears
 * and their collectives; this file says only where each element lives.
 *
 * A rank's piece of a tensor (one layer's slice, or the whole-model tensor)
 * is a few runs of equal length, each contiguous both in the rank's layout
 * and in the unsplit tensor: one run for a whole or row-cut tensor, one a
 * third for qkv, one a row for a column-cut weight. layout_runs_next hands
 * them out in llm.c's order, with their offsets on both sides.
 */
#include <string.h>
#include "split.h"

/* The sizes a shape is made of. */
typedef enum { DIM_1, DIM_C, DIM_3C, DIM_4C, DIM_VP, DIM_MAXT } Dim;

static size_t dim_size(const GPTConfig *cfg, Dim d) {
    size_t C = cfg->dim;
    switch (d) {
    case DIM_C: return C;
    case DIM_3C: return 3 * C;
    case DIM_4C: return 4 * C;
    case DIM_VP: return cfg->padded_vocab;
    case DIM_MAXT: return cfg->max_seq;
    default: return 1;
    }
}

/* Every tensor: its cut and its unsplit shape [rows, cols] (one layer's). */
static const struct {
    LayoutCut cut;
    Dim rows, cols;
} table[GPT_NTENSORS] = {
    /* wte [Vp, C]: the vocabulary-parallel embedding and head. Each rank
     * looks up the tokens of its Vp/tp rows (the others' rows add zero, and
     * g sums the ranks' lookups) and scores its Vp/tp logits; the loss is
     * taken over the split vocabulary without gathering them (tp.c). */
    [GPT_WTE] = {LAYOUT_VOCAB, DIM_VP, DIM_C},
    /* wpe [maxT, C]: a position's row is added to every token, whichever
     * rank holds the token's row of wte: kept whole, added once (rank 0). */
    [GPT_WPE] = {LAYOUT_REPLICATED, DIM_MAXT, DIM_C},
    /* ln1w, ln1b [C]: a LayerNorm normalises whole rows of the residual
     * stream, which every rank holds (or, with sequence parallelism, its
     * rows of): the article's 存在无法切分的层, so copied (复制). */
    [GPT_LN1W] = {LAYOUT_REPLICATED, DIM_C, DIM_1},
    [GPT_LN1B] = {LAYOUT_REPLICATED, DIM_C, DIM_1},
    /* qkvw [3C, C], qkvb [3C]: attention's column-parallel linear. Its
     * outputs are the q, k and v of every head, one after the other; a rank
     * computes its NH/tp heads, so it holds its C/tp rows of each third,
     * bias included, and attention runs on its heads with no communication. */
    [GPT_QKVW] = {LAYOUT_QKV, DIM_3C, DIM_C},
    [GPT_QKVB] = {LAYOUT_QKV, DIM_3C, DIM_1},
    /* attprojw [C, C]: the row-parallel linear after attention. Its inputs
     * are the heads' outputs, which a rank has only for its heads: it holds
     * those C/tp columns, and its outputs are partial sums (g sums them). */
    [GPT_ATTPROJW] = {LAYOUT_COLUMNS, DIM_C, DIM_C},
    /* attprojb [C]: added after the sum, so once: whole on every rank,
     * added by rank 0 alone. */
    [GPT_ATTPROJB] = {LAYOUT_REPLICATED, DIM_C, DIM_1},
    /* ln2w, ln2b [C]: a LayerNorm, as ln1. */
    [GPT_LN2W] = {LAYOUT_REPLICATED, DIM_C, DIM_1},
    [GPT_LN2B] = {LAYOUT_REPLICATED, DIM_C, DIM_1},
    /* fcw [4C, C], fcb [4C]: the MLP's column-parallel linear (Megatron's
     * A): a rank computes 4C/tp of the hidden units, its contiguous rows,
     * and GELU, elementwise, needs nothing from the others. */
    [GPT_FCW] = {LAYOUT_ROWS, DIM_4C, DIM_C},
    [GPT_FCB] = {LAYOUT_ROWS, DIM_4C, DIM_1},
    /* fcprojw [C, 4C]: the MLP's row-parallel linear (Megatron's B): it
     * reads the rank's 4C/tp hidden units, the same columns of every row. */
    [GPT_FCPROJW] = {LAYOUT_COLUMNS, DIM_C, DIM_4C},
    /* fcprojb [C]: added after the sum, as attprojb. */
    [GPT_FCPROJB] = {LAYOUT_REPLICATED, DIM_C, DIM_1},
    /* lnfw, lnfb [C]: the final LayerNorm, as ln1. */
    [GPT_LNFW] = {LAYOUT_REPLICATED, DIM_C, DIM_1},
    [GPT_LNFB] = {LAYOUT_REPLICATED, DIM_C, DIM_1},
};

LayoutCut layout_cut(int i) { return table[i].cut; }

void layout_shape(const GPTConfig *cfg, int i, size_t *rows, size_t *cols) {
    *rows = dim_size(cfg, table[i].rows);
    *cols = dim_size(cfg, table[i].cols);
}

/* Rank r of tp's piece of tensor i as nruns runs of len elements: run b is
 * [b len, + len) of the piece here and [first + b stride, + len) of the
 * unsplit piece. */
typedef struct PieceRuns {
    size_t nruns, len, first, stride;
} PieceRuns;

static PieceRuns piece_runs(const GPTConfig *cfg, int i, int tp, int r) {
    size_t R, K;
    layout_shape(cfg, i, &R, &K);
    LayoutCut cut = tp > 1 ? table[i].cut : LAYOUT_REPLICATED;
    switch (cut) {
    case LAYOUT_ROWS:
    case LAYOUT_VOCAB: return (PieceRuns){1, R / tp * K, r * (R / tp) * K, 0};
    case LAYOUT_COLUMNS: return (PieceRuns){R, K / tp, r * (K / tp), K};
    case LAYOUT_QKV: return (PieceRuns){3, R / 3 / tp * K, r * (R / 3 / tp) * K, R / 3 * K};
    default: return (PieceRuns){1, R * K, 0, 0};
    }
}

size_t layout_piece_size(const GPTConfig *cfg, int i, int tp) {
    PieceRuns p = piece_runs(cfg, i, tp, 0);
    return p.nruns * p.len;
}

size_t layout_tensor_size(const GPTConfig *cfg, int i, int nlayers, int has_embed, int has_head, int tp) {
    size_t n = layout_piece_size(cfg, i, tp);
    if (gpt_tensor_per_layer(i)) return (size_t)nlayers * n;
    if (i == GPT_WTE) return has_embed || has_head ? n : 0;
    if (i == GPT_WPE) return has_embed ? n : 0;
    return has_head ? n : 0;  /* lnfw, lnfb */
}

int layout_replicated(int tp, int i) { return tp > 1 && table[i].cut == LAYOUT_REPLICATED; }

int layout_counts(const GPT *m, int i) {
    if (m->tp_rank != 0 && layout_replicated(m->tp, i)) return 0;
    if (i == GPT_WTE && !m->has_embed) return 0;   /* the tied copy */
    return 1;
}

size_t layout_global_offset(const GPTConfig *cfg, int i, int l) {
    size_t off = 0;
    for (int k = 0; k < i; k++) off += layout_tensor_size(cfg, k, cfg->layers, 1, 1, 1);
    return off + (gpt_tensor_per_layer(i) ? (size_t)l * layout_piece_size(cfg, i, 1) : 0);
}

size_t layout_piece_index(const GPT *m, int i, size_t k, size_t *run) {
    PieceRuns p = piece_runs(&m->cfg, i, m->tp, m->tp_rank);
    size_t b = k / p.len, at = k % p.len;
    if (run) *run = p.len - at;
    return p.first + b * p.stride + at;
}

void layout_runs_start(LayoutRuns *w, const GPT *m) {
    memset(w, 0, sizeof *w);
    w->m = m;
    w->tensor = -1;
}

/* Moves to the next piece m holds (the next layer of the tensor, or the
 * next tensor held); 0 at the end. */
static int next_piece(LayoutRuns *w) {
    const GPT *m = w->m;
    int i = w->tensor;
    if (i >= 0 && gpt_tensor_per_layer(i) && w->layer + 1 < m->nlayers) {
        w->layer++;
    } else {
        do i++; while (i < GPT_NTENSORS && !m->sizes[i]);
        if (i == GPT_NTENSORS) return 0;
        w->tensor = i;
        w->layer = 0;
    }
    PieceRuns p = piece_runs(&m->cfg, i, m->tp, m->tp_rank);
    int global_layer = gpt_tensor_per_layer(i) ? gpt_layer_global(m, w->layer) : 0;
    w->run = 0;
    w->nruns = p.nruns;
    w->len = p.len;
    w->first = p.first;
    w->stride = p.stride;
    w->local = gpt_tensor_offset(m, i, w->layer);
    w->global = layout_global_offset(&m->cfg, i, global_layer);
    return 1;
}

int layout_runs_next(LayoutRuns *w, LayoutRun *r) {
    while (w->run == w->nruns)
        if (!next_piece(w)) return 0;
    size_t b = w->run++;
    *r = (LayoutRun){.tensor = w->tensor, .layer = w->layer, .local = w->local + b * w->len,
                     .global = w->global + w->first + b * w->stride, .n = w->len};
    return 1;
}

/* ---------------------------------------------------------------------------
 * gpt.h's functions that are this walk, or one line onto this file's. */

void gpt_llmc_copy(const GPT *m, float *internal, float *llmc, int to_llmc) {
    LayoutRuns w;
    LayoutRun r;
    for (layout_runs_start(&w, m); layout_runs_next(&w, &r);) {
        if (!to_llmc) memcpy(internal + r.local, llmc + r.global, r.n * sizeof(float));
        else if (layout_counts(m, r.tensor)) memcpy(llmc + r.global, internal + r.local, r.n * sizeof(float));
    }
}

/* The names callers outside used before split.c (checkpoint.c, plan.c,
 * test_tp.c): each one line onto this file's. */
int gpt_tensor_replicated(const GPT *m, int i) { return layout_replicated(m->tp, i); }
size_t gpt_layer_size(const GPTConfig *cfg, int i) {
    return gpt_tensor_per_layer(i) ? layout_piece_size(cfg, i, 1) : 0;
}
size_t gpt_tensor_size(const GPTConfig *cfg, int i, int nlayers, int has_embed, int has_head) {
    return layout_tensor_size(cfg, i, nlayers, has_embed, has_head, 1);
}
size_t gpt_shard_index(const GPT *m, int i, size_t k, size_t *run) {
    return layout_piece_index(m, i, k, run);
}
size_t gpt_llmc_offset(const GPTConfig *cfg, int i, int l) { return layout_global_offset(cfg, i, l); }
int gpt_tensor_counts(const GPT *m, int i) { return layout_counts(m, i); }
