/* comm_launch.c: how processes become ranks (comm.h, "Launching"; DESIGN.md,
 * "Processes" and "Errors"): the launch plan read from --ranks and the
 * launcher's variables, the fork launcher and its supervisor, and the
 * job token with which rank 0 tells the job's ranks from anyone else at the
 * rendezvous (rendezvous.c): the "one process a GPU" every section of the
 * articles assumes. It calls none of comm's other files, only rendezvous.c
 * for the token (the segment's header is comm_impl.h's).
 *
 * `--ranks N` forks N ranks; the process that forked them stays
 * as their supervisor. It relays their output, reaps them, and when one
 * fails it raises the abort flag in the shared segment, prints which rank
 * died and how, and SIGKILLs whoever has not stopped GRACE_S later. Ranks
 * die with it (PR_SET_PDEATHSIG). Under torchrun, srun or mpirun one
 * process is one rank; rank 0 hands out what the others need (the NCCL id,
 * or the name of the shared segment) over TCP, to the ranks that prove the
 * job token: derived from the launcher's job identity (job_identity) and
 * TRAIN_JOB_TOKEN, a secret the user may export; a fork job draws a random
 * one, which its ranks inherit.
 *
 * Which launcher: the innermost one whose variables are there (torchrun,
 * then mpirun, then an srun task). A Slurm batch script's shell has
 * SLURM_PROCID and SLURM_NTASKS but no step id, so it is one process (or a
 * --ranks job), never rank 0 of a world that will not come (slurm_task_step).
 * comm_launch_plan checks every variable it reads before anything starts.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include "comm_impl.h"
#include "rendezvous.h"
#include "stop.h"
#include "safe.h"

#define GRACE_S 3.0              /* supervisor: SIGKILL ranks still running this long after a failure */

/* ---- the launch plan: --ranks, or the launcher's variables ---------------------------- */

/* The variables of a launcher that starts one process per rank. */
typedef struct EnvNames { const char *source, *rank, *size, *local_rank, *local_size; } EnvNames;

/* In the order they are believed: the innermost launcher first. torchrun and
 * mpirun set their variables for each process they start, while the Slurm
 * variables such a process inherits may describe the step of mpirun's
 * daemons (started through srun), or no step at all (slurm_task_step). */
