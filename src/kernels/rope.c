#include "kernels.h"

/* One row's heads rotated by the angles c, s of its position. */
K_INLINE void rope_row(float *row, const float *c, const float *s, int n_heads, int hd,
                       int interleaved, float sign) {
    int half = hd / 2;
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

/* Rows [r0, r1); sign = +1 rotates forward, -1 applies the transpose (the backward pass). */
K_INLINE void rope_rows(float *x, int ld, const int *pos, int n_heads, int hd, const float *cos_t,
                        const float *sin_t, int interleaved, float sign, long r0, long r1) {
    size_t half = (size_t)hd / 2;
    for (long r = r0; r < r1; r++)
        rope_row(x + (size_t)r * ld, cos_t + (size_t)pos[r] * half, sin_t + (size_t)pos[r] * half,
                 n_heads, hd, interleaved, sign);
}
K_VERSIONS(rope_rows,
           (float *x, int ld, const int *pos, int n_heads, int hd, const float *cos_t,
            const float *sin_t, int interleaved, float sign, long r0, long r1),
           (x, ld, pos, n_heads, hd, cos_t, sin_t, interleaved, sign, r0, r1))

static void rope(float *x, int ld, int N, const int *pos, int n_heads, int hd, const float *cos_t,
                 const float *sin_t, int interleaved, float sign) {
    rope_rows_fn *f = rope_rows_pick();
    K_RANGES(r0, r1, N, (long)N * n_heads * hd,
             f(x, ld, pos, n_heads, hd, cos_t, sin_t, interleaved, sign, r0, r1));
}

void k_rope_fwd(float *x, int ld, int N, const int *pos, int n_heads, int hd, const float *cos_t,
                const float *sin_t, int interleaved) {
    rope(x, ld, N, pos, n_heads, hd, cos_t, sin_t, interleaved, 1.0f);
}

void k_rope_bwd(float *dx, int ld, int N, const int *pos, int n_heads, int hd, const float *cos_t,
                const float *sin_t, int interleaved) {
    rope(dx, ld, N, pos, n_heads, hd, cos_t, sin_t, interleaved, -1.0f);
}
