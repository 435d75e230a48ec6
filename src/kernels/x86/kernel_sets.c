/* The x86 kernels by instruction set (qdot_simd.h's tables), from which traits.c chooses each
 * type's: a type's entry at a set lists the kernels that set has of its own; what is missing falls
 * to a lower set or the reference as traits.h says. */
#include "kernels/qdot_simd.h"
#include "kernels/x86/vec_dot_x86.h"

#if defined(__x86_64__) || defined(__i386__)

/* AVX2 with FMA and F16C (Haswell to Zen 3, and every later x86-64 CPU). */
const k_isa_kernels k_kernels_avx2 = {
    .type =
        {
            [TLM_DTYPE_F32] = {.vec_dot_m8 = k_vec_dot_f32_f32_m8_avx2,
                               .vec_dot_x4 = k_vec_dot_f32_f32_x4_avx2},
            [TLM_DTYPE_F16] = {.vec_dot = k_vec_dot_f16_f32_avx2,
                               .vec_dot_m8 = k_vec_dot_f16_f32_m8_avx2,
                               .vec_dot_x4 = k_vec_dot_f16_f32_x4_avx2,
                               .widen = k_widen_f16_avx2,
                               .narrow = k_narrow_f16_avx2},
            [TLM_DTYPE_BF16] = {.vec_dot = k_vec_dot_bf16_bf16_avx2, .widen = k_widen_bf16_avx2},
            [TLM_DTYPE_Q8_0] = {.vec_dot = k_vec_dot_q8_0_q8_0_avx2,
                                .vec_dot_x4 = k_vec_dot_q8_0_q8_0_x4_avx2},
            [TLM_DTYPE_Q4_0] = {.vec_dot = k_vec_dot_q4_0_q8_0_avx2,
                                .vec_dot_x4 = k_vec_dot_q4_0_q8_0_x4_avx2},
            [TLM_DTYPE_IQ4_NL] = {.vec_dot = k_vec_dot_iq4_nl_q8_0_avx2,
                                  .vec_dot_x4 = k_vec_dot_iq4_nl_q8_0_x4_avx2},
            [TLM_DTYPE_Q4_1] = {.vec_dot = k_vec_dot_q4_1_q8_0_avx2},
            [TLM_DTYPE_Q5_0] = {.vec_dot = k_vec_dot_q5_0_q8_0_avx2},
            [TLM_DTYPE_Q5_1] = {.vec_dot = k_vec_dot_q5_1_q8_0_avx2},
            [TLM_DTYPE_Q2_K] = {.vec_dot = k_vec_dot_q2_K_q8_K_avx2,
                                .vec_dot_x4 = k_vec_dot_q2_K_q8_K_x4_avx2},
            [TLM_DTYPE_Q3_K] = {.vec_dot = k_vec_dot_q3_K_q8_K_avx2,
                                .vec_dot_x4 = k_vec_dot_q3_K_q8_K_x4_avx2},
            [TLM_DTYPE_Q4_K] = {.vec_dot = k_vec_dot_q4_K_q8_K_avx2,
                                .vec_dot_x4 = k_vec_dot_q4_K_q8_K_x4_avx2},
            [TLM_DTYPE_Q5_K] = {.vec_dot = k_vec_dot_q5_K_q8_K_avx2,
                                .vec_dot_x4 = k_vec_dot_q5_K_q8_K_x4_avx2},
            [TLM_DTYPE_Q6_K] = {.vec_dot = k_vec_dot_q6_K_q8_K_avx2,
                                .vec_dot_x4 = k_vec_dot_q6_K_q8_K_x4_avx2},
            [TLM_DTYPE_IQ4_XS] = {.vec_dot = k_vec_dot_iq4_xs_q8_K_avx2,
                                  .vec_dot_x4 = k_vec_dot_iq4_xs_q8_K_x4_avx2},
        },
    .act_quantize =
        {[K_ACT_Q8_0] = k_act_quantize_q8_0_avx2, [K_ACT_Q8_K] = k_act_quantize_q8_K_avx2},
};

/* AVX-VNNI over AVX2 (Intel's client cores since Alder Lake): the same int32 lanes in fewer
 * operations. */
const k_isa_kernels k_kernels_avxvnni = {
    .type =
        {
            [TLM_DTYPE_Q8_0] = {.vec_dot_x4 = k_vec_dot_q8_0_q8_0_x4_avxvnni},
            [TLM_DTYPE_Q4_0] = {.vec_dot_x4 = k_vec_dot_q4_0_q8_0_x4_avxvnni},
            [TLM_DTYPE_IQ4_NL] = {.vec_dot_x4 = k_vec_dot_iq4_nl_q8_0_x4_avxvnni},
        },
};

/* AVX-512 F, BW, VL, DQ and VNNI (Ice Lake, Zen 4 and later). BF16's one-row kernel is AVX2's
 * unless the CPU has AVX512_BF16 (below). */
