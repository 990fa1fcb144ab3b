/* test/emu/emu.h: a CPU emulation of the CUDA and PTX features that
 * attention.cu, matmul.cu (TC_MMA on sm_80, TC_WGMMA on sm_90a) and
 * kernels.cu use, so that their
 * real kernel source (rewritten at build time by emu_transform.cpp, never
 * copied by hand) runs on a machine without a GPU and is checked by
 * test/test_flash.c and test/test_gemm.c against their float64 host
 * references, and by test/test_kernels.c (both of kernels.cu's tables, the
 * bf16 one reaching attention.cu and matmul.cu through tc.h) against ops.c
 * and ops_bf16.c. The whole training program runs over it too:
 * test/train_emu is main.c and every object built with USE_CUDA (never
 * USE_NCCL), these transformed .cu files and emu_rt.cpp in place of the CUDA
 * runtime, so --device cuda trains on the emulated GPU (named "CPU emulation
 * of sm_80 ... (device d)", so no MFU is printed). test_model_emu checks it against the
 * PyTorch fixture (fp32 and bf16) and test_3d_emu runs test_3d's CUDA
 * layouts against the CPU's one rank: forked ranks each have their own
 * emulated runtime (plain process memory) and share the one emulated GPU
 * over the shared-memory backend, which stages device buffers through
 * tensor.c's Dev, as ranks sharing a real GPU do.
 *
 * What is emulated, and how.
 *  - Threads. A launch runs its blocks one after another on the calling OS
 *    thread. The threads of a block are fibers (cooperative coroutines, one
 *    stack each, switched by a few lines of assembly in emu_rt.cpp, for
 *    x86-64 and AArch64 only); a fiber runs until it waits at a
 *    barrier or a warp collective, or returns.
 *  - Schedule. "Warp-greedy": when a fiber waits, the next runnable lane of
 *    its own warp runs; only when the whole warp waits at __syncthreads (or
 *    has returned) does another warp run, the first runnable one in the
 *    order EMU_ORDER picks (up: warp 0 first, down: the last warp first).
 *    So one warp runs as far ahead of the others as the barriers allow,
 *    which is what exposes a missing __syncthreads around a shared buffer
 *    (with cp.async landing late, below). Deterministic: the same inputs
 *    give the same interleaving and the same bits every run.
 *  - __syncthreads: every thread of the block must arrive; __syncwarp,
 *    __shfl_xor_sync (of any 4- or 8-byte type: float, double, int...;
 *    the bits move whole), ldmatrix and mma.sync are warp collectives: all 32
 *    lanes must arrive at the same kind of collective (a divergent warp, a
 *    partial mask or a lane that returned is reported as an error, since
 *    the .sync.aligned instructions require all of them). The last lane to
 *    arrive computes the collective for the whole warp from every lane's
 *    operands; the others read their results when they resume.
 *  - mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: the fragment
 *    layouts of the PTX ISA ("Matrix Fragments for mma.m16n8k16 with
 *    floating point type"): lane l, g = l >> 2, t = l & 3; a0 = A[g][2t..],
 *    a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]; b0 =
 *    B[2t..][g], b1 = B[2t+8..][g]; c0,c1 = C[g][2t..], c2,c3 = C[g+8][2t..];
 *    the lower column (row for B) in the low 16 bits. D = C + sum over k in
 *    order, in fp32 (bf16 products are exact in fp32; the hardware's own
 *    order and internal precision are not specified, so results may differ
 *    from a GPU's in the last fp32 bits).
 *  - ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16: lanes 8i..8i+7 give
 *    the 16-byte row addresses of matrix i; lane l receives matrix i's
 *    [l>>2][2(l&3)..+1] in register i, or [2(l&3)..+1][l>>2] with .trans.
 *    Every row address must be 16-byte aligned and inside the block's
 *    dynamic shared memory.
 *  - cp.async.{ca,cg}.shared.global (4 or 16 bytes, src-size 0..n, the rest
 *    zero-filled and src not read when src-size is 0), commit_group,
 *    wait_group N: per thread, groups in commit order. EMU_CP picks when a
 *    copy lands: "early", when it is issued; "late", when its issuing thread
 *    waits for its group (destination bytes are overwritten with 0xFF, a NaN
 *    in bf16 and fp32, at issue, so a thread that reads a tile before the
 *    copies landed, or a prefetch that overwrites a tile another warp still
 *    reads, gives NaN). Destinations must be aligned to the copy size and
 *    inside dynamic shared memory; sources aligned to it.
 *  - Shared memory. Dynamic shared memory (extern __shared__) is a buffer of
 *    the launch's size per block, filled with 0xFF (NaN) before the block
 *    starts, with a guard area after it checked when the block ends; the
 *    launch needs cudaFuncSetAttribute for more than 48 KiB (as a GPU does)
 *    and refuses more than 227 KiB. __cvta_generic_to_shared gives offsets in
 *    it. Static __shared__ variables become function-static thread_local
 *    objects (zero at first, not garbage; outside the ldmatrix/cp.async
 *    window).
 *  - atomicAdd(float, double), atomicMax(int): plain arithmetic (blocks run
 *    one at a time).
 *  - Launches: K<<<grid, block, smem, stream>>>(args) converts the
 *    arguments to K's parameter types, as a launch does; a kernel template
 *    whose template arguments the launch deduces from the arguments
 *    (kernels.cu's map_kernel) is resolved against the arguments' own types.
 *    The launch is an op queued on its stream (it owns the converted
 *    arguments) and runs when the stream reaches it.
 *  - Streams (emu_rt.cpp, emu_stream.h) are asynchronous: queues of ops
 *    (launches, cudaMemsetAsync, cudaMemcpyAsync, cudaMemcpy2DAsync,
 *    cudaMemcpyFromSymbolAsync, event records and waits, and the emulated
 *    NCCL's collectives), each run in order, never before the events it
 *    waits for, all on the calling thread (deterministic). EMU_STREAMS
 *    picks when they run: eager (the default: as soon as a stream reaches
 *    an op, so a program with one stream behaves as if synchronous),
 *    first-late (the first stream the process creates, cuda_open's compute
 *    stream, runs only when waited for: a host synchronization, an event
 *    query or synchronization, another stream's wait on its event; the
 *    others eager) or rest-late (the first eager, the others late). A
 *    query steps a stream by one op, so a late stream answers "not ready"
 *    until polled enough or synchronized. Late, a D2H copy into pinned
 *    memory fills its destination with 0xFF (NaN) at issue, and a queued
 *    H2D copy from pinned memory stops the program if the host wrote its
 *    source before it ran. Copies with pageable host memory complete before
 *    they return, cudaFree and cudaFreeHost synchronize every stream, and
 *    the legacy stream 0 runs each op at once (without draining the others,
 *    unlike a GPU's). EMU_GPUS=n reports n devices (cudaSetDevice per
 *    thread; allocations remember theirs); ranks are processes and never
 *    share emulated memory.
 *  - The race detector (EMU_RACECHECK=0 turns it off): vector clocks per
 *    stream, per event record and for the host (an op inherits what the
 *    host had synchronized with when it was queued), and per device or
 *    pinned allocation a bounded list of recent accesses. Before an op
 *    starts, each of its accesses is checked against other streams'
 *    accesses to the same bytes: a write on either side that no event (nor
 *    host synchronization) orders stops the program, naming both ops, both
 *    streams, the allocation and the offset. A copy, memset or NCCL op
 *    names its exact ranges; a kernel's accesses are its pointer
 *    parameters' first bytes only (`const T *` a read, `T *` a write).
 *  - Device memory (emu_rt.cpp's cudaMalloc and the runtime calls around
 *    it, for kernels.cu's cuda_* functions and so tensor.c's USE_CUDA Dev):
 *    host memory, 256-byte aligned, filled with 0xFF (NaN) when allocated,
 *    between guard areas that cudaFree checks (a store past either end of
 *    a buffer stops the program); cudaMemsetAsync and the device side of
 *    cudaMemcpyAsync must lie inside one live allocation. Pinned host
 *    memory (cudaMallocHost) is malloc, in the same table as pinned. test_flash and test_gemm use emu_dev.c's Dev
 *    instead (the same guards, without kernels.cu).
 *  - Math: the host's libm for expf, tanhf and the rest; rsqrtf is
 *    1/sqrtf; min and max of integers are defined here.
 *  - The device: EMU_ARCH=sm_80 (the default) reports compute capability
 *    8.0 with 108 SMs; EMU_ARCH=sm_90a reports 9.0 with 132 SMs, an H100,
 *    and matmul.cu (built with -DMM_EMU_SM90A, so its sm_90a kernel is
 *    compiled for the host) then takes TC_WGMMA. EMU_SMS=n sets the SM
 *    count (1 makes one block of the persistent grid walk every tile).
 *
 * sm_90a, as sm90.cuh's wrappers use it for matmul.cu's TC_WGMMA and
 * attention_sm90.cu (the rules are the PTX ISA's and
 * the CUDA driver API's; where they are unclear the emulation is stricter
 * and says so in its message):
 *  - Static __shared__ objects live outside the dynamic window (above), so
 *    __cvta_generic_to_shared gives them addresses of their own from
 *    EMU_STATIC_BASE on, which the mbarrier functions map back.
 *  - mbarrier: init(count) (8-byte aligned, count 1..2^20-1), arrive,
 *    arrive.expect_tx(bytes) (adds transaction bytes, then arrives),
 *    complete_tx from TMA; a phase completes when no arrival and no byte is
 *    outstanding, and the count re-arms. try_wait.parity(P) is true when the
 *    phase of parity P has completed: the current phase's parity is not P
 *    (so parity 1 passes at once on a fresh barrier). A waiting thread
 *    sleeps until the barrier changes. Using a barrier nobody initialised,
 *    or arriving where no arrival is pending, stops the program; a phase
 *    that never completes is a deadlock, reported with who waits.
 *  - TMA: cuTensorMapEncodeTiled (found through
 *    cudaGetDriverEntryPointByVersion, as on a GPU) checks the driver's
 *    rules and stores the map in the CUtensorMap; only rank 2 bfloat16 maps,
 *    swizzle none or 128 bytes (with a 128-byte box row) are emulated.
 *    cp.async.bulk.tensor.2d writes box element (r, c), global element
 *    (c1 + r, c0 + c) or zero outside the tensor, at dst + r * row bytes +
 *    2c, through the 128-byte swizzle (address bits 4-6 XOR bits 7-9, on the
 *    shared address itself), and completes the whole box's bytes on the
 *    mbarrier, zero-filled parts included. The destination must be
 *    1024-byte aligned with the swizzle (the pattern's period; the PTX ISA
 *    asks 128, the emulation asks more so that a box's rows start the
 *    pattern, as matmul.cu's layout assumes). EMU_CP=early lands the box as
 *    it is issued; late fills it with 0xFF (NaN) and lands it when a thread
 *    waiting on its mbarrier finds every arrival in (the barrier's boxes in
 *    issue order, until the phase's transaction bytes are in: see
 *    "Clusters" for a box beyond them).
 *  - TMA stores (cp.async.bulk.tensor.2d.global.shared::cta.bulk_group:
 *    matmul.cu's TMA-store epilogue): box element (r, c), read from the
 *    shared address src + r * row bytes + 2c through the swizzle as a load
 *    writes it (src 1024-byte aligned with the swizzle), goes to global
 *    element (c1 + r, c0 + c), and only where that lies inside the tensor
 *    (the rest of the box is clipped, as on hardware). commit_group closes
 *    the issuing thread's uncommitted stores into its next bulk group;
 *    wait_group.read N retires its groups but the newest N. EMU_CP=early
 *    does the store when it is issued; late reads the shared memory only
 *    when wait_group.read retires its group, or when its CTA exits (a
 *    store in flight at exit completes on hardware), so a staging buffer
 *    written again before the wait_group.read that frees it stores the new
 *    values in place of the old: wrong output. fence.proxy.async is
 *    accepted and does nothing (fibers' stores are visible at once; its
 *    absence is not detected).
 *  - wgmma.fence, commit_group, wait_group N, mma_async and setmaxnreg are
 *    warpgroup collectives (.sync.aligned): all 128 threads of the
 *    warpgroup must arrive at the same one with the same operands, or the
 *    program stops (a divergent warpgroup). mma_async m64nNk16 (f32 += bf16
 *    x bf16, scale-d 1, as matmul.cu's wrapper writes it) reads A (64 x 16)
 *    and B (16 x N) from shared memory through their matrix descriptors:
 *    start address bits 0-13, leading byte offset 16-29, stride byte offset
 *    32-45 (each >> 4), base offset 49-51 (must be 0), swizzle 62-63 (must
 *    be 1, 128 bytes), the rest zero; element (mn, k) of a k-major operand
 *    (trans 0) at start + 128 (mn % 8) + SBO (mn / 8) + 2k, of an mn-major
 *    one (trans 1) at start + 2 (mn % 64) + LBO (mn / 64) + 128 (k % 8) +
 *    SBO (k / 8), swizzled; the accumulator fragment is mma.sync's, warp w
 *    of the warpgroup holding rows 16w..16w+15. With EMU_CP=early it runs
 *    as it is issued; with late it runs only at the wait_group that retires
 *    its group, reading shared memory then, so a stage released or
 *    refilled before its wgmma finished gives wrong numbers or NaN, and a
 *    block that ends with wgmma in flight stops the program. setmaxnreg
 *    checks only its count (24..256, a multiple of 8). m64n128k16 as
 *    m64n256k16, its 64 accumulators at d + H (sm90_wgmma_m64n128<TA, TB, H, L>,
 *    H 0 or 64 of a float[128]: the two halves of the ping-pong tile).
 *  - Named barriers (bar.sync / bar.arrive id, count: the ping-pong
 *    kernels' ordering of their two warpgroups' math, matmul.cu's and
 *    attention_sm90.cu's), ids 1..15 (0 is
 *    __syncthreads'), count a multiple of 32 up to the block's threads. A
 *    phase opens with its first arrival's count and completes when that
 *    many threads are in; bar.sync sleeps until then, bar.arrive goes on.
 *    Stricter than the PTX ISA wherever hardware would go on silently: an
 *    arrival with another count than its phase's; a thread arriving twice
 *    in one phase (hardware counts the warp again and releases the barrier
 *    early: the ordering is lost, every value still right, so only this
 *    check can show it); a phase completing with a warp partly in (the
 *    instructions are .aligned); a block ending with a phase open (an
 *    arrival nobody waited for); a bar.sync nobody completes is a
 *    deadlock, reported with the count of threads at named barriers.
 *  - Clusters (matmul.cu's TC_WGMMA_CLUSTER): cudaLaunchKernelEx (a macro
 *    here for emu_launch_kernel_ex) with cudaLaunchAttributeClusterDimension;
 *    a grid that is not a multiple of the cluster, or a cluster of more than
 *    8, returns cudaErrorInvalidValue and launches nothing (a launch error
 *    either way on a GPU; its exact code is not checked there); a cluster larger
 *    than the SM count stops the program (it could never be resident).
 *    cudaOccupancyMaxActiveClusters answers SMs / cluster size. The CTAs of
 *    one cluster run together: their fibers are scheduled as one larger
 *    block's (warp-greedy inside a CTA; when every fiber of a CTA waits, the
 *    next CTA's first runnable one), each CTA with its own dynamic shared
 *    memory, mbarriers, named barriers and warpgroups; a deadlock is
 *    reported for the cluster. %cluster_ctarank is x fastest within the
 *    cluster; %clusterid.x and %nclusterid.x follow. mapa gives a
 *    shared::cluster address (rank + 1 in bits 24-27; a rank outside the
 *    cluster stops the program); mbarrier.arrive on one arrives at that
 *    CTA's barrier and wakes its waiters. The multicast TMA writes the box
 *    into each masked CTA's shared memory at the same offset and completes
 *    its bytes on each one's mbarrier at the same offset (a mask naming a
 *    CTA outside the cluster stops the program); with EMU_CP=late each copy
 *    is NaN at issue and lands as any box does: a thread waiting on that
 *    CTA's barrier with every arrival in lands its boxes in issue order
 *    until the phase's bytes are in (a box beyond them, a peer's copy for
 *    the stage's next round, stays in flight for the next phase), so a
 *    multicast into a stage the peer still reads gives it NaN.
 *    barrier.cluster.arrive / wait: every thread of the cluster arrives
 *    (an arrive twice without a wait, or a wait without an arrive, stops
 *    the program), a wait returns once its phase is complete. The exit
 *    rule: a CTA exits when its last thread returns; a multicast into it
 *    or an arrival on its barriers after that stops the program, and so
 *    does its exit unless every peer's remote operation into it came before
 *    that peer's arrival at a barrier.cluster phase that every thread of
 *    the exiting CTA waited through (on hardware the peer could still write
 *    into shared memory that is gone). Static __shared__ objects are one
 *    per OS thread (above), so the CTAs of a cluster share them: their
 *    shared addresses are the same in every CTA, which the mbarriers (found
 *    by address, their state kept apart per CTA) need; data a cluster
 *    kernel keeps in static shared memory would be shared wrongly (the
 *    GEMM keeps only its mbarriers there).
 *
 * What it cannot catch.
 *  - Real data races and memory ordering inside a kernel: fibers see every
 *    store at once, blocks never overlap, and only the interleavings above
 *    are tried; a race the schedule does not expose passes (plain
 *    shared-memory loads and stores are not intercepted).
 *  - Races between streams that the detector does not see: a kernel's
 *    accesses beyond its pointers' first bytes (two kernels on two streams
 *    touching different parts of one buffer through the same base pointer
 *    are checked as if both touched byte 0, and a pointer into the middle
 *    of a region another stream copies is checked only at that byte),
 *    pointers inside structs or arrays passed by value, non-const pointers
 *    a kernel only reads (counted as writes: a false alarm is possible),
 *    host reads and writes of pinned memory (only the NaN fill and the
 *    checksum above), __device__ variables, and a race among more records
 *    than an allocation keeps (the oldest are dropped past 512). Orders
 *    that only one timing exposes wrong values for need that timing run.
 *  - Timing, occupancy, register counts and spills, bank conflicts.
 *  - Hardware behaviour beyond the documented fragment layouts: the order
 *    and precision of the tensor cores' internal sums, exp2f's and other
 *    intrinsics' device error (the host libm runs instead), denormal
 *    flushing.
 *  - Anything the device compiler does: nvcc still has to build the .cu
 *    files (the normal build does that), and code under __CUDA_ARCH__.
 *
 * State. The scheduler's state is thread_local (the current block and
 * fiber, and the settings read from EMU_CP, EMU_ORDER, EMU_ARCH and EMU_SMS
 * once per OS thread), as is the current device; emu_rt.cpp holds the
 * emulated device's per-kernel shared-memory limits (cudaFuncSetAttribute)
 * under a mutex, and the runtime (streams, events, clocks, the table of
 * live allocations with their access records, the settings EMU_STREAMS,
 * EMU_RACECHECK and EMU_GPUS read once per process) under one recursive
 * lock, released only while a waiter sleeps (emu_idle). Nothing else is
 * mutable.
 *
 * The host compiler builds the transformed .cu files with
 * -fno-strict-aliasing: device code stores through uint4 into float and
 * bf16 arrays (kernels.cu's 16-byte vectors), which nvcc compiles as meant
 * and g++ at -O2 otherwise may not.
 */
