/* selftest.h: the GPU's kernels against the CPU reference, before training.
 *
 * Every op of a CUDA Dev's table (d->ops) runs once on small, seeded inputs
 * of awkward sizes beside the CPU's table of the same dtype (cpu_ops or
 * cpu_bf16_ops), then a 2-layer model runs one forward and backward on both
 * devices. A kernel that is wrong on this GPU (a bad build, a driver, a code
 * path no test reached) stops the run before step 1, naming the kernel.
 */
#ifndef SELFTEST_H
#define SELFTEST_H

#include "tensor.h"

typedef struct SelftestResult {
    DType dtype;          /* the table's dtype */
    int ops;              /* ops of the table checked */
    int model_layers;     /* layers of the whole-model step checked (0: not reached) */
    double worst;         /* the largest relative error seen, every comparison */
    char failed[96];      /* the first comparison that failed, "op (output)"; "" if none */
    double err, tol;      /* its relative error and bound */
    double seconds;       /* wall time of the whole self-test */
} SelftestResult;

/* Runs the self-test on d (a CUDA Dev, its dtype chosen, nothing else needed:
 * everything is allocated and freed here). Returns 0 when every op and the
 * model step match the CPU, -1 at the first that does not (res->failed). */
int selftest_run(Dev *d, SelftestResult *res);

/* The one line that tells a result: "self-test: 23 kernels and a 2-layer
 * step match the CPU (...)", or "error: self-test: kernel <op> differs from
 * the CPU reference: ... (GPU <name>)". */
void selftest_line(const SelftestResult *res, Dev *d, char *buf, size_t len);

/* What train runs at start: selftest_run, then its line (on stdout when say,
 * on stderr always on failure). Returns 0, or -1 when the run must stop. */
int selftest_startup(Dev *d, int say);

#endif
