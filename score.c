/* score.c: evaluation, as llm.c does it: the validation loss and HellaSwag.
 *
 * Neither article trains for a score, but the run they lead to (llm.c's
 * "reproduce GPT-2 (124M)") is judged by two numbers, taken every
 * --val-every steps and at the end: the loss on held-out tokens and
 * HellaSwag's accuracy, where llm.c's 124M reached 29.9% against OpenAI's
 * 29.4%. Both are forwards only, through the same layout that trains, so a
 * score means the same on one rank and on dp x tp x pp.
 *
 * HellaSwag (llm.c's EvalLoader; eval.c reads the file): an example is a
 * context and four completions. Its four rows, the context then each
 * completion, go through the model; the loss at each position of a
 * completion (the cross-entropy of its next token) is averaged over that
 * completion, and the lowest mean is the model's choice (acc_norm, as llm.c
 * and lm-eval-harness call the length-normalised accuracy). The layouts
 * change only who holds what:
 *  - dp: each dp rank takes a contiguous block of the examples (eval_range),
 *    and the correct counts are summed over the dp group;
 *  - tp: the vocab-parallel cross-entropy (gpt.c's loss, xent_combine)
 *    leaves every tp rank the same whole losses [B,T], so each chooses alike;
 *  - pp: only the last stage has a head and losses; it chooses, and the
 *    count is broadcast from it over the pipeline group;
 *  - ZeRO-3: a forward gathers each layer from the dp group, so every dp
 *    rank runs the same number of forwards: a rank whose block is shorter
 *    runs an example again and ignores it;
 *  - cp: the cp ranks of a dp slot take the same examples, each the tokens
 *    of every row that training would give it (its two chunks); their
 *    losses are put back in place over the cp group, and each rank
 *    chooses from the whole rows, the first of the group counting.
 * The rows are those of a micro-batch, T = --seq tokens (padded; causal
 * attention keeps the padding from the scored positions), taken --batch
 * rows at a time: with --batch 4 or more an example is one forward, with
 * fewer it is several (the simplest way that fits the activations the
 * model was built with). Losses are float32 in every dtype.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "score.h"
#include "safe.h"

double score_share_loss(Run *r, double loss) {
    float l = (float)loss;
    int D = r->mesh.dp_group.size;   /* dp x cp: every rank's tokens are equally many */
    if (D > 1) comm_all_reduce(&r->mesh.dp_group, NULL, &l, 1, COMM_F32, COMM_AVG);
    if (r->mesh.pp > 1) comm_broadcast(&r->mesh.pp_group, NULL, &l, 1, COMM_F32, r->mesh.pp - 1);
    return D == 1 && r->mesh.pp == 1 ? loss : l;
}

double score_val_loss(Run *r) {
    Args *a = &r->a;
    int B = a->layout.batch, T = a->layout.seq, N = r->mesh.cp;
    GPTActs *acts = r->pp.acts[0];
    double loss = 0.0;
    char err[512];
    for (int i = 0; i < a->val_batches; i++) {
        if (data_batch(&r->val, i, B * r->mesh.dp, r->mesh.dp_rank * B, B, r->inputs, r->targets, err,
                       sizeof err) != 0)
            safe_die_usage("%s", err);
        if (N > 1) cp_local_tokens(r->inputs, r->targets, B, T, N, r->mesh.cp_rank);   /* as in training */
        gpt_set_batch(&r->model, acts, r->inputs, r->targets, B, T / N);
        loss += pp_forward(&r->pp, acts, B, T / N, 1) / a->val_batches;
    }
    return score_share_loss(r, loss);
}

/* The per-position losses [4,T] of one example's rows inputs/targets [4,T],
 * run `rows` rows a forward; filled on the last stage only. Under cp each
 * rank runs its tokens of the rows (cp_local_tokens, as training does), and
 * the cp group puts the whole rows' losses together: each rank's at their
 * positions and zeros elsewhere, summed over the group (exact: at each
 * position one term is not zero). The rows are overwritten. */
