/* The x86 instruction sets of the kernels' vector code, one attribute each (the files of x86/,
 * attend_row.c, and K_VERSIONS's loops in kernels.h). Each function carries its set as a target
 * attribute, so the files build without -march flags and the caller picks by what the CPU reports
 * (k_isa, k_cpu in cpu.h). K_ISA_AVX512 means all of K_TARGET_AVX512's features. Include inside an
 * x86 guard. */
#ifndef TLM_KERNELS_SIMD_X86_H
#define TLM_KERNELS_SIMD_X86_H

#include <immintrin.h>

#define K_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
/* AVX2 with AVX-VNNI (256-bit vpdpbusd; Intel's client cores since Alder Lake) */
#define K_TARGET_AVXVNNI __attribute__((target("avx2,fma,f16c,avxvnni")))
#define K_TARGET_AVX512                                                                            \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#define K_TARGET_AVX512BF16                                                                        \
    __attribute__((                                                                                \
        target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16,avx2,fma,f16c")))
#define K_TARGET_AMX_INT8                                                                          \
    __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,"  \
                          "fma,f16c")))
#define K_TARGET_AMX_BF16                                                                          \
    __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,"       \
                          "avx512bf16,avx2,fma,f16c")))

/* The sum of a vector's eight int32 lanes. */
K_TARGET_AVX2 static inline int k_hsum8i(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* A block of 32 floats to int8 as llama.cpp's x86 quantize_row_q8_0 rounds it (the float products
 * x * (127 / amax), each rounded to nearest even by vcvtps2dq): q[32] in element order, the four
 * vectors of int32 (for sums), and amax returned. The activation rows of decode (qdot_x86.c) and of
 * the 8-bit GEMM (qgemm.c) both. */
K_TARGET_AVX2 static inline __attribute__((always_inline)) float
k_q8_block_avx2(const float *x, int8_t *q, __m256i qi[4]) {
    const __m256 mag = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 v[4], m = _mm256_setzero_ps();
    for (int k = 0; k < 4; k++) {
        v[k] = _mm256_loadu_ps(x + 8 * k);
        m = _mm256_max_ps(m, _mm256_and_ps(v[k], mag));
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
    __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
    for (int k = 0; k < 4; k++) qi[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], id));
    /* the packs interleave the four vectors' halves by 32 bits; the permute restores the order */
    __m256i p =
        _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
    _mm256_storeu_si256((__m256i *)(void *)q,
                        _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    return amax;
}

/* 16 rows of 16 32-bit words transposed in registers: r[i] word w becomes r[w] word i (pairs of
 * words interleaved, then pairs of pairs, then 128-bit lanes twice). Floats go through it by
 * casts: the shuffles move bits only. */
K_TARGET_AVX512 static inline __attribute__((always_inline)) void k_transpose16x16(__m512i r[16]) {
    __m512i a[16], b[16];
    for (int i = 0; i < 8; i++) {
        a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    /* b[4i + c], lane L: word 4L + c of rows 4i .. 4i + 3 */
    for (int i = 0; i < 4; i++) {
        b[4 * i] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
        b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
        b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
        b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
    }
    for (int c = 0; c < 4; c++) {
        __m512i e0 = _mm512_shuffle_i32x4(b[c], b[4 + c], 0x44);
        __m512i e1 = _mm512_shuffle_i32x4(b[c], b[4 + c], 0xee);
        __m512i f0 = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0x44);
        __m512i f1 = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0xee);
        r[c] = _mm512_shuffle_i32x4(e0, f0, 0x88);
        r[4 + c] = _mm512_shuffle_i32x4(e0, f0, 0xdd);
        r[8 + c] = _mm512_shuffle_i32x4(e1, f1, 0x88);
        r[12 + c] = _mm512_shuffle_i32x4(e1, f1, 0xdd);
    }
}

/* e^x for a softmax's x <= 0 in 16 lanes, k_expf's steps (fastmath.h); a NaN stays NaN (vmaxps
 * returns its second operand when either is NaN). Below -87 the clamp gives about 1.6e-38 in place
 * of a denormal or zero, far under what a sum holding at least one e^0 can see. */
K_TARGET_AVX512 static inline __attribute__((always_inline)) __m512 k_exp16_nonpos(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(-87.0f), x);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    __m512i e =
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

#endif
