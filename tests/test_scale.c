/* Untrusted files with very many entries load in O(n log n): each case builds an input whose
 * size made an earlier pairwise or linear-per-entry pass quadratic, large enough that such code
 * takes minutes (and CMakeLists.txt gives this test a short timeout), while the whole test runs
 * in a few seconds. Duplicates are still refused, naming the entry. Cases:
 *   GGUF with 200k keys / 200k tensors (duplicate checks, lookups of every entry);
 *   safetensors with 300k tensors (lookup of every tensor, duplicate names);
 *   a Hugging Face directory whose loader looks up 37k tensors among 87k (the 4096-layer cap
 *     bounds the lookups, so a linear search cost seconds here, not minutes);
 *   a GGUF vocabulary with 300k special tokens (sorting them, matching them in a long text);
 *   a GPT-2 tokenizer directory naming 400k specials in tokenizer.json;
 *   a char vocabulary of 65535 characters seen over and over. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"
#include "harness.h"
#include "io/gguf.h"
#include "io/gguf_writer.h"
#include "io/safetensors.h"
#include "tlm.h"
#include "tokenizer/tok_internal.h"

/* Header + zeroed data section of a writer; NULL on failure. */
static uint8_t *gguf_image(io_gguf_writer *w, size_t *len) {
    uint8_t *head;
    size_t hl;
    tlm_status s = io_gguf_writer_header(w, &head, &hl);
    CHECK(s == TLM_OK, "writer: %s", tlm_last_error());
    if (s) return NULL;
    uint8_t *f = calloc(1, hl + (size_t)w->data_size + 1);
    memcpy(f, head, hl);
    free(head);
    *len = hl + (size_t)w->data_size;
    return f;
}

#define N_KEYS 200000

static void test_gguf_keys(void) {
    for (int dup = 0; dup < 2; dup++) {
        io_gguf_writer w;
        io_gguf_writer_init(&w, 32);
        char k[64];
        for (int i = 0; i < N_KEYS; i++) {
            snprintf(k, sizeof k, "general.scale.key.%07d", dup && i == N_KEYS - 1 ? 4242 : i);
            io_gguf_write_u32(&w, k, (uint32_t)i * 3u);
        }
        size_t len = 0;
        uint8_t *f = gguf_image(&w, &len);
        io_gguf_writer_free(&w);
        if (!f) return;
        io_gguf *g = NULL;
        tlm_status s = io_gguf_open_memory(f, len, "keys.gguf", &g);
        if (dup) {
            CHECK(s == TLM_ERR_FORMAT && strstr(tlm_last_error(), "'general.scale.key.0004242'") &&
                      strstr(tlm_last_error(), "twice"),
                  "duplicate key: status %d, %s", (int)s, tlm_last_error());
        } else {
            CHECK_OK(s);
            int bad = 0;
            for (int i = 0; g && i < N_KEYS; i++) { /* a loader reading every key */
                snprintf(k, sizeof k, "general.scale.key.%07d", i);
                int64_t v = -1;
                if (io_gguf_get_int(g, k, &v) || v != (int64_t)i * 3) bad++;
            }
            CHECK(g && bad == 0, "%d of %d keys wrong", bad, N_KEYS);
            CHECK(g && io_gguf_find(g, "general.scale.key") == NULL, "prefix is not a key");
        }
        io_gguf_close(g);
        free(f);
    }
}

#define N_TENSORS 200000

