/* plot.c: the program's pictures as plain SVG (plot.h): the loss curve, and
 * --show-schedule's figure of a pipeline schedule, the picture
 * auto-parallel-partitioning.txt draws in 3.2 流水线并行. The SVG helpers
 * every picture uses (trace.c's measured timeline too) live here:
 * plot_svg_begin, plot_xml_text, plot_nice_step, plot_micro_colour.
 *
 * The loss curve, rewritten whole every few steps: axes with round ticks,
 * the train loss as a thin blue line with a point a step, the validation
 * loss as orange dots joined by a line, and the learning rate as a dashed
 * grey line on its own axis at the right. Below the step ticks, the tokens
 * seen by then (steps x tokens a step). Every point is an SVG element with
 * its numbers in data-* attributes and a <title> (a tooltip in a browser),
 * so a test reads back exactly what the run printed.
 */
#include "plot.h"
#include "pp_sched.h"
#include "safe.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The picture's frame, in SVG user units. */
enum { W = 960, H = 540, LEFT = 80, RIGHT = 90, TOP = 50, BOTTOM = 80 };

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = safe_malloc(n, "plot string");
    memcpy(d, s, n);
    return d;
}

void plot_init(Plot *p, const char *path, const char *title, int steps, long long tokens_per_step) {
    memset(p, 0, sizeof *p);
    p->path = dup_str(path);
    p->title = dup_str(title ? title : "");
    p->steps = steps;
    p->tokens_per_step = tokens_per_step;
}

static void series_add(PlotSeries *s, int step, double loss, double lr) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 256;
        s->step = realloc(s->step, s->cap * sizeof *s->step);
        s->loss = realloc(s->loss, s->cap * sizeof *s->loss);
        s->lr = realloc(s->lr, s->cap * sizeof *s->lr);
        if (!s->step || !s->loss || !s->lr) {
            fprintf(stderr, "error: out of memory growing the plot\n");
            exit(1);
        }
    }
    s->step[s->n] = step;
    s->loss[s->n] = loss;
    s->lr[s->n] = lr;
    s->n++;
}

void plot_train(Plot *p, int step, double loss, double lr) { series_add(&p->train, step, loss, lr); }
void plot_val(Plot *p, int step, double loss) { series_add(&p->val, step, loss, 0.0); }

static void series_free(PlotSeries *s) {
    free(s->step);
    free(s->loss);
    free(s->lr);
    memset(s, 0, sizeof *s);
}

void plot_free(Plot *p) {
    series_free(&p->train);
    series_free(&p->val);
    free(p->path);
    free(p->title);
    memset(p, 0, sizeof *p);
}

double plot_nice_step(double span, int n) {
    if (!(span > 0)) return 1.0;
    double raw = span / n, mag = pow(10.0, floor(log10(raw))), f = raw / mag;
    return (f < 1.5 ? 1.0 : f < 3.5 ? 2.0 : f < 7.5 ? 5.0 : 10.0) * mag;
}

/* A count in a few characters: 950, 12.3k, 4.19M, 1.2G. */
static void short_count(double v, char *buf, size_t len) {
    if (v >= 1e9) snprintf(buf, len, "%.3gG", v / 1e9);
    else if (v >= 1e6) snprintf(buf, len, "%.3gM", v / 1e6);
    else if (v >= 1e3) snprintf(buf, len, "%.3gk", v / 1e3);
    else snprintf(buf, len, "%.0f", v);
}

/* The length of the well-formed UTF-8 character at p (2 to 4 bytes: no
 * overlong form, no surrogate, at most U+10FFFF), or 0. */
