/* safetensors: round trip of every float dtype and rejection of malformed files. */
#include <stdlib.h>
#include <string.h>

#include "core/half.h"
#include "harness.h"
#include "io/safetensors.h"
#include "tlm.h"

static void write_raw(const char *path, const char *header, size_t data_len) {
    FILE *f = fopen(path, "wb");
    uint64_t n = strlen(header);
    fwrite(&n, 8, 1, f);
    fwrite(header, 1, n, f);
    for (size_t i = 0; i < data_len; i++) fputc(0, f);
    fclose(f);
}

static void expect_bad(const char *header, size_t data_len, const char *needle) {
    write_raw("bad.safetensors", header, data_len);
    io_st_file f;
    tlm_status s = io_st_open(&f, "bad.safetensors");
    CHECK(s == TLM_ERR_FORMAT, "accepted bad header %s", header);
    CHECK_ERROR_HAS(needle);
    if (s == TLM_OK) io_st_close(&f);
}

static void test_malformed(void) {
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,12]}}", 8, "outside");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, "bytes");
    expect_bad("{\"a\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "dtype");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
               8, "overlap");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, "dimension");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
               "\"data_offsets\":[0,8]}}",
               8, "overflow");
    expect_bad("not json", 0, "JSON");
    FILE *f = fopen("bad.safetensors", "wb");
    uint64_t huge = (uint64_t)1 << 40;
    fwrite(&huge, 8, 1, f);
    fclose(f);
    io_st_file sf;
    CHECK(io_st_open(&sf, "bad.safetensors") == TLM_ERR_FORMAT, "huge header length accepted");
    f = fopen("bad.safetensors", "wb");
    fwrite("abc", 1, 3, f);
    fclose(f);
    CHECK(io_st_open(&sf, "bad.safetensors") == TLM_ERR_FORMAT, "3-byte file accepted");
    remove("bad.safetensors");
}

static void test_roundtrip(void) {
    float a[6] = {1.0f, -2.5f, 3.14159f, 65504.0f, 1e-7f, -0.0f};
    int32_t ids[3] = {7, -1, 1 << 30};
    io_st_out_tensor t[4] = {
        {"a32", TLM_DTYPE_F32, 2, {2, 3}, a},
        {"a16", TLM_DTYPE_F16, 1, {6}, a},
        {"abf", TLM_DTYPE_BF16, 2, {3, 2}, a},
        {"ids", TLM_DTYPE_I32, 1, {3}, ids},
    };
    const char *k[] = {"note"}, *v[] = {"hello"};
    CHECK_OK(io_st_write("rt.safetensors", t, 4, k, v, 1));
    io_st_file f;
    CHECK_OK(io_st_open(&f, "rt.safetensors"));
    CHECK(f.n == 4, "tensor count %d", f.n);
    CHECK(io_st_meta(&f, "note") && !strcmp(io_st_meta(&f, "note"), "hello"), "metadata");
    float b[6];
    CHECK_OK(io_st_read_f32(&f, io_st_find(&f, "a32"), b, 6));
    CHECK(memcmp(a, b, sizeof a) == 0, "F32 exact");
    CHECK_OK(io_st_read_f32(&f, io_st_find(&f, "a16"), b, 6));
    for (int i = 0; i < 6; i++)
        CHECK(b[i] == core_f16_to_f32(core_f32_to_f16(a[i])), "F16 element %d", i);
    CHECK(b[3] == 65504.0f && fabsf(b[2] - 3.140625f) < 1e-6f, "F16 values %g %g", b[3], b[2]);
    CHECK_OK(io_st_read_f32(&f, io_st_find(&f, "abf"), b, 6));
    CHECK(b[1] == -2.5f && fabsf(b[2] - 3.140625f) < 1e-6f, "BF16 values %g", b[2]);
    int32_t got[3];
    CHECK_OK(io_st_read_i32(&f, io_st_find(&f, "ids"), got, 3));
    CHECK(memcmp(got, ids, sizeof ids) == 0, "I32 exact");
    CHECK(io_st_read_f32(&f, io_st_find(&f, "a32"), b, 5) == TLM_ERR_FORMAT, "count mismatch");
    io_st_close(&f);
    remove("rt.safetensors");
}

