/* Internal representation shared by every tokenizer kind. A tokenizer is a table of pieces (the
 * exact bytes each id decodes to) plus per-kind encoding data: merge ranks for byte-level BPE,
 * scores for SentencePiece-style vocabularies, nothing more for char-level. */
#ifndef TLM_TOK_INTERNAL_H
#define TLM_TOK_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "core/core.h"
#include "tlm.h"

/* Token attributes. */
enum {
    TOK_NORMAL = 0,  /* reachable from text by the encoder */
    TOK_SPECIAL = 1, /* control or user-defined: encoded atomically when specials are allowed */
    TOK_BYTE = 2,    /* SentencePiece byte fallback <0xNN> */
    TOK_UNUSED = 3,  /* never produced by the encoder (unused, or a duplicate piece) */
};

/* Open-addressing hash from byte strings (pieces of the table) to ids. Slots hold
 * (hash high bits << 32 | id + 1); 0 is empty. */
typedef struct {
    uint64_t *slots;
    size_t mask;
} tok_map;

/* Hash from a pair of ids to (rank << 32 | merged id). Keys of ~0 are empty. */
typedef struct {
    uint64_t *keys;
    uint64_t *vals;
    size_t mask;
} tok_pairmap;

/* A byte string with an id, in tables sorted by bytes (a proper prefix first), then by id. Such a
 * table answers exact and longest-prefix queries by binary search, so neither a vocabulary with
 * many specials nor a long text costs a pass over the whole table. */
typedef struct {
    const uint8_t *p;
    size_t len;
    int32_t id;
} tok_str;

void tok_strs_sort(tok_str *s, size_t n);
/* Index of the entry equal to p[0..n) with the lowest id, or -1. */
ptrdiff_t tok_strs_find(const tok_str *s, size_t ns, const uint8_t *p, size_t n);
/* Index of the longest entry that is a prefix of text[0..n) (lowest id among equal ones), or -1.
 * Costs O(d log ns) for a match depth d. */
ptrdiff_t tok_strs_longest_prefix(const tok_str *s, size_t ns, const uint8_t *text, size_t n);

/* BPE pre-tokenizers (GGUF tokenizer.ggml.pre): GPT-2's pattern, Llama 3's (digits in threes),
 * Qwen2's (digits one by one). */
enum { TOK_PRE_GPT2 = 0, TOK_PRE_LLAMA3 = 1, TOK_PRE_QWEN2 = 2 };

/* GGUF tokenizer.ggml.pre names of the pre-tokenizers tlm has, as llama.cpp maps them (with
 * whether it merges pre-tokens that are tokens); 0 for another name. */
int tok_pre_named(const char *p, size_t n, int *type, int *merge_known);
/* The name written for one (llama.cpp reads it back as the same pattern). */
const char *tok_pre_name(int type);

struct tlm_tokenizer {
    tlm_tokenizer_kind kind;
    int32_t n;     /* vocabulary size */
    uint8_t *data; /* all pieces, concatenated (== pieces.p) */
    struct {
        uint8_t *p;
        size_t n, cap;
    } pieces;
    uint64_t *off; /* [n + 1] piece i is data[off[i] .. off[i+1]) */
    uint8_t *attr; /* [n] TOK_* */
    float *scores; /* [n] SentencePiece scores, NULL otherwise */
    int32_t bos, eos, unk;
    int32_t eot, eom;         /* GGUF tokenizer.ggml.eot_token_id / eom_token_id, or -1 */
    int32_t byte_id[256];     /* BPE: single-byte token; SPM: byte-fallback token; -1: none */
    tok_map map;              /* pieces of TOK_NORMAL tokens */
    tok_pairmap merges;       /* BPE */
    int32_t (*merge_list)[2]; /* BPE merges in rank order (for saving) */
    int32_t n_merges;
    tok_str *specials; /* non-empty TOK_SPECIAL pieces, sorted (tok_strs_sort) */
    int n_specials;
    uint8_t special_first[256]; /* 1 if some special piece starts with this byte */
    int add_prefix;             /* SPM: dummy-prefix space at the start and after specials */
    int pre;                    /* BPE: the pre-tokenizer's pattern, TOK_PRE_* */
    int merge_known;            /* BPE: merge pre-tokens that are tokens too (llama.cpp's Qwen2
                                   vocabularies: ignore_merges off); else emit them whole */
    int add_bos;                /* -1: as the kind goes (SPM with a BOS); else the vocabulary's
                                   own word (GGUF tokenizer.ggml.add_bos_token) */
    int spm_split;              /* SPM: no piece holds a non-space byte then a space, so texts
                                   can be encoded word by word (see spm.c) */
    size_t max_piece;
};

static inline const uint8_t *tok_piece(const tlm_tokenizer *t, int32_t id, size_t *len) {
    *len = (size_t)(t->off[id + 1] - t->off[id]);
    return t->data + t->off[id];
}

uint64_t tok_hash(const uint8_t *p, size_t n);
uint64_t tok_hash_seeded(const uint8_t *p, size_t n, uint64_t seed);
/* The per-process secret of the lookup tables (tok_seed_init draws it; the table builders call
 * it). */
extern uint64_t tok_seed;
void tok_seed_init(void);
/* The slot of a pair key: a full mix of the key and the seed (a multiplicative hash of the bare
 * key let every pair sharing its low bits share a slot). */
static inline size_t tok_pair_slot(uint64_t k, size_t mask) {
    return (size_t)core_mix64(k ^ tok_seed) & mask;
}
tlm_status tok_map_build(tlm_tokenizer *t);
/* Id of a TOK_NORMAL piece or -1. */
int32_t tok_map_find(const tlm_tokenizer *t, const uint8_t *p, size_t n);

