/* tlm/generate.h: sessions (the KV cache: prefill, decode), samplers and the generation loop. Part
 * of tlm.h, which is what programs include. */
#ifndef TLM_GENERATE_H
#define TLM_GENERATE_H

#include "base.h"
#include "lora.h"
#include "model.h"
#include "tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A session holds the KV cache of `batch` independent sequences over one model (which must outlive
 * it and may be shared by several sessions). Each layer caches n_kv_heads keys and values per
 * position, after RoPE, so cached keys are never rotated again. Prompts are prefilled in one
 * batched pass (matrix-matrix products); each later token goes through a matrix-vector path that
 * streams the weights once per step. Nothing is allocated per decode step. A sequence holds at
 * most `capacity` positions (<= context_length); there is no context shift: a sequence that is
 * full refuses more tokens with TLM_ERR_RANGE. A sliding-window layer keeps only a ring of its
 * last positions (step_max below). */
typedef struct tlm_session tlm_session;

typedef struct {
    int batch;    /* independent sequences (>= 1) */
    int capacity; /* positions per sequence; <= 0: context_length */
    /* The type of cached keys and values: TLM_DTYPE_F32 (0) or any of llama.cpp's cache types,
     * F16, BF16, Q8_0, Q5_1, Q5_0, IQ4_NL, Q4_1, Q4_0 (other types: TLM_ERR_ARG). F16: rounded to
     * IEEE half precision as they are cached (llama.cpp's default cache type), for half the memory
     * and half the traffic of attention over long contexts; logits then move by about 1e-4 to
     * 4e-4 of their largest magnitude against the F32 cache's. The block types quantize each
     * head's row of a position in GGUF blocks of 32, as llama.cpp's CPU backend stores them: Q8_0
     * takes 34 bytes per 32 values (53% of F16), logits moving by about 2e-3 to 7e-3; Q4_0 18
     * bytes (28%), about 2e-2 to 1e-1 (tests/test_generate.c, random models). The block types
     * need a head size that is a multiple of 32 (TLM_ERR_ARG otherwise). */
    tlm_dtype kv_type;
    /* Values in a type of their own (llama.cpp's -ctv apart from -ctk: keys in kv_type), where
     * v_type_set is nonzero: v_type, any of kv_type's. Otherwise kv_type for both. */
    int v_type_set;
    tlm_dtype v_type;
    /* The most new ids of one sequence that one pass writes into the cache of a model with
     * sliding-window layers (<= 0: 512): such a layer keeps a ring of the last sliding_window +
     * step_max - 1 positions (and a copy of its first sliding_window + 30 rows or fewer, so that
     * what attention reads is contiguous) instead of `capacity` positions, where that is smaller.
     * Prefills and steps with more ids of a sequence run as several passes. What a ring overwrote
     * is gone: tlm_session_truncate refuses a cut to n positions where it lost keys position n sees
     * (a cut of at most step_max positions never is), and tlm_session_save_prefix a sequence longer
     * than the ring (TLM_ERR_RANGE). Sessions without a ring ignore it. */
    int step_max;
} tlm_session_opts;

/* batch 1, capacity 0 (context_length), F32 keys and values. */
void tlm_session_opts_defaults(tlm_session_opts *o);
/* A session over m with options o (NULL: the defaults). */
tlm_status tlm_session_new(const tlm_model *m, const tlm_session_opts *o, tlm_session **out);
void tlm_session_free(tlm_session *s);
/* Sets n LoRA adapters on every sequence: each adapter is for this session's model and must
 * outlive its use; adapter i's products are multiplied by scales[i] (NULL: 1). Unmerged: the
 * model's weights stay as they are and other sessions over it run without them. n = 0 removes
 * them. Keys and values in the cache keep the adapters they were computed with. */
tlm_status tlm_session_set_loras(tlm_session *s, const tlm_lora *const *loras, const float *scales,
                                 int n);
/* The session's adapters' scales for sequence seq alone (tlm_session_num_loras values; 0 leaves
 * an adapter out of that sequence): rows of sequences with different scales share a step. */
tlm_status tlm_session_set_seq_lora_scales(tlm_session *s, int seq, const float *scales);
int tlm_session_num_loras(const tlm_session *s);
/* Faults in the KV cache's memory now. It is mapped lazily, so otherwise the first tokens of each
 * sequence pay for the kernel zeroing its pages (a large batch's cache is GiBs): a server calls
 * this at start-up so that no request waits on it in the middle of a decode step. */
