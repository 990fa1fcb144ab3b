/* tensor.c: a rank's device, its memory and its op table.
 *
 * The CPU needs nothing but malloc; a CUDA device goes through the cuda_*
 * functions of kernels.cu, which exist only in a CUDA build. Everything
 * allocated is counted (bytes_live, bytes_peak) so the memory tables of the
 * ZeRO issue measure what was really held, not what a formula says.
 */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tensor.h"

int dev_gpu_count(void) {
#ifdef USE_CUDA
    return cuda_device_count();
#else
    return 0;
#endif
}

int dev_open(Dev *d, DevKind kind, int gpu, char *err, size_t errlen) {
    memset(d, 0, sizeof *d);
    d->kind = kind;
    d->gpu = -1;
    if (kind == DEV_CPU) {
        d->ops = &cpu_ops;
        return 0;
    }
#ifdef USE_CUDA
    int n = cuda_device_count();
    if (n == 0) {
        snprintf(err, errlen, "--device cuda: no CUDA GPU is visible");
        return -1;
    }
    if (gpu < 0 || gpu >= n) {
        snprintf(err, errlen, "--device cuda: GPU %d does not exist (%d visible)", gpu, n);
        return -1;
    }
    if (cuda_open(gpu, &d->stream, &d->scratch, err, errlen) != 0) return -1;
    d->gpu = gpu;
    d->ops = &cuda_ops;
    return 0;
#else
    snprintf(err, errlen, "--device cuda: this build has no CUDA (nvcc was not found at build time)");
    return -1;
#endif
}

void dev_set_dtype(Dev *d, DType t) {
    d->dtype = t;
#ifdef USE_CUDA
    if (d->kind == DEV_CUDA) { d->ops = t == DT_BF16 ? &cuda_bf16_ops : &cuda_ops; return; }
#endif
    d->ops = t == DT_BF16 ? &cpu_bf16_ops : &cpu_ops;
}

void dev_name(Dev *d, char *buf, size_t len) {
#ifdef USE_CUDA
    if (d->kind == DEV_CUDA) { cuda_device_name(d->gpu, buf, len); return; }
#endif
    snprintf(buf, len, "cpu");
}

void dev_close(Dev *d) {
#ifdef USE_CUDA
    if (d->kind == DEV_CUDA && d->adam_table) cuda_free(d->adam_table);
    if (d->kind == DEV_CUDA) cuda_staging_free(d->staging);
    if (d->kind == DEV_CUDA && d->loss_dev) cuda_free(d->loss_dev);
    if (d->kind == DEV_CUDA && d->loss_host) cuda_free_host(d->loss_host);
    if (d->kind == DEV_CUDA && d->loss_event) cuda_event_free(d->loss_event);
    if (d->kind == DEV_CUDA) cuda_close(d->stream, d->scratch);
#endif
    free(d->adam_table_host);
    d->stream = d->scratch = d->adam_table = d->adam_table_host = d->staging = d->loss_dev = d->loss_host = d->loss_event = NULL;
    d->adam_table_bytes = d->adam_table_cap = 0;
}

/* Host buffers start on a 64-byte line. calloc's large chunks (glibc's mmap'd
 * ones) start 16 bytes past a line, so every row of W and of the activations
 * straddled lines; on 64-byte aligned operands a step's products ran 1.6-2.0%
 * faster (bench/NOTES.md, fifth round). calloc's own pointer sits in the 8
 * bytes below the one returned, for host_free. */
static void *host_alloc(size_t bytes) {
    char *base = calloc(1, bytes + 64);
    if (!base) return NULL;
    char *p = base + 64 - ((uintptr_t)base & 63);  /* 16 to 64 bytes above base */
    memcpy(p - sizeof base, &base, sizeof base);
    return p;
}

static void host_free(void *p) {
    char *base;
    memcpy(&base, (char *)p - sizeof base, sizeof base);
    free(base);
}

void *dev_alloc(Dev *d, size_t bytes) {
    void *p;
    if (bytes == 0) bytes = 1;
#ifdef USE_CUDA
    if (d->kind == DEV_CUDA) {
        p = cuda_malloc(bytes);
        cuda_memset0(p, bytes, d->stream);
    } else if (d->pinned) {
        p = cuda_malloc_host(bytes);
        memset(p, 0, bytes);
    } else
#endif
    {
        p = host_alloc(bytes);
        if (!p) {
            fprintf(stderr, "error: out of host memory allocating %zu bytes\n", bytes);
            exit(1);
        }
    }
    d->bytes_live += bytes;
    if (d->bytes_live > d->bytes_peak) d->bytes_peak = d->bytes_live;
    return p;
}

void dev_free(Dev *d, void *p, size_t bytes) {
    if (!p) return;
    if (bytes == 0) bytes = 1;
#ifdef USE_CUDA
    if (d->kind == DEV_CUDA) cuda_free(p);
    else if (d->pinned) cuda_free_host(p);
    else
#endif
        host_free(p);
    d->bytes_live -= bytes;
}

