/* The reference quantizers (tlm_dtype_from_f32) against ggml's own, byte for byte: ggml's
 * ggml_quantize_chunk is called from node-llama-cpp's prebuilt libggml-base.so (dlopen), which is
 * what llama-quantize runs without an importance matrix. The rows are drawn here (seeded) and
 * cover the cases where the scale searches branch: zeros, constant rows, one sign only, outliers,
 * tiny (subnormal) and huge magnitudes. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "harness.h"
#include "tlm.h"

#define NODE_BINS TLM_SOURCE_DIR "/tests/node/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64"

typedef void (*to_float_fn)(const void *src, float *dst, int64_t n);
typedef size_t (*quantize_chunk_fn)(int type, const float *src, void *dst, int64_t start,
                                    int64_t nrows, int64_t n_per_row, const float *imatrix);

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static double uniform(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}
static float gauss(void) {
    double u = uniform() + 1e-12, v = uniform();
    return (float)(sqrt(-2 * log(u)) * cos(6.283185307179586 * v));
}

enum { N_KINDS = 14 };

/* Row kind k of n values. */
static void fill(float *x, int n, int k) {
    for (int i = 0; i < n; i++) {
        float g = gauss();
        switch (k) {
        case 0: x[i] = g; break;
        case 1: x[i] = 0.02f * g; break;                      /* trained-weight scale */
        case 2: x[i] = 0; break;                              /* all zero */
        case 3: x[i] = 0.37f; break;                          /* constant */
        case 4: x[i] = fabsf(g); break;                       /* positive only */
        case 5: x[i] = -fabsf(g) - 1.0f; break;               /* negative, away from 0 */
        case 6: x[i] = i % 97 == 5 ? 40.0f * g : 0.01f * g; break; /* rare outliers */
        case 7: x[i] = 1e-30f * g; break;                     /* tiny */
        case 8: x[i] = 1e-41f * g; break;                     /* subnormal */
        case 9: x[i] = 3e4f * g; break;                       /* near F16's largest */
        case 10: x[i] = 1e30f * g; break;                     /* beyond F16 (inf scales) */
        case 11: x[i] = uniform() < 0.7 ? 0.0f : g; break;    /* mostly zeros */
        case 12: x[i] = (float)((int)(8 * g)) / 8; break;     /* few distinct values */
        default: x[i] = (i / 16) % 2 ? 0 : g; break;          /* zero sub-blocks */
        }
    }
}

/* ggml's widening of type t: dequantize_row_q4_K, ggml_fp16_to_fp32_row, ... */
static to_float_fn ggml_widen(void *lib, tlm_dtype t) {
    char sym[64];
    if (t == TLM_DTYPE_F16 || t == TLM_DTYPE_BF16) {
        snprintf(sym, sizeof sym, "ggml_%s_to_fp32_row", t == TLM_DTYPE_F16 ? "fp16" : "bf16");
    } else {
        snprintf(sym, sizeof sym, "dequantize_row_%s", tlm_dtype_name(t));
        for (char *c = sym + strlen("dequantize_row_"); *c; c++)
            if (*c == 'Q') *c = 'q';
    }
    return (to_float_fn)(uintptr_t)dlsym(lib, sym);
}

/* Both quantizers' bytes, and both widenings of them (tlm_dtype_to_f32 against ggml's dequantize,
 * bit for bit: tlm computes with the weights llama.cpp computes with). */
