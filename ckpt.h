/* ckpt.h: llm.c model files (float32, version 3), read and written whole. */
#ifndef CKPT_H
#define CKPT_H

#include <stdint.h>
#include "gpt.h"

/* Reads the header of an llm.c model file into cfg and checks that the file
 * holds exactly the parameters the header promises, every one finite.
 * Returns 0, or -1 with one line in err (missing, foreign, bf16, truncated,
 * a NaN or Inf: naming the tensor, layer and element). */
int ckpt_read_config(const char *path, GPTConfig *cfg, char *err, size_t errlen);

/* Checks a model file's 256-int32 header (magic, version, every dimension
 * within safe.h's limits) into cfg and the file's size it promises into
 * *file_bytes (checked arithmetic). 0, or -1 with err. No I/O: the fuzz target. */
int ckpt_parse_header(const int32_t h[256], GPTConfig *cfg, size_t *file_bytes, char *err, size_t errlen);

/* Loads this stage's share of the parameters (m built from the file's config).
 * Returns 0 or -1 with err (as ckpt_read_config's, a non-finite value included). */
int ckpt_load(const char *path, GPT *m, char *err, size_t errlen);

/* Writes a model file of cfg from llmc [gpt_total_params] (llm.c's order,
 * host memory) through safe.h's SafeOut (path.tmp.<pid>, fsync, rename), so
 * a crash keeps the last file. Returns 0 or -1 with err. */
int ckpt_write(const char *path, const GPTConfig *cfg, const float *llmc, char *err, size_t errlen);

/* ckpt_write of a model held whole by one rank. */
int ckpt_save(const char *path, GPT *m, char *err, size_t errlen);

#endif
