/* Inside src/core: each type's reference conversions, which core_dtype_info holds (dtype.c's
 * table), and the fits that the reference quantizers and the importance-matrix ones share
 * (quant_fit.c). Files: dequant.c        to_f32: ggml's dequantize_row_* (and the float types'
 * widening) quant_ref.c      from_f32: ggml's quantize_row_*_ref (llama-quantize without an
 * imatrix) quant_imatrix.c  from_f32_imatrix: ggml's quantize_*_impl (with one) quant_fit.c the
 * searches and packings the two quantizers share The quantizers build with -ffp-contract=off
 * (CMakeLists.txt) to round as ggml does. */
#ifndef TLM_CORE_QUANT_IMPL_H
#define TLM_CORE_QUANT_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/quant.h"

#define GROUP_MAX_EPS 1e-15f

static inline int imin(int a, int b) { return a < b ? a : b; }
static inline int imax(int a, int b) { return a > b ? a : b; }

/* ggml's nearest_int: round half to even by adding 1.5 * 2^23 and reading the mantissa. */
static inline int nearest_int(float fval) {
    float val = fval + 12582912.f;
    int32_t i;
    memcpy(&i, &val, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

/* The fifth bits of Q5_0 and Q5_1: element j's in bit j of a little-endian uint32. */
static inline void put_qh(uint8_t qh[4], uint32_t bits) {
    for (int i = 0; i < 4; i++) qh[i] = (uint8_t)(bits >> (8 * i));
}

/* ---- each type's rows (n elements or cols, whole blocks; no alignment needed) --------------- */

#define CORE_TYPE_ROWS(t)                                                                          \
    void core_to_f32_##t(const void *src, float *dst, size_t n);                                   \
    void core_from_f32_##t(const float *src, void *dst, size_t n);
#define CORE_TYPE_ROWS_IMATRIX(t)                                                                  \
    CORE_TYPE_ROWS(t)                                                                              \
    void core_from_f32_imatrix_##t(const float *src, void *dst, size_t cols, const float *qw);
CORE_TYPE_ROWS(f32)
CORE_TYPE_ROWS(f16)
CORE_TYPE_ROWS(bf16)
CORE_TYPE_ROWS(q8_0)
CORE_TYPE_ROWS_IMATRIX(q4_0)
CORE_TYPE_ROWS_IMATRIX(q4_1)
CORE_TYPE_ROWS_IMATRIX(q5_0)
CORE_TYPE_ROWS_IMATRIX(q5_1)
CORE_TYPE_ROWS_IMATRIX(q2_k)
CORE_TYPE_ROWS_IMATRIX(q3_k)
CORE_TYPE_ROWS_IMATRIX(q4_k)
CORE_TYPE_ROWS_IMATRIX(q5_k)
CORE_TYPE_ROWS_IMATRIX(q6_k)
CORE_TYPE_ROWS_IMATRIX(iq4_nl)
CORE_TYPE_ROWS_IMATRIX(iq4_xs)
#undef CORE_TYPE_ROWS_IMATRIX
#undef CORE_TYPE_ROWS
void core_to_f32_f64(const void *src, float *dst, size_t n); /* F64 is read, never written */

/* ---- the shared fits (quant_fit.c) ----------------------------------------------------------- */

float core_make_qkx2_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L,
                            float *the_min, uint8_t *Laux, float rmin, float rdelta, int nstep,
                            int mad);
float core_make_qx_quants(int n, int nmax, const float *x, int8_t *L, const float *qw);
float core_make_q3_quants(int n, int nmax, const float *x, int8_t *L);
void core_q45k_put_scale_min(int j, uint8_t ls, uint8_t lm, uint8_t *scales12);
void core_q45k_requantize(const float *x, const uint8_t *scales12, uint16_t dd, uint16_t dmin,
                          int nmax, uint8_t *L);
void core_q5k_pack(const uint8_t *L, core_block_q5_k *y);
void core_q6k_fit(const float *x, const float *qw, core_block_q6_k *y);
void core_q23k_pack_planes(const uint8_t *L, uint8_t *qs);
void core_q3k_finish(const float *x, int8_t *L, core_block_q3_k *y);
void core_q3k_put_scale(int j, int l, uint8_t *scales);
void core_iq4_quant(const float *x, int subs, uint16_t *dh, uint8_t *q4, uint16_t *scales_h,
                    uint8_t *scales_l, const float *qw);

/* Every block type with its block's element count, for code written once per type (the row
 * conversions of dequant.c and quant_ref.c): X(name, elements per block). */
#define CORE_BLOCK_TYPES(X)                                                                        \
    X(q8_0, CORE_QK)                                                                               \
    X(q4_0, CORE_QK)                                                                               \
    X(q4_1, CORE_QK)                                                                               \
    X(q5_0, CORE_QK)                                                                               \
    X(q5_1, CORE_QK)                                                                               \
    X(q4_k, CORE_QK_K)                                                                             \
    X(q5_k, CORE_QK_K)                                                                             \
    X(q6_k, CORE_QK_K)                                                                             \
    X(q2_k, CORE_QK_K)                                                                             \
    X(q3_k, CORE_QK_K)                                                                             \
    X(iq4_nl, CORE_QK)                                                                             \
    X(iq4_xs, CORE_QK_K)

#endif
