#include <math.h>

#include "kernels.h"

#define SQRT_2_OVER_PI 0.7978845608028654f
#define INV_SQRT_2 0.7071067811865476f

static inline float gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * INV_SQRT_2)); }
static inline float gelu_tanh(float x) {
    return 0.5f * x * (1.0f + tanhf(SQRT_2_OVER_PI * (x + 0.044715f * x * x * x)));
}
static inline float silu(float x) { return x / (1.0f + expf(-x)); }

void k_act_fwd(float *y, const float *x, size_t n, k_act act) {
    long nn = (long)n;
    switch (act) {
    case K_ACT_GELU:
#pragma omp parallel for schedule(static)
        for (long i = 0; i < nn; i++) y[i] = gelu_erf(x[i]);
        break;
    case K_ACT_GELU_TANH:
#pragma omp parallel for schedule(static)
        for (long i = 0; i < nn; i++) y[i] = gelu_tanh(x[i]);
        break;
    case K_ACT_RELU:
#pragma omp parallel for schedule(static)
        for (long i = 0; i < nn; i++) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
        break;
    case K_ACT_SILU:
#pragma omp parallel for schedule(static)
        for (long i = 0; i < nn; i++) y[i] = silu(x[i]);
        break;
    }
}

void k_swiglu_fwd(float *y, const float *gate, const float *up, size_t n) {
    long nn = (long)n;
#pragma omp parallel for schedule(static)
    for (long i = 0; i < nn; i++) y[i] = silu(gate[i]) * up[i];
}

void k_add(float *y, const float *a, const float *b, size_t n) {
    long nn = (long)n;
#pragma omp parallel for schedule(static)
    for (long i = 0; i < nn; i++) y[i] = a[i] + b[i];
}
