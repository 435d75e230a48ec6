/* GGUF: the real stories260K.gguf gives the same logits as stories260K.bin, the F16
 * llama-2-tiny-random.gguf loads with its 32000-token vocabulary, tlm's writer round-trips
 * (F32 exactly, F16/BF16 within rounding, half-pairing models through the q/k permutation), Q8_0
 * dequantizes, malformed files fail with clear errors, and llama.cpp (node-llama-cpp) continues
 * a tlm-written BPE model exactly like tlm does. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/core.h"
#include "core/dtype.h"
#include "core/half.h"
#include "formats/formats.h"
#include "harness.h"
#include "model/model.h"
#include "tlm.h"

static double logits_diff(tlm_model *a, tlm_model *b, const int32_t *ids, int T) {
    int V = tlm_model_config(a)->vocab_size;
    tlm_forward_out fa, fb;
    if (t_forward(a, ids, 1, T, NULL, &fa)) return 1e30;
    float *la = malloc(sizeof(float) * (size_t)T * V);
    memcpy(la, fa.logits, sizeof(float) * (size_t)T * V);
    if (t_forward(b, ids, 1, T, NULL, &fb)) return 1e30;
    double m = 0;
    for (size_t i = 0; i < (size_t)T * V; i++) m = fmax(m, fabs(la[i] - fb.logits[i]));
    free(la);
    return m;
}

static void test_stories(const char *dir) {
    tlm_model *g = NULL, *b = NULL;
    CHECK_OK(tlm_model_load(t_path(dir, "models/stories260K.gguf"), 0, &g));
    CHECK_OK(tlm_model_load(t_path(dir, "models/stories260K.bin"), 0, &b));
    if (!g || !b) goto done;
    const tlm_config *c = tlm_model_config(g);
    CHECK(c->d_model == 64 && c->n_layers == 5 && c->n_heads == 8 && c->n_kv_heads == 4 &&
              c->d_ff == 172 && c->vocab_size == 512,
          "config");
    CHECK(c->context_length == 2048 && !c->tie_embeddings, "ctx %d tie %d", c->context_length,
          c->tie_embeddings);
    CHECK(c->rope_pairing == TLM_ROPE_INTERLEAVED && fabsf(c->norm_eps - 1e-5f) < 1e-9f,
          "pairing/eps");
    /* The separate output.weight of the GGUF equals the .bin's shared embedding. */
    const tlm_tensor_info *o = tlm_model_find(g, "output.weight");
    const tlm_tensor_info *e = tlm_model_find(b, "token_embd.weight");
    float *fg = t_flat(g), *fb = t_flat(b);
    CHECK(o && e && !memcmp(fg + o->offset, fb + e->offset, e->numel * sizeof(float)),
          "output.weight == .bin embedding");
    free(fb);
    int32_t ids[64];
    for (int i = 0; i < 64; i++) ids[i] = (int32_t)((i * 37 + 1) % 512);
    double d = logits_diff(g, b, ids, 64);
    /* The same weights, but the .bin lays q, k and v of a layer apart (all layers' q first), the
     * GGUF back to back: used in place, one is three products and the other one stacked product,
     * which sgemm may sum in another order. */
    CHECK(d <= 1e-4, ".gguf vs .bin logits differ by %g", d);

    /* Writer round trips. */
    CHECK_OK(tlm_model_save_gguf(g, NULL, "rt32.gguf", TLM_DTYPE_F32));
    tlm_model *r = NULL;
    CHECK_OK(tlm_model_load("rt32.gguf", 0, &r));
    if (r) {
        float *fr = t_flat(r);
        CHECK(tlm_model_num_params(r) == tlm_model_num_params(g) &&
                  !memcmp(fr, fg, tlm_model_num_params(g) * sizeof(float)),
              "F32 round trip not exact");
        free(fr);
        CHECK(tlm_model_config(r)->context_length == 2048, "context kept");
        tlm_model_free(r);
    }
    for (int dt = TLM_DTYPE_F16; dt <= TLM_DTYPE_BF16; dt++) {
        CHECK_OK(tlm_model_save_gguf(g, NULL, "rt16.gguf", (tlm_dtype)dt));
        CHECK_OK(tlm_model_load("rt16.gguf", 0, &r));
        if (!r) continue;
        const float *a = fg;
        float *q = t_flat(r);
        int bad = 0;
        for (size_t i = 0; i < tlm_model_num_params(g); i++) {
            float want = dt == TLM_DTYPE_F16 ? core_f16_to_f32(core_f32_to_f16(a[i]))
                                             : core_bf16_to_f32(core_f32_to_bf16(a[i]));
            /* norms (vectors) stay F32 */
            if (q[i] != want && q[i] != a[i]) bad++;
        }
        CHECK(bad == 0, "dtype %d: %d values not rounded as expected", dt, bad);
        free(q);
        tlm_model_free(r);
        r = NULL;
    }
    struct stat st;
    CHECK(stat("rt16.gguf", &st) == 0 && st.st_size < 600000, "bf16 file is half size");
    free(fg);
