/* Grammars (src/infer/grammar*.c, json_schema.c): GBNF parsing and its errors with line and
 * column, which strings a grammar accepts, UTF-8 split across tokens, masks equal to trying every
 * token one by one (a BPE vocabulary trained here with multi-byte merges and the 256 byte tokens,
 * and llama.cpp's SentencePiece and GPT-2 vocabularies), JSON Schema conversion and its refusals,
 * masks remembered per configuration equal to masks walked every time over random walks, and
 * generation through tlm_session_generate with a grammar on a random model. */
#include <stdlib.h>

#include "harness.h"
#include "infer/grammar.h"

static tlm_grammar *parse(const char *text) {
    tlm_grammar *g = NULL;
    tlm_status st = tlm_grammar_parse(text, strlen(text), &g);
    CHECK(st == TLM_OK && g, "'%s' refused: %s", text, tlm_last_error());
    return g;
}

/* 1 when the grammar accepts exactly text. */
static int accepts(const tlm_grammar *g, const char *text, size_t len) {
    tlm_grammar_state *s = NULL;
    if (tlm_grammar_state_new(g, NULL, &s)) return -1;
    int ok =
        tlm_grammar_state_accept_bytes(s, text, len) == TLM_OK && tlm_grammar_state_complete(s);
    tlm_grammar_state_free(s);
    return ok;
}

static void check_lists(const char *gbnf, const char *const *yes, const char *const *no) {
    tlm_grammar *g = parse(gbnf);
    if (!g) return;
    for (; *yes; yes++)
        CHECK(accepts(g, *yes, strlen(*yes)) == 1, "'%s' should accept '%s'", gbnf, *yes);
    for (; *no; no++)
        CHECK(accepts(g, *no, strlen(*no)) == 0, "'%s' should refuse '%s'", gbnf, *no);
    tlm_grammar_free(g);
}

static void test_accept(void) {
    check_lists("root ::= \"ab\" | \"c\"+", (const char *[]){"ab", "c", "ccc", NULL},
                (const char *[]){"", "a", "abc", "cd", "abab", NULL});
    check_lists("root ::= \"x\"{2,3} \"y\"{0,1} \"z\"{2}", (const char *[]){"xxzz", "xxxyzz", NULL},
                (const char *[]){"xzz", "xxxxzz", "xxyyzz", "xxz", NULL});
    check_lists("root ::= [^a-c]+",
                (const char *[]){"d", "\xC3\xA9", "\xE6\x97\xA5\xE6\x9C\xAC", NULL},
                (const char *[]){"", "a", "dc", NULL});
    check_lists("root ::= \"<\" . \">\"", (const char *[]){"<x>", "<\xE6\x97\xA5>", NULL},
                (const char *[]){"<>", "<xy>", NULL});
    check_lists("root ::= \"\\x41\\u00e9\\n\" [\\]\\-]",
                (const char *[]){"A\xC3\xA9\n]", "A\xC3\xA9\n-", NULL},
                (const char *[]){"A\xC3\xA9\n", "A\xC3\xA8\n]", NULL});
    /* comments, rules over several lines, groups, right recursion */
    check_lists("# balanced parentheses\n"
                "root ::= ( \"(\" root \")\" )* # any number\n"
                "\n"
                "other ::= \"a\" |\n"
                "    \"b\" (\n"
                "  \"c\" | \"d\"\n"
                ")\n",
                (const char *[]){"", "()", "(())()", NULL},
                (const char *[]){"(()", ")(", "a", NULL});
    check_lists("root ::= item (\",\" item)*\nitem ::= [0-9]+ | \"-\" item",
                (const char *[]){"1", "12,-3,--4", NULL}, (const char *[]){"1,", ",1", "-", NULL});
    check_lists("root ::= \"a\"? \"b\"*", (const char *[]){"", "a", "bbb", "abb", NULL},
                (const char *[]){"aa", "ba", NULL});
    check_lists("root ::= \"\" \"ab\"{0}  \"c\"", (const char *[]){"c", NULL},
                (const char *[]){"abc", NULL});
    check_lists("root ::= ( \"ab\" )+ \"ab\"+", (const char *[]){"abab", "ababab", NULL},
                (const char *[]){"ab", "aba", NULL});

    tlm_grammar *j = NULL;
    CHECK_OK(tlm_grammar_json(&j));
    if (j) {
        const char *yes[] = {"{}", "{\"a\": [1, 2.5e3, -0.5, true, null, \"x\\u00e9\\n\"]}",
                             "{ \"k\" : { \"n\" : [ ] } }", "{\n  \"a\": 1\n}",
                             "{\"\xC3\xA9\": \"\xE6\x97\xA5\"}"};
        const char *no[] = {"{\"a\":}",          "[1]",
                            "{\"a\": 01}",       "{\"a\" 1}",
                            "{\"a\": tru}",      "{'a': 1}",
                            "{\"a\": \"\x01\"}", "  {}",
                            "{\"a\": 1,}",       "{\"a\":                          1}"};
        for (size_t i = 0; i < sizeof yes / sizeof *yes; i++)
            CHECK(accepts(j, yes[i], strlen(yes[i])) == 1, "json: '%s'", yes[i]);
        for (size_t i = 0; i < sizeof no / sizeof *no; i++)
            CHECK(accepts(j, no[i], strlen(no[i])) == 0, "json refuses '%s'", no[i]);
    }
    tlm_grammar_free(j);
}

