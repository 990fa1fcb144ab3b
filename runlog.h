/* runlog.h: what rank 0 prints and draws of a run: the header, the
 * memory lines, the step line's elapsed time and ETA, validation, the
 * closing summary, and --plot's loss curve (plot.c draws it).
 */
#ifndef RUNLOG_H
#define RUNLOG_H

#include "run.h"
#include "plot.h"

/* What rank 0 keeps of the run for the step line's elapsed time and ETA,
 * the closing summary and --plot. */
typedef struct RunLog {
    Run *r;
    double t0;                /* ms, when the first step of this run started */
    int s0, last_step;        /* steps done before this run (--resume), the last one printed */
    double last_loss, val_loss;  /* NAN until known */
    Plot plot;                /* when --plot */
    FILE *log;                /* --log: JSON lines, appended (NULL after a failed write) */
    double plot_written;      /* ms of the last write */
    int log_failed;           /* a write of --log failed (said once; the run goes on without it) */
    int plot_failed;          /* a write of --plot failed (said once; later writes are still tried) */
    int plot_ok;              /* the last write of --plot succeeded */
} RunLog;

/* Starts the log of a run that begins at step s0 (0, or the resumed step); opens --plot on rank 0. */
void runlog_init(RunLog *l, Run *r, int s0);
/* Rank 0, after a step's line: appends " | elapsed E | eta T" and records the step (plot, --log). */
void runlog_step(RunLog *l, int step, double loss, double norm, float lr, double ms);
/* Rank 0: a validation loss at step, into the plot and --log. */
void runlog_val(RunLog *l, int step, double loss);
/* Rank 0: a HellaSwag result at step, into --log. */
void runlog_hellaswag(RunLog *l, int step, int correct, int total);
/* Rank 0, at the end: what the run did, in three lines (ckpt: the last checkpoint or NULL;
 * model: the --save file written, or NULL; a plot whose last write failed is not named). */
void runlog_summary(RunLog *l, const char *ckpt, const char *model, double peak, double flops_per_token);
/* Whether a write of --log or --plot failed during the run (each said at once in one
 * line): the run goes on and its exit status at the end is 1. */
int runlog_write_failed(const RunLog *l);
void runlog_free(RunLog *l);

/* Rank 0: the model, the batch, the layout and the backend, before step 1. */
void runlog_header(Run *r);
/* Every rank: its memory, measured and from the ZeRO formula (DESIGN.md). */
void runlog_memory(Run *r);
/* Rank 0, first: with --resume, the checkpoint continued (at step s0), or that the run starts fresh. */
void runlog_resume(Run *r, int s0);
/* MFU's numerator: flops a token in the causal count (plan.h's PLAN_FLOPS_CAUSAL, 6N + 6LCT). */
double runlog_flops_per_token(const Run *r);
/* Every rank, after the run: the buffers that come and go (ZeRO-2/3 units, ps staging). */
void runlog_transient(Run *r);

#endif
