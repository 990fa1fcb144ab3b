/* attention.cu: fused causal self-attention on bf16 tensor cores
 * (FlashAttention-2 style), forward and backward, behind tc.h's
 * tc_flash_forward / tc_flash_backward; and the same kernels for one step
 * of context parallelism's ring (cp.c), tc_flash_pair_forward / _backward.
 *
 * What it computes. One transformer block's attention, exactly the contract
 * of ops.c's attention_forward / attention_backward: for batch b, head h and
 * query position t,
 *     s[t2]  = q_t . k_t2 / sqrt(hs)                     for t2 <= t
 *     out_t  = sum_t2 softmax(s)[t2] v_t2                (heads side by side)
 *     lse_t  = log sum_t2 exp(s[t2])                     (natural log)
 * The plain-C reference materialises the T x T matrix att [B,NH,T,T]; here
 * it is never stored. Each thread block keeps one tile of scores in
 * registers, turns it into probabilities with an online (running) softmax,
 * and multiplies it straight into the output. Backward recomputes the
 * probabilities from q, k and the saved lse instead of reading them.
 *
 * Buffers (all device memory; bf16 is CUDA's __nv_bfloat16):
 *   qkv   [B,T,3C]  bf16, row stride 3C: q at channel h*hs, k at C + h*hs,
 *                   v at 2C + h*hs (hs = C/NH).
 *   out   [B,T,C]   bf16, written by forward.
 *   lse   [B,NH,T]  fp32, written by forward, read by backward.
 *   dout  [B,T,C]   bf16, the gradient of out.
 *   dqkv  [B,T,3C]  bf16, WRITTEN by backward (every element, as 0 + the
 *                   gradient: the bits of adding into zeros), same layout as qkv.
 *   scratch         fp32, tc_flash_scratch_floats(B,T,C,NH) elements:
 *     dqacc [B,T,C]   the fp32 dQ accumulator (unscaled: the 1/sqrt(hs)
 *                     is applied when it is written into dqkv), zeroed here
 *                     on every call;
 *     Dvec  [B,NH,T]  D_t = sum_c dout[t,c] out[t,c] over the head's channels.
 *
 * Tiling, forward (fa_fwd_kernel<HS>). Grid (B*NH, ceil(T/64)); a block of
 * 4 warps (128 threads) owns 64 query rows of one (b,h), each warp 16 rows.
 * Query blocks are issued last-first, so the blocks with the most key tiles
 * start first. Key/value tiles of 64 rows stream through shared memory,
 * double-buffered with cp.async: tile j+1 is in flight while tile j is used.
 * Per tile and warp:
 *     S  = Q_w K_j^T      16 x 64, fp32, in registers (8 mma n-tiles)
 *     online softmax      running max m and sum l per row; O rescaled
 *     O += P V_j          P rounded to bf16 in registers (the C fragment of
 *                         S re-read as the A fragment of P, no shared memory)
 * At the end O / l is written as bf16 through shared memory (16-byte stores)
 * and lse = m + ln(l).
 *
 * Tiling, backward. Three kernels:
 *   fa_bwd_dot_kernel   one warp per (b,t,h): Dvec, and zeroes that row of
 *                       dqacc;
 *   fa_bwd_kernel<HS>   grid (B*NH, ceil(T/64)); a block of 4 warps owns 64
 *                       keys of one (b,h), each warp 16 keys. K and V stay in
 *                       shared memory; query blocks of BQ rows (64, or 32 for
 *                       hs 128 to bound registers) from the diagonal to T
 *                       stream through, double-buffered with cp.async
 *                       (Q, dout, lse, Dvec). Per query block and warp, all
 *                       in the transposed (key-major) orientation, so that
 *                       the warp's products keep keys as rows:
 *                         dP^T = V_w dO^T              16 x BQ, fp32
 *                         S^T  = K_w Q^T               16 x BQ, fp32
 *                         P^T  = exp(S^T scale - lse)  masked to 0
 *                         dS^T = P^T (dP^T - D)        (fp32 P^T, in place)
 *                         dV  += P^T dO                (P^T bf16 as A operand)
 *                         dK  += dS^T Q                (dS^T bf16 as A operand)
 *                       (dP^T first, so that the fp32 P^T dies as soon as
 *                       dS^T is formed and only its bf16 fragments live on:
 *                       that took hs 64 from 255 registers with spills to
 *                       232 without.)
 *                       dS^T goes to shared memory (bf16) and the block
 *                       computes dQ_blk = dS K (BQ x hs, each warp a 16-row
 *                       by hs or hs/2 slice), added into dqacc with fp32
 *                       atomicAdd. dK (times scale) and dV are written into
 *                       dqkv (0 + the sum, rounded once to bf16) from
 *                       registers at the end: one block owns those rows and
 *                       channels, so there is no race.
 *   fa_bwd_dq_kernel    dqkv[.., q channels] = bf16(0 + scale * dqacc).
 * Because dQ is summed with atomics, the order of its float additions varies
 * from run to run: this backward's dq is NOT bitwise reproducible
 * (differences of a few fp32 ulps before the bf16 rounding, so occasionally
 * one bf16 ulp). dk, dv and the whole forward are deterministic.
 *
 * Deterministic backward (tc_flash_backward's `deterministic`, train's
 * --deterministic): fa_bwd_kernel<HS, false> computes dK and dV alone, and
 * fa_bwd_dq_det_kernel<HS>, shaped as the forward (a block per 64 query
 * rows, key tiles streaming), recomputes S and dP and sums dQ = dS K in
 * registers, key tiles in order, then writes it to dqkv: no atomics and no
 * dqacc, at the price of S and dP twice (7 tile products per (key, query)
 * tile pair instead of 5).
 *
 * mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 fragments (PTX ISA,
 * "Matrix Fragments for mma.m16n8k16 with floating point type"); lane l,
 * g = l >> 2 (groupID), c = l & 3 (thread in group); a .b32 register holds
 * two bf16, the lower-indexed column in the low half:
 *   A 16x16 (row-major): a0 = A[g][2c..2c+1]     a1 = A[g+8][2c..2c+1]
 *                        a2 = A[g][2c+8..2c+9]   a3 = A[g+8][2c+8..2c+9]
 *   B 16x8  (k x n):     b0 = B[2c..2c+1][g]     b1 = B[2c+8..2c+9][g]
 *   C 16x8  (fp32):      c0,c1 = C[g][2c..2c+1]  c2,c3 = C[g+8][2c..2c+1]
 * So the C fragments of two neighbouring n-tiles (columns 16k..16k+15) hold
 * exactly the A fragment of k-step k of a following product: registers
 * {c0c1 of tile 2k, c2c3 of tile 2k, c0c1 of tile 2k+1, c2c3 of tile 2k+1}
 * packed to bf16 pairs are {a0, a1, a2, a3}. That is how P (and dS^T) feed
 * the next mma without leaving registers.
 *
 * ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16: lanes 8i..8i+7 give the
 * row addresses (16 bytes each) of 8x8 matrix i, and register i of lane l
 * receives matrix i's elements [l>>2][2(l&3)..+1] (plain) or
 * [2(l&3)..+1][l>>2] (.trans). Used as:
 *   A from a row-major [m][k] tile (Q, K_w, V_w): lane l points at row
 *     m0 + (l & 15), column k0 + 8 (l >> 4)             -> {a0,a1,a2,a3}
 *   B = X^T from a tile X stored [n][k] (K for S = QK^T, Q and dO for the
 *     backward's S^T and dP^T): row n0 + (l & 7) + 8 (l >> 4), column
 *     k0 + 8 ((l >> 3) & 1)  -> {b0,b1} of n-tile n0, {b0,b1} of n0+8
 *   B = X from a tile X stored [k][n] (V for PV, dO for dV, Q for dK, K for
 *     dQ), .trans: row k0 + (l & 7) + 8 ((l >> 3) & 1), column
 *     n0 + 8 (l >> 4)  -> {b0,b1} of n-tile n0, {b0,b1} of n0+8
 *   A = Y^T from a tile Y stored [k][m] (dS^T for dQ = dS K), .trans: row
 *     k0 + (l & 7) + 8 (l >> 4), column m0 + 8 ((l >> 3) & 1) -> {a0..a3}
 * Shared-memory rows are padded by 8 bf16 (16 bytes), so the 8 rows one
 * 8x8 matrix touches start 4 banks apart: ldmatrix and the 4-byte fragment
 * stores are free of bank conflicts without an XOR swizzle.
 *
 * Causal skipping. With 64-row query and key tiles aligned to each other,
 * forward query block qb visits key tiles 0..qb only (about half the T x T
 * work), and only tile qb, the diagonal, needs a mask (key > query -> -inf).
 * Keys >= T exist only in the last tile, which is the diagonal of the last
 * query block, so the causal mask also removes them for every real query;
 * rows >= T are computed on zero-filled data and never stored. Backward key
 * block kb visits query blocks from the one holding query 64 kb; the mask
 * (key > query, or query >= T) is applied only to query blocks that start
 * before the key block ends or that run past T.
 *
 * Chunk pairs (the ring, tc_flash_pair_*). The three tiled kernels take
 * their operands as an FaIn (q, k and v pointers with their own row
 * strides) and the rows' positions as an FaPair: n = 1 is the whole
 * sequence above (row i at position i; these calls build exactly that, and
 * compute the same bits as before the pair existed); n > 1 is a ring step,
 * rank rq's queries (qkv [B,Tl,3C]) against rank rk's block of keys and
 * values (kv [B,Tl,2C]), each rank holding chunks r and 2n-1-r of
 * tc = T/2n tokens (cp.c's cp_position), Tl = T/n. Positions grow with the
 * row on both sides, so a query's visible keys are still a prefix of the
 * key rows: a query block visits the key tiles up to the last one its last
 * row sees (fa_key_tiles; none at all for the first chunk against a later
 * rank's block), a key block the query blocks from the first that sees it
 * (fa_rows_upto), and a tile pair is masked, elementwise on positions, only
 * where it straddles (fa_straddles; n = 1: the diagonal). What changes is
 * the epilogue. Forward (RING) does not write bf16 out: each thread merges
 * its rows' partial O / l and lse_b = ln l + m into the ring's fp32 acc
 * [B,Tl,C] and lse [B,NH,Tl] by their log-sum-exp (fa_fwd_merge, cp.c's
 * merge; a row that sees no key of the block leaves them as they are).
 * Backward takes the final lse and D = dout . out from the caller (cp.c
 * computes D once a layer) and adds scale dQ into the fp32 dq [B,Tl,C] and
 * scale dK, dV into the travelling fp32 dkv [B,Tl,2C] (GO = float), with
 * fa_bwd_kernel<HS, false> and fa_bwd_dq_det_kernel: always the
 * deterministic backward, since the atomic one's dQ accumulator would need
 * a second [B,Tl,C] buffer and its bits would vary; every block owns the
 * rows it adds into, so a ring step has the same bits every run.
 *
 * Memory traffic. Forward reads Q once, K and V once per query block at or
 * after theirs (about T/128 times each for long T, against T/64 blocks),
 * writes out and lse: O(B NH T hs (T/64)) bytes, never O(T^2). Backward
 * reads K, V once, Q, dO, lse, Dvec once per key block at or before theirs,
 * and adds into the fp32 dQ accumulator with atomics (4 bytes per element
 * per key block, in L2 mostly). At GPT-2 small (T 1024) the T x T matrix
 * the reference stores is 4 MiB (fp32) per head and batch row, 48 MiB per
 * sequence and layer over 12 heads; here nothing of that size exists.
 *
 * Resources (4 warps a block; dynamic shared memory, opted in above 48 KiB
 * on every call; registers as ptxas of CUDA 13.0 reports for sm_90a, with
 * the positions of the chunk pairs in; none of them spills):
 *   forward  hs 32: 25600 B,  96 regs | hs 64: 46080 B, 129 regs |
 *            hs 128: 87040 B, 228 regs; a ring step (the merge):
 *            100 | 136 | 229 regs
 *   backward hs 32: 40960 B, 158 regs | hs 64: 65536 B, 238 regs |
 *            hs 128 (BQ 32): 75264 B, 255 regs; without dQ
 *            (deterministic, and a ring step): 158 | 231 | 249 regs
 *   deterministic dQ hs 32: 30720 B, 128 regs | hs 64: 55296 B, 166 regs |
 *            hs 128: 104448 B, 240 regs (a ring step 239)
 * On sm_80 the ring's hs 64 forward spills 12 B (where: not examined);
 * nothing else does. Before the pairs, on sm_90a: forward 96 (12 B
 * spilled) | 128 | 237, backward 159 | 232 | 255 (24 B spilled), without
 * dQ 164 | 229 | 245, deterministic dQ 126 | 166 | 246.
 *
 * Numerical contract. Inputs bf16. Dot products accumulate in fp32 on the
 * tensor cores. The softmax statistics (max m, sum l, lse, Dvec) and the
 * O, dK, dV, dQ accumulators are fp32. Exponentials use exp2f with log2(e)
 * folded into the scale (the stored lse is converted back to natural log).
 * P (forward and backward) and dS are rounded to bf16 once, to be mma
 * operands; l sums the unrounded fp32 P. Outputs are rounded to bf16 once:
 * out = bf16(O / l); dqkv = bf16(0 + gradient), in fp32 then rounded once.
 * Dvec uses the bf16 out the forward wrote (as FlashAttention-2 does).
 *
 * Requirements. tc_flash_* (the pair calls too) return -1, writing
 * nothing, exactly when C % 8 != 0 or hs = C/NH is not in {32, 64, 128}:
 * that is the predicate
 * kernels.cu uses to size the attention state (lse here, probabilities for
 * its fallback), so no other condition may send the caller to the
 * fallback. Everything else is a caller bug and exits with a message:
 * NH <= 0 or C % NH != 0, or a qkv/out/dout/dqkv/scratch pointer that is
 * not 16-byte aligned (the 16-byte cp.async and stores need it; dev_alloc
 * gives 256 and every [B,T,C]-strided slice of it keeps 16 when C % 8 == 0).
 * The pair calls also exit on a T, N, r, s that is no chunk pair (T a
 * multiple of 2N, 0 <= r, s < N) and on fp32 buffers not 8-byte aligned.
 * A device older than sm_80 fails at the launch ("no kernel image"), which
 * is checked. Any T >= 1 and B >= 1 (B or T <= 0: nothing to do, 0):
 * loads beyond T are zero-filled by cp.async, stores beyond T are skipped.
 *
 * Every CUDA call and launch is checked; a failure prints
 * "CUDA error: <call> at <file>:<line>: <reason>" and exits. No global
 * mutable state: the dynamic shared-memory limit is set on every call.
 */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <math.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>

