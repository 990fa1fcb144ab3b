/* matmul.cu: the bf16 GEMM of the tensor-core path, in three implementations
 * (the third in two schedules, the second of them also in clusters).
 *
 * One product, D[M,N] = A[M,K] B[K,N] (+ D) (+ bias[N] on every row), bf16
 * operands, float32 accumulation, D written as bf16 or float32 (tc.h has the
 * contract). A linear layer needs it in three layouts:
 *
 *   forward  out  = inp @ w^T      A [M][K] (k-major)   B [N][K] (k-major)
 *   dinp    += dout @ w            A [M][K] (k-major)   B [K][N] (n-major)
 *   dw      += dout^T @ inp        A [K][M] (m-major)   B [K][N] (n-major), D float32
 *
 * and every implementation takes all four combinations of a_kmajor, b_kmajor.
 *
 * TC_SIMPLE: one thread an output element, a float32 dot product in k order.
 *   Any shape, any alignment. It is the yardstick of the other two, and the
 *   fallback when a shape does not suit them.
 *
 * TC_MMA (sm_80 and later): mma.sync.m16n8k16 bf16 -> f32 fed by ldmatrix
 *   from shared memory, which a 4-stage cp.async pipeline fills.
 *   - Block tile 128 (m) x 128 (n) x 32 (k), 256 threads = 8 warps as 2 (m)
 *     x 4 (n), each warp 64 x 32: 4 m16 tiles x 4 n8 tiles, 16 mma per k16
 *     step from 4 ldmatrix.x4 of A and 2 of B, 64 float accumulators a
 *     thread: with the fragments and addresses that fits the 128 registers
 *     a thread may have when two blocks share an SM
 *     (__launch_bounds__(256, 2)), so one block's barrier stalls are
 *     covered by the other's math.
 *   - Shared memory keeps each operand tile in its global orientation, rows
 *     padded by 8 elements (16 bytes) so the 8 row addresses of one
 *     ldmatrix 8x8 matrix fall in 8 different 16-byte bank groups:
 *       k-major tile  [128 rows][32 k + 8]   row pitch  80 bytes
 *       mn-major tile [32 k][128 + 8]         row pitch 272 bytes
 *     Both fit a 128 x 40 element slot, 10240 bytes; a stage holds A and B,
 *     20480 bytes; 4 stages, 81920 bytes of dynamic shared memory (two blocks
 *     fit an SM on sm_80 (164 KB) and sm_90 (228 KB)).
 *   - Fragments: a k-major operand is loaded with plain ldmatrix (its rows
 *     are what mma's row-major A / col-major B fragments want); an mn-major
 *     operand (A stored [K][M], B stored [K][N]) with ldmatrix.trans, which
 *     hands each thread two consecutive k of one m (or n), exactly the pair a
 *     fragment register holds.
 *   - Pipeline: tiles 0..2 are issued ahead (one cp.async group each, empty
 *     groups committed past the end of K so the count stays regular); at
 *     k-tile kt a thread waits until at most 2 groups are pending (tile kt
 *     has landed), __syncthreads (everyone's copies are visible, and
 *     everyone has finished computing on the slot about to be refilled),
 *     issues tile kt+3 into slot (kt+3)%4 = (kt-1)%4, then computes slot kt%4.
 *   - Edges: every cp.async moves 16 bytes = 8 elements along the operand's
 *     contiguous dimension, so that dimension (K for a k-major operand, M or
 *     N for an mn-major one) must be a multiple of 8 and the pointers
 *     16-byte aligned. Under that, a chunk is either wholly inside the matrix
 *     or wholly outside; chunks outside (tiles that overhang M, N or K) are
 *     cp.async with src-size 0, which writes 16 zero bytes, so overhanging k
 *     adds nothing and overhanging rows compute values nobody stores.
 *
 * TC_WGMMA_COOP (sm_90a builds on a compute capability 9.0 device), the
 *   cooperative schedule: wgmma.mma_async
 *   m64n256k16 with both operands in shared memory, loaded by TMA.
 *   - Block tile 128 (m) x 256 (n) x 64 (k), 384 threads = 3 warpgroups:
 *     warpgroup 0 is the producer (setmaxnreg.dec to 40 registers; one thread
 *     issues TMA), warpgroups 1 and 2 the consumers, each owning 64 rows of
 *     the tile with 128 float accumulators a thread (setmaxnreg.inc to 232;
 *     128 x 40 + 256 x 232 = 384 x 168, the launch's register file).
 *   - A stage is A 128 x 64 (16 KB) + B 256 x 64 (32 KB) = 48 KB; 4 stages,
 *     192 KB, + 8 consumer warps' epilogue chunks of 2.5 KB (below) + 1 KB to
 *     align the base to 1024 bytes: 218112 bytes of dynamic shared memory,
 *     one block an SM.
 *   - TMA writes each box with the 128-byte swizzle (16-byte chunk index XOR
 *     row index mod 8 within 1024-byte groups of 8 rows of 128 bytes), which
 *     is the canonical 128B-swizzled layout wgmma reads through a matrix
 *     descriptor (start address, leading / stride byte offsets, swizzle
 *     mode 1). A box's inner extent is at most 128 bytes = 64 bf16 with this
 *     swizzle, hence BK = 64 and, for mn-major operands, 64-wide boxes:
 *       A k-major  [M][K]: one box {64 k, 128 m}; rows of 128 bytes (64 k),
 *                  8-row groups 1024 bytes apart (SBO 1024, LBO unused);
 *                  consumer c starts at +8192 c; k16 step j at +32 j bytes.
 *       A m-major  [K][M]: two boxes {64 m, 64 k} at m0, m0+64, 8 KB each;
 *                  consumer c takes box c; rows are k (128 bytes of 64 m),
 *                  8-k groups 1024 apart (SBO), next 64 m 8192 on (LBO, not
 *                  reached with m64); k16 step j at +2048 j; trans-a = 1.
 *       B k-major  [N][K]: one box {64 k, 256 n}; as A k-major, SBO 1024.
 *       B n-major  [K][N]: four boxes {64 n, 64 k}, 8 KB apart (LBO 8192),
 *                  8-k groups 1024 apart (SBO 1024); trans-b = 1.
 *     So all four layouts run; nothing is refused for its layout.
 *   - Pipeline: full[s] (1 arrival + transaction bytes) and empty[s] (one
 *     arrival from each of the 8 consumer warps) mbarriers per stage. A
 *     running counter `it` over (tile, k-block) gives the stage it % 4 and
 *     the phase parity (it / 4) & 1; the producer waits empty[s] on the
 *     opposite parity (a fresh barrier's "previous phase" counts as done,
 *     so the first round does not wait), arms full[s] with expect_tx 49152
 *     and issues the copies. A consumer waits full[s], issues 4 wgmma (k 64),
 *     commits, waits until only this group is in flight and then frees the
 *     previous stage, so one group of wgmma always overlaps the next wait.
 *   - Persistent grid: min(#SMs, #tiles) blocks walk the tiles t = blockIdx.x,
 *     + gridDim.x, ..., m fastest or in bands of m-tiles (below, "Tile
 *     order"; neighbouring blocks share the B tile either way); the
 *     producer runs ahead into the next tile while the consumers store, but
 *     the tensor cores idle while both consumer warpgroups store.
 *   - Split-K: dw has a small output and a long K (768 x 768 is 18
 *     tiles of 128 x 256 for 132 SMs), so with room in the caller's work
 *     buffer a work item is a (tile, part of K) pair instead, and the parts
 *     are summed afterwards in a fixed order (below, "Split-K").
 *   - Edges: TMA zero-fills whatever part of a box lies outside the tensor
 *     (and still counts the full box bytes), so overhanging tiles need no
 *     code. The tensor map needs 16-byte aligned bases and row pitches,
 *     the same rule as TC_MMA: contiguous dimensions a multiple of 8.
 *   - Tensor maps are encoded per call (one driver entry-point lookup and
 *     two cuTensorMapEncodeTiled calls: host-only work, no GPU round trip,
 *     expected to be a few microseconds in all; not measured yet) and passed
 *     as __grid_constant__ kernel parameters, so there is no cache to
 *     invalidate when buffers move. cuTensorMapEncodeTiled is a
 *     driver function: it is looked up with cudaGetDriverEntryPointByVersion
 *     (cudaGetDriverEntryPoint on toolkits 12.0-12.4, which lack it),
 *     never linked, so the binary links only cudart_static and still starts
 *     on machines without a driver.
 *
 * TC_WGMMA, the ping-pong schedule (mm_wgmma_kernel<true>; what TC_AUTO takes
 *   on sm_90a for the shorter work items, below): the next rung of the published Hopper GEMM ladder, so that
 *   one tile's epilogue runs under the next tile's math. As above (producer
 *   warpgroup, TMA, 128-byte swizzle, mbarriers, persistent grid, split-K),
 *   except:
 *   - Each consumer warpgroup owns a whole tile of 128 (m) x 128 (n): per
 *     k16 step two wgmma m64n128k16 (rows 0-63 and 64-127, the same B
 *     descriptor), each into 64 of the thread's 128 float accumulators; the
 *     block's j-th item goes to warpgroup j % 2.
 *   - A stage is A 128 x 64 (16 KB) + B 128 x 64 (16 KB: a {64 k, 128 n}
 *     box, or two {64 n, 64 k} boxes 8 KB apart, LBO 8192): 32 KB, 6
 *     stages, 192 KB; with the same epilogue chunks 218112 bytes in all.
 *     The producer fills the ring in item order; empty[s] counts the 4 warps
 *     of the one warpgroup that reads stage s, and each warpgroup counts
 *     the other's k-blocks into its ring position without waiting on them.
 *   - The math is ordered by two named barriers (bar.sync / bar.arrive,
 *     ids 1 and 2, 256 threads: the waiting warpgroup's 128 and the
 *     signalling one's 128): warpgroup c waits at barrier 1 + c before each
 *     tile but the block's first, and arrives at the other's barrier once
 *     its own mainloop has retired (wgmma.wait_group 0), just before its
 *     epilogue, if the block has a next item. So the tensor cores go from
 *     one warpgroup's mainloop straight to the other's, and each epilogue
 *     (bias, the old D, rounding, stores: all of it, not just the stores)
 *     runs while the other warpgroup computes. The ordering changes no
 *     value: only the time.
 *   - Why ping-pong and not TMA stores (cp.async.bulk.tensor shared ->
 *     global): when this was chosen the worst rows accumulated (dinp: D
 *     += ..., into zeros), so their epilogue read the old D before it
 *     could store (training now writes dinp, through the TMA stores
 *     below); a TMA store hides only the
 *     stores, while ping-pong hides the reads, the adds and the stores
 *     alike, with the same epilogue (its reads of a chunk issued before it
 *     waits: mm_wg_epilogue's PRE) and no staging buffer to guard
 *     (bench/NOTES.md, "Third round", has the arithmetic). The price:
 *     a 128 x 128 tile reads 64 flops a byte of operand against the
 *     128 x 256 tile's 85, and the two warpgroups no longer share a B tile.
 *
 * TC_WGMMA_CLUSTER, the ping-pong kernel in clusters of two CTAs along M
 *   (mm_wgmma_kernel<true, AK, BK, CL_CTAS>; never TC_AUTO's choice until a
 *   lease has timed it: bench/NOTES.md, "The wgmma GEMM in clusters"), the
 *   rung that answers the 128 x 128 tile's L2 traffic: two SMs share one B
 *   tile, so an SM reads 24 KB a k-block from L2 instead of 32.
 *   - Launch: cudaLaunchKernelEx with cudaLaunchAttributeClusterDimension
 *     {2, 1, 1}; the grid is twice the clusters that fit the device at
 *     once (cudaOccupancyMaxActiveClusters, asked once per device) or the
 *     work items, whichever is fewer.
 *   - Walk: a work item is a column of two tiles along M that share their
 *     n-tile (tiles_m counts those columns, ceil(M / 256)); cluster c
 *     (%clusterid.x) takes items c, c + clusters, ..., and CTA r
 *     (%cluster_ctarank) of it tile r of each column, its two warpgroups in
 *     ping-pong as above. Both CTAs walk the same items, so their rings
 *     stay in step. Where M is not a multiple of 256 the last column's
 *     second tile lies past M: its CTA loads the first tile's A rows
 *     instead (no TMA box wholly outside the tensor), takes part in every
 *     multicast and release, and stores nothing (rows >= M never are).
 *   - Loads: each CTA's producer loads its own A (16 KB) and half of B, 64
 *     of its 128 columns (8 KB: a {64 k, 64 n} box, tmB's k-major box here,
 *     or one {64 n, 64 k}), multicast (.multicast::cluster, mask 0b11) into
 *     both CTAs' stage at the same offset, completing on each one's full
 *     barrier; so full[s] still expects 32 KB (its A, its half, the peer's
 *     half), and the B tile lands in the layout the ping-pong kernel reads.
 *     Half each, not all from one: the producers issue equal work and the
 *     code is one path for both ranks.
 *   - Barriers: empty[s] counts 8 arrivals, this CTA's 4 consumer warps of
 *     the warpgroup reading stage s and the peer's 4, since either
 *     producer's multicast overwrites the stage in both CTAs: a warp frees
 *     a stage at its own barrier and at the peer's (mbarrier.arrive
 *     .release.cluster on the shared::cluster address from mapa). A
 *     barrier.cluster arrive + wait follows the mbarriers' init (no peer
 *     multicasts into, or arrives on, a barrier not yet initialised) and
 *     ends the kernel (no CTA exits while its peer may still write into its
 *     shared memory or arrive on its barriers).
 *   - Shared memory and split-K as the ping-pong kernel (218112 bytes;
 *     the split plan counts columns over clusters: on GPT-2's products the
 *     same parts and waves as ping-pong's tiles over SMs). Registers:
 *     ptxas (nvcc 13.0, -arch=sm_90a -Xptxas -v) gives all four cluster
 *     instantiations 168 at the launch (the consumers then raise theirs to
 *     232), no stack frame, no spills, as the ping-pong and cooperative
 *     ones. The cluster code is `if constexpr` on CL inside the same
 *     template: the other kernels' sm_90a code is byte for byte what it
 *     was before it (their cubin .text sections compared).
 *
 * TMA stores (the ping-pong and cluster kernels, mm_wgmma_kernel<true, AK,
 *   BK, CL, TS = true>; the same template, `if constexpr` on TS): where D is
 *   bf16 and written, not accumulated (the forward products: out = inp w^T
 *   + bias; never split, split-K being float32 only), D's row pitch a
 *   multiple of 16 bytes and D 16-byte aligned (the tensor map's rules, as
 *   for the loads), the epilogue (mm_wg_epilogue_tma) stages each 64-row
 *   half of the tile, bias added and rounded to bf16 in the registers, in a
 *   16 KB buffer per consumer warpgroup laid out as two {64 n, 64 m} TMA
 *   boxes with the 128-byte swizzle (bf16x2 stores, conflict-free: the 8
 *   rows of a fragment's column group land in 8 different 16-byte chunks),
 *   then after fence.proxy.async and a warpgroup barrier one thread issues
 *   cp.async.bulk.tensor.2d.global.shared::cta for each box and commits a
 *   bulk group; it waits (cp.async.bulk.wait_group.read 0) only before the
 *   buffer is written again (the next half, the next tile) and before the
 *   kernel ends. TMA clips what lies outside D (rows >= M, columns >= N),
 *   so partial tiles need no guard; boxes wholly past M or N are not
 *   issued. What it saves: the consumers' global stores (a 128 x 128 tile
 *   is 64 16-byte stores a thread after 64 shared-memory round trips
 *   through the 2.5 KB chunks) become 64 four-byte shared stores a thread
 *   and one issuing thread, and the warps no longer wait on their stores'
 *   issue; the bias reads stay (pairs, L1-resident). What it costs: the
 *   staging buffers, 2 x 16 KB in place of the 8 chunks' 20 KB: 6 stages x
 *   32 KB + 32 KB + 1 KB alignment = 230400 bytes of the 232448 an SM gives
 *   a block (PP_TS_SMEM_BYTES), so no stage goes; one block an SM either
 *   way. Products that read the old D (dinp: D += ...; float32 dw) keep
 *   mm_wg_epilogue, whose reads ping-pong already hides. ptxas (nvcc 13.0,
 *   sm_90a): the eight TS instantiations 168 registers at the launch, no
 *   stack frame, no spills, as the others.
 *
 * The GELU-backward epilogue (tc_gemm_gelu_back; every kernel, gpre
 *   non-NULL): fcproj's input gradient goes straight through GELU's
 *   derivative, D = bf16(0 + gelu'(pre) * float(bf16(0 + sum))), pre the
 *   bf16 pre-activation (fc's output) at D's place. It replaces three
 *   passes of the MLP's backward (the product's store of GELU's output
 *   gradient into a zeroed buffer, zeroing the gradient of fc's output,
 *   kernels.cu's gelu_backward) with their bits: the sum is rounded to bf16
 *   as the plain store into zeros rounds it (mm_gelu_back), widened, and
 *   put through gelu.cuh's gelu_grad, the same expression kernels.cu's
 *   elementwise pass compiles, plus the 0 that pass adds from its zeroed
 *   buffer (it only turns a -0 into +0), then rounded once. In the
 *   epilogues pre is read where an accumulating store reads the old D
 *   (mm_wg_epilogue's PRE issue, 16-byte pieces when vec; mm_store2's
 *   pairs and scalars), so the product costs what today's accumulating
 *   dinp costs (read 2 bytes, write 2 an element) and the elementwise
 *   pass (read 4, read + write 2) is gone. Never TMA stores (the TS
 *   epilogue is the written forward's; the fused product takes the
 *   ping-pong kernel's vector epilogue, whose reads ping-pong hides, as
 *   dinp does today); never split (bf16 D). TC_AUTO picks the kernel as
 *   for the plain dinp.
 *
 * fc's bias gradient from the same epilogue (tc_gemm_gelu_back's dbias;
 *   the ping-pong, cluster and cooperative kernels, mm_wg_bias_sums): the
 *   product's output dfch is fc's output gradient, so dbias[n] += sum over
 *   rows of dfch[row][n] is the column sums of what the epilogue just
 *   stored. Why the bits are today's: tc_bias_grad's split path (taken
 *   wherever N % 8 == 0, D 16-byte aligned, more than one chunk of 128
 *   rows and room for chunks x N floats in the work buffer) sums the rows
 *   in chunks of 128 (MM_BG_ROWS), each chunk's column as 8 row lanes
 *   (rows y, y + 8, ... from 0.0f) added in order 0..7, into work
 *   [chunks][N], then tc_partials_add adds the chunks in order. A wgmma
 *   tile is 128 rows at a multiple of 128, exactly one chunk, so after the
 *   tile's threads have stored its bf16 dfch they meet at a named barrier
 *   (bar.sync orders the participants' global stores before the reads:
 *   PP_BAR_EPI + c over the warpgroup's 128 threads in ping-pong, whose
 *   TMA-store epilogue, the barrier's other user, never runs the fused
 *   product; PP_BAR_BG over both consumer warpgroups' 256 in the
 *   cooperative 128 x 256 tile), and thread t sums column n0 + t of the
 *   stored tile in that order, reading the bf16 values back (from L1 / L2)
 *   and writing work [m0 / 128][n0 + t] (rows past M skipped as the split
 *   kernel skips them; the cluster's CTA whose tile lies past M writes
 *   nothing); after the kernel the same tc_partials_add, so dbias gets
 *   the very additions of tc_bias_grad(dout = dfch). The work buffer is
 *   the caller's (the Dev's scratch in training): the fused product, a
 *   bf16 D, takes no split-K or stream-K part, so nothing else holds it
 *   while the kernel runs. Where the fused path does not apply (TC_SIMPLE,
 *   TC_MMA, N % 8 != 0, D unaligned, M <= 128, no room in the work
 *   buffer: every case where tc_bias_grad takes its whole path, and the
 *   kernels without the sums) tc_bias_grad runs after the product: the
 *   same bits everywhere. What it saves: tc_bias_grad's pass over dfch
 *   (fc's: 100.7 MB read at GPT-2 124M's 16384 x 3072, a layer) and its
 *   split kernel's launch. What it costs: a second read of each stored
 *   tile, 32 KB (128 x 128 bf16) a tile, a thread 128 loads of one
 *   column, each row lane's 16 issued together (8 round trips to L2, not
 *   128), from L1 / L2 right after the stores, plus one barrier; in
 *   ping-pong that runs under the other warpgroup's mainloop where the
 *   epilogue has room (bench/NOTES.md, "fc's bias gradient from fcproj
 *   dinp's epilogue", has the prediction). bgw is a runtime pointer: no new
 *   instantiation; ptxas (nvcc 13.0, -arch=sm_90a -Xptxas -v) with the
 *   sums in: all twenty mm_wgmma_kernel instantiations still 168
 *   registers at the launch, no stack frame, no spills.
 *
 * The GELU-forward epilogue (tc_gemm_gelu; every kernel, gout non-NULL):
 *   fc's product stores its pre-activation D = bf16(sum + bias) as the
 *   plain forward does (GELU's backward reads it) and, from each stored
 *   bf16 (not the float sum), G = bf16(gelu_f(float(D))) into gout
 *   (mm_gelu_fwd): the bits of the product then kernels.cu's
 *   gelu_forward, whose pass (read 2, write 2 bytes an element) is gone
 *   for one more 2-byte store an element in the epilogue. Where it stores:
 *   the plain forward takes the TMA-store epilogue (TS) on the ping-pong
 *   and cluster kernels, whose two 16 KB staging buffers bring the block
 *   to 230400 of the 232448 bytes an SM gives; a second output through
 *   TMA would need two more (no room beside 6 stages of 32 KB: a stage
 *   would go) or a second pass through the same buffer per half (the
 *   second store's staging waiting on wait_group.read of the first, so
 *   half the epilogue no longer overlaps its stores). So this product
 *   alone takes the vector epilogue (mm_wg_epilogue: the 8 warps' 2.5 KB
 *   chunks, PP_SMEM_BYTES, 16-byte stores of both outputs), whose work
 *   ping-pong hides under the other warpgroup's math as it hides dinp's;
 *   the plain forward keeps TS. bench's "fc fwd+gelu" row against "fc
 *   fwd" says what that costs. Under --recompute-mode gelu the forward
 *   still fuses (its fchg slot is written and read by fcproj as before);
 *   backward's recompute of fchg stays gelu_forward from the kept fch.
 *   ptxas (nvcc 13.0, -arch=sm_90a -Xptxas -v) with both GELU epilogues
 *   in: all twenty mm_wgmma_kernel instantiations still 168 registers at
 *   the launch, no stack frame, no spills; mm_mma_kernel 120-127 (of the
 *   128 that __launch_bounds__(256, 2) allows), no spills;
 *   mm_simple_kernel 34. The GELU code sits behind runtime pointers
 *   (gpre, gout): one kernel per layout, no new instantiation.
 *
 * Tile order (the three wgmma kernels): a persistent block walks items
 *   blockIdx.x + j gridDim.x, so a wave of `slots` consecutive tiles runs at
 *   once. In the m-fastest order a wave of GPT-2's 128 m-tiles reads all of
 *   A and one or two columns of B; where A is larger than L2 (50 MB on
 *   H100 and H200: qkv dinp 75 MB, fc dinp and fcproj fwd 100 MB, head
 *   dinp's 1.65 GB logits gradient, head dw's m-major 1.65 GB) every wave
 *   reads it from HBM again. Bands of G = floor(sqrt(slots)) m-tiles (11 on
 *   132 SMs; 8 columns on 66 clusters), m fastest within a band, then n,
 *   then the next band (the "swizzled raster" of published Hopper GEMMs),
 *   keep a wave to about G m-tiles and slots / G n-tiles, so A is read once
 *   and B once a band (once in all while B fits L2). mm_band picks, per
 *   product, the order with the fewer HBM bytes by that model (m-fastest on
 *   a tie, and where B is the large operand: head fwd's 77 MB weight would
 *   be read once a band); bench/NOTES.md ("TMA stores and a tile order")
 *   has the table. The order changes no value (a tile's sums do not depend
 *   on which SM computes it when): tc_gemm_order takes any band, and
 *   test_gemm checks bands of 1, 2 and all m-tiles give the same bits.
 *
 * Epilogue: each thread holds pairs of adjacent columns (the mma/wgmma
 * accumulator fragment: row lane/4 and lane/4 + 8 of its 16-row slice,
 * columns 2 (lane%4) + {0,1} of each 8-wide group). TC_MMA adds bias, adds
 * the old D when accumulating, and writes a bf16x2 or float2 when N is even
 * and D suitably aligned, else two guarded scalars. TC_WGMMA first turns
 * its fragments into whole rows through a small chunk of shared memory per
 * warp (mm_wg_epilogue), so that each lane stores 16-byte pieces and a
 * row's bytes leave as whole 32-byte sectors (bf16 pairs would fill half of
 * each). Rows >= M and columns >= N are never stored.
 *
 * Split-K (both tensor-core kernels, float32 D only): a product with few
 * output tiles and a long K is cut into parts of K that run side by side
 * (TC_MMA: gridDim.z; TC_WGMMA: more work items); part 0 goes to D, the
 * others to the caller's work buffer, and one more kernel adds them to D in
 * part order: deterministic. How many parts: mm_plan_split, below.
 *
 * Stream-K (the three wgmma kernels, float32 D only): the same plan's other
 *   form, for products whose tiles (split-K parts included) leave the last
 *   wave part-empty. With W walkers (blocks; the cluster kernel's
 *   clusters) and `tiles` tiles of nk k-blocks: the tiles of the full
 *   waves, dp = floor(tiles / W) W of them, go whole as usual (tile order
 *   unchanged, tiles 0 .. dp - 1); the other left = tiles - dp tiles'
 *   left x nk (tile, k-block) pairs, counted tile by tile, are cut into W
 *   shares of L = ceil(left nk / W), walker b taking pairs [b L, (b + 1) L)
 *   after its whole tiles: a segment of each tile its share meets
 *   (mm_wg_walk). This is the Stream-K paper's "data-parallel + one stream-K
 *   wave" hybrid rather than every pair shared out (each walker a 1 / W of
 *   all of them): the full waves' tiles then stay whole, with no part to
 *   store or add, and the fix-up touches only the last wave's tiles
 *   (left x 128 x 128 of D, not all of M x N, which is why it can pay
 *   where split-K's sum did not); the cost is the same L-long last wave.
 *   A segment that starts a tile (k-block 0) is that tile's part 0 and
 *   goes to D as split-K's part 0 does (bias, the old D); a segment that
 *   starts inside a tile can only be a walker's first, so walker b's is
 *   stored plain float32 in work slot b - 1, a [BM CL][BN] tile: the
 *   work buffer needs (walkers - 1) tiles, 131 x 64 KB = 8.6 MB for
 *   ping-pong at 132 SMs (17 MB cooperative: 128 x 256 tiles), against
 *   split-K's (splits - 1) M N (28 MB at fc dw's 4 parts); tc_gemm's
 *   training callers give 32 MB. Then mm_streamk_fixup_kernel adds, for
 *   each last-wave tile met by walkers b0 .. b1, the parts of b0 + 1 ..
 *   b1 in walker order into D: D = (D + P(b0)) + ((P(b0+1) + P(b0+2)) +
 *   ... + P(b1)), as split-K's sum does with its parts. The order is the
 *   plan's (tiles, W, nk, the band), never the timing: the same bits
 *   every run and at any SM count that gives the same plan; no atomics,
 *   no waiting between CTAs (the fix-up is a second kernel, stream-
 *   ordered), so no co-residency is assumed. tc_gemm_streamk (tc.h) forces
 *   it with any W, for the tests.
 *   When (mm_plan_split): the model prices it as dp / W waves of nk plus L
 *   k-blocks, plus the fix-up's traffic at split-K's price (the parts read
 *   plus the shared tiles' D read and written, whole tiles counted), plus
 *   its launch (about 2 us, priced as 6.7 MB) where split-K's best
 *   launches no sum of its own; it is taken where that is less than the
 *   best split-K. On GPT-2 124M at 132 SMs (bench/NOTES.md, "Stream-K for
 *   the last wave", has the table), ping-pong: fc dw and fcproj dw (144
 *   tiles; split-K 4 parts = 576 items, 5 waves of 64 = 320 k-blocks + a
 *   47 MB sum, 376 by the model) become one whole wave of 256 + 12 tiles'
 *   3072 k-blocks over 128 walkers of 24 = 280 k-blocks + a 9.7 MB
 *   fix-up, 292 (0.78x); qkv dw (108 tiles, one part: 256 k-blocks, 24
 *   SMs idle) 132 walkers of 210 + 22.7 MB, 245 with the launch (0.96x);
 *   attproj dw (7 parts, 96.5) 132 of 70 + 13.2 MB, 86 (0.89x);
 *   cooperative (TC_AUTO's on qkv, fc and fcproj dw): qkv dw 141 -> 124
 *   (0.88x), fc and fcproj dw 195 -> 161 (0.83x); head dw (2358 tiles,
 *   17.9 waves) keeps one part on every kernel (stream-K's last wave saves
 *   6 of 4608 k-blocks, less than its fix-up). The bf16 products never
 *   take it (their last waves hold 0.2-3% of the work, and D would need a
 *   float32 part; the header's split-K rule). TC_AUTO's choice between
 *   the two kernels reads the cooperative plan's longest item, a whole
 *   tile where tiles are done whole, else L: unchanged on GPT-2.
 *   ptxas (nvcc 13.0, sm_90a): all twenty mm_wgmma_kernel instantiations
 *   still 168 registers at the launch, no stack frame, no spills (the
 *   TMA-store ones walk without the stream-K branch, mm_wg_walk's SK
 *   false: with it two of them spilled 4 bytes); mm_streamk_fixup_kernel
 *   32 registers.
 *
 * TC_AUTO: on sm_90a, TC_WGMMA (ping-pong) when a work item of the
 * cooperative kernel (its tile, or its part of K under split-K) has at most
 * 40 k-blocks of 64 (PP_AUTO_MAX_KB), else TC_WGMMA_COOP: a time model of
 * the two (bench/NOTES.md, "Third round") has ping-pong winning by 4-80%
 * wherever the epilogue is a large share of a tile (every K = 768
 * product, qkv dinp at K 2304, attproj dw's 7 parts of 37 k-blocks) even
 * if its 128 x 128 tile's operand traffic (94 GB/s an SM at full rate, 12
 * TB/s from L2 over 132 SMs) is more than L2 gives, and losing up to 20%
 * on the longer items (fc dinp, fcproj fwd, their dw, the head's dinp and
 * dw) in that case; bench_gpu times both kernels on every product, so the
 * lease can move the bound. That is, TC_WGMMA or
 * TC_WGMMA_COOP when the device is sm_90, the sm_90a kernels are in the
 * binary and the shape is aligned; else TC_MMA when the device is sm_80+ and
 * the shape is aligned; else TC_SIMPLE.
 *
 * tc_bias_grad: dbias[N] += column sums of dout [M][N] (bf16 or float32), in
 * a fixed order (no atomics, the same bits every run): with a work buffer,
 * chunks of rows in parallel, then the chunks added in order by
 * tc_partials_add (which kernels.cu's LayerNorm backward uses too);
 * without, a block a 32 columns over all rows. The GELU-backward product
 * reproduces the first from its tiles (above).
 *
 * State: one capability word per device (std::atomic, written once on the
 * first call that runs on that device: whether the MMA and WGMMA kernels
 * run there, and the SM count), and beside it the count of the cluster
 * kernel's clusters that fit the device (0: it does not run there).
 * Finding out whether the binary holds sm_90a code takes a one-thread
 * probe kernel (it writes __CUDA_ARCH_FEAT_SM90_ALL
 * into a __device__ int) and one synchronisation of the caller's stream,
 * once per device per process (so that first call must not be made while
 * the stream is being captured into a CUDA graph); the same first call
 * raises the kernels' dynamic shared memory limits. Nothing else is cached.
 */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <atomic>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cudaTypedefs.h>  /* PFN_cuTensorMapEncodeTiled, CUtensorMap: types only, no libcuda */

