#include <stdint.h>
#include <string.h>

#include "core/half.h"
#include "core/quant.h"
#include "qdot_simd.h"

#if defined(__x86_64__) || defined(__i386__)
#include "kernels/x86/simd.h"

/* ---- helpers -------------------------------------------------------------------------------- */

K_TARGET_AVX2 static inline float f16s(const void *p) {
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

/* The byte shuffle's index pair that copies int16 lane j (j < 8) of a 128-bit half. */
static inline short lane16(int j) { return (short)(0x0100 * (2 * j + 1) + 2 * j); }

/* 32 nibbles of a 32-element block: the low nibbles are elements 0-15, the high ones 16-31. */
K_TARGET_AVX2 static inline __m256i nibbles32(const uint8_t *qs) {
    __m128i q = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
}

/* Signed bytes times signed bytes, summed in pairs to int16 (|w| <= 128, |x| <= 127 so that the
 * unsigned-by-signed multiply of maddubs cannot saturate), then to int32. */
K_TARGET_AVX2 static inline __m256i dot_ss2(__m256i w, __m256i x) {
    __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* The same with VNNI: |w| as unsigned bytes, x negated where w is negative. */
K_TARGET_AVX512 static inline __m256i dot_ss5y(__m256i w, __m256i x) {
    __m256i sx = _mm256_mask_sub_epi8(x, _mm256_movepi8_mask(w), _mm256_setzero_si256(), x);
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(w), sx);
}

K_TARGET_AVX512 static inline __m512i join(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* IQ4_NL's levels as signed bytes in every 128-bit lane, or (u8) + 128 as unsigned ones. */
K_TARGET_AVX512 static inline __m512i iq4nl_table(int u8) {
    __m128i t = _mm_loadu_si128((const __m128i *)tlm_iq4nl_values);
    if (u8) t = _mm_xor_si128(t, _mm_set1_epi8((char)0x80));
    return _mm512_broadcast_i32x4(t);
}

#define AI __attribute__((always_inline))

/* The sums of the lanes of four vectors at once (13 operations where four _mm512_reduce_add_ps
 * take about 32: a large share of a four-row unit of 256-column rows, two vector steps a row).
 * Each sum is a fixed tree over its own vector's lanes, whatever the other three hold, so a
 * kernel summing fewer rows (the one-row and few-row kernels) passes any vectors in the other
 * places and gets the same numbers as the four-row kernel. */
K_TARGET_AVX512 static inline AI __m128 hsum16x4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
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
K_TARGET_AVX512 static inline AI void hsum16_rows(const __m512 *a, int M, float *out) {
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
#define W4_RUN(ATTR, name, one)                                                                    \
    ATTR static void name(int n, float *s, const void *w, size_t ws, const void *xq,               \
                          const void *pf, int units) {                                             \
        const uint8_t *wu = w, *pu = pf;                                                           \
        for (int u = 0; u < units; u++, s += 4, wu += 4 * ws)                                      \
            one(n, s, wu, ws, xq, pu ? pu + (size_t)u * 4 * ws : NULL);                            \
    }
/* The same over a kernel shared by several types, told which by a constant last argument. */
#define W4_RUN_OF(ATTR, name, one, kind)                                                           \
    ATTR static void name(int n, float *s, const void *w, size_t ws, const void *xq,               \
                          const void *pf, int units) {                                             \
        const uint8_t *wu = w, *pu = pf;                                                           \
        for (int u = 0; u < units; u++, s += 4, wu += 4 * ws)                                      \
            one(n, s, wu, ws, xq, pu ? pu + (size_t)u * 4 * ws : NULL, kind);                      \
    }

/* The four-row kernels' prefetch (k_vdot_w4_fn's pf): the next bytes of the unit ahead asked for
 * in step with this unit's reading, up to byte `to` of its 4 ws, so that the misses in flight stay
 * few and even rather than a burst of a whole unit's lines ahead of each call. `far` (pf_far) asks
 * for the same bytes that much further on into L2 as well (prefetcht1): the prefetch into L1 alone
 * held each thread's misses to memory to what L1's fill buffers take, while L2 can have about three
 * times as many in flight. */
static inline void pf_upto(const void *pf, size_t *o, size_t to, size_t far) {
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
static inline size_t pf_far(int n, size_t ws, int short_too) {
    return k_cpu()->amd || (n <= K_PF_FAR_MIN_COLS && !short_too) ? 0 : K_PF_FAR_ROWS * ws;
}

/* ---- F16, BF16 ------------------------------------------------------------------------------ */

K_TARGET_AVX2 static void a2_f16(int n, float *s, const void *w, const void *xq) {
    const uint8_t *a = w;
    const float *x = xq;
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + 2 * i))),
                             _mm256_loadu_ps(x + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + 2 * i + 16))),
                             _mm256_loadu_ps(x + i + 8), s1);
    }
    float r = hsum8(_mm256_add_ps(s0, s1));
    for (; i < n; i++) r += f16s(a + 2 * i) * x[i];
    *s = r;
}

K_TARGET_AVX512 static void a5_f16(int n, float *s, const void *w, const void *xq) {
    const uint8_t *a = w;
    const float *x = xq;
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(a + 2 * i))),
                             _mm512_loadu_ps(x + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(a + 2 * i + 32))),
                             _mm512_loadu_ps(x + i + 16), s1);
    }
    for (; i < n; i += 16) {
        int left = n - i < 16 ? n - i : 16;
        __mmask16 k = (__mmask16)((1u << left) - 1u);
        __m512 wv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, a + 2 * i));
        s0 = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(k, x + i), s0);
    }
    *s = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

K_TARGET_AVX2 static inline __m256 bf16x8(const uint8_t *p) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

K_TARGET_AVX2 static void a2_bf16(int n, float *s, const void *w, const void *xq) {
    const uint8_t *a = w, *x = xq;
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(bf16x8(a + 2 * i), bf16x8(x + 2 * i), s0);
        s1 = _mm256_fmadd_ps(bf16x8(a + 2 * i + 16), bf16x8(x + 2 * i + 16), s1);
    }
    float r = hsum8(_mm256_add_ps(s0, s1));
    for (; i < n; i++) {
        uint16_t p, q;
        memcpy(&p, a + 2 * i, 2);
        memcpy(&q, x + 2 * i, 2);
        uint32_t up = (uint32_t)p << 16, uq = (uint32_t)q << 16;
        float fp, fq;
        memcpy(&fp, &up, 4);
        memcpy(&fq, &uq, 4);
        r += fp * fq;
    }
    *s = r;
}

K_TARGET_AVX512BF16 static void a5_bf16(int n, float *s, const void *w, const void *xq) {
    const uint8_t *a = w, *x = xq;
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    int i = 0;
    for (; i + 64 <= n; i += 64) {
        s0 = _mm512_dpbf16_ps(s0, (__m512bh)_mm512_loadu_si512(a + 2 * i),
                              (__m512bh)_mm512_loadu_si512(x + 2 * i));
        s1 = _mm512_dpbf16_ps(s1, (__m512bh)_mm512_loadu_si512(a + 2 * i + 64),
                              (__m512bh)_mm512_loadu_si512(x + 2 * i + 64));
    }
    for (; i < n; i += 32) {
        int left = n - i < 32 ? n - i : 32;
        __mmask32 k = left == 32 ? 0xFFFFFFFFu : (__mmask32)((1u << left) - 1u);
        s0 = _mm512_dpbf16_ps(s0, (__m512bh)_mm512_maskz_loadu_epi16(k, a + 2 * i),
                              (__m512bh)_mm512_maskz_loadu_epi16(k, x + 2 * i));
    }
    *s = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

/* Four BF16 rows against one activation row, a5_bf16's operations per row, the rows' chains
 * interleaved and each activation vector loaded once for the four; with the prefetch ahead that
 * units of four take (spread over the loop past 256 columns on Intel's CPUs, matvec.c). 1 thread,
 * four alternating runs: 15M 770 -> 1123 tok/s (llama.cpp 890), 110M 81 -> 103 (93); 2 threads 15M
 * 1013 -> 1610 (1014), 110M 153 -> 183 (173). */
K_TARGET_AVX512BF16 static inline AI void w4one_bf16(int n, float *s, const void *w, size_t ws,
                                                     const void *xq, const void *pf) {
    const uint8_t *x = xq;
    const uint8_t *a[4];
    __m512 s0[4], s1[4];
    for (int r = 0; r < 4; r++) {
        a[r] = (const uint8_t *)w + r * ws;
        s0[r] = s1[r] = _mm512_setzero_ps();
    }
    int i = 0;
    size_t pfo = 0, far = pf_far(n, ws, 0);
    for (; i + 64 <= n; i += 64) {
        pf_upto(pf, &pfo, 4 * 2 * (size_t)(i + 64), far);
        __m512bh x0 = (__m512bh)_mm512_loadu_si512(x + 2 * i);
        __m512bh x1 = (__m512bh)_mm512_loadu_si512(x + 2 * i + 64);
        for (int r = 0; r < 4; r++) {
            s0[r] = _mm512_dpbf16_ps(s0[r], (__m512bh)_mm512_loadu_si512(a[r] + 2 * i), x0);
            s1[r] = _mm512_dpbf16_ps(s1[r], (__m512bh)_mm512_loadu_si512(a[r] + 2 * i + 64), x1);
        }
    }
    for (; i < n; i += 32) {
        int left = n - i < 32 ? n - i : 32;
        __mmask32 k = left == 32 ? 0xFFFFFFFFu : (__mmask32)((1u << left) - 1u);
        __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(k, x + 2 * i);
        for (int r = 0; r < 4; r++)
            s0[r] =
                _mm512_dpbf16_ps(s0[r], (__m512bh)_mm512_maskz_loadu_epi16(k, a[r] + 2 * i), xv);
    }
    for (int r = 0; r < 4; r++) s[r] = _mm512_reduce_add_ps(_mm512_add_ps(s0[r], s1[r]));
}

/* ---- Q8_0, Q4_0 ----------------------------------------------------------------------------- */

K_TARGET_AVX2 static void a2_q8_0(int n, float *s, const void *w, const void *xq) {
    const uint8_t *wb = w;
    const tlm_block_q8_0 *x = xq;
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < n / TLM_QK; b++, wb += 34) {
        __m256i p = dot_ss2(_mm256_loadu_si256((const __m256i *)(wb + 2)),
                            _mm256_loadu_si256((const __m256i *)x[b].qs));
        float d = f16s(wb) * _cvtsh_ss(x[b].d);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d), acc);
    }
    *s = hsum8(acc);
}

/* Q4_0, or IQ4_NL (nl: its nibbles looked up in the table of levels, signed bytes). */
K_TARGET_AVX2 static inline AI void a2_q4nl(int n, float *s, const void *w, const void *xq,
                                            const int nl) {
    const uint8_t *wb = w;
    const tlm_block_q8_0 *x = xq;
    const __m256i T =
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)tlm_iq4nl_values));
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < n / TLM_QK; b++, wb += 18) {
        __m256i q = nl ? _mm256_shuffle_epi8(T, nibbles32(wb + 2))
                       : _mm256_sub_epi8(nibbles32(wb + 2), _mm256_set1_epi8(8));
        __m256i p = dot_ss2(q, _mm256_loadu_si256((const __m256i *)x[b].qs));
        float d = f16s(wb) * _cvtsh_ss(x[b].d);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d), acc);
    }
    *s = hsum8(acc);
}
K_TARGET_AVX2 static void a2_q4_0(int n, float *s, const void *w, const void *xq) {
    a2_q4nl(n, s, w, xq, 0);
}
K_TARGET_AVX2 static void a2_iq4_nl(int n, float *s, const void *w, const void *xq) {
    a2_q4nl(n, s, w, xq, 1);
}

/* IQ4_XS: a sub-block (IQ4_NL's 32 values) per vector, its levels' magnitudes against the
 * activation with the levels' signs, in int16 pairs, then its scale as an int16 madd. */
K_TARGET_AVX2 static inline AI float iq4xs_term_a2(const uint8_t *wb, const k_block_q8_k *x,
                                                   __m256i T) {
    __m256i isum = _mm256_setzero_si256();
    for (int j = 0; j < 8; j++) {
        __m256i v = _mm256_shuffle_epi8(T, nibbles32(wb + 8 + 16 * j));
        __m256i a = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * j));
        __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(v, v), _mm256_sign_epi8(a, v));
        isum = _mm256_add_epi32(
            isum, _mm256_madd_epi16(p, _mm256_set1_epi16((short)(tlm_iq4xs_scale(j, wb) - 32))));
    }
    return f16s(wb) * x->d * (float)k_hsum8i(isum);
}

K_TARGET_AVX2 static void a2_iq4_xs(int n, float *s, const void *w, const void *xq) {
    const uint8_t *wb = w;
    const k_block_q8_k *x = xq;
    const __m256i T =
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)tlm_iq4nl_values));
    float r = 0.0f;
    for (int b = 0; b < n / TLM_QK_K; b++, wb += sizeof(tlm_block_iq4_xs))
        r += iq4xs_term_a2(wb, &x[b], T);
    *s = r;
}

/* Q4_1, Q5_0, Q5_1 (the fallbacks llama.cpp's K mixes pick for rows that are not whole
 * 256-blocks), a block per 256-bit vector: the fifth bits come from the 32-bit mask qh directly
 * (element i is byte i of the nibbles), the min through the activation's block sum. */
K_TARGET_AVX512 static inline void a5_q451(int n, float *s, const void *w, const void *xq, int five,
                                           int has_min) {
    const uint8_t *wb = w;
    const tlm_block_q8_0 *x = xq;
    size_t bytes = five ? (has_min ? 24 : 22) : 20;
    int qs_at = (has_min ? 4 : 2) + (five ? 4 : 0);
    const __m256i ones = _mm256_set1_epi8(1), bit5 = _mm256_set1_epi8(0x10);
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < n / TLM_QK; b++, wb += bytes) {
        __m256i q = nibbles32(wb + qs_at);
        if (five) {
            uint32_t qh;
            memcpy(&qh, wb + (has_min ? 4 : 2), 4);
            q = _mm256_or_si256(q, _mm256_and_si256(_mm256_movm_epi8(qh), bit5));
        }
        __m256i a = _mm256_loadu_si256((const __m256i *)x[b].qs);
        float xd = _cvtsh_ss(x[b].d), d = f16s(wb) * xd;
        if (has_min) {
            __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q, a);
            __m256i sa = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, a);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d), acc);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sa), _mm256_set1_ps(f16s(wb + 2) * xd), acc);
        } else {
            __m256i p = dot_ss5y(_mm256_sub_epi8(q, bit5), a);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d), acc);
        }
    }
    *s = hsum8(acc);
}
/* Bit i of qh as byte i (0xFF or 0): byte i/8 of qh spread over 8 lanes, each testing its bit. */
K_TARGET_AVX2 static inline __m256i bits_to_bytes(uint32_t qh) {
    const __m256i spread =
        _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), spread);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

K_TARGET_AVX2 static inline void a2_q451(int n, float *s, const void *w, const void *xq, int five,
                                         int has_min) {
    const uint8_t *wb = w;
    const tlm_block_q8_0 *x = xq;
    size_t bytes = five ? (has_min ? 24 : 22) : 20;
    int qs_at = (has_min ? 4 : 2) + (five ? 4 : 0);
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1),
                  bit5 = _mm256_set1_epi8(0x10);
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < n / TLM_QK; b++, wb += bytes) {
        __m256i q = nibbles32(wb + qs_at);
        if (five) {
            uint32_t qh;
            memcpy(&qh, wb + (has_min ? 4 : 2), 4);
            q = _mm256_or_si256(q, _mm256_and_si256(bits_to_bytes(qh), bit5));
        }
        __m256i a = _mm256_loadu_si256((const __m256i *)x[b].qs);
        float xd = _cvtsh_ss(x[b].d), d = f16s(wb) * xd;
        if (has_min) {
            __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(q, a), ones16);
            __m256i sa = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, a), ones16);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d), acc);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sa), _mm256_set1_ps(f16s(wb + 2) * xd), acc);
        } else {
            __m256i p = dot_ss2(_mm256_sub_epi8(q, bit5), a);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d), acc);
        }
    }
    *s = hsum8(acc);
}
K_TARGET_AVX2 static void a2_q4_1(int n, float *s, const void *w, const void *xq) {
    a2_q451(n, s, w, xq, 0, 1);
}
K_TARGET_AVX2 static void a2_q5_0(int n, float *s, const void *w, const void *xq) {
    a2_q451(n, s, w, xq, 1, 0);
}
K_TARGET_AVX2 static void a2_q5_1(int n, float *s, const void *w, const void *xq) {
    a2_q451(n, s, w, xq, 1, 1);
}

K_TARGET_AVX512 static void a5_q4_1(int n, float *s, const void *w, const void *xq) {
    a5_q451(n, s, w, xq, 0, 1);
}
K_TARGET_AVX512 static void a5_q5_0(int n, float *s, const void *w, const void *xq) {
    a5_q451(n, s, w, xq, 1, 0);
}
K_TARGET_AVX512 static void a5_q5_1(int n, float *s, const void *w, const void *xq) {
    a5_q451(n, s, w, xq, 1, 1);
}

