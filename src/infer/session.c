/* KV cache, prefill and decode. The model's one block function (model/block.c) serves both
 * passes: prefill runs it over the T new tokens of one sequence (sgemm, two sgemm per head for
 * attention over the cache), decode over one token of each active sequence (matrix-vector products
 * that stream each weight once). What is particular to generation is the attention core here:
 * append the new keys and values to the cache, attend over it. The arithmetic per token is the
 * same as tlm_train_ctx_forward's, which is what makes incremental decoding reproduce the full
 * pass. */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/knob.h"
#include "core/quant.h"
#include "infer/infer.h"
#include "kernels/fastmath.h"
#include "kernels/kernels.h"
#include "kernels/qdot.h"
#include "model/block.h"

/* Queries per prefill attention task: bounds the per-thread score block to PCHUNK x capacity. */
#define PCHUNK 32
/* Rows of one sequence per pass where some layer's cache is a ring (tlm_session_opts.step_max):
 * llama.cpp's default micro-batch. */
#define SESSION_STEP_MAX 512

static void free_scratch(tlm_session *s) {
    core_big_free(s->scratch, s->scratch_bytes);
    s->scratch = NULL;
    s->scratch_bytes = 0;
    s->rows = 0;
    free(s->row_seq);
    free(s->row_pos);
    free(s->row_ids);
    s->row_seq = s->row_pos = NULL;
    s->row_ids = NULL;
}

/* Makes room for `rows` scratch rows. Called at creation with B rows, so decode alone never lands
 * here with a larger request (prefill and mixed steps may). */
static tlm_status reserve_rows(tlm_session *s, int rows) {
    if (rows <= s->rows) return TLM_OK;
    const tlm_config *c = &s->m->c;
    size_t d = (size_t)c->d_model, hd = d / (size_t)c->n_heads;
    size_t qw = (size_t)c->n_heads * hd, kw = (size_t)c->n_kv_heads * hd, ff = (size_t)c->d_ff;
    /* q|k|v rows are one buffer (one matrix product from the stacked weights); so are gate|up. */
    size_t widths[] = {d, d, qw + 2 * kw, qw, d, 2 * ff, ff};
    size_t per_row = 0;
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++)
        per_row += (widths[i] + 15) & ~(size_t)15;
    free_scratch(s);
    size_t moe = mdl_moe_floats(c, rows, 0);
    size_t bytes = ((size_t)rows * per_row + moe) * sizeof(float);
    s->scratch = core_big_alloc(bytes);
    s->row_seq = malloc((size_t)rows * sizeof(int));
    s->row_pos = malloc((size_t)rows * sizeof(int));
    s->row_ids = malloc((size_t)rows * sizeof(int32_t));
    if (!s->scratch || !s->row_seq || !s->row_pos || !s->row_ids) {
        core_big_free(s->scratch, bytes);
        s->scratch = NULL;
        free_scratch(s);
        return core_err(TLM_ERR_NOMEM, "out of memory for %d generation rows (%zu MiB)", rows,
                        bytes >> 20);
    }
    s->scratch_bytes = bytes;
    s->rows = rows;
    float *p = s->scratch;
    float **bufs[] = {&s->x, &s->n, &s->qkv, &s->att, &s->tmp, &s->ff_a, &s->ff_h};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        *bufs[i] = p;
        /* Row-major [rows, width]: each buffer keeps its own width as the row stride. */
        p += (size_t)rows * ((widths[i] + 15) & ~(size_t)15);
    }
    s->moe = moe ? p : NULL;
    return infer_lora_reserve(s);
}

/* Grows a float buffer that only ever grows (*have floats now) to hold `floats`. */
static tlm_status reserve_floats(float **buf, size_t *have, size_t floats, const char *what) {
    if (floats <= *have) return TLM_OK;
    core_big_free(*buf, *have * sizeof(float));
    *buf = core_big_alloc(floats * sizeof(float));
    *have = *buf ? floats : 0;
    if (!*buf)
        return core_err(TLM_ERR_NOMEM, "out of memory for %s (%zu MiB)", what,
                        floats * sizeof(float) >> 20);
    return TLM_OK;
}

static tlm_status reserve_scores(tlm_session *s, size_t floats) {
    return reserve_floats(&s->scores, &s->scores_floats, floats, "attention scores");
}

/* Floats per thread of s->wide: a cache's keys and values (other than floats) widened for the sgemm
 * of prefill attention and the plain decode loops, or the transposed keys of k_attend_causal. */
static size_t wide_block(const tlm_session *s) {
    size_t hd = (size_t)(s->m->c.d_model / s->m->c.n_heads), kt = hd * K_CAUSAL_SPAN(s->cap);
    int floats = s->kv_kind[0] == K_KV_F32 && s->kv_kind[1] == K_KV_F32;
    size_t two = floats ? 0 : 2 * (size_t)s->cap * hd;
    return kt > two ? kt : two;
}

/* Floats per thread of s->scores in prefill: a chunk's scores for the sgemm path, or
 * k_attend_causal's. */
static size_t prefill_scores(const tlm_session *s) {
    size_t a = (size_t)PCHUNK * s->cap, b = 8 * K_CAUSAL_SPAN(s->cap);
    return a > b ? a : b;
}

/* The per-thread blocks of s->wide (the mapping costs nothing until prefill or the plain decode
 * loops touch them). */
static tlm_status reserve_wide(tlm_session *s) {
    return reserve_floats(&s->wide, &s->wide_floats, (size_t)omp_get_max_threads() * wide_block(s),
                          "attention's widened or transposed keys");
}

void tlm_session_opts_defaults(tlm_session_opts *o) {
    *o = (tlm_session_opts){.batch = 1, .kv_type = TLM_DTYPE_F32, .v_type = TLM_DTYPE_F32};
}