static void test_half(void) {
    /* Every half value survives f16 -> f32 -> f16. */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = core_f16_to_f32((uint16_t)h);
        if (f != f) continue;
        if (core_f32_to_f16(f) != h) bad++;
    }
    CHECK(bad == 0, "%d half values do not round trip", bad);
    CHECK(core_f32_to_f16(1.0f + 1.0f / 2048) == 0x3c00, "ties to even (down)");
    CHECK(core_f32_to_f16(1.0f + 3.0f / 2048) == 0x3c02, "ties to even (up)");
    CHECK(core_f32_to_f16(1e6f) == 0x7c00, "overflow to inf");
    CHECK(core_f32_to_bf16(1.00390625f) == 0x3f80, "bf16 tie to even");
}

static void test_model_io(void) {
    tlm_config c;
    tlm_config_defaults(&c);
    c.vocab_size = 17;
    c.d_model = 16;
    c.n_heads = 2;
    c.n_layers = 2;
    c.bias = 1;
    c.norm = TLM_NORM_LAYERNORM;
    tlm_model *m2 = NULL, *m = t_model(&c, 3, TLM_INIT_GPT2);
    CHECK_OK(tlm_model_save_safetensors(m, "model_rt.safetensors"));
    CHECK_OK(tlm_model_new(&c, &m2));
    CHECK_OK(tlm_model_read_safetensors(m2, "model_rt.safetensors"));
    CHECK(memcmp(tlm_model_params(m), tlm_model_params(m2), tlm_model_num_params(m) * 4) == 0,
          "model parameters round trip");
    tlm_model_free(m2);
    c.d_model = 32;
    CHECK_OK(tlm_model_new(&c, &m2));
    CHECK(tlm_model_read_safetensors(m2, "model_rt.safetensors") == TLM_ERR_FORMAT,
          "shape mismatch rejected");
    CHECK(strstr(tlm_last_error(), "wrong shape") != NULL, "%s", tlm_last_error());
    tlm_model_free(m2);
    tlm_model_free(m);
    remove("model_rt.safetensors");
}

/* A tlm .safetensors is checked against its config before the model is built: a config that asks
 * for the largest context allowed in a file without tensors is refused for the missing tensors (it
 * used to build its RoPE tables first), and a complete file whose config asks for a context beyond
 * the config's limit is refused naming it (it used to build 3 GB). */
static void test_model_checked_first(void) {
    tlm_config c;
    tlm_config_defaults(&c);
    c.vocab_size = 17;
    c.d_model = 16;
    c.n_heads = 2;
    c.n_layers = 1;
    c.context_length = 1 << 24;
    char *cfg = tlm_config_to_json(&c);
    const char *k[] = {"format", "tlm_config"}, *v[] = {"tlm", cfg};
    CHECK_OK(io_st_write("huge_ctx.safetensors", NULL, 0, k, v, 2));
    free(cfg);
    tlm_model *m = NULL;
    tlm_status s = tlm_model_load("huge_ctx.safetensors", 0, &m);
    CHECK(s == TLM_ERR_FORMAT && !m &&
              strstr(tlm_last_error(), "missing tensor 'token_embd.weight'"),
          "status %d: %s", (int)s, tlm_last_error());
    c.context_length = 16;
    CHECK_OK(tlm_model_new(&c, &m));
    if (!m) return;
    int n;
    const tlm_tensor_info *ti = tlm_model_tensors(m, &n);
    io_st_out_tensor *t = calloc((size_t)n, sizeof *t);
    for (int i = 0; i < n; i++)
        t[i] = (io_st_out_tensor){ti[i].name,
                                  TLM_DTYPE_F32,
                                  ti[i].ndim,
                                  {ti[i].shape[0], ti[i].shape[1]},
                                  tlm_model_params(m) + ti[i].offset};
    c.context_length = 100000000;
    cfg = tlm_config_to_json(&c);
    v[1] = cfg;
    CHECK_OK(io_st_write("huge_ctx.safetensors", t, n, k, v, 2));
    free(cfg);
    free(t);
    tlm_model_free(m);
    m = NULL;
    s = tlm_model_load("huge_ctx.safetensors", 0, &m);
    CHECK(s == TLM_ERR_CONFIG && !m && strstr(tlm_last_error(), "context_length"), "status %d: %s",
          (int)s, tlm_last_error());
    tlm_model_free(m);
    remove("huge_ctx.safetensors");
}

int main(void) {
    test_half();
    test_malformed();
    test_roundtrip();
    test_model_io();
    test_model_checked_first();
    return t_finish("test_safetensors");
}
