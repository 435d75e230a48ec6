/* AVX2 and AVX-VNNI four-row kernels (k_vdot_w4_fn) for CPUs without AVX-512. */
#include "kernels/x86/vec_dot_avx2.h"
#include "kernels/x86/vec_dot_x86.h"

#if defined(__x86_64__) || defined(__i386__)

/* Four weight rows against one activation row without AVX-512 (k_vdot_w4_fn): each row's sums take
 * the AVX2 one-row kernel's operations (vec_dot_avx2.c) in its order, so the same bits; what the
 * rows share is the call and the loop (one row at a time through k_matvec_parts spent a large
 * share of 15M's decode in its steps between rows), the activation's loads, scales and sums, and
 * four rows' chains overlap. The scales of Q4_K and Q6_K go into vectors by shuffles rather than
 * one by one. */

/* The 32-element types of one scale per block (Q8_0, Q4_0, IQ4_NL) four rows at a time: each
 * row's int32 lanes k_vec_dot_q8_0_q8_0_avx2's and dot_q4_0_iq4_nl_avx2's (Q4_0's nibbles as
 * unsigned bytes less 8 times x's sums per lane of four bytes, worked out once for the four rows,
 * where dot_q4_0_iq4_nl_avx2 takes 8 off each weight and multiplies by sign: the same integers lane
 * by lane). */
enum { BLOCK32_Q8_0, BLOCK32_Q4_0, BLOCK32_IQ4_NL };

K_TARGET_AVX2 static inline K_ALWAYS_INLINE void
block32_x4_unit_avx2(int n, float *s, const void *wv, size_t ws, const void *xqv, const void *pf,
                     const int kind) {
    const uint8_t *w = wv;
    const core_block_q8_0 *x = xqv;
    const size_t bb = kind == BLOCK32_Q8_0 ? 34 : 18;
    const __m256i eight = _mm256_set1_epi8(8), ones = _mm256_set1_epi16(1);
    const __m256i T =
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)core_iq4nl_values));
    __m256 acc[4];
    for (int r = 0; r < 4; r++) acc[r] = _mm256_setzero_ps();
    size_t pfo = 0, far = prefetch_far(n, ws, 0);
    for (int b = 0; b < n / CORE_QK; b++) {
        prefetch_upto(pf, &pfo, 4 * bb * (size_t)(b + 1), far);
        __m256i xv = _mm256_loadu_si256((const __m256i *)x[b].qs);
        __m256i e = kind == BLOCK32_Q4_0 ? _mm256_madd_epi16(_mm256_maddubs_epi16(eight, xv), ones)
                                         : _mm256_setzero_si256();
        float xd = _cvtsh_ss(x[b].d);
        for (int r = 0; r < 4; r++) {
            const uint8_t *wb = w + r * ws + (size_t)b * bb;
            __m256i p;
            if (kind == BLOCK32_Q8_0)
                p = dot_i8_avx2(_mm256_loadu_si256((const __m256i *)(wb + 2)), xv);
            else if (kind == BLOCK32_IQ4_NL)
                p = dot_i8_avx2(_mm256_shuffle_epi8(T, nibbles32(wb + 2)), xv);
            else
                p = _mm256_sub_epi32(
                    _mm256_madd_epi16(_mm256_maddubs_epi16(nibbles32(wb + 2), xv), ones), e);
            acc[r] =
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(load_f16(wb) * xd), acc[r]);
        }
    }
    prefetch_upto(pf, &pfo, 4 * ws, far);
    for (int r = 0; r < 4; r++) s[r] = hsum8(acc[r]);
}

/* With AVX-VNNI (the _avxvnni kernels): the same lanes by 256-bit vpdpbusd, started from the
 * activation's offset sums (Q8_0's and IQ4_NL's bytes as w + 128, less 128 times x's lane sums;
 * Q4_0's nibbles less 8 times them), so the same sums bit for bit in fewer operations. */