extern "C" {
#include "tc.h"
}
#include "sm90.cuh"
#include "gelu.cuh"

typedef __nv_bfloat16 bf16;

#include "cuda_check.cuh"

static int mm_ceil_div(int a, int b) { return (a + b - 1) / b; }

/* The GELU-backward epilogue's element (tc_gemm_gelu_back): v, the
 * product's float32 sum, rounded to bf16 as the plain product's store into
 * a zeroed D rounds it (0 + v), widened, times gelu'(pre), added to 0 as
 * kernels.cu's gelu_backward adds into its zeroed dinp: the caller rounds
 * the result to bf16 once. The bits of the two passes it replaces. */
__device__ __forceinline__ float mm_gelu_back(float v, bf16 pre) {
    const float g = __bfloat162float(__float2bfloat16_rn(v + 0.0f));
    return 0.0f + gelu_grad(__bfloat162float(pre)) * g;
}
/* The GELU-forward epilogue's element (tc_gemm_gelu): GELU's output from
 * the stored, rounded pre-activation, as kernels.cu's gelu_forward makes it
 * from the bf16 buffer: one rounding. */
__device__ __forceinline__ bf16 mm_gelu_fwd(bf16 pre) {
    return __float2bfloat16_rn(gelu_f(__bfloat162float(pre)));
}
__device__ __forceinline__ __nv_bfloat162 mm_gelu_fwd2(__nv_bfloat162 pre) {
    const float2 f = __bfloat1622float2(pre);
    return __floats2bfloat162_rn(gelu_f(f.x), gelu_f(f.y));
}

/* ---------------------------------------------------------------------------
 * The shared epilogue: one thread's pair (row, col), (row, col + 1), col even.
 * D [M][N] bf16 or float32; bias [N] bf16 or NULL. pair_ok: N is even and D
 * is 4-byte (bf16) / 8-byte (float32) aligned, so the pair is one aligned
 * vector. An accumulating store reads the old D; a plain one never does
 * (D may start as NaN). gpre [M][N] bf16 or NULL: the GELU-backward
 * epilogue (D bf16, written, no bias; mm_gelu_back), gpre's element at
 * D's place the pre-activation. gout [M][N] bf16 or NULL: the GELU-forward
 * epilogue (D bf16, written), GELU of D's stored element into gout's
 * (mm_gelu_fwd); pair_ok then covers gout's alignment too. */