static int utf8_len(const unsigned char *p) {
    int n = p[0] >= 0xc2 && p[0] <= 0xdf ? 2 : p[0] >= 0xe0 && p[0] <= 0xef ? 3 : p[0] >= 0xf0 && p[0] <= 0xf4 ? 4 : 0;
    if (!n) return 0;
    for (int i = 1; i < n; i++)
        if ((p[i] & 0xc0) != 0x80) return 0;
    if ((p[0] == 0xe0 && p[1] < 0xa0) || (p[0] == 0xed && p[1] >= 0xa0) || (p[0] == 0xf0 && p[1] < 0x90) ||
        (p[0] == 0xf4 && p[1] >= 0x90))
        return 0;
    return n;
}

void plot_xml_text(FILE *f, const char *s) {
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        int n;
        if (*p == '&') fputs("&amp;", f);
        else if (*p == '<') fputs("&lt;", f);
        else if (*p == '>') fputs("&gt;", f);
        else if (*p == '"') fputs("&quot;", f);
        else if (*p < 0x80) {
            if (*p >= 0x20 || *p == '\t') fputc(*p, f);
        } else if ((n = utf8_len(p)) > 0) {
            fwrite(p, 1, (size_t)n, f);
            p += n - 1;
        } else {
            fputc('?', f);
        }
    }
}

void plot_svg_begin(FILE *f, int width, int height) {
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
            "font-family=\"sans-serif\" font-size=\"13\"", width, height, width, height);
}

/* The data's frame: steps on x, loss on the left y, learning rate on the right y. */
typedef struct Frame {
    double x0, x1, y0, y1, lr1;
} Frame;

static double px(const Frame *fr, double step) {
    return LEFT + (step - fr->x0) / (fr->x1 - fr->x0) * (W - LEFT - RIGHT);
}
static double py(const Frame *fr, double loss) {
    return H - BOTTOM - (loss - fr->y0) / (fr->y1 - fr->y0) * (H - TOP - BOTTOM);
}
static double plr(const Frame *fr, double lr) {
    return H - BOTTOM - lr / fr->lr1 * (H - TOP - BOTTOM);
}

static Frame frame_of(const Plot *p) {
    Frame fr = {0, p->steps > 0 ? p->steps : 1, INFINITY, -INFINITY, 0};
    const PlotSeries *all[2] = {&p->train, &p->val};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < all[k]->n; i++) {
            double v = all[k]->loss[i];
            if (!isfinite(v)) continue;
            if (v < fr.y0) fr.y0 = v;
            if (v > fr.y1) fr.y1 = v;
            if (all[k]->step[i] > fr.x1) fr.x1 = all[k]->step[i];
        }
    for (int i = 0; i < p->train.n; i++)
        if (isfinite(p->train.lr[i]) && p->train.lr[i] > fr.lr1) fr.lr1 = p->train.lr[i];
    if (!(fr.y0 <= fr.y1)) fr.y0 = 0, fr.y1 = 1;
    double d = plot_nice_step(fr.y1 - fr.y0 > 0 ? fr.y1 - fr.y0 : 1.0, 6);
    fr.y0 = floor(fr.y0 / d) * d;
    fr.y1 = ceil(fr.y1 / d) * d;
    if (fr.y1 <= fr.y0) fr.y1 = fr.y0 + d;
    if (!(fr.lr1 > 0)) fr.lr1 = 1.0;
    return fr;
}

/* At most this many ticks an axis: a step below a value's precision (a
 * loss of 1e17 read from a hostile --log) would otherwise never advance. */
#define MAX_TICKS 64

