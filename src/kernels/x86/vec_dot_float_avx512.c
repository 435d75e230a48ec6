/* AVX-512 dot products of float weights: F16 and BF16 (vdpbf16ps) one row, F32 and F16 against
 * several activation rows, three weight rows at a time, and four-row kernels for F32, F16 and
 * BF16. */
#include "kernels/x86/vec_dot_x86.h"

#if defined(__x86_64__) || defined(__i386__)

K_TARGET_AVX512 void k_vec_dot_f16_f32_avx512(int n, float *s, const void *w, const void *xq) {
    const uint8_t *a = w;
    const float *x = xq;
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(a + 2 * i))),
                             _mm512_loadu_ps(x + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(a + 2 * i + 32))),
                             _mm512_loadu_ps(x + i + 16), s1);
    }
    for (; i < n; i += 16) {
        int left = n - i < 16 ? n - i : 16;
        __mmask16 k = (__mmask16)((1u << left) - 1u);
        __m512 wv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, a + 2 * i));
        s0 = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(k, x + i), s0);
    }
    *s = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

K_TARGET_AVX512BF16 void k_vec_dot_bf16_bf16_avx512bf16(int n, float *s, const void *w,
                                                        const void *xq) {
    const uint8_t *a = w, *x = xq;
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    int i = 0;
    for (; i + 64 <= n; i += 64) {
        s0 = _mm512_dpbf16_ps(s0, (__m512bh)_mm512_loadu_si512(a + 2 * i),
                              (__m512bh)_mm512_loadu_si512(x + 2 * i));
        s1 = _mm512_dpbf16_ps(s1, (__m512bh)_mm512_loadu_si512(a + 2 * i + 64),
                              (__m512bh)_mm512_loadu_si512(x + 2 * i + 64));
    }
    for (; i < n; i += 32) {
        int left = n - i < 32 ? n - i : 32;
        __mmask32 k = left == 32 ? 0xFFFFFFFFu : (__mmask32)((1u << left) - 1u);
        s0 = _mm512_dpbf16_ps(s0, (__m512bh)_mm512_maskz_loadu_epi16(k, a + 2 * i),
                              (__m512bh)_mm512_maskz_loadu_epi16(k, x + 2 * i));
    }
    *s = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

/* Four BF16 rows against one activation row, k_vec_dot_bf16_bf16_avx512bf16's operations per row,
 * the rows' chains interleaved and each activation vector loaded once for the four; with the
 * prefetch ahead that units of four take (spread over the loop past 256 columns on Intel's CPUs,
 * matvec.c). BF16 decode of one sequence went well past llama.cpp's with it (bench/quant/run.sh).
 */
K_TARGET_AVX512BF16 static inline K_ALWAYS_INLINE void
bf16_x4_unit_avx512bf16(int n, float *s, const void *w, size_t ws, const void *xq, const void *pf) {
    const uint8_t *x = xq;
    const uint8_t *a[4];
    __m512 s0[4], s1[4];
    for (int r = 0; r < 4; r++) {
        a[r] = (const uint8_t *)w + r * ws;
        s0[r] = s1[r] = _mm512_setzero_ps();
    }
    int i = 0;
    size_t pfo = 0, far = prefetch_far(n, ws, 0);
    for (; i + 64 <= n; i += 64) {
        prefetch_upto(pf, &pfo, 4 * 2 * (size_t)(i + 64), far);
        __m512bh x0 = (__m512bh)_mm512_loadu_si512(x + 2 * i);
        __m512bh x1 = (__m512bh)_mm512_loadu_si512(x + 2 * i + 64);
        for (int r = 0; r < 4; r++) {
            s0[r] = _mm512_dpbf16_ps(s0[r], (__m512bh)_mm512_loadu_si512(a[r] + 2 * i), x0);
            s1[r] = _mm512_dpbf16_ps(s1[r], (__m512bh)_mm512_loadu_si512(a[r] + 2 * i + 64), x1);
        }
    }
    for (; i < n; i += 32) {
        int left = n - i < 32 ? n - i : 32;
        __mmask32 k = left == 32 ? 0xFFFFFFFFu : (__mmask32)((1u << left) - 1u);
        __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(k, x + 2 * i);
        for (int r = 0; r < 4; r++)
            s0[r] =
                _mm512_dpbf16_ps(s0[r], (__m512bh)_mm512_maskz_loadu_epi16(k, a[r] + 2 * i), xv);
    }
    for (int r = 0; r < 4; r++) s[r] = _mm512_reduce_add_ps(_mm512_add_ps(s0[r], s1[r]));
}

/* One F16 row against one to four activation rows (long rows go one at a time: matvec.c's
 * one_row_from; past four rows k_matvec_parts prefetches, or k_fgemm takes them) asks for the line
 * 2 KiB ahead at each of its lines on Intel's CPUs, where the hardware alone kept one stream of
 * halves well below the core's read rate; one and several sequences decoded together gained
 * (tlm bench tg -b 1..4 on 110M and 400M F16), and 2 KiB ahead did better than 512 bytes or 1 KiB
 * and as well as 4 KiB. The bytes past the row are the next row's, or a prefetch that never
 * faults. */
#define F16_ROW_PREFETCH 2048
/* ... and the line 8 KiB ahead into L2 (prefetcht1), as the four-row kernels' prefetch_far: the L1
 * prefetch alone kept the misses in flight to what L1's fill buffers hold (tlm bench tg on 110M
 * and 400M F16; 4 and 16 KiB ahead did less well; 15M, in L3, level). */
#define F16_ROW_FAR 8192

/* F32 and F16 weights against F32 rows. One row at a time reads the matrix as one sequential
 * stream (rows are contiguous), which the hardware prefetchers follow better than four
 * interleaved streams; two accumulators per activation row keep two FMA chains per row. */
K_TARGET_AVX512 static inline K_ALWAYS_INLINE __m512 load16_f32_f16(const uint8_t *w, int f16,
                                                                    int i) {
    return f16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + 2 * (size_t)i)))
               : _mm512_loadu_ps((const float *)(const void *)w + i);
}

