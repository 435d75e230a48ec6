/* BF16 weights' products with vdpbf16ps on the weight rows as they are, and the rounding of
 * activation rows to BF16 (gemm_traits.h has their contracts; ref/fgemm_ref.c their references). */
#include <string.h>

#include "core/half.h"
#include "kernels/gemm_traits.h"

#if K_GEMM_X86
#include "kernels/x86/simd.h"

/* BF16 weights need no repacking: each vdpbf16ps takes one pair of columns of 16 activation rows
 * (interleaved once per call) and a broadcast pair of one weight row. R weight rows against T tiles
 * of 16 activation rows keep R*T accumulators: 8 x 3 hides vdpbf16ps's latency on both pipes,
 * where 8 x 1 leaves them idle about a third of the time (bench/quant/prefill_paths.sh, BF16).
 * Each sum runs over k in order, whatever R
 * and T, so a row's result does not depend on the tiling. */
K_TARGET_AVX512BF16 static inline __attribute__((always_inline)) void
bf16_tile(const int R, const int T, int n, const uint8_t *w, size_t row_bytes, const uint32_t *xt,
          size_t tile_words, float *out) {
    __m512 acc[3][8];
#pragma GCC unroll 3
    for (int t = 0; t < T; t++)
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) acc[t][r] = _mm512_setzero_ps();
    for (int kp = 0; kp < n / 2; kp++) {
        __m512bh xv[3];
#pragma GCC unroll 3
        for (int t = 0; t < T; t++)
            xv[t] =
                (__m512bh)_mm512_loadu_si512((const void *)(xt + t * tile_words + (size_t)kp * 16));
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            int32_t wv;
            memcpy(&wv, w + (size_t)r * row_bytes + 4 * (size_t)kp, 4);
            __m512bh wb = (__m512bh)_mm512_set1_epi32(wv);
#pragma GCC unroll 3
            for (int t = 0; t < T; t++) acc[t][r] = _mm512_dpbf16_ps(acc[t][r], xv[t], wb);
        }
    }
#pragma GCC unroll 3
    for (int t = 0; t < T; t++)
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) _mm512_storeu_ps(out + (t * 8 + r) * 16, acc[t][r]);
}

#define BF_CASE(R)                                                                                 \
    case R:                                                                                        \
        if (T == 3)                                                                                \
            bf16_tile(R, 3, n, w, row_bytes, xt, tile_words, out);                                 \
        else if (T == 2)                                                                           \
            bf16_tile(R, 2, n, w, row_bytes, xt, tile_words, out);                                 \
        else                                                                                       \
            bf16_tile(R, 1, n, w, row_bytes, xt, tile_words, out);                                 \
        return;
K_TARGET_AVX512BF16 void k_bf16_gemm_tile_8x48_avx512bf16(int R, int T, int n, const uint8_t *w,
                                                          size_t row_bytes, const uint32_t *xt,
                                                          size_t tile_words, float *out) {
    switch (R) {
        BF_CASE(1)
        BF_CASE(2)
        BF_CASE(3)
        BF_CASE(4)
        BF_CASE(5)
        BF_CASE(6)
        BF_CASE(7)
        BF_CASE(8)
    default: return;
    }
}

/* Round to nearest even, as core_f32_to_bf16 for finite values. */
K_TARGET_AVX512BF16 void k_bf16_round_row_avx512bf16(const float *x, int n, uint16_t *y) {
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i));
        _mm512_storeu_si512((void *)(y + i), (__m512i)v);
    }
    for (; i < n; i++) y[i] = core_f32_to_bf16(x[i]);
}

#endif
