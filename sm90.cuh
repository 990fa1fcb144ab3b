/* sm90.cuh: the Hopper (sm_90a) inline PTX that matmul.cu's wgmma GEMM and
 * attention_sm90.cu's FlashAttention-3 kernels share, written once: mbarriers,
 * TMA 2-D loads and stores (with their bulk groups and proxy fence),
 * setmaxnreg, named barriers, wgmma (fence, commit, wait and
 * the m64nNk16 bf16 -> f32 products, A from shared memory or registers),
 * the cluster's (multicast TMA, %cluster_ctarank and %clusterid, mapa,
 * remote mbarrier arrivals, barrier.cluster),
 * the accumulator register fence, and the two plain helpers around them
 * (a shared-memory address, a matrix descriptor), and on the host the
 * TMA tensor map both encode (sm90_encode_2d). The article's section is
 * the tensor-core path's (matmul.cu's and attention_sm90.cu's headers say
 * how the kernels use these).
 *
 * SM90_BUILD is 1 where the sm_90a device code is compiled: nvcc's sm_90a
 * device pass, or the CPU emulation (-DMM_EMU_SM90A, test/emu/emu.h), which
 * builds that code for the host. The inline PTX sits inside
 * `#ifdef __CUDACC__`: the emulation's host compiler never sees it, and
 * test/emu/emu.h defines every sm90_* function below of the same name and
 * signature on the emulated instructions (test/emu/emu_transform.cpp drops
 * asm-bodied functions from .cu files only, not from headers).
 *
 * Operands: `bar`, `dst` are shared-memory addresses (sm90_smem_u32); a
 * wgmma accumulator fragment is mma.sync's C fragment a warp: warp w of the
 * warpgroup rows 16w + lane/4 (+8), columns 8j + 2 (lane % 4) + {0, 1} in
 * d[4j .. 4j + 3]. */
#ifndef SM90_CUH
#define SM90_CUH

#include <stdint.h>

#if (defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)) || defined(MM_EMU_SM90A)
#define SM90_BUILD 1
#else
#define SM90_BUILD 0
#endif

/* The shared-state-space address of p (a pointer into shared memory); any arch. */
__device__ __forceinline__ uint32_t sm90_smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

#if SM90_BUILD
/* Matrix descriptor: start address, leading and stride byte offsets (each
 * encoded >> 4 in 14 bits), base offset 0 (every swizzle pattern starts on
 * a 1024-byte boundary), swizzle mode 1 = 128 bytes (bits 62-63). */
__device__ __forceinline__ uint64_t sm90_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((addr & 0x3FFFFu) >> 4) | ((uint64_t)((lbo & 0x3FFFFu) >> 4) << 16) |
           ((uint64_t)((sbo & 0x3FFFFu) >> 4) << 32) | (1ull << 62);
}
#endif

#if defined(__CUDACC__) && SM90_BUILD
#include <cudaTypedefs.h> /* CUtensorMap */

/* Initialises the mbarrier at bar to expect `count` arrivals a phase. */
__device__ __forceinline__ void sm90_mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(count) : "memory");
}
/* Makes the initialised mbarriers visible to the other threads (and to TMA). */
__device__ __forceinline__ void sm90_mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
/* Arrives at bar and adds `bytes` to the transaction count its phase waits for. */
__device__ __forceinline__ void sm90_mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
                 :: "r"(bar), "r"(bytes) : "memory");
}
/* Arrives at bar (one of its count). */
__device__ __forceinline__ void sm90_mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(bar) : "memory");
}
/* Waits until the phase of parity `parity` has completed. */
__device__ __forceinline__ void sm90_mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile("{\n"
                     ".reg .pred p;\n"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n"
                     "}\n"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}

/* One 2-D box of `map` at element coordinates (c0 inner, c1 outer) into
 * shared memory at dst, completing its bytes on the mbarrier bar. */
__device__ __forceinline__ void sm90_tma_2d(uint32_t dst, const CUtensorMap *map, int c0, int c1,
                                            uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%2, %3}], [%4];\n"
                 :: "r"(dst), "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(bar) : "memory");
}

/* TMA stores (matmul.cu's epilogue of the products that do not read the
 * old D). One 2-D box from shared memory at src (the map's box, laid out
 * as a load of it would land: 128-byte swizzled) to `map`'s tensor at
 * element coordinates (c0 inner, c1 outer); the parts of the box outside
 * the tensor are not written. Asynchronous: the issuing thread's bulk
 * group (sm90_bulk_commit) tracks it, and src may be written again only
 * after sm90_bulk_wait_read retires that group. The threads' generic-proxy
 * writes of src must be ordered before it by sm90_fence_proxy_async (each
 * writer) and a barrier. */
