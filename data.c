/* data.c: token files and per-rank batches.
 *
 * The order of the data is part of the contract between layouts: a global
 * batch of G sequences is the same set of tokens whichever ranks share it
 * (DESIGN.md step 1: data.c gives each dp rank its micro-batches of the
 * global batch). Sequence j of step s starts at token ((s*G + j) mod n) * T.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "data.h"

#define TOKENS_MAGIC 20240520
#define HEADER_BYTES (256 * 4)

int data_load(DataSet *ds, const char *path, char *err, size_t errlen) {
    memset(ds, 0, sizeof *ds);
    FILE *f = fopen(path, "rb");
    if (!f) { snprintf(err, errlen, "cannot open data file %s", path); return -1; }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    int32_t header[256] = {0};
    int is_token_file = size >= HEADER_BYTES && fread(header, 4, 256, f) == 256 &&
                        header[0] == TOKENS_MAGIC;
    if (is_token_file) {
        if (header[1] != 1) {
            snprintf(err, errlen, "%s: token file version %d, expected 1", path, header[1]);
            fclose(f);
            return -1;
        }
        long expect = HEADER_BYTES + 2L * header[2];
        if (header[2] < 0 || size != expect) {
            snprintf(err, errlen, "%s: truncated or corrupt token file: header says %d tokens (%ld bytes), file has %ld bytes",
                     path, header[2], expect, size);
            fclose(f);
            return -1;
        }
        ds->n_tokens = (size_t)header[2];
        uint16_t *raw = malloc(ds->n_tokens * 2 + 1);
        ds->tokens = malloc(ds->n_tokens * sizeof(int) + 1);
        if (fread(raw, 2, ds->n_tokens, f) != ds->n_tokens) {
            snprintf(err, errlen, "%s: read error", path);
            free(raw); fclose(f); data_free(ds);
            return -1;
        }
        for (size_t i = 0; i < ds->n_tokens; i++) ds->tokens[i] = raw[i];
        free(raw);
    } else {
        ds->is_bytes = 1;
        ds->n_tokens = (size_t)size;
        unsigned char *raw = malloc(ds->n_tokens + 1);
        ds->tokens = malloc(ds->n_tokens * sizeof(int) + 1);
        fseek(f, 0, SEEK_SET);
        if (fread(raw, 1, ds->n_tokens, f) != ds->n_tokens) {
            snprintf(err, errlen, "%s: read error", path);
            free(raw); fclose(f); data_free(ds);
            return -1;
        }
        for (size_t i = 0; i < ds->n_tokens; i++) ds->tokens[i] = raw[i];
        free(raw);
    }
    fclose(f);
    for (size_t i = 0; i < ds->n_tokens; i++)
        if (ds->tokens[i] > ds->max_token) ds->max_token = ds->tokens[i];
    return 0;
}

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

int data_prepare(DataSet *ds, const char *path, int T, int shuffle, uint64_t seed, char *err,
                 size_t errlen) {
    if (ds->n_tokens < (size_t)T + 1) {
        snprintf(err, errlen, "%s has %zu tokens, fewer than --seq %d + 1", path, ds->n_tokens, T);
        return -1;
    }
    ds->T = T;
    ds->n_seqs = (ds->n_tokens - 1) / T;
    free(ds->perm);
    ds->perm = NULL;
    if (shuffle) {  /* Fisher-Yates, seeded */
        ds->perm = malloc(ds->n_seqs * sizeof(size_t));
        for (size_t i = 0; i < ds->n_seqs; i++) ds->perm[i] = i;
        uint64_t s = seed ^ 0x5eed5eedULL;
        for (size_t i = ds->n_seqs - 1; i > 0; i--) {
            size_t j = splitmix(&s) % (i + 1);
            size_t t = ds->perm[i]; ds->perm[i] = ds->perm[j]; ds->perm[j] = t;
        }
    }
    return 0;
}

void data_batch(const DataSet *ds, long step, int G, int j0, int count, int *inputs,
                int *targets) {
    int T = ds->T;
    for (int i = 0; i < count; i++) {
        size_t k = (size_t)(((unsigned long)step * G + j0 + i) % ds->n_seqs);
        if (ds->perm) k = ds->perm[k];
        const int *src = ds->tokens + k * T;
        for (int t = 0; t < T; t++) {
            inputs[(size_t)i * T + t] = src[t];
            targets[(size_t)i * T + t] = src[t + 1];
        }
    }
}

void data_free(DataSet *ds) {
    free(ds->tokens);
    free(ds->perm);
    memset(ds, 0, sizeof *ds);
}

#define TOKENIZER_MAGIC 20240328

int data_tokenizer_load(Tokenizer *t, const char *path, char *err, size_t errlen) {
    memset(t, 0, sizeof *t);
    FILE *f = fopen(path, "rb");
    if (!f) { snprintf(err, errlen, "cannot open tokenizer file %s", path); return -1; }
    uint32_t h[256];
    if (fread(h, 4, 256, f) != 256 || h[0] != TOKENIZER_MAGIC || (h[1] != 1 && h[1] != 2)) {
        snprintf(err, errlen, "%s: not an llm.c tokenizer file (magic %u version %u, expected %d version 1 or 2)",
                 path, h[0], h[1], TOKENIZER_MAGIC);
        fclose(f);
        return -1;
    }
    t->vocab = (int)h[2];
    t->text = calloc(t->vocab, sizeof(char *));
    for (int i = 0; i < t->vocab; i++) {
        unsigned char len;
        if (fread(&len, 1, 1, f) != 1 || !(t->text[i] = malloc(len + 1u)) ||
            fread(t->text[i], 1, len, f) != len) {
            snprintf(err, errlen, "%s: truncated at token %d of %d", path, i, t->vocab);
            fclose(f);
            data_tokenizer_free(t);
            return -1;
        }
        t->text[i][len] = 0;
    }
    fclose(f);
    return 0;
}

const char *data_token_text(const Tokenizer *t, int id) {
    return id >= 0 && id < t->vocab ? t->text[id] : NULL;
}

void data_tokenizer_free(Tokenizer *t) {
    for (int i = 0; i < t->vocab && t->text; i++) free(t->text[i]);
    free(t->text);
    memset(t, 0, sizeof *t);
}
