/* plan.c: the auto-parallel planner, read beside the second article
 * (自动并行; auto-parallel-partitioning.txt, 4 混合并行) and its GPT-3
 * example: "combine data and model parallelism considering the model and
 * the hardware". The GPUs it knows (h100, a100: memory, peak, links) are
 * written once, here (plan_cluster_preset, plan_device_tflops).
 *
 * For every layout dp x cp x tp x pp = gpus, ZeRO 0-3, offload,
 * micro-batches, schedule, recompute and sp it predicts per rank:
 *  - memory, by the functions train's memory line uses: gpt_shard_params
 *    (what gpt_build allocates), zero_memory_formula (the ZeRO paper's
 *    accounting zero_memory prints), gpt_acts_formula x pp_sets_in_flight
 *    (what pp_build allocates: one set of activations a micro-batch in
 *    flight, the schedule's peak), gpt_scratch_formula (the backward's
 *    scratch beside them), cp's ring buffers;
 *  - bytes a step in each group, the formulas test_dp, test_tp and test_3d
 *    check --comm-stats against (bus bytes, nccl-tests convention), cp's
 *    ring (cp.c) among them;
 *  - the bubble (pp_bubble_formula) and a step time: compute at the GPU's
 *    rate, each group's bytes at latency + bytes / bandwidth of the link
 *    it crosses (CPU ranks that share a host's cores: compute laid on the
 *    schedule's timeline, compute_wall). The assumptions are printed with
 *    the plan. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "plan.h"
#include "safe.h"
#include "pp.h"
#include "zero.h"
#include "tc.h"

#define MFU_RATE 0.5    /* achieved fraction of peak in the matmuls */
#define DP_HIDDEN 0.8   /* fraction of the dp reduction hidden behind backward (buckets) */

static const char *const row_kind[PLAN_NROWS] = {"all_reduce", "all_gather", "reduce_scatter", "all_reduce",
    "reduce_scatter", "all_gather", "send", "recv", "all_reduce", "broadcast", "all_reduce", "send", "recv"};
static const char *const row_group[PLAN_NROWS] = {"tp", "tp", "tp", "dp", "dp", "dp", "pp", "pp", "pp", "pp",
    "embed", "cp", "cp"};
const char *plan_row_kind(int i) { return i >= 0 && i < PLAN_NROWS ? row_kind[i] : "?"; }
const char *plan_row_group(int i) { return i >= 0 && i < PLAN_NROWS ? row_group[i] : "?"; }

/* Bus bytes of one operation over n ranks, as comm.c counts them (nccl-tests'
 * convention, whole bytes): an all-reduce of b bytes moves 2(n-1)/n b, an
 * all-gather or reduce-scatter of b bytes in all (n-1)/n b. */
static double bus_ar(int n, double b) { return n > 1 ? floor(2.0 * (n - 1) * b / n) : 0; }
static double bus_ag(int n, double b) { return n > 1 ? floor((double)(n - 1) * b / n) : 0; }
/* The gradient norm's two all-reduces over a group of n (dp.c, optim.h):
 * the largest exponent, then the parts of the sum as int32 limbs. */
static double norm_ar(int n) { return bus_ar(n, 4) + bus_ar(n, 4 * OPTIM_NORM_LIMBS); }

/* Flops a token of one training step, forward and backward (PaLM's
 * appendix B, Megatron's count):
 *  - the matmuls with parameters: a parameter meets each token once in
 *    forward, a multiply and an add (2 flops), and twice in backward (the
 *    input's gradient and its own): 6 flops a parameter, 6N (N counts the
 *    embeddings too, as the published figures do);
 *  - attention's two matmuls without parameters, QK^T and PV: a token's
 *    query meets T keys over C channels, and its T probabilities meet T
 *    values over C channels: 2 x 2 T C flops forward a layer, twice that
 *    backward: 12 L C T a token;
 *  - a causal model computes only the lower half of the T x T scores and
 *    probabilities (the kernels skip the masked half): 6 L C T.
 * PLAN_FLOPS_FULL is the count published MFUs use (the planner's, to be
 * compared with them); PLAN_FLOPS_CAUSAL is the work done (the step line's
 * MFU, runlog.c). */
double plan_flops_per_token(const GPTConfig *cfg, int seq, PlanFlops which) {
    double attention = which == PLAN_FLOPS_FULL ? 12.0 : 6.0;
    return 6.0 * gpt_total_params(cfg) + attention * cfg->layers * cfg->dim * (double)seq;
}

/* The layer forwards --recompute runs again for a micro-batch on this
 * stage: B recomputes every layer of a chunk of two or more (a chunk of
 * one keeps its layer's activations: gpt.c's kept slot is that layer's
 * own), and a split backward's W all but each chunk's first once more. */
static int recomputed_layers(const GPTShard *s) {
    int n = 0, V = s->nchunks > 1 ? s->nchunks : 1;
    for (int k = 0; k < V; k++) {
        int nl = V > 1 ? s->chunk_nlayers[k] : s->nlayers;
        if (nl > 1) n += nl + (s->split_backward ? nl - 1 : 0);
    }
    return n;
}

