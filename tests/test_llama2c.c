/* llama2.c .bin: the real stories260K model reproduces llama2.c's own greedy run, both layouts
 * round-trip, and malformed headers are rejected with clear errors. */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/core.h"
#include "harness.h"
#include "tlm.h"

/* Token sequence of the greedy vector (BOS + 4 prompt tokens + generated). */
static int32_t *greedy_tokens(const char *dir, int *n) {
    cJSON *j = t_read_json(t_path(dir, "vectors/stories260K_greedy.json"));
    if (!j) return NULL;
    cJSON *toks =
        cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "cases"), 0), "tokens");
    *n = cJSON_GetArraySize(toks);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)*n);
    for (int i = 0; i < *n; i++) ids[i] = (int32_t)cJSON_GetArrayItem(toks, i)->valuedouble;
    cJSON_Delete(j);
    return ids;
}

/* Counts positions from `from` whose argmax is the next token of the sequence. */
static int greedy_matches(tlm_model *m, const int32_t *ids, int n, int from) {
    tlm_forward_out fo;
    if (t_forward(m, ids, 1, n - 1, NULL, &fo)) return -1;
    int V = tlm_model_config(m)->vocab_size, ok = 0;
    for (int t = from; t < n - 1; t++) {
        const float *row = fo.logits + (size_t)t * V;
        int best = 0;
        for (int v = 1; v < V; v++)
            if (row[v] > row[best]) best = v;
        if (best == ids[t + 1]) ok++;
    }
    return ok;
}

static void test_stories(const char *dir) {
    tlm_model *m = NULL;
    CHECK_OK(tlm_model_load(t_path(dir, "models/stories260K.bin"), 0, &m));
    if (!m) return;
    const tlm_config *c = tlm_model_config(m);
    CHECK(c->d_model == 64 && c->d_ff == 172 && c->n_layers == 5 && c->n_heads == 8 &&
              c->n_kv_heads == 4 && c->vocab_size == 512 && c->context_length == 512,
          "config %d %d %d %d %d %d %d", c->d_model, c->d_ff, c->n_layers, c->n_heads,
          c->n_kv_heads, c->vocab_size, c->context_length);
    CHECK(c->tie_embeddings == 1 && c->rope_pairing == TLM_ROPE_INTERLEAVED, "tied, interleaved");
    CHECK(tlm_model_num_params(m) ==
              32768 + 5 * (64 + 4096 + 2048 * 2 + 4096 + 64 + 3 * 11008) + 64,
          "params %zu", tlm_model_num_params(m));
    tlm_model_format f;
    CHECK_OK(tlm_model_detect(t_path(dir, "models/stories260K.bin"), &f));
    CHECK(f == TLM_FORMAT_LLAMA2C, "detected %s", tlm_model_format_name(f));
    int n = 0;
    int32_t *ids = greedy_tokens(dir, &n);
    CHECK(ids && n == 201, "vector has %d tokens", n);
    if (!ids) {
        tlm_model_free(m);
        return;
    }
    int ok = greedy_matches(m, ids, n, 4);
    CHECK(ok == n - 5, "argmax reproduces %d of %d greedy tokens", ok, n - 5);

    /* Both layouts round-trip bit for bit. */
    for (int version = 0; version <= 1; version++) {
        const char *p = version ? "l2c_v1.bin" : "l2c_legacy.bin";
        CHECK_OK(tlm_model_save_llama2c(m, p, version));
        tlm_model *r = NULL;
        CHECK_OK(tlm_model_load(p, 0, &r));
        if (r) {
            CHECK(tlm_model_num_params(r) == tlm_model_num_params(m), "param count");
            float *fr = t_flat(r), *fm = t_flat(m);
            CHECK(!memcmp(fr, fm, tlm_model_num_params(m) * sizeof(float)),
                  "version %d params differ", version);
            free(fr);
            free(fm);
            tlm_model_free(r);
        }
    }
    /* The legacy file we write is byte-identical to the original apart from the RoPE tables that
     * readers skip: compare sizes and the header. */
    char *a = NULL, *b = NULL;
    size_t la = 0, lb = 0;
    core_read_file(t_path(dir, "models/stories260K.bin"), &a, &la);
    core_read_file("l2c_legacy.bin", &b, &lb);
    CHECK(a && b && la == lb && !memcmp(a, b, 28), "legacy header/size %zu vs %zu", la, lb);
    free(a);
    free(b);
    free(ids);
    tlm_model_free(m);
}

