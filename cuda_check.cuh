/* cuda_check.cuh: the one CUDA error check of every .cu file (kernels.cu,
 * matmul.cu, attention.cu, attention_sm90.cu): each runtime call and each
 * launch names itself, the file and the line, then exits. Host code only,
 * so the CPU emulation (test/emu/emu.h, the .cu files compiled by g++)
 * builds it as it is. Part of the GPU path (the article's section is
 * kernels.cu's); the including file has included <cuda_runtime.h> (or
 * emu.h), <stdio.h> and <stdlib.h> first. */
#ifndef CUDA_CHECK_CUH
#define CUDA_CHECK_CUH

/* Exit 1 with "CUDA error: call at file:line: reason" unless err is cudaSuccess. */
static inline void cuda_check(cudaError_t err, const char *call, const char *file, int line) {
    if (err == cudaSuccess) return;
    fprintf(stderr, "CUDA error: %s at %s:%d: %s\n", call, file, line, cudaGetErrorString(err));
    exit(1);
}
#define CUDA_CHECK(call) cuda_check((call), #call, __FILE__, __LINE__)
/* A launch reports a bad configuration through cudaGetLastError; kernel is
 * the kernel's name (an identifier, or a variable holding the kernel). */
#define LAUNCH_CHECK(kernel) cuda_check(cudaGetLastError(), #kernel "<<<>>>", __FILE__, __LINE__)

#endif
