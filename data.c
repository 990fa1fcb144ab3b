/* data.c: token shards and per-rank batches.
 *
 * The order of the data is part of the contract between layouts (DESIGN.md,
 * step 1: data.c gives each dp rank its micro-batches of the global batch):
 * a global batch of G sequences is the same set of tokens whichever ranks
 * share it, because where a sequence comes from is a pure function of the
 * step, G, the shard list, the sequence length and the seed.
 *
 *   global sequence  g = step * G + j        (j: its place in the step's batch)
 *   epoch            e = g / N,  r = g mod N (N: the sequences of all shards)
 *   shard            the k-th of epoch e's order with first[k] <= r < first[k+1]
 *   sequence         q = r - first[k]  (unshuffled), or P(q) (shuffled)
 *   tokens           [q * T, q * T + T + 1) of that shard
 *
 * Each shard holds (n_tokens - 1) / T sequences, so none straddles two
 * files. Without --shuffle the order is the shards in name order and the
 * sequences in file order: with one shard, sequence g starts at token
 * (g mod N) * T, as it did before shards existed. With --shuffle, epoch e
 * takes the shards in a permuted order and each shard's sequences in a
 * permuted order, both keyed by (seed, e, shard): a small Feistel network on
 * the next power of four, walked until it lands inside the range (cycle
 * walking), so a permutation of n costs no memory and any of its entries
 * costs a few hashes. Nothing depends on the layout.
 *
 * Memory. llm.c token files are mapped (read-only, shared) only while a
 * batch reads them, at most DATA_MAX_MAPPED at once, and read as uint16
 * where they lie: a rank touches only the pages of its own sequences, and a
 * finished shard is unmapped, so 100 shards cost what two cost. Pages of a
 * file shared by the ranks of one host count once in their PSS. Byte files,
 * pipes and FIFOs are read whole, as before (at most 2^31 - 1 tokens each).
 *
 * Hostile files. Every header is checked at data_load. A mapped file is
 * fstat'ed before each batch that reads it: one that shrank (or was
 * replaced) is one line, not a SIGBUS (a file truncated between that check
 * and the read itself still faults: the window is one batch). Token ids are
 * scanned at data_load up to DATA_SCAN_MAX_TOKENS; beyond, each sequence
 * is checked as it is read, and data_scan reads everything (--check-data).
 */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "data.h"
#include "safe.h"

#define TOKENS_MAGIC 20240520
#define HEADER_BYTES (256 * 4)
/* The most tokens a file may hold: a token file's count is an int32. */
#define MAX_TOKENS 0x7fffffffu

/* ---- one shard ------------------------------------------------------------ */

/* A token file's header (h: its first HEADER_BYTES, magic already matched)
 * against the file's size: 0 with *n tokens, or -1 with err. */
static int token_header(const char *path, const unsigned char *h, size_t size, size_t *n, char *err,
                        size_t errlen) {
    int32_t w[3];
    memcpy(w, h, sizeof w);
    if (w[1] != 1) {
        snprintf(err, errlen, "%s: token file version %d, expected 1", path, w[1]);
        return -1;
    }
    size_t expect = HEADER_BYTES + 2 * (size_t)(uint32_t)w[2];   /* < 2^33: no wrap */
    if (w[2] < 0 || size != expect) {
        snprintf(err, errlen, "%s: truncated or corrupt token file: header says %d tokens (%zu bytes), file has %zu bytes",
                 path, w[2], w[2] < 0 ? (size_t)0 : expect, size);
        return -1;
    }
    *n = (size_t)w[2];
    return 0;
}

static int is_token_file(const unsigned char *buf, size_t size) {
    int32_t magic;
    if (size < HEADER_BYTES) return 0;
    memcpy(&magic, buf, 4);
    return magic == TOKENS_MAGIC;
}

/* A file's bytes held in memory (buf [size + 1], taken over): a token file
 * or a byte file. *is_bytes says which. */
static int shard_hold(DataShard *s, unsigned char *buf, size_t size, int *is_bytes, char *err, size_t errlen) {
    s->held = buf;
    if (is_token_file(buf, size)) {
        *is_bytes = 0;
        return token_header(s->path, buf, size, &s->n_tokens, err, errlen);
    }
    if (size > MAX_TOKENS) {
        snprintf(err, errlen, "%s: %zu bytes, more than the %u tokens a data file may hold", s->path, size, MAX_TOKENS);
        return -1;
    }
    *is_bytes = 1;
    s->n_tokens = size;
    return 0;
}

