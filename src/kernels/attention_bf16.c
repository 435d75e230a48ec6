/* Training's causal attention with bf16 products (mixed precision), one (sequence, head) per task
 * with every operand in the thread's cache: q, k, v, dO, the probabilities and their gradients are
 * rounded into the layouts vdpbf16ps reads (below), and the six products run on register tiles of
 * our own. oneDNN's batched matmul over every head per block of queries, with q|k|v rounded into
 * head-major blocks for it, took 1.6-2x this kernel's time at every bench_attn_train shape for
 * bit for bit the same sums. Softmaxes and their gradients stay fp32; probs keeps the fp32
 * probabilities in the fp32 kernels' layout (keys by queries), so either backward can follow either
 * forward.
 *
 * vdpbf16ps adds to each fp32 lane the products of one pair of bf16 values of each operand. A
 * product C = A B over k then takes A's pairs (row i, columns 2p and 2p + 1) as one 32-bit word,
 * broadcast, and B's rows 2p and 2p + 1 interleaved word by word ("pair rows": B2[p][c] =
 * (B[2p][c], B[2p + 1][c])), 16 columns to a vector. A row-major matrix is its own pair form along
 * its columns; along its rows it needs the interleave. The six products and their operands' forms:
 *   scores  Pt[j][t] = s K[j].Q[t]   A: K rows            B: Q transposed (pair words by column)
 *   output  O[t] = sum_j P[t][j] V[j] A: Pt pair rows      B: V pair rows
 *   dV[j] = sum_t Pt[j][t] dO[t]     A: Pt rows           B: dO pair rows
 *   dPt[j][t] = V[j].dO[t]           A: V rows            B: dO transposed
 *   dQ[t] = sum_j dSt[j][t] K[j]     A: dSt pair rows     B: K pair rows
 *   dK[j] = sum_t dSt[j][t] Q[t]     A: dSt rows          B: Q pair rows
 * Causality skips work by tiles: a tile of rows j needs scores for queries t >= its first row only,
 * and sums over keys stop at (or start from) the tile's diagonal; the masked entries the sums still
 * cover are zeros in the operands. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "fastmath.h"
#include "kernels.h"

#if defined(__x86_64__)
#include "kernels/x86/simd.h"

/* Causal shapes of a product's row tile [i0, i1): all of it, columns from the tile's first row's
 * vector on (scores), the sum over pairs up to the tile's last row (outputs, dQ), or from its first
 * row on (dV, dK). */
enum { COLS_FROM_ROW, K_TO_ROW, K_FROM_ROW };

typedef struct {
    const uint32_t *a;
    long sai, sak; /* A's pair (row i, pair p) is a[i * sai + p * sak] */
    const uint32_t *b;
    long ldb; /* B's pair row p starts at b + p * ldb (words); columns padded to whole vectors */
    float *c;
    long ldc;
    int M, N, KP, shape; /* rows, columns, pairs summed, causal shape */
    float scale;
    int add;
    /* Packed sequences (else NULL): sm[t], a lower bound of the first key of the queries from t
     * on, and hi[j], one past the last query that sees key j, narrow the tiles further. */
    const int *sm, *hi;
} product;

/* MR rows x NV vectors of 16 columns over pairs [p0, p1); the last vector stores the lanes of
 * mask. Each sum runs over the pairs in order, whatever the tile. */
K_TARGET_AVX512BF16 static inline __attribute__((always_inline)) void
tile(const int MR, const int NV, const product *q, int i0, int v0, int p0, int p1, __mmask16 mask) {
    __m512 acc[8][4];
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) acc[i][v] = _mm512_setzero_ps();
    const uint32_t *a = q->a + i0 * q->sai, *b = q->b + 16 * v0;
    for (int p = p0; p < p1; p++) {
        __m512bh bv[4];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++)
            bv[v] = (__m512bh)_mm512_loadu_si512((const void *)(b + p * q->ldb + 16 * v));
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            __m512bh av = (__m512bh)_mm512_set1_epi32((int)a[i * q->sai + p * q->sak]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], av, bv[v]);
        }
    }
    __m512 s = _mm512_set1_ps(q->scale);
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) {
            float *c = q->c + (long)(i0 + i) * q->ldc + 16 * (v0 + v);
            __mmask16 m = v == NV - 1 ? mask : 0xffff;
            __m512 r = _mm512_mul_ps(acc[i][v], s);
            if (q->add) r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(m, c));
            _mm512_mask_storeu_ps(c, m, r);
        }
}

