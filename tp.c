/* tp.c: tensor parallelism (Megatron): layout rules and the tp group's collectives.
 *
 * The articles' intra-layer split (张量并行, 行切分 / 列切分; the TP of
 * hybrid-parallelism.txt's DP+PP+TP): gpt.c holds a rank's heads, MLP
 * columns and vocabulary rows and calls three collectives at Megatron's f
 * and g points; this file says which layouts are possible and binds those
 * collectives to the tp group of the mesh (TP innermost: one box's NVLink
 * neighbours, DESIGN.md). Each collective's consumer waits for that
 * collective only, not for the gradient buckets data parallelism has in
 * flight on its own group.
 */
#include <stdio.h>
#include "tp.h"

int tp_check(const GPTConfig *cfg, int tp, int sp, int batch, int seq, char *err, size_t errlen) {
    if (tp == 1) return 0;
    if (cfg->heads % tp) {
        snprintf(err, errlen, "--tp %d does not divide %d heads", tp, cfg->heads);
        return -1;
    }
    if ((4 * cfg->dim) % tp) {
        snprintf(err, errlen, "--tp %d does not divide the MLP's %d columns (4C)", tp, 4 * cfg->dim);
        return -1;
    }
    if (cfg->padded_vocab % tp) {
        snprintf(err, errlen, "--tp %d does not divide the padded vocabulary %d", tp, cfg->padded_vocab);
        return -1;
    }
    if (sp && (batch * seq) % tp) {
        snprintf(err, errlen, "--sp: --tp %d does not divide the %d tokens of a micro-batch (--batch %d x --seq %d)",
                 tp, batch * seq, batch, seq);
        return -1;
    }
    if (sp && seq % tp) {
        snprintf(err, errlen, "--sp: --tp %d does not divide --seq %d (sampling runs one sequence)", tp, seq);
        return -1;
    }
    return 0;
}

static CommDtype comm_type(DType t) { return t == DT_BF16 ? COMM_BF16 : COMM_F32; }

static void all_reduce(void *ctx, void *buf, size_t n, DType t) {
    TPGroup *g = ctx;
    comm_op_wait(comm_all_reduce(g->g, g->dev, buf, n, comm_type(t), COMM_SUM), g->dev);
}

static void all_gather(void *ctx, void *out, const void *in, size_t n, DType t) {
    TPGroup *g = ctx;
    comm_op_wait(comm_all_gather(g->g, g->dev, out, in, n * g->g->size, comm_type(t)), g->dev);
}

static void reduce_scatter(void *ctx, void *out, const void *in, size_t n, DType t) {
    TPGroup *g = ctx;
    comm_op_wait(comm_reduce_scatter(g->g, g->dev, out, in, n * g->g->size, comm_type(t), COMM_SUM), g->dev);
}

void tp_attach(GPT *m, TPGroup *t, CommGroup *g, Dev *dev, int sp) {
    t->g = g;
    t->dev = dev;
    m->tpc = (GPTTensorParallel){.sp = sp && m->tp > 1, .ctx = t, .all_reduce = all_reduce,
                                 .all_gather = all_gather, .reduce_scatter = reduce_scatter};
}
