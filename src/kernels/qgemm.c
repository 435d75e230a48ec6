#include "qgemm.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "core/dtype.h"
#include "core/half.h"
#include "core/quant.h"
#include "kernels.h"
#include "qdot.h"
#include "qdot_simd.h"

/* ---- the integer form of weight rows ----------------------------------------------------------
 */

int k_qgemm_sub(tlm_dtype t) {
    switch (t) {
    case TLM_DTYPE_Q8_0:
    case TLM_DTYPE_Q4_0:
    case TLM_DTYPE_Q4_1:
    case TLM_DTYPE_Q5_0:
    case TLM_DTYPE_Q5_1:
    case TLM_DTYPE_Q4_K:
    case TLM_DTYPE_Q5_K:
    case TLM_DTYPE_IQ4_NL:
    case TLM_DTYPE_IQ4_XS: return 32;
    case TLM_DTYPE_Q6_K: /* their scales change every 16 elements */
    case TLM_DTYPE_Q2_K:
    case TLM_DTYPE_Q3_K: return 16;
    default: return 0;
    }
}

int k_qgemm_covers(tlm_dtype t) { return k_qgemm_sub(t) != 0; }

int k_qgemm_takes(tlm_dtype t) { return k_qgemm_isa(t) >= 0; }

static inline uint32_t rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline float rdh(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return tlm_f16_to_f32(h);
}

/* Four bits of a fifth-bit mask (bits j .. j + 3 of qh) as bit 4 of four bytes. */
static inline uint32_t bit4x4(uint32_t qh, int j) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= ((qh >> (j + i)) & 1u) << (8 * i + 4);
    return v;
}

/* Writes word kw (elements 4kw .. 4kw + 3) of row r of a group. */
static inline void put(uint8_t *q, int kw, int r, uint32_t v) {
    memcpy(q + (size_t)kw * 4 * K_QG_ROWS + 4 * r, &v, 4);
}

/* The 32-element types: byte j of qs holds element j (low nibble) and j + 16 (high). */
static void pack_row32(tlm_dtype t, const uint8_t *blk, int nb, int r, uint8_t *q, float *s,
                       float *m) {
    for (int b = 0; b < nb; b++) {
        float d = rdh(blk), mn = 0.0f;
        const uint8_t *qs;
        uint32_t qh = 0;
        int hasqh = 0;
        switch (t) {
        case TLM_DTYPE_Q8_0:
            s[b * K_QG_ROWS + r] = d;
            m[b * K_QG_ROWS + r] = -128.0f * d;
            for (int j = 0; j < 8; j++) put(q, b * 8 + j, r, rd32(blk + 2 + 4 * j) ^ 0x80808080u);
            blk += sizeof(tlm_block_q8_0);
            continue;
        case TLM_DTYPE_Q4_0: qs = blk + 2, mn = -8.0f * d, blk += sizeof(tlm_block_q4_0); break;
        case TLM_DTYPE_Q4_1: mn = rdh(blk + 2), qs = blk + 4, blk += sizeof(tlm_block_q4_1); break;
        case TLM_DTYPE_Q5_0:
            qh = rd32(blk + 2), hasqh = 1, qs = blk + 6, mn = -16.0f * d;
            blk += sizeof(tlm_block_q5_0);
            break;
        default: /* Q5_1 */
            mn = rdh(blk + 2), qh = rd32(blk + 4), hasqh = 1, qs = blk + 8;
            blk += sizeof(tlm_block_q5_1);
            break;
        }
        s[b * K_QG_ROWS + r] = d;
        m[b * K_QG_ROWS + r] = mn;
        for (int j = 0; j < 4; j++) {
            uint32_t lo = rd32(qs + 4 * j) & 0x0F0F0F0Fu,
                     hi = (rd32(qs + 4 * j) >> 4) & 0x0F0F0F0Fu;
            if (hasqh) lo |= bit4x4(qh, 4 * j), hi |= bit4x4(qh, 16 + 4 * j);
            put(q, b * 8 + j, r, lo);
            put(q, b * 8 + 4 + j, r, hi);
        }
    }
}

/* Q4_K and Q5_K: sub-block 2g in the low nibbles of qs[32g ..], 2g + 1 in the high ones; the
 * fifth bit of element l of sub-block j is bit j of qh[l]. */
static void pack_row_q45k(tlm_dtype t, const uint8_t *blk, int nb, int r, uint8_t *q, float *s,
                          float *m) {
    size_t bytes = t == TLM_DTYPE_Q4_K ? sizeof(tlm_block_q4_k) : sizeof(tlm_block_q5_k);
    for (int b = 0; b < nb; b++, blk += bytes) {
        float d = rdh(blk), dmin = rdh(blk + 2);
        const uint8_t *scales = blk + 4, *qh = t == TLM_DTYPE_Q5_K ? blk + 16 : NULL;
        const uint8_t *qs = blk + (qh ? 48 : 16);
        for (int j = 0; j < 8; j++) {
            uint8_t sc, mn;
            tlm_q4k_scale_min(j, scales, &sc, &mn);
            s[(b * 8 + j) * K_QG_ROWS + r] = d * (float)sc;
            m[(b * 8 + j) * K_QG_ROWS + r] = -dmin * (float)mn;
            const uint8_t *g = qs + 32 * (j / 2);
            for (int w = 0; w < 8; w++) {
                uint32_t v = (rd32(g + 4 * w) >> (4 * (j & 1))) & 0x0F0F0F0Fu;
                if (qh) v |= ((rd32(qh + 4 * w) >> j) & 0x01010101u) << 4;
                put(q, b * 64 + j * 8 + w, r, v);
            }
        }
    }
}

/* Q6_K: per half of 128, element 32u + l takes a nibble of ql[l + 32 (u & 1)] (low for u < 2) and
 * bits 2u, 2u + 1 of qh[l]; sub-block e / 16 has scale d * scales[e / 16]. */
static void pack_row_q6k(const uint8_t *blk, int nb, int r, uint8_t *q, float *s, float *m) {
    for (int b = 0; b < nb; b++, blk += sizeof(tlm_block_q6_k)) {
        float d = rdh(blk + 208);
        for (int j = 0; j < 16; j++) {
            float sc = d * (float)(int8_t)blk[192 + j];
            s[(b * 16 + j) * K_QG_ROWS + r] = sc;
            m[(b * 16 + j) * K_QG_ROWS + r] = -32.0f * sc;
        }
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = blk + 64 * h, *qh = blk + 128 + 32 * h;
            for (int u = 0; u < 4; u++)
                for (int w = 0; w < 8; w++) {
                    uint32_t lo = rd32(ql + 32 * (u & 1) + 4 * w) >> (u < 2 ? 0 : 4);
                    uint32_t hi = (rd32(qh + 4 * w) >> (2 * u)) & 0x03030303u;
                    put(q, b * 64 + h * 32 + u * 8 + w, r, (lo & 0x0F0F0F0Fu) | hi << 4);
                }
        }
    }
}

/* Q2_K and Q3_K: element 32i + l of half h is plane i (bits 2i, 2i + 1) of qs[32h + l], Q3_K's
 * third bit bit 4h + i of hmask[l] (clear: 4 less, so q + 4 * bit with the offset -4 s). */
static void pack_row_q23k(tlm_dtype t, const uint8_t *blk, int nb, int r, uint8_t *q, float *s,
                          float *m) {
    int three = t == TLM_DTYPE_Q3_K;
    size_t bytes = three ? sizeof(tlm_block_q3_k) : sizeof(tlm_block_q2_k);
    for (int b = 0; b < nb; b++, blk += bytes) {
        const uint8_t *qs = blk + (three ? 32 : 16);
        for (int j = 0; j < 16; j++) {
            float *sj = &s[(b * 16 + j) * K_QG_ROWS + r], *mj = &m[(b * 16 + j) * K_QG_ROWS + r];
            if (three) {
                *sj = rdh(blk + 108) * (float)(tlm_q3k_scale(j, blk + 96) - 32);
                *mj = -4.0f * *sj;
            } else {
                *sj = rdh(blk + 80) * (float)(blk[j] & 15);
                *mj = -rdh(blk + 82) * (float)(blk[j] >> 4);
            }
        }
        for (int h = 0; h < 2; h++)
            for (int i = 0; i < 4; i++)
                for (int w = 0; w < 8; w++) {
                    uint32_t v = (rd32(qs + 32 * h + 4 * w) >> (2 * i)) & 0x03030303u;
                    if (three) v |= ((rd32(blk + 4 * w) >> (4 * h + i)) & 0x01010101u) << 2;
                    put(q, b * 64 + h * 32 + i * 8 + w, r, v);
                }
    }
}

/* IQ4_NL and IQ4_XS: each 32 values in Q4_0's layout, the table's level + 128 as the unsigned
 * byte with the offset -128 s (s: d, or IQ4_XS's d * (ls - 32)). */
static void pack_row_iq4(tlm_dtype t, const uint8_t *blk, int nb, int r, uint8_t *q, float *s,
                         float *m) {
    int xs = t == TLM_DTYPE_IQ4_XS, subs = xs ? 8 : 1;
    size_t bytes = xs ? sizeof(tlm_block_iq4_xs) : sizeof(tlm_block_iq4_nl);
    for (int b = 0; b < nb; b++, blk += bytes) {
        float d = rdh(blk);
        for (int j = 0; j < subs; j++) {
            int k = b * subs + j; /* sub-block number in the row */
            const uint8_t *qs = blk + (xs ? 8 + 16 * j : 2);
            float sj = xs ? d * (float)(tlm_iq4xs_scale(j, blk) - 32) : d;
            s[k * K_QG_ROWS + r] = sj;
            m[k * K_QG_ROWS + r] = -128.0f * sj;
            for (int w = 0; w < 4; w++) {
                uint32_t lo = 0, hi = 0;
                for (int i = 0; i < 4; i++) {
                    lo |= (uint32_t)(uint8_t)(tlm_iq4nl_values[qs[4 * w + i] & 15] + 128) << 8 * i;
                    hi |= (uint32_t)(uint8_t)(tlm_iq4nl_values[qs[4 * w + i] >> 4] + 128) << 8 * i;
                }
                put(q, k * 8 + w, r, lo);
                put(q, k * 8 + 4 + w, r, hi);
            }
        }
    }
}

void k_qgemm_pack(const tlm_weight *w, int r0, int nrows, uint8_t *q, float *s, float *m) {
    int n = (int)w->cols, sub = k_qgemm_sub(w->dtype);
    int nb = n / (int)tlm_dtype_get(w->dtype)->block_elems;
    for (int r = 0; r < K_QG_ROWS; r++) {
        if (r >= nrows) {
            for (int k = 0; k < n / 4; k++) put(q, k, r, 0);
            for (int j = 0; j < n / sub; j++) s[j * K_QG_ROWS + r] = m[j * K_QG_ROWS + r] = 0.0f;
            continue;
        }
        const uint8_t *row = (const uint8_t *)w->data + (size_t)(r0 + r) * w->row_bytes;
        switch (w->dtype) {
        case TLM_DTYPE_Q4_K:
        case TLM_DTYPE_Q5_K: pack_row_q45k(w->dtype, row, nb, r, q, s, m); break;
        case TLM_DTYPE_Q6_K: pack_row_q6k(row, nb, r, q, s, m); break;
        case TLM_DTYPE_Q2_K:
        case TLM_DTYPE_Q3_K: pack_row_q23k(w->dtype, row, nb, r, q, s, m); break;
        case TLM_DTYPE_IQ4_NL:
        case TLM_DTYPE_IQ4_XS: pack_row_iq4(w->dtype, row, nb, r, q, s, m); break;
        default: pack_row32(w->dtype, row, nb, r, q, s, m); break;
        }
    }
}

/* ---- activations -------------------------------------------------------------------------- */

void k_qgemm_quantize(const float *x, int n, int sub, int8_t *q, float *d, float *ds) {
    /* Blocks of 32 with an fp32 scale (Q8_0's form without its f16 rounding of the scale). The
     * sums let the offset m of each weight sub-block enter once per sub-block, not per element. */
    for (int b = 0; b < n / 32; b++, x += 32, q += 32) {
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) {
            float a = fabsf(x[i]);
            amax = a > amax ? a : amax;
        }
        float dd = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
        d[b] = dd;
        for (int h = 0; h < 32 / sub; h++) {
            int sum = 0;
            for (int i = h * sub; i < (h + 1) * sub; i++) {
                /* rintf (ties to even): the product cannot be fused into an add as in the
                 * 2^23 trick, so the vector version's results are the same */
                q[i] = (int8_t)rintf(x[i] * id);
                sum += q[i];
            }
            ds[b * (32 / sub) + h] = dd * (float)sum;
        }
    }
}

