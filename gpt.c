/* gpt.c: GPT-2, forward and backward, for one shard of one stage.
 *
 * The model of llm.c's train_gpt2.c, reshaped for the splits of
 * auto-parallel-partitioning.txt (3.2 流水线并行, 3.1 张量并行, 2 数据并行):
 *  - 流水线并行 (pipeline): forward and backward come in three pieces
 *    (embedding, a chunk of layers, head + loss) so a stage runs only its
 *    own. A stage holds one chunk, or V of them for Megatron's interleaved
 *    schedule; the zero-bubble schedules (Qi et al. 2023) split a chunk's
 *    backward into B, the input gradient, and W, the weight gradients,
 *    which B leaves the gradients of every linear's and LayerNorm's output
 *    for (the stash, in the activation set);
 *  - 张量并行 (tensor, Megatron): a rank holds NH/tp heads, 4C/tp MLP columns
 *    and Vp/tp vocabulary rows. The column-parallel linears (qkv, fc) need
 *    nothing in forward and all-reduce their input's gradient in backward;
 *    the row-parallel ones (attproj, fcproj) all-reduce their output in
 *    forward and nothing in backward: Megatron's conjugate f and g. The
 *    embedding all-reduces its looked-up rows, and the loss is taken over
 *    the split vocabulary without gathering the logits. With sequence
 *    parallelism the all-reduces become reduce-scatters into sequence shards
 *    and all-gathers out of them, and LayerNorm and the residual stream work
 *    on B*T/tp rows;
 *  - 数据并行 (data, ZeRO): the unit hooks let dp.c and zero.c reduce
 *    gradients as they are finished and gather sharded parameters on use.
 * Nothing here knows how a stage or shard was chosen; it computes what it
 * holds. Two facts about the split live here and nowhere else: where a tp
 * shard's element sits in the unsplit tensor (gpt_shard_index) and which
 * copy of a replicated or tied tensor counts (gpt_tensor_counts); --save,
 * the initialisation, the gradient norm (zero.c) and the checkpoints
 * (checkpoint.c) all ask them. Every op goes through m->dev->ops, so the same code runs the CPU
 * reference and the CUDA kernels.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "gpt.h"
#include "safe.h"

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

int gpt_tensor_replicated(const GPT *m, int i) {
    if (m->tp == 1) return 0;
    return !(i == GPT_WTE || i == GPT_QKVW || i == GPT_QKVB || i == GPT_ATTPROJW ||
             i == GPT_FCW || i == GPT_FCB || i == GPT_FCPROJW);
}

/* Elements of one layer of tensor i on a shard of tp ranks. */
static size_t layer_size_tp(const GPTConfig *cfg, int i, int tp) {
    size_t C = cfg->dim, Cl = C / tp, Fl = 4 * C / tp;
    switch (i) {
    case GPT_LN1W: case GPT_LN1B: case GPT_LN2W: case GPT_LN2B:
    case GPT_ATTPROJB: case GPT_FCPROJB: return C;
    case GPT_QKVW: return 3 * Cl * C;
    case GPT_QKVB: return 3 * Cl;
    case GPT_ATTPROJW: return C * Cl;
    case GPT_FCW: case GPT_FCPROJW: return Fl * C;
    case GPT_FCB: return Fl;
    default: return 0;
    }
}

size_t gpt_layer_size(const GPTConfig *cfg, int i) { return layer_size_tp(cfg, i, 1); }

static size_t tensor_size_tp(const GPTConfig *cfg, int i, int nlayers, int has_embed, int has_head,
                             int tp) {
    size_t C = cfg->dim;
    switch (i) {
    case GPT_WTE: return (has_embed || has_head) ? (size_t)cfg->padded_vocab / tp * C : 0;
    case GPT_WPE: return has_embed ? (size_t)cfg->max_seq * C : 0;
    case GPT_LNFW: case GPT_LNFB: return has_head ? C : 0;
    default: return (size_t)nlayers * layer_size_tp(cfg, i, tp);
    }
}

size_t gpt_tensor_size(const GPTConfig *cfg, int i, int nlayers, int has_embed, int has_head) {
    return tensor_size_tp(cfg, i, nlayers, has_embed, has_head, 1);
}

size_t gpt_total_params(const GPTConfig *cfg) {
    size_t n = 0;
    for (int i = 0; i < GPT_NTENSORS; i++) n += gpt_tensor_size(cfg, i, cfg->layers, 1, 1);
    return n;
}

int gpt_config_check(GPTConfig *cfg, char *err, size_t errlen) {
    if (cfg->layers < 1 || cfg->heads < 1 || cfg->dim < 1 || cfg->max_seq < 1 || cfg->vocab < 1) {
        snprintf(err, errlen, "model sizes must be positive (layers %d, heads %d, dim %d, max-seq %d, vocab %d)",
                 cfg->layers, cfg->heads, cfg->dim, cfg->max_seq, cfg->vocab);
        return -1;
    }
    /* What the program can run (safe.h): bounded before any size is computed. */
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
        n += tensor_size_tp(cfg, i, s->nlayers, s->has_embed, s->has_head, s->tp);
    return n;
}

void gpt_stage_layers(int L, int P, int V, const int *ranges, int st, GPTShard *s) {
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

GPTShard gpt_whole(const GPTConfig *cfg) {
    return (GPTShard){.layer0 = 0, .nlayers = cfg->layers, .has_embed = 1, .has_head = 1,
                      .tp = 1, .tp_rank = 0};
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
    size_t C = cfg->dim, n = 0, wte = (size_t)cfg->padded_vocab / m->tp * C;
    for (int i = 0; i < GPT_NTENSORS; i++)
        m->sizes[i] = tensor_size_tp(cfg, i, m->nlayers, m->has_embed, m->has_head, m->tp);
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
        m->layer_stride += layer_size_tp(cfg, i, m->tp);
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

float *gpt_tensor(const GPT *m, float *base, int i, int l) {
    if (gpt_tensor_per_layer(i)) return base + m->offsets[i] + (size_t)l * m->layer_stride;
    return base + m->offsets[i];
}

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
            size_t a = m->offsets[i] + (gpt_tensor_per_layer(i) ? (size_t)l * m->layer_stride : 0);
            size_t n = gpt_tensor_per_layer(i) ? layer_size_tp(&m->cfg, i, m->tp) : m->sizes[i];
            if (a < uo || a >= uo + un) continue;  /* another unit's tensor */
            size_t lo = a > offset ? a : offset, hi = a + n < end ? a + n : end;
            if (lo < hi) fn(ctx, lo, hi - lo, i);
        }
    }
}

