/* The activation rows' quantizers with AVX2 and AVX-512, the KV cache's Q8_0 blocks, and IQ4_NL
 * and IQ4_XS's quantizer on AVX-512 lanes: each byte for byte its reference. Built without fused
 * multiply-add (CMakeLists.txt), as the references are, for the IQ4 search's sums. */
#include <math.h>

#include "kernels/x86/vec_dot_x86.h"

#if defined(__x86_64__) || defined(__i386__)

/* k_act_quantize's rows with AVX-512, byte for byte the reference's (ref/act_quant_ref.c): the
 * same float products, rounded to nearest even by the conversion as the reference's magic-number
 * add rounds them, and the same scales. A decode step quantizes its activation before each
 * product, which in C took a noticeable share of a small model's token (tlm bench tg on 15M). */
/* With `full`, the activation row (K_ACT_Q8_0: the blocks, their scales as floats and the
 * groups of four in k_act_q8_0_nib's form); without, the blocks alone (k_q8_0_blocks). */
K_TARGET_AVX512 static inline __attribute__((always_inline)) void
q8_0_row_avx512(const float *x, void *xq, int n, const int full) {
    core_block_q8_0 *y = xq;
    float *d = full ? (float *)(uintptr_t)k_act_q8_0_aux(xq, n) : NULL;
    uint8_t *g = full ? (uint8_t *)(uintptr_t)k_act_q8_0_nib(xq, n) : NULL;
    const __m512 mag = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    const __m512i ones = _mm512_set1_epi8(1);
    int nb = n / CORE_QK;
    __m128i lo[4], hi[4];
    for (int b = 0; b < nb; b++, x += CORE_QK) {
        __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
        float amax =
            _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(v0, mag), _mm512_and_ps(v1, mag)));
        float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        y[b].d = core_f32_to_f16(amax / 127.0f);
        if (full) d[b] = core_f16_to_f32(y[b].d);
        __m512 vid = _mm512_set1_ps(id);
        int k = b % 4;
        lo[k] = _mm512_cvtepi32_epi8(_mm512_cvt_roundps_epi32(
            _mm512_mul_ps(v0, vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        hi[k] = _mm512_cvtepi32_epi8(_mm512_cvt_roundps_epi32(
            _mm512_mul_ps(v1, vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        _mm_storeu_si128((__m128i *)(void *)y[b].qs, lo[k]);
        _mm_storeu_si128((__m128i *)(void *)(y[b].qs + 16), hi[k]);
        if (!full || k < 3) continue;
        /* the group of four blocks in k_act_q8_0_nib's form, and -8 times its sums of four */
        __m512i l = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(lo[1], lo[0])),
                                       _mm256_set_m128i(lo[3], lo[2]), 1);
        __m512i h = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(hi[1], hi[0])),
                                       _mm256_set_m128i(hi[3], hi[2]), 1);
        __m512i e =
            _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, l), ones, h);
        _mm512_storeu_si512(g, l);
        _mm512_storeu_si512(g + 64, h);
        _mm512_storeu_si512(g + 128,
                            _mm512_slli_epi32(_mm512_sub_epi32(_mm512_setzero_si512(), e), 3));
        g += K_ACT_NIB_BYTES;
    }
}

K_TARGET_AVX512 void k_act_quantize_q8_0_avx512(const float *x, void *xq, int n) {
    q8_0_row_avx512(x, xq, n, 1);
}
K_TARGET_AVX512 void k_q8_0_blocks_avx512(const float *x, void *y, int n) {
    q8_0_row_avx512(x, y, n, 0);
}

