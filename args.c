/* args.c: the command line of `train`: one table of flags, the parser and `--help`.
 *
 * The table below is the only list of train's flags. Each row gives the
 * flag, the placeholder of its value (NULL for a switch), what the value is
 * and which field of Args it sets (its kind: an integer or a number in a
 * range, one of the placeholder's words, a text, a switch), and its help;
 * a row without a name is a heading of --help. args_parse builds
 * getopt_long's options from it and flag_set reads each value by its row
 * (the messages "--batch must be between 1 and 1048576, got 0" are made
 * there, from the row); args_usage prints it, and docs/cli.md embeds that
 * print (test/test_docs.sh checks the two are equal, and that every flag
 * the docs name exists). The planner's flags (./train --plan ...) are
 * plan.c's and documented beside these in docs/cli.md.
 *
 * Checks here are the ones the flags make among themselves ("--resume needs
 * --checkpoint-dir"); the layout's rules are layout.c's, and whatever needs
 * a file, the model or the ranks is setup.c's. Every problem is one line in
 * err; nothing here exits but args_parse_or_exit.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "args.h"
#include "safe.h"
#include "version.h"

/* What a flag's value is, and where it goes (a field of Args, at `at`). */
typedef enum {
    ARG_HEADING,   /* no flag: a heading of --help */
    ARG_TEXT,      /* the value as given (a file, a name) */
    ARG_WORD,      /* one of the words of the placeholder ("cpu|cuda"), kept as given */
    ARG_CHOICE,    /* one of the words of the placeholder, stored as the int of `values` beside it */
    ARG_INT,       /* an integer in [lo, hi] */
    ARG_SEED,      /* a 64-bit integer in [0, 2^63 - 1] */
    ARG_REAL,      /* a finite number in [lo, hi], into a float */
    ARG_REAL64,    /* the same number (read as a float, as it always was) into a double */
    ARG_SWITCH,    /* no value: the int field becomes lo */
    ARG_ACTION,    /* no value: args_parse returns lo (ARGS_HELP, ARGS_VERSION) */
    ARG_OWN,       /* a value only its own function reads (own) */
} ArgKind;

/* One row of the command line: --name VALUE, what it is, what it does. */
typedef struct ArgsFlag {
    const char *name;     /* without the dashes; NULL: a heading of --help */
    const char *value;    /* the value's placeholder; NULL: a switch */
    ArgKind kind;
    size_t at;            /* offsetof(Args, the field it sets) */
    double lo, hi;        /* ARG_INT, ARG_REAL: the range; ARG_SWITCH, ARG_ACTION: the value */
    const int *values;    /* ARG_CHOICE: the int of each word of the placeholder */
    int (*own)(Args *a, const char *v, char *err, size_t errlen);  /* ARG_OWN: reads v, 0 or -1 */
    const char *help;     /* lines after the first are indented under it */
} ArgsFlag;

/* The rows' second halves: kind, field, range, values, own reader. */
#define AT(field) offsetof(Args, field)
#define HEADING ARG_HEADING, 0, 0, 0, NULL, NULL
#define TEXT(field) ARG_TEXT, AT(field), 0, 0, NULL, NULL
#define WORD(field) ARG_WORD, AT(field), 0, 0, NULL, NULL
#define CHOICE(field, values) ARG_CHOICE, AT(field), 0, 0, values, NULL
#define INT(field, lo, hi) ARG_INT, AT(field), lo, hi, NULL, NULL
#define SEED(field) ARG_SEED, AT(field), 0, 0, NULL, NULL
#define REAL(field, lo, hi) ARG_REAL, AT(field), lo, hi, NULL, NULL
#define REAL64(field, lo, hi) ARG_REAL64, AT(field), lo, hi, NULL, NULL
#define SWITCH(field, v) ARG_SWITCH, AT(field), v, 0, NULL, NULL
#define ACTION(rc) ARG_ACTION, 0, rc, 0, NULL, NULL
#define OWN(fn) ARG_OWN, 0, 0, 0, NULL, fn

