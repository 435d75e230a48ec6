#include <math.h>

#include "kernels.h"

void k_rmsnorm_fwd(float *y, float *rstd, const float *x, const float *g, int N, int d, float eps) {
#pragma omp parallel for schedule(static) if ((long)N * d >= K_PAR_MIN)
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
#pragma omp parallel for schedule(static) if ((long)N * d >= K_PAR_MIN)
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

/* Gain (and bias) gradients are column sums over rows, taken in blocks of up to 256 columns:
 * each block sweeps the rows in order (deterministic, no per-thread buffers) along contiguous
 * row segments with its sums in L1. Strips of 16 columns down the rows, used before, kept their
 * sums in a chain of stores and loads and read the rows 64 bytes at a time: 2-3x slower. */
enum { GAIN_BLOCK = 256 };
static void gain_grads(float *dg, float *db, const float *dy, const float *x, const float *mean,
                       const float *rstd, int N, int d, int acc) {
    int blocks = (d + GAIN_BLOCK - 1) / GAIN_BLOCK;
#pragma omp parallel for schedule(static) if ((long)N * d >= K_PAR_MIN)
    for (int bl = 0; bl < blocks; bl++) {
        int j0 = bl * GAIN_BLOCK, w = j0 + GAIN_BLOCK < d ? GAIN_BLOCK : d - j0;
        float ag[GAIN_BLOCK], ab[GAIN_BLOCK];
        for (int k = 0; k < w; k++) ag[k] = ab[k] = 0.0f;
        for (int i = 0; i < N; i++) {
            const float *dyi = dy + (size_t)i * d + j0, *xi = x + (size_t)i * d + j0;
            float m = mean ? mean[i] : 0.0f, r = rstd[i];
#pragma omp simd
            for (int k = 0; k < w; k++) {
                ag[k] += dyi[k] * (xi[k] - m) * r;
                ab[k] += dyi[k];
            }
        }
        for (int k = 0; k < w; k++) {
            dg[j0 + k] = (acc ? dg[j0 + k] : 0.0f) + ag[k];
            if (db) db[j0 + k] = (acc ? db[j0 + k] : 0.0f) + ab[k];
        }
    }
}

void k_rmsnorm_bwd(float *dx, float *dg, const float *dy, const float *x, const float *g,
                   const float *rstd, int N, int d, int acc) {
    gain_grads(dg, NULL, dy, x, NULL, rstd, N, d, acc);
#pragma omp parallel for schedule(static) if ((long)N * d >= K_PAR_MIN)
    for (int i = 0; i < N; i++) {
        const float *dyi = dy + (size_t)i * d, *xi = x + (size_t)i * d;
        float *dxi = dx + (size_t)i * d;
        float r = rstd[i], dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int j = 0; j < d; j++) dot += dyi[j] * g[j] * xi[j];
        /* d/dx of x*r: r*dy*g - x * r^3 * mean(dy*g*x) */
        float c = dot * r * r * r / (float)d;
        for (int j = 0; j < d; j++) dxi[j] = r * dyi[j] * g[j] - xi[j] * c;
    }
}

void k_layernorm_bwd(float *dx, float *dg, float *db, const float *dy, const float *x,
                     const float *g, const float *mean, const float *rstd, int N, int d, int acc) {
    gain_grads(dg, db, dy, x, mean, rstd, N, d, acc);
#pragma omp parallel for schedule(static) if ((long)N * d >= K_PAR_MIN)
    for (int i = 0; i < N; i++) {
        const float *dyi = dy + (size_t)i * d, *xi = x + (size_t)i * d;
        float *dxi = dx + (size_t)i * d;
        float m = mean[i], r = rstd[i], s1 = 0.0f, s2 = 0.0f;
#pragma omp simd reduction(+ : s1, s2)
        for (int j = 0; j < d; j++) {
            float dxh = dyi[j] * g[j];
            s1 += dxh;
            s2 += dxh * (xi[j] - m) * r;
        }
        s1 /= (float)d;
        s2 /= (float)d;
        for (int j = 0; j < d; j++) {
            float xh = (xi[j] - m) * r;
            dxi[j] = r * (dyi[j] * g[j] - s1 - xh * s2);
        }
    }
}