const k_isa_kernels k_kernels_avx512 = {
    .type =
        {
            [TLM_DTYPE_F32] = {.vec_dot_m8 = k_vec_dot_f32_f32_m8_avx512,
                               .vec_dot_x3m4 = k_vec_dot_f32_f32_x3m4_avx512,
                               .vec_dot_x4 = k_vec_dot_f32_f32_x4_avx512},
            [TLM_DTYPE_F16] = {.vec_dot = k_vec_dot_f16_f32_avx512,
                               .vec_dot_m8 = k_vec_dot_f16_f32_m8_avx512,
                               .vec_dot_x3m4 = k_vec_dot_f16_f32_x3m4_avx512,
                               .vec_dot_x4 = k_vec_dot_f16_f32_x4_avx512},
            [TLM_DTYPE_BF16] = {.vec_dot = k_vec_dot_bf16_bf16_avx2},
            [TLM_DTYPE_Q8_0] = {.vec_dot = k_vec_dot_q8_0_q8_0_avx512,
                                .vec_dot_m8 = k_vec_dot_q8_0_q8_0_m8_avx512,
                                .vec_dot_x4 = k_vec_dot_q8_0_q8_0_x4_avx512},
            [TLM_DTYPE_Q4_0] = {.vec_dot = k_vec_dot_q4_0_q8_0_avx512,
                                .vec_dot_m8 = k_vec_dot_q4_0_q8_0_m8_avx512,
                                .vec_dot_x4 = k_vec_dot_q4_0_q8_0_x4_avx512},
            [TLM_DTYPE_IQ4_NL] = {.vec_dot = k_vec_dot_iq4_nl_q8_0_avx512,
                                  .vec_dot_m8 = k_vec_dot_iq4_nl_q8_0_m8_avx512,
                                  .vec_dot_x4 = k_vec_dot_iq4_nl_q8_0_x4_avx512,
                                  .quantize = k_quantize_iq4_nl_avx512},
            [TLM_DTYPE_Q4_1] = {.vec_dot = k_vec_dot_q4_1_q8_0_avx512},
            [TLM_DTYPE_Q5_0] = {.vec_dot = k_vec_dot_q5_0_q8_0_avx512},
            [TLM_DTYPE_Q5_1] = {.vec_dot = k_vec_dot_q5_1_q8_0_avx512},
            [TLM_DTYPE_Q2_K] = {.vec_dot = k_vec_dot_q2_K_q8_K_avx512,
                                .vec_dot_m8 = k_vec_dot_q2_K_q8_K_m8_avx512,
                                .vec_dot_x4 = k_vec_dot_q2_K_q8_K_x4_avx512},
            [TLM_DTYPE_Q3_K] = {.vec_dot = k_vec_dot_q3_K_q8_K_avx512,
                                .vec_dot_m8 = k_vec_dot_q3_K_q8_K_m8_avx512,
                                .vec_dot_x4 = k_vec_dot_q3_K_q8_K_x4_avx512},
            [TLM_DTYPE_Q4_K] = {.vec_dot = k_vec_dot_q4_K_q8_K_avx512,
                                .vec_dot_m8 = k_vec_dot_q4_K_q8_K_m8_avx512,
                                .vec_dot_x4 = k_vec_dot_q4_K_q8_K_x4_avx512},
            [TLM_DTYPE_Q5_K] = {.vec_dot = k_vec_dot_q5_K_q8_K_avx512,
                                .vec_dot_m8 = k_vec_dot_q5_K_q8_K_m8_avx512,
                                .vec_dot_x4 = k_vec_dot_q5_K_q8_K_x4_avx512},
            [TLM_DTYPE_Q6_K] = {.vec_dot = k_vec_dot_q6_K_q8_K_avx512,
                                .vec_dot_m8 = k_vec_dot_q6_K_q8_K_m8_avx512,
                                .vec_dot_x4 = k_vec_dot_q6_K_q8_K_x4_avx512},
            [TLM_DTYPE_IQ4_XS] = {.vec_dot = k_vec_dot_iq4_xs_q8_K_avx512,
                                  .vec_dot_m8 = k_vec_dot_iq4_xs_q8_K_m8_avx512,
                                  .vec_dot_x4 = k_vec_dot_iq4_xs_q8_K_x4_avx512,
                                  .quantize = k_quantize_iq4_xs_avx512},
        },
    .act_quantize = {[K_ACT_Q8_0] = k_act_quantize_q8_0_avx512,
                     [K_ACT_Q8_K] = k_act_quantize_q8_K_avx512,
                     [K_ACT_BF16] = k_act_quantize_bf16_avx512},
    .q8_0_blocks = k_q8_0_blocks_avx512,
};

/* AVX512_BF16 over AVX-512: BF16 weights against BF16-rounded activations on vdpbf16ps. */
const k_isa_kernels k_kernels_avx512bf16 = {
    .type =
        {
            [TLM_DTYPE_BF16] = {.vec_dot = k_vec_dot_bf16_bf16_avx512bf16,
                                .vec_dot_x4 = k_vec_dot_bf16_bf16_x4_avx512bf16},
        },
};

#endif
