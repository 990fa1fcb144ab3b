/* bench/bench_gpu.c (make bench): every GPU kernel of the bf16 training path
 * at the shapes of GPT-2 124M training, each beside the yardstick it has to
 * be compared with, and the error of the same call beside its speed.
 *
 *   bench_gpu [--only copy|gemm|attention|memory] [--reps N] [--warmup N]
 *             [--sdpa FILE] [--simple] [--help]
 *
 * The shapes: B = 16 sequences of T = 1024 tokens (B*T = 16384 rows),
 * C = 768 channels, 4C = 3072, 12 heads of 64, vocabulary V = 50257 padded
 * to Vp = 50304, 124,475,904 parameters.
 *
 * What is measured, and against what:
 *  - copy: cudaMemcpyAsync device to device of 1 GiB; GB/s counts the bytes
 *    read plus the bytes written. This is the device's measured bandwidth,
 *    the yardstick of every memory-bound row (the data sheet's HBM figure
 *    is printed too, but no kernel reaches it: a copy is what is reachable).
 *  - matmul: tc_gemm (tc.h) in the three products of each linear layer
 *    (qkv, attproj, fc, fcproj, head): forward (bias, bf16 out), dinp
 *    (bf16, written, as training's since 2026-11-28) and dw (float32,
 *    accumulated), with mma.sync, with
 *    wgmma in ping-pong ("wgmma", TC_WGMMA: what training runs on sm_90a)
 *    and wgmma cooperative ("wg-coop", TC_WGMMA_COOP: the kernel before
 *    ping-pong, timed beside it), the ping-pong kernel in clusters of two
 *    CTAs sharing a multicast B tile ("wg-clus", TC_WGMMA_CLUSTER: the next
 *    rung, timed beside it, never TC_AUTO's yet), and on the five products
 *    whose tiles tc_gemm walks in bands (qkv dinp, fc dinp, fcproj fwd,
 *    head dinp, head dw) ping-pong in the m-fastest order ("wg-mfast",
 *    tc_gemm_order: the walk before the bands), beside cuBLAS's cublasGemmEx on the same buffers, layouts
 *    and beta. cuBLAS is linked into this benchmark only, never into train.
 *    Two fused rows, training's products (no cuBLAS beside them): "fc
 *    fwd+gelu" (tc_gemm_gelu: the forward and GELU of it, checked against
 *    gelu of the double product too) and "fcproj dinp+gelu'"
 *    (tc_gemm_gelu_back: dinp written through GELU's derivative, checked
 *    against gelu'(pre) times the double product, with fc's bias gradient
 *    summed from its stored tiles as training runs it); the step sums them
 *    in place of fc fwd, fcproj dinp, the two GELU rows and fc's
 *    bias_grad row. "fcproj dinp+gelu' nosum" is the same product without
 *    the bias sums (not in the step): their cost is the difference, to set
 *    against fc's bias_grad row that they replace.
 *    TFLOP/s = 2MNK / time. cuBLAS's forward adds no bias (cublasGemmEx has
 *    no bias epilogue; the bias is N reads of an M x N product, so this
 *    favours cuBLAS by a hair).
 *  - attention: tc_flash_forward and tc_flash_backward (causal) beside
 *    PyTorch's F.scaled_dot_product_attention, whose times bench/sdpa.py
 *    measures on the same shape and writes to the --sdpa file (this
 *    program cannot call PyTorch). Causal FLOPs: forward 4*B*NH*T*T*hs/2,
 *    backward 2.5 times that. Rows "fwd sm90" and "fb sm90": the forward of
 *    attention_sm90.cu (tc_flash_forward_sm90: wgmma, FlashAttention-3's
 *    design) alone and with train's default backward, "fb sm90 b" with its
 *    own deterministic backward (tc_flash_backward_sm90), beside
 *    attention.cu's ("n/a" where they do not run: not an sm_90a build on an
 *    H100/H200).
 *  - memory-bound kernels (cuda_bf16_ops, and cuda_ops' float32 kernels
 *    beside them where that is cheap): layernorm forward and backward, the
 *    fused add + layernorm, gelu forward and backward, add, the fused
 *    cross-entropy, AdamW (adamw over one buffer, and adamw_segs over
 *    GPT-2's 148 tensors, which is what train calls), the encoder forward
 *    and backward. GB/s counts the least bytes each op must read and write
 *    (the formula is written above each row), as a fraction of the
 *    measured copy bandwidth.
 *
 * How: every time is the median of --reps (default 30) runs after --warmup
 * (default 5) untimed runs, each run bracketed by its own pair of CUDA
 * events on the compute stream. Before each timed run the L2 cache is
 * flushed by writing a buffer four times its size (outside the events):
 * the 25 MB activations of these shapes would otherwise stay in H100's
 * 50 MB L2 between runs, and the memory-bound rows would report a cache's
 * bandwidth instead of HBM's. Inputs are random (uniform, rounded to bf16
 * where bf16), never zeros; outputs that are accumulated start random.
 *
 * The error printed beside each speed is max |got - ref| / max |ref|, from
 * one run of the same call on fresh copies of the same inputs:
 *  - matmul: ref is a host double-precision product over 32 rows of D (all
 *    columns) from the same bf16 inputs, plus the initial value for the
 *    accumulating products; cuBLAS is checked the same way;
 *  - attention: ref is a host double-precision attention of two (batch,
 *    head) pairs, all rows: out and lse after forward; dq, dk, dv after
 *    backward (each divided by the largest gradient of its own block; the
 *    initial dqkv is random and small, so that += is tested without the
 *    bf16 rounding of a large start hiding the gradient);
 *  - memory-bound: ref is cpu_bf16_ops (cpu_ops for the float32 rows and
 *    for adamw) on host copies of the same inputs.
 * A row whose error exceeds its tolerance is marked "!" and counted at the
 * end: 1e-2 where bf16 data is involved (bf16 GEMM outputs, attention, the
 * bf16 table's rows), 1e-3 for float32 work (the dw GEMMs with their
 * float32 output, adamw, the float32 table's rows).
 *
 * The step's kernels: each row that train's GPT-2 124M step runs (one
 * micro-batch of B x T on one GPU) adds its median time times the calls a
 * step makes (gpt.c: per layer four linears, attention, two layernorms, GELU;
 * the head, the embedding and the loss once) to its phase: forward,
 * backward, gradient reduction (none on one GPU), the norm (norm_kernel, not
 * a row here: n/a), the optimizer (adamw_segs). The matmuls count the
 * time of the wgmma kernel TC_AUTO picks (tc_gemm_auto) where one ran
 * (sm_90), else mma.sync's. The sum
 * is printed as "step kernels: ... sum S ms", which bench_gpu.sh sets
 * beside train's measured step: the remainder is the host's share (issue
 * 42's "step minus the sum of its kernels"). Isolated rows run with a cold
 * L2, so the sum leans high; a kernel no row covers (the bf16 casts of the
 * parameters, qkv's bias gradient, the norm) leans it low: both are named.
 *
 * The end: one line per target of issue 42, PASS or MISS, and the count of
 * errors above tolerance. A missed target is not a failure (exit 0); an
 * error that stops the benchmark is one line on stderr and exit 1; a bad
 * command line is exit 2.
 */
#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tensor.h"
#ifdef USE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>  /* each timed row in a range of its name: ncu --nvtx-include picks rows */
#include <stddef.h>
#include "tc.h"
#endif

enum { BENCH_COPY = 1, BENCH_GEMM = 2, BENCH_ATTN = 4, BENCH_MEM = 8, BENCH_ALL = 15 };

typedef struct {
    int only;            /* bit set of the sections to run */
    int reps, warmup;    /* timed and untimed runs of every row */
    int simple;          /* also time TC_SIMPLE in the matmul section */
    const char *sdpa;    /* file written by bench/sdpa.py, or NULL */
} BenchOpts;

static void bench_usage(FILE *f) {
    fprintf(f,
            "usage: bench_gpu [--only copy|gemm|attention|memory] [--reps N] [--warmup N]\n"
            "                 [--sdpa FILE] [--simple] [--help]\n"
            "  --only S     run one section (memory also measures copy, its yardstick)\n"
            "  --reps N     timed runs a row, the median is printed (default 30)\n"
            "  --warmup N   untimed runs before them (default 5)\n"
            "  --sdpa FILE  PyTorch SDPA times written by bench/sdpa.py --out FILE\n"
            "  --simple     also time tc_gemm's simple reference kernel (slow)\n");
}

/* 0: run; 1: --help printed; 2: a bad command line (one line printed). */
static int bench_parse(int argc, char **argv, BenchOpts *o) {
    static const struct option longopts[] = {
        {"only", required_argument, NULL, 'o'}, {"reps", required_argument, NULL, 'r'},
        {"warmup", required_argument, NULL, 'w'}, {"sdpa", required_argument, NULL, 's'},
        {"simple", no_argument, NULL, 'S'},      {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    o->only = BENCH_ALL;
    o->reps = 30;
    o->warmup = 5;
    o->simple = 0;
    o->sdpa = NULL;
    opterr = 0;
    int ch;
    while ((ch = getopt_long(argc, argv, ":", longopts, NULL)) != -1) {
        char *end;
        long v;
        switch (ch) {
        case 'o':
            if (!strcmp(optarg, "copy")) o->only = BENCH_COPY;
            else if (!strcmp(optarg, "gemm") || !strcmp(optarg, "matmul")) o->only = BENCH_GEMM;
            else if (!strcmp(optarg, "attention")) o->only = BENCH_ATTN;
            else if (!strcmp(optarg, "memory")) o->only = BENCH_MEM | BENCH_COPY;
            else {
                fprintf(stderr, "bench_gpu: --only %s: expected copy, gemm, attention or memory\n", optarg);
                return 2;
            }
            break;
        case 'r':
        case 'w':
            v = strtol(optarg, &end, 10);
            if (*end || v < (ch == 'r' ? 1 : 0) || v > 100000) {
                fprintf(stderr, "bench_gpu: --%s %s: expected a count%s\n", ch == 'r' ? "reps" : "warmup",
                        optarg, ch == 'r' ? " >= 1" : " >= 0");
                return 2;
            }
            if (ch == 'r') o->reps = (int)v;
            else o->warmup = (int)v;
            break;
        case 's': o->sdpa = optarg; break;
        case 'S': o->simple = 1; break;
        case 'h': bench_usage(stdout); return 1;
        case ':':
            fprintf(stderr, "bench_gpu: %s needs a value (try --help)\n", argv[optind - 1]);
            return 2;
        default:
            fprintf(stderr, "bench_gpu: bad flag %s (try --help)\n", argv[optind - 1]);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "bench_gpu: unexpected argument %s (try --help)\n", argv[optind]);
        return 2;
    }
    return 0;
}

#ifndef USE_CUDA

int main(int argc, char **argv) {
    BenchOpts o;
    int rc = bench_parse(argc, argv, &o);
    if (rc == 1) return 0;
    if (rc) return rc;
    fprintf(stderr, "bench_gpu: needs a CUDA build (nvcc was not found when this was built)\n");
    return 1;
}

#else /* USE_CUDA */

/* ---------------------------------------------------------------------------
 * Checks, host memory, random numbers, medians. */

#define BENCH_CUDA(call) bench_cuda_check((call), #call, __FILE__, __LINE__)
static void bench_cuda_check(cudaError_t e, const char *call, const char *file, int line) {
    if (e != cudaSuccess) {
        fprintf(stderr, "bench_gpu: CUDA error: %s at %s:%d: %s\n", call, file, line, cudaGetErrorString(e));
        exit(1);
    }
}

#define BENCH_CUBLAS(call) bench_cublas_check((call), #call, __FILE__, __LINE__)
static void bench_cublas_check(cublasStatus_t s, const char *call, const char *file, int line) {
    if (s != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "bench_gpu: cuBLAS error: %s at %s:%d: %s\n", call, file, line, cublasGetStatusString(s));
        exit(1);
    }
}

static void *bench_malloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "bench_gpu: out of host memory allocating %zu bytes\n", bytes);
        exit(1);
    }
    return p;
}

/* splitmix64's finaliser: element i of stream `seed` is a pure function of
 * (seed, i), so the fills are parallel and the same on any thread count. */
static uint64_t bench_mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static double bench_unit(uint64_t seed, size_t i) {   /* uniform [0, 1), 24 bits */
    return (double)(bench_mix(bench_mix(seed) ^ (uint64_t)i) >> 40) * (1.0 / 16777216.0);
}

static void bench_fill_bf16(uint16_t *h, size_t n, uint64_t seed, float lo, float hi) {
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) h[i] = bf16_from_f32(lo + (hi - lo) * (float)bench_unit(seed, i));
}

static void bench_fill_f32(float *h, size_t n, uint64_t seed, float lo, float hi) {
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) h[i] = lo + (hi - lo) * (float)bench_unit(seed, i);
}

static void bench_fill_tokens(int *h, size_t n, uint64_t seed, int V) {
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        int t = (int)(bench_unit(seed, i) * V);
        h[i] = t < V ? t : V - 1;
    }
}

static int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double bench_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* An element of a host activation buffer of dtype dt, as a double. */
static double bench_act(const void *p, size_t i, DType dt) {
    return dt == DT_BF16 ? (double)bf16_to_f32(((const uint16_t *)p)[i]) : (double)((const float *)p)[i];
}

/* The larger of two errors, NaN if either is. */
static double bench_worse(double a, double b) { return (a != a || b != b) ? NAN : a > b ? a : b; }