static void quantize_rows(int isa, const float *x, int N, int n, int sub, int8_t *xq, float *xd,
                          float *xs);

/* ---- micro-kernels ------------------------------------------------------------------------- */

/* The reference: the same operations in the same order as the vector kernel (so that the two
 * agree exactly), one output at a time. */
static void micro_ref(int n, int sub, const uint8_t *q, const float *s, const float *m,
                      const int8_t *xq, const float *xd, const float *xs, int na, float *out) {
    int nsb = n / sub, nb32 = n / 32;
    for (int a = 0; a < na; a++)
        for (int r = 0; r < K_QG_ROWS; r++) {
            float acc = 0.0f;
            for (int b = 0; b < nsb; b++) {
                int32_t isum = 0;
                for (int k = b * sub; k < (b + 1) * sub; k++)
                    isum += (int32_t)q[(size_t)(k / 4) * 4 * K_QG_ROWS + 4 * r + k % 4] *
                            xq[(size_t)a * n + k];
                float t = (float)isum * s[b * K_QG_ROWS + r];
                acc = fmaf(t, xd[a * nb32 + b * sub / 32], acc);
                acc = fmaf(m[b * K_QG_ROWS + r], xs[a * nsb + b], acc);
            }
            out[a * K_QG_ROWS + r] = acc;
        }
}

#if defined(__x86_64__) || defined(__i386__)
#include "kernels/x86/simd.h"

/* 16 weight rows x NA activation rows of accumulators over the whole row: per sub-block, int32
 * dot products by vpdpbusd (unsigned weight bytes x signed activations, 4 columns per step), then
 * acc += (i * s) * d_x + m * (d_x * sum x_q) in fp32. NA and SUB are constants at each call site,
 * so the accumulator arrays live in registers. */
K_TARGET_AVX512 static inline __attribute__((always_inline)) void
micro_t(const int NA, const int SUB, int n, const uint8_t *q, const float *s, const float *m,
        const int8_t *xq, const float *xd, const float *xs, float *out) {
    __m512 fa[K_QG_ACTS];
    __m512i ia[K_QG_ACTS];
    const int nsb = n / SUB, nb32 = n / 32;
#pragma GCC unroll 8
    for (int a = 0; a < NA; a++) fa[a] = _mm512_setzero_ps();
    for (int b = 0; b < nsb; b++) {
#pragma GCC unroll 8
        for (int a = 0; a < NA; a++) ia[a] = _mm512_setzero_si512();
        const uint8_t *qb = q + (size_t)b * SUB * K_QG_ROWS;
        const int8_t *xb = xq + (size_t)b * SUB;
#pragma GCC unroll 8
        for (int k4 = 0; k4 < SUB / 4; k4++) {
            __m512i wv = _mm512_loadu_si512((const void *)(qb + k4 * 4 * K_QG_ROWS));
#pragma GCC unroll 8
            for (int a = 0; a < NA; a++) {
                int32_t xv;
                memcpy(&xv, xb + (size_t)a * n + 4 * k4, 4);
                ia[a] = _mm512_dpbusd_epi32(ia[a], wv, _mm512_set1_epi32(xv));
            }
        }
        __m512 sv = _mm512_loadu_ps(s + b * K_QG_ROWS), mv = _mm512_loadu_ps(m + b * K_QG_ROWS);
#pragma GCC unroll 8
        for (int a = 0; a < NA; a++) {
            __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(ia[a]), sv);
            fa[a] = _mm512_fmadd_ps(t, _mm512_set1_ps(xd[a * nb32 + b * SUB / 32]), fa[a]);
            fa[a] = _mm512_fmadd_ps(mv, _mm512_set1_ps(xs[a * nsb + b]), fa[a]);
        }
    }
#pragma GCC unroll 8
    for (int a = 0; a < NA; a++) _mm512_storeu_ps(out + a * K_QG_ROWS, fa[a]);
}

#define MICRO_CASE(NA, SUB)                                                                        \
    case NA:                                                                                       \
        micro_t(NA, SUB, n, q, s, m, xq, xd, xs, out);                                             \
        return;
#define MICRO_CASES(SUB)                                                                           \
    switch (na) {                                                                                  \
        MICRO_CASE(1, SUB)                                                                         \
        MICRO_CASE(2, SUB)                                                                         \
        MICRO_CASE(3, SUB)                                                                         \
        MICRO_CASE(4, SUB)                                                                         \
        MICRO_CASE(5, SUB)                                                                         \
        MICRO_CASE(6, SUB)                                                                         \
        MICRO_CASE(7, SUB)                                                                         \
        MICRO_CASE(8, SUB)                                                                         \
    default: return;                                                                               \
    }

K_TARGET_AVX512 static void micro_avx512(int n, int sub, const uint8_t *q, const float *s,
                                         const float *m, const int8_t *xq, const float *xd,
                                         const float *xs, int na, float *out) {
    if (sub == 32) {
        MICRO_CASES(32)
    } else {
        MICRO_CASES(16)
    }
}

/* k_qgemm_quantize in vectors, with the same results: the same products x * id, rounded to nearest
 * even by vcvtps2dq (the default rounding mode) as nearest_int does. */
K_TARGET_AVX512 static void quantize_avx512(const float *x, int n, int sub, int8_t *q, float *d,
                                            float *ds) {
    const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
    for (int b = 0; b < n / 32; b++, x += 32, q += 32) {
        __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
        float amax = _mm512_reduce_max_ps(
            _mm512_max_ps(_mm512_and_ps(v0, absmask), _mm512_and_ps(v1, absmask)));
        float dd = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
        __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, _mm512_set1_ps(id)));
        __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, _mm512_set1_ps(id)));
        _mm_storeu_si128((__m128i *)q, _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtepi32_epi8(q1));
        d[b] = dd;
        int s0 = _mm512_reduce_add_epi32(q0), s1 = _mm512_reduce_add_epi32(q1);
        if (sub == 32) {
            ds[b] = dd * (float)(s0 + s1);
        } else {
            ds[2 * b] = dd * (float)s0;
            ds[2 * b + 1] = dd * (float)s1;
        }
    }
}

/* BF16 weights need no repacking: each vdpbf16ps takes one pair of columns of 16 activation rows
 * (interleaved once per call) and a broadcast pair of one weight row. R weight rows against T tiles
 * of 16 activation rows keep R*T accumulators: 8 x 3 hides vdpbf16ps's latency on both pipes,
 * where 8 x 1 left them idle about a third of the time. Each sum runs over k in order, whatever R
 * and T, so a row's result does not depend on the tiling. */
K_TARGET_AVX512BF16 static inline __attribute__((always_inline)) void
bf16_t(const int R, const int T, int n, const uint8_t *w, size_t row_bytes, const uint32_t *xt,
       size_t tile_words, float *out) {
    __m512 acc[3][8];
#pragma GCC unroll 3
    for (int t = 0; t < T; t++)
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) acc[t][r] = _mm512_setzero_ps();
    for (int kp = 0; kp < n / 2; kp++) {
        __m512bh xv[3];
#pragma GCC unroll 3
        for (int t = 0; t < T; t++)
            xv[t] =
                (__m512bh)_mm512_loadu_si512((const void *)(xt + t * tile_words + (size_t)kp * 16));
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            int32_t wv;
            memcpy(&wv, w + (size_t)r * row_bytes + 4 * (size_t)kp, 4);
            __m512bh wb = (__m512bh)_mm512_set1_epi32(wv);
#pragma GCC unroll 3
            for (int t = 0; t < T; t++) acc[t][r] = _mm512_dpbf16_ps(acc[t][r], xv[t], wb);
        }
    }
#pragma GCC unroll 3
    for (int t = 0; t < T; t++)
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) _mm512_storeu_ps(out + (t * 8 + r) * 16, acc[t][r]);
}

#define BF_CASE(R)                                                                                 \
    case R:                                                                                        \
        if (T == 3)                                                                                \
            bf16_t(R, 3, n, w, row_bytes, xt, tile_words, out);                                    \
        else if (T == 2)                                                                           \
            bf16_t(R, 2, n, w, row_bytes, xt, tile_words, out);                                    \
        else                                                                                       \
            bf16_t(R, 1, n, w, row_bytes, xt, tile_words, out);                                    \
        return;
/* out: T tiles of 8 x 16 sums (rows past R unused). */
K_TARGET_AVX512BF16 static void bf16_avx512(int R, int T, int n, const uint8_t *w, size_t row_bytes,
                                            const uint32_t *xt, size_t tile_words, float *out) {
    switch (R) {
        BF_CASE(1)
        BF_CASE(2)
        BF_CASE(3)
        BF_CASE(4)
        BF_CASE(5)
        BF_CASE(6)
        BF_CASE(7)
        BF_CASE(8)
    default: return;
    }
}

/* A row of n floats to BF16 (round to nearest even, as tlm_f32_to_bf16 for finite values). */
K_TARGET_AVX512BF16 static void bf16_round_row(const float *x, int n, uint16_t *y) {
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i));
        _mm512_storeu_si512((void *)(y + i), (__m512i)v);
    }
    for (; i < n; i++) y[i] = tlm_f32_to_bf16(x[i]);
}

/* F32 and F16 weights: the BF16 kernel's shape in fp32. 16 activation rows interleaved by column,
 * T tiles of them against R weight rows broadcast one value at a time; F16 rows are widened into
 * wf (R rows of n floats, in L1) once for all the tiles. Each sum runs over k in order. */
K_TARGET_AVX512BF16 static inline __attribute__((always_inline)) void
f32_t(const int R, const int T, int n, const float *w, size_t ldw, const float *xt,
      size_t tile_floats, float *out, const char *pf, size_t pf_step) {
    __m512 acc[3][8];
#pragma GCC unroll 3
    for (int t = 0; t < T; t++)
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) acc[t][r] = _mm512_setzero_ps();
    for (int k = 0; k < n; k++) {
        if (pf) _mm_prefetch(pf + (size_t)k * pf_step, _MM_HINT_T0);
        __m512 xv[3];
#pragma GCC unroll 3
        for (int t = 0; t < T; t++) xv[t] = _mm512_loadu_ps(xt + t * tile_floats + (size_t)k * 16);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512 wb = _mm512_set1_ps(w[(size_t)r * ldw + k]);
#pragma GCC unroll 3
            for (int t = 0; t < T; t++) acc[t][r] = _mm512_fmadd_ps(xv[t], wb, acc[t][r]);
        }
    }
#pragma GCC unroll 3
    for (int t = 0; t < T; t++)
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) _mm512_storeu_ps(out + (t * 8 + r) * 16, acc[t][r]);
}

/* Up to 8 activation rows (batched decode): a 16-row tile would leave half of every FMA idle, so
 * each vector holds two columns of 8 rows instead, xt[p * 16 + 2a + j] = x[a][2p + j], against a
 * broadcast pair of one weight row (R <= 8 rows, one accumulator each), and each lane pair is added
 * at the end (the even columns' sum and the odd ones'). n is even. */
K_TARGET_AVX512BF16 static inline __attribute__((always_inline)) void
f32p_t(const int R, int n, const float *w, size_t ldw, const float *xt, float *out, const char *pf,
       size_t pf_step) {
    __m512 acc[8];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int p = 0; p < n / 2; p++) {
        if (pf) _mm_prefetch(pf + (size_t)p * pf_step, _MM_HINT_T0);
        __m512 xv = _mm512_loadu_ps(xt + (size_t)p * 16);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            double wv;
            memcpy(&wv, w + (size_t)r * ldw + 2 * p, 8);
            acc[r] = _mm512_fmadd_ps(xv, _mm512_castpd_ps(_mm512_set1_pd(wv)), acc[r]);
        }
    }
    /* out[r * 8 + a] = lane 2a + lane 2a+1 of acc[r] */
    const __m512i even =
        _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
#pragma GCC unroll 8
    for (int r = 0; r + 1 < R; r += 2) {
        __m512 e = _mm512_permutex2var_ps(acc[r], even, acc[r + 1]);
        __m512 o = _mm512_permutex2var_ps(acc[r], odd, acc[r + 1]);
        _mm512_storeu_ps(out + r * 8, _mm512_add_ps(e, o));
    }
    if (R % 2) {
        __m512 e = _mm512_permutexvar_ps(even, acc[R - 1]),
               o = _mm512_permutexvar_ps(odd, acc[R - 1]);
        _mm256_storeu_ps(out + (R - 1) * 8, _mm512_castps512_ps256(_mm512_add_ps(e, o)));
    }
}

