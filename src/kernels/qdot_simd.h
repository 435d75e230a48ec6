/* The x86 vector versions of the dot products (qdot_x86.c), private to qdot.c. */
#ifndef TLM_KERNELS_QDOT_SIMD_H
#define TLM_KERNELS_QDOT_SIMD_H

#include "qdot.h"

/* The type's version at that level, or NULL when it has none of its own. */
k_vdot_fn k_simd_vdot(tlm_dtype t, int isa);
/* The type's several-row version at that level (qdot.h), or NULL. */
k_vdot_rows_fn k_simd_vdot_rows(tlm_dtype t, int isa);
k_vdot_rows3_fn k_simd_vdot_rows3(tlm_dtype t, int isa);
k_vdot_w4_fn k_simd_vdot_w4(tlm_dtype t, int isa);

/* k_act_quantize's row at that level (AVX-512: Q8_0, Q8_K, BF16; AVX2: Q8_0, Q8_K), byte for byte
 * the reference's; 0 where this CPU or level has none. */
int k_simd_act_quantize(k_act_kind kind, const float *x, void *xq, int n, int isa);
/* k_q8_0_blocks at AVX-512; 0 where this CPU has none. */
int k_simd_q8_0_blocks(const float *x, void *y, int n);
/* n elements of an F16 or BF16 row to floats when a vector version exists; 0 otherwise. */
int k_simd_widen(tlm_dtype t, const void *src, float *dst, int n);
/* n floats to an F16 row when a vector version exists; 0 otherwise. */
int k_simd_narrow(tlm_dtype t, const float *src, void *dst, int n);

#endif