#define TILE_NV(MR)                                                                                \
    case MR:                                                                                       \
        if (nv == 4)                                                                               \
            tile(MR, 4, q, i0, v0, p0, p1, mask);                                                  \
        else if (nv == 3)                                                                          \
            tile(MR, 3, q, i0, v0, p0, p1, mask);                                                  \
        else if (nv == 2)                                                                          \
            tile(MR, 2, q, i0, v0, p0, p1, mask);                                                  \
        else                                                                                       \
            tile(MR, 1, q, i0, v0, p0, p1, mask);                                                  \
        return;
K_TARGET_AVX512BF16 static void tile_any(int mr, int nv, const product *q, int i0, int v0, int p0,
                                         int p1, __mmask16 mask) {
    switch (mr) {
        TILE_NV(1)
        TILE_NV(2)
        TILE_NV(3)
        TILE_NV(4)
        TILE_NV(5)
        TILE_NV(6)
        TILE_NV(7)
        TILE_NV(8)
    default: return;
    }
}

/* The whole product by tiles: 6 rows by 4 vectors (24 accumulators), or 8 rows by fewer vectors,
 * the columns taken 4 vectors at a time. */
K_TARGET_AVX512BF16 static void run(const product *q) {
    int vectors = (q->N + 15) / 16, full = q->N % 16 == 0;
    __mmask16 tail = full ? 0xffff : (__mmask16)((1u << (q->N % 16)) - 1);
    int wide = vectors >= 4, MR = wide ? 6 : 8;
    for (int i0 = 0; i0 < q->M; i0 += MR) {
        int mr = q->M - i0 < MR ? q->M - i0 : MR, i1 = i0 + mr;
        int p0 = 0, p1 = q->KP, vstart = 0, vend = vectors;
        if (q->shape == COLS_FROM_ROW) {
            vstart = i0 / 16;
            if (q->hi && (q->hi[i1 - 1] + 15) / 16 < vend) vend = (q->hi[i1 - 1] + 15) / 16;
        }
        if (q->shape == K_TO_ROW) {
            p1 = (i1 + 1) / 2 < q->KP ? (i1 + 1) / 2 : q->KP;
            if (q->sm) p0 = q->sm[i0] / 2;
        }
        if (q->shape == K_FROM_ROW) {
            p0 = i0 / 2;
            if (q->hi && (q->hi[i1 - 1] + 1) / 2 < p1) p1 = (q->hi[i1 - 1] + 1) / 2;
        }
        for (int v0 = vstart; v0 < vend; v0 += 4) {
            int nv = vend - v0 < 4 ? vend - v0 : 4;
            tile_any(mr, nv, q, i0, v0, p0, p1, v0 + nv == vectors ? tail : 0xffff);
        }
    }
}

/* The lanes of a vector of 16 columns from c0 that lie below n. */
static inline __mmask16 below(int c0, int n) {
    int k = n - c0;
    return k >= 16 ? 0xffff : k <= 0 ? 0 : (__mmask16)((1u << k) - 1);
}

/* The word order that interleaves the two halves of a vector of 32 bf16: (x0, y0, x1, y1, ...). */
K_TARGET_AVX512BF16 static inline __m512i interleave(void) {
    return _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                            6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
}

/* Rows x and y (16 floats each) as 16 pair words, rounded. */
K_TARGET_AVX512BF16 static inline __m512i pair_words(__m512 x, __m512 y) {
    return _mm512_permutexvar_epi16(interleave(), (__m512i)_mm512_cvtne2ps_pbh(y, x));
}

/* Rows of hd floats (a multiple of 16) ld apart to bf16 rows of hd. */
K_TARGET_AVX512BF16 static void round_rows(uint16_t *dst, const float *src, long ld, int rows,
                                           int hd) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < hd; c += 16)
            _mm256_storeu_si256((__m256i *)(dst + (long)r * hd + c),
                                (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src + r * ld + c)));
}

