#include "core/dtype.h"

#include <string.h>

#include "core/core.h"
#include "core/half.h"
#include "core/quant.h"

static const tlm_dtype_info table[TLM_DTYPE_COUNT] = {
    [TLM_DTYPE_F32] = {"F32", 1, 4, 0, 1},
    [TLM_DTYPE_F16] = {"F16", 1, 2, 1, 1},
    [TLM_DTYPE_BF16] = {"BF16", 1, 2, 30, 1},
    [TLM_DTYPE_Q8_0] = {"Q8_0", 32, 34, 8, 1},
    [TLM_DTYPE_F64] = {"F64", 1, 8, 28, 1},
    [TLM_DTYPE_I64] = {"I64", 1, 8, 27, 0},
    [TLM_DTYPE_I32] = {"I32", 1, 4, 26, 0},
    [TLM_DTYPE_I16] = {"I16", 1, 2, 25, 0},
    [TLM_DTYPE_I8] = {"I8", 1, 1, 24, 0},
    [TLM_DTYPE_U8] = {"U8", 1, 1, -1, 0},
    [TLM_DTYPE_BOOL] = {"BOOL", 1, 1, -1, 0},
    [TLM_DTYPE_Q4_0] = {"Q4_0", TLM_QK, sizeof(tlm_block_q4_0), 2, 1},
    [TLM_DTYPE_Q4_1] = {"Q4_1", TLM_QK, sizeof(tlm_block_q4_1), 3, 1},
    [TLM_DTYPE_Q5_0] = {"Q5_0", TLM_QK, sizeof(tlm_block_q5_0), 6, 1},
    [TLM_DTYPE_Q5_1] = {"Q5_1", TLM_QK, sizeof(tlm_block_q5_1), 7, 1},
    [TLM_DTYPE_Q4_K] = {"Q4_K", TLM_QK_K, sizeof(tlm_block_q4_k), 12, 1},
    [TLM_DTYPE_Q5_K] = {"Q5_K", TLM_QK_K, sizeof(tlm_block_q5_k), 13, 1},
    [TLM_DTYPE_Q6_K] = {"Q6_K", TLM_QK_K, sizeof(tlm_block_q6_k), 14, 1},
    [TLM_DTYPE_Q2_K] = {"Q2_K", TLM_QK_K, sizeof(tlm_block_q2_k), 10, 1},
    [TLM_DTYPE_Q3_K] = {"Q3_K", TLM_QK_K, sizeof(tlm_block_q3_k), 11, 1},
    [TLM_DTYPE_IQ4_NL] = {"IQ4_NL", TLM_QK, sizeof(tlm_block_iq4_nl), 20, 1},
    [TLM_DTYPE_IQ4_XS] = {"IQ4_XS", TLM_QK_K, sizeof(tlm_block_iq4_xs), 23, 1},
};

const int8_t tlm_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                     1,    13,   25,  38,  53,  69,  89,  113};

const tlm_dtype_info *tlm_dtype_get(tlm_dtype t) {
    return (unsigned)t < TLM_DTYPE_COUNT ? &table[t] : NULL;
}

const char *tlm_dtype_name(tlm_dtype t) {
    return (unsigned)t < TLM_DTYPE_COUNT ? table[t].name : "?";
}

size_t tlm_dtype_bytes(tlm_dtype t, uint64_t n) {
    const tlm_dtype_info *d = tlm_dtype_get(t);
    size_t bytes;
    if (!d || n % d->block_elems || n / d->block_elems > SIZE_MAX ||
        !tlm_mul_ok((size_t)(n / d->block_elems), d->block_bytes, &bytes))
        return 0;
    return bytes;
}

int tlm_dtype_from_ggml(uint32_t ggml, tlm_dtype *out) {
    for (int i = 0; i < TLM_DTYPE_COUNT; i++)
        if (table[i].ggml >= 0 && (uint32_t)table[i].ggml == ggml) {
            *out = (tlm_dtype)i;
            return 1;
        }
    return 0;
}

int tlm_dtype_from_name(const char *name, tlm_dtype *out) {
    for (int i = 0; i < TLM_DTYPE_COUNT; i++)
        if (!strcmp(name, table[i].name)) {
            *out = (tlm_dtype)i;
            return 1;
        }
    return 0;
}

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

/* One block of a ggml type to floats, with ggml's own order of operations (so that the widened
 * weights are the ones llama.cpp computes with). */
