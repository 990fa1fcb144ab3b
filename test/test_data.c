/* test/test_data.c: data.c's shards and order, and eval.c's HellaSwag file.
 *
 * Fixtures are written at run time into test/out/data/ (a few KB each):
 *  - one shard named through a glob gives the same batches as the file
 *    named directly, and both follow the rule of one file: sequence j of
 *    step s starts at token ((s*G + j) mod n) * T (a token file and a
 *    byte file);
 *  - three shards of unequal sizes, through a glob and through a list out
 *    of order: every (step, j) over three epochs is the concatenation rule
 *    (shards in name order, (len - 1) / T sequences each, none straddling),
 *    and any split of a batch among ranks gives the same rows;
 *  - --shuffle: each epoch visits every sequence of every shard once, a
 *    shard's sequences together, in an order that changes with the epoch
 *    and the seed, the same on a reload and on any split (a pure function);
 *  - position, describe/compare, the train/val overlap, at most two files
 *    mapped however many shards are read;
 *  - hostile shards and eval files: each gives one line naming the file;
 *  - the HellaSwag rows of a handcrafted example and llm.c's scoring rule.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"
#include "data.h"
#include "eval.h"

#define DIR "test/out/data"

/* ---- fixtures ---------------------------------------------------------------- */

static void write_tokens(const char *path, const uint16_t *tok, size_t n, int32_t magic, int32_t version,
                         int32_t count) {
    int32_t h[256] = {magic, version, count};
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); exit(1); }
    fwrite(h, 4, 256, f);
    fwrite(tok, 2, n, f);
    fclose(f);
}

static uint16_t *random_tokens(size_t n, int vocab, unsigned long long seed) {
    uint16_t *t = check_xmalloc(n * 2);
    for (size_t i = 0; i < n; i++) t[i] = (uint16_t)((check_urand(&seed) + 1.0f) * 0.5f * (vocab - 1));
    return t;
}

/* One error line: non-empty, no newline, naming want. */
static int one_line(const char *err, const char *want) {
    return *err && !strchr(err, '\n') && strstr(err, want) != NULL;
}

/* The rule of one shard, shards in order: global sequence g of the shards
 * (tok[k], len[k]) without shuffle; 1 when rows in/tg [T] match it. */
static int rule_row(uint16_t *const *tok, const size_t *len, int nsh, int T, unsigned long long g, const int *in,
                    const int *tg) {
    size_t total = 0;
    for (int k = 0; k < nsh; k++) total += (len[k] - 1) / T;
    size_t r = (size_t)(g % total);
    int k = 0;
    while (r >= (len[k] - 1) / T) r -= (len[k] - 1) / T, k++;
    for (int t = 0; t < T; t++)
        if (in[t] != tok[k][r * T + t] || tg[t] != tok[k][r * T + t + 1]) return 0;
    return 1;
}

/* ---- one shard ------------------------------------------------------------------ */