tlm_status tlm_session_new(const tlm_model *m, const tlm_session_opts *o, tlm_session **out) {
    if (!out) return core_err(TLM_ERR_ARG, "session: out must not be NULL");
    *out = NULL;
    if (!m) return core_err(TLM_ERR_ARG, "session: model must not be NULL");
    tlm_session_opts defaults;
    if (!o) {
        tlm_session_opts_defaults(&defaults);
        o = &defaults;
    }
    const tlm_config *c = &m->c;
    int batch = o->batch, capacity = o->capacity;
    size_t hd = (size_t)(c->d_model / c->n_heads);
    const tlm_dtype types[2] = {o->kv_type, o->v_type_set ? o->v_type : o->kv_type};
    for (int kv = 0; kv < 2; kv++) {
        if (k_kv_kind(types[kv]) < 0)
            return core_err(TLM_ERR_ARG,
                            "session: KV cache type %s (supported: F32, F16, BF16, Q8_0, Q4_0, "
                            "Q4_1, IQ4_NL, Q5_0, Q5_1)",
                            tlm_dtype_name(types[kv]));
        /* a cached row (one position of one head) is whole blocks, as llama.cpp also requires */
        const core_dtype_info *di = core_dtype_get(types[kv]);
        if (hd % di->block_elems)
            return core_err(TLM_ERR_ARG,
                            "session: a %s KV cache needs a head size that is a multiple of %zu "
                            "(this model's is %zu); use F16 or F32",
                            tlm_dtype_name(types[kv]), (size_t)di->block_elems, hd);
    }
    if (batch <= 0) return core_err(TLM_ERR_ARG, "session: batch %d must be positive", batch);
    if (capacity <= 0) capacity = c->context_length;
    if (capacity > c->context_length)
        return core_err(TLM_ERR_ARG, "session: capacity %d exceeds context_length %d", capacity,
                        c->context_length);
    tlm_session *s = calloc(1, sizeof *s);
    if (!s) return core_err(TLM_ERR_NOMEM, "out of memory");
    s->m = m;
    s->B = batch;
    s->cap = capacity;
    size_t heads = 0, both = 0;
    for (int kv = 0; kv < 2; kv++) {
        const core_dtype_info *di = core_dtype_get(types[kv]);
        s->kv_type[kv] = types[kv];
        s->kv_kind[kv] = k_kv_kind(types[kv]);
        s->kv_row[kv] = hd / di->block_elems * di->block_bytes;
    }
    tlm_status st = TLM_OK;
    s->l_rows = calloc((size_t)c->n_layers, sizeof(int));
    s->l_off = calloc((size_t)c->n_layers, sizeof(size_t));
    if (!s->l_rows || !s->l_off) {
        st = core_err(TLM_ERR_NOMEM, "out of memory");
        goto fail;
    }
    int step_max = o->step_max > 0 ? o->step_max : SESSION_STEP_MAX;
    int ok = core_mul_ok((size_t)c->n_kv_heads, (size_t)batch, &heads) &&
             s->kv_row[0] <= SIZE_MAX - s->kv_row[1];
    for (int l = 0; l < c->n_layers && ok; l++) {
        int W = tlm_config_layer_windowed(c, l) ? c->sliding_window : 0, rows = capacity;
        /* the most keys one pass reads: a decode row's window, or a prefill chunk's */
        int span = W - 1 + (step_max < PCHUNK ? step_max : PCHUNK);
        if (W > 0 && step_max <= capacity && W + step_max - 1 + span - 1 < capacity) {
            s->ring = W + step_max - 1;
            s->step_max = step_max;
            rows = s->ring + span - 1;
        }
        size_t layer = 0;
        s->l_rows[l] = rows;
        s->l_off[l] = both;
        ok = core_mul_ok(heads * (size_t)rows, s->kv_row[0] + s->kv_row[1], &layer) &&
             layer <= SIZE_MAX - both;
        both += ok ? layer : 0;
    }
    s->kv_bytes = both;
    if (!ok) {
        st = core_err(TLM_ERR_NOMEM, "session: KV cache size overflows");
        goto fail;
    }
    s->len = calloc((size_t)batch, sizeof(int));
    s->ids_tmp = calloc((size_t)batch, sizeof(int32_t));
    s->act_tmp = calloc((size_t)batch, 1);
    s->step_n = calloc((size_t)batch, sizeof(int));
    s->seg_b = calloc((size_t)batch, sizeof(int));
    s->seg_r0 = calloc((size_t)batch, sizeof(int));
    s->seg_n = calloc((size_t)batch, sizeof(int));
    s->want_row = calloc((size_t)batch, sizeof(int));
    s->want_seq = calloc((size_t)batch, sizeof(int));
    s->kv = core_big_alloc(s->kv_bytes);
    s->logits = core_big_alloc((size_t)batch * c->vocab_size * sizeof(float));
    if (!s->len || !s->ids_tmp || !s->act_tmp || !s->step_n || !s->seg_b || !s->seg_r0 ||
        !s->seg_n || !s->want_row || !s->want_seq || !s->kv || !s->logits) {
        st = core_err(TLM_ERR_NOMEM, "out of memory for a KV cache of %zu MiB", s->kv_bytes >> 20);
        goto fail;
    }
    st = reserve_rows(s, batch);
    if (!st) st = reserve_scores(s, (size_t)batch * c->n_heads * capacity);
    if (!st) st = reserve_wide(s);
    if (st) goto fail;
    *out = s;
    return TLM_OK;
fail:
    tlm_session_free(s);
    return st;
}

void tlm_session_free(tlm_session *s) {
    if (!s) return;
    free_scratch(s);
    infer_lora_free(s);
    core_big_free(s->scores, s->scores_floats * sizeof(float));
    core_big_free(s->wide, s->wide_floats * sizeof(float));
    if (s->kv) core_big_free(s->kv, s->kv_bytes);
    if (s->logits) core_big_free(s->logits, (size_t)s->B * s->m->c.vocab_size * sizeof(float));
    free(s->len);
    free(s->ids_tmp);
    free(s->act_tmp);
    free(s->step_n);
    free(s->seg_b);
    free(s->seg_r0);
    free(s->seg_n);
    free(s->want_row);
    free(s->want_seq);
    free(s->l_rows);
    free(s->l_off);
    free(s);
}