done:
    tlm_model_free(g);
    tlm_model_free(b);
    remove("rt32.gguf");
    remove("rt16.gguf");
}

static void test_tiny_random(const char *dir) {
    tlm_model *m = NULL;
    const char *p = t_path(dir, "models/llama-2-tiny-random.gguf");
    CHECK_OK(tlm_model_load(p, 0, &m));
    if (!m) return;
    const tlm_config *c = tlm_model_config(m);
    CHECK(c->vocab_size == 32000 && c->d_model == 8 && c->n_layers == 1 && c->n_heads == 2 &&
              c->d_ff == 32,
          "tiny config %d %d %d %d %d", c->vocab_size, c->d_model, c->n_layers, c->n_heads,
          c->d_ff);
    int32_t ids[4] = {1, 15043, 29892, 3186};
    tlm_model *bad = NULL;
    CHECK(tlm_model_load(p, 0x80, &bad) == TLM_ERR_ARG && !bad, "unknown load flags refused");
    tlm_forward_out fo;
    CHECK_OK(t_forward(m, ids, 1, 4, NULL, &fo));
    int finite = 1;
    for (int i = 0; i < 4 * 32000; i++) finite &= isfinite(fo.logits[i]);
    CHECK(finite, "finite logits");
    /* Every F16 matrix is used in place in its own type (the embedding one row widened per token,
     * the others through the F16 kernels); norms are F32. The logits of an all-F32 writable copy,
     * up to the order of the sums. */
    const tlm_tensor_info *e = tlm_model_find(m, "token_embd.weight");
    const tlm_weight *ew = tlm_model_weight(m, (int)(e - tlm_model_tensors(m, NULL)));
    CHECK(ew->dtype == TLM_DTYPE_F16 && ew->row_bytes == 16, "embedding view %s, %zu bytes a row",
          tlm_dtype_name(ew->dtype), ew->row_bytes);
    size_t mapped = 0, owned = 0;
    tlm_model_memory(m, &mapped, &owned);
    CHECK(mapped == 2 * 32000 * 8 * 2 + 3 * 8 * 4 + (4 * 8 * 8 + 3 * 8 * 32) * 2 && owned <= 65536,
          "mapped %zu, owned %zu bytes (F16 matrices, F32 norms; RoPE tables owned)", mapped,
          owned);
    tlm_model *w = NULL;
    CHECK_OK(tlm_model_load(p, TLM_LOAD_WRITABLE, &w));
    if (w) {
        float *a = malloc(sizeof(float) * 4 * 32000);
        memcpy(a, fo.logits, sizeof(float) * 4 * 32000);
        tlm_forward_out fw;
        CHECK_OK(t_forward(w, ids, 1, 4, NULL, &fw));
        double worst = 0, big = 0;
        for (int i = 0; i < 4 * 32000; i++) {
            worst = fmax(worst, fabs(a[i] - fw.logits[i]));
            big = fmax(big, fabs(fw.logits[i]));
        }
        CHECK(worst <= 1e-5 * big, "F16 in place differs from the widened copy by %g (of %g)",
              worst, big);
        CHECK(tlm_model_weight(w, 0)->dtype == TLM_DTYPE_F32, "writable copy is F32");
        /* What only a writable or all-F32 model can do is refused on the mapped one. */
        CHECK(tlm_model_params(m) == NULL && tlm_model_params(w) != NULL, "params");
        CHECK(tlm_model_init(m, 1, TLM_INIT_XAVIER) == TLM_ERR_ARG &&
                  strstr(tlm_last_error(), "read-only"),
              "init of a mapped model: %s", tlm_last_error());
        tlm_train_ctx *x = NULL;
        CHECK_OK(tlm_train_ctx_new(m, &x));
        float *g = malloc(tlm_model_num_params(m) * sizeof(float)), loss;
        int32_t tg[4] = {2, 3, 4, 5};
        CHECK(x &&
                  tlm_train_ctx_forward_backward(x, ids, tg, 1, 4, 0, g, 0, &loss) ==
                      TLM_ERR_UNSUPPORTED &&
                  strstr(tlm_last_error(), "F32"),
              "gradients of an F16 embedding: %s", tlm_last_error());
        free(g);
        tlm_train_ctx_free(x);
        tlm_train_opts o;
        tlm_train_opts_defaults(&o);
        tlm_trainer *tr = NULL;
        CHECK(tlm_trainer_new(m, NULL, &o, &tr) == TLM_ERR_ARG && !tr &&
                  strstr(tlm_last_error(), "read-only"),
              "training a mapped model: %s", tlm_last_error());
        free(a);
        tlm_model_free(w);
    }
    tlm_tokenizer *t = NULL;
    if (tlm_tokenizer_load(p, &t) == TLM_OK) {
        CHECK(tlm_tokenizer_vocab_size(t) == 32000, "vocab");
        tlm_tokenizer_free(t);
    }
    tlm_model_free(m);
}