static void widen_block(tlm_dtype t, const uint8_t *src, float *y) {
    switch (t) {
    case TLM_DTYPE_Q8_0: {
        tlm_block_q8_0 b;
        memcpy(&b, src, sizeof b);
        float d = tlm_f16_to_f32(b.d);
        for (int i = 0; i < TLM_QK; i++) y[i] = d * (float)b.qs[i];
        break;
    }
    case TLM_DTYPE_Q4_0: {
        tlm_block_q4_0 b;
        memcpy(&b, src, sizeof b);
        float d = tlm_f16_to_f32(b.d);
        for (int j = 0; j < TLM_QK / 2; j++) {
            y[j] = (float)((b.qs[j] & 0xF) - 8) * d;
            y[j + 16] = (float)((b.qs[j] >> 4) - 8) * d;
        }
        break;
    }
    case TLM_DTYPE_Q4_1: {
        tlm_block_q4_1 b;
        memcpy(&b, src, sizeof b);
        float d = tlm_f16_to_f32(b.d), m = tlm_f16_to_f32(b.m);
        for (int j = 0; j < TLM_QK / 2; j++) {
            y[j] = (float)(b.qs[j] & 0xF) * d + m;
            y[j + 16] = (float)(b.qs[j] >> 4) * d + m;
        }
        break;
    }
    case TLM_DTYPE_Q5_0:
    case TLM_DTYPE_Q5_1: {
        /* Q5_1 is Q5_0 with a min in place of the offset of 16. */
        tlm_block_q5_1 b1;
        tlm_block_q5_0 b0;
        const uint8_t *qh_bytes, *qs;
        float d, m = 0;
        int off = 16;
        if (t == TLM_DTYPE_Q5_0) {
            memcpy(&b0, src, sizeof b0);
            d = tlm_f16_to_f32(b0.d);
            qh_bytes = b0.qh;
            qs = b0.qs;
        } else {
            memcpy(&b1, src, sizeof b1);
            d = tlm_f16_to_f32(b1.d);
            m = tlm_f16_to_f32(b1.m);
            qh_bytes = b1.qh;
            qs = b1.qs;
            off = 0;
        }
        uint32_t qh = (uint32_t)qh_bytes[0] | (uint32_t)qh_bytes[1] << 8 |
                      (uint32_t)qh_bytes[2] << 16 | (uint32_t)qh_bytes[3] << 24;
        for (int j = 0; j < TLM_QK / 2; j++) {
            int x0 = (int)((qs[j] & 0xF) | (((qh >> j) << 4) & 0x10)) - off;
            int x1 = (int)((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) - off;
            if (t == TLM_DTYPE_Q5_0) {
                y[j] = (float)x0 * d;
                y[j + 16] = (float)x1 * d;
            } else {
                y[j] = (float)x0 * d + m;
                y[j + 16] = (float)x1 * d + m;
            }
        }
        break;
    }
    case TLM_DTYPE_Q4_K:
    case TLM_DTYPE_Q5_K: {
        tlm_block_q4_k b4;
        tlm_block_q5_k b5;
        const uint8_t *scales, *q, *qh = NULL;
        float d, dmin;
        if (t == TLM_DTYPE_Q4_K) {
            memcpy(&b4, src, sizeof b4);
            d = tlm_f16_to_f32(b4.d);
            dmin = tlm_f16_to_f32(b4.dmin);
            scales = b4.scales;
            q = b4.qs;
        } else {
            memcpy(&b5, src, sizeof b5);
            d = tlm_f16_to_f32(b5.d);
            dmin = tlm_f16_to_f32(b5.dmin);
            scales = b5.scales;
            q = b5.qs;
            qh = b5.qh;
        }
        for (int g = 0; g < 4; g++, q += 32) {
            uint8_t sc, mn;
            tlm_q4k_scale_min(2 * g, scales, &sc, &mn);
            float d1 = d * sc, m1 = dmin * mn;
            tlm_q4k_scale_min(2 * g + 1, scales, &sc, &mn);
            float d2 = d * sc, m2 = dmin * mn;
            for (int l = 0; l < 32; l++) {
                int hi0 = qh ? ((qh[l] >> (2 * g)) & 1) << 4 : 0;
                int hi1 = qh ? ((qh[l] >> (2 * g + 1)) & 1) << 4 : 0;
                y[64 * g + l] = d1 * (float)((q[l] & 0xF) + hi0) - m1;
                y[64 * g + 32 + l] = d2 * (float)((q[l] >> 4) + hi1) - m2;
            }
        }
        break;
    }
    case TLM_DTYPE_Q6_K: {
        tlm_block_q6_k b;
        memcpy(&b, src, sizeof b);
        float d = tlm_f16_to_f32(b.d);
        const uint8_t *ql = b.ql, *qh = b.qh;
        const int8_t *sc = b.scales;
        for (int n = 0; n < TLM_QK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8)
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
        break;
    }
    case TLM_DTYPE_Q2_K: {
        tlm_block_q2_k b;
        memcpy(&b, src, sizeof b);
        float d = tlm_f16_to_f32(b.d), dmin = tlm_f16_to_f32(b.dmin);
        for (int j = 0; j < 16; j++) {
            float dl = d * (float)(b.scales[j] & 15), ml = dmin * (float)(b.scales[j] >> 4);
            for (int e = 16 * j; e < 16 * j + 16; e++)
                y[e] = dl * (float)tlm_q23k_level(b.qs, NULL, e) - ml;
        }
        break;
    }
    case TLM_DTYPE_Q3_K: {
        tlm_block_q3_k b;
        memcpy(&b, src, sizeof b);
        float d = tlm_f16_to_f32(b.d);
        for (int j = 0; j < 16; j++) {
            float dl = d * (float)(tlm_q3k_scale(j, b.scales) - 32);
            for (int e = 16 * j; e < 16 * j + 16; e++)
                y[e] = dl * (float)tlm_q23k_level(b.qs, b.hmask, e);
        }
        break;
    }
    case TLM_DTYPE_IQ4_NL: {
        float d = tlm_f16_to_f32(rd16(src));
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)tlm_iq4nl_values[src[2 + j] & 15];
            y[j + 16] = d * (float)tlm_iq4nl_values[src[2 + j] >> 4];
        }
        break;
    }
    case TLM_DTYPE_IQ4_XS: {
        float d = tlm_f16_to_f32(rd16(src));
        for (int j = 0; j < 8; j++) {
            const uint8_t *qs = src + 8 + 16 * j;
            float dl = d * (float)(tlm_iq4xs_scale(j, src) - 32);
            for (int l = 0; l < 16; l++) {
                y[32 * j + l] = dl * (float)tlm_iq4nl_values[qs[l] & 15];
                y[32 * j + l + 16] = dl * (float)tlm_iq4nl_values[qs[l] >> 4];
            }
        }
        break;
    }
    default: break;
    }
}

