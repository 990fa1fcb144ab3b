/* attention_sm90.cu: causal self-attention on Hopper's asynchronous tensor
 * cores (wgmma), in FlashAttention-3's design: the forward behind tc.h's
 * tc_flash_forward_sm90 (heads of 64 and 128), and a deterministic backward
 * behind tc_flash_backward_sm90 (heads of 64 and 128; below, "Backward").
 * attention.cu (mma.sync, FlashAttention-2 style) stays the readable
 * version, the one for every other card, and the backward of heads of 32
 * and of --atomic-dq.
 *
 * What it computes: exactly tc_flash_forward's contract (attention.cu's
 * header; ops.c's attention_forward): for batch b, head h, query t,
 *     s[t2]  = q_t . k_t2 / sqrt(hs)                     for t2 <= t
 *     out_t  = sum_t2 softmax(s)[t2] v_t2                (heads side by side)
 *     lse_t  = log sum_t2 exp(s[t2])                     (natural log)
 * Buffers (device memory):
 *   qkv [B,T,3C] bf16 (q at channel h*hs, k at C + h*hs, v at 2C + h*hs),
 *   out [B,T,C]  bf16, written,
 *   lse [B,NH,T] fp32, written (what tc_flash_backward reads).
 * Head sizes 64 and 128 (the others: -1, the caller falls back).
 *
 * Block. Grid (B*NH, ceil(T/128)), query blocks issued heaviest (last)
 * first; 384 threads = 3 warpgroups:
 *   warpgroup 0, the producer: setmaxnreg.dec to 24 registers; one thread
 *     issues every TMA copy: Q once, then key tile j's K and V (128 keys
 *     each) into stage j % 2 of a two-stage ring;
 *   warpgroups 1 and 2, the consumers (setmaxnreg.inc to 240; 128 x 24 +
 *     256 x 240 = 64512 of the 65536 registers): consumer c owns query rows
 *     64c .. 64c+63 of the block's 128. Per key tile j:
 *       S_j  = Q_c K_j^T      wgmma m64n128k16, both operands in shared
 *                             memory (hs/16 of them), fp32 in registers
 *       online softmax        running max m and sum l per row; O rescaled;
 *                             P_j = exp2(S_j scale - m) rounded to bf16
 *       O += P_j V_j          wgmma m64n{hs}k16 with A = P_j from REGISTERS
 *                             (8 of them, one per 16 keys), B = V in shared
 *                             memory, mn-major (trans-b)
 *     P goes from registers, not through shared memory: wgmma's register
 *     A fragment for bf16 is mma.sync's A fragment per warp (warp w of the
 *     warpgroup rows 16w..16w+15), and its accumulator is mma.sync's C
 *     fragment, so the S accumulators of n-tiles 2k, 2k+1 packed to bf16
 *     pairs are exactly P's A fragment for k-step k (attention.cu's
 *     fa_c_to_a). That saves a 16 KB store, a proxy fence and a warpgroup
 *     barrier a tile; the emulation was extended for it (test/emu/emu.h,
 *     "wgmma with A from registers").
 *
 * Overlap, FlashAttention-3's two kinds:
 *   - Within a warpgroup: the loop runs in WINDOWS. Window j issues S_j and
 *     O += P_{j-1} V_{j-1} together (one commit group), waits for both,
 *     then does the softmax of S_j (which rescales O, now holding P_{j-1}
 *     V_{j-1} on the old max, exactly as the plain order would); window 0
 *     has only S_0, window nkv only the last P V. So the tensor cores get a
 *     whole tile's two products at once.
 *   - Between the two consumers, ping-pong: named barriers 1 and 2
 *     (F3_BAR + c, 256 threads) order the windows c0, c1, c0, c1, ...:
 *     consumer c waits at bar.sync(F3_BAR + c) before issuing its window
 *     and, once issued, bar.arrive(F3_BAR + 1 - c) lets the other issue
 *     its own; consumer 1 arrives once at the start so that consumer 0
 *     goes first, and skips its last arrive, so that every phase completes
 *     (nkv + 1 syncs and as many arrivals on each barrier). The tensor
 *     cores then run one consumer's window while the other does its
 *     softmax (exp2 is the MUFU's, not the tensor cores', time).
 *
 * Shared memory (dynamic, the base rounded up to 1024 bytes as the 128-byte
 * swizzle requires): tiles of 128 rows x hs channels, each as hs/64 TMA
 * boxes {64 channels, 128 rows} of 16 KB, 128-byte swizzled:
 *   Q [128 x hs] | K stage 0, 1 | V stage 0, 1     (5 tiles)
 *   hs 64: 5 x 16 KB + 1 KB = 82944 B; hs 128: 5 x 32 KB + 1 KB = 164864 B.
 * Descriptors (matmul.cu's conventions; LBO / SBO in bytes):
 *   Q as A, k-major:  consumer c at +8192 c; k-step ks (channels 16ks..)
 *                     at + 16384 (ks / 4) + 32 (ks % 4); SBO 1024.
 *   K as B, k-major:  the same offsets for ks; SBO 1024; n = 128 keys.
 *   V as B, mn-major: k-step kk (keys 16kk..) at + 2048 kk; channels
 *                     64.. in the next box, LBO 16384; SBO 1024.
 * Barriers (mbarriers, static shared): q_full (1 arrival + 128 hs 2 bytes);
 * per stage s, k_full[s] and v_full[s] (1 arrival + the tile's bytes), and
 * k_empty[s] and v_empty[s] (8 arrivals: lane 0 of each consumer warp once
 * the window that read the tile has retired, after wgmma.wait_group 0:
 * only then has the hardware finished reading it). K_j is released after
 * window j, V_j after window j + 1, each on its own barrier, so the
 * producer loads K_j and V_j one window ahead of their use. Tile j is
 * stage j % 2 in phase (j / 2) & 1; the producer waits k_empty and v_empty
 * on the opposite parity (a fresh barrier's previous phase counts as
 * complete).
 *
 * TMA: one tensor map over qkv as a 2-D array [B*T rows][3C], boxes
 * {64, 128}; Q, K and V of (b, h) are the column offsets h*hs, C + h*hs,
 * 2C + h*hs (+64 for a second box), rows b*T + t0. A tile that overhangs T
 * reads the next sequence's rows (or zeros past B*T): keys >= T only occur
 * in the diagonal tile of the last query block, where the causal mask
 * removes them for every real query (key > query), and query rows >= T are
 * never stored, so what those rows hold never matters (a 3-D map
 * {3C, T, B} would zero them; the emulation models rank 2 only).
 *
 * Causal: with 128-row query and key tiles aligned, query block qb visits
 * key tiles 0..qb and masks (key > query -> -inf) only in tile qb.
 *
 * Numerics: attention.cu's. Exponentials by exp2f with log2(e) folded into
 * the scale, statistics and O in fp32, P rounded to bf16 once (l sums the
 * unrounded fp32 P), out = bf16(O / l) written from the fragments as bf16
 * pairs, lse = (m + log2 l) ln 2. The tensor cores' internal order differs
 * from mma.sync's, so out matches tc_flash_forward within bf16 rounding,
 * not bit for bit; run to run it is the same bits (no atomics).
 *
 * Requirements: a compute capability 9.0 device running code built for
 * sm_90a (probed once per device: a one-thread kernel reports whether the
 * sm_90a body is there), hs = C/NH in {64, 128}, C % 8 == 0, the driver's
 * tensor-map encoder; else -1 and nothing written. NH <= 0, C % NH != 0 or
 * a qkv/out pointer not 16-byte aligned is a caller bug: a message and
 * exit(1), as in attention.cu. B or T <= 0: nothing to do, 0.
 *
 * Resources (ptxas, CUDA 13.0, sm_90a): 168 registers a thread at
 * compile time (the launch's 65536 / 384; ptxas allocates the consumers'
 * code within setmaxnreg's 240 and the producer's within 24), no spills,
 * in the forward (hs 64 and 128) and the backward's kernels (hs 64 and
 * 128; the hs-128 dK/dV kernel needs 232 of the 240: 224 spills 24
 * bytes); 82944 / 164864 bytes of dynamic shared memory in the forward,
 * 66560 / 132096 in each backward kernel; one block an SM.
 *
 * State: one capability word per device (std::atomic, written once), as in
 * matmul.cu; the dynamic shared-memory limit is set on every call.
 * Under the emulation (test/emu/emu.h) the sm_90a body is compiled for the
 * host with -DMM_EMU_SM90A (the flag matmul.cu's kernel uses) and runs
 * where the emulated device reports 9.0 (EMU_ARCH=sm_90a).
 */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <math.h>
