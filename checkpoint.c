/* checkpoint.c: sharded checkpoints: save, exact resume, resume on another
 * layout. ckpt.c stays the reader and writer of llm.c model files; this
 * module keeps a run, not a model. No article section draws it; it saves
 * what 2.3 FSDP (auto-parallel-partitioning.txt: ZeRO) spreads over the
 * ranks and what 4 混合并行's layouts split, and reads it back under any
 * other layout.
 *
 * What a checkpoint is. A directory DIR/step-<N>/ holding
 *
 *   manifest.txt        text: format version, the model, the layout it was
 *                       written under (ranks, dp, tp, pp, stage layers, zero,
 *                       offload, sp, dp mode, dtype, schedule, batch), the step,
 *                       the data position and RNG, Adam's t, and for each
 *                       shard which rank wrote it and which ranges of the
 *                       global parameter order it holds;
 *   shard-<rank>.bin    one a rank: exactly what that rank owns.
 *
 * DIR/latest holds the name of the newest complete one ("step-<N>").
 *
 * The global order is llm.c's (gpt_total_params elements, tensor-major), the
 * order of --save's model files: the one coordinate system every layout
 * shares. A rank's local layout (gpt.h: layer-major, a stage's layers, a tp
 * slice of each tensor) maps onto it by runs (local, global, n): gpt.h's
 * gpt_shard_index and gpt_llmc_offset, the map gpt_llmc_copy applies
 * element by element; ZeRO's ownership (zero.h:
 * bucket b owns [off + own_off, + own_n), its state at state_off) cuts those
 * runs into the pieces this rank owns. A shard holds, for its pieces in the
 * order of the owned state, three sections of K float32 each: the master
 * parameters (host_master under offload, param_shard under ZeRO-3, else
 * m->params), Adam's m and Adam's v. An element held by several ranks is
 * written once: a tensor every tp rank holds whole only by tp rank 0, the
 * tied wte only by the first stage (gpt_tensor_counts), and under DDP (zero 0, every dp rank
 * owns everything) only by dp rank 0. So the shards of a checkpoint add up
 * to 12 bytes a parameter, whatever the layout: the ZeRO paper's float32
 * optimizer state (K) plus the master weights (4), spread over the ranks
 * exactly as `--zero 1` spreads them in memory.
 *
 * A shard file: a 64-byte header (magic "TRAINSHD", version, rank, K, step,
 * the model's parameter count, block size, block count, a hash of the
 * header), the 3K floats, then one 64-bit hash a 1 MiB block of them. A
 * reader checks the size, the header and the hash of every block it reads:
 * a truncated, foreign, or flipped file is an error naming the file, never
 * a silently wrong resume.
 *
 * Saving: every rank copies what it owns down (device to host) in bounded
 * pieces and writes its shard at once, into DIR/.step-<N>.tmp/, through
 * safe.h's SafeOut (fsync, rename); nobody gathers the model or the
 * optimizer, so a ZeRO-3 rank needs 4 MB of staging beyond what it trains
 * with. A barrier; then rank 0 writes the manifest, renames the directory
 * to step-<N> (one rename publishes it), fsyncs DIR, points DIR/latest at
 * it (SafeOut again), and only then deletes the oldest beyond --keep. A kill
 * at any moment leaves the previous checkpoint named by latest, intact.
 *
 * Loading, under any layout: each rank works out its owned pieces under its
 * own layout, finds them in the manifest's ranges (sorted by global index)
 * and reads those byte ranges, block by block, from whichever shards hold
 * them; then the parameters are brought to every rank the way an optimizer
 * step does (zero_params_sync). Resuming on the same layout is the same
 * code: each rank then reads exactly its own shard.
 *
 * What else makes the next step identical: the data order is a function of
 * the step alone (data.c: sequence j of step s starts at ((s*G + j) mod n) * T,
 * through --shuffle's permutation of the seed), so the data position is the
 * step; the only RNG is the seed (initialisation, the shuffle and sampling
 * derive from it; there is no dropout), the learning rate is a function of
 * the step, and Adam's t is saved. Gradients do not survive a step.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "checkpoint.h"
#include "safe.h"

/* Every path here is DIR plus a short name; DIR is refused above
 * DIR_MAX bytes, so the buffers (PATH_MAX and more) never truncate. */
#pragma GCC diagnostic ignored "-Wformat-truncation"
#define DIR_MAX 3500

#define SHARD_MAGIC "TRAINSHD"
#define HEADER_BYTES 64
#define BLOCK_WORDS ((size_t)1 << 18)       /* a checksum block: 1 MiB of floats */
#define STAGING_FLOATS ((size_t)1 << 20)    /* device <-> host in 4 MB pieces */

/* ---- the map from this rank's layout to llm.c's order --------------------- */

/* Elements [local, local + n) of this rank's layout are [global, global + n)
 * of llm.c's order; written: this rank is the one that saves them. */
typedef struct Run {
    size_t local, global, n;
    int written;
} Run;

typedef struct Runs {
    Run *r;
    size_t n, cap;
} Runs;

static void runs_add(Runs *rs, size_t local, size_t global, size_t n, int written) {
    if (rs->n && rs->r[rs->n - 1].local + rs->r[rs->n - 1].n == local &&
        rs->r[rs->n - 1].global + rs->r[rs->n - 1].n == global && rs->r[rs->n - 1].written == written) {
        rs->r[rs->n - 1].n += n;
        return;
    }
    if (rs->n == rs->cap) {
        rs->cap = rs->cap ? 2 * rs->cap : 256;
        rs->r = realloc(rs->r, rs->cap * sizeof *rs->r);
        if (!rs->r) { fprintf(stderr, "error: out of memory mapping the checkpoint layout\n"); exit(1); }
    }
    rs->r[rs->n++] = (Run){local, global, n, written};
}

static int run_cmp_local(const void *a, const void *b) {
    const Run *x = a, *y = b;
    return x->local < y->local ? -1 : x->local > y->local;
}

/* The runs of m's whole local layout, sorted by local offset. dp_writer:
 * this rank writes what it holds (not a DDP replica). */
