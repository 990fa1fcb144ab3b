/* tp.h: tensor parallelism: the checks on a --tp layout and the tp group's
 * collectives for gpt.c. */
#ifndef TP_H
#define TP_H

#include "comm.h"
#include "gpt.h"

/* Whether tp ranks can split this model (and, with sp, these batches):
 * heads, 4C and the padded vocabulary must divide by tp; with sequence
 * parallelism so must the tokens of a micro-batch. Returns 0, or -1 with
 * one line in err naming the rule. */
int tp_check(const GPTConfig *cfg, int tp, int sp, int batch, int seq, char *err, size_t errlen);

/* Context of the collectives: the tp group and the device of the buffers. */
typedef struct TPGroup {
    CommGroup *g;
    Dev *dev;
} TPGroup;

/* Makes m use group g (of m->tp ranks) for its Megatron collectives. */
void tp_attach(GPT *m, TPGroup *t, CommGroup *g, Dev *dev, int sp);

#endif
