/* args.c: the command line of `train`: one table of flags, the parser and `--help`.
 *
 * The table below is the only list of train's flags. Each row gives the
 * flag, the placeholder of its value (NULL for a switch) and its help; a
 * row without a name is a heading of --help. args_parse builds
 * getopt_long's options from it, args_usage prints it, and docs/cli.md
 * embeds that print (test/test_docs.sh checks the two are equal, and that
 * every flag the docs name exists). The planner's flags (./train --plan
 * ...) are plan.c's and documented beside these in docs/cli.md.
 *
 * Checks here are the ones the flags make among themselves ("--resume needs
 * --checkpoint-dir"); whatever needs a file, the model or the ranks is
 * setup.c's. Every problem is one line in err; nothing here exits but
 * args_parse_or_exit.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "args.h"
#include "safe.h"
#include "version.h"

enum {
    F_DATA = 256, F_VAL, F_INIT, F_SAVE, F_LAYERS, F_HEADS, F_DIM, F_MAXSEQ, F_VOCAB, F_BATCH,
    F_SEQ, F_MICRO, F_STEPS, F_LR, F_LRMIN, F_WARMUP, F_DECAY, F_BETA1, F_BETA2, F_EPS, F_WD,
    F_CLIP, F_SEED, F_SHUFFLE, F_DEVICE, F_GPU, F_THREADS, F_VALEVERY, F_VALBATCHES, F_SAMPLE,
    F_TEMP, F_HELP, F_RANKS, F_DP, F_TP, F_PP, F_DPMODE, F_ZERO, F_OFFLOAD, F_BUCKET, F_COMMSTATS,
    F_SP, F_DUMPGRADS, F_SCHEDULE, F_VIRTUAL, F_STAGELAYERS, F_RECOMPUTE, F_SHOWSCHED, F_TRACE, F_PIN,
    F_PLANLAYOUT, F_LAYOUT, F_GLOBALBATCH, F_ALLSCHED, F_PLAN,
    F_TOKENIZER, F_DTYPE, F_PEAK, F_ATOMICDQ, F_DETERMINISTIC, F_VERSION, F_NOSELFTEST, F_BACKEND, F_COMMTIMEOUT,
    F_CKPTDIR, F_CKPTEVERY, F_KEEP, F_RESUME, F_PLOT, F_SCHEDSVG, F_TIMELIMIT, F_CKPTASYNC, F_LOG, F_CHECKDATA, F_MODEL, F_HELLASWAG,
};

/* One row of the command line: --name VALUE, what it does. */
typedef struct ArgsFlag {
    const char *name;     /* without the dashes; NULL: a heading of --help */
    const char *value;    /* the value's placeholder; NULL: a switch */
    int id;
    const char *help;     /* lines after the first are indented under it */
} ArgsFlag;

