#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "fastmath.h"
#include "kernels.h"

/* Causal attention over one (batch, head) per task: sgemm inside runs single-threaded (OpenBLAS
 * detects the enclosing OpenMP region), so heads scale across cores without oversubscription.
 * With p > 0 the probabilities are dropped out into per-thread scratch for the P.V product, while
 * probs keeps them undropped for the softmax backward. */
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
        float *P = probs + (size_t)bh * T * T;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hd, scale, qb, qw, kb, kw, 0.0f,
                    P, T);
        for (int t = 0; t < T; t++) {
            float *row = P + (size_t)t * T;
            float mx = row[0];
#pragma omp simd reduction(max : mx)
            for (int j = 1; j <= t; j++) mx = row[j] > mx ? row[j] : mx;
            float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
            for (int j = 0; j <= t; j++) {
                row[j] = tlm_expf(row[j] - mx);
                sum += row[j];
            }
            float inv = 1.0f / sum;
            for (int j = 0; j <= t; j++) row[j] *= inv;
            for (int j = t + 1; j < T; j++) row[j] = 0.0f;
        }
        const float *PV = P;
        if (p > 0.0f) {
            float *D = scratch + (size_t)omp_get_thread_num() * T * T;
            uint64_t base = (uint64_t)bh * T * T;
            for (size_t i = 0; i < (size_t)T * T; i++)
                D[i] = P[i] * k_dropout_keep(key, base + i, p);
            PV = D;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hd, T, 1.0f, PV, T, vb, kw, 0.0f,
                    out + (size_t)b * T * ow + (size_t)h * hd, ow);
    }
}

void k_attention_fwd(float *out, float *probs, const float *q, const float *k, const float *v,
                     int ldq, int ldkv, int B, int T, int H, int KVH, int hd, float p, uint64_t key,
                     float *scratch) {
    attention_fwd(out, probs, q, k, v, ldq, ldkv, B, T, H, KVH, hd, p, key, scratch);
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
        float *dP = scratch + (size_t)omp_get_thread_num() * (p > 0.0f ? 2 : 1) * TT;
        float *D = dP + TT; /* dropped probabilities, when p > 0 */
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
            const float *P = probs + bh * TT;
            const float *dO = dout + (size_t)b * T * ow + (size_t)h * hd;
            const float *qb = q + (size_t)b * T * qw + (size_t)h * hd;
            float *dqb = dq + (size_t)b * T * qw + (size_t)h * hd;
            const float *PV = P;
            if (p > 0.0f) {
                for (size_t i = 0; i < TT; i++) D[i] = P[i] * k_dropout_keep(key, bh * TT + i, p);
                PV = D;
            }
            /* dV += Pd^T dO; dPd = dO V^T */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hd, T, 1.0f, PV, T, dO, ow,
                        1.0f, dvb, kw);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hd, 1.0f, dO, ow, vb, kw,
                        0.0f, dP, T);
            /* Softmax backward row by row: dS = P * (dP - sum(P * dP)), scaled, where dP is the
             * gradient at the undropped probabilities (dPd times the mask). */
            for (int t = 0; t < T; t++) {
                const float *pr = P + (size_t)t * T;
                float *dr = dP + (size_t)t * T;
                if (p > 0.0f)
                    for (int j = 0; j <= t; j++)
                        dr[j] *= k_dropout_keep(key, bh * TT + (size_t)t * T + j, p);
                float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                for (int j = 0; j <= t; j++) dot += pr[j] * dr[j];
                for (int j = 0; j <= t; j++) dr[j] = pr[j] * (dr[j] - dot) * scale;
                for (int j = t + 1; j < T; j++) dr[j] = 0.0f;
            }
            /* dQ = dS K; dK += dS^T Q */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hd, T, 1.0f, dP, T, kb, kw,
                        0.0f, dqb, qw);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hd, T, 1.0f, dP, T, qb, qw,
                        1.0f, dkb, kw);
        }
    }
}

void k_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q,
                     const float *k, const float *v, int ldq, int ldkv, const float *probs, int B,
                     int T, int H, int KVH, int hd, float p, uint64_t key, float *scratch) {
    attention_bwd(dq, dk, dv, dout, q, k, v, ldq, ldkv, probs, B, T, H, KVH, hd, p, key, scratch);
}
