/* fuzz/fuzz_model.c: llm.c model files (ckpt.c). The input is a whole
 * file: its header goes through ckpt_parse_header, the file through
 * ckpt_read_config (size, regular file), and a model small enough to build
 * is loaded by ckpt_load. Seed: fuzz/seed.c's tiny saved model. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "ckpt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512];
    GPTConfig cfg;
    size_t bytes;
    if (size >= 1024) {
        int32_t h[256];
        memcpy(h, data, sizeof h);
        ckpt_parse_header(h, &cfg, &bytes, err, sizeof err);
    }
    int fd = memfd_create("model", 0);
    if (fd < 0) return 0;
    if (write(fd, data, size) != (ssize_t)size) { close(fd); return 0; }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    if (ckpt_read_config(path, &cfg, err, sizeof err) == 0 && gpt_total_params(&cfg) <= (1u << 20)) {
        Dev dev;
        if (dev_open(&dev, DEV_CPU, 0, err, sizeof err) == 0) {
            GPT m;
            GPTShard whole = gpt_whole(&cfg);
            gpt_build(&m, &cfg, &dev, &whole);
            ckpt_load(path, &m, err, sizeof err);
            gpt_free(&m);
            dev_close(&dev);
        }
    }
    close(fd);
    return 0;
}
