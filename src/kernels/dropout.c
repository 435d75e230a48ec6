#include "kernels.h"

/* A counter-based hash (splitmix64's finalizer): the mask of element i depends only on the key and
 * i, so the backward pass regenerates it instead of storing it, in any thread order. */
static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

uint64_t k_dropout_key(uint64_t seed, uint64_t step, uint64_t site) {
    return mix64(mix64(seed ^ 0x6a09e667f3bcc909ULL) + mix64(step + 0x3c6ef372fe94f82bULL) +
                 site * 0x9e3779b97f4a7c15ULL);
}

float k_dropout_keep(uint64_t key, uint64_t i, float p) {
    /* 24 random bits against p: exact enough for any p a model uses. */
    uint32_t r = (uint32_t)(mix64(key + i * 0x9e3779b97f4a7c15ULL) >> 40);
    return (float)r >= p * 16777216.0f ? 1.0f / (1.0f - p) : 0.0f;
}

void k_dropout(float *y, const float *x, size_t n, float p, uint64_t key) {
    long nn = (long)n;
#pragma omp parallel for schedule(static) if (nn >= K_PAR_MIN)
    for (long i = 0; i < nn; i++) y[i] = x[i] * k_dropout_keep(key, (uint64_t)i, p);
}