/* ---- Q4_K, Q5_K ----------------------------------------------------------------------------- */

/* The 8 scales and the mins' contribution (sum of mn * the activation's sums over the sub-block)
 * of one Q4_K / Q5_K super-block. */
static inline int q45k_scales(const uint8_t *scales, const int16_t *bsums, uint8_t sc[8]) {
    int summ = 0;
    for (int j = 0; j < 8; j++) {
        uint8_t mn;
        tlm_q4k_scale_min(j, scales, &sc[j], &mn);
        summ += mn * (bsums[2 * j] + bsums[2 * j + 1]);
    }
    return summ;
}

/* Sub-blocks 2g (low nibbles, fifth bit 2g of qh) and 2g + 1 (high nibbles, bit 2g + 1). */
K_TARGET_AVX2 static inline void q45k_group(const uint8_t *q, const uint8_t *qh, int g, __m256i *lo,
                                            __m256i *hi) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    __m256i v = _mm256_loadu_si256((const __m256i *)q);
    *lo = _mm256_and_si256(v, m4);
    *hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    if (qh) {
        __m256i h = _mm256_loadu_si256((const __m256i *)qh);
        __m256i h0 = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(2 * g)), one);
        __m256i h1 = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(2 * g + 1)), one);
        *lo = _mm256_or_si256(*lo, _mm256_slli_epi16(h0, 4));
        *hi = _mm256_or_si256(*hi, _mm256_slli_epi16(h1, 4));
    }
}

K_TARGET_AVX2 static void a2_q45k(int n, float *s, const void *w, const void *xq, int five) {
    const uint8_t *wb = w;
    const k_block_q8_k *x = xq;
    size_t bytes = five ? sizeof(tlm_block_q5_k) : sizeof(tlm_block_q4_k);
    __m256 acc = _mm256_setzero_ps();
    float accm = 0.0f;
    for (int b = 0; b < n / TLM_QK_K; b++, wb += bytes) {
        uint8_t sc[8];
        int summ = q45k_scales(wb + 4, x[b].bsums, sc);
        const uint8_t *qh = five ? wb + 16 : NULL, *q = wb + (five ? 48 : 16);
        __m256i isum = _mm256_setzero_si256();
        for (int g = 0; g < 4; g++) {
            __m256i lo, hi;
            q45k_group(q + 32 * g, qh, g, &lo, &hi);
            __m256i p0 =
                _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(x[b].qs + 64 * g)));
            __m256i p1 = _mm256_maddubs_epi16(
                hi, _mm256_loadu_si256((const __m256i *)(x[b].qs + 64 * g + 32)));
            isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p0, _mm256_set1_epi16(sc[2 * g])));
            isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p1, _mm256_set1_epi16(sc[2 * g + 1])));
        }
        float d = x[b].d * f16s(wb);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(d), acc);
        accm += x[b].d * f16s(wb + 2) * (float)summ;
    }
    *s = hsum8(acc) - accm;
}
K_TARGET_AVX2 static void a2_q4_k(int n, float *s, const void *w, const void *xq) {
    a2_q45k(n, s, w, xq, 0);
}
K_TARGET_AVX2 static void a2_q5_k(int n, float *s, const void *w, const void *xq) {
    a2_q45k(n, s, w, xq, 1);
}

/* The 12 bytes of 6-bit scales and mins of a Q4_K / Q5_K super-block unpacked in vector
 * registers (bytes 0-7 the 8 scales, 8-15 the 8 mins, as llama.cpp's 32-bit masks give them),
 * from the block's first 16 bytes (d, dmin, the 12 bytes): bytes 0-3 of both halves are the low 6
 * bits of scale bytes 0-3 and 4-7, bytes 4-7 take their low bits from the nibbles of scale bytes
 * 8-11 and their top two from the top bits of scale bytes 0-3 and 4-7. The shuffles' indices,
 * per 128-bit lane, serve w4_q4_k's four blocks at once too. In place of the scalar unpacking,
 * moved into a vector four words at a time (one thread, in L2, alternating: Q4_K and Q5_K 768 x
 * 768 +7%, Q4_K 768 x 32000 from memory +7-10%). */
static const int8_t q4k_lo_b[16] = {4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15};
static const int8_t q4k_hi_b[16] = {-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11};
static const int8_t q4k_keep_b[16] = {63, 63, 63, 63, 15, 15, 15, 15,
                                      63, 63, 63, 63, 15, 15, 15, 15};

K_TARGET_AVX512 static inline __m128i q4k_scales(const uint8_t *wb) {
    const __m128i v = _mm_loadu_si128((const __m128i *)wb);
    const __m128i lo = _mm_shuffle_epi8(v, _mm_loadu_si128((const __m128i *)q4k_lo_b));
    const __m128i hi = _mm_shuffle_epi8(v, _mm_loadu_si128((const __m128i *)q4k_hi_b));
    __m128i low = _mm_mask_blend_epi8(0xF000, lo, _mm_srli_epi16(lo, 4));
    low = _mm_and_si128(low, _mm_loadu_si128((const __m128i *)q4k_keep_b));
    __m128i top = _mm_srli_epi16(_mm_and_si128(hi, _mm_set1_epi8((char)0xC0)), 2);
    return _mm_or_si128(low, top);
}

/* ---- Q6_K ----------------------------------------------------------------------------------- */

/* The four 32-element runs of one 128-element half: q1..q4 of the format (0..63, offset 32 not
 * yet taken off). */
K_TARGET_AVX2 static inline void q6k_half(const uint8_t *ql, const uint8_t *qh, __m256i q[4]) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
    __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
    __m256i h = _mm256_loadu_si256((const __m256i *)qh);
    /* bits 2v, 2v + 1 of each byte of h moved to bits 4, 5 of the same byte: the 16-bit shifts
     * carry bits across the byte boundary, but the mask keeps only the byte's own */
    q[0] =
        _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(h, 4), m30));
    q[1] =
        _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(h, 2), m30));
    q[2] =
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(h, m30));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                           _mm256_and_si256(_mm256_srli_epi16(h, 2), m30));
}

/* The offset of 32: sum over sub-blocks of sc * 32 * (activation sum). */
static inline int q6k_offset(const int8_t *sc, const int16_t *bsums) {
    int c = 0;
    for (int k = 0; k < 16; k++) c += sc[k] * bsums[k];
    return 32 * c;
}

K_TARGET_AVX2 static void a2_q6_k(int n, float *s, const void *w, const void *xq) {
    const uint8_t *wb = w;
    const k_block_q8_k *x = xq;
    float r = 0.0f;
    for (int b = 0; b < n / TLM_QK_K; b++, wb += sizeof(tlm_block_q6_k)) {
        const int8_t *sc = (const int8_t *)(wb + 192);
        __m256i isum = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            __m256i q[4];
            q6k_half(wb + 64 * h, wb + 128 + 32 * h, q);
            for (int v = 0; v < 4; v++) {
                const int8_t *a = x[b].qs + 128 * h + 32 * v;
                int k = 8 * h + 2 * v; /* sub-blocks k and k + 1 */
                __m256i p = _mm256_maddubs_epi16(q[v], _mm256_loadu_si256((const __m256i *)a));
                __m256i scv = _mm256_set_m128i(_mm_set1_epi16(sc[k + 1]), _mm_set1_epi16(sc[k]));
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, scv));
            }
        }
        int total = k_hsum8i(isum) - q6k_offset(sc, x[b].bsums);
        r += x[b].d * f16s(wb + 208) * (float)total;
    }
    *s = r;
}

/* Per 64 elements one maddubs (q <= 63) and one madd by the four sub-blocks' scales as int16;
 * the offset of 32 through the activation's sums, all in vectors, floats accumulated across
 * super-blocks. */
K_TARGET_AVX512 static void a5_q6_k(int n, float *s, const void *w, const void *xq) {
    const uint8_t *wb = w;
    const k_block_q8_k *x = xq;
    /* int16 lane i of the r-th 64-element run belongs to sub-block 4r + i / 8 */
    const __m512i idx0 = _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1,
                                          1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    const __m512i four = _mm512_set1_epi16(4);
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < n / TLM_QK_K; b++, wb += sizeof(tlm_block_q6_k)) {
        __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wb + 192)));
        __m512i sc = _mm512_castsi256_si512(s16);
        __m256i off = _mm256_madd_epi16(s16, _mm256_loadu_si256((const __m256i *)x[b].bsums));
        __m512i isum = _mm512_setzero_si512(), idx = idx0;
        for (int h = 0; h < 2; h++) {
            /* q1 | q2 from the low nibbles of ql's 64 bytes, q3 | q4 from the high ones; their top
             * bits are bits 0-1 | 2-3 and 4-5 | 6-7 of qh */
            __m512i L = _mm512_loadu_si512(wb + 64 * h);
            __m256i hb = _mm256_loadu_si256((const __m256i *)(wb + 128 + 32 * h));
            __m512i H = join(hb, _mm256_srli_epi16(hb, 2));
            __m512i qv[2];
            qv[0] = _mm512_or_si512(_mm512_and_si512(L, m4),
                                    _mm512_and_si512(_mm512_slli_epi16(H, 4), m30));
            qv[1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(L, 4), m4),
                                    _mm512_and_si512(H, m30));
            for (int z = 0; z < 2; z++) {
                __m512i p =
                    _mm512_maddubs_epi16(qv[z], _mm512_loadu_si512(x[b].qs + 128 * h + 64 * z));
                isum = _mm512_dpwssd_epi32(isum, p, _mm512_permutexvar_epi16(idx, sc));
                idx = _mm512_add_epi16(idx, four);
            }
        }
        __m256i t =
            _mm256_add_epi32(_mm512_castsi512_si256(isum), _mm512_extracti64x4_epi64(isum, 1));
        t = _mm256_sub_epi32(t, _mm256_slli_epi32(off, 5));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_set1_ps(x[b].d * f16s(wb + 208)), acc);
    }
    *s = hsum8(acc);
}

/* ---- Q2_K and Q3_K ----------------------------------------------------------------------------
 */
/* Their qs hold four 2-bit planes: plane i of byte l of half h (32 bytes each) is element 32i + l
 * of the half, whose activation run is 128h + 32i; sub-block j covers 16 elements, its scale 4
 * bits (Q2_K, with a 4-bit min) or 6 (Q3_K, less 32). Q3_K's third bit of plane i is bit 4h + i
 * of hmask[l]; clear, it takes 4 off: q + 4 * hbit (0..7) goes through maddubs unsigned, and the 4
 * comes off through the activation's sums. */

/* Q3_K's sixteen scales less 32, as int16 (tlm_q3k_scale): the low four bits from bytes 0-7
 * (low nibbles for sub-blocks 0-7, high for 8-15), the top two from byte 8 + j % 4 at bit
 * 2 (j / 4). */
K_TARGET_AVX512 static inline __m256i q3k_scales16(const uint8_t *p) {
    uint64_t lo8;
    uint32_t hi4;
    memcpy(&lo8, p, 8);
    memcpy(&hi4, p + 8, 4);
    const __m128i m4 = _mm_set1_epi8(0x0F), m2 = _mm_set1_epi8(3);
    __m128i L = _mm_set1_epi64x((long long)lo8);
    __m128i lo = _mm_and_si128(_mm_mask_blend_epi8(0xFF00, L, _mm_srli_epi16(L, 4)), m4);
    __m128i H =
        _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32((int)hi4), _mm_set_epi32(6, 4, 2, 0)), m2);
    __m128i sc = _mm_or_si128(lo, _mm_slli_epi16(H, 4));
    return _mm256_sub_epi16(_mm256_cvtepu8_epi16(sc), _mm256_set1_epi16(32));
}

K_TARGET_AVX2 static inline __m256i q3k_scales16_a2(const uint8_t *p) {
    int16_t v[16];
    for (int j = 0; j < 16; j++) v[j] = (int16_t)(tlm_q3k_scale(j, p) - 32);
    return _mm256_loadu_si256((const __m256i *)v);
}

/* One block of a Q2_K or Q3_K row: the weight side (its four planes of quants, Q3_K's third bits
 * added; the sub-blocks' scales spread to their int16 lanes; the scales (Q3_K) or mins (Q2_K) as
 * int16 against the activation's sums of 16; d and dmin), unpacked once for every activation row,
 * and one activation row's step on it into acc: both halves' plane i in one register (half 0 in
 * bytes 0-31, 1 in 32-63) against the two runs, one maddubs and one madd by the four
 * sub-blocks' scales per plane. */
typedef struct {
    __m512i q[4], scp[4];
    __m256i s16;
    float d, dmin;
} q23k_w;

K_TARGET_AVX512 static inline AI void q23k_unpack(const uint8_t *wb, q23k_w *o, const int three) {
    /* int16 lane l of plane 0: sub-block l / 8 (l < 16), 8 + (l - 16) / 8 (l >= 16) */
    const __m512i idx0 = _mm512_set_epi16(9, 9, 9, 9, 9, 9, 9, 9, 8, 8, 8, 8, 8, 8, 8, 8, 1, 1, 1,
                                          1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i m3 = _mm512_set1_epi8(3), two = _mm512_set1_epi16(2), four = _mm512_set1_epi8(4);
    const size_t bytes = three ? sizeof(tlm_block_q3_k) : sizeof(tlm_block_q2_k);
    const uint8_t *qs = wb + (three ? 32 : 16);
    __m512i H = _mm512_setzero_si512(), hb = join(_mm256_set1_epi8(1), _mm256_set1_epi8(0x10));
    __m256i sc16;
    if (three) {
        sc16 = o->s16 = q3k_scales16(wb + 96);
        H = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)wb));
    } else {
        __m128i sc8 = _mm_loadu_si128((const __m128i *)wb), m4 = _mm_set1_epi8(0x0F);
        sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(sc8, m4));
        o->s16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), m4));
    }
    __m512i sc = _mm512_castsi256_si512(sc16), Q = _mm512_loadu_si512(qs), idx = idx0;
    for (int i = 0; i < 4; i++) {
        __m512i q = _mm512_and_si512(i ? _mm512_srli_epi16(Q, 2 * i) : Q, m3);
        if (three) {
            q = _mm512_mask_add_epi8(q, _mm512_test_epi8_mask(H, hb), q, four);
            hb = _mm512_add_epi8(hb, hb);
        }
        o->q[i] = q;
        o->scp[i] = _mm512_permutexvar_epi16(idx, sc);
        idx = _mm512_add_epi16(idx, two);
    }
    /* d is the block's last half (Q3_K) or last but one, before dmin (Q2_K) */
    const uint8_t *d = wb + bytes - (three ? 2 : 4);
    o->d = f16s(d);
    o->dmin = three ? 0.0f : f16s(d + 2);
}

K_TARGET_AVX512 static inline AI void q23k_step(const q23k_w *w, const k_block_q8_k *x, __m256 *acc,
                                                const int three) {
    __m256i off = _mm256_madd_epi16(w->s16, _mm256_loadu_si256((const __m256i *)x->bsums));
    __m512i isum = _mm512_setzero_si512();
    for (int i = 0; i < 4; i++) {
        __m512i a = join(_mm256_loadu_si256((const __m256i *)(x->qs + 32 * i)),
                         _mm256_loadu_si256((const __m256i *)(x->qs + 128 + 32 * i)));
        isum = _mm512_dpwssd_epi32(isum, _mm512_maddubs_epi16(w->q[i], a), w->scp[i]);
    }
    __m256i t = _mm256_add_epi32(_mm512_castsi512_si256(isum), _mm512_extracti64x4_epi64(isum, 1));
    if (three) t = _mm256_sub_epi32(t, _mm256_slli_epi32(off, 2));
    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_set1_ps(x->d * w->d), *acc);
    if (!three) /* the mins */
        *acc = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(off), _mm256_set1_ps(x->d * w->dmin), *acc);
}

K_TARGET_AVX512 static inline AI void q23k_block(const uint8_t *wb, const k_block_q8_k *x,
                                                 __m256 *acc, const int three) {
    q23k_w w;
    q23k_unpack(wb, &w, three);
    q23k_step(&w, x, acc, three);
}

/* M activation rows (stride xs bytes) against one Q2_K or Q3_K row: each block unpacked once. */
K_TARGET_AVX512 static inline AI void q23kr5(int n, const int M, float *s, const uint8_t *w,
                                             const uint8_t *xq, size_t xs, const int three) {
    const size_t bytes = three ? sizeof(tlm_block_q3_k) : sizeof(tlm_block_q2_k);
    __m256 acc[K_VDOT_MAX_ROWS];
    for (int m = 0; m < M; m++) acc[m] = _mm256_setzero_ps();
    for (int b = 0; b < n / TLM_QK_K; b++) {
        q23k_w wv;
        q23k_unpack(w + b * bytes, &wv, three);
        for (int m = 0; m < M; m++)
            q23k_step(&wv, (const k_block_q8_k *)(const void *)(xq + m * xs) + b, &acc[m], three);
    }
    for (int m = 0; m < M; m++) s[m] = hsum8(acc[m]);
}

