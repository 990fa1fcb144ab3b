/* score.h: evaluation during and after training: the validation loss and
 * HellaSwag as llm.c scores it (see score.c). */
#ifndef SCORE_H
#define SCORE_H

#include "run.h"
#include "runlog.h"

/* The last stage's loss, averaged over the dp group and handed to every
 * stage (rank 0, which prints, is on the first): the step's loss and the
 * validation loss alike. Collective over every rank. */
double score_share_loss(Run *r, double loss);

/* The mean loss over the first --val-batches global batches (B x dp
 * sequences) of --val, each dp rank taking its B of each; every rank gets
 * it. Collective; exits 2 when the data turns out bad mid-run. */
double score_val_loss(Run *r);

/* HellaSwag on --eval-hellaswag's examples, split over the dp ranks: each
 * example's four rows forward through the pipeline (under cp, each cp rank
 * its tokens of them), the completion with the lowest mean loss chosen
 * (eval_choose). Every rank gets *correct (examples
 * whose choice is the label) and *total (the file's examples). Collective
 * over every rank (ZeRO-3's gathers: every rank runs the same forwards).
 * Returns 0 (an example longer than --seq was refused before training). */
int score_hellaswag(Run *r, int *correct, int *total);

/* One evaluation at `step`: the validation loss (with --val) and HellaSwag
 * (with --eval-hellaswag), printed by rank 0 and recorded in --log.
 * Collective; does nothing without either. */
void score_evaluate(Run *r, RunLog *log, int step);

/* A GPU step's loss, kept on the device: after pp_run, its mean over M
 * micro-batches averaged over the dp x cp group and queued for the host
 * (score_loss_queue); once the norm has been read back, the global mean
 * loss, score_share_loss's (score_loss_read). */
void score_loss_queue(Run *r, int M);
double score_loss_read(Run *r);

#endif
