/* Running a compiled grammar: the states of sequences and the masks of allowed tokens.
 *
 * A state is a set of stacks, as in llama.cpp's grammar sampler: each stack lists where the
 * automaton is in the rules it entered, innermost on top, and after expansion every top is a
 * character set (an empty stack: the grammar is complete there). Reading a code point keeps the
 * stacks whose top set holds it, moves each past its set, and expands references at the top into
 * one stack per alternative. Stacks are linked lists of nodes in an arena (a node: an element
 * position and the node below it), so a step shares everything below the top instead of copying.
 *
 * Masks walk the vocabulary's trie depth first: the stacks after a token's first bytes are
 * computed once for every token that starts with them, and a prefix that no stack survives rules
 * out its whole subtree at once. The walk's nodes and stack sets are pushed on the arena and the
 * set buffer and popped when it backs out of a subtree, so a mask allocates nothing in the steady
 * state. UTF-8 is decoded along the way; a token may end inside a character, whose bytes the state
 * keeps, and such a prefix is alive while some top set holds a code point it can still become. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "infer/grammar.h"

/* Nested deeper than this, a stack is dropped: it bounds a state's memory, and for JSON it means
 * objects and arrays nest a few hundred levels at most. */
#define GM_MAX_DEPTH 1024
/* Stacks one set may hold, and nodes one expansion may make: an ambiguous grammar past them is
 * refused rather than left to grow without bound. */
#define GM_MAX_STACKS 4096
#define GM_MAX_EXPAND (1 << 16)
/* The memo of masks: at most this many entries per state (fewer where the masks of a large
 * vocabulary would pass INFER_GRAM_MEMO_BYTES), and no configuration whose key is longer (deep
 * nesting, many stacks) is kept. Inside a JSON string every step starts from the same
 * configuration, so even a few entries save the walk there. */
#define GM_MEMO_ENTRIES 16
#define GM_MEMO_KEY_MAX 4096

typedef struct {
    uint32_t pos;
    int32_t up; /* the node below, -1 at the bottom */
    uint32_t depth;
} gnode;

enum { TOK_TEXT = 0, TOK_END, TOK_NEVER };

typedef struct {
    int32_t child, sibling;
    int32_t tok; /* first token whose bytes end here (more via tok_next), -1 none */
    uint8_t byte;
} tnode;

struct tlm_grammar_vocab {
    const tlm_tokenizer *t;
    int n_ids;
    uint8_t *kind; /* [n_ids] TOK_ */
    tnode *node;
    int n_node, cap_node;
    int32_t *tok_next; /* [n_ids] */
    int max_len;
    /* The text tokens in the trie's depth-first order: a node's subtree holds dfs[lo, hi). */
    int32_t *dfs, *sub_lo, *sub_hi;
    /* [n_node] every token below the node goes on from it in whole characters of JSON's
     * unescaped string class (see plain_cp) */
    uint8_t *plain_below;
};

/* The code points a JSON string takes as they are: all but controls, '"', '\\' and DEL. A walk
 * from a configuration that every one of them leaves as it is allows every token of a subtree
 * made of them without reading it. */
static int plain_cp(uint32_t c) {
    return c >= 0x20 && c != '"' && c != '\\' && c != 0x7F && c <= 0x10FFFF &&
           (c < 0xD800 || c > 0xDFFF);
}

/* UTF-8 decoding between bytes: cp so far, continuation bytes still due, the least code point
 * the sequence's length allows (shorter forms are overlong). */
typedef struct {
    uint32_t cp, need, min;
} utf8_at;

/* A mask remembered for one configuration (the decoder and the stacks' element positions, which
 * are all a mask depends on: a node's depth is its stack's length). */
typedef struct {
    uint64_t hash, used; /* used: the state's clock at the last hit, 0 for a free slot */
    uint32_t *key;
    int n_key, cap_key;
    uint64_t *bits; /* [mask words] */
} mask_memo;

struct tlm_grammar_state {
    const struct tlm_grammar *g;
    const tlm_grammar_vocab *v;
    gnode *nodes;
    int n_nodes, cap_nodes;
    int32_t *stacks; /* the state's set: node ids, -1 an empty (complete) stack */
    int n_stacks, cap_stacks;
    utf8_at u;
    int ended; /* an end of generation was accepted */
    /* scratch */
    int32_t *buf; /* stack sets of the walk, pushed and popped */
    int n_buf, cap_buf;
    int32_t *work;
    int cap_work;
    uint64_t *allowed; /* bit per id */
    int words;         /* of a mask */
    mask_memo *memo;
    int n_memo; /* slots; 0: masks are always walked */
    uint64_t clock;
    uint32_t *key; /* the configuration being masked */
    int n_key, cap_key;
    long hits, misses;
    int fast;           /* INFER_GRAM_ flags */
    uint8_t *set_plain; /* [n_sets] PLAIN_ */
    int overflow;       /* a set or expansion went past its bound */
    int made;           /* nodes made by the expansion in progress */
    struct walk_frame *frames;
    int cap_frames;
    int *chain; /* pairs: the walk's first set, then the sets after 1, 2, ... plain code points */
    int cap_chain;
};

