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

/* The attention kernels' usual score scale. */
static float sc(int hd) { return 1.0f / sqrtf((float)hd); }

/* Training attention with bf16 products (k_bf16_attention_*) against double sums over the same
 * rounded operands. Each product is checked on its own: the reference takes the kernel's fp32
 * probabilities (rounded as the kernel rounds them) for P V and dV, so what is left is fp32
 * accumulation; dS is rounded from fp32 in the kernel and from double here, which may differ by
 * one bf16 step (2^-8 of it): dQ and dK allow that. The shapes leave partial vectors of columns,
 * odd pairs of rows, row tiles of every kind and causal tiles that skip work: a skipped score or a
 * sum stopped short shows as a wrong value. */
static void attention(k_bf16 *k, int B, int T, int H, int hd) {
    int ld = 3 * H * hd, ow = H * hd;
    size_t N = (size_t)B * T, TT = (size_t)T * T;
    float *qkv = malloc(N * ld * sizeof *qkv), *dout = malloc(N * ow * sizeof *dout);
    float *out = malloc(N * ow * sizeof *out), *probs = malloc(B * H * TT * sizeof *probs);
    float *dqkv = malloc(N * ld * sizeof *dqkv);
    fill(qkv, N * ld, 11);
    fill(dout, N * ow, 12);
    for (size_t i = 0; i < N * ld; i++) qkv[i] *= 2.0f; /* scores of a few units: peaked rows */
    CHECK(k_bf16_attention_fwd(k, out, probs, qkv, ld, B, T, H, H, hd, sc(hd), 0.0f, NULL, 0.0f),
          "bf16 attention forward refused");
    CHECK(k_bf16_attention_bwd(k, dqkv, dout, qkv, ld, probs, B, T, H, H, hd, sc(hd), 0.0f, NULL,
                               0.0f),
          "bf16 attention backward refused");
    /* The backward takes nothing from the forward but probs: in a later pass it is the same. */
    float *again = malloc(N * ld * sizeof *again);
    k_bf16_next_pass(k);
    CHECK(k_bf16_attention_bwd(k, again, dout, qkv, ld, probs, B, T, H, H, hd, sc(hd), 0.0f, NULL,
                               0.0f),
          "bf16 attention backward refused");
    CHECK(!memcmp(again, dqkv, N * ld * sizeof *again), "the backward differs in a later pass");
    /* Without probs each head's are computed again: the same gradients bit for bit. */
    memset(again, 0xff, N * ld * sizeof *again);
    CHECK(k_bf16_attention_bwd(k, again, dout, qkv, ld, NULL, B, T, H, H, hd, sc(hd), 0.0f, NULL,
                               0.0f),
          "bf16 attention backward refused without probs");
    CHECK(!memcmp(again, dqkv, N * ld * sizeof *again),
          "the backward computing the probabilities again differs");
    free(again);
    double *x = rounded(qkv, N * ld), *dO = rounded(dout, N * ow), *P = rounded(probs, B * H * TT);
    double scale = 1.0 / sqrt((double)hd), *s = malloc(T * sizeof *s),
           *dS = malloc(TT * sizeof *dS);
    int bad_p = 0, bad_o = 0, bad_v = 0, bad_q = 0, bad_k = 0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const float *Pk = probs + ((size_t)b * H + h) * TT; /* keys by queries */
            const double *Pr = P + ((size_t)b * H + h) * TT;
#define Q(t, d) x[((size_t)b * T + (t)) * ld + (size_t)h * hd + (d)]
#define K(t, d) x[((size_t)b * T + (t)) * ld + ow + (size_t)h * hd + (d)]
#define V(t, d) x[((size_t)b * T + (t)) * ld + 2 * ow + (size_t)h * hd + (d)]
#define DO(t, d) dO[((size_t)b * T + (t)) * ow + (size_t)h * hd + (d)]
#define G(t, part, d) dqkv[((size_t)b * T + (t)) * ld + (part)*ow + (size_t)h * hd + (d)]
            for (int t = 0; t < T; t++) {
                /* probabilities: softmax over keys 0..t, zeros beyond */
                double mx = -1e300, sum = 0;
                for (int j = 0; j <= t; j++) {
                    double v = 0;
                    for (int d = 0; d < hd; d++) v += Q(t, d) * K(j, d);
                    s[j] = v * scale;
                    mx = s[j] > mx ? s[j] : mx;
                }
                for (int j = 0; j <= t; j++) sum += (s[j] = exp(s[j] - mx));
                for (int j = 0; j < T; j++) {
                    double want = j <= t ? s[j] / sum : 0.0, got = Pk[(size_t)j * T + t];
                    bad_p += !(fabs(got - want) <= 1e-5 * want + 1e-7);
                }
                /* out = P V and dP = dO V^T, then dS in double from the kernel's P */
                double dot = 0;
                for (int j = 0; j <= t; j++) {
                    double dp = 0;
                    for (int d = 0; d < hd; d++) dp += DO(t, d) * V(j, d);
                    dS[(size_t)t * T + j] = dp;
                    dot += Pk[(size_t)j * T + t] * dp;
                }
                for (int j = 0; j <= t; j++)
                    dS[(size_t)t * T + j] =
                        Pk[(size_t)j * T + t] * (dS[(size_t)t * T + j] - dot) * scale;
                for (int d = 0; d < hd; d++) {
                    double want = 0, mag = 0;
                    for (int j = 0; j <= t; j++) {
                        want += Pr[(size_t)j * T + t] * V(j, d);
                        mag += fabs(Pr[(size_t)j * T + t] * V(j, d));
                    }
                    bad_o += !close(out[((size_t)b * T + t) * ow + (size_t)h * hd + d], want, t + 1,
                                    mag);
                    double wq = 0, mq = 0;
                    for (int j = 0; j <= t; j++) {
                        wq += dS[(size_t)t * T + j] * K(j, d);
                        mq += fabs(dS[(size_t)t * T + j] * K(j, d));
                    }
                    bad_q += !(fabs(G(t, 0, d) - wq) <= 0x1p-8 * mq + 1e-6);
                }
            }
            for (int j = 0; j < T; j++)
                for (int d = 0; d < hd; d++) {
                    double wv = 0, mv = 0, wk = 0, mk = 0;
                    for (int t = j; t < T; t++) {
                        wv += Pr[(size_t)j * T + t] * DO(t, d);
                        mv += fabs(Pr[(size_t)j * T + t] * DO(t, d));
                        wk += dS[(size_t)t * T + j] * Q(t, d);
                        mk += fabs(dS[(size_t)t * T + j] * Q(t, d));
                    }
                    bad_v += !close(G(j, 2, d), wv, T - j, mv);
                    bad_k += !(fabs(G(j, 1, d) - wk) <= 0x1p-8 * mk + 1e-6);
                }
#undef Q
#undef K
#undef V
#undef DO
#undef G
        }
    CHECK(bad_p == 0, "attention B%d T%d H%d hd%d: %d probabilities off", B, T, H, hd, bad_p);
    CHECK(bad_o == 0, "attention B%d T%d H%d hd%d: %d outputs off", B, T, H, hd, bad_o);
    CHECK(bad_v == 0, "attention B%d T%d H%d hd%d: %d of dV off", B, T, H, hd, bad_v);
    CHECK(bad_q == 0, "attention B%d T%d H%d hd%d: %d of dQ off", B, T, H, hd, bad_q);
    CHECK(bad_k == 0, "attention B%d T%d H%d hd%d: %d of dK off", B, T, H, hd, bad_k);
    /* Query heads that do not divide into the kv heads' groups, and dropout, are left to the
     * fp32 kernels. */
    CHECK(!k_bf16_attention_fwd(k, out, probs, qkv, ld, B, T, H, H + 1, hd, sc(hd), 0.0f, NULL,
                                0.0f) &&
              !k_bf16_attention_bwd(k, dqkv, dout, qkv, ld, probs, B, T, H, H, hd, sc(hd), 0.0f,
                                    NULL, 0.1f) &&
              !k_bf16_attention_fwd(NULL, out, probs, qkv, ld, B, T, H, H, hd, sc(hd), 0.0f, NULL,
                                    0.0f),
          "bf16 attention accepted grouped heads, dropout or no state");
    /* A NaN score must reach the output (training stops on a NaN loss), not be clamped away. */
    qkv[0] = NAN;
    CHECK(k_bf16_attention_fwd(k, out, probs, qkv, ld, B, T, H, H, hd, sc(hd), 0.0f, NULL, 0.0f) &&
              isnan(probs[0]) && isnan(out[0]),
          "a NaN query did not reach the probabilities and the output");
    if (hd == 16) /* the same rows as heads of 8: not a whole vector */
        CHECK(!k_bf16_attention_fwd(k, out, probs, qkv, ld, B, T, 2 * H, 2 * H, 8, 0.5f, 0.0f, NULL,
                                    0.0f),
              "bf16 attention accepted a head size of 8");
    free(qkv), free(dout), free(out), free(probs), free(dqkv);
    free(x), free(dO), free(P), free(s), free(dS);
}

