/* k_linear_bwd_dx_frozen (and k_bf16_linear_bwd_dx_frozen, its bf16 products): the input gradient
 * through a frozen weight in its own type, for every type k_linear takes, against a
 * double-precision product on the same bytes widened by the reference conversion
 * (core_dtype_to_f32): several row counts, odd output sizes, a dy row stride wider than the
 * outputs, padded weight rows, beta 0 (over NaN) and 1, one tile, many tiles with a short last one,
 * and the whole matrix at once. F32 weights against k_linear_bwd_dx, and the arguments it refuses.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "harness.h"
#include "kernels/kernels.h"
#include "tlm.h"

static const tlm_dtype types[] = {TLM_DTYPE_F32,    TLM_DTYPE_F16,  TLM_DTYPE_BF16,  TLM_DTYPE_Q8_0,
                                  TLM_DTYPE_Q4_0,   TLM_DTYPE_Q4_1, TLM_DTYPE_Q5_0,  TLM_DTYPE_Q5_1,
                                  TLM_DTYPE_IQ4_NL, TLM_DTYPE_Q2_K, TLM_DTYPE_Q3_K,  TLM_DTYPE_Q4_K,
                                  TLM_DTYPE_Q5_K,   TLM_DTYPE_Q6_K, TLM_DTYPE_IQ4_XS};
#define NTYPES (int)(sizeof types / sizeof types[0])

/* Bytes past each weight row, filled with 0xFF (NaN in every float type, huge scales in the block
 * types): a kernel that reads rows at the wrong stride fails loudly. A multiple of 4 for F32. */
#define ROW_PAD 36

/* A [out, in] weight of type t from random floats through the library's quantizer, rows ROW_PAD
 * bytes apart beyond their size, and its rows widened back by the reference conversion. */
static uint8_t *make_weight(tlm_dtype t, int out, int in, tlm_weight *w, float *wide) {
    size_t rb = core_dtype_bytes(t, (uint64_t)in), stride = rb + ROW_PAD;
    float *x = malloc(sizeof(float) * (size_t)in);
    uint8_t *data = malloc(stride * (size_t)out + 1);
    if (!x || !data) {
        free(x);
        free(data);
        return NULL;
    }
    memset(data, 0xFF, stride * (size_t)out);
    for (int r = 0; r < out; r++) {
        for (int i = 0; i < in; i++) x[i] = t_unif() * 0.5f;
        uint8_t *row = data + (size_t)r * stride;
        if (t == TLM_DTYPE_F32)
            memcpy(row, x, rb);
        else
            CHECK_OK(core_quantize_rows(t, x, row, 1, (size_t)in, NULL));
        CHECK_OK(core_dtype_to_f32(t, row, wide + (size_t)r * in, (size_t)in));
    }
    free(x);
    *w = (tlm_weight){t, data, out, in, stride};
    return data;
}

/* The largest error of dx against the double product, in units of the sum of the magnitudes of
 * each element's terms (what float accumulation error scales with). */
static double max_rel_err(const float *dx, const float *dx0, const float *dy, int ldy,
                          const float *wide, int N, int in, int out, float beta) {
    double worst = 0;
    for (int n = 0; n < N; n++)
        for (int i = 0; i < in; i++) {
            double s = 0, mag = 0;
            for (int o = 0; o < out; o++) {
                double p = (double)dy[(size_t)n * ldy + o] * wide[(size_t)o * in + i];
                s += p;
                mag += fabs(p);
            }
            if (beta != 0.0f) {
                s += (double)beta * dx0[(size_t)n * in + i];
                mag += fabs((double)beta * dx0[(size_t)n * in + i]);
            }
            double e = fabs((double)dx[(size_t)n * in + i] - s) / (mag > 1e-30 ? mag : 1e-30);
            if (!(e <= worst)) worst = e; /* NaN counts as the worst */
        }
    return worst;
}

