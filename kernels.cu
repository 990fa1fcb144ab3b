/* kernels.cu: the device side of the ops table, float32 CUDA kernels.
 *
 * This is the one-rank training foundation of the articles on a GPU: every op
 * of tensor.h's Ops table (embedding, LayerNorm, linear layers, causal
 * attention, GELU, the residual, fused softmax + cross-entropy and its
 * vocabulary-parallel form, AdamW and the reductions of the gradient norm),
 * with exactly the contracts of the plain-C reference in ops.c, which
 * test/test_kernels.c checks them against. It also holds the cuda_*
 * functions tensor.c uses for device memory and streams.
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
 * Sums over rows that many blocks share (dw, db of LayerNorm, dbias, dwte)
 * use atomicAdd: their float order varies from run to run, by about 1e-7.
 */
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <cuda_runtime.h>

extern "C" {
#include "tensor.h"
}

/* ---------------------------------------------------------------------------
 * Error checking: every runtime call and every launch goes through
 * CUDA_CHECK, which names the call, the file and the line, then exits. */

static void cuda_check(cudaError_t err, const char *call, const char *file, int line) {
    if (err == cudaSuccess) return;
    fprintf(stderr, "CUDA error: %s at %s:%d: %s\n", call, file, line, cudaGetErrorString(err));
    exit(1);
}
#define CUDA_CHECK(call) cuda_check((call), #call, __FILE__, __LINE__)
/* A launch reports a bad configuration through cudaGetLastError. */
#define LAUNCH_CHECK(kernel) cuda_check(cudaGetLastError(), #kernel "<<<>>>", __FILE__, __LINE__)

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
     * on the CPU of a machine without a GPU. Clear the sticky error. */
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
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

extern "C" void cuda_copy_d2d(void *dst, const void *src, size_t bytes, void *stream) {
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)stream));
}

extern "C" void cuda_sync(void *stream) {
    CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)stream));
}

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
 * Embedding: token row plus position row. */

// out [B,T,C], tokens [B,T], wte [Vp,C], wpe [maxT,C]; one thread per output.
// A token < 0 (outside this rank's slice of the vocabulary) adds no wte row;
// wpe NULL adds no position row. Either missing term is a 0, as in ops.c.
__global__ void encoder_forward_kernel(float *out, const int *tokens, const float *wte,
                                       const float *wpe, int T, int C, size_t total) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t bt = i / C;
        int c = (int)(i % C), t = (int)(bt % T);
        int tok = tokens[bt];
        float te = tok >= 0 ? wte[(size_t)tok * C + c] : 0.0f;
        float pe = wpe ? wpe[(size_t)t * C + c] : 0.0f;
        out[i] = te + pe;
    }
}

// dwte [Vp,C] += dout [B,T,C] rows by token (tokens < 0 have no row and are
// skipped). Positions may share a token, so atomics.
__global__ void encoder_backward_wte_kernel(float *dwte, const float *dout, const int *tokens,
                                            int C, size_t total) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        int tok = tokens[i / C];
        if (tok >= 0) atomicAdd(&dwte[(size_t)tok * C + i % C], dout[i]);
    }
}

// dwpe [T,C] += sum over b of dout [B,T,C]: one thread owns each dwpe element.
__global__ void encoder_backward_wpe_kernel(float *dwpe, const float *dout, int B, int T, int C) {
    size_t TC = (size_t)T * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < TC;
         i += (size_t)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int b = 0; b < B; b++) s += dout[b * TC + i];
        dwpe[i] += s;
    }
}

static void encoder_forward(Dev *d, float *out, const int *tokens, const float *wte,
                            const float *wpe, int B, int T, int C) {
    size_t total = (size_t)B * T * C;
    if (!total) return;
    encoder_forward_kernel<<<elementwise_grid(total, 256), 256, 0, STREAM(d)>>>(out, tokens, wte, wpe, T, C, total);
    LAUNCH_CHECK(encoder_forward_kernel);
}

