/* AVX2 dot products: one weight row against one activation row for every type, and F32/F16 rows
 * against several activation rows (k_vdot_rows_fn). */
#include "kernels/x86/vec_dot_avx2.h"
#include "kernels/x86/vec_dot_x86.h"

#if defined(__x86_64__) || defined(__i386__)

K_TARGET_AVX2 void k_vec_dot_f16_f32_avx2(int n, float *s, const void *w, const void *xq) {
    const uint8_t *a = w;
    const float *x = xq;
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + 2 * i))),
                             _mm256_loadu_ps(x + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + 2 * i + 16))),
                             _mm256_loadu_ps(x + i + 8), s1);
    }
    float r = hsum8(_mm256_add_ps(s0, s1));
    for (; i < n; i++) r += load_f16(a + 2 * i) * x[i];
    *s = r;
}

K_TARGET_AVX2 void k_vec_dot_bf16_bf16_avx2(int n, float *s, const void *w, const void *xq) {
    const uint8_t *a = w, *x = xq;
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(load_bf16x8(a + 2 * i), load_bf16x8(x + 2 * i), s0);
        s1 = _mm256_fmadd_ps(load_bf16x8(a + 2 * i + 16), load_bf16x8(x + 2 * i + 16), s1);
    }
    float r = hsum8(_mm256_add_ps(s0, s1));
    for (; i < n; i++) {
        uint16_t p, q;
        memcpy(&p, a + 2 * i, 2);
        memcpy(&q, x + 2 * i, 2);
        uint32_t up = (uint32_t)p << 16, uq = (uint32_t)q << 16;
        float fp, fq;
        memcpy(&fp, &up, 4);
        memcpy(&fq, &uq, 4);
        r += fp * fq;
    }
    *s = r;
}

K_TARGET_AVX2 void k_vec_dot_q8_0_q8_0_avx2(int n, float *s, const void *w, const void *xq) {
    const uint8_t *wb = w;
    const core_block_q8_0 *x = xq;
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < n / CORE_QK; b++, wb += 34) {
        __m256i p = dot_i8_avx2(_mm256_loadu_si256((const __m256i *)(wb + 2)),
                                _mm256_loadu_si256((const __m256i *)x[b].qs));
        float d = load_f16(wb) * _cvtsh_ss(x[b].d);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d), acc);
    }
    *s = hsum8(acc);
}

/* Q4_0, or IQ4_NL (nl: its nibbles looked up in the table of levels, signed bytes). */
K_TARGET_AVX2 static inline K_ALWAYS_INLINE void
dot_q4_0_iq4_nl_avx2(int n, float *s, const void *w, const void *xq, const int nl) {
    const uint8_t *wb = w;
    const core_block_q8_0 *x = xq;
    const __m256i T =
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)core_iq4nl_values));
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < n / CORE_QK; b++, wb += 18) {
        __m256i q = nl ? _mm256_shuffle_epi8(T, nibbles32(wb + 2))
                       : _mm256_sub_epi8(nibbles32(wb + 2), _mm256_set1_epi8(8));
        __m256i p = dot_i8_avx2(q, _mm256_loadu_si256((const __m256i *)x[b].qs));
        float d = load_f16(wb) * _cvtsh_ss(x[b].d);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d), acc);
    }
    *s = hsum8(acc);
}
K_TARGET_AVX2 void k_vec_dot_q4_0_q8_0_avx2(int n, float *s, const void *w, const void *xq) {
    dot_q4_0_iq4_nl_avx2(n, s, w, xq, 0);
}
K_TARGET_AVX2 void k_vec_dot_iq4_nl_q8_0_avx2(int n, float *s, const void *w, const void *xq) {
    dot_q4_0_iq4_nl_avx2(n, s, w, xq, 1);
}

K_TARGET_AVX2 void k_vec_dot_iq4_xs_q8_K_avx2(int n, float *s, const void *w, const void *xq) {
    const uint8_t *wb = w;
    const k_block_q8_k *x = xq;
    const __m256i T =
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)core_iq4nl_values));
    float r = 0.0f;
    for (int b = 0; b < n / CORE_QK_K; b++, wb += sizeof(core_block_iq4_xs))
        r += iq4xs_block_avx2(wb, &x[b], T);
    *s = r;
}

/* Bit i of qh as byte i (0xFF or 0): byte i/8 of qh spread over 8 lanes, each testing its bit. */
K_TARGET_AVX2 static inline __m256i bits_to_bytes(uint32_t qh) {
    const __m256i spread =
        _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), spread);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

