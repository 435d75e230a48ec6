/* What the x86 kernels share (x86/vec_dot_*.c, act_quant_x86.c, convert_avx2.c): helpers every
 * file inlines, the four-row kernels' prefetch and run of units, and the kernels' declarations,
 * named as traits.h's legend says. On other architectures it declares nothing. */
#ifndef TLM_KERNELS_X86_VEC_DOT_X86_H
#define TLM_KERNELS_X86_VEC_DOT_X86_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/half.h"
#include "core/quant.h"
#include "kernels/qdot.h"

#if defined(__x86_64__) || defined(__i386__)
#include "kernels/x86/simd.h"

/* Helpers every kernel inlines: `static inline` with this attribute wherever two files use one. */
#define K_ALWAYS_INLINE __attribute__((always_inline))

/* An f16 at any alignment, widened. */
K_TARGET_AVX2 static inline float load_f16(const void *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* The sum of eight lanes: halves, then elements 0 + 2 and 1 + 3, then those two. */
K_TARGET_AVX2 static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 32 nibbles of a 32-element block: the low nibbles are elements 0-15, the high ones 16-31. */
K_TARGET_AVX2 static inline __m256i nibbles32(const uint8_t *qs) {
    __m128i q = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
}

/* Signed bytes times signed bytes, summed in pairs to int16 (|w| <= 128, |x| <= 127 so that the
 * unsigned-by-signed multiply of maddubs cannot saturate), then to int32. */
K_TARGET_AVX2 static inline __m256i dot_i8_avx2(__m256i w, __m256i x) {
    __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* The same with VNNI: |w| as unsigned bytes, x negated where w is negative. */
K_TARGET_AVX512 static inline __m256i dot_i8_vnni256(__m256i w, __m256i x) {
    __m256i sx = _mm256_mask_sub_epi8(x, _mm256_movepi8_mask(w), _mm256_setzero_si256(), x);
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(w), sx);
}

/* Two 256-bit vectors as the halves of one. */
K_TARGET_AVX512 static inline __m512i join256(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* IQ4_NL's levels as signed bytes in every 128-bit lane, or (u8) + 128 as unsigned ones. */
K_TARGET_AVX512 static inline __m512i iq4nl_table(int u8) {
    __m128i t = _mm_loadu_si128((const __m128i *)core_iq4nl_values);
    if (u8) t = _mm_xor_si128(t, _mm_set1_epi8((char)0x80));
    return _mm512_broadcast_i32x4(t);
}

/* The sums of the lanes of four vectors at once, in well under half the operations of four
 * _mm512_reduce_add_ps (a large share of a four-row unit of 256-column rows). Each sum is a fixed
 * tree over its own vector's lanes, whatever the other three hold, so a kernel summing fewer rows
 * (the one-row and few-row kernels) passes any vectors in the other places and gets the same
 * numbers as the four-row kernel. */
K_TARGET_AVX512 static inline K_ALWAYS_INLINE __m128 hsum16x4(__m512 a0, __m512 a1, __m512 a2,
                                                              __m512 a3) {
    __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
    __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
    __m512d d0 = _mm512_castps_pd(t0), d1 = _mm512_castps_pd(t1);
    /* each 128-bit lane: the four vectors' sums over that lane */
    __m512 u = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(d0, d1)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(d0, d1)));
    __m256 v = _mm256_add_ps(_mm512_castps512_ps256(u), _mm512_extractf32x8_ps(u, 1));
    return _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
}

/* hsum16x4 of up to K_VDOT_MAX_ROWS vectors into out[0 .. M). */
K_TARGET_AVX512 static inline K_ALWAYS_INLINE void hsum16_rows(const __m512 *a, int M, float *out) {
    for (int m0 = 0; m0 < M; m0 += 4) {
        __m512 v[4];
        for (int k = 0; k < 4; k++) v[k] = m0 + k < M ? a[m0 + k] : a[m0];
        float t[4];
        _mm_storeu_ps(t, hsum16x4(v[0], v[1], v[2], v[3]));
        for (int k = 0; k < 4 && m0 + k < M; k++) out[m0 + k] = t[k];
    }
}

