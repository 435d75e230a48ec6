/* The tokenizer interface shared by every kind: piece table, hash maps, special-token splitting,
 * decoding and the streaming decoder. */
#include <stdlib.h>
#include <string.h>

#include <pthread.h>
#include <sys/random.h>
#include <time.h>

#include "tok_internal.h"
#include "unicode.h"

/* ---- buffers ----------------------------------------------------------------------------- */

tlm_status tok_bytes_put(tok_bytes *b, const void *p, size_t n) {
    if (n > b->cap - b->n || !b->p) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->n < n) {
            if (cap > SIZE_MAX / 2) return core_err(TLM_ERR_NOMEM, "buffer too large");
            cap *= 2;
        }
        /* p may point into the buffer itself (BPE training appends token bytes to the token
         * table): keep its offset across the realloc */
        const uint8_t *src = p;
        int inside = b->p && src >= b->p && src < b->p + b->n;
        size_t at = inside ? (size_t)(src - b->p) : 0;
        uint8_t *np = realloc(b->p, cap);
        if (!np) return core_err(TLM_ERR_NOMEM, "out of memory");
        b->p = np;
        b->cap = cap;
        if (inside) p = np + at;
    }
    if (n) memcpy(b->p + b->n, p, n);
    b->n += n;
    return TLM_OK;
}

tlm_status tok_ids_reserve(tok_ids *v, size_t extra) {
    if (extra <= v->cap - v->n) return TLM_OK;
    size_t cap = v->cap ? v->cap : 64;
    while (cap - v->n < extra) {
        if (cap > SIZE_MAX / 2 / sizeof(int32_t)) return core_err(TLM_ERR_NOMEM, "too many ids");
        cap *= 2;
    }
    int32_t *np = realloc(v->p, cap * sizeof(int32_t));
    if (!np) return core_err(TLM_ERR_NOMEM, "out of memory");
    v->p = np;
    v->cap = cap;
    return TLM_OK;
}

/* ---- hashing ----------------------------------------------------------------------------- */

/* The tables a loaded vocabulary builds hash with a secret drawn once per process: a file made to
 * put many pieces or merges in one bucket would otherwise make loading quadratic. Lookups do not
 * depend on the order within a table, so results are the same whatever the seed. */
uint64_t tok_seed;
static pthread_once_t seed_once = PTHREAD_ONCE_INIT;

static void draw_seed(void) {
    uint64_t s = 0;
    if (getrandom(&s, sizeof s, GRND_NONBLOCK) != (ssize_t)sizeof s) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        s = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)(uintptr_t)&s;
    }
    tok_seed = core_mix64(s | 1);
}

void tok_seed_init(void) { pthread_once(&seed_once, draw_seed); }

uint64_t tok_hash(const uint8_t *p, size_t n) { return tok_hash_seeded(p, n, 0); }

