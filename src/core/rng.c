#include <math.h>

#include "core.h"

void core_rng_seed(core_rng *r, uint64_t seed, uint64_t stream) {
    r->state = 0;
    r->inc = (stream << 1u) | 1u;
    core_rng_u32(r);
    r->state += seed;
    core_rng_u32(r);
}

/* PCG-XSH-RR 64/32 (O'Neill 2014). */
uint32_t core_rng_u32(core_rng *r) {
    uint64_t old = r->state;
    r->state = old * 6364136223846793005ULL + r->inc;
    uint32_t xorshifted = (uint32_t)(((old >> 18u) ^ old) >> 27u);
    uint32_t rot = (uint32_t)(old >> 59u);
    return (xorshifted >> rot) | (xorshifted << ((-rot) & 31));
}

float core_rng_float(core_rng *r) { return (float)(core_rng_u32(r) >> 8) * (1.0f / 16777216.0f); }

double core_rng_double_open(core_rng *r) {
    uint64_t hi = core_rng_u32(r) >> 5, lo = core_rng_u32(r) >> 6; /* 27 + 26 = 53 bits */
    double u = ((double)(hi * 67108864u + lo) + 0.5) / 9007199254740992.0;
    return u;
}

double core_rng_normal(core_rng *r) {
    /* Box-Muller, one value per call: simplicity and a stateless stream beat the saved half. */
    double u1 = core_rng_double_open(r), u2 = core_rng_double_open(r);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

double core_rng_trunc_normal(core_rng *r, double sigma, double cut) {
    for (;;) {
        double z = core_rng_normal(r);
        if (z >= -cut && z <= cut) return z * sigma;
    }
}

uint32_t core_rng_below(core_rng *r, uint32_t n) {
    /* Lemire-style rejection keeps the result unbiased. */
    uint32_t threshold = (uint32_t)(-n) % n;
    for (;;) {
        uint32_t x = core_rng_u32(r);
        if (x >= threshold) return x % n;
    }
}