#include <atomic>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cudaTypedefs.h> /* PFN_cuTensorMapEncodeTiled, CUtensorMap: types only, no libcuda */

extern "C" {
#include "tc.h"
}

typedef __nv_bfloat16 bf16;
#include "sm90.cuh"
#include "cuda_check.cuh"

#define F3_BM 128            /* query rows a block: 2 consumer warpgroups x 64 */
#define F3_BN 128            /* keys a tile */
#define F3_STAGES 2          /* K/V ring depth */
#define F3_THREADS 384
#define F3_CONSUMER_WARPS 8
#define F3_BAR 1             /* named barriers 1, 2: consumer 0's and 1's window */
#define F3_BOX_BYTES 16384   /* one box {64 channels, 128 rows} */
#define F3_LOG2E 1.4426950408889634f
#define F3_LN2 0.6931471805599453f

template <int HS> struct F3Smem {
    static constexpr int TILE = (HS / 64) * F3_BOX_BYTES;  /* 128 rows x HS, bytes */
    static constexpr size_t SMEM = (size_t)(1 + 2 * F3_STAGES) * TILE + 1024;
};

/* Written by f3_probe_kernel: 1 where the running device code was built for
 * sm_90a (SM90_BUILD, sm90.cuh, which holds the PTX wrappers sm90_*). */
__device__ int f3_probe_flag;

__global__ void f3_probe_kernel() {
    f3_probe_flag = SM90_BUILD;
}

#if SM90_BUILD
/* Two floats -> one register of two bf16, lo in the low half. */
__device__ __forceinline__ uint32_t f3_pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    uint32_t u;
    memcpy(&u, &v, 4);
    return u;
}
#endif

/* ---------------------------------------------------------------------------
 * The kernel. tm: qkv as [B*T][3C] bf16, boxes {64, 128}, 128-byte swizzle.
 * out [B,T,C] bf16, lse [B,NH,T] fp32. Grid (B*NH, ceil(T/128)), 384
 * threads, F3Smem<HS>::SMEM dynamic. */