__device__ __forceinline__ void mm_store2(void *D, int d_fp32, int accumulate, const bf16 *bias,
                                          int M, int N, int row, int col, float v0, float v1,
                                          int pair_ok, const bf16 *gpre = nullptr, bf16 *gout = nullptr) {
    if (row >= M || col >= N) return;
    const bool two = col + 1 < N;
    if (bias) {
        v0 += __bfloat162float(bias[col]);
        if (two) v1 += __bfloat162float(bias[col + 1]);
    }
    const size_t i = (size_t)row * N + col;
    if (d_fp32) {
        float *p = (float *)D + i;
        if (two && pair_ok) {
            float2 o = make_float2(v0, v1);
            if (accumulate) {
                float2 old = *(const float2 *)p;
                o.x += old.x;
                o.y += old.y;
            }
            *(float2 *)p = o;
        } else {
            p[0] = accumulate ? p[0] + v0 : v0;
            if (two) p[1] = accumulate ? p[1] + v1 : v1;
        }
    } else {
        bf16 *p = (bf16 *)D + i;
        if (gpre) {
            v0 = mm_gelu_back(v0, gpre[i]);
            if (two) v1 = mm_gelu_back(v1, gpre[i + 1]);
        }
        if (two && pair_ok) {
            if (accumulate) {
                float2 old = __bfloat1622float2(*(const __nv_bfloat162 *)p);
                v0 += old.x;
                v1 += old.y;
            }
            const __nv_bfloat162 r = __floats2bfloat162_rn(v0, v1);
            *(__nv_bfloat162 *)p = r;
            if (gout) *(__nv_bfloat162 *)(gout + i) = mm_gelu_fwd2(r);
        } else {
            const bf16 r0 = __float2bfloat16_rn(accumulate ? __bfloat162float(p[0]) + v0 : v0);
            p[0] = r0;
            if (gout) gout[i] = mm_gelu_fwd(r0);
            if (two) {
                const bf16 r1 = __float2bfloat16_rn(accumulate ? __bfloat162float(p[1]) + v1 : v1);
                p[1] = r1;
                if (gout) gout[i + 1] = mm_gelu_fwd(r1);
            }
        }
    }
}

/* ---------------------------------------------------------------------------
 * TC_SIMPLE: one thread an output element. Block 32 (n) x 8 (m); the grid
 * strides over m so any M fits gridDim.y.
 * D [M][N]; A [M][K] (a_kmajor) or [K][M]; B [N][K] (b_kmajor) or [K][N];
 * gpre, gout [M][N] or NULL (mm_store2's). */

__global__ void mm_simple_kernel(void *D, int d_fp32, int accumulate, const bf16 *A, int a_kmajor,
                                 const bf16 *B, int b_kmajor, const bf16 *bias, int M, int N,
                                 int K, const bf16 *gpre, bf16 *gout) {
    const int n = blockIdx.x * 32 + threadIdx.x;
    if (n >= N) return;
    for (int m = blockIdx.y * 8 + threadIdx.y; m < M; m += gridDim.y * 8) {
        float acc = 0.0f;
        for (int k = 0; k < K; k++) {
            float a = __bfloat162float(a_kmajor ? A[(size_t)m * K + k] : A[(size_t)k * M + m]);
            float b = __bfloat162float(b_kmajor ? B[(size_t)n * K + k] : B[(size_t)k * N + n]);
            acc = fmaf(a, b, acc);
        }
        if (bias) acc += __bfloat162float(bias[n]);
        const size_t i = (size_t)m * N + n;
        if (d_fp32) {
            float *p = (float *)D + i;
            *p = accumulate ? *p + acc : acc;
        } else {
            bf16 *p = (bf16 *)D + i;
            if (gpre) acc = mm_gelu_back(acc, gpre[i]);
            const bf16 r = __float2bfloat16_rn(accumulate ? __bfloat162float(*p) + acc : acc);
            *p = r;
            if (gout) gout[i] = mm_gelu_fwd(r);
        }
    }
}

/* ---------------------------------------------------------------------------
 * TC_MMA: mma.sync m16n8k16, ldmatrix, 4-stage cp.async. */

#define MM_BM 128
#define MM_BN 128
#define MM_BK 32
#define MM_STAGES 4
#define MM_THREADS 256
#define MM_KPITCH (MM_BK + 8)           /* k-major tile row pitch, elements */
#define MM_MNPITCH (MM_BM + 8)          /* mn-major tile row pitch, elements */
#define MM_SLOT_BYTES (MM_BM * MM_KPITCH * 2)        /* 10240 >= 32 * 136 * 2 = 8704 */
#define MM_STAGE_BYTES (2 * MM_SLOT_BYTES)           /* A slot, then B slot: 20480 */
#define MM_SMEM_BYTES (MM_STAGES * MM_STAGE_BYTES)   /* 81920 */

/* 16 bytes global -> shared; src_bytes 0 writes 16 zeros (and reads nothing). */
__device__ __forceinline__ void mm_cp_async16(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void mm_cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void mm_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}

__device__ __forceinline__ void mm_ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}
__device__ __forceinline__ void mm_ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}

/* c[4] += A(16x16, a[4]) B(16x8, b0, b1), the fragments of the PTX ISA:
 * a[0] (row g, k 2t..2t+1), a[1] (row g+8, same k), a[2] (row g, k 2t+8..),
 * a[3] (row g+8, k 2t+8..); b0 (k 2t.., col g), b1 (k 2t+8.., col g);
 * c[0..1] (row g, cols 2t, 2t+1), c[2..3] (row g+8); g = lane/4, t = lane%4. */
__device__ __forceinline__ void mm_mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* One operand's k-tile into a shared slot. The operand has R rows in the
 * m (A) or n (B) sense: k-major it is stored [R][K] and the slot is
 * [128 r][40] (32 k used); mn-major it is stored [K][R] and the slot is
 * [32 k][136] (128 r used). 512 chunks of 16 bytes, 2 a thread. k at or
 * past kend (K, or the end of this block's part of K) reads as zero. */
template <bool KMAJ>
__device__ __forceinline__ void mm_load_tile(uint32_t slot, const bf16 *G, int R, int K, int kend,
                                             int r0, int k0, int tid) {
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int c = tid + i * MM_THREADS;
        int row, col, gr, gk;
        if (KMAJ) {
            row = c >> 2;            /* r within the tile, 0..127 */
            col = (c & 3) * 8;       /* k within the tile, 0..24 */
            gr = r0 + row;
            gk = k0 + col;
        } else {
            row = c >> 4;            /* k within the tile, 0..31 */
            col = (c & 15) * 8;      /* r within the tile, 0..120 */
            gk = k0 + row;
            gr = r0 + col;
        }
        const bool ok = gr < R && gk < kend;
        const bf16 *src = KMAJ ? G + (size_t)gr * K + gk : G + (size_t)gk * R + gr;
        const uint32_t dst = slot + (uint32_t)(row * (KMAJ ? MM_KPITCH : MM_MNPITCH) + col) * 2;
        mm_cp_async16(dst, ok ? (const void *)src : (const void *)G, ok ? 16 : 0);
    }
}

/* A fragments of one m16 x k16 block at (mrow, kk) of the A slot. */
template <bool KMAJ>
__device__ __forceinline__ void mm_frag_a(uint32_t (&a)[4], uint32_t slot, int mrow, int kk,
                                          int lane) {
    if (KMAJ) {
        /* matrices: (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15), (m 8-15, k 8-15) */
        const int r = mrow + (lane & 15), k = kk + (lane >> 4) * 8;
        mm_ldmatrix_x4(a, slot + (uint32_t)(r * MM_KPITCH + k) * 2);
    } else {
        /* same four matrices, stored as k rows of m: transpose on load */
        const int k = kk + (lane & 7) + (lane >> 4) * 8, m = mrow + ((lane >> 3) & 1) * 8;
        mm_ldmatrix_x4_trans(a, slot + (uint32_t)(k * MM_MNPITCH + m) * 2);
    }
}

/* B fragments of two n8 tiles (ncol, ncol + 8) at kk: b = {b0, b1 of the
 * first, b0, b1 of the second}. */
template <bool KMAJ>
__device__ __forceinline__ void mm_frag_b(uint32_t (&b)[4], uint32_t slot, int ncol, int kk,
                                          int lane) {
    if (KMAJ) {
        /* matrices: (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15) */
        const int n = ncol + (lane & 7) + (lane >> 4) * 8, k = kk + ((lane >> 3) & 1) * 8;
        mm_ldmatrix_x4(b, slot + (uint32_t)(n * MM_KPITCH + k) * 2);
    } else {
        const int k = kk + (lane & 7) + ((lane >> 3) & 1) * 8, n = ncol + (lane >> 4) * 8;
        mm_ldmatrix_x4_trans(b, slot + (uint32_t)(k * MM_MNPITCH + n) * 2);
    }
}

/* D [M][N]; A [M][K] (AK) or [K][M]; B [N][K] (BK) or [K][N]; bias [N] or
 * NULL. Grid (ceil(M/128), ceil(N/128), splits), 256 threads, MM_SMEM_BYTES
 * dynamic. Block z takes k-tiles [z kps, (z + 1) kps) (split-K, see the
 * header); part z > 0 goes to work [splits - 1][M][N] (pair_w: its pairs
 * are aligned), part 0 to D. */
template <bool AK, bool BK>
__global__ void __launch_bounds__(MM_THREADS, 2)
mm_mma_kernel(void *D, int d_fp32, int accumulate, const bf16 *A, const bf16 *B,
              const bf16 *bias, int M, int N, int K, int pair_ok, float *work, int kps,
              int pair_w, const bf16 *gpre, bf16 *gout) {
    extern __shared__ __align__(16) unsigned char mm_smem[];
    const uint32_t smem = sm90_smem_u32(mm_smem);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp >> 2, wn = warp & 3;  /* warp tile at (64 wm, 32 wn) */
    const int m0 = blockIdx.x * MM_BM, n0 = blockIdx.y * MM_BN;
    const int kbase = blockIdx.z * kps * MM_BK;  /* this part's first k */
    const int kend = min(K, kbase + kps * MM_BK);
    const int ktiles = (kend - kbase + MM_BK - 1) / MM_BK;

    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;

    /* Prologue: tiles 0..STAGES-2, one group each (empty past the end). */
#pragma unroll
    for (int s = 0; s < MM_STAGES - 1; s++) {
        if (s < ktiles) {
            const uint32_t st = smem + s * MM_STAGE_BYTES;
            mm_load_tile<AK>(st, A, M, K, kend, m0, kbase + s * MM_BK, tid);
            mm_load_tile<BK>(st + MM_SLOT_BYTES, B, N, K, kend, n0, kbase + s * MM_BK, tid);
        }
        mm_cp_async_commit();
    }

    for (int kt = 0; kt < ktiles; kt++) {
        /* Groups committed so far: STAGES-1 + kt; at most STAGES-2 pending
         * means groups 0..kt are complete, so tile kt is in its slot. */
        mm_cp_async_wait<MM_STAGES - 2>();
        __syncthreads();
        const int next = kt + MM_STAGES - 1;
        if (next < ktiles) {
            const uint32_t st = smem + (next % MM_STAGES) * MM_STAGE_BYTES;
            mm_load_tile<AK>(st, A, M, K, kend, m0, kbase + next * MM_BK, tid);
            mm_load_tile<BK>(st + MM_SLOT_BYTES, B, N, K, kend, n0, kbase + next * MM_BK, tid);
        }
        mm_cp_async_commit();

        const uint32_t sa = smem + (kt % MM_STAGES) * MM_STAGE_BYTES, sb = sa + MM_SLOT_BYTES;
#pragma unroll
        for (int kk = 0; kk < MM_BK; kk += 16) {
            uint32_t a[4][4], b[2][4];
#pragma unroll
            for (int mt = 0; mt < 4; mt++) mm_frag_a<AK>(a[mt], sa, wm * 64 + mt * 16, kk, lane);
#pragma unroll
            for (int np = 0; np < 2; np++) mm_frag_b<BK>(b[np], sb, wn * 32 + np * 16, kk, lane);
#pragma unroll
            for (int mt = 0; mt < 4; mt++)
#pragma unroll
                for (int nt = 0; nt < 4; nt++)
                    mm_mma_16816(acc[mt][nt], a[mt], b[nt >> 1][(nt & 1) * 2],
                                 b[nt >> 1][(nt & 1) * 2 + 1]);
        }
    }
    mm_cp_async_wait<0>();  /* only empty groups can be pending; leave none behind */

    /* Part 0 (the only one without split-K) into D; the others, plain, to work. */
    void *out = D;
    if (blockIdx.z > 0) {
        out = work + (size_t)(blockIdx.z - 1) * M * N;
        d_fp32 = 1;
        accumulate = 0;
        bias = NULL;
        pair_ok = pair_w;
        gpre = NULL;
        gout = NULL;
    }
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mt = 0; mt < 4; mt++) {
        const int row = m0 + wm * 64 + mt * 16 + g;
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            const int col = n0 + wn * 32 + nt * 8 + 2 * t;
            mm_store2(out, d_fp32, accumulate, bias, M, N, row, col, acc[mt][nt][0],
                      acc[mt][nt][1], pair_ok, gpre, gout);
            mm_store2(out, d_fp32, accumulate, bias, M, N, row + 8, col, acc[mt][nt][2],
                      acc[mt][nt][3], pair_ok, gpre, gout);
        }
    }
}

/* ---------------------------------------------------------------------------
 * TC_WGMMA: wgmma + TMA + mbarriers, warp-specialised, persistent. The device
 * code exists only in sm_90a builds; elsewhere the kernel is an empty shell
 * that the host never launches (the probe below tells it). */

#define WG_BM 128
#define WG_BN 256
#define WG_BK 64
#define WG_STAGES 4
#define WG_THREADS 384
#define WG_A_BYTES (WG_BM * WG_BK * 2)               /* 16384 */
#define WG_B_BYTES (WG_BN * WG_BK * 2)               /* 32768 */
#define WG_STAGE_BYTES (WG_A_BYTES + WG_B_BYTES)      /* 49152 */
#define WG_EPI_PITCH 40                               /* floats a row of a warp's epilogue chunk */
#define WG_EPI_WARP_BYTES (16 * WG_EPI_PITCH * 4)     /* 2560: 16 rows x 32 columns, padded */
#define WG_SMEM_BYTES (WG_STAGES * WG_STAGE_BYTES + WG_CONSUMER_WARPS * WG_EPI_WARP_BYTES + 1024)
                                                      /* 218112, 1024 for alignment */
#define WG_BOX_BYTES 8192                             /* one 64 x 64 box */
#define WG_CONSUMER_WARPS 8

/* The ping-pong kernel (TC_WGMMA): a 128 x 128 tile a consumer warpgroup,
 * 6 stages of A 128 x 64 + B 128 x 64, the same epilogue chunks. */
#define PP_BM 128
#define PP_BN 128
#define PP_STAGES 6
#define PP_A_BYTES (PP_BM * WG_BK * 2)               /* 16384 */
#define PP_B_BYTES (PP_BN * WG_BK * 2)               /* 16384 */
#define PP_STAGE_BYTES (PP_A_BYTES + PP_B_BYTES)      /* 32768 */
#define PP_SMEM_BYTES (PP_STAGES * PP_STAGE_BYTES + WG_CONSUMER_WARPS * WG_EPI_WARP_BYTES + 1024)
                                                      /* 218112, as WG_SMEM_BYTES */
#define PP_BAR_MATH 1  /* named barrier PP_BAR_MATH + c: consumer warpgroup c's turn at the math */
/* The TMA-store epilogue (TS, mm_wg_epilogue_tma): each consumer warpgroup
 * stages 64 rows x 128 columns of bf16 at a time, two {64 n, 64 m} boxes of
 * 8 KB in the 128-byte swizzle, in place of the 8 warps' epilogue chunks;
 * named barrier PP_BAR_EPI + c gathers warpgroup c's 128 threads around it. */
#define PP_BAR_EPI 3
/* The bias sums of the GELU-backward product (mm_wg_bias_sums): ping-pong
 * and cluster kernels gather a warpgroup at PP_BAR_EPI + c (never TS
 * there), the cooperative kernel both consumer warpgroups (256 threads) at
 * PP_BAR_BG. */
#define PP_BAR_BG 5
/* Rows a chunk of tc_bias_grad's split sums (mm_bias_grad_split_kernel),
 * and so a tile's rows in the fused sums: 128 = PP_BM = WG_BM. */
#define MM_BG_ROWS 128
#define TS_STAGE_BYTES (2 * WG_BOX_BYTES)            /* 16384 a consumer warpgroup */
#define PP_TS_SMEM_BYTES (PP_STAGES * PP_STAGE_BYTES + 2 * TS_STAGE_BYTES + 1024)
                                                      /* 230400 of the 232448 (227 KB) an SM gives */
/* TC_AUTO takes the ping-pong kernel when a work item of the cooperative
 * one (a tile, or its part of K under split-K) has at most this many
 * k-blocks of 64 (the header's TC_AUTO says why), else the cooperative. */
#define PP_AUTO_MAX_KB 40
/* The cluster kernel (TC_WGMMA_CLUSTER): the ping-pong kernel in clusters of
 * CL_CTAS CTAs along M, which share the B tile (one multicast half each). */
#define CL_CTAS 2

/* SM90_BUILD (sm90.cuh): the sm_90a device code is compiled here; the CPU
 * emulation (test/emu/emu.h, -DMM_EMU_SM90A) builds it for the host too,
 * which then runs it in place of a GPU. */
/* Written by mm_probe_kernel: 1 where the running device code was built for sm_90a. */
__device__ int mm_probe_flag;