void tlm_session_prefault(tlm_session *s) {
    if (!s) return;
    /* One write per page: the kernel zero-fills each (a whole huge page at a time) on the first
     * touch, which is what costs; the second core halves the wait. */
    volatile char *p = (volatile char *)s->kv;
    long pages = (long)((s->kv_bytes + 4095) / 4096);
#pragma omp parallel for schedule(static) if (pages >= 4096)
    for (long i = 0; i < pages; i++) p[(size_t)i * 4096] = 0;
}

void tlm_session_reset(tlm_session *s, int seq) {
    if (!s) return;
    for (int b = 0; b < s->B; b++)
        if (seq < 0 || seq == b) s->len[b] = 0;
}

int tlm_session_batch(const tlm_session *s) { return s->B; }
tlm_dtype tlm_session_kv_type(const tlm_session *s) { return s->kv_type[0]; }
tlm_dtype tlm_session_v_type(const tlm_session *s) { return s->kv_type[1]; }
int tlm_session_capacity(const tlm_session *s) { return s->cap; }
size_t tlm_session_kv_bytes(const tlm_session *s) { return s ? s->kv_bytes : 0; }
int tlm_session_length(const tlm_session *s, int seq) {
    return seq >= 0 && seq < s->B ? s->len[seq] : -1;
}

/* Cached keys and values depend only on the ids before them, so the first n positions of a
 * sequence stay valid for any continuation: forgetting the rest is all there is to do, as long
 * as the rings still hold the keys position n sees. A ring holds the last `ring` positions
 * written, so cutting at most step_max positions (the rows of one pass) is always possible. */
tlm_status tlm_session_truncate(tlm_session *s, int seq, int n) {
    if (!s) return core_err(TLM_ERR_ARG, "session: NULL session");
    if (seq < 0 || seq >= s->B)
        return core_err(TLM_ERR_RANGE, "session: sequence %d outside the batch of %d", seq, s->B);
    if (n < 0) return core_err(TLM_ERR_ARG, "session: truncate to %d positions", n);
    int len = s->len[seq], W = s->m->c.sliding_window, first = n - W + 1 > 0 ? n - W + 1 : 0;
    if (s->ring && n > 0 && n < len && first < len - s->ring)
        return core_err(TLM_ERR_RANGE,
                        "session: truncating sequence %d from %d to %d positions: the sliding "
                        "window's ring of %d positions has overwritten position %d",
                        seq, len, n, s->ring, first);
    if (n < s->len[seq]) s->len[seq] = n;
    return TLM_OK;
}

size_t tlm_session_prefix_bytes(const tlm_session *s, int n) {
    if (!s || n < 0) return 0;
    const tlm_config *c = &s->m->c;
    return (size_t)c->n_layers * (size_t)c->n_kv_heads * (size_t)n * (s->kv_row[0] + s->kv_row[1]);
}

/* Copies positions 0..n-1 of sequence seq out of the cache into `to`, or into it from `from` (the
 * other NULL); the buffer holds n_buf positions per block in the saved order: layer, keys then
 * values, kv head. */
static void prefix_copy(const tlm_session *s, int seq, char *to, const char *from, int n_buf,
                        int n) {
    const tlm_config *c = &s->m->c;
    size_t at = 0;
    for (int l = 0; l < c->n_layers; l++)
        for (int kv = 0; kv < 2; kv++)
            for (int h = 0; h < c->n_kv_heads; h++, at += (size_t)n_buf * s->kv_row[kv]) {
                size_t row = s->kv_row[kv];
                char *blk = infer_cache(s, l, seq, kv, h);
                /* saving needs every position in place (save_prefix checks); a ring loads only the
                 * positions it keeps, each at its row and its mirror's */
                if (to) {
                    memcpy(to + at, blk, (size_t)n * row);
                } else if (!infer_is_ring(s, l)) {
                    memcpy(blk, from + at, (size_t)n * row);
                } else {
                    int mirror = s->l_rows[l] - s->ring;
                    for (int p = n > s->ring ? n - s->ring : 0; p < n; p++) {
                        size_t r = infer_row(s, l, p);
                        memcpy(blk + r * row, from + at + (size_t)p * row, row);
                        if ((int)r < mirror)
                            memcpy(blk + (r + (size_t)s->ring) * row, blk + r * row, row);
                    }
                }
            }
}

static tlm_status prefix_args(const tlm_session *s, int seq, const void *buf) {
    if (!s || !buf) return core_err(TLM_ERR_ARG, "session: NULL session or buffer");
    if (seq < 0 || seq >= s->B)
        return core_err(TLM_ERR_RANGE, "session: sequence %d outside the batch of %d", seq, s->B);
    return TLM_OK;
}

tlm_status tlm_session_save_prefix(const tlm_session *s, int seq, int n, void *buf) {
    tlm_status st = prefix_args(s, seq, buf);
    if (st) return st;
    if (n < 0 || n > s->len[seq])
        return core_err(TLM_ERR_RANGE, "session: saving %d positions of a sequence holding %d", n,
                        s->len[seq]);
    if (s->ring && s->len[seq] > s->ring)
        return core_err(TLM_ERR_RANGE,
                        "session: saving %d positions of sequence %d: the sliding window's ring "
                        "of %d positions keeps only the last of its %d",
                        n, seq, s->ring, s->len[seq]);
    prefix_copy(s, seq, buf, NULL, n, n);
    return TLM_OK;
}

tlm_status tlm_session_load_prefix(tlm_session *s, int seq, const void *buf, int n_saved, int n) {
    tlm_status st = prefix_args(s, seq, buf);
    if (st) return st;
    if (n < 0 || n > n_saved || n > s->cap)
        return core_err(TLM_ERR_RANGE,
                        "session: loading %d positions of a saved %d into a capacity of %d", n,
                        n_saved, s->cap);
    prefix_copy(s, seq, NULL, buf, n_saved, n);
    s->len[seq] = n;
    return TLM_OK;
}

