#include <math.h>

#include "kernels.h"

void k_rmsnorm_fwd(float *y, float *rstd, const float *x, const float *g, int N, int d, float eps) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *xi = x + (size_t)i * d;
        float *yi = y + (size_t)i * d;
        float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
        for (int j = 0; j < d; j++) ss += xi[j] * xi[j];
        float r = 1.0f / sqrtf(ss / (float)d + eps);
        for (int j = 0; j < d; j++) yi[j] = xi[j] * r * g[j];
        if (rstd) rstd[i] = r;
    }
}

void k_layernorm_fwd(float *y, float *mean, float *rstd, const float *x, const float *g,
                     const float *b, int N, int d, float eps) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *xi = x + (size_t)i * d;
        float *yi = y + (size_t)i * d;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int j = 0; j < d; j++) s += xi[j];
        float m = s / (float)d;
        float v = 0.0f;
        /* Two passes (mean, then squared deviations) avoid the cancellation of E[x^2] - m^2. */
#pragma omp simd reduction(+ : v)
        for (int j = 0; j < d; j++) {
            float t = xi[j] - m;
            v += t * t;
        }
        float r = 1.0f / sqrtf(v / (float)d + eps);
        if (b)
            for (int j = 0; j < d; j++) yi[j] = (xi[j] - m) * r * g[j] + b[j];
        else
            for (int j = 0; j < d; j++) yi[j] = (xi[j] - m) * r * g[j];
        if (mean) mean[i] = m;
        if (rstd) rstd[i] = r;
    }
}