#define F32P_CASE(R)                                                                               \
    case R: f32p_t(R, n, w, ldw, xt, out, pf, pf_step); return;
K_TARGET_AVX512BF16 static void f32p_avx512(int R, int n, const float *w, size_t ldw,
                                            const float *xt, float *out, const char *pf,
                                            size_t pf_step) {
    switch (R) {
        F32P_CASE(1)
        F32P_CASE(2)
        F32P_CASE(3)
        F32P_CASE(4)
        F32P_CASE(5)
        F32P_CASE(6)
        F32P_CASE(7)
        F32P_CASE(8)
    default: return;
    }
}

/* Rows 0..rows-1 of x (row stride n; rows past them are zero) into dst interleaved by column,
 * dst[k * 16 + a] = x[a][k]: 16 x 16 blocks transposed in registers (k_transpose16x16), the
 * columns past the last whole block one at a time. */
K_TARGET_AVX512BF16 static void xt_tile(const float *x, int n, int rows, float *dst) {
    int k = 0;
    for (; k + 16 <= n; k += 16) {
        __m512i r[16];
        for (int i = 0; i < 16; i++)
            r[i] = _mm512_castps_si512(i < rows ? _mm512_loadu_ps(x + (size_t)i * n + k)
                                                : _mm512_setzero_ps());
        k_transpose16x16(r);
        for (int c = 0; c < 16; c++)
            _mm512_storeu_ps(dst + (size_t)(k + c) * 16, _mm512_castsi512_ps(r[c]));
    }
    for (; k < n; k++)
        for (int i = 0; i < 16; i++)
            dst[(size_t)k * 16 + i] = i < rows ? x[(size_t)i * n + k] : 0.0f;
}

#define F32_CASE(R)                                                                                \
    case R:                                                                                        \
        if (T == 3)                                                                                \
            f32_t(R, 3, n, w, ldw, xt, tile_floats, out, pf, pf_step);                             \
        else if (T == 2)                                                                           \
            f32_t(R, 2, n, w, ldw, xt, tile_floats, out, pf, pf_step);                             \
        else                                                                                       \
            f32_t(R, 1, n, w, ldw, xt, tile_floats, out, pf, pf_step);                             \
        return;
K_TARGET_AVX512BF16 static void f32_avx512(int R, int T, int n, const float *w, size_t ldw,
                                           const float *xt, size_t tile_floats, float *out,
                                           const char *pf, size_t pf_step) {
    switch (R) {
        F32_CASE(1)
        F32_CASE(2)
        F32_CASE(3)
        F32_CASE(4)
        F32_CASE(5)
        F32_CASE(6)
        F32_CASE(7)
        F32_CASE(8)
    default: return;
    }
}

/* ---- the repacking in vectors -------------------------------------------------------------- */

/* 16 bytes at p + r * rb of rows r = 0 .. 15: row 4i + k into 128-bit lane i of v[k]. */
K_TARGET_AVX512 static inline void load16x16(const uint8_t *p, size_t rb, __m512i v[4]) {
    for (int k = 0; k < 4; k++) {
        __m512i t = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(p + k * rb)));
        t = _mm512_inserti32x4(t, _mm_loadu_si128((const __m128i *)(p + (4 + k) * rb)), 1);
        t = _mm512_inserti32x4(t, _mm_loadu_si128((const __m128i *)(p + (8 + k) * rb)), 2);
        v[k] = _mm512_inserti32x4(t, _mm_loadu_si128((const __m128i *)(p + (12 + k) * rb)), 3);
    }
}

/* Those 16 bytes of rows 0 .. 15 transposed: out[j] holds word j (bytes 4j .. 4j + 3) of every row,
 * row r in 32-bit lane r. A 4 x 4 transpose within each lane of load16x16's vectors leaves rows
 * 4i .. 4i + 3 in lane i, in order. */
K_TARGET_AVX512 static inline void tr16x4(const uint8_t *p, size_t rb, __m512i out[4]) {
    __m512i v[4];
    load16x16(p, rb, v);
    __m512i t0 = _mm512_unpacklo_epi32(v[0], v[1]), t1 = _mm512_unpackhi_epi32(v[0], v[1]);
    __m512i t2 = _mm512_unpacklo_epi32(v[2], v[3]), t3 = _mm512_unpackhi_epi32(v[2], v[3]);
    out[0] = _mm512_unpacklo_epi64(t0, t2);
    out[1] = _mm512_unpackhi_epi64(t0, t2);
    out[2] = _mm512_unpacklo_epi64(t1, t3);
    out[3] = _mm512_unpackhi_epi64(t1, t3);
}

/* The first 32-bit word at p + r * rb of rows r = 0 .. 15, row r in lane r: tr16x4's loads and
 * its first word only. A gather did this in one instruction, but it cost as much as the rest of
 * the repacking (Zen 5: pack_avx512 38-48% on the instruction after it). */
K_TARGET_AVX512 static inline __m512i rows32(const uint8_t *p, size_t rb) {
    __m512i v[4];
    load16x16(p, rb, v);
    return _mm512_unpacklo_epi64(_mm512_unpacklo_epi32(v[0], v[1]),
                                 _mm512_unpacklo_epi32(v[2], v[3]));
}

/* f16 values in the low (hi = 0) or high halves of 32-bit lanes, as floats */
K_TARGET_AVX512 static inline __m512 halves(__m512i v, int hi) {
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(hi ? _mm512_srli_epi32(v, 16) : v));
}

K_TARGET_AVX512 static inline void put16(uint8_t *q, int kw, __m512i v) {
    _mm512_storeu_si512((void *)(q + (size_t)kw * 4 * K_QG_ROWS), v);
}

/* k_qgemm_pack of a whole group (16 rows) of Q8_0, Q4_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL or
 * IQ4_XS, with the same bytes and floats: 16 rows' blocks go through the 4 x 4 word transposes
 * above instead of one 32-bit word at a time. Returns 0 for types it does not take. */
