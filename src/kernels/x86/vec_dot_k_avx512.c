/* AVX-512 VNNI dot products of the K types (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) and IQ4_XS against
 * Q8_K activation rows: one row, several activation rows, four weight rows. */
#include "kernels/x86/vec_dot_x86.h"

#if defined(__x86_64__) || defined(__i386__)

/* The 12 bytes of 6-bit scales and mins of a Q4_K / Q5_K super-block unpacked in vector
 * registers (bytes 0-7 the 8 scales, 8-15 the 8 mins, as llama.cpp's 32-bit masks give them),
 * from the block's first 16 bytes (d, dmin, the 12 bytes): bytes 0-3 of both halves are the low 6
 * bits of scale bytes 0-3 and 4-7, bytes 4-7 take their low bits from the nibbles of scale bytes
 * 8-11 and their top two from the top bits of scale bytes 0-3 and 4-7. The shuffles' indices,
 * per 128-bit lane, serve k_vec_dot_q4_K_q8_K_x4_avx512's four blocks at once too. It replaced
 * the scalar unpacking, moved into a vector four words at a time, which Q4_K and Q5_K rows felt in
 * cache and from memory (build/bench_matvec). */
K_TARGET_AVX512 static inline __m128i q4k_scales_avx512(const uint8_t *wb) {
    const __m128i v = _mm_loadu_si128((const __m128i *)wb);
    const __m128i lo = _mm_shuffle_epi8(v, _mm_loadu_si128((const __m128i *)q4k_lo_b));
    const __m128i hi = _mm_shuffle_epi8(v, _mm_loadu_si128((const __m128i *)q4k_hi_b));
    __m128i low = _mm_mask_blend_epi8(0xF000, lo, _mm_srli_epi16(lo, 4));
    low = _mm_and_si128(low, _mm_loadu_si128((const __m128i *)q4k_keep_b));
    __m128i top = _mm_srli_epi16(_mm_and_si128(hi, _mm_set1_epi8((char)0xC0)), 2);
    return _mm_or_si128(low, top);
}

/* Per 64 elements one maddubs (q <= 63) and one madd by the four sub-blocks' scales as int16;
 * the offset of 32 through the activation's sums, all in vectors, floats accumulated across
 * super-blocks. */
K_TARGET_AVX512 void k_vec_dot_q6_K_q8_K_avx512(int n, float *s, const void *w, const void *xq) {
    const uint8_t *wb = w;
    const k_block_q8_k *x = xq;
    /* int16 lane i of the r-th 64-element run belongs to sub-block 4r + i / 8 */
    const __m512i idx0 = _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1,
                                          1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    const __m512i four = _mm512_set1_epi16(4);
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < n / CORE_QK_K; b++, wb += sizeof(core_block_q6_k)) {
        __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wb + 192)));
        __m512i sc = _mm512_castsi256_si512(s16);
        __m256i off = _mm256_madd_epi16(s16, _mm256_loadu_si256((const __m256i *)x[b].bsums));
        __m512i isum = _mm512_setzero_si512(), idx = idx0;
        for (int h = 0; h < 2; h++) {
            /* q1 | q2 from the low nibbles of ql's 64 bytes, q3 | q4 from the high ones; their top
             * bits are bits 0-1 | 2-3 and 4-5 | 6-7 of qh */
            __m512i L = _mm512_loadu_si512(wb + 64 * h);
            __m256i hb = _mm256_loadu_si256((const __m256i *)(wb + 128 + 32 * h));
            __m512i H = join256(hb, _mm256_srli_epi16(hb, 2));
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
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_set1_ps(x[b].d * load_f16(wb + 208)),
                              acc);
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

/* Q3_K's sixteen scales less 32, as int16 (core_q3k_scale): the low four bits from bytes 0-7
 * (low nibbles for sub-blocks 0-7, high for 8-15), the top two from byte 8 + j % 4 at bit
 * 2 (j / 4). */