static void test_one_shard(Checks *c) {
    char err[512];
    const size_t n = 5003;
    const int T = 16, G = 6;
    uint16_t *tok = random_tokens(n, 1000, 1);
    mkdir(DIR "/one", 0755);
    write_tokens(DIR "/one/tok_000000.bin", tok, n, 20240520, 1, (int32_t)n);
    DataSet a, b;
    int ok = data_load(&a, DIR "/one/tok_000000.bin", err, sizeof err) == 0 &&
             data_prepare(&a, "a", T, 0, 0, err, sizeof err) == 0 &&
             data_load(&b, DIR "/one/tok_*.bin", err, sizeof err) == 0 &&
             data_prepare(&b, "b", T, 0, 0, err, sizeof err) == 0;
    if (!check(c, ok, "one shard: loads by name and by glob", "%s", ok ? "both" : err)) return;
    int ia[6 * 16], ta[6 * 16], ib[6 * 16], tb[6 * 16], same = 1, rule = 1;
    long steps = (long)(a.n_seqs / G) * 3 + 2;   /* three epochs and a bit */
    for (long s = 0; s < steps; s++) {
        if (data_batch(&a, s, G, 0, G, ia, ta, err, sizeof err) != 0 ||
            data_batch(&b, s, G, 0, G, ib, tb, err, sizeof err) != 0) { same = 0; break; }
        same &= !memcmp(ia, ib, sizeof ia) && !memcmp(ta, tb, sizeof ta);
        for (int j = 0; j < G; j++) {   /* today's rule, word for word */
            size_t start = ((size_t)s * G + j) % a.n_seqs * T;
            for (int t = 0; t < T; t++)
                rule &= ia[j * T + t] == tok[start + t] && ta[j * T + t] == tok[start + t + 1];
        }
    }
    check(c, same, "one shard: a glob gives the batches of the file named", "%ld steps of %d x %d", steps, G, T);
    check(c, rule, "one shard: sequence j of step s starts at ((s*G + j) mod n) * T", "n = %zu sequences", a.n_seqs);
    check(c, a.scanned && a.max_token == b.max_token, "one shard: scanned at load", "max id %d", a.max_token);
    data_free(&a);
    data_free(&b);

    /* a byte file: the same rule, one byte a token */
    FILE *f = fopen(DIR "/text.txt", "wb");
    for (int i = 0; i < 1000; i++) fputc("To be, or not to be"[i % 19], f);
    fclose(f);
    ok = data_load(&a, DIR "/text.txt", err, sizeof err) == 0 && data_prepare(&a, "t", 8, 0, 0, err, sizeof err) == 0;
    int ok2 = ok && a.is_bytes && a.n_seqs == 999 / 8;
    for (long s = 0; ok2 && s < 200; s++) {
        if (data_batch(&a, s, 3, 1, 2, ia, ta, err, sizeof err) != 0) { ok2 = 0; break; }
        for (int j = 0; j < 2; j++)
            for (int t = 0; t < 8; t++) {
                size_t at = ((size_t)s * 3 + 1 + j) % a.n_seqs * 8 + t;
                ok2 &= ia[j * 8 + t] == "To be, or not to be"[at % 19] && ta[j * 8 + t] == "To be, or not to be"[(at + 1) % 19];
            }
    }
    check(c, ok2, "byte file: read whole, the rule of one file", "%s", ok ? "200 steps" : err);
    if (ok) data_free(&a);
    free(tok);
}

/* ---- several shards ---------------------------------------------------------------- */

#define NSH 3
static const size_t SH_LEN[NSH] = {1000, 1537, 801};

static void write_shards(uint16_t **tok) {
    char path[256];
    mkdir(DIR "/many", 0755);
    for (int k = 0; k < NSH; k++) {
        tok[k] = random_tokens(SH_LEN[k], 50257, 100 + k);
        snprintf(path, sizeof path, DIR "/many/train_%06d.bin", k);
        write_tokens(path, tok[k], SH_LEN[k], 20240520, 1, (int32_t)SH_LEN[k]);
    }
}

