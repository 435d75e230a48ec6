/* The integer form's pack of whole groups of 16 rows in AVX-512, one function per block type
 * family (k_qgemm_pack16_fn in gemm_traits.h): the same bytes and floats as the plain C pack
 * (ref/gemm_ref.c), which test_qgemm compares group by group. 16 rows' blocks go through 4 x 4
 * word transposes instead of one 32-bit word at a time; repacking per call this way costs about
 * what keeping a repacked copy saves (bench/quant/prefill_paths.sh). */
#include "core/dtype.h"
#include "core/quant.h"
#include "kernels/gemm_traits.h"

#if K_GEMM_X86
#include "kernels/x86/simd.h"

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
 * its first word only. A gather does this in one instruction, but costs as much as the rest of the
 * repacking (a profile of bench/quant/prefill_paths.sh shows it). */
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

/* The group's first row, and the row's count of blocks. */
static inline const uint8_t *group_rows(const tlm_weight *w, int r0, int *nb) {
    *nb = (int)(w->cols / core_dtype_get(w->dtype)->block_elems);
    return (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;
}

K_TARGET_AVX512 void k_qgemm_pack16_q8_0_q4_0_avx512(const tlm_weight *w, int r0, uint8_t *q,
                                                     float *s, float *m) {
    size_t rb = w->row_bytes;
    int nb;
    const uint8_t *base = group_rows(w, r0, &nb);
    const __m512i lo4 = _mm512_set1_epi32(0x0F0F0F0F);
    __m512i v[8];
    /* both: an f16 scale, then the quants; offsets -128 d (Q8_0's bytes made unsigned by a
     * xor) and -8 d */
    int q8 = w->dtype == TLM_DTYPE_Q8_0;
    size_t bytes = q8 ? sizeof(core_block_q8_0) : sizeof(core_block_q4_0);
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
                put16(q, b * 8 + j, _mm512_xor_si512(v[j], _mm512_set1_epi32((int)0x80808080u)));
            continue;
        }
        for (int j = 0; j < 4; j++) {
            put16(q, b * 8 + j, _mm512_and_si512(v[j], lo4));
            put16(q, b * 8 + 4 + j, _mm512_and_si512(_mm512_srli_epi32(v[j], 4), lo4));
        }
    }
}

K_TARGET_AVX512 void k_qgemm_pack16_q2_K_q3_K_avx512(const tlm_weight *w, int r0, uint8_t *q,
                                                     float *s, float *m) {
    size_t rb = w->row_bytes;
    int nb;
    const uint8_t *base = group_rows(w, r0, &nb);
    /* 16 sub-blocks of 16: s and m from each row's scale bytes and d (and dmin); the quants
     * are the qs words' 2-bit planes (and Q3_K's third bits from hmask, as bit 2) */
    int three = w->dtype == TLM_DTYPE_Q3_K;
    size_t bytes = three ? sizeof(core_block_q3_k) : sizeof(core_block_q2_k);
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
                __m512i hi = _mm512_srli_epi32(sc[(2 + k) >> 2], 8 * ((2 + k) & 3) + 2 * (j / 4));
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
                _mm512_storeu_ps(m + (b * 16 + j) * K_QG_ROWS,
                                 _mm512_mul_ps(nmin, _mm512_cvtepi32_ps(_mm512_srli_epi32(by, 4))));
            }
        }
        for (int h = 0; h < 2; h++)
            for (int i = 0; i < 4; i++)
                for (int wd = 0; wd < 8; wd++) {
                    __m512i pl = _mm512_and_si512(_mm512_srli_epi32(qw[8 * h + wd], 2 * i), m2);
                    if (three)
                        pl = _mm512_or_si512(
                            pl, _mm512_slli_epi32(
                                    _mm512_and_si512(_mm512_srli_epi32(hm[wd], 4 * h + i), m1), 2));
                    put16(q, b * 64 + h * 32 + i * 8 + wd, pl);
                }
    }
}

