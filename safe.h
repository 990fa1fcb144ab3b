/* safe.h: the one place for sizes, limits and paths (what a parser of
 * downloaded files needs: DESIGN.md, "Errors").
 *
 * Every dimension read from a file or a flag is bounded here to what the
 * program can run, and every size derived from them is computed in checked
 * 64-bit arithmetic: a product that would wrap is an error, never a small
 * number. Every file the program reads is opened here (regular files read
 * whole; pipes and FIFOs read as streams or refused; directories and
 * devices refused), and every file it writes is checked here before any
 * work starts and written here: a temporary name that is never the target,
 * fsync, one rename. Errors are one line in err (the caller prints it and
 * exits 2); nothing is written on an error.
 *
 * Used by data.c (token and tokenizer files), ckpt.c (model files), main.c
 * (flags, output paths) and the sharded checkpoints (their shards and
 * manifest).
 */
#ifndef SAFE_H
#define SAFE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* What the program can run: each dimension from a file or a flag must lie
 * in [1, SAFE_MAX_x]. */
#define SAFE_MAX_LAYERS 1024
#define SAFE_MAX_HEADS 1024
#define SAFE_MAX_DIM 65536
#define SAFE_MAX_SEQ 1048576
#define SAFE_MAX_VOCAB 16777216       /* real and padded */
#define SAFE_MAX_RANKS 65536
/* Tokens: of one micro-batch (B x T rows of the activations), and of a
 * step (B x T x micro-batches x dp): both are ints in the program. */
#define SAFE_MAX_ROWS (1 << 24)
#define SAFE_MAX_STEP_TOKENS 0x7fffffff

/* Exit statuses: 0 done, 1 a failure, 2 bad input (a flag, a file, a layout). */
#define EXIT_USAGE 2

/* Bad input the user can fix, found by the program itself (not a parser
 * that returns err): one line on stderr, "train: " and the message, and
 * exit EXIT_USAGE. */
__attribute__((noreturn, format(printf, 1, 2)))
void safe_die_usage(const char *fmt, ...);

/* A parser's error: the message into err (when err is not NULL) as one
 * line, and -1, for `return safe_fail(err, errlen, "...", ...)`. */
__attribute__((format(printf, 3, 4)))
int safe_fail(char *err, size_t errlen, const char *fmt, ...);

/* *out = a * b (or a + b); 0, or -1 when it does not fit in size_t. */
int safe_mul(size_t a, size_t b, size_t *out);
int safe_add(size_t a, size_t b, size_t *out);
/* Product of n factors, checked; -1 on overflow. */
int safe_mul_n(size_t *out, int n, ...);

/* Whether v lies in [lo, hi]; if not, err gets "<what> <v> is outside
 * lo..hi" and -1 is returned. */
int safe_range(const char *what, long long v, long long lo, long long hi, char *err, size_t errlen);

/* malloc that names what failed: exits 1 with "error: out of memory
 * allocating <what> (<bytes> bytes)" (a genuine out-of-memory at run time);
 * bytes 0 allocates 1. */
void *safe_malloc(size_t bytes, const char *what);
/* realloc that names what failed, as safe_malloc does: p grown (or made)
 * to bytes, its contents kept. */
void *safe_realloc(void *p, size_t bytes, const char *what);
/* calloc that names what failed: n zeroed elements of `size` bytes; exits 1
 * like safe_malloc when memory runs out or n x size does not fit in size_t;
 * a count or size of 0 allocates 1 byte. The one checked allocator of
 * tables sized at run time (gpt.c's unit tables, pp.c's activation sets). */
void *safe_calloc(size_t n, size_t size, const char *what);

/* Reads the whole of path into a malloc'd buffer (*len bytes, followed by
 * one 0 byte). A regular file is read by its size (checked against the
 * bytes actually read); a pipe, FIFO or /dev/stdin is read as a stream up
 * to max_bytes; a directory, device or socket is refused. 0, or -1 with err
 * naming the path and the problem (missing, not a regular file, larger than
 * max_bytes, read error). */
int safe_read_file(const char *path, size_t max_bytes, unsigned char **data, size_t *len, char *err,
                   size_t errlen);
/* safe_read_file with the error worded for a kind of input (what: "data",
 * "eval", "tokenizer"): "cannot open <what> file PATH" when it is missing,
 * else "cannot read <what> file PATH: <why>". 0, or -1 with err. */
int safe_read_named(const char *path, const char *what, size_t max_bytes, unsigned char **data, size_t *len,
                    char *err, size_t errlen);

/* Checks, before any work, that path can be written later: its name fits
 * (PATH_MAX, NAME_MAX with room for the temporary suffix), it is not a
 * directory, its directory exists and is writable. 0, or -1 with err naming
 * the flag and the path. */
int safe_check_output(const char *flag, const char *path, char *err, size_t errlen);

/* An output being written: data goes to a temporary file beside the target
 * (never equal to it), and safe_out_commit fsyncs it, renames it over the
 * target and fsyncs the directory; safe_out_abort removes it. A stale
 * temporary of a killed run is never read, only replaced. */
typedef struct SafeOut {
    FILE *f;
    char *path;     /* the target */
    char *tmp;      /* path + ".tmp.<pid>" */
} SafeOut;
/* Opens the temporary beside path for writing into o->f. 0, or -1 with err
 * (nothing created). */
int safe_out_open(SafeOut *o, const char *path, char *err, size_t errlen);
/* Flushes, fsyncs and renames the temporary over the target, fsyncs its
 * directory and frees o. 0, or -1 with err: the temporary removed and the
 * target as it was, unless only the directory's fsync failed (the target is
 * then already replaced). */
int safe_out_commit(SafeOut *o, char *err, size_t errlen);
/* Closes and removes the temporary and frees o; the target is untouched. */
void safe_out_abort(SafeOut *o);

#endif