static const ArgsFlag flags[] = {
    {NULL, NULL, 0, "data and files:"},
    {"data", "SPEC", F_DATA, "training tokens: a file, a quoted glob or a comma list of llm.c token\n"
                             "files (shards, in name order), or any file read as bytes"},
    {"val", "SPEC", F_VAL, "validation tokens (same forms)"},
    {"check-data", NULL, F_CHECKDATA, "read every token of --data and --val, check it against the\n"
                                      "vocabulary, and exit (files above 64M tokens are else checked\n"
                                      "as they are read)"},
    {"init", "FILE", F_INIT, "start from an llm.c model file (float32)"},
    {"save", "FILE", F_SAVE, "write an llm.c model file at the end"},
    {"eval-hellaswag", "FILE", F_HELLASWAG, "llm.c's HellaSwag file (hellaswag_val.bin), scored at --val-every\n"
                                            "and at the end: one line, hellaswag: C/N correct (acc_norm P%)"},
    {"tokenizer", "FILE", F_TOKENIZER, "llm.c's gpt2_tokenizer.bin: print samples of token data as text"},
    {"plot", "FILE.svg", F_PLOT, "train and val loss and the learning rate against steps, as SVG,\n"
                                 "rewritten every few steps (open it mid-run)"},
    {"log", "FILE", F_LOG, "the run as JSON lines: a record a step and an evaluation, appended\n"
                           "across restarts (cut back to the resumed step); --plot draws it all"},
    {"version", NULL, F_VERSION, "the build: commit, CUDA runtime and driver, GPU architectures, NCCL"},
    {"help", NULL, F_HELP, "this table"},
    {NULL, NULL, 0, "model, when there is no --init:"},
    {"model", "NAME", F_MODEL, "gpt2, gpt2-medium, gpt2-large, gpt2-xl (or llm.c's d12, d24, d36,\n"
                               "d48): layers, heads, width, 1024 positions, 50257 tokens"},
    {"layers", "L", F_LAYERS, "transformer blocks (4)"},
    {"heads", "H", F_HEADS, "attention heads (4)"},
    {"dim", "C", F_DIM, "width (128)"},
    {"max-seq", "S", F_MAXSEQ, "positions (256, or --seq if longer)"},
    {"vocab", "V", F_VOCAB, "vocabulary (the data's: 256 for bytes, 50257 for token files)"},
    {NULL, NULL, 0, "batch and schedule:"},
    {"batch", "B", F_BATCH, "sequences a micro-batch on each dp rank (4)"},
    {"seq", "T", F_SEQ, "tokens a sequence (64)"},
    {"micro-batches", "M", F_MICRO, "micro-batches a step: gradient accumulation, pipeline depth (1)"},
    {"steps", "N", F_STEPS, "optimizer steps (100)"},
    {"lr", "F", F_LR, "peak learning rate (3e-4)"},
    {"lr-min", "F", F_LRMIN, "learning rate at the end of the decay (0)"},
    {"warmup", "N", F_WARMUP, "steps of linear warm-up (0)"},
    {"lr-decay", "cosine|none", F_DECAY, "decay after the warm-up (cosine)"},
    {"beta1", "F", F_BETA1, "AdamW's first moment (0.9)"},
    {"beta2", "F", F_BETA2, "AdamW's second moment (0.95)"},
    {"eps", "F", F_EPS, "AdamW's epsilon (1e-8)"},
    {"wd", "F", F_WD, "weight decay of the matrices (0.1)"},
    {"clip", "F", F_CLIP, "clip the global gradient norm to F (1.0; 0 = off)"},
    {"seed", "N", F_SEED, "initialisation, data order and sampling (1337)"},
    {"shuffle", NULL, F_SHUFFLE, "a seeded permutation of the sequences (else in file order)"},
    {"val-every", "N", F_VALEVERY, "validation loss (and HellaSwag) every N steps (0: only at the end)"},
    {"val-batches", "N", F_VALBATCHES, "batches of --val a validation takes (8)"},
    {NULL, NULL, 0, "device:"},
    {"device", "cpu|cuda", F_DEVICE, "where to compute (cuda when a GPU is visible)"},
    {"gpu", "N", F_GPU, "the GPU of a single-process run (0)"},
    {"threads", "N", F_THREADS, "CPU threads a rank (OMP_NUM_THREADS, else the CPUs it may\nrun on / the ranks on the host: taskset and cpusets count)"},
    {"dtype", "bf16|fp32", F_DTYPE, "activations and compute copy of the parameters (bf16 on cuda,\n"
                                    "fp32 on the cpu; bf16 on the cpu emulates the rounding, slowly)"},
    {"peak-tflops", "F", F_PEAK, "dense bf16 peak of one device for the step line's MFU\n"
                                 "(known for H100/H200/A100; otherwise MFU is not printed)"},
    {"atomic-dq", NULL, F_ATOMICDQ, "attention's backward on a GPU sums dq with atomics, as flash\n"
                                    "attention does: runs may then differ in their last bits (on an\n"
                                    "H200 the slower). Without it every GPU run gives the same bits"},
    {"deterministic", NULL, F_DETERMINISTIC, "the default, kept for older commands: undoes --atomic-dq"},
    {"no-self-test", NULL, F_NOSELFTEST, "skip the check of every GPU kernel against the CPU before step 1"},
    {"backend", "nccl|shm|auto", F_BACKEND, "how ranks exchange: NCCL, or host shared memory (auto: NCCL\n"
                                            "when every rank has a GPU of its own and NCCL is built in)"},
    {"comm-timeout", "S", F_COMMTIMEOUT, "stop a rank whose NCCL operation takes longer than S seconds (300)"},
    {NULL, NULL, 0, "generation:"},
    {"sample", "N", F_SAMPLE, "generate N tokens at the end"},
    {"temperature", "F", F_TEMP, "sampling temperature (1.0)"},
    {NULL, NULL, 0, "ranks and layout:"},
    {"ranks", "N", F_RANKS, "fork N ranks on this host (else one, or srun/mpirun/torchrun's)"},
    {"dp", "D", F_DP, "data-parallel ranks; D x T x P = ranks, one left out is inferred"},
    {"tp", "T", F_TP, "tensor-parallel ranks (Megatron's split of heads and columns)"},
    {"pp", "P", F_PP, "pipeline stages"},
    {"sp", NULL, F_SP, "sequence parallelism in the tp group (Megatron)"},
    {"dp-mode", "ddp|ps", F_DPMODE, "all-reduce (DDP), or the parameter server on rank 0 (ddp)"},
    {"zero", "0|1|2|3", F_ZERO, "shard optimizer state, gradients, parameters over dp (0)"},
    {"offload", NULL, F_OFFLOAD, "optimizer state and AdamW on the host (ZeRO-Offload)"},
    {"bucket-mb", "F", F_BUCKET, "gradient bucket size for the overlapped reduction (25)"},
    {"comm-stats", NULL, F_COMMSTATS, "print each rank's bytes moved, by operation and group"},
    {"dump-grads", "FILE", F_DUMPGRADS, "write step 1's reduced gradients as an llm.c model file (tests)"},
    {"layout", "auto", F_LAYOUT, "the planner chooses --dp --tp --pp --zero --micro-batches --batch\n"
                                 "--schedule --recompute --sp for --global-batch N sequences (else\n"
                                 "batch x micro-batches x ranks) and prints its choice"},
    {"global-batch", "N", F_GLOBALBATCH, "sequences a step for --layout auto"},
    {"all-schedules", NULL, F_ALLSCHED, "--layout auto may choose interleaved and zb-h1/zb-h2 too"},
    {"plan-layout", NULL, F_PLANLAYOUT, "print the planner's memory and --comm-stats rows for this layout\n"
                                        "and exit (no data needed)"},
    {"plan", NULL, F_PLAN, "plan for a model and cluster without training: its own flags\n"
                           "(docs/cli.md, \"The planner\")"},
    {NULL, NULL, 0, "pipeline:"},
    {"schedule", "NAME", F_SCHEDULE, "naive|gpipe|1f1b|interleaved|zb-h1|zb-h2: the order of the\n"
                                     "micro-batches' forwards and backwards (1f1b); interleaved:\n"
                                     "Megatron's, V chunks a stage; zb-h1, zb-h2: zero bubble, each\n"
                                     "backward split into B (input gradient) and a later W (weight\n"
                                     "gradients; zb-h2 holds more to fill the bubble)"},
    {"virtual", "V", F_VIRTUAL, "interleaved: V chunks of layers a stage, stage s holding the\n"
                                "model's chunks s, s+P, ... (1; the layers divide into P x V)"},
    {"stage-layers", "3,3,4,2", F_STAGELAYERS, "layers of each stage (as even as possible); with --virtual V,\n"
                                               "P x V ranges: the model's chunks in order"},
    {"recompute", NULL, F_RECOMPUTE, "keep each layer's input only; recompute the rest in backward"},
    {"show-schedule", NULL, F_SHOWSCHED, "draw the schedule and its bubble, as text and SVG, and exit\n"
                                         "(no data needed)"},
    {"schedule-svg", "FILE", F_SCHEDSVG, "where --show-schedule writes the SVG (schedule.svg); implies it"},
    {"trace", "FILE", F_TRACE, "Chrome/Perfetto trace of every rank's spans, and FILE.svg"},
    {"pin-cores", NULL, F_PIN, "pin each rank to its own cores (benchmarks)"},
    {NULL, NULL, 0, "checkpoints:"},
    {"checkpoint-dir", "DIR", F_CKPTDIR, "sharded checkpoints in DIR/step-N (each rank writes what it owns)"},
    {"checkpoint-every", "N", F_CKPTEVERY, "every N steps (0: only at the end, and on a stop)"},
    {"checkpoint-async", NULL, F_CKPTASYNC, "write checkpoints in the background while training goes on"},
    {"keep", "K", F_KEEP, "complete checkpoints kept (2)"},
    {"resume", NULL, F_RESUME, "continue from DIR/latest if there is a checkpoint, else start\n"
                               "(from --init if given): the same command every time"},
    {"time-limit", "MIN", F_TIMELIMIT, "stop before MIN minutes of wall time, leaving room for the save\n"
                                       "(fractions allowed; at least one step)"},
    {NULL, NULL, 0, "stopping: SIGINT, SIGTERM, SIGUSR1 and --time-limit finish the step, write a\n"
                    "checkpoint and exit 75; the same command continues. 0: done, 1: failure, 2: bad input"},
};
enum { NFLAGS = sizeof flags / sizeof flags[0] };