uint64_t tok_hash_seeded(const uint8_t *p, size_t n, uint64_t seed) {
    /* Eight bytes at a time with a multiply-xorshift mix: pieces are short, so this is mostly
     * one or two rounds. */
    uint64_t h = seed ^ 0x9E3779B97F4A7C15ull ^ (n * 0xC2B2AE3D27D4EB4Full);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    for (size_t i = 0; i < n; i++) w |= (uint64_t)p[i] << (8 * i);
    h = (h ^ w) * 0x94D049BB133111EBull;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 32;
    return h;
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

tlm_status tok_map_build(tlm_tokenizer *t) {
    tok_seed_init();
    free(t->map.slots);
    size_t cap = pow2_at_least((size_t)t->n * 2 + 1);
    t->map.slots = calloc(cap, sizeof(uint64_t));
    if (!t->map.slots) return core_err(TLM_ERR_NOMEM, "out of memory for the vocabulary map");
    t->map.mask = cap - 1;
    for (int32_t id = 0; id < t->n; id++) {
        if (t->attr[id] != TOK_NORMAL) continue;
        size_t len;
        const uint8_t *p = tok_piece(t, id, &len);
        if (tok_map_find(t, p, len) >= 0) {
            t->attr[id] = TOK_UNUSED; /* a duplicate piece: the first id wins */
            continue;
        }
        uint64_t h = tok_hash_seeded(p, len, tok_seed);
        size_t k = (size_t)h & t->map.mask;
        while (t->map.slots[k]) k = (k + 1) & t->map.mask;
        t->map.slots[k] = (h & 0xFFFFFFFF00000000ull) | (uint64_t)(uint32_t)(id + 1);
    }
    return TLM_OK;
}

int32_t tok_map_find(const tlm_tokenizer *t, const uint8_t *p, size_t n) {
    uint64_t h = tok_hash_seeded(p, n, tok_seed);
    size_t k = (size_t)h & t->map.mask;
    uint64_t hi = h & 0xFFFFFFFF00000000ull;
    for (;;) {
        uint64_t s = t->map.slots[k];
        if (!s) return -1;
        if ((s & 0xFFFFFFFF00000000ull) == hi) {
            int32_t id = (int32_t)(uint32_t)s - 1;
            size_t len;
            const uint8_t *q = tok_piece(t, id, &len);
            if (len == n && memcmp(p, q, n) == 0) return id;
        }
        k = (k + 1) & t->map.mask;
    }
}

tlm_status tok_pairmap_init(tok_pairmap *m, size_t n) {
    tok_seed_init();
    size_t cap = pow2_at_least(n * 2 + 1);
    m->keys = malloc(cap * sizeof(uint64_t));
    m->vals = malloc(cap * sizeof(uint64_t));
    if (!m->keys || !m->vals) {
        tok_pairmap_free(m);
        return core_err(TLM_ERR_NOMEM, "out of memory for the merge table");
    }
    memset(m->keys, 0xFF, cap * sizeof(uint64_t));
    m->mask = cap - 1;
    return TLM_OK;
}

void tok_pairmap_free(tok_pairmap *m) {
    free(m->keys);
    free(m->vals);
    m->keys = m->vals = NULL;
    m->mask = 0;
}

void tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, uint32_t rank, int32_t merged) {
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t h = tok_pair_slot(k, m->mask);
    while (m->keys[h] != ~0ull && m->keys[h] != k) h = (h + 1) & m->mask;
    if (m->keys[h] == k) return; /* a repeated merge keeps its first (best) rank */
    m->keys[h] = k;
    m->vals[h] = ((uint64_t)rank << 32) | (uint32_t)merged;
}

/* ---- construction ------------------------------------------------------------------------ */

tlm_status tok_alloc(tlm_tokenizer **out, tlm_tokenizer_kind kind, int32_t n) {
    *out = NULL;
    if (n <= 0 || n > TOK_MAX_VOCAB)
        return core_err(TLM_ERR_FORMAT, "vocabulary size %ld out of range (1..%d)", (long)n,
                        TOK_MAX_VOCAB);
    tlm_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return core_err(TLM_ERR_NOMEM, "out of memory");
    t->kind = kind;
    t->n = n;
    t->off = calloc((size_t)n + 1, sizeof(uint64_t));
    t->attr = calloc((size_t)n, 1);
    if (!t->off || !t->attr) {
        tlm_tokenizer_free(t);
        return core_err(TLM_ERR_NOMEM, "out of memory");
    }
    t->bos = t->eos = t->unk = -1;
    t->eot = t->eom = -1;
    t->add_bos = -1;
    for (int i = 0; i < 256; i++) t->byte_id[i] = -1;
    *out = t;
    return TLM_OK;
}

tlm_status tok_set_piece(tlm_tokenizer *t, int32_t id, const void *p, size_t len) {
    tok_bytes b = {t->pieces.p, t->pieces.n, t->pieces.cap};
    tlm_status s = tok_bytes_put(&b, p, len);
    t->pieces.p = b.p;
    t->pieces.n = b.n;
    t->pieces.cap = b.cap;
    t->data = b.p;
    if (s) return s;
    t->off[id + 1] = b.n;
    if (len > t->max_piece) t->max_piece = len;
    return TLM_OK;
}

