/* layout.c: the parallel layout's rules and a stage's shard (layout.h; 混合并行,
 * the hybrid-parallelism article's DP+PP+TP+ZeRO).
 *
 * Every rule a layout must satisfy lives in layout_check, each with its one
 * line: the flags' layout (setup.c, before a rank exists), the planner's
 * candidates (plan.c, quietly) and a checkpoint's manifest (checkpoint.c)
 * all pass through it, so train never plans a layout it refuses, and never
 * reads a checkpoint of a layout it could not have written. The rules, in
 * the order a reader meets them in the article:
 *
 *   data parallelism   the parameter server keeps the whole optimizer: no ZeRO
 *   the mesh           dp x cp x tp x pp = the ranks (comm.c's comm_mesh_shape)
 *   context parallel   2 cp divides the sequence (cp.c deals it in 2 cp chunks)
 *   the pipeline       the schedule's own rules (pp_schedule_check); V chunks need 2+ stages
 *   the step           B x T x M x dp tokens fit an int
 *   tensor parallelism tp divides the heads, the MLP's 4C columns and the padded
 *                      vocabulary; with sp, the tokens of a micro-batch and the sequence
 *                      that a rank holds (1/cp of each)
 *   the stages         --stage-layers gives P (or P x V) ranges adding up to the layers;
 *                      else P <= L, and P x V divides L when V > 1
 *
 * layout_stage_shard is the other half: what stage `stage` of a layout
 * holds (its layers, its tp slice, the embedding on the first stage, the
 * head on the last, a split backward under the zero-bubble schedules),
 * built here once for the model (main.c) and the planner (plan.c).
 */
#include <stdio.h>
#include "layout.h"
#include "cp.h"
#include "safe.h"

/* Megatron's split (tp.c): heads, the MLP's columns and the vocabulary's
 * rows are cut into tp slices; sequence parallelism cuts a micro-batch's
 * tokens (and, for sampling, one sequence) the same way. */
static int check_tp(const Layout *l, const GPTConfig *cfg, char *err, size_t errlen) {
    int tp = l->tp;
    if (tp == 1) return 0;
    if (cfg->heads % tp) return safe_fail(err, errlen, "--tp %d does not divide %d heads", tp, cfg->heads);
    if ((4 * cfg->dim) % tp)
        return safe_fail(err, errlen, "--tp %d does not divide the MLP's %d columns (4C)", tp, 4 * cfg->dim);
    if (cfg->padded_vocab % tp)
        return safe_fail(err, errlen, "--tp %d does not divide the padded vocabulary %d", tp, cfg->padded_vocab);
    int T = l->seq / l->cp;   /* the tokens of a sequence a rank holds */
    if (l->sp && ((long)l->batch * T) % tp)
        return safe_fail(err, errlen, "--sp: --tp %d does not divide the %ld tokens of a micro-batch (--batch %d x "
                         "--seq %d%s)", tp, (long)l->batch * T, l->batch, l->seq, l->cp > 1 ? " / --cp" : "");
    if (l->sp && T % tp)
        return safe_fail(err, errlen, "--sp: --tp %d does not divide --seq %d%s (sampling runs one sequence)", tp,
                         l->seq, l->cp > 1 ? " / --cp" : "");
    return 0;
}

/* The model's layers over P stages of V chunks each (gpt_stage_layers'
 * split): given range by range, or as even as the chunks allow. */