extern "C" {
#include "tc.h"
}

typedef __nv_bfloat16 bf16;

#include "cuda_check.cuh"

/* ---------------------------------------------------------------------------
 * Tile sizes. */

#define FA_THREADS 128  /* 4 warps */
#define FA_BKV 64       /* keys per tile (forward) / per block (backward) */
#define FA_BQF 64       /* query rows per block (forward) */
#define FA_LOG2E 1.4426950408889634f
#define FA_LN2 0.6931471805599453f

/* Padded shared-memory row of a [rows][HS] bf16 tile, in elements. */
template <int HS> struct FaTile {
    static constexpr int LD = HS + 8;
};

/* Forward shared memory: Q [64][LD], K [2][64][LD], V [2][64][LD]. */
template <int HS> struct FaFwd {
    static constexpr int LD = FaTile<HS>::LD;
    static constexpr int TILE = 64 * LD;  /* elements of one 64-row tile */
    static constexpr size_t SMEM = (size_t)5 * TILE * sizeof(bf16);
};

/* Backward: BQ query rows per step (64, or 32 for hs 128 so that the dK
 * and dV accumulators (hs/2 fp32 registers each per thread) plus S^T and
 * dP^T (BQ/2 each) fit in 255 registers). Shared:
 * K [64][LD], V [64][LD], Q [2][BQ][LD], dO [2][BQ][LD],
 * dS^T [64][BQ + 8] bf16, lse [2][BQ], D [2][BQ] fp32. */
template <int HS> struct FaBwd {
    static constexpr int BQ = HS <= 64 ? 64 : 32;
    static constexpr int LD = FaTile<HS>::LD;
    static constexpr int LDS = BQ + 8;
    static constexpr int KV_TILE = 64 * LD;
    static constexpr int Q_TILE = BQ * LD;
    static constexpr size_t SMEM_BF16 = (size_t)(2 * KV_TILE + 4 * Q_TILE + 64 * LDS);
    static constexpr size_t SMEM = SMEM_BF16 * sizeof(bf16) + (size_t)4 * BQ * sizeof(float);
    /* dQ = dS K: the 4 warps split BQ/16 row tiles x DSPLIT column slices. */
    static constexpr int MT = BQ / 16;
    static constexpr int DSPLIT = 4 / MT;
    static constexpr int DW = HS / DSPLIT;
    static_assert(MT * DSPLIT == 4 && DW % 16 == 0, "dQ split must cover the 4 warps");
    static_assert(2 * BQ <= FA_THREADS, "one thread per lse / Dvec entry");
};

/* ---------------------------------------------------------------------------
 * PTX wrappers. */

__device__ __forceinline__ uint32_t fa_smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16 bytes global -> shared; src_bytes 0 writes 16 zero bytes (src unread). */
__device__ __forceinline__ void fa_cp_async16(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}
__device__ __forceinline__ void fa_cp_async4(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}
__device__ __forceinline__ void fa_cp_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void fa_cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void fa_ldsm_x4(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}
__device__ __forceinline__ void fa_ldsm_x4_t(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

/* c[16x8] += a[16x16] b[16x8], bf16 in, fp32 accumulate. */
__device__ __forceinline__ void fa_mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Two floats -> one register of two bf16, lo in the low half. */
__device__ __forceinline__ uint32_t fa_pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    uint32_t u;
    memcpy(&u, &v, 4);
    return u;
}