static void example_losses(Run *r, int *inputs, int *targets, int rows, int T, float *losses) {
    GPT *m = &r->model;
    GPTActs *acts = r->pp.acts[0];   /* the head's set on the last stage */
    int N = r->mesh.cp, Tl = T / N;
    float *part = N > 1 ? safe_malloc((size_t)rows * Tl * sizeof(float), "a rank's losses") : NULL; /* [rows,Tl] */
    if (N > 1) memset(losses, 0, (size_t)EVAL_COMPLETIONS * T * sizeof(float));
    for (int c = 0; c < EVAL_COMPLETIONS; c += rows) {
        int n = EVAL_COMPLETIONS - c < rows ? EVAL_COMPLETIONS - c : rows;
        int *x = inputs + (size_t)c * T, *y = targets + (size_t)c * T;
        if (N > 1) cp_local_tokens(x, y, n, T, N, r->mesh.cp_rank);   /* x, y [n,Tl] now */
        gpt_set_batch(m, acts, x, y, n, Tl);
        pp_forward(&r->pp, acts, n, Tl, 1);
        if (!m->has_head) continue;
        if (N == 1) { dev_to_host(m->dev, losses + (size_t)c * T, acts->losses, (size_t)n * T * sizeof(float)); continue; }
        dev_to_host(m->dev, part, acts->losses, (size_t)n * Tl * sizeof(float));
        for (int b = 0; b < n; b++)
            for (int i = 0; i < Tl; i++)
                losses[(size_t)(c + b) * T + cp_position(N, r->mesh.cp_rank, T, i)] = part[(size_t)b * Tl + i];
    }
    if (N > 1) comm_all_reduce(&r->mesh.cp_group, NULL, losses, (size_t)EVAL_COMPLETIONS * T, COMM_F32, COMM_SUM);
    free(part);
}

int score_hellaswag(Run *r, int *correct, int *total) {
    const EvalSet *es = &r->hellaswag;
    int T = r->a.layout.seq, rows = r->a.layout.batch < EVAL_COMPLETIONS ? r->a.layout.batch : EVAL_COMPLETIONS;
    int D = r->mesh.dp, lo, hi, most = 0;
    eval_range(es->n, r->mesh.dp_rank, D, &lo, &hi);
    for (int d = 0; d < D; d++) {   /* the longest block: the forwards every dp rank runs */
        int l, h;
        eval_range(es->n, d, D, &l, &h);
        if (h - l > most) most = h - l;
    }
    int *inputs = safe_malloc((size_t)EVAL_COMPLETIONS * T * sizeof(int), "an example's rows");     /* [4,T] */
    int *targets = safe_malloc((size_t)EVAL_COMPLETIONS * T * sizeof(int), "an example's targets"); /* [4,T] */
    float *losses = safe_malloc((size_t)EVAL_COMPLETIONS * T * sizeof(float), "an example's losses"); /* [4,T] */
    int32_t right = 0;
    for (int k = 0; k < most; k++) {
        int mine = lo + k < hi, i = mine ? lo + k : (hi > lo ? lo : 0);   /* else a repeat, ignored */
        int from[EVAL_COMPLETIONS], to[EVAL_COMPLETIONS];
        if (eval_rows(es, i, T, inputs, targets, from, to) != 0)
            safe_die_usage("--eval-hellaswag: example %d needs more than --seq %d tokens", i, T);
        example_losses(r, inputs, targets, rows, T, losses);
        /* counted once: by the first rank of the example's cp group (dp_group spans dp x cp) */
        if (mine && r->model.has_head && r->mesh.cp_rank == 0 && eval_choose(losses, T, from, to, NULL) == es->ex[i].label)
            right++;
    }
    if (D > 1) comm_all_reduce(&r->mesh.dp_group, NULL, &right, 1, COMM_I32, COMM_SUM);
    if (r->mesh.pp > 1) comm_broadcast(&r->mesh.pp_group, NULL, &right, 1, COMM_I32, r->mesh.pp - 1);
    free(inputs);
    free(targets);
    free(losses);
    *correct = right;
    *total = es->n;
    return 0;
}

void score_evaluate(Run *r, RunLog *log, int step) {
    int rank0 = r->comm.rank == 0;
    if (r->a.val) {
        double v = score_val_loss(r);
        if (rank0) printf("val loss %#.7g\n", v);
        if (rank0) runlog_val(log, step, v);
    }
    if (r->a.eval_hellaswag) {
        int correct, total;
        score_hellaswag(r, &correct, &total);
        if (rank0) printf("hellaswag: %d/%d correct (acc_norm %.2f%%)\n", correct, total, 100.0 * correct / total);
        if (rank0) runlog_hellaswag(log, step, correct, total);
    }
    fflush(stdout);
}

/* On a GPU the step's loss stays on the device until the norm's read-back
 * (tensor.h, dev_loss_*): its mean over the micro-batches, averaged over
 * the dp x cp group and sent from the last stage to the others there too
 * (score_share_loss's arithmetic, on the device), queued for the host. */
void score_loss_queue(Run *r, int M) {
    float *mean = dev_loss_finish(&r->dev, M);
    if (r->mesh.dp_group.size > 1)
        comm_op_wait(comm_all_reduce(&r->mesh.dp_group, &r->dev, mean, 1, COMM_F32, COMM_AVG), &r->dev);
    if (r->mesh.pp > 1)
        comm_op_wait(comm_broadcast(&r->mesh.pp_group, &r->dev, mean, 1, COMM_F32, r->mesh.pp - 1), &r->dev);
    dev_loss_queue(&r->dev);
}

double score_loss_read(Run *r) {
    return dev_loss_read(&r->dev, r->mesh.dp_group.size > 1 || r->mesh.pp > 1);
}
