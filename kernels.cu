/* kernels.cu: the device side of the ops table, float32 CUDA kernels.
 *
 * This is the one-rank training foundation of the articles on a GPU: every op
 * of tensor.h's Ops table (embedding, LayerNorm, linear layers, causal
 * attention, GELU, the residual, fused softmax + cross-entropy and its
 * vocabulary-parallel form, AdamW and the reductions of the gradient norm),
 * with exactly the contracts of the plain-C reference in ops.c, which
 * test/test_kernels.c checks them against. It also holds the cuda_*
 * functions tensor.c uses for device memory and streams, and the block
 * steps of context parallelism's ring (cuda_cp_*, for cp.c): in bf16 on the
 * flash kernels of attention.cu given the chunk pair, otherwise plain, one
 * thread a (batch, head, row), no tensor cores.
 *
 * Everything is hand-written: no cuBLAS, no cuDNN, no device-wide library
 * algorithms. Reductions use warp shuffles, the matmuls a shared-memory tiled
 * kernel with register blocking. Tensor cores and bf16 come in a later issue;
 * what matters here is that each kernel is correct for any size (tests use
 * sizes that are multiples of nothing) and easy to read next to ops.c.
 *
 * Every kernel runs on the Dev's compute stream, so ops queued one after the
 * other see each other's results without any synchronisation; only the ops
 * that return a value to the host (sumsq, sum) wait for the stream.
 * Sums over rows that many blocks share (dw, db of LayerNorm, dbias) go
 * through partial sums added in a fixed order, so they are the same on every
 * run; dwte (positions that share a token) and the fused attention's dq
 * use atomicAdd, so their float order varies from run to run, by about 1e-7.
 */
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <nvtx3/nvToolsExt.h>  /* header only: a pointer test a call when no tool listens */

extern "C" {
#include "tensor.h"
#include "ops.h"
#include "tc.h"
}
#include "gelu.cuh"

#include "cuda_check.cuh"

#define STREAM(d) ((cudaStream_t)(d)->stream)

static size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

/* Elementwise kernels loop with a grid stride, so a grid of at most 2^20
 * blocks covers any n (size_t) without overflowing gridDim.x. */
static unsigned elementwise_grid(size_t n, int block) {
    size_t g = ceil_div(n, (size_t)block);
    return (unsigned)(g < (1u << 20) ? g : (1u << 20));
}

/* ---------------------------------------------------------------------------
 * Memory, streams and device selection (the cuda_* half of tensor.h). */

extern "C" int cuda_device_count(void) {
    int n = 0;
    /* No driver or no GPU is an answer here, not an error: a CUDA build runs
     * on the CPU of a machine without a GPU. Anything else (a driver older
     * than the runtime linked in, a broken install) is said once on stderr,
     * then counts as no GPU too. Clear the sticky error. */
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaSuccess) return n;
    cudaGetLastError();
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver); /* 0: no driver installed */
    cudaRuntimeGetVersion(&runtime);
    static int said;
    if (e != cudaErrorNoDevice && driver > 0 && !said++) {
        if (e == cudaErrorInsufficientDriver)
            fprintf(stderr, "CUDA error: the driver (CUDA %d.%d) is older than this build's runtime (CUDA %d.%d): "
                    "update the driver or build with an older toolkit\n",
                    driver / 1000, driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10);
        else
            fprintf(stderr, "CUDA error: cudaGetDeviceCount: %s (driver CUDA %d.%d, runtime CUDA %d.%d)\n",
                    cudaGetErrorString(e), driver / 1000, driver % 1000 / 10, runtime / 1000,
                    runtime % 1000 / 10);
    }
    return 0;
}

extern "C" int cuda_open(int gpu, void **stream, void **scratch, char *err, size_t errlen) {
    cudaError_t e = cudaSetDevice(gpu);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "--device cuda: cudaSetDevice(%d) failed: %s", gpu, cudaGetErrorString(e));
        return -1;
    }
    cudaStream_t s;
    e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "--device cuda: creating a stream on GPU %d failed: %s", gpu,
                 cudaGetErrorString(e));
        return -1;
    }
    void *p;
    e = cudaMalloc(&p, DEV_SCRATCH_BYTES);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "--device cuda: allocating %d bytes of scratch on GPU %d failed: %s",
                 DEV_SCRATCH_BYTES, gpu, cudaGetErrorString(e));
        cudaStreamDestroy(s);
        return -1;
    }
    *stream = (void *)s;
    *scratch = p;
    return 0;
}

extern "C" void cuda_device_name(int gpu, char *buf, size_t len) {
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, gpu) != cudaSuccess) {
        cudaGetLastError();
        snprintf(buf, len, "cuda:%d", gpu);
        return;
    }
    snprintf(buf, len, "%s", p.name);
}

extern "C" void cuda_close(void *stream, void *scratch) {
    if (stream) CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)stream));
    if (scratch) CUDA_CHECK(cudaFree(scratch));
    if (stream) CUDA_CHECK(cudaStreamDestroy((cudaStream_t)stream));
}

extern "C" void *cuda_malloc(size_t bytes) {
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        fprintf(stderr, "CUDA error: cudaMalloc(%zu bytes) at %s:%d: %s\n", bytes, __FILE__,
                __LINE__, cudaGetErrorString(e));
        exit(1);
    }
    return p;
}

extern "C" void *cuda_malloc_host(size_t bytes) {
    void *p = NULL;
    CUDA_CHECK(cudaMallocHost(&p, bytes ? bytes : 1));
    return p;
}

extern "C" void cuda_free_host(void *p) {
    if (p) CUDA_CHECK(cudaFreeHost(p));
}

extern "C" void cuda_free(void *p) {
    if (p) CUDA_CHECK(cudaFree(p));
}

extern "C" void cuda_memset0(void *p, size_t bytes, void *stream) {
    if (bytes) CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, (cudaStream_t)stream));
}

/* Host copies wait for the stream: on return the host data is valid (d2h)
 * and the host buffer may be reused (h2d), whatever kind of memory it is. */
extern "C" void cuda_copy_d2h(void *host, const void *dev, size_t bytes, void *stream) {
    if (!bytes) return;
    CUDA_CHECK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, (cudaStream_t)stream));
    CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)stream));
}

extern "C" void cuda_copy_h2d(void *dev, const void *host, size_t bytes, void *stream) {
    if (!bytes) return;
    CUDA_CHECK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, (cudaStream_t)stream));
    CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)stream));
}

/* Pinned staging for small host-to-device copies (tensor.h): 16 slots of
 * 1 MiB (a batch of 64 x 1024's embedding plan fits), used in turn, each
 * with the event of its last copy. */
#define STAGE_SLOTS 16
#define STAGE_SLOT_BYTES ((size_t)1 << 20)
struct CudaStaging {
    char *ring;                       // [STAGE_SLOTS][STAGE_SLOT_BYTES] pinned
    cudaEvent_t done[STAGE_SLOTS];    // each slot's last copy
    int used[STAGE_SLOTS];
    int next;
};

extern "C" void cuda_copy_h2d_staged(void **staging, void *dev, const void *host, size_t bytes, void *stream) {
    if (!bytes) return;
    if (bytes > STAGE_SLOT_BYTES) { cuda_copy_h2d(dev, host, bytes, stream); return; }
    CudaStaging *s = (CudaStaging *)*staging;
    if (!s) {
        s = (CudaStaging *)calloc(1, sizeof *s);
        if (!s) { fprintf(stderr, "error: out of host memory (copy staging)\n"); exit(1); }
        CUDA_CHECK(cudaMallocHost((void **)&s->ring, STAGE_SLOTS * STAGE_SLOT_BYTES));
        for (int k = 0; k < STAGE_SLOTS; k++) CUDA_CHECK(cudaEventCreateWithFlags(&s->done[k], cudaEventDisableTiming));
        *staging = s;
    }
    const int k = s->next;
    s->next = (k + 1) % STAGE_SLOTS;
    if (s->used[k]) CUDA_CHECK(cudaEventSynchronize(s->done[k]));  // the slot's last copy has run
    char *slot = s->ring + (size_t)k * STAGE_SLOT_BYTES;
    memcpy(slot, host, bytes);
    CUDA_CHECK(cudaMemcpyAsync(dev, slot, bytes, cudaMemcpyHostToDevice, (cudaStream_t)stream));
    CUDA_CHECK(cudaEventRecord(s->done[k], (cudaStream_t)stream));
    s->used[k] = 1;
}

extern "C" void cuda_staging_free(void *staging) {
    CudaStaging *s = (CudaStaging *)staging;
    if (!s) return;
    CUDA_CHECK(cudaFreeHost(s->ring));  // waits for the device: no copy from it is left
    for (int k = 0; k < STAGE_SLOTS; k++) CUDA_CHECK(cudaEventDestroy(s->done[k]));
    free(s);
}

extern "C" void cuda_copy_d2h_async(void *host, const void *dev, size_t bytes, void *stream) {
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, (cudaStream_t)stream));
}

extern "C" void cuda_copy_h2d_async(void *dev, const void *host, size_t bytes, void *stream) {
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, (cudaStream_t)stream));
}

extern "C" void cuda_copy_d2d(void *dst, const void *src, size_t bytes, void *stream) {
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)stream));
}

extern "C" void cuda_sync(void *stream) {
    CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)stream));
}

extern "C" void cuda_range_push(const char *name) { nvtxRangePushA(name); }
extern "C" void cuda_range_pop(void) { nvtxRangePop(); }

/* ---------------------------------------------------------------------------
 * Warp and block reductions. A block reduction leaves the result in every
 * thread; blockDim.x must be a multiple of 32 and at most 1024. */

template <typename T> __device__ __forceinline__ T warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* shared: 32 slots. The leading barrier lets one call follow another on the
 * same slots: no warp writes them before every warp has read the last result. */
template <typename T> __device__ T block_sum(T v, T *shared) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    return warp_sum(lane < warps ? shared[lane] : (T)0);
}

__device__ float block_max(float v, float *shared) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    return warp_max(lane < warps ? shared[lane] : -INFINITY);
}

/* ---------------------------------------------------------------------------
 * Storage types. Activations and the compute copy of the parameters are T:
 * float in cuda_ops, __nv_bfloat16 in cuda_bf16_ops (tensor.h's Ops). Every
 * kernel that touches them is a template on T, reads through ld() into
 * float, computes in float, and rounds once through st() when it stores.
 * Gradients of parameters, statistics and losses are float always. */

typedef __nv_bfloat16 bf16;

__device__ __forceinline__ float ld(const float *p, size_t i) { return p[i]; }
__device__ __forceinline__ float ld(const bf16 *p, size_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void st(float *p, size_t i, float v) { p[i] = v; }
__device__ __forceinline__ void st(bf16 *p, size_t i, float v) { p[i] = __float2bfloat16_rn(v); }

/* 16-byte vectors for the memory-bound kernels: 4 floats or 8 bf16, loaded
 * and stored whole. A kernel takes the vector path when its counts are
 * multiples of the width and its pointers 16-byte aligned (cudaMalloc's
 * are; offsets of whole rows keep it when the row is a multiple of 16 bytes). */
template <typename T> struct Vec {
    static constexpr int N = 16 / sizeof(T);
    T v[N];
};
template <typename T> __device__ __forceinline__ Vec<T> ldv(const T *p, size_t i) {
    Vec<T> r;
    *reinterpret_cast<uint4 *>(r.v) = *reinterpret_cast<const uint4 *>(p + i);
    return r;
}
template <typename T> __device__ __forceinline__ void stv(T *p, size_t i, const Vec<T> &r) {
    *reinterpret_cast<uint4 *>(p + i) = *reinterpret_cast<const uint4 *>(r.v);
}
template <typename T> __device__ __forceinline__ float vget(const Vec<T> &r, int k) {
    return ld(r.v, (size_t)k);
}
template <typename T> __device__ __forceinline__ void vset(Vec<T> &r, int k, float x) {
    st(r.v, (size_t)k, x);
}
static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* ---------------------------------------------------------------------------
 * Embedding: token row plus position row. */

// out [B,T,C], tokens [B,T], wte [Vp,C], wpe [maxT,C]; one thread per output,
// or with V per W = Vec<T>::N consecutive outputs as 16-byte loads and a
// store (C % W == 0, the three arrays 16-byte aligned: the scalar form's one
// 2-byte load of each table a thread measured 18% of copy on an H200).
// A token < 0 (outside this rank's slice of the vocabulary) adds no wte row;
// wpe NULL adds no position row. Either missing term is a 0, as in ops.c.
template <typename T, bool V>
__global__ void encoder_forward_kernel(T *out, const int *tokens, const T *wte, const T *wpe,
                                       int Tn, int C, size_t total) {
    constexpr int W = V ? Vec<T>::N : 1;
    for (size_t i = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) * W; i < total;
         i += (size_t)gridDim.x * blockDim.x * W) {
        size_t bt = i / C;
        int c = (int)(i % C), t = (int)(bt % Tn);
        int tok = tokens[bt];
        if (!V) {
            float te = tok >= 0 ? ld(wte, (size_t)tok * C + c) : 0.0f;
            float pe = wpe ? ld(wpe, (size_t)t * C + c) : 0.0f;
            st(out, i, te + pe);
            continue;
        }
        Vec<T> te, pe, o;
        if (tok >= 0) te = ldv(wte, (size_t)tok * C + c);
        if (wpe) pe = ldv(wpe, (size_t)t * C + c);
#pragma unroll
        for (int k = 0; k < W; k++)
            vset(o, k, (tok >= 0 ? vget(te, k) : 0.0f) + (wpe ? vget(pe, k) : 0.0f));
        stv(out, i, o);
    }
}

// dwte [Vp,C] += dout [B,T,C] rows by token (tokens < 0 have no row and are
// skipped). Positions may share a token, so atomics.
template <typename T>
__global__ void encoder_backward_wte_kernel(float *dwte, const T *dout, const int *tokens, int C,
                                            size_t total) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        int tok = tokens[i / C];
        if (tok >= 0) atomicAdd(&dwte[(size_t)tok * C + i % C], ld(dout, i));
    }
}

// dwte [Vp,C] += dout [B,T,C] rows by token, through dev_embed_plan's plan
// (runs + 1 group starts, then the grouped positions): a block takes a
// group (one token) at a time, each thread W channels (16-byte loads when
// V: C % W == 0 and dout, dwte 16-byte aligned; else one), and adds the
// group's rows in position order in float32, then the sum to the token's
// row. Each dwte element has one writer: no atomics, the same bits every run.
template <typename T, bool V>
__global__ void encoder_backward_runs_kernel(float *dwte, const T *dout, const int *tokens,
                                             const int *plan, int runs, int C) {
    constexpr int W = V ? Vec<T>::N : 1;
    const int *pos = plan + runs + 1;
    const int c = threadIdx.x * W;
    if (c >= C) return;
    for (int r = blockIdx.x; r < runs; r += gridDim.x) {
        const int s = plan[r], e = plan[r + 1];
        float acc[W];
#pragma unroll
        for (int k = 0; k < W; k++) acc[k] = 0.0f;
        for (int j = s; j < e; j++) {
            const size_t row = (size_t)pos[j] * C + c;
            if (V) {
                const Vec<T> x = ldv(dout, row);
#pragma unroll
                for (int k = 0; k < W; k++) acc[k] += vget(x, k);
            } else {
                acc[0] += ld(dout, row);
            }
        }
        float *o = dwte + (size_t)tokens[pos[s]] * C + c;
        if (V) {
#pragma unroll
            for (int k = 0; k < W; k += 4) {
                float4 q = *reinterpret_cast<const float4 *>(o + k);
                q.x += acc[k];
                q.y += acc[k + 1];
                q.z += acc[k + 2];
                q.w += acc[k + 3];
                *reinterpret_cast<float4 *>(o + k) = q;
            }
        } else {
            o[0] += acc[0];
        }
    }
}

