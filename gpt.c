/* gpt.c: GPT-2, forward and backward, for one shard of one stage.
 *
 * The model of llm.c's train_gpt2.c: a layer's forward and backward name
 * every buffer they touch (LayerTensors, LayerActs, LayerDeltas: llm.c's
 * l_ln1w, l_qkv, ...) and call the ops in llm.c's order. What differs is
 * the splits of auto-parallel-partitioning.txt (3.2 流水线并行, 3.1 张量并行,
 * 2 数据并行), each asked of the module that owns it:
 *  - 流水线并行 (pipeline): forward and backward come in three pieces
 *    (embedding, a chunk of layers, head + loss) so a stage runs only its
 *    own. A stage holds one chunk, or V of them for Megatron's interleaved
 *    schedule; the zero-bubble schedules (Qi et al. 2023) split a chunk's
 *    backward into B, the input gradient, and W, the weight gradients,
 *    which B leaves the gradients of every linear's and LayerNorm's output
 *    for (the stash, in the activation set);
 *  - 张量并行 (tensor, Megatron): a rank holds NH/tp heads, 4C/tp MLP columns
 *    and Vp/tp vocabulary rows. Where llm.c calls layernorm and matmul,
 *    this file calls tp.c's, which hold the column- and row-parallel
 *    linears and their collectives (Megatron's f and g, and sequence
 *    parallelism's rows); layout.c's table says where each element of a
 *    shard sits in the unsplit model and which copy counts;
 *  - 数据并行 (data, ZeRO): the unit hooks let dp.c and zero.c reduce
 *    gradients as they are finished and gather sharded parameters on use;
 *  - 重计算 (recompute): a set of activations keeps one slot, not one a
 *    layer, of what the mode recomputes (the GELU output; the LayerNorms'
 *    outputs too; or all but each layer's input), which backward refills
 *    layer by layer through layer_recompute, with the forward's own ops.
 * Nothing here knows how a stage or shard was chosen; it computes what it
 * holds. Every op goes through m->dev->ops, so the same code runs the CPU
 * reference and the CUDA kernels.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "gpt.h"
#include "layout.h"
#include "safe.h"
#include "tp.h"
#include "cp.h"

static const char *tensor_names[GPT_NTENSORS] = {
    "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb",
};

const char *gpt_tensor_name(int i) { return tensor_names[i]; }

int gpt_tensor_decays(int i) {
    return i == GPT_WTE || i == GPT_WPE || i == GPT_QKVW || i == GPT_ATTPROJW ||
           i == GPT_FCW || i == GPT_FCPROJW;
}

int gpt_tensor_per_layer(int i) { return i >= GPT_LN1W && i <= GPT_FCPROJB; }

/* Units in layout order: [wte][wpe] on the first stage, one a layer, then
 * [lnf] and the tied [wte] copy on the last. */
static int unit_of_layer(const GPT *m, int l) { return (m->has_embed ? 2 : 0) + l; }

/* The local layer of unit u, or -1 when it is not a layer. */
static int unit_layer(const GPT *m, int u) {
    int l = u - (m->has_embed ? 2 : 0);
    return l >= 0 && l < m->nlayers ? l : -1;
}

/* The chunk of local layer l. */
static int chunk_of(const GPT *m, int l) {
    int c = 0;
    while (c + 1 < m->nchunks && l >= m->chunk_first[c + 1]) c++;
    return c;
}

int gpt_chunk_layers(const GPT *m, int c) { return m->chunk_first[c + 1] - m->chunk_first[c]; }

int gpt_layer_global(const GPT *m, int l) {
    int c = chunk_of(m, l);
    return m->chunk_layer0[c] + (l - m->chunk_first[c]);
}

int gpt_unit_writer(const GPT *m, int u) {
    int l = unit_layer(m, u);
    if (l >= 0) return 2 * chunk_of(m, l) + (m->split_backward ? 1 : 0);
    int embedding = u < (m->has_embed ? 2 : 0);
    return embedding ? 0 : 2 * (m->nchunks - 1);
}

/* Layers of the largest chunk: what one set of activations holds. A GPT
 * made up for the formula alone (plan.c) may leave nchunks 0: one chunk. */
static int set_layers(const GPT *m) {
    if (m->nchunks <= 1) return m->nlayers;
    int n = 0;
    for (int c = 0; c < m->nchunks; c++)
        if (gpt_chunk_layers(m, c) > n) n = gpt_chunk_layers(m, c);
    return n;
}

int gpt_config_check(GPTConfig *cfg, char *err, size_t errlen) {
    /* Positive, and what the program can run (safe.h): bounded before any size is computed. */
    if (safe_range("layers", cfg->layers, 1, SAFE_MAX_LAYERS, err, errlen) != 0 ||
        safe_range("heads", cfg->heads, 1, SAFE_MAX_HEADS, err, errlen) != 0 ||
        safe_range("dim", cfg->dim, 1, SAFE_MAX_DIM, err, errlen) != 0 ||
        safe_range("max-seq", cfg->max_seq, 1, SAFE_MAX_SEQ, err, errlen) != 0 ||
        safe_range("vocab", cfg->vocab, 1, SAFE_MAX_VOCAB, err, errlen) != 0 ||
        safe_range("padded vocab", cfg->padded_vocab, 0, SAFE_MAX_VOCAB, err, errlen) != 0)
        return -1;
    if (cfg->dim % cfg->heads != 0) {
        snprintf(err, errlen, "--dim %d is not divisible by --heads %d", cfg->dim, cfg->heads);
        return -1;
    }
    if (cfg->padded_vocab == 0) cfg->padded_vocab = (cfg->vocab + 127) / 128 * 128;
    if (cfg->padded_vocab < cfg->vocab) {
        snprintf(err, errlen, "padded vocabulary %d is smaller than the vocabulary %d",
                 cfg->padded_vocab, cfg->vocab);
        return -1;
    }
    return 0;
}

size_t gpt_shard_params(const GPTConfig *cfg, const GPTShard *s) {
    size_t n = 0;
    for (int i = 0; i < GPT_NTENSORS; i++)
        n += layout_tensor_size(cfg, i, s->nlayers, s->has_embed, s->has_head, s->tp);
    return n;
}

GPTShard gpt_whole(const GPTConfig *cfg) {
    return (GPTShard){.layer0 = 0, .nlayers = cfg->layers, .has_embed = 1, .has_head = 1,
                      .tp = 1, .tp_rank = 0};
}

size_t gpt_total_params(const GPTConfig *cfg) {
    GPTShard whole = gpt_whole(cfg);
    return gpt_shard_params(cfg, &whole);
}

