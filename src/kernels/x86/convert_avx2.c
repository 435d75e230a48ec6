/* F16 and BF16 rows to floats and F16 back, 8 at a time (the references convert one element per
 * call): the prefill's widened tiles and the F16 KV cache. */
#include "kernels/x86/vec_dot_x86.h"

#if defined(__x86_64__) || defined(__i386__)

/* Rows of F16 and BF16 to floats for the prefill tiles (8 at a time; the reference converts one
 * element per call). */
K_TARGET_AVX2 void k_widen_f16_avx2(const void *src, float *dst, int n) {
    const uint8_t *p = src;
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 2 * i))));
    for (; i < n; i++) dst[i] = load_f16(p + 2 * i);
}

/* Floats to F16 (the KV cache's rows), rounding to nearest even as core_f32_to_f16 does. */
K_TARGET_AVX2 void k_narrow_f16_avx2(const float *src, void *dst, int n) {
    uint16_t *h = dst;
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(h + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) h[i] = core_f32_to_f16(src[i]);
}

K_TARGET_AVX2 void k_widen_bf16_avx2(const void *src, float *dst, int n) {
    const uint8_t *p = src;
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_bf16x8(p + 2 * i));
    for (; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        uint32_t u = (uint32_t)h << 16;
        memcpy(dst + i, &u, 4);
    }
}

#endif