tlm_status tok_pairmap_init(tok_pairmap *m, size_t n);
void tok_pairmap_free(tok_pairmap *m);
void tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, uint32_t rank, int32_t merged);
/* Returns 1 and fills rank/merged if (a, b) is a merge. */
static inline int tok_pairmap_get(const tok_pairmap *m, int32_t a, int32_t b, uint32_t *rank,
                                  int32_t *merged) {
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t h = tok_pair_slot(k, m->mask);
    for (;;) {
        uint64_t kk = m->keys[h];
        if (kk == k) {
            uint64_t v = m->vals[h];
            *rank = (uint32_t)(v >> 32);
            *merged = (int32_t)(uint32_t)v;
            return 1;
        }
        if (kk == ~0ull) return 0;
        h = (h + 1) & m->mask;
    }
}

/* Growable byte/id buffers. */
typedef struct {
    uint8_t *p;
    size_t n, cap;
} tok_bytes;
tlm_status tok_bytes_put(tok_bytes *b, const void *p, size_t n);

typedef struct {
    int32_t *p;
    size_t n, cap;
} tok_ids;
tlm_status tok_ids_reserve(tok_ids *v, size_t extra);
static inline tlm_status tok_ids_push(tok_ids *v, int32_t id) {
    if (v->n == v->cap) {
        tlm_status s = tok_ids_reserve(v, 1);
        if (s) return s;
    }
    v->p[v->n++] = id;
    return TLM_OK;
}

/* Allocates an empty tokenizer with room for n tokens (attr zeroed, byte ids -1). */
tlm_status tok_alloc(tlm_tokenizer **out, tlm_tokenizer_kind kind, int32_t n);
/* Sets piece ids in order 0..n-1 (appends to the data). */
tlm_status tok_set_piece(tlm_tokenizer *t, int32_t id, const void *p, size_t len);
/* After every piece and attribute is set: builds the map, the specials table, max_piece. Pieces
 * that repeat an earlier normal piece are marked unused so that lookups are deterministic. The
 * specials table points into the piece data, so no piece may be added after this. */
tlm_status tok_finish(tlm_tokenizer *t);

/* Per-kind encoders of plain text (no specials); they append to out. */
tlm_status tok_bpe_encode_text(const tlm_tokenizer *t, const uint8_t *s, size_t n, tok_ids *out);
/* Merges one pre-token; use_heap forces the O(m log m) path (tests compare it with the quadratic
 * one used for short pre-tokens). */
tlm_status tok_bpe_merge_word(const tlm_tokenizer *t, const uint8_t *p, size_t m, tok_ids *out,
                              int use_heap);
tlm_status tok_spm_encode_text(const tlm_tokenizer *t, const uint8_t *s, size_t n, tok_ids *out);
tlm_status tok_char_encode_text(const tlm_tokenizer *t, const uint8_t *s, size_t n, tok_ids *out);

/* Loaders (path already identified). */
tlm_status tok_load_gpt2(const char *encoder_json, const char *vocab_bpe, tlm_tokenizer **out);
tlm_status tok_load_llama2c(const char *path, tlm_tokenizer **out);
/* With GGUF token types for every token (a tlm directory records them). */
tlm_status tok_load_llama2c_typed(const char *path, const int32_t *types, int32_t n_types,
                                  tlm_tokenizer **out);
tlm_status tok_load_gguf(const char *path, tlm_tokenizer **out);
tlm_status tok_load_tlm_dir(const char *dir, tlm_tokenizer **out);

/* Byte-level BPE from GPT-2-style strings (bytes-to-unicode alphabet). tokens[i] has id i; merges
 * are "A B" strings in rank order; types (GGUF token types, may be NULL) mark specials; when
 * types is NULL, multi-byte tokens that no merge produces are special. */
tlm_status tok_build_bpe(const char *const *tokens, const size_t *token_lens, int32_t n,
                         const char *const *merges, const size_t *merge_lens, int32_t n_merges,
                         const int32_t *types, tlm_tokenizer **out);

/* SentencePiece-style vocabulary from pieces as written in the file. Pieces "<0xNN>" become byte
 * fallback tokens; U+2581 stands for a space when space_marker is set (GGUF, HF); types are GGUF
 * token types (NULL: ids 0..2 named <unk>, <s>, </s> are the specials, llama2.c style). */
tlm_status tok_build_spm(const char *const *pieces, const size_t *lens, const float *scores,
                         int32_t n, const int32_t *types, int space_marker, tlm_tokenizer **out);

/* Char-level vocabulary from its characters in id order. */
tlm_status tok_build_char(const uint8_t *const *units, const size_t *lens, int32_t n,
                          tlm_tokenizer **out);

/* GPT-2's bytes-to-unicode alphabet. */
uint32_t tok_byte_to_cp(uint8_t b);
/* Decodes a GPT-2 alphabet string into raw bytes (out must hold len bytes). Returns -1 when a
 * character is outside the alphabet. */
long tok_gpt2_unmap(const char *s, size_t len, uint8_t *out);
/* Appends the GPT-2 alphabet form of raw bytes. */
tlm_status tok_gpt2_map(tok_bytes *b, const uint8_t *p, size_t n);

/* JSON string escaping into b (quotes included). */
tlm_status tok_json_string(tok_bytes *b, const uint8_t *p, size_t n);

#define TOK_MAX_INPUT ((size_t)INT32_MAX)
#define TOK_MAX_VOCAB (1 << 24)

#endif
