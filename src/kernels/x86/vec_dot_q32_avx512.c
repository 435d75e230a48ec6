/* AVX-512 VNNI dot products of the 32-element block types against Q8_0 activation rows: Q8_0,
 * Q4_0 and IQ4_NL (one row, several activation rows, four weight rows), Q4_1, Q5_0 and Q5_1 (one
 * row). */
#include "kernels/x86/vec_dot_x86.h"

#if defined(__x86_64__) || defined(__i386__)

/* Q4_1, Q5_0, Q5_1 (the fallbacks llama.cpp's K mixes pick for rows that are not whole
 * 256-blocks), one row, a block per 256-bit vector: the fifth bits come from the 32-bit mask qh
 * directly (element i is byte i of the nibbles), the min through the activation's block sum. */
K_TARGET_AVX512 static inline void dot_q4_1_q5_avx512(int n, float *s, const void *w,
                                                      const void *xq, int five, int has_min) {
    const uint8_t *wb = w;
    const core_block_q8_0 *x = xq;
    size_t bytes = five ? (has_min ? 24 : 22) : 20;
    int qs_at = (has_min ? 4 : 2) + (five ? 4 : 0);
    const __m256i ones = _mm256_set1_epi8(1), bit5 = _mm256_set1_epi8(0x10);
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < n / CORE_QK; b++, wb += bytes) {
        __m256i q = nibbles32(wb + qs_at);
        if (five) {
            uint32_t qh;
            memcpy(&qh, wb + (has_min ? 4 : 2), 4);
            q = _mm256_or_si256(q, _mm256_and_si256(_mm256_movm_epi8(qh), bit5));
        }
        __m256i a = _mm256_loadu_si256((const __m256i *)x[b].qs);
        float xd = _cvtsh_ss(x[b].d), d = load_f16(wb) * xd;
        if (has_min) {
            __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q, a);
            __m256i sa = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, a);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d), acc);
            acc =
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(sa), _mm256_set1_ps(load_f16(wb + 2) * xd), acc);
        } else {
            __m256i p = dot_i8_vnni256(_mm256_sub_epi8(q, bit5), a);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d), acc);
        }
    }
    *s = hsum8(acc);
}

K_TARGET_AVX512 void k_vec_dot_q4_1_q8_0_avx512(int n, float *s, const void *w, const void *xq) {
    dot_q4_1_q5_avx512(n, s, w, xq, 0, 1);
}
K_TARGET_AVX512 void k_vec_dot_q5_0_q8_0_avx512(int n, float *s, const void *w, const void *xq) {
    dot_q4_1_q5_avx512(n, s, w, xq, 1, 0);
}
K_TARGET_AVX512 void k_vec_dot_q5_1_q8_0_avx512(int n, float *s, const void *w, const void *xq) {
    dot_q4_1_q5_avx512(n, s, w, xq, 1, 1);
}

/* Q8_0, four blocks per step, two per 512-bit vector (lanes 0-7 hold the first block's sums,
 * 8-15 the second's), float accumulators until the end. The weight side (bytes, their absolute
 * values and signs; the four weight scales, gathered by one word permute from the row's own bytes)
 * is done once for all activation rows; the activation scales come four at a time from the row's
 * side arrays (k_act_q8_0_aux). */
K_TARGET_AVX512 static inline __m128 q8_0_scales4(const uint8_t *wb) {
    const __m512i idx = _mm512_zextsi128_si512(_mm_setr_epi16(0, 17, 34, 51, 0, 0, 0, 0));
    __m512i v = _mm512_permutex2var_epi16(_mm512_loadu_si512(wb), idx, _mm512_loadu_si512(wb + 64));
    return _mm_cvtph_ps(_mm512_castsi512_si128(v));
}

/* The blocks past the last whole group of four, one 256-bit block at a time, added to r: the
 * one- and four-row kernels' common tail (so that their sums agree bit for bit). */
