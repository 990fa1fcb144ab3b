/* fuzz/fuzz_log.c: the reader of an earlier --log (runlog.c). A resumed
 * run cuts its --log back to the records up to the step it resumes from
 * and draws them into --plot: the input is that earlier log, read by
 * runlog_init as a run resumed at step s0 (1 + the input's first byte)
 * would, and the plot it fed is then drawn (plot_write). Seed:
 * fuzz/seeds.sh's --log of a short run. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "runlog.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static char dir[64], log[128], plot[128];
    static Run r;   /* a rank 0 with --log and --plot: the fields runlog_init reads */
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/fuzz_log.XXXXXX");
        if (!mkdtemp(dir)) abort();
        snprintf(log, sizeof log, "%s/log.jsonl", dir);
        snprintf(plot, sizeof plot, "%s/plot.svg", dir);
    }
    FILE *f = fopen(log, "wb");
    if (!f) return 0;
    if (size) fwrite(data, 1, size, f);
    fclose(f);
    memset(&r, 0, sizeof r);
    r.a.log = log;
    r.a.plot = plot;
    r.a.steps = 300;
    r.a.layout.batch = r.a.layout.seq = r.a.layout.micro_batches = 1;
    r.mesh.dp = r.mesh.tp = r.mesh.pp = 1;
    r.comm.world_size = 1;
    r.cfg = (GPTConfig){.layers = 1, .heads = 1, .dim = 4, .max_seq = 8, .vocab = 128, .padded_vocab = 128};
    RunLog l;
    runlog_init(&l, &r, 1 + (size ? data[0] : 0));
    char err[512];
    if (l.plot.path) plot_write(&l.plot, err, sizeof err);
    runlog_free(&l);
    return 0;
}