K_TARGET_AVX512 static inline __m256i q3k_scales16_avx512(const uint8_t *p) {
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
} q23k_weights;

K_TARGET_AVX512 static inline K_ALWAYS_INLINE void q23k_unpack(const uint8_t *wb, q23k_weights *o,
                                                               const int three) {
    /* int16 lane l of plane 0: sub-block l / 8 (l < 16), 8 + (l - 16) / 8 (l >= 16) */
    const __m512i idx0 = _mm512_set_epi16(9, 9, 9, 9, 9, 9, 9, 9, 8, 8, 8, 8, 8, 8, 8, 8, 1, 1, 1,
                                          1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i m3 = _mm512_set1_epi8(3), two = _mm512_set1_epi16(2), four = _mm512_set1_epi8(4);
    const size_t bytes = three ? sizeof(core_block_q3_k) : sizeof(core_block_q2_k);
    const uint8_t *qs = wb + (three ? 32 : 16);
    __m512i H = _mm512_setzero_si512(), hb = join256(_mm256_set1_epi8(1), _mm256_set1_epi8(0x10));
    __m256i sc16;
    if (three) {
        sc16 = o->s16 = q3k_scales16_avx512(wb + 96);
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
    o->d = load_f16(d);
    o->dmin = three ? 0.0f : load_f16(d + 2);
}

K_TARGET_AVX512 static inline K_ALWAYS_INLINE void
q23k_step(const q23k_weights *w, const k_block_q8_k *x, __m256 *acc, const int three) {
    __m256i off = _mm256_madd_epi16(w->s16, _mm256_loadu_si256((const __m256i *)x->bsums));
    __m512i isum = _mm512_setzero_si512();
    for (int i = 0; i < 4; i++) {
        __m512i a = join256(_mm256_loadu_si256((const __m256i *)(x->qs + 32 * i)),
                            _mm256_loadu_si256((const __m256i *)(x->qs + 128 + 32 * i)));
        isum = _mm512_dpwssd_epi32(isum, _mm512_maddubs_epi16(w->q[i], a), w->scp[i]);
    }
    __m256i t = _mm256_add_epi32(_mm512_castsi512_si256(isum), _mm512_extracti64x4_epi64(isum, 1));
    if (three) t = _mm256_sub_epi32(t, _mm256_slli_epi32(off, 2));
    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_set1_ps(x->d * w->d), *acc);
    if (!three) /* the mins */
        *acc = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(off), _mm256_set1_ps(x->d * w->dmin), *acc);
}

K_TARGET_AVX512 static inline K_ALWAYS_INLINE void
q23k_block(const uint8_t *wb, const k_block_q8_k *x, __m256 *acc, const int three) {
    q23k_weights w;
    q23k_unpack(wb, &w, three);
    q23k_step(&w, x, acc, three);
}

/* M activation rows (stride xs bytes) against one Q2_K or Q3_K row: each block unpacked once. */
K_TARGET_AVX512 static inline K_ALWAYS_INLINE void q23k_rows_avx512(int n, const int M, float *s,
                                                                    const uint8_t *w,
                                                                    const uint8_t *xq, size_t xs,
                                                                    const int three) {
    const size_t bytes = three ? sizeof(core_block_q3_k) : sizeof(core_block_q2_k);
    __m256 acc[K_VDOT_MAX_ROWS];
    for (int m = 0; m < M; m++) acc[m] = _mm256_setzero_ps();
    for (int b = 0; b < n / CORE_QK_K; b++) {
        q23k_weights wv;
        q23k_unpack(w + b * bytes, &wv, three);
        for (int m = 0; m < M; m++)
            q23k_step(&wv, (const k_block_q8_k *)(const void *)(xq + m * xs) + b, &acc[m], three);
    }
    for (int m = 0; m < M; m++) s[m] = hsum8(acc[m]);
}

