#include <math.h>
#include <string.h>

#include "fastmath.h"
#include "kernels.h"

/* log-sum-exp with the max subtracted first, so exp never sees a large argument. */
static float row_lse(const float *x, int V) {
    float mx = x[0];
    for (int j = 1; j < V; j++) mx = x[j] > mx ? x[j] : mx;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int j = 0; j < V; j++) s += tlm_expf(x[j] - mx);
    return mx + logf(s);
}

double k_cross_entropy_fwd(const float *logits, const int *targets, float *probs, int N, int V,
                           int *count) {
    double total = 0.0;
    int n = 0;
#pragma omp parallel for schedule(static) reduction(+ : total, n)
    for (int i = 0; i < N; i++) {
        const float *x = logits + (size_t)i * V;
        float lse = row_lse(x, V);
        if (probs) {
            float *p = probs + (size_t)i * V;
            for (int j = 0; j < V; j++) p[j] = tlm_expf(x[j] - lse);
        }
        if (targets && targets[i] >= 0) {
            total += (double)(lse - x[targets[i]]);
            n++;
        }
    }
    if (count) *count = n;
    return n ? total / n : NAN;
}

double k_cross_entropy_fwd_bwd(float *logits, const int *targets, int N, int V, int divisor,
                               int *count) {
    int n = 0;
    for (int i = 0; i < N; i++) n += targets[i] >= 0;
    double total = 0.0;
    if (divisor <= 0) divisor = n;
    float inv = divisor ? 1.0f / (float)divisor : 0.0f;
#pragma omp parallel for schedule(static) reduction(+ : total)
    for (int i = 0; i < N; i++) {
        float *x = logits + (size_t)i * V;
        if (targets[i] < 0) {
            memset(x, 0, (size_t)V * sizeof(float));
            continue;
        }
        float lse = row_lse(x, V);
        total += (double)(lse - x[targets[i]]);
        for (int j = 0; j < V; j++) x[j] = tlm_expf(x[j] - lse) * inv;
        x[targets[i]] -= inv;
    }
    if (count) *count = n;
    return n ? total / n : NAN;
}