static const EnvNames env_launchers[] = {
    { "torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE" },
    { "openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
      "OMPI_COMM_WORLD_LOCAL_SIZE" },
    { "mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS" },   /* Hydra's mpiexec */
    { "slurm", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE" },
};
enum { ENV_TORCHRUN, ENV_OPENMPI, ENV_MPICH, ENV_SLURM, ENV_LAUNCHERS };

/* 0 unset, 1 set (in *v), -1 not a whole number (err says so). With
 * count_list, a Slurm per-node count such as "8(x2),4" reads as its first
 * count. */
static int env_int_as(const char *name, int *v, int count_list, char *err, size_t errlen) {
    const char *s = getenv(name);
    if (!s || !*s) return 0;
    char *end;
    errno = 0;
    long x = strtol(s, &end, 10);
    int tail_ok = !*end || (count_list && end != s && (*end == '(' || *end == ','));
    if (!tail_ok || errno || x < INT_MIN || x > INT_MAX) {
        snprintf(err, errlen, "%s=%s is not a whole number", name, s);
        return -1;
    }
    *v = (int)x;
    return 1;
}

static int env_int(const char *name, int *v, char *err, size_t errlen) {
    return env_int_as(name, v, 0, err, errlen);
}

/* Whether this process is a task of an srun step: 1 yes, 0 no, -1 with err.
 * Slurm's setup_env() (src/common/env.c) exports SLURM_PROCID and
 * SLURM_LOCALID to every step's processes, the batch script's shell included
 * (as 0), but SLURM_STEP_ID and SLURM_STEPID only when the step id, an int
 * there, is >= 0: the batch step (SLURM_BATCH_SCRIPT, 0xfffffffb) and the
 * interactive step (0xfffffffa) are negative, so their shells have none,
 * while srun's tasks get their step number (also from env_array_for_step,
 * beside SLURM_STEP_NUM_TASKS). sbatch's own variables (env_array_for_batch_job)
 * include SLURM_NTASKS and ENVIRONMENT=BATCH, never a step id. So: a task
 * has a step id from 0 to SLURM_MAX_NORMAL_STEP_ID (0xfffffff0); unset, or a
 * special id (printed unsigned, 0xfffffffa..0xfffffffd, or negative), is a
 * shell that srun did not start, whatever SLURM_PROCID and SLURM_NTASKS say. */
static int slurm_task_step(char *err, size_t errlen) {
    const char *name = getenv("SLURM_STEP_ID") ? "SLURM_STEP_ID" : "SLURM_STEPID";
    const char *s = getenv(name);
    if (!s || !*s) return 0;
    if (!strcmp(s, "batch") || !strcmp(s, "interactive") || !strcmp(s, "extern")) return 0;
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (*end || errno || end == s) {
        snprintf(err, errlen, "%s=%s is not a step number", name, s);
        return -1;
    }
    return x >= 0 && x <= 0xfffffff0LL;
}

/* Which launcher started this process: an index of env_launchers, -1 for
 * none, -2 with err. */
static int env_launcher(char *err, size_t errlen) {
    int step = -1, pmi_rank = -1, procid = -1;
    for (int i = 0; i < ENV_LAUNCHERS; i++) {
        const EnvNames *e = &env_launchers[i];
        if (i == ENV_SLURM) {
            if (!getenv(e->rank)) return -1;
            step = slurm_task_step(err, errlen);
            return step < 0 ? -2 : step ? i : -1;
        }
        if (!getenv(e->rank) && !getenv(e->size)) continue;
        /* srun --mpi=pmi2 sets PMI_RANK for its own tasks too: the same rank
         * as SLURM_PROCID, and Slurm knows the local rank */
        if (i == ENV_MPICH && getenv("SLURM_PROCID") &&
            env_int("PMI_RANK", &pmi_rank, err, errlen) >= 0 &&
            env_int("SLURM_PROCID", &procid, err, errlen) >= 0 && pmi_rank == procid &&
            slurm_task_step(err, errlen) == 1)
            continue;
        return i;
    }
    return -1;
}

/* A local rank below 0, or (its launcher giving the local size) not below it. */
static int local_rank_bad(const EnvNames *e, int local, int lsize, int has_lsize, int slurm, char *err,
                        size_t errlen) {
    if (!getenv(e->local_rank)) return 0;
    if (local < 0) {
        snprintf(err, errlen, "%s=%d is not a local rank", e->local_rank, local);
        return 1;
    }
    if (has_lsize && !slurm && local >= lsize) {
        snprintf(err, errlen, "%s=%d is not below %s=%d", e->local_rank, local, e->local_size, lsize);
        return 1;
    }
    return 0;
}

/* Reads and checks every variable of launcher e into l (kind ENV); 0, or -1
 * with one line in err naming the variable. */
static int env_read(const EnvNames *e, int ranks, CommLaunch *l, char *err, size_t errlen) {
    int rank = -1, size = -1, local = -1, lsize = -1, rc, slurm = e == &env_launchers[ENV_SLURM];
    const char *size_name = e->size;
    if (slurm && !getenv(size_name)) size_name = "SLURM_NTASKS";
    if (env_int(e->rank, &rank, err, errlen) < 0 || env_int(size_name, &size, err, errlen) < 0 ||
        env_int(e->local_rank, &local, err, errlen) < 0 ||
        (rc = env_int_as(e->local_size, &lsize, slurm, err, errlen)) < 0)
        return -1;
    if (!getenv(e->rank) || !getenv(size_name)) {
        snprintf(err, errlen, "%s is set but %s is not: %s sets both", getenv(e->rank) ? e->rank : size_name,
                 getenv(e->rank) ? size_name : e->rank, e->source);
        return -1;
    }
    if (size < 1) {
        snprintf(err, errlen, "%s=%d: a world has at least one rank", size_name, size);
        return -1;
    }
    if (size > SAFE_MAX_RANKS) {
        snprintf(err, errlen, "%s=%d: at most %d ranks are supported", size_name, size, SAFE_MAX_RANKS);
        return -1;
    }
#ifndef USE_NCCL
    if (size > COMM_MAX_RANKS) {
        snprintf(err, errlen, "%s=%d: this build (no NCCL) talks over shared memory, which takes at most "
                 "%d ranks", size_name, size, COMM_MAX_RANKS);
        return -1;
    }
#endif
    if (rank < 0 || rank >= size) {
        snprintf(err, errlen, "%s=%d is not a rank of the world of %s=%d (0 to %d)", e->rank, rank, size_name,
                 size, size - 1);
        return -1;
    }
    /* SLURM_NTASKS_PER_NODE is the allocation's, not the step's: a step may
     * run fewer tasks a node, so it only caps the local size there */
    if (slurm && rc && lsize > size) lsize = size;
    if (rc && (lsize < 1 || lsize > size)) {
        snprintf(err, errlen, "%s=%d: the ranks on this host must number 1 to %s=%d", e->local_size, lsize,
                 size_name, size);
        return -1;
    }
    if (local_rank_bad(e, local, lsize, rc, slurm, err, errlen)) return -1;
    if (size > 1 && ranks > 1 && ranks != size) {
        snprintf(err, errlen, "--ranks %d cannot be used inside a launcher that started %d ranks (%s=%d)",
                 ranks, size, size_name, size);
        return -1;
    }
    if (size > 1) {
        l->kind = COMM_LAUNCH_ENV;
        l->source = e->source;
        l->rank = rank;
        l->world_size = size;
        l->local_rank = local >= 0 ? local : 0;
        l->local_size = rc ? lsize : 0;
    }
    return 0;
}

/* The job identity launcher `which` gives every rank of one job and no other
 * job: torchrun's run id (--rdzv-id; --standalone draws a random one, else it
 * is "none"), the Slurm step (job id and step id: the step's tasks, not the
 * batch shell), Open MPI's job id (ORTE's OMPI_MCA_ess_base_jobid; PRRTE's
 * PMIX_NAMESPACE from Open MPI 5). MPICH's Hydra exports none, and torchrun's
 * default "none" is every such job's: neither counts. Writes the identity,
 * and the variables' names into from; 0 when there is none. */
static int job_identity(int which, char *id, size_t idlen, char *from, size_t fromlen) {
    const char *a = NULL, *b = NULL, *an = NULL, *bn = NULL;
    if (which == ENV_TORCHRUN) {
        a = getenv(an = "TORCHELASTIC_RUN_ID");
    } else if (which == ENV_SLURM) {
        a = getenv(an = "SLURM_JOB_ID");
        b = getenv(bn = getenv("SLURM_STEP_ID") ? "SLURM_STEP_ID" : "SLURM_STEPID");
    } else if (which == ENV_OPENMPI) {
        a = getenv(an = "OMPI_MCA_ess_base_jobid");
        if (!a || !*a) a = getenv(an = "PMIX_NAMESPACE");
    } else {
        a = getenv(an = "PMIX_NAMESPACE");
    }
    if (!a || !*a || (which == ENV_TORCHRUN && !strcmp(a, "none"))) return 0;
    snprintf(id, idlen, "%s=%s%s%s%s%s", an, a, b ? " " : "", b ? bn : "", b ? "=" : "", b ? b : "");
    snprintf(from, fromlen, "%s%s%s", an, b ? " and " : "", b ? bn : "");
    return 1;
}

/* An external launcher's job token: its job identity and TRAIN_JOB_TOKEN
 * mixed (rdzv_token_derive); -1 with err when there is neither. */
static int env_token(int which, CommLaunch *l, char *err, size_t errlen) {
    char id[512] = "", from[64] = "";
    const char *secret = getenv("TRAIN_JOB_TOKEN");
    if (secret && !*secret) secret = NULL;
    int has_id = job_identity(which, id, sizeof id, from, sizeof from);
    if (!has_id && !secret) {
        snprintf(err, errlen, "%s started %d ranks but names no job (no %s): export TRAIN_JOB_TOKEN=<a secret> "
                 "to every rank of this job, so that rank 0 can tell its ranks from anyone else's", l->source,
                 l->world_size, which == ENV_TORCHRUN ? "TORCHELASTIC_RUN_ID but torchrun's default 'none'; or pass --rdzv-id" : which == ENV_SLURM ?
                 "SLURM_JOB_ID" : which == ENV_OPENMPI ? "OMPI_MCA_ess_base_jobid or PMIX_NAMESPACE" :
                 "PMIX_NAMESPACE");
        return -1;
    }
    rdzv_token_derive(secret, id, l->job_token);
    snprintf(l->job_token_from, sizeof l->job_token_from, "%s%s%s", secret ? "TRAIN_JOB_TOKEN" : "",
             secret && has_id ? " and " : "", from);
    return 0;
}

/* Every variable a launch reads is checked here, before anything starts. */
int comm_launch_plan(int ranks, CommLaunch *l, char *err, size_t errlen) {
    memset(l, 0, sizeof *l);
    l->kind = COMM_LAUNCH_SINGLE;
    l->world_size = l->local_size = 1;
    l->source = "single";
    if (ranks < 0 || ranks > COMM_MAX_RANKS) {
        snprintf(err, errlen, "--ranks %d: must be 1 to %d", ranks, COMM_MAX_RANKS);
        return -1;
    }
    int which = env_launcher(err, errlen);
    if (which == -2 || (which >= 0 && env_read(&env_launchers[which], ranks, l, err, errlen)))
        return -1;
    if (l->kind == COMM_LAUNCH_SINGLE && ranks > 1) {
        l->kind = COMM_LAUNCH_FORK;
        l->source = "--ranks";
        l->world_size = l->local_size = ranks;
    }
    const char *addr = getenv("MASTER_ADDR"), *agent = getenv("TORCHELASTIC_USE_AGENT_STORE");
    if (addr && !*addr) addr = NULL;
    if (addr && strlen(addr) >= sizeof l->master_addr) {
        snprintf(err, errlen, "MASTER_ADDR of %zu bytes is too long for a host name (at most %zu)", strlen(addr),
                 sizeof l->master_addr - 1);
        return -1;
    }
    if (addr) snprintf(l->master_addr, sizeof l->master_addr, "%s", addr);
    int port = 0, has_port = env_int("MASTER_PORT", &port, err, errlen);
    if (has_port < 0) return -1;
    if (has_port && (port < 1 || port > 65534)) {
        snprintf(err, errlen, "MASTER_PORT=%d is not a port (1 to 65534)", port);
        return -1;
    }
    if (l->kind == COMM_LAUNCH_ENV && !has_port) {   /* what tcp_bcast would say, but now */
        snprintf(err, errlen, "%s started %d ranks but MASTER_PORT is not set: rank 0 needs a port "
                 "to hand out the rendezvous (export MASTER_ADDR and MASTER_PORT)", l->source, l->world_size);
        return -1;
    }
    if (l->kind == COMM_LAUNCH_ENV && l->rank != 0 && !addr) {   /* what tcp_bcast would say, but now */
        snprintf(err, errlen, "%s started %d ranks but MASTER_ADDR is not set: the other ranks need "
                 "rank 0's host (export MASTER_ADDR and MASTER_PORT)", l->source, l->world_size);
        return -1;
    }
    l->master_port = port;
    l->rendezvous_port = port && agent && !strcmp(agent, "True") ? port + 1 : port;
    if (l->kind == COMM_LAUNCH_ENV && env_token(which, l, err, errlen)) return -1;
    return 0;
}

/* ---- the fork launcher: its supervisor and output relay ------------------------------ */

/* Supervisor: one rank's output pipe (stdout or stderr), relayed by lines. */
typedef struct Relay {
    int fd, rank, out;           /* read end (-1 once closed), whose, where to (1 or 2) */
    size_t len;
    char buf[8192];
} Relay;

typedef struct Supervisor {
    int world, nalive, nrelay, sfd;
    pid_t *pid;
    int *alive;
    Relay *relay;
    ShmHeader *h;
    int first_fail, fail_code, interrupted_by;
    int graceful;                /* the ranks stop themselves on a signal (CommLaunch.graceful_stop) */
    int stopped;                 /* ranks that exited EXIT_STOPPED (a checkpoint, then a stop) */
    double kill_at;              /* > 0: SIGKILL whoever is left at this time */
} Supervisor;

static void write_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        p += w;
        n -= (size_t)w;
    }
}

