/* runlog.c: what rank 0 prints and draws of a run (runlog.h).
 *
 * The step line's tail (elapsed, ETA), the validation loss, the summary
 * and --plot's SVG, rewritten atomically every few steps so it can be
 * opened mid-run. Memory lines compare what each rank holds with the ZeRO
 * paper's formula (hybrid-parallelism.txt, ZeRO's memory accounting).
 *
 * --log FILE is the run's record that outlives the process: JSON lines, one
 * object a line, flushed as written (a kill -9 loses at most a line):
 *   {"type":"run","version":...,"resume_step":S,"argv":[...],"layout":{...}}  at each start
 *   {"type":"step","step":N,"loss":..,"norm":..,"lr":..,"ms":..,"tok_s":..,"tokens":..}
 *   {"type":"val","step":N,"loss":..}
 *   {"type":"hellaswag","step":N,"correct":C,"total":T,"acc_norm":P}
 * A resumed run (from step S) first cuts the file back to its records up to
 * step S, so no step appears twice, and draws them into --plot: the plot of
 * a run stopped and resumed five times is the whole run.
 *
 * A write of --log or --plot that fails (a full disk, a file-size limit) is
 * said at once in one line and the run goes on (its checkpoints stay valid:
 * the next resume cuts a torn last record away), but it ends with exit
 * status 1 (runlog_write_failed), and the summary names no file it did not
 * write.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "runlog.h"
#include "plan.h"
#include "version.h"

/* A duration as 42.1s, 3m05s or 2h07m. */
static void fmt_duration(double secs, char *buf, size_t len) {
    if (!(secs >= 0)) secs = 0;
    if (secs < 60) snprintf(buf, len, "%.1fs", secs);
    else if (secs < 3600) snprintf(buf, len, "%dm%02ds", (int)secs / 60, (int)secs % 60);
    else snprintf(buf, len, "%dh%02dm", (int)(secs / 3600), (int)secs % 3600 / 60);
}

/* A JSON string: quotes, backslashes and control bytes escaped. */
static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

/* A number as JSON has them (no nan or inf: null). */
static void json_num(FILE *f, const char *key, double v) {
    if (isfinite(v)) fprintf(f, ",\"%s\":%.17g", key, v);
    else fprintf(f, ",\"%s\":null", key);
}

/* The step a record is about, or -1 (a "run" record). */
static long record_step(const char *line) {
    const char *p = strstr(line, "\"step\":");
    return p && !strstr(line, "\"type\":\"run\"") ? strtol(p + 7, NULL, 10) : -1;
}

/* A resumed run: keeps path's records up to step s0 (rewriting it through a
 * temporary file and a rename), and draws its step and val records into the
 * plot. A fresh run starts the file anew. Returns the file, open to append. */
static FILE *log_open(RunLog *l, const char *path, int s0) {
    FILE *old = s0 > 0 ? fopen(path, "r") : NULL;
    char tmp[4200], line[8192];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) { if (old) fclose(old); return NULL; }
    while (old && fgets(line, sizeof line, old)) {
        long step = record_step(line);
        if (step > s0 || !strchr(line, '\n')) continue;   /* after the checkpoint, or cut short */
        fputs(line, f);
        const char *p = strstr(line, "\"loss\":");
        double loss = p ? strtod(p + 7, NULL) : NAN, lr = NAN;
        if ((p = strstr(line, "\"lr\":"))) lr = strtod(p + 5, NULL);
        if (l->plot.path && strstr(line, "\"type\":\"step\"")) plot_train(&l->plot, (int)step, loss, lr);
        if (l->plot.path && strstr(line, "\"type\":\"val\"")) plot_val(&l->plot, (int)step, loss);
    }
    if (old) fclose(old);
    if (fflush(f) != 0 || ferror(f) || rename(tmp, path) != 0) { fclose(f); unlink(tmp); return NULL; }
    return f;
}

/* After a record: flushes --log; on a failure says so once and writes no more. */
static void log_flush(RunLog *l) {
    if (!l->log) return;
    errno = 0;
    if (fflush(l->log) == 0 && !ferror(l->log)) return;
    int e = errno ? errno : EIO;
    fprintf(stderr, "train: --log %s: write failed (%s): the run goes on without it and will exit 1\n",
            l->r->a.log, strerror(e));
    fclose(l->log);
    l->log = NULL;
    l->log_failed = 1;
}