int plan_rank(const GPTConfig *cfg, const PlanCluster *c, const Layout *l, int stage, PlanRank *r) {
    memset(r, 0, sizeof *r);
    if (layout_check(l, cfg, 0, NULL, 0) != 0) return -1;
    GPTShard s;
    layout_stage_shard(l, cfg, stage, 0, &s);   /* what train builds on this stage (tp rank 0's shape) */
    /* D: the group gradients reduce over and ZeRO shards over, dp x cp (comm.c's dp_group) */
    int D = l->dp * l->cp, tp = l->tp, P = l->pp, M = l->micro_batches, V = l->virtual_chunks, seq = l->seq;
    int ncp = l->cp;
    double N = (double)gpt_shard_params(cfg, &s);
    /* memory: the ZeRO paper's accounting (zero_memory_formula, which
     * train's memory line prints beside what it allocated) */
    /* the Layout's dtype (the search's: float32 on CPUs, bf16 on GPUs; --plan-layout's, the run's) */
    const int bf16 = l->dtype == DT_BF16, gpu = !c->cpu;
    ZeroMemory zm;
    memset(&zm, 0, sizeof zm);
    zero_memory_formula(N, D, l->zero, bf16, 0, 0, &zm);
    r->params = zm.f_params;
    r->grads = zm.f_grads;
    r->optim = zm.f_optim;
    GPT m;   /* only the fields gpt_acts_formula reads */
    memset(&m, 0, sizeof m);
    m.cfg = *cfg; m.tp = tp; m.tpc.sp = l->sp; m.nlayers = s.nlayers; m.has_head = s.has_head;
    m.recompute = l->recompute; m.esz = bf16 ? 2 : 4;
    m.nchunks = V; m.split_backward = s.split_backward;
    m.chunk_first[0] = 0;
    for (int k = 0; k < V; k++) m.chunk_first[k + 1] = m.chunk_first[k] + s.chunk_nlayers[k];
    /* T: the tokens of a sequence this rank holds (cp.c: 2 of its 2N chunks); every activation has T rows */
    size_t C = cfg->dim, NH = cfg->heads, B = l->batch, T = seq / ncp;
    /* attention's state a set: the softmax probabilities (the CPU's tables; a GPU's plain
     * kernels, in float32 or at a head size flash does not take), or a log-sum-exp a row
     * (flash, a GPU's in bf16, kernels.cu's use_flash; cp's ring) */
    const int flash = gpu && bf16 && (C / tp) % 8 == 0 && tc_flash_supports((int)(C / NH));
    const int probs = ncp == 1 && !flash;
    size_t att = probs ? B * (NH / tp) * T * T : B * (NH / tp) * T;
    /* pp.c's sets: those of the head's chunk carry the head's buffers (pp_stage_sets) */
    int head_sets = 0, other_sets = 0;
    if (pp_stage_sets(l->schedule, P, M, V, stage, &head_sets, &other_sets) != 0) return -1;
    r->sets = head_sets + other_sets;
    r->acts = (double)head_sets * gpt_acts_formula(&m, (int)B, (int)T, att, gpu);
    m.has_head = 0;
    r->acts += (double)other_sets * gpt_acts_formula(&m, (int)B, (int)T, att, gpu);
    m.has_head = s.has_head;
    /* cp's own buffers (cp.c's cp_reserve), made once and kept: the ring's
     * kv[2] [B,T,2C/tp] in the dtype (the block in hand and the one arriving:
     * the receive buffer) and their gradients dkv[2] in float32, D
     * [B,NH/tp,T] floats, on a GPU the float32 accumulator [B,T,C/tp] (the
     * output's merge, dq), and on the embedding's stage the position rows of
     * its chunks and their gradient, wpe and dwpe [T,C] floats. train's memory
     * line counts them with the activations; so does the planner. */
    double kv = (double)B * T * 2 * (C / tp);   /* one block of the ring, in elements */
    if (ncp > 1)
        r->ring = 2 * kv * m.esz + 2 * kv * 4 + 4.0 * B * (NH / tp) * T + (gpu ? kv / 2 * 4 : 0) +
                  (s.has_embed ? 2 * 4.0 * T * C : 0);
    r->acts += r->ring;
    /* the backward's scratch, one for all the sets (gpt.c's scratch_rows, and
     * attention's backward: with the probabilities the gradient of the B NH
     * T T of them, with flash its dq accumulator [B,T,C/tp] and D
     * [B,NH/tp,T] floats, attention.cu's tc_flash_scratch_floats; under cp
     * the ring's buffers above). Not in train's activations: its memory line
     * prints it apart, as the planner does. */
    size_t att_scratch = ncp > 1 ? 0 : probs ? B * (NH / tp) * T * T : B * T * (C / tp) + B * (NH / tp) * T;
    r->scratch = (double)gpt_scratch_formula(&m, (int)B, (int)T, att_scratch);
    /* ZeRO-2/3's transient float32 unit buffers (zero.c's pool), a bound:
     * the gradients of the unit in backward and of the one before it (whose
     * reduction completes one unit later), the embedding's two at once, and
     * on one stage the wte's, from the head's backward to the embedding's;
     * ZeRO-3 adds the parameters of the unit in use and the prefetched
     * next. test_plan_equal.sh holds the run's peak between 1/2 and all of it. */
    double layer = 0, wte = (double)cfg->padded_vocab / tp * C, wpe = (double)cfg->max_seq * C;
    for (int i = GPT_LN1W; i <= GPT_FCPROJB; i++)
        layer += (double)layout_piece_size(cfg, i, tp);   /* one layer's, this rank's cut */
    double unit = fmax(layer, s.has_embed || s.has_head ? wte : 0);
    double g = 2 * unit + (s.has_embed ? wpe : 0) + (P == 1 ? wte : 0);
    r->transient = 4 * (l->zero == 3 ? g + 2 * unit : l->zero == 2 ? g : 0);
    r->total = r->params + r->grads + (l->offload ? 0 : r->optim) + r->acts + r->scratch + r->transient;

    /* bytes a step, row by row of --comm-stats */
    double *x = r->bytes, esz = m.esz, act = (double)B * T * C * esz;
    /* Megatron's all-reduces a micro-batch: 2 a layer forward, 2 backward; the
       layers' 2 forward ones again for each forward recompute repeats */
    double sites = 4.0 * s.nlayers + s.has_embed + s.has_head;
    r->recomputed = l->recompute == RECOMPUTE_FULL ? recomputed_layers(&s) : 0;
    r->layers = s.nlayers;
    sites += 2.0 * r->recomputed;
    /* --recompute-mode gelu, norm: no matmul flops again; norm gathers ln1's and ln2's rows again under sp,
       once a layer of a chunk of two or more (B's count without the split) */
    GPTShard once = s;
    once.split_backward = 0;
    double regathers = l->recompute == RECOMPUTE_NORM ? 2.0 * recomputed_layers(&once) : 0;
    if (tp > 1) {
        x[PLAN_TP_AR] = norm_ar(tp);      /* the gradient norm (dp.c) */
        if (s.has_head)                  /* vocab-parallel cross-entropy: each rank's row statistics */
            x[PLAN_TP_AG] = M * bus_ag(tp, 3.0 * B * T * tp * 4);
        if (!l->sp) {
            x[PLAN_TP_AR] += M * sites * bus_ar(tp, act);
        } else {                         /* all-gather before, reduce-scatter after each site */
            x[PLAN_TP_AG] += M * (sites + regathers) * bus_ag(tp, act);
            x[PLAN_TP_RS] = M * sites * bus_ag(tp, act);
            x[PLAN_TP_AR] += M * (2.0 * s.nlayers + s.has_head) * bus_ar(tp, 2.0 * C * 4);  /* LN weights */
        }
    }
    if (ncp > 1) {   /* the ring, a micro-batch (cp.c): each layer forward passes the kv block on N - 1 times
                      (and again in each forward recompute repeats), each backward N - 1 times and its
                      gradient N times, the last hop taking it home; a pass sends one block and receives one,
                      the block in the dtype, its gradient in float32 */
        double passes = (ncp - 1.0) * (s.nlayers + r->recomputed) + (ncp - 1.0) * s.nlayers;
        x[PLAN_CP_SEND] = x[PLAN_CP_RECV] = M * (passes * kv * m.esz + (double)ncp * s.nlayers * kv * 4);
    }
    double N4 = 4 * N;
    x[PLAN_DP_AR] = bus_ar(D, 4) + (l->zero >= 1 ? norm_ar(D) : 0);   /* the loss; the norm of owned shards */
    if (l->zero == 0) x[PLAN_DP_AR] += bus_ar(D, N4);
    if (l->zero >= 1) {
        x[PLAN_DP_RS] = (l->zero >= 2 ? M : 1) * bus_ag(D, N4);   /* ZeRO-2/3 reduce every micro-batch */
        x[PLAN_DP_AG] = bus_ag(D, N4);                           /* the updated parameters */
    }
    if (l->zero == 3) {   /* each unit gathered for forward and again for backward, but for the
                             embedding's (its backward reads no parameters; one stage's wte the head reads) */
        double fwd_only = s.has_embed ? 4.0 * cfg->max_seq * C + (s.has_head ? 0 : 4.0 * cfg->padded_vocab / tp * C) : 0;
        x[PLAN_DP_AG] = M * (2 * bus_ag(D, N4) - bus_ag(D, fwd_only));
    }
    if (P > 1) {
        double rows = l->sp ? act / tp : act;
        /* activations one way, their gradients the other, for each of V chunks:
           all but the model's first chunk receive, all but its last send */
        int ends = 2 * V - (stage == 0) - (stage == P - 1);
        x[PLAN_PP_SEND] = x[PLAN_PP_RECV] = M * rows * ends;
        x[PLAN_PP_AR] = norm_ar(P);     /* the norm */
        x[PLAN_PP_BC] = 4;              /* the loss, from the last stage */
        if (s.has_embed || s.has_head)  /* the tied wte's gradients, the owned part of it */
            x[PLAN_EMBED_AR] = bus_ar(2, 4.0 * cfg->padded_vocab / tp * C / (l->zero ? D : 1));
    }
    return 0;
}

