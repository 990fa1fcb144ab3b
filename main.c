/* main.c: the `train` program: one rank's run, from its layout to its last step.
 *
 * A step, as the articles draw it (hybrid-parallelism.txt; DESIGN.md, "One
 * step, as data flows"): data.c hands each data-parallel rank its
 * micro-batches of the global batch; pp.c walks the pipeline's schedule,
 * running gpt.c's forward and backward over this stage's layers (tp.c's
 * collectives inside Megatron's split linears); dp.c (or zero.c) reduces
 * each gradient bucket over the dp group while backward goes on; zero.c
 * takes the global norm, clips and updates what this rank owns; rank 0
 * prints the step line. One rank is the same code with groups of one.
 *
 * Read it from main() at the bottom: flags (args.c) and every check that
 * needs no rank (setup.c) come first, then the ranks are started
 * (comm_launch.c), each builds its part of the model (run_build), trains
 * (run_train), and finishes (run_finish: validation and HellaSwag, which
 * are score.c's, a sample, --save).
 * What rank 0 prints and draws is runlog.c's.
 */
#define _GNU_SOURCE
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "setup.h"
#include "runlog.h"
#include "score.h"
#include "ckpt.h"
#include "plan.h"
#include "selftest.h"
#include "safe.h"
#include "stop.h"

/* ---- building one rank ------------------------------------------------------ */

/* This rank's threads (pinned with --pin-cores), its device, and the GPU
 * kernels' check against the CPU. */
static void run_open_device(Run *r) {
    Args *a = &r->a;
    char err[512];
    int threads = setup_threads(r);
    int cpus[CPU_SETSIZE];  /* the CPUs this rank may run on, in order */
    int cores = setup_cpus(cpus, CPU_SETSIZE);
    int local = r->launch.local_size > 0 ? r->launch.local_size : 1;
#ifdef _OPENMP
    omp_set_num_threads(threads);
#endif
    if (a->pin_cores && local * threads <= cores) {
        cpu_set_t set;
        CPU_ZERO(&set);
        for (int i = 0; i < threads; i++) CPU_SET(cpus[r->launch.local_rank * threads + i], &set);
        if (sched_setaffinity(0, sizeof set, &set) != 0)
            fprintf(stderr, "train: rank %d: could not pin to cores\n", r->launch.rank);
    }
    int gpu = r->kind == DEV_CUDA ? (r->launch.kind == COMM_LAUNCH_SINGLE ? a->gpu
                                     : r->launch.local_rank % r->gpus) : 0;
    if (dev_open(&r->dev, r->kind, gpu, err, sizeof err) != 0) safe_die_usage("%s", err);
    dev_set_dtype(&r->dev, a->layout.dtype);
    r->dev.atomic_dq = a->atomic_dq;
    /* every kernel against the CPU on a tiny model, before anything is built */
    if (r->kind == DEV_CUDA && !a->no_self_test && selftest_startup(&r->dev, r->launch.rank == 0) != 0)
        exit(1);
}

/* The communicator over every rank and the mesh's dp, tp and pp groups. */
static void run_open_comm(Run *r) {
    Args *a = &r->a;
    char err[512];
    CommBackend backend = a->backend >= 0 ? (CommBackend)a->backend
                                          : comm_default_backend(&r->launch, r->kind, r->gpus);
    if (backend == COMM_SHM && r->kind == DEV_CUDA && r->gpus > 1 && r->launch.world_size > 1 &&
        r->launch.rank == 0)
        fprintf(stderr, "warning: the %d ranks' GPUs exchange through host shared memory%s: slow. %s\n",
                r->launch.world_size, a->backend == COMM_SHM ? " (--backend shm)" : "",
#ifdef USE_NCCL
                "Leave out --backend shm, or give each rank a GPU of its own, for NCCL"
#else
                "This build has no NCCL: see `make`'s first line and docs/gpu.md"
#endif
        );
    r->launch.comm_timeout_s = a->comm_timeout;
    char agree[SETUP_AGREE_ITEMS][SETUP_AGREE_LEN];
    const char *agree_ptr[SETUP_AGREE_ITEMS];
    r->launch.nagree = setup_agreement(r, agree, agree_ptr);
    r->launch.agree = agree_ptr;
    int rc = comm_init(&r->comm, &r->launch, backend, &r->dev, err, sizeof err);
    r->launch.agree = NULL;   /* the items live in this frame */
    if (rc != 0 || comm_mesh_build(&r->comm, a->layout.dp, a->layout.cp, a->layout.tp, a->layout.pp, &r->mesh, err,
                                    sizeof err) != 0) {
        fprintf(stderr, "train: rank %d: %s\n", r->launch.rank, err);
        exit(rc == RDZV_MISMATCH ? EXIT_USAGE : 1);   /* ranks that disagree: bad input */
    }
}

