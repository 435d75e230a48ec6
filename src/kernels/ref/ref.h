/* The plain C references of the kernels (ref/vec_dot_ref.c, ref/act_quant_ref.c), named as
 * traits.h's legend says. */
#ifndef TLM_KERNELS_REF_REF_H
#define TLM_KERNELS_REF_REF_H

#include "kernels/qdot.h"

k_vdot_kernel k_vec_dot_f32_f32_ref, k_vec_dot_f16_f32_ref, k_vec_dot_bf16_bf16_ref,
    k_vec_dot_q8_0_q8_0_ref, k_vec_dot_q4_0_q8_0_ref, k_vec_dot_q4_1_q8_0_ref,
    k_vec_dot_q5_0_q8_0_ref, k_vec_dot_q5_1_q8_0_ref, k_vec_dot_iq4_nl_q8_0_ref,
    k_vec_dot_q2_K_q8_K_ref, k_vec_dot_q3_K_q8_K_ref, k_vec_dot_q4_K_q8_K_ref,
    k_vec_dot_q5_K_q8_K_ref, k_vec_dot_q6_K_q8_K_ref, k_vec_dot_iq4_xs_q8_K_ref;

/* The activation rows of each form (qdot.h's layouts), and Q8_0 blocks alone (k_q8_0_blocks). */
k_act_quantize_kernel k_act_quantize_f32_ref, k_act_quantize_bf16_ref, k_act_quantize_q8_0_ref,
    k_act_quantize_q8_K_ref;

#endif