K_TARGET_AVX512 void k_act_quantize_q8_K_avx512(const float *x, void *xq, int n) {
    k_block_q8_k *y = xq;
    int8_t *g = (int8_t *)(uintptr_t)k_act_q8_k_nib(xq, n);
    const __m512 mag = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    const __m512i top = _mm512_set1_epi32(127);
    for (int b = 0; b < n / CORE_QK_K; b++, x += CORE_QK_K, g += CORE_QK_K) {
        __m512 m = _mm512_setzero_ps();
        for (int j = 0; j < 16; j++)
            m = _mm512_max_ps(m, _mm512_and_ps(_mm512_loadu_ps(x + 16 * j), mag));
        float amax = _mm512_reduce_max_ps(m);
        if (amax == 0.0f) {
            memset(&y[b], 0, sizeof y[b]);
        } else {
            /* the first element of that magnitude sets the scale's sign, as in the reference */
            float max = 0.0f;
            __m512 va = _mm512_set1_ps(amax);
            for (int j = 0; j < 16; j++) {
                __mmask16 k = _mm512_cmp_ps_mask(_mm512_and_ps(_mm512_loadu_ps(x + 16 * j), mag),
                                                 va, _CMP_EQ_OQ);
                if (k) {
                    max = x[16 * j + __builtin_ctz(k)];
                    break;
                }
            }
            float iscale = -127.0f / max;
            __m512 vs = _mm512_set1_ps(iscale);
            for (int j = 0; j < 16; j++) {
                __m512i q = _mm512_min_epi32(
                    _mm512_cvt_roundps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 16 * j), vs),
                                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                    top);
                _mm_storeu_si128((__m128i *)(void *)(y[b].qs + 16 * j), _mm512_cvtepi32_epi8(q));
                y[b].bsums[j] = (int16_t)_mm512_reduce_add_epi32(q);
            }
            y[b].d = 1.0f / iscale;
        }
        k_act_q8_k_nib_fill(g, y[b].qs);
    }
}

/* Round to nearest even on the bits, quiet NaNs, as core_f32_to_bf16. */
K_TARGET_AVX512 void k_act_quantize_bf16_avx512(const float *x, void *xq, int n) {
    uint16_t *y = xq;
    const __m512i one = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7fff),
                  inf = _mm512_set1_epi32(0x7f800000), abs = _mm512_set1_epi32(0x7fffffff),
                  quiet = _mm512_set1_epi32(0x400000);
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i u = _mm512_loadu_si512(x + i);
        __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs), inf);
        __m512i r = _mm512_add_epi32(
            u, _mm512_add_epi32(half, _mm512_and_si512(_mm512_srli_epi32(u, 16), one)));
        r = _mm512_mask_or_epi32(r, nan, u, quiet);
        _mm256_storeu_si256((__m256i *)(void *)(y + i),
                            _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
    }
    for (; i < n; i++) y[i] = core_f32_to_bf16(x[i]);
}

/* The same with AVX2 (for CPUs without AVX-512): the reference's products and rounding. */
K_TARGET_AVX2 void k_act_quantize_q8_0_avx2(const float *x, void *xq, int n) {
    core_block_q8_0 *y = xq;
    float *d = (float *)(uintptr_t)k_act_q8_0_aux(xq, n);
    uint8_t *g = (uint8_t *)(uintptr_t)k_act_q8_0_nib(xq, n);
    int nb = n / CORE_QK;
    for (int b = 0; b < nb; b++, x += CORE_QK) {
        __m256i qi[4];
        float amax = k_q8_block_avx2(x, y[b].qs, qi);
        y[b].d = core_f32_to_f16(amax / 127.0f);
        d[b] = core_f16_to_f32(y[b].d);
    }
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    for (int b = 0; b + 4 <= nb; b += 4, g += K_ACT_NIB_BYTES) {
        for (int k = 0; k < 4; k++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)y[b + k].qs);
            _mm_storeu_si128((__m128i *)(void *)(g + 16 * k), _mm256_castsi256_si128(v));
            _mm_storeu_si128((__m128i *)(void *)(g + 64 + 16 * k), _mm256_extracti128_si256(v, 1));
            __m256i s4 = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, v), ones16);
            __m128i e = _mm_add_epi32(_mm256_castsi256_si128(s4), _mm256_extracti128_si256(s4, 1));
            e = _mm_sub_epi32(_mm_setzero_si128(), _mm_slli_epi32(e, 3));
            _mm_storeu_si128((__m128i *)(void *)(g + 128 + 16 * k), e);
        }
    }
}

