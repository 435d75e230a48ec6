/* Byte-level BPE training. Pre-tokens are counted once (in parallel); merges then work on the
 * distinct pre-tokens ("words") with their counts. Pair counts are updated incrementally: a merge
 * only visits the words that contain the merged pair (found through a per-pair word list) and
 * adjusts the counts of the pairs around each occurrence. The best pair comes from a max-heap
 * with lazy deletion (entries whose count is out of date are skipped). */
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "heap.h"
#include "tok_internal.h"
#include "unicode.h"

/* ---- counting pre-tokens -------------------------------------------------------------------- */

typedef struct {
    const uint8_t *p;
    uint32_t len;
    uint32_t hash;
    int64_t count;
} word_ent;

typedef struct {
    word_ent *e;
    size_t cap, n;
} word_table;

static int wt_init(word_table *t, size_t cap) {
    t->cap = cap;
    t->n = 0;
    t->e = calloc(cap, sizeof *t->e);
    return t->e != NULL;
}

static int wt_add(word_table *t, const uint8_t *p, uint32_t len, uint32_t h, int64_t count);

static int wt_grow(word_table *t) {
    word_table nt;
    if (!wt_init(&nt, t->cap * 2)) return 0;
    for (size_t i = 0; i < t->cap; i++)
        if (t->e[i].p) wt_add(&nt, t->e[i].p, t->e[i].len, t->e[i].hash, t->e[i].count);
    free(t->e);
    *t = nt;
    return 1;
}

static int wt_add(word_table *t, const uint8_t *p, uint32_t len, uint32_t h, int64_t count) {
    size_t k = h & (t->cap - 1);
    for (;;) {
        word_ent *e = &t->e[k];
        if (!e->p) break;
        if (e->hash == h && e->len == len && memcmp(e->p, p, len) == 0) {
            e->count += count;
            return 1;
        }
        k = (k + 1) & (t->cap - 1);
    }
    t->e[k] = (word_ent){p, len, h, count};
    t->n++;
    if (t->n * 2 > t->cap) return wt_grow(t);
    return 1;
}

typedef struct {
    const uint8_t *p;
    size_t n;
} segment;

/* Splits a chunk (text between specials) into pieces of about `target` bytes at points where the
 * GPT-2 pattern always has a boundary: before a space that is followed by an ASCII letter (the
 * space starts " ?\p{L}+", and whatever precedes it cannot extend over it). */
static int split_chunk(const uint8_t *p, size_t n, size_t target, segment **segs, size_t *ns,
                       size_t *cap) {
    size_t start = 0;
    while (start < n) {
        size_t end = n;
        if (n - start > target * 2) {
            size_t i = start + target;
            while (i + 1 < n) {
                uint8_t c = p[i + 1] | 0x20;
                if (p[i] == ' ' && c >= 'a' && c <= 'z') break;
                i++;
            }
            if (i + 1 < n) end = i;
        }
        if (*ns == *cap) {
            *cap = *cap ? *cap * 2 : 64;
            segment *nsg = realloc(*segs, *cap * sizeof *nsg);
            if (!nsg) return 0;
            *segs = nsg;
        }
        (*segs)[(*ns)++] = (segment){p + start, end - start};
        start = end;
    }
    return 1;
}

typedef struct {
    const tok_str *sp; /* specials, sorted */
    size_t ns;
    uint8_t first[256];
} special_set;

/* Length of the longest special at p, or 0. */
static size_t special_len_at(const special_set *s, const uint8_t *p, size_t n) {
    if (!s->first[p[0]]) return 0;
    ptrdiff_t k = tok_strs_longest_prefix(s->sp, s->ns, p, n);
    return k < 0 ? 0 : s->sp[k].len;
}

