/* One query against its sequence's cached keys and values: the attention of a decode step, per
 * (row, head). The plain loops (session.c) compute one score at a time with one accumulator and
 * a horizontal sum per key, and update the output through memory at every key, a noticeable share
 * of a batched step (several sequences of 110M). Here sixteen keys share a pass over the query and
 * their sums are reduced together (then four at a time, then one, at the end), and the output
 * stays in registers, two keys' worth of chains at a time. Sixteen keys did better than four up
 * to a few hundred positions, where reading the cache does not yet bound both (build/bench_attend,
 * 110M F16 cache, one thread). An F16
 * cache is widened as it is loaded (vcvtph2ps), so it costs half the traffic and no pass of its
 * own; so are BF16 and llama.cpp's block types (their scales applied once per block in decode),
 * the keys' and the values' each by its own kind. Prefill's causal attention (k_attend_causal)
 * takes a block of consecutive queries of one head: the keys transposed once into dimension-major
 * rows, so that a query's scores come 16 keys per vector without horizontal sums, then one pass
 * over the values for the whole block. */
#include <math.h>
#include <string.h>

#include "core/quant.h"
#include "fastmath.h"
#include "kernels.h"
#include "qdot.h"

#if defined(__x86_64__) || defined(__i386__)
#include "kernels/x86/simd.h"

/* Helpers inlined wherever they are used. */
#define K_ALWAYS_INLINE __attribute__((always_inline))

/* How many keys ahead row_scores and row_values ask for the lines they read next: a long
 * context's cache streams from memory (or a far L3, as on the virtual machines it was measured on)
 * as two streams per head, which the hardware prefetchers alone kept well below what one thread
 * reads. F16 and Q8_0 caches gained at 1024 and 2048 positions, F32's was level (already at the
 * read rate); 16 and 64 keys ahead did about as well as 32 (build/bench_attend, 110M, one thread;
 * tlm bench tg at long contexts). */
#define PF_KEYS 32

/* Bytes of one cached row of hd elements of kind KV (the block kinds: hd / 32 whole blocks). */
static inline size_t kv_row_bytes(const int KV, size_t hd) {
    switch (KV) {
    case K_KV_F32: return hd * 4;
    case K_KV_F16:
    case K_KV_BF16: return hd * 2;
    case K_KV_Q8_0: return hd / 32 * sizeof(core_block_q8_0);
    case K_KV_Q4_0: return hd / 32 * sizeof(core_block_q4_0);
    case K_KV_Q4_1: return hd / 32 * sizeof(core_block_q4_1);
    case K_KV_Q5_0: return hd / 32 * sizeof(core_block_q5_0);
    case K_KV_Q5_1: return hd / 32 * sizeof(core_block_q5_1);
    default: return hd / 32 * sizeof(core_block_iq4_nl);
    }
}

K_TARGET_AVX512 static inline float h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return _cvtsh_ss(h);
}

/* The 16 nibbles of a 4-bit block's elements e .. e + 15 (e = 0: the low nibbles of its 16 bytes
 * qs, e = 16: the high ones) as 32-bit integers. */
K_TARGET_AVX512 static inline __attribute__((always_inline)) __m512i nib16(const uint8_t *qs,
                                                                           size_t e) {
    __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)qs));
    return e ? _mm512_srli_epi32(b, 4) : _mm512_and_si512(b, _mm512_set1_epi32(15));
}

/* Q5_0 and Q5_1's fifth bits (qh, bit j for element j) added to nib16's elements e .. e + 15. */
K_TARGET_AVX512 static inline __attribute__((always_inline)) __m512i
fifth16(__m512i q, const uint8_t *qh, size_t e) {
    uint32_t h;
    memcpy(&h, qh, sizeof h);
    return _mm512_mask_add_epi32(q, (__mmask16)(h >> e), q, _mm512_set1_epi32(16));
}

/* The block kinds: GGUF blocks of 32 elements, each starting with its half scale d (then, for
 * Q4_1 and Q5_1, its half minimum m): element = d * code (+ m). */
