/* The repacked integer GEMM's AVX-512 VNNI micro-kernel and activation quantizer (gemm_traits.h
 * has their contracts; ref/gemm_ref.c their references). */
#include <string.h>

#include "kernels/gemm_traits.h"

#if K_GEMM_X86
#include "kernels/x86/simd.h"

/* 16 weight rows x NA activation rows of accumulators over the whole row: per sub-block, int32
 * dot products by vpdpbusd (unsigned weight bytes x signed activations, 4 columns per step), then
 * acc += (i * s) * d_x + m * (d_x * sum x_q) in fp32. NA and SUB are constants at each call site,
 * so the accumulator arrays live in registers. */
K_TARGET_AVX512 static inline __attribute__((always_inline)) void
micro_16x8(const int NA, const int SUB, int n, const uint8_t *q, const float *s, const float *m,
           const int8_t *xq, const float *xd, const float *xs, float *out) {
    __m512 fa[K_QG_ACTS];
    __m512i ia[K_QG_ACTS];
    const int nsb = n / SUB, nb32 = n / 32;
#pragma GCC unroll 8
    for (int a = 0; a < NA; a++) fa[a] = _mm512_setzero_ps();
    for (int b = 0; b < nsb; b++) {
#pragma GCC unroll 8
        for (int a = 0; a < NA; a++) ia[a] = _mm512_setzero_si512();
        const uint8_t *qb = q + (size_t)b * SUB * K_QG_ROWS;
        const int8_t *xb = xq + (size_t)b * SUB;
#pragma GCC unroll 8
        for (int k4 = 0; k4 < SUB / 4; k4++) {
            __m512i wv = _mm512_loadu_si512((const void *)(qb + k4 * 4 * K_QG_ROWS));
#pragma GCC unroll 8
            for (int a = 0; a < NA; a++) {
                int32_t xv;
                memcpy(&xv, xb + (size_t)a * n + 4 * k4, 4);
                ia[a] = _mm512_dpbusd_epi32(ia[a], wv, _mm512_set1_epi32(xv));
            }
        }
        __m512 sv = _mm512_loadu_ps(s + b * K_QG_ROWS), mv = _mm512_loadu_ps(m + b * K_QG_ROWS);
#pragma GCC unroll 8
        for (int a = 0; a < NA; a++) {
            __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(ia[a]), sv);
            fa[a] = _mm512_fmadd_ps(t, _mm512_set1_ps(xd[a * nb32 + b * SUB / 32]), fa[a]);
            fa[a] = _mm512_fmadd_ps(mv, _mm512_set1_ps(xs[a * nsb + b]), fa[a]);
        }
    }
#pragma GCC unroll 8
    for (int a = 0; a < NA; a++) _mm512_storeu_ps(out + a * K_QG_ROWS, fa[a]);
}

#define MICRO_CASE(NA, SUB)                                                                        \
    case NA:                                                                                       \
        micro_16x8(NA, SUB, n, q, s, m, xq, xd, xs, out);                                          \
        return;
#define MICRO_CASES(SUB)                                                                           \
    switch (na) {                                                                                  \
        MICRO_CASE(1, SUB)                                                                         \
        MICRO_CASE(2, SUB)                                                                         \
        MICRO_CASE(3, SUB)                                                                         \
        MICRO_CASE(4, SUB)                                                                         \
        MICRO_CASE(5, SUB)                                                                         \
        MICRO_CASE(6, SUB)                                                                         \
        MICRO_CASE(7, SUB)                                                                         \
        MICRO_CASE(8, SUB)                                                                         \
    default: return;                                                                               \
    }

K_TARGET_AVX512 void k_qgemm_micro_16x8_avx512vnni(const k_gemm_ops *ops, int n, const uint8_t *q,
                                                   const float *s, const float *m, const int8_t *xq,
                                                   const float *xd, const float *xs, int na,
                                                   float *out) {
    if (ops->sub == 32) {
        MICRO_CASES(32)
    } else {
        MICRO_CASES(16)
    }
}

/* k_qgemm_quantize in vectors, with the same results: the same products x * id, rounded to nearest
 * even by vcvtps2dq (the default rounding mode) as nearest_int does. */
K_TARGET_AVX512 void k_qgemm_quantize_avx512(const float *x, int n, int sub, int8_t *q, float *d,
                                             float *ds) {
    const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
    for (int b = 0; b < n / 32; b++, x += 32, q += 32) {
        __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
        float amax = _mm512_reduce_max_ps(
            _mm512_max_ps(_mm512_and_ps(v0, absmask), _mm512_and_ps(v1, absmask)));
        float dd = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
        __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, _mm512_set1_ps(id)));
        __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, _mm512_set1_ps(id)));
        _mm_storeu_si128((__m128i *)q, _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtepi32_epi8(q1));
        d[b] = dd;
        int s0 = _mm512_reduce_add_epi32(q0), s1 = _mm512_reduce_add_epi32(q1);
        if (sub == 32) {
            ds[b] = dd * (float)(s0 + s1);
        } else {
            ds[2 * b] = dd * (float)s0;
            ds[2 * b + 1] = dd * (float)s1;
        }
    }
}

#endif