void args_usage(FILE *f) {
    fprintf(f, "usage: ./train --data FILE [options]\n"
               "       ./train --show-schedule --pp P --micro-batches M [--schedule NAME]\n"
               "       ./train --plan [planner options]\n");
    for (int i = 0; i < NFLAGS; i++) {
        const ArgsFlag *g = &flags[i];
        if (!g->name) { fprintf(f, "%s\n", g->help); continue; }
        char left[64];
        snprintf(left, sizeof left, "--%s%s%s", g->name, g->value ? " " : "", g->value ? g->value : "");
        fprintf(f, "  %-22s ", left);
        if ((int)strlen(left) > 22) fprintf(f, "\n  %-22s ", "");
        for (const char *p = g->help; *p; p++) {
            fputc(*p, f);
            if (*p == '\n') fprintf(f, "  %-22s ", "");
        }
        fputc('\n', f);
    }
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

int args_parse(Args *a, int argc, char **argv, char *err, size_t errlen) {
    struct option opts[NFLAGS + 1];   /* getopt_long's view of the table */
    int n = 0;
    for (int i = 0; i < NFLAGS; i++)
        if (flags[i].name) opts[n++] = (struct option){flags[i].name, flags[i].value ? 1 : 0, 0, flags[i].id};
    opts[n] = (struct option){0, 0, 0, 0};
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
        case F_HELLASWAG: a->eval_hellaswag = optarg; break;
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
        case F_ATOMICDQ: a->atomic_dq = 1; break;
        case F_DETERMINISTIC: a->atomic_dq = 0; break;
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
        case F_LOG: a->log = optarg; break;
        case F_CHECKDATA: a->check_data = 1; break;
        case F_MODEL: a->model_preset = optarg; break;
        case F_PIN: a->pin_cores = 1; break;
        case F_TOKENIZER: a->tokenizer = optarg; break;
        case F_CKPTDIR: a->checkpoint_dir = optarg; break;
        case F_CKPTEVERY: if (parse_int("--checkpoint-every", optarg, 0, 1L << 30, &iv, err, errlen)) return -1;
            a->checkpoint_every = iv; break;
        case F_KEEP: if (parse_int("--keep", optarg, 1, 1000, &iv, err, errlen)) return -1;
            a->keep = iv; break;
        case F_RESUME: a->resume = 1; break;
        case F_CKPTASYNC: a->checkpoint_async = 1; break;
        case F_TIMELIMIT: if (parse_float("--time-limit", optarg, 1e-6, 1e9, &fv, err, errlen)) return -1;
            a->time_limit_min = fv; break;
        case F_PLAN: return arg_fail(err, errlen, "--plan comes first: ./train --plan [planner flags]");
        case ':': return arg_fail(err, errlen, "%s needs a value", flag);
        default: return arg_fail(err, errlen, "unknown flag %s (see --help)", flag);
        }
    }
    if (optind < argc) return arg_fail(err, errlen, "unexpected argument '%s' (see --help)", argv[optind]);
    if (!a->data && !args_explain_only(a)) return arg_fail(err, errlen, "--data FILE is required");
    if (a->dpc.mode == DP_PS && a->dpc.zero)
        return arg_fail(err, errlen, "--dp-mode ps keeps the whole optimizer on rank 0: it takes no --zero");
    if (a->dump_grads && (a->dpc.mode != DP_ALLREDUCE || a->dpc.zero))
        return arg_fail(err, errlen, "--dump-grads needs whole gradients on every rank: --dp-mode ddp --zero 0");
    if ((a->resume || a->checkpoint_every || a->checkpoint_async) && !a->checkpoint_dir)
        return arg_fail(err, errlen, "%s needs --checkpoint-dir DIR",
                        a->resume ? "--resume" : a->checkpoint_every ? "--checkpoint-every" : "--checkpoint-async");
    a->opt.steps = a->steps;
    return ARGS_RUN;
}


int args_explain_only(const Args *a) { return a->show_schedule || a->plan_layout; }

void args_parse_or_exit(Args *a, int argc, char **argv) {
    char err[512];
    int rc = args_parse(a, argc, argv, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "train: %s\n", err);
        exit(2);
    }
    if (rc == ARGS_HELP) { args_usage(stdout); exit(0); }
    if (rc == ARGS_VERSION) { version_print(stdout); exit(0); }
}