/* Positions [0, S) of one cached head's keys Kc and values Vc as floats: the cache itself (F32),
 * or widened into the calling thread's block (the other types), keys and values each by its own. */
static void as_floats(const tlm_session *s, const void *Kc, const void *Vc, int S, const float **K,
                      const float **V) {
    size_t hd = (size_t)(s->m->c.d_model / s->m->c.n_heads), block = (size_t)s->cap * hd;
    float *w = s->wide + (size_t)k_team_thread() * wide_block(s);
    const void *from[2] = {Kc, Vc};
    const float **to[2] = {K, V};
    for (int kv = 0; kv < 2; kv++) {
        if (s->kv_kind[kv] == K_KV_F32) {
            *to[kv] = from[kv];
            continue;
        }
        const core_dtype_info *di = core_dtype_get(s->kv_type[kv]);
        float *dst = w + (kv ? block : 0);
        /* k_widen_row counts in int: a long context widens in parts (of whole blocks) */
        for (size_t at = 0, n = (size_t)S * hd, part; at < n; at += part) {
            part = n - at < ((size_t)1 << 24) ? n - at : (size_t)1 << 24;
            k_widen_row(s->kv_type[kv],
                        (const char *)from[kv] + at / di->block_elems * di->block_bytes, dst + at,
                        (int)part);
        }
        *to[kv] = dst;
    }
}

/* Causal attention of T consecutive new tokens of sequence b (positions pos0..pos0+T-1, scratch
 * rows r0..r0+T-1) over everything cached for it, the new keys included. Queries go in chunks of
 * PCHUNK: a chunk reads keys only up to its last query, so a prompt skips most of the masked half
 * of its scores, and the heads' chunks are enough tasks to balance two threads. The longest
 * chunks go first, so the short ones fill in at the end. A chunk is one call of k_attend_causal
 * where the CPU has it; otherwise two sgemm and the softmax between them. */
/* Rows [0, rows) of scores p (S apart) made probabilities, row i over its first + i + 1 keys (the
 * last `window` of them when window > 0), zeros elsewhere; soft-capped first when cap > 0. */
K_INLINE void softmax_causal(float *p, int rows, int S, int first, int window, float cap) {
    for (int i = 0; i < rows; i++) {
        float *row = p + (size_t)i * S;
        int last = first + i, lo = window > 0 && last + 1 > window ? last + 1 - window : 0;
        for (int j = 0; j < lo; j++) row[j] = 0.0f;
        if (cap > 0.0f) k_softcap_row(row + lo, last + 1 - lo, cap);
        float mx = row[lo];
        for (int j = lo + 1; j <= last; j++) mx = row[j] > mx ? row[j] : mx;
        k_softmax_row(row + lo, last + 1 - lo, mx);
        for (int j = last + 1; j < S; j++) row[j] = 0.0f;
    }
}
K_VERSIONS(softmax_causal, (float *p, int rows, int S, int first, int window, float cap),
           (p, rows, S, first, window, cap))

/* The sliding window of layer l (0: it sees the whole context). */
static int layer_window(const tlm_session *s, int l) {
    return tlm_config_layer_windowed(&s->m->c, l) ? s->m->c.sliding_window : 0;
}

static void attend_prefill(tlm_session *s, int l, int b, int pos0, int T, int r0) {
    const tlm_config *c = &s->m->c;
    int H = c->n_heads, hd = c->d_model / H, group = H / c->n_kv_heads, qw = H * hd;
    int ld = qw + 2 * c->n_kv_heads * hd; /* row stride of the fused q|k|v buffer */
    int chunks = (T + PCHUNK - 1) / PCHUNK, W = layer_window(s, l);
    float scale = tlm_config_attn_scale(c), cap = c->attn_softcap;
    softmax_causal_fn *softmax = softmax_causal_pick();
#pragma omp parallel for schedule(dynamic, 1)
    for (int task = 0; task < H * chunks; task++) {
        int h = task % H, t0 = (chunks - 1 - task / H) * PCHUNK;
        int tc = T - t0 < PCHUNK ? T - t0 : PCHUNK;
        /* keys past the chunk's last query are all masked, and in a windowed layer those before
         * its first query's window */
        int j0 = W > 0 && pos0 + t0 + 1 > W ? pos0 + t0 + 1 - W : 0, S = pos0 + t0 + tc - j0;
        size_t row0 = infer_row(s, l, j0);
        const char *Kc = (const char *)infer_cache(s, l, b, 0, h / group) + row0 * s->kv_row[0],
                   *Vc = (const char *)infer_cache(s, l, b, 1, h / group) + row0 * s->kv_row[1];
        const float *q = s->qkv + (size_t)(r0 + t0) * ld + (size_t)h * hd;
        float *o = s->att + (size_t)(r0 + t0) * qw + (size_t)h * hd;
        int me = omp_get_thread_num();
        float *p = s->scores + (size_t)me * prefill_scores(s);
        /* k_attend_causal has no window nor soft cap: such layers' chunks take the products below
         */
        if (!W && cap == 0.0f &&
            !k_attend_causal(q, (size_t)ld, Kc, Vc, s->kv_kind[0], s->kv_kind[1], tc, pos0 + t0, hd,
                             scale, s->wide + (size_t)me * wide_block(s), p, o, (size_t)qw))
            continue;
        const float *K, *V;
        as_floats(s, Kc, Vc, S, &K, &V);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, tc, S, hd, scale, q, ld, K, hd, 0.0f,
                    p, S);
        softmax(p, tc, S, pos0 + t0 - j0, W, cap);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, tc, hd, S, 1.0f, p, S, V, hd, 0.0f,
                    o, qw);
    }
}

/* o[hd] = softmax(scale q.K) V over S positions of floats (the scores soft-capped when cap > 0),
 * with p[S] as scratch: the plain loops where k_attend_row has no vector version or no cap. */
