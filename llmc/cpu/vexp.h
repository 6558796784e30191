// vexp.h: a float exponential that the compiler can vectorize, for the CPU kernels' softmax,
// SwiGLU and cross-entropy loops. glibc's expf is a call per element and cannot be vectorized
// without -ffast-math; this one is branch-free straight-line code, so `#pragma omp simd`
// loops over it become AVX-512/AVX2 code.
//
// All in float: e^x = 2^n * e^r with n = round(x / ln 2), r = x - n ln 2 (ln 2 in two parts, the
// first with 16 significant bits so n times it is exact), |r| <= ln2/2, and e^r = 1 + r +
// r^2 q(r) with q from the Taylor series to degree 7 (truncation 5e-9 relative, 0.04 ulp).
// Every float in [-104, 89] checked (2.24e9 of them): none is more than 1 ulp from the correctly
// rounded value and 0.77% are 1 ulp off (glibc's expf: 0.008%; Sleef's expf_u10, which PyTorch's
// vectorized CPU softmax and SiLU use: up to 1 ulp). test_cpu_variants samples every 61st.
// It replaced a double-precision version (20 of 36.7M samples 1 ulp off) that took 0.85 ns an
// element with AVX-512 on this project's AMD EPYC, against 0.34 for this one (2026-11-25).
//
// fmaf rounds once, so the bits do not depend on whether the machine has FMA (without it,
// as in the SSE2 build, fmaf is glibc's exact emulation) or on the vector width.
// Subnormal results round once: 2^n is applied as 2^h * 2^(n-h), each a normal float, and
// p * 2^h is exact. NaN propagates; x < -104 gives 0 and x > 89 gives +inf.
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>

#pragma omp declare simd notinbranch
static inline float vexpf(float x) {
    x = __builtin_isless(x, -104.0f) ? -104.0f : x;  // quiet comparisons: NaN stays NaN, and
    x = __builtin_isgreater(x, 89.0f) ? 89.0f : x;  // they let loops over vexpf vectorize
    const float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
    float t = fmaf(x, 1.44269504f, magic);
    float n = t - magic;
    float r = fmaf(n, -0.693145752f, x);
    r = fmaf(n, -1.42860677e-6f, r);
    float q = fmaf(r, 1.0f / 5040, 1.0f / 720);
    q = fmaf(q, r, 1.0f / 120);
    q = fmaf(q, r, 1.0f / 24);
    q = fmaf(q, r, 1.0f / 6);
    q = fmaf(q, r, 0.5f);
    float p = 1.0f + fmaf(r * r, q, r);
    int32_t bits;
    memcpy(&bits, &t, sizeof bits);  // t's mantissa holds 2^22 + n, so bits - bits(magic) = n
    int32_t ni = bits - 0x4B400000, h = ni / 2;  // n in [-150, 128]: h and n - h in [-75, 64]
    uint32_t e1 = (uint32_t)(h + 127) << 23, e2 = (uint32_t)(ni - h + 127) << 23;  // unsigned: NaN's garbage n wraps
    float s1, s2;
    memcpy(&s1, &e1, sizeof s1);
    memcpy(&s2, &e2, sizeof s2);
    return p * s1 * s2;
}

