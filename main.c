/* main.c: the `train` program: flags, launching ranks, and the training loop.
 *
 * One step, as DESIGN.md draws it: data.c hands each dp rank its
 * micro-batches of the global batch; gpt.c runs forward and backward
 * (gradients accumulate over micro-batches); dp.c reduces the gradients over
 * the dp group bucket by bucket while backward runs; zero.c takes the global
 * norm, clips and updates what this rank owns; rank 0 prints the step line.
 * One rank is the same code with a dp group of one.
 *
 * Every flag, file and layout is checked before any rank is started or
 * anything allocated: a bad one is one line on stderr and exit status 2.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <libgen.h>
#include <sys/types.h>
#include <sys/wait.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "tensor.h"
#include "gpt.h"
#include "data.h"
#include "ckpt.h"
#include "checkpoint.h"
#include "optim.h"
#include "comm.h"
#include "dp.h"
#include "tp.h"
#include "pp.h"
#include "plan.h"
#include "trace.h"
#include "selftest.h"
#include "version.h"
#include "safe.h"
#include "plot.h"

#define EXIT_USAGE 2

/* Everything the command line says. */
typedef struct Args {
    const char *data, *val, *init, *save;
    GPTConfig model;          /* when there is no --init; 0 = default */
    int batch, seq, micro_batches, steps;
    OptConfig opt;
    uint64_t seed;
    int shuffle;
    const char *device;       /* "cpu", "cuda" or NULL = cuda if a GPU is visible */
    const char *dtype;        /* "fp32", "bf16" or NULL = bf16 on cuda, fp32 on the cpu */
    double peak_tflops;       /* the device's dense bf16 peak for MFU; 0 = from its name */
    int deterministic;        /* --deterministic: no GPU kernel sums with atomics */
    int no_self_test;         /* --no-self-test: skip the kernels' check against the CPU */
    int backend;              /* --backend: -1 auto, else COMM_SHM or COMM_NCCL */
    double comm_timeout;      /* --comm-timeout: seconds an NCCL operation may take (0: 300) */
    int gpu;
    int threads;
    int val_every, val_batches;
    int sample;               /* tokens to generate at the end */
    float temperature;
    int ranks;                /* --ranks: fork this many ranks (0: one, or the launcher's) */
    int dp, tp, pp;           /* the mesh; 0 = inferred */
    DPConfig dpc;
    int sp;                   /* Megatron sequence parallelism inside the tp group */
    const char *dump_grads;   /* write step 0's reduced gradients here (for tests) */
    PPSchedule schedule;
    int virtual_chunks;       /* --virtual V: chunks a stage (interleaved); 0 = 1 */
    int stage_layers[COMM_MAX_RANKS];  /* --stage-layers, 0s when even */
    int nstage_layers;
    int recompute;
    int show_schedule;
    const char *schedule_svg; /* --schedule-svg: the schedule's picture (schedule.svg) */
    const char *trace;
    const char *plot;         /* --plot: the loss curve as SVG, rewritten as the run goes */
    int pin_cores;            /* pin each rank of this host to its own cores */
    const char *tokenizer;    /* llm.c tokenizer file to print samples of token data as text */
    const char *checkpoint_dir;  /* --checkpoint-dir: sharded checkpoints (checkpoint.c) */
    int checkpoint_every;     /* --checkpoint-every N steps (0: only at the end) */
    int keep;                 /* --keep K complete checkpoints */
    int resume;               /* --resume from checkpoint_dir/latest */
    int comm_stats;
    int plan_layout;          /* --plan-layout: the planner's memory and bytes for this layout, no run */
    int layout_auto;          /* --layout auto: dp, tp, pp, zero, micro-batches from the planner */
    int global_batch;         /* --global-batch: sequences a step for --layout auto (0: batch x M x ranks) */
    int all_schedules;        /* --all-schedules: --layout auto considers interleaved and zero-bubble too */
} Args;

/* The state of one run on one rank. */
typedef struct Run {
    Args a;
    GPTConfig cfg;            /* the model, from the flags or --init */
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
    Tokenizer tok;            /* vocab 0 when there is none */
    int *inputs, *targets;    /* [B,T] host staging of one micro-batch */
    Checkpoint ck;            /* --resume: the checkpoint continued from */
    double load_ms;           /* --resume: how long loading it took */
} Run;

static void usage(FILE *f) {
    fprintf(f,
        "usage: ./train --data FILE [options]\n"
        "  --data FILE            training tokens: an llm.c token file, or any file read as bytes\n"
        "  --val FILE             validation tokens (same formats)\n"
        "  --init FILE            start from an llm.c model file (float32)\n"
        "  --save FILE            write an llm.c model file at the end\n"
        "  --plot FILE.svg        train and val loss and the learning rate against steps, as SVG,\n"
        "                         rewritten every few steps (open it mid-run)\n"
        "  --version              the build: commit, CUDA runtime and driver, GPU architectures, NCCL\n"
        "model, when there is no --init:\n"
        "  --layers L (4)  --heads H (4)  --dim C (128)  --max-seq S (256)\n"
        "  --vocab V              (the data's: 256 for bytes, 50257 for token files)\n"
        "batch and schedule:\n"
        "  --batch B (4)  --seq T (64)  --micro-batches M (1)  --steps N (100)\n"
        "  --lr F (3e-4)  --lr-min F (0)  --warmup N (0)  --lr-decay cosine|none (cosine)\n"
        "  --beta1 F (0.9)  --beta2 F (0.95)  --eps F (1e-8)  --wd F (0.1)  --clip F (1.0, 0 = off)\n"
        "  --seed N (1337)  --shuffle\n"
        "  --val-every N (0: only at the end)  --val-batches N (8)\n"
        "device:\n"
        "  --device cpu|cuda      (cuda when a GPU is visible)  --gpu N (0)  --threads N\n"
        "  --dtype bf16|fp32      activations and compute copy of the parameters (bf16 on cuda,\n"
        "                         fp32 on the cpu; bf16 on the cpu emulates the rounding, slowly)\n"
        "  --peak-tflops F        dense bf16 peak of one device for the step line's MFU\n"
        "                         (known for H100/H200/A100; otherwise MFU is not printed)\n"
        "  --deterministic        GPU runs give the same bits every time: attention's backward\n"
        "                         sums dq without atomics (slower); the rest always does\n"
        "  --no-self-test         skip the check of every GPU kernel against the CPU before step 1\n"
        "  --backend nccl|shm     how ranks exchange: NCCL, or host shared memory (auto: NCCL when\n"
        "                         every rank has a GPU of its own and NCCL is built in)\n"
        "  --comm-timeout S       stop a rank whose NCCL operation takes longer than S seconds (300)\n"
        "generation:\n"
        "  --sample N             generate N tokens at the end  --temperature F (1.0)\n"
        "  --tokenizer FILE       llm.c's gpt2_tokenizer.bin: print samples of token data as text\n"
        "ranks and layout:\n"
        "  --ranks N              fork N ranks on this host (else one, or srun/mpirun/torchrun's)\n"
        "  --dp D --tp T --pp P   the mesh, D*T*P = ranks; one left out is inferred (pp: later)\n"
        "  --sp                   sequence parallelism in the tp group (Megatron)\n"
        "  --dp-mode ddp|ps       all-reduce (DDP), or the parameter server on rank 0 (ddp)\n"
        "  --zero 0|1|2|3         shard optimizer state, gradients, parameters over dp (0)\n"
        "  --offload              optimizer state and AdamW on the host (ZeRO-Offload)\n"
        "  --bucket-mb F          gradient bucket size for the overlapped reduction (25)\n"
        "  --comm-stats           print each rank's bytes moved, by operation and group\n"
        "  --dump-grads FILE      write step 1's reduced gradients as an llm.c model file (tests)\n"
        "  --layout auto          the planner chooses --dp --tp --pp --zero --micro-batches --batch\n"
        "                         --schedule --recompute --sp for --global-batch N sequences (else\n"
        "                         batch x micro-batches x ranks) and prints its choice\n"
        "  --all-schedules        --layout auto may choose interleaved and zb-h1/zb-h2 too\n"
        "  --plan-layout          print the planner's memory and --comm-stats rows for this layout\n"
        "  --plan ...             plan for a model and cluster without training (README: Planner)\n"
        "pipeline:\n"
        "  --schedule naive|gpipe|1f1b|interleaved|zb-h1|zb-h2\n"
        "                         the order of micro-batches' forwards and backwards (1f1b);\n"
        "                         interleaved: Megatron's, V chunks a stage; zb-h1, zb-h2: zero\n"
        "                         bubble, each backward split into B (input gradient) and a later\n"
        "                         W (weight gradients; zb-h2 holds more to fill the bubble)\n"
        "  --virtual V            interleaved: V chunks of layers a stage, stage s holding the\n"
        "                         model's chunks s, s+P, ... (1; the layers divide into P x V)\n"
        "  --stage-layers 3,3,4,2 layers of each stage (as even as possible); with --virtual V,\n"
        "                         P x V ranges: the model's chunks in order\n"
        "  --recompute            keep each layer's input only; recompute the rest in backward\n"
        "  --show-schedule        draw the schedule and its bubble before training, and as SVG\n"
        "  --schedule-svg FILE    where --show-schedule writes the SVG (schedule.svg); implies it\n"
        "  --trace FILE           Chrome/Perfetto trace of every rank's spans\n"
        "  --pin-cores            pin each rank to its own cores (benchmarks)\n"
        "checkpoints:\n"
        "  --checkpoint-dir DIR   sharded checkpoints in DIR/step-N (each rank writes what it owns)\n"
        "  --checkpoint-every N   every N steps (0: only at the end and on SIGTERM/SIGINT)\n"
        "  --keep K               complete checkpoints kept (2)\n"
        "  --resume               continue from DIR/latest, under this run's layout\n");
}

