/* cp.h: context parallelism: each sequence split over the N ranks of a cp
 * group, attention as a ring that passes keys and values (cp.c).
 */
#ifndef CP_H
#define CP_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "comm.h"

/* Where a rank's tokens sit in the sequence. A sequence of T tokens is cut
 * into 2N chunks of Tc = T / 2N; rank r holds chunk r then chunk 2N-1-r, so
 * its local row i (0 <= i < 2 Tc) is the sequence's position
 * cp_position(N, r, T, i). N = 1 is the identity. */
int cp_chunk(int N, int r, int half);
int cp_position(int N, int r, int T, int i);

/* x [B,T] of whole sequences becomes, in place, x [B,T/N]: rank r's rows,
 * position cp_position(N, r, T, i) at row i; and y too when not NULL (the
 * targets beside the inputs). */
void cp_local_tokens(int *x, int *y, int B, int T, int N, int r);

/* --show-schedule --cp N: the deal of T tokens and the ring's steps, as text. */
void cp_show(FILE *f, int N, int T);

/* The rank of N that holds position pos of a sequence of T tokens, and its row there. */
void cp_locate(int N, int T, int pos, int *rank, int *row);

/* Whether N ranks can split sequences of T tokens: 0, or -1 with one line
 * in err naming the rule (2N must divide T). */
int cp_check(int N, int T, char *err, size_t errlen);

/* One step of the ring, forward, for the local rows of rank r (qkv
 * [B,Tl,3C], Tl = T/N, q at channel 0 of a row, heads of C/NH side by side)
 * against the keys and values that rank s holds (kv [B,Tl,2C]: k at channel
 * 0, v at C). Query position p sees key position p' when p' <= p (the
 * causal mask, on the sequence's positions). The block's own softmax gives a
 * partial output o_b and log-sum-exp lse_b per (row, head); they merge into
 * out [B,Tl,C] and lse [B,NH,Tl], which start at 0 and -inf:
 *   lse' = log(e^lse + e^lse_b),  out' = out e^(lse - lse') + o_b e^(lse_b - lse').
 * pairs, when not NULL, counts the (query, key) scores computed. By
 * chunk pairs through gemm.c; the result does not depend on the thread
 * count. */
void cp_block_forward(float *out, float *lse, const float *qkv, const float *kv, int B, int T, int C,
                      int NH, int N, int r, int s, uint64_t *pairs);
/* The same as plain loops over (row, head, key): the specification the
 * fast path above (per chunk pair, by gemm) is tested against. */
void cp_block_forward_naive(float *out, float *lse, const float *qkv, const float *kv, int B, int T,
                            int C, int NH, int N, int r, int s, uint64_t *pairs);

/* D [B,NH,Tl] = the row dot products dO . O each head's backward needs. */
void cp_backward_prep(float *D, const float *out, const float *dout, int B, int Tl, int C, int NH);

/* One step of the ring, backward, for rank r's queries against rank s's
 * block: with P = exp(q.k scale - lse) (lse the merged one) and dS = P (dO.v
 * - D) scale, adds dS k into the q part of dqkv [B,Tl,3C], and dS q, P dO
 * into dkv [B,Tl,2C] (the gradients of the block's k and v, which travel
 * the ring with it). */
void cp_block_backward(float *dqkv, float *dkv, const float *qkv, const float *kv, const float *out,
                       const float *lse, const float *D, const float *dout, int B, int T, int C, int NH,
                       int N, int r, int s);
/* The same as plain loops (the specification). */
void cp_block_backward_naive(float *dqkv, float *dkv, const float *qkv, const float *kv,
                             const float *out, const float *lse, const float *D, const float *dout, int B,
                             int T, int C, int NH, int N, int r, int s);

/* kv [B,Tl,2C] = the k and v parts of qkv [B,Tl,3C]. */
void cp_pack_kv(float *kv, const float *qkv, int B, int Tl, int C);
/* The k and v parts of dqkv [B,Tl,3C] = dkv [B,Tl,2C]. */
void cp_unpack_dkv(float *dqkv, const float *dkv, int B, int Tl, int C);

/* A rank's place in its cp group and the ring's buffers: host float32 on
 * the CPU; on a GPU device memory, kv and wpe in the dev's dtype, the rest
 * float32. */
typedef struct CP {
    CommGroup *g;        /* the cp group: N ranks in ring order */
    Dev *dev;
    int N, rank;
    size_t cap, nd;      /* elements of a kv block plus D's, and D's alone */
    void *kv[2];         /* [B,Tl,2C] the block in hand and the one arriving */
    float *dkv[2];       /* [B,Tl,2C] its gradient, travelling with it */
    float *D;            /* [B,NH,Tl] */
    float *acc;          /* GPU only: [B,Tl,C] the merged output, then dq, before their rounding to the dtype */
    size_t pos_cap;      /* elements of each below */
    void *wpe;           /* [Tl,C] the position rows of this rank's chunks (the dev's dtype) */
    float *dwpe;         /* [Tl,C] their gradient */
    size_t ring_bytes;   /* what kv, dkv, D and acc hold */
} CP;

/* Binds cp to group g (N = g->size; g NULL: one rank). */
void cp_init(CP *cp, CommGroup *g, Dev *dev);
void cp_free(CP *cp);
/* The ring's buffers for micro-batches of B sequences of T tokens (C, NH:
 * this rank's channels and heads) and, with embed, the position rows of Cw
 * channels, made now rather than at the first step, so that the memory
 * line, printed before it, counts them (cp_bytes). */
void cp_reserve_step(CP *cp, int B, int T, int C, int NH, int Cw, int embed);
/* Bytes cp's buffers hold: the ring's and the position rows (0 unbound). */
size_t cp_bytes(const CP *cp);

/* The position embedding of this rank's rows: wpe's rows of its two
 * chunks, [Tl,C] (T the whole sequence, wpe on cp's dev in its dtype), for
 * the embedding to add. */
const void *cp_positions(CP *cp, const void *wpe, int T, int C);
/* A zeroed [Tl,C] for the embedding's backward to fill; then
 * cp_positions_done adds it into dwpe [maxT,C] at its chunks' rows. */
float *cp_positions_grad(CP *cp, int T, int C);
void cp_positions_done(CP *cp, float *dwpe, int T, int C);

/* Causal attention over the whole sequence for this rank's Tl = T/N rows:
 * N steps, each the block in hand (its own first) while the ring moves it
 * on to rank + 1 and takes the next from rank - 1. out [B,Tl,C] and qkv in
 * the dev's dtype (float32 on the CPU; on a GPU float32 or bf16, the
 * blocks by kernels.cu's cuda_cp_*), lse [B,NH,Tl] float32. Collective
 * over the cp group. */
void cp_attention_forward(CP *cp, void *out, float *lse, const void *qkv, int B, int T, int C, int NH);

/* Its backward: the blocks travel the ring again with their gradients; after
 * N steps each block's dk, dv are home. Writes all of dqkv [B,Tl,3C].
 * Collective over the cp group. */
void cp_attention_backward(CP *cp, void *dqkv, const void *dout, const void *qkv, const void *out,
                           const float *lse, int B, int T, int C, int NH);
#endif
