/* plan.c: the auto-parallel planner, read beside the second article
 * (自动并行) and its GPT-3 example: "combine data and model parallelism
 * considering the model and the hardware".
 *
 * For every layout dp x tp x pp = gpus, ZeRO 0-3, offload, micro-batches,
 * schedule, recompute and sp it predicts per rank:
 *  - memory, by the functions train's memory line uses: gpt_shard_params
 *    (what gpt_build allocates), zero_memory_formula (the ZeRO paper's
 *    accounting zero_memory prints), gpt_acts_formula x pp_sets_in_flight
 *    (what pp_build allocates: one set of activations a micro-batch in
 *    flight, the schedule's peak);
 *  - bytes a step in each group, the formulas test_dp, test_tp and test_3d
 *    check --comm-stats against (bus bytes, nccl-tests convention);
 *  - the bubble (pp_bubble_formula) and a step time: compute at the GPU's
 *    rate, each group's bytes at latency + bytes / bandwidth of the link
 *    it crosses. The assumptions are printed with the plan. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "plan.h"
#include "safe.h"
#include "pp.h"
#include "zero.h"

#define MFU_RATE 0.5    /* achieved fraction of peak in the matmuls */
#define DP_HIDDEN 0.8   /* fraction of the dp reduction hidden behind backward (buckets) */

/* Layers of stage st of P: as even as possible, the first stages one more (main.c). */
static void stage_shard(const GPTConfig *cfg, int P, int st, int tp, GPTShard *s) {
    *s = gpt_whole(cfg);
    s->tp = tp;
    s->layer0 = 0;
    for (int i = 0; i <= st; i++) {
        int n = cfg->layers / P + (i < cfg->layers % P);
        if (i < st) s->layer0 += n; else s->nlayers = n;
    }
    s->has_embed = st == 0;
    s->has_head = st == P - 1;
}

int plan_rank(const GPTConfig *cfg, int seq, const PlanCluster *c, const PlanLayout *l, int stage, PlanRank *r) {
    memset(r, 0, sizeof *r);
    if (cfg->heads % l->tp || cfg->padded_vocab % l->tp || (l->sp && (l->b * seq) % l->tp) || l->pp > cfg->layers)
        return -1;
    GPTShard s;
    stage_shard(cfg, l->pp, stage, l->tp, &s);
    double N = (double)gpt_shard_params(cfg, &s), D = l->dp, f = (D - 1) / D;
    ZeroMemory zm;
    memset(&zm, 0, sizeof zm);
    zero_memory_formula(N, l->dp, l->zero, !c->cpu, 0, 0, &zm);
    r->params = zm.f_params;
    r->grads = zm.f_grads;
    r->optim = l->offload ? 0 : zm.f_optim;
    GPT m;
    memset(&m, 0, sizeof m);
    m.cfg = *cfg; m.tp = l->tp; m.tpc.sp = l->sp; m.nlayers = s.nlayers; m.has_head = s.has_head;
    m.recompute = l->recompute; m.esz = c->cpu ? 4 : 2;
    size_t C = cfg->dim, NH = cfg->heads, B = l->b, T = seq;
    size_t att = c->cpu ? B * (NH / l->tp) * T * T : B * (NH / l->tp) * T;  /* flash: a log-sum-exp a row */
    r->sets = pp_sets_in_flight(l->pp > 1 ? l->sched : PP_1F1B, l->pp, l->M, 1, stage);
    r->acts = (double)r->sets * gpt_acts_formula(&m, (int)B, (int)T, att, !c->cpu);
    /* ZeRO-3: the gathered unit and the prefetched next one, float32 (zero.c) */
    double unit = 0;
    for (int i = GPT_LN1W; i <= GPT_FCPROJB; i++) unit += gpt_tensor_size(cfg, i, 1, 0, 0) / (i == GPT_LN1W ? 1 : 1);
    unit /= l->tp;
    if (s.has_embed) unit = fmax(unit, (double)cfg->padded_vocab / l->tp * C);
    r->transient = l->zero == 3 ? 2 * 4 * unit : l->zero == 2 ? 4 * unit : 0;
    r->total = r->params + r->grads + r->optim + r->acts + r->transient;
    /* bytes a step (bus bytes per rank) */
    double esz = m.esz, act = (double)B * T * C * esz, ft = (l->tp - 1.0) / l->tp;
    double sites = 4.0 * s.nlayers + s.has_embed + s.has_head;  /* Megatron's all-reduces a micro-batch */
    if (l->tp > 1) {
        double norm = floor(2 * ft * 4), stats = s.has_head ? ft * 3 * B * T * l->tp * 4 * l->M : 0;
        if (!l->sp) {
            r->tp_ar = sites * 2 * ft * act * l->M + norm;
            r->tp_ag = stats;
        } else {
            r->tp_ar = (2.0 * s.nlayers + s.has_head) * floor(2 * ft * 2 * C * 4) + norm;
            r->tp_ag = sites * ft * act * l->M + stats;
            r->tp_rs = sites * ft * act * l->M;
        }
    }
    if (l->dp > 1) {
        double N4 = 4 * N, scalar = floor(2 * f * 4);
        r->dp_ar = scalar * (l->zero >= 1 ? 2 : 1) + (l->zero == 0 ? 2 * f * N4 : 0);
        r->dp_rs = l->zero ? f * N4 : 0;
        r->dp_ag = (l->zero == 3 ? 2 : l->zero ? 1 : 0) * f * N4;
        if (l->zero == 3 && s.has_embed) r->dp_ag -= f * 4.0 * cfg->max_seq * C;  /* wpe: no backward use */
    }
    if (l->pp > 1) {
        double rows = l->sp ? act / l->tp : act;
        r->pp_send = r->pp_recv = l->M * rows;
        if (s.has_embed || s.has_head) r->embed_ar = 4.0 * cfg->padded_vocab / l->tp * C / (l->zero ? l->dp : 1);
    }
    return 0;
}

