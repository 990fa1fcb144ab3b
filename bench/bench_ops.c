/* bench/bench_ops.c: where a CPU training step's time goes, op by op.
 *
 *   bench/bench_ops [--layers L] [--heads H] [--dim C] [--vocab V] [--max-seq S]
 *                   [--batch B] [--seq T] [--reps N] [--cpu-clock] [--cold]
 *
 * Times each float32 op (ops.c's cpu_*, what `train --device cpu` runs on
 * one rank) of one training step of a GPT-2 of that shape, on buffers of
 * the step's shapes, and multiplies by how often a step runs it. The ops
 * are those of gpt.c's gpt_forward_backward and dp.c's step on one rank:
 *  - forward: the embedding; per layer LayerNorm, qkv, attention, attproj,
 *    the residual add fused with the second LayerNorm (on the CPU, add then
 *    LayerNorm), fc, GELU, fcproj, the second residual add; the final
 *    LayerNorm and the head (the tied wte, no bias);
 *  - the loss: crossentropy, the fused softmax + loss + gradient over the
 *    logits (one rank does not split the vocabulary: no xent_*);
 *  - backward: the head's, then per layer each linear's matmul_backward,
 *    timed as its two parts (dX; dW with the bias's gradient), GELU,
 *    attention and the LayerNorms (which add the residual's gradient into
 *    dx themselves: there is no accumulate on one rank), the memsets of the
 *    backward's scratch, and the embedding's backward;
 *  - the optimizer: the gradients zeroed at the step's start, the global
 *    norm's passes, a row each, each one call over all the gradients as on
 *    one rank (exp_max, then sumsq_grid on the grid of optim.h, which finds
 *    the exponent too: a step whose grid, guessed from the last step's,
 *    holds pays only the second; each is one read of the gradients, the
 *    first as one stream a thread, the second as four), and adamw_segs over
 *    every parameter, one segment a tensor of gpt.h's layout with its
 *    weight decay.
 * Left out: the loss's mean (a sum of N floats) and the data loader.
 *
 * Each op runs once to warm up, then N times; the best wall-clock time
 * (CLOCK_MONOTONIC) counts. --cpu-clock takes the process's CPU clock
 * instead, as bench_gemm's does: on a loaded machine, with one thread
 * (OMP_NUM_THREADS=1), it counts only the time the op really ran (with
 * more it would count their sum, spinning included, so it is refused).
 * An op's inputs are warm in cache from its run before, as a layer's
 * activations are in a step but its weights are not, so the sum can come
 * out under a real step's time. --cold reads and writes a 512 MB buffer
 * (more than any L3 this runs on) with every thread before each call,
 * untimed, so that each op starts with its operands in memory, as a
 * step's weights, gradients and moments are: the two tables side by side
 * say which ops a step's cold caches cost. Values are small and deterministic
 * (tokens and targets below V; LayerNorm's statistics and attention's
 * probabilities made by their forward). Threads: OpenMP's, OMP_NUM_THREADS
 * (default all cores). The default model is GPT-2 124M (V 50257, padded to
 * 50304 as gpt.c pads) at batch 4 x seq 64; --max-seq, as in train,
 * defaults to T if longer than 256, else 256 (bench_cpu.sh passes GPT-2's
 * 1024).
 *
 * Prints the CPU, the GEMM kernel, the thread count and the load average
 * (on a busy machine an OpenMP barrier may wait a time slice for a thread
 * that is not running: more threads than idle cores gives noise, not
 * figures), then one row an op in step order: its shape (M x N x K for a
 * matmul), ms a call, calls a step, ms a step, its share of the sum,
 * GFLOP/s for the matmuls; then the matmuls' subtotal and, last, the sum.
 */
#include <getopt.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "gemm.h"
#include "gpt.h"
#include "ops.h"
#include "optim.h"
#include "tensor.h"

/* The model and the batch. */
typedef struct {
    int L, NH, C, V, Vp, maxT, B, T;
    size_t N;       /* B*T rows */
    size_t params;  /* parameters in gpt.h's layout */
} Shape;

