/* The x86 vector versions of the dot products (qdot_x86.c), private to qdot.c. */
#ifndef TLM_KERNELS_QDOT_SIMD_H
#define TLM_KERNELS_QDOT_SIMD_H

#include "qdot.h"

/* The highest K_ISA_* this CPU and OS run (K_ISA_REF on other architectures). */
int k_simd_cpu_level(void);
/* The type's version at that level, or NULL when it has none of its own. */
k_vdot_fn k_simd_vdot(tlm_dtype t, int isa);

#endif