K_TARGET_AVXVNNI static inline K_ALWAYS_INLINE void
block32_x4_unit_avxvnni(int n, float *s, const void *wv, size_t ws, const void *xqv, const void *pf,
                        const int kind) {
    const uint8_t *w = wv;
    const core_block_q8_0 *x = xqv;
    const size_t bb = kind == BLOCK32_Q8_0 ? 34 : 18;
    const __m256i off = _mm256_set1_epi8(kind == BLOCK32_Q4_0 ? 8 : (char)0x80);
    const __m256i T = _mm256_xor_si256(
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)core_iq4nl_values)),
        _mm256_set1_epi8((char)0x80));
    __m256 acc[4];
    for (int r = 0; r < 4; r++) acc[r] = _mm256_setzero_ps();
    size_t pfo = 0, far = prefetch_far(n, ws, 0);
    for (int b = 0; b < n / CORE_QK; b++) {
        prefetch_upto(pf, &pfo, 4 * bb * (size_t)(b + 1), far);
        __m256i xv = _mm256_loadu_si256((const __m256i *)x[b].qs);
        __m256i e = _mm256_sub_epi32(_mm256_setzero_si256(),
                                     _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), off, xv));
        float xd = _cvtsh_ss(x[b].d);
        for (int r = 0; r < 4; r++) {
            const uint8_t *wb = w + r * ws + (size_t)b * bb;
            __m256i u = kind == BLOCK32_Q8_0
                            ? _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(wb + 2)),
                                               _mm256_set1_epi8((char)0x80))
                        : kind == BLOCK32_IQ4_NL ? _mm256_shuffle_epi8(T, nibbles32(wb + 2))
                                                 : nibbles32(wb + 2);
            __m256i p = _mm256_dpbusd_avx_epi32(e, u, xv);
            acc[r] =
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(load_f16(wb) * xd), acc[r]);
        }
    }
    prefetch_upto(pf, &pfo, 4 * ws, far);
    for (int r = 0; r < 4; r++) s[r] = hsum8(acc[r]);
}

/* q4k_scales_avx512 with AVX2's blend: bytes 0-7 the 8 scales, 8-15 the 8 mins. */
K_TARGET_AVX2 static inline __m128i q4k_scales_avx2(const uint8_t *wb) {
    const __m128i v = _mm_loadu_si128((const __m128i *)wb);
    const __m128i lo = _mm_shuffle_epi8(v, _mm_loadu_si128((const __m128i *)q4k_lo_b));
    const __m128i hi = _mm_shuffle_epi8(v, _mm_loadu_si128((const __m128i *)q4k_hi_b));
    __m128i low = _mm_blend_epi16(lo, _mm_srli_epi16(lo, 4), 0xC0);
    low = _mm_and_si128(low, _mm_loadu_si128((const __m128i *)q4k_keep_b));
    __m128i top = _mm_srli_epi16(_mm_and_si128(hi, _mm_set1_epi8((char)0xC0)), 2);
    return _mm_or_si128(low, top);
}

/* int16 lane j of both 128-bit halves of v in every int16 lane */
K_TARGET_AVX2 static inline K_ALWAYS_INLINE __m256i bcast16(__m256i v, int j) {
    return _mm256_shuffle_epi8(v, _mm256_set1_epi16(lane16(j)));
}

K_TARGET_AVX2 static inline K_ALWAYS_INLINE void q45k_x4_unit_avx2(int n, float *s, const void *wv,
                                                                   size_t ws, const void *xqv,
                                                                   const void *pf, const int five) {
    const uint8_t *w = wv;
    const k_block_q8_k *x = xqv;
    size_t bytes = five ? sizeof(core_block_q5_k) : sizeof(core_block_q4_k);
    __m256 acc[4];
    float accm[4] = {0};
    for (int r = 0; r < 4; r++) acc[r] = _mm256_setzero_ps();
    size_t pfo = 0, far = prefetch_far(n, ws, 0);
    for (int b = 0; b < n / CORE_QK_K; b++) {
        prefetch_upto(pf, &pfo, 4 * bytes * (size_t)(b + 1), far);
        /* the activation's sums over each sub-block of 32 (pairs of its sums of 16) */
        __m128i pairs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)x[b].bsums),
                                       _mm_loadu_si128((const __m128i *)(x[b].bsums + 8)));
        for (int r = 0; r < 4; r++) {
            const uint8_t *wb = w + r * ws + (size_t)b * bytes;
            __m128i sm = q4k_scales_avx2(wb);
            __m128i m = _mm_madd_epi16(pairs, _mm_cvtepu8_epi16(_mm_srli_si128(sm, 8)));
            m = _mm_add_epi32(m, _mm_shuffle_epi32(m, 0x4E));
            int summ = _mm_cvtsi128_si32(_mm_add_epi32(m, _mm_shuffle_epi32(m, 0xB1)));
            __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
            const uint8_t *qh = five ? wb + 16 : NULL, *q = wb + (five ? 48 : 16);
            __m256i isum = _mm256_setzero_si256();
            for (int g = 0; g < 4; g++) {
                __m256i lo, hi;
                q45k_group(q + 32 * g, qh, g, &lo, &hi);
                __m256i p0 = _mm256_maddubs_epi16(
                    lo, _mm256_loadu_si256((const __m256i *)(x[b].qs + 64 * g)));
                __m256i p1 = _mm256_maddubs_epi16(
                    hi, _mm256_loadu_si256((const __m256i *)(x[b].qs + 64 * g + 32)));
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p0, bcast16(sc, 2 * g)));
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p1, bcast16(sc, 2 * g + 1)));
            }
            float d = x[b].d * load_f16(wb);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(d), acc[r]);
            accm[r] += x[b].d * load_f16(wb + 2) * (float)summ;
        }
    }
    prefetch_upto(pf, &pfo, 4 * ws, far);
    for (int r = 0; r < 4; r++) s[r] = hsum8(acc[r]) - accm[r];
}

