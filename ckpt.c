/* ckpt.c: checkpoints as llm.c model files.
 *
 * A 256-int32 header (magic 20240326, version 3 for float32, then maxT, V,
 * L, heads, C, Vp) and the parameters in llm.c's order, so models from
 * llm.c's tools load here and ours load there. gpt_llmc_copy converts
 * between that order and the layer-major layout in memory; a stage takes
 * only its own tensors from the file.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include "ckpt.h"

#define MODEL_MAGIC 20240326
#define HEADER_BYTES (256 * 4)

int ckpt_read_config(const char *path, GPTConfig *cfg, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) { snprintf(err, errlen, "cannot open model file %s", path); return -1; }
    int32_t h[256];
    size_t got = fread(h, 4, 256, f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fclose(f);
    if (got != 256 || h[0] != MODEL_MAGIC) {
        snprintf(err, errlen, "%s: not an llm.c model file (magic %d, expected %d)", path,
                 got == 256 ? h[0] : -1, MODEL_MAGIC);
        return -1;
    }
    if (h[1] != 3) {
        snprintf(err, errlen, "%s: model file version %d, expected 3 (float32)%s", path, h[1],
                 h[1] == 5 ? "; bf16 files are not read yet" : "");
        return -1;
    }
    memset(cfg, 0, sizeof *cfg);
    cfg->max_seq = h[2]; cfg->vocab = h[3]; cfg->layers = h[4];
    cfg->heads = h[5]; cfg->dim = h[6]; cfg->padded_vocab = h[7];
    if (gpt_config_check(cfg, err, errlen) != 0) return -1;
    long expect = HEADER_BYTES + 4L * (long)gpt_total_params(cfg);
    if (size != expect) {
        snprintf(err, errlen, "%s: truncated or corrupt model file: expected %ld bytes for its header's model, found %ld",
                 path, expect, size);
        return -1;
    }
    return 0;
}

int ckpt_load(const char *path, GPT *m, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) { snprintf(err, errlen, "cannot open model file %s", path); return -1; }
    size_t total = gpt_total_params(&m->cfg);
    float *llmc = malloc(total * sizeof(float) + 1);     /* [total] in llm.c's order */
    float *host = malloc(m->num_params * sizeof(float) + 1);
    int ok = fseek(f, HEADER_BYTES, SEEK_SET) == 0 && fread(llmc, 4, total, f) == total;
    fclose(f);
    if (!ok) {
        snprintf(err, errlen, "%s: truncated: expected %zu parameters after the header", path, total);
        free(llmc); free(host);
        return -1;
    }
    gpt_llmc_copy(m, host, llmc, 0);
    dev_from_host(m->dev, m->params, host, m->num_params * sizeof(float));
    gpt_params_changed(m);
    free(llmc);
    free(host);
    return 0;
}

int ckpt_write(const char *path, const GPTConfig *cfg, const float *llmc, char *err, size_t errlen) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) { snprintf(err, errlen, "cannot write %s", tmp); return -1; }
    int32_t h[256] = {0};
    h[0] = MODEL_MAGIC; h[1] = 3;
    h[2] = cfg->max_seq; h[3] = cfg->vocab; h[4] = cfg->layers;
    h[5] = cfg->heads; h[6] = cfg->dim; h[7] = cfg->padded_vocab;
    size_t n = gpt_total_params(cfg);
    int ok = fwrite(h, 4, 256, f) == 256 && fwrite(llmc, 4, n, f) == n;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        remove(tmp);
        snprintf(err, errlen, "failed writing checkpoint %s", path);
        return -1;
    }
    return 0;
}

int ckpt_save(const char *path, GPT *m, char *err, size_t errlen) {
    if (m->layer0 != 0 || m->nlayers != m->cfg.layers || !m->has_embed || !m->has_head || m->tp != 1) {
        snprintf(err, errlen, "ckpt_save needs the whole model on one rank");
        return -1;
    }
    float *host = malloc(m->num_params * sizeof(float) + 1);
    float *llmc = malloc(m->num_params * sizeof(float) + 1);
    dev_to_host(m->dev, host, m->params, m->num_params * sizeof(float));
    gpt_llmc_copy(m, host, llmc, 1);
    int rc = ckpt_write(path, &m->cfg, llmc, err, errlen);
    free(host);
    free(llmc);
    return rc;
}