void tlm_session_prefault(tlm_session *s);
/* Empties sequence seq's cache (seq < 0: every sequence). */
void tlm_session_reset(tlm_session *s, int seq);
int tlm_session_batch(const tlm_session *s);
/* The cache's type for keys (kv_type) and for values (v_type, or kv_type). */
tlm_dtype tlm_session_kv_type(const tlm_session *s);
tlm_dtype tlm_session_v_type(const tlm_session *s);
int tlm_session_capacity(const tlm_session *s);
/* Bytes of the whole KV cache (every sequence; the rings of sliding-window layers, not capacity).
 */
size_t tlm_session_kv_bytes(const tlm_session *s);
/* Positions cached so far for sequence seq (its next token's position). */
int tlm_session_length(const tlm_session *s, int seq);
/* Keeps only the first n cached positions of sequence seq (no-op when it holds n or fewer): the
 * next token goes to position n. Prefix reuse: a prompt sharing n tokens with what a sequence
 * holds continues from there instead of prefilling them again. */
tlm_status tlm_session_truncate(tlm_session *s, int seq, int n);
/* Saving a sequence's cached prefix outside the session, to load it later into any sequence of a
 * session of the same model (a server's prompt cache: a slot taken over by another request keeps
 * its keys and values in memory for a later request that starts the same way). The saved form
 * is the model's n_layers x 2 x n_kv_heads blocks of n positions x head_dim elements of the
 * session's cache types: load it only into a session with the same kv_type and v_type. */
size_t tlm_session_prefix_bytes(const tlm_session *s, int n);
/* Copies positions 0..n-1 of sequence seq (n <= its length) into buf of
 * tlm_session_prefix_bytes(s, n) bytes. */
tlm_status tlm_session_save_prefix(const tlm_session *s, int seq, int n, void *buf);
/* Loads the first n positions of a prefix of n_saved positions saved by tlm_session_save_prefix
 * into sequence seq (n <= n_saved, n <= capacity), which then holds exactly those n. */
tlm_status tlm_session_load_prefix(tlm_session *s, int seq, const void *buf, int n_saved, int n);

/* Appends n tokens to sequence seq in one batched pass. logits (may be NULL) receives [n, V]
 * logits when all_rows, else only the last token's [V]. */
tlm_status tlm_session_prefill(tlm_session *s, int seq, const int32_t *ids, int n, float *logits,
                               int all_rows);
/* Appends n tokens to sequence seq as tlm_session_prefill does and writes hidden [n, d_model]:
 * each token's final hidden state as the output product reads it (after the output norm of a
 * pre-norm model), which is what llama.cpp returns as a decoder model's embeddings. Adapters on
 * the output product do not change it. */
tlm_status tlm_session_prefill_hidden(tlm_session *s, int seq, const int32_t *ids, int n,
                                      float *hidden);
/* Appends one token to each sequence b with active[b] != 0 (active NULL: all of them) in one step;
 * logits [batch, V] receives the rows of the active sequences (others are left untouched). */
tlm_status tlm_session_decode(tlm_session *s, const int32_t *ids, const uint8_t *active,
                              float *logits);
/* Appends one token to sequence 0; logits receives [V]. */
tlm_status tlm_session_decode_one(tlm_session *s, int32_t id, float *logits);
/* One pass over new tokens of any of the sequences: n[b] >= 0 ids for sequence b, given
 * concatenated in ids (sequence 0's, then 1's, ...). Decoding one token of some sequences while
 * prefilling prompt chunks of others (or several prompts at once) then reads each weight once for
 * all of them, where separate tlm_session_prefill and tlm_session_decode calls read them once each.
 * logits (may be NULL) [batch, V] receives, for each sequence with n[b] > 0 and want[b] != 0 (want
 * NULL: all), the logits after its last new id; other rows are left untouched. */
tlm_status tlm_session_step(tlm_session *s, const int32_t *ids, const int *n, const uint8_t *want,
                            float *logits);

/* tlm_session_step giving the logits of the last rows[b] new ids of each sequence b (0 <= rows[b]
 * <= n[b]) rather than of the last one: logits receives sum(rows) rows of [V], sequence 0's in
 * order, then sequence 1's, and so on. Speculative decoding of several sequences in one pass:
 * each sequence's drafted ids are scored where the step also decodes or prefills the others. */
