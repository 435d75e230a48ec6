/* Each type's dot product in plain C (ref/ref.h): the definition every vector kernel is tested
 * against, and what runs where the CPU has no vector version. Per block the integer sums of
 * llama.cpp's kernels, scaled in its order. */
#include <string.h>

#include "core/half.h"
#include "core/quant.h"
#include "kernels/qdot_simd.h"
#include "kernels/ref/ref.h"

static float load_f16(const void *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return core_f16_to_f32(h);
}

void k_vec_dot_f32_f32_ref(int n, float *s, const void *w, const void *xq) {
    const float *a = w, *x = xq;
    float acc = 0.0f;
    for (int i = 0; i < n; i++) acc += a[i] * x[i];
    *s = acc;
}

void k_vec_dot_f16_f32_ref(int n, float *s, const void *w, const void *xq) {
    const uint8_t *a = w;
    const float *x = xq;
    float acc = 0.0f;
    for (int i = 0; i < n; i++) acc += load_f16(a + 2 * i) * x[i];
    *s = acc;
}

void k_vec_dot_bf16_bf16_ref(int n, float *s, const void *w, const void *xq) {
    const uint8_t *a = w, *x = xq;
    float acc = 0.0f;
    for (int i = 0; i < n; i++) {
        uint16_t p, q;
        memcpy(&p, a + 2 * i, 2);
        memcpy(&q, x + 2 * i, 2);
        acc += core_bf16_to_f32(p) * core_bf16_to_f32(q);
    }
    *s = acc;
}

/* The 32-element types: per block an integer sum, then scaled as llama.cpp does. */
void k_vec_dot_q8_0_q8_0_ref(int n, float *s, const void *w, const void *xq) {
    const uint8_t *wb = w;
    const core_block_q8_0 *x = xq;
    float acc = 0.0f;
    for (int b = 0; b < n / CORE_QK; b++, wb += sizeof(core_block_q8_0)) {
        core_block_q8_0 blk;
        memcpy(&blk, wb, sizeof blk);
        int sum = 0;
        for (int i = 0; i < CORE_QK; i++) sum += blk.qs[i] * x[b].qs[i];
        acc += (float)sum * (core_f16_to_f32(blk.d) * core_f16_to_f32(x[b].d));
    }
    *s = acc;
}

void k_vec_dot_q4_0_q8_0_ref(int n, float *s, const void *w, const void *xq) {
    const uint8_t *wb = w;
    const core_block_q8_0 *x = xq;
    float acc = 0.0f;
    for (int b = 0; b < n / CORE_QK; b++, wb += sizeof(core_block_q4_0)) {
        core_block_q4_0 blk;
        memcpy(&blk, wb, sizeof blk);
        int sum = 0;
        for (int j = 0; j < 16; j++)
            sum += ((blk.qs[j] & 0xF) - 8) * x[b].qs[j] + ((blk.qs[j] >> 4) - 8) * x[b].qs[j + 16];
        acc += (float)sum * (core_f16_to_f32(blk.d) * core_f16_to_f32(x[b].d));
    }
    *s = acc;
}

void k_vec_dot_q4_1_q8_0_ref(int n, float *s, const void *w, const void *xq) {
    const uint8_t *wb = w;
    const core_block_q8_0 *x = xq;
    float acc = 0.0f;
    for (int b = 0; b < n / CORE_QK; b++, wb += sizeof(core_block_q4_1)) {
        core_block_q4_1 blk;
        memcpy(&blk, wb, sizeof blk);
        int sum = 0, xs = 0;
        for (int j = 0; j < 16; j++) {
            sum += (blk.qs[j] & 0xF) * x[b].qs[j] + (blk.qs[j] >> 4) * x[b].qs[j + 16];
            xs += x[b].qs[j] + x[b].qs[j + 16];
        }
        float xd = core_f16_to_f32(x[b].d);
        acc +=
            (float)sum * (core_f16_to_f32(blk.d) * xd) + core_f16_to_f32(blk.m) * (xd * (float)xs);
    }
    *s = acc;
}