static inline int kv_blocks(const int KV) { return KV == K_KV_Q8_0 || KV >= K_KV_Q4_0; }
static inline int kv_has_min(const int KV) { return KV == K_KV_Q4_1 || KV == K_KV_Q5_1; }
static inline size_t kv_block_bytes(const int KV) { return kv_row_bytes(KV, 32); }

/* Elements e .. e + 15 (e = 0 or 16) of the block at b as its codes, widened to floats. */
K_TARGET_AVX512 static inline __attribute__((always_inline)) __m512
codes16(const int KV, const uint8_t *b, size_t e) {
    switch (KV) {
    case K_KV_Q8_0:
        return _mm512_cvtepi32_ps(
            _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 2 + e))));
    case K_KV_Q4_0:
        return _mm512_cvtepi32_ps(_mm512_sub_epi32(nib16(b + 2, e), _mm512_set1_epi32(8)));
    case K_KV_Q4_1: return _mm512_cvtepi32_ps(nib16(b + 4, e));
    case K_KV_Q5_0:
        return _mm512_cvtepi32_ps(
            _mm512_sub_epi32(fifth16(nib16(b + 6, e), b + 2, e), _mm512_set1_epi32(16)));
    case K_KV_Q5_1: return _mm512_cvtepi32_ps(fifth16(nib16(b + 8, e), b + 4, e));
    default: { /* IQ4_NL: a non-linear table of 16 values, by a permute */
        __m512 table = _mm512_cvtepi32_ps(
            _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)core_iq4nl_values)));
        return _mm512_permutexvar_ps(nib16(b + 2, e), table);
    }
    }
}

/* 16 elements from element i (a multiple of 16) of a cached row, widened to floats: floats,
 * halves, bfloat16s, or the 32-element blocks of llama.cpp's quantized cache types, whose rows are
 * whole blocks, so that element i lies in block i / 32 at element i % 32 (0 or 16), each widened
 * as core_dtype_to_f32 widens it. */
K_TARGET_AVX512 static inline __attribute__((always_inline)) __m512
ld16(const int KV, const void *row, size_t i) {
    const uint8_t *r = row;
    if (kv_blocks(KV)) {
        const uint8_t *b = r + (i >> 5) * kv_block_bytes(KV);
        __m512 c = codes16(KV, b, i & 31), d = _mm512_set1_ps(h2f(b));
        return kv_has_min(KV) ? _mm512_fmadd_ps(c, d, _mm512_set1_ps(h2f(b + 2)))
                              : _mm512_mul_ps(c, d);
    }
    if (KV == K_KV_F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(r + 2 * i)));
    if (KV == K_KV_BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(r + 2 * i))), 16));
    return _mm512_loadu_ps((const float *)row + i);
}

/* One key's products with the query q (qv: its NB vectors), summed over the key's blocks but not
 * across lanes. A block type's scale multiplies each block's sum of code products once (and its
 * minimum the query's sum over the block, qp[c]: qv[2c] + qv[2c + 1]) rather than each element. */
K_TARGET_AVX512 static inline __attribute__((always_inline)) __m512
kvec(const int NB, const int KV, const __m512 *qv, const __m512 *qp, const uint8_t *key) {
    __m512 a;
    if (!kv_blocks(KV)) {
        a = _mm512_mul_ps(qv[0], ld16(KV, key, 0));
        for (int b = 1; b < NB; b++) a = _mm512_fmadd_ps(qv[b], ld16(KV, key, 16 * (size_t)b), a);
        return a;
    }
    for (int c = 0; c < NB / 2; c++) {
        const uint8_t *blk = key + c * kv_block_bytes(KV);
        __m512 t = _mm512_mul_ps(qv[2 * c], codes16(KV, blk, 0));
        t = _mm512_fmadd_ps(qv[2 * c + 1], codes16(KV, blk, 16), t);
        __m512 d = _mm512_set1_ps(h2f(blk));
        a = c ? _mm512_fmadd_ps(t, d, a) : _mm512_mul_ps(t, d);
        if (kv_has_min(KV)) a = _mm512_fmadd_ps(_mm512_set1_ps(h2f(blk + 2)), qp[c], a);
    }
    return a;
}