static tlm_status count_words(const char *const *texts, const size_t *lens, int n_texts,
                              const special_set *ss, int threads, word_table *out) {
    segment *segs = NULL;
    size_t ns = 0, cap = 0, total = 0;
    for (int f = 0; f < n_texts; f++) total += lens[f];
    size_t target = total / ((size_t)threads * 8) + 1;
    if (target < (1 << 16)) target = 1 << 16;
    for (int f = 0; f < n_texts; f++) {
        const uint8_t *p = (const uint8_t *)texts[f];
        size_t n = lens[f], start = 0;
        for (size_t i = 0; i < n;) {
            size_t l = ss->ns ? special_len_at(ss, p + i, n - i) : 0;
            if (!l) {
                i++;
                continue;
            }
            if (i > start && !split_chunk(p + start, i - start, target, &segs, &ns, &cap)) goto oom;
            i += l;
            start = i;
        }
        if (n > start && !split_chunk(p + start, n - start, target, &segs, &ns, &cap)) goto oom;
    }
    word_table *tabs = calloc((size_t)threads, sizeof *tabs);
    if (!tabs) goto oom;
    int failed = 0;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) reduction(| : failed)
#endif
    {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        word_table *t = &tabs[tid];
        if (!wt_init(t, 1 << 14)) failed = 1;
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (size_t k = 0; k < ns; k++) {
            const uint8_t *p = segs[k].p;
            size_t n = segs[k].n;
            for (size_t i = 0; i < n && !failed;) {
                size_t j = tok_pretok_next(p, n, i);
                if (j - i > UINT32_MAX) {
                    failed = 2;
                    break;
                }
                if (!wt_add(t, p + i, (uint32_t)(j - i), (uint32_t)tok_hash(p + i, j - i), 1))
                    failed = 1;
                i = j;
            }
        }
    }
    if (!failed && !wt_init(out, 1 << 16)) failed = 1;
    for (int k = 0; k < threads && !failed; k++)
        for (size_t i = 0; i < tabs[k].cap && !failed; i++)
            if (tabs[k].e && tabs[k].e[i].p)
                failed = !wt_add(out, tabs[k].e[i].p, tabs[k].e[i].len, tabs[k].e[i].hash,
                                 tabs[k].e[i].count);
    for (int k = 0; k < threads; k++) free(tabs[k].e);
    free(tabs);
    free(segs);
    if (failed == 2) return core_err(TLM_ERR_RANGE, "a pre-token is longer than 4 GiB");
    if (failed) return core_err(TLM_ERR_NOMEM, "out of memory counting pre-tokens");
    return TLM_OK;
oom:
    free(segs);
    return core_err(TLM_ERR_NOMEM, "out of memory splitting the training text");
}

/* ---- merging ------------------------------------------------------------------------------ */

typedef struct {
    int32_t a, b;
    int64_t count;
    int64_t pushed; /* count of the newest heap entry, -1 if none */
    int32_t *words; /* words that contain (or contained) the pair; may hold stale entries */
    uint32_t nw, cw;
} pair_ent;

typedef struct {
    int64_t count;
    int32_t pair;
} heap_ent;

typedef struct {
    /* tokens */
    tok_bytes tb;
    uint64_t *toff;
    int32_t ntok;
    /* words */
    int32_t *sym;   /* all words' symbols */
    uint64_t *woff; /* start of word w in sym */
    uint32_t *wlen; /* current symbol count */
    int64_t *wfreq;
    uint32_t *wstamp; /* last merge that visited the word */
    size_t nwords;
    /* pairs */
    pair_ent *pairs;
    size_t npairs, cpairs;
    tok_pairmap index; /* (a, b) -> pair index (in the merged-id slot) */
    size_t index_n;
    heap_ent *heap;
    size_t nheap, cheap;
} trainer;

static int tok_cmp(const trainer *tr, int32_t x, int32_t y) {
    size_t lx = tr->toff[x + 1] - tr->toff[x], ly = tr->toff[y + 1] - tr->toff[y];
    int c = memcmp(tr->tb.p + tr->toff[x], tr->tb.p + tr->toff[y], lx < ly ? lx : ly);
    if (c) return c;
    return lx < ly ? -1 : lx > ly;
}