struct walk_frame {
    int32_t trie, child;
    int set0, set1; /* its stack set: buf[set0, set1) */
    int nodes_top, buf_top;
    utf8_at u;
    int loop; /* the set reads every plain code point back to itself: 1, 0 not, -1 unknown */
    int succ0, succ1; /* the set after any plain code point, buf[succ0, succ1); -1: not known */
    int chk;          /* the set is chain[chk] of the walk, -1 when it is not */
};

/* How a grammar set meets the plain code points, found when first asked. */
enum { PLAIN_UNKNOWN = 0, PLAIN_ALL, PLAIN_NONE, PLAIN_SOME };

static int grow(void **p, int *cap, int need, size_t elem) {
    if (need <= *cap) return 0;
    int c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * elem);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

/* ---- the vocabulary's trie ------------------------------------------------------------------ */

void tlm_grammar_vocab_free(tlm_grammar_vocab *v) {
    if (!v) return;
    free(v->kind);
    free(v->node);
    free(v->tok_next);
    free(v->dfs);
    free(v->sub_lo);
    free(v->sub_hi);
    free(v->plain_below);
    free(v);
}

static int32_t trie_child(tlm_grammar_vocab *v, int32_t n, uint8_t b) {
    int32_t c = v->node[n].child;
    for (; c >= 0; c = v->node[c].sibling)
        if (v->node[c].byte == b) return c;
    if (grow((void **)&v->node, &v->cap_node, v->n_node + 1, sizeof *v->node)) return -1;
    c = v->n_node++;
    v->node[c] = (tnode){-1, v->node[n].child, -1, b};
    v->node[n].child = c;
    return c;
}

/* ok[i] for i in [0, len]: bytes [i, len) are whole, valid UTF-8 characters, all plain. */
static void plain_suffixes(const uint8_t *b, int len, uint8_t *ok) {
    ok[len] = 1;
    for (int i = len - 1; i >= 0; i--) {
        uint32_t c = b[i];
        int n = 0;
        ok[i] = 0;
        if (c < 0x80) {
            ok[i] = plain_cp(c) && ok[i + 1];
            continue;
        }
        uint32_t min = 0;
        if (c >= 0xC2 && c <= 0xDF)
            n = 1, c &= 0x1F, min = 0x80;
        else if (c >= 0xE0 && c <= 0xEF)
            n = 2, c &= 0x0F, min = 0x800;
        else if (c >= 0xF0 && c <= 0xF4)
            n = 3, c &= 0x07, min = 0x10000;
        if (!n || i + n > len - 1) continue;
        int good = 1;
        for (int k = 1; k <= n && good; k++) {
            if ((b[i + k] & 0xC0) != 0x80) good = 0;
            c = (c << 6) | (b[i + k] & 0x3Fu);
        }
        ok[i] = good && c >= min && plain_cp(c) && ok[i + n + 1];
    }
}

/* The depth-first order of the text tokens, each node's range in it, and plain_below. */
static int index_subtrees(tlm_grammar_vocab *v) {
    int n = v->n_node;
    v->dfs = malloc((size_t)v->n_ids * sizeof *v->dfs);
    v->sub_lo = malloc((size_t)n * sizeof *v->sub_lo);
    v->sub_hi = malloc((size_t)n * sizeof *v->sub_hi);
    v->plain_below = malloc((size_t)n);
    int32_t *stack = malloc((size_t)(v->max_len + 2) * 2 * sizeof *stack);
    uint8_t *ok = malloc((size_t)v->max_len + 1);
    if (!v->dfs || !v->sub_lo || !v->sub_hi || !v->plain_below || !stack || !ok) {
        free(stack);
        free(ok);
        return -1;
    }
    memset(v->plain_below, 1, (size_t)n);
    int k = 0, sp = 0;
    /* stack pairs: a node and the next child to enter (-2: not entered yet) */
    stack[sp++] = 0;
    stack[sp++] = -2;
    while (sp) {
        int32_t nd = stack[sp - 2], c = stack[sp - 1];
        if (c == -2) {
            v->sub_lo[nd] = k;
            for (int32_t id = v->node[nd].tok; id >= 0; id = v->tok_next[id]) v->dfs[k++] = id;
            c = v->node[nd].child;
        }
        if (c < 0) {
            v->sub_hi[nd] = k;
            sp -= 2;
            continue;
        }
        stack[sp - 1] = v->node[c].sibling;
        stack[sp++] = c;
        stack[sp++] = -2;
    }
    for (int id = 0; id < v->n_ids; id++) {
        const char *b;
        size_t len;
        if (v->kind[id] != TOK_TEXT || tlm_tokenizer_piece(v->t, id, &b, &len)) continue;
        plain_suffixes((const uint8_t *)b, (int)len, ok);
        int32_t nd = 0;
        for (size_t i = 0; i < len; i++) {
            if (!ok[i]) v->plain_below[nd] = 0;
            for (nd = v->node[nd].child; v->node[nd].byte != (uint8_t)b[i];)
                nd = v->node[nd].sibling;
        }
    }
    free(stack);
    free(ok);
    return 0;
}

