/* The prompt-sized products (src/kernels/qgemm.c, fgemm.c; the kernels in ref/ and x86/), each
 * fast kernel against its plain C reference on every instruction set this CPU runs. For every
 * block type, k_qgemm with the reference kernels against the widened weights
 * (core_dtype_to_f32, ggml's dequantization) times the activations as quantized
 * (k_qgemm_quantize), summed in double: this checks the repacking, the offsets and scales and the
 * micro-kernel, on row counts that are not multiples of the 16-row group, 9 to 130 activation
 * rows (every tail of the 8-row micro-kernel), random, extreme-scale and largest-magnitude blocks.
 * Then bit for bit against that reference: the AVX-512 repacking (group by group), the activation
 * quantizers, and the products on AVX-512 VNNI, AMX int8, AVX2's maddubs and AVX-VNNI (the same
 * integer sums, then the same fp32 operations in the same order). BF16 (the reference,
 * vdpbf16ps, AMX tiles; activations rounded to BF16) against the exact sum of the same BF16
 * values. F32 and F16 (k_fgemm's register tiles) against the exact sum, and bit for bit against
 * their plain C tiles. The decode attention of one query over cached keys and values
 * (k_attend_row), on caches of every type (F32, F16, BF16 and llama.cpp's block types), against
 * softmax and the weighted sum in double of the values the cache holds; the F16 cache's row
 * conversions against the scalar ones. Prefill's causal attention of a block of queries
 * (k_attend_causal) the same way, per query over the keys up to its position. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/half.h"
#include "core/quant.h"
#include "harness.h"
#include "kernels/cpu.h"
#include "kernels/gemm_traits.h"
#include "kernels/kernels.h"
#include "kernels/qdot.h"
#include "kernels/qgemm.h"
#include "kernels/traits.h"

static const tlm_dtype types[] = {TLM_DTYPE_Q8_0, TLM_DTYPE_Q4_0,   TLM_DTYPE_Q4_1,
                                  TLM_DTYPE_Q5_0, TLM_DTYPE_Q5_1,   TLM_DTYPE_Q2_K,
                                  TLM_DTYPE_Q3_K, TLM_DTYPE_Q4_K,   TLM_DTYPE_Q5_K,
                                  TLM_DTYPE_Q6_K, TLM_DTYPE_IQ4_NL, TLM_DTYPE_IQ4_XS};
#define NTYPES (int)(sizeof types / sizeof types[0])

static void put_f16(uint8_t *p, float v) {
    uint16_t h = core_f32_to_f16(v);
    memcpy(p, &h, 2);
}

/* Random bytes, then the f16 scales (and mins) set. mode 0: scales in (-2, 2); 1: alternating
 * tiny (1e-4) and large (3e3) blocks; 2: every quant byte 0xFF, scales 1 (the largest unsigned
 * weights, where the 8-bit sums are largest). */
static void fill(tlm_dtype t, uint8_t *w, size_t bytes, int mode) {
    const core_dtype_info *d = core_dtype_get(t);
    for (size_t i = 0; i < bytes; i++) w[i] = mode == 2 ? 0xFF : (uint8_t)t_rnd();
    int off[2] = {0, 2}, nsc = 2;
    if (t == TLM_DTYPE_Q8_0 || t == TLM_DTYPE_Q4_0 || t == TLM_DTYPE_Q5_0 ||
        t == TLM_DTYPE_IQ4_NL || t == TLM_DTYPE_IQ4_XS)
        nsc = 1;
    if (t == TLM_DTYPE_Q6_K) off[0] = 208, nsc = 1;
    if (t == TLM_DTYPE_Q3_K) off[0] = 108, nsc = 1;
    if (t == TLM_DTYPE_Q2_K) off[0] = 80, off[1] = 82;
    for (size_t b = 0; b < bytes / d->block_bytes; b++) {
        uint8_t *blk = w + b * d->block_bytes;
        for (int j = 0; j < nsc; j++) {
            float v = mode == 2 ? 1.0f : t_unif() * 2.0f;
            if (mode == 1) v = (b % 2 ? 3e3f : 1e-4f) * (t_unif() < 0 ? -1.0f : 1.0f);
            put_f16(blk + off[j], v);
        }
    }
}

/* Largest |y - exact| / (sum of |terms|) over y[N, out] (row stride out) = x W^T + b, the exact
 * sum taken in double from the operands as the kernel sees them: wf[out, in], xf[N, in]. */
static double worst_rel(const float *y, const float *wf, const float *xf, const float *b, int in,
                        int out, int N) {
    double worst = 0;
    for (int i = 0; i < N; i++)
        for (int r = 0; r < out; r++) {
            double s = b[r], mag = fabs(b[r]);
            for (int k = 0; k < in; k++) {
                double p = (double)wf[(size_t)r * in + k] * xf[(size_t)i * in + k];
                s += p;
                mag += fabs(p);
            }
            double e = fabs(y[(size_t)i * out + r] - s) / (mag + 1e-30);
            worst = e > worst || isnan(e) ? e : worst;
        }
    return worst;
}

/* The CPU runs the AVX-512 kernels (whatever TLM_ISA says: the tests ask for them by name). */
static int k_simd_ok(void) { return k_cpu()->isa >= K_ISA_AVX512; }

