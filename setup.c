/* setup.c: everything `train` checks before a rank exists, and the modes
 * that only explain.
 *
 * From the parsed flags (args.c) to a run that can start: the model's shape
 * (flags, --init or the checkpoint), the data, the launch (how many ranks,
 * from --ranks or srun/torchrun), the mesh dp x tp x pp and its rules, the
 * pipeline's schedule, the device and the backend. Nothing is allocated for
 * training and no rank is started until all of it holds; a problem is one
 * line on stderr and exit 2 (DESIGN.md, "Errors").
 *
 * Two modes stop here: --plan-layout (the planner's prediction for this very
 * layout, hybrid-parallelism.txt's memory accounting) and --show-schedule
 * (the pipeline's schedule drawn, its bubble as the article computes it).
 * They need no data: the vocabulary is then GPT-2's.
 */
#define _GNU_SOURCE
#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/types.h>
#include <sys/wait.h>
#include "run.h"
#include "ckpt.h"
#include "plan.h"
#include "plot.h"
#include "safe.h"

void setup_die_usage(const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "train: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    exit(EXIT_USAGE);
}

double setup_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Loads a data file and checks it against the model. Exits 2 on bad input. */
static void load_data(DataSet *ds, const char *path, const Args *a, int vocab) {
    char err[512];
    if (data_load(ds, path, err, sizeof err) != 0 ||
        data_prepare(ds, path, a->seq, a->shuffle, a->seed, err, sizeof err) != 0)
        setup_die_usage("%s", err);
    if (data_check_vocab(ds, vocab, err, sizeof err) != 0) setup_die_usage("%s", err);
}

/* --eval-hellaswag: the file read as hostile input (eval.c) and every
 * example fitting a row of --seq tokens, refused now rather than mid-run.
 * Exits 2 on bad input. */