static void test_gguf_tensors(void) {
    for (int dup = 0; dup < 2; dup++) {
        io_gguf_writer w;
        io_gguf_writer_init(&w, 32);
        char name[64];
        for (int i = 0; i < N_TENSORS; i++) {
            uint64_t dims[1] = {(uint64_t)(i % 7 + 1)};
            snprintf(name, sizeof name, "blk.%d.ffn_gate.weight",
                     dup && i == N_TENSORS - 1 ? 77 : i);
            io_gguf_write_tensor(&w, name, 1, dims, 0, dims[0] * 4);
        }
        size_t len = 0;
        uint8_t *f = gguf_image(&w, &len);
        io_gguf_writer_free(&w);
        if (!f) return;
        io_gguf *g = NULL;
        tlm_status s = io_gguf_open_memory(f, len, "tensors.gguf", &g);
        if (dup) {
            CHECK(s == TLM_ERR_FORMAT && strstr(tlm_last_error(), "'blk.77.ffn_gate.weight'") &&
                      strstr(tlm_last_error(), "twice"),
                  "duplicate tensor: status %d, %s", (int)s, tlm_last_error());
        } else {
            CHECK_OK(s);
            int bad = 0;
            for (int i = 0; g && i < N_TENSORS; i++) { /* a loader finding every tensor */
                snprintf(name, sizeof name, "blk.%d.ffn_gate.weight", i);
                const io_gguf_tensor *t = io_gguf_find_tensor(g, name);
                if (!t || t != &g->tensors[i] || t->dims[0] != (uint64_t)(i % 7 + 1)) bad++;
            }
            CHECK(g && bad == 0, "%d of %d tensors wrong", bad, N_TENSORS);
        }
        io_gguf_close(g);
        free(f);
    }
}

/* A safetensors file of n one-float tensors named by fmt and the index (the last one named by
 * dup_of instead when dup_of >= 0), its JSON header written directly: cJSON's printer would take
 * longer than the reader under test. */
static void st_many(const char *path, int n, const char *fmt, int dup_of) {
    size_t cap = (size_t)n * 128 + 64, len = 8;
    char *h = malloc(cap);
    len += (size_t)snprintf(h + len, cap - len, "{");
    for (int i = 0; i < n; i++) {
        char name[96];
        snprintf(name, sizeof name, fmt, dup_of >= 0 && i == n - 1 ? dup_of : i);
        len +=
            (size_t)snprintf(h + len, cap - len,
                             "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[%d,%d]}",
                             i ? "," : "", name, 4 * i, 4 * i + 4);
    }
    len += (size_t)snprintf(h + len, cap - len, "}");
    uint64_t hl = len - 8;
    for (int i = 0; i < 8; i++) h[i] = (char)(hl >> (8 * i));
    char *f = calloc(1, len + (size_t)n * 4);
    memcpy(f, h, len);
    CHECK(t_write_file(path, f, len + (size_t)n * 4), "write %s", path);
    free(f);
    free(h);
}

#define N_ST 300000

static void test_safetensors(void) {
    /* names differ only after a long common prefix, as a real model's do within a layer */
    const char *fmt = "model.language_model.layers.mlp.experts.gate_proj.weight.%07d";
    st_many("scale.safetensors", N_ST, fmt, -1);
    io_st_file f;
    CHECK_OK(io_st_open(&f, "scale.safetensors"));
    if (f.n == N_ST) {
        int bad = 0;
        char name[96];
        for (int i = 0; i < N_ST; i++) { /* a loader finding every tensor */
            snprintf(name, sizeof name, fmt, i);
            const io_st_tensor *t = io_st_find(&f, name);
            if (!t || strcmp(t->name, name) || t->begin != (size_t)i * 4) bad++;
        }
        CHECK(bad == 0, "%d of %d tensors not found", bad, N_ST);
        CHECK(io_st_find(&f, "model.language_model") == NULL, "prefix is not a tensor");
        io_st_close(&f);
    }
    st_many("scale.safetensors", 1000, fmt, 432);
    tlm_status s = io_st_open(&f, "scale.safetensors");
    CHECK(s == TLM_ERR_FORMAT &&
              strstr(tlm_last_error(),
                     "'model.language_model.layers.mlp.experts.gate_proj.weight.0000432'") &&
              strstr(tlm_last_error(), "twice"),
          "duplicate: status %d, %s", (int)s, tlm_last_error());
    remove("scale.safetensors");
}

/* A 4096-layer Llama of width 2 whose file also holds 50k other tensors and lacks
 * model.norm.weight: the loader looks up all 36865 layer tensors before refusing it. */