#ifndef EMU_H
#define EMU_H

#include <cuda.h>          /* CUtensorMap: a type only, no libcuda */
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <deque>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>
#include "emu_stream.h"
/* NVTX (kernels.cu's ranges around each training step): the declarations
 * only; emu_rt.cpp implements the calls the sources make (nvtxRangePushA,
 * nvtxRangePop), which count a step's synchronizations (EMU_STEP_COUNTS). */
#define NVTX_NO_IMPL
#include <nvtx3/nvToolsExt.h>

#undef __launch_bounds__
#define __launch_bounds__(...)

/* ---------------------------------------------------------------------------
 * The scheduler's state (emu_rt.cpp runs it). */

enum { EMU_RUN = 0, EMU_WAIT = 1, EMU_DONE = 2 };

/* One copy of cp.async, queued (late landing) until its group is waited for. */
struct EmuCopy {
    unsigned char *dst;
    const unsigned char *src;
    int n, src_n;
    int group;  /* commit-group number, -1 while not committed */
};

struct EmuFiber {
    void *sp;             /* saved stack pointer while switched out */
    int state;
    uint3 tid;            /* threadIdx */
    int linear;           /* tid.x + bx (tid.y + by tid.z) */
    EmuCopy *copies;      /* pending cp.async, issue order, [head, count) */
    int ncopies, cap, head;
    int committed;        /* groups committed so far */
    const void *wait_on;  /* while waiting: the barrier, collective or mbarrier */
    unsigned cl_arrived;  /* barrier.cluster.arrive made so far */
    unsigned cl_waited;   /* barrier.cluster phases it has waited through */
    int bulk_committed;   /* bulk groups (cp.async.bulk.commit_group) committed so far */
};