static void load_hellaswag(EvalSet *es, const char *path, int seq, int vocab) {
    char err[512];
    if (eval_load(es, path, vocab, err, sizeof err) != 0) setup_die_usage("%s", err);
    if (es->max_tokens <= seq) return;
    for (int i = 0; i < es->n; i++)
        if (eval_example_tokens(es, i) > seq)
            setup_die_usage("%s: example %d needs %d tokens (context and longest completion), more than --seq %d",
                            path, i, eval_example_tokens(es, i), seq);
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

/* A model the flags name explicitly must be the one the file holds
 * (--init, or the checkpoint): one line naming both values, exit 2. */
static void check_same_model(const GPTConfig *f, const GPTConfig *c, const char *what) {
    const char *names[] = {"--layers", "--heads", "--dim", "--max-seq", "--vocab"};
    int flag[] = {f->layers, f->heads, f->dim, f->max_seq, f->vocab};
    int file[] = {c->layers, c->heads, c->dim, c->max_seq, c->vocab};
    for (int i = 0; i < 5; i++)
        if (flag[i] && flag[i] != file[i])
            setup_die_usage("%s %d, but %s %s %s %d", names[i], flag[i], what,
                            strncmp(what, "--model", 7) ? "holds" : "has", names[i] + 2, file[i]);
}

/* --resume: whether DIR holds a checkpoint to continue. Returns 1 (opened
 * into r->ck), 0 when DIR holds none at all (no latest, no step
 * directories: a fresh start), and exits 2 when latest is missing or
 * damaged beside step directories. */
static int open_checkpoint(Run *r) {
    char err[512];
    const char *dir = r->a.checkpoint_dir;
    if (checkpoint_open(dir, &r->ck, err, sizeof err) == 0) return 1;
    char name[256];
    if (checkpoint_latest(dir, name, sizeof name) != 0 && !checkpoint_any_step(dir)) return 0;
    setup_die_usage("%s", err);
}

/* A resume may change the schedule (more steps, another learning rate): one
 * line says what changed, and the run continues on the new schedule from
 * the saved step. */
static void say_schedule_change(const OptConfig *now, const OptConfig *then, const char *dir) {
    char line[1024] = "";
    size_t k = 0;
#define CHANGED(flag, fmt, a, b) \
    if ((a) != (b) && k < sizeof line) k += (size_t)snprintf(line + k, sizeof line - k, "%s" flag " " fmt " (was " fmt ")", k ? ", " : "", a, b)
    CHANGED("--steps", "%d", now->steps, then->steps);
    CHANGED("--warmup", "%d", now->warmup, then->warmup);
    CHANGED("--lr", "%g", now->lr, then->lr);
    CHANGED("--lr-min", "%g", now->lr_min, then->lr_min);
    if (now->cosine != then->cosine) CHANGED("--lr-decay", "%s", now->cosine ? "cosine" : "none", then->cosine ? "cosine" : "none");
    CHANGED("--beta1", "%g", now->beta1, then->beta1);
    CHANGED("--beta2", "%g", now->beta2, then->beta2);
    CHANGED("--eps", "%g", now->eps, then->eps);
    CHANGED("--wd", "%g", now->wd, then->wd);
    CHANGED("--clip", "%g", now->clip, then->clip);
#undef CHANGED
    if (k) printf("resume: the schedule changes from %s: %s; continuing on the new one\n", dir, line);
}

/* The checkpoint must continue this run's data order and model: a flag that
 * disagrees is one line naming both values (exit 2). */
static void check_resume(Run *r, GPTConfig *cfg) {
    const CheckpointMeta *m = &r->ck.meta;
    char what[4200];
    snprintf(what, sizeof what, "the checkpoint %s", r->ck.dir);
    check_same_model(&r->a.model, &m->cfg, what);
    *cfg = m->cfg;
    if (r->a.seq != m->layout.seq)
        setup_die_usage("--seq %d, but %s was written with --seq %d (the data order would move)", r->a.seq, what,
                        m->layout.seq);
    if (r->a.seed != m->seed)
        setup_die_usage("--seed %llu, but %s was written with --seed %llu (the data order would move)",
                        (unsigned long long)r->a.seed, what, (unsigned long long)m->seed);
    say_schedule_change(&r->a.opt, &m->opt, r->ck.dir);
    char msg[1024];
    if (m->data_shards && r->a.data && data_compare(m->data_shards, &r->train, msg, sizeof msg) != 0)
        printf("resume: the data changed since %s: %s\n", r->ck.dir, msg);
    if (r->a.shuffle != m->shuffle)
        setup_die_usage("%s, but %s was written %s (the data order would move)",
                        r->a.shuffle ? "--shuffle" : "no --shuffle", what, m->shuffle ? "with --shuffle" : "without it");
}

/* After the mesh is known: the global batch B x M x dp must be the
 * checkpoint's, or every later step would take other sequences. */
static void check_resume_batch(Run *r) {
    const CheckpointLayout *l = &r->ck.meta.layout;
    long now = (long)r->a.batch * r->a.micro_batches * r->a.dp, then = (long)l->batch * l->micro_batches * l->dp;
    if (now != then)
        setup_die_usage("a global batch of %ld sequences (--batch %d x --micro-batches %d x dp %d), but the checkpoint "
                        "%s was written with %ld (%d x %d x %d): the data order would move", now, r->a.batch,
                        r->a.micro_batches, r->a.dp, r->ck.dir, then, l->batch, l->micro_batches, l->dp);
}

int setup_cpus(int *ids, int max) {
    cpu_set_t set;
    int n = 0;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        for (int c = 0; c < CPU_SETSIZE; c++)
            if (CPU_ISSET(c, &set)) {
                if (ids && n < max) ids[n] = c;
                n++;
            }
    }
    if (n > 0) return n;
    n = (int)sysconf(_SC_NPROCESSORS_ONLN);
    for (int c = 0; ids && c < n && c < max; c++) ids[c] = c;
    return n < 1 ? 1 : n;
}

