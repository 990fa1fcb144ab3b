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
#include "safe.h"

#define TOKENS_MAGIC 20240520
#define HEADER_BYTES (256 * 4)
/* The most tokens a file may hold: a token file's count is an int32. */
#define MAX_TOKENS 0x7fffffffu

int data_parse(DataSet *ds, const char *path, const unsigned char *buf, size_t size, char *err, size_t errlen) {
    memset(ds, 0, sizeof *ds);
    int32_t header[256] = {0};
    if (size >= HEADER_BYTES) memcpy(header, buf, HEADER_BYTES);
    if (size >= HEADER_BYTES && header[0] == TOKENS_MAGIC) {
        if (header[1] != 1) {
            snprintf(err, errlen, "%s: token file version %d, expected 1", path, header[1]);
            return -1;
        }
        size_t expect = HEADER_BYTES + 2 * (size_t)(uint32_t)header[2];   /* < 2^33: no wrap */
        if (header[2] < 0 || size != expect) {
            snprintf(err, errlen, "%s: truncated or corrupt token file: header says %d tokens (%zu bytes), file has %zu bytes",
                     path, header[2], header[2] < 0 ? (size_t)0 : expect, size);
            return -1;
        }
        ds->n_tokens = (size_t)header[2];
        ds->tokens = safe_malloc(ds->n_tokens * sizeof(int), "the tokens");
        for (size_t i = 0; i < ds->n_tokens; i++) {
            uint16_t t;
            memcpy(&t, buf + HEADER_BYTES + 2 * i, 2);
            ds->tokens[i] = t;
        }
    } else {
        if (size > MAX_TOKENS) {
            snprintf(err, errlen, "%s: %zu bytes, more than the %u tokens a data file may hold", path, size, MAX_TOKENS);
            return -1;
        }
        ds->is_bytes = 1;
        ds->n_tokens = size;
        ds->tokens = safe_malloc(ds->n_tokens * sizeof(int), "the tokens");
        for (size_t i = 0; i < ds->n_tokens; i++) ds->tokens[i] = buf[i];
    }
    for (size_t i = 0; i < ds->n_tokens; i++)
        if (ds->tokens[i] > ds->max_token) ds->max_token = ds->tokens[i];
    return 0;
}

int data_load(DataSet *ds, const char *path, char *err, size_t errlen) {
    memset(ds, 0, sizeof *ds);
    unsigned char *buf;
    size_t size;
    char why[512];
    if (safe_read_file(path, HEADER_BYTES + 2 * (size_t)MAX_TOKENS, &buf, &size, why, sizeof why) != 0) {
        snprintf(err, errlen, "cannot read data file %s: %s", path, why);
        if (!strncmp(why, "cannot open ", 12)) snprintf(err, errlen, "cannot open data file %s", why + 12);
        return -1;
    }
    int rc = data_parse(ds, path, buf, size, err, errlen);
    free(buf);
    return rc;
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
        ds->perm = safe_malloc(ds->n_seqs * sizeof(size_t), "the shuffled order");
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

int data_tokenizer_parse(Tokenizer *t, const char *path, const unsigned char *buf, size_t size, char *err,
                         size_t errlen) {
    memset(t, 0, sizeof *t);
    uint32_t h[256] = {0};
    if (size >= HEADER_BYTES) memcpy(h, buf, HEADER_BYTES);
    if (size < HEADER_BYTES || h[0] != TOKENIZER_MAGIC || (h[1] != 1 && h[1] != 2)) {
        snprintf(err, errlen, "%s: not an llm.c tokenizer file (magic %u version %u, expected %d version 1 or 2)",
                 path, h[0], h[1], TOKENIZER_MAGIC);
        return -1;
    }
    /* each token takes at least its length byte: a vocabulary the file cannot hold is refused before
     * anything is allocated for it */
    if (h[2] < 1 || h[2] > SAFE_MAX_VOCAB || h[2] > size - HEADER_BYTES) {
        snprintf(err, errlen, "%s: tokenizer vocabulary %u is outside 1..%d or larger than its %zu bytes can hold",
                 path, h[2], SAFE_MAX_VOCAB, size - HEADER_BYTES);
        return -1;
    }
    int vocab = (int)h[2];
    t->text = safe_malloc((size_t)vocab * sizeof(char *), "the tokenizer");
    size_t off = HEADER_BYTES;
    for (int i = 0; i < vocab; i++) {
        size_t len = off < size ? buf[off] : 0;
        if (off >= size || len > size - off - 1) {
            snprintf(err, errlen, "%s: truncated at token %d of %d", path, i, vocab);
            data_tokenizer_free(t);
            return -1;
        }
        t->text[i] = safe_malloc(len + 1, "a token's text");
        memcpy(t->text[i], buf + off + 1, len);
        t->text[i][len] = 0;
        t->vocab = i + 1;   /* what data_tokenizer_free frees */
        off += 1 + len;
    }
    return 0;
}

int data_tokenizer_load(Tokenizer *t, const char *path, char *err, size_t errlen) {
    memset(t, 0, sizeof *t);
    unsigned char *buf;
    size_t size;
    char why[512];
    if (safe_read_file(path, HEADER_BYTES + 256 * (size_t)SAFE_MAX_VOCAB, &buf, &size, why, sizeof why) != 0) {
        snprintf(err, errlen, "cannot read tokenizer file %s: %s", path, why);
        if (!strncmp(why, "cannot open ", 12)) snprintf(err, errlen, "cannot open tokenizer file %s", why + 12);
        return -1;
    }
    int rc = data_tokenizer_parse(t, path, buf, size, err, errlen);
    free(buf);
    return rc;
}

const char *data_token_text(const Tokenizer *t, int id) {
    return id >= 0 && id < t->vocab ? t->text[id] : NULL;
}

void data_tokenizer_free(Tokenizer *t) {
    for (int i = 0; i < t->vocab && t->text; i++) free(t->text[i]);
    free(t->text);
    memset(t, 0, sizeof *t);
}
