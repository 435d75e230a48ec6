#include "core/dtype.h"

#include <string.h>

#include "core/core.h"
#include "core/half.h"

static const tlm_dtype_info table[TLM_DTYPE_COUNT] = {
    [TLM_DTYPE_F32] = {"F32", 1, 4, 0, 1},    [TLM_DTYPE_F16] = {"F16", 1, 2, 1, 1},
    [TLM_DTYPE_BF16] = {"BF16", 1, 2, 30, 1}, [TLM_DTYPE_Q8_0] = {"Q8_0", 32, 34, 8, 1},
    [TLM_DTYPE_F64] = {"F64", 1, 8, 28, 1},   [TLM_DTYPE_I64] = {"I64", 1, 8, 27, 0},
    [TLM_DTYPE_I32] = {"I32", 1, 4, 26, 0},   [TLM_DTYPE_I16] = {"I16", 1, 2, 25, 0},
    [TLM_DTYPE_I8] = {"I8", 1, 1, 24, 0},     [TLM_DTYPE_U8] = {"U8", 1, 1, -1, 0},
    [TLM_DTYPE_BOOL] = {"BOOL", 1, 1, -1, 0},
};

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
        if (n % 32) return tlm_err(TLM_ERR_ARG, "Q8_0: %zu elements is not whole blocks", n);
        /* Blocks of 32: an f16 scale then 32 int8 quants; x = d * q. */
        for (size_t b = 0; b < n / 32; b++) {
            const uint8_t *blk = p + b * 34;
            float d = tlm_f16_to_f32(rd16(blk));
            for (int i = 0; i < 32; i++) dst[b * 32 + i] = d * (float)(int8_t)blk[2 + i];
        }
        return TLM_OK;
    default:
        return tlm_err(TLM_ERR_UNSUPPORTED, "%s is not a floating-point type", tlm_dtype_name(t));
    }
}
