/* test/test_layout.c: layout.c's table of every tensor's tp cut and its walk
 * over a shard's runs, on a small model cut every way the program cuts it
 * (tp 1, 2, 3, 6; one stage, two stages, two stages of two chunks):
 *  - the runs of one rank cover its layout [0, num_params) exactly once;
 *  - over every rank of a layout, the runs that count (layout_counts) cover
 *    llm.c's order [0, gpt_total_params) exactly once, and each run lies in
 *    its own tensor's span there;
 *  - layout_piece_index agrees with the runs element for element;
 *  - layout_llmc_copy there and back: every rank's parameters are the right
 *    elements of the whole model, and the ranks' copies reassemble it;
 *  - Megatron's cuts by hand for tp 2, rank 1: qkvw's rows of heads 3..5 in
 *    each of q, k and v; attprojw's and fcprojw's right half of every row;
 *    fcw's lower half; wte's upper half of the vocabulary; ln1w whole.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "gpt.h"
#include "layout.h"

/* A rank's shard of layout (P stages of V chunks) x tp, built on dev. */
static void build(GPT *m, const GPTConfig *cfg, Dev *dev, int P, int V, int st, int tp, int r) {
    GPTShard s = gpt_whole(cfg);
    layout_stage_layers(cfg->layers, P, V, NULL, st, &s);
    s.has_embed = st == 0;
    s.has_head = st == P - 1;
    s.tp = tp;
    s.tp_rank = r;
    gpt_build(m, cfg, dev, &s);
}

/* One layout: every rank's runs, checked; returns the failures. */
static int layout(Checks *c, const GPTConfig *cfg, Dev *dev, int P, int V, int tp) {
    size_t total = gpt_total_params(cfg), bad = 0, runs = 0;
    float *whole = malloc(total * sizeof(float)), *back = malloc(total * sizeof(float));
    int *hits = calloc(total, sizeof(int));
    for (size_t g = 0; g < total; g++) whole[g] = (float)g, back[g] = -1.0f;
    for (int st = 0; st < P; st++)
        for (int r = 0; r < tp; r++) {
            GPT m;
            build(&m, cfg, dev, P, V, st, tp, r);
            int *local = calloc(m.num_params, sizeof(int));
            float *mine = malloc(m.num_params * sizeof(float));
            layout_llmc_copy(&m, mine, whole, 0);
            LayoutRuns w;
            LayoutRun run;
            for (layout_runs_start(&w, &m); layout_runs_next(&w, &run); runs++) {
                int i = run.tensor, gl = gpt_tensor_per_layer(i) ? gpt_layer_global(&m, run.layer) : 0;
                size_t lo = layout_global_offset(cfg, i, 0), hi = layout_global_offset(cfg, i + 1, 0);
                if (i == GPT_NTENSORS - 1) hi = total;
                if (run.global < lo || run.global + run.n > hi) bad++;
                size_t piece_l = run.local - gpt_tensor_offset(&m, i, run.layer);
                size_t piece_g = run.global - layout_global_offset(cfg, i, gl), len;
                if (layout_piece_index(&m, i, piece_l, &len) != piece_g || len != run.n) bad++;
                for (size_t k = 0; k < run.n; k++) {
                    local[run.local + k]++;
                    if (layout_counts(&m, i)) hits[run.global + k]++;
                    if (mine[run.local + k] != (float)(run.global + k)) bad++;
                }
            }
            for (size_t k = 0; k < m.num_params; k++) bad += local[k] != 1;
            layout_llmc_copy(&m, mine, back, 1);
            free(local);
            free(mine);
            gpt_free(&m);
        }
    size_t once = 0, same = 0;
    for (size_t g = 0; g < total; g++) once += hits[g] == 1, same += back[g] == whole[g];
    int ok = bad == 0 && once == total && same == total;
    check(c, ok, "shard runs", "pp %d x %d chunks, tp %d: %zu runs, %zu of %zu elements counted once, "
          "%zu reassembled, %zu mismatches", P, V, tp, runs, once, total, same, bad);
    free(whole);
    free(back);
    free(hits);
    return !ok;
}