/* Seconds for `bytes` over a group of n ranks spanning (or not) nodes, in `calls` operations. */
static double link_time(const PlanCluster *c, double bytes, double calls, int inside) {
    double bw = (inside ? c->intra_gbs : c->inter_gbs) * 1e9;
    return calls * c->latency_us * 1e-6 + bytes / bw;
}

void plan_evaluate(const GPTConfig *cfg, int G, int seq, const PlanCluster *c, const PlanLayout *l, PlanResult *p) {
    memset(p, 0, sizeof *p);
    p->l = *l;
    for (int st = 0; st < l->pp; st++) {
        PlanRank r;
        if (plan_rank(cfg, seq, c, l, st, &r) != 0) { p->why = "the model does not divide"; return; }
        if (r.total > p->mem) { p->mem = r.total; p->worst = r; }
    }
    double Ntot = (double)gpt_total_params(cfg), tokens = (double)G * seq;
    double flops = 6 * Ntot * tokens + 12.0 * cfg->layers * seq * cfg->dim * tokens;  /* PaLM's accounting */
    double rate = c->tflops * 1e12 * MFU_RATE * c->gpus;
    p->t_compute = flops * (l->recompute ? 4.0 / 3 : 1) / rate;
    p->bubble = l->pp > 1 ? pp_bubble_formula(l->sched, l->pp, l->M, 1) : 0;
    if (p->bubble < 0) { p->why = "no schedule"; return; }
    const PlanRank *w = &p->worst;
    int tp_in = l->tp <= c->per_node, dp_in = l->tp * l->dp <= c->per_node, pp_in = c->gpus <= c->per_node;
    p->t_tp = link_time(c, w->tp_ar + w->tp_ag + w->tp_rs, l->M * 4.0 * cfg->layers / l->pp, tp_in);
    double tdp = link_time(c, w->dp_ar + w->dp_rs + w->dp_ag + w->embed_ar, 4, dp_in);
    p->t_dp = tdp - fmin(tdp, DP_HIDDEN * p->t_compute * 2 / 3);  /* hidden behind backward */
    p->t_pp = link_time(c, w->pp_send + w->pp_recv, 2.0 * l->M, pp_in);
    double busy = p->t_compute + p->t_tp + p->t_pp;
    p->step = busy / (1 - p->bubble) + p->t_dp;
    if (l->offload) p->step += w->optim > 0 ? 0 : 16.0 * Ntot / (l->tp * l->pp * l->dp) / 25e9;  /* PCIe */
    p->mfu = flops / (p->step * c->gpus * c->tflops * 1e12);
    if (p->mem > c->mem_gb * 1e9) p->why = "does not fit in memory";
}