size_t gpt_shard_index(const GPT *m, int i, size_t k, size_t *run) {
    size_t C = m->cfg.dim, r = m->tp_rank, Cl = C / m->tp, Fl = 4 * C / m->tp, len = (size_t)-1, g = k;
    if (m->tp > 1 && !gpt_tensor_replicated(m, i)) {
        switch (i) {
        case GPT_QKVW: {
            size_t j = k / C, c = k % C;
            len = C - c;
            g = ((j / Cl) * C + r * Cl + j % Cl) * C + c;
            break;
        }
        case GPT_QKVB: len = Cl - k % Cl; g = (k / Cl) * C + r * Cl + k % Cl; break;
        case GPT_ATTPROJW: len = Cl - k % Cl; g = (k / Cl) * C + r * Cl + k % Cl; break;
        case GPT_FCW: g = r * Fl * C + k; break;
        case GPT_FCB: g = r * Fl + k; break;
        case GPT_FCPROJW: len = Fl - k % Fl; g = (k / Fl) * 4 * C + r * Fl + k % Fl; break;
        case GPT_WTE: g = r * (size_t)(m->cfg.padded_vocab / m->tp) * C + k; break;
        default: break;
        }
    }
    if (run) *run = len;
    return g;
}

size_t gpt_llmc_offset(const GPTConfig *cfg, int i, int l) {
    size_t off = 0;
    for (int k = 0; k < i; k++) off += gpt_tensor_size(cfg, k, cfg->layers, 1, 1);
    return off + (size_t)l * gpt_layer_size(cfg, i);
}

int gpt_tensor_counts(const GPT *m, int i) {
    if (m->tp_rank != 0 && gpt_tensor_replicated(m, i)) return 0;
    if (i == GPT_WTE && !m->has_embed) return 0;   /* the tied copy */
    return 1;
}

void gpt_llmc_copy(const GPT *m, float *internal, float *llmc, int to_llmc) {
    for (int i = 0; i < GPT_NTENSORS; i++) {
        if (!m->sizes[i]) continue;
        if (to_llmc && !gpt_tensor_counts(m, i)) continue;
        int nl = gpt_tensor_per_layer(i) ? m->nlayers : 1;
        size_t n = gpt_tensor_per_layer(i) ? layer_size_tp(&m->cfg, i, m->tp) : m->sizes[i];
        for (int l = 0; l < nl; l++) {
            float *a = gpt_tensor(m, internal, i, l);
            float *b = llmc + gpt_llmc_offset(&m->cfg, i, gpt_tensor_per_layer(i) ? gpt_layer_global(m, l) : 0);
            #pragma omp parallel for
            for (size_t k = 0; k < n; k++) {
                size_t g = gpt_shard_index(m, i, k, NULL);
                if (to_llmc) b[g] = a[k];
                else a[k] = b[g];
            }
        }
    }
}

/* Backward scratch is sized on first use, for the largest B*T seen. */
static void scratch_free(GPT *m) {
    Dev *d = m->dev;
    size_t C = m->cfg.dim, n = (size_t)m->max_bt, tp = m->tp, e = m->esz;
    if (m->datt) dev_free(d, m->datt, m->datt_floats * 4);
    m->datt = NULL;
    m->datt_floats = 0;
    if (!m->max_bt) return;
    dev_free(d, m->dx, n * C * e);
    dev_free(d, m->dln, n * C * e);
    dev_free(d, m->datty, n * C / tp * e);
    dev_free(d, m->dqkv, n * 3 * C / tp * e);
    dev_free(d, m->dfch, n * 4 * C / tp * e);
    dev_free(d, m->dfchg, n * 4 * C / tp * e);
    dev_free(d, m->full, n * C * e);
    dev_free(d, m->sp_dw, 2 * C * 4);
    m->max_bt = 0;
}

/* Sized for the largest B*T seen, and attention's scratch for the largest
 * (B, T) that the ops table asks for. */