/* Pair rows of rows x cols floats (ld apart): dst[p][c] = (src[2p][c], src[2p + 1][c]) rounded,
 * ldd words apart; a missing last row and the columns from cols to the next vector are zeros. */
K_TARGET_AVX512BF16 static void pair_rows(uint32_t *dst, long ldd, const float *src, long ld,
                                          int rows, int cols) {
    for (int r = 0; r < rows; r += 2) {
        const float *s0 = src + r * ld, *s1 = s0 + ld;
        for (int c = 0; c < cols; c += 16) {
            __mmask16 m = below(c, cols);
            __m512 x0 = _mm512_maskz_loadu_ps(m, s0 + c);
            __m512 x1 = r + 1 < rows ? _mm512_maskz_loadu_ps(m, s1 + c) : _mm512_setzero_ps();
            _mm512_storeu_si512((void *)(dst + (long)(r / 2) * ldd + c), pair_words(x0, x1));
        }
    }
}

/* Rows of hd floats (ld apart) transposed as pair words: dst[p][t] = (src[t][2p], src[t][2p + 1])
 * rounded, ldd (a multiple of 16) words apart; columns t from rows to ldd are zeros. Blocks of 16
 * rows by 16 pairs go through registers. */
K_TARGET_AVX512BF16 static void pair_columns(uint32_t *dst, long ldd, const float *src, long ld,
                                             int rows, int hd) {
    for (int t0 = 0; t0 < ldd; t0 += 16)
        for (int c = 0; c < hd; c += 32) {
            int np = hd - c < 32 ? (hd - c) / 2 : 16; /* pairs in this block: 8 or 16 */
            __m512i r[16];
            for (int i = 0; i < 16; i++) {
                const float *x = src + (long)(t0 + i) * ld + c;
                if (t0 + i >= rows)
                    r[i] = _mm512_setzero_si512();
                else if (np == 16)
                    r[i] =
                        (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + 16), _mm512_loadu_ps(x));
                else
                    r[i] = _mm512_zextsi256_si512((__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x)));
            }
            k_transpose16x16(r);
            for (int p = 0; p < np; p++)
                _mm512_storeu_si512((void *)(dst + (long)(c / 2 + p) * ldd + t0), r[p]);
        }
}

/* Rows of n floats (ld apart) to bf16 rows of ldd (a multiple of 16, zeros past n). */
K_TARGET_AVX512BF16 static void round_wide_rows(uint16_t *dst, long ldd, const float *src, long ld,
                                                int rows, int n) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < ldd; c += 16)
            _mm256_storeu_si256(
                (__m256i *)(dst + r * ldd + c),
                (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(below(c, n), src + r * ld + c)));
}

/* The per-thread buffers of one (sequence, head), Te = T rounded up to even, Tv to 16. */
typedef struct {
    int T, Te, Tv, hd;
} dims;

static dims dims_of(int T, int hd) {
    dims d = {T, (T + 1) & ~1, (T + 15) & ~15, hd};
    return d;
}

static size_t al(size_t n) { return (n + 63) & ~(size_t)63; }

/* Forward: K rows, Q transposed, V pair rows, P pair rows. */
static size_t fwd_bytes(dims d) {
    return al((size_t)d.Te * d.hd * 2) + al((size_t)d.hd * d.Tv * 2) + al((size_t)d.Te * d.hd * 2) +
           al((size_t)d.Te * d.Tv * 2);
}

/* Backward: V rows, dO transposed, dO, K and Q pair rows, P rows, dP (fp32), dS rows and pair
 * rows, the columns' sums. */
static size_t bwd_bytes(dims d) {
    return al((size_t)d.Te * d.hd * 2) + al((size_t)d.hd * d.Tv * 2) +
           3 * al((size_t)d.Te * d.hd * 2) + al((size_t)d.Te * d.Tv * 2) +
           al((size_t)d.T * d.Tv * 4) + 2 * al((size_t)d.Te * d.Tv * 2) + al((size_t)d.Tv * 4);
}

static void *take(char **p, size_t n) {
    void *r = *p;
    *p += al(n);
    return r;
}

