/* Reference quantizers: floats to the ggml block types, byte for byte what ggml's reference
 * quantizers write (quantize_row_*_ref in ggml-quants.c, which llama-quantize uses when it has no
 * importance matrix). Files we write are then the files llama.cpp writes, and a test compares the
 * two on random rows.
 *
 * Identity needs ggml's exact float arithmetic: every expression below keeps ggml's order of
 * operations and its conversions, and this file is compiled with -ffp-contract=off (see
 * CMakeLists.txt), since a fused multiply-add rounds once where ggml rounds twice. */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <string.h>

#include "core/core.h"
#include "core/dtype.h"
#include "core/half.h"
#include "core/quant.h"

#define GROUP_MAX_EPS 1e-15f

static int imin(int a, int b) { return a < b ? a : b; }
static int imax(int a, int b) { return a > b ? a : b; }

/* ggml converts floats to small integers with plain C casts, which x86-64 performs with
 * cvttss2si: truncation, and INT_MIN for NaN and anything out of range (a block whose scale is
 * subnormal has an infinite inverse). The same result without undefined behaviour. */
static int trunc_i32(float v) {
    if (!(v > -2147483648.0f && v < 2147483648.0f)) return INT_MIN;
    return (int)v;
}

/* ggml's nearest_int: round half to even by adding 1.5 * 2^23 and reading the mantissa. */
static int nearest_int(float fval) {
    float val = fval + 12582912.f;
    int32_t i;
    memcpy(&i, &val, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

static void q8_0(const float *x, tlm_block_q8_0 *y) {
    float amax = 0.0f;
    for (int j = 0; j < TLM_QK; j++) {
        float a = fabsf(x[j]);
        amax = amax > a ? amax : a; /* ggml's MAX(amax, a): a NaN is skipped only when first */
    }
    const float d = amax / ((1 << 7) - 1);
    const float id = d ? 1.0f / d : 0.0f;
    y->d = tlm_f32_to_f16(d);
    for (int j = 0; j < TLM_QK; ++j) y->qs[j] = (int8_t)trunc_i32(roundf(x[j] * id));
}

/* Q4_0 and Q5_0: the value of largest magnitude maps to -2^(bits-1), keeping its sign. */
static float absmax_signed(const float *x) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < TLM_QK; j++)
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    return max;
}

static void q4_0(const float *x, tlm_block_q4_0 *y) {
    const float d = absmax_signed(x) / -8;
    const float id = d ? 1.0f / d : 0.0f;
    y->d = tlm_f32_to_f16(d);
    for (int j = 0; j < TLM_QK / 2; ++j) {
        const float x0 = x[j] * id, x1 = x[TLM_QK / 2 + j] * id;
        const uint8_t xi0 = (uint8_t)imin(15, (int8_t)trunc_i32(x0 + 8.5f));
        const uint8_t xi1 = (uint8_t)imin(15, (int8_t)trunc_i32(x1 + 8.5f));
        y->qs[j] = (uint8_t)(xi0 | xi1 << 4);
    }
}

static void minmax(const float *x, float *min, float *max) {
    *min = FLT_MAX;
    *max = -FLT_MAX;
    for (int j = 0; j < TLM_QK; j++) {
        if (x[j] < *min) *min = x[j];
        if (x[j] > *max) *max = x[j];
    }
}

static void q4_1(const float *x, tlm_block_q4_1 *y) {
    float min, max;
    minmax(x, &min, &max);
    const float d = (max - min) / ((1 << 4) - 1);
    const float id = d ? 1.0f / d : 0.0f;
    y->d = tlm_f32_to_f16(d);
    y->m = tlm_f32_to_f16(min);
    for (int j = 0; j < TLM_QK / 2; ++j) {
        const float x0 = (x[j] - min) * id, x1 = (x[TLM_QK / 2 + j] - min) * id;
        const uint8_t xi0 = (uint8_t)imin(15, (int8_t)trunc_i32(x0 + 0.5f));
        const uint8_t xi1 = (uint8_t)imin(15, (int8_t)trunc_i32(x1 + 0.5f));
        y->qs[j] = (uint8_t)(xi0 | xi1 << 4);
    }
}

/* The fifth bits of Q5_0 and Q5_1: element j's in bit j of a little-endian uint32. */
static void put_qh(uint8_t qh[4], uint32_t bits) {
    for (int i = 0; i < 4; i++) qh[i] = (uint8_t)(bits >> (8 * i));
}

