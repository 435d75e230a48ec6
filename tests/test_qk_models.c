/* Models computed on in their file types. GGUF files of each type are made here from F32 files:
 * tensors quantized by llama.cpp's own quantizer (ggml_quantize_chunk of node-llama-cpp's prebuilt
 * libggml-base.so, loaded with dlopen) and written next to a raw copy of the metadata. Then:
 * - the typed model is used in place (its views keep the type, its memory is the file's);
 * - prefill logits equal those of the widened F32 copy (widened tiles and the same sgemm);
 * - decode logits of the fast kernels equal those of the reference kernels, and are close to the
 *   widened copy's (the activations are quantized to 8 bits, as llama.cpp does);
 * - stories260K in Q8_0 continues greedily with the same tokens as llama.cpp. */
#include <dlfcn.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/dtype.h"
#include "harness.h"
#include "io/gguf.h"
#include "kernels/matvec.h"
#include "kernels/qdot.h"
#include "kernels/qgemm.h"
#include "model/block.h"

#define NODE_DIR TLM_SOURCE_DIR "/tests/node"
#define GGML_LIB NODE_DIR "/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/libggml-base.so"

typedef size_t (*quantize_chunk_fn)(int type, const float *src, void *dst, int64_t start,
                                    int64_t nrows, int64_t n_per_row, const float *imatrix);
static quantize_chunk_fn quantize_chunk;

static size_t gguf_value_size(io_gguf_type t) {
    static const size_t sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return (unsigned)t < IO_GGUF_TYPE_COUNT ? sz[t] : 0;
}

/* Where the metadata of g ends in the file (it starts at byte 24 in version 3). */
static size_t kv_end(const io_gguf *g) {
    const io_gguf_kv *kv = &g->kv[g->n_kv - 1];
    const uint8_t *end;
    if (kv->type == IO_GGUF_STRING)
        end = kv->data + kv->len;
    else if (kv->type != IO_GGUF_ARRAY)
        end = kv->data + gguf_value_size(kv->type);
    else if (kv->elem_type == IO_GGUF_STRING)
        end = kv->len ? kv->strs[kv->len - 1] + kv->str_lens[kv->len - 1] : kv->data;
    else
        end = kv->data + kv->len * gguf_value_size(kv->elem_type);
    return (size_t)(end - g->base);
}

static void put(FILE *f, const void *p, size_t n) { fwrite(p, 1, n, f); }
static void put_u32(FILE *f, uint32_t v) { put(f, &v, 4); }
static void put_u64(FILE *f, uint64_t v) { put(f, &v, 8); }

/* in (F32 GGUF v3) -> out with every matrix whose rows are whole blocks of t in type t. */
static int quantize_file(const char *in, const char *out, tlm_dtype t) {
    io_gguf *g = NULL;
    if (io_gguf_open(in, &g) != TLM_OK) return 0;
    const core_dtype_info *d = core_dtype_get(t);
    uint32_t *types = calloc(g->n_tensors, sizeof *types);
    uint64_t *bytes = calloc(g->n_tensors, sizeof *bytes), *offs = calloc(g->n_tensors, 8);
    void **data = calloc(g->n_tensors, sizeof *data);
    uint64_t pos = 0, al = g->alignment;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const io_gguf_tensor *ti = &g->tensors[i];
        int q = ti->n_dims == 2 && ti->type == 0 && ti->dims[0] % d->block_elems == 0;
        types[i] = q ? (uint32_t)d->ggml : ti->type;
        bytes[i] = q ? core_dtype_bytes(t, ti->n_elements) : ti->n_bytes;
        data[i] = malloc(bytes[i]);
        if (q) {
            /* copied out first: the file's floats need not be aligned for the quantizer */
            float *src = malloc(ti->n_elements * sizeof(float));
            memcpy(src, ti->data, ti->n_elements * sizeof(float));
            quantize_chunk(d->ggml, src, data[i], 0, (int64_t)ti->dims[1], (int64_t)ti->dims[0],
                           NULL);
            free(src);
        } else {
            memcpy(data[i], ti->data, bytes[i]);
        }
        offs[i] = pos;
        pos += (bytes[i] + al - 1) / al * al;
    }
    FILE *f = fopen(out, "wb");
    put(f, "GGUF", 4);
    put_u32(f, 3);
    put_u64(f, g->n_tensors);
    put_u64(f, g->n_kv);
    put(f, g->base + 24, kv_end(g) - 24);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const io_gguf_tensor *ti = &g->tensors[i];
        put_u64(f, strlen(ti->name));
        put(f, ti->name, strlen(ti->name));
        put_u32(f, ti->n_dims);
        for (uint32_t k = 0; k < ti->n_dims; k++) put_u64(f, ti->dims[k]);
        put_u32(f, types[i]);
        put_u64(f, offs[i]);
    }
    static const uint8_t zero[64];
    long here = ftell(f);
    put(f, zero, (size_t)((al - (uint64_t)here % al) % al));
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        put(f, data[i], bytes[i]);
        put(f, zero, (size_t)((al - bytes[i] % al) % al));
        free(data[i]);
    }
    int ok = fclose(f) == 0;
    free(types);
    free(bytes);
    free(offs);
    free(data);
    io_gguf_close(g);
    return ok;
}

