/* The searches and packings that the reference quantizers (quant_ref.c) and the importance-matrix
 * ones (quant_imatrix.c) share: ggml's make_*_quants fits, the K types' scale packing and
 * requantization, and IQ4's level search. Built with -ffp-contract=off, as they are (ggml's float
 * arithmetic exactly; see quant_ref.c). */
#include <math.h>
#include <string.h>

#include "core/half.h"
#include "core/quant.h"
#include "core/quant_impl.h"

/* ggml's core_make_qkx2_quants (K types with a min): for n values with weights, the scale and min
 * of L in [0, nmax] that minimise the weighted squared error (mad: absolute error, Q2_K's),
 * searching nstep + 1 candidate inverse scales around nmax / (max - min) and solving the
 * least-squares fit for each. Returns the scale; *the_min gets minus the min (ggml stores mins as
 * positive numbers subtracted). */
float core_make_qkx2_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L,
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
 * qw is NULL, by x^2: the pass that ggml's core_make_qx_quants and core_make_q3_quants start from,
 * and core_make_qx_quants repeats for each candidate scale. */
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

/* ggml's core_make_qx_quants with rmse_type 1: symmetric L in [-nmax, nmax - 1] (stored + nmax),
 * weights qw (importance; Q6_K, Q3_K, Q4_0 and Q5_0 with a matrix) or x^2 where qw is NULL (Q6_K
 * without one), and 18 candidate scales around the one that maps the value of largest magnitude
 * to -nmax. */
float core_make_qx_quants(int n, int nmax, const float *x, int8_t *L, const float *qw) {
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
void core_q45k_put_scale_min(int j, uint8_t ls, uint8_t lm, uint8_t *scales12) {
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
void core_q45k_requantize(const float *x, const uint8_t *scales12, uint16_t dd, uint16_t dmin,
                          int nmax, uint8_t *L) {
    for (int j = 0; j < CORE_QK_K / 32; ++j) {
        uint8_t sc, m;
        core_q4k_scale_min(j, scales12, &sc, &m);
        const float d = core_f16_to_f32(dd) * sc;
        if (!d) continue;
        const float dm = core_f16_to_f32(dmin) * m;
        for (int ii = 0; ii < 32; ++ii) {
            int l = nearest_int((x[32 * j + ii] + dm) / d);
            L[32 * j + ii] = (uint8_t)imax(0, imin(nmax, l));
        }
    }
}

/* Q5_K's levels (0-31) into the block: low nibbles in qs as Q4_K's, fifth bits in qh. */
void core_q5k_pack(const uint8_t *L, core_block_q5_k *y) {
    uint8_t *qh = y->qh, *ql = y->qs;
    memset(qh, 0, CORE_QK_K / 8);
    uint8_t m1 = 1, m2 = 2;
    for (int n = 0; n < CORE_QK_K; n += 64, ql += 32) {
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

/* Q6_K with or without importance weights qw (the matrix's own, not scaled by the values as the
 * other types' are): sixteen sub-blocks of 16 by core_make_qx_quants, their scales to 8 bits
 * against the one of largest magnitude. */
void core_q6k_fit(const float *x, const float *qw, core_block_q6_k *y) {
    int8_t L[CORE_QK_K];
    float scales[CORE_QK_K / 16];
    float max_scale = 0, max_abs_scale = 0;
    for (int ib = 0; ib < CORE_QK_K / 16; ++ib) {
        const float scale =
            core_make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib, qw ? qw + 16 * ib : NULL);
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
    y->d = core_f32_to_f16(1 / iscale);
    for (int ib = 0; ib < CORE_QK_K / 16; ++ib)
        y->scales[ib] = (int8_t)imin(127, nearest_int(iscale * scales[ib]));
    for (int j = 0; j < CORE_QK_K / 16; ++j) {
        float d = core_f16_to_f32(y->d) * y->scales[j];
        if (!d) continue;
        for (int ii = 0; ii < 16; ++ii) {
            int l = nearest_int(x[16 * j + ii] / d);
            l = imax(-32, imin(31, l));
            L[16 * j + ii] = (int8_t)(l + 32);
        }
    }
    uint8_t *ql = y->ql, *qh = y->qh;
    for (int j = 0; j < CORE_QK_K; j += 128, ql += 64, qh += 32)
        for (int l = 0; l < 32; ++l) {
            const uint8_t q1 = L[j + l] & 0xF, q2 = L[j + l + 32] & 0xF;
            const uint8_t q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
            ql[l] = (uint8_t)(q1 | (q3 << 4));
            ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
            qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) |
                              ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6));
        }
}

/* The 2-bit planes of Q2_K and Q3_K: element 32i + l of each half of 128 in bits 2i of qs[l]. */
void core_q23k_pack_planes(const uint8_t *L, uint8_t *qs) {
    for (int j = 0; j < CORE_QK_K; j += 128)
        for (int l = 0; l < 32; ++l)
            qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) |
                                      (L[j + l + 96] << 6));
}

