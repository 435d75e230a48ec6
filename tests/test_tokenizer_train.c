/* BPE training against the cs336 reference merges, saving and reloading, specials, threads;
 * char-level vocabularies. */
#include <sys/stat.h>
#include <unistd.h>

#include "tok_common.h"

static char g_tmp[64];

static const char *tmpdir(const char *name) {
    static char buf[4][256];
    static int k = 0;
    char *b = buf[k++ & 3];
    snprintf(b, 256, "%s/%s", g_tmp, name);
    return b;
}

/* Lines of a merges file after the optional #version header. */
static int read_lines(const char *path, char ***lines) {
    char *txt;
    size_t n;
    *lines = NULL;
    if (core_read_file(path, &txt, &n) != TLM_OK) return -1;
    int cnt = 0, cap = 1024;
    char **ls = malloc(cap * sizeof *ls);
    for (char *p = txt, *e; p < txt + n; p = e + 1) {
        e = memchr(p, '\n', (size_t)(txt + n - p));
        if (!e) e = txt + n;
        *e = 0;
        if (!(cnt == 0 && !strncmp(p, "#version", 8)) && *p) {
            if (cnt == cap) ls = realloc(ls, (cap *= 2) * sizeof *ls);
            ls[cnt++] = strdup(p);
        }
    }
    free(txt);
    *lines = ls;
    return cnt;
}

static void free_lines(char **ls, int n) {
    for (int i = 0; i < n; i++) free(ls[i]);
    free(ls);
}

static void test_reference(const char *data) {
    const char *corpus = t_path(data, "text/cs336/corpus.en");
    const char *specials[] = {"<|endoftext|>"};
    tlm_bpe_train_opts o = {.vocab_size = 500, .specials = specials, .n_specials = 1};
    tlm_tokenizer *t = NULL;
    CHECK_OK(tlm_tokenizer_train_bpe(&corpus, 1, &o, &t));
    if (!t) return;
    CHECK(tlm_tokenizer_vocab_size(t) == 500, "vocab %d", tlm_tokenizer_vocab_size(t));
    CHECK(tlm_tokenizer_is_special(t, 0), "special first");
    const char *p;
    size_t l;
    CHECK_OK(tlm_tokenizer_piece(t, 1, &p, &l));
    CHECK(l == 1 && p[0] == 0, "byte 0 follows the specials");
    const char *dir = tmpdir("cs336");
    CHECK_OK(tlm_tokenizer_save(t, dir));
    char **got, **want;
    int ng = read_lines(t_path(dir, "vocab.bpe"), &got);
    int nw = read_lines(t_path(data, "text/cs336/train-bpe-reference-merges.txt"), &want);
    CHECK(nw == 243 && ng == nw, "merge counts %d vs %d", ng, nw);
    int same = 0;
    for (int i = 0; i < ng && i < nw; i++) {
        int eq = !strcmp(got[i], want[i]);
        if (!eq && same == i)
            fprintf(stderr, "  first difference at merge %d: '%s' vs '%s'\n", i, got[i], want[i]);
        same += eq;
    }
    CHECK(same == nw, "%d of %d merges equal the reference", same, nw);
    printf("cs336 corpus.en vocab 500: %d/%d merges equal the reference\n", same, nw);
    free_lines(got, ng);
    free_lines(want, nw);
    /* the same set of tokens as the reference vocab (its byte order differs) */
    cJSON *rv = t_read_json(t_path(data, "text/cs336/train-bpe-reference-vocab.json"));
    cJSON *ev = t_read_json(t_path(dir, "encoder.json"));
    int found = 0, total = 0;
    for (cJSON *it = rv ? rv->child : NULL; it; it = it->next, total++)
        found += ev && cJSON_GetObjectItemCaseSensitive(ev, it->string) != NULL;
    CHECK(total == 500 && found == total, "%d of %d reference tokens present", found, total);
    cJSON_Delete(rv);
    cJSON_Delete(ev);
    /* reload: same encodings, specials preserved */
    tlm_tokenizer *r = NULL;
    CHECK_OK(tlm_tokenizer_load(dir, &r));
    if (r) {
        char *txt;
        size_t n;
        CHECK_OK(core_read_file(corpus, &txt, &n));
        int32_t *a, *b;
        size_t na, nb;
        CHECK_OK(tlm_tokenizer_encode(t, txt, n, TLM_ENCODE_ALLOW_SPECIAL, &a, &na));
        CHECK_OK(tlm_tokenizer_encode(r, txt, n, TLM_ENCODE_ALLOW_SPECIAL, &b, &nb));
        CHECK(na == nb && na > 0 && !memcmp(a, b, na * sizeof *a), "reloaded encodes the same");
        CHECK(na < n / 2, "BPE compresses: %zu ids for %zu bytes", na, n);
        char *back;
        size_t bl;
        CHECK_OK(tlm_tokenizer_decode(r, b, nb, 0, &back, &bl));
        CHECK(bl == n && !memcmp(back, txt, n), "round trip of the corpus");
        CHECK(tlm_tokenizer_is_special(r, 0) && tlm_tokenizer_eos(r) == 0 &&
                  tlm_tokenizer_bos(r) == 0,
              "special reloaded");
        free(back);
        free(a);
        free(b);
        free(txt);
    }
    tlm_tokenizer_free(r);
    tlm_tokenizer_free(t);
}

