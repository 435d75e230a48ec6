#include <cblas.h>
#include <math.h>

#include "kernels.h"

void k_attention_fwd(float *out, float *probs, const float *q, const float *k, const float *v,
                     int B, int T, int H, int KVH, int hd) {
    int qw = H * hd, kw = KVH * hd, group = H / KVH;
    float scale = 1.0f / sqrtf((float)hd);
    /* One (batch, head) per task: sgemm inside runs single-threaded (OpenBLAS detects the
     * enclosing OpenMP region), so heads scale across cores without oversubscription. */
#pragma omp parallel for schedule(dynamic, 1)
    for (int bh = 0; bh < B * H; bh++) {
        int b = bh / H, h = bh % H, kvh = h / group;
        const float *qb = q + (size_t)b * T * qw + (size_t)h * hd;
        const float *kb = k + (size_t)b * T * kw + (size_t)kvh * hd;
        const float *vb = v + (size_t)b * T * kw + (size_t)kvh * hd;
        float *p = probs + (size_t)bh * T * T;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hd, scale, qb, qw, kb, kw, 0.0f,
                    p, T);
        for (int t = 0; t < T; t++) {
            float *row = p + (size_t)t * T;
            float mx = row[0];
            for (int j = 1; j <= t; j++) mx = row[j] > mx ? row[j] : mx;
            float sum = 0.0f;
            for (int j = 0; j <= t; j++) {
                row[j] = expf(row[j] - mx);
                sum += row[j];
            }
            float inv = 1.0f / sum;
            for (int j = 0; j <= t; j++) row[j] *= inv;
            for (int j = t + 1; j < T; j++) row[j] = 0.0f;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hd, T, 1.0f, p, T, vb, kw, 0.0f,
                    out + (size_t)b * T * qw + (size_t)h * hd, qw);
    }
}
