/* The activation rows' reference quantization (k_act_quantize_ref), in a file of its own because
 * it is built without fused multiply-add (CMakeLists.txt): each product x * scale is rounded to a
 * float and then to an integer, as llama.cpp's x86 quantize_row_q8_0 does and as the AVX-512
 * version (qdot_x86.c) does. Contracted, the product went unrounded into the magic-number add
 * and ties such as 63.5 fell to 63 in -march=native builds only, so the two versions disagreed
 * by a step now and then (test_qk_models: Q4_0 decode 0.75 of 237 apart). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/half.h"
#include "core/quant.h"
#include "qdot.h"

/* Round to nearest, ties to even, for |f| < 2^22 (llama.cpp's nearest_int). */
static inline int nearest_int(float f) {
    float v = f + 12582912.0f;
    int32_t i;
    memcpy(&i, &v, 4);
    return (i & 0x007fffff) - 0x00400000;
}

/* Q8_0 blocks as llama.cpp's x86 quantize_row_q8_0: d = amax / 127 stored as f16, q =
 * round-to-even of x * 127 / amax; with d, each block's scale widened back to a float too. */
static void q8_0_blocks(const float *x, tlm_block_q8_0 *y, float *d, int n) {
    for (int b = 0; b < n / TLM_QK; b++, x += TLM_QK) {
        float amax = 0.0f;
        for (int i = 0; i < TLM_QK; i++) {
            float a = fabsf(x[i]);
            amax = a > amax ? a : amax;
        }
        float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        y[b].d = tlm_f32_to_f16(amax / 127.0f);
        for (int i = 0; i < TLM_QK; i++) y[b].qs[i] = (int8_t)nearest_int(x[i] * id);
        if (d) d[b] = tlm_f16_to_f32(y[b].d);
    }
}

void k_q8_0_blocks_ref(const float *x, void *y, int n) { q8_0_blocks(x, y, NULL, n); }

void k_act_quantize_ref(k_act_kind kind, const float *x, void *xq, int n) {
    switch (kind) {
    case K_ACT_F32: memcpy(xq, x, (size_t)n * sizeof(float)); break;
    case K_ACT_BF16: {
        uint16_t *y = xq;
        for (int i = 0; i < n; i++) y[i] = tlm_f32_to_bf16(x[i]);
        break;
    }
    case K_ACT_Q8_0: {
        tlm_block_q8_0 *y = xq;
        q8_0_blocks(x, y, (float *)(uintptr_t)k_act_q8_0_aux(xq, n), n);
        uint8_t *g = (uint8_t *)(uintptr_t)k_act_q8_0_nib(xq, n);
        for (int b = 0; b + 4 <= n / TLM_QK; b += 4, g += K_ACT_NIB_BYTES) {
            int32_t e[16];
            for (int k = 0; k < 4; k++) {
                memcpy(g + 16 * k, y[b + k].qs, 16);
                memcpy(g + 64 + 16 * k, y[b + k].qs + 16, 16);
                for (int l = 0; l < 4; l++) {
                    int sum = 0;
                    for (int i = 0; i < 4; i++)
                        sum += y[b + k].qs[4 * l + i] + y[b + k].qs[16 + 4 * l + i];
                    e[4 * k + l] = -8 * sum;
                }
            }
            memcpy(g + 128, e, sizeof e);
        }
        break;
    }
    case K_ACT_Q8_K: {
        /* llama.cpp's quantize_row_q8_K_ref: the scale is set by the element of largest magnitude,
         * with its sign, so that it maps to -127 exactly. */
        k_block_q8_k *y = xq;
        for (int b = 0; b < n / TLM_QK_K; b++, x += TLM_QK_K) {
            float max = 0.0f, amax = 0.0f;
            for (int i = 0; i < TLM_QK_K; i++) {
                float ax = fabsf(x[i]);
                if (ax > amax) amax = ax, max = x[i];
            }
            if (amax == 0.0f) {
                memset(&y[b], 0, sizeof y[b]);
                continue;
            }
            float iscale = -127.0f / max;
            for (int i = 0; i < TLM_QK_K; i++) {
                int v = nearest_int(iscale * x[i]);
                y[b].qs[i] = (int8_t)(v > 127 ? 127 : v);
            }
            for (int j = 0; j < 16; j++) {
                int s = 0;
                for (int i = 0; i < 16; i++) s += y[b].qs[16 * j + i];
                y[b].bsums[j] = (int16_t)s;
            }
            y[b].d = 1.0f / iscale;
        }
        int8_t *g = (int8_t *)(uintptr_t)k_act_q8_k_nib(xq, n);
        for (int b = 0; b < n / TLM_QK_K; b++, g += TLM_QK_K) k_act_q8_k_nib_fill(g, y[b].qs);
        break;
    }
    default: break;
    }
}

