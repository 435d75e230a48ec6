/* The AVX2 kernels' block terms that both the one-row (vec_dot_avx2.c) and the four-row
 * (vec_dot4_avx2.c) kernels take, so that a row's sums are the same operations in both. */
#ifndef TLM_KERNELS_X86_VEC_DOT_AVX2_H
#define TLM_KERNELS_X86_VEC_DOT_AVX2_H

#include "kernels/x86/vec_dot_x86.h"

#if defined(__x86_64__) || defined(__i386__)

/* The byte shuffle's index pair that copies int16 lane j (j < 8) of a 128-bit half. */
static inline short lane16(int j) { return (short)(0x0100 * (2 * j + 1) + 2 * j); }

K_TARGET_AVX2 static inline K_ALWAYS_INLINE __m256 load8_f32_f16(const uint8_t *w, int f16, int i) {
    return f16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 2 * (size_t)i)))
               : _mm256_loadu_ps((const float *)(const void *)w + i);
}

/* IQ4_XS: a sub-block (IQ4_NL's 32 values) per vector, its levels' magnitudes against the
 * activation with the levels' signs, in int16 pairs, then its scale as an int16 madd. */
K_TARGET_AVX2 static inline K_ALWAYS_INLINE float
iq4xs_block_avx2(const uint8_t *wb, const k_block_q8_k *x, __m256i T) {
    __m256i isum = _mm256_setzero_si256();
    for (int j = 0; j < 8; j++) {
        __m256i v = _mm256_shuffle_epi8(T, nibbles32(wb + 8 + 16 * j));
        __m256i a = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * j));
        __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(v, v), _mm256_sign_epi8(a, v));
        isum = _mm256_add_epi32(
            isum, _mm256_madd_epi16(p, _mm256_set1_epi16((short)(core_iq4xs_scale(j, wb) - 32))));
    }
    return load_f16(wb) * x->d * (float)k_hsum8i(isum);
}

/* Sub-blocks 2g (low nibbles, fifth bit 2g of qh) and 2g + 1 (high nibbles, bit 2g + 1). */
K_TARGET_AVX2 static inline void q45k_group(const uint8_t *q, const uint8_t *qh, int g, __m256i *lo,
                                            __m256i *hi) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    __m256i v = _mm256_loadu_si256((const __m256i *)q);
    *lo = _mm256_and_si256(v, m4);
    *hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    if (qh) {
        __m256i h = _mm256_loadu_si256((const __m256i *)qh);
        __m256i h0 = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(2 * g)), one);
        __m256i h1 = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(2 * g + 1)), one);
        *lo = _mm256_or_si256(*lo, _mm256_slli_epi16(h0, 4));
        *hi = _mm256_or_si256(*hi, _mm256_slli_epi16(h1, 4));
    }
}

/* The four 32-element runs of one 128-element half: q1..q4 of the format (0..63, offset 32 not
 * yet taken off). */
K_TARGET_AVX2 static inline void q6k_half(const uint8_t *ql, const uint8_t *qh, __m256i q[4]) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
    __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
    __m256i h = _mm256_loadu_si256((const __m256i *)qh);
    /* bits 2v, 2v + 1 of each byte of h moved to bits 4, 5 of the same byte: the 16-bit shifts
     * carry bits across the byte boundary, but the mask keeps only the byte's own */
    q[0] =
        _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(h, 4), m30));
    q[1] =
        _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(h, 2), m30));
    q[2] =
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(h, m30));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                           _mm256_and_si256(_mm256_srli_epi16(h, 2), m30));
}

K_TARGET_AVX2 static inline __m256i q3k_scales16_avx2(const uint8_t *p) {
    int16_t v[16];
    for (int j = 0; j < 16; j++) v[j] = (int16_t)(core_q3k_scale(j, p) - 32);
    return _mm256_loadu_si256((const __m256i *)v);
}

/* AVX2: a half's plane at a time (32 bytes, two sub-blocks). */
/* One Q2_K / Q3_K super-block's term of the sum. */
K_TARGET_AVX2 static inline K_ALWAYS_INLINE float
q23k_block_avx2(const uint8_t *wb, const k_block_q8_k *x, const int three) {
    const __m256i m3 = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
    const size_t bytes = three ? sizeof(core_block_q3_k) : sizeof(core_block_q2_k);
    __m256i bsums = _mm256_loadu_si256((const __m256i *)x->bsums), sc16, off;
    const uint8_t *qs = wb + (three ? 32 : 16);
    __m256i H = _mm256_setzero_si256();
    if (three) {
        sc16 = q3k_scales16_avx2(wb + 96);
        off = _mm256_slli_epi32(_mm256_madd_epi16(sc16, bsums), 2);
        H = _mm256_loadu_si256((const __m256i *)wb);
    } else {
        __m128i sc8 = _mm_loadu_si128((const __m128i *)wb), m4 = _mm_set1_epi8(0x0F);
        sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(sc8, m4));
        off = _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), m4)),
                                bsums);
    }
    /* each half's 8 scales in both 128-bit halves; sub-blocks k (low) and k + 1 (high) of a
     * step by one shuffle, as Q6_K's four-row kernel takes them */
    const __m256i halves[2] = {_mm256_permute2x128_si256(sc16, sc16, 0x00),
                               _mm256_permute2x128_si256(sc16, sc16, 0x11)};
    __m256i isum = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        __m256i Q = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
        for (int i = 0; i < 4; i++) {
            __m256i q = _mm256_and_si256(_mm256_srli_epi16(Q, 2 * i), m3);
            if (three) {
                __m256i bm = _mm256_set1_epi8((char)(1 << (4 * h + i)));
                __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(H, bm), bm);
                q = _mm256_add_epi8(q, _mm256_and_si256(set, four));
            }
            __m256i p = _mm256_maddubs_epi16(
                q, _mm256_loadu_si256((const __m256i *)(x->qs + 128 * h + 32 * i)));
            __m256i scv =
                _mm256_shuffle_epi8(halves[h], _mm256_set_m128i(_mm_set1_epi16(lane16(2 * i + 1)),
                                                                _mm_set1_epi16(lane16(2 * i))));
            isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, scv));
        }
    }
    float d = x->d * load_f16(wb + bytes - 2 - (three ? 0 : 2));
    if (three) return d * (float)(k_hsum8i(isum) - k_hsum8i(off));
#ifdef __clang__
    /* Clang fused one of the two products into the subtraction in the four-row kernel and not
     * in the one-row one (whose products its SLP vectorizer pairs), so that their sums differed
     * in the last bit (test_qk_kernels); each product rounded to a float first, both agree. Its
     * -ffp-contract=fast ignores `#pragma clang fp contract`, so an empty asm holds them. */
    float a = d * (float)k_hsum8i(isum), b = x->d * load_f16(wb + bytes - 2) * (float)k_hsum8i(off);
    __asm__("" : "+x"(a), "+x"(b));
    return a - b;
#else
    return d * (float)k_hsum8i(isum) - x->d * load_f16(wb + bytes - 2) * (float)k_hsum8i(off);
#endif
}

#endif

#endif