/* This rank's shard of the model: its stage's layers (pp), its slice of
 * heads and columns (tp), from --init, the checkpoint or the seed. */
static void run_build_model(Run *r) {
    Args *a = &r->a;
    char err[512];
    GPTShard shard;
    layout_stage_shard(&a->layout, &r->cfg, r->mesh.pp_rank, r->mesh.tp_rank, &shard);
    gpt_build(&r->model, &r->cfg, &r->dev, &shard);
    r->model.recompute = a->layout.recompute;
    tp_attach(&r->model, &r->tpg, &r->mesh.tp_group, &r->dev, a->layout.sp);
    if (r->mesh.cp > 1) {   /* context parallelism: attention as the cp group's ring; its buffers now, counted */
        cp_init(&r->cp, &r->mesh.cp_group, &r->dev);
        cp_reserve_step(&r->cp, a->layout.batch, a->layout.seq, r->cfg.dim / r->mesh.tp, r->cfg.heads / r->mesh.tp,
                        r->cfg.dim, r->model.has_embed);
        r->model.cp = &r->cp;
    }
    if (a->init && !r->resumed) {
        if (ckpt_load(a->init, &r->model, err, sizeof err) != 0) safe_die_usage("%s", err);
    } else if (!r->resumed) {
        gpt_init_random(&r->model, a->seed);
    }
}

/* One rank, after the ranks are started: device, communicator, model, data
 * parallelism (and ZeRO's shards), the checkpoint's state, the pipeline. */
static void run_build(Run *r) {
    Args *a = &r->a;
    char err[512];
    run_open_device(r);
    run_open_comm(r);
    run_build_model(r);
    if (dp_build(&r->dp, &a->layout, a->bucket_mb, &r->model, &r->comm, &r->mesh, &a->opt, err, sizeof err) != 0)
        safe_die_usage("%s", err);
    double t_load = trace_now_ms();
    if (r->resumed && checkpoint_load(&r->ck, &r->dp.z, &r->comm.world, err, sizeof err) != 0) {
        fprintf(stderr, "train: %s\n", err);
        exit(EXIT_USAGE);
    }
    r->load_ms = trace_now_ms() - t_load;
    r->trace = trace_open(a->trace, r->comm.rank, r->comm.world_size);
    if (pp_build(&r->pp, &r->model, &r->mesh.pp_group, &r->dev, a->layout.schedule, a->layout.micro_batches,
                 a->layout.batch, a->layout.seq / a->layout.cp, r->trace, err, sizeof err) != 0)
        safe_die_usage("%s", err);
    r->inputs = safe_malloc((size_t)a->layout.batch * a->layout.seq * sizeof(int), "a micro-batch's inputs");
    r->targets = safe_malloc((size_t)a->layout.batch * a->layout.seq * sizeof(int), "a micro-batch's targets");
}