int plan_layout_print(FILE *f, const GPTConfig *cfg, const PlanCluster *c, const Layout *l) {
    for (int rank = 0; rank < l->dp * l->cp * l->tp * l->pp; rank++) {
        PlanRank r;
        if (plan_rank(cfg, c, l, rank / (l->tp * l->cp * l->dp), &r) != 0) return -1;
        fprintf(f, "plan rank %d: params %.6g MB, grads %.6g MB, optimizer %.6g MB, activations %.6g MB, "
                   "scratch %.6g MB, transient %.6g MB\n", rank, r.params / 1e6, r.grads / 1e6, r.optim / 1e6,
                r.acts / 1e6, r.scratch / 1e6, r.transient / 1e6);
        for (int i = 0; i < PLAN_NROWS; i++)
            if (r.bytes[i] > 0) fprintf(f, "plan rank %d: %-15s %-6s %.0f\n", rank, row_kind[i], row_group[i], r.bytes[i]);
    }
    return 0;
}

static double rows_sum(const PlanRank *r, int lo, int hi) {
    double s = 0;
    for (int i = lo; i <= hi; i++) s += r->bytes[i];
    return s;
}

/* Seconds for `bytes` over a group of n ranks spanning (or not) nodes, in `calls` operations. */
static double link_time(const PlanCluster *c, double bytes, double calls, int inside) {
    double bw = (inside ? c->intra_gbs : c->inter_gbs) * 1e9;
    return calls * c->latency_us * 1e-6 + bytes / bw;
}

