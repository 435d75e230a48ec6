#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "fastmath.h"
#include "kernels.h"

/* Causal attention over one (batch, head) per task: sgemm inside runs single-threaded (OpenBLAS
 * detects the enclosing OpenMP region), so heads scale across cores without oversubscription.
 *
 * Scores are kept transposed, keys by queries (row j, column t): each query's softmax then runs
 * down a column, so every pass walks contiguous rows with the queries in the vector lanes and no
 * horizontal reductions, where row-wise softmaxes over short causal rows were mostly overhead.
 * Key j is visible to queries t >= j: the valid part of row j is its suffix [j, T). Packed rows
 * (several examples in one sequence) also hide the keys before a query's first visible one, lo[t]
 * (its example's first row): their probabilities are zeros, which is all the backward needs.
 *
 * With p > 0 the probabilities are dropped out into per-thread scratch for the P.V product, while
 * probs keeps them undropped for the softmax backward. The mask index of (query t, key j) is
 * t*T + j within the head's block.
 *
 * Every product runs per block of QB queries [t0, t1): those see keys [0, t1) only, so the
 * blocks of scores that are masked whole (keys t1.. for queries below t1) are never computed
 * (about 3/8 of the products' work at T 256, half at long contexts) nor read. Packed, the block
 * sees keys from its queries' first visible one on (block_first): the rows before it are zeros in
 * the probabilities and are left out of every product. */
enum { QB = 64 };

/* The first key any query of [t0, t1) sees. */
static inline int block_first(const int *lo, int t0, int t1) {
    int f = t0;
    for (int t = t0; lo && t < t1; t++) f = lo[t] < f ? lo[t] : f;
    return lo ? f : 0;
}

/* Columns are taken QB at a time so that their running max and sum are small fixed arrays: this
 * runs on OpenMP workers, whose stacks (OMP_STACKSIZE) are too small for anything sized by T.
 * Every column still reduces over its rows in the same order as a whole-width pass would.
 * The loops run over the block's full width and select by the mask: loops that start at each
 * row's first visible query left most of the work to scalar peel and tail code (the rows near
 * the diagonal are short), the softmax then taking 23% of an attention at T 64. The masked
 * scores they read were computed by the products (every row below t1 is), so they are finite. */
K_INLINE void softmax_columns(float *Pt, int T, const int *lo) {
    for (int t0 = 0; t0 < T; t0 += QB) {
        int w = t0 + QB < T ? QB : T - t0, t1 = t0 + w;
        float mx[QB], sum[QB];
        int first[QB]; /* each query's first visible key: 0, or its example's start when packed */
        for (int i = 0; i < w; i++) first[i] = lo ? lo[t0 + i] : 0;
        /* rows before j0 were not computed; no query of the block sees them */
        int j0 = block_first(lo, t0, t1);
        for (int j = 0; j < j0; j++) memset(Pt + (size_t)j * T + t0, 0, (size_t)w * sizeof(float));
        for (int i = 0; i < w; i++) mx[i] = -INFINITY;
        for (int j = j0; j < t1; j++) {
            const float *row = Pt + (size_t)j * T + t0;
            int i0 = j - t0; /* queries before key j are masked */
#pragma omp simd
            for (int i = 0; i < w; i++)
                mx[i] = i >= i0 && j >= first[i] && row[i] > mx[i] ? row[i] : mx[i];
        }
        for (int i = 0; i < w; i++) sum[i] = 0.0f;
        for (int j = j0; j < t1; j++) {
            float *row = Pt + (size_t)j * T + t0;
            int i0 = j - t0;
#pragma omp simd
            for (int i = 0; i < w; i++) {
                float e = i >= i0 && j >= first[i] ? k_expf(row[i] - mx[i]) : 0.0f;
                row[i] = e;
                sum[i] += e;
            }
        }
        for (int j = t1; j < T; j++) memset(Pt + (size_t)j * T + t0, 0, (size_t)w * sizeof(float));
        for (int i = 0; i < w; i++) sum[i] = 1.0f / sum[i];
        for (int j = j0; j < t1; j++) {
            float *row = Pt + (size_t)j * T + t0;
#pragma omp simd
            for (int i = 0; i < w; i++) row[i] *= sum[i];
        }
    }
}