K_TARGET_AVX512 static inline AI void a5_q23k(int n, float *s, const void *w, const void *xq,
                                              const int three) {
    const uint8_t *wb = w;
    const size_t bytes = three ? sizeof(tlm_block_q3_k) : sizeof(tlm_block_q2_k);
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < n / TLM_QK_K; b++)
        q23k_block(wb + b * bytes, (const k_block_q8_k *)xq + b, &acc, three);
    *s = hsum8(acc);
}
K_TARGET_AVX512 static void a5_q2_k(int n, float *s, const void *w, const void *xq) {
    a5_q23k(n, s, w, xq, 0);
}
K_TARGET_AVX512 static void a5_q3_k(int n, float *s, const void *w, const void *xq) {
    a5_q23k(n, s, w, xq, 1);
}

/* ---- IQ4_XS -------------------------------------------------------------------------------- */
/* An IQ4_XS block's eight scales less 32 as int16 (tlm_iq4xs_scale): the low four bits a nibble of
 * scales_l, the top two from scales_h. */
K_TARGET_AVX512 static inline __m128i iq4xs_scales16(const uint8_t *blk) {
    uint32_t l4;
    uint16_t h;
    memcpy(&h, blk + 2, 2);
    memcpy(&l4, blk + 4, 4);
    /* each byte of scales_l twice, as words: low nibble in the low byte, high in the high */
    __m128i wds = _mm_cvtepu8_epi16(
        _mm_shuffle_epi8(_mm_cvtsi32_si128((int)l4),
                         _mm_set_epi8(-1, -1, -1, -1, -1, -1, -1, -1, 3, 3, 2, 2, 1, 1, 0, 0)));
    __m128i lo = _mm_and_si128(_mm_srlv_epi16(wds, _mm_set_epi16(4, 0, 4, 0, 4, 0, 4, 0)),
                               _mm_set1_epi16(15));
    __m128i hi = _mm_and_si128(
        _mm_srlv_epi16(_mm_set1_epi16((short)h), _mm_set_epi16(14, 12, 10, 8, 6, 4, 2, 0)),
        _mm_set1_epi16(3));
    return _mm_sub_epi16(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi16(32));
}

/* One IQ4_XS block of a row into acc: per half (four sub-blocks, 64 bytes of qs) the low and the
 * high nibbles looked up as level + 128 (a byte shuffle) go unsigned into VNNI against the
 * activation's matching 16-byte runs (a qword permute of two loads), both into the same lanes (a
 * sub-block's four), which then take the sub-block's scale; the 128 comes off once per block
 * through the activation's sums of 16. */
typedef struct {
    __m512i v[4], scl[2]; /* the halves' low and high levels + 128; the lanes' scales */
    __m256i s16;          /* each scale twice, against the activation's sums of 16 */
    float d;
} iq4xs_w;

/* The weight side of one IQ4_XS block, unpacked once for every activation row. */
K_TARGET_AVX512 static inline AI void iq4xs_unpack(const uint8_t *wb, iq4xs_w *o) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), T = iq4nl_table(1);
    const __m512i i0 = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    __m128i sc = iq4xs_scales16(wb);
    __m512i sc32 = _mm512_cvtepi16_epi32(_mm256_castsi128_si256(sc));
    o->s16 = _mm256_set_m128i(_mm_unpackhi_epi16(sc, sc), _mm_unpacklo_epi16(sc, sc));
    for (int h = 0; h < 2; h++) {
        __m512i Q = _mm512_loadu_si512(wb + 8 + 64 * h);
        o->v[2 * h] = _mm512_shuffle_epi8(T, _mm512_and_si512(Q, m4));
        o->v[2 * h + 1] = _mm512_shuffle_epi8(T, _mm512_and_si512(_mm512_srli_epi16(Q, 4), m4));
        o->scl[h] = _mm512_permutexvar_epi32(_mm512_add_epi32(i0, _mm512_set1_epi32(4 * h)), sc32);
    }
    o->d = f16s(wb);
}

/* One activation row's step on an unpacked IQ4_XS block, into acc. */
K_TARGET_AVX512 static inline AI void iq4xs_step(const iq4xs_w *w, const k_block_q8_k *x,
                                                 __m256 *acc) {
    const __m512i ilo = _mm512_set_epi64(13, 12, 9, 8, 5, 4, 1, 0),
                  ihi = _mm512_set_epi64(15, 14, 11, 10, 7, 6, 3, 2);
    __m256i off = _mm256_madd_epi16(w->s16, _mm256_loadu_si256((const __m256i *)x->bsums));
    __m512i isum = _mm512_setzero_si512();
    for (int h = 0; h < 2; h++) {
        __m512i X0 = _mm512_loadu_si512(x->qs + 128 * h),
                X1 = _mm512_loadu_si512(x->qs + 128 * h + 64);
        __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w->v[2 * h],
                                        _mm512_permutex2var_epi64(X0, ilo, X1));
        p = _mm512_dpbusd_epi32(p, w->v[2 * h + 1], _mm512_permutex2var_epi64(X0, ihi, X1));
        isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(p, w->scl[h]));
    }
    __m256i t = _mm256_add_epi32(_mm512_castsi512_si256(isum), _mm512_extracti64x4_epi64(isum, 1));
    t = _mm256_sub_epi32(t, _mm256_slli_epi32(off, 7));
    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_set1_ps(x->d * w->d), *acc);
}

K_TARGET_AVX512 static inline AI void iq4xs_block(const uint8_t *wb, const k_block_q8_k *x,
                                                  __m256 *acc) {
    iq4xs_w w;
    iq4xs_unpack(wb, &w);
    iq4xs_step(&w, x, acc);
}

/* M activation rows (stride xs bytes) against one IQ4_XS row: each block unpacked once. */
K_TARGET_AVX512 static inline AI void iq4xsr5(int n, const int M, float *s, const uint8_t *w,
                                              const uint8_t *xq, size_t xs) {
    __m256 acc[K_VDOT_MAX_ROWS];
    for (int m = 0; m < M; m++) acc[m] = _mm256_setzero_ps();
    for (int b = 0; b < n / TLM_QK_K; b++) {
        iq4xs_w wv;
        iq4xs_unpack(w + b * sizeof(tlm_block_iq4_xs), &wv);
        for (int m = 0; m < M; m++)
            iq4xs_step(&wv, (const k_block_q8_k *)(const void *)(xq + m * xs) + b, &acc[m]);
    }
    for (int m = 0; m < M; m++) s[m] = hsum8(acc[m]);
}

K_TARGET_AVX512 static void a5_iq4_xs(int n, float *s, const void *w, const void *xq) {
    const uint8_t *wb = w;
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < n / TLM_QK_K; b++)
        iq4xs_block(wb + b * sizeof(tlm_block_iq4_xs), (const k_block_q8_k *)xq + b, &acc);
    *s = hsum8(acc);
}

/* AVX2: a half's plane at a time (32 bytes, two sub-blocks). */
/* One Q2_K / Q3_K super-block's term of the sum. */
K_TARGET_AVX2 static inline AI float q23k_term_a2(const uint8_t *wb, const k_block_q8_k *x,
                                                  const int three) {
    const __m256i m3 = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
    const size_t bytes = three ? sizeof(tlm_block_q3_k) : sizeof(tlm_block_q2_k);
    __m256i bsums = _mm256_loadu_si256((const __m256i *)x->bsums), sc16, off;
    const uint8_t *qs = wb + (three ? 32 : 16);
    __m256i H = _mm256_setzero_si256();
    if (three) {
        sc16 = q3k_scales16_a2(wb + 96);
        off = _mm256_slli_epi32(_mm256_madd_epi16(sc16, bsums), 2);
        H = _mm256_loadu_si256((const __m256i *)wb);
    } else {
        __m128i sc8 = _mm_loadu_si128((const __m128i *)wb), m4 = _mm_set1_epi8(0x0F);
        sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(sc8, m4));
        off = _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), m4)),
                                bsums);
    }
    /* each half's 8 scales in both 128-bit halves; sub-blocks k (low) and k + 1 (high) of a
     * step by one shuffle, as Q6_K's four-row kernel takes them */
    const __m256i halves[2] = {_mm256_permute2x128_si256(sc16, sc16, 0x00),
                               _mm256_permute2x128_si256(sc16, sc16, 0x11)};
    __m256i isum = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        __m256i Q = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
        for (int i = 0; i < 4; i++) {
            __m256i q = _mm256_and_si256(_mm256_srli_epi16(Q, 2 * i), m3);
            if (three) {
                __m256i bm = _mm256_set1_epi8((char)(1 << (4 * h + i)));
                __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(H, bm), bm);
                q = _mm256_add_epi8(q, _mm256_and_si256(set, four));
            }
            __m256i p = _mm256_maddubs_epi16(
                q, _mm256_loadu_si256((const __m256i *)(x->qs + 128 * h + 32 * i)));
            __m256i scv =
                _mm256_shuffle_epi8(halves[h], _mm256_set_m128i(_mm_set1_epi16(lane16(2 * i + 1)),
                                                                _mm_set1_epi16(lane16(2 * i))));
            isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, scv));
        }
    }
    float d = x->d * f16s(wb + bytes - 2 - (three ? 0 : 2));
    if (three) return d * (float)(k_hsum8i(isum) - k_hsum8i(off));
    return d * (float)k_hsum8i(isum) - x->d * f16s(wb + bytes - 2) * (float)k_hsum8i(off);
}

K_TARGET_AVX2 static inline AI void a2_q23k(int n, float *s, const void *w, const void *xq,
                                            const int three) {
    const uint8_t *wb = w;
    const k_block_q8_k *x = xq;
    const size_t bytes = three ? sizeof(tlm_block_q3_k) : sizeof(tlm_block_q2_k);
    float r = 0.0f;
    for (int b = 0; b < n / TLM_QK_K; b++, wb += bytes) r += q23k_term_a2(wb, &x[b], three);
    *s = r;
}
K_TARGET_AVX2 static void a2_q2_k(int n, float *s, const void *w, const void *xq) {
    a2_q23k(n, s, w, xq, 0);
}
K_TARGET_AVX2 static void a2_q3_k(int n, float *s, const void *w, const void *xq) {
    a2_q23k(n, s, w, xq, 1);
}

/* Rows of F16 and BF16 to floats for the prefill tiles (8 at a time; the reference converts one
 * element per call). */
K_TARGET_AVX2 static void widen_f16(const void *src, float *dst, int n) {
    const uint8_t *p = src;
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 2 * i))));
    for (; i < n; i++) dst[i] = f16s(p + 2 * i);
}

/* Floats to F16 (the KV cache's rows), rounding to nearest even as tlm_f32_to_f16 does. */
K_TARGET_AVX2 static void narrow_f16(const float *src, void *dst, int n) {
    uint16_t *h = dst;
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(h + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) h[i] = tlm_f32_to_f16(src[i]);
}

K_TARGET_AVX2 static void widen_bf16(const void *src, float *dst, int n) {
    const uint8_t *p = src;
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, bf16x8(p + 2 * i));
    for (; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        uint32_t u = (uint32_t)h << 16;
        memcpy(dst + i, &u, 4);
    }
}

/* ---- one weight row against several activation rows ----------------------------------------- */

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

/* One F16 row against one to four activation rows (long rows go one at a time: matvec.c's
 * one_row_from; past four rows k_matvec_parts prefetches, or k_fgemm takes them) asks for the line
 * 2 KiB ahead at each of its lines on Intel's CPUs (two to four rows, several sequences decoded
 * together, had gone without: tlm bench -b 2, 3, 4 at two threads, tok/s: 110M F16 174 -> 319,
 * 228 -> 448, 251 -> 486; 400M F16 55 -> 83, 74 -> 114, 88 -> 140; 15M 2614 -> 3145 at b2), where
 * the hardware alone kept one stream of halves to 14.5 G bytes/s on one core (110M F16, tg64,
 * 2-vCPU Xeon: 63-65 -> 75-77 tok/s at one thread, 125-129 -> 133-135 at two; 512 bytes ahead
 * 67-70, 1 KiB 72-75, 4 KiB 74-75). The bytes past the row are the next row's, or a prefetch that
 * never faults. */
#define F16_ROW_PREFETCH 2048
/* ... and the line 8 KiB ahead into L2 (prefetcht1), as the four-row kernels' pf_far: the L1
 * prefetch alone kept the misses in flight to what L1's fill buffers hold (tg, tok/s, medians
 * of 5 alternating: 110M F16 80 -> 88 at one thread, 134 -> 177 at two; 400M F16 23.7 -> 24.4 and
 * 41.0 -> 42.9; 4 KiB 164, 16 KiB 172 at two on 110M; 15M level). */
#define F16_ROW_FAR 8192

/* F32 and F16 weights against F32 rows. One row at a time reads the matrix as one sequential
 * stream (rows are contiguous), which the hardware prefetchers follow better than four
 * interleaved streams; two accumulators per activation row keep two FMA chains per row. */
K_TARGET_AVX512 static inline AI __m512 ld16_5(const uint8_t *w, int f16, int i) {
    return f16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + 2 * (size_t)i)))
               : _mm512_loadu_ps((const float *)(const void *)w + i);
}

K_TARGET_AVX512 static inline AI void fr5(int n, const int M, float *s, const uint8_t *w,
                                          const float *x, size_t xs, int f16) {
    __m512 a0[K_VDOT_MAX_ROWS], a1[K_VDOT_MAX_ROWS];
    for (int m = 0; m < M; m++) a0[m] = a1[m] = _mm512_setzero_ps();
    int i = 0, pf = f16 && M <= 4 && !k_cpu()->amd;
    for (; i + 32 <= n; i += 32) {
        if (pf) {
            _mm_prefetch((const char *)w + 2 * (size_t)i + F16_ROW_PREFETCH, _MM_HINT_T0);
            _mm_prefetch((const char *)w + 2 * (size_t)i + F16_ROW_FAR, _MM_HINT_T1);
        }
        __m512 w0 = ld16_5(w, f16, i), w1 = ld16_5(w, f16, i + 16);
        for (int m = 0; m < M; m++) {
            a0[m] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + m * xs + i), a0[m]);
            a1[m] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + m * xs + i + 16), a1[m]);
        }
    }
    for (; i < n; i += 16) {
        int left = n - i < 16 ? n - i : 16;
        __mmask16 k = (__mmask16)((1u << left) - 1u);
        __m512 wv = f16 ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, w + 2 * (size_t)i))
                        : _mm512_maskz_loadu_ps(k, (const float *)(const void *)w + i);
        for (int m = 0; m < M; m++)
            a0[m] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(k, x + m * xs + i), a0[m]);
    }
    for (int m = 0; m < M; m++) s[m] = _mm512_reduce_add_ps(_mm512_add_ps(a0[m], a1[m]));
}

/* Four F32 rows against one activation row, fr5's operations per row with M = 1, the rows' chains
 * interleaved (eight FMA chains instead of two), with the prefetch ahead that units of four take.
 * Four alternating runs: 15M 1 thread 531 -> 622 tok/s (llama.cpp 579), 2 threads 1054 -> 1104;
 * 110M, bound by memory, within noise. F16 takes it on short rows only (k_matvec_parts). */
K_TARGET_AVX512 static inline AI void fw4(int n, float *s, const uint8_t *w, size_t ws,
                                          const float *x, int f16) {
    __m512 a0[4], a1[4];
    for (int r = 0; r < 4; r++) a0[r] = a1[r] = _mm512_setzero_ps();
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 x0 = _mm512_loadu_ps(x + i), x1 = _mm512_loadu_ps(x + i + 16);
        for (int r = 0; r < 4; r++) {
            a0[r] = _mm512_fmadd_ps(ld16_5(w + r * ws, f16, i), x0, a0[r]);
            a1[r] = _mm512_fmadd_ps(ld16_5(w + r * ws, f16, i + 16), x1, a1[r]);
        }
    }
    for (; i < n; i += 16) {
        int left = n - i < 16 ? n - i : 16;
        __mmask16 k = (__mmask16)((1u << left) - 1u);
        __m512 xv = _mm512_maskz_loadu_ps(k, x + i);
        for (int r = 0; r < 4; r++) {
            const uint8_t *wr = w + r * ws;
            __m512 wv = f16 ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, wr + 2 * (size_t)i))
                            : _mm512_maskz_loadu_ps(k, (const float *)(const void *)wr + i);
            a0[r] = _mm512_fmadd_ps(wv, xv, a0[r]);
        }
    }
    for (int r = 0; r < 4; r++) s[r] = _mm512_reduce_add_ps(_mm512_add_ps(a0[r], a1[r]));
}
/* pf is ignored: k_matvec_parts prefetches float rows all at once (k_vdot_w4_fn). */
K_TARGET_AVX512 static inline AI void w4one_f32(int n, float *s, const void *w, size_t ws,
                                                const void *xq, const void *pf) {
    (void)pf;
    fw4(n, s, w, ws, (const float *)xq, 0);
}
K_TARGET_AVX512 static inline AI void w4one_f16(int n, float *s, const void *w, size_t ws,
                                                const void *xq, const void *pf) {
    (void)pf;
    fw4(n, s, w, ws, (const float *)xq, 1);
}

