/* ckpt.c: checkpoints as llm.c model files.
 *
 * A 256-int32 header (magic 20240326, version 3 for float32, then maxT, V,
 * L, heads, C, Vp) and the parameters in llm.c's order, so models from
 * llm.c's tools load here and ours load there. layout_llmc_copy converts
 * between that order and the layer-major layout in memory; a stage takes
 * only its own tensors from the file.
 *
 * A model file is something people download: its header is bounded by
 * gpt_config_check (safe.h's limits) before any size is computed from it,
 * the size it promises is computed in checked arithmetic, and the file must
 * be a regular file of exactly that size (it is read twice, once for the
 * header and once for the parameters, so a stream cannot be a model file).
 * It is written through safe.h's SafeOut: a temporary beside it, fsync, rename.
 *
 * Every parameter must be finite: a NaN or an infinity in a model file is
 * damage, never a model (training from it gives `loss nan` at step one), so
 * reading one names the file, the tensor, the layer and the element.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <errno.h>
#include <sys/stat.h>
#include "layout.h"
#include "ckpt.h"
#include "safe.h"

#define MODEL_MAGIC 20240326
#define HEADER_BYTES (256 * 4)

int ckpt_parse_header(const int32_t h[256], GPTConfig *cfg, size_t *file_bytes, char *err, size_t errlen) {
    if (h[0] != MODEL_MAGIC) {
        snprintf(err, errlen, "not an llm.c model file (magic %d, expected %d)", h[0], MODEL_MAGIC);
        return -1;
    }
    if (h[1] != 3) {
        snprintf(err, errlen, "model file version %d, expected 3 (float32)%s", h[1],
                 h[1] == 5 ? "; bf16 files are not read yet" : "");
        return -1;
    }
    memset(cfg, 0, sizeof *cfg);
    cfg->max_seq = h[2]; cfg->vocab = h[3]; cfg->layers = h[4];
    cfg->heads = h[5]; cfg->dim = h[6]; cfg->padded_vocab = h[7];
    if (cfg->padded_vocab < 1) {   /* a file always names it; 0 would mean "fill in" */
        snprintf(err, errlen, "padded vocab %d is outside 1..%d", cfg->padded_vocab, SAFE_MAX_VOCAB);
        return -1;
    }
    if (gpt_config_check(cfg, err, errlen) != 0) return -1;
    size_t bytes;
    if (safe_mul(gpt_total_params(cfg), sizeof(float), &bytes) != 0 ||
        safe_add(bytes, HEADER_BYTES, file_bytes) != 0) {
        snprintf(err, errlen, "model of the header's sizes is too large to address");
        return -1;
    }
    return 0;
}

/* Opens a model file, checks its header and its size; the stream is left
 * just after the header. NULL with err on any problem. */
static FILE *model_open(const char *path, GPTConfig *cfg, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) { snprintf(err, errlen, "cannot open model file %s: %s", path, strerror(errno)); return NULL; }
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        snprintf(err, errlen, "cannot stat model file %s: %s", path, strerror(errno));
        fclose(f);
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "model file %s is %s, not a regular file", path,
                 S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a pipe" : "a special file");
        fclose(f);
        return NULL;
    }
    int32_t h[256];
    char why[256];
    size_t expect;
    if (fread(h, 4, 256, f) != 256) {
        snprintf(err, errlen, "%s: not an llm.c model file (%lld bytes, shorter than its %d-byte header)", path,
                 (long long)st.st_size, HEADER_BYTES);
        fclose(f);
        return NULL;
    }
    if (ckpt_parse_header(h, cfg, &expect, why, sizeof why) != 0) {
        snprintf(err, errlen, "%s: %s", path, why);
        fclose(f);
        return NULL;
    }
    if ((unsigned long long)st.st_size != (unsigned long long)expect) {
        snprintf(err, errlen, "%s: truncated or corrupt model file: expected %zu bytes for its header's model, found %lld",
                 path, expect, (long long)st.st_size);
        fclose(f);
        return NULL;
    }
    return f;
}

/* Names element g of llm.c's order of the model cfg: "qkvw of layer 1, element 17 of 12288". */
static void name_element(const GPTConfig *cfg, size_t g, char *buf, size_t len) {
    size_t start = 0;
    for (int i = 0; i < GPT_NTENSORS; i++) {
        size_t n = layout_tensor_size(cfg, i, cfg->layers, 1, 1, 1);
        if (g >= start + n) { start += n; continue; }
        size_t k = g - start;
        if (gpt_tensor_per_layer(i)) {
            size_t per = layout_piece_size(cfg, i, 1);
            snprintf(buf, len, "%s of layer %zu, element %zu of %zu", gpt_tensor_name(i), k / per, k % per, per);
        } else {
            snprintf(buf, len, "%s, element %zu of %zu", gpt_tensor_name(i), k, n);
        }
        return;
    }
    snprintf(buf, len, "element %zu", g);
}

/* 0 when v [n] (elements base .. base+n-1 of llm.c's order) are all finite,
 * else -1 with err naming the file, the first such value and its tensor. */