/* A half-pairing model (tlm's default) goes to GGUF with q/k rows in adjacent-pair order. */
static void test_half_roundtrip(void) {
    tlm_config c;
    tlm_config_defaults(&c);
    c.vocab_size = 50;
    c.context_length = 16;
    c.d_model = 32;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.d_ff = 64;
    c.rope_theta = 5000.0f;
    c.norm_eps = 1e-6f;
    tlm_model *r = NULL, *m = t_model(&c, 11, TLM_INIT_XAVIER);
    CHECK_OK(tlm_model_save_gguf(m, NULL, "half.gguf", TLM_DTYPE_F32));
    CHECK_OK(tlm_model_load("half.gguf", 0, &r));
    if (r) {
        const tlm_config *rc = tlm_model_config(r);
        CHECK(rc->rope_theta == 5000.0f && rc->norm_eps == 1e-6f && rc->tie_embeddings,
              "theta/eps/tie");
        int32_t ids[16] = {0, 1, 2, 3, 49, 48, 47, 5, 5, 5, 9, 20, 30, 40, 11, 12};
        double d = logits_diff(m, r, ids, 16);
        CHECK(d < 1e-4, "half -> gguf logits differ by %g", d);
        tlm_model_free(r);
    }
    /* Non-Llama models are refused with the reason. */
    tlm_model_free(m);
    c.norm = TLM_NORM_LAYERNORM;
    CHECK_OK(tlm_model_new(&c, &m));
    CHECK(tlm_model_save_gguf(m, NULL, "half.gguf", TLM_DTYPE_F32) == TLM_ERR_UNSUPPORTED &&
              strstr(tlm_last_error(), "rmsnorm"),
          "%s", tlm_last_error());
    tlm_model_free(m);
    remove("half.gguf");
}

