/* One record per block type: its integer form and the kernels that take it (gemm_traits.h). */
#include "kernels/gemm_traits.h"

#if K_GEMM_X86
#define PACK16_AVX512(fn) fn
#else
#define PACK16_AVX512(fn) NULL
#endif

static const k_gemm_ops gemm_ops[TLM_DTYPE_COUNT] = {
    [TLM_DTYPE_Q8_0] = {.sub = 32,
                        .maddubs_max = 0,
                        .amx_int8 = 1,
                        .pack_row = k_qgemm_pack_row_q8_0_q4_q5_ref,
                        .pack16_avx512 = PACK16_AVX512(k_qgemm_pack16_q8_0_q4_0_avx512)},
    [TLM_DTYPE_Q4_0] = {.sub = 32,
                        .maddubs_max = 15,
                        .amx_int8 = 1,
                        .pack_row = k_qgemm_pack_row_q8_0_q4_q5_ref,
                        .pack16_avx512 = PACK16_AVX512(k_qgemm_pack16_q8_0_q4_0_avx512)},
    [TLM_DTYPE_Q4_1] = {.sub = 32,
                        .maddubs_max = 15,
                        .amx_int8 = 1,
                        .pack_row = k_qgemm_pack_row_q8_0_q4_q5_ref,
                        .pack16_avx512 = NULL},
    [TLM_DTYPE_Q5_0] = {.sub = 32,
                        .maddubs_max = 31,
                        .amx_int8 = 1,
                        .pack_row = k_qgemm_pack_row_q8_0_q4_q5_ref,
                        .pack16_avx512 = NULL},
    [TLM_DTYPE_Q5_1] = {.sub = 32,
                        .maddubs_max = 31,
                        .amx_int8 = 1,
                        .pack_row = k_qgemm_pack_row_q8_0_q4_q5_ref,
                        .pack16_avx512 = NULL},
    [TLM_DTYPE_Q2_K] = {.sub = 16,
                        .maddubs_max = 3,
                        .amx_int8 = 0,
                        .pack_row = k_qgemm_pack_row_q2_K_q3_K_ref,
                        .pack16_avx512 = PACK16_AVX512(k_qgemm_pack16_q2_K_q3_K_avx512)},
    [TLM_DTYPE_Q3_K] = {.sub = 16,
                        .maddubs_max = 7,
                        .amx_int8 = 0,
                        .pack_row = k_qgemm_pack_row_q2_K_q3_K_ref,
                        .pack16_avx512 = PACK16_AVX512(k_qgemm_pack16_q2_K_q3_K_avx512)},
    [TLM_DTYPE_Q4_K] = {.sub = 32,
                        .maddubs_max = 15,
                        .amx_int8 = 1,
                        .pack_row = k_qgemm_pack_row_q4_K_q5_K_ref,
                        .pack16_avx512 = PACK16_AVX512(k_qgemm_pack16_q4_K_q5_K_avx512)},
    [TLM_DTYPE_Q5_K] = {.sub = 32,
                        .maddubs_max = 31,
                        .amx_int8 = 1,
                        .pack_row = k_qgemm_pack_row_q4_K_q5_K_ref,
                        .pack16_avx512 = PACK16_AVX512(k_qgemm_pack16_q4_K_q5_K_avx512)},
    [TLM_DTYPE_Q6_K] = {.sub = 16,
                        .maddubs_max = 63,
                        .amx_int8 = 0,
                        .pack_row = k_qgemm_pack_row_q6_K_ref,
                        .pack16_avx512 = PACK16_AVX512(k_qgemm_pack16_q6_K_avx512)},
    [TLM_DTYPE_IQ4_NL] = {.sub = 32,
                          .maddubs_max = 0,
                          .amx_int8 = 1,
                          .pack_row = k_qgemm_pack_row_iq4_nl_xs_ref,
                          .pack16_avx512 = PACK16_AVX512(k_qgemm_pack16_iq4_nl_avx512)},
    [TLM_DTYPE_IQ4_XS] = {.sub = 32,
                          .maddubs_max = 0,
                          .amx_int8 = 1,
                          .pack_row = k_qgemm_pack_row_iq4_nl_xs_ref,
                          .pack16_avx512 = PACK16_AVX512(k_qgemm_pack16_iq4_xs_avx512)},
};

const k_gemm_ops *k_gemm_ops_of(tlm_dtype t) {
    if ((unsigned)t >= TLM_DTYPE_COUNT || !gemm_ops[t].sub) return NULL;
    return &gemm_ops[t];
}