static void scratch_ensure(GPT *m, int B, int T) {
    Dev *d = m->dev;
    size_t att_scratch = 0;
    d->ops->attention_floats(B, T, m->cfg.dim / m->tp, m->cfg.heads / m->tp, &att_scratch);
    if (att_scratch > m->datt_floats) {
        if (m->datt) dev_free(d, m->datt, m->datt_floats * 4);
        m->datt = dev_alloc(d, att_scratch * 4);
        m->datt_floats = att_scratch;
    }
    int bt = B * T;
    if (bt <= m->max_bt) return;
    size_t C = m->cfg.dim, n = (size_t)bt, tp = m->tp, e = m->esz;
    if (m->max_bt) {  /* the activation-sized buffers only; datt stays */
        float *datt = m->datt;
        size_t df = m->datt_floats;
        m->datt = NULL;
        scratch_free(m);
        m->datt = datt;
        m->datt_floats = df;
    }
    m->max_bt = bt;
    m->dx = dev_alloc(d, n * C * e);
    m->dln = dev_alloc(d, n * C * e);
    m->datty = dev_alloc(d, n * C / tp * e);
    m->dqkv = dev_alloc(d, n * 3 * C / tp * e);
    m->dfch = dev_alloc(d, n * 4 * C / tp * e);
    m->dfchg = dev_alloc(d, n * 4 * C / tp * e);
    m->full = dev_alloc(d, n * C * e);
    m->sp_dw = dev_alloc(d, 2 * C * 4);
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
    scratch_free(m);
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
    float *host = malloc(m->num_params * sizeof(float) + 1);
    if (!host) { fprintf(stderr, "error: out of host memory initialising the model\n"); exit(1); }
    float resid_std = 0.02f / sqrtf(2.0f * m->cfg.layers);
    for (int i = 0; i < GPT_NTENSORS; i++) {
        if (!m->sizes[i]) continue;
        size_t n = gpt_tensor_per_layer(i) ? layer_size_tp(&m->cfg, i, m->tp) : m->sizes[i];
        int is_ln_w = i == GPT_LN1W || i == GPT_LN2W || i == GPT_LNFW;
        float std = (i == GPT_ATTPROJW || i == GPT_FCPROJW) ? resid_std : 0.02f;
        for (int l = 0; l < (gpt_tensor_per_layer(i) ? m->nlayers : 1); l++) {
            float *p = gpt_tensor(m, host, i, l);
            /* index of element 0 of this layer in the whole model's tensor i */
            uint64_t base =
                gpt_tensor_per_layer(i) ? (uint64_t)gpt_layer_global(m, l) * gpt_layer_size(&m->cfg, i) : 0;
            #pragma omp parallel for
            for (size_t k = 0; k < n; k++) {
                if (is_ln_w) p[k] = 1.0f;
                else if (gpt_tensor_decays(i)) p[k] = std * normal_at(seed, i, base + gpt_shard_index(m, i, k, NULL));
                else p[k] = 0.0f;
            }
        }
    }
    dev_from_host(m->dev, m->params, host, m->num_params * sizeof(float));
    free(host);
    gpt_params_changed(m);
}

/* ---------------------------------------------------------------------------
 * Activations. */

/* Rows of the residual stream a rank keeps for B*T tokens. */
static int stream_rows(const GPT *m, int B, int T) { return m->tpc.sp ? B * T / m->tp : B * T; }

/* The sizes of every buffer of a set of activations, in one place for
 * build and free: the layers' (nl: the largest chunk's layers), the head's
 * (on the last stage), the B->W stash (split backward only). */
#define ACTS_FIELDS(X)                                                        \
    X(x_in, rows * C, E)                                                      \
    X(ln1, nk * bt * C, E) X(ln1_mean, nk * rows, 4) X(ln1_rstd, nk * rows, 4) \
    X(qkv, nk * bt * 3 * Cl, E) X(atty, nk * bt * Cl, E) X(att, nk * a->att_stride, 4) \
    X(res2, nk * rows * C, E) X(ln2, nk * bt * C, E) X(ln2_mean, nk * rows, 4)  \
    X(ln2_rstd, nk * rows, 4) X(fch, nk * bt * Fl, E) X(fchg, nk * bt * Fl, E)  \
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
    size_t bt = B * T, rows = a->rows, nk = a->kept, E = a->esz;                     \
    (void)Cl; (void)E; (void)Fl; (void)NHl; (void)Vl; (void)nl; (void)rows; (void)nk;

/* A set's shape before anything is allocated. */
static GPTActs acts_shape(const GPT *m, int B, int T, size_t att_stride) {
    int nl = set_layers(m);
    return (GPTActs){.B = B, .T = T, .rows = stream_rows(m, B, T), .esz = m->esz, .att_stride = att_stride,
                     .kept = m->recompute && nl > 0 ? 1 : nl};
}

/* Bytes gpt_acts_build allocates for a set on m's shape (m needs only cfg,
 * tp, tpc.sp, nlayers, has_head, recompute, esz; nchunks and chunk_first
 * when it has chunks, split_backward for the stash): the same sums, without
 * a device. att_stride: the ops' attention_floats; cuda: the embedding plan
 * buffer a GPU adds. The planner (plan.c) sizes layouts by it. */
size_t gpt_acts_formula(const GPT *m, int B_, int T_, size_t att_stride, int cuda) {
    GPTActs s = acts_shape(m, B_, T_, att_stride);
    GPTActs *a = &s;
    ACTS_SIZES
    size_t bytes = 2 * bt * sizeof(int) + (cuda ? (2 * bt + 1) * sizeof(int) : 0);
#define SUM(f, n, e) bytes += (size_t)(n) * (e);
    ACTS_FIELDS(SUM)
    if (m->has_head) { HEAD_FIELDS(SUM) }
#undef SUM
    return bytes + gpt_stash_formula(m, B_, T_);
}

size_t gpt_stash_formula(const GPT *m, int B_, int T_) {
    GPTActs s = acts_shape(m, B_, T_, 0);
    GPTActs *a = &s;
    ACTS_SIZES
    size_t bytes = 0;
#define SUM(f, n, e) bytes += (size_t)(n) * (e);
    if (m->split_backward) { STASH_FIELDS(SUM) }
#undef SUM
    return bytes;
}

GPTActs *gpt_acts_build_part(GPT *m, int B_, int T_, int with_head) {
    Dev *d = m->dev;
    GPTActs *a = safe_calloc(1, sizeof *a, "a set of activations");
    *a = acts_shape(m, B_, T_, d->ops->attention_floats(B_, T_, m->cfg.dim / m->tp, m->cfg.heads / m->tp, NULL));
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
    int *plan = malloc((2 * bt + 1) * sizeof(int));
    if (!plan) {
        fprintf(stderr, "error: out of host memory (embedding plan)\n");
        exit(1);
    }
    a->embed_runs = dev_embed_plan(ids, (int)bt, plan);
    size_t used = (size_t)a->embed_runs + 1 + (size_t)plan[a->embed_runs];
    dev_from_host(m->dev, a->embed_plan, plan, used * sizeof(int));
    free(plan);
}