/* Q6_K: the 16 scales as int16 once per row and block, sub-blocks k (low half) and k + 1 (high)
 * by one shuffle each; the offset of 32 through the activation's sums in the same vector. */
K_TARGET_AVX2 static inline K_ALWAYS_INLINE void
q6k_x4_unit_avx2(int n, float *s, const void *wv, size_t ws, const void *xqv, const void *pf) {
    const uint8_t *w = wv;
    const k_block_q8_k *x = xqv;
    float acc[4] = {0};
    size_t pfo = 0, far = prefetch_far(n, ws, 0);
    for (int b = 0; b < n / CORE_QK_K; b++) {
        prefetch_upto(pf, &pfo, 4 * sizeof(core_block_q6_k) * (size_t)(b + 1), far);
        __m256i bs = _mm256_loadu_si256((const __m256i *)x[b].bsums);
        for (int r = 0; r < 4; r++) {
            const uint8_t *wb = w + r * ws + (size_t)b * sizeof(core_block_q6_k);
            __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wb + 192)));
            __m256i isum = _mm256_slli_epi32(_mm256_madd_epi16(s16, bs), 5);
            isum = _mm256_sub_epi32(_mm256_setzero_si256(), isum);
            const __m256i halves[2] = {_mm256_permute2x128_si256(s16, s16, 0x00),
                                       _mm256_permute2x128_si256(s16, s16, 0x11)};
            for (int h = 0; h < 2; h++) {
                __m256i half = halves[h], q[4];
                q6k_half(wb + 64 * h, wb + 128 + 32 * h, q);
                for (int v = 0; v < 4; v++) {
                    const int8_t *a = x[b].qs + 128 * h + 32 * v;
                    __m256i p = _mm256_maddubs_epi16(q[v], _mm256_loadu_si256((const __m256i *)a));
                    __m256i scv = _mm256_shuffle_epi8(
                        half, _mm256_set_m128i(_mm_set1_epi16(lane16(2 * v + 1)),
                                               _mm_set1_epi16(lane16(2 * v))));
                    isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, scv));
                }
            }
            acc[r] += x[b].d * load_f16(wb + 208) * (float)k_hsum8i(isum);
        }
    }
    prefetch_upto(pf, &pfo, 4 * ws, far);
    for (int r = 0; r < 4; r++) s[r] = acc[r];
}

/* F32 and F16: float_rows_avx2's sums (the rows kernel with one activation row, which is their
 * one-row product at this level) for four weight rows, the activation's vectors loaded once for the
 * four. pf is ignored, as by the AVX-512 float kernels (k_matvec_parts asks for their lines). */
K_TARGET_AVX2 static inline K_ALWAYS_INLINE void float_x4_unit_avx2(int n, float *s, const void *wv,
                                                                    size_t ws, const void *xqv,
                                                                    const void *pf, const int f16) {
    const uint8_t *w = wv;
    const float *x = xqv;
    (void)pf;
    __m256 a0[4], a1[4];
    for (int r = 0; r < 4; r++) a0[r] = a1[r] = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + 8);
        for (int r = 0; r < 4; r++) {
            const uint8_t *wr = w + r * ws;
            a0[r] = _mm256_fmadd_ps(load8_f32_f16(wr, f16, i), x0, a0[r]);
            a1[r] = _mm256_fmadd_ps(load8_f32_f16(wr, f16, i + 8), x1, a1[r]);
        }
    }
    for (int r = 0; r < 4; r++) {
        const uint8_t *wr = w + r * ws;
        float t = hsum8(_mm256_add_ps(a0[r], a1[r]));
        for (int j = i; j < n; j++) {
            float wj;
            if (f16)
                wj = load_f16(wr + 2 * (size_t)j);
            else
                memcpy(&wj, wr + 4 * (size_t)j, 4);
            t += wj * x[j];
        }
        s[r] = t;
    }
}

