/* Tokenizer vectors and invariants: GPT-2 BPE against tiktoken and llama.cpp, llama2.c's
 * tokenizer.bin against run.c, lossless round trips on random bytes, streaming decode,
 * Unicode classes, malformed files. */
#include <sys/stat.h>
#include <unistd.h>

#include "tok_common.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/unicode.h"

static void test_gpt2_vectors(const tlm_tokenizer *tok, const char *dir) {
    cJSON *j = t_read_json(t_path(dir, "vectors/gpt2_encode.json"));
    if (!j) return;
    cJSON *cases = cJSON_GetObjectItem(j, "cases");
    int n = 0, ok_n = 0;
    for (cJSON *c = cases ? cases->child : NULL; c; c = c->next, n++) {
        const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
        cJSON *want = cJSON_GetObjectItem(c, "ids");
        int32_t *ids;
        size_t k;
        CHECK_OK(tlm_tokenizer_encode(tok, text, strlen(text), 0, &ids, &k));
        int ok = ids_equal(ids, k, want);
        CHECK(ok, "gpt2_encode case %d '%.50s'", n, text);
        if (!ok) print_ids("got", ids, k);
        ok_n += ok;
        char *back;
        size_t bl;
        CHECK_OK(tlm_tokenizer_decode(tok, ids, k, 0, &back, &bl));
        CHECK(bl == strlen(text) && memcmp(back, text, bl) == 0, "decode case %d", n);
        free(back);
        free(ids);
    }
    CHECK(n >= 20, "only %d cases in gpt2_encode.json", n);
    printf("gpt2_encode.json (encoder.json + vocab.bpe): %d/%d cases\n", ok_n, n);
    cJSON_Delete(j);
}

static void test_gpt2_specials(const tlm_tokenizer *tok) {
    const char *text = "a<|endoftext|>b";
    int32_t *ids;
    size_t k;
    CHECK_OK(tlm_tokenizer_encode(tok, text, strlen(text), TLM_ENCODE_ALLOW_SPECIAL, &ids, &k));
    CHECK(k == 3 && ids[0] == 64 && ids[1] == 50256 && ids[2] == 65, "allowed special: %zu ids", k);
    char *back;
    size_t bl;
    CHECK_OK(tlm_tokenizer_decode(tok, ids, k, 0, &back, &bl));
    CHECK(bl == strlen(text) && !memcmp(back, text, bl), "special round trip");
    free(back);
    CHECK_OK(tlm_tokenizer_decode(tok, ids, k, TLM_DECODE_SKIP_SPECIAL, &back, &bl));
    CHECK(bl == 2 && !memcmp(back, "ab", 2), "skip special");
    free(back);
    free(ids);
    CHECK_OK(tlm_tokenizer_encode(tok, text, strlen(text), 0, &ids, &k));
    CHECK(k > 3, "disallowed special is plain text (%zu ids)", k);
    for (size_t i = 0; i < k; i++) CHECK(ids[i] != 50256, "no special id when not allowed");
    free(ids);
    CHECK(tlm_tokenizer_bos(tok) == 50256 && tlm_tokenizer_eos(tok) == 50256, "gpt2 bos/eos");
    CHECK(tlm_tokenizer_vocab_size(tok) == 50257, "gpt2 vocab");
    CHECK(tlm_tokenizer_is_special(tok, 50256) && !tlm_tokenizer_is_special(tok, 0), "special");
}