__device__ __forceinline__ void sm90_tma_store_2d(const CUtensorMap *map, int c0, int c1, uint32_t src) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n"
                 :: "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(src) : "memory");
}
/* Closes this thread's bulk copies issued since the last commit into one bulk group. */
__device__ __forceinline__ void sm90_bulk_commit() {
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
/* Waits until at most N of this thread's bulk groups still read their shared memory. */
template <int N> __device__ __forceinline__ void sm90_bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" :: "n"(N) : "memory");
}
/* Orders this thread's generic-proxy shared-memory writes before later async-proxy (TMA) reads. */
__device__ __forceinline__ void sm90_fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* Clusters (matmul.cu's TC_WGMMA_CLUSTER). The same box into the shared
 * memory at dst of every CTA of the cluster whose bit is set in cta_mask
 * (bit r: %cluster_ctarank r), completing its bytes on each one's mbarrier
 * at bar (dst and bar: this CTA's shared::cta addresses, the same offsets
 * in each destination). */
__device__ __forceinline__ void sm90_tma_2d_multicast(uint32_t dst, const CUtensorMap *map, int c0, int c1,
                                                      uint32_t bar, uint16_t cta_mask) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster "
                 "[%0], [%1, {%2, %3}], [%4], %5;\n"
                 :: "r"(dst), "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(bar), "h"(cta_mask) : "memory");
}
/* This CTA's rank in its cluster; the cluster's index along x and the
 * number of clusters along x. */
__device__ __forceinline__ uint32_t sm90_cluster_ctarank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
__device__ __forceinline__ uint32_t sm90_clusterid_x() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%clusterid.x;\n" : "=r"(r));
    return r;
}
__device__ __forceinline__ uint32_t sm90_nclusterid_x() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%nclusterid.x;\n" : "=r"(r));
    return r;
}
/* The shared::cluster address of shared::cta address addr in the CTA of rank `rank`. */
__device__ __forceinline__ uint32_t sm90_mapa(uint32_t addr, uint32_t rank) {
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
    return r;
}
/* Arrives (release, cluster scope) at the mbarrier at shared::cluster address addr (sm90_mapa's). */
__device__ __forceinline__ void sm90_mbar_arrive_cluster(uint32_t addr) {
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" :: "r"(addr) : "memory");
}
/* barrier.cluster: every thread of the cluster arrives (release), then
 * waits (acquire) for the others; all of a warp together (.aligned). */
__device__ __forceinline__ void sm90_cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n"
                 "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

/* Lowers (dec) or raises (inc) the warpgroup's per-thread register budget to R. */
template <int R> __device__ __forceinline__ void sm90_setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(R) : "memory");
}
template <int R> __device__ __forceinline__ void sm90_setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(R) : "memory");
}

/* Named barrier `id` (1..15; 0 is __syncthreads'), `count` threads in
 * whole warps: bar.sync counts this warp and waits until count threads have
 * arrived; bar.arrive counts it and goes on (a producer's signal). */
__device__ __forceinline__ void sm90_bar_sync(int id, int count) {
    asm volatile("bar.sync %0, %1;\n" :: "r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void sm90_bar_arrive(int id, int count) {
    asm volatile("bar.arrive %0, %1;\n" :: "r"(id), "r"(count) : "memory");
}

/* Orders the registers and shared memory before the next wgmma.mma_async. */
__device__ __forceinline__ void sm90_wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
/* Closes the warpgroup's open wgmma.mma_async into one group. */
__device__ __forceinline__ void sm90_wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
/* Waits until at most N of the warpgroup's groups are in flight. */
template <int N> __device__ __forceinline__ void sm90_wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory");
}
/* Tells the compiler the accumulators change here (after a wait), so no
 * read of them is hoisted above it. */
template <int N> __device__ __forceinline__ void sm90_fence_regs(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i]) :: "memory");
}

/* The pieces of the wgmma.mma_async statements below: SM90_D8(i), eight
 * accumulators d[H + i .. H + i + 7] as read-write operands; SM90_ACC32 /
 * 64 / 128, the PTX operand list %0 .. %31 / 63 / 127 that names them;
 * SM90_SCALE_D(n), the predicate p = (operand n != 0), wgmma's scale-d (1
 * here: d += A B). */
#define SM90_D8(i) "+f"(d[H + i]), "+f"(d[H + i + 1]), "+f"(d[H + i + 2]), "+f"(d[H + i + 3]), \
                   "+f"(d[H + i + 4]), "+f"(d[H + i + 5]), "+f"(d[H + i + 6]), "+f"(d[H + i + 7])
#define SM90_D32 SM90_D8(0), SM90_D8(8), SM90_D8(16), SM90_D8(24)
#define SM90_D64 SM90_D32, SM90_D8(32), SM90_D8(40), SM90_D8(48), SM90_D8(56)
#define SM90_ACC32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
                   "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define SM90_ACC64 SM90_ACC32 ", " \
                   "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
                   "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define SM90_ACC128 SM90_ACC64 ", " \
                    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
                    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
                    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
                    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define SM90_SCALE_D(n) "{\n.reg .pred p;\nsetp.ne.b32 p, %" #n ", 0;\n"