/* One linear layer's operands: out [N,OC] = inp [N,C] w [OC,C]^T + b [OC]. */
typedef struct {
    int C, OC;
    const float *inp, *w, *b;   /* [N,C], [OC,C], [OC] (b NULL: the head) */
    float *out;                 /* [N,OC] */
    const float *dout;          /* [N,OC] */
    float *dinp, *dw, *db;      /* [N,C], [OC,C], [OC] (db NULL: the head) */
} Linear;

enum { LIN_QKV, LIN_ATTPROJ, LIN_FC, LIN_FCPROJ, LIN_HEAD, NLIN };
static const char *const lin_name[NLIN] = {"qkv", "attproj", "fc", "fcproj", "head"};

typedef enum {
    K_ZERO_GRADS, K_ENCODER_FWD, K_LN_FWD, K_MM_FWD, K_ATTN_FWD, K_ADD, K_GELU_FWD, K_XENT,
    K_MM_DX, K_MM_DW, K_ZERO_HEAD, K_ZERO_LAYER, K_GELU_BWD, K_LN_BWD, K_ATTN_BWD,
    K_ENCODER_BWD, K_NORM_EXP, K_NORM_GRID, K_ADAMW
} Kind;

/* One row of the table: an op, how often a step runs it, and its time. */
typedef struct {
    Kind kind;
    int lin;             /* the matmuls: which Linear */
    char op[32], shape[40];
    long calls;          /* a step */
    double flops;        /* a call; 0 but for the matmuls */
    double ms;           /* a call: the best of the reps */
} Row;

#define MAX_ROWS 40
#define FLUSH_FLOATS ((size_t)128 << 20)  /* --cold's buffer: 512 MB */

typedef struct {
    Shape s;
    Dev dev;
    int reps;
    float *flush;                    /* [FLUSH_FLOATS] with --cold, else NULL */
    clockid_t clock;                 /* CLOCK_MONOTONIC, or the process's CPU clock */
    /* parameters, gradients and AdamW's moments in gpt.h's layout:
     * [wte Vp,C] [wpe maxT,C] [layer 0: ln1w .. fcprojb] ... [lnfw C] [lnfb C] */
    float *params, *grads, *m, *v;   /* [params] each */
    GPT model;                       /* its params and grads: b->params, b->grads */
    AdamSeg *segs;                   /* [nsegs] one a tensor of a layer, in layout order */
    int nsegs, cap;
    size_t off[GPT_NTENSORS];        /* each tensor's offset (layer 0's for per-layer ones) */
    int *tokens, *targets;           /* [B,T] each, in [0,V) */
    /* one layer's activations (every layer's calls run on these) */
    float *x, *ln, *mean, *rstd;     /* [N,C], [N,C], [N], [N] */
    float *qkv, *atty, *att;         /* [N,3C], [N,C], [B,NH,T,T] */
    float *proj, *res2;              /* [N,C], [N,C] */
    float *fch, *fchg;               /* [N,4C], [N,4C] */
    float *logits, *logits0, *losses;  /* [N,Vp], [N,Vp] their first values, [N] */
    /* the backward's gradients and scratch */
    float *dx, *dfull;               /* [N,C] the stream's, [N,C] a LayerNorm's output's */
    float *dqkv, *datty, *datt;      /* [N,3C], [N,C], [B,NH,T,T] */
    float *dfch, *dfchg;             /* [N,4C], [N,4C] */
    Linear lin[NLIN];
    Row rows[MAX_ROWS];
    int nrows;
    double sink;                     /* the norms, so that they are used */
    int norm_e;                      /* the exponent pass's answer, the grid pass's grid */
} Bench;

static double now(clockid_t clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* p[n] from a hash of the index, in [lo, hi). */
static void fill(float *p, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++)
        p[i] = lo + (hi - lo) * (float)((i * 2654435761u) % 1000) / 1000.0f;
}

