/* Hugging Face layouts: the PyTorch reference writes LlamaForCausalLM / GPT2LMHeadModel
 * directories of random models (single file and sharded, F32/F16/BF16, tied and untied, with and
 * without the transformer. prefix); tlm loads them and matches the reference logits. tlm's HF
 * export loads back into the reference with matching logits, and into tlm bit for bit. */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "harness.h"
#include "io/safetensors.h"
#include "tlm.h"

#define SCRIPT TLM_SOURCE_DIR "/tests/reference/hf_layouts.py"

static const char *const cases[] = {"llama_tied",  "llama_sharded",  "llama31_scaled",
                                    "qwen2_tied",  "mistral_window", "gemma2_window",
                                    "gpt2_prefix", "gpt2_untied_f16"};

/* ids and logits of an expected file. */
static int read_expected(const char *path, int32_t **ids, float **logits, int *T, int *V) {
    io_st_file f;
    if (io_st_open(&f, path)) return 0;
    const io_st_tensor *ti = io_st_find(&f, "ids"), *tl = io_st_find(&f, "logits");
    *T = (int)ti->shape[0];
    *V = (int)tl->shape[1];
    *ids = malloc(sizeof(int32_t) * (size_t)*T);
    *logits = malloc(sizeof(float) * tl->numel);
    io_st_read_i32(&f, ti, *ids, (size_t)*T);
    io_st_read_f32(&f, tl, *logits, tl->numel);
    io_st_close(&f);
    return 1;
}

static double max_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - (double)b[i]));
    return m;
}

/* Exports m as HF, writes tlm's logits next to it and asks the reference to compare. */
static void export_and_check(tlm_model *m, const char *dir, const int32_t *ids, int T) {
    tlm_forward_out fo;
    CHECK_OK(t_forward(m, ids, 1, T, NULL, &fo));
    int V = tlm_model_config(m)->vocab_size;
    float *mine = malloc(sizeof(float) * (size_t)T * V);
    memcpy(mine, fo.logits, sizeof(float) * (size_t)T * V);
    CHECK_OK(tlm_model_save_hf(m, dir, TLM_DTYPE_F32));
    char exp[256], cmd[1024];
    snprintf(exp, sizeof exp, "%s.tlm_logits.safetensors", dir);
    io_st_out_tensor t[2] = {{"ids", TLM_DTYPE_I32, 1, {T}, ids},
                             {"logits", TLM_DTYPE_F32, 2, {T, V}, mine}};
    CHECK_OK(io_st_write(exp, t, 2, NULL, NULL, 0));
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s check %s %s", SCRIPT, dir, exp);
    CHECK(system(cmd) == 0, "reference rejects tlm's export %s", dir);
    /* And back into tlm: the same logits. */
    tlm_model *r = NULL;
    CHECK_OK(tlm_model_load(dir, 0, &r));
    if (r) {
        CHECK_OK(t_forward(r, ids, 1, T, NULL, &fo));
        double d = max_diff(mine, fo.logits, (size_t)T * V);
        CHECK(d < 1e-5, "%s reloaded: logits differ by %g", dir, d);
        tlm_model_free(r);
    }
    free(mine);
}