void dev_zero(Dev *d, void *p, size_t bytes) {
#ifdef USE_CUDA
    if (d->kind == DEV_CUDA) { cuda_memset0(p, bytes, d->stream); return; }
#endif
    /* A buffer of 1 MB or more a piece a thread: on server parts one core
     * cannot write at the memory's speed (a 2-core slice of a Sapphire
     * Rapids Xeon zeroed 124M floats in 43 ms), and the backward's scratch
     * (14 buffers of 0.8-3 MB a layer of GPT-2 124M at 4 x 64) was zeroed
     * by one thread while the other waited: 1.2-2x faster split (Zen 3). */
    int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
    if (bytes < ((size_t)1 << 20) || nt < 2) { memset(p, 0, bytes); return; }
    #pragma omp parallel for num_threads(nt) schedule(static)
    for (int t = 0; t < nt; t++) {
        size_t lo = bytes / nt * t & ~(size_t)63, hi = t == nt - 1 ? bytes : bytes / nt * (t + 1) & ~(size_t)63;
        memset((char *)p + lo, 0, hi - lo);
    }
}

void dev_to_host(Dev *d, void *host_dst, const void *dev_src, size_t bytes) {
#ifdef USE_CUDA
    if (d->kind == DEV_CUDA) { cuda_copy_d2h(host_dst, dev_src, bytes, d->stream); return; }
#endif
    memcpy(host_dst, dev_src, bytes);
}

void dev_from_host(Dev *d, void *dev_dst, const void *host_src, size_t bytes) {
#ifdef USE_CUDA
    if (d->kind == DEV_CUDA) { cuda_copy_h2d_staged(&d->staging, dev_dst, host_src, bytes, d->stream); return; }
#endif
    memcpy(dev_dst, host_src, bytes);
}

void dev_to_host_async(Dev *d, void *host_dst, const void *dev_src, size_t bytes) {
#ifdef USE_CUDA
    if (d->kind == DEV_CUDA) { cuda_copy_d2h_async(host_dst, dev_src, bytes, d->stream); return; }
#endif
    memcpy(host_dst, dev_src, bytes);
}

void dev_from_host_async(Dev *d, void *dev_dst, const void *host_src, size_t bytes) {
#ifdef USE_CUDA
    if (d->kind == DEV_CUDA) { cuda_copy_h2d_async(dev_dst, host_src, bytes, d->stream); return; }
#endif
    memcpy(dev_dst, host_src, bytes);
}

void dev_copy(Dev *d, void *dst, const void *src, size_t bytes) {
#ifdef USE_CUDA
    if (d->kind == DEV_CUDA) { cuda_copy_d2d(dst, src, bytes, d->stream); return; }
#endif
    memmove(dst, src, bytes);
}

void dev_sync(Dev *d) {
#ifdef USE_CUDA
    if (d->kind == DEV_CUDA) cuda_sync(d->stream);
#endif
}

void dev_loss_defer(Dev *d) {
#ifdef USE_CUDA
    if (!d->loss_dev) {
        d->loss_dev = cuda_malloc(3 * sizeof(double));
        cuda_memset0(d->loss_dev, 3 * sizeof(double), d->stream);
        d->loss_host = cuda_malloc_host(3 * sizeof(double));
        d->loss_event = cuda_event_new();
    }
#endif
    d->loss_deferred = 1;
}

float *dev_loss_finish(Dev *d, int M) {
    d->loss_deferred = 0;
#ifdef USE_CUDA
    cuda_loss_finish(d->loss_dev, M, d->stream);
#endif
    (void)M;
    return (float *)((double *)d->loss_dev + 2);
}

void dev_loss_queue(Dev *d) {
#ifdef USE_CUDA
    cuda_copy_d2h_async(d->loss_host, d->loss_dev, 3 * sizeof(double), d->stream);
    cuda_event_record(d->loss_event, d->stream);
#endif
    (void)d;
}

double dev_loss_read(Dev *d, int as_float) {
#ifdef USE_CUDA
    cuda_event_wait(d->loss_event);
#endif
    const double *h = d->loss_host;
    float f;
    memcpy(&f, h + 2, sizeof f);
    return as_float ? (double)f : h[1];
}

void dev_range_push(Dev *d, const char *name) {
#ifdef USE_CUDA
    if (d->kind == DEV_CUDA) cuda_range_push(name);
#endif
    (void)d, (void)name;
}

void dev_range_pop(Dev *d) {
#ifdef USE_CUDA
    if (d->kind == DEV_CUDA) cuda_range_pop();
#endif
    (void)d;
}

/* A counting sort: tokens are counted, the counts summed into starts, then
 * positions dropped into place in increasing order (so each group keeps
 * position order). */
int dev_embed_plan(const int *tokens, int n, int *plan) {
    int vmax = -1;
    for (int i = 0; i < n; i++)
        if (tokens[i] > vmax) vmax = tokens[i];
    if (vmax < 0) {
        plan[0] = 0;
        return 0;
    }
    int *at = calloc((size_t)vmax + 2, sizeof(int));  /* per token: count, then next slot */
    if (!at) {
        fprintf(stderr, "error: out of host memory (embedding plan of %d tokens)\n", n);
        exit(1);
    }
    for (int i = 0; i < n; i++)
        if (tokens[i] >= 0) at[tokens[i]]++;
    int runs = 0, m = 0;
    for (int v = 0; v <= vmax; v++) {
        if (!at[v]) continue;
        plan[runs++] = m;
        const int c = at[v];
        at[v] = m;
        m += c;
    }
    plan[runs] = m;
    int *pos = plan + runs + 1;
    for (int i = 0; i < n; i++)
        if (tokens[i] >= 0) pos[at[tokens[i]]++] = i;
    free(at);
    return runs;
}