static void check(tlm_dtype t, int in, int out, int N, int mode) {
    const char *name = tlm_dtype_name(t);
    int sub = k_qgemm_sub(t);
    size_t rb = core_dtype_bytes(t, (uint64_t)in);
    uint8_t *w = malloc(rb * out);
    float *wf = malloc(sizeof(float) * in * out), *x = malloc(sizeof(float) * in * N);
    float *xdq = malloc(sizeof(float) * in * N), *b = malloc(sizeof(float) * out);
    float *y0 = malloc(sizeof(float) * out * N), *y1 = malloc(sizeof(float) * out * N);
    int8_t *xq = malloc((size_t)in);
    float *xd = malloc(sizeof(float) * (in / 32)), *xs = malloc(sizeof(float) * (in / sub));
    fill(t, w, rb * out, mode);
    CHECK_OK(core_dtype_to_f32(t, w, wf, (size_t)in * out));
    /* mode 2 (every weight byte 0xFF): activations all 127 after quantizing too, the largest
     * int16 pair sums AVX2's maddubs kernel adds up */
    for (int i = 0; i < in * N; i++)
        x[i] = mode == 2 ? 1.0f : t_unif() * (i % 97 == 0 ? 50.0f : 1.0f);
    for (int r = 0; r < out; r++) b[r] = t_unif();
    /* the activations as the kernels see them, and the sums they must carry */
    int sums_ok = 1;
    for (int i = 0; i < N; i++) {
        k_qgemm_quantize(x + (size_t)i * in, in, sub, xq, xd, xs);
        for (int k = 0; k < in; k++) xdq[(size_t)i * in + k] = (float)xq[k] * xd[k / 32];
        for (int j = 0; j < in / sub; j++) {
            int s = 0;
            for (int k = j * sub; k < (j + 1) * sub; k++) s += xq[k];
            sums_ok &= xs[j] == xd[j * sub / 32] * (float)s;
        }
    }
    CHECK(sums_ok, "%s: activation sums per sub-block of %d", name, sub);
    tlm_weight tw = {.dtype = t, .data = w, .rows = out, .cols = in, .row_bytes = rb};
    /* the reference repacking's bytes stay within what the type's record promises AVX2's maddubs
     * kernel (mode 2's bytes reach it), and the vector repacking gives the same bytes and floats,
     * group by group */
    const k_gemm_ops *ops = k_gemm_ops_of(t);
    size_t qb = (size_t)in * 16, sb = sizeof(float) * 16 * (in / sub);
    uint8_t *p0 = malloc(qb + 2 * sb), *p1 = malloc(qb + 2 * sb);
    int same = 1, qmax = 0;
    for (int r0 = 0; r0 < out; r0 += 16) {
        int nr = out - r0 < 16 ? out - r0 : 16;
        memset(p0, 0xAB, qb + 2 * sb);
        memset(p1, 0xCD, qb + 2 * sb);
        k_qgemm_pack(&tw, r0, nr, p0, (float *)(p0 + qb), (float *)(p0 + qb + sb));
        for (size_t i = 0; i < qb; i++) qmax = p0[i] > qmax ? p0[i] : qmax;
        if (k_simd_ok()) {
            k_qgemm_pack_isa(K_ISA_AVX512, &tw, r0, nr, p1, (float *)(p1 + qb),
                             (float *)(p1 + qb + sb));
            same &= !memcmp(p0, p1, qb + 2 * sb);
        }
    }
    CHECK(same, "%s in=%d out=%d mode %d: AVX-512 repacking equals the reference", name, in, out,
          mode);
    CHECK(!ops->maddubs_max || qmax <= ops->maddubs_max, "%s: byte %d past maddubs_max %d", name,
          qmax, ops->maddubs_max);
    CHECK(mode != 2 || !ops->maddubs_max || qmax == ops->maddubs_max,
          "%s: largest byte %d, maddubs_max %d", name, qmax, ops->maddubs_max);
    free(p0), free(p1);
    memset(y0, 0xFF, sizeof(float) * out * N);
    CHECK(k_qgemm(y0, out, x, N, &tw, b, K_ISA_REF) == 0, "%s: reference product", name);
    /* fp32 sums of a few dozen sub-block terms, each exact in int32 then scaled; the offset terms
     * (-128 s for Q8_0's unsigned bytes) cancel part of the sum, hence some slack */
    double worst = worst_rel(y0, wf, xdq, b, in, out, N);
    CHECK(worst <= 1e-5, "%s in=%d out=%d N=%d mode %d: reference %g from the exact product", name,
          in, out, N, mode, worst);
    /* registered (as a model's file is): nothing kept by default; with the pack cache on,
     * repacked once, kept, and the same products */
    k_qgemm_register(w, rb * out);
    memset(y1, 0xFF, sizeof(float) * out * N);
    CHECK(k_qgemm(y1, out, x, N, &tw, b, K_ISA_REF) == 0 &&
              !memcmp(y0, y1, sizeof(float) * out * N) && k_qgemm_cached_bytes(w, rb * out) == 0,
          "%s: nothing kept by default", name);
    k_qgemm_cache_enable(1);
    CHECK(k_qgemm_cached_bytes(w, rb * out) == 0, "%s: nothing kept before the first product",
          name);
    for (int rep = 0; rep < 2; rep++) {
        memset(y1, 0xFF, sizeof(float) * out * N);
        CHECK(k_qgemm(y1, out, x, N, &tw, b, K_ISA_REF) == 0 &&
                  !memcmp(y0, y1, sizeof(float) * out * N),
              "%s: the kept copy gives the same product (call %d)", name, rep);
    }
    size_t want = (size_t)((out + 15) / 16) * (16 * in + 2 * 16 * (in / sub) * sizeof(float));
    CHECK(k_qgemm_cached_bytes(w, rb * out) == want, "%s: kept %zu bytes, want %zu", name,
          k_qgemm_cached_bytes(w, rb * out), want);
    k_qgemm_forget(w, rb * out);
    CHECK(k_qgemm_cached_bytes(w, rb * out) == 0, "%s: forgotten", name);
    k_qgemm_cache_enable(0);
    /* VNNI's micro-kernel, then AMX's int8 tiles where the CPU has them: both bit for bit */
    for (int amx = 0; amx < 2 && k_simd_ok(); amx++) {
        k_qgemm_amx_enable(amx);
        if (amx && !k_qgemm_amx_int8_ok()) break;
        memset(y1, 0xFF, sizeof(float) * out * N);
        CHECK(k_qgemm(y1, out, x, N, &tw, b, K_ISA_AVX512) == 0, "%s: AVX-512 product (amx %d)",
              name, amx);
        CHECK(!memcmp(y0, y1, sizeof(float) * out * N),
              "%s in=%d out=%d N=%d mode %d amx %d: AVX-512 equals the reference", name, in, out, N,
              mode, amx);
    }
    k_qgemm_amx_enable(1);
    /* AVX2's micro-kernels, bit for bit too: maddubs for the types whose integer form it takes,
     * and (where the CPU has AVX-VNNI) 256-bit vpdpbusd for all */
    for (int vnni = 0; vnni < 2 && k_isa() >= K_ISA_AVX2; vnni++) {
        k_qgemm_avxvnni_enable(vnni);
        if (vnni && !k_qgemm_avxvnni_ok()) break;
        int takes = vnni || (t != TLM_DTYPE_Q8_0 && t != TLM_DTYPE_IQ4_NL && t != TLM_DTYPE_IQ4_XS);
        memset(y1, 0xFF, sizeof(float) * out * N);
        int rc = k_qgemm(y1, out, x, N, &tw, b, K_ISA_AVX2);
        CHECK(rc == (takes ? 0 : -1), "%s: AVX2 product (avx-vnni %d) %s", name, vnni,
              takes ? "taken" : "refused");
        if (takes)
            CHECK(!memcmp(y0, y1, sizeof(float) * out * N),
                  "%s in=%d out=%d N=%d mode %d: AVX2 (avx-vnni %d) equals the reference", name, in,
                  out, N, mode, vnni);
    }
    k_qgemm_avxvnni_enable(1);
    free(w);
    free(wf);
    free(x);
    free(xdq);
    free(b);
    free(y0);
    free(y1);
    free(xq);
    free(xd);
    free(xs);
}