K_TARGET_AVX512 static inline float q8_0_tail(float r, const uint8_t *wt, const core_block_q8_0 *x,
                                              int b, int nb) {
    for (int bt = b; bt < nb; bt++, wt += 34) {
        __m256i p = dot_i8_vnni256(_mm256_loadu_si256((const __m256i *)(wt + 2)),
                                   _mm256_loadu_si256((const __m256i *)x[bt].qs));
        r += (float)k_hsum8i(p) * (load_f16(wt) * _cvtsh_ss(x[bt].d));
    }
    return r;
}
/* Q4_0's (nl: IQ4_NL's, the nibbles looked up in its table) blocks past the last whole group. */
K_TARGET_AVX512 static inline float q4_0_tail(float r, const uint8_t *wt, const core_block_q8_0 *x,
                                              int b, int nb, const int nl) {
    const __m256i eight = _mm256_set1_epi8(8), T = _mm512_castsi512_si256(iq4nl_table(0));
    for (int bt = b; bt < nb; bt++, wt += 18) {
        __m256i v = nl ? _mm256_shuffle_epi8(T, nibbles32(wt + 2))
                       : _mm256_sub_epi8(nibbles32(wt + 2), eight);
        __m256i p = dot_i8_vnni256(v, _mm256_loadu_si256((const __m256i *)x[bt].qs));
        r += (float)k_hsum8i(p) * (load_f16(wt) * _cvtsh_ss(x[bt].d));
    }
    return r;
}

K_TARGET_AVX512 static inline K_ALWAYS_INLINE void
q8_0_rows_avx512(int n, const int M, float *s, const uint8_t *w, const uint8_t *xq, size_t xs) {
    const uint8_t *wb = w;
    int nb = n / CORE_QK, b = 0;
    size_t aux = k_act_q8_0_aux_at(n);
    const __m512i i01 = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i i23 = _mm512_add_epi32(i01, _mm512_set1_epi32(2));
    __m512 a0[K_VDOT_MAX_ROWS], a1[K_VDOT_MAX_ROWS];
    for (int m = 0; m < M; m++) a0[m] = a1[m] = _mm512_setzero_ps();
    for (; b + 4 <= nb; b += 4, wb += 4 * 34) {
        __m128 dw = q8_0_scales4(wb);
        __m512i w0 = join256(_mm256_loadu_si256((const __m256i *)(wb + 2)),
                             _mm256_loadu_si256((const __m256i *)(wb + 36)));
        __m512i w1 = join256(_mm256_loadu_si256((const __m256i *)(wb + 70)),
                             _mm256_loadu_si256((const __m256i *)(wb + 104)));
        __mmask64 n0 = _mm512_movepi8_mask(w0), n1 = _mm512_movepi8_mask(w1);
        __m512i u0 = _mm512_abs_epi8(w0), u1 = _mm512_abs_epi8(w1);
        for (int m = 0; m < M; m++) {
            const uint8_t *xm = xq + m * xs;
            const core_block_q8_0 *x = (const core_block_q8_0 *)(const void *)xm + b;
            __m128 dx = _mm_loadu_ps((const float *)(const void *)(xm + aux) + b);
            __m512 d = _mm512_castps128_ps512(_mm_mul_ps(dw, dx));
            __m512i x0 = join256(_mm256_loadu_si256((const __m256i *)x[0].qs),
                                 _mm256_loadu_si256((const __m256i *)x[1].qs));
            __m512i x1 = join256(_mm256_loadu_si256((const __m256i *)x[2].qs),
                                 _mm256_loadu_si256((const __m256i *)x[3].qs));
            x0 = _mm512_mask_sub_epi8(x0, n0, _mm512_setzero_si512(), x0);
            x1 = _mm512_mask_sub_epi8(x1, n1, _mm512_setzero_si512(), x1);
            __m512i p0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u0, x0);
            __m512i p1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u1, x1);
            a0[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p0), _mm512_permutexvar_ps(i01, d), a0[m]);
            a1[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p1), _mm512_permutexvar_ps(i23, d), a1[m]);
        }
    }
    __m512 a01[K_VDOT_MAX_ROWS];
    float sum[K_VDOT_MAX_ROWS];
    for (int m = 0; m < M; m++) a01[m] = _mm512_add_ps(a0[m], a1[m]);
    hsum16_rows(a01, M, sum);
    for (int m = 0; m < M; m++)
        s[m] = q8_0_tail(sum[m], wb, (const core_block_q8_0 *)(const void *)(xq + m * xs), b, nb);
}