K_VERSIONS(softmax_columns, (float *Pt, int T, const int *lo), (Pt, T, lo))

/* The soft cap on the scores a block of queries [t0, t1) computed (rows j0 .. t1 of its columns):
 * cap tanh(s / cap), or with deriv its derivative 1 - tanh^2(s / cap) for the backward. */
K_INLINE void cap_block(float *Pt, int T, int t0, int t1, int j0, float cap, int deriv) {
    float inv = 1.0f / cap;
    for (int j = j0; j < t1; j++) {
        float *row = Pt + (size_t)j * T;
        if (deriv) {
#pragma omp simd
            for (int t = t0; t < t1; t++) {
                float th = k_tanhf(row[t] * inv);
                row[t] = 1.0f - th * th;
            }
        } else {
#pragma omp simd
            for (int t = t0; t < t1; t++) row[t] = cap * k_tanhf(row[t] * inv);
        }
    }
}
K_VERSIONS(cap_block, (float *Pt, int T, int t0, int t1, int j0, float cap, int deriv),
           (Pt, T, t0, t1, j0, cap, deriv))

/* Pt's blocks of scale K Q^T (keys by queries) that some query sees, soft-capped when cap > 0
 * (or, with deriv, the cap's derivative there). */
static void scores(float *Pt, const float *kb, const float *qb, int kw, int qw, int T, int hd,
                   float scale, float cap, int deriv, const int *lob, cap_block_fn *capf) {
    for (int t0 = 0; t0 < T; t0 += QB) {
        int t1 = t0 + QB < T ? t0 + QB : T, j0 = block_first(lob, t0, t1);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t1 - j0, t1 - t0, hd, scale,
                    kb + (size_t)j0 * kw, kw, qb + (size_t)t0 * qw, qw, 0.0f,
                    Pt + (size_t)j0 * T + t0, T);
        if (cap > 0.0f) capf(Pt, T, t0, t1, j0, cap, deriv);
    }
}

/* D = Pt with the dropout mask of head block bh applied (index t*T + j for query t, key j). Not
 * versioned: the mask's hash is a call per element in every build. */
static void drop_probs(float *D, const float *Pt, int T, uint64_t key, uint64_t bh, float p) {
    uint64_t base = bh * (uint64_t)T * (uint64_t)T;
    for (int j = 0; j < T; j++)
        for (int t = 0; t < T; t++)
            D[(size_t)j * T + t] =
                Pt[(size_t)j * T + t] * k_dropout_keep(key, base + (size_t)t * T + j, p);
}

static void attention_fwd(float *out, float *probs, const float *q, const float *k, const float *v,
                          int ldq, int ldkv, int B, int T, int H, int KVH, int hd, float scale,
                          float cap, const int *lo, float p, uint64_t key, float *scratch) {
    int qw = ldq, kw = ldkv, ow = H * hd, group = H / KVH;
    softmax_columns_fn *softmax = softmax_columns_pick();
    cap_block_fn *capf = cap_block_pick();
#pragma omp parallel for schedule(dynamic, 1)
    for (int bh = 0; bh < B * H; bh++) {
        int b = bh / H, h = bh % H, kvh = h / group;
        const float *qb = q + (size_t)b * T * qw + (size_t)h * hd;
        const float *kb = k + (size_t)b * T * kw + (size_t)kvh * hd;
        const float *vb = v + (size_t)b * T * kw + (size_t)kvh * hd;
        float *Pt = probs + (size_t)bh * T * T;
        const int *lob = lo ? lo + (size_t)b * T : NULL;
        scores(Pt, kb, qb, kw, qw, T, hd, scale, cap, 0, lob, capf);
        softmax(Pt, T, lob);
        const float *PV = Pt;
        if (p > 0.0f) {
            float *D = scratch + (size_t)omp_get_thread_num() * T * T;
            drop_probs(D, Pt, T, key, (uint64_t)bh, p);
            PV = D;
        }
        /* out = P V = Pt^T V */
        float *ob = out + (size_t)b * T * ow + (size_t)h * hd;
        for (int t0 = 0; t0 < T; t0 += QB) {
            int t1 = t0 + QB < T ? t0 + QB : T, j0 = block_first(lob, t0, t1);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t1 - t0, hd, t1 - j0, 1.0f,
                        PV + (size_t)j0 * T + t0, T, vb + (size_t)j0 * kw, kw, 0.0f,
                        ob + (size_t)t0 * ow, ow);
        }
    }
}