/* e[0 .. NB) += w times one cached value row. A block type's scale goes into w once a block, and
 * its minimum times w into ms[c] (added to the block's two vectors at the end). */
K_TARGET_AVX512 static inline __attribute__((always_inline)) void
vacc(const int NB, const int KV, float w, const uint8_t *row, __m512 *e, float *ms) {
    if (!kv_blocks(KV)) {
        __m512 wv = _mm512_set1_ps(w);
        for (int b = 0; b < NB; b++)
            e[b] = _mm512_fmadd_ps(wv, ld16(KV, row, 16 * (size_t)b), e[b]);
        return;
    }
    for (int c = 0; c < NB / 2; c++) {
        const uint8_t *blk = row + c * kv_block_bytes(KV);
        __m512 wd = _mm512_set1_ps(w * h2f(blk));
        e[2 * c] = _mm512_fmadd_ps(wd, codes16(KV, blk, 0), e[2 * c]);
        e[2 * c + 1] = _mm512_fmadd_ps(wd, codes16(KV, blk, 16), e[2 * c + 1]);
        if (kv_has_min(KV)) ms[c] += w * h2f(blk + 2);
    }
}

/* The scores p[0..S) = scale q.K of one query (hd = 16 * NB) against S cached keys of kind KK;
 * NB and KK are constants at each call site, so the arrays below live in registers and the loads
 * are of one kind. */
K_TARGET_AVX512 static inline __attribute__((always_inline)) void
row_scores(const int NB, const int KK, const float *q, const void *K, int S, float scale,
           float *p) {
    const size_t hd = 16 * (size_t)NB, rb = kv_row_bytes(KK, hd);
    const uint8_t *Kb = K;
    __m512 qv[8], qp[4];
    for (int b = 0; b < NB; b++) qv[b] = _mm512_loadu_ps(q + 16 * b);
    for (int c = 0; c < NB / 2; c++) qp[c] = _mm512_add_ps(qv[2 * c], qv[2 * c + 1]);
    int j = 0;
    /* Sixteen keys' products, then their sixteen horizontal sums at once: pairs of vectors
     * interleaved and added, then pairs of pairs, then 128-bit lanes twice, which leaves key i's
     * sum in lane i (45 operations where sixteen separate sums take about 140). */
    for (; j + 16 <= S; j += 16) {
        const uint8_t *k0 = Kb + (size_t)j * rb;
        __m512 a[16];
        for (size_t f = 0; f < 16 * rb; f += 64) /* prefetches past the end never fault */
            _mm_prefetch((const char *)k0 + PF_KEYS * rb + f, _MM_HINT_T0);
        for (int i = 0; i < 16; i++) a[i] = kvec(NB, KK, qv, qp, k0 + i * rb);
        __m512 v[4];
        for (int g = 0; g < 4; g++) {
            __m512 s2[2];
            for (int h = 0; h < 2; h++) {
                __m512 x = a[4 * g + 2 * h], y = a[4 * g + 2 * h + 1];
                s2[h] = _mm512_add_ps(_mm512_unpacklo_ps(x, y), _mm512_unpackhi_ps(x, y));
            }
            __m512d lo = _mm512_castps_pd(s2[0]), hi = _mm512_castps_pd(s2[1]);
            v[g] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(lo, hi)),
                                 _mm512_castpd_ps(_mm512_unpackhi_pd(lo, hi)));
        }
        /* v[g]'s 128-bit lane L: keys 4g .. 4g + 3 summed over their elements in lane L */
        __m512 s01 = _mm512_add_ps(_mm512_shuffle_f32x4(v[0], v[1], 0x88),
                                   _mm512_shuffle_f32x4(v[0], v[1], 0xDD));
        __m512 s23 = _mm512_add_ps(_mm512_shuffle_f32x4(v[2], v[3], 0x88),
                                   _mm512_shuffle_f32x4(v[2], v[3], 0xDD));
        __m512 t = _mm512_add_ps(_mm512_shuffle_f32x4(s01, s23, 0x88),
                                 _mm512_shuffle_f32x4(s01, s23, 0xDD));
        _mm512_storeu_ps(p + j, _mm512_mul_ps(t, _mm512_set1_ps(scale)));
    }
    for (; j + 4 <= S; j += 4) {
        const uint8_t *k0 = Kb + (size_t)j * rb;
        __m512 a[4];
        for (int i = 0; i < 4; i++) a[i] = kvec(NB, KK, qv, qp, k0 + i * rb);
        for (int i = 0; i < 4; i++) p[j + i] = scale * _mm512_reduce_add_ps(a[i]);
    }
    for (; j < S; j++) p[j] = scale * _mm512_reduce_add_ps(kvec(NB, KK, qv, qp, Kb + j * rb));
}