static double max_abs(const float *a, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(a[i]));
    return m;
}
static double max_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(a[i] - b[i]));
    return m;
}

/* Prefill T tokens, then decode `steps` more; logits of the decode steps into out [steps, V]. */
static void run_decode(const tlm_model *m, const int32_t *ids, int T, int steps, float *out) {
    tlm_session *s = NULL;
    CHECK_OK(tlm_session_new(m, &(tlm_session_opts){.batch = 1, .capacity = 64}, &s));
    if (!s) return;
    int V = tlm_model_config(m)->vocab_size;
    CHECK_OK(tlm_session_prefill(s, 0, ids, T, NULL, 0));
    for (int k = 0; k < steps; k++)
        CHECK_OK(tlm_session_decode_one(s, ids[T + k], out + (size_t)k * V));
    tlm_session_free(s);
}

static void check_type(const char *f32_path, tlm_dtype t) {
    const char *name = tlm_dtype_name(t);
    char path[256];
    snprintf(path, sizeof path, "qk_model_%s.gguf", name);
    CHECK(quantize_file(f32_path, path, t), "%s: quantized file written", name);
    tlm_model *m = NULL, *w = NULL;
    CHECK_OK(tlm_model_load(path, 0, &m));
    CHECK_OK(tlm_model_load(path, TLM_LOAD_WRITABLE, &w));
    if (!m || !w) goto done;
    const tlm_config *c = tlm_model_config(m);
    int V = c->vocab_size;
    /* in place: the matrices keep the file's type; the model owns only tables */
    int n = 0, typed = 0;
    const tlm_tensor_info *ti = tlm_model_tensors(m, &n);
    size_t want = 0;
    for (int i = 0; i < n; i++) {
        const tlm_weight *wi = tlm_model_weight(m, i);
        if (ti[i].ndim == 2) typed += wi->dtype == t;
        want += (size_t)wi->rows * wi->row_bytes;
    }
    size_t mapped = 0, owned = 0;
    tlm_model_memory(m, &mapped, &owned);
    CHECK(typed == (c->tie_embeddings ? 1 : 2) + 7 * c->n_layers, "%s: %d matrices in their type",
          name, typed);
    CHECK(mapped == want && owned < 200000, "%s: mapped %zu of %zu, owned %zu", name, mapped, want,
          owned);
    int32_t ids[24];
    for (int i = 0; i < 24; i++) ids[i] = (int32_t)((i * 37 + 11) % V);
    /* prefill: the 8-bit products of repacked rows (where the CPU has AVX-512 VNNI) near the
     * widened copy, within what 8-bit activations cost (as decode below); with
     * k_linear_prefill(K_PREFILL_SGEMM), widened tiles through sgemm, the widened copy's sums. The
     * decode checks below start from the sgemm prefill, so that they compare the decode kernels
     * alone. */
    int T = 16;
    tlm_forward_out a, b;
    CHECK_OK(t_forward(w, ids, 1, T, NULL, &b));
    double big = max_abs(b.logits, (size_t)T * V);
    CHECK_OK(t_forward(m, ids, 1, T, NULL, &a));
    double diff = max_diff(a.logits, b.logits, (size_t)T * V);
    /* (BF16: vdpbf16ps on activations rounded to BF16, where the CPU has it) */
    double qtol = k_qgemm_takes(t) && (k_qgemm_covers(t) || t == TLM_DTYPE_BF16) ? 0.015 : 1e-4;
    CHECK(diff <= qtol * big, "%s prefill (default path): %g from the widened copy (of %g)", name,
          diff, big);
    if (k_qgemm_takes(t) && k_qgemm_covers(t)) {
        /* nothing kept by default: memory stays the mapped file; with the pack cache on the
         * repacked copy is kept with the model, counted as its memory, and gives the same logits */
        size_t owned2 = 0;
        tlm_model_memory(m, NULL, &owned2);
        CHECK(owned2 == owned, "%s: owns %zu after a prompt, %zu before", name, owned2, owned);
        k_qgemm_cache_enable(1);
        tlm_forward_out a2;
        CHECK_OK(t_forward(m, ids, 1, T, NULL, &a2));
        tlm_model_memory(m, NULL, &owned2);
        CHECK(owned2 >= owned + mapped,
              "%s: owns %zu after a prompt with the pack cache on (mapped %zu)", name, owned2,
              mapped);
        CHECK(!memcmp(a.logits, a2.logits, sizeof(float) * T * V), "%s: kept copy, same logits",
              name);
        k_qgemm_cache_enable(0);
    }
    if (k_qgemm_takes(t) && k_qgemm_covers(t))
        printf("%-5s qgemm prefill vs widened F32: %.3g of %.3g\n", name, diff, big);
    k_prefill_path was = k_linear_prefill(K_PREFILL_SGEMM);
    CHECK_OK(t_forward(m, ids, 1, T, NULL, &a));
    diff = max_diff(a.logits, b.logits, (size_t)T * V);
    CHECK(diff <= 1e-4 * big, "%s prefill: %g from the widened copy (of %g)", name, diff, big);
    /* decode: fast kernels against the references, and near the widened copy */
    int steps = 6;
    float *fast = malloc(sizeof(float) * steps * V), *ref = malloc(sizeof(float) * steps * V),
          *wide = malloc(sizeof(float) * steps * V);
    run_decode(m, ids, T, steps, fast);
    {
        /* read into memory (TLM_LOAD_READ): the same types, all of the file's bytes, the same
         * logits bit for bit as from the mapping */
        tlm_model *r = NULL;
        CHECK_OK(tlm_model_load(path, TLM_LOAD_READ, &r));
        if (r) {
            size_t rmap = 0, rown = 0;
            tlm_model_memory(r, &rmap, &rown);
            int rtyped = 0;
            for (int i = 0; i < n; i++)
                rtyped += ti[i].ndim == 2 && tlm_model_weight(r, i)->dtype == t;
            CHECK(rtyped == typed && rmap == want && rown < 200000,
                  "%s read: %d typed, %zu of %zu bytes, owns %zu", name, rtyped, rmap, want, rown);
            float *got = malloc(sizeof(float) * steps * V);
            if (got) {
                run_decode(r, ids, T, steps, got);
                CHECK(!memcmp(got, fast, sizeof(float) * steps * V), "%s read: same logits", name);
            }
            free(got);
            tlm_model_free(r);
        }
    }
    k_isa_cap(K_ISA_REF);
    run_decode(m, ids, T, steps, ref);
    k_isa_cap(K_ISA_COUNT);
    run_decode(w, ids, T, steps, wide);
    k_linear_prefill(was);
    big = max_abs(wide, (size_t)steps * V);
    diff = max_diff(fast, ref, (size_t)steps * V);
    /* The same integer sums, combined in fp32 in another order. Activations rounded to 8 bits
     * (BF16's mantissas, the block types' int8 rows) turn a difference in the last bit of a float
     * into a whole step of the next layer's input now and then; F16 rounds none. */
    double same = t == TLM_DTYPE_F16 ? 1e-4 : 3e-3;
    CHECK(diff <= same * big, "%s decode: fast %g from the reference (of %g)", name, diff, big);
    diff = max_diff(fast, wide, (size_t)steps * V);
    /* 8-bit activations (F16: none, BF16: 8-bit mantissas) */
    double tol = t == TLM_DTYPE_F16 ? 1e-4 : 0.03;
    CHECK(diff <= tol * big, "%s decode: %g from the widened copy (of %g)", name, diff, big);
    printf("%-5s decode vs widened F32: %.3g of %.3g\n", name, diff, big);
    free(fast);
    free(ref);
    free(wide);
done:
    tlm_model_free(m);
    tlm_model_free(w);
    remove(path);
}