K_TARGET_AVX512 void k_qgemm_pack16_iq4_nl_avx512(const tlm_weight *w, int r0, uint8_t *q, float *s,
                                                  float *m) {
    size_t rb = w->row_bytes;
    int nb;
    const uint8_t *base = group_rows(w, r0, &nb);
    const __m512i lo4 = _mm512_set1_epi32(0x0F0F0F0F);
    __m512i v[8];
    /* Q4_0's layout, the nibbles looked up as level + 128, the offset -128 d */
    const __m512i T = _mm512_broadcast_i32x4(_mm_xor_si128(
        _mm_loadu_si128((const __m128i *)core_iq4nl_values), _mm_set1_epi8((char)0x80)));
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = base + (size_t)b * sizeof(core_block_iq4_nl);
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
}

K_TARGET_AVX512 void k_qgemm_pack16_iq4_xs_avx512(const tlm_weight *w, int r0, uint8_t *q, float *s,
                                                  float *m) {
    size_t rb = w->row_bytes;
    int nb;
    const uint8_t *base = group_rows(w, r0, &nb);
    const __m512i lo4 = _mm512_set1_epi32(0x0F0F0F0F);
    __m512i v[8];
    /* eight IQ4_NL-like sub-blocks per block, their scales d * (ls - 32) from each row's
     * words of d | scales_h and scales_l */
    const __m512i T = _mm512_broadcast_i32x4(_mm_xor_si128(
        _mm_loadu_si128((const __m128i *)core_iq4nl_values), _mm_set1_epi8((char)0x80)));
    const __m512i f = _mm512_set1_epi32(15), three = _mm512_set1_epi32(3);
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = base + (size_t)b * sizeof(core_block_iq4_xs);
        __m512i hd[4];
        tr16x4(blk, rb, hd);
        __m512 d = halves(hd[0], 0);
        for (int j = 0; j < 8; j++) {
            __m512i ls = _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi32(hd[1], 4 * j), f),
                _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(hd[0], 16 + 2 * j), three),
                                  4));
            __m512 sj =
                _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(ls, _mm512_set1_epi32(32))));
            _mm512_storeu_ps(s + (b * 8 + j) * K_QG_ROWS, sj);
            _mm512_storeu_ps(m + (b * 8 + j) * K_QG_ROWS,
                             _mm512_mul_ps(_mm512_set1_ps(-128.0f), sj));
            tr16x4(blk + 8 + 16 * j, rb, v);
            for (int k = 0; k < 4; k++) {
                put16(q, (b * 8 + j) * 8 + k, _mm512_shuffle_epi8(T, _mm512_and_si512(v[k], lo4)));
                put16(q, (b * 8 + j) * 8 + 4 + k,
                      _mm512_shuffle_epi8(T, _mm512_and_si512(_mm512_srli_epi32(v[k], 4), lo4)));
            }
        }
    }
}

K_TARGET_AVX512 void k_qgemm_pack16_q4_K_q5_K_avx512(const tlm_weight *w, int r0, uint8_t *q,
                                                     float *s, float *m) {
    size_t rb = w->row_bytes;
    int nb;
    const uint8_t *base = group_rows(w, r0, &nb);
    const __m512i lo4 = _mm512_set1_epi32(0x0F0F0F0F);
    __m512i v[8];
    int q5 = w->dtype == TLM_DTYPE_Q5_K;
    size_t bytes = q5 ? sizeof(core_block_q5_k) : sizeof(core_block_q4_k);
    const __m512i m6 = _mm512_set1_epi32(0x3F3F3F3F), h2 = _mm512_set1_epi32(0x30303030);
    const __m512i ff = _mm512_set1_epi32(0xFF);
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = base + (size_t)b * bytes;
        __m512i hd[4]; /* d and dmin, then the 12 bytes of scales and mins */
        tr16x4(blk, rb, hd);
        __m512 d = halves(hd[0], 0), nmin = _mm512_sub_ps(_mm512_setzero_ps(), halves(hd[0], 1));
        /* core_q4k_scale_min on four sub-blocks at a time, a byte per sub-block */
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
}

K_TARGET_AVX512 void k_qgemm_pack16_q6_K_avx512(const tlm_weight *w, int r0, uint8_t *q, float *s,
                                                float *m) {
    size_t rb = w->row_bytes;
    int nb;
    const uint8_t *base = group_rows(w, r0, &nb);
    const __m512i lo4 = _mm512_set1_epi32(0x0F0F0F0F);
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = base + (size_t)b * sizeof(core_block_q6_k);
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
}

#endif
