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
 * Key j is visible to queries t >= j: the valid part of row j is its suffix [j, T).
 *
 * With p > 0 the probabilities are dropped out into per-thread scratch for the P.V product, while
 * probs keeps them undropped for the softmax backward. The mask index of (query t, key j) is
 * t*T + j within the head's block.
 *
 * Every product runs per block of QB queries [t0, t1): those see keys [0, t1) only, so the
 * blocks of scores that are masked whole (keys t1.. for queries below t1) are never computed
 * (about 3/8 of the products' work at T 256, half at long contexts) nor read. */
enum { QB = 64 };

/* Columns are taken QB at a time so that their running max and sum are small fixed arrays: this
 * runs on OpenMP workers, whose stacks (OMP_STACKSIZE) are too small for anything sized by T.
 * Every column still reduces over its rows in the same order as a whole-width pass would.
 * The loops run over the block's full width and select by the mask: loops that start at each
 * row's first visible query left most of the work to scalar peel and tail code (the rows near
 * the diagonal are short), the softmax then taking 23% of a bf16 attention at T 64. The masked
 * scores they read were computed by the products (every row below t1 is), so they are finite. */
static void softmax_columns(float *Pt, int T, uint16_t *Pb) {
    for (int t0 = 0; t0 < T; t0 += QB) {
        int w = t0 + QB < T ? QB : T - t0, t1 = t0 + w;
        float mx[QB], sum[QB];
        memcpy(mx, Pt + t0, (size_t)w * sizeof(float)); /* key 0 is visible to every query */
        for (int j = 1; j < t1; j++) {
            const float *row = Pt + (size_t)j * T + t0;
            int i0 = j - t0; /* queries before key j are masked */
#pragma omp simd
            for (int i = 0; i < w; i++) mx[i] = i >= i0 && row[i] > mx[i] ? row[i] : mx[i];
        }
        for (int i = 0; i < w; i++) sum[i] = 0.0f;
        for (int j = 0; j < t1; j++) {
            float *row = Pt + (size_t)j * T + t0;
            int i0 = j - t0;
#pragma omp simd
            for (int i = 0; i < w; i++) {
                float e = i >= i0 ? tlm_expf(row[i] - mx[i]) : 0.0f;
                row[i] = e;
                sum[i] += e;
            }
        }
        for (int j = t1; j < T; j++) memset(Pt + (size_t)j * T + t0, 0, (size_t)w * sizeof(float));
        for (int i = 0; i < w; i++) sum[i] = 1.0f / sum[i];
        for (int j = 0; j < t1; j++) {
            float *row = Pt + (size_t)j * T + t0;
#pragma omp simd
            for (int i = 0; i < w; i++) row[i] *= sum[i];
            if (Pb) { /* the rows the bf16 products read, masked zeros included */
                uint16_t *prow = Pb + (size_t)j * T + t0;
#pragma omp simd
                for (int i = 0; i < w; i++) prow[i] = tlm_bf16_bits(row[i]);
            }
        }
    }
}

/* D = Pt with the dropout mask of head block bh applied (index t*T + j for query t, key j). */
static void drop_probs(float *D, const float *Pt, int T, uint64_t key, uint64_t bh, float p) {
    uint64_t base = bh * (uint64_t)T * (uint64_t)T;
    for (int j = 0; j < T; j++)
        for (int t = 0; t < T; t++)
            D[(size_t)j * T + t] =
                Pt[(size_t)j * T + t] * k_dropout_keep(key, base + (size_t)t * T + j, p);
}

static void attention_fwd(float *out, float *probs, const float *q, const float *k, const float *v,
                          int ldq, int ldkv, int B, int T, int H, int KVH, int hd, float p,
                          uint64_t key, float *scratch) {
    int qw = ldq, kw = ldkv, ow = H * hd, group = H / KVH;
    float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel for schedule(dynamic, 1)
    for (int bh = 0; bh < B * H; bh++) {
        int b = bh / H, h = bh % H, kvh = h / group;
        const float *qb = q + (size_t)b * T * qw + (size_t)h * hd;
        const float *kb = k + (size_t)b * T * kw + (size_t)kvh * hd;
        const float *vb = v + (size_t)b * T * kw + (size_t)kvh * hd;
        float *Pt = probs + (size_t)bh * T * T;
        /* Pt = scale * K Q^T */
        for (int t0 = 0; t0 < T; t0 += QB) {
            int t1 = t0 + QB < T ? t0 + QB : T;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t1, t1 - t0, hd, scale, kb, kw,
                        qb + (size_t)t0 * qw, qw, 0.0f, Pt + t0, T);
        }
        softmax_columns(Pt, T, NULL);
        const float *PV = Pt;
        if (p > 0.0f) {
            float *D = scratch + (size_t)omp_get_thread_num() * T * T;
            drop_probs(D, Pt, T, key, (uint64_t)bh, p);
            PV = D;
        }
        /* out = P V = Pt^T V */
        float *ob = out + (size_t)b * T * ow + (size_t)h * hd;
        for (int t0 = 0; t0 < T; t0 += QB) {
            int t1 = t0 + QB < T ? t0 + QB : T;
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t1 - t0, hd, t1, 1.0f, PV + t0, T,
                        vb, kw, 0.0f, ob + (size_t)t0 * ow, ow);
        }
    }
}

