/* The kernels of each instruction set as tables, one record per type, which traits.c chooses a
 * type's kernels from: the references' (ref/vec_dot_ref.c) and x86's by instruction set
 * (x86/kernel_sets.c). Private to the kernels. */
#ifndef TLM_KERNELS_QDOT_SIMD_H
#define TLM_KERNELS_QDOT_SIMD_H

#include "qdot.h"

/* One type's kernels at one instruction set; NULL where that set has none of its own. */
typedef struct {
    k_vdot_fn vec_dot;            /* one weight row x one activation row */
    k_vdot_rows_fn vec_dot_m8;    /* one weight row x up to 8 activation rows */
    k_vdot_rows3_fn vec_dot_x3m4; /* three weight rows x up to 4 activation rows */
    k_vdot_w4_fn vec_dot_x4;      /* four weight rows x one activation row, in runs */
    k_widen_kernel *widen;        /* a row to floats (core_dtype_to_f32's) */
    k_narrow_kernel *narrow;      /* floats to a row (core_dtype_from_f32's) */
    k_quantize_kernel *quantize;  /* floats to a row, with or without an importance matrix */
} k_type_kernels;

typedef struct {
    k_type_kernels type[TLM_DTYPE_COUNT];
    k_act_quantize_kernel *act_quantize[K_ACT_COUNT]; /* by k_act_kind */
    k_act_quantize_kernel *q8_0_blocks;               /* k_q8_0_blocks */
} k_isa_kernels;

extern const k_isa_kernels k_kernels_ref;
#if defined(__x86_64__) || defined(__i386__)
/* AVX-VNNI's tables only what it changes over AVX2's (where the CPU has it, k_avxvnni), and
 * AVX512_BF16's over AVX-512's (where k_cpu() says so). */
extern const k_isa_kernels k_kernels_avx2, k_kernels_avxvnni, k_kernels_avx512,
    k_kernels_avx512bf16;
#endif

/* A type's kernels at one instruction set as this CPU runs them (the overlays applied; none past
 * the CPU's level): traits.c. */
k_type_kernels k_kernels_at(tlm_dtype t, int isa);

#endif
