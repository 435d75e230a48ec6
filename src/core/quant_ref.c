/* Reference quantizers: floats to the ggml block types, byte for byte what ggml's reference
 * quantizers write (quantize_row_*_ref in ggml-quants.c, which llama-quantize uses when it has no
 * importance matrix). Files we write are then the files llama.cpp writes, and a test compares the
 * two on random rows. Each type's row function is its core_dtype_info's from_f32 (dtype.c).
 *
 * Identity needs ggml's exact float arithmetic: every expression below keeps ggml's order of
 * operations and its conversions, and this file is compiled with -ffp-contract=off (see
 * CMakeLists.txt), since a fused multiply-add rounds once where ggml rounds twice. */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <string.h>

#include "core/half.h"
#include "core/quant.h"
#include "core/quant_impl.h"

/* ggml converts floats to small integers with plain C casts, which x86-64 performs with
 * cvttss2si: truncation, and INT_MIN for NaN and anything out of range (a block whose scale is
 * subnormal has an infinite inverse). The same result without undefined behaviour. */
static int trunc_i32(float v) {
    if (!(v > -2147483648.0f && v < 2147483648.0f)) return INT_MIN;
    return (int)v;
}

static void q8_0(const float *x, core_block_q8_0 *y) {
    float amax = 0.0f;
    for (int j = 0; j < CORE_QK; j++) {
        float a = fabsf(x[j]);
        amax = amax > a ? amax : a; /* ggml's MAX(amax, a): a NaN is skipped only when first */
    }
    const float d = amax / ((1 << 7) - 1);
    const float id = d ? 1.0f / d : 0.0f;
    y->d = core_f32_to_f16(d);
    for (int j = 0; j < CORE_QK; ++j) y->qs[j] = (int8_t)trunc_i32(roundf(x[j] * id));
}

/* Q4_0 and Q5_0: the value of largest magnitude maps to -2^(bits-1), keeping its sign. */
static float absmax_signed(const float *x) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < CORE_QK; j++)
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    return max;
}

static void q4_0(const float *x, core_block_q4_0 *y) {
    const float d = absmax_signed(x) / -8;
    const float id = d ? 1.0f / d : 0.0f;
    y->d = core_f32_to_f16(d);
    for (int j = 0; j < CORE_QK / 2; ++j) {
        const float x0 = x[j] * id, x1 = x[CORE_QK / 2 + j] * id;
        const uint8_t xi0 = (uint8_t)imin(15, (int8_t)trunc_i32(x0 + 8.5f));
        const uint8_t xi1 = (uint8_t)imin(15, (int8_t)trunc_i32(x1 + 8.5f));
        y->qs[j] = (uint8_t)(xi0 | xi1 << 4);
    }
}

static void minmax(const float *x, float *min, float *max) {
    *min = FLT_MAX;
    *max = -FLT_MAX;
    for (int j = 0; j < CORE_QK; j++) {
        if (x[j] < *min) *min = x[j];
        if (x[j] > *max) *max = x[j];
    }
}

static void q4_1(const float *x, core_block_q4_1 *y) {
    float min, max;
    minmax(x, &min, &max);
    const float d = (max - min) / ((1 << 4) - 1);
    const float id = d ? 1.0f / d : 0.0f;
    y->d = core_f32_to_f16(d);
    y->m = core_f32_to_f16(min);
    for (int j = 0; j < CORE_QK / 2; ++j) {
        const float x0 = (x[j] - min) * id, x1 = (x[CORE_QK / 2 + j] - min) * id;
        const uint8_t xi0 = (uint8_t)imin(15, (int8_t)trunc_i32(x0 + 0.5f));
        const uint8_t xi1 = (uint8_t)imin(15, (int8_t)trunc_i32(x1 + 0.5f));
        y->qs[j] = (uint8_t)(xi0 | xi1 << 4);
    }
}