__global__ void mm_probe_kernel() {
    mm_probe_flag = SM90_BUILD;
}

#if SM90_BUILD
/* One warp's 16 x (32 NCH) slice of the tile from its wgmma fragment (rows
 * row0 + lane/4 and + 8, columns n0 + 8j + 2 (lane % 4) + {0, 1} in
 * d[OFF + 4j .. OFF + 4j + 3], j < 4 NCH) into D [M][N]: NCH 8, OFF 0 for
 * an m64n256 accumulator, NCH 4, OFF 0 or 64 for either m64n128 half of
 * the ping-pong tile's, through ep, the warp's 16 x 32 float
 * chunk of shared memory (row pitch WG_EPI_PITCH): for each 32 columns the
 * fragment goes in, then every lane takes whole 16-byte pieces of rows
 * (8 bf16 or 4 floats), adds bias and the old D (accumulate), rounds once
 * and stores 16 bytes, so a row's 64 or 128 bytes go out as whole sectors
 * (the fragment's own pairs would be 4 or 8 bytes apiece). vec: N, D and
 * bias allow those 16-byte pieces; else the pieces go out as guarded pairs.
 * PRE (the ping-pong kernel's): a chunk's 16-byte reads of the old D and of
 * bias are all issued first, before the fragment goes through shared
 * memory, so a chunk waits for one round trip to memory; without (the
 * cooperative kernel's, as measured), each piece's read follows the
 * previous piece's store (the compiler cannot tell they never alias): 2
 * round trips a chunk in bf16, 4 in float32. The same values either way.
 * gpre [M][N] bf16 or NULL: the GELU-backward epilogue (D bf16, written,
 * no bias; mm_gelu_back), its 16-byte pieces read where an accumulating
 * store reads the old D's (vec: gpre aligned as D). gout [M][N] bf16 or
 * NULL: the GELU-forward epilogue (D bf16, written), GELU of each stored
 * piece into gout's (vec: gout aligned as D). */
template <int NCH, int OFF, bool PRE>
__device__ __forceinline__ void mm_wg_epilogue(const float (&d)[128], float *ep, void *D, int d_fp32,
                                               int accumulate, const bf16 *bias, int M, int N,
                                               int row0, int n0, int vec, int lane,
                                               const bf16 *gpre = nullptr, bf16 *gout = nullptr) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        /* PRE: this lane's pieces of the old D and bias, read now: fp32 4
         * pieces of 4 floats (bias 8 bytes each), bf16 2 of 8 (bias 16) */
        uint4 old_v[4], bias_v[4];
        if (PRE) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                old_v[i] = make_uint4(0, 0, 0, 0);
                bias_v[i] = make_uint4(0, 0, 0, 0);
                if (!d_fp32 && i >= 2) continue;
                const int v = lane + 32 * i, w = d_fp32 ? 4 : 8;
                const int row = row0 + (d_fp32 ? v >> 3 : v >> 2);
                const int col = n0 + ch * 32 + (d_fp32 ? (v & 7) * 4 : (v & 3) * 8);
                if (!vec || row >= M || col + w > N) continue;
                const size_t at = (size_t)row * N + col;
                if (accumulate || gpre)  /* gpre: D bf16, never accumulated */
                    old_v[i] = d_fp32 ? *reinterpret_cast<const uint4 *>((const float *)D + at)
                                      : *reinterpret_cast<const uint4 *>((gpre ? gpre : (const bf16 *)D) + at);
                if (bias && d_fp32) {
                    const uint2 b2 = *reinterpret_cast<const uint2 *>(bias + col);
                    bias_v[i] = make_uint4(b2.x, b2.y, 0, 0);
                } else if (bias) {
                    bias_v[i] = *reinterpret_cast<const uint4 *>(bias + col);
                }
            }
        }
#pragma unroll
        for (int jj = 0; jj < 4; jj++) {
            const int j = OFF / 4 + 4 * ch + jj, cl = jj * 8 + 2 * t;
            *reinterpret_cast<float2 *>(ep + g * WG_EPI_PITCH + cl) = make_float2(d[4 * j], d[4 * j + 1]);
            *reinterpret_cast<float2 *>(ep + (g + 8) * WG_EPI_PITCH + cl) =
                make_float2(d[4 * j + 2], d[4 * j + 3]);
        }
        __syncwarp();
        const int gc0 = n0 + ch * 32;
        if (d_fp32) {
#pragma unroll
            for (int i = 0; i < 4; i++) {  /* 16 rows x 8 pieces of 4 floats */
                const int v = lane + 32 * i, r = v >> 3, cv = (v & 7) * 4;
                const int row = row0 + r, col = gc0 + cv;
                if (row >= M || col >= N) continue;
                float4 x = *reinterpret_cast<const float4 *>(ep + r * WG_EPI_PITCH + cv);
                if (vec && col + 4 <= N) {
                    if (bias) {
                        const uint2 bb = PRE ? make_uint2(bias_v[i].x, bias_v[i].y)
                                             : *reinterpret_cast<const uint2 *>(bias + col);
                        const __nv_bfloat162 *b2 = reinterpret_cast<const __nv_bfloat162 *>(&bb);
                        const float2 b0 = __bfloat1622float2(b2[0]), b1 = __bfloat1622float2(b2[1]);
                        x.x += b0.x; x.y += b0.y; x.z += b1.x; x.w += b1.y;
                    }
                    float4 *p = reinterpret_cast<float4 *>((float *)D + (size_t)row * N + col);
                    if (accumulate) {
                        const float4 o = PRE ? *reinterpret_cast<const float4 *>(&old_v[i]) : *p;
                        x.x += o.x; x.y += o.y; x.z += o.z; x.w += o.w;
                    }
                    *p = x;
                } else {
                    mm_store2(D, 1, accumulate, bias, M, N, row, col, x.x, x.y, 0);
                    mm_store2(D, 1, accumulate, bias, M, N, row, col + 2, x.z, x.w, 0);
                }
            }
        } else {
#pragma unroll
            for (int i = 0; i < 2; i++) {  /* 16 rows x 4 pieces of 8 bf16 */
                const int v = lane + 32 * i, r = v >> 2, cv = (v & 3) * 8;
                const int row = row0 + r, col = gc0 + cv;
                if (row >= M || col >= N) continue;
                const float4 x0 = *reinterpret_cast<const float4 *>(ep + r * WG_EPI_PITCH + cv);
                const float4 x1 = *reinterpret_cast<const float4 *>(ep + r * WG_EPI_PITCH + cv + 4);
                float x[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
                if (vec && col + 8 <= N) {
                    if (bias) {
                        const uint4 bb = PRE ? bias_v[i] : *reinterpret_cast<const uint4 *>(bias + col);
                        const __nv_bfloat162 *b2 = reinterpret_cast<const __nv_bfloat162 *>(&bb);
#pragma unroll
                        for (int k = 0; k < 4; k++) {
                            const float2 bf = __bfloat1622float2(b2[k]);
                            x[2 * k] += bf.x;
                            x[2 * k + 1] += bf.y;
                        }
                    }
                    uint4 *p = reinterpret_cast<uint4 *>((bf16 *)D + (size_t)row * N + col);
                    if (accumulate) {
                        const uint4 ob = PRE ? old_v[i] : *p;
                        const __nv_bfloat162 *o2 = reinterpret_cast<const __nv_bfloat162 *>(&ob);
#pragma unroll
                        for (int k = 0; k < 4; k++) {
                            const float2 of = __bfloat1622float2(o2[k]);
                            x[2 * k] += of.x;
                            x[2 * k + 1] += of.y;
                        }
                    }
                    if (gpre) {
                        const uint4 pb = PRE ? old_v[i] : *reinterpret_cast<const uint4 *>(gpre + (size_t)row * N + col);
                        const bf16 *pe = reinterpret_cast<const bf16 *>(&pb);
#pragma unroll
                        for (int k = 0; k < 8; k++) x[k] = mm_gelu_back(x[k], pe[k]);
                    }
                    uint4 out;
                    __nv_bfloat162 *w2 = reinterpret_cast<__nv_bfloat162 *>(&out);
#pragma unroll
                    for (int k = 0; k < 4; k++) w2[k] = __floats2bfloat162_rn(x[2 * k], x[2 * k + 1]);
                    *p = out;
                    if (gout) {
                        uint4 go;
                        __nv_bfloat162 *g2 = reinterpret_cast<__nv_bfloat162 *>(&go);
#pragma unroll
                        for (int k = 0; k < 4; k++) g2[k] = mm_gelu_fwd2(w2[k]);
                        *reinterpret_cast<uint4 *>(gout + (size_t)row * N + col) = go;
                    }
                } else {
#pragma unroll
                    for (int k = 0; k < 4; k++)
                        mm_store2(D, 0, accumulate, bias, M, N, row, col + 2 * k, x[2 * k], x[2 * k + 1], 0, gpre,
                                  gout);
                }
            }
        }
        __syncwarp();  /* the next chunk overwrites ep */
    }
}

/* The TMA-store epilogue of one consumer warpgroup's 128 x 128 tile at
 * (m0, n0) of D [M][N] bf16, written (not accumulated): d as
 * mm_wg_pingpong holds it (rows 64h.. in d[64h..]), bias [N] or NULL.
 * For each 64-row half h: thread 0 of the warpgroup (warp 0, lane 0, the
 * only one that issues bulk copies) waits until the stores issued from the
 * staging buffer have read it (wait_group.read 0), the warpgroup meets at
 * PP_BAR_EPI + c; every thread adds bias to its fragment's pairs, rounds
 * them to bf16 and writes them into the staging buffer stg (shared address
 * stg_s; [2 boxes of 64 columns][64 rows][128 bytes], 16-byte chunk index
 * XOR row % 8: the layout a TMA box lands in, so the store reads it back
 * as the box), fences the generic proxy's writes against the async
 * proxy's reads, and meets the others again; thread 0 then issues the
 * half's boxes (those whose first row and column lie inside D: TMA clips
 * the rest of a box to the tensor) and commits them as one bulk group.
 * tmD: D's map, {64 n, 64 m} boxes, 128-byte swizzle. */
__device__ __forceinline__ void mm_wg_epilogue_tma(const float (&d)[128], unsigned char *stg, uint32_t stg_s,
                                                   const CUtensorMap *tmD, const bf16 *bias, int M, int N,
                                                   int m0, int n0, int c, int warp, int lane) {
    const int g = lane >> 2, t = lane & 3;
    const bool issuer = warp == 0 && lane == 0;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        if (issuer) sm90_bulk_wait_read<0>();  /* the staging buffer is free again */
        sm90_bar_sync(PP_BAR_EPI + c, 128);
#pragma unroll
        for (int j = 0; j < 16; j++) {  /* columns 8j + 2t, +1: box j / 8, chunk j % 8 of a row */
            const int col = n0 + 8 * j + 2 * t;
            float b0 = 0.0f, b1 = 0.0f;
            if (bias && col < N) {  /* N % 8 == 0 (the map's pitch): col + 1 < N too */
                b0 = __bfloat162float(bias[col]);
                b1 = __bfloat162float(bias[col + 1]);
            }
#pragma unroll
            for (int e = 0; e < 2; e++) {  /* rows 16 warp + g, + 8 of the half */
                const int r = 16 * warp + g + 8 * e;
                const int off = (j >> 3) * WG_BOX_BYTES + r * 128 + (((j & 7) ^ (r & 7)) << 4) + 4 * t;
                *reinterpret_cast<__nv_bfloat162 *>(stg + off) =
                    __floats2bfloat162_rn(d[64 * h + 4 * j + 2 * e] + b0, d[64 * h + 4 * j + 2 * e + 1] + b1);
            }
        }
        sm90_fence_proxy_async();
        sm90_bar_sync(PP_BAR_EPI + c, 128);
        if (issuer) {
            const int row = m0 + 64 * h;
            if (row < M) {
                sm90_tma_store_2d(tmD, n0, row, stg_s);
                if (n0 + 64 < N) sm90_tma_store_2d(tmD, n0 + 64, row, stg_s + WG_BOX_BYTES);
            }
            sm90_bulk_commit();
        }
    }
}
#endif

/* The wgmma kernels' tile order: tile `tile` (of `tiles`, tiles_m m-tiles
 * of BM rows, or with clusters columns of CL tiles) at m-tile .x, n-tile .y:
 * bands of `group` m-tiles, m fastest within a band, then the BN columns,
 * then the next band (the last may be narrower). group >= tiles_m is one
 * band: m fastest over all of M (the header's "Tile order" says which the
 * host takes). Outside SM90_BUILD too: stream-K's fix-up decodes it. */
__device__ __forceinline__ int2 mm_wg_tile(int tile, int tiles_m, int tiles, int group) {
    const int tiles_n = tiles / tiles_m, band = tile / (group * tiles_n), first = band * group;
    const int g = min(group, tiles_m - first), r = tile - first * tiles_n;
    return make_int2(first + r % g, r / g);
}

#if SM90_BUILD
/* The two wgmma kernels' common parts: the work items' walk, the stage
 * ring's mbarriers and the producer. Walker b (a block, or with clusters a
 * cluster) of W walks its items j = 0, 1, ... (mm_wg_walk):
 *   split-K (sk_len 0): item w = b + j W < items, tile w % tiles over the
 *     k-blocks of 64 [kb0, kb1) of part w / tiles (kps k-blocks a part, nk
 *     in all);
 *   stream-K (sk_len > 0): first the tiles b, b + W, ... below sk_dp whole
 *     (part 0), then its share [b L, (b + 1) L) (L = sk_len) of the
 *     (tile, k-block) pairs of the tiles from sk_dp on, counted tile by
 *     tile: a segment of each tile it meets. A segment that starts a tile
 *     is part 0 (to D); one that starts inside a tile is only ever a
 *     walker's first, and is part b (to work slot b - 1). */
struct MmWgItem {
    int m0, n0, part, kb0, kb1;
};
struct MmWgWalk {
    int tiles_m, tiles, group, items, kps, nk, sk_dp, sk_len;
};
/* Walker b of W: its j-th item into w (CL > 1: an item is a column of CL
 * tiles along M that share their n-tile, tiles_m counting those columns;
 * CTA `rank` of the cluster takes tile rank of it); false past its last.
 * SK false (the TMA-store kernels: bf16 D, never split): split-K's walk
 * only, whatever sk_len says (the host passes 0 there). */
template <int BM, int BN, int CL = 1, bool SK = true>
__device__ __forceinline__ bool mm_wg_walk(const MmWgWalk &k, int b, int W, int j, int rank, MmWgItem &w) {
    int tile, part, kb0, kb1;
    if (!SK || k.sk_len == 0) {
        const long long item = b + (long long)j * W;
        if (item >= k.items) return false;
        tile = (int)(item % k.tiles);
        part = (int)(item / k.tiles);
        kb0 = part * k.kps;
        kb1 = min(k.nk, kb0 + k.kps);
    } else {
        const int ndp = b < k.sk_dp ? (k.sk_dp - 1 - b) / W + 1 : 0;
        if (j < ndp) {
            tile = b + j * W;
            part = kb0 = 0;
            kb1 = k.nk;
        } else {
            const long long g0 = (long long)b * k.sk_len;
            const long long g1 = min(g0 + k.sk_len, (long long)(k.tiles - k.sk_dp) * k.nk);
            const long long t = g0 / k.nk + (j - ndp), t0 = t * k.nk;
            if (g0 >= g1 || t0 >= g1) return false;
            kb0 = (int)max(g0 - t0, 0ll);
            kb1 = (int)min(g1 - t0, (long long)k.nk);
            tile = k.sk_dp + (int)t;
            part = kb0 == 0 ? 0 : b;
        }
    }
    const int2 mn = mm_wg_tile(tile, k.tiles_m, k.tiles, k.group);
    w = MmWgItem{(mn.x * CL + rank) * BM, mn.y * BN, part, kb0, kb1};
    return true;
}
/* Where a walk starts and its stride: a block's (blockIdx.x, gridDim.x), or
 * with clusters (CL > 1) its cluster's, both CTAs of which walk the same items. */
template <int CL> __device__ __forceinline__ int mm_wg_first() {
    if constexpr (CL > 1) return (int)sm90_clusterid_x();
    else return (int)blockIdx.x;
}
template <int CL> __device__ __forceinline__ int mm_wg_stride() {
    if constexpr (CL > 1) return (int)sm90_nclusterid_x();
    else return (int)gridDim.x;
}

/* Thread 0 initialises the ring's mbarriers: full[s] takes the producer's
 * one arrival (and the stage's TMA bytes), empty[s] `consumers` warps'. The
 * caller's __syncthreads follows. */
template <int STAGES>
__device__ __forceinline__ void mm_wg_init_bars(uint64_t *full_bar, uint64_t *empty_bar, uint32_t consumers) {
    if (threadIdx.x != 0) return;
    for (int s = 0; s < STAGES; s++) {
        sm90_mbar_init(sm90_smem_u32(&full_bar[s]), 1);
        sm90_mbar_init(sm90_smem_u32(&empty_bar[s]), consumers);
    }
    sm90_mbar_init_fence();
}

/* A consumer warp frees stage prev (-1: none) once the wgmma that read it
 * is done: lane 0 arrives at its empty barrier (CL > 1: and at the peer
 * CTA's, whose producer multicasts half of B into this stage too), then the
 * warp regroups. */