/* The flags whose value is more than a word or a number. */
static int parse_schedule(Args *a, const char *v, char *err, size_t errlen);
static int parse_stage_layers(Args *a, const char *v, char *err, size_t errlen);
static int parse_schedule_svg(Args *a, const char *v, char *err, size_t errlen);
static int parse_layout_auto(Args *a, const char *v, char *err, size_t errlen);
static int parse_plan(Args *a, const char *v, char *err, size_t errlen);
/* The ints of CHOICE rows' words, in the placeholder's order. */
static const int decay_values[] = {1, 0};                          /* cosine|none */
static const int backend_values[] = {COMM_NCCL, COMM_SHM, -1};     /* nccl|shm|auto */
static const int dp_mode_values[] = {DP_ALLREDUCE, DP_PS};          /* ddp|ps */
static const int recompute_values[] = {RECOMPUTE_NONE, RECOMPUTE_GELU, RECOMPUTE_NORM, RECOMPUTE_FULL};

static const ArgsFlag flags[] = {
    {NULL, NULL, HEADING, "data and files:"},
    {"data", "SPEC", TEXT(data), "training tokens: a file, a quoted glob or a comma list of llm.c token\n"
                                 "files (shards, in name order), or any file read as bytes"},
    {"val", "SPEC", TEXT(val), "validation tokens (same forms)"},
    {"check-data", NULL, SWITCH(check_data, 1), "read every token of --data and --val, check it against the\n"
                                                "vocabulary, and exit (files above 64M tokens are else checked\n"
                                                "as they are read)"},
    {"init", "FILE", TEXT(init), "start from an llm.c model file (float32)"},
    {"save", "FILE", TEXT(save), "write an llm.c model file at the end"},
    {"eval-hellaswag", "FILE", TEXT(eval_hellaswag), "llm.c's HellaSwag file (hellaswag_val.bin), scored at --val-every\n"
                                                     "and at the end: one line, hellaswag: C/N correct (acc_norm P%)"},
    {"tokenizer", "FILE", TEXT(tokenizer), "llm.c's gpt2_tokenizer.bin: print samples of token data as text"},
    {"plot", "FILE.svg", TEXT(plot), "train and val loss and the learning rate against steps, as SVG,\n"
                                     "rewritten every few steps (open it mid-run)"},
    {"log", "FILE", TEXT(log), "the run as JSON lines: a record a step and an evaluation, appended\n"
                               "across restarts (cut back to the resumed step); --plot draws it all"},
    {"version", NULL, ACTION(ARGS_VERSION), "the build: commit, CUDA runtime and driver, GPU architectures, NCCL"},
    {"help", NULL, ACTION(ARGS_HELP), "this table"},
    {NULL, NULL, HEADING, "model, when there is no --init:"},
    {"model", "NAME", TEXT(model_preset), "gpt2, gpt2-medium, gpt2-large, gpt2-xl (or llm.c's d12, d24, d36,\n"
                                          "d48): layers, heads, width, 1024 positions, 50257 tokens"},
    {"layers", "L", INT(model.layers, 1, SAFE_MAX_LAYERS), "transformer blocks (4)"},
    {"heads", "H", INT(model.heads, 1, SAFE_MAX_HEADS), "attention heads (4)"},
    {"dim", "C", INT(model.dim, 1, SAFE_MAX_DIM), "width (128)"},
    {"max-seq", "S", INT(model.max_seq, 1, SAFE_MAX_SEQ), "positions (256, or --seq if longer)"},
    {"vocab", "V", INT(model.vocab, 1, SAFE_MAX_VOCAB), "vocabulary (the data's: 256 for bytes, 50257 for token files)"},
    {NULL, NULL, HEADING, "batch and schedule:"},
    {"batch", "B", INT(layout.batch, 1, 1 << 20), "sequences a micro-batch on each dp rank (4)"},
    {"seq", "T", INT(layout.seq, 1, SAFE_MAX_SEQ), "tokens a sequence (64)"},
    {"micro-batches", "M", INT(layout.micro_batches, 1, 1 << 20), "micro-batches a step: gradient accumulation, pipeline depth (1)"},
    {"steps", "N", INT(steps, 0, 1L << 30), "optimizer steps (100)"},
    {"lr", "F", REAL(opt.lr, 0, 10), "peak learning rate (3e-4)"},
    {"lr-min", "F", REAL(opt.lr_min, 0, 10), "learning rate at the end of the decay (0)"},
    {"warmup", "N", INT(opt.warmup, 0, 1L << 30), "steps of linear warm-up (0)"},
    {"lr-decay", "cosine|none", CHOICE(opt.cosine, decay_values), "decay after the warm-up (cosine)"},
    {"beta1", "F", REAL(opt.beta1, 0, 0.999999), "AdamW's first moment (0.9)"},
    {"beta2", "F", REAL(opt.beta2, 0, 0.999999), "AdamW's second moment (0.95)"},
    {"eps", "F", REAL(opt.eps, 0, 1), "AdamW's epsilon (1e-8)"},
    {"wd", "F", REAL(opt.wd, 0, 10), "weight decay of the matrices (0.1)"},
    {"clip", "F", REAL(opt.clip, 0, 1e30), "clip the global gradient norm to F (1.0; 0 = off)"},
    {"seed", "N", SEED(seed), "initialisation, data order and sampling (1337)"},
    {"shuffle", NULL, SWITCH(shuffle, 1), "a seeded permutation of the sequences (else in file order)"},
    {"val-every", "N", INT(val_every, 0, 1L << 30), "validation loss (and HellaSwag) every N steps (0: only at the end)"},
    {"val-batches", "N", INT(val_batches, 1, 1L << 30), "batches of --val a validation takes (8)"},
    {NULL, NULL, HEADING, "device:"},
    {"device", "cpu|cuda", WORD(device), "where to compute (cuda when a GPU is visible)"},
    {"gpu", "N", INT(gpu, 0, 1023), "the GPU of a single-process run (0)"},
    {"threads", "N", INT(threads, 1, 4096), "CPU threads a rank (OMP_NUM_THREADS, else the CPUs it may\nrun on / the ranks on the host: taskset and cpusets count)"},
    {"dtype", "bf16|fp32", WORD(dtype), "activations and compute copy of the parameters (bf16 on cuda,\n"
                                        "fp32 on the cpu; bf16 on the cpu emulates the rounding, slowly)"},
    {"peak-tflops", "F", REAL64(peak_tflops, 1e-3, 1e6), "dense bf16 peak of one device for the step line's MFU\n"
                                                         "(known for H100/H200/A100; otherwise MFU is not printed)"},
    {"atomic-dq", NULL, SWITCH(atomic_dq, 1), "attention's backward on a GPU sums dq with atomics, as flash\n"
                                              "attention does: runs may then differ in their last bits (on an\n"
                                              "H200 the slower). Without it every GPU run gives the same bits"},
    {"deterministic", NULL, SWITCH(atomic_dq, 0), "the default, kept for older commands: undoes --atomic-dq"},
    {"no-self-test", NULL, SWITCH(no_self_test, 1), "skip the check of every GPU kernel against the CPU before step 1"},
    {"backend", "nccl|shm|auto", CHOICE(backend, backend_values), "how ranks exchange: NCCL, or host shared memory (auto: NCCL\n"
                                                                  "when every rank has a GPU of its own and NCCL is built in)"},
    {"comm-timeout", "S", REAL64(comm_timeout, 0.01, 1e6), "stop a rank whose NCCL operation takes longer than S seconds (300)"},
    {NULL, NULL, HEADING, "generation:"},
    {"sample", "N", INT(sample, 0, 1 << 24), "generate N tokens at the end"},
    {"temperature", "F", REAL(temperature, 1e-6, 100), "sampling temperature (1.0)"},
    {NULL, NULL, HEADING, "ranks and layout:"},
    {"ranks", "N", INT(ranks, 1, COMM_MAX_RANKS), "fork N ranks on this host (else one, or srun/mpirun/torchrun's)"},
    {"dp", "D", INT(layout.dp, 1, COMM_MAX_RANKS), "data-parallel ranks; D x N x T x P = ranks (N: --cp), one of D,\n"
                                                  "T, P left out is inferred"},
    {"tp", "T", INT(layout.tp, 1, COMM_MAX_RANKS), "tensor-parallel ranks (Megatron's split of heads and columns)"},
    {"pp", "P", INT(layout.pp, 1, COMM_MAX_RANKS), "pipeline stages"},
    {"cp", "N", INT(layout.cp, 1, COMM_MAX_RANKS), "context-parallel ranks: each sequence split over N ranks, attention\n"
                                                   "as a ring passing keys and values (cp.c; --seq a multiple of 2N)"},
    {"sp", NULL, SWITCH(layout.sp, 1), "sequence parallelism in the tp group (Megatron)"},
    {"dp-mode", "ddp|ps", CHOICE(layout.dp_mode, dp_mode_values), "all-reduce (DDP), or the parameter server on rank 0 (ddp)"},
    {"zero", "0|1|2|3", INT(layout.zero, 0, 3), "shard optimizer state, gradients, parameters over dp (0)"},
    {"offload", NULL, SWITCH(layout.offload, 1), "optimizer state and AdamW on the host (ZeRO-Offload)"},
    {"bucket-mb", "F", REAL64(bucket_mb, 1e-6, 1e6), "gradient bucket size for the overlapped reduction (25)"},
    {"comm-stats", NULL, SWITCH(comm_stats, 1), "print each rank's bytes moved, by operation and group"},
    {"dump-grads", "FILE", TEXT(dump_grads), "write step 1's reduced gradients as an llm.c model file (tests)"},
    {"layout", "auto", OWN(parse_layout_auto), "the planner chooses --dp --tp --pp --zero --micro-batches --batch\n"
                                               "--schedule --recompute --sp for --global-batch N sequences (else\n"
                                               "batch x micro-batches x ranks) and prints its choice"},
    {"global-batch", "N", INT(global_batch, 1, 1 << 20), "sequences a step for --layout auto"},
    {"all-schedules", NULL, SWITCH(all_schedules, 1), "--layout auto may choose interleaved and zb-h1/zb-h2 too"},
    {"plan-layout", NULL, SWITCH(plan_layout, 1), "print the planner's memory and --comm-stats rows for this layout\n"
                                                  "and exit (no data needed)"},
    {"plan", NULL, OWN(parse_plan), "plan for a model and cluster without training: its own flags\n"
                                    "(docs/cli.md, \"The planner\")"},
    {NULL, NULL, HEADING, "pipeline:"},
    {"schedule", "NAME", OWN(parse_schedule), "naive|gpipe|1f1b|interleaved|zb-h1|zb-h2: the order of the\n"
                                              "micro-batches' forwards and backwards (1f1b); interleaved:\n"
                                              "Megatron's, V chunks a stage; zb-h1, zb-h2: zero bubble, each\n"
                                              "backward split into B (input gradient) and a later W (weight\n"
                                              "gradients; zb-h2 holds more to fill the bubble)"},
    {"virtual", "V", INT(layout.virtual_chunks, 1, GPT_MAX_CHUNKS), "interleaved: V chunks of layers a stage, stage s holding the\n"
                                                                    "model's chunks s, s+P, ... (1; the layers divide into P x V)"},
    {"stage-layers", "3,3,4,2", OWN(parse_stage_layers), "layers of each stage (as even as possible); with --virtual V,\n"
                                                         "P x V ranges: the model's chunks in order"},
    {"recompute", NULL, SWITCH(layout.recompute, RECOMPUTE_FULL), "keep each layer's input only; recompute the rest in backward\n"
                                                                  "(--recompute-mode full)"},
    {"recompute-mode", "none|gelu|norm|full", CHOICE(layout.recompute, recompute_values),
     "what backward recomputes instead of keeping (none): gelu, the MLP's\n"
     "GELU output from its input (llm.c's -r 1); norm, that and both\n"
     "LayerNorms' outputs (-r 2); full, all but each layer's input. gelu\n"
     "and norm give the bits of none; the memory line shows what each keeps"},
    {"show-schedule", NULL, SWITCH(show_schedule, 1), "draw the schedule and its bubble, as text and SVG, and exit\n"
                                                      "(no data needed)"},
    {"schedule-svg", "FILE", OWN(parse_schedule_svg), "where --show-schedule writes the SVG (schedule.svg); implies it"},
    {"trace", "FILE", TEXT(trace), "Chrome/Perfetto trace of every rank's spans, and FILE.svg"},
    {"pin-cores", NULL, SWITCH(pin_cores, 1), "pin each rank to its own cores (benchmarks)"},
    {NULL, NULL, HEADING, "checkpoints:"},
    {"checkpoint-dir", "DIR", TEXT(checkpoint_dir), "sharded checkpoints in DIR/step-N (each rank writes what it owns)"},
    {"checkpoint-every", "N", INT(checkpoint_every, 0, 1L << 30), "every N steps (0: only at the end, and on a stop)"},
    {"checkpoint-async", NULL, SWITCH(checkpoint_async, 1), "write checkpoints in the background while training goes on"},
    {"keep", "K", INT(keep, 1, 1000), "complete checkpoints kept (2)"},
    {"resume", NULL, SWITCH(resume, 1), "continue from DIR/latest if there is a checkpoint, else start\n"
                                        "(from --init if given): the same command every time"},
    {"time-limit", "MIN", REAL64(time_limit_min, 1e-6, 1e9), "stop before MIN minutes of wall time, leaving room for the save\n"
                                                             "(fractions allowed; at least one step)"},
    {NULL, NULL, HEADING, "stopping: SIGINT, SIGTERM, SIGUSR1 and --time-limit finish the step, write a\n"
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
        if ((int)strlen(left) > 22) fprintf(f, "  %s\n  %-22s ", left, "");   /* the help on a line of its own */
        else fprintf(f, "  %-22s ", left);
        for (const char *p = g->help; *p; p++) {
            fputc(*p, f);
            if (*p == '\n') fprintf(f, "  %-22s ", "");
        }
        fputc('\n', f);
    }
}

