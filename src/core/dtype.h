/* The library's one element-type table (tlm_dtype, public in tlm.h): sizes, block layout, the
 * names and ids each file format uses for it, and its reference conversions to and from floats.
 * Kernels that compute on a type directly live in src/kernels (their per-type record:
 * src/kernels/traits.h); what is here is the plain C definition of each type that loaders, the
 * quantizer and tests rely on. */
#ifndef TLM_CORE_DTYPE_H
#define TLM_CORE_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "tlm.h"

typedef struct {
    const char *name;     /* "F32", "Q8_0", ... (GGUF's and safetensors' spelling) */
    uint32_t block_elems; /* elements per block: 1 for plain types, 32 for Q8_0 */
    uint32_t block_bytes; /* bytes per block */
    int ggml;             /* ggml type id, -1 when GGUF has none */
    int is_float;         /* widens to float (weights may have it) */
    /* n elements (a whole number of blocks) to floats: ggml's dequantize_row_* (dequant.c); NULL
     * for the integer types */
    void (*to_f32)(const void *src, float *dst, size_t n);
    /* n floats (whole blocks) to the type: ggml's reference quantizers, quantize_row_*_ref
     * (quant_ref.c); NULL where nothing is written in the type (integers, F64) */
    void (*from_f32)(const float *src, void *dst, size_t n);
    /* one row of cols floats with an importance matrix's cols weights: ggml's quantize_*_impl
     * (quant_imatrix.c); NULL for the types that take none */
    void (*from_f32_imatrix)(const float *src, void *dst, size_t cols, const float *imatrix);
} core_dtype_info;

/* NULL for a value outside the enum. */
const core_dtype_info *core_dtype_get(tlm_dtype t);
/* Bytes of n elements; 0 when n is not a whole number of blocks or the product overflows. */
size_t core_dtype_bytes(tlm_dtype t, uint64_t n);
/* Maps a ggml type id or a name (safetensors' "F32", "BF16", ...) to the enum; 0 if unknown. */
int core_dtype_from_ggml(uint32_t ggml, tlm_dtype *out);
int core_dtype_from_name(const char *name, tlm_dtype *out);
/* Widens n elements (a whole number of blocks) of a float type to floats. TLM_ERR_UNSUPPORTED
 * for integer types. src needs no alignment. */
tlm_status core_dtype_to_f32(tlm_dtype t, const void *src, float *dst, size_t n);
/* The inverse: n floats (a whole number of blocks) to type t, byte for byte what ggml's reference
 * quantizers write without an importance matrix (llama-quantize's output); F16 and BF16 round to
 * nearest even. dst needs no alignment. TLM_ERR_UNSUPPORTED for non-float types and F64. */
tlm_status core_dtype_from_f32(tlm_dtype t, const float *src, void *dst, size_t n);
/* rows x cols floats into type t, row by row. With imatrix (cols weights: an importance matrix's
 * mean squared activation of each column, as llama-quantize --imatrix takes it) the types that
 * use one (core_dtype_uses_imatrix) quantize as ggml's weighted quantizers do (quantize_*_impl),
 * byte for byte; the others, or imatrix NULL, as core_dtype_from_f32. */
tlm_status core_quantize_rows(tlm_dtype t, const float *src, void *dst, size_t rows, size_t cols,
                              const float *imatrix);
/* 1 where the type has an importance-matrix quantizer (from_f32_imatrix). */
int core_dtype_uses_imatrix(tlm_dtype t);

#endif