template <int CL = 1>
__device__ __forceinline__ void mm_wg_release(uint64_t *empty_bar, int prev, int lane) {
    if (prev >= 0 && lane == 0) {
        const uint32_t a = sm90_smem_u32(&empty_bar[prev]);
        sm90_mbar_arrive(a);
        if constexpr (CL > 1) sm90_mbar_arrive_cluster(sm90_mapa(a, sm90_cluster_ctarank() ^ 1u));
    }
    __syncwarp();
}

/* The producer's copy of one operand's k-block (from k0) and R rows or
 * columns (from r0) into the stage at dst, completing on full barrier fb:
 * k-major (KM) one {64 k, R} box, otherwise R / 64 {64, 64 k} boxes. */
template <bool KM, int R>
__device__ __forceinline__ void mm_wg_load(uint32_t dst, const CUtensorMap *map, int k0, int r0, uint32_t fb) {
    if (KM) {
        sm90_tma_2d(dst, map, k0, r0, fb);
    } else {
#pragma unroll
        for (int i = 0; i < R / 64; i++) sm90_tma_2d(dst + i * WG_BOX_BYTES, map, r0 + 64 * i, k0, fb);
    }
}

/* The producer, one thread: every k-block of every item of the block's walk
 * into the STAGES-stage ring at base (stage s at base + s (A + B bytes): A
 * BM x 64 then B BN x 64, bf16), waiting for the stage's empty barrier and
 * completing its full one. A k-major (AK) is one {64 k, BM m} box, m-major
 * BM / 64 {64 m, 64 k} boxes; B likewise with BK and BN. It walks the
 * items as the consumers do (mm_wg_walk). */
template <bool AK, bool BK, int BM, int BN, int STAGES, int CL = 1, bool SK = true>
__device__ __forceinline__ void mm_wg_produce(const CUtensorMap *tmA, const CUtensorMap *tmB, uint64_t *full_bar,
                                              uint64_t *empty_bar, uint32_t base, const MmWgWalk &walk, int M) {
    constexpr int A_BYTES = BM * WG_BK * 2, STAGE_BYTES = A_BYTES + BN * WG_BK * 2;
    const int rank = CL > 1 ? (int)sm90_cluster_ctarank() : 0;
    int it = 0;
    MmWgItem w;
    for (int j = 0; mm_wg_walk<BM, BN, CL, SK>(walk, mm_wg_first<CL>(), mm_wg_stride<CL>(), j, rank, w); j++) {
        const int m0 = w.m0, n0 = w.n0;
        for (int kb = w.kb0; kb < w.kb1; kb++, it++) {
            const int s = it % STAGES;
            const uint32_t parity = (uint32_t)(it / STAGES) & 1u;
            const uint32_t fb = sm90_smem_u32(&full_bar[s]);
            sm90_mbar_wait(sm90_smem_u32(&empty_bar[s]), parity ^ 1u);
            sm90_mbar_expect_tx(fb, STAGE_BYTES);
            const uint32_t sa = base + s * STAGE_BYTES, sb = sa + A_BYTES;
            const int k0 = kb * WG_BK;
            if constexpr (CL > 1) {
                /* A: this CTA's rows (a tile past M, the second of an odd
                 * column's last pair, loads its partner's: never stored);
                 * B: half `rank` of the shared tile, 64 n (a {64 k, 64 n}
                 * box, or one {64 n, 64 k}), into both CTAs' stage s */
                mm_wg_load<AK, BM>(sa, tmA, k0, m0 < M ? m0 : m0 - BM, fb);
                const int nh = n0 + 64 * rank;
                sm90_tma_2d_multicast(sb + rank * WG_BOX_BYTES, tmB, BK ? k0 : nh, BK ? nh : k0, fb,
                                      (uint16_t)((1u << CL) - 1u));
            } else {
                mm_wg_load<AK, BM>(sa, tmA, k0, m0, fb);
                mm_wg_load<BK, BN>(sb, tmB, k0, n0, fb);
            }
        }
    }
}

/* What a consumer warpgroup of mm_wgmma_kernel holds: the kernel's
 * arguments (its comment), the ring (base: stage s at base + s stage bytes;
 * full_bar, empty_bar), the walk (mm_wg_walk's), and its place: warpgroup
 * c (0, 1), warp, lane and the warp's epilogue chunk ep (after the stages). */
struct MmWg {
    const CUtensorMap *tmD;  /* TS: D's store map */
    void *D;
    int d_fp32, accumulate;
    const bf16 *bias;
    int M, N, vec_ok;
    float *work;
    int vec_w;
    uint32_t base;
    uint64_t *full_bar, *empty_bar;
    MmWgWalk walk;
    int c, warp, lane;
    float *ep;
    unsigned char *stg;  /* TS: the warpgroup's staging buffer, and its shared address */
    uint32_t stg_s;
    const bf16 *gpre;    /* [M][N] or NULL: the GELU-backward epilogue's pre-activation */
    bf16 *gout;          /* [M][N] or NULL: the GELU-forward epilogue's second output */
    float *bgw;          /* [ceil(M / 128)][N] or NULL: the bias sums of the stored tiles (mm_wg_bias_sums) */
};

/* Where item w's tile goes: part 0 to D (with bias, the old D when
 * accumulating, vec_ok); the others plain float32 to work: split-K's part
 * p to work [p - 1][M][N] at the tile's place, stream-K's part b (a
 * walker's first segment) to work slot b - 1, a [TM][TN] tile (TM = BM CL,
 * TN = BN; vec_w says which the host checked), this CTA's rows from
 * slot_row. */
struct MmWgOut {
    void *p;
    int fp32, acc, M, N, m0, n0, vec;
    const bf16 *bias, *gpre;
    bf16 *gout;
};
template <int TM, int TN>
__device__ __forceinline__ MmWgOut mm_wg_out(const MmWg &g, const MmWgItem &w, int slot_row) {
    if (w.part == 0)
        return MmWgOut{g.D, g.d_fp32, g.accumulate, g.M, g.N, w.m0, w.n0, g.vec_ok, g.bias, g.gpre, g.gout};
    if (g.walk.sk_len)
        return MmWgOut{g.work + (size_t)(w.part - 1) * TM * TN, 1, 0, TM, TN, slot_row, 0, g.vec_w, NULL, NULL, NULL};
    return MmWgOut{g.work + (size_t)(w.part - 1) * g.M * g.N, 1, 0, g.M, g.N, w.m0, w.n0, g.vec_w, NULL, NULL, NULL};
}

/* A consumer's wait for ring stage it % STAGES to land; returns the stage.
 * The lanes leave the spin together before the .aligned wgmma. */
template <int STAGES>
__device__ __forceinline__ int mm_wg_stage_wait(uint64_t *full_bar, int it) {
    const int s = it % STAGES;
    const uint32_t parity = (uint32_t)(it / STAGES) & 1u;
    sm90_mbar_wait(sm90_smem_u32(&full_bar[s]), parity);
    __syncwarp();
    return s;
}

/* After a k-block's wgmmas were issued on stage s: commits them, waits for
 * the previous k-block's group and frees its stage prev; returns s, the
 * next prev. */
template <int CL = 1>
__device__ __forceinline__ int mm_wg_retire(uint64_t *empty_bar, int prev, int s, int lane) {
    sm90_wgmma_commit();
    sm90_wgmma_wait<1>();
    mm_wg_release<CL>(empty_bar, prev, lane);
    return s;
}

/* After a tile's last k-block: waits for every wgmma, fences the
 * accumulators d and frees the last stage prev. */
template <int CL = 1>
__device__ __forceinline__ void mm_wg_drain(float (&d)[128], uint64_t *empty_bar, int prev, int lane) {
    sm90_wgmma_wait<0>();
    sm90_fence_regs(d);
    mm_wg_release<CL>(empty_bar, prev, lane);
}

/* fc's bias gradient from the GELU-backward product's tiles (bgw): after
 * the `nt` threads that stored the 128 x nt tile at (m0, n0) of D [M][N]
 * bf16 meet at named barrier `bar` (bar.sync orders their global stores
 * before the reads below), thread t sums column n0 + t of the stored bf16
 * rows m0 .. min(M, m0 + 128) - 1 exactly as mm_bias_grad_split_kernel
 * sums that chunk: 8 row lanes (rows m0 + y, m0 + y + 8, ..., each from
 * 0.0f), added in order 0..7, into bgw [m0 / 128][n] (columns >= N and
 * tiles past M write nothing). tc_partials_add then adds the chunks, so
 * dbias gets tc_bias_grad's bits. The reads are the tile just stored (32
 * KB, from L1 / L2). */
__device__ __forceinline__ void mm_wg_bias_sums(float *bgw, const bf16 *D, int M, int N, int m0, int n0, int t,
                                                int bar, int nt) {
    sm90_bar_sync(bar, nt);
    const int n = n0 + t;
    if (m0 >= M || n >= N) return;
    const int m1 = min(M, m0 + MM_BG_ROWS);
    const bf16 *col = D + n;
    float tot = 0.0f;
    for (int y = 0; y < 8; y++) {
        /* a lane's 16 loads unrolled, all in flight at once (the adds stay in row order) */
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < MM_BG_ROWS / 8; i++) {
            const int m = m0 + y + 8 * i;
            if (m < m1) s += __bfloat162float(col[(size_t)m * N]);
        }
        tot = y == 0 ? s : tot + s;
    }
    bgw[(size_t)(m0 / MM_BG_ROWS) * N + n] = tot;
}

/* mm_wgmma_kernel<false>'s consumers, the cooperative schedule: both
 * warpgroups on every 128 x 256 tile, warpgroup c its rows 64c..64c+63. */
template <bool AK, bool BK>
__device__ __forceinline__ void mm_wg_coop(const MmWg &g) {
    const int c = g.c, warp = g.warp, lane = g.lane;
    float d[128];
    int it = 0;
    MmWgItem w;
    for (int j = 0; mm_wg_walk<WG_BM, WG_BN>(g.walk, blockIdx.x, gridDim.x, j, 0, w); j++) {
#pragma unroll
        for (int i = 0; i < 128; i++) d[i] = 0.0f;
        int prev = -1;  /* stage whose wgmma may still be reading */
        for (int kb = w.kb0; kb < w.kb1; kb++, it++) {
            const int s = mm_wg_stage_wait<WG_STAGES>(g.full_bar, it);
            const uint32_t sa = g.base + s * WG_STAGE_BYTES + c * WG_BOX_BYTES;
            const uint32_t sb = g.base + s * WG_STAGE_BYTES + WG_A_BYTES;
            sm90_wgmma_fence();
#pragma unroll
            for (int k16 = 0; k16 < WG_BK / 16; k16++) {
                const uint64_t da = AK ? sm90_desc(sa + 32 * k16, 16, 1024)
                                       : sm90_desc(sa + 2048 * k16, WG_BOX_BYTES, 1024);
                const uint64_t db = BK ? sm90_desc(sb + 32 * k16, 16, 1024)
                                       : sm90_desc(sb + 2048 * k16, WG_BOX_BYTES, 1024);
                sm90_wgmma_m64n256<AK ? 0 : 1, BK ? 0 : 1>(d, da, db);
            }
            prev = mm_wg_retire(g.empty_bar, prev, s, lane);
        }
        mm_wg_drain(d, g.empty_bar, prev, lane);

        const MmWgOut o = mm_wg_out<WG_BM, WG_BN>(g, w, 0);
        mm_wg_epilogue<8, 0, false>(d, g.ep, o.p, o.fp32, o.acc, o.bias, o.M, o.N, o.m0 + c * 64 + warp * 16,
                                    o.n0, o.vec, lane, o.gpre, o.gout);
        /* the tile's 128 rows are both warpgroups': a 256-column sum each thread's */
        if (g.bgw)
            mm_wg_bias_sums(g.bgw, (const bf16 *)o.p, o.M, o.N, o.m0, o.n0, c * 128 + warp * 32 + lane, PP_BAR_BG,
                            256);
    }
}

/* mm_wgmma_kernel<true>'s consumers, the ping-pong schedule (TC_WGMMA; the
 * header's "Ping-pong"). As the cooperative one, but a work item is a 128 x 128 tile (tiles_m =
 * ceil(M / 128) fastest, then ceil(N / 128)) and the two consumer
 * warpgroups take the block's items in turn: the j-th item this block
 * walks (item blockIdx.x + j gridDim.x) belongs to warpgroup j % 2, which
 * computes all 128 rows of it (two m64n128k16 a k16 step into the halves
 * of d) while the other stores its previous tile. The producer fills the
 * 6-stage ring in the items' order; each stage is read by one warpgroup
 * (empty[s] counts its 4 warps), and a warpgroup skips the other's
 * k-blocks in its count of the ring. Named barrier PP_BAR_MATH + c orders
 * the math: warpgroup c waits there before each tile but its first (item
 * j > 0), and the other warpgroup arrives there when its mainloop of item
 * j - 1 is done (only when an item j follows: every arrival is waited
 * for). Same split-K as the cooperative one; tmB's k-major box is {64 k,
 * 128 n}. CL > 1, the cluster kernel (TC_WGMMA_CLUSTER): the cluster walks
 * columns of CL tiles (mm_wg_walk), this CTA its rank's, and a stage is
 * freed at both CTAs' empty barriers (mm_wg_release); tmB's k-major box is
 * {64 k, 64 n}, half the tile. */
template <bool AK, bool BK, int CL = 1, bool TS = false>
__device__ __forceinline__ void mm_wg_pingpong(const MmWg &g) {
    float *ep = g.ep;
    const int c = g.c, lane = g.lane, warp = g.warp;
    const int rank = CL > 1 ? (int)sm90_cluster_ctarank() : 0;
    const int b = mm_wg_first<CL>(), W = mm_wg_stride<CL>();
    float d[128];  /* rows 0-63 of the tile in d[0..63], rows 64-127 in d[64..127] */
    int it = 0;
    MmWgItem w, next;
    for (int j = 0; mm_wg_walk<PP_BM, PP_BN, CL, !TS>(g.walk, b, W, j, rank, w); j++) {
        const int m0 = w.m0, n0 = w.n0, kb0 = w.kb0, kb1 = w.kb1;
        if ((j & 1) != c) {  /* the other warpgroup's tile: its stages, not ours */
            it += kb1 - kb0;
            continue;
        }
        if (j > 0) sm90_bar_sync(PP_BAR_MATH + c, 256);  /* the other's mainloop of item j - 1 is done */
#pragma unroll
        for (int i = 0; i < 128; i++) d[i] = 0.0f;
        int prev = -1;
        for (int kb = kb0; kb < kb1; kb++, it++) {
            const int s = mm_wg_stage_wait<PP_STAGES>(g.full_bar, it);
            const uint32_t sa = g.base + s * PP_STAGE_BYTES;
            const uint32_t sb = sa + PP_A_BYTES;
            sm90_wgmma_fence();
#pragma unroll
            for (int k16 = 0; k16 < WG_BK / 16; k16++) {
                /* rows 64h..64h+63: A k-major +8192 h (64 rows of 128 bytes); m-major box h */
                const uint64_t da0 = AK ? sm90_desc(sa + 32 * k16, 16, 1024)
                                        : sm90_desc(sa + 2048 * k16, WG_BOX_BYTES, 1024);
                const uint64_t da1 = AK ? sm90_desc(sa + WG_BOX_BYTES + 32 * k16, 16, 1024)
                                        : sm90_desc(sa + WG_BOX_BYTES + 2048 * k16, WG_BOX_BYTES, 1024);
                const uint64_t db = BK ? sm90_desc(sb + 32 * k16, 16, 1024)
                                       : sm90_desc(sb + 2048 * k16, WG_BOX_BYTES, 1024);
                sm90_wgmma_m64n128<AK ? 0 : 1, BK ? 0 : 1, 0>(d, da0, db);
                sm90_wgmma_m64n128<AK ? 0 : 1, BK ? 0 : 1, 64>(d, da1, db);
            }
            prev = mm_wg_retire<CL>(g.empty_bar, prev, s, lane);
        }
        mm_wg_drain<CL>(d, g.empty_bar, prev, lane);
        /* the other warpgroup's item j + 1 may take the tensor cores while we store */
        if (mm_wg_walk<PP_BM, PP_BN, CL, !TS>(g.walk, b, W, j + 1, rank, next))
            sm90_bar_arrive(PP_BAR_MATH + (1 - c), 256);

        if constexpr (TS) {  /* bf16 D written, one part: through TMA */
            mm_wg_epilogue_tma(d, g.stg, g.stg_s, g.tmD, g.bias, g.M, g.N, m0, n0, c, warp, lane);
            continue;
        }
        const MmWgOut o = mm_wg_out<PP_BM * CL, PP_BN>(g, w, rank * PP_BM);
        mm_wg_epilogue<4, 0, true>(d, ep, o.p, o.fp32, o.acc, o.bias, o.M, o.N, o.m0 + warp * 16, o.n0, o.vec, lane,
                                   o.gpre, o.gout);
        mm_wg_epilogue<4, 64, true>(d, ep, o.p, o.fp32, o.acc, o.bias, o.M, o.N, o.m0 + 64 + warp * 16, o.n0, o.vec,
                                    lane, o.gpre, o.gout);
        if (g.bgw)
            mm_wg_bias_sums(g.bgw, (const bf16 *)o.p, o.M, o.N, o.m0, o.n0, warp * 32 + lane, PP_BAR_EPI + c, 128);
    }
    /* TS: the last stores have read the staging buffer before the block's shared memory goes */
    if constexpr (TS)
        if (warp == 0 && lane == 0) sm90_bulk_wait_read<0>();
}
#endif