static void runs_build(const GPT *m, int dp_writer, Runs *rs) {
    memset(rs, 0, sizeof *rs);
    for (int i = 0; i < GPT_NTENSORS; i++) {
        if (!m->sizes[i]) continue;
        int written = dp_writer && gpt_tensor_counts(m, i), layered = gpt_tensor_per_layer(i);
        int nl = layered ? m->nlayers : 1;
        size_t n = m->sizes[i] / (size_t)nl;
        for (int l = 0; l < nl; l++) {
            size_t local = m->offsets[i] + (layered ? (size_t)l * m->layer_stride : 0);
            size_t gbase = gpt_llmc_offset(&m->cfg, i, layered ? gpt_layer_global(m, l) : 0);
            for (size_t k = 0, len; k < n; k += len) {
                size_t g = gpt_shard_index(m, i, k, &len);
                if (len > n - k) len = n - k;
                runs_add(rs, local + k, gbase + g, len, written);
            }
        }
    }
    qsort(rs->r, rs->n, sizeof *rs->r, run_cmp_local);
}

/* A piece this rank owns: local [local, +n) = global [global, +n), its
 * optimizer state at [state, +n). */
typedef struct Piece {
    size_t local, global, n, state;
    int written;
} Piece;

typedef void (*PieceFn)(void *ctx, const Piece *p);

/* Calls fn for each owned piece, in the order of the owned state. */
static void owned_pieces(const Zero *z, const Runs *rs, PieceFn fn, void *ctx) {
    for (int bi = 0; bi < z->nbuckets; bi++) {
        const ZeroBucket *b = &z->buckets[bi];
        if (!b->own_n) continue;
        size_t lo = b->off + b->own_off, hi = lo + b->own_n;
        size_t a = 0, c = rs->n;   /* the first run ending after lo */
        while (a < c) {
            size_t mid = (a + c) / 2;
            if (rs->r[mid].local + rs->r[mid].n <= lo) a = mid + 1;
            else c = mid;
        }
        for (size_t k = a; k < rs->n && rs->r[k].local < hi; k++) {
            const Run *r = &rs->r[k];
            size_t s = r->local > lo ? r->local : lo, e = r->local + r->n < hi ? r->local + r->n : hi;
            Piece p = {s, r->global + (s - r->local), e - s, b->state_off + (s - lo), r->written};
            fn(ctx, &p);
        }
    }
}

/* ---- hashes ---------------------------------------------------------------- */

/* FNV-1a over 32-bit words: fast enough to hash every byte written. */
static uint64_t hash_words(uint64_t h, const uint32_t *w, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ w[i]) * 0x100000001b3ULL;
    return h;
}
#define HASH_SEED 0xcbf29ce484222325ULL

static void header_pack(unsigned char *h, int rank, size_t K, long step, size_t total, size_t nblocks) {
    memset(h, 0, HEADER_BYTES);
    memcpy(h, SHARD_MAGIC, 8);
    uint32_t u32; uint64_t u64;
    u32 = CHECKPOINT_VERSION; memcpy(h + 8, &u32, 4);
    u32 = (uint32_t)rank; memcpy(h + 12, &u32, 4);
    u64 = K; memcpy(h + 16, &u64, 8);
    u64 = (uint64_t)step; memcpy(h + 24, &u64, 8);
    u64 = total; memcpy(h + 32, &u64, 8);
    u32 = (uint32_t)BLOCK_WORDS; memcpy(h + 40, &u32, 4);
    u32 = (uint32_t)nblocks; memcpy(h + 44, &u32, 4);
    u64 = hash_words(HASH_SEED, (const uint32_t *)h, 56 / 4); memcpy(h + 56, &u64, 8);
}

static size_t nblocks_of(size_t K) { return (3 * K + BLOCK_WORDS - 1) / BLOCK_WORDS; }
static size_t shard_bytes(size_t K) { return HEADER_BYTES + 12 * K + 8 * nblocks_of(K); }

/* ---- saving ------------------------------------------------------------------ */

typedef struct Writer {
    Zero *z;
    FILE *f;
    int section;              /* 0 master, 1 m, 2 v */
    float *stage;             /* [STAGING_FLOATS] host */
    uint64_t *sums;           /* [nblocks] */
    uint64_t h;               /* the current block's hash */
    size_t in_block, block;   /* words in it, its index */
    size_t K;                 /* written elements counted (first pass) */
    FILE *ranges;             /* "range global n elem" lines */
    int ok;
} Writer;

static void count_piece(void *ctx, const Piece *p) {
    Writer *w = ctx;
    if (!p->written) return;
    if (w->ranges) fprintf(w->ranges, "range %zu %zu %zu\n", p->global, p->n, w->K);
    w->K += p->n;
}

static void write_words(Writer *w, const float *x, size_t n) {
    const uint32_t *u = (const uint32_t *)x;
    while (n) {
        size_t k = BLOCK_WORDS - w->in_block < n ? BLOCK_WORDS - w->in_block : n;
        w->h = hash_words(w->h, u, k);
        w->in_block += k;
        if (w->in_block == BLOCK_WORDS) {
            w->sums[w->block++] = w->h;
            w->h = HASH_SEED;
            w->in_block = 0;
        }
        u += k;
        n -= k;
    }
    if (fwrite(x, 4, (size_t)(u - (const uint32_t *)x), w->f) != (size_t)(u - (const uint32_t *)x)) w->ok = 0;
}

/* Where this piece's section lives: the device (or host) buffer and its Dev. */
static float *section_src(Zero *z, int section, const Piece *p, Dev **dev) {
    if (section == 1) { *dev = z->adam.dev; return z->adam.m + p->state; }
    if (section == 2) { *dev = z->adam.dev; return z->adam.v + p->state; }
    if (z->host_master) { *dev = &z->host; return z->host_master + p->state; }
    *dev = z->dev;
    return z->param_shard ? z->param_shard + p->state : z->m->params + p->local;
}

static void write_piece(void *ctx, const Piece *p) {
    Writer *w = ctx;
    if (!p->written || !w->ok) return;
    Dev *dev;
    float *src = section_src(w->z, w->section, p, &dev);
    for (size_t k = 0; k < p->n; k += STAGING_FLOATS) {
        size_t n = p->n - k < STAGING_FLOATS ? p->n - k : STAGING_FLOATS;
        dev_to_host(dev, w->stage, src + k, n * sizeof(float));
        write_words(w, w->stage, n);
    }
}