/* o[hd] = sum over j of p[j] times cached value row j (of kind KV), two rows per step into separate
 * sums: 2 x NB independent chains. */
K_TARGET_AVX512 static inline __attribute__((always_inline)) void
row_values(const int NB, const int KV, const float *p, const void *V, int S, float *o) {
    const size_t hd = 16 * (size_t)NB, rb = kv_row_bytes(KV, hd);
    const uint8_t *Vb = V;
    int j;
    __m512 e0[8], e1[8];
    float ms[4] = {0, 0, 0, 0};
    for (int b = 0; b < NB; b++) e0[b] = e1[b] = _mm512_setzero_ps();
    for (j = 0; j + 2 <= S; j += 2) {
        const uint8_t *v0 = Vb + (size_t)j * rb;
        for (size_t f = 0; f < 2 * rb; f += 64)
            _mm_prefetch((const char *)v0 + PF_KEYS * rb + f, _MM_HINT_T0);
        vacc(NB, KV, p[j], v0, e0, ms);
        vacc(NB, KV, p[j + 1], v0 + rb, e1, ms);
    }
    if (j < S) vacc(NB, KV, p[j], Vb + (size_t)j * rb, e0, ms);
    for (int b = 0; b < NB; b++) {
        __m512 r = _mm512_add_ps(e0[b], e1[b]);
        if (kv_has_min(KV)) r = _mm512_add_ps(r, _mm512_set1_ps(ms[b / 2]));
        _mm512_storeu_ps(o + 16 * b, r);
    }
}

/* Whether the kernels take rows of kind k and head size hd: the block kinds' rows are whole blocks
 * only where hd is a multiple of 32 (of the sizes here, 48 is not). */
static int kind_takes(int k, int hd) {
    if (hd != 32 && hd != 48 && hd != 64 && hd != 96 && hd != 128) return 0;
    if (k < K_KV_F32 || k > K_KV_IQ4_NL) return 0;
    return !kv_blocks(k) || hd % 32 == 0;
}

/* CALL(NB, KIND) for hd = 16 NB, then `return 0`. */
#define HD_CASES(CALL, KIND)                                                                       \
    switch (hd) {                                                                                  \
    case 32: CALL(2, KIND); return 0;                                                              \
    case 48: CALL(3, KIND); return 0;                                                              \
    case 64: CALL(4, KIND); return 0;                                                              \
    case 96: CALL(6, KIND); return 0;                                                              \
    case 128: CALL(8, KIND); return 0;                                                             \
    default: return -1;                                                                            \
    }