/* max |got - ref| / max |ref| over n elements of dtype dt (0 when both are 0). */
static double bench_err(const void *got, const void *ref, size_t n, DType dt) {
    double dmax = 0, rmax = 0;
    for (size_t i = 0; i < n; i++) {
        double g = bench_act(got, i, dt), r = bench_act(ref, i, dt), e = fabs(g - r);
        if (!(e <= dmax)) dmax = e;   /* a NaN wins */
        if (fabs(r) > rmax) rmax = fabs(r);
    }
    return rmax > 0 ? dmax / rmax : dmax;
}

/* ---------------------------------------------------------------------------
 * The context: devices, timing, and what the targets need. No globals. */

/* BENCH_T_WGMMA: the wgmma kernel TC_AUTO runs on each product (training's);
 * BENCH_T_PP, BENCH_T_COOP, BENCH_T_CLUS: each wgmma kernel on every product */
enum { BENCH_T_MMA = 0, BENCH_T_WGMMA = 1, BENCH_T_MEM = 2, BENCH_T_COOP = 3, BENCH_T_PP = 4, BENCH_T_CLUS = 5,
       BENCH_NTARGETS = 6 };
/* A training step's phases, for the step's kernel sum */
enum { BENCH_P_FWD, BENCH_P_BWD, BENCH_P_REDUCE, BENCH_P_NORM, BENCH_P_OPT, BENCH_NPHASES };
static const char *const bench_phase_name[BENCH_NPHASES] = {"forward", "backward", "reduction", "norm", "optimizer"};
#define BENCH_LAYERS 12   /* GPT-2 124M */

typedef struct {
    Dev *gpu;              /* the GPU, dtype bf16: cuda_bf16_ops */
    Dev gpu32;             /* the same GPU, stream and scratch, dtype fp32: cuda_ops (never closed) */
    Dev *cpu;              /* the host, dtype bf16: cpu_bf16_ops */
    Dev *cpu32;            /* the host, dtype fp32: cpu_ops */
    cudaStream_t stream;   /* gpu's compute stream: every launch and event */
    cublasHandle_t blas;
    void *blas_ws;         /* cuBLAS workspace [blas_ws_bytes] bytes */
    size_t blas_ws_bytes;
    int reps, warmup, simple;
    cudaEvent_t *ev;       /* [2*reps]: start and stop of each timed run */
    void *flush;           /* [flush_bytes] bytes written before each timed run (L2 flush) */
    size_t flush_bytes;
    double hbm_gbps;       /* data-sheet bandwidth from the memory clock and bus width */
    double copy_gbps;      /* measured copy bandwidth (read + write); 0 until measured */
    /* targets: the worst fraction of the yardstick and where */
    double worst[BENCH_NTARGETS];
    char worst_name[BENCH_NTARGETS][48];
    int nrows[BENCH_NTARGETS];
    int attn_have;         /* tc_flash ran and an SDPA time was read */
    double attn_fwd_pct, attn_fb_pct;
    double attn_det_ratio; /* train's attention (deterministic fwd+bwd) time over SDPA's */
    /* the step's kernels by phase (ms x calls a step), matmuls apart: [phase] */
    double step_ms[BENCH_NPHASES], step_mma[BENCH_NPHASES], step_wgmma[BENCH_NPHASES];
    int step_rows, gemm_products, gemm_wgmma;   /* rows added; products seen, and with a wgmma time */
    /* errors */
    int nchecked, nbad;
    char bad[512];         /* names of the rows above tolerance */
} BenchCtx;

/* Adds a row's time, calls times, to a phase of the step's kernel sum. */
static void bench_step_add(BenchCtx *c, int phase, double ms, int calls) {
    c->step_ms[phase] += ms * calls;
    c->step_rows++;
}

static void bench_target_row(BenchCtx *c, int t, const char *name, double pct) {
    if (c->nrows[t] == 0 || pct < c->worst[t]) {
        c->worst[t] = pct;
        snprintf(c->worst_name[t], sizeof c->worst_name[t], "%.47s", name);
    }
    c->nrows[t]++;
}

/* Records an error check; returns the mark printed beside it. */
static const char *bench_check(BenchCtx *c, const char *name, double err, double tol) {
    c->nchecked++;
    if (err <= tol) return " ";
    c->nbad++;
    size_t len = strlen(c->bad);
    if (len + strlen(name) + 3 < sizeof c->bad) snprintf(c->bad + len, sizeof c->bad - len, "%s%s", len ? ", " : "", name);
    return "!";
}

typedef void (*bench_fn)(void *arg);

/* Median milliseconds of c->reps runs of run(arg) after c->warmup untimed
 * ones. prep(arg), when given, runs before each (untimed: restoring an
 * input the op overwrites); the L2 flush comes after it, then the events. */
static double bench_time(BenchCtx *c, bench_fn run, bench_fn prep, void *arg) {
    for (int i = 0; i < c->warmup; i++) {
        if (prep) prep(arg);
        run(arg);
    }
    for (int i = 0; i < c->reps; i++) {
        if (prep) prep(arg);
        BENCH_CUDA(cudaMemsetAsync(c->flush, i & 0xff, c->flush_bytes, c->stream));
        BENCH_CUDA(cudaEventRecord(c->ev[2 * i], c->stream));
        run(arg);
        BENCH_CUDA(cudaEventRecord(c->ev[2 * i + 1], c->stream));
    }
    BENCH_CUDA(cudaStreamSynchronize(c->stream));
    BENCH_CUDA(cudaGetLastError());
    double *t = bench_malloc((size_t)c->reps * sizeof *t);
    for (int i = 0; i < c->reps; i++) {
        float ms;
        BENCH_CUDA(cudaEventElapsedTime(&ms, c->ev[2 * i], c->ev[2 * i + 1]));
        t[i] = ms;
    }
    double m = bench_median(t, c->reps);
    free(t);
    return m;
}

/* A device buffer of `bytes` holding the host buffer h. */
static void *bench_upload(BenchCtx *c, const void *h, size_t bytes) {
    void *p = dev_alloc(c->gpu, bytes);
    dev_from_host(c->gpu, p, h, bytes);
    return p;
}

/* ---------------------------------------------------------------------------
 * 1. copy: the yardstick of the memory-bound rows. */

typedef struct {
    void *dst;            /* [bytes] */
    const void *src;      /* [bytes] */
    size_t bytes;
    cudaStream_t stream;
} BenchCopy;

static void bench_run_copy(void *arg) {
    BenchCopy *a = arg;
    BENCH_CUDA(cudaMemcpyAsync(a->dst, a->src, a->bytes, cudaMemcpyDeviceToDevice, a->stream));
}

static void bench_copy(BenchCtx *c) {
    size_t bytes = (size_t)1 << 30;
    size_t n = bytes / 2;
    uint16_t *h = bench_malloc(bytes);     /* [n] bf16, random */
    uint16_t *back = bench_malloc(bytes);  /* [n] what dst holds after the copy */
    bench_fill_bf16(h, n, 1, -1, 1);
    BenchCopy a = {dev_alloc(c->gpu, bytes), NULL, bytes, c->stream};
    void *src = bench_upload(c, h, bytes);
    a.src = src;
    double ms = bench_time(c, bench_run_copy, NULL, &a);
    dev_to_host(c->gpu, back, a.dst, bytes);
    int same = memcmp(h, back, bytes) == 0;
    /* bytes: read 1 GiB + write 1 GiB */
    c->copy_gbps = 2.0 * bytes / (ms * 1e-3) / 1e9;
    printf("\n== copy: cudaMemcpyAsync device to device, 1 GiB; GB/s counts bytes read + written\n");
    printf("%-22s %10s %10s %10s %12s %10s\n", "op", "MB", "ms", "GB/s", "of HBM spec", "error");
    printf("%-22s %10.1f %10.3f %10.1f %11.1f%% %10s%s\n", "copy d2d 1 GiB", 2.0 * bytes / 1e6, ms,
           c->copy_gbps, 100.0 * c->copy_gbps / c->hbm_gbps, same ? "exact" : "DIFFERS",
           bench_check(c, "copy", same ? 0 : 1, 0));
    printf("yardstick of the memory-bound rows: %.1f GB/s\n", c->copy_gbps);
    dev_free(c->gpu, a.dst, bytes);
    dev_free(c->gpu, src, bytes);
    free(h);
    free(back);
}

/* ---------------------------------------------------------------------------
 * 2. matmul: tc_gemm beside cuBLAS. */

#define BENCH_CUBLAS_IMPL (-1)
/* TC_WGMMA with its tiles in the m-fastest order (tc_gemm_order, one band
 * of every m-tile): row "wg-mfast", beside "wgmma" on the products whose
 * order tc_gemm bands (bench/NOTES.md, "TMA stores and a tile order") */
#define BENCH_WG_MFAST_IMPL (-2)
#define BENCH_GEMM_ROWS 32   /* rows of D checked against the host */

typedef struct {
    char label[32];                 /* "fc dinp" */
    int M, N, K, a_kmajor, b_kmajor, d_fp32, accumulate;
    const void *A, *B, *bias;       /* device: A [M][K] or [K][M], B [N][K] or [K][N] bf16; bias [N] bf16 or NULL */
    void *D;                        /* device: D [M][N], bf16 or float32 */
    const void *D0;                 /* device: D's initial value [M][N] (random) */
    const uint16_t *hA, *hB, *hbias;/* host copies of A, B, bias */
    const void *hD0;                /* host copy of D0 */
    const void *gpre;               /* device [M][N] bf16 or NULL: the GELU-backward epilogue's pre-activation
                                     * (tc_gemm_gelu_back: D written, gelu'(pre) times the product) */
    const uint16_t *hgpre;          /* its host copy */
    float *gdb;                     /* device [N] float32 or NULL (with gpre): fc's bias gradient summed from
                                     * the stored tiles too (tc_gemm_gelu_back's dbias, accumulated) */
    void *gout;                     /* device [M][N] bf16 or NULL: the GELU-forward epilogue's second output
                                     * (tc_gemm_gelu: D the pre-activation, gout GELU of it) */
} BenchGemm;

typedef struct {
    const BenchGemm *g;
    int impl;                       /* a TcImpl, BENCH_CUBLAS_IMPL or BENCH_WG_MFAST_IMPL */
    cublasHandle_t blas;
    cudaStream_t stream;
    int ret;                        /* tc_gemm's last return */
    float *work;                    /* split-K's room: the Dev's scratch, as in training */
    size_t work_floats;
} BenchGemmRun;

/* D (row-major [M][N]) is column-major D^T [N][M], and D^T = B^T A^T: cuBLAS
 * computes with m = N, n = M, its first operand our B, its second our A.
 *   B kmajor, stored [N][K] = column-major K x N (ld K): transposed to N x K;
 *   B not,    stored [K][N] = column-major N x K (ld N): as is;
 *   A kmajor, stored [M][K] = column-major K x M (ld K): as is;
 *   A not,    stored [K][M] = column-major M x K (ld M): transposed to K x M.
 * The forward is llm.c's (T, N, OC, rows, C), dinp (N, N, C, rows, OC) and
 * dw (N, T, C, OC, rows). */