/* Q5_0 (off 16, no min) and Q5_1 (min m, off 0). */
static void dot_q5_ref(int n, float *s, const void *w, const void *xq, int has_min) {
    const uint8_t *wb = w;
    const core_block_q8_0 *x = xq;
    size_t bytes = has_min ? sizeof(core_block_q5_1) : sizeof(core_block_q5_0);
    float acc = 0.0f;
    for (int b = 0; b < n / CORE_QK; b++, wb += bytes) {
        float d, m = 0.0f;
        uint8_t qhb[4], qs[16];
        d = load_f16(wb);
        if (has_min) m = load_f16(wb + 2);
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
        float xd = core_f16_to_f32(x[b].d);
        acc += (float)sum * (d * xd) + m * (xd * (float)xs);
    }
    *s = acc;
}
void k_vec_dot_q5_0_q8_0_ref(int n, float *s, const void *w, const void *xq) {
    dot_q5_ref(n, s, w, xq, 0);
}
void k_vec_dot_q5_1_q8_0_ref(int n, float *s, const void *w, const void *xq) {
    dot_q5_ref(n, s, w, xq, 1);
}

/* Q4_K and Q5_K (qh != NULL): per sub-block of 32, sc * sum(q * x) in integers, and the mins
 * through the activation's sums of 16. */
