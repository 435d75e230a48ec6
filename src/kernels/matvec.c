#include "matvec.h"

#include "core/dtype.h"
#include "kernels.h"
#include "qdot.h"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

/* Four dot products of w0..w3 with x, written to out[0..3]. Four rows share each load of x and
 * give the FMA units four independent chains. */
static inline void dot4(float out[4], const float *w0, const float *w1, const float *w2,
                        const float *w3, const float *x, int n) {
    int i = 0;
#if defined(__AVX512F__)
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(),
           a3 = _mm512_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        __m512 xv = _mm512_loadu_ps(x + i);
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w0 + i), xv, a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w1 + i), xv, a1);
        a2 = _mm512_fmadd_ps(_mm512_loadu_ps(w2 + i), xv, a2);
        a3 = _mm512_fmadd_ps(_mm512_loadu_ps(w3 + i), xv, a3);
    }
    if (i < n) {
        __mmask16 k = (__mmask16)((1u << (n - i)) - 1u);
        __m512 xv = _mm512_maskz_loadu_ps(k, x + i);
        a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, w0 + i), xv, a0);
        a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, w1 + i), xv, a1);
        a2 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, w2 + i), xv, a2);
        a3 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, w3 + i), xv, a3);
        i = n;
    }
    out[0] = _mm512_reduce_add_ps(a0);
    out[1] = _mm512_reduce_add_ps(a1);
    out[2] = _mm512_reduce_add_ps(a2);
    out[3] = _mm512_reduce_add_ps(a3);
#elif defined(__AVX2__) && defined(__FMA__)
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(),
           a3 = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        __m256 xv = _mm256_loadu_ps(x + i);
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + i), xv, a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + i), xv, a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + i), xv, a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + i), xv, a3);
    }
    float t[4][8];
    _mm256_storeu_ps(t[0], a0);
    _mm256_storeu_ps(t[1], a1);
    _mm256_storeu_ps(t[2], a2);
    _mm256_storeu_ps(t[3], a3);
    for (int r = 0; r < 4; r++) {
        float s = 0.0f;
        for (int j = 0; j < 8; j++) s += t[r][j];
        out[r] = s;
    }
#else
    out[0] = out[1] = out[2] = out[3] = 0.0f;
#endif
    for (; i < n; i++) {
        out[0] += w0[i] * x[i];
        out[1] += w1[i] * x[i];
        out[2] += w2[i] * x[i];
        out[3] += w3[i] * x[i];
    }
}

static inline float dot1(const float *w, const float *x, int n) {
    float r[4];
    /* The same row four times keeps one code path; this only runs for the last out % 4 rows. */
    dot4(r, w, w, w, w, x, n);
    return r[0];
}

/* Without memory for the activation rows: w_row widened a chunk at a time on the stack. */
static float widen_dot(tlm_dtype t, const uint8_t *w, const float *x, int in) {
    float buf[256], acc = 0.0f;
    const tlm_dtype_info *d = tlm_dtype_get(t);
    for (int i = 0; i < in; i += 256) {
        int n = in - i < 256 ? in - i : 256;
        tlm_dtype_to_f32(t, w + (size_t)(i / (int)d->block_elems) * d->block_bytes, buf, (size_t)n);
        for (int k = 0; k < n; k++) acc += buf[k] * x[i + k];
    }
    return acc;
}

#define K_TYPED_PAR_MIN (1L << 19)

/* Parts of several types: each non-F32 type's dot product (qdot.h) over activation rows prepared
 * once per kind. */