// dwpe [T,C] += sum over b of dout [B,T,C]: one thread owns each dwpe element.
template <typename T>
__global__ void encoder_backward_wpe_kernel(float *dwpe, const T *dout, int B, int Tn, int C) {
    size_t TC = (size_t)Tn * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < TC;
         i += (size_t)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int b = 0; b < B; b++) s += ld(dout, b * TC + i);
        dwpe[i] += s;
    }
}

template <typename T>
static void encoder_forward(Dev *d, void *out, const int *tokens, const void *wte, const void *wpe,
                            int B, int Tn, int C) {
    size_t total = (size_t)B * Tn * C;
    if (!total) return;
    constexpr int W = Vec<T>::N;
    if (C % W == 0 && aligned16(out) && aligned16(wte) && (!wpe || aligned16(wpe))) {
        encoder_forward_kernel<T, true><<<elementwise_grid(total / W, 256), 256, 0, STREAM(d)>>>(
            (T *)out, tokens, (const T *)wte, (const T *)wpe, Tn, C, total);
        LAUNCH_CHECK(encoder_forward_kernel);
        return;
    }
    encoder_forward_kernel<T, false><<<elementwise_grid(total, 256), 256, 0, STREAM(d)>>>(
        (T *)out, tokens, (const T *)wte, (const T *)wpe, Tn, C, total);
    LAUNCH_CHECK(encoder_forward_kernel);
}

template <typename T>
static void encoder_backward(Dev *d, float *dwte, float *dwpe, const void *dout, const int *tokens,
                             const int *plan, int runs, int B, int Tn, int C) {
    size_t total = (size_t)B * Tn * C;
    if (!total) return;
    bool done = plan && runs == 0;  // a plan with no token of this rank's slice: no dwte row
    if (plan && runs > 0) {
        constexpr int W = Vec<T>::N;
        const bool v = C % W == 0 && aligned16(dout) && aligned16(dwte);
        const int lanes = v ? C / W : C;  // threads a group needs
        if (lanes <= 1024) {
            const int threads = (lanes + 31) / 32 * 32;
            const unsigned grid = (unsigned)(runs < 65535 ? runs : 65535);
            if (v) encoder_backward_runs_kernel<T, true><<<grid, threads, 0, STREAM(d)>>>(
                       dwte, (const T *)dout, tokens, plan, runs, C);
            else encoder_backward_runs_kernel<T, false><<<grid, threads, 0, STREAM(d)>>>(
                     dwte, (const T *)dout, tokens, plan, runs, C);
            LAUNCH_CHECK(encoder_backward_runs_kernel);
            done = true;
        }
    }
    if (!done) {  // no plan (or rows too wide for one block): atomics, any order
        encoder_backward_wte_kernel<T><<<elementwise_grid(total, 256), 256, 0, STREAM(d)>>>(
            dwte, (const T *)dout, tokens, C, total);
        LAUNCH_CHECK(encoder_backward_wte_kernel);
    }
    if (!dwpe) return;  // no position embedding on this rank
    encoder_backward_wpe_kernel<T><<<elementwise_grid((size_t)Tn * C, 256), 256, 0, STREAM(d)>>>(
        dwpe, (const T *)dout, B, Tn, C);
    LAUNCH_CHECK(encoder_backward_wpe_kernel);
}

/* ---------------------------------------------------------------------------
 * LayerNorm, one warp per row: eps 1e-5, biased variance, two passes over
 * the row (mean first, then the squared deviations) as ops.c does.
 *
 * The forward kernel optionally makes its input first, res = a + b (the
 * residual add fused with the LayerNorm that reads it: one pass over the
 * stream instead of two). Each lane reads back only the elements it wrote,
 * so no barrier is needed. With 16-byte vectors (C a multiple of 32 vectors)
 * each lane holds its share of the row in registers (up to LN_VREGS
 * vectors: C <= 1024 in float, 2048 in bf16) and memory is read once. */

#define ROWS_PER_BLOCK 8  /* warps per block in the warp-per-row kernels */
#define LN_VREGS 8

// out [N,C], mean [N], rstd [N], inp [N,C] (or res [N,C] = a + b), w [C], b [C]
template <typename T>
__global__ void layernorm_forward_kernel(T *out, float *mean, float *rstd, T *res, const T *inp,
                                         const T *badd, const T *w, const T *b, int N, int C) {
    int lane = threadIdx.x % 32;
    int n = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
    if (n >= N) return;
    size_t row = (size_t)n * C;
    const T *x = res ? res : inp;
    float s = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float v;
        if (res) {  // round the sum as it is stored, and normalise the stored value
            st(res, row + c, ld(inp, row + c) + ld(badd, row + c));
            v = ld(res, row + c);
        } else {
            v = ld(x, row + c);
        }
        s += v;
    }
    float m = warp_sum(s) / C;
    float var = 0.0f;
    for (int c = lane; c < C; c += 32) { float dx = ld(x, row + c) - m; var += dx * dx; }
    float r = rsqrtf(warp_sum(var) / C + 1e-5f);
    for (int c = lane; c < C; c += 32) st(out, row + c, (ld(x, row + c) - m) * r * ld(w, c) + ld(b, c));
    if (lane == 0) { mean[n] = m; rstd[n] = r; }
}

// The same with the row in registers, 16-byte accesses: C = 32 * NV * V::N * k.
template <typename T, int NV>
__global__ void layernorm_forward_vec_kernel(T *out, float *mean, float *rstd, T *res,
                                             const T *inp, const T *badd, const T *w, const T *b,
                                             int N, int C) {
    constexpr int W = Vec<T>::N;
    int lane = threadIdx.x % 32;
    int n = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
    if (n >= N) return;
    size_t row = (size_t)n * C;
    float x[NV][W];
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < NV; j++) {
        int c = (j * 32 + lane) * W;
        Vec<T> a = ldv(inp, row + c);
        if (res) {
            Vec<T> bb = ldv(badd, row + c), r;
#pragma unroll
            for (int k = 0; k < W; k++) vset(r, k, vget(a, k) + vget(bb, k));
            stv(res, row + c, r);
            a = r;  // the rounded sum is what is normalised
        }
#pragma unroll
        for (int k = 0; k < W; k++) { x[j][k] = vget(a, k); s += x[j][k]; }
    }
    float m = warp_sum(s) / C;
    float var = 0.0f;
#pragma unroll
    for (int j = 0; j < NV; j++)
#pragma unroll
        for (int k = 0; k < W; k++) { float dx = x[j][k] - m; var += dx * dx; }
    float r = rsqrtf(warp_sum(var) / C + 1e-5f);
#pragma unroll
    for (int j = 0; j < NV; j++) {
        int c = (j * 32 + lane) * W;
        Vec<T> wv = ldv(w, (size_t)c), bv = ldv(b, (size_t)c), o;
#pragma unroll
        for (int k = 0; k < W; k++) vset(o, k, (x[j][k] - m) * r * vget(wv, k) + vget(bv, k));
        stv(out, row + c, o);
    }
    if (lane == 0) { mean[n] = m; rstd[n] = r; }
}

// dinp [N,C] += d/dinp, one warp per row (rows are independent).
template <typename T>
__global__ void layernorm_backward_dinp_kernel(T *dinp, const T *dout, const T *inp, const T *w,
                                               const float *mean, const float *rstd, int N, int C) {
    int lane = threadIdx.x % 32;
    int n = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
    if (n >= N) return;
    size_t row = (size_t)n * C;
    float m = mean[n], r = rstd[n];
    // The mean of dnorm and of dnorm * norm, then each element's share.
    float gsum = 0.0f, gnsum = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float dnorm = ld(dout, row + c) * ld(w, c);
        gsum += dnorm;
        gnsum += dnorm * (ld(inp, row + c) - m) * r;
    }
    float gmean = warp_sum(gsum) / C, gnmean = warp_sum(gnsum) / C;
    for (int c = lane; c < C; c += 32) {
        float norm = (ld(inp, row + c) - m) * r;
        st(dinp, row + c, ld(dinp, row + c) + (ld(dout, row + c) * ld(w, c) - gmean - norm * gnmean) * r);
    }
}

/* LayerNorm's dw and db: column sums over rows in a fixed order (no atomics:
 * the same inputs give the same bits on every run). A block of 32 x 8
 * threads takes 32 columns (a warp reads 32 contiguous elements of a row)
 * and every gridDim.y-th chunk of COLSUM_ROWS rows, sums them in registers
 * and shared memory, and writes its partial to partials [gridDim.y, C];
 * tc_partials_add (matmul.cu, which sums the matmul's dbias the same way)
 * adds the partials to the output in chunk order. The partials live in the
 * Dev's scratch when they fit (gridDim.y is capped so they do), else in a
 * buffer of their own. */
#define COLSUM_ROWS 256

// partial_w, partial_b [gridDim.y, C]: sums over this block's rows of
// dout * norm and of dout; dout, inp [N,C]
template <typename T>
__global__ void layernorm_backward_params_kernel(float *partial_w, float *partial_b, const T *dout,
                                                 const T *inp, const float *mean, const float *rstd,
                                                 int N, int C) {
    __shared__ float part_w[8][33], part_b[8][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    float sw = 0.0f, sb = 0.0f;
    if (c < C) {
        for (int r0 = blockIdx.y * COLSUM_ROWS; r0 < N; r0 += gridDim.y * COLSUM_ROWS) {
            int r1 = min(N, r0 + COLSUM_ROWS);
            for (int n = r0 + threadIdx.y; n < r1; n += 8) {
                size_t i = (size_t)n * C + c;
                float g = ld(dout, i);
                sw += g * (ld(inp, i) - mean[n]) * rstd[n];
                sb += g;
            }
        }
    }
    part_w[threadIdx.y][threadIdx.x] = sw;
    part_b[threadIdx.y][threadIdx.x] = sb;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        for (int y = 1; y < 8; y++) { sw += part_w[y][threadIdx.x]; sb += part_b[y][threadIdx.x]; }
        partial_w[(size_t)blockIdx.y * C + c] = sw;
        partial_b[(size_t)blockIdx.y * C + c] = sb;
    }
}

// The whole LayerNorm backward in one pass over dout and inp (the two
// kernels above read both twice), now for rows wider than the rows kernel
// below takes (C > 1024); its shared sums conflict 8 ways in bf16 (below
// says why that held it at 30% of copy): block b takes chunks of LNB_ROWS rows
// (b, b + gridDim.x, ...), warp w of its 8 rows w, w + 8, ... of a chunk.
// Per row the warp adds dinp as layernorm_backward_dinp_kernel does, and
// each lane adds dout * norm and dout of its own columns (c = lane mod 32)
// into its warp's row of shared memory acc [2][8][C]; at the end the block
// adds its 8 warps in order into partial_w, partial_b [gridDim.x, C], which
// colsum_add sums in block order: a fixed order, no atomics.
// V: each lane takes W = Vec<T>::N consecutive columns at a time with
// 16-byte loads and stores (C % W == 0, rows 16-byte aligned).
#define LNB_ROWS 64
template <typename T, bool V>
__global__ void layernorm_backward_fused_kernel(T *dinp, float *partial_w, float *partial_b,
                                                const T *dout, const T *inp, const T *w,
                                                const float *mean, const float *rstd, int N,
                                                int C) {
    constexpr int W = V ? Vec<T>::N : 1;
    extern __shared__ float lnb_acc[];  // [2][8][C]: dw's sums, then db's, a row a warp
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    float *aw = lnb_acc + (size_t)warp * C, *ab = lnb_acc + (size_t)(8 + warp) * C;
    for (int c = lane; c < C; c += 32) aw[c] = ab[c] = 0.0f;
    __syncwarp();  // V: a lane's columns were zeroed by others
    for (int r0 = blockIdx.x * LNB_ROWS; r0 < N; r0 += gridDim.x * LNB_ROWS) {
        const int r1 = min(N, r0 + LNB_ROWS);
        for (int n = r0 + warp; n < r1; n += 8) {
            const size_t row = (size_t)n * C;
            const float m = mean[n], r = rstd[n];
            float gsum = 0.0f, gnsum = 0.0f;
            for (int c = lane * W; c < C; c += 32 * W) {
                if (V) {
                    const Vec<T> gv = ldv(dout, row + c), xv = ldv(inp, row + c), wv = ldv(w, (size_t)c);
#pragma unroll
                    for (int k = 0; k < W; k++) {
                        const float g = vget(gv, k), norm = (vget(xv, k) - m) * r;
                        const float dnorm = g * vget(wv, k);
                        gsum += dnorm;
                        gnsum += dnorm * norm;
                        aw[c + k] += g * norm;
                        ab[c + k] += g;
                    }
                } else {
                    const float g = ld(dout, row + c), norm = (ld(inp, row + c) - m) * r;
                    const float dnorm = g * ld(w, c);
                    gsum += dnorm;
                    gnsum += dnorm * norm;
                    aw[c] += g * norm;
                    ab[c] += g;
                }
            }
            const float gmean = warp_sum(gsum) / C, gnmean = warp_sum(gnsum) / C;
            for (int c = lane * W; c < C; c += 32 * W) {
                if (V) {
                    const Vec<T> gv = ldv(dout, row + c), xv = ldv(inp, row + c), wv = ldv(w, (size_t)c);
                    Vec<T> dv = ldv(dinp, row + c);
#pragma unroll
                    for (int k = 0; k < W; k++) {
                        const float norm = (vget(xv, k) - m) * r;
                        vset(dv, k, vget(dv, k) + (vget(gv, k) * vget(wv, k) - gmean - norm * gnmean) * r);
                    }
                    stv(dinp, row + c, dv);
                } else {
                    const float norm = (ld(inp, row + c) - m) * r;
                    st(dinp, row + c,
                       ld(dinp, row + c) + (ld(dout, row + c) * ld(w, c) - gmean - norm * gnmean) * r);
                }
            }
        }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float sw = 0.0f, sb = 0.0f;
        for (int y = 0; y < 8; y++) {
            sw += lnb_acc[(size_t)y * C + c];
            sb += lnb_acc[(size_t)(8 + y) * C + c];
        }
        partial_w[(size_t)blockIdx.x * C + c] = sw;
        partial_b[(size_t)blockIdx.x * C + c] = sb;
    }
}