/* BF16: activations rounded to BF16, products exact in fp32; each kernel against the double sum. */
static void check_bf16(int in, int out, int N) {
    uint16_t *w = malloc(2 * (size_t)in * out);
    float *x = malloc(sizeof(float) * in * N), *y = malloc(sizeof(float) * out * N);
    float *b = malloc(sizeof(float) * out);
    for (int i = 0; i < in * out; i++)
        w[i] = core_f32_to_bf16(t_unif() * (i % 53 == 0 ? 1e3f : i % 59 == 0 ? 1e-3f : 1.0f));
    for (int i = 0; i < in * N; i++) x[i] = t_unif() * (i % 97 == 0 ? 50.0f : 1.0f);
    for (int r = 0; r < out; r++) b[r] = t_unif();
    /* the operands as the kernels see them: activations rounded to BF16 */
    float *wf = malloc(sizeof(float) * in * out), *xr = malloc(sizeof(float) * in * N);
    for (int i = 0; i < in * out; i++) wf[i] = core_bf16_to_f32(w[i]);
    for (int i = 0; i < in * N; i++) xr[i] = core_bf16_to_f32(core_f32_to_bf16(x[i]));
    tlm_weight tw = {
        .dtype = TLM_DTYPE_BF16, .data = w, .rows = out, .cols = in, .row_bytes = 2 * in};
    /* the reference, vdpbf16ps, and AMX's tiles where the CPU has them (K_ISA_AVX512 with AMX
     * turned on) */
    for (int pass = 0; pass < 3; pass++) {
        int isa = pass == 0 ? K_ISA_REF : K_ISA_AVX512, amx = pass == 2;
        k_qgemm_amx_enable(amx);
        if (amx && !k_qgemm_amx_ok()) continue;
        if (isa == K_ISA_AVX512 && !k_qgemm_bf16_ok()) {
            CHECK(k_qgemm(y, out, x, N, &tw, b, isa) == -1, "BF16 refused without AVX512_BF16");
            continue;
        }
        memset(y, 0xFF, sizeof(float) * out * N);
        CHECK(k_qgemm(y, out, x, N, &tw, b, isa) == 0, "BF16 product (isa %d, amx %d)", isa, amx);
        double worst = worst_rel(y, wf, xr, b, in, out, N);
        CHECK(worst <= 1e-5, "BF16 in=%d out=%d N=%d isa %d amx %d: %g from the exact product", in,
              out, N, isa, amx, worst);
        if (N > 16) {
            /* 16 rows alone make one tile: each row's sums match those of the wider tiling */
            float *y16 = malloc(sizeof(float) * out * 16);
            CHECK(k_qgemm(y16, out, x, 16, &tw, b, isa) == 0 &&
                      !memcmp(y16, y, sizeof(float) * out * 16),
                  "BF16 in=%d out=%d N=%d isa %d amx %d: rows independent of the tiling", in, out,
                  N, isa, amx);
            free(y16);
        }
    }
    k_qgemm_amx_enable(1);
    free(w);
    free(wf);
    free(x);
    free(xr);
    free(y);
    free(b);
}

/* F32 and F16 weights on k_fgemm: fp32 products of the weights as stored (F16 widened exactly)
 * against the double sum, with a row stride wider than the row for F32; rows independent of N. */