static void test_tok512(const char *dir) {
    tlm_tokenizer *tok;
    CHECK_OK(tlm_tokenizer_load(t_path(dir, "models/tok512.bin"), &tok));
    if (!tok) return;
    CHECK(tlm_tokenizer_get_kind(tok) == TLM_TOKENIZER_SPM, "kind");
    CHECK(tlm_tokenizer_vocab_size(tok) == 512 && tlm_tokenizer_bos(tok) == 1 &&
              tlm_tokenizer_eos(tok) == 2,
          "tok512 sizes");
    cJSON *j = t_read_json(t_path(dir, "vectors/tok512_encode.json"));
    int n = 0, ok_n = 0;
    for (cJSON *c = j ? cJSON_GetObjectItem(j, "cases")->child : NULL; c; c = c->next, n++) {
        const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
        cJSON *want = cJSON_GetObjectItem(c, "ids_with_bos");
        int32_t *ids;
        size_t k;
        CHECK_OK(tlm_tokenizer_encode(tok, text, strlen(text), TLM_ENCODE_ADD_BOS, &ids, &k));
        int ok = ids_equal(ids, k, want);
        CHECK(ok, "tok512 case %d '%s'", n, text);
        if (!ok) print_ids("got", ids, k);
        ok_n += ok;
        char *back;
        size_t bl;
        CHECK_OK(tlm_tokenizer_decode(tok, ids, k, TLM_DECODE_SKIP_SPECIAL, &back, &bl));
        CHECK(bl == strlen(text) && memcmp(back, text, bl) == 0,
              "decode drops BOS and the dummy-prefix space: '%s'", back);
        free(back);
        free(ids);
    }
    CHECK(n >= 6, "tok512 cases %d", n);
    printf("tok512_encode.json: %d/%d cases\n", ok_n, n);
    cJSON_Delete(j);
    /* byte tokens decode to bytes */
    const char *p;
    size_t l;
    CHECK_OK(tlm_tokenizer_piece(tok, 3 + 0xE2, &p, &l));
    CHECK(l == 1 && (uint8_t)p[0] == 0xE2, "byte token piece");
    tlm_tokenizer_free(tok);
}

/* decode(encode(x)) == x on random bytes, biased towards text-like and UTF-8-like bytes. */
static void roundtrip_random(const tlm_tokenizer *tok, const char *name, unsigned eflags,
                             unsigned dflags, int rounds) {
    core_rng r;
    core_rng_seed(&r, 42, 7);
    int bad = 0;
    for (int it = 0; it < rounds; it++) {
        size_t n = core_rng_below(&r, 300);
        uint8_t buf[300];
        static const char alpha[] = " aeiou'sdtnl\n\t1 2.,!<|>";
        for (size_t i = 0; i < n; i++) {
            uint32_t k = core_rng_below(&r, 4);
            buf[i] = k == 0   ? (uint8_t)core_rng_u32(&r)
                     : k == 1 ? (uint8_t)(0x80 + core_rng_below(&r, 0x80))
                              : (uint8_t)alpha[core_rng_below(&r, sizeof alpha - 1)];
        }
        int32_t *ids;
        size_t k;
        if (tlm_tokenizer_encode(tok, buf, n, eflags, &ids, &k) != TLM_OK) {
            bad++;
            continue;
        }
        char *back;
        size_t bl;
        if (tlm_tokenizer_decode(tok, ids, k, dflags, &back, &bl) != TLM_OK || bl != n ||
            memcmp(back, buf, n) != 0)
            bad++;
        /* streaming decode gives the same bytes */
        tlm_decoder *d;
        tok_bytes acc = {0};
        if (tlm_decoder_new(tok, dflags, &d) == TLM_OK) {
            for (size_t i = 0; i < k; i++) {
                const char *p;
                size_t l;
                tlm_decoder_push(d, ids[i], &p, &l);
                tok_bytes_put(&acc, p, l);
            }
            const char *p;
            size_t l;
            tlm_decoder_flush(d, &p, &l);
            tok_bytes_put(&acc, p, l);
            if (acc.n != n || (n && memcmp(acc.p, buf, n) != 0)) bad++;
            tlm_decoder_free(d);
        }
        free(acc.p);
        free(back);
        free(ids);
    }
    CHECK(bad == 0, "%s: %d of %d random byte strings did not round-trip", name, bad, rounds);
}

