/* setup.h: everything `train` checks before a rank exists, and the modes
 * that only explain (setup.c). */
#ifndef SETUP_H
#define SETUP_H

#include "run.h"

/* Checks every flag, file and layout before any rank is started or
 * anything allocated, and fills r's model, device kind, launch plan and
 * data, and a.layout whole (the mesh inferred, layout_check passed, the
 * dtype resolved); exits 2 with one line on the first problem. */
void setup_check(Run *r);

/* The CPU threads a rank uses (--threads, else OMP_NUM_THREADS, else the
 * CPUs this process may run on shared by the ranks on this host); at
 * least 1. */
int setup_threads(const Run *r);

/* The CPUs this process may run on (its affinity mask: taskset, a
 * container's cpuset), their ids in order into ids[0..max-1] when ids is
 * not NULL; all online CPUs where the mask cannot be read. At least 1. */
int setup_cpus(int *ids, int max);

/* --plan-layout: the planner's memory and bytes for this layout, printed;
 * returns the exit status. */
int setup_plan_layout(Run *r);

/* --show-schedule: the schedule as text and SVG; returns the exit status. */
int setup_show_schedule(const Args *a);

/* What a checkpoint of this run at `step` records besides the tensors: the
 * model, the layout it runs under (the mesh's dp, tp, pp, the resolved
 * dtype), the data order's seed. */
void setup_checkpoint_meta(const Run *r, long step, CheckpointMeta *meta);

/* Dense bf16 peak of one device in TFLOP/s for the MFU (--peak-tflops,
 * else known by the GPU's name, else 0: no MFU printed). */
double setup_device_peak(Run *r);

/* Frees what setup_check loaded (the data, tokenizer, eval set, checkpoint). */
void setup_free(Run *r);

/* The warnings setup_check found (data shared by --data and --val, a .bin
 * file read as bytes, --zero 2/3 with --pp), printed by the first rank once
 * every check has passed, so that a bad-input exit stays one line. */
void setup_warnings(const Run *r);

/* What the ranks of one job must agree on, as "name=value" items for the
 * rendezvous (CommLaunch.agree): world, model, layout, batch, optimizer,
 * data (its spec, a digest of its shards' names and sizes) and version. A
 * rank whose items differ from rank 0's stops with rank 0, naming the first
 * (exit 2). Fills item[] and ptr[]; returns how many. */
enum { SETUP_AGREE_ITEMS = 10, SETUP_AGREE_LEN = 512 };
int setup_agreement(const Run *r, char item[][SETUP_AGREE_LEN], const char **ptr);

#endif