/* Q2_K, Q3_K and IQ4_XS: the one-row kernels' block terms (q23k_block_avx2, iq4xs_block_avx2) for
 * four rows a block at a time. */
K_TARGET_AVX2 static inline K_ALWAYS_INLINE void
kblock_x4_unit_avx2(int n, float *s, const void *wv, size_t ws, const void *xqv, const void *pf,
                    const int kind) {
    const uint8_t *w = wv;
    const k_block_q8_k *x = xqv;
    const __m256i T =
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)core_iq4nl_values));
    size_t bytes = kind == KBLOCK_Q2_K   ? sizeof(core_block_q2_k)
                   : kind == KBLOCK_Q3_K ? sizeof(core_block_q3_k)
                                         : sizeof(core_block_iq4_xs);
    float acc[4] = {0};
    size_t pfo = 0, far = prefetch_far(n, ws, 0);
    for (int b = 0; b < n / CORE_QK_K; b++) {
        prefetch_upto(pf, &pfo, 4 * bytes * (size_t)(b + 1), far);
        for (int r = 0; r < 4; r++) {
            const uint8_t *wb = w + r * ws + (size_t)b * bytes;
            acc[r] += kind == KBLOCK_IQ4_XS ? iq4xs_block_avx2(wb, &x[b], T)
                                            : q23k_block_avx2(wb, &x[b], kind == KBLOCK_Q3_K);
        }
    }
    prefetch_upto(pf, &pfo, 4 * ws, far);
    for (int r = 0; r < 4; r++) s[r] = acc[r];
}

X4_RUN_OF(K_TARGET_AVXVNNI, k_vec_dot_q8_0_q8_0_x4_avxvnni, block32_x4_unit_avxvnni, BLOCK32_Q8_0)
X4_RUN_OF(K_TARGET_AVXVNNI, k_vec_dot_q4_0_q8_0_x4_avxvnni, block32_x4_unit_avxvnni, BLOCK32_Q4_0)
X4_RUN_OF(K_TARGET_AVXVNNI, k_vec_dot_iq4_nl_q8_0_x4_avxvnni, block32_x4_unit_avxvnni,
          BLOCK32_IQ4_NL)

X4_RUN_OF(K_TARGET_AVX2, k_vec_dot_q8_0_q8_0_x4_avx2, block32_x4_unit_avx2, BLOCK32_Q8_0)
X4_RUN_OF(K_TARGET_AVX2, k_vec_dot_q4_0_q8_0_x4_avx2, block32_x4_unit_avx2, BLOCK32_Q4_0)
X4_RUN_OF(K_TARGET_AVX2, k_vec_dot_q4_K_q8_K_x4_avx2, q45k_x4_unit_avx2, 0)
X4_RUN_OF(K_TARGET_AVX2, k_vec_dot_q5_K_q8_K_x4_avx2, q45k_x4_unit_avx2, 1)
X4_RUN(K_TARGET_AVX2, k_vec_dot_q6_K_q8_K_x4_avx2, q6k_x4_unit_avx2)
X4_RUN_OF(K_TARGET_AVX2, k_vec_dot_iq4_nl_q8_0_x4_avx2, block32_x4_unit_avx2, BLOCK32_IQ4_NL)
X4_RUN_OF(K_TARGET_AVX2, k_vec_dot_f32_f32_x4_avx2, float_x4_unit_avx2, 0)
X4_RUN_OF(K_TARGET_AVX2, k_vec_dot_f16_f32_x4_avx2, float_x4_unit_avx2, 1)
X4_RUN_OF(K_TARGET_AVX2, k_vec_dot_q2_K_q8_K_x4_avx2, kblock_x4_unit_avx2, KBLOCK_Q2_K)
X4_RUN_OF(K_TARGET_AVX2, k_vec_dot_q3_K_q8_K_x4_avx2, kblock_x4_unit_avx2, KBLOCK_Q3_K)
X4_RUN_OF(K_TARGET_AVX2, k_vec_dot_iq4_xs_q8_K_x4_avx2, kblock_x4_unit_avx2, KBLOCK_IQ4_XS)

#endif
