/* eval.c: HellaSwag as llm.c scores it (its dev/data/hellaswag.py writes
 * the file, llmc/eval_loader.h reads it), for --eval-hellaswag.
 *
 * The file: a header of 256 int32 (magic 20240522, version 1, the number of
 * examples, the longest example's bytes), then each example as uint16:
 *
 *   65535, bytes, index, label, 4, ctx_len, ctx[ctx_len],
 *   end_len[0], end[0][...], ..., end_len[3], end[3][...]
 *
 * where bytes counts the whole example (its own six words included) and the
 * index runs 0, 1, ... in file order. Each example becomes four rows: the
 * context then one completion. A model's per-position losses over a row say
 * how well it predicts the completion given the context: the mean over the
 * completion's tokens (the loss at position t predicts token t + 1, so the
 * completion's tokens are predicted from positions ctx_len - 1 on). The
 * completion with the lowest mean is the model's choice; llm.c reports the
 * share of right choices as acc_norm (the mean normalises for length).
 *
 * The file comes from a download: every length, index, label and id is
 * checked before it is used, and any problem is one line naming the file,
 * the example and its byte offset (fuzz/fuzz_eval.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "eval.h"
#include "safe.h"

#define HEADER_BYTES (256 * 4)
#define EXAMPLE_WORDS 6                               /* 65535, bytes, index, label, 4, ctx_len */
#define MIN_EXAMPLE_BYTES (2 * (EXAMPLE_WORDS + 1 + 2 * EVAL_COMPLETIONS))   /* every length 1 */
#define MAX_EVAL_BYTES ((size_t)1 << 32)

/* Example i's words at byte off of es->buf; stops at the first problem. */
static int parse_example(EvalSet *es, const char *path, int i, size_t off, int longest, int vocab, size_t *next,
                         char *err, size_t errlen) {
    const uint16_t *w = (const uint16_t *)(es->buf + off);
    size_t left = (es->size - off) / 2;   /* words from off to the end of the file */
    if (left < EXAMPLE_WORDS) {
        snprintf(err, errlen, "%s: truncated at example %d of %d (byte offset %zu): %zu bytes left", path, i, es->n,
                 off, es->size - off);
        return -1;
    }
    if (w[0] != 65535) {
        snprintf(err, errlen, "%s: example %d (byte offset %zu) starts with %u, not the delimiter 65535", path, i,
                 off, w[0]);
        return -1;
    }
    size_t bytes = w[1];
    if (bytes % 2 || bytes < MIN_EXAMPLE_BYTES) {
        snprintf(err, errlen, "%s: example %d (byte offset %zu) says %zu bytes: odd or fewer than the smallest "
                 "example's %d", path, i, off, bytes, MIN_EXAMPLE_BYTES);
        return -1;
    }
    if (bytes / 2 > left) {
        snprintf(err, errlen, "%s: truncated at example %d of %d (byte offset %zu): it says %zu bytes, %zu are left",
                 path, i, es->n, off, bytes, es->size - off);
        return -1;
    }
    if ((int)bytes > longest) {
        snprintf(err, errlen, "%s: example %d (byte offset %zu) has %zu bytes, more than the header's longest %d",
                 path, i, off, bytes, longest);
        return -1;
    }
    if (w[2] != i) {
        snprintf(err, errlen, "%s: example at byte offset %zu has index %u, expected %d (in order)", path, off,
                 w[2], i);
        return -1;
    }
    if (w[4] != EVAL_COMPLETIONS) {
        snprintf(err, errlen, "%s: example %d (byte offset %zu): %u completions, expected %d", path, i, off, w[4],
                 EVAL_COMPLETIONS);
        return -1;
    }
    if (w[3] >= EVAL_COMPLETIONS) {
        snprintf(err, errlen, "%s: example %d (byte offset %zu): label %u, expected 0..%d", path, i, off, w[3],
                 EVAL_COMPLETIONS - 1);
        return -1;
    }
    size_t words = bytes / 2, at = EXAMPLE_WORDS - 1;   /* at: the next length word */
    EvalExample *e = &es->ex[i];
    e->label = w[3];
    for (int c = -1; c < EVAL_COMPLETIONS; c++) {   /* c = -1: the context */
        size_t len = at < words ? w[at] : 0;
        const char *what = c < 0 ? "context" : "completion";
        if (at >= words || len < 1 || len > words - at - 1) {
            snprintf(err, errlen, "%s: example %d (byte offset %zu): %s %d's length %zu is 0 or runs past the "
                     "example's %zu bytes", path, i, off, what, c < 0 ? 0 : c, len, bytes);
            return -1;
        }
        const uint16_t *tok = w + at + 1;
        for (size_t t = 0; t < len; t++)
            if (vocab > 0 && tok[t] >= vocab) {
                snprintf(err, errlen, "%s: example %d: token id %u >= vocab %d at byte offset %zu", path, i, tok[t],
                         vocab, off + 2 * (at + 1 + t));
                return -1;
            }
        if (c < 0) { e->ctx_len = (int)len; e->ctx = tok; }
        else { e->end_len[c] = (int)len; e->end[c] = tok; }
        at += 1 + len;
    }
    if (at != words) {
        snprintf(err, errlen, "%s: example %d (byte offset %zu) says %zu bytes but its lengths add up to %zu", path,
                 i, off, bytes, 2 * at);
        return -1;
    }
    *next = off + bytes;
    return 0;
}