static void check_fgemm(tlm_dtype t, int in, int out, int N) {
    int f16 = t == TLM_DTYPE_F16, ld = f16 ? in : in + 3;
    size_t rb = f16 ? 2 * (size_t)in : 4 * (size_t)ld;
    uint8_t *w = malloc(rb * out);
    float *wf = malloc(sizeof(float) * in * out), *x = malloc(sizeof(float) * in * N);
    float *y = malloc(sizeof(float) * out * N), *y16 = malloc(sizeof(float) * out * 16);
    float *b = malloc(sizeof(float) * out), *yr = malloc(sizeof(float) * out * N);
    for (int r = 0; r < out; r++)
        for (int k = 0; k < in; k++) {
            float v = t_unif() * ((r * in + k) % 53 == 0 ? 1e3f : 1.0f);
            if (f16) {
                uint16_t h = core_f32_to_f16(v);
                memcpy(w + r * rb + 2 * k, &h, 2);
                v = core_f16_to_f32(h);
            } else {
                memcpy(w + r * rb + 4 * k, &v, 4);
            }
            wf[(size_t)r * in + k] = v;
        }
    for (int i = 0; i < in * N; i++) x[i] = t_unif() * (i % 97 == 0 ? 50.0f : 1.0f);
    for (int r = 0; r < out; r++) b[r] = t_unif();
    tlm_weight tw = {.dtype = t, .data = w, .rows = out, .cols = in, .row_bytes = rb};
    /* the plain C tiles, on every CPU */
    memset(yr, 0xFF, sizeof(float) * out * N);
    CHECK(k_fgemm_at(yr, out, x, N, &tw, b, K_ISA_REF) == 0, "%s fgemm reference",
          tlm_dtype_name(t));
    double worst = worst_rel(yr, wf, x, b, in, out, N);
    CHECK(worst <= 1e-5, "%s fgemm reference in=%d out=%d N=%d: %g from the exact product",
          tlm_dtype_name(t), in, out, N, worst);
    if (!k_fgemm_ok()) {
        CHECK(k_fgemm(y, out, x, N, &tw, b) == -1, "%s refused without AVX-512", tlm_dtype_name(t));
    } else {
        memset(y, 0xFF, sizeof(float) * out * N);
        CHECK(k_fgemm(y, out, x, N, &tw, b) == 0, "%s fgemm product", tlm_dtype_name(t));
        worst = worst_rel(y, wf, x, b, in, out, N);
        CHECK(worst <= 1e-5, "%s fgemm in=%d out=%d N=%d: %g from the exact product",
              tlm_dtype_name(t), in, out, N, worst);
        /* the same fused multiply-adds in the same order as the reference's */
        CHECK(!memcmp(y, yr, sizeof(float) * out * N),
              "%s fgemm in=%d out=%d N=%d: AVX-512 equals the reference", tlm_dtype_name(t), in,
              out, N);
        /* rows past 8 in tiles of 16, up to 8 in pairs of columns: within each, a row's sums
         * do not depend on the others */
        int part = N > 16 ? 16 : N > 1 && N <= 8 ? 1 : 0;
        if (part)
            CHECK(k_fgemm(y16, out, x, part, &tw, b) == 0 &&
                      !memcmp(y16, y, sizeof(float) * out * part),
                  "%s fgemm in=%d out=%d N=%d: rows independent of the tiling", tlm_dtype_name(t),
                  in, out, N);
    }
    free(w);
    free(wf);
    free(x);
    free(y);
    free(y16);
    free(b);
    free(yr);
}

/* The activation rows' quantizers at each instruction set this CPU runs give the reference's
 * int8 values, scales and sums (sub-blocks of 16 and 32): rows of every magnitude, a block of
 * zeros, blocks whose products x * 127 / amax fall on ties (x.5: to even), a negative maximum. */
static void check_quantize(void) {
    enum { N = 32 * 40 };
    float *x = malloc(sizeof(float) * N), *d[2], *ds[2];
    int8_t *q[2];
    for (int i = 0; i < N; i++)
        x[i] = (2.0f * t_unif() - 1.0f) * ldexpf(1.0f, (int)(t_unif() * 30.0f) - 15);
    for (int i = 0; i < 32; i++) x[32 + i] = 0.0f;
    for (int i = 0; i < 32; i++) x[64 + i] = i == 0 ? 127.0f : (float)(i % 16) + 0.5f;
    for (int i = 0; i < 32; i++) x[96 + i] = i == 5 ? -127.0f : -(float)(i % 9) - 0.5f;
    for (int k = 0; k < 2; k++) {
        q[k] = malloc(N), d[k] = malloc(sizeof(float) * N / 32);
        ds[k] = malloc(sizeof(float) * N / 16);
    }
    static const int isas[] = {K_ISA_AVX2, K_ISA_AVX512};
    for (int sub = 16; sub <= 32; sub += 16) {
        k_qgemm_quantize(x, N, sub, q[0], d[0], ds[0]);
        CHECK(q[0][64 + 1] == 2 && q[0][64 + 2] == 2, "1.5 and 2.5 round to 2");
        for (int i = 0; i < 2; i++) {
            if (k_cpu()->isa < isas[i]) continue;
            memset(q[1], 0x55, N), memset(d[1], 0x55, sizeof(float) * N / 32);
            memset(ds[1], 0x55, sizeof(float) * N / 16);
            k_qgemm_quantize_isa(isas[i], x, N, sub, q[1], d[1], ds[1]);
            CHECK(!memcmp(q[0], q[1], N) && !memcmp(d[0], d[1], sizeof(float) * N / 32) &&
                      !memcmp(ds[0], ds[1], sizeof(float) * N / sub),
                  "activation quantizer at isa %d, sub-blocks of %d: the reference's results",
                  isas[i], sub);
        }
    }
    for (int k = 0; k < 2; k++) free(q[k]), free(d[k]), free(ds[k]);
    free(x);
}

/* n cached key and value elements: every seventh key element eight times larger, so that scores
 * spread and the maximum's subtraction matters. The cache's rows of kinds kk and kv (K_KV_) in Kc
 * and Vc (2 n bytes each, which every type's bytes per element fit in), and K and V then hold the
 * values it holds (widened by core_dtype_to_f32) for the reference. */
static tlm_dtype kind_type(int kind) {
    static const tlm_dtype kv_types[] = {
        [K_KV_F32] = TLM_DTYPE_F32,      [K_KV_F16] = TLM_DTYPE_F16,
        [K_KV_BF16] = TLM_DTYPE_BF16,    [K_KV_Q8_0] = TLM_DTYPE_Q8_0,
        [K_KV_Q4_0] = TLM_DTYPE_Q4_0,    [K_KV_Q4_1] = TLM_DTYPE_Q4_1,
        [K_KV_Q5_0] = TLM_DTYPE_Q5_0,    [K_KV_Q5_1] = TLM_DTYPE_Q5_1,
        [K_KV_IQ4_NL] = TLM_DTYPE_IQ4_NL};
    return kv_types[kind];
}