void k_attention_fwd(float *out, float *probs, const float *q, const float *k, const float *v,
                     int ldq, int ldkv, int B, int T, int H, int KVH, int hd, float p, uint64_t key,
                     float *scratch) {
    attention_fwd(out, probs, q, k, v, ldq, ldkv, B, T, H, KVH, hd, p, key, scratch);
}

/* Softmax backward for columns [t0, t0 + w) of dPt (queries), over their visible rows (keys):
 * dS = P * (dP - sum_keys(P * dP)) * scale, masked entries zero. */
static void softmax_bwd_columns(float *dPt, const float *Pt, int T, int t0, int w, float scale,
                                uint16_t *dSb) {
    int t1 = t0 + w;
    float dot[QB];
    for (int i = 0; i < w; i++) dot[i] = 0.0f;
    /* Full-width loops selecting by the mask, as in softmax_columns. */
    for (int j = 0; j < t1; j++) {
        const float *pr = Pt + (size_t)j * T + t0, *dr = dPt + (size_t)j * T + t0;
        int i0 = j - t0;
#pragma omp simd
        for (int i = 0; i < w; i++) dot[i] += i >= i0 ? pr[i] * dr[i] : 0.0f;
    }
    if (dSb) { /* rounded only, the rows the bf16 products read */
        for (int j = 0; j < t1; j++) {
            const float *pr = Pt + (size_t)j * T + t0, *dr = dPt + (size_t)j * T + t0;
            uint16_t *sr = dSb + (size_t)j * T + t0;
            int i0 = j - t0;
#pragma omp simd
            for (int i = 0; i < w; i++)
                sr[i] = i >= i0 ? tlm_bf16_bits(pr[i] * (dr[i] - dot[i]) * scale) : 0;
        }
        return;
    }
    for (int j = 0; j < t1; j++) {
        const float *pr = Pt + (size_t)j * T + t0;
        float *dr = dPt + (size_t)j * T + t0;
        int i0 = j - t0;
#pragma omp simd
        for (int i = 0; i < w; i++) dr[i] = i >= i0 ? pr[i] * (dr[i] - dot[i]) * scale : 0.0f;
    }
    for (int j = t1; j < T; j++) memset(dPt + (size_t)j * T + t0, 0, (size_t)w * sizeof(float));
}