K_INLINE void attend_plain(const float *q, const float *K, const float *V, int S, int hd,
                           float scale, float cap, float *p, float *o) {
    float mx = -INFINITY;
    for (int j = 0; j < S; j++) {
        const float *kj = K + (size_t)j * hd;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int i = 0; i < hd; i++) dot += q[i] * kj[i];
        p[j] = scale * dot;
    }
    if (cap > 0.0f) k_softcap_row(p, S, cap);
    for (int j = 0; j < S; j++) mx = p[j] > mx ? p[j] : mx;
    k_softmax_row(p, S, mx);
    for (int i = 0; i < hd; i++) o[i] = 0.0f;
    for (int j = 0; j < S; j++) {
        float w = p[j];
        const float *vj = V + (size_t)j * hd;
#pragma omp simd
        for (int i = 0; i < hd; i++) o[i] += w * vj[i];
    }
}
K_VERSIONS(attend_plain,
           (const float *q, const float *K, const float *V, int S, int hd, float scale, float cap,
            float *p, float *o),
           (q, K, V, S, hd, scale, cap, p, o))

/* One query per row, each row its own sequence and position: tasks [a, b) of the N x H (row,
 * head) pairs. */
typedef struct {
    tlm_session *s;
    int l, window;
    attend_plain_fn *plain;
} attend_ctx;

static void decode_tasks(void *ctx, long a, long b) {
    const attend_ctx *x = ctx;
    tlm_session *s = x->s;
    const tlm_config *c = &s->m->c;
    int H = c->n_heads, hd = c->d_model / H, group = H / c->n_kv_heads, qw = H * hd;
    int ld = qw + 2 * c->n_kv_heads * hd; /* row stride of the fused q|k|v buffer */
    float scale = tlm_config_attn_scale(c), cap = c->attn_softcap;
    for (long task = a; task < b; task++) {
        int r = (int)(task / H), h = (int)(task % H), S = s->row_pos[r] + 1;
        int j0 = x->window > 0 && S > x->window ? S - x->window : 0; /* the window's first key */
        S -= j0;
        size_t row0 = infer_row(s, x->l, j0);
        const char *Kc =
            (const char *)infer_cache(s, x->l, s->row_seq[r], 0, h / group) + row0 * s->kv_row[0];
        const char *Vc =
            (const char *)infer_cache(s, x->l, s->row_seq[r], 1, h / group) + row0 * s->kv_row[1];
        const float *q = s->qkv + (size_t)r * ld + (size_t)h * hd;
        float *p = s->scores + (size_t)task * s->cap;
        float *o = s->att + (size_t)r * qw + (size_t)h * hd;
        /* k_attend_row has no soft cap: capped layers take the plain loops */
        if (cap == 0.0f &&
            !k_attend_row(q, Kc, Vc, s->kv_kind[0], s->kv_kind[1], S, hd, scale, p, o))
            continue;
        const float *K, *V;
        as_floats(s, Kc, Vc, S, &K, &V);
        x->plain(q, K, V, S, hd, scale, cap, p, o);
    }
}

/* A team only past 32768 multiply-adds: a region costs microseconds even when an `if` clause
 * keeps it on one thread (libgomp still builds a team of one), and a short context's attention
 * is less than that. */
static void attend_decode(tlm_session *s, int l, int N) {
    const tlm_config *c = &s->m->c;
    long work = 0;
    for (int r = 0; r < N; r++) work += (long)(s->row_pos[r] + 1) * c->d_model;
    attend_ctx x = {s, l, layer_window(s, l), attend_plain_pick()};
    k_team_units((long)N * c->n_heads, work >= 32768, 1, decode_tasks, &x);
}

/* The attention core of generation: the new rows' keys and values go into the cache (rotated:
 * a cached key is never touched again), then each row attends over its sequence's cache. */
typedef struct {
    tlm_session *s;
    const float *qkv;
    int l, ld, N;
} store_ctx;

/* Units [a, b) of (kv head, keys or values). */
static void store_heads(void *ctx, long a, long b) {
    const store_ctx *x = ctx;
    tlm_session *s = x->s;
    const tlm_config *c = &s->m->c;
    int hd = c->d_model / c->n_heads, qw = c->n_heads * hd, kw = c->n_kv_heads * hd;
    for (long hk = a; hk < b; hk++) {
        int h = (int)(hk / 2), kv = (int)(hk % 2);
        for (int r = 0; r < x->N; r++) {
            char *blk = infer_cache(s, x->l, s->row_seq[r], kv, h);
            size_t row = infer_row(s, x->l, s->row_pos[r]);
            char *dst = blk + row * s->kv_row[kv];
            const float *src = x->qkv + (size_t)r * x->ld + qw + (size_t)kv * kw + (size_t)h * hd;
            /* as llama.cpp's CPU backend stores each type: its x86 quantize_row_q8_0 for Q8_0,
             * the reference quantizers (byte for byte, k_narrow_row) for the others */
            if (s->kv_kind[kv] == K_KV_Q8_0)
                k_q8_0_blocks(src, dst, hd);
            else if (s->kv_kind[kv] != K_KV_F32)
                k_narrow_row(s->kv_type[kv], src, dst, hd);
            else
                memcpy(dst, src, (size_t)hd * sizeof(float));
            if (infer_is_ring(s, x->l) && (int)row < s->l_rows[x->l] - s->ring)
                memcpy(blk + (row + (size_t)s->ring) * s->kv_row[kv], dst, s->kv_row[kv]);
        }
    }
}

/* A prompt's rows were written by every thread of the product before: each thread stores whole
 * heads, since a serial store is a visible share of a small model's prompt. A decode step's few
 * rows stay on this thread. */
static void cache_store(tlm_session *s, int l, const float *qkv, int ld, int N) {
    store_ctx x = {s, qkv, l, ld, N};
    k_team_units(2L * s->m->c.n_kv_heads, N >= 16, 1, store_heads, &x);
}