static void encoder_backward(Dev *d, float *dwte, float *dwpe, const float *dout,
                             const int *tokens, int B, int T, int C) {
    size_t total = (size_t)B * T * C;
    if (!total) return;
    encoder_backward_wte_kernel<<<elementwise_grid(total, 256), 256, 0, STREAM(d)>>>(dwte, dout, tokens, C, total);
    LAUNCH_CHECK(encoder_backward_wte_kernel);
    if (!dwpe) return;  // no position embedding on this rank
    encoder_backward_wpe_kernel<<<elementwise_grid((size_t)T * C, 256), 256, 0, STREAM(d)>>>(dwpe, dout, B, T, C);
    LAUNCH_CHECK(encoder_backward_wpe_kernel);
}

/* ---------------------------------------------------------------------------
 * LayerNorm, one warp per row: eps 1e-5, biased variance, two passes over
 * the row (mean first, then the squared deviations) as ops.c does. */

#define ROWS_PER_BLOCK 8  /* warps per block in the warp-per-row kernels */

// out [N,C], mean [N], rstd [N], inp [N,C], w [C], b [C]
__global__ void layernorm_forward_kernel(float *out, float *mean, float *rstd, const float *inp,
                                         const float *w, const float *b, int N, int C) {
    int lane = threadIdx.x % 32;
    int n = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
    if (n >= N) return;
    const float *x = inp + (size_t)n * C;
    float *o = out + (size_t)n * C;
    float s = 0.0f;
    for (int c = lane; c < C; c += 32) s += x[c];
    float m = warp_sum(s) / C;
    float v = 0.0f;
    for (int c = lane; c < C; c += 32) { float dx = x[c] - m; v += dx * dx; }
    float r = rsqrtf(warp_sum(v) / C + 1e-5f);
    for (int c = lane; c < C; c += 32) o[c] = (x[c] - m) * r * w[c] + b[c];
    if (lane == 0) { mean[n] = m; rstd[n] = r; }
}

// dinp [N,C] += d/dinp, one warp per row (rows are independent).
__global__ void layernorm_backward_dinp_kernel(float *dinp, const float *dout, const float *inp,
                                               const float *w, const float *mean,
                                               const float *rstd, int N, int C) {
    int lane = threadIdx.x % 32;
    int n = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
    if (n >= N) return;
    const float *g = dout + (size_t)n * C, *x = inp + (size_t)n * C;
    float *dx = dinp + (size_t)n * C;
    float m = mean[n], r = rstd[n];
    // The mean of dnorm and of dnorm * norm, then each element's share.
    float gsum = 0.0f, gnsum = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float dnorm = g[c] * w[c];
        gsum += dnorm;
        gnsum += dnorm * (x[c] - m) * r;
    }
    float gmean = warp_sum(gsum) / C, gnmean = warp_sum(gnsum) / C;
    for (int c = lane; c < C; c += 32) {
        float norm = (x[c] - m) * r;
        dx[c] += (g[c] * w[c] - gmean - norm * gnmean) * r;
    }
}

/* Column sums over rows, shared by LayerNorm's dw, db and the matmul's dbias:
 * a block of 32 x 8 threads takes 32 columns (a warp reads 128 contiguous
 * bytes of a row) and a chunk of COLSUM_ROWS rows, sums them in registers and
 * shared memory, and adds its partial to the output with one atomic. */
#define COLSUM_ROWS 256

// dw [C] += sum_n dout * norm, db [C] += sum_n dout; dout, inp [N,C]
__global__ void layernorm_backward_params_kernel(float *dw, float *db, const float *dout,
                                                 const float *inp, const float *mean,
                                                 const float *rstd, int N, int C) {
    __shared__ float part_w[8][33], part_b[8][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    float sw = 0.0f, sb = 0.0f;
    if (c < C) {
        for (int r0 = blockIdx.y * COLSUM_ROWS; r0 < N; r0 += gridDim.y * COLSUM_ROWS) {
            int r1 = min(N, r0 + COLSUM_ROWS);
            for (int n = r0 + threadIdx.y; n < r1; n += 8) {
                size_t i = (size_t)n * C + c;
                sw += dout[i] * (inp[i] - mean[n]) * rstd[n];
                sb += dout[i];
            }
        }
    }
    part_w[threadIdx.y][threadIdx.x] = sw;
    part_b[threadIdx.y][threadIdx.x] = sb;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        for (int y = 1; y < 8; y++) { sw += part_w[y][threadIdx.x]; sb += part_b[y][threadIdx.x]; }
        atomicAdd(&dw[c], sw);
        atomicAdd(&db[c], sb);
    }
}