static int remove_tree(const char *path) {
    DIR *d = opendir(path);
    if (!d) return errno == ENOENT ? 0 : -1;
    struct dirent *e;
    char p[4608];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", path, e->d_name);
        unlink(p);
    }
    closedir(d);
    return rmdir(path);
}

static void sync_dir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) { fsync(fd); close(fd); }
}

/* This rank's shard and its ranges (a side file rank 0 folds into the manifest). */
/* This rank's DIR/.step-<N>.tmp/shard-<rank>.ranges ("range global n elem"
 * lines, for the manifest) from its runs; *K gets the elements it writes. */
static int write_ranges(const char *tmpdir, int rank, Zero *z, const Runs *rs, size_t *K, char *err,
                        size_t errlen) {
    char rpath[4608];
    snprintf(rpath, sizeof rpath, "%s/shard-%05d.ranges", tmpdir, rank);
    Writer w = {.z = z, .ok = 1};
    SafeOut ro;
    if (safe_out_open(&ro, rpath, err, errlen) != 0) return -1;
    w.ranges = ro.f;
    owned_pieces(z, rs, count_piece, &w);
    fprintf(ro.f, "end\n");
    *K = w.K;
    return safe_out_commit(&ro, err, errlen);
}

/* The shard file: header, the 3K floats (from z piece by piece through a
 * staging buffer, or from snap [3K] when given), the block hashes. */
static int write_shard_file(const char *tmpdir, int rank, const CheckpointMeta *meta, Zero *z, const Runs *rs,
                            size_t K, const float *snap, char *err, size_t errlen) {
    char path[4608];
    snprintf(path, sizeof path, "%s/shard-%05d.bin", tmpdir, rank);
    size_t nb = nblocks_of(K);
    unsigned char h[HEADER_BYTES];
    header_pack(h, rank, K, meta->step, gpt_total_params(&meta->cfg), nb);
    SafeOut so;
    if (safe_out_open(&so, path, err, errlen) != 0) return -1;
    Writer w = {.z = z, .f = so.f, .ok = 1, .h = HASH_SEED};
    w.sums = safe_malloc((nb + 1) * sizeof(uint64_t), "checkpoint block hashes");
    if (fwrite(h, 1, HEADER_BYTES, w.f) != HEADER_BYTES) w.ok = 0;
    if (snap) {
        write_words(&w, snap, 3 * K);
    } else {
        w.stage = safe_malloc(STAGING_FLOATS * sizeof(float), "checkpoint staging");
        for (w.section = 0; w.section < 3; w.section++) owned_pieces(z, rs, write_piece, &w);
        free(w.stage);
    }
    if (w.in_block) w.sums[w.block++] = w.h;
    if (fwrite(w.sums, 8, nb, w.f) != nb) w.ok = 0;
    free(w.sums);
    if (!w.ok) {
        snprintf(err, errlen, "failed writing %s: %s", path, strerror(errno ? errno : EIO));
        safe_out_abort(&so);
        return -1;
    }
    return safe_out_commit(&so, err, errlen);
}

static int write_shard(const char *tmpdir, int rank, const CheckpointMeta *meta, Zero *z,
                       char *err, size_t errlen) {
    Runs rs;
    size_t K;
    runs_build(z->m, z->owners != ZERO_ALL || z->rank == 0, &rs);
    int rc = write_ranges(tmpdir, rank, z, &rs, &K, err, errlen);
    if (rc == 0) rc = write_shard_file(tmpdir, rank, meta, z, &rs, K, NULL, err, errlen);
    free(rs.r);
    return rc;
}

static void layout_print(FILE *f, const Layout *l) {
    fprintf(f, "layout ranks %d dp %d tp %d pp %d zero %d offload %d sp %d dp_mode %s dtype %s "
            "schedule %s batch %d seq %d micro_batches %d\n", l->dp * l->tp * l->pp, l->dp, l->tp, l->pp, l->zero,
            l->offload, l->sp, l->dp_mode == DP_PS ? "ps" : "ddp", dt_name(l->dtype), pp_schedule_name(l->schedule),
            l->batch, l->seq, l->micro_batches);
    fprintf(f, "stage_layers");
    for (int i = 0; i < l->pp; i++) fprintf(f, " %d", l->stage_layers[i]);
    fprintf(f, "\n");
}

/* Rank 0: the manifest from every rank's ranges. */
static int write_manifest(const char *tmpdir, const CheckpointMeta *meta, int ranks, char *err, size_t errlen) {
    char path[4608];
    snprintf(path, sizeof path, "%s/manifest.txt", tmpdir);
    SafeOut o;
    if (safe_out_open(&o, path, err, errlen) != 0) return -1;
    FILE *f = o.f;
    const GPTConfig *c = &meta->cfg;
    fprintf(f, "train checkpoint %d\n", CHECKPOINT_VERSION);
    fprintf(f, "step %ld\n", meta->step);
    fprintf(f, "model layers %d heads %d dim %d max_seq %d vocab %d padded_vocab %d params %zu\n",
            c->layers, c->heads, c->dim, c->max_seq, c->vocab, c->padded_vocab, gpt_total_params(c));
    layout_print(f, &meta->layout);
    fprintf(f, "data_position epoch %ld shard %d sequence %zu\n", meta->pos.epoch, meta->pos.shard, meta->pos.seq);
    if (meta->data_shards) fputs(meta->data_shards, f);
    fprintf(f, "data next_step %ld seed %llu shuffle %d\n", meta->step, (unsigned long long)meta->seed,
            meta->shuffle);
    fprintf(f, "optimizer adam_t %d steps %d\n", meta->adam_t, meta->steps);
    const OptConfig *oc = &meta->opt;
    fprintf(f, "schedule steps %d warmup %d lr %.9g lr_min %.9g cosine %d beta1 %.9g beta2 %.9g eps %.9g wd %.9g "
            "clip %.9g\n", oc->steps, oc->warmup, oc->lr, oc->lr_min, oc->cosine, oc->beta1, oc->beta2, oc->eps,
            oc->wd, oc->clip);
    fprintf(f, "shards %d\n", ranks);
    for (int r = 0; r < ranks; r++) {
        char rp[4608], line[256];
        snprintf(rp, sizeof rp, "%s/shard-%05d.ranges", tmpdir, r);
        FILE *in = fopen(rp, "r");
        if (!in) { snprintf(err, errlen, "cannot read %s", rp); safe_out_abort(&o); return -1; }
        size_t K = 0, nr = 0, g, n, e;
        while (fgets(line, sizeof line, in))
            if (sscanf(line, "range %zu %zu %zu", &g, &n, &e) == 3) { K += n; nr++; }
        fprintf(f, "shard %d rank %d file shard-%05d.bin elements %zu ranges %zu\n", r, r, r, K, nr);
        rewind(in);
        while (fgets(line, sizeof line, in))
            if (!strncmp(line, "range ", 6)) fputs(line, f);
        fclose(in);
        unlink(rp);
    }
    fprintf(f, "end\n");
    return safe_out_commit(&o, err, errlen);
}