/* The wgmma kernels, one signature and prologue: PP the ping-pong
 * schedule (mm_wg_pingpong), otherwise the cooperative one (mm_wg_coop).
 * D [M][N]; A [M][K] (AK) or [K][M], through tmA; B [N][K] (BK) or [K][N],
 * through tmB; bias [N] or NULL. Grid min(#SMs, #tiles x splits), 384
 * threads, WG_SMEM_BYTES dynamic. The walk (mm_wg_walk): split-K (sk_len
 * 0), work item w is tile w % tiles over the k-blocks [p kps, (p + 1) kps)
 * of part p = w / tiles; part p > 0 goes to work [splits - 1][M][N], part 0
 * to D. Stream-K (sk_len > 0, splits 1; grid: the plan's walkers): tiles
 * below sk_dp whole, then each walker's sk_len (tile, k-block) pairs of
 * the rest; a segment that starts inside a tile goes to work slot b - 1
 * ([BM CL][BN] floats), the others to D. vec_ok and vec_w: D and work take
 * mm_wg_epilogue's 16-byte pieces. CL > 1 (with PP: TC_WGMMA_CLUSTER):
 * launched in clusters of CL CTAs along x, grid CL x min(the clusters that
 * fit, columns of CL tiles x splits), a work item a column. group (>= 1):
 * m-tiles (CL > 1: columns) a band of the tile order (mm_wg_tile). gpre
 * [M][N] or NULL: the GELU-backward epilogue, gout [M][N] or NULL: the
 * GELU-forward one (mm_wg_epilogue's; never TS). bgw [ceil(M / 128)][N] or
 * NULL (with gpre only; N % 8 == 0): each stored tile's column sums into
 * its chunk's row (mm_wg_bias_sums). */
template <bool PP, bool AK, bool BK, int CL = 1, bool TS = false>
__global__ void __launch_bounds__(WG_THREADS, 1)
mm_wgmma_kernel(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB,
                const __grid_constant__ CUtensorMap tmD, void *D, int d_fp32, int accumulate, const bf16 *bias, int M, int N, int K,
                int vec_ok, float *work, int splits, int kps, int vec_w, int group, int sk_dp, int sk_len,
                const bf16 *gpre, bf16 *gout, float *bgw) {
    static_assert(PP || !TS, "the TMA-store epilogue is the ping-pong schedule's");
#if SM90_BUILD
    constexpr int BM = PP ? PP_BM : WG_BM, BN = PP ? PP_BN : WG_BN, STAGES = PP ? PP_STAGES : WG_STAGES;
    constexpr int STAGE_BYTES = PP ? PP_STAGE_BYTES : WG_STAGE_BYTES;
    __shared__ __align__(8) uint64_t full_bar[STAGES];
    __shared__ __align__(8) uint64_t empty_bar[STAGES];
    extern __shared__ __align__(16) unsigned char mm_smem[];
    /* Stages at base + s * STAGE_BYTES, every box on a 1024-byte boundary as
     * the 128-byte swizzle requires. Cooperative (49152 a stage): A (16 KB)
     * then B (32 KB). Ping-pong (32768): A (16 KB: one {64 k, 128 m} box, or
     * two {64 m, 64 k}) then B (16 KB: one {64 k, 128 n} box, or two {64 n,
     * 64 k}). */
    const uint32_t base = (sm90_smem_u32(mm_smem) + 1023u) & ~1023u;
    const int tiles_m = (M + BM * CL - 1) / (BM * CL);  /* CL > 1: columns of CL tiles */
    const int tiles = tiles_m * ((N + BN - 1) / BN);
    const MmWgWalk walk{tiles_m, tiles, group, tiles * splits, kps, (K + WG_BK - 1) / WG_BK, sk_dp, sk_len};
    const int wg = threadIdx.x >> 7;

    /* empty: the consuming warps, both warpgroups' or (ping-pong) one's, of
     * each CTA of the cluster (CL > 1: every CTA's producer writes B into
     * this stage) */
    mm_wg_init_bars<STAGES>(full_bar, empty_bar, PP ? 4 * CL : WG_CONSUMER_WARPS);
    if constexpr (CL > 1) {
        /* every CTA's barriers initialised before a peer multicasts or arrives there */
        sm90_cluster_sync();
    } else {
        __syncthreads();
    }

    if (wg == 0) {
        /* Producer: one thread issues every copy; the rest of the warpgroup
         * only gives its registers back. */
        sm90_setmaxnreg_dec<40>();
        if (threadIdx.x == 0)
            mm_wg_produce<AK, BK, BM, BN, STAGES, CL, !TS>(&tmA, &tmB, full_bar, empty_bar, base, walk, M);
    } else {
        sm90_setmaxnreg_inc<232>();
        MmWg g{&tmD, D, d_fp32, accumulate, bias, M, N, vec_ok, work, vec_w, base, full_bar, empty_bar, walk};
        g.c = wg - 1;
        g.warp = (threadIdx.x >> 5) & 3, g.lane = threadIdx.x & 31;
        /* after the stages: the 8 warps' epilogue chunks, or (TS) the 2
         * warpgroups' staging buffers, 1024-byte aligned as the swizzle needs */
        unsigned char *after = mm_smem + (base - sm90_smem_u32(mm_smem)) + STAGES * STAGE_BYTES;
        g.ep = reinterpret_cast<float *>(after + (g.c * 4 + g.warp) * WG_EPI_WARP_BYTES);
        g.stg = after + g.c * TS_STAGE_BYTES;
        g.stg_s = base + STAGES * STAGE_BYTES + g.c * TS_STAGE_BYTES;
        g.gpre = gpre;
        g.gout = gout;
        g.bgw = bgw;
        if constexpr (PP)
            mm_wg_pingpong<AK, BK, CL, TS>(g);
        else
            mm_wg_coop<AK, BK>(g);
    }
    if constexpr (CL > 1) {
        /* no CTA exits while its peer may still multicast into its stages
         * or arrive on its empty barriers */
        sm90_cluster_sync();
    }
#endif
}

/* ---------------------------------------------------------------------------
 * tc_bias_grad: dbias[N] += sum over m of dout[M][N], deterministic, dout
 * bf16 or float32 (T).
 *
 * Split (with a work buffer, N % 8 == 0, dout 16-byte aligned): the rows in
 * chunks of MM_BG_ROWS, a block a chunk and 256 columns (32 x 8 threads, a
 * thread 8 columns, one 16-byte load a row in bf16, two in float32; rows
 * ty, ty+8, ...), its 8 row lanes added in order into work [chunks][N];
 * then tc_partials_add adds the chunks to dbias. At GPT-2's 16384 rows that
 * is 128 chunks and 384-1536 blocks.
 *
 * Whole (no work buffer, or an odd N): block 32 (columns) x 16 (row lanes),
 * all rows; each thread keeps 4 partial sums (rows y, y+16, y+32, y+48 of
 * every 64) for loads in flight, then the block adds its 16 row lanes in
 * order. Its grid is N / 32 blocks, 24 at N = 768: on an H200 the bias
 * gradients took an estimated 7 ms of a 56 ms step this way. */

__device__ __forceinline__ float mm_to_f32(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float mm_to_f32(float x) { return x; }

template <typename T>
__global__ void __launch_bounds__(512)
mm_bias_grad_kernel(float *dbias, const T *dout, int M, int N) {
    __shared__ float part[16][33];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int n = blockIdx.x * 32 + tx;
    float s = 0.0f;
    if (n < N) {
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
        int m = ty;
        for (; m + 48 < M; m += 64) {
            s0 += mm_to_f32(dout[(size_t)m * N + n]);
            s1 += mm_to_f32(dout[(size_t)(m + 16) * N + n]);
            s2 += mm_to_f32(dout[(size_t)(m + 32) * N + n]);
            s3 += mm_to_f32(dout[(size_t)(m + 48) * N + n]);
        }
        for (; m < M; m += 16) s0 += mm_to_f32(dout[(size_t)m * N + n]);
        s = (s0 + s1) + (s2 + s3);
    }
    part[ty][tx] = s;
    __syncthreads();
    if (ty == 0 && n < N) {
        float t = part[0][tx];
        for (int y = 1; y < 16; y++) t += part[y][tx];
        dbias[n] += t;
    }
}

// work [gridDim.y][N]: the column sums of dout's rows [y * MM_BG_ROWS, +MM_BG_ROWS)
template <typename T>
__global__ void __launch_bounds__(256)
mm_bias_grad_split_kernel(float *work, const T *dout, int M, int N) {
    __shared__ float part[8][256 + 4];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int n0 = blockIdx.x * 256 + tx * 8;
    const int m0 = blockIdx.y * MM_BG_ROWS, m1 = min(M, m0 + MM_BG_ROWS);
    float s[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    if (n0 < N) {
        for (int m = m0 + ty; m < m1; m += 8) {
            const T *row = dout + (size_t)m * N + n0;  // 8 values, 16 or 32 bytes
            if constexpr (sizeof(T) == 2) {
                const uint4 u = *reinterpret_cast<const uint4 *>(row);
                const bf16 *h = reinterpret_cast<const bf16 *>(&u);
#pragma unroll
                for (int k = 0; k < 8; k++) s[k] += __bfloat162float(h[k]);
            } else {
                const float4 a = *reinterpret_cast<const float4 *>(row);
                const float4 b = *reinterpret_cast<const float4 *>(row + 4);
                s[0] += a.x; s[1] += a.y; s[2] += a.z; s[3] += a.w;
                s[4] += b.x; s[5] += b.y; s[6] += b.z; s[7] += b.w;
            }
        }
    }
#pragma unroll
    for (int k = 0; k < 8; k++) part[ty][tx * 8 + k] = s[k];
    __syncthreads();
    const int c = ty * 32 + tx, n = blockIdx.x * 256 + c;  // a thread a column of the block's 256
    if (n < N) {
        float t = part[0][c];
        for (int y = 1; y < 8; y++) t += part[y][c];
        work[(size_t)blockIdx.y * N + n] = t;
    }
}

// out [n] += sum over k < chunks of partial [k][n] in a fixed order: block 32
// columns x 16 lanes, lane y adding chunks y, y + 16, ... in order, then the
// lanes in order (one thread a column would walk every chunk in a chain of
// loads: latency, not bandwidth, with 768 threads in all at GPT-2's width).
__global__ void mm_partials_add_kernel(float *out, const float *partial, int chunks, int n_cols) {
    __shared__ float lane[16][33];
    const int n = blockIdx.x * 32 + threadIdx.x, y = threadIdx.y;
    float t = 0.0f;
    if (n < n_cols)
        for (int k = y; k < chunks; k += 16) t += partial[(size_t)k * n_cols + n];
    lane[y][threadIdx.x] = t;
    __syncthreads();
    if (y == 0 && n < n_cols) {
        for (int j = 1; j < 16; j++) t += lane[j][threadIdx.x];
        out[n] += t;
    }
}

/* ---------------------------------------------------------------------------
 * Split-K's sum: D [n] += work [parts][n] summed over parts in order (part 0
 * is already in D), float4 at a time when V4 (n % 4 == 0, D and work
 * 16-byte aligned). The same order every run: no atomics. */

template <bool V4>
__global__ void mm_splitk_sum_kernel(float *D, const float *work, int parts, size_t n) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    if (V4) {
        for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n / 4; i += stride) {
            float4 s = ((const float4 *)work)[i];
            for (int p = 1; p < parts; p++) {
                const float4 w = ((const float4 *)(work + (size_t)p * n))[i];
                s.x += w.x;
                s.y += w.y;
                s.z += w.z;
                s.w += w.w;
            }
            float4 d = ((float4 *)D)[i];
            d.x += s.x;
            d.y += s.y;
            d.z += s.z;
            d.w += s.w;
            ((float4 *)D)[i] = d;
        }
    } else {
        for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
            float s = work[i];
            for (int p = 1; p < parts; p++) s += work[(size_t)p * n + i];
            D[i] += s;
        }
    }
}

/* ---------------------------------------------------------------------------
 * Stream-K's fix-up (the header's "Stream-K"): D [M][N] += the parts in
 * work [walkers - 1][TM][TN] of every tile from sk_dp on that more than one
 * walker shared, in walker order (the first walker's part is already in
 * D): the same order every run, no atomics. Tile sk_dp + x (blockIdx.x)
 * covers pairs [x nk, (x + 1) nk) of the walkers' shares of L: walkers b0
 * = x nk / L to b1 = ((x + 1) nk - 1) / L, whose parts b0 + 1 .. b1 sit
 * in slots b0 .. b1 - 1. Its place: mm_wg_tile's (tiles_m, tiles, group)
 * in units of TM x TN. Grid (tiles past sk_dp, y), 256 threads. */
__global__ void mm_streamk_fixup_kernel(float *D, const float *work, int M, int N, int TM, int TN, int tiles_m,
                                        int tiles, int group, int sk_dp, int nk, int L) {
    const long long g0 = (long long)blockIdx.x * nk;
    const int b0 = (int)(g0 / L), b1 = (int)((g0 + nk - 1) / L);
    if (b1 == b0) return;  /* one walker's: whole in D already */
    const int2 mn = mm_wg_tile(sk_dp + (int)blockIdx.x, tiles_m, tiles, group);
    const int m0 = mn.x * TM, n0 = mn.y * TN, area = TM * TN;
    for (int e = blockIdx.y * blockDim.x + threadIdx.x; e < area; e += gridDim.y * blockDim.x) {
        const int r = e / TN, c = e - r * TN;
        if (m0 + r >= M || n0 + c >= N) continue;
        const float *p = work + (size_t)b0 * area + e;
        float s = p[0];
        for (int b = b0 + 1; b < b1; b++) s += p[(size_t)(b - b0) * area];
        D[(size_t)(m0 + r) * N + n0 + c] += s;
    }
}

/* ---------------------------------------------------------------------------
 * Host side. */

#define MM_MAX_DEVICES 64
#define MM_CAP_KNOWN 1
#define MM_CAP_MMA 2
#define MM_CAP_WGMMA 4
#define MM_CAP_SM_SHIFT 8

/* Capability word of each device (see the header): written once, read with
 * acquire; two threads racing on a first call compute the same word. And
 * the clusters of the cluster kernel that fit each device at once
 * (cudaOccupancyMaxActiveClusters; 0: it does not run there), stored before
 * the word. */
static std::atomic<int> mm_caps[MM_MAX_DEVICES];
static std::atomic<int> mm_clusters[MM_MAX_DEVICES];

/* How many clusters of CL_CTAS of the cluster kernel can run at once here
 * (the persistent grid's size), or 0. */
static int mm_max_clusters() {
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = CL_CTAS;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    /* grid, block, dynamic shared memory, stream, attributes (in order: the
     * emulation's gridDim macro hides the field names) */
    cudaLaunchConfig_t cfg = {dim3(CL_CTAS), dim3(WG_THREADS), PP_SMEM_BYTES, 0, at, 1};
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, mm_wgmma_kernel<true, true, true, CL_CTAS>, &cfg) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

/* Raises the dynamic shared memory limit of kernel f; false when the device
 * has no code for f (or not that much shared memory). */
template <typename F> static bool mm_set_smem(F *f, int bytes) {
    if (cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) == cudaSuccess)
        return true;
    cudaGetLastError();
    return false;
}

static int mm_device_caps(cudaStream_t stream) {
    int dev;
    CUDA_CHECK(cudaGetDevice(&dev));
    if (dev >= 0 && dev < MM_MAX_DEVICES) {
        int c = mm_caps[dev].load(std::memory_order_acquire);
        if (c) return c;
    }
    int major = 0, minor = 0, sms = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    int caps = MM_CAP_KNOWN | (sms << MM_CAP_SM_SHIFT);
    if (major >= 8 && mm_set_smem(mm_mma_kernel<true, true>, MM_SMEM_BYTES) &&
        mm_set_smem(mm_mma_kernel<true, false>, MM_SMEM_BYTES) &&
        mm_set_smem(mm_mma_kernel<false, true>, MM_SMEM_BYTES) &&
        mm_set_smem(mm_mma_kernel<false, false>, MM_SMEM_BYTES))
        caps |= MM_CAP_MMA;
    if (major == 9 && minor == 0 && (caps & MM_CAP_MMA)) {
        /* Does the code loaded for this device hold the sm_90a kernels? */
        int built = 0;
        mm_probe_kernel<<<1, 1, 0, stream>>>();
        if (cudaGetLastError() == cudaSuccess &&
            cudaMemcpyFromSymbolAsync(&built, mm_probe_flag, sizeof built, 0,
                                      cudaMemcpyDeviceToHost, stream) == cudaSuccess &&
            cudaStreamSynchronize(stream) == cudaSuccess) {
            if (built == 1 && mm_set_smem(mm_wgmma_kernel<false, true, true>, WG_SMEM_BYTES) &&
                mm_set_smem(mm_wgmma_kernel<false, true, false>, WG_SMEM_BYTES) &&
                mm_set_smem(mm_wgmma_kernel<false, false, true>, WG_SMEM_BYTES) &&
                mm_set_smem(mm_wgmma_kernel<false, false, false>, WG_SMEM_BYTES) &&
                mm_set_smem(mm_wgmma_kernel<true, true, true>, PP_SMEM_BYTES) &&
                mm_set_smem(mm_wgmma_kernel<true, true, false>, PP_SMEM_BYTES) &&
                mm_set_smem(mm_wgmma_kernel<true, false, true>, PP_SMEM_BYTES) &&
                mm_set_smem(mm_wgmma_kernel<true, false, false>, PP_SMEM_BYTES) &&
                mm_set_smem(mm_wgmma_kernel<true, true, true, 1, true>, PP_TS_SMEM_BYTES) &&
                mm_set_smem(mm_wgmma_kernel<true, true, false, 1, true>, PP_TS_SMEM_BYTES) &&
                mm_set_smem(mm_wgmma_kernel<true, false, true, 1, true>, PP_TS_SMEM_BYTES) &&
                mm_set_smem(mm_wgmma_kernel<true, false, false, 1, true>, PP_TS_SMEM_BYTES))
                caps |= MM_CAP_WGMMA;
            if ((caps & MM_CAP_WGMMA) && mm_set_smem(mm_wgmma_kernel<true, true, true, CL_CTAS>, PP_SMEM_BYTES) &&
                mm_set_smem(mm_wgmma_kernel<true, true, false, CL_CTAS>, PP_SMEM_BYTES) &&
                mm_set_smem(mm_wgmma_kernel<true, false, true, CL_CTAS>, PP_SMEM_BYTES) &&
                mm_set_smem(mm_wgmma_kernel<true, false, false, CL_CTAS>, PP_SMEM_BYTES) &&
                mm_set_smem(mm_wgmma_kernel<true, true, true, CL_CTAS, true>, PP_TS_SMEM_BYTES) &&
                mm_set_smem(mm_wgmma_kernel<true, true, false, CL_CTAS, true>, PP_TS_SMEM_BYTES) &&
                mm_set_smem(mm_wgmma_kernel<true, false, true, CL_CTAS, true>, PP_TS_SMEM_BYTES) &&
                mm_set_smem(mm_wgmma_kernel<true, false, false, CL_CTAS, true>, PP_TS_SMEM_BYTES) && dev >= 0 &&
                dev < MM_MAX_DEVICES)
                mm_clusters[dev].store(mm_max_clusters(), std::memory_order_relaxed);
        } else {
            cudaGetLastError();
        }
    }
    if (dev >= 0 && dev < MM_MAX_DEVICES) mm_caps[dev].store(caps, std::memory_order_release);
    return caps;
}