#define FR5_F32(n, M, s, w, xq, xs) fr5(n, M, s, w, xq, xs, 0)
#define FR5_F16(n, M, s, w, xq, xs) fr5(n, M, s, w, xq, xs, 1)
K_TARGET_AVX512 static void r5_f32(int n, int M, float *s, const void *w, const void *xq,
                                   size_t xstride) {
    ROWS_SWITCH(FR5_F32, n, M, s, (const uint8_t *)w, (const float *)xq, xstride / sizeof(float));
}
K_TARGET_AVX512 static void r5_f16(int n, int M, float *s, const void *w, const void *xq,
                                   size_t xstride) {
    ROWS_SWITCH(FR5_F16, n, M, s, (const uint8_t *)w, (const float *)xq, xstride / sizeof(float));
}

/* Three weight rows at once, in fr5's order of sums for every (row, activation row) pair: 24
 * accumulators for four activation rows, each activation vector loaded once for the three. */
K_TARGET_AVX512 static inline AI void fr5x3(int n, const int M, float *s, const uint8_t *w,
                                            size_t ws, const float *x, size_t xs, int f16) {
    __m512 a0[3][K_VDOT3_MAX_ROWS], a1[3][K_VDOT3_MAX_ROWS];
    for (int r = 0; r < 3; r++)
        for (int m = 0; m < M; m++) a0[r][m] = a1[r][m] = _mm512_setzero_ps();
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        /* a half (16 columns) at a time: 3 weight vectors and one activation vector live beside
         * the 24 sums, which leaves the compiler no reason to reload activations per row */
        __m512 wv[3];
        for (int r = 0; r < 3; r++) wv[r] = ld16_5(w + r * ws, f16, i);
        for (int m = 0; m < M; m++) {
            __m512 xv = _mm512_loadu_ps(x + m * xs + i);
            for (int r = 0; r < 3; r++) a0[r][m] = _mm512_fmadd_ps(wv[r], xv, a0[r][m]);
        }
        for (int r = 0; r < 3; r++) wv[r] = ld16_5(w + r * ws, f16, i + 16);
        for (int m = 0; m < M; m++) {
            __m512 xv = _mm512_loadu_ps(x + m * xs + i + 16);
            for (int r = 0; r < 3; r++) a1[r][m] = _mm512_fmadd_ps(wv[r], xv, a1[r][m]);
        }
    }
    for (; i < n; i += 16) {
        int left = n - i < 16 ? n - i : 16;
        __mmask16 k = (__mmask16)((1u << left) - 1u);
        for (int r = 0; r < 3; r++) {
            const uint8_t *wr = w + r * ws;
            __m512 wv = f16 ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, wr + 2 * (size_t)i))
                            : _mm512_maskz_loadu_ps(k, (const float *)(const void *)wr + i);
            for (int m = 0; m < M; m++)
                a0[r][m] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(k, x + m * xs + i), a0[r][m]);
        }
    }
    for (int r = 0; r < 3; r++)
        for (int m = 0; m < M; m++)
            s[r * M + m] = _mm512_reduce_add_ps(_mm512_add_ps(a0[r][m], a1[r][m]));
}

#define FR5X3(n, M, s, w, ws, x, xs, f16)                                                          \
    switch (M) {                                                                                   \
    case 1: fr5x3(n, 1, s, w, ws, x, xs, f16); break;                                              \
    case 2: fr5x3(n, 2, s, w, ws, x, xs, f16); break;                                              \
    case 3: fr5x3(n, 3, s, w, ws, x, xs, f16); break;                                              \
    default: fr5x3(n, 4, s, w, ws, x, xs, f16); break;                                             \
    }
K_TARGET_AVX512 static void r53_f32(int n, int M, float *s, const void *w, size_t ws,
                                    const void *xq, size_t xstride) {
    FR5X3(n, M, s, (const uint8_t *)w, ws, (const float *)xq, xstride / sizeof(float), 0);
}
K_TARGET_AVX512 static void r53_f16(int n, int M, float *s, const void *w, size_t ws,
                                    const void *xq, size_t xstride) {
    FR5X3(n, M, s, (const uint8_t *)w, ws, (const float *)xq, xstride / sizeof(float), 1);
}

/* AVX2: 16 registers, so at most four activation rows per pass over the weight row (the next
 * four read it again, from L1). */
K_TARGET_AVX2 static inline AI __m256 ld8_2(const uint8_t *w, int f16, int i) {
    return f16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 2 * (size_t)i)))
               : _mm256_loadu_ps((const float *)(const void *)w + i);
}

K_TARGET_AVX2 static inline AI void fr2(int n, const int M, float *s, const uint8_t *w,
                                        const float *x, size_t xs, int f16) {
    __m256 a0[4], a1[4];
    for (int m = 0; m < M; m++) a0[m] = a1[m] = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 w0 = ld8_2(w, f16, i), w1 = ld8_2(w, f16, i + 8);
        for (int m = 0; m < M; m++) {
            a0[m] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + m * xs + i), a0[m]);
            a1[m] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + m * xs + i + 8), a1[m]);
        }
    }
    for (int m = 0; m < M; m++) {
        float r = hsum8(_mm256_add_ps(a0[m], a1[m]));
        for (int j = i; j < n; j++) {
            float wj;
            if (f16)
                wj = f16s(w + 2 * (size_t)j);
            else
                memcpy(&wj, w + 4 * (size_t)j, 4);
            r += wj * x[m * xs + j];
        }
        s[m] = r;
    }
}

K_TARGET_AVX2 static inline AI void fr2_all(int n, int M, float *s, const uint8_t *w,
                                            const float *x, size_t xs, int f16) {
    for (int m0 = 0; m0 < M; m0 += 4) {
        int k = M - m0 < 4 ? M - m0 : 4;
        const float *xm = x + m0 * xs;
        switch (k) {
        case 1: fr2(n, 1, s + m0, w, xm, xs, f16); break;
        case 2: fr2(n, 2, s + m0, w, xm, xs, f16); break;
        case 3: fr2(n, 3, s + m0, w, xm, xs, f16); break;
        default: fr2(n, 4, s + m0, w, xm, xs, f16); break;
        }
    }
}
K_TARGET_AVX2 static void r2_f32(int n, int M, float *s, const void *w, const void *xq,
                                 size_t xstride) {
    fr2_all(n, M, s, w, xq, xstride / sizeof(float), 0);
}
K_TARGET_AVX2 static void r2_f16(int n, int M, float *s, const void *w, const void *xq,
                                 size_t xstride) {
    fr2_all(n, M, s, w, xq, xstride / sizeof(float), 1);
}

/* Q8_0, four blocks per step, two per 512-bit vector (lanes 0-7 hold the first block's sums,
 * 8-15 the second's), float accumulators until the end. The weight side (bytes, their absolute
 * values and signs; the four weight scales, gathered by one word permute from the row's own bytes)
 * is done once for all activation rows; the activation scales come four at a time from the row's
 * side arrays (k_act_q8_0_aux). */
K_TARGET_AVX512 static inline __m128 wd4_q8_0(const uint8_t *wb) {
    const __m512i idx = _mm512_zextsi128_si512(_mm_setr_epi16(0, 17, 34, 51, 0, 0, 0, 0));
    __m512i v = _mm512_permutex2var_epi16(_mm512_loadu_si512(wb), idx, _mm512_loadu_si512(wb + 64));
    return _mm_cvtph_ps(_mm512_castsi512_si128(v));
}

/* The blocks past the last whole group of four, one 256-bit block at a time, added to r: the
 * one- and four-row kernels' common tail (so that their sums agree bit for bit). */
K_TARGET_AVX512 static inline float q8_0_tail(float r, const uint8_t *wt, const tlm_block_q8_0 *x,
                                              int b, int nb) {
    for (int bt = b; bt < nb; bt++, wt += 34) {
        __m256i p = dot_ss5y(_mm256_loadu_si256((const __m256i *)(wt + 2)),
                             _mm256_loadu_si256((const __m256i *)x[bt].qs));
        r += (float)k_hsum8i(p) * (f16s(wt) * _cvtsh_ss(x[bt].d));
    }
    return r;
}
/* Q4_0's (nl: IQ4_NL's, the nibbles looked up in its table) blocks past the last whole group. */
K_TARGET_AVX512 static inline float q4_0_tail(float r, const uint8_t *wt, const tlm_block_q8_0 *x,
                                              int b, int nb, const int nl) {
    const __m256i eight = _mm256_set1_epi8(8), T = _mm512_castsi512_si256(iq4nl_table(0));
    for (int bt = b; bt < nb; bt++, wt += 18) {
        __m256i v = nl ? _mm256_shuffle_epi8(T, nibbles32(wt + 2))
                       : _mm256_sub_epi8(nibbles32(wt + 2), eight);
        __m256i p = dot_ss5y(v, _mm256_loadu_si256((const __m256i *)x[bt].qs));
        r += (float)k_hsum8i(p) * (f16s(wt) * _cvtsh_ss(x[bt].d));
    }
    return r;
}

K_TARGET_AVX512 static inline AI void q8r5(int n, const int M, float *s, const uint8_t *w,
                                           const uint8_t *xq, size_t xs) {
    const uint8_t *wb = w;
    int nb = n / TLM_QK, b = 0;
    size_t aux = k_act_q8_0_aux_at(n);
    const __m512i i01 = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i i23 = _mm512_add_epi32(i01, _mm512_set1_epi32(2));
    __m512 a0[K_VDOT_MAX_ROWS], a1[K_VDOT_MAX_ROWS];
    for (int m = 0; m < M; m++) a0[m] = a1[m] = _mm512_setzero_ps();
    for (; b + 4 <= nb; b += 4, wb += 4 * 34) {
        __m128 dw = wd4_q8_0(wb);
        __m512i w0 = join(_mm256_loadu_si256((const __m256i *)(wb + 2)),
                          _mm256_loadu_si256((const __m256i *)(wb + 36)));
        __m512i w1 = join(_mm256_loadu_si256((const __m256i *)(wb + 70)),
                          _mm256_loadu_si256((const __m256i *)(wb + 104)));
        __mmask64 n0 = _mm512_movepi8_mask(w0), n1 = _mm512_movepi8_mask(w1);
        __m512i u0 = _mm512_abs_epi8(w0), u1 = _mm512_abs_epi8(w1);
        for (int m = 0; m < M; m++) {
            const uint8_t *xm = xq + m * xs;
            const tlm_block_q8_0 *x = (const tlm_block_q8_0 *)(const void *)xm + b;
            __m128 dx = _mm_loadu_ps((const float *)(const void *)(xm + aux) + b);
            __m512 d = _mm512_castps128_ps512(_mm_mul_ps(dw, dx));
            __m512i x0 = join(_mm256_loadu_si256((const __m256i *)x[0].qs),
                              _mm256_loadu_si256((const __m256i *)x[1].qs));
            __m512i x1 = join(_mm256_loadu_si256((const __m256i *)x[2].qs),
                              _mm256_loadu_si256((const __m256i *)x[3].qs));
            x0 = _mm512_mask_sub_epi8(x0, n0, _mm512_setzero_si512(), x0);
            x1 = _mm512_mask_sub_epi8(x1, n1, _mm512_setzero_si512(), x1);
            __m512i p0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u0, x0);
            __m512i p1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u1, x1);
            a0[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p0), _mm512_permutexvar_ps(i01, d), a0[m]);
            a1[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p1), _mm512_permutexvar_ps(i23, d), a1[m]);
        }
    }
    __m512 a01[K_VDOT_MAX_ROWS];
    float sum[K_VDOT_MAX_ROWS];
    for (int m = 0; m < M; m++) a01[m] = _mm512_add_ps(a0[m], a1[m]);
    hsum16_rows(a01, M, sum);
    for (int m = 0; m < M; m++)
        s[m] = q8_0_tail(sum[m], wb, (const tlm_block_q8_0 *)(const void *)(xq + m * xs), b, nb);
}

/* Q4_0 by groups of four blocks (72 bytes). One word permute of two loads inside the group puts
 * the four blocks' qs bytes side by side; their low nibbles (elements 0-15 of each block) and high
 * ones (16-31) then go unsigned (0..15) straight into VNNI against the activation's matching
 * halves (k_act_q8_0_nib), the products starting from -8 times the activations' sums so that the
 * offset of 8 costs nothing per row. A 32-bit lane holds 8 products of one block, so the scale
 * product (weight scale x activation scale, four lanes each) applies per lane. The nibble
 * extraction of two blocks per vector (a lane insert, a variable shift, per pair of blocks) and
 * the per-activation-row joins it replaces cost about a third more operations. */
K_TARGET_AVX512 static inline AI void q4_0_group(const uint8_t *wb, __m512 *dw, __m512i *lo,
                                                 __m512i *hi) {
    /* words 9k + 1 .. 9k + 8 hold block k's qs; block 3's come from a 16-byte load of its own
     * (nothing past the group is read; a second 64-byte load across two more cache lines made
     * 2048-column rows from memory slower than the old kernel) */
    static const uint16_t iq[32] = {1,  2,  3,  4,  5,  6,  7,  8,  10, 11, 12, 13, 14, 15, 16, 17,
                                    19, 20, 21, 22, 23, 24, 25, 26, 32, 33, 34, 35, 36, 37, 38, 39};
    static const uint16_t id[16] = {0, 0, 0, 0, 9, 9, 9, 9, 18, 18, 18, 18, 27, 27, 27, 27};
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512i a = _mm512_loadu_si512(wb);
    __m512i b = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(wb + 56)));
    __m512i q = _mm512_permutex2var_epi16(a, _mm512_loadu_si512(iq), b);
    *lo = _mm512_and_si512(q, m4);
    *hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
    __m512i d = _mm512_permutexvar_epi16(
        _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)id)), a);
    *dw = _mm512_cvtph_ps(_mm512_castsi512_si256(d));
}

/* The four activation scales of a group, each over its block's four lanes. */
K_TARGET_AVX512 static inline AI __m512 q4_0_dx(const float *ad) {
    const __m512i i4 = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    return _mm512_permutexvar_ps(i4, _mm512_castps128_ps512(_mm_loadu_ps(ad)));
}

/* IQ4_NL (nl): each nibble looked up as its level + 128 (an unsigned byte), the products then
 * starting from -128 times the activations' sums, 16 times Q4_0's -8. */
K_TARGET_AVX512 static inline AI __m512 q4_0_dot(__m512 acc, __m512 dw, __m512i lo, __m512i hi,
                                                 const uint8_t *g, __m512 dx, const int nl) {
    __m512i init = _mm512_loadu_si512(g + 128);
    if (nl) {
        const __m512i T = iq4nl_table(1);
        lo = _mm512_shuffle_epi8(T, lo);
        hi = _mm512_shuffle_epi8(T, hi);
        init = _mm512_slli_epi32(init, 4);
    }
    __m512i p = _mm512_dpbusd_epi32(init, lo, _mm512_loadu_si512(g));
    p = _mm512_dpbusd_epi32(p, hi, _mm512_loadu_si512(g + 64));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dw, dx), acc);
}

K_TARGET_AVX512 static inline AI void q4r5nl(int n, const int M, float *s, const uint8_t *w,
                                             const uint8_t *xq, size_t xs, const int nl) {
    const uint8_t *wb = w;
    int nb = n / TLM_QK, b = 0;
    size_t aux = k_act_q8_0_aux_at(n), nib = k_act_q8_0_nib_at(n);
    __m512 acc[K_VDOT_MAX_ROWS];
    for (int m = 0; m < M; m++) acc[m] = _mm512_setzero_ps();
    for (; b + 4 <= nb; b += 4, wb += 4 * 18) {
        __m512 dw;
        __m512i lo, hi;
        q4_0_group(wb, &dw, &lo, &hi);
        for (int m = 0; m < M; m++) {
            const uint8_t *xm = xq + m * xs;
            __m512 dx = q4_0_dx((const float *)(const void *)(xm + aux) + b);
            acc[m] =
                q4_0_dot(acc[m], dw, lo, hi, xm + nib + (size_t)(b / 4) * K_ACT_NIB_BYTES, dx, nl);
        }
    }
    float sum[K_VDOT_MAX_ROWS];
    hsum16_rows(acc, M, sum);
    for (int m = 0; m < M; m++)
        s[m] =
            q4_0_tail(sum[m], wb, (const tlm_block_q8_0 *)(const void *)(xq + m * xs), b, nb, nl);
}
#define q4r5(n, M, s, w, xq, xs) q4r5nl(n, M, s, w, xq, xs, 0)
#define iq4nlr5(n, M, s, w, xq, xs) q4r5nl(n, M, s, w, xq, xs, 1)

/* Four Q4_0 weight rows against one activation row (decode of one sequence): q4r5's operations
 * per row with M = 1 (so bit for bit its sums), the activation's vectors loaded once for the four
 * and the rows' chains interleaved. */