static void test_shards(Checks *c, uint16_t **tok) {
    char err[512];
    const int T = 16, G = 8;
    DataSet a, b;
    const char *list = DIR "/many/train_000002.bin," DIR "/many/train_000000.bin," DIR "/many/train_000001.bin";
    int ok = data_load(&a, DIR "/many/train_*.bin", err, sizeof err) == 0 &&
             data_prepare(&a, "a", T, 0, 0, err, sizeof err) == 0 &&
             data_load(&b, list, err, sizeof err) == 0 && data_prepare(&b, "b", T, 0, 0, err, sizeof err) == 0;
    if (!check(c, ok, "shards: a glob and a list load", "%s", ok ? "3 shards each" : err)) return;
    size_t want = 0;
    for (int k = 0; k < NSH; k++) want += (SH_LEN[k] - 1) / T;
    int sorted = a.n_shards == NSH && b.n_shards == NSH;
    for (int k = 0; sorted && k < NSH; k++) sorted &= !strcmp(a.shards[k].path, b.shards[k].path);
    check(c, sorted && a.n_seqs == want, "shards: sorted by name, (len - 1) / T sequences each",
          "%zu sequences, want %zu (%s first)", a.n_seqs, want, a.shards[0].path);
    int full_in[8 * 16], full_tg[8 * 16], in[8 * 16], tg[8 * 16];
    int rule = 1, split = 1, nrows = 0;
    long steps = (long)(want / G) * 3 + 3;
    for (long s = 0; s < steps && rule; s++) {
        if (data_batch(&a, s, G, 0, G, full_in, full_tg, err, sizeof err) != 0) { rule = 0; break; }
        for (int j = 0; j < G; j++, nrows++)
            rule &= rule_row(tok, SH_LEN, NSH, T, (unsigned long long)s * G + j, full_in + j * T, full_tg + j * T);
        for (int parts = 2; parts <= 8; parts *= 2) {   /* a batch split among dp ranks and micro-batches */
            for (int p = 0; p < parts; p++) {
                int cnt = G / parts;
                if (data_batch(&b, s, G, p * cnt, cnt, in, tg, err, sizeof err) != 0) { split = 0; break; }
                split &= !memcmp(in, full_in + p * cnt * T, cnt * T * sizeof(int)) &&
                         !memcmp(tg, full_tg + p * cnt * T, cnt * T * sizeof(int));
            }
        }
    }
    check(c, rule, "shards: every (step, j) is the concatenation rule, no sequence straddling two files",
          "%d rows over %ld steps (3 epochs)", nrows, steps);
    check(c, split, "shards: a batch split 2, 4 and 8 ways gives the same rows", "%ld steps", steps);
    int mapped = a.n_mapped <= DATA_MAX_MAPPED && b.n_mapped <= DATA_MAX_MAPPED;
    check(c, mapped, "shards: at most DATA_MAX_MAPPED files mapped after reading them all",
          "%d and %d mapped of %d", a.n_mapped, b.n_mapped, NSH);
    /* the position of a step: epoch, shard, sequence */
    size_t n0 = (SH_LEN[0] - 1) / T, n1 = (SH_LEN[1] - 1) / T;
    DataPos p = data_position(&a, 0, G, 0), q = data_position(&a, (long)(want + n0 + 5) / 1, 1, 0);
    DataPos e = data_position(&a, 1, (int)(want + n0 + n1), 2);
    check(c, p.epoch == 0 && p.shard == 0 && p.seq == 0 && q.epoch == 1 && q.shard == 1 && q.seq == 5 &&
             e.epoch == 1 && e.shard == 2 && e.seq == 2,
          "shards: data_position", "(%ld,%d,%zu) (%ld,%d,%zu) (%ld,%d,%zu)", p.epoch, p.shard, p.seq, q.epoch,
          q.shard, q.seq, e.epoch, e.shard, e.seq);
    /* describe and compare */
    char *desc = data_describe(&a), msg[512];
    int same = data_compare(desc, &b, msg, sizeof msg) == 0;
    DataSet two;
    int diff = data_load(&two, DIR "/many/train_000000.bin," DIR "/many/train_000001.bin", err, sizeof err) == 0 &&
               data_compare(desc, &two, msg, sizeof msg) == 1 && one_line(msg, "train_000002.bin") &&
               strstr(msg, "gone");
    check(c, same && diff, "shards: the description compares equal, a shard gone is one line", "%s", msg);
    char *bad = strdup(desc);
    bad[strlen(bad) - 3] = '7';   /* the last name changed */
    char bad_msg[512];
    int mal = data_compare("garbage", &a, bad_msg, sizeof bad_msg) == -1;
    int ren = data_compare(bad, &a, msg, sizeof msg) == 1 && one_line(msg, "was");
    check(c, ren && mal, "shards: a renamed shard is one line; a malformed saved list is refused", "%s", msg);
    free(bad);
    free(desc);
    data_free(&two);
    /* --data matching --val */
    DataSet val;
    ok = data_load(&val, DIR "/many/train_000001.bin", err, sizeof err) == 0;
    int n = ok ? data_overlap(&a, &val, msg, sizeof msg) : -1;
    check(c, n == 1 && one_line(msg, "train_000001.bin"), "shards: --data sharing a --val file is found", "%s", msg);
    if (ok) data_free(&val);
    data_free(&a);
    data_free(&b);
}