static void test_small(void) {
    tlm_bpe_train_opts d;
    memset(&d, 0x5a, sizeof d);
    tlm_bpe_train_opts_defaults(&d);
    CHECK(d.vocab_size == 50257 && d.n_specials == 1 && !strcmp(d.specials[0], "<|endoftext|>") &&
              d.threads == 0 && d.progress == NULL && d.user == NULL,
          "default BPE options");
    /* ties go to the lexicographically greater pair: (c, d) before (a, b) */
    const char *txt = "ab\ncd";
    size_t len = strlen(txt);
    tlm_bpe_train_opts o = {.vocab_size = 257};
    tlm_tokenizer *t = NULL;
    CHECK_OK(tlm_tokenizer_train_bpe_texts(&txt, &len, 1, &o, &t));
    const char *p;
    size_t l;
    CHECK(t && tlm_tokenizer_piece(t, 256, &p, &l) == TLM_OK && l == 2 && !memcmp(p, "cd", 2),
          "tie-break");
    tlm_tokenizer_free(t);
    /* specials split the text and never merge; overlapping specials: longest wins */
    const char *sp[] = {"<|a|>", "<|a|><|b|>"};
    const char *txt2 = "xy<|a|><|b|>xy<|a|>xy<|a|><|b|>xy<|a|>xy";
    len = strlen(txt2);
    tlm_bpe_train_opts o2 = {.vocab_size = 2 + 256 + 20, .specials = sp, .n_specials = 2};
    CHECK_OK(tlm_tokenizer_train_bpe_texts(&txt2, &len, 1, &o2, &t));
    if (!t) return;
    for (int32_t i = 2; i < tlm_tokenizer_vocab_size(t); i++) {
        tlm_tokenizer_piece(t, i, &p, &l);
        CHECK(!memchr(p, '|', l) || l == 1, "merged token %d contains part of a special", i);
    }
    CHECK(tlm_tokenizer_vocab_size(t) == 2 + 256 + 1, "only 'xy' can merge (vocab %d)",
          tlm_tokenizer_vocab_size(t));
    int32_t *ids;
    size_t n;
    const char *q = "<|a|><|b|>xy<|a|>";
    CHECK_OK(tlm_tokenizer_encode(t, q, strlen(q), TLM_ENCODE_ALLOW_SPECIAL, &ids, &n));
    CHECK(n == 3 && ids[0] == 1 && ids[1] == 258 && ids[2] == 0, "longest special wins");
    free(ids);
    CHECK_OK(tlm_tokenizer_encode(t, q, strlen(q), 0, &ids, &n));
    CHECK(n > 3, "specials as plain text when not allowed");
    free(ids);
    tlm_tokenizer_free(t);
    /* bad arguments */
    tlm_bpe_train_opts bad = {.vocab_size = 100};
    CHECK(tlm_tokenizer_train_bpe_texts(&txt, &len, 1, &bad, &t) == TLM_ERR_ARG, "vocab < 256");
    const char *rep[] = {"<|b|>", "<|a|>", "<|b|>"};
    tlm_bpe_train_opts ro = {.vocab_size = 300, .specials = rep, .n_specials = 3};
    CHECK(tlm_tokenizer_train_bpe_texts(&txt2, &len, 1, &ro, &t) == TLM_ERR_ARG &&
              strstr(tlm_last_error(), "'<|b|>' is repeated"),
          "repeated special: %s", tlm_last_error());
    const char *empty[] = {"<|a|>", ""};
    ro.specials = empty;
    ro.n_specials = 2;
    CHECK(tlm_tokenizer_train_bpe_texts(&txt2, &len, 1, &ro, &t) == TLM_ERR_ARG &&
              strstr(tlm_last_error(), "empty special"),
          "empty special: %s", tlm_last_error());
    const char *none = "/nonexistent/file.txt";
    o.vocab_size = 300;
    CHECK(tlm_tokenizer_train_bpe(&none, 1, &o, &t) == TLM_ERR_IO, "missing input");
}