/* Wall time of the t seconds of compute each rank does in a step, laid on
 * the schedule's timeline (pp_timeline: unit slots, every action one).
 * With a device a rank that is t / (1 - bubble). With CPU ranks sharing
 * c->cores cores, a slot in which a stages are busy keeps a x dp x tp
 * ranks busy, and when those are more than the cores each runs at
 * cores / busy of a core's rate (the scheduler's fair share): the slot
 * lasts max(1, busy / cores) units. A rank idle in the bubble then lends
 * its core to another, and only slots with fewer busy ranks than cores
 * waste any: a pipeline's ramp, naive's one stage at a time. */
static double compute_wall(const PlanCluster *c, const Layout *l, double bubble, double t) {
    int ranks = l->dp * l->cp * l->tp * l->pp, V = l->virtual_chunks;
    if (c->cores <= 0 || c->cores >= ranks) return t / (1 - bubble);
    double share = (double)ranks / c->cores;
    if (l->pp == 1) return t * share;
    int n = pp_num_actions(l->schedule, l->pp, l->micro_batches, V);
    PPTimeline tl;
    if (n <= 0 || (double)n * l->pp * l->pp > 1e6 || pp_timeline(l->schedule, l->pp, l->micro_batches, V, &tl) != 0)
        return t * fmax(1 / (1 - bubble), share);   /* too long to lay out: the larger bound */
    double units = 0;
    for (int s = 0; s < tl.T; s++) {
        int busy = 0;
        for (int st = 0; st < l->pp; st++) busy += tl.slots[st * tl.T + s].kind != PP_IDLE;
        units += fmax(1.0, (double)busy * l->dp * l->cp * l->tp / c->cores);
    }
    pp_timeline_free(&tl);
    return t * units / n;
}

/* Seconds a step of cp's ring leaves exposed on a rank of stage w (cp.c's
 * passes over the cp group's link, which sits next to tp's: inside a node
 * while tp x cp ranks fit one). A pass sends the block in hand, kv = B
 * (T/N) 2 (C/tp) elements in the dtype, or its gradient dkv, as many in
 * float32, to the next rank and receives the next; on GPUs it runs beside
 * the attention of the block in hand, and only what that compute does not
 * cover is exposed:
 *   a layer forward:   (N - 1) max(0, t(kv) - a)
 *   a layer backward:  (N - 1) max(0, t(kv) + t(dkv) - 2a) + t(dkv)
 *     (the block and its gradient move on while the next block's backward
 *     runs; the gradient's last hop home has no block left to hide behind)
 * t(b) = latency + b's bytes / bandwidth; a = the forward attention of one
 * block, the causal half of its 4 B (T/N)^2 (C/tp) flops (dealt in pairs, every
 * block but a rank's own is exactly half visible) at the matmuls' rate;
 * backward twice that. Layer forwards: the stage's layers and each forward
 * recompute repeats, M times a step; backwards, the layers M times. CPU
 * ranks hide nothing (a = 0): the shared-memory sendrecv blocks. */
static double ring_time(const GPTConfig *cfg, const PlanCluster *c, const Layout *l, const PlanRank *w) {
    int N = l->cp;
    if (N <= 1) return 0;
    double Tl = (double)l->seq / N, Cl = (double)cfg->dim / l->tp;
    double kv = l->batch * Tl * 2 * Cl;   /* elements of a block */
    double a = c->cpu ? 0 : 2.0 * l->batch * Tl * Tl * Cl / (c->tflops * 1e12 * MFU_RATE);
    int inside = l->tp * N <= c->per_node;
    double t_kv = link_time(c, kv * dt_size(l->dtype), 1, inside), t_dkv = link_time(c, kv * 4, 1, inside);
    double fwd = (N - 1) * fmax(0, t_kv - a), bwd = (N - 1) * fmax(0, t_kv + t_dkv - 2 * a) + t_dkv;
    return l->micro_batches * ((w->layers + w->recomputed) * fwd + w->layers * bwd);
}