/* A rank's threads when local ranks share this host: --threads, else
 * OMP_NUM_THREADS as PyTorch and torchrun read it (one process's threads),
 * else the CPUs this process may run on, shared. */
static int threads_for(const Args *a, int local) {
    if (a->threads) return a->threads;
    const char *env = getenv("OMP_NUM_THREADS");
    char *end = NULL;
    long v = env ? strtol(env, &end, 10) : 0;
    if (env && end != env && (*end == 0 || *end == ',') && v >= 1 && v <= 4096) return (int)v;
    int threads = setup_cpus(NULL, 0) / (local > 0 ? local : 1);
    return threads < 1 ? 1 : threads;
}

int setup_threads(const Run *r) { return threads_for(&r->a, r->launch.local_size); }

/* The planner's model of a cluster like this host: CPU ranks (float32,
 * measured rates of a 2-core machine: bench/plan_calibrate.sh), or GPUs
 * taken for plan.c's default GPU preset (PLAN_DEFAULT_GPU: H100s, 8 a node). */
static PlanCluster host_cluster(const Run *r, int world, int cuda) {
    PlanCluster c = {.latency_us = PLAN_LATENCY_US};
    plan_cluster_preset(&c, PLAN_DEFAULT_GPU, world);
    c.per_node = r->launch.local_size > 0 ? r->launch.local_size : world;
    if (!cuda) {
        /* CPU ranks: a core's float32 rate and the shared-memory backend's
         * bandwidth and latency as measured on a 2-core AMD EPYC (Zen 3,
         * AVX2): bench-plan's calibration model (4 layers, dim 128, 4 x 64
         * tokens) on one thread with gemm.c's AVX2 kernel, 25-27 ms a step,
         * 0.051-0.056 TFLOP/s achieved, the planner's 50% of 0.106;
         * 8 GB/s; 14-16 us (make bench-plan). The ranks of this host share
         * its cores, a rank --threads of them (run_build's rule) */
        double ram = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
        int cores = setup_cpus(NULL, 0), local = c.per_node;
        int threads = threads_for(&r->a, local);
        c.cpu = 1;
        c.mem_gb = ram / 1e9 / (world > 0 ? world : 1);
        c.tflops = 0.106 * threads;
        c.cores = local * threads > cores ? (cores / threads > 0 ? cores / threads : 1) : 0;
        c.intra_gbs = c.inter_gbs = 8;
        c.latency_us = 15;
    }
    return c;
}

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
        setup_die_usage("--layout auto chooses --dp, --tp, --pp and the stages itself: give none of them");
    PlanCluster c = host_cluster(r, world, cuda);
    PlanSearch ps;
    if (plan_search(cfg, G, a->seq, &c, a->all_schedules, &ps) != 0) setup_die_usage("--layout auto: out of memory");
    if (!ps.nfit) {
        plan_search_free(&ps);
        setup_die_usage("--layout auto: no layout of %d ranks fits a global batch of %d sequences of %d tokens", world,
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
           c.cpu ? "CPU ranks" : "GPUs taken for " PLAN_DEFAULT_GPU "s, 8 a node");
    fflush(stdout);
    plan_search_free(&ps);
}

/* Stage st's layers into s: --stage-layers' ranges or the even split,
 * --virtual chunks a stage (run_check asked P x V to divide L). */
void setup_stage_layers(const Args *a, int L, int P, int st, GPTShard *s) {
    gpt_stage_layers(L, P, a->virtual_chunks ? a->virtual_chunks : 1, a->nstage_layers ? a->stage_layers : NULL,
                     st, s);
}

/* Every output can be written: found now, before any input is read or
 * training done, not after it (safe.h). */