K_TARGET_AVX512 static inline K_ALWAYS_INLINE void float_rows_avx512(int n, const int M, float *s,
                                                                     const uint8_t *w,
                                                                     const float *x, size_t xs,
                                                                     int f16) {
    __m512 a0[K_VDOT_MAX_ROWS], a1[K_VDOT_MAX_ROWS];
    for (int m = 0; m < M; m++) a0[m] = a1[m] = _mm512_setzero_ps();
    int i = 0, pf = f16 && M <= 4 && !k_cpu()->amd;
    for (; i + 32 <= n; i += 32) {
        if (pf) {
            _mm_prefetch((const char *)w + 2 * (size_t)i + F16_ROW_PREFETCH, _MM_HINT_T0);
            _mm_prefetch((const char *)w + 2 * (size_t)i + F16_ROW_FAR, _MM_HINT_T1);
        }
        __m512 w0 = load16_f32_f16(w, f16, i), w1 = load16_f32_f16(w, f16, i + 16);
        for (int m = 0; m < M; m++) {
            a0[m] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + m * xs + i), a0[m]);
            a1[m] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + m * xs + i + 16), a1[m]);
        }
    }
    for (; i < n; i += 16) {
        int left = n - i < 16 ? n - i : 16;
        __mmask16 k = (__mmask16)((1u << left) - 1u);
        __m512 wv = f16 ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, w + 2 * (size_t)i))
                        : _mm512_maskz_loadu_ps(k, (const float *)(const void *)w + i);
        for (int m = 0; m < M; m++)
            a0[m] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(k, x + m * xs + i), a0[m]);
    }
    for (int m = 0; m < M; m++) s[m] = _mm512_reduce_add_ps(_mm512_add_ps(a0[m], a1[m]));
}