/* Prefill: N consecutive rows of one sequence (attend_prefill writes s->att, which att is). */
static void cache_attend_prefill(void *user, int l, float *qkv, int ld, float *att, int N) {
    (void)att;
    tlm_session *s = user;
    cache_store(s, l, qkv, ld, N);
    attend_prefill(s, l, s->row_seq[0], s->row_pos[0], N, 0);
}

/* A mixed pass: one row each of some sequences, then runs of prompt rows of others. All the new
 * keys and values are stored first, so a run's later rows see its earlier ones. */
static void cache_attend_mixed(void *user, int l, float *qkv, int ld, float *att, int N) {
    (void)att;
    tlm_session *s = user;
    cache_store(s, l, qkv, ld, N);
    if (s->n_single) attend_decode(s, l, s->n_single);
    for (int g = 0; g < s->n_segs; g++)
        attend_prefill(s, l, s->seg_b[g], s->row_pos[s->seg_r0[g]], s->seg_n[g], s->seg_r0[g]);
}

/* mdl_attend's fwd_group for a step of single rows: kv head g's keys and values of every row
 * stored, then its q heads attended, on the calling thread (a unit of the block's job). */
static void cache_attend_group(void *user, int l, float *qkv, int ld, float *att, int N, int g) {
    (void)att;
    tlm_session *s = user;
    const tlm_config *c = &s->m->c;
    int H = c->n_heads, group = H / c->n_kv_heads;
    store_ctx x = {s, qkv, l, ld, N};
    store_heads(&x, 2L * g, 2L * g + 2);
    attend_ctx a = {s, l, layer_window(s, l), attend_plain_pick()};
    for (int r = 0; r < N; r++)
        decode_tasks(&a, (long)r * H + (long)g * group, (long)r * H + (long)(g + 1) * group);
}

/* Runs the N rows (ids, with row_seq/row_pos filled) through every block; the final residual
 * stream is left in s->x. The block works in place on the scratch rows. */
static void blocks(tlm_session *s, const int32_t *ids, int N, int prefill) {
    const tlm_model *m = s->m;
    /* A step of single new rows only (no prompt runs) attends head by head in the q|k|v product's
     * job (mdl_attend's fwd_group). */
    int single = !prefill && s->n_segs == 0;
    mdl_pass p = {N,
                  s->row_pos,
                  0,
                  0,
                  0,
                  {prefill ? cache_attend_prefill : cache_attend_mixed, NULL, s,
                   single ? cache_attend_group : NULL},
                  NULL,
                  infer_lora_pass(s, N, s->row_seq, 0),
                  0,
                  0,
                  NULL};
    mdl_embed_fwd(m, &p, ids, s->x);
    int pre = m->c.norm_position == TLM_NORM_PRE;
    mdl_block_bufs b = {.x = s->x,
                        .n1 = pre ? s->n : s->x,
                        .qkv = s->qkv,
                        .att = s->att,
                        .attn_out = s->tmp,
                        .post = s->tmp,
                        .h = s->x,
                        .n2 = s->n,
                        .ff_a = s->ff_a,
                        .ff_h = s->ff_h,
                        .y = s->tmp,
                        .out = s->x};
    if (s->moe) mdl_moe_carve(&m->c, N, 0, s->moe, &b);
    for (int l = 0; l < m->c.n_layers; l++) mdl_block_fwd(m, l, &p, &b);
}

/* Logits of n consecutive scratch rows starting at row r0, of sequences seqs[i] (NULL: all seq). */
static void head_rows(tlm_session *s, int r0, int n, float *logits, const int *seqs, int seq) {
    int d = s->m->c.d_model;
    mdl_pass p = {.N = n, .lora = infer_lora_pass(s, n, seqs, seq)};
    mdl_head_fwd_pass(s->m, &p, s->x + (size_t)r0 * d, s->n + (size_t)r0 * d, NULL, NULL, logits,
                      n);
}

static tlm_status check_ids(const tlm_config *c, const int32_t *ids, int n) {
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab_size)
            return core_err(TLM_ERR_RANGE, "token id %d at index %d is outside the vocabulary (%d)",
                            ids[i], i, c->vocab_size);
    return TLM_OK;
}

/* Appends n ids to sequence seq's cache, in passes of at most step_max rows where a layer is a
 * ring; each pass's rows give hidden (normed, [n, d]) or logits (all_rows: [n, V], else the last
 * row's). */
static tlm_status prefill_rows(tlm_session *s, int seq, const int32_t *ids, int n, float *logits,
                               int all_rows, float *hidden) {
    if (!s || !ids) return core_err(TLM_ERR_ARG, "prefill: session and ids must not be NULL");
    if (seq < 0 || seq >= s->B)
        return core_err(TLM_ERR_ARG, "prefill: sequence %d outside the batch of %d", seq, s->B);
    if (n <= 0) return core_err(TLM_ERR_ARG, "prefill: %d tokens (need at least one)", n);
    const tlm_config *c = &s->m->c;
    if (n > s->cap - s->len[seq])
        return core_err(TLM_ERR_RANGE,
                        "prefill: %d tokens after %d cached exceed the context of %d positions", n,
                        s->len[seq], s->cap);
    tlm_status st = check_ids(c, ids, n);
    if (st) return st;
    core_threads_enter();
    int M = s->step_max && s->step_max < n ? s->step_max : n;
    st = reserve_rows(s, M);
    if (st) return st;
    st = reserve_scores(s, (size_t)omp_get_max_threads() * prefill_scores(s));
    if (!st) st = reserve_wide(s);
    if (st) return st;
    for (int a = 0, k; a < n; a += k) {
        k = n - a < M ? n - a : M;
        int pos0 = s->len[seq];
        for (int r = 0; r < k; r++) {
            s->row_seq[r] = seq;
            s->row_pos[r] = pos0 + r;
        }
        blocks(s, ids + a, k, 1);
        s->len[seq] += k;
        if (hidden)
            mdl_head_norm(s->m, s->x, hidden + (size_t)a * c->d_model, k);
        else if (logits && all_rows)
            head_rows(s, 0, k, logits + (size_t)a * c->vocab_size, NULL, seq);
        else if (logits && a + k == n)
            head_rows(s, k - 1, 1, logits, NULL, seq);
    }
    return TLM_OK;
}