void k_attention_fwd(float *out, float *probs, const float *q, const float *k, const float *v,
                     int ldq, int ldkv, int B, int T, int H, int KVH, int hd, float scale,
                     float cap, const int *lo, float p, uint64_t key, float *scratch) {
    attention_fwd(out, probs, q, k, v, ldq, ldkv, B, T, H, KVH, hd, scale, cap, lo, p, key,
                  scratch);
}

/* Softmax backward for columns [t0, t0 + w) of dPt (queries), over their visible rows (keys) from
 * j0 (the products computed no row before it): dS = P * (dP - sum_keys(P * dP)) * scale, masked
 * entries zero; times the soft cap's derivative F (same layout; NULL: no cap). */
K_INLINE void softmax_bwd_columns(float *dPt, const float *Pt, const float *F, int T, int t0, int w,
                                  int j0, float scale) {
    int t1 = t0 + w;
    float dot[QB];
    for (int i = 0; i < w; i++) dot[i] = 0.0f;
    for (int j = 0; j < j0; j++) memset(dPt + (size_t)j * T + t0, 0, (size_t)w * sizeof(float));
    /* Full-width loops selecting by the mask, as in softmax_columns. */
    for (int j = j0; j < t1; j++) {
        const float *pr = Pt + (size_t)j * T + t0, *dr = dPt + (size_t)j * T + t0;
        int i0 = j - t0;
#pragma omp simd
        for (int i = 0; i < w; i++) dot[i] += i >= i0 ? pr[i] * dr[i] : 0.0f;
    }
    for (int j = j0; j < t1; j++) {
        const float *pr = Pt + (size_t)j * T + t0;
        float *dr = dPt + (size_t)j * T + t0;
        int i0 = j - t0;
#pragma omp simd
        for (int i = 0; i < w; i++) dr[i] = i >= i0 ? pr[i] * (dr[i] - dot[i]) * scale : 0.0f;
        if (F) {
            const float *fr = F + (size_t)j * T + t0;
#pragma omp simd
            for (int i = 0; i < w; i++) dr[i] *= i >= i0 ? fr[i] : 0.0f;
        }
    }
    for (int j = t1; j < T; j++) memset(dPt + (size_t)j * T + t0, 0, (size_t)w * sizeof(float));
}

/* Softmax backward for every query, QB columns at a time as in the forward. */
K_INLINE void softmax_bwd(float *dPt, const float *Pt, const float *F, int T, const int *lo,
                          float scale) {
    for (int t0 = 0; t0 < T; t0 += QB) {
        int t1 = t0 + QB < T ? t0 + QB : T;
        softmax_bwd_columns(dPt, Pt, F, T, t0, t1 - t0, block_first(lo, t0, t1), scale);
    }
}
K_VERSIONS(softmax_bwd,
           (float *dPt, const float *Pt, const float *F, int T, const int *lo, float scale),
           (dPt, Pt, F, T, lo, scale))

/* dPt (keys by queries) times the dropout mask of the probabilities (index base + t*T + j). */
static void undrop_grads(float *dPt, int T, uint64_t key, uint64_t base, float p) {
    for (int j = 0; j < T; j++)
        for (int t = j; t < T; t++)
            dPt[(size_t)j * T + t] *= k_dropout_keep(key, base + (size_t)t * T + j, p);
}

