/* fuzz/fuzz_args.c: the command line (args.c's args_parse, which returns
 * its error instead of exiting). The input is the arguments separated by
 * NUL or newline bytes. Seed: fuzz/seeds.sh's command lines. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "args.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    enum { MAX_ARGS = 64 };
    char *buf = malloc(size + 1), *argv[MAX_ARGS + 2];
    if (!buf) return 0;
    memcpy(buf, data, size);
    buf[size] = 0;
    int argc = 0;
    argv[argc++] = "train";
    char *p = buf, *end = buf + size;
    while (p < end && argc <= MAX_ARGS) {
        char *q = p;
        while (q < end && *q && *q != '\n') q++;
        *q = 0;
        argv[argc++] = p;
        p = q + 1;
    }
    argv[argc] = NULL;
    Args a;
    char err[512];
    args_parse(&a, argc, argv, err, sizeof err);
    free(buf);
    return 0;
}