/* n floats on the CPU, filled in [lo, hi) (every page touched before timing). */
static float *filled(Bench *b, size_t n, float lo, float hi) {
    float *p = dev_alloc(&b->dev, n * sizeof(float));
    fill(p, n, lo, hi);
    return p;
}

/* One AdamW segment a piece of gpt_segments (one tensor of one layer), as optim.c builds them. */
static void add_seg(void *ctx, size_t off, size_t n, int tensor) {
    Bench *b = ctx;
    if (b->nsegs == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 64;
        b->segs = realloc(b->segs, (size_t)b->cap * sizeof *b->segs);
        if (!b->segs) { fprintf(stderr, "bench_ops: out of memory\n"); exit(2); }
    }
    b->segs[b->nsegs++] = (AdamSeg){b->params + off, b->grads + off, b->m + off, b->v + off, n,
                                    gpt_tensor_decays(tensor) ? 0.1f : 0.0f, NULL};
}

/* The model's parameters and gradients in gpt.c's layout (gpt_build, one
 * rank, the whole model), AdamW's moments, and its segments. */
static void build_params(Bench *b) {
    Shape *s = &b->s;
    GPTConfig cfg = {s->maxT, s->V, s->Vp, s->L, s->NH, s->C};
    GPTShard whole = gpt_whole(&cfg);
    gpt_build(&b->model, &cfg, &b->dev, &whole);
    s->params = b->model.num_params;
    b->params = b->model.params;
    b->grads = b->model.grads;
    fill(b->params, s->params, -0.05f, 0.05f);
    fill(b->grads, s->params, -0.01f, 0.01f);
    b->m = filled(b, s->params, -1e-3f, 1e-3f);
    b->v = filled(b, s->params, 1e-7f, 1e-5f);
    for (int i = 0; i < GPT_NTENSORS; i++)
        b->off[i] = (size_t)(gpt_tensor(&b->model, b->params, i, 0) - b->params);
    gpt_segments(&b->model, 0, s->params, add_seg, b);
}

static Linear linear(int C, int OC, const float *inp, const float *w, const float *bias, float *out,
                     const float *dout, float *dinp, float *dw, float *db) {
    return (Linear){C, OC, inp, w, bias, out, dout, dinp, dw, db};
}