static int step_of(const char *name, long *step) {
    char *end;
    if (strncmp(name, "step-", 5)) return -1;
    *step = strtol(name + 5, &end, 10);
    return *end || end == name + 5 ? -1 : 0;
}

static int long_cmp_desc(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return x > y ? -1 : x < y;
}

/* Deletes all but the newest `keep` step directories (never `current`),
 * and what killed saves left (.step-<N>.tmp). */
static void prune(const char *dir, int keep, long current) {
    DIR *d = opendir(dir);
    if (!d) return;
    long steps[4096];
    int n = 0;
    struct dirent *e;
    char p[4608];
    while ((e = readdir(d)) && n < 4096) {
        long s;
        size_t len = strlen(e->d_name);
        if (step_of(e->d_name, &s) == 0) steps[n++] = s;
        else if (!strncmp(e->d_name, ".step-", 6) && len > 4 && !strcmp(e->d_name + len - 4, ".tmp")) {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            remove_tree(p);
        }
    }
    closedir(d);
    qsort(steps, (size_t)n, sizeof *steps, long_cmp_desc);
    for (int i = keep; i < n; i++) {
        if (steps[i] == current) continue;
        snprintf(p, sizeof p, "%s/step-%ld", dir, steps[i]);
        remove_tree(p);
    }
}

int checkpoint_latest(const char *dir, char *name, size_t namelen) {
    char p[4608];
    snprintf(p, sizeof p, "%s/latest", dir);
    FILE *f = fopen(p, "r");
    if (!f) return -1;
    int ok = fgets(name, (int)namelen, f) != NULL;
    fclose(f);
    if (!ok) return -1;
    name[strcspn(name, "\r\n")] = 0;
    return 0;
}

/* Sums a flag over the world: whether any rank failed. */
static int any_failed(CommGroup *world, int failed) {
    if (world->size <= 1) return failed;
    int32_t f = failed ? 1 : 0;
    comm_all_reduce(world, NULL, &f, 1, COMM_I32, COMM_SUM);
    return f != 0;
}

/* After every shard of DIR/.step-<N>.tmp is written: rank 0 writes the
 * manifest, renames the directory to step-<N> (one rename publishes it),
 * points DIR/latest at it and prunes beyond keep; no rank returns before
 * that is done (so a job whose tasks exit together never cuts it short).
 * Collective over world. Returns 0, or -1 with err. */
static int publish(const char *dir, const CheckpointMeta *meta, int keep, CommGroup *world, char *err,
                   size_t errlen) {
    int rank = world->size > 1 ? world->index : 0, ranks = world->size > 1 ? world->size : 1, failed = 0;
    char tmpdir[4608], final[4608];
    snprintf(tmpdir, sizeof tmpdir, "%s/.step-%ld.tmp", dir, meta->step);
    snprintf(final, sizeof final, "%s/step-%ld", dir, meta->step);
    if (rank == 0) {
        failed = write_manifest(tmpdir, meta, ranks, err, errlen) != 0;
        if (!failed) {
            sync_dir(tmpdir);
            remove_tree(final);   /* an older run's (latest names the new one only after) */
            if (rename(tmpdir, final) != 0) {
                snprintf(err, errlen, "cannot rename %s to %s: %s", tmpdir, final, strerror(errno));
                failed = 1;
            }
        }
        if (!failed) {
            sync_dir(dir);
            char lp[4608];
            SafeOut o;
            snprintf(lp, sizeof lp, "%s/latest", dir);
            failed = safe_out_open(&o, lp, err, errlen) != 0;
            if (!failed) {
                fprintf(o.f, "step-%ld\n", meta->step);
                failed = safe_out_commit(&o, err, errlen) != 0;
            }
        }
        if (!failed) prune(dir, keep, meta->step);
    }
    if (any_failed(world, failed)) {
        if (!failed) snprintf(err, errlen, "checkpoint %s: rank 0 failed publishing it", final);
        return -1;
    }
    return 0;
}

/* Makes DIR/.step-<N>.tmp on rank 0 (clearing a killed save's leftovers).
 * Collective. Returns 0, or -1 with err on every rank. */
static int make_tmpdir(const char *dir, long step, CommGroup *world, char *err, size_t errlen) {
    int rank = world->size > 1 ? world->index : 0, failed = 0;
    if (strlen(dir) > DIR_MAX) { snprintf(err, errlen, "--checkpoint-dir: path longer than %d bytes", DIR_MAX); return -1; }
    char tmpdir[4608];
    snprintf(tmpdir, sizeof tmpdir, "%s/.step-%ld.tmp", dir, step);
    if (rank == 0) {
        mkdir(dir, 0777);
        remove_tree(tmpdir);
        if (mkdir(tmpdir, 0777) != 0) {
            snprintf(err, errlen, "--checkpoint-dir %s: cannot create %s: %s", dir, tmpdir, strerror(errno));
            failed = 1;
        }
    }
    if (any_failed(world, failed)) {
        if (!failed) snprintf(err, errlen, "checkpoint %s/step-%ld: rank 0 failed", dir, step);
        return -1;
    }
    return 0;
}

