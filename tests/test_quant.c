/* The reference quantizers (core_dtype_from_f32) against ggml's own, byte for byte: ggml's
 * ggml_quantize_chunk is called from node-llama-cpp's prebuilt libggml-base.so (dlopen), which is
 * what llama-quantize runs without an importance matrix. The rows are drawn here (seeded) and
 * cover the cases where the scale searches branch: zeros, constant rows, one sign only, outliers,
 * tiny (subnormal) and huge magnitudes. */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/dtype.h"
#include "harness.h"
#include "model/model.h"
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
        case 1: x[i] = 0.02f * g; break;                           /* trained-weight scale */
        case 2: x[i] = 0; break;                                   /* all zero */
        case 3: x[i] = 0.37f; break;                               /* constant */
        case 4: x[i] = fabsf(g); break;                            /* positive only */
        case 5: x[i] = -fabsf(g) - 1.0f; break;                    /* negative, away from 0 */
        case 6: x[i] = i % 97 == 5 ? 40.0f * g : 0.01f * g; break; /* rare outliers */
        case 7: x[i] = 1e-30f * g; break;                          /* tiny */
        case 8: x[i] = 1e-41f * g; break;                          /* subnormal */
        case 9: x[i] = 3e4f * g; break;                            /* near F16's largest */
        case 10: x[i] = 1e30f * g; break;                          /* beyond F16 (inf scales) */
        case 11: x[i] = uniform() < 0.7 ? 0.0f : g; break;         /* mostly zeros */
        case 12: x[i] = (float)((int)(8 * g)) / 8; break;          /* few distinct values */
        default: x[i] = (i / 16) % 2 ? 0 : g; break;               /* zero sub-blocks */
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
            if (*c >= 'A' && *c <= 'Z' && *c != 'K') *c = (char)(*c - 'A' + 'a');
    }
    return (to_float_fn)(uintptr_t)dlsym(lib, sym);
}

/* Both quantizers' bytes, and both widenings of them (core_dtype_to_f32 against ggml's dequantize,
 * bit for bit: tlm computes with the weights llama.cpp computes with). */
static void test_rows(void *lib, quantize_chunk_fn chunk) {
    static const tlm_dtype types[] = {
        TLM_DTYPE_F16,  TLM_DTYPE_BF16, TLM_DTYPE_Q8_0,   TLM_DTYPE_Q4_0,  TLM_DTYPE_Q4_1,
        TLM_DTYPE_Q5_0, TLM_DTYPE_Q5_1, TLM_DTYPE_Q2_K,   TLM_DTYPE_Q3_K,  TLM_DTYPE_Q4_K,
        TLM_DTYPE_Q5_K, TLM_DTYPE_Q6_K, TLM_DTYPE_IQ4_NL, TLM_DTYPE_IQ4_XS};
    enum { ROWS = 6, MAXN = 3 * 256 };
    float *x = malloc(sizeof(float) * ROWS * MAXN);
    uint8_t *a = malloc(ROWS * MAXN * 4), *b = malloc(ROWS * MAXN * 4);
    float *wa = malloc(sizeof(float) * ROWS * MAXN), *wb = malloc(sizeof(float) * ROWS * MAXN);
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
        tlm_dtype t = types[ti];
        const core_dtype_info *info = core_dtype_get(t);
        int n = info->block_elems == 256 ? 3 * 256 : 5 * 32 + (info->block_elems == 1 ? 7 : 0);
        int mismatched = 0, widen_mismatched = 0;
        to_float_fn widen = ggml_widen(lib, t);
        CHECK(widen != NULL, "no ggml widening for %s", info->name);
        for (int k = 0; k < N_KINDS; k++) {
            for (int r = 0; r < ROWS; r++) fill(x + (size_t)r * n, n, k);
            size_t bytes = core_dtype_bytes(t, (uint64_t)ROWS * n);
            memset(a, 0xAA, bytes);
            memset(b, 0x55, bytes);
            CHECK_OK(core_dtype_from_f32(t, x, a, (size_t)ROWS * n));
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
            CHECK_OK(core_dtype_to_f32(t, b, wa, (size_t)ROWS * n));
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
            printf("%-5s == ggml on %d row kinds (bytes and widened floats)\n", info->name,
                   N_KINDS);
    }
    free(wa);
    free(wb);
    free(x);
    free(a);
    free(b);
}

/* An importance matrix's column weights of kind k (mean squared activations: positive, spread
 * over orders of magnitude; some zero, as for columns no token reached). */
static void fill_imatrix(float *w, int n, int k) {
    for (int i = 0; i < n; i++) {
        float g = gauss();
        switch (k % 4) {
        case 0: w[i] = g * g; break;
        case 1: w[i] = expf(3 * g); break;
        case 2: w[i] = i % 7 == 3 ? 0.0f : 1e-3f * g * g; break;
        default: w[i] = 1.0f; break;
        }
    }
}

/* With an importance matrix (llama-quantize --imatrix): core_quantize_rows against
 * ggml_quantize_chunk given the same weights, every row kind against four kinds of weights; the
 * types that take none ignore it, as ggml's do. */
static void test_rows_imatrix(quantize_chunk_fn chunk) {
    static const tlm_dtype types[] = {
        TLM_DTYPE_Q8_0, TLM_DTYPE_Q4_0, TLM_DTYPE_Q4_1,   TLM_DTYPE_Q5_0,  TLM_DTYPE_Q5_1,
        TLM_DTYPE_Q2_K, TLM_DTYPE_Q3_K, TLM_DTYPE_Q4_K,   TLM_DTYPE_Q5_K,  TLM_DTYPE_Q6_K,
        TLM_DTYPE_F16,  TLM_DTYPE_BF16, TLM_DTYPE_IQ4_NL, TLM_DTYPE_IQ4_XS};
    enum { ROWS = 5, MAXN = 3 * 256 };
    float *x = malloc(sizeof(float) * ROWS * MAXN), *w = malloc(sizeof(float) * MAXN);
    uint8_t *a = malloc(ROWS * MAXN * 4), *b = malloc(ROWS * MAXN * 4);
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
        tlm_dtype t = types[ti];
        const core_dtype_info *info = core_dtype_get(t);
        int n = info->block_elems == 256 ? 3 * 256 : 5 * 32;
        int mismatched = 0, differs_from_plain = 0;
        for (int k = 0; k < N_KINDS; k++) {
            for (int r = 0; r < ROWS; r++) fill(x + (size_t)r * n, n, k);
            fill_imatrix(w, n, k);
            size_t bytes = core_dtype_bytes(t, (uint64_t)ROWS * n);
            memset(a, 0xAA, bytes);
            memset(b, 0x55, bytes);
            CHECK_OK(core_quantize_rows(t, x, a, ROWS, (size_t)n, w));
            size_t got = chunk(info->ggml, x, b, 0, ROWS, n, w);
            CHECK(got == bytes, "%s: ggml wrote %zu bytes, expected %zu", info->name, got, bytes);
            if (memcmp(a, b, bytes)) {
                size_t i = 0;
                while (a[i] == b[i]) i++;
                CHECK(0,
                      "%s with an imatrix, row kind %d: byte %zu of %zu differs (tlm %02x, "
                      "ggml %02x)",
                      info->name, k, i, bytes, a[i], b[i]);
                mismatched++;
            }
            CHECK_OK(core_dtype_from_f32(t, x, b, (size_t)ROWS * n));
            differs_from_plain += memcmp(a, b, bytes) != 0;
        }
        CHECK(mismatched == 0, "%s: %d of %d row kinds differ from ggml with an imatrix",
              info->name, mismatched, N_KINDS);
        /* the weights must change something for the types that use them, and nothing else */
        CHECK(core_dtype_uses_imatrix(t) ? differs_from_plain > N_KINDS / 2 : !differs_from_plain,
              "%s: %d of %d row kinds differ from the plain quantizer", info->name,
              differs_from_plain, N_KINDS);
        if (!mismatched)
            printf("%-6s with an imatrix == ggml on %d row kinds (%d differ from no imatrix)\n",
                   info->name, N_KINDS, differs_from_plain);
    }
    CHECK(core_quantize_rows(TLM_DTYPE_Q4_K, x, a, 1, 128, w) == TLM_ERR_ARG, "partial K row");
    free(x);
    free(w);
    free(a);
    free(b);
}