/* Writes "[rank r] line" in one write, so lines of different ranks never mix. */
static void relay_emit(Relay *r, const char *line, size_t n) {
    char out[sizeof r->buf + 32];
    int k = snprintf(out, 32, "[rank %d] ", r->rank);
    memcpy(out + k, line, n);
    if (n == 0 || line[n - 1] != '\n') out[k + n++] = '\n';
    write_all(r->out, out, (size_t)k + n);
}

/* Reads what is there; returns 1 if it read anything. */
static int relay_pump(Relay *r) {
    ssize_t got = read(r->fd, r->buf + r->len, sizeof r->buf - r->len);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) return 0;
    if (got <= 0) {
        if (r->len) relay_emit(r, r->buf, r->len);
        r->len = 0;
        close(r->fd);
        r->fd = -1;
        return 0;
    }
    r->len += (size_t)got;
    char *start = r->buf, *end = r->buf + r->len, *nl;
    while ((nl = memchr(start, '\n', (size_t)(end - start)))) {
        relay_emit(r, start, (size_t)(nl + 1 - start));
        start = nl + 1;
    }
    r->len = (size_t)(end - start);
    memmove(r->buf, start, r->len);
    if (r->len == sizeof r->buf) { relay_emit(r, r->buf, r->len); r->len = 0; }
    return 1;
}