/* The index of v among the words of a placeholder ("nccl|shm|auto"), or
 * -1 with "--backend must be nccl, shm or auto, got 'v'" in err. */
static int parse_word(const ArgsFlag *f, const char *v, char *err, size_t errlen) {
    char list[128] = "";
    size_t k = 0;
    int n = 0, found = -1;
    for (const char *w = f->value; *w; n++) {
        size_t len = strcspn(w, "|");
        if (strlen(v) == len && !strncmp(w, v, len)) found = n;
        const char *sep = !w[len] ? " or " : n ? ", " : "";   /* before this word, in the message */
        if (k < sizeof list) k += (size_t)snprintf(list + k, sizeof list - k, "%s%.*s", n ? sep : "", (int)len, w);
        w += len + (w[len] == '|');
    }
    if (found < 0) safe_fail(err, errlen, "--%s must be %s, got '%s'", f->name, list, v);
    return found;
}

/* Sets the field row f names from v (NULL for a switch). Returns ARGS_RUN,
 * the row's action (ARGS_HELP, ARGS_VERSION), or -1 with err. */
static int flag_set(Args *a, const ArgsFlag *f, const char *v, char *err, size_t errlen) {
    char *field = (char *)a + f->at, *end;
    errno = 0;
    switch (f->kind) {
    case ARG_TEXT: *(const char **)field = v; return ARGS_RUN;
    case ARG_WORD: if (parse_word(f, v, err, errlen) < 0) return -1;
        *(const char **)field = v; return ARGS_RUN;
    case ARG_CHOICE: {
        int i = parse_word(f, v, err, errlen);
        if (i < 0) return -1;
        *(int *)field = f->values[i];
        return ARGS_RUN;
    }
    case ARG_INT: case ARG_SEED: {
        long x = strtol(v, &end, 10), lo = (long)f->lo, hi = f->kind == ARG_SEED ? 0x7fffffffffffffffL : (long)f->hi;
        if (errno || end == v || *end) return safe_fail(err, errlen, "--%s expects an integer, got '%s'", f->name, v);
        if (x < lo || x > hi) return safe_fail(err, errlen, "--%s must be between %ld and %ld, got %ld", f->name, lo, hi, x);
        if (f->kind == ARG_SEED) *(uint64_t *)field = (uint64_t)x;
        else *(int *)field = (int)x;
        return ARGS_RUN;
    }
    case ARG_REAL: case ARG_REAL64: {
        double x = strtod(v, &end);
        if (errno || end == v || *end || !isfinite(x)) return safe_fail(err, errlen, "--%s expects a number, got '%s'", f->name, v);
        if (x < f->lo || x > f->hi) return safe_fail(err, errlen, "--%s must be between %g and %g, got %g", f->name, f->lo, f->hi, x);
        if (f->kind == ARG_REAL) *(float *)field = (float)x;
        else *(double *)field = (float)x;
        return ARGS_RUN;
    }
    case ARG_SWITCH: *(int *)field = (int)f->lo; return ARGS_RUN;
    case ARG_ACTION: return (int)f->lo;
    case ARG_OWN: return f->own(a, v, err, errlen);
    case ARG_HEADING: break;
    }
    return safe_fail(err, errlen, "--%s: no such kind of flag", f->name);
}