/* One line on stderr, exit status 2: for everything the user can fix. */
__attribute__((noreturn, format(printf, 1, 2)))
static void die_usage(const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "train: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    exit(EXIT_USAGE);
}

/* The parser's errors: one line in err, -1 (args_parse returns it; it never exits). */
__attribute__((format(printf, 3, 4)))
static int arg_fail(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

static int parse_int(const char *flag, const char *s, long lo, long hi, long *out, char *err, size_t errlen) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end) return arg_fail(err, errlen, "%s expects an integer, got '%s'", flag, s);
    if (v < lo || v > hi) return arg_fail(err, errlen, "%s must be between %ld and %ld, got %ld", flag, lo, hi, v);
    *out = v;
    return 0;
}

static int parse_float(const char *flag, const char *s, double lo, double hi, float *out, char *err, size_t errlen) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v)) return arg_fail(err, errlen, "%s expects a number, got '%s'", flag, s);
    if (v < lo || v > hi) return arg_fail(err, errlen, "%s must be between %g and %g, got %g", flag, lo, hi, v);
    *out = (float)v;
    return 0;
}

enum {
    F_DATA = 256, F_VAL, F_INIT, F_SAVE, F_LAYERS, F_HEADS, F_DIM, F_MAXSEQ, F_VOCAB, F_BATCH,
    F_SEQ, F_MICRO, F_STEPS, F_LR, F_LRMIN, F_WARMUP, F_DECAY, F_BETA1, F_BETA2, F_EPS, F_WD,
    F_CLIP, F_SEED, F_SHUFFLE, F_DEVICE, F_GPU, F_THREADS, F_VALEVERY, F_VALBATCHES, F_SAMPLE,
    F_TEMP, F_HELP, F_RANKS, F_DP, F_TP, F_PP, F_DPMODE, F_ZERO, F_OFFLOAD, F_BUCKET, F_COMMSTATS,
    F_SP, F_DUMPGRADS, F_SCHEDULE, F_VIRTUAL, F_STAGELAYERS, F_RECOMPUTE, F_SHOWSCHED, F_TRACE, F_PIN,
    F_PLANLAYOUT, F_LAYOUT, F_GLOBALBATCH, F_ALLSCHED,
    F_TOKENIZER, F_DTYPE, F_PEAK, F_DETERMINISTIC, F_VERSION, F_NOSELFTEST, F_BACKEND, F_COMMTIMEOUT,
    F_CKPTDIR, F_CKPTEVERY, F_KEEP, F_RESUME, F_PLOT, F_SCHEDSVG,
};

/* What args_parse asks of its caller besides an error. */
enum { ARGS_RUN = 0, ARGS_HELP = 1, ARGS_VERSION = 2 };

/* Fills a from the command line. Returns ARGS_RUN, ARGS_HELP or
 * ARGS_VERSION, or -1 with one line in err; never exits (the fuzz target
 * fuzz/fuzz_args.c calls it). */
