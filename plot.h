/* plot.h: the loss curve of a run as a plain SVG file (--plot FILE.svg).
 *
 * Train loss (every step) and validation loss (every evaluation) against
 * steps, with the tokens seen on a second x-axis label, and the learning
 * rate on a second y-axis. The file is rewritten whole through safe.h's
 * SafeOut (a temporary, then one rename), so a viewer opened mid-run never
 * sees half a file. Each point carries its values as data attributes
 * (data-step, data-loss, data-lr) for tests and scripts.
 */
#ifndef PLOT_H
#define PLOT_H

#include <stddef.h>

typedef struct PlotSeries {
    int n, cap;
    int *step;          /* (n) the step a value was measured after, 1-based */
    double *loss;       /* (n) */
    double *lr;         /* (n) learning rate of that step (train series only) */
} PlotSeries;

typedef struct Plot {
    char *path;
    char *title;
    int steps;                  /* the run's last step: the x-axis' end */
    long long tokens_per_step;  /* for the tokens label of the x-axis */
    PlotSeries train, val;
} Plot;

/* Prepares a plot of a run of `steps` steps to be written to path (checked
 * by the caller with safe_check_output); title is one line of text. */
void plot_init(Plot *p, const char *path, const char *title, int steps, long long tokens_per_step);
/* Records a step's train loss and learning rate; a validation loss. */
void plot_train(Plot *p, int step, double loss, double lr);
void plot_val(Plot *p, int step, double loss);
/* Writes the SVG as it stands (atomically). 0, or -1 with err. */
int plot_write(const Plot *p, char *err, size_t errlen);
void plot_free(Plot *p);

/* --show-schedule's picture of a pipeline schedule (pp.h's PPTimeline, the
 * same slots pp_show prints): one row a stage, one box a slot labelled
 * F<m> / B<m> and coloured by micro-batch m (forward light, backward dark),
 * idle slots empty, and thin marks between rows where a stage sends to its
 * neighbour (activations after F, gradients after B). The title gives the
 * measured bubble beside `formula` (pp_bubble_text). Each box is a <rect
 * class="slot"> with data-stage, data-slot, data-kind (F or B) and
 * data-micro; each mark a <line class="send"> with data-kind, data-micro,
 * data-from, data-to, data-slot and data-recv-slot. Written through
 * SafeOut (path checked by the caller with safe_check_output). 0, or -1
 * with err. */
/* Micro-batch m of M's colour ("#rrggbb"): hue by m, light for a forward,
 * dark for a backward, between for a weight gradient (kind: pp_sched.h's
 * PPKind). The schedule figure's and the trace's (trace.c). */
void plot_micro_colour(int m, int M, int kind, char *buf, size_t len);

struct PPTimeline;
int plot_schedule_svg(const char *path, const struct PPTimeline *t, const char *schedule, const char *formula,
                      char *err, size_t errlen);

#endif
