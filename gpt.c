/* gpt.c: GPT-2, forward and backward, for one stage of layers.
 *
 * The model of llm.c's train_gpt2.c, reshaped for the articles' splits:
 * forward and backward come in three pieces (embedding, a range of layers,
 * head + loss) so a pipeline stage (pp.c) runs only its own, and every
 * linear layer goes through gpt_linear_forward / _backward, the one place
 * tensor parallelism (tp.c) will split columns and rows Megatron-style.
 * Nothing here knows how a stage or shard was chosen; it computes what it
 * holds. Every op goes through m->dev->ops, so the same code runs the CPU
 * reference and the CUDA kernels.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "gpt.h"

static const char *tensor_names[GPT_NTENSORS] = {
    "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb",
};

const char *gpt_tensor_name(int i) { return tensor_names[i]; }

int gpt_tensor_decays(int i) {
    return i == GPT_WTE || i == GPT_WPE || i == GPT_QKVW || i == GPT_ATTPROJW ||
           i == GPT_FCW || i == GPT_FCPROJW;
}

size_t gpt_layer_size(const GPTConfig *cfg, int i) {
    size_t C = cfg->dim;
    switch (i) {
    case GPT_LN1W: case GPT_LN1B: case GPT_LN2W: case GPT_LN2B:
    case GPT_ATTPROJB: case GPT_FCPROJB: return C;
    case GPT_QKVW: return 3 * C * C;
    case GPT_QKVB: return 3 * C;
    case GPT_ATTPROJW: return C * C;
    case GPT_FCW: case GPT_FCPROJW: return 4 * C * C;
    case GPT_FCB: return 4 * C;
    default: return 0;
    }
}

size_t gpt_tensor_size(const GPTConfig *cfg, int i, int nlayers, int has_embed, int has_head) {
    size_t C = cfg->dim;
    switch (i) {
    case GPT_WTE: return (has_embed || has_head) ? (size_t)cfg->padded_vocab * C : 0;
    case GPT_WPE: return has_embed ? (size_t)cfg->max_seq * C : 0;
    case GPT_LNFW: case GPT_LNFB: return has_head ? C : 0;
    default: return (size_t)nlayers * gpt_layer_size(cfg, i);
    }
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

void gpt_build(GPT *m, const GPTConfig *cfg, Dev *dev, int layer0, int nlayers, int has_embed,
               int has_head) {
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    m->dev = dev;
    m->layer0 = layer0;
    m->nlayers = nlayers;
    m->has_embed = has_embed;
    m->has_head = has_head;
    size_t C = cfg->dim, n = 0;
    for (int i = 0; i < GPT_NTENSORS; i++) m->sizes[i] = gpt_tensor_size(cfg, i, nlayers, has_embed, has_head);
    if (has_embed) {
        m->offsets[GPT_WTE] = n; n += (size_t)cfg->padded_vocab * C;
        m->offsets[GPT_WPE] = n; n += (size_t)cfg->max_seq * C;
    }
    for (int i = GPT_LN1W; i <= GPT_FCPROJB; i++) {
        m->offsets[i] = n + m->layer_stride;
        m->layer_stride += gpt_layer_size(cfg, i);
    }
    n += (size_t)nlayers * m->layer_stride;
    if (has_head) {
        if (!has_embed) { m->offsets[GPT_WTE] = n; n += (size_t)cfg->padded_vocab * C; }
        m->offsets[GPT_LNFW] = n; n += C;
        m->offsets[GPT_LNFB] = n; n += C;
    }
    m->num_params = n;
    m->nunits = has_embed + nlayers + has_head;
    m->params = dev_alloc(dev, m->num_params * sizeof(float));
    m->grads = dev_alloc(dev, m->num_params * sizeof(float));
    m->uparams = calloc(m->nunits, sizeof(float *));
    m->ugrads = calloc(m->nunits, sizeof(float *));
    gpt_units_default(m);
}

void gpt_units_default(GPT *m) {
    for (int u = 0; u < m->nunits; u++) {
        size_t uo, un;
        gpt_unit_range(m, u, &uo, &un);
        m->uparams[u] = m->params ? m->params + uo : NULL;
        m->ugrads[u] = m->grads ? m->grads + uo : NULL;
    }
}

/* Backward scratch is sized on first use, for the largest B*T seen. */
static void scratch_ensure(GPT *m, int B, int T) {
    int bt = B * T;
    size_t C = m->cfg.dim, NH = m->cfg.heads;
    if (bt <= m->max_bt) return;
    Dev *d = m->dev;
    if (m->max_bt) {
        size_t n = (size_t)m->max_bt;
        dev_free(d, m->dx, n * C * 4); dev_free(d, m->dln, n * C * 4);
        dev_free(d, m->datty, n * C * 4); dev_free(d, m->dqkv, n * 3 * C * 4);
        dev_free(d, m->dfch, n * 4 * C * 4); dev_free(d, m->dfchg, n * 4 * C * 4);
        dev_free(d, m->datt, n * NH * m->cfg.max_seq * 4);
    }
    /* datt holds [B,NH,T,T] <= B*T * NH * maxT elements. */
    m->max_bt = bt;
    size_t n = (size_t)bt;
    m->dx = dev_alloc(d, n * C * 4);
    m->dln = dev_alloc(d, n * C * 4);
    m->datty = dev_alloc(d, n * C * 4);
    m->dqkv = dev_alloc(d, n * 3 * C * 4);
    m->dfch = dev_alloc(d, n * 4 * C * 4);
    m->dfchg = dev_alloc(d, n * 4 * C * 4);
    m->datt = dev_alloc(d, n * NH * m->cfg.max_seq * 4);
}