static void sup_kill_all(Supervisor *s, int sig) {
    for (int r = 0; r < s->world; r++)
        if (s->alive[r]) kill(s->pid[r], sig);
}

static void sup_reap(Supervisor *s) {
    int st;
    pid_t p;
    while ((p = waitpid(-1, &st, WNOHANG)) > 0) {
        int r = 0;
        while (r < s->world && s->pid[r] != p) r++;
        if (r == s->world || !s->alive[r]) continue;
        for (int i = 0; i < s->nrelay; i++)   /* its last words before the verdict */
            while (s->relay[i].rank == r && s->relay[i].fd >= 0 && relay_pump(&s->relay[i])) {}
        int code = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
        s->alive[r] = 0;
        s->nalive--;
        atomic_store(&s->h->slot[r].exit_code, code);
        atomic_store(&s->h->slot[r].exited, 1);
        if (code == EXIT_STOPPED && s->graceful) {   /* stopped early with a checkpoint: not a death */
            s->stopped++;
        } else if (code != 0 && s->first_fail < 0) {
            s->first_fail = r;
            s->fail_code = code;
            if (!s->interrupted_by || s->graceful) {
                char how[64];
                shm_describe_status(code, how, sizeof how);
                shm_abort_set(s->h, r, code);
                fprintf(stderr, "error: rank %d died (%s); stopping the other ranks\n", r, how);
                s->kill_at = now_s() + GRACE_S;
            }
        }
        shm_ring_all(s->h);
    }
}

