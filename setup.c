/* setup.c: everything `train` checks before a rank exists, and the modes
 * that only explain.
 *
 * From the parsed flags (args.c) to a run that can start: the model's shape
 * (flags, --init or the checkpoint), the data, the launch (how many ranks,
 * from --ranks or srun/torchrun), the layout (--layout auto's choice or the
 * flags', its omitted mesh dimension inferred, then layout.c's rules), the
 * device, the dtype and the backend. Nothing is allocated for
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/types.h>
#include <sys/wait.h>
#include "setup.h"
#include "ckpt.h"
#include "plan.h"
#include "plot.h"
#include "safe.h"
#include "rendezvous.h"
#include "version.h"

/* Loads a data file and checks it against the model. Exits 2 on bad input. */
static void load_data(DataSet *ds, const char *path, const Args *a, int vocab) {
    char err[512];
    if (data_load(ds, path, err, sizeof err) != 0 ||
        data_prepare(ds, path, a->layout.seq, a->shuffle, a->seed, err, sizeof err) != 0)
        safe_die_usage("%s", err);
    if (data_check_vocab(ds, vocab, err, sizeof err) != 0) safe_die_usage("%s", err);
}

/* --eval-hellaswag: the file read as hostile input (eval.c) and every
 * example fitting a row of --seq tokens, refused now rather than mid-run.
 * Exits 2 on bad input. */