template <int HS>
__global__ void __launch_bounds__(F3_THREADS, 1)
f3_fwd_kernel(const __grid_constant__ CUtensorMap tm, bf16 *__restrict__ out, float *__restrict__ lse,
              int T, int C, int NH, float scale_log2) {
#if SM90_BUILD
    constexpr int TILE = F3Smem<HS>::TILE;
    constexpr int HALVES = HS / 64;
    __shared__ __align__(8) uint64_t q_full;
    __shared__ __align__(8) uint64_t k_full[F3_STAGES];
    __shared__ __align__(8) uint64_t v_full[F3_STAGES];
    __shared__ __align__(8) uint64_t k_empty[F3_STAGES];
    __shared__ __align__(8) uint64_t v_empty[F3_STAGES];
    extern __shared__ __align__(16) unsigned char f3_smem[];
    const uint32_t base = (sm90_smem_u32(f3_smem) + 1023u) & ~1023u;
    const uint32_t sQ = base;                                   /* [128][HS] */
    const uint32_t sK = base + TILE;                            /* [STAGES][128][HS] */
    const uint32_t sV = base + (1 + F3_STAGES) * TILE;          /* [STAGES][128][HS] */

    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int qb = gridDim.y - 1 - blockIdx.y;  /* heaviest query blocks first */
    const int q0 = qb * F3_BM;
    const int nkv = qb + 1;                     /* key tiles 0..qb (F3_BN == F3_BM) */
    const int wg = threadIdx.x >> 7;

    if (threadIdx.x == 0) {
        sm90_mbar_init(sm90_smem_u32(&q_full), 1);
        for (int s = 0; s < F3_STAGES; s++) {
            sm90_mbar_init(sm90_smem_u32(&k_full[s]), 1);
            sm90_mbar_init(sm90_smem_u32(&v_full[s]), 1);
            sm90_mbar_init(sm90_smem_u32(&k_empty[s]), F3_CONSUMER_WARPS);
            sm90_mbar_init(sm90_smem_u32(&v_empty[s]), F3_CONSUMER_WARPS);
        }
        sm90_mbar_init_fence();
    }
    __syncthreads();

    if (wg == 0) {
        /* Producer: one thread issues every copy; the rest of the
         * warpgroup only gives its registers back. K_j and V_j go to stage
         * j % 2 once K_{j-2} (window j-2) and V_{j-2} (window j-1) have
         * been released: one window ahead of their use. */
        sm90_setmaxnreg_dec<24>();
        if (threadIdx.x == 0) {
            const int row0 = b * T;
            const int cq = h * HS, ck = C + h * HS, cv = 2 * C + h * HS;
            const uint32_t qf = sm90_smem_u32(&q_full);
            sm90_mbar_expect_tx(qf, TILE);
            for (int hh = 0; hh < HALVES; hh++) sm90_tma_2d(sQ + hh * F3_BOX_BYTES, &tm, cq + 64 * hh, row0 + q0, qf);
            for (int j = 0; j < nkv; j++) {
                const int s = j % F3_STAGES;
                const uint32_t parity = (uint32_t)(j / F3_STAGES) & 1u;
                const uint32_t kf = sm90_smem_u32(&k_full[s]), vf = sm90_smem_u32(&v_full[s]);
                sm90_mbar_wait(sm90_smem_u32(&k_empty[s]), parity ^ 1u);
                sm90_mbar_expect_tx(kf, TILE);
                for (int hh = 0; hh < HALVES; hh++)
                    sm90_tma_2d(sK + s * TILE + hh * F3_BOX_BYTES, &tm, ck + 64 * hh, row0 + j * F3_BN, kf);
                sm90_mbar_wait(sm90_smem_u32(&v_empty[s]), parity ^ 1u);
                sm90_mbar_expect_tx(vf, TILE);
                for (int hh = 0; hh < HALVES; hh++)
                    sm90_tma_2d(sV + s * TILE + hh * F3_BOX_BYTES, &tm, cv + 64 * hh, row0 + j * F3_BN, vf);
            }
        }
    } else {
        sm90_setmaxnreg_inc<240>();
        const int c = wg - 1;                       /* rows 64c..64c+63 of the block */
        const int tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31;
        const int g = lane >> 2, tg = lane & 3;
        constexpr int NT = F3_BN / 8;               /* n-tiles of S: 16 */
        float o[HS / 2];                            /* O fragment: n-tile dt in o[4dt..4dt+3] */
#pragma unroll
        for (int i = 0; i < HS / 2; i++) o[i] = 0.f;
        float m[2] = {-INFINITY, -INFINITY};        /* running max of rows g, g+8 (log2 units) */
        float l[2] = {0.f, 0.f};                    /* this thread's partial running sums */
        const uint32_t qa = sQ + (uint32_t)c * 8192u;  /* 64 rows of 128 bytes in each box */
        float sc[F3_BN / 2];                        /* S of the current tile */
        uint32_t pa[F3_BN / 16][4];                 /* P of the previous tile: wgmma's register A */

        sm90_mbar_wait(sm90_smem_u32(&q_full), 0);
        if (c == 1) sm90_bar_arrive(F3_BAR + 0, 256);  /* warpgroup 0 takes the first window */
        /* Window j: S_j = Q K_j^T (j < nkv) and O += P_{j-1} V_{j-1} (j > 0),
         * issued together; then the softmax of S_j, under the other
         * warpgroup's window. */
        for (int j = 0; j <= nkv; j++) {
            const bool has_s = j < nkv, has_pv = j > 0;
            const int s = j % F3_STAGES, ps = (j + F3_STAGES - 1) % F3_STAGES;
            if (has_s) {
#pragma unroll
                for (int i = 0; i < F3_BN / 2; i++) sc[i] = 0.f;
                sm90_mbar_wait(sm90_smem_u32(&k_full[s]), (uint32_t)(j / F3_STAGES) & 1u);
            }
            if (has_pv) sm90_mbar_wait(sm90_smem_u32(&v_full[ps]), (uint32_t)((j - 1) / F3_STAGES) & 1u);
            __syncwarp();  /* lanes leave the spins together before .aligned wgmma */
            sm90_bar_sync(F3_BAR + c, 256);  /* the other warpgroup has issued its window */
            sm90_wgmma_fence();
            if (has_s) {
                const uint32_t kt = sK + s * TILE;
#pragma unroll
                for (int ks = 0; ks < HS / 16; ks++) {
                    const uint32_t off = (uint32_t)((ks / 4) * F3_BOX_BYTES + 32 * (ks % 4));
                    sm90_wgmma_m64n128<0, 0, 0>(sc, sm90_desc(qa + off, 16, 1024), sm90_desc(kt + off, 16, 1024));
                }
            }
            if (has_pv) {
                const uint32_t vt = sV + ps * TILE;
#pragma unroll
                for (int kk = 0; kk < F3_BN / 16; kk++)
                    sm90_wgmma_rs<HS>(o, pa[kk], sm90_desc(vt + 2048u * (uint32_t)kk, F3_BOX_BYTES, 1024));
            }
            sm90_wgmma_commit();
            if (c == 0 || j < nkv) sm90_bar_arrive(F3_BAR + 1 - c, 256);  /* the other's window next */
            sm90_wgmma_wait<0>();  /* K_j, V_{j-1} and pa read: their stages may be refilled */
            sm90_fence_regs(sc);
            sm90_fence_regs(o);
            __syncwarp();
            if (lane == 0) {
                if (has_s) sm90_mbar_arrive(sm90_smem_u32(&k_empty[s]));
                if (has_pv) sm90_mbar_arrive(sm90_smem_u32(&v_empty[ps]));
            }
            if (!has_s) break;

            /* Diagonal tile: key > query -> -inf (kv0 == q0 there). */
            if (j == qb) {
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int col = nt * 8 + tg * 2 + (e & 1);
                        const int row = c * 64 + warp * 16 + g + (e >> 1) * 8;
                        if (col > row) sc[4 * nt + e] = -INFINITY;
                    }
                }
            }

            /* Online softmax, in log2 units: x = s * scale * log2(e). O holds
             * P_{j-1} V_{j-1} now, on the old max: rescaled with l. */
            float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                mx[0] = fmaxf(mx[0], fmaxf(sc[4 * nt], sc[4 * nt + 1]));
                mx[1] = fmaxf(mx[1], fmaxf(sc[4 * nt + 2], sc[4 * nt + 3]));
            }
            float alpha[2], mu[2];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
                const float mnew = fmaxf(m[r], mx[r] * scale_log2);
                mu[r] = mnew == -INFINITY ? 0.f : mnew;  /* a fully masked row: no NaN */
                alpha[r] = exp2f(m[r] - mu[r]);
                m[r] = mnew;
            }
            float rs[2] = {0.f, 0.f};
#pragma unroll
            for (int i = 0; i < F3_BN / 2; i++) {
                const int r = (i >> 1) & 1;
                sc[i] = exp2f(fmaf(sc[i], scale_log2, -mu[r]));
                rs[r] += sc[i];
            }
            l[0] = l[0] * alpha[0] + rs[0];
            l[1] = l[1] * alpha[1] + rs[1];
#pragma unroll
            for (int dt = 0; dt < HS / 8; dt++) {
                o[4 * dt] *= alpha[0];
                o[4 * dt + 1] *= alpha[0];
                o[4 * dt + 2] *= alpha[1];
                o[4 * dt + 3] *= alpha[1];
            }

            /* P_j as wgmma's register A operand for the next window: k-step
             * kk (keys 16kk..) from the S fragments of n-tiles 2kk, 2kk+1. */