static void check_outputs(const Args *a) {
    char err[512];
    const char *svg = a->show_schedule ? (a->schedule_svg ? a->schedule_svg : "schedule.svg") : NULL;
    const char *outs[][2] = {{"--save", a->save}, {"--trace", a->trace}, {"--dump-grads", a->dump_grads},
                             {"--plot", a->plot}, {"--log", a->log},
                             {"--schedule-svg", svg}};
    for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++)
        if (outs[i][1] && safe_check_output(outs[i][0], outs[i][1], err, sizeof err) != 0) setup_die_usage("%s", err);
    size_t rows;   /* [B,T] rows of every activation: bounded before any input is read */
    if (safe_mul((size_t)a->batch, (size_t)a->seq, &rows) != 0 || rows > SAFE_MAX_ROWS)
        setup_die_usage("--batch %d x --seq %d = %zu tokens a micro-batch, more than %d", a->batch, a->seq, rows,
                        SAFE_MAX_ROWS);
}

/* The model: the checkpoint's (--resume), the file's (--init), or the
 * flags' with defaults; then the data checked against it. */
static void check_model_and_data(Run *r) {
    Args *a = &r->a;
    char err[512];
    GPTConfig cfg = a->model;
    DataSet *tr = &r->train;
    if (a->data && data_load(tr, a->data, err, sizeof err) != 0) setup_die_usage("%s", err);
    if (a->model_preset) {   /* --model: the flags given must agree; it fills the rest */
        GPTConfig preset;
        char what[128];
        if (gpt_preset(a->model_preset, &preset) != 0)
            setup_die_usage("--model %s: no such model (%s)", a->model_preset, GPT_PRESETS);
        snprintf(what, sizeof what, "--model %s", a->model_preset);
        check_same_model(&a->model, &preset, what);
        cfg = a->model = preset;
    }
    r->resumed = a->resume && open_checkpoint(r);
    if (r->resumed) {
        check_resume(r, &cfg);   /* --init is not read: the checkpoint holds the model */
    } else if (a->init) {
        if (ckpt_read_config(a->init, &cfg, err, sizeof err) != 0) setup_die_usage("%s", err);
        check_same_model(&a->model, &cfg, a->init);
    } else {
        if (!cfg.layers) cfg.layers = 4;
        if (!cfg.heads) cfg.heads = 4;
        if (!cfg.dim) cfg.dim = 128;
        if (!cfg.max_seq) cfg.max_seq = a->seq > 256 ? a->seq : 256;
        if (!cfg.vocab) cfg.vocab = a->data && tr->is_bytes ? 256 : 50257;   /* no data: GPT-2's */
        if (gpt_config_check(&cfg, err, sizeof err) != 0) setup_die_usage("%s", err);
    }
    if (a->seq > cfg.max_seq)
        setup_die_usage("--seq %d exceeds the model's max sequence length %d", a->seq, cfg.max_seq);
    if (a->data && data_prepare(tr, a->data, a->seq, a->shuffle, a->seed, err, sizeof err) != 0)
        setup_die_usage("%s", err);
    if (a->data && data_check_vocab(tr, cfg.vocab, err, sizeof err) != 0) setup_die_usage("%s", err);
    if (a->val) load_data(&r->val, a->val, a, cfg.vocab);
    if (a->data && !(r->data_shards = data_describe(tr))) setup_die_usage("out of memory describing the data");
    if (a->eval_hellaswag) load_hellaswag(&r->hellaswag, a->eval_hellaswag, a->seq, cfg.vocab);
    if (a->tokenizer && data_tokenizer_load(&r->tok, a->tokenizer, err, sizeof err) != 0)
        setup_die_usage("%s", err);
    r->cfg = cfg;
}

/* The mesh dp x tp x pp from the launch (or --layout auto), and the
 * schedule's rules: P stages, M micro-batches, V chunks a stage. */