/* Opens path as shard s: a regular token file's header is checked and the
 * file closed (it is mapped when a batch needs it); anything else is read
 * whole by safe_read_file (which refuses directories and devices). A pipe
 * or FIFO is opened once only, by safe_read_file: its writer writes once. */
static int shard_open(DataShard *s, const char *path, int *is_bytes, char *err, size_t errlen) {
    s->fd = -1;
    s->path = strdup(path);
    if (!s->path) { snprintf(err, errlen, "out of memory naming %s", path); return -1; }
    struct stat st;
    int fd = -1, regular = stat(path, &st) == 0 && S_ISREG(st.st_mode);
    if (regular && (fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
        snprintf(err, errlen, "cannot open data file %s: %s", path, strerror(errno));
        return -1;
    }
    if (regular && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))) regular = 0;
    if (regular) {
        s->dev = (uint64_t)st.st_dev;
        s->ino = (uint64_t)st.st_ino;
    }
    unsigned char h[HEADER_BYTES];
    if (regular && st.st_size >= HEADER_BYTES && pread(fd, h, HEADER_BYTES, 0) == HEADER_BYTES &&
        is_token_file(h, HEADER_BYTES)) {
        close(fd);
        *is_bytes = 0;
        s->file_bytes = (size_t)st.st_size;
        return token_header(path, h, s->file_bytes, &s->n_tokens, err, errlen);
    }
    if (fd >= 0) close(fd);
    unsigned char *buf;
    size_t size;
    if (safe_read_named(path, "data", HEADER_BYTES + 2 * (size_t)MAX_TOKENS, &buf, &size, err, errlen) != 0)
        return -1;
    return shard_hold(s, buf, size, is_bytes, err, errlen);
}

static void shard_unmap(DataSet *ds, DataShard *s) {
    if (!s->map) return;
    munmap((void *)s->map, s->file_bytes);
    close(s->fd);
    s->map = NULL;
    s->fd = -1;
    ds->n_mapped--;
}

/* Shard i ready to read: mapped if it is a file on disk (letting the least
 * recently used mapping go first), and, when check, still the size it was
 * at data_load. 0, or -1 with err. */
static int shard_use(DataSet *ds, int i, int check, char *err, size_t errlen) {
    DataShard *s = &ds->shards[i];
    s->last_use = ds->clock;
    if (s->held) return 0;
    struct stat st;
    if (s->map) {
        if (!check) return 0;
        if (fstat(s->fd, &st) != 0 || (size_t)st.st_size != s->file_bytes) {
            snprintf(err, errlen, "%s: token file shrank or changed while in use: %zu bytes when opened, %lld now",
                     s->path, s->file_bytes, (long long)st.st_size);
            return -1;
        }
        return 0;
    }
    while (ds->n_mapped >= DATA_MAX_MAPPED) {
        DataShard *old = NULL;
        for (int k = 0; k < ds->n_shards; k++)
            if (ds->shards[k].map && (!old || ds->shards[k].last_use < old->last_use)) old = &ds->shards[k];
        shard_unmap(ds, old);
    }
    int fd = open(s->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, errlen, "cannot open data file %s again: %s", s->path, strerror(errno));
        return -1;
    }
    if (fstat(fd, &st) != 0 || (size_t)st.st_size != s->file_bytes || (uint64_t)st.st_ino != s->ino ||
        (uint64_t)st.st_dev != s->dev) {
        snprintf(err, errlen, "%s: token file changed since it was opened: %zu bytes then, %lld now", s->path,
                 s->file_bytes, (long long)st.st_size);
        close(fd);
        return -1;
    }
    void *m = mmap(NULL, s->file_bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        snprintf(err, errlen, "cannot map data file %s (%zu bytes): %s", s->path, s->file_bytes, strerror(errno));
        close(fd);
        return -1;
    }
    size_t n = 0;
    if (!is_token_file(m, s->file_bytes) || token_header(s->path, m, s->file_bytes, &n, err, errlen) != 0 ||
        n != s->n_tokens) {
        snprintf(err, errlen, "%s: token file changed since it was opened: its header no longer says %zu tokens",
                 s->path, s->n_tokens);
        munmap(m, s->file_bytes);
        close(fd);
        return -1;
    }
    s->map = m;
    s->fd = fd;
    ds->n_mapped++;
    return 0;
}