/* The causal softmax down each column of Pt (the fp32 kernels' softmax_columns), 16 queries at
 * a time in the lanes of one vector, and the probabilities' pair rows for the output product,
 * written in the pass that normalizes them. Entries of masked keys (with lo, also those before
 * a query's first visible key), and every row below the block's last query, are zeros in both:
 * the backward's softmax then needs no mask of its own. Scores of rows that no query of a block
 * sees may not have been computed: they are never read, only overwritten with zeros. */
K_TARGET_AVX512BF16 static void softmax_pairs(float *Pt, int T, uint32_t *Pp, long Tv,
                                              const int *lo) {
    for (int c = 0; c < Tv; c += 16) {
        __mmask16 in = below(c, T);
        int j1 = c + 16 < T ? c + 16 : T; /* rows some query of the block sees */
        /* each query's first visible key: 0, or its example's first row in a packed sequence */
        __m512i first = lo ? _mm512_maskz_loadu_epi32(in, lo + c) : _mm512_setzero_si512();
        int j0 = lo ? _mm512_mask_reduce_min_epi32(in, first) : 0; /* no query sees keys before */
        __m512 mx = _mm512_set1_ps(-INFINITY), sum = _mm512_setzero_ps();
#define VISIBLE(j) (in & ~below(c, j) & _mm512_cmple_epi32_mask(first, _mm512_set1_epi32(j)))
        for (int j = j0; j < j1; j++) {
            __mmask16 m = VISIBLE(j); /* queries t >= j (from their first key) see key j */
            __m512 x = _mm512_maskz_loadu_ps(m, Pt + (long)j * T + c);
            mx = _mm512_mask_mov_ps(mx, _mm512_mask_cmp_ps_mask(m, x, mx, _CMP_GT_OQ), x);
        }
        for (int j = j0; j < j1; j++) {
            __mmask16 m = VISIBLE(j);
#undef VISIBLE
            float *row = Pt + (long)j * T + c;
            __m512 e = k_exp16_nonpos(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, row), mx));
            e = _mm512_maskz_mov_ps(m, e);
            _mm512_mask_storeu_ps(row, in, e);
            sum = _mm512_add_ps(sum, e);
        }
        __m512 inv = _mm512_div_ps(_mm512_set1_ps(1.0f), sum);
        for (int j = 0; j < T; j += 2) {
            __m512 x = _mm512_setzero_ps(), y = _mm512_setzero_ps();
            float *r0 = Pt + (long)j * T + c, *r1 = r0 + T;
            if (j >= j0 && j < j1) x = _mm512_mul_ps(_mm512_maskz_loadu_ps(in, r0), inv);
            if (j + 1 >= j0 && j + 1 < j1) y = _mm512_mul_ps(_mm512_maskz_loadu_ps(in, r1), inv);
            _mm512_mask_storeu_ps(r0, in, x);
            if (j + 1 < T) _mm512_mask_storeu_ps(r1, in, y);
            _mm512_storeu_si512((void *)(Pp + (long)(j / 2) * Tv + c), pair_words(x, y));
        }
    }
}

/* Pt = scale K Q^T (keys and queries rounded into buffers taken from buf). Scores left of a tile's
 * first vector are not computed: they are masked, and the softmax reads them only to select them
 * away and overwrites them. */
K_TARGET_AVX512BF16 static void head_scores(dims d, char **buf, float *Pt, const float *q,
                                            const float *k, long ld, const int *sm, const int *hi,
                                            float scale) {
    int T = d.T, hd = d.hd, Tv = d.Tv, Te = d.Te;
    uint16_t *Kr = take(buf, (size_t)Te * hd * 2);
    uint32_t *Qt = take(buf, (size_t)hd * Tv * 2);
    round_rows(Kr, k, ld, T, hd);
    pair_columns(Qt, Tv, q, ld, T, hd);
    product s = {(const uint32_t *)Kr, hd / 2, 1, Qt, Tv, Pt, T, T, T, hd / 2,
                 COLS_FROM_ROW,        scale,  0, sm, hi};
    run(&s);
}

/* The soft cap on the scores some query sees (row j: queries j .. hi[j]): cap tanh(s / cap), or
 * with deriv its derivative 1 - tanh^2(s / cap), for the backward. */
