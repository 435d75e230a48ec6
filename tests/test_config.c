/* Config defaults, validation errors, JSON round trip, schema and exact parameter counts. */
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "tlm.h"

static tlm_config cfg_json(const char *json, tlm_status *st) {
    tlm_config c;
    *st = tlm_config_from_json(json, &c);
    return c;
}

static void expect_error(const char *json, const char *needle) {
    tlm_status s;
    cfg_json(json, &s);
    CHECK(s == TLM_ERR_CONFIG, "expected a config error for %s", json);
    CHECK(strstr(tlm_last_error(), needle) != NULL, "error '%s' should mention '%s'",
          tlm_last_error(), needle);
}

static void test_defaults(void) {
    tlm_status s;
    tlm_config c = cfg_json("{\"d_model\": 768, \"n_heads\": 12}", &s);
    CHECK_OK(s);
    CHECK(c.n_kv_heads == 12, "n_kv_heads default %d", c.n_kv_heads);
    CHECK(c.d_ff == 2048, "swiglu d_ff for 768: %d", c.d_ff);
    CHECK(c.norm == TLM_NORM_RMSNORM && c.norm_position == TLM_NORM_PRE, "modern norm defaults");
    CHECK(c.ffn == TLM_FFN_SWIGLU && c.position == TLM_POS_ROPE, "modern ffn/position defaults");
    CHECK(c.tie_embeddings == 1 && c.bias == 0, "tied, no bias");
    CHECK_NEAR(c.norm_eps, 1e-5, 1e-12);
    CHECK_NEAR(c.rope_theta, 10000.0, 0);
    c = cfg_json("{\"d_model\": 100, \"n_heads\": 4}", &s);
    CHECK(c.d_ff == 320, "ceil(800/3)=267 -> 320, got %d", c.d_ff);
    c = cfg_json("{\"d_model\": 96, \"n_heads\": 4}", &s);
    CHECK(c.d_ff == 256, "8/3*96=256 exactly, got %d", c.d_ff);
    c = cfg_json("{\"d_model\": 128, \"n_heads\": 4, \"ffn\": \"gelu\"}", &s);
    CHECK(c.d_ff == 512, "4*d for gelu, got %d", c.d_ff);
}

static void test_errors(void) {
    expect_error("{\"d_model\": 100, \"n_heads\": 3}", "not divisible by n_heads");
    expect_error("{\"n_heads\": 4, \"n_kv_heads\": 3}", "not divisible by n_kv_heads");
    expect_error("{\"d_model\": 12, \"n_heads\": 4}", "even head dim");
    expect_error("{\"position\": \"learned\", \"context_length\": 0}", "context_length");
    expect_error("{\"vocab_size\": -1}", "vocab_size must be > 0");
    expect_error("{\"n_layers\": 0}", "n_layers must be > 0");
    expect_error("{\"d_ff\": -5}", "d_ff");
    expect_error("{\"colour\": 3}", "unknown config key 'colour'");
    expect_error("{\"norm\": \"batchnorm\"}", "unknown norm 'batchnorm'");
    expect_error("{\"ffn\": \"tanh\"}", "unknown ffn 'tanh'");
    expect_error("{\"position\": \"alibi\"}", "unknown position 'alibi'");
    expect_error("{\"rope_pairing\": \"odd\"}", "unknown rope_pairing 'odd'");
    expect_error("{\"norm_position\": \"middle\"}", "unknown norm_position 'middle'");
    expect_error("{\"d_model\": 64.5}", "integer");
    expect_error("{\"bias\": \"yes\"}", "bias");
    expect_error("{\"dropout\": 1.5}", "dropout");
    expect_error("{\"sliding_window\": -1}", "sliding_window -1 must be in");
    expect_error("{\"sliding_window_pattern\": 2}",
                 "sliding_window_pattern 2 needs a sliding_window");
    expect_error("{\"sliding_window\": 4, \"sliding_window_pattern\": -3}",
                 "sliding_window_pattern -3");
    expect_error("{\"attn_softcap\": -1}", "attn_softcap must be >= 0");
    expect_error("{\"final_softcap\": 1e40}", "final_softcap must be >= 0 and finite");
    expect_error("{\"embed_scale\": -0.5}", "embed_scale must be >= 0");
    expect_error("{\"attn_scale\": -2}", "attn_scale must be >= 0");
    expect_error("{\"post_norms\": 2}", "post_norms");
    expect_error("{\"post_norms\": true, \"norm_position\": \"post\"}",
                 "post_norms needs norm_position pre");
    expect_error("{\"ffn\": \"geglu2\"}", "swiglu|gelu|gelu_tanh|relu|geglu");
    expect_error("[1, 2]", "object");
    expect_error("{\"d_model\": ", "not valid JSON");
    expect_error("{\"d_model\": 2000000000, \"n_heads\": 1, \"vocab_size\": 1000000}", "d_model");
}

