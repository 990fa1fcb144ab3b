/* layout.c: the parallel layout's rules and a stage's shard (layout.h; 混合并行,
 * the hybrid-parallelism article's DP+PP+TP+ZeRO).
 *
 * Every rule a layout must satisfy lives in layout_check, each with its one
 * line: the flags' layout (setup.c, before a rank exists), the planner's
 * candidates (plan.c, quietly) and a checkpoint's manifest (checkpoint.c)
 * all pass through it, so train never plans a layout it refuses, and never
 * reads a checkpoint of a layout it could not have written. The rules, in
 * the order a reader meets them in the article:
 *
 *   data parallelism   the parameter server keeps the whole optimizer: no ZeRO
 *   the mesh           dp x cp x tp x pp = the ranks (comm.c's comm_mesh_shape)
 *   context parallel   2 cp divides the sequence (cp.c deals it in 2 cp chunks)
 *   the pipeline       the schedule's own rules (pp_schedule_check); V chunks need 2+ stages
 *   the step           B x T x M x dp tokens fit an int
 *   tensor parallelism tp divides the heads, the MLP's 4C columns and the padded
 *                      vocabulary; with sp, the tokens of a micro-batch and the sequence
 *                      that a rank holds (1/cp of each)
 *   the stages         --stage-layers gives P (or P x V) ranges adding up to the layers;
 *                      else P <= L, and P x V divides L when V > 1
 *
 * layout_stage_shard is the second part: what stage `stage` of a layout
 * holds (its layers, its tp slice, the embedding on the first stage, the
 * head on the last, a split backward under the zero-bubble schedules),
 * built here once for the model (main.c) and the planner (plan.c).
 */
#include <stdio.h>
#include <string.h>
#include "layout.h"
#include "cp.h"
#include "safe.h"

/* Megatron's split (tp.c): heads, the MLP's columns and the vocabulary's
 * rows are cut into tp slices; sequence parallelism cuts a micro-batch's
 * tokens (and, for sampling, one sequence) the same way. */
static int check_tp(const Layout *l, const GPTConfig *cfg, char *err, size_t errlen) {
    int tp = l->tp;
    if (tp == 1) return 0;
    if (cfg->heads % tp) return safe_fail(err, errlen, "--tp %d does not divide %d heads", tp, cfg->heads);
    if ((4 * cfg->dim) % tp)
        return safe_fail(err, errlen, "--tp %d does not divide the MLP's %d columns (4C)", tp, 4 * cfg->dim);
    if (cfg->padded_vocab % tp)
        return safe_fail(err, errlen, "--tp %d does not divide the padded vocabulary %d", tp, cfg->padded_vocab);
    int T = l->seq / l->cp;   /* the tokens of a sequence a rank holds */
    if (l->sp && ((long)l->batch * T) % tp)
        return safe_fail(err, errlen, "--sp: --tp %d does not divide the %ld tokens of a micro-batch (--batch %d x "
                         "--seq %d%s)", tp, (long)l->batch * T, l->batch, l->seq, l->cp > 1 ? " / --cp" : "");
    if (l->sp && T % tp)
        return safe_fail(err, errlen, "--sp: --tp %d does not divide --seq %d%s (sampling runs one sequence)", tp,
                         l->seq, l->cp > 1 ? " / --cp" : "");
    return 0;
}

void layout_stage_layers(int L, int P, int V, const int *ranges, int st, GPTShard *s) {
    int K = P * V, layer = 0;
    s->nlayers = 0;
    s->nchunks = V;
    for (int k = 0; k < K; k++) {
        int n = ranges ? ranges[k] : V == 1 ? L / P + (k < L % P) : L / K;
        if (k % P == st) {
            s->chunk_layer0[k / P] = layer;
            s->chunk_nlayers[k / P] = n;
            s->nlayers += n;
        }
        layer += n;
    }
    s->layer0 = s->chunk_layer0[0];
}

/* The model's layers over P stages of V chunks each (layout_stage_layers'
 * split): given range by range, or as even as the chunks allow. */
static int check_stages(const Layout *l, const GPTConfig *cfg, char *err, size_t errlen) {
    int P = l->pp, V = l->virtual_chunks;
    if (l->nstage_layers) {
        long sum = 0;   /* at most COMM_MAX_RANKS x SAFE_MAX_LAYERS */
        for (int i = 0; i < l->nstage_layers; i++) {
            if (l->stage_layers[i] < 1) return safe_fail(err, errlen, "--stage-layers: range %d holds %d layers", i,
                                                         l->stage_layers[i]);
            sum += l->stage_layers[i];
        }
        if (V == 1 && l->nstage_layers != P)
            return safe_fail(err, errlen, "--stage-layers gives %d stages, --pp is %d", l->nstage_layers, P);
        if (V > 1 && l->nstage_layers != P * V)
            return safe_fail(err, errlen, "--stage-layers gives %d ranges, --pp %d x --virtual %d needs %d (the "
                             "model's chunks in order)", l->nstage_layers, P, V, P * V);
        if (sum != cfg->layers)
            return safe_fail(err, errlen, "--stage-layers adds up to %ld layers, the model has %d", sum, cfg->layers);
    } else if (P > cfg->layers) {
        return safe_fail(err, errlen, "--pp %d exceeds the model's %d layers", P, cfg->layers);
    } else if (V > 1 && cfg->layers % (P * V) != 0) {
        return safe_fail(err, errlen, "--pp %d x --virtual %d = %d chunks: the model's %d layers do not divide into "
                         "them (or give the %d chunks' layers with --stage-layers)", P, V, P * V, cfg->layers, P * V);
    }
    return 0;
}

