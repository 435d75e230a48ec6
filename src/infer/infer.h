/* Internal view of a generation session: the KV cache and the scratch rows of the prefill and
 * decode passes. */
#ifndef TLM_INFER_INTERNAL_H
#define TLM_INFER_INTERNAL_H

#include "core/core.h"
#include "infer/share.h"
#include "model/lora.h"
#include "model/model.h"

struct tlm_session {
    const tlm_model *m;
    int B, cap;
    int *len; /* [B] cached positions per sequence */

    /* Cache layout: [layer][seq][K|V][kv_head][row][hd]. Each kv head's keys are contiguous, so
     * prefill attention is two sgemm calls per head and decode reads one stream per head. A
     * position's hd elements of one head (kv_row[0] bytes for keys, kv_row[1] for values) are
     * floats, IEEE halves, bfloat16s or GGUF blocks of 32 (kv_type[0] for keys, [1] for values;
     * kv_kind the same as the attention kernels name it, a K_KV_). */
    void *kv;
    size_t kv_bytes;
    size_t kv_row[2];
    /* Sliding-window layers whose window plus step_max - 1 positions fall short of the capacity
     * keep a ring of ring = sliding_window + step_max - 1 positions: position p at row p mod ring,
     * so a pass of at most step_max rows of a sequence overwrites no key its rows still see. The
     * first l_rows - ring rows are mirrored past the ring, so that every span of keys a pass reads
     * (a window, or a window and an attention chunk) is contiguous from its first key's row.
     * ring 0: no layer is a ring, every layer keeps capacity positions. */
    int ring, step_max;
    int *l_rows;   /* [n_layers] rows per cached head: capacity, or the ring and its mirror */
    size_t *l_off; /* [n_layers] byte offset of the layer's [seq][K|V][kv_head][row] blocks */
    tlm_dtype kv_type[2];
    int kv_kind[2];
    /* A cache's keys and values (other than floats) widened for the matrix products of prefill
     * attention (and the plain decode loops): one [2, cap, hd] block per thread. */
    float *wide;
    size_t wide_floats;

    /* Scratch rows (the residual stream and every per-token intermediate), grown on demand by
     * prefill; decode never grows it because it is created with B rows. */
    int rows;
    float *scratch;
    size_t scratch_bytes;
    float *moe; /* the mixture of experts' buffers (mdl_moe_floats of rows), in scratch */
    float *x, *n, *qkv, *att, *tmp, *ff_a, *ff_h;
    int *row_seq, *row_pos; /* [rows] sequence and position of each scratch row */
    int32_t *ids_tmp;       /* [B] decode: ids of the compact rows */
    uint8_t *act_tmp;       /* [B] decode_step's activity mask */
    int *step_n;            /* [B] decode: new ids per sequence */
    /* A mixed pass (tlm_session_step): rows [0, n_single) are one new token each of distinct
     * sequences, then n_segs runs of consecutive positions of one sequence each. */
    int n_single, n_segs;
    int *seg_b, *seg_r0, *seg_n; /* [B] */
    int32_t *row_ids;            /* [rows] the ids in row order */
    int *want_row, *want_seq;    /* [B] rows whose logits are asked for, and their sequences */

    /* Attention scores: decode [B*H, cap]; prefill one [chunk, cap] block per thread. */
    float *scores;
    size_t scores_floats;

    float *logits; /* [B, V] decode rows of a partial batch before they are scattered */

    infer_share share; /* decode steps on one thread while the cores look shared (share.c) */

    /* LoRA adapters (session_lora.c): the adapters and each sequence's scales of them, and per
     * pass the rows' scales where the rows' sequences disagree. */
    int n_lora;
    mdl_lora_use *lora_use; /* [n_lora] the pass's (scale or row_scale filled per pass) */
    const tlm_lora **lora;  /* [n_lora] */
    float *lora_seq_scale;  /* [B][n_lora] */
    float *lora_row_scale;  /* [n_lora][lora_rows] */
    float *lora_scratch;
    size_t lora_scratch_floats;
    int lora_rows;
    mdl_lora_pass lora_pass;
};

/* Makes room for the adapters' scratch over s->rows rows. */
tlm_status infer_lora_reserve(struct tlm_session *s);
/* The LoRA state of a pass over N rows, the rows' sequences seqs[r] (or all `seq` when seqs is
 * NULL); NULL without adapters. */
const mdl_lora_pass *infer_lora_pass(struct tlm_session *s, int N, const int *seqs, int seq);
void infer_lora_free(struct tlm_session *s);

/* Sampler internals for speculative decoding (sampler.c): a uniform draw in (0, 1) from the
 * sampler's own stream, and dst's penalty window set to src's (same options). */
double infer_sampler_uniform(tlm_sampler *s);
void infer_sampler_copy_window(tlm_sampler *dst, const tlm_sampler *src);

/* One cached head: rows [0, l_rows[l]) of one kv head of one sequence in one layer, keys (kv 0)
 * or values (kv 1). */
static inline void *infer_cache(const struct tlm_session *s, int l, int b, int kv, int kvh) {
    size_t kvhs = (size_t)s->m->c.n_kv_heads, rows = (size_t)s->l_rows[l];
    size_t keys = kvhs * rows * s->kv_row[0];
    return (char *)s->kv + s->l_off[l] + (size_t)b * (keys + kvhs * rows * s->kv_row[1]) +
           (kv ? keys : 0) + (size_t)kvh * rows * s->kv_row[kv];
}

/* Whether layer l's cache is a ring (its rows are more than the ring only then: the mirror). */
static inline int infer_is_ring(const struct tlm_session *s, int l) {
    return s->ring && s->l_rows[l] != s->cap;
}

/* The row of position p in layer l's cache. */
static inline size_t infer_row(const struct tlm_session *s, int l, int p) {
    return (size_t)(infer_is_ring(s, l) ? p % s->ring : p);
}

#endif