/* CASES(KIND) for the kind k, a constant there. */
#define KIND_CASES(k, CASES)                                                                       \
    switch (k) {                                                                                   \
    case K_KV_F32: CASES(K_KV_F32)                                                                 \
    case K_KV_F16: CASES(K_KV_F16)                                                                 \
    case K_KV_BF16: CASES(K_KV_BF16)                                                               \
    case K_KV_Q8_0: CASES(K_KV_Q8_0)                                                               \
    case K_KV_Q4_0: CASES(K_KV_Q4_0)                                                               \
    case K_KV_Q4_1: CASES(K_KV_Q4_1)                                                               \
    case K_KV_Q5_0: CASES(K_KV_Q5_0)                                                               \
    case K_KV_Q5_1: CASES(K_KV_Q5_1)                                                               \
    case K_KV_IQ4_NL: CASES(K_KV_IQ4_NL)                                                           \
    default: return -1;                                                                            \
    }

#define SCORES(NB, KIND) row_scores(NB, KIND, q, K, S, scale, p)
#define SCORES_HD(KIND) HD_CASES(SCORES, KIND)
K_TARGET_AVX512 static int scores_dispatch(const float *q, const void *K, int kk, int S, int hd,
                                           float scale, float *p){KIND_CASES(kk, SCORES_HD)}

#define VALUES(NB, KIND) row_values(NB, KIND, p, V, S, o)
#define VALUES_HD(KIND) HD_CASES(VALUES, KIND)
K_TARGET_AVX512 static int values_dispatch(const float *p, const void *V, int kv, int S, int hd,
                                           float *o){KIND_CASES(kv, VALUES_HD)}

K_TARGET_AVX512
    static int attend_row_avx512(const float *q, const void *K, const void *V, int kk, int kv,
                                 int S, int hd, float scale, float *p, float *o) {
    if (!kind_takes(kk, hd) || !kind_takes(kv, hd)) return -1;
    scores_dispatch(q, K, kk, S, hd, scale, p);
    __m512 vm = _mm512_set1_ps(-INFINITY);
    int j = 0;
    for (; j + 16 <= S; j += 16) vm = _mm512_max_ps(vm, _mm512_loadu_ps(p + j));
    if (j < S) {
        __mmask16 tail = (__mmask16)((1u << (S - j)) - 1);
        vm = _mm512_mask_max_ps(vm, tail, vm, _mm512_maskz_loadu_ps(tail, p + j));
    }
    k_softmax_row(p, S, _mm512_reduce_max_ps(vm));
    return values_dispatch(p, V, kv, S, hd, o);
}

/* ---- prefill: a block of consecutive queries, causal ----------------------------------------- */

/* Keys [0, S) of one head, K[S, hd] (floats or halves), into kt[hd][Sp] as floats: each
 * dimension's keys side by side, so that 16 scores of one query are one vector of products
 * summed over hd. Keys S..Sp-1 are zeros. Sixteen keys by sixteen dimensions at a time, transposed
 * in registers (k_transpose16x16). */
K_TARGET_AVX512 static void keys_transposed(const int KV, const void *K, int S, int Sp, int hd,
                                            float *kt) {
    for (int j0 = 0; j0 < Sp; j0 += 16) {
        int nk = S - j0 < 16 ? (S - j0 > 0 ? S - j0 : 0) : 16;
        for (int d0 = 0; d0 < hd; d0 += 16) {
            __m512i r[16];
            for (int i = 0; i < 16; i++)
                r[i] = _mm512_castps_si512(i < nk ? ld16(KV, K, (size_t)(j0 + i) * hd + d0)
                                                  : _mm512_setzero_ps());
            k_transpose16x16(r);
            for (int d = 0; d < 16; d++)
                _mm512_storeu_ps(kt + (size_t)(d0 + d) * Sp + j0, _mm512_castsi512_ps(r[d]));
        }
    }
}

/* R consecutive queries q[R][ldq] (query i sees keys 0..last0 + i) against kt (keys_transposed,
 * stride Sp) and V: o[i] = softmax(scale q_i.K) V, with p[R][Sp] as scratch. The scores of a
 * query are 16 keys per vector: hd multiply-adds with the query's element broadcast, KB blocks of
 * 16 keys at once so that R x KB chains (8) hide the adds' latency. The probabilities are left
 * unnormalized and the output is scaled by one over their sum at the end; V's rows are loaded
 * once for all R queries. */
