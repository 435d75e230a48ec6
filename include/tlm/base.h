/* tlm/base.h: status codes and errors, the runtime (kernels, threads), element types. Part of
 * tlm.h, which is what programs include. */
#ifndef TLM_BASE_H
#define TLM_BASE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TLM_VERSION "0.1.0"

/* ---- errors ---------------------------------------------------------------------------------- */

typedef enum {
    TLM_OK = 0,
    TLM_ERR_ARG,         /* invalid argument (shape, range, null) */
    TLM_ERR_CONFIG,      /* impossible or malformed config */
    TLM_ERR_IO,          /* file could not be opened, read or written */
    TLM_ERR_FORMAT,      /* malformed or unsupported file content */
    TLM_ERR_NOMEM,       /* allocation failed */
    TLM_ERR_RANGE,       /* id or index out of range */
    TLM_ERR_UNSUPPORTED, /* valid request that this build does not support */
    TLM_ERR_NUMERIC,     /* NaN or Inf where a finite number was needed */
    TLM_ERR_INTERRUPTED, /* stopped on request (signal, callback) */
} tlm_status;

/* Message of the last failed call on this thread ("" if none). */
const char *tlm_last_error(void);
/* Short name of a status code, e.g. "config error". */
const char *tlm_status_name(tlm_status s);

/* ---- runtime --------------------------------------------------------------------------------- */

/* The instruction sets the kernels use on this CPU, as picked at run time from cpuid (and, in a
 * benchmark build, the TLM_ISA and TLM_AMX switches), e.g. "avx512 vnni bf16 amx-int8 amx-bf16",
 * "avx2" or "ref" (the plain C references). The string stays valid until the calling thread's next
 * call. */
const char *tlm_cpu_kernels(void);

/* Sets the thread count for both OpenMP loops and BLAS; n <= 0 means all cores. Capped at
 * OMP_THREAD_LIMIT. Process-wide: call it at start-up, not while other threads run passes. */
void tlm_threads_set(int n);
/* The count set, or OpenMP's default before any call. */
int tlm_threads_get(void);

/* ---- element types --------------------------------------------------------------------------- */

/* The one element-type enum of the library: weights, files and kernels all use it. F32, F16,
 * BF16 and the ggml block types (Q8_0 ... IQ4_XS, each laid out as GGUF files store it) are
 * weight types; F64 and the integer types appear only in files (safetensors). New values are
 * appended, so the numbers stay stable. */
typedef enum {
    TLM_DTYPE_F32 = 0,
    TLM_DTYPE_F16,
    TLM_DTYPE_BF16,
    TLM_DTYPE_Q8_0,
    TLM_DTYPE_F64,
    TLM_DTYPE_I64,
    TLM_DTYPE_I32,
    TLM_DTYPE_I16,
    TLM_DTYPE_I8,
    TLM_DTYPE_U8,
    TLM_DTYPE_BOOL,
    TLM_DTYPE_Q4_0,
    TLM_DTYPE_Q4_1,
    TLM_DTYPE_Q5_0,
    TLM_DTYPE_Q5_1,
    TLM_DTYPE_Q4_K,
    TLM_DTYPE_Q5_K,
    TLM_DTYPE_Q6_K,
    TLM_DTYPE_Q2_K,
    TLM_DTYPE_Q3_K,
    TLM_DTYPE_IQ4_NL,
    TLM_DTYPE_IQ4_XS,
    TLM_DTYPE_COUNT
} tlm_dtype;

/* "F32", "F16", "BF16", "Q8_0", ... ("?" outside the enum). */
const char *tlm_dtype_name(tlm_dtype t);

#ifdef __cplusplus
}
#endif
#endif