/* The A fragment of k-step k built from the C fragments of n-tiles 2k, 2k+1. */
__device__ __forceinline__ void fa_c_to_a(uint32_t a[4], const float c0[4], const float c1[4]) {
    a[0] = fa_pack(c0[0], c0[1]);
    a[1] = fa_pack(c0[2], c0[3]);
    a[2] = fa_pack(c1[0], c1[1]);
    a[3] = fa_pack(c1[2], c1[3]);
}

/* acc [N/8 n-tiles][4] = Y X^T, 16 x N, fp32: Y is 16 rows (from row y0) of
 * a padded [rows][HS] shared tile at y_tile, X the first N rows of the one
 * at x_tile (A plain, B = X^T plain: the patterns in the header). The
 * backward's dP^T = V_w dO^T and S^T = K_w Q^T, and the deterministic dQ
 * kernel's S = Q_w K^T and dP = dO_w V^T. */
template <int HS, int N>
__device__ __forceinline__ void fa_mma_yxt(float (&acc)[N / 8][4], uint32_t y_tile, int y0,
                                           uint32_t x_tile, int lane) {
    constexpr int LD = FaTile<HS>::LD;
    const int a_row = lane & 15, a_col = (lane >> 4) * 8;
    const int bn_row = (lane & 7) + ((lane >> 4) << 3), bn_col = ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int i = 0; i < N / 8; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < HS / 16; ks++) {
        uint32_t ya[4];
        fa_ldsm_x4(ya, y_tile + (uint32_t)(((y0 + a_row) * LD + ks * 16 + a_col) * sizeof(bf16)));
#pragma unroll
        for (int np = 0; np < N / 16; np++) {
            uint32_t xf[4];
            fa_ldsm_x4(xf, x_tile + (uint32_t)(((np * 16 + bn_row) * LD + ks * 16 + bn_col) * sizeof(bf16)));
            fa_mma(acc[2 * np], ya, xf[0], xf[1]);
            fa_mma(acc[2 * np + 1], ya, xf[2], xf[3]);
        }
    }
}

/* Stages rows [r0, r0 + ROWS) of a [T][HS] bf16 slice (row stride `stride`
 * elements, starting at g) into a padded shared tile, zero-filling rows >= T.
 * One cp.async of 16 bytes per chunk; the caller commits. */
template <int HS, int ROWS>
__device__ __forceinline__ void fa_load_tile(uint32_t s_base, const bf16 *g, size_t stride, int r0,
                                             int T, int tid) {
    constexpr int CPR = HS / 8;  /* 16-byte chunks per row */
    constexpr int LD = FaTile<HS>::LD;
    static_assert(ROWS * CPR % FA_THREADS == 0, "tile chunks must split evenly over the threads");
#pragma unroll
    for (int i = 0; i < ROWS * CPR / FA_THREADS; i++) {
        int ch = tid + i * FA_THREADS;
        int r = ch / CPR, col = (ch % CPR) * 8;
        int t = r0 + r;
        bool ok = t < T;
        const bf16 *src = g + (size_t)(ok ? t : 0) * stride + col;
        fa_cp_async16(s_base + (uint32_t)((r * LD + col) * sizeof(bf16)), src, ok ? 16 : 0);
    }
}

/* ---------------------------------------------------------------------------
 * Operands and positions, shared by the three tiled kernels.
 *
 * FaIn: one call's bf16 inputs. q, k, v point at (b 0, row 0, head 0) of
 * each; a batch row holds T rows of each side, rows q_ld (queries) or
 * kv_ld (keys and values) elements apart. The whole-sequence call reads all
 * three from qkv (q_ld = kv_ld = 3C); a ring step reads q from its qkv and
 * k, v from the block that travels ([B,T,2C]: kv_ld = 2C).
 *
 * FaPair: where the rows sit in the sequence. n = 1: row i is position i
 * (today's flash attention). n > 1 (context parallelism, cp.c's
 * cp_position): rank r holds chunks r and 2n-1-r of tc = T_seq / 2n rows,
 * the queries rank rq's, the keys rank rk's. Rows past T (tile padding)
 * sit at FA_FAR, after every real key. Positions grow with the row on both
 * sides, so the keys a query sees are a prefix of the key rows and the
 * queries a key is seen by a suffix of the query rows: the causal tile
 * skipping carries over, with a mask wherever a tile pair straddles. */
struct FaIn {
    const bf16 *q, *k, *v;
    size_t q_ld, kv_ld;
    int T, C, NH;
};
struct FaPair {
    int n, rq, rk, tc;
};
#define FA_FAR 0x7fffffff

__device__ __forceinline__ int fa_pos(const FaPair &p, int rank, int i, int T) {
    if (i >= T) return FA_FAR;
    if (p.n == 1) return i;
    return i < p.tc ? rank * p.tc + i : (2 * p.n - 1 - rank) * p.tc + i - p.tc;
}
__device__ __forceinline__ int fa_qpos(const FaPair &p, int i, int T) { return fa_pos(p, p.rq, i, T); }
__device__ __forceinline__ int fa_kpos(const FaPair &p, int j, int T) { return fa_pos(p, p.rk, j, T); }

/* How many of rank's T rows sit at positions <= pos. */
__device__ __forceinline__ int fa_rows_upto(const FaPair &p, int rank, int pos, int T) {
    if (p.n == 1) return min(max(pos + 1, 0), T);
    const int lo = rank * p.tc, hi = (2 * p.n - 1 - rank) * p.tc;
    return min(max(pos - lo + 1, 0), p.tc) + min(max(pos - hi + 1, 0), p.tc);
}

/* Key tiles of 64 that query rows [q0, q0 + 64) visit: those holding a key
 * the block's last real query sees. 0 when none sees any (an invisible pair). */
__device__ __forceinline__ int fa_key_tiles(const FaPair &p, int q0, int T) {
    const int last = min(q0 + FA_BQF, T) - 1;
    return (fa_rows_upto(p, p.rk, fa_qpos(p, last, T), T) + FA_BKV - 1) / FA_BKV;
}

/* Whether key tile [k0, k0 + 64) against query rows [q0, q0 + rows) holds a
 * pair to mask: a key after the first query (keys past T are FA_FAR), or a
 * query row past T. */
__device__ __forceinline__ bool fa_straddles(const FaPair &p, int k0, int q0, int rows, int T) {
    return fa_kpos(p, k0 + FA_BKV - 1, T) > fa_qpos(p, q0, T) || q0 + rows > T;
}

/* The backward's dK, dV and dQ out of registers, by the output's type:
 * bf16, dqkv, written as bf16(0 + a s) (tensor.h: the bits of adding into
 * zeros, nothing read); fp32, a ring step's sums, p[0..1] += a[0..1] s. */
__device__ __forceinline__ void fa_put2(bf16 *p, float a0, float a1, float s) {
    *reinterpret_cast<__nv_bfloat162 *>(p) = __floats2bfloat162_rn(0.f + a0 * s, 0.f + a1 * s);
}
__device__ __forceinline__ void fa_put2(float *p, float a0, float a1, float s) {
    float2 *p2 = reinterpret_cast<float2 *>(p);
    const float2 o = *p2;
    *p2 = make_float2(o.x + a0 * s, o.y + a1 * s);
}

/* ---------------------------------------------------------------------------
 * Forward.
 * grid (B*NH, ceil(T/64)), block 128, dynamic shared memory FaFwd<HS>::SMEM.
 * RING false: out [B,T,C] bf16 and lse [B,NH,T] fp32 written (acc unused).
 * RING true (a ring step): this block's partial output and log-sum-exp
 * merged into acc [B,T,C] fp32 and lse [B,NH,T] (out unused); first: acc
 * and lse hold nothing yet. */

/* A ring step's epilogue: this thread's rows t0 and t0 + 8 (of b, h) and
 * its columns of them, the block's partial O / l with lse_b = ln(l) + m ln 2
 * (m in log2 units), merged into the running acc and lse:
 *     lse' = ln(e^lse + e^lse_b)
 *     acc  = acc e^(lse - lse') + (O / l) e^(lse_b - lse')
 * A row that sees no key of this block (l = 0) leaves both as they are
 * (first: acc 0, lse -inf). Each row's 4 lanes read its lse before its
 * lane 0 writes it. */