/* The operands and results of one warp collective, per lane. */
struct EmuWarp {
    int arrived;          /* lanes waiting at the current collective */
    int op;               /* its kind (EmuOp) */
    uint32_t addr[32];    /* ldmatrix row addresses */
    uint32_t a[32][4], b[32][2];
    float c[32][4];       /* mma accumulators in, results out */
    uint32_t r[32][4];    /* ldmatrix results */
    uint64_t v[32];       /* shuffle values (the bits of a 4- or 8-byte value) */
    uint64_t shfl[32];    /* shuffle results */
    int arg[32];          /* shuffle lane mask, per lane */
};

enum EmuOp { EMU_OP_SYNCWARP = 1, EMU_OP_SHFL_XOR, EMU_OP_LDSM, EMU_OP_LDSM_T, EMU_OP_MMA };

/* sm_90a (emulated only where the device reports 9.0, EMU_ARCH=sm_90a). */

/* One TMA box in flight (EMU_CP=late) until a thread waits on its mbarrier. */
struct EmuTma {
    const CUtensorMap *map;
    int c0, c1;           /* element coordinates: inner, outer */
    uint32_t dst;         /* shared address */
};
/* One TMA store (cp.async.bulk.tensor shared -> global) whose shared
 * memory is not read yet (EMU_CP=late): its issuing thread, and its bulk
 * group (-1 until that thread commits). */
