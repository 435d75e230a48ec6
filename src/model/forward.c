#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "kernels/kernels.h"
#include "kernels/matvec.h"
#include "model/model.h"

void tlm_arena_free(tlm_arena *a) {
    tlm_big_free(a->base, a->floats * sizeof(float));
    free(a->layer);
    memset(a, 0, sizeof *a);
}

/* Carves the arena: first pass (base == NULL) only counts floats, second pass assigns pointers. */
static size_t carve(tlm_arena *a, const tlm_config *c, int B, int T, float *base) {
    size_t N = (size_t)B * T, d = (size_t)c->d_model, ff = (size_t)c->d_ff;
    size_t hd = d / (size_t)c->n_heads, qw = (size_t)c->n_heads * hd,
           kw = (size_t)c->n_kv_heads * hd;
    size_t off = 0;
    int ln = c->norm == TLM_NORM_LAYERNORM;
#define TAKE(ptr, count)                                                                           \
    do {                                                                                           \
        size_t n_ = (count);                                                                       \
        if (base) ptr = n_ ? base + off : NULL;                                                    \
        off += (n_ + 15) & ~(size_t)15; /* keep every buffer 64-byte aligned */                    \
    } while (0)
    for (int l = 0; l < c->n_layers; l++) {
        tlm_layer_acts dummy, *L = base ? &a->layer[l] : &dummy;
        TAKE(L->x, N * d);
        TAKE(L->n1, N * d);
        TAKE(L->n1_mean, ln ? N : 0);
        TAKE(L->n1_rstd, N);
        TAKE(L->q, N * (qw + 2 * kw)); /* fused q|k|v rows */
        if (base) {
            L->k = L->q + qw;
            L->v = L->q + qw + kw;
        }
        TAKE(L->probs, (size_t)B * c->n_heads * T * T);
        TAKE(L->att, N * qw);
        TAKE(L->h, N * d);
        TAKE(L->n2, N * d);
        TAKE(L->n2_mean, ln ? N : 0);
        TAKE(L->n2_rstd, N);
        TAKE(L->ff_a, N * ff * (c->ffn == TLM_FFN_SWIGLU ? 2 : 1)); /* swiglu: gate|up rows */
        TAKE(L->ff_h, N * ff);
        TAKE(L->y, N * d);
    }
    TAKE(a->x_final, N * d);
    TAKE(a->xn, N * d);
    TAKE(a->xn_mean, ln ? N : 0);
    TAKE(a->xn_rstd, N);
    TAKE(a->logits, N * (size_t)c->vocab_size);
    TAKE(a->probs, N * (size_t)c->vocab_size);
    TAKE(a->attn_tmp, N * d);
    TAKE(a->drop_scratch, c->dropout > 0.0f ? (size_t)omp_get_max_threads() * T * T : 0);
#undef TAKE
    return off;
}

tlm_status tlm_model_reserve(tlm_model *m, int B, int T) {
    const tlm_config *c = &m->c;
    if (B <= 0 || T <= 0) return tlm_err(TLM_ERR_ARG, "batch shape %dx%d must be positive", B, T);
    if (T > c->context_length)
        return tlm_err(TLM_ERR_ARG, "sequence length %d exceeds context_length %d", T,
                       c->context_length);
    tlm_arena *a = &m->arena;
    if (a->base && B <= a->B && T <= a->T) return TLM_OK;
    int nb = B > a->B ? B : a->B, nt = T > a->T ? T : a->T;
    tlm_arena_free(a);
    size_t floats = carve(a, c, nb, nt, NULL);
    if ((double)floats * sizeof(float) > 1e12)
        return tlm_err(TLM_ERR_NOMEM, "activations for batch %dx%d too large", nb, nt);
    a->layer = calloc((size_t)c->n_layers, sizeof *a->layer);
    a->base = tlm_big_alloc(floats * sizeof(float));
    if (!a->layer || !a->base) {
        tlm_big_free(a->base, floats * sizeof(float));
        free(a->layer);
        memset(a, 0, sizeof *a);
        return tlm_err(TLM_ERR_NOMEM, "out of memory for activations (%zu MiB)",
                       floats * sizeof(float) >> 20);
    }
    carve(a, c, nb, nt, a->base);
    a->floats = floats;
    a->B = nb;
    a->T = nt;
    return TLM_OK;
}

/* Applies the configured norm: row statistics go to mean/rstd for the backward pass. */
static void apply_norm(const tlm_config *c, float *y, float *mean, float *rstd, const float *x,
                       const float *g, const float *b, int N) {
    if (c->norm == TLM_NORM_RMSNORM)
        k_rmsnorm_fwd(y, rstd, x, g, N, c->d_model, c->norm_eps);
    else
        k_layernorm_fwd(y, mean, rstd, x, g, b, N, c->d_model, c->norm_eps);
}

