#include <math.h>

#include "fastmath.h"
#include "kernels.h"

#define SQRT_2_OVER_PI 0.7978845608028654f
#define INV_SQRT_2 0.7071067811865476f

static inline float gelu_erf(float x) { return 0.5f * x * (1.0f + tlm_erff(x * INV_SQRT_2)); }
/* 0.5 x (1 + tanh(u)) = x sigmoid(2u): one exp and no cancellation near zero. */
static inline float gelu_tanh(float x) {
    return x * tlm_sigmoidf(2.0f * SQRT_2_OVER_PI * (x + 0.044715f * x * x * x));
}
static inline float silu(float x) { return x / (1.0f + tlm_expf(-x)); }

void k_act_fwd(float *y, const float *x, size_t n, k_act act) {
    long nn = (long)n;
    switch (act) {
    case K_ACT_GELU:
#pragma omp parallel for schedule(static) if (nn >= K_PAR_MIN)
        for (long i = 0; i < nn; i++) y[i] = gelu_erf(x[i]);
        break;
    case K_ACT_GELU_TANH:
#pragma omp parallel for schedule(static) if (nn >= K_PAR_MIN)
        for (long i = 0; i < nn; i++) y[i] = gelu_tanh(x[i]);
        break;
    case K_ACT_RELU:
#pragma omp parallel for schedule(static) if (nn >= K_PAR_MIN)
        for (long i = 0; i < nn; i++) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
        break;
    case K_ACT_SILU:
#pragma omp parallel for schedule(static) if (nn >= K_PAR_MIN)
        for (long i = 0; i < nn; i++) y[i] = silu(x[i]);
        break;
    }
}

void k_add(float *y, const float *a, const float *b, size_t n) {
    long nn = (long)n;
#pragma omp parallel for schedule(static) if (nn >= K_PAR_MIN)
    for (long i = 0; i < nn; i++) y[i] = a[i] + b[i];
}

static inline float sigmoid(float x) { return 1.0f / (1.0f + tlm_expf(-x)); }

static inline float gelu_erf_grad(float x) {
    /* d/dx x*Phi(x) = Phi(x) + x*phi(x); phi's exp(-x^2/2) is also the one erf(x/sqrt 2) needs */
    float e = tlm_expf(-0.5f * x * x);
    return 0.5f * (1.0f + tlm_erff_given_exp(x * INV_SQRT_2, e)) + x * 0.3989422804014327f * e;
}

static inline float gelu_tanh_grad(float x) {
    float u = SQRT_2_OVER_PI * (x + 0.044715f * x * x * x);
    float t = 2.0f * tlm_sigmoidf(2.0f * u) - 1.0f;
    float du = SQRT_2_OVER_PI * (1.0f + 3.0f * 0.044715f * x * x);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

void k_act_bwd(float *dx, const float *dy, const float *x, size_t n, k_act act) {
    long nn = (long)n;
    switch (act) {
    case K_ACT_GELU:
#pragma omp parallel for schedule(static) if (nn >= K_PAR_MIN)
        for (long i = 0; i < nn; i++) dx[i] = dy[i] * gelu_erf_grad(x[i]);
        break;
    case K_ACT_GELU_TANH:
#pragma omp parallel for schedule(static) if (nn >= K_PAR_MIN)
        for (long i = 0; i < nn; i++) dx[i] = dy[i] * gelu_tanh_grad(x[i]);
        break;
    case K_ACT_RELU:
#pragma omp parallel for schedule(static) if (nn >= K_PAR_MIN)
        for (long i = 0; i < nn; i++) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
        break;
    case K_ACT_SILU:
#pragma omp parallel for schedule(static) if (nn >= K_PAR_MIN)
        for (long i = 0; i < nn; i++) {
            float s = sigmoid(x[i]);
            dx[i] = dy[i] * s * (1.0f + x[i] * (1.0f - s));
        }
        break;
    }
}

void k_acc(float *y, const float *a, size_t n) {
    long nn = (long)n;
#pragma omp parallel for schedule(static) if (nn >= K_PAR_MIN)
    for (long i = 0; i < nn; i++) y[i] += a[i];
}

void k_swiglu_rows_fwd(float *y, const float *a, int N, int ff) {
#pragma omp parallel for schedule(static) if ((long)N * ff >= K_PAR_MIN)
    for (int i = 0; i < N; i++) {
        const float *g = a + (size_t)i * 2 * ff, *u = g + ff;
        float *yi = y + (size_t)i * ff;
        for (int j = 0; j < ff; j++) yi[j] = silu(g[j]) * u[j];
    }
}

void k_swiglu_rows_bwd(float *da, const float *dy, const float *a, int N, int ff) {
#pragma omp parallel for schedule(static) if ((long)N * ff >= K_PAR_MIN)
    for (int i = 0; i < N; i++) {
        const float *g = a + (size_t)i * 2 * ff, *u = g + ff, *dyi = dy + (size_t)i * ff;
        float *dg = da + (size_t)i * 2 * ff, *du = dg + ff;
        for (int j = 0; j < ff; j++) {
            float s = sigmoid(g[j]);
            du[j] = dyi[j] * g[j] * s;
            dg[j] = dyi[j] * u[j] * s * (1.0f + g[j] * (1.0f - s));
        }
    }
}