static void q5_0(const float *x, tlm_block_q5_0 *y) {
    const float d = absmax_signed(x) / -16;
    const float id = d ? 1.0f / d : 0.0f;
    y->d = tlm_f32_to_f16(d);
    uint32_t qh = 0;
    for (int j = 0; j < TLM_QK / 2; ++j) {
        const float x0 = x[j] * id, x1 = x[TLM_QK / 2 + j] * id;
        const uint8_t xi0 = (uint8_t)imin(31, (int8_t)trunc_i32(x0 + 16.5f));
        const uint8_t xi1 = (uint8_t)imin(31, (int8_t)trunc_i32(x1 + 16.5f));
        y->qs[j] = (uint8_t)((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
        qh |= ((xi0 & 0x10u) >> 4) << j;
        qh |= ((xi1 & 0x10u) >> 4) << (j + TLM_QK / 2);
    }
    put_qh(y->qh, qh);
}

static void q5_1(const float *x, tlm_block_q5_1 *y) {
    float min, max;
    minmax(x, &min, &max);
    const float d = (max - min) / ((1 << 5) - 1);
    const float id = d ? 1.0f / d : 0.0f;
    y->d = tlm_f32_to_f16(d);
    y->m = tlm_f32_to_f16(min);
    uint32_t qh = 0;
    for (int j = 0; j < TLM_QK / 2; ++j) {
        const float x0 = (x[j] - min) * id, x1 = (x[TLM_QK / 2 + j] - min) * id;
        /* no clamp to 31 here, as in ggml: x0 <= 31 + rounding */
        const uint8_t xi0 = (uint8_t)trunc_i32(x0 + 0.5f);
        const uint8_t xi1 = (uint8_t)trunc_i32(x1 + 0.5f);
        y->qs[j] = (uint8_t)((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
        qh |= ((xi0 & 0x10u) >> 4) << j;
        qh |= ((xi1 & 0x10u) >> 4) << (j + TLM_QK / 2);
    }
    put_qh(y->qh, qh);
}

/* ggml's make_qkx2_quants (K types with a min): for n values with weights, the scale and min of
 * L in [0, nmax] that minimise the weighted squared error (mad: absolute error, Q2_K's), searching
 * nstep + 1 candidate inverse scales around nmax / (max - min) and solving the least-squares fit
 * for each. Returns the scale; *the_min gets minus the min (ggml stores mins as positive numbers
 * subtracted). */
static float make_qkx2_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L,
                              float *the_min, uint8_t *Laux, float rmin, float rdelta, int nstep,
                              int mad) {
    float min = x[0], max = x[0];
    float sum_w = weights[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; ++i) {
        int l = nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)imax(0, imin(nmax, l));
        float diff = scale * L[i] + min - x[i];
        diff = mad ? fabsf(diff) : diff * diff;
        float w = weights[i];
        best_error += w * diff;
    }
    for (int is = 0; is <= nstep; ++is) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; ++i) {
            int l = nearest_int(iscale * (x[i] - min));
            l = imax(0, imin(nmax, l));
            Laux[i] = (uint8_t)l;
            float w = weights[i];
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; ++i) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                diff = mad ? fabsf(diff) : diff * diff;
                float w = weights[i];
                cur_error += w * diff;
            }
            if (cur_error < best_error) {
                for (int i = 0; i < n; ++i) L[i] = Laux[i];
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* The value of largest magnitude of x[0..n) into *max (the first of equals), for the symmetric
 * fits below; 0 where all are (about) zero. */
static int signed_max(int n, const float *x, float *max) {
    float amax = 0;
    *max = 0;
    for (int i = 0; i < n; ++i) {
        float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            *max = x[i];
        }
    }
    return amax >= GROUP_MAX_EPS;
}

/* The levels of x at iscale, nearest and clamped to [-nmax, nmax - 1] (into L + off unless L is
 * NULL), and their sums sumlx and suml2 weighted by qw (an importance matrix's weights) or, where
 * qw is NULL, by x^2: the pass that ggml's make_qx_quants and make_q3_quants start from, and
 * make_qx_quants repeats for each candidate scale. */
static void levels_at(int n, int nmax, const float *x, const float *qw, float iscale, int8_t *L,
                      int off, float *sumlx, float *suml2) {
    float slx = 0, sl2 = 0;
    for (int i = 0; i < n; ++i) {
        int l = nearest_int(iscale * x[i]);
        l = imax(-nmax, imin(nmax - 1, l));
        if (L) L[i] = (int8_t)(l + off);
        float w = qw ? qw[i] : x[i] * x[i];
        slx += w * x[i] * l;
        sl2 += w * l * l;
    }
    *sumlx = slx;
    *suml2 = sl2;
}

/* ggml's make_qx_quants with rmse_type 1: symmetric L in [-nmax, nmax - 1] (stored + nmax),
 * weights qw (importance; Q6_K, Q3_K, Q4_0 and Q5_0 with a matrix) or x^2 where qw is NULL (Q6_K
 * without one), and 18 candidate scales around the one that maps the value of largest magnitude
 * to -nmax. */
static float make_qx_quants(int n, int nmax, const float *x, int8_t *L, const float *qw) {
    float max;
    if (!signed_max(n, x, &max)) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float sumlx, suml2;
    levels_at(n, nmax, x, qw, -nmax / max, L, nmax, &sumlx, &suml2);
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; ++is) {
        if (is == 0) continue;
        float iscale = -(nmax + 0.1f * is) / max;
        levels_at(n, nmax, x, qw, iscale, NULL, 0, &sumlx, &suml2);
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            levels_at(n, nmax, x, qw, iscale, L, nmax, &sumlx, &suml2);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Sub-block j's 6-bit scale ls and min lm into Q4_K / Q5_K's 12 bytes (zeroed first): j < 4 in
 * bytes j and j + 4, the others' low four bits in byte j + 4 and their top two bits in the top
 * of bytes j - 4 and j. */
static void put_scale_min(int j, uint8_t ls, uint8_t lm, uint8_t *scales12) {
    if (j < 4) {
        scales12[j] = ls;
        scales12[j + 4] = lm;
    } else {
        scales12[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
        scales12[j - 4] |= (uint8_t)((ls >> 4) << 6);
        scales12[j] |= (uint8_t)((lm >> 4) << 6);
    }
}

/* Every value of a Q4_K / Q5_K super-block requantized with the stored (rounded) scales and mins;
 * a sub-block whose scale is 0 keeps the fit's levels, as ggml does. */
static void k45_requantize(const float *x, const uint8_t *scales12, uint16_t dd, uint16_t dmin,
                           int nmax, uint8_t *L) {
    for (int j = 0; j < TLM_QK_K / 32; ++j) {
        uint8_t sc, m;
        tlm_q4k_scale_min(j, scales12, &sc, &m);
        const float d = tlm_f16_to_f32(dd) * sc;
        if (!d) continue;
        const float dm = tlm_f16_to_f32(dmin) * m;
        for (int ii = 0; ii < 32; ++ii) {
            int l = nearest_int((x[32 * j + ii] + dm) / d);
            L[32 * j + ii] = (uint8_t)imax(0, imin(nmax, l));
        }
    }
}

/* Q4_K and Q5_K share everything but the bit count: eight sub-blocks of 32, each fitted by
 * make_qkx2_quants, their scales and mins quantized to 6 bits against the super-block's largest,
 * then every value requantized with the stored (rounded) scales. */
static void k_scales_and_levels(const float *x, int nmax, float rmin, int nstep, uint8_t *scales12,
                                uint16_t *dd, uint16_t *dmin, uint8_t *L) {
    uint8_t Laux[32];
    float weights[32], mins[TLM_QK_K / 32], scales[TLM_QK_K / 32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < TLM_QK_K / 32; ++j) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
        float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; ++l) weights[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux,
                                     rmin, 0.1f, nstep, 0);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    memset(scales12, 0, 12);
    for (int j = 0; j < TLM_QK_K / 32; ++j) {
        uint8_t ls = (uint8_t)nearest_int(inv_scale * scales[j]);
        uint8_t lm = (uint8_t)nearest_int(inv_min * mins[j]);
        ls = ls < 63 ? ls : 63;
        lm = lm < 63 ? lm : 63;
        put_scale_min(j, ls, lm, scales12);
    }
    *dd = tlm_f32_to_f16(max_scale / 63.f);
    *dmin = tlm_f32_to_f16(max_min / 63.f);
    k45_requantize(x, scales12, *dd, *dmin, nmax, L);
}

static void q4_k(const float *x, tlm_block_q4_k *y) {
    uint8_t L[TLM_QK_K];
    k_scales_and_levels(x, 15, -1.f, 20, y->scales, &y->d, &y->dmin, L);
    uint8_t *q = y->qs;
    for (int j = 0; j < TLM_QK_K; j += 64, q += 32)
        for (int l = 0; l < 32; ++l) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
}

/* Q5_K's levels (0-31) into the block: low nibbles in qs as Q4_K's, fifth bits in qh. */
static void q5_k_pack(const uint8_t *L, tlm_block_q5_k *y) {
    uint8_t *qh = y->qh, *ql = y->qs;
    memset(qh, 0, TLM_QK_K / 8);
    uint8_t m1 = 1, m2 = 2;
    for (int n = 0; n < TLM_QK_K; n += 64, ql += 32) {
        for (int j = 0; j < 32; ++j) {
            int l1 = L[n + j], l2 = L[n + j + 32];
            if (l1 > 15) {
                l1 -= 16;
                qh[j] |= m1;
            }
            if (l2 > 15) {
                l2 -= 16;
                qh[j] |= m2;
            }
            ql[j] = (uint8_t)(l1 | (l2 << 4));
        }
        m1 = (uint8_t)(m1 << 2);
        m2 = (uint8_t)(m2 << 2);
    }
}

static void q5_k(const float *x, tlm_block_q5_k *y) {
    uint8_t L[TLM_QK_K];
    k_scales_and_levels(x, 31, -0.5f, 15, y->scales, &y->d, &y->dmin, L);
    q5_k_pack(L, y);
}

/* Q6_K with or without importance weights qw (the matrix's own, not scaled by the values as the
 * other types' are): sixteen sub-blocks of 16 by make_qx_quants, their scales to 8 bits against
 * the one of largest magnitude. */
static void q6_k_fit(const float *x, const float *qw, tlm_block_q6_k *y) {
    int8_t L[TLM_QK_K];
    float scales[TLM_QK_K / 16];
    float max_scale = 0, max_abs_scale = 0;
    for (int ib = 0; ib < TLM_QK_K / 16; ++ib) {
        const float scale =
            make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib, qw ? qw + 16 * ib : NULL);
        scales[ib] = scale;
        const float abs_scale = fabsf(scale);
        if (abs_scale > max_abs_scale) {
            max_abs_scale = abs_scale;
            max_scale = scale;
        }
    }
    if (max_abs_scale < GROUP_MAX_EPS) {
        memset(y, 0, sizeof *y);
        return;
    }
    float iscale = -128.f / max_scale;
    y->d = tlm_f32_to_f16(1 / iscale);
    for (int ib = 0; ib < TLM_QK_K / 16; ++ib)
        y->scales[ib] = (int8_t)imin(127, nearest_int(iscale * scales[ib]));
    for (int j = 0; j < TLM_QK_K / 16; ++j) {
        float d = tlm_f16_to_f32(y->d) * y->scales[j];
        if (!d) continue;
        for (int ii = 0; ii < 16; ++ii) {
            int l = nearest_int(x[16 * j + ii] / d);
            l = imax(-32, imin(31, l));
            L[16 * j + ii] = (int8_t)(l + 32);
        }
    }
    uint8_t *ql = y->ql, *qh = y->qh;
    for (int j = 0; j < TLM_QK_K; j += 128, ql += 64, qh += 32)
        for (int l = 0; l < 32; ++l) {
            const uint8_t q1 = L[j + l] & 0xF, q2 = L[j + l + 32] & 0xF;
            const uint8_t q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
            ql[l] = (uint8_t)(q1 | (q3 << 4));
            ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
            qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) |
                              ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6));
        }
}