/* What tlm widens a quantized row back to stays within the type's resolution of the input. */
static void test_round_trip(void) {
    static const struct {
        tlm_dtype t;
        float tol; /* relative to the row's largest magnitude: a block's largest value of the
                    * other sign than its extreme clips by up to one step in Q4_0 and Q5_0 */
    } cases[] = {{TLM_DTYPE_Q8_0, 0.005f},  {TLM_DTYPE_Q4_0, 0.13f},  {TLM_DTYPE_Q4_1, 0.07f},
                 {TLM_DTYPE_Q5_0, 0.065f},  {TLM_DTYPE_Q5_1, 0.033f}, {TLM_DTYPE_Q4_K, 0.07f},
                 {TLM_DTYPE_Q5_K, 0.035f},  {TLM_DTYPE_Q6_K, 0.02f},  {TLM_DTYPE_F16, 0.0005f},
                 {TLM_DTYPE_BF16, 0.004f},  {TLM_DTYPE_Q2_K, 0.4f},   {TLM_DTYPE_Q3_K, 0.2f},
                 {TLM_DTYPE_IQ4_NL, 0.13f}, {TLM_DTYPE_IQ4_XS, 0.13f}};
    enum { N = 512 };
    float x[N], y[N];
    uint8_t q[N * 4];
    for (int i = 0; i < N; i++) x[i] = gauss();
    float amax = 0;
    for (int i = 0; i < N; i++) amax = fmaxf(amax, fabsf(x[i]));
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        CHECK_OK(core_dtype_from_f32(cases[c].t, x, q, N));
        CHECK_OK(core_dtype_to_f32(cases[c].t, q, y, N));
        float err = 0;
        for (int i = 0; i < N; i++) err = fmaxf(err, fabsf(x[i] - y[i]));
        CHECK(err <= cases[c].tol * amax, "%s: max error %g of %g", tlm_dtype_name(cases[c].t), err,
              amax);
    }
    /* Refusals: a partial block, a type that is not a float type. */
    CHECK(core_dtype_from_f32(TLM_DTYPE_Q4_K, x, q, 128) == TLM_ERR_ARG, "partial K block");
    CHECK(strstr(tlm_last_error(), "Q4_K") != NULL, "%s", tlm_last_error());
    CHECK(core_dtype_from_f32(TLM_DTYPE_I32, x, q, 32) == TLM_ERR_UNSUPPORTED, "I32");
}

/* Each type's record (core_dtype_info): a type that widens to floats has its widening, every float
 * type but F64 its reference quantizer, and core_dtype_uses_imatrix is whether it has an
 * importance-matrix quantizer (the block types but Q8_0); F64 and the integer types are refused
 * where there is nothing to run. */
static void test_dtype_table(void) {
    for (int i = 0; i < TLM_DTYPE_COUNT; i++) {
        tlm_dtype t = (tlm_dtype)i;
        const core_dtype_info *d = core_dtype_get(t);
        CHECK(d && d->name && d->block_elems >= 1 && d->block_bytes >= 1, "type %d has a record",
              i);
        if (!d) continue;
        CHECK(!d->to_f32 == !d->is_float, "%s: a widening exactly where it is a float type",
              d->name);
        CHECK(!d->from_f32 == (!d->is_float || t == TLM_DTYPE_F64),
              "%s: a reference quantizer exactly where it is written", d->name);
        CHECK(core_dtype_uses_imatrix(t) == (d->block_elems > 1 && t != TLM_DTYPE_Q8_0),
              "%s: an importance-matrix quantizer exactly for the block types but Q8_0", d->name);
        CHECK(!d->from_f32_imatrix == !core_dtype_uses_imatrix(t), "%s: uses_imatrix is its record",
              d->name);
    }
    float x[32] = {0};
    double wide[32];
    CHECK(core_dtype_from_f32(TLM_DTYPE_F64, x, wide, 32) == TLM_ERR_UNSUPPORTED,
          "F64 not written");
    CHECK(core_dtype_to_f32(TLM_DTYPE_I8, x, x, 32) == TLM_ERR_UNSUPPORTED, "I8 not widened");
    CHECK(core_dtype_to_f32((tlm_dtype)TLM_DTYPE_COUNT, x, x, 32) == TLM_ERR_UNSUPPORTED,
          "a value past the enum");
    CHECK(!core_dtype_uses_imatrix((tlm_dtype)TLM_DTYPE_COUNT), "a value past the enum");
}

/* ---- whole files: tlm_model_quantize_gguf against llama_model_quantize ---------------------- */

/* llama.h's llama_model_quantize_params (llama.cpp as node-llama-cpp 3.22.1 ships it). */
typedef struct {
    int32_t nthread;
    int ftype;
    int output_tensor_type;
    int token_embedding_type;
    bool allow_requantize, quantize_output_tensor, only_copy, pure, keep_split, dry_run;
    const void *imatrix, *kv_overrides, *tt_overrides;
    const int32_t *prune_layers;
    size_t max_buf_size;
} llama_quantize_params;
typedef llama_quantize_params (*default_params_fn)(void);
typedef uint32_t (*model_quantize_fn)(const char *in, const char *out,
                                      const llama_quantize_params *p);
typedef void (*log_cb)(int level, const char *text, void *user);
typedef void (*log_set_fn)(log_cb cb, void *user);

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void quiet(int level, const char *text, void *user) { (void)level, (void)text, (void)user; }

static uint8_t *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc(len > 0 ? (size_t)len : 1);
    *n = p ? fread(p, 1, (size_t)len, f) : 0;
    fclose(f);
    return p;
}

static const char *const all_types[] = {
    "f32",    "f16",    "bf16",   "q8_0",   "q4_0",   "q4_1",   "q5_0", "q5_1",   "q2_k",  "q3_k_s",
    "q3_k_m", "q3_k_l", "q4_k_s", "q4_k_m", "q5_k_s", "q5_k_m", "q6_k", "iq4_nl", "iq4_xs"};
#define N_TYPES (int)(sizeof all_types / sizeof *all_types)

static int type_index(const char *name) {
    for (int k = 0; k < N_TYPES; k++)
        if (!strcmp(all_types[k], name)) return k;
    return 0;
}

/* The types the file at path holds per tensor name, "name:TYPE ..." in file order. */
static void file_types(const char *path, char *out, size_t cap) {
    tlm_file_tensor *ts = NULL;
    int n = 0;
    out[0] = 0;
    if (tlm_model_file_tensors(path, &ts, &n)) return;
    for (int i = 0; i < n; i++)
        snprintf(out + strlen(out), cap - strlen(out), "%s:%s ", ts[i].name, ts[i].dtype);
    free(ts);
}

/* Quantizes m (saved as F32 GGUF first) to every type with tlm and with llama.cpp, and checks:
 * the files are equal byte for byte; tlm loads ours back within the type's resolution; the
 * per-tensor types of Q4_K_M are llama.cpp's mix (expect_q4km: "name:TYPE" entries that must
 * appear). Returns the paths written (for llama.cpp to load) in paths[N_TYPES]. */
static void test_files(model_quantize_fn llama_quantize, default_params_fn defaults,
                       const tlm_model *m, const tlm_tokenizer *tok, const char *tag,
                       const char *const *expect_q4km, char paths[][256]) {
    char f32[256];
    snprintf(f32, sizeof f32, "quant_%s_src.gguf", tag);
    CHECK_OK(tlm_model_save_gguf(m, tok, f32, TLM_DTYPE_F32));
    /* The weights as tlm reads a GGUF (q and k rows in the file's pairing). */
    tlm_model *src = NULL;
    CHECK_OK(tlm_model_load(f32, 0, &src));
    float *want = src ? t_flat(src) : NULL;
    for (int k = 0; k < N_TYPES; k++) {
        tlm_quantize_opts o = {0};
        CHECK(tlm_ftype_parse(all_types[k], &o.ftype) == TLM_OK, "%s", all_types[k]);
        char theirs[256];
        snprintf(paths[k], 256, "quant_%s_%s.gguf", tag, all_types[k]);
        snprintf(theirs, sizeof theirs, "quant_%s_%s_llama.gguf", tag, all_types[k]);
        double t0 = now();
        CHECK_OK(tlm_model_quantize_gguf(m, tok, paths[k], &o));
        double t1 = now();
        llama_quantize_params p = defaults();
        p.nthread = 1;
        p.ftype = (int)o.ftype;
        CHECK(llama_quantize(f32, theirs, &p) == 0, "llama_model_quantize %s failed", theirs);
        double t2 = now();
        size_t na = 0, nb = 0;
        uint8_t *a = slurp(paths[k], &na), *b = slurp(theirs, &nb);
        CHECK(a && b && na == nb && !memcmp(a, b, na),
              "%s: tlm's file (%zu bytes) differs from llama-quantize's (%zu bytes)", paths[k], na,
              nb);
        if (a && b && na == nb && !memcmp(a, b, na))
            printf("%s %-6s == llama-quantize (%zu bytes; %.2f s tlm, %.2f s llama.cpp)\n", tag,
                   all_types[k], na, t1 - t0, t2 - t1);
        else {
            char ta[4096], tb[4096];
            file_types(paths[k], ta, sizeof ta);
            file_types(theirs, tb, sizeof tb);
            fprintf(stderr, "  tlm:   %s\n  llama: %s\n", ta, tb);
        }
        free(a);
        free(b);
        remove(theirs);
        /* tlm reads the file back close to the F32 file, tensor by tensor, within the type's
         * resolution (relative to each tensor's largest magnitude; a 4-bit block's value of the
         * other sign than its extreme clips by up to one step of 1/8). */
        tlm_model *back = NULL;
        CHECK_OK(tlm_model_load(paths[k], 0, &back));
        if (back && want) {
            float *got = t_flat(back);
            const char *ty = all_types[k];
            double tol = !strcmp(ty, "f32")             ? 0
                         : !strcmp(ty, "f16")           ? 1e-3
                         : !strcmp(ty, "bf16")          ? 8e-3
                         : !strcmp(ty, "q8_0")          ? 1e-2
                         : ty[1] == '2'                 ? 0.4
                         : ty[1] == '3'                 ? 0.25
                         : ty[1] == '4' || ty[0] == 'i' ? 0.14
                                                        : 0.07;
            int nt;
            const tlm_tensor_info *ts = tlm_model_tensors(back, &nt);
            for (int i = 0; got && i < nt; i++) {
                double err = 0, scale = 0;
                for (size_t e = ts[i].offset; e < ts[i].offset + ts[i].numel; e++) {
                    err = fmax(err, fabs((double)got[e] - want[e]));
                    scale = fmax(scale, fabs((double)want[e]));
                }
                CHECK(err <= tol * scale, "%s: %s read back off by %g (of %g)", paths[k],
                      ts[i].name, err, scale);
            }
            free(got);
        }
        tlm_model_free(back);
        if (!strcmp(all_types[k], "q4_k_m")) {
            char ta[8192];
            file_types(paths[k], ta, sizeof ta);
            for (int e = 0; expect_q4km[e]; e++)
                CHECK(strstr(ta, expect_q4km[e]) != NULL, "%s: expected %s in %s", paths[k],
                      expect_q4km[e], ta);
        }
    }
    free(want);
    tlm_model_free(src);
    remove(f32);
}