/* Q4_0 by groups of four blocks (72 bytes). One word permute of two loads inside the group puts
 * the four blocks' qs bytes side by side; their low nibbles (elements 0-15 of each block) and high
 * ones (16-31) then go unsigned (0..15) straight into VNNI against the activation's matching
 * halves (k_act_q8_0_nib), the products starting from -8 times the activations' sums so that the
 * offset of 8 costs nothing per row. A 32-bit lane holds 8 products of one block, so the scale
 * product (weight scale x activation scale, four lanes each) applies per lane. The nibble
 * extraction of two blocks per vector (a lane insert, a variable shift, per pair of blocks) and
 * the per-activation-row joins it replaces cost about a third more operations. */
K_TARGET_AVX512 static inline K_ALWAYS_INLINE void q4_0_group(const uint8_t *wb, __m512 *dw,
                                                              __m512i *lo, __m512i *hi) {
    /* words 9k + 1 .. 9k + 8 hold block k's qs; block 3's come from a 16-byte load of its own
     * (nothing past the group is read: a second 64-byte load across two more cache lines made
     * 2048-column rows from memory slower, build/bench_matvec) */
    static const uint16_t iq[32] = {1,  2,  3,  4,  5,  6,  7,  8,  10, 11, 12, 13, 14, 15, 16, 17,
                                    19, 20, 21, 22, 23, 24, 25, 26, 32, 33, 34, 35, 36, 37, 38, 39};
    static const uint16_t id[16] = {0, 0, 0, 0, 9, 9, 9, 9, 18, 18, 18, 18, 27, 27, 27, 27};
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512i a = _mm512_loadu_si512(wb);
    __m512i b = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(wb + 56)));
    __m512i q = _mm512_permutex2var_epi16(a, _mm512_loadu_si512(iq), b);
    *lo = _mm512_and_si512(q, m4);
    *hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
    __m512i d = _mm512_permutexvar_epi16(
        _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)id)), a);
    *dw = _mm512_cvtph_ps(_mm512_castsi512_si256(d));
}

/* The four activation scales of a group, each over its block's four lanes. */
K_TARGET_AVX512 static inline K_ALWAYS_INLINE __m512 q4_0_dx(const float *ad) {
    const __m512i i4 = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    return _mm512_permutexvar_ps(i4, _mm512_castps128_ps512(_mm_loadu_ps(ad)));
}

/* IQ4_NL (nl): each nibble looked up as its level + 128 (an unsigned byte), the products then
 * starting from -128 times the activations' sums, 16 times Q4_0's -8. */
K_TARGET_AVX512 static inline K_ALWAYS_INLINE __m512 q4_0_dot(__m512 acc, __m512 dw, __m512i lo,
                                                              __m512i hi, const uint8_t *g,
                                                              __m512 dx, const int nl) {
    __m512i init = _mm512_loadu_si512(g + 128);
    if (nl) {
        const __m512i T = iq4nl_table(1);
        lo = _mm512_shuffle_epi8(T, lo);
        hi = _mm512_shuffle_epi8(T, hi);
        init = _mm512_slli_epi32(init, 4);
    }
    __m512i p = _mm512_dpbusd_epi32(init, lo, _mm512_loadu_si512(g));
    p = _mm512_dpbusd_epi32(p, hi, _mm512_loadu_si512(g + 64));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dw, dx), acc);
}

K_TARGET_AVX512 static inline K_ALWAYS_INLINE void q4_0_rows_avx512(int n, const int M, float *s,
                                                                    const uint8_t *w,
                                                                    const uint8_t *xq, size_t xs,
                                                                    const int nl) {
    const uint8_t *wb = w;
    int nb = n / CORE_QK, b = 0;
    size_t aux = k_act_q8_0_aux_at(n), nib = k_act_q8_0_nib_at(n);
    __m512 acc[K_VDOT_MAX_ROWS];
    for (int m = 0; m < M; m++) acc[m] = _mm512_setzero_ps();
    for (; b + 4 <= nb; b += 4, wb += 4 * 18) {
        __m512 dw;
        __m512i lo, hi;
        q4_0_group(wb, &dw, &lo, &hi);
        for (int m = 0; m < M; m++) {
            const uint8_t *xm = xq + m * xs;
            __m512 dx = q4_0_dx((const float *)(const void *)(xm + aux) + b);
            acc[m] =
                q4_0_dot(acc[m], dw, lo, hi, xm + nib + (size_t)(b / 4) * K_ACT_NIB_BYTES, dx, nl);
        }
    }
    float sum[K_VDOT_MAX_ROWS];
    hsum16_rows(acc, M, sum);
    for (int m = 0; m < M; m++)
        s[m] =
            q4_0_tail(sum[m], wb, (const core_block_q8_0 *)(const void *)(xq + m * xs), b, nb, nl);
}
#define Q4_0_ROWS(n, M, s, w, xq, xs) q4_0_rows_avx512(n, M, s, w, xq, xs, 0)
#define IQ4_NL_ROWS(n, M, s, w, xq, xs) q4_0_rows_avx512(n, M, s, w, xq, xs, 1)