static void check_mesh(Run *r) {
    Args *a = &r->a;
    char err[512];
    if (comm_launch_plan(a->ranks, &r->launch, err, sizeof err) != 0) setup_die_usage("%s", err);
    if (a->all_schedules && !a->layout_auto) setup_die_usage("--all-schedules widens --layout auto's search: give --layout auto");
    if (a->layout_auto) choose_layout(r, &r->cfg);
    int dp = a->dp, tp = a->tp, pp = a->pp;
    if (comm_mesh_shape(r->launch.world_size, &dp, &tp, &pp, err, sizeof err) != 0)
        setup_die_usage("%s", err);
    int V = a->virtual_chunks ? a->virtual_chunks : 1;
    if (pp_schedule_check(a->schedule, pp, a->micro_batches, V, err, sizeof err) != 0) setup_die_usage("%s", err);
    if (V > 1 && pp < 2) setup_die_usage("--virtual %d interleaves chunks over stages: it needs --pp 2 or more", V);
    a->dp = dp; a->tp = tp; a->pp = pp;
}

/* The model split over the mesh: tp over heads, pp over layers, the step's tokens bounded. */
static void check_split(Run *r) {
    Args *a = &r->a;
    const GPTConfig *cfg = &r->cfg;
    char err[512];
    int dp = a->dp, tp = a->tp, pp = a->pp, V = a->virtual_chunks ? a->virtual_chunks : 1;
    size_t step_tokens;   /* the tokens of a step are ints everywhere: bounded here */
    if (safe_mul_n(&step_tokens, 4, (size_t)a->batch, (size_t)a->seq, (size_t)a->micro_batches, (size_t)dp) != 0 ||
        step_tokens > SAFE_MAX_STEP_TOKENS)
        setup_die_usage("--batch %d x --seq %d x --micro-batches %d x dp %d tokens a step is more than %d", a->batch,
                        a->seq, a->micro_batches, dp, SAFE_MAX_STEP_TOKENS);
    if (tp_check(cfg, tp, a->sp, a->batch, a->seq, err, sizeof err) != 0) setup_die_usage("%s", err);
    if (a->nstage_layers) {
        long sum = 0;   /* at most COMM_MAX_RANKS x SAFE_MAX_LAYERS */
        for (int i = 0; i < a->nstage_layers; i++) sum += a->stage_layers[i];
        if (V == 1 && a->nstage_layers != pp)
            setup_die_usage("--stage-layers gives %d stages, --pp is %d", a->nstage_layers, pp);
        if (V > 1 && a->nstage_layers != pp * V)
            setup_die_usage("--stage-layers gives %d ranges, --pp %d x --virtual %d needs %d (the model's chunks in order)",
                            a->nstage_layers, pp, V, pp * V);
        if (sum != cfg->layers)
            setup_die_usage("--stage-layers adds up to %ld layers, the model has %d", sum, cfg->layers);
    } else if (pp > cfg->layers) {
        setup_die_usage("--pp %d exceeds the model's %d layers", pp, cfg->layers);
    } else if (cfg->layers % (pp * V) != 0 && V > 1) {
        setup_die_usage("--pp %d x --virtual %d = %d chunks: the model's %d layers do not divide into them "
                        "(or give the %d chunks' layers with --stage-layers)", pp, V, pp * V, cfg->layers, pp * V);
    }
}

/* The device, the dtype and the backend's own limits (run_build picks the same backend). */
static void check_device(Run *r) {
    Args *a = &r->a;
    r->gpus = r->launch.kind == COMM_LAUNCH_FORK ? probe_gpus() : dev_gpu_count();
    r->kind = DEV_CPU;
    if (a->device ? !strcmp(a->device, "cuda") : r->gpus > 0) r->kind = DEV_CUDA;
    if (r->kind == DEV_CUDA && r->gpus == 0)
#ifdef USE_CUDA
        setup_die_usage("--device cuda: no CUDA GPU is visible");
#else
        setup_die_usage("--device cuda: this build has no CUDA (nvcc was not found at build time)");
#endif
    CommBackend backend = a->backend >= 0 ? (CommBackend)a->backend
                                          : comm_default_backend(&r->launch, r->kind, r->gpus);
    if (backend == COMM_SHM && r->launch.world_size > COMM_MAX_RANKS)
        setup_die_usage("%s started %d ranks: the shared-memory backend takes at most %d ranks%s", r->launch.source,
                        r->launch.world_size, COMM_MAX_RANKS, r->kind == DEV_CUDA ? "" : " (NCCL needs --device cuda)");
#ifndef USE_NCCL
    if (backend == COMM_NCCL) setup_die_usage("--backend nccl: this build has no NCCL (nccl.h was not found at build time)");
#endif
    if (backend == COMM_NCCL && r->kind != DEV_CUDA) setup_die_usage("--backend nccl needs --device cuda");
    r->dtype = a->dtype ? (strcmp(a->dtype, "bf16") ? DT_F32 : DT_BF16)
                        : (r->kind == DEV_CUDA ? DT_BF16 : DT_F32);
}

