/* plan.h: the auto-parallel planner (自动并行): dp x tp x pp x ZeRO x
 * micro-batches for a model, a global batch and a cluster, by the formulas
 * train's memory line and --comm-stats are tested against. */
#ifndef PLAN_H
#define PLAN_H
#include "gpt.h"

typedef struct PlanCluster {
    int gpus, per_node;
    double mem_gb, tflops, intra_gbs, inter_gbs, latency_us;
    int cpu;   /* CPU ranks: fp32, attention keeps B*NH*T*T probabilities, no GPU plan buffer */
} PlanCluster;

typedef struct PlanLayout {
    int dp, tp, pp, zero, offload, M, b, sched, recompute, sp;
} PlanLayout;

/* Per rank of one stage: bytes of memory and bytes a step in each group. */
typedef struct PlanRank {
    double params, grads, optim, acts, transient, total;
    double tp_ar, tp_ag, tp_rs, dp_ar, dp_rs, dp_ag, pp_send, pp_recv, embed_ar;
    int sets;
} PlanRank;

typedef struct PlanResult {
    PlanLayout l;
    double mem, bubble, t_compute, t_tp, t_dp, t_pp, step, mfu;
    PlanRank worst;   /* the stage with the most memory */
    const char *why;  /* NULL when it fits */
} PlanResult;

/* Memory and bytes of a rank on stage `stage` of layout l; 0, or -1 when the
 * model does not divide that way. */
int plan_rank(const GPTConfig *cfg, int seq, const PlanCluster *c, const PlanLayout *l, int stage, PlanRank *r);
/* Memory, bubble, time and MFU of layout l for global batch G. */
void plan_evaluate(const GPTConfig *cfg, int G, int seq, const PlanCluster *c, const PlanLayout *l, PlanResult *p);
/* ./train --plan ...: prints the plan; returns the exit status (2: impossible). */
int plan_main(int argc, char **argv);
#endif