/* A half-pairing model written to llama2.c (adjacent pairs) computes the same logits. */
static void test_half_pairing(void) {
    tlm_config c;
    tlm_config_defaults(&c);
    c.vocab_size = 40;
    c.context_length = 16;
    c.d_model = 32;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.d_ff = 48;
    c.tie_embeddings = 0;
    c.rope_pairing = TLM_ROPE_HALF;
    tlm_model *r = NULL, *m = t_model(&c, 7, TLM_INIT_GPT2);
    CHECK_OK(tlm_model_save_llama2c(m, "l2c_half.bin", 0));
    CHECK_OK(tlm_model_load("l2c_half.bin", 0, &r));
    if (!r) {
        tlm_model_free(m);
        return;
    }
    CHECK(tlm_model_config(r)->tie_embeddings == 0, "separate classifier via negative vocab");
    int32_t ids[12] = {1, 5, 9, 33, 2, 0, 39, 14, 7, 7, 21, 3};
    tlm_forward_out a, b;
    CHECK_OK(t_forward(m, ids, 1, 12, NULL, &a));
    float *la = malloc(sizeof(float) * 12 * 40);
    memcpy(la, a.logits, sizeof(float) * 12 * 40);
    CHECK_OK(t_forward(r, ids, 1, 12, NULL, &b));
    double md = 0;
    for (int i = 0; i < 12 * 40; i++) md = fmax(md, fabs(la[i] - b.logits[i]));
    CHECK(md < 1e-5, "half -> interleaved logits differ by %g", md);
    free(la);
    tlm_model_free(m);
    tlm_model_free(r);
    remove("l2c_half.bin");
}

static void expect_bad(const void *d, size_t n, const char *needle) {
    t_write_file("l2c_bad.bin", d, n);
    tlm_model *m = NULL;
    tlm_status s = tlm_model_load_llama2c("l2c_bad.bin", &m);
    CHECK(s != TLM_OK && m == NULL, "accepted bad file (%s)", needle);
    CHECK_ERROR_HAS(needle);
    tlm_model_free(m);
}

static void test_malformed(void) {
    int32_t h[7] = {64, 172, 5, 8, 4, 512, 512};
    expect_bad(h, 20, "too short");
    expect_bad(h, 28, "implies"); /* header only: weights missing */
    int32_t z[7] = {64, 172, 5, 8, 4, 512, 0};
    expect_bad(z, 28, "seq_len");
    int32_t huge[7] = {1 << 16, 1 << 20, 1 << 12, 1 << 12, 1 << 12, 1 << 24, 1 << 24};
    expect_bad(huge, 28, "llama2.c header"); /* finalize caps the total */
    int32_t neg[7] = {64, -1, 5, 8, 4, 512, 512};
    expect_bad(neg, 28, "hidden_dim");
    int32_t kv[7] = {64, 172, 5, 8, 3, 512, 512};
    expect_bad(kv, 28, "n_kv_heads");
    uint8_t v1[256] = {0x32, 0x34, 0x6b, 0x61, 2, 0, 0, 0};
    expect_bad(v1, sizeof v1, "version 2");
    v1[4] = 1;
    expect_bad(v1, 100, "truncated");
    memcpy(v1 + 8, h, 28);
    v1[36] = 7;
    expect_bad(v1, sizeof v1, "shared_classifier");
    remove("l2c_bad.bin");
    tlm_model_format f;
    t_write_file("l2c_bad.bin", h, 28);
    CHECK(tlm_model_detect("l2c_bad.bin", &f) == TLM_ERR_FORMAT, "detect accepts a bare header");
    CHECK(strstr(tlm_last_error(), "unrecognized"), "%s", tlm_last_error());
    remove("l2c_bad.bin");
}

int main(void) {
    tlm_threads_set(2);
    test_half_pairing();
    test_malformed();
    const char *dir = t_require_shared_data();
    if (dir) test_stories(dir);
    remove("l2c_v1.bin");
    remove("l2c_legacy.bin");
    return t_finish("test_llama2c");
}