tlm_status tlm_session_step_rows(tlm_session *s, const int32_t *ids, const int *n, const int *rows,
                                 float *logits);

typedef struct {
    float temperature; /* 0: greedy (argmax, lowest id on ties); else logits / temperature */
    int top_k;         /* keep the k most likely ids; <= 0 keeps all */
    float top_p;       /* keep the smallest set of most likely ids with mass >= top_p; >= 1 all */
    uint64_t seed;
    uint64_t stream; /* independent streams for the same seed (e.g. one per batch member) */
    /* The rest is off when zero, so older initializers keep their meaning. */
    float min_p; /* drop ids whose probability is below min_p times the likeliest one's */
    /* Penalties over the last penalty_last_n ids given to tlm_sampler_accept (llama.cpp's rules):
     * a logit l of an id seen there becomes l / repeat_penalty (l > 0) or l * repeat_penalty, then
     * l - count * frequency_penalty - presence_penalty. repeat_penalty 0 or 1: off. */
    float repeat_penalty;
    float presence_penalty;
    float frequency_penalty;
    int penalty_last_n; /* 0: 64 */
} tlm_sampler_opts;

/* Defaults (llama.cpp's): temperature 0.8, top_k 40, top_p 0.95, seed 0, stream 0; every other
 * field 0 (min_p and the penalties off). */
void tlm_sampler_opts_defaults(tlm_sampler_opts *o);

/* Draws ids from logits. Reproducible: the same options and logits give the same ids. Neither
 * top-k nor top-p sorts the vocabulary (a k-heap, and a sort of only the ids that can be in the
 * nucleus). */
typedef struct tlm_sampler tlm_sampler;
tlm_status tlm_sampler_new(const tlm_sampler_opts *o, int vocab_size, tlm_sampler **out);
void tlm_sampler_free(tlm_sampler *s);
/* TLM_ERR_NUMERIC when the logits hold a NaN or no finite value. */
tlm_status tlm_sampler_sample(tlm_sampler *s, const float *logits, int32_t *id);
/* Records an id (of the prompt or generated) in the penalty window; a no-op without penalties.
 * tlm_session_generate accepts every prompt id and every sampled id. */
void tlm_sampler_accept(tlm_sampler *s, int32_t id);
/* The distribution tlm_sampler_sample draws from for these logits (after the penalties,
 * temperature, top-k, min-p and top-p), written to probs [vocab_size]: zero outside the ids kept,
 * and for temperature 0 a 1 at the id greedy decoding returns. Draws nothing: the sampler's random
 * stream is left where it was. TLM_ERR_NUMERIC as tlm_sampler_sample. */
tlm_status tlm_sampler_probs(tlm_sampler *s, const float *logits, float *probs);

/* ---- grammars (constrained sampling) ----------------------------------------------------------
 *
 * A grammar in llama.cpp's GBNF ("root ::= ..." and further rules: literals, character classes,
 * ".", alternation, grouping, * + ? {m,n}, # comments) compiled into a pushdown automaton over
 * Unicode code points. Left recursion, undefined rules, a missing root and grammars that match no
 * string are refused with the line and column (tlm_last_error). Immutable once made: any number of
 * threads may share one. */
typedef struct tlm_grammar tlm_grammar;
tlm_status tlm_grammar_parse(const char *gbnf, size_t len, tlm_grammar **out);
/* Any JSON object (OpenAI's response_format {"type": "json_object"}), with bounded whitespace. */
tlm_status tlm_grammar_json(tlm_grammar **out);
/* A JSON Schema (its JSON text) as a grammar: type (one or a list), properties, required,
 * additionalProperties, enum, const, items, minItems, maxItems, anyOf, oneOf (as anyOf), $ref to
 * #/$defs/... or #/definitions/..., minLength, maxLength; annotations (title, description, ...)
 * are ignored and any other keyword is refused by name (TLM_ERR_UNSUPPORTED). */
tlm_status tlm_grammar_from_json_schema(const char *schema, size_t len, tlm_grammar **out);
/* The GBNF text tlm_grammar_from_json_schema compiles (*out malloc'd, NUL-terminated). */
tlm_status tlm_json_schema_to_gbnf(const char *schema, size_t len, char **out);
void tlm_grammar_free(tlm_grammar *g);