/* One of the two: rows of kind `kind` in c, x then holding their values. */
static void fill_rows(float *x, void *c, int n, int kind) {
    if (kind == K_KV_F32) return;
    tlm_dtype t = kind_type(kind);
    CHECK(k_kv_kind(t) == kind, "k_kv_kind of %s", tlm_dtype_name(t));
    core_dtype_from_f32(t, x, c, (size_t)n);
    core_dtype_to_f32(t, c, x, (size_t)n);
}

static void fill_cache(float *K, float *V, void *Kc, void *Vc, int n, int kk, int kv) {
    for (int i = 0; i < n; i++) {
        K[i] = (2.0f * t_unif() - 1.0f) * (i % 7 == 0 ? 8.0f : 1.0f);
        V[i] = 2.0f * t_unif() - 1.0f;
    }
    fill_rows(K, Kc, n, kk);
    fill_rows(V, Vc, n, kv);
}

/* Head sizes the vector kernels take for a cache of kind kv: a block type's rows must be whole
 * blocks. */
static int attend_takes(int hd, int kv) {
    if (k_isa() < K_ISA_AVX512) return 0;
    if (kv != K_KV_F32 && kv != K_KV_F16 && kv != K_KV_BF16 && hd % 32) return 0;
    return hd == 32 || hd == 48 || hd == 64 || hd == 96 || hd == 128;
}

/* T consecutive queries at positions first..first+T-1 over the keys up to each one's own
 * position (k_attend_causal, prefill's attention), every query's output against the exact causal
 * attention in double. The query rows sit in a wider buffer (ldq, ldo > hd) as the fused q|k|v
 * rows do; the outputs' gaps must stay untouched. T covers whole blocks of 8, 4 and 2 queries and
 * every tail, first a cache already holding keys; scratch is sized exactly as the header says, and
 * padded with NaN, which a read past what the kernel fills would carry into the outputs. */
static void check_attend_causal(int hd, int T, int first, int kk, int kv) {
    int S = first + T, ldq = hd + 5, ldo = hd + 3;
    size_t span = K_CAUSAL_SPAN(S);
    float *q = malloc(sizeof(float) * T * ldq), *K = malloc(sizeof(float) * S * hd);
    float *V = malloc(sizeof(float) * S * hd), *o = malloc(sizeof(float) * T * ldo);
    float *kt = malloc(sizeof(float) * hd * span), *p = malloc(sizeof(float) * 8 * span);
    void *Kc = malloc(2 * (size_t)S * hd), *Vc = malloc(2 * (size_t)S * hd);
    double *ref = malloc(sizeof(double) * S);
    for (size_t i = 0; i < hd * span; i++) kt[i] = NAN;
    for (size_t i = 0; i < 8 * span; i++) p[i] = NAN;
    for (int i = 0; i < T * ldo; i++) o[i] = 7.0f;
    for (int i = 0; i < T * ldq; i++) q[i] = 2.0f * t_unif() - 1.0f;
    fill_cache(K, V, Kc, Vc, S * hd, kk, kv);
    float scale = 1.0f / sqrtf((float)hd);
    int ok = k_attend_causal(q, (size_t)ldq, kk ? Kc : K, kv ? Vc : V, kk, kv, T, first, hd, scale,
                             kt, p, o, (size_t)ldo);
    CHECK(ok == (attend_takes(hd, kk) && attend_takes(hd, kv) ? 0 : -1),
          "attend_causal hd=%d T=%d first=%d kinds %d %d: %s", hd, T, first, kk, kv,
          ok ? "refused" : "taken");
    if (!ok) {
        double worst = 0.0;
        int gaps = 0;
        for (int t = 0; t < T; t++) {
            int n = first + t + 1;
            double mx = -INFINITY, sum = 0.0;
            for (int j = 0; j < n; j++) {
                double d = 0.0;
                for (int i = 0; i < hd; i++) d += (double)q[t * ldq + i] * K[(size_t)j * hd + i];
                ref[j] = d * scale;
                mx = ref[j] > mx ? ref[j] : mx;
            }
            for (int j = 0; j < n; j++) sum += ref[j] = exp(ref[j] - mx);
            for (int i = 0; i < hd; i++) {
                double e = 0.0;
                for (int j = 0; j < n; j++) e += ref[j] / sum * V[(size_t)j * hd + i];
                double d = fabs(e - o[t * ldo + i]);
                worst = d > worst || d != d ? d : worst; /* NaN counts as worst */
            }
            for (int i = hd; i < ldo; i++) gaps += o[t * ldo + i] != 7.0f;
        }
        /* float scores and sums over up to 200 keys with elements up to 8: rounding of up to
         * about 2e-5 seen; a wrong mask or block shifts outputs by 1e-2 or more */
        CHECK(worst <= 4e-5,
              "attend_causal hd=%d T=%d first=%d kinds %d %d: %g from the exact attention", hd, T,
              first, kk, kv, worst);
        CHECK(!gaps, "attend_causal hd=%d T=%d first=%d: %d values written between rows", hd, T,
              first, gaps);
    }
    free(q), free(K), free(V), free(o), free(kt), free(p), free(Kc), free(Vc), free(ref);
}

/* One query over S keys of head size hd: the softmax weights and output in double. Every seventh
 * key value is eight times larger, so that scores spread and the maximum's subtraction matters,
 * and the S cover every count of keys left over from the groups of 4 and 2. */