tlm_status tlm_grammar_vocab_new(const tlm_tokenizer *t, int n_ids, tlm_grammar_vocab **out) {
    if (!out) return core_err(TLM_ERR_ARG, "grammar vocabulary: out must not be NULL");
    *out = NULL;
    if (!t) return core_err(TLM_ERR_ARG, "grammar vocabulary: NULL tokenizer");
    int nt = (int)tlm_tokenizer_vocab_size(t);
    if (n_ids < nt) n_ids = nt;
    if (n_ids <= 0 || n_ids > TLM_MAX_VOCAB_SIZE)
        return core_err(TLM_ERR_ARG, "grammar vocabulary: %d ids", n_ids);
    tlm_grammar_vocab *v = calloc(1, sizeof *v);
    if (!v) return core_err(TLM_ERR_NOMEM, "out of memory");
    v->t = t;
    v->n_ids = n_ids;
    v->kind = malloc((size_t)n_ids);
    v->tok_next = malloc((size_t)n_ids * sizeof *v->tok_next);
    if (!v->kind || !v->tok_next || grow((void **)&v->node, &v->cap_node, 1, sizeof *v->node))
        goto oom;
    v->node[0] = (tnode){-1, -1, -1, 0};
    v->n_node = 1;
    for (int id = 0; id < n_ids; id++) {
        v->tok_next[id] = -1;
        const char *b;
        size_t len;
        if (id >= nt || tlm_tokenizer_piece(t, id, &b, &len)) {
            v->kind[id] = TOK_NEVER;
            continue;
        }
        if (tlm_tokenizer_is_eog(t, id)) {
            v->kind[id] = TOK_END;
            continue;
        }
        /* Other special tokens decode to nothing in generated text (TLM_DECODE_SKIP_SPECIAL), so
         * their pieces are not what the grammar would see. */
        if (!len || tlm_tokenizer_is_special(t, id)) {
            v->kind[id] = TOK_NEVER;
            continue;
        }
        v->kind[id] = TOK_TEXT;
        int32_t n = 0;
        for (size_t i = 0; i < len; i++)
            if ((n = trie_child(v, n, (uint8_t)b[i])) < 0) goto oom;
        v->tok_next[id] = v->node[n].tok;
        v->node[n].tok = id;
        if ((int)len > v->max_len) v->max_len = (int)len;
    }
    if (index_subtrees(v)) goto oom;
    *out = v;
    return TLM_OK;
oom:
    tlm_grammar_vocab_free(v);
    return core_err(TLM_ERR_NOMEM, "out of memory for a grammar vocabulary of %d ids", n_ids);
}

/* ---- stacks --------------------------------------------------------------------------------- */

static int32_t new_node(tlm_grammar_state *s, uint32_t pos, int32_t up, uint32_t depth) {
    if (depth > GM_MAX_DEPTH) return -2; /* dropped */
    if (++s->made > GM_MAX_EXPAND) {
        s->overflow = 1;
        return -2;
    }
    if (grow((void **)&s->nodes, &s->cap_nodes, s->n_nodes + 1, sizeof *s->nodes)) {
        s->overflow = 2;
        return -2;
    }
    s->nodes[s->n_nodes] = (gnode){pos, up, depth};
    return s->n_nodes++;
}

static int same_stack(const tlm_grammar_state *s, int32_t a, int32_t b) {
    while (a != b) {
        if (a < 0 || b < 0 || s->nodes[a].pos != s->nodes[b].pos) return 0;
        a = s->nodes[a].up;
        b = s->nodes[b].up;
    }
    return 1;
}

/* Appends stack n to the set being built at buf[from, n_buf) unless it holds it already. */
static void add_stack(tlm_grammar_state *s, int from, int32_t n) {
    for (int i = from; i < s->n_buf; i++)
        if (same_stack(s, s->buf[i], n)) return;
    if (s->n_buf - from >= GM_MAX_STACKS) {
        s->overflow = 1;
        return;
    }
    if (grow((void **)&s->buf, &s->cap_buf, s->n_buf + 1, sizeof *s->buf)) {
        s->overflow = 2;
        return;
    }
    s->buf[s->n_buf++] = n;
}

/* Expands stack n until every top is a set (or the stack is empty), adding each to the set at
 * buf[from, ...). Iterative: the nesting of references at a position is the grammar's to choose. */