void gpt_build(GPT *m, const GPTConfig *cfg, Dev *dev, const GPTShard *s) {
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    m->dev = dev;
    m->layer0 = s->layer0;
    m->nlayers = s->nlayers;
    m->split_backward = s->split_backward;
    m->nchunks = s->nchunks > 1 ? s->nchunks : 1;
    m->chunk_layer0[0] = s->layer0;
    m->chunk_first[1] = s->nlayers;
    if (s->nchunks > 1) {
        for (int c = 0; c < s->nchunks; c++) {
            m->chunk_layer0[c] = s->chunk_layer0[c];
            m->chunk_first[c + 1] = m->chunk_first[c] + s->chunk_nlayers[c];
        }
        m->layer0 = s->chunk_layer0[0];
        if (s->nchunks > GPT_MAX_CHUNKS || m->chunk_first[s->nchunks] != s->nlayers) {
            fprintf(stderr, "error: gpt_build: %d chunks of %d layers in all, the shard says %d\n",
                    s->nchunks, m->chunk_first[s->nchunks], s->nlayers);
            exit(1);
        }
    }
    m->has_embed = s->has_embed;
    m->has_head = s->has_head;
    m->tp = s->tp;
    m->tp_rank = s->tp_rank;
    size_t C = cfg->dim, n = 0, wte = layout_piece_size(cfg, GPT_WTE, m->tp);
    for (int i = 0; i < GPT_NTENSORS; i++)
        m->sizes[i] = layout_tensor_size(cfg, i, m->nlayers, m->has_embed, m->has_head, m->tp);
    m->nunits = (m->has_embed ? 2 : 0) + m->nlayers + (m->has_head ? (m->has_embed ? 1 : 2) : 0);
    m->unit_off = safe_calloc(m->nunits + 1, sizeof(size_t), "the model's unit table");
    m->unit_wte = m->unit_wpe = m->unit_lnf = -1;
    int u = 0;
    if (m->has_embed) {
        m->unit_wte = u; m->unit_off[u++] = n; m->offsets[GPT_WTE] = n; n += wte;
        m->unit_wpe = u; m->unit_off[u++] = n; m->offsets[GPT_WPE] = n; n += (size_t)cfg->max_seq * C;
    }
    for (int i = GPT_LN1W; i <= GPT_FCPROJB; i++) {
        m->offsets[i] = n + m->layer_stride;
        m->layer_stride += layout_piece_size(cfg, i, m->tp);
    }
    for (int l = 0; l < m->nlayers; l++) m->unit_off[u++] = n + (size_t)l * m->layer_stride;
    n += (size_t)m->nlayers * m->layer_stride;
    if (m->has_head) {
        m->unit_lnf = u; m->unit_off[u++] = n;
        m->offsets[GPT_LNFW] = n; n += C;
        m->offsets[GPT_LNFB] = n; n += C;
        if (!m->has_embed) { m->unit_wte = u; m->unit_off[u++] = n; m->offsets[GPT_WTE] = n; n += wte; }
    }
    m->unit_off[u] = n;
    m->num_params = n;
    m->params = dev_alloc(dev, m->num_params * sizeof(float));
    m->grads = dev_alloc(dev, m->num_params * sizeof(float));
    m->uparams = safe_calloc(m->nunits, sizeof(float *), "the model's unit table");
    m->ugrads = safe_calloc(m->nunits, sizeof(float *), "the model's unit table");
    m->esz = dt_size(dev->dtype);
    m->epoch = 1;
    if (dev->dtype != DT_F32) {
        m->lp = dev_alloc(dev, m->num_params * m->esz);
        m->lp_epoch = safe_calloc(m->nunits, sizeof(unsigned), "the model's unit table");
        m->lp_src = safe_calloc(m->nunits, sizeof(float *), "the model's unit table");
    }
    gpt_units_default(m);
}

void gpt_params_changed(GPT *m) { m->epoch++; }

void gpt_params_cast(GPT *m) {
    m->epoch++;
    for (int u = 0; u < m->nunits; u++) {
        m->lp_epoch[u] = m->epoch;
        m->lp_src[u] = m->uparams[u];
    }
}

void gpt_units_default(GPT *m) {
    for (int u = 0; u < m->nunits; u++) {
        size_t uo, un;
        gpt_unit_range(m, u, &uo, &un);
        m->uparams[u] = m->params ? m->params + uo : NULL;
        m->ugrads[u] = m->grads ? m->grads + uo : NULL;
    }
}

void gpt_unit_range(const GPT *m, int u, size_t *offset, size_t *count) {
    *offset = m->unit_off[u];
    *count = m->unit_off[u + 1] - m->unit_off[u];
}

size_t gpt_tensor_offset(const GPT *m, int i, int l) {
    return m->offsets[i] + (gpt_tensor_per_layer(i) ? (size_t)l * m->layer_stride : 0);
}

float *gpt_tensor(const GPT *m, float *base, int i, int l) { return base + gpt_tensor_offset(m, i, l); }

void gpt_segments(const GPT *m, size_t offset, size_t count,
                  void (*fn)(void *ctx, size_t off, size_t n, int tensor), void *ctx) {
    size_t end = offset + count;
    /* pieces in layout order: unit by unit, tensor by tensor */
    for (int u = 0; u < m->nunits; u++) {
        size_t uo, un;
        gpt_unit_range(m, u, &uo, &un);
        if (uo >= end || uo + un <= offset) continue;
        int l = unit_layer(m, u);
        for (int i = 0; i < GPT_NTENSORS; i++) {
            if (!m->sizes[i] || gpt_tensor_per_layer(i) != (l >= 0)) continue;
            size_t a = gpt_tensor_offset(m, i, l), n = layout_piece_size(&m->cfg, i, m->tp);
            if (a < uo || a >= uo + un) continue;  /* another unit's tensor */
            size_t lo = a > offset ? a : offset, hi = a + n < end ? a + n : end;
            if (lo < hi) fn(ctx, lo, hi - lo, i);
        }
    }
}

/* The backward scratch for n rows, in bytes: dx, dln, full [n,C], datty
 * [n,C/tp], dqkv [n,3C/tp], dfch, dfchg [n,4C/tp] in the dtype (esz), the
 * seven buffers of scratch_rows in its order. */
static void scratch_rows_bytes(const GPT *m, size_t n, size_t bytes[7]) {
    size_t C = m->cfg.dim, tp = m->tp, e = m->esz;
    size_t b[7] = {n * C * e, n * C * e, n * C / tp * e, n * 3 * C / tp * e, n * 4 * C / tp * e,
                   n * 4 * C / tp * e, n * C * e};
    memcpy(bytes, b, sizeof b);
}

