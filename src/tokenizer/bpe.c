/* Byte-level BPE (GPT-2): the bytes-to-unicode alphabet, loading encoder.json + vocab.bpe,
 * pre-tokenization and merging by rank. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "heap.h"
#include "tok_internal.h"
#include "unicode.h"

/* ---- GPT-2's bytes-to-unicode alphabet ------------------------------------------------------
 * Printable Latin-1 bytes stand for themselves; the 68 others (0x00-0x20, 0x7F-0xA0, 0xAD) map in
 * order to U+0100.. so that every token is printable text. */

uint32_t tok_byte_to_cp(uint8_t b) {
    if (b <= 0x20) return 256u + b;
    if (b >= 0x7F && b <= 0xA0) return 256u + 33u + (b - 0x7Fu);
    if (b == 0xAD) return 256u + 67u;
    return b;
}

static int cp_to_byte(uint32_t cp) {
    if (cp < 256) return tok_byte_to_cp((uint8_t)cp) == cp ? (int)cp : -1;
    uint32_t k = cp - 256;
    if (k < 33) return (int)k;
    if (k < 67) return (int)(0x7F + (k - 33));
    if (k == 67) return 0xAD;
    return -1;
}

long tok_gpt2_unmap(const char *s, size_t len, uint8_t *out) {
    const uint8_t *p = (const uint8_t *)s;
    size_t i = 0, o = 0;
    while (i < len) {
        uint32_t cp;
        size_t l = tok_utf8_next(p + i, len - i, &cp);
        if (cp == TOK_UTF8_INVALID) return -1;
        int b = cp_to_byte(cp);
        if (b < 0) return -1;
        out[o++] = (uint8_t)b;
        i += l;
    }
    return (long)o;
}

tlm_status tok_gpt2_map(tok_bytes *b, const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint8_t u[4];
        size_t l = tok_utf8_put(tok_byte_to_cp(p[i]), u);
        tlm_status s = tok_bytes_put(b, u, l);
        if (s) return s;
    }
    return TLM_OK;
}

/* ---- building from GPT-2 strings ---------------------------------------------------------- */

/* GGUF token types */
enum { GT_NORMAL = 1, GT_UNKNOWN = 2, GT_CONTROL = 3, GT_USER = 4, GT_UNUSED = 5, GT_BYTE = 6 };

