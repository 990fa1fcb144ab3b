/* cp.c: context parallelism: the sequence split across the ranks of a cp
 * group, attention as a ring (beyond the two articles: the fourth dimension
 * of picotron's 4D, Megatron-LM's --context-parallel-size, ring attention).
 *
 * Everything in a GPT-2 layer but attention works token by token, so a rank
 * that holds a part of each sequence can run the layernorms, the linears,
 * the MLP and the residual adds on its part alone. Attention is where
 * tokens meet: a query needs the keys and values of every earlier position.
 * The ring brings them: each rank keeps its own queries and passes its keys
 * and values to the next rank, N - 1 times, so that every rank sees every
 * block once. Each block gives a partial softmax over the keys it holds;
 * partials merge exactly by their log-sum-exp, as flash attention merges
 * its tiles. In backward the blocks travel the ring again, and the
 * gradients of their keys and values travel with them, one more hop taking
 * each home.
 *
 * Why the sequence is dealt in pairs of chunks. Under the causal mask a
 * query at position p scores p + 1 keys: the end of a sequence costs more
 * than its start. Cut into N equal runs, rank N-1 would do about 2N - 1
 * times the work of rank 0 and the ring would wait for it. Cut into 2N
 * chunks and rank r given chunks r and 2N-1-r, each rank holds one cheap
 * and one dear chunk, and the work is equal exactly:
 *   Tc^2 (2N - 1) + Tc (Tc + 1) scores for every r  (Tc = T / 2N).
 *
 * Each block of the ring is written twice, as ops.c writes attention: as
 * plain loops over (row, head, key), cp_block_forward_naive and
 * _backward_naive, the specification; and as the path the ring runs,
 * cp_block_forward and _backward, each chunk pair's products handed to
 * gemm.c. test/test_cp.c checks both against ops.c's attention over the
 * whole sequence. On a GPU (float32 or bf16) the ring's buffers are device
 * memory and each block step is kernels.cu's cuda_cp_* (in bf16 at heads of
 * 32, 64 and 128 attention.cu's flash kernels given the chunk pair, else
 * plain kernels, a thread a row); test_3d_emu and test_3d_nccl_emu check it
 * against one CPU rank under the CUDA emulation, test_flash the flash steps.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cp.h"
#include "exp_f32.h"
#include "gemm.h"
#include "safe.h"

int cp_chunk(int N, int r, int half) { return half ? 2 * N - 1 - r : r; }

int cp_position(int N, int r, int T, int i) {
    int Tc = T / (2 * N);
    if (N == 1) return i;
    return cp_chunk(N, r, i / Tc) * Tc + i % Tc;
}

/* The causal mask on the sequence's positions: rank r's query row t sees
 * row j of rank s's block when that key's position is not after the query's. */
static inline int cp_visible(int N, int T, int r, int t, int s, int j) {
    return cp_position(N, s, T, j) <= cp_position(N, r, T, t);
}

/* Each row is read at or after the place it is written (a position is
 * never before its row), so the copy can run in place, front to back. */
void cp_local_tokens(int *x, int *y, int B, int T, int N, int r) {
    int Tl = T / N;
    for (int b = 0; b < B; b++)
        for (int i = 0; i < Tl; i++) {
            x[b * Tl + i] = x[b * T + cp_position(N, r, T, i)];
            if (y) y[b * Tl + i] = y[b * T + cp_position(N, r, T, i)];
        }
}

void cp_show(FILE *f, int N, int T) {
    int Tc = T / (2 * N);
    long scores = (long)Tc * Tc * (2 * N - 1) + (long)Tc * (Tc + 1);
    fprintf(f, "context parallelism: --cp %d, --seq %d: %d chunks of %d tokens, rank r holding chunks r and %d-r\n", N,
            T, 2 * N, Tc, 2 * N - 1);
    for (int r = 0; r < N; r++) {
        int a = cp_chunk(N, r, 0), b = cp_chunk(N, r, 1);
        fprintf(f, "  rank %d: positions %d-%d and %d-%d, %ld causal scores a head (of %ld)\n", r, a * Tc,
                a * Tc + Tc - 1, b * Tc, b * Tc + Tc - 1, scores, (long)T * (T + 1) / 2);
    }
    fprintf(f, "the ring, forward (step s: rank r holds the keys and values of rank r - s):\n       ");
    for (int s = 0; s < N; s++) fprintf(f, " step %-3d", s);
    fprintf(f, "\n");
    for (int r = 0; r < N; r++) {
        fprintf(f, "  rank %-2d", r);
        for (int s = 0; s < N; s++) fprintf(f, " KV %-5d", (r + N - s) % N);
        fprintf(f, "\n");
    }
    fprintf(f, "%d passes of a block forward, %d backward (its gradient travels with it, one more hop home)\n",
            N - 1, N);
}

