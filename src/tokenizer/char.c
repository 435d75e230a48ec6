/* Char-level vocabulary: one id per distinct character of the training text. */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"
#include "unicode.h"

tlm_status tok_char_encode_text(const tlm_tokenizer *t, const uint8_t *s, size_t n, tok_ids *out) {
    tlm_status st = tok_ids_reserve(out, n);
    if (st) return st;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = tok_utf8_next(s + i, n - i, &cp);
        int32_t id = l == 1 ? t->byte_id[s[i]] : tok_map_find(t, s + i, l);
        if (id < 0) {
            if (cp == TOK_UTF8_INVALID)
                return core_err(TLM_ERR_ARG,
                                "byte 0x%02X at offset %zu is not in the char vocabulary", s[i], i);
            return core_err(TLM_ERR_ARG,
                            "character U+%04lX '%.*s' at byte offset %zu is not in the char "
                            "vocabulary",
                            (unsigned long)cp, (int)l, (const char *)s + i, i);
        }
        out->p[out->n++] = id;
        i += l;
    }
    return TLM_OK;
}

typedef struct {
    const uint8_t *p;
    size_t n;
} unit;

static int unit_cmp(const void *a, const void *b) {
    const unit *x = a, *y = b;
    size_t m = x->n < y->n ? x->n : y->n;
    int c = memcmp(x->p, y->p, m);
    if (c) return c;
    return x->n < y->n ? -1 : x->n > y->n;
}

/* Builds from a list of character units (each a UTF-8 character or one byte). */
tlm_status tok_build_char(const uint8_t *const *units, const size_t *lens, int32_t n,
                          tlm_tokenizer **out) {
    *out = NULL;
    tlm_tokenizer *t;
    tlm_status s = tok_alloc(&t, TLM_TOKENIZER_CHAR, n);
    if (s) return s;
    for (int32_t i = 0; i < n && !s; i++) {
        uint32_t cp;
        if (lens[i] == 0 || lens[i] > 4 || tok_utf8_next(units[i], lens[i], &cp) != lens[i]) {
            s = core_err(TLM_ERR_FORMAT, "char vocabulary entry %ld is not one character", (long)i);
            break;
        }
        s = tok_set_piece(t, i, units[i], lens[i]);
    }
    if (s || (s = tok_finish(t))) {
        tlm_tokenizer_free(t);
        return s;
    }
    for (int32_t i = 0; i < n; i++)
        if (t->off[i + 1] - t->off[i] == 1) {
            uint8_t b = t->data[t->off[i]]; /* read before t is freed for the message */
            if (t->byte_id[b] >= 0) {
                tlm_tokenizer_free(t);
                return core_err(TLM_ERR_FORMAT, "char vocabulary lists byte 0x%02X twice", b);
            }
            t->byte_id[b] = i;
        }
    *out = t;
    return TLM_OK;
}

tlm_status tlm_tokenizer_new_char(const void *text, size_t len, tlm_tokenizer **out) {
    *out = NULL;
    const uint8_t *s = text;
    if (len == 0) return core_err(TLM_ERR_ARG, "char vocabulary: the training text is empty");
    /* Distinct characters via a byte-indexed set for single bytes and a sorted list for the rest:
     * texts are large, alphabets small. */
    size_t single[256] = {0}; /* 1 + offset of the first occurrence */
    unit *multi = NULL;
    size_t nm = 0, cap = 0;
    tlm_status st = TLM_OK;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t l = tok_utf8_next(s + i, len - i, &cp);
        if (l == 1) {
            if (!single[s[i]]) single[s[i]] = i + 1;
        } else {
            /* cheap duplicate filter: most repeats are of the last few characters */
            int seen = 0;
            for (size_t k = nm; k > 0 && k + 8 > nm; k--)
                if (multi[k - 1].n == l && memcmp(multi[k - 1].p, s + i, l) == 0) seen = 1;
            if (!seen) {
                if (nm == cap) {
                    cap = cap ? cap * 2 : 256;
                    unit *nu = realloc(multi, cap * sizeof *nu);
                    if (!nu) {
                        free(multi);
                        return core_err(TLM_ERR_NOMEM, "out of memory");
                    }
                    multi = nu;
                }
                multi[nm++] = (unit){s + i, l};
                if (nm == cap) { /* compact: sort and dedupe */
                    qsort(multi, nm, sizeof *multi, unit_cmp);
                    size_t w = 0;
                    for (size_t k = 0; k < nm; k++)
                        if (w == 0 || unit_cmp(&multi[w - 1], &multi[k]) != 0)
                            multi[w++] = multi[k];
                    nm = w;
                    /* Keep at least half the room free: a list that stays nearly full would be
                     * sorted again every few characters (quadratic on a text with many distinct
                     * characters that repeat out of the recent-character filter's sight). */
                    if (nm > cap / 2) {
                        unit *nu = realloc(multi, 2 * cap * sizeof *nu);
                        if (!nu) {
                            free(multi);
                            return core_err(TLM_ERR_NOMEM, "out of memory");
                        }
                        multi = nu;
                        cap *= 2;
                    }
                }
            }
        }
        i += l;
    }
    unit *all = malloc((nm + 256) * sizeof *all);
    if (!all) {
        free(multi);
        return core_err(TLM_ERR_NOMEM, "out of memory");
    }
    size_t na = 0;
    for (int b = 0; b < 256; b++)
        if (single[b]) all[na++] = (unit){s + single[b] - 1, 1};
    if (nm) memcpy(all + na, multi, nm * sizeof *all);
    na += nm;
    qsort(all, na, sizeof *all, unit_cmp);
    size_t w = 0;
    for (size_t k = 0; k < na; k++)
        if (w == 0 || unit_cmp(&all[w - 1], &all[k]) != 0) all[w++] = all[k];
    const uint8_t **up = malloc(w * sizeof *up);
    size_t *ul = malloc(w * sizeof *ul);
    if (!up || !ul) {
        st = core_err(TLM_ERR_NOMEM, "out of memory");
    } else {
        for (size_t k = 0; k < w; k++) up[k] = all[k].p, ul[k] = all[k].n;
        st = tok_build_char(up, ul, (int32_t)w, out);
    }
    free(up);
    free(ul);
    free(all);
    free(multi);
    return st;
}