/* The cache in F32, halves or Q8_0 blocks (kv): the reference takes the values the cache holds. */
static void check_attend_row(int hd, int S, int kk, int kv) {
    float *q = malloc(sizeof(float) * hd), *K = malloc(sizeof(float) * S * hd);
    float *V = malloc(sizeof(float) * S * hd), *p = malloc(sizeof(float) * S);
    void *Kc = malloc(2 * (size_t)S * hd), *Vc = malloc(2 * (size_t)S * hd);
    float o[128];
    double *ref = calloc((size_t)S, sizeof(double));
    for (int i = 0; i < hd; i++) q[i] = 2.0f * t_unif() - 1.0f;
    fill_cache(K, V, Kc, Vc, S * hd, kk, kv);
    float scale = 1.0f / sqrtf((float)hd);
    int ok = k_attend_row(q, kk ? Kc : K, kv ? Vc : V, kk, kv, S, hd, scale, p, o);
    CHECK(ok == (attend_takes(hd, kk) && attend_takes(hd, kv) ? 0 : -1),
          "attend_row hd=%d S=%d kinds %d %d: %s", hd, S, kk, kv, ok ? "refused" : "taken");
    if (!ok) {
        double mx = -INFINITY, sum = 0.0, worst = 0.0;
        for (int j = 0; j < S; j++) {
            double d = 0.0;
            for (int i = 0; i < hd; i++) d += (double)q[i] * K[(size_t)j * hd + i];
            ref[j] = d * scale;
            mx = ref[j] > mx ? ref[j] : mx;
        }
        for (int j = 0; j < S; j++) sum += ref[j] = exp(ref[j] - mx);
        for (int i = 0; i < hd; i++) {
            double e = 0.0;
            for (int j = 0; j < S; j++) e += ref[j] / sum * V[(size_t)j * hd + i];
            worst = fmax(worst, fabs(e - o[i]));
        }
        /* the float sums of the scores carry rounding of a few 1e-7 into each weight's exp */
        CHECK(worst <= 1e-5, "attend_row hd=%d S=%d kinds %d %d: %g from the exact attention", hd,
              S, kk, kv, worst);
    }
    free(q), free(K), free(V), free(p), free(ref), free(Kc), free(Vc);
}

/* k_q8_0_blocks (a Q8_0 KV cache's stores) gives its reference's bytes: random rows of every
 * magnitude, a block of zeros, a block whose products x * 127 / amax fall on ties (x.5, which round
 * to even, where roundf would round away from zero), and a negative maximum. */
static void check_q8_0_blocks(void) {
    enum { N = 32 * 40 };
    float *x = malloc(sizeof(float) * N);
    uint8_t *a = malloc(N / 32 * 34), *b = malloc(N / 32 * 34);
    for (int i = 0; i < N; i++)
        x[i] = (2.0f * t_unif() - 1.0f) * ldexpf(1.0f, (int)(t_unif() * 30.0f) - 15);
    for (int i = 0; i < 32; i++) x[32 + i] = 0.0f;
    for (int i = 0; i < 32; i++) x[64 + i] = i == 0 ? 127.0f : (float)(i % 16) + 0.5f;
    for (int i = 0; i < 32; i++) x[96 + i] = i == 5 ? -127.0f : -(float)(i % 9) - 0.5f;
    k_q8_0_blocks(x, a, N);
    k_q8_0_blocks_ref(x, b, N);
    CHECK(!memcmp(a, b, N / 32 * 34), "k_q8_0_blocks differs from its reference");
    CHECK(a[34 + 2] == 0 && a[34] == 0 && a[35] == 0, "a block of zeros");
    CHECK((int8_t)a[68 + 2 + 1] == 2 && (int8_t)a[68 + 2 + 2] == 2, "1.5 and 2.5 round to 2");
    free(x), free(a), free(b);
}

/* k_quantize_rows (an IQ4_NL KV cache's stores; tlm quantize's IQ4_NL and IQ4_XS) gives
 * core_quantize_rows's bytes, with and without importance weights: random blocks of every
 * magnitude, one of zeros, one below the scale threshold, blocks whose elements fall on the
 * table's levels and on the midpoints between them (the search's ties), a negative maximum,
 * values that map past both ends, and infinities and NaNs mapped as the scalar search maps them. */
static void check_iq4_blocks(void) {
    enum { N = 256 * 50 };
    float *x = malloc(sizeof(float) * N), *w = malloc(sizeof(float) * N);
    uint8_t *a = malloc(N), *b = malloc(N);
    for (int i = 0; i < N; i++) {
        x[i] = (2.0f * t_unif() - 1.0f) * ldexpf(1.0f, (int)(t_unif() * 40.0f) - 20);
        w[i] = i % 13 == 4 ? 0.0f : ldexpf(t_unif(), (int)(t_unif() * 10.0f) - 5);
    }
    for (int i = 0; i < 32; i++) x[32 + i] = 0.0f;
    for (int i = 0; i < 32; i++) x[64 + i] = 1e-17f * (float)(i - 7);
    for (int i = 0; i < 32; i++) x[96 + i] = (float)core_iq4nl_values[i % 16];
    for (int i = 0; i < 32; i++) /* midpoints of neighbouring levels */
        x[128 + i] =
            0.5f * ((float)core_iq4nl_values[i % 15] + (float)core_iq4nl_values[i % 15 + 1]);
    for (int i = 0; i < 32; i++) x[160 + i] = i == 9 ? -3.0f : 0.01f * (float)(i % 5);
    for (int i = 0; i < 32; i++) x[192 + i] = i % 4 ? 1.0f : 1e30f;
    for (int i = 0; i < 256; i++) x[1024 + i] = i < 128 ? 0.0f : x[1024 + i]; /* half a K block */
    x[230] = INFINITY;
    x[240] = NAN;
    static const tlm_dtype iq4[] = {TLM_DTYPE_IQ4_NL, TLM_DTYPE_IQ4_XS};
    for (int t = 0; t < 2; t++)
        for (int weighted = 0; weighted < 2; weighted++) {
            const core_dtype_info *d = core_dtype_get(iq4[t]);
            size_t bytes = core_dtype_bytes(iq4[t], N);
            const float *qw = weighted ? w : NULL;
            CHECK_OK(k_quantize_rows(iq4[t], x, a, 1, N, qw));
            /* the reference, one row of N (weights over the row's columns) */
            CHECK_OK(core_quantize_rows(iq4[t], x, b, 1, N, qw));
            int diff = 0;
            for (size_t k = 0; k < bytes / d->block_bytes; k++)
                diff += memcmp(a + k * d->block_bytes, b + k * d->block_bytes, d->block_bytes) != 0;
            CHECK(diff == 0, "k_quantize_rows %s%s: %d of %zu blocks differ from the reference",
                  d->name, weighted ? " with weights" : "", diff, bytes / d->block_bytes);
        }
    free(x), free(w), free(a), free(b);
}