/* --show-schedule: P from --pp (or --ranks / (dp x tp)), and the schedule's rules. */
static void check_schedule_only(Args *a) {
    char err[512];
    int dp = a->dp, tp = a->tp, pp = a->pp, V = a->virtual_chunks ? a->virtual_chunks : 1;
    int world = a->ranks ? a->ranks : (dp ? dp : 1) * (tp ? tp : 1) * (pp ? pp : 1);
    if (comm_mesh_shape(world, &dp, &tp, &pp, err, sizeof err) != 0) setup_die_usage("%s", err);
    if (pp_schedule_check(a->schedule, pp, a->micro_batches, V, err, sizeof err) != 0) setup_die_usage("%s", err);
    if (V > 1 && pp < 2) setup_die_usage("--virtual %d interleaves chunks over stages: it needs --pp 2 or more", V);
    a->dp = dp; a->tp = tp; a->pp = pp;
}

/* --check-data: every token of every shard of --data and --val read and
 * checked against the vocabulary; one line each, then exit (0, or 2). */
static void check_data_only(Run *r) {
    char err[512];
    DataSet *sets[2] = {&r->train, r->a.val ? &r->val : NULL};
    const char *names[2] = {r->a.data, r->a.val};
    for (int i = 0; i < 2 && sets[i]; i++) {
        int max = -1;
        if (data_scan(sets[i], r->cfg.vocab, &max, err, sizeof err) != 0) setup_die_usage("%s", err);
        printf("check-data: %s: %d shard%s, %zu tokens, largest id %d < vocab %d: ok\n", names[i], sets[i]->n_shards,
               sets[i]->n_shards == 1 ? "" : "s", sets[i]->n_tokens, max, r->cfg.vocab);
    }
    exit(0);
}

void setup_check(Run *r) {
    check_outputs(&r->a);
    if (r->a.show_schedule) {   /* only the schedule: no model, no data, no ranks */
        check_schedule_only(&r->a);
        return;
    }
    check_model_and_data(r);
    if (r->a.check_data) check_data_only(r);
    check_mesh(r);
    check_split(r);
    check_device(r);
    if (r->resumed) check_resume_batch(r);
}

/* --plan-layout: what the planner predicts for this very layout, rank by
 * rank, in the units of the memory line and --comm-stats. */
int setup_plan_layout(Run *r) {
    Args *a = &r->a;
    PlanLayout l = {a->dp, a->tp, a->pp, a->dpc.zero, a->dpc.offload, a->micro_batches, a->batch, a->schedule,
                    a->recompute, a->sp, a->nstage_layers ? a->stage_layers : NULL, a->virtual_chunks};
    PlanCluster c = host_cluster(r, a->dp * a->tp * a->pp, r->kind == DEV_CUDA);
    if (r->kind == DEV_CUDA && r->dtype == DT_F32) c.cpu = 1;   /* float32 activations */
    if (a->dpc.mode == DP_PS) setup_die_usage("--plan-layout: the planner does not model --dp-mode ps");
    if (plan_layout_print(stdout, &r->cfg, a->seq, &c, &l) != 0) setup_die_usage("--plan-layout: the model does not divide that way");
    return 0;
}