K_TARGET_AVX512 static inline AI void w4one_q4nl(int n, float *s, const void *w, size_t ws,
                                                 const void *xq, const void *pf, const int nl) {
    const float *ad = k_act_q8_0_aux(xq, n);
    const uint8_t *g = k_act_q8_0_nib(xq, n);
    int nb = n / TLM_QK, b = 0;
    __m512 acc[4];
    for (int r = 0; r < 4; r++) acc[r] = _mm512_setzero_ps();
    size_t pfo = 0, far = pf_far(n, ws, !nl);
    for (; b + 4 <= nb; b += 4, g += K_ACT_NIB_BYTES) {
        pf_upto(pf, &pfo, 4 * 18 * (size_t)(b + 4), far);
        __m512 dx = q4_0_dx(ad + b);
        for (int r = 0; r < 4; r++) {
            __m512 dw;
            __m512i lo, hi;
            q4_0_group((const uint8_t *)w + r * ws + (size_t)b * 18, &dw, &lo, &hi);
            acc[r] = q4_0_dot(acc[r], dw, lo, hi, g, dx, nl);
        }
    }
    pf_upto(pf, &pfo, 4 * ws, far);
    /* Rows of whole groups (15M's 256 columns) skip the tails' set-up: 256 x 32000 from L3, one
     * thread, alternating, 34.5-36.0 -> 37.5-38.3 G bytes/s. */
    __m128 sum = hsum16x4(acc[0], acc[1], acc[2], acc[3]);
    if (b == nb) {
        _mm_storeu_ps(s, sum);
        return;
    }
    float t[4];
    _mm_storeu_ps(t, sum);
    for (int r = 0; r < 4; r++)
        s[r] = q4_0_tail(t[r], (const uint8_t *)w + r * ws + (size_t)b * 18,
                         (const tlm_block_q8_0 *)xq, b, nb, nl);
}

/* Four Q8_0 weight rows against one activation row (decode of one sequence): the activation's
 * blocks, scales and offsets are loaded and computed once for the four, and the four rows' fixed
 * costs (call, horizontal sums) overlap. Per row the same integer lane sums and the same float
 * operations in the same order as q8r5 with M = 1, so bit for bit its sums. */
K_TARGET_AVX512 static inline AI void w4one_q8_0(int n, float *s, const void *wv, size_t ws,
                                                 const void *xqv, const void *pf) {
    const uint8_t *w = wv;
    const tlm_block_q8_0 *x = xqv;
    const float *ad = k_act_q8_0_aux(xqv, n);
    int nb = n / TLM_QK, b = 0;
    const __m512i off5 = _mm512_set1_epi8((char)0x80);
    const __m512i i01 = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i i23 = _mm512_add_epi32(i01, _mm512_set1_epi32(2));
    __m512 a0[4], a1[4];
    for (int r = 0; r < 4; r++) a0[r] = a1[r] = _mm512_setzero_ps();
    size_t pfo = 0, far = pf_far(n, ws, 0);
    for (; b + 4 <= nb; b += 4) {
        pf_upto(pf, &pfo, 4 * 34 * (size_t)(b + 4), far);
        __m128 dx = _mm_loadu_ps(ad + b);
        __m512i x0 = join(_mm256_loadu_si256((const __m256i *)x[b].qs),
                          _mm256_loadu_si256((const __m256i *)x[b + 1].qs));
        __m512i x1 = join(_mm256_loadu_si256((const __m256i *)x[b + 2].qs),
                          _mm256_loadu_si256((const __m256i *)x[b + 3].qs));
        /* -128 sum x per lane, for weights w + 128 as unsigned bytes (a xor), where the one-row
         * kernel multiplies |w| by x negated where w < 0: the same integers, with one operation
         * per row instead of three. */
        __m512i e0 = _mm512_sub_epi32(_mm512_setzero_si512(),
                                      _mm512_dpbusd_epi32(_mm512_setzero_si512(), off5, x0));
        __m512i e1 = _mm512_sub_epi32(_mm512_setzero_si512(),
                                      _mm512_dpbusd_epi32(_mm512_setzero_si512(), off5, x1));
        for (int r = 0; r < 4; r++) {
            const uint8_t *wb = w + r * ws + (size_t)b * 34;
            __m512 d = _mm512_castps128_ps512(_mm_mul_ps(wd4_q8_0(wb), dx));
            __m512i w0 = join(_mm256_loadu_si256((const __m256i *)(wb + 2)),
                              _mm256_loadu_si256((const __m256i *)(wb + 36)));
            __m512i w1 = join(_mm256_loadu_si256((const __m256i *)(wb + 70)),
                              _mm256_loadu_si256((const __m256i *)(wb + 104)));
            __m512i p0 = _mm512_dpbusd_epi32(e0, _mm512_xor_si512(w0, off5), x0);
            __m512i p1 = _mm512_dpbusd_epi32(e1, _mm512_xor_si512(w1, off5), x1);
            a0[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p0), _mm512_permutexvar_ps(i01, d), a0[r]);
            a1[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p1), _mm512_permutexvar_ps(i23, d), a1[r]);
        }
    }
    pf_upto(pf, &pfo, 4 * ws, far);
    float t[4];
    _mm_storeu_ps(t, hsum16x4(_mm512_add_ps(a0[0], a1[0]), _mm512_add_ps(a0[1], a1[1]),
                              _mm512_add_ps(a0[2], a1[2]), _mm512_add_ps(a0[3], a1[3])));
    for (int r = 0; r < 4; r++) s[r] = q8_0_tail(t[r], w + r * ws + (size_t)b * 34, x, b, nb);
}

K_TARGET_AVX512 static void a5_q8_0(int n, float *s, const void *w, const void *xq) {
    q8r5(n, 1, s, w, xq, 0);
}
K_TARGET_AVX512 static void a5_q4_0(int n, float *s, const void *w, const void *xq) {
    q4r5(n, 1, s, w, xq, 0);
}
K_TARGET_AVX512 static void a5_iq4_nl(int n, float *s, const void *w, const void *xq) {
    iq4nlr5(n, 1, s, w, xq, 0);
}

K_TARGET_AVX512 static void r5_q8_0(int n, int M, float *s, const void *w, const void *xq,
                                    size_t xstride) {
    ROWS_SWITCH(q8r5, n, M, s, (const uint8_t *)w, (const uint8_t *)xq, xstride);
}
K_TARGET_AVX512 static void r5_q4_0(int n, int M, float *s, const void *w, const void *xq,
                                    size_t xstride) {
    ROWS_SWITCH(q4r5, n, M, s, (const uint8_t *)w, (const uint8_t *)xq, xstride);
}
K_TARGET_AVX512 static void r5_iq4_nl(int n, int M, float *s, const void *w, const void *xq,
                                      size_t xstride) {
    ROWS_SWITCH(iq4nlr5, n, M, s, (const uint8_t *)w, (const uint8_t *)xq, xstride);
}

/* Q4_K, Q5_K and Q6_K against several activation rows: per row the same operations in the same
 * order (so the one-row kernels are these with M = 1), with each super-block's unpacking (quants,
 * scales spread to their lanes, mins) done once for all rows. */
/* One Q4_K/Q5_K super-block's weight side (quants, scales spread to their lanes, mins), unpacked
 * once for all activation rows, and one activation row's step on it. */
typedef struct {
    __m512i qv[4], scp[4];
    __m256i mn16;
    float dw, dmin;
} q45k_w;

/* d, dmin and the mins (each twice, against the 16 sums of 16); returns the 8 scales as int16. */
K_TARGET_AVX512 static inline AI __m512i q45k_head(const uint8_t *wb, q45k_w *o) {
    __m128i sm = q4k_scales(wb);
    __m128i mn = _mm_unpackhi_epi8(_mm_unpackhi_epi64(sm, sm), _mm_unpackhi_epi64(sm, sm));
    o->mn16 = _mm256_cvtepu8_epi16(mn);
    o->dw = f16s(wb);
    o->dmin = f16s(wb + 2);
    return _mm512_castsi256_si512(_mm256_cvtepu8_epi16(sm));
}

/* hsum8 of four vectors at once, into s[0..3]: the same additions in the same order per vector
 * (halves, then elements 0+2 and 1+3, then those two), so bit for bit hsum8's sums, in under
 * half of four hsum8's operations. 256-column Q6_K rows (a one-block row: the 15M classifier)
 * spent about a tenth of their kernel in them. */
K_TARGET_AVX512 static inline AI void hsum8x4(const __m256 *a, float *s) {
    __m512 a01 = _mm512_insertf32x8(_mm512_castps256_ps512(a[0]), a[1], 1);
    __m512 a23 = _mm512_insertf32x8(_mm512_castps256_ps512(a[2]), a[3], 1);
    /* lanes: the low halves of a0..a3, then their high halves */
    __m512 lo = _mm512_shuffle_f32x4(a01, a23, 0x88), hi = _mm512_shuffle_f32x4(a01, a23, 0xDD);
    __m512 x = _mm512_add_ps(lo, hi);
    x = _mm512_add_ps(x, _mm512_shuffle_ps(x, x, 0xEE));
    x = _mm512_add_ps(x, _mm512_movehdup_ps(x));
    const __m512i first = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    _mm_storeu_ps(s, _mm512_castps512_ps128(_mm512_permutexvar_ps(first, x)));
}

/* A Q4_K/Q5_K row's sums folded to eight lanes (the halves added, the mins' sums taken off),
 * which hsum8 (one row) or hsum8x4 (four rows) then adds up. */
K_TARGET_AVX512 static inline AI __m256 q45k_fold(__m512 acc, __m256 accm) {
    __m256 lo = _mm512_castps512_ps256(acc), hi = _mm512_extractf32x8_ps(acc, 1);
    return _mm256_sub_ps(_mm256_add_ps(lo, hi), accm);
}

K_TARGET_AVX512 static inline AI float q45k_sum(__m512 acc, __m256 accm) {
    return hsum8(q45k_fold(acc, accm));
}

/* The Q4_K and Q5_K kernels' word indices and shift counts, each word a in the low 256 bits and
 * b in the high ones (WPAIR(a, b)), as tables: built in registers from immediates, the sixteen of
 * w4_q45k's loop outnumbered the registers left and the compiler rebuilt each in the loop (three
 * instructions) where one load does. Rows 0-3: the scales of sub-blocks a and a + 2 for a = 0, 1,
 * 4, 5 of one row's widened head (q4k_load; w4_q45k takes them by byte shuffles, q45k_sc_b); 4-7:
 * Q5_K's fifth-bit shifts (q5k_load), left (4, 2), (3, 1), right (0, 2), (1, 3). */
#define W16(v) v, v, v, v, v, v, v, v, v, v, v, v, v, v, v, v
#define WPAIR(a, b)                                                                                \
    { W16(a), W16(b) }
static const int16_t q45k_words[8][32]
    __attribute__((aligned(64))) = {WPAIR(0, 2), WPAIR(1, 3), WPAIR(4, 6), WPAIR(5, 7),
                                    WPAIR(4, 2), WPAIR(3, 1), WPAIR(0, 2), WPAIR(1, 3)};
#undef WPAIR
#undef W16

/* Q4_K against the activations' reordered runs (k_act_q8_k_nib): each 64-byte half of qs is one
 * load, its low nibbles runs 4h and 4h + 2, its high ones 4h + 1 and 4h + 3, instead of four
 * 32-byte loads each joined with its own shifted copy (half the operations of unpacking the
 * nibbles; one thread, alternating: four rows 2048 x 768 12.6-15.0 -> 15.8-17.7 weight GB/s, 768
 * x 2048 +2-9%, 768 x 768 unchanged, all from memory; 8 activation rows 3-8% less time). */
K_TARGET_AVX512 static inline AI void q4k_load(const uint8_t *wb, q45k_w *o) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512i sc16 = q45k_head(wb, o);
    for (int h = 0; h < 2; h++) {
        __m512i L = _mm512_loadu_si512(wb + 16 + 64 * h);
        o->qv[2 * h] = _mm512_and_si512(L, m4);
        o->qv[2 * h + 1] = _mm512_and_si512(_mm512_srli_epi16(L, 4), m4);
        o->scp[2 * h] = _mm512_permutexvar_epi16(_mm512_load_si512(q45k_words[2 * h]), sc16);
        o->scp[2 * h + 1] =
            _mm512_permutexvar_epi16(_mm512_load_si512(q45k_words[2 * h + 1]), sc16);
    }
}

/* Per 64 elements one maddubs (q <= 31, |x| <= 127: pairs fit int16) and one madd by the
 * sub-blocks' scales as int16, over xs, block b's reordered runs; the mins through the
 * activation's pair sums, in a 256-bit vector; both accumulators in floats until the end. Q4_K's
 * and Q5_K's step. */
K_TARGET_AVX512 static inline AI void q4k_step(const q45k_w *w, const k_block_q8_k *x,
                                               const int8_t *xs, __m512 *acc, __m256 *accm) {
    __m256i mterm = _mm256_madd_epi16(w->mn16, _mm256_loadu_si256((const __m256i *)x->bsums));
    __m512i isum = _mm512_setzero_si512();
    for (int g = 0; g < 4; g++) {
        __m512i p = _mm512_maddubs_epi16(w->qv[g], _mm512_loadu_si512(xs + 64 * g));
        isum = _mm512_dpwssd_epi32(isum, p, w->scp[g]);
    }
    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(x->d * w->dw), *acc);
    *accm = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mterm), _mm256_set1_ps(x->d * w->dmin), *accm);
}

/* Q5_K in Q4_K's order (q4k_load): each 64-byte half h of qs is one load, its low nibbles
 * sub-blocks 4h (bytes 0-31) and 4h + 2 (32-63), its high ones 4h + 1 and 4h + 3, as the
 * activation's reordered runs lie. Sub-block j's fifth bits are bit j of qh's 32 bytes: qh
 * broadcast to both halves, a word shift per half brings bit j to bit 4 of each byte (left by
 * 4 - j, right by j - 4; within the byte as j < 8: q5k_fifth). Against 256-bit runs unpacked one
 * at a time, each with its own shifts of qh, and the activation in the file's order: half the
 * operations (one thread, in cache, alternating, G bytes/s: 768 x 2048 21 -> 23.5, 2048 x 768
 * 23 -> 28.9). */
K_TARGET_AVX512 static inline AI void q5k_fifth(__m512i hb, int h, __m512i *qa, __m512i *qb) {
    const __m512i b4 = _mm512_set1_epi8(0x10);
    /* bits 4h | 4h + 2 and 4h + 1 | 4h + 3 to bit 4 */
    __m512i f0 = h ? _mm512_srlv_epi16(hb, _mm512_load_si512(q45k_words[6]))
                   : _mm512_sllv_epi16(hb, _mm512_load_si512(q45k_words[4]));
    __m512i f1 = h ? _mm512_srlv_epi16(hb, _mm512_load_si512(q45k_words[7]))
                   : _mm512_sllv_epi16(hb, _mm512_load_si512(q45k_words[5]));
    *qa = _mm512_or_si512(*qa, _mm512_and_si512(f0, b4));
    *qb = _mm512_or_si512(*qb, _mm512_and_si512(f1, b4));
}

K_TARGET_AVX512 static inline AI void q5k_load(const uint8_t *wb, q45k_w *o) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512i sc16 = q45k_head(wb, o);
    __m512i hb = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(wb + 16)));
    for (int h = 0; h < 2; h++) {
        __m512i L = _mm512_loadu_si512(wb + 48 + 64 * h);
        o->qv[2 * h] = _mm512_and_si512(L, m4);
        o->qv[2 * h + 1] = _mm512_and_si512(_mm512_srli_epi16(L, 4), m4);
        q5k_fifth(hb, h, &o->qv[2 * h], &o->qv[2 * h + 1]);
        o->scp[2 * h] = _mm512_permutexvar_epi16(_mm512_load_si512(q45k_words[2 * h]), sc16);
        o->scp[2 * h + 1] =
            _mm512_permutexvar_epi16(_mm512_load_si512(q45k_words[2 * h + 1]), sc16);
    }
}

K_TARGET_AVX512 static inline AI void q45kr5(int n, const int M, float *s, const uint8_t *w,
                                             const uint8_t *xq, size_t xs, const int five) {
    __m512 acc[K_VDOT_MAX_ROWS];
    __m256 accm[K_VDOT_MAX_ROWS];
    size_t nib = k_act_q8_k_nib_at(n);
    for (int m = 0; m < M; m++) acc[m] = _mm512_setzero_ps(), accm[m] = _mm256_setzero_ps();
    for (int b = 0; b < n / TLM_QK_K; b++) {
        q45k_w wv;
        if (five)
            q5k_load(w + b * sizeof(tlm_block_q5_k), &wv);
        else
            q4k_load(w + b * sizeof(tlm_block_q4_k), &wv);
        for (int m = 0; m < M; m++)
            q4k_step(&wv, (const k_block_q8_k *)(const void *)(xq + m * xs) + b,
                     (const int8_t *)(xq + m * xs + nib) + TLM_QK_K * b, &acc[m], &accm[m]);
    }
    for (int m = 0; m < M; m++) s[m] = q45k_sum(acc[m], accm[m]);
}
K_TARGET_AVX512 static void a5_q4_k(int n, float *s, const void *w, const void *xq) {
    q45kr5(n, 1, s, w, xq, 0, 0);
}
K_TARGET_AVX512 static void a5_q5_k(int n, float *s, const void *w, const void *xq) {
    q45kr5(n, 1, s, w, xq, 0, 1);
}

/* Byte shuffles that make, from a row's 8 scale bytes in every 128-bit lane, the words
 * WPAIR(a, b) of q45k_words (scale a in words 0-15, b in 16-31, zero-extended by the shuffle's
 * zeroing index), for (a, b) = (0, 2), (1, 3), (4, 6), (5, 7). */