void cp_locate(int N, int T, int pos, int *rank, int *row) {
    int Tc = T / (2 * N), c = pos / Tc;   /* chunk c is rank c's first, or rank 2N-1-c's second */
    *rank = c < N ? c : 2 * N - 1 - c;
    *row = (c < N ? 0 : Tc) + pos % Tc;
}

int cp_check(int N, int T, char *err, size_t errlen) {
    if (N > 1 && T % (2 * N)) {
        snprintf(err, errlen, "--cp %d: --seq %d is not a multiple of 2 x %d = %d (each rank holds two of "
                 "the sequence's %d chunks)", N, T, N, 2 * N, 2 * N);
        return -1;
    }
    return 0;
}

void cp_block_forward_naive(float *out, float *lse, const float *qkv, const float *kv, int B, int T,
                            int C, int NH, int N, int r, int s, uint64_t *pairs) {
    int Tl = T / N, hs = C / NH;
    float scale = (float)(1.0 / sqrt((double)hs));
    uint64_t count = 0;
    #pragma omp parallel reduction(+:count)
    {
        float *score = safe_malloc((size_t)Tl * sizeof(float), "cp scores");  /* [Tl] */
        float *ob = safe_malloc((size_t)hs * sizeof(float), "cp partial");    /* [hs] */
        #pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < NH; h++)
                for (int t = 0; t < Tl; t++) {
                    const float *q = qkv + ((size_t)b * Tl + t) * 3 * C + h * hs;   /* [hs] */
                    float m = -INFINITY;
                    for (int j = 0; j < Tl; j++) {
                        if (!cp_visible(N, T, r, t, s, j)) { score[j] = -INFINITY; continue; }
                        const float *k = kv + ((size_t)b * Tl + j) * 2 * C + h * hs;  /* [hs] */
                        float dot = 0;
                        for (int i = 0; i < hs; i++) dot += q[i] * k[i];
                        score[j] = dot * scale;
                        if (score[j] > m) m = score[j];
                        count++;
                    }
                    if (m == -INFINITY) continue;   /* no key of this block is visible */
                    double sum = 0;
                    for (int i = 0; i < hs; i++) ob[i] = 0;
                    for (int j = 0; j < Tl; j++) {
                        if (score[j] == -INFINITY) continue;
                        float e = expf(score[j] - m);
                        const float *v = kv + ((size_t)b * Tl + j) * 2 * C + C + h * hs;  /* [hs] */
                        for (int i = 0; i < hs; i++) ob[i] += e * v[i];
                        sum += e;
                    }
                    float lse_b = m + (float)log(sum);
                    /* the merge: both partials rescaled to the new log-sum-exp */
                    float *l = lse + ((size_t)b * NH + h) * Tl + t;
                    float *o = out + ((size_t)b * Tl + t) * C + h * hs;   /* [hs] */
                    float hi = *l > lse_b ? *l : lse_b;
                    float merged = hi + logf(expf(*l - hi) + expf(lse_b - hi));
                    float keep = expf(*l - merged), add = expf(lse_b - merged) / (float)sum;
                    for (int i = 0; i < hs; i++) o[i] = o[i] * keep + ob[i] * add;
                    *l = merged;
                }
        free(score);
        free(ob);
    }
    if (pairs) *pairs += count;
}

void cp_backward_prep(float *D, const float *out, const float *dout, int B, int Tl, int C, int NH) {
    int hs = C / NH;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < Tl; t++) {
                const float *o = out + ((size_t)b * Tl + t) * C + h * hs, *g = dout + ((size_t)b * Tl + t) * C + h * hs;
                float dot = 0;
                for (int i = 0; i < hs; i++) dot += o[i] * g[i];
                D[((size_t)b * NH + h) * Tl + t] = dot;
            }
}

/* A (batch, head) pair owns its channels of dqkv and dkv, so the threads
 * split pairs and no two write the same element. */
