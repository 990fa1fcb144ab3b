/* pp_sched.h: pipeline schedules: which forward, backward (and weight
 * gradient) each stage runs, in what order, and the figure of them.
 *
 * The articles' inter-layer split (auto-parallel-partitioning.txt, 3.2
 * 流水线并行, its GPipe and PipeDream figures; hybrid-parallelism.txt's
 * DP+PP): the L layers sit on P stages, the batch is cut into M
 * micro-batches, and F3 / B3 are the forward / backward of micro-batch 3 on
 * one stage. A schedule is, for each stage, the order of its actions; the
 * data dependencies (F on stage s needs F on s-1, B on s needs B on s+1)
 * decide when each can run. This module is that order and nothing else: no
 * communication, no model. pp.c walks pp_actions and does the sends and
 * receives around each action.
 *
 *   schedule     order on stage s                       bubble (idle fraction)  in flight on stage 0
 *   naive        F0 B0 F1 B1 ... (one micro-batch in    (P-1)/P                 1
 *                the pipe at a time)
 *   gpipe        F0 .. F(M-1), then B0 .. B(M-1)        (P-1)/(M+P-1)           M
 *   1f1b         min(P-1-s, M) forwards, then one F     (P-1)/(M+P-1)           min(P, M)
 *                one B while forwards remain, then the
 *                rest of the B (PipeDream-Flush)
 *   interleaved  Megatron 2021: V chunks a stage (chunk (P-1)/(VM+P-1)          min(2(P-1)+(V-1)P+1, MV)
 *                c of stage s is the model's chunk                              chunk sets, each 1/V of
 *                c*P + s); 1F1B over (micro-batch,                              a stage's activations
 *                chunk) pairs; M a multiple of P
 *   zb-h1        Qi et al. 2023: the backward split     (P-1)/(3M+P-1)          min(P, M) (every stage)
 *                into B (input gradient) and W (weight
 *                gradient); stage s holds back s W's
 *   zb-h2        up to P-1 more warm-up forwards, 2s    (P-1)/(3M+P-1), none    min(2P-1, M) (every
 *                W's held back: no gap inside a row     inside a stage's span   stage)
 *
 * (pp_sched.c's header derives each. For M < P the zero-bubble ones are
 * (2P-M-1)/(2M+2P-1).) Dependencies with chunks: F(s,c,m) needs F(s-1,c,m),
 * on stage 0 F(P-1,c-1,m); B(s,c,m) needs B(s+1,c,m), on the last stage
 * B(0,c+1,m), or its own F for the last chunk (the loss); W(s,c,m) needs
 * B(s,c,m).
 *
 * Units: every action, of whichever chunk, is one slot (F, B and W one
 * slot each); pp_timeline places them in unit slots, pp_show prints the
 * figure with the idle fraction it measures.
 */
#ifndef PP_SCHED_H
#define PP_SCHED_H

#include <stddef.h>
#include <stdio.h>

typedef enum { PP_NAIVE, PP_GPIPE, PP_1F1B, PP_INTERLEAVED, PP_ZBH1, PP_ZBH2 } PPSchedule;

/* PP_WEIGHT appears only in schedules that split the backward
 * (pp_schedule_splits); PP_IDLE only in a timeline's slots. */
typedef enum { PP_FORWARD, PP_BACKWARD, PP_WEIGHT, PP_IDLE } PPKind;

typedef struct PPAction {
    PPKind kind;
    int micro;          /* micro-batch 0 .. M-1; -1 in an idle slot */
    int chunk;          /* the stage's chunk 0 .. V-1 (0 unless interleaved); -1 in an idle slot */
} PPAction;

/* The actions of every stage placed in unit time slots. */
typedef struct PPTimeline {
    int P, M, V;        /* stages, micro-batches, chunks a stage */
    int T;              /* time slots from the first action to the last */
    PPAction *slots;    /* [P][T]: stage s at slot t is slots[s * T + t] */
} PPTimeline;

/* The one home of the pipeline's send rule (pp.c runs it, the timeline
 * waits on it, plot.c draws it). Where chunk c's forward output on stage st
 * goes: returns the stage and sets *nc to its chunk, the next stage's chunk
 * c, or from the last stage stage 0's chunk c+1; -1 after the model's last
 * chunk (the loss). The backward's gradients run the same edges the other
 * way. */
int pp_next_stage(int P, int V, int st, int c, int *nc);
/* Where chunk c's forward input on stage st comes from: returns the stage
 * and sets *pc to its chunk (the inverse of pp_next_stage); -1 for stage 0's
 * chunk 0 (the embedding). */