/* The "run" record: the build, this start's step, the command line, the layout. */
static void log_run(RunLog *l, int s0) {
    Run *r = l->r;
    FILE *f = l->log;
    char version[256] = "";
    FILE *v = fmemopen(version, sizeof version - 1, "w");
    if (v) { version_print(v); fclose(v); }
    version[strcspn(version, "\n")] = 0;
    fprintf(f, "{\"type\":\"run\",\"version\":");
    json_str(f, version);
    fprintf(f, ",\"resume_step\":%d,\"steps\":%d,\"argv\":[", s0, r->a.steps);
    for (int i = 0; i < r->argc; i++) {
        if (i) fputc(',', f);
        json_str(f, r->argv[i]);
    }
    fprintf(f, "],\"layout\":{\"ranks\":%d,\"dp\":%d,\"tp\":%d,\"pp\":%d,\"zero\":%d,\"micro_batches\":%d,"
            "\"batch\":%d,\"seq\":%d,\"schedule\":\"%s\",\"device\":\"%s\",\"dtype\":\"%s\"},"
            "\"model\":{\"layers\":%d,\"heads\":%d,\"dim\":%d,\"vocab\":%d,\"params\":%zu}}\n",
            r->comm.world_size, r->mesh.dp, r->mesh.tp, r->mesh.pp, r->a.layout.zero, r->a.layout.micro_batches, r->a.layout.batch,
            r->a.layout.seq, pp_schedule_name(r->a.layout.schedule), r->dev.kind == DEV_CUDA ? "cuda" : "cpu", dt_name(r->dev.dtype),
            r->cfg.layers, r->cfg.heads, r->cfg.dim, r->cfg.vocab, gpt_total_params(&r->cfg));
    log_flush(l);
}

void runlog_init(RunLog *l, Run *r, int s0) {
    memset(l, 0, sizeof *l);
    l->r = r;
    l->t0 = trace_now_ms();
    l->s0 = l->last_step = s0;
    l->last_loss = l->val_loss = NAN;
    if (r->comm.rank == 0 && r->a.plot) {
        char title[256];
        snprintf(title, sizeof title, "%d layers, dim %d | dp %d x tp %d x pp %d, zero %d | %s",
                 r->cfg.layers, r->cfg.dim, r->mesh.dp, r->mesh.tp, r->mesh.pp, r->a.layout.zero,
                 r->dev.kind == DEV_CUDA ? "cuda" : "cpu");
        plot_init(&l->plot, r->a.plot, title,  r->a.steps,
                  (long long)r->a.layout.batch * r->a.layout.seq * r->a.layout.micro_batches * r->mesh.dp);
    }
    if (r->comm.rank == 0 && r->a.log) {
        errno = 0;
        l->log = log_open(l, r->a.log, s0);
        if (!l->log) {
            fprintf(stderr, "train: --log %s: cannot write it (%s): the run goes on without it and will exit 1\n",
                    r->a.log, strerror(errno ? errno : EIO));
            l->log_failed = 1;
        } else {
            log_run(l, s0);
        }
    }
}

/* Rewrites the plot (atomically); the first failure is said, the run goes on. */
static void runlog_plot(RunLog *l) {
    char err[512];
    if (!l->plot.path) return;
    l->plot_ok = plot_write(&l->plot, err, sizeof err) == 0;
    if (!l->plot_ok && !l->plot_failed)
        fprintf(stderr, "train: --plot: %s: the run goes on and will exit 1\n", err);
    if (!l->plot_ok) l->plot_failed = 1;
    l->plot_written = trace_now_ms();
}

int runlog_write_failed(const RunLog *l) { return l->log_failed || l->plot_failed; }