K_TARGET_AVX512 static inline K_ALWAYS_INLINE void
block_avx512(const int NB, const int R, const int KB, const float *q, size_t ldq, const float *kt,
             int Sp, const void *V, const int KV, int last0, float scale, float *p, float *o,
             size_t ldo) {
    const int hd = 16 * NB, n = last0 + R; /* keys any of the R queries sees */
    for (int j0 = 0; j0 < n; j0 += 16 * KB) {
        __m512 acc[8];
        for (int a = 0; a < R * KB; a++) acc[a] = _mm512_setzero_ps();
        for (int d = 0; d < hd; d++) {
            __m512 k[4];
            for (int b = 0; b < KB; b++) k[b] = _mm512_loadu_ps(kt + (size_t)d * Sp + j0 + 16 * b);
            for (int i = 0; i < R; i++) {
                __m512 qi = _mm512_set1_ps(q[(size_t)i * ldq + d]);
                for (int b = 0; b < KB; b++)
                    acc[i * KB + b] = _mm512_fmadd_ps(qi, k[b], acc[i * KB + b]);
            }
        }
        for (int i = 0; i < R; i++)
            for (int b = 0; b < KB; b++)
                _mm512_storeu_ps(p + (size_t)i * Sp + j0 + 16 * b,
                                 _mm512_mul_ps(acc[i * KB + b], _mm512_set1_ps(scale)));
    }
    float inv[8];
    for (int i = 0; i < R; i++) {
        float *pi = p + (size_t)i * Sp;
        int m = last0 + i + 1; /* keys this query sees */
        __m512 mx = _mm512_set1_ps(-INFINITY);
        int j = 0;
        for (; j + 16 <= m; j += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(pi + j));
        __mmask16 tail = (__mmask16)((1u << (m - j)) - 1);
        mx = _mm512_mask_max_ps(mx, tail, mx, _mm512_maskz_loadu_ps(tail, pi + j));
        __m512 vm = _mm512_set1_ps(_mm512_reduce_max_ps(mx)), sum = _mm512_setzero_ps();
        for (j = 0; j + 16 <= m; j += 16) {
            __m512 e = k_exp16_nonpos(_mm512_sub_ps(_mm512_loadu_ps(pi + j), vm));
            sum = _mm512_add_ps(sum, e);
            _mm512_storeu_ps(pi + j, e);
        }
        /* the masked keys of this query, up to n, get zeros: the pass over V runs all R queries
         * to n */
        for (; j < n; j += 16) {
            int left = m - j > 0 ? (m - j < 16 ? m - j : 16) : 0;
            __mmask16 k = (__mmask16)((1u << left) - 1);
            __m512 e = _mm512_maskz_mov_ps(
                k, k_exp16_nonpos(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, pi + j), vm)));
            sum = _mm512_add_ps(sum, e);
            _mm512_storeu_ps(pi + j, e);
        }
        inv[i] = 1.0f / _mm512_reduce_add_ps(sum);
    }
    __m512 acc[16];
    for (int a = 0; a < R * NB; a++) acc[a] = _mm512_setzero_ps();
    for (int j = 0; j < n; j++) {
        __m512 v[8];
        for (int b = 0; b < NB; b++) v[b] = ld16(KV, V, (size_t)j * hd + 16 * b);
        for (int i = 0; i < R; i++) {
            __m512 w = _mm512_set1_ps(p[(size_t)i * Sp + j]);
            for (int b = 0; b < NB; b++)
                acc[i * NB + b] = _mm512_fmadd_ps(w, v[b], acc[i * NB + b]);
        }
    }
    for (int i = 0; i < R; i++)
        for (int b = 0; b < NB; b++)
            _mm512_storeu_ps(o + (size_t)i * ldo + 16 * b,
                             _mm512_mul_ps(acc[i * NB + b], _mm512_set1_ps(inv[i])));
}