tlm_status tlm_session_prefill(tlm_session *s, int seq, const int32_t *ids, int n, float *logits,
                               int all_rows) {
    CORE_FP_FLUSH_SCOPE();
    return prefill_rows(s, seq, ids, n, logits, all_rows, NULL);
}

tlm_status tlm_session_prefill_hidden(tlm_session *s, int seq, const int32_t *ids, int n,
                                      float *hidden) {
    CORE_FP_FLUSH_SCOPE();
    if (!hidden) return core_err(TLM_ERR_ARG, "prefill: hidden must not be NULL");
    return prefill_rows(s, seq, ids, n, NULL, 0, hidden);
}

static tlm_status step_rows(tlm_session *s, const int32_t *ids, const int *n, const uint8_t *want,
                            const int *rows, const int *row_at, float *logits, int N);
static tlm_status step_split(tlm_session *s, const int32_t *ids, const int *n, const uint8_t *want,
                             const int *rows, float *logits, int N);

/* TLM_SHARED_CORES=ignore keeps the full team for every step (share.c), in benchmark builds
 * (bench/quant/two_decoders.sh times both). */
static int share_ignored(void) {
    const char *e = core_bench_knob("TLM_SHARED_CORES");
    return e && !strcmp(e, "ignore");
}

static tlm_status step(tlm_session *s, const int32_t *ids, const int *n, const uint8_t *want,
                       const int *rows, float *logits) {
    CORE_FP_FLUSH_SCOPE();
    if (!s || !n) return core_err(TLM_ERR_ARG, "step: session and counts must not be NULL");
    const tlm_config *c = &s->m->c;
    int N = 0;
    for (int b = 0; b < s->B; b++) {
        if (n[b] < 0) return core_err(TLM_ERR_ARG, "step: %d new ids for sequence %d", n[b], b);
        if (rows && (rows[b] < 0 || rows[b] > n[b]))
            return core_err(TLM_ERR_ARG, "step: %d rows of logits for %d new ids of sequence %d",
                            rows[b], n[b], b);
        if (n[b] > s->cap - s->len[b])
            return core_err(TLM_ERR_RANGE,
                            "step: %d ids for sequence %d after %d cached exceed the context of %d "
                            "positions (no context shift)",
                            n[b], b, s->len[b], s->cap);
        N += n[b];
    }
    if (N == 0) return TLM_OK;
    if (!ids) return core_err(TLM_ERR_ARG, "step: ids must not be NULL");
    tlm_status st = check_ids(c, ids, N);
    if (st) return st;
    core_threads_enter();
    int decode = 1;
    for (int b = 0; b < s->B; b++) decode &= n[b] <= 1;
    int full = omp_get_max_threads(), ignore = decode && full > 1 ? share_ignored() : 1;
    int team = infer_share_team(&s->share, full, decode, ignore);
    int timed = decode && team == full && full > 1 && !ignore;
    double w0 = timed ? core_now_s() : 0, c0 = timed ? core_cpu_s() : 0;
    if (team != full) omp_set_num_threads(team);
    /* A decode step runs no OpenMP region (attend_decode and cache_store go through k_team_units
     * too), so its products can take the pool; passes with a prompt's rows keep OpenMP. */
    int pool = k_team_pool(decode);
    int split = 0;
    for (int b = 0; b < s->B && s->step_max; b++) split |= n[b] > s->step_max;
    st = split ? step_split(s, ids, n, want, rows, logits, N)
               : step_rows(s, ids, n, want, rows, NULL, logits, N);
    k_team_pool(pool);
    if (team != full) omp_set_num_threads(full);
    if (timed && !st) infer_share_after(&s->share, full, core_now_s() - w0, core_cpu_s() - c0);
    return st;
}

tlm_status tlm_session_step(tlm_session *s, const int32_t *ids, const int *n, const uint8_t *want,
                            float *logits) {
    return step(s, ids, n, want, NULL, logits);
}

tlm_status tlm_session_step_rows(tlm_session *s, const int32_t *ids, const int *n, const int *rows,
                                 float *logits) {
    if (!rows) return core_err(TLM_ERR_ARG, "step: rows must not be NULL");
    return step(s, ids, n, NULL, rows, logits);
}

/* A step with more than step_max new ids of a sequence, where a layer is a ring: passes of at most
 * step_max ids of each sequence, each pass's logits where the caller's would be (the rows a pass
 * holds of those asked for, at their place among them). */
static tlm_status step_split(tlm_session *s, const int32_t *ids, const int *n, const uint8_t *want,
                             const int *rows, float *logits, int N) {
    int B = s->B, M = s->step_max;
    int *ints = malloc((size_t)B * 6 * sizeof(int));
    int32_t *sub_ids = malloc((size_t)N * sizeof(int32_t));
    uint8_t *sub_want = malloc((size_t)B);
    if (!ints || !sub_ids || !sub_want) {
        free(ints);
        free(sub_ids);
        free(sub_want);
        return core_err(TLM_ERR_NOMEM, "out of memory for a step of %d rows", N);
    }
    int *done = ints, *id0 = ints + B, *out0 = ints + 2 * B, *sub_n = ints + 3 * B,
        *sub_rows = ints + 4 * B, *row_at = ints + 5 * B;
    for (int b = 0, at = 0, out = 0; b < B; b++) {
        done[b] = 0;
        id0[b] = at;
        out0[b] = out;
        at += n[b];
        out += rows ? rows[b] : 0;
    }
    tlm_status st = TLM_OK;
    for (;;) {
        int sub_N = 0;
        for (int b = 0; b < B; b++) {
            int k = n[b] - done[b] < M ? n[b] - done[b] : M;
            memcpy(sub_ids + sub_N, ids + id0[b] + done[b], (size_t)k * sizeof(int32_t));
            sub_n[b] = k;
            sub_N += k;
            sub_want[b] = k && done[b] + k == n[b] && (!want || want[b]);
            if (rows) {
                int first = n[b] - rows[b], lo = done[b] > first ? done[b] : first;
                sub_rows[b] = done[b] + k > lo ? done[b] + k - lo : 0;
                row_at[b] = out0[b] + lo - first;
            }
        }
        if (!sub_N) break;
        st = step_rows(s, sub_ids, sub_n, sub_want, rows ? sub_rows : NULL, row_at, logits, sub_N);
        if (st) break;
        for (int b = 0; b < B; b++) done[b] += sub_n[b];
    }
    free(ints);
    free(sub_ids);
    free(sub_want);
    return st;
}

