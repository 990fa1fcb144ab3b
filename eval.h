/* eval.h: llm.c's multiple-choice eval file (HellaSwag, hellaswag_val.bin)
 * and its scoring (see eval.c for the format and the rule). */
#ifndef EVAL_H
#define EVAL_H

#include <stddef.h>
#include <stdint.h>

#define EVAL_MAGIC 20240522
#define EVAL_COMPLETIONS 4      /* llm.c's ASSUMED_NUM_COMPLETIONS: every example has 4 */

/* One example: a context and four completions, pointing into EvalSet.buf. */
typedef struct EvalExample {
    int label;                                  /* the right completion, 0..3 */
    int ctx_len;                                /* >= 1 */
    const uint16_t *ctx;                        /* [ctx_len] */
    int end_len[EVAL_COMPLETIONS];              /* each >= 1 */
    const uint16_t *end[EVAL_COMPLETIONS];      /* [end_len[c]] */
} EvalExample;

typedef struct EvalSet {
    unsigned char *buf;         /* [size] the whole file, held (aligned for uint16) */
    size_t size;
    int n;                      /* examples */
    EvalExample *ex;            /* [n] */
    int max_tokens;             /* the most tokens any example needs (eval_example_tokens) */
} EvalSet;

/* Reads an eval file from memory (buf [size], copied; path only names it in
 * err), checking everything as hostile input: magic, version, the count,
 * each example's delimiter, byte length, index (0, 1, ... in order), label
 * (< 4), completions (== 4), lengths (>= 1, inside the example) and token
 * ids (< vocab; vocab <= 0: any uint16), no bytes left over. 0, or -1 with
 * one line in err naming the file, the example and its byte offset (the
 * caller exits 2). */
int eval_parse(EvalSet *es, const char *path, const unsigned char *buf, size_t size, int vocab, char *err,
               size_t errlen);
/* eval_parse of the file at path (a regular file, pipe or FIFO; safe.h). */
int eval_load(EvalSet *es, const char *path, int vocab, char *err, size_t errlen);

/* Tokens example i needs in a row: its context and its longest completion
 * (the caller refuses a file whose max_tokens exceeds --seq before training). */
int eval_example_tokens(const EvalSet *es, int i);

/* The 4 rows of example i, as llm.c's EvalLoader lays them out: row c is the
 * context then completion c, in inputs [4, T]; targets [4, T] holds each
 * row's next token (0 past the row's end, and inputs 0 there too). The loss
 * at position t predicts token t + 1, so completion c is scored over
 * positions [from[c], to[c]) = [ctx_len - 1, ctx_len + end_len[c] - 1).
 * 0, or -1 (nothing written) when the example needs more than T tokens. */
int eval_rows(const EvalSet *es, int i, int T, int *inputs, int *targets, int from[EVAL_COMPLETIONS],
              int to[EVAL_COMPLETIONS]);

/* llm.c's rule: each completion's mean loss over its positions [from, to)
 * of losses [4, T] (per position, as the cross-entropy leaves them); the
 * lowest mean wins (the first of equal ones). Returns the chosen completion
 * (compare with the label: acc_norm counts the matches); mean [4] gets the
 * means when not NULL. */
int eval_choose(const float *losses, int T, const int from[EVAL_COMPLETIONS], const int to[EVAL_COMPLETIONS],
                double *mean);

/* The examples [*lo, *hi) of rank `rank` of `ranks` (data-parallel ranks
 * split the file in contiguous, near-equal blocks). */
void eval_range(int n, int rank, int ranks, int *lo, int *hi);

void eval_free(EvalSet *es);

#endif