K_TARGET_AVX512 static int pack_avx512(const tlm_weight *w, int r0, uint8_t *q, float *s,
                                       float *m) {
    const uint8_t *base = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;
    size_t rb = w->row_bytes;
    const __m512i lo4 = _mm512_set1_epi32(0x0F0F0F0F);
    int nb = (int)(w->cols / tlm_dtype_get(w->dtype)->block_elems);
    __m512i v[8];
    switch (w->dtype) {
    case TLM_DTYPE_Q8_0:
    case TLM_DTYPE_Q4_0: {
        /* both: an f16 scale, then the quants; offsets -128 d (Q8_0's bytes made unsigned by a
         * xor) and -8 d */
        int q8 = w->dtype == TLM_DTYPE_Q8_0;
        size_t bytes = q8 ? sizeof(tlm_block_q8_0) : sizeof(tlm_block_q4_0);
        const __m512 off = _mm512_set1_ps(q8 ? -128.0f : -8.0f);
        for (int b = 0; b < nb; b++) {
            const uint8_t *blk = base + (size_t)b * bytes;
            __m512 d = halves(rows32(blk, rb), 0);
            _mm512_storeu_ps(s + b * K_QG_ROWS, d);
            _mm512_storeu_ps(m + b * K_QG_ROWS, _mm512_mul_ps(off, d));
            tr16x4(blk + 2, rb, v);
            if (q8) {
                tr16x4(blk + 18, rb, v + 4);
                for (int j = 0; j < 8; j++)
                    put16(q, b * 8 + j,
                          _mm512_xor_si512(v[j], _mm512_set1_epi32((int)0x80808080u)));
                continue;
            }
            for (int j = 0; j < 4; j++) {
                put16(q, b * 8 + j, _mm512_and_si512(v[j], lo4));
                put16(q, b * 8 + 4 + j, _mm512_and_si512(_mm512_srli_epi32(v[j], 4), lo4));
            }
        }
        return 1;
    }
    case TLM_DTYPE_Q2_K:
    case TLM_DTYPE_Q3_K: {
        /* 16 sub-blocks of 16: s and m from each row's scale bytes and d (and dmin); the quants
         * are the qs words' 2-bit planes (and Q3_K's third bits from hmask, as bit 2) */
        int three = w->dtype == TLM_DTYPE_Q3_K;
        size_t bytes = three ? sizeof(tlm_block_q3_k) : sizeof(tlm_block_q2_k);
        const __m512i ff = _mm512_set1_epi32(0xFF), f = _mm512_set1_epi32(15),
                      m2 = _mm512_set1_epi32(0x03030303), m1 = _mm512_set1_epi32(0x01010101);
        for (int b = 0; b < nb; b++) {
            const uint8_t *blk = base + (size_t)b * bytes;
            const uint8_t *qs = blk + (three ? 32 : 16);
            __m512i qw[16], hm[8] = {0}, sc[4];
            for (int t = 0; t < 4; t++) tr16x4(qs + 16 * t, rb, qw + 4 * t);
            if (three) {
                tr16x4(blk, rb, hm);
                tr16x4(blk + 16, rb, hm + 4);
                /* bytes 94 .. 109: the last two of qs, the 12 scale bytes, then d (nothing past
                 * the block is read) */
                tr16x4(blk + 94, rb, sc);
                __m512 d = halves(sc[3], 1);
                for (int j = 0; j < 16; j++) {
                    /* scale byte i sits at byte 2 + i of the four words */
                    int i = j < 8 ? j : j - 8, k = 8 + j % 4;
                    __m512i lo =
                        _mm512_srli_epi32(sc[(2 + i) >> 2], 8 * ((2 + i) & 3) + (j < 8 ? 0 : 4));
                    __m512i hi =
                        _mm512_srli_epi32(sc[(2 + k) >> 2], 8 * ((2 + k) & 3) + 2 * (j / 4));
                    __m512i ls = _mm512_or_si512(
                        _mm512_and_si512(lo, f),
                        _mm512_slli_epi32(_mm512_and_si512(hi, _mm512_set1_epi32(3)), 4));
                    __m512 sj = _mm512_mul_ps(
                        d, _mm512_cvtepi32_ps(_mm512_sub_epi32(ls, _mm512_set1_epi32(32))));
                    _mm512_storeu_ps(s + (b * 16 + j) * K_QG_ROWS, sj);
                    _mm512_storeu_ps(m + (b * 16 + j) * K_QG_ROWS,
                                     _mm512_mul_ps(_mm512_set1_ps(-4.0f), sj));
                }
            } else {
                tr16x4(blk, rb, sc);
                /* d | dmin: the last word of bytes 68 .. 83 (nothing past the block is read) */
                __m512i tail[4];
                tr16x4(blk + 68, rb, tail);
                __m512 d = halves(tail[3], 0),
                       nmin = _mm512_sub_ps(_mm512_setzero_ps(), halves(tail[3], 1));
                for (int j = 0; j < 16; j++) {
                    __m512i by = _mm512_and_si512(_mm512_srli_epi32(sc[j / 4], 8 * (j % 4)), ff);
                    _mm512_storeu_ps(s + (b * 16 + j) * K_QG_ROWS,
                                     _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_and_si512(by, f))));
                    _mm512_storeu_ps(
                        m + (b * 16 + j) * K_QG_ROWS,
                        _mm512_mul_ps(nmin, _mm512_cvtepi32_ps(_mm512_srli_epi32(by, 4))));
                }
            }
            for (int h = 0; h < 2; h++)
                for (int i = 0; i < 4; i++)
                    for (int wd = 0; wd < 8; wd++) {
                        __m512i pl = _mm512_and_si512(_mm512_srli_epi32(qw[8 * h + wd], 2 * i), m2);
                        if (three)
                            pl = _mm512_or_si512(
                                pl,
                                _mm512_slli_epi32(
                                    _mm512_and_si512(_mm512_srli_epi32(hm[wd], 4 * h + i), m1), 2));
                        put16(q, b * 64 + h * 32 + i * 8 + wd, pl);
                    }
        }
        return 1;
    }
    case TLM_DTYPE_IQ4_NL: {
        /* Q4_0's layout, the nibbles looked up as level + 128, the offset -128 d */
        const __m512i T = _mm512_broadcast_i32x4(_mm_xor_si128(
            _mm_loadu_si128((const __m128i *)tlm_iq4nl_values), _mm_set1_epi8((char)0x80)));
        for (int b = 0; b < nb; b++) {
            const uint8_t *blk = base + (size_t)b * sizeof(tlm_block_iq4_nl);
            __m512 d = halves(rows32(blk, rb), 0);
            _mm512_storeu_ps(s + b * K_QG_ROWS, d);
            _mm512_storeu_ps(m + b * K_QG_ROWS, _mm512_mul_ps(_mm512_set1_ps(-128.0f), d));
            tr16x4(blk + 2, rb, v);
            for (int j = 0; j < 4; j++) {
                put16(q, b * 8 + j, _mm512_shuffle_epi8(T, _mm512_and_si512(v[j], lo4)));
                put16(q, b * 8 + 4 + j,
                      _mm512_shuffle_epi8(T, _mm512_and_si512(_mm512_srli_epi32(v[j], 4), lo4)));
            }
        }
        return 1;
    }
    case TLM_DTYPE_IQ4_XS: {
        /* eight IQ4_NL-like sub-blocks per block, their scales d * (ls - 32) from each row's
         * words of d | scales_h and scales_l */
        const __m512i T = _mm512_broadcast_i32x4(_mm_xor_si128(
            _mm_loadu_si128((const __m128i *)tlm_iq4nl_values), _mm_set1_epi8((char)0x80)));
        const __m512i f = _mm512_set1_epi32(15), three = _mm512_set1_epi32(3);
        for (int b = 0; b < nb; b++) {
            const uint8_t *blk = base + (size_t)b * sizeof(tlm_block_iq4_xs);
            __m512i hd[4];
            tr16x4(blk, rb, hd);
            __m512 d = halves(hd[0], 0);
            for (int j = 0; j < 8; j++) {
                __m512i ls = _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi32(hd[1], 4 * j), f),
                    _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(hd[0], 16 + 2 * j), three),
                                      4));
                __m512 sj = _mm512_mul_ps(
                    d, _mm512_cvtepi32_ps(_mm512_sub_epi32(ls, _mm512_set1_epi32(32))));
                _mm512_storeu_ps(s + (b * 8 + j) * K_QG_ROWS, sj);
                _mm512_storeu_ps(m + (b * 8 + j) * K_QG_ROWS,
                                 _mm512_mul_ps(_mm512_set1_ps(-128.0f), sj));
                tr16x4(blk + 8 + 16 * j, rb, v);
                for (int k = 0; k < 4; k++) {
                    put16(q, (b * 8 + j) * 8 + k,
                          _mm512_shuffle_epi8(T, _mm512_and_si512(v[k], lo4)));
                    put16(
                        q, (b * 8 + j) * 8 + 4 + k,
                        _mm512_shuffle_epi8(T, _mm512_and_si512(_mm512_srli_epi32(v[k], 4), lo4)));
                }
            }
        }
        return 1;
    }
    case TLM_DTYPE_Q4_K:
    case TLM_DTYPE_Q5_K: {
        int q5 = w->dtype == TLM_DTYPE_Q5_K;
        size_t bytes = q5 ? sizeof(tlm_block_q5_k) : sizeof(tlm_block_q4_k);
        const __m512i m6 = _mm512_set1_epi32(0x3F3F3F3F), h2 = _mm512_set1_epi32(0x30303030);
        const __m512i ff = _mm512_set1_epi32(0xFF);
        for (int b = 0; b < nb; b++) {
            const uint8_t *blk = base + (size_t)b * bytes;
            __m512i hd[4]; /* d and dmin, then the 12 bytes of scales and mins */
            tr16x4(blk, rb, hd);
            __m512 d = halves(hd[0], 0),
                   nmin = _mm512_sub_ps(_mm512_setzero_ps(), halves(hd[0], 1));
            /* tlm_q4k_scale_min on four sub-blocks at a time, a byte per sub-block */
            __m512i s0 = hd[1], s1 = hd[2], s2 = hd[3];
            __m512i sc[2] = {_mm512_and_si512(s0, m6),
                             _mm512_or_si512(_mm512_and_si512(s2, lo4),
                                             _mm512_and_si512(_mm512_srli_epi32(s0, 2), h2))};
            __m512i mn[2] = {_mm512_and_si512(s1, m6),
                             _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(s2, 4), lo4),
                                             _mm512_and_si512(_mm512_srli_epi32(s1, 2), h2))};
            for (int j = 0; j < 8; j++) {
                __m512i scj = _mm512_and_si512(_mm512_srli_epi32(sc[j / 4], 8 * (j % 4)), ff);
                __m512i mnj = _mm512_and_si512(_mm512_srli_epi32(mn[j / 4], 8 * (j % 4)), ff);
                _mm512_storeu_ps(s + (b * 8 + j) * K_QG_ROWS,
                                 _mm512_mul_ps(d, _mm512_cvtepi32_ps(scj)));
                _mm512_storeu_ps(m + (b * 8 + j) * K_QG_ROWS,
                                 _mm512_mul_ps(nmin, _mm512_cvtepi32_ps(mnj)));
            }
            __m512i qh[8];
            if (q5) tr16x4(blk + 16, rb, qh), tr16x4(blk + 32, rb, qh + 4);
            const uint8_t *qs = blk + (q5 ? 48 : 16);
            for (int g = 0; g < 4; g++) {
                tr16x4(qs + 32 * g, rb, v);
                tr16x4(qs + 32 * g + 16, rb, v + 4);
                for (int wd = 0; wd < 8; wd++) {
                    __m512i a = _mm512_and_si512(v[wd], lo4);
                    __m512i c = _mm512_and_si512(_mm512_srli_epi32(v[wd], 4), lo4);
                    if (q5) {
                        const __m512i one = _mm512_set1_epi32(0x01010101);
                        a = _mm512_or_si512(
                            a, _mm512_slli_epi32(
                                   _mm512_and_si512(_mm512_srli_epi32(qh[wd], 2 * g), one), 4));
                        c = _mm512_or_si512(
                            c, _mm512_slli_epi32(
                                   _mm512_and_si512(_mm512_srli_epi32(qh[wd], 2 * g + 1), one), 4));
                    }
                    put16(q, b * 64 + 2 * g * 8 + wd, a);
                    put16(q, b * 64 + (2 * g + 1) * 8 + wd, c);
                }
            }
        }
        return 1;
    }
    case TLM_DTYPE_Q6_K:
        for (int b = 0; b < nb; b++) {
            const uint8_t *blk = base + (size_t)b * sizeof(tlm_block_q6_k);
            /* the 16 scales, then d (the block's last two bytes, read as the high half of the
             * word ending there, so that no read passes the block's end) */
            __m512i scw[4], dw[4];
            tr16x4(blk + 192, rb, scw);
            tr16x4(blk + 194, rb, dw);
            __m512 d = halves(dw[3], 1);
            for (int k = 0; k < 4; k++) {
                __m512i sc = scw[k];
                for (int i = 0; i < 4; i++) {
                    __m512i e = _mm512_srai_epi32(_mm512_slli_epi32(sc, 24 - 8 * i), 24);
                    __m512 f = _mm512_mul_ps(d, _mm512_cvtepi32_ps(e));
                    _mm512_storeu_ps(s + (b * 16 + 4 * k + i) * K_QG_ROWS, f);
                    _mm512_storeu_ps(m + (b * 16 + 4 * k + i) * K_QG_ROWS,
                                     _mm512_mul_ps(_mm512_set1_ps(-32.0f), f));
                }
            }
            for (int h = 0; h < 2; h++) {
                __m512i ql[16], qh[8];
                for (int k = 0; k < 4; k++) tr16x4(blk + 64 * h + 16 * k, rb, ql + 4 * k);
                tr16x4(blk + 128 + 32 * h, rb, qh);
                tr16x4(blk + 128 + 32 * h + 16, rb, qh + 4);
                for (int u = 0; u < 4; u++)
                    for (int wd = 0; wd < 8; wd++) {
                        __m512i lo = _mm512_srli_epi32(ql[8 * (u & 1) + wd], u < 2 ? 0 : 4);
                        __m512i hi = _mm512_and_si512(_mm512_srli_epi32(qh[wd], 2 * u),
                                                      _mm512_set1_epi32(0x03030303));
                        put16(q, b * 64 + h * 32 + u * 8 + wd,
                              _mm512_or_si512(_mm512_and_si512(lo, lo4), _mm512_slli_epi32(hi, 4)));
                    }
            }
        }
        return 1;
    default: return 0;
    }
}

/* ---- AVX2 (no VNNI) ---- */

/* The largest unsigned byte of the type's integer form, where AVX2's micro-kernel takes it; 0 where
 * it does not. maddubs multiplies unsigned weight bytes by the signed activation bytes (|x| <= 127)
 * and adds pairs into int16, saturating past 32767: weights up to 63 fit (2 * 63 * 127 = 16002).
 * Q8_0's and the IQ4 types' bytes (w + 128) reach 255 and stay on widened tiles and sgemm. */
static int avx2_wmax(tlm_dtype t) {
    switch (t) {
    case TLM_DTYPE_Q2_K: return 3;
    case TLM_DTYPE_Q3_K: return 7;
    case TLM_DTYPE_Q4_0:
    case TLM_DTYPE_Q4_1:
    case TLM_DTYPE_Q4_K: return 15;
    case TLM_DTYPE_Q5_0:
    case TLM_DTYPE_Q5_1:
    case TLM_DTYPE_Q5_K: return 31;
    case TLM_DTYPE_Q6_K: return 63;
    default: return 0;
    }
}

/* A sub-block's int32 sums of 16 rows (two vectors) x NA activation rows into the fp32 sums, with
 * micro_ref's operations in its order: acc += (i * s) * d_x + m * (d_x * sum x_q). */
K_TARGET_AVX2 static inline __attribute__((always_inline)) void
sub_scale2(const int NA, __m256 fa[][2], __m256i ia[][2], const float *s, const float *m,
           const float *xd, int nb32, const float *xs, int nsb) {
    for (int h = 0; h < 2; h++) {
        __m256 sv = _mm256_loadu_ps(s + 8 * h), mv = _mm256_loadu_ps(m + 8 * h);
        for (int a = 0; a < NA; a++) {
            __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(ia[a][h]), sv);
            fa[a][h] = _mm256_fmadd_ps(t, _mm256_set1_ps(xd[a * nb32]), fa[a][h]);
            fa[a][h] = _mm256_fmadd_ps(mv, _mm256_set1_ps(xs[a * nsb]), fa[a][h]);
        }
    }
}

/* 16 weight rows (two vectors of 8) x NA activation rows: per 4 columns, maddubs of the packed
 * bytes by the activation's 4 bytes broadcast, the int16 pairs added up over G such steps (as many
 * as stay below 32768: G * 2 * wmax * 127), then widened to int32 by madd; per sub-block, the
 * reference's fp32 steps. The integers are exact, so the results are micro_ref's bit for bit. */
K_TARGET_AVX2 static inline __attribute__((always_inline)) void
micro2_t(const int NA, const int SUB, const int G, int n, const uint8_t *q, const float *s,
         const float *m, const int8_t *xq, const float *xd, const float *xs, float *out) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 fa[3][2];
    const int nsb = n / SUB, nb32 = n / 32;
    for (int a = 0; a < NA; a++) fa[a][0] = fa[a][1] = _mm256_setzero_ps();
    for (int b = 0; b < nsb; b++) {
        __m256i ia[3][2];
        const uint8_t *qb = q + (size_t)b * SUB * K_QG_ROWS;
        const int8_t *xb = xq + (size_t)b * SUB;
        for (int k0 = 0; k0 < SUB / 4; k0 += G) {
            __m256i h16[3][2];
            for (int a = 0; a < NA; a++) h16[a][0] = h16[a][1] = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int k4 = k0; k4 < k0 + G; k4++) {
                const uint8_t *qk = qb + k4 * 4 * K_QG_ROWS;
                __m256i w0 = _mm256_loadu_si256((const __m256i *)(const void *)qk);
                __m256i w1 = _mm256_loadu_si256((const __m256i *)(const void *)(qk + 32));
                for (int a = 0; a < NA; a++) {
                    int32_t xv;
                    memcpy(&xv, xb + (size_t)a * n + 4 * k4, 4);
                    __m256i xb4 = _mm256_set1_epi32(xv);
                    h16[a][0] = _mm256_add_epi16(h16[a][0], _mm256_maddubs_epi16(w0, xb4));
                    h16[a][1] = _mm256_add_epi16(h16[a][1], _mm256_maddubs_epi16(w1, xb4));
                }
            }
            for (int a = 0; a < NA; a++)
                for (int h = 0; h < 2; h++) {
                    __m256i v = _mm256_madd_epi16(h16[a][h], ones);
                    ia[a][h] = k0 ? _mm256_add_epi32(ia[a][h], v) : v;
                }
        }
        sub_scale2(NA, fa, ia, s + b * K_QG_ROWS, m + b * K_QG_ROWS, xd + b * SUB / 32, nb32,
                   xs + b, nsb);
    }
    for (int a = 0; a < NA; a++)
        for (int h = 0; h < 2; h++) _mm256_storeu_ps(out + a * K_QG_ROWS + 8 * h, fa[a][h]);
}

