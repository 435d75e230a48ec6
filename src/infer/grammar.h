/* Internal form of a compiled grammar (grammar.c makes it, grammar_match.c runs it). */
#ifndef TLM_INFER_GRAMMAR_H
#define TLM_INFER_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "core/core.h"

/* Every rule is a run of elements: its alternatives one after another, each closed by INFER_G_ALT
 * except the last, which INFER_G_END closes. An alternative is a sequence of INFER_G_SET (one code
 * point from a set of ranges) and INFER_G_REF (a rule). */
enum { INFER_G_END = 0, INFER_G_ALT, INFER_G_REF, INFER_G_SET };

typedef struct {
    uint32_t type;
    uint32_t v; /* INFER_G_REF: rule; INFER_G_SET: set */
} infer_gram_el;

struct tlm_grammar {
    infer_gram_el *el;
    int n_el;
    int n_rules, root;
    int32_t *alt_off; /* [n_rules + 1] into alt_pos */
    int32_t *alt_pos; /* the element where each alternative of each rule starts */
    /* Sets: sorted, disjoint, non-adjacent ranges [lo, hi] (negated classes complemented). */
    uint32_t *rng;    /* pairs */
    int32_t *set_off; /* [n_sets + 1] into rng, in pairs */
    int n_sets;
};

/* An alternative's next element ends it (INFER_G_ALT or INFER_G_END). */
static inline int infer_gram_at_end(const struct tlm_grammar *g, uint32_t pos) {
    return g->el[pos].type <= INFER_G_ALT;
}

static inline int infer_gram_set_has(const struct tlm_grammar *g, uint32_t set, uint32_t cp) {
    const uint32_t *r = g->rng + 2 * (size_t)g->set_off[set];
    int n = g->set_off[set + 1] - g->set_off[set];
    for (int i = 0; i < n; i++) {
        if (cp < r[2 * i]) return 0;
        if (cp <= r[2 * i + 1]) return 1;
    }
    return 0;
}

/* Some code point of [lo, hi] is in the set. */
static inline int infer_gram_set_meets(const struct tlm_grammar *g, uint32_t set, uint32_t lo,
                                       uint32_t hi) {
    const uint32_t *r = g->rng + 2 * (size_t)g->set_off[set];
    int n = g->set_off[set + 1] - g->set_off[set];
    for (int i = 0; i < n; i++)
        if (r[2 * i] <= hi && lo <= r[2 * i + 1]) return 1;
    return 0;
}

/* What a state's masks may take short cuts with (both by default; tests compare them with
 * neither). INFER_GRAM_MEMO: remember the masks of the configurations met (bounded in entries and
 * bytes), so that a configuration that returns, as at every step inside a free string, is not
 * walked again. INFER_GRAM_SKIP: allow a subtree of the trie whole where the configuration reads
 * every plain string character back to itself and the subtree's tokens continue in those only.
 * Setting them empties the memo. */
enum { INFER_GRAM_MEMO = 1, INFER_GRAM_SKIP = 2 };
#define INFER_GRAM_MEMO_BYTES (4 << 20) /* the most a state's memo holds */
struct tlm_grammar_state;
void infer_gram_state_fast(struct tlm_grammar_state *s, int flags);
/* Masks answered from the memo and walked, and the bytes the memo holds. */
void infer_gram_state_memo_stats(const struct tlm_grammar_state *s, long *hits, long *misses,
                                 size_t *bytes);

#endif