/* Rank 0, after a step's line: appends " | elapsed E | eta T" and records the step. */
void runlog_step(RunLog *l, int step, double loss, double norm, float lr, double ms) {
    double secs = (trace_now_ms() - l->t0) / 1e3;
    int done = step - l->s0, left = l->r->a.steps - step;
    char e[32], eta[32];
    fmt_duration(secs, e, sizeof e);
    fmt_duration(done > 0 ? secs / done * left : 0, eta, sizeof eta);
    printf(" | elapsed %s | eta %s", e, eta);
    l->last_step = step;
    l->last_loss = loss;
    if (l->log) {
        long long tokens_per_step = (long long)l->r->a.layout.batch * l->r->a.layout.seq * l->r->a.layout.micro_batches * l->r->mesh.dp;
        fprintf(l->log, "{\"type\":\"step\",\"step\":%d", step);
        json_num(l->log, "loss", loss);
        json_num(l->log, "norm", norm);
        json_num(l->log, "lr", lr);
        json_num(l->log, "ms", ms);
        json_num(l->log, "tok_s", tokens_per_step / (ms / 1e3));
        fprintf(l->log, ",\"tokens\":%lld}\n", tokens_per_step * step);
        log_flush(l);
    }
    if (!l->plot.path) return;
    plot_train(&l->plot, step, loss, lr);
    /* every 10 steps, and at least every 2 s of slow steps */
    if (step % 10 == 0 || trace_now_ms() - l->plot_written > 2000) runlog_plot(l);
}

void runlog_val(RunLog *l, int step, double loss) {
    l->val_loss = loss;
    if (l->log) {
        fprintf(l->log, "{\"type\":\"val\",\"step\":%d", step);
        json_num(l->log, "loss", loss);
        fprintf(l->log, "}\n");
        log_flush(l);
    }
    if (!l->plot.path) return;
    plot_val(&l->plot, step, loss);
    runlog_plot(l);
}

/* Rank 0, at the end: what the run did, in three lines. */
void runlog_summary(RunLog *l, const char *ckpt, const char *model, double peak, double flops_per_token) {
    Args *a = &l->r->a;
    int steps = l->last_step - l->s0;
    long long tokens = (long long)steps * a->layout.batch * a->layout.seq * a->layout.micro_batches * l->r->mesh.dp;
    double secs = (trace_now_ms() - l->t0) / 1e3, tok_s = secs > 0 ? tokens / secs : 0;
    char wall[32];
    fmt_duration(secs, wall, sizeof wall);
    if (l->plot.path) runlog_plot(l);
    printf("summary: %d steps%s, %lld tokens in %s, mean %.0f tok/s", steps,
           l->s0 ? " (after a resume)" : "", tokens, wall, tok_s);
    if (peak > 0) printf(", mfu %.1f%%", 100.0 * tok_s * flops_per_token / (peak * l->r->comm.world_size));
    printf("\nsummary: final train loss %.4f", l->last_loss);
    if (!isnan(l->val_loss)) printf(", val loss %.4f", l->val_loss);
    printf("\nsummary: checkpoint %s | plot %s | model %s\n", ckpt ? ckpt : "none",
           l->plot.path && l->plot_ok ? l->plot.path : l->plot.path ? "not written" : "none",
           model ? model : a->save ? "not written" : "none");
}

void runlog_hellaswag(RunLog *l, int step, int correct, int total) {
    if (!l->log) return;
    fprintf(l->log, "{\"type\":\"hellaswag\",\"step\":%d,\"correct\":%d,\"total\":%d", step, correct, total);
    json_num(l->log, "acc_norm", total ? (double)correct / total : NAN);
    fprintf(l->log, "}\n");
    log_flush(l);
}

void runlog_free(RunLog *l) {
    if (l->log) fclose(l->log);
    if (l->plot.path) plot_free(&l->plot);
}

/* Every rank's memory, measured and from the ZeRO formula (DESIGN.md), and the
 * backward's scratch the sets share (gpt_scratch_bytes; the planner counts it too). */
