/* fuzz/fuzz_args.c: the command line (main.c's args_parse, which returns
 * its error instead of exiting). The input is the arguments separated by
 * NUL or newline bytes. main.c is included so that its static parser is
 * reachable; its main is renamed away. Seed: fuzz/seed.c's command lines. */
#define main train_main
#include "../main.c"
#undef main

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
