/* trace.h: a Chrome / Perfetto trace of every rank's spans (--trace FILE).
 *
 * What the pipeline figures of auto-parallel-partitioning.txt (3.2
 * 流水线并行) draw with unit-width boxes, measured: each rank records its
 * forward, backward, communication and optimizer spans with wall-clock
 * times, and the merged file shows one row per rank in ui.perfetto.dev or
 * chrome://tracing, where the real bubble is the blank between the boxes.
 *
 * Format (the Trace Event Format's JSON object form):
 *   {"traceEvents":[
 *   {"name":"process_name","ph":"M","pid":0,"tid":0,"args":{"name":"rank 0"}},
 *   {"name":"F3","cat":"compute","ph":"X","pid":0,"tid":0,"ts":1712000000123456.789,"dur":812.345},
 *   ...]}
 * pid is the rank, tid 0 compute (any cat but "comm") and tid 1
 * communication (cat "comm"); ts and dur are microseconds of CLOCK_REALTIME,
 * so the ranks of one host share a clock.
 *
 * Writing: each rank appends its events, one a line, to its own part file
 * <path>.<rank>.part (buffered; a span is written when it ends), so ranks
 * never share a file. After the last step every rank calls trace_close,
 * the ranks meet at a barrier, and rank 0 calls trace_merge, which joins
 * the parts into <path> (through <path>.tmp and a rename) and deletes them.
 *
 * The measured timeline: trace_merge also draws the merged spans as SVG
 * beside the trace, at <path> with a final ".json" replaced by ".svg"
 * (trace.json -> trace.svg), else at <path>.svg, and prints "trace drawn
 * in <svg>". It is the article's pipeline figure with measured widths: x is
 * milliseconds since the first span, a row a rank ("rank r") with a compute
 * lane over a thinner comm lane (send purple, recv orange). F<m>, B<m> and
 * W<m> (and F<m>c<k>, micro-batch m of model chunk k) are coloured by
 * micro-batch, F light, W middle, B dark, a chunk past 0 hatched; other
 * compute spans (optimizer, ...) grey. Nested spans are all drawn, each
 * inset by its depth over the span around it. Idle time is left empty: the
 * title gives each rank's idle fraction, the part of its window (its first
 * span's start to its last span's end, shaded) covered by no compute span.
 * Each span is a <rect class="span"> with data-rank, data-lane
 * (compute|comm), data-depth, data-name, data-cat, and data-ts, data-dur
 * exactly as in the JSON (plus data-kind, data-micro, data-chunk for a
 * micro-batch's span), and a <title> tooltip; each row a <g class="rank">
 * with data-idle and data-comm. Only the earliest 4000 spans are drawn (the
 * title says so when more were recorded; the JSON keeps them all).
 *
 * A NULL Trace makes every call a no-op, so callers need no ifs:
 *   Trace *tr = trace_open(cfg.trace, rank, world);   (NULL when no --trace)
 *   trace_begin(tr, "F3", "compute"); ... trace_end(tr);
 */
#ifndef TRACE_H
#define TRACE_H

typedef struct Trace Trace;

/* Opens rank `rank`'s part of trace `path` (<path>.<rank>.part, truncated)
 * and writes its metadata events (process "rank r", threads "compute" and
 * "comm"). Returns NULL when path is NULL or empty (tracing off), and NULL
 * with a line on stderr when the file cannot be created. A write that fails
 * later (a full disk) is said at once in one line on stderr; nothing more
 * is recorded, and trace_close returns -1. */
Trace *trace_open(const char *path, int rank, int world);

/* Milliseconds on a monotonic clock: the step line's timings, --time-limit's
 * clock, the checkpoint's save time (the trace's own events are stamped in
 * wall-clock time, to merge ranks). */
double trace_now_ms(void);

/* Opens a span named `name` (copied; names longer than 63 bytes are cut) of
 * category `cat` ("compute", "comm", "optimizer", ...) now. Spans nest, 16
 * deep; spans opened beyond that depth are not recorded (their trace_end is
 * still expected). */
void trace_begin(Trace *t, const char *name, const char *cat);

/* Closes the innermost open span now and writes it as a complete ("X")
 * event. Without an open span it does nothing. */
void trace_end(Trace *t);

/* Ends the spans still open, flushes and closes the part file, frees t.
 * 0, or -1 when a write of the part failed (said on stderr when it did). */
int trace_close(Trace *t);

/* Rank 0, after every rank's trace_close (a barrier between): joins the
 * parts of ranks 0 .. world-1 into one JSON file at `path`, written to
 * <path>.tmp and renamed, and deletes the parts; then draws the timeline
 * (above) beside it the same way and prints "trace drawn in <svg>" on
 * stdout. A torn last line of a part (a rank that died mid-write) is
 * dropped. Returns the number of events written (metadata included).
 * Returns -1 with a line on stderr if path cannot be written (the parts are
 * kept), or if a part is missing (the others are still merged and drawn).
 * A timeline that cannot be written costs a line on stderr, not the
 * trace. */
int trace_merge(const char *path, int world);

#endif