static void test_streaming(const tlm_tokenizer *tok) {
    /* "🙂" is split by GPT-2 into several byte tokens: nothing may be printed mid-character */
    const char *text = "a\xF0\x9F\x99\x82"
                       "b";
    int32_t *ids;
    size_t k;
    CHECK_OK(tlm_tokenizer_encode(tok, text, strlen(text), 0, &ids, &k));
    tlm_decoder *d;
    CHECK_OK(tlm_decoder_new(tok, 0, &d));
    int split_ok = 1;
    for (size_t i = 0; i < k; i++) {
        const char *p;
        size_t l;
        tlm_decoder_push(d, ids[i], &p, &l);
        for (size_t j = 0; j < l; j++)
            if ((uint8_t)p[j] == 0xF0) split_ok &= l - j >= 4;
        if (l > 0 && ((uint8_t)p[l - 1] & 0xC0) == 0xC0) split_ok = 0;
    }
    CHECK(k >= 3 && split_ok, "streaming decoder never splits a character (%zu ids)", k);
    tlm_decoder_free(d);
    free(ids);
    /* an invalid byte followed by text is emitted, not held */
    CHECK_OK(tlm_decoder_new(tok, 0, &d));
    const char *p;
    size_t l;
    int32_t id_ff = tlm_tokenizer_find(tok, "\xFF", 1);
    CHECK_OK(tlm_decoder_push(d, id_ff, &p, &l));
    CHECK(l == 1 && (uint8_t)p[0] == 0xFF, "invalid byte emitted at once");
    int32_t id_e2 = tlm_tokenizer_find(tok, "\xE2", 1);
    CHECK_OK(tlm_decoder_push(d, id_e2, &p, &l));
    CHECK(l == 0, "lead byte held");
    tlm_decoder_flush(d, &p, &l);
    CHECK(l == 1 && (uint8_t)p[0] == 0xE2, "flush emits held bytes");
    CHECK(tlm_decoder_push(d, 1 << 30, &p, &l) == TLM_ERR_RANGE, "unknown id in decoder");
    tlm_decoder_free(d);
}

static void test_merge_paths(const tlm_tokenizer *tok) {
    core_rng r;
    core_rng_seed(&r, 3, 1);
    int bad = 0;
    for (int it = 0; it < 300; it++) {
        uint8_t buf[200];
        size_t n = 1 + core_rng_below(&r, 200);
        static const char alpha[] = "abcdeghilmnorst ";
        for (size_t i = 0; i < n; i++)
            buf[i] = it % 3 == 0 ? (uint8_t)core_rng_u32(&r)
                                 : (uint8_t)alpha[core_rng_below(&r, sizeof alpha - 1)];
        tok_ids a = {0}, b = {0};
        tok_bpe_merge_word(tok, buf, n > 128 ? 128 : n, &a, 0);
        tok_bpe_merge_word(tok, buf, n > 128 ? 128 : n, &b, 1);
        if (a.n != b.n || memcmp(a.p, b.p, a.n * sizeof *a.p) != 0) bad++;
        free(a.p);
        free(b.p);
    }
    CHECK(bad == 0, "heap and quadratic BPE merges differ on %d words", bad);
    /* a long pre-token (one run of digits) goes through the heap path and round-trips */
    size_t n = 100000;
    char *big = malloc(n);
    for (size_t i = 0; i < n; i++) big[i] = (char)('0' + (i * 7 + i / 13) % 10);
    int32_t *ids;
    size_t k;
    CHECK_OK(tlm_tokenizer_encode(tok, big, n, 0, &ids, &k));
    char *back;
    size_t bl;
    CHECK_OK(tlm_tokenizer_decode(tok, ids, k, 0, &back, &bl));
    CHECK(bl == n && memcmp(back, big, n) == 0, "long pre-token round trip");
    free(back);
    free(ids);
    free(big);
}