/* Finalizes c directly (the loaders fill the struct from file headers, not JSON). */
static void expect_refused(tlm_config c, const char *needle, const char *what) {
    tlm_status s = tlm_config_finalize(&c);
    CHECK(s == TLM_ERR_CONFIG, "%s: expected a config error, got %d", what, (int)s);
    CHECK(strstr(tlm_last_error(), needle) != NULL, "%s: error '%s' should mention '%s'", what,
          tlm_last_error(), needle);
}

static void expect_accepted(tlm_config c, const char *what) {
    tlm_status s = tlm_config_finalize(&c);
    CHECK(s == TLM_OK, "%s: refused: %s", what, tlm_last_error());
}

/* Each field's upper limit: the value at the limit is accepted, one above it is refused with a
 * message naming the field and the limit; INT_MAX too (the largest a file header can give). */
static void test_field_limits(void) {
    struct {
        const char *name;
        int limit;
        size_t offset;
    } f[] = {{"vocab_size", TLM_MAX_VOCAB_SIZE, offsetof(tlm_config, vocab_size)},
             {"context_length", TLM_MAX_CONTEXT_LENGTH, offsetof(tlm_config, context_length)},
             {"d_model", TLM_MAX_D_MODEL, offsetof(tlm_config, d_model)},
             {"n_layers", TLM_MAX_N_LAYERS, offsetof(tlm_config, n_layers)},
             {"n_heads", TLM_MAX_N_HEADS, offsetof(tlm_config, n_heads)},
             {"d_ff", TLM_MAX_D_FF, offsetof(tlm_config, d_ff)}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        tlm_config c;
        tlm_config_defaults(&c);
        /* Small everything else, with room for the field at its limit: n_heads at its limit needs
         * a d_model it divides, and a long context a narrow head (RoPE tables). */
        c.d_model = 64;
        c.n_heads = 2;
        c.d_ff = 128;
        if (!strcmp(f[i].name, "n_heads")) c.d_model = 2 * TLM_MAX_N_HEADS;
        if (!strcmp(f[i].name, "context_length")) c.position = TLM_POS_NONE;
        int *field = (int *)((char *)&c + f[i].offset);
        char msg[64];
        *field = f[i].limit;
        expect_accepted(c, f[i].name);
        snprintf(msg, sizeof msg, "%s %d", f[i].name, f[i].limit + 1);
        *field = f[i].limit + 1;
        expect_refused(c, msg, f[i].name);
        snprintf(msg, sizeof msg, "limit of %d", f[i].limit);
        expect_refused(c, msg, f[i].name);
        *field = INT_MAX;
        snprintf(msg, sizeof msg, "%s %d", f[i].name, INT_MAX);
        expect_refused(c, msg, f[i].name);
        *field = INT_MIN;
        snprintf(msg, sizeof msg, "%s must be %s", f[i].name,
                 !strcmp(f[i].name, "d_ff") ? ">= 0" : "> 0");
        expect_refused(c, msg, f[i].name);
    }
    tlm_config c;
    tlm_config_defaults(&c);
    c.n_kv_heads = INT_MAX;
    expect_refused(c, "n_kv_heads", "n_kv_heads above n_heads");
    c.n_kv_heads = -1;
    expect_refused(c, "n_kv_heads", "negative n_kv_heads");
    /* The derived d_ff of the widest d_model stays within d_ff's limit. */
    c.n_kv_heads = 0;
    c.d_model = TLM_MAX_D_MODEL;
    c.n_layers = 1;
    c.vocab_size = 16;
    c.d_ff = 0;
    tlm_config d = c;
    CHECK_OK(tlm_config_finalize(&d));
    CHECK(d.d_ff == 174784, "swiglu d_ff of d_model 65536: %d", d.d_ff);
    c.ffn = TLM_FFN_GELU;
    d = c;
    CHECK_OK(tlm_config_finalize(&d));
    CHECK(d.d_ff == 4 * TLM_MAX_D_MODEL, "gelu d_ff of d_model 65536: %d", d.d_ff);
}