template <int HS>
__device__ __forceinline__ void fa_fwd_merge(float *acc, float *lse, const float (&o)[HS / 8][4],
                                             const float m[2], const float l[2], int first, int b,
                                             int h, int t0, int T, int C, int NH, int tg) {
    float lo[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int t = t0 + 8 * r;
        lo[r] = first || t >= T ? -INFINITY : lse[((size_t)b * NH + h) * T + t];
    }
    __syncwarp();
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int t = t0 + 8 * r;
        if (t >= T) continue;
        float *row = acc + ((size_t)b * T + t) * C + (size_t)h * HS + tg * 2;
        float merged = lo[r], keep = 0.f, take = 0.f;
        if (l[r] > 0.f) {
            const float lb = (m[r] + log2f(l[r])) * FA_LN2;
            const float hi = fmaxf(lo[r], lb);
            merged = hi + logf(expf(lo[r] - hi) + expf(lb - hi));
            keep = expf(lo[r] - merged);
            take = expf(lb - merged) / l[r];
        } else if (!first) {
            continue;  /* nothing of this block: acc and lse stay */
        }
#pragma unroll
        for (int dt = 0; dt < HS / 8; dt++) {
            float2 *p = reinterpret_cast<float2 *>(row + dt * 8);
            const float2 a = first ? make_float2(0.f, 0.f) : *p;
            *p = make_float2(a.x * keep + o[dt][2 * r] * take, a.y * keep + o[dt][2 * r + 1] * take);
        }
        if (tg == 0) lse[((size_t)b * NH + h) * T + t] = merged;
    }
}

template <int HS, bool RING>
__global__ void __launch_bounds__(FA_THREADS)
    fa_fwd_kernel(bf16 *__restrict__ out, float *__restrict__ acc, float *__restrict__ lse,
                  const FaIn in, const FaPair pr, int first, float scale_log2) {
    constexpr int LD = FaFwd<HS>::LD;
    constexpr int TILE = FaFwd<HS>::TILE;
    constexpr int NT = FA_BKV / 8;  /* n-tiles of S per warp: 8 */
    constexpr int DT = HS / 8;      /* n-tiles of O per warp */
    extern __shared__ __align__(16) unsigned char fa_smem[];
    bf16 *sQ = reinterpret_cast<bf16 *>(fa_smem);  /* [64][LD] */
    const uint32_t aQ = fa_smem_addr(sQ);
    const uint32_t aK = aQ + TILE * sizeof(bf16);      /* [2][64][LD] */
    const uint32_t aV = aK + 2 * TILE * sizeof(bf16);  /* [2][64][LD] */

    const int T = in.T, C = in.C, NH = in.NH;
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int qb = gridDim.y - 1 - blockIdx.y;  /* heaviest query blocks first */
    const int q0 = qb * FA_BQF;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, tg = lane & 3;
    const size_t qs = in.q_ld, ks = in.kv_ld;
    const bf16 *qbase = in.q + (size_t)b * T * qs + (size_t)h * HS;  /* q of (b, h, t=0) */
    const bf16 *kbase = in.k + (size_t)b * T * ks + (size_t)h * HS;
    const bf16 *vbase = in.v + (size_t)b * T * ks + (size_t)h * HS;

    const int nkv = fa_key_tiles(pr, q0, T);  /* n = 1: qb + 1 */
    if (nkv > 0) {
        fa_load_tile<HS, 64>(aQ, qbase, qs, q0, T, tid);
        fa_load_tile<HS, 64>(aK, kbase, ks, 0, T, tid);
        fa_load_tile<HS, 64>(aV, vbase, ks, 0, T, tid);
        fa_cp_commit();
    }
    /* this thread's query rows g and g + 8 of the warp: their positions */
    const int qp[2] = {fa_qpos(pr, q0 + warp * 16 + g, T), fa_qpos(pr, q0 + warp * 16 + g + 8, T)};

    uint32_t qf[HS / 16][4];  /* this warp's 16 query rows as A fragments */
    float o[DT][4];
#pragma unroll
    for (int i = 0; i < DT; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m[2] = {-INFINITY, -INFINITY};  /* running max of rows g, g+8 (log2 units) */
    float l[2] = {0.f, 0.f};              /* this thread's partial running sums */

    /* lane offsets of the ldmatrix patterns (see the header) */
    const int a_row = lane & 15, a_col = (lane >> 4) * 8;                     /* A, plain */
    const int bn_row = (lane & 7) + ((lane >> 4) << 3), bn_col = ((lane >> 3) & 1) * 8; /* B=X^T */
    const int bt_row = (lane & 7) + (((lane >> 3) & 1) << 3), bt_col = (lane >> 4) * 8; /* B=X, .trans */

    for (int j = 0; j < nkv; j++) {
        const int buf = j & 1;
        if (j + 1 < nkv) {
            const uint32_t nb = (uint32_t)((buf ^ 1) * TILE * sizeof(bf16));
            fa_load_tile<HS, 64>(aK + nb, kbase, ks, (j + 1) * FA_BKV, T, tid);
            fa_load_tile<HS, 64>(aV + nb, vbase, ks, (j + 1) * FA_BKV, T, tid);
            fa_cp_commit();
            fa_cp_wait<1>();  /* everything but the tile just issued has landed */
        } else {
            fa_cp_wait<0>();
        }
        __syncthreads();
        if (j == 0) {
#pragma unroll
            for (int ks = 0; ks < HS / 16; ks++)
                fa_ldsm_x4(qf[ks], aQ + (uint32_t)(((warp * 16 + a_row) * LD + ks * 16 + a_col) *
                                                   sizeof(bf16)));
        }
        const uint32_t kt = aK + (uint32_t)(buf * TILE * sizeof(bf16));
        const uint32_t vt = aV + (uint32_t)(buf * TILE * sizeof(bf16));

        /* S = Q K^T: 16 x 64 per warp */
        float s[NT][4];
#pragma unroll
        for (int i = 0; i < NT; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < HS / 16; ks++) {
#pragma unroll
            for (int np = 0; np < NT / 2; np++) {
                uint32_t kf[4];
                fa_ldsm_x4(kf, kt + (uint32_t)(((np * 16 + bn_row) * LD + ks * 16 + bn_col) *
                                               sizeof(bf16)));
                fa_mma(s[2 * np], qf[ks], kf[0], kf[1]);
                fa_mma(s[2 * np + 1], qf[ks], kf[2], kf[3]);
            }
        }

        /* A straddling tile (n = 1: the diagonal, j == qb): a key after
         * the query -> -inf, keys past T included. */
        if (fa_straddles(pr, j * FA_BKV, q0, FA_BQF, T)) {
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int key = j * FA_BKV + nt * 8 + tg * 2 + (e & 1);
                    if (fa_kpos(pr, key, T) > qp[e >> 1]) s[nt][e] = -INFINITY;
                }
            }
        }

        /* Online softmax, in log2 units: x = s * scale * log2(e). */
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            mx[0] = fmaxf(mx[0], fmaxf(s[nt][0], s[nt][1]));
            mx[1] = fmaxf(mx[1], fmaxf(s[nt][2], s[nt][3]));
        }
        float alpha[2], mu[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            /* the 4 lanes of a group hold one row between them */
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            float mnew = fmaxf(m[r], mx[r] * scale_log2);
            mu[r] = mnew == -INFINITY ? 0.f : mnew;  /* a fully masked row: no NaN */
            alpha[r] = exp2f(m[r] - mu[r]);
            m[r] = mnew;
        }
        float rs[2] = {0.f, 0.f};
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                s[nt][e] = exp2f(fmaf(s[nt][e], scale_log2, -mu[e >> 1]));
                rs[e >> 1] += s[nt][e];
            }
        }
        l[0] = l[0] * alpha[0] + rs[0];
        l[1] = l[1] * alpha[1] + rs[1];
#pragma unroll
        for (int dt = 0; dt < DT; dt++) {
            o[dt][0] *= alpha[0];
            o[dt][1] *= alpha[0];
            o[dt][2] *= alpha[1];
            o[dt][3] *= alpha[1];
        }

        /* O += P V: P from registers, V^T fragments by ldmatrix.trans */
#pragma unroll
        for (int kk = 0; kk < FA_BKV / 16; kk++) {
            uint32_t pa[4];
            fa_c_to_a(pa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
            for (int dp = 0; dp < HS / 16; dp++) {
                uint32_t vf[4];
                fa_ldsm_x4_t(vf, vt + (uint32_t)(((kk * 16 + bt_row) * LD + dp * 16 + bt_col) *
                                                 sizeof(bf16)));
                fa_mma(o[2 * dp], pa, vf[0], vf[1]);
                fa_mma(o[2 * dp + 1], pa, vf[2], vf[3]);
            }
        }
        __syncthreads();  /* the next iteration's prefetch overwrites this buffer's pair */
    }

    /* Epilogue: full row sums, out = O / l via this warp's 16 rows of sQ. */
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        inv[r] = 1.f / l[r];
    }
    if (RING) {
        fa_fwd_merge<HS>(acc, lse, o, m, l, first, b, h, q0 + warp * 16 + g, T, C, NH, tg);
    } else {
#pragma unroll
        for (int dt = 0; dt < DT; dt++) {
#pragma unroll
            for (int r = 0; r < 2; r++) {
                __nv_bfloat162 v = __floats2bfloat162_rn(o[dt][2 * r] * inv[r], o[dt][2 * r + 1] * inv[r]);
                *reinterpret_cast<__nv_bfloat162 *>(sQ + (warp * 16 + g + 8 * r) * LD + dt * 8 + tg * 2) = v;
            }
        }
        __syncwarp();
        constexpr int CPR = HS / 8;
#pragma unroll
        for (int i = 0; i < 16 * CPR / 32; i++) {
            int ch = lane + i * 32;
            int r = ch / CPR, col = (ch % CPR) * 8;
            int t = q0 + warp * 16 + r;
            if (t < T)
                *reinterpret_cast<uint4 *>(out + ((size_t)b * T + t) * C + (size_t)h * HS + col) =
                    *reinterpret_cast<const uint4 *>(sQ + (warp * 16 + r) * LD + col);
        }
        if (tg == 0) {
#pragma unroll
            for (int r = 0; r < 2; r++) {
                int t = q0 + warp * 16 + g + 8 * r;
                if (t < T) lse[(size_t)bh * T + t] = (m[r] + log2f(l[r])) * FA_LN2;
            }
        }
    }
}

