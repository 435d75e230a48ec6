/* The integer form of block-type weights in plain C: the repacking of each type's rows into
 * unsigned bytes u with w = s * u + m per sub-block, the activation rows' int8 quantization, and
 * the micro-kernel. These are the references every vector version is compared with (test_qgemm),
 * and what runs where the CPU has none. */
#include <math.h>
#include <string.h>

#include "core/dtype.h"
#include "core/half.h"
#include "core/quant.h"
#include "kernels/gemm_traits.h"
#include "kernels/qgemm.h"

static inline uint32_t rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline float rdh(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return core_f16_to_f32(h);
}

/* Four bits of a fifth-bit mask (bits j .. j + 3 of qh) as bit 4 of four bytes. */
static inline uint32_t bit4x4(uint32_t qh, int j) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= ((qh >> (j + i)) & 1u) << (8 * i + 4);
    return v;
}

/* Writes word kw (elements 4kw .. 4kw + 3) of row r of a group. */
static inline void put(uint8_t *q, int kw, int r, uint32_t v) {
    memcpy(q + (size_t)kw * 4 * K_QG_ROWS + 4 * r, &v, 4);
}

/* Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 (blocks of 32): byte j of qs holds element j (low nibble) and
 * j + 16 (high). */
void k_qgemm_pack_row_q8_0_q4_q5_ref(tlm_dtype t, const uint8_t *blk, int nb, int r, uint8_t *q,
                                     float *s, float *m) {
    for (int b = 0; b < nb; b++) {
        float d = rdh(blk), mn = 0.0f;
        const uint8_t *qs;
        uint32_t qh = 0;
        int hasqh = 0;
        switch (t) {
        case TLM_DTYPE_Q8_0:
            s[b * K_QG_ROWS + r] = d;
            m[b * K_QG_ROWS + r] = -128.0f * d;
            for (int j = 0; j < 8; j++) put(q, b * 8 + j, r, rd32(blk + 2 + 4 * j) ^ 0x80808080u);
            blk += sizeof(core_block_q8_0);
            continue;
        case TLM_DTYPE_Q4_0: qs = blk + 2, mn = -8.0f * d, blk += sizeof(core_block_q4_0); break;
        case TLM_DTYPE_Q4_1: mn = rdh(blk + 2), qs = blk + 4, blk += sizeof(core_block_q4_1); break;
        case TLM_DTYPE_Q5_0:
            qh = rd32(blk + 2), hasqh = 1, qs = blk + 6, mn = -16.0f * d;
            blk += sizeof(core_block_q5_0);
            break;
        default: /* Q5_1 */
            mn = rdh(blk + 2), qh = rd32(blk + 4), hasqh = 1, qs = blk + 8;
            blk += sizeof(core_block_q5_1);
            break;
        }
        s[b * K_QG_ROWS + r] = d;
        m[b * K_QG_ROWS + r] = mn;
        for (int j = 0; j < 4; j++) {
            uint32_t lo = rd32(qs + 4 * j) & 0x0F0F0F0Fu,
                     hi = (rd32(qs + 4 * j) >> 4) & 0x0F0F0F0Fu;
            if (hasqh) lo |= bit4x4(qh, 4 * j), hi |= bit4x4(qh, 16 + 4 * j);
            put(q, b * 8 + j, r, lo);
            put(q, b * 8 + 4 + j, r, hi);
        }
    }
}

/* Q4_K and Q5_K: sub-block 2g in the low nibbles of qs[32g ..], 2g + 1 in the high ones; the
 * fifth bit of element l of sub-block j is bit j of qh[l]. */
void k_qgemm_pack_row_q4_K_q5_K_ref(tlm_dtype t, const uint8_t *blk, int nb, int r, uint8_t *q,
                                    float *s, float *m) {
    size_t bytes = t == TLM_DTYPE_Q4_K ? sizeof(core_block_q4_k) : sizeof(core_block_q5_k);
    for (int b = 0; b < nb; b++, blk += bytes) {
        float d = rdh(blk), dmin = rdh(blk + 2);
        const uint8_t *scales = blk + 4, *qh = t == TLM_DTYPE_Q5_K ? blk + 16 : NULL;
        const uint8_t *qs = blk + (qh ? 48 : 16);
        for (int j = 0; j < 8; j++) {
            uint8_t sc, mn;
            core_q4k_scale_min(j, scales, &sc, &mn);
            s[(b * 8 + j) * K_QG_ROWS + r] = d * (float)sc;
            m[(b * 8 + j) * K_QG_ROWS + r] = -dmin * (float)mn;
            const uint8_t *g = qs + 32 * (j / 2);
            for (int w = 0; w < 8; w++) {
                uint32_t v = (rd32(g + 4 * w) >> (4 * (j & 1))) & 0x0F0F0F0Fu;
                if (qh) v |= ((rd32(qh + 4 * w) >> j) & 0x01010101u) << 4;
                put(q, b * 64 + j * 8 + w, r, v);
            }
        }
    }
}

