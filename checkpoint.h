/* checkpoint.h: sharded checkpoints that survive a crash and a change of
 * layout (see checkpoint.c for the design and the format on disk). */
#ifndef CHECKPOINT_H
#define CHECKPOINT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include "gpt.h"
#include "zero.h"
#include "optim.h"
#include "data.h"
#include "layout.h"

#define CHECKPOINT_VERSION 2   /* 2: the learning-rate schedule, AdamW settings, data position and shards */

/* Everything of a checkpoint but the tensors: the manifest's header. */
typedef struct CheckpointMeta {
    GPTConfig cfg;
    long step;           /* optimizer steps done; the next step is `step` (0-based) */
    int adam_t;          /* Adam's step count (its bias corrections) */
    uint64_t seed;       /* --seed: the only RNG (init, --shuffle, sampling) */
    int shuffle;         /* the data order is a function of (step, seed, shuffle) */
    int steps;           /* --steps of the run that wrote it: the cosine's length */
    OptConfig opt;       /* the schedule and AdamW's settings it ran under */
    DataPos pos;         /* where the next step's first sequence lies (epoch, shard, sequence) */
    char *data_shards;   /* data_describe's shard list (names and sizes); NULL: none */
    /* The layout it was written under (to say what a resume changes; loading
     * works under any layout). Read back from a manifest, stage_layers holds
     * each stage's layers [pp] with virtual_chunks 1 (the manifest keeps a
     * stage's total, not its chunks). Its ranks are dp x tp x pp. */
    Layout layout;
} CheckpointMeta;

typedef struct CheckpointShard {
    int rank;
    char file[64];       /* name inside the step directory */
    size_t elements;     /* K: the shard holds master[K], m[K], v[K] */
} CheckpointShard;

/* Elements [global, global + n) of llm.c's order sit at elements
 * [elem, elem + n) of each section of shard `shard`. */
typedef struct CheckpointRange {
    size_t global, n, elem;
    int shard;
} CheckpointRange;

/* A complete checkpoint, as its manifest describes it. */
typedef struct Checkpoint {
    char dir[4096];                /* DIR/step-<N> */
    CheckpointMeta meta;
    int nshards;
    CheckpointShard *shards;       /* [nshards] */
    size_t nranges;
    CheckpointRange *ranges;       /* [nranges] sorted by global, covering the model once */
    char damaged[1024];            /* "" or one line: the newer checkpoint passed over, and why */
} Checkpoint;

/* Opens the newest complete checkpoint of dir that passes every check: the
 * one dir/latest names, or, when that one fails (missing, its manifest, a
 * shard's size or header, a block's checksum, a non-finite value), the
 * newest step-<N> directory that passes, with ck->damaged naming the one
 * passed over and why. The checks: the manifest (version, model, layout,
 * every count and range against the model and its shard, the ranges
 * covering the model exactly once), and every shard read whole once (size,
 * header, each block's hash, every value finite). Returns 0, or -1 with
 * one line in err (latest's problem) when no checkpoint passes. */
int checkpoint_open(const char *dir, Checkpoint *ck, char *err, size_t errlen);
void checkpoint_free(Checkpoint *ck);

/* Fills what this rank owns under its own layout (z: master parameters,
 * Adam m, v and t) from ck, reading only the blocks of the shards that
 * hold them, then brings every rank's parameters up to date. Collective
 * over world. Returns 0, or -1 with err (on the rank that failed; the
 * others get "another rank failed"). */
int checkpoint_load(const Checkpoint *ck, Zero *z, CommGroup *world, char *err, size_t errlen);

/* Writes DIR/step-<meta->step>: every rank its shard of what it owns, at
 * once; then rank 0 the manifest, one rename, DIR/latest, and deletes all
 * but the newest `keep` checkpoints. Collective over world. On rank 0 path
 * gets the directory written. Returns 0, or -1 with err. */
int checkpoint_save(const char *dir, const CheckpointMeta *meta, int keep, Zero *z, CommGroup *world,
                    char *path, size_t pathlen, char *err, size_t errlen);

/* A checkpoint written in the background (--checkpoint-async). */
typedef struct CheckpointAsync {
    int active;              /* begun and not yet published */
    pthread_t thread;        /* the writer: this rank's shard from the snapshot */
    int joined;
    atomic_int done;         /* the writer has finished ... */
    int ok;                  /* ... and wrote the shard (else err) */
    float *snap;             /* [3K] what this rank owns at the step: master, m, v (kept for the next save) */
    size_t snap_cap;         /* floats snap holds */
    size_t K;
    CheckpointMeta meta;
    int keep, rank;
    char dir[4096], err[512];
} CheckpointAsync;

/* checkpoint_save, its writing moved off the training thread: the
 * directory and this rank's ranges now, a host snapshot of what it owns
 * (so training may change it at once), and a thread that writes the shard
 * file from the snapshot. Uses no communicator after it returns. Collective
 * over world. Returns 0, or -1 with err. */
int checkpoint_save_begin(CheckpointAsync *a, const char *dir, const CheckpointMeta *meta, int keep, Zero *z,
                          CommGroup *world, char *path, size_t pathlen, char *err, size_t errlen);
/* Once a step (every rank at the same step): a sum over world of the shards
 * not yet written; when none are left, rank 0 publishes as checkpoint_save
 * does. wait: join this rank's writer first (before a stop or another save).
 * Collective. Returns 1 when published, 0 when still in flight (or none),
 * -1 with err when a shard failed. */
int checkpoint_save_poll(CheckpointAsync *a, CommGroup *world, int wait, char *err, size_t errlen);
/* Frees the snapshot (after joining a writer still running). */
void checkpoint_async_free(CheckpointAsync *a);

/* The name DIR/latest points at, or -1 when there is none. */
int checkpoint_latest(const char *dir, char *name, size_t namelen);

/* Whether dir holds any step-<N> directory (complete or not named by latest). */
int checkpoint_any_step(const char *dir);

/* Whether dir holds a checkpoint of some run: a latest file or a step-<N>
 * directory (a run without --resume is refused such a directory). */
int checkpoint_dir_used(const char *dir);

#endif