/* A signal to the launcher. With graceful ranks, SIGINT, SIGTERM and SIGUSR1
 * are passed on: every rank finishes its step, checkpoints and exits
 * EXIT_STOPPED; only a second SIGINT kills them at once (Slurm's SIGTERM
 * after SIGUSR1 must let the save finish). Otherwise the job is stopped. */
static void sup_interrupt(Supervisor *s, int sig) {
    int again = s->interrupted_by != 0;
    if (again && (!s->graceful || sig == SIGINT)) { sup_kill_all(s, SIGKILL); return; }
    if (!again) s->interrupted_by = sig;
    if (s->graceful) {
        if (!again)
            fprintf(stderr, "train: signal %d: the ranks stop after this step and checkpoint "
                    "(a second Ctrl-C stops them at once)\n", sig);
        sup_kill_all(s, sig);
        return;
    }
    shm_abort_set(s->h, -1, -sig);
    fprintf(stderr, "error: interrupted by signal %d; stopping all ranks\n", sig);
    sup_kill_all(s, SIGTERM);
    s->kill_at = now_s() + GRACE_S;
}

/* Runs until every rank has been reaped; returns the job's exit status. */
static int supervise(Supervisor *s) {
    struct pollfd pf[1 + 2 * COMM_MAX_RANKS];
    int which[1 + 2 * COMM_MAX_RANKS];
    while (s->nalive > 0) {
        int np = 0;
        pf[np++] = (struct pollfd){ s->sfd, POLLIN, 0 };
        for (int i = 0; i < s->nrelay; i++)
            if (s->relay[i].fd >= 0) { which[np] = i; pf[np++] = (struct pollfd){ s->relay[i].fd, POLLIN, 0 }; }
        int ms = -1;
        if (s->kill_at > 0) {
            double left = s->kill_at - now_s();
            ms = left <= 0 ? 0 : (int)(left * 1000) + 1;
        }
        poll(pf, (nfds_t)np, ms);
        if (pf[0].revents & POLLIN) {
            struct signalfd_siginfo si[16];
            ssize_t got = read(s->sfd, si, sizeof si);
            for (ssize_t i = 0; got > 0 && i < got / (ssize_t)sizeof si[0]; i++)
                if (si[i].ssi_signo != SIGCHLD) sup_interrupt(s, (int)si[i].ssi_signo);
        }
        sup_reap(s);
        for (int i = 1; i < np; i++)
            if (pf[i].revents && s->relay[which[i]].fd >= 0) relay_pump(&s->relay[which[i]]);
        if (s->kill_at > 0 && now_s() >= s->kill_at) {
            sup_kill_all(s, SIGKILL);
            s->kill_at = 0;
        }
    }
    for (int i = 0; i < s->nrelay; i++) {   /* what the ranks wrote last */
        Relay *r = &s->relay[i];
        while (r->fd >= 0 && relay_pump(r)) {}
        if (r->fd >= 0) { if (r->len) relay_emit(r, r->buf, r->len); close(r->fd); r->fd = -1; }
    }
    if (s->interrupted_by && !s->graceful) return 128 + s->interrupted_by;
    if (s->first_fail >= 0) return s->fail_code > 0 ? s->fail_code : 128 - s->fail_code;
    return s->stopped ? EXIT_STOPPED : 0;
}