const char *layout_recompute_flag(RecomputeMode m) {
    static const char *const flag[] = {[RECOMPUTE_NONE] = "", [RECOMPUTE_GELU] = " --recompute-mode gelu",
                                       [RECOMPUTE_NORM] = " --recompute-mode norm", [RECOMPUTE_FULL] = " --recompute"};
    return flag[m];
}

int layout_infer_mesh(Layout *l, int world, char *err, size_t errlen) {
    if (l->cp < 1 || world % l->cp)
        return safe_fail(err, errlen, "--cp %d does not divide the %d ranks", l->cp, world);
    return comm_mesh_shape(world / l->cp, &l->dp, &l->tp, &l->pp, err, errlen);
}

int layout_check(const Layout *l, const GPTConfig *cfg, int world, char *err, size_t errlen) {
    char line[256];   /* the messages of comm.c's and pp_sched.c's rules */
    if (l->dp_mode == DP_PS && l->zero)
        return safe_fail(err, errlen, "--dp-mode ps keeps the whole optimizer on rank 0: it takes no --zero");
    if (l->dp < 1 || l->tp < 1 || l->pp < 1 || l->cp < 1)
        return safe_fail(err, errlen, "--dp %d --cp %d --tp %d --pp %d: each must be 1 or more", l->dp, l->cp, l->tp,
                         l->pp);
    int dp = l->dp, tp = l->tp, pp = l->pp;
    if (world > 0 && layout_infer_mesh(&(Layout){.dp = dp, .tp = tp, .pp = pp, .cp = l->cp}, world, line,
                                       sizeof line) != 0)
        return safe_fail(err, errlen, "%s", line);
    if (cp_check(l->cp, l->seq, line, sizeof line) != 0) return safe_fail(err, errlen, "%s", line);
    if (pp_schedule_check(l->schedule, l->pp, l->micro_batches, l->virtual_chunks, line, sizeof line) != 0)
        return safe_fail(err, errlen, "%s", line);
    if (l->virtual_chunks > 1 && l->pp < 2)
        return safe_fail(err, errlen, "--virtual %d interleaves chunks over stages: it needs --pp 2 or more",
                         l->virtual_chunks);
    if (l->batch < 1 || l->seq < 1)
        return safe_fail(err, errlen, "--batch %d --seq %d: each must be 1 or more", l->batch, l->seq);
    size_t step_tokens;   /* the tokens of a step are ints everywhere: bounded here */
    if (safe_mul_n(&step_tokens, 4, (size_t)l->batch, (size_t)l->seq, (size_t)l->micro_batches, (size_t)l->dp) != 0 ||
        step_tokens > SAFE_MAX_STEP_TOKENS)
        return safe_fail(err, errlen, "--batch %d x --seq %d x --micro-batches %d x dp %d tokens a step is more than %d",
                         l->batch, l->seq, l->micro_batches, l->dp, SAFE_MAX_STEP_TOKENS);
    if (!cfg) return 0;
    if (check_tp(l, cfg, err, errlen) != 0) return -1;
    return check_stages(l, cfg, err, errlen);
}

void layout_stage_shard(const Layout *l, const GPTConfig *cfg, int stage, int tp_rank, GPTShard *s) {
    *s = gpt_whole(cfg);
    s->tp = l->tp;
    s->tp_rank = tp_rank;
    layout_stage_layers(cfg->layers, l->pp, l->virtual_chunks, l->nstage_layers ? l->stage_layers : NULL, stage, s);
    s->has_embed = stage == 0;
    s->has_head = stage == l->pp - 1;
    s->split_backward = pp_schedule_splits(l->schedule);
}

/* ---------------------------------------------------------------------------
 * How every tensor is cut (layout.h): Megatron's split as one table, and the
 * one walk over a shard's runs, local to global (auto-parallel-partitioning.txt,
 * 3.1 张量并行: 行切分, 列切分, 复制).
 *
 * Megatron writes a linear as Y = X A with A [in, out]; llm.c, and so this
 * program, stores the weight as w = A^T, [out, in], one output per row. So
 * Megatron's column-parallel linear (A cut by columns: each rank computes
 * some outputs) is our w cut by rows, and its row-parallel linear (A cut by
 * rows: each rank reads some inputs, and the partial outputs are summed) is
 * our w cut by columns. The table below names each tensor's cut in the
 * stored tensor's terms and says, case by case, why. tp.c runs the linears
 * and their collectives; this part says only where each element lives.
 *
 * A rank's piece of a tensor (one layer's slice, or the whole-model tensor)
 * is a few runs of equal length, each contiguous both in the rank's layout
 * and in the unsplit tensor: one run for a whole or row-cut tensor, one a
 * third for qkv, one a row for a column-cut weight. layout_runs_next hands
 * them out in llm.c's order, with their offsets on both sides. */

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

void layout_llmc_copy(const GPT *m, float *internal, float *llmc, int to_llmc) {
    LayoutRuns w;
    LayoutRun r;
    for (layout_runs_start(&w, m); layout_runs_next(&w, &r);) {
        if (!to_llmc) memcpy(internal + r.local, llmc + r.global, r.n * sizeof(float));
        else if (layout_counts(m, r.tensor)) memcpy(llmc + r.global, internal + r.local, r.n * sizeof(float));
    }
}