static int args_parse(Args *a, int argc, char **argv, char *err, size_t errlen) {
    static const struct option opts[] = {
        {"data", 1, 0, F_DATA}, {"val", 1, 0, F_VAL}, {"init", 1, 0, F_INIT},
        {"save", 1, 0, F_SAVE}, {"layers", 1, 0, F_LAYERS}, {"heads", 1, 0, F_HEADS},
        {"dim", 1, 0, F_DIM}, {"max-seq", 1, 0, F_MAXSEQ}, {"vocab", 1, 0, F_VOCAB},
        {"batch", 1, 0, F_BATCH}, {"seq", 1, 0, F_SEQ}, {"micro-batches", 1, 0, F_MICRO},
        {"steps", 1, 0, F_STEPS}, {"lr", 1, 0, F_LR}, {"lr-min", 1, 0, F_LRMIN},
        {"warmup", 1, 0, F_WARMUP}, {"lr-decay", 1, 0, F_DECAY}, {"beta1", 1, 0, F_BETA1},
        {"beta2", 1, 0, F_BETA2}, {"eps", 1, 0, F_EPS}, {"wd", 1, 0, F_WD},
        {"clip", 1, 0, F_CLIP}, {"seed", 1, 0, F_SEED}, {"shuffle", 0, 0, F_SHUFFLE},
        {"device", 1, 0, F_DEVICE}, {"gpu", 1, 0, F_GPU}, {"threads", 1, 0, F_THREADS},
        {"val-every", 1, 0, F_VALEVERY}, {"val-batches", 1, 0, F_VALBATCHES},
        {"sample", 1, 0, F_SAMPLE}, {"temperature", 1, 0, F_TEMP}, {"help", 0, 0, F_HELP},
        {"ranks", 1, 0, F_RANKS}, {"dp", 1, 0, F_DP}, {"tp", 1, 0, F_TP}, {"pp", 1, 0, F_PP},
        {"dp-mode", 1, 0, F_DPMODE}, {"zero", 1, 0, F_ZERO}, {"offload", 0, 0, F_OFFLOAD},
        {"bucket-mb", 1, 0, F_BUCKET}, {"comm-stats", 0, 0, F_COMMSTATS}, {"sp", 0, 0, F_SP},
        {"dump-grads", 1, 0, F_DUMPGRADS}, {"schedule", 1, 0, F_SCHEDULE}, {"virtual", 1, 0, F_VIRTUAL},
        {"stage-layers", 1, 0, F_STAGELAYERS}, {"recompute", 0, 0, F_RECOMPUTE},
        {"show-schedule", 0, 0, F_SHOWSCHED}, {"trace", 1, 0, F_TRACE}, {"pin-cores", 0, 0, F_PIN},
        {"tokenizer", 1, 0, F_TOKENIZER}, {"dtype", 1, 0, F_DTYPE},
        {"peak-tflops", 1, 0, F_PEAK}, {"deterministic", 0, 0, F_DETERMINISTIC},
        {"plan-layout", 0, 0, F_PLANLAYOUT}, {"layout", 1, 0, F_LAYOUT}, {"global-batch", 1, 0, F_GLOBALBATCH},
        {"all-schedules", 0, 0, F_ALLSCHED},
        {"version", 0, 0, F_VERSION}, {"no-self-test", 0, 0, F_NOSELFTEST},
        {"backend", 1, 0, F_BACKEND}, {"comm-timeout", 1, 0, F_COMMTIMEOUT},
        {"checkpoint-dir", 1, 0, F_CKPTDIR}, {"checkpoint-every", 1, 0, F_CKPTEVERY},
        {"keep", 1, 0, F_KEEP}, {"resume", 0, 0, F_RESUME}, {"plot", 1, 0, F_PLOT},
        {"schedule-svg", 1, 0, F_SCHEDSVG},
        {0, 0, 0, 0},
    };
    memset(a, 0, sizeof *a);
    a->batch = 4; a->seq = 64; a->micro_batches = 1; a->steps = 100;
    a->opt = (OptConfig){.lr = 3e-4f, .lr_min = 0.0f, .warmup = 0, .cosine = 1,
                         .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .wd = 0.1f, .clip = 1.0f};
    a->seed = 1337; a->val_batches = 8; a->temperature = 1.0f;
    a->backend = -1;
    a->dpc = (DPConfig){.mode = DP_ALLREDUCE, .zero = 0, .offload = 0, .bucket_mb = 25.0};
    a->schedule = PP_1F1B;
    a->keep = 2;
    opterr = 0;
    optind = 0;   /* getopt_long from the start, each call */
    long iv;
    float fv;
    int c;
    while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
        const char *flag = argv[optind - 1];
        switch (c) {
        case F_DATA: a->data = optarg; break;
        case F_VAL: a->val = optarg; break;
        case F_INIT: a->init = optarg; break;
        case F_SAVE: a->save = optarg; break;
        case F_LAYERS: if (parse_int("--layers", optarg, 1, SAFE_MAX_LAYERS, &iv, err, errlen)) return -1;
            a->model.layers = iv; break;
        case F_HEADS: if (parse_int("--heads", optarg, 1, SAFE_MAX_HEADS, &iv, err, errlen)) return -1;
            a->model.heads = iv; break;
        case F_DIM: if (parse_int("--dim", optarg, 1, SAFE_MAX_DIM, &iv, err, errlen)) return -1;
            a->model.dim = iv; break;
        case F_MAXSEQ: if (parse_int("--max-seq", optarg, 1, SAFE_MAX_SEQ, &iv, err, errlen)) return -1;
            a->model.max_seq = iv; break;
        case F_VOCAB: if (parse_int("--vocab", optarg, 1, SAFE_MAX_VOCAB, &iv, err, errlen)) return -1;
            a->model.vocab = iv; break;
        case F_BATCH: if (parse_int("--batch", optarg, 1, 1 << 20, &iv, err, errlen)) return -1;
            a->batch = iv; break;
        case F_SEQ: if (parse_int("--seq", optarg, 1, SAFE_MAX_SEQ, &iv, err, errlen)) return -1;
            a->seq = iv; break;
        case F_MICRO: if (parse_int("--micro-batches", optarg, 1, 1 << 20, &iv, err, errlen)) return -1;
            a->micro_batches = iv; break;
        case F_GLOBALBATCH: if (parse_int("--global-batch", optarg, 1, 1 << 20, &iv, err, errlen)) return -1;
            a->global_batch = iv; break;
        case F_STEPS: if (parse_int("--steps", optarg, 0, 1L << 30, &iv, err, errlen)) return -1;
            a->steps = iv; break;
        case F_LR: if (parse_float("--lr", optarg, 0, 10, &fv, err, errlen)) return -1;
            a->opt.lr = fv; break;
        case F_LRMIN: if (parse_float("--lr-min", optarg, 0, 10, &fv, err, errlen)) return -1;
            a->opt.lr_min = fv; break;
        case F_WARMUP: if (parse_int("--warmup", optarg, 0, 1L << 30, &iv, err, errlen)) return -1;
            a->opt.warmup = iv; break;
        case F_DECAY:
            if (!strcmp(optarg, "cosine")) a->opt.cosine = 1;
            else if (!strcmp(optarg, "none")) a->opt.cosine = 0;
            else return arg_fail(err, errlen, "--lr-decay must be cosine or none, got '%s'", optarg);
            break;
        case F_BETA1: if (parse_float("--beta1", optarg, 0, 0.999999, &fv, err, errlen)) return -1;
            a->opt.beta1 = fv; break;
        case F_BETA2: if (parse_float("--beta2", optarg, 0, 0.999999, &fv, err, errlen)) return -1;
            a->opt.beta2 = fv; break;
        case F_EPS: if (parse_float("--eps", optarg, 0, 1, &fv, err, errlen)) return -1;
            a->opt.eps = fv; break;
        case F_WD: if (parse_float("--wd", optarg, 0, 10, &fv, err, errlen)) return -1;
            a->opt.wd = fv; break;
        case F_CLIP: if (parse_float("--clip", optarg, 0, 1e30, &fv, err, errlen)) return -1;
            a->opt.clip = fv; break;
        case F_SEED: if (parse_int("--seed", optarg, 0, 0x7fffffffffffffffL, &iv, err, errlen)) return -1;
            a->seed = (uint64_t)iv; break;
        case F_SHUFFLE: a->shuffle = 1; break;
        case F_DEVICE:
            if (strcmp(optarg, "cpu") && strcmp(optarg, "cuda"))
                return arg_fail(err, errlen, "--device must be cpu or cuda, got '%s'", optarg);
            a->device = optarg;
            break;
        case F_GPU: if (parse_int("--gpu", optarg, 0, 1023, &iv, err, errlen)) return -1;
            a->gpu = iv; break;
        case F_DTYPE:
            if (strcmp(optarg, "fp32") && strcmp(optarg, "bf16"))
                return arg_fail(err, errlen, "--dtype must be bf16 or fp32, got '%s'", optarg);
            a->dtype = optarg;
            break;
        case F_PEAK: if (parse_float("--peak-tflops", optarg, 1e-3, 1e6, &fv, err, errlen)) return -1;
            a->peak_tflops = fv; break;
        case F_DETERMINISTIC: a->deterministic = 1; break;
        case F_NOSELFTEST: a->no_self_test = 1; break;
        case F_BACKEND:
            if (!strcmp(optarg, "nccl")) a->backend = COMM_NCCL;
            else if (!strcmp(optarg, "shm")) a->backend = COMM_SHM;
            else if (!strcmp(optarg, "auto")) a->backend = -1;
            else return arg_fail(err, errlen, "--backend must be nccl, shm or auto, got '%s'", optarg);
            break;
        case F_COMMTIMEOUT: if (parse_float("--comm-timeout", optarg, 0.01, 1e6, &fv, err, errlen)) return -1;
            a->comm_timeout = fv; break;
        case F_THREADS: if (parse_int("--threads", optarg, 1, 4096, &iv, err, errlen)) return -1;
            a->threads = iv; break;
        case F_VALEVERY: if (parse_int("--val-every", optarg, 0, 1L << 30, &iv, err, errlen)) return -1;
            a->val_every = iv; break;
        case F_VALBATCHES: if (parse_int("--val-batches", optarg, 1, 1L << 30, &iv, err, errlen)) return -1;
            a->val_batches = iv; break;
        case F_SAMPLE: if (parse_int("--sample", optarg, 0, 1 << 24, &iv, err, errlen)) return -1;
            a->sample = iv; break;
        case F_TEMP: if (parse_float("--temperature", optarg, 1e-6, 100, &fv, err, errlen)) return -1;
            a->temperature = fv; break;
        case F_HELP: return ARGS_HELP;
        case F_VERSION: return ARGS_VERSION;
        case F_RANKS: if (parse_int("--ranks", optarg, 1, COMM_MAX_RANKS, &iv, err, errlen)) return -1;
            a->ranks = iv; break;
        case F_DP: if (parse_int("--dp", optarg, 1, COMM_MAX_RANKS, &iv, err, errlen)) return -1;
            a->dp = iv; break;
        case F_TP: if (parse_int("--tp", optarg, 1, COMM_MAX_RANKS, &iv, err, errlen)) return -1;
            a->tp = iv; break;
        case F_PP: if (parse_int("--pp", optarg, 1, COMM_MAX_RANKS, &iv, err, errlen)) return -1;
            a->pp = iv; break;
        case F_DPMODE:
            if (!strcmp(optarg, "ddp")) a->dpc.mode = DP_ALLREDUCE;
            else if (!strcmp(optarg, "ps")) a->dpc.mode = DP_PS;
            else return arg_fail(err, errlen, "--dp-mode must be ddp or ps, got '%s'", optarg);
            break;
        case F_ZERO: if (parse_int("--zero", optarg, 0, 3, &iv, err, errlen)) return -1;
            a->dpc.zero = iv; break;
        case F_OFFLOAD: a->dpc.offload = 1; break;
        case F_BUCKET: if (parse_float("--bucket-mb", optarg, 1e-6, 1e6, &fv, err, errlen)) return -1;
            a->dpc.bucket_mb = fv; break;
        case F_COMMSTATS: a->comm_stats = 1; break;
        case F_PLANLAYOUT: a->plan_layout = 1; break;
        case F_ALLSCHED: a->all_schedules = 1; break;
        case F_LAYOUT:
            if (strcmp(optarg, "auto") != 0) {
                snprintf(err, errlen, "--layout takes 'auto' (the planner's choice), got '%s'", optarg);
                return -1;
            }
            a->layout_auto = 1;
            break;
        case F_SP: a->sp = 1; break;
        case F_DUMPGRADS: a->dump_grads = optarg; break;
        case F_SCHEDULE: {
            int k = pp_schedule_parse(optarg);
            if (k < 0)
                return arg_fail(err, errlen, "--schedule must be naive, gpipe, 1f1b, interleaved, zb-h1 or zb-h2, "
                                "got '%s'", optarg);
            a->schedule = (PPSchedule)k;
            break;
        }
        case F_VIRTUAL: if (parse_int("--virtual", optarg, 1, GPT_MAX_CHUNKS, &iv, err, errlen)) return -1;
            a->virtual_chunks = iv; break;
        case F_STAGELAYERS: {
            char *p = optarg, *end;
            a->nstage_layers = 0;
            while (*p) {
                errno = 0;
                long v = strtol(p, &end, 10);
                if (end == p || errno || v < 1 || v > SAFE_MAX_LAYERS || (*end && *end != ',') ||
                    a->nstage_layers == COMM_MAX_RANKS)
                    return arg_fail(err, errlen, "--stage-layers expects positive integers separated by commas, got '%s'", optarg);
                a->stage_layers[a->nstage_layers++] = (int)v;
                p = *end ? end + 1 : end;
            }
            break;
        }
        case F_RECOMPUTE: a->recompute = 1; break;
        case F_SHOWSCHED: a->show_schedule = 1; break;
        case F_SCHEDSVG: a->schedule_svg = optarg, a->show_schedule = 1; break;
        case F_TRACE: a->trace = optarg; break;
        case F_PLOT: a->plot = optarg; break;
        case F_PIN: a->pin_cores = 1; break;
        case F_TOKENIZER: a->tokenizer = optarg; break;
        case F_CKPTDIR: a->checkpoint_dir = optarg; break;
        case F_CKPTEVERY: if (parse_int("--checkpoint-every", optarg, 0, 1L << 30, &iv, err, errlen)) return -1;
            a->checkpoint_every = iv; break;
        case F_KEEP: if (parse_int("--keep", optarg, 1, 1000, &iv, err, errlen)) return -1;
            a->keep = iv; break;
        case F_RESUME: a->resume = 1; break;
        case ':': return arg_fail(err, errlen, "%s needs a value", flag);
        default: return arg_fail(err, errlen, "unknown flag %s (see --help)", flag);
        }
    }
    if (optind < argc) return arg_fail(err, errlen, "unexpected argument '%s' (see --help)", argv[optind]);
    if (!a->data) return arg_fail(err, errlen, "--data FILE is required");
    if (a->init && (a->model.layers || a->model.heads || a->model.dim || a->model.max_seq ||
                    a->model.vocab))
        return arg_fail(err, errlen, "--init FILE fixes the model: drop --layers/--heads/--dim/--max-seq/--vocab");
    if (a->dpc.mode == DP_PS && a->dpc.zero)
        return arg_fail(err, errlen, "--dp-mode ps keeps the whole optimizer on rank 0: it takes no --zero");
    if (a->dump_grads && (a->dpc.mode != DP_ALLREDUCE || a->dpc.zero))
        return arg_fail(err, errlen, "--dump-grads needs whole gradients on every rank: --dp-mode ddp --zero 0");
    if ((a->resume || a->checkpoint_every) && !a->checkpoint_dir)
        return arg_fail(err, errlen, "%s needs --checkpoint-dir DIR", a->resume ? "--resume" : "--checkpoint-every");
    if (a->resume && a->init)
        return arg_fail(err, errlen, "--resume takes the model from the checkpoint: drop --init");
    a->opt.steps = a->steps;
    return ARGS_RUN;
}