K_TARGET_AVX512 static inline K_ALWAYS_INLINE void
dot_q23k_avx512(int n, float *s, const void *w, const void *xq, const int three) {
    const uint8_t *wb = w;
    const size_t bytes = three ? sizeof(core_block_q3_k) : sizeof(core_block_q2_k);
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < n / CORE_QK_K; b++)
        q23k_block(wb + b * bytes, (const k_block_q8_k *)xq + b, &acc, three);
    *s = hsum8(acc);
}
K_TARGET_AVX512 void k_vec_dot_q2_K_q8_K_avx512(int n, float *s, const void *w, const void *xq) {
    dot_q23k_avx512(n, s, w, xq, 0);
}
K_TARGET_AVX512 void k_vec_dot_q3_K_q8_K_avx512(int n, float *s, const void *w, const void *xq) {
    dot_q23k_avx512(n, s, w, xq, 1);
}

/* ---- IQ4_XS -------------------------------------------------------------------------------- */
/* An IQ4_XS block's eight scales less 32 as int16 (core_iq4xs_scale): the low four bits a nibble of
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
} iq4xs_weights;

/* The weight side of one IQ4_XS block, unpacked once for every activation row. */
K_TARGET_AVX512 static inline K_ALWAYS_INLINE void iq4xs_unpack(const uint8_t *wb,
                                                                iq4xs_weights *o) {
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
    o->d = load_f16(wb);
}

/* One activation row's step on an unpacked IQ4_XS block, into acc. */
K_TARGET_AVX512 static inline K_ALWAYS_INLINE void iq4xs_step(const iq4xs_weights *w,
                                                              const k_block_q8_k *x, __m256 *acc) {
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

K_TARGET_AVX512 static inline K_ALWAYS_INLINE void iq4xs_block(const uint8_t *wb,
                                                               const k_block_q8_k *x, __m256 *acc) {
    iq4xs_weights w;
    iq4xs_unpack(wb, &w);
    iq4xs_step(&w, x, acc);
}

/* M activation rows (stride xs bytes) against one IQ4_XS row: each block unpacked once. */
K_TARGET_AVX512 static inline K_ALWAYS_INLINE void
iq4xs_rows_avx512(int n, const int M, float *s, const uint8_t *w, const uint8_t *xq, size_t xs) {
    __m256 acc[K_VDOT_MAX_ROWS];
    for (int m = 0; m < M; m++) acc[m] = _mm256_setzero_ps();
    for (int b = 0; b < n / CORE_QK_K; b++) {
        iq4xs_weights wv;
        iq4xs_unpack(w + b * sizeof(core_block_iq4_xs), &wv);
        for (int m = 0; m < M; m++)
            iq4xs_step(&wv, (const k_block_q8_k *)(const void *)(xq + m * xs) + b, &acc[m]);
    }
    for (int m = 0; m < M; m++) s[m] = hsum8(acc[m]);
}

K_TARGET_AVX512 void k_vec_dot_iq4_xs_q8_K_avx512(int n, float *s, const void *w, const void *xq) {
    const uint8_t *wb = w;
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < n / CORE_QK_K; b++)
        iq4xs_block(wb + b * sizeof(core_block_iq4_xs), (const k_block_q8_k *)xq + b, &acc);
    *s = hsum8(acc);
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
} q45k_weights;

/* d, dmin and the mins (each twice, against the 16 sums of 16); returns the 8 scales as int16. */
K_TARGET_AVX512 static inline K_ALWAYS_INLINE __m512i q45k_head(const uint8_t *wb,
                                                                q45k_weights *o) {
    __m128i sm = q4k_scales_avx512(wb);
    __m128i mn = _mm_unpackhi_epi8(_mm_unpackhi_epi64(sm, sm), _mm_unpackhi_epi64(sm, sm));
    o->mn16 = _mm256_cvtepu8_epi16(mn);
    o->dw = load_f16(wb);
    o->dmin = load_f16(wb + 2);
    return _mm512_castsi256_si512(_mm256_cvtepu8_epi16(sm));
}