/* ---- shuffle ----------------------------------------------------------------------------- */

/* Epoch e's visits under shuffle with seed: (shard, seq) of its N sequences
 * into sh, sq [N]; 1 when every row's tokens are its shard's at seq * T. */
static int epoch_visits(DataSet *ds, uint16_t **tok, int T, long e, int G, int *sh, size_t *sq, char *err,
                        size_t errlen) {
    size_t N = ds->n_seqs;
    int in[16], tg[16], ok = 1;
    for (size_t r = 0; r < N; r++) {
        unsigned long long g = (unsigned long long)e * N + r;
        long s = (long)(g / G);
        int j = (int)(g % G);
        DataPos p = data_position(ds, s, G, j);
        if (data_batch(ds, s, G, j, 1, in, tg, err, errlen) != 0) return 0;
        sh[r] = p.shard;
        sq[r] = p.seq;
        for (int t = 0; t < T; t++) ok &= in[t] == tok[p.shard][p.seq * T + t] && tg[t] == tok[p.shard][p.seq * T + t + 1];
    }
    return ok;
}

static void test_shuffle(Checks *c, uint16_t **tok) {
    char err[512];
    const int T = 16, G = 8;
    DataSet a, b, d;
    int ok = data_load(&a, DIR "/many/train_*.bin", err, sizeof err) == 0 &&
             data_prepare(&a, "a", T, 1, 42, err, sizeof err) == 0 &&
             data_load(&b, DIR "/many/train_*.bin", err, sizeof err) == 0 &&
             data_prepare(&b, "b", T, 1, 42, err, sizeof err) == 0 &&
             data_load(&d, DIR "/many/train_*.bin", err, sizeof err) == 0 &&
             data_prepare(&d, "d", T, 1, 43, err, sizeof err) == 0;
    if (!check(c, ok, "shuffle: loads", "%s", ok ? "3 shards" : err)) return;
    size_t N = a.n_seqs;
    int *sh[4];
    size_t *sq[4];
    for (int k = 0; k < 4; k++) { sh[k] = check_xmalloc(N * sizeof(int)); sq[k] = check_xmalloc(N * sizeof(size_t)); }
    int rows = 1, perm = 1, together = 1, shard_orders_differ = 0;
    for (long e = 0; e < 6; e++) {
        rows &= epoch_visits(&a, tok, T, e, G, sh[e & 1], sq[e & 1], err, sizeof err);
        char *seen = calloc(N, 1);
        for (size_t r = 0; r < N; r++) {
            size_t flat = sq[e & 1][r];
            for (int k = 0; k < sh[e & 1][r]; k++) flat += (SH_LEN[k] - 1) / T;
            perm &= !seen[flat];
            seen[flat] = 1;
            if (r && sh[e & 1][r] != sh[e & 1][r - 1])   /* a shard, once left, is not seen again this epoch */
                for (size_t q = 0; q + 1 < r; q++) together &= sh[e & 1][q] != sh[e & 1][r];
        }
        free(seen);
        if (e && (sh[0][0] != sh[1][0] || sh[0][N - 1] != sh[1][N - 1])) shard_orders_differ = 1;
    }
    check(c, rows && perm, "shuffle: each epoch is a permutation of every shard's sequences",
          "6 epochs of %zu sequences, rows read from their shard", N);
    check(c, together && shard_orders_differ, "shuffle: a shard's sequences are read together; the shard order "
          "changes between epochs", "%s", shard_orders_differ ? "yes" : "never changed");
    epoch_visits(&a, tok, T, 0, G, sh[0], sq[0], err, sizeof err);
    epoch_visits(&a, tok, T, 1, G, sh[1], sq[1], err, sizeof err);
    epoch_visits(&b, tok, T, 0, 4, sh[2], sq[2], err, sizeof err);   /* a fresh load, another G */
    int moved = 0, pure = !memcmp(sh[0], sh[2], N * sizeof(int)) && !memcmp(sq[0], sq[2], N * sizeof(size_t));
    for (size_t r = 0; r < N; r++) moved += sh[0][r] == sh[1][r] && sq[0][r] != sq[1][r];
    check(c, pure, "shuffle: a pure function of (global sequence, shards, T, seed)", "a reload, G 4 against 8");
    check(c, moved > 0, "shuffle: the sequences of a shard are permuted anew each epoch",
          "%d of %zu places differ between epochs 0 and 1 within the same shard", moved, N);
    epoch_visits(&d, tok, T, 0, G, sh[3], sq[3], err, sizeof err);
    int differ = 0;
    for (size_t r = 0; r < N; r++) differ += sh[0][r] != sh[3][r] || sq[0][r] != sq[3][r];
    check(c, differ > 0, "shuffle: another seed, another order", "%d of %zu places differ", differ, N);
    /* with one shard the contract's unshuffled rule is untouched by --shuffle's existence: covered above */
    for (int k = 0; k < 4; k++) { free(sh[k]); free(sq[k]); }
    data_free(&a);
    data_free(&b);
    data_free(&d);
}