/* k_narrow_row / k_widen_row on F16 (the cache's stores and loads) give core_f32_to_f16's and
 * core_f16_to_f32's results on every range: ties, halves' subnormals, overflow to infinity,
 * infinities, signed zeros; odd lengths take the scalar tail. NaNs stay NaNs. */
static void check_f16_rows(void) {
    enum { N = 4099 };
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N);
    uint16_t *h = malloc(sizeof(uint16_t) * N);
    for (int i = 0; i < N; i++) {
        float e = ldexpf(1.0f, (int)(t_unif() * 44.0f) - 28); /* 2^-28 .. 2^15 */
        x[i] = (2.0f * t_unif() - 1.0f) * e;
    }
    static const float special[] = {0.0f,
                                    -0.0f,
                                    65504.0f,
                                    65520.0f,
                                    -65536.0f,
                                    1e-8f,
                                    3e-8f,
                                    6.1035156e-05f,
                                    1.0009765625f /* a tie: 1 + 2^-10 */,
                                    1.00048828125f /* 1 + 2^-11: a tie, to even */,
                                    INFINITY,
                                    -INFINITY,
                                    NAN};
    for (int i = 0; i < (int)(sizeof special / sizeof special[0]); i++) x[17 * i + 3] = special[i];
    k_narrow_row(TLM_DTYPE_F16, x, h, N);
    int bad = 0;
    for (int i = 0; i < N; i++)
        if (isnan(x[i]) ? (h[i] & 0x7c00) != 0x7c00 || !(h[i] & 0x3ff)
                        : h[i] != core_f32_to_f16(x[i]))
            bad++;
    CHECK(!bad, "k_narrow_row: %d of %d differ from core_f32_to_f16", bad, N);
    k_widen_row(TLM_DTYPE_F16, h, y, N);
    bad = 0;
    for (int i = 0; i < N; i++) {
        float r = core_f16_to_f32(h[i]);
        if (isnan(r) ? !isnan(y[i]) : memcmp(&r, &y[i], 4) != 0) bad++;
    }
    CHECK(!bad, "k_widen_row: %d of %d differ from core_f16_to_f32", bad, N);
    free(x), free(y), free(h);
}

