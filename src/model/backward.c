/* The backward pass of a whole batch: walks the blocks in reverse over the activations the
 * training forward left in the arena. Gradients land in a buffer with the flat parameter layout,
 * so the same offsets index both. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/qdot.h"
#include "model/ctx.h"

void mdl_ctx_free_grads(tlm_train_ctx *x) {
    core_big_free(x->gbase, x->gfloats * sizeof(float));
    x->gbase = NULL;
    x->gfloats = 0;
    x->gB = x->gT = 0;
    memset(&x->g, 0, sizeof x->g);
}

/* Sized like the arena (its reserved B, T). */
static tlm_status grad_reserve(tlm_train_ctx *x) {
    const tlm_config *c = &x->m->c;
    int B = x->B, T = x->T;
    if (x->gbase && x->gB == B && x->gT == T) return TLM_OK;
    mdl_ctx_free_grads(x);
    size_t N = (size_t)B * T, d = (size_t)c->d_model, ff = (size_t)c->d_ff;
    size_t qw = (size_t)c->n_heads * (d / (size_t)c->n_heads), ld = (size_t)mdl_qkv_width(c);
    mdl_block_grads *g = &x->g;
    /* The FFN's backward is done before the attention's starts (in both norm positions), so
     * dqkv | datt share the rows of dff_a | dff_h (swiglu; else dff_h alone). */
    int swiglu = mdl_gated(c);
    size_t ffn = (swiglu ? N * ff * 2 : 0) + N * ff, att = N * ld + N * qw;
    float *shared = NULL;
    if (c->n_experts > 0) ffn = 0;
    size_t sizes[] = {N * d,
                      N * d,
                      N * d,
                      ffn > att ? ffn : att,
                      c->dropout > 0.0f ? N * d : 0,
                      mdl_moe_grad_floats(c, (int)N, 1)};
    float **ptrs[] = {&g->dres, &g->dtmp, &g->dn, &shared, &g->ddrop, &g->moe};
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) total += (sizes[i] + 15) & ~15ul;
    x->gbase = core_big_alloc(total * sizeof(float));
    if (!x->gbase) return core_err(TLM_ERR_NOMEM, "out of memory for gradients of activations");
    size_t off = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        *ptrs[i] = sizes[i] ? x->gbase + off : NULL;
        off += (sizes[i] + 15) & ~15ul;
    }
    g->dff_a = swiglu && c->n_experts <= 0 ? shared : NULL;
    g->dff_h = c->n_experts > 0 ? NULL : swiglu ? shared + N * ff * 2 : shared;
    g->dqkv = shared;
    g->datt = shared + N * ld;
    x->gfloats = total;
    x->gB = B;
    x->gT = T;
    return TLM_OK;
}

/* Rows of logits the training loss computes at a time: the whole [N, V] would be the largest
 * buffer of a pass (a quarter of a 110M model's activations at 2048 tokens). A pass whose head has
 * an adapter takes its rows at once (the adapter's saved products are laid out by the pass's rows).
 * In full training each slice adds to the head's weight gradient (a pass over it), so slices stay
 * large. */
static _Atomic int g_head_rows_max;

int mdl_ctx_head_rows_max(int rows) { return atomic_exchange(&g_head_rows_max, rows); }

static int head_rows(const tlm_train_ctx *x, int N) {
    for (int i = 0; i < x->n_lora; i++)
        if (mdl_lora_site_at(x->lora_use[i].a, -1, 0)->a) return N;
    int cap = atomic_load_explicit(&g_head_rows_max, memory_order_relaxed);
    if (cap > 0 && cap < N) N = cap;
    /* frozen: no weight gradient to add to, smaller slices (the rounded gradient's too) */
    size_t floats = (size_t)1 << (x->pass.frozen ? 23 : 24);
    int rows = (int)(floats / (size_t)x->m->c.vocab_size) & ~15;
    return rows < 16 ? 16 : rows < N ? rows : N;
}

int mdl_ctx_count_targets(const int32_t *targets, size_t n) {
    int k = 0;
    for (size_t i = 0; i < n; i++) k += targets[i] >= 0;
    return k;
}

