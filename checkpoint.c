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
 * layout.c's walk over a shard's runs, the map layout_llmc_copy applies
 * element by element; ZeRO's ownership (zero.h:
 * bucket b owns [off + own_off, + own_n), its state at state_off) cuts those
 * runs into the pieces this rank owns. A shard holds, for its pieces in the
 * order of the owned state, three sections of K float32 each: the master
 * parameters (host_master under offload, param_shard under ZeRO-3, else
 * m->params), Adam's m and Adam's v. An element held by several ranks is
 * written once: a tensor every tp rank holds whole only by tp rank 0, the
 * tied wte only by the first stage (layout_counts), and under DDP (zero 0, every dp rank
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
 * at any moment leaves the previous checkpoint named by latest, intact. A
 * step directory already published is never removed to be replaced: a new
 * one of the same step is swapped in by one rename (publish_rename).
 *
 * Opening (--resume): the manifest is read whole through a table of its
 * keys (manifest_keys: a line's first word names its reader), every number
 * in checked arithmetic against what it counts; then every shard is read
 * whole once, each block against its hash and each value finite. When the
 * checkpoint latest names fails, the newest step directory that passes is
 * taken instead, and the run says which it passed over (checkpoint_open).
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
#include <limits.h>
#include <math.h>
#include <stdarg.h>
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
    LayoutRuns w;   /* layout.c's walk over this shard, local to global */
    LayoutRun r;
    for (layout_runs_start(&w, m); layout_runs_next(&w, &r);)
        runs_add(rs, r.local, r.global, r.n, dp_writer && layout_counts(m, r.tensor));
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

/* The manifest's two layout lines; stage_layers: each stage's layers (its
 * chunks' together), as layout_stage_layers splits the model's. */
static void layout_print(FILE *f, const Layout *l, int layers) {
    fprintf(f, "layout ranks %d dp %d tp %d pp %d zero %d offload %d sp %d dp_mode %s dtype %s "
            "schedule %s batch %d seq %d micro_batches %d", l->dp * l->cp * l->tp * l->pp, l->dp, l->tp, l->pp,
            l->zero, l->offload, l->sp, l->dp_mode == DP_PS ? "ps" : "ddp", dt_name(l->dtype),
            pp_schedule_name(l->schedule), l->batch, l->seq, l->micro_batches);
    if (l->cp > 1) fprintf(f, " cp %d", l->cp);   /* context parallelism, only where used: older readers agree */
    fprintf(f, "\n");
    fprintf(f, "stage_layers");
    for (int i = 0; i < l->pp; i++) {
        GPTShard sh;
        layout_stage_layers(layers, l->pp, l->virtual_chunks > 1 ? l->virtual_chunks : 1,
                         l->nstage_layers ? l->stage_layers : NULL, i, &sh);
        fprintf(f, " %d", sh.nlayers);
    }
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
    layout_print(f, &meta->layout, c->layers);
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

/* A decimal number of digits only (no sign, no space) at s[0..n) up to max. */
static int read_decimal(const char *s, size_t n, uint64_t max, uint64_t *v) {
    *v = 0;
    if (!n) return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned d = (unsigned)(unsigned char)s[i] - '0';
        if (d > 9 || *v > (max - d) / 10) return -1;
        *v = *v * 10 + d;
    }
    return 0;
}

/* The N of a name "step-<N>" (decimal digits, no sign, within a long); -1 for any other name. */
static int step_of(const char *name, long *step) {
    uint64_t v;
    if (strncmp(name, "step-", 5) || read_decimal(name + 5, strlen(name + 5), LONG_MAX, &v) != 0) return -1;
    *step = (long)v;
    return 0;
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

/* Publishes tmpdir as final. A step directory already there (a resume
 * from an older checkpoint than latest writes that step again, over a
 * damaged one) is never removed first: the two are swapped in one
 * rename (renameat2's exchange), so final names a complete checkpoint at
 * every moment, and the old one, now at tmpdir, goes after latest is
 * written. Where the file system cannot swap, the old one is moved aside
 * and only then the new one in: latest may name nothing for that moment,
 * and a resume then falls back to the newest intact checkpoint. 0, or -1
 * with err. */
static int publish_rename(const char *tmpdir, const char *final, char *err, size_t errlen) {
    struct stat st;
    if (stat(final, &st) == 0) {
        if (renameat2(AT_FDCWD, tmpdir, AT_FDCWD, final, RENAME_EXCHANGE) == 0) return 0;
        char aside[4700];
        snprintf(aside, sizeof aside, "%s.old", tmpdir);
        remove_tree(aside);
        if (rename(final, aside) != 0 || rename(tmpdir, final) != 0 || rename(aside, tmpdir) != 0) {
            snprintf(err, errlen, "cannot replace %s with %s: %s", final, tmpdir, strerror(errno));
            return -1;
        }
        return 0;
    }
    if (rename(tmpdir, final) != 0) {
        snprintf(err, errlen, "cannot rename %s to %s: %s", tmpdir, final, strerror(errno));
        return -1;
    }
    return 0;
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
            failed = publish_rename(tmpdir, final, err, errlen) != 0;
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
        if (!failed) {
            remove_tree(tmpdir);   /* what publish_rename swapped out, if anything */
            prune(dir, keep, meta->step);
        }
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

/* A manifest is read whole (no line is too long: a data file's escaped name
 * may make one of thousands of bytes) up to this size. */
#define MANIFEST_MAX ((size_t)1 << 30)

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

/* Bytes of a shard of K elements (header, 3K floats, a hash a block), in
 * checked arithmetic: -1 when they do not fit. */
static int shard_bytes(size_t K, size_t *bytes) {
    size_t words, data, sums;
    if (safe_mul(3, K, &words) || safe_mul(4, words, &data)) return -1;
    if (safe_mul(8, words / BLOCK_WORDS + (words % BLOCK_WORDS != 0), &sums)) return -1;
    return safe_add(data, sums, bytes) || safe_add(*bytes, HEADER_BYTES, bytes) ? -1 : 0;
}

/* Matches line, word by word, against fmt: a literal word must be equal; %d
 * reads an int, %l a long, %z a size_t, %u a uint64_t (decimal digits, 0 up
 * to the type's largest: no sign, no wrap), %f a finite float, %s a word
 * into a char[64]. Returns 0 when the whole line matches, else -1. */
static int scan(const char *line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const char *s = line;
    int ok = 1;
    while (ok) {
        while (*fmt == ' ') fmt++;
        while (*s == ' ') s++;
        size_t fl = strcspn(fmt, " "), sl = strcspn(s, " ");
        if (!fl || !sl) { ok = !fl && !sl; break; }
        if (fmt[0] != '%') {
            ok = fl == sl && !memcmp(fmt, s, fl);
        } else if (fmt[1] == 's' || fmt[1] == 'f') {
            char word[64], *end;
            ok = sl < sizeof word;
            if (ok) { memcpy(word, s, sl); word[sl] = 0; }
            if (ok && fmt[1] == 's') strcpy(va_arg(ap, char *), word);
            if (ok && fmt[1] == 'f') {
                float v = strtof(word, &end);
                ok = end == word + sl && isfinite(v);
                if (ok) *va_arg(ap, float *) = v;
            }
        } else {
            uint64_t v, max = fmt[1] == 'd' ? INT_MAX : fmt[1] == 'l' ? LONG_MAX : fmt[1] == 'z' ? SIZE_MAX : UINT64_MAX;
            ok = read_decimal(s, sl, max, &v) == 0;
            if (ok && fmt[1] == 'd') *va_arg(ap, int *) = (int)v;
            if (ok && fmt[1] == 'l') *va_arg(ap, long *) = (long)v;
            if (ok && fmt[1] == 'z') *va_arg(ap, size_t *) = (size_t)v;
            if (ok && fmt[1] == 'u') *va_arg(ap, uint64_t *) = v;
        }
        fmt += fl;
        s += sl;
    }
    va_end(ap);
    return ok ? 0 : -1;
}

/* A manifest being read: what the lines read so far have said. */
typedef struct Manifest {
    Checkpoint *ck;
    unsigned seen;          /* a bit a key of manifest_keys */
    size_t params;          /* the model line's parameter count */
    int ranks;              /* the layout line's */
    int shard;              /* the shard whose ranges follow; -1 before the first */
    size_t shard_left;      /* ranges it has yet to list */
    size_t shard_sum;       /* elements its ranges hold so far */
    size_t cap;             /* ranges allocated */
} Manifest;

static int key_step(Manifest *m, const char *line) { return scan(line, "step %l", &m->ck->meta.step); }

static int key_model(Manifest *m, const char *line) {
    GPTConfig *c = &m->ck->meta.cfg;
    return scan(line, "model layers %d heads %d dim %d max_seq %d vocab %d padded_vocab %d params %z", &c->layers,
                &c->heads, &c->dim, &c->max_seq, &c->vocab, &c->padded_vocab, &m->params);
}

/* The names the layout line spells become Layout's enums. */
static int key_layout(Manifest *m, const char *line) {
    Layout *l = &m->ck->meta.layout;
    char dp_mode[64], dtype[64], schedule[64];
    l->cp = 1;   /* written only where it is not 1 */
    if (scan(line, "layout ranks %d dp %d tp %d pp %d zero %d offload %d sp %d dp_mode %s dtype %s schedule %s "
             "batch %d seq %d micro_batches %d", &m->ranks, &l->dp, &l->tp, &l->pp, &l->zero, &l->offload, &l->sp,
             dp_mode, dtype, schedule, &l->batch, &l->seq, &l->micro_batches) != 0 &&
        scan(line, "layout ranks %d dp %d tp %d pp %d zero %d offload %d sp %d dp_mode %s dtype %s schedule %s "
             "batch %d seq %d micro_batches %d cp %d", &m->ranks, &l->dp, &l->tp, &l->pp, &l->zero, &l->offload,
             &l->sp, dp_mode, dtype, schedule, &l->batch, &l->seq, &l->micro_batches, &l->cp) != 0)
        return -1;
    int sched = pp_schedule_parse(schedule);
    if (sched < 0 || (strcmp(dp_mode, "ddp") && strcmp(dp_mode, "ps")) || (strcmp(dtype, "fp32") && strcmp(dtype, "bf16")))
        return -1;
    l->schedule = (PPSchedule)sched;
    l->dp_mode = strcmp(dp_mode, "ps") ? DP_ALLREDUCE : DP_PS;
    l->dtype = strcmp(dtype, "bf16") ? DT_F32 : DT_BF16;
    l->virtual_chunks = 1;
    return 0;
}

/* Each stage's layers, pp of them (after the layout line). */
static int key_stage_layers(Manifest *m, const char *line) {
    Layout *l = &m->ck->meta.layout;
    const char *s = line + strlen("stage_layers");
    if (l->pp < 1 || l->pp > COMM_MAX_RANKS) return -1;
    for (int i = 0; i < l->pp; i++) {
        uint64_t v;
        if (*s != ' ') return -1;
        s++;
        size_t n = strcspn(s, " ");
        if (read_decimal(s, n, SAFE_MAX_LAYERS, &v) != 0 || v < 1) return -1;
        l->stage_layers[i] = (int)v;
        s += n;
    }
    l->nstage_layers = l->pp;
    return *s ? -1 : 0;
}

static int key_data(Manifest *m, const char *line) {
    long next;
    return scan(line, "data next_step %l seed %u shuffle %d", &next, &m->ck->meta.seed, &m->ck->meta.shuffle);
}

static int key_position(Manifest *m, const char *line) {
    DataPos *p = &m->ck->meta.pos;
    return scan(line, "data_position epoch %l shard %d sequence %z", &p->epoch, &p->shard, &p->seq);
}

/* data_describe's lines, kept as written (data_compare reads them). */
static int key_data_shards(Manifest *m, const char *line) {
    CheckpointMeta *meta = &m->ck->meta;
    size_t have = meta->data_shards ? strlen(meta->data_shards) : 0, n = strlen(line), bytes;
    if (safe_add(have, n, &bytes) || safe_add(bytes, 2, &bytes)) return -1;
    char *grown = realloc(meta->data_shards, bytes);
    if (!grown) { fprintf(stderr, "error: out of memory reading a checkpoint's manifest\n"); exit(1); }
    memcpy(grown + have, line, n);
    memcpy(grown + have + n, "\n", 2);
    meta->data_shards = grown;
    return 0;
}

static int key_optimizer(Manifest *m, const char *line) {
    return scan(line, "optimizer adam_t %d steps %d", &m->ck->meta.adam_t, &m->ck->meta.steps);
}

static int key_schedule(Manifest *m, const char *line) {
    OptConfig *o = &m->ck->meta.opt;
    return scan(line, "schedule steps %d warmup %d lr %f lr_min %f cosine %d beta1 %f beta2 %f eps %f wd %f clip %f",
                &o->steps, &o->warmup, &o->lr, &o->lr_min, &o->cosine, &o->beta1, &o->beta2, &o->eps, &o->wd,
                &o->clip);
}

static int key_shards(Manifest *m, const char *line) {
    Checkpoint *ck = m->ck;
    if (scan(line, "shards %d", &ck->nshards) != 0 || ck->nshards < 1 || ck->nshards > COMM_MAX_RANKS) return -1;
    ck->shards = safe_calloc((size_t)ck->nshards, sizeof *ck->shards, "a checkpoint's shard table");
    return 0;
}

/* Whether the shard before this point has listed all its ranges, and they
 * add up to its elements. */
static int shard_complete(const Manifest *m) {
    return m->shard < 0 || (m->shard_left == 0 && m->shard_sum == m->ck->shards[m->shard].elements);
}

/* A shard (after the model and shards lines, the previous shard complete):
 * its index the next, a file name in the step directory, at most the
 * model's elements, at most a range an element. */
static int key_shard(Manifest *m, const char *line) {
    Checkpoint *ck = m->ck;
    CheckpointShard s;
    int idx;
    if (!ck->shards || !m->params || !shard_complete(m) ||
        scan(line, "shard %d rank %d file %s elements %z ranges %z", &idx, &s.rank, s.file, &s.elements,
             &m->shard_left) != 0)
        return -1;
    if (idx != m->shard + 1 || idx >= ck->nshards || s.rank >= ck->nshards || strchr(s.file, '/') ||
        s.file[0] == '.' || s.elements > m->params || m->shard_left > s.elements)
        return -1;
    ck->shards[idx] = s;
    m->shard = idx;
    m->shard_sum = 0;
    return 0;
}

/* A range of the current shard: the next elements of its sections, inside
 * them and inside the model. */
static int key_range(Manifest *m, const char *line) {
    Checkpoint *ck = m->ck;
    CheckpointRange r;
    size_t end;
    if (m->shard < 0 || !m->shard_left || scan(line, "range %z %z %z", &r.global, &r.n, &r.elem) != 0 ||
        r.n == 0 || r.elem != m->shard_sum || safe_add(r.elem, r.n, &end) || end > ck->shards[m->shard].elements ||
        safe_add(r.global, r.n, &end) || end > m->params)
        return -1;
    r.shard = m->shard;
    m->shard_left--;
    m->shard_sum += r.n;
    if (ck->nranges == m->cap) {
        size_t bytes;
        m->cap = m->cap ? 2 * m->cap : 1024;
        if (safe_mul(m->cap, sizeof *ck->ranges, &bytes)) return -1;
        CheckpointRange *grown = realloc(ck->ranges, bytes);
        if (!grown) { fprintf(stderr, "error: out of memory reading a checkpoint's manifest\n"); exit(1); }
        ck->ranges = grown;
    }
    ck->ranges[ck->nranges++] = r;
    return 0;
}

/* The manifest's lines by their first word. once: at most one such line,
 * and a manifest without it is incomplete. */
static const struct ManifestKey {
    const char *word;
    int (*read)(Manifest *m, const char *line);
    int once;
} manifest_keys[] = {
    /* what was trained: the step, the model, the layout it ran on */
    {"step", key_step, 1}, {"model", key_model, 1}, {"layout", key_layout, 1},
    {"stage_layers", key_stage_layers, 1}, {"schedule", key_schedule, 1},
    /* where the data stood; data_describe's count line, then one line a shard */
    {"data", key_data, 1}, {"data_position", key_position, 1},
    {"data_shards", key_data_shards, 0}, {"data_shard", key_data_shards, 0},
    /* the optimizer, then the shard files and each one's ranges */
    {"optimizer", key_optimizer, 1}, {"shards", key_shards, 1}, {"shard", key_shard, 0}, {"range", key_range, 0},
};
#define NKEYS (sizeof manifest_keys / sizeof manifest_keys[0])

/* Reads text[len] (a manifest; its lines are cut in place) into m->ck, up
 * to its "end" line. 0, or -1 with err naming the line that is wrong or
 * the line that is missing. */
static int manifest_parse(Manifest *m, char *text, size_t len, const char *mp, char *err, size_t errlen) {
    char *p = text, *end = text + len;
    int lineno = 0, version;
    const char *missing = "end";
    while (p < end) {
        char *nl = memchr(p, '\n', (size_t)(end - p)), *line = p;
        if (!nl) break;   /* a last line cut short is no line */
        *nl = 0;
        p = nl + 1;
        lineno++;
        int bad = strlen(line) != (size_t)(nl - line);   /* a NUL inside */
        if (!bad && lineno == 1) {
            if (scan(line, "train checkpoint %d", &version) != 0) {
                snprintf(err, errlen, "%s: not a train checkpoint manifest", mp);
                return -1;
            }
            if (version != CHECKPOINT_VERSION) {
                snprintf(err, errlen, "%s: checkpoint format version %d, this build reads %d", mp, version,
                         CHECKPOINT_VERSION);
                return -1;
            }
            continue;
        }
        if (!bad && !strcmp(line, "end")) {
            missing = !shard_complete(m) ? "range" : m->shard != m->ck->nshards - 1 ? "shard" : NULL;
            for (size_t k = 0; !missing && k < NKEYS; k++)
                if (manifest_keys[k].once && !(m->seen & 1u << k)) missing = manifest_keys[k].word;
            break;
        }
        size_t w = strcspn(line, " "), k = 0;
        while (!bad && k < NKEYS && (strlen(manifest_keys[k].word) != w || strncmp(line, manifest_keys[k].word, w))) k++;
        bad = bad || k == NKEYS || (manifest_keys[k].once && (m->seen & 1u << k)) || manifest_keys[k].read(m, line) != 0;
        if (bad) {
            snprintf(err, errlen, "%s: malformed manifest (line %d: %.60s)", mp, lineno, line);
            return -1;
        }
        m->seen |= 1u << k;
    }
    if (lineno == 0) { snprintf(err, errlen, "%s: not a train checkpoint manifest", mp); return -1; }
    if (missing) {
        snprintf(err, errlen, "%s: incomplete manifest (no complete '%s' line before its end)", mp, missing);
        return -1;
    }
    return 0;
}

/* The manifest's layout must be one its model can take (layout_check,
 * the flags' own rules: a manifest records V 1 and one range a stage) and
 * that makes its ranks and shards. */
static int manifest_layout_check(const Manifest *m, const char *mp, char *err, size_t errlen) {
    const Layout *l = &m->ck->meta.layout;
    const GPTConfig *c = &m->ck->meta.cfg;
    char why[384];
    if (l->dp < 1 || l->cp < 1 || l->tp < 1 || l->pp < 1 || l->dp > COMM_MAX_RANKS || l->cp > COMM_MAX_RANKS ||
        l->tp > COMM_MAX_RANKS || l->pp > COMM_MAX_RANKS || (long)l->dp * l->cp * l->tp * l->pp != m->ranks ||
        m->ranks != m->ck->nshards) {
        snprintf(err, errlen, "%s: layout dp %d x cp %d x tp %d x pp %d does not make its %d ranks and %d shards",
                 mp, l->dp, l->cp, l->tp, l->pp, m->ranks, m->ck->nshards);
        return -1;
    }
    if (l->zero > 3 || l->offload > 1 || l->sp > 1 || l->seq > c->max_seq ||
        layout_check(l, c, m->ranks, why, sizeof why) != 0) {
        snprintf(err, errlen, "%s: its layout is not one this model runs: %s", mp,
                 l->seq > c->max_seq ? "--seq beyond the model's positions"
                 : l->zero > 3 || l->offload > 1 || l->sp > 1 ? "zero, offload or sp out of range" : why);
        return -1;
    }
    return 0;
}

/* What the lines say together: the directory's step, a model with the
 * parameters listed, its layout, ranges covering it once. 0, or -1 with err. */
static int manifest_check(Manifest *m, const char *mp, const char *name, long step, char *err, size_t errlen) {
    Checkpoint *ck = m->ck;
    CheckpointMeta *meta = &ck->meta;
    if (meta->step != step) {
        snprintf(err, errlen, "%s: manifest of step %ld in directory %s", mp, meta->step, name);
        return -1;
    }
    GPTConfig cfg = meta->cfg;
    cfg.padded_vocab = 0;
    if (gpt_config_check(&cfg, err, errlen) != 0 || cfg.padded_vocab != meta->cfg.padded_vocab ||
        m->params != gpt_total_params(&meta->cfg)) {
        snprintf(err, errlen, "%s: the manifest's model (%d layers, %d heads, dim %d, vocab %d padded to %d) "
                 "does not have the %zu parameters it lists", mp, meta->cfg.layers, meta->cfg.heads, meta->cfg.dim,
                 meta->cfg.vocab, meta->cfg.padded_vocab, m->params);
        return -1;
    }
    if (manifest_layout_check(m, mp, err, errlen) != 0) return -1;
    /* the ranges cover the model once (each lies inside it: next never passes params) */
    qsort(ck->ranges, ck->nranges, sizeof *ck->ranges, range_cmp);
    size_t next = 0;
    for (size_t i = 0; i < ck->nranges; i++) {
        if (ck->ranges[i].global != next) {
            snprintf(err, errlen, "%s: the shards' ranges %s the model at element %zu", mp,
                     ck->ranges[i].global > next ? "leave a gap in" : "overlap in", next);
            return -1;
        }
        next += ck->ranges[i].n;
    }
    if (next != m->params) {
        snprintf(err, errlen, "%s: the shards' ranges hold %zu of the model's %zu parameters", mp, next, m->params);
        return -1;
    }
    return 0;
}

/* Checks a shard file's size and header against the manifest. */
static int shard_check(const Checkpoint *ck, const CheckpointShard *s, char *err, size_t errlen) {
    char p[4608];
    size_t bytes;
    snprintf(p, sizeof p, "%s/%s", ck->dir, s->file);
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0) { snprintf(err, errlen, "%s: missing shard (%s)", p, strerror(errno)); return -1; }
    struct stat st;
    unsigned char h[HEADER_BYTES];
    int sr = fstat(fd, &st);
    ssize_t got = sr == 0 && S_ISREG(st.st_mode) ? pread(fd, h, HEADER_BYTES, 0) : -1;
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
    if (rank != (uint32_t)s->rank || K != s->elements || step != (uint64_t)ck->meta.step ||
        total != gpt_total_params(&ck->meta.cfg)) {
        snprintf(err, errlen, "%s: shard of another checkpoint (rank %u, %llu elements, step %llu; "
                 "the manifest says rank %d, %zu elements, step %ld)", p, rank, (unsigned long long)K,
                 (unsigned long long)step, s->rank, s->elements, ck->meta.step);
        return -1;
    }
    if (shard_bytes(s->elements, &bytes) != 0) bytes = SIZE_MAX;   /* no file is that large */
    if ((uint64_t)st.st_size != bytes) {
        snprintf(err, errlen, "%s: truncated or corrupt shard: expected %zu bytes, found %lld", p, bytes,
                 (long long)st.st_size);
        return -1;
    }
    return 0;
}

/* ---- reading a shard, block by block ---------------------------------------- */

/* A shard open for reading: each block read is checked against its hash. */
typedef struct Reader {
    int fd;            /* -1: not open */
    char path[4608];
    size_t K, nblocks;
    uint64_t *sums;    /* [nblocks] */
    uint32_t *block;   /* [BLOCK_WORDS] the block read last */
    long cached;
} Reader;

/* Opens shard `shard` of ck (shard_check has passed: its size is the
 * manifest's) and reads its block hashes. 0, or -1 with err. */
static int reader_open(Reader *r, const Checkpoint *ck, int shard, char *err, size_t errlen) {
    const CheckpointShard *s = &ck->shards[shard];
    snprintf(r->path, sizeof r->path, "%s/%s", ck->dir, s->file);
    r->fd = open(r->path, O_RDONLY | O_CLOEXEC);
    r->K = s->elements;
    r->nblocks = nblocks_of(r->K);
    r->sums = safe_malloc((r->nblocks + 1) * 8, "checkpoint block hashes");
    r->block = safe_malloc(BLOCK_WORDS * 4, "checkpoint read block");
    r->cached = -1;
    size_t want = r->nblocks * 8;
    if (r->fd < 0 || pread(r->fd, r->sums, want, (off_t)(HEADER_BYTES + 12 * r->K)) != (ssize_t)want) {
        snprintf(err, errlen, "%s: missing or truncated shard", r->path);
        return -1;
    }
    return 0;
}

static void reader_close(Reader *r) {
    if (r->fd >= 0) close(r->fd);
    free(r->sums);
    free(r->block);
    r->fd = -1;
    r->sums = NULL;
    r->block = NULL;
}

/* Block b of the shard's data into r->block, its hash checked; *words gets
 * its length. 0, or -1 with err. */
static int reader_block(Reader *r, size_t b, size_t *words, char *err, size_t errlen) {
    size_t total = 3 * r->K, left = total - b * BLOCK_WORDS;
    *words = left < BLOCK_WORDS ? left : BLOCK_WORDS;
    if ((long)b == r->cached) return 0;
    off_t at = (off_t)(HEADER_BYTES + b * BLOCK_WORDS * 4);
    if (pread(r->fd, r->block, *words * 4, at) != (ssize_t)(*words * 4)) {
        snprintf(err, errlen, "%s: truncated shard (block %zu)", r->path, b);
        return -1;
    }
    if (hash_words(HASH_SEED, r->block, *words) != r->sums[b]) {
        snprintf(err, errlen, "%s: checksum mismatch in block %zu (bytes %lld..%lld)", r->path, b,
                 (long long)at, (long long)(at + (off_t)*words * 4));
        r->cached = -1;
        return -1;
    }
    r->cached = (long)b;
    return 0;
}

/* Words [w, w + n) of the shard's data (all three sections) into dst. */
static int reader_read(Reader *r, size_t w, size_t n, float *dst, char *err, size_t errlen) {
    uint32_t *out = (uint32_t *)dst;
    while (n) {
        size_t b = w / BLOCK_WORDS, words;
        if (reader_block(r, b, &words, err, errlen) != 0) return -1;
        size_t in = w - b * BLOCK_WORDS, k = BLOCK_WORDS - in < n ? BLOCK_WORDS - in : n;
        memcpy(out, r->block + in, k * 4);
        out += k; w += k; n -= k;
    }
    return 0;
}

/* Every block of every shard: its hash, and each value finite (a NaN or an
 * infinity in the master weights or Adam's state is a diverged or damaged
 * checkpoint, never one to continue). 0, or -1 with err. */
static int shards_verify(const Checkpoint *ck, char *err, size_t errlen) {
    static const char *section[3] = {"the master weights", "Adam's m", "Adam's v"};
    for (int i = 0; i < ck->nshards; i++) {
        if (shard_check(ck, &ck->shards[i], err, errlen) != 0) return -1;
        Reader r = {.fd = -1};
        int rc = reader_open(&r, ck, i, err, errlen);
        for (size_t b = 0; rc == 0 && b < r.nblocks; b++) {
            size_t words;
            rc = reader_block(&r, b, &words, err, errlen);
            for (size_t k = 0; rc == 0 && k < words; k++)
                if ((r.block[k] & 0x7f800000u) == 0x7f800000u) {
                    size_t at = b * BLOCK_WORDS + k;
                    snprintf(err, errlen, "%s: a non-finite value in %s (element %zu)", r.path, section[at / r.K],
                             at % r.K);
                    rc = -1;
                }
        }
        reader_close(&r);
        if (rc != 0) return -1;
    }
    return 0;
}

/* ---- opening a checkpoint ---------------------------------------------------- */

/* Opens dir/name, a step directory, and checks all of it. 0, or -1 with
 * err (ck then holds nothing). */
static int open_step(const char *dir, const char *name, Checkpoint *ck, char *err, size_t errlen) {
    memset(ck, 0, sizeof *ck);
    Manifest m = {.ck = ck, .shard = -1};
    char mp[4608];
    unsigned char *text = NULL;
    size_t len;
    long step;
    int rc = -1;
    ck->meta.step = -1;
    snprintf(ck->dir, sizeof ck->dir, "%s/%s", dir, name);
    snprintf(mp, sizeof mp, "%s/manifest.txt", ck->dir);
    if (step_of(name, &step) != 0)
        snprintf(err, errlen, "%s/latest: names '%s', not a step-<N> directory", dir, name);
    else if (safe_read_file(mp, MANIFEST_MAX, &text, &len, err, errlen) != 0)
        snprintf(err, errlen, "%s: missing or unreadable manifest", mp);
    else if (manifest_parse(&m, (char *)text, len, mp, err, errlen) == 0 &&
             manifest_check(&m, mp, name, step, err, errlen) == 0 && shards_verify(ck, err, errlen) == 0)
        rc = 0;
    free(text);
    if (rc != 0) checkpoint_free(ck);
    return rc;
}

/* The step-<N> directories of dir, newest first: up to max into steps. */
static int list_steps(const char *dir, long *steps, int max) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < max)
        if (step_of(e->d_name, &steps[n]) == 0) n++;
    closedir(d);
    qsort(steps, (size_t)n, sizeof *steps, long_cmp_desc);
    return n;
}

/* latest failed (why), or is missing: the newest other step directory that
 * passes, into ck with ck->damaged saying so. 0, or -1 with err. */
static int open_fallback(const char *dir, const char *latest, const char *why, Checkpoint *ck, char *err,
                         size_t errlen) {
    enum { MAX_STEPS = 4096 };
    long *steps = safe_malloc(MAX_STEPS * sizeof *steps, "the checkpoint directory's listing");
    int n = list_steps(dir, steps, MAX_STEPS), tried = 0, rc = -1;
    for (int i = 0; i < n && rc != 0; i++) {
        char cand[64], e2[1024];
        snprintf(cand, sizeof cand, "step-%ld", steps[i]);
        if (latest && !strcmp(cand, latest)) continue;
        tried++;
        rc = open_step(dir, cand, ck, e2, sizeof e2);
    }
    free(steps);
    if (rc == 0)
        snprintf(ck->damaged, sizeof ck->damaged, "resume: passing over a damaged checkpoint: %s; continuing from "
                 "%s, the newest that passes its checks", why, ck->dir);
    else if (tried)
        snprintf(err, errlen, "%s; and none of the other %d checkpoints in %s passes its checks", why, tried, dir);
    else
        snprintf(err, errlen, "%s", why);
    return rc;
}

int checkpoint_open(const char *dir, Checkpoint *ck, char *err, size_t errlen) {
    char name[256], why[1024];
    int rc = -1;
    memset(ck, 0, sizeof *ck);
    if (strlen(dir) > DIR_MAX) {
        snprintf(err, errlen, "--checkpoint-dir: path longer than %d bytes", DIR_MAX);
    } else if (checkpoint_latest(dir, name, sizeof name) != 0) {
        snprintf(why, sizeof why, "--resume: %s/latest is missing: no complete checkpoint in %s", dir, dir);
        rc = open_fallback(dir, NULL, why, ck, err, errlen);
    } else if ((rc = open_step(dir, name, ck, why, sizeof why)) != 0) {
        rc = open_fallback(dir, name, why, ck, err, errlen);
    }
    return rc;
}

/* ---- loading ---------------------------------------------------------------- */

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
    if (r->sums) return r;
    if (reader_open(r, L->ck, shard, L->err, L->errlen) != 0) { L->ok = 0; return NULL; }
    return r;
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
        if (!rd || reader_read(rd, (size_t)L->section * rd->K + r->elem + in, k, dst, L->err, L->errlen) != 0) return -1;
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
    for (int i = 0; i < ck->nshards; i++)
        if (L.rd[i].sums) reader_close(&L.rd[i]);
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

int checkpoint_dir_used(const char *dir) {
    char name[256];
    return checkpoint_latest(dir, name, sizeof name) == 0 || checkpoint_any_step(dir);
}