static void refuses(const char *text, const char *needle) {
    tlm_grammar *g = NULL;
    tlm_status st = tlm_grammar_parse(text, strlen(text), &g);
    CHECK(st == TLM_ERR_FORMAT && !g, "'%s' accepted (status %d)", text, (int)st);
    CHECK_ERROR_HAS(needle);
    tlm_grammar_free(g);
}

static void test_errors(void) {
    refuses("root ::= \"abc", "line 1, column 10: unterminated literal");
    refuses("root ::= \"a\"\nx ::= [a-", "line 2, column 7: unterminated character class");
    refuses("root ::= foo", "line 1, column 10: undefined rule 'foo'");
    refuses("root ::= expr\nexpr ::= expr \"+\" \"1\" | \"1\"",
            "line 1, column 10: rule 'expr' is left-recursive");
    refuses("root ::= a\na ::= b \"x\"\nb ::= \"y\"? a", "rule 'a' is left-recursive");
    refuses("root ::= ( \"x\"? )*", "is left-recursive");
    refuses("item ::= \"x\"", "no rule named 'root'");
    refuses("root ::= \"a\" )", "line 1, column 14: unexpected ')'");
    refuses("root ::=   * \"a\"", "line 1, column 12: '*' has nothing before it to repeat");
    refuses("root ::= \"a\"{3,2}", "line 1, column 13: {3,2}: the maximum is below the minimum");
    refuses("root ::= \"a\"{1000000}", "repetition count above");
    refuses("root ::= [^\\x00-\\U0010FFFF]", "'root' matches no string");
    refuses("root ::= r\nr ::= \"b\" r", "'root' matches no string");
    refuses("root ::= \"a\"\nroot ::= \"b\"", "line 2, column 1: rule 'root' is defined twice");
    refuses("root ::= \"\\q\"", "line 1, column 11: unknown escape '\\q'");
    refuses("root \"a\"", "line 1, column 6: expected '::='");
    refuses("root ::= [z-a]", "range end below its start");
    refuses("root ::= \"\\U00110000\"", "past U+10FFFF");
    refuses("root ::= \"a\"\n\xC3(", "line 2, column 1: expected a rule name");
    /* nesting past the bound: an error, not a deep recursion */
    size_t n = 5000;
    char *deep = malloc(2 * n + 32);
    strcpy(deep, "root ::= ");
    size_t at = strlen(deep);
    for (size_t i = 0; i < n; i++) deep[at++] = '(';
    deep[at++] = '"';
    deep[at++] = 'x';
    deep[at++] = '"';
    for (size_t i = 0; i < n; i++) deep[at++] = ')';
    deep[at] = 0;
    refuses(deep, "groups nested deeper than");
    free(deep);
    tlm_grammar *g = NULL;
    CHECK(tlm_grammar_parse(NULL, 0, &g) == TLM_ERR_ARG, "NULL text");
}

static void test_utf8_split(void) {
    tlm_grammar *g = parse("root ::= \"\xC3\xA9\" [a-z]");
    tlm_grammar_state *s = NULL;
    if (!g || tlm_grammar_state_new(g, NULL, &s)) goto done;
    CHECK_OK(tlm_grammar_state_accept_bytes(s, "\xC3", 1));
    CHECK(!tlm_grammar_state_complete(s), "half a character is not complete");
    CHECK(tlm_grammar_state_accept_bytes(s, "\xA8", 1) == TLM_ERR_RANGE, "e-grave is not e-acute");
    CHECK_OK(tlm_grammar_state_accept_bytes(s, "\xA9q", 2));
    CHECK(tlm_grammar_state_complete(s), "complete after e-acute q");
    tlm_grammar_state_reset(s);
    CHECK(tlm_grammar_state_accept_bytes(s, "\xC4", 1) == TLM_ERR_RANGE,
          "a lead byte whose characters the grammar cannot take");
    CHECK(tlm_grammar_state_accept_bytes(s, "\xA9", 1) == TLM_ERR_RANGE, "a stray continuation");
    CHECK(tlm_grammar_state_accept_bytes(s, "\xC0\x80", 2) == TLM_ERR_RANGE, "an overlong form");
    /* three bytes over three calls */
    tlm_grammar_free(g);
    g = parse("root ::= [\\u3000-\\u30FF]+");
    tlm_grammar_state_free(s);
    s = NULL;
    if (!g || tlm_grammar_state_new(g, NULL, &s)) goto done;
    const char *a = "\xE3\x81\x82\xE3\x81\x84"; /* two hiragana */
    for (int i = 0; i < 6; i++) {
        CHECK_OK(tlm_grammar_state_accept_bytes(s, a + i, 1));
        CHECK(tlm_grammar_state_complete(s) == (i == 2 || i == 5),
              "complete only after whole "
              "characters (byte %d)",
              i);
    }
    CHECK(tlm_grammar_state_accept_bytes(s, "\xE4", 1) == TLM_ERR_RANGE, "U+4xxx is outside");
done:
    tlm_grammar_state_free(s);
    tlm_grammar_free(g);
}