/* args_parse, or one line on stderr and exit 2; --help and --version exit 0. */
static void parse_args(Args *a, int argc, char **argv) {
    char err[512];
    int rc = args_parse(a, argc, argv, err, sizeof err);
    if (rc < 0) die_usage("%s", err);
    if (rc == ARGS_HELP) { usage(stdout); exit(0); }
    if (rc == ARGS_VERSION) { version_print(stdout); exit(0); }
}

/* Loads a data file and checks it against the model. Exits 2 on bad input. */
static void load_data(DataSet *ds, const char *path, const Args *a, int vocab) {
    char err[512];
    if (data_load(ds, path, err, sizeof err) != 0 ||
        data_prepare(ds, path, a->seq, a->shuffle, a->seed, err, sizeof err) != 0)
        die_usage("%s", err);
    if (data_check_vocab(ds, vocab, err, sizeof err) != 0) die_usage("%s", err);
}

/* GPUs visible, asked in a child process: CUDA must not be initialised in
 * a process that forks ranks afterwards. */
static int probe_gpus(void) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int n = dev_gpu_count();
        _exit(n > 100 ? 100 : n);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) < 0 || !WIFEXITED(status)) return 0;
    return WEXITSTATUS(status);
}

/* --resume: the model is the checkpoint's; a model flag that names another
 * one is an error. */
static void resume_check_model(Run *r, GPTConfig *cfg) {
    const GPTConfig *c = &r->ck.meta.cfg, *f = &r->a.model;
    if ((f->layers && f->layers != c->layers) || (f->heads && f->heads != c->heads) ||
        (f->dim && f->dim != c->dim) || (f->max_seq && f->max_seq != c->max_seq) ||
        (f->vocab && f->vocab != c->vocab))
        die_usage("%s/manifest.txt: the checkpoint holds another model (%d layers, %d heads, dim %d, "
                  "max-seq %d, vocab %d) than the flags ask for", r->ck.dir, c->layers, c->heads, c->dim,
                  c->max_seq, c->vocab);
    *cfg = *c;
    if (r->ck.meta.seed != r->a.seed || r->ck.meta.shuffle != r->a.shuffle)
        fprintf(stderr, "train: warning: %s was written with --seed %llu%s: the data order differs from "
                "that run's\n", r->ck.dir, (unsigned long long)r->ck.meta.seed,
                r->ck.meta.shuffle ? " --shuffle" : "");
}

static PlanCluster host_cluster(const Run *r, int world, int cuda);

/* --layout auto: the planner's fastest layout for this model, these ranks
 * and a global batch of --global-batch sequences (or --batch x
 * --micro-batches x ranks), written into a's flags and printed. */
static void choose_layout(Run *r, const GPTConfig *cfg) {
    Args *a = &r->a;
    int world = r->launch.world_size > 0 ? r->launch.world_size : 1;
    int gpus = r->launch.kind == COMM_LAUNCH_FORK ? probe_gpus() : dev_gpu_count();
    int cuda = a->device ? !strcmp(a->device, "cuda") : gpus > 0;
    int G = a->global_batch ? a->global_batch : a->batch * a->micro_batches * world;
    if (a->dp || a->tp || a->pp || a->nstage_layers)
        die_usage("--layout auto chooses --dp, --tp, --pp and the stages itself: give none of them");
    PlanCluster c = host_cluster(r, world, cuda);
    PlanSearch ps;
    if (plan_search(cfg, G, a->seq, &c, a->all_schedules, &ps) != 0) die_usage("--layout auto: out of memory");
    if (!ps.nfit) {
        plan_search_free(&ps);
        die_usage("--layout auto: no layout of %d ranks fits a global batch of %d sequences of %d tokens", world,
                  G, a->seq);
    }
    const PlanResult *b = &ps.fit[0];
    a->dp = b->l.dp; a->tp = b->l.tp; a->pp = b->l.pp;
    a->dpc.zero = b->l.zero; a->dpc.offload = b->l.offload;
    a->micro_batches = b->l.M; a->batch = b->l.b;
    a->schedule = (PPSchedule)b->l.sched; a->recompute = b->l.recompute; a->sp = b->l.sp;
    a->virtual_chunks = b->l.V > 1 ? b->l.V : 0;
    char virt[32] = "";
    if (b->l.V > 1) snprintf(virt, sizeof virt, " --virtual %d", b->l.V);
    printf("layout auto: --dp %d --tp %d --pp %d --zero %d --micro-batches %d --batch %d%s%s%s --schedule %s%s "
           "(planner: %.3g GB a rank, step %.3g s, on %s)\n", a->dp, a->tp, a->pp, a->dpc.zero, a->micro_batches,
           a->batch, a->dpc.offload ? " --offload" : "", a->recompute ? " --recompute" : "", a->sp ? " --sp" : "",
           pp_schedule_name(a->schedule), virt, b->mem / 1e9, b->step,
           c.cpu ? "CPU ranks" : "80 GB H100-class GPUs, 8 a node");
    fflush(stdout);
    plan_search_free(&ps);
}

/* Everything that can be checked before a rank exists: the model's shape,
 * the data, the layout, the device. Exits 2 on the first problem. */
static void run_check(Run *r) {
    Args *a = &r->a;
    char err[512];
    GPTConfig cfg = a->model;
    DataSet *tr = &r->train;
    /* every output can be written: found now, before any input is read or
     * training done, not after it (safe.h) */
    const char *outs[][2] = {{"--save", a->save}, {"--trace", a->trace}, {"--dump-grads", a->dump_grads},
                              {"--plot", a->plot},
                              {"--schedule-svg", a->show_schedule ? (a->schedule_svg ? a->schedule_svg : "schedule.svg") : NULL}};
    for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++)
        if (outs[i][1] && safe_check_output(outs[i][0], outs[i][1], err, sizeof err) != 0) die_usage("%s", err);
    size_t rows;   /* [B,T] rows of every activation: bounded before any input is read */
    if (safe_mul((size_t)a->batch, (size_t)a->seq, &rows) != 0 || rows > SAFE_MAX_ROWS)
        die_usage("--batch %d x --seq %d = %zu tokens a micro-batch, more than %d", a->batch, a->seq, rows,
                  SAFE_MAX_ROWS);
    if (data_load(tr, a->data, err, sizeof err) != 0) die_usage("%s", err);
    if (a->resume) {
        if (checkpoint_open(a->checkpoint_dir, &r->ck, err, sizeof err) != 0) die_usage("%s", err);
        resume_check_model(r, &cfg);
    } else if (a->init) {
        if (ckpt_read_config(a->init, &cfg, err, sizeof err) != 0) die_usage("%s", err);
    } else {
        if (!cfg.layers) cfg.layers = 4;
        if (!cfg.heads) cfg.heads = 4;
        if (!cfg.dim) cfg.dim = 128;
        if (!cfg.max_seq) cfg.max_seq = a->seq > 256 ? a->seq : 256;
        if (!cfg.vocab) cfg.vocab = tr->is_bytes ? 256 : 50257;
        if (gpt_config_check(&cfg, err, sizeof err) != 0) die_usage("%s", err);
    }
    if (a->seq > cfg.max_seq)
        die_usage("--seq %d exceeds the model's max sequence length %d", a->seq, cfg.max_seq);
    if (data_prepare(tr, a->data, a->seq, a->shuffle, a->seed, err, sizeof err) != 0)
        die_usage("%s", err);
    if (data_check_vocab(tr, cfg.vocab, err, sizeof err) != 0) die_usage("%s", err);
    if (a->val) load_data(&r->val, a->val, a, cfg.vocab);
    if (a->tokenizer && data_tokenizer_load(&r->tok, a->tokenizer, err, sizeof err) != 0)
        die_usage("%s", err);
    if (comm_launch_plan(a->ranks, &r->launch, err, sizeof err) != 0) die_usage("%s", err);
    if (a->all_schedules && !a->layout_auto) die_usage("--all-schedules widens --layout auto's search: give --layout auto");
    if (a->layout_auto) choose_layout(r, &cfg);
    int dp = a->dp, tp = a->tp, pp = a->pp;
    if (comm_mesh_shape(r->launch.world_size, &dp, &tp, &pp, err, sizeof err) != 0)
        die_usage("%s", err);
    /* the tokens of a step are ints everywhere: bounded here */
    size_t step_tokens;
    if (safe_mul_n(&step_tokens, 4, (size_t)a->batch, (size_t)a->seq, (size_t)a->micro_batches, (size_t)dp) != 0 ||
        step_tokens > SAFE_MAX_STEP_TOKENS)
        die_usage("--batch %d x --seq %d x --micro-batches %d x dp %d tokens a step is more than %d", a->batch,
                  a->seq, a->micro_batches, dp, SAFE_MAX_STEP_TOKENS);
    if (tp_check(&cfg, tp, a->sp, a->batch, a->seq, err, sizeof err) != 0) die_usage("%s", err);
    /* the schedule: P stages, M micro-batches, V chunks a stage (pp_sched.c's rules) */
    int V = a->virtual_chunks ? a->virtual_chunks : 1;
    if (pp_schedule_check(a->schedule, pp, a->micro_batches, V, err, sizeof err) != 0) die_usage("%s", err);
    if (V > 1 && pp < 2) die_usage("--virtual %d interleaves chunks over stages: it needs --pp 2 or more", V);
    if (a->nstage_layers) {
        long sum = 0;   /* at most COMM_MAX_RANKS x SAFE_MAX_LAYERS */
        for (int i = 0; i < a->nstage_layers; i++) sum += a->stage_layers[i];
        if (V == 1 && a->nstage_layers != pp)
            die_usage("--stage-layers gives %d stages, --pp is %d", a->nstage_layers, pp);
        if (V > 1 && a->nstage_layers != pp * V)
            die_usage("--stage-layers gives %d ranges, --pp %d x --virtual %d needs %d (the model's chunks in order)",
                      a->nstage_layers, pp, V, pp * V);
        if (sum != cfg.layers)
            die_usage("--stage-layers adds up to %ld layers, the model has %d", sum, cfg.layers);
    } else if (pp > cfg.layers) {
        die_usage("--pp %d exceeds the model's %d layers", pp, cfg.layers);
    } else if (cfg.layers % (pp * V) != 0 && V > 1) {
        die_usage("--pp %d x --virtual %d = %d chunks: the model's %d layers do not divide into them "
                  "(or give the %d chunks' layers with --stage-layers)", pp, V, pp * V, cfg.layers, pp * V);
    }
    if (pp > 1 && a->dpc.zero >= 2)
        fprintf(stderr, "train: warning: --zero %d with --pp %d: the articles advise ZeRO-1 with pipelines "
                "(each micro-batch reduces its gradients; the saving over --pp alone is small)\n",
                a->dpc.zero, pp);
    a->dp = dp; a->tp = tp; a->pp = pp;
    r->gpus = r->launch.kind == COMM_LAUNCH_FORK ? probe_gpus() : dev_gpu_count();
    r->kind = DEV_CPU;
    if (a->device ? !strcmp(a->device, "cuda") : r->gpus > 0) r->kind = DEV_CUDA;
    if (r->kind == DEV_CUDA && r->gpus == 0)