/* ggml's core_make_q3_quants with its rmse search (Q3_K): L in [-nmax, nmax - 1] from the scale
 * that maps the value of largest magnitude to -nmax, then up to five passes moving single levels
 * where that raises sumlx^2 / suml2 (weights x^2); L stored + nmax. */
float core_make_q3_quants(int n, int nmax, const float *x, int8_t *L) {
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
void core_q3k_finish(const float *x, int8_t *L, core_block_q3_k *y) {
    for (int j = 0; j < CORE_QK_K / 16; ++j) {
        const float d = core_f16_to_f32(y->d) * (float)(core_q3k_scale(j, y->scales) - 32);
        if (!d) continue;
        for (int ii = 0; ii < 16; ++ii) {
            int l = nearest_int(x[16 * j + ii] / d);
            L[16 * j + ii] = (int8_t)(imax(-4, imin(3, l)) + 4);
        }
    }
    memset(y->hmask, 0, sizeof y->hmask);
    uint8_t U[CORE_QK_K];
    for (int j = 0; j < CORE_QK_K; ++j) {
        int v = L[j];
        if (v > 3) {
            y->hmask[j % 32] |= (uint8_t)(1 << (j / 32));
            v -= 4;
        }
        U[j] = (uint8_t)v;
    }
    core_q23k_pack_planes(U, y->qs);
}

/* Q3_K sub-block j's 6-bit scale l (stored + 32) into its 12 bytes (zeroed first): the low four
 * bits in a nibble of bytes 0-7, the top two in bits 2 (j / 4) of byte 8 + j % 4. */
void core_q3k_put_scale(int j, int l, uint8_t *scales) {
    if (j < 8)
        scales[j] = (uint8_t)(l & 0xF);
    else
        scales[j - 8] |= (uint8_t)((l & 0xF) << 4);
    scales[j % 4 + 8] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
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
void core_iq4_quant(const float *x, int subs, uint16_t *dh, uint8_t *q4, uint16_t *scales_h,
                    uint8_t *scales_l, const float *qw) {
    const int8_t *values = core_iq4nl_values;
    const int ntry = 7;
    uint8_t L[CORE_QK_K];
    float scales[CORE_QK_K / 32], weight[32];
    memset(q4, 0, (size_t)subs * 16);
    *dh = core_f32_to_f16(0.f);
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
        *dh = core_f32_to_f16(d);
        float id = d ? 1 / d : 0.f;
        for (int ib = 0; ib < subs; ++ib) {
            int l = nearest_int(id * scales[ib]);
            l = imax(-32, imin(31, l));
            float dl = d * l;
            float idl = dl ? 1 / dl : 0.f;
            for (int j = 0; j < 32; ++j)
                L[ib * 32 + j] = (uint8_t)best_index(values, idl * x[ib * 32 + j]);
            core_iq4xs_put_scale(ib, l + 32, scales_h, scales_l);
        }
    } else {
        *dh = core_f32_to_f16(scales[0]);
        float id = scales[0] ? 1 / scales[0] : 0;
        for (int j = 0; j < 32; ++j) L[j] = (uint8_t)best_index(values, id * x[j]);
    }
    for (int i = 0; i < subs; ++i)
        for (int j = 0; j < 16; ++j)
            q4[16 * i + j] = (uint8_t)(L[32 * i + j] | (L[32 * i + 16 + j] << 4));
}
