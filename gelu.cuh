/* gelu.cuh: GELU's tanh approximation (GPT-2's) and its derivative on the
 * device, written once for the two translation units that apply them:
 * kernels.cu's elementwise gelu_forward / gelu_backward and matmul.cu's
 * fused epilogue (the fcproj input gradient times gelu'), whose bits must
 * be those of the elementwise pass. The article's section is the MLP's
 * (GELU between fc and fcproj). Float arithmetic, one expression each; the
 * CPU emulation compiles the same text for the host. */
#ifndef GELU_CUH
#define GELU_CUH

#define GELU_S 0.7978845608028654f  /* sqrt(2/pi) */

/* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
static __device__ __forceinline__ float gelu_f(float x) {
    return 0.5f * x * (1.0f + tanhf(GELU_S * (x + 0.044715f * x * x * x)));
}
/* d gelu_f / dx. */
static __device__ __forceinline__ float gelu_grad(float x) {
    float th = tanhf(GELU_S * (x + 0.044715f * x * x * x));
    float sech2 = 1.0f - th * th;  // tanh' without cosh, which overflows
    return 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_S * (1.0f + 3.0f * 0.044715f * x * x);
}

#endif