static void test_unicode_classes(void) {
    CHECK(tok_uni_class('a') == TOK_UNI_LETTER && tok_uni_class('7') == TOK_UNI_NUMBER, "ascii");
    CHECK(tok_uni_class(0xE9) == TOK_UNI_LETTER, "é is a letter");
    CHECK(tok_uni_class(0x65E5) == TOK_UNI_LETTER, "日 is a letter");
    CHECK(tok_uni_class(0xBD) == TOK_UNI_NUMBER, "½ is a number (No)");
    CHECK(tok_uni_class(0x663) == TOK_UNI_NUMBER, "Arabic-Indic 3 is a number (Nd)");
    CHECK(tok_uni_class(0x2167) == TOK_UNI_NUMBER, "Roman numeral 8 is a number (Nl)");
    CHECK(tok_uni_class(0x301) == TOK_UNI_OTHER, "combining acute is not a letter (Mn)");
    CHECK(tok_uni_class(0x1F642) == TOK_UNI_OTHER, "emoji is other");
    CHECK(tok_uni_class(0x3000) == TOK_UNI_SPACE && tok_uni_class(0x85) == TOK_UNI_SPACE &&
              tok_uni_class(0xA0) == TOK_UNI_SPACE,
          "Unicode white space");
    CHECK(tok_uni_class(0xFEFF) == TOK_UNI_OTHER && tok_uni_class(0x200B) == TOK_UNI_OTHER,
          "BOM and zero-width space are not White_Space");
    CHECK(tok_uni_class(0x1C) == TOK_UNI_OTHER, "file separator is not White_Space");
    uint32_t cp;
    CHECK(tok_utf8_next((const uint8_t *)"\xC0\x80", 2, &cp) == 1 && cp == TOK_UTF8_INVALID,
          "overlong rejected");
    CHECK(tok_utf8_next((const uint8_t *)"\xED\xA0\x80", 3, &cp) == 1 && cp == TOK_UTF8_INVALID,
          "surrogate rejected");
    CHECK(tok_utf8_next((const uint8_t *)"\xF4\x90\x80\x80", 4, &cp) == 1, "> U+10FFFF rejected");
    /* pre-token boundaries */
    const char *s = "I've  been\n\n 12ab!!";
    const char *want[] = {"I", "'ve", " ", " been", "\n\n", " 12", "ab", "!!"};
    size_t i = 0, n = strlen(s);
    int k = 0, ok = 1;
    while (i < n) {
        size_t j = tok_pretok_next((const uint8_t *)s, n, i);
        ok &= k < 8 && strlen(want[k]) == j - i && memcmp(want[k], s + i, j - i) == 0;
        k++;
        i = j;
    }
    CHECK(ok && k == 8, "pre-tokenization of '%s'", s);
}

static void expect_load_error(const char *path, tlm_status want, const char *needle) {
    tlm_tokenizer *t = NULL;
    tlm_status s = tlm_tokenizer_load(path, &t);
    CHECK(s == want && t == NULL, "loading %s: status %d (%s)", path, (int)s, tlm_last_error());
    CHECK(strstr(tlm_last_error(), needle) != NULL, "error '%s' should mention '%s'",
          tlm_last_error(), needle);
    tlm_tokenizer_free(t);
}