/* Load-time precision: TLM_LOAD_BF16 rounds an F32 file's matrices to exactly the bytes of the
 * BF16 file llama.cpp's quantizer writes from it (so the same logits, bit for bit), and
 * TLM_LOAD_FP32 widens a BF16 file's matrices to what a writable load computes. */
static void check_precision(const char *f32_path) {
    const char *bf = "qk_model_prec_bf16.gguf";
    CHECK(quantize_file(f32_path, bf, TLM_DTYPE_BF16), "BF16 file written");
    tlm_model *r = NULL, *b = NULL, *e = NULL, *w = NULL, *bad = NULL;
    CHECK_OK(tlm_model_load(f32_path, TLM_LOAD_BF16, &r));
    CHECK_OK(tlm_model_load(bf, 0, &b));
    CHECK_OK(tlm_model_load(bf, TLM_LOAD_FP32, &e));
    CHECK_OK(tlm_model_load(bf, TLM_LOAD_WRITABLE, &w));
    CHECK(tlm_model_load(f32_path, TLM_LOAD_BF16 | TLM_LOAD_WRITABLE, &bad) == TLM_ERR_ARG &&
              !bad && strstr(tlm_last_error(), "writable"),
          "BF16 with WRITABLE refused: %s", tlm_last_error());
    CHECK(tlm_model_load(f32_path, TLM_LOAD_READ | TLM_LOAD_WRITABLE, &bad) == TLM_ERR_ARG &&
              !bad && strstr(tlm_last_error(), "TLM_LOAD_READ"),
          "READ with WRITABLE refused: %s", tlm_last_error());
    CHECK(tlm_model_load(f32_path, TLM_LOAD_BF16 | TLM_LOAD_FP32, &bad) == TLM_ERR_ARG && !bad,
          "BF16 with FP32 refused");
    if (!r || !b || !e || !w) goto done;
    const tlm_config *c = tlm_model_config(r);
    int n = 0, bf16 = 0, f32 = 0, same = 1;
    const tlm_tensor_info *ti = tlm_model_tensors(r, &n);
    for (int i = 0; i < n; i++) {
        const tlm_weight *x = tlm_model_weight(r, i), *y = tlm_model_weight(b, i);
        if (ti[i].ndim != 2) continue;
        bf16 += x->dtype == TLM_DTYPE_BF16;
        f32 += tlm_model_weight(e, i)->dtype == TLM_DTYPE_F32;
        for (size_t k = 0; k < (size_t)x->rows && same; k++)
            same = !memcmp((const char *)x->data + k * x->row_bytes,
                           (const char *)y->data + k * y->row_bytes, (size_t)x->cols * 2);
    }
    int mats = (c->tie_embeddings ? 1 : 2) + 7 * c->n_layers;
    CHECK(bf16 == mats && f32 == mats, "retyped matrices: %d BF16, %d F32 of %d", bf16, f32, mats);
    CHECK(same, "F32 rounded at load = the BF16 file's bytes");
    size_t mapped = 0, owned = 0;
    tlm_model_memory(r, &mapped, &owned);
    CHECK(owned >= (size_t)mats * 2 && mapped < owned / 10, "BF16 copies owned: %zu, mapped %zu",
          owned, mapped);
    int V = c->vocab_size, T = 16;
    int32_t ids[24];
    for (int i = 0; i < 24; i++) ids[i] = (int32_t)((i * 37 + 11) % V);
    tlm_forward_out fr, fb, fe, fw;
    CHECK_OK(t_forward(r, ids, 1, T, NULL, &fr));
    CHECK_OK(t_forward(b, ids, 1, T, NULL, &fb));
    CHECK(!memcmp(fr.logits, fb.logits, sizeof(float) * T * V), "BF16 load = BF16 file (prefill)");
    CHECK_OK(t_forward(e, ids, 1, T, NULL, &fe));
    CHECK_OK(t_forward(w, ids, 1, T, NULL, &fw));
    double big = max_abs(fw.logits, (size_t)T * V);
    double d = max_diff(fe.logits, fw.logits, (size_t)T * V);
    CHECK(d <= 1e-5 * big, "FP32 load of BF16 = widened copy: %g (of %g)", d, big);
    float *x1 = malloc(sizeof(float) * 4 * V), *x2 = malloc(sizeof(float) * 4 * V);
    run_decode(r, ids, T, 4, x1);
    run_decode(b, ids, T, 4, x2);
    CHECK(!memcmp(x1, x2, sizeof(float) * 4 * V), "BF16 load = BF16 file (decode)");
    free(x1);
    free(x2);
done:
    tlm_model_free(r);
    tlm_model_free(b);
    tlm_model_free(e);
    tlm_model_free(w);
    remove(bf);
}