static void check_type(tlm_dtype t, k_bf16 *bf) {
    const char *name = core_dtype_get(t)->name;
    int block = (int)core_dtype_get(t)->block_elems;
    int in = block == 256 ? 512 : 160;
    static const int outs[] = {37, 131}, Ns[] = {1, 3, 17, 64};
    for (int oi = 0; oi < 2; oi++) {
        int out = outs[oi], ldy = out + 5;
        tlm_weight w;
        float *wide = malloc(sizeof(float) * (size_t)out * in);
        uint8_t *data = wide ? make_weight(t, out, in, &w, wide) : NULL;
        float *dy = malloc(sizeof(float) * 64 * (size_t)ldy);
        float *dx = malloc(sizeof(float) * 64 * (size_t)in);
        float *dx0 = malloc(sizeof(float) * 64 * (size_t)in);
        if (!data || !dy || !dx || !dx0) {
            CHECK(0, "out of memory");
            goto done;
        }
        for (int i = 0; i < 64 * ldy; i++) dy[i] = t_unif();
        for (int i = 0; i < 64 * in; i++) dx0[i] = t_unif();
        for (int ni = 0; ni < 4; ni++)
            for (int bi = 0; bi < 2; bi++) {
                int N = Ns[ni];
                float beta = (float)bi;
                /* 0: the default tile; 16: many tiles, the last one short; out: one tile */
                static const int tiles[] = {0, 16, 1 << 20};
                for (int ti = 0; ti < 3; ti++) {
                    for (int i = 0; i < N * in; i++) dx[i] = beta == 0.0f ? NAN : dx0[i];
                    CHECK_OK(k_linear_bwd_dx_frozen_tiles(dx, dy, ldy, &w, N, beta, tiles[ti]));
                    double e = max_rel_err(dx, dx0, dy, ldy, wide, N, in, out, beta);
                    CHECK(e <= 1e-5, "%s out %d N %d beta %g tile %d: relative error %g", name, out,
                          N, (double)beta, tiles[ti], e);
                }
            }
        if (bf) {
            /* The bf16 products: dy and the widened tiles rounded to bf16 (8 significant bits
             * each), fp32 accumulation; every beta and row count. */
            for (int ni = 0; ni < 4; ni++)
                for (int bi = 0; bi < 2; bi++) {
                    int N = Ns[ni];
                    float beta = (float)bi;
                    for (int i = 0; i < N * in; i++) dx[i] = beta == 0.0f ? NAN : dx0[i];
                    CHECK_OK(k_bf16_linear_bwd_dx_frozen(bf, dx, dy, ldy, &w, N, beta));
                    double e = max_rel_err(dx, dx0, dy, ldy, wide, N, in, out, beta);
                    CHECK(e <= 1e-2, "bf16 %s out %d N %d beta %g: relative error %g", name, out, N,
                          (double)beta, e);
                }
            CHECK(k_bf16_fallbacks(bf) == 0, "bf16 %s: %ld products fell back to sgemm", name,
                  k_bf16_fallbacks(bf));
        }
        if (t == TLM_DTYPE_F32) {
            /* Contiguous F32 rows: the very product k_linear_bwd_dx computes. */
            int N = 17;
            float *a = malloc(sizeof(float) * (size_t)N * in);
            float *b = malloc(sizeof(float) * (size_t)N * in);
            if (a && b) {
                tlm_weight c = {TLM_DTYPE_F32, wide, out, in, sizeof(float) * (size_t)in};
                memcpy(a, dx0, sizeof(float) * (size_t)N * in);
                memcpy(b, dx0, sizeof(float) * (size_t)N * in);
                CHECK_OK(k_linear_bwd_dx_frozen(a, dy, ldy, &c, N, 1.0f));
                k_linear_bwd_dx(b, dy, ldy, wide, N, in, out, 1.0f);
                double d = 0;
                for (int i = 0; i < N * in; i++) d = fmax(d, fabs((double)a[i] - b[i]));
                CHECK(d <= 1e-6, "F32 against k_linear_bwd_dx: %g apart", d);
            } else {
                CHECK(0, "out of memory");
            }
            free(a);
            free(b);
        }
    done:
        free(wide);
        free(data);
        free(dy);
        free(dx);
        free(dx0);
    }
}

/* What it refuses leaves dx as it was and names the problem; no outputs scale dx by beta. */
static void check_arguments(void) {
    float dy[3 * 8] = {0}, dx[3 * 32], keep[3 * 32];
    uint8_t data[8 * 32 * 4] = {0};
    for (int i = 0; i < 3 * 32; i++) keep[i] = dx[i] = (float)i;
    tlm_weight w = {TLM_DTYPE_F32, data, 8, 32, 32 * 4};

    CHECK(k_linear_bwd_dx_frozen(dx, dy, 7, &w, 3, 0.0f) == TLM_ERR_ARG, "ldy below out taken");
    CHECK_ERROR_HAS("row stride");
    tlm_weight bad = w;
    bad.dtype = TLM_DTYPE_I32;
    CHECK(k_linear_bwd_dx_frozen(dx, dy, 8, &bad, 3, 0.0f) == TLM_ERR_ARG, "I32 weight taken");
    CHECK_ERROR_HAS("type I32");
    bad = w;
    bad.dtype = TLM_DTYPE_Q4_0, bad.cols = 40; /* not a whole number of blocks */
    CHECK(k_linear_bwd_dx_frozen(dx, dy, 8, &bad, 3, 0.0f) == TLM_ERR_ARG, "40 Q4_0 columns taken");
    CHECK_ERROR_HAS("columns");
    bad = w;
    bad.row_bytes = 100;
    CHECK(k_linear_bwd_dx_frozen(dx, dy, 8, &bad, 3, 0.0f) == TLM_ERR_ARG, "short rows taken");
    CHECK(k_linear_bwd_dx_frozen(dx, dy, 8, NULL, 3, 0.0f) == TLM_ERR_ARG, "no weight taken");
    CHECK(k_linear_bwd_dx_frozen(dx, dy, 8, &w, -1, 0.0f) == TLM_ERR_ARG, "N < 0 taken");
    CHECK(!memcmp(dx, keep, sizeof dx), "a refused call wrote dx");

    bad = w;
    bad.rows = 0;
    CHECK_OK(k_linear_bwd_dx_frozen(dx, dy, 8, &bad, 3, 0.5f));
    CHECK(dx[5] == 2.5f && dx[95] == 47.5f, "no outputs: dx %g %g, not beta dx", (double)dx[5],
          (double)dx[95]);
    for (int i = 0; i < 3 * 32; i++) dx[i] = NAN;
    CHECK_OK(k_linear_bwd_dx_frozen(dx, dy, 8, &bad, 3, 0.0f));
    CHECK(dx[0] == 0.0f && dx[95] == 0.0f, "no outputs, beta 0: dx %g, not 0", (double)dx[0]);
}

int main(void) {
    tlm_threads_set(2);
    /* The bf16 products where the CPU runs them (k_bf16_linear_bwd_dx_frozen). */
    k_bf16 *bf = k_bf16_supported() ? k_bf16_new() : NULL;
    for (int t = 0; t < NTYPES; t++) {
        CHECK(k_linear_takes(types[t]), "k_linear does not take %s",
              core_dtype_get(types[t])->name);
        check_type(types[t], bf);
    }
    k_bf16_free(bf);
    check_arguments();
    return t_finish("test_frozen_dx");
}