/* A random Llama-style model every matrix of which is whole 256-blocks wide: vocabulary 512, d 256,
 * four heads sharing two kv heads; NULL (with a failed check) if it cannot be made. */
static tlm_model *wide_model(int layers, int d_ff, int tied, uint64_t seed) {
    tlm_config c;
    tlm_config_defaults(&c);
    c.vocab_size = 512;
    c.context_length = 64;
    c.d_model = 256;
    c.n_layers = layers;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.d_ff = d_ff;
    c.tie_embeddings = tied;
    tlm_model *m = NULL;
    CHECK_OK(tlm_config_finalize(&c));
    CHECK_OK(tlm_model_new(&c, &m));
    if (m) CHECK_OK(tlm_model_init(m, seed, TLM_INIT_XAVIER));
    return m;
}

/* llama.h's llama_model_imatrix_data and llama_model_kv_override (the CLI's record of the
 * matrix: llama-quantize --imatrix sets these keys through overrides). */
typedef struct {
    const char *name;
    const float *data;
    size_t size;
} llama_imatrix_data;
typedef struct {
    int tag; /* 0 int, 1 float, 2 bool, 3 string: tlm_kv_type's order */
    char key[128];
    union {
        int64_t val_i64;
        double val_f64;
        bool val_bool;
        char val_str[128];
    };
} llama_kv_override;

/* llama-imatrix's legacy .dat layout, read as llama-quantize reads it (each value divided by the
 * entry's call count; the trailing chunk count and dataset name), and malformed matrices: a
 * truncated file, a non-finite value, a GGUF without the imatrix keys. */
static void test_imatrix_legacy(const llama_imatrix_data *ld, int nl) {
    const char *path = "quant_im_legacy.dat";
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL, "cannot write %s", path);
    if (!f) return;
    int32_t n = nl, ncall = 3;
    fwrite(&n, 4, 1, f);
    for (int e = 0; e < nl; e++) {
        int32_t len = (int32_t)strlen(ld[e].name), nval = (int32_t)ld[e].size;
        fwrite(&len, 4, 1, f);
        fwrite(ld[e].name, 1, (size_t)len, f);
        fwrite(&ncall, 4, 1, f);
        fwrite(&nval, 4, 1, f);
        fwrite(ld[e].data, sizeof(float), ld[e].size, f);
    }
    int32_t chunks = 7, dlen = 9;
    fwrite(&chunks, 4, 1, f);
    fwrite(&dlen, 4, 1, f);
    fwrite("wiki.text", 1, 9, f);
    long full = ftell(f);
    fclose(f);
    tlm_imatrix *im = NULL;
    CHECK_OK(tlm_imatrix_load(path, &im));
    CHECK(tlm_imatrix_entries(im) == nl && tlm_imatrix_chunks(im) == 7 && tlm_imatrix_dataset(im) &&
              !strcmp(tlm_imatrix_dataset(im), "wiki.text"),
          "legacy imatrix: %d entries, %d chunks", tlm_imatrix_entries(im), tlm_imatrix_chunks(im));
    int bad = 0;
    for (int e = 0; im && e < nl; e++) {
        size_t k = 0;
        const float *w = tlm_imatrix_find(im, ld[e].name, &k);
        bad += !w || k != ld[e].size;
        for (size_t j = 0; w && j < k && j < ld[e].size; j++) bad += w[j] != ld[e].data[j] / 3;
    }
    CHECK(bad == 0, "legacy imatrix: %d values differ from the file's over its call count", bad);
    CHECK(tlm_imatrix_find(im, "no.such.weight", NULL) == NULL, "unknown name");
    tlm_imatrix_free(im);
    /* cut inside the last entry's values */
    CHECK(truncate(path, full - 40) == 0, "truncate");
    im = NULL;
    CHECK(tlm_imatrix_load(path, &im) == TLM_ERR_FORMAT && !im, "a truncated .dat is refused");
    CHECK(strstr(tlm_last_error(), path) != NULL, "%s", tlm_last_error());
    /* a NaN */
    f = fopen(path, "wb");
    float v[2] = {1.0f, NAN};
    int32_t one = 1, len = 4, two = 2;
    fwrite(&one, 4, 1, f);
    fwrite(&len, 4, 1, f);
    fwrite("w.ab", 1, 4, f);
    fwrite(&one, 4, 1, f);
    fwrite(&two, 4, 1, f);
    fwrite(v, 4, 2, f);
    fclose(f);
    CHECK(tlm_imatrix_load(path, &im) == TLM_ERR_FORMAT && strstr(tlm_last_error(), "non-finite"),
          "a NaN: %s", tlm_last_error());
    remove(path);
    /* a model file is a GGUF without the imatrix keys */
    CHECK(tlm_imatrix_load("quant_im_src.gguf", &im) == TLM_ERR_FORMAT &&
              strstr(tlm_last_error(), "imatrix.chunk_count"),
          "a GGUF without imatrix metadata: %s", tlm_last_error());
}

/* Merging (llama-imatrix --in-file): a matrix merged with itself keeps its means exactly and
 * counts twice the tokens; the legacy layout written (llama-imatrix --output-format dat) reads
 * back as the means, and merges as its call counts times the chunk size. */
static void test_imatrix_merge(const char *gguf) {
    tlm_imatrix *a = NULL, *m = NULL, *l = NULL, *lm = NULL;
    CHECK_OK(tlm_imatrix_load(gguf, &a));
    CHECK_OK(tlm_imatrix_new(&m));
    CHECK_OK(tlm_imatrix_merge(m, a, 128));
    CHECK_OK(tlm_imatrix_merge(m, a, 128));
    CHECK(tlm_imatrix_tokens(m) == 2 * tlm_imatrix_tokens(a) && tlm_imatrix_tokens(a) == 384,
          "merged tokens %lld of %lld", (long long)tlm_imatrix_tokens(m),
          (long long)tlm_imatrix_tokens(a));
    const char *dat = "quant_im_merge.dat";
    CHECK_OK(tlm_imatrix_save_legacy(a, dat, NULL, 3, 128));
    CHECK_OK(tlm_imatrix_load(dat, &l));
    CHECK(tlm_imatrix_chunks(l) == 3 && tlm_imatrix_dataset(l) &&
              !strcmp(tlm_imatrix_dataset(l), "calibration.txt"),
          "legacy written: %d chunks", tlm_imatrix_chunks(l));
    int same = 0, close = 0, n_all = 0;
    for (int e = 0; a && m && l && e < tlm_imatrix_entries(a); e++) {
        static const char *const names[] = {"blk.0.attn_q.weight", "blk.3.ffn_down.weight",
                                            "output.weight"};
        if (e >= 3) break;
        size_t na = 0, nm = 0, nl = 0;
        const float *wa = tlm_imatrix_find(a, names[e], &na),
                    *wm = tlm_imatrix_find(m, names[e], &nm),
                    *wl = tlm_imatrix_find(l, names[e], &nl);
        CHECK(wa && wm && wl && na == nm && na == nl, "entry %s", names[e]);
        for (size_t j = 0; wa && wm && wl && j < na; j++, n_all++) {
            same += wm[j] == wa[j];
            close += fabsf(wl[j] - wa[j]) <= 1e-6f * fabsf(wa[j]);
        }
    }
    CHECK(same == n_all && close == n_all && n_all > 0,
          "merged means %d / %d exact, legacy %d / %d within 1e-6", same, n_all, close, n_all);
    /* a legacy matrix merges as means x call count x chunk size: 384 tokens in 3 calls of 128 */
    CHECK_OK(tlm_imatrix_new(&lm));
    CHECK_OK(tlm_imatrix_merge(lm, l, 128));
    CHECK(tlm_imatrix_tokens(lm) == 384, "legacy merged: %lld tokens",
          (long long)tlm_imatrix_tokens(lm));
    CHECK(tlm_imatrix_merge(l, a, 128) == TLM_ERR_ARG, "merging into a legacy matrix is refused");
    tlm_imatrix_free(a);
    tlm_imatrix_free(m);
    tlm_imatrix_free(l);
    tlm_imatrix_free(lm);
    remove(dat);
}

