#include <math.h>

#include "kernels.h"

K_INLINE void rmsnorm_row(float *yi, float *rstd, const float *xi, const float *g, int d,
                          float eps) {
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int j = 0; j < d; j++) ss += xi[j] * xi[j];
    float r = 1.0f / sqrtf(ss / (float)d + eps);
    for (int j = 0; j < d; j++) yi[j] = xi[j] * r * g[j];
    if (rstd) *rstd = r;
}

K_INLINE void rmsnorm_rows(float *y, float *rstd, const float *x, const float *g, int d, float eps,
                           long r0, long r1) {
    for (long i = r0; i < r1; i++)
        rmsnorm_row(y + (size_t)i * d, rstd ? rstd + i : NULL, x + (size_t)i * d, g, d, eps);
}
K_VERSIONS(rmsnorm_rows,
           (float *y, float *rstd, const float *x, const float *g, int d, float eps, long r0,
            long r1),
           (y, rstd, x, g, d, eps, r0, r1))

void k_rmsnorm_fwd(float *y, float *rstd, const float *x, const float *g, int N, int d, float eps) {
    rmsnorm_rows_fn *f = rmsnorm_rows_pick();
    K_RANGES(r0, r1, N, (long)N * d, f(y, rstd, x, g, d, eps, r0, r1));
}

K_INLINE void layernorm_row(float *yi, float *mean, float *rstd, const float *xi, const float *g,
                            const float *b, int d, float eps) {
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
    if (mean) *mean = m;
    if (rstd) *rstd = r;
}

K_INLINE void layernorm_rows(float *y, float *mean, float *rstd, const float *x, const float *g,
                             const float *b, int d, float eps, long r0, long r1) {
    for (long i = r0; i < r1; i++)
        layernorm_row(y + (size_t)i * d, mean ? mean + i : NULL, rstd ? rstd + i : NULL,
                      x + (size_t)i * d, g, b, d, eps);
}
K_VERSIONS(layernorm_rows,
           (float *y, float *mean, float *rstd, const float *x, const float *g, const float *b,
            int d, float eps, long r0, long r1),
           (y, mean, rstd, x, g, b, d, eps, r0, r1))

void k_layernorm_fwd(float *y, float *mean, float *rstd, const float *x, const float *g,
                     const float *b, int N, int d, float eps) {
    layernorm_rows_fn *f = layernorm_rows_pick();
    K_RANGES(r0, r1, N, (long)N * d, f(y, mean, rstd, x, g, b, d, eps, r0, r1));
}

/* Gain (and bias) gradients are column sums over rows, taken in blocks of up to 256 columns:
 * each block sweeps the rows in order (deterministic, no per-thread buffers) along contiguous
 * row segments with its sums in L1. Strips of 16 columns down the rows, used before, kept their
 * sums in a chain of stores and loads and read the rows 64 bytes at a time: a Shakespeare
 * replica's layer-norm backward took 28 us with them, 24 with these. */
enum { GAIN_BLOCK = 256 };
K_INLINE void gain_block(float *dg, float *db, const float *dy, const float *x, const float *mean,
                         const float *rstd, int N, int d, int acc, int j0) {
    int w = j0 + GAIN_BLOCK < d ? GAIN_BLOCK : d - j0;
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

/* Blocks [b0, b1). */
K_INLINE void gain_blocks(float *dg, float *db, const float *dy, const float *x, const float *mean,
                          const float *rstd, int N, int d, int acc, long b0, long b1) {
    for (long bl = b0; bl < b1; bl++)
        gain_block(dg, db, dy, x, mean, rstd, N, d, acc, (int)bl * GAIN_BLOCK);
}
K_VERSIONS(gain_blocks,
           (float *dg, float *db, const float *dy, const float *x, const float *mean,
            const float *rstd, int N, int d, int acc, long b0, long b1),
           (dg, db, dy, x, mean, rstd, N, d, acc, b0, b1))

static void gain_grads(float *dg, float *db, const float *dy, const float *x, const float *mean,
                       const float *rstd, int N, int d, int acc) {
    if (!dg && !db) return; /* frozen gains (LoRA training) */
    gain_blocks_fn *f = gain_blocks_pick();
    K_RANGES(b0, b1, (d + GAIN_BLOCK - 1) / GAIN_BLOCK, (long)N * d,
             f(dg, db, dy, x, mean, rstd, N, d, acc, b0, b1));
}

/* d/dx of x*r: r*dy*g - x * r^3 * mean(dy*g*x) */
K_INLINE void rmsnorm_bwd_row(float *dxi, const float *dyi, const float *xi, const float *g,
                              float r, int d) {
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int j = 0; j < d; j++) dot += dyi[j] * g[j] * xi[j];
    float c = dot * r * r * r / (float)d;
    for (int j = 0; j < d; j++) dxi[j] = r * dyi[j] * g[j] - xi[j] * c;
}

K_INLINE void rmsnorm_bwd_rows(float *dx, const float *dy, const float *x, const float *g,
                               const float *rstd, int d, long r0, long r1) {
    for (long i = r0; i < r1; i++)
        rmsnorm_bwd_row(dx + (size_t)i * d, dy + (size_t)i * d, x + (size_t)i * d, g, rstd[i], d);
}
K_VERSIONS(rmsnorm_bwd_rows,
           (float *dx, const float *dy, const float *x, const float *g, const float *rstd, int d,
            long r0, long r1),
           (dx, dy, x, g, rstd, d, r0, r1))

void k_rmsnorm_bwd(float *dx, float *dg, const float *dy, const float *x, const float *g,
                   const float *rstd, int N, int d, int acc) {
    gain_grads(dg, NULL, dy, x, NULL, rstd, N, d, acc);
    rmsnorm_bwd_rows_fn *f = rmsnorm_bwd_rows_pick();
    K_RANGES(r0, r1, N, (long)N * d, f(dx, dy, x, g, rstd, d, r0, r1));
}

K_INLINE void layernorm_bwd_row(float *dxi, const float *dyi, const float *xi, const float *g,
                                float m, float r, int d) {
    float s1 = 0.0f, s2 = 0.0f;
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

K_INLINE void layernorm_bwd_rows(float *dx, const float *dy, const float *x, const float *g,
                                 const float *mean, const float *rstd, int d, long r0, long r1) {
    for (long i = r0; i < r1; i++)
        layernorm_bwd_row(dx + (size_t)i * d, dy + (size_t)i * d, x + (size_t)i * d, g, mean[i],
                          rstd[i], d);
}
K_VERSIONS(layernorm_bwd_rows,
           (float *dx, const float *dy, const float *x, const float *g, const float *mean,
            const float *rstd, int d, long r0, long r1),
           (dx, dy, x, g, mean, rstd, d, r0, r1))

void k_layernorm_bwd(float *dx, float *dg, float *db, const float *dy, const float *x,
                     const float *g, const float *mean, const float *rstd, int N, int d, int acc) {
    gain_grads(dg, db, dy, x, mean, rstd, N, d, acc);
    layernorm_bwd_rows_fn *f = layernorm_bwd_rows_pick();
    K_RANGES(r0, r1, N, (long)N * d, f(dx, dy, x, g, mean, rstd, d, r0, r1));
}