static void attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q,
                          const float *k, const float *v, int ldq, int ldkv, const float *probs,
                          int B, int T, int H, int KVH, int hd, float p, uint64_t key,
                          float *scratch) {
    int qw = ldq, kw = ldkv, ow = H * hd, group = H / KVH;
    float scale = 1.0f / sqrtf((float)hd);
    size_t TT = (size_t)T * T;
    /* Tasks own one (batch, kv head): the query heads sharing it accumulate dK, dV serially, so
     * no two threads write the same rows. */
#pragma omp parallel for schedule(dynamic, 1)
    for (int bk = 0; bk < B * KVH; bk++) {
        int b = bk / KVH, kvh = bk % KVH;
        float *dPt = scratch + (size_t)omp_get_thread_num() * (p > 0.0f ? 2 : 1) * TT;
        float *D = dPt + TT; /* dropped probabilities, when p > 0 */
        const float *kb = k + (size_t)b * T * kw + (size_t)kvh * hd;
        const float *vb = v + (size_t)b * T * kw + (size_t)kvh * hd;
        float *dkb = dk + (size_t)b * T * kw + (size_t)kvh * hd;
        float *dvb = dv + (size_t)b * T * kw + (size_t)kvh * hd;
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
                int t1 = t0 + QB < T ? t0 + QB : T;
                const float *dOt = dO + (size_t)t0 * ow;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, t1, hd, t1 - t0, 1.0f,
                            PV + t0, T, dOt, ow, 1.0f, dvb, kw);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t1, t1 - t0, hd, 1.0f, vb, kw,
                            dOt, ow, 0.0f, dPt + t0, T);
            }
            /* Softmax backward per query (column): dS = P * (dP - sum_keys(P * dP)), scaled, where
             * dP is the gradient at the undropped probabilities (dPd times the mask). */
            if (p > 0.0f)
                for (int j = 0; j < T; j++)
                    for (int t = j; t < T; t++)
                        dPt[(size_t)j * T + t] *=
                            k_dropout_keep(key, bh * TT + (size_t)t * T + j, p);
            for (int t0 = 0; t0 < T; t0 += QB) /* QB columns at a time, as in the forward */
                softmax_bwd_columns(dPt, Pt, T, t0, t0 + QB < T ? QB : T - t0, scale, NULL);
            /* dQ = dS K = dSt^T K; dK += dS^T Q = dSt Q */
            for (int t0 = 0; t0 < T; t0 += QB) {
                int t1 = t0 + QB < T ? t0 + QB : T;
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t1 - t0, hd, t1, 1.0f,
                            dPt + t0, T, kb, kw, 0.0f, dqb + (size_t)t0 * qw, qw);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, t1, hd, t1 - t0, 1.0f,
                            dPt + t0, T, qb + (size_t)t0 * qw, qw, 1.0f, dkb, kw);
            }
        }
    }
}

void k_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q,
                     const float *k, const float *v, int ldq, int ldkv, const float *probs, int B,
                     int T, int H, int KVH, int hd, float p, uint64_t key, float *scratch) {
    attention_bwd(dq, dk, dv, dout, q, k, v, ldq, ldkv, probs, B, T, H, KVH, hd, p, key, scratch);
}

size_t k_attention_scratch_floats(int T, float p, int threads) {
    /* Per thread: the backward's dPt block, plus the dropped probabilities with dropout (the
     * forward needs only those). */
    size_t tt = (size_t)T * (size_t)T;
    return (size_t)threads * tt * (p > 0.0f ? 2 : 1);
}

/* ---- bf16 products (mixed precision) -------------------------------------------------------- */

/* The same attention with its products on bf16 operands, each one oneDNN call over every
 * (sequence, head) per block of queries: one sgemm per head and block was 13% of a bf16 training
 * step of the Shakespeare recipe. q, k, v and dout are rounded into head-major blocks (every head's
 * rows contiguous), the layout oneDNN's brgemm kernels take: read in place from the fused rows,
 * oneDNN falls back to its slower gemm kernels (1.7x the time at the recipe's shapes). Softmaxes
 * and their gradients stay fp32 (probs is kept in fp32); the probabilities and their gradients are
 * rounded for the products, as PyTorch's autocast does. Blocks whose queries cannot see their
 * keys are skipped as in the fp32 kernels. */

/* The layouts of the rounded copies the forward keeps for the backward (k_bf16_keep): q|k|v in
 * head-major blocks, the probabilities as probs holds them. */
enum { K_ATT_QKV = 1, K_ATT_PROBS = 2 };
/* The k_bf16_scratch slots used here: rounded q|k|v, rounded P (then dS), rounded dO, dP in fp32,
 * dq|dk|dv head-major. */
enum { S_QKV = 2, S_P, S_DO, S_DP, S_GRAD };

/* Rows [r0, r0 + n) of every head of head-major blocks [B, H, T, hd]: [B, H, n, hd], or its
 * transpose. */
static k_bf16_arr head_rows(const uint16_t *p, int B, int H, int T, int hd, int r0, int n,
                            int transposed) {
    int64_t hs = (int64_t)T * hd;
    k_bf16_arr a = {p + (size_t)r0 * hd, {B, H, n, hd}, {H * hs, hs, hd, 1}};
    if (transposed) a = (k_bf16_arr){a.p, {B, H, hd, n}, {H * hs, hs, 1, hd}};
    return a;
}