/* The mask after prefix against accepting each token in a fresh state; returns tokens allowed. */
static int check_mask(const tlm_grammar *g, const tlm_grammar_vocab *v, const tlm_tokenizer *t,
                      int n_ids, const char *prefix, size_t plen, const char *what) {
    tlm_grammar_state *s = NULL, *b = NULL;
    float *logits = malloc((size_t)n_ids * sizeof *logits);
    int allowed = -1, mismatches = 0, want_n = 0;
    if (!logits || tlm_grammar_state_new(g, v, &s) || tlm_grammar_state_new(g, v, &b)) goto done;
    CHECK_OK(tlm_grammar_state_accept_bytes(s, prefix, plen));
    for (int i = 0; i < n_ids; i++) logits[i] = 0.0f;
    CHECK_OK(tlm_grammar_state_mask(s, logits, n_ids, &allowed));
    for (int id = 0; id < n_ids; id++) {
        tlm_grammar_state_reset(b);
        int want = tlm_grammar_state_accept_bytes(b, prefix, plen) == TLM_OK &&
                   tlm_grammar_state_accept(b, id) == TLM_OK;
        int got = logits[id] == 0.0f;
        want_n += want;
        if (want != got && mismatches++ < 5) {
            const char *p = "";
            size_t l = 0;
            tlm_tokenizer_piece(t, id, &p, &l);
            CHECK(0, "%s, after '%.*s': token %d '%.*s' %s by the mask, %s one by one", what,
                  (int)plen, prefix, id, (int)l, p, got ? "allowed" : "refused",
                  want ? "allowed" : "refused");
        }
    }
    CHECK(mismatches == 0 && allowed == want_n, "%s: %d mismatches, %d allowed vs %d", what,
          mismatches, allowed, want_n);
done:
    free(logits);
    tlm_grammar_state_free(s);
    tlm_grammar_state_free(b);
    return allowed;
}

static const char *schema1 =
    "{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\", \"maxLength\": 6},"
    " \"age\": {\"type\": \"integer\"}, \"tags\": {\"type\": \"array\", \"items\": {\"enum\": "
    "[\"a\", \"b\\u00e9\", 3]}, \"maxItems\": 3}, \"ok\": {\"type\": [\"boolean\", \"null\"]}},"
    " \"required\": [\"name\", \"age\"]}";

