/* exp_f32.h: e^x in float as plain arithmetic (ops.c's attention, GELU and
 * softmaxes; cp.c's ring attention), one definition for both. */
#ifndef EXP_F32_H
#define EXP_F32_H
#include <stdint.h>

/* e^x in float as plain arithmetic, so that a loop calling it vectorises
 * (libm's expf does not without -ffast-math, nor does a float comparison
 * under the default trapping math: the clamp and the rounding are integer
 * operations on the bits). x is clamped to [-87.33, 88.37] (e^-100 gives
 * 2^-126, not a subnormal; e^100 about 2.4e38, not inf), a NaN stays NaN;
 * x = n ln2 + r with n rounded by the 1.5 * 2^23 trick, e^r by Cephes'
 * polynomial, times 2^n built in the exponent bits. Within 2 ulp of expf.
 * The exponent is built on unsigned arithmetic: a NaN's t has any bits,
 * which shifted left as an int overflowed (undefined behaviour); as uint32_t
 * they wrap, the product is still the NaN, and every other input gives the
 * bits of the int version (all 2^32 inputs compared). */
static inline float exp_f32(float x) {
    int32_t b, m, lim;
    __builtin_memcpy(&b, &x, 4);
    m = b & 0x7fffffff;                                /* |x|'s bits */
    lim = b < 0 ? 0x42aea8f6 : 0x42b0bd71;             /* 87.33f, 88.37f */
    m = m > lim && m <= 0x7f800000 ? lim : m;          /* a NaN (above inf) passes */
    b = (b & INT32_MIN) | m;                           /* x's sign back */
    __builtin_memcpy(&x, &b, 4);
    float t = x * 1.44269504088896341f + 12582912.0f;  /* round(x log2 e) in t's low bits */
    float n = t - 12582912.0f;
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1;
    uint32_t k;                                        /* 2^n: n + 127 into the exponent field */
    __builtin_memcpy(&k, &t, 4);
    k = (k - 0x4b400000u + 127u) << 23;                /* unsigned: a NaN's bits wrap, harmlessly */
    float two_n;
    __builtin_memcpy(&two_n, &k, 4);
    return p * two_n;
}
#endif