/* Four F32 rows against one activation row, float_rows_avx512's operations per row with M = 1, the
 * rows' chains interleaved (eight FMA chains instead of two), with the prefetch ahead that units of
 * four take: faster where rows sit in cache (15M F32 decode, tlm bench tg), level where memory
 * bounds them (110M). F16 takes it on short rows only (k_matvec_parts). */
K_TARGET_AVX512 static inline K_ALWAYS_INLINE void
float_x4_unit_avx512(int n, float *s, const uint8_t *w, size_t ws, const float *x, int f16) {
    __m512 a0[4], a1[4];
    for (int r = 0; r < 4; r++) a0[r] = a1[r] = _mm512_setzero_ps();
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 x0 = _mm512_loadu_ps(x + i), x1 = _mm512_loadu_ps(x + i + 16);
        for (int r = 0; r < 4; r++) {
            a0[r] = _mm512_fmadd_ps(load16_f32_f16(w + r * ws, f16, i), x0, a0[r]);
            a1[r] = _mm512_fmadd_ps(load16_f32_f16(w + r * ws, f16, i + 16), x1, a1[r]);
        }
    }
    for (; i < n; i += 16) {
        int left = n - i < 16 ? n - i : 16;
        __mmask16 k = (__mmask16)((1u << left) - 1u);
        __m512 xv = _mm512_maskz_loadu_ps(k, x + i);
        for (int r = 0; r < 4; r++) {
            const uint8_t *wr = w + r * ws;
            __m512 wv = f16 ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, wr + 2 * (size_t)i))
                            : _mm512_maskz_loadu_ps(k, (const float *)(const void *)wr + i);
            a0[r] = _mm512_fmadd_ps(wv, xv, a0[r]);
        }
    }
    for (int r = 0; r < 4; r++) s[r] = _mm512_reduce_add_ps(_mm512_add_ps(a0[r], a1[r]));
}
/* pf is ignored: k_matvec_parts prefetches float rows all at once (k_vdot_w4_fn). */
K_TARGET_AVX512 static inline K_ALWAYS_INLINE void
f32_x4_unit_avx512(int n, float *s, const void *w, size_t ws, const void *xq, const void *pf) {
    (void)pf;
    float_x4_unit_avx512(n, s, w, ws, (const float *)xq, 0);
}
K_TARGET_AVX512 static inline K_ALWAYS_INLINE void
f16_x4_unit_avx512(int n, float *s, const void *w, size_t ws, const void *xq, const void *pf) {
    (void)pf;
    float_x4_unit_avx512(n, s, w, ws, (const float *)xq, 1);
}

#define F32_ROWS(n, M, s, w, xq, xs) float_rows_avx512(n, M, s, w, xq, xs, 0)
#define F16_ROWS(n, M, s, w, xq, xs) float_rows_avx512(n, M, s, w, xq, xs, 1)
K_TARGET_AVX512 void k_vec_dot_f32_f32_m8_avx512(int n, int M, float *s, const void *w,
                                                 const void *xq, size_t xstride) {
    ROWS_SWITCH(F32_ROWS, n, M, s, (const uint8_t *)w, (const float *)xq, xstride / sizeof(float));
}
K_TARGET_AVX512 void k_vec_dot_f16_f32_m8_avx512(int n, int M, float *s, const void *w,
                                                 const void *xq, size_t xstride) {
    ROWS_SWITCH(F16_ROWS, n, M, s, (const uint8_t *)w, (const float *)xq, xstride / sizeof(float));
}

/* Three weight rows at once, in float_rows_avx512's order of sums for every (row, activation row)
 * pair: 24 accumulators for four activation rows, each activation vector loaded once for the three.
 */