/* ---- IQ4_NL blocks at AVX-512 (the KV cache's stores) ---------------------------------------
 * tlm_dtype_from_f32's IQ4_NL quantizer (ggml's reference: a search over 16 inverse scales, each
 * element mapped to the nearest of the table's 16 levels by a binary search) bit for bit: the
 * mapping is a branch-free binary search on 16 lanes (the level of each step fetched by a
 * permute), the same float comparisons as the scalar search, and each trial's weighted sums are
 * added element by element in the scalar order, so the rounding is the reference's. Here, not in
 * qdot_x86.c, because this file builds without fused multiply-add. */
#if defined(__x86_64__) || defined(__i386__)
#include "kernels/x86/simd.h"

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

/* One super-block of `subs` sub-blocks of 32 (IQ4_NL: 1, IQ4_XS: 8), as quantize.c's iq4_quant:
 * weights x^2, or with an importance matrix qw * sqrt(sigma2 + x^2). */
K_TARGET_AVX512 static void iq4_quant_5(const float *x, int subs, const float *qw, uint16_t *dh,
                                        uint8_t *q4, uint16_t *scales_h, uint8_t *scales_l) {
    const __m512 lv = _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)tlm_iq4nl_values)));
    const float v0 = tlm_iq4nl_values[0];
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
        *dh = tlm_f32_to_f16(scales[0]);
        float id = scales[0] ? 1 / scales[0] : 0;
        for (int h = 0; h < 2; h++)
            _mm512_storeu_si512(L + 16 * h,
                                iq4_nearest(_mm512_mul_ps(_mm512_set1_ps(id), xv[h]), lv));
        for (int j = 0; j < 16; j++) q4[j] = (uint8_t)(L[j] | (L[j + 16] << 4));
        return;
    }
    *scales_h = 0;
    float d = -max_scale / 32;
    *dh = tlm_f32_to_f16(d);
    float id = d ? 1 / d : 0.f;
    for (int ib = 0; ib < subs; ib++) {
        int l = nearest_int(id * scales[ib]);
        l = l < -32 ? -32 : l > 31 ? 31 : l;
        float dl = d * l, idl = dl ? 1 / dl : 0.f;
        for (int h = 0; h < 2; h++)
            _mm512_storeu_si512(
                L + 16 * h, iq4_nearest(_mm512_mul_ps(_mm512_set1_ps(idl), xv[2 * ib + h]), lv));
        for (int j = 0; j < 16; j++) q4[16 * ib + j] = (uint8_t)(L[j] | (L[j + 16] << 4));
        tlm_iq4xs_put_scale(ib, l + 32, scales_h, scales_l);
    }
}

int k_simd_iq4_blocks(tlm_dtype t, const float *x, void *y, int n, const float *qw) {
    int subs = t == TLM_DTYPE_IQ4_XS ? 8 : 1;
    if (k_isa() < K_ISA_AVX512 || (t != TLM_DTYPE_IQ4_NL && t != TLM_DTYPE_IQ4_XS) ||
        n % (32 * subs))
        return 0;
    for (int b = 0; b < n / (32 * subs); b++) {
        const float *xb = x + (size_t)b * 32 * subs, *wb = qw ? qw + (size_t)b * 32 * subs : NULL;
        if (subs == 1) {
            tlm_block_iq4_nl *o = (tlm_block_iq4_nl *)y + b;
            iq4_quant_5(xb, 1, wb, &o->d, o->qs, NULL, NULL);
        } else {
            tlm_block_iq4_xs *o = (tlm_block_iq4_xs *)y + b;
            iq4_quant_5(xb, 8, wb, &o->d, o->qs, &o->scales_h, o->scales_l);
        }
    }
    return 1;
}
#else
int k_simd_iq4_blocks(tlm_dtype t, const float *x, void *y, int n, const float *qw) {
    (void)t, (void)x, (void)y, (void)n, (void)qw;
    return 0;
}
#endif