void gpt_unit_range(const GPT *m, int u, size_t *offset, size_t *count) {
    size_t layers_start = m->has_embed ? m->sizes[GPT_WTE] + m->sizes[GPT_WPE] : 0;
    if (m->has_embed && u == 0) { *offset = 0; *count = layers_start; return; }
    int l = u - m->has_embed;
    if (l < m->nlayers) {
        *offset = layers_start + (size_t)l * m->layer_stride;
        *count = m->layer_stride;
        return;
    }
    *offset = layers_start + (size_t)m->nlayers * m->layer_stride;  /* the head */
    *count = m->num_params - *offset;
}

float *gpt_tensor(const GPT *m, float *base, int i, int l) {
    if (i >= GPT_LN1W && i <= GPT_FCPROJB) return base + m->offsets[i] + (size_t)l * m->layer_stride;
    return base + m->offsets[i];
}

void gpt_segments(const GPT *m, size_t offset, size_t count,
                  void (*fn)(void *ctx, size_t off, size_t n, int tensor), void *ctx) {
    size_t end = offset + count;
    /* pieces in layout order: the embedding's, each layer's, the head's */
    for (int u = 0; u < m->nunits; u++) {
        size_t uo, un;
        gpt_unit_range(m, u, &uo, &un);
        if (uo >= end || uo + un <= offset) continue;
        int l = u - m->has_embed;
        for (int i = 0; i < GPT_NTENSORS; i++) {
            int per_layer = i >= GPT_LN1W && i <= GPT_FCPROJB;
            if (!m->sizes[i] || per_layer != (l >= 0 && l < m->nlayers)) continue;
            size_t a = (size_t)(gpt_tensor(m, m->params, i, l) - m->params);
            size_t n = per_layer ? gpt_layer_size(&m->cfg, i) : m->sizes[i];
            if (a < uo || a >= uo + un) continue;  /* wte of the other unit */
            size_t lo = a > offset ? a : offset, hi = a + n < end ? a + n : end;
            if (lo < hi) fn(ctx, lo, hi - lo, i);
        }
    }
}

/* Where tensor i of (global) layer l starts in llm.c's order. */
static size_t llmc_offset(const GPTConfig *cfg, int i, int l) {
    size_t off = 0;
    for (int k = 0; k < i; k++) off += gpt_tensor_size(cfg, k, cfg->layers, 1, 1);
    return off + (size_t)l * gpt_layer_size(cfg, i);
}