/* ---- hostile shards ------------------------------------------------------------------------ */

static int load_fails(const char *spec, int T, const char *want, char *err, size_t errlen) {
    DataSet ds;
    if (data_load(&ds, spec, err, errlen) != 0) return one_line(err, want);
    int rc = data_prepare(&ds, spec, T, 0, 0, err, errlen);
    data_free(&ds);
    return rc != 0 && one_line(err, want);
}

static void test_hostile_shards(Checks *c, uint16_t **tok) {
    char err[512];
    uint16_t t[64];
    for (int i = 0; i < 64; i++) t[i] = (uint16_t)i;
    mkdir(DIR "/bad", 0755);
    mkdir(DIR "/bad/adir", 0755);
    write_tokens(DIR "/bad/trunc.bin", t, 50, 20240520, 1, 100);
    write_tokens(DIR "/bad/version.bin", t, 64, 20240520, 2, 64);
    write_tokens(DIR "/bad/short.bin", t, 10, 20240520, 1, 10);
    FILE *f = fopen(DIR "/bad/text.txt", "wb");
    fputs("plain text, one byte a token, beside token files", f);
    fclose(f);
    struct { const char *name, *spec, *want; } cases[] = {
        {"truncated token file", DIR "/bad/trunc.bin", "trunc.bin: truncated or corrupt token file: header says 100"},
        {"token file version 2", DIR "/bad/version.bin", "version.bin: token file version 2"},
        {"a glob matching nothing", DIR "/bad/nothing_*.bin", "no file matches " DIR "/bad/nothing_*.bin"},
        {"a directory", DIR "/bad/adir", "adir is a directory"},
        {"a glob matching a directory", DIR "/bad/adi?", "adir is a directory"},
        {"a missing file in a list", DIR "/many/train_000000.bin," DIR "/bad/missing.bin", "missing.bin"},
        {"an empty name in a list", DIR "/many/train_000000.bin,", "empty name"},
        {"a file named twice", DIR "/many/train_000000.bin," DIR "/many/train_00000[0].bin", "train_000000.bin twice"},
        {"a byte file among token files (wrong magic)", DIR "/many/train_000000.bin," DIR "/bad/text.txt",
         "text.txt is a byte file"},
        {"a shard shorter than T + 1 tokens", DIR "/many/train_000000.bin," DIR "/bad/short.bin",
         "short.bin has 10 tokens, fewer than --seq 16 + 1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char name[128];
        snprintf(name, sizeof name, "hostile shard: %s", cases[i].name);
        err[0] = 0;
        check(c, load_fails(cases[i].spec, 16, cases[i].want, err, sizeof err), name, "%s", err);
    }

    /* an id >= vocab: scanned at load (data_check_vocab), and per sequence beyond the scan's size */
    uint16_t *v = check_xmalloc(300 * 2);
    memcpy(v, tok[0], 300 * 2);
    v[100] = 50300;
    write_tokens(DIR "/bad/vocab.bin", v, 300, 20240520, 1, 300);
    free(v);
    DataSet ds;
    int ok = data_load(&ds, DIR "/bad/vocab.bin", err, sizeof err) == 0 &&
             data_prepare(&ds, "v", 16, 0, 0, err, sizeof err) == 0;
    int scanned = ok && ds.scanned && data_check_vocab(&ds, 50257, err, sizeof err) != 0 &&
                  one_line(err, "vocab.bin: token id 50300 >= vocab 50257 at token 100 (byte offset 1224)");
    check(c, scanned, "hostile shard: an id >= vocab, scanned at load", "%s", err);
    if (ok) {
        ds.scanned = 0;   /* as data_load leaves data above DATA_SCAN_MAX_TOKENS */
        ds.max_token = -1;
        data_check_vocab(&ds, 50257, err, sizeof err);
        int in[16 * 16], tg[16 * 16], fine = data_batch(&ds, 0, 16, 0, 6, in, tg, err, sizeof err) == 0;
        int per_seq = fine && data_batch(&ds, 0, 16, 0, 7, in, tg, err, sizeof err) != 0 &&
                      one_line(err, "vocab.bin: token id 50300 >= vocab 50257 at token 100 (byte offset 1224)");
        check(c, per_seq, "hostile shard: an id >= vocab, checked as its sequence is read",
              "sequences 0-5 read, sequence 6 (tokens 96..112): %s", err);
        int max = 0;
        int scan = data_scan(&ds, 50257, &max, err, sizeof err) != 0 && one_line(err, "at token 100");
        check(c, scan, "hostile shard: data_scan (--check-data) finds it", "%s", err);
        data_free(&ds);
    }

    /* a shard that shrinks while mapped, and one replaced between load and use */
    write_tokens(DIR "/bad/shrink.bin", tok[1], SH_LEN[1], 20240520, 1, (int32_t)SH_LEN[1]);
    ok = data_load(&ds, DIR "/bad/shrink.bin", err, sizeof err) == 0 &&
         data_prepare(&ds, "s", 16, 0, 0, err, sizeof err) == 0;
    if (ok) {
        int in[16], tg[16];
        int first = data_batch(&ds, 0, 1, 0, 1, in, tg, err, sizeof err) == 0;
        if (truncate(DIR "/bad/shrink.bin", 2048) != 0) perror("truncate");
        int later = data_batch(&ds, 90, 1, 0, 1, in, tg, err, sizeof err);
        check(c, first && later != 0 && one_line(err, "shrink.bin: token file shrank or changed while in use"),
              "hostile shard: a file that shrinks while mapped is one line, not SIGBUS", "%s", err);
        data_free(&ds);
    }
    write_tokens(DIR "/bad/replace.bin", tok[1], SH_LEN[1], 20240520, 1, (int32_t)SH_LEN[1]);
    ok = data_load(&ds, DIR "/bad/replace.bin", err, sizeof err) == 0 &&
         data_prepare(&ds, "r", 16, 0, 0, err, sizeof err) == 0;
    if (ok) {
        int in[16], tg[16];
        /* data_load's scan left it unmapped: the next batch maps it again */
        write_tokens(DIR "/bad/replace.bin", tok[1], 500, 20240520, 1, 500);
        int rc = data_batch(&ds, 0, 1, 0, 1, in, tg, err, sizeof err);
        check(c, rc != 0 && one_line(err, "replace.bin: token file changed since it was opened"),
              "hostile shard: a file changed between load and use is one line", "%s", err);
        data_free(&ds);
    }
}

/* ---- HellaSwag ------------------------------------------------------------------------------ */

typedef struct Ex { int label, ctx_len, ctx[8], end_len[4], end[4][8]; } Ex;

/* The examples as llm.c's hellaswag.py writes them, into words w [cap];
 * returns the count. */
static size_t eval_words(const Ex *ex, int n, uint16_t *w, int *longest) {
    size_t k = 0;
    *longest = 0;
    for (int i = 0; i < n; i++) {
        size_t start = k;
        w[k++] = 65535; w[k++] = 0; w[k++] = (uint16_t)i; w[k++] = (uint16_t)ex[i].label; w[k++] = 4;
        w[k++] = (uint16_t)ex[i].ctx_len;
        for (int t = 0; t < ex[i].ctx_len; t++) w[k++] = (uint16_t)ex[i].ctx[t];
        for (int c = 0; c < 4; c++) {
            w[k++] = (uint16_t)ex[i].end_len[c];
            for (int t = 0; t < ex[i].end_len[c]; t++) w[k++] = (uint16_t)ex[i].end[c][t];
        }
        w[start + 1] = (uint16_t)(2 * (k - start));
        if (2 * (int)(k - start) > *longest) *longest = 2 * (int)(k - start);
    }
    return k;
}

static void write_eval(const char *path, const int32_t *h, const uint16_t *w, size_t n) {
    int32_t head[256] = {0};
    memcpy(head, h, 4 * sizeof(int32_t));
    FILE *f = fopen(path, "wb");
    fwrite(head, 4, 256, f);
    fwrite(w, 2, n, f);
    fclose(f);
}

static const Ex EXAMPLES[3] = {
    {2, 3, {50256, 17, 4}, {1, 2, 3, 1}, {{5}, {6, 7}, {8, 9, 10}, {11}}},
    {0, 1, {3}, {2, 1, 1, 4}, {{1, 2}, {50256}, {0}, {12, 13, 14, 15}}},
    {3, 5, {1, 2, 3, 4, 5}, {2, 2, 2, 2}, {{6, 7}, {8, 9}, {10, 11}, {12, 13}}},
};

static void test_eval(Checks *c) {
    char err[512];
    uint16_t w[512];
    int longest;
    size_t n = eval_words(EXAMPLES, 3, w, &longest);
    int32_t h[4] = {20240522, 1, 3, longest};
    write_eval(DIR "/eval.bin", h, w, n);
    EvalSet es;
    int ok = eval_load(&es, DIR "/eval.bin", 50257, err, sizeof err) == 0;
    if (!check(c, ok, "hellaswag: a valid file loads", "%s", ok ? "3 examples" : err)) return;
    check(c, es.n == 3 && es.ex[1].label == 0 && es.ex[2].ctx_len == 5 && es.ex[0].end_len[2] == 3 &&
             es.ex[1].end[3][3] == 15 && es.max_tokens == 7 && eval_example_tokens(&es, 0) == 6,
          "hellaswag: examples as written", "max tokens %d (example 2: 5 + 2)", es.max_tokens);

    /* the rows of example 0 at T 8: context 50256 17 4, completion 2 = 8 9 10 */
    int T = 8, in[4 * 8], tg[4 * 8], from[4], to[4];
    int fits = eval_rows(&es, 0, T, in, tg, from, to) == 0;
    int row_in[8] = {50256, 17, 4, 8, 9, 10, 0, 0}, row_tg[8] = {17, 4, 8, 9, 10, 0, 0, 0};
    int rows = fits && !memcmp(in + 2 * T, row_in, sizeof row_in) && !memcmp(tg + 2 * T, row_tg, sizeof row_tg) &&
               from[2] == 2 && to[2] == 5 && from[1] == 2 && to[1] == 4 && in[1 * T + 4] == 7;
    check(c, rows, "hellaswag: rows are context then completion, scored over [ctx_len-1, ctx_len+len-1)",
          "row 2 scored over [%d, %d)", from[2], to[2]);
    check(c, eval_rows(&es, 0, 5, in, tg, from, to) == -1, "hellaswag: an example longer than T is refused",
          "example 0 needs 6 tokens, T 5");

    /* the scoring rule on handcrafted losses: means 2.0, 1.5, 1.0 + 0.1, 3.0 over each completion */
    float loss[4 * 8];
    for (int k = 0; k < 4 * 8; k++) loss[k] = 100.0f;   /* outside the scored positions: ignored */
    eval_rows(&es, 0, T, in, tg, from, to);
    loss[0 * T + 2] = 2.0f;
    loss[1 * T + 2] = 1.0f; loss[1 * T + 3] = 2.0f;
    loss[2 * T + 2] = 0.3f; loss[2 * T + 3] = 0.3f; loss[2 * T + 4] = 2.7f;
    loss[3 * T + 2] = 3.0f;
    double mean[4];
    int pick = eval_choose(loss, T, from, to, mean);
    check(c, pick == 2 && pick == es.ex[0].label && mean[1] == 1.5 && fabs(mean[2] - 1.1) < 1e-6,
          "hellaswag: the lowest mean loss over the completion wins", "chose %d (means %.2f %.2f %.2f %.2f)", pick,
          mean[0], mean[1], mean[2], mean[3]);
    loss[2 * T + 2] = loss[2 * T + 3] = loss[2 * T + 4] = 0.5f;   /* completions 2 and 3 tie at 0.5 */
    loss[3 * T + 2] = 0.5f;
    pick = eval_choose(loss, T, from, to, mean);
    check(c, pick == 2 && mean[2] == mean[3], "hellaswag: of equal means the first wins", "chose %d (%.9f, %.9f)",
          pick, mean[2], mean[3]);
    int lo, hi, cover = 1, next = 0;
    for (int r = 0; r < 3; r++) { eval_range(10, r, 3, &lo, &hi); cover &= lo == next && hi >= lo; next = hi; }
    check(c, cover && next == 10, "hellaswag: eval_range splits the examples among ranks", "10 over 3 ranks");
    eval_free(&es);

    /* hostile files: each one line naming the file */
    struct { const char *name; int mutate; const char *want; } cases[] = {
        {"truncated", 1, "truncated at example 2"},
        {"wrong magic", 2, "not an llm.c eval file (magic 20240520"},
        {"label out of range", 3, "label 4, expected 0..3"},
        {"length out of range", 4, "context 0's length 200"},
        {"index out of order", 5, "has index 2, expected 1"},
        {"token beyond the vocabulary", 6, "token id 50300 >= vocab 50257"},
        {"completions not 4", 7, "3 completions, expected 4"},
        {"bytes left over", 8, "2 bytes after its 3 examples"},
        {"more examples than the file holds", 9, "header says 1000 examples"},
        {"a completion of length 0", 10, "completion 1's length 0"},
        {"version 2", 11, "eval file version 2"},
        {"an example longer than the header's longest", 12, "more than the header's longest 30"},
    };
    size_t e1 = w[1] / 2;   /* example 0's words: example 1 starts at w[e1] */
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint16_t m[512];
        memcpy(m, w, n * 2);
        int32_t hh[4] = {20240522, 1, 3, longest};
        size_t nn = n;
        switch (cases[i].mutate) {
        case 1: nn = n - 3; break;
        case 2: hh[0] = 20240520; break;
        case 3: m[3] = 4; break;
        case 4: m[5] = 200; break;
        case 5: m[e1 + 2] = 2; break;
        case 6: m[e1 + 6] = 50300; break;
        case 7: m[4] = 3; break;
        case 8: m[n] = 7; nn = n + 1; break;
        case 9: hh[2] = 1000; break;
        case 10: m[e1 + 10] = 0; break;   /* example 1: 6 words, 1 of context, 3 of completion 0 */
        case 11: hh[1] = 2; break;
        case 12: hh[3] = 30; break;
        }
        write_eval(DIR "/bad_eval.bin", hh, m, nn);
        char name[128];
        snprintf(name, sizeof name, "hostile eval file: %s", cases[i].name);
        err[0] = 0;
        int failed = eval_load(&es, DIR "/bad_eval.bin", 50257, err, sizeof err) != 0;
        check(c, failed && one_line(err, DIR "/bad_eval.bin") && strstr(err, cases[i].want), name, "%s", err);
    }
    err[0] = 0;
    int dir = eval_load(&es, DIR "/bad/adir", 50257, err, sizeof err) != 0 && one_line(err, "adir is a directory");
    check(c, dir, "hostile eval file: a directory", "%s", err);
}

int main(void) {
    Checks c = {0};
    mkdir("test/out", 0755);
    mkdir(DIR, 0755);
    uint16_t *tok[NSH];
    write_shards(tok);
    test_one_shard(&c);
    test_shards(&c, tok);
    test_shuffle(&c, tok);
    test_hostile_shards(&c, tok);
    test_eval(&c);
    for (int k = 0; k < NSH; k++) free(tok[k]);
    printf("test_data: %d passed, %d failed\n", c.passed, c.failed);
    return check_done(&c);
}