/* --show-schedule: the text figure (pp_show), then the same timeline as SVG. */
int setup_show_schedule(const Args *a) {
    const char *path = a->schedule_svg ? a->schedule_svg : "schedule.svg";
    char err[512], formula[96];
    PPTimeline tl;
    int V = a->virtual_chunks ? a->virtual_chunks : 1;
    pp_show(stdout, a->schedule, a->pp, a->micro_batches, V);
    if (pp_bubble_text(a->schedule, a->pp, a->micro_batches, V, formula, sizeof formula) != 0 ||
        pp_timeline(a->schedule, a->pp, a->micro_batches, V, &tl) != 0) {
        fprintf(stderr, "train: --show-schedule: out of memory\n");
        return 1;
    }
    int rc = plot_schedule_svg(path, &tl, pp_schedule_name(a->schedule), formula, err, sizeof err);
    if (rc != 0) fprintf(stderr, "train: %s\n", err);
    else printf("schedule drawn in %s\n", path);
    pp_timeline_free(&tl);
    return rc ? 1 : 0;
}

/* Dense bf16 peak of one device in TFLOP/s: --peak-tflops, else known by
 * the GPU's name (SXM figures), else 0 (no MFU printed). */
double setup_device_peak(Run *r) {
    if (r->a.peak_tflops > 0) return r->a.peak_tflops;
    char name[256];
    dev_name(&r->dev, name, sizeof name);
    return plan_device_tflops(name);
}


void setup_checkpoint_meta(const Run *r, long step, CheckpointMeta *meta) {
    const Args *a = &r->a;
    memset(meta, 0, sizeof *meta);
    CheckpointLayout *l = &meta->layout;
    meta->cfg = r->cfg;
    meta->step = step;
    meta->adam_t = r->dp.z.adam.t;
    meta->seed = a->seed;
    meta->shuffle = a->shuffle;
    meta->steps = a->steps;
    meta->opt = a->opt;
    int G = a->batch * a->micro_batches * r->mesh.dp;
    meta->pos = data_position((DataSet *)&r->train, step, G, 0);
    meta->data_shards = r->data_shards;
    l->ranks = r->comm.world_size;
    l->dp = r->mesh.dp; l->tp = r->mesh.tp; l->pp = r->mesh.pp;
    for (int i = 0; i < l->pp; i++) {
        GPTShard sh;
        setup_stage_layers(a, r->cfg.layers, l->pp, i, &sh);
        l->stage_layers[i] = sh.nlayers;
    }
    l->zero = a->dpc.zero; l->offload = a->dpc.offload; l->sp = a->sp;
    snprintf(l->dp_mode, sizeof l->dp_mode, "%s", a->dpc.mode == DP_PS ? "ps" : "ddp");
    snprintf(l->dtype, sizeof l->dtype, "%s", dt_name(r->dtype));
    snprintf(l->schedule, sizeof l->schedule, "%s", pp_schedule_name(a->schedule));
    l->batch = a->batch; l->seq = a->seq; l->micro_batches = a->micro_batches;
}

/* After every check has passed (a bad-input exit is one line, never a warning and then
 * the error): the warnings, on the first rank only. */
void setup_warnings(const Run *r) {
    const Args *a = &r->a;
    char msg[1024];
    if (r->launch.rank != 0 || a->show_schedule) return;
    if (a->data && a->val && data_overlap(&r->train, &r->val, msg, sizeof msg) > 0)
        fprintf(stderr, "train: warning: %s\n", msg);
    if (a->data && data_bytes_note(&r->train, msg, sizeof msg)) fprintf(stderr, "train: --data: %s\n", msg);
    if (a->val && data_bytes_note(&r->val, msg, sizeof msg)) fprintf(stderr, "train: --val: %s\n", msg);
    if (a->pp > 1 && a->dpc.zero >= 2)
        fprintf(stderr, "train: warning: --zero %d with --pp %d: the articles advise ZeRO-1 with pipelines "
                "(each micro-batch reduces its gradients; the saving over --pp alone is small)\n",
                a->dpc.zero, a->pp);
}