/* k_qgemm_quantize with AVX2, the same results (as quantize_avx512). */
K_TARGET_AVX2 static void quantize_avx2(const float *x, int n, int sub, int8_t *q, float *d,
                                        float *ds) {
    for (int b = 0; b < n / 32; b++, x += 32, q += 32) {
        __m256i qi[4];
        float dd = k_q8_block_avx2(x, q, qi) / 127.0f;
        d[b] = dd;
        __m256i s0 = _mm256_add_epi32(qi[0], qi[1]), s1 = _mm256_add_epi32(qi[2], qi[3]);
        if (sub == 32) {
            ds[b] = dd * (float)k_hsum8i(_mm256_add_epi32(s0, s1));
        } else {
            ds[2 * b] = dd * (float)k_hsum8i(s0);
            ds[2 * b + 1] = dd * (float)k_hsum8i(s1);
        }
    }
}

/* With AVX-VNNI: vpdpbusd on 8 rows' 4 bytes at a time into int32 directly (no int16 step, so any
 * type's bytes, Q8_0's and IQ4's up to 255 too), NA activation rows; again micro_ref's results. */
K_TARGET_AVXVNNI static inline __attribute__((always_inline)) void
micro3_t(const int NA, const int SUB, int n, const uint8_t *q, const float *s, const float *m,
         const int8_t *xq, const float *xd, const float *xs, float *out) {
    __m256 fa[3][2];
    const int nsb = n / SUB, nb32 = n / 32;
    for (int a = 0; a < NA; a++) fa[a][0] = fa[a][1] = _mm256_setzero_ps();
    for (int b = 0; b < nsb; b++) {
        __m256i ia[3][2];
        for (int a = 0; a < NA; a++) ia[a][0] = ia[a][1] = _mm256_setzero_si256();
        const uint8_t *qb = q + (size_t)b * SUB * K_QG_ROWS;
        const int8_t *xb = xq + (size_t)b * SUB;
#pragma GCC unroll 8
        for (int k4 = 0; k4 < SUB / 4; k4++) {
            const uint8_t *qk = qb + k4 * 4 * K_QG_ROWS;
            __m256i w0 = _mm256_loadu_si256((const __m256i *)(const void *)qk);
            __m256i w1 = _mm256_loadu_si256((const __m256i *)(const void *)(qk + 32));
            for (int a = 0; a < NA; a++) {
                int32_t xv;
                memcpy(&xv, xb + (size_t)a * n + 4 * k4, 4);
                __m256i xb4 = _mm256_set1_epi32(xv);
                ia[a][0] = _mm256_dpbusd_avx_epi32(ia[a][0], w0, xb4);
                ia[a][1] = _mm256_dpbusd_avx_epi32(ia[a][1], w1, xb4);
            }
        }
        sub_scale2(NA, fa, ia, s + b * K_QG_ROWS, m + b * K_QG_ROWS, xd + b * SUB / 32, nb32,
                   xs + b, nsb);
    }
    for (int a = 0; a < NA; a++)
        for (int h = 0; h < 2; h++) _mm256_storeu_ps(out + a * K_QG_ROWS + 8 * h, fa[a][h]);
}

#define MICRO3_ROWS(SUB)                                                                           \
    do {                                                                                           \
        int a = 0;                                                                                 \
        for (; a + 3 <= na; a += 3)                                                                \
            micro3_t(3, SUB, n, q, s, m, xq + (size_t)a * n, xd + a * (n / 32),                    \
                     xs + a * (n / SUB), out + a * K_QG_ROWS);                                     \
        if (na - a == 2)                                                                           \
            micro3_t(2, SUB, n, q, s, m, xq + (size_t)a * n, xd + a * (n / 32),                    \
                     xs + a * (n / SUB), out + a * K_QG_ROWS);                                     \
        else if (na - a == 1)                                                                      \
            micro3_t(1, SUB, n, q, s, m, xq + (size_t)a * n, xd + a * (n / 32),                    \
                     xs + a * (n / SUB), out + a * K_QG_ROWS);                                     \
    } while (0)

K_TARGET_AVXVNNI static void micro_avxvnni(int n, int sub, const uint8_t *q, const float *s,
                                           const float *m, const int8_t *xq, const float *xd,
                                           const float *xs, int na, float *out) {
    if (sub == 32)
        MICRO3_ROWS(32);
    else
        MICRO3_ROWS(16);
}

/* Activation rows three at a time (each weight vector loaded once for the three; with more the
 * accumulators would not fit AVX2's 16 registers). */
#define MICRO2_ROWS(SUB, G)                                                                        \
    do {                                                                                           \
        int a = 0;                                                                                 \
        for (; a + 3 <= na; a += 3)                                                                \
            micro2_t(3, SUB, G, n, q, s, m, xq + (size_t)a * n, xd + a * (n / 32),                 \
                     xs + a * (n / SUB), out + a * K_QG_ROWS);                                     \
        if (na - a == 2)                                                                           \
            micro2_t(2, SUB, G, n, q, s, m, xq + (size_t)a * n, xd + a * (n / 32),                 \
                     xs + a * (n / SUB), out + a * K_QG_ROWS);                                     \
        else if (na - a == 1)                                                                      \
            micro2_t(1, SUB, G, n, q, s, m, xq + (size_t)a * n, xd + a * (n / 32),                 \
                     xs + a * (n / SUB), out + a * K_QG_ROWS);                                     \
    } while (0)

K_TARGET_AVX2 static void micro_avx2(int wmax, int n, int sub, const uint8_t *q, const float *s,
                                     const float *m, const int8_t *xq, const float *xd,
                                     const float *xs, int na, float *out) {
    if (sub == 32) {
        if (wmax <= 15)
            MICRO2_ROWS(32, 8);
        else
            MICRO2_ROWS(32, 4);
    } else {
        if (wmax <= 31)
            MICRO2_ROWS(16, 4);
        else
            MICRO2_ROWS(16, 2);
    }
}

#define HAVE_X86 1
#define HAVE_AVX512 1
#else
#define HAVE_X86 0
#define HAVE_AVX512 0
#endif

int k_qgemm_bf16_ok(void) { return HAVE_AVX512 && k_cpu()->avx512bf16; }

int k_fgemm_ok(void) { return HAVE_AVX512 && k_isa() >= K_ISA_AVX512; }

static int isa_ok(int isa) {
    if (isa == K_ISA_REF) return 1;
    if (isa == K_ISA_AVX2) return HAVE_X86 && k_cpu()->isa >= K_ISA_AVX2;
    return HAVE_AVX512 && isa == K_ISA_AVX512 && k_cpu()->isa >= K_ISA_AVX512;
}

static atomic_int avxvnni_on = 1;

void k_qgemm_avxvnni_enable(int on) { atomic_store(&avxvnni_on, on); }

int k_qgemm_avxvnni_ok(void) { return HAVE_X86 && atomic_load(&avxvnni_on) && k_avxvnni(); }

/* Whether AVX2's level takes the type: every covered type with AVX-VNNI, else those whose bytes
 * fit maddubs. */
static int avx2_takes(tlm_dtype t) {
#if HAVE_X86
    return k_qgemm_covers(t) && (k_qgemm_avxvnni_ok() || avx2_wmax(t));
#else
    (void)t;
    return 0;
#endif
}

/* The instruction set k_qgemm runs the type at on this CPU (TLM_ISA capped), or -1. */
int k_qgemm_isa(tlm_dtype t) {
    if (t == TLM_DTYPE_BF16)
        return k_isa() >= K_ISA_AVX512 && k_qgemm_bf16_ok() ? K_ISA_AVX512 : -1;
    if (!k_qgemm_covers(t)) return -1;
    if (k_isa() >= K_ISA_AVX512) return K_ISA_AVX512;
    if (k_isa() >= K_ISA_AVX2 && avx2_takes(t)) return K_ISA_AVX2;
    return -1;
}

void k_qgemm_pack_isa(int isa, const tlm_weight *w, int r0, int nrows, uint8_t *q, float *s,
                      float *m) {
#if HAVE_AVX512
    if (isa == K_ISA_AVX512 && isa_ok(isa) && nrows == K_QG_ROWS && pack_avx512(w, r0, q, s, m))
        return;
#endif
    k_qgemm_pack(w, r0, nrows, q, s, m);
}

void k_qgemm_micro(int isa, tlm_dtype t, int n, int sub, const uint8_t *q, const float *s,
                   const float *m, const int8_t *xq, const float *xd, const float *xs, int na,
                   float *out) {
#if HAVE_AVX512
    if (isa == K_ISA_AVX512 && isa_ok(isa)) {
        micro_avx512(n, sub, q, s, m, xq, xd, xs, na, out);
        return;
    }
    if (isa == K_ISA_AVX2 && isa_ok(isa) && k_qgemm_avxvnni_ok()) {
        micro_avxvnni(n, sub, q, s, m, xq, xd, xs, na, out);
        return;
    }
    if (isa == K_ISA_AVX2 && isa_ok(isa) && avx2_wmax(t)) {
        micro_avx2(avx2_wmax(t), n, sub, q, s, m, xq, xd, xs, na, out);
        return;
    }
#else
    (void)t;
#endif
    micro_ref(n, sub, q, s, m, xq, xd, xs, na, out);
}

typedef struct {
    const float *x;
    int8_t *xq;
    float *xd, *xs;
    int isa, n, sub;
} quant_ctx;

static void quantize_some(void *ctx, long a, long b) {
    const quant_ctx *c = ctx;
    size_t n = (size_t)c->n, nb32 = n / 32, nsb = n / (size_t)c->sub;
    for (long i = a; i < b; i++) {
#if HAVE_AVX512
        if (c->isa == K_ISA_AVX512) {
            quantize_avx512(c->x + i * n, c->n, c->sub, c->xq + i * n, c->xd + i * nb32,
                            c->xs + i * nsb);
            continue;
        }
        if (c->isa == K_ISA_AVX2) {
            quantize_avx2(c->x + i * n, c->n, c->sub, c->xq + i * n, c->xd + i * nb32,
                          c->xs + i * nsb);
            continue;
        }
#endif
        k_qgemm_quantize(c->x + i * n, c->n, c->sub, c->xq + i * n, c->xd + i * nb32,
                         c->xs + i * nsb);
    }
}

/* Rows by k_team_units, as every loop of these products: a decode step of many sequences
 * (tlm serve) runs them on the pool, and so opens no OpenMP region (kernels.h, k_team_pool). */
static void quantize_rows(int isa, const float *x, int N, int n, int sub, int8_t *xq, float *xd,
                          float *xs) {
    quant_ctx c = {x, xq, xd, xs, isa, n, sub};
    k_team_units(N, (long)N * n >= K_PAR_MIN, 0, quantize_some, &c);
}

/* ---- repacked weights kept for a model's life -------------------------------------------------
 */

/* With TLM_QCACHE=on, weights whose data lies in a registered range (a model's mapped file) are
 * repacked once, on the first product that needs them, and kept until the range is forgotten (the
 * model is freed). By default, and for weights not owned by a model, every call repacks group by
 * group. Entries are immutable once published, and every access holds the lock, so the model stays
 * shareable. */
typedef struct qc_range {
    const char *base;
    size_t len;
    struct qc_range *next;
} qc_range;

typedef struct qc_entry {
    const void *data;
    tlm_dtype t;
    int64_t rows, cols;
    size_t row_bytes, bytes;
    void *packed; /* groups of pack_bytes, back to back */
    struct qc_entry *next;
} qc_entry;

static pthread_mutex_t qc_lock = PTHREAD_MUTEX_INITIALIZER;
static qc_range *qc_ranges;
static qc_entry *qc_entries;

void k_qgemm_register(const void *base, size_t len) {
    qc_range *r = malloc(sizeof *r);
    if (!r) return; /* then its weights are repacked per call */
    pthread_mutex_lock(&qc_lock);
    *r = (qc_range){base, len, qc_ranges};
    qc_ranges = r;
    pthread_mutex_unlock(&qc_lock);
}

static int in_range(const void *p, const char *base, size_t len) {
    return (const char *)p >= base && (size_t)((const char *)p - base) < len;
}

void k_qgemm_forget(const void *base, size_t len) {
    pthread_mutex_lock(&qc_lock);
    for (qc_range **r = &qc_ranges; *r;) {
        if ((*r)->base == base && (*r)->len == len) {
            qc_range *dead = *r;
            *r = dead->next;
            free(dead);
        } else {
            r = &(*r)->next;
        }
    }
    for (qc_entry **e = &qc_entries; *e;) {
        if (in_range((*e)->data, base, len)) {
            qc_entry *dead = *e;
            *e = dead->next;
            tlm_big_free(dead->packed, dead->bytes);
            free(dead);
        } else {
            e = &(*e)->next;
        }
    }
    pthread_mutex_unlock(&qc_lock);
}