K_TARGET_AVX512BF16 static void cap_rows(float *Pt, int T, const int *hi, float cap, int deriv) {
    float inv = 1.0f / cap;
    for (int j = 0; j < T; j++) {
        float *row = Pt + (long)j * T;
        int end = hi ? hi[j] : T;
        if (deriv)
            for (int t = j; t < end; t++) {
                float th = k_tanhf(row[t] * inv);
                row[t] = 1.0f - th * th;
            }
        else
            for (int t = j; t < end; t++) row[t] = cap * k_tanhf(row[t] * inv);
    }
}

/* Pt = softmax(scale K Q^T, soft-capped when cap > 0) down each column, and (into *Pp, taken from
 * buf) its pair rows. */
K_TARGET_AVX512BF16 static void head_probs(dims d, char **buf, float *Pt, uint32_t **Pp,
                                           const float *q, const float *k, long ld, const int *lo,
                                           const int *sm, const int *hi, float scale, float cap) {
    *Pp = take(buf, (size_t)d.Te * d.Tv * 2);
    head_scores(d, buf, Pt, q, k, ld, sm, hi, scale);
    if (cap > 0.0f) cap_rows(Pt, d.T, hi, cap, 0);
    softmax_pairs(Pt, d.T, *Pp, d.Tv, lo);
}

K_TARGET_AVX512BF16 static void head_fwd(dims d, char *buf, float *out, long ow, float *Pt,
                                         const float *q, const float *k, const float *v, long ld,
                                         const int *lo, const int *sm, const int *hi, float scale,
                                         float cap) {
    int T = d.T, hd = d.hd, Te = d.Te;
    uint32_t *Pp, *Vp = take(&buf, (size_t)Te * hd * 2);
    pair_rows(Vp, hd, v, ld, T, hd);
    head_probs(d, &buf, Pt, &Pp, q, k, ld, lo, sm, hi, scale, cap);
    product o = {Pp, 1, d.Tv, Vp, hd, out, ow, T, hd, Te / 2, K_TO_ROW, 1.0f, 0, sm, hi};
    run(&o);
}

/* dS = P (dP - sum_keys P dP) scale per query (column) over its visible keys, zero elsewhere,
 * times the soft cap's derivative F (rows T apart; NULL: no cap), as bf16 rows and pair rows. Row
 * j's queries run to hi[j] (packed; else T): dP past them may not have been computed. */
K_TARGET_AVX512BF16 static void softmax_bwd(dims d, const float *Pt, const float *dP,
                                            const float *F, float *D, uint16_t *Sr, uint32_t *Sp,
                                            float scale, const int *hi) {
    int T = d.T, Tv = d.Tv;
    for (int c = 0; c < Tv; c += 16) _mm512_storeu_ps(D + c, _mm512_setzero_ps());
    for (int j = 0; j < T; j++) {
        int end = hi ? hi[j] : T;
        for (int c = j / 16 * 16; c < end; c += 16) {
            /* visible: queries t >= j; dP left of the product's first vector is not computed */
            __mmask16 m = below(c, end) & ~below(c, j);
            __m512 p = _mm512_maskz_loadu_ps(m, Pt + (long)j * T + c);
            __m512 g = _mm512_maskz_loadu_ps(m, dP + (long)j * Tv + c);
            _mm512_storeu_ps(D + c, _mm512_fmadd_ps(p, g, _mm512_loadu_ps(D + c)));
        }
    }
    __m512 sc = _mm512_set1_ps(scale);
    for (int j = 0; j < d.Te; j += 2)
        for (int c = 0; c < Tv; c += 16) {
            __m512 s[2];
            for (int r = 0; r < 2; r++) {
                int jj = j + r;
                __mmask16 m = jj < T ? below(c, hi ? hi[jj] : T) & ~below(c, jj) : 0;
                __m512 p = _mm512_maskz_loadu_ps(m, Pt + (long)jj * T + c);
                __m512 g = _mm512_maskz_loadu_ps(m, dP + (long)jj * Tv + c);
                s[r] = _mm512_maskz_mul_ps(
                    m, _mm512_mul_ps(p, _mm512_sub_ps(g, _mm512_loadu_ps(D + c))), sc);
                if (F) s[r] = _mm512_mul_ps(s[r], _mm512_maskz_loadu_ps(m, F + (long)jj * T + c));
            }
            __m512i w = (__m512i)_mm512_cvtne2ps_pbh(s[1], s[0]);
            _mm512_storeu_si512((void *)(Sp + (long)(j / 2) * Tv + c),
                                _mm512_permutexvar_epi16(interleave(), w));
            _mm256_storeu_si256((__m256i *)(Sr + (long)j * Tv + c), _mm512_castsi512_si256(w));
            if (j + 1 < T)
                _mm256_storeu_si256((__m256i *)(Sr + (long)(j + 1) * Tv + c),
                                    _mm512_extracti64x4_epi64(w, 1));
        }
}