static void matvec_typed(float *y, int ldy, const float *x, int M, int in,
                         const k_matvec_part *parts, int n, long work) {
    size_t off[K_ACT_NONE], total = 0;
    for (int k = 0; k < K_ACT_NONE; k++) off[k] = (size_t)-1;
    for (int p = 0; p < n; p++) {
        k_act_kind kind = k_act_of(parts[p].dtype);
        if (kind == K_ACT_F32 || off[kind] != (size_t)-1) continue;
        off[kind] = total;
        total += (size_t)M * ((k_act_row_bytes(parts[p].dtype, in) + 63) & ~(size_t)63);
    }
    uint8_t *act = total ? k_scratch(0, total) : NULL;
    if (total && act) {
        for (int k = 0; k < K_ACT_NONE; k++) {
            if (off[k] == (size_t)-1) continue;
            size_t rb = 0;
            for (int p = 0; p < n && !rb; p++)
                if ((int)k_act_of(parts[p].dtype) == k) rb = k_act_row_bytes(parts[p].dtype, in);
            rb = (rb + 63) & ~(size_t)63;
            for (int m = 0; m < M; m++)
                k_act_quantize((k_act_kind)k, x + (size_t)m * in, act + off[k] + m * rb, in);
        }
    }
    /* What each part's rows need, worked out once here rather than per unit or per row. */
    long first[K_LINEAR_MAX_PARTS + 1];
    k_vdot_fn dots[K_LINEAR_MAX_PARTS];
    const uint8_t *acts[K_LINEAR_MAX_PARTS];
    size_t rbs[K_LINEAR_MAX_PARTS];
    first[0] = 0;
    for (int p = 0; p < n; p++) {
        first[p + 1] = first[p] + (parts[p].out + 3) / 4;
        k_act_kind kind = k_act_of(parts[p].dtype);
        dots[p] = k_vdot(parts[p].dtype);
        rbs[p] = (k_act_row_bytes(parts[p].dtype, in) + 63) & ~(size_t)63;
        acts[p] = kind == K_ACT_F32 ? (const uint8_t *)x : act ? act + off[kind] : NULL;
        if (kind == K_ACT_F32) rbs[p] = (size_t)in * sizeof(float);
    }
    long units = first[n];
    /* A decode step's typed rows cost a few ns each; waking the team (passive waits: a futex per
     * thread) costs tens of microseconds, which only the larger products repay. */
#pragma omp parallel for schedule(static) if (work * M * in >= K_TYPED_PAR_MIN)
    for (long u = 0; u < units; u++) {
        int p = 0;
        while (u >= first[p + 1]) p++;
        const k_matvec_part *P = &parts[p];
        int j = (int)(u - first[p]) * 4, rows = P->out - j < 4 ? P->out - j : 4;
        k_vdot_fn dot = dots[p];
        const uint8_t *a = acts[p];
        size_t rb = rbs[p];
        const uint8_t *w0 = (const uint8_t *)P->w + (size_t)j * P->row_bytes;
        for (int m = 0; m < M; m++) {
            const float *xm = x + (size_t)m * in;
            float r[4];
            for (int k = 0; k < rows; k++) {
                const uint8_t *wr = w0 + (size_t)k * P->row_bytes;
                if (P->dtype == TLM_DTYPE_F32)
                    r[k] = dot1((const float *)(const void *)wr, xm, in);
                else if (a)
                    dot(in, &r[k], wr, a + m * rb);
                else
                    r[k] = widen_dot(P->dtype, wr, xm, in);
            }
            float *ym = y + (size_t)m * ldy + P->col + j;
            for (int k = 0; k < rows; k++) ym[k] = P->b ? r[k] + P->b[j + k] : r[k];
        }
    }
}

void k_matvec_parts(float *y, int ldy, const float *x, int M, int in, const k_matvec_part *parts,
                    int n) {
    /* Units of four output rows, numbered across the parts, so that one parallel region covers
     * every part (q, k and v of one layer), not one region each. */
    long first[K_LINEAR_MAX_PARTS + 1], work = 0;
    int typed = 0;
    first[0] = 0;
    for (int p = 0; p < n; p++) {
        first[p + 1] = first[p] + (parts[p].out + 3) / 4;
        work += (long)parts[p].out;
        if (parts[p].dtype != TLM_DTYPE_F32) typed = 1;
    }
    if (typed) {
        matvec_typed(y, ldy, x, M, in, parts, n, work);
        return;
    }
    long units = first[n];
    /* Below ~64K multiply-adds a fork/join costs more than it saves. */
#pragma omp parallel for schedule(static) if (work * M * in >= 65536)
    for (long u = 0; u < units; u++) {
        int p = 0;
        while (u >= first[p + 1]) p++;
        const k_matvec_part *P = &parts[p];
        int j = (int)(u - first[p]) * 4, rows = P->out - j < 4 ? P->out - j : 4;
        size_t stride = P->row_bytes / sizeof(float);
        const float *w0 = (const float *)P->w + (size_t)j * stride;
        for (int m = 0; m < M; m++) {
            const float *xm = x + (size_t)m * in;
            float r[4];
            if (rows == 4) {
                dot4(r, w0, w0 + stride, w0 + 2 * stride, w0 + 3 * stride, xm, in);
            } else {
                for (int k = 0; k < rows; k++) r[k] = dot1(w0 + (size_t)k * stride, xm, in);
            }
            float *ym = y + (size_t)m * ldy + P->col + j;
            for (int k = 0; k < rows; k++) ym[k] = P->b ? r[k] + P->b[j + k] : r[k];
        }
    }
}