int pp_prev_stage(int P, int st, int c, int *pc);
/* Where the output of stage st's action a goes: F's activations to
 * pp_next_stage, B's input gradient to pp_prev_stage. Returns the stage and
 * sets *chunk to the chunk of the action that waits for it; -1 when it is
 * sent nowhere (W, an idle slot, the model's last chunk's F, stage 0's
 * chunk 0's B). */
int pp_send_target(PPAction a, int st, int P, int V, int *chunk);

/* "naive" | "gpipe" | "1f1b" | "interleaved" | "zb-h1" | "zb-h2" -> its
 * PPSchedule; -1 if s is none of them (or NULL). */
int pp_schedule_parse(const char *s);

/* The name pp_schedule_parse reads; "?" for a value outside the enum. */
const char *pp_schedule_name(PPSchedule s);

/* 1 when s runs each backward as B then a separate W (zb-h1, zb-h2). */
int pp_schedule_splits(PPSchedule s);

/* Whether s can run P stages, M micro-batches and V chunks a stage: 0, or
 * -1 with one line in err naming the rule broken (V > 1 only with
 * interleaved; what interleaved asks of M; P >= 1, M >= 1, V >= 1). */
int pp_schedule_check(PPSchedule s, int P, int M, int V, char *err, size_t errlen);

/* Actions of one stage: 2MV (each micro-batch's F and B once for each
 * chunk), 3M when the schedule splits the backward; -1 when
 * pp_schedule_check fails. */
int pp_num_actions(PPSchedule s, int P, int M, int V);

/* Writes the ordered actions of stage `stage` (0 .. P-1) into
 * out[pp_num_actions] and returns their number. Returns -1 (out untouched)
 * if pp_schedule_check fails or stage is out of range. */
int pp_actions(PPSchedule s, int P, int M, int V, int stage, PPAction *out);

/* The largest number of activation sets held over the prefixes of acts[n]:
 * a set (one micro-batch through one chunk) is taken at its F and given
 * back at its B, or at its W when the backward is split. 0 for n = 0. */
int pp_in_flight_peak(const PPAction *acts, int n);

/* The bubble of s with P, M, V in unit slots, the idle fraction
 * pp_timeline measures: (P-1)/P for naive, (P-1)/(M+P-1) for gpipe and
 * 1f1b, (P-1)/(VM+P-1) for interleaved, (P-1)/(3M+P-1) for zb-h1 and zb-h2
 * ((2P-M-1)/(2M+2P-1) when M < P). -1 for bad arguments. */
double pp_bubble_formula(PPSchedule s, int P, int M, int V);

/* pp_bubble_formula as text, "(P-1)/(M+P-1) = 3/10 = 0.300": what pp_show
 * and the SVG of --show-schedule print. 0, or -1 (buf untouched) for bad
 * arguments. */
int pp_bubble_text(PPSchedule s, int P, int M, int V, char *buf, size_t len);

/* Places every stage's actions, in its own pp_actions order, in unit time
 * slots: an action runs in the first slot after all it depends on has
 * finished; a stage runs at most one action a slot. Fills t (free it with
 * pp_timeline_free) and returns 0; returns -1 with t zeroed for bad
 * arguments, if allocation fails or if the schedule deadlocks. */
int pp_timeline(PPSchedule s, int P, int M, int V, PPTimeline *t);
void pp_timeline_free(PPTimeline *t);

/* Prints the schedule as the articles draw it: a title line, a ruler of
 * slot numbers, one row per stage (fixed-width cells, idle cells blank),
 * the measured bubble ("idle 24 of 56 slots = 0.429") beside its formula,
 * and each stage's peak activation sets in flight. Returns 0, or -1
 * (printing nothing) for bad arguments. */
int pp_show(FILE *f, PPSchedule s, int P, int M, int V);

/* The title line pp_show prints (and the SVG of --show-schedule repeats)
 * for a timeline of T slots: "1f1b schedule: P = 4 stages, M = 8
 * micro-batches, 22 time slots (F and B one slot each)", with the chunks
 * (V > 1) or "F, B and W one slot each" (split backward). 0, or -1 (buf
 * untouched) for bad arguments. */
int pp_show_title(PPSchedule s, int P, int M, int V, int T, char *buf, size_t len);

/* The text of one cell of the figure: "F3", "B3", "W3", with V > 1 the
 * chunk too, "F3.1" (micro-batch 3, chunk 1); "" for an idle slot. 0, or -1
 * when len is 0. */
int pp_cell_text(PPAction a, int V, char *buf, size_t len);

/* Sets of activations stage `stage` keeps (its pp_in_flight_peak, at least
 * 1): what pp_build allocates and the planner counts. A set is one
 * micro-batch through one chunk: with V > 1, 1/V of the stage's layers. */
int pp_sets_in_flight(PPSchedule s, int P, int M, int V, int stage);

#endif