static int cmp_str(const void *a, const void *b) {
    const tok_str *x = a, *y = b;
    size_t m = x->len < y->len ? x->len : y->len;
    int c = m ? memcmp(x->p, y->p, m) : 0;
    if (c) return c;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

void tok_strs_sort(tok_str *s, size_t n) { qsort(s, n, sizeof *s, cmp_str); }

ptrdiff_t tok_strs_find(const tok_str *s, size_t ns, const uint8_t *p, size_t n) {
    tok_str key = {p, n, INT32_MIN}; /* sorts before every equal entry */
    size_t lo = 0, hi = ns;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cmp_str(&s[mid], &key) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < ns && s[lo].len == n && (n == 0 || !memcmp(s[lo].p, p, n)) ? (ptrdiff_t)lo : -1;
}

ptrdiff_t tok_strs_longest_prefix(const tok_str *s, size_t ns, const uint8_t *text, size_t n) {
    /* [lo, hi) holds the entries that start with text[0..k); one byte more of text narrows it by
     * two binary searches on byte k. Entries of length exactly k equal text[0..k) and sort first
     * in the range, the lowest id first. */
    size_t lo = 0, hi = ns;
    ptrdiff_t best = -1;
    for (size_t k = 0; lo < hi; k++) {
        if (s[lo].len == k) {
            best = (ptrdiff_t)lo;
            size_t a = lo, b = hi;
            while (a < b) {
                size_t mid = a + (b - a) / 2;
                if (s[mid].len == k)
                    a = mid + 1;
                else
                    b = mid;
            }
            lo = a;
        }
        if (lo == hi || k == n) break;
        uint8_t c = text[k];
        size_t a = lo, b = hi;
        while (a < b) { /* first entry with byte k >= c */
            size_t mid = a + (b - a) / 2;
            if (s[mid].p[k] < c)
                a = mid + 1;
            else
                b = mid;
        }
        lo = a;
        b = hi;
        while (a < b) { /* first entry with byte k > c */
            size_t mid = a + (b - a) / 2;
            if (s[mid].p[k] <= c)
                a = mid + 1;
            else
                b = mid;
        }
        hi = a;
    }
    return best;
}

tlm_status tok_finish(tlm_tokenizer *t) {
    if (!t->data) { /* every piece empty (degenerate but possible): keep data non-NULL */
        t->data = t->pieces.p = malloc(1);
        if (!t->data) return core_err(TLM_ERR_NOMEM, "out of memory");
    }
    tlm_status s = tok_map_build(t);
    if (s) return s;
    int ns = 0;
    for (int32_t i = 0; i < t->n; i++)
        if (t->attr[i] == TOK_SPECIAL && t->off[i + 1] > t->off[i]) ns++;
    free(t->specials);
    t->specials = malloc(((size_t)ns + 1) * sizeof *t->specials);
    if (!t->specials) return core_err(TLM_ERR_NOMEM, "out of memory");
    t->n_specials = 0;
    memset(t->special_first, 0, sizeof t->special_first);
    for (int32_t i = 0; i < t->n; i++)
        if (t->attr[i] == TOK_SPECIAL && t->off[i + 1] > t->off[i]) {
            size_t len;
            const uint8_t *p = tok_piece(t, i, &len);
            t->specials[t->n_specials++] = (tok_str){p, len, i};
            t->special_first[p[0]] = 1;
        }
    tok_strs_sort(t->specials, (size_t)t->n_specials);
    return TLM_OK;
}

void tlm_bpe_train_opts_defaults(tlm_bpe_train_opts *o) {
    static const char *const gpt2_specials[] = {"<|endoftext|>"};
    *o = (tlm_bpe_train_opts){.vocab_size = 50257, .specials = gpt2_specials, .n_specials = 1};
}

void tlm_tokenizer_free(tlm_tokenizer *t) {
    if (!t) return;
    free(t->data);
    free(t->off);
    free(t->attr);
    free(t->scores);
    free(t->map.slots);
    tok_pairmap_free(&t->merges);
    free(t->merge_list);
    free(t->specials);
    free(t);
}

/* ---- queries ----------------------------------------------------------------------------- */

tlm_tokenizer_kind tlm_tokenizer_get_kind(const tlm_tokenizer *t) { return t->kind; }

const char *tlm_tokenizer_kind_name(tlm_tokenizer_kind k) {
    switch (k) {
    case TLM_TOKENIZER_BPE: return "bpe";
    case TLM_TOKENIZER_SPM: return "spm";
    case TLM_TOKENIZER_CHAR: return "char";
    }
    return "unknown";
}

int32_t tlm_tokenizer_vocab_size(const tlm_tokenizer *t) { return t->n; }
int tlm_tokenizer_is_eog(const tlm_tokenizer *t, int32_t id) {
    if (!t || id < 0 || id >= t->n) return 0;
    if (id == t->eos || id == t->eot || id == t->eom) return 1;
    /* the texts llama.cpp ends a generation at, whatever the token's type says */
    static const char *const ends[] = {
        "<|eot_id|>",    "<|eom_id|>", "<|end_of_text|>", "<|im_end|>", "<|end|>", "<end_of_turn>",
        "<|endoftext|>", "</s>",       "<EOT>",           "<eos>"};
    size_t len;
    const uint8_t *p = tok_piece(t, id, &len);
    for (size_t k = 0; k < sizeof ends / sizeof *ends; k++)
        if (strlen(ends[k]) == len && !memcmp(ends[k], p, len)) return 1;
    return 0;
}

int tlm_tokenizer_add_bos(const tlm_tokenizer *t) {
    if (!t || t->bos < 0) return 0;
    return t->add_bos >= 0 ? t->add_bos : t->kind == TLM_TOKENIZER_SPM;
}

int32_t tlm_tokenizer_bos(const tlm_tokenizer *t) { return t->bos; }
int32_t tlm_tokenizer_eos(const tlm_tokenizer *t) { return t->eos; }
size_t tlm_tokenizer_max_piece(const tlm_tokenizer *t) { return t->max_piece; }

int tlm_tokenizer_is_special(const tlm_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n && t->attr[id] == TOK_SPECIAL;
}

tlm_status tlm_tokenizer_piece(const tlm_tokenizer *t, int32_t id, const char **bytes,
                               size_t *len) {
    if (id < 0 || id >= t->n) {
        *bytes = "";
        *len = 0;
        return core_err(TLM_ERR_RANGE, "token id %ld out of range (vocabulary has %ld tokens)",
                        (long)id, (long)t->n);
    }
    *bytes = (const char *)tok_piece(t, id, len);
    return TLM_OK;
}

int32_t tlm_tokenizer_find(const tlm_tokenizer *t, const void *bytes, size_t len) {
    int32_t id = tok_map_find(t, bytes, len);
    if (id >= 0) return id;
    ptrdiff_t k = tok_strs_find(t->specials, (size_t)t->n_specials, bytes, len);
    return k < 0 ? -1 : t->specials[k].id;
}

/* ---- encoding ---------------------------------------------------------------------------- */

static tlm_status encode_text(const tlm_tokenizer *t, const uint8_t *s, size_t n, tok_ids *out) {
    if (n == 0) return TLM_OK;
    switch (t->kind) {
    case TLM_TOKENIZER_BPE: return tok_bpe_encode_text(t, s, n, out);
    case TLM_TOKENIZER_SPM: return tok_spm_encode_text(t, s, n, out);
    case TLM_TOKENIZER_CHAR: return tok_char_encode_text(t, s, n, out);
    }
    return core_err(TLM_ERR_ARG, "unknown tokenizer kind");
}

/* Longest special token starting at s[i], or -1. */
static int32_t special_at(const tlm_tokenizer *t, const uint8_t *s, size_t n, size_t i) {
    if (!t->special_first[s[i]]) return -1;
    ptrdiff_t k = tok_strs_longest_prefix(t->specials, (size_t)t->n_specials, s + i, n - i);
    return k < 0 ? -1 : t->specials[k].id;
}

tlm_status tlm_tokenizer_encode(const tlm_tokenizer *t, const void *text, size_t len,
                                unsigned flags, int32_t **ids, size_t *n) {
    *ids = NULL;
    *n = 0;
    if (!text && len) return core_err(TLM_ERR_ARG, "encode: NULL text");
    if (len > TLM_TOKENIZER_MAX_INPUT)
        return core_err(TLM_ERR_RANGE, "encode: input of %zu bytes exceeds the limit of %zu bytes",
                        len, (size_t)TLM_TOKENIZER_MAX_INPUT);
    if ((flags & TLM_ENCODE_ADD_BOS) && t->bos < 0)
        return core_err(TLM_ERR_ARG, "encode: this vocabulary has no BOS token");
    if ((flags & TLM_ENCODE_ADD_EOS) && t->eos < 0)
        return core_err(TLM_ERR_ARG, "encode: this vocabulary has no EOS token");
    const uint8_t *s = text;
    tok_ids out = {0};
    tlm_status st = tok_ids_reserve(&out, len / 3 + 4);
    if (!st && (flags & TLM_ENCODE_ADD_BOS)) st = tok_ids_push(&out, t->bos);
    if (!st) {
        if ((flags & TLM_ENCODE_ALLOW_SPECIAL) && t->n_specials) {
            size_t start = 0;
            for (size_t i = 0; i < len && !st;) {
                int32_t sp = special_at(t, s, len, i);
                if (sp < 0) {
                    i++;
                    continue;
                }
                st = encode_text(t, s + start, i - start, &out);
                if (!st) st = tok_ids_push(&out, sp);
                i += (size_t)(t->off[sp + 1] - t->off[sp]);
                start = i;
            }
            if (!st) st = encode_text(t, s + start, len - start, &out);
        } else {
            st = encode_text(t, s, len, &out);
        }
    }
    if (!st && (flags & TLM_ENCODE_ADD_EOS)) st = tok_ids_push(&out, t->eos);
    if (st) {
        free(out.p);
        return st;
    }
    if (out.n == 0) {
        free(out.p);
        out.p = NULL;
    }
    *ids = out.p;
    *n = out.n;
    return TLM_OK;
}

/* ---- decoding ---------------------------------------------------------------------------- */

/* Appends the bytes of one token, applying the dummy-prefix rule: SentencePiece-style encoders
 * insert a space at the start of the text and after every special token; the decoder removes
 * exactly that space. *strip says whether the next text piece starts after such a point. */
static tlm_status decode_one(const tlm_tokenizer *t, int32_t id, unsigned flags, int *strip,
                             tok_bytes *b) {
    if (id < 0 || id >= t->n)
        return core_err(TLM_ERR_RANGE, "decode: token id %ld out of range (vocabulary has %ld)",
                        (long)id, (long)t->n);
    size_t len;
    const uint8_t *p = tok_piece(t, id, &len);
    if (t->attr[id] == TOK_SPECIAL) {
        if (t->add_prefix) *strip = 1;
        if (flags & TLM_DECODE_SKIP_SPECIAL) return TLM_OK;
        return tok_bytes_put(b, p, len);
    }
    if (*strip && len) {
        if (p[0] == ' ') {
            p++;
            len--;
        }
        *strip = 0;
    }
    return tok_bytes_put(b, p, len);
}

tlm_status tlm_tokenizer_decode(const tlm_tokenizer *t, const int32_t *ids, size_t n,
                                unsigned flags, char **text, size_t *len) {
    *text = NULL;
    if (len) *len = 0;
    tok_bytes b = {0};
    int strip = t->add_prefix;
    tlm_status s = tok_bytes_put(&b, "", 0);
    for (size_t i = 0; i < n && !s; i++) s = decode_one(t, ids[i], flags, &strip, &b);
    if (!s) s = tok_bytes_put(&b, "", 1);
    if (s) {
        free(b.p);
        return s;
    }
    *text = (char *)b.p;
    if (len) *len = b.n - 1;
    return TLM_OK;
}

struct tlm_decoder {
    const tlm_tokenizer *t;
    unsigned flags;
    int strip;
    uint8_t held[4];
    size_t n_held;
    tok_bytes buf;
    tok_bytes out;
};

tlm_status tlm_decoder_new(const tlm_tokenizer *t, unsigned flags, tlm_decoder **out) {
    *out = calloc(1, sizeof **out);
    if (!*out) return core_err(TLM_ERR_NOMEM, "out of memory");
    (*out)->t = t;
    (*out)->flags = flags;
    (*out)->strip = t->add_prefix;
    return TLM_OK;
}

void tlm_decoder_free(tlm_decoder *d) {
    if (!d) return;
    free(d->buf.p);
    free(d->out.p);
    free(d);
}

/* Length a UTF-8 sequence starting with lead byte c claims (1 for bytes that cannot lead). */
static size_t utf8_claim(uint8_t c) {
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) return 3;
    if (c >= 0xF0 && c <= 0xF4) return 4;
    return 1;
}