static void q5_0(const float *x, core_block_q5_0 *y) {
    const float d = absmax_signed(x) / -16;
    const float id = d ? 1.0f / d : 0.0f;
    y->d = core_f32_to_f16(d);
    uint32_t qh = 0;
    for (int j = 0; j < CORE_QK / 2; ++j) {
        const float x0 = x[j] * id, x1 = x[CORE_QK / 2 + j] * id;
        const uint8_t xi0 = (uint8_t)imin(31, (int8_t)trunc_i32(x0 + 16.5f));
        const uint8_t xi1 = (uint8_t)imin(31, (int8_t)trunc_i32(x1 + 16.5f));
        y->qs[j] = (uint8_t)((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
        qh |= ((xi0 & 0x10u) >> 4) << j;
        qh |= ((xi1 & 0x10u) >> 4) << (j + CORE_QK / 2);
    }
    put_qh(y->qh, qh);
}

static void q5_1(const float *x, core_block_q5_1 *y) {
    float min, max;
    minmax(x, &min, &max);
    const float d = (max - min) / ((1 << 5) - 1);
    const float id = d ? 1.0f / d : 0.0f;
    y->d = core_f32_to_f16(d);
    y->m = core_f32_to_f16(min);
    uint32_t qh = 0;
    for (int j = 0; j < CORE_QK / 2; ++j) {
        const float x0 = (x[j] - min) * id, x1 = (x[CORE_QK / 2 + j] - min) * id;
        /* no clamp to 31 here, as in ggml: x0 <= 31 + rounding */
        const uint8_t xi0 = (uint8_t)trunc_i32(x0 + 0.5f);
        const uint8_t xi1 = (uint8_t)trunc_i32(x1 + 0.5f);
        y->qs[j] = (uint8_t)((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
        qh |= ((xi0 & 0x10u) >> 4) << j;
        qh |= ((xi1 & 0x10u) >> 4) << (j + CORE_QK / 2);
    }
    put_qh(y->qh, qh);
}

/* Q4_K and Q5_K share everything but the bit count: eight sub-blocks of 32, each fitted by
 * core_make_qkx2_quants, their scales and mins quantized to 6 bits against the super-block's
 * largest, then every value requantized with the stored (rounded) scales. */
static void k_scales_and_levels(const float *x, int nmax, float rmin, int nstep, uint8_t *scales12,
                                uint16_t *dd, uint16_t *dmin, uint8_t *L) {
    uint8_t Laux[32];
    float weights[32], mins[CORE_QK_K / 32], scales[CORE_QK_K / 32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < CORE_QK_K / 32; ++j) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
        float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; ++l) weights[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = core_make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux,
                                          rmin, 0.1f, nstep, 0);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    memset(scales12, 0, 12);
    for (int j = 0; j < CORE_QK_K / 32; ++j) {
        uint8_t ls = (uint8_t)nearest_int(inv_scale * scales[j]);
        uint8_t lm = (uint8_t)nearest_int(inv_min * mins[j]);
        ls = ls < 63 ? ls : 63;
        lm = lm < 63 ? lm : 63;
        core_q45k_put_scale_min(j, ls, lm, scales12);
    }
    *dd = core_f32_to_f16(max_scale / 63.f);
    *dmin = core_f32_to_f16(max_min / 63.f);
    core_q45k_requantize(x, scales12, *dd, *dmin, nmax, L);
}

static void q4_k(const float *x, core_block_q4_k *y) {
    uint8_t L[CORE_QK_K];
    k_scales_and_levels(x, 15, -1.f, 20, y->scales, &y->d, &y->dmin, L);
    uint8_t *q = y->qs;
    for (int j = 0; j < CORE_QK_K; j += 64, q += 32)
        for (int l = 0; l < 32; ++l) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
}

static void q5_k(const float *x, core_block_q5_k *y) {
    uint8_t L[CORE_QK_K];
    k_scales_and_levels(x, 31, -0.5f, 15, y->scales, &y->d, &y->dmin, L);
    core_q5k_pack(L, y);
}

static void q6_k(const float *x, core_block_q6_k *y) { core_q6k_fit(x, NULL, y); }

/* Q2_K: sixteen sub-blocks of 16 fitted by core_make_qkx2_quants on |x| weights and absolute error,
 * scales and mins to 4 bits against the block's largest, then every value requantized with the
 * stored ones. */
static void q2_k(const float *x, core_block_q2_k *y) {
    uint8_t L[CORE_QK_K], Laux[16];
    float weights[16], mins[CORE_QK_K / 16], scales[CORE_QK_K / 16];
    const float q4scale = 15.f;
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < CORE_QK_K / 16; ++j) {
        for (int l = 0; l < 16; ++l) weights[l] = fabsf(x[16 * j + l]);
        scales[j] = core_make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux,
                                          -0.5f, 0.1f, 15, 1);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    if (max_scale > 0) {
        float iscale = q4scale / max_scale;
        for (int j = 0; j < CORE_QK_K / 16; ++j)
            y->scales[j] = (uint8_t)nearest_int(iscale * scales[j]);
        y->d = core_f32_to_f16(max_scale / q4scale);
    } else {
        memset(y->scales, 0, sizeof y->scales);
        y->d = core_f32_to_f16(0.f);
    }
    if (max_min > 0) {
        float iscale = q4scale / max_min;
        for (int j = 0; j < CORE_QK_K / 16; ++j)
            y->scales[j] |= (uint8_t)((unsigned)nearest_int(iscale * mins[j]) << 4);
        y->dmin = core_f32_to_f16(max_min / q4scale);
    } else {
        y->dmin = core_f32_to_f16(0.f);
    }
    for (int j = 0; j < CORE_QK_K / 16; ++j) {
        const float d = core_f16_to_f32(y->d) * (y->scales[j] & 0xF);
        if (!d) continue; /* keeps core_make_qkx2_quants' levels, as ggml does */
        const float dm = core_f16_to_f32(y->dmin) * (y->scales[j] >> 4);
        for (int ii = 0; ii < 16; ++ii) {
            int l = nearest_int((x[16 * j + ii] + dm) / d);
            L[16 * j + ii] = (uint8_t)imax(0, imin(3, l));
        }
    }
    core_q23k_pack_planes(L, y->qs);
}

/* Q3_K: sixteen sub-blocks of 16 by core_make_q3_quants, their scales to 6 bits (signed, + 32)
 * against the one of largest magnitude, every value requantized with the stored ones, the third
 * bit of element j in bit j / 32 of hmask[j % 32]. */
static void q3_k(const float *x, core_block_q3_k *y) {
    int8_t L[CORE_QK_K];
    float scales[CORE_QK_K / 16];
    float max_scale = 0, amax = 0;
    for (int j = 0; j < CORE_QK_K / 16; ++j) {
        scales[j] = core_make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
        float scale = fabsf(scales[j]);
        if (scale > amax) {
            amax = scale;
            max_scale = scales[j];
        }
    }
    memset(y->scales, 0, 12);
    if (max_scale) {
        float iscale = -32.f / max_scale;
        for (int j = 0; j < CORE_QK_K / 16; ++j) {
            /* ggml keeps nearest_int's result in an int8_t before clamping it */
            int8_t l = (int8_t)nearest_int(iscale * scales[j]);
            core_q3k_put_scale(j, imax(-32, imin(31, l)) + 32, y->scales);
        }
        y->d = core_f32_to_f16(1 / iscale);
    } else {
        y->d = core_f32_to_f16(0.f);
    }
    core_q3k_finish(x, L, y);
}

static void iq4_nl(const float *x, core_block_iq4_nl *y) {
    core_iq4_quant(x, 1, &y->d, y->qs, NULL, NULL, NULL);
}

static void iq4_xs(const float *x, core_block_iq4_xs *y) {
    core_iq4_quant(x, 8, &y->d, y->qs, &y->scales_h, y->scales_l, NULL);
}

/* ---- rows: each type's from_f32 (dtype.c's table) ------------------------------------------- */

void core_from_f32_f32(const float *src, void *dst, size_t n) {
    memcpy(dst, src, n * sizeof(float));
}

/* F16 and BF16 round to nearest even; dst need not be aligned, so bytes go one at a time. */
void core_from_f32_f16(const float *src, void *dst, size_t n) {
    uint8_t *o = dst;
    for (size_t i = 0; i < n; i++) {
        uint16_t h = core_f32_to_f16(src[i]);
        o[2 * i] = (uint8_t)h;
        o[2 * i + 1] = (uint8_t)(h >> 8);
    }
}

void core_from_f32_bf16(const float *src, void *dst, size_t n) {
    uint8_t *o = dst;
    for (size_t i = 0; i < n; i++) {
        uint16_t h = core_f32_to_bf16(src[i]);
        o[2 * i] = (uint8_t)h;
        o[2 * i + 1] = (uint8_t)(h >> 8);
    }
}

/* n floats (whole blocks) through a type's block quantizer, each block built in an aligned local
 * and copied out: dst need not be aligned. */
#define ROW_OF_BLOCKS(t, QK)                                                                       \
    void core_from_f32_##t(const float *src, void *dst, size_t n) {                                \
        uint8_t *out = dst;                                                                        \
        for (size_t b = 0; b < n / (QK); b++) {                                                    \
            core_block_##t blk;                                                                    \
            t(src + b * (QK), &blk);                                                               \
            memcpy(out + b * sizeof blk, &blk, sizeof blk);                                        \
        }                                                                                          \
    }
CORE_BLOCK_TYPES(ROW_OF_BLOCKS)