static void test_masks(void) {
    /* a vocabulary with merges across JSON's symbols and every byte as a token of its own */
    const char *txt = "{\"name\": \"caf\xC3\xA9\", \"age\": 42, \"tags\": [\"a\", \"b\xC3\xA9\"], "
                      "\"ok\": true} {\"name\": \"\xE6\x97\xA5\xE6\x9C\xAC\", \"age\": -7} "
                      "\"\": [], {}, null, false, 1.5e3 \xF0\x9F\x98\x80";
    size_t len = strlen(txt);
    const char *sp[] = {"<|endoftext|>", "<|pad|>"};
    tlm_bpe_train_opts o = {.vocab_size = 2 + 256 + 120, .specials = sp, .n_specials = 2};
    tlm_tokenizer *t = NULL;
    CHECK_OK(tlm_tokenizer_train_bpe_texts(&txt, &len, 1, &o, &t));
    tlm_grammar *g = NULL, *j = NULL;
    CHECK_OK(tlm_grammar_from_json_schema(schema1, strlen(schema1), &g));
    CHECK_OK(tlm_grammar_json(&j));
    tlm_grammar_vocab *v = NULL;
    int n_ids = t ? tlm_tokenizer_vocab_size(t) + 3 : 0; /* a padded model vocabulary */
    if (t) CHECK_OK(tlm_grammar_vocab_new(t, n_ids, &v));
    if (!t || !g || !j || !v) goto done;
    /* tokens spanning symbols: the merges hold at least one piece crossing a quote */
    int spanning = 0;
    for (int id = 0; id < n_ids - 3; id++) {
        const char *p;
        size_t l;
        tlm_tokenizer_piece(t, id, &p, &l);
        spanning += l >= 2 && memchr(p, '"', l) && (p[0] != '"' || l > 2);
    }
    CHECK(spanning > 0, "no merged token spans a quote and more");
    const char *prefixes[] = {"",
                              "{",
                              "{\"",
                              "{\"name\": \"caf",
                              "{\"name\": \"caf\xC3",
                              "{\"name\": \"\xE6\x97",
                              "{\"name\": \"abcdef",
                              "{\"name\": \"x\", \"age\": 4",
                              "{\"name\": \"x\", \"age\": 0",
                              "{\"name\": \"x\", \"age\": 1, \"tags\": [\"b",
                              "{\"name\": \"x\", \"age\": 1, \"tags\": [3, 3, 3",
                              "{\"name\": \"x\",\n  \"age\": 1}",
                              "{\"name\": \"x\", \"age\": 1, \"ok\": nul"};
    int saw_end = 0;
    for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++) {
        int n = check_mask(g, v, t, n_ids, prefixes[i], strlen(prefixes[i]), "schema");
        CHECK(n > 0, "something is allowed after '%s'", prefixes[i]);
        tlm_grammar_state *s = NULL;
        if (!tlm_grammar_state_new(g, v, &s) &&
            !tlm_grammar_state_accept_bytes(s, prefixes[i], strlen(prefixes[i])) &&
            tlm_grammar_state_complete(s)) {
            /* the end of text token is allowed exactly here, and nothing is after it */
            saw_end = 1;
            CHECK_OK(tlm_grammar_state_accept(s, 0));
            float l[4] = {0};
            int na = -1;
            CHECK_OK(tlm_grammar_state_mask(s, l, 4, &na));
            CHECK(na == 0, "%d tokens allowed after the end", na);
        }
        tlm_grammar_state_free(s);
    }
    CHECK(saw_end, "one prefix is a complete object");
    const char *jp[] = {"",          "{\"a\": [",  "{\"a\": \"\xF0\x9F",
                        "{\"a\": 1", "{\"a\": 1}", "{\"a\": -"};
    for (size_t i = 0; i < sizeof jp / sizeof *jp; i++)
        check_mask(j, v, t, n_ids, jp[i], strlen(jp[i]), "json");
    /* what the mask says about particular tokens */
    tlm_grammar_state *s = NULL;
    if (!tlm_grammar_state_new(g, v, &s)) {
        CHECK(tlm_grammar_state_accept(s, 1) == TLM_ERR_RANGE, "a special token is never allowed");
        CHECK(tlm_grammar_state_accept(s, 0) == TLM_ERR_RANGE,
              "no end before the grammar is complete");
        CHECK(tlm_grammar_state_accept(s, n_ids - 1) == TLM_ERR_RANGE,
              "padding ids are never allowed");
        CHECK(tlm_grammar_state_accept(s, n_ids) == TLM_ERR_RANGE, "ids past the vocabulary");
        CHECK_ERROR_HAS("outside the vocabulary");
    }
    tlm_grammar_state_free(s);
done:
    tlm_grammar_vocab_free(v);
    tlm_grammar_free(g);
    tlm_grammar_free(j);
    tlm_tokenizer_free(t);
}

/* llama.cpp's vocabularies: SentencePiece (byte fallback tokens, pieces with leading spaces) and
 * GPT-2's byte-level BPE. */
static void test_masks_real(const char *dir) {
    const char *files[] = {"tokenizers/ggml-vocab-llama-spm.gguf",
                           "tokenizers/ggml-vocab-gpt-2.gguf"};
    for (int f = 0; f < 2; f++) {
        tlm_tokenizer *t = NULL;
        CHECK_OK(tlm_tokenizer_load(t_path(dir, files[f]), &t));
        if (!t) continue;
        tlm_grammar *g = NULL;
        tlm_grammar_vocab *v = NULL;
        int n = tlm_tokenizer_vocab_size(t);
        CHECK_OK(tlm_grammar_from_json_schema(schema1, strlen(schema1), &g));
        CHECK_OK(tlm_grammar_vocab_new(t, n, &v));
        const char *prefixes[] = {"", "{\"name\": \"", "{\"name\": \"\xE6\x97",
                                  "{\"name\": \"x\", \"age\": 12"};
        for (size_t i = 0; g && v && i < sizeof prefixes / sizeof *prefixes; i++)
            check_mask(g, v, t, n, prefixes[i], strlen(prefixes[i]), files[f]);
        tlm_grammar_vocab_free(v);
        tlm_grammar_free(g);
        tlm_tokenizer_free(t);
    }
}

/* Random walks through g with two states, one remembering masks and one walking every mask: the
 * masks must agree at every step. Each token is drawn uniformly from the allowed ones; where none
 * is, or after max_len tokens, both states start over (the memo outlives a reset). Returns the
 * masks the memo answered. */
