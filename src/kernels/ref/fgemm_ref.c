/* The float weights' tiles in plain C (gemm_traits.h has their contracts): BF16 and F32 (F16
 * widened). The F32 tiles take each sum's fused multiply-adds in the vector kernels' order, so
 * that those equal them bit for bit (test_qgemm); they run where the CPU has no vector version. */
#include <math.h>
#include <string.h>

#include "core/half.h"
#include "kernels/gemm_traits.h"

/* Products of BF16 values are exact in fp32, summed in pairs as vdpbf16ps does (up to its rounding
 * of each step). */
void k_bf16_gemm_tile_8x48_ref(int R, int T, int n, const uint8_t *w, size_t row_bytes,
                               const uint32_t *xt, size_t tile_words, float *out) {
    for (int t = 0; t < T; t++)
        for (int r = 0; r < R; r++)
            for (int a = 0; a < 16; a++) {
                const uint32_t *xa = xt + (size_t)t * tile_words;
                float acc = 0.0f;
                for (int kp = 0; kp < n / 2; kp++) {
                    uint16_t wv[2], xv[2];
                    memcpy(wv, w + (size_t)r * row_bytes + 4 * (size_t)kp, 4);
                    memcpy(xv, xa + (size_t)kp * 16 + a, 4);
                    acc += core_bf16_to_f32(wv[0]) * core_bf16_to_f32(xv[0]) +
                           core_bf16_to_f32(wv[1]) * core_bf16_to_f32(xv[1]);
                }
                out[(t * 8 + r) * 16 + a] = acc;
            }
}

void k_bf16_round_row_ref(const float *x, int n, uint16_t *y) {
    for (int i = 0; i < n; i++) y[i] = core_f32_to_bf16(x[i]);
}

void k_fgemm_tile_8x48_ref(int R, int T, int n, const float *w, size_t ldw, const float *xt,
                           size_t tile_floats, float *out, const char *pf, size_t pf_step) {
    for (int t = 0; t < T; t++)
        for (int r = 0; r < R; r++)
            for (int a = 0; a < 16; a++) {
                const float *xa = xt + (size_t)t * tile_floats + a, *wr = w + (size_t)r * ldw;
                float acc = 0.0f;
                for (int k = 0; k < n; k++) acc = fmaf(xa[(size_t)k * 16], wr[k], acc);
                out[(t * 8 + r) * 16 + a] = acc;
            }
}

void k_fgemm_tile_8x8_pairs_ref(int R, int n, const float *w, size_t ldw, const float *xt,
                                float *out, const char *pf, size_t pf_step) {
    for (int r = 0; r < R; r++)
        for (int a = 0; a < 8; a++) {
            const float *wr = w + (size_t)r * ldw;
            float even = 0.0f, odd = 0.0f;
            for (int p = 0; p < n / 2; p++) {
                even = fmaf(xt[(size_t)p * 16 + 2 * a], wr[2 * p], even);
                odd = fmaf(xt[(size_t)p * 16 + 2 * a + 1], wr[2 * p + 1], odd);
            }
            out[r * 8 + a] = even + odd;
        }
}

void k_fgemm_interleave16_ref(const float *x, int n, int rows, float *dst) {
    for (int k = 0; k < n; k++)
        for (int i = 0; i < 16; i++)
            dst[(size_t)k * 16 + i] = i < rows ? x[(size_t)i * n + k] : 0.0f;
}