static void test_cases(void) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s write hf_layouts", SCRIPT);
    int rc = system(cmd);
    CHECK(rc == 0, "reference failed to write layouts (%d)", rc);
    if (rc) return;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char dir[256], exp[256];
        snprintf(dir, sizeof dir, "hf_layouts/%s", cases[i]);
        snprintf(exp, sizeof exp, "hf_layouts/%s.expected.safetensors", cases[i]);
        int32_t *ids = NULL;
        float *ref = NULL;
        int T = 0, V = 0;
        if (!read_expected(exp, &ids, &ref, &T, &V)) {
            CHECK(0, "cannot read expected file %s", exp);
            continue;
        }
        tlm_model_format f;
        CHECK_OK(tlm_model_detect(dir, &f));
        CHECK(f == TLM_FORMAT_HF, "%s detected as %s", dir, tlm_model_format_name(f));
        tlm_model *m = NULL;
        CHECK_OK(tlm_model_load(dir, 0, &m));
        if (!m) continue;
        CHECK(tlm_model_config(m)->vocab_size == V, "vocab");
        /* PyTorch's fp32 logits: exact products (TLM_LOAD_FP32 widens BF16 matrices); by default
         * BF16 weights meet activations rounded to BF16 (8-bit mantissas: about 2^-8 relative per
         * product), within 1% of the largest logit. */
        tlm_model *e = NULL;
        CHECK_OK(tlm_model_load(dir, TLM_LOAD_FP32, &e));
        if (!e) {
            tlm_model_free(m);
            continue;
        }
        tlm_forward_out fo;
        CHECK_OK(t_forward(e, ids, 1, T, NULL, &fo));
        double d = max_diff(ref, fo.logits, (size_t)T * V);
        CHECK(d < 2e-5, "%s: logits differ from the reference by %g", cases[i], d);
        printf("%s: max |logit diff| vs PyTorch = %.3g\n", cases[i], d);
        tlm_model_free(e);
        CHECK_OK(t_forward(m, ids, 1, T, NULL, &fo));
        double big = 0, dd = max_diff(ref, fo.logits, (size_t)T * V);
        for (size_t k = 0; k < (size_t)T * V; k++) big = fmax(big, fabs(ref[k]));
        CHECK(dd <= 0.01 * big, "%s: default products %g from the reference (largest %g)", cases[i],
              dd, big);
        /* Used in place, an untied embedding keeps the file's type (it is only looked up); the
         * writers want F32 weights and say so. A writable load widens everything. */
        int n, all_f32 = 1;
        tlm_model_tensors(m, &n);
        for (int k = 0; k < n; k++) all_f32 &= tlm_model_weight(m, k)->dtype == TLM_DTYPE_F32;
        if (!all_f32) {
            CHECK(tlm_model_save_hf(m, "hf_refused", TLM_DTYPE_F32) == TLM_ERR_UNSUPPORTED &&
                      strstr(tlm_last_error(), "writing needs F32"),
                  "%s: export of a non-F32 model: %s", cases[i], tlm_last_error());
            tlm_model_free(m);
            m = NULL;
            CHECK_OK(tlm_model_load(dir, TLM_LOAD_WRITABLE, &m));
            if (!m) continue;
        }
        char out[256];
        snprintf(out, sizeof out, "hf_export_%s", cases[i]);
        if (!strcmp(cases[i], "llama31_scaled")) {
            /* Llama 3.1's rope_scaling became per-frequency factors: HF export refuses them (it
             * would drop them), GGUF keeps them as rope_freqs.weight with the same logits */
            CHECK(tlm_model_save_hf(m, out, TLM_DTYPE_F32) == TLM_ERR_UNSUPPORTED &&
                      strstr(tlm_last_error(), "rope_freqs"),
                  "%s: HF export of rope factors: %s", cases[i], tlm_last_error());
            tlm_model *g = NULL;
            CHECK_OK(tlm_model_save_gguf(m, NULL, "hf_llama31.gguf", TLM_DTYPE_F32));
            CHECK_OK(tlm_model_load("hf_llama31.gguf", 0, &g));
            if (g) {
                float *want = malloc(sizeof(float) * (size_t)T * V);
                CHECK_OK(t_forward(m, ids, 1, T, NULL, &fo));
                if (want) memcpy(want, fo.logits, sizeof(float) * (size_t)T * V);
                CHECK_OK(t_forward(g, ids, 1, T, NULL, &fo));
                double dg = want ? max_diff(want, fo.logits, (size_t)T * V) : 1;
                CHECK(dg < 1e-5, "%s through GGUF: logits differ by %g", cases[i], dg);
                free(want);
            }
            tlm_model_free(g);
            remove("hf_llama31.gguf");
        } else {
            export_and_check(m, out, ids, T);
        }
        if (strstr(cases[i], "_window")) {
            /* GGUF keeps the window and Gemma 2's fields (its norms as 1 + w): the same logits,
             * whose reference the window changes (the context is longer) */
            const tlm_config *mc = tlm_model_config(m);
            CHECK(mc->sliding_window > 0 && mc->sliding_window < T, "%s: window %d", cases[i],
                  mc->sliding_window);
            tlm_model *g = NULL;
            float *want = malloc(sizeof(float) * (size_t)T * V);
            CHECK_OK(t_forward(m, ids, 1, T, NULL, &fo));
            if (want) memcpy(want, fo.logits, sizeof(float) * (size_t)T * V);
            CHECK_OK(tlm_model_save_gguf(m, NULL, "hf_window.gguf", TLM_DTYPE_F32));
            CHECK_OK(tlm_model_load("hf_window.gguf", 0, &g));
            if (g && want) {
                const tlm_config *gc = tlm_model_config(g);
                CHECK(gc->sliding_window == mc->sliding_window &&
                          gc->sliding_window_pattern == mc->sliding_window_pattern &&
                          gc->attn_softcap == mc->attn_softcap && gc->post_norms == mc->post_norms,
                      "%s through GGUF: window %d/%d, softcap %g", cases[i], gc->sliding_window,
                      gc->sliding_window_pattern, (double)gc->attn_softcap);
                CHECK_OK(t_forward(g, ids, 1, T, NULL, &fo));
                double dg = max_diff(want, fo.logits, (size_t)T * V);
                CHECK(dg < 1e-5, "%s through GGUF: logits differ by %g", cases[i], dg);
            }
            tlm_model_free(g);
            free(want);
            remove("hf_window.gguf");
        }
        tlm_model_free(m);
        free(ids);
        free(ref);
    }
}