static void test_malformed(const tlm_tokenizer *gpt2) {
    char dir[] = "/tmp/tlm_tok_XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return;
    }
    char p[512];
    /* llama2.c tokenizer.bin with a length that runs past the end */
    uint8_t bin[32] = {0};
    uint32_t maxlen = 8;
    memcpy(bin, &maxlen, 4);
    int32_t len = 1000;
    memcpy(bin + 8, &len, 4);
    snprintf(p, sizeof p, "%s/trunc.bin", dir);
    t_write_file(p, bin, 16);
    expect_load_error(p, TLM_ERR_FORMAT, "length 1000");
    snprintf(p, sizeof p, "%s/short.bin", dir);
    t_write_file(p, bin, 2);
    expect_load_error(p, TLM_ERR_FORMAT, "too short");
    snprintf(p, sizeof p, "%s/half.bin", dir);
    t_write_file(p, bin, 9);
    expect_load_error(p, TLM_ERR_FORMAT, "truncated");
    /* GPT-2 files */
    char gd[600];
    snprintf(gd, sizeof gd, "%s/g", dir);
    mkdir(gd, 0777);
    char ej[700], vb[700];
    snprintf(ej, sizeof ej, "%s/encoder.json", gd);
    snprintf(vb, sizeof vb, "%s/vocab.bpe", gd);
    t_write_file(ej, "{\"a\": 0,", 8);
    t_write_file(vb, "#version: 0.2\n", 14);
    expect_load_error(gd, TLM_ERR_FORMAT, "JSON");
    t_write_file(ej, "{\"a\": 0, \"b\": 0}", 16);
    expect_load_error(gd, TLM_ERR_FORMAT, "two tokens");
    t_write_file(ej, "{\"a\": 0, \"b\": 7}", 16);
    expect_load_error(gd, TLM_ERR_FORMAT, "out of range");
    /* a complete byte alphabet but a merge with an unknown part */
    tok_bytes b = {0};
    tok_bytes_put(&b, "{", 1);
    for (int i = 0; i < 256; i++) {
        uint8_t c = (uint8_t)i;
        if (i) tok_bytes_put(&b, ",", 1);
        tok_bytes m = {0};
        tok_gpt2_map(&m, &c, 1);
        tok_json_string(&b, m.p, m.n);
        free(m.p);
        char num[16];
        snprintf(num, sizeof num, ":%d", i);
        tok_bytes_put(&b, num, strlen(num));
    }
    tok_bytes_put(&b, "}", 1);
    t_write_file(ej, b.p, b.n);
    t_write_file(vb, "#version: 0.2\nab c\n", 19);
    expect_load_error(gd, TLM_ERR_FORMAT, "not in the vocabulary");
    t_write_file(vb, "#version: 0.2\nabc\n", 18);
    expect_load_error(gd, TLM_ERR_FORMAT, "two tokens");
    /* missing a byte: drop the last entry (byte 0xFF) */
    b.p[b.n - 1] = 0;
    char *last = strrchr((char *)b.p, ',');
    *last = '}';
    t_write_file(ej, b.p, (size_t)(last - (char *)b.p) + 1);
    t_write_file(vb, "#version: 0.2\n", 14);
    expect_load_error(gd, TLM_ERR_FORMAT, "byte 0xFF");
    free(b.p);
    expect_load_error("/nonexistent/tok.bin", TLM_ERR_IO, "nonexistent");
    snprintf(p, sizeof p, "%s/empty", dir);
    mkdir(p, 0777);
    expect_load_error(p, TLM_ERR_IO, "holds no tokenizer");
    /* unknown ids, oversized input */
    int32_t bad[2] = {5, 50257};
    char *txt;
    size_t tl;
    CHECK(tlm_tokenizer_decode(gpt2, bad, 2, 0, &txt, &tl) == TLM_ERR_RANGE, "unknown id");
    CHECK(strstr(tlm_last_error(), "50257") != NULL, "error names the id: %s", tlm_last_error());
    bad[1] = -1;
    CHECK(tlm_tokenizer_decode(gpt2, bad, 2, 0, &txt, &tl) == TLM_ERR_RANGE, "negative id");
    const char *pc;
    size_t pl;
    CHECK(tlm_tokenizer_piece(gpt2, 99999, &pc, &pl) == TLM_ERR_RANGE, "piece of unknown id");
    int32_t *ids;
    size_t k;
    CHECK(tlm_tokenizer_encode(gpt2, "x", TLM_TOKENIZER_MAX_INPUT + (size_t)1, 0, &ids, &k) ==
              TLM_ERR_RANGE,
          "oversized input");
    CHECK(strstr(tlm_last_error(), "exceeds") != NULL, "oversize message: %s", tlm_last_error());
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0, "cleanup");
}

/* The sorted special-token table answers like the plain definition: the longest entry that is a
 * prefix of the text, the lowest id among equal ones; exact lookups likewise. Random tables over
 * a 3-letter alphabet (many shared prefixes, repeats) against a scan of every entry. */
static void test_special_table(void) {
    core_rng r;
    core_rng_seed(&r, 7, 1);
    int bad = 0, matched = 0;
    for (int round = 0; round < 300; round++) {
        int n = 1 + (int)core_rng_below(&r, 40);
        uint8_t bytes[40][6];
        tok_str s[40];
        for (int i = 0; i < n; i++) {
            s[i].len = 1 + core_rng_below(&r, 5);
            for (size_t k = 0; k < s[i].len; k++)
                bytes[i][k] = (uint8_t)('a' + core_rng_below(&r, 3));
            s[i].p = bytes[i];
            s[i].id = (int32_t)core_rng_below(&r, 1000);
        }
        tok_str sorted[40];
        memcpy(sorted, s, sizeof s);
        tok_strs_sort(sorted, (size_t)n);
        for (int q = 0; q < 20; q++) {
            uint8_t text[8];
            size_t tl = core_rng_below(&r, 8);
            for (size_t k = 0; k < tl; k++) text[k] = (uint8_t)('a' + core_rng_below(&r, 3));
            int want = -1; /* index into s */
            for (int i = 0; i < n; i++)
                if (s[i].len <= tl && !memcmp(s[i].p, text, s[i].len) &&
                    (want < 0 || s[i].len > s[want].len ||
                     (s[i].len == s[want].len && s[i].id < s[want].id)))
                    want = i;
            ptrdiff_t got = tok_strs_longest_prefix(sorted, (size_t)n, text, tl);
            if ((want < 0) != (got < 0) ||
                (want >= 0 && (sorted[got].id != s[want].id || sorted[got].len != s[want].len)))
                bad++;
            matched += want >= 0;
            int exact = -1;
            for (int i = 0; i < n; i++)
                if (s[i].len == tl && !memcmp(s[i].p, text, tl) &&
                    (exact < 0 || s[i].id < s[exact].id))
                    exact = i;
            ptrdiff_t f = tok_strs_find(sorted, (size_t)n, text, tl);
            if ((exact < 0) != (f < 0) || (exact >= 0 && sorted[f].id != s[exact].id)) bad++;
        }
    }
    CHECK(bad == 0 && matched > 1000, "%d mismatches (%d queries matched)", bad, matched);
}