/* The shard's tokens where they lie: uint16 after the header, or its bytes. */
static const uint16_t *shard_tokens16(const DataShard *s) {
    return (const uint16_t *)((s->held ? s->held : s->map) + HEADER_BYTES);
}

/* The first id >= limit in tokens [lo, hi) of shard s (mapped or held), or
 * hi when there is none; *max gets the largest id seen (and *max_at where). */
static size_t shard_find(const DataSet *ds, const DataShard *s, size_t lo, size_t hi, int limit, int *max,
                         size_t *max_at) {
    if (ds->is_bytes) {
        const unsigned char *t = s->held;
        for (size_t i = lo; i < hi; i++) {
            if (t[i] > *max) { *max = t[i]; *max_at = i; }
            if (t[i] >= limit) return i;
        }
    } else {
        const uint16_t *t = shard_tokens16(s);
        for (size_t i = lo; i < hi; i++) {
            if (t[i] > *max) { *max = t[i]; *max_at = i; }
            if (t[i] >= limit) return i;
        }
    }
    return hi;
}

static void bad_token(const DataSet *ds, const DataShard *s, size_t at, int id, int vocab, char *err, size_t errlen) {
    snprintf(err, errlen, "%s: token id %d >= vocab %d at token %zu (byte offset %zu)", s->path, id, vocab, at,
             ds->is_bytes ? at : HEADER_BYTES + 2 * at);
}

/* Every id of every shard: the largest (and where), or the first >= vocab
 * (vocab 0: no limit). */
static int scan_all(DataSet *ds, int vocab, char *err, size_t errlen) {
    ds->max_token = -1;
    for (int i = 0; i < ds->n_shards; i++) {
        DataShard *s = &ds->shards[i];
        if (shard_use(ds, i, 1, err, errlen) != 0) return -1;
        int max = -1;
        size_t max_at = 0;
        size_t bad = shard_find(ds, s, 0, s->n_tokens, vocab > 0 ? vocab : 1 << 30, &max, &max_at);
        if (max > ds->max_token) { ds->max_token = max; ds->max_shard = i; ds->max_at = max_at; }
        if (bad < s->n_tokens) {
            bad_token(ds, s, bad, ds->is_bytes ? s->held[bad] : shard_tokens16(s)[bad], vocab, err, errlen);
            shard_unmap(ds, s);
            return -1;
        }
        shard_unmap(ds, s);   /* a scan reads each file once: none stays mapped */
    }
    return 0;
}

/* ---- the spec: a file, a glob, a list ------------------------------------- */

typedef struct Names {
    char **v;    /* [n] */
    int n, cap;
} Names;

static int names_add(Names *nm, const char *name) {
    if (nm->n == nm->cap) {
        int cap = nm->cap ? 2 * nm->cap : 16;
        char **v = realloc(nm->v, (size_t)cap * sizeof *v);
        if (!v) return -1;
        nm->v = v;
        nm->cap = cap;
    }
    if (!(nm->v[nm->n] = strdup(name))) return -1;
    nm->n++;
    return 0;
}

static void names_free(Names *nm) {
    for (int i = 0; i < nm->n; i++) free(nm->v[i]);
    free(nm->v);
}