static long memo_walk(const tlm_grammar *g, const tlm_grammar_vocab *v, int n_ids, int steps,
                      int max_len, const char *what) {
    tlm_grammar_state *a = NULL, *b = NULL;
    float *la = malloc((size_t)n_ids * sizeof *la), *lb = malloc((size_t)n_ids * sizeof *lb);
    int32_t *ok = malloc((size_t)n_ids * sizeof *ok);
    long hits = -1, misses = 0, b_hits = 0;
    size_t bytes = 0;
    if (!la || !lb || !ok || tlm_grammar_state_new(g, v, &a) || tlm_grammar_state_new(g, v, &b))
        goto done;
    infer_gram_state_fast(b, 0);
    int len = 0, resets = 0;
    for (int step = 0; step < steps; step++) {
        for (int i = 0; i < n_ids; i++) la[i] = lb[i] = 0.0f;
        int na = -1, nb = -2, diff = 0, n = 0;
        CHECK_OK(tlm_grammar_state_mask(a, la, n_ids, &na));
        CHECK_OK(tlm_grammar_state_mask(b, lb, n_ids, &nb));
        for (int id = 0; id < n_ids; id++) {
            diff += (la[id] == 0.0f) != (lb[id] == 0.0f);
            if (la[id] == 0.0f) ok[n++] = id;
        }
        if (diff || na != nb || n != na) {
            CHECK(0, "%s, step %d: the masks differ at %d ids (%d allowed against %d)", what, step,
                  diff, na, nb);
            break;
        }
        if (!n || len >= max_len) {
            tlm_grammar_state_reset(a);
            tlm_grammar_state_reset(b);
            len = 0;
            resets++;
            continue;
        }
        int32_t id = ok[t_rnd() % (uint32_t)n];
        tlm_status sa = tlm_grammar_state_accept(a, id), sb = tlm_grammar_state_accept(b, id);
        if (sa || sb) {
            CHECK(0, "%s, step %d: allowed token %d not accepted (%d, %d)", what, step, id, (int)sa,
                  (int)sb);
            break;
        }
        len++;
    }
    CHECK(resets > 0, "%s: the walks never restarted", what);
    infer_gram_state_memo_stats(a, &hits, &misses, &bytes);
    CHECK(bytes > 0 && bytes <= INFER_GRAM_MEMO_BYTES, "%s: the memo holds %zu bytes", what, bytes);
    infer_gram_state_memo_stats(b, &b_hits, NULL, NULL);
    CHECK(b_hits == 0, "%s: %ld masks answered without a memo", what, b_hits);
done:
    tlm_grammar_state_free(a);
    tlm_grammar_state_free(b);
    free(la);
    free(lb);
    free(ok);
    return hits;
}

/* Masks from the memo against masks walked: JSON with strings at every depth, inside arrays,
 * objects and keys (the same innermost position with different stacks below, and characters
 * split across tokens), a schema with bounded strings, and grammars whose configurations do not
 * come back (the memo evicts) or are too long to keep. */
