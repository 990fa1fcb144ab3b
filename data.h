/* data.h: token shards, the fixed order of sequences in a global batch, and
 * llm.c's tokenizer file (see data.c for the design and the order's contract). */
#ifndef DATA_H
#define DATA_H

#include <stddef.h>
#include <stdint.h>

/* Token ids are scanned whole at data_load when all the shards together hold
 * at most this many tokens (64M: 128 MB of uint16, a fraction of a second
 * from the page cache); beyond it each sequence is checked as data_batch
 * reads it, and data_scan (--check-data) reads everything. */
#define DATA_SCAN_MAX_TOKENS (64u << 20)
/* Token files mapped at once by one DataSet: a batch may end one shard and
 * begin the next; older mappings are let go (the least recently used). */
#define DATA_MAX_MAPPED 2

/* One file of a --data or --val spec. An llm.c token file on disk is mapped
 * only while in use and read as uint16 where it lies; a byte file, a pipe or
 * a FIFO is held in memory whole, as it came. */
typedef struct DataShard {
    char *path;                 /* as named or matched */
    size_t n_tokens;
    size_t n_seqs;              /* (n_tokens - 1) / T, set by data_prepare */
    uint64_t dev, ino;          /* a regular file's identity (0, 0 for streams) */
    size_t file_bytes;          /* a mapped file's size at open: checked before each use */
    unsigned char *held;        /* [file's bytes] when held in memory, else NULL */
    const unsigned char *map;   /* [file_bytes] while mapped, else NULL */
    int fd;                     /* open while mapped, else -1 */
    long last_use;              /* DataSet.clock at its last batch: who is unmapped first */
} DataShard;

typedef struct DataSet {
    DataShard *shards;          /* [n_shards] in sorted name order */
    int n_shards;
    size_t n_tokens;            /* all shards together */
    int is_bytes;               /* 1: plain files read one byte a token (vocabulary 256) */
    int scanned;                /* 1: every id was read at data_load (n_tokens <= DATA_SCAN_MAX_TOKENS) */
    int max_token;              /* largest id when scanned, else -1 */
    int max_shard;              /* where max_token first occurs: shard, and token index in it */
    size_t max_at;
    int vocab;                  /* ids >= vocab stop data_batch (data_check_vocab; 0: unchecked) */
    int T;                      /* set by data_prepare */
    size_t n_seqs;              /* sequences of an epoch: the sum of the shards' */
    int shuffle;
    uint64_t seed;
    long order_epoch;           /* the epoch order[] and order_first[] hold (-1: none) */
    int *order;                 /* [n_shards] the epoch's k-th shard (identity without shuffle) */
    size_t *order_first;        /* [n_shards + 1] sequences of the epoch before its k-th shard */
    int n_mapped;
    long clock;                 /* counts batches: for the mappings' last_use */
} DataSet;

/* Where a global sequence falls: epoch, shard (index in the sorted list),
 * the shard's place in that epoch's order, and the sequence (the count of
 * sequences of that shard already taken this epoch, and the sequence read:
 * its first token is seq * T of the shard). */
typedef struct DataPos {
    long epoch;
    int shard, shard_rank;
    size_t taken, seq;
} DataPos;

/* Opens every shard of spec: a file, a glob ('dir/train_*.bin', quoted on
 * the command line) or a comma-separated list of either, taken in sorted
 * name order (a spec that names an existing file is that file, commas and
 * all). Token files' headers are checked and the files closed again; byte
 * files, pipes and FIFOs are read whole (at most 2^31 - 1 tokens each); up to
 * DATA_SCAN_MAX_TOKENS every id is scanned. A glob matching nothing, a name
 * twice, a directory, a device, a truncated or foreign file, byte files mixed
 * with token files: -1 with one line in err naming the file. Else 0. */
int data_load(DataSet *ds, const char *spec, char *err, size_t errlen);
/* One shard from memory (buf [size], copied; path only names it in err): the
 * fuzz target. 0, or -1 with err. */
int data_parse(DataSet *ds, const char *path, const unsigned char *buf, size_t size, char *err, size_t errlen);

/* Fixes the sequence length T (each shard holds (n_tokens - 1) / T whole
 * sequences; none straddles two shards) and the order: with shuffle, the
 * shards and the sequences in each are permuted anew each epoch from seed.
 * -1 with err naming the shard that has fewer than T + 1 tokens (path names
 * the data when it has no shard). */
int data_prepare(DataSet *ds, const char *path, int T, int shuffle, uint64_t seed, char *err, size_t errlen);

/* Ids must be < vocab: when scanned, checks max_token now (-1 with err naming
 * the file and offset of the first such id); otherwise records vocab for
 * data_batch's checks. 0 when fine. */
int data_check_vocab(DataSet *ds, int vocab, char *err, size_t errlen);

/* Reads every token of every shard (--check-data): -1 with err naming the
 * file and offset of the first id >= vocab (or the shard that cannot be
 * read); else 0, with *max_token (may be NULL) the largest id. */
int data_scan(DataSet *ds, int vocab, int *max_token, char *err, size_t errlen);

/* Sequences [j0, j0 + count) of the global batch of step `step` (G sequences
 * a step) into inputs and targets [count, T]. Global sequence g = step*G + j
 * is sequence g mod n_seqs of the epoch g / n_seqs; with one shard and no
 * shuffle it starts at token (g mod n_seqs) * T, as it always has. 0, or -1
 * with one line in err: an id >= vocab (file and offset), a shard that shrank
 * or changed since data_load, a mapping that failed. */
int data_batch(DataSet *ds, long step, int G, int j0, int count, int *inputs, int *targets, char *err,
               size_t errlen);

/* Where sequence j of step `step` falls (the checkpoint's "position"). */
DataPos data_position(DataSet *ds, long step, int G, int j);

/* The shard list for a checkpoint's manifest, malloc'd: "data_shards N\n"
 * then N lines "data_shard I TOKENS NAME\n" (NAME: the file's name without
 * its directory, bytes <= ' ', '%' and >= 0x7f written %XX). */
char *data_describe(const DataSet *ds);
/* Compares a saved data_describe text with ds: 0 when they agree (names and
 * sizes; directories may differ), 1 with one line in msg saying what
 * changed, -1 with msg when saved is not such a text. */
int data_compare(const char *saved, const DataSet *ds, char *msg, size_t msglen);

/* Files that train and val share (the same file on disk): their number,
 * and when there are any one line in msg naming the first, for a warning. */
int data_overlap(const DataSet *train, const DataSet *val, char *msg, size_t msglen);

/* A byte file named like a token file: when ds is read as bytes (no llm.c
 * token magic) and one of its files' names ends in ".bin", 1 and one line
 * in msg naming the first, for a notice before training; else 0. */
int data_bytes_note(const DataSet *ds, char *msg, size_t msglen);

/* Unmaps, closes and frees everything; ds is all zero afterwards. */
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