void tlm_ffn_rows(const tlm_model *m, int layer, const float *in, float *a, float *h, float *out,
                  int N) {
    const tlm_config *c = &m->c;
    const tlm_layer_offsets *o = &m->off.layer[layer];
    float *P = m->params;
    int d = c->d_model, ff = c->d_ff;
    if (c->ffn == TLM_FFN_SWIGLU) {
        /* gate and up are one stacked [2*ff, d] matrix (see the schema) */
        k_linear_auto(a, in, tlm_at(P, o->wgate), tlm_at(P, o->bgate), N, d, 2 * ff);
        k_swiglu_rows_fwd(h, a, N, ff);
    } else {
        k_linear_auto(a, in, tlm_at(P, o->wup), tlm_at(P, o->bup), N, d, ff);
        static const k_act forms[] = {K_ACT_SILU, K_ACT_GELU, K_ACT_GELU_TANH, K_ACT_RELU};
        /* Training keeps act' (in place of the pre-activations) for the backward pass. */
        if (m->training)
            k_act_fwd_grad(h, a, (size_t)N * ff, forms[c->ffn]);
        else
            k_act_fwd(h, a, (size_t)N * ff, forms[c->ffn]);
    }
    k_linear_auto(out, h, tlm_at(P, o->wdown), tlm_at(P, o->bdown), N, ff, d);
}

uint64_t drop_key(const tlm_model *m, int layer, int which) {
    return k_dropout_key(m->drop_seed, m->drop_step, layer < 0 ? 0 : tlm_drop_site(layer, which));
}

static void attention_forward(tlm_model *m, int layer, const tlm_layer_offsets *o,
                              tlm_layer_acts *L, const float *in, float *out, int B, int T,
                              int pos0) {
    const tlm_config *c = &m->c;
    float *P = m->params;
    int N = B * T, d = c->d_model, hd = d / c->n_heads;
    int qw = c->n_heads * hd, kw = c->n_kv_heads * hd;
    int ld = qw + 2 * kw;
    /* q, k and v weights (and biases) are stacked in the schema: one sgemm for all three. */
    k_linear_fwd(L->q, in, tlm_at(P, o->wq), tlm_at(P, o->bq), N, d, ld);
    if (c->position == TLM_POS_ROPE) {
        int il = c->rope_pairing == TLM_ROPE_INTERLEAVED;
        k_rope_fwd(L->q, ld, B, T, c->n_heads, hd, pos0, m->rope_cos, m->rope_sin, il);
        k_rope_fwd(L->k, ld, B, T, c->n_kv_heads, hd, pos0, m->rope_cos, m->rope_sin, il);
    }
    int drop = m->training && c->dropout > 0.0f;
    k_attention_fwd(L->att, L->probs, L->q, L->k, L->v, ld, ld, B, T, c->n_heads, c->n_kv_heads, hd,
                    drop ? c->dropout : 0.0f, drop ? drop_key(m, layer, 0) : 0,
                    m->arena.drop_scratch);
    k_linear_fwd(out, L->att, tlm_at(P, o->wo), tlm_at(P, o->bo), N, qw, d);
    if (drop) k_dropout(out, out, (size_t)N * d, c->dropout, drop_key(m, layer, 1));
}

static void embed(tlm_model *m, float *x, const int32_t *ids, int B, int T, int pos0) {
    const tlm_config *c = &m->c;
    int d = c->d_model;
    const float *E = m->params + m->off.tok_emb;
    const float *pos = c->position == TLM_POS_LEARNED      ? m->params + m->off.pos_emb
                       : c->position == TLM_POS_SINUSOIDAL ? m->sinus
                                                           : NULL;
#pragma omp parallel for schedule(static) if ((long)B * T * d >= K_PAR_MIN)
    for (int r = 0; r < B * T; r++) {
        float *xr = x + (size_t)r * d;
        const float *er = E + (size_t)ids[r] * d;
        if (pos) {
            const float *pr = pos + (size_t)(pos0 + r % T) * d;
            for (int j = 0; j < d; j++) xr[j] = er[j] + pr[j];
        } else {
            memcpy(xr, er, (size_t)d * sizeof(float));
        }
    }
}