K_TARGET_AVX2 static inline void dot_q4_1_q5_avx2(int n, float *s, const void *w, const void *xq,
                                                  int five, int has_min) {
    const uint8_t *wb = w;
    const core_block_q8_0 *x = xq;
    size_t bytes = five ? (has_min ? 24 : 22) : 20;
    int qs_at = (has_min ? 4 : 2) + (five ? 4 : 0);
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1),
                  bit5 = _mm256_set1_epi8(0x10);
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < n / CORE_QK; b++, wb += bytes) {
        __m256i q = nibbles32(wb + qs_at);
        if (five) {
            uint32_t qh;
            memcpy(&qh, wb + (has_min ? 4 : 2), 4);
            q = _mm256_or_si256(q, _mm256_and_si256(bits_to_bytes(qh), bit5));
        }
        __m256i a = _mm256_loadu_si256((const __m256i *)x[b].qs);
        float xd = _cvtsh_ss(x[b].d), d = load_f16(wb) * xd;
        if (has_min) {
            __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(q, a), ones16);
            __m256i sa = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, a), ones16);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d), acc);
            acc =
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(sa), _mm256_set1_ps(load_f16(wb + 2) * xd), acc);
        } else {
            __m256i p = dot_i8_avx2(_mm256_sub_epi8(q, bit5), a);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d), acc);
        }
    }
    *s = hsum8(acc);
}
K_TARGET_AVX2 void k_vec_dot_q4_1_q8_0_avx2(int n, float *s, const void *w, const void *xq) {
    dot_q4_1_q5_avx2(n, s, w, xq, 0, 1);
}
K_TARGET_AVX2 void k_vec_dot_q5_0_q8_0_avx2(int n, float *s, const void *w, const void *xq) {
    dot_q4_1_q5_avx2(n, s, w, xq, 1, 0);
}
K_TARGET_AVX2 void k_vec_dot_q5_1_q8_0_avx2(int n, float *s, const void *w, const void *xq) {
    dot_q4_1_q5_avx2(n, s, w, xq, 1, 1);
}

/* The 8 scales and the mins' contribution (sum of mn * the activation's sums over the sub-block)
 * of one Q4_K / Q5_K super-block. */
static inline int q45k_scales_mins(const uint8_t *scales, const int16_t *bsums, uint8_t sc[8]) {
    int summ = 0;
    for (int j = 0; j < 8; j++) {
        uint8_t mn;
        core_q4k_scale_min(j, scales, &sc[j], &mn);
        summ += mn * (bsums[2 * j] + bsums[2 * j + 1]);
    }
    return summ;
}

K_TARGET_AVX2 static void dot_q45k_avx2(int n, float *s, const void *w, const void *xq, int five) {
    const uint8_t *wb = w;
    const k_block_q8_k *x = xq;
    size_t bytes = five ? sizeof(core_block_q5_k) : sizeof(core_block_q4_k);
    __m256 acc = _mm256_setzero_ps();
    float accm = 0.0f;
    for (int b = 0; b < n / CORE_QK_K; b++, wb += bytes) {
        uint8_t sc[8];
        int summ = q45k_scales_mins(wb + 4, x[b].bsums, sc);
        const uint8_t *qh = five ? wb + 16 : NULL, *q = wb + (five ? 48 : 16);
        __m256i isum = _mm256_setzero_si256();
        for (int g = 0; g < 4; g++) {
            __m256i lo, hi;
            q45k_group(q + 32 * g, qh, g, &lo, &hi);
            __m256i p0 =
                _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(x[b].qs + 64 * g)));
            __m256i p1 = _mm256_maddubs_epi16(
                hi, _mm256_loadu_si256((const __m256i *)(x[b].qs + 64 * g + 32)));
            isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p0, _mm256_set1_epi16(sc[2 * g])));
            isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p1, _mm256_set1_epi16(sc[2 * g + 1])));
        }
        float d = x[b].d * load_f16(wb);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(d), acc);
        accm += x[b].d * load_f16(wb + 2) * (float)summ;
    }
    *s = hsum8(acc) - accm;
}
K_TARGET_AVX2 void k_vec_dot_q4_K_q8_K_avx2(int n, float *s, const void *w, const void *xq) {
    dot_q45k_avx2(n, s, w, xq, 0);
}
K_TARGET_AVX2 void k_vec_dot_q5_K_q8_K_avx2(int n, float *s, const void *w, const void *xq) {
    dot_q45k_avx2(n, s, w, xq, 1);
}

/* The offset of 32: sum over sub-blocks of sc * 32 * (activation sum). */
static inline int q6k_offset(const int8_t *sc, const int16_t *bsums) {
    int c = 0;
    for (int k = 0; k < 16; k++) c += sc[k] * bsums[k];
    return 32 * c;
}