/* Whether cp.async / TMA can move this problem: 16-byte aligned operands,
 * contiguous dimensions multiples of 8 elements, grid limits. */
static bool mm_aligned(const void *A, int a_kmajor, const void *B, int b_kmajor, int M, int N,
                       int K) {
    if (((uintptr_t)A & 15) || ((uintptr_t)B & 15)) return false;
    if ((a_kmajor ? K : M) % 8 || (b_kmajor ? K : N) % 8) return false;
    return K >= 1;
}

static int mm_pair_ok(const void *D, int d_fp32, int N) {
    return N % 2 == 0 && ((uintptr_t)D & (d_fp32 ? 7 : 3)) == 0;
}

/* Whether rows of D [M][N] split into 16-byte pieces (8 bf16 or 4 floats),
 * with bias's matching pieces (16 or 8 bytes) aligned too. */
static int mm_vec_ok(const void *D, int d_fp32, const void *bias, int N) {
    const int w = d_fp32 ? 4 : 8;
    return N % w == 0 && ((uintptr_t)D & 15) == 0 &&
           (!bias || ((uintptr_t)bias & (d_fp32 ? 7 : 15)) == 0);
}

/* Split-K: a product with few output tiles and a long K (a weight
 * gradient: 768 x 768 is 18 wgmma tiles for 132 SMs) leaves most SMs idle,
 * so its k-blocks are cut into `splits` parts of kps each, every (tile,
 * part) a block's work: part 0 goes to D as usual, the others to the
 * caller's float32 work buffer, and mm_splitk_sum_kernel adds them to D in
 * part order. Only for float32 D (the sum stays in float32) and only with
 * room in work for splits - 1 parts of M x N.
 *
 * The count is the one a simple time model says is fastest: waves x kps
 * k-blocks of mainloop (waves = ceil(tiles x splits / slots), slots the
 * blocks that run at once) plus the sum's traffic, (splits + 1) M N 4 bytes,
 * priced at 0.4 byte per flop of one SM's k-block (H100: 3.35 TB/s against
 * 989 TFLOP/s over 132 SMs; A100: 2 TB/s against 312 over 108). Ties go to
 * fewer parts. A prediction: bench/NOTES.md holds what to check.
 *
 * The wgmma kernels (tm > 0: their tile, tm x tn) also weigh the stream-K
 * form (the header's "Stream-K", mm_plan_streamk): dp / slots waves of whole
 * tiles, then L k-blocks a walker, plus its fix-up's traffic at the same
 * price; it is taken only where that is less than the best split-K's (a
 * tie keeps split-K; its fix-up's launch counts where split-K's best
 * launches no sum). */
typedef struct MmSplit {
    int splits, kps;  /* parts, and k-blocks in each (the last may have fewer); stream-K: 1, and the
                         longest work item's k-blocks */
    int sk_len, sk_dp, sk_walkers;  /* stream-K (sk_len > 0): k-blocks a walker's share, the tiles done
                                       whole first, walkers launched; 0, 0, 0 otherwise */
} MmSplit;

/* Stream-K over W walkers for `tiles` tiles of nk k-blocks each (slot_floats
 * a tile's work slot): the tiles of the full waves, floor(tiles / W) W,
 * whole; the rest's left x nk (tile, k-block) pairs cut into walkers' shares
 * of L = ceil(left nk / W). Into sp; *fix: the floats its fix-up moves
 * (the parts it reads, and the shared tiles' D read and written, whole
 * tiles counted). false where it does not apply: tiles a multiple of W (no
 * last wave to fill), or fewer than walkers - 1 slots in work_floats. */
static bool mm_plan_streamk(long long tiles, int W, int nk, double slot_floats, size_t work_floats, MmSplit *sp,
                            double *fix) {
    if (W < 1 || nk < 1 || tiles < 1) return false;
    const long long dpw = tiles / W, left = tiles - dpw * W;
    if (left == 0) return false;
    const long long total = left * nk, L = (total + W - 1) / W, walkers = (total + L - 1) / L;
    if (L >= (1ll << 31) || (double)(walkers - 1) * slot_floats > (double)work_floats) return false;
    long long parts = 0, shared = 0;
    for (long long x = 0; x < left; x++) {
        const long long b0 = x * nk / L, b1 = ((x + 1) * nk - 1) / L;
        parts += b1 - b0;
        shared += b1 > b0;
    }
    sp->splits = 1;
    sp->kps = dpw > 0 ? nk : (int)(L < nk ? L : nk);
    sp->sk_len = (int)L;
    sp->sk_dp = (int)(dpw * W);
    sp->sk_walkers = dpw > 0 ? W : (int)walkers;
    *fix = (double)(parts + 2 * shared) * slot_floats;
    return true;
}

/* A kernel launch's gap on the stream, about 2 us, as bytes at 3.35 TB/s. */
#define MM_LAUNCH_BYTES 6.7e6

static MmSplit mm_plan_split(int d_fp32, long long tiles, int slots, int sms, int nkb,
                             double flops_kb, int M, int N, size_t work_floats, int tm = 0, int tn = 0) {
    MmSplit best = {1, nkb, 0, 0, 0};
    const double mn = (double)M * N;
    if (!d_fp32 || nkb < 2 || slots < 1 || mn <= 0) return best;
    const double bytes_kb = 0.4 * flops_kb * slots / sms;
    double best_t = (double)((tiles + slots - 1) / slots) * nkb;
    const long long room = (long long)(work_floats / (size_t)mn);
    for (int s = 2; s <= 32 && s <= nkb && s - 1 <= room && tiles * s < (1ll << 31); s++) {
        const int kps = (nkb + s - 1) / s, parts = (nkb + kps - 1) / kps;
        if (parts != s) continue;  /* the same cut as a smaller s */
        const double waves = (double)((tiles * s + slots - 1) / slots);
        const double t = waves * kps + (s + 1) * mn * 4 / bytes_kb;
        if (t < best_t) {
            best_t = t;
            best.splits = s;
            best.kps = kps;
        }
    }
    /* stream-K: its fix-up's launch counts where split-K's choice has no sum kernel to launch */
    MmSplit sk;
    double fix;
    if (tm > 0 && mm_plan_streamk(tiles, slots, nkb, (double)tm * tn, work_floats, &sk, &fix) &&
        (double)(sk.sk_dp / slots) * nkb + sk.sk_len + (fix * 4 + (best.splits == 1 ? MM_LAUNCH_BYTES : 0)) / bytes_kb <
            best_t)
        best = sk;
    return best;
}

static void mm_launch_sum(float *D, const float *work, int parts, size_t n, cudaStream_t stream) {
    const bool v4 = n % 4 == 0 && ((uintptr_t)D & 15) == 0 && ((uintptr_t)work & 15) == 0;
    const size_t items = v4 ? n / 4 : n;
    const int threads = 256;
    const size_t blocks = (items + threads - 1) / threads;
    const unsigned grid = (unsigned)(blocks < 4096 ? blocks : 4096);
    if (v4) mm_splitk_sum_kernel<true><<<grid, threads, 0, stream>>>(D, work, parts, n);
    else mm_splitk_sum_kernel<false><<<grid, threads, 0, stream>>>(D, work, parts, n);
    LAUNCH_CHECK(mm_splitk_sum_kernel);
}

/* The split-K plan of each implementation on this device. */
static MmSplit mm_split_mma(int sms, int d_fp32, int M, int N, int K, size_t work_floats) {
    const long long tiles = (long long)mm_ceil_div(M, MM_BM) * mm_ceil_div(N, MM_BN);
    return mm_plan_split(d_fp32, tiles, 2 * sms, sms, mm_ceil_div(K, MM_BK),
                         2.0 * MM_BM * MM_BN * MM_BK, M, N, work_floats);
}
/* pp: the ping-pong kernel, whose two warpgroups take turns at the math:
 * one 128 x 128 tile's k-block at a time an SM. cl: its cluster form
 * (CL_CTAS tiles along M a work item, `clusters` items at once), else 1. */
static MmSplit mm_split_wgmma(bool pp, int sms, int d_fp32, int M, int N, int K, size_t work_floats,
                              int cl = 1, int clusters = 0) {
    const int bm = pp ? PP_BM * cl : WG_BM, bn = pp ? PP_BN : WG_BN;
    const long long tiles = (long long)mm_ceil_div(M, bm) * mm_ceil_div(N, bn);
    return mm_plan_split(d_fp32, tiles, cl > 1 ? clusters : sms, sms, mm_ceil_div(K, WG_BK),
                         2.0 * bm * bn * WG_BK, M, N, work_floats, bm, bn);
}

static void mm_launch_simple(void *D, int d_fp32, int accumulate, const void *A, int a_kmajor,
                             const void *B, int b_kmajor, const void *bias, int M, int N, int K,
                             const void *gpre, void *gout, cudaStream_t stream) {
    const int gy = mm_ceil_div(M, 8);
    dim3 grid((unsigned)mm_ceil_div(N, 32), (unsigned)(gy < 65535 ? gy : 65535));
    mm_simple_kernel<<<grid, dim3(32, 8), 0, stream>>>(D, d_fp32, accumulate, (const bf16 *)A,
                                                       a_kmajor, (const bf16 *)B, b_kmajor,
                                                       (const bf16 *)bias, M, N, K,
                                                       (const bf16 *)gpre, (bf16 *)gout);
    LAUNCH_CHECK(mm_simple_kernel);
}

static void mm_launch_mma(void *D, int d_fp32, int accumulate, const void *A, int a_kmajor,
                          const void *B, int b_kmajor, const void *bias, int M, int N, int K,
                          const MmSplit *sp, float *work, const void *gpre, void *gout, cudaStream_t stream) {
    dim3 grid((unsigned)mm_ceil_div(M, MM_BM), (unsigned)mm_ceil_div(N, MM_BN), (unsigned)sp->splits);
    const int pair_ok = mm_pair_ok(D, d_fp32, N) && ((uintptr_t)gout & 3) == 0, pair_w = mm_pair_ok(work, 1, N);
    const bf16 *a = (const bf16 *)A, *b = (const bf16 *)B, *bs = (const bf16 *)bias;
#define MM_GO(AK, BK)                                                                         \
    mm_mma_kernel<AK, BK><<<grid, MM_THREADS, MM_SMEM_BYTES, stream>>>(D, d_fp32, accumulate, \
                                                                       a, b, bs, M, N, K,     \
                                                                       pair_ok, work,         \
                                                                       sp->kps, pair_w,       \
                                                                       (const bf16 *)gpre, (bf16 *)gout)
    if (a_kmajor && b_kmajor) MM_GO(true, true);
    else if (a_kmajor) MM_GO(true, false);
    else if (b_kmajor) MM_GO(false, true);
    else MM_GO(false, false);
#undef MM_GO
    LAUNCH_CHECK(mm_mma_kernel);
}

/* The tile order's band (the header's "Tile order"): of tiles_m m-tiles
 * (columns, in the cluster kernel) and tiles_n n-tiles, `items` work items
 * (one split-K part's) over `slots` at once, whose A takes a_bytes and B
 * b_bytes (the part's slices). The m-fastest walk (one band of
 * tiles_m) reads B once, and A once if it stays in L2 from one wave to the
 * next, else every wave; bands of G = floor(sqrt(slots)) m-tiles (a wave
 * then holds about G m-tiles and slots / G n-tiles) read A once, and B once
 * if it stays in L2 from one band to the next, else every band. Returns
 * the band with the fewer HBM bytes, m-fastest on a tie. L2: MM_L2_BYTES. */
#define MM_L2_BYTES 50e6  /* H100 and H200: 50 MB */
static int mm_band(int tiles_m, int tiles_n, long long items, int slots, double a_bytes, double b_bytes) {
    int g = 1;
    while ((g + 1) * (g + 1) <= slots) g++;
    if (g >= tiles_m || slots < 1) return tiles_m > 0 ? tiles_m : 1;
    const double waves = (double)((items + slots - 1) / slots), bands = (double)((tiles_m + g - 1) / g);
    const double mfast = (a_bytes > MM_L2_BYTES ? waves : 1.0) * a_bytes + b_bytes;
    const double banded = a_bytes + (b_bytes > MM_L2_BYTES ? bands : 1.0) * b_bytes;
    (void)tiles_n;
    return banded < mfast ? g : tiles_m;
}

/* Encodes the maps and launches the ping-pong kernel (pp), its cluster
 * form (pp, cl = CL_CTAS: `slots` clusters at most) or the cooperative one
 * (slots: the SMs), its tiles in bands of `group` m-tiles (0: mm_band's);
 * false (nothing launched) when the driver has no tensor-map encoder or
 * refuses a map. */