/* hsum8 of four vectors at once, into s[0..3]: the same additions in the same order per vector
 * (halves, then elements 0+2 and 1+3, then those two), so bit for bit hsum8's sums, in under
 * half of four hsum8's operations, which one-block rows (15M's 256-column Q6_K classifier) spent
 * a good share of their kernel in. */
K_TARGET_AVX512 static inline K_ALWAYS_INLINE void hsum8x4(const __m256 *a, float *s) {
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
K_TARGET_AVX512 static inline K_ALWAYS_INLINE __m256 q45k_fold(__m512 acc, __m256 accm) {
    __m256 lo = _mm512_castps512_ps256(acc), hi = _mm512_extractf32x8_ps(acc, 1);
    return _mm256_sub_ps(_mm256_add_ps(lo, hi), accm);
}

K_TARGET_AVX512 static inline K_ALWAYS_INLINE float q45k_sum(__m512 acc, __m256 accm) {
    return hsum8(q45k_fold(acc, accm));
}

/* The Q4_K and Q5_K kernels' word indices and shift counts, each word a in the low 256 bits and
 * b in the high ones (WPAIR(a, b)), as tables: built in registers from immediates, the sixteen of
 * q45k_x4_unit_avx512's loop outnumbered the registers left and the compiler rebuilt each in the
 * loop (three instructions) where one load does. Rows 0-3: the scales of sub-blocks a and a + 2 for
 * a = 0, 1, 4, 5 of one row's widened head (q4k_load; q45k_x4_unit_avx512 takes them by byte
 * shuffles, q45k_sc_b); 4-7: Q5_K's fifth-bit shifts (q5k_load), left (4, 2), (3, 1), right (0, 2),
 * (1, 3). */
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
 * 32-byte loads each joined with its own shifted copy: half the operations of unpacking the
 * nibbles, faster for one and for eight activation rows (build/bench_matvec Q4_K from memory). */
K_TARGET_AVX512 static inline K_ALWAYS_INLINE void q4k_load(const uint8_t *wb, q45k_weights *o) {
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
K_TARGET_AVX512 static inline K_ALWAYS_INLINE void q4k_step(const q45k_weights *w,
                                                            const k_block_q8_k *x, const int8_t *xs,
                                                            __m512 *acc, __m256 *accm) {
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
 * at a time, each with its own shifts of qh, and the activation in the file's order, that is half
 * the operations (build/bench_matvec Q5_K in cache). */
K_TARGET_AVX512 static inline K_ALWAYS_INLINE void q5k_fifth(__m512i hb, int h, __m512i *qa,
                                                             __m512i *qb) {
    const __m512i b4 = _mm512_set1_epi8(0x10);
    /* bits 4h | 4h + 2 and 4h + 1 | 4h + 3 to bit 4 */
    __m512i f0 = h ? _mm512_srlv_epi16(hb, _mm512_load_si512(q45k_words[6]))
                   : _mm512_sllv_epi16(hb, _mm512_load_si512(q45k_words[4]));
    __m512i f1 = h ? _mm512_srlv_epi16(hb, _mm512_load_si512(q45k_words[7]))
                   : _mm512_sllv_epi16(hb, _mm512_load_si512(q45k_words[5]));
    *qa = _mm512_or_si512(*qa, _mm512_and_si512(f0, b4));
    *qb = _mm512_or_si512(*qb, _mm512_and_si512(f1, b4));
}

K_TARGET_AVX512 static inline K_ALWAYS_INLINE void q5k_load(const uint8_t *wb, q45k_weights *o) {
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

K_TARGET_AVX512 static inline K_ALWAYS_INLINE void q45k_rows_avx512(int n, const int M, float *s,
                                                                    const uint8_t *w,
                                                                    const uint8_t *xq, size_t xs,
                                                                    const int five) {
    __m512 acc[K_VDOT_MAX_ROWS];
    __m256 accm[K_VDOT_MAX_ROWS];
    size_t nib = k_act_q8_k_nib_at(n);
    for (int m = 0; m < M; m++) acc[m] = _mm512_setzero_ps(), accm[m] = _mm256_setzero_ps();
    for (int b = 0; b < n / CORE_QK_K; b++) {
        q45k_weights wv;
        if (five)
            q5k_load(w + b * sizeof(core_block_q5_k), &wv);
        else
            q4k_load(w + b * sizeof(core_block_q4_k), &wv);
        for (int m = 0; m < M; m++)
            q4k_step(&wv, (const k_block_q8_k *)(const void *)(xq + m * xs) + b,
                     (const int8_t *)(xq + m * xs + nib) + CORE_QK_K * b, &acc[m], &accm[m]);
    }
    for (int m = 0; m < M; m++) s[m] = q45k_sum(acc[m], accm[m]);
}
K_TARGET_AVX512 void k_vec_dot_q4_K_q8_K_avx512(int n, float *s, const void *w, const void *xq) {
    q45k_rows_avx512(n, 1, s, w, xq, 0, 0);
}
K_TARGET_AVX512 void k_vec_dot_q5_K_q8_K_avx512(int n, float *s, const void *w, const void *xq) {
    q45k_rows_avx512(n, 1, s, w, xq, 0, 1);
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

K_TARGET_AVX512 static inline K_ALWAYS_INLINE __m512i q4k_heads(const uint8_t *p, size_t ws) {
    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)p));
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + ws)), 1);
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + 2 * ws)), 2);
    return _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + 3 * ws)), 3);
}