void plan_evaluate(const GPTConfig *cfg, const PlanCluster *c, const Layout *l, PlanResult *p) {
    memset(p, 0, sizeof *p);
    p->l = *l;
    int again = 0;   /* layer forwards recompute repeats, all stages */
    for (int st = 0; st < l->pp; st++) {
        PlanRank r;
        if (plan_rank(cfg, c, l, st, &r) != 0) { p->why = "the model does not divide"; return; }
        if (r.total > p->mem) { p->mem = r.total; p->worst = r; }
        again += r.recomputed;
    }
    int G = l->batch * l->micro_batches * l->dp, seq = l->seq, M = l->micro_batches, V = l->virtual_chunks;
    double Ntot = (double)gpt_total_params(cfg), tokens = (double)G * seq, C = cfg->dim;
    /* the full count, as the published runs the planner's MFU is compared with count */
    double flops = plan_flops_per_token(cfg, seq, PLAN_FLOPS_FULL) * tokens;
    double layer_fwd = 2 * 12 * C * C + 4.0 * seq * C;                        /* a token, a layer: its third */
    double rate = c->tflops * 1e12 * MFU_RATE * c->gpus;
    p->t_compute = (flops + again * layer_fwd * tokens) / rate;
    p->bubble = l->pp > 1 ? pp_bubble_formula(l->schedule, l->pp, M, V) : 0;
    if (p->bubble < 0) { p->why = "no schedule"; return; }
    double t_wall = compute_wall(c, l, p->bubble, p->t_compute);
    const PlanRank *w = &p->worst;
    int tp_in = l->tp <= c->per_node, dp_in = l->tp * l->cp * l->dp <= c->per_node, pp_in = c->gpus <= c->per_node;
    p->t_tp = link_time(c, rows_sum(w, PLAN_TP_AR, PLAN_TP_RS), M * 4.0 * cfg->layers / l->pp, tp_in);
    double tdp = link_time(c, rows_sum(w, PLAN_DP_AR, PLAN_DP_AG) + w->bytes[PLAN_EMBED_AR], 4, dp_in);
    p->t_dp = tdp - fmin(tdp, DP_HIDDEN * p->t_compute * 2 / 3);  /* hidden behind backward */
    p->t_pp = link_time(c, w->bytes[PLAN_PP_SEND] + w->bytes[PLAN_PP_RECV], 2.0 * M * V, pp_in);
    p->t_cp = ring_time(cfg, c, l, w);
    p->step = t_wall + (p->t_tp + p->t_pp + p->t_cp) / (1 - p->bubble) + p->t_dp;
    if (l->offload) p->step += 16.0 * Ntot / (l->tp * l->pp * l->dp * l->cp) / 25e9;  /* PCIe */
    p->mfu = flops / (p->step * c->gpus * c->tflops * 1e12);
    if (p->mem > c->mem_gb * 1e9) p->why = "does not fit in memory";
}

/* Fastest first; at an equal step (the time model counts no cost for recomputing GELU or the
 * norms, memory-bound work it leaves out everywhere), the one that recomputes less, then the
 * smaller. */
static int cmp_step(const void *a, const void *b) {
    const PlanResult *p = a, *q = b;
    if (p->step != q->step) return (p->step > q->step) - (p->step < q->step);
    if (p->l.recompute != q->l.recompute) return (int)p->l.recompute - (int)q->l.recompute;
    return (p->mem > q->mem) - (p->mem < q->mem);
}

/* The layouts of one mesh, dp x cp x tp x pp = c's GPUs, into ps. */
static void search_mesh(const GPTConfig *cfg, int G, int seq, const PlanCluster *c, int all_schedules, int dp,
                        int cp, int tp, PlanSearch *ps, size_t cap) {
    int pp = c->gpus / dp / cp / tp, per = G / dp;
    for (int M = 1; M <= per && ps->nfit + 4096 < cap; M++) {
        if (per % M || (pp == 1 && M > 1 && M != per) || (pp > 1 && M < pp && M != per)) continue;
        for (int z = 0; z <= 3; z++) for (int off = 0; off <= 1; off++)
        for (int sc = PP_NAIVE; sc <= (all_schedules ? PP_ZBH2 : PP_1F1B); sc++) for (int V = 1; V <= 16; V++)
        for (int rc = RECOMPUTE_NONE; rc <= RECOMPUTE_FULL; rc++) for (int sp = 0; sp <= (tp > 1); sp++) {
            if ((pp == 1 && sc != PP_1F1B) || (off && z == 0) || (pp > 1 && z >= 2)) continue;
            /* interleaved: V >= 2 chunks a stage, M a multiple of P, the layers in P x V equal chunks */
            if (sc == PP_INTERLEAVED ? V < 2 || M % pp || cfg->layers % (pp * V) : V > 1) continue;
            Layout l = {.dp = dp, .cp = cp, .tp = tp, .pp = pp, .sp = sp, .dp_mode = DP_ALLREDUCE, .zero = z,
                        .offload = off, .schedule = (PPSchedule)sc, .virtual_chunks = V, .micro_batches = M,
                        .recompute = (RecomputeMode)rc, .batch = per / M, .seq = seq, .dtype = c->cpu ? DT_F32 : DT_BF16};
            PlanResult p;
            plan_evaluate(cfg, c, &l, &p);
            int kind = !p.why ? -1 : !strcmp(p.why, "does not fit in memory") ? 0 : 1;
            /* tp's collectives, and cp's ring beside them, stay inside a node */
            if (kind < 0 && tp * cp > c->per_node) kind = 2, p.why = cp > 1 ? "tp x cp crosses nodes" : "tp crosses nodes";
            if (kind >= 0) {
                if (!ps->rejected[kind]++ || p.mem < ps->best_rej[kind].mem) ps->best_rej[kind] = p;
                continue;
            }
            ps->fit[ps->nfit++] = p;
        }
    }
}

/* Context parallelism is searched second, and only when nothing fits
 * without it and something was too large (the sequence is too long for a
 * rank): it adds the ring's traffic to what dp, tp and pp already cost, and
 * pays for itself in memory, by cutting each sequence's activations N ways. */
int plan_search(const GPTConfig *cfg, int G, int seq, const PlanCluster *c, int all_schedules, int with_cp,
                PlanSearch *ps) {
    memset(ps, 0, sizeof *ps);
    size_t cap = 1 << 20;
    ps->fit = malloc(cap * sizeof *ps->fit);
    if (!ps->fit) return -1;
    for (int pass = 0; pass < (with_cp ? 2 : 1) && !ps->nfit && (!pass || ps->rejected[0]); pass++)
        for (int dp = 1; dp <= c->gpus; dp++) {
            if (c->gpus % dp || G % dp) continue;
            for (int cp = pass ? 2 : 1; cp <= (pass ? c->gpus / dp : 1); cp++) {
                if ((c->gpus / dp) % cp || seq % (2 * cp)) continue;   /* cp.c: 2 cp chunks a sequence */
                for (int tp = 1; tp <= c->gpus / dp / cp; tp++)
                    if ((c->gpus / dp / cp) % tp == 0) search_mesh(cfg, G, seq, c, all_schedules, dp, cp, tp, ps, cap);
            }
        }
    qsort(ps->fit, ps->nfit, sizeof *ps->fit, cmp_step);
    return 0;
}