static int parse_schedule(Args *a, const char *v, char *err, size_t errlen) {
    int k = pp_schedule_parse(v);
    if (k < 0)
        return safe_fail(err, errlen, "--schedule must be naive, gpipe, 1f1b, interleaved, zb-h1 or zb-h2, got '%s'", v);
    a->layout.schedule = (PPSchedule)k;
    return 0;
}

/* --stage-layers 3,3,4,2: each stage's (or with --virtual, each chunk's) layers. */
static int parse_stage_layers(Args *a, const char *v, char *err, size_t errlen) {
    Layout *l = &a->layout;
    const char *p = v;
    char *end;
    l->nstage_layers = 0;
    while (*p) {
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 1 || x > SAFE_MAX_LAYERS || (*end && *end != ',') || l->nstage_layers == COMM_MAX_RANKS)
            return safe_fail(err, errlen, "--stage-layers expects positive integers separated by commas, got '%s'", v);
        l->stage_layers[l->nstage_layers++] = (int)x;
        p = *end ? end + 1 : end;
    }
    return 0;
}

static int parse_schedule_svg(Args *a, const char *v, char *err, size_t errlen) {
    a->schedule_svg = v;
    a->show_schedule = 1;
    return 0;
}

static int parse_layout_auto(Args *a, const char *v, char *err, size_t errlen) {
    if (strcmp(v, "auto") != 0) return safe_fail(err, errlen, "--layout takes 'auto' (the planner's choice), got '%s'", v);
    a->layout_auto = 1;
    return 0;
}