/* Q6_K: per half of 128, element 32u + l takes a nibble of ql[l + 32 (u & 1)] (low for u < 2) and
 * bits 2u, 2u + 1 of qh[l]; sub-block e / 16 has scale d * scales[e / 16]. */
void k_qgemm_pack_row_q6_K_ref(tlm_dtype t, const uint8_t *blk, int nb, int r, uint8_t *q, float *s,
                               float *m) {
    for (int b = 0; b < nb; b++, blk += sizeof(core_block_q6_k)) {
        float d = rdh(blk + 208);
        for (int j = 0; j < 16; j++) {
            float sc = d * (float)(int8_t)blk[192 + j];
            s[(b * 16 + j) * K_QG_ROWS + r] = sc;
            m[(b * 16 + j) * K_QG_ROWS + r] = -32.0f * sc;
        }
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = blk + 64 * h, *qh = blk + 128 + 32 * h;
            for (int u = 0; u < 4; u++)
                for (int w = 0; w < 8; w++) {
                    uint32_t lo = rd32(ql + 32 * (u & 1) + 4 * w) >> (u < 2 ? 0 : 4);
                    uint32_t hi = (rd32(qh + 4 * w) >> (2 * u)) & 0x03030303u;
                    put(q, b * 64 + h * 32 + u * 8 + w, r, (lo & 0x0F0F0F0Fu) | hi << 4);
                }
        }
    }
}

/* Q2_K and Q3_K: element 32i + l of half h is plane i (bits 2i, 2i + 1) of qs[32h + l], Q3_K's
 * third bit bit 4h + i of hmask[l] (clear: 4 less, so q + 4 * bit with the offset -4 s). */
void k_qgemm_pack_row_q2_K_q3_K_ref(tlm_dtype t, const uint8_t *blk, int nb, int r, uint8_t *q,
                                    float *s, float *m) {
    int three = t == TLM_DTYPE_Q3_K;
    size_t bytes = three ? sizeof(core_block_q3_k) : sizeof(core_block_q2_k);
    for (int b = 0; b < nb; b++, blk += bytes) {
        const uint8_t *qs = blk + (three ? 32 : 16);
        for (int j = 0; j < 16; j++) {
            float *sj = &s[(b * 16 + j) * K_QG_ROWS + r], *mj = &m[(b * 16 + j) * K_QG_ROWS + r];
            if (three) {
                *sj = rdh(blk + 108) * (float)(core_q3k_scale(j, blk + 96) - 32);
                *mj = -4.0f * *sj;
            } else {
                *sj = rdh(blk + 80) * (float)(blk[j] & 15);
                *mj = -rdh(blk + 82) * (float)(blk[j] >> 4);
            }
        }
        for (int h = 0; h < 2; h++)
            for (int i = 0; i < 4; i++)
                for (int w = 0; w < 8; w++) {
                    uint32_t v = (rd32(qs + 32 * h + 4 * w) >> (2 * i)) & 0x03030303u;
                    if (three) v |= ((rd32(blk + 4 * w) >> (4 * h + i)) & 0x01010101u) << 2;
                    put(q, b * 64 + h * 32 + i * 8 + w, r, v);
                }
    }
}

/* IQ4_NL and IQ4_XS: each 32 values in Q4_0's layout, the table's level + 128 as the unsigned
 * byte with the offset -128 s (s: d, or IQ4_XS's d * (ls - 32)). */