/* The backward scratch for max_bt rows (n), made (alloc 1) or freed (0):
 * scratch_rows_bytes's seven buffers, and sp_dw [2C] float32. */
static void scratch_rows(GPT *m, int alloc) {
    size_t C = m->cfg.dim, bytes[7];
    void **buf[] = {&m->dx, &m->dln, &m->datty, &m->dqkv, &m->dfch, &m->dfchg, &m->full};
    scratch_rows_bytes(m, (size_t)m->max_bt, bytes);
    for (int k = 0; k < 7; k++) {
        if (alloc) *buf[k] = dev_alloc(m->dev, bytes[k]);
        else dev_free(m->dev, *buf[k], bytes[k]);
    }
    if (alloc) m->sp_dw = dev_alloc(m->dev, 2 * C * 4);
    else dev_free(m->dev, m->sp_dw, 2 * C * 4);
}

/* Floats of the state attention keeps a layer (and of its backward's
 * scratch): the ops table's, or under context parallelism one log-sum-exp a
 * row, [B,NH/tp,T] (cp.c's ring needs no scratch of ours). */
static size_t att_floats(const GPT *m, int B, int T, size_t *scratch) {
    if (!m->cp) return m->dev->ops->attention_floats(B, T, m->cfg.dim / m->tp, m->cfg.heads / m->tp, scratch);
    if (scratch) *scratch = 0;
    return (size_t)B * (m->cfg.heads / m->tp) * T;
}

size_t gpt_scratch_formula(const GPT *m, int B, int T, size_t att_scratch) {
    size_t bytes[7], sum = 2 * (size_t)m->cfg.dim * 4 + att_scratch * 4;
    scratch_rows_bytes(m, (size_t)B * T, bytes);
    for (int k = 0; k < 7; k++) sum += bytes[k];
    return sum;
}

size_t gpt_scratch_bytes(const GPT *m) {
    return (m->max_bt ? gpt_scratch_formula(m, m->max_bt, 1, 0) : 0) + m->datt_floats * 4;
}

/* Sized for the largest B*T seen, and attention's scratch for the largest
 * (B, T) that the ops table asks for. */
static void scratch_ensure(GPT *m, int B, int T) {
    Dev *d = m->dev;
    size_t att_scratch = 0;
    att_floats(m, B, T, &att_scratch);
    if (att_scratch > m->datt_floats) {
        if (m->datt) dev_free(d, m->datt, m->datt_floats * 4);
        m->datt = dev_alloc(d, att_scratch * 4);
        m->datt_floats = att_scratch;
    }
    if (B * T <= m->max_bt) return;
    if (m->max_bt) scratch_rows(m, 0);
    m->max_bt = B * T;
    scratch_rows(m, 1);
}

void gpt_free(GPT *m) {
    Dev *d = m->dev;
    dev_free(d, m->params, m->num_params * 4);
    dev_free(d, m->grads, m->num_params * 4);
    if (m->lp) dev_free(d, m->lp, m->num_params * m->esz);
    free(m->lp_epoch);
    free(m->lp_src);
    free(m->uparams);
    free(m->ugrads);
    free(m->unit_off);
    if (m->datt) dev_free(d, m->datt, m->datt_floats * 4);
    if (m->max_bt) scratch_rows(m, 0);
    memset(m, 0, sizeof *m);
}

/* ---------------------------------------------------------------------------
 * Initialisation from a counter-based generator: the value of element k of
 * tensor i is a pure function of (seed, i, k) in the unsplit model, wherever
 * it is held, so every layout starts from the same model. */

