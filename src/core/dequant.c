/* Each type's reference widening to floats (its core_dtype_info's to_f32, dtype.c's table): the
 * ggml block types with ggml's own order of operations (dequantize_row_* in ggml-quants.c), so
 * that the widened weights are the ones llama.cpp computes with (test_quant compares them bit for
 * bit). Blocks are copied out before use: a file's blocks need not be aligned for uint16. */
#include <string.h>

#include "core/half.h"
#include "core/quant.h"
#include "core/quant_impl.h"

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

void core_to_f32_f32(const void *src, float *dst, size_t n) { memcpy(dst, src, n * sizeof(float)); }

void core_to_f32_f16(const void *src, float *dst, size_t n) {
    const uint8_t *p = src;
    for (size_t i = 0; i < n; i++) dst[i] = core_f16_to_f32(rd16(p + 2 * i));
}

void core_to_f32_bf16(const void *src, float *dst, size_t n) {
    const uint8_t *p = src;
    for (size_t i = 0; i < n; i++) dst[i] = core_bf16_to_f32(rd16(p + 2 * i));
}

void core_to_f32_f64(const void *src, float *dst, size_t n) {
    const uint8_t *p = src;
    for (size_t i = 0; i < n; i++) {
        double v;
        memcpy(&v, p + 8 * i, 8);
        dst[i] = (float)v;
    }
}

static void q8_0(const uint8_t *src, float *y) {
    core_block_q8_0 b;
    memcpy(&b, src, sizeof b);
    float d = core_f16_to_f32(b.d);
    for (int i = 0; i < CORE_QK; i++) y[i] = d * (float)b.qs[i];
}

static void q4_0(const uint8_t *src, float *y) {
    core_block_q4_0 b;
    memcpy(&b, src, sizeof b);
    float d = core_f16_to_f32(b.d);
    for (int j = 0; j < CORE_QK / 2; j++) {
        y[j] = (float)((b.qs[j] & 0xF) - 8) * d;
        y[j + 16] = (float)((b.qs[j] >> 4) - 8) * d;
    }
}

static void q4_1(const uint8_t *src, float *y) {
    core_block_q4_1 b;
    memcpy(&b, src, sizeof b);
    float d = core_f16_to_f32(b.d), m = core_f16_to_f32(b.m);
    for (int j = 0; j < CORE_QK / 2; j++) {
        y[j] = (float)(b.qs[j] & 0xF) * d + m;
        y[j + 16] = (float)(b.qs[j] >> 4) * d + m;
    }
}

