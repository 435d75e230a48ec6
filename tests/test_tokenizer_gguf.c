/* GGUF reader (valid and malformed files) and GGUF vocabularies against llama.cpp's vectors. */
#include "io/gguf.h"
#include "io/gguf_writer.h"
#include "tok_common.h"
#include "tokenizer/tok_gguf.h"
#include "tokenizer/tok_internal.h"

/* A tiny GGUF v3 builder for malformed-input tests. */
typedef struct {
    uint8_t buf[4096];
    size_t n;
} gb;

static void put(gb *b, const void *p, size_t n) {
    memcpy(b->buf + b->n, p, n);
    b->n += n;
}
static void put_u32(gb *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(gb *b, uint64_t v) { put(b, &v, 8); }
static void put_str(gb *b, const char *s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}

/* header + one u32 kv + one F32 tensor [4, 2] at offset 0 */
static void build_valid(gb *b, uint64_t n_tensors, uint64_t n_kv) {
    b->n = 0;
    put(b, "GGUF", 4);
    put_u32(b, 3);
    put_u64(b, n_tensors);
    put_u64(b, n_kv);
    put_str(b, "general.alignment");
    put_u32(b, IO_GGUF_U32);
    put_u32(b, 32);
    put_str(b, "names");
    put_u32(b, IO_GGUF_ARRAY);
    put_u32(b, IO_GGUF_STRING);
    put_u64(b, 2);
    put_str(b, "ab");
    put_str(b, "c");
    put_str(b, "w");
    put_u32(b, 2);
    put_u64(b, 4);
    put_u64(b, 2);
    put_u32(b, 0); /* F32 */
    put_u64(b, 0);
    while (b->n % 32) b->buf[b->n++] = 0;
    for (int i = 0; i < 8; i++) {
        float f = (float)i;
        put(b, &f, 4);
    }
}

static void expect_bad(const gb *b, size_t size, const char *needle, const char *what) {
    io_gguf *g = NULL;
    tlm_status s = io_gguf_open_memory(b->buf, size, "t.gguf", &g);
    CHECK(s != TLM_OK && g == NULL, "%s: accepted", what);
    CHECK(strstr(tlm_last_error(), needle) != NULL, "%s: error '%s' lacks '%s'", what,
          tlm_last_error(), needle);
    io_gguf_close(g);
}

static void test_reader(void) {
    gb b;
    build_valid(&b, 1, 2);
    io_gguf *g = NULL;
    CHECK_OK(io_gguf_open_memory(b.buf, b.n, "t.gguf", &g));
    if (g) {
        CHECK(g->version == 3 && g->n_kv == 2 && g->n_tensors == 1 && g->alignment == 32, "header");
        const io_gguf_tensor *t = io_gguf_find_tensor(g, "w");
        CHECK(t && t->n_dims == 2 && t->dims[0] == 4 && t->dims[1] == 2 && t->n_bytes == 32,
              "tensor info");
        float f5;
        if (t && t->data) {
            memcpy(&f5, t->data + 20, 4);
            CHECK(f5 == 5.0f, "tensor data");
        }
        const io_gguf_kv *kv;
        CHECK_OK(io_gguf_get_array(g, "names", IO_GGUF_STRING, &kv));
        const char *s;
        size_t l;
        CHECK(kv && io_gguf_arr_str(kv, 1, &s, &l) == TLM_OK && l == 1 && s[0] == 'c', "array");
        CHECK(kv && io_gguf_arr_str(kv, 2, &s, &l) == TLM_ERR_RANGE, "array index checked");
        int64_t v;
        CHECK_OK(io_gguf_get_int(g, "general.alignment", &v));
        CHECK(v == 32, "int");
        CHECK(io_gguf_get_int(g, "missing", &v) == TLM_ERR_RANGE, "missing key");
        CHECK(io_gguf_get_int(g, "names", &v) == TLM_ERR_FORMAT, "wrong type");
    }
    io_gguf_close(g);
    /* every truncation is an error, never a crash */
    int bad = 0;
    for (size_t cut = 0; cut < b.n; cut++) {
        io_gguf *h = NULL;
        if (io_gguf_open_memory(b.buf, cut, "t.gguf", &h) == TLM_OK) bad++;
        io_gguf_close(h);
    }
    CHECK(bad == 0, "%d truncated files accepted", bad);
    expect_bad(&b, 4, "not a GGUF", "short");
    build_valid(&b, 1, 2);
    memcpy(b.buf + 4, &(uint32_t){7}, 4);
    expect_bad(&b, b.n, "version 7", "version");
    build_valid(&b, 1, 2);
    memcpy(b.buf + 16, &(uint64_t){1ull << 60}, 8);
    expect_bad(&b, b.n, "more than", "huge key count");
    /* string length past the end */
    build_valid(&b, 1, 2);
    memcpy(b.buf + 24, &(uint64_t){1ull << 62}, 8);
    expect_bad(&b, b.n, "past the end", "huge string");
    /* tensor data past the end: drop the last 4 bytes */
    build_valid(&b, 1, 2);
    expect_bad(&b, b.n - 4, "runs past the end", "short tensor data");
    /* bad alignment value */
    build_valid(&b, 1, 2);
    memcpy(b.buf + 24 + 8 + 17 + 4, &(uint32_t){3}, 4);
    expect_bad(&b, b.n, "power of two", "alignment");
    /* more than 4 dims, unknown value type */
    build_valid(&b, 1, 2);
    size_t tpos = 24 + 8 + 17 + 4 + 4 + 8 + 5 + 4 + 4 + 8 + 10 + 9 + 9;
    memcpy(b.buf + tpos, &(uint32_t){5}, 4);
    expect_bad(&b, b.n, "dimensions", "rank");
    build_valid(&b, 1, 2);
    memcpy(b.buf + 24 + 8 + 17, &(uint32_t){99}, 4);
    expect_bad(&b, b.n, "unknown value type", "value type");
}

static void check_vectors(const char *data, const char *name) {
    char path[512];
    snprintf(path, sizeof path, "tokenizers/%s", name);
    tlm_tokenizer *t = NULL;
    CHECK_OK(tlm_tokenizer_load(t_path(data, path), &t));
    if (!t) return;
    char inp[512], out[512];
    snprintf(inp, sizeof inp, "vectors/llamacpp/%s.inp", name);
    snprintf(out, sizeof out, "vectors/llamacpp/%s.out", name);
    int ok;
    int n = llamacpp_vectors(t, t_path(data, inp), t_path(data, out), 0, &ok);
    CHECK(n >= 40 && ok == n, "%s: %d/%d", name, ok, n);
    printf("llamacpp/%s: %d/%d cases\n", name, ok, n);
    tlm_tokenizer_free(t);
}

static void test_vocabs(const char *data) {
    check_vectors(data, "ggml-vocab-gpt-2.gguf");
    check_vectors(data, "ggml-vocab-llama-spm.gguf");
    /* the GGUF gpt2 vocabulary and encoder.json + vocab.bpe agree id for id */
    tlm_tokenizer *a = NULL, *b = NULL;
    CHECK_OK(tlm_tokenizer_load(t_path(data, "tokenizers/ggml-vocab-gpt-2.gguf"), &a));
    CHECK_OK(tlm_tokenizer_load(t_path(data, "tokenizers/gpt2"), &b));
    if (a && b) {
        CHECK(tok_same_pieces(a, b), "GGUF gpt2 pieces equal encoder.json's");
        CHECK(tlm_tokenizer_eos(a) == 50256, "gguf gpt2 eos %d", tlm_tokenizer_eos(a));
    }
    tlm_tokenizer_free(a);
    tlm_tokenizer_free(b);
    /* llama SentencePiece: BOS/EOS, byte fallback, round trips */
    CHECK_OK(tlm_tokenizer_load(t_path(data, "tokenizers/ggml-vocab-llama-spm.gguf"), &a));
    if (a) {
        CHECK(tlm_tokenizer_vocab_size(a) == 32000 && tlm_tokenizer_bos(a) == 1 &&
                  tlm_tokenizer_eos(a) == 2,
              "llama ids");
        const char *txt = "Hello\n\xF0\x9F\xA6\x99 <s> x\xFF";
        int32_t *ids;
        size_t k;
        CHECK_OK(tlm_tokenizer_encode(a, txt, strlen(txt),
                                      TLM_ENCODE_ADD_BOS | TLM_ENCODE_ALLOW_SPECIAL, &ids, &k));
        CHECK(k > 3 && ids[0] == 1, "bos first");
        int has_s = 0;
        for (size_t i = 1; i < k; i++) has_s |= ids[i] == 1;
        CHECK(has_s, "<s> in the text is the BOS token when specials are allowed");
        char *back;
        size_t bl;
        CHECK_OK(tlm_tokenizer_decode(a, ids, k, 0, &back, &bl));
        /* BOS renders as <s>, the dummy prefix after each special is removed */
        CHECK(bl == strlen(txt) + 3 && !memcmp(back, "<s>", 3) && !memcmp(back + 3, txt, bl - 3),
              "llama decode '%s'", back);
        free(back);
        free(ids);
    }
    tlm_tokenizer_free(a);
    /* vocabularies inside model files */
    CHECK_OK(tlm_tokenizer_load(t_path(data, "models/stories260K.gguf"), &a));
    CHECK_OK(tlm_tokenizer_load(t_path(data, "models/tok512.bin"), &b));
    if (a && b) {
        const char *txt = "Once upon a time, there was a little girl named Lily.";
        int32_t *x, *y;
        size_t nx, ny;
        CHECK_OK(tlm_tokenizer_encode(a, txt, strlen(txt), TLM_ENCODE_ADD_BOS, &x, &nx));
        CHECK_OK(tlm_tokenizer_encode(b, txt, strlen(txt), TLM_ENCODE_ADD_BOS, &y, &ny));
        CHECK(nx == ny && !memcmp(x, y, nx * sizeof *x), "stories260K.gguf vocab == tok512.bin");
        free(x);
        free(y);
    }
    tlm_tokenizer_free(a);
    tlm_tokenizer_free(b);
    CHECK_OK(tlm_tokenizer_load(t_path(data, "models/llama-2-tiny-random.gguf"), &a));
    CHECK(a && tlm_tokenizer_vocab_size(a) == 32000, "llama-2 vocab in a model file");
    tlm_tokenizer_free(a);
    /* a GGUF without a vocabulary */
    gb g;
    build_valid(&g, 1, 2);
    char tmp[] = "/tmp/tlm_gguf_XXXXXX";
    int fd = mkstemp(tmp);
    if (fd >= 0) {
        FILE *f = fdopen(fd, "wb");
        fwrite(g.buf, 1, g.n, f);
        fclose(f);
        CHECK(tlm_tokenizer_load(tmp, &a) == TLM_ERR_FORMAT &&
                  strstr(tlm_last_error(), "no vocabulary"),
              "no vocabulary: %s", tlm_last_error());
        remove(tmp);
    }
}

/* Llama 3's and Qwen2's byte-level BPE: llama.cpp's vocab-only files and its test strings for
 * them, taken out of the llama.cpp source that node-llama-cpp carries (a git bundle; the repo's
 * setup installs it for the GGUF tests). Every string gives llama.cpp's ids; BOS and the
 * pre-tokenizer's name survive a GGUF round trip. */
static void test_bundle_vocabs(void) {
    const char *bundle =
        TLM_SOURCE_DIR "/tests/node/node_modules/node-llama-cpp/llama/gitRelease.bundle";
    FILE *f = fopen(bundle, "rb");
    CHECK(f != NULL, "no llama.cpp source bundle at %s (scripts/setup.sh installs it)", bundle);
    if (!f) return;
    fclose(f);
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "set -e; rm -rf vocab_bundle; git init -q --bare vocab_bundle; "
             "rev=$(git -C vocab_bundle bundle unbundle '%s' 2>/dev/null | head -1 | cut -d' ' "
             "-f1); for v in llama-bpe qwen2; do for e in '' .inp .out; do "
             "git -C vocab_bundle show \"$rev:models/ggml-vocab-$v.gguf$e\" > "
             "\"ggml-vocab-$v.gguf$e\"; done; done; rm -rf vocab_bundle",
             bundle);
    int rc = system(cmd);
    CHECK(rc == 0, "extracting llama.cpp's vocabularies from the bundle failed (%d)", rc);
    if (rc) return;
    static const char *const names[] = {"ggml-vocab-llama-bpe.gguf", "ggml-vocab-qwen2.gguf"};
    for (int k = 0; k < 2; k++) {
        tlm_tokenizer *t = NULL;
        CHECK_OK(tlm_tokenizer_load(names[k], &t));
        if (!t) continue;
        char inp[128], out[128];
        snprintf(inp, sizeof inp, "%s.inp", names[k]);
        snprintf(out, sizeof out, "%s.out", names[k]);
        int ok;
        int n = llamacpp_vectors(t, inp, out, 0, &ok);
        CHECK(n >= 40 && ok == n, "%s: %d/%d", names[k], ok, n);
        printf("llamacpp/%s: %d/%d cases\n", names[k], ok, n);
        /* the ends of a generation: EOS and the chat formats' ends, not their starts */
        static const char *const eog[2][3] = {{"<|end_of_text|>", "<|eot_id|>", "<|eot_id|>"},
                                              {"<|endoftext|>", "<|im_end|>", "<|im_end|>"}};
        static const char *const not_eog[2] = {"<|start_header_id|>", "<|im_start|>"};
        for (int e = 0; e < 3; e++) {
            int32_t id = tlm_tokenizer_find(t, eog[k][e], strlen(eog[k][e]));
            CHECK(id >= 0 && tlm_tokenizer_is_eog(t, id), "%s: %s (%d) ends a generation", names[k],
                  eog[k][e], id);
        }
        int32_t st = tlm_tokenizer_find(t, not_eog[k], strlen(not_eog[k]));
        CHECK(st >= 0 && !tlm_tokenizer_is_eog(t, st) && !tlm_tokenizer_is_eog(t, 1000),
              "%s: %s does not end one", names[k], not_eog[k]);
        /* Llama 3 starts texts with <|begin_of_text|> (128000); Qwen2 with none */
        CHECK(tlm_tokenizer_add_bos(t) == (k == 0) && (k || tlm_tokenizer_bos(t) == 128000),
              "%s: add_bos %d, bos %d", names[k], tlm_tokenizer_add_bos(t), tlm_tokenizer_bos(t));
        /* written into a GGUF and read back: the same ids for every string */
        io_gguf_writer w;
        io_gguf_writer_init(&w, 32);
        CHECK_OK(tok_gguf_write_vocab(&w, t));
        uint8_t *head = NULL;
        size_t len = 0;
        CHECK_OK(io_gguf_writer_header(&w, &head, &len));
        io_gguf_writer_free(&w);
        char rt[160];
        snprintf(rt, sizeof rt, "rt-%s", names[k]);
        CHECK_OK(core_write_file_atomic(rt, head, len));
        free(head);
        tlm_tokenizer *r = NULL;
        CHECK_OK(tlm_tokenizer_load(rt, &r));
        if (r) {
            n = llamacpp_vectors(r, inp, out, 0, &ok);
            CHECK(ok == n && tlm_tokenizer_add_bos(r) == tlm_tokenizer_add_bos(t),
                  "%s written and read back: %d/%d", names[k], ok, n);
        }
        tlm_tokenizer_free(r);
        r = NULL;
        /* and saved as a tlm tokenizer directory */
        CHECK_OK(tlm_tokenizer_save(t, "rt-vocab-dir"));
        CHECK_OK(tlm_tokenizer_load("rt-vocab-dir", &r));
        if (r) {
            n = llamacpp_vectors(r, inp, out, 0, &ok);
            CHECK(ok == n && tlm_tokenizer_add_bos(r) == tlm_tokenizer_add_bos(t),
                  "%s saved and loaded: %d/%d", names[k], ok, n);
        }
        tlm_tokenizer_free(r);
        tlm_tokenizer_free(t);
        CHECK(system("rm -rf rt-vocab-dir") == 0, "cleaning up");
        remove(rt);
        remove(names[k]);
        remove(inp);
        remove(out);
    }
}

int main(void) {
    const char *data = t_require_shared_data();
    test_reader();
    if (data) test_vocabs(data);
    test_bundle_vocabs();
    return t_finish("test_tokenizer_gguf");
}