/* A run of units of four rows (k_vdot_w4_fn): unit u is rows 4u .. 4u + 3, its prefetch 4u rows
 * on from pf. One call for the run keeps the kernel's constants in registers across units and
 * lets one unit's reductions overlap the next unit's loads, which short rows such as 15M's
 * one-block Q6_K classifier spent much of their time waiting for (build/bench_matvec from L3). */
#define X4_RUN(ATTR, name, one)                                                                    \
    ATTR void name(int n, float *s, const void *w, size_t ws, const void *xq, const void *pf,      \
                   int units) {                                                                    \
        const uint8_t *wu = w, *pu = pf;                                                           \
        for (int u = 0; u < units; u++, s += 4, wu += 4 * ws)                                      \
            one(n, s, wu, ws, xq, pu ? pu + (size_t)u * 4 * ws : NULL);                            \
    }
/* The same over a kernel shared by several types, told which by a constant last argument. */
#define X4_RUN_OF(ATTR, name, one, kind)                                                           \
    ATTR void name(int n, float *s, const void *w, size_t ws, const void *xq, const void *pf,      \
                   int units) {                                                                    \
        const uint8_t *wu = w, *pu = pf;                                                           \
        for (int u = 0; u < units; u++, s += 4, wu += 4 * ws)                                      \
            one(n, s, wu, ws, xq, pu ? pu + (size_t)u * 4 * ws : NULL, kind);                      \
    }

/* The four-row kernels' prefetch (k_vdot_w4_fn's pf): the next bytes of the unit ahead asked for
 * in step with this unit's reading, up to byte `to` of its 4 ws, so that the misses in flight stay
 * few and even rather than a burst of a whole unit's lines ahead of each call. `far` (prefetch_far)
 * asks for the same bytes that much further on into L2 as well (prefetcht1): the prefetch into L1
 * alone held each thread's misses to memory to what L1's fill buffers take, while L2 can have about
 * three times as many in flight. */
static inline void prefetch_upto(const void *pf, size_t *o, size_t to, size_t far) {
    if (!pf) return;
    for (; *o < to; *o += 64) {
        __builtin_prefetch((const char *)pf + *o, 0, 3);
        if (far) __builtin_prefetch((const char *)pf + *o + far, 0, 2);
    }
}

/* The L2 prefetch's distance past the L1 one: four units (K_PF_FAR_ROWS rows of ws bytes), for
 * rows of more than K_PF_FAR_MIN_COLS columns on Intel's CPUs, and with `short_too` for shorter
 * ones as well. Models read from memory (a 400M-parameter one, 110M partly) decode markedly faster
 * with it there (build/bench_matvec 1024 x 2816 from memory, tlm bench tg); four units ahead was
 * as good as eight and better than sixteen, and prefetcht1 alone in place of the L1 prefetch was
 * worse. Rows of 256 columns (15M's, which sit in L3 with the whole small model): the L1 prefetch
 * alone, a unit after next, is about a kilobyte ahead, which the kernels reach before L3 answers;
 * with the L2 one they run at their speed in L2 (build/bench_matvec 256 x 768 cycled through
 * 3 MiB) where the L3 is slow (the virtual machines measured have two speeds from run to run), and
 * level where it is fast. Q4_0's, Q4_K's and Q6_K's kernels take it there (short_too); the others
 * keep the L1 prefetch alone on such rows: Q8_0, F16 and BF16 were level with it, and IQ4_NL, Q5_K,
 * Q3_K and IQ4_XS, which share those kernels or their steps, lost a little at one thread (why a
 * type and its kernel's other type differ was not found). AVX2's kernels and AMD's CPUs were not
 * measured.
 */