/* Products of fields that are each within their limits: tensors, the whole buffer and the fixed
 * tables. Several of these overflow 32-bit arithmetic (and some 64-bit products of limits-free
 * fields would); the checks must name the fields and refuse before anything is allocated. */
static void test_size_limits(void) {
    tlm_config c;
    /* Llama 3 405B: every dimension and the exact parameter count. */
    tlm_config_defaults(&c);
    c.vocab_size = 128256;
    c.context_length = 131072;
    c.d_model = 16384;
    c.n_layers = 126;
    c.n_heads = 128;
    c.n_kv_heads = 8;
    c.d_ff = 53248;
    c.rope_theta = 500000.0f;
    c.tie_embeddings = 0;
    expect_accepted(c, "Llama 3 405B");
    tlm_param_count pc;
    tlm_config_count_params(&c, &pc);
    CHECK(pc.total == 405853388800ull, "Llama 3 405B parameters %zu", pc.total);
    /* A million-token context at head dim 128: RoPE tables of 2^26 floats each. */
    c.context_length = 1 << 20;
    expect_accepted(c, "1M context, head dim 128");
    /* 2^24 positions at head dim 128: each table would be 2^30 floats. */
    c.context_length = TLM_MAX_CONTEXT_LENGTH;
    expect_refused(c, "context_length 16777216", "RoPE table of 2^30 floats");
    expect_refused(c, "RoPE", "RoPE table of 2^30 floats");
    /* The same context with a narrow head is at the table limit exactly. */
    tlm_config_defaults(&c);
    c.context_length = TLM_MAX_CONTEXT_LENGTH;
    c.d_model = 8;
    c.n_heads = 1;
    expect_accepted(c, "RoPE table of 2^26 floats");
    c.d_model = 10;
    expect_refused(c, "context_length", "RoPE table just above 2^26 floats");
    /* tlm_model_new finalizes before it allocates anything. */
    tlm_model *m = NULL;
    CHECK(tlm_model_new(&c, &m) == TLM_ERR_CONFIG && !m, "model_create refuses the tables");
    CHECK(strstr(tlm_last_error(), "context_length") != NULL, "model_create: %s", tlm_last_error());
    /* Sinusoids are [context_length, d_model]. */
    c.position = TLM_POS_SINUSOIDAL;
    c.d_model = 4;
    expect_accepted(c, "sinusoid table of 2^26 floats");
    c.d_model = 8;
    expect_refused(c, "context_length 16777216 x d_model 8", "sinusoid table of 2^27 floats");
    expect_refused(c, "sinusoid", "sinusoid table of 2^27 floats");
    /* Learned positions are a tensor: at 2^24 x 2^16 it alone is the parameter limit. */
    c.position = TLM_POS_LEARNED;
    c.d_model = TLM_MAX_D_MODEL;
    c.n_heads = 64;
    c.vocab_size = 16;
    c.d_ff = 64;
    c.n_layers = 1;
    expect_refused(c, "context_length", "learned table 2^40 + other tensors");
    expect_refused(c, "parameters", "learned table 2^40 + other tensors");
    /* Token embedding: vocab 2^24 x d 2^16 is 2^40 elements (wraps 32-bit int arithmetic to 0). */
    tlm_config_defaults(&c);
    c.vocab_size = TLM_MAX_VOCAB_SIZE;
    c.d_model = TLM_MAX_D_MODEL;
    c.n_heads = 64;
    c.n_layers = 1;
    c.d_ff = 64;
    expect_refused(c, "vocab_size 16777216 x d_model 65536", "token embedding of 2^40");
    /* An untied head doubles it. */
    c.vocab_size = TLM_MAX_VOCAB_SIZE / 2;
    expect_accepted(c, "token embedding of 2^39");
    c.tie_embeddings = 0;
    expect_refused(c, "vocab_size", "two vocabulary tables of 2^39");
    /* Blocks: n_layers x (4 d^2 + 3 d d_ff) with every field within its limit. */
    tlm_config_defaults(&c);
    c.vocab_size = 16;
    c.d_model = TLM_MAX_D_MODEL;
    c.n_heads = 64;
    c.d_ff = TLM_MAX_D_FF;
    c.n_layers = 2;
    expect_accepted(c, "two widest blocks");
    c.n_layers = TLM_MAX_N_LAYERS;
    expect_refused(c, "n_layers 4096", "4096 widest blocks");
    expect_refused(c, "parameters", "4096 widest blocks");
    /* The count in the message is the schema's, for every variant of the block. */
    c.n_layers = 8;
    for (int v = 0; v < 16; v++) {
        c.bias = v & 1;
        c.norm = v & 2 ? TLM_NORM_LAYERNORM : TLM_NORM_RMSNORM;
        c.ffn = v & 4 ? TLM_FFN_GELU : TLM_FFN_SWIGLU;
        c.norm_position = v & 8 ? TLM_NORM_POST : TLM_NORM_PRE;
        c.n_kv_heads = v & 1 ? 16 : 64;
        c.tie_embeddings = !(v & 2);
        c.position = v & 4 ? TLM_POS_LEARNED : TLM_POS_ROPE;
        tlm_config_count_params(&c, &pc);
        char want[64];
        snprintf(want, sizeof want, "needs %zu parameters", pc.total);
        expect_refused(c, want, "parameter count of a variant");
    }
    /* The same through JSON, as a file's metadata would give it. */
    expect_error("{\"context_length\": 2000000000, \"d_model\": 2, \"n_heads\": 1}",
                 "context_length");
    expect_error("{\"vocab_size\": 16777216, \"d_model\": 65536, \"n_heads\": 64, \"n_layers\": 1,"
                 " \"d_ff\": 64}",
                 "vocab_size");
}