int main(void) {
    t_seed(0x2545F4914F6CDD1Dull); /* the data this test was written against */
    tlm_threads_set(2);
#ifndef TLM_BENCH_KNOBS
    /* the product's builds read no A/B switch from the environment: AMX stays where the CPU has
     * it, and nothing is kept (check's "nothing kept by default") */
    setenv("TLM_AMX", "off", 1);
    setenv("TLM_QCACHE", "on", 1);
    int amx8 = k_cpu()->amx_int8 && k_isa() >= K_ISA_AVX512;
    CHECK(k_qgemm_amx_int8_ok() == amx8, "TLM_AMX=off read outside a benchmark build");
#endif
    printf("AVX-512 VNNI micro-kernel: %s\n", k_simd_ok() ? "yes" : "no (reference only)");
    for (int ti = 0; ti < NTYPES; ti++) {
        tlm_dtype t = types[ti];
        int sub16 = t == TLM_DTYPE_Q6_K || t == TLM_DTYPE_Q2_K || t == TLM_DTYPE_Q3_K;
        CHECK(k_qgemm_covers(t) && k_qgemm_sub(t) == (sub16 ? 16 : 32), "%s covered",
              tlm_dtype_name(t));
        /* maddubs's int16 pair sums stay below 32768; AMX int8 takes the sub-blocks of 32 */
        const k_gemm_ops *ops = k_gemm_ops_of(t);
        CHECK(2 * ops->maddubs_max * 127 <= 32767 && ops->amx_int8 == !sub16 && ops->pack_row,
              "%s: record", tlm_dtype_name(t));
        check(t, 512, 37, 9, 0);
        check(t, 256, 16, 130, 0);
        check(t, 256, 5, 13, 1);
        check(t, 256, 21, 11, 2);
        /* an odd count of sub-blocks (AMX takes them two at a time) */
        if (core_dtype_get(t)->block_elems == 32) check(t, 96, 19, 21, 0);
    }
    check_quantize();
    check_bf16(130, 13, 37);
    check_bf16(64, 8, 9);
    check_bf16(256, 21, 130);
    check_bf16(96, 16, 80);   /* tiles of three, then two */
    check_bf16(2048, 9, 200); /* chunks of activation rows */
    check_bf16(200, 45, 300); /* AMX: a partial group of 32 weight rows, passes of 256 rows */
    check_bf16(32, 64, 32);   /* AMX: whole tiles only */
    /* tlm_cpu_kernels names what the products use, and follows the switches */
    int top = k_isa() >= K_ISA_AVX512;
    CHECK(!strstr(tlm_cpu_kernels(), "amx-int8") == !k_qgemm_amx_int8_ok() &&
              !strstr(tlm_cpu_kernels(), "amx-bf16") == !k_qgemm_amx_ok() &&
              !strstr(tlm_cpu_kernels(), " bf16") == !(top && k_qgemm_bf16_ok()),
          "cpu kernels: %s", tlm_cpu_kernels());
    k_qgemm_amx_enable(0);
    CHECK(!strstr(tlm_cpu_kernels(), "amx"), "AMX off: %s", tlm_cpu_kernels());
    k_qgemm_amx_enable(1);
    CHECK(!strcmp(tlm_cpu_kernels(), "ref") == (k_isa() < K_ISA_AVX2), "ref: %s",
          tlm_cpu_kernels());
    printf("AVX2's products on AVX-VNNI: %s\n", k_qgemm_avxvnni_ok() ? "yes" : "no");
    printf("BF16 on AMX tiles: %s; block types on AMX int8 tiles: %s\n",
           k_qgemm_amx_ok() ? "yes" : "no", k_qgemm_amx_int8_ok() ? "yes" : "no");
    for (int f16 = 0; f16 < 2; f16++) {
        tlm_dtype t = f16 ? TLM_DTYPE_F16 : TLM_DTYPE_F32;
        check_fgemm(t, 768, 24, 128); /* whole 16 x 16 blocks and tiles */
        check_fgemm(t, 77, 13, 37);   /* column and row tails, a partial tile */
        check_fgemm(t, 40, 21, 80);   /* tiles of three, then two */
        check_fgemm(t, 512, 9, 400);  /* chunks of activation rows */
        check_fgemm(t, 768, 35, 8);   /* pairs of columns of up to 8 rows */
        check_fgemm(t, 34, 21, 5);    /* pairs, a partial block of weight rows */
        check_fgemm(t, 33, 9, 3);     /* odd rows: tiles */
    }
    static const int hds[] = {32, 48, 64, 96, 128, 40};
    static const int Ss[] = {1, 2, 3, 4, 5, 7, 16, 17, 33, 100};
    for (int a = 0; a < 6; a++)
        for (int c = 0; c < 10; c++)
            for (int kk = K_KV_F32; kk <= K_KV_IQ4_NL; kk++) /* keys and values of every kind */
                for (int kv = K_KV_F32; kv <= K_KV_IQ4_NL; kv++)
                    check_attend_row(hds[a], Ss[c], kk, kv);
    static const int Ts[] = {1, 2, 3, 7, 8, 9, 17, 40, 130};
    static const int firsts[] = {0, 1, 15, 70};
    for (int a = 0; a < 6; a++)
        for (int c = 0; c < 9; c++)
            for (int f = 0; f < 4; f++)
                for (int kv = K_KV_F32; kv <= K_KV_IQ4_NL; kv++) {
                    check_attend_causal(hds[a], Ts[c], firsts[f], kv, kv);
                    /* keys of another kind: a block type beside F16, an offset one beside Q8_0 */
                    int kk = kv == K_KV_F16 ? K_KV_Q4_0 : kv == K_KV_Q8_0 ? K_KV_Q5_1 : K_KV_F16;
                    if (c % 3 == 0) check_attend_causal(hds[a], Ts[c], firsts[f], kk, kv);
                }
    check_f16_rows();
    check_q8_0_blocks();
    check_iq4_blocks();
    CHECK(k_fgemm(NULL, 1, NULL, 9, &(tlm_weight){.dtype = TLM_DTYPE_BF16, .cols = 4}, NULL) == -1,
          "fgemm refuses BF16");
    CHECK(k_qgemm(NULL, 1, NULL, 9, &(tlm_weight){.dtype = TLM_DTYPE_BF16, .cols = 3}, NULL,
                  K_ISA_REF) == -1,
          "BF16 rows of odd length refused");
    /* types without an integer form, and unknown instruction sets, are refused */
    float y[16], x[32 * 9] = {0};
    tlm_weight f = {.dtype = TLM_DTYPE_F32, .data = x, .rows = 1, .cols = 16, .row_bytes = 64};
    CHECK(!k_qgemm_covers(TLM_DTYPE_F32) && !k_qgemm_covers(TLM_DTYPE_BF16), "float types");
    CHECK(!k_gemm_ops_of(TLM_DTYPE_F32) && !k_gemm_ops_of(TLM_DTYPE_F16) &&
              !k_gemm_ops_of(TLM_DTYPE_BF16) && !k_gemm_ops_of(TLM_DTYPE_COUNT) &&
              !k_gemm_ops_of((tlm_dtype)-1),
          "no integer form for float and unknown types");
    /* each type's traits record (kernels/traits.h) points at its GEMM record */
    for (int t = 0; t < TLM_DTYPE_COUNT; t++)
        CHECK(k_traits((tlm_dtype)t)->gemm == k_gemm_ops_of((tlm_dtype)t),
              "the traits of type %d point at its GEMM record", t);
    CHECK(k_traits(TLM_DTYPE_Q4_K)->gemm && k_traits(TLM_DTYPE_Q4_K)->gemm->sub == 32 &&
              k_traits(TLM_DTYPE_Q6_K)->gemm->sub == 16,
          "Q4_K's and Q6_K's sub-blocks through the traits");
    CHECK(k_qgemm(y, 1, x, 9, &f, NULL, K_ISA_REF) == -1, "F32 refused");
    uint8_t blk[34] = {0};
    tlm_weight q = {.dtype = TLM_DTYPE_Q8_0, .data = blk, .rows = 1, .cols = 32, .row_bytes = 34};
    k_qgemm_avxvnni_enable(0);
    CHECK(k_qgemm(y, 1, x, 9, &q, NULL, K_ISA_AVX2) == -1, "Q8_0's bytes exceed AVX2's kernel");
    k_qgemm_avxvnni_enable(1);
    CHECK(k_qgemm(y, 1, x, 9, &q, NULL, K_ISA_REF) == 0 && y[0] == 0.0f, "zero weights");
    return t_finish("test_qgemm");
}