/* A random 2-layer model (vocabulary 300, d_ff 512, d and the heads as given) saved as F32 GGUF. */
static int random_model(const char *path, int d, int heads, int kv_heads, uint64_t seed) {
    tlm_config c;
    tlm_config_defaults(&c);
    c.vocab_size = 300;
    c.context_length = 64;
    c.d_model = d;
    c.n_layers = 2;
    c.n_heads = heads;
    c.n_kv_heads = kv_heads;
    c.d_ff = 512;
    tlm_model *m = NULL;
    CHECK_OK(tlm_model_new(&c, &m));
    if (!m) return 0;
    CHECK_OK(tlm_model_init(m, seed, TLM_INIT_XAVIER));
    CHECK_OK(tlm_model_save_gguf(m, NULL, path, TLM_DTYPE_F32));
    tlm_model_free(m);
    return 1;
}

/* A random model whose matrices all have rows of whole 256-blocks. */
static void test_types(void) {
    if (!random_model("qk_model_f32.gguf", 256, 4, 2, 7)) return;
    const tlm_dtype types[] = {TLM_DTYPE_F16,    TLM_DTYPE_BF16,  TLM_DTYPE_Q8_0, TLM_DTYPE_Q4_0,
                               TLM_DTYPE_Q4_1,   TLM_DTYPE_Q5_0,  TLM_DTYPE_Q5_1, TLM_DTYPE_Q2_K,
                               TLM_DTYPE_Q3_K,   TLM_DTYPE_Q4_K,  TLM_DTYPE_Q5_K, TLM_DTYPE_Q6_K,
                               TLM_DTYPE_IQ4_NL, TLM_DTYPE_IQ4_XS};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        check_type("qk_model_f32.gguf", types[i]);
    check_precision("qk_model_f32.gguf");
    remove("qk_model_f32.gguf");
}