static void test_threads(const char *data) {
    const char *f = t_path(data, "text/tinyshakespeare.txt");
    tlm_bpe_train_opts o = {.vocab_size = 600, .threads = 1};
    tlm_tokenizer *a = NULL, *b = NULL;
    CHECK_OK(tlm_tokenizer_train_bpe(&f, 1, &o, &a));
    o.threads = 2;
    CHECK_OK(tlm_tokenizer_train_bpe(&f, 1, &o, &b));
    CHECK(a && b && tok_same_pieces(a, b), "1 and 2 threads learn the same vocabulary");
    tlm_tokenizer_free(a);
    tlm_tokenizer_free(b);
}

static void test_char(const char *data) {
    char *txt;
    size_t n;
    CHECK_OK(core_read_file(t_path(data, "text/tinyshakespeare.txt"), &txt, &n));
    tlm_tokenizer *t = NULL;
    CHECK_OK(tlm_tokenizer_new_char(txt, n, &t));
    if (t) {
        CHECK(tlm_tokenizer_vocab_size(t) == 65, "shakespeare has 65 characters, got %d",
              tlm_tokenizer_vocab_size(t));
        CHECK(tlm_tokenizer_get_kind(t) == TLM_TOKENIZER_CHAR, "kind");
        const char *p;
        size_t l;
        tlm_tokenizer_piece(t, 0, &p, &l);
        CHECK(l == 1 && p[0] == '\n', "sorted: newline first");
        int32_t *ids;
        size_t k;
        CHECK_OK(tlm_tokenizer_encode(t, txt, n, 0, &ids, &k));
        CHECK(k == n, "one id per character");
        const char *dir = tmpdir("char");
        CHECK_OK(tlm_tokenizer_save(t, dir));
        tlm_tokenizer *r = NULL;
        CHECK_OK(tlm_tokenizer_load(dir, &r));
        if (r) {
            int32_t *ids2;
            size_t k2;
            CHECK_OK(tlm_tokenizer_encode(r, txt, n, 0, &ids2, &k2));
            CHECK(k2 == k && !memcmp(ids, ids2, k * sizeof *ids), "reloaded char vocab");
            free(ids2);
            CHECK(tlm_tokenizer_encode(r, "caf\xC3\xA9", 5, 0, &ids2, &k2) == TLM_ERR_ARG,
                  "unknown character");
            CHECK(strstr(tlm_last_error(), "U+00E9") != NULL, "names it: %s", tlm_last_error());
        }
        tlm_tokenizer_free(r);
        free(ids);
    }
    tlm_tokenizer_free(t);
    free(txt);
    /* multi-byte characters and bytes that are not UTF-8 survive save/load and round-trip */
    const char *mixed = "h\xC3\xA9llo \xF0\x9F\x99\x82 \xFF\xFE w\xC3\xB6rld \xE2\x82";
    size_t ml = strlen(mixed);
    CHECK_OK(tlm_tokenizer_new_char(mixed, ml, &t));
    if (t) {
        const char *dir = tmpdir("char2");
        CHECK_OK(tlm_tokenizer_save(t, dir));
        tlm_tokenizer *r = NULL;
        CHECK_OK(tlm_tokenizer_load(dir, &r));
        int32_t *ids;
        size_t k;
        char *back;
        size_t bl;
        if (r) {
            CHECK(tlm_tokenizer_vocab_size(r) == tlm_tokenizer_vocab_size(t), "same size");
            CHECK_OK(tlm_tokenizer_encode(r, mixed, ml, 0, &ids, &k));
            CHECK_OK(tlm_tokenizer_decode(r, ids, k, 0, &back, &bl));
            CHECK(bl == ml && !memcmp(back, mixed, ml), "char round trip with invalid UTF-8");
            free(ids);
            free(back);
        }
        tlm_tokenizer_free(r);
    }
    tlm_tokenizer_free(t);
    CHECK(tlm_tokenizer_new_char("", 0, &t) == TLM_ERR_ARG, "empty text");
    /* malformed tokenizer.json */
    const char *dir = tmpdir("badchar");
    mkdir(dir, 0777);
    FILE *f = fopen(t_path(dir, "tokenizer.json"), "w");
    fputs("{\"type\": \"char\", \"chars\": [\"ab\"]}", f);
    fclose(f);
    CHECK(tlm_tokenizer_load(dir, &t) == TLM_ERR_FORMAT, "multi-char entry rejected");
    f = fopen(t_path(dir, "tokenizer.json"), "w");
    fputs("{\"type\": \"char\", \"chars\": [\"a\", \"c\", \"b\", \"c\"]}", f);
    fclose(f);
    CHECK(tlm_tokenizer_load(dir, &t) == TLM_ERR_FORMAT &&
              strstr(tlm_last_error(), "lists byte 0x63 twice"),
          "repeated byte: %s", tlm_last_error());
    /* token types are checked before they are converted to integers */
    f = fopen(t_path(dir, "tokenizer.json"), "w");
    fputs("{\"type\": \"spm\", \"token_types\": [2, 3, 1e20]}", f);
    fclose(f);
    CHECK(tlm_tokenizer_load(dir, &t) == TLM_ERR_FORMAT &&
              strstr(tlm_last_error(), "token_types[2] is not a token type"),
          "token type out of range: %s", tlm_last_error());
    f = fopen(t_path(dir, "tokenizer.json"), "w");
    fputs("{\"type\": \"wordpiece\"}", f);
    fclose(f);
    CHECK(tlm_tokenizer_load(dir, &t) == TLM_ERR_FORMAT && strstr(tlm_last_error(), "wordpiece"),
          "unknown type: %s", tlm_last_error());
}