/* ---------------------------------------------------------------------------
 * Backward, step 1: Dvec[b,h,t] = sum_c dout[b,t,h*hs+c] out[b,t,h*hs+c]
 * (fp32), and dqacc[b,t,h*hs .. h*hs+hs) = 0 (unless dqacc is NULL: the
 * deterministic backward has none). One warp per (b, t, h), rows
 * ordered (b, t, h) so that neighbouring warps read neighbouring memory.
 * grid ceil(B*T*NH / 8), block 256. */
static __global__ void __launch_bounds__(256)
    fa_bwd_dot_kernel(float *__restrict__ Dvec, float *__restrict__ dqacc,
                      const bf16 *__restrict__ dout, const bf16 *__restrict__ out, int B, int T,
                      int C, int NH) {
    const size_t row = (size_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= (size_t)B * T * NH) return;
    const int hs = C / NH;
    const int h = (int)(row % NH);
    const size_t bt = row / NH;  /* b*T + t */
    const int t = (int)(bt % T), b = (int)(bt / T);
    const size_t off = bt * C + (size_t)h * hs;
    const __nv_bfloat162 *g2 = reinterpret_cast<const __nv_bfloat162 *>(dout + off);
    const __nv_bfloat162 *o2 = reinterpret_cast<const __nv_bfloat162 *>(out + off);
    float acc = 0.f;
    for (int p = lane; p < hs / 2; p += 32) {
        float2 gv = __bfloat1622float2(g2[p]);
        float2 ov = __bfloat1622float2(o2[p]);
        acc = fmaf(gv.x, ov.x, fmaf(gv.y, ov.y, acc));
    }
    if (dqacc)
        for (int i = lane; i < hs; i += 32) dqacc[off + i] = 0.f;
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, d);
    if (lane == 0) Dvec[((size_t)b * NH + h) * T + t] = acc;
}

/* Backward, step 2: one block per (b, h, 64-key block).
 * grid (B*NH, ceil(T/64)), block 128, dynamic shared memory FaBwd<HS>::SMEM.
 * dk, dv: (b 0, row 0, head 0) of the key and value gradients, rows dkv_ld
 * apart (fa_put2: GO bf16, dqkv's k and v channels, dkv_ld 3C, written;
 * GO float, a ring step's fp32 dkv, dkv_ld 2C, accumulated). dqacc
 * [B,T,C] fp32 (atomics; DQ false: unused, dQ is fa_bwd_dq_det_kernel's),
 * Dvec [B,NH,T], dout [B,T,C], lse [B,NH,T]; q, k, v as `in` says. */
template <int HS, bool DQ, typename GO>
__global__ void __launch_bounds__(FA_THREADS)
    fa_bwd_kernel(GO *__restrict__ dk_out, GO *__restrict__ dv_out, size_t dkv_ld,
                  float *__restrict__ dqacc, const float *__restrict__ Dvec,
                  const bf16 *__restrict__ dout, const FaIn in, const FaPair pr,
                  const float *__restrict__ lse, float scale, float scale_log2) {
    typedef FaBwd<HS> P;
    constexpr int BQ = P::BQ, LD = P::LD, LDS = P::LDS;
    constexpr int QN = BQ / 8;  /* n-tiles of S^T, dP^T per warp */
    constexpr int DT = HS / 8;  /* n-tiles of dK, dV per warp */
    extern __shared__ __align__(16) unsigned char fa_smem[];
    bf16 *sK = reinterpret_cast<bf16 *>(fa_smem);  /* [64][LD] */
    bf16 *sV = sK + P::KV_TILE;                    /* [64][LD] */
    bf16 *sQ = sV + P::KV_TILE;                    /* [2][BQ][LD] */
    bf16 *sdO = sQ + 2 * P::Q_TILE;                /* [2][BQ][LD] */
    bf16 *sdS = sdO + 2 * P::Q_TILE;               /* [64][LDS], dS^T */
    float *sL = reinterpret_cast<float *>(sdS + 64 * LDS);  /* [2][BQ] lse */
    float *sD = sL + 2 * BQ;                                /* [2][BQ] Dvec */
    const uint32_t aK = fa_smem_addr(sK), aV = fa_smem_addr(sV), aQ = fa_smem_addr(sQ),
                   adO = fa_smem_addr(sdO), adS = fa_smem_addr(sdS), aL = fa_smem_addr(sL),
                   aD = fa_smem_addr(sD);

    const int T = in.T, C = in.C, NH = in.NH;
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int kv0 = blockIdx.y * FA_BKV;  /* block 0 has the most query blocks: first */
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, tg = lane & 3;
    const size_t qs = in.q_ld, ks = in.kv_ld;
    const bf16 *qbase = in.q + (size_t)b * T * qs + (size_t)h * HS;
    const bf16 *obase = dout + (size_t)b * T * C + (size_t)h * HS;
    const float *lrow = lse + (size_t)bh * T;
    const float *drow = Dvec + (size_t)bh * T;

    /* the query blocks from the one holding the first query that sees key
     * kv0 (n = 1: query kv0) to the end */
    const int first_q = fa_rows_upto(pr, pr.rq, fa_kpos(pr, kv0, T) - 1, T);
    const int qb0 = first_q / BQ, nqb = (T + BQ - 1) / BQ;

    /* Q, dO, lse, Dvec of query block qb into buffer bufi. */
    auto load_q = [&](int qb, int bufi) {
        const int r0 = qb * BQ;
        fa_load_tile<HS, BQ>(aQ + (uint32_t)(bufi * P::Q_TILE * sizeof(bf16)), qbase, qs, r0, T,
                             tid);
        fa_load_tile<HS, BQ>(adO + (uint32_t)(bufi * P::Q_TILE * sizeof(bf16)), obase, (size_t)C,
                             r0, T, tid);
        if (tid < 2 * BQ) {
            const int i = tid % BQ, t = r0 + i;
            const bool ok = t < T;
            const float *src = (tid < BQ ? lrow : drow) + (ok ? t : 0);
            const uint32_t dst = (tid < BQ ? aL : aD) + (uint32_t)((bufi * BQ + i) * sizeof(float));
            fa_cp_async4(dst, src, ok ? 4 : 0);  /* rows >= T: 0 (finite) */
        }
    };

    fa_load_tile<HS, 64>(aK, in.k + (size_t)b * T * ks + (size_t)h * HS, ks, kv0, T, tid);
    fa_load_tile<HS, 64>(aV, in.v + (size_t)b * T * ks + (size_t)h * HS, ks, kv0, T, tid);
    load_q(qb0, 0);
    fa_cp_commit();

    float dk[DT][4], dv[DT][4];
#pragma unroll
    for (int i = 0; i < DT; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[i][e] = dv[i][e] = 0.f;

    const int bt_row = (lane & 7) + (((lane >> 3) & 1) << 3), bt_col = (lane >> 4) * 8;
    /* A = Y^T from [k][m] storage (.trans): row k0 + at_row, column m0 + at_col */
    const int at_row = (lane & 7) + ((lane >> 4) << 3), at_col = ((lane >> 3) & 1) * 8;

    /* this thread's keys (rows of S^T), block-local, and their positions */
    const int key_lo = warp * 16 + g;  /* and key_lo + 8 */
    const int kp[2] = {fa_kpos(pr, kv0 + key_lo, T), fa_kpos(pr, kv0 + key_lo + 8, T)};

    for (int qb = qb0, it = 0; qb < nqb; qb++, it++) {
        const int buf = it & 1;
        if (qb + 1 < nqb) {
            load_q(qb + 1, buf ^ 1);
            fa_cp_commit();
            fa_cp_wait<1>();
        } else {
            fa_cp_wait<0>();
        }
        __syncthreads();
        const int q0 = qb * BQ;
        const uint32_t qt = aQ + (uint32_t)(buf * P::Q_TILE * sizeof(bf16));
        const uint32_t ot = adO + (uint32_t)(buf * P::Q_TILE * sizeof(bf16));
        const float *lq = sL + buf * BQ;
        const float *dvq = sD + buf * BQ;

        /* dP^T = V_w dO^T, then S^T = K_w Q^T: 16 keys x BQ queries each */
        float dp[QN][4], s[QN][4];
        fa_mma_yxt<HS, BQ>(dp, aV, warp * 16, ot, lane);
        fa_mma_yxt<HS, BQ>(s, aK, warp * 16, qt, lane);

        /* P^T = exp(S^T scale - lse), 0 where key > query or query >= T;
         * dS^T = P^T (dP^T - D) in place in dp, its bf16 copy to sdS; P^T
         * kept only as bf16 A fragments (pa) for dV. */
        const bool need_mask = fa_straddles(pr, kv0, q0, BQ, T);
        uint32_t pa[BQ / 16][4];
#pragma unroll
        for (int nt = 0; nt < QN; nt++) {
            const int qc = nt * 8 + tg * 2;  /* block-local query column of e = 0, 2 */
            const float2 lv = *reinterpret_cast<const float2 *>(lq + qc);
            const float2 dd = *reinterpret_cast<const float2 *>(dvq + qc);
            const float l0 = lv.x * FA_LOG2E, l1 = lv.y * FA_LOG2E;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float p = exp2f(fmaf(s[nt][e], scale_log2, -((e & 1) ? l1 : l0)));
                if (need_mask) {
                    const int query = q0 + qc + (e & 1);
                    if (kp[e >> 1] > fa_qpos(pr, query, T) || query >= T) p = 0.f;
                }
                s[nt][e] = p;
                dp[nt][e] = p * (dp[nt][e] - ((e & 1) ? dd.y : dd.x));
            }
            if (DQ) {
                *reinterpret_cast<uint32_t *>(sdS + key_lo * LDS + qc) = fa_pack(dp[nt][0], dp[nt][1]);
                *reinterpret_cast<uint32_t *>(sdS + (key_lo + 8) * LDS + qc) = fa_pack(dp[nt][2], dp[nt][3]);
            }
            if (nt & 1) fa_c_to_a(pa[nt >> 1], s[nt - 1], s[nt]);
        }

        /* dV += P^T dO */
#pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++) {
#pragma unroll
            for (int d2 = 0; d2 < HS / 16; d2++) {
                uint32_t of[4];
                fa_ldsm_x4_t(of, ot + (uint32_t)(((kk * 16 + bt_row) * LD + d2 * 16 + bt_col) *
                                                 sizeof(bf16)));
                fa_mma(dv[2 * d2], pa[kk], of[0], of[1]);
                fa_mma(dv[2 * d2 + 1], pa[kk], of[2], of[3]);
            }
        }

        /* dK += dS^T Q (scale applied at the end) */
#pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++) {
            uint32_t da[4];
            fa_c_to_a(da, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
            for (int dq2 = 0; dq2 < HS / 16; dq2++) {
                uint32_t qf[4];
                fa_ldsm_x4_t(qf, qt + (uint32_t)(((kk * 16 + bt_row) * LD + dq2 * 16 + bt_col) *
                                                 sizeof(bf16)));
                fa_mma(dk[2 * dq2], da, qf[0], qf[1]);
                fa_mma(dk[2 * dq2 + 1], da, qf[2], qf[3]);
            }
        }
        if (DQ) __syncthreads();  /* all of dS^T is in shared memory */

        /* dQ_blk = dS K over this block's 64 keys: warp -> (row tile mt,
         * column slice d0 .. d0 + DW), fp32 atomics into dqacc (unscaled). */
        if (DQ) {
            const int mt = warp % P::MT;
            const int d0 = (warp / P::MT) * P::DW;
            float acc[P::DW / 8][4];
#pragma unroll
            for (int i = 0; i < P::DW / 8; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < FA_BKV / 16; kk++) {
                uint32_t sa[4];
                fa_ldsm_x4_t(sa, adS + (uint32_t)(((kk * 16 + at_row) * LDS + mt * 16 + at_col) *
                                                  sizeof(bf16)));
#pragma unroll
                for (int dq2 = 0; dq2 < P::DW / 16; dq2++) {
                    uint32_t kf[4];
                    fa_ldsm_x4_t(kf, aK + (uint32_t)(((kk * 16 + bt_row) * LD + d0 + dq2 * 16 + bt_col) *
                                                     sizeof(bf16)));
                    fa_mma(acc[2 * dq2], sa, kf[0], kf[1]);
                    fa_mma(acc[2 * dq2 + 1], sa, kf[2], kf[3]);
                }
            }
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int t = q0 + mt * 16 + g + 8 * r;
                if (t < T) {
                    float *dst = dqacc + ((size_t)b * T + t) * C + (size_t)h * HS + d0 + tg * 2;
#pragma unroll
                    for (int nt = 0; nt < P::DW / 8; nt++) {
                        atomicAdd(dst + nt * 8, acc[nt][2 * r]);
                        atomicAdd(dst + nt * 8 + 1, acc[nt][2 * r + 1]);
                    }
                }
            }
        }
        __syncthreads();  /* sdS and this buffer are rewritten next iteration */
    }

    fa_cp_wait<0>();  /* a block no query sees issued loads and no loop */

    /* dK (times scale), dV out (fa_put2): this block alone owns these rows
     * and channels (bf16: written, a block no query sees writes zeros). */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int t = kv0 + key_lo + 8 * r;
        if (t >= T) continue;
        const size_t at = ((size_t)b * T + t) * dkv_ld + (size_t)h * HS + tg * 2;