/* The file in es->buf [es->size] (held by es). */
static int parse_held(EvalSet *es, const char *path, int vocab, char *err, size_t errlen) {
    int32_t h[4] = {0};
    if (es->size >= HEADER_BYTES) memcpy(h, es->buf, sizeof h);
    if (es->size < HEADER_BYTES || h[0] != EVAL_MAGIC) {
        snprintf(err, errlen, "%s: not an llm.c eval file (magic %d in %zu bytes, expected %d and a %d-byte header)",
                 path, h[0], es->size, EVAL_MAGIC, HEADER_BYTES);
        return -1;
    }
    if (h[1] != 1) {
        snprintf(err, errlen, "%s: eval file version %d, expected 1", path, h[1]);
        return -1;
    }
    size_t most = (es->size - HEADER_BYTES) / MIN_EXAMPLE_BYTES;   /* examples its bytes can hold */
    if (h[2] < 1 || (size_t)h[2] > most) {
        snprintf(err, errlen, "%s: header says %d examples; its %zu bytes hold between 1 and %zu", path, h[2],
                 es->size, most);
        return -1;
    }
    if (h[3] < MIN_EXAMPLE_BYTES || h[3] > 65535) {
        snprintf(err, errlen, "%s: header says the longest example has %d bytes, outside %d..65535", path, h[3],
                 MIN_EXAMPLE_BYTES);
        return -1;
    }
    es->n = h[2];
    es->ex = safe_malloc((size_t)es->n * sizeof *es->ex, "the eval examples");
    size_t off = HEADER_BYTES;
    for (int i = 0; i < es->n; i++) {
        if (parse_example(es, path, i, off, h[3], vocab, &off, err, errlen) != 0) return -1;
        int need = eval_example_tokens(es, i);
        if (need > es->max_tokens) es->max_tokens = need;
    }
    if (off != es->size) {
        snprintf(err, errlen, "%s: %zu bytes after its %d examples (byte offset %zu)", path, es->size - off, es->n,
                 off);
        return -1;
    }
    return 0;
}

int eval_parse(EvalSet *es, const char *path, const unsigned char *buf, size_t size, int vocab, char *err,
               size_t errlen) {
    memset(es, 0, sizeof *es);
    es->buf = safe_malloc(size, "the eval file");   /* malloc's alignment: the uint16 words lie aligned */
    if (size) memcpy(es->buf, buf, size);
    es->size = size;
    int rc = parse_held(es, path, vocab, err, errlen);
    if (rc != 0) eval_free(es);
    return rc;
}

int eval_load(EvalSet *es, const char *path, int vocab, char *err, size_t errlen) {
    memset(es, 0, sizeof *es);
    if (safe_read_named(path, "eval", MAX_EVAL_BYTES, &es->buf, &es->size, err, errlen) != 0) return -1;
    int rc = parse_held(es, path, vocab, err, errlen);
    if (rc != 0) eval_free(es);
    return rc;
}

int eval_example_tokens(const EvalSet *es, int i) {
    const EvalExample *e = &es->ex[i];
    int most = 0;
    for (int c = 0; c < EVAL_COMPLETIONS; c++)
        if (e->end_len[c] > most) most = e->end_len[c];
    return e->ctx_len + most;
}

int eval_rows(const EvalSet *es, int i, int T, int *inputs, int *targets, int from[EVAL_COMPLETIONS],
              int to[EVAL_COMPLETIONS]) {
    const EvalExample *e = &es->ex[i];
    if (eval_example_tokens(es, i) > T) return -1;
    for (int c = 0; c < EVAL_COMPLETIONS; c++) {
        int *in = inputs + (size_t)c * T, *tg = targets + (size_t)c * T;
        int len = e->ctx_len + e->end_len[c];
        for (int t = 0; t < T; t++) {   /* row c: the context then completion c, then zeros */
            in[t] = t < e->ctx_len ? e->ctx[t] : t < len ? e->end[c][t - e->ctx_len] : 0;
            tg[t] = 0;
        }
        for (int t = 0; t + 1 < len; t++) tg[t] = in[t + 1];
        from[c] = e->ctx_len - 1;
        to[c] = len - 1;
    }
    return 0;
}

int eval_choose(const float *losses, int T, const int from[EVAL_COMPLETIONS], const int to[EVAL_COMPLETIONS],
                double *mean) {
    int best = 0;
    double best_mean = 0.0;
    for (int c = 0; c < EVAL_COMPLETIONS; c++) {
        double sum = 0.0;
        for (int t = from[c]; t < to[c]; t++) sum += losses[(size_t)c * T + t];
        double m = to[c] > from[c] ? sum / (to[c] - from[c]) : 0.0;
        if (mean) mean[c] = m;
        if (c == 0 || m < best_mean) { best = c; best_mean = m; }
    }
    return best;
}

void eval_range(int n, int rank, int ranks, int *lo, int *hi) {
    *lo = (int)((long long)n * rank / ranks);
    *hi = (int)((long long)n * (rank + 1) / ranks);
}

void eval_free(EvalSet *es) {
    free(es->buf);
    free(es->ex);
    memset(es, 0, sizeof *es);
}