/* Four Q4_0 weight rows against one activation row (decode of one sequence): Q4_0_ROWS's operations
 * per row with M = 1 (so bit for bit its sums), the activation's vectors loaded once for the four
 * and the rows' chains interleaved. */
K_TARGET_AVX512 static inline K_ALWAYS_INLINE void
q4_0_x4_unit_avx512(int n, float *s, const void *w, size_t ws, const void *xq, const void *pf,
                    const int nl) {
    const float *ad = k_act_q8_0_aux(xq, n);
    const uint8_t *g = k_act_q8_0_nib(xq, n);
    int nb = n / CORE_QK, b = 0;
    __m512 acc[4];
    for (int r = 0; r < 4; r++) acc[r] = _mm512_setzero_ps();
    size_t pfo = 0, far = prefetch_far(n, ws, !nl);
    for (; b + 4 <= nb; b += 4, g += K_ACT_NIB_BYTES) {
        prefetch_upto(pf, &pfo, 4 * 18 * (size_t)(b + 4), far);
        __m512 dx = q4_0_dx(ad + b);
        for (int r = 0; r < 4; r++) {
            __m512 dw;
            __m512i lo, hi;
            q4_0_group((const uint8_t *)w + r * ws + (size_t)b * 18, &dw, &lo, &hi);
            acc[r] = q4_0_dot(acc[r], dw, lo, hi, g, dx, nl);
        }
    }
    prefetch_upto(pf, &pfo, 4 * ws, far);
    /* Rows of whole groups (15M's 256 columns) skip the tails' set-up, which short rows from L3
     * felt (build/bench_matvec Q4_0 256 x 32000). */
    __m128 sum = hsum16x4(acc[0], acc[1], acc[2], acc[3]);
    if (b == nb) {
        _mm_storeu_ps(s, sum);
        return;
    }
    float t[4];
    _mm_storeu_ps(t, sum);
    for (int r = 0; r < 4; r++)
        s[r] = q4_0_tail(t[r], (const uint8_t *)w + r * ws + (size_t)b * 18,
                         (const core_block_q8_0 *)xq, b, nb, nl);
}

/* Four Q8_0 weight rows against one activation row (decode of one sequence): the activation's
 * blocks, scales and offsets are loaded and computed once for the four, and the four rows' fixed
 * costs (call, horizontal sums) overlap. Per row the same integer lane sums and the same float
 * operations in the same order as q8_0_rows_avx512 with M = 1, so bit for bit its sums. */