static void bench_cublas_gemm(cublasHandle_t h, const BenchGemm *g) {
    float one = 1.0f, beta = g->accumulate ? 1.0f : 0.0f;
    cublasOperation_t ta = g->b_kmajor ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t tb = g->a_kmajor ? CUBLAS_OP_N : CUBLAS_OP_T;
    int lda = g->b_kmajor ? g->K : g->N;
    int ldb = g->a_kmajor ? g->K : g->M;
    BENCH_CUBLAS(cublasGemmEx(h, ta, tb, g->N, g->M, g->K, &one, g->B, CUDA_R_16BF, lda, g->A, CUDA_R_16BF,
                              ldb, &beta, g->D, g->d_fp32 ? CUDA_R_32F : CUDA_R_16BF, g->N,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

static void bench_run_gemm(void *arg) {
    BenchGemmRun *r = arg;
    const BenchGemm *g = r->g;
    if (r->impl == BENCH_CUBLAS_IMPL) bench_cublas_gemm(r->blas, g);
    else if (g->gout)
        r->ret = tc_gemm_gelu((TcImpl)r->impl, g->D, g->gout, g->A, g->a_kmajor, g->B, g->b_kmajor, g->bias, g->M,
                              g->N, g->K, (void *)r->stream);
    else if (g->gpre)
        r->ret = tc_gemm_gelu_back((TcImpl)r->impl, g->D, g->A, g->a_kmajor, g->B, g->b_kmajor, g->gpre, g->gdb,
                                   g->M, g->N, g->K, r->work, r->work_floats, (void *)r->stream);
    else if (r->impl == BENCH_WG_MFAST_IMPL)
        r->ret = tc_gemm_order(TC_WGMMA, 1 << 30, g->D, g->d_fp32, g->accumulate, g->A, g->a_kmajor, g->B,
                               g->b_kmajor, g->bias, g->M, g->N, g->K, r->work, r->work_floats,
                               (void *)r->stream);
    else
        r->ret = tc_gemm((TcImpl)r->impl, g->D, g->d_fp32, g->accumulate, g->A, g->a_kmajor, g->B,
                         g->b_kmajor, g->bias, g->M, g->N, g->K, r->work, r->work_floats,
                         (void *)r->stream);
}

static void bench_gemm_rows(int M, int *rows) {   /* rows [BENCH_GEMM_ROWS], spread, first and last included */
    for (int i = 0; i < BENCH_GEMM_ROWS; i++) rows[i] = (int)((long)i * (M - 1) / (BENCH_GEMM_ROWS - 1));
}

/* prod [BENCH_GEMM_ROWS][N]: sum_k A(m,k) B(k,n) in double for the sampled rows m. */
static void bench_gemm_ref(const BenchGemm *g, const int *rows, double *prod) {
    int M = g->M, N = g->N, K = g->K;
    float *Bf = bench_malloc((size_t)K * N * sizeof *Bf);   /* [K][N] B widened */
    #pragma omp parallel for schedule(static)
    for (int k = 0; k < K; k++)
        for (int n = 0; n < N; n++)
            Bf[(size_t)k * N + n] = bf16_to_f32(g->b_kmajor ? g->hB[(size_t)n * K + k] : g->hB[(size_t)k * N + n]);
    #pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < BENCH_GEMM_ROWS; i++) {
        int m = rows[i];
        double *acc = prod + (size_t)i * N;   /* [N] */
        for (int n = 0; n < N; n++) acc[n] = 0;
        for (int k = 0; k < K; k++) {
            double a = bf16_to_f32(g->a_kmajor ? g->hA[(size_t)m * K + k] : g->hA[(size_t)k * M + m]);
            const float *b = Bf + (size_t)k * N;
            for (int n = 0; n < N; n++) acc[n] += a * b[n];
        }
    }
    free(Bf);
}

/* GELU's derivative (tanh approximation) in double: the fused row's reference. */
static double bench_gelu_grad(double x) {
    const double s = 0.7978845608028654, th = tanh(s * (x + 0.044715 * x * x * x));
    return 0.5 * (1 + th) + 0.5 * x * (1 - th * th) * s * (1 + 3 * 0.044715 * x * x);
}

/* Resets D to D0, runs once, reads the sampled rows back and returns the
 * error against prod (+ D0 when accumulating, + bias when with_bias; times
 * gelu'(pre) with gpre), or -1 when tc_gemm refused the implementation. */
static double bench_gemm_check(BenchCtx *c, BenchGemmRun *r, const int *rows, const double *prod, int with_bias) {
    const BenchGemm *g = r->g;
    size_t es = g->d_fp32 ? 4 : 2;
    int N = g->N;
    dev_copy(c->gpu, g->D, g->D0, (size_t)g->M * N * es);
    r->ret = 0;
    bench_run_gemm(r);
    if (r->ret < 0) return -1;
    void *got = bench_malloc((size_t)BENCH_GEMM_ROWS * N * es);   /* [BENCH_GEMM_ROWS][N] */
    for (int i = 0; i < BENCH_GEMM_ROWS; i++)
        dev_to_host(c->gpu, (char *)got + (size_t)i * N * es, (const char *)g->D + (size_t)rows[i] * N * es,
                    (size_t)N * es);
    double dmax = 0, rmax = 0;
    for (int i = 0; i < BENCH_GEMM_ROWS; i++)
        for (int n = 0; n < N; n++) {
            size_t gi = (size_t)i * N + n, di = (size_t)rows[i] * N + n;
            double ref = prod[gi];
            if (g->accumulate) ref += bench_act(g->hD0, di, g->d_fp32 ? DT_F32 : DT_BF16);
            if (with_bias && g->hbias) ref += bf16_to_f32(g->hbias[n]);
            if (g->hgpre) ref *= bench_gelu_grad(bf16_to_f32(g->hgpre[di]));
            double e = fabs(bench_act(got, gi, g->d_fp32 ? DT_F32 : DT_BF16) - ref);
            if (!(e <= dmax)) dmax = e;
            if (fabs(ref) > rmax) rmax = fabs(ref);
        }
    free(got);
    double err = rmax > 0 ? dmax / rmax : dmax;
    if (g->gout) {  /* fc fwd+gelu: GELU's output against gelu(prod + bias) in double */
        uint16_t *gg = bench_malloc((size_t)BENCH_GEMM_ROWS * N * 2);   /* [BENCH_GEMM_ROWS][N] */
        for (int i = 0; i < BENCH_GEMM_ROWS; i++)
            dev_to_host(c->gpu, gg + (size_t)i * N, (const uint16_t *)g->gout + (size_t)rows[i] * N, (size_t)N * 2);
        double gmax = 0, grmax = 0;
        for (int i = 0; i < BENCH_GEMM_ROWS; i++)
            for (int n = 0; n < N; n++) {
                double x = prod[(size_t)i * N + n] + (with_bias && g->hbias ? bf16_to_f32(g->hbias[n]) : 0);
                double ref = 0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
                double e = fabs(bf16_to_f32(gg[(size_t)i * N + n]) - ref);
                if (!(e <= gmax)) gmax = e;
                if (fabs(ref) > grmax) grmax = fabs(ref);
            }
        free(gg);
        double gerr = grmax > 0 ? gmax / grmax : gmax;
        if (!(gerr <= err)) err = gerr;
    }
    return err;
}

static const char *bench_impl_name(int impl) {
    switch (impl) {
    case TC_SIMPLE: return "simple";
    case TC_MMA: return "mma";
    case TC_WGMMA: return "wgmma";
    case TC_WGMMA_COOP: return "wg-coop";
    case TC_WGMMA_CLUSTER: return "wg-clus";
    case BENCH_WG_MFAST_IMPL: return "wg-mfast";
    default: return "cublas";
    }
}

/* One product: every implementation checked, then timed; cuBLAS first, so
 * that each of ours can be printed as a fraction of it. */
static void bench_gemm_product(BenchCtx *c, const BenchGemm *g) {
    int impls[7], nimpl = 0;
    /* the fused GELU-backward product has no cuBLAS row (cuBLAS's plain dinp is the row above) */
    if (!g->gpre && !g->gout) impls[nimpl++] = BENCH_CUBLAS_IMPL;
    if (c->simple) impls[nimpl++] = TC_SIMPLE;
    impls[nimpl++] = TC_MMA;
    impls[nimpl++] = TC_WGMMA_COOP;  /* the cooperative kernel, before ping-pong: beside it */
    impls[nimpl++] = TC_WGMMA;
    impls[nimpl++] = TC_WGMMA_CLUSTER;  /* ping-pong in clusters, B multicast: beside it */
    /* the products whose A (or, for head dw, the m-major A) is larger than L2 and read
     * once a wave in the m-fastest order: ping-pong in that order beside tc_gemm's bands */
    static const char *const banded[] = {"qkv dinp", "fc dinp", "fcproj fwd", "head dinp", "head dw"};
    for (size_t i = 0; i < sizeof banded / sizeof *banded; i++)
        if (!g->gpre && !g->gout && !strcmp(g->label, banded[i])) impls[nimpl++] = BENCH_WG_MFAST_IMPL;
    /* the kernel training's TC_AUTO takes here: its row counts in the step and the target */
    const int autoi = tc_gemm_auto(g->d_fp32, g->A, g->a_kmajor, g->B, g->b_kmajor, g->M, g->N, g->K,
                                   DEV_SCRATCH_BYTES / sizeof(float), c->stream);
    int rows[BENCH_GEMM_ROWS];
    bench_gemm_rows(g->M, rows);
    double *prod = bench_malloc((size_t)BENCH_GEMM_ROWS * g->N * sizeof *prod);   /* [32][N] */
    bench_gemm_ref(g, rows, prod);
    double flops = 2.0 * g->M * g->N * g->K, cublas_ms = 0;
    double tol = g->d_fp32 ? 1e-3 : 1e-2;
    for (int j = 0; j < nimpl; j++) {
        BenchGemmRun r = {g, impls[j], c->blas, c->stream, 0, (float *)c->gpu->scratch,
                          DEV_SCRATCH_BYTES / sizeof(float)};
        char name[64], impl[24];
        /* "wgmma/7": split-K into 7 parts; "wgmma/sk": stream-K (tc_gemm_splits 0) */
        const int parts = impls[j] == BENCH_CUBLAS_IMPL ? 1
                          : tc_gemm_splits(impls[j] == BENCH_WG_MFAST_IMPL ? TC_WGMMA : (TcImpl)impls[j], g->d_fp32, g->A, g->a_kmajor, g->B,
                                           g->b_kmajor, g->M, g->N, g->K, r.work_floats, c->stream);
        if (parts == 0) snprintf(impl, sizeof impl, "%s/sk", bench_impl_name(impls[j]));
        else if (parts > 1) snprintf(impl, sizeof impl, "%s/%d", bench_impl_name(impls[j]), parts);
        else snprintf(impl, sizeof impl, "%s", bench_impl_name(impls[j]));
        snprintf(name, sizeof name, "%.31s %s", g->label, impl);
        double err = bench_gemm_check(c, &r, rows, prod, impls[j] != BENCH_CUBLAS_IMPL);
        if (err < 0) {
            printf("%-14s %6d %6d %6d  %-9s %9s %9s %10s %10s\n", j ? "" : g->label, g->M, g->N, g->K,
                   bench_impl_name(impls[j]), "n/a", "n/a", "n/a", "n/a");
            continue;
        }
        char range[80];   /* "gemm fcproj dinp wgmma": test/gpu_session.sh profile's filter ("wg-coop" for the other) */
        snprintf(range, sizeof range, "gemm %.40s %s", g->label, bench_impl_name(impls[j]));
        nvtxRangePushA(range);
        double ms = bench_time(c, bench_run_gemm, NULL, &r);
        nvtxRangePop();
        if (r.ret < 0) {
            fprintf(stderr, "bench_gpu: tc_gemm %s refused a shape it took a moment ago\n", name);
            exit(1);
        }
        if (impls[j] == BENCH_CUBLAS_IMPL) cublas_ms = ms;
        double pct = 100.0 * cublas_ms / ms;
        char pcts[16];
        if (impls[j] == BENCH_CUBLAS_IMPL || cublas_ms <= 0) snprintf(pcts, sizeof pcts, "-");
        else snprintf(pcts, sizeof pcts, "%.1f%%", pct);
        printf("%-14s %6d %6d %6d  %-9s %9.4f %9.1f %10s %10.2e%s\n", j ? "" : g->label, g->M, g->N, g->K,
               impl, ms, flops / (ms * 1e-3) / 1e12, pcts, err,
               bench_check(c, name, err, tol));
        if (g->gpre || g->gout) {  /* not a cuBLAS comparison; in the step in place of the plain product and
                                    * GELU's pass (fcproj dinp + gelu_backward, fc fwd + gelu_forward) */
            const int ph = g->gout ? BENCH_P_FWD : BENCH_P_BWD;
            if (impls[j] == TC_MMA) c->step_mma[ph] += ms * BENCH_LAYERS;
            if (impls[j] == autoi && (autoi == TC_WGMMA || autoi == TC_WGMMA_COOP)) {
                c->step_wgmma[ph] += ms * BENCH_LAYERS;
                c->gemm_wgmma++;
            }
            continue;
        }
        if (impls[j] == TC_MMA) bench_target_row(c, BENCH_T_MMA, g->label, pct);
        if (impls[j] == TC_WGMMA) bench_target_row(c, BENCH_T_PP, g->label, pct);
        if (impls[j] == TC_WGMMA_COOP) bench_target_row(c, BENCH_T_COOP, g->label, pct);
        if (impls[j] == TC_WGMMA_CLUSTER) bench_target_row(c, BENCH_T_CLUS, g->label, pct);
        const int trains = impls[j] == autoi && (autoi == TC_WGMMA || autoi == TC_WGMMA_COOP);
        if (trains) bench_target_row(c, BENCH_T_WGMMA, g->label, pct);
        /* the step: every layer's linear, the head's once; fwd in forward, dinp and dw in backward */
        const int calls = !strcmp(g->label, "fcproj dinp") || !strcmp(g->label, "fc fwd") ||
                                  strstr(g->label, "nosum")
                              ? 0  /* training runs "fcproj dinp+gelu'", "fc fwd+gelu" */
                          : strncmp(g->label, "head", 4) ? BENCH_LAYERS : 1;
        const int phase = strstr(g->label, " fwd") ? BENCH_P_FWD : BENCH_P_BWD;
        if (impls[j] == TC_MMA) c->step_mma[phase] += ms * calls;
        if (trains) {
            c->step_wgmma[phase] += ms * calls;
            c->gemm_wgmma++;
        }
    }
    c->gemm_products++;
    free(prod);
}

typedef struct {
    const char *name;
    int OC, C;     /* the weight is [OC][C] */
    int bias;      /* GPT-2's head (the tied embedding) has none */
} BenchLinear;

static void bench_gemm(BenchCtx *c) {
    static const BenchLinear lin[] = {
        {"qkv", 2304, 768, 1}, {"attproj", 768, 768, 1}, {"fc", 3072, 768, 1},
        {"fcproj", 768, 3072, 1}, {"head", 50304, 768, 0}};
    const int rows = 16384;
    printf("\n== matmul: bf16 inputs, float32 accumulation, rows = B*T = %d; median of %d runs (CUDA events, L2 flushed)\n",
           rows, c->reps);
    printf("   fwd: out[rows,OC] = inp @ w^T + b (bf16); dinp[rows,C] += dout @ w (bf16); dw[OC,C] += dout^T @ inp (fp32)\n");
    printf("   error: max |D - ref| / max |ref| over %d rows of D, ref in double on the host; cuBLAS's forward has no bias\n",
           BENCH_GEMM_ROWS);
    printf("%-14s %6s %6s %6s  %-9s %9s %9s %10s %10s\n", "product", "M", "N", "K", "impl", "ms", "TFLOP/s",
           "of cuBLAS", "error");
    for (size_t l = 0; l < sizeof lin / sizeof lin[0]; l++) {
        int OC = lin[l].OC, C = lin[l].C;
        size_t nin = (size_t)rows * C, nw = (size_t)OC * C, nout = (size_t)rows * OC;
        uint64_t seed = 100 + 10 * l;
        uint16_t *h_inp = bench_malloc(nin * 2);    /* [rows][C] */
        uint16_t *h_w = bench_malloc(nw * 2);       /* [OC][C] */
        uint16_t *h_bias = bench_malloc((size_t)OC * 2);   /* [OC] */
        uint16_t *h_out0 = bench_malloc(nout * 2);  /* [rows][OC]: out's random start */
        uint16_t *h_dout = bench_malloc(nout * 2);  /* [rows][OC] */
        uint16_t *h_dinp0 = bench_malloc(nin * 2);  /* [rows][C] */
        float *h_dw0 = bench_malloc(nw * 4);        /* [OC][C] */
        bench_fill_bf16(h_inp, nin, seed + 0, -1, 1);
        bench_fill_bf16(h_w, nw, seed + 1, -1, 1);
        bench_fill_bf16(h_bias, (size_t)OC, seed + 2, -1, 1);
        bench_fill_bf16(h_out0, nout, seed + 3, -1, 1);
        bench_fill_bf16(h_dout, nout, seed + 4, -1, 1);
        bench_fill_bf16(h_dinp0, nin, seed + 5, -1, 1);
        bench_fill_f32(h_dw0, nw, seed + 6, -1, 1);
        void *inp = bench_upload(c, h_inp, nin * 2);       /* [rows][C] bf16 */
        void *w = bench_upload(c, h_w, nw * 2);            /* [OC][C] bf16 */
        void *bias = bench_upload(c, h_bias, (size_t)OC * 2);   /* [OC] bf16 */
        void *out0 = bench_upload(c, h_out0, nout * 2);    /* [rows][OC] bf16 */
        void *dout = bench_upload(c, h_dout, nout * 2);    /* [rows][OC] bf16 */
        void *dinp0 = bench_upload(c, h_dinp0, nin * 2);   /* [rows][C] bf16 */
        void *dw0 = bench_upload(c, h_dw0, nw * 4);        /* [OC][C] fp32 */
        void *out = dev_alloc(c->gpu, nout * 2);           /* [rows][OC] bf16 */
        void *dinp = dev_alloc(c->gpu, nin * 2);           /* [rows][C] bf16 */
        void *dw = dev_alloc(c->gpu, nw * 4);              /* [OC][C] fp32 */
        /* fcproj: its dinp again with GELU's backward in the epilogue (training's product):
         * pre [rows][C] bf16 in [-4, 4), GELU's input (fc's output), dfch written into dinp */
        const int fused = !strcmp(lin[l].name, "fcproj"), fused_fwd = !strcmp(lin[l].name, "fc");
        void *gout = fused_fwd ? dev_alloc(c->gpu, nout * 2) : NULL;   /* [rows][OC] bf16: fc fwd+gelu's GELU output */
        uint16_t *h_pre = fused ? bench_malloc(nin * 2) : NULL;   /* [rows][C] */
        if (fused) bench_fill_bf16(h_pre, nin, seed + 7, -4, 4);
        void *pre = fused ? bench_upload(c, h_pre, nin * 2) : NULL;   /* [rows][C] bf16 */
        float *gdb = fused ? dev_alloc(c->gpu, (size_t)C * 4) : NULL;  /* [C] fp32: fc's bias gradient */
        if (gdb) dev_zero(c->gpu, gdb, (size_t)C * 4);
        BenchGemm g[6] = {
            /* forward: M rows, N OC, K C; A = inp [M][K], B = w [N][K] */
            {"", rows, OC, C, 1, 1, 0, 0, inp, w, lin[l].bias ? bias : NULL, out, out0, h_inp, h_w,
             lin[l].bias ? h_bias : NULL, h_out0, NULL, NULL, NULL, NULL},
            /* dinp: M rows, N C, K OC; A = dout [M][K], B = w [K][N]; written, as training's
             * (Ops.matmul_backward: the ping-pong kernel stores it through TMA) */
            {"", rows, C, OC, 1, 0, 0, 0, dout, w, NULL, dinp, dinp0, h_dout, h_w, NULL, h_dinp0, NULL, NULL, NULL,
             NULL},
            /* dw: M OC, N C, K rows; A = dout [K][M], B = inp [K][N]; fp32 */
            {"", OC, C, rows, 0, 0, 1, 1, dout, inp, NULL, dw, dw0, h_dout, h_inp, NULL, h_dw0, NULL, NULL, NULL,
             NULL},
            /* fcproj dinp+gelu': as dinp, D written, with fc's bias gradient from its tiles
             * (tc_gemm_gelu_back with dbias, as training runs it) */
            {"", rows, C, OC, 1, 0, 0, 0, dout, w, NULL, dinp, dinp0, h_dout, h_w, NULL, h_dinp0, pre, h_pre, gdb,
             NULL},
            /* fc fwd+gelu: as fwd, GELU of the stored pre-activation into gout too (tc_gemm_gelu) */
            {"", rows, OC, C, 1, 1, 0, 0, inp, w, bias, out, out0, h_inp, h_w, h_bias, h_out0, NULL, NULL, NULL,
             gout},
            /* fcproj dinp+gelu' without the bias sums (dbias NULL): the fused sums' cost is the
             * difference, to be set against fc's bias_grad row (not in the step) */
            {"", rows, C, OC, 1, 0, 0, 0, dout, w, NULL, dinp, dinp0, h_dout, h_w, NULL, h_dinp0, pre, h_pre, NULL,
             NULL}};
        static const char *what[6] = {"fwd", "dinp", "dw", "dinp+gelu'", "fwd+gelu", "dinp+gelu' nosum"};
        for (int p = 0; p < 6; p++) {
            if (((p == 3 || p == 5) && !fused) || (p == 4 && !fused_fwd)) continue;
            snprintf(g[p].label, sizeof g[p].label, "%s %s", lin[l].name, what[p]);
            bench_gemm_product(c, &g[p]);
        }
        dev_free(c->gpu, inp, nin * 2);
        dev_free(c->gpu, w, nw * 2);
        dev_free(c->gpu, bias, (size_t)OC * 2);
        dev_free(c->gpu, out0, nout * 2);
        dev_free(c->gpu, dout, nout * 2);
        dev_free(c->gpu, dinp0, nin * 2);
        dev_free(c->gpu, dw0, nw * 4);
        dev_free(c->gpu, out, nout * 2);
        dev_free(c->gpu, dinp, nin * 2);
        dev_free(c->gpu, dw, nw * 4);
        if (pre) dev_free(c->gpu, pre, nin * 2);
        if (gdb) dev_free(c->gpu, gdb, (size_t)C * 4);
        if (gout) dev_free(c->gpu, gout, nout * 2);
        free(h_pre);
        free(h_inp);
        free(h_w);
        free(h_bias);
        free(h_out0);
        free(h_dout);
        free(h_dinp0);
        free(h_dw0);
    }
}

/* ---------------------------------------------------------------------------
 * 3. attention: tc_flash_* beside PyTorch's SDPA (times from bench/sdpa.py). */

typedef struct {
    void *out;            /* [B,T,C] bf16 */
    float *lse;           /* [B,NH,T] */
    const void *qkv;      /* [B,T,3C] bf16 */
    void *dqkv;           /* [B,T,3C] bf16, accumulated */
    float *scratch;       /* [tc_flash_scratch_floats] */
    const void *dout;     /* [B,T,C] bf16 */
    int B, T, C, NH, backward, ret;
    int deterministic;    /* tc_flash_backward's: dq without atomics */
    int sm90;             /* 1: the forward by tc_flash_forward_sm90 (attention_sm90.cu); 2: and the
                           * backward by tc_flash_backward_sm90 */
    cudaStream_t stream;
} BenchAttn;

static void bench_run_attn(void *arg) {
    BenchAttn *a = arg;
    int r = a->sm90 ? tc_flash_forward_sm90(a->out, a->lse, a->qkv, a->B, a->T, a->C, a->NH, (void *)a->stream)
                    : tc_flash_forward(a->out, a->lse, a->qkv, a->B, a->T, a->C, a->NH, (void *)a->stream);
    if (r == 0 && a->backward && a->sm90 == 2)
        r = tc_flash_backward_sm90(a->dqkv, a->scratch, a->dout, a->qkv, a->out, a->lse, a->B, a->T, a->C,
                                   a->NH, (void *)a->stream);
    else if (r == 0 && a->backward)
        r = tc_flash_backward(a->dqkv, a->scratch, a->dout, a->qkv, a->out, a->lse, a->B, a->T, a->C, a->NH,
                              a->deterministic, (void *)a->stream);
    a->ret = r;
}

/* Causal attention of (b, h) in double: out [T][hs], lse [T], and the
 * gradients dq, dk, dv [T][hs] for dout. qkv [B,T,3C], dout [B,T,C] bf16. */
static void bench_attn_ref(const uint16_t *qkv, const uint16_t *dout, int b, int h, int T, int C, int NH,
                           double *out, double *lse, double *dq, double *dk, double *dv) {
    int hs = C / NH;
    double scale = 1.0 / sqrt((double)hs);
    size_t C3 = (size_t)3 * C;
    double *q = bench_malloc((size_t)T * hs * sizeof *q), *k = bench_malloc((size_t)T * hs * sizeof *k);
    double *v = bench_malloc((size_t)T * hs * sizeof *v), *go = bench_malloc((size_t)T * hs * sizeof *go);
    double *P = bench_malloc((size_t)T * T * sizeof *P);    /* [T][T], row t defined for t2 <= t */
    double *dS = bench_malloc((size_t)T * T * sizeof *dS);  /* [T][T] */
    for (int t = 0; t < T; t++)
        for (int i = 0; i < hs; i++) {
            size_t base = ((size_t)b * T + t) * C3 + (size_t)h * hs + i;
            q[(size_t)t * hs + i] = bf16_to_f32(qkv[base]);
            k[(size_t)t * hs + i] = bf16_to_f32(qkv[base + C]);
            v[(size_t)t * hs + i] = bf16_to_f32(qkv[base + 2 * (size_t)C]);
            go[(size_t)t * hs + i] = bf16_to_f32(dout[((size_t)b * T + t) * C + (size_t)h * hs + i]);
        }
    #pragma omp parallel for schedule(dynamic, 16)
    for (int t = 0; t < T; t++) {
        double *p = P + (size_t)t * T, mx = -INFINITY, sum = 0;
        for (int t2 = 0; t2 <= t; t2++) {
            double s = 0;
            for (int i = 0; i < hs; i++) s += q[(size_t)t * hs + i] * k[(size_t)t2 * hs + i];
            p[t2] = s * scale;
            if (p[t2] > mx) mx = p[t2];
        }
        for (int t2 = 0; t2 <= t; t2++) sum += exp(p[t2] - mx);
        lse[t] = mx + log(sum);
        for (int t2 = 0; t2 <= t; t2++) p[t2] = exp(p[t2] - lse[t]);
        double Dt = 0;
        for (int i = 0; i < hs; i++) {
            double o = 0;
            for (int t2 = 0; t2 <= t; t2++) o += p[t2] * v[(size_t)t2 * hs + i];
            out[(size_t)t * hs + i] = o;
            Dt += o * go[(size_t)t * hs + i];
        }
        /* dS = P * (dout . v - D), D = dout . out */
        for (int t2 = 0; t2 <= t; t2++) {
            double dp = 0;
            for (int i = 0; i < hs; i++) dp += go[(size_t)t * hs + i] * v[(size_t)t2 * hs + i];
            dS[(size_t)t * T + t2] = p[t2] * (dp - Dt);
        }
        for (int i = 0; i < hs; i++) {
            double s = 0;
            for (int t2 = 0; t2 <= t; t2++) s += dS[(size_t)t * T + t2] * k[(size_t)t2 * hs + i];
            dq[(size_t)t * hs + i] = scale * s;
        }
    }
    #pragma omp parallel for schedule(dynamic, 16)
    for (int t2 = 0; t2 < T; t2++)
        for (int i = 0; i < hs; i++) {
            double sk = 0, sv = 0;
            for (int t = t2; t < T; t++) {
                sk += dS[(size_t)t * T + t2] * q[(size_t)t * hs + i];
                sv += P[(size_t)t * T + t2] * go[(size_t)t * hs + i];
            }
            dk[(size_t)t2 * hs + i] = scale * sk;
            dv[(size_t)t2 * hs + i] = sv;
        }
    free(q);
    free(k);
    free(v);
    free(go);
    free(P);
    free(dS);
}

/* "fwd_ms X" and "fwdbwd_ms Y" from bench/sdpa.py's file; -1 where absent. */
static void bench_read_sdpa(const char *path, double *fwd, double *fb, char *backend, size_t blen) {
    *fwd = *fb = -1;
    snprintf(backend, blen, "?");
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f) return;
    char key[64], val[128];
    while (fscanf(f, "%63s %127s", key, val) == 2) {
        if (!strcmp(key, "fwd_ms")) *fwd = atof(val);
        else if (!strcmp(key, "fwdbwd_ms")) *fb = atof(val);
        else if (!strcmp(key, "backend")) snprintf(backend, blen, "%.63s", val);
    }
    fclose(f);
}

/* Attention at B 16, T 1024, C 768 in NH heads: GPT-2's 12 heads of 64
 * (SDPA beside, the step's sum and the targets take its rows), or 6 heads of
 * 128, attention_sm90.cu's other head size (rows only, no yardstick). */
static void bench_attention(BenchCtx *c, const char *sdpa_path, int NH) {
    const int B = 16, T = 1024, C = 768, hs = C / NH, gpt2 = NH == 12;
    if (!gpt2) sdpa_path = NULL;
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, nlse = (size_t)B * NH * T;
    size_t nscr = tc_flash_scratch_floats(B, T, C, NH);
    double fwd_flops = 4.0 * B * NH * (double)T * T * hs / 2, fb_flops = 3.5 * fwd_flops;
    double sdpa_fwd, sdpa_fb;
    char backend[64];
    bench_read_sdpa(sdpa_path, &sdpa_fwd, &sdpa_fb, backend, sizeof backend);
    printf("\n== attention: causal flash, B %d, T %d, %d heads of %d (C %d), bf16; median of %d runs\n", B, T, NH,
           hs, C, c->reps);
    printf("   flops: forward 4*B*NH*T*T*hs/2 = %.2f GFLOP, backward 2.5x; error vs double on the host, (b,h) = (0,0), (%d,%d)\n",
           fwd_flops / 1e9, B - 1, NH - 1);
    if (sdpa_fwd > 0 || sdpa_fb > 0)
        printf("   yardstick: PyTorch SDPA from %s (backend %s)\n", sdpa_path, backend);
    else if (!gpt2)
        printf("   yardstick: none at this head size (SDPA is timed at GPT-2's 12 heads of 64)\n");
    else
        printf("   yardstick: none (%s): run python3 bench/sdpa.py --out FILE and pass --sdpa FILE\n",
               sdpa_path ? "the --sdpa file is missing or unreadable" : "no --sdpa file");
    uint16_t *h_qkv = bench_malloc(nqkv * 2);     /* [B,T,3C] */
    uint16_t *h_dout = bench_malloc(nout * 2);    /* [B,T,C] */
    uint16_t *h_dqkv0 = bench_malloc(nqkv * 2);   /* [B,T,3C]: dqkv's random start, small */
    bench_fill_bf16(h_qkv, nqkv, 300, -1, 1);
    bench_fill_bf16(h_dout, nout, 301, -1, 1);
    bench_fill_bf16(h_dqkv0, nqkv, 302, -1.0f / 64, 1.0f / 64);
    BenchAttn a;
    memset(&a, 0, sizeof a);
    a.qkv = bench_upload(c, h_qkv, nqkv * 2);
    a.dout = bench_upload(c, h_dout, nout * 2);
    void *dqkv0 = bench_upload(c, h_dqkv0, nqkv * 2);
    a.out = dev_alloc(c->gpu, nout * 2);
    a.lse = dev_alloc(c->gpu, nlse * 4);
    a.dqkv = dev_alloc(c->gpu, nqkv * 2);
    a.scratch = dev_alloc(c->gpu, nscr * 4 + 4);
    a.B = B, a.T = T, a.C = C, a.NH = NH, a.stream = c->stream;
    /* one checked run: forward and backward from dqkv0 */
    dev_copy(c->gpu, a.dqkv, dqkv0, nqkv * 2);
    a.backward = 1;
    bench_run_attn(&a);
    printf("%-10s %9s %9s %9s %9s %10s\n", "pass", "ms", "TFLOP/s", "SDPA ms", "of SDPA", "error");
    if (a.ret != 0) {
        printf("%-10s %9s %9s %9s %9s %10s\n", "forward", "n/a", "n/a", "n/a", "n/a", "n/a");
        printf("%-10s %9s %9s %9s %9s %10s   (tc_flash refuses head size %d)\n", "fwd+bwd", "n/a", "n/a",
               "n/a", "n/a", "n/a", hs);
    } else {
        uint16_t *g_out = bench_malloc(nout * 2), *g_dqkv = bench_malloc(nqkv * 2);
        uint16_t *g_det = bench_malloc(nqkv * 2);   /* the deterministic backward's dqkv */
        float *g_lse = bench_malloc(nlse * 4);
        dev_to_host(c->gpu, g_out, a.out, nout * 2);
        dev_to_host(c->gpu, g_dqkv, a.dqkv, nqkv * 2);
        dev_to_host(c->gpu, g_lse, a.lse, nlse * 4);
        dev_copy(c->gpu, a.dqkv, dqkv0, nqkv * 2);
        a.deterministic = 1;
        bench_run_attn(&a);
        a.deterministic = 0;
        dev_to_host(c->gpu, g_det, a.dqkv, nqkv * 2);
        double e_detd[3] = {0, 0, 0};
        double *r_out = bench_malloc((size_t)T * hs * 8), *r_lse = bench_malloc((size_t)T * 8);
        double *r_d[3];
        for (int j = 0; j < 3; j++) r_d[j] = bench_malloc((size_t)T * hs * 8);   /* dq, dk, dv [T][hs] */
        double e_out_d = 0, e_out_r = 0, e_lse_d = 0, e_lse_r = 0, e_dd[3] = {0, 0, 0}, e_dr[3] = {0, 0, 0};
        int pairs[2][2] = {{0, 0}, {B - 1, NH - 1}};
        for (int pi = 0; pi < 2; pi++) {
            int b = pairs[pi][0], h = pairs[pi][1];
            bench_attn_ref(h_qkv, h_dout, b, h, T, C, NH, r_out, r_lse, r_d[0], r_d[1], r_d[2]);
            for (int t = 0; t < T; t++) {
                double el = fabs(g_lse[((size_t)b * NH + h) * T + t] - r_lse[t]);
                if (!(el <= e_lse_d)) e_lse_d = el;
                if (fabs(r_lse[t]) > e_lse_r) e_lse_r = fabs(r_lse[t]);
                for (int i = 0; i < hs; i++) {
                    size_t oi = ((size_t)b * T + t) * C + (size_t)h * hs + i, ri = (size_t)t * hs + i;
                    double eo = fabs(bf16_to_f32(g_out[oi]) - r_out[ri]);
                    if (!(eo <= e_out_d)) e_out_d = eo;
                    if (fabs(r_out[ri]) > e_out_r) e_out_r = fabs(r_out[ri]);
                    for (int j = 0; j < 3; j++) {
                        size_t qi = ((size_t)b * T + t) * 3 * C + (size_t)j * C + (size_t)h * hs + i;
                        double ref = bf16_to_f32(h_dqkv0[qi]) + r_d[j][ri];
                        double e = fabs(bf16_to_f32(g_dqkv[qi]) - ref);
                        if (!(e <= e_dd[j])) e_dd[j] = e;
                        double ed = fabs(bf16_to_f32(g_det[qi]) - ref);
                        if (!(ed <= e_detd[j])) e_detd[j] = ed;
                        if (fabs(r_d[j][ri]) > e_dr[j]) e_dr[j] = fabs(r_d[j][ri]);
                    }
                }
            }
        }
        double e_out = e_out_r > 0 ? e_out_d / e_out_r : e_out_d, e_lse = e_lse_r > 0 ? e_lse_d / e_lse_r : e_lse_d;
        double e_d[3], e_bwd = 0, e_det = 0;
        for (int j = 0; j < 3; j++) {
            e_d[j] = e_dr[j] > 0 ? e_dd[j] / e_dr[j] : e_dd[j];
            e_bwd = bench_worse(e_bwd, e_d[j]);
            e_det = bench_worse(e_det, e_dr[j] > 0 ? e_detd[j] / e_dr[j] : e_detd[j]);
        }
        double e_fwd = bench_worse(e_out, e_lse);
        /* timing: forward alone, then forward + backward */
        a.backward = 0;
        double ms_f = bench_time(c, bench_run_attn, NULL, &a);
        a.backward = 1;
        double ms_fb = bench_time(c, bench_run_attn, NULL, &a);
        char sf[16] = "-", sfp[16] = "-", sb[16] = "-", sbp[16] = "-";
        if (sdpa_fwd > 0) {
            snprintf(sf, sizeof sf, "%.4f", sdpa_fwd);
            snprintf(sfp, sizeof sfp, "%.1f%%", 100.0 * sdpa_fwd / ms_f);
        }
        if (sdpa_fb > 0) {
            snprintf(sb, sizeof sb, "%.4f", sdpa_fb);
            snprintf(sbp, sizeof sbp, "%.1f%%", 100.0 * sdpa_fb / ms_fb);
        }
        printf("%-10s %9.4f %9.1f %9s %9s %10.2e%s  (out %.1e, lse %.1e)\n", "forward", ms_f,
               fwd_flops / (ms_f * 1e-3) / 1e12, sf, sfp, e_fwd, bench_check(c, "attention forward", e_fwd, 1e-2),
               e_out, e_lse);
        printf("%-10s %9.4f %9.1f %9s %9s %10.2e%s  (--atomic-dq; dq %.1e, dk %.1e, dv %.1e, each / its max |grad|)\n",
               "fwd+bwd", ms_fb, fb_flops / (ms_fb * 1e-3) / 1e12, sb, sbp, e_bwd,
               bench_check(c, "attention backward", e_bwd, 1e-2), e_d[0], e_d[1], e_d[2]);
        printf("%-10s %9.4f %9.1f   (fwd+bwd minus fwd)\n", "backward", ms_fb - ms_f,
               2.5 * fwd_flops / ((ms_fb - ms_f) * 1e-3) / 1e12);
        /* train's default backward: dq without atomics (S and dP twice), the
         * faster on an H200 (bench/NOTES.md): the target's row */
        a.deterministic = 1;
        nvtxRangePushA("attention fwd+bwd deterministic");
        double ms_det = bench_time(c, bench_run_attn, NULL, &a);
        nvtxRangePop();
        a.deterministic = 0;
        char sdp[16] = "-";
        if (sdpa_fb > 0) snprintf(sdp, sizeof sdp, "%.1f%%", 100.0 * sdpa_fb / ms_det);
        if (gpt2) {   /* the step's sum: GPT-2's attention */
            bench_step_add(c, BENCH_P_FWD, ms_f, BENCH_LAYERS);
            bench_step_add(c, BENCH_P_BWD, ms_det - ms_f, BENCH_LAYERS);
        }
        if (sdpa_fb > 0) c->attn_det_ratio = ms_det / sdpa_fb;
        printf("%-10s %9.4f %9.1f %9s %9s %10.2e%s  (fwd+bwd, train's default: dq without atomics)\n",
               "fb determ", ms_det,
               fb_flops / (ms_det * 1e-3) / 1e12, sb, sdp, e_det,
               bench_check(c, "attention backward deterministic", e_det, 1e-2));
        if (sdpa_fb > 0) {
            c->attn_have = 1;
            c->attn_fb_pct = 100.0 * sdpa_fb / ms_det;
            c->attn_fwd_pct = sdpa_fwd > 0 ? 100.0 * sdpa_fwd / ms_f : -1;
        }
        /* attention_sm90.cu's forward (wgmma, FlashAttention-3's design)
         * beside attention.cu's: its error is against the forward checked
         * above (out: max |diff| / max |out|; lse: max |diff| / max |lse|),
         * then its time alone and with train's default backward. */
        a.sm90 = 1;
        a.backward = 0;
        bench_run_attn(&a);
        if (a.ret != 0) {
            printf("%-10s %9s %9s %9s %9s %10s   (tc_flash_forward_sm90 does not run here: needs an sm_90a build on "
                   "an H100/H200)\n", "fwd sm90", "n/a", "n/a", "n/a", "n/a", "n/a");
        } else {
            uint16_t *g_out9 = bench_malloc(nout * 2);
            float *g_lse9 = bench_malloc(nlse * 4);
            dev_to_host(c->gpu, g_out9, a.out, nout * 2);
            dev_to_host(c->gpu, g_lse9, a.lse, nlse * 4);
            double d_o = 0, m_o = 0, d_l = 0, m_l = 0;
            for (size_t i = 0; i < nout; i++) {
                double e = fabs(bf16_to_f32(g_out9[i]) - bf16_to_f32(g_out[i]));
                if (!(e <= d_o)) d_o = e;
                if (fabs(bf16_to_f32(g_out[i])) > m_o) m_o = fabs(bf16_to_f32(g_out[i]));
            }
            for (size_t i = 0; i < nlse; i++) {
                double e = fabs((double)g_lse9[i] - g_lse[i]);
                if (!(e <= d_l)) d_l = e;
                if (fabs(g_lse[i]) > m_l) m_l = fabs(g_lse[i]);
            }
            double e9o = m_o > 0 ? d_o / m_o : d_o, e9l = m_l > 0 ? d_l / m_l : d_l, e9 = bench_worse(e9o, e9l);
            nvtxRangePushA("attention forward sm90");
            double ms9 = bench_time(c, bench_run_attn, NULL, &a);
            nvtxRangePop();
            a.backward = 1;
            a.deterministic = 1;
            double ms9fb = bench_time(c, bench_run_attn, NULL, &a);
            a.deterministic = 0;
            char s9[16] = "-", s9fb[16] = "-";
            if (sdpa_fwd > 0) snprintf(s9, sizeof s9, "%.1f%%", 100.0 * sdpa_fwd / ms9);
            if (sdpa_fb > 0) snprintf(s9fb, sizeof s9fb, "%.1f%%", 100.0 * sdpa_fb / ms9fb);
            printf("%-10s %9.4f %9.1f %9s %9s %10.2e%s  (attention_sm90.cu, wgmma; vs forward above: out %.1e, lse %.1e; "
                   "%.2fx its time)\n", "fwd sm90", ms9, fwd_flops / (ms9 * 1e-3) / 1e12, sf, s9, e9,
                   bench_check(c, "attention forward sm90", e9, 1e-2), e9o, e9l, ms9 / ms_f);
            printf("%-10s %9.4f %9.1f %9s %9s %10s   (fwd sm90 + train's default backward)\n", "fb sm90", ms9fb,
                   fb_flops / (ms9fb * 1e-3) / 1e12, sb, s9fb, "-");
            /* and its backward (heads of 64): dqkv from dqkv0 against the
             * deterministic backward's checked above (g_det), then timed */
            a.sm90 = 2;
            dev_copy(c->gpu, a.dqkv, dqkv0, nqkv * 2);
            bench_run_attn(&a);
            if (a.ret != 0) {
                printf("%-10s %9s %9s %9s %9s %10s   (tc_flash_backward_sm90 does not run here)\n", "fb sm90 b",
                       "n/a", "n/a", "n/a", "n/a", "n/a");
            } else {
                uint16_t *g_b9 = bench_malloc(nqkv * 2);
                dev_to_host(c->gpu, g_b9, a.dqkv, nqkv * 2);
                double d_b = 0, m_b = 0;
                for (size_t i = 0; i < nqkv; i++) {
                    const double ref = bf16_to_f32(g_det[i]) - bf16_to_f32(h_dqkv0[i]);
                    double e = fabs(bf16_to_f32(g_b9[i]) - bf16_to_f32(g_det[i]));
                    if (!(e <= d_b)) d_b = e;
                    if (fabs(ref) > m_b) m_b = fabs(ref);
                }
                const double e9b = m_b > 0 ? d_b / m_b : d_b;
                nvtxRangePushA("attention fwd+bwd sm90");
                double ms9b = bench_time(c, bench_run_attn, NULL, &a);
                nvtxRangePop();
                char s9b[16] = "-";
                if (sdpa_fb > 0) snprintf(s9b, sizeof s9b, "%.1f%%", 100.0 * sdpa_fb / ms9b);
                printf("%-10s %9.4f %9.1f %9s %9s %10.2e%s  (fwd and deterministic bwd of attention_sm90.cu; error "
                       "vs fb determ's dqkv / its max |grad|; %.2fx fb determ's time)\n", "fb sm90 b", ms9b,
                       fb_flops / (ms9b * 1e-3) / 1e12, sb, s9b, e9b,
                       bench_check(c, "attention backward sm90", e9b, 1e-2), ms9b / ms_det);
                free(g_b9);
            }
            free(g_out9);
            free(g_lse9);
        }
        a.sm90 = 0;
        free(g_out);
        free(g_dqkv);
        free(g_det);
        free(g_lse);
        free(r_out);
        free(r_lse);
        for (int j = 0; j < 3; j++) free(r_d[j]);
    }
    dev_free(c->gpu, (void *)a.qkv, nqkv * 2);
    dev_free(c->gpu, (void *)a.dout, nout * 2);
    dev_free(c->gpu, dqkv0, nqkv * 2);
    dev_free(c->gpu, a.out, nout * 2);
    dev_free(c->gpu, a.lse, nlse * 4);
    dev_free(c->gpu, a.dqkv, nqkv * 2);
    dev_free(c->gpu, a.scratch, nscr * 4 + 4);
    free(h_qkv);
    free(h_dout);
    free(h_dqkv0);
}

/* ---------------------------------------------------------------------------
 * 4. memory-bound ops through the Ops tables.
 *
 * A case is a list of buffers and a run function that calls one op on them.
 * The same run function calls the GPU table on device buffers (timed, and
 * once for the check) and the CPU table on host copies (the reference). */

#define BENCH_MAXBUF 8

typedef enum { BENCH_BUF_ACT, BENCH_BUF_F32, BENCH_BUF_TOK } BenchBufKind;

typedef struct {
    BenchBufKind kind;   /* activation in the table's dtype, float32, or int token ids */
    size_t n;            /* elements */
    float lo, hi;        /* uniform random start in [lo, hi); tokens in [0, hi) */
    int out;             /* written by the op: compared with the reference */
    size_t ncheck;       /* elements compared (0: all n) */
} BenchBuf;

typedef struct {
    Dev *d;
    const Ops *ops;
    void *p[BENCH_MAXBUF];
    int N, C, B, T, V, Vp;
    size_t n;
    float dloss;
    int runs;            /* encoder_backward: the plan's (in p[4]) run count, -1 none */
} BenchMemArgs;

typedef struct {
    const char *name;
    char shape[32];
    size_t op_off;          /* offsetof(Ops, op): rows of a table without it print n/a */
    bench_fn run;
    int nbuf;
    BenchBuf buf[BENCH_MAXBUF];
    int N, C, B, T, V, Vp;
    size_t n;
    float dloss;
    int cpu_rows;           /* N of the CPU reference (row-independent ops check a prefix) */
    int ref_f32;            /* reference is cpu_ops whatever the dtype (adamw) */
    int fp32_too;           /* also run cuda_ops (float32) against cpu_ops */
    int restore;            /* 1 + index of a buffer the op overwrites, restored before each run; 0 none */
    double act_elems;       /* activation elements the op must read + write (x the dtype's size) */
    double other_bytes;     /* float32 / int32 bytes it must read + write */
    double tok_bytes;       /* + this many bytes per distinct token id in buffer tok_buf */
    int tok_buf;
    int step_phase, step_calls;   /* the step's kernel sum: its phase, calls a step (0: not in it) */
} BenchMemCase;

static void bench_run_lnf(void *arg) {
    BenchMemArgs *x = arg;
    x->ops->layernorm_forward(x->d, x->p[0], x->p[1], x->p[2], x->p[3], x->p[4], x->p[5], x->N, x->C);
}
static void bench_run_lnb(void *arg) {
    BenchMemArgs *x = arg;
    x->ops->layernorm_backward(x->d, x->p[0], x->p[1], x->p[2], x->p[3], x->p[4], x->p[5], x->p[6], x->p[7],
                               x->N, x->C);
}
static void bench_run_alnf(void *arg) {
    BenchMemArgs *x = arg;
    x->ops->add_layernorm_forward(x->d, x->p[0], x->p[1], x->p[2], x->p[3], x->p[4], x->p[5], x->p[6], x->p[7],
                                  x->N, x->C);
}
static void bench_run_geluf(void *arg) {
    BenchMemArgs *x = arg;
    x->ops->gelu_forward(x->d, x->p[0], x->p[1], x->n);
}
static void bench_run_gelub(void *arg) {
    BenchMemArgs *x = arg;
    x->ops->gelu_backward(x->d, x->p[0], x->p[1], x->p[2], x->n);
}
static void bench_run_add(void *arg) {
    BenchMemArgs *x = arg;
    x->ops->add(x->d, x->p[0], x->p[1], x->p[2], x->n);
}
static void bench_run_biasg(void *arg) {  /* the linear's backward with only its bias gradient */
    BenchMemArgs *x = arg;
    x->ops->matmul_backward(x->d, NULL, NULL, x->p[0], x->p[1], NULL, NULL, x->N, x->C, x->C);
}
static void bench_run_biasg4(void *arg) {  /* the same at 4C wide (fc) */
    BenchMemArgs *x = arg;
    x->ops->matmul_backward(x->d, NULL, NULL, x->p[0], x->p[1], NULL, NULL, x->N, 4 * x->C, 4 * x->C);
}
static void bench_run_xent(void *arg) {
    BenchMemArgs *x = arg;
    x->ops->crossentropy(x->d, x->p[0], x->p[1], x->p[2], x->N, x->V, x->Vp, x->dloss);
}
static void bench_run_adamw(void *arg) {
    BenchMemArgs *x = arg;
    /* step 10 of torch.optim.AdamW(lr 6e-4, betas (0.9, 0.95), eps 1e-8, weight_decay 0.1) */
    x->ops->adamw(x->d, x->p[0], x->p[1], x->p[2], x->p[3], x->n, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f,
                  (float)(1 - pow(0.9, 10)), (float)(1 - pow(0.95, 10)), 1.0f);
}
/* The same update through adamw_segs, what train calls: one launch over the
 * step's pieces, here GPT-2's 148 tensors a layer at a time in llm.c's order
 * (weight decay 0.1 on the matrices, 0 on biases and LayerNorm weights),
 * writing the bf16 copy of the parameters (p[4]) as train's one-GPU step
 * does (zero_update). */
static void bench_run_adamw_segs(void *arg) {
    BenchMemArgs *x = arg;
    enum { L = 12, KINDS = 16 };
    const size_t C = (size_t)x->C, Vp = (size_t)x->Vp, T = (size_t)x->T;
    /* wte, wpe, ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb, lnfw, lnfb */
    const size_t size[KINDS] = {Vp * C, T * C, C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C, 4 * C,
                                4 * C * C, C, C, C};
    static const int per_layer[KINDS] = {0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0};
    static const int matrix[KINDS] = {1, 1, 0, 0, 1, 0, 1, 0, 0, 0, 1, 0, 1, 0, 0, 0};
    AdamSeg segs[4 + 12 * L];
    size_t off = 0;
    int ns = 0;
    for (int k = 0; k < KINDS; k++)
        for (int r = 0; r < (per_layer[k] ? L : 1); r++) {
            segs[ns++] = (AdamSeg){(float *)x->p[0] + off, (const float *)x->p[1] + off, (float *)x->p[2] + off,
                                   (float *)x->p[3] + off, size[k], matrix[k] ? 0.1f : 0.0f,
                                   x->ops->dtype == DT_BF16 ? (uint16_t *)x->p[4] + off : NULL};
            off += size[k];
        }
    if (off != x->n) {
        fprintf(stderr, "bench_gpu: GPT-2's tensors add up to %zu parameters, not %zu\n", off, x->n);
        exit(1);
    }
    x->ops->adamw_segs(x->d, segs, ns, 6e-4f, 0.9f, 0.95f, 1e-8f, (float)(1 - pow(0.9, 10)),
                       (float)(1 - pow(0.95, 10)), 1.0f);
}
static void bench_run_encf(void *arg) {
    BenchMemArgs *x = arg;
    x->ops->encoder_forward(x->d, x->p[0], x->p[1], x->p[2], x->p[3], x->B, x->T, x->C);
}
static void bench_run_encb(void *arg) {
    BenchMemArgs *x = arg;
    x->ops->encoder_backward(x->d, x->p[0], x->p[1], x->p[2], x->p[3], x->p[4], x->runs, x->B, x->T,
                             x->C);
}

typedef struct {
    void *dst;           /* [bytes] device: the buffer the op overwrites */
    const void *src;     /* [bytes] device: its pristine value */
    size_t bytes;
    cudaStream_t stream;
    BenchMemArgs *args;
    bench_fn run;
} BenchMemTimed;

static void bench_run_memtimed(void *arg) {
    BenchMemTimed *t = arg;
    t->run(t->args);
}

static void bench_prep_restore(void *arg) {
    BenchMemTimed *t = arg;
    BENCH_CUDA(cudaMemcpyAsync(t->dst, t->src, t->bytes, cudaMemcpyDeviceToDevice, t->stream));
}

static int bench_has_op(const Ops *ops, size_t off) {
    void (*fp)(void);
    memcpy(&fp, (const char *)ops + off, sizeof fp);
    return fp != NULL;
}

static void bench_mem_case(BenchCtx *c, const BenchMemCase *k, DType dt) {
    Dev *gd = dt == DT_BF16 ? c->gpu : &c->gpu32;
    Dev *hd = (dt == DT_F32 || k->ref_f32) ? c->cpu32 : c->cpu;
    const char *tname = k->ref_f32 ? "fp32" : dt_name(dt);
    if (!bench_has_op(gd->ops, k->op_off) || !bench_has_op(hd->ops, k->op_off)) {
        printf("%-22s %-13s %-5s %9s %9s %9s %9s %10s   (not in this table)\n", k->name, k->shape, tname, "n/a",
               "n/a", "n/a", "n/a", "n/a");
        return;
    }
    size_t es = dt_size(dt), bytes[BENCH_MAXBUF];
    void *h[BENCH_MAXBUF], *g[BENCH_MAXBUF], *got[BENCH_MAXBUF];
    size_t distinct = 0;
    for (int i = 0; i < k->nbuf; i++) {
        const BenchBuf *b = &k->buf[i];
        uint64_t seed = 1000 + 7 * (uint64_t)i + 131 * (uint64_t)strlen(k->name);
        bytes[i] = b->n * (b->kind == BENCH_BUF_ACT ? es : 4);
        h[i] = bench_malloc(bytes[i]);
        got[i] = NULL;
        if (b->kind == BENCH_BUF_TOK) bench_fill_tokens(h[i], b->n, seed, (int)b->hi);
        else if (b->kind == BENCH_BUF_F32 || dt == DT_F32) bench_fill_f32(h[i], b->n, seed, b->lo, b->hi);
        else bench_fill_bf16(h[i], b->n, seed, b->lo, b->hi);
        g[i] = bench_upload(c, h[i], bytes[i]);
    }
    if (k->tok_bytes > 0) {   /* distinct token ids: the rows of dwte the op must read and write */
        const int *tok = h[k->tok_buf];
        unsigned char *seen = bench_malloc((size_t)k->Vp);   /* [Vp] */
        memset(seen, 0, (size_t)k->Vp);
        for (size_t i = 0; i < k->buf[k->tok_buf].n; i++)
            if (!seen[tok[i]]) seen[tok[i]] = 1, distinct++;
        free(seen);
    }
    void *pristine = NULL;
    int ri = k->restore - 1;
    if (ri >= 0) {
        pristine = dev_alloc(c->gpu, bytes[ri]);
        dev_copy(c->gpu, pristine, g[ri], bytes[ri]);
    }
    BenchMemArgs ga = {gd, gd->ops, {NULL}, k->N, k->C, k->B, k->T, k->V, k->Vp, k->n, k->dloss, -1};
    BenchMemArgs ha = {hd, hd->ops, {NULL}, k->cpu_rows, k->C, k->B, k->T, k->V, k->Vp, k->n, k->dloss, -1};
    for (int i = 0; i < k->nbuf; i++) ga.p[i] = g[i], ha.p[i] = h[i];
    int *gplan = NULL;   /* encoder_backward on the GPU: dev_embed_plan's, built (untimed) as training does */
    size_t plan_bytes = 0;
    if (k->tok_bytes > 0) {
        const size_t nt = k->buf[k->tok_buf].n;
        int *plan = bench_malloc((2 * nt + 1) * sizeof(int));
        ga.runs = dev_embed_plan(h[k->tok_buf], (int)nt, plan);
        plan_bytes = ((size_t)ga.runs + 1 + plan[ga.runs]) * sizeof(int);
        gplan = bench_upload(c, plan, plan_bytes);
        ga.p[k->nbuf] = gplan;
        free(plan);
    }
    /* the check: one GPU run, then the CPU table on the host copies in place */
    k->run(&ga);
    dev_sync(c->gpu);
    for (int i = 0; i < k->nbuf; i++)
        if (k->buf[i].out) {
            size_t nc = k->buf[i].ncheck ? k->buf[i].ncheck : k->buf[i].n;
            size_t cb = nc * (k->buf[i].kind == BENCH_BUF_ACT ? es : 4);
            got[i] = bench_malloc(cb);
            dev_to_host(c->gpu, got[i], g[i], cb);
        }
    k->run(&ha);
    double err = 0;
    for (int i = 0; i < k->nbuf; i++)
        if (got[i]) {
            size_t nc = k->buf[i].ncheck ? k->buf[i].ncheck : k->buf[i].n;
            err = bench_worse(err, bench_err(got[i], h[i], nc, k->buf[i].kind == BENCH_BUF_ACT ? dt : DT_F32));
        }
    /* the timing */
    BenchMemTimed t = {ri >= 0 ? g[ri] : NULL, pristine, ri >= 0 ? bytes[ri] : 0, c->stream, &ga, k->run};
    double ms = bench_time(c, bench_run_memtimed, ri >= 0 ? bench_prep_restore : NULL, &t);
    double mb = (k->act_elems * es + k->other_bytes + k->tok_bytes * distinct) / 1e6;
    double gbps = mb / 1e3 / (ms * 1e-3), pct = c->copy_gbps > 0 ? 100.0 * gbps / c->copy_gbps : 0;
    char name[64], pcts[16];
    snprintf(name, sizeof name, "%s %s", k->name, tname);
    if (c->copy_gbps > 0) snprintf(pcts, sizeof pcts, "%.1f%%", pct);
    else snprintf(pcts, sizeof pcts, "-");
    double tol = (dt == DT_BF16 && !k->ref_f32) ? 1e-2 : 1e-3;
    printf("%-22s %-13s %-5s %9.1f %9.4f %9.1f %9s %10.2e%s\n", k->name, k->shape, tname, mb, ms, gbps, pcts, err,
           bench_check(c, name, err, tol));
    if (dt == DT_BF16 && c->copy_gbps > 0) bench_target_row(c, BENCH_T_MEM, k->name, pct);
    if (dt == DT_BF16 && k->step_calls) bench_step_add(c, k->step_phase, ms, k->step_calls);
    for (int i = 0; i < k->nbuf; i++) {
        dev_free(c->gpu, g[i], bytes[i]);
        free(h[i]);
        free(got[i]);
    }
    if (pristine) dev_free(c->gpu, pristine, bytes[ri]);
    if (gplan) dev_free(c->gpu, gplan, plan_bytes);
}

static void bench_memory(BenchCtx *c) {
    const int B = 16, T = 1024, N = B * T, C = 768, V = 50257, Vp = 50304, NS = 1024;
    const size_t NC = (size_t)N * C, n4 = (size_t)N * 4 * C, nparams = 124475904;
    const BenchBufKind A = BENCH_BUF_ACT, F = BENCH_BUF_F32, K = BENCH_BUF_TOK;
    BenchMemCase cases[13];
    memset(cases, 0, sizeof cases);
    int nc = 0;
    BenchMemCase *k;
#define BENCH_CASE(nm, field, fn) \
    (k = &cases[nc++], k->name = nm, k->op_off = offsetof(Ops, field), k->run = fn, k->N = N, k->C = C, \
     k->B = B, k->T = T, k->V = V, k->Vp = Vp, k->cpu_rows = N, k->fp32_too = 1)
#define BENCH_BUF(kd, cnt, l, hh, o) (k->buf[k->nbuf++] = (BenchBuf){kd, cnt, l, hh, o, 0})
/* calls a GPT-2 124M step makes (gpt.c): ln1 a layer and lnf plain, ln2 fused with its residual
 * add, the MLP's residual add and two bias gradients (attproj, fcproj; qkv's 3C wide has no row)
 * a layer, the rest once; GELU runs in fc fwd's and fcproj dinp's epilogues, and fc's bias
 * gradient in fcproj dinp's */
#define BENCH_STEP(ph, n) (k->step_phase = (ph), k->step_calls = (n))

    /* layernorm_forward: read inp N*C + w, b 2C; write out N*C (act); write mean, rstd 2N floats */
    BENCH_CASE("layernorm_forward", layernorm_forward, bench_run_lnf);
    BENCH_STEP(BENCH_P_FWD, BENCH_LAYERS + 1);
    snprintf(k->shape, sizeof k->shape, "%dx%d", N, C);
    BENCH_BUF(A, NC, -1, 1, 1);      /* out [N,C] */
    BENCH_BUF(F, (size_t)N, -1, 1, 1);   /* mean [N] */
    BENCH_BUF(F, (size_t)N, -1, 1, 1);   /* rstd [N] */
    BENCH_BUF(A, NC, -1, 1, 0);      /* inp [N,C] */
    BENCH_BUF(A, (size_t)C, -1, 1, 0);   /* w [C] */
    BENCH_BUF(A, (size_t)C, -1, 1, 0);   /* b [C] */
    k->act_elems = 2.0 * NC + 2.0 * C, k->other_bytes = 8.0 * N;

    /* layernorm_backward: read dout, inp N*C each, dinp N*C and write it back (accumulates), w C (act);
     * read mean, rstd 2N floats; read + write dw, db 4C floats */
    BENCH_CASE("layernorm_backward", layernorm_backward, bench_run_lnb);
    BENCH_STEP(BENCH_P_BWD, 2 * BENCH_LAYERS + 1);
    snprintf(k->shape, sizeof k->shape, "%dx%d", N, C);
    BENCH_BUF(A, NC, -1, 1, 1);      /* dinp [N,C], accumulated */
    BENCH_BUF(F, (size_t)C, -1, 1, 1);   /* dw [C], accumulated */
    BENCH_BUF(F, (size_t)C, -1, 1, 1);   /* db [C], accumulated */
    BENCH_BUF(A, NC, -1, 1, 0);      /* dout [N,C] */
    BENCH_BUF(A, NC, -1, 1, 0);      /* inp [N,C] */
    BENCH_BUF(A, (size_t)C, -1, 1, 0);   /* w [C] */
    BENCH_BUF(F, (size_t)N, -0.1f, 0.1f, 0);   /* mean [N] */
    BENCH_BUF(F, (size_t)N, 0.5f, 2.0f, 0);    /* rstd [N] */
    k->act_elems = 4.0 * NC + C, k->other_bytes = 8.0 * N + 16.0 * C;

    /* add_layernorm_forward: read a, b N*C each + w, bias 2C; write res, out N*C each (act); write mean, rstd */
    BENCH_CASE("add_layernorm_forward", add_layernorm_forward, bench_run_alnf);
    BENCH_STEP(BENCH_P_FWD, BENCH_LAYERS);
    snprintf(k->shape, sizeof k->shape, "%dx%d", N, C);
    BENCH_BUF(A, NC, -1, 1, 1);      /* res [N,C] */
    BENCH_BUF(A, NC, -1, 1, 1);      /* out [N,C] */
    BENCH_BUF(F, (size_t)N, -1, 1, 1);   /* mean [N] */
    BENCH_BUF(F, (size_t)N, -1, 1, 1);   /* rstd [N] */
    BENCH_BUF(A, NC, -1, 1, 0);      /* a [N,C] */
    BENCH_BUF(A, NC, -1, 1, 0);      /* b [N,C] */
    BENCH_BUF(A, (size_t)C, -1, 1, 0);   /* w [C] */
    BENCH_BUF(A, (size_t)C, -1, 1, 0);   /* bias [C] */
    k->act_elems = 4.0 * NC + 2.0 * C, k->other_bytes = 8.0 * N;

    /* gelu_forward: read inp n, write out n (act); not in the step: training runs it inside fc's
     * forward product (the matmul row "fc fwd+gelu") */
    BENCH_CASE("gelu_forward", gelu_forward, bench_run_geluf);
    BENCH_STEP(BENCH_P_FWD, 0);
    snprintf(k->shape, sizeof k->shape, "%dx%d", N, 4 * C);
    k->n = n4;
    BENCH_BUF(A, n4, -1, 1, 1);      /* out [N,4C] */
    BENCH_BUF(A, n4, -4, 4, 0);      /* inp [N,4C] */
    k->act_elems = 2.0 * n4;

    /* gelu_backward: read inp, dout n each, read + write dinp n (accumulates) (act); not in the
     * step: training runs it inside fcproj's dinp product (the matmul row "fcproj dinp+gelu'") */
    BENCH_CASE("gelu_backward", gelu_backward, bench_run_gelub);
    BENCH_STEP(BENCH_P_BWD, 0);
    snprintf(k->shape, sizeof k->shape, "%dx%d", N, 4 * C);
    k->n = n4;
    BENCH_BUF(A, n4, -1, 1, 1);      /* dinp [N,4C], accumulated */
    BENCH_BUF(A, n4, -4, 4, 0);      /* inp [N,4C] */
    BENCH_BUF(A, n4, -1, 1, 0);      /* dout [N,4C] */
    k->act_elems = 4.0 * n4;

    /* add: read a, b n each, write out n (act) */
    BENCH_CASE("add", add, bench_run_add);
    BENCH_STEP(BENCH_P_FWD, BENCH_LAYERS);
    snprintf(k->shape, sizeof k->shape, "%dx%d", N, C);
    k->n = NC;
    BENCH_BUF(A, NC, -1, 1, 1);      /* out [N,C] */
    BENCH_BUF(A, NC, -1, 1, 0);      /* a [N,C] */
    BENCH_BUF(A, NC, -1, 1, 0);      /* b [N,C] */
    k->act_elems = 3.0 * NC;

    /* bias gradient (matmul_backward with dinp and dw NULL): read dout N*OC (act); read + write
     * dbias OC floats; at OC = C (attproj, fcproj) and 4C (fc) */
    BENCH_CASE("bias_grad", matmul_backward, bench_run_biasg);
    BENCH_STEP(BENCH_P_BWD, 2 * BENCH_LAYERS);
    snprintf(k->shape, sizeof k->shape, "%dx%d", N, C);
    BENCH_BUF(F, (size_t)C, -1, 1, 1);         /* dbias [C], accumulated */
    BENCH_BUF(A, NC, -1, 1, 0);                /* dout [N,C] */
    k->act_elems = (double)NC, k->other_bytes = 8.0 * C;
    /* fc's: not in the step; training sums it in fcproj dinp's epilogue (the matmul row
     * "fcproj dinp+gelu'", which now times the sums and their tc_partials_add too) */
    BENCH_CASE("bias_grad", matmul_backward, bench_run_biasg4);
    BENCH_STEP(BENCH_P_BWD, 0);
    snprintf(k->shape, sizeof k->shape, "%dx%d", N, 4 * C);
    BENCH_BUF(F, (size_t)4 * C, -1, 1, 1);     /* dbias [4C], accumulated */
    BENCH_BUF(A, 4 * NC, -1, 1, 0);            /* dout [N,4C] */
    k->act_elems = 4.0 * NC, k->other_bytes = 32.0 * C;

    /* crossentropy, dloss != 0: read the N*V real logits, write N*Vp gradients (padding zeroed) (act);
     * read targets N ints, write losses N floats. The CPU reference runs the first NS rows (rows are
     * independent); logits are restored before each timed run (outside the events). */
    BENCH_CASE("crossentropy", crossentropy, bench_run_xent);
    BENCH_STEP(BENCH_P_FWD, 1);
    snprintf(k->shape, sizeof k->shape, "%dx%d", N, Vp);
    k->dloss = 1.0f / N, k->cpu_rows = NS, k->fp32_too = 0, k->restore = 2;
    BENCH_BUF(F, (size_t)N, -1, 1, 1);                 /* losses [N] */
    k->buf[0].ncheck = NS;
    BENCH_BUF(A, (size_t)N * Vp, -4, 4, 1);            /* logits [N,Vp], becomes its gradient */
    k->buf[1].ncheck = (size_t)NS * Vp;
    BENCH_BUF(K, (size_t)N, 0, (float)V, 0);           /* targets [N] */
    k->act_elems = (double)N * V + (double)N * Vp, k->other_bytes = 8.0 * N;

    /* adamw over every parameter, one launch: read grad; read + write param, m, v (float32); then
       adamw_segs (what train calls): the same bytes over GPT-2's 148 tensors in one launch */
    for (int segs = 0; segs <= 1; segs++) {
        if (!segs) BENCH_CASE("adamw", adamw, bench_run_adamw);
        else BENCH_CASE("adamw_segs", adamw_segs, bench_run_adamw_segs), BENCH_STEP(BENCH_P_OPT, 1);
        snprintf(k->shape, sizeof k->shape, "%zu", nparams);
        k->n = nparams, k->ref_f32 = 1, k->fp32_too = 0;
        BENCH_BUF(F, nparams, -1, 1, 1);           /* param [n] */
        BENCH_BUF(F, nparams, -1, 1, 0);           /* grad [n] */
        BENCH_BUF(F, nparams, -0.1f, 0.1f, 1);     /* m [n] */
        BENCH_BUF(F, nparams, 0, 0.01f, 1);        /* v [n] */
        k->other_bytes = 28.0 * nparams;
        if (segs) {
            BENCH_BUF(A, nparams, -1, 1, 0);       /* the bf16 copy [n], written (test_kernels checks it) */
            k->act_elems = (double)nparams;
        }
    }

    /* encoder_forward: read tokens N ints, wte rows N*C, wpe T*C (act, each wpe row once); write out N*C */
    BENCH_CASE("encoder_forward", encoder_forward, bench_run_encf);
    BENCH_STEP(BENCH_P_FWD, 1);
    snprintf(k->shape, sizeof k->shape, "%dx%dx%d", B, T, C);
    BENCH_BUF(A, NC, -1, 1, 1);                /* out [B,T,C] */
    BENCH_BUF(K, (size_t)N, 0, (float)V, 0);   /* tokens [B,T] */
    BENCH_BUF(A, (size_t)Vp * C, -1, 1, 0);    /* wte [Vp,C] */
    BENCH_BUF(A, (size_t)T * C, -1, 1, 0);     /* wpe [T,C] */
    k->act_elems = 2.0 * NC + (double)T * C, k->other_bytes = 4.0 * N;

    /* encoder_backward: read dout N*C (act) and tokens N ints; read + write dwpe T*C floats and the
     * dwte rows of the distinct tokens U*C floats (U counted from the tokens) */
    BENCH_CASE("encoder_backward", encoder_backward, bench_run_encb);
    BENCH_STEP(BENCH_P_BWD, 1);
    snprintf(k->shape, sizeof k->shape, "%dx%dx%d", B, T, C);
    BENCH_BUF(F, (size_t)Vp * C, -1, 1, 1);    /* dwte [Vp,C], accumulated */
    BENCH_BUF(F, (size_t)T * C, -1, 1, 1);     /* dwpe [T,C], accumulated */
    BENCH_BUF(A, NC, -1, 1, 0);                /* dout [B,T,C] */
    BENCH_BUF(K, (size_t)N, 0, (float)V, 0);   /* tokens [B,T] */
    k->act_elems = (double)NC, k->other_bytes = 4.0 * N + 8.0 * T * C;
    k->tok_bytes = 8.0 * C, k->tok_buf = 3;
#undef BENCH_CASE
#undef BENCH_BUF

    printf("\n== memory-bound ops (cuda_bf16_ops; cuda_ops fp32 beside some): MB = the least bytes the op must read + write\n");
    printf("   GB/s as a fraction of the measured copy (%.1f GB/s); error vs %s / %s on host copies (crossentropy: first %d rows)\n",
           c->copy_gbps, c->cpu->ops->name, c->cpu32->ops->name, NS);
    printf("%-22s %-13s %-5s %9s %9s %9s %9s %10s\n", "op", "shape", "dtype", "MB", "ms", "GB/s", "of copy", "error");
    for (int i = 0; i < nc; i++) {
        bench_mem_case(c, &cases[i], DT_BF16);
        if (cases[i].fp32_too) bench_mem_case(c, &cases[i], DT_F32);
    }
}

/* ---------------------------------------------------------------------------
 * Device, targets, main. */

static void bench_device(BenchCtx *c) {
    struct cudaDeviceProp p;
    int dev, clk = 0, mclk = 0;
    BENCH_CUDA(cudaGetDevice(&dev));
    BENCH_CUDA(cudaGetDeviceProperties(&p, dev));
    /* CUDA 13 dropped the clocks from cudaDeviceProp: read them as attributes (kHz) */
    BENCH_CUDA(cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, dev));
    BENCH_CUDA(cudaDeviceGetAttribute(&mclk, cudaDevAttrMemoryClockRate, dev));
    c->hbm_gbps = 2.0 * mclk * 1e3 * (p.memoryBusWidth / 8.0) / 1e9;
    int rt = 0, drv = 0;
    BENCH_CUDA(cudaRuntimeGetVersion(&rt));
    BENCH_CUDA(cudaDriverGetVersion(&drv));
    printf("bench_gpu: %s (sm_%d%d), %d SMs, SM clock %.0f MHz, memory clock %.0f MHz x %d bits = %.0f GB/s spec, L2 %.0f MB, %.1f GiB\n",
           p.name, p.major, p.minor, p.multiProcessorCount, clk / 1e3, mclk / 1e3, p.memoryBusWidth, c->hbm_gbps,
           p.l2CacheSize / 1e6, p.totalGlobalMem / 1073741824.0);
    printf("bench_gpu: CUDA runtime %d, driver %d; %d timed runs after %d warm-up, median; clocks as read, not locked\n",
           rt, drv, c->reps, c->warmup);
    c->flush_bytes = (size_t)4 * (p.l2CacheSize > 0 ? (size_t)p.l2CacheSize : ((size_t)64 << 20));
    if (c->flush_bytes < ((size_t)64 << 20)) c->flush_bytes = (size_t)64 << 20;
}