static int check_stages(const Layout *l, const GPTConfig *cfg, char *err, size_t errlen) {
    int P = l->pp, V = l->virtual_chunks;
    if (l->nstage_layers) {
        long sum = 0;   /* at most COMM_MAX_RANKS x SAFE_MAX_LAYERS */
        for (int i = 0; i < l->nstage_layers; i++) {
            if (l->stage_layers[i] < 1) return safe_fail(err, errlen, "--stage-layers: range %d holds %d layers", i,
                                                         l->stage_layers[i]);
            sum += l->stage_layers[i];
        }
        if (V == 1 && l->nstage_layers != P)
            return safe_fail(err, errlen, "--stage-layers gives %d stages, --pp is %d", l->nstage_layers, P);
        if (V > 1 && l->nstage_layers != P * V)
            return safe_fail(err, errlen, "--stage-layers gives %d ranges, --pp %d x --virtual %d needs %d (the "
                             "model's chunks in order)", l->nstage_layers, P, V, P * V);
        if (sum != cfg->layers)
            return safe_fail(err, errlen, "--stage-layers adds up to %ld layers, the model has %d", sum, cfg->layers);
    } else if (P > cfg->layers) {
        return safe_fail(err, errlen, "--pp %d exceeds the model's %d layers", P, cfg->layers);
    } else if (V > 1 && cfg->layers % (P * V) != 0) {
        return safe_fail(err, errlen, "--pp %d x --virtual %d = %d chunks: the model's %d layers do not divide into "
                         "them (or give the %d chunks' layers with --stage-layers)", P, V, P * V, cfg->layers, P * V);
    }
    return 0;
}

int layout_infer_mesh(Layout *l, int world, char *err, size_t errlen) {
    if (l->cp < 1 || world % l->cp)
        return safe_fail(err, errlen, "--cp %d does not divide the %d ranks", l->cp, world);
    return comm_mesh_shape(world / l->cp, &l->dp, &l->tp, &l->pp, err, errlen);
}

int layout_check(const Layout *l, const GPTConfig *cfg, int world, char *err, size_t errlen) {
    char line[256];   /* the messages of comm.c's and pp_sched.c's rules */
    if (l->dp_mode == DP_PS && l->zero)
        return safe_fail(err, errlen, "--dp-mode ps keeps the whole optimizer on rank 0: it takes no --zero");
    if (l->dp < 1 || l->tp < 1 || l->pp < 1 || l->cp < 1)
        return safe_fail(err, errlen, "--dp %d --cp %d --tp %d --pp %d: each must be 1 or more", l->dp, l->cp, l->tp,
                         l->pp);
    int dp = l->dp, tp = l->tp, pp = l->pp;
    if (world > 0 && layout_infer_mesh(&(Layout){.dp = dp, .tp = tp, .pp = pp, .cp = l->cp}, world, line,
                                       sizeof line) != 0)
        return safe_fail(err, errlen, "%s", line);
    if (cp_check(l->cp, l->seq, line, sizeof line) != 0) return safe_fail(err, errlen, "%s", line);
    if (pp_schedule_check(l->schedule, l->pp, l->micro_batches, l->virtual_chunks, line, sizeof line) != 0)
        return safe_fail(err, errlen, "%s", line);
    if (l->virtual_chunks > 1 && l->pp < 2)
        return safe_fail(err, errlen, "--virtual %d interleaves chunks over stages: it needs --pp 2 or more",
                         l->virtual_chunks);
    if (l->batch < 1 || l->seq < 1)
        return safe_fail(err, errlen, "--batch %d --seq %d: each must be 1 or more", l->batch, l->seq);
    size_t step_tokens;   /* the tokens of a step are ints everywhere: bounded here */
    if (safe_mul_n(&step_tokens, 4, (size_t)l->batch, (size_t)l->seq, (size_t)l->micro_batches, (size_t)l->dp) != 0 ||
        step_tokens > SAFE_MAX_STEP_TOKENS)
        return safe_fail(err, errlen, "--batch %d x --seq %d x --micro-batches %d x dp %d tokens a step is more than %d",
                         l->batch, l->seq, l->micro_batches, l->dp, SAFE_MAX_STEP_TOKENS);
    if (!cfg) return 0;
    if (check_tp(l, cfg, err, errlen) != 0) return -1;
    return check_stages(l, cfg, err, errlen);
}

void layout_stage_shard(const Layout *l, const GPTConfig *cfg, int stage, int tp_rank, GPTShard *s) {
    *s = gpt_whole(cfg);
    s->tp = l->tp;
    s->tp_rank = tp_rank;
    gpt_stage_layers(cfg->layers, l->pp, l->virtual_chunks, l->nstage_layers ? l->stage_layers : NULL, stage, s);
    s->has_embed = stage == 0;
    s->has_head = stage == l->pp - 1;
    s->split_backward = pp_schedule_splits(l->schedule);
}