/* The LayerNorm backward at C <= 1024, what training runs (GPT-2's 768):
 * every byte read or written once, the weights' gradients summed in each
 * lane's own slots of shared memory, one launch more to add the blocks'.
 *
 * Why the one-pass kernel above runs at 30% of copy (bf16 on an H200, 2026-11-26):
 * each lane adds its 8 columns' dout * norm and dout into its warp's row of
 * shared memory, and lane l's columns start at 8l, so lanes l and l + 4 hit
 * the same bank: every one of the 32 shared loads and stores an element
 * pair takes is an 8-way conflict, about one shared wavefront per element
 * (four in float32's 4-way conflicts a 4-column vector: half as many a
 * byte, which is why bf16 was no faster than float32). A row of 768 is then
 * 768 cycles of the SM's shared pipe; 124 rows an SM make 95k cycles, 48 us
 * at 1.98 GHz: more than the 24 us its bytes take. Its second pass reads
 * dout, inp and w again (from L1 or L2) and only then dinp, so each row
 * waits for memory twice, and the partials go through two reductions.
 *
 * Here a lane owns the same columns in every row (c = (j * 32 + lane) * W
 * + k, j < NV, k < W, those below C), so its sums of dout * norm and of
 * dout over the rows its warp takes stay in slots of shared memory that no
 * other lane touches, laid out [warp][2][NV * W][32]: a warp's 32 lanes
 * read or write 32 consecutive floats, one bank each, one wavefront (4 of
 * them an element: 96 a row of 768, 6 us of an SM's shared pipe over
 * GPT-2's rows, hidden under memory). (Registers would hold them too, but
 * at 48 of them beside the row's own 48 a bf16 row of 768 spilled at 128
 * registers a thread; ptxas, sm_90a.) A row's dout, inp and dinp are
 * loaded together into registers, one wait a row, and dinp is written once.
 * Block b takes chunks of LNB_ROWS rows (b, b + gridDim.x, ...), warp w the
 * rows w, w + 8, ... of each; at the end the 8 warps' sums are added in
 * warp order into partial_w, partial_b [gridDim.x, C], which
 * layernorm_params_add_kernel adds into dw, db in block order: a fixed
 * order, the same bits every run (and the same order as the kernel above).
 * V: 16-byte loads and stores, W = Vec<T>::N (C % W == 0, rows 16-byte
 * aligned); else W = 1. dinp NULL: the weights' gradients alone (w not
 * read); partial_w NULL: dinp alone (no shared memory). Registers capped
 * at 128 so that two blocks (16 warps) share an SM (117 at a bf16 row of
 * 768, 109 at a float32 one, no spills; ptxas 13.0, sm_90a), except the
 * scalar path's 32 columns a lane, which would spill there. */
#define LNR_WARPS 8
#define LNR_LANE_MAX 32  /* columns a lane holds: C <= 32 * 32 = 1024 */

template <typename T, int W> struct LnrPack { T v[W]; };  // W columns of one row
template <typename T, int W>
__device__ __forceinline__ LnrPack<T, W> lnr_load(const T *p, size_t i) {
    LnrPack<T, W> r;
    if constexpr (W == 1) r.v[0] = p[i];
    else *reinterpret_cast<uint4 *>(r.v) = *reinterpret_cast<const uint4 *>(p + i);
    return r;
}
template <typename T, int W>
__device__ __forceinline__ void lnr_store(T *p, size_t i, const LnrPack<T, W> &r) {
    if constexpr (W == 1) p[i] = r.v[0];
    else *reinterpret_cast<uint4 *>(p + i) = *reinterpret_cast<const uint4 *>(r.v);
}

// dinp [N,C] += d/dinp; partial_w, partial_b [gridDim.x, C]: this block's
// sums of dout * norm and of dout; dout, inp [N,C]; w [C]; mean, rstd [N]
template <typename T, bool V, int NV>
__global__ void __launch_bounds__(LNR_WARPS * 32, NV < 32 ? 2 : 1)
layernorm_backward_rows_kernel(T *dinp, float *partial_w, float *partial_b, const T *dout,
                               const T *inp, const T *w, const float *mean, const float *rstd,
                               int N, int C) {
    constexpr int W = V ? Vec<T>::N : 1, E = NV * W;  // E: columns a lane owns
    extern __shared__ float lnr_acc[];  // [LNR_WARPS][2][E][32]: each lane's sums, dw's then db's
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const bool want_w = partial_w != NULL;
    float *acc = lnr_acc + (size_t)warp * 2 * E * 32 + lane;  // this lane's: acc[e * 32]
    if (want_w)
#pragma unroll
        for (int e = 0; e < 2 * E; e++) acc[e * 32] = 0.0f;
    for (int r0 = blockIdx.x * LNB_ROWS; r0 < N; r0 += gridDim.x * LNB_ROWS) {
        const int r1 = min(N, r0 + LNB_ROWS);
        for (int n = r0 + warp; n < r1; n += LNR_WARPS) {
            const size_t row = (size_t)n * C;
            const float m = mean[n], r = rstd[n];
            LnrPack<T, W> g[NV], x[NV], dx[NV];
#pragma unroll
            for (int j = 0; j < NV; j++) {
                const int c = (j * 32 + lane) * W;
                if (c < C) {
                    g[j] = lnr_load<T, W>(dout, row + c);
                    x[j] = lnr_load<T, W>(inp, row + c);
                    if (dinp) dx[j] = lnr_load<T, W>(dinp, row + c);
                }
            }
            if (want_w) {
#pragma unroll
                for (int j = 0; j < NV; j++) {
                    if ((j * 32 + lane) * W >= C) continue;
#pragma unroll
                    for (int k = 0; k < W; k++) {
                        const float gk = ld(g[j].v, (size_t)k);
                        acc[(j * W + k) * 32] += gk * ((ld(x[j].v, (size_t)k) - m) * r);
                        acc[(E + j * W + k) * 32] += gk;
                    }
                }
            }
            if (!dinp) continue;
            // The row's means of dnorm and of dnorm * norm, then each element's share.
            float gsum = 0.0f, gnsum = 0.0f;
#pragma unroll
            for (int j = 0; j < NV; j++) {
                const int c = (j * 32 + lane) * W;
                if (c >= C) continue;
                const LnrPack<T, W> wv = lnr_load<T, W>(w, (size_t)c);
#pragma unroll
                for (int k = 0; k < W; k++) {
                    const float dnorm = ld(g[j].v, (size_t)k) * ld(wv.v, (size_t)k);
                    gsum += dnorm;
                    gnsum += dnorm * ((ld(x[j].v, (size_t)k) - m) * r);
                }
            }
            const float gmean = warp_sum(gsum) / C, gnmean = warp_sum(gnsum) / C;
#pragma unroll
            for (int j = 0; j < NV; j++) {
                const int c = (j * 32 + lane) * W;
                if (c >= C) continue;
                const LnrPack<T, W> wv = lnr_load<T, W>(w, (size_t)c);  // L1's
#pragma unroll
                for (int k = 0; k < W; k++) {
                    const float norm = (ld(x[j].v, (size_t)k) - m) * r;
                    const float dnorm = ld(g[j].v, (size_t)k) * ld(wv.v, (size_t)k);
                    st(dx[j].v, (size_t)k, ld(dx[j].v, (size_t)k) + (dnorm - gmean - norm * gnmean) * r);
                }
                lnr_store<T, W>(dinp, row + c, dx[j]);
            }
        }
    }
    if (!want_w) return;
    __syncthreads();
    // Column c is lane (c / W) % 32's slot (c / (32 W)) * W + c % W; warps in order.
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        const int l = (c / W) % 32, e = c / (32 * W) * W + c % W;
        float sw = 0.0f, sb = 0.0f;
        for (int y = 0; y < LNR_WARPS; y++) {
            sw += lnr_acc[((size_t)(y * 2) * E + e) * 32 + l];
            sb += lnr_acc[((size_t)(y * 2 + 1) * E + e) * 32 + l];
        }
        partial_w[(size_t)blockIdx.x * C + c] = sw;
        partial_b[(size_t)blockIdx.x * C + c] = sb;
    }
}

/* dw [C] += the chunks of partial [0] [chunks, C] in chunk order, db [C] the
 * same of partial [1] (blockIdx.y picks which): lane y of 16 adds chunks y,
 * y + 16, ..., then the 16 lanes are added in order. One launch for both. */
__global__ void layernorm_params_add_kernel(float *dw, float *db, const float *partial, int chunks,
                                            int C) {
    __shared__ float lane_sum[16][33];
    const int c = blockIdx.x * 32 + threadIdx.x, y = threadIdx.y;
    const float *p = partial + (size_t)blockIdx.y * chunks * C;
    float s = 0.0f;
    if (c < C) {
#pragma unroll 8
        for (int k = y; k < chunks; k += 16) s += p[(size_t)k * C + c];  // loads ahead of the adds
    }
    lane_sum[y][threadIdx.x] = s;
    __syncthreads();
    if (y == 0 && c < C) {
        for (int j = 1; j < 16; j++) s += lane_sum[j][threadIdx.x];
        (blockIdx.y ? db : dw)[c] += s;
    }
}

/* One launch of the rows kernel; its shared memory, pw non-NULL, is the 8
 * warps' 2 x NV x W x 32 floats (48 KB at a bf16 or float32 row of 768,
 * 64 KB at most). */