void cp_block_backward_naive(float *dqkv, float *dkv, const float *qkv, const float *kv,
                             const float *out, const float *lse, const float *D, const float *dout, int B,
                             int T, int C, int NH, int N, int r, int s) {
    int Tl = T / N, hs = C / NH;
    float scale = (float)(1.0 / sqrt((double)hs));
    (void)out;
    #pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < Tl; t++) {
                size_t row = (size_t)b * Tl + t;
                const float *q = qkv + row * 3 * C + h * hs;   /* [hs] */
                const float *g = dout + row * C + h * hs;      /* [hs] */
                float *dq = dqkv + row * 3 * C + h * hs;       /* [hs] */
                float l = lse[((size_t)b * NH + h) * Tl + t], d = D[((size_t)b * NH + h) * Tl + t];
                for (int j = 0; j < Tl; j++) {
                    if (!cp_visible(N, T, r, t, s, j)) continue;
                    size_t krow = (size_t)b * Tl + j;
                    const float *k = kv + krow * 2 * C + h * hs, *v = k + C;   /* [hs] each */
                    float *dk = dkv + krow * 2 * C + h * hs, *dv = dk + C;     /* [hs] each */
                    float dot = 0, dp = 0;
                    for (int i = 0; i < hs; i++) { dot += q[i] * k[i]; dp += g[i] * v[i]; }
                    float p = expf(dot * scale - l);
                    float ds = p * (dp - d) * scale;
                    for (int i = 0; i < hs; i++) {
                        dq[i] += ds * k[i];
                        dk[i] += ds * q[i];
                        dv[i] += p * g[i];
                    }
                }
            }
}

/* ---------------------------------------------------------------------------
 * The fast path, what the ring runs: the same blocks as matrix products.
 * Rank r's rows are runs of consecutive positions (its two chunks; one run
 * of T when N = 1), and so are rank s's keys. A pair of chunks is one of
 * three: the key chunk earlier than the query chunk, seen whole; the same
 * chunk (r = s), causal, seen up to the diagonal; the key chunk later, not
 * seen. Per (batch, head), in blocks of CP_ROWS query rows inside one
 * chunk, the scores S = Q K^T go to gemm.c over the strided views of qkv
 * and kv (nothing is transposed in memory) for the keys the block's last
 * row sees, then the block's softmax and log-sum-exp, then P V by gemm,
 * then the merge; backward recomputes P and runs dP = dO V^T, dS, dQ += dS
 * K, dK += dS^T Q, dV += P^T dO by gemm (ops.c's cpu_attention_forward /
 * _backward, a block at a time). A (batch, head) pair is one thread's, its
 * products single-threaded inside (gemm.c runs one thread in a parallel
 * region), and each product sums in an order fixed by its shape: no
 * result depends on the thread count. */

#define CP_ROWS 96   /* query rows a block, as ops.c's AT_ROWS */

/* Rank r's rows as runs of consecutive positions: n runs of len rows, run
 * k at rows [k len, (k + 1) len) holding positions pos[k] + i. */
typedef struct {
    int n, len, pos[2];
} CPRuns;

static CPRuns cp_runs(int N, int r, int T) {
    if (N == 1) return (CPRuns){.n = 1, .len = T};
    int Tc = T / (2 * N);
    return (CPRuns){.n = 2, .len = Tc, .pos = {cp_chunk(N, r, 0) * Tc, cp_chunk(N, r, 1) * Tc}};
}

/* How many of rank s's rows rank r's query row t sees, counted from rank
 * s's first row: the causal mask as chunk pairs. Rank s's chunks come in
 * order of position (s before 2N-1-s), so whatever a query sees of the
 * later one it sees the earlier whole: the keys seen are always the
 * block's first rows, and within a chunk a later row sees as many or more. */
static int cp_seen(int N, int T, int r, int t, int s) {
    CPRuns q = cp_runs(N, r, T), k = cp_runs(N, s, T);
    int qi = t / q.len, tq = t % q.len, n = 0;
    for (int kk = 0; kk < k.n; kk++) {
        if (k.pos[kk] < q.pos[qi]) n = (kk + 1) * k.len;            /* an earlier chunk: whole */
        else if (k.pos[kk] == q.pos[qi]) n = kk * k.len + tq + 1;   /* the same chunk: causal */
    }                                                               /* a later chunk: nothing */
    return n;
}