void gpt_set_batch(GPT *m, GPTActs *a, const int *tokens, const int *targets, int B, int T) {
    size_t bt = (size_t)B * T, bytes = bt * sizeof(int);
    if (tokens && m->tp > 1) {
        /* the embedding looks up ids of this rank's vocabulary slice; -1 elsewhere */
        int Vl = m->cfg.padded_vocab / m->tp, v0 = m->tp_rank * Vl;
        int *local = safe_malloc(bytes + 1, "the vocabulary shard's tokens");
        for (size_t k = 0; k < bt; k++)
            local[k] = tokens[k] >= v0 && tokens[k] < v0 + Vl ? tokens[k] - v0 : -1;
        set_tokens(m, a, local, bt);
        free(local);
    } else if (tokens) {
        set_tokens(m, a, tokens, bt);
    }
    if (targets) dev_from_host(m->dev, a->targets, targets, bytes);
}

/* ---------------------------------------------------------------------------
 * Tensor parallelism's collectives, at Megatron's f and g. Without
 * sequence parallelism the residual stream is whole on every rank: a
 * row-parallel output is all-reduced (g), a column-parallel input's gradient
 * too (f). With it, the stream is split by rows: g is a reduce-scatter into
 * this rank's rows, f's forward an all-gather out of them, and backward
 * swaps the two. */

/* Element k of an activation buffer: buffers hold the dev's dtype, so
 * offsets are counted in elements and scaled by m->esz here. */
static void *at(const GPT *m, const void *p, size_t k) { return (char *)p + k * m->esz; }

static void tp_all_reduce(GPT *m, void *buf, size_t n) {
    if (m->tp > 1) m->tpc.all_reduce(m->tpc.ctx, buf, n, m->dev->dtype);
}

/* g forward: partial[N,C] summed over ranks, into out[rows,C]. */
static void tp_reduce_out(GPT *m, void *out, void *partial, int N) {
    size_t C = m->cfg.dim;
    DType t = m->dev->dtype;
    if (m->tp == 1) { if (out != partial) dev_copy(m->dev, out, partial, (size_t)N * C * m->esz); return; }
    if (m->tpc.sp) {
        /* NCCL's in-place reduce-scatter leaves the shard at its own place in
         * the input; out == partial (the callers' case) is that form plus a move */
        size_t n = (size_t)N / m->tp * C;
        void *mine = out == partial ? at(m, partial, m->tp_rank * n) : out;
        m->tpc.reduce_scatter(m->tpc.ctx, mine, partial, n, t);
        if (mine != out) dev_copy(m->dev, out, mine, n * m->esz);
    } else {
        m->tpc.all_reduce(m->tpc.ctx, partial, (size_t)N * C, t);
        if (out != partial) dev_copy(m->dev, out, partial, (size_t)N * C * m->esz);
    }
}

/* f forward with sequence parallelism: rows [rows,C] of every rank into full
 * [N,C]; `mine` already sits at this rank's place in full. */
static void tp_gather_rows(GPT *m, void *full, int N) {
    if (!m->tpc.sp || m->tp == 1) return;
    size_t n = (size_t)N / m->tp * m->cfg.dim;
    m->tpc.all_gather(m->tpc.ctx, full, at(m, full, m->tp_rank * n), n, m->dev->dtype);
}

/* This rank's first row of the residual stream within the N rows. */
static size_t my_row0(const GPT *m, int N) { return m->tpc.sp ? (size_t)m->tp_rank * N / m->tp : 0; }

/* ---------------------------------------------------------------------------
 * The one linear layer: out[N,OC] = inp[N,C] @ w[OC,C]^T + b, with this
 * rank's part of w. Column-parallel (qkv, fc, the vocab-parallel head) holds
 * OC/tp output rows: its input gradient is a partial sum, completed by the
 * caller's f. Row-parallel (attproj, fcproj) holds C/tp input columns: its
 * output is a partial sum (completed by the caller's g), so only rank 0
 * adds the bias. */

typedef enum { LINEAR_COLUMN, LINEAR_ROW } LinearSplit;

static void gpt_linear_forward(GPT *m, LinearSplit split, void *out, const void *inp,
                               const void *w, const void *b, int N, int C, int OC) {
    if (split == LINEAR_ROW && m->tp_rank != 0) b = NULL;
    m->dev->ops->matmul_forward(m->dev, out, inp, w, b, N, C, OC);
}

static void gpt_linear_backward(GPT *m, LinearSplit split, void *dinp, float *dw, float *db,
                                const void *dout, const void *inp, const void *w, int N, int C,
                                int OC) {
    m->dev->ops->matmul_backward(m->dev, dinp, dw, db, dout, inp, w, N, C, OC);
}

/* ---------------------------------------------------------------------------
 * Units and hooks. Unit u's parameters are read through m->uparams[u] and
 * its gradients written through m->ugrads[u]: by default slices of
 * m->params and m->grads, but the data-parallel modules may point them at
 * gathered or transient buffers from the hooks, which fire at unit edges:
 *   forward:  params_acquire(u) ... params_release(u)
 *   backward: params_acquire(u), grads_acquire(u) ... grads_ready(u), params_release(u)
 *   split:    B: params_acquire(u) ... params_release(u) (no gradient of u is written)
 *             W: grads_acquire(u) ... grads_ready(u) (parameters only to recompute)
 * On a stage holding both ends the one wte serves the embedding and the
 * head: it stays acquired from the embedding's forward to the end of the
 * head's, and its gradients from the head's backward to the end of the
 * embedding's.
 *
 * Under mixed precision the layers read the bf16 copy m->lp instead, made
 * from uparams[u] at the acquire when the float32 values may have changed:
 * a new epoch (an optimizer step), or another source buffer (a ZeRO-3
 * gather). Within a step a unit is rounded once, however often it is used. */

static int tensor_unit(const GPT *m, int i, int l) {
    if (gpt_tensor_per_layer(i)) return unit_of_layer(m, l);
    if (i == GPT_WTE) return m->unit_wte;
    if (i == GPT_WPE) return m->unit_wpe;
    return m->unit_lnf;
}

/* Where tensor i of local layer l starts in the layout. */
static size_t tensor_offset(const GPT *m, int i, int l) {
    return m->offsets[i] + (gpt_tensor_per_layer(i) ? (size_t)l * m->layer_stride : 0);
}

