/* One query against its sequence's cached keys and values: the attention of a decode step, per
 * (row, head). The plain loops (session.c) compute one score at a time with one accumulator and
 * a horizontal sum per key, and update the output through memory at every key (8 sequences of
 * 110M at 256 positions: 13.9% of a step, 10.8% with this). Here four keys share a pass over the
 * query with four independent chains, and the output stays in registers, two keys' worth of
 * chains at a time. An F16 cache is widened as it is loaded (vcvtph2ps), so it costs half the
 * traffic and no pass of its own. */
#include <math.h>

#include "fastmath.h"
#include "kernels.h"
#include "qdot.h"

#if defined(__x86_64__) || defined(__i386__)
#include "simd_x86.h"

/* 16 elements from element i of a cached row: floats, or halves widened. */
T5 static inline __attribute__((always_inline)) __m512 ld16(const int F16, const void *row,
                                                            size_t i) {
    if (F16)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + i)));
    return _mm512_loadu_ps((const float *)row + i);
}

/* hd = 16 * NB; NB and F16 are constants at each call site, so the arrays below live in
 * registers and the loads are of one kind. */
T5 static inline __attribute__((always_inline)) void row_avx512(const int NB, const int F16,
                                                                const float *q, const void *K,
                                                                const void *V, int S, float scale,
                                                                float *p, float *o) {
    const size_t hd = 16 * (size_t)NB;
    __m512 qv[8];
    for (int b = 0; b < NB; b++) qv[b] = _mm512_loadu_ps(q + 16 * b);
    int j = 0;
    for (; j + 4 <= S; j += 4) {
        size_t k0 = (size_t)j * hd;
        __m512 a0 = _mm512_mul_ps(qv[0], ld16(F16, K, k0));
        __m512 a1 = _mm512_mul_ps(qv[0], ld16(F16, K, k0 + hd));
        __m512 a2 = _mm512_mul_ps(qv[0], ld16(F16, K, k0 + 2 * hd));
        __m512 a3 = _mm512_mul_ps(qv[0], ld16(F16, K, k0 + 3 * hd));
        for (int b = 1; b < NB; b++) {
            a0 = _mm512_fmadd_ps(qv[b], ld16(F16, K, k0 + 16 * b), a0);
            a1 = _mm512_fmadd_ps(qv[b], ld16(F16, K, k0 + hd + 16 * b), a1);
            a2 = _mm512_fmadd_ps(qv[b], ld16(F16, K, k0 + 2 * hd + 16 * b), a2);
            a3 = _mm512_fmadd_ps(qv[b], ld16(F16, K, k0 + 3 * hd + 16 * b), a3);
        }
        p[j] = scale * _mm512_reduce_add_ps(a0);
        p[j + 1] = scale * _mm512_reduce_add_ps(a1);
        p[j + 2] = scale * _mm512_reduce_add_ps(a2);
        p[j + 3] = scale * _mm512_reduce_add_ps(a3);
    }
    for (; j < S; j++) {
        size_t kj = (size_t)j * hd;
        __m512 a = _mm512_mul_ps(qv[0], ld16(F16, K, kj));
        for (int b = 1; b < NB; b++) a = _mm512_fmadd_ps(qv[b], ld16(F16, K, kj + 16 * b), a);
        p[j] = scale * _mm512_reduce_add_ps(a);
    }
    float m = -INFINITY;
    for (j = 0; j < S; j++) m = p[j] > m ? p[j] : m;
    tlm_softmax_row(p, S, m);
    /* two keys per step into separate sums: 2 x NB independent chains */
    __m512 e0[8], e1[8];
    for (int b = 0; b < NB; b++) e0[b] = e1[b] = _mm512_setzero_ps();
    for (j = 0; j + 2 <= S; j += 2) {
        size_t v0 = (size_t)j * hd;
        __m512 w0 = _mm512_set1_ps(p[j]), w1 = _mm512_set1_ps(p[j + 1]);
        for (int b = 0; b < NB; b++) {
            e0[b] = _mm512_fmadd_ps(w0, ld16(F16, V, v0 + 16 * b), e0[b]);
            e1[b] = _mm512_fmadd_ps(w1, ld16(F16, V, v0 + hd + 16 * b), e1[b]);
        }
    }
    if (j < S) {
        __m512 w0 = _mm512_set1_ps(p[j]);
        for (int b = 0; b < NB; b++)
            e0[b] = _mm512_fmadd_ps(w0, ld16(F16, V, (size_t)j * hd + 16 * b), e0[b]);
    }
    for (int b = 0; b < NB; b++) _mm512_storeu_ps(o + 16 * b, _mm512_add_ps(e0[b], e1[b]));
}

#define ROW_CASES(F16)                                                                             \
    switch (hd) {                                                                                  \
    case 32: row_avx512(2, F16, q, K, V, S, scale, p, o); return 0;                                \
    case 48: row_avx512(3, F16, q, K, V, S, scale, p, o); return 0;                                \
    case 64: row_avx512(4, F16, q, K, V, S, scale, p, o); return 0;                                \
    case 96: row_avx512(6, F16, q, K, V, S, scale, p, o); return 0;                                \
    case 128: row_avx512(8, F16, q, K, V, S, scale, p, o); return 0;                               \
    default: return -1;                                                                            \
    }

T5 static int attend_row_avx512(const float *q, const void *K, const void *V, int f16, int S,
                                int hd, float scale, float *p, float *o) {
    if (f16) ROW_CASES(1)
    ROW_CASES(0)
}

#define HAVE_X86 1
#else
#define HAVE_X86 0
#endif

int k_attend_row(const float *q, const void *K, const void *V, int f16, int S, int hd, float scale,
                 float *p, float *o) {
#if HAVE_X86
    if (S > 0 && k_isa() >= K_ISA_AVX512)
        return attend_row_avx512(q, K, V, f16, S, hd, scale, p, o);
#else
    (void)q, (void)K, (void)V, (void)f16, (void)S, (void)hd, (void)scale, (void)p, (void)o;
#endif
    return -1;
}