size_t k_qgemm_cached_bytes(const void *base, size_t len) {
    size_t n = 0;
    pthread_mutex_lock(&qc_lock);
    for (qc_entry *e = qc_entries; e; e = e->next)
        if (in_range(e->data, base, len)) n += e->bytes;
    pthread_mutex_unlock(&qc_lock);
    return n;
}

static size_t pack_bytes_of(int n, int sub) {
    return 2 * ((size_t)n / sub) * K_QG_ROWS * sizeof(float) + (size_t)n * K_QG_ROWS;
}

/* The whole weight repacked, from the cache or built now; NULL when w is not in a registered
 * range or there is no memory for it. */
static const char *cached_pack(const tlm_weight *w, size_t pack_bytes, int isa) {
    /* Only with TLM_QCACHE=on. Repacking per call (pack_avx512) costs about what reading a kept
     * copy saves, and the copy takes 1.25 bytes per weight (more than a Q4 file) and makes a
     * one-shot prompt pay for building it; on this project's VM the first prompts after it is built
     * also ran at half speed. */
    const char *env = getenv("TLM_QCACHE");
    if (!env || strcmp(env, "on")) return NULL;
    const char *found = NULL;
    pthread_mutex_lock(&qc_lock);
    for (qc_entry *e = qc_entries; e && !found; e = e->next)
        if (e->data == w->data && e->t == w->dtype && e->rows == w->rows && e->cols == w->cols &&
            e->row_bytes == w->row_bytes)
            found = e->packed;
    int ours = 0;
    for (qc_range *r = qc_ranges; r && !ours; r = r->next)
        ours = in_range(w->data, r->base, r->len);
    if (!found && ours) {
        /* Built under the lock: a second caller waits for this copy rather than making its own. */
        int groups = (int)((w->rows + K_QG_ROWS - 1) / K_QG_ROWS), nsb = 0;
        size_t bytes = (size_t)groups * pack_bytes;
        qc_entry *e = malloc(sizeof *e);
        /* huge pages where the system gives them: far fewer faults on the first touch */
        void *p = e ? tlm_big_alloc(bytes) : NULL;
        if (p) {
            nsb = (int)(w->cols / k_qgemm_sub(w->dtype));
#pragma omp parallel for schedule(static)
            for (int g = 0; g < groups; g++) {
                float *ps = (float *)((char *)p + (size_t)g * pack_bytes),
                      *pm = ps + nsb * K_QG_ROWS;
                int r0 = g * K_QG_ROWS;
                int nr = w->rows - r0 < K_QG_ROWS ? (int)(w->rows - r0) : K_QG_ROWS;
                k_qgemm_pack_isa(isa, w, r0, nr, (uint8_t *)(pm + nsb * K_QG_ROWS), ps, pm);
            }
            *e =
                (qc_entry){w->data, w->dtype, w->rows, w->cols, w->row_bytes, bytes, p, qc_entries};
            qc_entries = e;
            found = p;
        } else {
            free(e);
        }
    }
    pthread_mutex_unlock(&qc_lock);
    return found;
}

/* ---- the product ---------------------------------------------------------------------------- */

/* Tiles of 16 activation rows per chunk (in threes): a chunk of tile_bytes each stays in L2 while
 * every weight block passes over it (prompts and training's products have hundreds to thousands
 * of rows). */
static int tiles_per_chunk(size_t tile_bytes) {
    int chunk = (int)((512u << 10) / tile_bytes) / 3 * 3;
    return chunk < 3 ? 3 : chunk;
}

/* T tiles of sums tile[t][r][a] (8 weight rows r, 16 activation rows a) into y: activation rows
 * from t0 * 16 (those below N), columns r0..r0+R-1, plus b (may be NULL). */
static void store_tiles(float *y, int ldy, const float *tile, int t0, int T, int N, int r0, int R,
                        const float *b) {
    for (int t = t0; t < t0 + T; t++) {
        const float *tt = tile + (t - t0) * 8 * 16;
        int na = N - t * 16 < 16 ? N - t * 16 : 16;
        for (int a = 0; a < na; a++) {
            float *yr = y + (size_t)(t * 16 + a) * ldy + r0;
            for (int r = 0; r < R; r++) yr[r] = tt[r * 16 + a] + (b ? b[r0 + r] : 0.0f);
        }
    }
}

/* The plain C reference of the BF16 kernel: products of BF16 values are exact in fp32, summed in
 * pairs as vdpbf16ps does (up to its rounding of each step). */
static void bf16_ref(int R, int n, const uint8_t *w, size_t row_bytes, const uint32_t *xt,
                     float *out) {
    for (int r = 0; r < R; r++)
        for (int a = 0; a < 16; a++) {
            float acc = 0.0f;
            for (int kp = 0; kp < n / 2; kp++) {
                uint16_t wv[2], xv[2];
                memcpy(wv, w + (size_t)r * row_bytes + 4 * (size_t)kp, 4);
                memcpy(xv, xt + (size_t)kp * 16 + a, 4);
                acc += tlm_bf16_to_f32(wv[0]) * tlm_bf16_to_f32(xv[0]) +
                       tlm_bf16_to_f32(wv[1]) * tlm_bf16_to_f32(xv[1]);
            }
            out[r * 16 + a] = acc;
        }
}

/* bf16_gemm's product, shared by its two loops: tiles [a, b) of the activation rows into xt, then
 * weight blocks [a, b) against tiles c0..c1-1. */
typedef struct {
    float *y;
    const float *x, *b;
    const tlm_weight *w;
    uint32_t *xt;
    size_t tile_words;
    int ldy, N, isa, c0, c1;
} bgemm_ctx;

static void bf16_tiles(void *ctx, long ta, long tb) {
    const bgemm_ctx *c = ctx;
    int n = (int)c->w->cols, N = c->N;
    for (long t = ta; t < tb; t++) {
        uint32_t *dst = c->xt + (size_t)t * c->tile_words;
        uint16_t row[64];
        for (int a = 0; a < 16; a++) {
            long i = t * 16 + a;
            for (int k0 = 0; k0 < n; k0 += 64) {
                int len = n - k0 < 64 ? n - k0 : 64;
                if (i >= N) {
                    memset(row, 0, sizeof row);
                } else {
#if HAVE_AVX512
                    if (c->isa == K_ISA_AVX512)
                        bf16_round_row(c->x + (size_t)i * n + k0, len, row);
                    else
#endif
                        for (int k = 0; k < len; k++)
                            row[k] = tlm_f32_to_bf16(c->x[(size_t)i * n + k0 + k]);
                }
                for (int kp = 0; kp < len / 2; kp++)
                    memcpy(dst + (size_t)(k0 / 2 + kp) * 16 + a, row + 2 * kp, 4);
            }
        }
    }
}

static void bf16_blocks(void *ctx, long ba, long bb) {
    const bgemm_ctx *c = ctx;
    const tlm_weight *w = c->w;
    int n = (int)w->cols, out = (int)w->rows;
    for (long bl = ba; bl < bb; bl++) {
        int r0 = (int)bl * 8, R = out - r0 < 8 ? out - r0 : 8;
        const uint8_t *wr = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;
        float tile[3 * 8 * 16];
        for (int t0 = c->c0; t0 < c->c1; t0 += 3) {
            int T = c->c1 - t0 < 3 ? c->c1 - t0 : 3;
#if HAVE_AVX512
            if (c->isa == K_ISA_AVX512)
                bf16_avx512(R, T, n, wr, w->row_bytes, c->xt + (size_t)t0 * c->tile_words,
                            c->tile_words, tile);
            else
#endif
                for (int t = 0; t < T; t++)
                    bf16_ref(R, n, wr, w->row_bytes, c->xt + (size_t)(t0 + t) * c->tile_words,
                             tile + t * 8 * 16);
            store_tiles(c->y, c->ldy, tile, t0, T, c->N, r0, R, c->b);
        }
    }
}

/* ---- BF16 weights on AMX tiles ---------------------------------------------------------------
 * Where the CPU has AMX (amx-tile, amx-bf16), one tdpbf16ps multiplies 16 activation rows by 16
 * weight rows over 32 columns (8192 products) where vdpbf16ps does 16 x 2. The activations are
 * rounded to BF16 rows (zero past n to a multiple of 32 and past N to a multiple of 32), the
 * weight is taken 32 rows at a time and transposed into tdpbf16ps's pair layout (tile row k: the
 * 32-bit pair of columns 2k, 2k + 1 of each of 16 weight rows) in a per-thread buffer, and four
 * accumulator tiles hold 32 x 32 sums while two activation tiles and two weight tiles stream by.
 * Every sum runs over k in order in pairs, as the vdpbf16ps kernel's do (AMX multiplies the even
 * column first; vdpbf16ps the odd one: results agree to rounding, not bit for bit). */
static atomic_int amx_state = -1; /* -1: not read yet; 0: off; 1: on where the CPU has it */

static int amx_switch(void) {
    int st = atomic_load_explicit(&amx_state, memory_order_relaxed);
    if (st < 0) {
        const char *e = getenv("TLM_AMX");
        st = !(e && !strcmp(e, "off"));
        atomic_store_explicit(&amx_state, st, memory_order_relaxed);
    }
    return st;
}

int k_qgemm_amx_ok(void) {
    return amx_switch() && HAVE_AVX512 && k_cpu()->amx_bf16 && k_isa() >= K_ISA_AVX512;
}

void k_qgemm_amx_enable(int on) {
    atomic_store_explicit(&amx_state, on ? 1 : 0, memory_order_relaxed);
}

#if HAVE_AVX512
#define AMX_ROWS 32                  /* weight rows, and activation rows, per block */
#define AMX_CHUNK (8 * AMX_ROWS)     /* activation rows per pass over the weight */
#define AMX_PAIR_BYTES (2 * 16 * 64) /* the two weight tiles of one step of 32 columns */

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_config;

/* Loads the calling thread's tile configuration: tile t has rows[t] rows of colsb[t] bytes. */
K_TARGET_AMX_INT8 static void amx_config_load(const uint8_t rows[8], const uint16_t colsb[8]) {
    _Alignas(64) amx_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = rows[t];
        cfg.colsb[t] = colsb[t];
    }
    /* GCC 12 does not see ldtilecfg read cfg and drops the stores above where this function is
     * not inlined (as in a build without -march=native): the empty asm reads it first. */
    __asm__ volatile("" : : "m"(cfg));
    _tile_loadconfig(&cfg);
}

/* Gives the tiles back at the end of a thread's share, so no thread keeps AMX state between
 * products. */
K_TARGET_AMX_INT8 static void amx_release(void) { _tile_release(); }

/* Eight tiles of 16 rows x 64 bytes: 0-3 the sums, 4-5 activations, 6-7 weights. */
static void amx_load_config(void) {
    static const uint8_t rows[8] = {16, 16, 16, 16, 16, 16, 16, 16};
    static const uint16_t colsb[8] = {64, 64, 64, 64, 64, 64, 64, 64};
    amx_config_load(rows, colsb);
}

/* Weight rows r0 .. r0 + 31 (zero past the last row and past n) as nk steps of two tiles. */
K_TARGET_AMX_BF16 static void amx_pack(const tlm_weight *w, int r0, int nk, uint8_t *pb) {
    int n = (int)w->cols, out = (int)w->rows;
    for (int h = 0; h < 2; h++)
        for (int s = 0; s < nk; s++) {
            int k0 = 32 * s, len = n - k0 < 32 ? n - k0 : 32;
            __mmask32 m = len == 32 ? ~(__mmask32)0 : ((__mmask32)1 << len) - 1;
            __m512i r[16];
            for (int j = 0; j < 16; j++) {
                int row = r0 + 16 * h + j;
                r[j] = row < out ? _mm512_maskz_loadu_epi16(m, (const uint8_t *)w->data +
                                                                   (size_t)row * w->row_bytes +
                                                                   2 * (size_t)k0)
                                 : _mm512_setzero_si512();
            }
            k_transpose16x16(r);
            uint8_t *dst = pb + (size_t)s * AMX_PAIR_BYTES + (size_t)h * 1024;
            for (int j = 0; j < 16; j++) _mm512_storeu_si512(dst + 64 * j, r[j]);
        }
}

/* Activation blocks [m0, m1) of 32 rows (row stride lda bytes) against one packed group: y rows
 * below N, columns r0 .. r0 + R - 1, plus b. */