/* Q5_0 and Q5_1: Q5_1 is Q5_0 with a min in place of the offset of 16. */
static void q5_0(const uint8_t *src, float *y) {
    core_block_q5_0 b0;
    memcpy(&b0, src, sizeof b0);
    float d = core_f16_to_f32(b0.d);
    const uint8_t *qh_bytes = b0.qh, *qs = b0.qs;
    uint32_t qh = (uint32_t)qh_bytes[0] | (uint32_t)qh_bytes[1] << 8 | (uint32_t)qh_bytes[2] << 16 |
                  (uint32_t)qh_bytes[3] << 24;
    for (int j = 0; j < CORE_QK / 2; j++) {
        int x0 = (int)((qs[j] & 0xF) | (((qh >> j) << 4) & 0x10)) - 16;
        int x1 = (int)((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) - 16;
        y[j] = (float)x0 * d;
        y[j + 16] = (float)x1 * d;
    }
}

static void q5_1(const uint8_t *src, float *y) {
    core_block_q5_1 b1;
    memcpy(&b1, src, sizeof b1);
    float d = core_f16_to_f32(b1.d), m = core_f16_to_f32(b1.m);
    const uint8_t *qh_bytes = b1.qh, *qs = b1.qs;
    uint32_t qh = (uint32_t)qh_bytes[0] | (uint32_t)qh_bytes[1] << 8 | (uint32_t)qh_bytes[2] << 16 |
                  (uint32_t)qh_bytes[3] << 24;
    for (int j = 0; j < CORE_QK / 2; j++) {
        int x0 = (int)((qs[j] & 0xF) | (((qh >> j) << 4) & 0x10));
        int x1 = (int)((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10));
        y[j] = (float)x0 * d + m;
        y[j + 16] = (float)x1 * d + m;
    }
}

/* Q4_K and Q5_K (qh: its fifth bits): per sub-block of 32, d * sc * q - dmin * mn. */
static void q45k(const uint8_t *scales, const uint8_t *q, const uint8_t *qh, float d, float dmin,
                 float *y) {
    for (int g = 0; g < 4; g++, q += 32) {
        uint8_t sc, mn;
        core_q4k_scale_min(2 * g, scales, &sc, &mn);
        float d1 = d * sc, m1 = dmin * mn;
        core_q4k_scale_min(2 * g + 1, scales, &sc, &mn);
        float d2 = d * sc, m2 = dmin * mn;
        for (int l = 0; l < 32; l++) {
            int hi0 = qh ? ((qh[l] >> (2 * g)) & 1) << 4 : 0;
            int hi1 = qh ? ((qh[l] >> (2 * g + 1)) & 1) << 4 : 0;
            y[64 * g + l] = d1 * (float)((q[l] & 0xF) + hi0) - m1;
            y[64 * g + 32 + l] = d2 * (float)((q[l] >> 4) + hi1) - m2;
        }
    }
}

static void q4_k(const uint8_t *src, float *y) {
    core_block_q4_k b4;
    memcpy(&b4, src, sizeof b4);
    q45k(b4.scales, b4.qs, NULL, core_f16_to_f32(b4.d), core_f16_to_f32(b4.dmin), y);
}

static void q5_k(const uint8_t *src, float *y) {
    core_block_q5_k b5;
    memcpy(&b5, src, sizeof b5);
    q45k(b5.scales, b5.qs, b5.qh, core_f16_to_f32(b5.d), core_f16_to_f32(b5.dmin), y);
}

static void q6_k(const uint8_t *src, float *y) {
    core_block_q6_k b;
    memcpy(&b, src, sizeof b);
    float d = core_f16_to_f32(b.d);
    const uint8_t *ql = b.ql, *qh = b.qh;
    const int8_t *sc = b.scales;
    for (int n = 0; n < CORE_QK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8)
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            int q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32;
            int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = d * (float)sc[is] * (float)q1;
            y[l + 32] = d * (float)sc[is + 2] * (float)q2;
            y[l + 64] = d * (float)sc[is + 4] * (float)q3;
            y[l + 96] = d * (float)sc[is + 6] * (float)q4;
        }
}

static void q2_k(const uint8_t *src, float *y) {
    core_block_q2_k b;
    memcpy(&b, src, sizeof b);
    float d = core_f16_to_f32(b.d), dmin = core_f16_to_f32(b.dmin);
    for (int j = 0; j < 16; j++) {
        float dl = d * (float)(b.scales[j] & 15), ml = dmin * (float)(b.scales[j] >> 4);
        for (int e = 16 * j; e < 16 * j + 16; e++)
            y[e] = dl * (float)core_q23k_level(b.qs, NULL, e) - ml;
    }
}

static void q3_k(const uint8_t *src, float *y) {
    core_block_q3_k b;
    memcpy(&b, src, sizeof b);
    float d = core_f16_to_f32(b.d);
    for (int j = 0; j < 16; j++) {
        float dl = d * (float)(core_q3k_scale(j, b.scales) - 32);
        for (int e = 16 * j; e < 16 * j + 16; e++)
            y[e] = dl * (float)core_q23k_level(b.qs, b.hmask, e);
    }
}

static void iq4_nl(const uint8_t *src, float *y) {
    float d = core_f16_to_f32(rd16(src));
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)core_iq4nl_values[src[2 + j] & 15];
        y[j + 16] = d * (float)core_iq4nl_values[src[2 + j] >> 4];
    }
}

static void iq4_xs(const uint8_t *src, float *y) {
    float d = core_f16_to_f32(rd16(src));
    for (int j = 0; j < 8; j++) {
        const uint8_t *qs = src + 8 + 16 * j;
        float dl = d * (float)(core_iq4xs_scale(j, src) - 32);
        for (int l = 0; l < 16; l++) {
            y[32 * j + l] = dl * (float)core_iq4nl_values[qs[l] & 15];
            y[32 * j + l + 16] = dl * (float)core_iq4nl_values[qs[l] >> 4];
        }
    }
}

/* n elements (whole blocks) through a type's block widening. */
#define ROW_OF_BLOCKS(t, QK)                                                                       \
    void core_to_f32_##t(const void *src, float *dst, size_t n) {                                  \
        for (size_t b = 0; b < n / (QK); b++)                                                      \
            t((const uint8_t *)src + b * sizeof(core_block_##t), dst + b * (QK));                  \
    }
CORE_BLOCK_TYPES(ROW_OF_BLOCKS)