static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static float normal_at(uint64_t seed, int tensor, uint64_t k) {
    uint64_t h = mix64(seed * 0x100000001b3ULL + (uint64_t)tensor);
    uint64_t a = mix64(h ^ (2 * k)), b = mix64(h ^ (2 * k + 1));
    double u1 = ((a >> 11) + 1.0) / 9007199254740993.0;  /* (0, 1] */
    double u2 = (b >> 11) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

void gpt_init_random(GPT *m, uint64_t seed) {
    float *host = safe_malloc(m->num_params * sizeof(float), "the model's initial values");
    float resid_std = 0.02f / sqrtf(2.0f * m->cfg.layers);
    LayoutRuns w;
    LayoutRun r;
    for (layout_runs_start(&w, m); layout_runs_next(&w, &r);) {
        int i = r.tensor, is_ln_w = i == GPT_LN1W || i == GPT_LN2W || i == GPT_LNFW;
        float std = (i == GPT_ATTPROJW || i == GPT_FCPROJW) ? resid_std : 0.02f, *p = host + r.local;
        /* the run's first element's index in the whole model's tensor i */
        uint64_t first = r.global - layout_global_offset(&m->cfg, i, 0);
        #pragma omp parallel for if (r.n >= 4096)
        for (size_t k = 0; k < r.n; k++) {
            if (is_ln_w) p[k] = 1.0f;
            else if (gpt_tensor_decays(i)) p[k] = std * normal_at(seed, i, first + k);
            else p[k] = 0.0f;
        }
    }
    dev_from_host(m->dev, m->params, host, m->num_params * sizeof(float));
    free(host);
    gpt_params_changed(m);
}

/* ---------------------------------------------------------------------------
 * Activations. */

/* The sizes of every buffer of a set of activations, in one place for
 * build and free: the layers' (nl: the largest chunk's layers), the head's
 * (on the last stage), the B->W stash (split backward only). */
#define ACTS_FIELDS(X)                                                        \
    X(x_in, rows * C, E)                                                      \
    X(ln1, nkn * bt * C, E) X(ln1_mean, nk * rows, 4) X(ln1_rstd, nk * rows, 4) \
    X(qkv, nk * bt * 3 * Cl, E) X(atty, nk * bt * Cl, E) X(att, nk * a->att_stride, 4) \
    X(res2, nk * rows * C, E) X(ln2, nkn * bt * C, E) X(ln2_mean, nk * rows, 4) \
    X(ln2_rstd, nk * rows, 4) X(fch, nk * bt * Fl, E) X(fchg, nkg * bt * Fl, E) \
    X(res3, nl * rows * C, E) X(proj, bt * C, E)
#define HEAD_FIELDS(X)                                                        \
    X(lnf, bt * C, E) X(lnf_mean, rows, 4) X(lnf_rstd, rows, 4) X(logits, bt * Vl, E) \
    X(losses, bt, 4) X(xstats, tp * bt * 3, 4) X(lse, bt, 4)
#define STASH_FIELDS(X)                                                       \
    X(g_fcproj, nl * bt * C, E) X(g_fch, nl * bt * Fl, E) X(g_ln2, nl * rows * C, E) \
    X(g_attproj, nl * bt * C, E) X(g_qkv, nl * bt * 3 * Cl, E) X(g_ln1, nl * rows * C, E)

#define ACTS_SIZES                                                                  \
    size_t C = m->cfg.dim, tp = m->tp, Cl = C / tp, Fl = 4 * C / tp, NHl = m->cfg.heads / tp; \
    size_t Vl = m->cfg.padded_vocab / tp, nl = set_layers(m), B = a->B, T = a->T;    \
    size_t bt = B * T, rows = a->rows, nk = a->kept, nkn = a->kept_norm, nkg = a->kept_gelu, E = a->esz; \
    (void)Cl; (void)E; (void)Fl; (void)NHl; (void)Vl; (void)nl; (void)rows; (void)nk; (void)nkn; (void)nkg;

/* A set's shape before anything is allocated: one slot of what the mode
 * recomputes (the modes nest: gelu's fchg, norm's also ln1 and ln2, full's
 * all the inner activations). */
static GPTActs acts_shape(const GPT *m, int B, int T, size_t att_stride) {
    int nl = set_layers(m), one = nl > 0, r = m->recompute;
    return (GPTActs){.B = B, .T = T, .rows = tp_stream_rows(m, B * T), .esz = m->esz, .att_stride = att_stride,
                     .kept = r >= RECOMPUTE_FULL ? one : nl, .kept_norm = r >= RECOMPUTE_NORM ? one : nl,
                     .kept_gelu = r >= RECOMPUTE_GELU ? one : nl};
}

/* Bytes gpt_acts_build allocates for a set on m's shape (m needs only cfg,
 * tp, tpc.sp, nlayers, has_head, recompute, esz; nchunks and chunk_first
 * when it has chunks, split_backward for the stash): the same sums, without
 * a device. att_stride: the ops' attention_floats; cuda: the embedding plan
 * buffer a GPU adds. The planner (plan.c) sizes layouts by it. */
#define SUM(f, n, e) bytes += (size_t)(n) * (e);
size_t gpt_acts_formula(const GPT *m, int B_, int T_, size_t att_stride, int cuda) {
    GPTActs s = acts_shape(m, B_, T_, att_stride);
    GPTActs *a = &s;
    ACTS_SIZES
    size_t bytes = 2 * bt * sizeof(int) + (cuda ? (2 * bt + 1) * sizeof(int) : 0);
    ACTS_FIELDS(SUM)
    if (m->has_head) { HEAD_FIELDS(SUM) }
    return bytes + gpt_stash_formula(m, B_, T_);
}

size_t gpt_stash_formula(const GPT *m, int B_, int T_) {
    GPTActs s = acts_shape(m, B_, T_, 0);
    GPTActs *a = &s;
    ACTS_SIZES
    size_t bytes = 0;
    if (m->split_backward) { STASH_FIELDS(SUM) }
    return bytes;
}
#undef SUM

GPTActs *gpt_acts_build_part(GPT *m, int B_, int T_, int with_head) {
    Dev *d = m->dev;
    GPTActs *a = safe_calloc(1, sizeof *a, "a set of activations");
    *a = acts_shape(m, B_, T_, att_floats(m, B_, T_, NULL));
    a->has_head = with_head && m->has_head;
    ACTS_SIZES
    size_t before = d->bytes_live;
    a->tokens = dev_alloc(d, bt * sizeof(int));
    a->targets = dev_alloc(d, bt * sizeof(int));
    a->embed_plan = d->kind == DEV_CUDA ? dev_alloc(d, (2 * bt + 1) * sizeof(int)) : NULL;
    a->embed_runs = -1;
#define ALLOC(f, n, e) a->f = dev_alloc(d, (size_t)(n) * (e));
    ACTS_FIELDS(ALLOC)
    if (a->has_head) { HEAD_FIELDS(ALLOC) }
    size_t before_stash = d->bytes_live;
    if (m->split_backward) { STASH_FIELDS(ALLOC) }
#undef ALLOC
    a->stash_bytes = d->bytes_live - before_stash;
    a->bytes = d->bytes_live - before;
    scratch_ensure(m, B_, T_);
    return a;
}

GPTActs *gpt_acts_build(GPT *m, int B, int T) { return gpt_acts_build_part(m, B, T, 1); }

void gpt_acts_free(GPT *m, GPTActs *a) {
    if (!a) return;
    Dev *d = m->dev;
    ACTS_SIZES
    dev_free(d, a->tokens, bt * sizeof(int));
    dev_free(d, a->targets, bt * sizeof(int));
    if (a->embed_plan) dev_free(d, a->embed_plan, (2 * bt + 1) * sizeof(int));
#define FREE(f, n, e) dev_free(d, a->f, (size_t)(n) * (e));
    ACTS_FIELDS(FREE)
    if (a->has_head) { HEAD_FIELDS(FREE) }
    if (m->split_backward) { STASH_FIELDS(FREE) }
#undef FREE
    free(a);
}

/* With a plan buffer (GPUs), the embedding backward's plan of the ids just
 * set goes up beside them. */
static void set_tokens(GPT *m, GPTActs *a, const int *ids, size_t bt) {
    dev_from_host(m->dev, a->tokens, ids, bt * sizeof(int));
    if (!a->embed_plan) return;
    int *plan = safe_malloc((2 * bt + 1) * sizeof(int), "the embedding plan");
    a->embed_runs = dev_embed_plan(ids, (int)bt, plan);
    size_t used = (size_t)a->embed_runs + 1 + (size_t)plan[a->embed_runs];
    dev_from_host(m->dev, a->embed_plan, plan, used * sizeof(int));
    free(plan);
}

void gpt_set_batch(GPT *m, GPTActs *a, const int *tokens, const int *targets, int B, int T) {
    size_t bt = (size_t)B * T, bytes = bt * sizeof(int);
    if (tokens && m->tp > 1) {
        /* the embedding looks up ids of this rank's vocabulary slice; -1 elsewhere */
        int *local = safe_malloc(bytes + 1, "the vocabulary shard's tokens");
        tp_vocab_tokens(m, local, tokens, bt);
        set_tokens(m, a, local, bt);
        free(local);
    } else if (tokens) {
        set_tokens(m, a, tokens, bt);
    }
    if (targets) dev_from_host(m->dev, a->targets, targets, bytes);
}

/* Element k of an activation buffer: buffers hold the dev's dtype, so
 * offsets are counted in elements and scaled by m->esz here. */
static void *at(const GPT *m, const void *p, size_t k) { return (char *)p + k * m->esz; }

/* ---------------------------------------------------------------------------
 * Units and hooks (gpt.h's GPTHooks): a unit's parameters are read through
 * m->uparams[u], or under mixed precision through its bf16 copy in m->lp,
 * remade at the acquire when the float32 values may have changed (a new
 * epoch, or another source buffer); its gradients are written through
 * m->ugrads[u]. */

static int tensor_unit(const GPT *m, int i, int l) {
    if (gpt_tensor_per_layer(i)) return unit_of_layer(m, l);
    if (i == GPT_WTE) return m->unit_wte;
    if (i == GPT_WPE) return m->unit_wpe;
    return m->unit_lnf;
}

/* Tensor i of local layer l, where it is now: its parameters (the compute
 * copy, in the dev's dtype) and its gradients (float32). */
static void *param(const GPT *m, int i, int l) {
    if (m->lp) return at(m, m->lp, gpt_tensor_offset(m, i, l));
    int u = tensor_unit(m, i, l);
    return m->uparams[u] + (gpt_tensor_offset(m, i, l) - m->unit_off[u]);
}
static void *grad(const GPT *m, int i, int l) {
    int u = tensor_unit(m, i, l);
    return m->ugrads[u] + (gpt_tensor_offset(m, i, l) - m->unit_off[u]);
}

static void params_acquire(GPT *m, int u) {
    if (m->hooks.params_acquire) m->hooks.params_acquire(m->hooks.ctx, m, u);
    if (m->lp && (m->lp_epoch[u] != m->epoch || m->lp_src[u] != m->uparams[u])) {
        size_t uo, un;
        gpt_unit_range(m, u, &uo, &un);
        m->dev->ops->cast(m->dev, at(m, m->lp, uo), m->uparams[u], un);
        m->lp_epoch[u] = m->epoch;
        m->lp_src[u] = m->uparams[u];
    }
}
static void params_release(GPT *m, int u) {
    if (m->hooks.params_release) m->hooks.params_release(m->hooks.ctx, m, u);
}
static void grads_acquire(GPT *m, int u) {
    if (m->hooks.grads_acquire) m->hooks.grads_acquire(m->hooks.ctx, m, u);
}
static void grads_ready(GPT *m, int u) {
    if (m->hooks.grads_ready) m->hooks.grads_ready(m->hooks.ctx, m, u);
}

/* ---------------------------------------------------------------------------
 * A layer's named buffers, llm.c's l_ln1w, l_qkv, ... Shapes are this
 * rank's: N = B*T rows (a set's own B and T give its strides), `rows` the
 * residual stream's (N, or N/tp with sequence parallelism), Cl = C/tp,
 * Fl = 4C/tp. */

/* One layer's tensors: its parameters (layer_tensors(m, l, param)) or
 * their gradients (layer_tensors(m, l, grad); all NULL: none written). */
typedef struct LayerTensors {
    void *ln1w, *ln1b;          /* [C] */
    void *qkvw, *qkvb;          /* [3Cl,C], [3Cl] */
    void *attprojw, *attprojb;  /* [C,Cl], [C] */
    void *ln2w, *ln2b;          /* [C] */
    void *fcw, *fcb;            /* [Fl,C], [Fl] */
    void *fcprojw, *fcprojb;    /* [C,Fl], [C] */
} LayerTensors;

static LayerTensors layer_tensors(const GPT *m, int l, void *(*t)(const GPT *, int, int)) {
    return (LayerTensors){.ln1w = t(m, GPT_LN1W, l), .ln1b = t(m, GPT_LN1B, l), .qkvw = t(m, GPT_QKVW, l),
        .qkvb = t(m, GPT_QKVB, l), .attprojw = t(m, GPT_ATTPROJW, l), .attprojb = t(m, GPT_ATTPROJB, l),
        .ln2w = t(m, GPT_LN2W, l), .ln2b = t(m, GPT_LN2B, l), .fcw = t(m, GPT_FCW, l),
        .fcb = t(m, GPT_FCB, l), .fcprojw = t(m, GPT_FCPROJW, l), .fcprojb = t(m, GPT_FCPROJB, l)};
}

/* Layer j of a set: its parameters are those of local layer
 * chunk_first[chunk] + j. */
static int set_layer(const GPT *m, const GPTActs *a, int j) { return m->chunk_first[a->chunk] + j; }

/* One layer's activations in a set. */
typedef struct LayerActs {
    void *ln1;                   /* [N,C] all rows, gathered */
    float *ln1_mean, *ln1_rstd;  /* [rows] */
    void *qkv;                   /* [N,3Cl] */
    void *atty;                  /* [N,Cl] */
    float *att;                  /* [att_stride] what attention keeps for backward */
    void *res2;                  /* [rows,C] the stream after attention */
    void *ln2;                   /* [N,C] */
    float *ln2_mean, *ln2_rstd;  /* [rows] */
    void *fch, *fchg;            /* [N,Fl] fc's output, and after GELU */
    void *res3;                  /* [rows,C] the layer's output */
} LayerActs;

/* 重计算: what the mode recomputes has one slot in a set, which every
 * layer's forward refills; the rest one a layer. The output res3 always
 * has a place of its own: it is the next layer's input. */
static LayerActs layer_acts(const GPT *m, const GPTActs *a, int j) {
    size_t C = m->cfg.dim, Cl = C / m->tp, Fl = 4 * C / m->tp, N = (size_t)a->B * a->T, rows = a->rows;
    size_t slot = a->kept == 1 ? 0 : (size_t)j, sn = a->kept_norm == 1 ? 0 : (size_t)j;
    size_t sg = a->kept_gelu == 1 ? 0 : (size_t)j;
    return (LayerActs){
        .ln1 = at(m, a->ln1, sn * N * C), .ln1_mean = a->ln1_mean + slot * rows,
        .ln1_rstd = a->ln1_rstd + slot * rows, .qkv = at(m, a->qkv, slot * N * 3 * Cl),
        .atty = at(m, a->atty, slot * N * Cl), .att = a->att + slot * a->att_stride,
        .res2 = at(m, a->res2, slot * rows * C), .ln2 = at(m, a->ln2, sn * N * C),
        .ln2_mean = a->ln2_mean + slot * rows, .ln2_rstd = a->ln2_rstd + slot * rows,
        .fch = at(m, a->fch, slot * N * Fl), .fchg = at(m, a->fchg, sg * N * Fl),
        .res3 = at(m, a->res3, (size_t)j * rows * C)};
}

/* Where a layer's backward puts the gradients of its outputs (llm.c's
 * dl_ buffers): scratch when whole; for a split backward's B, the set's
 * stash, which W reads. */
typedef struct LayerDeltas {
    void *fcproj;    /* [N,C] of fcproj's output, made whole (NULL: not kept) */
    void *fch;       /* [N,Fl] of fc's output, pre-GELU */
    void *ln2_full;  /* [N,C] of fc's input: this rank's partial sums */
    void *ln2;       /* [rows,C] of ln2's output, summed (NULL: not kept) */
    void *attproj;   /* [N,C] of attproj's output, made whole (NULL: not kept) */
    void *qkv;       /* [N,3Cl] of qkv's output */
    void *ln1_full;  /* [N,C] of qkv's input: partial sums */
    void *ln1;       /* [rows,C] of ln1's output, summed (NULL: not kept) */
} LayerDeltas;

static LayerDeltas scratch_deltas(GPT *m) {
    return (LayerDeltas){.fch = m->dfch, .ln2_full = m->full, .qkv = m->dqkv, .ln1_full = m->full};
}

/* The stash of layer j. Without sequence parallelism a LayerNorm's summed
 * output gradient is its linear's input gradient summed in place, so that
 * sum is made in the stash itself. */
static LayerDeltas stash_deltas(GPT *m, const GPTActs *a, int j) {
    size_t C = m->cfg.dim, Cl = C / m->tp, Fl = 4 * C / m->tp, N = (size_t)a->B * a->T, rows = a->rows;
    void *ln2 = at(m, a->g_ln2, j * rows * C), *ln1 = at(m, a->g_ln1, j * rows * C);
    int all_rows = rows == N;
    return (LayerDeltas){
        .fcproj = at(m, a->g_fcproj, j * N * C), .fch = at(m, a->g_fch, j * N * Fl),
        .ln2_full = all_rows ? ln2 : m->full, .ln2 = ln2, .attproj = at(m, a->g_attproj, j * N * C),
        .qkv = at(m, a->g_qkv, j * N * 3 * Cl), .ln1_full = all_rows ? ln1 : m->full, .ln1 = ln1};
}

/* ---------------------------------------------------------------------------
 * Forward. */

void gpt_embed_forward(GPT *m, GPTActs *a, int B, int T) {
    params_acquire(m, m->unit_wte);
    params_acquire(m, m->unit_wpe);
    /* each rank looks up the tokens of its vocabulary slice, g sums them;
     * wpe is added once */
    void *rows_out = m->tp > 1 ? m->full : a->x_in;
    const float *wpe = param(m, GPT_WPE, 0);   /* with cp, the rows of this rank's positions */
    if (m->cp) wpe = cp_positions(m->cp, wpe, T * m->cp->N, m->cfg.dim);
    m->dev->ops->encoder_forward(m->dev, rows_out, a->tokens, param(m, GPT_WTE, 0), m->tp_rank == 0 ? wpe : NULL,
                                 B, T, m->cfg.dim);
    if (m->tp > 1) tp_g_forward(m, a->x_in, m->full, B * T);
    params_release(m, m->unit_wpe);
    if (!m->has_head) params_release(m, m->unit_wte);  /* else the head releases it */
}

/* The input of layer j of the set: the previous layer's output, or the chunk's input. */
static const void *layer_input(const GPT *m, const GPTActs *a, int j) {
    return j ? at(m, a->res3, (size_t)(j - 1) * a->rows * m->cfg.dim) : a->x_in;
}

/* One transformer block, layer j of the set, on its input into its res3. */
static void layer_forward(GPT *m, GPTActs *a, int j, int B, int T) {
    const Ops *o = m->dev->ops;
    Dev *d = m->dev;
    int C = m->cfg.dim, Cl = C / m->tp, Fl = 4 * C / m->tp, NHl = m->cfg.heads / m->tp, N = B * T;
    int l = set_layer(m, a, j), u = unit_of_layer(m, l);
    const void *x = layer_input(m, a, j);
    params_acquire(m, u);
    LayerTensors w = layer_tensors(m, l, param);
    LayerActs L = layer_acts(m, a, j);
    /* attention: res2 = x + attproj(attention(qkv(ln1(x)))) */
    tp_layernorm_forward(m, L.ln1, L.ln1_mean, L.ln1_rstd, NULL, x, NULL, w.ln1w, w.ln1b, N);
    tp_column_forward(m, L.qkv, L.ln1, w.qkvw, w.qkvb, N, C, 3 * Cl);
    if (m->cp) cp_attention_forward(m->cp, L.atty, L.att, L.qkv, B, T * m->cp->N, Cl, NHl);   /* the ring */
    else o->attention_forward(d, L.atty, L.att, L.qkv, B, T, Cl, NHl);
    tp_row_forward(m, a->proj, L.atty, w.attprojw, w.attprojb, N, Cl, C);
    /* MLP: res3 = res2 + fcproj(gelu(fc(ln2(res2)))); res2 is made in ln2's pass */
    tp_layernorm_forward(m, L.ln2, L.ln2_mean, L.ln2_rstd, L.res2, x, a->proj, w.ln2w, w.ln2b, N);
    /* fc (column-parallel: no communication) and GELU in one op; fch is kept for GELU's backward */
    o->matmul_forward_gelu(d, L.fch, L.fchg, L.ln2, w.fcw, w.fcb, N, C, Fl);
    tp_row_forward(m, a->proj, L.fchg, w.fcprojw, w.fcprojb, N, Fl, C);
    o->add(d, L.res3, L.res2, a->proj, (size_t)tp_stream_rows(m, N) * C);
    params_release(m, u);
}

/* The output of the set's chunk: its last layer's res3, or the input when it has no layers. */
static const void *chunk_output(const GPT *m, const GPTActs *a) {
    int nl = gpt_chunk_layers(m, a->chunk);
    return nl ? layer_input(m, a, nl) : a->x_in;
}

void *gpt_chunk_forward(GPT *m, GPTActs *a, int c, int B, int T) {
    a->chunk = c;
    for (int j = 0; j < gpt_chunk_layers(m, c); j++) layer_forward(m, a, j, B, T);
    return (void *)chunk_output(m, a);
}

/* Final LayerNorm and the tied head over this rank's vocabulary slice. */
void gpt_head_logits(GPT *m, GPTActs *a, int B, int T) {
    int C = m->cfg.dim, N = B * T;
    params_acquire(m, m->unit_lnf);
    if (!m->has_embed) params_acquire(m, m->unit_wte);  /* else the embedding's forward holds it */
    tp_layernorm_forward(m, a->lnf, a->lnf_mean, a->lnf_rstd, NULL, chunk_output(m, a), NULL,
                         param(m, GPT_LNFW, 0), param(m, GPT_LNFB, 0), N);
    tp_column_forward(m, a->logits, a->lnf, param(m, GPT_WTE, 0), NULL, N, C, m->cfg.padded_vocab / m->tp);
    params_release(m, m->unit_lnf);
    params_release(m, m->unit_wte);
}

double gpt_head_forward(GPT *m, GPTActs *a, int B, int T, float dloss) {
    int N = B * T;
    gpt_head_logits(m, a, B, T);
    tp_cross_entropy(m, a, N, dloss);
    return m->dev->ops->sum(m->dev, a->losses, N) / N;
}

/* ---------------------------------------------------------------------------
 * Backward. The residual stream's gradient travels in m->dx, this rank's
 * rows: the head writes it, each layer turns it in place from its output's
 * into its input's, the embedding reads it. */

void gpt_head_backward(GPT *m, GPTActs *a, int B, int T) {
    int C = m->cfg.dim, N = B * T;
    params_acquire(m, m->unit_lnf);
    params_acquire(m, m->unit_wte);
    grads_acquire(m, m->unit_lnf);
    grads_acquire(m, m->unit_wte);  /* on a stage with the embedding, ready after its backward */
    tp_column_backward(m, m->full, grad(m, GPT_WTE, 0), NULL, a->logits, a->lnf, param(m, GPT_WTE, 0), N, C,
                       m->cfg.padded_vocab / m->tp);
    dev_zero(m->dev, m->dx, (size_t)tp_stream_rows(m, N) * C * m->esz);
    tp_layernorm_backward(m, m->dx, m->full, NULL, chunk_output(m, a), param(m, GPT_LNFW, 0),
                          grad(m, GPT_LNFW, 0), grad(m, GPT_LNFB, 0), a->lnf_mean, a->lnf_rstd, N);
    grads_ready(m, m->unit_lnf);
    if (!m->has_embed) grads_ready(m, m->unit_wte);
    params_release(m, m->unit_lnf);
    params_release(m, m->unit_wte);
}

/* Layer j's backward through its two branches, llm.c's order: the
 * residual's gradient passes straight through m->dx and each branch adds
 * its own through its LayerNorm's backward. The outputs' gradients go
 * where dl says, the parameters' into dw. */
static void layer_backprop(GPT *m, GPTActs *a, int j, int B, int T, const LayerDeltas *dl,
                           const LayerTensors *dw) {
    const Ops *o = m->dev->ops;
    Dev *d = m->dev;
    int C = m->cfg.dim, Cl = C / m->tp, Fl = 4 * C / m->tp, NHl = m->cfg.heads / m->tp, N = B * T;
    LayerTensors w = layer_tensors(m, set_layer(m, a, j), param);
    LayerActs L = layer_acts(m, a, j);
    /* MLP: res3 = res2 + fcproj(gelu(fc(ln2(res2)))) */
    const void *dres3 = tp_g_backward(m, dl->fcproj, m->dx, N);
    if (dw->fcprojw || dw->fcprojb)
        tp_row_backward(m, NULL, dw->fcprojw, dw->fcprojb, dres3, L.fchg, w.fcprojw, N, Fl, C);
    /* fcproj's input gradient through GELU's backward in one op (the
     * product local to the rank, as the row-parallel linear's is; m->dfchg
     * its scratch where the table runs the two ops), with fc's bias
     * gradient from the same pass (NULL in a split backward's B: W sums it
     * from the stash) */
    o->matmul_backward_gelu(d, dl->fch, dw->fcb, m->dfchg, dres3, w.fcprojw, L.fch, N, Fl, C);
    tp_column_backward(m, dl->ln2_full, dw->fcw, NULL, dl->fch, L.ln2, w.fcw, N, C, Fl);
    tp_layernorm_backward(m, m->dx, dl->ln2_full, dl->ln2, L.res2, w.ln2w, dw->ln2w, dw->ln2b, L.ln2_mean,
                          L.ln2_rstd, N);
    /* attention: res2 = x + attproj(attention(qkv(ln1(x)))) */
    const void *dres2 = tp_g_backward(m, dl->attproj, m->dx, N);
    tp_row_backward(m, m->datty, dw->attprojw, dw->attprojb, dres2, L.atty, w.attprojw, N, Cl, C);
    if (m->cp) cp_attention_backward(m->cp, dl->qkv, m->datty, L.qkv, L.atty, L.att, B, T * m->cp->N, Cl, NHl);
    else o->attention_backward(d, dl->qkv, m->datt, m->datty, L.qkv, L.atty, L.att, B, T, Cl, NHl);
    tp_column_backward(m, dl->ln1_full, dw->qkvw, dw->qkvb, dl->qkv, L.ln1, w.qkvw, N, C, 3 * Cl);
    tp_layernorm_backward(m, m->dx, dl->ln1_full, dl->ln1, layer_input(m, a, j), w.ln1w, dw->ln1w, dw->ln1b,
                          L.ln1_mean, L.ln1_rstd, N);
}

/* 重计算: what the set keeps one slot of, made again for layer j by the
 * forward's own ops on the forward's inputs, so the bits are the
 * forward's: full, the whole layer from its input; norm, the LayerNorms
 * from the layer's input and res2 (gathered again under sequence
 * parallelism, as forward did); gelu and norm, the GELU from fc's output.
 * A chunk of one layer still has them from its forward. */
static void layer_recompute(GPT *m, GPTActs *a, int j, int B, int T) {
    int l = set_layer(m, a, j), u = unit_of_layer(m, l), N = B * T;
    if (gpt_chunk_layers(m, a->chunk) == 1) return;
    if (a->kept == 1) { layer_forward(m, a, j, B, T); return; }
    LayerActs L = layer_acts(m, a, j);
    if (a->kept_norm == 1) {
        params_acquire(m, u);
        LayerTensors w = layer_tensors(m, l, param);
        tp_layernorm_forward(m, L.ln1, L.ln1_mean, L.ln1_rstd, NULL, layer_input(m, a, j), NULL, w.ln1w, w.ln1b, N);
        tp_layernorm_forward(m, L.ln2, L.ln2_mean, L.ln2_rstd, NULL, L.res2, NULL, w.ln2w, w.ln2b, N);
        params_release(m, u);
    }
    if (a->kept_gelu == 1) m->dev->ops->gelu_forward(m->dev, L.fchg, L.fch, (size_t)N * 4 * m->cfg.dim / m->tp);
}

/* Layer j's backward: whole, its parameters' gradients with the input's;
 * or split, a zero-bubble schedule's B: the input's alone, the outputs'
 * left in the stash for W. */
static void layer_backward(GPT *m, GPTActs *a, int j, int B, int T, int split) {
    int l = set_layer(m, a, j), u = unit_of_layer(m, l);
    params_acquire(m, u);
    if (!split) grads_acquire(m, u);
    /* 重计算: a split backward's B reads only what full recompute drops */
    if (!split || a->kept == 1) layer_recompute(m, a, j, B, T);
    LayerDeltas dl = split ? stash_deltas(m, a, j) : scratch_deltas(m);
    LayerTensors dw = split ? (LayerTensors){0} : layer_tensors(m, l, grad);
    layer_backprop(m, a, j, B, T, &dl, &dw);
    if (!split) grads_ready(m, u);
    params_release(m, u);
}

/* A split backward's W of layer j: every parameter gradient from the
 * stash B left and the layer's activations. No input gradient, so no
 * parameter is read but by the recompute. */
static void layer_backward_weights(GPT *m, GPTActs *a, int j, int B, int T) {
    int C = m->cfg.dim, Cl = C / m->tp, Fl = 4 * C / m->tp, N = B * T;
    int l = set_layer(m, a, j), u = unit_of_layer(m, l);
    grads_acquire(m, u);
    /* 重计算: after B the slots hold layer 0's (full) or the forward's last layer's */
    if (a->kept != 1 || j > 0) layer_recompute(m, a, j, B, T);
    LayerActs L = layer_acts(m, a, j);
    LayerDeltas s = stash_deltas(m, a, j);
    LayerTensors dw = layer_tensors(m, l, grad);
    /* MLP */
    tp_row_backward(m, NULL, dw.fcprojw, dw.fcprojb, s.fcproj, L.fchg, NULL, N, Fl, C);
    tp_column_backward(m, NULL, dw.fcw, dw.fcb, s.fch, L.ln2, NULL, N, C, Fl);
    tp_layernorm_weights(m, dw.ln2w, dw.ln2b, s.ln2, L.res2, L.ln2_mean, L.ln2_rstd, N);
    /* attention */
    tp_row_backward(m, NULL, dw.attprojw, dw.attprojb, s.attproj, L.atty, NULL, N, Cl, C);
    tp_column_backward(m, NULL, dw.qkvw, dw.qkvb, s.qkv, L.ln1, NULL, N, C, 3 * Cl);
    tp_layernorm_weights(m, dw.ln1w, dw.ln1b, s.ln1, layer_input(m, a, j), L.ln1_mean, L.ln1_rstd, N);
    grads_ready(m, u);
}

/* The chunk's layers backward, last to first. */
static void chunk_backward(GPT *m, GPTActs *a, int c, int B, int T, int split) {
    a->chunk = c;
    for (int j = gpt_chunk_layers(m, c) - 1; j >= 0; j--) layer_backward(m, a, j, B, T, split);
}

void gpt_chunk_backward(GPT *m, GPTActs *a, int c, int B, int T) { chunk_backward(m, a, c, B, T, 0); }

void gpt_chunk_backward_input(GPT *m, GPTActs *a, int c, int B, int T) { chunk_backward(m, a, c, B, T, 1); }

/* W takes the layers first to last: with recompute, layer 0 is what B left in the slot. */
void gpt_chunk_backward_weights(GPT *m, GPTActs *a, int c, int B, int T) {
    a->chunk = c;
    for (int j = 0; j < gpt_chunk_layers(m, c); j++) layer_backward_weights(m, a, j, B, T);
}

void gpt_embed_backward(GPT *m, GPTActs *a, int B, int T) {
    if (!m->has_head) grads_acquire(m, m->unit_wte);  /* else taken by the head's backward */
    grads_acquire(m, m->unit_wpe);
    /* every rank needs all rows' gradient: its wte rows serve tokens anywhere */
    const void *dout = tp_g_backward(m, NULL, m->dx, B * T);
    float *dwpe = m->cp ? cp_positions_grad(m->cp, T * m->cp->N, m->cfg.dim) : grad(m, GPT_WPE, 0);
    m->dev->ops->encoder_backward(m->dev, grad(m, GPT_WTE, 0), dwpe, dout, a->tokens,
                                  a->embed_runs >= 0 ? a->embed_plan : NULL, a->embed_runs, B, T,
                                  m->cfg.dim);
    if (m->cp) cp_positions_done(m->cp, grad(m, GPT_WPE, 0), T * m->cp->N, m->cfg.dim);
    grads_ready(m, m->unit_wpe);
    grads_ready(m, m->unit_wte);
}

double gpt_forward_backward(GPT *m, GPTActs *a, int B, int T, float dloss) {
    gpt_embed_forward(m, a, B, T);
    gpt_chunk_forward(m, a, 0, B, T);
    double loss = gpt_head_forward(m, a, B, T, dloss);
    gpt_head_backward(m, a, B, T);
    gpt_chunk_backward(m, a, 0, B, T);
    gpt_embed_backward(m, a, B, T);
    return loss;
}

double gpt_forward_loss(GPT *m, GPTActs *a, int B, int T) {
    gpt_embed_forward(m, a, B, T);
    gpt_chunk_forward(m, a, 0, B, T);
    return gpt_head_forward(m, a, B, T, 0.0f);
}

/* ---------------------------------------------------------------------------
 * Presets: OpenAI's GPT-2 sizes (llm.c's d12 .. d48 name the same models by
 * depth) and GPT-3's, for --model and the planner. */

typedef struct { const char *name, *alias; int layers, heads, dim, seq; } GPTPreset;
static const GPTPreset presets[] = {
    {"gpt2", "d12", 12, 12, 768, 1024},          {"gpt2-medium", "d24", 24, 16, 1024, 1024},
    {"gpt2-large", "d36", 36, 20, 1280, 1024},   {"gpt2-xl", "d48", 48, 25, 1600, 1024},
    {"gpt3-125m", NULL, 12, 12, 768, 2048},      {"gpt3-1.3b", NULL, 24, 16, 2048, 2048},
    {"gpt3-2.7b", NULL, 32, 32, 2560, 2048},     {"gpt3-6.7b", NULL, 32, 32, 4096, 2048},
    {"gpt3-13b", NULL, 40, 40, 5120, 2048},      {"gpt3-175b", NULL, 96, 96, 12288, 2048},
};

int gpt_preset(const char *name, GPTConfig *cfg) {
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        const GPTPreset *p = &presets[i];
        if (strcmp(name, p->name) && (!p->alias || strcmp(name, p->alias))) continue;
        memset(cfg, 0, sizeof *cfg);
        cfg->layers = p->layers; cfg->heads = p->heads; cfg->dim = p->dim; cfg->max_seq = p->seq;
        cfg->vocab = 50257;   /* padded to 50304 by gpt_config_check, as llm.c pads it */
        return 0;
    }
    return -1;
}