int checkpoint_save(const char *dir, const CheckpointMeta *meta, int keep, Zero *z, CommGroup *world,
                    char *path, size_t pathlen, char *err, size_t errlen) {
    int rank = world->size > 1 ? world->index : 0, failed;
    char tmpdir[4608], final[4608];
    snprintf(tmpdir, sizeof tmpdir, "%s/.step-%ld.tmp", dir, meta->step);
    snprintf(final, sizeof final, "%s/step-%ld", dir, meta->step);
    snprintf(path, pathlen, "%s", final);
    if (make_tmpdir(dir, meta->step, world, err, errlen) != 0) return -1;
    failed = write_shard(tmpdir, rank, meta, z, err, errlen) != 0;
    if (any_failed(world, failed)) {
        if (!failed) snprintf(err, errlen, "checkpoint %s: another rank failed writing its shard", final);
        return -1;
    }
    return publish(dir, meta, keep, world, err, errlen);
}

/* ---- saving in the background (--checkpoint-async) ------------------------ */

/* A copy of one section of a piece into the snapshot (device to host). */
typedef struct Snap {
    Zero *z;
    float *x;            /* [3K]: master, m, v */
    size_t K, at;
    int section;
} Snap;

static void snap_piece(void *ctx, const Piece *p) {
    Snap *s = ctx;
    if (!p->written) return;
    Dev *dev;
    float *src = section_src(s->z, s->section, p, &dev);
    dev_to_host(dev, s->x + (size_t)s->section * s->K + s->at, src, p->n * sizeof(float));
    s->at += p->n;
}

static void *async_writer(void *arg) {
    CheckpointAsync *a = arg;
    char tmpdir[4608];
    snprintf(tmpdir, sizeof tmpdir, "%s/.step-%ld.tmp", a->dir, a->meta.step);
    a->ok = write_shard_file(tmpdir, a->rank, &a->meta, NULL, NULL, a->K, a->snap, a->err, sizeof a->err) == 0;
    atomic_store(&a->done, 1);
    return NULL;
}

int checkpoint_save_begin(CheckpointAsync *a, const char *dir, const CheckpointMeta *meta, int keep, Zero *z,
                          CommGroup *world, char *path, size_t pathlen, char *err, size_t errlen) {
    float *snap = a->snap;   /* kept from the last save: its pages are already there */
    size_t cap = a->snap_cap;
    memset(a, 0, sizeof *a);
    a->snap = snap;
    a->snap_cap = cap;
    a->rank = world->size > 1 ? world->index : 0;
    a->meta = *meta;
    a->keep = keep;
    snprintf(a->dir, sizeof a->dir, "%s", dir);
    snprintf(path, pathlen, "%s/step-%ld", dir, meta->step);
    if (make_tmpdir(dir, meta->step, world, err, errlen) != 0) return -1;
    char tmpdir[4608];
    snprintf(tmpdir, sizeof tmpdir, "%s/.step-%ld.tmp", dir, meta->step);
    Runs rs;
    runs_build(z->m, z->owners != ZERO_ALL || z->rank == 0, &rs);
    int failed = write_ranges(tmpdir, a->rank, z, &rs, &a->K, err, errlen) != 0;
    if (!failed) {   /* the snapshot: what this rank owns, as it is after this step */
        Snap s = {.z = z, .K = a->K};
        if (a->snap_cap < 3 * a->K + 1) {
            free(a->snap);
            a->snap_cap = 3 * a->K + 1;
            a->snap = safe_malloc(a->snap_cap * sizeof(float), "the checkpoint's snapshot");
        }
        s.x = a->snap;
        for (s.section = 0; s.section < 3; s.section++, s.at = 0) owned_pieces(z, &rs, snap_piece, &s);
    }
    free(rs.r);
    if (any_failed(world, failed)) {
        if (!failed) snprintf(err, errlen, "checkpoint %s: another rank failed", path);
        return -1;
    }
    atomic_store(&a->done, 0);
    if (pthread_create(&a->thread, NULL, async_writer, a) != 0) {   /* no thread: write it here */
        async_writer(a);
        a->joined = 1;
    }
    a->active = 1;
    return 0;
}

int checkpoint_save_poll(CheckpointAsync *a, CommGroup *world, int wait, char *err, size_t errlen) {
    if (!a->active) return 0;
    if (wait && !a->joined) { pthread_join(a->thread, NULL); a->joined = 1; }
    int32_t state[2] = {atomic_load(&a->done) ? 0 : 1, 0};   /* [shards not yet written, shards failed] */
    if (state[0] == 0 && !a->ok) state[1] = 1;
    if (world->size > 1) comm_all_reduce(world, NULL, state, 2, COMM_I32, COMM_SUM);
    if (state[0] > 0) return 0;   /* every rank agrees: not yet */
    if (!a->joined) { pthread_join(a->thread, NULL); a->joined = 1; }
    a->active = 0;
    if (state[1] > 0) {
        if (a->ok) snprintf(err, errlen, "checkpoint %s/step-%ld: another rank failed writing its shard", a->dir,
                            a->meta.step);
        else snprintf(err, errlen, "%s", a->err);
        return -1;
    }
    return publish(a->dir, &a->meta, a->keep, world, err, errlen) == 0 ? 1 : -1;
}

void checkpoint_async_free(CheckpointAsync *a) {
    if (a->active && !a->joined) pthread_join(a->thread, NULL);
    free(a->snap);
    memset(a, 0, sizeof *a);
}

/* ---- reading the manifest --------------------------------------------------- */

static int range_cmp(const void *a, const void *b) {
    const CheckpointRange *x = a, *y = b;
    return x->global < y->global ? -1 : x->global > y->global;
}

void checkpoint_free(Checkpoint *ck) {
    free(ck->shards);
    free(ck->ranges);
    free(ck->meta.data_shards);
    ck->meta.data_shards = NULL;
    ck->shards = NULL;
    ck->ranges = NULL;
}