/* One layer's activations and gradients, filled; mean, rstd and att made by their forwards. */
static void build_acts(Bench *b) {
    const Shape *s = &b->s;
    size_t N = s->N, C = s->C, NC = N * C, att = (size_t)s->B * s->NH * s->T * s->T;
    b->tokens = malloc(N * sizeof(int));
    b->targets = malloc(N * sizeof(int));
    if (!b->tokens || !b->targets) { fprintf(stderr, "bench_ops: out of memory\n"); exit(2); }
    for (size_t i = 0; i < N; i++) {
        b->tokens[i] = (int)((i * 2654435761u) % (unsigned)s->V);
        b->targets[i] = (int)(((i + 1) * 2654435761u) % (unsigned)s->V);
    }
    b->x = filled(b, NC, -1, 1);
    b->ln = filled(b, NC, -1, 1);
    b->mean = filled(b, N, 0, 0);
    b->rstd = filled(b, N, 0, 0);
    b->qkv = filled(b, 3 * NC, -1, 1);
    b->atty = filled(b, NC, -0.5f, 0.5f);
    b->att = filled(b, att, 0, 0);
    b->proj = filled(b, NC, -0.5f, 0.5f);
    b->res2 = filled(b, NC, 0, 0);
    b->fch = filled(b, 4 * NC, -2, 2);
    b->fchg = filled(b, 4 * NC, -0.5f, 0.5f);
    b->logits0 = filled(b, N * s->Vp, -2, 2);
    b->logits = filled(b, N * s->Vp, -2, 2);
    b->losses = filled(b, N, 0, 0);
    b->dx = filled(b, NC, -0.01f, 0.01f);
    b->dfull = filled(b, NC, -0.01f, 0.01f);
    b->dqkv = filled(b, 3 * NC, -0.01f, 0.01f);
    b->datty = filled(b, NC, -0.01f, 0.01f);
    b->datt = filled(b, att, 0, 0);
    b->dfch = filled(b, 4 * NC, -0.01f, 0.01f);
    b->dfchg = filled(b, 4 * NC, -0.01f, 0.01f);
    cpu_layernorm_forward(&b->dev, b->ln, b->mean, b->rstd, b->x, b->params + b->off[GPT_LN1W],
                          b->params + b->off[GPT_LN1B], (int)N, (int)C);
    cpu_attention_forward(&b->dev, b->atty, b->att, b->qkv, s->B, s->T, s->C, s->NH);
    float *p = b->params, *g = b->grads;
    const size_t *o = b->off;
    int c = s->C;
    b->lin[LIN_QKV] = linear(c, 3 * c, b->ln, p + o[GPT_QKVW], p + o[GPT_QKVB], b->qkv, b->dqkv, b->dfull,
                             g + o[GPT_QKVW], g + o[GPT_QKVB]);
    b->lin[LIN_ATTPROJ] = linear(c, c, b->atty, p + o[GPT_ATTPROJW], p + o[GPT_ATTPROJB], b->proj, b->dx,
                                 b->datty, g + o[GPT_ATTPROJW], g + o[GPT_ATTPROJB]);
    b->lin[LIN_FC] = linear(c, 4 * c, b->ln, p + o[GPT_FCW], p + o[GPT_FCB], b->fch, b->dfch, b->dfull,
                            g + o[GPT_FCW], g + o[GPT_FCB]);
    b->lin[LIN_FCPROJ] = linear(4 * c, c, b->fchg, p + o[GPT_FCPROJW], p + o[GPT_FCPROJB], b->proj, b->dx,
                                b->dfchg, g + o[GPT_FCPROJW], g + o[GPT_FCPROJB]);
    b->lin[LIN_HEAD] = linear(c, s->Vp, b->ln, p + o[GPT_WTE], NULL, b->logits, b->logits, b->dfull,
                              g + o[GPT_WTE], NULL);
}

static void bench_build(Bench *b, const Shape *s, int reps, clockid_t clock) {
    char err[200];
    memset(b, 0, sizeof *b);
    b->s = *s;
    b->reps = reps;
    b->clock = clock;
    b->norm_e = 127;   /* gradients below 2 until the exponent pass has run */
    if (dev_open(&b->dev, DEV_CPU, -1, err, sizeof err)) { fprintf(stderr, "bench_ops: %s\n", err); exit(2); }
    build_params(b);
    build_acts(b);
}

static void bench_free(Bench *b) {
    const Shape *s = &b->s;
    size_t N = s->N, NC = N * s->C, att = (size_t)s->B * s->NH * s->T * s->T;
    Dev *d = &b->dev;
    gpt_free(&b->model);
    if (b->flush) dev_free(d, b->flush, FLUSH_FLOATS * sizeof(float));
    dev_free(d, b->m, s->params * sizeof(float));
    dev_free(d, b->v, s->params * sizeof(float));
    struct { float *p; size_t n; } a[] = {
        {b->x, NC}, {b->ln, NC}, {b->mean, N}, {b->rstd, N}, {b->qkv, 3 * NC}, {b->atty, NC},
        {b->att, att}, {b->proj, NC}, {b->res2, NC}, {b->fch, 4 * NC}, {b->fchg, 4 * NC},
        {b->logits0, N * s->Vp}, {b->logits, N * s->Vp}, {b->losses, N}, {b->dx, NC}, {b->dfull, NC},
        {b->dqkv, 3 * NC}, {b->datty, NC}, {b->datt, att}, {b->dfch, 4 * NC}, {b->dfchg, 4 * NC},
    };
    for (size_t i = 0; i < sizeof a / sizeof a[0]; i++) dev_free(d, a[i].p, a[i].n * sizeof(float));
    free(b->segs);
    free(b->tokens);
    free(b->targets);
    dev_close(d);
}

