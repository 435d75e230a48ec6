/* The bf16 kernels (src/kernels/bf16.c): rounding to nearest even, and the three products of a
 * linear layer (forward, input gradient, weight gradient; written over and accumulated, with and
 * without bias) against a double-precision sum over the same rounded operands: the only error
 * left is fp32 accumulation, so a wrong layout, transpose or accumulation cannot hide. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "kernels/kernels.h"

static float bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void rounding(void) {
    /* 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: to even (1). 1 + 3*2^-8 lies halfway between
     * 1 + 2^-7 and 1 + 2^-6: to even (1 + 2^-6). Just above halfway rounds up. */
    float in[] = {
        1.0f,    1.0f + 0x1p-8f,    1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-20f, -2.5f,
        3.0e38f, bits(0x7f7fffffu), bits(0x80400000u),  bits(0x7fc00000u),         INFINITY};
    /* FLT_MAX rounds up to infinity; a denormal flushes to (signed) zero. */
    uint16_t want[] = {0x3f80, 0x3f80, 0x3f82, 0x3f81, 0xc020,
                       0x7f62, 0x7f80, 0x8000, 0x7fc0, 0x7f80};
    size_t n = sizeof in / sizeof in[0];
    uint16_t got[sizeof in / sizeof in[0]];
    k_f32_to_bf16(got, in, n);
    for (size_t i = 0; i < n; i++)
        CHECK(got[i] == want[i], "round(%a) = 0x%04x, want 0x%04x", (double)in[i], got[i], want[i]);
    /* A NaN with only low payload bits stays a NaN. */
    float nan_low = bits(0x7f800001u);
    uint16_t h;
    k_f32_to_bf16(&h, &nan_low, 1);
    CHECK(isnan(k_bf16_to_f32(h)), "NaN rounded to 0x%04x", h);
    /* Long arrays (the vector path and its tail) round like single elements. */
    size_t m = 100003;
    float *x = malloc(m * sizeof *x);
    uint16_t *a = malloc(m * 2), *b = malloc(m * 2);
    uint32_t s = 12345;
    for (size_t i = 0; i < m; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = bits((s >> 2) | 0x30000000u) * (s & 1 ? -1.0f : 1.0f);
    }
    k_f32_to_bf16(a, x, m);
    for (size_t i = 0; i < m; i++) k_f32_to_bf16(b + i, x + i, 1);
    CHECK(!memcmp(a, b, m * 2), "the array and element-wise roundings differ");
    free(x);
    free(a);
    free(b);
}

static void fill(float *v, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        v[i] = (float)((seed >> 8) % 2001) / 1000.0f - 1.0f;
    }
}

/* The values the products see: v rounded to bf16, as doubles. */
static double *rounded(const float *v, size_t n) {
    uint16_t *h = malloc(n * 2);
    double *r = malloc(n * sizeof *r);
    k_f32_to_bf16(h, v, n);
    for (size_t i = 0; i < n; i++) r[i] = k_bf16_to_f32(h[i]);
    free(h);
    return r;
}

/* |got - want| within fp32 accumulation of K terms of size up to `mag`. */
static int close(double got, double want, int K, double mag) {
    return fabs(got - want) <= 4.0 * K * 0x1p-24 * mag + 1e-6;
}