/* Heap order: higher count first, then the lexicographically greater (bytes(a), bytes(b)). */
static inline int heap_before(const void *x, const void *y, const void *ctx) {
    const trainer *tr = ctx;
    const heap_ent *hx = x, *hy = y;
    if (hx->count != hy->count) return hx->count > hy->count;
    const pair_ent *p = &tr->pairs[hx->pair], *q = &tr->pairs[hy->pair];
    int c = tok_cmp(tr, p->a, q->a);
    if (c) return c > 0;
    return tok_cmp(tr, p->b, q->b) > 0;
}

static int heap_push(trainer *tr, int32_t pair) {
    pair_ent *pe = &tr->pairs[pair];
    if (pe->count <= 0 || pe->pushed == pe->count) return 1;
    if (tr->nheap == tr->cheap) {
        size_t nc = tr->cheap ? tr->cheap * 2 : 1024;
        heap_ent *nh = realloc(tr->heap, nc * sizeof *nh);
        if (!nh) return 0;
        tr->heap = nh;
        tr->cheap = nc;
    }
    heap_ent e = {pe->count, pair};
    pe->pushed = pe->count;
    tok_heap_push(tr->heap, &tr->nheap, sizeof e, &e, heap_before, tr);
    return 1;
}

static int index_grow(trainer *tr) {
    tok_pairmap nm;
    if (tok_pairmap_init(&nm, (tr->index.mask + 1)) != TLM_OK) return 0;
    for (size_t i = 0; i <= tr->index.mask; i++)
        if (tr->index.keys[i] != ~0ull)
            tok_pairmap_put(&nm, (int32_t)(tr->index.keys[i] >> 32),
                            (int32_t)(uint32_t)tr->index.keys[i], 0,
                            (int32_t)(uint32_t)tr->index.vals[i]);
    tok_pairmap_free(&tr->index);
    tr->index = nm;
    return 1;
}

/* Index of pair (a, b), created if missing; -1 on allocation failure. */
static int32_t pair_get(trainer *tr, int32_t a, int32_t b) {
    uint32_t r;
    int32_t idx;
    if (tok_pairmap_get(&tr->index, a, b, &r, &idx)) return idx;
    if (tr->npairs == tr->cpairs) {
        size_t nc = tr->cpairs ? tr->cpairs * 2 : 4096;
        pair_ent *np = realloc(tr->pairs, nc * sizeof *np);
        if (!np || nc > INT32_MAX) return -1;
        tr->pairs = np;
        tr->cpairs = nc;
    }
    idx = (int32_t)tr->npairs++;
    tr->pairs[idx] = (pair_ent){a, b, 0, -1, NULL, 0, 0};
    if ((tr->index_n + 1) * 2 > tr->index.mask + 1 && !index_grow(tr)) return -1;
    tok_pairmap_put(&tr->index, a, b, 0, idx);
    tr->index_n++;
    return idx;
}

static int pair_add_word(pair_ent *p, int32_t w) {
    if (p->nw && p->words[p->nw - 1] == w) return 1;
    if (p->nw == p->cw) {
        uint32_t nc = p->cw ? p->cw * 2 : 4;
        int32_t *nw = realloc(p->words, nc * sizeof *nw);
        if (!nw) return 0;
        p->words = nw;
        p->cw = nc;
    }
    p->words[p->nw++] = w;
    return 1;
}

/* Adds delta to pair (a, b) and, when positive, records that word w holds it. Dirty pairs are
 * collected so the heap gets one entry per changed pair per merge. */
static int pair_update(trainer *tr, int32_t a, int32_t b, int64_t delta, int32_t w,
                       tok_ids *dirty) {
    int32_t idx = pair_get(tr, a, b);
    if (idx < 0) return 0;
    pair_ent *p = &tr->pairs[idx];
    p->count += delta;
    if (delta > 0 && !pair_add_word(p, w)) return 0;
    return tok_ids_push(dirty, idx) == TLM_OK;
}

static void trainer_free(trainer *tr) {
    free(tr->tb.p);
    free(tr->toff);
    free(tr->sym);
    free(tr->woff);
    free(tr->wlen);
    free(tr->wfreq);
    free(tr->wstamp);
    for (size_t i = 0; i < tr->npairs; i++) free(tr->pairs[i].words);
    free(tr->pairs);
    tok_pairmap_free(&tr->index);
    free(tr->heap);
}