struct EmuTmaStore {
    const CUtensorMap *map;
    int c0, c1;           /* element coordinates: inner, outer */
    uint32_t src;         /* shared address of the box */
    int tid, group;
};
/* An mbarrier, found by its shared address. */
struct EmuMbar {
    uint32_t addr;
    uint32_t expected;    /* arrivals a phase (init's count) */
    uint32_t pending;     /* arrivals still missing in the current phase */
    long long tx;         /* transaction bytes still expected in it */
    unsigned phase;       /* phases completed */
    std::vector<EmuTma> inflight;
};
/* One wgmma.mma_async of a warpgroup: D (64 x n, each thread's fragment
 * at d[t]) += A (64 x 16) B (16 x n), the operands read through the
 * descriptors when it runs. */
struct EmuWgmma {
    uint64_t da, db;
    int ta, tb, n;
    float *d[128];
};
enum EmuWgOp { EMU_WG_FENCE = 1, EMU_WG_MMA, EMU_WG_COMMIT, EMU_WG_WAIT, EMU_WG_SETMAXNREG };
/* A warpgroup's collectives (.sync.aligned over its 128 threads) and its
 * wgmma queue: issued and not committed, then committed groups, oldest first. */
struct EmuWarpgroup {
    int arrived, op;
    uint64_t a[128], b[128];  /* per thread: descriptors, or the wait / setmaxnreg arguments */
    int arg[128];             /* per thread: wgmma's trans-a | trans-b << 1 | n << 2 */
    float *d[128];
    std::vector<EmuWgmma> open;
    std::deque<std::vector<EmuWgmma>> groups;
};
/* A named barrier (bar.sync / bar.arrive id, count): the count its
 * current phase was opened with, the threads in so far (a bit a lane, per
 * warp), and the phases completed (what a waiting thread watches). */
struct EmuNamedBar {
    int count, arrived;
    unsigned phase;
    uint32_t lanes[32];   /* per warp of the block: its lanes arrived in this phase */
};
enum { EMU_NAMED_BARS = 16, EMU_MAX_STATICS = 64, EMU_MAX_CLUSTER = 8 };
/* Shared addresses given to static __shared__ objects (which the emulation
 * keeps outside the dynamic window): EMU_STATIC_BASE + 16 i for the i-th
 * object __cvta_generic_to_shared was asked about in this cluster (the same
 * address in each of its CTAs: a static object is one per OS thread here). */
#define EMU_STATIC_BASE 0x40000000u
/* A shared::cluster address (mapa's): a shared::cta address with (rank + 1)
 * in bits 24-27 naming the CTA of the cluster; bits 24-27 zero name the
 * CTA that uses it, as a shared::cta address does on hardware. */
#define EMU_CLUSTER_SHIFT 24
#define EMU_CLUSTER_MASK (0xFu << EMU_CLUSTER_SHIFT)

struct EmuBlock;
/* The CTAs of one cluster (a launch without the cluster attribute: clusters
 * of one), run together: their fibers are scheduled as one larger block's,
 * each CTA with its own shared memory, mbarriers and named barriers.
 * barrier.cluster: `arrived` threads in the current phase of nthreads,
 * `phase` phases completed. */