void mdl_ctx_head_loss(tlm_train_ctx *x, const int32_t *targets, int N, double divisor,
                       const float *weights, float *row_loss, float *grads, int acc, double *loss,
                       int *counted_out) {
    const tlm_model *m = x->m;
    const tlm_config *c = &m->c;
    size_t d = (size_t)c->d_model;
    int total = mdl_ctx_count_targets(targets, (size_t)N), rows = head_rows(x, N);
    int given = divisor > 0;
    if (!given) divisor = total;
    double sum = 0;
    for (int r0 = 0; r0 < N; r0 += rows) {
        int n = N - r0 < rows ? N - r0 : rows, cnt = 0;
        mdl_pass p = x->pass;
        p.N = n;
        p.pos += r0;
        const float *xf = x->x_final + (size_t)r0 * d;
        float *xn = x->xn + (size_t)r0 * d, *mean = x->xn_mean ? x->xn_mean + r0 : NULL,
              *rstd = x->xn_rstd + r0;
        mdl_head_fwd_pass(m, &p, xf, xn, mean, rstd, x->logits, n);
        /* the loss's gradient replaces the capped logits, which the cap's backward reads: a copy
         * in the probabilities' buffer, which training does not use otherwise */
        size_t nv = (size_t)n * c->vocab_size;
        int cap = grads && c->final_softcap > 0.0f;
        if (cap) memcpy(x->softmax, x->logits, nv * sizeof(float));
        double l;
        if (grads && weights) {
            /* the weighted sum, not a mean: counted as one term */
            sum += k_cross_entropy_bwd_weighted(x->logits, targets + r0, weights + r0, n,
                                                c->vocab_size);
            l = 0;
        } else if (grads) {
            l = k_cross_entropy_fwd_bwd(x->logits, targets + r0, n, c->vocab_size, divisor, &cnt);
        } else if (row_loss) {
            k_cross_entropy_rows(x->logits, targets + r0, row_loss + r0, n, c->vocab_size);
            l = 0;
            for (int i = 0; i < n; i++) l += row_loss[r0 + i];
            cnt = mdl_ctx_count_targets(targets + r0, (size_t)n);
            l = cnt ? l / cnt : 0;
        } else {
            l = k_cross_entropy_fwd(x->logits, targets + r0, NULL, n, c->vocab_size, &cnt);
        }
        if (cap) k_softcap_bwd(x->logits, x->softmax, nv, c->final_softcap);
        if (grads) {
            mdl_block_grads g = x->g;
            g.dres += (size_t)r0 * d;
            g.dtmp += (size_t)r0 * d;
            mdl_head_bwd(m, &p, xf, xn, mean, rstd, x->logits, &g, grads, n, r0 ? 1 : acc);
        }
        if (cnt) sum += l * cnt;
    }
    *loss = weights ? sum : given ? sum / divisor : total ? sum / total : NAN;
    if (counted_out) *counted_out = total;
}

tlm_status mdl_ctx_forward_backward_whole(tlm_train_ctx *x, const int32_t *ids,
                                          const int32_t *targets, int B, int T, int pos0,
                                          const int32_t *pos, float *grads, int accumulate,
                                          double divisor, float *loss, int *counted_out) {
    tlm_status s = mdl_ctx_forward(x, ids, B, T, pos0, pos, MDL_FWD_TRAIN);
    if (s) return s;
    return mdl_ctx_backward_whole(x, ids, targets, grads, accumulate, divisor, NULL, loss,
                                  counted_out);
}

tlm_status mdl_ctx_forward_logp(tlm_train_ctx *x, const int32_t *ids, const int32_t *targets, int B,
                                int T, const int32_t *pos, float *logp) {
    tlm_status s = mdl_ctx_forward(x, ids, B, T, 0, pos, MDL_FWD_TRAIN);
    if (s) return s;
    double l;
    int N = B * T;
    mdl_ctx_head_loss(x, targets, N, 0, NULL, logp, NULL, 0, &l, NULL);
    for (int i = 0; i < N; i++) logp[i] = -logp[i];
    return TLM_OK;
}

tlm_status mdl_ctx_backward_whole(tlm_train_ctx *x, const int32_t *ids, const int32_t *targets,
                                  float *grads, int accumulate, double divisor,
                                  const float *weights, float *loss, int *counted_out) {
    const tlm_model *m = x->m;
    const tlm_config *c = &m->c;
    int B = x->curB, T = x->curT;
    tlm_status s;
    if ((s = grad_reserve(x)) != TLM_OK) return s;
    /* Without accumulate every parameter gradient is written over on its first write, so the
     * buffer needs no zeroing pass; only the embedding tables, which get scattered adds, start
     * from zero (a tied table starts from the head's gradient). */
    /* With an adapter attached the model is frozen: the gradient is the adapter's, and the
     * input gradients go through the weights in their own types, widened a tile at a time into
     * this thread's scratch, reserved here so that the pass cannot fail halfway. */
    if (x->n_lora) {
        x->pass.frozen = 1;
        x->lora.grads = grads;
        x->lora.acc = accumulate;
        if (!k_scratch(1, (size_t)4 << 20))
            return core_err(TLM_ERR_NOMEM, "out of memory for the frozen weights' tiles");
    }
    int acc = accumulate, counted = 0;
    double l;
    mdl_ctx_head_loss(x, targets, B * T, divisor, weights, NULL, grads, acc, &l, &counted);
    if (x->pass.moe) {
        /* The router losses are over the pass's rows; a pass that is part of a step (divisor
         * given) weighs them by its share of the step's targets, so the parts add up to their
         * mean over the parts. */
        /* A weighted pass (preference tuning) is a sum over pairs with no mean to weigh the
         * router losses into: it leaves them out. */
        double aux, z, share = weights ? 0.0 : divisor <= 0 ? 1.0 : counted / divisor, part = 1.0;
        if (x->moe_share >= 0) {
            share = x->moe_share;
            part = x->moe_part;
        }
        mdl_moe_losses(c, x->pass.moe, &aux, &z);
        x->pass.moe->scale = (float)share;
        x->moe_aux = share * part * aux;
        x->moe_z = share * part * z;
        l += c->router_aux_loss_coef * x->moe_aux + c->router_z_loss_coef * x->moe_z;
    }
    if (loss) *loss = (float)l;
    if (counted_out) *counted_out = counted;
    for (int li = c->n_layers - 1; li >= 0; li--)
        mdl_block_bwd(m, li, &x->pass, &x->run[li], &x->g, grads, acc);
    if (!x->pass.frozen) mdl_embed_bwd(m, &x->pass, ids, &x->g, grads, acc);
    return TLM_OK;
}

void tlm_train_ctx_router_losses(const tlm_train_ctx *x, double *aux, double *z) {
    *aux = x ? x->moe_aux : 0;
    *z = x ? x->moe_z : 0;
}