#pragma unroll
            for (int kk = 0; kk < F3_BN / 16; kk++) {
                const float *c0 = sc + 8 * kk, *c1 = sc + 8 * kk + 4;
                pa[kk][0] = f3_pack(c0[0], c0[1]);
                pa[kk][1] = f3_pack(c0[2], c0[3]);
                pa[kk][2] = f3_pack(c1[0], c1[1]);
                pa[kk][3] = f3_pack(c1[2], c1[3]);
            }
        }

        /* Epilogue: full row sums, out = O / l, lse. */
#pragma unroll
        for (int r = 0; r < 2; r++) {
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
            const float inv = 1.f / l[r];
            const int t = q0 + c * 64 + warp * 16 + g + 8 * r;
            if (t >= T) continue;
            bf16 *orow = out + ((size_t)b * T + t) * C + (size_t)h * HS;
#pragma unroll
            for (int dt = 0; dt < HS / 8; dt++)
                *reinterpret_cast<__nv_bfloat162 *>(orow + dt * 8 + tg * 2) =
                    __floats2bfloat162_rn(o[4 * dt + 2 * r] * inv, o[4 * dt + 2 * r + 1] * inv);
            if (tg == 0) lse[(size_t)bh * T + t] = (m[r] + log2f(l[r])) * F3_LN2;
        }
    }
#endif
}

/* ---------------------------------------------------------------------------
 * Backward, deterministic, heads of 64 and 128 (tc_flash_backward_sm90).
 * Three kernels, the same contract and numerics as attention.cu's
 * deterministic backward (its header), on wgmma; the two wgmma kernels are
 * templates over HS (f3_bwd_kernel<DQ, HS>):
 *   f3_bwd_dot_kernel  Dvec[b,h,t] = sum_c dout[b,t,hc] out[b,t,hc], one
 *                      warp a (b, t, h);
 *   f3_bwd_dkv         (f3_bwd_kernel<false, HS>) grid (B*NH, ceil(T/128)),
 *                      384 threads: a block owns
 *                      128 keys (K and V loaded once by TMA), consumer c
 *                      keys 64c..; query tiles of 64 rows (Q and dO) from
 *                      the block's first key to T stream through a
 *                      two-stage ring. Per tile, in the transposed (key-
 *                      major) orientation, so that keys stay rows:
 *                        S^T  = K_c Q^T, dP^T = V_c dO^T   (SS, m64n64k16,
 *                               HS/16 k-steps)
 *                        P^T  = exp2(S^T scale log2e - lse log2e), masked
 *                               to 0 where query < key or query >= T
 *                        dS^T = P^T (dP^T - D)
 *                        dV  += P^T dO, dK += dS^T Q       (A from
 *                               registers, B mn-major, m64n{HS}k16)
 *                      then dqkv's k and v channels = scale dK, dV (written
 *                      as 0 + the sum, rounded once): one block owns those rows;
 *   f3_bwd_dq          (f3_bwd_kernel<true, HS>) grid (B*NH, ceil(T/128)):
 *                      a block owns 128 queries
 *                      (Q and dO loaded once), consumer c queries 64c..;
 *                      key tiles of 64 (K and V) stream through the ring:
 *                        S = Q_c K^T, dP = dO_c V^T; P, dS as above (the
 *                        mask key > query); dQ += dS K (A from registers)
 *                      then dqkv's q channels = scale dQ. No atomics: the
 *                      same bits every run.
 * Shared memory: tiles of HS channels are HS/64 TMA boxes of 64 channels
 * side by side (the forward's convention): the block's own two tiles of
 * 128 rows (boxes {64, 128}, 16 KB) and the ring's 2 stages x 2 tiles of
 * 64 rows (boxes {64, 64}, 8 KB), + 1 KB: hs 64, 2 x 16 + 4 x 8 + 1 KB =
 * 66560 B; hs 128, 2 x 32 + 4 x 16 + 1 KB = 132096 B, each kernel.
 * Descriptors: SS k-step ks (channels 16ks..) is box ks / 4 at + 32
 * (ks % 4) (own tiles' boxes 16384 apart, the ring's 8192); the register-A
 * products' B (a ring tile, mn-major) steps 16 rows (2048 B) a k-step, and
 * at hs 128 its channels 64.. are the next box, LBO 8192. Barriers as the
 * forward's (mine_full once, then full[s] / empty[s] per stage, 8
 * arrivals to free a stage after the wait_group that retired its last
 * reader). No ping-pong and no windows here: each consumer issues its
 * products and waits, the two interleaving as the schedulers find them.
 * Registers at hs 128: a dK/dV consumer keeps dK and dV (64 x 128 fp32
 * each a warpgroup: 64 + 64 floats a thread) across the loop, S^T and dP^T
 * (64 x 64: 32 + 32) while they become P^T and dS^T, and their bf16 A
 * fragments (16 + 16): ptxas fits it in 232 registers, under the 240
 * setmaxnreg gives, without spills, so the hs-64 schedule stands as it is
 * (64-key consumer slices, whole 64-row query tiles); a smaller query
 * tile would not have shrunk dK, dV, and splitting S/dP by channel halves
 * would only add waits. The dQ consumer keeps dQ (64), S and dP (32 + 32):
 * far below. */

#define F3B_TILE128 F3_BOX_BYTES     /* one box {64 channels, 128 rows} */
#define F3B_TILE64 (F3_BOX_BYTES / 2) /* one box {64 channels, 64 rows} */

/* The backward's shared memory at head size HS: OWN, a block's own tile of
 * 128 rows x HS (HS/64 boxes of F3B_TILE128, side by side); RING, a
 * streamed tile of 64 rows x HS (HS/64 boxes of F3B_TILE64); two own tiles,
 * F3_STAGES stages of two ring tiles, 1 KB for the base's alignment. */
template <int HS> struct F3BSmem {
    static constexpr int OWN = (HS / 64) * F3B_TILE128;
    static constexpr int RING = (HS / 64) * F3B_TILE64;
    static constexpr size_t SMEM = (size_t)(2 * OWN + 2 * F3_STAGES * RING + 1024);
};

/* Dvec [B,NH,T] from dout, out [B,T,C] bf16; a warp a (b, t, h), lanes over
 * the head's channels, the lanes' sums added by shuffles. */