/* A tokenizer's vocabulary arranged for masks: every token's bytes in a trie, so that tokens
 * sharing a prefix are checked against the grammar once for it. Ids from the tokenizer's size up
 * to n_ids (a model's padded vocabulary) and special tokens are never allowed, except the ends of
 * generation (tlm_tokenizer_is_eog), which are allowed exactly where the grammar is complete. The
 * tokenizer must outlive it; immutable, shareable. */
typedef struct tlm_grammar_vocab tlm_grammar_vocab;
tlm_status tlm_grammar_vocab_new(const tlm_tokenizer *t, int n_ids, tlm_grammar_vocab **out);
void tlm_grammar_vocab_free(tlm_grammar_vocab *v);

/* Where one sequence stands in a grammar: the stacks of the automaton and the bytes of a UTF-8
 * character that a token left unfinished. The grammar and vocabulary must outlive it. */
typedef struct tlm_grammar_state tlm_grammar_state;
tlm_status tlm_grammar_state_new(const tlm_grammar *g, const tlm_grammar_vocab *v,
                                 tlm_grammar_state **out);
void tlm_grammar_state_free(tlm_grammar_state *s);
/* Back to the start of the grammar. */
void tlm_grammar_state_reset(tlm_grammar_state *s);
/* Sets logits[id] to -inf for every id in [0, n) the grammar does not allow next; *n_allowed
 * (may be NULL) receives how many it allows (0 once complete without an end-of-generation token
 * in the vocabulary, or after one was accepted). */
tlm_status tlm_grammar_state_mask(tlm_grammar_state *s, float *logits, int n, int *n_allowed);
/* Advances over token id; TLM_ERR_RANGE (state unchanged) when the grammar does not allow it. */
tlm_status tlm_grammar_state_accept(tlm_grammar_state *s, int32_t id);
/* Advances over text as if a token had these bytes (for tests and forced text). */
tlm_status tlm_grammar_state_accept_bytes(tlm_grammar_state *s, const void *bytes, size_t len);
/* 1 when the text so far is a complete sentence of the grammar (an end of generation may come). */
int tlm_grammar_state_complete(const tlm_grammar_state *s);

typedef enum {
    TLM_STOP_NONE = 0,
    TLM_STOP_LENGTH,   /* max_new_tokens generated */
    TLM_STOP_EOS,      /* the end-of-sequence id was generated (it is reported to on_token) */
    TLM_STOP_CONTEXT,  /* prompt + generated reached the cache capacity (context_length) */
    TLM_STOP_CALLBACK, /* on_token asked to stop */
    TLM_STOP_GRAMMAR,  /* the grammar is complete and allows nothing more (no end-of-generation
                        * token in the vocabulary) */
} tlm_stop_reason;

typedef struct {
    int max_new_tokens; /* per sequence; 0: none (prefill only), < 0: until EOS or capacity */
    int32_t eos_id;     /* < 0: none */
    tlm_sampler_opts sampling;
    /* Called with each new id as it is sampled; non-zero stops that sequence. May be NULL. */
    int (*on_token)(void *user, int seq, int32_t id);
    void *user;
    /* The rest is off when zero. Constrained sampling: every sequence follows the grammar (each
     * with a state of its own over grammar_vocab, which must be given with it): the disallowed
     * ids' logits become -inf before any sampler sees them. eos_id, where set, should be one of
     * the vocabulary's ends of generation, which the grammar allows only where it is complete. */
    const tlm_grammar *grammar;
    const tlm_grammar_vocab *grammar_vocab;
} tlm_generate_opts;

/* max_new_tokens 256, no EOS id, the sampler's defaults, no callback. */
void tlm_generate_opts_defaults(tlm_generate_opts *o);

typedef struct {
    int prompt_tokens; /* over all sequences */
    int new_tokens;    /* ids sampled, over all sequences */
    int decode_steps;  /* tlm_session_decode calls */
    double prefill_seconds;
    double decode_seconds; /* decode steps plus sampling */
    /* Speculative decoding (tlm_session_generate_spec; zero otherwise): ids proposed by the draft
     * or the lookup, and how many of them the target accepted. */
    int drafted;
    int accepted;
} tlm_generate_stats;