static void test_roundtrip(void) {
    tlm_status s;
    tlm_config a =
        cfg_json("{\"vocab_size\": 300, \"d_model\": 96, \"n_heads\": 6, \"n_kv_heads\": 2,"
                 "\"norm\": \"layernorm\", \"norm_position\": \"post\", \"ffn\": "
                 "\"gelu_tanh\", \"position\": \"sinusoidal\", \"rope_pairing\": "
                 "\"interleaved\", \"tie_embeddings\": false, \"bias\": true, "
                 "\"dropout\": 0.1, \"norm_eps\": 1e-6, \"rope_theta\": 500000, "
                 "\"sliding_window\": 64, \"sliding_window_pattern\": 3}",
                 &s);
    CHECK_OK(s);
    char *json = tlm_config_to_json(&a);
    CHECK(json && strstr(json, "\"norm_eps\":\t1e-06"), "norm_eps printed short: %s", json);
    tlm_config b = cfg_json(json, &s);
    CHECK_OK(s);
    CHECK(memcmp(&a, &b, sizeof a) == 0, "config JSON round trip differs");
    free(json);
    CHECK_OK(tlm_config_save(&a, "test_config_rt.json"));
    tlm_config c;
    CHECK_OK(tlm_config_load("test_config_rt.json", &c));
    CHECK(memcmp(&a, &c, sizeof a) == 0, "config file round trip differs");
    remove("test_config_rt.json");
    CHECK(tlm_config_load("no/such/file.json", &c) == TLM_ERR_IO, "missing file is an IO error");
    /* Gemma 2's fields: written only when set, read back the same */
    char *plain = tlm_config_to_json(&a);
    CHECK(plain && !strstr(plain, "softcap") && !strstr(plain, "embed_scale") &&
              !strstr(plain, "attn_scale") && !strstr(plain, "post_norms"),
          "unset Gemma fields are written: %s", plain);
    free(plain);
    tlm_config g = cfg_json("{\"d_model\": 64, \"n_heads\": 4, \"ffn\": \"geglu\", "
                            "\"attn_softcap\": 50, \"final_softcap\": 30, \"embed_scale\": "
                            "8, \"attn_scale\": 0.0625, \"post_norms\": true, "
                            "\"sliding_window\": 16, \"sliding_window_pattern\": 2}",
                            &s);
    CHECK_OK(s);
    CHECK(g.ffn == TLM_FFN_GEGLU && g.d_ff == 192, "geglu d_ff %d (swiglu's)", g.d_ff);
    CHECK(g.attn_softcap == 50.0f && g.final_softcap == 30.0f && g.embed_scale == 8.0f &&
              g.attn_scale == 0.0625f && g.post_norms == 1,
          "Gemma fields parsed");
    CHECK(tlm_config_attn_scale(&g) == 0.0625f, "attn_scale used");
    g.attn_scale = 0.0f;
    CHECK(tlm_config_attn_scale(&g) == 0.25f, "attn_scale 0: 1/sqrt(16)");
    g.attn_scale = 0.0625f;
    json = tlm_config_to_json(&g);
    CHECK(json && strstr(json, "\"ffn\":\t\"geglu\"") && strstr(json, "\"attn_softcap\":\t50") &&
              strstr(json, "\"post_norms\":\ttrue"),
          "Gemma fields written: %s", json);
    tlm_config h = cfg_json(json, &s);
    CHECK_OK(s);
    CHECK(memcmp(&g, &h, sizeof g) == 0, "Gemma fields' JSON round trip differs");
    free(json);
}