#pragma unroll
        for (int nt = 0; nt < DT; nt++) {
            fa_put2(dk_out + at + nt * 8, dk[nt][2 * r], dk[nt][2 * r + 1], scale);
            fa_put2(dv_out + at + nt * 8, dv[nt][2 * r], dv[nt][2 * r + 1], 1.f);
        }
    }
}

/* Backward, deterministic dQ (tc_flash_backward with `deterministic`): one
 * block per (b, h, 64-query block), shaped as the forward. Key/value tiles
 * 0..qb stream through shared memory, double-buffered with cp.async, and
 * per tile and warp (16 query rows):
 *     S  = Q_w K^T,  dP = dO_w V^T      16 x 64 each, fp32
 *     P  = exp(S scale - lse)           0 where key > query (diagonal tile)
 *     dS = P (dP - D)                   fp32, in place in S
 *     dQ += dS K                        dS rounded to bf16 as the A operand
 * then dqkv[q channels] = bf16(0 + scale dQ) straight from registers. Each dQ
 * element is summed by one thread, key tiles in order: the same bits every
 * run. The price is S and dP computed a second time (fa_bwd_kernel<HS,
 * false> computes them too, for dK and dV): 7 tile products a (key, query)
 * tile pair instead of 5, and no atomics.
 * grid (B*NH, ceil(T/64)), block 128, dynamic shared memory FaDq<HS>::SMEM:
 * Q [64][LD], dO [64][LD], K [2][64][LD], V [2][64][LD]. dq: (b 0, row 0,
 * head 0) of the query gradient, rows dq_ld apart (fa_put2: GO bf16, dqkv's
 * q channels, dq_ld 3C, written; GO float, a ring step's fp32 dq, dq_ld C,
 * accumulated). */
template <int HS> struct FaDq {
    static constexpr int LD = FaTile<HS>::LD;
    static constexpr int TILE = 64 * LD;
    static constexpr size_t SMEM = (size_t)6 * TILE * sizeof(bf16);
};