tlm_status tlm_decoder_push(tlm_decoder *d, int32_t id, const char **bytes, size_t *len) {
    *bytes = "";
    *len = 0;
    d->buf.n = 0;
    d->out.n = 0;
    tlm_status s = tok_bytes_put(&d->buf, d->held, d->n_held);
    if (!s) s = decode_one(d->t, id, d->flags, &d->strip, &d->buf);
    if (s) return s;
    d->n_held = 0;
    /* Emit every complete or definitely-invalid sequence; hold back a prefix that may still
     * complete with the next token. */
    const uint8_t *p = d->buf.p;
    size_t n = d->buf.n, i = 0;
    while (i < n) {
        uint32_t cp;
        size_t l = tok_utf8_next(p + i, n - i, &cp);
        if (cp == TOK_UTF8_INVALID) {
            size_t want = utf8_claim(p[i]);
            if (want > n - i) {
                /* truncated: hold it if what is there so far is a valid prefix */
                int ok = 1;
                for (size_t k = 1; k < n - i; k++) ok &= (p[i + k] & 0xC0) == 0x80;
                if (ok && n - i < 4) break;
            }
        }
        i += l;
    }
    memcpy(d->held, p + i, n - i);
    d->n_held = n - i;
    *bytes = (const char *)p;
    *len = i;
    return TLM_OK;
}

void tlm_decoder_flush(tlm_decoder *d, const char **bytes, size_t *len) {
    d->out.n = 0;
    if (tok_bytes_put(&d->out, d->held, d->n_held) != TLM_OK) {
        *bytes = "";
        *len = 0;
        return;
    }
    d->n_held = 0;
    *bytes = (const char *)d->out.p;
    *len = d->out.n;
}