// ---- vexpf on vector registers, for the exponential loops of kernels.inc ----------------
// A variant that defines EXPV (16: the AVX-512 file, 8: the AVX2 file) before including this
// header gets vexpv, vexpf on EXPV lanes: the same float operations in the same order, so the
// same bits (test_cpu_variants checks every variant's loops against vexpf element by element),
// in fewer instructions than the compiler's vectorization of vexpf. The clamps are max/min
// instructions, which return their second operand, x, when either is NaN (GCC will not use
// them for vexpf's selects without -ffinite-math-only); p * 2^n is one vscalefps on AVX-512
// (rounded once, as p * 2^h * 2^(n-h) is), on AVX2 those two multiplies with h = n >> 1.
// SwiGLU's forward over 2048 x 688 floats, 1 thread, this project's AMD EPYC (Zen 4),
// 2026-11-26: AVX-512 0.649 ms with vexpf, 0.445 with vexpv (about half the instructions);
// the AVX2 variant 0.97 against 0.83 (its backward 1.29 against 1.18).
// Beside it, the few vector operations the loops need, at the same width: loads and stores of
// m <= EXPV lanes (masked when m < EXPV: a row's tail) and the row sums' 8 double lanes.
#ifdef EXPV
#include <immintrin.h>
#if EXPV == 16
#define VP(name) _mm512_##name  // the width's intrinsics, for the operations common to both
typedef __m512 vf;       // EXPV floats
typedef __m512d vlanes;  // the 8 double lanes of kernels.inc's row sums
static inline __mmask16 vmask_n(int m) { return (__mmask16)((1u << m) - 1); }
static inline vf vload_m(const float *p, int m) { return m == 16 ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(vmask_n(m), p); }
static inline void vstore_m(float *p, int m, vf v) {
    if (m == 16) _mm512_storeu_ps(p, v);
    else _mm512_mask_storeu_ps(p, vmask_n(m), v);
}
static inline void vstream(float *p, vf v) { _mm512_stream_ps(p, v); }  // p 64-byte aligned
static inline vf vload_fill(const float *p, int m, vf fill) { return _mm512_mask_loadu_ps(fill, vmask_n(m), p); }
static inline float vmax_all(vf v) { return _mm512_reduce_max_ps(v); }  // v without NaN
static inline vf vpow2_mul(vf p, vf n) { return _mm512_scalef_ps(p, n); }  // p * 2^n, n integral
static inline vlanes vlanes_zero(void) { return _mm512_setzero_pd(); }
static inline vlanes vlanes_add(vlanes l, vf e) {  // e's 16 floats, two rounds of the 8 lanes
    l = _mm512_add_pd(l, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
    return _mm512_add_pd(l, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
}
static inline void vlanes_store(double *lane, vlanes l) { _mm512_storeu_pd(lane, l); }
// l += a * b (* e unless e is NULL), each float widened and the product taken in double, over the
// 16 lanes' two rounds in order (the low 8 then the high 8), as the row helpers' scalar loop.
static inline vlanes vlanes_add_prod(vlanes l, const float *a, const float *b, const float *e) {
    for (int h = 0; h < 16; h += 8) {
        __m512d p = _mm512_mul_pd(_mm512_cvtps_pd(_mm256_loadu_ps(a + h)), _mm512_cvtps_pd(_mm256_loadu_ps(b + h)));
        if (e) p = _mm512_mul_pd(p, _mm512_cvtps_pd(_mm256_loadu_ps(e + h)));
        l = _mm512_add_pd(l, p);
    }
    return l;
}
#elif EXPV == 8
#define VP(name) _mm256_##name
typedef __m256 vf;
typedef struct { __m256d lo, hi; } vlanes;
static inline __m256i vmask_n(int m) { return _mm256_cmpgt_epi32(_mm256_set1_epi32(m), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)); }
static inline vf vload_m(const float *p, int m) { return m == 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, vmask_n(m)); }
static inline void vstore_m(float *p, int m, vf v) {
    if (m == 8) _mm256_storeu_ps(p, v);
    else _mm256_maskstore_ps(p, vmask_n(m), v);
}
static inline void vstream(float *p, vf v) { _mm256_stream_ps(p, v); }  // p 32-byte aligned
static inline vf vload_fill(const float *p, int m, vf fill) {  // m < 8 lanes of p, fill in the rest
    const __m256i k = vmask_n(m);
    return _mm256_blendv_ps(fill, _mm256_maskload_ps(p, k), _mm256_castsi256_ps(k));
}
static inline float vmax_all(vf v) {  // v without NaN
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps(h, h, 1)));
}
static inline vf vpow2_mul(vf p, vf n) {  // p * 2^n, n integral in [-150, 128]: as vexpf does
    const __m256i ni = _mm256_cvttps_epi32(n), h = _mm256_srai_epi32(ni, 1), bias = _mm256_set1_epi32(127);
    const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(h, bias), 23));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, h), bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}
static inline vlanes vlanes_zero(void) { return (vlanes){_mm256_setzero_pd(), _mm256_setzero_pd()}; }
static inline vlanes vlanes_add(vlanes l, vf e) {  // e's 8 floats, one round of the 8 lanes
    l.lo = _mm256_add_pd(l.lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    l.hi = _mm256_add_pd(l.hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    return l;
}
static inline void vlanes_store(double *lane, vlanes l) { _mm256_storeu_pd(lane, l.lo), _mm256_storeu_pd(lane + 4, l.hi); }
static inline __m256d vprod4(const float *a, const float *b, const float *e) {  // 4 lanes of vlanes_add_prod
    __m256d p = _mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(a)), _mm256_cvtps_pd(_mm_loadu_ps(b)));
    return e ? _mm256_mul_pd(p, _mm256_cvtps_pd(_mm_loadu_ps(e))) : p;
}
static inline vlanes vlanes_add_prod(vlanes l, const float *a, const float *b, const float *e) {  // one round
    l.lo = _mm256_add_pd(l.lo, vprod4(a, b, e));
    l.hi = _mm256_add_pd(l.hi, vprod4(a + 4, b + 4, e ? e + 4 : NULL));
    return l;
}
#else
#error "EXPV: 16 (AVX-512) or 8 (AVX2)"
#endif
// The arithmetic, the same at both widths.
static inline vf vset(float a) { return VP(set1_ps)(a); }
static inline vf vadd(vf a, vf b) { return VP(add_ps)(a, b); }
static inline vf vsub(vf a, vf b) { return VP(sub_ps)(a, b); }
static inline vf vmul(vf a, vf b) { return VP(mul_ps)(a, b); }
static inline vf vdiv(vf a, vf b) { return VP(div_ps)(a, b); }
static inline vf vneg(vf a) { return VP(xor_ps)(a, VP(set1_ps)(-0.0f)); }
static inline vf vmaxf(vf a, vf b) { return VP(max_ps)(a, b); }
static inline vf vminf(vf a, vf b) { return VP(min_ps)(a, b); }
static inline vf vfma(vf a, vf b, vf c) { return VP(fmadd_ps)(a, b, c); }

static inline vf vexpv(vf x) {
    x = vmaxf(vset(-104.0f), x);
    x = vminf(vset(89.0f), x);
    const vf magic = vset(12582912.0f);
    const vf t = vfma(x, vset(1.44269504f), magic);
    const vf n = vsub(t, magic);
    vf r = vfma(n, vset(-0.693145752f), x);
    r = vfma(n, vset(-1.42860677e-6f), r);
    vf q = vfma(r, vset(1.0f / 5040), vset(1.0f / 720));
    q = vfma(q, r, vset(1.0f / 120));
    q = vfma(q, r, vset(1.0f / 24));
    q = vfma(q, r, vset(1.0f / 6));
    q = vfma(q, r, vset(0.5f));
    const vf p = vadd(vset(1.0f), vfma(vmul(r, r), q, r));
    return vpow2_mul(p, n);
}
#endif