static void test_spm_save(const char *data) {
    tlm_tokenizer *t = NULL, *r = NULL;
    CHECK_OK(tlm_tokenizer_load(t_path(data, "models/tok512.bin"), &t));
    const char *dir = tmpdir("spm");
    if (t) CHECK_OK(tlm_tokenizer_save(t, dir));
    CHECK_OK(tlm_tokenizer_load(dir, &r));
    if (t && r) {
        const char *s = "Once upon a time, \xC3\x9C <s> there was";
        int32_t *a, *b;
        size_t na, nb;
        CHECK_OK(tlm_tokenizer_encode(t, s, strlen(s),
                                      TLM_ENCODE_ADD_BOS | TLM_ENCODE_ALLOW_SPECIAL, &a, &na));
        CHECK_OK(tlm_tokenizer_encode(r, s, strlen(s),
                                      TLM_ENCODE_ADD_BOS | TLM_ENCODE_ALLOW_SPECIAL, &b, &nb));
        CHECK(na == nb && !memcmp(a, b, na * sizeof *a), "saved llama2.c tokenizer reloads");
        CHECK(tlm_tokenizer_bos(r) == 1 && tlm_tokenizer_eos(r) == 2, "bos/eos kept");
        free(a);
        free(b);
    }
    tlm_tokenizer_free(t);
    tlm_tokenizer_free(r);
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/tlm_toktrain_XXXXXX");
    if (!mkdtemp(g_tmp)) return 1;
    const char *data = t_require_shared_data();
    test_small();
    if (data) {
        test_reference(data);
        test_threads(data);
        test_char(data);
        test_spm_save(data);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
    CHECK(system(cmd) == 0, "cleanup");
    return t_finish("test_tokenizer_train");
}