static tlm_param_count count(const char *json) {
    tlm_status s;
    tlm_config c = cfg_json(json, &s);
    CHECK_OK(s);
    tlm_param_count pc;
    tlm_config_count_params(&c, &pc);
    /* The per-component table adds up to the total, and the schema agrees. */
    size_t sum = 0, n_params = 0;
    for (int k = 0; k < TLM_COMP_COUNT; k++) sum += pc.per_component[k];
    CHECK(sum == pc.total, "components sum %zu != total %zu", sum, pc.total);
    tlm_config_tensors(&c, NULL, 0, &n_params);
    CHECK(n_params == pc.total, "schema %zu != count %zu", n_params, pc.total);
    return pc;
}

static void test_counts(void) {
    const char *modern = "{\"vocab_size\": 50257, \"d_model\": 768, \"n_layers\": 12, \"n_heads\": "
                         "12, \"d_ff\": 2048, \"context_length\": 1024}";
    tlm_param_count pc = count(modern);
    CHECK(pc.total == 123551232, "modern total %zu", pc.total);
    CHECK(pc.non_embedding == 84953856, "modern non-embedding %zu", pc.non_embedding);
    /* Gemma 2's four norms a block: two gains of d more per layer; GEGLU has swiglu's matrices */
    pc = count("{\"vocab_size\": 50257, \"d_model\": 768, \"n_layers\": 12, \"n_heads\": 12, "
               "\"d_ff\": 2048, \"context_length\": 1024, \"post_norms\": true, \"ffn\": "
               "\"geglu\", \"attn_softcap\": 50, \"final_softcap\": 30, \"embed_scale\": 27.7}");
    CHECK(pc.total == 123551232 + 12 * 2 * 768, "post_norms total %zu", pc.total);
    CHECK(pc.non_embedding == 84953856 + 12 * 2 * 768, "post_norms non-embedding %zu",
          pc.non_embedding);
    CHECK(pc.per_component[TLM_COMP_ATTN_NORM] == 12 * 2 * 768 &&
              pc.per_component[TLM_COMP_FFN_NORM] == 12 * 2 * 768,
          "post norms counted with their sub-layers' norms");
    pc = count("{\"vocab_size\": 100, \"d_model\": 64, \"n_layers\": 2, \"n_heads\": 4, "
               "\"norm\": \"layernorm\", \"bias\": true, \"post_norms\": true}");
    CHECK(pc.per_component[TLM_COMP_ATTN_NORM] == 2 * 2 * 2 * 64, "layernorm post norms' biases");
    {
        tlm_status st;
        tlm_config g = cfg_json("{\"d_model\": 64, \"n_heads\": 4, \"n_layers\": 1, "
                                "\"post_norms\": true}",
                                &st);
        CHECK_OK(st);
        tlm_tensor_info ts[16];
        int n = tlm_config_tensors(&g, ts, 16, NULL);
        int pa = -1, pf = -1, o = -1, ffn = -1, down = -1;
        for (int i = 0; i < n; i++) {
            if (!strcmp(ts[i].name, "blk.0.post_attention_norm.weight")) pa = i;
            if (!strcmp(ts[i].name, "blk.0.post_ffw_norm.weight")) pf = i;
            if (!strcmp(ts[i].name, "blk.0.attn_output.weight")) o = i;
            if (!strcmp(ts[i].name, "blk.0.ffn_norm.weight")) ffn = i;
            if (!strcmp(ts[i].name, "blk.0.ffn_down.weight")) down = i;
        }
        CHECK(pa == o + 1 && ffn == pa + 1 && pf == down + 1, "post norms' names and places");
    }
    pc = count("{\"vocab_size\": 50257, \"d_model\": 768, \"n_layers\": 12, \"n_heads\": 12, "
               "\"d_ff\": 2048, \"tie_embeddings\": false}");
    CHECK(pc.total == 162148608, "untied total %zu", pc.total);
    pc = count("{\"vocab_size\": 50257, \"d_model\": 768, \"n_layers\": 12, \"n_heads\": 12, "
               "\"d_ff\": 3072, \"context_length\": 1024, \"norm\": \"layernorm\", \"ffn\": "
               "\"gelu_tanh\", \"position\": \"learned\", \"bias\": true}");
    CHECK(pc.total == 124439808, "gpt2 small total %zu", pc.total);
    CHECK(pc.non_embedding == 124439808 - 50257 * 768 - 1024 * 768, "gpt2 non-emb %zu",
          pc.non_embedding);
    /* GQA shrinks k and v: 8 heads, 2 kv heads, d 64 -> k,v are [16, 64] each. */
    pc = count("{\"vocab_size\": 10, \"d_model\": 64, \"n_layers\": 1, \"n_heads\": 8, "
               "\"n_kv_heads\": 2, \"d_ff\": 128}");
    CHECK(pc.per_component[TLM_COMP_ATTN] == 64 * 64 * 2 + 16 * 64 * 2, "gqa attention %zu",
          pc.per_component[TLM_COMP_ATTN]);
}