/* The first global element of run b of tensor i (layer 0) on the shard. */
static size_t run_start(const GPT *m, int i, size_t b, size_t *n) {
    LayoutRuns w;
    LayoutRun r;
    size_t k = 0;
    for (layout_runs_start(&w, m); layout_runs_next(&w, &r);)
        if (r.tensor == i && r.layer == 0 && k++ == b) {
            *n = r.n;
            return r.global - layout_global_offset(&m->cfg, i, 0);
        }
    *n = 0;
    return (size_t)-1;
}

/* Megatron's cuts, written out by hand for tp 2, rank 1. */
static void by_hand(Checks *c, const GPTConfig *cfg, Dev *dev) {
    GPT m;
    build(&m, cfg, dev, 1, 1, 0, 2, 1);
    size_t C = cfg->dim, h = C / 2, n0, n1, n2;
    size_t q = run_start(&m, GPT_QKVW, 0, &n0), k = run_start(&m, GPT_QKVW, 1, &n1);
    size_t v = run_start(&m, GPT_QKVW, 2, &n2);
    check(c, q == h * C && k == (C + h) * C && v == (2 * C + h) * C && n0 == h * C && n1 == n0 && n2 == n0,
          "qkvw, tp 2 rank 1", "its heads' rows of q, k, v start at rows %zu, %zu, %zu (want %zu, %zu, %zu)",
          q / C, k / C, v / C, h, C + h, 2 * C + h);
    size_t a0 = run_start(&m, GPT_ATTPROJW, 0, &n0), a1 = run_start(&m, GPT_ATTPROJW, 1, &n1);
    check(c, a0 == h && a1 == C + h && n0 == h && layout_cut(GPT_ATTPROJW) == LAYOUT_COLUMNS,
          "attprojw, tp 2 rank 1", "columns [%zu, %zu) of row 0, row 1 from %zu", a0, a0 + n0, a1);
    size_t p1 = run_start(&m, GPT_FCPROJW, 1, &n1);
    check(c, p1 == 4 * C + 2 * C && n1 == 2 * C, "fcprojw, tp 2 rank 1",
          "row 1's hidden units [%zu, %zu) of %zu", p1 - 4 * C, p1 - 4 * C + n1, 4 * C);
    size_t f = run_start(&m, GPT_FCW, 0, &n0);
    check(c, f == 2 * C * C && n0 == 2 * C * C, "fcw, tp 2 rank 1", "rows [%zu, %zu) of %zu", f / C,
          (f + n0) / C, 4 * C);
    size_t e = run_start(&m, GPT_WTE, 0, &n0), Vp = cfg->padded_vocab;
    check(c, e == Vp / 2 * C && n0 == Vp / 2 * C, "wte, tp 2 rank 1", "vocabulary rows [%zu, %zu) of %zu",
          e / C, (e + n0) / C, Vp);
    size_t l = run_start(&m, GPT_LN1W, 0, &n0);
    check(c, l == 0 && n0 == C && layout_replicated(2, GPT_LN1W) && !layout_counts(&m, GPT_LN1W),
          "ln1w, tp 2 rank 1", "whole (%zu of %zu), not counted on rank 1", n0, C);
    gpt_free(&m);
}

int main(void) {
    Checks c = {0};
    char err[256];
    Dev dev;
    if (dev_open(&dev, DEV_CPU, 0, err, sizeof err) != 0) {
        check(&c, 0, "cpu device", "%s", err);
        return check_done(&c);
    }
    GPTConfig cfg = {.max_seq = 8, .vocab = 90, .padded_vocab = 96, .layers = 4, .heads = 6, .dim = 24};
    const int tps[] = {1, 2, 3, 6};
    for (int t = 0; t < 4; t++) {
        layout(&c, &cfg, &dev, 1, 1, tps[t]);
        layout(&c, &cfg, &dev, 2, 1, tps[t]);
        layout(&c, &cfg, &dev, 2, 2, tps[t]);
    }
    by_hand(&c, &cfg, &dev);
    dev_close(&dev);
    return check_done(&c);
}