static void test_q8_0(void) {
    uint8_t blk[2 * 34];
    uint16_t d0 = core_f32_to_f16(0.5f), d1 = core_f32_to_f16(-0.25f);
    blk[0] = (uint8_t)d0;
    blk[1] = (uint8_t)(d0 >> 8);
    blk[34] = (uint8_t)d1;
    blk[35] = (uint8_t)(d1 >> 8);
    for (int i = 0; i < 32; i++) {
        blk[2 + i] = (uint8_t)(int8_t)(i - 16);
        blk[36 + i] = (uint8_t)(int8_t)(127 - i);
    }
    io_gguf_tensor t;
    memset(&t, 0, sizeof t);
    t.name = "q";
    t.type = 8;
    t.n_dims = 1;
    t.dims[0] = 64;
    t.n_elements = 64;
    t.n_bytes = 68;
    t.data = blk;
    float out[64];
    tlm_dtype dt;
    CHECK(core_dtype_from_ggml(t.type, &dt) && dt == TLM_DTYPE_Q8_0, "ggml type 8 is Q8_0");
    CHECK_OK(core_dtype_to_f32(dt, t.data, out, 64));
    CHECK(out[0] == -8.0f && out[31] == 7.5f && out[32] == -31.75f && out[63] == -24.0f,
          "q8_0 %g %g %g %g", out[0], out[31], out[32], out[63]);
}

/* Replaces the u32 value of key `k` in a GGUF image. */
static int patch_u32(uint8_t *p, size_t n, const char *k, uint32_t v) {
    size_t kl = strlen(k);
    for (size_t i = 8; i + kl + 8 <= n; i++)
        if (!memcmp(p + i, k, kl) && p[i - 8] == kl) {
            memcpy(p + i + kl + 4, &v, 4);
            return 1;
        }
    return 0;
}

static void expect_bad_mem(const uint8_t *p, size_t n, const char *needle) {
    io_gguf *g = NULL;
    tlm_model *m = NULL;
    tlm_status s = io_gguf_open_memory(p, n, "mem.gguf", &g);
    if (!s) s = fmt_gguf_load_model(g, "mem.gguf", 0, &m);
    CHECK(s != TLM_OK && !m, "accepted a bad GGUF (%s)", needle);
    CHECK_ERROR_HAS(needle);
    tlm_model_free(m);
    io_gguf_close(g);
}

static void test_malformed(const char *dir) {
    char *data;
    size_t n;
    if (core_read_file(t_path(dir, "models/stories260K.gguf"), &data, &n)) return;
    uint8_t *p = (uint8_t *)data;
    /* Truncation anywhere is an error, never a crash. */
    size_t cuts[] = {3, 8, 20, 100, 5000, 20000, n / 2, n - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof *cuts; i++) {
        io_gguf *g = NULL;
        tlm_model *m = NULL;
        tlm_status s = io_gguf_open_memory(p, cuts[i], "cut.gguf", &g);
        if (!s) s = fmt_gguf_load_model(g, "cut.gguf", 0, &m);
        CHECK(s != TLM_OK, "truncated to %zu accepted", cuts[i]);
        tlm_model_free(m);
        io_gguf_close(g);
    }
    uint8_t *q = malloc(n);
    memcpy(q, p, n);
    CHECK(patch_u32(q, n, "llama.block_count", 100000), "patch");
    expect_bad_mem(q, n, "block_count");
    memcpy(q, p, n);
    patch_u32(q, n, "llama.block_count", 6); /* more layers than tensors */
    expect_bad_mem(q, n, "missing tensor 'blk.5.attn_norm.weight'");
    memcpy(q, p, n);
    patch_u32(q, n, "llama.embedding_length", 32);
    patch_u32(q, n, "llama.rope.dimension_count", 4);
    expect_bad_mem(q, n, "has ggml dims [64, 512]");
    memcpy(q, p, n);
    patch_u32(q, n, "llama.attention.head_count_kv", 3);
    expect_bad_mem(q, n, "n_kv_heads");
    memcpy(q, p, n);
    patch_u32(q, n, "llama.rope.dimension_count", 4);
    expect_bad_mem(q, n, "partial RoPE");
    memcpy(q, p, n);
    q[4] = 9;
    expect_bad_mem(q, n, "version 9");
    /* A tensor type the loader has no kernels or widening for is refused, naming it: the u32
     * type follows the name, n_dims and two u64 dims in token_embd.weight's tensor info. */
    memcpy(q, p, n);
    const char *tn = "token_embd.weight";
    for (size_t i = 8; i + strlen(tn) + 24 <= n; i++)
        if (!memcmp(q + i, tn, strlen(tn)) && q[i - 8] == strlen(tn)) {
            uint32_t mxfp4 = 39;
            memcpy(q + i + strlen(tn) + 4 + 16, &mxfp4, 4);
            break;
        }
    expect_bad_mem(q, n, "unsupported tensor type: tensor 'token_embd.weight' is MXFP4; supported");
    free(q);
    free(data);
}