/* acc: dK and dV are added to (the later heads of a group of query heads sharing k and v). */
K_TARGET_AVX512BF16 static void head_bwd(dims d, char *buf, float *dq, float *dk, float *dv,
                                         const float *dO, long ow, const float *Pt, const float *q,
                                         const float *k, const float *v, long ld, int acc,
                                         const int *sm, const int *hi, float scale,
                                         const float *F) {
    int T = d.T, hd = d.hd, Tv = d.Tv, Te = d.Te;
    uint16_t *Vr = take(&buf, (size_t)Te * hd * 2);
    uint32_t *dOt = take(&buf, (size_t)hd * Tv * 2), *dOp = take(&buf, (size_t)Te * hd * 2);
    uint32_t *Kp = take(&buf, (size_t)Te * hd * 2), *Qp = take(&buf, (size_t)Te * hd * 2);
    uint16_t *Pr = take(&buf, (size_t)Te * Tv * 2);
    float *dP = take(&buf, (size_t)T * Tv * 4);
    uint16_t *Sr = take(&buf, (size_t)Te * Tv * 2);
    uint32_t *Sp = take(&buf, (size_t)Te * Tv * 2);
    float *D = take(&buf, (size_t)Tv * 4);
    round_rows(Vr, v, ld, T, hd);
    pair_columns(dOt, Tv, dO, ow, T, hd);
    pair_rows(dOp, hd, dO, ow, T, hd);
    pair_rows(Kp, hd, k, ld, T, hd);
    pair_rows(Qp, hd, q, ld, T, hd);
    round_wide_rows(Pr, Tv, Pt, T, T, T);
    /* dV = Pt dO, dPt = V dO^T */
    product pv = {(const uint32_t *)Pr, Tv / 2, 1,   dOp, hd, dv, ld, T, hd, Te / 2,
                  K_FROM_ROW,           1.0f,   acc, sm,  hi};
    run(&pv);
    product pp = {(const uint32_t *)Vr, hd / 2, 1, dOt, Tv, dP, Tv, T, T, hd / 2,
                  COLS_FROM_ROW,        1.0f,   0, sm,  hi};
    run(&pp);
    softmax_bwd(d, Pt, dP, F, D, Sr, Sp, scale, hi);
    /* dQ = dS K = dSt^T K, dK = dSt Q */
    product pq = {Sp, 1, Tv, Kp, hd, dq, ld, T, hd, Te / 2, K_TO_ROW, 1.0f, 0, sm, hi};
    run(&pq);
    product pk = {(const uint32_t *)Sr, Tv / 2, 1,   Qp, hd, dk, ld, T, hd, Te / 2,
                  K_FROM_ROW,           1.0f,   acc, sm, hi};
    run(&pk);
}

/* A packed sequence's bounds (lo as k_bf16_attention_fwd's): sm[t] = min(lo[t..T)), so the queries
 * from t on see no key before sm[t] (lo need not be sorted), and hi[j] = 1 + the last t with
 * sm[t] <= j, past which no query sees key j. Both never decrease, so a tile's bounds are those
 * of its first or last row. Taken from the front of buf. */
static void bounds(char **buf, const int *lo, int T, const int **sm_out, const int **hi_out) {
    *sm_out = *hi_out = NULL;
    if (!lo) return;
    int *sm = take(buf, (size_t)T * sizeof(int)), *hi = take(buf, (size_t)T * sizeof(int));
    sm[T - 1] = lo[T - 1];
    for (int t = T - 2; t >= 0; t--) sm[t] = lo[t] < sm[t + 1] ? lo[t] : sm[t + 1];
    for (int j = 0, u = 0; j < T; j++) {
        while (u + 1 < T && sm[u + 1] <= j) u++;
        hi[j] = u + 1;
    }
    *sm_out = sm;
    *hi_out = hi;
}

