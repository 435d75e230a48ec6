/* Backward pass: walks the forward pass in reverse using the activations it left in the arena.
 * Gradients land in a buffer with the parameter buffer's layout, so the same offsets index both. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "model/model.h"

void tlm_grad_arena_free(tlm_grad_arena *g) {
    tlm_big_free(g->base, g->floats * sizeof(float));
    memset(g, 0, sizeof *g);
}

static tlm_status grad_reserve(tlm_model *m) {
    const tlm_config *c = &m->c;
    tlm_grad_arena *g = &m->garena;
    int B = m->arena.B, T = m->arena.T, threads = omp_get_max_threads();
    if (g->base && g->B == B && g->T == T && g->threads >= threads) return TLM_OK;
    tlm_grad_arena_free(g);
    size_t N = (size_t)B * T, d = (size_t)c->d_model, ff = (size_t)c->d_ff;
    size_t hd = d / (size_t)c->n_heads, qw = (size_t)c->n_heads * hd,
           kw = (size_t)c->n_kv_heads * hd;
    size_t sizes[] = {N * d,
                      N * d,
                      N * d,
                      N * (qw + 2 * kw), /* fused dq|dk|dv rows, like the forward's q|k|v */
                      N * qw,
                      c->ffn == TLM_FFN_SWIGLU ? N * ff * 2 : 0, /* else dff_h works in place */
                      N * ff,
                      (size_t)threads * T * T * (c->dropout > 0.0f ? 2 : 1),
                      c->dropout > 0.0f ? N * d : 0};
    float **ptrs[] = {&g->dres,  &g->dtmp,  &g->dn,          &g->dq,   &g->datt,
                      &g->dff_a, &g->dff_h, &g->att_scratch, &g->ddrop};
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) total += (sizes[i] + 15) & ~15ul;
    g->base = tlm_big_alloc(total * sizeof(float));
    if (!g->base) return tlm_err(TLM_ERR_NOMEM, "out of memory for gradients of activations");
    size_t off = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        *ptrs[i] = g->base + off;
        off += (sizes[i] + 15) & ~15ul;
    }
    g->floats = total;
    g->B = B;
    g->T = T;
    g->threads = threads;
    return TLM_OK;
}

static void norm_bwd(const tlm_config *c, float *dx, float *G, const tlm_model *m, size_t gw,
                     size_t gb, const float *dy, const float *x, const float *mean,
                     const float *rstd, int N, int acc) {
    const float *g = m->params + gw;
    if (c->norm == TLM_NORM_RMSNORM)
        k_rmsnorm_bwd(dx, G + gw, dy, x, g, rstd, N, c->d_model, acc);
    else
        k_layernorm_bwd(dx, G + gw, tlm_at(G, gb), dy, x, g, mean, rstd, N, c->d_model, acc);
}

/* dout: gradient at the FFN output; din: gradient at its input (overwritten). Parameter
 * gradients are added to G when acc, else written over it (so throughout this file). */
static void ffn_bwd(tlm_model *m, float *G, const tlm_layer_offsets *o, const tlm_layer_acts *L,
                    const float *in, const float *dout, float *din, int N, int acc) {
    const tlm_config *c = &m->c;
    tlm_grad_arena *g = &m->garena;
    float *P = m->params;
    int d = c->d_model, ff = c->d_ff;
    size_t n = (size_t)N * ff;
    k_linear_bwd(g->dff_h, G + o->wdown, tlm_at(G, o->bdown), dout, L->ff_h, P + o->wdown, N, ff, d,
                 acc);
    if (c->ffn == TLM_FFN_SWIGLU) {
        k_swiglu_rows_bwd(g->dff_a, g->dff_h, L->ff_a, N, ff);
        k_linear_bwd(din, G + o->wgate, tlm_at(G, o->bgate), g->dff_a, in, P + o->wgate, N, d,
                     2 * ff, acc);
    } else {
        k_mul(g->dff_h, g->dff_h, L->ff_a, n); /* the forward left act'(a) in ff_a */
        k_linear_bwd(din, G + o->wup, tlm_at(G, o->bup), g->dff_h, in, P + o->wup, N, d, ff, acc);
    }
}

/* Gradient through a dropout mask (into g->ddrop), or the gradient itself without dropout. */
static const float *undrop(tlm_model *m, const float *dy, int layer, int which, size_t n) {
    if (m->c.dropout <= 0.0f) return dy;
    k_dropout(m->garena.ddrop, dy, n, m->c.dropout, drop_key(m, layer, which));
    return m->garena.ddrop;
}

static void attn_bwd(tlm_model *m, int layer, float *G, const tlm_layer_offsets *o,
                     const tlm_layer_acts *L, const float *in, const float *dout, float *din, int B,
                     int T, int pos0, int acc) {
    const tlm_config *c = &m->c;
    tlm_grad_arena *g = &m->garena;
    float *P = m->params;
    int N = B * T, d = c->d_model, hd = d / c->n_heads;
    int qw = c->n_heads * hd, kw = c->n_kv_heads * hd;
    int ld = qw + 2 * kw;
    dout = undrop(m, dout, layer, 1, (size_t)N * d);
    k_linear_bwd(g->datt, G + o->wo, tlm_at(G, o->bo), dout, L->att, P + o->wo, N, qw, d, acc);
    int drop = c->dropout > 0.0f;
    float *dq = g->dq, *dk = g->dq + qw, *dv = g->dq + qw + kw;
    k_attention_bwd(dq, dk, dv, g->datt, L->q, L->k, L->v, ld, ld, L->probs, B, T, c->n_heads,
                    c->n_kv_heads, hd, drop ? c->dropout : 0.0f, drop ? drop_key(m, layer, 0) : 0,
                    g->att_scratch);
    if (c->position == TLM_POS_ROPE) {
        int il = c->rope_pairing == TLM_ROPE_INTERLEAVED;
        k_rope_bwd(dq, ld, B, T, c->n_heads, hd, pos0, m->rope_cos, m->rope_sin, il);
        k_rope_bwd(dk, ld, B, T, c->n_kv_heads, hd, pos0, m->rope_cos, m->rope_sin, il);
    }
    /* The stacked q|k|v matrix: one sgemm for the input gradient, one for the weights. */
    k_linear_bwd(din, G + o->wq, tlm_at(G, o->bq), g->dq, in, P + o->wq, N, d, ld, acc);
}

