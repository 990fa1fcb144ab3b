/* args.h: the command line of `train`, as one table (args.c).
 *
 * Every flag train accepts is one row of args.c's table: its name, its
 * value's placeholder and its help. getopt_long's options, `--help` and the
 * command-line reference (docs/cli.md, which embeds `--help` and is checked
 * against it by test/test_docs.sh) are all made from that one table.
 * args_parse only parses and checks what the flags say among themselves;
 * what needs a file, the model or the ranks is setup.c's.
 */
#ifndef ARGS_H
#define ARGS_H

#include <stdint.h>
#include <stdio.h>
#include "gpt.h"
#include "optim.h"
#include "layout.h"
#include "pp_sched.h"
#include "comm.h"

/* Everything the command line says. */
typedef struct Args {
    const char *data, *val, *init, *save;
    const char *eval_hellaswag;  /* --eval-hellaswag: llm.c's multiple-choice eval file (eval.h) */
    GPTConfig model;          /* when there is no --init; 0 = default */
    int steps;
    OptConfig opt;
    uint64_t seed;
    int shuffle;
    const char *device;       /* "cpu", "cuda" or NULL = cuda if a GPU is visible */
    const char *dtype;        /* "fp32", "bf16" or NULL = bf16 on cuda, fp32 on the cpu (setup.c
                                 resolves it into layout.dtype) */
    double peak_tflops;       /* the device's dense bf16 peak for MFU; 0 = from its name */
    int atomic_dq;            /* --atomic-dq: attention's dq summed with atomics on a GPU */
    int no_self_test;         /* --no-self-test: skip the kernels' check against the CPU */
    int backend;              /* --backend: -1 auto, else COMM_SHM or COMM_NCCL */
    double comm_timeout;      /* --comm-timeout: seconds an NCCL operation may take (0: 300) */
    int gpu;
    int threads;
    int val_every, val_batches;
    int sample;               /* tokens to generate at the end */
    float temperature;
    int ranks;                /* --ranks: fork this many ranks (0: one, or the launcher's) */
    Layout layout;            /* --dp --tp --pp (0: inferred), --sp, --dp-mode, --zero, --offload,
                                 --schedule, --virtual, --micro-batches, --stage-layers,
                                 --recompute(-mode), --batch, --seq */
    double bucket_mb;         /* --bucket-mb: DDP's and ZeRO-1's gradient bucket, MB of float32 */
    const char *dump_grads;   /* write step 0's reduced gradients here (for tests) */
    int show_schedule;        /* --show-schedule: draw the schedule and exit */
    const char *schedule_svg; /* --schedule-svg: the schedule's picture (schedule.svg) */
    const char *trace;
    const char *plot;         /* --plot: the loss curve as SVG, rewritten as the run goes */
    int check_data;           /* --check-data: read every token of --data and --val, then exit */
    const char *model_preset; /* --model: gpt2, gpt2-medium, ... or d12, d24, ... */
    const char *log;          /* --log: the run's record as JSON lines, appended across restarts */
    int pin_cores;            /* pin each rank of this host to its own cores */
    const char *tokenizer;    /* llm.c tokenizer file to print samples of token data as text */
    const char *checkpoint_dir;  /* --checkpoint-dir: sharded checkpoints (checkpoint.c) */
    int checkpoint_every;     /* --checkpoint-every N steps (0: only at the end) */
    int keep;                 /* --keep K complete checkpoints */
    int resume;               /* --resume: continue from checkpoint_dir/latest if there is one */
    double time_limit_min;    /* --time-limit: minutes of wall time (0: none) */
    int checkpoint_async;     /* --checkpoint-async: write checkpoints in the background */
    int comm_stats;
    int plan_layout;          /* --plan-layout: the planner's memory and bytes for this layout, no run */
    int layout_auto;          /* --layout auto: dp, tp, pp, zero, micro-batches from the planner */
    int global_batch;         /* --global-batch: sequences a step for --layout auto (0: batch x M x ranks) */
    int all_schedules;        /* --all-schedules: --layout auto considers interleaved and zero-bubble too */
} Args;

/* What args_parse asks of its caller besides an error. */
enum { ARGS_RUN = 0, ARGS_HELP = 1, ARGS_VERSION = 2 };

/* Fills a from the command line (argv[0] is the program). Returns ARGS_RUN,
 * ARGS_HELP or ARGS_VERSION, or -1 with one line in err; never exits (the
 * fuzz target fuzz/fuzz_args.c calls it). */
int args_parse(Args *a, int argc, char **argv, char *err, size_t errlen);

/* Prints `--help`: every row of the table, grouped under its heading. */
void args_usage(FILE *f);

/* args_parse, or one line on stderr and exit 2; --help and --version print and exit 0. */
void args_parse_or_exit(Args *a, int argc, char **argv);

/* Whether this command line only explains (--show-schedule, --plan-layout):
 * it needs no data, trains nothing and exits 0 after explaining. */
int args_explain_only(const Args *a);

#endif