static void test_hf_lookups(void) {
    const int L = 4096, junk = 50000;
    mkdir("scale_hf", 0777);
    const char *cfg = "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 2, "
                      "\"intermediate_size\": 1, \"num_hidden_layers\": 4096, "
                      "\"num_attention_heads\": 1, \"vocab_size\": 1, "
                      "\"max_position_embeddings\": 8}";
    CHECK(t_write_file("scale_hf/config.json", cfg, strlen(cfg)), "config.json");
    int n = junk + 1 + 9 * L;
    io_st_out_tensor *t = calloc((size_t)n, sizeof *t);
    char *names = malloc((size_t)n * 64);
    static const float zeros[4];
    static const struct {
        const char *name;
        int d0, d1;
    } per_layer[9] = {
        {"input_layernorm", 2, 0},  {"self_attn.q_proj", 2, 2}, {"self_attn.k_proj", 2, 2},
        {"self_attn.v_proj", 2, 2}, {"self_attn.o_proj", 2, 2}, {"post_attention_layernorm", 2, 0},
        {"mlp.gate_proj", 1, 2},    {"mlp.up_proj", 1, 2},      {"mlp.down_proj", 2, 1}};
    int k = 0;
    /* first in the file, sharing the real names' prefix: a linear search walks past them all */
    for (int i = 0; i < junk; i++, k++) {
        snprintf(names + (size_t)k * 64, 64, "model.layers.%d.self_attn.q_proj.weight.%d", i % L,
                 i);
        t[k] = (io_st_out_tensor){names + (size_t)k * 64, TLM_DTYPE_F32, 1, {1}, zeros};
    }
    t[k++] = (io_st_out_tensor){"model.embed_tokens.weight", TLM_DTYPE_F32, 2, {1, 2}, zeros};
    for (int l = 0; l < L; l++)
        for (int j = 0; j < 9; j++, k++) {
            snprintf(names + (size_t)k * 64, 64, "model.layers.%d.%s.weight", l, per_layer[j].name);
            int nd = per_layer[j].d1 ? 2 : 1;
            t[k] = (io_st_out_tensor){names + (size_t)k * 64,
                                      TLM_DTYPE_F32,
                                      nd,
                                      {per_layer[j].d0, per_layer[j].d1},
                                      zeros};
        }
    CHECK_OK(io_st_write("scale_hf/model.safetensors", t, n, NULL, NULL, 0));
    free(t);
    free(names);
    tlm_model *m = NULL;
    tlm_status s = tlm_model_load("scale_hf", 0, &m);
    CHECK(s == TLM_ERR_FORMAT && !m &&
              strstr(tlm_last_error(), "missing tensor 'model.norm.weight'"),
          "status %d: %s", (int)s, tlm_last_error());
    tlm_model_free(m);
    remove("scale_hf/model.safetensors");
    remove("scale_hf/config.json");
    rmdir("scale_hf");
}

#define N_SPECIALS 300000

/* A SentencePiece-style GGUF vocabulary: <unk>, a space, '<', then N_SPECIALS control tokens
 * "<0>", "<1>", ... (longer ones later, the order that made an insertion sort quadratic). */
