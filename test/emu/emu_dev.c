/* test/emu/emu_dev.c: tensor.h's Dev functions over host memory, for the
 * programs that run the CUDA kernels under the CPU emulation (test/emu/emu.h)
 * in place of tensor.o: "device" memory is host memory, copies are memcpy,
 * and there is one emulated GPU.
 *
 * dev_alloc returns 256-byte aligned memory (as cudaMalloc does) filled with
 * 0xFF, between two guard areas of a known pattern; dev_free checks the
 * guards and exits with a message when a kernel wrote outside its buffer.
 * The allocation's size sits in the front guard, so there is no table.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tensor.h"

#define EMU_GUARD 256      /* bytes before and after each buffer */
#define EMU_GUARD_BYTE 0x5A

static unsigned char *emu_base(void *p) { return (unsigned char *)p - EMU_GUARD; }

int dev_gpu_count(void) { return 1; }

int dev_open(Dev *d, DevKind kind, int gpu, char *err, size_t errlen) {
    memset(d, 0, sizeof *d);
    if (kind != DEV_CUDA) {
        snprintf(err, errlen, "the emulation's Dev only stands for a GPU");
        return -1;
    }
    d->kind = kind;
    d->gpu = gpu;
    d->stream = NULL;
    return 0;
}

void dev_close(Dev *d) { (void)d; }

void *dev_alloc(Dev *d, size_t bytes) {
    size_t body = (bytes + 255) / 256 * 256;
    unsigned char *b = aligned_alloc(256, body + 2 * EMU_GUARD);
    if (!b) {
        fprintf(stderr, "emu: out of host memory (%zu bytes)\n", bytes);
        exit(1);
    }
    memset(b, EMU_GUARD_BYTE, EMU_GUARD);
    memcpy(b, &bytes, sizeof bytes);
    memset(b + EMU_GUARD, 0xFF, bytes);
    memset(b + EMU_GUARD + bytes, EMU_GUARD_BYTE, body - bytes + EMU_GUARD);
    d->bytes_live += bytes;
    if (d->bytes_live > d->bytes_peak) d->bytes_peak = d->bytes_live;
    return b + EMU_GUARD;
}

void dev_free(Dev *d, void *p, size_t bytes) {
    if (!p) return;
    unsigned char *b = emu_base(p);
    size_t have;
    memcpy(&have, b, sizeof have);
    size_t body = (have + 255) / 256 * 256;
    if (have != bytes) {
        fprintf(stderr, "emu: dev_free of %zu bytes on a buffer of %zu\n", bytes, have);
        exit(1);
    }
    for (size_t i = sizeof have; i < EMU_GUARD; i++)
        if (b[i] != EMU_GUARD_BYTE) {
            fprintf(stderr, "emu: a store %zu bytes before a %zu-byte buffer\n", EMU_GUARD - i, bytes);
            exit(1);
        }
    for (size_t i = EMU_GUARD + have; i < body + 2 * EMU_GUARD; i++)
        if (b[i] != EMU_GUARD_BYTE) {
            fprintf(stderr, "emu: a store %zu bytes past the end of a %zu-byte buffer\n",
                    i - EMU_GUARD - have, bytes);
            exit(1);
        }
    d->bytes_live -= bytes;
    free(b);
}

void dev_zero(Dev *d, void *p, size_t bytes) { (void)d; memset(p, 0, bytes); }
void dev_to_host(Dev *d, void *h, const void *s, size_t b) { (void)d; memcpy(h, s, b); }
void dev_from_host(Dev *d, void *dst, const void *h, size_t b) { (void)d; memcpy(dst, h, b); }
void dev_copy(Dev *d, void *dst, const void *s, size_t b) { (void)d; memcpy(dst, s, b); }
void dev_sync(Dev *d) { (void)d; }