// out [C] += sum_n x [N,C]
__global__ void column_sum_kernel(float *out, const float *x, int N, int C) {
    __shared__ float part[8][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    float s = 0.0f;
    if (c < C) {
        for (int r0 = blockIdx.y * COLSUM_ROWS; r0 < N; r0 += gridDim.y * COLSUM_ROWS) {
            int r1 = min(N, r0 + COLSUM_ROWS);
            for (int n = r0 + threadIdx.y; n < r1; n += 8) s += x[(size_t)n * C + c];
        }
    }
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        for (int y = 1; y < 8; y++) s += part[y][threadIdx.x];
        atomicAdd(&out[c], s);
    }
}

static dim3 column_sum_grid(int N, int C) {
    size_t chunks = ceil_div((size_t)N, COLSUM_ROWS);
    return dim3((unsigned)ceil_div((size_t)C, 32), (unsigned)(chunks < 65535 ? chunks : 65535));
}

static void layernorm_forward(Dev *d, float *out, float *mean, float *rstd, const float *inp,
                              const float *w, const float *b, int N, int C) {
    if (N <= 0 || C <= 0) return;
    unsigned grid = (unsigned)ceil_div((size_t)N, ROWS_PER_BLOCK);
    layernorm_forward_kernel<<<grid, ROWS_PER_BLOCK * 32, 0, STREAM(d)>>>(out, mean, rstd, inp, w, b, N, C);
    LAUNCH_CHECK(layernorm_forward_kernel);
}

static void layernorm_backward(Dev *d, float *dinp, float *dw, float *db, const float *dout,
                               const float *inp, const float *w, const float *mean,
                               const float *rstd, int N, int C) {
    if (N <= 0 || C <= 0) return;
    unsigned grid = (unsigned)ceil_div((size_t)N, ROWS_PER_BLOCK);
    layernorm_backward_dinp_kernel<<<grid, ROWS_PER_BLOCK * 32, 0, STREAM(d)>>>(dinp, dout, inp, w, mean, rstd, N, C);
    LAUNCH_CHECK(layernorm_backward_dinp_kernel);
    layernorm_backward_params_kernel<<<column_sum_grid(N, C), dim3(32, 8), 0, STREAM(d)>>>(dw, db, dout, inp, mean, rstd, N, C);
    LAUNCH_CHECK(layernorm_backward_params_kernel);
}

/* ---------------------------------------------------------------------------
 * Matmul: one tiled kernel for the three products of a linear layer.
 *
 *   forward  out [N,OC]  = inp [N,C]   @ w^T  ([C,OC], w read along C)
 *   backward dinp [N,C] += dout [N,OC] @ w    ([OC,C])
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

static void matmul_forward(Dev *d, float *out, const float *inp, const float *w, const float *bias,
                           int N, int C, int OC) {
    // out[n,o] = sum_c inp[n,c] w[o,c]: A = inp (k = c contiguous), B[c,o] = w[o*C + c].
    matmul_tiled<true, true>(d, out, inp, w, bias, N, OC, C, C, C, OC, 0);
}

static void matmul_backward(Dev *d, float *dinp, float *dw, float *dbias, const float *dout,
                            const float *inp, const float *w, int N, int C, int OC) {
    // dinp[n,c] += sum_o dout[n,o] w[o,c]: A = dout (k = o contiguous), B[o,c] = w[o*C + c].
    if (dinp) matmul_tiled<true, false>(d, dinp, dout, w, NULL, N, C, OC, OC, C, C, 1);
    // dw[o,c] += sum_n dout[n,o] inp[n,c]: A[o,n] = dout[n*OC + o], B[n,c] = inp[n*C + c].
    matmul_tiled<false, false>(d, dw, dout, inp, NULL, OC, C, N, OC, C, C, 1);
    if (dbias && N > 0 && OC > 0) {
        column_sum_kernel<<<column_sum_grid(N, OC), dim3(32, 8), 0, STREAM(d)>>>(dbias, dout, N, OC);
        LAUNCH_CHECK(column_sum_kernel);
    }
}

/* ---------------------------------------------------------------------------
 * Causal self-attention, written plainly: scores and softmax one warp per
 * query row, then att @ v one thread per output element. The backward
 * mirrors it: one warp per row for datt and the softmax's backward, then one
 * thread per channel of a position for dq, dk and dv together (each thread
 * owns its three outputs, so there are no races and no atomics).
 *
 * qkv [B,T,3C]: q, k, v of position t at channel offsets 0, C, 2C; head h
 * uses channels h*hs .. (h+1)*hs. att, datt [B,NH,T,T], row (b,h,t). */