/* An interleaved-pairing model (llama2.c/GGUF order) exports with q/k rows permuted to HF's. */
static void test_interleaved_export(void) {
    tlm_config c;
    tlm_config_defaults(&c);
    c.vocab_size = 33;
    c.context_length = 12;
    c.d_model = 24;
    c.n_layers = 2;
    c.n_heads = 3;
    c.n_kv_heads = 1;
    c.d_ff = 40;
    c.tie_embeddings = 0;
    c.rope_pairing = TLM_ROPE_INTERLEAVED;
    tlm_model *m = t_model(&c, 3, TLM_INIT_GPT2);
    int32_t ids[12] = {0, 32, 5, 9, 1, 17, 17, 2, 30, 4, 8, 11};
    export_and_check(m, "hf_export_interleaved", ids, 12);
    tlm_model_free(m);
}

static void write_text(const char *path, const char *text) {
    core_write_file_atomic(path, text, strlen(text));
}

static void expect_bad(const char *dir, tlm_status want, const char *needle) {
    tlm_model *m = NULL;
    tlm_status s = tlm_model_load(dir, 0, &m);
    CHECK(s == want && !m, "%s: status %d", dir, (int)s);
    CHECK_ERROR_HAS(needle);
    tlm_model_free(m);
}

static void test_malformed(void) {
    /* Start from a good export and break one thing at a time. */
    system("rm -rf hf_bad && mkdir -p hf_bad && cp hf_layouts/llama_tied/* hf_bad/");
    write_text("hf_bad/config.json", "{\"architectures\": [\"MixtralForCausalLM\"]}");
    expect_bad("hf_bad", TLM_ERR_UNSUPPORTED, "MixtralForCausalLM");
    write_text("hf_bad/config.json", "{\"architectures\": [\"Gemma3ForCausalLM\"]}");
    expect_bad("hf_bad", TLM_ERR_UNSUPPORTED, "Gemma 3 is not supported");
    write_text("hf_bad/config.json", "[1, 2]");
    expect_bad("hf_bad", TLM_ERR_FORMAT, "not a JSON object");
    write_text("hf_bad/config.json",
               "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":32,"
               "\"intermediate_size\":48,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
               "\"num_key_value_heads\":2,\"vocab_size\":64,\"max_position_embeddings\":32,"
               "\"tie_word_embeddings\":false}");
    expect_bad("hf_bad", TLM_ERR_FORMAT, "lm_head.weight");
    write_text("hf_bad/config.json",
               "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":32,"
               "\"intermediate_size\":50,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
               "\"num_key_value_heads\":2,\"vocab_size\":64,\"tie_word_embeddings\":true}");
    expect_bad("hf_bad", TLM_ERR_FORMAT, "shape");
    /* A config that asks for 35 G parameters is checked against the files before any allocation. */
    write_text("hf_bad/config.json",
               "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":16384,"
               "\"intermediate_size\":65536,\"num_hidden_layers\":8,\"num_attention_heads\":128,"
               "\"vocab_size\":100000,\"tie_word_embeddings\":true}");
    expect_bad("hf_bad", TLM_ERR_FORMAT, "[100000, 16384]");
    write_text("hf_bad/config.json",
               "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":-32}");
    expect_bad("hf_bad", TLM_ERR_FORMAT, "hidden_size");
    write_text("hf_bad/config.json",
               "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":32,"
               "\"intermediate_size\":48,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
               "\"vocab_size\":64,\"rope_scaling\":{\"type\":\"linear\",\"factor\":2}}");
    expect_bad("hf_bad", TLM_ERR_UNSUPPORTED, "rope_scaling");
    /* llama3's scaling needs its four numbers; Qwen2 with a sliding window is refused */
#define LLAMA_KEYS                                                                                 \
    "\"hidden_size\":32,\"intermediate_size\":48,\"num_hidden_layers\":2,"                         \
    "\"num_attention_heads\":4,\"vocab_size\":64,\"tie_word_embeddings\":true"
    /* a mixture of experts under a dense architecture's name */
    write_text("hf_bad/config.json",
               "{\"architectures\":[\"LlamaForCausalLM\"]," LLAMA_KEYS ",\"num_local_experts\":8}");
    expect_bad("hf_bad", TLM_ERR_UNSUPPORTED, "mixture of experts (num_local_experts 8)");
    write_text("hf_bad/config.json",
               "{\"architectures\":[\"LlamaForCausalLM\"]," LLAMA_KEYS ",\"rope_scaling\":{"
               "\"rope_type\":\"llama3\",\"factor\":8,\"low_freq_factor\":1,"
               "\"original_max_position_embeddings\":64}}");
    expect_bad("hf_bad", TLM_ERR_FORMAT, "rope_scaling.high_freq_factor");
    write_text("hf_bad/config.json",
               "{\"architectures\":[\"LlamaForCausalLM\"]," LLAMA_KEYS ",\"rope_scaling\":{"
               "\"rope_type\":\"llama3\",\"factor\":8,\"low_freq_factor\":4,"
               "\"high_freq_factor\":1,\"original_max_position_embeddings\":64}}");
    expect_bad("hf_bad", TLM_ERR_FORMAT, "must exceed");
    write_text("hf_bad/config.json", "{\"architectures\":[\"Qwen2ForCausalLM\"]," LLAMA_KEYS
                                     ",\"use_sliding_window\":true}");
    expect_bad("hf_bad", TLM_ERR_UNSUPPORTED, "use_sliding_window");
    /* Gemma 2: a global layer first is no pattern tlm has; a window on some layers is not Llama's
     */
    write_text("hf_bad/config.json", "{\"architectures\":[\"Gemma2ForCausalLM\"]," LLAMA_KEYS
                                     ",\"head_dim\":8,\"layer_types\":[\"full_attention\","
                                     "\"sliding_attention\"]}");
    expect_bad("hf_bad", TLM_ERR_UNSUPPORTED, "not a repeating pattern");
    write_text("hf_bad/config.json", "{\"architectures\":[\"Gemma2ForCausalLM\"]," LLAMA_KEYS
                                     ",\"head_dim\":8,\"hidden_activation\":\"silu\"}");
    expect_bad("hf_bad", TLM_ERR_UNSUPPORTED, "only gelu_pytorch_tanh");
#undef LLAMA_KEYS
    system("cp hf_layouts/llama_tied/config.json hf_bad/ && rm hf_bad/model.safetensors");
    expect_bad("hf_bad", TLM_ERR_FORMAT, "no model.safetensors");
    write_text("hf_bad/model.safetensors.index.json",
               "{\"weight_map\": {\"model.norm.weight\": \"../../etc/passwd\"}}");
    expect_bad("hf_bad", TLM_ERR_FORMAT, "bad shard name");
    /* Shards open in order of first appearance in the weight map, each once however often it
     * is named; a tensor in two shards is refused, naming it and both shards. */
    system("cp hf_layouts/llama_tied/model.safetensors hf_bad/a.safetensors && "
           "cp hf_layouts/llama_tied/model.safetensors hf_bad/b.safetensors");
    write_text("hf_bad/model.safetensors.index.json",
               "{\"weight_map\": {\"x\": \"b.safetensors\", \"y\": \"a.safetensors\", "
               "\"z\": \"b.safetensors\", \"w\": \"a.safetensors\"}}");
    expect_bad("hf_bad", TLM_ERR_FORMAT,
               "tensor 'model.embed_tokens.weight' is in both b.safetensors and a.safetensors");
    system("rm hf_bad/a.safetensors hf_bad/b.safetensors");
    /* A truncated shard is caught by the safetensors reader. */
    system("rm hf_bad/model.safetensors.index.json && head -c 2000 "
           "hf_layouts/llama_tied/model.safetensors > hf_bad/model.safetensors");
    expect_bad("hf_bad", TLM_ERR_FORMAT, "");
    system("rm -rf hf_bad");
}