static inline size_t prefetch_far(int n, size_t ws, int short_too) {
    return k_cpu()->amd || (n <= K_PF_FAR_MIN_COLS && !short_too) ? 0 : K_PF_FAR_ROWS * ws;
}

/* Eight BF16 values widened to floats (a shift into the high half of each lane). */
K_TARGET_AVX2 static inline __m256 load_bf16x8(const uint8_t *p) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

/* Each weight vector is loaded (and for the block types unpacked) once and multiplied into every
 * activation row's accumulators, which stay in registers: M rows cost about one row's weight
 * traffic and unpacking plus M times the activation side. The functions are inlined with M a
 * constant (ROWS_SWITCH), so the accumulator arrays are registers, not memory. */
#define ROWS_SWITCH(fn, n, M, s, w, xq, xs)                                                        \
    switch (M) {                                                                                   \
    case 1: fn(n, 1, s, w, xq, xs); break;                                                         \
    case 2: fn(n, 2, s, w, xq, xs); break;                                                         \
    case 3: fn(n, 3, s, w, xq, xs); break;                                                         \
    case 4: fn(n, 4, s, w, xq, xs); break;                                                         \
    case 5: fn(n, 5, s, w, xq, xs); break;                                                         \
    case 6: fn(n, 6, s, w, xq, xs); break;                                                         \
    case 7: fn(n, 7, s, w, xq, xs); break;                                                         \
    default: fn(n, 8, s, w, xq, xs); break;                                                        \
    }

/* Byte shuffles that unpack the 12 bytes of 6-bit scales and mins of a Q4_K / Q5_K block's
 * first 16 bytes (d, dmin, the 12 bytes) in a vector register: bytes 0-7 the 8 scales, 8-15 the 8
 * mins (x86/vec_dot_k_avx512.c's q4k_scales_avx512 says how; the AVX2 four-row kernel takes them
 * too). */
static const int8_t q4k_lo_b[16] = {4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15};
static const int8_t q4k_hi_b[16] = {-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11};
static const int8_t q4k_keep_b[16] = {63, 63, 63, 63, 15, 15, 15, 15,
                                      63, 63, 63, 63, 15, 15, 15, 15};

/* The K-type four-row kernels that step through a type's blocks by its one-row kernel's block
 * function (AVX2's and AVX-512's), told which by a constant. */
enum { KBLOCK_Q2_K, KBLOCK_Q3_K, KBLOCK_IQ4_XS };

/* ---- the kernels, by instruction set (x86/kernel_sets.c puts them in the tables) ------------- */

/* avx2 (vec_dot_avx2.c, vec_dot4_avx2.c) */
k_vdot_kernel k_vec_dot_f16_f32_avx2, k_vec_dot_bf16_bf16_avx2, k_vec_dot_q8_0_q8_0_avx2,
    k_vec_dot_q4_0_q8_0_avx2, k_vec_dot_iq4_nl_q8_0_avx2, k_vec_dot_q4_1_q8_0_avx2,
    k_vec_dot_q5_0_q8_0_avx2, k_vec_dot_q5_1_q8_0_avx2, k_vec_dot_q2_K_q8_K_avx2,
    k_vec_dot_q3_K_q8_K_avx2, k_vec_dot_q4_K_q8_K_avx2, k_vec_dot_q5_K_q8_K_avx2,
    k_vec_dot_q6_K_q8_K_avx2, k_vec_dot_iq4_xs_q8_K_avx2;
k_vdot_rows_kernel k_vec_dot_f32_f32_m8_avx2, k_vec_dot_f16_f32_m8_avx2;
k_vdot_w4_kernel k_vec_dot_f32_f32_x4_avx2, k_vec_dot_f16_f32_x4_avx2, k_vec_dot_q8_0_q8_0_x4_avx2,
    k_vec_dot_q4_0_q8_0_x4_avx2, k_vec_dot_iq4_nl_q8_0_x4_avx2, k_vec_dot_q2_K_q8_K_x4_avx2,
    k_vec_dot_q3_K_q8_K_x4_avx2, k_vec_dot_q4_K_q8_K_x4_avx2, k_vec_dot_q5_K_q8_K_x4_avx2,
    k_vec_dot_q6_K_q8_K_x4_avx2, k_vec_dot_iq4_xs_q8_K_x4_avx2;

