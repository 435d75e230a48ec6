/* The repacked integer GEMM on AVX2 (gemm_traits.h has the contracts; ref/gemm_ref.c the
 * references): the maddubs micro-kernel for the types whose bytes it takes (maddubs_max), the
 * AVX-VNNI one for all, and the activation quantizer. Both micro-kernels give the reference's
 * floats bit for bit. */
#include <string.h>

#include "kernels/gemm_traits.h"

#if K_GEMM_X86
#include "kernels/x86/simd.h"

/* A sub-block's int32 sums of 16 rows (two vectors) x NA activation rows into the fp32 sums, with
 * k_qgemm_micro_16x8_ref's operations in its order: acc += (i * s) * d_x + m * (d_x * sum x_q). */
K_TARGET_AVX2 static inline __attribute__((always_inline)) void
sub_scale2(const int NA, __m256 fa[][2], __m256i ia[][2], const float *s, const float *m,
           const float *xd, int nb32, const float *xs, int nsb) {
    for (int h = 0; h < 2; h++) {
        __m256 sv = _mm256_loadu_ps(s + 8 * h), mv = _mm256_loadu_ps(m + 8 * h);
        for (int a = 0; a < NA; a++) {
            __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(ia[a][h]), sv);
            fa[a][h] = _mm256_fmadd_ps(t, _mm256_set1_ps(xd[a * nb32]), fa[a][h]);
            fa[a][h] = _mm256_fmadd_ps(mv, _mm256_set1_ps(xs[a * nsb]), fa[a][h]);
        }
    }
}

/* 16 weight rows (two vectors of 8) x NA activation rows: per 4 columns, maddubs of the packed
 * bytes by the activation's 4 bytes broadcast, the int16 pairs added up over G such steps (as many
 * as stay below 32768: G * 2 * wmax * 127), then widened to int32 by madd; per sub-block, the
 * reference's fp32 steps. The integers are exact, so the results are the reference's. */
K_TARGET_AVX2 static inline __attribute__((always_inline)) void
micro_16x3_maddubs(const int NA, const int SUB, const int G, int n, const uint8_t *q,
                   const float *s, const float *m, const int8_t *xq, const float *xd,
                   const float *xs, float *out) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 fa[3][2];
    const int nsb = n / SUB, nb32 = n / 32;
    for (int a = 0; a < NA; a++) fa[a][0] = fa[a][1] = _mm256_setzero_ps();
    for (int b = 0; b < nsb; b++) {
        __m256i ia[3][2];
        const uint8_t *qb = q + (size_t)b * SUB * K_QG_ROWS;
        const int8_t *xb = xq + (size_t)b * SUB;
        for (int k0 = 0; k0 < SUB / 4; k0 += G) {
            __m256i h16[3][2];
            for (int a = 0; a < NA; a++) h16[a][0] = h16[a][1] = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int k4 = k0; k4 < k0 + G; k4++) {
                const uint8_t *qk = qb + k4 * 4 * K_QG_ROWS;
                __m256i w0 = _mm256_loadu_si256((const __m256i *)(const void *)qk);
                __m256i w1 = _mm256_loadu_si256((const __m256i *)(const void *)(qk + 32));
                for (int a = 0; a < NA; a++) {
                    int32_t xv;
                    memcpy(&xv, xb + (size_t)a * n + 4 * k4, 4);
                    __m256i xb4 = _mm256_set1_epi32(xv);
                    h16[a][0] = _mm256_add_epi16(h16[a][0], _mm256_maddubs_epi16(w0, xb4));
                    h16[a][1] = _mm256_add_epi16(h16[a][1], _mm256_maddubs_epi16(w1, xb4));
                }
            }
            for (int a = 0; a < NA; a++)
                for (int h = 0; h < 2; h++) {
                    __m256i v = _mm256_madd_epi16(h16[a][h], ones);
                    ia[a][h] = k0 ? _mm256_add_epi32(ia[a][h], v) : v;
                }
        }
        sub_scale2(NA, fa, ia, s + b * K_QG_ROWS, m + b * K_QG_ROWS, xd + b * SUB / 32, nb32,
                   xs + b, nsb);
    }
    for (int a = 0; a < NA; a++)
        for (int h = 0; h < 2; h++) _mm256_storeu_ps(out + a * K_QG_ROWS + 8 * h, fa[a][h]);
}

/* k_qgemm_quantize with AVX2, the same results (as k_qgemm_quantize_avx512). */
K_TARGET_AVX2 void k_qgemm_quantize_avx2(const float *x, int n, int sub, int8_t *q, float *d,
                                         float *ds) {
    for (int b = 0; b < n / 32; b++, x += 32, q += 32) {
        __m256i qi[4];
        float dd = k_q8_block_avx2(x, q, qi) / 127.0f;
        d[b] = dd;
        __m256i s0 = _mm256_add_epi32(qi[0], qi[1]), s1 = _mm256_add_epi32(qi[2], qi[3]);
        if (sub == 32) {
            ds[b] = dd * (float)k_hsum8i(_mm256_add_epi32(s0, s1));
        } else {
            ds[2 * b] = dd * (float)k_hsum8i(s0);
            ds[2 * b + 1] = dd * (float)k_hsum8i(s1);
        }
    }
}