/* In a freshly forked rank: die with the supervisor, restore signals, wire output. */
static void rank_setup(Supervisor *s, int r, pid_t sup, const sigset_t *old, int out[2], int errp[2]) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != sup) _exit(1);
    sigprocmask(SIG_SETMASK, old, NULL);
    for (int i = 0; i < s->nrelay; i++) close(s->relay[i].fd);
    if (r > 0) {
        dup2(out[1], 1);
        dup2(errp[1], 2);
        close(out[0]); close(out[1]); close(errp[0]); close(errp[1]);
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    atomic_store(&s->h->slot[r].pid, (int32_t)getpid());
    free(s->pid);
    free(s->alive);
    free(s->relay);
}

int comm_launch_start(CommLaunch *l, char *err, size_t errlen) {
    if (l->kind != COMM_LAUNCH_FORK) return 0;
    int W = l->world_size;
    /* the job's token, inherited by its ranks; their segment is inherited too,
     * so no rendezvous uses it today, but it is the job's all the same */
    if (rdzv_token_random(l->job_token, err, errlen)) return -1;
    snprintf(l->job_token_from, sizeof l->job_token_from, "--ranks (random)");
    size_t bytes = shm_segment_bytes(W);
    /* Anonymous shared memory: the ranks inherit it, and no name exists that
     * could outlive the job, whatever kills it. */
    void *seg = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (seg == MAP_FAILED) {
        snprintf(err, errlen, "cannot map %zu bytes of shared memory for %d ranks: %s", bytes, W, strerror(errno));
        return -1;
    }
    shm_header_init(seg, W);
    l->shared = seg;
    l->shared_bytes = bytes;

    Supervisor s = { .world = W, .first_fail = -1, .h = seg, .graceful = l->graceful_stop };
    s.pid = calloc((size_t)W, sizeof *s.pid);
    s.alive = calloc((size_t)W, sizeof *s.alive);
    s.relay = calloc((size_t)(2 * W), sizeof *s.relay);
    if (!s.pid || !s.alive || !s.relay) {
        snprintf(err, errlen, "out of memory starting %d ranks", W);
        return -1;
    }
    /* Signals reach the supervisor through a signalfd: blocked here (the
     * ranks restore the old mask), not ignored (a shell may have ignored
     * SIGINT for a background job). */
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGCHLD);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGUSR1);
    sigaddset(&block, SIGHUP);
    sigprocmask(SIG_BLOCK, &block, &old);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGCHLD, SIG_DFL);
    fflush(NULL);
    pid_t sup = getpid();
    for (int r = 0; r < W; r++) {
        int out[2] = { -1, -1 }, errp[2] = { -1, -1 };
        pid_t pid = -1;
        if (r == 0 || (pipe(out) == 0 && pipe(errp) == 0)) pid = fork();
        if (pid == 0) {
            rank_setup(&s, r, sup, &old, out, errp);
            l->rank = l->local_rank = r;
            return 0;
        }
        if (pid < 0) {
            snprintf(err, errlen, "cannot start rank %d of %d: %s", r, W, strerror(errno));
            sup_kill_all(&s, SIGKILL);
            while (wait(NULL) > 0) {}
            sigprocmask(SIG_SETMASK, &old, NULL);
            munmap(seg, bytes);
            return -1;
        }
        s.pid[r] = pid;
        s.alive[r] = 1;
        s.nalive++;
        atomic_store(&s.h->slot[r].pid, (int32_t)pid);
        if (r > 0) {
            close(out[1]);
            close(errp[1]);
            fcntl(out[0], F_SETFL, O_NONBLOCK);
            fcntl(errp[0], F_SETFL, O_NONBLOCK);
            s.relay[s.nrelay++] = (Relay){ .fd = out[0], .rank = r, .out = 1 };
            s.relay[s.nrelay++] = (Relay){ .fd = errp[0], .rank = r, .out = 2 };
        }
    }
    s.sfd = signalfd(-1, &block, SFD_CLOEXEC);
    signal(SIGPIPE, SIG_IGN);
    exit(supervise(&s));
}

int comm_launch(int ranks, CommLaunch *l, char *err, size_t errlen) {
    if (comm_launch_plan(ranks, l, err, errlen)) return -1;
    return comm_launch_start(l, err, errlen);
}

CommBackend comm_default_backend(const CommLaunch *l, DevKind dev, int gpus) {
#ifdef USE_NCCL
    /* Only a fork job knows that its ranks share GPUs (more ranks than the
     * host has). Under a launcher a rank may see one GPU of its own
     * (srun --gpus-per-task=1) while the node has eight: NCCL then, and
     * NCCL itself refuses two ranks on one GPU. */
    int shared = l->kind == COMM_LAUNCH_FORK && l->world_size > gpus;
    if (dev == DEV_CUDA && gpus > 0 && !shared) return COMM_NCCL;
#else
    (void)l; (void)dev; (void)gpus;
#endif
    return COMM_SHM;
}