void k_qgemm_pack_row_iq4_nl_xs_ref(tlm_dtype t, const uint8_t *blk, int nb, int r, uint8_t *q,
                                    float *s, float *m) {
    int xs = t == TLM_DTYPE_IQ4_XS, subs = xs ? 8 : 1;
    size_t bytes = xs ? sizeof(core_block_iq4_xs) : sizeof(core_block_iq4_nl);
    for (int b = 0; b < nb; b++, blk += bytes) {
        float d = rdh(blk);
        for (int j = 0; j < subs; j++) {
            int k = b * subs + j; /* sub-block number in the row */
            const uint8_t *qs = blk + (xs ? 8 + 16 * j : 2);
            float sj = xs ? d * (float)(core_iq4xs_scale(j, blk) - 32) : d;
            s[k * K_QG_ROWS + r] = sj;
            m[k * K_QG_ROWS + r] = -128.0f * sj;
            for (int w = 0; w < 4; w++) {
                uint32_t lo = 0, hi = 0;
                for (int i = 0; i < 4; i++) {
                    lo |= (uint32_t)(uint8_t)(core_iq4nl_values[qs[4 * w + i] & 15] + 128) << 8 * i;
                    hi |= (uint32_t)(uint8_t)(core_iq4nl_values[qs[4 * w + i] >> 4] + 128) << 8 * i;
                }
                put(q, k * 8 + w, r, lo);
                put(q, k * 8 + 4 + w, r, hi);
            }
        }
    }
}

void k_qgemm_pack(const tlm_weight *w, int r0, int nrows, uint8_t *q, float *s, float *m) {
    const k_gemm_ops *ops = k_gemm_ops_of(w->dtype);
    int n = (int)w->cols, sub = ops->sub;
    int nb = n / (int)core_dtype_get(w->dtype)->block_elems;
    for (int r = 0; r < K_QG_ROWS; r++) {
        if (r >= nrows) {
            for (int k = 0; k < n / 4; k++) put(q, k, r, 0);
            for (int j = 0; j < n / sub; j++) s[j * K_QG_ROWS + r] = m[j * K_QG_ROWS + r] = 0.0f;
            continue;
        }
        const uint8_t *row = (const uint8_t *)w->data + (size_t)(r0 + r) * w->row_bytes;
        ops->pack_row(w->dtype, row, nb, r, q, s, m);
    }
}

void k_qgemm_quantize(const float *x, int n, int sub, int8_t *q, float *d, float *ds) {
    /* Blocks of 32 with an fp32 scale (Q8_0's form without its f16 rounding of the scale). The
     * sums let the offset m of each weight sub-block enter once per sub-block, not per element. */
    for (int b = 0; b < n / 32; b++, x += 32, q += 32) {
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) {
            float a = fabsf(x[i]);
            amax = a > amax ? a : amax;
        }
        float dd = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
        d[b] = dd;
        for (int h = 0; h < 32 / sub; h++) {
            int sum = 0;
            for (int i = h * sub; i < (h + 1) * sub; i++) {
                /* rintf (ties to even): the product cannot be fused into an add as in the
                 * 2^23 trick, so the vector version's results are the same */
                q[i] = (int8_t)rintf(x[i] * id);
                sum += q[i];
            }
            ds[b * (32 / sub) + h] = dd * (float)sum;
        }
    }
}

/* The reference: the same operations in the same order as the vector kernel (so that the two
 * agree exactly), one output at a time. */
void k_qgemm_micro_16x8_ref(const k_gemm_ops *ops, int n, const uint8_t *q, const float *s,
                            const float *m, const int8_t *xq, const float *xd, const float *xs,
                            int na, float *out) {
    int sub = ops->sub, nsb = n / sub, nb32 = n / 32;
    for (int a = 0; a < na; a++)
        for (int r = 0; r < K_QG_ROWS; r++) {
            float acc = 0.0f;
            for (int b = 0; b < nsb; b++) {
                int32_t isum = 0;
                for (int k = b * sub; k < (b + 1) * sub; k++)
                    isum += (int32_t)q[(size_t)(k / 4) * 4 * K_QG_ROWS + 4 * r + k % 4] *
                            xq[(size_t)a * n + k];
                float t = (float)isum * s[b * K_QG_ROWS + r];
                acc = fmaf(t, xd[a * nb32 + b * sub / 32], acc);
                acc = fmaf(m[b * K_QG_ROWS + r], xs[a * nsb + b], acc);
            }
            out[a * K_QG_ROWS + r] = acc;
        }
}