static void dot_q45k_ref(int n, float *s, const void *w, const void *xq, int five) {
    const uint8_t *wb = w;
    const k_block_q8_k *x = xq;
    size_t bytes = five ? sizeof(core_block_q5_k) : sizeof(core_block_q4_k);
    float acc = 0.0f;
    for (int b = 0; b < n / CORE_QK_K; b++, wb += bytes) {
        float d = load_f16(wb), dmin = load_f16(wb + 2);
        const uint8_t *scales = wb + 4, *qh = five ? wb + 16 : NULL, *q = wb + (five ? 48 : 16);
        const int8_t *a = x[b].qs;
        int sumi = 0, summ = 0;
        for (int g = 0; g < 4; g++, q += 32, a += 64) {
            uint8_t sc0, mn0, sc1, mn1;
            core_q4k_scale_min(2 * g, scales, &sc0, &mn0);
            core_q4k_scale_min(2 * g + 1, scales, &sc1, &mn1);
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
void k_vec_dot_q4_K_q8_K_ref(int n, float *s, const void *w, const void *xq) {
    dot_q45k_ref(n, s, w, xq, 0);
}
void k_vec_dot_q5_K_q8_K_ref(int n, float *s, const void *w, const void *xq) {
    dot_q45k_ref(n, s, w, xq, 1);
}

void k_vec_dot_q6_K_q8_K_ref(int n, float *s, const void *w, const void *xq) {
    const uint8_t *wb = w;
    const k_block_q8_k *x = xq;
    float acc = 0.0f;
    for (int b = 0; b < n / CORE_QK_K; b++, wb += sizeof(core_block_q6_k)) {
        const uint8_t *ql = wb, *qh = wb + 128;
        const int8_t *sc = (const int8_t *)(wb + 192), *a = x[b].qs;
        float d = load_f16(wb + 208);
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
    for (int e = 16 * j; e < 16 * j + 16; e++) sum += core_q23k_level(qs, hmask, e) * a[e];
    return sum;
}

void k_vec_dot_q2_K_q8_K_ref(int n, float *s, const void *w, const void *xq) {
    const uint8_t *wb = w;
    const k_block_q8_k *x = xq;
    float acc = 0.0f;
    for (int b = 0; b < n / CORE_QK_K; b++, wb += sizeof(core_block_q2_k)) {
        const uint8_t *sc = wb;
        int sumi = 0, summ = 0;
        for (int j = 0; j < 16; j++) {
            sumi += (sc[j] & 15) * q23k_sub(wb + 16, NULL, j, x[b].qs);
            summ += (sc[j] >> 4) * x[b].bsums[j];
        }
        acc += x[b].d * load_f16(wb + 80) * (float)sumi - x[b].d * load_f16(wb + 82) * (float)summ;
    }
    *s = acc;
}

void k_vec_dot_q3_K_q8_K_ref(int n, float *s, const void *w, const void *xq) {
    const uint8_t *wb = w;
    const k_block_q8_k *x = xq;
    float acc = 0.0f;
    for (int b = 0; b < n / CORE_QK_K; b++, wb += sizeof(core_block_q3_k)) {
        int sumi = 0;
        for (int j = 0; j < 16; j++)
            sumi += (core_q3k_scale(j, wb + 96) - 32) * q23k_sub(wb + 32, wb, j, x[b].qs);
        acc += load_f16(wb + 108) * x[b].d * (float)sumi;
    }
    *s = acc;
}

/* IQ4_NL against Q8_0 blocks, IQ4_XS against Q8_K: the table's levels times the activation's
 * int8 values, in integers per block (sub-block), scaled as llama.cpp scales them. */
static int iq4_sub(const uint8_t *qs, const int8_t *a) {
    int sum = 0;
    for (int j = 0; j < 16; j++)
        sum += core_iq4nl_values[qs[j] & 15] * a[j] + core_iq4nl_values[qs[j] >> 4] * a[j + 16];
    return sum;
}

void k_vec_dot_iq4_nl_q8_0_ref(int n, float *s, const void *w, const void *xq) {
    const uint8_t *wb = w;
    const core_block_q8_0 *x = xq;
    float acc = 0.0f;
    for (int b = 0; b < n / CORE_QK; b++, wb += sizeof(core_block_iq4_nl))
        acc += load_f16(wb) * load_f16(&x[b].d) * (float)iq4_sub(wb + 2, x[b].qs);
    *s = acc;
}

void k_vec_dot_iq4_xs_q8_K_ref(int n, float *s, const void *w, const void *xq) {
    const uint8_t *wb = w;
    const k_block_q8_k *x = xq;
    float acc = 0.0f;
    for (int b = 0; b < n / CORE_QK_K; b++, wb += sizeof(core_block_iq4_xs)) {
        int sumi = 0;
        for (int j = 0; j < 8; j++)
            sumi += (core_iq4xs_scale(j, wb) - 32) * iq4_sub(wb + 8 + 16 * j, x[b].qs + 32 * j);
        acc += load_f16(wb) * x[b].d * (float)sumi;
    }
    *s = acc;
}

/* The references as an instruction set of their own (qdot_simd.h). */
const k_isa_kernels k_kernels_ref = {
    .type =
        {
            [TLM_DTYPE_F32] = {.vec_dot = k_vec_dot_f32_f32_ref},
            [TLM_DTYPE_F16] = {.vec_dot = k_vec_dot_f16_f32_ref},
            [TLM_DTYPE_BF16] = {.vec_dot = k_vec_dot_bf16_bf16_ref},
            [TLM_DTYPE_Q8_0] = {.vec_dot = k_vec_dot_q8_0_q8_0_ref},
            [TLM_DTYPE_Q4_0] = {.vec_dot = k_vec_dot_q4_0_q8_0_ref},
            [TLM_DTYPE_Q4_1] = {.vec_dot = k_vec_dot_q4_1_q8_0_ref},
            [TLM_DTYPE_Q5_0] = {.vec_dot = k_vec_dot_q5_0_q8_0_ref},
            [TLM_DTYPE_Q5_1] = {.vec_dot = k_vec_dot_q5_1_q8_0_ref},
            [TLM_DTYPE_IQ4_NL] = {.vec_dot = k_vec_dot_iq4_nl_q8_0_ref},
            [TLM_DTYPE_Q2_K] = {.vec_dot = k_vec_dot_q2_K_q8_K_ref},
            [TLM_DTYPE_Q3_K] = {.vec_dot = k_vec_dot_q3_K_q8_K_ref},
            [TLM_DTYPE_Q4_K] = {.vec_dot = k_vec_dot_q4_K_q8_K_ref},
            [TLM_DTYPE_Q5_K] = {.vec_dot = k_vec_dot_q5_K_q8_K_ref},
            [TLM_DTYPE_Q6_K] = {.vec_dot = k_vec_dot_q6_K_q8_K_ref},
            [TLM_DTYPE_IQ4_XS] = {.vec_dot = k_vec_dot_iq4_xs_q8_K_ref},
        },
    .act_quantize = {[K_ACT_F32] = k_act_quantize_f32_ref,
                     [K_ACT_BF16] = k_act_quantize_bf16_ref,
                     [K_ACT_Q8_0] = k_act_quantize_q8_0_ref,
                     [K_ACT_Q8_K] = k_act_quantize_q8_K_ref},
    .q8_0_blocks = k_q8_0_blocks_ref,
};