struct EmuCluster {
    int size;               /* CTAs */
    dim3 dim;               /* cluster dimensions in CTAs */
    EmuBlock *ctas;         /* [size], by %cluster_ctarank */
    int nthreads;           /* threads of all its CTAs */
    int arrived;
    unsigned phase;
    const void *statics[EMU_MAX_STATICS];
    int nstatics;
};

struct EmuBlock {
    int nthreads, nwarps;
    EmuFiber *fibers;
    int cur;              /* index of the running fiber */
    int barrier_arrived;  /* threads waiting at __syncthreads */
    unsigned char *smem;  /* dynamic shared memory */
    size_t smem_size;
    uint3 block_idx;
    dim3 grid_dim, block_dim;
    int cp_late;          /* EMU_CP=late */
    int order_down;       /* EMU_ORDER=down */
    EmuWarp *warps;
    std::vector<EmuWarpgroup> *wgs;  /* nthreads / 128 of them */
    std::deque<EmuMbar> mbars;  /* a deque: waiters hold pointers into it across inits */
    std::vector<EmuTmaStore> stores;  /* TMA stores in flight, issue order (EMU_CP=late) */
    EmuNamedBar nbars[EMU_NAMED_BARS];  /* bar.sync / bar.arrive 1..15 (0 is __syncthreads') */
    EmuCluster *cl;       /* its cluster, and its %cluster_ctarank there */
    int rank;
    int exited;           /* every thread has returned */
    unsigned remote_need; /* barrier.cluster phases it must wait through before it exits: peers wrote
                             into it (multicast) or arrived on its mbarriers before their arrival at
                             phase remote_need - 1 */
};

extern thread_local EmuBlock *emu_blk;

#define threadIdx (emu_blk->fibers[emu_blk->cur].tid)
#define blockIdx (emu_blk->block_idx)
#define gridDim (emu_blk->grid_dim)
#define blockDim (emu_blk->block_dim)

/* emu_rt.cpp */
[[noreturn]] void emu_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void emu_wait(const void *on);                 /* this fiber waits on `on`; returns when woken */
void emu_wake(const void *on);                 /* wakes every fiber of the block waiting on `on` */
void emu_warp_complete(EmuWarp *w, int op);    /* the last lane: compute the collective */
void emu_syncthreads(void);
void emu_cp_land(EmuFiber *f, int upto_group); /* lands copies of groups < upto_group */
void emu_cp_queue(EmuFiber *f, const EmuCopy &c);
void emu_run_grid(dim3 grid, dim3 block, dim3 cluster, size_t smem, const void *kernel, const char *name,
                  void (*body)(void *), void *ctx);
cudaError_t emu_cluster_check(dim3 grid, dim3 cluster); /* a cluster launch's dimensions: cudaSuccess or the error */
extern "C" const char *emu_describe(void);  /* the settings, for test names */

static inline EmuFiber *emu_self(void) { return &emu_blk->fibers[emu_blk->cur]; }
static inline int emu_lane(void) { return emu_self()->linear & 31; }
static inline EmuWarp *emu_warp(void) { return &emu_blk->warps[emu_self()->linear >> 5]; }

/* Arrive at a warp collective whose operands this lane has stored in w;
 * returns when the whole warp has arrived and the collective is computed. */
static inline void emu_warp_arrive(EmuWarp *w, int op) {
    if (w->arrived == 0) w->op = op;
    else if (w->op != op)
        emu_fail("warp %d: lanes at different collectives (%d and %d): divergent warp",
                 emu_self()->linear >> 5, w->op, op);
    if (++w->arrived < 32) emu_wait(w);
    else emu_warp_complete(w, op);
}

/* ---------------------------------------------------------------------------
 * CUDA built-ins. */

static inline void __syncthreads(void) { emu_syncthreads(); }
static inline void __syncwarp(unsigned mask = 0xffffffffu) {
    if (mask != 0xffffffffu) emu_fail("__syncwarp with a partial mask is not emulated");
    emu_warp_arrive(emu_warp(), EMU_OP_SYNCWARP);
}
/* __shfl_xor_sync of any 4- or 8-byte type (float, double, int, ...): each
 * lane's bits travel whole (a double as one 64-bit value, as the device's
 * pair of 32-bit shuffles gives it). */
template <class T> static inline T emu_shfl_xor(unsigned mask, T v, int lane_mask, int width) {
    static_assert(sizeof(T) == 4 || sizeof(T) == 8, "__shfl_xor_sync of a 4- or 8-byte type");
    if (mask != 0xffffffffu || width != 32) emu_fail("__shfl_xor_sync: only the full warp is emulated");
    EmuWarp *w = emu_warp();
    const int lane = emu_lane();
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    w->v[lane] = bits;
    w->arg[lane] = lane_mask;
    emu_warp_arrive(w, EMU_OP_SHFL_XOR);
    memcpy(&v, &w->shfl[lane], sizeof v);
    return v;
}
static inline float __shfl_xor_sync(unsigned m, float v, int l, int width = 32) { return emu_shfl_xor(m, v, l, width); }
static inline double __shfl_xor_sync(unsigned m, double v, int l, int width = 32) { return emu_shfl_xor(m, v, l, width); }
static inline int __shfl_xor_sync(unsigned m, int v, int l, int width = 32) { return emu_shfl_xor(m, v, l, width); }
static inline unsigned __shfl_xor_sync(unsigned m, unsigned v, int l, int width = 32) { return emu_shfl_xor(m, v, l, width); }
static inline long long __shfl_xor_sync(unsigned m, long long v, int l, int width = 32) { return emu_shfl_xor(m, v, l, width); }
static inline unsigned long long __shfl_xor_sync(unsigned m, unsigned long long v, int l, int width = 32) {
    return emu_shfl_xor(m, v, l, width);
}
/* The device math functions the host's libm lacks (the host's
 * arithmetic, not the device's error bounds), and the integer min/max
 * that device code calls unqualified. */
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline unsigned __float_as_uint(float x) { unsigned u; memcpy(&u, &x, 4); return u; }
static inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
static inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }

static inline float atomicAdd(float *p, float v) {
    const float old = *p;
    *p = old + v;
    return old;
}
static inline double atomicAdd(double *p, double v) {
    const double old = *p;
    *p = old + v;
    return old;
}
static inline int atomicMax(int *p, int v) {
    const int old = *p;
    *p = old > v ? old : v;
    return old;
}
/* cuda_runtime.h declares these overloads (a kernel, a __device__ symbol) for
 * nvcc only. */