/* The step's kernels by phase (see the top), and their sum for bench_gpu.sh. */
static void bench_step(const BenchCtx *c) {
    const int wgmma = c->gemm_products > 0 && c->gemm_wgmma == c->gemm_products;
    double sum = 0;
    printf("\n== the step's kernels: GPT-2 124M, B 16 x T 1024, one GPU: each row's median x its calls a step "
           "(matmuls: %s)\n", c->gemm_products == 0 ? "not run" : wgmma ? "wgmma" : "mma.sync");
    printf("%-10s %10s %10s\n", "phase", "kernels ms", "matmuls");
    for (int p = 0; p < BENCH_NPHASES; p++) {
        double mm = wgmma ? c->step_wgmma[p] : c->step_mma[p], ms = c->step_ms[p] + mm;
        sum += ms;
        if (p == BENCH_P_REDUCE) printf("%-10s %10s %10s   (none on one GPU)\n", bench_phase_name[p], "0", "-");
        else if (p == BENCH_P_NORM) printf("%-10s %10s %10s   (norm_kernel: no row; counted in the remainder)\n",
                                           bench_phase_name[p], "n/a", "-");
        else printf("%-10s %10.3f %10.3f\n", bench_phase_name[p], ms, mm);
    }
    printf("step kernels: sum %.3f ms over %d rows and %d matmul products (cold L2: leans high; no row for the "
           "bf16 parameter casts, qkv's bias gradient, the norm: leans low)\n", sum, c->step_rows, c->gemm_products);
}