// att [B,NH,T,T] = causal softmax(q.k * scale); zeros above the diagonal.
// Dynamic shared memory: ROWS_PER_BLOCK * hs floats (each warp's query).
__global__ void attention_softmax_kernel(float *att, const float *qkv, int B, int T, int C, int NH,
                                         float scale) {
    extern __shared__ float q_shared[];
    int hs = C / NH, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    size_t row = (size_t)blockIdx.x * ROWS_PER_BLOCK + warp;  // (b*NH + h)*T + t
    if (row >= (size_t)B * NH * T) return;
    int t = (int)(row % T), h = (int)(row / T % NH);
    size_t b = row / ((size_t)T * NH);
    const float *qkv_b = qkv + b * T * 3 * C;
    float *q = q_shared + warp * hs;
    for (int i = lane; i < hs; i += 32) q[i] = qkv_b[(size_t)t * 3 * C + h * hs + i];
    __syncwarp();
    float *a = att + row * T;  // [T]

    // Lane l takes keys l, l+32, ...; it reads back only what it wrote.
    float maxv = -INFINITY;
    for (int t2 = lane; t2 <= t; t2 += 32) {
        const float *k = qkv_b + (size_t)t2 * 3 * C + C + h * hs;
        float s = 0.0f;
        for (int i = 0; i < hs; i++) s += q[i] * k[i];
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
    for (int t2 = lane; t2 < T; t2 += 32) a[t2] = t2 <= t ? a[t2] * inv : 0.0f;
}

// out [B,T,C]: out[b,t,c] = sum_{t2<=t} att[b,h,t,t2] v[b,t2,c], h = c / hs.
// Threads of one position read the same att row (a broadcast) and
// consecutive channels of v (coalesced).
__global__ void attention_value_kernel(float *out, const float *att, const float *qkv, int T, int C,
                                       int NH, size_t total) {
    int hs = C / NH;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        int c = (int)(i % C);
        size_t bt = i / C;
        int t = (int)(bt % T);
        size_t b = bt / T;
        const float *a = att + ((b * NH + c / hs) * T + t) * T;
        const float *v = qkv + b * T * 3 * C + 2 * C + c;
        float s = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) s += a[t2] * v[(size_t)t2 * 3 * C];
        out[i] = s;
    }
}