int main(void) {
    const char *dir = t_require_shared_data();
    test_unicode_classes();
    test_special_table();
    if (dir) {
        tlm_tokenizer *gpt2 = NULL;
        CHECK_OK(tlm_tokenizer_load(t_path(dir, "tokenizers/gpt2"), &gpt2));
        if (gpt2) {
            test_gpt2_vectors(gpt2, dir);
            int ok_n;
            int n = llamacpp_vectors(
                gpt2, t_path(dir, "vectors/llamacpp/ggml-vocab-gpt-2.gguf.inp"),
                t_path(dir, "vectors/llamacpp/ggml-vocab-gpt-2.gguf.out"), 0, &ok_n);
            CHECK(n >= 40, "llama.cpp gpt-2 cases: %d", n);
            printf("llamacpp/ggml-vocab-gpt-2 strings (encoder.json + vocab.bpe): %d/%d cases\n",
                   ok_n, n);
            test_gpt2_specials(gpt2);
            test_streaming(gpt2);
            test_merge_paths(gpt2);
            roundtrip_random(gpt2, "gpt2", 0, 0, 400);
            roundtrip_random(gpt2, "gpt2 allow special", TLM_ENCODE_ALLOW_SPECIAL, 0, 200);
            test_malformed(gpt2);
            /* loading the pair of files directly */
            tlm_tokenizer *g2;
            CHECK_OK(tlm_tokenizer_load(t_path(dir, "tokenizers/gpt2/vocab.bpe"), &g2));
            CHECK(g2 && tlm_tokenizer_vocab_size(g2) == 50257, "load via vocab.bpe");
            tlm_tokenizer_free(g2);
        }
        tlm_tokenizer_free(gpt2);
        test_tok512(dir);
        tlm_tokenizer *spm;
        CHECK_OK(tlm_tokenizer_load(t_path(dir, "models/tok512.bin"), &spm));
        if (spm) {
            roundtrip_random(spm, "tok512", 0, 0, 400);
            roundtrip_random(spm, "tok512 with BOS", TLM_ENCODE_ADD_BOS, TLM_DECODE_SKIP_SPECIAL,
                             200);
            roundtrip_random(spm, "tok512 allow special", TLM_ENCODE_ALLOW_SPECIAL, 0, 200);
        }
        /* word-by-word encoding (the fast path) equals one pass over the whole text */
        char *txt;
        size_t n;
        if (spm && core_read_file(t_path(dir, "text/tinystories_2MiB.txt"), &txt, &n) == TLM_OK) {
            n = n > 300000 ? 300000 : n;
            int32_t *a, *b;
            size_t na, nb;
            CHECK(spm->spm_split == 1, "tok512 can be encoded word by word");
            CHECK_OK(tlm_tokenizer_encode(spm, txt, n, 0, &a, &na));
            spm->spm_split = 0;
            CHECK_OK(tlm_tokenizer_encode(spm, txt, n, 0, &b, &nb));
            spm->spm_split = 1;
            CHECK(na == nb && na > 0 && !memcmp(a, b, na * sizeof *a),
                  "segmented and whole-text SentencePiece encodings agree");
            free(a);
            free(b);
            free(txt);
        }
        tlm_tokenizer_free(spm);
    }
    return t_finish("test_tokenizer");
}