void gpt_llmc_copy(const GPT *m, float *internal, float *llmc, int to_llmc) {
    for (int i = 0; i < GPT_NTENSORS; i++) {
        if (!m->sizes[i]) continue;
        int per_layer = i >= GPT_LN1W && i <= GPT_FCPROJB;
        int nl = per_layer ? m->nlayers : 1;
        size_t n = per_layer ? gpt_layer_size(&m->cfg, i) : m->sizes[i];
        for (int l = 0; l < nl; l++) {
            float *a = gpt_tensor(m, internal, i, l);
            float *b = llmc + llmc_offset(&m->cfg, i, per_layer ? m->layer0 + l : 0);
            if (to_llmc) memcpy(b, a, n * sizeof(float));
            else memcpy(a, b, n * sizeof(float));
        }
    }
}

void gpt_free(GPT *m) {
    Dev *d = m->dev;
    size_t C = m->cfg.dim, n = (size_t)m->max_bt;
    dev_free(d, m->params, m->num_params * 4);
    dev_free(d, m->grads, m->num_params * 4);
    free(m->uparams);
    free(m->ugrads);
    if (m->max_bt) {
        dev_free(d, m->dx, n * C * 4); dev_free(d, m->dln, n * C * 4);
        dev_free(d, m->datty, n * C * 4); dev_free(d, m->dqkv, n * 3 * C * 4);
        dev_free(d, m->dfch, n * 4 * C * 4); dev_free(d, m->dfchg, n * 4 * C * 4);
        dev_free(d, m->datt, n * m->cfg.heads * m->cfg.max_seq * 4);
    }
    memset(m, 0, sizeof *m);
}

/* ---------------------------------------------------------------------------
 * Initialisation from a counter-based generator: the value of element k of
 * tensor i is a pure function of (seed, i, k), wherever it is held. */

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
    float *host = malloc(m->num_params * sizeof(float));
    if (!host) { fprintf(stderr, "error: out of host memory initialising the model\n"); exit(1); }
    float resid_std = 0.02f / sqrtf(2.0f * m->cfg.layers);
    for (int i = 0; i < GPT_NTENSORS; i++) {
        if (!m->sizes[i]) continue;
        int per_layer = i >= GPT_LN1W && i <= GPT_FCPROJB;
        size_t n = per_layer ? gpt_layer_size(&m->cfg, i) : m->sizes[i];
        int is_ln_w = i == GPT_LN1W || i == GPT_LN2W || i == GPT_LNFW;
        float std = (i == GPT_ATTPROJW || i == GPT_FCPROJW) ? resid_std : 0.02f;
        for (int l = 0; l < (per_layer ? m->nlayers : 1); l++) {
            float *p = gpt_tensor(m, host, i, l);
            /* index of element 0 in the whole model's tensor i */
            uint64_t base = per_layer ? (uint64_t)(m->layer0 + l) * n : 0;
            #pragma omp parallel for
            for (size_t k = 0; k < n; k++) {
                if (is_ln_w) p[k] = 1.0f;
                else if (gpt_tensor_decays(i)) p[k] = std * normal_at(seed, i, base + k);
                else p[k] = 0.0f;
            }
        }
    }
    dev_from_host(m->dev, m->params, host, m->num_params * sizeof(float));
    free(host);
}

/* ---------------------------------------------------------------------------
 * Activations. */