/* The end of the block of query rows that starts at row r0: CP_ROWS rows,
 * or fewer at the end of r0's chunk. */
static int cp_block_end(const CPRuns *q, int r0) {
    int end = (r0 / q->len + 1) * q->len;
    return r0 + CP_ROWS < end ? r0 + CP_ROWS : end;
}

void cp_block_forward(float *out, float *lse, const float *qkv, const float *kv, int B, int T, int C,
                      int NH, int N, int r, int s, uint64_t *pairs) {
    int Tl = T / N, hs = C / NH;
    size_t lq = 3 * (size_t)C, lk = 2 * (size_t)C;   /* a row of qkv, of kv */
    float scale = (float)(1.0 / sqrt((double)hs));
    CPRuns q = cp_runs(N, r, T);
    uint64_t count = 0;
    #pragma omp parallel reduction(+:count)
    {
        float *S = safe_malloc((size_t)CP_ROWS * Tl * sizeof(float), "cp scores");     /* [CP_ROWS, <= Tl] */
        float *ob = safe_malloc((size_t)CP_ROWS * hs * sizeof(float), "cp partial");   /* [CP_ROWS, hs] */
        float *lb = safe_malloc((size_t)CP_ROWS * 2 * sizeof(float), "cp partial lse"); /* [CP_ROWS, 2] */
        #pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < NH; h++) {
                const float *Q = qkv + (size_t)b * Tl * lq + h * hs;           /* [Tl,hs] at lq */
                const float *K = kv + (size_t)b * Tl * lk + h * hs, *V = K + C; /* [Tl,hs] at lk */
                float *O = out + (size_t)b * Tl * C + h * hs;                   /* [Tl,hs] at C */
                float *L = lse + ((size_t)b * NH + h) * Tl;                     /* [Tl] */
                for (int r0 = 0; r0 < Tl; r0 = cp_block_end(&q, r0)) {
                    int r1 = cp_block_end(&q, r0), nc = cp_seen(N, T, r, r1 - 1, s);
                    if (nc == 0) continue;   /* a later chunk: no key of this block is visible */
                    gemm(r1 - r0, nc, hs, Q + r0 * lq, lq, 1, K, 1, lk, S, nc, 0, NULL);
                    /* the block's softmax: each row's visible scores, its max, e^(s - max), their sum */
                    for (int t = r0; t < r1; t++) {
                        float *a = S + (size_t)(t - r0) * nc;   /* [nc] */
                        int n = cp_seen(N, T, r, t, s);
                        float m = -INFINITY;
                        #pragma omp simd reduction(max:m)
                        for (int j = 0; j < n; j++) {
                            a[j] *= scale;
                            m = a[j] > m ? a[j] : m;
                        }
                        double sum = 0;
                        #pragma omp simd reduction(+:sum)
                        for (int j = 0; j < n; j++) { a[j] = exp_f32(a[j] - m); sum += a[j]; }
                        for (int j = n; j < nc; j++) a[j] = 0;
                        lb[2 * (t - r0)] = m + (float)log(sum);
                        lb[2 * (t - r0) + 1] = (float)sum;
                        count += (uint64_t)n;
                    }
                    gemm(r1 - r0, hs, nc, S, nc, 1, V, lk, 1, ob, hs, 0, NULL);   /* unnormalised P V */
                    /* the merge: both partials rescaled to the new log-sum-exp */
                    for (int t = r0; t < r1; t++) {
                        float lse_b = lb[2 * (t - r0)], sum = lb[2 * (t - r0) + 1];
                        float *l = L + t, *o = O + (size_t)t * C;   /* [hs] */
                        const float *p = ob + (size_t)(t - r0) * hs;  /* [hs] */
                        float hi = *l > lse_b ? *l : lse_b;
                        float merged = hi + logf(expf(*l - hi) + expf(lse_b - hi));
                        float keep = expf(*l - merged), add = expf(lse_b - merged) / sum;
                        for (int i = 0; i < hs; i++) o[i] = o[i] * keep + p[i] * add;
                        *l = merged;
                    }
                }
            }
        free(S);
        free(ob);
        free(lb);
    }
    if (pairs) *pairs += count;
}

