/* The x86 instruction sets of the kernels' vector code, one attribute each (qdot_x86.c, qgemm.c,
 * attend_row.c). Each function carries its set as a target attribute, so the files build without
 * -march flags and the caller picks by what the CPU reports (k_isa, k_simd_cpu_bf16). K_ISA_AVX512
 * means all of T5's features. Include inside an x86 guard. */
#ifndef TLM_KERNELS_SIMD_X86_H
#define TLM_KERNELS_SIMD_X86_H

#include <immintrin.h>

#define T2 __attribute__((target("avx2,fma,f16c")))
#define T5 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#define T5BF                                                                                       \
    __attribute__((                                                                                \
        target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16,avx2,fma,f16c")))

#endif