/* ---------------------------------------------------------------------------
 * ./train --plan */

typedef struct { const char *name; int layers, heads, dim, seq; } ModelPreset;
static const ModelPreset models[] = {
    {"gpt2", 12, 12, 768, 1024}, {"gpt2-medium", 24, 16, 1024, 1024}, {"gpt2-large", 36, 20, 1280, 1024},
    {"gpt2-xl", 48, 25, 1600, 1024}, {"gpt3-125m", 12, 12, 768, 2048}, {"gpt3-1.3b", 24, 16, 2048, 2048},
    {"gpt3-2.7b", 32, 32, 2560, 2048}, {"gpt3-6.7b", 32, 32, 4096, 2048}, {"gpt3-13b", 40, 40, 5120, 2048},
    {"gpt3-175b", 96, 96, 12288, 2048}};
typedef struct { const char *name; int per_node; double mem, tflops, intra, inter; } ClusterPreset;
/* bus bandwidths: NVLink 4 / 3 per GPU; 8 x 400 / 8 x 200 Gb/s InfiniBand a node */
static const ClusterPreset clusters[] = {
    {"h100", 8, 80, 989.4, 450, 50}, {"a100", 8, 80, 312, 300, 25}};

static int cmp_step(const void *a, const void *b) {
    double x = ((const PlanResult *)a)->step, y = ((const PlanResult *)b)->step;
    return (x > y) - (x < y);
}

static const char *sched_name(int s) { return pp_schedule_name((PPSchedule)s); }