void cp_block_backward(float *dqkv, float *dkv, const float *qkv, const float *kv, const float *out,
                       const float *lse, const float *D, const float *dout, int B, int T, int C, int NH,
                       int N, int r, int s) {
    int Tl = T / N, hs = C / NH;
    size_t lq = 3 * (size_t)C, lk = 2 * (size_t)C;
    float scale = (float)(1.0 / sqrt((double)hs));
    CPRuns q = cp_runs(N, r, T);
    (void)out;
    #pragma omp parallel
    {
        float *P = safe_malloc((size_t)CP_ROWS * Tl * sizeof(float), "cp probabilities");  /* [CP_ROWS, <= Tl] */
        float *dS = safe_malloc((size_t)CP_ROWS * Tl * sizeof(float), "cp score grads");   /* [CP_ROWS, <= Tl] */
        #pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < NH; h++) {
                size_t qo = (size_t)b * Tl * lq + h * hs, ko = (size_t)b * Tl * lk + h * hs;
                const float *Q = qkv + qo, *K = kv + ko, *V = K + C;    /* [Tl,hs] at lq, lk, lk */
                float *dQ = dqkv + qo, *dK = dkv + ko, *dV = dK + C;     /* [Tl,hs] at lq, lk, lk */
                const float *G = dout + (size_t)b * Tl * C + h * hs;     /* [Tl,hs] at C */
                const float *L = lse + ((size_t)b * NH + h) * Tl, *Dr = D + ((size_t)b * NH + h) * Tl;  /* [Tl] */
                for (int r0 = 0; r0 < Tl; r0 = cp_block_end(&q, r0)) {
                    int r1 = cp_block_end(&q, r0), nc = cp_seen(N, T, r, r1 - 1, s), M = r1 - r0;
                    if (nc == 0) continue;
                    gemm(M, nc, hs, Q + r0 * lq, lq, 1, K, 1, lk, P, nc, 0, NULL);    /* S = Q K^T */
                    gemm(M, nc, hs, G + r0 * (size_t)C, C, 1, V, 1, lk, dS, nc, 0, NULL);  /* dP = dO V^T */
                    /* P = e^(S scale - lse) with the merged lse; dS = P (dP - D) scale; 0 where not seen */
                    for (int t = r0; t < r1; t++) {
                        float *p = P + (size_t)(t - r0) * nc, *e = dS + (size_t)(t - r0) * nc;   /* [nc] */
                        float l = L[t], d = Dr[t];
                        int n = cp_seen(N, T, r, t, s);
                        #pragma omp simd
                        for (int j = 0; j < n; j++) {
                            p[j] = exp_f32(p[j] * scale - l);
                            e[j] = p[j] * (e[j] - d) * scale;
                        }
                        for (int j = n; j < nc; j++) p[j] = e[j] = 0;
                    }
                    gemm(M, hs, nc, dS, nc, 1, K, lk, 1, dQ + r0 * lq, lq, 1, NULL);               /* dQ += dS K */
                    gemm(nc, hs, M, dS, 1, nc, Q + r0 * lq, lq, 1, dK, lk, 1, NULL);               /* dK += dS^T Q */
                    gemm(nc, hs, M, P, 1, nc, G + r0 * (size_t)C, C, 1, dV, lk, 1, NULL);          /* dV += P^T dO */
                }
            }
        free(P);
        free(dS);
    }
}

void cp_pack_kv(float *kv, const float *qkv, int B, int Tl, int C) {
    for (size_t row = 0; row < (size_t)B * Tl; row++)
        memcpy(kv + row * 2 * C, qkv + row * 3 * C + C, 2 * (size_t)C * sizeof(float));
}

void cp_unpack_dkv(float *dqkv, const float *dkv, int B, int Tl, int C) {
    for (size_t row = 0; row < (size_t)B * Tl; row++)
        memcpy(dqkv + row * 3 * C + C, dkv + row * 2 * C, 2 * (size_t)C * sizeof(float));
}

/* ---------------------------------------------------------------------------
 * The ring's buffers and passes. On the CPU they are host float32 and the
 * blocks run the fast path above. On a GPU (dev CUDA, float32 or bf16) they
 * are device memory: kv in the dev's dtype, their gradients, D, and one
 * float32 accumulator (the output's merge in forward, dq in backward), and
 * each block step is kernels.cu's cuda_cp_*; comm_sendrecv takes device
 * buffers (NCCL's own, or staged through the host on shared memory). */