static void run_free(Run *r) {
    free(r->inputs);
    free(r->targets);
    pp_free(&r->pp);
    dp_free(&r->dp);
    gpt_free(&r->model);
    cp_free(&r->cp);
    comm_mesh_free(&r->mesh);
    comm_free(&r->comm);
    setup_free(r);
    checkpoint_async_free(&r->ck_async);
    dev_close(&r->dev);
}

/* ---- one step ---------------------------------------------------------------- */

/* What pp_run asks of a step: micro-batch m's tokens, and DP's notice
 * before each backward. */
typedef struct StepCtx { Run *r; int step; } StepCtx;

/* Micro-batch `micro` of this dp rank: sequences of the global batch G = B*M*D
 * from (dp_rank*M + micro)*B on (data.c's order). */
static void step_batch(void *ctx, int micro, GPTActs *a) {
    StepCtx *c = ctx;
    Run *r = c->r;
    int B = r->a.layout.batch, T = r->a.layout.seq, M = r->a.layout.micro_batches, G = B * M * r->mesh.dp;
    int N = r->mesh.cp;
    char err[512];
    if (data_batch(&r->train, c->step, G, (r->mesh.dp_rank * M + micro) * B, B, r->inputs, r->targets, err,
                   sizeof err) != 0)
        safe_die_usage("%s", err);   /* a token beyond the vocabulary, a shard that shrank */
    if (N > 1) cp_local_tokens(r->inputs, r->targets, B, T, N, r->mesh.cp_rank);   /* this rank's chunks (cp.c) */
    gpt_set_batch(&r->model, a, r->inputs, r->targets, B, T / N);
}

static void step_before_backward(void *ctx, int micro, int last) {
    StepCtx *c = ctx;
    dp_micro_batch(&c->r->dp, last);
}

/* Writes buf (this rank's part of the model's layout on its device: the
 * parameters, or the gradients) as the llm.c model file `path` of `flag`
 * (--save, --dump-grads) on rank 0: each rank
 * puts its elements of the whole model in llm.c's order, the tp ranks'
 * slices and the pp stages' layers are summed into one model (they are
 * disjoint; the tied wte comes from the first stage), rank 0 writes.
 * Collective; returns 0 or -1. */
static int write_gathered(Run *r, const float *buf, const char *flag, const char *path) {
    char err[512];
    GPT *m = &r->model;
    size_t total = gpt_total_params(&m->cfg);
    float *host = safe_malloc(m->num_params * sizeof(float), "the parameters");
    float *llmc = safe_malloc(total * sizeof(float), "the model in llm.c's order");
    memset(llmc, 0, total * sizeof(float));
    dev_to_host(m->dev, host, buf, m->num_params * sizeof(float));
    layout_llmc_copy(m, host, llmc, 1);
    comm_all_reduce(&r->mesh.tp_group, NULL, llmc, total, COMM_F32, COMM_SUM);
    comm_all_reduce(&r->mesh.pp_group, NULL, llmc, total, COMM_F32, COMM_SUM);
    int rc = 0;
    if (r->comm.rank == 0) {
        rc = ckpt_write(path, &m->cfg, llmc, err, sizeof err);
        if (rc) fprintf(stderr, "train: %s: model file not written: %s\n", flag, err);
        else printf("saved model file %s\n", path);
    }
    free(host);
    free(llmc);
    return rc;
}

/* One optimizer step over the global batch of `step` through the pipeline's
 * schedule. Returns the global mean loss and leaves the pre-clip gradient
 * norm and the lr used. On a GPU the host waits for the device once: the
 * norm's read-back before the clip brings the loss with it (the test:
 * test/test_budget_emu.sh), and the step returns with the optimizer queued. */