#ifdef USE_CUDA
        die_usage("--device cuda: no CUDA GPU is visible");
#else
        die_usage("--device cuda: this build has no CUDA (nvcc was not found at build time)");
#endif
    /* the backend's own limits, before any rank starts (run_build picks the same one) */
    CommBackend backend = a->backend >= 0 ? (CommBackend)a->backend
                                          : comm_default_backend(&r->launch, r->kind, r->gpus);
    if (backend == COMM_SHM && r->launch.world_size > COMM_MAX_RANKS)
        die_usage("%s started %d ranks: the shared-memory backend takes at most %d ranks%s", r->launch.source,
                  r->launch.world_size, COMM_MAX_RANKS, r->kind == DEV_CUDA ? "" : " (NCCL needs --device cuda)");
#ifndef USE_NCCL
    if (backend == COMM_NCCL) die_usage("--backend nccl: this build has no NCCL (nccl.h was not found at build time)");
#endif
    if (backend == COMM_NCCL && r->kind != DEV_CUDA) die_usage("--backend nccl needs --device cuda");
    r->dtype = a->dtype ? (strcmp(a->dtype, "bf16") ? DT_F32 : DT_BF16)
                        : (r->kind == DEV_CUDA ? DT_BF16 : DT_F32);
    r->cfg = cfg;
}

/* Stage st's layers into s: --stage-layers' ranges or the even split,
 * --virtual chunks a stage (run_check asked P x V to divide L). */
static void stage_layers(const Args *a, int L, int P, int st, GPTShard *s) {
    gpt_stage_layers(L, P, a->virtual_chunks ? a->virtual_chunks : 1, a->nstage_layers ? a->stage_layers : NULL,
                     st, s);
}

/* The planner's model of a cluster like this host: CPU ranks (float32,
 * measured rates of a 2-core machine: bench/plan_calibrate.sh), or GPUs
 * taken for 80 GB H100s on NVLink, 8 a node, 50 GB/s between nodes. */
static PlanCluster host_cluster(const Run *r, int world, int cuda) {
    PlanCluster c = {.gpus = world, .per_node = r->launch.local_size > 0 ? r->launch.local_size : world,
                     .mem_gb = 80, .tflops = 989.4, .intra_gbs = 450, .inter_gbs = 50, .latency_us = 10};
    if (!cuda) {
        /* CPU ranks: a core's float32 rate and the shared-memory backend's
         * bandwidth and latency as make bench-plan measured them on a 2-core
         * machine (0.030 TFLOP/s achieved, the planner's 50% of 0.06;
         * 8 GB/s; 14-16 us); the ranks of this host share its cores, a
         * rank --threads of them (run_build's rule) */
        double ram = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
        int cores = (int)sysconf(_SC_NPROCESSORS_ONLN), local = c.per_node;
        int threads = r->a.threads ? r->a.threads : cores / local;
        if (threads < 1) threads = 1;
        if (cores < 1) cores = 1;
        c.cpu = 1;
        c.mem_gb = ram / 1e9 / (world > 0 ? world : 1);
        c.tflops = 0.06 * threads;
        c.cores = local * threads > cores ? (cores / threads > 0 ? cores / threads : 1) : 0;
        c.intra_gbs = c.inter_gbs = 8;
        c.latency_us = 15;
    }
    return c;
}

/* --plan-layout: what the planner predicts for this very layout, rank by
 * rank, in the units of the memory line and --comm-stats. */
static int plan_this_layout(Run *r) {
    Args *a = &r->a;
    PlanLayout l = {a->dp, a->tp, a->pp, a->dpc.zero, a->dpc.offload, a->micro_batches, a->batch, a->schedule,
                    a->recompute, a->sp, a->nstage_layers ? a->stage_layers : NULL, a->virtual_chunks};
    PlanCluster c = host_cluster(r, a->dp * a->tp * a->pp, r->kind == DEV_CUDA);
    if (r->kind == DEV_CUDA && r->dtype == DT_F32) c.cpu = 1;   /* float32 activations */
    if (a->dpc.mode == DP_PS) die_usage("--plan-layout: the planner does not model --dp-mode ps");
    if (plan_layout_print(stdout, &r->cfg, a->seq, &c, &l) != 0) die_usage("--plan-layout: the model does not divide that way");
    return 0;
}

/* One rank: its device, the communicator and mesh, the model, data
 * parallelism, activations. Runs after the ranks are forked. */
static double now_ms(void);