/* Keys [0, j1) by queries [t0, t0 + w) of every head's T x T block (keys by queries), or its
 * transpose. */
static k_bf16_arr square(const uint16_t *p, int B, int H, int T, int j1, int t0, int w,
                         int transposed) {
    int64_t TT = (int64_t)T * T;
    k_bf16_arr a = {p + t0, {B, H, j1, w}, {H * TT, TT, T, 1}};
    if (transposed) a = (k_bf16_arr){a.p, {B, H, w, j1}, {H * TT, TT, 1, T}};
    return a;
}

static int attention_fwd_bf16(k_bf16 *k, float *out, float *probs, const float *qkv, int ld, int B,
                              int T, int H, int hd) {
    size_t TT = (size_t)T * T, part = (size_t)B * H * T * hd;
    /* Rounded copies kept for the backward (made again there when they could not be kept). */
    uint16_t *xb = k_bf16_keep(k, qkv, 3 * part, K_ATT_QKV);
    uint16_t *pb = k_bf16_keep(k, probs, B * H * TT, K_ATT_PROBS);
    if (!xb) xb = k_bf16_scratch(k, S_QKV, 3 * part * 2);
    if (!pb) pb = k_bf16_scratch(k, S_P, B * H * TT * 2);
    if (!xb || !pb) return 0;
    const uint16_t *qb = xb, *kb = xb + part, *vb = xb + 2 * part;
    int ow = H * hd;
    float scale = 1.0f / sqrtf((float)hd);
    int64_t sq_s[4] = {(int64_t)H * TT, (int64_t)TT, T, 1}, out_s[4] = {(int64_t)T * ow, hd, ow, 1};
    k_f32_to_bf16_heads(xb, qkv, ld, B, T, 3, H, hd);
    /* Pt = scale * K Q^T */
    for (int t0 = 0; t0 < T; t0 += QB) {
        int t1 = t0 + QB < T ? t0 + QB : T;
        k_bf16_arr a = head_rows(kb, B, H, T, hd, 0, t1, 0);
        k_bf16_arr b = head_rows(qb, B, H, T, hd, t0, t1 - t0, 1);
        if (!k_bf16_batched(k, &a, &b, probs + t0, sq_s, scale, 0)) return 0;
    }
#pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * H; bh++)
        softmax_columns(probs + (size_t)bh * TT, T, pb + (size_t)bh * TT);
    /* out = P V = Pt^T V, written straight into out's rows */
    for (int t0 = 0; t0 < T; t0 += QB) {
        int t1 = t0 + QB < T ? t0 + QB : T;
        k_bf16_arr a = square(pb, B, H, T, t1, t0, t1 - t0, 1);
        k_bf16_arr b = head_rows(vb, B, H, T, hd, 0, t1, 0);
        if (!k_bf16_batched(k, &a, &b, out + (size_t)t0 * ow, out_s, 1.0f, 0)) return 0;
    }
    return 1;
}

int k_bf16_attention_fwd(k_bf16 *k, float *out, float *probs, const float *qkv, int ld, int B,
                         int T, int H, int KVH, int hd, float p) {
    /* Grouped kv heads would need the backward's dK, dV summed over the group's heads, which a
     * batched product cannot do; dropout's masks are applied per head. Both run in fp32. */
    if (!k || p > 0.0f || KVH != H) return 0;
    if (attention_fwd_bf16(k, out, probs, qkv, ld, B, T, H, hd)) return 1;
    /* The fp32 kernels redo it: copies this left half made must not reach the backward. */
    size_t part = (size_t)B * H * T * hd;
    k_bf16_forget(k, qkv, 3 * part, K_ATT_QKV);
    k_bf16_forget(k, probs, (size_t)B * H * T * T, K_ATT_PROBS);
    return 0;
}

