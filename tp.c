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