/* d (64 x 256 a warpgroup, d[0..127]) += A(64x16) B(16x256), both in
 * shared memory through descriptors; TA / TB: 1 when A is m-major / B is
 * n-major. */
template <int TA, int TB>
__device__ __forceinline__ void sm90_wgmma_m64n256(float (&d)[128], uint64_t da, uint64_t db) {
    constexpr int H = 0;
    asm volatile(SM90_SCALE_D(130) "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" SM90_ACC128
                 "}, %128, %129, p, 1, 1, %131, %132;\n}\n"
                 : SM90_D64, SM90_D8(64), SM90_D8(72), SM90_D8(80), SM90_D8(88), SM90_D8(96), SM90_D8(104),
                   SM90_D8(112), SM90_D8(120)
                 : "l"(da), "l"(db), "r"(1), "n"(TA), "n"(TB) : "memory");
}

/* d[H .. H + 63] (64 x 128 a warpgroup) += A(64x16) B(16x128), both in
 * shared memory; TA / TB as above. d holds L floats: L = 64 for one such
 * accumulator, 128 for two (H 0 and 64: the GEMM's ping-pong tile). */
template <int TA, int TB, int H, int L>
__device__ __forceinline__ void sm90_wgmma_m64n128(float (&d)[L], uint64_t da, uint64_t db) {
    static_assert(H % 64 == 0 && H + 64 <= L, "H picks 64 floats of d");
    asm volatile(SM90_SCALE_D(66) "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" SM90_ACC64
                 "}, %64, %65, p, 1, 1, %67, %68;\n}\n"
                 : SM90_D64 : "l"(da), "l"(db), "r"(1), "n"(TA), "n"(TB) : "memory");
}

/* d (64 x 64 a warpgroup) += A(64x16) B(16x64), both k-major in shared memory. */
__device__ __forceinline__ void sm90_wgmma_m64n64(float (&d)[32], uint64_t da, uint64_t db) {
    constexpr int H = 0;
    asm volatile(SM90_SCALE_D(34) "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" SM90_ACC32
                 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : SM90_D32 : "l"(da), "l"(db), "r"(1) : "memory");
}

/* d (64 x N) += A(64x16, REGISTERS: mma.sync's A fragment a warp, a0..a3 =
 * A[g][2t..], A[g+8][2t..], A[g][2t+8..], A[g+8][2t+8..]) B(16xN), B
 * mn-major in shared memory (trans-b 1); N 64 or 128. The registers must
 * not change until the wait_group that retires it. */
template <int N>
__device__ __forceinline__ void sm90_wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t db) {
    static_assert(N == 64 || N == 128, "register-A wgmma: n 64 or 128");
    constexpr int H = 0;
    if constexpr (N == 64)
        asm volatile(SM90_SCALE_D(37) "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" SM90_ACC32
                     "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                     : SM90_D32 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1) : "memory");
    else
        asm volatile(SM90_SCALE_D(69) "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" SM90_ACC64
                     "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                     : SM90_D64 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1) : "memory");
}

#endif /* __CUDACC__ && SM90_BUILD */

/* Host, any build: the TMA tensor map of a bf16 matrix, `inner` contiguous
 * elements a row (pitch inner * 2 bytes) and `outer` rows, boxes of
 * box_inner x box_outer, 128-byte swizzle, zero fill outside; false when
 * the driver has no cuTensorMapEncodeTiled (looked up through the runtime:
 * no libcuda link) or refuses the map. The includer has <cuda_runtime.h>
 * and <cudaTypedefs.h> (or test/emu/emu.h). */
static inline bool sm90_encode_2d(CUtensorMap *map, const void *ptr, int inner, int outer, int box_inner,
                                  int box_outer) {
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q;
#if CUDART_VERSION >= 12050
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                           cudaEnableDefault, &q);
#else /* 12.0-12.4: no ByVersion; this form gives the toolkit's version, 12000 here */
    const cudaError_t e = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &q);
#endif
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !fn) {
        cudaGetLastError();
        return false;
    }
    PFN_cuTensorMapEncodeTiled_v12000 encode = (PFN_cuTensorMapEncodeTiled_v12000)fn;
    const cuuint64_t dims[2] = {(cuuint64_t)inner, (cuuint64_t)outer};
    const cuuint64_t strides[1] = {(cuuint64_t)inner * 2};
    const cuuint32_t box[2] = {(cuuint32_t)box_inner, (cuuint32_t)box_outer};
    const cuuint32_t estr[2] = {1, 1};
    return encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)ptr, dims, strides, box, estr,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                  CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

#endif /* SM90_CUH */