/* Issue 42's targets: the ones measured here; bench_gpu.sh prints the end to end ones. */
static void bench_targets(const BenchCtx *c, int only) {
    printf("\n== targets (issue 42)\n");
    if (only & BENCH_GEMM) {
        if (c->nrows[BENCH_T_WGMMA] == 0) printf("target wgmma GEMM, worst training shape, >= 80%% of cuBLAS: no wgmma row ran (n/a)\n");
        else
            printf("target wgmma GEMM (the kernel TC_AUTO runs: ping-pong up to 40 k-blocks a work item, cooperative above), worst "
                   "training shape, >= 80%% of cuBLAS: %.1f%% (%s) over %d rows %s\n",
                   c->worst[BENCH_T_WGMMA], c->worst_name[BENCH_T_WGMMA], c->nrows[BENCH_T_WGMMA],
                   c->worst[BENCH_T_WGMMA] >= 80 ? "PASS" : "MISS");
        if (c->nrows[BENCH_T_PP])
            printf("(wgmma ping-pong on every product: worst %.1f%% of cuBLAS (%s))\n", c->worst[BENCH_T_PP],
                   c->worst_name[BENCH_T_PP]);
        if (c->nrows[BENCH_T_COOP])
            printf("(wgmma cooperative, the kernel before ping-pong, on every product: worst %.1f%% of cuBLAS (%s))\n",
                   c->worst[BENCH_T_COOP], c->worst_name[BENCH_T_COOP]);
        if (c->nrows[BENCH_T_CLUS])
            printf("(wgmma ping-pong in clusters of 2, B multicast, on every product: worst %.1f%% of cuBLAS (%s))\n",
                   c->worst[BENCH_T_CLUS], c->worst_name[BENCH_T_CLUS]);
        if (c->nrows[BENCH_T_MMA])
            printf("(mma.sync, for other cards: worst %.1f%% of cuBLAS (%s); no target)\n", c->worst[BENCH_T_MMA],
                   c->worst_name[BENCH_T_MMA]);
    }
    if (only & BENCH_ATTN) {
        if (c->attn_det_ratio <= 0)
            printf("target attention fwd+bwd <= 1.2x cuDNN SDPA's time: no SDPA time or no tc_flash (n/a)\n");
        else
            printf("target attention fwd+bwd <= 1.2x cuDNN SDPA's time: %.2fx (train's deterministic backward) %s\n",
                   c->attn_det_ratio, c->attn_det_ratio <= 1.2 ? "PASS" : "MISS");
    }
    if ((only & BENCH_MEM) && c->nrows[BENCH_T_MEM])
        printf("(memory-bound, worst %.1f%% of copy (%s); layernorm backward's goal is >= 70%%)\n", c->worst[BENCH_T_MEM],
               c->worst_name[BENCH_T_MEM]);
    printf("target >= 1.0x torch.compile tokens/s, MFU >= 40%% (6N + 6LCT), step minus kernels <= 2%% of the step: "
           "measured by bench/bench_gpu.sh (make bench)\n");
    if (c->nbad == 0) printf("errors: all %d checks within tolerance\n", c->nchecked);
    else printf("errors: %d of %d checks above tolerance: %s\n", c->nbad, c->nchecked, c->bad);
}