/* Decode steps with the q|k|v product and attention in one job per layer (block.c's qkv_attend)
 * give the logits of the two apart bit for bit: F32 and block-type weights, grouped-query heads (8
 * q heads on 4 kv heads), two threads, one sequence and several decoded together. */
static void decode_both(const tlm_model *m, int B, int steps, float *out) {
    tlm_session *s = NULL;
    CHECK_OK(tlm_session_new(m, &(tlm_session_opts){.batch = B, .capacity = 64}, &s));
    if (!s) return;
    int V = tlm_model_config(m)->vocab_size;
    int32_t ids[4];
    for (int k = 0; k < steps; k++) {
        for (int b = 0; b < B; b++) ids[b] = (int32_t)((k * 31 + b * 7 + 3) % V);
        CHECK_OK(tlm_session_decode(s, ids, NULL, out + (size_t)k * B * V));
    }
    tlm_session_free(s);
}

static void test_fused_attend(void) {
    /* q|k|v 1024 x 512: shared among threads on any CPU (matvec.c) */
    if (!random_model("qk_fused_f32.gguf", 512, 8, 4, 11)) return;
    int V = 300, layers = 2;
    const tlm_dtype types[] = {TLM_DTYPE_F32, TLM_DTYPE_Q4_0, TLM_DTYPE_Q6_K};
    for (int i = 0; i < 3; i++) {
        char path[64];
        snprintf(path, sizeof path, "qk_fused_%s.gguf", tlm_dtype_name(types[i]));
        if (types[i] != TLM_DTYPE_F32)
            CHECK(quantize_file("qk_fused_f32.gguf", path, types[i]), "%s written", path);
        tlm_model *q = NULL;
        CHECK_OK(tlm_model_load(types[i] == TLM_DTYPE_F32 ? "qk_fused_f32.gguf" : path, 0, &q));
        if (!q) continue;
        /* F32 rows go to the matrix-vector path up to two at a time (linear.c) */
        int Bs[2] = {1, types[i] == TLM_DTYPE_F32 ? 2 : 3};
        for (int bi = 0; bi < 2; bi++) {
            int B = Bs[bi];
            int steps = 9;
            size_t n = (size_t)steps * B * V;
            float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
            long runs = mdl_block_fused_runs();
            decode_both(q, B, steps, a);
            /* a team of one (OMP_THREAD_LIMIT=1, as make tsan runs) keeps them apart */
            long want = omp_get_max_threads() >= 2 ? (long)steps * layers : 0;
            CHECK(mdl_block_fused_runs() - runs == want, "%s B=%d: %ld fused layers of %ld", path,
                  B, mdl_block_fused_runs() - runs, want);
            mdl_block_fuse_attend(0);
            decode_both(q, B, steps, b);
            mdl_block_fuse_attend(1);
            CHECK(!memcmp(a, b, n * sizeof(float)), "%s B=%d: fused decode = apart", path, B);
            free(a);
            free(b);
        }
        tlm_model_free(q);
        if (types[i] != TLM_DTYPE_F32) remove(path);
    }
    remove("qk_fused_f32.gguf");
}

