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
