/* run.h: the state of one run on one rank, shared by the files that make
 * up the `train` program: setup.c (everything checked before a rank
 * exists: setup.h), main.c (building the rank, the loop, sampling,
 * saving), score.c (the validation loss and HellaSwag) and runlog.c (what
 * rank 0 prints and draws of the run). The run's layout is a.layout
 * (layout.h), complete once setup_check returns.
 */
#ifndef RUN_H
#define RUN_H

#include "args.h"
#include "tensor.h"
#include "gpt.h"
#include "data.h"
#include "eval.h"
#include "checkpoint.h"
#include "comm.h"
#include "dp.h"
#include "tp.h"
#include "cp.h"
#include "pp.h"
#include "trace.h"

typedef struct Run {
    Args a;
    int argc;
    char **argv;              /* the command line, for --log's record of the run */
    GPTConfig cfg;            /* the model, from the flags, --init or the checkpoint */
    DevKind kind;             /* the layout's dtype (a.layout.dtype) is --dtype, or this device's default */
    int gpus;                 /* GPUs visible on this host */
    CommLaunch launch;
    Comm comm;
    CommMesh mesh;
    TPGroup tpg;
    CP cp;                    /* context parallelism's ring (when cp > 1) */
    Dev dev;
    GPT model;
    PPStage pp;
    Trace *trace;
    DP dp;
    DataSet train, val;
    char *data_shards;        /* data_describe(&train): the checkpoint's record of the shards */
    Tokenizer tok;            /* vocab 0 when there is none */
    EvalSet hellaswag;        /* --eval-hellaswag's examples (n 0 when there is none) */
    int *inputs, *targets;    /* [B,T] host staging of one micro-batch */
    Checkpoint ck;            /* the checkpoint continued from, when resumed */
    CheckpointAsync ck_async; /* --checkpoint-async: the save in flight */
    int resumed;              /* --resume found a checkpoint (else the run starts fresh) */
    double load_ms;           /* --resume: how long loading it took */
} Run;

#endif