/* avxvnni (vec_dot4_avx2.c) */
k_vdot_w4_kernel k_vec_dot_q8_0_q8_0_x4_avxvnni, k_vec_dot_q4_0_q8_0_x4_avxvnni,
    k_vec_dot_iq4_nl_q8_0_x4_avxvnni;

/* avx512 (vec_dot_float_avx512.c, vec_dot_q32_avx512.c, vec_dot_k_avx512.c) */
k_vdot_kernel k_vec_dot_f16_f32_avx512, k_vec_dot_q8_0_q8_0_avx512, k_vec_dot_q4_0_q8_0_avx512,
    k_vec_dot_iq4_nl_q8_0_avx512, k_vec_dot_q4_1_q8_0_avx512, k_vec_dot_q5_0_q8_0_avx512,
    k_vec_dot_q5_1_q8_0_avx512, k_vec_dot_q2_K_q8_K_avx512, k_vec_dot_q3_K_q8_K_avx512,
    k_vec_dot_q4_K_q8_K_avx512, k_vec_dot_q5_K_q8_K_avx512, k_vec_dot_q6_K_q8_K_avx512,
    k_vec_dot_iq4_xs_q8_K_avx512;
k_vdot_rows_kernel k_vec_dot_f32_f32_m8_avx512, k_vec_dot_f16_f32_m8_avx512,
    k_vec_dot_q8_0_q8_0_m8_avx512, k_vec_dot_q4_0_q8_0_m8_avx512, k_vec_dot_iq4_nl_q8_0_m8_avx512,
    k_vec_dot_q2_K_q8_K_m8_avx512, k_vec_dot_q3_K_q8_K_m8_avx512, k_vec_dot_q4_K_q8_K_m8_avx512,
    k_vec_dot_q5_K_q8_K_m8_avx512, k_vec_dot_q6_K_q8_K_m8_avx512, k_vec_dot_iq4_xs_q8_K_m8_avx512;
k_vdot_rows3_kernel k_vec_dot_f32_f32_x3m4_avx512, k_vec_dot_f16_f32_x3m4_avx512;
k_vdot_w4_kernel k_vec_dot_f32_f32_x4_avx512, k_vec_dot_f16_f32_x4_avx512,
    k_vec_dot_q8_0_q8_0_x4_avx512, k_vec_dot_q4_0_q8_0_x4_avx512, k_vec_dot_iq4_nl_q8_0_x4_avx512,
    k_vec_dot_q2_K_q8_K_x4_avx512, k_vec_dot_q3_K_q8_K_x4_avx512, k_vec_dot_q4_K_q8_K_x4_avx512,
    k_vec_dot_q5_K_q8_K_x4_avx512, k_vec_dot_q6_K_q8_K_x4_avx512, k_vec_dot_iq4_xs_q8_K_x4_avx512;

/* avx512bf16 (vec_dot_float_avx512.c) */
k_vdot_kernel k_vec_dot_bf16_bf16_avx512bf16;
k_vdot_w4_kernel k_vec_dot_bf16_bf16_x4_avx512bf16;

/* activation rows and conversions (act_quant_x86.c, convert_avx2.c) */
k_act_quantize_kernel k_act_quantize_q8_0_avx2, k_act_quantize_q8_K_avx2,
    k_act_quantize_q8_0_avx512, k_act_quantize_q8_K_avx512, k_act_quantize_bf16_avx512,
    k_q8_0_blocks_avx512;
k_quantize_kernel k_quantize_iq4_nl_avx512, k_quantize_iq4_xs_avx512;
k_widen_kernel k_widen_f16_avx2, k_widen_bf16_avx2;
k_narrow_kernel k_narrow_f16_avx2;
#endif

#endif