int main(int argc, char **argv) {
    BenchOpts o;
    int rc = bench_parse(argc, argv, &o);
    if (rc == 1) return 0;
    if (rc) return rc;
    char err[512];
    Dev gpu, cpu, cpu32;
    if (dev_open(&gpu, DEV_CUDA, 0, err, sizeof err) != 0) {
        fprintf(stderr, "bench_gpu: %s\n", err);
        return 1;
    }
    dev_set_dtype(&gpu, DT_BF16);
    if (dev_open(&cpu, DEV_CPU, 0, err, sizeof err) != 0 || dev_open(&cpu32, DEV_CPU, 0, err, sizeof err) != 0) {
        fprintf(stderr, "bench_gpu: %s\n", err);
        return 1;
    }
    dev_set_dtype(&cpu, DT_BF16);
    BenchCtx c;
    memset(&c, 0, sizeof c);
    c.gpu = &gpu;
    c.gpu32 = gpu;                      /* same stream and scratch; only the table differs */
    dev_set_dtype(&c.gpu32, DT_F32);
    c.cpu = &cpu;
    c.cpu32 = &cpu32;
    c.stream = (cudaStream_t)gpu.stream;
    c.reps = o.reps;
    c.warmup = o.warmup;
    c.simple = o.simple;
    bench_device(&c);
    c.flush = dev_alloc(&gpu, c.flush_bytes);
    c.ev = bench_malloc((size_t)2 * c.reps * sizeof *c.ev);
    for (int i = 0; i < 2 * c.reps; i++) BENCH_CUDA(cudaEventCreate(&c.ev[i]));
    if (o.only & BENCH_GEMM) {
        BENCH_CUBLAS(cublasCreate(&c.blas));
        BENCH_CUBLAS(cublasSetStream(c.blas, c.stream));
        c.blas_ws_bytes = (size_t)32 << 20;   /* what PyTorch gives cuBLAS on Hopper */
        c.blas_ws = dev_alloc(&gpu, c.blas_ws_bytes);
        BENCH_CUBLAS(cublasSetWorkspace(c.blas, c.blas_ws, c.blas_ws_bytes));
    }
    printf("bench_gpu: GPU table %s, fp32 table %s, references %s and %s\n", gpu.ops->name, c.gpu32.ops->name,
           cpu.ops->name, cpu32.ops->name);
    fflush(stdout);
    if (o.only & BENCH_COPY) bench_copy(&c);
    fflush(stdout);
    if (o.only & BENCH_GEMM) bench_gemm(&c);
    fflush(stdout);
    if (o.only & BENCH_ATTN) {
        bench_attention(&c, o.sdpa, 12);
        bench_attention(&c, NULL, 6);   /* heads of 128: attention_sm90.cu's backward's other size */
    }
    fflush(stdout);
    if (o.only & BENCH_MEM) bench_memory(&c);
    if ((o.only & (BENCH_GEMM | BENCH_ATTN | BENCH_MEM)) == (BENCH_GEMM | BENCH_ATTN | BENCH_MEM)) bench_step(&c);
    bench_targets(&c, o.only);
    if (c.blas) {
        BENCH_CUBLAS(cublasDestroy(c.blas));
        dev_free(&gpu, c.blas_ws, c.blas_ws_bytes);
    }
    for (int i = 0; i < 2 * c.reps; i++) BENCH_CUDA(cudaEventDestroy(c.ev[i]));
    free(c.ev);
    dev_free(&gpu, c.flush, c.flush_bytes);
    dev_close(&gpu);
    dev_close(&cpu);
    dev_close(&cpu32);
    return 0;
}

#endif /* USE_CUDA */