template <class... P>
static inline cudaError_t cudaFuncSetAttribute(void (*kernel)(P...), cudaFuncAttribute attr, int value) {
    return cudaFuncSetAttribute((const void *)kernel, attr, value);
}
template <class T>
static inline cudaError_t cudaMemcpyFromSymbolAsync(void *dst, const T &symbol, size_t count, size_t offset = 0,
                                                    cudaMemcpyKind kind = cudaMemcpyDeviceToHost,
                                                    cudaStream_t stream = 0) {
    return cudaMemcpyFromSymbolAsync(dst, (const void *)&symbol, count, offset, kind, stream);
}
static inline unsigned char *emu_dynamic_smem(void) { return emu_blk->smem; }
uint32_t emu_static_shared(const void *p);    /* a static __shared__ object's address */
static inline size_t __cvta_generic_to_shared(const void *p) {
    const unsigned char *c = (const unsigned char *)p;
    if (c >= emu_blk->smem && c <= emu_blk->smem + emu_blk->smem_size) return (size_t)(c - emu_blk->smem);
    return emu_static_shared(p);
}

/* ---------------------------------------------------------------------------
 * PTX: cp.async, ldmatrix, mma.sync (the generic forms). */

static inline void emu_cp_async(uint32_t dst, const void *src, int n, int src_n) {
    EmuBlock *b = emu_blk;
    if (src_n < 0 || src_n > n) emu_fail("cp.async: src-size %d outside 0..%d", src_n, n);
    if (dst % (uint32_t)n) emu_fail("cp.async: shared address %u not aligned to %d", dst, n);
    if (src_n > 0 && (uintptr_t)src % (uintptr_t)n) emu_fail("cp.async: global address %p not aligned to %d", src, n);
    if ((size_t)dst + (size_t)n > b->smem_size)
        emu_fail("cp.async: shared address %u + %d beyond the %zu bytes of dynamic shared memory", dst,
                 n, b->smem_size);
    EmuCopy c = {b->smem + dst, (const unsigned char *)src, n, src_n, -1};
    if (!b->cp_late) {
        if (src_n) memcpy(c.dst, c.src, (size_t)src_n);
        memset(c.dst + src_n, 0, (size_t)(n - src_n));
    } else {
        memset(c.dst, 0xFF, (size_t)n);  /* in flight: NaN until it lands */
        emu_cp_queue(emu_self(), c);
    }
}
static inline void emu_cp_commit(void) {
    EmuFiber *f = emu_self();
    for (int i = f->head; i < f->ncopies; i++)
        if (f->copies[i].group < 0) f->copies[i].group = f->committed;
    f->committed++;
}
static inline void emu_cp_wait(int n) {  /* at most n groups left pending */
    EmuFiber *f = emu_self();
    if (f->head < f->ncopies) emu_cp_land(f, f->committed - n);
}

static inline void emu_check_row(uint32_t addr) {
    if (addr % 16) emu_fail("ldmatrix: row address %u not 16-byte aligned", addr);
    if ((size_t)addr + 16 > emu_blk->smem_size)
        emu_fail("ldmatrix: row address %u beyond the %zu bytes of dynamic shared memory", addr,
                 emu_blk->smem_size);
}
static inline void emu_ldmatrix_x4(uint32_t *r, uint32_t addr, int trans) {
    EmuWarp *w = emu_warp();
    const int lane = emu_lane();
    emu_check_row(addr);
    w->addr[lane] = addr;
    emu_warp_arrive(w, trans ? EMU_OP_LDSM_T : EMU_OP_LDSM);
    for (int i = 0; i < 4; i++) r[i] = w->r[lane][i];
}
static inline void emu_mma_16816(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
    EmuWarp *w = emu_warp();
    const int lane = emu_lane();
    for (int i = 0; i < 4; i++) {
        w->a[lane][i] = a[i];
        w->c[lane][i] = c[i];
    }
    w->b[lane][0] = b0;
    w->b[lane][1] = b1;
    emu_warp_arrive(w, EMU_OP_MMA);
    for (int i = 0; i < 4; i++) c[i] = w->c[lane][i];
}

/* ---------------------------------------------------------------------------
 * The inline-PTX wrappers of attention.cu and matmul.cu, by their names and
 * signatures (emu_transform.cpp removes the originals). */

static inline void fa_cp_async16(uint32_t dst, const void *src, int src_bytes) { emu_cp_async(dst, src, 16, src_bytes); }
static inline void fa_cp_async4(uint32_t dst, const void *src, int src_bytes) { emu_cp_async(dst, src, 4, src_bytes); }
static inline void fa_cp_commit(void) { emu_cp_commit(); }
template <int N> static inline void fa_cp_wait(void) { emu_cp_wait(N); }
static inline void fa_ldsm_x4(uint32_t r[4], uint32_t addr) { emu_ldmatrix_x4(r, addr, 0); }
static inline void fa_ldsm_x4_t(uint32_t r[4], uint32_t addr) { emu_ldmatrix_x4(r, addr, 1); }
static inline void fa_mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) { emu_mma_16816(c, a, b0, b1); }

static inline void mm_cp_async16(uint32_t dst, const void *src, int src_bytes) { emu_cp_async(dst, src, 16, src_bytes); }
static inline void mm_cp_async_commit(void) { emu_cp_commit(); }
template <int N> static inline void mm_cp_async_wait(void) { emu_cp_wait(N); }
static inline void mm_ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) { emu_ldmatrix_x4(r, addr, 0); }
static inline void mm_ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) { emu_ldmatrix_x4(r, addr, 1); }
static inline void mm_mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) { emu_mma_16816(c, a, b0, b1); }

/* ---------------------------------------------------------------------------
 * Launches: emu_transform.cpp turns K<<<cfg>>>(args) into
 * K % emu_config(cfg)(args). */

struct EmuConfig {
    dim3 grid, block, cluster;  /* cluster: (1, 1, 1) but for cudaLaunchKernelEx's attribute */
    size_t smem;
    cudaStream_t stream;
    const char *kernel;   /* the launch's kernel as written (emu_transform), for messages */
};
template <class... A> struct EmuCall {
    EmuConfig cfg;
    std::tuple<A...> args;
};
struct EmuConfigCall : EmuConfig {
    template <class... A> EmuCall<A...> operator()(A... a) const { return {*this, std::tuple<A...>(a...)}; }
};
static inline EmuConfigCall emu_config(const char *kernel, dim3 grid, dim3 block, size_t smem = 0,
                                       cudaStream_t stream = 0) {
    EmuConfigCall c;
    c.grid = grid;
    c.block = block;
    c.smem = smem;
    c.stream = stream;
    c.kernel = kernel;
    return c;
}