GPTActs *gpt_acts_build(GPT *m, int B, int T) {
    GPTActs *a = calloc(1, sizeof *a);
    Dev *d = m->dev;
    size_t C = m->cfg.dim, NH = m->cfg.heads, nl = m->nlayers, bt = (size_t)B * T;
    a->B = B;
    a->T = T;
    size_t before = d->bytes_live;
    a->tokens = dev_alloc(d, bt * sizeof(int));
    a->targets = dev_alloc(d, bt * sizeof(int));
    a->x_in = dev_alloc(d, bt * C * 4);
    a->ln1 = dev_alloc(d, nl * bt * C * 4);
    a->ln1_mean = dev_alloc(d, nl * bt * 4);
    a->ln1_rstd = dev_alloc(d, nl * bt * 4);
    a->qkv = dev_alloc(d, nl * bt * 3 * C * 4);
    a->atty = dev_alloc(d, nl * bt * C * 4);
    a->att = dev_alloc(d, nl * B * NH * T * T * 4);
    a->res2 = dev_alloc(d, nl * bt * C * 4);
    a->ln2 = dev_alloc(d, nl * bt * C * 4);
    a->ln2_mean = dev_alloc(d, nl * bt * 4);
    a->ln2_rstd = dev_alloc(d, nl * bt * 4);
    a->fch = dev_alloc(d, nl * bt * 4 * C * 4);
    a->fchg = dev_alloc(d, nl * bt * 4 * C * 4);
    a->res3 = dev_alloc(d, nl * bt * C * 4);
    a->proj = dev_alloc(d, bt * C * 4);
    if (m->has_head) {
        a->lnf = dev_alloc(d, bt * C * 4);
        a->lnf_mean = dev_alloc(d, bt * 4);
        a->lnf_rstd = dev_alloc(d, bt * 4);
        a->logits = dev_alloc(d, bt * m->cfg.padded_vocab * 4);
        a->losses = dev_alloc(d, bt * 4);
    }
    a->bytes = d->bytes_live - before;
    scratch_ensure(m, B, T);
    return a;
}

void gpt_acts_free(GPT *m, GPTActs *a) {
    if (!a) return;
    Dev *d = m->dev;
    size_t C = m->cfg.dim, NH = m->cfg.heads, nl = m->nlayers, bt = (size_t)a->B * a->T;
    size_t B = a->B, T = a->T;
    dev_free(d, a->tokens, bt * sizeof(int));
    dev_free(d, a->targets, bt * sizeof(int));
    dev_free(d, a->x_in, bt * C * 4);
    dev_free(d, a->ln1, nl * bt * C * 4);
    dev_free(d, a->ln1_mean, nl * bt * 4);
    dev_free(d, a->ln1_rstd, nl * bt * 4);
    dev_free(d, a->qkv, nl * bt * 3 * C * 4);
    dev_free(d, a->atty, nl * bt * C * 4);
    dev_free(d, a->att, nl * B * NH * T * T * 4);
    dev_free(d, a->res2, nl * bt * C * 4);
    dev_free(d, a->ln2, nl * bt * C * 4);
    dev_free(d, a->ln2_mean, nl * bt * 4);
    dev_free(d, a->ln2_rstd, nl * bt * 4);
    dev_free(d, a->fch, nl * bt * 4 * C * 4);
    dev_free(d, a->fchg, nl * bt * 4 * C * 4);
    dev_free(d, a->res3, nl * bt * C * 4);
    dev_free(d, a->proj, bt * C * 4);
    if (m->has_head) {
        dev_free(d, a->lnf, bt * C * 4);
        dev_free(d, a->lnf_mean, bt * 4);
        dev_free(d, a->lnf_rstd, bt * 4);
        dev_free(d, a->logits, bt * m->cfg.padded_vocab * 4);
        dev_free(d, a->losses, bt * 4);
    }
    free(a);
}

void gpt_set_batch(GPT *m, GPTActs *a, const int *tokens, const int *targets, int B, int T) {
    size_t bytes = (size_t)B * T * sizeof(int);
    if (tokens) dev_from_host(m->dev, a->tokens, tokens, bytes);
    if (targets) dev_from_host(m->dev, a->targets, targets, bytes);
}

/* ---------------------------------------------------------------------------
 * The one linear layer: out[N,OC] = inp[N,C] @ w[OC,C]^T + b. Tensor
 * parallelism splits it here: column-parallel (qkv, fc) holds OC/T output
 * rows, row-parallel (attproj, fcproj) C/T input columns and all-reduces its
 * output. On one rank both are this matmul. */

typedef enum { LINEAR_COLUMN, LINEAR_ROW, LINEAR_WHOLE } LinearSplit;

static void gpt_linear_forward(GPT *m, LinearSplit split, float *out, const float *inp,
                               const float *w, const float *b, int N, int C, int OC) {
    m->dev->ops->matmul_forward(m->dev, out, inp, w, b, N, C, OC);
}