static void expand(tlm_grammar_state *s, int from, int32_t n) {
    const struct tlm_grammar *g = s->g;
    int nw = 0;
    if (n == -2) return; /* the stack was dropped (too deep) */
    if (grow((void **)&s->work, &s->cap_work, 1, sizeof *s->work)) {
        s->overflow = 2;
        return;
    }
    s->work[nw++] = n;
    while (nw && !s->overflow) {
        int32_t x = s->work[--nw];
        if (x < 0) {
            add_stack(s, from, -1);
            continue;
        }
        const infer_gram_el *e = &g->el[s->nodes[x].pos];
        if (e->type == INFER_G_SET) {
            add_stack(s, from, x);
            continue;
        }
        /* a reference: pop it, push where to go on after the rule, then the rule's start */
        uint32_t pos = s->nodes[x].pos, depth = s->nodes[x].depth;
        int32_t rest = s->nodes[x].up;
        if (!infer_gram_at_end(g, pos + 1)) {
            rest = new_node(s, pos + 1, rest, depth);
            if (rest == -2) continue;
        }
        int rule = (int)e->v, na = g->alt_off[rule + 1] - g->alt_off[rule];
        if (grow((void **)&s->work, &s->cap_work, nw + na, sizeof *s->work)) {
            s->overflow = 2;
            return;
        }
        /* pushed last to first, so the stacks come out in the grammar's order */
        for (int a = g->alt_off[rule + 1] - 1; a >= g->alt_off[rule]; a--) {
            uint32_t start = (uint32_t)g->alt_pos[a];
            if (infer_gram_at_end(g, start)) {
                s->work[nw++] = rest;
            } else {
                int32_t y = new_node(s, start, rest, (rest >= 0 ? s->nodes[rest].depth : 0) + 1);
                if (y != -2) s->work[nw++] = y;
            }
        }
    }
}

/* The set buf[a0, a1) after code point cp, appended at the end of buf. */
static void advance(tlm_grammar_state *s, int a0, int a1, uint32_t cp) {
    const struct tlm_grammar *g = s->g;
    int from = s->n_buf;
    s->made = 0;
    for (int i = a0; i < a1 && !s->overflow; i++) {
        int32_t x = s->buf[i];
        if (x < 0) continue;
        const gnode *nd = &s->nodes[x];
        if (!infer_gram_set_has(g, g->el[nd->pos].v, cp)) continue;
        int32_t rest = nd->up;
        if (!infer_gram_at_end(g, nd->pos + 1)) {
            rest = new_node(s, nd->pos + 1, rest, nd->depth);
            if (rest == -2) continue;
        }
        expand(s, from, rest);
    }
}

/* Some stack of buf[a0, a1) can read a code point of [lo, hi]. */
static int any_meets(const tlm_grammar_state *s, int a0, int a1, uint32_t lo, uint32_t hi) {
    for (int i = a0; i < a1; i++) {
        int32_t x = s->buf[i];
        if (x >= 0 && infer_gram_set_meets(s->g, s->g->el[s->nodes[x].pos].v, lo, hi)) return 1;
    }
    return 0;
}

/* One byte on from the set buf[*a0, *a1) and decoder *u: 1 and the new set (appended to buf, or
 * the same slice while a character is unfinished) when some stack survives, 0 otherwise. */