template <typename T, bool V, int NV>
static void lnr_launch(Dev *d, unsigned blocks, T *dinp, float *pw, float *pb, const T *dout,
                       const T *inp, const T *w, const float *mean, const float *rstd, int N, int C) {
    constexpr int W = V ? Vec<T>::N : 1;
    const size_t smem = pw ? (size_t)LNR_WARPS * 2 * NV * W * 32 * sizeof(float) : 0;
    if (smem > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(layernorm_backward_rows_kernel<T, V, NV>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    layernorm_backward_rows_kernel<T, V, NV><<<blocks, LNR_WARPS * 32, smem, STREAM(d)>>>(
        dinp, pw, pb, dout, inp, w, mean, rstd, N, C);
    LAUNCH_CHECK(layernorm_backward_rows_kernel);
}

/* The rows kernel and the partials' sum for C <= 32 * LNR_LANE_MAX: false
 * where C is wider. The partials [2, blocks, C] live in the Dev's scratch
 * (blocks capped so they fit: at C = 1024, 4096 blocks of 64 rows each
 * before a block takes a second chunk). */
template <typename T>
static bool layernorm_backward_rows(Dev *d, T *dinp, float *dw, float *db, const T *dout,
                                    const T *inp, const T *w, const float *mean, const float *rstd,
                                    int N, int C) {
    constexpr int VW = Vec<T>::N;
    if (C > 32 * LNR_LANE_MAX) return false;
    const bool v = C % VW == 0 && aligned16(dinp) && aligned16(dout) && aligned16(inp) && aligned16(w);
    size_t blocks = ceil_div((size_t)N, LNB_ROWS);
    const size_t fit = DEV_SCRATCH_BYTES / ((size_t)2 * C * sizeof(float));
    if (blocks > 65535) blocks = 65535;
    if (blocks > fit) blocks = fit;
    float *pw = dw ? (float *)d->scratch : NULL, *pb = dw ? pw + blocks * C : NULL;
    const int nv = (int)ceil_div((size_t)C, (size_t)32 * (v ? VW : 1));  // vectors (or elements) a lane
#define LNR_GO(VV, NVC) lnr_launch<T, VV, NVC>(d, (unsigned)blocks, dinp, pw, pb, dout, inp, w, mean, rstd, N, C)
    if (v) {
        switch (nv) {  // bf16: at most 4 vectors of 8; float32: 8 of 4
        case 1: LNR_GO(true, 1); break;
        case 2: LNR_GO(true, 2); break;
        case 3: LNR_GO(true, 3); break;
        case 4: LNR_GO(true, 4); break;
        default:
            if constexpr (VW == 4) {
                switch (nv) {
                case 5: LNR_GO(true, 5); break;
                case 6: LNR_GO(true, 6); break;
                case 7: LNR_GO(true, 7); break;
                default: LNR_GO(true, 8); break;
                }
            }
        }
    } else if (nv <= 2) {
        LNR_GO(false, 2);
    } else if (nv <= 8) {
        LNR_GO(false, 8);
    } else {
        LNR_GO(false, 32);
    }
#undef LNR_GO
    if (dw) {
        layernorm_params_add_kernel<<<dim3((unsigned)ceil_div((size_t)C, 32), 2), dim3(32, 16), 0, STREAM(d)>>>(
            dw, db, (const float *)d->scratch, (int)blocks, C);
        LAUNCH_CHECK(layernorm_params_add_kernel);
    }
    return true;
}

/* Where `arrays` arrays of partial column sums [chunks, C] go: the grid
 * (chunks capped so they fit the scratch when they can) and the buffer. */
typedef struct ColSum {
    dim3 grid;
    float *partials;  // [arrays, chunks, C]
    bool owned;       // allocated here, freed by colsum_done
} ColSum;

static ColSum colsum_plan(Dev *d, int N, int C, int arrays) {
    size_t chunks = ceil_div((size_t)N, COLSUM_ROWS);
    size_t fit = DEV_SCRATCH_BYTES / ((size_t)arrays * C * sizeof(float));
    if (chunks > 65535) chunks = 65535;
    if (fit >= 1 && chunks > fit) chunks = fit;
    ColSum p;
    p.grid = dim3((unsigned)ceil_div((size_t)C, 32), (unsigned)chunks);
    p.owned = fit < 1;
    p.partials = p.owned ? (float *)cuda_malloc((size_t)arrays * chunks * C * sizeof(float))
                         : (float *)d->scratch;
    return p;
}

/* out [C] += the chunks of partial array `array`, in chunk order (tc.h) */
static void colsum_add(Dev *d, const ColSum *p, int array, float *out, int C) {
    tc_partials_add(out, p->partials + (size_t)array * p->grid.y * C, (int)p->grid.y, C, d->stream);
}

static void colsum_done(Dev *d, ColSum *p) {
    if (p->owned) { cuda_sync(d->stream); cuda_free(p->partials); }
}

/* res, a, b NULL: plain LayerNorm of inp; else res = a + b is made and normalised. */
template <typename T>
static void layernorm_launch(Dev *d, T *out, float *mean, float *rstd, T *res, const T *inp,
                             const T *badd, const T *w, const T *b, int N, int C) {
    if (N <= 0 || C <= 0) return;
    unsigned grid = (unsigned)ceil_div((size_t)N, ROWS_PER_BLOCK);
    constexpr int W = Vec<T>::N;
    int nv = C % (32 * W) == 0 ? C / (32 * W) : 0;  // vectors a lane
    bool vec = nv >= 1 && nv <= LN_VREGS && aligned16(out) && aligned16(inp) && aligned16(w) &&
               aligned16(b) && (!res || (aligned16(res) && aligned16(badd)));
#define LN_VEC(NVC) \
    case NVC: layernorm_forward_vec_kernel<T, NVC><<<grid, ROWS_PER_BLOCK * 32, 0, STREAM(d)>>>( \
                  out, mean, rstd, res, inp, badd, w, b, N, C); break;
    if (vec) {
        switch (nv) { LN_VEC(1) LN_VEC(2) LN_VEC(3) LN_VEC(4) LN_VEC(5) LN_VEC(6) LN_VEC(7) LN_VEC(8) }
        LAUNCH_CHECK(layernorm_forward_vec_kernel);
        return;
    }
#undef LN_VEC
    layernorm_forward_kernel<T><<<grid, ROWS_PER_BLOCK * 32, 0, STREAM(d)>>>(out, mean, rstd, res, inp,
                                                                           badd, w, b, N, C);
    LAUNCH_CHECK(layernorm_forward_kernel);
}

template <typename T>
static void layernorm_forward(Dev *d, void *out, float *mean, float *rstd, const void *inp,
                              const void *w, const void *b, int N, int C) {
    layernorm_launch<T>(d, (T *)out, mean, rstd, (T *)NULL, (const T *)inp, (const T *)NULL,
                        (const T *)w, (const T *)b, N, C);
}

template <typename T>
static void add_layernorm_forward(Dev *d, void *res, void *out, float *mean, float *rstd,
                                  const void *a, const void *b, const void *w, const void *bias,
                                  int N, int C) {
    layernorm_launch<T>(d, (T *)out, mean, rstd, (T *)res, (const T *)a, (const T *)b,
                        (const T *)w, (const T *)bias, N, C);
}

template <typename T>
static void layernorm_backward(Dev *d, void *dinp, float *dw, float *db, const void *dout,
                               const void *inp, const void *w, const float *mean,
                               const float *rstd, int N, int C) {
    if (N <= 0 || C <= 0) return;
    /* C <= 1024 (GPT-2's 768, what training runs): the rows kernel, whatever is wanted. */
    if (layernorm_backward_rows<T>(d, (T *)dinp, dw, db, (const T *)dout, (const T *)inp,
                                   (const T *)w, mean, rstd, N, C))
        return;
    /* Wider rows: one pass (layernorm_backward_fused_kernel) when both parts are wanted,
     * its partials fit the Dev's scratch and its shared memory the device (C
     * up to about 3600); else the two kernels below, each only when its part
     * is wanted (dinp NULL: the weights' gradients alone, as a pipeline's
     * deferred weight pass asks; dw and db NULL: the input gradient alone). */
    const bool want_dinp = dinp != NULL, want_dw = dw != NULL;
    const size_t smem = (size_t)16 * C * sizeof(float), fit = DEV_SCRATCH_BYTES / ((size_t)2 * C * 4);
    size_t blocks = ceil_div((size_t)N, LNB_ROWS);
    if (blocks > 65535) blocks = 65535;
    if (blocks > fit) blocks = fit;
    const bool v = C % Vec<T>::N == 0 && aligned16(dinp) && aligned16(dout) && aligned16(inp) &&
                   aligned16(w);
    if (want_dinp && want_dw && blocks >= 1 &&
        (smem <= 48 * 1024 ||
         (cudaFuncSetAttribute(layernorm_backward_fused_kernel<T, true>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) == cudaSuccess &&
          cudaFuncSetAttribute(layernorm_backward_fused_kernel<T, false>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) == cudaSuccess))) {
        ColSum p;
        p.grid = dim3(1, (unsigned)blocks);
        p.partials = (float *)d->scratch;  // [2, blocks, C]
        p.owned = false;
        if (v) layernorm_backward_fused_kernel<T, true><<<(unsigned)blocks, 256, smem, STREAM(d)>>>(
                   (T *)dinp, p.partials, p.partials + blocks * C, (const T *)dout, (const T *)inp,
                   (const T *)w, mean, rstd, N, C);
        else layernorm_backward_fused_kernel<T, false><<<(unsigned)blocks, 256, smem, STREAM(d)>>>(
                 (T *)dinp, p.partials, p.partials + blocks * C, (const T *)dout, (const T *)inp,
                 (const T *)w, mean, rstd, N, C);
        LAUNCH_CHECK(layernorm_backward_fused_kernel);
        colsum_add(d, &p, 0, dw, C);
        colsum_add(d, &p, 1, db, C);
        return;
    }
    cudaGetLastError();  // a refused shared-memory limit is not an error here
    if (want_dinp) {
        unsigned grid = (unsigned)ceil_div((size_t)N, ROWS_PER_BLOCK);
        layernorm_backward_dinp_kernel<T><<<grid, ROWS_PER_BLOCK * 32, 0, STREAM(d)>>>(
            (T *)dinp, (const T *)dout, (const T *)inp, (const T *)w, mean, rstd, N, C);
        LAUNCH_CHECK(layernorm_backward_dinp_kernel);
    }
    if (!want_dw) return;
    ColSum p = colsum_plan(d, N, C, 2);
    float *pw = p.partials, *pb = p.partials + (size_t)p.grid.y * C;
    layernorm_backward_params_kernel<T><<<p.grid, dim3(32, 8), 0, STREAM(d)>>>(
        pw, pb, (const T *)dout, (const T *)inp, mean, rstd, N, C);
    LAUNCH_CHECK(layernorm_backward_params_kernel);
    colsum_add(d, &p, 0, dw, C);
    colsum_add(d, &p, 1, db, C);
    colsum_done(d, &p);
}

/* ---------------------------------------------------------------------------
 * Matmul: one tiled kernel for the three products of a linear layer.
 *
 *   forward  out [N,OC]  = inp [N,C]   @ w^T  ([C,OC], w read along C)
 *   backward dinp [N,C]  = dout [N,OC] @ w    ([OC,C]; written)
 *            dw [OC,C]  += dout^T      @ inp  ([N,C])
 *
 * All three are D[M,P] (+)= A[M,K] @ B[K,P]; they differ only in which index
 * of A and B is contiguous in memory. A_KCONTIG: A[m,k] = A[m*lda + k], else
 * A[k*lda + m]; B_KCONTIG: B[k,p] = B[p*ldb + k], else B[k*ldb + p]. The
 * loader reads along whichever index is contiguous, so global loads stay
 * coalesced, and stores the tile k-major in shared memory either way.
 *
 * A block of 256 threads (16 x 16) computes a BM x BP tile of D, each thread
 * a TM x TP micro-tile held in registers: per step of k, it reads TM values
 * of A and TP of B from shared memory and makes TM*TP FMAs. The micro-tile is
 * split in groups of 4 rows (4 columns) that are 64 apart, so the 16 threads
 * of a half-warp read 64 consecutive floats as float4s, free of bank
 * conflicts. While a tile of K is being multiplied, the next one is already
 * on its way from global memory into registers.
 *
 * Out-of-range rows, columns and k are loaded as zeros and never stored, so
 * any M, P, K work. Two shapes: 128x128 (8x8 per thread) when the product
 * has enough tiles to fill the GPU, else 64x64 (4x4 per thread). */

#define MM_BK 8
#define MM_THREADS 256

/* One thread's share of the loads of an operand's ROWS x MM_BK tiles, worked
 * out once. With k contiguous a thread reads one k (tid % MM_BK) of rows
 * tid / MM_BK + 32 i; with the rows contiguous, one row (tid % ROWS) at
 * k = tid / ROWS + (256 / ROWS) i. Either way consecutive threads read
 * consecutive addresses, and from one tile to the next only k0 moves. */
template <int ROWS, bool KCONTIG>
struct MmTileLoader {
    static constexpr int PER_THREAD = ROWS * MM_BK / MM_THREADS;
    static constexpr int STEP = MM_THREADS / (KCONTIG ? MM_BK : ROWS);  // rows (or k) apart
    const float *p;  // this thread's element 0 of the tile at k0 = 0
    size_t ld;
    int rl, kl;      // its row and k within the tile
    int r, rows, K;  // its global row, and the bounds

    __device__ MmTileLoader(const float *X, int ld_, int rows_, int K_, int r0)
        : ld((size_t)ld_), rows(rows_), K(K_) {
        rl = KCONTIG ? threadIdx.x / MM_BK : threadIdx.x % ROWS;
        kl = KCONTIG ? threadIdx.x % MM_BK : threadIdx.x / ROWS;
        r = r0 + rl;
        p = KCONTIG ? X + r * ld + kl : X + kl * ld + r;
    }

    // Out-of-range elements read as zeros, which add nothing to the products.
    __device__ __forceinline__ void load(float (&regs)[PER_THREAD], int k0) const {
        const float *q = p + (KCONTIG ? (size_t)k0 : (size_t)k0 * ld);
#pragma unroll
        for (int i = 0; i < PER_THREAD; i++) {
            int ri = KCONTIG ? r + STEP * i : r;
            int ki = k0 + (KCONTIG ? kl : kl + STEP * i);
            regs[i] = (ri < rows && ki < K) ? q[(size_t)(STEP * i) * ld] : 0.0f;
        }
    }

    // Into the k-major shared tile S[k][row].
    __device__ __forceinline__ void store(float (*S)[ROWS + 4], const float (&regs)[PER_THREAD]) const {
#pragma unroll
        for (int i = 0; i < PER_THREAD; i++) {
            if (KCONTIG) S[kl][rl + STEP * i] = regs[i];
            else S[kl + STEP * i][rl] = regs[i];
        }
    }
};

// D [M,P] (+)= A [M,K] @ B [K,P] (+ bias [P]); layouts as described above.
template <int BM, int BP, int TM, int TP, bool A_KCONTIG, bool B_KCONTIG>
__global__ void __launch_bounds__(MM_THREADS, BM == 128 ? 2 : 3)
matmul_tiled_kernel(float *D, const float *A, const float *Bm, const float *bias, int M, int P,
                    int K, int lda, int ldb, int ldd, int accumulate) {
    static_assert((BM / TM) * (BP / TP) == MM_THREADS, "256 threads a block");
    static_assert(BM / TM == 16 && BP / TP == 16, "16 x 16 threads");
    static_assert(TM % 4 == 0 && TP % 4 == 0, "micro-tiles in groups of 4");
    // k-major tiles; the +4 keeps float4 alignment and spreads the stores of
    // a k-contiguous load over the banks.
    __shared__ __align__(16) float As[MM_BK][BM + 4];
    __shared__ __align__(16) float Bs[MM_BK][BP + 4];
    const int tp = threadIdx.x % 16, tm = threadIdx.x / 16;
    const int m0 = blockIdx.x * BM, p0 = blockIdx.y * BP;

    float acc[TM][TP];
#pragma unroll
    for (int i = 0; i < TM; i++)
#pragma unroll
        for (int j = 0; j < TP; j++) acc[i][j] = 0.0f;

    const MmTileLoader<BM, A_KCONTIG> a_loader(A, lda, M, K, m0);
    const MmTileLoader<BP, B_KCONTIG> b_loader(Bm, ldb, P, K, p0);
    float a_regs[a_loader.PER_THREAD], b_regs[b_loader.PER_THREAD];
    a_loader.load(a_regs, 0);
    b_loader.load(b_regs, 0);

    for (int k0 = 0; k0 < K; k0 += MM_BK) {
        a_loader.store(As, a_regs);
        b_loader.store(Bs, b_regs);
        __syncthreads();
        if (k0 + MM_BK < K) {  // prefetch the next tile while this one is used
            a_loader.load(a_regs, k0 + MM_BK);
            b_loader.load(b_regs, k0 + MM_BK);
        }
#pragma unroll
        for (int k = 0; k < MM_BK; k++) {
            float a[TM], b[TP];
#pragma unroll
            for (int g = 0; g < TM / 4; g++) {
                float4 v = *reinterpret_cast<const float4 *>(&As[k][g * 64 + tm * 4]);
                a[g * 4 + 0] = v.x; a[g * 4 + 1] = v.y; a[g * 4 + 2] = v.z; a[g * 4 + 3] = v.w;
            }
#pragma unroll
            for (int g = 0; g < TP / 4; g++) {
                float4 v = *reinterpret_cast<const float4 *>(&Bs[k][g * 64 + tp * 4]);
                b[g * 4 + 0] = v.x; b[g * 4 + 1] = v.y; b[g * 4 + 2] = v.z; b[g * 4 + 3] = v.w;
            }
#pragma unroll
            for (int i = 0; i < TM; i++)
#pragma unroll
                for (int j = 0; j < TP; j++) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();  // everyone is done with the tile before it is overwritten
    }

#pragma unroll
    for (int i = 0; i < TM; i++) {
        int m = m0 + (i / 4) * 64 + tm * 4 + i % 4;
        if (m >= M) continue;
#pragma unroll
        for (int j = 0; j < TP; j++) {
            int p = p0 + (j / 4) * 64 + tp * 4 + j % 4;
            if (p >= P) continue;
            float v = acc[i][j] + (bias ? bias[p] : 0.0f);
            float *dst = &D[(size_t)m * ldd + p];
            *dst = accumulate ? *dst + v : v;
        }
    }
}

/* Launches D[M,P] (+)= A[M,K] @ B[K,P] (+ bias) with the tile that fits. */
template <bool A_KCONTIG, bool B_KCONTIG>
static void matmul_tiled(Dev *d, float *D, const float *A, const float *B, const float *bias,
                         int M, int P, int K, int lda, int ldb, int ldd, int accumulate) {
    if (M <= 0 || P <= 0 || (K <= 0 && accumulate)) return;  // nothing to compute or to add
    int sms = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, d->gpu));
    size_t big_tiles = ceil_div((size_t)M, 128) * ceil_div((size_t)P, 128);
    if (big_tiles >= (size_t)sms) {
        dim3 grid((unsigned)ceil_div((size_t)M, 128), (unsigned)ceil_div((size_t)P, 128));
        matmul_tiled_kernel<128, 128, 8, 8, A_KCONTIG, B_KCONTIG><<<grid, MM_THREADS, 0, STREAM(d)>>>(
            D, A, B, bias, M, P, K, lda, ldb, ldd, accumulate);
        LAUNCH_CHECK(matmul_tiled_kernel<128x128>);
    } else {
        dim3 grid((unsigned)ceil_div((size_t)M, 64), (unsigned)ceil_div((size_t)P, 64));
        matmul_tiled_kernel<64, 64, 4, 4, A_KCONTIG, B_KCONTIG><<<grid, MM_THREADS, 0, STREAM(d)>>>(
            D, A, B, bias, M, P, K, lda, ldb, ldd, accumulate);
        LAUNCH_CHECK(matmul_tiled_kernel<64x64>);
    }
}

static void matmul_forward_f32(Dev *d, void *out, const void *inp, const void *w, const void *bias,
                               int N, int C, int OC) {
    // out[n,o] = sum_c inp[n,c] w[o,c]: A = inp (k = c contiguous), B[c,o] = w[o*C + c].
    matmul_tiled<true, true>(d, (float *)out, (const float *)inp, (const float *)w,
                             (const float *)bias, N, OC, C, C, C, OC, 0);
}

static void matmul_backward_f32(Dev *d, void *dinp, float *dw, float *dbias, const void *dout,
                                const void *inp, const void *w, int N, int C, int OC) {
    const float *g = (const float *)dout;
    // dinp[n,c] = sum_o dout[n,o] w[o,c] (written): A = dout (k = o contiguous), B[o,c] = w[o*C + c].
    if (dinp) matmul_tiled<true, false>(d, (float *)dinp, g, (const float *)w, NULL, N, C, OC, OC, C, C, 0);
    // dw[o,c] += sum_n dout[n,o] inp[n,c]: A[o,n] = dout[n*OC + o], B[n,c] = inp[n*C + c].
    if (dw) matmul_tiled<false, false>(d, dw, g, (const float *)inp, NULL, OC, C, N, OC, C, C, 1);
    if (dbias) tc_bias_grad(dbias, g, 1, N, OC, (float *)d->scratch, DEV_SCRATCH_BYTES / sizeof(float), d->stream);
}

/* The bf16 table's linear layer: matmul.cu's tensor-core GEMM (tc.h maps
 * the three products onto its layouts), float32 accumulation; the weight
 * gradient is accumulated in float32, the bias gradient by a column sum. */
static void matmul_forward_bf16(Dev *d, void *out, const void *inp, const void *w, const void *bias,
                                int N, int C, int OC) {
    if (N <= 0 || OC <= 0 || C <= 0) return;
    tc_gemm(TC_AUTO, out, 0, 0, inp, 1, w, 1, bias, N, OC, C, NULL, 0, d->stream);
}

static void matmul_backward_bf16(Dev *d, void *dinp, float *dw, float *dbias, const void *dout,
                                 const void *inp, const void *w, int N, int C, int OC) {
    if (N <= 0 || C <= 0) return;  // nothing to write or add
    if (OC <= 0) {                 // an empty sum: dinp written as zeros, nothing to add
        if (dinp) dev_zero(d, dinp, (size_t)N * C * sizeof(bf16));
        return;
    }
    /* dinp written (bf16, no read of the old D): the ping-pong kernel stores it through TMA */
    if (dinp) tc_gemm(TC_AUTO, dinp, 0, 0, dout, 1, w, 0, NULL, N, C, OC, NULL, 0, d->stream);
    /* dw may run split-K, its parts in the Dev's scratch (stream-ordered, as every user of it) */
    if (dw)
        tc_gemm(TC_AUTO, dw, 1, 1, dout, 0, inp, 0, NULL, OC, C, N, (float *)d->scratch,
                DEV_SCRATCH_BYTES / sizeof(float), d->stream);
    if (dbias)
        tc_bias_grad(dbias, dout, 0, N, OC, (float *)d->scratch, DEV_SCRATCH_BYTES / sizeof(float), d->stream);
}

/* ---------------------------------------------------------------------------
 * Causal self-attention, written plainly: scores and softmax one warp per
 * query row, then att @ v one thread per output element. The backward
 * mirrors it: one warp per row for datt and the softmax's backward, then one
 * thread per channel of a position for dq, dk and dv together (each thread
 * owns its three outputs, so there are no races and no atomics). This is the
 * float32 table's attention, and the bf16 table's for head sizes the fused
 * kernel of attention.cu does not take; the probabilities are float32.
 *
 * qkv [B,T,3C]: q, k, v of position t at channel offsets 0, C, 2C; head h
 * uses channels h*hs .. (h+1)*hs. att, datt [B,NH,T,T], row (b,h,t). */

// att [B,NH,T,T] = causal softmax(q.k * scale); zeros above the diagonal.
// Dynamic shared memory: ROWS_PER_BLOCK * hs floats (each warp's query).
template <typename T>
__global__ void attention_softmax_kernel(float *att, const T *qkv, int B, int Tn, int C, int NH,
                                         float scale) {
    extern __shared__ float q_shared[];
    int hs = C / NH, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    size_t row = (size_t)blockIdx.x * ROWS_PER_BLOCK + warp;  // (b*NH + h)*T + t
    if (row >= (size_t)B * NH * Tn) return;
    int t = (int)(row % Tn), h = (int)(row / Tn % NH);
    size_t b = row / ((size_t)Tn * NH);
    const T *qkv_b = qkv + b * Tn * 3 * C;
    float *q = q_shared + warp * hs;
    for (int i = lane; i < hs; i += 32) q[i] = ld(qkv_b, (size_t)t * 3 * C + h * hs + i);
    __syncwarp();
    float *a = att + row * Tn;  // [T]

    // Lane l takes keys l, l+32, ...; it reads back only what it wrote.
    float maxv = -INFINITY;
    for (int t2 = lane; t2 <= t; t2 += 32) {
        const T *k = qkv_b + (size_t)t2 * 3 * C + C + h * hs;
        float s = 0.0f;
        for (int i = 0; i < hs; i++) s += q[i] * ld(k, i);
        s *= scale;
        a[t2] = s;
        maxv = fmaxf(maxv, s);
    }
    maxv = warp_max(maxv);
    float sum = 0.0f;
    for (int t2 = lane; t2 <= t; t2 += 32) {
        float e = expf(a[t2] - maxv);
        a[t2] = e;
        sum += e;
    }
    float inv = 1.0f / warp_sum(sum);
    for (int t2 = lane; t2 < Tn; t2 += 32) a[t2] = t2 <= t ? a[t2] * inv : 0.0f;
}

// out [B,T,C]: out[b,t,c] = sum_{t2<=t} att[b,h,t,t2] v[b,t2,c], h = c / hs.
// Threads of one position read the same att row (a broadcast) and
// consecutive channels of v (coalesced).
template <typename T>
__global__ void attention_value_kernel(T *out, const float *att, const T *qkv, int Tn, int C,
                                       int NH, size_t total) {
    int hs = C / NH;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        int c = (int)(i % C);
        size_t bt = i / C;
        int t = (int)(bt % Tn);
        size_t b = bt / Tn;
        const float *a = att + ((b * NH + c / hs) * Tn + t) * Tn;
        const T *v = qkv + b * Tn * 3 * C + 2 * C + c;
        float s = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) s += a[t2] * ld(v, (size_t)t2 * 3 * C);
        st(out, i, s);
    }
}