static void gpt_linear_backward(GPT *m, LinearSplit split, float *dinp, float *dw, float *db,
                                const float *dout, const float *inp, const float *w, int N, int C,
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
 * The tied wte is the embedding unit's: the head takes it with its own unit,
 * so the embedding's parameters stay acquired from the embedding's forward
 * to the end of the head's, and its gradients from the head's backward to
 * the end of the embedding's. */

static int unit_of_layer(const GPT *m, int l) { return m->has_embed + l; }
static int unit_embed(const GPT *m) { (void)m; return 0; }
static int unit_head(const GPT *m) { return m->nunits - 1; }

static int tensor_unit(const GPT *m, int i, int l) {
    if (i >= GPT_LN1W && i <= GPT_FCPROJB) return unit_of_layer(m, l);
    if (i == GPT_WPE || (i == GPT_WTE && m->has_embed)) return unit_embed(m);
    return unit_head(m);
}

static float *unit_tensor(const GPT *m, float **ubase, int i, int l) {
    int u = tensor_unit(m, i, l);
    size_t uo, un;
    gpt_unit_range(m, u, &uo, &un);
    return ubase[u] + (size_t)(gpt_tensor(m, m->params, i, l) - m->params) - uo;
}

/* Parameters and gradients of tensor i of local layer l, where they are now. */
static float *P(const GPT *m, int i, int l) { return unit_tensor(m, m->uparams, i, l); }
static float *G(const GPT *m, int i, int l) { return unit_tensor(m, m->ugrads, i, l); }

static void params_acquire(GPT *m, int u) {
    if (m->hooks.params_acquire) m->hooks.params_acquire(m->hooks.ctx, m, u);
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

/* Activation slices of local layer l, for a built with a->B * a->T rows. */
#define ACT(a, field, l, width) ((a)->field + (size_t)(l) * (a)->B * (a)->T * (width))

void gpt_embed_forward(GPT *m, GPTActs *a, int B, int T) {
    params_acquire(m, unit_embed(m));
    m->dev->ops->encoder_forward(m->dev, a->x_in, a->tokens, P(m, GPT_WTE, 0), P(m, GPT_WPE, 0),
                                 B, T, m->cfg.dim);
    if (!m->has_head) params_release(m, unit_embed(m));  /* else the head releases it */
}

float *gpt_layers_forward(GPT *m, GPTActs *a, int B, int T) {
    const Ops *o = m->dev->ops;
    Dev *d = m->dev;
    int C = m->cfg.dim, NH = m->cfg.heads, N = B * T;
    float *x = a->x_in;
    for (int l = 0; l < m->nlayers; l++) {
        float *ln1 = ACT(a, ln1, l, C), *qkv = ACT(a, qkv, l, 3 * C), *atty = ACT(a, atty, l, C);
        float *att = a->att + (size_t)l * a->B * NH * a->T * a->T;
        float *res2 = ACT(a, res2, l, C), *ln2 = ACT(a, ln2, l, C), *res3 = ACT(a, res3, l, C);
        float *fch = ACT(a, fch, l, 4 * C), *fchg = ACT(a, fchg, l, 4 * C);
        params_acquire(m, unit_of_layer(m, l));
        o->layernorm_forward(d, ln1, ACT(a, ln1_mean, l, 1), ACT(a, ln1_rstd, l, 1), x,
                             P(m, GPT_LN1W, l), P(m, GPT_LN1B, l), N, C);
        gpt_linear_forward(m, LINEAR_COLUMN, qkv, ln1, P(m, GPT_QKVW, l), P(m, GPT_QKVB, l),
                           N, C, 3 * C);
        o->attention_forward(d, atty, att, qkv, B, T, C, NH);
        gpt_linear_forward(m, LINEAR_ROW, a->proj, atty, P(m, GPT_ATTPROJW, l),
                           P(m, GPT_ATTPROJB, l), N, C, C);
        o->add(d, res2, x, a->proj, (size_t)N * C);
        o->layernorm_forward(d, ln2, ACT(a, ln2_mean, l, 1), ACT(a, ln2_rstd, l, 1), res2,
                             P(m, GPT_LN2W, l), P(m, GPT_LN2B, l), N, C);
        gpt_linear_forward(m, LINEAR_COLUMN, fch, ln2, P(m, GPT_FCW, l), P(m, GPT_FCB, l),
                           N, C, 4 * C);
        o->gelu_forward(d, fchg, fch, (size_t)N * 4 * C);
        gpt_linear_forward(m, LINEAR_ROW, a->proj, fchg, P(m, GPT_FCPROJW, l),
                           P(m, GPT_FCPROJB, l), N, 4 * C, C);
        o->add(d, res3, res2, a->proj, (size_t)N * C);
        params_release(m, unit_of_layer(m, l));
        x = res3;
    }
    return x;
}

/* The stage output: the last layer's res3, or the input when it has no layers. */
static float *stage_output(GPT *m, GPTActs *a) {
    return m->nlayers ? ACT(a, res3, m->nlayers - 1, m->cfg.dim) : a->x_in;
}

/* Final LayerNorm and the tied head; the caller holds the parameters. */
static void head_logits(GPT *m, GPTActs *a, int B, int T) {
    const Ops *o = m->dev->ops;
    int C = m->cfg.dim, N = B * T;
    o->layernorm_forward(m->dev, a->lnf, a->lnf_mean, a->lnf_rstd, stage_output(m, a),
                         P(m, GPT_LNFW, 0), P(m, GPT_LNFB, 0), N, C);
    gpt_linear_forward(m, LINEAR_WHOLE, a->logits, a->lnf, P(m, GPT_WTE, 0), NULL, N, C,
                       m->cfg.padded_vocab);
}

static void head_release(GPT *m) {
    params_release(m, unit_head(m));
    if (m->has_embed) params_release(m, unit_embed(m));
}

void gpt_head_logits(GPT *m, GPTActs *a, int B, int T) {
    params_acquire(m, unit_head(m));
    head_logits(m, a, B, T);
    head_release(m);
}

double gpt_head_forward(GPT *m, GPTActs *a, int B, int T, float dloss) {
    int N = B * T;
    params_acquire(m, unit_head(m));
    head_logits(m, a, B, T);
    head_release(m);
    m->dev->ops->crossentropy(m->dev, a->losses, a->logits, a->targets, N, m->cfg.vocab,
                              m->cfg.padded_vocab, dloss);
    return m->dev->ops->sum(m->dev, a->losses, N) / N;
}

void gpt_head_backward(GPT *m, GPTActs *a, int B, int T) {
    Dev *d = m->dev;
    int C = m->cfg.dim, N = B * T, H = unit_head(m), E = unit_embed(m);
    params_acquire(m, H);
    if (m->has_embed) params_acquire(m, E);
    grads_acquire(m, H);
    if (m->has_embed) grads_acquire(m, E);  /* dwte; ready after the embedding's backward */
    dev_zero(d, m->dln, (size_t)N * C * 4);
    gpt_linear_backward(m, LINEAR_WHOLE, m->dln, G(m, GPT_WTE, 0), NULL, a->logits, a->lnf,
                        P(m, GPT_WTE, 0), N, C, m->cfg.padded_vocab);
    dev_zero(d, m->dx, (size_t)N * C * 4);
    d->ops->layernorm_backward(d, m->dx, G(m, GPT_LNFW, 0), G(m, GPT_LNFB, 0), m->dln,
                               stage_output(m, a), P(m, GPT_LNFW, 0), a->lnf_mean, a->lnf_rstd,
                               N, C);
    grads_ready(m, H);
    head_release(m);
}

/* m->dx holds d(layer output); each layer turns it, in place, into d(layer
 * input): the residual stream's gradient passes straight through and the
 * two branches add theirs through the LayerNorm backwards, which accumulate. */
void gpt_layers_backward(GPT *m, GPTActs *a, int B, int T) {
    const Ops *o = m->dev->ops;
    Dev *d = m->dev;
    int C = m->cfg.dim, NH = m->cfg.heads, N = B * T;
    size_t nc = (size_t)N * C;
    for (int l = m->nlayers - 1; l >= 0; l--) {
        int u = unit_of_layer(m, l);
        float *x = l ? ACT(a, res3, l - 1, C) : a->x_in;
        float *ln1 = ACT(a, ln1, l, C), *qkv = ACT(a, qkv, l, 3 * C), *atty = ACT(a, atty, l, C);
        float *att = a->att + (size_t)l * a->B * NH * a->T * a->T;
        float *res2 = ACT(a, res2, l, C), *ln2 = ACT(a, ln2, l, C);
        float *fch = ACT(a, fch, l, 4 * C), *fchg = ACT(a, fchg, l, 4 * C);
        params_acquire(m, u);
        grads_acquire(m, u);
        /* MLP branch: res3 = res2 + fcproj(gelu(fc(ln2(res2)))) */
        dev_zero(d, m->dfchg, nc * 4 * 4);
        gpt_linear_backward(m, LINEAR_ROW, m->dfchg, G(m, GPT_FCPROJW, l),
                            G(m, GPT_FCPROJB, l), m->dx, fchg, P(m, GPT_FCPROJW, l),
                            N, 4 * C, C);
        dev_zero(d, m->dfch, nc * 4 * 4);
        o->gelu_backward(d, m->dfch, fch, m->dfchg, nc * 4);
        dev_zero(d, m->dln, nc * 4);
        gpt_linear_backward(m, LINEAR_COLUMN, m->dln, G(m, GPT_FCW, l), G(m, GPT_FCB, l),
                            m->dfch, ln2, P(m, GPT_FCW, l), N, C, 4 * C);
        o->layernorm_backward(d, m->dx, G(m, GPT_LN2W, l), G(m, GPT_LN2B, l), m->dln, res2,
                              P(m, GPT_LN2W, l), ACT(a, ln2_mean, l, 1),
                              ACT(a, ln2_rstd, l, 1), N, C);
        /* attention branch: res2 = x + attproj(attn(qkv(ln1(x)))) */
        dev_zero(d, m->datty, nc * 4);
        gpt_linear_backward(m, LINEAR_ROW, m->datty, G(m, GPT_ATTPROJW, l),
                            G(m, GPT_ATTPROJB, l), m->dx, atty, P(m, GPT_ATTPROJW, l),
                            N, C, C);
        dev_zero(d, m->dqkv, nc * 3 * 4);
        o->attention_backward(d, m->dqkv, m->datt, m->datty, qkv, att, B, T, C, NH);
        dev_zero(d, m->dln, nc * 4);
        gpt_linear_backward(m, LINEAR_COLUMN, m->dln, G(m, GPT_QKVW, l), G(m, GPT_QKVB, l),
                            m->dqkv, ln1, P(m, GPT_QKVW, l), N, C, 3 * C);
        o->layernorm_backward(d, m->dx, G(m, GPT_LN1W, l), G(m, GPT_LN1B, l), m->dln, x,
                              P(m, GPT_LN1W, l), ACT(a, ln1_mean, l, 1),
                              ACT(a, ln1_rstd, l, 1), N, C);
        grads_ready(m, u);
        params_release(m, u);
    }
}

void gpt_embed_backward(GPT *m, GPTActs *a, int B, int T) {
    int E = unit_embed(m);
    if (!m->has_head) grads_acquire(m, E);  /* else taken by the head's backward */
    m->dev->ops->encoder_backward(m->dev, G(m, GPT_WTE, 0), G(m, GPT_WPE, 0), m->dx, a->tokens,
                                  B, T, m->cfg.dim);
    grads_ready(m, E);
}

double gpt_forward_backward(GPT *m, GPTActs *a, int B, int T, float dloss) {
    gpt_embed_forward(m, a, B, T);
    gpt_layers_forward(m, a, B, T);
    double loss = gpt_head_forward(m, a, B, T, dloss);
    gpt_head_backward(m, a, B, T);
    gpt_layers_backward(m, a, B, T);
    gpt_embed_backward(m, a, B, T);
    return loss;
}

double gpt_forward_loss(GPT *m, GPTActs *a, int B, int T) {
    gpt_embed_forward(m, a, B, T);
    gpt_layers_forward(m, a, B, T);
    return gpt_head_forward(m, a, B, T, 0.0f);
}