static int cp_gpu(const CP *cp) { return cp->dev && cp->dev->kind == DEV_CUDA; }
static size_t cp_esz(const CP *cp) { return cp_gpu(cp) ? dt_size(cp->dev->dtype) : sizeof(float); }

static void *cp_alloc(CP *cp, size_t bytes, const char *what) {
    return cp_gpu(cp) ? dev_alloc(cp->dev, bytes) : safe_malloc(bytes, what);
}
static void cp_release(CP *cp, void *p, size_t bytes) {
    if (!p) return;
    if (cp_gpu(cp)) dev_free(cp->dev, p, bytes);
    else free(p);
}

/* Rows [Tl,C] of the two chunks, made room for (n elements, 4 bytes each at most). */
static void cp_reserve_rows(CP *cp, size_t n) {
    if (n <= cp->pos_cap) return;
    cp_release(cp, cp->wpe, cp->pos_cap * sizeof(float));
    cp_release(cp, cp->dwpe, cp->pos_cap * sizeof(float));
    cp->wpe = cp_alloc(cp, n * sizeof(float), "the cp positions");
    cp->dwpe = cp_alloc(cp, n * sizeof(float), "the cp positions' gradient");
    cp->pos_cap = n;
}

const void *cp_positions(CP *cp, const void *wpe, int T, int C) {
    int Tl = T / cp->N, Tc = Tl / 2;
    size_t e = cp_esz(cp), chunk = (size_t)Tc * C * e;
    cp_reserve_rows(cp, (size_t)Tl * C);
    for (int half = 0; half < 2; half++) {   /* a chunk's positions are one run of wpe's rows */
        char *dst = (char *)cp->wpe + half * chunk;
        const char *src = (const char *)wpe + cp_chunk(cp->N, cp->rank, half) * chunk;
        if (cp_gpu(cp)) dev_copy(cp->dev, dst, src, chunk);
        else memcpy(dst, src, chunk);
    }
    return cp->wpe;
}

float *cp_positions_grad(CP *cp, int T, int C) {
    size_t n = (size_t)(T / cp->N) * C;
    cp_reserve_rows(cp, n);
    if (cp_gpu(cp)) dev_zero(cp->dev, cp->dwpe, n * sizeof(float));
    else memset(cp->dwpe, 0, n * sizeof(float));
    return cp->dwpe;
}

void cp_positions_done(CP *cp, float *dwpe, int T, int C) {
    int Tc = T / cp->N / 2;
    for (int half = 0; half < 2; half++) {
        float *dst = dwpe + (size_t)cp_chunk(cp->N, cp->rank, half) * Tc * C;
        const float *src = cp->dwpe + (size_t)half * Tc * C;
        if (cp_gpu(cp)) { cp->dev->ops->accumulate(cp->dev, dst, src, (size_t)Tc * C); continue; }
        for (size_t i = 0; i < (size_t)Tc * C; i++) dst[i] += src[i];
    }
}

void cp_init(CP *cp, CommGroup *g, Dev *dev) {
    memset(cp, 0, sizeof *cp);
    cp->g = g;
    cp->dev = dev;
    cp->N = g && g->size > 0 ? g->size : 1;
    cp->rank = g && g->size > 0 ? g->index : 0;
}

/* The ring's buffers freed (cap, nd: what cp_reserve made them for). */
static void cp_release_ring(CP *cp) {
    size_t n = cp->cap - cp->nd;
    for (int i = 0; i < 2; i++) {
        cp_release(cp, cp->kv[i], n * cp_esz(cp));
        cp_release(cp, cp->dkv[i], n * sizeof(float));
    }
    cp_release(cp, cp->D, cp->nd * sizeof(float));
    cp_release(cp, cp->acc, n / 2 * sizeof(float));
}

void cp_free(CP *cp) {
    cp_release_ring(cp);
    cp_release(cp, cp->wpe, cp->pos_cap * sizeof(float));
    cp_release(cp, cp->dwpe, cp->pos_cap * sizeof(float));
    memset(cp, 0, sizeof *cp);
}

/* The ring's buffers for blocks of n elements and a D of nd floats; on a
 * GPU also the float32 accumulator of n / 2 (a [B,Tl,C] beside a block's
 * [B,Tl,2C]). */