template <class F> static void emu_invoke(void *f) { (*(F *)f)(); }

/* What a launch tells the race detector about a parameter: a pointer is an
 * access of its first byte (the extent is the kernel's business), a write
 * unless it points to const; anything else is no access. */
template <class T> static inline void emu_param_access(const T &, std::vector<EmuAccess> &) {}
template <class T> static inline void emu_param_access(T *const &p, std::vector<EmuAccess> &a) {
    a.push_back(EmuAccess{(const void *)p, 1, !std::is_const<T>::value});
}

/* A launch as a stream op: it owns the arguments, converted to the
 * parameter types as a launch does, and runs the grid when its stream
 * reaches it. */
template <class... P> struct EmuKernelOp : EmuStreamOp {
    void (*kernel)(P...);
    std::tuple<P...> args;
    EmuConfig cfg;
    EmuKernelOp(void (*k)(P...), const std::tuple<P...> &a, const EmuConfig &c) : kernel(k), args(a), cfg(c) {}
    bool step() override {
        auto body = [this]() { std::apply(kernel, args); };
        emu_run_grid(cfg.grid, cfg.block, cfg.cluster, cfg.smem, (const void *)kernel, name.c_str(), &emu_invoke<decltype(body)>,
                     &body);
        return true;
    }
};

template <class... P, class... A>
static void emu_launch(void (*kernel)(P...), const EmuCall<A...> &call, const char *name) {
    static_assert(sizeof...(P) == sizeof...(A), "kernel launched with the wrong number of arguments");
    EmuKernelOp<P...> *op = new EmuKernelOp<P...>(kernel, std::tuple<P...>(call.args), call.cfg);
    op->name = call.cfg.kernel ? call.cfg.kernel : name;
    std::apply([op](const P &...p) { (emu_param_access(p, op->access), ...); }, op->args);
    emu_stream_enqueue(call.cfg.stream, op);
}

/* A kernel named by one function (or a template-id naming one
 * specialization): its parameter types P are deduced from it. */
template <class... P, class... A>
static void operator%(void (*kernel)(P...), const EmuCall<A...> &call) {
    emu_launch(kernel, call, __PRETTY_FUNCTION__);
}

/* A kernel template whose template arguments a launch deduces from the
 * call's arguments (kernels.cu's map_kernel<<<...>>>(out, a, b, n, f)):
 * the name is an overload set, P cannot be deduced from it, so that
 * overload drops out and this one, whose kernel parameter is not a deduced
 * context, resolves the set against void (*)(A...), the arguments' own
 * types (decayed: EmuConfigCall takes them by value). A kernel whose
 * parameter types differ from its arguments' (a conversion) still has to
 * be named whole, as in the overload above. */
template <class T> struct EmuNonDeduced { using type = T; };
template <class... A>
static void operator%(typename EmuNonDeduced<void (*)(A...)>::type kernel, const EmuCall<A...> &call) {
    emu_launch(kernel, call, __PRETTY_FUNCTION__);
}

/* cudaLaunchKernelEx (cuda_runtime.h's C++ form, which the macro below
 * replaces in the .cu files): the configuration's grid, block, dynamic
 * shared memory and stream, and of its attributes only the cluster
 * dimension (any other stops the program: not emulated). A grid that is
 * not a multiple of the cluster, or a cluster of more than 8 CTAs, returns
 * cudaErrorInvalidValue and launches nothing (a GPU refuses the launch too;
 * which code it returns is not checked on one). */
#pragma push_macro("gridDim")
#pragma push_macro("blockDim")
#undef gridDim
#undef blockDim
template <class... P, class... A>
static cudaError_t emu_launch_kernel_ex(const cudaLaunchConfig_t *c, void (*kernel)(P...), A &&...a) {
    EmuConfigCall cfg = emu_config(nullptr, c->gridDim, c->blockDim, c->dynamicSmemBytes, c->stream);
    for (unsigned i = 0; i < c->numAttrs; i++) {
        if (c->attrs[i].id != cudaLaunchAttributeClusterDimension)
            emu_fail("cudaLaunchKernelEx: launch attribute %d is not emulated", (int)c->attrs[i].id);
        cfg.cluster = dim3(c->attrs[i].val.clusterDim.x, c->attrs[i].val.clusterDim.y, c->attrs[i].val.clusterDim.z);
    }
    const cudaError_t e = emu_cluster_check(cfg.grid, cfg.cluster);
    if (e != cudaSuccess) return e;
    emu_launch(kernel, cfg(a...), __PRETTY_FUNCTION__);
    return cudaSuccess;
}
#pragma pop_macro("blockDim")
#pragma pop_macro("gridDim")
#define cudaLaunchKernelEx emu_launch_kernel_ex

/* ---------------------------------------------------------------------------
 * PTX of sm_90a: sm90.cuh's wrappers (sm90_*; mbarrier, TMA
 * (cp.async.bulk.tensor), setmaxnreg, named barriers, wgmma), by their names
 * and signatures, for matmul.cu's wgmma GEMM and attention_sm90.cu.
 * sm90.cuh keeps its inline PTX inside #ifdef __CUDACC__, so the host
 * compiler sees only these; its plain helpers (sm90_smem_u32, sm90_desc)
 * it compiles from sm90.cuh itself. emu_rt.cpp does the work (the header
 * above says what is checked).
 *
 * wgmma with A from registers (emu_wgmma_rs; attention_sm90.cu's O += P V
 * with P never leaving the registers): the A fragment for bf16 is
 * mma.sync's A fragment, per warp: warp w of the warpgroup holds rows
 * 16w..16w+15, lane l (g = l >> 2, t = l & 3) a0 = A[g][2t..], a1 =
 * A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..], the lower column in
 * the low 16 bits. B and the accumulator are as for the shared-memory
 * form. The hardware reads those registers asynchronously: they must not
 * change until the wait_group that retires the wgmma. With EMU_CP=early
 * the product runs at issue; with late it runs at that wait_group, reading
 * the registers then, and stops the program if any thread's four registers
 * differ from what they held at issue (where the hardware would compute
 * with whichever it read). */