/* Appends a row; shape is a printf format. */
static void add_row(Bench *b, Kind kind, int lin, const char *op, long calls, double flops,
                    const char *shape, ...) {
    if (b->nrows == MAX_ROWS) { fprintf(stderr, "bench_ops: more than %d rows\n", MAX_ROWS); exit(2); }
    Row *r = &b->rows[b->nrows++];
    va_list ap;
    va_start(ap, shape);
    vsnprintf(r->shape, sizeof r->shape, shape, ap);
    va_end(ap);
    r->kind = kind;
    r->lin = lin;
    snprintf(r->op, sizeof r->op, "%s", op);
    r->calls = calls;
    r->flops = flops;
}

/* A linear's matmul row: pass 0 forward, 1 dX, 2 dW (+ the bias's gradient). */
static void add_matmul(Bench *b, int lin, int pass, long calls) {
    const Linear *l = &b->lin[lin];
    long N = (long)b->s.N;
    long M = pass == 2 ? l->OC : N, Nn = pass == 0 ? l->OC : l->C, K = pass == 0 ? l->C : pass == 1 ? l->OC : N;
    char op[32];
    snprintf(op, sizeof op, "matmul %s %s", lin_name[lin],
             pass == 0 ? "fwd" : pass == 1 ? "dX" : l->db ? "dW+db" : "dW");
    add_row(b, pass == 0 ? K_MM_FWD : pass == 1 ? K_MM_DX : K_MM_DW, lin, op, calls, 2.0 * M * Nn * K,
            "%ldx%ldx%ld", M, Nn, K);
}

/* The table's rows in the order a step runs them. */
static void build_rows(Bench *b) {
    const Shape *s = &b->s;
    long L = s->L, N = (long)s->N;
    int C = s->C;
    add_row(b, K_ZERO_GRADS, -1, "zero grads (memset)", 1, 0, "%zu", s->params);
    add_row(b, K_ENCODER_FWD, -1, "encoder fwd", 1, 0, "[%ld,%d]", N, C);
    add_row(b, K_LN_FWD, -1, "layernorm fwd", 2 * L + 1, 0, "[%ld,%d]", N, C);
    add_matmul(b, LIN_QKV, 0, L);
    add_row(b, K_ATTN_FWD, -1, "attention fwd", L, 0, "B%d NH%d T%d hs%d", s->B, s->NH, s->T, C / s->NH);
    add_matmul(b, LIN_ATTPROJ, 0, L);
    add_row(b, K_ADD, -1, "residual add", 2 * L, 0, "[%ld,%d]", N, C);
    add_matmul(b, LIN_FC, 0, L);
    add_row(b, K_GELU_FWD, -1, "gelu fwd", L, 0, "[%ld,%d]", N, 4 * C);
    add_matmul(b, LIN_FCPROJ, 0, L);
    add_matmul(b, LIN_HEAD, 0, 1);
    add_row(b, K_XENT, -1, "crossentropy (fused)", 1, 0, "[%ld,%d] V %d", N, s->Vp, s->V);
    add_row(b, K_ZERO_HEAD, -1, "zero bwd scratch, head", 1, 0, "2 x [%ld,%d]", N, C);
    add_matmul(b, LIN_HEAD, 1, 1);
    add_matmul(b, LIN_HEAD, 2, 1);
    add_row(b, K_LN_BWD, -1, "layernorm bwd", 2 * L + 1, 0, "[%ld,%d]", N, C);
    add_row(b, K_ZERO_LAYER, -1, "zero bwd scratch, layer", L, 0, "14 x [%ld,%d]", N, C);
    add_matmul(b, LIN_FCPROJ, 1, L);
    add_matmul(b, LIN_FCPROJ, 2, L);
    add_row(b, K_GELU_BWD, -1, "gelu bwd", L, 0, "[%ld,%d]", N, 4 * C);
    add_matmul(b, LIN_FC, 1, L);
    add_matmul(b, LIN_FC, 2, L);
    add_matmul(b, LIN_ATTPROJ, 1, L);
    add_matmul(b, LIN_ATTPROJ, 2, L);
    add_row(b, K_ATTN_BWD, -1, "attention bwd", L, 0, "B%d NH%d T%d hs%d", s->B, s->NH, s->T, C / s->NH);
    add_matmul(b, LIN_QKV, 1, L);
    add_matmul(b, LIN_QKV, 2, L);
    add_row(b, K_ENCODER_BWD, -1, "encoder bwd", 1, 0, "[%ld,%d] -> wte, wpe", N, C);
    /* 0 calls a step: only a step whose guessed grid misses (the first, or
     * the largest gradient crossing a power of 2) reads the gradients again */
    add_row(b, K_NORM_EXP, -1, "grad norm: exponent pass", 0, 0, "%zu", s->params);
    add_row(b, K_NORM_GRID, -1, "grad norm: grid pass", 1, 0, "%zu", s->params);
    add_row(b, K_ADAMW, -1, "adamw_segs", 1, 0, "%zu in %d", s->params, b->nsegs);
}

