#include <math.h>

#include "fastmath.h"
#include "kernels.h"

#define SQRT_2_OVER_PI 0.7978845608028654f
#define INV_SQRT_2 0.7071067811865476f

static inline float gelu_erf(float x) { return 0.5f * x * (1.0f + k_erff(x * INV_SQRT_2)); }
/* 0.5 x (1 + tanh(u)) = x sigmoid(2u): one exp and no cancellation near zero. */
static inline float gelu_tanh(float x) {
    return x * k_sigmoidf(2.0f * SQRT_2_OVER_PI * (x + 0.044715f * x * x * x));
}
static inline float silu(float x) { return x / (1.0f + k_expf(-x)); }

K_INLINE void act_span(float *y, const float *x, k_act act, long a, long b) {
    switch (act) {
    case K_ACT_GELU:
        for (long i = a; i < b; i++) y[i] = gelu_erf(x[i]);
        break;
    case K_ACT_GELU_TANH:
        for (long i = a; i < b; i++) y[i] = gelu_tanh(x[i]);
        break;
    case K_ACT_RELU:
        for (long i = a; i < b; i++) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
        break;
    case K_ACT_SILU:
        for (long i = a; i < b; i++) y[i] = silu(x[i]);
        break;
    }
}
K_VERSIONS(act_span, (float *y, const float *x, k_act act, long a, long b), (y, x, act, a, b))

void k_act_fwd(float *y, const float *x, size_t n, k_act act) {
    act_span_fn *f = act_span_pick();
    K_RANGES(a, b, n, n, f(y, x, act, a, b));
}

K_INLINE void add_span(float *y, const float *p, const float *q, long a, long b) {
    for (long i = a; i < b; i++) y[i] = p[i] + q[i];
}
K_VERSIONS(add_span, (float *y, const float *p, const float *q, long a, long b), (y, p, q, a, b))

void k_add(float *y, const float *a, const float *b, size_t n) {
    add_span_fn *f = add_span_pick();
    K_RANGES(i0, i1, n, n, f(y, a, b, i0, i1));
}