K_TARGET_AVX512 static inline K_ALWAYS_INLINE void
q8_0_x4_unit_avx512(int n, float *s, const void *wv, size_t ws, const void *xqv, const void *pf) {
    const uint8_t *w = wv;
    const core_block_q8_0 *x = xqv;
    const float *ad = k_act_q8_0_aux(xqv, n);
    int nb = n / CORE_QK, b = 0;
    const __m512i off5 = _mm512_set1_epi8((char)0x80);
    const __m512i i01 = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i i23 = _mm512_add_epi32(i01, _mm512_set1_epi32(2));
    __m512 a0[4], a1[4];
    for (int r = 0; r < 4; r++) a0[r] = a1[r] = _mm512_setzero_ps();
    size_t pfo = 0, far = prefetch_far(n, ws, 0);
    for (; b + 4 <= nb; b += 4) {
        prefetch_upto(pf, &pfo, 4 * 34 * (size_t)(b + 4), far);
        __m128 dx = _mm_loadu_ps(ad + b);
        __m512i x0 = join256(_mm256_loadu_si256((const __m256i *)x[b].qs),
                             _mm256_loadu_si256((const __m256i *)x[b + 1].qs));
        __m512i x1 = join256(_mm256_loadu_si256((const __m256i *)x[b + 2].qs),
                             _mm256_loadu_si256((const __m256i *)x[b + 3].qs));
        /* -128 sum x per lane, for weights w + 128 as unsigned bytes (a xor), where the one-row
         * kernel multiplies |w| by x negated where w < 0: the same integers, with one operation
         * per row instead of three. */
        __m512i e0 = _mm512_sub_epi32(_mm512_setzero_si512(),
                                      _mm512_dpbusd_epi32(_mm512_setzero_si512(), off5, x0));
        __m512i e1 = _mm512_sub_epi32(_mm512_setzero_si512(),
                                      _mm512_dpbusd_epi32(_mm512_setzero_si512(), off5, x1));
        for (int r = 0; r < 4; r++) {
            const uint8_t *wb = w + r * ws + (size_t)b * 34;
            __m512 d = _mm512_castps128_ps512(_mm_mul_ps(q8_0_scales4(wb), dx));
            __m512i w0 = join256(_mm256_loadu_si256((const __m256i *)(wb + 2)),
                                 _mm256_loadu_si256((const __m256i *)(wb + 36)));
            __m512i w1 = join256(_mm256_loadu_si256((const __m256i *)(wb + 70)),
                                 _mm256_loadu_si256((const __m256i *)(wb + 104)));
            __m512i p0 = _mm512_dpbusd_epi32(e0, _mm512_xor_si512(w0, off5), x0);
            __m512i p1 = _mm512_dpbusd_epi32(e1, _mm512_xor_si512(w1, off5), x1);
            a0[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p0), _mm512_permutexvar_ps(i01, d), a0[r]);
            a1[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p1), _mm512_permutexvar_ps(i23, d), a1[r]);
        }
    }
    prefetch_upto(pf, &pfo, 4 * ws, far);
    float t[4];
    _mm_storeu_ps(t, hsum16x4(_mm512_add_ps(a0[0], a1[0]), _mm512_add_ps(a0[1], a1[1]),
                              _mm512_add_ps(a0[2], a1[2]), _mm512_add_ps(a0[3], a1[3])));
    for (int r = 0; r < 4; r++) s[r] = q8_0_tail(t[r], w + r * ws + (size_t)b * 34, x, b, nb);
}

K_TARGET_AVX512 void k_vec_dot_q8_0_q8_0_avx512(int n, float *s, const void *w, const void *xq) {
    q8_0_rows_avx512(n, 1, s, w, xq, 0);
}
K_TARGET_AVX512 void k_vec_dot_q4_0_q8_0_avx512(int n, float *s, const void *w, const void *xq) {
    Q4_0_ROWS(n, 1, s, w, xq, 0);
}
K_TARGET_AVX512 void k_vec_dot_iq4_nl_q8_0_avx512(int n, float *s, const void *w, const void *xq) {
    IQ4_NL_ROWS(n, 1, s, w, xq, 0);
}

K_TARGET_AVX512 void k_vec_dot_q8_0_q8_0_m8_avx512(int n, int M, float *s, const void *w,
                                                   const void *xq, size_t xstride) {
    ROWS_SWITCH(q8_0_rows_avx512, n, M, s, (const uint8_t *)w, (const uint8_t *)xq, xstride);
}
K_TARGET_AVX512 void k_vec_dot_q4_0_q8_0_m8_avx512(int n, int M, float *s, const void *w,
                                                   const void *xq, size_t xstride) {
    ROWS_SWITCH(Q4_0_ROWS, n, M, s, (const uint8_t *)w, (const uint8_t *)xq, xstride);
}
K_TARGET_AVX512 void k_vec_dot_iq4_nl_q8_0_m8_avx512(int n, int M, float *s, const void *w,
                                                     const void *xq, size_t xstride) {
    ROWS_SWITCH(IQ4_NL_ROWS, n, M, s, (const uint8_t *)w, (const uint8_t *)xq, xstride);
}

X4_RUN(K_TARGET_AVX512, k_vec_dot_q8_0_q8_0_x4_avx512, q8_0_x4_unit_avx512)
X4_RUN_OF(K_TARGET_AVX512, k_vec_dot_q4_0_q8_0_x4_avx512, q4_0_x4_unit_avx512, 0)
X4_RUN_OF(K_TARGET_AVX512, k_vec_dot_iq4_nl_q8_0_x4_avx512, q4_0_x4_unit_avx512, 1)

#endif