#define SC2(a) a, -128, a, -128, a, -128, a, -128, a, -128, a, -128, a, -128, a, -128
#define SC4(a, b)                                                                                  \
    { SC2(a), SC2(a), SC2(b), SC2(b) }
static const int8_t q45k_sc_b[4][64]
    __attribute__((aligned(64))) = {SC4(0, 2), SC4(1, 3), SC4(4, 6), SC4(5, 7)};
#undef SC4
#undef SC2

K_TARGET_AVX512 static inline AI __m512i q4k_heads(const uint8_t *p, size_t ws) {
    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)p));
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + ws)), 1);
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + 2 * ws)), 2);
    return _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + 3 * ws)), 3);
}

/* Four weight rows against one activation row (k_vdot_w4_fn): q45kr5's sums per row, bit for bit,
 * with what the rows share per super-block done once for all four. Their 16-byte heads (d, dmin,
 * 12 bytes of 6-bit scales and mins) sit in one register, one row per 128-bit lane, and are
 * unpacked together (q4k_scales' shuffles, one block per lane); the mins meet the
 * activation's sums two rows to a register, lanes 0-7 and 8-15 being accm of the even and the
 * odd row; the four rows' d and dmin are widened and scaled in one vector. Every row waits for
 * the four heads, so the next super-block's are loaded one iteration early: without that, from
 * memory, 2048 x 768 ran 8% slower than one row at a time, with it 12% faster (in L2 +17%).
 * Q5_K's rows take their fifth bits as q5k_load does, one broadcast of qh per row (one thread,
 * alternating, G bytes/s, one row at a time -> four: in cache 768 x 2048 23-25 -> 31-33, 2048 x
 * 768 25-31 -> 34-36; from memory 18-21 -> 22-28 and 20-23 -> 25-33). Q6_K has its own: its
 * unpacking dominates. */
K_TARGET_AVX512 static inline AI void w4_q45k(int n, float *s, const void *w, size_t ws,
                                              const void *xq, const void *pf, const int five) {
    /* byte shuffle of two rows' unpacked heads (bytes 8-15 the mins), each row in two 128-bit
     * lanes: each min twice, zero-extended to words, against the 16 sums of 16 */
#define MN(a) a, -128, a, -128
    static const int8_t mdup_b[64] __attribute__((aligned(64))) = {
        MN(8), MN(9), MN(10), MN(11), MN(12), MN(13), MN(14), MN(15),
        MN(8), MN(9), MN(10), MN(11), MN(12), MN(13), MN(14), MN(15)};
#undef MN
    static const int32_t fm_i[2][16] = {{1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 3, 3, 3},
                                        {5, 5, 5, 5, 5, 5, 5, 5, 7, 7, 7, 7, 7, 7, 7, 7}};
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const size_t bb = five ? sizeof(tlm_block_q5_k) : sizeof(tlm_block_q4_k);
    const __m512i lo_i = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)q4k_lo_b));
    const __m512i hi_i = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)q4k_hi_b));
    const __m512i keep = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)q4k_keep_b));
    const __m512i mdup = _mm512_load_si512(mdup_b);
    const __m512i heads = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    const uint8_t *wb = w;
    const k_block_q8_k *x = xq;
    const int8_t *xs = k_act_q8_k_nib(xq, n);
    __m512 acc[4], accm[2];
    for (int r = 0; r < 4; r++) acc[r] = _mm512_setzero_ps();
    accm[0] = accm[1] = _mm512_setzero_ps();
    int nb = n / TLM_QK_K;
    __m512i v = q4k_heads(wb, ws);
    size_t pfo = 0, far = pf_far(n, ws, !five);
    for (int b = 0; b < nb; b++) {
        pf_upto(pf, &pfo, 4 * bb * (size_t)(b + 1), far);
        const uint8_t *p = wb + b * bb;
        __m512i vnext = b + 1 < nb ? q4k_heads(p + bb, ws) : v;
        __m512i lo = _mm512_shuffle_epi8(v, lo_i), hi = _mm512_shuffle_epi8(v, hi_i);
        lo = _mm512_mask_blend_epi8(0xF000F000F000F000ULL, lo, _mm512_srli_epi16(lo, 4));
        __m512i sm = _mm512_or_si512(
            _mm512_and_si512(lo, keep),
            _mm512_srli_epi16(_mm512_and_si512(hi, _mm512_set1_epi8((char)0xC0)), 2));
        /* dx * d and dx * dmin of rows 0-3, in that order */
        __m512 f = _mm512_castps256_ps512(_mm256_mul_ps(
            _mm256_cvtph_ps(_mm512_castsi512_si128(_mm512_permutexvar_epi32(heads, v))),
            _mm256_set1_ps(x[b].d)));
        /* each row's d x dx broadcast from here, not permuted by a constant index that the
         * compiler would rebuild in the loop (q45k_words) */
        float fs[8];
        _mm256_storeu_ps(fs, _mm512_castps512_ps256(f));
        __m512i bs = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)x[b].bsums));
        /* rows 0 and 1 (then 2 and 3) in lanes 0-1 and 2-3, each min twice as words */
        const __m512i mp[2] = {_mm512_shuffle_i32x4(sm, sm, 0x50),
                               _mm512_shuffle_i32x4(sm, sm, 0xFA)};
        for (int k = 0; k < 2; k++) {
            __m512i mt = _mm512_madd_epi16(_mm512_shuffle_epi8(mp[k], mdup), bs);
            __m512 fm = _mm512_permutexvar_ps(_mm512_loadu_si512(fm_i[k]), f);
            accm[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(mt), fm, accm[k]);
        }
        const int8_t *xb = xs + TLM_QK_K * b;
        /* each row's 8 scales (bytes) in all four 128-bit lanes, for q45k_sc_b's byte shuffles */
        const __m512i rs[4] = {
            _mm512_shuffle_i32x4(sm, sm, 0x00), _mm512_shuffle_i32x4(sm, sm, 0x55),
            _mm512_shuffle_i32x4(sm, sm, 0xAA), _mm512_shuffle_i32x4(sm, sm, 0xFF)};
        for (int r = 0; r < 4; r++) {
            const uint8_t *q = p + r * ws + (five ? 48 : 16);
            __m512i isum = _mm512_setzero_si512(), hb = _mm512_setzero_si512();
            if (five) /* q5k_load's fifth bits */
                hb = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(q - 32)));
            for (int h = 0; h < 2; h++) {
                __m512i L = _mm512_loadu_si512(q + 64 * h);
                __m512i qa = _mm512_and_si512(L, m4),
                        qb = _mm512_and_si512(_mm512_srli_epi16(L, 4), m4);
                if (five) q5k_fifth(hb, h, &qa, &qb);
                __m512i pa = _mm512_maddubs_epi16(qa, _mm512_loadu_si512(xb + 128 * h));
                __m512i pb = _mm512_maddubs_epi16(qb, _mm512_loadu_si512(xb + 128 * h + 64));
                isum = _mm512_dpwssd_epi32(
                    isum, pa, _mm512_shuffle_epi8(rs[r], _mm512_load_si512(q45k_sc_b[2 * h])));
                isum = _mm512_dpwssd_epi32(
                    isum, pb, _mm512_shuffle_epi8(rs[r], _mm512_load_si512(q45k_sc_b[2 * h + 1])));
            }
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(fs[2 * r]), acc[r]);
        }
        v = vnext;
    }
    /* q45k_sum's operations per row, the four rows' last sums together (hsum8x4): one-block rows
     * (256 columns) from L3, one thread, alternating: Q4_K 32.4-33.3 -> 35.7-37.6 G bytes/s,
     * Q5_K 31.5-32.6 -> 32.1-35.1; 768 x 2048 from memory within noise. */
    __m256 t[4];
    for (int r = 0; r < 4; r++) {
        __m256 m =
            (r & 1) ? _mm512_extractf32x8_ps(accm[r / 2], 1) : _mm512_castps512_ps256(accm[r / 2]);
        t[r] = q45k_fold(acc[r], m);
    }
    hsum8x4(t, s);
}

typedef struct {
    __m512i qv[4], scp[4];
    __m256i s16;
    float dw;
} q6k_w;

K_TARGET_AVX512 static inline AI void q6k_load(const uint8_t *wb, q6k_w *o) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    const __m512i four = _mm512_set1_epi16(4);
    __m512i idx = _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1,
                                   1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    /* qh's 32 bytes broadcast to both halves and shifted per half by variable word shifts: bits
     * 0-1 (first half) and 2-3 (second) up to bits 4-5, bits 4-5 kept and 6-7 down. One shift
     * each in place of a 256-bit shift and a lane insert (one thread, in L2, alternating: 768 x
     * 768 +3-13%, 2048 x 768 +1-7%). */
    const __m512i up = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i down = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    o->s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wb + 192)));
    __m512i sc = _mm512_castsi256_si512(o->s16);
    for (int h = 0; h < 2; h++) {
        __m512i L = _mm512_loadu_si512(wb + 64 * h);
        __m512i hb = _mm512_broadcast_i64x4(
            _mm256_loadu_si256((const __m256i *)(const void *)(wb + 128 + 32 * h)));
        o->qv[2 * h] = _mm512_or_si512(_mm512_and_si512(L, m4),
                                       _mm512_and_si512(_mm512_sllv_epi16(hb, up), m30));
        o->qv[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(L, 4), m4),
                                           _mm512_and_si512(_mm512_srlv_epi16(hb, down), m30));
        for (int z = 0; z < 2; z++) {
            o->scp[2 * h + z] = _mm512_permutexvar_epi16(idx, sc);
            idx = _mm512_add_epi16(idx, four);
        }
    }
    o->dw = f16s(wb + 208);
}

K_TARGET_AVX512 static inline AI void q6k_step(const q6k_w *w, const k_block_q8_k *x, __m256 *acc) {
    __m256i off = _mm256_madd_epi16(w->s16, _mm256_loadu_si256((const __m256i *)x->bsums));
    __m512i isum = _mm512_setzero_si512();
    for (int k = 0; k < 4; k++) {
        __m512i p = _mm512_maddubs_epi16(w->qv[k], _mm512_loadu_si512(x->qs + 64 * k));
        isum = _mm512_dpwssd_epi32(isum, p, w->scp[k]);
    }
    __m256i t = _mm256_add_epi32(_mm512_castsi512_si256(isum), _mm512_extracti64x4_epi64(isum, 1));
    t = _mm256_sub_epi32(t, _mm256_slli_epi32(off, 5));
    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_set1_ps(x->d * w->dw), *acc);
}

K_TARGET_AVX512 static inline AI void q6kr5(int n, const int M, float *s, const uint8_t *w,
                                            const uint8_t *xq, size_t xs) {
    __m256 acc[K_VDOT_MAX_ROWS];
    for (int m = 0; m < M; m++) acc[m] = _mm256_setzero_ps();
    for (int b = 0; b < n / TLM_QK_K; b++) {
        q6k_w wv;
        q6k_load(w + b * sizeof(tlm_block_q6_k), &wv);
        for (int m = 0; m < M; m++)
            q6k_step(&wv, (const k_block_q8_k *)(const void *)(xq + m * xs) + b, &acc[m]);
    }
    for (int m = 0; m < M; m++) s[m] = hsum8(acc[m]);
}

/* Four Q6_K rows against one activation row, q6kr5's operations per row with M = 1, the rows'
 * chains interleaved (in cache, 1 thread: 256 columns 19 -> 21-27, 768 columns 29 -> 32 G
 * weights/s; 32000 x 768 from memory about equal). As a unit of four they also take
 * k_matvec_parts's prefetch of the rows ahead (from memory, 1 thread, alternating: 0.92 -> 0.80
 * ms). F32 and F16 one row at a time lose with that prefetch (1 thread, 8192 x 768: 1.16 -> 1.35
 * ms). */
K_TARGET_AVX512 static inline AI void w4one_q6_k(int n, float *s, const void *w, size_t ws,
                                                 const void *xq, const void *pf) {
    const uint8_t *wb = w;
    __m256 acc[4];
    for (int r = 0; r < 4; r++) acc[r] = _mm256_setzero_ps();
    size_t pfo = 0, far = pf_far(n, ws, 1);
    for (int b = 0; b < n / TLM_QK_K; b++) {
        pf_upto(pf, &pfo, 4 * sizeof(tlm_block_q6_k) * (size_t)(b + 1), far);
        const k_block_q8_k *x = (const k_block_q8_k *)xq + b;
        for (int r = 0; r < 4; r++) {
            q6k_w o;
            q6k_load(wb + r * ws + b * sizeof(tlm_block_q6_k), &o);
            q6k_step(&o, x, &acc[r]);
        }
    }
    hsum8x4(acc, s);
}

/* Four Q2_K, Q3_K or IQ4_XS rows (kind: the KB_ below) against one activation row, the one-row
 * kernel's block steps per row, the rows' chains interleaved and the unit ahead prefetched as
 * Q6_K's are. */
enum { KB_Q2_K, KB_Q3_K, KB_IQ4_XS };
K_TARGET_AVX512 static inline AI void w4one_kb(int n, float *s, const void *w, size_t ws,
                                               const void *xq, const void *pf, const int kind) {
    const uint8_t *wb = w;
    const size_t bytes = kind == KB_IQ4_XS ? sizeof(tlm_block_iq4_xs)
                         : kind == KB_Q3_K ? sizeof(tlm_block_q3_k)
                                           : sizeof(tlm_block_q2_k);
    __m256 acc[4];
    for (int r = 0; r < 4; r++) acc[r] = _mm256_setzero_ps();
    size_t pfo = 0, far = pf_far(n, ws, 0);
    for (int b = 0; b < n / TLM_QK_K; b++) {
        pf_upto(pf, &pfo, 4 * bytes * (size_t)(b + 1), far);
        const k_block_q8_k *x = (const k_block_q8_k *)xq + b;
        for (int r = 0; r < 4; r++) {
            if (kind == KB_IQ4_XS)
                iq4xs_block(wb + r * ws + b * bytes, x, &acc[r]);
            else
                q23k_block(wb + r * ws + b * bytes, x, &acc[r], kind == KB_Q3_K);
        }
    }
    hsum8x4(acc, s);
}

#define Q4KR5(n, M, s, w, xq, xs) q45kr5(n, M, s, w, xq, xs, 0)
#define Q5KR5(n, M, s, w, xq, xs) q45kr5(n, M, s, w, xq, xs, 1)
K_TARGET_AVX512 static void r5_q4_k(int n, int M, float *s, const void *w, const void *xq,
                                    size_t xstride) {
    ROWS_SWITCH(Q4KR5, n, M, s, (const uint8_t *)w, (const uint8_t *)xq, xstride);
}
K_TARGET_AVX512 static void r5_q5_k(int n, int M, float *s, const void *w, const void *xq,
                                    size_t xstride) {
    ROWS_SWITCH(Q5KR5, n, M, s, (const uint8_t *)w, (const uint8_t *)xq, xstride);
}
#define Q2KR5(n, M, s, w, xq, xs) q23kr5(n, M, s, w, xq, xs, 0)
#define Q3KR5(n, M, s, w, xq, xs) q23kr5(n, M, s, w, xq, xs, 1)
K_TARGET_AVX512 static void r5_q2_k(int n, int M, float *s, const void *w, const void *xq,
                                    size_t xstride) {
    ROWS_SWITCH(Q2KR5, n, M, s, (const uint8_t *)w, (const uint8_t *)xq, xstride);
}
K_TARGET_AVX512 static void r5_q3_k(int n, int M, float *s, const void *w, const void *xq,
                                    size_t xstride) {
    ROWS_SWITCH(Q3KR5, n, M, s, (const uint8_t *)w, (const uint8_t *)xq, xstride);
}
K_TARGET_AVX512 static void r5_iq4_xs(int n, int M, float *s, const void *w, const void *xq,
                                      size_t xstride) {
    ROWS_SWITCH(iq4xsr5, n, M, s, (const uint8_t *)w, (const uint8_t *)xq, xstride);
}
K_TARGET_AVX512 static void r5_q6_k(int n, int M, float *s, const void *w, const void *xq,
                                    size_t xstride) {
    ROWS_SWITCH(q6kr5, n, M, s, (const uint8_t *)w, (const uint8_t *)xq, xstride);
}

/* ---- AVX2 four-row kernels ----------------------------------------------------------------- */

/* Four weight rows against one activation row without AVX-512 (k_vdot_w4_fn): each row's sums take
 * the one-row kernel's operations (a2_*) in its order, so the same bits; what the rows share is
 * the call and the loop (one row at a time through k_matvec_parts cost a fifth of 15M's decode in
 * its steps between rows), the activation's loads, scales and sums, and four rows' chains overlap.
 * The scales of Q4_K and Q6_K go into vectors by shuffles rather than one by one. */

/* The 32-element types of one scale per block (Q8_0, Q4_0, IQ4_NL) four rows at a time: each
 * row's int32 lanes a2_q8_0's and a2_q4nl's (Q4_0's nibbles as unsigned bytes less 8 times x's
 * sums per lane of four bytes, worked out once for the four rows, where a2_q4nl takes 8 off each
 * weight and multiplies by sign: the same integers lane by lane). */