static void test_gguf_specials(void) {
    int n = 3 + N_SPECIALS;
    io_gguf_writer w;
    io_gguf_writer_init(&w, 32);
    io_gguf_write_str(&w, "tokenizer.ggml.model", "llama");
    io_gguf_write_array(&w, "tokenizer.ggml.tokens", IO_GGUF_STRING, (uint64_t)n);
    io_gguf_write_elem_str(&w, "<unk>", 5);
    io_gguf_write_elem_str(&w, "\xE2\x96\x81", 3);
    io_gguf_write_elem_str(&w, "<", 1);
    char p[32];
    for (int i = 0; i < N_SPECIALS; i++) {
        int l = snprintf(p, sizeof p, "<%d>", i);
        io_gguf_write_elem_str(&w, p, (size_t)l);
    }
    io_gguf_write_array(&w, "tokenizer.ggml.scores", IO_GGUF_F32, (uint64_t)n);
    for (int i = 0; i < n; i++) io_gguf_write_elem_f32(&w, 0.0f);
    io_gguf_write_array(&w, "tokenizer.ggml.token_type", IO_GGUF_I32, (uint64_t)n);
    for (int i = 0; i < n; i++) io_gguf_write_elem_i32(&w, i == 0 ? 2 : i < 3 ? 1 : 3);
    size_t len = 0;
    uint8_t *f = gguf_image(&w, &len);
    io_gguf_writer_free(&w);
    if (!f) return;
    CHECK(t_write_file("specials.gguf", f, len), "write");
    free(f);
    tlm_tokenizer *t = NULL;
    CHECK_OK(tlm_tokenizer_load("specials.gguf", &t));
    remove("specials.gguf");
    if (!t) return;
    CHECK(tlm_tokenizer_find(t, "<299999>", 8) == 3 + 299999, "find a special");
    CHECK(tlm_tokenizer_find(t, "<29999", 6) == -1, "a prefix of a special is not a token");
    int32_t *ids = NULL;
    size_t nid = 0;
    const char *text = "<17><<<299999><1000000>";
    CHECK_OK(tlm_tokenizer_encode(t, text, strlen(text), TLM_ENCODE_ALLOW_SPECIAL, &ids, &nid));
    /* "<17>", then " <<" (dummy prefix after a special), "<299999>", then " <1000000>" as text:
     * no special is that long, so '<' then digits and '>' as <unk> */
    int32_t want[] = {3 + 17, 1, 2, 2, 3 + 299999, 1, 2, 0, 0, 0, 0, 0, 0, 0, 0};
    CHECK(nid == sizeof want / sizeof *want && !memcmp(ids, want, sizeof want), "%zu ids, first %d",
          nid, nid ? ids[0] : -1);
    free(ids);
    /* 300k '<': every position starts like 300k specials and none matches */
    size_t L = 300000;
    char *lt = malloc(L);
    memset(lt, '<', L);
    CHECK_OK(tlm_tokenizer_encode(t, lt, L, TLM_ENCODE_ALLOW_SPECIAL, &ids, &nid));
    int bad = nid != L + 1 || ids[0] != 1;
    for (size_t i = 1; i < nid && !bad; i++) bad = ids[i] != 2;
    CHECK(!bad, "%zu ids for %zu '<'", nid, L);
    free(ids);
    free(lt);
    tlm_tokenizer_free(t);
}

#define N_NAMED 400000

/* encoder.json with the 256 bytes and N_NAMED tokens "<i>", no merges, and a tlm tokenizer.json
 * that lists every one of them as a special. */
static void test_dir_specials(void) {
    mkdir("scale_tok", 0777);
    size_t cap = (size_t)N_NAMED * 24 + 8192, n = 0;
    char *enc = malloc(cap), *tj = malloc(cap);
    n += (size_t)snprintf(enc + n, cap - n, "{");
    int id = 0;
    for (int b = 0; b < 256; b++) {
        /* GPT-2's alphabet: printable Latin-1 stands for itself, the rest from U+0100 */
        unsigned cp = b <= 0x20                ? 256u + (unsigned)b
                      : b >= 0x7F && b <= 0xA0 ? 256u + 33u + (unsigned)(b - 0x7F)
                      : b == 0xAD              ? 256u + 67u
                                               : (unsigned)b;
        char u[8];
        if (cp < 0x80) {
            if (cp == '"' || cp == '\\')
                snprintf(u, sizeof u, "\\%c", (char)cp);
            else
                snprintf(u, sizeof u, "%c", (char)cp);
        } else {
            snprintf(u, sizeof u, "%c%c", (char)(0xC0 | (cp >> 6)), (char)(0x80 | (cp & 0x3F)));
        }
        n += (size_t)snprintf(enc + n, cap - n, "%s\"%s\": %d", b ? ", " : "", u, id++);
    }
    size_t m = (size_t)snprintf(tj, cap, "{\"type\": \"bpe\", \"specials\": [");
    for (int i = 0; i < N_NAMED; i++) {
        n += (size_t)snprintf(enc + n, cap - n, ", \"<%d>\": %d", i, id++);
        m += (size_t)snprintf(tj + m, cap - m, "%s\"<%d>\"", i ? ", " : "", i);
    }
    n += (size_t)snprintf(enc + n, cap - n, "}");
    m += (size_t)snprintf(tj + m, cap - m, "]}");
    const char *bpe = "#version: 0.2\n";
    CHECK(t_write_file("scale_tok/encoder.json", enc, n) &&
              t_write_file("scale_tok/vocab.bpe", bpe, strlen(bpe)) &&
              t_write_file("scale_tok/tokenizer.json", tj, m),
          "write");
    free(enc);
    free(tj);
    tlm_tokenizer *t = NULL;
    CHECK_OK(tlm_tokenizer_load("scale_tok", &t));
    if (t) {
        CHECK(tlm_tokenizer_vocab_size(t) == 256 + N_NAMED, "vocab %d",
              (int)tlm_tokenizer_vocab_size(t));
        CHECK(tlm_tokenizer_is_special(t, 256 + 123456), "listed special");
        int32_t *ids = NULL;
        size_t nid = 0;
        CHECK_OK(tlm_tokenizer_encode(t, "<123456><7>", 11, TLM_ENCODE_ALLOW_SPECIAL, &ids, &nid));
        CHECK(nid == 2 && ids[0] == 256 + 123456 && ids[1] == 256 + 7, "%zu ids", nid);
        free(ids);
        tlm_tokenizer_free(t);
    }
    remove("scale_tok/encoder.json");
    remove("scale_tok/vocab.bpe");
    remove("scale_tok/tokenizer.json");
    rmdir("scale_tok");
}

