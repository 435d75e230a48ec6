#include "core/core.h"
#include "kernels.h"

/* Masks come from a counter-based hash (core_mix64): the mask of element i depends only on the key
 * and i, so the backward pass regenerates it instead of storing it, in any thread order. */
uint64_t k_dropout_key(uint64_t seed, uint64_t step, uint64_t site) {
    return core_mix64(core_mix64(seed ^ 0x6a09e667f3bcc909ULL) +
                      core_mix64(step + 0x3c6ef372fe94f82bULL) + site * 0x9e3779b97f4a7c15ULL);
}

static inline float keep(uint64_t key, uint64_t i, float p) {
    /* 24 random bits against p: exact enough for any p a model uses. */
    uint32_t r = (uint32_t)(core_mix64(key + i * 0x9e3779b97f4a7c15ULL) >> 40);
    return (float)r >= p * 16777216.0f ? 1.0f / (1.0f - p) : 0.0f;
}

float k_dropout_keep(uint64_t key, uint64_t i, float p) { return keep(key, i, p); }

K_INLINE void dropout_span(float *y, const float *x, float p, uint64_t key, long a, long b) {
    for (long i = a; i < b; i++) y[i] = x[i] * keep(key, (uint64_t)i, p);
}
K_VERSIONS(dropout_span, (float *y, const float *x, float p, uint64_t key, long a, long b),
           (y, x, p, key, a, b))

void k_dropout(float *y, const float *x, size_t n, float p, uint64_t key) {
    dropout_span_fn *f = dropout_span_pick();
    K_RANGES(a, b, n, n, f(y, x, p, key, a, b));
}