static int step_byte(tlm_grammar_state *s, int *a0, int *a1, utf8_at *u, uint8_t b) {
    uint32_t cp;
    if (u->need == 0) {
        if (b < 0x80) {
            cp = b;
            goto whole;
        }
        if (b >= 0xC2 && b <= 0xDF)
            *u = (utf8_at){b & 0x1Fu, 1, 0x80};
        else if (b >= 0xE0 && b <= 0xEF)
            *u = (utf8_at){b & 0x0Fu, 2, 0x800};
        else if (b >= 0xF0 && b <= 0xF4)
            *u = (utf8_at){b & 0x07u, 3, 0x10000};
        else
            return 0;
    } else {
        if ((b & 0xC0) != 0x80) return 0;
        u->cp = (u->cp << 6) | (b & 0x3Fu);
        if (--u->need == 0) {
            cp = u->cp;
            if (cp < u->min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
            goto whole;
        }
    }
    {
        uint32_t shift = 6 * u->need, lo = u->cp << shift, hi = lo | ((1u << shift) - 1);
        if (lo < u->min) lo = u->min;
        if (hi > 0x10FFFF) hi = 0x10FFFF;
        return lo <= hi && any_meets(s, *a0, *a1, lo, hi);
    }
whole:
    u->cp = 0;
    {
        int from = s->n_buf;
        advance(s, *a0, *a1, cp);
        *a0 = from;
        *a1 = s->n_buf;
        return *a1 > *a0;
    }
}

/* ---- states --------------------------------------------------------------------------------- */

void tlm_grammar_state_free(tlm_grammar_state *s) {
    if (!s) return;
    free(s->nodes);
    free(s->stacks);
    free(s->buf);
    free(s->work);
    free(s->allowed);
    free(s->frames);
    free(s->chain);
    for (int i = 0; i < s->n_memo; i++) {
        free(s->memo[i].key);
        free(s->memo[i].bits);
    }
    free(s->memo);
    free(s->key);
    free(s->set_plain);
    free(s);
}

static tlm_status overflow_err(const tlm_grammar_state *s) {
    if (s->overflow == 2) return core_err(TLM_ERR_NOMEM, "grammar: out of memory");
    return core_err(TLM_ERR_RANGE,
                    "grammar: too ambiguous (more than %d stacks at one point, or %d nodes made "
                    "by one step)",
                    GM_MAX_STACKS, GM_MAX_EXPAND);
}

/* Makes buf[a0, a1) the state's set, keeping only the nodes it reaches (parents always precede
 * their children in the arena, so one forward pass renumbers them). */
static tlm_status commit(tlm_grammar_state *s, int a0, int a1) {
    int n = a1 - a0;
    if (grow((void **)&s->stacks, &s->cap_stacks, n, sizeof *s->stacks))
        return core_err(TLM_ERR_NOMEM, "grammar: out of memory");
    int32_t *map = malloc((size_t)(s->n_nodes ? s->n_nodes : 1) * sizeof *map);
    if (!map) return core_err(TLM_ERR_NOMEM, "grammar: out of memory");
    for (int i = 0; i < s->n_nodes; i++) map[i] = -1;
    for (int i = a0; i < a1; i++)
        for (int32_t x = s->buf[i]; x >= 0 && map[x] == -1; x = s->nodes[x].up) map[x] = 0;
    int k = 0;
    for (int i = 0; i < s->n_nodes; i++) {
        if (map[i] < 0) continue;
        gnode nd = s->nodes[i];
        nd.up = nd.up >= 0 ? map[nd.up] : -1;
        s->nodes[k] = nd;
        map[i] = k++;
    }
    for (int i = 0; i < n; i++) s->stacks[i] = s->buf[a0 + i] >= 0 ? map[s->buf[a0 + i]] : -1;
    s->n_stacks = n;
    s->n_nodes = k;
    s->n_buf = 0;
    free(map);
    return TLM_OK;
}

void tlm_grammar_state_reset(tlm_grammar_state *s) {
    if (!s) return;
    const struct tlm_grammar *g = s->g;
    s->n_nodes = 0;
    s->n_buf = 0;
    s->overflow = 0;
    s->made = 0;
    s->ended = 0;
    s->u = (utf8_at){0, 0, 0};
    for (int a = g->alt_off[g->root]; a < g->alt_off[g->root + 1]; a++) {
        uint32_t start = (uint32_t)g->alt_pos[a];
        expand(s, 0, infer_gram_at_end(g, start) ? -1 : new_node(s, start, -1, 1));
    }
    if (s->overflow || commit(s, 0, s->n_buf)) s->n_stacks = 0;
}

tlm_status tlm_grammar_state_new(const tlm_grammar *g, const tlm_grammar_vocab *v,
                                 tlm_grammar_state **out) {
    if (!out) return core_err(TLM_ERR_ARG, "grammar state: out must not be NULL");
    *out = NULL;
    if (!g) return core_err(TLM_ERR_ARG, "grammar state: NULL grammar");
    tlm_grammar_state *s = calloc(1, sizeof *s);
    if (!s) return core_err(TLM_ERR_NOMEM, "out of memory");
    s->g = g;
    s->v = v;
    s->fast = INFER_GRAM_MEMO | INFER_GRAM_SKIP;
    if (!(s->set_plain = calloc((size_t)(g->n_sets ? g->n_sets : 1), 1))) {
        tlm_grammar_state_free(s);
        return core_err(TLM_ERR_NOMEM, "out of memory");
    }
    if (v) {
        s->words = (v->n_ids + 63) / 64;
        s->allowed = malloc((size_t)s->words * sizeof *s->allowed);
        size_t per = (size_t)s->words * sizeof(uint64_t) + GM_MEMO_KEY_MAX * sizeof(uint32_t);
        s->n_memo = (int)(INFER_GRAM_MEMO_BYTES / per);
        if (s->n_memo > GM_MEMO_ENTRIES) s->n_memo = GM_MEMO_ENTRIES;
        if (s->n_memo && !(s->memo = calloc((size_t)s->n_memo, sizeof *s->memo))) s->n_memo = 0;
        if (!s->allowed) {
            tlm_grammar_state_free(s);
            return core_err(TLM_ERR_NOMEM, "out of memory");
        }
    }
    tlm_grammar_state_reset(s);
    if (s->overflow) {
        tlm_status st = overflow_err(s);
        tlm_grammar_state_free(s);
        return st;
    }
    *out = s;
    return TLM_OK;
}

int tlm_grammar_state_complete(const tlm_grammar_state *s) {
    if (!s || s->u.need) return 0;
    for (int i = 0; i < s->n_stacks; i++)
        if (s->stacks[i] < 0) return 1;
    return 0;
}

/* Copies the state's set to the start of buf (the walk's first frame). */
static int load_set(tlm_grammar_state *s) {
    s->n_buf = 0;
    s->overflow = 0;
    if (grow((void **)&s->buf, &s->cap_buf, s->n_stacks, sizeof *s->buf)) return -1;
    memcpy(s->buf, s->stacks, (size_t)s->n_stacks * sizeof *s->buf);
    s->n_buf = s->n_stacks;
    return 0;
}

tlm_status tlm_grammar_state_accept_bytes(tlm_grammar_state *s, const void *bytes, size_t len) {
    if (!s || (!bytes && len)) return core_err(TLM_ERR_ARG, "grammar: NULL argument");
    if (s->ended) return core_err(TLM_ERR_RANGE, "grammar: the generation has ended");
    int base = s->n_nodes;
    if (load_set(s)) return core_err(TLM_ERR_NOMEM, "grammar: out of memory");
    int a0 = 0, a1 = s->n_buf;
    utf8_at u = s->u;
    const uint8_t *b = bytes;
    for (size_t i = 0; i < len; i++) {
        if (!step_byte(s, &a0, &a1, &u, b[i])) {
            tlm_status st = s->overflow ? overflow_err(s)
                                        : core_err(TLM_ERR_RANGE,
                                                   "grammar: byte %zu (0x%02X) of the text is not "
                                                   "allowed there",
                                                   i, b[i]);
            s->n_nodes = base;
            s->n_buf = 0;
            return st;
        }
    }
    tlm_status st = commit(s, a0, a1);
    if (st) return st;
    s->u = u;
    return TLM_OK;
}

tlm_status tlm_grammar_state_accept(tlm_grammar_state *s, int32_t id) {
    if (!s || !s->v) return core_err(TLM_ERR_ARG, "grammar: a state without a vocabulary");
    if (id < 0 || id >= s->v->n_ids)
        return core_err(TLM_ERR_RANGE, "grammar: token %d is outside the vocabulary", (int)id);
    if (s->ended) return core_err(TLM_ERR_RANGE, "grammar: the generation has ended");
    switch (s->v->kind[id]) {
    case TOK_END:
        if (!tlm_grammar_state_complete(s))
            return core_err(TLM_ERR_RANGE,
                            "grammar: token %d ends the text before the grammar "
                            "is complete",
                            (int)id);
        s->ended = 1;
        return TLM_OK;
    case TOK_NEVER:
        return core_err(TLM_ERR_RANGE, "grammar: token %d (special or empty) is never allowed",
                        (int)id);
    default: break;
    }
    const char *b;
    size_t len;
    tlm_tokenizer_piece(s->v->t, id, &b, &len);
    tlm_status st = tlm_grammar_state_accept_bytes(s, b, len);
    if (st == TLM_ERR_RANGE)
        return core_err(TLM_ERR_RANGE, "grammar: token %d is not allowed here", (int)id);
    return st;
}

static int set_plain(tlm_grammar_state *s, uint32_t set) {
    if (s->set_plain[set] == PLAIN_UNKNOWN) {
        /* the plain code points as ranges (surrogates never come out of the decoder) */
        static const uint32_t pr[][2] = {
            {0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0x7E}, {0x80, 0xD7FF}, {0xE000, 0x10FFFF}};
        const uint32_t *r = s->g->rng + 2 * (size_t)s->g->set_off[set];
        int nr = s->g->set_off[set + 1] - s->g->set_off[set], all = 1, none = 1;
        for (int k = 0; k < 5; k++) {
            int inside = 0;
            for (int i = 0; i < nr; i++) {
                if (r[2 * i] <= pr[k][0] && pr[k][1] <= r[2 * i + 1]) inside = 1;
                if (r[2 * i] <= pr[k][1] && pr[k][0] <= r[2 * i + 1]) none = 0;
            }
            all &= inside;
        }
        s->set_plain[set] = all ? PLAIN_ALL : none ? PLAIN_NONE : PLAIN_SOME;
    }
    return s->set_plain[set];
}

/* 1 when reading any plain code point from the set buf[a0, a1) gives the same set again. Every
 * top holding all of them or none, every plain code point moves the same stacks, so one ('a')
 * stands for all: that set is left in buf as [*s0, *s1) (the set itself when it is the same), for
 * the children of a trie node to share; *s0 = -1 where the plain code points differ. */
static int plain_loop(tlm_grammar_state *s, int a0, int a1, int *s0, int *s1) {
    *s0 = *s1 = -1;
    for (int i = a0; i < a1; i++)
        if (s->buf[i] >= 0 && set_plain(s, s->g->el[s->nodes[s->buf[i]].pos].v) == PLAIN_SOME)
            return 0;
    int from = s->n_buf, nodes_top = s->n_nodes, same = 0;
    advance(s, a0, a1, 'a');
    if (s->overflow) {
        /* the walk meets the same bound if it reads such a code point */
        s->overflow = 0;
        s->n_buf = from;
        s->n_nodes = nodes_top;
        return 0;
    }
    if (s->n_buf - from == a1 - a0) {
        same = 1;
        for (int i = from; i < s->n_buf && same; i++) {
            int found = 0;
            for (int k = a0; k < a1 && !found; k++) found = same_stack(s, s->buf[i], s->buf[k]);
            same = found;
        }
    }
    if (same) {
        s->n_buf = from;
        s->n_nodes = nodes_top;
        *s0 = a0;
        *s1 = a1;
    } else {
        *s0 = from;
        *s1 = s->n_buf;
    }
    return same;
}

/* Marks allowed[] for every text token the state can read: the depth-first walk over the trie.
 * Below a node where the set reads plain code points back to itself, a subtree whose tokens go on
 * in plain characters only is allowed whole. */
static void walk(tlm_grammar_state *s) {
    const tlm_grammar_vocab *v = s->v;
    int depth_cap = v->max_len + 2;
    if (grow((void **)&s->frames, &s->cap_frames, depth_cap, sizeof *s->frames)) {
        s->overflow = 2;
        return;
    }
    int skip = s->fast & INFER_GRAM_SKIP;
    struct walk_frame *f = s->frames;
    int sp = 0, set1 = s->n_buf;
    /* The sets after k plain code points from the first, made once below every frame so that all
     * trie nodes reached through plain characters only share them. */
    int *ch = NULL, nch = 0, chain_loop = 0;
    if (skip && !s->u.need && !grow((void **)&s->chain, &s->cap_chain, 2 * depth_cap, sizeof *ch)) {
        ch = s->chain;
        ch[0] = 0;
        ch[1] = set1;
        nch = 1;
        while (nch < depth_cap) {
            int s0, s1;
            if (plain_loop(s, ch[2 * nch - 2], ch[2 * nch - 1], &s0, &s1)) {
                chain_loop = 1;
                break;
            }
            if (s0 < 0) break;
            ch[2 * nch] = s0;
            ch[2 * nch + 1] = s1;
            nch++;
            if (s1 == s0) break; /* no stack reads a plain code point */
        }
    }
    /* the successor of chain[k]: chain[k + 1], chain[k] itself at the end of a loop, or none */
#define CHAIN_NEXT(k) ((k) + 1 < nch ? (k) + 1 : chain_loop ? (k) : -1)
    {
        int nk = nch ? CHAIN_NEXT(0) : -1;
        f[sp++] = (struct walk_frame){0,
                                      v->node[0].child,
                                      0,
                                      set1,
                                      s->n_nodes,
                                      s->n_buf,
                                      s->u,
                                      nch ? chain_loop && nch == 1 : -1,
                                      nk >= 0 ? ch[2 * nk] : -1,
                                      nk >= 0 ? ch[2 * nk + 1] : -1,
                                      nch ? 0 : -1};
    }
    while (sp && !s->overflow) {
        struct walk_frame *top = &f[sp - 1];
        int32_t c = top->child;
        if (c < 0) {
            sp--;
            /* back out of the subtree: its nodes and sets go */
            s->n_nodes = top->nodes_top;
            s->n_buf = top->buf_top;
            continue;
        }
        top->child = v->node[c].sibling;
        int a0 = top->set0, a1 = top->set1, nodes_top = s->n_nodes, buf_top = s->n_buf;
        utf8_at u = top->u;
        uint8_t b = v->node[c].byte;
        /* the code point this byte completes, if it does */
        uint32_t cp = u.need ? (u.cp << 6) | (b & 0x3Fu) : b;
        int alive, chk = -1;
        if (top->succ0 >= 0 && !u.need && b < 0x80 && plain_cp(b)) {
            a0 = top->succ0;
            a1 = top->succ1;
            alive = a1 > a0;
            if (top->chk >= 0) chk = CHAIN_NEXT(top->chk);
        } else {
            alive = step_byte(s, &a0, &a1, &u, b);
        }
        if (!alive) {
            s->n_nodes = nodes_top;
            s->n_buf = buf_top;
            continue;
        }
        for (int32_t id = v->node[c].tok; id >= 0; id = v->tok_next[id])
            s->allowed[id >> 6] |= 1ull << (id & 63);
        if (v->node[c].child < 0) {
            s->n_nodes = nodes_top;
            s->n_buf = buf_top;
            continue;
        }
        /* known for the frame's children to inherit through plain characters */
        int loop = u.need ? top->loop : top->loop == 1 && plain_cp(cp) ? 1 : -1;
        int s0 = -1, s1 = -1;
        if (chk >= 0) {
            int nk = CHAIN_NEXT(chk);
            loop = chain_loop && chk == nch - 1;
            if (nk >= 0) s0 = ch[2 * nk], s1 = ch[2 * nk + 1];
        }
        if (skip && !u.need) {
            if (loop < 0)
                loop = plain_loop(s, a0, a1, &s0, &s1);
            else if (loop == 1)
                s0 = a0, s1 = a1;
            if (loop == 1 && v->plain_below[c]) {
                for (int32_t k = v->sub_lo[c]; k < v->sub_hi[c]; k++)
                    s->allowed[v->dfs[k] >> 6] |= 1ull << (v->dfs[k] & 63);
                s->n_nodes = nodes_top;
                s->n_buf = buf_top;
                continue;
            }
        }
        f[sp++] = (struct walk_frame){
            c, v->node[c].child, a0, a1, nodes_top, buf_top, u, loop, s0, s1, chk};
    }
#undef CHAIN_NEXT
}

/* Writes the state's configuration to key[]: the decoder, then each stack as its length and its
 * positions from the top (a node's depth follows from the positions below it). -1 when it is longer
 * than GM_MEMO_KEY_MAX words or memory is short. */
static int make_key(tlm_grammar_state *s, uint64_t *hash) {
    int n = 0;
    uint32_t head[4] = {s->u.cp, s->u.need, s->u.min, (uint32_t)s->n_stacks};
    if (grow((void **)&s->key, &s->cap_key, 4, sizeof *s->key)) return -1;
    memcpy(s->key, head, sizeof head);
    n = 4;
    for (int i = 0; i < s->n_stacks; i++) {
        int32_t x = s->stacks[i];
        uint32_t len = 0;
        for (int32_t y = x; y >= 0 && len <= GM_MEMO_KEY_MAX; y = s->nodes[y].up) len++;
        if (n + 1 + (int64_t)len > GM_MEMO_KEY_MAX) return -1;
        if (grow((void **)&s->key, &s->cap_key, n + 1 + (int)len, sizeof *s->key)) return -1;
        s->key[n++] = len;
        for (; x >= 0; x = s->nodes[x].up) s->key[n++] = s->nodes[x].pos;
    }
    uint64_t h = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < n; i++) {
        h = (h ^ s->key[i]) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
    }
    s->n_key = n;
    *hash = h;
    return 0;
}