static tlm_status step_rows(tlm_session *s, const int32_t *ids, const int *n, const uint8_t *want,
                            const int *rows, const int *row_at, float *logits, int N) {
    const tlm_config *c = &s->m->c;
    tlm_status st = reserve_rows(s, N);
    if (st) return st;
    /* Rows: the single new ids first (one query each, attended by the decode path), then each
     * longer run in one piece (the prefill path's matrix products over the cache). */
    int r = 0, off = 0;
    s->n_single = s->n_segs = 0;
    for (int pass = 0; pass < 2; pass++) {
        off = 0;
        for (int b = 0; b < s->B; off += n[b], b++) {
            if (!n[b] || (n[b] == 1) != (pass == 0)) continue;
            if (pass) {
                s->seg_b[s->n_segs] = b;
                s->seg_r0[s->n_segs] = r;
                s->seg_n[s->n_segs++] = n[b];
            } else {
                s->n_single++;
            }
            for (int i = 0; i < n[b]; i++, r++) {
                s->row_seq[r] = b;
                s->row_pos[r] = s->len[b] + i;
                s->row_ids[r] = ids[off + i];
            }
        }
    }
    size_t sc = (size_t)s->n_single * c->n_heads * s->cap;
    if (s->n_segs && (size_t)omp_get_max_threads() * prefill_scores(s) > sc)
        sc = (size_t)omp_get_max_threads() * prefill_scores(s);
    st = reserve_scores(s, sc);
    if (!st) st = reserve_wide(s);
    if (st) return st;
    blocks(s, s->row_ids, N, 0);
    for (int b = 0; b < s->B; b++) s->len[b] += n[b];
    if (!logits) return TLM_OK;
    if (rows) {
        /* A sequence's new ids are consecutive rows (a single one, or one run), so its last
         * rows[b] rows go through the head in one product, straight into their place. */
        size_t V = (size_t)c->vocab_size, out = 0;
        for (int k = 0; k < N; k += n[s->row_seq[k]]) s->want_row[s->row_seq[k]] = k;
        for (int b = 0; b < s->B; b++) {
            if (!rows[b]) continue;
            if (row_at) out = (size_t)row_at[b];
            head_rows(s, s->want_row[b] + n[b] - rows[b], rows[b], logits + out * V, NULL, b);
            out += (size_t)rows[b];
        }
        return TLM_OK;
    }
    /* The last row of each sequence that asked, in row order, moved to the front of the residual
     * rows (a row only moves down) so that one head product serves them all. */
    int nw = 0;
    for (int k = 0; k < N; k++) {
        int b = s->row_seq[k];
        if (s->row_pos[k] != s->len[b] - 1 || (want && !want[b])) continue;
        s->want_seq[nw] = b;
        s->want_row[nw] = k;
        nw++;
    }
    int d = c->d_model;
    for (int k = 0; k < nw; k++)
        if (s->want_row[k] != k)
            memcpy(s->x + (size_t)k * d, s->x + (size_t)s->want_row[k] * d,
                   (size_t)d * sizeof(float));
    int in_place = nw == s->B;
    for (int k = 0; k < nw && in_place; k++) in_place = s->want_seq[k] == k;
    if (in_place) {
        head_rows(s, 0, nw, logits, s->want_seq, 0);
        return TLM_OK;
    }
    size_t V = (size_t)c->vocab_size;
    head_rows(s, 0, nw, s->logits, s->want_seq, 0);
    for (int k = 0; k < nw; k++)
        memcpy(logits + (size_t)s->want_seq[k] * V, s->logits + (size_t)k * V, V * sizeof(float));
    return TLM_OK;
}

tlm_status tlm_session_decode(tlm_session *s, const int32_t *ids, const uint8_t *active,
                              float *logits) {
    if (!s || !ids) return core_err(TLM_ERR_ARG, "decode: session and ids must not be NULL");
    const tlm_config *c = &s->m->c;
    int N = 0;
    for (int b = 0; b < s->B; b++) {
        s->step_n[b] = !active || active[b];
        if (!s->step_n[b]) continue;
        if (s->len[b] >= s->cap)
            return core_err(TLM_ERR_RANGE,
                            "decode: sequence %d is full (%d positions); no context shift", b,
                            s->cap);
        if (ids[b] < 0 || ids[b] >= c->vocab_size)
            return core_err(TLM_ERR_RANGE,
                            "token id %d of sequence %d is outside the vocabulary (%d)", ids[b], b,
                            c->vocab_size);
        s->ids_tmp[N++] = ids[b];
    }
    return tlm_session_step(s, s->ids_tmp, s->step_n, NULL, logits);
}

tlm_status tlm_session_decode_one(tlm_session *s, int32_t id, float *logits) {
    if (!s) return core_err(TLM_ERR_ARG, "decode: session must not be NULL");
    if (s->B == 1) return tlm_session_decode(s, &id, NULL, logits);
    /* Only sequence 0 moves; logits row 0 is the whole [V] the caller gave. */
    memset(s->act_tmp, 0, (size_t)s->B);
    s->act_tmp[0] = 1;
    s->ids_tmp[0] = id;
    return tlm_session_decode(s, s->ids_tmp, s->act_tmp, logits);
}