static double train_step(Run *r, int step, double *norm, float *lr) {
    Args *a = &r->a;
    int B = a->layout.batch, T = a->layout.seq, M = a->layout.micro_batches, D = r->mesh.dp;
    float dloss = 1.0f / ((float)B * T * M * D);  /* the sum over ranks is the global mean */
    StepCtx ctx = {r, step};
    PPCallbacks cb = {&ctx, step_batch, step_before_backward};
    int gpu = r->dev.kind == DEV_CUDA;
    dp_step_begin(&r->dp);
    if (gpu) dev_loss_defer(&r->dev);
    double loss = pp_run(&r->pp, dloss, &cb) / M;   /* 0 on a GPU: the loss is on the device */
    if (gpu) score_loss_queue(r, M);
    if (step == 0 && a->dump_grads) {
        comm_wait(&r->comm, &r->dev);  /* the bucket all-reduces are done */
        write_gathered(r, r->model.grads, "--dump-grads", a->dump_grads);
    }
    *lr = optim_lr(&a->opt, step);
    trace_begin(r->trace, "optimizer", "optimizer");
    *norm = dp_step_end(&r->dp, *lr);
    trace_end(r->trace);
    return gpu ? score_loss_read(r) : score_share_loss(r, loss);
}

/* ---- sampling, saving (evaluation is score.c's) ---------------------------- */

static uint32_t rng_u32(uint64_t *s) {
    *s ^= *s >> 12; *s ^= *s << 25; *s ^= *s >> 27;
    return (uint32_t)((*s * 0x2545F4914F6CDD1DULL) >> 32);
}

/* The last stage's next token from the logits of position pos (every tp
 * rank's slice gathered into logits [Vp]; with cp, the row of the rank
 * holding pos, sent to the others so all draw alike), at the temperature. */
static int sample_next(Run *r, GPTActs *acts, int pos, float *logits, uint16_t *row16, uint64_t *rng) {
    GPT *m = &r->model;
    int V = m->cfg.vocab, Vl = m->cfg.padded_vocab / m->tp, owner = 0, at = pos;
    if (r->mesh.cp > 1) cp_locate(r->mesh.cp, r->a.layout.seq, pos, &owner, &at);
    float *mine = logits + (size_t)m->tp_rank * Vl;   /* [Vl] this rank's slice */
    const char *row = (const char *)acts->logits + (size_t)at * Vl * m->esz;
    if (r->mesh.cp_rank != owner) {
    } else if (m->dev->dtype == DT_BF16) {
        dev_to_host(m->dev, row16, row, (size_t)Vl * 2);
        for (int v = 0; v < Vl; v++) mine[v] = bf16_to_f32(row16[v]);
    } else {
        dev_to_host(m->dev, mine, row, (size_t)Vl * 4);
    }
    if (m->tp > 1) comm_all_gather(&r->mesh.tp_group, NULL, logits, mine, m->cfg.padded_vocab, COMM_F32);
    if (r->mesh.cp > 1) comm_broadcast(&r->mesh.cp_group, NULL, logits, m->cfg.padded_vocab, COMM_F32, owner);
    float maxv = -INFINITY;
    for (int v = 0; v < V; v++) if (logits[v] > maxv) maxv = logits[v];
    double sum = 0.0;
    for (int v = 0; v < V; v++) sum += exp((logits[v] - maxv) / r->a.temperature);
    double u = (rng_u32(rng) / 4294967296.0) * sum, acc = 0.0;
    for (int v = 0; v < V; v++) {
        acc += exp((logits[v] - maxv) / r->a.temperature);
        if (acc > u) return v;
    }
    return V - 1;
}

/* Generates n tokens with a sliding window of T, starting from one token
 * (a newline for byte data, GPT-2's <|endoftext|> for token data), and
 * prints them: as text for bytes, as ids otherwise. The window always runs
 * T positions (padded after the context, which causal attention never
 * lets reach the position sampled), so every layout splits it the same way.
 * Every rank takes part (ZeRO-3's gathers are collective). */