/* stories260K in Q8_0: tlm's greedy continuation (prefill, then decode steps) is llama.cpp's. */
static void test_stories_q8_0(const char *dir) {
    const char *q8 = t_path(t_out_dir(), "qk_stories260K_q8_0.gguf"); /* node reads it elsewhere */
    CHECK(quantize_file(t_path(dir, "models/stories260K.gguf"), q8, TLM_DTYPE_Q8_0),
          "stories260K quantized");
    tlm_model *m = NULL;
    CHECK_OK(tlm_model_load(q8, 0, &m));
    if (!m) return;
    int V = tlm_model_config(m)->vocab_size;
    int32_t prompt[] = {1, 403, 407, 261, 378, 300};
    int np = 6, n = 24;
    tlm_session *s = NULL;
    CHECK_OK(tlm_session_new(m, &(tlm_session_opts){.batch = 1, .capacity = 64}, &s));
    float *logits = malloc(sizeof(float) * V);
    char want[512] = "{\"ids\":[", idstr[128] = "";
    if (s) {
        CHECK_OK(tlm_session_prefill(s, 0, prompt, np, logits, 0));
        for (int k = 0; k < n; k++) {
            int best = 0;
            for (int v = 1; v < V; v++)
                if (logits[v] > logits[best]) best = v;
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s%d", k ? "," : "", best);
            if (k + 1 < n) CHECK_OK(tlm_session_decode_one(s, best, logits));
        }
    }
    for (int i = 0; i < np; i++)
        snprintf(idstr + strlen(idstr), sizeof idstr - strlen(idstr), "%d ", prompt[i]);
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "cd %s && NODE_LLAMA_CPP_SKIP_DOWNLOAD=true node llama_greedy.mjs %s \"%s\" %d 2>&1",
             NODE_DIR, q8, idstr, n);
    FILE *f = popen(cmd, "r");
    char out[8192] = "";
    size_t got = f ? fread(out, 1, sizeof out - 1, f) : 0;
    out[got] = 0;
    if (f) pclose(f);
    strcat(want, "]");
    CHECK(strstr(out, want) != NULL, "llama.cpp: %s\ntlm:       %s", out, want);
    printf("stories260K Q8_0 greedy, tlm: %s\n", want);
    free(logits);
    tlm_session_free(s);
    tlm_model_free(m);
    remove(q8);
}

int main(void) {
    tlm_threads_set(2);
    struct stat st;
    if (stat(GGML_LIB, &st) != 0) {
        CHECK(0, "node-llama-cpp is not installed (%s): run bash scripts/setup.sh", GGML_LIB);
        return t_finish("test_qk_models");
    }
    void *lib = dlopen(GGML_LIB, RTLD_NOW | RTLD_LOCAL);
    CHECK(lib != NULL, "dlopen %s: %s", GGML_LIB, dlerror());
    if (!lib) return t_finish("test_qk_models");
    *(void **)&quantize_chunk = dlsym(lib, "ggml_quantize_chunk");
    CHECK(quantize_chunk != NULL, "ggml_quantize_chunk in %s", GGML_LIB);
    if (quantize_chunk) {
        test_types();
        test_fused_attend();
        const char *dir = t_require_shared_data();
        if (dir) test_stories_q8_0(dir);
    }
    dlclose(lib);
    return t_finish("test_qk_models");
}