/* Four weight rows against one activation row (k_vdot_w4_fn): q45k_rows_avx512's sums per row, bit
 * for bit, with what the rows share per super-block done once for all four. Their 16-byte heads (d,
 * dmin, 12 bytes of 6-bit scales and mins) sit in one register, one row per 128-bit lane, and are
 * unpacked together (q4k_scales_avx512' shuffles, one block per lane); the mins meet the
 * activation's sums two rows to a register, lanes 0-7 and 8-15 being accm of the even and the
 * odd row; the four rows' d and dmin are widened and scaled in one vector. Every row waits for
 * the four heads, so the next super-block's are loaded one iteration early: without that, four
 * rows from memory ran slower than one row at a time, with it faster (build/bench_matvec Q4_K
 * 2048 x 768). Q5_K's rows take their fifth bits as q5k_load does, one broadcast of qh per row,
 * and gain as much over one row at a time. Q6_K has its own: its unpacking dominates. */
K_TARGET_AVX512 static inline K_ALWAYS_INLINE void
q45k_x4_unit_avx512(int n, float *s, const void *w, size_t ws, const void *xq, const void *pf,
                    const int five) {
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
    const size_t bb = five ? sizeof(core_block_q5_k) : sizeof(core_block_q4_k);
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
    int nb = n / CORE_QK_K;
    __m512i v = q4k_heads(wb, ws);
    size_t pfo = 0, far = prefetch_far(n, ws, !five);
    for (int b = 0; b < nb; b++) {
        prefetch_upto(pf, &pfo, 4 * bb * (size_t)(b + 1), far);
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
        const int8_t *xb = xs + CORE_QK_K * b;
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
    /* q45k_sum's operations per row, the four rows' last sums together (hsum8x4), which one-block
     * rows (256 columns, from L3) gain from and long rows do not notice (build/bench_matvec). */
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
} q6k_weights;

K_TARGET_AVX512 static inline K_ALWAYS_INLINE void q6k_load(const uint8_t *wb, q6k_weights *o) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    const __m512i four = _mm512_set1_epi16(4);
    __m512i idx = _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1,
                                   1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    /* qh's 32 bytes broadcast to both halves and shifted per half by variable word shifts: bits
     * 0-1 (first half) and 2-3 (second) up to bits 4-5, bits 4-5 kept and 6-7 down. One shift
     * each in place of a 256-bit shift and a lane insert (build/bench_matvec Q6_K in L2). */
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
    o->dw = load_f16(wb + 208);
}