static void sample(Run *r, int n) {
    GPT *m = &r->model;
    int say = r->comm.rank == 0, T = r->a.layout.seq, V = m->cfg.vocab, N = r->mesh.cp;
    int *ctx = safe_malloc((size_t)(n + 1) * sizeof(int), "the sample");          /* [n+1] */
    int *window = safe_calloc((size_t)T, sizeof(int), "the sample's window");       /* [T] */
    float *logits = safe_malloc((size_t)m->cfg.padded_vocab * sizeof(float), "a row of logits");  /* [Vp] */
    uint16_t *row16 = safe_malloc((size_t)m->cfg.padded_vocab / m->tp * 2, "a bf16 row");        /* [Vl] */
    uint64_t rng = r->a.seed * 2654435761ULL + 1;
    ctx[0] = r->train.is_bytes ? '\n' : (V > 50256 ? 50256 : 0);
    if (say) printf("sample (%d tokens, temperature %.2f):\n", n, r->a.temperature);
    if (say && r->train.is_bytes) putchar(ctx[0]);
    for (int i = 1; i <= n; i++) {
        int start = i > T ? i - T : 0, len = i - start;
        memcpy(window, ctx + start, (size_t)len * sizeof(int));
        GPTActs *acts = r->pp.acts[0];
        if (N > 1) cp_local_tokens(window, NULL, 1, T, N, r->mesh.cp_rank);   /* this rank's chunks */
        gpt_set_batch(m, acts, window, NULL, 1, T / N);
        pp_forward(&r->pp, acts, 1, T / N, 0);
        int next = m->has_head ? sample_next(r, acts, len - 1, logits, row16, &rng) : V - 1;
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

/* --save: the parameters (ZeRO-3 gathers them first). Collective. */
static int save_model(Run *r) {
    float *full = dp_full_params(&r->dp);
    int rc = write_gathered(r, full, "--save", r->a.save);
    dp_full_params_free(&r->dp, full);
    return rc;
}

/* Writes checkpoint_dir/step-<step>: every rank what it owns (collective).
 * background: with --checkpoint-async, begin it and return (run_poll_save
 * publishes it at a later step); else write and publish it now, after any
 * save in flight. Returns 0 or -1. */
static int save_checkpoint(Run *r, long step, int background, char *path, size_t pathlen) {
    Args *a = &r->a;
    char err[512];
    CheckpointMeta meta;
    setup_checkpoint_meta(r, step, &meta);
    double t0 = trace_now_ms();
    int rc = checkpoint_save_poll(&r->ck_async, &r->comm.world, 1, err, sizeof err) < 0 ? -1
           : background ? checkpoint_save_begin(&r->ck_async, a->checkpoint_dir, &meta, a->keep, &r->dp.z,
                                                &r->comm.world, path, pathlen, err, sizeof err)
                        : checkpoint_save(a->checkpoint_dir, &meta, a->keep, &r->dp.z, &r->comm.world, path,
                                          pathlen, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "train: rank %d: %s\n", r->comm.rank, err);
        return -1;
    }
    if (r->comm.rank == 0)
        printf("checkpoint %s (%.0f ms%s)\n", path, trace_now_ms() - t0, background ? ", writing in the background" : "");
    return 0;
}

/* --checkpoint-async: publishes the save in flight once every rank has written its shard. */
static void run_poll_save(Run *r) {
    char err[512];
    int rc = checkpoint_save_poll(&r->ck_async, &r->comm.world, 0, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "train: rank %d: %s\n", r->comm.rank, err);
        exit(1);
    }
    if (rc > 0 && r->comm.rank == 0) printf("checkpoint %s/step-%ld published\n", r->a.checkpoint_dir, r->ck_async.meta.step);
}

/* ---- the run ------------------------------------------------------------------- */

/* Steps s0 .. --steps, each printed by rank 0; evaluation (score.c) every --val-every,
 * a checkpoint every --checkpoint-every. Returns 0 after the last step, or
 * EXIT_STOPPED when a signal or --time-limit stopped the run early (its
 * checkpoint written and said). */