static void cp_reserve(CP *cp, size_t n, size_t nd) {
    if (n + nd <= cp->cap) return;
    cp_release_ring(cp);
    for (int i = 0; i < 2; i++) {
        cp->kv[i] = cp_alloc(cp, n * cp_esz(cp), "the cp ring's keys and values");
        cp->dkv[i] = cp_alloc(cp, n * sizeof(float), "the cp ring's key and value gradients");
    }
    cp->D = cp_alloc(cp, nd * sizeof(float), "the cp ring's row dots");
    cp->acc = cp_gpu(cp) ? cp_alloc(cp, n / 2 * sizeof(float), "the cp ring's accumulator") : NULL;
    cp->ring_bytes = 2 * n * cp_esz(cp) + (2 * n + nd) * sizeof(float) + (cp->acc ? n / 2 * sizeof(float) : 0);
    cp->cap = n + nd;
    cp->nd = nd;
}

void cp_reserve_step(CP *cp, int B, int T, int C, int NH, int Cw, int embed) {
    int Tl = T / cp->N;
    cp_reserve(cp, (size_t)B * Tl * 2 * C, (size_t)B * NH * Tl);
    if (embed) cp_reserve_rows(cp, (size_t)Tl * Cw);
}

size_t cp_bytes(const CP *cp) { return cp->ring_bytes + 2 * cp->pos_cap * sizeof(float); }

/* The block in hand goes to rank + 1 while the next arrives from rank - 1
 * (n elements of t). The operation is returned for the compute stream to
 * wait on where the arriving block is needed (cp_arrived, GPU only: on
 * the CPU the exchange is done when it returns). */
static CommOp cp_pass(CP *cp, void *send, void *recv, size_t n, CommDtype t) {
    int N = cp->N;
    return comm_sendrecv(cp->g, cp->dev, send, (cp->rank + 1) % N, recv, (cp->rank + N - 1) % N, n, t);
}
#ifdef USE_CUDA
static void cp_arrived(CP *cp, CommOp op) { comm_op_wait(op, cp->dev); }

/* The ring on a GPU: each pass queued before the block in hand's kernel, and
 * waited for after it, so that on NCCL the p2p runs beside the kernel. */
static void cp_gpu_forward(CP *cp, void *out, float *lse, const void *qkv, int B, int T, int C, int NH) {
    int N = cp->N, Tl = T / N;
    size_t n = (size_t)B * Tl * 2 * C, rows = (size_t)B * Tl;
    DType dt = cp->dev->dtype;
    void *st = cp->dev->stream;
    CommDtype ct = dt == DT_BF16 ? COMM_BF16 : COMM_F32;
    cuda_cp_copy_cols(cp->kv[0], dt, 2 * (size_t)C, 0, qkv, dt, 3 * (size_t)C, C, 2 * (size_t)C, rows, st);
    int cur = 0;
    for (int step = 0; step < N; step++) {
        int src = (cp->rank + N - step) % N;
        CommOp op = {0};
        if (step < N - 1) op = cp_pass(cp, cp->kv[cur], cp->kv[cur ^ 1], n, ct);
        cuda_cp_block_forward(cp->acc, lse, qkv, cp->kv[cur], B, T, C, NH, N, cp->rank, src, step == 0, dt, st);
        if (step < N - 1) cp_arrived(cp, op);
        cur ^= 1;
    }
    cuda_cp_copy_cols(out, dt, C, 0, cp->acc, DT_F32, C, 0, C, rows, st);   /* rounded to the dtype once */
}