/* Grouped kv heads (KVH of them, H / KVH query heads each) compute what the same attention with
 * every query head given its own copy of its group's k and v computes, bit for bit: the same
 * outputs, probabilities and dQ, and each kv head's dK and dV the sum of its copies' in head
 * order. With and without the forward's probabilities. */
static void grouped(k_bf16 *k, int B, int T, int H, int KVH, int hd) {
    int group = H / KVH, ow = H * hd, kw = KVH * hd, ldg = ow + 2 * kw, ldm = 3 * ow;
    size_t N = (size_t)B * T, TT = (size_t)T * T;
    float *g = malloc(N * ldg * sizeof *g), *m = malloc(N * ldm * sizeof *m);
    float *dout = malloc(N * ow * sizeof *dout);
    float *outg = malloc(N * ow * sizeof *outg), *outm = malloc(N * ow * sizeof *outm);
    float *pg = malloc(B * H * TT * sizeof *pg), *pm = malloc(B * H * TT * sizeof *pm);
    float *dg = malloc(N * ldg * sizeof *dg), *dm = malloc(N * ldm * sizeof *dm);
    float *dg2 = malloc(N * ldg * sizeof *dg2);
    fill(g, N * ldg, 21);
    fill(dout, N * ow, 22);
    for (size_t r = 0; r < N; r++) {
        memcpy(m + r * ldm, g + r * ldg, (size_t)ow * sizeof *m);
        for (int h = 0; h < H; h++)
            for (int part = 1; part <= 2; part++)
                memcpy(m + r * ldm + (size_t)part * ow + (size_t)h * hd,
                       g + r * ldg + ow + (size_t)(part - 1) * kw + (size_t)(h / group) * hd,
                       (size_t)hd * sizeof *m);
    }
    CHECK(k_bf16_attention_fwd(k, outg, pg, g, ldg, B, T, H, KVH, hd, sc(hd), 0.0f, NULL, 0.0f) &&
              k_bf16_attention_fwd(k, outm, pm, m, ldm, B, T, H, H, hd, sc(hd), 0.0f, NULL, 0.0f),
          "bf16 attention refused grouped heads");
    CHECK(!memcmp(outg, outm, N * ow * sizeof *outg) && !memcmp(pg, pm, B * H * TT * sizeof *pg),
          "grouped heads H%d KVH%d: outputs or probabilities differ from copied heads", H, KVH);
    CHECK(
        k_bf16_attention_bwd(k, dg, dout, g, ldg, pg, B, T, H, KVH, hd, sc(hd), 0.0f, NULL, 0.0f) &&
            k_bf16_attention_bwd(k, dg2, dout, g, ldg, NULL, B, T, H, KVH, hd, sc(hd), 0.0f, NULL,
                                 0.0f) &&
            k_bf16_attention_bwd(k, dm, dout, m, ldm, pm, B, T, H, H, hd, sc(hd), 0.0f, NULL, 0.0f),
        "bf16 attention backward refused grouped heads");
    CHECK(!memcmp(dg, dg2, N * ldg * sizeof *dg),
          "grouped heads: the backward computing the probabilities again differs");
    long bad = 0;
    for (size_t r = 0; r < N; r++) {
        const float *a = dg + r * ldg, *c = dm + r * ldm;
        for (int j = 0; j < ow; j++) bad += a[j] != c[j];
        for (int part = 1; part <= 2; part++)
            for (int kv = 0; kv < KVH; kv++)
                for (int d = 0; d < hd; d++) {
                    float sum = 0.0f;
                    for (int i = 0; i < group; i++) {
                        float v = c[(size_t)part * ow + (size_t)(kv * group + i) * hd + d];
                        sum = i ? sum + v : v;
                    }
                    bad += a[ow + (size_t)(part - 1) * kw + (size_t)kv * hd + d] != sum;
                }
    }
    CHECK(bad == 0, "grouped heads B%d T%d H%d KVH%d hd%d: %ld gradients differ from the copies'",
          B, T, H, KVH, hd, bad);
    free(g), free(m), free(dout), free(outg), free(outm), free(pg), free(pm), free(dg), free(dm);
    free(dg2);
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
        attention(k, 2, 70, 3, 16);
        attention(k, 3, 64, 2, 32);  /* whole vectors, 8 row tiles */
        attention(k, 2, 33, 2, 64);  /* odd: a pair half empty; 4 vectors, 6 row tiles */
        attention(k, 1, 130, 2, 48); /* 3 vectors; scores 9 vectors wide, in chunks of 4 */
        grouped(k, 2, 70, 4, 2, 16);
        grouped(k, 3, 33, 6, 2, 32);
        grouped(k, 1, 64, 3, 1, 48); /* one kv head for every query head */
    }
    k_bf16_free(k);
    return t_finish("test_bf16");
}