static void q6_k(const float *x, tlm_block_q6_k *y) { q6_k_fit(x, NULL, y); }

/* The 2-bit planes of Q2_K and Q3_K: element 32i + l of each half of 128 in bits 2i of qs[l]. */
static void pack_planes(const uint8_t *L, uint8_t *qs) {
    for (int j = 0; j < TLM_QK_K; j += 128)
        for (int l = 0; l < 32; ++l)
            qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) |
                                      (L[j + l + 96] << 6));
}

/* Q2_K: sixteen sub-blocks of 16 fitted by make_qkx2_quants on |x| weights and absolute error,
 * scales and mins to 4 bits against the block's largest, then every value requantized with the
 * stored ones. */
static void q2_k(const float *x, tlm_block_q2_k *y) {
    uint8_t L[TLM_QK_K], Laux[16];
    float weights[16], mins[TLM_QK_K / 16], scales[TLM_QK_K / 16];
    const float q4scale = 15.f;
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < TLM_QK_K / 16; ++j) {
        for (int l = 0; l < 16; ++l) weights[l] = fabsf(x[16 * j + l]);
        scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f,
                                     0.1f, 15, 1);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    if (max_scale > 0) {
        float iscale = q4scale / max_scale;
        for (int j = 0; j < TLM_QK_K / 16; ++j)
            y->scales[j] = (uint8_t)nearest_int(iscale * scales[j]);
        y->d = tlm_f32_to_f16(max_scale / q4scale);
    } else {
        memset(y->scales, 0, sizeof y->scales);
        y->d = tlm_f32_to_f16(0.f);
    }
    if (max_min > 0) {
        float iscale = q4scale / max_min;
        for (int j = 0; j < TLM_QK_K / 16; ++j)
            y->scales[j] |= (uint8_t)((unsigned)nearest_int(iscale * mins[j]) << 4);
        y->dmin = tlm_f32_to_f16(max_min / q4scale);
    } else {
        y->dmin = tlm_f32_to_f16(0.f);
    }
    for (int j = 0; j < TLM_QK_K / 16; ++j) {
        const float d = tlm_f16_to_f32(y->d) * (y->scales[j] & 0xF);
        if (!d) continue; /* keeps make_qkx2_quants' levels, as ggml does */
        const float dm = tlm_f16_to_f32(y->dmin) * (y->scales[j] >> 4);
        for (int ii = 0; ii < 16; ++ii) {
            int l = nearest_int((x[16 * j + ii] + dm) / d);
            L[16 * j + ii] = (uint8_t)imax(0, imin(3, l));
        }
    }
    pack_planes(L, y->qs);
}