/* Generates from n_prompts (<= batch) prompts at once, after resetting the session: each prompt
 * is prefilled, then all unfinished sequences advance together one token per step until each has
 * stopped. A sequence never exceeds the capacity: prompt + new ids <= capacity. stops (may be
 * NULL) receives each sequence's reason; stats may be NULL. Sequence b samples with stream
 * sampling.stream + b, so its ids do not depend on the other prompts. o NULL: the defaults. */
tlm_status tlm_session_generate(tlm_session *s, const int32_t *const *prompts,
                                const int *prompt_lens, int n_prompts, const tlm_generate_opts *o,
                                tlm_stop_reason *stops, tlm_generate_stats *stats);

/* ---- speculative decoding --------------------------------------------------------------------
 *
 * A cheap proposer guesses the next few ids; the target checks them all in one batched pass (its
 * weights read once for several tokens) and keeps the longest prefix it agrees with, plus one id
 * of its own. The proposer is a draft model (a smaller model over the same vocabulary, drafting
 * greedily or, when sampling, from its own distribution) or n-gram lookup: the continuation of the
 * latest earlier occurrence of the text's last n ids, which costs nothing to compute and pays off
 * where the output repeats its input (rewriting, extraction, code edits). Greedy decoding gives
 * the ids tlm_session_generate gives (up to the rounding of a batched pass against a single-token
 * one, which can only flip ties closer than about 1e-5); sampling accepts a proposed id d with
 * probability min(1, p(d) / q(d)) and otherwise draws from max(0, p - q) renormalized (Leviathan
 * et al. 2023, Chen et al. 2023), so every id follows the target's distribution p exactly. */
typedef struct {
    int draft_max;     /* the most ids proposed per target pass (llama.cpp's --draft-max) */
    int draft_min;     /* a shorter proposal is dropped for a plain step (--draft-min) */
    float draft_p_min; /* the draft stops proposing at an id it gives less probability (greedy:
                        * its softmax at temperature 1; sampling: the q it drew from) */
    /* n-gram lookup instead of a draft model: matches of lookup_ngram_max ids down to
     * lookup_ngram_min over the prompt and the ids generated so far. */
    int lookup;
    int lookup_ngram_min;
    int lookup_ngram_max;
    /* Nonzero: the proposal length follows the acceptance, between draft_min and draft_max:
     * from 4, doubled while the target accepts everything, cut to one past what it accepted on a
     * rejection, and (draft_min 0) plain steps with rare one-id probes while it accepts nothing,
     * so that a poor proposer costs little. It counts ids, never time, so that a seed gives the
     * same ids on any machine. Zero: always up to draft_max. */
    int adaptive;
} tlm_spec_opts;

/* llama.cpp's: draft_max 16, draft_min 0, draft_p_min 0.75; lookup off, n-grams of 4 down to 1;
 * adaptive on. */
void tlm_spec_opts_defaults(tlm_spec_opts *o);

/* n-gram lookup's proposal (tlm_spec_opts.lookup): the continuation of the latest earlier
 * occurrence of the last g ids of t[0..n), g from gmax down to gmin, at most kmax ids into out.
 * Returns how many (0: no match). A continuation reaching the end of t goes on through the ids it
 * has just proposed, so that text repeating with a short period yields a long proposal. */
int tlm_spec_lookup(const int32_t *t, int n, int gmin, int gmax, int kmax, int32_t *out);

/* Generates from one prompt on sequence 0 of target (after resetting it), proposing with the
 * draft session (sequence 0 of it, reset too; its model must have the target's vocabulary size)
 * or, with draft NULL, n-gram lookup (spec->lookup must be set). The options, stops and stats
 * are tlm_session_generate's (decode_steps counts the target's passes); a grammar is refused
 * (TLM_ERR_UNSUPPORTED). Sampling is reproducible by seed, though its ids differ from
 * tlm_session_generate's: the draws are made in another order. spec NULL: the defaults. */
tlm_status tlm_session_generate_spec(tlm_session *target, tlm_session *draft, const int32_t *prompt,
                                     int prompt_len, const tlm_generate_opts *o,
                                     const tlm_spec_opts *spec, tlm_stop_reason *stop,
                                     tlm_generate_stats *stats);

#ifdef __cplusplus
}
#endif
#endif