void plan_search_free(PlanSearch *ps) {
    free(ps->fit);
    memset(ps, 0, sizeof *ps);
}

/* ---------------------------------------------------------------------------
 * The GPUs the planner knows: the one home of their figures (--cluster's
 * presets, the planner's default, and train's own model of a GPU host and
 * its MFU all read them here). */

typedef struct GpuPreset {
    const char *name;       /* --cluster's name: h100x<N> */
    const char *devices[3]; /* parts of the names CUDA gives the GPUs computing at this tflops */
    int per_node;
    double mem_gb, tflops, intra_gbs, inter_gbs;
} GpuPreset;
/* Dense bf16 TFLOP/s of the SXM parts (the H200 computes as an H100);
 * bus bandwidths: NVLink 4 / 3 a GPU; 8 x 400 / 8 x 200 Gb/s InfiniBand a
 * node. */
static const GpuPreset gpu_presets[] = {
    {"h100", {"H100", "H200"}, 8, 80, 989.4, 450, 50},
    {"a100", {"A100"}, 8, 80, 312, 300, 25},
};
enum { NGPU_PRESETS = sizeof gpu_presets / sizeof *gpu_presets };

int plan_cluster_preset(PlanCluster *c, const char *name, int gpus) {
    for (int i = 0; i < NGPU_PRESETS; i++) {
        const GpuPreset *g = &gpu_presets[i];
        if (strcmp(g->name, name)) continue;
        c->gpus = gpus;
        c->per_node = g->per_node;
        c->mem_gb = g->mem_gb;
        c->tflops = g->tflops;
        c->intra_gbs = g->intra_gbs;
        c->inter_gbs = g->inter_gbs;
        return 0;
    }
    return -1;
}

double plan_device_tflops(const char *device_name) {
    for (int i = 0; i < NGPU_PRESETS; i++)
        for (const char *const *d = gpu_presets[i].devices; *d; d++)
            if (strstr(device_name, *d)) return gpu_presets[i].tflops;
    return 0.0;
}

/* ---------------------------------------------------------------------------
 * ./train --plan */


static void print_layout(const PlanResult *p) {
    const Layout *l = &p->l;
    const PlanRank *w = &p->worst;
    char sched[32], cp[24] = "", ring[40] = "";
    /* one word each, so that a row's columns stay where readers of it (test_plan.sh) find them */
    static const char *const recompute[] = {[RECOMPUTE_NONE] = "", [RECOMPUTE_GELU] = " recompute-gelu",
                                            [RECOMPUTE_NORM] = " recompute-norm", [RECOMPUTE_FULL] = " recompute"};
    snprintf(sched, sizeof sched, l->virtual_chunks > 1 ? "%s V %d" : "%s", pp_schedule_name(l->schedule), l->virtual_chunks);
    if (l->cp > 1) {   /* context parallelism: its ranks and its ring's bytes (nothing when cp is 1) */
        snprintf(cp, sizeof cp, " cp %d", l->cp);
        snprintf(ring, sizeof ring, " cp %.3g", rows_sum(w, PLAN_CP_SEND, PLAN_CP_RECV) / 1e6);
    }
    printf("  dp %3d%s tp %d pp %3d zero %d%s M %4d b %3d %-5s%s%s | mem %7.2f GB (p %.2f g %.2f o %.2f a %.2f x%d s %.2f t %.2f)"
           " | tp %.3g dp %.3g pp %.3g embed %.3g%s MB | bubble %.3f | step %.4g s | mfu %.1f%%\n",
           l->dp, cp, l->tp, l->pp, l->zero, l->offload ? " offload" : "", l->micro_batches, l->batch, sched,
           recompute[l->recompute], l->sp ? " sp" : "", p->mem / 1e9, w->params / 1e9, w->grads / 1e9,
           w->optim / 1e9, w->acts / 1e9, w->sets, w->scratch / 1e9, w->transient / 1e9,
           rows_sum(w, PLAN_TP_AR, PLAN_TP_RS) / 1e6, rows_sum(w, PLAN_DP_AR, PLAN_DP_AG) / 1e6,
           rows_sum(w, PLAN_PP_SEND, PLAN_PP_RECV) / 1e6, w->bytes[PLAN_EMBED_AR] / 1e6, ring, p->bubble, p->step,
           100 * p->mfu);
}

/* A flag's number: all of s, finite, in [lo, hi]; else one line on stderr. */
static int plan_num(const char *flag, const char *s, double lo, double hi, double *v) {
    char *end;
    double x = strtod(s, &end);
    if (end == s || *end || !(x >= lo && x <= hi)) {
        fprintf(stderr, "plan: %s expects a number in %g..%g, got '%s'\n", flag, lo, hi, s);
        return -1;
    }
    *v = x;
    return 0;
}