static void draw_axes(FILE *f, const Plot *p, const Frame *fr) {
    double xl = LEFT, xr = W - RIGHT, yb = H - BOTTOM, yt = TOP;
    int ticks = 0;
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#444\"/>\n", LEFT, TOP,
            W - LEFT - RIGHT, H - TOP - BOTTOM);
    /* x: steps, and under each tick the tokens seen by then */
    double dx = plot_nice_step(fr->x1 - fr->x0, 8);
    for (double s = 0; s <= fr->x1 + 1e-9 && ticks < MAX_TICKS; s += dx, ticks++) {
        double x = px(fr, s);
        char tok[32];
        short_count(s * (double)p->tokens_per_step, tok, sizeof tok);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", x, yt, x, yb);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.0f</text>\n", x, yb + 18, s);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#888\" font-size=\"11\">%s</text>\n",
                x, yb + 34, tok);
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">step</text>\n", (xl + xr) / 2, H - 28);
    fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" fill=\"#888\" font-size=\"11\">tokens "
            "(%lld a step)</text>\n", (xl + xr) / 2, H - 12, p->tokens_per_step);
    /* left y: loss */
    double dy = plot_nice_step(fr->y1 - fr->y0, 6);
    for (double v = fr->y0; v <= fr->y1 + dy * 1e-6 && ticks < 2 * MAX_TICKS; v += dy, ticks++) {
        double y = py(fr, v);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", xl, y, xr, y);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", xl - 6, y + 4, v);
    }
    fprintf(f, "<text transform=\"translate(22 %.1f) rotate(-90)\" text-anchor=\"middle\">loss (nats a token)"
            "</text>\n", (yt + yb) / 2);
    /* right y: learning rate */
    double dl = plot_nice_step(fr->lr1, 5);
    for (double v = 0; v <= fr->lr1 + dl * 1e-6 && ticks < 3 * MAX_TICKS; v += dl, ticks++)
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" fill=\"#888\">%.3g</text>\n", xr + 6, plr(fr, v) + 4, v);
    fprintf(f, "<text transform=\"translate(%d %.1f) rotate(90)\" text-anchor=\"middle\" fill=\"#888\">"
            "learning rate</text>\n", W - 18, (yt + yb) / 2);
}

/* A polyline through the finite points of one series (lr or loss). */
static void draw_line(FILE *f, const Frame *fr, const PlotSeries *s, int lr, const char *style) {
    if (s->n == 0) return;
    fprintf(f, "<polyline fill=\"none\" %s points=\"", style);
    for (int i = 0; i < s->n; i++) {
        double v = lr ? s->lr[i] : s->loss[i];
        if (isfinite(v)) fprintf(f, "%.1f,%.1f ", px(fr, s->step[i]), lr ? plr(fr, v) : py(fr, v));
    }
    fprintf(f, "\"/>\n");
}

static void draw_legend(FILE *f, const Plot *p) {
    int x = W - RIGHT - 190, y = TOP + 18;   /* top right: where a falling loss is not */
    fprintf(f, "<g font-size=\"12\">\n");
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#1f77b4\" stroke-width=\"2\"/>"
            "<text x=\"%d\" y=\"%d\">train loss</text>\n", x, y - 4, x + 24, y - 4, x + 30, y);
    if (p->val.n)
        fprintf(f, "<circle cx=\"%d\" cy=\"%d\" r=\"4\" fill=\"#ff7f0e\"/>"
                "<text x=\"%d\" y=\"%d\">val loss</text>\n", x + 12, y + 14, x + 30, y + 18);
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#888\" stroke-dasharray=\"5 3\"/>"
            "<text x=\"%d\" y=\"%d\">learning rate (right axis)</text>\n</g>\n",
            x, y + 32, x + 24, y + 32, x + 30, y + 36);
}