/* Checks a shard file's size and header against the manifest. */
static int shard_check(const Checkpoint *ck, const CheckpointShard *s, char *err, size_t errlen) {
    char p[4608];
    snprintf(p, sizeof p, "%s/%s", ck->dir, s->file);
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0) { snprintf(err, errlen, "%s: missing shard (%s)", p, strerror(errno)); return -1; }
    struct stat st;
    unsigned char h[HEADER_BYTES];
    ssize_t got = pread(fd, h, HEADER_BYTES, 0);
    int sr = fstat(fd, &st);
    close(fd);
    if (sr != 0 || !S_ISREG(st.st_mode)) { snprintf(err, errlen, "%s: not a regular file", p); return -1; }
    if (got != HEADER_BYTES || memcmp(h, SHARD_MAGIC, 8)) {
        snprintf(err, errlen, "%s: not a train checkpoint shard (no %s header)", p, SHARD_MAGIC);
        return -1;
    }
    uint32_t ver, rank; uint64_t K, step, total, hs;
    memcpy(&ver, h + 8, 4); memcpy(&rank, h + 12, 4); memcpy(&K, h + 16, 8);
    memcpy(&step, h + 24, 8); memcpy(&total, h + 32, 8); memcpy(&hs, h + 56, 8);
    if (hs != hash_words(HASH_SEED, (const uint32_t *)h, 56 / 4)) {
        snprintf(err, errlen, "%s: checksum mismatch in the shard header", p);
        return -1;
    }
    if (ver != CHECKPOINT_VERSION) {
        snprintf(err, errlen, "%s: shard format version %u, this build reads %d", p, ver, CHECKPOINT_VERSION);
        return -1;
    }
    if ((int)rank != s->rank || K != s->elements || (long)step != ck->meta.step ||
        total != gpt_total_params(&ck->meta.cfg)) {
        snprintf(err, errlen, "%s: shard of another checkpoint (rank %u, %llu elements, step %llu; "
                 "the manifest says rank %d, %zu elements, step %ld)", p, rank, (unsigned long long)K,
                 (unsigned long long)step, s->rank, s->elements, ck->meta.step);
        return -1;
    }
    if ((size_t)st.st_size != shard_bytes(K)) {
        snprintf(err, errlen, "%s: truncated or corrupt shard: expected %zu bytes, found %lld", p,
                 shard_bytes(K), (long long)st.st_size);
        return -1;
    }
    return 0;
}

static int parse_layout(const char *line, Layout *l) {
    char dp_mode[8], dtype[8], schedule[16];
    int ranks;
    if (sscanf(line, "layout ranks %d dp %d tp %d pp %d zero %d offload %d sp %d dp_mode %7s dtype %7s "
               "schedule %15s batch %d seq %d micro_batches %d", &ranks, &l->dp, &l->tp, &l->pp,
               &l->zero, &l->offload, &l->sp, dp_mode, dtype, schedule, &l->batch, &l->seq,
               &l->micro_batches) != 13)
        return -1;
    int sched = pp_schedule_parse(schedule);
    if (sched < 0 || (strcmp(dp_mode, "ddp") && strcmp(dp_mode, "ps")) || (strcmp(dtype, "fp32") && strcmp(dtype, "bf16")) ||
        l->pp < 1 || l->pp > COMM_MAX_RANKS || (long)l->dp * l->tp * l->pp != ranks)
        return -1;
    l->dp_mode = strcmp(dp_mode, "ps") ? DP_ALLREDUCE : DP_PS;
    l->dtype = strcmp(dtype, "bf16") ? DT_F32 : DT_BF16;
    l->schedule = (PPSchedule)sched;
    l->virtual_chunks = 1;      /* the manifest records one range a stage */
    l->nstage_layers = l->pp;
    return 0;
}

/* The manifest's layout must be one its model can take. */
static int manifest_layout_check(const char *mp, const CheckpointMeta *m, int nshards, char *err, size_t errlen) {
    const Layout *l = &m->layout;
    const GPTConfig *c = &m->cfg;
    int ranks = l->dp * l->tp * l->pp;
    if (l->dp < 1 || l->tp < 1 || l->pp < 1 || l->pp > COMM_MAX_RANKS || ranks != nshards) {
        snprintf(err, errlen, "%s: layout dp %d x tp %d x pp %d does not make its %d ranks and %d shards",
                 mp, l->dp, l->tp, l->pp, ranks, nshards);
        return -1;
    }
    if (c->heads % l->tp || c->padded_vocab % l->tp) {
        snprintf(err, errlen, "%s: layout tp %d cannot split the model's %d heads and %d vocabulary rows",
                 mp, l->tp, c->heads, c->padded_vocab);
        return -1;
    }
    int sum = 0;
    for (int i = 0; i < l->pp; i++) {
        if (l->stage_layers[i] < 1) { sum = -1; break; }
        sum += l->stage_layers[i];
    }
    if (sum != c->layers) {
        snprintf(err, errlen, "%s: layout's stage layers do not add up to the model's %d layers", mp, c->layers);
        return -1;
    }
    return 0;
}