/* Two files' bytes equal, or a report of where they differ. */
static int same_files(const char *ours, const char *theirs, const char *what) {
    size_t na = 0, nb = 0;
    uint8_t *a = slurp(ours, &na), *b = slurp(theirs, &nb);
    int same = a && b && na == nb && !memcmp(a, b, na);
    CHECK(same, "%s: tlm's file (%zu bytes) differs from llama-quantize's (%zu)", what, na, nb);
    if (!same) {
        char ta[8192], tb[8192];
        file_types(ours, ta, sizeof ta);
        file_types(theirs, tb, sizeof tb);
        fprintf(stderr, "  tlm:   %s\n  llama: %s\n", ta, tb);
    }
    free(a);
    free(b);
    return same;
}

/* llama-imatrix --show-statistics's figures on matrices whose answers are known: four equal
 * means (entropy log2 4 = 2 bits, no deviation, none above it), one of 1, 0, 0, 3 (mean 1, sd
 * sqrt 1.5, half inactive, one above mean + sd), the cosine of a layer's sums with the one below
 * (parallel: 1; orthogonal: 0), a tensor outside the blocks ("-"), an entry without tokens left
 * out, and llama-imatrix's order (by tensor name, then the larger sum first). The table itself
 * follows llama-imatrix's layout, which it matched character for character on a real model. */
static void test_imatrix_statistics(void) {
    tlm_imatrix *im = NULL;
    CHECK_OK(tlm_imatrix_new(&im));
    if (!im) return;
    const float eq[4] = {8, 8, 8, 8}, skew[4] = {4, 0, 0, 12}, par[4] = {16, 16, 16, 16},
                orth[4] = {0, 2, 2, 0};
    CHECK_OK(tlm_imatrix_accumulate(im, "blk.0.attn_q.weight", eq, 4, 4));
    CHECK_OK(tlm_imatrix_accumulate(im, "blk.1.attn_q.weight", par, 4, 4));
    CHECK_OK(tlm_imatrix_accumulate(im, "blk.0.ffn_down.weight", skew, 4, 4));
    CHECK_OK(tlm_imatrix_accumulate(im, "blk.1.ffn_down.weight", orth, 4, 2));
    CHECK_OK(tlm_imatrix_accumulate(im, "output.weight", eq, 4, 8));
    CHECK_OK(tlm_imatrix_accumulate(im, "blk.2.attn_q.weight", eq, 4, 0));
    tlm_imatrix_stat *st = NULL;
    int n = 0;
    CHECK_OK(tlm_imatrix_statistics(im, 512, &st, &n));
    CHECK(n == 5, "%d tensors with tokens", n);
    static const char *const order[] = {"blk.1.attn_q.weight", "blk.0.attn_q.weight",
                                        "blk.0.ffn_down.weight", "blk.1.ffn_down.weight",
                                        "output.weight"};
    for (int i = 0; i < n && i < 5; i++)
        CHECK(!strcmp(st[i].name, order[i]), "row %d: %s, want %s", i, st[i].name, order[i]);
    if (n == 5) {
        const tlm_imatrix_stat *q1 = &st[0], *q0 = &st[1], *d0 = &st[2], *d1 = &st[3], *o = &st[4];
        CHECK(!strcmp(q0->layer, "0") && !strcmp(q0->tensor, "attn_q") && !strcmp(o->layer, "-") &&
                  !strcmp(o->tensor, "output"),
              "names: %s/%s %s/%s", q0->layer, q0->tensor, o->layer, o->tensor);
        CHECK(q0->elements == 4 && q0->sum == 8 && q0->mean == 2 && q0->min == 2 && q0->max == 2 &&
                  q0->stddev == 0 && q0->active == 1 && q0->entropy == 2 &&
                  q0->entropy_norm == 100 && q0->zd == 0 && q0->cossim == 0,
              "equal means: sum %g mean %g sd %g entropy %g (%g%%) zd %g cos %g", q0->sum, q0->mean,
              q0->stddev, q0->entropy, q0->entropy_norm, q0->zd, q0->cossim);
        CHECK(q1->sum == 16 && fabsf(q1->cossim - 1) < 1e-6f, "layer 1: sum %g cos %g", q1->sum,
              q1->cossim);
        CHECK(d0->sum == 4 && d0->mean == 1 && d0->min == 0 && d0->max == 3 &&
                  fabsf(d0->stddev - sqrtf(1.5f)) < 1e-6f && d0->active == 0.5f &&
                  fabsf(d0->entropy - 0.8112781f) < 1e-6f && d0->zd == 0.25f,
              "skewed: sd %g active %g entropy %g zd %g", d0->stddev, d0->active, d0->entropy,
              d0->zd);
        CHECK(d1->sum == 2 && d1->cossim == 0, "orthogonal: sum %g cos %g", d1->sum, d1->cossim);
        CHECK(o->sum == 4 && o->cossim == 0, "output: sum %g cos %g", o->sum, o->cossim);
    }
    free(st);
    tlm_imatrix_free(im);
}

/* With an importance matrix: tlm's file (the matrix written by tlm_imatrix_save and read back by
 * tlm_imatrix_load) against llama_model_quantize given the same means and the keys the CLI sets,
 * for every type that uses one, on 8 layers (so that n_layer / 8 = 1: Q4_0 and Q5_0 give
 * blk.0.ffn_down Q4_1 / Q5_1 with a matrix, IQ4_* keep it IQ4 where they gave Q5_K). */