static void test_memo(const char *dir) {
    const char *txt = "{\"name\": \"caf\xC3\xA9\", \"age\": 42, \"tags\": [\"a\", \"b\xC3\xA9\"], "
                      "\"ok\": true} {\"name\": \"\xE6\x97\xA5\xE6\x9C\xAC\", \"age\": -7} "
                      "\"\": [], {}, [[\"x\"], {\"k\": [\"\\\"\"]}], null, \"\\\\u00e9\" "
                      "\xF0\x9F\x98\x80 [\"end.\", \"so.\", \"yes!\"], {\"hi.\": \"x.\"}, "
                      "[\"a.\", \"b.\", \"c!\"], [\"d.\", \"e.\", \"f!\"]";
    size_t len = strlen(txt);
    const char *sp[] = {"<|endoftext|>"};
    tlm_bpe_train_opts o = {.vocab_size = 1 + 256 + 150, .specials = sp, .n_specials = 1};
    tlm_tokenizer *t = NULL;
    tlm_grammar *j = NULL, *g = NULL, *run = NULL, *deep = NULL;
    tlm_grammar_vocab *v = NULL;
    CHECK_OK(tlm_tokenizer_train_bpe_texts(&txt, &len, 1, &o, &t));
    CHECK_OK(tlm_grammar_json(&j));
    CHECK_OK(tlm_grammar_from_json_schema(schema1, strlen(schema1), &g));
    run = parse("root ::= [a-z0-9]{0,3000}");
    /* five ways to nest, each a stack of its own: keys of five times the depth */
    deep = parse("root ::= a | b | c | d | e\n"
                 "a ::= \"(\" a \")\" | \"x\"\nb ::= \"(\" b \"]\" | \"y\"\n"
                 "c ::= \"(\" c \"}\" | \"z\"\nd ::= \"(\" d \">\" | \"w\"\n"
                 "e ::= \"(\" e \"|\" | \"v\"");
    int n_ids = t ? tlm_tokenizer_vocab_size(t) + 2 : 0;
    if (t) CHECK_OK(tlm_grammar_vocab_new(t, n_ids, &v));
    if (!v || !j || !g || !run || !deep) goto done;
    t_seed(47);
    long h = memo_walk(j, v, n_ids, 4000, 80, "json");
    CHECK(h >= 1000, "json: the memo answered %ld masks of 4000", h);
    /* bounded strings: a configuration per character, fewer come back */
    memo_walk(g, v, n_ids, 4000, 60, "schema");
    /* thousands of configurations, most never met again: entries are evicted */
    memo_walk(run, v, n_ids, 400, 1000, "run");
    /* loops over classes that hold some plain characters but not all, or all and more, and a
     * run of plain characters that ends in a class of some */
    const char *loops[] = {"root ::= ( \"'\" [^'e]* \"'\" \" \"? )+",
                           "root ::= \"<\" ( . | \"\\\\\" \"q\" )* \">\"",
                           "root ::= ( \"'\" .{2} [a-c]* \"'\" \" \"? )+"};
    for (int i = 0; i < 3; i++) {
        tlm_grammar *lg = parse(loops[i]);
        if (lg) memo_walk(lg, v, n_ids, 1500, 80, loops[i]);
        tlm_grammar_free(lg);
    }
    /* past the key's bound nothing is kept, and the masks are still right */
    tlm_grammar_state *a = NULL, *b = NULL;
    float *la = malloc((size_t)n_ids * sizeof *la), *lb = malloc((size_t)n_ids * sizeof *lb);
    if (la && lb && !tlm_grammar_state_new(deep, v, &a) && !tlm_grammar_state_new(deep, v, &b)) {
        infer_gram_state_fast(b, 0);
        long hits = 0, misses = 0;
        size_t bytes = 0, bytes0 = 0;
        for (int depth = 0; depth < 1000; depth++) {
            if (depth == 10 || depth == 999) {
                infer_gram_state_memo_stats(a, NULL, NULL, &bytes0);
                for (int k = 0; k < 2; k++) {
                    int na = -1, nb = -2, diff = 0;
                    for (int i = 0; i < n_ids; i++) la[i] = lb[i] = 0.0f;
                    CHECK_OK(tlm_grammar_state_mask(a, la, n_ids, &na));
                    CHECK_OK(tlm_grammar_state_mask(b, lb, n_ids, &nb));
                    for (int i = 0; i < n_ids; i++) diff += la[i] != lb[i];
                    CHECK(diff == 0 && na == nb && na > 0, "nesting %d: %d ids differ", depth,
                          diff);
                }
                infer_gram_state_memo_stats(a, &hits, &misses, &bytes);
                if (depth == 10)
                    CHECK(hits == 1 && misses == 1 && bytes > bytes0,
                          "nesting 10: %ld hits, %ld misses, %zu bytes", hits, misses, bytes);
                else
                    CHECK(hits == 1 && misses == 3 && bytes == bytes0,
                          "nesting 999 (a key past the bound): %ld hits, %ld misses, %zu bytes "
                          "against %zu",
                          hits, misses, bytes, bytes0);
            }
            CHECK_OK(tlm_grammar_state_accept_bytes(a, "(", 1));
            CHECK_OK(tlm_grammar_state_accept_bytes(b, "(", 1));
        }
    }
    free(la);
    free(lb);
    tlm_grammar_state_free(a);
    tlm_grammar_state_free(b);
    /* a real vocabulary: the strings of bench/grammar's schema */
    if (dir) {
        const char *strings = "{\"type\": \"object\", \"properties\": {\"notes\": {\"type\": "
                              "\"array\", \"items\": {\"type\": \"string\"}, \"minItems\": 4}}, "
                              "\"required\": [\"notes\"]}";
        tlm_tokenizer *rt = NULL;
        tlm_grammar *rg = NULL;
        tlm_grammar_vocab *rv = NULL;
        CHECK_OK(tlm_tokenizer_load(t_path(dir, "tokenizers/ggml-vocab-llama-spm.gguf"), &rt));
        CHECK_OK(tlm_grammar_from_json_schema(strings, strlen(strings), &rg));
        int rn = rt ? tlm_tokenizer_vocab_size(rt) : 0;
        if (rt && rg && !tlm_grammar_vocab_new(rt, rn, &rv)) {
            h = memo_walk(rg, rv, rn, 120, 60, "llama-spm");
            CHECK(h >= 40, "llama-spm: the memo answered %ld masks of 120", h);
        }
        tlm_grammar_vocab_free(rv);
        tlm_grammar_free(rg);
        tlm_tokenizer_free(rt);
    }
done:
    tlm_grammar_vocab_free(v);
    tlm_grammar_free(j);
    tlm_grammar_free(g);
    tlm_grammar_free(run);
    tlm_grammar_free(deep);
    tlm_tokenizer_free(t);
}

static void schema_refused(const char *schema, tlm_status want, const char *needle) {
    tlm_grammar *g = NULL;
    tlm_status st = tlm_grammar_from_json_schema(schema, strlen(schema), &g);
    CHECK(st == want && !g, "schema '%.80s': status %d, want %d", schema, (int)st, (int)want);
    CHECK_ERROR_HAS(needle);
    tlm_grammar_free(g);
}

static void schema_lists(const char *schema, const char *const *yes, const char *const *no) {
    tlm_grammar *g = NULL;
    CHECK_OK(tlm_grammar_from_json_schema(schema, strlen(schema), &g));
    if (!g) return;
    for (; *yes; yes++)
        CHECK(accepts(g, *yes, strlen(*yes)) == 1, "%s should accept '%s'", schema, *yes);
    for (; *no; no++)
        CHECK(accepts(g, *no, strlen(*no)) == 0, "%s should refuse '%s'", schema, *no);
    tlm_grammar_free(g);
}

