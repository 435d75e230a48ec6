#include "kernels.h"

/* sign = +1 rotates forward; -1 applies the transpose (the backward pass). */
static void rope(float *x, int ld, int B, int T, int n_heads, int hd, int pos0, const float *cos_t,
                 const float *sin_t, int interleaved, float sign) {
    int half = hd / 2, width = ld;
#pragma omp parallel for schedule(static) if ((long)B * T * n_heads * hd >= K_PAR_MIN)
    for (int r = 0; r < B * T; r++) {
        int pos = pos0 + r % T;
        const float *c = cos_t + (size_t)pos * half, *s = sin_t + (size_t)pos * half;
        float *row = x + (size_t)r * width;
        /* No per-row copy of the signed sines: OpenMP workers' stacks are small, and sign * s[i]
         * is exact where it is used. */
        for (int h = 0; h < n_heads; h++) {
            float *v = row + h * hd;
            if (interleaved) {
                for (int i = 0; i < half; i++) {
                    float a = v[2 * i], b = v[2 * i + 1], si = sign * s[i];
                    v[2 * i] = a * c[i] - b * si;
                    v[2 * i + 1] = a * si + b * c[i];
                }
            } else {
                for (int i = 0; i < half; i++) {
                    float a = v[i], b = v[i + half], si = sign * s[i];
                    v[i] = a * c[i] - b * si;
                    v[i + half] = a * si + b * c[i];
                }
            }
        }
    }
}

void k_rope_fwd(float *x, int ld, int B, int T, int n_heads, int hd, int pos0, const float *cos_t,
                const float *sin_t, int interleaved) {
    rope(x, ld, B, T, n_heads, hd, pos0, cos_t, sin_t, interleaved, 1.0f);
}

void k_rope_bwd(float *dx, int ld, int B, int T, int n_heads, int hd, int pos0, const float *cos_t,
                const float *sin_t, int interleaved) {
    rope(dx, ld, B, T, n_heads, hd, pos0, cos_t, sin_t, interleaved, -1.0f);
}