// datt [B,NH,T,T] = dpre, the gradient of the scaled scores, for t2 <= t
// (entries above the diagonal are left as they were: nothing reads them).
// datt = dout . v, then the softmax's backward dpre = att (datt - sum(att datt)),
// times scale. Dynamic shared memory: ROWS_PER_BLOCK * hs floats (dout rows).
__global__ void attention_softmax_backward_kernel(float *datt, const float *dout,
                                                  const float *qkv, const float *att, int B,
                                                  int T, int C, int NH, float scale) {
    extern __shared__ float g_shared[];
    int hs = C / NH, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    size_t row = (size_t)blockIdx.x * ROWS_PER_BLOCK + warp;
    if (row >= (size_t)B * NH * T) return;
    int t = (int)(row % T), h = (int)(row / T % NH);
    size_t b = row / ((size_t)T * NH);
    const float *qkv_b = qkv + b * T * 3 * C;
    float *g = g_shared + warp * hs;
    for (int i = lane; i < hs; i += 32) g[i] = dout[(b * T + t) * C + h * hs + i];
    __syncwarp();
    const float *a = att + row * T;
    float *da = datt + row * T;

    float dot = 0.0f;
    for (int t2 = lane; t2 <= t; t2 += 32) {
        const float *v = qkv_b + (size_t)t2 * 3 * C + 2 * C + h * hs;
        float s = 0.0f;
        for (int i = 0; i < hs; i++) s += v[i] * g[i];
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
__global__ void attention_qkv_backward_kernel(float *dqkv, const float *datt, const float *dout,
                                              const float *qkv, const float *att, int T, int C,
                                              int NH, size_t total) {
    int hs = C / NH;
    size_t C3 = (size_t)3 * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        int c = (int)(i % C);
        size_t bt = i / C;
        int t = (int)(bt % T);
        size_t b = bt / T;
        size_t head = (b * NH + c / hs) * T;  // row index of (b, h, 0)
        const float *qkv_b = qkv + b * T * C3;
        const float *dpre_row = datt + (head + t) * T;  // [T], row t
        float dq = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) dq += dpre_row[t2] * qkv_b[(size_t)t2 * C3 + C + c];
        float dk = 0.0f, dv = 0.0f;
        for (int t3 = t; t3 < T; t3++) {  // column t of rows t3 >= t
            size_t at = (head + t3) * T + t;
            dk += datt[at] * qkv_b[(size_t)t3 * C3 + c];
            dv += att[at] * dout[(b * T + t3) * C + c];
        }
        float *dst = dqkv + (b * T + t) * C3 + c;
        dst[0] += dq;
        dst[C] += dk;
        dst[2 * (size_t)C] += dv;
    }
}

static void attention_forward(Dev *d, float *out, float *att, const float *qkv, int B, int T,
                              int C, int NH) {
    size_t rows = (size_t)B * NH * T;
    if (!rows || C <= 0) return;
    int hs = C / NH;
    float scale = (float)(1.0 / sqrt((double)hs));
    size_t shmem = (size_t)ROWS_PER_BLOCK * hs * sizeof(float);
    attention_softmax_kernel<<<(unsigned)ceil_div(rows, ROWS_PER_BLOCK), ROWS_PER_BLOCK * 32, shmem, STREAM(d)>>>(
        att, qkv, B, T, C, NH, scale);
    LAUNCH_CHECK(attention_softmax_kernel);
    size_t total = (size_t)B * T * C;
    attention_value_kernel<<<elementwise_grid(total, 256), 256, 0, STREAM(d)>>>(out, att, qkv, T, C, NH, total);
    LAUNCH_CHECK(attention_value_kernel);
}

static void attention_backward(Dev *d, float *dqkv, float *datt, const float *dout,
                               const float *qkv, const float *att, int B, int T, int C, int NH) {
    size_t rows = (size_t)B * NH * T;
    if (!rows || C <= 0) return;
    int hs = C / NH;
    float scale = (float)(1.0 / sqrt((double)hs));
    size_t shmem = (size_t)ROWS_PER_BLOCK * hs * sizeof(float);
    attention_softmax_backward_kernel<<<(unsigned)ceil_div(rows, ROWS_PER_BLOCK), ROWS_PER_BLOCK * 32, shmem, STREAM(d)>>>(
        datt, dout, qkv, att, B, T, C, NH, scale);
    LAUNCH_CHECK(attention_softmax_backward_kernel);
    size_t total = (size_t)B * T * C;
    attention_qkv_backward_kernel<<<elementwise_grid(total, 256), 256, 0, STREAM(d)>>>(
        dqkv, datt, dout, qkv, att, T, C, NH, total);
    LAUNCH_CHECK(attention_qkv_backward_kernel);
}

/* ---------------------------------------------------------------------------
 * GELU (tanh approximation), the residual and its backward: elementwise. */

#define GELU_S 0.7978845608028654f  /* sqrt(2/pi) */

__global__ void gelu_forward_kernel(float *out, const float *inp, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + tanhf(GELU_S * (x + 0.044715f * x * x * x)));
    }
}

__global__ void gelu_backward_kernel(float *dinp, const float *inp, const float *dout, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float x = inp[i];
        float th = tanhf(GELU_S * (x + 0.044715f * x * x * x));
        float sech2 = 1.0f - th * th;  // tanh' without cosh, which overflows
        float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_S * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] += grad * dout[i];
    }
}