/* Gemma 2's layout as arch gemma2: the same logits back over a context longer than the window;
 * what llama.cpp's gemma2 cannot hold is refused on writing, and bad keys on reading, by name. */
static void test_gemma2(void) {
    tlm_config c;
    tlm_config_defaults(&c);
    c.vocab_size = 50;
    c.context_length = 24;
    c.d_model = 32;
    c.n_layers = 3;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.d_ff = 48;
    c.ffn = TLM_FFN_GEGLU;
    c.post_norms = 1;
    c.embed_scale = sqrtf(32.0f);
    c.attn_softcap = 1.5f;
    c.final_softcap = 2.5f;
    c.sliding_window = 5;
    c.sliding_window_pattern = 3;
    c.rope_pairing = TLM_ROPE_INTERLEAVED; /* gemma2 rotates halves: the writer reorders */
    CHECK_OK(tlm_config_finalize(&c));
    tlm_model *r = NULL, *m = t_model(&c, 5, TLM_INIT_XAVIER);
    int32_t ids[24];
    for (int i = 0; i < 24; i++) ids[i] = (i * 7 + 3) % 50;
    CHECK_OK(tlm_model_save_gguf(m, NULL, "gemma2.gguf", TLM_DTYPE_F32));
    CHECK_OK(tlm_model_load("gemma2.gguf", 0, &r));
    if (r) {
        const tlm_config *rc = tlm_model_config(r);
        CHECK(rc->sliding_window == 5 && rc->sliding_window_pattern == 3 && rc->post_norms &&
                  rc->ffn == TLM_FFN_GEGLU && rc->attn_softcap == 1.5f &&
                  rc->final_softcap == 2.5f && rc->embed_scale == sqrtf(32.0f) &&
                  rc->rope_pairing == TLM_ROPE_HALF && rc->tie_embeddings,
              "gemma2 config back: window %d/%d", rc->sliding_window, rc->sliding_window_pattern);
        double d = logits_diff(m, r, ids, 24);
        CHECK(d < 1e-4, "gemma2 -> gguf logits differ by %g", d);
        tlm_model_free(r);
    }
    char *data;
    size_t n;
    if (!core_read_file("gemma2.gguf", &data, &n)) {
        uint8_t *q = (uint8_t *)data;
        CHECK(patch_u32(q, n, "gemma2.attention.key_length", 16), "patch key_length");
        expect_bad_mem(q, n, "attention key/value length 16/8");
        patch_u32(q, n, "gemma2.attention.key_length", 8);
        patch_u32(q, n, "gemma2.attention.sliding_window", 0);
        expect_bad_mem(q, n, "sliding window 0");
        free(data);
    }
    remove("gemma2.gguf");
    /* llama.cpp's gemma2 always caps, scales embeddings by sqrt(d_model) and scores by
     * 1 / sqrt(head_dim) */
    static const char *const why[] = {"final_softcap is 0", "embed_scale is not sqrt(d_model)",
                                      "attn_scale is not 1 / sqrt(head_dim)"};
    for (int i = 0; i < 3; i++) {
        tlm_config b = c;
        if (i == 0)
            b.final_softcap = 0.0f;
        else if (i == 1)
            b.embed_scale = 0.3f;
        else
            b.attn_scale = 0.3f;
        tlm_model *x = t_model(&b, 5, TLM_INIT_XAVIER);
        CHECK(tlm_model_save_gguf(x, NULL, "gemma2_bad.gguf", TLM_DTYPE_F32) ==
                      TLM_ERR_UNSUPPORTED &&
                  strstr(tlm_last_error(), "GGUF export as gemma2: ") &&
                  strstr(tlm_last_error(), why[i]),
              "%s: %s", why[i], tlm_last_error());
        tlm_model_free(x);
    }
    tlm_model_free(m);
    remove("gemma2_bad.gguf");
}