static void attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q,
                          const float *k, const float *v, int ldq, int ldkv, const float *probs,
                          int B, int T, int H, int KVH, int hd, float scale, float cap,
                          const int *lo, float p, uint64_t key, float *scratch) {
    int qw = ldq, kw = ldkv, ow = H * hd, group = H / KVH;
    size_t TT = (size_t)T * T, per = k_attention_scratch_floats(T, p, cap, 1);
    softmax_bwd_fn *softmax = softmax_bwd_pick();
    cap_block_fn *capf = cap_block_pick();
    /* Tasks own one (batch, kv head): the query heads sharing it accumulate dK, dV serially, so
     * no two threads write the same rows. */
#pragma omp parallel for schedule(dynamic, 1)
    for (int bk = 0; bk < B * KVH; bk++) {
        int b = bk / KVH, kvh = bk % KVH;
        float *dPt = scratch + (size_t)omp_get_thread_num() * per;
        float *D = dPt + TT; /* dropped probabilities, when p > 0 */
        /* the soft cap's derivative at each score, computed again from q and k (cap > 0) */
        float *F = cap > 0.0f ? D + (p > 0.0f ? TT : 0) : NULL;
        const float *kb = k + (size_t)b * T * kw + (size_t)kvh * hd;
        const float *vb = v + (size_t)b * T * kw + (size_t)kvh * hd;
        float *dkb = dk + (size_t)b * T * kw + (size_t)kvh * hd;
        float *dvb = dv + (size_t)b * T * kw + (size_t)kvh * hd;
        const int *lob = lo ? lo + (size_t)b * T : NULL;
        for (int t = 0; t < T; t++) {
            memset(dkb + (size_t)t * kw, 0, (size_t)hd * sizeof(float));
            memset(dvb + (size_t)t * kw, 0, (size_t)hd * sizeof(float));
        }
        for (int h = kvh * group; h < (kvh + 1) * group; h++) {
            size_t bh = (size_t)b * H + h;
            const float *Pt = probs + bh * TT;
            const float *dO = dout + (size_t)b * T * ow + (size_t)h * hd;
            const float *qb = q + (size_t)b * T * qw + (size_t)h * hd;
            float *dqb = dq + (size_t)b * T * qw + (size_t)h * hd;
            const float *PV = Pt;
            if (p > 0.0f) {
                drop_probs(D, Pt, T, key, bh, p);
                PV = D;
            }
            /* dV += Pd^T dO = Ptd dO; dPt = V dO^T (the gradient at the dropped probabilities) */
            for (int t0 = 0; t0 < T; t0 += QB) {
                int t1 = t0 + QB < T ? t0 + QB : T, j0 = block_first(lob, t0, t1);
                const float *dOt = dO + (size_t)t0 * ow;
                size_t r0 = (size_t)j0 * T + t0;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, t1 - j0, hd, t1 - t0, 1.0f,
                            PV + r0, T, dOt, ow, 1.0f, dvb + (size_t)j0 * kw, kw);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t1 - j0, t1 - t0, hd, 1.0f,
                            vb + (size_t)j0 * kw, kw, dOt, ow, 0.0f, dPt + r0, T);
            }
            /* Softmax backward per query (column): dS = P * (dP - sum_keys(P * dP)), scaled, where
             * dP is the gradient at the undropped probabilities (dPd times the mask). */
            if (p > 0.0f) undrop_grads(dPt, T, key, bh * TT, p);
            if (F) scores(F, kb, qb, kw, qw, T, hd, scale, cap, 1, lob, capf);
            softmax(dPt, Pt, F, T, lob, scale);
            /* dQ = dS K = dSt^T K; dK += dS^T Q = dSt Q */
            for (int t0 = 0; t0 < T; t0 += QB) {
                int t1 = t0 + QB < T ? t0 + QB : T, j0 = block_first(lob, t0, t1);
                size_t r0 = (size_t)j0 * T + t0;
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t1 - t0, hd, t1 - j0, 1.0f,
                            dPt + r0, T, kb + (size_t)j0 * kw, kw, 0.0f, dqb + (size_t)t0 * qw, qw);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, t1 - j0, hd, t1 - t0, 1.0f,
                            dPt + r0, T, qb + (size_t)t0 * qw, qw, 1.0f, dkb + (size_t)j0 * kw, kw);
            }
        }
    }
}

void k_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q,
                     const float *k, const float *v, int ldq, int ldkv, const float *probs, int B,
                     int T, int H, int KVH, int hd, float scale, float cap, const int *lo, float p,
                     uint64_t key, float *scratch) {
    attention_bwd(dq, dk, dv, dout, q, k, v, ldq, ldkv, probs, B, T, H, KVH, hd, scale, cap, lo, p,
                  key, scratch);
}

size_t k_attention_scratch_floats(int T, float p, float cap, int threads) {
    /* Per thread: the backward's dPt block, plus the dropped probabilities with dropout (the
     * forward needs only those), plus the soft cap's derivatives with a cap. */
    size_t tt = (size_t)T * (size_t)T;
    return (size_t)threads * tt * (1 + (p > 0.0f) + (cap > 0.0f));
}
