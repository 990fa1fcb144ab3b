/* data.h: token files and the fixed order of sequences in a global batch. */
#ifndef DATA_H
#define DATA_H

#include <stddef.h>
#include <stdint.h>

typedef struct DataSet {
    int *tokens;        /* [n_tokens] */
    size_t n_tokens;
    int is_bytes;       /* 1: a plain file read one byte a token (vocabulary 256) */
    int max_token;      /* largest id in the file */
    size_t *perm;       /* [n_seqs] with --shuffle, else NULL */
    size_t n_seqs;      /* (n_tokens - 1) / T, set by data_prepare */
    int T;
} DataSet;

/* Reads an llm.c token file (header magic 20240520, version 1, count, then
 * uint16 tokens) or, for any other file, its bytes (at most 2^31 - 1 tokens).
 * A regular file, or a pipe, FIFO or /dev/stdin read to its end (safe.h);
 * directories and devices are refused. Returns 0, or -1 with one line in err
 * naming the file and what was expected and found. */
int data_load(DataSet *ds, const char *path, char *err, size_t errlen);
/* data_load of a file already in memory (buf [size]; path only names it in
 * err): the fuzz target. */
int data_parse(DataSet *ds, const char *path, const unsigned char *buf, size_t size, char *err, size_t errlen);

/* Fixes the sequence length and, with shuffle, a seeded permutation of the
 * sequences. Returns -1 with err when the file is shorter than T + 1 tokens. */
int data_prepare(DataSet *ds, const char *path, int T, int shuffle, uint64_t seed, char *err,
                 size_t errlen);

/* Sequences [j0, j0 + count) of the global batch of step `step` (G sequences
 * a step): sequence j starts at token ((step*G + j) mod n) * T. Fills
 * inputs and targets [count, T]. */
void data_batch(const DataSet *ds, long step, int G, int j0, int count, int *inputs,
                int *targets);

void data_free(DataSet *ds);

/* llm.c's tokenizer file (gpt2_tokenizer.bin: magic 20240328, version 1 or
 * 2, then each token's bytes behind a length byte), for printing samples. */
typedef struct Tokenizer {
    int vocab;
    char **text;   /* [vocab] each token's bytes, NUL-terminated */
} Tokenizer;

/* Returns 0, or -1 with one line in err naming the file and the problem. */
int data_tokenizer_load(Tokenizer *t, const char *path, char *err, size_t errlen);
/* data_tokenizer_load of a file in memory (buf [size]): the fuzz target. */
int data_tokenizer_parse(Tokenizer *t, const char *path, const unsigned char *buf, size_t size, char *err,
                         size_t errlen);
/* The bytes of token id, or NULL when it is outside the tokenizer. */
const char *data_token_text(const Tokenizer *t, int id);
void data_tokenizer_free(Tokenizer *t);

#endif
