/* Quantizers with an importance matrix (llama-quantize --imatrix): ggml's quantize_*_impl, byte for
 * byte, each type's row function its core_dtype_info's from_f32_imatrix (dtype.c). Built with
 * -ffp-contract=off, as the reference quantizers (quant_ref.c) are. */
#include <math.h>
#include <string.h>

#include "core/half.h"
#include "core/quant.h"
#include "core/quant_impl.h"

/* ggml's make_qp_quants: non-negative values (a super-block's sub-block scales or mins) to levels
 * in [0, nmax] under one scale, chosen among nine candidates by the weighted squared error, then
 * up to five passes moving single levels where that improves sumlx^2 / suml2. */
static float make_qp_quants(int n, int nmax, const float *x, uint8_t *L, const float *qw) {
    float max = 0;
    for (int i = 0; i < n; ++i) max = max > x[i] ? max : x[i];
    if (max < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float iscale = nmax / max;
    for (int i = 0; i < n; ++i) L[i] = (uint8_t)nearest_int(iscale * x[i]);
    float scale = 1 / iscale, best_mse = 0;
    for (int i = 0; i < n; ++i) {
        float diff = x[i] - scale * L[i];
        best_mse += qw[i] * diff * diff;
    }
    for (int is = -4; is <= 4; ++is) {
        if (is == 0) continue;
        float iscale_is = (0.1f * is + nmax) / max, scale_is = 1 / iscale_is, mse = 0;
        for (int i = 0; i < n; ++i) {
            int l = imin(nmax, nearest_int(iscale_is * x[i]));
            float diff = x[i] - scale_is * l;
            mse += qw[i] * diff * diff;
        }
        if (mse < best_mse) {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        int l = imin(nmax, nearest_int(iscale * x[i]));
        L[i] = (uint8_t)l;
        sumlx += qw[i] * x[i] * l;
        suml2 += qw[i] * l * l;
    }
    for (int itry = 0; itry < 5; ++itry) {
        int n_changed = 0;
        for (int i = 0; i < n; ++i) {
            float w = qw[i];
            float slx = sumlx - w * x[i] * L[i], sl2 = suml2 - w * L[i] * L[i];
            if (slx > 0 && sl2 > 0) {
                int new_l = imin(nmax, nearest_int(x[i] * sl2 / slx));
                if (new_l != L[i]) {
                    slx += w * x[i] * new_l;
                    sl2 += w * new_l * new_l;
                    if (slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (uint8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        ++n_changed;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* The importance weights of ggml's *_impl quantizers: the matrix's weight of each column times
 * sqrt(sigma2 + x^2), sigma2 a mean square of the values (of the row for the 32-element types, of
 * the super-block for the K types). */
static float imp_weights(int n, const float *x, const float *qw, float sigma2, float *w) {
    float sum = 0; /* their total, added in order as ggml adds it */
    for (int j = 0; j < n; ++j) w[j] = qw[j] * sqrtf(sigma2 + x[j] * x[j]);
    for (int j = 0; j < n; ++j) sum += w[j];
    return sum;
}

static float mean_square(const float *x, size_t n) {
    float s = 0;
    for (size_t j = 0; j < n; ++j) s += x[j] * x[j];
    return s / n;
}

/* Q4_0 and Q5_0 (symmetric, core_make_qx_quants on the weights), Q4_1 and Q5_1 (a min,
 * core_make_qkx2_quants' search as ggml's make_qkx3_quants runs it), one block of 32. */
static void q4_0w(const float *x, const float *w, core_block_q4_0 *y) {
    int8_t L[CORE_QK];
    y->d = core_f32_to_f16(core_make_qx_quants(CORE_QK, 8, x, L, w));
    for (int j = 0; j < 16; ++j) y->qs[j] = (uint8_t)(L[j] | (L[j + 16] << 4));
}

static void q5_0w(const float *x, const float *w, core_block_q5_0 *y) {
    int8_t L[CORE_QK];
    y->d = core_f32_to_f16(core_make_qx_quants(CORE_QK, 16, x, L, w));
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
        const uint8_t xi0 = (uint8_t)L[j], xi1 = (uint8_t)L[j + 16];
        y->qs[j] = (uint8_t)((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
        qh |= ((xi0 & 0x10u) >> 4) << j;
        qh |= ((xi1 & 0x10u) >> 4) << (j + 16);
    }
    put_qh(y->qh, qh);
}

static float qkx3(int n, int nmax, const float *x, const float *w, uint8_t *L, float *the_min) {
    uint8_t Laux[32];
    return core_make_qkx2_quants(n, nmax, x, w, L, the_min, Laux, -0.9f, 0.05f, 36, 0);
}

static void q4_1w(const float *x, const float *w, core_block_q4_1 *y) {
    uint8_t L[CORE_QK];
    float min, d = qkx3(CORE_QK, 15, x, w, L, &min);
    y->d = core_f32_to_f16(d);
    y->m = core_f32_to_f16(-min);
    for (int j = 0; j < 16; ++j) y->qs[j] = (uint8_t)(L[j] | (L[j + 16] << 4));
}

static void q5_1w(const float *x, const float *w, core_block_q5_1 *y) {
    uint8_t L[CORE_QK];
    float min, d = qkx3(CORE_QK, 31, x, w, L, &min);
    y->d = core_f32_to_f16(d);
    y->m = core_f32_to_f16(-min);
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
        const uint8_t xi0 = L[j], xi1 = L[j + 16];
        y->qs[j] = (uint8_t)((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
        qh |= ((xi0 & 0x10u) >> 4) << j;
        qh |= ((xi1 & 0x10u) >> 4) << (j + 16);
    }
    put_qh(y->qh, qh);
}

/* Q4_K and Q5_K: eight sub-blocks of 32 fitted with their importance weights, then the scales
 * and mins to 6 bits by make_qp_quants weighted by each sub-block's total weight (in place of the
 * reference's scaling against the largest). */
static void k45w(const float *x, const float *qw, int nmax, uint8_t *scales12, uint16_t *dd,
                 uint16_t *dmin, uint8_t *L) {
    uint8_t Ls[8], Lm[8];
    float weights[32], sw[8], mins[8], scales[8];
    float sigma2 = 2 * mean_square(x, CORE_QK_K);
    for (int j = 0; j < 8; ++j) {
        sw[j] = imp_weights(32, x + 32 * j, qw + 32 * j, sigma2, weights);
        scales[j] = qkx3(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j]);
    }
    float d_block = make_qp_quants(8, 63, scales, Ls, sw);
    float m_block = make_qp_quants(8, 63, mins, Lm, sw);
    memset(scales12, 0, 12);
    for (int j = 0; j < 8; ++j) {
        uint8_t ls = Ls[j], lm = Lm[j];
        if (nmax == 31) { /* ggml clamps Q5_K's (and not Q4_K's) */
            ls = ls < 63 ? ls : 63;
            lm = lm < 63 ? lm : 63;
        }
        core_q45k_put_scale_min(j, ls, lm, scales12);
    }
    *dd = core_f32_to_f16(d_block);
    *dmin = core_f32_to_f16(m_block);
    core_q45k_requantize(x, scales12, *dd, *dmin, nmax, L);
}

static void q4_kw(const float *x, const float *qw, core_block_q4_k *y) {
    uint8_t L[CORE_QK_K];
    k45w(x, qw, 15, y->scales, &y->d, &y->dmin, L);
    uint8_t *q = y->qs;
    for (int j = 0; j < CORE_QK_K; j += 64, q += 32)
        for (int l = 0; l < 32; ++l) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
}

static void q5_kw(const float *x, const float *qw, core_block_q5_k *y) {
    uint8_t L[CORE_QK_K];
    k45w(x, qw, 31, y->scales, &y->d, &y->dmin, L);
    core_q5k_pack(L, y);
}

static void q6_kw(const float *x, const float *qw, core_block_q6_k *y) { core_q6k_fit(x, qw, y); }

/* Q2_K: sixteen sub-blocks of 16 fitted with their weights, the scales and mins to 4 bits by
 * make_qp_quants, every value requantized with the stored ones. */
static void q2_kw(const float *x, const float *qw, core_block_q2_k *y) {
    uint8_t L[CORE_QK_K], Ls[16], Lm[16];
    float weight[16], sw[16], mins[16], scales[16];
    float sigma2 = mean_square(x, CORE_QK_K);
    for (int j = 0; j < 16; ++j) {
        sw[j] = imp_weights(16, x + 16 * j, qw + 16 * j, sigma2, weight);
        scales[j] = qkx3(16, 3, x + 16 * j, weight, L + 16 * j, &mins[j]);
    }
    float dm = make_qp_quants(16, 15, scales, Ls, sw);
    float mm = make_qp_quants(16, 15, mins, Lm, sw);
    y->d = core_f32_to_f16(dm);
    y->dmin = core_f32_to_f16(mm);
    dm = core_f16_to_f32(y->d);
    mm = core_f16_to_f32(y->dmin);
    for (int j = 0; j < 16; ++j) y->scales[j] = (uint8_t)(Ls[j] | (Lm[j] << 4));
    for (int j = 0; j < 16; ++j) {
        const float d = dm * (y->scales[j] & 0xF);
        if (!d) continue;
        const float m = mm * (y->scales[j] >> 4);
        for (int ii = 0; ii < 16; ++ii) {
            int l = nearest_int((x[16 * j + ii] + m) / d);
            L[16 * j + ii] = (uint8_t)imax(0, imin(3, l));
        }
    }
    core_q23k_pack_planes(L, y->qs);
}

/* Q3_K: sixteen sub-blocks of 16 by the weighted core_make_qx_quants, their scales to 6 bits by the
 * same fit weighted by each sub-block's total weight. */
static void q3_kw(const float *x, const float *qw, core_block_q3_k *y) {
    int8_t L[CORE_QK_K], Ls[16];
    float scales[16], weight[16], sw[16];
    float sigma2 = 2 * mean_square(x, CORE_QK_K);
    for (int j = 0; j < 16; ++j) {
        sw[j] = imp_weights(16, x + 16 * j, qw + 16 * j, sigma2, weight);
        scales[j] = core_make_qx_quants(16, 4, x + 16 * j, L + 16 * j, weight);
    }
    memset(y->scales, 0, 12);
    float d_block = core_make_qx_quants(16, 32, scales, Ls, sw);
    for (int j = 0; j < 16; ++j) core_q3k_put_scale(j, Ls[j], y->scales);
    y->d = core_f32_to_f16(d_block);
    core_q3k_finish(x, L, y);
}

/* ---- rows: each type's from_f32_imatrix (dtype.c's table) ----------------------------------- */

/* The 32-element types weigh each block by the matrix and the row's mean square (imp_weights). */
#define ROW_WEIGHED_BY_ROW(t)                                                                      \
    void core_from_f32_imatrix_##t(const float *src, void *dst, size_t cols, const float *qw) {    \
        uint8_t *out = dst;                                                                        \
        float sigma2 = mean_square(src, cols), weight[CORE_QK];                                    \
        for (size_t b = 0; b < cols / CORE_QK; b++) {                                              \
            const float *xb = src + b * CORE_QK;                                                   \
            imp_weights(CORE_QK, xb, qw + b * CORE_QK, sigma2, weight);                            \
            core_block_##t blk;                                                                    \
            t##w(xb, weight, &blk);                                                                \
            memcpy(out + b * sizeof blk, &blk, sizeof blk);                                        \
        }                                                                                          \
    }
ROW_WEIGHED_BY_ROW(q4_0)
ROW_WEIGHED_BY_ROW(q4_1)
ROW_WEIGHED_BY_ROW(q5_0)
ROW_WEIGHED_BY_ROW(q5_1)

/* The others take the matrix's weights of each block as they are. */
#define ROW_WEIGHED_BY_BLOCK(t, QK, call)                                                          \
    void core_from_f32_imatrix_##t(const float *src, void *dst, size_t cols, const float *qw) {    \
        uint8_t *out = dst;                                                                        \
        for (size_t b = 0; b < cols / (QK); b++) {                                                 \
            const float *xb = src + b * (QK), *wb = qw + b * (QK);                                 \
            core_block_##t blk;                                                                    \
            call;                                                                                  \
            memcpy(out + b * sizeof blk, &blk, sizeof blk);                                        \
        }                                                                                          \
    }
ROW_WEIGHED_BY_BLOCK(q2_k, CORE_QK_K, q2_kw(xb, wb, &blk))
ROW_WEIGHED_BY_BLOCK(q3_k, CORE_QK_K, q3_kw(xb, wb, &blk))
ROW_WEIGHED_BY_BLOCK(q4_k, CORE_QK_K, q4_kw(xb, wb, &blk))
ROW_WEIGHED_BY_BLOCK(q5_k, CORE_QK_K, q5_kw(xb, wb, &blk))
ROW_WEIGHED_BY_BLOCK(q6_k, CORE_QK_K, q6_kw(xb, wb, &blk))
ROW_WEIGHED_BY_BLOCK(iq4_nl, CORE_QK, core_iq4_quant(xb, 1, &blk.d, blk.qs, NULL, NULL, wb))
ROW_WEIGHED_BY_BLOCK(iq4_xs, CORE_QK_K,
                     core_iq4_quant(xb, 8, &blk.d, blk.qs, &blk.scales_h, blk.scales_l, wb))