static void run_build(Run *r) {
    Args *a = &r->a;
    char err[512];
    int local = r->launch.local_size > 0 ? r->launch.local_size : 1;
    int cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    /* the cores are shared by the ranks of this host */
    int threads = a->threads ? a->threads : cores / local;
    if (threads < 1) threads = 1;
#ifdef _OPENMP
    omp_set_num_threads(threads);
#endif
    if (a->pin_cores && local * threads <= cores) {
        cpu_set_t set;
        CPU_ZERO(&set);
        for (int i = 0; i < threads; i++) CPU_SET(r->launch.local_rank * threads + i, &set);
        if (sched_setaffinity(0, sizeof set, &set) != 0)
            fprintf(stderr, "train: rank %d: could not pin to cores\n", r->launch.rank);
    }
    int gpu = r->kind == DEV_CUDA ? (r->launch.kind == COMM_LAUNCH_SINGLE ? a->gpu
                                     : r->launch.local_rank % r->gpus) : 0;
    if (dev_open(&r->dev, r->kind, gpu, err, sizeof err) != 0) die_usage("%s", err);
    dev_set_dtype(&r->dev, r->dtype);
    r->dev.deterministic = r->a.deterministic;
    /* every kernel against the CPU on a tiny model, before anything is built */
    if (r->kind == DEV_CUDA && !a->no_self_test && selftest_startup(&r->dev, r->launch.rank == 0) != 0)
        exit(1);
    CommBackend backend = a->backend >= 0 ? (CommBackend)a->backend
                                          : comm_default_backend(&r->launch, r->kind, r->gpus);
    if (backend == COMM_SHM && r->kind == DEV_CUDA && r->gpus > 1 && r->launch.world_size > 1 &&
        r->launch.rank == 0)
        fprintf(stderr, "warning: the %d ranks' GPUs exchange through host shared memory%s: slow. %s\n",
                r->launch.world_size, a->backend == COMM_SHM ? " (--backend shm)" : "",
#ifdef USE_NCCL
                "Leave out --backend shm, or give each rank a GPU of its own, for NCCL"
#else
                "This build has no NCCL: see `make` first line and README, \"NCCL\""
#endif
        );
    r->launch.comm_timeout_s = a->comm_timeout;
    if (comm_init(&r->comm, &r->launch, backend, &r->dev, err, sizeof err) != 0) {
        fprintf(stderr, "train: rank %d: %s\n", r->launch.rank, err);
        exit(1);
    }
    if (comm_mesh_build(&r->comm, a->dp, a->tp, a->pp, &r->mesh, err, sizeof err) != 0) {
        fprintf(stderr, "train: rank %d: %s\n", r->launch.rank, err);
        exit(1);
    }
    GPTConfig cfg = r->cfg;
    GPTShard shard = gpt_whole(&cfg);
    shard.tp = r->mesh.tp;
    shard.tp_rank = r->mesh.tp_rank;
    int P = r->mesh.pp, st = r->mesh.pp_rank;
    stage_layers(a, cfg.layers, P, st, &shard);
    shard.split_backward = pp_schedule_splits(a->schedule);
    shard.has_embed = st == 0;
    shard.has_head = st == P - 1;
    gpt_build(&r->model, &cfg, &r->dev, &shard);
    r->model.recompute = a->recompute;
    tp_attach(&r->model, &r->tpg, &r->mesh.tp_group, &r->dev, a->sp);
    if (a->init) {
        if (ckpt_load(a->init, &r->model, err, sizeof err) != 0) die_usage("%s", err);
    } else if (!a->resume) {
        gpt_init_random(&r->model, a->seed);
    }
    if (dp_build(&r->dp, &a->dpc, &r->model, &r->comm, &r->mesh, &a->opt, err, sizeof err) != 0)
        die_usage("%s", err);
    double t_load = now_ms();
    if (a->resume && checkpoint_load(&r->ck, &r->dp.z, &r->comm.world, err, sizeof err) != 0) {
        fprintf(stderr, "train: %s\n", err);
        exit(EXIT_USAGE);
    }
    r->load_ms = now_ms() - t_load;
    r->trace = trace_open(a->trace, r->comm.rank, r->comm.world_size);
    if (pp_build(&r->pp, &r->model, &r->mesh.pp_group, &r->dev, a->schedule, a->micro_batches,
                 a->batch, a->seq, r->trace, err, sizeof err) != 0)
        die_usage("%s", err);
    r->inputs = safe_malloc((size_t)a->batch * a->seq * sizeof(int), "a micro-batch's inputs");
    r->targets = safe_malloc((size_t)a->batch * a->seq * sizeof(int), "a micro-batch's targets");
}

static void run_free(Run *r) {
    free(r->inputs);
    free(r->targets);
    pp_free(&r->pp);
    dp_free(&r->dp);
    gpt_free(&r->model);
    comm_mesh_free(&r->mesh);
    comm_free(&r->comm);
    data_free(&r->train);
    data_free(&r->val);
    data_tokenizer_free(&r->tok);
    checkpoint_free(&r->ck);
    dev_close(&r->dev);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Writes buf (this rank's part of the model's layout on its device: the
 * parameters, or the gradients) as one llm.c model file on rank 0: each rank
 * puts its elements of the whole model in llm.c's order, the tp ranks'
 * slices and the pp stages' layers are summed into one model (they are
 * disjoint; the tied wte comes from the first stage), rank 0 writes. */
static int write_gathered(Run *r, const float *buf, const char *path) {
    char err[512];
    GPT *m = &r->model;
    size_t total = gpt_total_params(&m->cfg);
    float *host = safe_malloc(m->num_params * sizeof(float), "the parameters");
    float *llmc = safe_malloc(total * sizeof(float), "the model in llm.c's order");
    memset(llmc, 0, total * sizeof(float));
    dev_to_host(m->dev, host, buf, m->num_params * sizeof(float));
    gpt_llmc_copy(m, host, llmc, 1);
    comm_all_reduce(&r->mesh.tp_group, NULL, llmc, total, COMM_F32, COMM_SUM);
    comm_all_reduce(&r->mesh.pp_group, NULL, llmc, total, COMM_F32, COMM_SUM);
    int rc = 0;
    if (r->comm.rank == 0) {
        rc = ckpt_write(path, &m->cfg, llmc, err, sizeof err);
        if (rc) fprintf(stderr, "train: %s\n", err);
        else printf("saved %s\n", path);
    }
    free(host);
    free(llmc);
    return rc;
}

/* --show-schedule: the text figure (pp_show), then the same timeline as SVG. */
static void show_schedule(const Args *a, int P) {
    const char *path = a->schedule_svg ? a->schedule_svg : "schedule.svg";
    char err[512], formula[96];
    PPTimeline tl;
    int V = a->virtual_chunks ? a->virtual_chunks : 1;
    pp_show(stdout, a->schedule, P, a->micro_batches, V);
    if (pp_bubble_text(a->schedule, P, a->micro_batches, V, formula, sizeof formula) != 0 ||
        pp_timeline(a->schedule, P, a->micro_batches, V, &tl) != 0) return;
    if (plot_schedule_svg(path, &tl, pp_schedule_name(a->schedule), formula, err, sizeof err) != 0)
        fprintf(stderr, "train: %s\n", err);
    else printf("schedule drawn in %s\n", path);
    pp_timeline_free(&tl);
}

/* --save: the parameters (ZeRO-3 gathers them first). */
static int save(Run *r) {
    float *full = dp_full_params(&r->dp);
    int rc = write_gathered(r, full, r->a.save);
    dp_full_params_free(&r->dp, full);
    return rc;
}

/* What pp_run asks of a step: micro-batch m's tokens, and DP's notice
 * before each backward. */
typedef struct StepCtx {
    Run *r;
    int step;
} StepCtx;

static void step_batch(void *ctx, int micro, GPTActs *a) {
    StepCtx *c = ctx;
    Run *r = c->r;
    int B = r->a.batch, T = r->a.seq, M = r->a.micro_batches, G = B * M * r->mesh.dp;
    char err[512];
    if (data_batch(&r->train, c->step, G, (r->mesh.dp_rank * M + micro) * B, B, r->inputs, r->targets, err,
                   sizeof err) != 0)
        die_usage("%s", err);
    gpt_set_batch(&r->model, a, r->inputs, r->targets, B, T);
}

static void step_before_backward(void *ctx, int micro, int last) {
    StepCtx *c = ctx;
    dp_micro_batch(&c->r->dp, last);
}

/* The last stage's loss, averaged over the dp group and handed to every
 * stage (rank 0, which prints, is on the first). */
static double share_loss(Run *r, double loss) {
    float l = (float)loss;
    if (r->mesh.dp > 1) comm_all_reduce(&r->mesh.dp_group, NULL, &l, 1, COMM_F32, COMM_AVG);
    if (r->mesh.pp > 1) comm_broadcast(&r->mesh.pp_group, NULL, &l, 1, COMM_F32, r->mesh.pp - 1);
    return r->mesh.dp == 1 && r->mesh.pp == 1 ? loss : l;
}

/* One optimizer step over the global batch of `step`: this dp rank takes
 * sequences [dp_rank*B*M, (dp_rank+1)*B*M) of the G = B*M*D, through the
 * pipeline's schedule. Returns the global mean loss and leaves the pre-clip
 * gradient norm and the lr used. */
static double train_step(Run *r, int step, double *norm, float *lr) {
    Args *a = &r->a;
    GPT *m = &r->model;
    int B = a->batch, T = a->seq, M = a->micro_batches, D = r->mesh.dp;
    float dloss = 1.0f / ((float)B * T * M * D);  /* the sum over ranks is the global mean */
    StepCtx ctx = {r, step};
    PPCallbacks cb = {&ctx, step_batch, step_before_backward};
    dp_step_begin(&r->dp);
    double loss = pp_run(&r->pp, dloss, &cb) / M;
    if (step == 0 && a->dump_grads) {
        comm_wait(&r->comm, &r->dev);  /* the bucket all-reduces are done */
        write_gathered(r, m->grads, a->dump_grads);
    }
    *lr = optim_lr(&a->opt, step);
    trace_begin(r->trace, "optimizer", "optimizer");
    *norm = dp_step_end(&r->dp, *lr);
    gpt_params_changed(m);  /* the bf16 copy is remade at each unit's next use */
    trace_end(r->trace);
    return share_loss(r, loss);
}

/* Mean loss over the first val_batches batches of the validation file. */
static double evaluate(Run *r) {
    Args *a = &r->a;
    int B = a->batch, T = a->seq;
    GPTActs *acts = r->pp.acts[0];
    double loss = 0.0;
    for (int i = 0; i < a->val_batches; i++) {
        char err[512];
        if (data_batch(&r->val, i, B, 0, B, r->inputs, r->targets, err, sizeof err) != 0) die_usage("%s", err);
        gpt_set_batch(&r->model, acts, r->inputs, r->targets, B, T);
        loss += pp_forward(&r->pp, acts, B, T, 1) / a->val_batches;
    }
    return share_loss(r, loss);
}

static uint32_t rng_u32(uint64_t *s) {
    *s ^= *s >> 12; *s ^= *s << 25; *s ^= *s >> 27;
    return (uint32_t)((*s * 0x2545F4914F6CDD1DULL) >> 32);
}

/* Generates n tokens with a sliding window of T, starting from one token
 * (a newline for byte data, GPT-2's <|endoftext|> for token data), and
 * prints them: as text for bytes, as ids otherwise. The window always runs
 * T positions (padded after the context, which causal attention never
 * lets reach the position sampled), so every layout splits it the same way;
 * with tp each rank holds a slice of the logits and they are gathered. */
