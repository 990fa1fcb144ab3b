/* run.h: the state of one run on one rank, shared by the files that make
 * up the `train` program: setup.c (everything checked before a rank
 * exists), main.c (building the rank, the loop, sampling, saving),
 * score.c (the validation loss and HellaSwag) and runlog.c (what rank 0
 * prints and draws of the run).
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
#include "pp.h"
#include "trace.h"

/* Exit statuses: 0 done, 1 a failure, 2 bad input (a flag, a file, a layout). */
#define EXIT_USAGE 2

typedef struct Run {
    Args a;
    int argc;
    char **argv;              /* the command line, for --log's record of the run */
    GPTConfig cfg;            /* the model, from the flags, --init or the checkpoint */
    DevKind kind;
    DType dtype;              /* --dtype, or the device's default */
    int gpus;                 /* GPUs visible on this host */
    CommLaunch launch;
    Comm comm;
    CommMesh mesh;
    TPGroup tpg;
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

/* setup.c: one line on stderr ("train: ..."), exit status 2: for everything the user can fix. */
__attribute__((noreturn, format(printf, 1, 2)))
void setup_die_usage(const char *fmt, ...);

/* setup.c: milliseconds on a monotonic clock. */
double setup_now_ms(void);

/* setup.c: checks every flag, file and layout before any rank is started or
 * anything allocated, and fills r's model, device kind, dtype, launch plan
 * and data; exits 2 with one line on the first problem. */
void setup_check(Run *r);

/* setup.c: the warnings setup_check found (data shared by --data and --val, a
 * .bin file read as bytes, --zero 2/3 with --pp), printed by the first rank once
 * every check has passed, so that a bad-input exit stays one line. */
void setup_warnings(const Run *r);

/* setup.c: stage st of P's layers into s (--stage-layers, --virtual, or even). */
void setup_stage_layers(const Args *a, int L, int P, int st, GPTShard *s);

/* setup.c: the CPU threads a rank uses (--threads, else OMP_NUM_THREADS,
 * else the CPUs this process may run on shared by the ranks on this host);
 * at least 1. */
int setup_threads(const Run *r);

/* setup.c: the CPUs this process may run on (its affinity mask: taskset, a
 * container's cpuset), their ids in order into ids[0..max-1] when ids is
 * not NULL; all online CPUs where the mask cannot be read. At least 1. */
int setup_cpus(int *ids, int max);

/* setup.c: --plan-layout: the planner's memory and bytes for this layout,
 * printed; returns the exit status. */
int setup_plan_layout(Run *r);

/* setup.c: --show-schedule: the schedule as text and SVG; returns the exit status. */
int setup_show_schedule(const Args *a);

/* setup.c: what a checkpoint of this run at `step` records besides the
 * tensors: the model, the layout it runs under, the data order's seed. */
void setup_checkpoint_meta(const Run *r, long step, CheckpointMeta *meta);

/* setup.c: dense bf16 peak of one device in TFLOP/s for the MFU (--peak-tflops,
 * else known by the GPU's name, else 0: no MFU printed). */
double setup_device_peak(Run *r);

#endif