static void test_schemas(void) {
    schema_lists(
        schema1,
        (const char *[]){"{\"name\": \"ab\", \"age\": 3}",
                         "{\"name\":\"\",\"age\":-3,\"tags\":[\"a\",3],\"ok\":null}",
                         "{\"name\": \"ab\", \"age\": 3, \"ok\": false}",
                         "{\"name\": \"b\\u00e9\", \"age\": 0, \"tags\": []}", NULL},
        (const char *[]){"{\"age\": 3, \"name\": \"ab\"}", "{\"name\": \"abcdefg\", \"age\": 3}",
                         "{\"name\": \"ab\"}", "{\"name\": \"ab\", \"age\": 3, \"x\": 1}",
                         "{\"name\": \"ab\", \"age\": 3.5}",
                         "{\"name\": \"a\", \"age\": 3, \"tags\": [3, 3, 3, 3]}",
                         "{\"name\": \"a\", \"age\": 3, \"ok\": false, \"tags\": []}", NULL});
    /* optional properties only, additional ones with a schema, keys other than the declared */
    schema_lists("{\"properties\": {\"a\": {\"const\": 1}, \"ab\": {\"const\": 2}}, "
                 "\"additionalProperties\": {\"type\": \"boolean\"}}",
                 (const char *[]){"{}", "{\"ab\": 2}", "{\"a\": 1, \"ab\": 2}", "{\"b\": true}",
                                  "{\"a\": 1, \"abc\": false, \"x\": true}", "{\"\": true}", NULL},
                 (const char *[]){"{\"a\": true}", "{\"ab\": 2, \"a\": 1}", "{\"b\": 1}",
                                  "{\"ab\": true}", "{\"a\": 1, \"a\": 1}", NULL});
    schema_lists("{\"type\": \"array\", \"items\": {\"type\": \"number\"}, \"minItems\": 2, "
                 "\"maxItems\": 3}",
                 (const char *[]){"[1, 2]", "[1.5, -2e3, 0]", NULL},
                 (const char *[]){"[1]", "[1, 2, 3, 4]", "[1, \"2\"]", NULL});
    schema_lists(
        "{\"$defs\": {\"node\": {\"type\": \"object\", \"properties\": {\"v\": {\"type\": "
        "\"integer\"}, \"kids\": {\"type\": \"array\", \"items\": {\"$ref\": \"#/$defs/node\"}}}, "
        "\"required\": [\"v\"]}}, \"$ref\": \"#/$defs/node\"}",
        (const char *[]){"{\"v\": 1}", "{\"v\": 1, \"kids\": [{\"v\": 2, \"kids\": []}]}", NULL},
        (const char *[]){"{\"kids\": []}", "{\"v\": 1, \"kids\": [{}]}", NULL});
    schema_lists("{\"definitions\": {\"s\": {\"type\": \"string\", \"minLength\": 2}}, \"anyOf\": "
                 "[{\"$ref\": \"#/definitions/s\"}, {\"type\": \"null\"}]}",
                 (const char *[]){"\"ab\"", "null", "\"\\n\\t\"", NULL},
                 (const char *[]){"\"a\"", "1", NULL});
    schema_lists("{\"oneOf\": [{\"type\": \"integer\"}, {\"enum\": [\"x\", [1, {\"k\": null}]]}], "
                 "\"title\": \"t\", \"description\": \"d\"}",
                 (const char *[]){"7", "\"x\"", "[1,{\"k\":null}]", NULL},
                 (const char *[]){"\"y\"", "[1, {\"k\": null}]", NULL});
    schema_refused("{\"type\": \"string\", \"pattern\": \"^a\"}", TLM_ERR_UNSUPPORTED,
                   "unsupported keyword 'pattern'");
    schema_refused("{\"properties\": {\"d\": {\"type\": \"string\", \"format\": \"date\"}}}",
                   TLM_ERR_UNSUPPORTED, "at /properties/d: unsupported keyword 'format'");
    schema_refused("{\"type\": \"number\", \"minimum\": 0}", TLM_ERR_UNSUPPORTED, "'minimum'");
    schema_refused("{\"$ref\": \"#/$defs/missing\"}", TLM_ERR_FORMAT, "names no definition");
    schema_refused("{\"$ref\": \"http://x/y.json\"}", TLM_ERR_UNSUPPORTED, "only #/$defs/NAME");
    schema_refused("{\"type\": \"string\", \"maxLength\": 1000000000}", TLM_ERR_UNSUPPORTED,
                   "'maxLength' above");
    schema_refused("{\"type\": \"array\", \"minItems\": 3, \"maxItems\": 2}", TLM_ERR_FORMAT,
                   "below minItems");
    schema_refused("{\"type\": \"object\", \"required\": [\"a\"]}", TLM_ERR_UNSUPPORTED,
                   "'a' is not in 'properties'");
    schema_refused("{\"type\": \"tuple\"}", TLM_ERR_UNSUPPORTED, "unknown type 'tuple'");
    schema_refused("{\"$defs\": {\"a\": {\"$ref\": \"#/$defs/a\"}}, \"$ref\": \"#/$defs/a\"}",
                   TLM_ERR_FORMAT, "left-recursive");
    schema_refused("[1]", TLM_ERR_FORMAT, "a schema must be an object");
    schema_refused("{\"type\": ", TLM_ERR_FORMAT, "not valid JSON");
    /* nesting past the bound */
    char deep[2000] = "";
    for (int i = 0; i < 100; i++) strcat(deep, "{\"items\": ");
    strcat(deep, "{}");
    for (int i = 0; i < 100; i++) strcat(deep, "}");
    schema_refused(deep, TLM_ERR_RANGE, "nested deeper than");
}