static void test_schema(void) {
    tlm_status s;
    tlm_config c = cfg_json("{\"vocab_size\": 10, \"d_model\": 8, \"n_layers\": 2, \"n_heads\": 2, "
                            "\"n_kv_heads\": 1, \"d_ff\": 16, \"bias\": true, \"norm\": "
                            "\"layernorm\", \"tie_embeddings\": false, \"position\": \"learned\", "
                            "\"context_length\": 5}",
                            &s);
    CHECK_OK(s);
    tlm_tensor_info t[64];
    size_t total;
    int n = tlm_config_tensors(&c, t, 64, &total);
    CHECK(n == 2 + 2 * 18 + 2 + 1, "tensor count %d", n);
    CHECK(!strcmp(t[0].name, "token_embd.weight") && t[0].shape[0] == 10 && t[0].shape[1] == 8,
          "first tensor %s", t[0].name);
    CHECK(!strcmp(t[1].name, "position_embd.weight") && t[1].embedding, "position table");
    /* q, k, v weights back to back, then their biases: one stacked matrix for the kernels. */
    CHECK(!strcmp(t[4].name, "blk.0.attn_q.weight") && t[4].shape[0] == 8 && t[4].decay, "%s",
          t[4].name);
    CHECK(!strcmp(t[5].name, "blk.0.attn_k.weight") && t[5].shape[0] == 4, "k rows %lld",
          (long long)t[5].shape[0]);
    CHECK(!strcmp(t[6].name, "blk.0.attn_v.weight"), "%s", t[6].name);
    CHECK(!strcmp(t[7].name, "blk.0.attn_q.bias") && !t[7].decay, "bias doesn't decay");
    CHECK(!strcmp(t[2].name, "blk.0.attn_norm.weight") && !t[2].decay, "gain doesn't decay");
    CHECK(!strcmp(t[n - 1].name, "output.weight") && t[n - 1].decay, "%s", t[n - 1].name);
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        CHECK(t[i].offset == off, "%s offset %zu expected %zu", t[i].name, t[i].offset, off);
        off += t[i].numel;
    }
    CHECK(off == total, "offsets cover the buffer");
    /* Post-norm models have no final norm. */
    c.norm_position = TLM_NORM_POST;
    n = tlm_config_tensors(&c, t, 64, &total);
    for (int i = 0; i < n; i++) CHECK(strncmp(t[i].name, "output_norm", 11) != 0, "post-norm");
}

static void test_init(void) {
    tlm_status s;
    tlm_config c =
        cfg_json("{\"vocab_size\": 1000, \"d_model\": 256, \"n_layers\": 2, \"n_heads\": "
                 "4, \"bias\": true, \"norm\": \"layernorm\"}",
                 &s);
    tlm_model *m = t_model(&c, 42, TLM_INIT_XAVIER);
    if (!m) return;
    float *p = tlm_model_params(m);
    const tlm_tensor_info *q = tlm_model_find(m, "blk.0.attn_q.weight");
    double ss = 0, mx = 0;
    for (size_t i = 0; i < q->numel; i++) {
        ss += (double)p[q->offset + i] * p[q->offset + i];
        mx = fabs(p[q->offset + i]) > mx ? fabs(p[q->offset + i]) : mx;
    }
    double sigma = sqrt(2.0 / 512), var = ss / q->numel;
    /* Truncation at 3 sigma keeps 98.9% of the variance. */
    CHECK(fabs(var / (sigma * sigma) - 0.973) < 0.03, "q variance ratio %g", var / (sigma * sigma));
    CHECK(mx <= 3 * sigma + 1e-6, "cut at 3 sigma: %g", mx);
    const tlm_tensor_info *g = tlm_model_find(m, "blk.1.ffn_norm.weight");
    const tlm_tensor_info *b = tlm_model_find(m, "blk.1.ffn_norm.bias");
    CHECK(p[g->offset] == 1.0f && p[b->offset + 3] == 0.0f, "gain 1, bias 0");
    float first = p[q->offset];
    CHECK_OK(tlm_model_init(m, 42, TLM_INIT_XAVIER));
    CHECK(p[q->offset] == first, "init is deterministic");
    CHECK_OK(tlm_model_init(m, 7, TLM_INIT_GPT2));
    const tlm_tensor_info *o = tlm_model_find(m, "blk.0.ffn_down.weight");
    ss = 0;
    for (size_t i = 0; i < o->numel; i++) ss += (double)p[o->offset + i] * p[o->offset + i];
    double want = 0.02 / sqrt(4.0);
    CHECK(fabs(sqrt(ss / o->numel) / want - 1) < 0.02, "gpt2 scaled std %g want %g",
          sqrt(ss / o->numel), want);
    tlm_model_free(m);
}