int checkpoint_open(const char *dir, Checkpoint *ck, char *err, size_t errlen) {
    memset(ck, 0, sizeof *ck);
    char name[256], mp[4608], line[512];
    if (strlen(dir) > DIR_MAX) { snprintf(err, errlen, "--checkpoint-dir: path longer than %d bytes", DIR_MAX); return -1; }
    if (checkpoint_latest(dir, name, sizeof name) != 0) {
        snprintf(err, errlen, "--resume: %s/latest is missing: no complete checkpoint in %s", dir, dir);
        return -1;
    }
    long step;
    if (step_of(name, &step) != 0) {
        snprintf(err, errlen, "%s/latest: names '%s', not a step-<N> directory", dir, name);
        return -1;
    }
    snprintf(ck->dir, sizeof ck->dir, "%s/%s", dir, name);
    snprintf(mp, sizeof mp, "%s/manifest.txt", ck->dir);
    FILE *f = fopen(mp, "r");
    if (!f) { snprintf(err, errlen, "%s: missing manifest (%s)", mp, strerror(errno)); return -1; }
    CheckpointMeta *m = &ck->meta;
    int version = -1, have_end = 0, have_sched = 0, bad = 0;
    size_t params = 0, cap = 0;
    int shard_idx = -1;
    size_t shard_ranges = 0, shard_sum = 0;
    if (!fgets(line, sizeof line, f) || sscanf(line, "train checkpoint %d", &version) != 1) {
        snprintf(err, errlen, "%s: not a train checkpoint manifest", mp);
        fclose(f);
        return -1;
    }
    if (version != CHECKPOINT_VERSION) {
        snprintf(err, errlen, "%s: checkpoint format version %d, this build reads %d", mp, version, CHECKPOINT_VERSION);
        fclose(f);
        return -1;
    }
    m->step = -1;
    while (!bad && fgets(line, sizeof line, f)) {
        unsigned long long seed;
        CheckpointRange r;
        if (!strcmp(line, "end\n")) { have_end = 1; break; }
        if (sscanf(line, "step %ld", &m->step) == 1) continue;
        if (sscanf(line, "model layers %d heads %d dim %d max_seq %d vocab %d padded_vocab %d params %zu",
                   &m->cfg.layers, &m->cfg.heads, &m->cfg.dim, &m->cfg.max_seq, &m->cfg.vocab,
                   &m->cfg.padded_vocab, &params) == 7) continue;
        if (!strncmp(line, "layout ", 7)) { bad = parse_layout(line, &m->layout); continue; }
        if (!strncmp(line, "stage_layers", 12)) {
            char *p = line + 12;
            for (int i = 0; i < m->layout.pp && i < COMM_MAX_RANKS; i++)
                m->layout.stage_layers[i] = (int)strtol(p, &p, 10);
            continue;
        }
        if (sscanf(line, "data next_step %*d seed %llu shuffle %d", &seed, &m->shuffle) == 2) { m->seed = seed; continue; }
        if (sscanf(line, "data_position epoch %ld shard %d sequence %zu", &m->pos.epoch, &m->pos.shard,
                   &m->pos.seq) == 3) continue;
        if (!strncmp(line, "data_shards ", 12) || !strncmp(line, "data_shard ", 11)) {   /* kept as written */
            size_t have = m->data_shards ? strlen(m->data_shards) : 0, n = strlen(line);
            char *grown = realloc(m->data_shards, have + n + 1);
            if (!grown) { fprintf(stderr, "error: out of memory reading %s\n", mp); exit(1); }
            memcpy(grown + have, line, n + 1);
            m->data_shards = grown;
            continue;
        }
        if (sscanf(line, "optimizer adam_t %d steps %d", &m->adam_t, &m->steps) == 2) continue;
        OptConfig *o = &m->opt;
        if (sscanf(line, "schedule steps %d warmup %d lr %g lr_min %g cosine %d beta1 %g beta2 %g eps %g wd %g clip %g",
                   &o->steps, &o->warmup, &o->lr, &o->lr_min, &o->cosine, &o->beta1, &o->beta2, &o->eps, &o->wd,
                   &o->clip) == 10) { have_sched = 1; continue; }
        if (sscanf(line, "shards %d", &ck->nshards) == 1) {
            if (ck->nshards < 1 || ck->nshards > COMM_MAX_RANKS) { bad = 1; continue; }
            ck->shards = calloc((size_t)ck->nshards, sizeof *ck->shards);
            continue;
        }
        if (!strncmp(line, "shard ", 6)) {
            if (shard_idx >= 0 && shard_ranges) { bad = 1; continue; }   /* fewer ranges than said */
            CheckpointShard s;
            int idx;
            if (sscanf(line, "shard %d rank %d file %63s elements %zu ranges %zu", &idx, &s.rank, s.file,
                       &s.elements, &shard_ranges) != 5 || !ck->shards || idx != shard_idx + 1 ||
                idx >= ck->nshards || strchr(s.file, '/')) { bad = 1; continue; }
            ck->shards[++shard_idx] = s;
            shard_sum = 0;
            continue;
        }
        if (sscanf(line, "range %zu %zu %zu", &r.global, &r.n, &r.elem) == 3) {
            r.shard = shard_idx;
            if (shard_idx < 0 || !shard_ranges-- || r.elem != shard_sum || r.n == 0) { bad = 1; continue; }
            shard_sum += r.n;
            if (ck->nranges == cap) {
                cap = cap ? 2 * cap : 1024;
                ck->ranges = realloc(ck->ranges, cap * sizeof *ck->ranges);
                if (!ck->ranges) { fprintf(stderr, "error: out of memory reading %s\n", mp); exit(1); }
            }
            ck->ranges[ck->nranges++] = r;
            continue;
        }
        bad = 1;
    }
    fclose(f);
    if (bad || !have_end || !have_sched || m->step < 0 || shard_idx != ck->nshards - 1 || !m->cfg.layers || shard_ranges) {
        snprintf(err, errlen, "%s: malformed or incomplete manifest (near: %.60s)", mp,
                 bad ? line : "the end of the file");
        checkpoint_free(ck);
        return -1;
    }
    if (m->step != step) {
        snprintf(err, errlen, "%s: manifest of step %ld in directory %s", mp, m->step, name);
        checkpoint_free(ck);
        return -1;
    }
    GPTConfig cfg = m->cfg;
    cfg.padded_vocab = 0;
    if (gpt_config_check(&cfg, err + 0, errlen) != 0 || cfg.padded_vocab != m->cfg.padded_vocab ||
        params != gpt_total_params(&m->cfg)) {
        snprintf(err, errlen, "%s: the manifest's model (%d layers, %d heads, dim %d, vocab %d padded to %d) "
                 "does not have the %zu parameters it lists", mp, m->cfg.layers, m->cfg.heads, m->cfg.dim,
                 m->cfg.vocab, m->cfg.padded_vocab, params);
        checkpoint_free(ck);
        return -1;
    }
    if (manifest_layout_check(mp, m, ck->nshards, err, errlen) != 0) { checkpoint_free(ck); return -1; }
    /* the ranges cover the model once */
    qsort(ck->ranges, ck->nranges, sizeof *ck->ranges, range_cmp);
    size_t next = 0;
    for (size_t i = 0; i < ck->nranges; i++) {
        if (ck->ranges[i].global != next) {
            snprintf(err, errlen, "%s: the shards' ranges %s the model at element %zu", mp,
                     ck->ranges[i].global > next ? "leave a gap in" : "overlap in", next);
            checkpoint_free(ck);
            return -1;
        }
        next += ck->ranges[i].n;
    }
    if (next != params) {
        snprintf(err, errlen, "%s: the shards' ranges hold %zu of the model's %zu parameters", mp, next, params);
        checkpoint_free(ck);
        return -1;
    }
    for (int i = 0; i < ck->nshards; i++)
        if (shard_check(ck, &ck->shards[i], err, errlen) != 0) { checkpoint_free(ck); return -1; }
    return 0;
}

/* ---- loading ---------------------------------------------------------------- */

