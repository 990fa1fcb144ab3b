/* tp.h: tensor parallelism: the checks on a --tp layout and the tp group's
 * collectives for gpt.c. */
#ifndef TP_H
#define TP_H

#include "comm.h"
#include "gpt.h"

/* Context of the collectives: the tp group and the device of the buffers. */
typedef struct TPGroup {
    CommGroup *g;
    Dev *dev;
} TPGroup;

/* Makes m use group g (of m->tp ranks) for its Megatron collectives. */
void tp_attach(GPT *m, TPGroup *t, CommGroup *g, Dev *dev, int sp);

#endif
