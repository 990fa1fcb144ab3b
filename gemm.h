/* gemm.h: the CPU's matrix product, C[M,N] (+)= A[M,K] B[K,N], float32.
 *
 * Every matmul of training on the CPU goes through gemm(): the linears'
 * forward X W^T, their dX = dY W and dW += dY^T X, the head's 50304-wide
 * product, and attention's Q K^T and P V over qkv's strided rows. Operands
 * are strided views, so a transpose is only a swap of strides: element
 * (i, k) of A is A[i * a_rs + k * a_cs], element (k, j) of B is
 * B[k * b_rs + j * b_cs], and C is row-major with leading dimension ldc.
 *
 * The result does not depend on the number of threads: each output element
 * is summed by one thread, over K in blocks of a size fixed by the kernel
 * (never by the thread count), each block in k order (gemm.c). It does
 * depend on the kernel: the AVX-512, AVX2 and plain kernels round
 * differently. TRAIN_GEMM=avx512|avx2|plain in the environment forces one
 * (the tests run each the machine can); otherwise the fastest the CPU
 * supports is chosen on the first call.
 */
#ifndef GEMM_H
#define GEMM_H

#include <stddef.h>

/* C[i*ldc + j] = (accumulate ? C : 0) + (bias ? bias[j] : 0) + sum_k A(i,k) B(k,j),
 * for i < M, j < N, k < K; threads: OpenMP's current team size. K == 0
 * leaves bias (or 0) in C, or C as it is when accumulating. */
void gemm(int M, int N, int K, const float *A, size_t a_rs, size_t a_cs, const float *B,
          size_t b_rs, size_t b_cs, float *C, size_t ldc, int accumulate, const float *bias);

/* How gemm() divides C between its threads: by rows, the team sharing each
 * packed block of B; by columns, sharing each packed block of A; or (AUTO,
 * what gemm() does) the split that balances the threads' micro-blocks, and
 * between near-equals the one that shares the smaller operand (gemm.c).
 * The bits are the same every way: the forced forms are for the tests and
 * bench_gemm --split. */
typedef enum {
    GEMM_SPLIT_AUTO,
    GEMM_SPLIT_ROWS,
    GEMM_SPLIT_COLS,        /* A packed whole once where it is small, else for each block of columns */
    GEMM_SPLIT_COLS_BLOCKS  /* by columns, A packed for each block of columns however small */
} GemmSplit;

/* gemm() with the division of C chosen. */
void gemm_split(GemmSplit split, int M, int N, int K, const float *A, size_t a_rs, size_t a_cs,
                const float *B, size_t b_rs, size_t b_cs, float *C, size_t ldc, int accumulate,
                const float *bias);

/* The same product as plain loops, each element summed in k order in float:
 * the specification the fast kernels are tested against. One thread. */
void gemm_reference(int M, int N, int K, const float *A, size_t a_rs, size_t a_cs,
                    const float *B, size_t b_rs, size_t b_cs, float *C, size_t ldc,
                    int accumulate, const float *bias);

/* The kernel gemm() uses: "avx512", "avx2" or "plain" (chosen on the first
 * call of either function; an unknown or unsupported TRAIN_GEMM prints one
 * line on stderr and falls back to the CPU's best). */
const char *gemm_kernel_name(void);

/* The CPU's model name and its vector ISA ("AVX-512", "AVX2+FMA", "none"),
 * for benchmark headers. model is written with at most len bytes. */
void gemm_cpu_describe(char *model, size_t len, const char **isa);

#endif
