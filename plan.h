/* plan.h: the auto-parallel planner (自动并行): dp x cp x tp x pp x ZeRO x
 * micro-batches for a model, a global batch and a cluster, by the formulas
 * train's memory line and --comm-stats are tested against. */
#ifndef PLAN_H
#define PLAN_H
#include <stdio.h>
#include "gpt.h"
#include "layout.h"

typedef struct PlanCluster {
    int gpus, per_node;
    double mem_gb, tflops, intra_gbs, inter_gbs, latency_us;
    int cpu;   /* CPU ranks: fp32, attention keeps B*NH*T*T probabilities, no GPU plan buffer */
    int cores; /* CPU ranks sharing this many cores, one thread a rank (tflops is a core's); 0 = a
                  device (or core) a rank */
} PlanCluster;

/* The planner's default cluster: 8 of this GPU on one node, and the
 * latency of one message between ranks, in microseconds, when none is
 * given (--latency-us). */
#define PLAN_DEFAULT_GPU "h100"
#define PLAN_LATENCY_US 10.0

/* The one home of the GPU figures (h100: 80 GB, 989.4 TFLOP/s dense bf16,
 * 450 GB/s NVLink and 50 GB/s between nodes, 8 a node; a100). Sets c's
 * gpus to `gpus` and its per_node, mem_gb, tflops, intra_gbs and inter_gbs
 * to those of preset `name` ("h100", "a100"), leaving the other fields
 * alone. 0, or -1 (c untouched) for an unknown name. */
int plan_cluster_preset(PlanCluster *c, const char *name, int gpus);
/* The dense bf16 peak in TFLOP/s of a GPU by the name CUDA gives it
 * ("NVIDIA H100 80GB HBM3"): 989.4 for an H100 or H200, 312 for an A100,
 * 0 when the name is none of those. */
double plan_device_tflops(const char *device_name);

/* Flops a token of a training step (forward and backward) for a model
 * reading sequences of seq tokens, in one of two accountings (plan.c gives
 * the derivation): the full count published runs compare by, or the
 * causal one that counts only the half of attention causal masking
 * computes. */
typedef enum {
    PLAN_FLOPS_FULL,     /* 6N + 12 L C T: PaLM's and Megatron's count, the planner's */
    PLAN_FLOPS_CAUSAL,   /* 6N + 6 L C T: what a causal model computes, the step line's MFU */
} PlanFlops;
double plan_flops_per_token(const GPTConfig *cfg, int seq, PlanFlops which);

/* The rows of --comm-stats (operation, group) a step of training moves. */
enum { PLAN_TP_AR, PLAN_TP_AG, PLAN_TP_RS, PLAN_DP_AR, PLAN_DP_RS, PLAN_DP_AG, PLAN_PP_SEND, PLAN_PP_RECV,
       PLAN_PP_AR, PLAN_PP_BC, PLAN_EMBED_AR, PLAN_CP_SEND, PLAN_CP_RECV, PLAN_NROWS };
/* Row i's operation ("all_reduce") and group ("tp"), as --comm-stats names them. */
const char *plan_row_kind(int i);
const char *plan_row_group(int i);

/* Per rank of one stage: bytes of memory and bytes a step in each group. */
typedef struct PlanRank {
    double params, grads, optim, acts;  /* train's memory line (optim wherever it lives) */
    double ring;                        /* of acts, cp's ring buffers and position rows (cp.c) */
    double scratch;                     /* the backward's scratch the sets share (gpt_scratch_formula) */
    double transient;                   /* ZeRO-2/3 unit buffers at their peak */
    double total;                       /* on the device: the above, less offloaded optimizer state */
    double bytes[PLAN_NROWS];           /* bus bytes a step in each --comm-stats row */
    int sets;                           /* activation sets in flight */
    int recomputed;                     /* layer forwards recompute repeats a micro-batch */
    int layers;                         /* the layers this stage holds */
} PlanRank;

typedef struct PlanResult {
    Layout l;         /* dp_mode DDP (the planner does not model the parameter server), dtype bf16 on GPUs */
    double mem, bubble, t_compute, t_tp, t_dp, t_pp, t_cp, step, mfu;
    PlanRank worst;   /* the stage with the most memory */
    const char *why;  /* NULL when it fits */
} PlanResult;

/* Memory and bytes of a rank on stage `stage` of layout l (its batch and
 * seq the step's shape); 0, or -1 when layout_check refuses l. */
int plan_rank(const GPTConfig *cfg, const PlanCluster *c, const Layout *l, int stage, PlanRank *r);
/* Memory, bubble, time and MFU of layout l, whose global batch is
 * batch x micro_batches x dp sequences. */
void plan_evaluate(const GPTConfig *cfg, const PlanCluster *c, const Layout *l, PlanResult *p);
/* Every layout of c's GPUs for global batch G (schedules naive, gpipe and
 * 1f1b; with all_schedules also interleaved, V chunks dividing the
 * layers, and zb-h1, zb-h2), evaluated; context parallelism (cp > 1, 2 cp
 * dividing seq, tp x cp inside a node) only when with_cp and no layout
 * without it fits, some for want of memory (a second pass over the cp
 * ranks): those that fit
 * in fit[nfit], fastest first; of the rest, how many were rejected for
 * each reason (0 memory, 1 the model does not divide, 2 tp (or tp x cp) across nodes)
 * and the one with the least memory of each. 0, or -1 out of memory. */
typedef struct PlanSearch {
    PlanResult *fit;
    size_t nfit;
    int rejected[3];
    PlanResult best_rej[3];
} PlanSearch;
int plan_search(const GPTConfig *cfg, int G, int seq, const PlanCluster *c, int all_schedules, int with_cp,
                PlanSearch *ps);
/* Frees what plan_search filled in ps. */
void plan_search_free(PlanSearch *ps);

/* train --plan-layout: for each rank of layout l (rank = tp_rank + tp x
 * (cp_rank + cp x (dp_rank + dp x stage)), comm.c's mesh), the planner's memory line and
 * --comm-stats rows, in train's own units, so a test can hold the two side
 * by side. 0, or -1 when the model does not divide that way. */
int plan_layout_print(FILE *f, const GPTConfig *cfg, const PlanCluster *c, const Layout *l);
/* ./train --plan ...: prints the plan; returns the exit status (2: impossible). */
int plan_main(int argc, char **argv);
#endif
