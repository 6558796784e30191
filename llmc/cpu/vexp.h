// vexp.h: a float exponential that the compiler can vectorize, for the CPU kernels' softmax,
// SwiGLU and cross-entropy loops. glibc's expf is a call per element and cannot be vectorized
// without -ffast-math; this one is branch-free straight-line code, so `#pragma omp simd`
// loops over it become AVX-512/AVX2/SSE2 code.
//
// It works in double, where rounding is ~2^-29 of a float ulp: e^x = 2^n * e^r with
// n = round(x / ln 2), |r| <= ln2/2, and e^r from its Taylor series to degree 9 (truncation
// 7e-12 relative). The double result is rounded to float once, so it is the correctly rounded
// float except within ~1e-11 of a rounding boundary: test_cpu_variants samples every 61st float
// in [-104, 89] and finds 20 of 36.7M off by 1 ulp (glibc's expf: 2,830), none by more.
// (Degree 10 makes it 0 of 36.7M at 10% more time; degree 8, 687.)
// Subnormal results come out right because 2^n stays a normal double; NaN propagates;
// x < -104 gives 0 and x > 89 gives +inf as float.
#pragma once
#include <stdint.h>
#include <string.h>

#pragma omp declare simd notinbranch
static inline float vexpf(float xf) {
    double x = xf;
    x = __builtin_isless(x, -104.0) ? -104.0 : x;  // quiet comparisons: NaN stays NaN, and
    x = __builtin_isgreater(x, 89.0) ? 89.0 : x;  // they let loops over vexpf vectorize
    const double magic = 6755399441055744.0;  // 1.5 * 2^52: adding it rounds to an integer
    double t = x * 1.4426950408889634 + magic;
    double n = t - magic;
    double r = x - n * 0.6931471805599453;
    // Estrin's scheme: pairs of terms, then pairs of pairs: the longest chain of dependent
    // operations is 8 instead of Horner's 18. Measured ~4% faster in SwiGLU: the loops are
    // mostly throughput-bound (double precision, two halves per AVX-512 float vector).
    double r2 = r * r, r4 = r2 * r2, r8 = r4 * r4;
    double a01 = 1.0 + r, a23 = 0.5 + r * (1.0 / 6), a45 = 1.0 / 24 + r * (1.0 / 120);
    double a67 = 1.0 / 720 + r * (1.0 / 5040), a89 = 1.0 / 40320 + r * (1.0 / 362880);
    double p = (a01 + r2 * a23) + r4 * (a45 + r2 * a67) + r8 * a89;
    uint64_t bits;
    memcpy(&bits, &t, sizeof bits);  // t's mantissa holds 2^51 + n, so bits - bits(magic) = n
    uint64_t e = (bits - 0x4338000000000000ULL + 1023) << 52;  // the double 2^n (n in [-151, 129])
    double scale;
    memcpy(&scale, &e, sizeof scale);
    return (float)(p * scale);
}