/* Before each run of r, untimed: crossentropy overwrites its logits with their gradient. */
static void op_prepare(Bench *b, const Row *r) {
    if (r->kind == K_XENT) memcpy(b->logits, b->logits0, b->s.N * b->s.Vp * sizeof(float));
}

/* One call of r's op, as gpt.c (or dp.c) makes it on one rank. */
static void op_run(Bench *b, const Row *r) {
    const Shape *s = &b->s;
    Dev *d = &b->dev;
    const Linear *l = r->lin >= 0 ? &b->lin[r->lin] : NULL;
    int N = (int)s->N, C = s->C;
    size_t NC = s->N * C, f = sizeof(float);
    const float *p = b->params;
    float *g = b->grads;
    switch (r->kind) {
    case K_ZERO_GRADS: dev_zero(d, b->grads, s->params * f); break;
    case K_ENCODER_FWD:
        cpu_encoder_forward(d, b->x, b->tokens, p + b->off[GPT_WTE], p + b->off[GPT_WPE], s->B, s->T, C);
        break;
    case K_LN_FWD:
        cpu_layernorm_forward(d, b->ln, b->mean, b->rstd, b->x, p + b->off[GPT_LN1W], p + b->off[GPT_LN1B], N, C);
        break;
    case K_MM_FWD: cpu_matmul_forward(d, l->out, l->inp, l->w, l->b, N, l->C, l->OC); break;
    case K_ATTN_FWD: cpu_attention_forward(d, b->atty, b->att, b->qkv, s->B, s->T, C, s->NH); break;
    case K_ADD: cpu_add(d, b->res2, b->x, b->proj, NC); break;
    case K_GELU_FWD: cpu_gelu_forward(d, b->fchg, b->fch, 4 * NC); break;
    case K_XENT: cpu_crossentropy(d, b->losses, b->logits, b->targets, N, s->V, s->Vp, 1.0f / N); break;
    case K_MM_DX: cpu_matmul_backward(d, l->dinp, NULL, NULL, l->dout, l->inp, l->w, N, l->C, l->OC); break;
    case K_MM_DW: cpu_matmul_backward(d, NULL, l->dw, l->db, l->dout, l->inp, l->w, N, l->C, l->OC); break;
    case K_ZERO_HEAD:  /* gpt_head_backward's: the head's dX and the stream's gradient */
        dev_zero(d, b->dfull, NC * f);
        dev_zero(d, b->dx, NC * f);
        break;
    case K_ZERO_LAYER:  /* layer_backward's six, in its order */
        dev_zero(d, b->dfchg, 4 * NC * f);
        dev_zero(d, b->dfch, 4 * NC * f);
        dev_zero(d, b->dfull, NC * f);
        dev_zero(d, b->datty, NC * f);
        dev_zero(d, b->dqkv, 3 * NC * f);
        dev_zero(d, b->dfull, NC * f);
        break;
    case K_GELU_BWD: cpu_gelu_backward(d, b->dfch, b->fch, b->dfchg, 4 * NC); break;
    case K_LN_BWD:
        cpu_layernorm_backward(d, b->dx, g + b->off[GPT_LN1W], g + b->off[GPT_LN1B], b->dfull, b->x,
                               p + b->off[GPT_LN1W], b->mean, b->rstd, N, C);
        break;
    case K_ATTN_BWD:
        cpu_attention_backward(d, b->dqkv, b->datt, b->datty, b->qkv, b->att, s->B, s->T, C, s->NH);
        break;
    case K_ENCODER_BWD:
        cpu_encoder_backward(d, g + b->off[GPT_WTE], g + b->off[GPT_WPE], b->dx, b->tokens, s->B, s->T, C);
        break;
    case K_NORM_EXP:  /* dp.c's global_norm through zero_norm_runs: on one rank, one run a pass over all */
        b->norm_e = cpu_exp_max(d, b->grads, s->params);
        break;
    case K_NORM_GRID: {
        NormGrid grid = optim_norm_grid(b->norm_e, s->params);
        double acc[3] = {0, 0, 0};
        cpu_sumsq_grid(d, b->grads, s->params, &grid, acc);
        b->sink += acc[0] + acc[1] + acc[2];
        break;
    }
    case K_ADAMW:  /* optim.c's adam_flush at step 1: betas 0.9, 0.95 */
        cpu_adamw_segs(d, b->segs, b->nsegs, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.05f, 1.0f);
        break;
    }
}