/* Gemma 2's layer fields one at a time, on a Llama: llama2.c refuses each by name, GGUF and Hugging
 * Face (which hold Gemma 2's layout) name what differs from Gemma 2's; tlm's checkpoint keeps them
 * (the same logits after loading). */
static void test_gemma_fields(void) {
    static const char *const fields[] = {"attn_softcap", "final_softcap", "embed_scale",
                                         "attn_scale", "post_norms"};
    for (int i = 0; i < 5; i++) {
        tlm_config c;
        tlm_config_defaults(&c);
        c.vocab_size = 40;
        c.context_length = 16;
        c.d_model = 32;
        c.n_layers = 1;
        c.n_heads = 2;
        float *f[] = {&c.attn_softcap, &c.final_softcap, &c.embed_scale, &c.attn_scale};
        if (i < 4)
            *f[i] = 2.0f;
        else
            c.post_norms = 1;
        tlm_model *m = t_model(&c, 3, TLM_INIT_XAVIER);
        CHECK(tlm_model_save_gguf(m, NULL, "gemma_refused.gguf", TLM_DTYPE_F32) ==
                      TLM_ERR_UNSUPPORTED &&
                  strstr(tlm_last_error(), "GGUF export as gemma2: "),
              "GGUF writer: %s", tlm_last_error());
        CHECK(tlm_model_save_hf(m, "gemma_refused_hf", TLM_DTYPE_F32) == TLM_ERR_UNSUPPORTED &&
                  strstr(tlm_last_error(), "export as Gemma2ForCausalLM: "),
              "HF writer: %s", tlm_last_error());
        CHECK(tlm_model_save_llama2c(m, "gemma_refused.bin", 1) == TLM_ERR_UNSUPPORTED &&
                  strstr(tlm_last_error(), fields[i]),
              "llama2.c writer: %s", tlm_last_error());
        CHECK_OK(tlm_model_save_safetensors(m, "gemma_fields.safetensors"));
        tlm_model *back = NULL;
        CHECK_OK(tlm_model_load("gemma_fields.safetensors", 0, &back));
        if (back) {
            CHECK(!memcmp(tlm_model_config(back), tlm_model_config(m), sizeof c),
                  "%s: config differs", fields[i]);
            int32_t ids[6] = {1, 5, 9, 2, 39, 0};
            tlm_forward_out a, b;
            float want[6 * 40];
            CHECK_OK(t_forward(m, ids, 1, 6, NULL, &a));
            memcpy(want, a.logits, sizeof want);
            CHECK_OK(t_forward(back, ids, 1, 6, NULL, &b));
            CHECK(!memcmp(want, b.logits, sizeof want), "%s: logits differ after loading",
                  fields[i]);
            tlm_model_free(back);
        }
        remove("gemma_fields.safetensors");
        tlm_model_free(m);
    }
}

int main(void) {
    tlm_threads_set(2);
    test_gemma_fields();
    test_cases();
    test_interleaved_export();
    test_malformed();
    return t_finish("test_hf");
}
