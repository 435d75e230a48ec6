#include "qdot.h"

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/half.h"
#include "core/quant.h"
#include "qdot_simd.h"

/* ---- activation rows ------------------------------------------------------------------------ */

static int isa_cap = K_ISA_COUNT; /* k_isa_cap */

/* The instruction set the kernels are chosen at: the CPU's (TLM_ISA capped), under k_isa_cap. */
static int isa_top(void) { return k_isa() < isa_cap ? k_isa() : isa_cap; }

k_act_kind k_act_of(tlm_dtype t) {
    switch (t) {
    case TLM_DTYPE_F32:
    case TLM_DTYPE_F16: return K_ACT_F32;
    case TLM_DTYPE_BF16: return K_ACT_BF16;
    case TLM_DTYPE_Q8_0:
    case TLM_DTYPE_Q4_0:
    case TLM_DTYPE_Q4_1:
    case TLM_DTYPE_Q5_0:
    case TLM_DTYPE_Q5_1:
    case TLM_DTYPE_IQ4_NL: return K_ACT_Q8_0;
    case TLM_DTYPE_Q4_K:
    case TLM_DTYPE_Q5_K:
    case TLM_DTYPE_Q6_K:
    case TLM_DTYPE_Q2_K:
    case TLM_DTYPE_Q3_K:
    case TLM_DTYPE_IQ4_XS: return K_ACT_Q8_K;
    default: return K_ACT_NONE;
    }
}

size_t k_act_row_bytes(tlm_dtype t, int n) {
    switch (k_act_of(t)) {
    case K_ACT_F32: return (size_t)n * sizeof(float);
    case K_ACT_BF16: return (size_t)n * sizeof(uint16_t);
    case K_ACT_Q8_0: return k_act_q8_0_nib_at(n) + (size_t)(n / 128) * K_ACT_NIB_BYTES;
    case K_ACT_Q8_K: return k_act_q8_k_nib_at(n) + (size_t)(n / TLM_QK_K) * TLM_QK_K;
    default: return 0;
    }
}

void k_act_quantize(k_act_kind kind, const float *x, void *xq, int n) {
    int isa = isa_top();
    if (isa >= K_ISA_AVX2 && k_simd_act_quantize(kind, x, xq, n, isa)) return;
    k_act_quantize_ref(kind, x, xq, n);
}

/* ---- reference dot products ----------------------------------------------------------------- */

static float h2f(const void *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return tlm_f16_to_f32(h);
}

static void ref_f32(int n, float *s, const void *w, const void *xq) {
    const float *a = w, *x = xq;
    float acc = 0.0f;
    for (int i = 0; i < n; i++) acc += a[i] * x[i];
    *s = acc;
}

static void ref_f16(int n, float *s, const void *w, const void *xq) {
    const uint8_t *a = w;
    const float *x = xq;
    float acc = 0.0f;
    for (int i = 0; i < n; i++) acc += h2f(a + 2 * i) * x[i];
    *s = acc;
}

static void ref_bf16(int n, float *s, const void *w, const void *xq) {
    const uint8_t *a = w, *x = xq;
    float acc = 0.0f;
    for (int i = 0; i < n; i++) {
        uint16_t p, q;
        memcpy(&p, a + 2 * i, 2);
        memcpy(&q, x + 2 * i, 2);
        acc += tlm_bf16_to_f32(p) * tlm_bf16_to_f32(q);
    }
    *s = acc;
}

/* The 32-element types: per block an integer sum, then scaled as llama.cpp does. */
static void ref_q8_0(int n, float *s, const void *w, const void *xq) {
    const uint8_t *wb = w;
    const tlm_block_q8_0 *x = xq;
    float acc = 0.0f;
    for (int b = 0; b < n / TLM_QK; b++, wb += sizeof(tlm_block_q8_0)) {
        tlm_block_q8_0 blk;
        memcpy(&blk, wb, sizeof blk);
        int sum = 0;
        for (int i = 0; i < TLM_QK; i++) sum += blk.qs[i] * x[b].qs[i];
        acc += (float)sum * (tlm_f16_to_f32(blk.d) * tlm_f16_to_f32(x[b].d));
    }
    *s = acc;
}