/* --cold: every thread reads and writes its share of the flush buffer, a
 * line at a time, so every cache level holds it and nothing of the op's. */
static void flush_caches(Bench *b) {
    float *f = b->flush;
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < FLUSH_FLOATS; i += 16) f[i] += 1;
}

/* Times every row: a warm-up run, then the best of reps, in ms a call. */
static void time_rows(Bench *b) {
    for (int i = 0; i < b->nrows; i++) {
        Row *r = &b->rows[i];
        double best = 1e30;
        for (int rep = 0; rep <= b->reps; rep++) {
            op_prepare(b, r);
            if (b->flush) flush_caches(b);
            double t0 = now(b->clock);
            op_run(b, r);
            double t = now(b->clock) - t0;
            if (rep > 0 && t < best) best = t;
        }
        r->ms = best * 1e3;
    }
}

static void print_table(const Bench *b, int threads) {
    const Shape *s = &b->s;
    char cpu[128];
    const char *isa;
    gemm_cpu_describe(cpu, sizeof cpu, &isa);
    printf("bench_ops: GPT-2 of %d layers, %d heads, dim %d, vocab %d (padded %d), max-seq %d: %zu parameters;"
           " batch %d x seq %d\n", s->L, s->NH, s->C, s->V, s->Vp, s->maxT, s->params, s->B, s->T);
    double load = -1;
    getloadavg(&load, 1);
    printf("cpu: %s, %s; gemm kernel %s; %d thread%s; load average %.2f on %d cores;", cpu, isa,
           gemm_kernel_name(), threads, threads == 1 ? "" : "s", load, omp_get_num_procs());
    printf(" best of %d after a warm-up, %s clock%s\n", b->reps, b->clock == CLOCK_MONOTONIC ? "wall" : "process CPU",
           b->flush ? "; caches flushed before each call (--cold)" : "");
    double sum = 0, mm_ms = 0, mm_flops = 0;
    for (int i = 0; i < b->nrows; i++) sum += b->rows[i].ms * b->rows[i].calls;
    printf("%-26s %-22s %10s %6s %10s %6s %8s\n", "op", "shape (matmul MxNxK)", "ms a call", "calls",
           "ms a step", "% sum", "GFLOP/s");
    for (int i = 0; i < b->nrows; i++) {
        const Row *r = &b->rows[i];
        double step = r->ms * r->calls;
        printf("%-26s %-22s %10.3f %6ld %10.2f %6.1f", r->op, r->shape, r->ms, r->calls, step, 100 * step / sum);
        if (r->flops > 0) {
            printf(" %8.1f", r->flops / (r->ms * 1e-3) / 1e9);
            mm_ms += step;
            mm_flops += r->flops * r->calls;
        }
        printf("\n");
    }
    printf("%-26s %-22s %10s %6s %10.2f %6.1f %8.1f\n", "matmuls (the linears)", "", "", "", mm_ms,
           100 * mm_ms / sum, mm_flops / (mm_ms * 1e-3) / 1e9);
    printf("%-26s %-22s %10s %6s %10.2f %6.1f   (%.0f tokens/s)\n", "sum", "", "", "", sum, 100.0,
           (double)s->N / (sum * 1e-3));
}