static void sample(Run *r, int n) {
    GPT *m = &r->model;
    int say = r->comm.rank == 0;  /* every rank samples (ZeRO-3 gathers are collective) */
    int T = r->a.seq, V = m->cfg.vocab, Vp = m->cfg.padded_vocab, Vl = Vp / m->tp;
    int *ctx = safe_malloc((size_t)(n + 1) * sizeof(int), "the sample");
    int *window = safe_malloc((size_t)T * sizeof(int), "the sample's window");
    memset(window, 0, (size_t)T * sizeof(int));
    float *logits = safe_malloc((size_t)Vp * sizeof(float), "a row of logits");  /* [Vp] the whole row */
    uint16_t *row16 = safe_malloc((size_t)Vl * sizeof(uint16_t), "a bf16 row");  /* [Vl] a bf16 row, as stored */
    uint64_t rng = r->a.seed * 2654435761ULL + 1;
    ctx[0] = r->train.is_bytes ? '\n' : (V > 50256 ? 50256 : 0);
    if (say) printf("sample (%d tokens, temperature %.2f):\n", n, r->a.temperature);
    if (say && r->train.is_bytes) putchar(ctx[0]);
    for (int i = 1; i <= n; i++) {
        int start = i > T ? i - T : 0, len = i - start;
        memcpy(window, ctx + start, (size_t)len * sizeof(int));
        GPTActs *acts = r->pp.acts[0];
        gpt_set_batch(m, acts, window, NULL, 1, T);
        pp_forward(&r->pp, acts, 1, T, 0);
        if (m->has_head) {  /* the last stage holds the logits; the others wait for the token */
            float *mine = logits + (size_t)m->tp_rank * Vl;
            const char *row = (const char *)acts->logits + (size_t)(len - 1) * Vl * m->esz;
            if (m->dev->dtype == DT_BF16) {
                dev_to_host(m->dev, row16, row, (size_t)Vl * 2);
                for (int v = 0; v < Vl; v++) mine[v] = bf16_to_f32(row16[v]);
            } else {
                dev_to_host(m->dev, mine, row, (size_t)Vl * 4);
            }
            if (m->tp > 1) comm_all_gather(&r->mesh.tp_group, NULL, logits, mine, Vp, COMM_F32);
        }
        int next = V - 1;
        if (m->has_head) {  /* the other stages take the last stage's choice */
            float maxv = -INFINITY;
            for (int v = 0; v < V; v++) if (logits[v] > maxv) maxv = logits[v];
            double sum = 0.0;
            for (int v = 0; v < V; v++) sum += exp((logits[v] - maxv) / r->a.temperature);
            double u = (rng_u32(&rng) / 4294967296.0) * sum, acc = 0.0;
            for (int v = 0; v < V; v++) {
                acc += exp((logits[v] - maxv) / r->a.temperature);
                if (acc > u) { next = v; break; }
            }
        }
        if (r->mesh.pp > 1) comm_broadcast(&r->mesh.pp_group, NULL, &next, 1, COMM_I32, r->mesh.pp - 1);
        ctx[i] = next;
        const char *text = data_token_text(&r->tok, next);
        if (say && r->train.is_bytes) putchar(next);
        else if (say && text) fputs(text, stdout);
        else if (say) printf("%d ", next);
    }
    if (say) printf("\n");
    fflush(stdout);
    free(ctx);
    free(window);
    free(logits);
    free(row16);
}

/* Dense bf16 peak of one device in TFLOP/s: --peak-tflops, else known by
 * the GPU's name (SXM figures), else 0 (no MFU printed). */
static double device_peak(Run *r) {
    if (r->a.peak_tflops > 0) return r->a.peak_tflops;
    char name[256];
    dev_name(&r->dev, name, sizeof name);
    if (strstr(name, "H100") || strstr(name, "H200")) return 989.4;
    if (strstr(name, "A100")) return 312.0;
    return 0.0;
}

/* Every rank's memory, measured and from the ZeRO formula (DESIGN.md). */
static void print_memory(Run *r) {
    DPMemory mem;
    dp_memory(&r->dp, &mem);
    char stash[64] = "";
    if (pp_stash_bytes(&r->pp)) snprintf(stash, sizeof stash, ", of which the B->W stash %.6g MB", pp_stash_bytes(&r->pp) / 1e6);
    printf("memory rank %d: params %.6g MB (formula %.6g), grads %.6g MB (formula %.6g), "
           "optimizer %.6g MB%s (formula %.6g), activations %.6g MB (%d sets%s)\n",
           r->comm.rank, mem.params / 1e6, mem.f_params / 1e6, mem.grads / 1e6, mem.f_grads / 1e6,
           (mem.optim + mem.optim_host) / 1e6, r->a.dpc.offload ? " on the host" : "",
           mem.f_optim / 1e6, pp_acts_bytes(&r->pp) / 1e6, r->pp.nsets, stash);
}

/* After the run: the buffers that come and go (ZeRO-2/3 units, ps staging). */
static void print_transient(Run *r) {
    DPMemory mem;
    dp_memory(&r->dp, &mem);
    if (mem.transient_peak > 0)
        printf("memory rank %d: transient gathers and reductions peaked at %.6g MB\n",
               r->comm.rank, mem.transient_peak / 1e6);
}

static void print_header(Run *r) {
    Args *a = &r->a;
    GPT *m = &r->model;
    int tokens = a->batch * a->seq * a->micro_batches * r->mesh.dp;
    static const char *modes[] = {"ddp", "ps"};
    printf("model: %d layers, %d heads, dim %d, vocab %d (padded %d), max-seq %d | %zu parameters\n",
           m->cfg.layers, m->cfg.heads, m->cfg.dim, m->cfg.vocab, m->cfg.padded_vocab,
           m->cfg.max_seq, m->num_params);
    printf("train: %s, %zu tokens | batch %d x seq %d x %d micro-batches x %d dp = %d tokens a step\n",
           a->data, r->train.n_tokens, a->batch, a->seq, a->micro_batches, r->mesh.dp, tokens);
    printf("ranks: %d (%s) | dp %d x tp %d%s x pp %d (%s) | %s, zero %d%s | %s",
           r->comm.world_size, r->launch.source, r->mesh.dp, r->mesh.tp,
           r->model.tpc.sp ? " (sp)" : "", r->mesh.pp, pp_schedule_name(a->schedule),
           modes[a->dpc.mode], a->dpc.zero, a->dpc.offload ? ", offload" : "",
           r->dev.kind == DEV_CUDA ? "cuda" : "cpu");
    printf(", %s", dt_name(r->dev.dtype));
#ifdef _OPENMP
    if (r->dev.kind == DEV_CPU) printf(", %d threads a rank", omp_get_max_threads());
#endif
    printf("\n");
    char how[160], name[256];
    comm_describe(&r->comm, how, sizeof how);
    dev_name(&r->dev, name, sizeof name);
    if (r->dev.kind == DEV_CUDA)
        printf("comm: %s | rank 0: GPU %d of %d visible, %s\n", how, r->dev.gpu, r->gpus, name);
    else
        printf("comm: %s\n", how);
}

/* Writes checkpoint_dir/step-<step> (collective). Returns 0 or -1. */
static int save_checkpoint(Run *r, long step, char *path, size_t pathlen) {
    Args *a = &r->a;
    char err[512];
    CheckpointMeta meta;
    memset(&meta, 0, sizeof meta);
    CheckpointLayout *l = &meta.layout;
    meta.cfg = r->cfg;
    meta.step = step;
    meta.adam_t = r->dp.z.adam.t;
    meta.seed = a->seed;
    meta.shuffle = a->shuffle;
    meta.steps = a->steps;
    l->ranks = r->comm.world_size;
    l->dp = r->mesh.dp; l->tp = r->mesh.tp; l->pp = r->mesh.pp;
    for (int i = 0; i < l->pp; i++) {
        GPTShard sh;
        stage_layers(a, r->cfg.layers, l->pp, i, &sh);
        l->stage_layers[i] = sh.nlayers;
    }
    l->zero = a->dpc.zero; l->offload = a->dpc.offload; l->sp = a->sp;
    snprintf(l->dp_mode, sizeof l->dp_mode, "%s", a->dpc.mode == DP_PS ? "ps" : "ddp");
    snprintf(l->dtype, sizeof l->dtype, "%s", dt_name(r->dtype));
    snprintf(l->schedule, sizeof l->schedule, "%s", pp_schedule_name(a->schedule));
    l->batch = a->batch; l->seq = a->seq; l->micro_batches = a->micro_batches;
    double t0 = now_ms();
    if (checkpoint_save(a->checkpoint_dir, &meta, a->keep, &r->dp.z, &r->comm.world, path, pathlen, err,
                        sizeof err) != 0) {
        fprintf(stderr, "train: rank %d: %s\n", r->comm.rank, err);
        return -1;
    }
    if (r->comm.rank == 0) printf("checkpoint %s (%.0f ms)\n", path, now_ms() - t0);
    return 0;
}

/* What rank 0 keeps of the run for the step line's elapsed time and ETA,
 * the closing summary and --plot. */
typedef struct RunLog {
    Run *r;
    double t0;                /* ms, when the first step of this run started */
    int s0, last_step;        /* steps done before this run (--resume), the last one printed */
    double last_loss, val_loss;  /* NAN until known */
    Plot plot;                /* when --plot */
    double plot_written;      /* ms of the last write */
} RunLog;