K_TARGET_AVX2 void k_vec_dot_q6_K_q8_K_avx2(int n, float *s, const void *w, const void *xq) {
    const uint8_t *wb = w;
    const k_block_q8_k *x = xq;
    float r = 0.0f;
    for (int b = 0; b < n / CORE_QK_K; b++, wb += sizeof(core_block_q6_k)) {
        const int8_t *sc = (const int8_t *)(wb + 192);
        __m256i isum = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            __m256i q[4];
            q6k_half(wb + 64 * h, wb + 128 + 32 * h, q);
            for (int v = 0; v < 4; v++) {
                const int8_t *a = x[b].qs + 128 * h + 32 * v;
                int k = 8 * h + 2 * v; /* sub-blocks k and k + 1 */
                __m256i p = _mm256_maddubs_epi16(q[v], _mm256_loadu_si256((const __m256i *)a));
                __m256i scv = _mm256_set_m128i(_mm_set1_epi16(sc[k + 1]), _mm_set1_epi16(sc[k]));
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, scv));
            }
        }
        int total = k_hsum8i(isum) - q6k_offset(sc, x[b].bsums);
        r += x[b].d * load_f16(wb + 208) * (float)total;
    }
    *s = r;
}

K_TARGET_AVX2 static inline K_ALWAYS_INLINE void dot_q23k_avx2(int n, float *s, const void *w,
                                                               const void *xq, const int three) {
    const uint8_t *wb = w;
    const k_block_q8_k *x = xq;
    const size_t bytes = three ? sizeof(core_block_q3_k) : sizeof(core_block_q2_k);
    float r = 0.0f;
    for (int b = 0; b < n / CORE_QK_K; b++, wb += bytes) r += q23k_block_avx2(wb, &x[b], three);
    *s = r;
}
K_TARGET_AVX2 void k_vec_dot_q2_K_q8_K_avx2(int n, float *s, const void *w, const void *xq) {
    dot_q23k_avx2(n, s, w, xq, 0);
}
K_TARGET_AVX2 void k_vec_dot_q3_K_q8_K_avx2(int n, float *s, const void *w, const void *xq) {
    dot_q23k_avx2(n, s, w, xq, 1);
}

/* AVX2: 16 registers, so at most four activation rows per pass over the weight row (the next
 * four read it again, from L1). */
K_TARGET_AVX2 static inline K_ALWAYS_INLINE void float_rows_avx2(int n, const int M, float *s,
                                                                 const uint8_t *w, const float *x,
                                                                 size_t xs, int f16) {
    __m256 a0[4], a1[4];
    for (int m = 0; m < M; m++) a0[m] = a1[m] = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 w0 = load8_f32_f16(w, f16, i), w1 = load8_f32_f16(w, f16, i + 8);
        for (int m = 0; m < M; m++) {
            a0[m] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + m * xs + i), a0[m]);
            a1[m] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + m * xs + i + 8), a1[m]);
        }
    }
    for (int m = 0; m < M; m++) {
        float r = hsum8(_mm256_add_ps(a0[m], a1[m]));
        for (int j = i; j < n; j++) {
            float wj;
            if (f16)
                wj = load_f16(w + 2 * (size_t)j);
            else
                memcpy(&wj, w + 4 * (size_t)j, 4);
            r += wj * x[m * xs + j];
        }
        s[m] = r;
    }
}

K_TARGET_AVX2 static inline K_ALWAYS_INLINE void
float_rows_m8_avx2(int n, int M, float *s, const uint8_t *w, const float *x, size_t xs, int f16) {
    for (int m0 = 0; m0 < M; m0 += 4) {
        int k = M - m0 < 4 ? M - m0 : 4;
        const float *xm = x + m0 * xs;
        switch (k) {
        case 1: float_rows_avx2(n, 1, s + m0, w, xm, xs, f16); break;
        case 2: float_rows_avx2(n, 2, s + m0, w, xm, xs, f16); break;
        case 3: float_rows_avx2(n, 3, s + m0, w, xm, xs, f16); break;
        default: float_rows_avx2(n, 4, s + m0, w, xm, xs, f16); break;
        }
    }
}
K_TARGET_AVX2 void k_vec_dot_f32_f32_m8_avx2(int n, int M, float *s, const void *w, const void *xq,
                                             size_t xstride) {
    float_rows_m8_avx2(n, M, s, w, xq, xstride / sizeof(float), 0);
}
K_TARGET_AVX2 void k_vec_dot_f16_f32_m8_avx2(int n, int M, float *s, const void *w, const void *xq,
                                             size_t xstride) {
    float_rows_m8_avx2(n, M, s, w, xq, xstride / sizeof(float), 1);
}

#endif