tlm_status tlm_dtype_to_f32(tlm_dtype t, const void *src, float *dst, size_t n) {
    const uint8_t *p = src;
    switch (t) {
    case TLM_DTYPE_F32: memcpy(dst, p, n * sizeof(float)); return TLM_OK;
    case TLM_DTYPE_F16:
        for (size_t i = 0; i < n; i++) dst[i] = tlm_f16_to_f32(rd16(p + 2 * i));
        return TLM_OK;
    case TLM_DTYPE_BF16:
        for (size_t i = 0; i < n; i++) dst[i] = tlm_bf16_to_f32(rd16(p + 2 * i));
        return TLM_OK;
    case TLM_DTYPE_F64:
        for (size_t i = 0; i < n; i++) {
            double v;
            memcpy(&v, p + 8 * i, 8);
            dst[i] = (float)v;
        }
        return TLM_OK;
    case TLM_DTYPE_Q8_0:
    case TLM_DTYPE_Q4_0:
    case TLM_DTYPE_Q4_1:
    case TLM_DTYPE_Q5_0:
    case TLM_DTYPE_Q5_1:
    case TLM_DTYPE_Q4_K:
    case TLM_DTYPE_Q5_K:
    case TLM_DTYPE_Q6_K:
    case TLM_DTYPE_Q2_K:
    case TLM_DTYPE_Q3_K:
    case TLM_DTYPE_IQ4_NL:
    case TLM_DTYPE_IQ4_XS: {
        const tlm_dtype_info *d = &table[t];
        if (n % d->block_elems)
            return tlm_err(TLM_ERR_ARG, "%s: %zu elements is not whole blocks", d->name, n);
        /* Blocks are copied out before use: a file's blocks need not be aligned for uint16. */
        for (size_t b = 0; b < n / d->block_elems; b++)
            widen_block(t, p + b * d->block_bytes, dst + b * d->block_elems);
        return TLM_OK;
    }
    default:
        return tlm_err(TLM_ERR_UNSUPPORTED, "%s is not a floating-point type", tlm_dtype_name(t));
    }
}