static int parse_plan(Args *a, const char *v, char *err, size_t errlen) {
    return safe_fail(err, errlen, "--plan comes first: ./train --plan [planner flags]");
}

/* What a run is without flags. */
static void args_defaults(Args *a) {
    memset(a, 0, sizeof *a);
    a->layout = (Layout){.cp = 1, .dp_mode = DP_ALLREDUCE, .schedule = PP_1F1B, .virtual_chunks = 1, .micro_batches = 1,
                         .batch = 4, .seq = 64, .dtype = DT_F32};   /* dp, tp, pp 0: inferred (setup.c) */
    a->steps = 100;
    a->opt = (OptConfig){.lr = 3e-4f, .lr_min = 0.0f, .warmup = 0, .cosine = 1,
                         .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .wd = 0.1f, .clip = 1.0f};
    a->seed = 1337; a->val_batches = 8; a->temperature = 1.0f;
    a->backend = -1;
    a->bucket_mb = 25.0;
    a->keep = 2;
}

int args_parse(Args *a, int argc, char **argv, char *err, size_t errlen) {
    struct option opts[NFLAGS + 1];   /* getopt_long's view of the table: row i answers 256 + i */
    int n = 0;
    for (int i = 0; i < NFLAGS; i++)
        if (flags[i].name) opts[n++] = (struct option){flags[i].name, flags[i].value ? 1 : 0, 0, 256 + i};
    opts[n] = (struct option){0, 0, 0, 0};
    args_defaults(a);
    opterr = 0;
    optind = 0;   /* getopt_long from the start, each call */
    int c;
    while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
        if (c == ':') return safe_fail(err, errlen, "%s needs a value", argv[optind - 1]);
        if (c < 256 || c >= 256 + NFLAGS) return safe_fail(err, errlen, "unknown flag %s (see --help)", argv[optind - 1]);
        int rc = flag_set(a, &flags[c - 256], optarg, err, errlen);
        if (rc != ARGS_RUN) return rc;
    }
    if (optind < argc) return safe_fail(err, errlen, "unexpected argument '%s' (see --help)", argv[optind]);
    if (!a->data && !args_explain_only(a)) return safe_fail(err, errlen, "--data FILE is required");
    if (a->dump_grads && (a->layout.dp_mode != DP_ALLREDUCE || a->layout.zero))
        return safe_fail(err, errlen, "--dump-grads needs whole gradients on every rank: --dp-mode ddp --zero 0");
    if ((a->resume || a->checkpoint_every || a->checkpoint_async) && !a->checkpoint_dir)
        return safe_fail(err, errlen, "%s needs --checkpoint-dir DIR",
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