// datt [B,NH,T,T] = dpre, the gradient of the scaled scores, for t2 <= t
// (entries above the diagonal are left as they were: nothing reads them).
// datt = dout . v, then the softmax's backward dpre = att (datt - sum(att datt)),
// times scale. Dynamic shared memory: ROWS_PER_BLOCK * hs floats (dout rows).
template <typename T>
__global__ void attention_softmax_backward_kernel(float *datt, const T *dout, const T *qkv,
                                                  const float *att, int B, int Tn, int C, int NH,
                                                  float scale) {
    extern __shared__ float g_shared[];
    int hs = C / NH, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    size_t row = (size_t)blockIdx.x * ROWS_PER_BLOCK + warp;
    if (row >= (size_t)B * NH * Tn) return;
    int t = (int)(row % Tn), h = (int)(row / Tn % NH);
    size_t b = row / ((size_t)Tn * NH);
    const T *qkv_b = qkv + b * Tn * 3 * C;
    float *g = g_shared + warp * hs;
    for (int i = lane; i < hs; i += 32) g[i] = ld(dout, (b * Tn + t) * C + h * hs + i);
    __syncwarp();
    const float *a = att + row * Tn;
    float *da = datt + row * Tn;

    float dot = 0.0f;
    for (int t2 = lane; t2 <= t; t2 += 32) {
        const T *v = qkv_b + (size_t)t2 * 3 * C + 2 * C + h * hs;
        float s = 0.0f;
        for (int i = 0; i < hs; i++) s += ld(v, i) * g[i];
        da[t2] = s;
        dot += a[t2] * s;
    }
    dot = warp_sum(dot);
    for (int t2 = lane; t2 <= t; t2 += 32) da[t2] = a[t2] * (da[t2] - dot) * scale;
}

// dqkv [B,T,3C] += gradients, one thread per (b, t, c), c < C:
//   dq[t]  = sum_{t2<=t} dpre[t,t2] k[t2]
//   dk[t]  = sum_{t3>=t} dpre[t3,t] q[t3]
//   dv[t]  = sum_{t3>=t} att[t3,t] dout[t3]
// dpre (in datt) already carries the scale. A thread at position t walks
// t+1 keys and T-t queries: the same T+1 steps for every thread.
template <typename T>
__global__ void attention_qkv_backward_kernel(T *dqkv, const float *datt, const T *dout,
                                              const T *qkv, const float *att, int Tn, int C,
                                              int NH, size_t total) {
    int hs = C / NH;
    size_t C3 = (size_t)3 * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        int c = (int)(i % C);
        size_t bt = i / C;
        int t = (int)(bt % Tn);
        size_t b = bt / Tn;
        size_t head = (b * NH + c / hs) * Tn;  // row index of (b, h, 0)
        const T *qkv_b = qkv + b * Tn * C3;
        const float *dpre_row = datt + (head + t) * Tn;  // [T], row t
        float dq = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) dq += dpre_row[t2] * ld(qkv_b, (size_t)t2 * C3 + C + c);
        float dk = 0.0f, dv = 0.0f;
        for (int t3 = t; t3 < Tn; t3++) {  // column t of rows t3 >= t
            size_t at = (head + t3) * Tn + t;
            dk += datt[at] * ld(qkv_b, (size_t)t3 * C3 + c);
            dv += att[at] * ld(dout, (b * Tn + t3) * C + c);
        }
        size_t o = (b * Tn + t) * C3 + c;  /* written, as 0 + the sum (tensor.h) */
        st(dqkv, o, 0.0f + dq);
        st(dqkv, o + C, 0.0f + dk);
        st(dqkv, o + 2 * (size_t)C, 0.0f + dv);
    }
}

template <typename T>
static void attention_plain_forward(Dev *d, T *out, float *att, const T *qkv, int B, int Tn, int C,
                                    int NH) {
    size_t rows = (size_t)B * NH * Tn;
    if (!rows || C <= 0) return;
    int hs = C / NH;
    float scale = (float)(1.0 / sqrt((double)hs));
    size_t shmem = (size_t)ROWS_PER_BLOCK * hs * sizeof(float);
    attention_softmax_kernel<T><<<(unsigned)ceil_div(rows, ROWS_PER_BLOCK), ROWS_PER_BLOCK * 32, shmem, STREAM(d)>>>(
        att, qkv, B, Tn, C, NH, scale);
    LAUNCH_CHECK(attention_softmax_kernel);
    size_t total = (size_t)B * Tn * C;
    attention_value_kernel<T><<<elementwise_grid(total, 256), 256, 0, STREAM(d)>>>(out, att, qkv, Tn, C, NH, total);
    LAUNCH_CHECK(attention_value_kernel);
}

template <typename T>
static void attention_plain_backward(Dev *d, T *dqkv, float *datt, const T *dout, const T *qkv,
                                     const float *att, int B, int Tn, int C, int NH) {
    size_t rows = (size_t)B * NH * Tn;
    if (!rows || C <= 0) return;
    int hs = C / NH;
    float scale = (float)(1.0 / sqrt((double)hs));
    size_t shmem = (size_t)ROWS_PER_BLOCK * hs * sizeof(float);
    attention_softmax_backward_kernel<T><<<(unsigned)ceil_div(rows, ROWS_PER_BLOCK), ROWS_PER_BLOCK * 32, shmem, STREAM(d)>>>(
        datt, dout, qkv, att, B, Tn, C, NH, scale);
    LAUNCH_CHECK(attention_softmax_backward_kernel);
    size_t total = (size_t)B * Tn * C;
    attention_qkv_backward_kernel<T><<<elementwise_grid(total, 256), 256, 0, STREAM(d)>>>(
        dqkv, datt, dout, qkv, att, Tn, C, NH, total);
    LAUNCH_CHECK(attention_qkv_backward_kernel);
}

/* The float32 table: the plain kernels, probabilities kept. */
static size_t attention_floats_f32(int B, int Tn, int C, int NH, size_t *scratch) {
    size_t n = (size_t)B * NH * Tn * Tn;
    if (scratch) *scratch = n;
    return n;
}
static void attention_forward_f32(Dev *d, void *out, float *state, const void *qkv, int B, int Tn,
                                  int C, int NH) {
    attention_plain_forward<float>(d, (float *)out, state, (const float *)qkv, B, Tn, C, NH);
}
static void attention_backward_f32(Dev *d, void *dqkv, float *scratch, const void *dout,
                                   const void *qkv, const void *out, const float *state, int B,
                                   int Tn, int C, int NH) {
    attention_plain_backward<float>(d, (float *)dqkv, scratch, (const float *)dout,
                                    (const float *)qkv, state, B, Tn, C, NH);
}

/* The bf16 table: attention.cu's fused flash kernels where the head size
 * is one they were built for (state: a log-sum-exp a row), else the plain
 * kernels on bf16 storage (state: the probabilities). The one predicate
 * decides both, so the state's size always matches the kernel that fills it. */
static bool use_flash(int C, int NH) { return C % 8 == 0 && tc_flash_supports(C / NH); }

static size_t attention_floats_bf16(int B, int Tn, int C, int NH, size_t *scratch) {
    if (!use_flash(C, NH)) return attention_floats_f32(B, Tn, C, NH, scratch);
    if (scratch) *scratch = tc_flash_scratch_floats(B, Tn, C, NH);
    return (size_t)B * NH * Tn;
}
/* TRAIN_ATTN_SM90=1 in the environment: attention on attention_sm90.cu's
 * wgmma kernels where they run (an sm_90a build on an H100/H200): the
 * forward and the deterministic backward (not --atomic-dq) for heads of
 * 64 or 128; attention.cu's elsewhere. Unset or anything
 * else: attention.cu's everywhere. Opt-in until a GPU has run them
 * (bench/NOTES.md, "Third round"). Both forwards write the same lse, which
 * either backward reads. */
static bool want_sm90(void) {
    const char *e = getenv("TRAIN_ATTN_SM90");
    return e && strcmp(e, "1") == 0;
}
static void attention_forward_bf16(Dev *d, void *out, float *state, const void *qkv, int B, int Tn,
                                   int C, int NH) {
    if (B <= 0 || Tn <= 0 || C <= 0) return;
    if (use_flash(C, NH) && want_sm90() &&
        tc_flash_forward_sm90(out, state, qkv, B, Tn, C, NH, d->stream) == 0)
        return;
    if (use_flash(C, NH) && tc_flash_forward(out, state, qkv, B, Tn, C, NH, d->stream) == 0) return;
    attention_plain_forward<bf16>(d, (bf16 *)out, state, (const bf16 *)qkv, B, Tn, C, NH);
}
static void attention_backward_bf16(Dev *d, void *dqkv, float *scratch, const void *dout,
                                    const void *qkv, const void *out, const float *state, int B,
                                    int Tn, int C, int NH) {
    if (B <= 0 || Tn <= 0 || C <= 0) return;
    if (use_flash(C, NH) && !d->atomic_dq && want_sm90() &&
        tc_flash_backward_sm90(dqkv, scratch, dout, qkv, out, state, B, Tn, C, NH, d->stream) == 0)
        return;
    if (use_flash(C, NH) &&
        tc_flash_backward(dqkv, scratch, dout, qkv, out, state, B, Tn, C, NH, !d->atomic_dq,
                          d->stream) == 0)
        return;
    attention_plain_backward<bf16>(d, (bf16 *)dqkv, scratch, (const bf16 *)dout,
                                   (const bf16 *)qkv, state, B, Tn, C, NH);
}

/* ---------------------------------------------------------------------------
 * GELU (tanh approximation), the residual, casts: elementwise, 16-byte
 * vectors where the count and the pointers allow, one element a step
 * otherwise. */

/* gelu_f, gelu_grad: gelu.cuh (matmul.cu's fused epilogue shares them). */

/* One elementwise map over n elements: out[i] = f(a[i], b[i], out[i]).
 * F is a functor with float operator()(float a, float b, float old). A and
 * B may be NULL (read as 0); the vector path needs n a multiple of the
 * widest vector and every pointer aligned. */
template <typename TO, typename TA, typename TB, typename F>
__global__ void map_kernel(TO *out, const TA *a, const TB *b, size_t n, F f) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        st(out, i, f(a ? ld(a, i) : 0.0f, b ? ld(b, i) : 0.0f, ld(out, i)));
}

// V elements of an operand, moved as whole 16-byte pieces (V is chosen so
// that every operand's V elements are 16 or 32 bytes, at 16-byte aligned
// addresses).
template <typename T, int V> __device__ __forceinline__ void vload(T (&r)[V], const T *p) {
    static_assert(sizeof(T) * V % 16 == 0, "whole 16-byte pieces");
#pragma unroll
    for (int k = 0; k < (int)(sizeof(T) * V / 16); k++)
        reinterpret_cast<uint4 *>(r)[k] = reinterpret_cast<const uint4 *>(p)[k];
}
template <typename T, int V> __device__ __forceinline__ void vstore(T *p, const T (&r)[V]) {
#pragma unroll
    for (int k = 0; k < (int)(sizeof(T) * V / 16); k++)
        reinterpret_cast<uint4 *>(p)[k] = reinterpret_cast<const uint4 *>(r)[k];
}

template <int V, typename TO, typename TA, typename TB, typename F>
__global__ void map_vec_kernel(TO *out, const TA *a, const TB *b, size_t n, F f, bool reads_out) {
    size_t nv = n / V;
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < nv;
         j += (size_t)gridDim.x * blockDim.x) {
        TO o[V];
        TA x[V];
        TB y[V];
        size_t i = j * V;
        if (a) vload(x, a + i);
        if (b) vload(y, b + i);
        if (reads_out) vload(o, out + i);
#pragma unroll
        for (int k = 0; k < V; k++)
            st(o, (size_t)k, f(a ? ld(x, (size_t)k) : 0.0f, b ? ld(y, (size_t)k) : 0.0f,
                               reads_out ? ld(o, (size_t)k) : 0.0f));
        vstore(out + i, o);
    }
}