static mask_memo *memo_find(tlm_grammar_state *s, uint64_t hash) {
    for (int i = 0; i < s->n_memo; i++) {
        mask_memo *m = &s->memo[i];
        if (m->used && m->hash == hash && m->n_key == s->n_key &&
            !memcmp(m->key, s->key, (size_t)s->n_key * sizeof *s->key))
            return m;
    }
    return NULL;
}

/* Keeps allowed[] for the configuration in key[], in a free slot or the least recently used. */
static void memo_store(tlm_grammar_state *s, uint64_t hash) {
    mask_memo *m = NULL;
    for (int i = 0; i < s->n_memo; i++)
        if (!m || s->memo[i].used < m->used) m = &s->memo[i];
    if (!m) return;
    m->used = 0;
    if (!m->bits && !(m->bits = malloc((size_t)s->words * sizeof *m->bits))) return;
    if (grow((void **)&m->key, &m->cap_key, s->n_key, sizeof *m->key)) return;
    memcpy(m->key, s->key, (size_t)s->n_key * sizeof *s->key);
    memcpy(m->bits, s->allowed, (size_t)s->words * sizeof *s->allowed);
    m->n_key = s->n_key;
    m->hash = hash;
    m->used = ++s->clock;
}

void infer_gram_state_fast(tlm_grammar_state *s, int flags) {
    if (!s) return;
    s->fast = flags;
    for (int i = 0; i < s->n_memo; i++) s->memo[i].used = 0;
}