K_TARGET_AVX512 static inline K_ALWAYS_INLINE void q6k_step(const q6k_weights *w,
                                                            const k_block_q8_k *x, __m256 *acc) {
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

K_TARGET_AVX512 static inline K_ALWAYS_INLINE void
q6k_rows_avx512(int n, const int M, float *s, const uint8_t *w, const uint8_t *xq, size_t xs) {
    __m256 acc[K_VDOT_MAX_ROWS];
    for (int m = 0; m < M; m++) acc[m] = _mm256_setzero_ps();
    for (int b = 0; b < n / CORE_QK_K; b++) {
        q6k_weights wv;
        q6k_load(w + b * sizeof(core_block_q6_k), &wv);
        for (int m = 0; m < M; m++)
            q6k_step(&wv, (const k_block_q8_k *)(const void *)(xq + m * xs) + b, &acc[m]);
    }
    for (int m = 0; m < M; m++) s[m] = hsum8(acc[m]);
}

/* Four Q6_K rows against one activation row, q6k_rows_avx512's operations per row with M = 1, the
 * rows' chains interleaved: faster in cache, about equal from memory, where as a unit of four they
 * also take k_matvec_parts's prefetch of the rows ahead, which pays there (build/bench_matvec). */
K_TARGET_AVX512 static inline K_ALWAYS_INLINE void
q6k_x4_unit_avx512(int n, float *s, const void *w, size_t ws, const void *xq, const void *pf) {
    const uint8_t *wb = w;
    __m256 acc[4];
    for (int r = 0; r < 4; r++) acc[r] = _mm256_setzero_ps();
    size_t pfo = 0, far = prefetch_far(n, ws, 1);
    for (int b = 0; b < n / CORE_QK_K; b++) {
        prefetch_upto(pf, &pfo, 4 * sizeof(core_block_q6_k) * (size_t)(b + 1), far);
        const k_block_q8_k *x = (const k_block_q8_k *)xq + b;
        for (int r = 0; r < 4; r++) {
            q6k_weights o;
            q6k_load(wb + r * ws + b * sizeof(core_block_q6_k), &o);
            q6k_step(&o, x, &acc[r]);
        }
    }
    hsum8x4(acc, s);
}

/* Four Q2_K, Q3_K or IQ4_XS rows (kind: KBLOCK_*) against one activation row, the one-row
 * kernel's block steps per row, the rows' chains interleaved and the unit ahead prefetched as
 * Q6_K's are. */
K_TARGET_AVX512 static inline K_ALWAYS_INLINE void
kblock_x4_unit_avx512(int n, float *s, const void *w, size_t ws, const void *xq, const void *pf,
                      const int kind) {
    const uint8_t *wb = w;
    const size_t bytes = kind == KBLOCK_IQ4_XS ? sizeof(core_block_iq4_xs)
                         : kind == KBLOCK_Q3_K ? sizeof(core_block_q3_k)
                                               : sizeof(core_block_q2_k);
    __m256 acc[4];
    for (int r = 0; r < 4; r++) acc[r] = _mm256_setzero_ps();
    size_t pfo = 0, far = prefetch_far(n, ws, 0);
    for (int b = 0; b < n / CORE_QK_K; b++) {
        prefetch_upto(pf, &pfo, 4 * bytes * (size_t)(b + 1), far);
        const k_block_q8_k *x = (const k_block_q8_k *)xq + b;
        for (int r = 0; r < 4; r++) {
            if (kind == KBLOCK_IQ4_XS)
                iq4xs_block(wb + r * ws + b * bytes, x, &acc[r]);
            else
                q23k_block(wb + r * ws + b * bytes, x, &acc[r], kind == KBLOCK_Q3_K);
        }
    }
    hsum8x4(acc, s);
}

#define Q4_K_ROWS(n, M, s, w, xq, xs) q45k_rows_avx512(n, M, s, w, xq, xs, 0)
#define Q5_K_ROWS(n, M, s, w, xq, xs) q45k_rows_avx512(n, M, s, w, xq, xs, 1)
K_TARGET_AVX512 void k_vec_dot_q4_K_q8_K_m8_avx512(int n, int M, float *s, const void *w,
                                                   const void *xq, size_t xstride) {
    ROWS_SWITCH(Q4_K_ROWS, n, M, s, (const uint8_t *)w, (const uint8_t *)xq, xstride);
}
K_TARGET_AVX512 void k_vec_dot_q5_K_q8_K_m8_avx512(int n, int M, float *s, const void *w,
                                                   const void *xq, size_t xstride) {
    ROWS_SWITCH(Q5_K_ROWS, n, M, s, (const uint8_t *)w, (const uint8_t *)xq, xstride);
}
#define Q2_K_ROWS(n, M, s, w, xq, xs) q23k_rows_avx512(n, M, s, w, xq, xs, 0)
#define Q3_K_ROWS(n, M, s, w, xq, xs) q23k_rows_avx512(n, M, s, w, xq, xs, 1)
K_TARGET_AVX512 void k_vec_dot_q2_K_q8_K_m8_avx512(int n, int M, float *s, const void *w,
                                                   const void *xq, size_t xstride) {
    ROWS_SWITCH(Q2_K_ROWS, n, M, s, (const uint8_t *)w, (const uint8_t *)xq, xstride);
}
K_TARGET_AVX512 void k_vec_dot_q3_K_q8_K_m8_avx512(int n, int M, float *s, const void *w,
                                                   const void *xq, size_t xstride) {
    ROWS_SWITCH(Q3_K_ROWS, n, M, s, (const uint8_t *)w, (const uint8_t *)xq, xstride);
}
K_TARGET_AVX512 void k_vec_dot_iq4_xs_q8_K_m8_avx512(int n, int M, float *s, const void *w,
                                                     const void *xq, size_t xstride) {
    ROWS_SWITCH(iq4xs_rows_avx512, n, M, s, (const uint8_t *)w, (const uint8_t *)xq, xstride);
}
K_TARGET_AVX512 void k_vec_dot_q6_K_q8_K_m8_avx512(int n, int M, float *s, const void *w,
                                                   const void *xq, size_t xstride) {
    ROWS_SWITCH(q6k_rows_avx512, n, M, s, (const uint8_t *)w, (const uint8_t *)xq, xstride);
}

X4_RUN_OF(K_TARGET_AVX512, k_vec_dot_q4_K_q8_K_x4_avx512, q45k_x4_unit_avx512, 0)
X4_RUN_OF(K_TARGET_AVX512, k_vec_dot_q5_K_q8_K_x4_avx512, q45k_x4_unit_avx512, 1)
X4_RUN(K_TARGET_AVX512, k_vec_dot_q6_K_q8_K_x4_avx512, q6k_x4_unit_avx512)
X4_RUN_OF(K_TARGET_AVX512, k_vec_dot_q2_K_q8_K_x4_avx512, kblock_x4_unit_avx512, KBLOCK_Q2_K)
X4_RUN_OF(K_TARGET_AVX512, k_vec_dot_q3_K_q8_K_x4_avx512, kblock_x4_unit_avx512, KBLOCK_Q3_K)
X4_RUN_OF(K_TARGET_AVX512, k_vec_dot_iq4_xs_q8_K_x4_avx512, kblock_x4_unit_avx512, KBLOCK_IQ4_XS)

#endif