int k_bf16_attention_bwd(k_bf16 *k, float *dqkv, const float *dout, const float *qkv, int ld,
                         const float *probs, int B, int T, int H, int KVH, int hd, float p) {
    if (!k || p > 0.0f || KVH != H) return 0;
    size_t TT = (size_t)T * T, hs = (size_t)T * hd, part = (size_t)B * H * hs;
    const uint16_t *xb = k_bf16_kept(k, qkv, 3 * part, K_ATT_QKV);
    const uint16_t *pb = k_bf16_kept(k, probs, B * H * TT, K_ATT_PROBS);
    uint16_t *sb = k_bf16_scratch(k, S_P, B * H * TT * 2), *ob = k_bf16_scratch(k, S_DO, part * 2);
    float *dPt = k_bf16_scratch(k, S_DP, B * H * TT * sizeof(float));
    /* dq, dk, dv head-major: oneDNN writes rows ld apart only with its slower kernels */
    float *g = k_bf16_scratch(k, S_GRAD, 3 * part * sizeof(float));
    if (!sb || !ob || !dPt || !g) return 0;
    if (!xb) {
        uint16_t *x = k_bf16_scratch(k, S_QKV, 3 * part * 2);
        if (!x) return 0;
        k_f32_to_bf16_heads(x, qkv, ld, B, T, 3, H, hd);
        xb = x;
    }
    if (!pb) { /* sb holds it until the softmax backward overwrites it with dS */
        k_f32_to_bf16(sb, probs, B * H * TT);
        pb = sb;
    }
    const uint16_t *qb = xb, *kb = xb + part, *vb = xb + 2 * part;
    float *gq = g, *gk = g + part, *gv = g + 2 * part;
    float scale = 1.0f / sqrtf((float)hd);
    int64_t sq_s[4] = {(int64_t)H * TT, (int64_t)TT, T, 1}, h_s[4] = {(int64_t)H * hs, hs, hd, 1};
    k_f32_to_bf16_heads(ob, dout, H * hd, B, T, 1, H, hd);
    /* The last block of queries sees every key: it writes dV and dK whole, the others add. */
    int last = (T - 1) / QB * QB;
    /* dV (+)= P^T dO = Pt dO; dPt = V dO^T */
    for (int t0 = last; t0 >= 0; t0 -= QB) {
        int t1 = t0 + QB < T ? t0 + QB : T, w = t1 - t0;
        k_bf16_arr a = square(pb, B, H, T, t1, t0, w, 0);
        k_bf16_arr b = head_rows(ob, B, H, T, hd, t0, w, 0);
        if (!k_bf16_batched(k, &a, &b, gv, h_s, 1.0f, t0 != last)) return 0;
        a = head_rows(vb, B, H, T, hd, 0, t1, 0);
        b = head_rows(ob, B, H, T, hd, t0, w, 1);
        if (!k_bf16_batched(k, &a, &b, dPt + t0, sq_s, 1.0f, 0)) return 0;
    }
#pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * H; bh++)
        for (int t0 = 0; t0 < T; t0 += QB)
            softmax_bwd_columns(dPt + (size_t)bh * TT, probs + (size_t)bh * TT, T, t0,
                                t0 + QB < T ? QB : T - t0, scale, sb + (size_t)bh * TT);
    /* dQ = dS K = dSt^T K; dK (+)= dS^T Q = dSt Q */
    for (int t0 = last; t0 >= 0; t0 -= QB) {
        int t1 = t0 + QB < T ? t0 + QB : T, w = t1 - t0;
        k_bf16_arr a = square(sb, B, H, T, t1, t0, w, 1);
        k_bf16_arr b = head_rows(kb, B, H, T, hd, 0, t1, 0);
        if (!k_bf16_batched(k, &a, &b, gq + (size_t)t0 * hd, h_s, 1.0f, 0)) return 0;
        a = square(sb, B, H, T, t1, t0, w, 0);
        b = head_rows(qb, B, H, T, hd, t0, w, 0);
        if (!k_bf16_batched(k, &a, &b, gk, h_s, 1.0f, t0 != last)) return 0;
    }
    /* Back into dqkv's rows: head i of part (q, k, v) of sequence b. */
    int heads = 3 * B * H;
#pragma omp parallel for schedule(static) if ((size_t)3 * part >= 4 * K_PAR_MIN)
    for (int i = 0; i < heads; i++) {
        int pt = i / (B * H), b = i / H % B, h = i % H;
        float *d = dqkv + (size_t)b * T * ld + (size_t)(pt * H + h) * hd;
        for (int t = 0; t < T; t++)
            memcpy(d + (size_t)t * ld, g + (size_t)i * hs + (size_t)t * hd,
                   (size_t)hd * sizeof(float));
    }
    return 1;
}