template <typename TO, typename TA, typename TB, typename F>
static void map(Dev *d, TO *out, const TA *a, const TB *b, size_t n, F f, bool reads_out) {
    if (!n) return;
    // 16 bytes of the narrowest operand: 8 elements with bf16 anywhere, else 4
    constexpr int V = (sizeof(TO) == 2 || sizeof(TA) == 2 || sizeof(TB) == 2) ? 8 : 4;
    if (n % V == 0 && aligned16(out) && (!a || aligned16(a)) && (!b || aligned16(b))) {
        map_vec_kernel<V><<<elementwise_grid(n / V, 256), 256, 0, STREAM(d)>>>(out, a, b, n, f, reads_out);
        LAUNCH_CHECK(map_vec_kernel);
        return;
    }
    map_kernel<<<elementwise_grid(n, 256), 256, 0, STREAM(d)>>>(out, a, b, n, f);
    LAUNCH_CHECK(map_kernel);
}

struct GeluF { __device__ float operator()(float x, float, float) const { return gelu_f(x); } };
struct GeluBackF {  // dinp += gelu'(x) * dout
    __device__ float operator()(float x, float g, float old) const { return old + gelu_grad(x) * g; }
};
struct AddF { __device__ float operator()(float x, float y, float) const { return x + y; } };
struct AccF { __device__ float operator()(float x, float, float old) const { return old + x; } };
struct CopyF { __device__ float operator()(float x, float, float) const { return x; } };

template <typename T>
static void gelu_forward(Dev *d, void *out, const void *inp, size_t n) {
    map(d, (T *)out, (const T *)inp, (const T *)NULL, n, GeluF(), false);
}
template <typename T>
static void gelu_backward(Dev *d, void *dinp, const void *inp, const void *dout, size_t n) {
    map(d, (T *)dinp, (const T *)inp, (const T *)dout, n, GeluBackF(), true);
}
/* Ops.matmul_forward_gelu. bf16: one tc_gemm_gelu (GELU of the stored
 * pre-activation in the epilogue: the bits of matmul_forward_bf16 then
 * gelu_forward). float32: the two ops. */
static void matmul_forward_gelu_bf16(Dev *d, void *out, void *gout, const void *inp, const void *w, const void *bias,
                                     int N, int C, int OC) {
    if (N <= 0 || OC <= 0 || C <= 0) {  /* as matmul_forward_bf16: nothing written; GELU of what out holds */
        gelu_forward<bf16>(d, gout, out, (size_t)(N > 0 && OC > 0 ? N : 0) * (OC > 0 ? OC : 0));
        return;
    }
    tc_gemm_gelu(TC_AUTO, out, gout, inp, 1, w, 1, bias, N, OC, C, d->stream);
}
static void matmul_forward_gelu_f32(Dev *d, void *out, void *gout, const void *inp, const void *w, const void *bias,
                                    int N, int C, int OC) {
    matmul_forward_f32(d, out, inp, w, bias, N, C, OC);
    gelu_forward<float>(d, gout, out, (size_t)N * OC);
}

/* Ops.matmul_backward_gelu. bf16: one tc_gemm_gelu_back, tmp untouched
 * (the product, rounded, goes through GELU's derivative in the epilogue;
 * the bits of matmul_backward_bf16 into a zeroed tmp then gelu_backward
 * into a zeroed dfch; with dbias, the column sums of the stored dfch in
 * tc_bias_grad's order from the same epilogue, in the Dev's scratch, which
 * the bf16 product never takes: matmul_backward_bf16's bits). float32:
 * the specification itself (ops.c's ops_matmul_backward_gelu_seq) over
 * this table's ops. */
static void matmul_backward_gelu_bf16(Dev *d, void *dfch, float *dbias, void *tmp, const void *dout, const void *w,
                                      const void *fch, int N, int C, int OC) {
    if (N <= 0 || C <= 0) return;
    /* OC 0 too: the simple kernel's empty sum, gelu'(fch) * 0 as the two ops give */
    tc_gemm_gelu_back(TC_AUTO, dfch, dout, 1, w, 0, fch, dbias, N, C, OC, (float *)d->scratch,
                      DEV_SCRATCH_BYTES / sizeof(float), d->stream);
}
static void matmul_backward_gelu_f32(Dev *d, void *dfch, float *dbias, void *tmp, const void *dout, const void *w,
                                     const void *fch, int N, int C, int OC) {
    ops_matmul_backward_gelu_seq(&cuda_ops, d, dfch, dbias, tmp, dout, w, fch, N, C, OC);
}

template <typename T>
static void add(Dev *d, void *out, const void *a, const void *b, size_t n) {
    map(d, (T *)out, (const T *)a, (const T *)b, n, AddF(), false);
}
static void accumulate(Dev *d, float *dst, const float *src, size_t n) {
    map(d, dst, src, (const float *)NULL, n, AccF(), true);
}
template <typename T>
static void cast(Dev *d, void *dst, const float *src, size_t n) {
    if ((const void *)dst == (const void *)src) return;
    map(d, (T *)dst, src, (const float *)NULL, n, CopyF(), false);
}
template <typename T>
static void widen(Dev *d, float *dst, const void *src, size_t n) {
    if ((const void *)dst == src) return;
    map(d, dst, (const T *)src, (const float *)NULL, n, CopyF(), false);
}

/* ---------------------------------------------------------------------------
 * Softmax + cross-entropy, fused, one block per row: the max and the sum of
 * exponentials over the V real columns (block reductions), the loss, and,
 * when a gradient is asked for, the row overwritten with it in a third pass.
 * Padded columns [V,Vp) are not classes: they get gradient 0. The row is
 * read twice and written once (bf16: 2 bytes an element each way). */

#define CE_THREADS 512

// losses [N], logits [N,Vp] (overwritten with its gradient if dloss != 0), targets [N]
// V: each thread takes W = Vec<T>::N consecutive columns at a time with
// 16-byte loads and stores (Vp % W == 0, logits 16-byte aligned). The scalar
// form keeps one 2- or 4-byte load a thread in flight and measured 22% of
// the copy's bandwidth on an H200 (3.6 ms at GPT-2's 16384 x 50304,
// bench/NOTES.md); a vector a load is W times the bytes in flight. A run of
// W values' max first, then at most one rescale of the running sum.
template <typename T, bool V>
__global__ void crossentropy_kernel(float *losses, T *logits, const int *targets, int Vr, int Vp,
                                    float dloss) {
    constexpr int W = V ? Vec<T>::N : 1;
    __shared__ float shared_f[32];
    int n = blockIdx.x;
    T *z = logits + (size_t)n * Vp;
    int y = targets[n];
    float zy = ld(z, (size_t)y);  // read before any thread overwrites the row

    // one pass: a running max and a sum rescaled when the max grows (online softmax)
    float maxv = -INFINITY, sum = 0.0f;
    for (int v0 = threadIdx.x * W; v0 < Vr; v0 += blockDim.x * W) {
        float x[W];
        if (V) {
            const Vec<T> r = ldv(z, (size_t)v0);
#pragma unroll
            for (int k = 0; k < W; k++) x[k] = vget(r, k);
        } else {
            x[0] = ld(z, (size_t)v0);
        }
        float m = maxv;
#pragma unroll
        for (int k = 0; k < W; k++)
            if (v0 + k < Vr) m = fmaxf(m, x[k]);
        if (m > maxv) { sum *= expf(maxv - m); maxv = m; }
#pragma unroll
        for (int k = 0; k < W; k++)
            if (v0 + k < Vr) sum += expf(x[k] - maxv);
    }
    float bmax = block_max(maxv, shared_f);
    sum = block_sum(maxv == -INFINITY ? 0.0f : sum * expf(maxv - bmax), shared_f);
    float logsum = logf(sum) + bmax;
    if (threadIdx.x == 0) losses[n] = logsum - zy;
    if (dloss == 0.0f) return;
    // Each element is read and written by the same thread: no barrier needed.
    for (int v0 = threadIdx.x * W; v0 < Vp; v0 += blockDim.x * W) {
        Vec<T> r;
        if (V) r = ldv(z, (size_t)v0);
#pragma unroll
        for (int k = 0; k < W; k++) {
            int v = v0 + k;
            float x = V ? vget(r, k) : ld(z, (size_t)v);
            float g = v < Vr ? dloss * (expf(x - logsum) - (v == y ? 1.0f : 0.0f)) : 0.0f;
            if (V) vset(r, k, g);
            else st(z, (size_t)v, g);
        }
        if (V) stv(z, (size_t)v0, r);
    }
}

template <typename T>
static void crossentropy(Dev *d, float *losses, void *logits, const int *targets, int N, int V,
                         int Vp, float dloss) {
    if (N <= 0) return;
    if (Vp % Vec<T>::N == 0 && aligned16(logits)) {
        crossentropy_kernel<T, true><<<N, CE_THREADS, 0, STREAM(d)>>>(losses, (T *)logits, targets, V, Vp, dloss);
        LAUNCH_CHECK(crossentropy_kernel);
        return;
    }
    crossentropy_kernel<T, false><<<N, CE_THREADS, 0, STREAM(d)>>>(losses, (T *)logits, targets, V, Vp, dloss);
    LAUNCH_CHECK(crossentropy_kernel);
}

/* ---------------------------------------------------------------------------
 * The vocabulary-parallel cross-entropy (Megatron's), in three ops. Each rank
 * holds logits [N,Vl] for vocabulary ids [v0, v0 + Vl), of which the first
 * nvalid are real classes and the rest padding (nvalid may be 0 or less on
 * a rank past the end of the vocabulary).
 *   xent_stats:   per row, over the valid columns, the local max, the sum of
 *                 exp(z - local max) and the target's logit (0 when the
 *                 target is another rank's): stats [N,3];
 *   xent_combine: from every rank's stats, gathered [R,N,3], the global
 *                 log-sum-exp and the loss, one thread per row;
 *   xent_grad:    the row overwritten with dloss * (softmax - onehot), 0 in
 *                 the padding, as crossentropy does with the whole row. */

/* Threads of a block that walks one row of cols columns: enough warps to
 * cover the row once, at most CE_THREADS (a multiple of 32, as the block
 * reductions need), so a narrow slice does not launch 512 idle threads. */
static int row_threads(int cols) {
    int threads = (int)ceil_div((size_t)(cols > 32 ? cols : 32), 32) * 32;
    return threads < CE_THREADS ? threads : CE_THREADS;
}

// stats [N,3], logits [N,Vl], targets [N] (global vocabulary ids); one block per row.
template <typename T>
__global__ void xent_stats_kernel(float *stats, const T *logits, const int *targets, int v0,
                                  int nvalid, int Vl) {
    __shared__ float shared_f[32];
    int n = blockIdx.x;
    const T *z = logits + (size_t)n * Vl;

    float maxv = -INFINITY;
    for (int v = threadIdx.x; v < nvalid; v += blockDim.x) maxv = fmaxf(maxv, ld(z, (size_t)v));
    maxv = block_max(maxv, shared_f);
    float sum = 0.0f;
    for (int v = threadIdx.x; v < nvalid; v += blockDim.x) sum += expf(ld(z, (size_t)v) - maxv);
    sum = block_sum(sum, shared_f);
    if (threadIdx.x == 0) {
        int y = targets[n] - v0;  // the target's column in this slice, if it is here
        float *s = stats + (size_t)n * 3;
        s[0] = nvalid > 0 ? maxv : 0.0f;  // no valid column: max 0, sum 0
        s[1] = sum;
        s[2] = y >= 0 && y < nvalid ? ld(z, (size_t)y) : 0.0f;
    }
}

// losses [N], lse [N], gathered [R,N,3]; one thread per row, ranks in order.
// A rank whose sum is 0 had no valid column: its max (0) is not a logit, so
// it takes no part in the max, nor in the sum. The sum is a double, as in ops.c.
__global__ void xent_combine_kernel(float *losses, float *lse, const float *gathered, int N, int R) {
    for (size_t n = blockIdx.x * (size_t)blockDim.x + threadIdx.x; n < (size_t)N;
         n += (size_t)gridDim.x * blockDim.x) {
        float maxv = -INFINITY, zy = 0.0f;
        for (int r = 0; r < R; r++) {
            const float *s = gathered + ((size_t)r * N + n) * 3;
            if (s[1] > 0.0f && s[0] > maxv) maxv = s[0];
        }
        double sum = 0.0;
        for (int r = 0; r < R; r++) {
            const float *s = gathered + ((size_t)r * N + n) * 3;
            if (s[1] > 0.0f) sum += s[1] * expf(s[0] - maxv);
            zy += s[2];  // only the target's rank holds a non-zero logit
        }
        float l = (float)log(sum) + maxv;
        lse[n] = l;
        losses[n] = l - zy;
    }
}

// logits [N,Vl] overwritten with their gradient, lse [N], targets [N]; one block per row.
// Each element is read and written by the same thread: no barrier needed.
template <typename T>
__global__ void xent_grad_kernel(T *logits, const float *lse, const int *targets, int v0,
                                 int nvalid, int Vl, float dloss) {
    int n = blockIdx.x;
    T *z = logits + (size_t)n * Vl;
    float l = lse[n];
    int y = targets[n] - v0;
    for (int v = threadIdx.x; v < Vl; v += blockDim.x)
        st(z, (size_t)v, v < nvalid ? dloss * (expf(ld(z, (size_t)v) - l) - (v == y ? 1.0f : 0.0f)) : 0.0f);
}

template <typename T>
static void xent_stats(Dev *d, float *stats, const void *logits, const int *targets, int N,
                       int v0, int nvalid, int Vl) {
    if (N <= 0) return;  // nvalid <= 0 still launches: every row gets max 0, sum 0
    xent_stats_kernel<T><<<N, row_threads(nvalid), 0, STREAM(d)>>>(stats, (const T *)logits, targets, v0, nvalid, Vl);
    LAUNCH_CHECK(xent_stats_kernel);
}

static void xent_combine(Dev *d, float *losses, float *lse, const float *gathered, int N, int R) {
    if (N <= 0) return;
    xent_combine_kernel<<<elementwise_grid((size_t)N, 256), 256, 0, STREAM(d)>>>(losses, lse, gathered, N, R);
    LAUNCH_CHECK(xent_combine_kernel);
}

template <typename T>
static void xent_grad(Dev *d, void *logits, const float *lse, const int *targets, int N, int v0,
                      int nvalid, int Vl, float dloss) {
    if (N <= 0 || Vl <= 0) return;
    xent_grad_kernel<T><<<N, row_threads(Vl), 0, STREAM(d)>>>((T *)logits, lse, targets, v0, nvalid, Vl, dloss);
    LAUNCH_CHECK(xent_grad_kernel);
}

/* ---------------------------------------------------------------------------
 * AdamW, torch.optim.AdamW's arithmetic in ops.c's order. */

// param, grad, m, v [n]
__global__ void adamw_kernel(float *param, const float *grad, float *m, float *v, size_t n,
                             float lr, float beta1, float beta2, float eps, float wd, float step,
                             float rbc2, float grad_scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float g = grad[i] * grad_scale;
        float p = param[i] * (1.0f - lr * wd);
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        param[i] = p - step * mi / (sqrtf(vi) * rbc2 + eps);
        m[i] = mi;
        v[i] = vi;
    }
}