__global__ void f3_bwd_dot_kernel(float *__restrict__ Dvec, const bf16 *__restrict__ dout,
                                  const bf16 *__restrict__ out, int B, int T, int C, int NH) {
    const size_t w = (size_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (w >= (size_t)B * T * NH) return;
    const int h = (int)(w % NH);
    const size_t bt = w / NH;  /* b*T + t */
    const int hs = C / NH;
    const bf16 *g = dout + bt * C + (size_t)h * hs, *o = out + bt * C + (size_t)h * hs;
    float acc = 0.f;
    for (int i = lane; i < hs; i += 32) acc += __bfloat162float(g[i]) * __bfloat162float(o[i]);
    acc += __shfl_xor_sync(0xffffffffu, acc, 16);
    acc += __shfl_xor_sync(0xffffffffu, acc, 8);
    acc += __shfl_xor_sync(0xffffffffu, acc, 4);
    acc += __shfl_xor_sync(0xffffffffu, acc, 2);
    acc += __shfl_xor_sync(0xffffffffu, acc, 1);
    const size_t b = bt / T, t = bt % T;
    if (lane == 0) Dvec[(b * NH + h) * T + t] = acc;
}

#if SM90_BUILD
/* dst[0..1] = (x0, x1), a bf16 pair written as 0 + x rounded once: the
 * bits of adding into zeros (tensor.h's attention_backward), nothing read. */
__device__ __forceinline__ void f3_put2(bf16 *dst, float x0, float x1) {
    *reinterpret_cast<__nv_bfloat162 *>(dst) = __floats2bfloat162_rn(0.f + x0, 0.f + x1);
}

/* The A fragments of k-steps 0..3 from a 64-wide fp32 fragment x (n-tiles
 * 2kk, 2kk+1 give k-step kk). */
__device__ __forceinline__ void f3_pack64(uint32_t (&a)[4][4], const float (&x)[32]) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        a[kk][0] = f3_pack(x[8 * kk], x[8 * kk + 1]);
        a[kk][1] = f3_pack(x[8 * kk + 2], x[8 * kk + 3]);
        a[kk][2] = f3_pack(x[8 * kk + 4], x[8 * kk + 5]);
        a[kk][3] = f3_pack(x[8 * kk + 6], x[8 * kk + 7]);
    }
}

/* The backward kernels' common prologue and producer. Thread 0 initialises
 * mine_full (the block's own two 128-row tiles: one arrival) and the
 * F3_STAGES-stage ring's full[s] (the producer's arrival) and empty[s]
 * (the consumers' warps); the caller's __syncthreads follows. */
__device__ __forceinline__ void f3_bwd_init_bars(uint64_t *mine_full, uint64_t *full, uint64_t *empty) {
    if (threadIdx.x != 0) return;
    sm90_mbar_init(sm90_smem_u32(mine_full), 1);
    for (int s = 0; s < F3_STAGES; s++) {
        sm90_mbar_init(sm90_smem_u32(&full[s]), 1);
        sm90_mbar_init(sm90_smem_u32(&empty[s]), F3_CONSUMER_WARPS);
    }
    sm90_mbar_init_fence();
}

/* The i-th streamed pair of 64-row tiles of HS channels, map0's at
 * (channel x0, row) and map1's at (x1, row), each as HS/64 boxes {64, 64}
 * (channels x0 + 64hh into box hh), into stage i % F3_STAGES of the ring
 * at sR ([STAGES][2][HS/64][64][64] bf16), once its consumers have freed
 * it, completing on full[stage]. */
template <int HS>
__device__ __forceinline__ void f3_bwd_load_stage(uint64_t *full, uint64_t *empty, uint32_t sR, int i,
                                               const CUtensorMap *map0, int x0, const CUtensorMap *map1, int x1,
                                               int row) {
    constexpr int RING = F3BSmem<HS>::RING;
    const int s = i % F3_STAGES;
    const uint32_t parity = (uint32_t)(i / F3_STAGES) & 1u, fb = sm90_smem_u32(&full[s]);
    sm90_mbar_wait(sm90_smem_u32(&empty[s]), parity ^ 1u);
    const uint32_t st = sR + s * 2 * RING;
    sm90_mbar_expect_tx(fb, 2 * RING);
#pragma unroll
    for (int hh = 0; hh < HS / 64; hh++) {
        sm90_tma_2d(st + hh * F3B_TILE64, map0, x0 + 64 * hh, row, fb);
        sm90_tma_2d(st + RING + hh * F3B_TILE64, map1, x1 + 64 * hh, row, fb);
    }
}
#endif

/* A backward consumer thread's block: its own two 128-row tiles at sA, sB
 * (f3_bwd_dkv: K, V; f3_bwd_dq: Q, dO; [HS/64][128][64] bf16 each, on
 * mine_full), the ring at sR (stage s: two [HS/64][64][64] tiles, on full[s], freed on
 * empty[s]) that streams n tiles of 64 rows from tile r0, the block's
 * first own row m0, and the thread's place: batch b, head h, bh = b NH + h,
 * consumer warpgroup c, warp, lane, g = lane / 4, tg = lane % 4. The
 * consumers' functions below exist for sm_90a alone (SM90_BUILD). */
struct F3Bwd {
    uint32_t sA, sB, sR;
    uint64_t *mine_full, *full, *empty;
    int b, h, bh, m0, r0, n, c, warp, lane, g, tg;
    uint32_t a, bo;  /* consumer c's 64 rows of sA, sB (in box 0; box hh at + F3B_TILE128 hh) */
    int row;         /* this thread's own rows: row, row + 8 (m0 + 64c + 16 warp + g) */
};

#if SM90_BUILD
/* A consumer's two SS products of one ring stage, x = A0 B0^T and
 * y = A1 B1^T (x, y: m64n64 fp32 fragments), contracted over HS channels,
 * from zero, once the stage's full barrier has completed phase parity.
 * a0, a1: a consumer's 64 rows of an own tile (box hh, channels 64hh..,
 * at + F3B_TILE128 hh); b0, b1: ring tiles of 64 rows (box hh at
 * + F3B_TILE64 hh); rows of 64 channels as TMA lays them. k-step ks
 * (channels 16ks..) is box ks / 4 at + 32 (ks % 4). */
template <int HS>
__device__ __forceinline__ void f3_bwd_products(float (&x)[32], float (&y)[32], uint32_t a0, uint32_t b0,
                                                uint32_t a1, uint32_t b1, uint64_t *full, uint32_t parity) {
#pragma unroll
    for (int i = 0; i < 32; i++) x[i] = y[i] = 0.f;
    sm90_mbar_wait(sm90_smem_u32(full), parity);
    __syncwarp();
    sm90_wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < HS / 16; ks++) {
        const uint32_t oa = (uint32_t)((ks / 4) * F3B_TILE128 + 32 * (ks % 4));
        const uint32_t ob = (uint32_t)((ks / 4) * F3B_TILE64 + 32 * (ks % 4));
        sm90_wgmma_m64n64(x, sm90_desc(a0 + oa, 16, 1024), sm90_desc(b0 + ob, 16, 1024));
    }