#define REC_MAX 250
static struct {
    int32_t out[4][REC_MAX];
    int n[4];
} rec;

static int record(void *user, int seq, int32_t id) {
    (void)user;
    if (rec.n[seq] < REC_MAX) rec.out[seq][rec.n[seq]++] = id;
    return 0;
}

/* Batched generation with a grammar on a random model: every sequence's output is a sentence of
 * the grammar, each row following its own state. */
static void test_generate(void) {
    const char *txt =
        "{\"name\": \"ann\", \"age\": 42} {\"name\": \"bo\", \"age\": 7, \"tags\": [\"a\"]}";
    size_t len = strlen(txt);
    const char *sp[] = {"<|endoftext|>"};
    tlm_bpe_train_opts o = {.vocab_size = 1 + 256 + 40, .specials = sp, .n_specials = 1};
    tlm_tokenizer *t = NULL;
    CHECK_OK(tlm_tokenizer_train_bpe_texts(&txt, &len, 1, &o, &t));
    if (!t) return;
    tlm_config c;
    tlm_config_defaults(&c);
    c.vocab_size = tlm_tokenizer_vocab_size(t) + 5;
    c.context_length = 256;
    c.d_model = 32;
    c.n_layers = 1;
    c.n_heads = 2;
    tlm_model *m = t_model(&c, 3, TLM_INIT_XAVIER);
    tlm_grammar *g = NULL;
    tlm_grammar_vocab *v = NULL;
    tlm_session *s = NULL;
    CHECK_OK(tlm_grammar_from_json_schema(schema1, strlen(schema1), &g));
    CHECK_OK(tlm_grammar_vocab_new(t, c.vocab_size, &v));
    tlm_session_opts so = {.batch = 4};
    if (m) CHECK_OK(tlm_session_new(m, &so, &s));
    if (!m || !g || !v || !s) goto done;
    enum { B = 4 };
    memset(&rec, 0, sizeof rec);
    int32_t prompt[1] = {1};
    const int32_t *prompts[B] = {prompt, prompt, prompt, prompt};
    int lens[B] = {1, 1, 1, 1};
    tlm_generate_opts go;
    tlm_generate_opts_defaults(&go);
    go.max_new_tokens = REC_MAX;
    go.eos_id = 0;
    go.sampling.temperature = 1.0f;
    go.sampling.top_k = 0;
    go.sampling.top_p = 1.0f;
    go.sampling.seed = 11;
    go.grammar = g;
    go.grammar_vocab = v;
    go.on_token = record;
    go.user = &rec;
    tlm_stop_reason why[B];
    CHECK_OK(tlm_session_generate(s, prompts, lens, B, &go, why, NULL));
    int distinct = 0;
    for (int b = 0; b < B; b++) {
        CHECK(why[b] == TLM_STOP_EOS, "sequence %d stopped for reason %d after %d tokens", b,
              (int)why[b], rec.n[b]);
        CHECK(rec.n[b] >= 2 && rec.out[b][rec.n[b] - 1] == 0, "sequence %d ends with EOS", b);
        char *text = NULL;
        size_t tl = 0;
        CHECK_OK(tlm_tokenizer_decode(t, rec.out[b], (size_t)(rec.n[b] - 1), 0, &text, &tl));
        CHECK(text && accepts(g, text, tl) == 1,
              "sequence %d: '%s' is not a sentence of the grammar", b, text ? text : "");
        if (b && text) {
            char *prev = NULL;
            size_t pl = 0;
            tlm_tokenizer_decode(t, rec.out[b - 1], (size_t)(rec.n[b - 1] - 1), 0, &prev, &pl);
            distinct += !prev || pl != tl || memcmp(prev, text, tl);
            free(prev);
        }
        free(text);
    }
    CHECK(distinct > 0, "the rows sampled the same text");
    /* a grammar without its vocabulary is an argument error */
    go.grammar_vocab = NULL;
    CHECK(tlm_session_generate(s, prompts, lens, 1, &go, why, NULL) == TLM_ERR_ARG,
          "no vocabulary");
done:
    tlm_session_free(s);
    tlm_model_free(m);
    tlm_grammar_vocab_free(v);
    tlm_grammar_free(g);
    tlm_tokenizer_free(t);
}

int main(void) {
    test_accept();
    test_errors();
    test_utf8_split();
    test_masks();
    const char *dir = t_require_shared_data();
    if (dir) test_masks_real(dir);
    test_memo(dir);
    test_schemas();
    test_generate();
    return t_finish("test_grammar");
}