/* A shard open for reading: each block read is checked against its hash. */
typedef struct Reader {
    int fd;
    char path[4608];
    size_t K, nblocks;
    uint64_t *sums;    /* [nblocks] */
    uint32_t *block;   /* [BLOCK_WORDS] the block read last */
    long cached;
} Reader;

typedef struct Loader {
    const Checkpoint *ck;
    Zero *z;
    Reader *rd;        /* [nshards], opened on first use */
    int section;
    float *stage;      /* [STAGING_FLOATS] */
    int ok;
    char *err;
    size_t errlen;
} Loader;

static Reader *reader_get(Loader *L, int shard) {
    Reader *r = &L->rd[shard];
    if (r->fd > 0) return r;
    const CheckpointShard *s = &L->ck->shards[shard];
    snprintf(r->path, sizeof r->path, "%s/%s", L->ck->dir, s->file);
    r->fd = open(r->path, O_RDONLY | O_CLOEXEC);
    r->K = s->elements;
    r->nblocks = nblocks_of(r->K);
    r->sums = safe_malloc((r->nblocks + 1) * 8, "checkpoint block hashes");
    r->block = safe_malloc(BLOCK_WORDS * 4, "checkpoint read block");
    r->cached = -1;
    size_t want = r->nblocks * 8;
    if (r->fd < 0 || pread(r->fd, r->sums, want, (off_t)(HEADER_BYTES + 12 * r->K)) != (ssize_t)want) {
        snprintf(L->err, L->errlen, "%s: missing or truncated shard", r->path);
        L->ok = 0;
        return NULL;
    }
    return r;
}

/* words [w, w + n) of the shard's data (all three sections) into dst */
static int reader_read(Loader *L, Reader *r, size_t w, size_t n, float *dst) {
    uint32_t *out = (uint32_t *)dst;
    size_t total = 3 * r->K;
    while (n) {
        long b = (long)(w / BLOCK_WORDS);
        if (b != r->cached) {
            size_t words = total - (size_t)b * BLOCK_WORDS < BLOCK_WORDS ? total - (size_t)b * BLOCK_WORDS : BLOCK_WORDS;
            off_t at = (off_t)(HEADER_BYTES + (size_t)b * BLOCK_WORDS * 4);
            if (pread(r->fd, r->block, words * 4, at) != (ssize_t)(words * 4)) {
                snprintf(L->err, L->errlen, "%s: truncated shard (block %ld)", r->path, b);
                return -1;
            }
            if (hash_words(HASH_SEED, r->block, words) != r->sums[b]) {
                snprintf(L->err, L->errlen, "%s: checksum mismatch in block %ld (bytes %lld..%lld)", r->path, b,
                         (long long)at, (long long)(at + (off_t)words * 4));
                return -1;
            }
            r->cached = b;
        }
        size_t in = w - (size_t)b * BLOCK_WORDS, k = BLOCK_WORDS - in < n ? BLOCK_WORDS - in : n;
        memcpy(out, r->block + in, k * 4);
        out += k; w += k; n -= k;
    }
    return 0;
}

/* Global elements [g, g + n) of this section into dst, from whichever shards hold them. */
static int read_global(Loader *L, size_t g, size_t n, float *dst) {
    const Checkpoint *ck = L->ck;
    size_t a = 0, c = ck->nranges;   /* the range holding g */
    while (a < c) {
        size_t mid = (a + c) / 2;
        if (ck->ranges[mid].global + ck->ranges[mid].n <= g) a = mid + 1;
        else c = mid;
    }
    for (size_t i = a; n && i < ck->nranges; i++) {
        const CheckpointRange *r = &ck->ranges[i];
        size_t in = g - r->global, k = r->n - in < n ? r->n - in : n;
        Reader *rd = reader_get(L, r->shard);
        if (!rd || reader_read(L, rd, (size_t)L->section * rd->K + r->elem + in, k, dst) != 0) return -1;
        dst += k; g += k; n -= k;
    }
    return 0;
}

static void load_piece(void *ctx, const Piece *p) {
    Loader *L = ctx;
    Zero *z = L->z;
    if (!L->ok) return;
    for (size_t k = 0; k < p->n; k += STAGING_FLOATS) {
        size_t n = p->n - k < STAGING_FLOATS ? p->n - k : STAGING_FLOATS;
        if (read_global(L, p->global + k, n, L->stage) != 0) { L->ok = 0; return; }
        Piece q = {p->local + k, p->global + k, n, p->state + k, p->written};
        Dev *dev;
        float *dst = section_src(z, L->section, &q, &dev);
        dev_from_host(dev, dst, L->stage, n * sizeof(float));
        if (L->section == 0 && z->host_master) {   /* and the device's copy of the master */
            float *p2 = z->param_shard ? z->param_shard + q.state : z->m->params + q.local;
            dev_from_host(z->dev, p2, L->stage, n * sizeof(float));
        }
    }
}

int checkpoint_load(const Checkpoint *ck, Zero *z, CommGroup *world, char *err, size_t errlen) {
    Runs rs;
    runs_build(z->m, 1, &rs);
    Loader L = {.ck = ck, .z = z, .ok = 1, .err = err, .errlen = errlen};
    L.rd = safe_calloc((size_t)ck->nshards, sizeof *L.rd, "the checkpoint's shard readers");
    L.stage = safe_malloc(STAGING_FLOATS * sizeof(float), "checkpoint staging");
    /* section by section: each shard is then read front to back */
    for (L.section = 0; L.section < 3 && L.ok; L.section++) owned_pieces(z, &rs, load_piece, &L);
    for (int i = 0; i < ck->nshards; i++) {
        if (L.rd[i].fd > 0) close(L.rd[i].fd);
        free(L.rd[i].sums);
        free(L.rd[i].block);
    }
    free(L.rd);
    free(L.stage);
    free(rs.r);
    if (any_failed(world, !L.ok)) {
        if (L.ok) snprintf(err, errlen, "%s: another rank failed reading the checkpoint", ck->dir);
        return -1;
    }
    dev_sync(z->dev);
    z->adam.t = ck->meta.adam_t;
    zero_params_sync(z);
    gpt_params_changed(z->m);
    return 0;
}

int checkpoint_any_step(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    long step;
    int found = 0;
    while (!found && (e = readdir(d))) found = step_of(e->d_name, &step) == 0;
    closedir(d);
    return found;
}