template <int HS, typename GO>
__global__ void __launch_bounds__(FA_THREADS)
    fa_bwd_dq_det_kernel(GO *__restrict__ dq_out, size_t dq_ld, const float *__restrict__ Dvec,
                         const bf16 *__restrict__ dout, const FaIn in, const FaPair pr,
                         const float *__restrict__ lse, float scale, float scale_log2) {
    constexpr int LD = FaDq<HS>::LD;
    constexpr int TILE = FaDq<HS>::TILE;
    constexpr int NT = FA_BKV / 8;  /* n-tiles of S and dP per warp: 8 */
    constexpr int DT = HS / 8;      /* n-tiles of dQ per warp */
    extern __shared__ __align__(16) unsigned char fa_smem[];
    const uint32_t aQ = fa_smem_addr(fa_smem);                 /* [64][LD] */
    const uint32_t adO = aQ + TILE * sizeof(bf16);             /* [64][LD] */
    const uint32_t aK = adO + TILE * sizeof(bf16);             /* [2][64][LD] */
    const uint32_t aV = aK + 2 * TILE * sizeof(bf16);          /* [2][64][LD] */

    const int T = in.T, C = in.C, NH = in.NH;
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int qb = gridDim.y - 1 - blockIdx.y;  /* heaviest query blocks first */
    const int q0 = qb * 64;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, tg = lane & 3;
    const size_t qs = in.q_ld, ks = in.kv_ld;
    const bf16 *qbase = in.q + (size_t)b * T * qs + (size_t)h * HS;  /* q of (b, h, t=0) */
    const bf16 *kbase = in.k + (size_t)b * T * ks + (size_t)h * HS;
    const bf16 *vbase = in.v + (size_t)b * T * ks + (size_t)h * HS;
    const bf16 *obase = dout + (size_t)b * T * C + (size_t)h * HS;

    const int nkv = fa_key_tiles(pr, q0, T);  /* n = 1: qb + 1 */
    if (nkv == 0) return;                      /* no key of this block is seen: dq += 0 */
    fa_load_tile<HS, 64>(aQ, qbase, qs, q0, T, tid);
    fa_load_tile<HS, 64>(adO, obase, (size_t)C, q0, T, tid);
    fa_load_tile<HS, 64>(aK, kbase, ks, 0, T, tid);
    fa_load_tile<HS, 64>(aV, vbase, ks, 0, T, tid);
    fa_cp_commit();
    const int qp[2] = {fa_qpos(pr, q0 + warp * 16 + g, T), fa_qpos(pr, q0 + warp * 16 + g + 8, T)};

    /* lse (log2 units) and D of this thread's rows g and g + 8; rows >= T
     * get 0 (their Q and dO rows are zero-filled, so everything stays finite). */
    float lq[2], dd[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int t = q0 + warp * 16 + g + 8 * r;
        lq[r] = t < T ? lse[(size_t)bh * T + t] * FA_LOG2E : 0.f;
        dd[r] = t < T ? Dvec[(size_t)bh * T + t] : 0.f;
    }
    float dq[DT][4];
#pragma unroll
    for (int i = 0; i < DT; i++) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.f;

    const int bt_row = (lane & 7) + (((lane >> 3) & 1) << 3), bt_col = (lane >> 4) * 8; /* B=X, .trans */

    for (int j = 0; j < nkv; j++) {
        const int buf = j & 1;
        if (j + 1 < nkv) {
            const uint32_t nb = (uint32_t)((buf ^ 1) * TILE * sizeof(bf16));
            fa_load_tile<HS, 64>(aK + nb, kbase, ks, (j + 1) * FA_BKV, T, tid);
            fa_load_tile<HS, 64>(aV + nb, vbase, ks, (j + 1) * FA_BKV, T, tid);
            fa_cp_commit();
            fa_cp_wait<1>();  /* everything but the tile just issued has landed */
        } else {
            fa_cp_wait<0>();
        }
        __syncthreads();
        const uint32_t kt = aK + (uint32_t)(buf * TILE * sizeof(bf16));
        const uint32_t vt = aV + (uint32_t)(buf * TILE * sizeof(bf16));

        /* S = Q_w K^T and dP = dO_w V^T, 16 x 64 each */
        float s[NT][4], dp[NT][4];
        fa_mma_yxt<HS, FA_BKV>(s, aQ, warp * 16, kt, lane);
        fa_mma_yxt<HS, FA_BKV>(dp, adO, warp * 16, vt, lane);

        /* dS = P (dP - D), P = exp2(S scale log2(e) - lse log2(e)); a
         * straddling tile (n = 1: the diagonal, j == qb) masks key > query. */
        const bool need_mask = fa_straddles(pr, j * FA_BKV, q0, FA_BQF, T);
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float p = exp2f(fmaf(s[nt][e], scale_log2, -lq[e >> 1]));
                if (need_mask) {
                    const int key = j * FA_BKV + nt * 8 + tg * 2 + (e & 1);
                    if (fa_kpos(pr, key, T) > qp[e >> 1]) p = 0.f;
                }
                s[nt][e] = p * (dp[nt][e] - dd[e >> 1]);
            }
        }

        /* dQ += dS K: dS from registers as A, K by ldmatrix.trans */
#pragma unroll
        for (int kk = 0; kk < FA_BKV / 16; kk++) {
            uint32_t da[4];
            fa_c_to_a(da, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
            for (int d2 = 0; d2 < HS / 16; d2++) {
                uint32_t kf[4];
                fa_ldsm_x4_t(kf, kt + (uint32_t)(((kk * 16 + bt_row) * LD + d2 * 16 + bt_col) * sizeof(bf16)));
                fa_mma(dq[2 * d2], da, kf[0], kf[1]);
                fa_mma(dq[2 * d2 + 1], da, kf[2], kf[3]);
            }
        }
        __syncthreads();  /* the next iteration's prefetch overwrites this buffer's pair */
    }

    /* dq += scale dQ: this block alone owns these rows and channels (bf16:
     * read, add in fp32, round once, write). */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int t = q0 + warp * 16 + g + 8 * r;
        if (t >= T) continue;
        GO *row = dq_out + ((size_t)b * T + t) * dq_ld + (size_t)h * HS + tg * 2;
#pragma unroll
        for (int nt = 0; nt < DT; nt++) fa_put2(row + nt * 8, dq[nt][2 * r], dq[nt][2 * r + 1], scale);
    }
}

/* Backward, step 3: dqkv[b,t,c] = bf16(0 + scale * dqacc[b,t,c]) for c < C,
 * eight channels (16 bytes of dqkv, 32 of dqacc) per thread, grid-stride. */
static __global__ void __launch_bounds__(256)
    fa_bwd_dq_kernel(bf16 *__restrict__ dqkv, const float *__restrict__ dqacc, size_t rows, int C,
                     float scale) {
    const int c8 = C / 8;
    const size_t n = rows * c8;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / c8;
        const int c = (int)(i % c8) * 8;
        uint4 *pd = reinterpret_cast<uint4 *>(dqkv + r * 3 * C + c);
        const float4 *pa = reinterpret_cast<const float4 *>(dqacc + r * C + c);
        uint4 d;
        const float4 a0 = pa[0], a1 = pa[1];
        __nv_bfloat162 *d2 = reinterpret_cast<__nv_bfloat162 *>(&d);
        d2[0] = __floats2bfloat162_rn(0.f + scale * a0.x, 0.f + scale * a0.y);
        d2[1] = __floats2bfloat162_rn(0.f + scale * a0.z, 0.f + scale * a0.w);
        d2[2] = __floats2bfloat162_rn(0.f + scale * a1.x, 0.f + scale * a1.y);
        d2[3] = __floats2bfloat162_rn(0.f + scale * a1.z, 0.f + scale * a1.w);
        *pd = d;
    }
}

/* ---------------------------------------------------------------------------
 * Host side. */

/* 1 when the kernels take this shape, 0 when the caller must fall back (the
 * only -1 of tc_flash_*); exits on a shape or pointer no caller may pass. */
static int fa_usable(const char *fn, int C, int NH, const void *const *ptrs, int nptrs) {
    if (NH <= 0 || C % NH != 0) {
        fprintf(stderr, "%s: C = %d is not a positive multiple of NH = %d\n", fn, C, NH);
        exit(1);
    }
    if (C % 8 != 0 || !tc_flash_supports(C / NH)) return 0;
    for (int i = 0; i < nptrs; i++) {
        if ((uintptr_t)ptrs[i] & 15) {
            fprintf(stderr, "%s: buffer %p is not 16-byte aligned\n", fn, ptrs[i]);
            exit(1);
        }
    }
    return 1;
}

/* The whole sequence's operands: q, k, v all from qkv [B,T,3C]; row i at position i. */
static FaIn fa_in_qkv(const bf16 *qkv, int T, int C, int NH) {
    const size_t ld = (size_t)3 * C;
    return FaIn{qkv, qkv + C, qkv + 2 * (size_t)C, ld, ld, T, C, NH};
}
static const FaPair fa_whole = {1, 0, 0, 0};