void emu_mbar_init(uint32_t bar, uint32_t count);
void emu_mbar_arrive(uint32_t bar, uint32_t tx_bytes);  /* arrive (.expect_tx tx_bytes) */
void emu_mbar_wait(uint32_t bar, uint32_t parity);
void emu_tma_2d(uint32_t dst, const CUtensorMap *map, int c0, int c1, uint32_t bar);
void emu_tma_store_2d(const CUtensorMap *map, int c0, int c1, uint32_t src);
void emu_bulk_commit(void);
void emu_bulk_wait_read(int n);  /* cp.async.bulk.wait_group.read n */
void emu_tma_stores_exit(EmuBlock *b);  /* CTA b exits: its stores in flight complete */
void emu_wg_collective(int op, uint64_t a, uint64_t b, float *d);
void emu_wgmma(uint64_t da, uint64_t db, int ta, int tb, int n, float *d);
void emu_wgmma_rs(const uint32_t *a, uint64_t db, int tb, int n, float *d);
bool emu_wgmma_rs_run(const EmuWgmma &op);  /* emu_wgmma_run's hook: true when op was one of these */
void emu_named_bar(int id, int count, int sync);  /* bar.sync (sync 1) or bar.arrive (0) */
/* Clusters (the header's "Clusters"). */
void emu_tma_2d_multicast(uint32_t dst, const CUtensorMap *map, int c0, int c1, uint32_t bar, uint16_t mask);
uint32_t emu_mapa(uint32_t addr, uint32_t rank);
void emu_mbar_arrive_cluster(uint32_t addr);  /* mbarrier.arrive on a shared::cluster address */
void emu_cluster_arrive(void);
void emu_cluster_wait(void);
static inline uint32_t emu_cluster_ctarank(void) { return (uint32_t)emu_blk->rank; }

static inline void sm90_mbar_init(uint32_t bar, uint32_t count) { emu_mbar_init(bar, count); }
static inline void sm90_mbar_init_fence(void) {}
static inline void sm90_mbar_expect_tx(uint32_t bar, uint32_t bytes) { emu_mbar_arrive(bar, bytes); }
static inline void sm90_mbar_arrive(uint32_t bar) { emu_mbar_arrive(bar, 0); }
static inline void sm90_mbar_wait(uint32_t bar, uint32_t parity) { emu_mbar_wait(bar, parity); }
static inline void sm90_tma_2d(uint32_t dst, const CUtensorMap *map, int c0, int c1, uint32_t bar) {
    emu_tma_2d(dst, map, c0, c1, bar);
}
static inline void sm90_tma_store_2d(const CUtensorMap *map, int c0, int c1, uint32_t src) {
    emu_tma_store_2d(map, c0, c1, src);
}
static inline void sm90_bulk_commit(void) { emu_bulk_commit(); }
template <int N> static inline void sm90_bulk_wait_read(void) { emu_bulk_wait_read(N); }
/* fence.proxy.async: fibers' shared-memory stores are visible at once, so nothing to do
 * (a missing fence is not detected) */
static inline void sm90_fence_proxy_async(void) {}
template <int R> static inline void sm90_setmaxnreg_dec(void) { emu_wg_collective(EMU_WG_SETMAXNREG, R, 0, nullptr); }
template <int R> static inline void sm90_setmaxnreg_inc(void) { emu_wg_collective(EMU_WG_SETMAXNREG, R, 1, nullptr); }
static inline void sm90_tma_2d_multicast(uint32_t dst, const CUtensorMap *map, int c0, int c1, uint32_t bar,
                                         uint16_t mask) {
    emu_tma_2d_multicast(dst, map, c0, c1, bar, mask);
}
static inline uint32_t sm90_cluster_ctarank(void) { return emu_cluster_ctarank(); }
static inline uint32_t sm90_clusterid_x(void) { return emu_blk->block_idx.x / emu_blk->cl->dim.x; }
static inline uint32_t sm90_nclusterid_x(void) { return emu_blk->grid_dim.x / emu_blk->cl->dim.x; }
static inline uint32_t sm90_mapa(uint32_t addr, uint32_t rank) { return emu_mapa(addr, rank); }
static inline void sm90_mbar_arrive_cluster(uint32_t addr) { emu_mbar_arrive_cluster(addr); }
static inline void sm90_cluster_sync(void) {
    emu_cluster_arrive();
    emu_cluster_wait();
}
static inline void sm90_bar_sync(int id, int count) { emu_named_bar(id, count, 1); }
static inline void sm90_bar_arrive(int id, int count) { emu_named_bar(id, count, 0); }
static inline void sm90_wgmma_fence(void) { emu_wg_collective(EMU_WG_FENCE, 0, 0, nullptr); }
static inline void sm90_wgmma_commit(void) { emu_wg_collective(EMU_WG_COMMIT, 0, 0, nullptr); }
template <int N> static inline void sm90_wgmma_wait(void) { emu_wg_collective(EMU_WG_WAIT, N, 0, nullptr); }
template <int N> static inline void sm90_fence_regs(float (&)[N]) {}
/* wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 with scale-d 1,
 * scales 1 and trans-a TA, trans-b TB, as sm90.cuh writes it. */
template <int TA, int TB> static inline void sm90_wgmma_m64n256(float (&d)[128], uint64_t da, uint64_t db) {
    static_assert((TA == 0 || TA == 1) && (TB == 0 || TB == 1), "imm-trans is 0 or 1");
    emu_wgmma(da, db, TA, TB, 256, d);
}
/* The same, m64n128k16, into d[H .. H + 63]. */
template <int TA, int TB, int H, int L> static inline void sm90_wgmma_m64n128(float (&d)[L], uint64_t da, uint64_t db) {
    static_assert((TA == 0 || TA == 1) && (TB == 0 || TB == 1) && H % 64 == 0 && H + 64 <= L,
                  "imm-trans 0 or 1, H picks 64 floats of d");
    emu_wgmma(da, db, TA, TB, 128, d + H);
}
/* The same, m64n64k16, both operands k-major. */
static inline void sm90_wgmma_m64n64(float (&d)[32], uint64_t da, uint64_t db) { emu_wgmma(da, db, 0, 0, 64, d); }
/* m64nNk16 with A from registers, B mn-major (trans-b 1), N 64 or 128. */
template <int N> static inline void sm90_wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t db) {
    static_assert(N == 64 || N == 128, "register-A wgmma: n 64 or 128");
    emu_wgmma_rs(a, db, 1, N, d);
}

#endif
