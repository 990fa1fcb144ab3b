/* fuzz/fuzz_tokens.c: token files (data.c): data_parse of the input as a
 * whole file, then data_prepare and one batch of every sequence length the
 * file allows up to 8. Seed: fuzz/seed.c's token file and a text file. */
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
        data_batch(&ds, 3, 4, 1, 2, in, tg);
    }
    data_free(&ds);
    return 0;
}