static void ref_q4_0(int n, float *s, const void *w, const void *xq) {
    const uint8_t *wb = w;
    const tlm_block_q8_0 *x = xq;
    float acc = 0.0f;
    for (int b = 0; b < n / TLM_QK; b++, wb += sizeof(tlm_block_q4_0)) {
        tlm_block_q4_0 blk;
        memcpy(&blk, wb, sizeof blk);
        int sum = 0;
        for (int j = 0; j < 16; j++)
            sum += ((blk.qs[j] & 0xF) - 8) * x[b].qs[j] + ((blk.qs[j] >> 4) - 8) * x[b].qs[j + 16];
        acc += (float)sum * (tlm_f16_to_f32(blk.d) * tlm_f16_to_f32(x[b].d));
    }
    *s = acc;
}

static void ref_q4_1(int n, float *s, const void *w, const void *xq) {
    const uint8_t *wb = w;
    const tlm_block_q8_0 *x = xq;
    float acc = 0.0f;
    for (int b = 0; b < n / TLM_QK; b++, wb += sizeof(tlm_block_q4_1)) {
        tlm_block_q4_1 blk;
        memcpy(&blk, wb, sizeof blk);
        int sum = 0, xs = 0;
        for (int j = 0; j < 16; j++) {
            sum += (blk.qs[j] & 0xF) * x[b].qs[j] + (blk.qs[j] >> 4) * x[b].qs[j + 16];
            xs += x[b].qs[j] + x[b].qs[j + 16];
        }
        float xd = tlm_f16_to_f32(x[b].d);
        acc += (float)sum * (tlm_f16_to_f32(blk.d) * xd) + tlm_f16_to_f32(blk.m) * (xd * (float)xs);
    }
    *s = acc;
}