static bool mm_launch_wgmma(bool pp, int cl, int slots, void *D, int d_fp32, int accumulate, const void *A,
                            int a_kmajor, const void *B, int b_kmajor, const void *bias, int M,
                            int N, int K, const MmSplit *sp, float *work, int group, const void *gpre,
                            void *gout, float *bgw, cudaStream_t stream) {
    CUtensorMap ta, tb;
    const bool ok_a = a_kmajor ? sm90_encode_2d(&ta, A, K, M, WG_BK, WG_BM)
                               : sm90_encode_2d(&ta, A, M, K, 64, WG_BK);
    /* B k-major: the cluster kernel's CTAs load half the tile each, {64 k, 64 n} */
    const bool ok_b = b_kmajor ? sm90_encode_2d(&tb, B, K, N, WG_BK, cl > 1 ? 64 : pp ? PP_BN : WG_BN)
                               : sm90_encode_2d(&tb, B, N, K, 64, WG_BK);
    if (!ok_a || !ok_b) return false;
    /* TMA stores (ping-pong and cluster kernels): a bf16 D written, not
     * accumulated, in one part, whose map encodes (D 16-byte aligned, N % 8
     * == 0), without the GELU-backward epilogue (it reads gpre where an
     * accumulating store reads D: mm_wg_epilogue's PRE hides that);
     * otherwise td stays zero and unused */
    CUtensorMap td;
    memset(&td, 0, sizeof td);
    const bool ts = pp && !d_fp32 && !accumulate && !gpre && !gout && sp->splits == 1 &&
                    sm90_encode_2d(&td, D, N, M, 64, 64);
    const int bm = pp ? PP_BM * cl : WG_BM, bn = pp ? PP_BN : WG_BN;
    const int tiles_m = mm_ceil_div(M, bm), tiles_n = mm_ceil_div(N, bn);
    const long long items = (long long)tiles_m * tiles_n * sp->splits;
    /* stream-K: the plan's walkers (blocks, or clusters) */
    const int grid = (sp->sk_len ? sp->sk_walkers : (int)(items < slots ? items : slots)) * cl;
    /* split-K: part p's tiles are items p tiles .. (p + 1) tiles - 1, each part a K / splits slice of A and B */
    if (group <= 0)
        group = mm_band(tiles_m, tiles_n, (long long)tiles_m * tiles_n, slots, 2.0 * M * K / sp->splits,
                        2.0 * N * K / sp->splits);
    if (group > tiles_m) group = tiles_m;  /* one band; group x tiles_n stays within the int tile count */
    /* work: split-K's [splits - 1][M][N], or stream-K's slots of [bm][bn] */
    const int vec_ok = mm_vec_ok(D, d_fp32, bias, N) && ((uintptr_t)gpre & 15) == 0 && ((uintptr_t)gout & 15) == 0,
              vec_w = mm_vec_ok(work, 1, NULL, sp->sk_len ? bn : N);
    const bf16 *bs = (const bf16 *)bias;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = CL_CTAS;  /* along M: the CTAs of a cluster share the B tile */
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    const int smem = ts ? PP_TS_SMEM_BYTES : PP_SMEM_BYTES;
    const cudaLaunchConfig_t cfg = {dim3((unsigned)grid), dim3(WG_THREADS), (size_t)smem, stream, at, 1};
    /* one launch of kernel instance KERNEL: through cfg (clusters) or <<<>>> with SMEM bytes */
#define WG_ARGS ta, tb, td, D, d_fp32, accumulate, bs, M, N, K, vec_ok, work, sp->splits, sp->kps, vec_w, group, \
                sp->sk_dp, sp->sk_len, (const bf16 *)gpre, (bf16 *)gout, bgw
#define WG_GO(AK, BK)                                                                                   \
    do {                                                                                                \
        if (cl > 1 && ts)                                                                               \
            CUDA_CHECK(cudaLaunchKernelEx(&cfg, mm_wgmma_kernel<true, AK, BK, CL_CTAS, true>, WG_ARGS)); \
        else if (cl > 1)                                                                                \
            CUDA_CHECK(cudaLaunchKernelEx(&cfg, mm_wgmma_kernel<true, AK, BK, CL_CTAS>, WG_ARGS));      \
        else if (ts)                                                                                    \
            mm_wgmma_kernel<true, AK, BK, 1, true><<<grid, WG_THREADS, smem, stream>>>(WG_ARGS);        \
        else if (pp)                                                                                    \
            mm_wgmma_kernel<true, AK, BK><<<grid, WG_THREADS, smem, stream>>>(WG_ARGS);                 \
        else                                                                                            \
            mm_wgmma_kernel<false, AK, BK><<<grid, WG_THREADS, WG_SMEM_BYTES, stream>>>(WG_ARGS);       \
    } while (0)
    if (a_kmajor && b_kmajor) WG_GO(true, true);
    else if (a_kmajor) WG_GO(true, false);
    else if (b_kmajor) WG_GO(false, true);
    else WG_GO(false, false);
#undef WG_GO
#undef WG_ARGS
    LAUNCH_CHECK(mm_wgmma_kernel);
    if (sp->sk_len) {  /* the shared tiles' parts into D, in walker order */
        const int left = tiles_m * tiles_n - sp->sk_dp;
        mm_streamk_fixup_kernel<<<dim3((unsigned)left, 8), 256, 0, stream>>>(
            (float *)D, work, M, N, bm, bn, tiles_m, tiles_m * tiles_n, group, sp->sk_dp, mm_ceil_div(K, WG_BK),
            sp->sk_len);
        LAUNCH_CHECK(mm_streamk_fixup_kernel);
    }
    return true;
}

/* The device facts tc_gemm decides by: capabilities and SM count. */
typedef struct MmChoice {
    bool mma_ok, wg_ok, cl_ok;
    int sms, clusters;  /* clusters: of the cluster kernel at once */
} MmChoice;

static MmChoice mm_choice(const void *A, int a_kmajor, const void *B, int b_kmajor, int M, int N,
                          int K, cudaStream_t st) {
    const int caps = mm_device_caps(st);
    MmChoice c;
    c.sms = caps >> MM_CAP_SM_SHIFT;
    const bool aligned = mm_aligned(A, a_kmajor, B, b_kmajor, M, N, K);
    /* grid limits: MMA's n tiles sit on gridDim.y; the persistent grid needs int tile counts */
    c.mma_ok = (caps & MM_CAP_MMA) && aligned && mm_ceil_div(N, MM_BN) <= 65535;
    c.wg_ok = (caps & MM_CAP_WGMMA) && aligned && c.sms > 0 &&
              (long long)mm_ceil_div(M, PP_BM) * mm_ceil_div(N, PP_BN) < (1ll << 31);
    int dev = -1;
    c.clusters = cudaGetDevice(&dev) == cudaSuccess && dev >= 0 && dev < MM_MAX_DEVICES
                     ? mm_clusters[dev].load(std::memory_order_relaxed) : 0;
    c.cl_ok = c.wg_ok && c.clusters > 0;
    return c;
}

/* Whether TC_AUTO takes the ping-pong wgmma kernel for this product: the
 * cooperative kernel's work items have at most PP_AUTO_MAX_KB k-blocks. */
static bool mm_auto_pp(int sms, int d_fp32, int M, int N, int K, size_t work_floats) {
    return mm_split_wgmma(false, sms, d_fp32, M, N, K, work_floats).kps <= PP_AUTO_MAX_KB;
}

extern "C" int tc_gemm_auto(int d_fp32, const void *A, int a_kmajor, const void *B, int b_kmajor, int M,
                            int N, int K, size_t work_floats, void *stream) {
    if (M <= 0 || N <= 0) return TC_SIMPLE;
    const MmChoice c = mm_choice(A, a_kmajor, B, b_kmajor, M, N, K, (cudaStream_t)stream);
    if (c.wg_ok) return mm_auto_pp(c.sms, d_fp32, M, N, K, work_floats) ? TC_WGMMA : TC_WGMMA_COOP;
    return c.mma_ok ? TC_MMA : TC_SIMPLE;
}

/* A wgmma kernel's plan into sp: mm_split_wgmma's, or with force > 0 (the
 * stream-K hook) stream-K over `force` walkers, whatever the model says;
 * false where a forced plan does not apply (mm_plan_streamk, or D bf16). */
static bool mm_wg_plan(bool pp, int cl, const MmChoice *c, int force, int d_fp32, int M, int N, int K,
                       size_t work_floats, MmSplit *sp) {
    if (force <= 0) {
        *sp = mm_split_wgmma(pp, c->sms, d_fp32, M, N, K, work_floats, cl, c->clusters);
        return true;
    }
    const int bm = pp ? PP_BM * cl : WG_BM, bn = pp ? PP_BN : WG_BN;
    double fix;
    return d_fp32 && mm_plan_streamk((long long)mm_ceil_div(M, bm) * mm_ceil_div(N, bn), force, mm_ceil_div(K, WG_BK),
                                     (double)bm * bn, work_floats, sp, &fix);
}

/* tc_gemm_order, with sk_force > 0 (a wgmma impl only) tc_gemm_streamk,
 * with gpre (D bf16, written, no bias) tc_gemm_gelu_back, with gout (D
 * bf16, written) tc_gemm_gelu. bgw (with gpre): the wgmma kernels' bias
 * sums of the stored tiles into bgw [ceil(M / 128)][N] (mm_wg_bias_sums),
 * *bg_done set when a kernel that writes them ran (the others ignore bgw). */
static int mm_gemm(TcImpl impl, int group, int sk_force, void *D, int d_fp32, int accumulate, const void *A,
                   int a_kmajor, const void *B, int b_kmajor, const void *bias, int M, int N, int K, float *work,
                   size_t work_floats, cudaStream_t st, const void *gpre = nullptr, void *gout = nullptr,
                   float *bgw = nullptr, bool *bg_done = nullptr) {
    if (impl != TC_AUTO && impl != TC_SIMPLE && impl != TC_MMA && impl != TC_WGMMA &&
        impl != TC_WGMMA_COOP && impl != TC_WGMMA_CLUSTER)
        return -1;
    if (impl == TC_SIMPLE) {
        if (M > 0 && N > 0)
            mm_launch_simple(D, d_fp32, accumulate, A, a_kmajor, B, b_kmajor, bias, M, N, K, gpre, gout, st);
        return TC_SIMPLE;
    }
    if ((M <= 0 || N <= 0) && impl == TC_AUTO) return TC_SIMPLE;  /* nothing to write */
    const bool empty = M <= 0 || N <= 0;
    const MmChoice c = mm_choice(A, a_kmajor, B, b_kmajor, M, N, K, st);
    if (!work) work_floats = 0;
    const size_t mn = empty ? 0 : (size_t)M * N;

    if (impl == TC_WGMMA_CLUSTER) {  /* never TC_AUTO's choice (yet): no fallback */
        if (!c.cl_ok) return -1;
        if (empty) return TC_WGMMA_CLUSTER;
        MmSplit sp;
        if (!mm_wg_plan(true, CL_CTAS, &c, sk_force, d_fp32, M, N, K, work_floats, &sp)) return -1;
        if (!mm_launch_wgmma(true, CL_CTAS, c.clusters, D, d_fp32, accumulate, A, a_kmajor, B, b_kmajor, bias,
                             M, N, K, &sp, work, group, gpre, gout, bgw, st))
            return -1;
        if (bg_done) *bg_done = bgw != nullptr;
        if (sp.splits > 1) mm_launch_sum((float *)D, work, sp.splits - 1, mn, st);
        return TC_WGMMA_CLUSTER;
    }
    if (impl == TC_WGMMA || impl == TC_WGMMA_COOP || impl == TC_AUTO) {
        const bool pp = impl == TC_WGMMA ||
                        (impl == TC_AUTO && !empty && mm_auto_pp(c.sms, d_fp32, M, N, K, work_floats));
        const int ran = pp ? TC_WGMMA : TC_WGMMA_COOP;
        if (c.wg_ok && empty) return ran;
        if (c.wg_ok) {
            MmSplit sp;
            if (!mm_wg_plan(pp, 1, &c, sk_force, d_fp32, M, N, K, work_floats, &sp)) return -1;
            if (mm_launch_wgmma(pp, 1, c.sms, D, d_fp32, accumulate, A, a_kmajor, B, b_kmajor, bias,
                                M, N, K, &sp, work, group, gpre, gout, bgw, st)) {
                if (bg_done) *bg_done = bgw != nullptr;
                if (sp.splits > 1) mm_launch_sum((float *)D, work, sp.splits - 1, mn, st);
                return ran;
            }
        }
        if (impl != TC_AUTO) return -1;
    }
    if (impl == TC_MMA || impl == TC_AUTO) {
        if (c.mma_ok) {
            if (!empty) {
                const MmSplit sp = mm_split_mma(c.sms, d_fp32, M, N, K, work_floats);
                mm_launch_mma(D, d_fp32, accumulate, A, a_kmajor, B, b_kmajor, bias, M, N, K, &sp,
                              work, gpre, gout, st);
                if (sp.splits > 1) mm_launch_sum((float *)D, work, sp.splits - 1, mn, st);
            }
            return TC_MMA;
        }
        if (impl == TC_MMA) return -1;
    }
    /* TC_AUTO with nothing faster: the simple kernel takes any shape. */
    mm_launch_simple(D, d_fp32, accumulate, A, a_kmajor, B, b_kmajor, bias, M, N, K, gpre, gout, st);
    return TC_SIMPLE;
}

extern "C" int tc_gemm_order(TcImpl impl, int group, void *D, int d_fp32, int accumulate, const void *A,
                             int a_kmajor, const void *B, int b_kmajor, const void *bias, int M, int N,
                             int K, float *work, size_t work_floats, void *stream) {
    return mm_gemm(impl, group, 0, D, d_fp32, accumulate, A, a_kmajor, B, b_kmajor, bias, M, N, K, work, work_floats,
                   (cudaStream_t)stream);
}

extern "C" int tc_gemm_streamk(TcImpl impl, int walkers, int group, void *D, int d_fp32, int accumulate,
                               const void *A, int a_kmajor, const void *B, int b_kmajor, const void *bias, int M,
                               int N, int K, float *work, size_t work_floats, void *stream) {
    if ((impl != TC_WGMMA && impl != TC_WGMMA_COOP && impl != TC_WGMMA_CLUSTER) || walkers < 1 || M <= 0 ||
        N <= 0 || !work)
        return -1;
    return mm_gemm(impl, group, walkers, D, d_fp32, accumulate, A, a_kmajor, B, b_kmajor, bias, M, N, K, work,
                   work_floats, (cudaStream_t)stream);
}

extern "C" int tc_gemm(TcImpl impl, void *D, int d_fp32, int accumulate, const void *A,
                       int a_kmajor, const void *B, int b_kmajor, const void *bias, int M, int N,
                       int K, float *work, size_t work_floats, void *stream) {
    return tc_gemm_order(impl, 0, D, d_fp32, accumulate, A, a_kmajor, B, b_kmajor, bias, M, N, K, work,
                         work_floats, stream);
}

/* Whether tc_bias_grad sums dout [M][N] (dout_fp32 0 or 1) in chunks of
 * MM_BG_ROWS rows into work (its split path), whose order the wgmma
 * kernels' fused sums reproduce (mm_wg_bias_sums). */
static bool mm_bg_split(const void *dout, int M, int N, const float *work, size_t work_floats) {
    const int chunks = mm_ceil_div(M, MM_BG_ROWS);
    return work && N % 8 == 0 && ((uintptr_t)dout & 15) == 0 && chunks > 1 && chunks <= 65535 &&
           (size_t)chunks * N <= work_floats;
}

extern "C" int tc_gemm_gelu_back(TcImpl impl, void *D, const void *A, int a_kmajor, const void *B, int b_kmajor,
                                 const void *pre, float *dbias, int M, int N, int K, float *work, size_t work_floats,
                                 void *stream) {
    if (!pre) return -1;
    cudaStream_t st = (cudaStream_t)stream;
    /* the product itself takes no work buffer (bf16 D: no split-K, no
     * stream-K), so work holds only the bias sums while it runs */
    float *bgw = dbias && M > 0 && N > 0 && mm_bg_split(D, M, N, work, work_floats) ? work : NULL;
    bool fused = false;
    const int r = mm_gemm(impl, 0, 0, D, 0, 0, A, a_kmajor, B, b_kmajor, NULL, M, N, K, NULL, 0, st, pre, NULL, bgw,
                          &fused);
    if (r < 0 || !dbias || M <= 0 || N <= 0) return r;
    if (fused) tc_partials_add(dbias, work, mm_ceil_div(M, MM_BG_ROWS), N, stream);
    else tc_bias_grad(dbias, D, 0, M, N, work, work_floats, stream);
    return r;
}

extern "C" int tc_gemm_gelu(TcImpl impl, void *D, void *G, const void *A, int a_kmajor, const void *B, int b_kmajor,
                            const void *bias, int M, int N, int K, void *stream) {
    if (!G) return -1;
    return mm_gemm(impl, 0, 0, D, 0, 0, A, a_kmajor, B, b_kmajor, bias, M, N, K, NULL, 0, (cudaStream_t)stream, NULL,
                   G);
}

extern "C" int tc_gemm_splits(TcImpl impl, int d_fp32, const void *A, int a_kmajor, const void *B,
                              int b_kmajor, int M, int N, int K, size_t work_floats, void *stream) {
    if (M <= 0 || N <= 0 ||
        (impl != TC_MMA && impl != TC_WGMMA && impl != TC_WGMMA_COOP && impl != TC_WGMMA_CLUSTER))
        return 1;
    const MmChoice c = mm_choice(A, a_kmajor, B, b_kmajor, M, N, K, (cudaStream_t)stream);
    /* stream-K: 0 */
    MmSplit sp = {1, 1, 0, 0, 0};
    if (impl == TC_WGMMA_CLUSTER && c.cl_ok)
        sp = mm_split_wgmma(true, c.sms, d_fp32, M, N, K, work_floats, CL_CTAS, c.clusters);
    if ((impl == TC_WGMMA || impl == TC_WGMMA_COOP) && c.wg_ok)
        sp = mm_split_wgmma(impl == TC_WGMMA, c.sms, d_fp32, M, N, K, work_floats);
    if (impl != TC_MMA) return sp.sk_len ? 0 : sp.splits;
    return c.mma_ok ? mm_split_mma(c.sms, d_fp32, M, N, K, work_floats).splits : 1;
}

extern "C" void tc_partials_add(float *out, const float *partial, int chunks, int n, void *stream) {
    if (chunks <= 0 || n <= 0) return;
    mm_partials_add_kernel<<<(unsigned)mm_ceil_div(n, 32), dim3(32, 16), 0, (cudaStream_t)stream>>>(out, partial,
                                                                                                   chunks, n);
    LAUNCH_CHECK(mm_partials_add_kernel);
}

template <typename T>
static void bias_grad(float *dbias, const T *dout, int M, int N, float *work, size_t work_floats,
                      cudaStream_t stream) {
    const int chunks = mm_ceil_div(M, MM_BG_ROWS);
    const bool split = mm_bg_split(dout, M, N, work, work_floats);
    if (!split) {
        mm_bias_grad_kernel<T><<<(unsigned)mm_ceil_div(N, 32), dim3(32, 16), 0, stream>>>(dbias, dout, M, N);
        LAUNCH_CHECK(mm_bias_grad_kernel);
        return;
    }
    mm_bias_grad_split_kernel<T><<<dim3((unsigned)mm_ceil_div(N, 256), (unsigned)chunks), dim3(32, 8), 0, stream>>>(
        work, dout, M, N);
    LAUNCH_CHECK(mm_bias_grad_split_kernel);
    tc_partials_add(dbias, work, chunks, N, stream);
}

extern "C" void tc_bias_grad(float *dbias, const void *dout, int dout_fp32, int M, int N, float *work,
                             size_t work_floats, void *stream) {
    if (M <= 0 || N <= 0) return;
    if (dout_fp32) bias_grad(dbias, (const float *)dout, M, N, work, work_floats, (cudaStream_t)stream);
    else bias_grad(dbias, (const bf16 *)dout, M, N, work, work_floats, (cudaStream_t)stream);
}
