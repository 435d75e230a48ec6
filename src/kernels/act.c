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
    case K_ACT_GELU: K_FOR(i, nn, nn, y[i] = gelu_erf(x[i])); break;
    case K_ACT_GELU_TANH: K_FOR(i, nn, nn, y[i] = gelu_tanh(x[i])); break;
    case K_ACT_RELU: K_FOR(i, nn, nn, y[i] = x[i] > 0.0f ? x[i] : 0.0f); break;
    case K_ACT_SILU: K_FOR(i, nn, nn, y[i] = silu(x[i])); break;
    }
}

void k_add(float *y, const float *a, const float *b, size_t n) {
    long nn = (long)n;
    K_FOR(i, nn, nn, y[i] = a[i] + b[i]);
}

static inline float gelu_tanh_grad(float x) {
    float u = SQRT_2_OVER_PI * (x + 0.044715f * x * x * x);
    float t = 2.0f * tlm_sigmoidf(2.0f * u) - 1.0f;
    float du = SQRT_2_OVER_PI * (1.0f + 3.0f * 0.044715f * x * x);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

/* y = act(v) and x = act'(v) for v = x, one element each. */
static inline void gelu_fwd_grad(float *y, float *x) {
    /* d/dx x*Phi(x) = Phi(x) + x*phi(x); phi's exp(-x^2/2) is the one erf(x/sqrt 2) needs */
    float v = *x, e = tlm_expf_nonpos(-0.5f * v * v); /* v NaN: y and x NaN */
    float r = tlm_erff_abs_given_exp(__builtin_fabsf(v) * INV_SQRT_2, e);
    float cdf = 0.5f * (1.0f + __builtin_copysignf(r, v));
    *y = v * cdf;
    *x = cdf + v * 0.3989422804014327f * e;
}

static inline void gelu_tanh_fwd_grad(float *y, float *x) {
    float v = *x;
    *y = gelu_tanh(v);
    *x = gelu_tanh_grad(v);
}

static inline void relu_fwd_grad(float *y, float *x) {
    float v = *x;
    *y = v > 0.0f ? v : 0.0f;
    *x = v > 0.0f ? 1.0f : 0.0f;
}

static inline void silu_fwd_grad(float *y, float *x) {
    float v = *x, sg = tlm_sigmoidf(v);
    *y = v * sg;
    *x = sg * (1.0f + v * (1.0f - sg));
}

/* Training needs act'(x) in the backward pass, and x for nothing else: computing it here, where
 * the forward's exp and erf are at hand, and storing it over x costs no memory and saves the
 * backward pass recomputing them (for GELU: about half of both passes' elementwise time). */
void k_act_fwd_grad(float *y, float *x, size_t n, k_act act) {
    long nn = (long)n;
    switch (act) {
    case K_ACT_GELU: K_FOR(i, nn, nn, gelu_fwd_grad(y + i, x + i)); break;
    case K_ACT_GELU_TANH: K_FOR(i, nn, nn, gelu_tanh_fwd_grad(y + i, x + i)); break;
    case K_ACT_RELU: K_FOR(i, nn, nn, relu_fwd_grad(y + i, x + i)); break;
    case K_ACT_SILU: K_FOR(i, nn, nn, silu_fwd_grad(y + i, x + i)); break;
    }
}

void k_mul(float *y, const float *a, const float *b, size_t n) {
    long nn = (long)n;
    K_FOR(i, nn, nn, y[i] = a[i] * b[i]);
}

void k_acc(float *y, const float *a, size_t n) {
    long nn = (long)n;
    K_FOR(i, nn, nn, y[i] += a[i]);
}

static void swiglu_row_fwd(float *yi, const float *g, const float *u, int ff) {
    for (int j = 0; j < ff; j++) yi[j] = silu(g[j]) * u[j];
}

void k_swiglu_rows_fwd(float *y, const float *a, int N, int ff) {
    K_FOR(i, N, (long)N * ff,
          swiglu_row_fwd(y + (size_t)i * ff, a + (size_t)i * 2 * ff, a + (size_t)i * 2 * ff + ff,
                         ff));
}

static void swiglu_row_bwd(float *dg, float *du, const float *dyi, const float *g, const float *u,
                           int ff) {
    for (int j = 0; j < ff; j++) {
        float s = tlm_sigmoidf(g[j]);
        du[j] = dyi[j] * g[j] * s;
        dg[j] = dyi[j] * u[j] * s * (1.0f + g[j] * (1.0f - s));
    }
}

void k_swiglu_rows_bwd(float *da, const float *dy, const float *a, int N, int ff) {
    K_FOR(i, N, (long)N * ff,
          swiglu_row_bwd(da + (size_t)i * 2 * ff, da + (size_t)i * 2 * ff + ff, dy + (size_t)i * ff,
                         a + (size_t)i * 2 * ff, a + (size_t)i * 2 * ff + ff, ff));
}