int plan_main(int argc, char **argv) {
    GPTConfig cfg = {.max_seq = 256, .vocab = 50257, .layers = 4, .heads = 4, .dim = 128};
    PlanCluster c = {.latency_us = PLAN_LATENCY_US};
    plan_cluster_preset(&c, PLAN_DEFAULT_GPU, 8);
    int G = 0, seq = 0, nodes = 1, top = 10, all_sched = 0;
    char err[256];
    enum { O_MODEL = 256, O_GB, O_SEQ, O_GPUS, O_GPN, O_MEM, O_TF, O_INTRA, O_INTER, O_CLUSTER, O_L, O_H, O_C,
           O_V, O_MS, O_DEV, O_PLAN, O_TOP, O_CORES, O_LAT, O_ALL };
    static const struct option opts[] = {
        {"plan", 0, 0, O_PLAN}, {"model", 1, 0, O_MODEL}, {"global-batch", 1, 0, O_GB}, {"seq", 1, 0, O_SEQ},
        {"gpus", 1, 0, O_GPUS}, {"gpus-per-node", 1, 0, O_GPN}, {"gpu-mem", 1, 0, O_MEM},
        {"gpu-tflops", 1, 0, O_TF}, {"intra-gbs", 1, 0, O_INTRA}, {"inter-gbs", 1, 0, O_INTER},
        {"cluster", 1, 0, O_CLUSTER}, {"layers", 1, 0, O_L}, {"heads", 1, 0, O_H}, {"dim", 1, 0, O_C},
        {"vocab", 1, 0, O_V}, {"max-seq", 1, 0, O_MS}, {"device", 1, 0, O_DEV}, {"top", 1, 0, O_TOP},
        {"cpu-cores", 1, 0, O_CORES}, {"latency-us", 1, 0, O_LAT},
        {"all-schedules", 0, 0, O_ALL}, {0, 0, 0, 0}};
    optind = 1;
    opterr = 0;   /* train's own flags pass by: the planner reads only its own */
    double x;
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case O_PLAN: break;
        case O_MODEL: {
            if (gpt_preset(optarg, &cfg) != 0) { fprintf(stderr, "plan: no model preset '%s' (%s)\n", optarg, GPT_PRESETS); return 2; }
            if (!seq) seq = cfg.max_seq;
            break;
        }
        case O_CLUSTER: {   /* h100x8, a100x8, h100x1024 (GPUs) */
            char name[32]; int n = 0;
            if (sscanf(optarg, "%31[a-wyz0-9]x%d", name, &n) != 2 || n <= 0 || plan_cluster_preset(&c, name, n)) {
                fprintf(stderr, "plan: no cluster preset '%s' (h100xN, a100xN: N GPUs, 8 a node)\n", optarg);
                return 2;
            }
            break;
        }
        case O_GB: if (plan_num("--global-batch", optarg, 1, 1e9, &x)) return 2; G = (int)x; break;
        case O_SEQ: if (plan_num("--seq", optarg, 1, 1 << 20, &x)) return 2; seq = (int)x; break;
        case O_GPUS: if (plan_num("--gpus", optarg, 1, 1 << 20, &x)) return 2; c.gpus = (int)x; break;
        case O_GPN: if (plan_num("--gpus-per-node", optarg, 1, 1024, &x)) return 2; c.per_node = (int)x; break;
        case O_MEM: if (plan_num("--gpu-mem", optarg, 1e-3, 1e6, &c.mem_gb)) return 2; break;
        case O_TF: if (plan_num("--gpu-tflops", optarg, 1e-6, 1e7, &c.tflops)) return 2; break;
        case O_INTRA: if (plan_num("--intra-gbs", optarg, 1e-3, 1e6, &c.intra_gbs)) return 2; break;
        case O_INTER: if (plan_num("--inter-gbs", optarg, 1e-3, 1e6, &c.inter_gbs)) return 2; break;
        case O_L: if (plan_num("--layers", optarg, 1, SAFE_MAX_LAYERS, &x)) return 2; cfg.layers = (int)x; break;
        case O_H: if (plan_num("--heads", optarg, 1, SAFE_MAX_HEADS, &x)) return 2; cfg.heads = (int)x; break;
        case O_C: if (plan_num("--dim", optarg, 1, SAFE_MAX_DIM, &x)) return 2; cfg.dim = (int)x; break;
        case O_V: if (plan_num("--vocab", optarg, 1, SAFE_MAX_VOCAB, &x)) return 2; cfg.vocab = (int)x; break;
        case O_MS: if (plan_num("--max-seq", optarg, 1, SAFE_MAX_SEQ, &x)) return 2; cfg.max_seq = (int)x; break;
        case O_DEV: c.cpu = !strcmp(optarg, "cpu"); break;
        case O_TOP: if (plan_num("--top", optarg, 0, 1e6, &x)) return 2; top = (int)x; break;
        case O_CORES: if (plan_num("--cpu-cores", optarg, 1, 1 << 20, &x)) return 2; c.cores = (int)x; break;
        case O_ALL: all_sched = 1; break;
        case O_LAT: if (plan_num("--latency-us", optarg, 0, 1e6, &c.latency_us)) return 2; break;
        default: break;   /* train's other flags: not the planner's */
        }
    }
    if (!seq) seq = cfg.max_seq;
    if (!G) G = c.gpus;
    if (c.cores && !c.cpu) { fprintf(stderr, "plan: --cpu-cores is for CPU ranks: give --device cpu too\n"); return 2; }
    if (gpt_config_check(&cfg, err, sizeof err) != 0) { fprintf(stderr, "plan: %s\n", err); return 2; }
    if (c.gpus < 1 || c.per_node < 1 || seq > cfg.max_seq || c.mem_gb <= 0 || c.tflops <= 0) {
        fprintf(stderr, "plan: bad cluster or sequence (gpus %d, per node %d, seq %d of max %d)\n", c.gpus, c.per_node, seq, cfg.max_seq);
        return 2;
    }
    if (c.gpus > G * cfg.heads * cfg.layers || G < 1) {
        fprintf(stderr, "plan: %d GPUs cannot share a global batch of %d sequences (dp <= batch, tp <= heads, pp <= layers)\n", c.gpus, G);
        return 2;
    }
    nodes = (c.gpus + c.per_node - 1) / c.per_node;
    PlanSearch ps;
    if (plan_search(&cfg, G, seq, &c, all_sched, 1, &ps) != 0) { fprintf(stderr, "plan: out of memory\n"); return 1; }
    size_t n = ps.nfit;
    PlanResult *all = ps.fit;
    int *rejected = ps.rejected;
    PlanResult *best_rej = ps.best_rej;
    if (!n) {
        fprintf(stderr, "plan: no layout fits: the smallest needs %.2f GB a rank, the GPU has %.0f GB\n",
               rejected[0] ? best_rej[0].mem / 1e9 : 0, c.mem_gb);
        plan_search_free(&ps);
        return 2;
    }
    printf("plan: %d layers, %d heads, dim %d, vocab %d (padded %d), %zu parameters | global batch %d x seq %d\n",
           cfg.layers, cfg.heads, cfg.dim, cfg.vocab, cfg.padded_vocab, gpt_total_params(&cfg), G, seq);
    if (c.cores)
        printf("plan: %d CPU ranks sharing %d cores, a thread each, %.3g GB a rank, %.3g TFLOP/s a core, %.3g GB/s shared memory\n",
               c.gpus, c.cores, c.mem_gb, c.tflops, c.intra_gbs);
    else
        printf("plan: cluster %d GPUs (%d nodes of %d), %.0f GB, %.1f TFLOP/s, %.0f GB/s in a node, %.0f GB/s between\n",
               c.gpus, nodes, c.per_node, c.mem_gb, c.tflops, c.intra_gbs, c.inter_gbs);
    printf("assumptions: memory = train's memory line (gpt_shard_params, zero_memory_formula, gpt_acts_formula x sets in flight,"
           " the backward's scratch gpt_scratch_formula) + ZeRO-2/3 unit buffers; %s activations; 1 GB = 1e9 bytes; compute 6N + 12LTC flops a token at %.0f%% of peak,"
           " + each layer forward recompute repeats; comm latency %.0f us + bytes / bus bandwidth, tp in a node, dp in a node when tp x dp fits;"
           " %.0f%% of the dp reduction hidden behind backward; step = %s + (tp + pp) / (1 - bubble) + dp;"
           " offload: 16 bytes a parameter over 25 GB/s PCIe\n",
           c.cpu ? "fp32, softmax probabilities kept" : "bf16, flash attention", 100 * MFU_RATE, c.latency_us, 100 * DP_HIDDEN,
           c.cores && c.cores < c.gpus ? "compute laid on the schedule's slots, a slot with more busy ranks than cores"
                                         " lasting busy / cores times longer (the ranks share the cores)"
                                       : "compute / (1 - bubble)");
    if (all[0].l.cp > 1)   /* the search went on to context parallelism: nothing fitted without it */
        printf("assumptions, cp: searched because no layout without it fits in memory; each sequence in 2 cp chunks, activations"
               " and attention's log-sum-exp for seq / cp tokens a rank; ZeRO and the dp reduction over dp x cp; the ring"
               " (cp.c) next to tp, in a node when tp x cp fits, its kv blocks %s, each pass exposed where it outlasts"
               " one block's attention (the causal half of 4 B (seq/cp)^2 C/tp flops; backward twice that, the"
               " gradient's last hop home exposed whole); --layout auto takes cp on CPU ranks only so far (the GPU's ring"
               " kernels are a plain first version)\n",
               c.cpu ? "float32, nothing hidden (the shared-memory sendrecv blocks)" : "bf16 (their gradients float32) on a stream beside the attention");
    const char *kinds[] = {"does not fit in memory", "the model does not divide (tp | heads, pp <= layers)",
                           all[0].l.cp > 1 ? "tp (or tp x cp) crosses nodes" : "tp crosses nodes"};
    for (int k = 0; k < 3; k++)
        if (rejected[k]) {
            printf("rejected %d layouts: %s; e.g.", rejected[k], kinds[k]);
            print_layout(&best_rej[k]);
        }
    printf("%zu layouts fit; the fastest %d:\n", n, top < (int)n ? top : (int)n);
    for (size_t i = 0; i < n && (int)i < top; i++) print_layout(&all[i]);
    const PlanResult *b = &all[0];
    char virt[32] = "", cpf[24] = "";
    if (b->l.virtual_chunks > 1) snprintf(virt, sizeof virt, " --virtual %d", b->l.virtual_chunks);
    if (b->l.cp > 1) snprintf(cpf, sizeof cpf, " --cp %d", b->l.cp);
    printf("plan: --dp %d%s --tp %d --pp %d --zero %d --micro-batches %d%s%s%s --schedule %s%s | memory %.2f GB a rank | step %.4g s | mfu %.1f%%\n",
           b->l.dp, cpf, b->l.tp, b->l.pp, b->l.zero, b->l.micro_batches, b->l.offload ? " --offload" : "", layout_recompute_flag(b->l.recompute),
           b->l.sp ? " --sp" : "", pp_schedule_name(b->l.schedule), virt, b->mem / 1e9, b->step, 100 * b->mfu);
    plan_search_free(&ps);
    return 0;
}