static void test_imatrix_files(model_quantize_fn llama_quantize, default_params_fn defaults,
                               const tlm_tokenizer *tok) {
    tlm_model *m = wide_model(8, 512, 0, 11);
    if (!m) return;
    const char *f32 = "quant_im_src.gguf", *imf = "quant_im.imatrix.gguf";
    CHECK_OK(tlm_model_save_gguf(m, tok, f32, TLM_DTYPE_F32));
    /* sums of squares over 384 tokens per matrix, spread over orders of magnitude; a token
     * embedding entry of the wrong size (llama.cpp ignores it for that tensor) */
    int nt;
    const tlm_tensor_info *ts = tlm_model_tensors(m, &nt);
    tlm_imatrix *im = NULL;
    CHECK_OK(tlm_imatrix_new(&im));
    enum { TOKENS = 384 };
    llama_imatrix_data *ld = calloc((size_t)nt + 2, sizeof *ld);
    float **means = calloc((size_t)nt + 1, sizeof *means);
    int nl = 0;
    for (int i = 0; im && i < nt; i++) {
        if (ts[i].ndim != 2) continue;
        int embd = !strcmp(ts[i].name, "token_embd.weight");
        size_t n = embd ? 100 : (size_t)ts[i].shape[1];
        float *sum = malloc(sizeof(float) * n);
        means[nl] = malloc(sizeof(float) * n);
        for (size_t j = 0; j < n; j++) {
            float g = gauss();
            sum[j] = TOKENS * expf(2 * g) * (j % 11 == 4 ? 0.0f : 1.0f);
            means[nl][j] = sum[j] / (float)TOKENS; /* what llama-quantize computes from the file */
        }
        CHECK_OK(tlm_imatrix_accumulate(im, ts[i].name, sum, n, TOKENS));
        ld[nl] = (llama_imatrix_data){ts[i].name, means[nl], n};
        nl++;
        free(sum);
    }
    CHECK_OK(tlm_imatrix_save(im, imf, "calibration.txt", 3, 128));
    tlm_imatrix_free(im);
    im = NULL;
    CHECK_OK(tlm_imatrix_load(imf, &im));
    CHECK(tlm_imatrix_entries(im) == nl && tlm_imatrix_chunks(im) == 3 && tlm_imatrix_dataset(im) &&
              !strcmp(tlm_imatrix_dataset(im), "calibration.txt"),
          "imatrix read back: %d entries, %d chunks", tlm_imatrix_entries(im),
          tlm_imatrix_chunks(im));
    for (int e = 0; im && e < nl; e++) {
        size_t n = 0;
        const float *w = tlm_imatrix_find(im, ld[e].name, &n);
        CHECK(w && n == ld[e].size && !memcmp(w, ld[e].data, sizeof(float) * n),
              "imatrix entry %s read back differs", ld[e].name);
    }
    test_imatrix_legacy(ld, nl);
    test_imatrix_merge(imf);
    test_imatrix_statistics();
    llama_kv_override kv[5];
    memset(kv, 0, sizeof kv);
    kv[0].tag = 3;
    snprintf(kv[0].key, sizeof kv[0].key, "quantize.imatrix.file");
    snprintf(kv[0].val_str, sizeof kv[0].val_str, "%s", imf);
    kv[1].tag = 3;
    snprintf(kv[1].key, sizeof kv[1].key, "quantize.imatrix.dataset");
    snprintf(kv[1].val_str, sizeof kv[1].val_str, "calibration.txt");
    kv[2].tag = 0;
    snprintf(kv[2].key, sizeof kv[2].key, "quantize.imatrix.entries_count");
    kv[2].val_i64 = nl;
    kv[3].tag = 0;
    snprintf(kv[3].key, sizeof kv[3].key, "quantize.imatrix.chunks_count");
    kv[3].val_i64 = 3;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    /* the sanitizer builds (several times slower) take the mixes that hold every weighted
     * quantizer's path between them; test_rows_imatrix has each type on its own */
    static const char *const types[] = {"q4_0", "q2_k", "q4_k_m", "iq4_xs", "q8_0"};
#else
    static const char *const types[] = {"q4_0",   "q5_0",   "q4_1", "q5_1",   "q2_k",   "q3_k_m",
                                        "q4_k_m", "q5_k_s", "q6_k", "iq4_nl", "iq4_xs", "q8_0"};
#endif
    for (size_t k = 0; im && k < sizeof types / sizeof *types; k++) {
        tlm_quantize_opts o = {0};
        CHECK(tlm_ftype_parse(types[k], &o.ftype) == TLM_OK, "%s", types[k]);
        o.imatrix = im;
        char ours[256], theirs[256], plain[256];
        snprintf(ours, sizeof ours, "quant_im_%s.gguf", types[k]);
        snprintf(theirs, sizeof theirs, "quant_im_%s_llama.gguf", types[k]);
        snprintf(plain, sizeof plain, "quant_im_%s_plain.gguf", types[k]);
        CHECK_OK(tlm_model_quantize_gguf(m, tok, ours, &o));
        llama_quantize_params p = defaults();
        p.nthread = 1;
        p.ftype = (int)o.ftype;
        p.imatrix = ld;
        p.kv_overrides = kv;
        CHECK(llama_quantize(f32, theirs, &p) == 0, "llama_model_quantize %s failed", theirs);
        size_t na = 0, nb = 0;
        uint8_t *a = slurp(ours, &na), *b = slurp(theirs, &nb);
        int same = a && b && na == nb && !memcmp(a, b, na);
        CHECK(same,
              "%s with an imatrix: tlm's file (%zu bytes) differs from llama-quantize's (%zu)",
              types[k], na, nb);
        char ta[8192], tb[8192];
        file_types(ours, ta, sizeof ta);
        if (!same) {
            file_types(theirs, tb, sizeof tb);
            fprintf(stderr, "  tlm:   %s\n  llama: %s\n", ta, tb);
        }
        /* the matrix changed the weights (Q8_0 takes none: only the keys differ) */
        o.imatrix = NULL;
        CHECK_OK(tlm_model_quantize_gguf(m, tok, plain, &o));
        tlm_model *wa = NULL, *wb = NULL;
        CHECK_OK(tlm_model_load(ours, 0, &wa));
        CHECK_OK(tlm_model_load(plain, 0, &wb));
        float *fa = wa ? t_flat(wa) : NULL, *fb = wb ? t_flat(wb) : NULL;
        int differs = fa && fb && memcmp(fa, fb, sizeof(float) * tlm_model_num_params(wa)) != 0;
        CHECK(differs == (strcmp(types[k], "q8_0") != 0), "%s: the imatrix changed %s", types[k],
              differs ? "the weights" : "nothing");
        free(fa);
        free(fb);
        tlm_model_free(wa);
        tlm_model_free(wb);
        if (!strcmp(types[k], "q4_0"))
            CHECK(strstr(ta, "blk.0.ffn_down.weight:Q4_1") &&
                      strstr(ta, "blk.1.ffn_down.weight:Q4_0"),
                  "q4_0 with an imatrix: %s", ta);
        if (!strcmp(types[k], "iq4_xs"))
            CHECK(strstr(ta, "blk.0.ffn_down.weight:IQ4_XS"), "iq4_xs with an imatrix: %s", ta);
        if (same) printf("imatrix %-6s == llama-quantize --imatrix (%zu bytes)\n", types[k], na);
        free(a);
        free(b);
        remove(ours);
        remove(theirs);
        remove(plain);
    }
    /* --include-weights / --exclude-weights: the entries whose names contain one of the words
     * kept or dropped before quantizing, as llama-quantize's prepare_imatrix does */
    for (int r = 0; im && r < 2; r++) {
        static const char *const inc[] = {"attn_v", "blk.1."}, *const exc[] = {"ffn"};
        const char *const *words = r ? exc : inc;
        int nwords = r ? 1 : 2;
        tlm_imatrix *f = NULL;
        CHECK_OK(tlm_imatrix_load(imf, &f));
        tlm_imatrix_filter(f, words, nwords, !r);
        llama_imatrix_data *lf = calloc((size_t)nl + 1, sizeof *lf);
        int nf = 0;
        for (int e = 0; lf && e < nl; e++) {
            int hit = 0;
            for (int w = 0; w < nwords; w++) hit |= strstr(ld[e].name, words[w]) != NULL;
            if (hit == !r) lf[nf++] = ld[e];
        }
        CHECK(tlm_imatrix_entries(f) == nf && nf > 0 && nf < nl, "%s: %d entries of %d, want %d",
              r ? "excluded" : "included", tlm_imatrix_entries(f), nl, nf);
        llama_kv_override kf[5];
        memcpy(kf, kv, sizeof kf);
        kf[2].val_i64 = nf;
        tlm_quantize_opts o = {0};
        o.ftype = TLM_FTYPE_Q4_K_M;
        o.imatrix = f;
        const char *ours = "quant_im_sel.gguf", *theirs = "quant_im_sel_llama.gguf";
        CHECK_OK(tlm_model_quantize_gguf(m, tok, ours, &o));
        llama_quantize_params p = defaults();
        p.nthread = 1;
        p.ftype = (int)o.ftype;
        p.imatrix = lf;
        p.kv_overrides = kf;
        CHECK(llama_quantize(f32, theirs, &p) == 0, "llama_model_quantize %s failed", theirs);
        if (same_files(ours, theirs, r ? "--exclude-weights" : "--include-weights"))
            printf("imatrix %s-weights (%d of %d entries) == llama-quantize\n",
                   r ? "--exclude" : "--include", nf, nl);
        free(lf);
        tlm_imatrix_free(f);
        remove(ours);
        remove(theirs);
    }
    /* a matrix entry of the wrong size fails, naming the tensor; nothing is left behind */
    tlm_imatrix *bad = NULL;
    CHECK_OK(tlm_imatrix_new(&bad));
    float ones[100];
    for (int j = 0; j < 100; j++) ones[j] = 1;
    CHECK_OK(tlm_imatrix_accumulate(bad, "blk.0.attn_q.weight", ones, 100, 10));
    tlm_quantize_opts o = {0};
    o.ftype = TLM_FTYPE_Q4_K_M;
    o.imatrix = bad;
    CHECK(tlm_model_quantize_gguf(m, tok, "quant_im_bad.gguf", &o) == TLM_ERR_ARG,
          "a mismatched imatrix entry is refused");
    CHECK(strstr(tlm_last_error(), "blk.0.attn_q.weight") && strstr(tlm_last_error(), "100"), "%s",
          tlm_last_error());
    FILE *left = fopen("quant_im_bad.gguf", "rb");
    CHECK(!left, "a refused quantization left its file");
    if (left) fclose(left);
    tlm_imatrix_free(bad);
    for (int e = 0; e < nl; e++) free(means[e]);
    free(means);
    free(ld);
    tlm_imatrix_free(im);
    tlm_model_free(m);
    remove(f32);
    remove(imf);
}