static int run_train(Run *r, RunLog *log, StopClock *clock, int s0, char *ckpath, size_t cklen) {
    Args *a = &r->a;
    int rank0 = r->comm.rank == 0;
    int tokens_per_step = a->layout.batch * a->layout.seq * a->layout.micro_batches * r->mesh.dp;
    double peak = setup_device_peak(r) * 1e12;
    for (int s = s0; s < a->steps; s++) {
        double t0 = trace_now_ms(), norm;
        float lr;
        char range[32];
        snprintf(range, sizeof range, "step %d", s + 1);
        dev_range_push(&r->dev, range);   /* nsys's and the emulation's step (EMU_STEP_COUNTS) */
        /* no wait for the device here: its step ends with the optimizer queued, and the
         * host goes on to the next batch (ms is the time between read-backs) */
        double loss = train_step(r, s, &norm, &lr);
        double ms = trace_now_ms() - t0, tok_s = tokens_per_step / (ms / 1e3);
        if (ms > clock->step_ms) clock->step_ms = ms;
        if (rank0) {
            printf("step %d/%d | loss %#.7g | norm %.4f | lr %.3e | %.1f ms | %.0f tok/s", s + 1,
                   a->steps, loss, norm, lr, ms, tok_s);
            if (peak > 0) printf(" | mfu %.1f%%", 100.0 * tok_s * runlog_flops_per_token(r) / (peak * r->comm.world_size));
            runlog_step(log, s + 1, loss, norm, lr, ms);
            printf("\n");
        }
        fflush(stdout);
        dev_range_pop(&r->dev);
        stop_if_diverged(r->comm.rank, s + 1, loss, norm, a->checkpoint_dir);
        if (a->val_every && (s + 1) % a->val_every == 0 && s + 1 < a->steps) score_evaluate(r, log, s + 1);
        int who = 0, stop = s + 1 < a->steps ? stop_agreed(&r->comm.world, r->launch.graceful_stop, clock, trace_now_ms(), s + 1 - s0, &who) : 0;
        int due = a->checkpoint_every && (s + 1) % a->checkpoint_every == 0 && s + 1 < a->steps;
        if (r->ck_async.active) run_poll_save(r);
        if (a->checkpoint_dir && (due || stop)) {
            double t_save = trace_now_ms();
            if (save_checkpoint(r, s + 1, a->checkpoint_async && !stop, ckpath, cklen) != 0) exit(1);
            clock->save_ms = trace_now_ms() - t_save;
        }
        if (stop) {
            if (rank0 && stop > 0) printf("stopped by signal %d after step %d (%s, on rank %d)\n", stop, s + 1, strsignal(stop), who);
            if (rank0 && stop < 0) printf("stopped by --time-limit %g min after step %d\n", a->time_limit_min, s + 1);
            if (rank0) printf(a->checkpoint_dir ? "stopped at step %d: checkpoint %s; the same command continues\n"
                              : "stopped at step %d: nothing saved (no --checkpoint-dir%s); the same command starts over\n",
                              s + 1, a->checkpoint_dir ? ckpath : "");
            return EXIT_STOPPED;
        }
    }
    return 0;
}

/* After the last step: the final checkpoint, validation and HellaSwag, a sample, --save,
 * the summary, comm stats and the trace. Returns the exit status: 1 on every rank when
 * --save, or a write of --log, --plot or --trace on any rank, failed (each said when it
 * happened), else 0. */