void infer_gram_state_memo_stats(const tlm_grammar_state *s, long *hits, long *misses,
                                 size_t *bytes) {
    size_t b = 0;
    for (int i = 0; i < s->n_memo; i++)
        b += (size_t)s->memo[i].cap_key * sizeof(uint32_t) +
             (s->memo[i].bits ? (size_t)s->words * sizeof(uint64_t) : 0);
    if (hits) *hits = s->hits;
    if (misses) *misses = s->misses;
    if (bytes) *bytes = b;
}

tlm_status tlm_grammar_state_mask(tlm_grammar_state *s, float *logits, int n, int *n_allowed) {
    if (n_allowed) *n_allowed = 0;
    if (!s || !logits || !s->v) return core_err(TLM_ERR_ARG, "grammar mask: NULL argument");
    const tlm_grammar_vocab *v = s->v;
    const uint64_t *bits = s->allowed;
    memset(s->allowed, 0, (size_t)s->words * sizeof *s->allowed);
    if (!s->ended) {
        uint64_t hash = 0;
        int keyed = (s->fast & INFER_GRAM_MEMO) && s->n_memo && !make_key(s, &hash);
        mask_memo *m = keyed ? memo_find(s, hash) : NULL;
        if (m) {
            m->used = ++s->clock;
            bits = m->bits;
            s->hits++;
        } else {
            int base = s->n_nodes;
            if (load_set(s)) return core_err(TLM_ERR_NOMEM, "grammar: out of memory");
            walk(s);
            s->n_nodes = base;
            s->n_buf = 0;
            if (s->overflow) return overflow_err(s);
            if (tlm_grammar_state_complete(s))
                for (int id = 0; id < v->n_ids; id++)
                    if (v->kind[id] == TOK_END) s->allowed[id >> 6] |= 1ull << (id & 63);
            if (keyed) memo_store(s, hash);
            s->misses++;
        }
    }
    int count = 0, m = n < v->n_ids ? n : v->n_ids;
    for (int id = 0; id < m; id++) {
        int ok = (int)(bits[id >> 6] >> (id & 63)) & 1;
        if (!ok) logits[id] = -INFINITY;
        count += ok;
    }
    for (int id = m; id < n; id++) logits[id] = -INFINITY;
    if (n_allowed) *n_allowed = count;
    return TLM_OK;
}