K_TARGET_AVX2 void k_act_quantize_q8_K_avx2(const float *x, void *xq, int n) {
    k_block_q8_k *y = xq;
    int8_t *g = (int8_t *)(uintptr_t)k_act_q8_k_nib(xq, n);
    const __m256 mag = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i top = _mm256_set1_epi32(127);
    for (int b = 0; b < n / CORE_QK_K; b++, x += CORE_QK_K, g += CORE_QK_K) {
        __m256 m = _mm256_setzero_ps();
        for (int j = 0; j < 32; j++)
            m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + 8 * j), mag));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
        if (amax == 0.0f) {
            memset(&y[b], 0, sizeof y[b]);
        } else {
            /* the first element of that magnitude sets the scale's sign, as in the reference */
            float max = 0.0f;
            __m256 va = _mm256_set1_ps(amax);
            for (int j = 0; j < 32; j++) {
                int k = _mm256_movemask_ps(
                    _mm256_cmp_ps(_mm256_and_ps(_mm256_loadu_ps(x + 8 * j), mag), va, _CMP_EQ_OQ));
                if (k) {
                    max = x[8 * j + __builtin_ctz((unsigned)k)];
                    break;
                }
            }
            float iscale = -127.0f / max;
            __m256 vs = _mm256_set1_ps(iscale);
            for (int j = 0; j < 16; j++) {
                __m256i q0 = _mm256_min_epi32(
                    _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16 * j), vs)), top);
                __m256i q1 = _mm256_min_epi32(
                    _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16 * j + 8), vs)), top);
                __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(q0, q1), 0xD8);
                _mm_storeu_si128(
                    (__m128i *)(void *)(y[b].qs + 16 * j),
                    _mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)));
                y[b].bsums[j] = (int16_t)k_hsum8i(_mm256_add_epi32(q0, q1));
            }
            y[b].d = 1.0f / iscale;
        }
        k_act_q8_k_nib_fill(g, y[b].qs);
    }
}

/* ---- IQ4_NL and IQ4_XS blocks (tlm quantize, the KV cache's stores) -------------------------
 * core_dtype_from_f32's IQ4 quantizer (ggml's reference: a search over 16 inverse scales, each
 * element mapped to the nearest of the table's 16 levels by a binary search) bit for bit: the
 * mapping is a branch-free binary search on 16 lanes (the level of each step fetched by a
 * permute), the same float comparisons as the scalar search, and each trial's weighted sums are
 * added element by element in the scalar order, so the rounding is the reference's. */

/* best_index of every lane: the nearest level, the lower one where the two are as near; NaN to
 * the last, as the scalar search ends there. */
K_TARGET_AVX512 static inline __m512i iq4_nearest(__m512 x, __m512 lv) {
    __m512i ml = _mm512_setzero_si512();
    for (int step = 8; step; step >>= 1) {
        __m512i c = _mm512_add_epi32(ml, _mm512_set1_epi32(step));
        __mmask16 le = _mm512_cmp_ps_mask(_mm512_permutexvar_ps(c, lv), x, _CMP_LE_OQ);
        ml = _mm512_mask_mov_epi32(ml, le, c);
    }
    __m512i mu =
        _mm512_min_epi32(_mm512_add_epi32(ml, _mm512_set1_epi32(1)), _mm512_set1_epi32(15));
    __m512 d1 = _mm512_sub_ps(x, _mm512_permutexvar_ps(ml, lv));
    __m512 d2 = _mm512_sub_ps(_mm512_permutexvar_ps(mu, lv), x);
    __m512i r = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(d1, d2, _CMP_LT_OQ), mu, ml);
    return _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_set1_epi32(15));
}

/* One trial at inverse scale id: the sums sumqx and sumq2 over the block, in element order. */
K_TARGET_AVX512 static inline void iq4_trial(const __m512 *x, const __m512 *w, __m512 lv, float id,
                                             float *sqx, float *sq2) {
    float px[32], p2[32];
    for (int h = 0; h < 2; h++) {
        __m512 q =
            _mm512_permutexvar_ps(iq4_nearest(_mm512_mul_ps(_mm512_set1_ps(id), x[h]), lv), lv);
        __m512 wq = _mm512_mul_ps(w[h], q);
        _mm512_storeu_ps(px + 16 * h, _mm512_mul_ps(wq, x[h]));
        _mm512_storeu_ps(p2 + 16 * h, _mm512_mul_ps(wq, q));
    }
    float a = 0, b = 0;
    for (int j = 0; j < 32; j++) a += px[j], b += p2[j];
    *sqx = a;
    *sq2 = b;
}

/* One super-block of `subs` sub-blocks of 32 (IQ4_NL: 1, IQ4_XS: 8), as src/core/quant_fit.c's
 * core_iq4_quant: weights x^2, or with an importance matrix qw * sqrt(sigma2 + x^2). */