/* RING false: out, lse written; true: merged into acc, lse (first: nothing there yet). */
template <int HS, bool RING>
static void fa_forward_launch(bf16 *out, float *acc, float *lse, const FaIn &in, const FaPair &pr,
                              int first, int B, cudaStream_t st) {
    const size_t smem = FaFwd<HS>::SMEM;
    CUDA_CHECK(cudaFuncSetAttribute(fa_fwd_kernel<HS, RING>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const float scale_log2 = (float)(FA_LOG2E / sqrt((double)HS));
    dim3 grid((unsigned)(B * in.NH), (unsigned)((in.T + FA_BQF - 1) / FA_BQF));
    fa_fwd_kernel<HS, RING><<<grid, FA_THREADS, smem, st>>>(out, acc, lse, in, pr, first, scale_log2);
    LAUNCH_CHECK(fa_fwd_kernel);
}

/* dqacc NULL: the deterministic backward (dK, dV by fa_bwd_kernel<HS,
 * false>, dQ by fa_bwd_dq_det_kernel); else dQ by atomics into dqacc (GO
 * bf16 only). dq (rows dq_ld apart), dk and dv (rows dkv_ld apart) are
 * dqkv's channels, written, or a ring step's fp32 sums, accumulated. */
template <int HS, typename GO>
static void fa_backward_launch(GO *dq, size_t dq_ld, GO *dk, GO *dv, size_t dkv_ld, float *dqacc,
                               const float *Dvec, const bf16 *dout, const FaIn &in,
                               const FaPair &pr, const float *lse, int B, cudaStream_t st) {
    const size_t smem = FaBwd<HS>::SMEM;
    const float scale = (float)(1.0 / sqrt((double)HS));
    const float scale_log2 = (float)(FA_LOG2E / sqrt((double)HS));
    dim3 grid((unsigned)(B * in.NH), (unsigned)((in.T + FA_BKV - 1) / FA_BKV));
    if (dqacc) {
        CUDA_CHECK(cudaFuncSetAttribute(fa_bwd_kernel<HS, true, GO>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        fa_bwd_kernel<HS, true, GO><<<grid, FA_THREADS, smem, st>>>(dk, dv, dkv_ld, dqacc, Dvec, dout,
                                                                    in, pr, lse, scale, scale_log2);
        LAUNCH_CHECK(fa_bwd_kernel);
        return;
    }
    CUDA_CHECK(cudaFuncSetAttribute(fa_bwd_kernel<HS, false, GO>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    fa_bwd_kernel<HS, false, GO><<<grid, FA_THREADS, smem, st>>>(dk, dv, dkv_ld, (float *)NULL, Dvec,
                                                                 dout, in, pr, lse, scale, scale_log2);
    LAUNCH_CHECK(fa_bwd_kernel);
    const size_t dsmem = FaDq<HS>::SMEM;
    CUDA_CHECK(cudaFuncSetAttribute(fa_bwd_dq_det_kernel<HS, GO>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dsmem));
    fa_bwd_dq_det_kernel<HS, GO><<<grid, FA_THREADS, dsmem, st>>>(dq, dq_ld, Dvec, dout, in, pr, lse,
                                                                  scale, scale_log2);
    LAUNCH_CHECK(fa_bwd_dq_det_kernel);
}

extern "C" size_t tc_flash_scratch_floats(int B, int T, int C, int NH) {
    return (size_t)B * T * C + (size_t)B * NH * T;  /* dqacc [B,T,C] + Dvec [B,NH,T] */
}

extern "C" int tc_flash_forward(void *out, float *lse, const void *qkv, int B, int T, int C, int NH,
                                void *stream) {
    const void *ptrs[2] = {out, qkv};
    if (!fa_usable("tc_flash_forward", C, NH, ptrs, 2)) return -1;
    if (B <= 0 || T <= 0) return 0;
    cudaStream_t st = (cudaStream_t)stream;
    bf16 *o = (bf16 *)out;
    const FaIn in = fa_in_qkv((const bf16 *)qkv, T, C, NH);
    switch (C / NH) {
    case 32: fa_forward_launch<32, false>(o, NULL, lse, in, fa_whole, 0, B, st); break;
    case 64: fa_forward_launch<64, false>(o, NULL, lse, in, fa_whole, 0, B, st); break;
    default: fa_forward_launch<128, false>(o, NULL, lse, in, fa_whole, 0, B, st); break;
    }
    return 0;
}

extern "C" int tc_flash_backward(void *dqkv, float *scratch, const void *dout, const void *qkv,
                                 const void *out, const float *lse, int B, int T, int C, int NH,
                                 int deterministic, void *stream) {
    const void *ptrs[5] = {dqkv, scratch, dout, qkv, out};
    if (!fa_usable("tc_flash_backward", C, NH, ptrs, 5)) return -1;
    if (B <= 0 || T <= 0) return 0;
    cudaStream_t st = (cudaStream_t)stream;
    float *dqacc = deterministic ? NULL : scratch;  /* [B,T,C], unused when deterministic */
    float *Dvec = scratch + (size_t)B * T * C; /* [B,NH,T] */
    bf16 *dx = (bf16 *)dqkv;
    const bf16 *g = (const bf16 *)dout, *o = (const bf16 *)out;
    const FaIn in = fa_in_qkv((const bf16 *)qkv, T, C, NH);
    const size_t ld = (size_t)3 * C;

    const size_t rows = (size_t)B * T * NH;
    fa_bwd_dot_kernel<<<(unsigned)((rows + 7) / 8), 256, 0, st>>>(Dvec, dqacc, g, o, B, T, C, NH);
    LAUNCH_CHECK(fa_bwd_dot_kernel);

    bf16 *dk = dx + C, *dv = dx + 2 * (size_t)C;
    switch (C / NH) {
    case 32: fa_backward_launch<32>(dx, ld, dk, dv, ld, dqacc, Dvec, g, in, fa_whole, lse, B, st); break;
    case 64: fa_backward_launch<64>(dx, ld, dk, dv, ld, dqacc, Dvec, g, in, fa_whole, lse, B, st); break;
    default: fa_backward_launch<128>(dx, ld, dk, dv, ld, dqacc, Dvec, g, in, fa_whole, lse, B, st); break;
    }

    if (deterministic) return 0;  /* dQ is in dqkv already */
    const size_t n8 = (size_t)B * T * (C / 8);
    size_t blocks = (n8 + 255) / 256;
    if (blocks > 65536) blocks = 65536;
    fa_bwd_dq_kernel<<<(unsigned)blocks, 256, 0, st>>>(dx, dqacc, (size_t)B * T, C,
                                                       (float)(1.0 / sqrt((double)(C / NH))));
    LAUNCH_CHECK(fa_bwd_dq_kernel);
    return 0;
}

/* A ring step's operands: queries from this rank's qkv [B,Tl,3C], keys and
 * values from the block in hand kv [B,Tl,2C] (k at 0, v at C); Tl = T / N;
 * the positions of cp.c's deal (chunks r and 2N-1-r of T / 2N). */
static void fa_pair_shape(const char *fn, int T, int N, int r, int s) {
    if (N < 1 || T % (2 * N) != 0 || r < 0 || r >= N || s < 0 || s >= N) {
        fprintf(stderr, "%s: T = %d, N = %d, r = %d, s = %d is not a chunk pair of a ring\n", fn, T, N,
                r, s);
        exit(1);
    }
}
static void fa_pair_aligned8(const char *fn, const float *const *ptrs, int n) {
    for (int i = 0; i < n; i++)
        if ((uintptr_t)ptrs[i] & 7) {
            fprintf(stderr, "%s: buffer %p is not 8-byte aligned\n", fn, (const void *)ptrs[i]);
            exit(1);
        }
}

extern "C" int tc_flash_pair_forward(float *acc, float *lse, const void *qkv, const void *kv, int B,
                                     int T, int C, int NH, int N, int r, int s, int first,
                                     void *stream) {
    const void *ptrs[2] = {qkv, kv};
    if (!fa_usable("tc_flash_pair_forward", C, NH, ptrs, 2)) return -1;
    fa_pair_shape("tc_flash_pair_forward", T, N, r, s);
    const float *acc8[1] = {acc};
    fa_pair_aligned8("tc_flash_pair_forward", acc8, 1);
    const int Tl = T / N;
    if (B <= 0 || Tl <= 0) return 0;
    const bf16 *x = (const bf16 *)qkv, *y = (const bf16 *)kv;
    const FaIn in = {x, y, y + C, (size_t)3 * C, (size_t)2 * C, Tl, C, NH};
    const FaPair pr = {N, r, s, T / (2 * N)};
    cudaStream_t st = (cudaStream_t)stream;
    switch (C / NH) {
    case 32: fa_forward_launch<32, true>(NULL, acc, lse, in, pr, first, B, st); break;
    case 64: fa_forward_launch<64, true>(NULL, acc, lse, in, pr, first, B, st); break;
    default: fa_forward_launch<128, true>(NULL, acc, lse, in, pr, first, B, st); break;
    }
    return 0;
}

extern "C" int tc_flash_pair_backward(float *dq, float *dkv, const void *qkv, const void *kv,
                                      const float *lse, const float *D, const void *dout, int B,
                                      int T, int C, int NH, int N, int r, int s, void *stream) {
    const void *ptrs[3] = {qkv, kv, dout};
    if (!fa_usable("tc_flash_pair_backward", C, NH, ptrs, 3)) return -1;
    fa_pair_shape("tc_flash_pair_backward", T, N, r, s);
    const float *acc8[2] = {dq, dkv};
    fa_pair_aligned8("tc_flash_pair_backward", acc8, 2);
    const int Tl = T / N;
    if (B <= 0 || Tl <= 0) return 0;
    const bf16 *x = (const bf16 *)qkv, *y = (const bf16 *)kv, *g = (const bf16 *)dout;
    const FaIn in = {x, y, y + C, (size_t)3 * C, (size_t)2 * C, Tl, C, NH};
    const FaPair pr = {N, r, s, T / (2 * N)};
    cudaStream_t st = (cudaStream_t)stream;
    const size_t dq_ld = (size_t)C, dkv_ld = (size_t)2 * C;
    float *dk = dkv, *dv = dkv + C;
    switch (C / NH) {
    case 32: fa_backward_launch<32, float>(dq, dq_ld, dk, dv, dkv_ld, NULL, D, g, in, pr, lse, B, st); break;
    case 64: fa_backward_launch<64, float>(dq, dq_ld, dk, dv, dkv_ld, NULL, D, g, in, pr, lse, B, st); break;
    default: fa_backward_launch<128, float>(dq, dq_ld, dk, dv, dkv_ld, NULL, D, g, in, pr, lse, B, st); break;
    }
    return 0;
}