static void draw_svg(FILE *f, const Plot *p) {
    Frame fr = frame_of(p);
    plot_svg_begin(f, W, H);
    fprintf(f, ">\n");
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n<text x=\"%d\" y=\"28\" "
            "font-size=\"15\">", LEFT);
    plot_xml_text(f, p->title);
    if (p->train.n)
        fprintf(f, " | step %d/%d, loss %.4g", p->train.step[p->train.n - 1], p->steps,
                p->train.loss[p->train.n - 1]);
    if (p->val.n) fprintf(f, ", val %.4g", p->val.loss[p->val.n - 1]);
    fprintf(f, "</text>\n");
    draw_axes(f, p, &fr);
    draw_line(f, &fr, &p->train, 1, "stroke=\"#888\" stroke-dasharray=\"5 3\"");
    draw_line(f, &fr, &p->train, 0, "stroke=\"#1f77b4\" stroke-width=\"1.2\"");
    draw_line(f, &fr, &p->val, 0, "stroke=\"#ff7f0e\" stroke-width=\"1.5\"");
    fprintf(f, "<g class=\"train\" fill=\"#1f77b4\">\n");
    for (int i = 0; i < p->train.n; i++) {
        double v = p->train.loss[i];
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"1.2\" data-step=\"%d\" data-loss=\"%.7g\" "
                "data-lr=\"%.4g\"><title>step %d: loss %.7g, lr %.3e</title></circle>\n",
                px(&fr, p->train.step[i]), isfinite(v) ? py(&fr, v) : (double)TOP, p->train.step[i], v,
                p->train.lr[i], p->train.step[i], v, p->train.lr[i]);
    }
    fprintf(f, "</g>\n<g class=\"val\" fill=\"#ff7f0e\">\n");
    for (int i = 0; i < p->val.n; i++) {
        double v = p->val.loss[i];
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" data-step=\"%d\" data-loss=\"%.7g\">"
                "<title>step %d: val loss %.7g</title></circle>\n",
                px(&fr, p->val.step[i]), isfinite(v) ? py(&fr, v) : (double)TOP, p->val.step[i], v,
                p->val.step[i], v);
    }
    fprintf(f, "</g>\n");
    draw_legend(f, p);
    fprintf(f, "</svg>\n");
}

int plot_write(const Plot *p, char *err, size_t errlen) {
    SafeOut o;
    if (safe_out_open(&o, p->path, err, errlen) != 0) return -1;
    errno = 0;
    draw_svg(o.f, p);
    if (ferror(o.f)) {
        snprintf(err, errlen, "writing %s failed (%s)", p->path, strerror(errno ? errno : EIO));
        safe_out_abort(&o);
        return -1;
    }
    return safe_out_commit(&o, err, errlen);
}

/* ---------------------------------------------------------------------------
 * The pipeline schedule (--show-schedule): the figure pp_show prints, as
 * boxes. Slot t of stage s is a box at column t of row s, labelled as the
 * text cell ("F3", "B3", "W3", "F3.1" with chunks); F light, B dark and W
 * a hatched mid-tone of the micro-batch's colour; with V > 1 chunks a
 * stripe along the bottom of each box, darker for a later chunk. Between
 * rows, a thin line from the end of each sending box to the start of the
 * box that receives it, by pp_sched.h's dependencies: F(s,c,m) ->
 * F(s+1,c,m), B(s,c,m) -> B(s-1,c,m), and with chunks the wrap F(P-1,c,m)
 * -> F(0,c+1,m) and B(0,c,m) -> B(P-1,c-1,m), dashed. W sends nothing. */

/* Micro-batch m's colour (plot.h). */
void plot_micro_colour(int m, int M, int kind, char *buf, size_t len) {
    double h = fmod(360.0 * m / (M > 0 ? M : 1) + 210.0, 360.0) / 60.0;
    double sat = 0.65, l = kind == PP_BACKWARD ? 0.38 : kind == PP_WEIGHT ? 0.58 : 0.80;
    double c = (1 - fabs(2 * l - 1)) * sat, x = c * (1 - fabs(fmod(h, 2.0) - 1)), o = l - c / 2;
    double r = 0, g = 0, b = 0;
    switch ((int)h) {
    case 0: r = c, g = x; break;
    case 1: r = x, g = c; break;
    case 2: g = c, b = x; break;
    case 3: g = x, b = c; break;
    case 4: r = x, b = c; break;
    default: r = c, b = x; break;
    }
    snprintf(buf, len, "#%02x%02x%02x", (int)lround((r + o) * 255), (int)lround((g + o) * 255),
             (int)lround((b + o) * 255));
}

