#include "core/dtype.h"

#include <string.h>

#include "core/core.h"
#include "core/half.h"
#include "core/quant.h"
#include "core/quant_impl.h"

/* Each type: its spellings, its block, and its reference conversions (quant_impl.h lists the
 * files). A block type with an importance-matrix quantizer takes --imatrix in tlm quantize. */
#define ROWS(t) core_to_f32_##t, core_from_f32_##t
#define ROWS_IMATRIX(t) ROWS(t), core_from_f32_imatrix_##t
static const core_dtype_info table[TLM_DTYPE_COUNT] = {
    [TLM_DTYPE_F32] = {"F32", 1, 4, 0, 1, ROWS(f32), NULL},
    [TLM_DTYPE_F16] = {"F16", 1, 2, 1, 1, ROWS(f16), NULL},
    [TLM_DTYPE_BF16] = {"BF16", 1, 2, 30, 1, ROWS(bf16), NULL},
    [TLM_DTYPE_Q8_0] = {"Q8_0", CORE_QK, sizeof(core_block_q8_0), 8, 1, ROWS(q8_0), NULL},
    [TLM_DTYPE_F64] = {"F64", 1, 8, 28, 1, core_to_f32_f64, NULL, NULL},
    [TLM_DTYPE_I64] = {"I64", 1, 8, 27, 0, NULL, NULL, NULL},
    [TLM_DTYPE_I32] = {"I32", 1, 4, 26, 0, NULL, NULL, NULL},
    [TLM_DTYPE_I16] = {"I16", 1, 2, 25, 0, NULL, NULL, NULL},
    [TLM_DTYPE_I8] = {"I8", 1, 1, 24, 0, NULL, NULL, NULL},
    [TLM_DTYPE_U8] = {"U8", 1, 1, -1, 0, NULL, NULL, NULL},
    [TLM_DTYPE_BOOL] = {"BOOL", 1, 1, -1, 0, NULL, NULL, NULL},
    [TLM_DTYPE_Q4_0] = {"Q4_0", CORE_QK, sizeof(core_block_q4_0), 2, 1, ROWS_IMATRIX(q4_0)},
    [TLM_DTYPE_Q4_1] = {"Q4_1", CORE_QK, sizeof(core_block_q4_1), 3, 1, ROWS_IMATRIX(q4_1)},
    [TLM_DTYPE_Q5_0] = {"Q5_0", CORE_QK, sizeof(core_block_q5_0), 6, 1, ROWS_IMATRIX(q5_0)},
    [TLM_DTYPE_Q5_1] = {"Q5_1", CORE_QK, sizeof(core_block_q5_1), 7, 1, ROWS_IMATRIX(q5_1)},
    [TLM_DTYPE_Q4_K] = {"Q4_K", CORE_QK_K, sizeof(core_block_q4_k), 12, 1, ROWS_IMATRIX(q4_k)},
    [TLM_DTYPE_Q5_K] = {"Q5_K", CORE_QK_K, sizeof(core_block_q5_k), 13, 1, ROWS_IMATRIX(q5_k)},
    [TLM_DTYPE_Q6_K] = {"Q6_K", CORE_QK_K, sizeof(core_block_q6_k), 14, 1, ROWS_IMATRIX(q6_k)},
    [TLM_DTYPE_Q2_K] = {"Q2_K", CORE_QK_K, sizeof(core_block_q2_k), 10, 1, ROWS_IMATRIX(q2_k)},
    [TLM_DTYPE_Q3_K] = {"Q3_K", CORE_QK_K, sizeof(core_block_q3_k), 11, 1, ROWS_IMATRIX(q3_k)},
    [TLM_DTYPE_IQ4_NL] = {"IQ4_NL", CORE_QK, sizeof(core_block_iq4_nl), 20, 1,
                          ROWS_IMATRIX(iq4_nl)},
    [TLM_DTYPE_IQ4_XS] = {"IQ4_XS", CORE_QK_K, sizeof(core_block_iq4_xs), 23, 1,
                          ROWS_IMATRIX(iq4_xs)},
};
#undef ROWS_IMATRIX
#undef ROWS

const int8_t core_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                      1,    13,   25,  38,  53,  69,  89,  113};

const core_dtype_info *core_dtype_get(tlm_dtype t) {
    return (unsigned)t < TLM_DTYPE_COUNT ? &table[t] : NULL;
}

const char *tlm_dtype_name(tlm_dtype t) {
    return (unsigned)t < TLM_DTYPE_COUNT ? table[t].name : "?";
}

size_t core_dtype_bytes(tlm_dtype t, uint64_t n) {
    const core_dtype_info *d = core_dtype_get(t);
    size_t bytes;
    if (!d || n % d->block_elems || n / d->block_elems > SIZE_MAX ||
        !core_mul_ok((size_t)(n / d->block_elems), d->block_bytes, &bytes))
        return 0;
    return bytes;
}

int core_dtype_from_ggml(uint32_t ggml, tlm_dtype *out) {
    for (int i = 0; i < TLM_DTYPE_COUNT; i++)
        if (table[i].ggml >= 0 && (uint32_t)table[i].ggml == ggml) {
            *out = (tlm_dtype)i;
            return 1;
        }
    return 0;
}

int core_dtype_from_name(const char *name, tlm_dtype *out) {
    for (int i = 0; i < TLM_DTYPE_COUNT; i++)
        if (!strcmp(name, table[i].name)) {
            *out = (tlm_dtype)i;
            return 1;
        }
    return 0;
}

tlm_status core_dtype_to_f32(tlm_dtype t, const void *src, float *dst, size_t n) {
    const core_dtype_info *d = core_dtype_get(t);
    if (!d || !d->to_f32)
        return core_err(TLM_ERR_UNSUPPORTED, "%s is not a floating-point type", tlm_dtype_name(t));
    if (n % d->block_elems)
        return core_err(TLM_ERR_ARG, "%s: %zu elements is not whole blocks", d->name, n);
    d->to_f32(src, dst, n);
    return TLM_OK;
}

tlm_status core_dtype_from_f32(tlm_dtype t, const float *src, void *dst, size_t n) {
    const core_dtype_info *d = core_dtype_get(t);
    if (!d || !d->from_f32)
        return core_err(TLM_ERR_UNSUPPORTED, "cannot quantize to %s", tlm_dtype_name(t));
    if (n % d->block_elems)
        return core_err(TLM_ERR_ARG, "%s: %zu elements is not a whole number of %u-element blocks",
                        d->name, n, d->block_elems);
    d->from_f32(src, dst, n);
    return TLM_OK;
}

int core_dtype_uses_imatrix(tlm_dtype t) {
    const core_dtype_info *d = core_dtype_get(t);
    return d && d->from_f32_imatrix;
}

tlm_status core_quantize_rows(tlm_dtype t, const float *src, void *dst, size_t rows, size_t cols,
                              const float *imatrix) {
    if (!imatrix || !core_dtype_uses_imatrix(t))
        return core_dtype_from_f32(t, src, dst, rows * cols);
    const core_dtype_info *d = core_dtype_get(t);
    if (cols % d->block_elems)
        return core_err(TLM_ERR_ARG, "%s: rows of %zu elements are not whole %u-element blocks",
                        d->name, cols, d->block_elems);
    size_t row_bytes = cols / d->block_elems * d->block_bytes;
    for (size_t r = 0; r < rows; r++)
        d->from_f32_imatrix(src + r * cols, (uint8_t *)dst + r * row_bytes, cols, imatrix);
    return TLM_OK;
}