#pragma unroll
    for (int ks = 0; ks < HS / 16; ks++) {
        const uint32_t oa = (uint32_t)((ks / 4) * F3B_TILE128 + 32 * (ks % 4));
        const uint32_t ob = (uint32_t)((ks / 4) * F3B_TILE64 + 32 * (ks % 4));
        sm90_wgmma_m64n64(y, sm90_desc(a1 + oa, 16, 1024), sm90_desc(b1 + ob, 16, 1024));
    }
    sm90_wgmma_commit();
    sm90_wgmma_wait<0>();
    sm90_fence_regs(x);
    sm90_fence_regs(y);
}


/* The consumers' write-back into dqkv [B,T,3C], head bw.h's HS channels of
 * this thread's rows t0, t0 + 8 (those < T), x and y m64n{HS} fp32 fragments:
 * KV, the k channels = scale x and the v channels = y (f3_bwd_dkv's dK,
 * dV); otherwise the q channels = scale x (f3_bwd_dq's dQ; y unread). */
template <bool KV, int HS>
__device__ __forceinline__ void f3_bwd_put_rows(bf16 *__restrict__ dqkv, const F3Bwd &bw, int t0, int T, int C,
                                                float scale, const float (&x)[HS / 2], const float (&y)[HS / 2]) {
    const size_t C3 = (size_t)3 * C;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int t = t0 + 8 * r;
        if (t >= T) continue;
        bf16 *row = dqkv + ((size_t)bw.b * T + t) * C3 + (size_t)bw.h * HS;
#pragma unroll
        for (int dt = 0; dt < HS / 8; dt++) {
            if constexpr (KV) {
                const int ch = dt * 8 + bw.tg * 2;
                f3_put2(row + C + ch, scale * x[4 * dt + 2 * r], scale * x[4 * dt + 2 * r + 1]);
                f3_put2(row + 2 * (size_t)C + ch, y[4 * dt + 2 * r], y[4 * dt + 2 * r + 1]);
            } else {
                f3_put2(row + dt * 8 + bw.tg * 2, scale * x[4 * dt + 2 * r], scale * x[4 * dt + 2 * r + 1]);
            }
        }
    }
}

/* f3_bwd_kernel<false, HS>'s consumers: the block's 128 keys (K, V)
 * against query tiles of 64 (Q, dO) from its first key to T; dqkv's k and
 * v channels = scale dK, dV (the header's f3_bwd_dkv). */
template <int HS>
__device__ __forceinline__ void f3_bwd_dkv(const F3Bwd &bw, bf16 *__restrict__ dqkv, const float *__restrict__ lse,
                                           const float *__restrict__ Dvec, int T, int C, float scale,
                                           float scale_log2) {
    constexpr int RING = F3BSmem<HS>::RING;
    const int lane = bw.lane, tg = bw.tg, key_r = bw.row;  /* this thread's keys: key_r, key_r + 8 */
    const uint32_t ka = bw.a, va = bw.bo;
    float dk[HS / 2], dv[HS / 2];
#pragma unroll
    for (int i = 0; i < HS / 2; i++) dk[i] = dv[i] = 0.f;
    const float *lrow = lse + (size_t)bw.bh * T, *drow = Dvec + (size_t)bw.bh * T;
    sm90_mbar_wait(sm90_smem_u32(bw.mine_full), 0);
    for (int it = 0; it < bw.n; it++) {
        const int s = it % F3_STAGES, q0 = (bw.r0 + it) * 64;
        const uint32_t sq = bw.sR + s * 2 * RING, so = sq + RING;
        float st[32], dpt[32];
        f3_bwd_products<HS>(st, dpt, ka, sq, va, so, &bw.full[s], (uint32_t)(it / F3_STAGES) & 1u);
        /* P^T and dS^T: rows keys, columns queries q0 + 8nt + 2tg + (e & 1) */
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
#pragma unroll
            for (int e2 = 0; e2 < 2; e2++) {
                const int q = q0 + nt * 8 + tg * 2 + e2;
                const bool in = q < T;
                const float L = in ? lrow[q] * F3_LOG2E : 0.f, D = in ? drow[q] : 0.f;
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const int i = 4 * nt + 2 * r + e2;
                    const bool ok = in && q >= key_r + 8 * r;
                    const float p = ok ? exp2f(fmaf(st[i], scale_log2, -L)) : 0.f;
                    st[i] = p;
                    dpt[i] = p * (dpt[i] - D);
                }
            }
        }
        uint32_t pp[4][4], pd[4][4];
        f3_pack64(pp, st);
        f3_pack64(pd, dpt);
        sm90_wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; kk++) sm90_wgmma_rs<HS>(dv, pp[kk], sm90_desc(so + 2048u * kk, F3B_TILE64, 1024));
#pragma unroll
        for (int kk = 0; kk < 4; kk++) sm90_wgmma_rs<HS>(dk, pd[kk], sm90_desc(sq + 2048u * kk, F3B_TILE64, 1024));
        sm90_wgmma_commit();
        sm90_wgmma_wait<0>();  /* Q, dO, pp and pd read: the stage may be refilled */
        sm90_fence_regs(dv);
        sm90_fence_regs(dk);
        __syncwarp();
        if (lane == 0) sm90_mbar_arrive(sm90_smem_u32(&bw.empty[s]));
    }
    /* dqkv's k and v channels of this thread's two keys = scale dK, dV */
    f3_bwd_put_rows<true, HS>(dqkv, bw, key_r, T, C, scale, dk, dv);
}

/* f3_bwd_kernel<true, HS>'s consumers: the block's 128 queries (Q, dO)
 * against key tiles of 64 (K, V) up to its last query; dqkv's q channels
 * = scale dQ (the header's f3_bwd_dq). */
template <int HS>
__device__ __forceinline__ void f3_bwd_dq(const F3Bwd &bw, bf16 *__restrict__ dqkv, const float *__restrict__ lse,
                                          const float *__restrict__ Dvec, int T, int C, float scale,
                                          float scale_log2) {
    constexpr int RING = F3BSmem<HS>::RING;
    float dq[HS / 2];
#pragma unroll
    for (int i = 0; i < HS / 2; i++) dq[i] = 0.f;
    const uint32_t qa = bw.a, oa = bw.bo;
    const int lane = bw.lane, tg = bw.tg, q_r = bw.row;  /* this thread's queries: q_r, q_r + 8 */
    float L[2], D[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const bool in = q_r + 8 * r < T;
        L[r] = in ? lse[(size_t)bw.bh * T + q_r + 8 * r] * F3_LOG2E : 0.f;
        D[r] = in ? Dvec[(size_t)bw.bh * T + q_r + 8 * r] : 0.f;
    }
    sm90_mbar_wait(sm90_smem_u32(bw.mine_full), 0);
    for (int j = 0; j < bw.n; j++) {
        const int s = j % F3_STAGES, kv0 = j * 64;
        const uint32_t sk = bw.sR + s * 2 * RING, sv = sk + RING;
        float sc[32], dp[32];
        f3_bwd_products<HS>(sc, dp, qa, sk, oa, sv, &bw.full[s], (uint32_t)(j / F3_STAGES) & 1u);
#pragma unroll
        for (int i = 0; i < 32; i++) {
            const int r = (i >> 1) & 1, key = kv0 + (i >> 2) * 8 + tg * 2 + (i & 1);
            const float p = key <= q_r + 8 * r ? exp2f(fmaf(sc[i], scale_log2, -L[r])) : 0.f;
            dp[i] = p * (dp[i] - D[r]);
        }
        uint32_t pd[4][4];
        f3_pack64(pd, dp);
        sm90_wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; kk++) sm90_wgmma_rs<HS>(dq, pd[kk], sm90_desc(sk + 2048u * kk, F3B_TILE64, 1024));
        sm90_wgmma_commit();
        sm90_wgmma_wait<0>();
        sm90_fence_regs(dq);
        __syncwarp();
        if (lane == 0) sm90_mbar_arrive(sm90_smem_u32(&bw.empty[s]));
    }
    /* dqkv's q channels of this thread's two queries = scale dQ */
    f3_bwd_put_rows<false, HS>(dqkv, bw, q_r, T, C, scale, dq, dq);
}
#endif

