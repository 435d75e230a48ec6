/* One query against its sequence's cached keys and values: the attention of a decode step, per
 * (row, head). The plain loops (session.c) compute one score at a time with one accumulator and
 * a horizontal sum per key, and update the output through memory at every key (8 sequences of
 * 110M at 256 positions: 13.9% of a step, 10.8% with this). Here four keys share a pass over the
 * query with four independent chains, and the output stays in registers, two keys' worth of
 * chains at a time. */
#include <math.h>

#include "fastmath.h"
#include "kernels.h"
#include "qdot.h"

#if defined(__x86_64__) || defined(__i386__)
#include "simd_x86.h"

/* hd = 16 * NB; NB is a constant at each call site, so the arrays below live in registers. */
T5 static inline __attribute__((always_inline)) void row_avx512(const int NB, const float *q,
                                                                const float *K, const float *V,
                                                                int S, float scale, float *p,
                                                                float *o) {
    const int hd = 16 * NB;
    __m512 qv[8];
    for (int b = 0; b < NB; b++) qv[b] = _mm512_loadu_ps(q + 16 * b);
    int j = 0;
    for (; j + 4 <= S; j += 4) {
        const float *k0 = K + (size_t)j * hd;
        __m512 a0 = _mm512_mul_ps(qv[0], _mm512_loadu_ps(k0));
        __m512 a1 = _mm512_mul_ps(qv[0], _mm512_loadu_ps(k0 + hd));
        __m512 a2 = _mm512_mul_ps(qv[0], _mm512_loadu_ps(k0 + 2 * hd));
        __m512 a3 = _mm512_mul_ps(qv[0], _mm512_loadu_ps(k0 + 3 * hd));
        for (int b = 1; b < NB; b++) {
            a0 = _mm512_fmadd_ps(qv[b], _mm512_loadu_ps(k0 + 16 * b), a0);
            a1 = _mm512_fmadd_ps(qv[b], _mm512_loadu_ps(k0 + hd + 16 * b), a1);
            a2 = _mm512_fmadd_ps(qv[b], _mm512_loadu_ps(k0 + 2 * hd + 16 * b), a2);
            a3 = _mm512_fmadd_ps(qv[b], _mm512_loadu_ps(k0 + 3 * hd + 16 * b), a3);
        }
        p[j] = scale * _mm512_reduce_add_ps(a0);
        p[j + 1] = scale * _mm512_reduce_add_ps(a1);
        p[j + 2] = scale * _mm512_reduce_add_ps(a2);
        p[j + 3] = scale * _mm512_reduce_add_ps(a3);
    }
    for (; j < S; j++) {
        const float *kj = K + (size_t)j * hd;
        __m512 a = _mm512_mul_ps(qv[0], _mm512_loadu_ps(kj));
        for (int b = 1; b < NB; b++) a = _mm512_fmadd_ps(qv[b], _mm512_loadu_ps(kj + 16 * b), a);
        p[j] = scale * _mm512_reduce_add_ps(a);
    }
    float m = -INFINITY;
    for (j = 0; j < S; j++) m = p[j] > m ? p[j] : m;
    tlm_softmax_row(p, S, m);
    /* two keys per step into separate sums: 2 x NB independent chains */
    __m512 e0[8], e1[8];
    for (int b = 0; b < NB; b++) e0[b] = e1[b] = _mm512_setzero_ps();
    for (j = 0; j + 2 <= S; j += 2) {
        const float *v0 = V + (size_t)j * hd;
        __m512 w0 = _mm512_set1_ps(p[j]), w1 = _mm512_set1_ps(p[j + 1]);
        for (int b = 0; b < NB; b++) {
            e0[b] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(v0 + 16 * b), e0[b]);
            e1[b] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(v0 + hd + 16 * b), e1[b]);
        }
    }
    if (j < S) {
        __m512 w0 = _mm512_set1_ps(p[j]);
        for (int b = 0; b < NB; b++)
            e0[b] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(V + (size_t)j * hd + 16 * b), e0[b]);
    }
    for (int b = 0; b < NB; b++) _mm512_storeu_ps(o + 16 * b, _mm512_add_ps(e0[b], e1[b]));
}

T5 static int attend_row_avx512(const float *q, const float *K, const float *V, int S, int hd,
                                float scale, float *p, float *o) {
    switch (hd) {
    case 32: row_avx512(2, q, K, V, S, scale, p, o); return 0;
    case 48: row_avx512(3, q, K, V, S, scale, p, o); return 0;
    case 64: row_avx512(4, q, K, V, S, scale, p, o); return 0;
    case 96: row_avx512(6, q, K, V, S, scale, p, o); return 0;
    case 128: row_avx512(8, q, K, V, S, scale, p, o); return 0;
    default: return -1;
    }
}
#define HAVE_AVX512 1
#else
#define HAVE_AVX512 0
#endif

int k_attend_row(const float *q, const float *K, const float *V, int S, int hd, float scale,
                 float *p, float *o) {
#if HAVE_AVX512
    if (S > 0 && k_isa() >= K_ISA_AVX512) return attend_row_avx512(q, K, V, S, hd, scale, p, o);
#else
    (void)q, (void)K, (void)V, (void)S, (void)hd, (void)scale, (void)p, (void)o;
#endif
    return -1;
}