tlm_status tlm_tokenizer_train_bpe_texts(const char *const *texts, const size_t *lens, int n_texts,
                                         const tlm_bpe_train_opts *o, tlm_tokenizer **out) {
    *out = NULL;
    if (!o || n_texts < 0 || (n_texts && (!texts || !lens)))
        return core_err(TLM_ERR_ARG, "train_bpe: missing arguments");
    int nsp = o->n_specials;
    if (nsp < 0 || (nsp && !o->specials)) return core_err(TLM_ERR_ARG, "train_bpe: bad specials");
    if (o->vocab_size < nsp + 256 || o->vocab_size > TOK_MAX_VOCAB)
        return core_err(TLM_ERR_ARG,
                        "train_bpe: vocabulary size %ld must be at least %d (the %d special tokens "
                        "and 256 bytes) and at most %d",
                        (long)o->vocab_size, nsp + 256, nsp, TOK_MAX_VOCAB);
    /* specials sorted by bytes, for longest-match splitting; a repeat is adjacent to its twin */
    special_set ss = {0};
    tok_str *sp = malloc(((size_t)nsp + 1) * sizeof *sp);
    if (!sp) return core_err(TLM_ERR_NOMEM, "out of memory");
    for (int i = 0; i < nsp; i++) {
        sp[i] = (tok_str){(const uint8_t *)o->specials[i], strlen(o->specials[i]), i};
        if (sp[i].len == 0) {
            free(sp);
            return core_err(TLM_ERR_ARG, "train_bpe: empty special token");
        }
        ss.first[sp[i].p[0]] = 1;
    }
    tok_strs_sort(sp, (size_t)nsp);
    for (int i = 1; i < nsp; i++)
        if (sp[i].len == sp[i - 1].len && !memcmp(sp[i].p, sp[i - 1].p, sp[i].len)) {
            tlm_status e = core_err(TLM_ERR_ARG, "train_bpe: special token '%s' is repeated",
                                    o->specials[sp[i].id]);
            free(sp);
            return e;
        }
    ss.sp = sp;
    ss.ns = (size_t)nsp;
    int threads = o->threads > 0 ? o->threads : tlm_threads_get();
    if (threads < 1) threads = 1;
    if (threads > 256) threads = 256;

    word_table wt = {0};
    trainer tr = {0};
    tok_ids dirty = {0};
    tlm_tokenizer *t = NULL;
    tlm_status s = count_words(texts, lens, n_texts, &ss, threads, &wt);
    if (s) goto done;

    /* tokens: specials, the 256 bytes, then merges */
    int32_t vmax = o->vocab_size;
    tr.toff = calloc((size_t)vmax + 1, sizeof *tr.toff);
    if (!tr.toff) goto oom;
    for (int i = 0; i < nsp && !s; i++) {
        s = tok_bytes_put(&tr.tb, o->specials[i], strlen(o->specials[i]));
        tr.toff[i + 1] = tr.tb.n;
    }
    for (int b = 0; b < 256 && !s; b++) {
        uint8_t c = (uint8_t)b;
        s = tok_bytes_put(&tr.tb, &c, 1);
        tr.toff[nsp + b + 1] = tr.tb.n;
    }
    if (s) goto done;
    tr.ntok = nsp + 256;

    /* words */
    size_t total_sym = 0;
    for (size_t i = 0; i < wt.cap; i++)
        if (wt.e[i].p) {
            total_sym += wt.e[i].len;
            tr.nwords++;
        }
    if (tr.nwords > INT32_MAX) {
        s = core_err(TLM_ERR_RANGE, "train_bpe: more than 2^31 distinct pre-tokens");
        goto done;
    }
    tr.sym = malloc((total_sym + 1) * sizeof *tr.sym);
    tr.woff = malloc((tr.nwords + 1) * sizeof *tr.woff);
    tr.wlen = malloc((tr.nwords + 1) * sizeof *tr.wlen);
    tr.wfreq = malloc((tr.nwords + 1) * sizeof *tr.wfreq);
    tr.wstamp = calloc(tr.nwords + 1, sizeof *tr.wstamp);
    if (!tr.sym || !tr.woff || !tr.wlen || !tr.wfreq || !tr.wstamp) goto oom;
    if (tok_pairmap_init(&tr.index, 1 << 16) != TLM_OK) goto oom;
    size_t w = 0, pos = 0;
    for (size_t i = 0; i < wt.cap; i++) {
        const word_ent *e = &wt.e[i];
        if (!e->p) continue;
        tr.woff[w] = pos;
        tr.wlen[w] = e->len;
        tr.wfreq[w] = e->count;
        for (uint32_t k = 0; k < e->len; k++) tr.sym[pos + k] = nsp + e->p[k];
        for (uint32_t k = 0; k + 1 < e->len; k++) {
            int32_t idx = pair_get(&tr, tr.sym[pos + k], tr.sym[pos + k + 1]);
            if (idx < 0 || !pair_add_word(&tr.pairs[idx], (int32_t)w)) goto oom;
            tr.pairs[idx].count += e->count;
        }
        pos += e->len;
        w++;
    }
    free(wt.e);
    wt.e = NULL;
    for (size_t i = 0; i < tr.npairs; i++)
        if (!heap_push(&tr, (int32_t)i)) goto oom;

    int32_t(*merges)[2] = NULL;
    int32_t n_merges = 0, want = vmax - tr.ntok;
    merges = malloc(((size_t)want + 1) * sizeof *merges);
    if (!merges) goto oom;
    while (n_merges < want && tr.nheap) {
        heap_ent top;
        tok_heap_pop(tr.heap, &tr.nheap, sizeof top, &top, heap_before, &tr);
        pair_ent *pe = &tr.pairs[top.pair];
        if (top.count != pe->count || pe->count <= 0) continue; /* stale */
        pe->pushed = -1;
        int32_t A = pe->a, B = pe->b, C = tr.ntok;
        /* the new token's bytes */
        size_t la = tr.toff[A + 1] - tr.toff[A], lb = tr.toff[B + 1] - tr.toff[B];
        if ((s = tok_bytes_put(&tr.tb, tr.tb.p + tr.toff[A], la)) ||
            (s = tok_bytes_put(&tr.tb, tr.tb.p + tr.toff[B], lb)))
            goto done_m;
        tr.toff[C + 1] = tr.tb.n;
        tr.ntok++;
        merges[n_merges][0] = A;
        merges[n_merges][1] = B;
        n_merges++;
        uint32_t stamp = (uint32_t)n_merges;
        dirty.n = 0;
        /* The word list may grow while we walk it (pair_update appends to other pairs only,
         * but realloc of tr.pairs can move pe), so index it afresh each step. */
        for (uint32_t k = 0; k < tr.pairs[top.pair].nw; k++) {
            int32_t wi = tr.pairs[top.pair].words[k];
            if (tr.wstamp[wi] == stamp) continue;
            tr.wstamp[wi] = stamp;
            int32_t *sy = tr.sym + tr.woff[wi];
            uint32_t n = tr.wlen[wi], o2 = 0;
            int64_t f = tr.wfreq[wi];
            int hit = 0;
            for (uint32_t i = 0; i < n;) {
                if (i + 1 < n && sy[i] == A && sy[i + 1] == B) {
                    hit = 1;
                    /* left neighbour is the already-rewritten symbol sy[o2 - 1] */
                    if (o2 > 0) {
                        if (!pair_update(&tr, sy[o2 - 1], A, -f, wi, &dirty) ||
                            !pair_update(&tr, sy[o2 - 1], C, f, wi, &dirty))
                            goto oom_m;
                    }
                    if (i + 2 < n) {
                        if (!pair_update(&tr, B, sy[i + 2], -f, wi, &dirty) ||
                            !pair_update(&tr, C, sy[i + 2], f, wi, &dirty))
                            goto oom_m;
                    }
                    tr.pairs[top.pair].count -= f;
                    sy[o2++] = C;
                    i += 2;
                } else {
                    sy[o2++] = sy[i++];
                }
            }
            if (hit) tr.wlen[wi] = o2;
        }
        tr.pairs[top.pair].nw = 0; /* no word holds (A, B) any more */
        free(tr.pairs[top.pair].words);
        tr.pairs[top.pair].words = NULL;
        tr.pairs[top.pair].cw = 0;
        for (size_t i = 0; i < dirty.n; i++)
            if (!heap_push(&tr, dirty.p[i])) goto oom_m;
        if (o->progress && (n_merges % 256 == 0 || n_merges == want) &&
            o->progress(o->user, n_merges, want)) {
            s = core_err(TLM_ERR_INTERRUPTED, "train_bpe: stopped after %ld merges",
                         (long)n_merges);
            goto done_m;
        }
    }

    /* the tokenizer */
    s = tok_alloc(&t, TLM_TOKENIZER_BPE, tr.ntok);
    for (int32_t i = 0; i < tr.ntok && !s; i++) {
        s = tok_set_piece(t, i, tr.tb.p + tr.toff[i], tr.toff[i + 1] - tr.toff[i]);
        if (i < nsp) t->attr[i] = TOK_SPECIAL;
    }
    if (!s) s = tok_finish(t);
    if (!s) s = tok_pairmap_init(&t->merges, (size_t)n_merges);
    if (!s) {
        t->merge_list = merges;
        merges = NULL;
        t->n_merges = n_merges;
        for (int32_t r = 0; r < n_merges; r++) {
            int32_t a = t->merge_list[r][0], b = t->merge_list[r][1];
            size_t la = tr.toff[a + 1] - tr.toff[a], lb = tr.toff[b + 1] - tr.toff[b];
            /* the merged id as a reload of the saved files would see it (first id of a
             * string that two different merges produce) */
            uint8_t stackbuf[256];
            uint8_t *buf = la + lb <= sizeof stackbuf ? stackbuf : malloc(la + lb);
            if (!buf) {
                s = core_err(TLM_ERR_NOMEM, "out of memory");
                break;
            }
            memcpy(buf, tr.tb.p + tr.toff[a], la);
            memcpy(buf + la, tr.tb.p + tr.toff[b], lb);
            int32_t c = tok_map_find(t, buf, la + lb);
            if (buf != stackbuf) free(buf);
            tok_pairmap_put(&t->merges, a, b, (uint32_t)r, c);
        }
        for (int b = 0; b < 256; b++) t->byte_id[b] = nsp + b;
        int32_t eot = tlm_tokenizer_find(t, "<|endoftext|>", 13);
        if (eot >= 0 && t->attr[eot] == TOK_SPECIAL) t->bos = t->eos = eot;
    }
    if (!s) {
        *out = t;
        t = NULL;
    }
done_m:
    free(merges);
    goto done;
oom_m:
    free(merges);
oom:
    s = core_err(TLM_ERR_NOMEM, "train_bpe: out of memory");
done:
    tlm_tokenizer_free(t);
    free(dirty.p);
    free(wt.e);
    trainer_free(&tr);
    free(sp);
    return s;
}

tlm_status tlm_tokenizer_train_bpe(const char *const *files, int n_files,
                                   const tlm_bpe_train_opts *opts, tlm_tokenizer **out) {
    *out = NULL;
    if (n_files <= 0 || !files) return core_err(TLM_ERR_ARG, "train_bpe: no input files");
    core_mmap *maps = calloc((size_t)n_files, sizeof *maps);
    const char **texts = calloc((size_t)n_files, sizeof *texts);
    size_t *lens = calloc((size_t)n_files, sizeof *lens);
    tlm_status s = maps && texts && lens ? TLM_OK : core_err(TLM_ERR_NOMEM, "out of memory");
    int opened = 0;
    for (; opened < n_files && !s; opened++) {
        s = core_mmap_open(&maps[opened], files[opened]);
        if (s) break;
        texts[opened] = (const char *)maps[opened].data;
        lens[opened] = maps[opened].size;
    }
    if (!s) s = tlm_tokenizer_train_bpe_texts(texts, lens, n_files, opts, out);
    for (int i = 0; i < opened; i++) core_mmap_close(&maps[i]);
    free(maps);
    free(texts);
    free(lens);
    return s;
}
