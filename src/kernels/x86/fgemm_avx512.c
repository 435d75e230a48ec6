/* F32 and F16 weights' register tiles in fp32 (gemm_traits.h has their contracts; ref/fgemm_ref.c
 * their references, equal bit for bit). */
#include <string.h>

#include "kernels/gemm_traits.h"

#if K_GEMM_X86
#include "kernels/x86/simd.h"

/* The BF16 kernel's shape in fp32: 16 activation rows interleaved by column, T tiles of them
 * against R weight rows broadcast one value at a time (F16 rows widened by the driver, once for all
 * the tiles). 24 accumulators keep both FMA pipes busy: near the FMA peak where sgemm stays well
 * below it on prompt-sized shapes (build/bench_fgemm). Each sum runs over k in order. */
K_TARGET_AVX512 static inline __attribute__((always_inline)) void
fgemm_tile(const int R, const int T, int n, const float *w, size_t ldw, const float *xt,
           size_t tile_floats, float *out, const char *pf, size_t pf_step) {
    __m512 acc[3][8];
#pragma GCC unroll 3
    for (int t = 0; t < T; t++)
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) acc[t][r] = _mm512_setzero_ps();
    for (int k = 0; k < n; k++) {
        if (pf) _mm_prefetch(pf + (size_t)k * pf_step, _MM_HINT_T0);
        __m512 xv[3];
#pragma GCC unroll 3
        for (int t = 0; t < T; t++) xv[t] = _mm512_loadu_ps(xt + t * tile_floats + (size_t)k * 16);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512 wb = _mm512_set1_ps(w[(size_t)r * ldw + k]);
#pragma GCC unroll 3
            for (int t = 0; t < T; t++) acc[t][r] = _mm512_fmadd_ps(xv[t], wb, acc[t][r]);
        }
    }
#pragma GCC unroll 3
    for (int t = 0; t < T; t++)
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) _mm512_storeu_ps(out + (t * 8 + r) * 16, acc[t][r]);
}

/* Up to 8 activation rows (batched decode): a 16-row tile would leave half of every FMA idle, so
 * each vector holds two columns of 8 rows instead, xt[p * 16 + 2a + j] = x[a][2p + j], against a
 * broadcast pair of one weight row (R <= 8 rows, one accumulator each), and each lane pair is added
 * at the end (the even columns' sum and the odd ones'). n is even. */
K_TARGET_AVX512 static inline __attribute__((always_inline)) void
fgemm_pairs(const int R, int n, const float *w, size_t ldw, const float *xt, float *out,
            const char *pf, size_t pf_step) {
    __m512 acc[8];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int p = 0; p < n / 2; p++) {
        if (pf) _mm_prefetch(pf + (size_t)p * pf_step, _MM_HINT_T0);
        __m512 xv = _mm512_loadu_ps(xt + (size_t)p * 16);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            double wv;
            memcpy(&wv, w + (size_t)r * ldw + 2 * p, 8);
            acc[r] = _mm512_fmadd_ps(xv, _mm512_castpd_ps(_mm512_set1_pd(wv)), acc[r]);
        }
    }
    /* out[r * 8 + a] = lane 2a + lane 2a+1 of acc[r] */
    const __m512i even =
        _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
#pragma GCC unroll 8
    for (int r = 0; r + 1 < R; r += 2) {
        __m512 e = _mm512_permutex2var_ps(acc[r], even, acc[r + 1]);
        __m512 o = _mm512_permutex2var_ps(acc[r], odd, acc[r + 1]);
        _mm512_storeu_ps(out + r * 8, _mm512_add_ps(e, o));
    }
    if (R % 2) {
        __m512 e = _mm512_permutexvar_ps(even, acc[R - 1]),
               o = _mm512_permutexvar_ps(odd, acc[R - 1]);
        _mm256_storeu_ps(out + (R - 1) * 8, _mm512_castps512_ps256(_mm512_add_ps(e, o)));
    }
}

#define F32P_CASE(R)                                                                               \
    case R: fgemm_pairs(R, n, w, ldw, xt, out, pf, pf_step); return;
K_TARGET_AVX512 void k_fgemm_tile_8x8_pairs_avx512(int R, int n, const float *w, size_t ldw,
                                                   const float *xt, float *out, const char *pf,
                                                   size_t pf_step) {
    switch (R) {
        F32P_CASE(1)
        F32P_CASE(2)
        F32P_CASE(3)
        F32P_CASE(4)
        F32P_CASE(5)
        F32P_CASE(6)
        F32P_CASE(7)
        F32P_CASE(8)
    default: return;
    }
}

/* Rows 0..rows-1 of x (row stride n; rows past them are zero) into dst interleaved by column,
 * dst[k * 16 + a] = x[a][k]: 16 x 16 blocks transposed in registers (k_transpose16x16), the
 * columns past the last whole block one at a time. */
K_TARGET_AVX512 void k_fgemm_interleave16_avx512(const float *x, int n, int rows, float *dst) {
    int k = 0;
    for (; k + 16 <= n; k += 16) {
        __m512i r[16];
        for (int i = 0; i < 16; i++)
            r[i] = _mm512_castps_si512(i < rows ? _mm512_loadu_ps(x + (size_t)i * n + k)
                                                : _mm512_setzero_ps());
        k_transpose16x16(r);
        for (int c = 0; c < 16; c++)
            _mm512_storeu_ps(dst + (size_t)(k + c) * 16, _mm512_castsi512_ps(r[c]));
    }
    for (; k < n; k++)
        for (int i = 0; i < 16; i++)
            dst[(size_t)k * 16 + i] = i < rows ? x[(size_t)i * n + k] : 0.0f;
}

#define F32_CASE(R)                                                                                \
    case R:                                                                                        \
        if (T == 3)                                                                                \
            fgemm_tile(R, 3, n, w, ldw, xt, tile_floats, out, pf, pf_step);                        \
        else if (T == 2)                                                                           \
            fgemm_tile(R, 2, n, w, ldw, xt, tile_floats, out, pf, pf_step);                        \
        else                                                                                       \
            fgemm_tile(R, 1, n, w, ldw, xt, tile_floats, out, pf, pf_step);                        \
        return;
K_TARGET_AVX512 void k_fgemm_tile_8x48_avx512(int R, int T, int n, const float *w, size_t ldw,
                                              const float *xt, size_t tile_floats, float *out,
                                              const char *pf, size_t pf_step) {
    switch (R) {
        F32_CASE(1)
        F32_CASE(2)
        F32_CASE(3)
        F32_CASE(4)
        F32_CASE(5)
        F32_CASE(6)
        F32_CASE(7)
        F32_CASE(8)
    default: return;
    }
}

#endif