static size_t bounds_bytes(dims d) { return 2 * al((size_t)d.T * sizeof(int)); }

/* The next task's probabilities (up to 64 KiB), which the forward left in memory: reading them
 * as misses took a third of the backward's time at T 64. */
static void prefetch(const void *p, size_t bytes) {
    if (bytes > (64 << 10)) bytes = 64 << 10;
    for (size_t i = 0; i < bytes; i += 64) __builtin_prefetch((const char *)p + i, 0, 2);
}

/* Per-thread buffers for the team the calling thread would start. */
static char *buffers(k_bf16 *k, size_t per, int *threads) {
    *threads = omp_in_parallel() ? 1 : omp_get_max_threads();
    return k_bf16_scratch(k, K_BF16_ATT_SLOT, per * (size_t)*threads);
}

/* One call's heads: task bh (of tasks = B * H) is head bh % H of sequence bh / H. */
typedef struct {
    dims d;
    float *out, *dqkv;
    float *probs;          /* the forward's */
    const float *probs_in; /* the backward's */
    const float *qkv, *dout;
    const int *lo; /* [B*T] or NULL */
    long ld;
    int H, KVH, tasks;
    float scale, cap;
} heads;

/* Task bh of B * H, on buf, the thread's per bytes of buffers. */
typedef void task_fn(const heads *a, int bh, char *buf);

/* Query head h of sequence b reads key/value head h / (H / KVH): q | k | v rows are H, KVH and
 * KVH heads wide. */
K_TARGET_AVX512BF16 static void fwd_task(const heads *a, int bh, char *buf) {
    int T = a->d.T, hd = a->d.hd, ow = a->H * hd, kw = a->KVH * hd, b = bh / a->H, h = bh % a->H;
    int g = h / (a->H / a->KVH);
    const float *row = a->qkv + (size_t)b * T * a->ld;
    const int *lo = a->lo ? a->lo + (size_t)b * T : NULL, *sm, *hi;
    bounds(&buf, lo, T, &sm, &hi);
    head_fwd(a->d, buf, a->out + (size_t)b * T * ow + h * hd, ow, a->probs + (size_t)bh * T * T,
             row + (size_t)h * hd, row + ow + (size_t)g * hd, row + ow + kw + (size_t)g * hd, a->ld,
             lo, sm, hi, a->scale, a->cap);
}

/* Task bg: key/value head g of sequence b and the query heads that share it, in order, so that
 * their dK and dV add up on one thread (the same sums whatever the team). */
K_TARGET_AVX512BF16 static void bwd_task(const heads *a, int bg, char *buf) {
    int T = a->d.T, hd = a->d.hd, ow = a->H * hd, kw = a->KVH * hd, b = bg / a->KVH,
        g = bg % a->KVH, group = a->H / a->KVH;
    size_t r = (size_t)b * T * a->ld, kv = r + ow + (size_t)g * hd;
    const int *lo = a->lo ? a->lo + (size_t)b * T : NULL, *sm, *hi;
    bounds(&buf, lo, T, &sm, &hi);
    /* past the backward's buffers: the probabilities computed again (no probs_in), then the cap's
     * derivatives (a cap) */
    char *rb = buf + al(bwd_bytes(a->d));
    char *cb = a->probs_in ? rb : rb + al((size_t)T * T * 4) + al(fwd_bytes(a->d));
    for (int i = 0; i < group; i++) {
        int h = g * group + i, bh = b * a->H + h;
        size_t x = r + (size_t)h * hd;
        const float *Pt;
        float *F = NULL;
        if (a->cap > 0.0f) {
            char *fb = cb;
            F = take(&fb, (size_t)T * T * 4);
            head_scores(a->d, &fb, F, a->qkv + x, a->qkv + kv, a->ld, sm, hi, a->scale);
            cap_rows(F, T, hi, a->cap, 1);
        }
        if (a->probs_in) {
            if (bh + 1 < a->tasks * group)
                prefetch(a->probs_in + (size_t)(bh + 1) * T * T, (size_t)T * T * 4);
            Pt = a->probs_in + (size_t)bh * T * T;
        } else {
            /* The head's probabilities again, as the forward computed them, into this thread's
             * buffers after the backward's: in cache for the products that read them. */
            char *fb = rb;
            float *P = take(&fb, (size_t)T * T * 4);
            uint32_t *Pp;
            head_probs(a->d, &fb, P, &Pp, a->qkv + x, a->qkv + kv, a->ld, lo, sm, hi, a->scale,
                       a->cap);
            Pt = P;
        }
        head_bwd(a->d, buf, a->dqkv + x, a->dqkv + kv, a->dqkv + kv + kw,
                 a->dout + (size_t)b * T * ow + h * hd, ow, Pt, a->qkv + x, a->qkv + kv,
                 a->qkv + kv + kw, a->ld, i > 0, sm, hi, a->scale, F);
    }
}