K_TARGET_AVX512 static void iq4_quantize_avx512(const float *x, int subs, const float *qw,
                                                uint16_t *dh, uint8_t *q4, uint16_t *scales_h,
                                                uint8_t *scales_l) {
    const __m512 lv = _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)core_iq4nl_values)));
    const float v0 = core_iq4nl_values[0];
    float scales[8], sigma2 = 0, max_scale = 0, amax_scale = 0;
    if (qw) {
        for (int j = 0; j < 32 * subs; ++j) sigma2 += x[j] * x[j];
        sigma2 *= 2.f / (32 * subs);
    }
    __m512 xv[16];
    for (int ib = 0; ib < subs; ib++) {
        const float *xb = x + 32 * ib;
        __m512 *v = xv + 2 * ib, w[2];
        v[0] = _mm512_loadu_ps(xb);
        v[1] = _mm512_loadu_ps(xb + 16);
        for (int h = 0; h < 2; h++)
            w[h] = qw ? _mm512_mul_ps(_mm512_loadu_ps(qw + 32 * ib + 16 * h),
                                      _mm512_sqrt_ps(_mm512_add_ps(_mm512_set1_ps(sigma2),
                                                                   _mm512_mul_ps(v[h], v[h]))))
                      : _mm512_mul_ps(v[h], v[h]);
        float amax = 0, max = 0, d = 0;
        for (int j = 0; j < 32; j++)
            if (fabsf(xb[j]) > amax) amax = fabsf(xb[j]), max = xb[j];
        if (amax >= 1e-15f) { /* GROUP_MAX_EPS: below it the scale stays 0 */
            float sqx, sq2;
            iq4_trial(v, w, lv, 1 / (-max / v0), &sqx, &sq2);
            d = sq2 > 0 ? sqx / sq2 : 0.f;
            float best = d * sqx;
            for (int itry = -7; itry <= 7; ++itry) {
                iq4_trial(v, w, lv, (itry + v0) / max, &sqx, &sq2);
                if (sq2 > 0 && sqx * sqx > best * sq2) {
                    d = sqx / sq2;
                    best = d * sqx;
                }
            }
        }
        scales[ib] = d;
        if (fabsf(d) > amax_scale) amax_scale = fabsf(d), max_scale = d;
    }
    int32_t L[32];
    if (subs == 1) {
        *dh = core_f32_to_f16(scales[0]);
        float id = scales[0] ? 1 / scales[0] : 0;
        for (int h = 0; h < 2; h++)
            _mm512_storeu_si512(L + 16 * h,
                                iq4_nearest(_mm512_mul_ps(_mm512_set1_ps(id), xv[h]), lv));
        for (int j = 0; j < 16; j++) q4[j] = (uint8_t)(L[j] | (L[j + 16] << 4));
        return;
    }
    *scales_h = 0;
    float d = -max_scale / 32;
    *dh = core_f32_to_f16(d);
    float id = d ? 1 / d : 0.f;
    for (int ib = 0; ib < subs; ib++) {
        int l = k_nearest_int(id * scales[ib]);
        l = l < -32 ? -32 : l > 31 ? 31 : l;
        float dl = d * l, idl = dl ? 1 / dl : 0.f;
        for (int h = 0; h < 2; h++)
            _mm512_storeu_si512(
                L + 16 * h, iq4_nearest(_mm512_mul_ps(_mm512_set1_ps(idl), xv[2 * ib + h]), lv));
        for (int j = 0; j < 16; j++) q4[16 * ib + j] = (uint8_t)(L[j] | (L[j + 16] << 4));
        core_iq4xs_put_scale(ib, l + 32, scales_h, scales_l);
    }
}

/* n floats (whole blocks) to IQ4_NL or IQ4_XS blocks; qw an importance matrix's weights or NULL. */
void k_quantize_iq4_nl_avx512(const float *x, void *y, int n, const float *qw) {
    for (int b = 0; b < n / 32; b++) {
        const float *xb = x + (size_t)b * 32, *wb = qw ? qw + (size_t)b * 32 : NULL;
        core_block_iq4_nl *o = (core_block_iq4_nl *)y + b;
        iq4_quantize_avx512(xb, 1, wb, &o->d, o->qs, NULL, NULL);
    }
}

void k_quantize_iq4_xs_avx512(const float *x, void *y, int n, const float *qw) {
    for (int b = 0; b < n / 256; b++) {
        const float *xb = x + (size_t)b * 256, *wb = qw ? qw + (size_t)b * 256 : NULL;
        core_block_iq4_xs *o = (core_block_iq4_xs *)y + b;
        iq4_quantize_avx512(xb, 8, wb, &o->d, o->qs, &o->scales_h, o->scales_l);
    }
}

#endif