void runlog_memory(Run *r) {
    DPMemory mem;
    dp_memory(&r->dp, &mem);
    char stash[64] = "", ring[64] = "";
    if (pp_stash_bytes(&r->pp)) snprintf(stash, sizeof stash, ", of which the B->W stash %.6g MB", pp_stash_bytes(&r->pp) / 1e6);
    if (cp_bytes(&r->cp)) snprintf(ring, sizeof ring, ", of which the cp ring %.6g MB", cp_bytes(&r->cp) / 1e6);
    printf("memory rank %d: params %.6g MB (formula %.6g), grads %.6g MB (formula %.6g), "
           "optimizer %.6g MB%s (formula %.6g), activations %.6g MB (%d sets%s%s), scratch %.6g MB\n",
           r->comm.rank, mem.params / 1e6, mem.f_params / 1e6, mem.grads / 1e6, mem.f_grads / 1e6,
           (mem.optim + mem.optim_host) / 1e6, r->a.layout.offload ? " on the host" : "",
           mem.f_optim / 1e6, (pp_acts_bytes(&r->pp) + cp_bytes(&r->cp)) / 1e6, r->pp.nsets, stash, ring,
           gpt_scratch_bytes(&r->model) / 1e6);
}

/* After the run: the buffers that come and go (ZeRO-2/3 units, ps staging). */
void runlog_transient(Run *r) {
    DPMemory mem;
    dp_memory(&r->dp, &mem);
    if (mem.transient_peak > 0)
        printf("memory rank %d: transient gathers and reductions peaked at %.6g MB\n",
               r->comm.rank, mem.transient_peak / 1e6);
}

void runlog_header(Run *r) {
    Args *a = &r->a;
    GPT *m = &r->model;
    int tokens = a->layout.batch * a->layout.seq * a->layout.micro_batches * r->mesh.dp;
    static const char *modes[] = {"ddp", "ps"};
    printf("model: %d layers, %d heads, dim %d, vocab %d (padded %d), max-seq %d | %zu parameters\n",
           m->cfg.layers, m->cfg.heads, m->cfg.dim, m->cfg.vocab, m->cfg.padded_vocab,
           m->cfg.max_seq, m->num_params);
    printf("train: %s, %zu tokens | batch %d x seq %d x %d micro-batches x %d dp = %d tokens a step\n",
           a->data, r->train.n_tokens, a->layout.batch, a->layout.seq, a->layout.micro_batches, r->mesh.dp, tokens);
    char cp[24] = "";
    if (r->mesh.cp > 1) snprintf(cp, sizeof cp, " x cp %d", r->mesh.cp);
    printf("ranks: %d (%s) | dp %d%s x tp %d%s x pp %d (%s) | %s, zero %d%s | %s",
           r->comm.world_size, r->launch.source, r->mesh.dp, cp, r->mesh.tp,
           r->model.tpc.sp ? " (sp)" : "", r->mesh.pp, pp_schedule_name(a->layout.schedule),
           modes[a->layout.dp_mode], a->layout.zero, a->layout.offload ? ", offload" : "",
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


/* MFU's numerator: the causal count (plan_flops_per_token: 6N + 6LCT),
 * the work this run's causal attention does. */
double runlog_flops_per_token(const Run *r) {
    return plan_flops_per_token(&r->cfg, r->a.layout.seq, PLAN_FLOPS_CAUSAL);
}

/* Rank 0's first lines about the checkpoint directory: what this run continues, or that it starts. */
void runlog_resume(Run *r, int s0) {
    if (r->comm.rank != 0 || !r->a.resume) return;
    if (r->resumed) {
        if (r->ck.damaged[0]) fprintf(stderr, "train: warning: %s\n", r->ck.damaged);
        const Layout *l = &r->ck.meta.layout;
        char cp[24] = "";
        if (l->cp > 1) snprintf(cp, sizeof cp, " x cp %d", l->cp);
        printf("resumed from %s at step %d (written under dp %d%s x tp %d x pp %d, zero %d%s, %s; loaded in %.0f ms)\n",
               r->ck.dir, s0, l->dp, cp, l->tp, l->pp, l->zero, l->offload ? ", offload" : "", dt_name(l->dtype),
               r->load_ms);
        if (s0 >= r->a.steps)
            printf("resume: the checkpoint is at step %d of --steps %d: nothing left to train (--steps N to go on)\n",
                   s0, r->a.steps);
    } else {
        printf("resume: no checkpoint in %s yet: starting at step 0%s%s\n", r->a.checkpoint_dir,
               r->a.init ? " from " : "", r->a.init ? r->a.init : "");
    }
}