/* llama-quantize's per-tensor overrides (--pure, --leave-output-tensor, --output-tensor-type,
 * --token-embedding-type, --tensor-type) against llama_model_quantize given the same: an untied
 * model with whole 256-blocks and a tied one (the embedding follows output's type), including a
 * pattern whose type falls back and the mix's layer counts skipped for overridden tensors. */
typedef struct {
    const char *pattern;
    int type;
} llama_tensor_override;

static void test_override_files(model_quantize_fn llama_quantize, default_params_fn defaults,
                                const tlm_tokenizer *tok) {
    static const tlm_tensor_type tt_v[] = {{"attn_v", TLM_DTYPE_Q8_0},
                                           {"blk\\.[0-1]\\.ffn_down", TLM_DTYPE_Q5_K}};
    static const tlm_tensor_type tt_up[] = {{"ffn_up", TLM_DTYPE_Q4_K}};
    static const struct {
        const char *tag, *ftype;
        int tied, pure, leave, out, embd; /* out/embd: a tlm_dtype, or -1 */
        const tlm_tensor_type *tt;
        int ntt;
        const char *expect; /* a "name:TYPE" the file must hold */
    } cases[] = {
        {"pure", "q4_k_m", 0, 1, 0, -1, -1, NULL, 0, "output.weight:Q4_K"},
        {"leave", "q4_k_m", 0, 0, 1, -1, -1, NULL, 0, "output.weight:F32"},
        {"outembd", "q4_k_m", 0, 0, 0, TLM_DTYPE_Q8_0, TLM_DTYPE_Q5_0, NULL, 0,
         "token_embd.weight:Q5_0"},
        {"patterns", "q4_k_m", 0, 0, 0, -1, -1, tt_v, 2, "blk.1.ffn_down.weight:Q5_K"},
        {"f16out", "f16", 0, 0, 0, TLM_DTYPE_Q6_K, -1, NULL, 0, "output.weight:Q6_K"},
        {"tiedout", "q4_k_m", 1, 0, 0, TLM_DTYPE_Q5_K, -1, NULL, 0, "token_embd.weight:Q5_K"},
        {"tiedboth", "q4_0", 1, 0, 0, TLM_DTYPE_Q8_0, TLM_DTYPE_IQ4_NL, NULL, 0,
         "token_embd.weight:IQ4_NL"},
        {"tiedpure", "q3_k_m", 1, 1, 0, -1, -1, tt_up, 1, "token_embd.weight:Q3_K"},
    };
    for (int tied = 0; tied < 2; tied++) {
        tlm_model *m = wide_model(4, 512, tied, 13 + (uint64_t)tied);
        if (!m) return;
        const char *f32 = "quant_ov_src.gguf";
        CHECK_OK(tlm_model_save_gguf(m, tok, f32, TLM_DTYPE_F32));
        for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
            if (cases[k].tied != tied) continue;
            tlm_quantize_opts o = {0};
            CHECK(tlm_ftype_parse(cases[k].ftype, &o.ftype) == TLM_OK, "%s", cases[k].ftype);
            o.pure = cases[k].pure;
            o.leave_output = cases[k].leave;
            o.output_type_set = cases[k].out >= 0;
            o.output_type = cases[k].out >= 0 ? (tlm_dtype)cases[k].out : TLM_DTYPE_F32;
            o.embd_type_set = cases[k].embd >= 0;
            o.embd_type = cases[k].embd >= 0 ? (tlm_dtype)cases[k].embd : TLM_DTYPE_F32;
            o.tensor_types = cases[k].tt;
            o.n_tensor_types = cases[k].ntt;
            llama_quantize_params p = defaults();
            p.nthread = 1;
            p.ftype = (int)o.ftype;
            p.pure = o.pure;
            p.quantize_output_tensor = !o.leave_output;
            if (o.output_type_set) p.output_tensor_type = (int)core_dtype_get(o.output_type)->ggml;
            if (o.embd_type_set) p.token_embedding_type = (int)core_dtype_get(o.embd_type)->ggml;
            llama_tensor_override ov[4];
            for (int r = 0; r < cases[k].ntt; r++)
                ov[r] = (llama_tensor_override){cases[k].tt[r].pattern,
                                                (int)core_dtype_get(cases[k].tt[r].type)->ggml};
            ov[cases[k].ntt] = (llama_tensor_override){NULL, 43 /* GGML_TYPE_COUNT */};
            if (cases[k].ntt) p.tt_overrides = ov;
            char ours[128], theirs[128];
            snprintf(ours, sizeof ours, "quant_ov_%s.gguf", cases[k].tag);
            snprintf(theirs, sizeof theirs, "quant_ov_%s_llama.gguf", cases[k].tag);
            CHECK_OK(tlm_model_quantize_gguf(m, tok, ours, &o));
            CHECK(llama_quantize(f32, theirs, &p) == 0, "llama_model_quantize %s failed", theirs);
            size_t na = 0, nb = 0;
            uint8_t *a = slurp(ours, &na), *b = slurp(theirs, &nb);
            int same = a && b && na == nb && !memcmp(a, b, na);
            char ta[8192], tb[8192];
            file_types(ours, ta, sizeof ta);
            CHECK(same, "overrides %s: tlm's file (%zu bytes) differs from llama-quantize's (%zu)",
                  cases[k].tag, na, nb);
            if (!same) {
                file_types(theirs, tb, sizeof tb);
                fprintf(stderr, "  tlm:   %s\n  llama: %s\n", ta, tb);
            }
            CHECK(strstr(ta, cases[k].expect) != NULL, "overrides %s: no %s in %s", cases[k].tag,
                  cases[k].expect, ta);
            if (same)
                printf("overrides %-8s == llama-quantize (%s)\n", cases[k].tag, cases[k].expect);
            free(a);
            free(b);
            remove(ours);
            remove(theirs);
        }
        /* refusals: a pattern that is no regular expression, a type that is not a float type */
        static const tlm_tensor_type bad_re[] = {{"attn_[v", TLM_DTYPE_Q8_0}};
        tlm_quantize_opts o = {0};
        o.ftype = TLM_FTYPE_Q4_K_M;
        o.tensor_types = bad_re;
        o.n_tensor_types = 1;
        CHECK(tlm_model_quantize_gguf(m, tok, "quant_ov_bad.gguf", &o) == TLM_ERR_ARG &&
                  strstr(tlm_last_error(), "attn_[v"),
              "a bad pattern: %s", tlm_last_error());
        o.n_tensor_types = 0;
        o.output_type_set = 1;
        o.output_type = TLM_DTYPE_I32;
        CHECK(tlm_model_quantize_gguf(m, tok, "quant_ov_bad.gguf", &o) == TLM_ERR_ARG &&
                  strstr(tlm_last_error(), "--output-tensor-type"),
              "an integer type: %s", tlm_last_error());
        FILE *left = fopen("quant_ov_bad.gguf", "rb");
        CHECK(!left, "a refused quantization left its file");
        if (left) fclose(left);
        tlm_model_free(m);
        remove(f32);
    }
}

/* llama-quantize's --override-kv and --prune-layers against llama_model_quantize given the same,
 * on a model with RoPE frequency factors (rope_freqs.weight): overridden keys moved to the end in
 * llama.cpp's types (a key set twice, an int's magnitude), pruned blocks left out and the rest
 * renumbered, llama.block_count last, and the mixes' layer counts as llama.cpp keeps them (attn_v
 * over the layers left, ffn_down over the model's). */