/* tlm's greedy continuation of seq[0 .. np) to total tokens, by full forward passes. */
static void greedy(const tlm_model *m, int32_t *seq, int np, int total) {
    int V = tlm_model_config(m)->vocab_size;
    for (int t = np; t < total; t++) {
        tlm_forward_out fo;
        CHECK_OK(t_forward(m, seq, 1, t, NULL, &fo));
        const float *row = fo.logits + (size_t)(t - 1) * V;
        int best = 0;
        for (int v = 1; v < V; v++)
            if (row[v] > row[best]) best = v;
        seq[t] = best;
    }
}

/* The same continuation by a session: prefill, then decode steps from the KV cache (the
 * matrix-vector path, its fused q|k|v products with their biases). */
static void greedy_session(const tlm_model *m, int32_t *seq, int np, int total) {
    int V = tlm_model_config(m)->vocab_size;
    tlm_session *s = NULL;
    float *logits = malloc(sizeof(float) * (size_t)V);
    CHECK_OK(tlm_session_new(m, NULL, &s));
    if (!s || !logits) {
        free(logits);
        tlm_session_free(s);
        return;
    }
    CHECK_OK(tlm_session_prefill(s, 0, seq, np, logits, 0));
    for (int t = np; t < total; t++) {
        int best = 0;
        for (int v = 1; v < V; v++)
            if (logits[v] > logits[best]) best = v;
        seq[t] = best;
        if (t + 1 < total) CHECK_OK(tlm_session_decode_one(s, best, logits));
    }
    free(logits);
    tlm_session_free(s);
}

/* llama.cpp continues a tlm-written BPE model exactly like tlm (greedy). With rope: the model
 * scales RoPE's frequencies (Llama 3.1's rope_freqs.weight, factors from 0.5 to 8), which the
 * file carries, llama.cpp applies and tlm reads back; without them the continuation differs.
 * With qwen2: biases on q, k and v (random, so that they matter) and RoPE on halves, written as
 * arch qwen2, which llama.cpp runs as its own Qwen2 and tlm reads back. */
