/* Helpers shared by the tokenizer tests: comparing ids and vocabularies, llama.cpp's vector files.
 */
#ifndef TLM_TEST_TOK_COMMON_H
#define TLM_TEST_TOK_COMMON_H

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "harness.h"
#include "tlm.h"

static inline int ids_equal(const int32_t *a, size_t na, const cJSON *arr) {
    if ((size_t)cJSON_GetArraySize(arr) != na) return 0;
    size_t i = 0;
    for (const cJSON *it = arr->child; it; it = it->next, i++)
        if ((int32_t)it->valuedouble != a[i]) return 0;
    return 1;
}

/* Whether a and b have the same pieces, id for id. */
static inline int tok_same_pieces(const tlm_tokenizer *a, const tlm_tokenizer *b) {
    int same = tlm_tokenizer_vocab_size(a) == tlm_tokenizer_vocab_size(b);
    for (int32_t i = 0; same && i < tlm_tokenizer_vocab_size(a); i++) {
        const char *p, *q;
        size_t l, m;
        tlm_tokenizer_piece(a, i, &p, &l);
        tlm_tokenizer_piece(b, i, &q, &m);
        same = l == m && !memcmp(p, q, l);
    }
    return same;
}

static inline void print_ids(const char *label, const int32_t *a, size_t n) {
    fprintf(stderr, "  %s:", label);
    for (size_t i = 0; i < n && i < 64; i++) fprintf(stderr, " %d", a[i]);
    fprintf(stderr, "%s\n", n > 64 ? " ..." : "");
}

/* llama.cpp's test files: strings separated by "\n__ggml_vocab_test__\n" in .inp, one line of
 * space-separated ids per string in .out. Returns the number of cases checked; *passed counts
 * exact matches. */
static inline int llamacpp_vectors(const tlm_tokenizer *tok, const char *inp_path,
                                   const char *out_path, unsigned flags, int *passed) {
    char *inp, *out;
    size_t ni, no;
    *passed = 0;
    if (core_read_file(inp_path, &inp, &ni) != TLM_OK) {
        CHECK(0, "cannot read %s", inp_path);
        return 0;
    }
    if (core_read_file(out_path, &out, &no) != TLM_OK) {
        free(inp);
        CHECK(0, "cannot read %s", out_path);
        return 0;
    }
    const char *sep = "\n__ggml_vocab_test__\n";
    size_t seplen = strlen(sep);
    char *p = inp, *q = out;
    int cases = 0;
    for (;;) {
        char *e = strstr(p, sep);
        if (!e) break;
        char *ql = strchr(q, '\n');
        if (!ql) {
            CHECK(0, "%s has fewer lines than %s has strings", out_path, inp_path);
            break;
        }
        *ql = 0;
        int32_t want[4096];
        size_t nw = 0;
        for (char *r = q; *r;) {
            char *end;
            long v = strtol(r, &end, 10);
            if (end == r) break;
            if (nw < 4096) want[nw++] = (int32_t)v;
            r = end;
        }
        int32_t *ids;
        size_t n;
        tlm_status s = tlm_tokenizer_encode(tok, p, (size_t)(e - p), flags, &ids, &n);
        int ok = s == TLM_OK && n == nw && (n == 0 || memcmp(ids, want, n * sizeof *ids) == 0);
        CHECK(ok, "%s case %d '%.*s'", inp_path, cases, (int)(e - p > 60 ? 60 : e - p), p);
        if (!ok) {
            print_ids("want", want, nw);
            if (s == TLM_OK) print_ids("got ", ids, n);
        }
        *passed += ok;
        cases++;
        free(ids);
        p = e + seplen;
        q = ql + 1;
    }
    free(inp);
    free(out);
    return cases;
}

#endif