/* ggml's make_q3_quants with its rmse search (Q3_K): L in [-nmax, nmax - 1] from the scale that
 * maps the value of largest magnitude to -nmax, then up to five passes moving single levels where
 * that raises sumlx^2 / suml2 (weights x^2); L stored + nmax. */
static float make_q3_quants(int n, int nmax, const float *x, int8_t *L) {
    float max;
    if (!signed_max(n, x, &max)) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float sumlx, suml2;
    levels_at(n, nmax, x, NULL, -nmax / max, L, 0, &sumlx, &suml2);
    for (int itry = 0; itry < 5; ++itry) {
        int n_changed = 0;
        for (int i = 0; i < n; ++i) {
            float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * L[i] * L[i];
                int new_l = nearest_int(x[i] * sl2 / slx);
                new_l = imax(-nmax, imin(nmax - 1, new_l));
                if (new_l != L[i]) {
                    slx += w * x[i] * new_l;
                    sl2 += w * new_l * new_l;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        ++n_changed;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    for (int i = 0; i < n; ++i) L[i] = (int8_t)(L[i] + nmax);
    return sumlx / suml2;
}

/* The end of both Q3_K quantizers: every value requantized with the stored scales (a sub-block
 * whose scale is 0 keeps the fit's levels, as ggml does), the third bit of element j in bit
 * j / 32 of hmask[j % 32], the low two in the planes. */
static void q3_k_finish(const float *x, int8_t *L, tlm_block_q3_k *y) {
    for (int j = 0; j < TLM_QK_K / 16; ++j) {
        const float d = tlm_f16_to_f32(y->d) * (float)(tlm_q3k_scale(j, y->scales) - 32);
        if (!d) continue;
        for (int ii = 0; ii < 16; ++ii) {
            int l = nearest_int(x[16 * j + ii] / d);
            L[16 * j + ii] = (int8_t)(imax(-4, imin(3, l)) + 4);
        }
    }
    memset(y->hmask, 0, sizeof y->hmask);
    uint8_t U[TLM_QK_K];
    for (int j = 0; j < TLM_QK_K; ++j) {
        int v = L[j];
        if (v > 3) {
            y->hmask[j % 32] |= (uint8_t)(1 << (j / 32));
            v -= 4;
        }
        U[j] = (uint8_t)v;
    }
    pack_planes(U, y->qs);
}

/* Q3_K sub-block j's 6-bit scale l (stored + 32) into its 12 bytes (zeroed first): the low four
 * bits in a nibble of bytes 0-7, the top two in bits 2 (j / 4) of byte 8 + j % 4. */
static void put_q3k_scale(int j, int l, uint8_t *scales) {
    if (j < 8)
        scales[j] = (uint8_t)(l & 0xF);
    else
        scales[j - 8] |= (uint8_t)((l & 0xF) << 4);
    scales[j % 4 + 8] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
}

/* Q3_K: sixteen sub-blocks of 16 by make_q3_quants, their scales to 6 bits (signed, + 32)
 * against the one of largest magnitude, every value requantized with the stored ones, the third
 * bit of element j in bit j / 32 of hmask[j % 32]. */
static void q3_k(const float *x, tlm_block_q3_k *y) {
    int8_t L[TLM_QK_K];
    float scales[TLM_QK_K / 16];
    float max_scale = 0, amax = 0;
    for (int j = 0; j < TLM_QK_K / 16; ++j) {
        scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
        float scale = fabsf(scales[j]);
        if (scale > amax) {
            amax = scale;
            max_scale = scales[j];
        }
    }
    memset(y->scales, 0, 12);
    if (max_scale) {
        float iscale = -32.f / max_scale;
        for (int j = 0; j < TLM_QK_K / 16; ++j) {
            /* ggml keeps nearest_int's result in an int8_t before clamping it */
            int8_t l = (int8_t)nearest_int(iscale * scales[j]);
            put_q3k_scale(j, imax(-32, imin(31, l)) + 32, y->scales);
        }
        y->d = tlm_f32_to_f16(1 / iscale);
    } else {
        y->d = tlm_f32_to_f16(0.f);
    }
    q3_k_finish(x, L, y);
}

/* ---- with an importance matrix (llama-quantize --imatrix) ------------------------------------ */

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

/* Q4_0 and Q5_0 (symmetric, make_qx_quants on the weights), Q4_1 and Q5_1 (a min,
 * make_qkx2_quants' search as ggml's make_qkx3_quants runs it), one block of 32. */
static void q4_0w(const float *x, const float *w, tlm_block_q4_0 *y) {
    int8_t L[TLM_QK];
    y->d = tlm_f32_to_f16(make_qx_quants(TLM_QK, 8, x, L, w));
    for (int j = 0; j < 16; ++j) y->qs[j] = (uint8_t)(L[j] | (L[j + 16] << 4));
}

static void q5_0w(const float *x, const float *w, tlm_block_q5_0 *y) {
    int8_t L[TLM_QK];
    y->d = tlm_f32_to_f16(make_qx_quants(TLM_QK, 16, x, L, w));
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
    return make_qkx2_quants(n, nmax, x, w, L, the_min, Laux, -0.9f, 0.05f, 36, 0);
}

static void q4_1w(const float *x, const float *w, tlm_block_q4_1 *y) {
    uint8_t L[TLM_QK];
    float min, d = qkx3(TLM_QK, 15, x, w, L, &min);
    y->d = tlm_f32_to_f16(d);
    y->m = tlm_f32_to_f16(-min);
    for (int j = 0; j < 16; ++j) y->qs[j] = (uint8_t)(L[j] | (L[j + 16] << 4));
}

static void q5_1w(const float *x, const float *w, tlm_block_q5_1 *y) {
    uint8_t L[TLM_QK];
    float min, d = qkx3(TLM_QK, 31, x, w, L, &min);
    y->d = tlm_f32_to_f16(d);
    y->m = tlm_f32_to_f16(-min);
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
    float sigma2 = 2 * mean_square(x, TLM_QK_K);
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
        put_scale_min(j, ls, lm, scales12);
    }
    *dd = tlm_f32_to_f16(d_block);
    *dmin = tlm_f32_to_f16(m_block);
    k45_requantize(x, scales12, *dd, *dmin, nmax, L);
}

static void q4_kw(const float *x, const float *qw, tlm_block_q4_k *y) {
    uint8_t L[TLM_QK_K];
    k45w(x, qw, 15, y->scales, &y->d, &y->dmin, L);
    uint8_t *q = y->qs;
    for (int j = 0; j < TLM_QK_K; j += 64, q += 32)
        for (int l = 0; l < 32; ++l) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
}

static void q5_kw(const float *x, const float *qw, tlm_block_q5_k *y) {
    uint8_t L[TLM_QK_K];
    k45w(x, qw, 31, y->scales, &y->d, &y->dmin, L);
    q5_k_pack(L, y);
}

static void q6_kw(const float *x, const float *qw, tlm_block_q6_k *y) { q6_k_fit(x, qw, y); }

/* Q2_K: sixteen sub-blocks of 16 fitted with their weights, the scales and mins to 4 bits by
 * make_qp_quants, every value requantized with the stored ones. */
static void q2_kw(const float *x, const float *qw, tlm_block_q2_k *y) {
    uint8_t L[TLM_QK_K], Ls[16], Lm[16];
    float weight[16], sw[16], mins[16], scales[16];
    float sigma2 = mean_square(x, TLM_QK_K);
    for (int j = 0; j < 16; ++j) {
        sw[j] = imp_weights(16, x + 16 * j, qw + 16 * j, sigma2, weight);
        scales[j] = qkx3(16, 3, x + 16 * j, weight, L + 16 * j, &mins[j]);
    }
    float dm = make_qp_quants(16, 15, scales, Ls, sw);
    float mm = make_qp_quants(16, 15, mins, Lm, sw);
    y->d = tlm_f32_to_f16(dm);
    y->dmin = tlm_f32_to_f16(mm);
    dm = tlm_f16_to_f32(y->d);
    mm = tlm_f16_to_f32(y->dmin);
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
    pack_planes(L, y->qs);
}

/* Q3_K: sixteen sub-blocks of 16 by the weighted make_qx_quants, their scales to 6 bits by the
 * same fit weighted by each sub-block's total weight. */
static void q3_kw(const float *x, const float *qw, tlm_block_q3_k *y) {
    int8_t L[TLM_QK_K], Ls[16];
    float scales[16], weight[16], sw[16];
    float sigma2 = 2 * mean_square(x, TLM_QK_K);
    for (int j = 0; j < 16; ++j) {
        sw[j] = imp_weights(16, x + 16 * j, qw + 16 * j, sigma2, weight);
        scales[j] = make_qx_quants(16, 4, x + 16 * j, L + 16 * j, weight);
    }
    memset(y->scales, 0, 12);
    float d_block = make_qx_quants(16, 32, scales, Ls, sw);
    for (int j = 0; j < 16; ++j) put_q3k_scale(j, Ls[j], y->scales);
    y->d = tlm_f32_to_f16(d_block);
    q3_k_finish(x, L, y);
}

/* ggml's best_index_int8: the level of the 16 (sorted) nearest to x, the lower one on a tie. */
static int best_index(const int8_t *val, float x) {
    if (x <= val[0]) return 0;
    if (x >= val[15]) return 15;
    int ml = 0, mu = 15;
    while (mu - ml > 1) {
        int mav = (ml + mu) / 2;
        if (x < val[mav])
            mu = mav;
        else
            ml = mav;
    }
    return x - val[mu - 1] < val[mu] - x ? mu - 1 : mu;
}

/* ggml's quantize_row_iq4_nl_impl as ggml_quantize_chunk runs it (ntry 7; weights x^2, or with
 * an importance matrix qw * sqrt(sigma2 + x^2), sigma2 twice the mean square of the block) over
 * `subs` sub-blocks of 32: each sub-block's scale from the level that maps its
 * value of largest magnitude, then 15 candidate inverse scales around it, keeping the best
 * least-squares fit; with several sub-blocks (IQ4_XS) their scales go to 6 bits against the
 * largest and every value is mapped again with its stored scale, with one (IQ4_NL) the block's
 * values are mapped again with the scale as fitted. */
static void iq4_quant(const float *x, int subs, uint16_t *dh, uint8_t *q4, uint16_t *scales_h,
                      uint8_t *scales_l, const float *qw) {
    const int8_t *values = tlm_iq4nl_values;
    const int ntry = 7;
    uint8_t L[TLM_QK_K];
    float scales[TLM_QK_K / 32], weight[32];
    memset(q4, 0, (size_t)subs * 16);
    *dh = tlm_f32_to_f16(0.f);
    float max_scale = 0, amax_scale = 0, sigma2 = 0;
    if (qw) {
        for (int j = 0; j < 32 * subs; ++j) sigma2 += x[j] * x[j];
        sigma2 *= 2.f / (32 * subs);
    }
    for (int ib = 0; ib < subs; ++ib) {
        const float *xb = x + ib * 32;
        uint8_t *Lb = L + ib * 32;
        for (int j = 0; j < 32; ++j)
            weight[j] = qw ? qw[ib * 32 + j] * sqrtf(sigma2 + xb[j] * xb[j]) : xb[j] * xb[j];
        float max;
        if (!signed_max(32, xb, &max)) {
            scales[ib] = 0;
            continue;
        }
        float d = -max / values[0];
        float id = 1 / d;
        float sumqx = 0, sumq2 = 0;
        for (int j = 0; j < 32; ++j) {
            float al = id * xb[j];
            int l = best_index(values, al);
            Lb[j] = (uint8_t)l;
            float q = values[l];
            float w = weight[j];
            sumqx += w * q * xb[j];
            sumq2 += w * q * q;
        }
        d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
        float best = d * sumqx;
        for (int itry = -ntry; itry <= ntry; ++itry) {
            id = (itry + values[0]) / max;
            sumqx = sumq2 = 0;
            for (int j = 0; j < 32; ++j) {
                float al = id * xb[j];
                int l = best_index(values, al);
                float q = values[l];
                float w = weight[j];
                sumqx += w * q * xb[j];
                sumq2 += w * q * q;
            }
            if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        float abs_d = fabsf(d);
        if (abs_d > amax_scale) {
            amax_scale = abs_d;
            max_scale = d;
        }
    }
    if (subs > 1) {
        *scales_h = 0;
        float d = -max_scale / 32;
        *dh = tlm_f32_to_f16(d);
        float id = d ? 1 / d : 0.f;
        for (int ib = 0; ib < subs; ++ib) {
            int l = nearest_int(id * scales[ib]);
            l = imax(-32, imin(31, l));
            float dl = d * l;
            float idl = dl ? 1 / dl : 0.f;
            for (int j = 0; j < 32; ++j)
                L[ib * 32 + j] = (uint8_t)best_index(values, idl * x[ib * 32 + j]);
            tlm_iq4xs_put_scale(ib, l + 32, scales_h, scales_l);
        }
    } else {
        *dh = tlm_f32_to_f16(scales[0]);
        float id = scales[0] ? 1 / scales[0] : 0;
        for (int j = 0; j < 32; ++j) L[j] = (uint8_t)best_index(values, id * x[j]);
    }
    for (int i = 0; i < subs; ++i)
        for (int j = 0; j < 16; ++j)
            q4[16 * i + j] = (uint8_t)(L[32 * i + j] | (L[32 * i + 16 + j] << 4));
}

static void iq4_nl(const float *x, tlm_block_iq4_nl *y) {
    iq4_quant(x, 1, &y->d, y->qs, NULL, NULL, NULL);
}

static void iq4_xs(const float *x, tlm_block_iq4_xs *y) {
    iq4_quant(x, 8, &y->d, y->qs, &y->scales_h, y->scales_l, NULL);
}

tlm_status tlm_dtype_from_f32(tlm_dtype t, const float *src, void *dst, size_t n) {
    const tlm_dtype_info *info = tlm_dtype_get(t);
    if (!info || !info->is_float || t == TLM_DTYPE_F64)
        return tlm_err(TLM_ERR_UNSUPPORTED, "cannot quantize to %s", tlm_dtype_name(t));
    if (n % info->block_elems)
        return tlm_err(TLM_ERR_ARG, "%s: %zu elements is not a whole number of %u-element blocks",
                       info->name, n, info->block_elems);
    uint8_t *out = dst;
    /* Blocks are built in an aligned local and copied out: dst need not be aligned. */
    for (size_t b = 0; b < n / info->block_elems; b++) {
        const float *x = src + b * info->block_elems;
        uint8_t *o = out + b * info->block_bytes;
        switch (t) {
        case TLM_DTYPE_F32: memcpy(o, x, 4); break;
        case TLM_DTYPE_F16:
        case TLM_DTYPE_BF16: {
            uint16_t h = t == TLM_DTYPE_F16 ? tlm_f32_to_f16(*x) : tlm_f32_to_bf16(*x);
            o[0] = (uint8_t)h;
            o[1] = (uint8_t)(h >> 8);
            break;
        }
#define BLOCK(T, fn)                                                                               \
    {                                                                                              \
        T blk;                                                                                     \
        fn(x, &blk);                                                                               \
        memcpy(o, &blk, sizeof blk);                                                               \
        break;                                                                                     \
    }
        case TLM_DTYPE_Q8_0: BLOCK(tlm_block_q8_0, q8_0)
        case TLM_DTYPE_Q4_0: BLOCK(tlm_block_q4_0, q4_0)
        case TLM_DTYPE_Q4_1: BLOCK(tlm_block_q4_1, q4_1)
        case TLM_DTYPE_Q5_0: BLOCK(tlm_block_q5_0, q5_0)
        case TLM_DTYPE_Q5_1: BLOCK(tlm_block_q5_1, q5_1)
        case TLM_DTYPE_Q4_K: BLOCK(tlm_block_q4_k, q4_k)
        case TLM_DTYPE_Q5_K: BLOCK(tlm_block_q5_k, q5_k)
        case TLM_DTYPE_Q6_K: BLOCK(tlm_block_q6_k, q6_k)
        case TLM_DTYPE_Q2_K: BLOCK(tlm_block_q2_k, q2_k)
        case TLM_DTYPE_Q3_K: BLOCK(tlm_block_q3_k, q3_k)
        case TLM_DTYPE_IQ4_NL: BLOCK(tlm_block_iq4_nl, iq4_nl)
        case TLM_DTYPE_IQ4_XS: BLOCK(tlm_block_iq4_xs, iq4_xs)
#undef BLOCK
        default: return tlm_err(TLM_ERR_UNSUPPORTED, "cannot quantize to %s", info->name);
        }
    }
    return TLM_OK;
}

int tlm_dtype_uses_imatrix(tlm_dtype t) {
    switch (t) {
    case TLM_DTYPE_Q4_0:
    case TLM_DTYPE_Q4_1:
    case TLM_DTYPE_Q5_0:
    case TLM_DTYPE_Q5_1:
    case TLM_DTYPE_Q2_K:
    case TLM_DTYPE_Q3_K:
    case TLM_DTYPE_Q4_K:
    case TLM_DTYPE_Q5_K:
    case TLM_DTYPE_Q6_K:
    case TLM_DTYPE_IQ4_NL:
    case TLM_DTYPE_IQ4_XS: return 1;
    default: return 0;
    }
}

tlm_status tlm_quantize_rows(tlm_dtype t, const float *src, void *dst, size_t rows, size_t cols,
                             const float *imatrix) {
    if (!imatrix || !tlm_dtype_uses_imatrix(t)) return tlm_dtype_from_f32(t, src, dst, rows * cols);
    const tlm_dtype_info *info = tlm_dtype_get(t);
    if (cols % info->block_elems)
        return tlm_err(TLM_ERR_ARG, "%s: rows of %zu elements are not whole %u-element blocks",
                       info->name, cols, info->block_elems);
    const size_t nb = cols / info->block_elems, be = info->block_elems;
    float weight[TLM_QK];
    for (size_t r = 0; r < rows; r++) {
        const float *x = src + r * cols;
        uint8_t *o = (uint8_t *)dst + r * nb * info->block_bytes;
        /* the 32-element types weigh by the row's mean square */
        float sigma2 = be == TLM_QK && t != TLM_DTYPE_IQ4_NL ? mean_square(x, cols) : 0;
        for (size_t b = 0; b < nb; b++) {
            const float *xb = x + b * be, *qw = imatrix + b * be;
            uint8_t *ob = o + b * info->block_bytes;
            if (be == TLM_QK && t != TLM_DTYPE_IQ4_NL) imp_weights(TLM_QK, xb, qw, sigma2, weight);
#define WBLOCK(T, call)                                                                            \
    {                                                                                              \
        T blk;                                                                                     \
        call;                                                                                      \
        memcpy(ob, &blk, sizeof blk);                                                              \
        break;                                                                                     \
    }
            switch (t) {
            case TLM_DTYPE_Q4_0: WBLOCK(tlm_block_q4_0, q4_0w(xb, weight, &blk))
            case TLM_DTYPE_Q4_1: WBLOCK(tlm_block_q4_1, q4_1w(xb, weight, &blk))
            case TLM_DTYPE_Q5_0: WBLOCK(tlm_block_q5_0, q5_0w(xb, weight, &blk))
            case TLM_DTYPE_Q5_1: WBLOCK(tlm_block_q5_1, q5_1w(xb, weight, &blk))
            case TLM_DTYPE_Q2_K: WBLOCK(tlm_block_q2_k, q2_kw(xb, qw, &blk))
            case TLM_DTYPE_Q3_K: WBLOCK(tlm_block_q3_k, q3_kw(xb, qw, &blk))
            case TLM_DTYPE_Q4_K: WBLOCK(tlm_block_q4_k, q4_kw(xb, qw, &blk))
            case TLM_DTYPE_Q5_K: WBLOCK(tlm_block_q5_k, q5_kw(xb, qw, &blk))
            case TLM_DTYPE_Q6_K: WBLOCK(tlm_block_q6_k, q6_kw(xb, qw, &blk))
            case TLM_DTYPE_IQ4_NL:
                WBLOCK(tlm_block_iq4_nl, iq4_quant(xb, 1, &blk.d, blk.qs, NULL, NULL, qw))
            case TLM_DTYPE_IQ4_XS:
                WBLOCK(tlm_block_iq4_xs,
                       iq4_quant(xb, 8, &blk.d, blk.qs, &blk.scales_h, blk.scales_l, qw))
            default: break;
            }
#undef WBLOCK
        }
    }
    return TLM_OK;
}