tlm_status tlm_forward_internal(tlm_model *m, const int32_t *ids, int B, int T, int pos0) {
    const tlm_config *c = &m->c;
    if (!ids) return tlm_err(TLM_ERR_ARG, "forward: ids must not be NULL");
    tlm_status s = tlm_model_reserve(m, B, T);
    if (s) return s;
    if (pos0 < 0 || pos0 > c->context_length - T)
        return tlm_err(TLM_ERR_RANGE, "positions %d..%d exceed context_length %d", pos0,
                       pos0 + T - 1, c->context_length);
    int N = B * T;
    for (int i = 0; i < N; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab_size)
            return tlm_err(TLM_ERR_RANGE, "token id %d at index %d is outside the vocabulary (%d)",
                           ids[i], i, c->vocab_size);
    tlm_arena *a = &m->arena;
    float *P = m->params;
    int d = c->d_model;
    size_t nd = (size_t)N * d;
    int pre = c->norm_position == TLM_NORM_PRE;
    /* Arena buffers are carved for the reserved (B, T); a smaller batch uses their prefixes. */
    int drop = m->training && c->dropout > 0.0f;
    embed(m, a->layer[0].x, ids, B, T, pos0);
    if (drop) k_dropout(a->layer[0].x, a->layer[0].x, nd, c->dropout, drop_key(m, -1, 0));
    for (int l = 0; l < c->n_layers; l++) {
        tlm_layer_acts *L = &a->layer[l];
        const tlm_layer_offsets *o = &m->off.layer[l];
        float *next = l + 1 < c->n_layers ? a->layer[l + 1].x : a->x_final;
        const float *g1 = tlm_at(P, o->attn_norm_w), *b1 = tlm_at(P, o->attn_norm_b);
        const float *g2 = tlm_at(P, o->ffn_norm_w), *b2 = tlm_at(P, o->ffn_norm_b);
        if (pre) {
            apply_norm(c, L->n1, L->n1_mean, L->n1_rstd, L->x, g1, b1, N);
            attention_forward(m, l, o, L, L->n1, a->attn_tmp, B, T, pos0);
            k_add(L->h, L->x, a->attn_tmp, nd);
            apply_norm(c, L->n2, L->n2_mean, L->n2_rstd, L->h, g2, b2, N);
            tlm_ffn_rows(m, l, L->n2, L->ff_a, L->ff_h, L->y, N);
            if (drop) k_dropout(L->y, L->y, nd, c->dropout, drop_key(m, l, 2));
            k_add(next, L->h, L->y, nd);
        } else {
            attention_forward(m, l, o, L, L->x, a->attn_tmp, B, T, pos0);
            k_add(L->h, L->x, a->attn_tmp, nd);
            apply_norm(c, L->n1, L->n1_mean, L->n1_rstd, L->h, g1, b1, N);
            tlm_ffn_rows(m, l, L->n1, L->ff_a, L->ff_h, L->y, N);
            if (drop) k_dropout(L->y, L->y, nd, c->dropout, drop_key(m, l, 2));
            k_add(L->y, L->n1, L->y, nd);
            apply_norm(c, next, L->n2_mean, L->n2_rstd, L->y, g2, b2, N);
        }
    }
    const float *head_in = a->x_final;
    if (pre) {
        apply_norm(c, a->xn, a->xn_mean, a->xn_rstd, a->x_final, tlm_at(P, m->off.out_norm_w),
                   tlm_at(P, m->off.out_norm_b), N);
        head_in = a->xn;
    }
    k_linear_fwd(a->logits, head_in, P + m->off.out_w, NULL, N, d, c->vocab_size);
    return TLM_OK;
}

tlm_status tlm_forward(tlm_model *m, const int32_t *ids, int B, int T, const tlm_forward_opts *opts,
                       tlm_forward_out *out) {
    static const tlm_forward_opts none = {0};
    if (!opts) opts = &none;
    const tlm_config *c = &m->c;
    if (!out) return tlm_err(TLM_ERR_ARG, "forward: out must not be NULL");
    if (opts->targets && B > 0 && T > 0)
        for (int i = 0; i < B * T; i++)
            if (opts->targets[i] >= c->vocab_size)
                return tlm_err(TLM_ERR_RANGE,
                               "target id %d at index %d is outside the vocabulary (%d)",
                               opts->targets[i], i, c->vocab_size);
    tlm_status s = tlm_forward_internal(m, ids, B, T, opts->pos_offset);
    if (s) return s;
    tlm_arena *a = &m->arena;
    int N = B * T;
    int counted = 0;
    double loss = NAN;
    if (opts->targets || opts->want_probs)
        loss = k_cross_entropy_fwd(a->logits, opts->targets, opts->want_probs ? a->probs : NULL, N,
                                   c->vocab_size, &counted);
    out->logits = a->logits;
    out->probs = opts->want_probs ? a->probs : NULL;
    out->loss = (float)loss;
    return TLM_OK;
}