tlm_status tok_build_bpe(const char *const *tokens, const size_t *token_lens, int32_t n,
                         const char *const *merges, const size_t *merge_lens, int32_t n_merges,
                         const int32_t *types, tlm_tokenizer **out) {
    *out = NULL;
    tlm_tokenizer *t;
    tlm_status s = tok_alloc(&t, TLM_TOKENIZER_BPE, n);
    if (s) return s;
    size_t maxlen = 0;
    for (int32_t i = 0; i < n; i++)
        if (token_lens[i] > maxlen) maxlen = token_lens[i];
    for (int32_t i = 0; i < n_merges; i++)
        if (merge_lens[i] > maxlen) maxlen = merge_lens[i];
    uint8_t *buf = malloc(maxlen * 2 + 1);
    uint8_t *produced = calloc((size_t)n, 1);
    if (!buf || !produced) {
        s = core_err(TLM_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int32_t i = 0; i < n && !s; i++) {
        int type = types ? types[i] : GT_NORMAL;
        long l = tok_gpt2_unmap(tokens[i], token_lens[i], buf);
        if (l < 0) {
            /* added tokens of some vocabularies are stored as raw text */
            if (type != GT_CONTROL && type != GT_USER && type != GT_UNUSED && type != GT_UNKNOWN) {
                s = core_err(TLM_ERR_FORMAT, "token %ld '%.*s' is not in GPT-2's byte alphabet",
                             (long)i, (int)(token_lens[i] > 60 ? 60 : token_lens[i]), tokens[i]);
                break;
            }
            memcpy(buf, tokens[i], token_lens[i]);
            l = (long)token_lens[i];
        }
        s = tok_set_piece(t, i, buf, (size_t)l);
        if (type == GT_CONTROL || type == GT_USER || type == GT_UNKNOWN)
            t->attr[i] = TOK_SPECIAL;
        else if (type == GT_UNUSED)
            t->attr[i] = TOK_UNUSED;
    }
    if (s || (s = tok_finish(t))) goto fail;
    s = tok_pairmap_init(&t->merges, (size_t)n_merges);
    if (s) goto fail;
    t->merge_list = malloc(((size_t)n_merges + 1) * sizeof *t->merge_list);
    if (!t->merge_list) {
        s = core_err(TLM_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int32_t r = 0; r < n_merges; r++) {
        const char *m = merges[r];
        size_t ml = merge_lens[r];
        const char *sp = ml > 1 ? memchr(m + 1, ' ', ml - 1) : NULL;
        if (!sp) {
            s = core_err(TLM_ERR_FORMAT, "merge %ld '%.*s' is not two tokens separated by a space",
                         (long)r, (int)(ml > 60 ? 60 : ml), m);
            goto fail;
        }
        size_t la = (size_t)(sp - m), lb = ml - la - 1;
        long ba = tok_gpt2_unmap(m, la, buf);
        long bb = ba < 0 ? -1 : tok_gpt2_unmap(sp + 1, lb, buf + ba);
        if (ba < 0 || bb < 0) {
            s = core_err(TLM_ERR_FORMAT, "merge %ld '%.*s' is not in GPT-2's byte alphabet",
                         (long)r, (int)(ml > 60 ? 60 : ml), m);
            goto fail;
        }
        int32_t a = tok_map_find(t, buf, (size_t)ba);
        int32_t b = tok_map_find(t, buf + ba, (size_t)bb);
        int32_t c = tok_map_find(t, buf, (size_t)(ba + bb));
        if (a < 0 || b < 0 || c < 0) {
            s = core_err(TLM_ERR_FORMAT, "merge %ld '%.*s': %s is not in the vocabulary", (long)r,
                         (int)(ml > 60 ? 60 : ml), m,
                         a < 0   ? "its first part"
                         : b < 0 ? "its second part"
                                 : "the merged token");
            goto fail;
        }
        tok_pairmap_put(&t->merges, a, b, (uint32_t)r, c);
        t->merge_list[r][0] = a;
        t->merge_list[r][1] = b;
        produced[c] = 1;
    }
    t->n_merges = n_merges;
    if (!types) {
        /* encoder.json does not say which tokens are special: a multi-byte token that no merge
         * produces can never come out of the encoder, so it is a special like <|endoftext|>. */
        int changed = 0;
        for (int32_t i = 0; i < n; i++)
            if (t->attr[i] == TOK_NORMAL && !produced[i] && t->off[i + 1] - t->off[i] > 1) {
                t->attr[i] = TOK_SPECIAL;
                changed = 1;
            }
        if (changed && (s = tok_finish(t))) goto fail;
    }
    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        t->byte_id[b] = tok_map_find(t, &c, 1);
        if (t->byte_id[b] < 0) {
            s = core_err(TLM_ERR_FORMAT,
                         "the vocabulary has no token for byte 0x%02X, so not every text can be "
                         "encoded",
                         b);
            goto fail;
        }
    }
    int32_t eot = tlm_tokenizer_find(t, "<|endoftext|>", 13);
    if (eot >= 0 && t->attr[eot] == TOK_SPECIAL) t->bos = t->eos = eot;
    free(buf);
    free(produced);
    *out = t;
    return TLM_OK;
fail:
    free(buf);
    free(produced);
    tlm_tokenizer_free(t);
    return s;
}

/* ---- loading encoder.json + vocab.bpe ---------------------------------------------------- */

tlm_status tok_load_gpt2(const char *encoder_json, const char *vocab_bpe, tlm_tokenizer **out) {
    *out = NULL;
    char *ej = NULL, *vb = NULL;
    size_t ejn, vbn;
    cJSON *root = NULL;
    const char **toks = NULL, **merges = NULL;
    size_t *tlens = NULL, *mlens = NULL;
    tlm_status s = core_read_file(encoder_json, &ej, &ejn);
    if (s) return s;
    s = core_read_file(vocab_bpe, &vb, &vbn);
    if (s) goto done;
    root = cJSON_ParseWithLength(ej, ejn);
    if (!root || !cJSON_IsObject(root)) {
        s = core_err(TLM_ERR_FORMAT, "'%s' is not a JSON object of token -> id", encoder_json);
        goto done;
    }
    int n = cJSON_GetArraySize(root);
    if (n <= 0 || n > TOK_MAX_VOCAB) {
        s = core_err(TLM_ERR_FORMAT, "'%s': %d tokens is out of range", encoder_json, n);
        goto done;
    }
    toks = calloc((size_t)n, sizeof *toks);
    tlens = calloc((size_t)n, sizeof *tlens);
    if (!toks || !tlens) {
        s = core_err(TLM_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (cJSON *it = root->child; it; it = it->next) {
        double v = it->valuedouble;
        if (!cJSON_IsNumber(it) || v < 0 || v >= n || v != (double)(int)v) {
            s = core_err(TLM_ERR_FORMAT, "'%s': token '%.40s' has id %s, not an integer in 0..%d",
                         encoder_json, it->string, cJSON_IsNumber(it) ? "out of range" : "missing",
                         n - 1);
            goto done;
        }
        int id = (int)v;
        if (toks[id]) {
            s = core_err(TLM_ERR_FORMAT, "'%s': id %d is given to two tokens", encoder_json, id);
            goto done;
        }
        toks[id] = it->string;
        tlens[id] = strlen(it->string);
    }
    /* n distinct ids in 0..n-1: every id is present */
    size_t cap = 1024, nm = 0;
    merges = malloc(cap * sizeof *merges);
    mlens = malloc(cap * sizeof *mlens);
    if (!merges || !mlens) {
        s = core_err(TLM_ERR_NOMEM, "out of memory");
        goto done;
    }
    char *p = vb, *end = vb + vbn;
    int first = 1;
    while (p < end) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        char *le = nl ? nl : end;
        size_t l = (size_t)(le - p);
        if (l && p[l - 1] == '\r') l--;
        int skip = l == 0 || (first && l >= 8 && memcmp(p, "#version", 8) == 0);
        first = 0;
        if (!skip) {
            if (memchr(p, '\0', l)) {
                s = core_err(TLM_ERR_FORMAT, "'%s' contains a NUL byte", vocab_bpe);
                goto done;
            }
            if (nm == cap) {
                cap *= 2;
                const char **nmg = realloc(merges, cap * sizeof *merges);
                if (nmg) merges = nmg;
                size_t *nml = realloc(mlens, cap * sizeof *mlens);
                if (nml) mlens = nml;
                if (!nmg || !nml || cap > (size_t)INT32_MAX) {
                    s = core_err(TLM_ERR_NOMEM, "'%s': too many merges", vocab_bpe);
                    goto done;
                }
            }
            merges[nm] = p;
            mlens[nm++] = l;
        }
        p = nl ? nl + 1 : end;
    }
    s = tok_build_bpe(toks, tlens, n, merges, mlens, (int32_t)nm, NULL, out);
    if (s) core_err_context(s, "loading '%s' + '%s'", encoder_json, vocab_bpe);
done:
    cJSON_Delete(root);
    free(ej);
    free(vb);
    free(toks);
    free(tlens);
    free(merges);
    free(mlens);
    return s;
}

/* ---- encoding ---------------------------------------------------------------------------- */

typedef struct {
    uint32_t rank, pos;
    int32_t a, b;
} merge_cand;

/* Lowest rank first, leftmost among equal ranks. */
static inline int cand_before(const void *x, const void *y, const void *ctx) {
    const merge_cand *a = x, *b = y;
    (void)ctx;
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void cand_push(merge_cand *h, size_t *n, merge_cand c) {
    tok_heap_push(h, n, sizeof *h, &c, cand_before, NULL);
}

/* Merging with a heap and a linked list: O(m log m), for long pre-tokens where the quadratic
 * scan would be slow (a megabyte of digits or of punctuation is one pre-token). */
static tlm_status merge_heap(const tlm_tokenizer *t, const uint8_t *p, size_t m, tok_ids *out) {
    int32_t *id = malloc(m * sizeof *id);
    uint32_t *next = malloc(m * sizeof *next), *prev = malloc(m * sizeof *prev);
    merge_cand *h = malloc(m * 3 * sizeof *h);
    tlm_status s = TLM_OK;
    if (!id || !next || !prev || !h) {
        s = core_err(TLM_ERR_NOMEM, "out of memory encoding a %zu-byte pre-token", m);
        goto done;
    }
    size_t hn = 0, hcap = m * 3;
    for (size_t i = 0; i < m; i++) {
        id[i] = t->byte_id[p[i]];
        next[i] = (uint32_t)(i + 1);
        prev[i] = (uint32_t)(i - 1); /* wraps for i == 0: never used as a node */
    }
    for (size_t i = 0; i + 1 < m; i++) {
        uint32_t r;
        int32_t c;
        if (tok_pairmap_get(&t->merges, id[i], id[i + 1], &r, &c))
            cand_push(h, &hn, (merge_cand){r, (uint32_t)i, id[i], id[i + 1]});
    }
    while (hn) {
        merge_cand c;
        tok_heap_pop(h, &hn, sizeof *h, &c, cand_before, NULL);
        uint32_t i = c.pos, j = next[i];
        if (id[i] != c.a || j >= m || id[j] != c.b) continue; /* stale */
        uint32_t r = 0;
        int32_t merged = -1;
        tok_pairmap_get(&t->merges, c.a, c.b, &r, &merged);
        id[i] = merged;
        id[j] = -1;
        next[i] = next[j];
        if (next[j] < m) prev[next[j]] = i;
        if (hn + 2 > hcap) { /* cannot happen: each merge removes a node, pushes at most 2 */
            s = core_err(TLM_ERR_ARG, "internal error: merge heap overflow");
            goto done;
        }
        if (i > 0 && id[i] >= 0) {
            uint32_t k = prev[i];
            if (k < m && tok_pairmap_get(&t->merges, id[k], id[i], &r, &merged))
                cand_push(h, &hn, (merge_cand){r, k, id[k], id[i]});
        }
        if (next[i] < m && tok_pairmap_get(&t->merges, id[i], id[next[i]], &r, &merged))
            cand_push(h, &hn, (merge_cand){r, i, id[i], id[next[i]]});
    }
    for (size_t i = 0; i < m && !s; i = next[i]) s = tok_ids_push(out, id[i]);
done:
    free(id);
    free(next);
    free(prev);
    free(h);
    return s;
}

#define SMALL_WORD 128

/* Applies the merges to one pre-token in rank order, leftmost first among equal ranks.
 * use_heap: 0 picks by length, 1 forces the heap path (tests compare both). */
tlm_status tok_bpe_merge_word(const tlm_tokenizer *t, const uint8_t *p, size_t m, tok_ids *out,
                              int use_heap) {
    if (use_heap || m > SMALL_WORD) return merge_heap(t, p, m, out);
    int32_t id[SMALL_WORD];
    uint32_t rank[SMALL_WORD];
    int32_t res[SMALL_WORD];
    size_t k = m;
    for (size_t i = 0; i < m; i++) id[i] = t->byte_id[p[i]];
    for (size_t i = 0; i + 1 < k; i++)
        if (!tok_pairmap_get(&t->merges, id[i], id[i + 1], &rank[i], &res[i])) rank[i] = UINT32_MAX;
    while (k > 1) {
        size_t best = 0;
        for (size_t i = 1; i + 1 < k; i++)
            if (rank[i] < rank[best]) best = i;
        if (rank[best] == UINT32_MAX) break;
        id[best] = res[best];
        memmove(id + best + 1, id + best + 2, (k - best - 2) * sizeof *id);
        memmove(rank + best + 1, rank + best + 2, (k - best - 2) * sizeof *rank);
        memmove(res + best + 1, res + best + 2, (k - best - 2) * sizeof *res);
        k--;
        if (best > 0 &&
            !tok_pairmap_get(&t->merges, id[best - 1], id[best], &rank[best - 1], &res[best - 1]))
            rank[best - 1] = UINT32_MAX;
        if (best + 1 < k &&
            !tok_pairmap_get(&t->merges, id[best], id[best + 1], &rank[best], &res[best]))
            rank[best] = UINT32_MAX;
    }
    tlm_status s = tok_ids_reserve(out, k);
    if (s) return s;
    memcpy(out->p + out->n, id, k * sizeof *id);
    out->n += k;
    return TLM_OK;
}

tlm_status tok_bpe_encode_text(const tlm_tokenizer *t, const uint8_t *s, size_t n, tok_ids *out) {
    size_t i = 0;
    while (i < n) {
        size_t j = t->pre == TOK_PRE_GPT2
                       ? tok_pretok_next(s, n, i)
                       : tok_pretok_next_llama3(s, n, i, t->pre == TOK_PRE_LLAMA3 ? 3 : 1);
        /* A pre-token that is itself a token is emitted whole, as tiktoken does (and llama.cpp
         * with ignore_merges) unless the vocabulary merges those too. */
        int32_t id = j - i <= t->max_piece && !t->merge_known ? tok_map_find(t, s + i, j - i) : -1;
        tlm_status st =
            id >= 0 ? tok_ids_push(out, id) : tok_bpe_merge_word(t, s + i, j - i, out, 0);
        if (st) return st;
        i = j;
    }
    return TLM_OK;
}