/* A duration as 42.1s, 3m05s or 2h07m. */
static void fmt_duration(double secs, char *buf, size_t len) {
    if (!(secs >= 0)) secs = 0;
    if (secs < 60) snprintf(buf, len, "%.1fs", secs);
    else if (secs < 3600) snprintf(buf, len, "%dm%02ds", (int)secs / 60, (int)secs % 60);
    else snprintf(buf, len, "%dh%02dm", (int)(secs / 3600), (int)secs % 3600 / 60);
}

static void runlog_init(RunLog *l, Run *r, int s0) {
    memset(l, 0, sizeof *l);
    l->r = r;
    l->t0 = now_ms();
    l->s0 = l->last_step = s0;
    l->last_loss = l->val_loss = NAN;
    if (r->comm.rank == 0 && r->a.plot) {
        char title[256];
        snprintf(title, sizeof title, "%d layers, dim %d | dp %d x tp %d x pp %d, zero %d | %s",
                 r->cfg.layers, r->cfg.dim, r->mesh.dp, r->mesh.tp, r->mesh.pp, r->a.dpc.zero,
                 r->dev.kind == DEV_CUDA ? "cuda" : "cpu");
        plot_init(&l->plot, r->a.plot, title,  r->a.steps,
                  (long long)r->a.batch * r->a.seq * r->a.micro_batches * r->mesh.dp);
    }
}

/* Rewrites the plot (atomically); a failure is said once a write and the run goes on. */
static void runlog_plot(RunLog *l) {
    char err[512];
    if (!l->plot.path) return;
    if (plot_write(&l->plot, err, sizeof err) != 0) fprintf(stderr, "train: %s\n", err);
    l->plot_written = now_ms();
}

/* Rank 0, after a step's line: appends " | elapsed E | eta T" and records the step. */
static void runlog_step(RunLog *l, int step, double loss, float lr) {
    double secs = (now_ms() - l->t0) / 1e3;
    int done = step - l->s0, left = l->r->a.steps - step;
    char e[32], eta[32];
    fmt_duration(secs, e, sizeof e);
    fmt_duration(done > 0 ? secs / done * left : 0, eta, sizeof eta);
    printf(" | elapsed %s | eta %s", e, eta);
    l->last_step = step;
    l->last_loss = loss;
    if (!l->plot.path) return;
    plot_train(&l->plot, step, loss, lr);
    /* every 10 steps, and at least every 2 s of slow steps */
    if (step % 10 == 0 || now_ms() - l->plot_written > 2000) runlog_plot(l);
}

static void runlog_val(RunLog *l, int step, double loss) {
    l->val_loss = loss;
    if (!l->plot.path) return;
    plot_val(&l->plot, step, loss);
    runlog_plot(l);
}

/* Rank 0, at the end: what the run did, in three lines. */
static void runlog_summary(RunLog *l, const char *ckpt, double peak, double flops_per_token) {
    Args *a = &l->r->a;
    int steps = l->last_step - l->s0;
    long long tokens = (long long)steps * a->batch * a->seq * a->micro_batches * l->r->mesh.dp;
    double secs = (now_ms() - l->t0) / 1e3, tok_s = secs > 0 ? tokens / secs : 0;
    char wall[32];
    fmt_duration(secs, wall, sizeof wall);
    if (l->plot.path) runlog_plot(l);
    printf("summary: %d steps%s, %lld tokens in %s, mean %.0f tok/s", steps,
           l->s0 ? " (after a resume)" : "", tokens, wall, tok_s);
    if (peak > 0) printf(", mfu %.1f%%", 100.0 * tok_s * flops_per_token / (peak * l->r->comm.world_size));
    printf("\nsummary: final train loss %.4f", l->last_loss);
    if (!isnan(l->val_loss)) printf(", val loss %.4f", l->val_loss);
    printf("\nsummary: checkpoint %s | plot %s | model %s\n", ckpt ? ckpt : "none",
           l->plot.path ? l->plot.path : "none", a->save ? a->save : "none");
}

static void runlog_free(RunLog *l) {
    if (l->plot.path) plot_free(&l->plot);
}

/* Whether a signal asked to stop, as rank 0 saw it: every rank stops after the same step. */
static int stop_agreed(Run *r) {
    if (!r->a.checkpoint_dir) return 0;
    int32_t sig = checkpoint_stop_requested();
    if (r->comm.world_size > 1) comm_broadcast(&r->comm.world, NULL, &sig, 1, COMM_I32, 0);
    return sig;
}

int main(int argc, char **argv) {
    Run r;
    char err[512];
    memset(&r, 0, sizeof r);
    for (int i = 1; i < argc; i++)   /* the planner runs no model: plan.c */
        if (!strcmp(argv[i], "--plan")) return plan_main(argc, argv);
    parse_args(&r.a, argc, argv);
    run_check(&r);
    if (r.a.plan_layout) return plan_this_layout(&r);
    r.launch.graceful_stop = r.a.checkpoint_dir != NULL;
    if (comm_launch_start(&r.launch, err, sizeof err) != 0) {
        fprintf(stderr, "train: %s\n", err);
        return 1;
    }
    run_build(&r);
    Args *a = &r.a;
    int rank0 = r.comm.rank == 0;
    int tokens_per_step = a->batch * a->seq * a->micro_batches * r.mesh.dp;
    /* MFU: 6N + 6LCT flops a token (PaLM's count: the matmuls, forward and
     * backward, plus attention's scores and values) over the devices' peak */
    double flops_per_token = 6.0 * gpt_total_params(&r.cfg) +
                             6.0 * r.cfg.layers * r.cfg.dim * (double)a->seq;
    double peak = device_peak(&r) * 1e12;
    if (rank0) print_header(&r);
    if (rank0 && a->show_schedule) show_schedule(a, r.mesh.pp);
    print_memory(&r);
    int s0 = a->resume ? (int)r.ck.meta.step : 0, stopped = 0;
    char ckpath[4608];
    if (a->checkpoint_dir) checkpoint_signals_install(r.launch.kind != COMM_LAUNCH_FORK);
    if (rank0 && a->resume) {
        const CheckpointLayout *l = &r.ck.meta.layout;
        printf("resumed from %s at step %d (written under dp %d x tp %d x pp %d, zero %d%s, %s; loaded in %.0f ms)\n",
               r.ck.dir, s0, l->dp, l->tp, l->pp, l->zero, l->offload ? ", offload" : "", l->dtype, r.load_ms);
    }
    fflush(stdout);
    RunLog log;
    runlog_init(&log, &r, s0);
    for (int s = s0; s < a->steps; s++) {
        double t0 = now_ms(), norm;
        float lr;
        double loss = train_step(&r, s, &norm, &lr);
        dev_sync(&r.dev);
        double ms = now_ms() - t0;
        double tok_s = tokens_per_step / (ms / 1e3);
        if (rank0) {
            printf("step %d/%d | loss %#.7g | norm %.4f | lr %.3e | %.1f ms | %.0f tok/s", s + 1,
                   a->steps, loss, norm, lr, ms, tok_s);
            if (peak > 0) printf(" | mfu %.1f%%", 100.0 * tok_s * flops_per_token / (peak * r.comm.world_size));
            runlog_step(&log, s + 1, loss, lr);
            printf("\n");
        }
        fflush(stdout);
        if (a->val && a->val_every && (s + 1) % a->val_every == 0 && s + 1 < a->steps) {
            double v = evaluate(&r);
            if (rank0) printf("val loss %#.7g\n", v);
            if (rank0) runlog_val(&log, s + 1, v);
        }
        int stop = stop_agreed(&r);
        int due = a->checkpoint_every && (s + 1) % a->checkpoint_every == 0 && s + 1 < a->steps;
        if (a->checkpoint_dir && (due || stop) && save_checkpoint(&r, s + 1, ckpath, sizeof ckpath) != 0)
            exit(1);
        if (stop) {
            if (rank0) printf("stopped by signal %d after step %d: checkpoint %s; continue with --resume\n",
                              stop, s + 1, ckpath);
            stopped = 1;
            break;
        }
    }
    if (stopped) {
        runlog_free(&log);
        fflush(stdout);
        run_free(&r);
        return 0;
    }
    if (a->checkpoint_dir && s0 < a->steps && save_checkpoint(&r, a->steps, ckpath, sizeof ckpath) != 0)
        exit(1);
    if (a->val) {
        double v = evaluate(&r);
        if (rank0) printf("val loss %#.7g\n", v);
        if (rank0) runlog_val(&log, a->steps, v);
    }
    if (a->sample) sample(&r, a->sample);
    int rc = a->save ? save(&r) : 0;
    if (rank0) runlog_summary(&log, a->checkpoint_dir && s0 < a->steps ? ckpath : NULL, peak, flops_per_token);
    runlog_free(&log);
    print_transient(&r);
    if (a->comm_stats) {
        printf("comm stats, rank %d (bus bytes, nccl-tests convention):\n", r.comm.rank);
        comm_stats_print(&r.comm, stdout);
    }
    fflush(stdout);
    if (r.trace) {
        trace_close(r.trace);
        comm_barrier(&r.comm.world);
        if (rank0 && trace_merge(a->trace, r.comm.world_size) >= 0) printf("trace: %s\n", a->trace);
    }
    run_free(&r);
    return rc ? 1 : 0;
}