static int name_cmp(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* One entry of a spec: a glob (it has * ? or [ and names no file) or a name. */
static int expand_one(Names *nm, const char *item, const char *spec, char *err, size_t errlen) {
    struct stat st;
    if (!*item) {
        snprintf(err, errlen, "data spec '%s' has an empty name in its list", spec);
        return -1;
    }
    if (!strpbrk(item, "*?[") || lstat(item, &st) == 0) {
        if (names_add(nm, item) != 0) goto oom;
        return 0;
    }
    glob_t g;
    int rc = glob(item, 0, NULL, &g);
    if (rc == GLOB_NOMATCH) {
        snprintf(err, errlen, "data spec '%s': no file matches %s", spec, item);
        return -1;
    }
    if (rc != 0) {
        snprintf(err, errlen, "data spec '%s': cannot expand %s (%s)", spec, item,
                 rc == GLOB_NOSPACE ? "out of memory" : "a directory cannot be read");
        globfree(&g);
        return -1;
    }
    for (size_t i = 0; i < g.gl_pathc; i++)
        if (names_add(nm, g.gl_pathv[i]) != 0) { globfree(&g); goto oom; }
    globfree(&g);
    return 0;
oom:
    snprintf(err, errlen, "out of memory expanding data spec '%s'", spec);
    return -1;
}

/* The spec's file names, sorted, each once. */
static int expand_spec(Names *nm, const char *spec, char *err, size_t errlen) {
    struct stat st;
    memset(nm, 0, sizeof *nm);
    if (!strchr(spec, ',') || stat(spec, &st) == 0) {
        if (expand_one(nm, spec, spec, err, errlen) != 0) return -1;
    } else {
        char *copy = strdup(spec);
        if (!copy) { snprintf(err, errlen, "out of memory expanding data spec '%s'", spec); return -1; }
        int rc = 0;
        const char *p = copy;
        for (char *c = copy;; c++) {   /* split on commas, keeping empty items (an error) */
            if (*c != ',' && *c) continue;
            int end = !*c;
            *c = 0;
            if ((rc = expand_one(nm, p, spec, err, errlen)) != 0 || end) break;
            p = c + 1;
        }
        free(copy);
        if (rc != 0) return -1;
    }
    if (nm->n > 1) qsort(nm->v, (size_t)nm->n, sizeof *nm->v, name_cmp);
    for (int i = 1; i < nm->n; i++)
        if (!strcmp(nm->v[i], nm->v[i - 1])) {
            snprintf(err, errlen, "data spec '%s' names %s twice", spec, nm->v[i]);
            return -1;
        }
    return 0;
}

/* ---- loading -------------------------------------------------------------- */

/* After the shards are open: one kind of file, the totals, the scan. */
static int finish_load(DataSet *ds, const int *kinds, char *err, size_t errlen) {
    ds->is_bytes = kinds[0];
    for (int i = 0; i < ds->n_shards; i++) {
        if (kinds[i] != kinds[0]) {
            snprintf(err, errlen, "%s is %s but %s is %s: the shards of one spec are of one kind",
                     ds->shards[i].path, kinds[i] ? "a byte file" : "an llm.c token file", ds->shards[0].path,
                     kinds[0] ? "a byte file" : "an llm.c token file");
            return -1;
        }
        ds->n_tokens += ds->shards[i].n_tokens;
    }
    ds->max_token = -1;
    ds->order_epoch = -1;
    if (ds->n_tokens <= DATA_SCAN_MAX_TOKENS) {
        if (scan_all(ds, 0, err, errlen) != 0) return -1;
        ds->scanned = 1;
    }
    return 0;
}

int data_load(DataSet *ds, const char *spec, char *err, size_t errlen) {
    memset(ds, 0, sizeof *ds);
    Names nm;
    if (expand_spec(&nm, spec, err, errlen) != 0) { names_free(&nm); return -1; }
    ds->shards = calloc((size_t)nm.n, sizeof *ds->shards);
    int *kinds = calloc((size_t)nm.n, sizeof *kinds);
    if (!ds->shards || !kinds) {
        free(kinds);
        names_free(&nm);
        snprintf(err, errlen, "out of memory opening the %d files of %s", nm.n, spec);
        return -1;
    }
    int rc = 0;
    for (int i = 0; i < nm.n && rc == 0; i++) {
        ds->n_shards = i + 1;   /* what data_free frees */
        rc = shard_open(&ds->shards[i], nm.v[i], &kinds[i], err, errlen);
    }
    names_free(&nm);
    if (rc == 0) rc = finish_load(ds, kinds, err, errlen);
    free(kinds);
    if (rc != 0) data_free(ds);
    return rc;
}

int data_parse(DataSet *ds, const char *path, const unsigned char *buf, size_t size, char *err, size_t errlen) {
    memset(ds, 0, sizeof *ds);
    ds->shards = calloc(1, sizeof *ds->shards);
    unsigned char *copy = malloc(size + 1);
    if (!ds->shards || !copy || !(ds->shards[0].path = strdup(path))) {
        free(copy);
        data_free(ds);
        snprintf(err, errlen, "%s: out of memory", path);
        return -1;
    }
    ds->n_shards = 1;
    ds->shards[0].fd = -1;
    memcpy(copy, buf, size);
    int kind = 0;
    int rc = shard_hold(&ds->shards[0], copy, size, &kind, err, errlen);
    if (rc == 0) rc = finish_load(ds, &kind, err, errlen);
    if (rc != 0) data_free(ds);
    return rc;
}

int data_check_vocab(DataSet *ds, int vocab, char *err, size_t errlen) {
    ds->vocab = vocab;
    if (ds->scanned && ds->max_token >= vocab) {
        bad_token(ds, &ds->shards[ds->max_shard], ds->max_at, ds->max_token, vocab, err, errlen);
        return -1;
    }
    return 0;
}

int data_scan(DataSet *ds, int vocab, int *max_token, char *err, size_t errlen) {
    int rc = scan_all(ds, vocab, err, errlen);
    if (max_token) *max_token = ds->max_token;
    return rc;
}

/* ---- the order ------------------------------------------------------------ */

static uint64_t mix64(uint64_t z) {   /* splitmix64's finalizer, after its increment */
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* The key of epoch e's permutation of one shard's sequences (shard >= 0) or
 * of the shards (shard -1). */
static uint64_t perm_key(uint64_t seed, long epoch, int shard) {
    return mix64(mix64(mix64(seed ^ 0x5eed5eedULL) + (uint64_t)epoch) + (uint64_t)(shard + 1));
}

/* Entry i of a permutation of [0, n) keyed by key: a 4-round Feistel
 * network on 2^(2h) >= n values, walked until it lands below n. */
static uint64_t permute(uint64_t i, uint64_t n, uint64_t key) {
    if (n <= 1) return 0;
    int h = 1;
    while (h < 32 && (1ULL << (2 * h)) < n) h++;
    uint64_t mask = (1ULL << h) - 1;
    do {
        uint64_t l = i >> h, r = i & mask;
        for (uint64_t round = 0; round < 4; round++) {
            uint64_t f = mix64(r ^ (key + round * 0x632be59bd9b4e019ULL)) & mask;
            uint64_t t = l ^ f;
            l = r;
            r = t;
        }
        i = (l << h) | r;
    } while (i >= n);
    return i;
}

/* order[] and order_first[] for epoch e (once, without shuffle). */
static void set_epoch(DataSet *ds, long e) {
    if (ds->order_epoch == e || (!ds->shuffle && ds->order_epoch >= 0)) return;
    uint64_t key = perm_key(ds->seed, e, -1);
    ds->order_first[0] = 0;
    for (int k = 0; k < ds->n_shards; k++) {
        ds->order[k] = ds->shuffle ? (int)permute((uint64_t)k, (uint64_t)ds->n_shards, key) : k;
        ds->order_first[k + 1] = ds->order_first[k] + ds->shards[ds->order[k]].n_seqs;
    }
    ds->order_epoch = e;
}

static DataPos locate(DataSet *ds, uint64_t g) {
    DataPos p;
    p.epoch = (long)(g / ds->n_seqs);
    size_t r = (size_t)(g % ds->n_seqs);
    set_epoch(ds, p.epoch);
    int lo = 0, hi = ds->n_shards - 1;   /* the k with order_first[k] <= r < order_first[k + 1] */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (ds->order_first[mid] <= r) lo = mid; else hi = mid - 1;
    }
    p.shard_rank = lo;
    p.shard = ds->order[lo];
    p.taken = r - ds->order_first[lo];
    p.seq = ds->shuffle ? (size_t)permute(p.taken, ds->shards[p.shard].n_seqs, perm_key(ds->seed, p.epoch, p.shard))
                        : p.taken;
    return p;
}

int data_prepare(DataSet *ds, const char *path, int T, int shuffle, uint64_t seed, char *err, size_t errlen) {
    if (T < 1) {
        snprintf(err, errlen, "%s: sequence length %d, expected at least 1", path, T);
        return -1;
    }
    ds->n_seqs = 0;
    for (int i = 0; i < ds->n_shards; i++) {
        DataShard *s = &ds->shards[i];
        if (s->n_tokens < (size_t)T + 1) {
            snprintf(err, errlen, "%s has %zu tokens, fewer than --seq %d + 1", s->path, s->n_tokens, T);
            return -1;
        }
        s->n_seqs = (s->n_tokens - 1) / (size_t)T;
        ds->n_seqs += s->n_seqs;
    }
    if (!ds->n_shards) {
        snprintf(err, errlen, "%s holds no data", path);
        return -1;
    }
    ds->T = T;
    ds->shuffle = shuffle;
    ds->seed = seed;
    ds->order_epoch = -1;
    free(ds->order);
    free(ds->order_first);
    ds->order = safe_malloc((size_t)ds->n_shards * sizeof *ds->order, "the shard order");
    ds->order_first = safe_malloc(((size_t)ds->n_shards + 1) * sizeof *ds->order_first, "the shard order");
    return 0;
}

DataPos data_position(DataSet *ds, long step, int G, int j) {
    return locate(ds, (uint64_t)step * (uint64_t)G + (uint64_t)j);
}

int data_batch(DataSet *ds, long step, int G, int j0, int count, int *inputs, int *targets, char *err,
               size_t errlen) {
    int T = ds->T, checked = -1;
    ds->clock++;
    for (int i = 0; i < count; i++) {
        DataPos p = locate(ds, (uint64_t)step * (uint64_t)G + (uint64_t)(j0 + i));
        if (shard_use(ds, p.shard, p.shard != checked, err, errlen) != 0) return -1;
        checked = p.shard;
        const DataShard *s = &ds->shards[p.shard];
        size_t off = p.seq * (size_t)T;
        int *in = inputs + (size_t)i * T, *tg = targets + (size_t)i * T;
        if (ds->is_bytes) {
            const unsigned char *src = s->held + off;
            for (int t = 0; t < T; t++) { in[t] = src[t]; tg[t] = src[t + 1]; }
        } else {
            const uint16_t *src = shard_tokens16(s) + off;
            for (int t = 0; t < T; t++) { in[t] = src[t]; tg[t] = src[t + 1]; }
        }
        if (!ds->scanned && ds->vocab > 0) {   /* the ids of a file too large to scan first */
            int max = -1;
            size_t at = 0, bad = shard_find(ds, s, off, off + (size_t)T + 1, ds->vocab, &max, &at);
            if (bad < off + (size_t)T + 1) {
                bad_token(ds, s, bad, ds->is_bytes ? s->held[bad] : shard_tokens16(s)[bad], ds->vocab, err, errlen);
                return -1;
            }
        }
    }
    return 0;
}

/* ---- the shard list, for checkpoints and warnings --------------------------- */

static const char *base_name(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* name with bytes <= ' ', '%' and >= 0x7f as %XX, into out [outlen]
 * (3 * strlen + 1 holds all of it; a shorter out holds its beginning). */
static void escape_name(const char *name, char *out, size_t outlen) {
    size_t n = 0;
    for (const unsigned char *c = (const unsigned char *)name; *c && n + 4 <= outlen; c++) {
        if (*c <= ' ' || *c == '%' || *c >= 0x7f) n += (size_t)sprintf(out + n, "%%%02X", *c);
        else out[n++] = (char)*c;
    }
    if (outlen) out[n] = 0;
}

char *data_describe(const DataSet *ds) {
    size_t len = 64;
    for (int i = 0; i < ds->n_shards; i++) len += 64 + 3 * strlen(base_name(ds->shards[i].path)) + 4;
    char *out = safe_malloc(len, "the shard list"), *p = out;
    p += sprintf(p, "data_shards %d\n", ds->n_shards);
    for (int i = 0; i < ds->n_shards; i++) {
        p += sprintf(p, "data_shard %d %zu ", i, ds->shards[i].n_tokens);
        escape_name(base_name(ds->shards[i].path), p, 3 * strlen(base_name(ds->shards[i].path)) + 4);
        p += strlen(p);
        *p++ = '\n';
        *p = 0;
    }
    return out;
}

/* Shard i of a saved description: its tokens and escaped name (into name
 * [namelen]); *pp moves past the line. 0, or -1 when malformed. */
static int saved_shard(const char **pp, int i, size_t *tokens, char *name, size_t namelen) {
    int idx, used = 0;
    if (sscanf(*pp, "data_shard %d %zu %n", &idx, tokens, &used) != 2 || !used || idx != i) return -1;
    const char *s = *pp + used, *e = strchr(s, '\n');
    if (!e || e == s || (size_t)(e - s) >= namelen) return -1;
    memcpy(name, s, (size_t)(e - s));
    name[e - s] = 0;
    *pp = e + 1;
    return 0;
}

int data_compare(const char *saved, const DataSet *ds, char *msg, size_t msglen) {
    int n_old, used = 0;
    if (sscanf(saved, "data_shards %d\n%n", &n_old, &used) != 1 || !used || n_old < 0) {
        snprintf(msg, msglen, "the saved shard list is malformed (near: %.40s)", saved);
        return -1;
    }
    const char *p = saved + used;
    size_t old_total = 0, old_tokens = 0, first_tokens = 0;
    int first = -1;
    char old_name[4096], first_name[4096] = "", now[4096];
    for (int i = 0; i < n_old; i++) {
        if (saved_shard(&p, i, &old_tokens, old_name, sizeof old_name) != 0) {
            snprintf(msg, msglen, "the saved shard list is malformed at shard %d of %d", i, n_old);
            return -1;
        }
        old_total += old_tokens;
        if (first >= 0) continue;
        escape_name(base_name(i < ds->n_shards ? ds->shards[i].path : ""), now, sizeof now);
        if (i >= ds->n_shards || strcmp(now, old_name) || old_tokens != ds->shards[i].n_tokens) {
            first = i;
            first_tokens = old_tokens;
            snprintf(first_name, sizeof first_name, "%s", old_name);
        }
    }
    if (first < 0 && n_old == ds->n_shards) return 0;
    if (first < 0) first = n_old;
    char what[1024];
    if (first < n_old && first < ds->n_shards) {
        escape_name(base_name(ds->shards[first].path), now, sizeof now);
        snprintf(what, sizeof what, "shard %d was %.400s (%zu tokens), now %.400s (%zu tokens)", first, first_name,
                 first_tokens, now, ds->shards[first].n_tokens);
    } else if (first < n_old) {
        snprintf(what, sizeof what, "shard %d %.400s (%zu tokens) is gone", first, first_name, first_tokens);
    } else {
        escape_name(base_name(ds->shards[first].path), now, sizeof now);
        snprintf(what, sizeof what, "shard %d %.400s (%zu tokens) is new", first, now, ds->shards[first].n_tokens);
    }
    snprintf(msg, msglen, "the data differs from the checkpoint's: %d shards of %zu tokens then, %d of %zu now; %s",
             n_old, old_total, ds->n_shards, ds->n_tokens, what);
    return 1;
}

static int same_file(const DataShard *a, const DataShard *b) {
    if (a->ino || b->ino) return a->ino == b->ino && a->dev == b->dev;
    return !strcmp(a->path, b->path);
}

int data_overlap(const DataSet *train, const DataSet *val, char *msg, size_t msglen) {
    int n = 0;
    const char *first = NULL;
    for (int i = 0; i < train->n_shards; i++)
        for (int k = 0; k < val->n_shards; k++)
            if (same_file(&train->shards[i], &val->shards[k])) {
                if (!n) first = train->shards[i].path;
                n++;
                break;
            }
    if (n) snprintf(msg, msglen, "the training data and the validation data share %d file%s (%s%s)", n,
                    n > 1 ? "s" : "", first, n > 1 ? ", ..." : "");
    return n;
}

int data_bytes_note(const DataSet *ds, char *msg, size_t msglen) {
    int n = 0;
    const char *first = NULL;
    for (int i = 0; ds->is_bytes && i < ds->n_shards; i++) {
        size_t len = strlen(ds->shards[i].path);
        if (len < 4 || strcmp(ds->shards[i].path + len - 4, ".bin") != 0) continue;
        if (!n) first = ds->shards[i].path;
        n++;
    }
    if (n) snprintf(msg, msglen, "%s%s has no llm.c token header (magic %d): read as bytes, one token a byte", first,
                    n > 1 ? " (and other .bin files)" : "", TOKENS_MAGIC);
    return n > 0;
}

void data_free(DataSet *ds) {
    for (int i = 0; i < ds->n_shards; i++) {
        DataShard *s = &ds->shards[i];
        shard_unmap(ds, s);
        free(s->held);
        free(s->path);
    }
    free(ds->shards);
    free(ds->order);
    free(ds->order_first);
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
    if (safe_read_named(path, "tokenizer", HEADER_BYTES + 256 * (size_t)SAFE_MAX_VOCAB, &buf, &size, err, errlen) != 0)
        return -1;
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