enum { B32_Q8_0, B32_Q4_0, B32_IQ4_NL };

K_TARGET_AVX2 static inline AI void w2one_b32(int n, float *s, const void *wv, size_t ws,
                                              const void *xqv, const void *pf, const int kind) {
    const uint8_t *w = wv;
    const tlm_block_q8_0 *x = xqv;
    const size_t bb = kind == B32_Q8_0 ? 34 : 18;
    const __m256i eight = _mm256_set1_epi8(8), ones = _mm256_set1_epi16(1);
    const __m256i T =
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)tlm_iq4nl_values));
    __m256 acc[4];
    for (int r = 0; r < 4; r++) acc[r] = _mm256_setzero_ps();
    size_t pfo = 0, far = pf_far(n, ws, 0);
    for (int b = 0; b < n / TLM_QK; b++) {
        pf_upto(pf, &pfo, 4 * bb * (size_t)(b + 1), far);
        __m256i xv = _mm256_loadu_si256((const __m256i *)x[b].qs);
        __m256i e = kind == B32_Q4_0 ? _mm256_madd_epi16(_mm256_maddubs_epi16(eight, xv), ones)
                                     : _mm256_setzero_si256();
        float xd = _cvtsh_ss(x[b].d);
        for (int r = 0; r < 4; r++) {
            const uint8_t *wb = w + r * ws + (size_t)b * bb;
            __m256i p;
            if (kind == B32_Q8_0)
                p = dot_ss2(_mm256_loadu_si256((const __m256i *)(wb + 2)), xv);
            else if (kind == B32_IQ4_NL)
                p = dot_ss2(_mm256_shuffle_epi8(T, nibbles32(wb + 2)), xv);
            else
                p = _mm256_sub_epi32(
                    _mm256_madd_epi16(_mm256_maddubs_epi16(nibbles32(wb + 2), xv), ones), e);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(f16s(wb) * xd), acc[r]);
        }
    }
    pf_upto(pf, &pfo, 4 * ws, far);
    for (int r = 0; r < 4; r++) s[r] = hsum8(acc[r]);
}

/* With AVX-VNNI (w2v_*): the same lanes by 256-bit vpdpbusd, started from the activation's offset
 * sums (Q8_0's and IQ4_NL's bytes as w + 128, less 128 times x's lane sums; Q4_0's nibbles less 8
 * times them), so the same sums bit for bit in fewer operations. */
K_TARGET_AVXVNNI static inline AI void w2vone_b32(int n, float *s, const void *wv, size_t ws,
                                                  const void *xqv, const void *pf, const int kind) {
    const uint8_t *w = wv;
    const tlm_block_q8_0 *x = xqv;
    const size_t bb = kind == B32_Q8_0 ? 34 : 18;
    const __m256i off = _mm256_set1_epi8(kind == B32_Q4_0 ? 8 : (char)0x80);
    const __m256i T = _mm256_xor_si256(
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)tlm_iq4nl_values)),
        _mm256_set1_epi8((char)0x80));
    __m256 acc[4];
    for (int r = 0; r < 4; r++) acc[r] = _mm256_setzero_ps();
    size_t pfo = 0, far = pf_far(n, ws, 0);
    for (int b = 0; b < n / TLM_QK; b++) {
        pf_upto(pf, &pfo, 4 * bb * (size_t)(b + 1), far);
        __m256i xv = _mm256_loadu_si256((const __m256i *)x[b].qs);
        __m256i e = _mm256_sub_epi32(_mm256_setzero_si256(),
                                     _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), off, xv));
        float xd = _cvtsh_ss(x[b].d);
        for (int r = 0; r < 4; r++) {
            const uint8_t *wb = w + r * ws + (size_t)b * bb;
            __m256i u = kind == B32_Q8_0
                            ? _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(wb + 2)),
                                               _mm256_set1_epi8((char)0x80))
                        : kind == B32_IQ4_NL ? _mm256_shuffle_epi8(T, nibbles32(wb + 2))
                                             : nibbles32(wb + 2);
            __m256i p = _mm256_dpbusd_avx_epi32(e, u, xv);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(f16s(wb) * xd), acc[r]);
        }
    }
    pf_upto(pf, &pfo, 4 * ws, far);
    for (int r = 0; r < 4; r++) s[r] = hsum8(acc[r]);
}

/* q4k_scales with AVX2's blend: bytes 0-7 the 8 scales, 8-15 the 8 mins. */
K_TARGET_AVX2 static inline __m128i q4k_scales_a2(const uint8_t *wb) {
    const __m128i v = _mm_loadu_si128((const __m128i *)wb);
    const __m128i lo = _mm_shuffle_epi8(v, _mm_loadu_si128((const __m128i *)q4k_lo_b));
    const __m128i hi = _mm_shuffle_epi8(v, _mm_loadu_si128((const __m128i *)q4k_hi_b));
    __m128i low = _mm_blend_epi16(lo, _mm_srli_epi16(lo, 4), 0xC0);
    low = _mm_and_si128(low, _mm_loadu_si128((const __m128i *)q4k_keep_b));
    __m128i top = _mm_srli_epi16(_mm_and_si128(hi, _mm_set1_epi8((char)0xC0)), 2);
    return _mm_or_si128(low, top);
}

/* int16 lane j of both 128-bit halves of v in every int16 lane */
K_TARGET_AVX2 static inline AI __m256i bcast16(__m256i v, int j) {
    return _mm256_shuffle_epi8(v, _mm256_set1_epi16(lane16(j)));
}

K_TARGET_AVX2 static inline AI void w2one_q45k(int n, float *s, const void *wv, size_t ws,
                                               const void *xqv, const void *pf, const int five) {
    const uint8_t *w = wv;
    const k_block_q8_k *x = xqv;
    size_t bytes = five ? sizeof(tlm_block_q5_k) : sizeof(tlm_block_q4_k);
    __m256 acc[4];
    float accm[4] = {0};
    for (int r = 0; r < 4; r++) acc[r] = _mm256_setzero_ps();
    size_t pfo = 0, far = pf_far(n, ws, 0);
    for (int b = 0; b < n / TLM_QK_K; b++) {
        pf_upto(pf, &pfo, 4 * bytes * (size_t)(b + 1), far);
        /* the activation's sums over each sub-block of 32 (pairs of its sums of 16) */
        __m128i pairs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)x[b].bsums),
                                       _mm_loadu_si128((const __m128i *)(x[b].bsums + 8)));
        for (int r = 0; r < 4; r++) {
            const uint8_t *wb = w + r * ws + (size_t)b * bytes;
            __m128i sm = q4k_scales_a2(wb);
            __m128i m = _mm_madd_epi16(pairs, _mm_cvtepu8_epi16(_mm_srli_si128(sm, 8)));
            m = _mm_add_epi32(m, _mm_shuffle_epi32(m, 0x4E));
            int summ = _mm_cvtsi128_si32(_mm_add_epi32(m, _mm_shuffle_epi32(m, 0xB1)));
            __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
            const uint8_t *qh = five ? wb + 16 : NULL, *q = wb + (five ? 48 : 16);
            __m256i isum = _mm256_setzero_si256();
            for (int g = 0; g < 4; g++) {
                __m256i lo, hi;
                q45k_group(q + 32 * g, qh, g, &lo, &hi);
                __m256i p0 = _mm256_maddubs_epi16(
                    lo, _mm256_loadu_si256((const __m256i *)(x[b].qs + 64 * g)));
                __m256i p1 = _mm256_maddubs_epi16(
                    hi, _mm256_loadu_si256((const __m256i *)(x[b].qs + 64 * g + 32)));
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p0, bcast16(sc, 2 * g)));
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p1, bcast16(sc, 2 * g + 1)));
            }
            float d = x[b].d * f16s(wb);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(d), acc[r]);
            accm[r] += x[b].d * f16s(wb + 2) * (float)summ;
        }
    }
    pf_upto(pf, &pfo, 4 * ws, far);
    for (int r = 0; r < 4; r++) s[r] = hsum8(acc[r]) - accm[r];
}

/* Q6_K: the 16 scales as int16 once per row and block, sub-blocks k (low half) and k + 1 (high)
 * by one shuffle each; the offset of 32 through the activation's sums in the same vector. */
K_TARGET_AVX2 static inline AI void w2one_q6_k(int n, float *s, const void *wv, size_t ws,
                                               const void *xqv, const void *pf) {
    const uint8_t *w = wv;
    const k_block_q8_k *x = xqv;
    float acc[4] = {0};
    size_t pfo = 0, far = pf_far(n, ws, 0);
    for (int b = 0; b < n / TLM_QK_K; b++) {
        pf_upto(pf, &pfo, 4 * sizeof(tlm_block_q6_k) * (size_t)(b + 1), far);
        __m256i bs = _mm256_loadu_si256((const __m256i *)x[b].bsums);
        for (int r = 0; r < 4; r++) {
            const uint8_t *wb = w + r * ws + (size_t)b * sizeof(tlm_block_q6_k);
            __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wb + 192)));
            __m256i isum = _mm256_slli_epi32(_mm256_madd_epi16(s16, bs), 5);
            isum = _mm256_sub_epi32(_mm256_setzero_si256(), isum);
            const __m256i halves[2] = {_mm256_permute2x128_si256(s16, s16, 0x00),
                                       _mm256_permute2x128_si256(s16, s16, 0x11)};
            for (int h = 0; h < 2; h++) {
                __m256i half = halves[h], q[4];
                q6k_half(wb + 64 * h, wb + 128 + 32 * h, q);
                for (int v = 0; v < 4; v++) {
                    const int8_t *a = x[b].qs + 128 * h + 32 * v;
                    __m256i p = _mm256_maddubs_epi16(q[v], _mm256_loadu_si256((const __m256i *)a));
                    __m256i scv = _mm256_shuffle_epi8(
                        half, _mm256_set_m128i(_mm_set1_epi16(lane16(2 * v + 1)),
                                               _mm_set1_epi16(lane16(2 * v))));
                    isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, scv));
                }
            }
            acc[r] += x[b].d * f16s(wb + 208) * (float)k_hsum8i(isum);
        }
    }
    pf_upto(pf, &pfo, 4 * ws, far);
    for (int r = 0; r < 4; r++) s[r] = acc[r];
}

/* F32 and F16: fr2's sums (the rows kernel with one activation row, which is their one-row
 * product at this level) for four weight rows, the activation's vectors loaded once for the four.
 * pf is ignored, as by the AVX-512 float kernels (k_matvec_parts asks for their lines). */
K_TARGET_AVX2 static inline AI void w2one_f(int n, float *s, const void *wv, size_t ws,
                                            const void *xqv, const void *pf, const int f16) {
    const uint8_t *w = wv;
    const float *x = xqv;
    (void)pf;
    __m256 a0[4], a1[4];
    for (int r = 0; r < 4; r++) a0[r] = a1[r] = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + 8);
        for (int r = 0; r < 4; r++) {
            const uint8_t *wr = w + r * ws;
            a0[r] = _mm256_fmadd_ps(ld8_2(wr, f16, i), x0, a0[r]);
            a1[r] = _mm256_fmadd_ps(ld8_2(wr, f16, i + 8), x1, a1[r]);
        }
    }
    for (int r = 0; r < 4; r++) {
        const uint8_t *wr = w + r * ws;
        float t = hsum8(_mm256_add_ps(a0[r], a1[r]));
        for (int j = i; j < n; j++) {
            float wj;
            if (f16)
                wj = f16s(wr + 2 * (size_t)j);
            else
                memcpy(&wj, wr + 4 * (size_t)j, 4);
            t += wj * x[j];
        }
        s[r] = t;
    }
}

/* Q2_K, Q3_K and IQ4_XS: the one-row kernels' block terms (q23k_term_a2, iq4xs_term_a2) for four
 * rows a block at a time. */
K_TARGET_AVX2 static inline AI void w2one_kb(int n, float *s, const void *wv, size_t ws,
                                             const void *xqv, const void *pf, const int kind) {
    const uint8_t *w = wv;
    const k_block_q8_k *x = xqv;
    const __m256i T =
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)tlm_iq4nl_values));
    size_t bytes = kind == KB_Q2_K   ? sizeof(tlm_block_q2_k)
                   : kind == KB_Q3_K ? sizeof(tlm_block_q3_k)
                                     : sizeof(tlm_block_iq4_xs);
    float acc[4] = {0};
    size_t pfo = 0, far = pf_far(n, ws, 0);
    for (int b = 0; b < n / TLM_QK_K; b++) {
        pf_upto(pf, &pfo, 4 * bytes * (size_t)(b + 1), far);
        for (int r = 0; r < 4; r++) {
            const uint8_t *wb = w + r * ws + (size_t)b * bytes;
            acc[r] += kind == KB_IQ4_XS ? iq4xs_term_a2(wb, &x[b], T)
                                        : q23k_term_a2(wb, &x[b], kind == KB_Q3_K);
        }
    }
    pf_upto(pf, &pfo, 4 * ws, far);
    for (int r = 0; r < 4; r++) s[r] = acc[r];
}

W4_RUN_OF(K_TARGET_AVXVNNI, w2v_q8_0, w2vone_b32, B32_Q8_0)
W4_RUN_OF(K_TARGET_AVXVNNI, w2v_q4_0, w2vone_b32, B32_Q4_0)
W4_RUN_OF(K_TARGET_AVXVNNI, w2v_iq4_nl, w2vone_b32, B32_IQ4_NL)

W4_RUN_OF(K_TARGET_AVX2, w2_q8_0, w2one_b32, B32_Q8_0)
W4_RUN_OF(K_TARGET_AVX2, w2_q4_0, w2one_b32, B32_Q4_0)
W4_RUN_OF(K_TARGET_AVX2, w2_q4_k, w2one_q45k, 0)
W4_RUN_OF(K_TARGET_AVX2, w2_q5_k, w2one_q45k, 1)
W4_RUN(K_TARGET_AVX2, w2_q6_k, w2one_q6_k)
W4_RUN_OF(K_TARGET_AVX2, w2_iq4_nl, w2one_b32, B32_IQ4_NL)
W4_RUN_OF(K_TARGET_AVX2, w2_f32, w2one_f, 0)
W4_RUN_OF(K_TARGET_AVX2, w2_f16, w2one_f, 1)
W4_RUN_OF(K_TARGET_AVX2, w2_q2_k, w2one_kb, KB_Q2_K)
W4_RUN_OF(K_TARGET_AVX2, w2_q3_k, w2one_kb, KB_Q3_K)
W4_RUN_OF(K_TARGET_AVX2, w2_iq4_xs, w2one_kb, KB_IQ4_XS)

k_vdot_rows_fn k_simd_vdot_rows(tlm_dtype t, int isa) {
    if (isa > k_cpu()->isa) return NULL;
    if (isa == K_ISA_AVX512) {
        switch (t) {
        case TLM_DTYPE_F32: return r5_f32;
        case TLM_DTYPE_F16: return r5_f16;
        case TLM_DTYPE_Q8_0: return r5_q8_0;
        case TLM_DTYPE_Q4_0: return r5_q4_0;
        case TLM_DTYPE_IQ4_NL: return r5_iq4_nl;
        case TLM_DTYPE_Q4_K: return r5_q4_k;
        case TLM_DTYPE_Q5_K: return r5_q5_k;
        case TLM_DTYPE_Q6_K: return r5_q6_k;
        case TLM_DTYPE_Q2_K: return r5_q2_k;
        case TLM_DTYPE_Q3_K: return r5_q3_k;
        case TLM_DTYPE_IQ4_XS: return r5_iq4_xs;
        default: return NULL;
        }
    }
    if (isa == K_ISA_AVX2) {
        switch (t) {
        case TLM_DTYPE_F32: return r2_f32;
        case TLM_DTYPE_F16: return r2_f16;
        default: return NULL;
        }
    }
    return NULL;
}

k_vdot_rows3_fn k_simd_vdot_rows3(tlm_dtype t, int isa) {
    if (isa != K_ISA_AVX512 || isa > k_cpu()->isa) return NULL;
    return t == TLM_DTYPE_F32 ? r53_f32 : t == TLM_DTYPE_F16 ? r53_f16 : NULL;
}

W4_RUN(K_TARGET_AVX512, w4_q8_0, w4one_q8_0)
W4_RUN_OF(K_TARGET_AVX512, w4_q4_0, w4one_q4nl, 0)
W4_RUN_OF(K_TARGET_AVX512, w4_iq4_nl, w4one_q4nl, 1)
W4_RUN_OF(K_TARGET_AVX512, w4_q4_k, w4_q45k, 0)
W4_RUN_OF(K_TARGET_AVX512, w4_q5_k, w4_q45k, 1)
W4_RUN(K_TARGET_AVX512, w4_q6_k, w4one_q6_k)
W4_RUN_OF(K_TARGET_AVX512, w4_q2_k, w4one_kb, KB_Q2_K)
W4_RUN_OF(K_TARGET_AVX512, w4_q3_k, w4one_kb, KB_Q3_K)
W4_RUN_OF(K_TARGET_AVX512, w4_iq4_xs, w4one_kb, KB_IQ4_XS)
W4_RUN(K_TARGET_AVX512, w4_f32, w4one_f32)
W4_RUN(K_TARGET_AVX512, w4_f16, w4one_f16)
W4_RUN(K_TARGET_AVX512BF16, w4_bf16, w4one_bf16)

