/* tc.h: the tensor-core kernels of the bf16 path, as a plain C interface.
 *
 * matmul.cu holds one general bf16 GEMM in three implementations (a simple
 * reference kernel, mma.sync fed by ldmatrix and a multi-stage cp.async
 * pipeline for sm_80 and later, and wgmma fed by TMA with warp-specialised
 * producer and consumer warpgroups and a persistent tile scheduler on
 * sm_90a). attention.cu holds a fused flash attention, forward and backward,
 * on bf16 tensor cores; attention_sm90.cu the forward again on sm_90a's
 * wgmma. kernels.cu's bf16 Ops table calls them; the
 * benchmark and test/test_gemm.c, test/test_flash.c call them directly.
 *
 * bf16 buffers are void * here (2-byte elements, CUDA's __nv_bfloat16) so
 * that C files can hold them; `stream` is a cudaStream_t. Every pointer is
 * device memory. Shapes are element counts, and the functions check their
 * CUDA calls and exit with "CUDA error: <call> at <file>:<line>: <reason>".
 */
#ifndef TC_H
#define TC_H

#include <stddef.h>

typedef enum {
    TC_AUTO = 0,    /* the fastest implementation that takes this shape on this device */
    TC_SIMPLE = 1,  /* one thread an output element, float32 accumulation: the yardstick of the others */
    TC_MMA = 2,     /* mma.sync.m16n8k16 bf16 (sm_80+) */
    TC_WGMMA = 3,   /* wgmma + TMA, two consumer warpgroups in ping-pong (sm_90a builds on an sm_90 device) */
    TC_WGMMA_COOP = 4, /* the same, both warpgroups on one tile (cooperative): the kernel before ping-pong */
    TC_WGMMA_CLUSTER = 5 /* TC_WGMMA in clusters of 2 CTAs along M, the B tile multicast by TMA to both
                            (sm_90a; never TC_AUTO's choice until a lease has timed it) */
} TcImpl;

/* D[M,N] = A[M,K] B[K,N] (+ D when accumulate) (+ bias[N] on every row when
 * bias != NULL), float32 accumulation.
 *   A: a_kmajor 1: stored [M][K] (row m contiguous); 0: stored [K][M].
 *   B: b_kmajor 1: stored [N][K] (column n of B contiguous, as a linear
 *      layer's weight [OC][C]); 0: stored [K][N].
 *   D: row-major [M][N], bf16 (d_fp32 0) or float32 (d_fp32 1).
 *   bias: bf16 [N], or NULL.
 * The three products of a linear layer out = inp @ w^T + b, inp [rows,C],
 * w [OC,C]:
 *   forward  out  = inp @ w^T:   M rows, N OC, K C;   A kmajor, B kmajor;
 *   dinp    += dout @ w:         M rows, N C,  K OC;  A kmajor, B not;
 *   dw      += dout^T @ inp:     M OC,   N C,  K rows; A not,   B not (D fp32).
 *   work: float32 device memory of work_floats elements the call may
 *      overwrite, or NULL. With room there, a float32 D with few output
 *      tiles and a long K (a weight gradient) is computed split-K: K cut
 *      into parts that run side by side, added to D in a fixed order (the
 *      same bits every run). TC_MMA and the TC_WGMMAs only.
 * Any M, N, K >= 1 is computed correctly; an implementation that cannot
 * take a shape (alignment, device) falls back under TC_AUTO and refuses
 * otherwise. Returns the implementation that ran, or -1 when `impl` was
 * asked for explicitly and cannot run here (nothing is written then). */
int tc_gemm(TcImpl impl, void *D, int d_fp32, int accumulate, const void *A, int a_kmajor,
            const void *B, int b_kmajor, const void *bias, int M, int N, int K, float *work,
            size_t work_floats, void *stream);

/* tc_gemm with the wgmma kernels' tile order given (the others ignore it):
 * their output tiles go in bands of `group` m-tiles (the cluster kernel's:
 * columns of 2), m fastest within a band, then n, then the next band;
 * group >= the m-tiles is the m-fastest order, group <= 0 the order
 * tc_gemm takes (matmul.cu's header, "Tile order"). The order changes no
 * value, only which SM computes a tile when: for tests and bench. */
int tc_gemm_order(TcImpl impl, int group, void *D, int d_fp32, int accumulate, const void *A, int a_kmajor,
                  const void *B, int b_kmajor, const void *bias, int M, int N, int K, float *work,
                  size_t work_floats, void *stream);