/* The backward's two kernels, one prologue and one producer, at head size
 * HS (64, 128): DQ false is f3_bwd_dkv (tq, td boxes {64, 64}, tk {64,
 * 128}: the block owns 128 keys), DQ true is f3_bwd_dq (tq, td boxes
 * {64, 128}, tk {64, 64}: the block owns 128 queries); a tile of HS
 * channels is HS/64 boxes. qkv [B*T][3C], dout [B*T][C]; dqkv [B,T,3C] =
 * the k and v channels (dkv) or the q channels (dq); lse, Dvec [B,NH,T].
 * Grid (B*NH, ceil(T/128)), 384 threads, F3BSmem<HS>::SMEM dynamic. */
template <bool DQ, int HS>
__global__ void __launch_bounds__(F3_THREADS, 1)
f3_bwd_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
              const __grid_constant__ CUtensorMap td, bf16 *__restrict__ dqkv,
              const float *__restrict__ lse, const float *__restrict__ Dvec, int T, int C, int NH,
              float scale, float scale_log2) {
#if SM90_BUILD
    constexpr int OWN = F3BSmem<HS>::OWN;
    __shared__ __align__(8) uint64_t mine_full;
    __shared__ __align__(8) uint64_t full[F3_STAGES];
    __shared__ __align__(8) uint64_t empty[F3_STAGES];
    extern __shared__ __align__(16) unsigned char f3_smem[];
    F3Bwd bw;
    const uint32_t base = (sm90_smem_u32(f3_smem) + 1023u) & ~1023u;
    bw.sA = base, bw.sB = base + OWN;  /* [HS/64][128][64] each */
    bw.sR = base + 2 * OWN;            /* stage s: [HS/64][64][64] twice */
    bw.mine_full = &mine_full, bw.full = full, bw.empty = empty;
    bw.bh = blockIdx.x, bw.b = bw.bh / NH, bw.h = bw.bh % NH;
    /* the heaviest blocks first: dkv's first key blocks, dq's last query blocks */
    const int qb = gridDim.y - 1 - blockIdx.y;                    /* dq's query block */
    bw.m0 = DQ ? qb * F3_BM : blockIdx.y * F3_BN;
    bw.r0 = DQ ? 0 : bw.m0 / 64;                                  /* dkv: query tiles from its first key */
    bw.n = DQ ? 2 * qb + 2 : (T + 63) / 64 - bw.r0;               /* dq: key tiles up to its end */
    const int wg = threadIdx.x >> 7;
    f3_bwd_init_bars(&mine_full, full, empty);
    __syncthreads();
    if (wg == 0) {
        sm90_setmaxnreg_dec<24>();
        if (threadIdx.x == 0) {
            /* channels of q, k, v in qkv; dkv owns K, V and streams Q, dO, dq the other way round */
            const int xq = bw.h * HS, xk = C + bw.h * HS, xv = 2 * C + bw.h * HS;
            const int row0 = bw.b * T;
            const uint32_t mf = sm90_smem_u32(&mine_full);
            sm90_mbar_expect_tx(mf, 2 * OWN);
            for (int hh = 0; hh < HS / 64; hh++) {
                sm90_tma_2d(bw.sA + hh * F3B_TILE128, DQ ? &tq : &tk, (DQ ? xq : xk) + 64 * hh, row0 + bw.m0, mf);
                sm90_tma_2d(bw.sB + hh * F3B_TILE128, DQ ? &td : &tk, (DQ ? xq : xv) + 64 * hh, row0 + bw.m0, mf);
            }
            for (int i = 0; i < bw.n; i++)
                f3_bwd_load_stage<HS>(full, empty, bw.sR, i, DQ ? &tk : &tq, DQ ? xk : xq, DQ ? &tk : &td, DQ ? xv : xq,
                                  row0 + (bw.r0 + i) * 64);
        }
    } else {
        sm90_setmaxnreg_inc<240>();
        const int c = wg - 1, tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31;
        const int g = lane >> 2, tg = lane & 3;
        bw.c = c, bw.warp = warp, bw.lane = lane, bw.g = g, bw.tg = tg;
        bw.a = bw.sA + (uint32_t)c * 8192u, bw.bo = bw.sB + (uint32_t)c * 8192u;
        bw.row = bw.m0 + c * 64 + warp * 16 + g;
        if constexpr (DQ)
            f3_bwd_dq<HS>(bw, dqkv, lse, Dvec, T, C, scale, scale_log2);
        else
            f3_bwd_dkv<HS>(bw, dqkv, lse, Dvec, T, C, scale, scale_log2);
    }
#endif
}

/* ---------------------------------------------------------------------------
 * Host side. */

#define F3_MAX_DEVICES 64
#define F3_CAP_KNOWN 1
#define F3_CAP_SM90A 2

/* Capability word of each device: written once, read with acquire. */
static std::atomic<int> f3_caps[F3_MAX_DEVICES];

/* Whether this device runs the sm_90a kernels (a 9.0 device and code built
 * for sm_90a; the probe's read-back happens once per device). */
static bool f3_device_ok(cudaStream_t stream) {
    int dev;
    CUDA_CHECK(cudaGetDevice(&dev));
    if (dev >= 0 && dev < F3_MAX_DEVICES) {
        const int c = f3_caps[dev].load(std::memory_order_acquire);
        if (c) return (c & F3_CAP_SM90A) != 0;
    }
    int major = 0, minor = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    int caps = F3_CAP_KNOWN;
    if (major == 9 && minor == 0) {
        int built = 0;
        f3_probe_kernel<<<1, 1, 0, stream>>>();
        if (cudaGetLastError() == cudaSuccess &&
            cudaMemcpyFromSymbolAsync(&built, f3_probe_flag, sizeof built, 0, cudaMemcpyDeviceToHost,
                                      stream) == cudaSuccess &&
            cudaStreamSynchronize(stream) == cudaSuccess) {
            if (built == 1) caps |= F3_CAP_SM90A;
        } else {
            cudaGetLastError();
        }
    }
    if (dev >= 0 && dev < F3_MAX_DEVICES) f3_caps[dev].store(caps, std::memory_order_release);
    return (caps & F3_CAP_SM90A) != 0;
}

