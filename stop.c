/* stop.c: signals, --time-limit and the checkpoint directory's lock (stop.h).
 *
 * The signal handler only records which signal came (the one piece of
 * global state a handler needs); the loop asks stop_signal() after each
 * step, every rank's answer becomes a vote (stop_vote) whose MAX over the
 * ranks is the job's, so a signal to any one rank (a launcher that signals
 * only some, a person's kill) stops every rank after the same step; each
 * writes its part of the checkpoint and exits EXIT_STOPPED. The lock
 * is flock(2) on DIR/.lock: the kernel lets it go when the run's last
 * process dies, even under kill -9, so a requeued job never finds a stale
 * lock; the file holds "host pid" to name the holder.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/file.h>
#include <sys/stat.h>
#include "stop.h"
#include "comm.h"

static volatile sig_atomic_t stop_sig;   /* the one global: a signal handler's flag */
static volatile sig_atomic_t stop_escalate;

static void on_stop_signal(int sig) {
    if (sig == SIGINT && stop_sig && stop_escalate) {   /* a second Ctrl-C: now */
        signal(sig, SIG_DFL);
        raise(sig);
    }
    if (!stop_sig) stop_sig = sig;
}

void stop_signals_install(int escalate) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART;   /* a stop waits for the step's end: a write blocked on a full pipe goes on, whole */
    sigemptyset(&sa.sa_mask);
    stop_escalate = escalate;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
}

int stop_signal(void) { return stop_sig; }

/* A vote: 0 none; else (key << 20) | rank, the key 1 for the clock and
 * 1 + the signal for a signal, so the MAX over ranks is a signal before the
 * clock, then the highest rank asking. */
#define STOP_RANK_BITS 20

int32_t stop_vote(int sig, int time_due, int rank) {
    int key = sig > 0 ? 1 + (sig & 0xff) : time_due ? 1 : 0;
    return key ? (int32_t)(((uint32_t)key << STOP_RANK_BITS) | ((uint32_t)rank & ((1u << STOP_RANK_BITS) - 1))) : 0;
}

int stop_vote_reason(int32_t vote, int *rank) {
    int key = (int)((uint32_t)vote >> STOP_RANK_BITS);
    if (rank) *rank = key ? (int)((uint32_t)vote & ((1u << STOP_RANK_BITS) - 1)) : 0;
    return key == 0 ? 0 : key == 1 ? -1 : key - 1;
}

int stop_time_due(const StopClock *c, double now_ms, int steps_done) {
    if (c->limit_ms <= 0 || steps_done < 1) return 0;
    /* the next step as long as the longest so far, then a save as long as
     * the last (or, before any, a step's worth) */
    double save = c->save_ms > 0 ? c->save_ms : c->step_ms;
    return now_ms - c->t0_ms + c->step_ms + save >= c->limit_ms;
}

int stop_lock(const char *dir, char *err, size_t errlen) {
    char path[4200], holder[256] = "";
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "--checkpoint-dir %s: %s", dir, strerror(errno));
        return -1;
    }
    snprintf(path, sizeof path, "%s/.lock", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        ssize_t n = pread(fd, holder, sizeof holder - 1, 0);
        holder[n > 0 ? n : 0] = 0;
        holder[strcspn(holder, "\n")] = 0;
        snprintf(err, errlen, "--checkpoint-dir %s is in use by another run (%s): one run a directory",
                 dir, holder[0] ? holder : "holder unknown");
        close(fd);
        return -1;
    }
    char host[128] = "?", line[200];
    gethostname(host, sizeof host - 1);
    int k = snprintf(line, sizeof line, "host %s pid %d\n", host, (int)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)k, 0) != k) { /* the lock holds without the note */ }
    return fd;
}

int stop_agreed(CommGroup *world, int graceful, const StopClock *clock, double now_ms, int steps_done, int *who) {
    int sig = stop_signal();
    int32_t vote = stop_vote(sig, !sig && stop_time_due(clock, now_ms, steps_done), world->index);
    if (world->size > 1 && graceful) comm_all_reduce(world, NULL, &vote, 1, COMM_I32, COMM_MAX);
    return stop_vote_reason(vote, who);
}

void stop_if_diverged(int rank, int step, double loss, double norm, const char *checkpoint_dir) {
    if (isfinite(loss) && isfinite(norm)) return;
    if (rank == 0) {
        fflush(stdout);
        int bad_loss = !isfinite(loss);   /* the loss comes first (the forward), then the gradients */
        fprintf(stderr, "train: step %d diverged: the %s is %g (%s %g): stopped, nothing of step %d saved%s%s\n", step,
                bad_loss ? "loss" : "gradient norm", bad_loss ? loss : norm, bad_loss ? "gradient norm" : "loss",
                bad_loss ? norm : loss, step, checkpoint_dir ? "; --resume continues from the last checkpoint in " : "",
                checkpoint_dir ? checkpoint_dir : "");
    }
    exit(1);
}
