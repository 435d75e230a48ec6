#include "kernels.h"

void k_rope_fwd(float *x, int B, int T, int n_heads, int hd, int pos0, const float *cos_t,
                const float *sin_t, int interleaved) {
    int half = hd / 2, width = n_heads * hd;
#pragma omp parallel for schedule(static)
    for (int r = 0; r < B * T; r++) {
        int pos = pos0 + r % T;
        const float *c = cos_t + (size_t)pos * half, *s = sin_t + (size_t)pos * half;
        float *row = x + (size_t)r * width;
        for (int h = 0; h < n_heads; h++) {
            float *v = row + h * hd;
            if (interleaved) {
                for (int i = 0; i < half; i++) {
                    float a = v[2 * i], b = v[2 * i + 1];
                    v[2 * i] = a * c[i] - b * s[i];
                    v[2 * i + 1] = a * s[i] + b * c[i];
                }
            } else {
                for (int i = 0; i < half; i++) {
                    float a = v[i], b = v[i + half];
                    v[i] = a * c[i] - b * s[i];
                    v[i + half] = a * s[i] + b * c[i];
                }
            }
        }
    }
}
