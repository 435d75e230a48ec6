/* What the x86 vector-dot kernels share (x86/vec_dot_*.c, act_quant_x86.c, convert_avx2.c):
 * helpers every file inlines, the four-row kernels' prefetch and run of units, and the kernels'
 * declarations, named as traits.h's legend says. Include inside nothing; x86 code is guarded here.
 */
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

K_TARGET_AVX2 static inline float load_f16(const void *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

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

K_TARGET_AVX512 static inline __m512i join256(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* IQ4_NL's levels as signed bytes in every 128-bit lane, or (u8) + 128 as unsigned ones. */
K_TARGET_AVX512 static inline __m512i iq4nl_table(int u8) {
    __m128i t = _mm_loadu_si128((const __m128i *)tlm_iq4nl_values);
    if (u8) t = _mm_xor_si128(t, _mm_set1_epi8((char)0x80));
    return _mm512_broadcast_i32x4(t);
}

/* The sums of the lanes of four vectors at once (13 operations where four _mm512_reduce_add_ps
 * take about 32: a large share of a four-row unit of 256-column rows, two vector steps a row).
 * Each sum is a fixed tree over its own vector's lanes, whatever the other three hold, so a
 * kernel summing fewer rows (the one-row and few-row kernels) passes any vectors in the other
 * places and gets the same numbers as the four-row kernel. */
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
 * lets one unit's reductions overlap the next unit's loads (the 15M classifier's one-block Q6_K
 * rows: a call per unit spent a third of its samples in the last unit's sums; one thread, from
 * L3, 43.5 -> 48.2 G bytes/s). */
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

/* The L2 prefetch's distance past the L1 one: four units (16 rows of ws bytes), for rows of more
 * than 256 columns on Intel's CPUs, and with `short_too` for shorter ones as well. There (2-vCPU
 * Xeon, from memory: bench_matvec 1024 x 2816, one thread, G bytes/s, medians of 5 alternating:
 * Q4_K 11.3 -> 14.8, 8 units 14.8, 16 units 14.4; prefetcht1 alone in place of the L1 prefetch
 * 13.2-13.8) models read from memory decode 1.2-1.4x faster (a 400M-parameter model, tok/s at one
 * and two threads: Q4_K_M 55 -> 71 and 114 -> 140, Q4_0 54 -> 75 and 125 -> 158, Q8_0 33 -> 44 and
 * 64 -> 82), 110M's (partly in L3) 1.0-1.27x (Q8_0 163 -> 208 and 366 -> 415, Q6_K 272 -> 296 and
 * 549 -> 564, Q4_0 367 -> 391 and level).
 * Rows of 256 columns (15M's, which sit in L3 with the whole small model): the L1 prefetch alone, a
 * unit after next, is 1.1-1.2 KiB ahead, which the kernels reach before L3 answers; with the L2 one
 * the products run at their speed in L2 (bench_matvec 256 x 768 cycled through 3 MiB, one thread, G
 * bytes/s: Q4_K 13.9 -> 22.2, Q6_K 20.7 -> 27.0, Q5_K 15.0 -> 22.2; in L2 alone 22.7 and 28.9).
 * Those figures are this VM's L3 in its slow phase (from run to run it has two speeds); in its fast
 * one the products read 22.6 and 28.4 without the L2 prefetch and level with it, and so did whole
 * decodes. Whole decodes in the slow phase, 15M tg64, medians of 5 alternating, one and two
 * threads, tok/s: Q4_K_M 2430 -> 2594 and 4045 -> 4173, Q4_0 2358 -> 2580 and 4050 -> 4259, Q6_K
 * 2201 -> 2331 and 3860 -> 3951; those kernels take it (short_too). Q8_0, F16 and BF16 were level;
 * IQ4_NL (Q4_0's kernel) 2530 -> 2498, Q5_K_M (Q4_K's) 2421 -> 2381, Q3_K_M 2404 -> 2350 and IQ4_XS
 * 2442 -> 2391 lost at one thread, and those keep the L1 prefetch alone there (the difference
 * between a type and its kernel's other type was not found). AVX2's kernels and AMD's CPUs: not
 * measured, as before.
 */
static inline size_t prefetch_far(int n, size_t ws, int short_too) {
    return k_cpu()->amd || (n <= K_PF_FAR_MIN_COLS && !short_too) ? 0 : K_PF_FAR_ROWS * ws;
}

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

/*Q4K_TABLES*/
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
