/* Vectorizable elementwise math: the compiler turns loops over these into SIMD code, which libm's
 * scalar expf/erff/tanhf calls prevent. Accuracy is within 3e-7 relative (exp) or 1e-6
 * absolute (erf), well inside what training and the parity tests need. */
#ifndef TLM_FASTMATH_H
#define TLM_FASTMATH_H

#include <stdint.h>
#include <string.h>

/* e^x for x in [-87, 88] (no NaN): x = n ln2 + r with |r| <= ln2/2, e^r by a degree-6 Taylor
 * polynomial, 2^n by building the exponent bits. */
static inline float k_exp_in_range(float x) {
    float n = __builtin_rintf(x * 1.44269504088896341f);
    float r = x - n * 0.693145751953125f;
    r = r - n * 1.428606765330187045e-06f;
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    return p * scale;
}

/* e^x. Inputs are clamped to the float range (underflow gives 0 via the clamp). NaN must come out
 * as NaN (training detects divergence by it), but must not reach the float-to-int conversion,
 * where it would be undefined. */
static inline float k_expf(float in) {
    float x = in == in ? in : 0.0f;
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    float e = k_exp_in_range(x);
    return in == in ? e : in;
}

/* e^x for x <= 0, the same bits as k_expf there, without its NaN and overflow handling: a NaN
 * gives some finite value (callers carry NaN through other terms). Without those selects the
 * loops that use it vectorize into about half the instructions (the GELU gradient). */
static inline float k_expf_nonpos(float x) {
    return k_exp_in_range(x > -87.0f ? x : -87.0f); /* a NaN becomes -87 */
}

/* f rounded to bf16 (nearest even), as vcvtne2ps2bf16 does it: NaNs stay (quiet) NaNs, denormal
 * inputs become zeros. Branch-free so that loops of it vectorize (softmaxes that write their
 * probabilities for bf16 products as well). */
static inline uint16_t k_bf16_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    r = (u & 0x7f800000u) ? r : (u >> 16) & 0x8000u;
    r = (u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : r;
    return (uint16_t)r;
}

/* p[0..n) = softmax(p[0..n)) given its maximum mx: inference attention's rows (session.c,
 * attend_row.c), vectorized under OpenMP simd (libm's scalar expf took 9% of a 15M prompt). */
static inline void k_softmax_row(float *p, int n, float mx) {
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < n; j++) {
        p[j] = k_expf(p[j] - mx);
        sum += p[j];
    }
    float inv = 1.0f / sum;
#pragma omp simd
    for (int j = 0; j < n; j++) p[j] *= inv;
}

static inline float k_sigmoidf(float x) { return 1.0f / (1.0f + k_expf(-x)); }

/* tanh(x), within 1e-6 relative: an odd Taylor polynomial below |x| 0.3, where (1 - e) / (1 + e)
 * with e = exp(-2|x|) would cancel, that quotient above (at most a bit lost there). Both sides are
 * computed and one selected, so that loops of it vectorize; NaN stays NaN. */
static inline float k_tanhf(float x) {
    float a = __builtin_fabsf(x), x2 = x * x;
    float p = 21844.0f / 6081075.0f;
    p = p * x2 - 1382.0f / 155925.0f;
    p = p * x2 + 62.0f / 2835.0f;
    p = p * x2 - 17.0f / 315.0f;
    p = p * x2 + 2.0f / 15.0f;
    p = p * x2 - 1.0f / 3.0f;
    float small = x + x * x2 * p;
    float e = k_expf_nonpos(-2.0f * (a < 44.0f ? a : 44.0f));
    float big = __builtin_copysignf((1.0f - e) / (1.0f + e), x);
    return a < 0.3f ? small : x == x ? big : x;
}

/* p[0..n) = cap tanh(p / cap): soft-capped attention scores (Gemma 2), cap > 0. */
static inline void k_softcap_row(float *p, int n, float cap) {
    float inv = 1.0f / cap;
#pragma omp simd
    for (int j = 0; j < n; j++) p[j] = cap * k_tanhf(p[j] * inv);
}

/* erf(a) for a >= 0 by Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7), given e = exp(-a*a):
 * callers that need that exponential anyway (the GELU gradient) pass theirs and save one. */
static inline float k_erff_abs_given_exp(float a, float e) {
    float t = 1.0f / (1.0f + 0.3275911f * a);
    float y = ((((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t +
               0.254829592f) *
              t;
    return 1.0f - y * e;
}

/* erf(x), odd-extended, given e = exp(-x*x). */
static inline float k_erff_given_exp(float x, float e) {
    float r = k_erff_abs_given_exp(x < 0.0f ? -x : x, e);
    return x < 0.0f ? -r : r;
}

static inline float k_erff(float x) { return k_erff_given_exp(x, k_expf(-x * x)); }

#endif