static void load_hellaswag(EvalSet *es, const char *path, int seq, int vocab) {
    char err[512];
    if (eval_load(es, path, vocab, err, sizeof err) != 0) safe_die_usage("%s", err);
    if (es->max_tokens <= seq) return;
    for (int i = 0; i < es->n; i++)
        if (eval_example_tokens(es, i) > seq)
            safe_die_usage("%s: example %d needs %d tokens (context and longest completion), more than --seq %d",
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
            safe_die_usage("%s %d, but %s %s %s %d", names[i], flag[i], what,
                            strncmp(what, "--model", 7) ? "holds" : "has", names[i] + 2, file[i]);
}

/* --resume: whether DIR holds a checkpoint to continue. Returns 1 (opened
 * into r->ck: latest, or the newest intact one when latest is damaged, with
 * one line naming it), 0 when DIR holds none at all (no latest, no step
 * directories: a fresh start), and exits 2 when none passes its checks. */
static int open_checkpoint(Run *r) {
    char err[512];
    const char *dir = r->a.checkpoint_dir;
    if (checkpoint_open(dir, &r->ck, err, sizeof err) == 0) return 1;   /* runlog_resume says what it passed over */
    char name[256];
    if (checkpoint_latest(dir, name, sizeof name) != 0 && !checkpoint_any_step(dir)) return 0;
    safe_die_usage("%s", err);
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
    if (r->a.layout.seq != m->layout.seq)
        safe_die_usage("--seq %d, but %s was written with --seq %d (the data order would move)", r->a.layout.seq, what,
                        m->layout.seq);
    if (r->a.seed != m->seed)
        safe_die_usage("--seed %llu, but %s was written with --seed %llu (the data order would move)",
                        (unsigned long long)r->a.seed, what, (unsigned long long)m->seed);
    say_schedule_change(&r->a.opt, &m->opt, r->ck.dir);
    char msg[1024];
    if (m->data_shards && r->a.data && data_compare(m->data_shards, &r->train, msg, sizeof msg) != 0)
        printf("resume: the data changed since %s: %s\n", r->ck.dir, msg);
    if (r->a.shuffle != m->shuffle)
        safe_die_usage("%s, but %s was written %s (the data order would move)",
                        r->a.shuffle ? "--shuffle" : "no --shuffle", what, m->shuffle ? "with --shuffle" : "without it");
}

/* After the mesh is known: the global batch B x M x dp must be the
 * checkpoint's, or every later step would take other sequences. */
static void check_resume_batch(Run *r) {
    const Layout *now = &r->a.layout, *then = &r->ck.meta.layout;
    long g_now = (long)now->batch * now->micro_batches * now->dp, g_then = (long)then->batch * then->micro_batches * then->dp;
    if (g_now != g_then)
        safe_die_usage("a global batch of %ld sequences (--batch %d x --micro-batches %d x dp %d), but the checkpoint "
                       "%s was written with %ld (%d x %d x %d): the data order would move", g_now, now->batch,
                       now->micro_batches, now->dp, r->ck.dir, g_then, then->batch, then->micro_batches, then->dp);
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
 * --micro-batches x ranks), taken as the run's layout and printed. */
static void choose_layout(Run *r, const GPTConfig *cfg) {
    Args *a = &r->a;
    Layout *l = &a->layout;
    int world = r->launch.world_size > 0 ? r->launch.world_size : 1;
    int gpus = r->launch.kind == COMM_LAUNCH_FORK ? probe_gpus() : dev_gpu_count();
    int cuda = a->device ? !strcmp(a->device, "cuda") : gpus > 0;
    int G = a->global_batch ? a->global_batch : l->batch * l->micro_batches * world;
    if (l->dp || l->tp || l->pp || l->nstage_layers)
        safe_die_usage("--layout auto chooses --dp, --tp, --pp and the stages itself: give none of them");
    if (l->dp_mode == DP_PS) safe_die_usage("--layout auto: the planner does not model --dp-mode ps");
    if (l->cp > 1) safe_die_usage("--layout auto chooses --cp itself (on CPU ranks): give no --cp");
    PlanCluster c = host_cluster(r, world, cuda);
    PlanSearch ps;
    /* cp only for CPU ranks: the GPU's ring (in bf16 on the flash kernels, else plain ones) has not
       been timed on a GPU yet, so it is not a layout to choose for speed */
    if (plan_search(cfg, G, l->seq, &c, a->all_schedules, c.cpu, &ps) != 0) safe_die_usage("--layout auto: out of memory");
    if (!ps.nfit) {
        plan_search_free(&ps);
        safe_die_usage("--layout auto: no layout of %d ranks fits a global batch of %d sequences of %d tokens", world,
                       G, l->seq);
    }
    const PlanResult *b = &ps.fit[0];
    *l = b->l;   /* the dtype is still the flag's to say (check_device) */
    char virt[32] = "", cp[24] = "";
    if (l->virtual_chunks > 1) snprintf(virt, sizeof virt, " --virtual %d", l->virtual_chunks);
    if (l->cp > 1) snprintf(cp, sizeof cp, " --cp %d", l->cp);
    printf("layout auto: --dp %d%s --tp %d --pp %d --zero %d --micro-batches %d --batch %d%s%s%s --schedule %s%s "
           "(planner: %.3g GB a rank, step %.3g s, on %s)\n", l->dp, cp, l->tp, l->pp, l->zero, l->micro_batches,
           l->batch, l->offload ? " --offload" : "", layout_recompute_flag(l->recompute), l->sp ? " --sp" : "",
           pp_schedule_name(l->schedule), virt, b->mem / 1e9, b->step,
           c.cpu ? "CPU ranks" : "GPUs taken for " PLAN_DEFAULT_GPU "s, 8 a node");
    fflush(stdout);
    plan_search_free(&ps);
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
        if (outs[i][1] && safe_check_output(outs[i][0], outs[i][1], err, sizeof err) != 0) safe_die_usage("%s", err);
    size_t rows;   /* [B,T] rows of every activation: bounded before any input is read */
    if (safe_mul((size_t)a->layout.batch, (size_t)a->layout.seq, &rows) != 0 || rows > SAFE_MAX_ROWS)
        safe_die_usage("--batch %d x --seq %d = %zu tokens a micro-batch, more than %d", a->layout.batch, a->layout.seq, rows,
                        SAFE_MAX_ROWS);
}

/* The model: the checkpoint's (--resume), the file's (--init), or the
 * flags' with defaults; then the data checked against it. */
static void check_model_and_data(Run *r) {
    Args *a = &r->a;
    char err[512];
    GPTConfig cfg = a->model;
    DataSet *tr = &r->train;
    if (a->data && data_load(tr, a->data, err, sizeof err) != 0) safe_die_usage("%s", err);
    if (a->model_preset) {   /* --model: the flags given must agree; it fills the rest */
        GPTConfig preset;
        char what[128];
        if (gpt_preset(a->model_preset, &preset) != 0)
            safe_die_usage("--model %s: no such model (%s)", a->model_preset, GPT_PRESETS);
        snprintf(what, sizeof what, "--model %s", a->model_preset);
        check_same_model(&a->model, &preset, what);
        cfg = a->model = preset;
    }
    r->resumed = a->resume && open_checkpoint(r);
    if (r->resumed) {
        check_resume(r, &cfg);   /* --init is not read: the checkpoint holds the model */
    } else if (a->init) {
        if (ckpt_read_config(a->init, &cfg, err, sizeof err) != 0) safe_die_usage("%s", err);
        check_same_model(&a->model, &cfg, a->init);
    } else {
        if (!cfg.layers) cfg.layers = 4;
        if (!cfg.heads) cfg.heads = 4;
        if (!cfg.dim) cfg.dim = 128;
        if (!cfg.max_seq) cfg.max_seq = a->layout.seq > 256 ? a->layout.seq : 256;
        if (!cfg.vocab) cfg.vocab = a->data && tr->is_bytes ? 256 : 50257;   /* no data: GPT-2's */
        if (gpt_config_check(&cfg, err, sizeof err) != 0) safe_die_usage("%s", err);
    }
    if (a->layout.seq > cfg.max_seq)
        safe_die_usage("--seq %d exceeds the model's max sequence length %d", a->layout.seq, cfg.max_seq);
    if (a->data && data_prepare(tr, a->data, a->layout.seq, a->shuffle, a->seed, err, sizeof err) != 0)
        safe_die_usage("%s", err);
    if (a->data && data_check_vocab(tr, cfg.vocab, err, sizeof err) != 0) safe_die_usage("%s", err);
    if (a->val) load_data(&r->val, a->val, a, cfg.vocab);
    if (a->data && !(r->data_shards = data_describe(tr))) safe_die_usage("out of memory describing the data");
    if (a->eval_hellaswag) load_hellaswag(&r->hellaswag, a->eval_hellaswag, a->layout.seq, cfg.vocab);
    if (a->tokenizer && data_tokenizer_load(&r->tok, a->tokenizer, err, sizeof err) != 0)
        safe_die_usage("%s", err);
    r->cfg = cfg;
}

/* The layout: the launch (how many ranks), --layout auto's choice, the
 * mesh's omitted dimension inferred, then every rule (layout_check). */
static void check_layout(Run *r) {
    Args *a = &r->a;
    Layout *l = &a->layout;
    char err[512];
    if (comm_launch_plan(a->ranks, &r->launch, err, sizeof err) != 0) safe_die_usage("%s", err);
    if (a->all_schedules && !a->layout_auto) safe_die_usage("--all-schedules widens --layout auto's search: give --layout auto");
    if (a->layout_auto) choose_layout(r, &r->cfg);
    if (layout_infer_mesh(l, r->launch.world_size, err, sizeof err) != 0 ||
        layout_check(l, &r->cfg, r->launch.world_size, err, sizeof err) != 0)
        safe_die_usage("%s", err);
}

/* The device, the dtype and the backend's own limits (run_build picks the same backend). */
static void check_device(Run *r) {
    Args *a = &r->a;
    r->gpus = r->launch.kind == COMM_LAUNCH_FORK ? probe_gpus() : dev_gpu_count();
    r->kind = DEV_CPU;
    if (a->device ? !strcmp(a->device, "cuda") : r->gpus > 0) r->kind = DEV_CUDA;
    if (r->kind == DEV_CUDA && r->gpus == 0)
#ifdef USE_CUDA
        safe_die_usage("--device cuda: no CUDA GPU is visible");
#else
        safe_die_usage("--device cuda: this build has no CUDA (nvcc was not found at build time)");
#endif
    CommBackend backend = a->backend >= 0 ? (CommBackend)a->backend
                                          : comm_default_backend(&r->launch, r->kind, r->gpus);
    if (backend == COMM_SHM && r->launch.world_size > COMM_MAX_RANKS)
        safe_die_usage("%s started %d ranks: the shared-memory backend takes at most %d ranks%s", r->launch.source,
                        r->launch.world_size, COMM_MAX_RANKS, r->kind == DEV_CUDA ? "" : " (NCCL needs --device cuda)");
#ifndef USE_NCCL
    if (backend == COMM_NCCL) safe_die_usage("--backend nccl: this build has no NCCL (nccl.h was not found at build time)");
#endif
    if (backend == COMM_NCCL && r->kind != DEV_CUDA) safe_die_usage("--backend nccl needs --device cuda");
    a->layout.dtype = a->dtype ? (strcmp(a->dtype, "bf16") ? DT_F32 : DT_BF16)
                               : (r->kind == DEV_CUDA ? DT_BF16 : DT_F32);
    /* context parallelism's ring (cp.c): on the CPU in float32, on a GPU in float32 or bf16 (kernels.cu) */
    if (a->layout.cp > 1 && r->kind != DEV_CUDA && a->layout.dtype != DT_F32)
        safe_die_usage("--cp %d on the CPU runs in float32 (--dtype fp32); bf16 with --cp runs on a GPU "
                       "(--device cuda)", a->layout.cp);
}

/* --show-schedule: P from --pp (or --ranks / (dp x tp)), and the rules
 * that need no model. */
static void check_schedule_only(Args *a) {
    char err[512];
    Layout *l = &a->layout;
    int world = a->ranks ? a->ranks : (l->dp ? l->dp : 1) * l->cp * (l->tp ? l->tp : 1) * (l->pp ? l->pp : 1);
    if (layout_infer_mesh(l, world, err, sizeof err) != 0 ||
        layout_check(l, NULL, world, err, sizeof err) != 0)
        safe_die_usage("%s", err);
}

/* --check-data: every token of every shard of --data and --val read and
 * checked against the vocabulary; one line each, then exit (0, or 2). */
static void check_data_only(Run *r) {
    char err[512];
    DataSet *sets[2] = {&r->train, r->a.val ? &r->val : NULL};
    const char *names[2] = {r->a.data, r->a.val};
    for (int i = 0; i < 2 && sets[i]; i++) {
        int max = -1;
        if (data_scan(sets[i], r->cfg.vocab, &max, err, sizeof err) != 0) safe_die_usage("%s", err);
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
    check_layout(r);
    check_device(r);
    if (r->resumed) check_resume_batch(r);
}

/* --plan-layout: what the planner predicts for this very layout, rank by
 * rank, in the units of the memory line and --comm-stats. */
int setup_plan_layout(Run *r) {
    const Layout *l = &r->a.layout;
    PlanCluster c = host_cluster(r, l->dp * l->cp * l->tp * l->pp, r->kind == DEV_CUDA);
    if (l->dp_mode == DP_PS) safe_die_usage("--plan-layout: the planner does not model --dp-mode ps");
    if (plan_layout_print(stdout, &r->cfg, &c, l) != 0) safe_die_usage("--plan-layout: the model does not divide that way");
    return 0;
}

/* --show-schedule: the text figure (pp_show), then the same timeline as SVG. */
int setup_show_schedule(const Args *a) {
    const char *path = a->schedule_svg ? a->schedule_svg : "schedule.svg";
    char err[512], formula[96];
    PPTimeline tl;
    const Layout *l = &a->layout;
    int V = l->virtual_chunks;
    if (l->cp > 1 && l->pp == 1) {   /* context parallelism's ring instead of a pipeline */
        cp_show(stdout, l->cp, l->seq);
        int rc = plot_ring_svg(path, l->cp, l->seq, err, sizeof err);
        if (rc != 0) fprintf(stderr, "train: %s\n", err);
        else printf("ring drawn in %s\n", path);
        return rc ? 1 : 0;
    }
    pp_show(stdout, l->schedule, l->pp, l->micro_batches, V);
    if (pp_bubble_text(l->schedule, l->pp, l->micro_batches, V, formula, sizeof formula) != 0 ||
        pp_timeline(l->schedule, l->pp, l->micro_batches, V, &tl) != 0) {
        fprintf(stderr, "train: --show-schedule: out of memory\n");
        return 1;
    }
    int rc = plot_schedule_svg(path, &tl, pp_schedule_name(l->schedule), formula, err, sizeof err);
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
    meta->cfg = r->cfg;
    meta->step = step;
    meta->adam_t = r->dp.z.adam.t;
    meta->seed = a->seed;
    meta->shuffle = a->shuffle;
    meta->steps = a->steps;
    meta->opt = a->opt;
    int G = a->layout.batch * a->layout.micro_batches * r->mesh.dp;
    meta->pos = data_position((DataSet *)&r->train, step, G, 0);
    meta->data_shards = r->data_shards;
    /* the run's layout, as the mesh shaped it; the manifest records one range a stage (its chunks' layers together) */
    Layout *l = &meta->layout;
    *l = a->layout;
    l->dp = r->mesh.dp; l->tp = r->mesh.tp; l->pp = r->mesh.pp;
    l->virtual_chunks = 1;
    l->nstage_layers = l->pp < COMM_MAX_RANKS ? l->pp : COMM_MAX_RANKS;
    for (int i = 0; i < l->nstage_layers; i++) {
        GPTShard sh;
        layout_stage_shard(&a->layout, &r->cfg, i, 0, &sh);
        l->stage_layers[i] = sh.nlayers;
    }
}

int setup_agreement(const Run *r, char item[][SETUP_AGREE_LEN], const char **ptr) {
    const Args *a = &r->a;
    const Layout *l = &a->layout;
    const OptConfig *o = &a->opt;
    unsigned char h[RDZV_DIGEST_BYTES];
    const char *sh = r->data_shards ? r->data_shards : "";
    rdzv_sha256(sh, strlen(sh), h);
    char st[200] = "";   /* --stage-layers */
    for (int i = 0, k = 0; i < l->nstage_layers && k < 180; i++)
        k += snprintf(st + k, sizeof st - (size_t)k, " %d", l->stage_layers[i]);
    int n = 0;
    snprintf(item[n++], SETUP_AGREE_LEN, "world=%d", r->launch.world_size);
    snprintf(item[n++], SETUP_AGREE_LEN, "layers=%d", r->cfg.layers);
    snprintf(item[n++], SETUP_AGREE_LEN, "heads=%d", r->cfg.heads);
    snprintf(item[n++], SETUP_AGREE_LEN, "dim=%d", r->cfg.dim);
    snprintf(item[n++], SETUP_AGREE_LEN, "vocab=%d max-seq %d", r->cfg.vocab, r->cfg.max_seq);
    snprintf(item[n++], SETUP_AGREE_LEN, "layout=dp %d cp %d tp %d pp %d virtual %d sp %d dp-mode %d zero %d offload %d "
             "schedule %s micro-batches %d recompute %d stage-layers%s", l->dp, l->cp, l->tp, l->pp, l->virtual_chunks,
             l->sp, (int)l->dp_mode, l->zero, l->offload, pp_schedule_name(l->schedule), l->micro_batches,
             l->recompute, st);
    snprintf(item[n++], SETUP_AGREE_LEN, "batch=%d seq %d dtype %s", l->batch, l->seq, dt_name(l->dtype));
    snprintf(item[n++], SETUP_AGREE_LEN, "optimizer=lr %g %g warmup %d cosine %d steps %d betas %g %g eps %g wd %g "
             "clip %g seed %llu", o->lr, o->lr_min, o->warmup, o->cosine, o->steps, o->beta1, o->beta2, o->eps, o->wd,
             o->clip, (unsigned long long)a->seed);
    snprintf(item[n++], SETUP_AGREE_LEN, "data=%.200s (shards %02x%02x%02x%02x) val %.200s shuffle %d",
             a->data ? a->data : "", h[0], h[1], h[2], h[3], a->val ? a->val : "", a->shuffle);
    snprintf(item[n++], SETUP_AGREE_LEN, "version=%s", version_source());
    for (int i = 0; i < n; i++) ptr[i] = item[i];
    return n;
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
    if (a->layout.pp > 1 && a->layout.zero >= 2)
        fprintf(stderr, "train: warning: --zero %d with --pp %d: the articles advise ZeRO-1 with pipelines "
                "(each micro-batch reduces its gradients; the saving over --pp alone is small)\n",
                a->layout.zero, a->layout.pp);
}

void setup_free(Run *r) {
    data_free(&r->train);
    free(r->data_shards);
    r->data_shards = NULL;
    data_free(&r->val);
    data_tokenizer_free(&r->tok);
    eval_free(&r->hellaswag);
    checkpoint_free(&r->ck);
}