static int check_finite(const char *path, const GPTConfig *cfg, const float *v, size_t n, size_t base, char *err,
                        size_t errlen) {
    for (size_t k = 0; k < n; k++) {
        if (isfinite(v[k])) continue;
        char where[160];
        name_element(cfg, base + k, where, sizeof where);
        snprintf(err, errlen, "model file %s: %s in %s: a damaged model (every parameter must be finite)", path,
                 isnan(v[k]) ? "NaN" : v[k] > 0 ? "+Inf" : "-Inf", where);
        return -1;
    }
    return 0;
}

int ckpt_read_config(const char *path, GPTConfig *cfg, char *err, size_t errlen) {
    FILE *f = model_open(path, cfg, err, errlen);
    if (!f) return -1;
    /* every parameter read, in pieces, and checked finite */
    enum { CHUNK = 1 << 16 };
    float *buf = safe_malloc(CHUNK * sizeof(float), "a piece of the model file");   /* [CHUNK] */
    size_t total = gpt_total_params(cfg), done = 0;
    int rc = 0;
    while (done < total && rc == 0) {
        size_t want = total - done < CHUNK ? total - done : CHUNK;
        if (fread(buf, sizeof(float), want, f) != want) {
            snprintf(err, errlen, "%s: truncated: expected %zu parameters after the header", path, total);
            rc = -1;
        } else {
            rc = check_finite(path, cfg, buf, want, done, err, errlen);
        }
        done += want;
    }
    free(buf);
    fclose(f);
    return rc;
}

int ckpt_load(const char *path, GPT *m, char *err, size_t errlen) {
    GPTConfig cfg;
    FILE *f = model_open(path, &cfg, err, errlen);
    if (!f) return -1;
    const GPTConfig *b = &m->cfg;
    if (cfg.max_seq != b->max_seq || cfg.vocab != b->vocab || cfg.padded_vocab != b->padded_vocab ||
        cfg.layers != b->layers || cfg.heads != b->heads || cfg.dim != b->dim) {   /* the file changed since ckpt_read_config */
        snprintf(err, errlen, "%s: its header no longer matches the model built from it", path);
        fclose(f);
        return -1;
    }
    size_t total = gpt_total_params(&m->cfg), bytes, local;
    if (safe_mul(total, sizeof(float), &bytes) != 0 || safe_mul(m->num_params, sizeof(float), &local) != 0) {
        snprintf(err, errlen, "%s: model too large to address", path);
        fclose(f);
        return -1;
    }
    float *llmc = safe_malloc(bytes, "the model file's parameters");   /* [total] in llm.c's order */
    float *host = safe_malloc(local, "the parameters");                /* [num_params] */
    int ok = fread(llmc, 4, total, f) == total;
    fclose(f);
    if (!ok) {
        snprintf(err, errlen, "%s: truncated: expected %zu parameters after the header", path, total);
        free(llmc); free(host);
        return -1;
    }
    if (check_finite(path, &m->cfg, llmc, total, 0, err, errlen) != 0) {   /* changed since ckpt_read_config */
        free(llmc); free(host);
        return -1;
    }
    layout_llmc_copy(m, host, llmc, 0);
    dev_from_host(m->dev, m->params, host, local);
    gpt_params_changed(m);
    free(llmc);
    free(host);
    return 0;
}

int ckpt_write(const char *path, const GPTConfig *cfg, const float *llmc, char *err, size_t errlen) {
    SafeOut o;
    if (safe_out_open(&o, path, err, errlen) != 0) return -1;
    int32_t h[256] = {0};
    h[0] = MODEL_MAGIC; h[1] = 3;
    h[2] = cfg->max_seq; h[3] = cfg->vocab; h[4] = cfg->layers;
    h[5] = cfg->heads; h[6] = cfg->dim; h[7] = cfg->padded_vocab;
    size_t n = gpt_total_params(cfg);
    if (fwrite(h, 4, 256, o.f) != 256 || fwrite(llmc, 4, n, o.f) != n) {
        snprintf(err, errlen, "failed writing %s: %s", path, strerror(errno));
        safe_out_abort(&o);
        return -1;
    }
    return safe_out_commit(&o, err, errlen);
}

int ckpt_save(const char *path, GPT *m, char *err, size_t errlen) {
    if (m->layer0 != 0 || m->nlayers != m->cfg.layers || !m->has_embed || !m->has_head || m->tp != 1) {
        snprintf(err, errlen, "ckpt_save needs the whole model on one rank");
        return -1;
    }
    size_t bytes;
    if (safe_mul(m->num_params, sizeof(float), &bytes) != 0) {
        snprintf(err, errlen, "model too large to address");
        return -1;
    }
    float *host = safe_malloc(bytes, "the parameters");
    float *llmc = safe_malloc(bytes, "the parameters in llm.c's order");
    dev_to_host(m->dev, host, m->params, bytes);
    layout_llmc_copy(m, host, llmc, 1);
    int rc = ckpt_write(path, &m->cfg, llmc, err, errlen);
    free(host);
    free(llmc);
    return rc;
}