/* The MLP's fcproj input gradient fused with GELU's backward: D[M,N] bf16
 * written (not accumulated) with, element by element,
 *   bf16( 0 + gelu'(pre) * float(bf16(0 + (A B)[m][n])) ),
 * pre [M][N] bf16 (GELU's input, fc's output) at D's place: the bits of
 * tc_gemm into a zeroed bf16 D (accumulate 1, no bias) followed by
 * kernels.cu's gelu_backward into a zeroed buffer, in one pass that never
 * writes the product (A, B and the implementations as tc_gemm's; no
 * split, bf16 D being never split). TC_AUTO runs what tc_gemm would for
 * that product, with the plain epilogue (mm_wg_epilogue) where it would
 * store through TMA. dbias [N] float32 or NULL: fc's bias gradient too,
 * dbias[n] += the column sums of the stored D, tc_bias_grad's bits
 * (tc_bias_grad(dbias, D, 0, M, N, work, work_floats) after the product):
 * where tc_bias_grad would sum chunks of 128 rows into work, the wgmma
 * kernels sum each stored tile into work in that order in their epilogue
 * and tc_partials_add adds the chunks; elsewhere tc_bias_grad runs after
 * the product. work [work_floats] float32 scratch (may be NULL), used only
 * for those sums. Returns as tc_gemm (dbias untouched on -1); -1 with pre
 * NULL. */
int tc_gemm_gelu_back(TcImpl impl, void *D, const void *A, int a_kmajor, const void *B, int b_kmajor,
                      const void *pre, float *dbias, int M, int N, int K, float *work, size_t work_floats,
                      void *stream);

/* fc's product fused with GELU's forward: D[M,N] = A B + bias (bf16,
 * written: the pre-activation, which GELU's backward reads) and G[M,N] =
 * bf16(gelu(float(D))), GELU of the rounded pre-activation: the bits of
 * tc_gemm (written) followed by kernels.cu's gelu_forward, in one pass (A,
 * B, bias and the implementations as tc_gemm's; D and G never split). The
 * TMA-store epilogue never takes it (TC_AUTO's kernel stores both through
 * mm_wg_epilogue's 16-byte pieces instead). Returns as tc_gemm; -1 with G
 * NULL. */
int tc_gemm_gelu(TcImpl impl, void *D, void *G, const void *A, int a_kmajor, const void *B, int b_kmajor,
                 const void *bias, int M, int N, int K, void *stream);

/* The implementation tc_gemm with TC_AUTO runs for this product on this
 * device (the arguments as tc_gemm's; nothing is launched but, on a
 * device's first call, tc_gemm's one-time probe); a wgmma answer assumes the
 * driver encodes its tensor maps (tc_gemm falls back to TC_MMA if not). */
int tc_gemm_auto(int d_fp32, const void *A, int a_kmajor, const void *B, int b_kmajor, int M, int N,
                 int K, size_t work_floats, void *stream);

/* How many parts tc_gemm with this implementation (TC_MMA or a TC_WGMMA*; 1 for
 * the others, or when it would not run) cuts K into for this product; 0
 * where a TC_WGMMA* runs it stream-K (matmul.cu's header, "Stream-K"). */
int tc_gemm_splits(TcImpl impl, int d_fp32, const void *A, int a_kmajor, const void *B,
                   int b_kmajor, int M, int N, int K, size_t work_floats, void *stream);

/* tc_gemm with a wgmma kernel (TC_WGMMA, TC_WGMMA_COOP, TC_WGMMA_CLUSTER) in
 * the stream-K form over `walkers` blocks (the cluster kernel: clusters),
 * whether or not its plan would take it, the tiles in bands of `group` as
 * tc_gemm_order's: the tiles of the full waves whole, the rest's k-blocks
 * shared out evenly, the shared tiles' parts summed into D in a fixed
 * order. For tests. Returns impl, or -1 (nothing written) where it cannot
 * run: as tc_gemm, D bf16, no work, the tiles a multiple of walkers, or
 * fewer than walkers - 1 tiles of room in work (128 x 128 floats a tile;
 * TC_WGMMA_COOP 128 x 256, TC_WGMMA_CLUSTER 256 x 128). */
int tc_gemm_streamk(TcImpl impl, int walkers, int group, void *D, int d_fp32, int accumulate, const void *A,
                    int a_kmajor, const void *B, int b_kmajor, const void *bias, int M, int N, int K, float *work,
                    size_t work_floats, void *stream);
/* dbias[N] += sum over m of dout[M][N] (dout bf16, or float32 when dout_fp32;
 * dbias float32), the same bits every run. work [work_floats] (may be NULL):
 * scratch for the sums of chunks of rows, ceil(M / 128) x N floats, which
 * lets the rows be summed in parallel; stream-ordered, like tc_gemm's. */
void tc_bias_grad(float *dbias, const void *dout, int dout_fp32, int M, int N, float *work,
                  size_t work_floats, void *stream);