static void test_rows(void *lib, quantize_chunk_fn chunk) {
    static const tlm_dtype types[] = {TLM_DTYPE_F16,  TLM_DTYPE_BF16, TLM_DTYPE_Q8_0,
                                      TLM_DTYPE_Q4_0, TLM_DTYPE_Q4_1, TLM_DTYPE_Q5_0,
                                      TLM_DTYPE_Q5_1, TLM_DTYPE_Q4_K, TLM_DTYPE_Q5_K,
                                      TLM_DTYPE_Q6_K};
    enum { ROWS = 6, MAXN = 3 * 256 };
    float *x = malloc(sizeof(float) * ROWS * MAXN);
    uint8_t *a = malloc(ROWS * MAXN * 4), *b = malloc(ROWS * MAXN * 4);
    float *wa = malloc(sizeof(float) * ROWS * MAXN), *wb = malloc(sizeof(float) * ROWS * MAXN);
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
        tlm_dtype t = types[ti];
        const tlm_dtype_info *info = tlm_dtype_get(t);
        int n = info->block_elems == 256 ? 3 * 256 : 5 * 32 + (info->block_elems == 1 ? 7 : 0);
        int mismatched = 0, widen_mismatched = 0;
        to_float_fn widen = ggml_widen(lib, t);
        CHECK(widen != NULL, "no ggml widening for %s", info->name);
        for (int k = 0; k < N_KINDS; k++) {
            for (int r = 0; r < ROWS; r++) fill(x + (size_t)r * n, n, k);
            size_t bytes = tlm_dtype_bytes(t, (uint64_t)ROWS * n);
            memset(a, 0xAA, bytes);
            memset(b, 0x55, bytes);
            CHECK_OK(tlm_dtype_from_f32(t, x, a, (size_t)ROWS * n));
            size_t got = chunk(info->ggml, x, b, 0, ROWS, n, NULL);
            CHECK(got == bytes, "%s: ggml wrote %zu bytes, expected %zu", info->name, got, bytes);
            if (memcmp(a, b, bytes)) {
                size_t i = 0;
                while (a[i] == b[i]) i++;
                CHECK(0, "%s, row kind %d: byte %zu of %zu differs (tlm %02x, ggml %02x)",
                      info->name, k, i, bytes, a[i], b[i]);
                mismatched++;
            }
            if (!widen) continue;
            CHECK_OK(tlm_dtype_to_f32(t, b, wa, (size_t)ROWS * n));
            widen(b, wb, (int64_t)ROWS * n);
            if (memcmp(wa, wb, sizeof(float) * ROWS * n)) {
                size_t i = 0;
                while (!memcmp(wa + i, wb + i, sizeof(float))) i++;
                CHECK(0, "%s, row kind %d: widened element %zu differs (tlm %.9g, ggml %.9g)",
                      info->name, k, i, wa[i], wb[i]);
                widen_mismatched++;
            }
        }
        CHECK(widen_mismatched == 0, "%s: tlm widens %d of %d row kinds unlike ggml", info->name,
              widen_mismatched, N_KINDS);
        CHECK(mismatched == 0, "%s: %d of %d row kinds differ from ggml", info->name, mismatched,
              N_KINDS);
        if (!mismatched && !widen_mismatched)
            printf("%-5s == ggml on %d row kinds (bytes and widened floats)\n", info->name, N_KINDS);
    }
    free(wa);
    free(wb);
    free(x);
    free(a);
    free(b);
}

/* What tlm widens a quantized row back to stays within the type's resolution of the input. */
static void test_round_trip(void) {
    static const struct {
        tlm_dtype t;
        float tol; /* relative to the row's largest magnitude: a block's largest value of the
                    * other sign than its extreme clips by up to one step in Q4_0 and Q5_0 */
    } cases[] = {{TLM_DTYPE_Q8_0, 0.005f}, {TLM_DTYPE_Q4_0, 0.13f}, {TLM_DTYPE_Q4_1, 0.07f},
                 {TLM_DTYPE_Q5_0, 0.065f}, {TLM_DTYPE_Q5_1, 0.033f}, {TLM_DTYPE_Q4_K, 0.07f},
                 {TLM_DTYPE_Q5_K, 0.035f}, {TLM_DTYPE_Q6_K, 0.02f}, {TLM_DTYPE_F16, 0.0005f},
                 {TLM_DTYPE_BF16, 0.004f}};
    enum { N = 512 };
    float x[N], y[N];
    uint8_t q[N * 4];
    for (int i = 0; i < N; i++) x[i] = gauss();
    float amax = 0;
    for (int i = 0; i < N; i++) amax = fmaxf(amax, fabsf(x[i]));
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        CHECK_OK(tlm_dtype_from_f32(cases[c].t, x, q, N));
        CHECK_OK(tlm_dtype_to_f32(cases[c].t, q, y, N));
        float err = 0;
        for (int i = 0; i < N; i++) err = fmaxf(err, fabsf(x[i] - y[i]));
        CHECK(err <= cases[c].tol * amax, "%s: max error %g of %g", tlm_dtype_name(cases[c].t),
              err, amax);
    }
    /* Refusals: a partial block, a type that is not a float type. */
    CHECK(tlm_dtype_from_f32(TLM_DTYPE_Q4_K, x, q, 128) == TLM_ERR_ARG, "partial K block");
    CHECK(strstr(tlm_last_error(), "Q4_K") != NULL, "%s", tlm_last_error());
    CHECK(tlm_dtype_from_f32(TLM_DTYPE_I32, x, q, 32) == TLM_ERR_UNSUPPORTED, "I32");
}

int main(void) {
    test_round_trip();
    void *lib = dlopen(NODE_BINS "/libggml-base.so", RTLD_NOW | RTLD_LOCAL);
    CHECK(lib != NULL, "cannot load node-llama-cpp's libggml-base.so (run bash scripts/setup.sh): %s",
          dlerror());
    if (lib) {
        quantize_chunk_fn chunk = (quantize_chunk_fn)(uintptr_t)dlsym(lib, "ggml_quantize_chunk");
        CHECK(chunk != NULL, "ggml_quantize_chunk not exported");
        if (chunk) test_rows(lib, chunk);
        dlclose(lib);
    }
    return t_finish("test_quant");
}