static void test_llamacpp_bpe(int rope, int qwen2) {
    const char *node_dir = TLM_SOURCE_DIR "/tests/node/node_modules/node-llama-cpp";
    struct stat st;
    if (stat(node_dir, &st) != 0) {
        CHECK(0, "node-llama-cpp is not installed at %s: run bash scripts/setup.sh", node_dir);
        return;
    }
    const char *text =
        "the cat sat on the mat. the dog sat on the log. a cat and a dog met on a mat by a log. "
        "once upon a time there was a cat who liked to sit on the warm mat in the sun.";
    size_t len = strlen(text);
    const char *specials[] = {"<|endoftext|>"};
    tlm_bpe_train_opts bo;
    memset(&bo, 0, sizeof bo);
    bo.vocab_size = 300;
    bo.specials = specials;
    bo.n_specials = 1;
    bo.threads = 1;
    tlm_tokenizer *tok = NULL;
    CHECK_OK(tlm_tokenizer_train_bpe_texts(&text, &len, 1, &bo, &tok));
    if (!tok) return;
    tlm_config c;
    tlm_config_defaults(&c);
    c.vocab_size = tlm_tokenizer_vocab_size(tok);
    c.context_length = 64;
    c.d_model = 64;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.d_ff = 128;
    if (qwen2) {
        c.qkv_bias = 1;
        c.rope_pairing = TLM_ROPE_HALF;
        c.rope_theta = 1000000.0f;
    }
    tlm_model *m = t_model(&c, 5, TLM_INIT_XAVIER);
    int nt = 0;
    const tlm_tensor_info *ti = tlm_model_tensors(m, &nt);
    for (int i = 0; qwen2 && i < nt; i++)
        if (strstr(ti[i].name, ".bias")) {
            float *b = (float *)(uintptr_t)tlm_model_weight(m, i)->data;
            for (size_t j = 0; j < ti[i].numel; j++)
                b[j] = (float)((j * 7919 + (size_t)i * 31) % 23) / 11.0f - 1.0f;
        }
    int32_t *ids = NULL;
    size_t np = 0;
    CHECK_OK(tlm_tokenizer_encode(tok, "the cat sat", 11, 0, &ids, &np));
    int total = (int)np + 20;
    int32_t seq[64], plain[64];
    memcpy(seq, ids, np * sizeof(int32_t));
    memcpy(plain, ids, np * sizeof(int32_t));
    const char *file = rope ? "bpe_rope.gguf" : qwen2 ? "bpe_qwen2.gguf" : "bpe.gguf";
    if (rope || qwen2) {
        /* larger weights: a continuation that moves (at init scale it repeats one token, which
         * no RoPE change would alter) */
        float *w = tlm_model_params(m);
        for (size_t i = 0; i < tlm_model_num_params(m); i++) w[i] *= qwen2 ? 2.5f : 3.0f;
    }
    if (rope) {
        static const float f[8] = {1, 1, 1.5f, 2, 4, 8, 8, 0.5f};
        greedy(m, plain, (int)np, total);
        CHECK_OK(mdl_set_rope_factors(m, f, 8));
        CHECK(mdl_set_rope_factors(m, f, 7) == TLM_ERR_FORMAT, "7 factors for 8 pairs");
    }
    CHECK_OK(tlm_model_save_gguf(m, tok, file, TLM_DTYPE_F32));
    greedy(m, seq, (int)np, total);
    if (rope || qwen2) {
        /* tlm reads the file back and continues as before, by full passes and from the KV cache */
        tlm_model *back = NULL;
        CHECK_OK(tlm_model_load(file, 0, &back));
        int32_t again[64], cached[64];
        memcpy(again, ids, np * sizeof(int32_t));
        memcpy(cached, ids, np * sizeof(int32_t));
        if (back) {
            greedy(back, again, (int)np, total);
            greedy_session(back, cached, (int)np, total);
        }
        const tlm_config *bc = back ? tlm_model_config(back) : NULL;
        int kept = rope ? back && back->rope_factors
                        : bc && bc->qkv_bias && bc->rope_pairing == TLM_ROPE_HALF;
        CHECK(kept && !memcmp(again, seq, sizeof(int32_t) * (size_t)total) &&
                  !memcmp(cached, seq, sizeof(int32_t) * (size_t)total),
              "%s read back: the same continuation, by full passes and from the KV cache", file);
        tlm_model_free(back);
    }
    if (qwen2)
        CHECK(tlm_model_save_llama2c(m, "bpe_qwen2.bin", 0) == TLM_ERR_UNSUPPORTED &&
                  strstr(tlm_last_error(), "q, k and v biases"),
              "llama2.c refuses q, k, v biases: %s", tlm_last_error());
    if (rope) {
        CHECK(memcmp(seq, plain, sizeof(int32_t) * (size_t)total) != 0,
              "the factors changed nothing");
        /* a rope_freqs.weight that is not F32 is refused by name (its type patched to F16) */
        size_t fn = 0;
        uint8_t *bytes = NULL;
        CHECK_OK(core_read_file(file, (char **)&bytes, &fn));
        uint8_t *at = NULL;
        for (size_t o = 0; bytes && !at && o + 17 <= fn; o++)
            if (!memcmp(bytes + o, "rope_freqs.weight", 17)) at = bytes + o + 17;
        CHECK(at != NULL, "rope_freqs.weight in %s", file);
        if (at) {
            uint32_t f16 = 1; /* after the name: n_dims (u32), one dim (u64), then the type */
            memcpy(at + 4 + 8, &f16, 4);
            CHECK_OK(core_write_file_atomic("bpe_rope_bad.gguf", bytes, fn));
            tlm_model *bad = NULL;
            CHECK(tlm_model_load("bpe_rope_bad.gguf", 0, &bad) == TLM_ERR_FORMAT &&
                      strstr(tlm_last_error(), "rope_freqs.weight must be 8 F32 values"),
                  "a non-F32 rope_freqs.weight: %s", tlm_last_error());
            tlm_model_free(bad);
            remove("bpe_rope_bad.gguf");
        }
        free(bytes);
        CHECK(tlm_model_save_safetensors(m, "bpe_rope.safetensors") == TLM_ERR_UNSUPPORTED &&
                  strstr(tlm_last_error(), "rope_freqs"),
              "safetensors refuses the factors: %s", tlm_last_error());
    }
    char cmd[2048], idstr[512] = "";
    for (size_t i = 0; i < np; i++)
        snprintf(idstr + strlen(idstr), sizeof idstr - strlen(idstr), "%d ", seq[i]);
    snprintf(cmd, sizeof cmd,
             "cd %s/tests/node && NODE_LLAMA_CPP_SKIP_DOWNLOAD=true node llama_greedy.mjs "
             "%s/%s \"%s\" 20 --text \"the cat sat\" 2>&1",
             TLM_SOURCE_DIR, t_out_dir(), file, idstr);
    FILE *f = popen(cmd, "r");
    char out[8192] = "";
    size_t got = f ? fread(out, 1, sizeof out - 1, f) : 0;
    out[got] = 0;
    if (f) pclose(f);
    /* llama.cpp stops at an end-of-generation token (<|endoftext|>): up to there */
    char want[1024] = "{\"ids\":[";
    int t = (int)np;
    for (; t < total && !tlm_tokenizer_is_special(tok, seq[t]); t++)
        snprintf(want + strlen(want), sizeof want - strlen(want), "%s%d", t > (int)np ? "," : "",
                 seq[t]);
    snprintf(want + strlen(want), sizeof want - strlen(want), "]");
    CHECK(t - (int)np >= 12 && strstr(out, want) != NULL, "llama.cpp: %s\ntlm:       %s", out,
          want);
    /* llama.cpp's tokenizer on our embedded vocabulary gives tlm's ids. */
    char pw[256] = "\"prompt_ids\":[";
    for (size_t i = 0; i < np; i++)
        snprintf(pw + strlen(pw), sizeof pw - strlen(pw), "%s%d", i ? "," : "", seq[i]);
    CHECK(strstr(out, pw) != NULL, "prompt ids: %s vs %s]", out, pw);
    printf("llama.cpp on a tlm-written BPE GGUF%s: %s",
           rope    ? " (rope_freqs)"
           : qwen2 ? " (arch qwen2)"
                   : "",
           out);
    free(ids);
    tlm_model_free(m);
    tlm_tokenizer_free(tok);
    remove(file);
}

int main(void) {
    tlm_threads_set(2);
    test_q8_0();
    test_half_roundtrip();
    test_gemma2();
    const char *dir = t_require_shared_data();
    if (dir) {
        test_stories(dir);
        test_tiny_random(dir);
        test_malformed(dir);
    }
    test_llamacpp_bpe(0, 0);
    test_llamacpp_bpe(1, 0);
    test_llamacpp_bpe(0, 1);
    return t_finish("test_gguf");
}