K_TARGET_AMX_BF16 static void amx_blocks(const uint8_t *xa, size_t lda, int m0, int m1, int N,
                                         int nk, const uint8_t *pb, float *y, int ldy, int r0,
                                         int R, const float *b) {
    _Alignas(64) float ct[AMX_ROWS * AMX_ROWS];
    __mmask16 lo = R >= 16 ? 0xFFFF : (__mmask16)((1u << R) - 1);
    __mmask16 hi = R >= 32 ? 0xFFFF : R <= 16 ? 0 : (__mmask16)((1u << (R - 16)) - 1);
    __m512 b0 = b ? _mm512_maskz_loadu_ps(lo, b + r0) : _mm512_setzero_ps();
    __m512 b1 = b ? _mm512_maskz_loadu_ps(hi, b + r0 + 16) : _mm512_setzero_ps();
    for (int mb = m0; mb < m1; mb++) {
        const uint8_t *a0 = xa + (size_t)mb * AMX_ROWS * lda, *a1 = a0 + 16 * lda;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int s = 0; s < nk; s++) {
            const uint8_t *p = pb + (size_t)s * AMX_PAIR_BYTES;
            _tile_loadd(4, a0 + 64 * (size_t)s, lda);
            _tile_loadd(6, p, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_loadd(7, p + 1024, 64);
            _tile_dpbf16ps(1, 4, 7);
            _tile_loadd(5, a1 + 64 * (size_t)s, lda);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
        _tile_stored(0, ct, 4 * AMX_ROWS);
        _tile_stored(1, ct + 16, 4 * AMX_ROWS);
        _tile_stored(2, ct + 16 * AMX_ROWS, 4 * AMX_ROWS);
        _tile_stored(3, ct + 16 * AMX_ROWS + 16, 4 * AMX_ROWS);
        for (int a = 0; a < AMX_ROWS && mb * AMX_ROWS + a < N; a++) {
            float *yr = y + (size_t)(mb * AMX_ROWS + a) * ldy + r0;
            _mm512_mask_storeu_ps(yr, lo, _mm512_add_ps(_mm512_load_ps(ct + a * AMX_ROWS), b0));
            if (hi)
                _mm512_mask_storeu_ps(yr + 16, hi,
                                      _mm512_add_ps(_mm512_load_ps(ct + a * AMX_ROWS + 16), b1));
        }
    }
}

typedef struct {
    float *y;
    const float *x, *b;
    const tlm_weight *w;
    uint8_t *xa;
    size_t lda;
    int ldy, N, n32, m0, m1;
    _Atomic int failed;
} amx_ctx;

/* Activation rows [a, b) (of the padded count) to BF16 rows of n32 columns. */
static void amx_rows(void *ctx, long a, long b) {
    amx_ctx *c = ctx;
    int n = (int)c->w->cols;
    for (long i = a; i < b; i++) {
        uint16_t *row = (uint16_t *)(void *)(c->xa + (size_t)i * c->lda);
        int done = 0;
        if (i < c->N) {
            bf16_round_row(c->x + (size_t)i * n, n, row);
            done = n;
        }
        memset(row + done, 0, (size_t)(c->n32 - done) * 2);
    }
}

K_TARGET_AMX_BF16 static void amx_groups(void *ctx, long ga, long gb) {
    amx_ctx *c = ctx;
    int nk = c->n32 / 32, out = (int)c->w->rows;
    uint8_t *pb = k_scratch(0, (size_t)nk * AMX_PAIR_BYTES);
    if (!pb) {
        atomic_store(&c->failed, 1);
        return;
    }
    amx_load_config();
    for (long g = ga; g < gb; g++) {
        int r0 = (int)g * AMX_ROWS, R = out - r0 < AMX_ROWS ? out - r0 : AMX_ROWS;
        amx_pack(c->w, r0, nk, pb);
        amx_blocks(c->xa, c->lda, c->m0, c->m1, c->N, nk, pb, c->y, c->ldy, r0, R, c->b);
    }
    amx_release();
}

static int bf16_amx_gemm(float *y, int ldy, const float *x, int N, const tlm_weight *w,
                         const float *b) {
    int n = (int)w->cols, out = (int)w->rows, n32 = (n + 31) & ~31;
    int mblocks = (N + AMX_ROWS - 1) / AMX_ROWS;
    /* a line more than the row, so that a tile's 16 rows do not all fall in one L1 set */
    size_t lda = (size_t)n32 * 2 + 64;
    uint8_t *xa = k_scratch(1, (size_t)mblocks * AMX_ROWS * lda);
    if (!xa) return -1;
    amx_ctx c = {y, x, b, w, xa, lda, ldy, N, n32, 0, 0, 0};
    k_team_units((long)mblocks * AMX_ROWS, (long)N * n >= K_PAR_MIN, 0, amx_rows, &c);
    long groups = (out + AMX_ROWS - 1) / AMX_ROWS;
    for (c.m0 = 0; c.m0 < mblocks; c.m0 += AMX_CHUNK / AMX_ROWS) {
        c.m1 = mblocks - c.m0 < AMX_CHUNK / AMX_ROWS ? mblocks : c.m0 + AMX_CHUNK / AMX_ROWS;
        k_team_units(groups, (long)N * out >= K_PAR_MIN / 16, 1, amx_groups, &c);
    }
    return atomic_load(&c.failed) ? -1 : 0;
}
#endif

static int bf16_gemm(float *y, int ldy, const float *x, int N, const tlm_weight *w, const float *b,
                     int isa) {
    int n = (int)w->cols, out = (int)w->rows;
    if (n % 2 || N <= 0 || (isa != K_ISA_REF && !(isa_ok(isa) && k_qgemm_bf16_ok()))) return -1;
#if HAVE_AVX512
    if (isa == K_ISA_AVX512 && k_qgemm_amx_ok()) return bf16_amx_gemm(y, ldy, x, N, w, b);
#endif
    int tiles = (N + 15) / 16;
    /* slot 1 of the calling thread: the activation rows in BF16, then interleaved by tiles of 16
     * rows, a pair of columns of each row per 32-bit word (rows past N are zero) */
    size_t tile_words = (size_t)n / 2 * 16;
    uint32_t *xt = k_scratch(1, (size_t)tiles * tile_words * 4 + (size_t)n * 2 * 16);
    if (!xt) return -1;
    /* both loops through k_team_units, as quantize_rows */
    bgemm_ctx c = {y, x, b, w, xt, tile_words, ldy, N, isa, 0, 0};
    k_team_units(tiles, (long)N * n >= K_PAR_MIN, 0, bf16_tiles, &c);
    int blocks = (out + 7) / 8, chunk = tiles_per_chunk(tile_words * 4);
    for (c.c0 = 0; c.c0 < tiles; c.c0 += chunk) {
        c.c1 = tiles - c.c0 < chunk ? tiles : c.c0 + chunk;
        k_team_units(blocks, (long)N * out >= K_PAR_MIN / 16, 0, bf16_blocks, &c);
    }
    return 0;
}

#if HAVE_AVX512
/* The calling thread's buffer for 8 widened F16 rows (NULL for F32 weights; on failure sets
 * *failed). */
static float *widen_buf(const tlm_weight *w, int *failed) {
    if (w->dtype != TLM_DTYPE_F16) return NULL;
    float *wf = k_scratch(0, (size_t)8 * w->cols * sizeof(float));
    if (!wf) {
#pragma omp atomic write
        *failed = 1;
    }
    return wf;
}

/* Rows r0 .. r0 + R - 1 of w as floats, row stride *ldw: F32 rows in place, F16 rows widened into
 * wf. */
static const float *block_rows(const tlm_weight *w, int r0, int R, float *wf, size_t *ldw) {
    const char *wb = (const char *)w->data + (size_t)r0 * w->row_bytes;
    if (w->dtype != TLM_DTYPE_F16) {
        *ldw = w->row_bytes / sizeof(float);
        return (const float *)wb;
    }
    for (int r = 0; r < R; r++)
        k_widen_row(w->dtype, wb + (size_t)r * w->row_bytes, wf + (size_t)r * w->cols,
                    (int)w->cols);
    *ldw = (size_t)w->cols;
    return wf;
}

#endif

#if HAVE_AVX512
/* k_fgemm's product, shared by its loops. */
typedef struct {
    float *y, *xt;
    const float *x, *b;
    const tlm_weight *w;
    size_t tile_floats;
    int ldy, N, blocks, pairs, c0, c1; /* c0, c1: the tiles of this pass (fg_blocks) */
    _Atomic int failed;
} fg_ctx;

/* More rows: tiles [a, e) of 16 activation rows interleaved by column into xt. */
static void fg_tiles(void *ctx, long a, long e) {
    fg_ctx *c = ctx;
    int n = (int)c->w->cols;
    for (long t = a; t < e; t++) {
        int rows = c->N - (int)t * 16 < 16 ? c->N - (int)t * 16 : 16;
        xt_tile(c->x + (size_t)t * 16 * n, n, rows, c->xt + (size_t)t * c->tile_floats);
    }
}

/* Weight blocks [a, e) of 8 rows against tiles c0..c1-1, in register tiles of 8 x 3 x 16 (pairs:
 * against the pair-interleaved rows). */
static void fg_blocks(void *ctx, long a, long e) {
    fg_ctx *c = ctx;
    const tlm_weight *w = c->w;
    int n = (int)w->cols, out = (int)w->rows, fail = 0;
    float *wf = widen_buf(w, &fail);
    if (fail) {
        atomic_store(&c->failed, 1);
        return;
    }
    for (long bl = a; bl < e; bl++) {
        int r0 = (int)bl * 8, R = out - r0 < 8 ? out - r0 : 8;
        const char *wb = (const char *)w->data + (size_t)r0 * w->row_bytes;
        size_t ldw;
        const float *wr = block_rows(w, r0, R, wf, &ldw);
        /* the first pass brings the next block's rows in, spread over its columns: eight
         * interleaved streams are followed poorly by the hardware prefetchers here */
        int next = bl + 1 < c->blocks ? (out - r0 - 8 < 8 ? out - r0 - 8 : 8) : 0;
        const char *pf = next ? wb + 8 * w->row_bytes : NULL;
        size_t steps = (size_t)(c->pairs ? n / 2 : n);
        size_t pf_step = ((size_t)next * w->row_bytes + steps - 1) / steps;
        float tile[3 * 8 * 16];
        if (c->pairs) {
            /* up to 8 activation rows (batched decode): pairs of columns of 8 rows, one pass */
            f32p_avx512(R, n, wr, ldw, c->xt, tile, pf, pf_step);
            for (int i = 0; i < c->N; i++) {
                float *yr = c->y + (size_t)i * c->ldy + r0;
                for (int r = 0; r < R; r++) yr[r] = tile[r * 8 + i] + (c->b ? c->b[r0 + r] : 0.0f);
            }
            continue;
        }
        for (int t0 = c->c0; t0 < c->c1; t0 += 3) {
            int T = c->c1 - t0 < 3 ? c->c1 - t0 : 3;
            f32_avx512(R, T, n, wr, ldw, c->xt + (size_t)t0 * c->tile_floats, c->tile_floats, tile,
                       t0 == c->c0 ? pf : NULL, pf_step);
            store_tiles(c->y, c->ldy, tile, t0, T, c->N, r0, R, c->b);
        }
    }
}
#endif

int k_fgemm(float *y, int ldy, const float *x, int N, const tlm_weight *w, const float *b) {
    int n = (int)w->cols, out = (int)w->rows;
    if (N <= 0 || n <= 0 || !k_fgemm_ok() ||
        (w->dtype != TLM_DTYPE_F32 && w->dtype != TLM_DTYPE_F16) ||
        (w->dtype == TLM_DTYPE_F32 && w->row_bytes % sizeof(float)))
        return -1;
#if HAVE_AVX512
    int pairs = N <= 8 && n % 2 == 0, tiles = pairs ? 1 : (N + 15) / 16;
    size_t tile_floats = (size_t)n * 16;
    float *xt = k_scratch(1, (size_t)tiles * tile_floats * sizeof(float));
    if (!xt) return -1;
    int blocks = (out + 7) / 8;
    fg_ctx c = {y, xt, x, b, w, tile_floats, ldy, N, blocks, pairs, 0, tiles, 0};
    if (pairs) {
        for (int p = 0; p < n / 2; p++)
            for (int a = 0; a < 8; a++)
                for (int j = 0; j < 2; j++)
                    xt[(size_t)p * 16 + 2 * a + j] = a < N ? x[(size_t)a * n + 2 * p + j] : 0.0f;
        /* small products stay on this thread, as k_matvec_parts's do */
        k_team_units(blocks, (long)N * n * out >= (1L << 16), 0, fg_blocks, &c);
        return atomic_load(&c.failed) ? -1 : 0;
    }
    /* Both loops through k_team_units (not OpenMP regions), so that a decode step of many
     * sequences on the pool (k_team_pool) opens no OpenMP region. */
    k_team_units(tiles, (long)N * n >= K_PAR_MIN, 0, fg_tiles, &c);
    int chunk = tiles_per_chunk(tile_floats * sizeof(float));
    for (c.c0 = 0; c.c0 < tiles; c.c0 += chunk) {
        c.c1 = tiles - c.c0 < chunk ? tiles : c.c0 + chunk;
        k_team_units(blocks, 1, 0, fg_blocks, &c);
    }
    return atomic_load(&c.failed) ? -1 : 0;
#else
    (void)y, (void)ldy, (void)x, (void)b;
    return -1;
#endif
}

/* ---- block types on AMX int8 tiles -----------------------------------------------------------
 * Where the CPU has AMX (amx-tile, amx-int8), the 16 repacked weight rows of a group are already
 * a tdpbsud B tile (q[k / 4][16][4]: sub / 4 rows of 64 bytes per sub-block), and 16 quantized
 * activation rows at a sub-block's columns are its A tile (16 rows of sub bytes, row stride n).
 * One tdpbsud gives the sub-block's 16 x 16 int32 sums (signed activations by unsigned weight
 * bytes, exact as vpdpbusd's); they are scaled and added in the micro-kernel's operations and
 * order (sums times s, fma with the activation's scale, fma of m with its sum), so the products
 * equal the VNNI kernel's and the reference's bit for bit. Two sub-blocks go through two tiles in
 * turn, so that one's tdpbsud runs while the other's sums are scaled. Activation rows are padded
 * with zero rows to a multiple of 16 (k_qgemm allocates and clears them). 110M pp128 against
 * vpdpbusd, 2-vCPU Xeon, tok/s: Q4_0 1645-1700 -> 2092-2126 at one thread, 3142-3244 -> 3667-3715
 * at two; Q8_0 1523-1589 -> 1942-1944, 2917-2968 -> 3473-3556; Q4_K_M 1634 -> 2051, 3045 ->
 * 3517. The kernel's scaling loop must stay unrolled: with the 16 sums in memory it gained 5-12%.
 */
int k_qgemm_amx_int8_ok(void) {
    return amx_switch() && HAVE_AVX512 && k_cpu()->amx_int8 && k_isa() >= K_ISA_AVX512;
}

#if HAVE_AVX512
/* Tiles 0-1: sums (16 x 16 int32); 2-3: activations (16 x sub bytes); 4-5: weights (sub / 4 rows
 * of 64 bytes). */
static void amx_int8_config(int sub) {
    const uint8_t rows[8] = {16, 16, 16, 16, (uint8_t)(sub / 4), (uint8_t)(sub / 4)};
    const uint16_t colsb[8] = {64, 64, (uint16_t)sub, (uint16_t)sub, 64, 64};
    amx_config_load(rows, colsb);
}

K_TARGET_AMX_INT8 static inline __attribute__((always_inline)) void
amx_int8_scale(const int32_t *ct, const float *s, const float *m, const float *xd, size_t nb32,
               const float *xs, size_t nsb, __m512 acc[16]) {
    __m512 sv = _mm512_loadu_ps(s), mv = _mm512_loadu_ps(m);
#pragma GCC unroll 16
    for (int a = 0; a < 16; a++) {
        __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(ct + 16 * a)), sv);
        acc[a] = _mm512_fmadd_ps(t, _mm512_set1_ps(xd[a * nb32]), acc[a]);
        acc[a] = _mm512_fmadd_ps(mv, _mm512_set1_ps(xs[a * nsb]), acc[a]);
    }
}

