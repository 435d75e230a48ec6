/* The activation rows' reference quantizers (ref/ref.h), in a file of their own because it is
 * built without fused multiply-add (CMakeLists.txt): each product x * scale is rounded to a float
 * and then to an integer, as llama.cpp's x86 quantize_row_q8_0 does and as the vector versions
 * (x86/act_quant_x86.c) do. Contracted, the product would go unrounded into the magic-number add
 * and ties such as 63.5 would fall to 63 in -march=native builds only, so that the two versions
 * disagreed by a step now and then (test_qk_kernels' check_act_quantize has such ties). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/half.h"
#include "core/quant.h"
#include "kernels/ref/ref.h"

/* Q8_0 blocks as llama.cpp's x86 quantize_row_q8_0: d = amax / 127 stored as f16, q =
 * round-to-even of x * 127 / amax; with d, each block's scale widened back to a float too. */
static void q8_0_blocks(const float *x, core_block_q8_0 *y, float *d, int n) {
    for (int b = 0; b < n / CORE_QK; b++, x += CORE_QK) {
        float amax = 0.0f;
        for (int i = 0; i < CORE_QK; i++) {
            float a = fabsf(x[i]);
            amax = a > amax ? a : amax;
        }
        float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        y[b].d = core_f32_to_f16(amax / 127.0f);
        for (int i = 0; i < CORE_QK; i++) y[b].qs[i] = (int8_t)k_nearest_int(x[i] * id);
        if (d) d[b] = core_f16_to_f32(y[b].d);
    }
}

void k_q8_0_blocks_ref(const float *x, void *y, int n) { q8_0_blocks(x, y, NULL, n); }

void k_act_quantize_f32_ref(const float *x, void *xq, int n) {
    memcpy(xq, x, (size_t)n * sizeof(float));
}

void k_act_quantize_bf16_ref(const float *x, void *xq, int n) {
    uint16_t *y = xq;
    for (int i = 0; i < n; i++) y[i] = core_f32_to_bf16(x[i]);
}

/* K_ACT_Q8_0: the blocks, their scales as floats, and the groups of four in k_act_q8_0_nib's
 * form with -8 times the sums each VNNI lane meets. */
void k_act_quantize_q8_0_ref(const float *x, void *xq, int n) {
    core_block_q8_0 *y = xq;
    q8_0_blocks(x, y, (float *)(uintptr_t)k_act_q8_0_aux(xq, n), n);
    uint8_t *g = (uint8_t *)(uintptr_t)k_act_q8_0_nib(xq, n);
    for (int b = 0; b + 4 <= n / CORE_QK; b += 4, g += K_ACT_NIB_BYTES) {
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
}

/* K_ACT_Q8_K: llama.cpp's quantize_row_q8_K_ref, the scale set by the element of largest
 * magnitude, with its sign, so that it maps to -127 exactly; then the blocks' reordered copies
 * (k_act_q8_k_nib). */
void k_act_quantize_q8_K_ref(const float *x, void *xq, int n) {
    k_block_q8_k *y = xq;
    for (int b = 0; b < n / CORE_QK_K; b++, x += CORE_QK_K) {
        float max = 0.0f, amax = 0.0f;
        for (int i = 0; i < CORE_QK_K; i++) {
            float ax = fabsf(x[i]);
            if (ax > amax) amax = ax, max = x[i];
        }
        if (amax == 0.0f) {
            memset(&y[b], 0, sizeof y[b]);
            continue;
        }
        float iscale = -127.0f / max;
        for (int i = 0; i < CORE_QK_K; i++) {
            int v = k_nearest_int(iscale * x[i]);
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
    for (int b = 0; b < n / CORE_QK_K; b++, g += CORE_QK_K) k_act_q8_k_nib_fill(g, y[b].qs);
}
