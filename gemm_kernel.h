/* gemm_kernel.h: the contract between gemm.c's driver and its micro-kernels.
 *
 * A micro-kernel computes one MR x NR block of C from packed panels: Ap
 * holds MR rows of A for kc values of k, k-major (Ap[k * MR + i]); Bp
 * holds NR columns of B the same way (Bp[k * NR + j]). Each of the MR x NR
 * sums starts at zero and adds its kc products in k order, one fused
 * multiply-add each; the sum is then stored (load_c == 0) or added to what
 * C holds (load_c == 1). That is all the arithmetic: which thread runs a
 * block, and in what order blocks are run, cannot change a bit of it.
 *
 * gemm_avx512.c, gemm_avx2.c and gemm.c (the plain one) each define one
 * kernel; the first two are compiled with their own ISA flags (Makefile),
 * so each is compiled for exactly the registers it will run with, whatever
 * -march the rest of the build uses. The blocking sizes travel with the
 * kernel: kc (K per block, which fixes the summation order, so it never
 * depends on the thread count), mc and nc (rows of A and columns of B
 * packed at once, sized for L2 and L3).
 */
#ifndef GEMM_KERNEL_H
#define GEMM_KERNEL_H

#include <stddef.h>

/* C[i * ldc + j] (=|+=) sum_{k < kc} Ap[k * mr + i] * Bp[k * nr + j], i < mr, j < nr. */
typedef void GemmMicro(int kc, const float *Ap, const float *Bp, float *C, size_t ldc, int load_c);

/* dst[k * w + x] = src[x * ld + k] for x < rows, k < kc, and 0 for rows <= x < w:
 * one micro-panel w wide packed from an operand whose k is contiguous (X and
 * W^T in the forward, dY as A in dX), a transpose. Copies only: it cannot
 * change a bit of the product. The ahead rows after the panel's (src[(rows +
 * y) * ld + k], y < ahead) are the next panel's: a pack may ask for them
 * early, and must not read them. */
typedef void GemmPackT(int rows, int w, int kc, const float *src, size_t ld, int ahead, float *dst);

typedef struct GemmKernel {
    const char *name;  /* "avx512", "avx2", "plain" */
    int mr, nr;        /* the register block */
    int kc, mc, nc;    /* K per block (fixed), rows of A and columns of B packed at once */
    int a_outer;       /* 1: an A micro-panel stays in L1 while B's stream past it (BLIS's
                        * order for Skylake-X); 0: a B micro-panel stays while A's stream */
    GemmMicro *run;
    GemmPackT *pack_t; /* the transposing pack for this ISA */
} GemmKernel;

/* Each is defined only where its file was compiled for x86-64 (NULL run elsewhere). */
extern const GemmKernel gemm_avx512_kernel;  /* gemm_avx512.c: 12 x 32, zmm */
extern const GemmKernel gemm_avx2_kernel;    /* gemm_avx2.c: 6 x 16, ymm */

/* gemm_avx2.c: GemmPackT in 8 x 8 ymm transposes (the AVX-512 kernel uses it
 * too: every AVX-512 CPU has AVX2). Defined only on x86-64. */
void gemm_avx2_pack_t(int rows, int w, int kc, const float *src, size_t ld, int ahead, float *dst);

#endif