/* out[a][16] = the group's 16 rows . activation rows a < 16 (xq, xd, xs at the first of them). */
K_TARGET_AMX_INT8 static void amx_int8_rows(int n, int sub, const uint8_t *q, const float *s,
                                            const float *m, const int8_t *xq, const float *xd,
                                            const float *xs, float *out) {
    size_t nsb = (size_t)n / sub, nb32 = (size_t)n / 32;
    _Alignas(64) int32_t ct[2][256];
    __m512 acc[16];
#pragma GCC unroll 16
    for (int a = 0; a < 16; a++) acc[a] = _mm512_setzero_ps();
        /* Sub-block b goes to tile b % 2; b + 1's tdpbsud is issued before b's sums are stored and
         * scaled, so the two overlap (storing a tile right after its tdpbsud waited for it). */
#define AMX_I8_DP(T, A, B, b)                                                                      \
    do {                                                                                           \
        _tile_zero(T);                                                                             \
        _tile_loadd(A, xq + (b)*sub, n);                                                           \
        _tile_loadd(B, q + (b)*sub * 16, 64);                                                      \
        _tile_dpbsud(T, A, B);                                                                     \
    } while (0)
#define AMX_I8_SCALE(T, b)                                                                         \
    do {                                                                                           \
        _tile_stored(T, ct[T], 64);                                                                \
        amx_int8_scale(ct[T], s + (b)*16, m + (b)*16, xd + (b)*sub / 32, nb32, xs + (b), nsb,      \
                       acc);                                                                       \
    } while (0)
    AMX_I8_DP(0, 2, 4, 0);
    for (size_t b = 0; b < nsb; b += 2) {
        if (b + 1 < nsb) AMX_I8_DP(1, 3, 5, b + 1);
        AMX_I8_SCALE(0, b);
        if (b + 2 < nsb) AMX_I8_DP(0, 2, 4, b + 2);
        if (b + 1 < nsb) AMX_I8_SCALE(1, b + 1);
    }
#undef AMX_I8_DP
#undef AMX_I8_SCALE
#pragma GCC unroll 16
    for (int a = 0; a < 16; a++) _mm512_storeu_ps(out + 16 * a, acc[a]);
}

#endif

typedef struct {
    float *y;
    int ldy, N;
    const tlm_weight *w;
    const float *b;
    int isa, sub, n, out;
    size_t nb32, nsb;
    const int8_t *xq;
    const float *xd, *xs;
    const char *cache;
    size_t pack_bytes;
    _Atomic int failed;
    int amx; /* AMX int8 tiles: activation rows padded to a multiple of 16 */
} qg_ctx;

/* Groups [g0, g1) of K_QG_ROWS weight rows: repacked (or taken from the cache), then their
 * products with every activation row. */
static void qg_groups(void *ctx, long g0, long g1) {
    qg_ctx *c = ctx;
    const tlm_weight *w = c->w;
    int N = c->N, n = c->n, out = c->out, sub = c->sub, isa = c->isa;
    size_t nb32 = c->nb32, nsb = c->nsb;
    /* AMX's kernel takes 16 activation rows (padded by k_qgemm), the VNNI one up to 8 */
    int step = c->amx ? 16 : K_QG_ACTS;
#if HAVE_AVX512
    if (c->amx) amx_int8_config(sub);
#endif
    for (long g = g0; g < g1; g++) {
        float *ps = c->cache ? (float *)(c->cache + (size_t)g * c->pack_bytes)
                             : k_scratch(0, c->pack_bytes);
        if (!ps) {
            atomic_store_explicit(&c->failed, 1, memory_order_relaxed);
            break;
        }
        float *pm = ps + nsb * K_QG_ROWS;
        uint8_t *pq = (uint8_t *)(pm + nsb * K_QG_ROWS);
        int r0 = (int)g * K_QG_ROWS, nr = out - r0 < K_QG_ROWS ? out - r0 : K_QG_ROWS;
        if (!c->cache) {
            k_qgemm_pack_isa(isa, w, r0, nr, pq, ps, pm);
            /* The next group's rows, while this one's products run: a small model's rows are a
             * few cache lines each, too short a stream for the hardware to fetch ahead, and the
             * repacking waited for them (15M Q4_0 pp128, one thread: repacking and this loop
             * 11.7% -> 9.0% of the profile). */
            int next = out - r0 - nr < K_QG_ROWS ? out - r0 - nr : K_QG_ROWS;
            const char *nx = (const char *)w->data + (size_t)(r0 + nr) * w->row_bytes;
            for (size_t at = 0; at < (size_t)next * w->row_bytes; at += 64)
                __builtin_prefetch(nx + at, 0, 2);
        }
        float tile[16 * K_QG_ROWS];
        for (int a0 = 0; a0 < N; a0 += step) {
            int na = N - a0 < step ? N - a0 : step;
            const int8_t *xq = c->xq + (size_t)a0 * n;
            const float *xd = c->xd + (size_t)a0 * nb32, *xs = c->xs + (size_t)a0 * nsb;
#if HAVE_AVX512
            if (c->amx)
                amx_int8_rows(n, sub, pq, ps, pm, xq, xd, xs, tile);
            else
#endif
                k_qgemm_micro(isa, w->dtype, n, sub, pq, ps, pm, xq, xd, xs, na, tile);
            for (int a = 0; a < na; a++) {
                float *yr = c->y + (size_t)(a0 + a) * c->ldy + r0;
                for (int r = 0; r < nr; r++)
                    yr[r] = tile[a * K_QG_ROWS + r] + (c->b ? c->b[r0 + r] : 0.0f);
            }
        }
    }
#if HAVE_AVX512
    if (c->amx) amx_release();
#endif
}

int k_qgemm(float *y, int ldy, const float *x, int N, const tlm_weight *w, const float *b,
            int isa) {
    if (w->dtype == TLM_DTYPE_BF16) return bf16_gemm(y, ldy, x, N, w, b, isa);
    int sub = k_qgemm_sub(w->dtype), n = (int)w->cols, out = (int)w->rows;
    if (!sub || !isa_ok(isa) || N <= 0 || n <= 0 || n % (int)tlm_dtype_get(w->dtype)->block_elems)
        return -1;
    if (isa == K_ISA_AVX2 && !avx2_takes(w->dtype)) return -1;
    size_t nb32 = (size_t)n / 32, nsb = (size_t)n / sub;
    /* Q6_K's sub-blocks of 16 give one tdpbsud half the work for the same scaling: 110M Q6_K
     * pp128 ran at 0.95x vpdpbusd's, so it stays there. */
    int amx = isa == K_ISA_AVX512 && sub == 32 && k_qgemm_amx_int8_ok();
    int Np = amx ? (N + 15) & ~15 : N; /* AMX's tiles take 16 activation rows */
    /* The calling thread's slot 1 holds the quantized activations, which every thread reads; each
     * thread's slot 0 holds the group of weight rows it is working on. */
    float *xd = k_scratch(1, (size_t)Np * ((nb32 + nsb) * sizeof(float) + (size_t)n));
    if (!xd) return -1;
    float *xs = xd + (size_t)Np * nb32;
    int8_t *xq = (int8_t *)(xs + (size_t)Np * nsb);
    quantize_rows(isa, x, N, n, sub, xq, xd, xs);
    if (Np > N) {
        memset(xd + (size_t)N * nb32, 0, (size_t)(Np - N) * nb32 * sizeof(float));
        memset(xs + (size_t)N * nsb, 0, (size_t)(Np - N) * nsb * sizeof(float));
        memset(xq + (size_t)N * n, 0, (size_t)(Np - N) * n);
    }
    size_t pack_bytes = pack_bytes_of(n, sub);
    qg_ctx c = {y, ldy, N, w, b, isa, sub, n, out, nb32, nsb, xq, xd, xs, NULL, pack_bytes, 0, amx};
    c.cache = cached_pack(w, pack_bytes, isa);
    /* a group at a time: a group is 16 rows by every activation row, microseconds of work */
    k_team_units((out + K_QG_ROWS - 1) / K_QG_ROWS, (long)N * out >= K_PAR_MIN / 16, 1, qg_groups,
                 &c);
    return atomic_load_explicit(&c.failed, memory_order_relaxed) ? -1 : 0;
}

const char *tlm_cpu_kernels(void) {
    int isa = k_isa();
    if (isa < K_ISA_AVX2) return "ref";
    if (isa < K_ISA_AVX512) return k_qgemm_avxvnni_ok() ? "avx2 avx-vnni" : "avx2";
    static _Thread_local char name[64];
    snprintf(name, sizeof name, "avx512 vnni%s%s%s", k_qgemm_bf16_ok() ? " bf16" : "",
             k_qgemm_amx_int8_ok() ? " amx-int8" : "", k_qgemm_amx_ok() ? " amx-bf16" : "");
    return name;
}