/* Mixture-of-experts fields: refusals naming the field, derived width, JSON round trip, exact
 * parameter counts (Mixtral 8x7B's published 46.7B total, 12.9B active per token). */
static void test_experts(void) {
    const char *base = "{\"d_model\": 64, \"n_heads\": 4";
    char j[512];
    struct {
        const char *fields, *needle;
    } bad[] = {
        {"\"n_experts\": 2, \"n_experts_used\": 3", "n_experts_used 3 must be in [1, n_experts 2]"},
        {"\"n_experts\": 4", "n_experts_used 0 must be in [1, n_experts 4]"},
        {"\"n_experts_used\": 2", "n_experts_used needs n_experts > 0"},
        {"\"n_shared_experts\": 1", "n_shared_experts needs n_experts > 0"},
        {"\"router_z_loss_coef\": 0.1", "router_z_loss_coef needs n_experts > 0"},
        {"\"n_experts\": 4, \"n_experts_used\": 2, \"ffn\": \"gelu\"",
         "n_experts needs a gated ffn (swiglu or geglu)"},
        {"\"n_experts\": 4, \"n_experts_used\": 2, \"bias\": true", "set bias false"},
        {"\"n_experts\": 1025, \"n_experts_used\": 2", "n_experts 1025 must be in [0, 1024]"},
        {"\"n_experts\": -1", "n_experts -1 must be in"},
        {"\"n_experts\": 4, \"n_experts_used\": 2, \"expert_d_ff\": 2000000",
         "expert_d_ff 2000000"},
        {"\"n_experts\": 4, \"n_experts_used\": 2, \"expert_d_ff\": 65536, \"n_shared_experts\": "
         "17",
         "n_shared_experts 17 x expert_d_ff 65536"},
        {"\"n_experts\": 4, \"n_experts_used\": 2, \"router_aux_loss_coef\": -0.5",
         "router_aux_loss_coef must be >= 0"},
        {"\"n_experts\": 4, \"n_experts_used\": 2, \"expert_weights_norm\": 2",
         "expert_weights_norm"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(j, sizeof j, "%s, %s}", base, bad[i].fields);
        expect_error(j, bad[i].needle);
    }
    tlm_status s;
    snprintf(j, sizeof j,
             "%s, \"n_experts\": 4, \"n_experts_used\": 2, \"expert_weights_norm\": true, "
             "\"n_shared_experts\": 2, \"router_aux_loss_coef\": 0.01, \"router_z_loss_coef\": "
             "0.001}",
             base);
    tlm_config a = cfg_json(j, &s);
    CHECK_OK(s);
    CHECK(a.expert_d_ff == a.d_ff && a.d_ff == 192, "expert_d_ff 0 takes d_ff: %d", a.expert_d_ff);
    char *json = tlm_config_to_json(&a);
    CHECK(json && strstr(json, "\"n_experts\":\t4") &&
              strstr(json, "\"expert_weights_norm\":\ttrue"),
          "expert fields written: %s", json);
    tlm_config b = cfg_json(json, &s);
    CHECK_OK(s);
    CHECK(memcmp(&a, &b, sizeof a) == 0, "expert fields' JSON round trip differs");
    free(json);
    /* the schema: router [E, d], experts 3-D [E, out, in], shared expert and its gate vector */
    int n = tlm_config_tensors(&a, NULL, 0, NULL);
    tlm_tensor_info *ti = calloc((size_t)n, sizeof *ti);
    tlm_config_tensors(&a, ti, n, NULL);
    int seen = 0;
    for (int i = 0; i < n; i++) {
        const tlm_tensor_info *t = &ti[i];
        if (!strcmp(t->name, "blk.1.ffn_gate_inp.weight"))
            seen += t->ndim == 2 && t->shape[0] == 4 && t->shape[1] == 64;
        if (!strcmp(t->name, "blk.1.ffn_up_exps.weight"))
            seen += t->ndim == 3 && t->shape[0] == 4 && t->shape[1] == 192 && t->shape[2] == 64 &&
                    t->numel == 4 * 192 * 64;
        if (!strcmp(t->name, "blk.1.ffn_down_exps.weight"))
            seen += t->ndim == 3 && t->shape[0] == 4 && t->shape[1] == 64 && t->shape[2] == 192;
        if (!strcmp(t->name, "blk.1.ffn_gate_shexp.weight"))
            seen += t->ndim == 2 && t->shape[0] == 384 && t->shape[1] == 64;
        if (!strcmp(t->name, "blk.1.ffn_gate_inp_shexp.weight"))
            seen += t->ndim == 1 && t->shape[0] == 64;
        CHECK(!strstr(t->name, "ffn_gate.") && !strstr(t->name, "ffn_down."),
              "a dense FFN tensor in a mixture: %s", t->name);
    }
    CHECK(seen == 5, "expert tensors' names and shapes (%d of 5)", seen);
    free(ti);
    tlm_param_count pc =
        count("{\"vocab_size\": 32000, \"context_length\": 32768, \"d_model\": "
              "4096, \"n_layers\": 32, \"n_heads\": 32, \"n_kv_heads\": 8, "
              "\"tie_embeddings\": false, \"n_experts\": 8, \"n_experts_used\": 2, "
              "\"expert_d_ff\": 14336, \"expert_weights_norm\": true}");
    CHECK(pc.total == 46702792704ull, "Mixtral 8x7B total %zu", pc.total);
    tlm_config mx = cfg_json("{\"vocab_size\": 32000, \"context_length\": 32768, \"d_model\": "
                             "4096, \"n_layers\": 32, \"n_heads\": 32, \"n_kv_heads\": 8, "
                             "\"tie_embeddings\": false, \"n_experts\": 8, \"n_experts_used\": 2, "
                             "\"expert_d_ff\": 14336}",
                             &s);
    CHECK_OK(s);
    CHECK(tlm_config_active_params(&mx) == 12879925248ull, "Mixtral 8x7B active %zu",
          tlm_config_active_params(&mx));
    /* the shared expert: per layer a router 4x64, 3 experts' matrices 4x16x64, shared gate|up
     * 2x(32x64), down 64x32 and a gate of 64 */
    tlm_param_count d = count("{\"vocab_size\": 100, \"d_model\": 64, \"n_heads\": 4, "
                              "\"n_layers\": 1}");
    pc = count("{\"vocab_size\": 100, \"d_model\": 64, \"n_heads\": 4, \"n_layers\": 1, "
               "\"n_experts\": 4, \"n_experts_used\": 1, \"expert_d_ff\": 16, "
               "\"n_shared_experts\": 2}");
    size_t dense_ffn = 3 * 192 * 64, moe_ffn = 256 + 3 * 4 * 16 * 64 + 2 * 32 * 64 + 64 * 32 + 64;
    CHECK(pc.total == d.total - dense_ffn + moe_ffn, "shared expert count %zu vs %zu", pc.total,
          d.total - dense_ffn + moe_ffn);
    tlm_config sh = cfg_json("{\"vocab_size\": 100, \"d_model\": 64, \"n_heads\": 4, \"n_layers\": "
                             "1, \"n_experts\": 4, \"n_experts_used\": 1, \"expert_d_ff\": 16, "
                             "\"n_shared_experts\": 2}",
                             &s);
    CHECK(tlm_config_active_params(&sh) == pc.total - 3 * 3 * 16 * 64, "active with shared %zu",
          tlm_config_active_params(&sh));
    CHECK(tlm_config_active_params(&a) < count(j).total, "active below total");
    tlm_param_count dn = count("{\"vocab_size\": 100, \"d_model\": 64, \"n_heads\": 4}");
    tlm_config dc = cfg_json("{\"vocab_size\": 100, \"d_model\": 64, \"n_heads\": 4}", &s);
    CHECK(tlm_config_active_params(&dc) == dn.total, "a dense config's active count is its total");
}

int main(void) {
    test_defaults();
    test_experts();
    test_errors();
    test_field_limits();
    test_size_limits();
    test_roundtrip();
    test_counts();
    test_schema();
    test_init();
    return t_finish("test_config");
}