/* The slot of stage s's action (kind, chunk, micro); -1 if none. */
static int slot_of(const PPTimeline *t, int s, PPKind kind, int chunk, int m) {
    for (int i = 0; i < t->T; i++) {
        PPAction a = t->slots[s * t->T + i];
        if (a.kind == kind && a.chunk == chunk && a.micro == m) return i;
    }
    return -1;
}

static const char *kind_name(PPKind k) {
    return k == PP_FORWARD ? "forward" : k == PP_BACKWARD ? "backward (input gradient)" : "weight gradient";
}

static void draw_schedule(FILE *f, const PPTimeline *t, const char *schedule, const char *formula) {
    int P = t->P, M = t->M, T = t->T, V = t->V > 0 ? t->V : 1;
    int split = 0;
    for (int i = 0; i < P * T; i++) split |= t->slots[i].kind == PP_WEIGHT;
    int cw = T > 0 ? 1120 / T : 40;                 /* a slot's width */
    if (cw > 44) cw = 44;
    if (cw < 12) cw = 12;
    int rh = 30, gap = 22, left = 76, top = 84;    /* row height, gap between rows for the marks */
    int sched = pp_schedule_parse(schedule);
    char title[256];
    if (sched < 0 || pp_show_title((PPSchedule)sched, P, M, V, T, title, sizeof title) != 0)
        snprintf(title, sizeof title, "%s schedule: P = %d stages, M = %d micro-batches, %d time slots", schedule,
                 P, M, T);
    int width = left + T * cw + 30, legend = 70;
    if (width < 760) width = 760;
    if (width < left + 8 * (int)strlen(title) + 20) width = left + 8 * (int)strlen(title) + 20;   /* 15px text */
    int height = top + P * rh + (P - 1) * gap + legend;
    int font = cw >= 30 ? 12 : cw >= 20 ? 9 : 7;
    if (V > 1 && font > 7) font = cw >= 36 ? 11 : cw >= 26 ? 8 : 7;   /* "F3.1" is wider */
    int idle = 0;
    for (int i = 0; i < P * T; i++) idle += t->slots[i].kind == PP_IDLE;
    plot_svg_begin(f, width, height);
    fprintf(f, " data-schedule=\"");
    plot_xml_text(f, schedule);
    fprintf(f, "\" data-stages=\"%d\" data-micro-batches=\"%d\" data-chunks=\"%d\" data-slots=\"%d\" "
            "data-idle=\"%d\">\n", P, M, V, T, idle);
    fprintf(f, "<defs>\n");   /* W's hatch: white diagonal lines over the box's own colour */
    fprintf(f, "<pattern id=\"w-hatch\" width=\"5\" height=\"5\" patternUnits=\"userSpaceOnUse\" "
            "patternTransform=\"rotate(45)\"><line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"5\" stroke=\"white\" "
            "stroke-width=\"1.6\" stroke-opacity=\"0.55\"/></pattern>\n</defs>\n");
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(f, "<text x=\"%d\" y=\"24\" font-size=\"15\">", left);
    plot_xml_text(f, title);
    fprintf(f, "</text>\n");
    fprintf(f, "<text x=\"%d\" y=\"44\" font-size=\"14\">bubble: idle %d of %d slots = %.3f (%s formula ",
            left, idle, P * T, P * T > 0 ? (double)idle / (P * T) : 0.0, schedule);
    plot_xml_text(f, formula);
    fprintf(f, ")</text>\n");
    /* the ruler and the rows' frames */
    for (int i = 0; i < T; i++)
        if (cw >= 20 || i % 5 == 0)
            fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" fill=\"#888\" font-size=\"10\">%d</text>\n",
                    left + (i + 0.5) * cw, top - 8, i);
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\" fill=\"#888\" font-size=\"10\">slot</text>\n",
            left - 8, top - 8);
    for (int s = 0; s < P; s++) {
        int y = top + s * (rh + gap);
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#fafafa\" stroke=\"#ddd\"/>\n",
                left, y, T * cw, rh);
        for (int i = 1; i < T; i++)
            fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#eee\"/>\n", left + i * cw, y,
                    left + i * cw, y + rh);
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">stage %d</text>\n", left - 8, y + rh / 2 + 5, s);
    }
    /* the sends, under the boxes: from the end of the sender's slot to the start of the receiver's */
    fprintf(f, "<g class=\"sends\" stroke-width=\"1\">\n");
    for (int s = 0; s < P; s++)
        for (int i = 0; i < T; i++) {
            PPAction a = t->slots[s * T + i];
            int to, tc;
            if ((to = pp_send_target(a, s, P, V, &tc)) < 0) continue;
            int j = slot_of(t, to, a.kind, tc, a.micro);
            if (j < 0) continue;
            char col[8];
            plot_micro_colour(a.micro, M, PP_BACKWARD, col, sizeof col);
            int down = to > s, wrap = (a.kind == PP_FORWARD) != down;
            double x1 = left + (i + 1) * cw - 2, x2 = left + j * cw + 2;
            double y1 = top + s * (rh + gap) + (down ? rh : 0), y2 = top + to * (rh + gap) + (down ? 0 : rh);
            char k = a.kind == PP_FORWARD ? 'F' : 'B';
            fprintf(f, "<line class=\"send\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\"%s "
                    "data-kind=\"%c\" data-micro=\"%d\" data-chunk=\"%d\" data-from=\"%d\" data-to=\"%d\" "
                    "data-recv-chunk=\"%d\" data-slot=\"%d\" data-recv-slot=\"%d\"><title>%s %d",
                    x1, y1 + (down ? 2 : -2), x2, y2 + (down ? -2 : 2), col,
                    wrap ? " stroke-dasharray=\"3,2\" stroke-opacity=\"0.6\"" : "", k, a.micro, a.chunk, s, to, tc,
                    i, j, k == 'F' ? "activations of F" : "gradient of B", a.micro);
            if (V > 1) fprintf(f, " (chunk %d -&gt; chunk %d)", a.chunk, tc);
            fprintf(f, ": stage %d sends to stage %d after slot %d, used in slot %d</title></line>\n", s, to, i, j);
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"1.8\" fill=\"%s\"/>\n", x2, y2 + (down ? -2 : 2), col);
        }
    fprintf(f, "</g>\n");
    /* the boxes */
    fprintf(f, "<g class=\"slots\" font-size=\"%d\" text-anchor=\"middle\">\n", font);
    for (int s = 0; s < P; s++)
        for (int i = 0; i < T; i++) {
            PPAction a = t->slots[s * T + i];
            if (a.kind == PP_IDLE) continue;
            char col[8], label[24];
            plot_micro_colour(a.micro, M, a.kind, col, sizeof col);
            pp_cell_text(a, V, label, sizeof label);
            int x = left + i * cw, y = top + s * (rh + gap);
            fprintf(f, "<rect class=\"slot\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" rx=\"3\" fill=\"%s\" "
                    "stroke=\"#555\" stroke-width=\"0.6\" data-stage=\"%d\" data-slot=\"%d\" data-kind=\"%c\" "
                    "data-micro=\"%d\" data-chunk=\"%d\"><title>stage %d, slot %d: %s of micro-batch %d",
                    x + 1, y + 1, cw - 2, rh - 2, col, s, i, label[0], a.micro, a.chunk, s, i, kind_name(a.kind),
                    a.micro);
            if (V > 1) fprintf(f, ", chunk %d (the model's chunk %d)", a.chunk, a.chunk * P + s);
            fprintf(f, "</title></rect>\n");
            if (a.kind == PP_WEIGHT)
                fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" rx=\"3\" fill=\"url(#w-hatch)\" "
                        "pointer-events=\"none\"/>\n", x + 1, y + 1, cw - 2, rh - 2);
            if (V > 1) {   /* the chunk stripe: grey, darker for a later chunk */
                int grey = 215 - 150 * a.chunk / (V - 1);
                fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"4\" fill=\"#%02x%02x%02x\" "
                        "pointer-events=\"none\"/>\n", x + 2, y + rh - 6, cw - 4, grey, grey, grey);
            }
            fprintf(f, "<text x=\"%.1f\" y=\"%d\" fill=\"%s\">%s</text>\n", x + cw / 2.0,
                    y + rh / 2 + font / 2 - (V > 1 ? 2 : 1), a.kind == PP_FORWARD ? "#222" : "white", label);
        }
    fprintf(f, "</g>\n");
    /* the legend: each micro-batch's colours, and a send */
    int ly = top + P * rh + (P - 1) * gap + 28, lx = left;
    int kinds = split ? 3 : 2, sw = 12 * kinds + 10;
    fprintf(f, "<g class=\"legend\" font-size=\"11\">\n<text x=\"%d\" y=\"%d\">micro-batch:</text>\n", lx, ly + 4);
    lx += 80;
    for (int m = 0; m < M && lx < width - 300; m++, lx += sw) {
        for (int k = 0; k < kinds; k++) {
            char cc[8];
            PPKind kind = k == 0 ? PP_FORWARD : k == 1 ? PP_BACKWARD : PP_WEIGHT;
            plot_micro_colour(m, M, kind, cc, sizeof cc);
            fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"12\" fill=\"%s\"/>", lx + 12 * k, ly - 6, cc);
            if (kind == PP_WEIGHT)
                fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"12\" fill=\"url(#w-hatch)\"/>", lx + 24,
                        ly - 6);
        }
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%d</text>\n", lx + 6 * kinds, ly + 20, m);
    }
    lx += 10;
    fprintf(f, "<text x=\"%d\" y=\"%d\">F light, B dark%s; empty: idle (the bubble)%s</text>\n", lx, ly + 4,
            split ? ", W hatched" : "", V > 1 ? "; stripe: chunk, darker later" : "");
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#555\"/><text x=\"%d\" y=\"%d\">send "
            "(activations down, gradients up%s)</text>\n</g>\n", lx, ly + 18, lx + 20, ly + 24, lx + 26, ly + 24,
            V > 1 ? "; dashed: the wrap between the last stage and stage 0" : "");
    fprintf(f, "</svg>\n");
}