/* Parameters (the compute copy) and gradients of tensor i of local layer l,
 * where they are now. */
static void *P(const GPT *m, int i, int l) {
    if (m->lp) return at(m, m->lp, tensor_offset(m, i, l));
    int u = tensor_unit(m, i, l);
    return m->uparams[u] + (tensor_offset(m, i, l) - m->unit_off[u]);
}
static float *G(const GPT *m, int i, int l) {
    int u = tensor_unit(m, i, l);
    return m->ugrads[u] + (tensor_offset(m, i, l) - m->unit_off[u]);
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

/* Activation slices of local layer l: full-row buffers (B*T rows) and the
 * residual stream's (a->rows rows), in elements of the dev's dtype; and the
 * float32 per-row statistics. */
#define ACT(a, field, l, width) at(m, (a)->field, (size_t)(l) * (a)->B * (a)->T * (width))
#define RES(a, field, l, width) at(m, (a)->field, (size_t)(l) * (a)->rows * (width))
#define STAT(a, field, l) ((a)->field + (size_t)(l) * (a)->rows)

/* LayerNorm of this rank's rows of the stream x into its rows of the full
 * buffer out, then gathered (f) so the column-parallel linear sees all rows.
 * With res != NULL the stream is first made there, res = x + y, in the same
 * pass (the residual add fused with the LayerNorm that reads it). */
static void norm_and_gather(GPT *m, void *out, float *mean, float *rstd, void *res, const void *x,
                            const void *y, const void *w, const void *b, int N) {
    int C = m->cfg.dim, rows = m->tpc.sp ? N / m->tp : N;
    void *mine = at(m, out, my_row0(m, N) * C);
    if (res) m->dev->ops->add_layernorm_forward(m->dev, res, mine, mean, rstd, x, y, w, b, rows, C);
    else m->dev->ops->layernorm_forward(m->dev, mine, mean, rstd, x, w, b, rows, C);
    tp_gather_rows(m, out, N);
}

/* A LayerNorm's backward on its rows [rows,C] from dln: the input gradient
 * into dx (NULL: none; w is read only for it) and the weights' gradients
 * added into dw, db (NULL: none). Under sequence parallelism each rank holds
 * part of the rows, so its weight gradients are partial and summed over the
 * tp group first. */
static void norm_grads(GPT *m, void *dx, float *dw, float *db, const void *dln, const void *x, const void *w,
                       const float *mean, const float *rstd, int rows) {
    int C = m->cfg.dim;
    Dev *d = m->dev;
    if (!dw) {
        d->ops->layernorm_backward(d, dx, NULL, NULL, dln, x, w, mean, rstd, rows, C);
    } else if (m->tp > 1 && m->tpc.sp) {
        dev_zero(d, m->sp_dw, 2 * (size_t)C * 4);
        d->ops->layernorm_backward(d, dx, m->sp_dw, m->sp_dw + C, dln, x, w, mean, rstd, rows, C);
        m->tpc.all_reduce(m->tpc.ctx, m->sp_dw, 2 * (size_t)C, DT_F32);
        d->ops->accumulate(d, dw, m->sp_dw, C);
        d->ops->accumulate(d, db, m->sp_dw + C, C);
    } else {
        d->ops->layernorm_backward(d, dx, dw, db, dln, x, w, mean, rstd, rows, C);
    }
}

/* The backward of norm_and_gather: dfull [N,C] holds partial input
 * gradients of the column-parallel linear; they are summed (f backward:
 * all-reduce, or reduce-scatter with sequence parallelism) into this rank's
 * rows, then the LayerNorm's backward adds into dx [rows,C]. With sequence
 * parallelism each rank saw only its rows, so the LayerNorm's own gradients
 * are partial and summed over the group before they are added. dw, db NULL:
 * the input gradient alone (a split backward's B), the summed gradient of
 * the LayerNorm's output left in keep [rows,C] for W (without sequence
 * parallelism keep is dfull itself, summed in place). */
static void norm_backward(GPT *m, void *dx, void *dfull, void *keep, const void *x, const void *w,
                          float *dw, float *db, const float *mean, const float *rstd, int N) {
    int C = m->cfg.dim, rows = m->tpc.sp ? N / m->tp : N;
    Dev *d = m->dev;
    void *dln = dfull;
    if (m->tp > 1 && m->tpc.sp) {
        dln = keep ? keep : m->dln;
        m->tpc.reduce_scatter(m->tpc.ctx, dln, dfull, (size_t)rows * C, d->dtype);
    } else {
        tp_all_reduce(m, dfull, (size_t)N * C);
    }
    norm_grads(m, dx, dw, db, dln, x, w, mean, rstd, rows);
}

/* A split backward's W of a LayerNorm: its weights' gradients from dln
 * [rows,C], the gradient of its output that B summed and kept; partial with
 * sequence parallelism, so summed over the group as norm_backward does. */
static void norm_weights(GPT *m, float *dw, float *db, const void *dln, const void *x,
                         const float *mean, const float *rstd, int N) {
    norm_grads(m, NULL, dw, db, dln, x, NULL, mean, rstd, m->tpc.sp ? N / m->tp : N);
}

/* dst[n] = src (activation elements) for W; returns dst. */
static void *stash_copy(GPT *m, void *dst, const void *src, size_t n) {
    dev_copy(m->dev, dst, src, n * m->esz);
    return dst;
}

/* The backward of g: this rank's rows of a gradient dx [rows,C] made whole
 * [N,C] for the row-parallel linear's backward (with sequence parallelism an
 * all-gather; otherwise every rank already holds all rows). */
static const void *ungather_rows(GPT *m, void *dx, int N) {
    if (!m->tpc.sp || m->tp == 1) return dx;
    size_t n = (size_t)N / m->tp * m->cfg.dim;
    m->tpc.all_gather(m->tpc.ctx, m->full, dx, n, m->dev->dtype);
    return m->full;
}

void gpt_embed_forward(GPT *m, GPTActs *a, int B, int T) {
    int N = B * T;
    params_acquire(m, m->unit_wte);
    params_acquire(m, m->unit_wpe);
    /* each rank looks up the tokens of its vocabulary slice; wpe is added once */
    void *rows_out = m->tp > 1 ? m->full : a->x_in;
    m->dev->ops->encoder_forward(m->dev, rows_out, a->tokens, P(m, GPT_WTE, 0),
                                 m->tp_rank == 0 ? P(m, GPT_WPE, 0) : NULL, B, T, m->cfg.dim);
    if (m->tp > 1) tp_reduce_out(m, a->x_in, m->full, N);
    params_release(m, m->unit_wpe);
    if (!m->has_head) params_release(m, m->unit_wte);  /* else the head releases it */
}

/* Layer j of a set (0 .. the chunk's layers - 1) is local layer
 * chunk_first[chunk] + j: its parameters by the one, its activations by the
 * other. The slot of its inner activations: its own, or the one shared slot
 * that recompute refills in backward. */
static int slot(const GPTActs *a, int j) { return a->kept == 1 ? 0 : j; }

/* The input of layer j of the set: the previous layer's output, or the chunk's input. */
static void *layer_input(const GPT *m, GPTActs *a, int j) {
    return j ? RES(a, res3, j - 1, m->cfg.dim) : a->x_in;
}

/* One transformer block (local layer l, layer j of the set) on input x
 * [rows,C] into its res3. */
static void layer_forward(GPT *m, GPTActs *a, int l, int j, const void *x, int B, int T) {
    const Ops *o = m->dev->ops;
    Dev *d = m->dev;
    int C = m->cfg.dim, Cl = C / m->tp, Fl = 4 * C / m->tp, NHl = m->cfg.heads / m->tp;
    int N = B * T, rows = stream_rows(m, B, T), k = slot(a, j);
    void *ln1 = ACT(a, ln1, k, C), *qkv = ACT(a, qkv, k, 3 * Cl), *atty = ACT(a, atty, k, Cl);
    float *att = a->att + (size_t)k * a->att_stride;
    void *ln2 = ACT(a, ln2, k, C), *fch = ACT(a, fch, k, Fl), *fchg = ACT(a, fchg, k, Fl);
    void *res2 = RES(a, res2, k, C), *res3 = RES(a, res3, j, C);
    params_acquire(m, unit_of_layer(m, l));
    /* attention: res2 = x + attproj(attn(qkv(ln1(x)))) */
    norm_and_gather(m, ln1, STAT(a, ln1_mean, k), STAT(a, ln1_rstd, k), NULL, x, NULL,
                    P(m, GPT_LN1W, l), P(m, GPT_LN1B, l), N);
    gpt_linear_forward(m, LINEAR_COLUMN, qkv, ln1, P(m, GPT_QKVW, l), P(m, GPT_QKVB, l), N, C, 3 * Cl);
    o->attention_forward(d, atty, att, qkv, B, T, Cl, NHl);
    gpt_linear_forward(m, LINEAR_ROW, a->proj, atty, P(m, GPT_ATTPROJW, l), P(m, GPT_ATTPROJB, l),
                       N, Cl, C);
    tp_reduce_out(m, a->proj, a->proj, N);
    /* MLP: res3 = res2 + fcproj(gelu(fc(ln2(res2)))); res2 is made by ln2's pass */
    norm_and_gather(m, ln2, STAT(a, ln2_mean, k), STAT(a, ln2_rstd, k), res2, x, a->proj,
                    P(m, GPT_LN2W, l), P(m, GPT_LN2B, l), N);
    gpt_linear_forward(m, LINEAR_COLUMN, fch, ln2, P(m, GPT_FCW, l), P(m, GPT_FCB, l), N, C, Fl);
    o->gelu_forward(d, fchg, fch, (size_t)N * Fl);
    gpt_linear_forward(m, LINEAR_ROW, a->proj, fchg, P(m, GPT_FCPROJW, l), P(m, GPT_FCPROJB, l),
                       N, Fl, C);
    tp_reduce_out(m, a->proj, a->proj, N);
    o->add(d, res3, res2, a->proj, (size_t)rows * C);
    params_release(m, unit_of_layer(m, l));
}

/* The output of the set's chunk: its last layer's res3, or the input when it has no layers. */
static void *chunk_output(GPT *m, GPTActs *a) {
    int nl = gpt_chunk_layers(m, a->chunk);
    return nl ? RES(a, res3, nl - 1, m->cfg.dim) : a->x_in;
}

void *gpt_chunk_forward(GPT *m, GPTActs *a, int c, int B, int T) {
    a->chunk = c;
    for (int j = 0; j < gpt_chunk_layers(m, c); j++)
        layer_forward(m, a, m->chunk_first[c] + j, j, layer_input(m, a, j), B, T);
    return chunk_output(m, a);
}

/* Final LayerNorm and the tied head over this rank's vocabulary slice; the
 * caller holds the parameters. */
static void head_logits(GPT *m, GPTActs *a, int B, int T) {
    int C = m->cfg.dim, N = B * T;
    norm_and_gather(m, a->lnf, a->lnf_mean, a->lnf_rstd, NULL, chunk_output(m, a), NULL,
                    P(m, GPT_LNFW, 0), P(m, GPT_LNFB, 0), N);
    gpt_linear_forward(m, LINEAR_COLUMN, a->logits, a->lnf, P(m, GPT_WTE, 0), NULL, N, C,
                       m->cfg.padded_vocab / m->tp);
}

/* The head's parameters: lnf, and wte unless the embedding's forward on
 * this stage already took it. */
static void head_acquire(GPT *m) {
    params_acquire(m, m->unit_lnf);
    if (!m->has_embed) params_acquire(m, m->unit_wte);
}

static void head_release(GPT *m) {
    params_release(m, m->unit_lnf);
    params_release(m, m->unit_wte);
}

void gpt_head_logits(GPT *m, GPTActs *a, int B, int T) {
    head_acquire(m);
    head_logits(m, a, B, T);
    head_release(m);
}

/* Cross-entropy over the vocabulary: fused on one rank; split over tp
 * ranks, each contributes three numbers a row (its max, its sum of
 * exponentials, the target's logit if it holds it) and the full logits are
 * never gathered. With dloss != 0 the logits become their gradient. */
static void loss(GPT *m, GPTActs *a, int N, float dloss) {
    const Ops *o = m->dev->ops;
    int V = m->cfg.vocab, Vp = m->cfg.padded_vocab;
    if (m->tp == 1) {
        o->crossentropy(m->dev, a->losses, a->logits, a->targets, N, V, Vp, dloss);
        return;
    }
    int Vl = Vp / m->tp, v0 = m->tp_rank * Vl, nvalid = V - v0 < 0 ? 0 : (V - v0 > Vl ? Vl : V - v0);
    float *mine = a->xstats + (size_t)m->tp_rank * N * 3;
    o->xent_stats(m->dev, mine, a->logits, a->targets, N, v0, nvalid, Vl);
    m->tpc.all_gather(m->tpc.ctx, a->xstats, mine, (size_t)N * 3, DT_F32);
    o->xent_combine(m->dev, a->losses, a->lse, a->xstats, N, m->tp);
    if (dloss != 0) o->xent_grad(m->dev, a->logits, a->lse, a->targets, N, v0, nvalid, Vl, dloss);
}

double gpt_head_forward(GPT *m, GPTActs *a, int B, int T, float dloss) {
    int N = B * T;
    head_acquire(m);
    head_logits(m, a, B, T);
    head_release(m);
    loss(m, a, N, dloss);
    return m->dev->ops->sum(m->dev, a->losses, N) / N;
}

void gpt_head_backward(GPT *m, GPTActs *a, int B, int T) {
    Dev *d = m->dev;
    int C = m->cfg.dim, N = B * T;
    params_acquire(m, m->unit_lnf);
    params_acquire(m, m->unit_wte);
    grads_acquire(m, m->unit_lnf);
    grads_acquire(m, m->unit_wte);  /* on a stage with the embedding, ready after its backward */
    dev_zero(d, m->full, (size_t)N * C * m->esz);
    gpt_linear_backward(m, LINEAR_COLUMN, m->full, G(m, GPT_WTE, 0), NULL, a->logits, a->lnf,
                        P(m, GPT_WTE, 0), N, C, m->cfg.padded_vocab / m->tp);
    dev_zero(d, m->dx, (size_t)stream_rows(m, B, T) * C * m->esz);
    norm_backward(m, m->dx, m->full, NULL, chunk_output(m, a), P(m, GPT_LNFW, 0), G(m, GPT_LNFW, 0),
                  G(m, GPT_LNFB, 0), a->lnf_mean, a->lnf_rstd, N);
    grads_ready(m, m->unit_lnf);
    if (!m->has_embed) grads_ready(m, m->unit_wte);
    head_release(m);
}

/* m->dx holds d(layer output) for this rank's rows; each layer turns it, in
 * place, into d(layer input): the residual stream's gradient passes straight
 * through and the two branches add theirs through the LayerNorm backwards,
 * which accumulate. Whole (split 0), a layer adds its parameters' gradients
 * as it goes; split (B of a zero-bubble schedule) it adds none and leaves in
 * the set's stash the gradient of each linear's and LayerNorm's output, for
 * layer_weights (W) to turn into them later. */
static void layer_backward(GPT *m, GPTActs *a, int l, int j, int B, int T, int split) {
    const Ops *o = m->dev->ops;
    Dev *d = m->dev;
    int C = m->cfg.dim, Cl = C / m->tp, Fl = 4 * C / m->tp, NHl = m->cfg.heads / m->tp;
    int N = B * T, u = unit_of_layer(m, l), k = slot(a, j), sp = m->tp > 1 && m->tpc.sp;
    size_t n = (size_t)N, e = m->esz;
    void *x = layer_input(m, a, j);
    void *ln1 = ACT(a, ln1, k, C), *qkv = ACT(a, qkv, k, 3 * Cl), *atty = ACT(a, atty, k, Cl);
    float *att = a->att + (size_t)k * a->att_stride;
    void *res2 = RES(a, res2, k, C), *ln2 = ACT(a, ln2, k, C);
    void *fch = ACT(a, fch, k, Fl), *fchg = ACT(a, fchg, k, Fl);
    /* the gradients of the outputs: scratch when whole, the stash when split
     * (without sequence parallelism a LayerNorm's summed one is the
     * column-parallel linear's input gradient itself, [N,C] = [rows,C]) */
    void *dfch = split ? ACT(a, g_fch, j, Fl) : m->dfch, *dqkv = split ? ACT(a, g_qkv, j, 3 * Cl) : m->dqkv;
    void *dln2 = split ? RES(a, g_ln2, j, C) : NULL, *dln1 = split ? RES(a, g_ln1, j, C) : NULL;
    void *dfull2 = split && !sp ? dln2 : m->full, *dfull1 = split && !sp ? dln1 : m->full;
#define DW(i) (split ? NULL : G(m, i, l))
    params_acquire(m, u);
    if (!split) grads_acquire(m, u);
    /* 重计算: the layer's inner activations again, from its kept input */
    if (a->kept == 1 && gpt_chunk_layers(m, a->chunk) > 1) layer_forward(m, a, l, j, x, B, T);
    /* MLP branch: res3 = res2 + fcproj(gelu(fc(ln2(res2)))) */
    const void *dout = ungather_rows(m, m->dx, N);
    if (split) dout = stash_copy(m, ACT(a, g_fcproj, j, C), dout, n * C);
    dev_zero(d, m->dfchg, n * Fl * e);
    gpt_linear_backward(m, LINEAR_ROW, m->dfchg, DW(GPT_FCPROJW), DW(GPT_FCPROJB), dout, fchg,
                        P(m, GPT_FCPROJW, l), N, Fl, C);
    dev_zero(d, dfch, n * Fl * e);
    o->gelu_backward(d, dfch, fch, m->dfchg, n * Fl);
    dev_zero(d, dfull2, n * C * e);
    gpt_linear_backward(m, LINEAR_COLUMN, dfull2, DW(GPT_FCW), DW(GPT_FCB), dfch, ln2, P(m, GPT_FCW, l),
                        N, C, Fl);
    norm_backward(m, m->dx, dfull2, dln2, res2, P(m, GPT_LN2W, l), DW(GPT_LN2W), DW(GPT_LN2B),
                  STAT(a, ln2_mean, k), STAT(a, ln2_rstd, k), N);
    /* attention branch: res2 = x + attproj(attn(qkv(ln1(x)))) */
    dout = ungather_rows(m, m->dx, N);
    if (split) dout = stash_copy(m, ACT(a, g_attproj, j, C), dout, n * C);
    dev_zero(d, m->datty, n * Cl * e);
    gpt_linear_backward(m, LINEAR_ROW, m->datty, DW(GPT_ATTPROJW), DW(GPT_ATTPROJB), dout, atty,
                        P(m, GPT_ATTPROJW, l), N, Cl, C);
    dev_zero(d, dqkv, n * 3 * Cl * e);
    o->attention_backward(d, dqkv, m->datt, m->datty, qkv, atty, att, B, T, Cl, NHl);
    dev_zero(d, dfull1, n * C * e);
    gpt_linear_backward(m, LINEAR_COLUMN, dfull1, DW(GPT_QKVW), DW(GPT_QKVB), dqkv, ln1,
                        P(m, GPT_QKVW, l), N, C, 3 * Cl);
    norm_backward(m, m->dx, dfull1, dln1, x, P(m, GPT_LN1W, l), DW(GPT_LN1W), DW(GPT_LN1B),
                  STAT(a, ln1_mean, k), STAT(a, ln1_rstd, k), N);
#undef DW
    if (!split) grads_ready(m, u);
    params_release(m, u);
}

/* W of a split backward, for local layer l (layer j of the set): every
 * parameter gradient of the layer from the stash B left and the layer's
 * inputs, which the set keeps (with recompute only layer 0's are still in
 * the shared slot after B, the others are made again first). No input
 * gradient, so no parameters are read, but by that recompute. */
static void layer_weights(GPT *m, GPTActs *a, int l, int j, int B, int T) {
    int C = m->cfg.dim, Cl = C / m->tp, Fl = 4 * C / m->tp;
    int N = B * T, u = unit_of_layer(m, l), k = slot(a, j);
    void *x = layer_input(m, a, j);
    grads_acquire(m, u);
    if (a->kept == 1 && j > 0) layer_forward(m, a, l, j, x, B, T);
    /* MLP branch */
    gpt_linear_backward(m, LINEAR_ROW, NULL, G(m, GPT_FCPROJW, l), G(m, GPT_FCPROJB, l),
                        ACT(a, g_fcproj, j, C), ACT(a, fchg, k, Fl), NULL, N, Fl, C);
    gpt_linear_backward(m, LINEAR_COLUMN, NULL, G(m, GPT_FCW, l), G(m, GPT_FCB, l), ACT(a, g_fch, j, Fl),
                        ACT(a, ln2, k, C), NULL, N, C, Fl);
    norm_weights(m, G(m, GPT_LN2W, l), G(m, GPT_LN2B, l), RES(a, g_ln2, j, C), RES(a, res2, k, C),
                 STAT(a, ln2_mean, k), STAT(a, ln2_rstd, k), N);
    /* attention branch */
    gpt_linear_backward(m, LINEAR_ROW, NULL, G(m, GPT_ATTPROJW, l), G(m, GPT_ATTPROJB, l),
                        ACT(a, g_attproj, j, C), ACT(a, atty, k, Cl), NULL, N, Cl, C);
    gpt_linear_backward(m, LINEAR_COLUMN, NULL, G(m, GPT_QKVW, l), G(m, GPT_QKVB, l),
                        ACT(a, g_qkv, j, 3 * Cl), ACT(a, ln1, k, C), NULL, N, C, 3 * Cl);
    norm_weights(m, G(m, GPT_LN1W, l), G(m, GPT_LN1B, l), RES(a, g_ln1, j, C), x,
                 STAT(a, ln1_mean, k), STAT(a, ln1_rstd, k), N);
    grads_ready(m, u);
}

/* The chunk's layers backward, last to first. */
static void chunk_backward(GPT *m, GPTActs *a, int c, int B, int T, int split) {
    a->chunk = c;
    for (int j = gpt_chunk_layers(m, c) - 1; j >= 0; j--)
        layer_backward(m, a, m->chunk_first[c] + j, j, B, T, split);
}

void gpt_chunk_backward(GPT *m, GPTActs *a, int c, int B, int T) { chunk_backward(m, a, c, B, T, 0); }

void gpt_chunk_backward_input(GPT *m, GPTActs *a, int c, int B, int T) { chunk_backward(m, a, c, B, T, 1); }

/* W takes the layers first to last: with recompute, layer 0 is what B left in the slot. */
void gpt_chunk_backward_weights(GPT *m, GPTActs *a, int c, int B, int T) {
    a->chunk = c;
    for (int j = 0; j < gpt_chunk_layers(m, c); j++) layer_weights(m, a, m->chunk_first[c] + j, j, B, T);
}

void gpt_embed_backward(GPT *m, GPTActs *a, int B, int T) {
    if (!m->has_head) grads_acquire(m, m->unit_wte);  /* else taken by the head's backward */
    grads_acquire(m, m->unit_wpe);
    /* every rank needs all rows' gradient: its wte rows serve tokens anywhere */
    const void *dout = ungather_rows(m, m->dx, B * T);
    m->dev->ops->encoder_backward(m->dev, G(m, GPT_WTE, 0), G(m, GPT_WPE, 0), dout, a->tokens,
                                  a->embed_runs >= 0 ? a->embed_plan : NULL, a->embed_runs, B, T,
                                  m->cfg.dim);
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