tlm_status tlm_forward_backward_whole(tlm_model *m, const int32_t *ids, const int32_t *targets,
                                      int B, int T, int pos0, float *grads, int accumulate,
                                      int divisor, float *loss, int *counted_out) {
    const tlm_config *c = &m->c;
    m->training = 1;
    tlm_status s = tlm_forward_internal(m, ids, B, T, pos0);
    m->training = 0;
    if (s) return s;
    s = grad_reserve(m);
    if (s) return s;
    /* Without accumulate every parameter gradient is written over on its first write (below), so
     * the buffer needs no zeroing pass; only the embedding tables, which get scattered adds,
     * start from zero (a tied table starts from the head's gradient). */
    int acc = accumulate;
    tlm_arena *a = &m->arena;
    tlm_grad_arena *g = &m->garena;
    float *G = grads, *P = m->params;
    int N = B * T, d = c->d_model, pre = c->norm_position == TLM_NORM_PRE;
    size_t nd = (size_t)N * d;
    int counted = 0;
    double l = k_cross_entropy_fwd_bwd(a->logits, targets, N, c->vocab_size, divisor, &counted);
    if (loss) *loss = (float)l;
    if (counted_out) *counted_out = counted;
    float *dlogits = a->logits;
    const float *head_in = pre ? a->xn : a->x_final;
    /* Gradient at the head's input goes to dres directly for post-norm, else via the norm. */
    float *dhead = pre ? g->dtmp : g->dres;
    k_linear_bwd(dhead, G + m->off.out_w, NULL, dlogits, head_in, P + m->off.out_w, N, d,
                 c->vocab_size, acc);
    if (pre)
        norm_bwd(c, g->dres, G, m, m->off.out_norm_w, m->off.out_norm_b, g->dtmp, a->x_final,
                 a->xn_mean, a->xn_rstd, N, acc);
    for (int li = c->n_layers - 1; li >= 0; li--) {
        const tlm_layer_acts *L = &a->layer[li];
        const tlm_layer_offsets *o = &m->off.layer[li];
        if (pre) {
            ffn_bwd(m, G, o, L, L->n2, undrop(m, g->dres, li, 2, nd), g->dn, N, acc);
            norm_bwd(c, g->dtmp, G, m, o->ffn_norm_w, o->ffn_norm_b, g->dn, L->h, L->n2_mean,
                     L->n2_rstd, N, acc);
            k_acc(g->dres, g->dtmp, nd);
            attn_bwd(m, li, G, o, L, L->n1, g->dres, g->dn, B, T, pos0, acc);
            norm_bwd(c, g->dtmp, G, m, o->attn_norm_w, o->attn_norm_b, g->dn, L->x, L->n1_mean,
                     L->n1_rstd, N, acc);
            k_acc(g->dres, g->dtmp, nd);
        } else {
            norm_bwd(c, g->dtmp, G, m, o->ffn_norm_w, o->ffn_norm_b, g->dres, L->y, L->n2_mean,
                     L->n2_rstd, N, acc);
            ffn_bwd(m, G, o, L, L->n1, undrop(m, g->dtmp, li, 2, nd), g->dn, N, acc);
            k_acc(g->dn, g->dtmp, nd);
            norm_bwd(c, g->dres, G, m, o->attn_norm_w, o->attn_norm_b, g->dn, L->h, L->n1_mean,
                     L->n1_rstd, N, acc);
            attn_bwd(m, li, G, o, L, L->x, g->dres, g->dtmp, B, T, pos0, acc);
            k_acc(g->dres, g->dtmp, nd);
        }
    }
    if (c->dropout > 0.0f) k_dropout(g->dres, g->dres, nd, c->dropout, drop_key(m, -1, 0));
    /* Embedding rows can repeat within a batch, so their scatter-add runs serially. */
    float *dE = G + m->off.tok_emb;
    if (!acc && !c->tie_embeddings) memset(dE, 0, (size_t)c->vocab_size * d * sizeof(float));
    for (int r = 0; r < N; r++) {
        float *dst = dE + (size_t)ids[r] * d;
        const float *src = g->dres + (size_t)r * d;
        for (int j = 0; j < d; j++) dst[j] += src[j];
    }
    if (c->position == TLM_POS_LEARNED) {
        float *dPos = G + m->off.pos_emb;
        if (!acc) memset(dPos, 0, (size_t)c->context_length * d * sizeof(float));
        for (int r = 0; r < N; r++) {
            float *dst = dPos + (size_t)(pos0 + r % T) * d;
            const float *src = g->dres + (size_t)r * d;
            for (int j = 0; j < d; j++) dst[j] += src[j];
        }
    }
    return TLM_OK;
}