__global__ void add_kernel(float *out, const float *a, const float *b, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = a[i] + b[i];
}

__global__ void accumulate_kernel(float *dst, const float *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] += src[i];
}

static void gelu_forward(Dev *d, float *out, const float *inp, size_t n) {
    if (!n) return;
    gelu_forward_kernel<<<elementwise_grid(n, 256), 256, 0, STREAM(d)>>>(out, inp, n);
    LAUNCH_CHECK(gelu_forward_kernel);
}

static void gelu_backward(Dev *d, float *dinp, const float *inp, const float *dout, size_t n) {
    if (!n) return;
    gelu_backward_kernel<<<elementwise_grid(n, 256), 256, 0, STREAM(d)>>>(dinp, inp, dout, n);
    LAUNCH_CHECK(gelu_backward_kernel);
}

static void add(Dev *d, float *out, const float *a, const float *b, size_t n) {
    if (!n) return;
    add_kernel<<<elementwise_grid(n, 256), 256, 0, STREAM(d)>>>(out, a, b, n);
    LAUNCH_CHECK(add_kernel);
}

static void accumulate(Dev *d, float *dst, const float *src, size_t n) {
    if (!n) return;
    accumulate_kernel<<<elementwise_grid(n, 256), 256, 0, STREAM(d)>>>(dst, src, n);
    LAUNCH_CHECK(accumulate_kernel);
}

/* ---------------------------------------------------------------------------
 * Softmax + cross-entropy, fused, one block per row: the max and the sum of
 * exponentials over the V real columns (block reductions), the loss, and,
 * when a gradient is asked for, the row overwritten with it in a third pass.
 * Padded columns [V,Vp) are not classes: they get gradient 0. */

#define CE_THREADS 512

// losses [N], logits [N,Vp] (overwritten with its gradient if dloss != 0), targets [N]
__global__ void crossentropy_kernel(float *losses, float *logits, const int *targets, int V,
                                    int Vp, float dloss) {
    __shared__ float shared_f[32];
    int n = blockIdx.x;
    float *z = logits + (size_t)n * Vp;
    int y = targets[n];
    float zy = z[y];  // read before any thread overwrites the row

    float maxv = -INFINITY;
    for (int v = threadIdx.x; v < V; v += blockDim.x) maxv = fmaxf(maxv, z[v]);
    maxv = block_max(maxv, shared_f);
    float sum = 0.0f;
    for (int v = threadIdx.x; v < V; v += blockDim.x) sum += expf(z[v] - maxv);
    sum = block_sum(sum, shared_f);
    float logsum = logf(sum) + maxv;
    if (threadIdx.x == 0) losses[n] = logsum - zy;
    if (dloss != 0.0f) {
        // Each element is read and written by the same thread: no barrier needed.
        for (int v = threadIdx.x; v < Vp; v += blockDim.x)
            z[v] = v < V ? dloss * (expf(z[v] - logsum) - (v == y ? 1.0f : 0.0f)) : 0.0f;
    }
}