/* With AVX-VNNI: vpdpbusd on 8 rows' 4 bytes at a time into int32 directly (no int16 step, so any
 * type's bytes, Q8_0's and IQ4's up to 255 too), NA activation rows; again the reference's results.
 */
K_TARGET_AVXVNNI static inline __attribute__((always_inline)) void
micro_16x3_vnni(const int NA, const int SUB, int n, const uint8_t *q, const float *s,
                const float *m, const int8_t *xq, const float *xd, const float *xs, float *out) {
    __m256 fa[3][2];
    const int nsb = n / SUB, nb32 = n / 32;
    for (int a = 0; a < NA; a++) fa[a][0] = fa[a][1] = _mm256_setzero_ps();
    for (int b = 0; b < nsb; b++) {
        __m256i ia[3][2];
        for (int a = 0; a < NA; a++) ia[a][0] = ia[a][1] = _mm256_setzero_si256();
        const uint8_t *qb = q + (size_t)b * SUB * K_QG_ROWS;
        const int8_t *xb = xq + (size_t)b * SUB;
#pragma GCC unroll 8
        for (int k4 = 0; k4 < SUB / 4; k4++) {
            const uint8_t *qk = qb + k4 * 4 * K_QG_ROWS;
            __m256i w0 = _mm256_loadu_si256((const __m256i *)(const void *)qk);
            __m256i w1 = _mm256_loadu_si256((const __m256i *)(const void *)(qk + 32));
            for (int a = 0; a < NA; a++) {
                int32_t xv;
                memcpy(&xv, xb + (size_t)a * n + 4 * k4, 4);
                __m256i xb4 = _mm256_set1_epi32(xv);
                ia[a][0] = _mm256_dpbusd_avx_epi32(ia[a][0], w0, xb4);
                ia[a][1] = _mm256_dpbusd_avx_epi32(ia[a][1], w1, xb4);
            }
        }
        sub_scale2(NA, fa, ia, s + b * K_QG_ROWS, m + b * K_QG_ROWS, xd + b * SUB / 32, nb32,
                   xs + b, nsb);
    }
    for (int a = 0; a < NA; a++)
        for (int h = 0; h < 2; h++) _mm256_storeu_ps(out + a * K_QG_ROWS + 8 * h, fa[a][h]);
}

/* Activation rows three at a time (each weight vector loaded once for the three; with more the
 * accumulators would not fit AVX2's 16 registers). */
#define VNNI_ROWS(SUB)                                                                             \
    do {                                                                                           \
        int a = 0;                                                                                 \
        for (; a + 3 <= na; a += 3)                                                                \
            micro_16x3_vnni(3, SUB, n, q, s, m, xq + (size_t)a * n, xd + a * (n / 32),             \
                            xs + a * (n / SUB), out + a * K_QG_ROWS);                              \
        if (na - a == 2)                                                                           \
            micro_16x3_vnni(2, SUB, n, q, s, m, xq + (size_t)a * n, xd + a * (n / 32),             \
                            xs + a * (n / SUB), out + a * K_QG_ROWS);                              \
        else if (na - a == 1)                                                                      \
            micro_16x3_vnni(1, SUB, n, q, s, m, xq + (size_t)a * n, xd + a * (n / 32),             \
                            xs + a * (n / SUB), out + a * K_QG_ROWS);                              \
    } while (0)

K_TARGET_AVXVNNI void k_qgemm_micro_16x3_avxvnni(const k_gemm_ops *ops, int n, const uint8_t *q,
                                                 const float *s, const float *m, const int8_t *xq,
                                                 const float *xd, const float *xs, int na,
                                                 float *out) {
    if (ops->sub == 32)
        VNNI_ROWS(32);
    else
        VNNI_ROWS(16);
}

/* The maddubs kernel's rows, as VNNI_ROWS. */
#define MADDUBS_ROWS(SUB, G)                                                                       \
    do {                                                                                           \
        int a = 0;                                                                                 \
        for (; a + 3 <= na; a += 3)                                                                \
            micro_16x3_maddubs(3, SUB, G, n, q, s, m, xq + (size_t)a * n, xd + a * (n / 32),       \
                               xs + a * (n / SUB), out + a * K_QG_ROWS);                           \
        if (na - a == 2)                                                                           \
            micro_16x3_maddubs(2, SUB, G, n, q, s, m, xq + (size_t)a * n, xd + a * (n / 32),       \
                               xs + a * (n / SUB), out + a * K_QG_ROWS);                           \
        else if (na - a == 1)                                                                      \
            micro_16x3_maddubs(1, SUB, G, n, q, s, m, xq + (size_t)a * n, xd + a * (n / 32),       \
                               xs + a * (n / SUB), out + a * K_QG_ROWS);                           \
    } while (0)

K_TARGET_AVX2 void k_qgemm_micro_16x3_avx2(const k_gemm_ops *ops, int n, const uint8_t *q,
                                           const float *s, const float *m, const int8_t *xq,
                                           const float *xd, const float *xs, int na, float *out) {
    int wmax = ops->maddubs_max;
    if (ops->sub == 32) {
        if (wmax <= 15)
            MADDUBS_ROWS(32, 8);
        else
            MADDUBS_ROWS(32, 4);
    } else {
        if (wmax <= 31)
            MADDUBS_ROWS(16, 4);
        else
            MADDUBS_ROWS(16, 2);
    }
}

#endif