K_TARGET_AVX512 static inline K_ALWAYS_INLINE void float_x3_rows_avx512(int n, const int M,
                                                                        float *s, const uint8_t *w,
                                                                        size_t ws, const float *x,
                                                                        size_t xs, int f16) {
    __m512 a0[3][K_VDOT3_MAX_ROWS], a1[3][K_VDOT3_MAX_ROWS];
    for (int r = 0; r < 3; r++)
        for (int m = 0; m < M; m++) a0[r][m] = a1[r][m] = _mm512_setzero_ps();
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        /* a half (16 columns) at a time: 3 weight vectors and one activation vector live beside
         * the 24 sums, which leaves the compiler no reason to reload activations per row */
        __m512 wv[3];
        for (int r = 0; r < 3; r++) wv[r] = load16_f32_f16(w + r * ws, f16, i);
        for (int m = 0; m < M; m++) {
            __m512 xv = _mm512_loadu_ps(x + m * xs + i);
            for (int r = 0; r < 3; r++) a0[r][m] = _mm512_fmadd_ps(wv[r], xv, a0[r][m]);
        }
        for (int r = 0; r < 3; r++) wv[r] = load16_f32_f16(w + r * ws, f16, i + 16);
        for (int m = 0; m < M; m++) {
            __m512 xv = _mm512_loadu_ps(x + m * xs + i + 16);
            for (int r = 0; r < 3; r++) a1[r][m] = _mm512_fmadd_ps(wv[r], xv, a1[r][m]);
        }
    }
    for (; i < n; i += 16) {
        int left = n - i < 16 ? n - i : 16;
        __mmask16 k = (__mmask16)((1u << left) - 1u);
        for (int r = 0; r < 3; r++) {
            const uint8_t *wr = w + r * ws;
            __m512 wv = f16 ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, wr + 2 * (size_t)i))
                            : _mm512_maskz_loadu_ps(k, (const float *)(const void *)wr + i);
            for (int m = 0; m < M; m++)
                a0[r][m] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(k, x + m * xs + i), a0[r][m]);
        }
    }
    for (int r = 0; r < 3; r++)
        for (int m = 0; m < M; m++)
            s[r * M + m] = _mm512_reduce_add_ps(_mm512_add_ps(a0[r][m], a1[r][m]));
}

#define FLOAT_X3_ROWS_SWITCH(n, M, s, w, ws, x, xs, f16)                                           \
    switch (M) {                                                                                   \
    case 1: float_x3_rows_avx512(n, 1, s, w, ws, x, xs, f16); break;                               \
    case 2: float_x3_rows_avx512(n, 2, s, w, ws, x, xs, f16); break;                               \
    case 3: float_x3_rows_avx512(n, 3, s, w, ws, x, xs, f16); break;                               \
    default: float_x3_rows_avx512(n, 4, s, w, ws, x, xs, f16); break;                              \
    }
K_TARGET_AVX512 void k_vec_dot_f32_f32_x3m4_avx512(int n, int M, float *s, const void *w, size_t ws,
                                                   const void *xq, size_t xstride) {
    FLOAT_X3_ROWS_SWITCH(n, M, s, (const uint8_t *)w, ws, (const float *)xq,
                         xstride / sizeof(float), 0);
}
K_TARGET_AVX512 void k_vec_dot_f16_f32_x3m4_avx512(int n, int M, float *s, const void *w, size_t ws,
                                                   const void *xq, size_t xstride) {
    FLOAT_X3_ROWS_SWITCH(n, M, s, (const uint8_t *)w, ws, (const float *)xq,
                         xstride / sizeof(float), 1);
}

X4_RUN(K_TARGET_AVX512, k_vec_dot_f32_f32_x4_avx512, f32_x4_unit_avx512)
X4_RUN(K_TARGET_AVX512, k_vec_dot_f16_f32_x4_avx512, f16_x4_unit_avx512)
X4_RUN(K_TARGET_AVX512BF16, k_vec_dot_bf16_bf16_x4_avx512bf16, bf16_x4_unit_avx512bf16)

#endif