static void print_layout(const PlanResult *p) {
    const PlanLayout *l = &p->l;
    const PlanRank *w = &p->worst;
    printf("  dp %3d tp %d pp %3d zero %d%s M %4d b %3d %-5s%s%s | mem %7.2f GB (p %.2f g %.2f o %.2f a %.2f x%d t %.2f)"
           " | tp %.3g dp %.3g pp %.3g embed %.3g MB | bubble %.3f | step %.4g s | mfu %.1f%%\n",
           l->dp, l->tp, l->pp, l->zero, l->offload ? " offload" : "", l->M, l->b, sched_name(l->sched),
           l->recompute ? " recompute" : "", l->sp ? " sp" : "", p->mem / 1e9, w->params / 1e9, w->grads / 1e9,
           w->optim / 1e9, w->acts / 1e9, w->sets, w->transient / 1e9,
           (w->tp_ar + w->tp_ag + w->tp_rs) / 1e6, (w->dp_ar + w->dp_rs + w->dp_ag) / 1e6,
           (w->pp_send + w->pp_recv) / 1e6, w->embed_ar / 1e6, p->bubble, p->step, 100 * p->mfu);
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
    PlanCluster c = {.gpus = 8, .per_node = 8, .mem_gb = 80, .tflops = 989.4, .intra_gbs = 450,
                     .inter_gbs = 50, .latency_us = 10};
    int G = 0, seq = 0, nodes = 1, top = 10;
    char err[256];
    enum { O_MODEL = 256, O_GB, O_SEQ, O_GPUS, O_GPN, O_MEM, O_TF, O_INTRA, O_INTER, O_CLUSTER, O_L, O_H, O_C,
           O_V, O_MS, O_DEV, O_PLAN, O_TOP };
    static const struct option opts[] = {
        {"plan", 0, 0, O_PLAN}, {"model", 1, 0, O_MODEL}, {"global-batch", 1, 0, O_GB}, {"seq", 1, 0, O_SEQ},
        {"gpus", 1, 0, O_GPUS}, {"gpus-per-node", 1, 0, O_GPN}, {"gpu-mem", 1, 0, O_MEM},
        {"gpu-tflops", 1, 0, O_TF}, {"intra-gbs", 1, 0, O_INTRA}, {"inter-gbs", 1, 0, O_INTER},
        {"cluster", 1, 0, O_CLUSTER}, {"layers", 1, 0, O_L}, {"heads", 1, 0, O_H}, {"dim", 1, 0, O_C},
        {"vocab", 1, 0, O_V}, {"max-seq", 1, 0, O_MS}, {"device", 1, 0, O_DEV}, {"top", 1, 0, O_TOP}, {0, 0, 0, 0}};
    optind = 1;
    opterr = 0;   /* train's own flags pass by: the planner reads only its own */
    double x;
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case O_PLAN: break;
        case O_MODEL: {
            size_t i, n = sizeof models / sizeof *models;
            for (i = 0; i < n && strcmp(models[i].name, optarg); i++) {}
            if (i == n) { fprintf(stderr, "plan: no model preset '%s' (gpt2, gpt2-medium, gpt2-large, gpt2-xl, gpt3-125m .. gpt3-175b)\n", optarg); return 2; }
            cfg.layers = models[i].layers; cfg.heads = models[i].heads; cfg.dim = models[i].dim;
            cfg.max_seq = models[i].seq; cfg.vocab = 50257;
            if (!seq) seq = models[i].seq;
            break;
        }
        case O_CLUSTER: {   /* h100x8, a100x8, h100x1024 (GPUs) */
            char name[32]; int n = 0;
            size_t i, k = sizeof clusters / sizeof *clusters;
            if (sscanf(optarg, "%31[a-wyz0-9]x%d", name, &n) != 2) n = 0;
            for (i = 0; i < k && (n <= 0 || strcmp(clusters[i].name, name)); i++) {}
            if (i == k) { fprintf(stderr, "plan: no cluster preset '%s' (h100xN, a100xN: N GPUs, 8 a node)\n", optarg); return 2; }
            c.gpus = n; c.per_node = clusters[i].per_node; c.mem_gb = clusters[i].mem; c.tflops = clusters[i].tflops;
            c.intra_gbs = clusters[i].intra; c.inter_gbs = clusters[i].inter;
            break;
        }
        case O_GB: if (plan_num("--global-batch", optarg, 1, 1e9, &x)) return 2; G = (int)x; break;
        case O_SEQ: if (plan_num("--seq", optarg, 1, 1 << 20, &x)) return 2; seq = (int)x; break;
        case O_GPUS: if (plan_num("--gpus", optarg, 1, 1 << 20, &x)) return 2; c.gpus = (int)x; break;
        case O_GPN: if (plan_num("--gpus-per-node", optarg, 1, 1024, &x)) return 2; c.per_node = (int)x; break;
        case O_MEM: if (plan_num("--gpu-mem", optarg, 1e-3, 1e6, &c.mem_gb)) return 2; break;
        case O_TF: if (plan_num("--gpu-tflops", optarg, 1e-3, 1e7, &c.tflops)) return 2; break;
        case O_INTRA: if (plan_num("--intra-gbs", optarg, 1e-3, 1e6, &c.intra_gbs)) return 2; break;
        case O_INTER: if (plan_num("--inter-gbs", optarg, 1e-3, 1e6, &c.inter_gbs)) return 2; break;
        case O_L: if (plan_num("--layers", optarg, 1, SAFE_MAX_LAYERS, &x)) return 2; cfg.layers = (int)x; break;
        case O_H: if (plan_num("--heads", optarg, 1, SAFE_MAX_HEADS, &x)) return 2; cfg.heads = (int)x; break;
        case O_C: if (plan_num("--dim", optarg, 1, SAFE_MAX_DIM, &x)) return 2; cfg.dim = (int)x; break;
        case O_V: if (plan_num("--vocab", optarg, 1, SAFE_MAX_VOCAB, &x)) return 2; cfg.vocab = (int)x; break;
        case O_MS: if (plan_num("--max-seq", optarg, 1, SAFE_MAX_SEQ, &x)) return 2; cfg.max_seq = (int)x; break;
        case O_DEV: c.cpu = !strcmp(optarg, "cpu"); break;
        case O_TOP: if (plan_num("--top", optarg, 0, 1e6, &x)) return 2; top = (int)x; break;
        default: break;   /* train's other flags: not the planner's */
        }
    }
    if (!seq) seq = cfg.max_seq;
    if (!G) G = c.gpus;
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
    size_t cap = 1 << 20, n = 0;
    PlanResult *all = malloc(cap * sizeof *all);
    int rejected[4] = {0};
    PlanResult best_rej[4];
    for (int dp = 1; dp <= c.gpus; dp++) {
        if (c.gpus % dp || G % dp) continue;
        for (int tp = 1; tp <= c.gpus / dp; tp++) {
            if ((c.gpus / dp) % tp) continue;
            int pp = c.gpus / dp / tp, per = G / dp;
            for (int M = 1; M <= per && n + 256 < cap; M++) {
                if (per % M || (pp == 1 && M > 1 && M != per) || (pp > 1 && M < pp && M != per)) continue;
                for (int z = 0; z <= 3; z++) for (int off = 0; off <= 1; off++)
                for (int sc = PP_GPIPE; sc <= PP_1F1B; sc++) for (int rc = 0; rc <= 1; rc++)
                for (int sp = 0; sp <= (tp > 1); sp++) {
                    if ((pp == 1 && sc != PP_1F1B) || (off && z == 0) || (pp > 1 && z >= 2)) continue;
                    PlanLayout l = {dp, tp, pp, z, off, M, per / M, sc, rc, sp};
                    PlanResult p;
                    plan_evaluate(&cfg, G, seq, &c, &l, &p);
                    int kind = !p.why ? -1 : !strcmp(p.why, "does not fit in memory") ? 0 : 1;
                    if (kind < 0 && tp > c.per_node) kind = 2, p.why = "tp crosses nodes";
                    if (kind >= 0) {
                        if (!rejected[kind]++ || p.mem < best_rej[kind].mem) best_rej[kind] = p;
                        continue;
                    }
                    all[n++] = p;
                }
            }
        }
    }
    if (!n) {
        fprintf(stderr, "plan: no layout fits: the smallest needs %.2f GB a rank, the GPU has %.0f GB\n",
               rejected[0] ? best_rej[0].mem / 1e9 : 0, c.mem_gb);
        free(all);
        return 2;
    }
    printf("plan: %d layers, %d heads, dim %d, vocab %d (padded %d), %zu parameters | global batch %d x seq %d\n",
           cfg.layers, cfg.heads, cfg.dim, cfg.vocab, cfg.padded_vocab, gpt_total_params(&cfg), G, seq);
    printf("plan: cluster %d GPUs (%d nodes of %d), %.0f GB, %.1f TFLOP/s, %.0f GB/s in a node, %.0f GB/s between\n",
           c.gpus, nodes, c.per_node, c.mem_gb, c.tflops, c.intra_gbs, c.inter_gbs);
    printf("assumptions: memory = train's memory line (gpt_shard_params, zero_memory_formula, gpt_acts_formula x sets in flight)"
           " + ZeRO-2/3 unit buffers; %s activations; 1 GB = 1e9 bytes; compute 6N + 12LTC flops a token at %.0f%% of peak,"
           " x4/3 with recompute; comm latency %.0f us + bytes / bus bandwidth, tp in a node, dp in a node when tp x dp fits;"
           " %.0f%% of the dp reduction hidden behind backward; step = (compute + tp + pp) / (1 - bubble) + dp;"
           " offload: 16 bytes a parameter over 25 GB/s PCIe\n",
           c.cpu ? "fp32, softmax probabilities kept" : "bf16, flash attention", 100 * MFU_RATE, c.latency_us, 100 * DP_HIDDEN);
    static const char *kinds[] = {"does not fit in memory", "the model does not divide (tp | heads, pp <= layers)", "tp crosses nodes"};
    for (int k = 0; k < 3; k++)
        if (rejected[k]) {
            printf("rejected %d layouts: %s; e.g.", rejected[k], kinds[k]);
            print_layout(&best_rej[k]);
        }
    qsort(all, n, sizeof *all, cmp_step);
    printf("%zu layouts fit; the fastest %d:\n", n, top < (int)n ? top : (int)n);
    for (size_t i = 0; i < n && (int)i < top; i++) print_layout(&all[i]);
    const PlanResult *b = &all[0];
    printf("plan: --dp %d --tp %d --pp %d --zero %d --micro-batches %d%s%s%s --schedule %s | memory %.2f GB a rank | step %.4g s | mfu %.1f%%\n",
           b->l.dp, b->l.tp, b->l.pp, b->l.zero, b->l.M, b->l.offload ? " --offload" : "", b->l.recompute ? " --recompute" : "",
           b->l.sp ? " --sp" : "", sched_name(b->l.sched), b->mem / 1e9, b->step, 100 * b->mfu);
    free(all);
    return 0;
}