template <int HS>
static void f3_launch(const CUtensorMap &tm, bf16 *out, float *lse, int B, int T, int C, int NH,
                      cudaStream_t st) {
    const size_t smem = F3Smem<HS>::SMEM;
    CUDA_CHECK(cudaFuncSetAttribute(f3_fwd_kernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  (int)smem));
    const float scale_log2 = (float)(F3_LOG2E / sqrt((double)HS));
    dim3 grid((unsigned)(B * NH), (unsigned)((T + F3_BM - 1) / F3_BM));
    f3_fwd_kernel<HS><<<grid, F3_THREADS, smem, st>>>(tm, out, lse, T, C, NH, scale_log2);
    LAUNCH_CHECK(f3_fwd_kernel);
}

extern "C" int tc_flash_forward_sm90(void *out, float *lse, const void *qkv, int B, int T, int C,
                                     int NH, void *stream) {
    if (NH <= 0 || C % NH != 0) {
        fprintf(stderr, "tc_flash_forward_sm90: C = %d is not a positive multiple of NH = %d\n", C, NH);
        exit(1);
    }
    const int hs = C / NH;
    if (C % 8 != 0 || (hs != 64 && hs != 128)) return -1;
    if (((uintptr_t)out & 15) || ((uintptr_t)qkv & 15)) {
        fprintf(stderr, "tc_flash_forward_sm90: buffer %p is not 16-byte aligned\n",
                ((uintptr_t)out & 15) ? out : qkv);
        exit(1);
    }
    cudaStream_t st = (cudaStream_t)stream;
    if (!f3_device_ok(st)) return -1;
    if (B <= 0 || T <= 0) return 0;
    if ((long long)B * T > 0x7fffffffLL || (T + F3_BM - 1) / F3_BM > 65535) return -1;
    CUtensorMap tm;
    if (!sm90_encode_2d(&tm, qkv, 3 * C, B * T, 64, F3_BM)) return -1;
    if (hs == 64) f3_launch<64>(tm, (bf16 *)out, lse, B, T, C, NH, st);
    else f3_launch<128>(tm, (bf16 *)out, lse, B, T, C, NH, st);
    return 0;
}

/* The backward's two wgmma kernels at head size HS on stream st, after the
 * Dvec kernel: maps q64, q128 over qkv and d64, d128 over dout (boxes
 * {64, 64} and {64, 128}); buffers as tc_flash_backward_sm90's. */
template <int HS>
static void f3_bwd_launch(const CUtensorMap &q64, const CUtensorMap &q128, const CUtensorMap &d64,
                          const CUtensorMap &d128, bf16 *dqkv, const float *lse, const float *Dvec, int B, int T,
                          int C, int NH, cudaStream_t st) {
    const size_t smem = F3BSmem<HS>::SMEM;
    const float scale = (float)(1.0 / sqrt((double)HS)), scale_log2 = (float)(F3_LOG2E / sqrt((double)HS));
    dim3 grid((unsigned)(B * NH), (unsigned)((T + F3_BM - 1) / F3_BM));
    CUDA_CHECK(cudaFuncSetAttribute(f3_bwd_kernel<false, HS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  (int)smem));
    f3_bwd_kernel<false, HS><<<grid, F3_THREADS, smem, st>>>(q64, q128, d64, dqkv, lse, Dvec, T, C, NH, scale,
                                                              scale_log2);
    LAUNCH_CHECK((f3_bwd_kernel<false, HS>));
    CUDA_CHECK(cudaFuncSetAttribute(f3_bwd_kernel<true, HS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  (int)smem));
    f3_bwd_kernel<true, HS><<<grid, F3_THREADS, smem, st>>>(q128, q64, d128, dqkv, lse, Dvec, T, C, NH, scale,
                                                             scale_log2);
    LAUNCH_CHECK((f3_bwd_kernel<true, HS>));
}

extern "C" int tc_flash_backward_sm90(void *dqkv, float *scratch, const void *dout, const void *qkv,
                                      const void *out, const float *lse, int B, int T, int C, int NH,
                                      void *stream) {
    if (NH <= 0 || C % NH != 0) {
        fprintf(stderr, "tc_flash_backward_sm90: C = %d is not a positive multiple of NH = %d\n", C, NH);
        exit(1);
    }
    const int hs = C / NH;
    if (C % 8 != 0 || (hs != 64 && hs != 128)) return -1;
    const void *ptrs[5] = {dqkv, scratch, dout, qkv, out};
    for (int i = 0; i < 5; i++)
        if ((uintptr_t)ptrs[i] & 15) {
            fprintf(stderr, "tc_flash_backward_sm90: buffer %p is not 16-byte aligned\n", ptrs[i]);
            exit(1);
        }
    cudaStream_t st = (cudaStream_t)stream;
    if (!f3_device_ok(st)) return -1;
    if (B <= 0 || T <= 0) return 0;
    if ((long long)B * T > 0x7fffffffLL || (T + F3_BM - 1) / F3_BM > 65535) return -1;
    CUtensorMap q64, q128, d64, d128;
    /* qkv [B*T][3C] and dout [B*T][C], boxes {64, 64} and {64, 128} */
    if (!sm90_encode_2d(&q64, qkv, 3 * C, B * T, 64, 64) || !sm90_encode_2d(&q128, qkv, 3 * C, B * T, 64, 128) ||
        !sm90_encode_2d(&d64, dout, C, B * T, 64, 64) || !sm90_encode_2d(&d128, dout, C, B * T, 64, 128))
        return -1;
    float *Dvec = scratch + (size_t)B * T * C;  /* [B,NH,T], where attention.cu keeps it */
    const size_t rows = (size_t)B * T * NH;
    f3_bwd_dot_kernel<<<(unsigned)((rows + 7) / 8), 256, 0, st>>>(Dvec, (const bf16 *)dout, (const bf16 *)out,
                                                                  B, T, C, NH);
    LAUNCH_CHECK(f3_bwd_dot_kernel);
    if (hs == 64) f3_bwd_launch<64>(q64, q128, d64, d128, (bf16 *)dqkv, lse, Dvec, B, T, C, NH, st);
    else f3_bwd_launch<128>(q64, q128, d64, d128, (bf16 *)dqkv, lse, Dvec, B, T, C, NH, st);
    return 0;
}
