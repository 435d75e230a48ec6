/* SentencePiece-style vocabularies (llama2.c tokenizer.bin, GGUF `llama`): pieces with scores,
 * merges of adjacent symbols by best score, byte fallback, dummy-prefix space. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "heap.h"
#include "tok_internal.h"
#include "unicode.h"

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* "<0xNN>" -> NN, else -1 */
static int byte_piece(const char *p, size_t n) {
    if (n != 6 || memcmp(p, "<0x", 3) != 0 || p[5] != '>') return -1;
    int hi = hexval(p[3]), lo = hexval(p[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

/* Trims the newlines llama2.c's exporter puts around <s> and </s>. */
static void trim_ws(const char **p, size_t *n) {
    while (*n && ((*p)[0] == '\n' || (*p)[0] == ' ')) (*p)++, (*n)--;
    while (*n && ((*p)[*n - 1] == '\n' || (*p)[*n - 1] == ' ')) (*n)--;
}

enum { GT_NORMAL = 1, GT_UNKNOWN = 2, GT_CONTROL = 3, GT_USER = 4, GT_UNUSED = 5, GT_BYTE = 6 };

tlm_status tok_build_spm(const char *const *pieces, const size_t *lens, const float *scores,
                         int32_t n, const int32_t *types, int space_marker, tlm_tokenizer **out) {
    *out = NULL;
    tlm_tokenizer *t;
    tlm_status s = tok_alloc(&t, TLM_TOKENIZER_SPM, n);
    if (s) return s;
    t->scores = malloc((size_t)n * sizeof(float));
    tok_bytes tmp = {0};
    if (!t->scores) {
        s = core_err(TLM_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int32_t i = 0; i < n; i++) {
        if (isnan(scores[i])) {
            s = core_err(TLM_ERR_FORMAT, "token %ld has a NaN score", (long)i);
            goto fail;
        }
        t->scores[i] = scores[i];
        const char *p = pieces[i];
        size_t l = lens[i];
        int type = types ? types[i] : GT_NORMAL;
        int b = byte_piece(p, l);
        if (!types && i <= 2) {
            const char *q = p;
            size_t ql = l;
            trim_ws(&q, &ql);
            static const char *const names[3] = {"<unk>", "<s>", "</s>"};
            if (ql == strlen(names[i]) && memcmp(q, names[i], ql) == 0) {
                type = i == 0 ? GT_UNKNOWN : GT_CONTROL;
                p = q;
                l = ql;
            }
        }
        if (type == GT_BYTE || (!types && b >= 0)) {
            if (b < 0) {
                s = core_err(TLM_ERR_FORMAT, "byte token %ld '%.*s' is not of the form <0xNN>",
                             (long)i, (int)(l > 40 ? 40 : l), p);
                goto fail;
            }
            uint8_t c = (uint8_t)b;
            if ((s = tok_set_piece(t, i, &c, 1))) goto fail;
            t->attr[i] = TOK_BYTE;
            if (t->byte_id[b] < 0) t->byte_id[b] = i;
            continue;
        }
        tmp.n = 0;
        if (space_marker && type != GT_CONTROL && type != GT_UNKNOWN) {
            for (size_t k = 0; k < l && !s;) {
                if (k + 3 <= l && memcmp(p + k, "\xE2\x96\x81", 3) == 0) {
                    s = tok_bytes_put(&tmp, " ", 1);
                    k += 3;
                } else {
                    s = tok_bytes_put(&tmp, p + k, 1);
                    k++;
                }
            }
        } else {
            s = tok_bytes_put(&tmp, p, l);
        }
        if (s || (s = tok_set_piece(t, i, tmp.p, tmp.n))) goto fail;
        if (type == GT_CONTROL || type == GT_USER || type == GT_UNKNOWN)
            t->attr[i] = TOK_SPECIAL;
        else if (type == GT_UNUSED)
            t->attr[i] = TOK_UNUSED;
        if (type == GT_UNKNOWN && t->unk < 0) t->unk = i;
    }
    if ((s = tok_finish(t))) goto fail;
    if (!types) {
        if (n > 1 && t->attr[1] == TOK_SPECIAL) t->bos = 1;
        if (n > 2 && t->attr[2] == TOK_SPECIAL) t->eos = 2;
    }
    t->add_prefix = 1;
    t->spm_split = 1;
    for (int32_t i = 0; i < n && t->spm_split; i++) {
        if (t->attr[i] != TOK_NORMAL) continue;
        size_t l;
        const uint8_t *q = tok_piece(t, i, &l);
        for (size_t k = 0; k + 1 < l; k++)
            if (q[k] != ' ' && q[k + 1] == ' ') {
                t->spm_split = 0;
                break;
            }
    }
    free(tmp.p);
    *out = t;
    return TLM_OK;
fail:
    free(tmp.p);
    tlm_tokenizer_free(t);
    return s;
}

tlm_status tok_load_llama2c_typed(const char *path, const int32_t *types, int32_t n_types,
                                  tlm_tokenizer **out) {
    *out = NULL;
    core_mmap m;
    tlm_status s = core_mmap_open(&m, path);
    if (s) return s;
    const char **pieces = NULL;
    size_t *lens = NULL;
    float *scores = NULL;
    size_t cap = 0, n = 0, pos = 4;
    if (m.size < 4) {
        s = core_err(TLM_ERR_FORMAT, "'%s' is too short for a llama2.c tokenizer", path);
        goto done;
    }
    uint32_t max_len;
    memcpy(&max_len, m.data, 4);
    while (pos < m.size) {
        if (m.size - pos < 8) {
            s = core_err(TLM_ERR_FORMAT, "'%s': token %zu is truncated at byte %zu", path, n, pos);
            goto done;
        }
        float sc;
        int32_t len;
        memcpy(&sc, m.data + pos, 4);
        memcpy(&len, m.data + pos + 4, 4);
        pos += 8;
        if (len < 0 || (size_t)len > m.size - pos) {
            s = core_err(TLM_ERR_FORMAT,
                         "'%s': token %zu has length %ld but only %zu bytes remain (not a llama2.c "
                         "tokenizer.bin?)",
                         path, n, (long)len, m.size - pos);
            goto done;
        }
        if ((uint32_t)len > max_len) {
            s = core_err(TLM_ERR_FORMAT, "'%s': token %zu is longer (%ld) than max_token_length %u",
                         path, n, (long)len, max_len);
            goto done;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 1024;
            if (cap > TOK_MAX_VOCAB * 2u) {
                s = core_err(TLM_ERR_FORMAT, "'%s': too many tokens", path);
                goto done;
            }
            const char **np = realloc(pieces, cap * sizeof *np);
            if (np) pieces = np;
            size_t *nl = realloc(lens, cap * sizeof *nl);
            if (nl) lens = nl;
            float *ns = realloc(scores, cap * sizeof *ns);
            if (ns) scores = ns;
            if (!np || !nl || !ns) {
                s = core_err(TLM_ERR_NOMEM, "out of memory");
                goto done;
            }
        }
        pieces[n] = (const char *)m.data + pos;
        lens[n] = (size_t)len;
        scores[n] = sc;
        n++;
        pos += (size_t)len;
    }
    if (n == 0) {
        s = core_err(TLM_ERR_FORMAT, "'%s' holds no tokens", path);
        goto done;
    }
    if (types && (size_t)n_types != n) {
        s = core_err(TLM_ERR_FORMAT, "'%s' holds %zu tokens, tokenizer.json describes %ld", path, n,
                     (long)n_types);
        goto done;
    }
    s = tok_build_spm(pieces, lens, scores, (int32_t)(n > TOK_MAX_VOCAB ? TOK_MAX_VOCAB + 1 : n),
                      types, 0, out);
    if (s) core_err_context(s, "loading '%s'", path);
done:
    free(pieces);
    free(lens);
    free(scores);
    core_mmap_close(&m);
    return s;
}

/* ---- encoding ---------------------------------------------------------------------------- */

typedef struct {
    float score;
    uint32_t left, right;
    uint32_t len; /* merged length: a changed symbol makes the candidate stale */
} spm_cand;

/* Highest score first, leftmost among equal scores. */
static inline int spm_before(const void *x, const void *y, const void *ctx) {
    const spm_cand *a = x, *b = y;
    (void)ctx;
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

typedef struct {
    uint32_t start, len, next, prev;
} spm_sym;

static void spm_try(const tlm_tokenizer *t, const uint8_t *buf, const spm_sym *sym, uint32_t l,
                    uint32_t r, spm_cand *h, size_t *hn) {
    uint32_t len = sym[l].len + sym[r].len;
    if (len > t->max_piece) return;
    int32_t id = tok_map_find(t, buf + sym[l].start, len);
    if (id < 0) return;
    spm_cand c = {t->scores[id], l, r, len};
    tok_heap_push(h, hn, sizeof *h, &c, spm_before, NULL);
}

/* Same result as llama2.c's encode() (repeatedly merge the best-scoring adjacent pair whose
 * concatenation is a piece, leftmost on ties) in O(n log n), over buf[0..n). sym and h hold n and
 * 3n entries. */
static tlm_status spm_segment(const tlm_tokenizer *t, const uint8_t *buf, size_t n, spm_sym *sym,
                              spm_cand *h, tok_ids *out) {
    uint32_t ns = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = tok_utf8_next(buf + i, n - i, &cp);
        sym[ns] = (spm_sym){(uint32_t)i, (uint32_t)l, ns + 1, ns - 1};
        ns++;
        i += l;
    }
    size_t hn = 0;
    for (uint32_t i = 0; i + 1 < ns; i++) spm_try(t, buf, sym, i, i + 1, h, &hn);
    while (hn) {
        spm_cand c;
        tok_heap_pop(h, &hn, sizeof *h, &c, spm_before, NULL);
        spm_sym *L = &sym[c.left], *R = &sym[c.right];
        if (L->len == 0 || R->len == 0 || L->next != c.right || L->len + R->len != c.len)
            continue; /* stale */
        L->len += R->len;
        R->len = 0;
        L->next = R->next;
        if (R->next < ns) sym[R->next].prev = c.left;
        if (c.left > 0) spm_try(t, buf, sym, L->prev, c.left, h, &hn);
        if (L->next < ns) spm_try(t, buf, sym, c.left, L->next, h, &hn);
    }
    tlm_status st = TLM_OK;
    for (uint32_t i = 0; i < ns && !st; i = sym[i].next) {
        int32_t id = tok_map_find(t, buf + sym[i].start, sym[i].len);
        if (id >= 0) {
            st = tok_ids_push(out, id);
            continue;
        }
        for (uint32_t k = 0; k < sym[i].len && !st; k++) {
            uint8_t b = buf[sym[i].start + k];
            int32_t bid = t->byte_id[b] >= 0 ? t->byte_id[b] : t->unk;
            if (bid < 0)
                st = core_err(TLM_ERR_ARG,
                              "cannot encode byte 0x%02X: the vocabulary has neither a piece, a "
                              "byte token nor <unk> for it",
                              b);
            else
                st = tok_ids_push(out, bid);
            if (t->byte_id[b] < 0) break; /* one <unk> per character */
        }
    }
    return st;
}

/* Where a segment may end: before a space that follows a non-space. When no piece contains a
 * non-space byte followed by a space (true of SentencePiece vocabularies, whose pieces only start
 * with spaces), no merge can cross such a point, and the best-first merges of the whole text are
 * the union of those of its segments: encoding word by word gives the same ids, with far better
 * locality than one heap over megabytes. */
static int seg_break(const uint8_t *b, size_t i) { return b[i] == ' ' && b[i - 1] != ' '; }

tlm_status tok_spm_encode_text(const tlm_tokenizer *t, const uint8_t *s, size_t n, tok_ids *out) {
    size_t total = n + (t->add_prefix ? 1 : 0);
    if (total > UINT32_MAX / 4) return core_err(TLM_ERR_RANGE, "text too long for this tokenizer");
    uint8_t *buf = malloc(total);
    if (!buf) return core_err(TLM_ERR_NOMEM, "out of memory encoding %zu bytes", n);
    if (t->add_prefix) buf[0] = ' ';
    memcpy(buf + (total - n), s, n);
    size_t maxseg = total;
    if (t->spm_split) {
        maxseg = 0;
        for (size_t i = 1, start = 0; i <= total; i++)
            if (i == total || seg_break(buf, i)) {
                if (i - start > maxseg) maxseg = i - start;
                start = i;
            }
    }
    spm_sym *sym = malloc(maxseg * sizeof *sym);
    spm_cand *h = malloc(maxseg * 3 * sizeof *h);
    tlm_status st = TLM_OK;
    if (!sym || !h) {
        st = core_err(TLM_ERR_NOMEM, "out of memory encoding %zu bytes", n);
    } else if (!t->spm_split) {
        st = spm_segment(t, buf, total, sym, h, out);
    } else {
        for (size_t i = 1, start = 0; i <= total && !st; i++)
            if (i == total || seg_break(buf, i)) {
                st = spm_segment(t, buf + start, i - start, sym, h, out);
                start = i;
            }
    }
    free(buf);
    free(sym);
    free(h);
    return st;
}

tlm_status tok_load_llama2c(const char *path, tlm_tokenizer **out) {
    return tok_load_llama2c_typed(path, NULL, 0, out);
}
