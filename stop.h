/* stop.h: how a run stops before its last step and says so (stop.c).
 *
 * A run on a cluster is stopped and started many times: Slurm's time limit
 * (SIGUSR1 ahead of it with `sbatch --signal=USR1@120`, then SIGTERM),
 * preemption, a person's Ctrl-C. Each of them, and --time-limit, finishes the
 * current step, writes a checkpoint and exits EXIT_STOPPED; the same command
 * line then continues the run (--resume means "continue if you can").
 */
#ifndef STOP_H
#define STOP_H

#include <stddef.h>
#include <stdint.h>

/* The exit status of a run stopped early that the same command continues
 * (sysexits.h's EX_TEMPFAIL). 0: the last step is done; 1: a failure; 2: bad input. */
#define EXIT_STOPPED 75

/* SIGINT, SIGTERM and SIGUSR1 ask for a stop after the current step. A
 * second SIGINT stops at once when escalate is set (one process; under
 * --ranks the supervisor does that); SIGTERM and SIGUSR1 never escalate, so
 * Slurm's SIGTERM after SIGUSR1 lets the save finish. */
void stop_signals_install(int escalate);

/* The signal that asked for a stop, or 0. */
int stop_signal(void);

/* One rank's wish after a step, as an int32 whose MAX over every rank is the
 * job's decision (a signal outranks --time-limit's clock, then the higher
 * rank): sig the signal that came (0 none), time_due stop_time_due's answer.
 * 0 when neither. */
int32_t stop_vote(int sig, int time_due, int rank);
/* The decision a vote (after the MAX) carries: the signal, -1 for the time
 * limit, or 0 to go on; *rank (when not NULL) the rank that asked. */
int stop_vote_reason(int32_t vote, int *rank);

/* --time-limit: the wall time a run may take, and what it has learned of its steps and saves. */
typedef struct StopClock {
    double t0_ms;          /* when the run started */
    double limit_ms;       /* 0: no limit */
    double step_ms;        /* the longest step so far */
    double save_ms;        /* the last checkpoint's duration (0: none yet) */
} StopClock;

/* Whether, after a step ending at now_ms, another step and a save would
 * pass the limit: then the run stops here and saves. Never before one step. */
int stop_time_due(const StopClock *c, double now_ms, int steps_done);

/* Takes DIR/.lock (creating DIR) for this process and its children, so two
 * runs never share a checkpoint directory. Returns an fd to keep open, or -1
 * with one line in err naming the other run's host and pid. */
int stop_lock(const char *dir, char *err, size_t errlen);

struct CommGroup;   /* comm.h */

/* Whether to stop after this step: a signal on any rank, or --time-limit's
 * clock on any, all-reduced over world with MAX (stop_vote) so every rank
 * stops after the same step (graceful 0: the supervisor stops the ranks
 * itself, no vote). Returns the signal, -1 for the time limit, or 0; *who
 * the rank that asked. Collective over world. */
int stop_agreed(struct CommGroup *world, int graceful, const StopClock *clock, double now_ms, int steps_done,
                int *who);

/* A step whose loss or gradient norm is not finite (both are the same on
 * every rank: the loss shared by score_share_loss, the norm global) stops
 * the run at once, before anything of it is saved or published, an async
 * save in flight included, so `latest` stays the last finite checkpoint
 * (Megatron's check of the loss and the gradients). Every rank exits 1;
 * rank 0 says so in one line. Returns when both are finite. */
void stop_if_diverged(int rank, int step, double loss, double norm, const char *checkpoint_dir);

#endif