int plot_schedule_svg(const char *path, const PPTimeline *t, const char *schedule, const char *formula,
                      char *err, size_t errlen) {
    SafeOut o;
    if (safe_out_open(&o, path, err, errlen) != 0) return -1;
    draw_schedule(o.f, t, schedule ? schedule : "", formula ? formula : "");
    if (ferror(o.f)) {
        snprintf(err, errlen, "--schedule-svg %s: write error", path);
        safe_out_abort(&o);
        return -1;
    }
    return safe_out_commit(&o, err, errlen);
}

/* ---- the cp ring (--show-schedule --cp N) ---------------------------------
 * Left: the causal attention of one sequence as a 2N x 2N grid of chunks
 * (query chunk down, key chunk across), each cell below the diagonal
 * coloured by the rank that computes it (the query chunk's holder; the
 * diagonal's cells are triangles), and each rank's count of scores. Right:
 * which rank's keys and values each rank holds at each step of the ring,
 * the arrow of each step's pass to the next rank. */
static void draw_ring(FILE *f, int N, int T) {
    int K = 2 * N, Tc = T / K, cell = K <= 8 ? 44 : 360 / K, left = 130, top = 90;
    int grid = K * cell, rx = left + grid + 90, cw = 96, rh = 30;
    int width = rx + (N * cw > 600 ? N * cw : 600) + 30, height = top + grid + 40 + 18 * ((N + 3) / 4);
    if (height < top + N * rh + 110) height = top + N * rh + 110;
    if (width < 820) width = 820;
    plot_svg_begin(f, width, height);
    fprintf(f, " data-cp=\"%d\" data-seq=\"%d\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n", N, T);
    fprintf(f, "<text x=\"20\" y=\"30\" font-size=\"17\">context parallelism: --cp %d, a sequence of %d tokens in %d "
            "chunks of %d, rank r holding chunks r and %d-r</text>\n", N, T, K, Tc, K - 1);
    fprintf(f, "<text x=\"%d\" y=\"%d\">causal attention: query chunk (down) x key chunk (across)</text>\n", left,
            top - 30);
    char col[16];
    for (int q = 0; q < K; q++) {
        int owner = q < N ? q : K - 1 - q;
        plot_micro_colour(owner, N, PP_FORWARD, col, sizeof col);
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\" font-size=\"12\">chunk %d: rank %d</text>\n", left - 6,
                top + q * cell + cell / 2 + 4, q, owner);
        for (int k = 0; k <= q; k++) {
            int x = left + k * cell, y = top + q * cell;
            if (k < q)
                fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"%s\" stroke=\"#fff\"/>\n", x, y,
                        cell, cell, col);
            else   /* the diagonal: the causal mask keeps its lower triangle */
                fprintf(f, "<polygon points=\"%d,%d %d,%d %d,%d\" fill=\"%s\" stroke=\"#fff\"/>\n", x, y, x, y + cell,
                        x + cell, y + cell, col);
        }
    }
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#444\"/>\n", left, top, grid,
            grid);
    long per_rank = (long)Tc * Tc * (K - 1) + (long)Tc * (Tc + 1);   /* cp.c's balance, for every rank */
    for (int r = 0; r < N; r++) {
        plot_micro_colour(r, N, PP_FORWARD, col, sizeof col);
        int y = top + grid + 24 + (r / 4) * 18;
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"12\" fill=\"%s\"/><text x=\"%d\" y=\"%d\" "
                "font-size=\"12\">rank %d: %ld scores a head</text>\n", left + (r % 4) * 200, y - 10, col,
                left + (r % 4) * 200 + 16, y, r, per_rank);
    }
    /* the ring: step s, rank r holds the block of rank (r - s) mod N */
    fprintf(f, "<text x=\"%d\" y=\"%d\">the ring: whose keys and values each rank holds, step by step</text>\n", rx,
            top - 30);
    for (int s = 0; s < N; s++)
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"12\">step %d</text>\n",
                rx + s * cw + cw / 2, top - 8, s);
    for (int r = 0; r < N; r++) {
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\" font-size=\"12\">rank %d</text>\n", rx - 6,
                top + r * rh + rh / 2 + 4, r);
        for (int s = 0; s < N; s++) {
            int src = (r + N - s) % N, x = rx + s * cw, y = top + r * rh;
            plot_micro_colour(src, N, PP_BACKWARD, col, sizeof col);
            fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"%s\" stroke=\"#fff\"/><text x=\"%d\" "
                    "y=\"%d\" text-anchor=\"middle\" font-size=\"12\" fill=\"#fff\">K,V of %d</text>\n", x, y, cw - 4,
                    rh - 4, col, x + cw / 2 - 2, y + rh / 2 + 2, src);
        }
    }
    int ty = top + N * rh + 24;
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"12\">each step: the block in hand gives a partial softmax, merged "
            "by its log-sum-exp,</text>\n", rx, ty);
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"12\">while it goes on to rank + 1 and the next comes from rank - 1 "
            "(%d passes forward;</text>\n", rx, ty + 16, N - 1);
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"12\">backward: %d, the blocks' gradients travelling with them, "
            "one more hop home)</text>\n", rx, ty + 32, N);
    fprintf(f, "</svg>\n");
}

int plot_ring_svg(const char *path, int N, int T, char *err, size_t errlen) {
    SafeOut o;
    if (safe_out_open(&o, path, err, errlen) != 0) return -1;
    draw_ring(o.f, N, T);
    if (ferror(o.f)) {
        snprintf(err, errlen, "--schedule-svg %s: write error", path);
        safe_out_abort(&o);
        return -1;
    }
    return safe_out_commit(&o, err, errlen);
}