/* Q5_0 (off 16, no min) and Q5_1 (min m, off 0). */
static void ref_q5(int n, float *s, const void *w, const void *xq, int has_min) {
    const uint8_t *wb = w;
    const tlm_block_q8_0 *x = xq;
    size_t bytes = has_min ? sizeof(tlm_block_q5_1) : sizeof(tlm_block_q5_0);
    float acc = 0.0f;
    for (int b = 0; b < n / TLM_QK; b++, wb += bytes) {
        float d, m = 0.0f;
        uint8_t qhb[4], qs[16];
        d = h2f(wb);
        if (has_min) m = h2f(wb + 2);
        memcpy(qhb, wb + (has_min ? 4 : 2), 4);
        memcpy(qs, wb + (has_min ? 8 : 6), 16);
        uint32_t qh = (uint32_t)qhb[0] | (uint32_t)qhb[1] << 8 | (uint32_t)qhb[2] << 16 |
                      (uint32_t)qhb[3] << 24;
        int off = has_min ? 0 : 16, sum = 0, xs = 0;
        for (int j = 0; j < 16; j++) {
            int q0 = (int)((qs[j] & 0xF) | (((qh >> j) << 4) & 0x10)) - off;
            int q1 = (int)((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) - off;
            sum += q0 * x[b].qs[j] + q1 * x[b].qs[j + 16];
            xs += x[b].qs[j] + x[b].qs[j + 16];
        }
        float xd = tlm_f16_to_f32(x[b].d);
        acc += (float)sum * (d * xd) + m * (xd * (float)xs);
    }
    *s = acc;
}
static void ref_q5_0(int n, float *s, const void *w, const void *xq) { ref_q5(n, s, w, xq, 0); }
static void ref_q5_1(int n, float *s, const void *w, const void *xq) { ref_q5(n, s, w, xq, 1); }

/* Q4_K and Q5_K (qh != NULL): per sub-block of 32, sc * sum(q * x) in integers, and the mins
 * through the activation's sums of 16. */
static void ref_q45k(int n, float *s, const void *w, const void *xq, int five) {
    const uint8_t *wb = w;
    const k_block_q8_k *x = xq;
    size_t bytes = five ? sizeof(tlm_block_q5_k) : sizeof(tlm_block_q4_k);
    float acc = 0.0f;
    for (int b = 0; b < n / TLM_QK_K; b++, wb += bytes) {
        float d = h2f(wb), dmin = h2f(wb + 2);
        const uint8_t *scales = wb + 4, *qh = five ? wb + 16 : NULL, *q = wb + (five ? 48 : 16);
        const int8_t *a = x[b].qs;
        int sumi = 0, summ = 0;
        for (int g = 0; g < 4; g++, q += 32, a += 64) {
            uint8_t sc0, mn0, sc1, mn1;
            tlm_q4k_scale_min(2 * g, scales, &sc0, &mn0);
            tlm_q4k_scale_min(2 * g + 1, scales, &sc1, &mn1);
            int s0 = 0, s1 = 0;
            for (int l = 0; l < 32; l++) {
                int h0 = qh ? ((qh[l] >> (2 * g)) & 1) << 4 : 0;
                int h1 = qh ? ((qh[l] >> (2 * g + 1)) & 1) << 4 : 0;
                s0 += ((q[l] & 0xF) + h0) * a[l];
                s1 += ((q[l] >> 4) + h1) * a[l + 32];
            }
            sumi += sc0 * s0 + sc1 * s1;
            summ += mn0 * (x[b].bsums[4 * g] + x[b].bsums[4 * g + 1]) +
                    mn1 * (x[b].bsums[4 * g + 2] + x[b].bsums[4 * g + 3]);
        }
        acc += x[b].d * d * (float)sumi - x[b].d * dmin * (float)summ;
    }
    *s = acc;
}
static void ref_q4_k(int n, float *s, const void *w, const void *xq) { ref_q45k(n, s, w, xq, 0); }
static void ref_q5_k(int n, float *s, const void *w, const void *xq) { ref_q45k(n, s, w, xq, 1); }

static void ref_q6_k(int n, float *s, const void *w, const void *xq) {
    const uint8_t *wb = w;
    const k_block_q8_k *x = xq;
    float acc = 0.0f;
    for (int b = 0; b < n / TLM_QK_K; b++, wb += sizeof(tlm_block_q6_k)) {
        const uint8_t *ql = wb, *qh = wb + 128;
        const int8_t *sc = (const int8_t *)(wb + 192), *a = x[b].qs;
        float d = h2f(wb + 208);
        int sumi = 0;
        for (int h = 0; h < 2; h++, ql += 64, qh += 32, sc += 8, a += 128) {
            int sub[8] = {0};
            for (int l = 0; l < 32; l++) {
                int q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32;
                int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                sub[l / 16] += q1 * a[l];
                sub[2 + l / 16] += q2 * a[l + 32];
                sub[4 + l / 16] += q3 * a[l + 64];
                sub[6 + l / 16] += q4 * a[l + 96];
            }
            for (int k = 0; k < 8; k++) sumi += sc[k] * sub[k];
        }
        acc += d * x[b].d * (float)sumi;
    }
    *s = acc;
}

/* Q2_K and Q3_K: sub-block j's (of 16) integer sum against the activation's qs. */
static int q23k_sub(const uint8_t *qs, const uint8_t *hmask, int j, const int8_t *a) {
    int sum = 0;
    for (int e = 16 * j; e < 16 * j + 16; e++) sum += tlm_q23k_level(qs, hmask, e) * a[e];
    return sum;
}

static void ref_q2_k(int n, float *s, const void *w, const void *xq) {
    const uint8_t *wb = w;
    const k_block_q8_k *x = xq;
    float acc = 0.0f;
    for (int b = 0; b < n / TLM_QK_K; b++, wb += sizeof(tlm_block_q2_k)) {
        const uint8_t *sc = wb;
        int sumi = 0, summ = 0;
        for (int j = 0; j < 16; j++) {
            sumi += (sc[j] & 15) * q23k_sub(wb + 16, NULL, j, x[b].qs);
            summ += (sc[j] >> 4) * x[b].bsums[j];
        }
        acc += x[b].d * h2f(wb + 80) * (float)sumi - x[b].d * h2f(wb + 82) * (float)summ;
    }
    *s = acc;
}

static void ref_q3_k(int n, float *s, const void *w, const void *xq) {
    const uint8_t *wb = w;
    const k_block_q8_k *x = xq;
    float acc = 0.0f;
    for (int b = 0; b < n / TLM_QK_K; b++, wb += sizeof(tlm_block_q3_k)) {
        int sumi = 0;
        for (int j = 0; j < 16; j++)
            sumi += (tlm_q3k_scale(j, wb + 96) - 32) * q23k_sub(wb + 32, wb, j, x[b].qs);
        acc += h2f(wb + 108) * x[b].d * (float)sumi;
    }
    *s = acc;
}

/* IQ4_NL against Q8_0 blocks, IQ4_XS against Q8_K: the table's levels times the activation's
 * int8 values, in integers per block (sub-block), scaled as llama.cpp scales them. */
static int iq4_sub(const uint8_t *qs, const int8_t *a) {
    int sum = 0;
    for (int j = 0; j < 16; j++)
        sum += tlm_iq4nl_values[qs[j] & 15] * a[j] + tlm_iq4nl_values[qs[j] >> 4] * a[j + 16];
    return sum;
}

static void ref_iq4_nl(int n, float *s, const void *w, const void *xq) {
    const uint8_t *wb = w;
    const tlm_block_q8_0 *x = xq;
    float acc = 0.0f;
    for (int b = 0; b < n / TLM_QK; b++, wb += sizeof(tlm_block_iq4_nl))
        acc += h2f(wb) * h2f(&x[b].d) * (float)iq4_sub(wb + 2, x[b].qs);
    *s = acc;
}

static void ref_iq4_xs(int n, float *s, const void *w, const void *xq) {
    const uint8_t *wb = w;
    const k_block_q8_k *x = xq;
    float acc = 0.0f;
    for (int b = 0; b < n / TLM_QK_K; b++, wb += sizeof(tlm_block_iq4_xs)) {
        int sumi = 0;
        for (int j = 0; j < 8; j++)
            sumi += (tlm_iq4xs_scale(j, wb) - 32) * iq4_sub(wb + 8 + 16 * j, x[b].qs + 32 * j);
        acc += h2f(wb) * x[b].d * (float)sumi;
    }
    *s = acc;
}

/* ---- dispatch ------------------------------------------------------------------------------- */

static k_vdot_fn ref_of(tlm_dtype t) {
    switch (t) {
    case TLM_DTYPE_F32: return ref_f32;
    case TLM_DTYPE_F16: return ref_f16;
    case TLM_DTYPE_BF16: return ref_bf16;
    case TLM_DTYPE_Q8_0: return ref_q8_0;
    case TLM_DTYPE_Q4_0: return ref_q4_0;
    case TLM_DTYPE_Q4_1: return ref_q4_1;
    case TLM_DTYPE_Q5_0: return ref_q5_0;
    case TLM_DTYPE_Q5_1: return ref_q5_1;
    case TLM_DTYPE_Q4_K: return ref_q4_k;
    case TLM_DTYPE_Q5_K: return ref_q5_k;
    case TLM_DTYPE_Q6_K: return ref_q6_k;
    case TLM_DTYPE_Q2_K: return ref_q2_k;
    case TLM_DTYPE_Q3_K: return ref_q3_k;
    case TLM_DTYPE_IQ4_NL: return ref_iq4_nl;
    case TLM_DTYPE_IQ4_XS: return ref_iq4_xs;
    default: return NULL;
    }
}

static int isa_level = -1, isa_avxvnni;
static pthread_once_t isa_once = PTHREAD_ONCE_INIT;

/* TLM_ISA=avx2 runs as a CPU with AVX2 alone would (Haswell to Zen 3), =avxvnni as one with AVX2
 * and AVX-VNNI (Intel's client cores since Alder Lake), =ref the plain C references. */
static void isa_detect(void) {
    int lvl = k_cpu()->isa;
    const char *cap = getenv("TLM_ISA");
    int vnni = k_cpu()->avxvnni;
    if (cap && !strcmp(cap, "ref")) lvl = K_ISA_REF;
    if (cap && !strcmp(cap, "avx2")) vnni = 0;
    if (cap && (!strcmp(cap, "avx2") || !strcmp(cap, "avxvnni")) && lvl > K_ISA_AVX2)
        lvl = K_ISA_AVX2;
    isa_level = lvl;
    isa_avxvnni = vnni && lvl >= K_ISA_AVX2;
}

int k_isa(void) {
    pthread_once(&isa_once, isa_detect);
    return isa_level;
}

static _Atomic int avxvnni_cap = 1; /* k_avxvnni_cap */

int k_avxvnni(void) {
    pthread_once(&isa_once, isa_detect);
    return isa_avxvnni && atomic_load_explicit(&avxvnni_cap, memory_order_relaxed);
}

void k_avxvnni_cap(int on) { atomic_store(&avxvnni_cap, on); }

int k_cpu_amd(void) { return k_cpu()->amd; }

k_vdot_fn k_vdot_get(tlm_dtype t, int isa) {
    if (isa < 0 || isa >= K_ISA_COUNT) return NULL;
    if (isa == K_ISA_REF) return ref_of(t);
    if (isa > k_cpu()->isa) return NULL;
    return k_simd_vdot(t, isa);
}

void k_isa_cap(int isa) { isa_cap = isa; }

k_vdot_fn k_vdot(tlm_dtype t) {
    for (int isa = isa_top(); isa > K_ISA_REF; isa--) {
        k_vdot_fn f = k_simd_vdot(t, isa);
        if (f) return f;
    }
    return ref_of(t);
}

k_vdot_rows_fn k_vdot_rows_get(tlm_dtype t, int isa) {
    if (isa <= K_ISA_REF || isa >= K_ISA_COUNT || isa > k_cpu()->isa) return NULL;
    return k_simd_vdot_rows(t, isa);
}

k_vdot_rows_fn k_vdot_rows(tlm_dtype t) {
    for (int isa = isa_top(); isa > K_ISA_REF; isa--) {
        k_vdot_rows_fn f = k_simd_vdot_rows(t, isa);
        /* a type with its own dot product at a higher level must not fall to a lower one here */
        if (f || k_simd_vdot(t, isa)) return f;
    }
    return NULL;
}

k_vdot_rows3_fn k_vdot_rows3(tlm_dtype t) {
    return isa_top() >= K_ISA_AVX512 ? k_simd_vdot_rows3(t, K_ISA_AVX512) : NULL;
}

/* The four-row kernel of the level the one-row kernels are chosen at (its sums are theirs). */
k_vdot_w4_fn k_vdot_w4(tlm_dtype t) {
    int top = isa_top();
    return top >= K_ISA_AVX512 ? k_simd_vdot_w4(t, K_ISA_AVX512)
           : top >= K_ISA_AVX2 ? k_simd_vdot_w4(t, K_ISA_AVX2)
                               : NULL;
}

void k_widen_row(tlm_dtype t, const void *src, float *dst, int n) {
    if (k_isa() >= K_ISA_AVX2 && k_simd_widen(t, src, dst, n)) return;
    tlm_dtype_to_f32(t, src, dst, (size_t)n);
}

void k_q8_0_blocks(const float *x, void *y, int n) {
    if (k_isa() >= K_ISA_AVX512 && k_simd_q8_0_blocks(x, y, n)) return;
    k_q8_0_blocks_ref(x, y, n);
}

tlm_status k_quantize_rows(tlm_dtype t, const float *x, void *y, size_t rows, size_t cols,
                           const float *qw) {
    if ((t == TLM_DTYPE_IQ4_NL || t == TLM_DTYPE_IQ4_XS) && cols <= INT_MAX) {
        size_t rb = tlm_dtype_bytes(t, cols);
        size_t r = 0;
        while (r < rows && rb &&
               k_simd_iq4_blocks(t, x + r * cols, (uint8_t *)y + r * rb, (int)cols, qw))
            r++;
        if (r == rows) return TLM_OK;
    }
    return tlm_quantize_rows(t, x, y, rows, cols, qw);
}

void k_narrow_row(tlm_dtype t, const float *src, void *dst, int n) {
    if (k_isa() >= K_ISA_AVX2 && k_simd_narrow(t, src, dst, n)) return;
    k_quantize_rows(t, src, dst, 1, (size_t)n, NULL);
}

/* ---- scratch -------------------------------------------------------------------------------- */

#define K_SCRATCH_SLOTS 2
typedef struct {
    void *p[K_SCRATCH_SLOTS];
    size_t n[K_SCRATCH_SLOTS];
} scratch_set;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static int scratch_ok;

static void scratch_free(void *v) {
    scratch_set *s = v;
    for (int i = 0; i < K_SCRATCH_SLOTS; i++) free(s->p[i]);
    free(s);
}

static void scratch_init(void) { scratch_ok = pthread_key_create(&scratch_key, scratch_free) == 0; }

void *k_scratch(int slot, size_t bytes) {
    pthread_once(&scratch_once, scratch_init);
    if (!scratch_ok || slot < 0 || slot >= K_SCRATCH_SLOTS) return NULL;
    scratch_set *s = pthread_getspecific(scratch_key);
    if (!s) {
        s = calloc(1, sizeof *s);
        if (!s || pthread_setspecific(scratch_key, s)) {
            free(s);
            return NULL;
        }
    }
    if (s->n[slot] < bytes) {
        /* 64-byte aligned so that vector loads of activation rows never split a line needlessly */
        size_t want = (bytes + 63) & ~(size_t)63;
        void *p = NULL;
        if (posix_memalign(&p, 64, want)) return NULL;
        free(s->p[slot]);
        s->p[slot] = p;
        s->n[slot] = want;
    }
    return s->p[slot];
}