/* out[n] += sum over k < chunks of partial[k][n], for n < n_cols, in a fixed
 * order (16 lanes a column, each its share of the chunks in order, then the
 * lanes in order): the second half of every column sum here and in
 * kernels.cu. partial [chunks][n_cols], float32; stream-ordered. */
void tc_partials_add(float *out, const float *partial, int chunks, int n_cols, void *stream);

/* Causal self-attention, fused (the T x T matrix is never written).
 * qkv [B,T,3C] bf16 holds q, k, v at channel offsets 0, C, 2C; head h uses
 * channels [h*hs, (h+1)*hs), hs = C/NH. out [B,T,C] bf16 is written;
 * lse [B,NH,T] float32 receives each row's log-sum-exp of the scaled scores
 * (what backward needs instead of the probabilities). Scores are scaled by
 * 1/sqrt(hs). Returns 0, or -1 when the head size is not one the kernel
 * was built for (nothing is written then; the caller falls back). */
int tc_flash_forward(void *out, float *lse, const void *qkv, int B, int T, int C, int NH,
                     void *stream);

/* The same forward on Hopper's wgmma (attention_sm90.cu: FlashAttention-3's
 * design, TMA producer and wgmma consumer warpgroups): the same contract
 * and buffers; head sizes 64 and 128 only. Returns 0, or -1 (nothing
 * written) where it cannot run: another head size, a device other than
 * compute capability 9.0 or a binary without sm_90a code, no tensor-map
 * encoder in the driver. */
int tc_flash_forward_sm90(void *out, float *lse, const void *qkv, int B, int T, int C, int NH,
                          void *stream);

/* The deterministic backward on Hopper's wgmma (attention_sm90.cu), heads of
 * 64 and 128 only: tc_flash_backward's contract with deterministic 1 (the
 * same buffers, scratch of tc_flash_scratch_floats, the same bits every
 * run), from either forward's out and lse. Returns 0, or -1 (nothing written)
 * where it cannot run: another head size, or as tc_flash_forward_sm90. */
int tc_flash_backward_sm90(void *dqkv, float *scratch, const void *dout, const void *qkv,
                           const void *out, const float *lse, int B, int T, int C, int NH,
                           void *stream);

/* Its backward: accumulates dqkv [B,T,3C] bf16 (+=) from dout [B,T,C] bf16,
 * given the forward's qkv, out and lse. scratch is float32 device memory of
 * tc_flash_scratch_floats(B, T, C, NH) elements, which the call may
 * overwrite. deterministic 0: dq is summed with atomics (its last bits vary
 * from run to run); 1: without (the same bits every run; S and dP are
 * computed twice). Returns 0, or -1 as tc_flash_forward. */
int tc_flash_backward(void *dqkv, float *scratch, const void *dout, const void *qkv,
                      const void *out, const float *lse, int B, int T, int C, int NH,
                      int deterministic, void *stream);
size_t tc_flash_scratch_floats(int B, int T, int C, int NH);

/* One step of context parallelism's ring (cp.c) on the same kernels: rank
 * r's queries against the keys and values of rank s, positions as cp.c
 * deals them (rank r holds chunks r and 2N-1-r of T/2N tokens; T is the
 * whole sequence, a multiple of 2N, Tl = T/N rows a side). qkv [B,Tl,3C]
 * bf16 (this rank's q at channel 0), kv [B,Tl,2C] bf16 (rank s's k at 0,
 * v at C). Forward merges the step's partial output and log-sum-exp into
 * acc [B,Tl,C] fp32 and lse [B,NH,Tl] fp32 by their log-sum-exp (first:
 * they hold nothing yet, and are written). Backward adds the step's
 * gradients into dq [B,Tl,C] fp32 and dkv [B,Tl,2C] fp32 (dk at 0, dv at
 * C), given the final lse, D [B,NH,Tl] (dout . out a row and head) and
 * dout [B,Tl,C] bf16; always without atomics (the same bits every run).
 * Return 0, or -1 as tc_flash_forward (nothing is written); a T, N, r, s
 * that is no chunk pair, or an fp32 buffer not 8-byte aligned, exits. */
int tc_flash_pair_forward(float *acc, float *lse, const void *qkv, const void *kv, int B, int T,
                          int C, int NH, int N, int r, int s, int first, void *stream);
int tc_flash_pair_backward(float *dq, float *dkv, const void *qkv, const void *kv,
                           const float *lse, const float *D, const void *dout, int B, int T,
                           int C, int NH, int N, int r, int s, void *stream);

/* Whether the flash kernels take head size hs (C/NH): 32, 64 or 128.
 * Inline, so that the planner (built without CUDA too) asks the same rule. */
static inline int tc_flash_supports(int hs) { return hs == 32 || hs == 64 || hs == 128; }

#endif