static void products(k_bf16 *k, int N, int in, int out) {
    float *x = malloc((size_t)N * in * 4), *w = malloc((size_t)out * in * 4),
          *b = malloc((size_t)out * 4), *y = malloc((size_t)N * (out + 3) * 4),
          *dy = malloc((size_t)N * out * 4), *dx = malloc((size_t)N * in * 4),
          *dw = malloc((size_t)out * in * 4), *db = malloc((size_t)out * 4);
    fill(x, (size_t)N * in, 1);
    fill(w, (size_t)out * in, 2);
    fill(b, (size_t)out, 3);
    fill(dy, (size_t)N * out, 4);
    int ldy = out + 3, bad = 0;
    double *xr = rounded(x, (size_t)N * in), *wr = rounded(w, (size_t)out * in),
           *dyr = rounded(dy, (size_t)N * out);
    /* Forward with bias into rows of stride ldy. */
    k_bf16_linear_fwd(k, y, ldy, x, w, b, N, in, out);
    for (int i = 0; i < N; i++)
        for (int j = 0; j < out; j++) {
            double s = b[j], mag = fabs(b[j]);
            for (int t = 0; t < in; t++) {
                double p = xr[(size_t)i * in + t] * wr[(size_t)j * in + t];
                s += p;
                mag += fabs(p);
            }
            bad += !close(y[(size_t)i * ldy + j], s, in, mag);
        }
    CHECK(bad == 0, "forward %dx%dx%d: %d elements off", N, in, out, bad);
    /* Backward, then again accumulating: dW and db double, dx is written over. */
    for (int acc = 0; acc < 2; acc++) {
        k_bf16_linear_bwd(k, dx, dw, db, dy, x, w, N, in, out, acc);
        bad = 0;
        for (int i = 0; i < N; i++)
            for (int t = 0; t < in; t++) {
                double s = 0, mag = 0;
                for (int j = 0; j < out; j++) {
                    double p = dyr[(size_t)i * out + j] * wr[(size_t)j * in + t];
                    s += p;
                    mag += fabs(p);
                }
                bad += !close(dx[(size_t)i * in + t], s, out, mag);
            }
        CHECK(bad == 0, "dx %dx%dx%d (acc %d): %d elements off", N, in, out, acc, bad);
        bad = 0;
        for (int j = 0; j < out; j++)
            for (int t = 0; t < in; t++) {
                double s = 0, mag = 0;
                for (int i = 0; i < N; i++) {
                    double p = dyr[(size_t)i * out + j] * xr[(size_t)i * in + t];
                    s += p;
                    mag += fabs(p);
                }
                bad += !close(dw[(size_t)j * in + t], (1 + acc) * s, N, (1 + acc) * mag);
            }
        CHECK(bad == 0, "dW %dx%dx%d (acc %d): %d elements off", N, in, out, acc, bad);
        bad = 0;
        for (int j = 0; j < out; j++) {
            double s = 0;
            for (int i = 0; i < N; i++) s += dy[(size_t)i * out + j]; /* fp32, not rounded */
            bad += fabs(db[j] - (1 + acc) * s) > 1e-4;
        }
        CHECK(bad == 0, "db (acc %d): %d elements off", acc, bad);
    }
    /* One part of stacked weights: dx from a column block of a wider dy, added (beta 1). */
    float *prev = malloc((size_t)N * in * 4);
    memcpy(prev, dx, (size_t)N * in * 4);
    k_bf16_linear_bwd_dx(k, dx, dy + 1, out, w, N, in, out - 1, 1.0f);
    bad = 0;
    for (int i = 0; i < N; i++)
        for (int t = 0; t < in; t++) {
            double s = prev[(size_t)i * in + t], mag = fabs(s);
            for (int j = 0; j < out - 1; j++) {
                double p = dyr[(size_t)i * out + 1 + j] * wr[(size_t)j * in + t];
                s += p;
                mag += fabs(p);
            }
            bad += !close(dx[(size_t)i * in + t], s, out, mag);
        }
    CHECK(bad == 0, "dx of a part %dx%dx%d: %d elements off", N, in, out, bad);
    free(prev);
    CHECK(k_bf16_fallbacks(k) == 0, "%ld products fell back to sgemm", k_bf16_fallbacks(k));
    /* dW from the forward's kept copy of x equals dW from x rounded afresh (a new pass, no
     * forward), bit for bit; and a forward over bytes overlapping x drops that copy: after x
     * changes, dW follows the new x. */
    float *dw2 = malloc((size_t)out * in * 4);
    k_bf16_next_pass(k);
    k_bf16_linear_fwd(k, y, ldy, x, w, NULL, N, in, out);
    k_bf16_linear_bwd(k, NULL, dw, NULL, dy, x, w, N, in, out, 0);
    k_bf16_next_pass(k);
    k_bf16_linear_bwd(k, NULL, dw2, NULL, dy, x, w, N, in, out, 0);
    CHECK(!memcmp(dw, dw2, (size_t)out * in * 4), "dW from the kept copy differs from afresh");
    if (N > 1) {
        k_bf16_linear_fwd(k, y, ldy, x, w, NULL, N, in, out);
        for (size_t i = 0; i < (size_t)N * in; i++) x[i] = -x[i];
        /* the second half of x's rows as the input of another product */
        int h = N / 2;
        k_bf16_linear_fwd(k, y, ldy, x + (size_t)h * in, w, NULL, N - h, in, out);
        k_bf16_linear_bwd(k, NULL, dw, NULL, dy, x, w, N, in, out, 0);
        k_bf16_next_pass(k);
        k_bf16_linear_bwd(k, NULL, dw2, NULL, dy, x, w, N, in, out, 0);
        CHECK(!memcmp(dw, dw2, (size_t)out * in * 4), "a stale copy of x served dW");
        for (size_t i = 0; i < (size_t)N * in; i++) x[i] = -x[i];
    }
    free(dw2);
    /* A changed weight is rounded again after k_bf16_next_pass, not before. */
    k_bf16_linear_fwd(k, y, ldy, x, w, NULL, N, in, out);
    float y0 = y[0];
    for (size_t i = 0; i < (size_t)out * in; i++) w[i] = -w[i];
    k_bf16_linear_fwd(k, y, ldy, x, w, NULL, N, in, out);
    CHECK(y[0] == y0, "a weight was rounded again within a pass");
    k_bf16_next_pass(k);
    k_bf16_linear_fwd(k, y, ldy, x, w, NULL, N, in, out);
    CHECK(y[0] == -y0, "the next pass used the stale weight (%g vs %g)", y[0], -y0);
    free(xr);
    free(wr);
    free(dyr);
    free(x);
    free(w);
    free(b);
    free(y);
    free(dy);
    free(dx);
    free(dw);
    free(db);
}

int main(void) {
    rounding();
    if (!k_bf16_supported()) {
        printf("test_bf16: no avx512_bf16 on this CPU: only the rounding was tested\n");
        return t_finish("test_bf16");
    }
    k_bf16 *k = k_bf16_new();
    CHECK(k != NULL, "k_bf16_new failed");
    if (!k) return t_finish("test_bf16");
    /* The same shapes again at another thread count: a primitive made for two threads must not
     * run on a team of one (test_bf16_thread_limit and _dynamic run this under short teams). */
    for (int threads = 2; threads >= 1; threads--) {
        omp_set_num_threads(threads);
        products(k, 37, 24, 19); /* odd sizes: no block divides them */
        products(k, 130, 64, 96);
        /* out >= 4 in: dW takes x packed by oneDNN's reorder instead of our rounding. */
        products(k, 45, 20, 83);
        products(k, 64, 32, 300);
    }
    k_bf16_free(k);
    return t_finish("test_bf16");
}
