/* plot.h: the loss curve of a run as a plain SVG file (--plot FILE.svg).
 *
 * Train loss (every step) and validation loss (every evaluation) against
 * steps, with the tokens seen on a second x-axis label, and the learning
 * rate on a second y-axis. The file is rewritten whole through safe.h's
 * SafeOut (a temporary, then one rename), so a viewer opened mid-run never
 * sees half a file. Each point carries its values as data attributes
 * (data-step, data-loss, data-lr) for tests and scripts.
 *
 * Also here: --show-schedule's picture of a pipeline schedule
 * (plot_schedule_svg, below), whose boxes are F, B and, under a split
 * backward, W, each with data-kind, data-micro and data-chunk (its chunk
 * under an interleaved schedule, else 0); and the micro-batch colours
 * (plot_micro_colour) it shares with the timeline trace.c draws beside
 * --trace, whose F, B and W spans carry the same three attributes
 * (data-chunk -1 for a span named without a chunk).
 */
#ifndef PLOT_H
#define PLOT_H

#include <stddef.h>
#include <stdio.h>

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

/* Micro-batch m of M's colour ("#rrggbb"): hue by m, light for a forward,
 * dark for a backward, between for a weight gradient (kind: pp_sched.h's
 * PPKind). The schedule figure's and the trace's (trace.c). */
void plot_micro_colour(int m, int M, int kind, char *buf, size_t len);

/* The SVG helpers of every picture the program draws (this file's and
 * trace.c's), in one place: */
/* A round tick spacing (1, 2 or 5 x 10^k) giving about n ticks over span;
 * 1 when span is not positive. */
double plot_nice_step(double span, int n);
/* Writes s as XML text or attribute value: & < > " escaped, well-formed
 * UTF-8 as it is, any other byte beyond ASCII (a name cut mid-character)
 * as '?', control bytes but tab dropped. */
void plot_xml_text(FILE *f, const char *s);
/* Writes the XML declaration and the opening of the <svg> element, width x
 * height user units, sans-serif 13: the caller adds its own data-*
 * attributes and the closing ">". */
void plot_svg_begin(FILE *f, int width, int height);

struct PPTimeline;
/* --show-schedule's picture of a pipeline schedule (pp_sched.h's
 * PPTimeline, the same slots pp_show prints): one row a stage, one box a
 * slot labelled as the printed cell (pp_cell_text: F<m>, B<m>, W<m> for a
 * split backward's weight gradient, F<m>.<k> with V > 1 chunks) and
 * coloured by micro-batch m (forward light, backward dark, W a hatched
 * mid-tone; with chunks a stripe along the bottom, darker for a later
 * chunk), idle slots empty, and thin marks between rows where a stage
 * sends to a neighbour (activations after F, gradients after B, nothing
 * after W; with chunks the wrap between the last stage and stage 0
 * dashed). The title gives the measured bubble beside `formula`
 * (pp_bubble_text). The <svg> carries data-schedule, data-stages,
 * data-micro-batches, data-chunks, data-slots and data-idle; each box is a
 * <rect class="slot"> with data-stage, data-slot, data-kind (F, B or W),
 * data-micro and data-chunk (0 without chunks); each mark a <line
 * class="send"> with data-kind (F or B), data-micro, data-chunk, data-from,
 * data-to, data-recv-chunk, data-slot and data-recv-slot. Written through
 * SafeOut (path checked by the caller with safe_check_output). 0, or -1
 * with err. */
int plot_schedule_svg(const char *path, const struct PPTimeline *t, const char *schedule, const char *formula,
                      char *err, size_t errlen);

/* --show-schedule --cp N: the ring of context parallelism for sequences of
 * T tokens as SVG (the chunks' deal over the causal attention, coloured by
 * rank, and whose keys and values each rank holds at each step). Written
 * through SafeOut. 0, or -1 with err. */
int plot_ring_svg(const char *path, int N, int T, char *err, size_t errlen);

#endif