/* All T queries, in blocks of R (the last block R = 1 at a time). */
K_TARGET_AVX512 static inline K_ALWAYS_INLINE void
causal_avx512(const int NB, const int R, const int KB, int kk, const int KV, const float *q,
              size_t ldq, const void *K, const void *V, int T, int first, float scale, float *kt,
              float *p, float *o, size_t ldo) {
    int S = first + T, Sp = (S + 63) & ~63;
    keys_transposed(kk, K, S, Sp, 16 * NB, kt);
    int t = 0;
    for (; t + R <= T; t += R)
        block_avx512(NB, R, KB, q + (size_t)t * ldq, ldq, kt, Sp, V, KV, first + t, scale, p,
                     o + (size_t)t * ldo, ldo);
    for (; t < T; t++)
        block_avx512(NB, 1, 4, q + (size_t)t * ldq, ldq, kt, Sp, V, KV, first + t, scale, p,
                     o + (size_t)t * ldo, ldo);
}

/* R queries per block as NB allows: R x NB output sums (at most 16) stay in registers. The keys'
 * kind kk is a variable (keys_transposed reads them once per call), the values' a constant. */
#define CAUSAL(NB, KV)                                                                             \
    causal_avx512(NB,                                                                              \
                  NB == 2   ? 8                                                                    \
                  : NB <= 4 ? 4                                                                    \
                            : 2,                                                                   \
                  NB == 2   ? 1                                                                    \
                  : NB <= 4 ? 2                                                                    \
                            : 4,                                                                   \
                  kk, KV, q, ldq, K, V, T, first, scale, kt, p, o, ldo)
#define CAUSAL_HD(KV) HD_CASES(CAUSAL, KV)

K_TARGET_AVX512 static int causal_dispatch(const float *q, size_t ldq, const void *K, const void *V,
                                           int kk, int kv, int T, int first, int hd, float scale,
                                           float *kt, float *p, float *o, size_t ldo) {
    if (!kind_takes(kk, hd) || !kind_takes(kv, hd)) return -1;
    KIND_CASES(kv, CAUSAL_HD)
}

#define HAVE_X86 1
#else
#define HAVE_X86 0
#endif

int k_attend_row(const float *q, const void *K, const void *V, int kk, int kv, int S, int hd,
                 float scale, float *p, float *o) {
#if HAVE_X86
    if (S > 0 && k_isa() >= K_ISA_AVX512)
        return attend_row_avx512(q, K, V, kk, kv, S, hd, scale, p, o);
#else
    (void)q, (void)K, (void)V, (void)kk, (void)kv, (void)S, (void)hd, (void)scale, (void)p, (void)o;
#endif
    return -1;
}

int k_attend_causal(const float *q, size_t ldq, const void *K, const void *V, int kk, int kv, int T,
                    int first, int hd, float scale, float *kt, float *p, float *o, size_t ldo) {
#if HAVE_X86
    if (T > 0 && first >= 0 && k_isa() >= K_ISA_AVX512)
        return causal_dispatch(q, ldq, K, V, kk, kv, T, first, hd, scale, kt, p, o, ldo);
#else
    (void)q, (void)ldq, (void)K, (void)V, (void)kk, (void)kv, (void)T, (void)first, (void)hd,
        (void)scale;
    (void)kt, (void)p, (void)o, (void)ldo;
#endif
    return -1;
}

int k_kv_kind(tlm_dtype t) {
    switch (t) {
    case TLM_DTYPE_F32: return K_KV_F32;
    case TLM_DTYPE_F16: return K_KV_F16;
    case TLM_DTYPE_BF16: return K_KV_BF16;
    case TLM_DTYPE_Q8_0: return K_KV_Q8_0;
    case TLM_DTYPE_Q4_0: return K_KV_Q4_0;
    case TLM_DTYPE_Q4_1: return K_KV_Q4_1;
    case TLM_DTYPE_Q5_0: return K_KV_Q5_0;
    case TLM_DTYPE_Q5_1: return K_KV_Q5_1;
    case TLM_DTYPE_IQ4_NL: return K_KV_IQ4_NL;
    default: return -1;
    }
}