static void test_kv_prune_files(model_quantize_fn llama_quantize, default_params_fn defaults,
                                const tlm_tokenizer *tok) {
    static const char *const specs[] = {
        "general.name=str:renamed", "llama.context_length=int:-300",
        "x.scale=float:0.25",       "tokenizer.ggml.add_bos_token=bool:false",
        "x.flag=bool:true",         "general.name=str:again"};
    enum { NS = sizeof specs / sizeof *specs };
    tlm_kv_override kv[NS];
    llama_kv_override lkv[NS + 1];
    memset(lkv, 0, sizeof lkv);
    for (int k = 0; k < NS; k++) {
        CHECK_OK(tlm_kv_override_parse(specs[k], &kv[k]));
        lkv[k].tag = (int)kv[k].type;
        memcpy(lkv[k].key, kv[k].key, sizeof lkv[k].key);
        if (kv[k].type == TLM_KV_INT) lkv[k].val_i64 = kv[k].i;
        if (kv[k].type == TLM_KV_FLOAT) lkv[k].val_f64 = kv[k].f;
        if (kv[k].type == TLM_KV_BOOL) lkv[k].val_bool = kv[k].b;
        if (kv[k].type == TLM_KV_STR) memcpy(lkv[k].val_str, kv[k].str, sizeof lkv[k].val_str);
    }
    CHECK(kv[1].i == -300 && kv[2].f == 0.25 && !kv[3].b && kv[4].b && !strcmp(kv[5].str, "again"),
          "overrides parsed");
    static const char *const bad[] = {
        "=int:1", "novalue", "k=int:12x", "k=int:", "k=float:x", "k=bool:yes", "k=u32:1", "k=str"};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        tlm_kv_override o;
        CHECK(tlm_kv_override_parse(bad[k], &o) == TLM_ERR_ARG && strstr(tlm_last_error(), bad[k]),
              "override '%s' refused: %s", bad[k], tlm_last_error());
    }
    static const int prune_a[] = {1, 6}, prune_b[] = {0}, prune_c[] = {7, 6, 5, 6};
    static const struct {
        const char *tag, *ftype;
        const int *prune;
        int n_prune, kv, layers;
        const char *expect;
    } cases[] = {
        {"kvprune", "q4_k_m", prune_a, 2, 1, 6, "blk.3.ffn_down.weight:Q6_K"},
        {"kvonly", "q4_0", NULL, 0, 1, 8, "blk.7.attn_v.weight:Q4_0"},
        {"prune0", "q3_k_m", prune_b, 1, 0, 7, "blk.6.ffn_down.weight"},
        {"prunelast", "q5_k_m", prune_c, 4, 0, 5, "blk.4.attn_v.weight:Q6_K"},
    };
    tlm_model *m = wide_model(8, 512, 0, 17);
    if (!m) return;
    /* with Llama 3.1's RoPE factors: rope_freqs.weight stays F32, in llama.cpp's place */
    float rf[32];
    for (int i = 0; i < 32; i++)
        rf[i] = i < 8 ? 1.0f : i < 24 ? 1.0f + 0.25f * (float)(i - 8) : 8.0f;
    CHECK_OK(mdl_set_rope_factors(m, rf, 32));
    const char *f32 = "quant_kv_src.gguf";
    CHECK_OK(tlm_model_save_gguf(m, tok, f32, TLM_DTYPE_F32));
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        tlm_quantize_opts o = {0};
        CHECK(tlm_ftype_parse(cases[k].ftype, &o.ftype) == TLM_OK, "%s", cases[k].ftype);
        o.prune_layers = cases[k].prune;
        o.n_prune_layers = cases[k].n_prune;
        o.kv_overrides = cases[k].kv ? kv : NULL;
        o.n_kv_overrides = cases[k].kv ? NS : 0;
        llama_quantize_params p = defaults();
        p.nthread = 1;
        p.ftype = (int)o.ftype;
        p.kv_overrides = cases[k].kv ? lkv : NULL;
        int32_t pl[8];
        for (int r = 0; r < cases[k].n_prune; r++) pl[r] = cases[k].prune[r];
        pl[cases[k].n_prune] = -1;
        p.prune_layers = cases[k].n_prune ? pl : NULL;
        char ours[128], theirs[128];
        snprintf(ours, sizeof ours, "quant_kv_%s.gguf", cases[k].tag);
        snprintf(theirs, sizeof theirs, "quant_kv_%s_llama.gguf", cases[k].tag);
        CHECK_OK(tlm_model_quantize_gguf(m, tok, ours, &o));
        CHECK(llama_quantize(f32, theirs, &p) == 0, "llama_model_quantize %s failed", theirs);
        int same = same_files(ours, theirs, cases[k].tag);
        char ta[8192];
        file_types(ours, ta, sizeof ta);
        CHECK(strstr(ta, cases[k].expect) != NULL, "%s: no %s in %s", cases[k].tag, cases[k].expect,
              ta);
        /* tlm reads it back: the layers left, the overridden context length */
        tlm_model *q = NULL;
        CHECK_OK(tlm_model_load(ours, 0, &q));
        const tlm_config *qc = q ? tlm_model_config(q) : NULL;
        CHECK(qc && qc->n_layers == cases[k].layers &&
                  qc->context_length == (cases[k].kv ? 300 : 64),
              "%s read back: %d layers, context %d", cases[k].tag, qc ? qc->n_layers : -1,
              qc ? qc->context_length : -1);
        tlm_model_free(q);
        if (same) printf("kv/prune %-9s == llama-quantize (%s)\n", cases[k].tag, cases[k].expect);
        remove(ours);
        remove(theirs);
    }
    /* Qwen2's layout (q, k and v biases, RoPE on halves: arch qwen2): the same mixes, the biases
     * kept F32 */
    {
        tlm_config qc = *tlm_model_config(m);
        qc.qkv_bias = 1;
        qc.rope_pairing = TLM_ROPE_HALF;
        tlm_model *q = NULL;
        CHECK_OK(tlm_model_new(&qc, &q));
        if (q) CHECK_OK(tlm_model_init(q, 23, TLM_INIT_XAVIER));
        static const char *const qt[] = {"q4_k_m", "q3_k_m"};
        for (int k = 0; q && k < 2; k++) {
            const char *src = "quant_qwen2_src.gguf", *ours = "quant_qwen2.gguf",
                       *theirs = "quant_qwen2_llama.gguf";
            CHECK_OK(tlm_model_save_gguf(q, tok, src, TLM_DTYPE_F32));
            tlm_quantize_opts o = {0};
            CHECK(tlm_ftype_parse(qt[k], &o.ftype) == TLM_OK, "%s", qt[k]);
            CHECK_OK(tlm_model_quantize_gguf(q, tok, ours, &o));
            llama_quantize_params p = defaults();
            p.nthread = 1;
            p.ftype = (int)o.ftype;
            CHECK(llama_quantize(src, theirs, &p) == 0, "llama_model_quantize %s failed", theirs);
            char ta[8192];
            file_types(ours, ta, sizeof ta);
            CHECK(strstr(ta, "blk.0.attn_q.bias:F32") != NULL, "qwen2 %s: %s", qt[k], ta);
            if (same_files(ours, theirs, "qwen2"))
                printf("qwen2 %-6s == llama-quantize (arch qwen2, q/k/v biases)\n", qt[k]);
            remove(src);
            remove(ours);
            remove(theirs);
        }
        tlm_model_free(q);
    }
    /* refusals, nothing written: a layer the model lacks, every layer, general.alignment */
    static const int out_of_range[] = {8}, all[] = {0, 1, 2, 3, 4, 5, 6, 7};
    tlm_kv_override align;
    CHECK_OK(tlm_kv_override_parse("general.alignment=int:64", &align));
    for (int r = 0; r < 3; r++) {
        tlm_quantize_opts o = {0};
        o.ftype = TLM_FTYPE_Q4_0;
        o.prune_layers = r == 0 ? out_of_range : r == 1 ? all : NULL;
        o.n_prune_layers = r == 0 ? 1 : r == 1 ? 8 : 0;
        o.kv_overrides = r == 2 ? &align : NULL;
        o.n_kv_overrides = r == 2;
        static const char *const why[] = {"not 8", "every layer", "general.alignment"};
        CHECK(tlm_model_quantize_gguf(m, tok, "quant_kv_bad.gguf", &o) == TLM_ERR_ARG &&
                  strstr(tlm_last_error(), why[r]),
              "refusal %d: %s", r, tlm_last_error());
        FILE *left = fopen("quant_kv_bad.gguf", "rb");
        CHECK(!left, "a refused quantization left its file");
        if (left) fclose(left);
    }
    tlm_model_free(m);
    remove(f32);
}

/* node is not what the sanitizers check: their builds leave llama.cpp's loading out. */
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define TEST_LLAMACPP_LOADS 1
#endif

#ifdef TEST_LLAMACPP_LOADS
/* llama.cpp (node-llama-cpp) loads the files and generates from them. */
static void test_llamacpp_loads(const char *const *paths, int n) {
    char cmd[16384];
    int len = snprintf(cmd, sizeof cmd,
                       "cd %s/tests/node && NODE_LLAMA_CPP_SKIP_DOWNLOAD=true node "
                       "llama_load_all.mjs \"1 403 407\" 8",
                       TLM_SOURCE_DIR);
    for (int i = 0; i < n; i++)
        len += snprintf(cmd + len, sizeof cmd - (size_t)len, " %s/%s", t_out_dir(), paths[i]);
    snprintf(cmd + len, sizeof cmd - (size_t)len, " 2>&1");
    double t0 = now();
    FILE *f = popen(cmd, "r");
    CHECK(f != NULL, "cannot run node");
    if (!f) return;
    char line[4096];
    int ok = 0;
    while (fgets(line, sizeof line, f)) {
        /* eight ids: "ids":[a,b,c,d,e,f,g,h] */
        const char *ids = strstr(line, "\"ids\":[");
        int commas = 0;
        for (const char *c = ids; c && *c && *c != ']'; c++) commas += *c == ',';
        CHECK(ids && commas == 7, "llama.cpp: %s", line);
        ok += ids && commas == 7;
    }
    pclose(f);
    CHECK(ok == n, "llama.cpp generated from %d of %d files", ok, n);
    if (ok == n)
        printf("llama.cpp loads and generates from all %d files (%.1f s)\n", n, now() - t0);
}
#endif

