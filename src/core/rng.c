#include <math.h>

#include "core.h"

void tlm_rng_seed(tlm_rng *r, uint64_t seed, uint64_t stream) {
    r->state = 0;
    r->inc = (stream << 1u) | 1u;
    tlm_rng_u32(r);
    r->state += seed;
    tlm_rng_u32(r);
}

/* PCG-XSH-RR 64/32 (O'Neill 2014). */
uint32_t tlm_rng_u32(tlm_rng *r) {
    uint64_t old = r->state;
    r->state = old * 6364136223846793005ULL + r->inc;
    uint32_t xorshifted = (uint32_t)(((old >> 18u) ^ old) >> 27u);
    uint32_t rot = (uint32_t)(old >> 59u);
    return (xorshifted >> rot) | (xorshifted << ((-rot) & 31));
}

float tlm_rng_float(tlm_rng *r) { return (float)(tlm_rng_u32(r) >> 8) * (1.0f / 16777216.0f); }

double tlm_rng_double_open(tlm_rng *r) {
    uint64_t hi = tlm_rng_u32(r) >> 5, lo = tlm_rng_u32(r) >> 6; /* 27 + 26 = 53 bits */
    double u = ((double)(hi * 67108864u + lo) + 0.5) / 9007199254740992.0;
    return u;
}

double tlm_rng_normal(tlm_rng *r) {
    /* Box-Muller, one value per call: simplicity and a stateless stream beat the saved half. */
    double u1 = tlm_rng_double_open(r), u2 = tlm_rng_double_open(r);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

double tlm_rng_trunc_normal(tlm_rng *r, double sigma, double cut) {
    for (;;) {
        double z = tlm_rng_normal(r);
        if (z >= -cut && z <= cut) return z * sigma;
    }
}

uint32_t tlm_rng_below(tlm_rng *r, uint32_t n) {
    /* Lemire-style rejection keeps the result unbiased. */
    uint32_t threshold = (uint32_t)(-n) % n;
    for (;;) {
        uint32_t x = tlm_rng_u32(r);
        if (x >= threshold) return x % n;
    }
}