static void adamw(Dev *d, float *param, const float *grad, float *m, float *v, size_t n, float lr,
                  float beta1, float beta2, float eps, float wd, float bc1, float bc2,
                  float grad_scale) {
    if (!n) return;
    float step = lr / bc1, rbc2 = 1.0f / sqrtf(bc2);  // the bias corrections, folded once
    adamw_kernel<<<elementwise_grid(n, 256), 256, 0, STREAM(d)>>>(param, grad, m, v, n, lr, beta1, beta2,
                                                                  eps, wd, step, rbc2, grad_scale);
    LAUNCH_CHECK(adamw_kernel);
}

/* The whole step in one launch: a block takes ADAM_CHUNK elements of one
 * segment (blocks are numbered segment after segment; a block finds its
 * segment by binary search over their first blocks). The segment table
 * goes to the Dev's scratch, in batches that fit it. Per element the
 * arithmetic is adamw_kernel's, so results are bit-identical to it. */
#define ADAM_CHUNK 16384

struct AdamSegDev {
    float *param;
    const float *grad;
    float *m, *v;
    size_t n;
    float wd;
    unsigned first_block;  // this segment's first block in the launch
    bf16 *lp;              // [n] the bf16 compute copy, or NULL
};

// segs [nsegs] in device memory; one block a chunk of a segment
__global__ void adamw_segs_kernel(const AdamSegDev *segs, int nsegs, float lr, float beta1,
                                  float beta2, float eps, float step, float rbc2, float grad_scale) {
    __shared__ int seg;
    if (threadIdx.x == 0) {  // the last segment whose first block <= this block
        int lo = 0, hi = nsegs - 1;
        while (lo < hi) {
            int mid = (lo + hi + 1) / 2;
            if (segs[mid].first_block <= blockIdx.x) lo = mid;
            else hi = mid - 1;
        }
        seg = lo;
    }
    __syncthreads();
    const AdamSegDev s = segs[seg];
    size_t start = (size_t)(blockIdx.x - s.first_block) * ADAM_CHUNK;
    size_t end = start + ADAM_CHUNK < s.n ? start + ADAM_CHUNK : s.n;
    for (size_t i = start + threadIdx.x; i < end; i += blockDim.x) {
        float g = s.grad[i] * grad_scale;
        float p = s.param[i] * (1.0f - lr * s.wd);
        float mi = beta1 * s.m[i] + (1.0f - beta1) * g;
        float vi = beta2 * s.v[i] + (1.0f - beta2) * g * g;
        p -= step * mi / (sqrtf(vi) * rbc2 + eps);
        s.param[i] = p;
        s.m[i] = mi;
        s.v[i] = vi;
        if (s.lp) st(s.lp, i, p);   // Ops.cast's rounding: the copy the next use would make
    }
}

static void adamw_segs(Dev *d, const AdamSeg *segs, int nsegs, float lr, float beta1, float beta2,
                       float eps, float bc1, float bc2, float grad_scale) {
    const int batch = (int)(DEV_SCRATCH_BYTES / sizeof(AdamSegDev));
    float step = lr / bc1, rbc2 = 1.0f / sqrtf(bc2);
    AdamSegDev *host = (AdamSegDev *)malloc((size_t)(nsegs < batch ? nsegs : batch) * sizeof(AdamSegDev) + 1);
    if (!host) { fprintf(stderr, "error: out of host memory (optimizer segments)\n"); exit(1); }
    for (int k0 = 0; k0 < nsegs; k0 += batch) {
        int k1 = k0 + batch < nsegs ? k0 + batch : nsegs, n = 0;
        size_t blocks = 0;
        for (int k = k0; k < k1; k++) {
            if (!segs[k].n) continue;
            host[n] = {segs[k].param, segs[k].grad, segs[k].m, segs[k].v, segs[k].n, segs[k].wd,
                       (unsigned)blocks, (bf16 *)segs[k].lp};
            blocks += ceil_div(segs[k].n, ADAM_CHUNK);
            n++;
        }
        if (!n) continue;
        const size_t bytes = (size_t)n * sizeof(AdamSegDev);
        const AdamSegDev *table = (const AdamSegDev *)d->scratch;
        if (k1 == nsegs && k0 == 0) {
            // one batch: the table is the same every step (only lr and the scale change), so it
            // stays on the device in a buffer of its own and goes up again only when it changes
            // (the first step allocates it): no copy and no wait in a step after the first
            if (bytes != d->adam_table_bytes || memcmp(host, d->adam_table_host, bytes)) {
                if (bytes > d->adam_table_cap) {
                    if (d->adam_table) cuda_free(d->adam_table);
                    d->adam_table = cuda_malloc(bytes);
                    free(d->adam_table_host);
                    d->adam_table_host = malloc(bytes);
                    if (!d->adam_table_host) { fprintf(stderr, "error: out of host memory (optimizer segments)\n"); exit(1); }
                    d->adam_table_cap = bytes;
                }
                cuda_copy_h2d(d->adam_table, host, bytes, d->stream);  // after the last step's reader
                memcpy(d->adam_table_host, host, bytes);
                d->adam_table_bytes = bytes;
            }
            table = (const AdamSegDev *)d->adam_table;
        } else {
            // the table waits for the stream's earlier work on the scratch, then the stream waits for it
            cuda_copy_h2d(d->scratch, host, bytes, d->stream);
        }
        adamw_segs_kernel<<<(unsigned)blocks, 256, 0, STREAM(d)>>>(table, n, lr,
                                                                   beta1, beta2, eps, step, rbc2, grad_scale);
        LAUNCH_CHECK(adamw_segs_kernel);
        if (k1 < nsegs) cuda_sync(d->stream);  // the next batch reuses the scratch
    }
    free(host);
}

/* ---------------------------------------------------------------------------
 * Sum and sum of squares in double: each block writes its partial sum to
 * the Dev's scratch, the host adds the partials in block order. */

#define SUM_THREADS 256
#define SUM_BLOCKS 1024  /* up to 32 KiB of partials, well inside DEV_SCRATCH_BYTES */

// partials [gridDim.x] = per-block sum of x[i] (or x[i]^2) over x [n]
__global__ void sum_partials_kernel(double *partials, const float *x, size_t n, int squares) {
    __shared__ double shared_d[32];
    double s = 0.0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        double xi = x[i];
        s += squares ? xi * xi : xi;
    }
    s = block_sum(s, shared_d);
    if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// loss [0] += (sum of partials [blocks] in block order) / n: reduce_to_host's host loop, then
// pp_run's += of gpt_head_forward's sum / N, on the device (dev_loss_*, tensor.h)
__global__ void loss_add_kernel(double *loss, const double *partials, unsigned blocks, size_t n) {
    if (blockIdx.x || threadIdx.x) return;
    double s = 0.0;
    for (unsigned i = 0; i < blocks; i++) s += partials[i];
    loss[0] += s / (double)n;
}

// sum_mean [3]: mean = sum / M, its float beside it, the sum zeroed for the next step
__global__ void loss_finish_kernel(double *sum_mean, int M) {
    if (blockIdx.x || threadIdx.x) return;
    const double mean = sum_mean[0] / M;
    sum_mean[1] = mean;
    *(float *)(sum_mean + 2) = (float)mean;
    sum_mean[0] = 0.0;
}

extern "C" void *cuda_event_new(void) {
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return (void *)e;
}
extern "C" void cuda_event_record(void *event, void *stream) {
    CUDA_CHECK(cudaEventRecord((cudaEvent_t)event, (cudaStream_t)stream));
}
extern "C" void cuda_event_wait(void *event) { CUDA_CHECK(cudaEventSynchronize((cudaEvent_t)event)); }
extern "C" void cuda_event_free(void *event) { CUDA_CHECK(cudaEventDestroy((cudaEvent_t)event)); }

extern "C" void cuda_loss_finish(void *sum_mean, int M, void *stream) {
    loss_finish_kernel<<<1, 32, 0, (cudaStream_t)stream>>>((double *)sum_mean, M);
    LAUNCH_CHECK(loss_finish_kernel);
}

static double reduce_to_host(Dev *d, const float *x, size_t n, int squares) {
    if (!n) return 0.0;
    unsigned blocks = (unsigned)ceil_div(n, SUM_THREADS);
    if (blocks > SUM_BLOCKS) blocks = SUM_BLOCKS;
    double *partials = (double *)d->scratch;
    sum_partials_kernel<<<blocks, SUM_THREADS, 0, STREAM(d)>>>(partials, x, n, squares);
    LAUNCH_CHECK(sum_partials_kernel);
    if (d->loss_deferred && !squares) {  // the step's loss: added on the device, read with the norm
        if (!d->loss_dev) { fprintf(stderr, "error: a deferred loss before dev_loss_finish made its buffer\n"); exit(1); }
        loss_add_kernel<<<1, 32, 0, STREAM(d)>>>((double *)d->loss_dev, partials, blocks, n);
        LAUNCH_CHECK(loss_add_kernel);
        return 0.0;
    }
    double host[SUM_BLOCKS];
    cuda_copy_d2h(host, partials, blocks * sizeof(double), d->stream);  // waits for the stream
    double s = 0.0;
    for (unsigned i = 0; i < blocks; i++) s += host[i];
    return s;
}

static double sumsq(Dev *d, const float *x, size_t n) { return reduce_to_host(d, x, n, 1); }
static double sum(Dev *d, const float *x, size_t n) { return reduce_to_host(d, x, n, 0); }

/* The gradient norm's steps on a NormAcc in device memory (ops.c's
 * cpu_norm_add, cpu_norm_redo and cpu_norm_pack; optim.h, "The gradient
 * norm"), nothing read back: optim_norm reads the result once. The same
 * bits as the CPU's: each element's parts depend on it and the grid alone,
 * and every sum of parts is a whole number of units below 2^50, exact in
 * double in any order, so each block adds its sums to the NormAcc with
 * atomics, and one launch takes a pass over all of a rank's runs (up to
 * NORM_RUNS_MAX of them, by value in the launch's parameters: nothing to
 * upload). (Where a guessed grid proves wrong its sums may round; they are
 * never used.) */
enum { NORM_EXP = 0, NORM_ADD = 1, NORM_REDO = 2 };
#define NORM_RUNS_MAX 128   /* 2 KB of parameters, within the 4 KB every card takes */
struct NormRunsArg {
    const float *x[NORM_RUNS_MAX];
    size_t n[NORM_RUNS_MAX];
    int count;
};

// Over the runs r.x[k] [r.n[k]]: NORM_EXP: a->e = max(a->e, their largest biased exponent);
// NORM_ADD: that, and a->s[k] += part k of x^2 on g summed over them; NORM_REDO: a->r[k] +=
// the same on the grid of a->e (everyone's exponent by now) where it is not guess (nor 255),
// else nothing
__global__ void norm_kernel(NormAcc *a, NormRunsArg r, NormGrid g, int mode, int guess) {
    __shared__ double shared_d[32];
    __shared__ float shared_f[32];
    double *sums = a->s;
    if (mode == NORM_REDO) {
        const int e = a->e;                   // the same for every thread: the block returns whole
        if (e == guess || e == 255) return;
        g = norm_grid_at(e, g.bits);
        sums = a->r;
    }
    double s0 = 0, s1 = 0, s2 = 0;
    unsigned e = 0;
    for (int k = 0; k < r.count; k++) {
        const float *x = r.x[k];
        for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < r.n[k];
             i += (size_t)gridDim.x * blockDim.x) {
            e = max(e, (__float_as_uint(x[i]) >> 23) & 0xffu);
            if (mode == NORM_EXP) continue;
            double y = (double)x[i] * x[i] * g.scale;
            double p0 = (y + g.c[0]) - g.c[0];
            y -= p0;
            double p1 = (y + g.c[1]) - g.c[1];
            y -= p1;
            s0 += p0;
            s1 += p1;
            s2 += (y + g.c[2]) - g.c[2];
        }
    }
    float b = block_max((float)e, shared_f);
    if (mode != NORM_EXP) {
        s0 = block_sum(s0, shared_d);
        s1 = block_sum(s1, shared_d);
        s2 = block_sum(s2, shared_d);
    }
    if (threadIdx.x == 0) {
        if (mode != NORM_REDO) atomicMax(&a->e, (int)b);
        if (mode != NORM_EXP) {
            atomicAdd(&sums[0], s0);
            atomicAdd(&sums[1], s1);
            atomicAdd(&sums[2], s2);
        }
    }
}

// a->limbs = the sums of a->e's grid (a->s where a->e is guess, else a->r) as limbs, 0 for 255
__global__ void norm_pack_kernel(NormAcc *a, int guess, int bits) {
    const int e = a->e;
    if (e == 255) {
        for (int k = 0; k < NORM_LIMBS; k++) a->limbs[k] = 0;
        return;
    }
    const NormGrid g = norm_grid_at(e, bits);
    norm_pack_limbs(e == guess ? a->s : a->r, &g, a->limbs);
}

// One launch for each NORM_RUNS_MAX runs (all of a rank's on any layout
// this program makes), as many blocks as the largest run fills.
static void norm_launch(Dev *d, NormAcc *a, const NormRun *runs, int nruns, NormGrid g, int mode, int guess) {
    for (int k0 = 0; k0 < nruns; k0 += NORM_RUNS_MAX) {
        NormRunsArg r{};
        size_t most = 0;
        r.count = nruns - k0 < NORM_RUNS_MAX ? nruns - k0 : NORM_RUNS_MAX;
        for (int k = 0; k < r.count; k++) {
            r.x[k] = runs[k0 + k].x;
            r.n[k] = runs[k0 + k].n;
            if (r.n[k] > most) most = r.n[k];
        }
        if (!most) continue;
        unsigned blocks = (unsigned)ceil_div(most, SUM_THREADS);
        if (blocks > SUM_BLOCKS) blocks = SUM_BLOCKS;
        norm_kernel<<<blocks, SUM_THREADS, 0, STREAM(d)>>>(a, r, g, mode, guess);
        LAUNCH_CHECK(norm_kernel);
    }
}

static void norm_add(Dev *d, NormAcc *a, const NormRun *runs, int nruns, const NormGrid *g) {
    norm_launch(d, a, runs, nruns, g ? *g : NormGrid{}, g ? NORM_ADD : NORM_EXP, 0);
}

static void norm_redo(Dev *d, NormAcc *a, const NormRun *runs, int nruns, int guess, int bits) {
    NormGrid g{};
    g.bits = bits;
    norm_launch(d, a, runs, nruns, g, NORM_REDO, guess);
}

static void norm_pack(Dev *d, NormAcc *a, int guess, int bits) {
    norm_pack_kernel<<<1, 1, 0, STREAM(d)>>>(a, guess, bits);
    LAUNCH_CHECK(norm_pack_kernel);
}

/* ---------------------------------------------------------------------------
 * Context parallelism's ring on a GPU (cp.c, docs/context-parallel.md): one
 * block step of the ring, forward and backward, for rank r's query rows
 * against the keys and values rank s holds. Positions follow cp.c's deal
 * (cp_position: rank r holds chunks r and 2N-1-r of Tc = T/2N tokens), and
 * the causal mask is on those positions. In bf16, at a head size flash
 * attention takes (32, 64, 128), a step runs on attention.cu's flash
 * kernels given the chunk pair (tc_flash_pair_forward / _backward: tiles of
 * 64 on tensor cores, the visible key tiles a prefix of the block, masked
 * where a tile pair straddles; the backward's dq without atomics). Float32,
 * and other head sizes, run the plain kernels below: one thread per (batch,
 * head, row), plain loops over the block's keys and the head's channels.
 * Both accumulate in float32 (the partial output and its log-sum-exp, dq,
 * and the travelling dk dv); qkv, kv, dout and out are read in the table's
 * dtype. Each thread (plain) or thread block (flash) owns the outputs it
 * writes: no atomics, the same bits every run.
 *
 * qkv [B,Tl,3C] (Tl = T/N), kv [B,Tl,2C], acc [B,Tl,C] f32, lse and D
 * [B,NH,Tl] f32, dkv [B,Tl,2C] f32; head h at channels h*hs. */