static void cp_gpu_backward(CP *cp, void *dqkv, const void *dout, const void *qkv, const void *out,
                            const float *lse, int B, int T, int C, int NH) {
    int N = cp->N, Tl = T / N;
    size_t n = (size_t)B * Tl * 2 * C, rows = (size_t)B * Tl;
    DType dt = cp->dev->dtype;
    void *st = cp->dev->stream;
    CommDtype ct = dt == DT_BF16 ? COMM_BF16 : COMM_F32;
    cuda_cp_prep(cp->D, out, dout, B, Tl, C, NH, dt, st);
    dev_zero(cp->dev, cp->acc, n / 2 * sizeof(float));
    dev_zero(cp->dev, cp->dkv[0], n * sizeof(float));
    cuda_cp_copy_cols(cp->kv[0], dt, 2 * (size_t)C, 0, qkv, dt, 3 * (size_t)C, C, 2 * (size_t)C, rows, st);
    int cur = 0;
    for (int step = 0; step < N; step++) {
        int src = (cp->rank + N - step) % N;
        CommOp op = {0};
        /* the block itself moves on beside its kernel (the kernel only reads it) */
        if (N > 1 && step < N - 1) op = cp_pass(cp, cp->kv[cur], cp->kv[cur ^ 1], n, ct);
        cuda_cp_block_backward(cp->acc, cp->dkv[cur], qkv, cp->kv[cur], lse, cp->D, dout, B, T, C, NH, N,
                               cp->rank, src, dt, st);
        if (N > 1 && step < N - 1) cp_arrived(cp, op);
        if (N > 1) cp_arrived(cp, cp_pass(cp, cp->dkv[cur], cp->dkv[cur ^ 1], n, COMM_F32));   /* its gradient after it */
        if (N > 1) cur ^= 1;
    }
    cuda_cp_copy_cols(dqkv, dt, 3 * (size_t)C, 0, cp->acc, DT_F32, C, 0, C, rows, st);
    cuda_cp_copy_cols(dqkv, dt, 3 * (size_t)C, C, cp->dkv[cur], DT_F32, 2 * (size_t)C, 0, 2 * (size_t)C, rows, st);
}
#endif

void cp_attention_forward(CP *cp, void *out_, float *lse, const void *qkv_, int B, int T, int C, int NH) {
    int N = cp->N, Tl = T / N;
    size_t n = (size_t)B * Tl * 2 * C;
    cp_reserve(cp, n, (size_t)B * NH * Tl);
#ifdef USE_CUDA
    if (cp_gpu(cp)) { cp_gpu_forward(cp, out_, lse, qkv_, B, T, C, NH); return; }
#endif
    float *out = out_;
    const float *qkv = qkv_;
    memset(out, 0, (size_t)B * Tl * C * sizeof(float));
    for (size_t i = 0; i < (size_t)B * NH * Tl; i++) lse[i] = -INFINITY;
    cp_pack_kv(cp->kv[0], qkv, B, Tl, C);
    int cur = 0;
    for (int step = 0; step < N; step++) {
        int src = (cp->rank + N - step) % N;   /* whose block is in hand */
        if (step < N - 1) cp_pass(cp, cp->kv[cur], cp->kv[cur ^ 1], n, COMM_F32);
        cp_block_forward(out, lse, qkv, cp->kv[cur], B, T, C, NH, N, cp->rank, src, NULL);
        cur ^= 1;
    }
}

void cp_attention_backward(CP *cp, void *dqkv_, const void *dout_, const void *qkv_, const void *out_,
                           const float *lse, int B, int T, int C, int NH) {
    int N = cp->N, Tl = T / N;
    size_t n = (size_t)B * Tl * 2 * C;
    cp_reserve(cp, n, (size_t)B * NH * Tl);
#ifdef USE_CUDA
    if (cp_gpu(cp)) { cp_gpu_backward(cp, dqkv_, dout_, qkv_, out_, lse, B, T, C, NH); return; }
#endif
    float *dqkv = dqkv_;
    const float *dout = dout_, *qkv = qkv_, *out = out_;
    cp_backward_prep(cp->D, out, dout, B, Tl, C, NH);
    memset(dqkv, 0, (size_t)B * Tl * 3 * C * sizeof(float));
    cp_pack_kv(cp->kv[0], qkv, B, Tl, C);
    memset(cp->dkv[0], 0, n * sizeof(float));
    int cur = 0;
    for (int step = 0; step < N; step++) {
        int src = (cp->rank + N - step) % N;
        cp_block_backward(dqkv, cp->dkv[cur], qkv, cp->kv[cur], out, lse, cp->D, dout, B, T, C, NH, N,
                          cp->rank, src);
        if (N > 1) {   /* the block and its gradient move on; after the last step, the gradient goes home */
            if (step < N - 1) cp_pass(cp, cp->kv[cur], cp->kv[cur ^ 1], n, COMM_F32);
            cp_pass(cp, cp->dkv[cur], cp->dkv[cur ^ 1], n, COMM_F32);
            cur ^= 1;
        }
    }
    cp_unpack_dkv(dqkv, cp->dkv[cur], B, Tl, C);
}