static void crossentropy(Dev *d, float *losses, float *logits, const int *targets, int N, int V,
                         int Vp, float dloss) {
    if (N <= 0) return;
    crossentropy_kernel<<<N, CE_THREADS, 0, STREAM(d)>>>(losses, logits, targets, V, Vp, dloss);
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
__global__ void xent_stats_kernel(float *stats, const float *logits, const int *targets, int v0,
                                  int nvalid, int Vl) {
    __shared__ float shared_f[32];
    int n = blockIdx.x;
    const float *z = logits + (size_t)n * Vl;

    float maxv = -INFINITY;
    for (int v = threadIdx.x; v < nvalid; v += blockDim.x) maxv = fmaxf(maxv, z[v]);
    maxv = block_max(maxv, shared_f);
    float sum = 0.0f;
    for (int v = threadIdx.x; v < nvalid; v += blockDim.x) sum += expf(z[v] - maxv);
    sum = block_sum(sum, shared_f);
    if (threadIdx.x == 0) {
        int y = targets[n] - v0;  // the target's column in this slice, if it is here
        float *s = stats + (size_t)n * 3;
        s[0] = nvalid > 0 ? maxv : 0.0f;  // no valid column: max 0, sum 0
        s[1] = sum;
        s[2] = y >= 0 && y < nvalid ? z[y] : 0.0f;
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
__global__ void xent_grad_kernel(float *logits, const float *lse, const int *targets, int v0,
                                 int nvalid, int Vl, float dloss) {
    int n = blockIdx.x;
    float *z = logits + (size_t)n * Vl;
    float l = lse[n];
    int y = targets[n] - v0;
    for (int v = threadIdx.x; v < Vl; v += blockDim.x)
        z[v] = v < nvalid ? dloss * (expf(z[v] - l) - (v == y ? 1.0f : 0.0f)) : 0.0f;
}

static void xent_stats(Dev *d, float *stats, const float *logits, const int *targets, int N,
                       int v0, int nvalid, int Vl) {
    if (N <= 0) return;  // nvalid <= 0 still launches: every row gets max 0, sum 0
    xent_stats_kernel<<<N, row_threads(nvalid), 0, STREAM(d)>>>(stats, logits, targets, v0, nvalid, Vl);
    LAUNCH_CHECK(xent_stats_kernel);
}

static void xent_combine(Dev *d, float *losses, float *lse, const float *gathered, int N, int R) {
    if (N <= 0) return;
    xent_combine_kernel<<<elementwise_grid((size_t)N, 256), 256, 0, STREAM(d)>>>(losses, lse, gathered, N, R);
    LAUNCH_CHECK(xent_combine_kernel);
}

static void xent_grad(Dev *d, float *logits, const float *lse, const int *targets, int N, int v0,
                      int nvalid, int Vl, float dloss) {
    if (N <= 0 || Vl <= 0) return;
    xent_grad_kernel<<<N, row_threads(Vl), 0, STREAM(d)>>>(logits, lse, targets, v0, nvalid, Vl, dloss);
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

/* ---------------------------------------------------------------------------
 * Sum and sum of squares in double: each block writes its partial sum to
 * the Dev's scratch, the host adds the partials in block order. */

#define SUM_THREADS 256
#define SUM_BLOCKS 1024  /* 8 KiB of partials, well inside DEV_SCRATCH_BYTES */

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

static double reduce_to_host(Dev *d, const float *x, size_t n, int squares) {
    if (!n) return 0.0;
    unsigned blocks = (unsigned)ceil_div(n, SUM_THREADS);
    if (blocks > SUM_BLOCKS) blocks = SUM_BLOCKS;
    double *partials = (double *)d->scratch;
    sum_partials_kernel<<<blocks, SUM_THREADS, 0, STREAM(d)>>>(partials, x, n, squares);
    LAUNCH_CHECK(sum_partials_kernel);
    double host[SUM_BLOCKS];
    cuda_copy_d2h(host, partials, blocks * sizeof(double), d->stream);  // waits for the stream
    double s = 0.0;
    for (unsigned i = 0; i < blocks; i++) s += host[i];
    return s;
}

static double sumsq(Dev *d, const float *x, size_t n) { return reduce_to_host(d, x, n, 1); }
static double sum(Dev *d, const float *x, size_t n) { return reduce_to_host(d, x, n, 0); }

/* ---------------------------------------------------------------------------
 * The table gpt.c calls through. Designated initializers, in the order of
 * struct Ops (C++ requires declaration order), so a field added to the
 * struct cannot silently shift every op after it. */

extern "C" const Ops cuda_ops = {
    .encoder_forward = encoder_forward,
    .encoder_backward = encoder_backward,
    .layernorm_forward = layernorm_forward,
    .layernorm_backward = layernorm_backward,
    .matmul_forward = matmul_forward,
    .matmul_backward = matmul_backward,
    .attention_forward = attention_forward,
    .attention_backward = attention_backward,
    .gelu_forward = gelu_forward,
    .gelu_backward = gelu_backward,
    .add = add,
    .accumulate = accumulate,
    .crossentropy = crossentropy,
    .xent_stats = xent_stats,
    .xent_combine = xent_combine,
    .xent_grad = xent_grad,
    .adamw = adamw,
    .sumsq = sumsq,
    .sum = sum,
};