/* 65535 distinct 4-byte characters, then the same again eight times: the set of characters seen
 * stays one short of its capacity, where it used to be re-sorted for every character. */
static void test_char_vocab(void) {
    const size_t D = 65535, reps = 9;
    uint8_t *text = malloc(D * 4 * reps);
    size_t n = 0;
    for (size_t r = 0; r < reps; r++)
        for (size_t i = 0; i < D; i++) {
            uint32_t cp = 0x10000 + (uint32_t)i;
            text[n++] = (uint8_t)(0xF0 | (cp >> 18));
            text[n++] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
            text[n++] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
            text[n++] = (uint8_t)(0x80 | (cp & 0x3F));
        }
    tlm_tokenizer *t = NULL;
    CHECK_OK(tlm_tokenizer_new_char(text, n, &t));
    if (t) {
        CHECK(tlm_tokenizer_vocab_size(t) == (int32_t)D, "vocab %d",
              (int)tlm_tokenizer_vocab_size(t));
        tlm_tokenizer_free(t);
    }
    free(text);
}

/* BPE merges a file could choose so that their pair keys agree in the bits a multiplicative hash
 * of the bare key used (the same second token, first tokens 128 apart): once one cluster that every
 * insertion walked. The table now mixes the whole key with a per-process secret. */
static void test_merge_table(void) {
    enum { N = 200000 };
    tok_pairmap m;
    CHECK_OK(tok_pairmap_init(&m, N));
    if (!m.keys) return;
    for (int32_t i = 0; i < N; i++) tok_pairmap_put(&m, i * 128, 5, (uint32_t)i, i);
    int ok = 1;
    for (int32_t i = 0; i < N; i += 997) {
        uint32_t r;
        int32_t id;
        ok &= tok_pairmap_get(&m, i * 128, 5, &r, &id) && r == (uint32_t)i && id == i;
        ok &= !tok_pairmap_get(&m, i * 128 + 1, 5, &r, &id);
    }
    CHECK(ok, "merge table lookups");
    /* The longest run of occupied slots stays short: no cluster. */
    size_t run = 0, worst = 0;
    for (size_t k = 0; k <= m.mask; k++) {
        run = m.keys[k] != ~0ull ? run + 1 : 0;
        worst = run > worst ? run : worst;
    }
    CHECK(worst < 200, "longest probe run %zu slots", worst);
    tok_pairmap_free(&m);
}

int main(void) {
    test_merge_table();
    test_gguf_keys();
    test_gguf_tensors();
    test_safetensors();
    test_hf_lookups();
    test_gguf_specials();
    test_dir_specials();
    test_char_vocab();
    return t_finish("test_scale");
}