static int run_finish(Run *r, RunLog *log, int s0, char *ckpath, size_t cklen) {
    Args *a = &r->a;
    int rank0 = r->comm.rank == 0;
    if (a->checkpoint_dir && s0 < a->steps && save_checkpoint(r, a->steps, 0, ckpath, cklen) != 0) exit(1);
    score_evaluate(r, log, a->steps);   /* --val, --eval-hellaswag */
    if (a->sample) sample(r, a->sample);
    int32_t failed = a->save ? save_model(r) != 0 : 0;
    if (rank0)
        runlog_summary(log, a->checkpoint_dir && s0 < a->steps ? ckpath : NULL, failed ? NULL : a->save,
                       setup_device_peak(r) * 1e12, runlog_flops_per_token(r));
    runlog_transient(r);
    if (a->comm_stats) {
        printf("comm stats, rank %d (bus bytes, nccl-tests convention):\n", r->comm.rank);
        comm_stats_print(&r->comm, stdout);
    }
    fflush(stdout);
    if (a->trace) {   /* every rank, even one whose part could not be created (trace_open said so) */
        if (!r->trace || trace_close(r->trace) != 0) failed = 1;
        r->trace = NULL;
        comm_barrier(&r->comm.world);
        if (rank0 && trace_merge(a->trace, r->comm.world_size) >= 0) printf("trace: %s\n", a->trace);
        else if (rank0) failed = 1;
    }
    if (rank0 && runlog_write_failed(log)) failed = 1;
    if (r->comm.world_size > 1) comm_all_reduce(&r->comm.world, NULL, &failed, 1, COMM_I32, COMM_MAX);
    return failed ? 1 : 0;
}

int main(int argc, char **argv) {
    Run r;
    char err[512], ckpath[4608];
    memset(&r, 0, sizeof r);
    r.argc = argc;
    r.argv = argv;
    StopClock clock = {.t0_ms = trace_now_ms()};
    signal(SIGXFSZ, SIG_IGN);   /* past a file-size limit (ulimit -f) a write fails (EFBIG), said as a full disk is */
    for (int i = 1; i < argc; i++)   /* the planner runs no model: plan.c */
        if (!strcmp(argv[i], "--plan")) return plan_main(argc, argv);
    args_parse_or_exit(&r.a, argc, argv);
    clock.limit_ms = r.a.time_limit_min * 60e3;
    setup_check(&r);
    /* Stops are agreed on (every rank after the same step) when there is a checkpoint to write
     * or a clock to watch; else several ranks are simply stopped by the launcher, as before. */
    r.launch.graceful_stop = r.a.checkpoint_dir || r.a.time_limit_min > 0;
    if (r.launch.graceful_stop || r.launch.world_size <= 1) stop_signals_install(1);   /* a stop asked now comes after step one */
    if (r.a.show_schedule) return setup_show_schedule(&r.a);
    if (r.a.plan_layout) {
        int rc = setup_plan_layout(&r);
        setup_free(&r);
        return rc;
    }
    /* a checkpoint directory belongs to one run: another's is refused before anything is written to it */
    if (r.a.checkpoint_dir && !r.a.resume && checkpoint_dir_used(r.a.checkpoint_dir))
        safe_die_usage("--checkpoint-dir %s holds another run's checkpoints: add --resume to continue it, or name "
                        "another directory", r.a.checkpoint_dir);
    /* one run a checkpoint directory: rank 0 holds the lock (a --ranks job's supervisor, for all) */
    if (r.a.checkpoint_dir && r.launch.rank == 0 && stop_lock(r.a.checkpoint_dir, err, sizeof err) < 0)
        safe_die_usage("%s", err);
    setup_warnings(&r);   /* every check has passed */
    if (comm_launch_start(&r.launch, err, sizeof err) != 0) {
        fprintf(stderr, "train: %s\n", err);
        return 1;
    }
    if (r.launch.kind == COMM_LAUNCH_FORK && r.launch.graceful_stop) stop_signals_install(0);   /* the supervisor escalates */
    run_build(&r);
    int s0 = r.resumed ? (int)r.ck.meta.step : 0;
    runlog_resume(&r, s0);
    if (r.comm.rank == 0) runlog_header(&r);
    runlog_memory(&r);
    fflush(stdout);
    RunLog log;
    runlog_init(&log, &r, s0);
    int rc = run_train(&r, &log, &clock, s0, ckpath, sizeof ckpath);
    if (rc == 0) rc = run_finish(&r, &log, s0, ckpath, sizeof ckpath);
    runlog_free(&log);
    fflush(stdout);
    run_free(&r);
    return rc;
}
