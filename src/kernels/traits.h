/* Each weight type's kernels in one record, chosen once for this CPU (traits.c) from the
 * instruction sets' tables (qdot_simd.h) instead of a switch over types in every dispatcher.
 *
 * Where the kernels live:
 *   ref/vec_dot_ref.c           each type's dot product in plain C, what the others must match
 *   ref/act_quant_ref.c         the activation rows' quantizers in plain C (no fused multiply-add)
 *   x86/vec_dot_avx2.c          AVX2: one weight row (and F32/F16 against several activation rows)
 *   x86/vec_dot4_avx2.c         AVX2 and AVX-VNNI: four weight rows
 *   x86/vec_dot_float_avx512.c  AVX-512: F32, F16 and BF16 (AVX512_BF16), every shape
 *   x86/vec_dot_q32_avx512.c    AVX-512: the 32-element blocks (Q8_0, Q4_0, IQ4_NL, Q4_1, Q5_*)
 *   x86/vec_dot_k_avx512.c      AVX-512: the K types (Q2_K .. Q6_K) and IQ4_XS
 *   x86/act_quant_x86.c         activation rows (AVX2, AVX-512), the KV cache's Q8_0 blocks, and
 *                               IQ4's search for weights: each byte for byte its reference
 *   x86/convert_avx2.c          F16 and BF16 rows to floats and back
 *   x86/kernel_sets.c           the x86 kernels by instruction set, as tables
 *
 * Names say what a kernel computes: k_vec_dot_<weight>_<activation>[_<shape>]_<isa>, with ggml's
 * type spellings (q4_0, q4_K, iq4_xs, ...; the activation f32, bf16, q8_0 or q8_K), e.g.
 * k_vec_dot_q4_K_q8_K_x4_avx512. Shapes:
 *   (none)  one weight row x one activation row                         k_vdot_fn
 *   m8      one weight row x up to 8 activation rows (K_VDOT_MAX_ROWS)  k_vdot_rows_fn
 *   x3m4    three weight rows x up to 4 activation rows                 k_vdot_rows3_fn
 *   x4      four weight rows x one activation row, a run of such units  k_vdot_w4_fn
 * Instruction sets: ref (plain C), avx2 (with FMA and F16C), avxvnni (AVX2 with 256-bit vpdpbusd),
 * avx512 (F, BW, VL, DQ and VNNI), avx512bf16 (and vdpbf16ps). Static helpers inside the files
 * name a type family and what they do: q45k_* (Q4_K and Q5_K), q23k_* (Q2_K and Q3_K), *_unit
 * (one unit of an x4 kernel), *_rows (the m8 body, M a constant), *_block (one block's term).
 *
 * How to add a weight type:
 *   1. src/core: its block (quant.h) and its line in CORE_BLOCK_TYPES (quant_impl.h), and its
 *      core_dtype_info in dtype.c (sizes, ggml id, the reference widening to_f32 in dequant.c,
 *      the reference quantizer from_f32 in quant_ref.c, and an importance-matrix quantizer in
 *      quant_imatrix.c if it takes one).
 *   2. traits.c: its record in `types` (the activation form its dot products meet).
 *   3. ref/vec_dot_ref.c: its dot product in plain C, in k_kernels_ref.
 *   4. x86/: its vector kernels in the file of its family and instruction set, declared in
 *      x86/vec_dot_x86.h, and in the tables of x86/kernel_sets.c. Each shape is optional: a type
 *      without a vector kernel runs its reference, without an m8 its one-row kernel per activation
 *      row, without an x4 one row at a time.
 *   5. tests/test_qk_kernels.c: the type in `types` (every kernel is then checked against the
 *      reference at every instruction set the CPU runs), and tests/test_quant.c.
 *   6. The prompt-sized products (qgemm): its record there, which `gemm` below points to. */
#ifndef TLM_KERNELS_TRAITS_H
#define TLM_KERNELS_TRAITS_H

#include "qdot.h"

struct k_gemm_ops; /* gemm_traits.h */

typedef struct {
    tlm_dtype type;
    k_act_kind act; /* the activation form its dot products meet (K_ACT_NONE: not computed on) */
    /* From this row length (columns) one sequence's rows go one at a time rather than through the
     * x4 kernel, on Intel's and on AMD's CPUs (matvec.c: a sequential stream against four). */
    int single_row_from, single_row_from_amd;
    /* The dot products at the instruction set the kernels are chosen at (k_isa under k_isa_cap):
     * the one-row kernel of the best set that has one (the reference at worst); the m8 of the
     * best set that has one, unless a higher set has a one-row kernel of its own (its sums must
     * not mix); x3m4 and x4 of that set exactly, where it has them (their sums are its one-row
     * kernel's). NULL: none. */
    k_vdot_fn vec_dot;
    k_vdot_rows_fn vec_dot_m8;
    k_vdot_rows3_fn vec_dot_x3m4;
    k_vdot_w4_fn vec_dot_x4;
    /* Row conversions at the CPU's best set (k_isa; they give their references' bytes), NULL
     * where the reference in src/core (core_dtype_to_f32, core_quantize_rows) is all there is. */
    k_widen_kernel *widen;
    k_narrow_kernel *narrow;
    k_quantize_kernel *quantize;
    /* The prompt-sized products' record of the type's repacked integer form (gemm_traits.h:
     * sub-block, packs, which micro-kernels take it); NULL for the float types. */
    const struct k_gemm_ops *gemm;
} k_type_traits;

/* The type's record as chosen for this CPU and the current caps (never NULL; a type that is not
 * computed on has act K_ACT_NONE and no kernels). */
const k_type_traits *k_traits(tlm_dtype t);
/* The record as it would be chosen with the kernels at instruction set isa (at most the CPU's),
 * conversions included: for tests, to check every kernel of every set against the reference. */
k_type_traits k_traits_at(tlm_dtype t, int isa);
/* The activation quantizer of a kind at instruction set isa (the best that set or a lower one
 * has; the reference at worst), and the one k_act_quantize runs (chosen as the dot products are).
 */
k_act_quantize_kernel *k_act_quantizer_at(k_act_kind kind, int isa);
k_act_quantize_kernel *k_act_quantizer(k_act_kind kind);
/* k_q8_0_blocks's kernel (the CPU's best). */
k_act_quantize_kernel *k_q8_0_blocks_kernel(void);

#endif
