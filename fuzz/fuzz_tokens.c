/* fuzz/fuzz_tokens.c: token files (data.c): data_parse of the input as a
 * whole file, then data_prepare and one batch of every sequence length the
 * file allows up to 8 (its ids checked against 300 as they are read), its
 * position and its description compared with itself. Seed: fuzz/seed.c's token file and a text file. */
#include <stdint.h>
#include <stdlib.h>
#include "data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512];
    DataSet ds;
    if (data_parse(&ds, "fuzz", data, size, err, sizeof err) != 0) return 0;
    int in[2 * 8], tg[2 * 8];
    for (int T = 1; T <= 8; T++) {
        if (data_prepare(&ds, "fuzz", T, T & 1, 7, err, sizeof err) != 0) break;
        data_check_vocab(&ds, 300, err, sizeof err);   /* byte files pass; token files may not */
        data_batch(&ds, 3, 4, 1, 2, in, tg, err, sizeof err);
        char msg[512];
        DataPos p = data_position(&ds, 3, 4, 1);
        char *desc = data_describe(&ds);
        if (p.shard != 0 || p.seq >= ds.n_seqs || data_compare(desc, &ds, msg, sizeof msg) != 0) __builtin_trap();
        free(desc);
    }
    data_free(&ds);
    return 0;
}