/* Every task, on the team the calling thread would start (heads are shared out one at a time),
 * or inline on a replica's thread, where a region of one would only add libgomp's cost (k_fork).
 * 0 when the buffers could not be had. */
static int each_head(k_bf16 *k, const heads *a, size_t per, task_fn *task) {
    int threads;
    char *buf = buffers(k, per, &threads);
    if (!buf) return 0;
    if (threads == 1) {
        for (int bh = 0; bh < a->tasks; bh++) task(a, bh, buf);
    } else {
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
        for (int bh = 0; bh < a->tasks; bh++) task(a, bh, buf + per * (size_t)omp_get_thread_num());
    }
    return 1;
}

int k_bf16_attention_fwd(k_bf16 *k, float *out, float *probs, const float *qkv, int ld, int B,
                         int T, int H, int KVH, int hd, float scale, float cap, const int *lo,
                         float p) {
    /* Dropout's masks are applied per head by the fp32 kernels. */
    if (!k || p > 0.0f || KVH <= 0 || H % KVH || hd % 16 || !k_bf16_supported()) return 0;
    heads a = {dims_of(T, hd), out,   NULL, probs, NULL, qkv, NULL, lo, ld, H, KVH,
               B * H,          scale, cap};
    return each_head(k, &a, bounds_bytes(a.d) + al(fwd_bytes(a.d)), fwd_task);
}

int k_bf16_attention_bwd(k_bf16 *k, float *dqkv, const float *dout, const float *qkv, int ld,
                         const float *probs, int B, int T, int H, int KVH, int hd, float scale,
                         float cap, const int *lo, float p) {
    if (!k || p > 0.0f || KVH <= 0 || H % KVH || hd % 16 || !k_bf16_supported()) return 0;
    heads a = {dims_of(T, hd), NULL,  dqkv, NULL, probs, qkv, dout, lo, ld, H, KVH,
               B * KVH,        scale, cap};
    size_t per = bounds_bytes(a.d) + al(bwd_bytes(a.d));
    if (!probs) per += al((size_t)T * T * 4) + al(fwd_bytes(a.d));
    if (cap > 0.0f) per += al((size_t)T * T * 4) + al(fwd_bytes(a.d));
    return each_head(k, &a, per, bwd_task);
}

#else /* no x86: the fp32 kernels run */

int k_bf16_attention_fwd(k_bf16 *k, float *out, float *probs, const float *qkv, int ld, int B,
                         int T, int H, int KVH, int hd, float scale, float cap, const int *lo,
                         float p) {
    (void)k, (void)out, (void)probs, (void)qkv, (void)ld, (void)B, (void)T, (void)H, (void)KVH;
    (void)hd, (void)scale, (void)cap, (void)lo, (void)p;
    return 0;
}

int k_bf16_attention_bwd(k_bf16 *k, float *dqkv, const float *dout, const float *qkv, int ld,
                         const float *probs, int B, int T, int H, int KVH, int hd, float scale,
                         float cap, const int *lo, float p) {
    (void)k, (void)dqkv, (void)dout, (void)qkv, (void)ld, (void)probs, (void)B, (void)T, (void)H;
    (void)KVH, (void)hd, (void)scale, (void)cap, (void)lo, (void)p;
    return 0;
}
#endif