k_vdot_w4_fn k_simd_vdot_w4(tlm_dtype t, int isa) {
    if (isa > k_cpu()->isa) return NULL;
    if (isa == K_ISA_AVX2 && k_avxvnni()) {
        switch (t) {
        case TLM_DTYPE_Q8_0: return w2v_q8_0;
        case TLM_DTYPE_Q4_0: return w2v_q4_0;
        case TLM_DTYPE_IQ4_NL: return w2v_iq4_nl;
        default: break;
        }
    }
    if (isa == K_ISA_AVX2) {
        switch (t) {
        case TLM_DTYPE_Q8_0: return w2_q8_0;
        case TLM_DTYPE_Q4_0: return w2_q4_0;
        case TLM_DTYPE_Q4_K: return w2_q4_k;
        case TLM_DTYPE_Q5_K: return w2_q5_k;
        case TLM_DTYPE_Q6_K: return w2_q6_k;
        case TLM_DTYPE_IQ4_NL: return w2_iq4_nl;
        case TLM_DTYPE_Q2_K: return w2_q2_k;
        case TLM_DTYPE_Q3_K: return w2_q3_k;
        case TLM_DTYPE_IQ4_XS: return w2_iq4_xs;
        case TLM_DTYPE_F32: return w2_f32;
        case TLM_DTYPE_F16: return w2_f16;
        default: return NULL;
        }
    }
    if (isa != K_ISA_AVX512) return NULL;
    switch (t) {
    case TLM_DTYPE_Q8_0: return w4_q8_0;
    case TLM_DTYPE_Q4_0: return w4_q4_0;
    case TLM_DTYPE_IQ4_NL: return w4_iq4_nl;
    case TLM_DTYPE_Q4_K: return w4_q4_k;
    case TLM_DTYPE_Q5_K: return w4_q5_k;
    case TLM_DTYPE_Q6_K: return w4_q6_k;
    case TLM_DTYPE_Q2_K: return w4_q2_k;
    case TLM_DTYPE_Q3_K: return w4_q3_k;
    case TLM_DTYPE_IQ4_XS: return w4_iq4_xs;
    case TLM_DTYPE_F32: return w4_f32;
    case TLM_DTYPE_F16: return w4_f16;
    case TLM_DTYPE_BF16: return k_cpu()->avx512bf16 ? w4_bf16 : NULL;
    default: return NULL;
    }
}

/* ---- activation rows ------------------------------------------------------------------------ */

/* k_act_quantize's rows with AVX-512, byte for byte the reference's (act_quant.c): the same float
 * products, rounded to nearest even by the conversion as the reference's magic-number add rounds
 * them, and the same scales. A decode step quantizes its activation before each product: in C
 * that took about a tenth of 15M's two-thread token (0.6 us a product). */
/* With `full`, the activation row (K_ACT_Q8_0: the blocks, their scales as floats and the
 * groups of four in k_act_q8_0_nib's form); without, the blocks alone (k_q8_0_blocks). */
K_TARGET_AVX512 static inline __attribute__((always_inline)) void
act_q8_0_5_(const float *x, void *xq, int n, const int full) {
    tlm_block_q8_0 *y = xq;
    float *d = full ? (float *)(uintptr_t)k_act_q8_0_aux(xq, n) : NULL;
    uint8_t *g = full ? (uint8_t *)(uintptr_t)k_act_q8_0_nib(xq, n) : NULL;
    const __m512 mag = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    const __m512i ones = _mm512_set1_epi8(1);
    int nb = n / TLM_QK;
    __m128i lo[4], hi[4];
    for (int b = 0; b < nb; b++, x += TLM_QK) {
        __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
        float amax =
            _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(v0, mag), _mm512_and_ps(v1, mag)));
        float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        y[b].d = tlm_f32_to_f16(amax / 127.0f);
        if (full) d[b] = tlm_f16_to_f32(y[b].d);
        __m512 vid = _mm512_set1_ps(id);
        int k = b % 4;
        lo[k] = _mm512_cvtepi32_epi8(_mm512_cvt_roundps_epi32(
            _mm512_mul_ps(v0, vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        hi[k] = _mm512_cvtepi32_epi8(_mm512_cvt_roundps_epi32(
            _mm512_mul_ps(v1, vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        _mm_storeu_si128((__m128i *)(void *)y[b].qs, lo[k]);
        _mm_storeu_si128((__m128i *)(void *)(y[b].qs + 16), hi[k]);
        if (!full || k < 3) continue;
        /* the group of four blocks in k_act_q8_0_nib's form, and -8 times its sums of four */
        __m512i l = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(lo[1], lo[0])),
                                       _mm256_set_m128i(lo[3], lo[2]), 1);
        __m512i h = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(hi[1], hi[0])),
                                       _mm256_set_m128i(hi[3], hi[2]), 1);
        __m512i e =
            _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, l), ones, h);
        _mm512_storeu_si512(g, l);
        _mm512_storeu_si512(g + 64, h);
        _mm512_storeu_si512(g + 128,
                            _mm512_slli_epi32(_mm512_sub_epi32(_mm512_setzero_si512(), e), 3));
        g += K_ACT_NIB_BYTES;
    }
}

K_TARGET_AVX512 static void act_q8_0_5(const float *x, void *xq, int n) {
    act_q8_0_5_(x, xq, n, 1);
}
K_TARGET_AVX512 static void q8_0_blocks_5(const float *x, void *y, int n) {
    act_q8_0_5_(x, y, n, 0);
}

K_TARGET_AVX512 static void act_q8_k_5(const float *x, void *xq, int n) {
    k_block_q8_k *y = xq;
    int8_t *g = (int8_t *)(uintptr_t)k_act_q8_k_nib(xq, n);
    const __m512 mag = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    const __m512i top = _mm512_set1_epi32(127);
    for (int b = 0; b < n / TLM_QK_K; b++, x += TLM_QK_K, g += TLM_QK_K) {
        __m512 m = _mm512_setzero_ps();
        for (int j = 0; j < 16; j++)
            m = _mm512_max_ps(m, _mm512_and_ps(_mm512_loadu_ps(x + 16 * j), mag));
        float amax = _mm512_reduce_max_ps(m);
        if (amax == 0.0f) {
            memset(&y[b], 0, sizeof y[b]);
        } else {
            /* the first element of that magnitude sets the scale's sign, as in the reference */
            float max = 0.0f;
            __m512 va = _mm512_set1_ps(amax);
            for (int j = 0; j < 16; j++) {
                __mmask16 k = _mm512_cmp_ps_mask(_mm512_and_ps(_mm512_loadu_ps(x + 16 * j), mag),
                                                 va, _CMP_EQ_OQ);
                if (k) {
                    max = x[16 * j + __builtin_ctz(k)];
                    break;
                }
            }
            float iscale = -127.0f / max;
            __m512 vs = _mm512_set1_ps(iscale);
            for (int j = 0; j < 16; j++) {
                __m512i q = _mm512_min_epi32(
                    _mm512_cvt_roundps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 16 * j), vs),
                                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                    top);
                _mm_storeu_si128((__m128i *)(void *)(y[b].qs + 16 * j), _mm512_cvtepi32_epi8(q));
                y[b].bsums[j] = (int16_t)_mm512_reduce_add_epi32(q);
            }
            y[b].d = 1.0f / iscale;
        }
        k_act_q8_k_nib_fill(g, y[b].qs);
    }
}

/* Round to nearest even on the bits, quiet NaNs, as tlm_f32_to_bf16. */
K_TARGET_AVX512 static void act_bf16_5(const float *x, void *xq, int n) {
    uint16_t *y = xq;
    const __m512i one = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7fff),
                  inf = _mm512_set1_epi32(0x7f800000), abs = _mm512_set1_epi32(0x7fffffff),
                  quiet = _mm512_set1_epi32(0x400000);
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i u = _mm512_loadu_si512(x + i);
        __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs), inf);
        __m512i r = _mm512_add_epi32(
            u, _mm512_add_epi32(half, _mm512_and_si512(_mm512_srli_epi32(u, 16), one)));
        r = _mm512_mask_or_epi32(r, nan, u, quiet);
        _mm256_storeu_si256((__m256i *)(void *)(y + i),
                            _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
    }
    for (; i < n; i++) y[i] = tlm_f32_to_bf16(x[i]);
}

/* The same with AVX2 (for CPUs without AVX-512): the reference's products and rounding. */
K_TARGET_AVX2 static void act_q8_0_2(const float *x, void *xq, int n) {
    tlm_block_q8_0 *y = xq;
    float *d = (float *)(uintptr_t)k_act_q8_0_aux(xq, n);
    uint8_t *g = (uint8_t *)(uintptr_t)k_act_q8_0_nib(xq, n);
    int nb = n / TLM_QK;
    for (int b = 0; b < nb; b++, x += TLM_QK) {
        __m256i qi[4];
        float amax = k_q8_block_avx2(x, y[b].qs, qi);
        y[b].d = tlm_f32_to_f16(amax / 127.0f);
        d[b] = tlm_f16_to_f32(y[b].d);
    }
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    for (int b = 0; b + 4 <= nb; b += 4, g += K_ACT_NIB_BYTES) {
        for (int k = 0; k < 4; k++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)y[b + k].qs);
            _mm_storeu_si128((__m128i *)(void *)(g + 16 * k), _mm256_castsi256_si128(v));
            _mm_storeu_si128((__m128i *)(void *)(g + 64 + 16 * k), _mm256_extracti128_si256(v, 1));
            __m256i s4 = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, v), ones16);
            __m128i e = _mm_add_epi32(_mm256_castsi256_si128(s4), _mm256_extracti128_si256(s4, 1));
            e = _mm_sub_epi32(_mm_setzero_si128(), _mm_slli_epi32(e, 3));
            _mm_storeu_si128((__m128i *)(void *)(g + 128 + 16 * k), e);
        }
    }
}

K_TARGET_AVX2 static void act_q8_k_2(const float *x, void *xq, int n) {
    k_block_q8_k *y = xq;
    int8_t *g = (int8_t *)(uintptr_t)k_act_q8_k_nib(xq, n);
    const __m256 mag = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i top = _mm256_set1_epi32(127);
    for (int b = 0; b < n / TLM_QK_K; b++, x += TLM_QK_K, g += TLM_QK_K) {
        __m256 m = _mm256_setzero_ps();
        for (int j = 0; j < 32; j++)
            m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + 8 * j), mag));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
        if (amax == 0.0f) {
            memset(&y[b], 0, sizeof y[b]);
        } else {
            /* the first element of that magnitude sets the scale's sign, as in the reference */
            float max = 0.0f;
            __m256 va = _mm256_set1_ps(amax);
            for (int j = 0; j < 32; j++) {
                int k = _mm256_movemask_ps(
                    _mm256_cmp_ps(_mm256_and_ps(_mm256_loadu_ps(x + 8 * j), mag), va, _CMP_EQ_OQ));
                if (k) {
                    max = x[8 * j + __builtin_ctz((unsigned)k)];
                    break;
                }
            }
            float iscale = -127.0f / max;
            __m256 vs = _mm256_set1_ps(iscale);
            for (int j = 0; j < 16; j++) {
                __m256i q0 = _mm256_min_epi32(
                    _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16 * j), vs)), top);
                __m256i q1 = _mm256_min_epi32(
                    _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16 * j + 8), vs)), top);
                __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(q0, q1), 0xD8);
                _mm_storeu_si128(
                    (__m128i *)(void *)(y[b].qs + 16 * j),
                    _mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)));
                y[b].bsums[j] = (int16_t)k_hsum8i(_mm256_add_epi32(q0, q1));
            }
            y[b].d = 1.0f / iscale;
        }
        k_act_q8_k_nib_fill(g, y[b].qs);
    }
}

int k_simd_act_quantize(k_act_kind kind, const float *x, void *xq, int n, int isa) {
    if (isa > k_cpu()->isa) return 0;
    if (isa == K_ISA_AVX2) {
        switch (kind) {
        case K_ACT_Q8_0: act_q8_0_2(x, xq, n); return 1;
        case K_ACT_Q8_K: act_q8_k_2(x, xq, n); return 1;
        default: return 0;
        }
    }
    if (isa < K_ISA_AVX512) return 0;
    switch (kind) {
    case K_ACT_Q8_0: act_q8_0_5(x, xq, n); return 1;
    case K_ACT_Q8_K: act_q8_k_5(x, xq, n); return 1;
    case K_ACT_BF16: act_bf16_5(x, xq, n); return 1;
    default: return 0;
    }
}

int k_simd_widen(tlm_dtype t, const void *src, float *dst, int n) {
    if (k_cpu()->isa < K_ISA_AVX2) return 0;
    if (t == TLM_DTYPE_F16)
        widen_f16(src, dst, n);
    else if (t == TLM_DTYPE_BF16)
        widen_bf16(src, dst, n);
    else
        return 0;
    return 1;
}

int k_simd_q8_0_blocks(const float *x, void *y, int n) {
    if (k_cpu()->isa < K_ISA_AVX512) return 0;
    q8_0_blocks_5(x, y, n);
    return 1;
}

int k_simd_narrow(tlm_dtype t, const float *src, void *dst, int n) {
    if (k_cpu()->isa < K_ISA_AVX2 || t != TLM_DTYPE_F16) return 0;
    narrow_f16(src, dst, n);
    return 1;
}

k_vdot_fn k_simd_vdot(tlm_dtype t, int isa) {
    if (isa > k_cpu()->isa) return NULL;
    if (isa == K_ISA_AVX512) {
        switch (t) {
        case TLM_DTYPE_F16: return a5_f16;
        case TLM_DTYPE_BF16: return k_cpu()->avx512bf16 ? a5_bf16 : a2_bf16;
        case TLM_DTYPE_Q8_0: return a5_q8_0;
        case TLM_DTYPE_Q4_0: return a5_q4_0;
        case TLM_DTYPE_Q4_1: return a5_q4_1;
        case TLM_DTYPE_Q5_0: return a5_q5_0;
        case TLM_DTYPE_Q5_1: return a5_q5_1;
        case TLM_DTYPE_Q4_K: return a5_q4_k;
        case TLM_DTYPE_Q5_K: return a5_q5_k;
        case TLM_DTYPE_Q6_K: return a5_q6_k;
        case TLM_DTYPE_Q2_K: return a5_q2_k;
        case TLM_DTYPE_Q3_K: return a5_q3_k;
        case TLM_DTYPE_IQ4_NL: return a5_iq4_nl;
        case TLM_DTYPE_IQ4_XS: return a5_iq4_xs;
        default: return NULL;
        }
    }
    if (isa == K_ISA_AVX2) {
        switch (t) {
        case TLM_DTYPE_F16: return a2_f16;
        case TLM_DTYPE_BF16: return a2_bf16;
        case TLM_DTYPE_Q8_0: return a2_q8_0;
        case TLM_DTYPE_Q4_0: return a2_q4_0;
        case TLM_DTYPE_Q4_1: return a2_q4_1;
        case TLM_DTYPE_Q5_0: return a2_q5_0;
        case TLM_DTYPE_Q5_1: return a2_q5_1;
        case TLM_DTYPE_Q4_K: return a2_q4_k;
        case TLM_DTYPE_Q5_K: return a2_q5_k;
        case TLM_DTYPE_Q6_K: return a2_q6_k;
        case TLM_DTYPE_Q2_K: return a2_q2_k;
        case TLM_DTYPE_Q3_K: return a2_q3_k;
        case TLM_DTYPE_IQ4_NL: return a2_iq4_nl;
        case TLM_DTYPE_IQ4_XS: return a2_iq4_xs;
        default: return NULL;
        }
    }
    return NULL;
}

#else

int k_simd_act_quantize(k_act_kind kind, const float *x, void *xq, int n, int isa) {
    (void)kind, (void)x, (void)xq, (void)n, (void)isa;
    return 0;
}
int k_simd_widen(tlm_dtype t, const void *src, float *dst, int n) {
    (void)t, (void)src, (void)dst, (void)n;
    return 0;
}
int k_simd_narrow(tlm_dtype t, const float *src, void *dst, int n) {
    (void)t, (void)src, (void)dst, (void)n;
    return 0;
}
int k_simd_q8_0_blocks(const float *x, void *y, int n) {
    (void)x, (void)y, (void)n;
    return 0;
}
k_vdot_fn k_simd_vdot(tlm_dtype t, int isa) {
    (void)t;
    (void)isa;
    return NULL;
}
k_vdot_rows_fn k_simd_vdot_rows(tlm_dtype t, int isa) {
    (void)t;
    (void)isa;
    return NULL;
}
k_vdot_rows3_fn k_simd_vdot_rows3(tlm_dtype t, int isa) {
    (void)t;
    (void)isa;
    return NULL;
}
k_vdot_w4_fn k_simd_vdot_w4(tlm_dtype t, int isa) {
    (void)t;
    (void)isa;
    return NULL;
}

#endif