static int usage(void) {
    fprintf(stderr, "usage: bench_ops [--layers L] [--heads H] [--dim C] [--vocab V] [--max-seq S]"
                    " [--batch B] [--seq T] [--reps N] [--cpu-clock] [--cold]\n"
                    "  (defaults: GPT-2 124M, 12 12 768 50257, max-seq T or 256, batch 4, seq 64, 3 reps)\n");
    return 2;
}

int main(int argc, char **argv) {
    Shape s = {.L = 12, .NH = 12, .C = 768, .V = 50257, .B = 4, .T = 64};
    int reps = 3;
    clockid_t clock = CLOCK_MONOTONIC;
    static const struct option longopts[] = {
        {"layers", required_argument, NULL, 'L'}, {"heads", required_argument, NULL, 'H'},
        {"dim", required_argument, NULL, 'C'},    {"vocab", required_argument, NULL, 'V'},
        {"max-seq", required_argument, NULL, 'S'}, {"batch", required_argument, NULL, 'B'},
        {"seq", required_argument, NULL, 'T'},    {"reps", required_argument, NULL, 'r'},
        {"cpu-clock", no_argument, NULL, 'c'},    {"cold", no_argument, NULL, 'k'},
        {NULL, 0, NULL, 0}};
    int cold = 0;
    int ch, li = 0;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, ":", longopts, &li)) != -1) {
        if (ch == 'c') { clock = CLOCK_PROCESS_CPUTIME_ID; continue; }
        if (ch == 'k') { cold = 1; continue; }
        if (ch == ':' || ch == '?') {
            fprintf(stderr, "bench_ops: %s %s\n", argv[optind - 1], ch == ':' ? "needs a value" : "is not a flag");
            return usage();
        }
        char *end;
        long v = strtol(optarg, &end, 10);
        if (*end || end == optarg || v < 1 || v > 10000000) {
            fprintf(stderr, "bench_ops: --%s %s: expected a count >= 1\n", longopts[li].name, optarg);
            return usage();
        }
        switch (ch) {
        case 'L': s.L = (int)v; break;
        case 'H': s.NH = (int)v; break;
        case 'C': s.C = (int)v; break;
        case 'V': s.V = (int)v; break;
        case 'S': s.maxT = (int)v; break;
        case 'B': s.B = (int)v; break;
        case 'T': s.T = (int)v; break;
        case 'r': reps = (int)v; break;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "bench_ops: unexpected argument '%s'\n", argv[optind]);
        return usage();
    }
    if (!s.maxT) s.maxT = s.T > 256 ? s.T : 256;
    if (s.B < 1 || s.T < 1 || s.T > s.maxT || reps < 1) return usage();
    GPTConfig cfg = {s.maxT, s.V, 0, s.L, s.NH, s.C};
    char err[200];
    if (gpt_config_check(&cfg, err, sizeof err)) {  /* as train checks it; pads the vocabulary */
        fprintf(stderr, "bench_ops: %s\n", err);
        return 2;
    }
    if (clock != CLOCK_MONOTONIC && omp_get_max_threads() != 1) {
        fprintf(stderr, "bench_ops: --cpu-clock needs OMP_NUM_THREADS=1\n");
        return 2;
    }
    s.Vp = cfg.padded_vocab;
    s.N = (size_t)s.B * s.T;
    Bench b;
    bench_build(&b, &s, reps, clock);
    if (cold) b.flush = filled(&b, FLUSH_FLOATS, 0, 1);
    build_rows(&b);
    time_rows(&b);
    print_table(&b, omp_get_max_threads());
    bench_free(&b);
    return 0;
}