static inline float gelu_tanh_grad(float x) {
    float u = SQRT_2_OVER_PI * (x + 0.044715f * x * x * x);
    float t = 2.0f * k_sigmoidf(2.0f * u) - 1.0f;
    float du = SQRT_2_OVER_PI * (1.0f + 3.0f * 0.044715f * x * x);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

/* y = act(v) and x = act'(v) for v = x, one element each. */
static inline void gelu_fwd_grad(float *y, float *x) {
    /* d/dx x*Phi(x) = Phi(x) + x*phi(x); phi's exp(-x^2/2) is the one erf(x/sqrt 2) needs */
    float v = *x, e = k_expf_nonpos(-0.5f * v * v); /* v NaN: y and x NaN */
    float r = k_erff_abs_given_exp(__builtin_fabsf(v) * INV_SQRT_2, e);
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
    float v = *x, sg = k_sigmoidf(v);
    *y = v * sg;
    *x = sg * (1.0f + v * (1.0f - sg));
}

/* Training needs act'(x) in the backward pass, and x for nothing else: computing it here, where
 * the forward's exp and erf are at hand, and storing it over x costs no memory and saves the
 * backward pass recomputing them (for GELU: about half of both passes' elementwise time). */
K_INLINE void act_grad_span(float *y, float *x, k_act act, long a, long b) {
    switch (act) {
    case K_ACT_GELU:
        for (long i = a; i < b; i++) gelu_fwd_grad(y + i, x + i);
        break;
    case K_ACT_GELU_TANH:
        for (long i = a; i < b; i++) gelu_tanh_fwd_grad(y + i, x + i);
        break;
    case K_ACT_RELU:
        for (long i = a; i < b; i++) relu_fwd_grad(y + i, x + i);
        break;
    case K_ACT_SILU:
        for (long i = a; i < b; i++) silu_fwd_grad(y + i, x + i);
        break;
    }
}
K_VERSIONS(act_grad_span, (float *y, float *x, k_act act, long a, long b), (y, x, act, a, b))

void k_act_fwd_grad(float *y, float *x, size_t n, k_act act) {
    act_grad_span_fn *f = act_grad_span_pick();
    K_RANGES(a, b, n, n, f(y, x, act, a, b));
}

K_INLINE void mul_span(float *y, const float *p, const float *q, long a, long b) {
    for (long i = a; i < b; i++) y[i] = p[i] * q[i];
}
K_VERSIONS(mul_span, (float *y, const float *p, const float *q, long a, long b), (y, p, q, a, b))

void k_mul(float *y, const float *a, const float *b, size_t n) {
    mul_span_fn *f = mul_span_pick();
    K_RANGES(i0, i1, n, n, f(y, a, b, i0, i1));
}

K_INLINE void acc_span(float *y, const float *p, long a, long b) {
    for (long i = a; i < b; i++) y[i] += p[i];
}
K_VERSIONS(acc_span, (float *y, const float *p, long a, long b), (y, p, a, b))

void k_acc(float *y, const float *a, size_t n) {
    acc_span_fn *f = acc_span_pick();
    K_RANGES(i0, i1, n, n, f(y, a, i0, i1));
}

/* Rows [r0, r1) of a fused gate|up buffer a [N, 2*ff]. */
K_INLINE void swiglu_rows_fwd(float *y, const float *a, int ff, long r0, long r1) {
    for (long i = r0; i < r1; i++) {
        float *yi = y + (size_t)i * ff;
        const float *g = a + (size_t)i * 2 * ff, *u = g + ff;
        for (int j = 0; j < ff; j++) yi[j] = silu(g[j]) * u[j];
    }
}
K_VERSIONS(swiglu_rows_fwd, (float *y, const float *a, int ff, long r0, long r1),
           (y, a, ff, r0, r1))

void k_swiglu_rows_fwd(float *y, const float *a, int N, int ff) {
    swiglu_rows_fwd_fn *f = swiglu_rows_fwd_pick();
    K_RANGES(r0, r1, N, (long)N * ff, f(y, a, ff, r0, r1));
}

K_INLINE void swiglu_rows_bwd(float *da, const float *dy, const float *a, int ff, long r0,
                              long r1) {
    for (long i = r0; i < r1; i++) {
        float *dg = da + (size_t)i * 2 * ff, *du = dg + ff;
        const float *dyi = dy + (size_t)i * ff, *g = a + (size_t)i * 2 * ff, *u = g + ff;
        for (int j = 0; j < ff; j++) {
            float s = k_sigmoidf(g[j]);
            du[j] = dyi[j] * g[j] * s;
            dg[j] = dyi[j] * u[j] * s * (1.0f + g[j] * (1.0f - s));
        }
    }
}
K_VERSIONS(swiglu_rows_bwd, (float *da, const float *dy, const float *a, int ff, long r0, long r1),
           (da, dy, a, ff, r0, r1))

/* da [N, 2*ff] (gate|up halves) from dy [N, ff]. */
void k_swiglu_rows_bwd(float *da, const float *dy, const float *a, int N, int ff) {
    swiglu_rows_bwd_fn *f = swiglu_rows_bwd_pick();
    K_RANGES(r0, r1, N, (long)N * ff, f(da, dy, a, ff, r0, r1));
}

/* GEGLU (Gemma): rows [r0, r1) of a fused gate|up buffer a [N, 2*ff], gelu_tanh(gate) * up. */
K_INLINE void geglu_rows_fwd(float *y, const float *a, int ff, long r0, long r1) {
    for (long i = r0; i < r1; i++) {
        float *yi = y + (size_t)i * ff;
        const float *g = a + (size_t)i * 2 * ff, *u = g + ff;
        for (int j = 0; j < ff; j++) yi[j] = gelu_tanh(g[j]) * u[j];
    }
}
K_VERSIONS(geglu_rows_fwd, (float *y, const float *a, int ff, long r0, long r1), (y, a, ff, r0, r1))

void k_geglu_rows_fwd(float *y, const float *a, int N, int ff) {
    geglu_rows_fwd_fn *f = geglu_rows_fwd_pick();
    K_RANGES(r0, r1, N, (long)N * ff, f(y, a, ff, r0, r1));
}

K_INLINE void geglu_rows_bwd(float *da, const float *dy, const float *a, int ff, long r0, long r1) {
    for (long i = r0; i < r1; i++) {
        float *dg = da + (size_t)i * 2 * ff, *du = dg + ff;
        const float *dyi = dy + (size_t)i * ff, *g = a + (size_t)i * 2 * ff, *u = g + ff;
        for (int j = 0; j < ff; j++) {
            du[j] = dyi[j] * gelu_tanh(g[j]);
            dg[j] = dyi[j] * u[j] * gelu_tanh_grad(g[j]);
        }
    }
}
K_VERSIONS(geglu_rows_bwd, (float *da, const float *dy, const float *a, int ff, long r0, long r1),
           (da, dy, a, ff, r0, r1))

void k_geglu_rows_bwd(float *da, const float *dy, const float *a, int N, int ff) {
    geglu_rows_bwd_fn *f = geglu_rows_bwd_pick();
    K_RANGES(r0, r1, N, (long)N * ff, f(da, dy, a, ff, r0, r1));
}

/* cap tanh(x / cap), written with k_tanhf so that the loops vectorize. */
K_INLINE void softcap_span(float *y, float cap, long a, long b) {
    float inv = 1.0f / cap;
    for (long i = a; i < b; i++) y[i] = cap * k_tanhf(y[i] * inv);
}
K_VERSIONS(softcap_span, (float *y, float cap, long a, long b), (y, cap, a, b))

void k_softcap_fwd(float *y, size_t n, float cap) {
    softcap_span_fn *f = softcap_span_pick();
    K_RANGES(a, b, n, n, f(y, cap, a, b));
}

/* d/ds cap tanh(s / cap) = 1 - tanh^2 = 1 - (y / cap)^2, from the capped value y. */
K_INLINE void softcap_bwd_span(float *dy, const float *y, float cap, long a, long b) {
    float inv = 1.0f / cap;
    for (long i = a; i < b; i++) {
        float t = y[i] * inv;
        dy[i] *= 1.0f - t * t;
    }
}
K_VERSIONS(softcap_bwd_span, (float *dy, const float *y, float cap, long a, long b),
           (dy, y, cap, a, b))

void k_softcap_bwd(float *dy, const float *y, size_t n, float cap) {
    softcap_bwd_span_fn *f = softcap_bwd_span_pick();
    K_RANGES(a, b, n, n, f(dy, y, cap, a, b));
}