__device__ __forceinline__ int cp_pos_dev(int N, int r, int T, int i) {
    if (N == 1) return i;
    int Tc = T / (2 * N), half = i / Tc;
    return (half ? 2 * N - 1 - r : r) * Tc + i % Tc;
}

/* q . k over hs channels, both in T, times scale. */
template <typename T>
__device__ __forceinline__ float cp_dot(const T *a, const T *b, int hs) {
    float s = 0.0f;
    for (int i = 0; i < hs; i++) s += ld(a, i) * ld(b, i);
    return s;
}

// The rows [B,NH,Tl] of a ring step, walked grid-stride: the first row
// this thread takes, the stride, the count; and a row's (b, h, i).
struct CpRows {
    size_t first, stride, total;
};
struct CpRow {
    size_t b;   // the batch row
    int h, i;   // the head, the position in this rank's Tl
};
__device__ inline CpRows cp_rows(int B, int NH, int Tl) {
    return {blockIdx.x * (size_t)blockDim.x + threadIdx.x, (size_t)gridDim.x * blockDim.x, (size_t)B * NH * Tl};
}
__device__ inline CpRow cp_row_of(size_t row, int Tl, int NH) {
    return {row / ((size_t)Tl * NH), (int)(row / Tl % NH), (int)(row % Tl)};
}

// The merge, one thread a (b, h, t): the block's max, then its sum of
// e^(s - max) (so lse_b), then both partials rescaled to the merged
// log-sum-exp: acc = acc e^(lse - lse') + sum_j e^(s_j - lse') v_j.
// first: acc and lse hold nothing yet (read as 0 and -inf).
template <typename T>
__global__ void cp_block_forward_kernel(float *acc, float *lse, const T *qkv, const T *kv, int B, int Tn,
                                        int C, int NH, int N, int r, int s, int first, float scale) {
    int Tl = Tn / N, hs = C / NH;
    CpRows w = cp_rows(B, NH, Tl);
    for (size_t row = w.first; row < w.total; row += w.stride) {
        CpRow at = cp_row_of(row, Tl, NH);
        size_t b = at.b;
        int h = at.h, t = at.i;
        const T *q = qkv + (b * Tl + t) * 3 * C + h * hs;
        const T *kb = kv + b * Tl * 2 * C + h * hs;   // row j's k at j*2C, its v at j*2C + C
        int pq = cp_pos_dev(N, r, Tn, t);
        float m = -INFINITY;
        for (int j = 0; j < Tl; j++)
            if (cp_pos_dev(N, s, Tn, j) <= pq) m = fmaxf(m, cp_dot(q, kb + (size_t)j * 2 * C, hs) * scale);
        float *o = acc + (b * Tl + t) * C + h * hs;
        float lo = first ? -INFINITY : lse[row];
        if (m == -INFINITY) {   // no key of this block is visible
            if (first) { for (int i = 0; i < hs; i++) o[i] = 0.0f; lse[row] = -INFINITY; }
            continue;
        }
        float sum = 0.0f;
        for (int j = 0; j < Tl; j++)
            if (cp_pos_dev(N, s, Tn, j) <= pq) sum += expf(cp_dot(q, kb + (size_t)j * 2 * C, hs) * scale - m);
        float lb = m + logf(sum);
        float hi = fmaxf(lo, lb), merged = hi + logf(expf(lo - hi) + expf(lb - hi));
        float keep = expf(lo - merged);
        for (int i = 0; i < hs; i++) o[i] = first ? 0.0f : o[i] * keep;
        for (int j = 0; j < Tl; j++) {
            if (cp_pos_dev(N, s, Tn, j) > pq) continue;
            const T *k = kb + (size_t)j * 2 * C;
            float p = expf(cp_dot(q, k, hs) * scale - merged);
            for (int i = 0; i < hs; i++) o[i] += p * ld(k + C, i);
        }
        lse[row] = merged;
    }
}

// The backward of one ring step, one thread a row of one side of it:
// KEYS false, a query row t (b, h, t) of this rank: dq [B,Tl,C] += sum_j dS_j k_j
// over the block's keys j it sees; KEYS true, a key row j of the block:
// dkv [B,Tl,2C] += (sum_t dS_t q_t, sum_t P_t dO_t) over this rank's queries t
// that see it. P = e^(s scale - lse), dS = P (dO . v - D) scale. Each thread
// owns the rows it writes, so no two threads add into one element.
template <typename T, bool KEYS>
__global__ void cp_block_backward_kernel(float *grad, const T *qkv, const T *kv, const float *lse,
                                         const float *D, const T *dout, int B, int Tn, int C, int NH, int N,
                                         int r, int s, float scale) {
    int Tl = Tn / N, hs = C / NH;
    CpRows w = cp_rows(B, NH, Tl);
    for (size_t row = w.first; row < w.total; row += w.stride) {
        CpRow at = cp_row_of(row, Tl, NH);   // a query row, or a key row (KEYS)
        size_t b = at.b;
        for (int other = 0; other < Tl; other++) {
            int t = KEYS ? other : at.i, j = KEYS ? at.i : other, h = at.h;   // the query row, the key row
            if (cp_pos_dev(N, s, Tn, j) > cp_pos_dev(N, r, Tn, t)) continue;
            const T *q = qkv + (b * Tl + t) * 3 * C + h * hs, *g = dout + (b * Tl + t) * C + h * hs;
            const T *k = kv + (b * Tl + j) * 2 * C + h * hs;   // its v at k + C
            size_t qrow = (b * NH + h) * Tl + t;
            float p = expf(cp_dot(q, k, hs) * scale - lse[qrow]);
            float ds = p * (cp_dot(g, k + C, hs) - D[qrow]) * scale;
            if (KEYS) {
                float *dk = grad + (b * Tl + j) * 2 * C + h * hs, *dv = dk + C;
                for (int i = 0; i < hs; i++) {
                    dk[i] += ds * ld(q, i);
                    dv[i] += p * ld(g, i);
                }
            } else {
                float *dq = grad + (b * Tl + t) * C + h * hs;
                for (int i = 0; i < hs; i++) dq[i] += ds * ld(k, i);
            }
        }
    }
}

// D [B,NH,Tl] = dO . O per (row, head).
template <typename T>
__global__ void cp_prep_kernel(float *D, const T *out, const T *dout, int B, int Tl, int C, int NH) {
    int hs = C / NH;
    size_t total = (size_t)B * NH * Tl;
    for (size_t row = blockIdx.x * (size_t)blockDim.x + threadIdx.x; row < total;
         row += (size_t)gridDim.x * blockDim.x) {
        CpRow at = cp_row_of(row, Tl, NH);
        size_t b = at.b;
        int h = at.h, t = at.i;
        size_t o = (b * Tl + t) * C + h * hs;
        D[row] = cp_dot(out + o, dout + o, hs);
    }
}

// dst [rows, ldd] at column off.. off+w = src [rows, lds] at column offs..,
// each element widened to float32 and stored in TD (the kv pack, the
// results' stores).
template <typename TD, typename TS>
__global__ void cp_copy_cols_kernel(TD *dst, size_t ldd, size_t off, const TS *src, size_t lds, size_t offs,
                                    size_t w, size_t total) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        size_t row = i / w, c = i % w;
        st(dst, row * ldd + off + c, ld(src, row * lds + offs + c));
    }
}

template <typename T>
static void cp_forward_t(float *acc, float *lse, const void *qkv, const void *kv, int B, int Tn, int C, int NH,
                         int N, int r, int s, int first, cudaStream_t cs) {
    size_t rows = (size_t)B * NH * (Tn / N);
    if (!rows) return;
    float scale = (float)(1.0 / sqrt((double)(C / NH)));
    cp_block_forward_kernel<T><<<elementwise_grid(rows, 128), 128, 0, cs>>>(
        acc, lse, (const T *)qkv, (const T *)kv, B, Tn, C, NH, N, r, s, first, scale);
    LAUNCH_CHECK(cp_block_forward_kernel);
}

template <typename T>
static void cp_backward_t(float *dq, float *dkv, const void *qkv, const void *kv, const float *lse,
                          const float *D, const void *dout, int B, int Tn, int C, int NH, int N, int r, int s,
                          cudaStream_t cs) {
    size_t rows = (size_t)B * NH * (Tn / N);
    if (!rows) return;
    float scale = (float)(1.0 / sqrt((double)(C / NH)));
    cp_block_backward_kernel<T, false><<<elementwise_grid(rows, 128), 128, 0, cs>>>(
        dq, (const T *)qkv, (const T *)kv, lse, D, (const T *)dout, B, Tn, C, NH, N, r, s, scale);
    LAUNCH_CHECK(cp_block_backward_kernel);
    cp_block_backward_kernel<T, true><<<elementwise_grid(rows, 128), 128, 0, cs>>>(
        dkv, (const T *)qkv, (const T *)kv, lse, D, (const T *)dout, B, Tn, C, NH, N, r, s, scale);
    LAUNCH_CHECK(cp_block_backward_kernel);
}

// bf16 at a head size the flash kernels take (use_flash, as the whole-sequence
// attention decides): the step runs on attention.cu's tensor-core kernels,
// given the chunk pair; otherwise on the plain kernels above.
extern "C" void cuda_cp_block_forward(float *acc, float *lse, const void *qkv, const void *kv, int B, int Tn,
                                      int C, int NH, int N, int r, int s, int first, DType t, void *stream) {
    if (t == DT_BF16 && use_flash(C, NH) &&
        tc_flash_pair_forward(acc, lse, qkv, kv, B, Tn, C, NH, N, r, s, first, stream) == 0)
        return;
    if (t == DT_BF16) cp_forward_t<bf16>(acc, lse, qkv, kv, B, Tn, C, NH, N, r, s, first, (cudaStream_t)stream);
    else cp_forward_t<float>(acc, lse, qkv, kv, B, Tn, C, NH, N, r, s, first, (cudaStream_t)stream);
}

extern "C" void cuda_cp_block_backward(float *dq, float *dkv, const void *qkv, const void *kv, const float *lse,
                                       const float *D, const void *dout, int B, int Tn, int C, int NH, int N,
                                       int r, int s, DType t, void *stream) {
    if (t == DT_BF16 && use_flash(C, NH) &&
        tc_flash_pair_backward(dq, dkv, qkv, kv, lse, D, dout, B, Tn, C, NH, N, r, s, stream) == 0)
        return;
    if (t == DT_BF16) cp_backward_t<bf16>(dq, dkv, qkv, kv, lse, D, dout, B, Tn, C, NH, N, r, s, (cudaStream_t)stream);
    else cp_backward_t<float>(dq, dkv, qkv, kv, lse, D, dout, B, Tn, C, NH, N, r, s, (cudaStream_t)stream);
}

extern "C" void cuda_cp_prep(float *D, const void *out, const void *dout, int B, int Tl, int C, int NH, DType t,
                             void *stream) {
    size_t rows = (size_t)B * NH * Tl;
    if (!rows) return;
    cudaStream_t cs = (cudaStream_t)stream;
    if (t == DT_BF16)
        cp_prep_kernel<bf16><<<elementwise_grid(rows, 128), 128, 0, cs>>>(D, (const bf16 *)out, (const bf16 *)dout, B, Tl, C, NH);
    else
        cp_prep_kernel<float><<<elementwise_grid(rows, 128), 128, 0, cs>>>(D, (const float *)out, (const float *)dout, B, Tl, C, NH);
    LAUNCH_CHECK(cp_prep_kernel);
}

extern "C" void cuda_cp_copy_cols(void *dst, DType td, size_t ldd, size_t off, const void *src, DType ts,
                                  size_t lds, size_t offs, size_t w, size_t rows, void *stream) {
    size_t total = rows * w;
    if (!total) return;
    cudaStream_t cs = (cudaStream_t)stream;
    unsigned g = elementwise_grid(total, 256);
#define CP_COPY(TD, TS) \
    cp_copy_cols_kernel<TD, TS><<<g, 256, 0, cs>>>((TD *)dst, ldd, off, (const TS *)src, lds, offs, w, total)
    if (td == DT_BF16 && ts == DT_BF16) CP_COPY(bf16, bf16);
    else if (td == DT_BF16) CP_COPY(bf16, float);
    else if (ts == DT_BF16) CP_COPY(float, bf16);
    else CP_COPY(float, float);
#undef CP_COPY
    LAUNCH_CHECK(cp_copy_cols_kernel);
}

/* ---------------------------------------------------------------------------
 * The tables gpt.c calls through. Designated initializers, in the order of
 * struct Ops (C++ requires declaration order), so a field added to the
 * struct cannot silently shift every op after it. */

extern "C" const Ops cuda_ops = {
    .dtype = DT_F32,
    .name = "cuda fp32",
    .encoder_forward = encoder_forward<float>,
    .encoder_backward = encoder_backward<float>,
    .layernorm_forward = layernorm_forward<float>,
    .layernorm_backward = layernorm_backward<float>,
    .add_layernorm_forward = add_layernorm_forward<float>,
    .matmul_forward = matmul_forward_f32,
    .matmul_forward_gelu = matmul_forward_gelu_f32,
    .matmul_backward = matmul_backward_f32,
    .matmul_backward_gelu = matmul_backward_gelu_f32,
    .attention_forward = attention_forward_f32,
    .attention_backward = attention_backward_f32,
    .attention_floats = attention_floats_f32,
    .gelu_forward = gelu_forward<float>,
    .gelu_backward = gelu_backward<float>,
    .add = add<float>,
    .accumulate = accumulate,
    .cast = cast<float>,
    .widen = widen<float>,
    .crossentropy = crossentropy<float>,
    .xent_stats = xent_stats<float>,
    .xent_combine = xent_combine,
    .xent_grad = xent_grad<float>,
    .adamw = adamw,
    .adamw_segs = adamw_segs,
    .sumsq = sumsq,
    .sum = sum,
    .norm_add = norm_add,
    .norm_redo = norm_redo,
    .norm_pack = norm_pack,
};

extern "C" const Ops cuda_bf16_ops = {
    .dtype = DT_BF16,
    .name = "cuda bf16",
    .encoder_forward = encoder_forward<bf16>,
    .encoder_backward = encoder_backward<bf16>,
    .layernorm_forward = layernorm_forward<bf16>,
    .layernorm_backward = layernorm_backward<bf16>,
    .add_layernorm_forward = add_layernorm_forward<bf16>,
    .matmul_forward = matmul_forward_bf16,
    .matmul_forward_gelu = matmul_forward_gelu_bf16,
    .matmul_backward = matmul_backward_bf16,
    .matmul_backward_gelu = matmul_backward_gelu_bf16,
    .attention_forward = attention_forward_bf16,
    .attention_backward = attention_backward_bf16,
    .attention_floats = attention_floats_bf16,
    .gelu_forward = gelu_forward<bf16>,
    .gelu_backward = gelu_backward<bf16>,
    .add = add<bf16>,
    .accumulate = accumulate,
    .cast = cast<bf16>,
    .widen = widen<bf16>,
    .crossentropy = crossentropy<bf16>,
    .xent_stats = xent_stats<bf16>,
    .xent_combine = xent_combine,
    .xent_grad = xent_grad<bf16>,
    .adamw = adamw,
    .adamw_segs = adamw_segs,
    .sumsq = sumsq,
    .sum = sum,
    .norm_add = norm_add,
    .norm_redo = norm_redo,
    .norm_pack = norm_pack,
};