static void test_whole_files(void) {
    const char *dir = t_require_shared_data();
    if (!dir) return;
    void *lib = dlopen(NODE_BINS "/libllama.v0.5.0.so", RTLD_NOW | RTLD_LOCAL);
    CHECK(lib != NULL, "cannot load node-llama-cpp's libllama: %s", dlerror());
    if (!lib) return;
    model_quantize_fn llama_quantize =
        (model_quantize_fn)(uintptr_t)dlsym(lib, "llama_model_quantize");
    default_params_fn defaults =
        (default_params_fn)(uintptr_t)dlsym(lib, "llama_model_quantize_default_params");
    log_set_fn log_set = (log_set_fn)(uintptr_t)dlsym(lib, "llama_log_set");
    CHECK(llama_quantize && defaults && log_set, "libllama lacks the quantize API");
    if (!llama_quantize || !defaults || !log_set) return;
    log_set(quiet, NULL);
    tlm_tokenizer *tok = NULL;
    CHECK_OK(tlm_tokenizer_load(t_path(t_path(dir, "models"), "tok512.bin"), &tok));
    static char paths[3 * N_TYPES][256];

    /* Untied, every matrix a multiple of 256 wide, grouped-query attention, 4 layers: the _M
     * mixes give layers 2 and 3 (use_more_bits) Q6_K attn_v and ffn_down. */
    tlm_config c;
    tlm_config_defaults(&c);
    c.vocab_size = 512;
    c.context_length = 64;
    c.d_model = 256;
    c.n_layers = 4;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.d_ff = 256;
    c.tie_embeddings = 0;
    tlm_model *m = NULL;
    CHECK_OK(tlm_config_finalize(&c));
    CHECK_OK(tlm_model_new(&c, &m));
    if (m) {
        CHECK_OK(tlm_model_init(m, 7, TLM_INIT_XAVIER));
        /* A zero row for </s> (id 2): greedy never ends the continuation llama.cpp is asked for. */
        const tlm_tensor_info *out = tlm_model_find(m, "output.weight");
        if (out)
            memset(tlm_model_params(m) + out->offset + 2 * c.d_model, 0, sizeof(float) * c.d_model);
        static const char *const want[] = {
            "output.weight:Q6_K",         "token_embd.weight:Q4_K",
            "blk.0.attn_v.weight:Q4_K",   "blk.2.attn_v.weight:Q6_K",
            "blk.3.attn_v.weight:Q6_K",   "blk.1.ffn_down.weight:Q4_K",
            "blk.2.ffn_down.weight:Q6_K", "blk.0.attn_norm.weight:F32",
            "blk.0.attn_q.weight:Q4_K",   NULL};
        test_files(llama_quantize, defaults, m, tok, "wide", want, paths);
        tlm_model_free(m);
    }
    /* Four q heads per kv head: Q2_K's attn_v is Q4_K there (Q3_K below four). */
    c.n_layers = 2;
    c.n_heads = 8;
    m = NULL;
    CHECK_OK(tlm_config_finalize(&c));
    CHECK_OK(tlm_model_new(&c, &m));
    if (m) {
        CHECK_OK(tlm_model_init(m, 9, TLM_INIT_XAVIER));
        static const char *const want[] = {"blk.0.attn_v.weight:Q4_K", "blk.1.attn_v.weight:Q6_K",
                                           NULL};
        test_files(llama_quantize, defaults, m, tok, "gqa4", want, paths + 2 * N_TYPES);
        char ta[8192];
        file_types(paths[2 * N_TYPES + type_index("q2_k")], ta, sizeof ta);
        CHECK(strstr(ta, "blk.0.attn_v.weight:Q4_K") && strstr(ta, "blk.0.attn_output.weight:Q3_K"),
              "gqa4 q2_k: %s", ta);
        tlm_model_free(m);
    }
    /* stories260K: tied, 64 wide: every K type falls back (Q4_K to Q5_0, Q6_K to Q8_0) and the
     * tied token_embd takes output's type. */
    m = NULL;
    CHECK_OK(
        tlm_model_load(t_path(t_path(dir, "models"), "stories260K.bin"), TLM_LOAD_WRITABLE, &m));
    if (m) {
        static const char *const want[] = {"token_embd.weight:Q8_0", "blk.0.attn_q.weight:Q5_0",
                                           "blk.4.attn_v.weight:Q8_0", NULL};
        test_files(llama_quantize, defaults, m, tok, "s260k", want, paths + N_TYPES);
        tlm_model_free(m);
    }
    test_imatrix_files(llama_quantize, defaults, tok);
    test_override_files(llama_quantize, defaults, tok);
    test_kv_prune_files(llama_quantize, defaults, tok);
    tlm_tokenizer_free(tok);
#ifdef TEST_LLAMACPP_LOADS
    /* The files are llama-quantize's bytes, so llama.cpp's loading them is its own business; a
     * few files that hold every block type between them (about 1.5 s of CPU each) confirm it. */
    const char *some[] = {paths[type_index("bf16")],             /* wide */
                          paths[N_TYPES + type_index("f16")],    /* s260k */
                          paths[type_index("q4_0")],             /* wide, with a Q6_K output */
                          paths[type_index("q4_1")],             /* wide */
                          paths[type_index("q2_k")],             /* wide: Q2_K, Q3_K */
                          paths[type_index("q3_k_m")],           /* wide: Q3_K, Q4_K, Q5_K */
                          paths[type_index("iq4_xs")],           /* wide: IQ4_XS */
                          paths[N_TYPES + type_index("iq4_nl")], /* s260k: IQ4_NL */
                          paths[type_index("q4_k_m")],           /* wide: Q4_K, Q6_K */
                          paths[type_index("q5_k_s")],           /* wide: Q5_K */
                          paths[N_TYPES + type_index("q4_k_m")], /* s260k: Q5_0, Q8_0 */
                          paths[N_TYPES + type_index("q5_k_m")], /* s260k: Q5_1 */
                          paths[N_TYPES + type_index("q2_k")] /* s260k: Q4_0 for Q2_K/Q3_K */};
    test_llamacpp_loads(some, (int)(sizeof some / sizeof *some));
#endif
    for (int i = 0; i < 3 * N_TYPES; i++) remove(paths[i]);
    dlclose(lib);
}

/* The defaults: Q8_0 and every llama-quantize override off. */
static void test_quantize_defaults(void) {
    tlm_quantize_opts o;
    memset(&o, 0x5a, sizeof o);
    tlm_quantize_opts_defaults(&o);
    CHECK(o.ftype == TLM_FTYPE_Q8_0 && !o.imatrix && !o.progress && !o.user && !o.pure &&
              !o.leave_output && !o.output_type_set && !o.embd_type_set &&
              o.output_type == TLM_DTYPE_F32 && o.embd_type == TLM_DTYPE_F32 && !o.tensor_types &&
              !o.n_tensor_types && !o.dry_run && !o.kv_overrides && !o.n_kv_overrides &&
              !o.prune_layers && !o.n_prune_layers,
          "default quantize options");
    tlm_ftype f = TLM_FTYPE_F32;
    CHECK(tlm_ftype_parse("Q4_K_M", &f) == TLM_OK && f == TLM_FTYPE_Q4_K_M, "Q4_K_M: %d", (int)f);
    CHECK(tlm_ftype_parse("q9_9", &f) == TLM_ERR_ARG && strstr(tlm_last_error(), "'q9_9'"),
          "unknown file type: %s", tlm_last_error());
}

int main(void) {
    test_dtype_table();
    test_quantize_defaults();
    test_round_trip();
    void *lib = dlopen(NODE_BINS "/libggml-base.so", RTLD_NOW | RTLD_LOCAL);
    CHECK(lib != NULL,
          "cannot load node-llama-cpp's libggml-base.so (run bash scripts/setup.sh): %s",
          dlerror());
    if (lib) {
        quantize_chunk_fn chunk = (quantize_chunk_fn)(uintptr_t)dlsym(lib, "ggml_quantize_chunk");
        CHECK(chunk != NULL, "ggml_quantize_chunk not exported");
        if (chunk) test_rows(lib, chunk);
        if (chunk) test_rows_imatrix(chunk);
    }
    /* libggml-base stays loaded while libllama (which needs it) is used: unloaded and loaded
     * again, its static constructor finds its own terminate handler still installed in the
     * libstdc++ that oneDNN keeps loaded, and aborts. */
    test_whole_files();
    if (lib) dlclose(lib);
    return t_finish("test_quant");
}
