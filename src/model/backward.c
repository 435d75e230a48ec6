/* The backward pass of a whole batch: walks the blocks in reverse over the activations the
 * training forward left in the arena. Gradients land in a buffer with the flat parameter layout,
 * so the same offsets index both. */
#include <math.h>
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
    size_t sizes[] = {
        N * d,  N * d,
        N * d,  N * ld, /* fused dq|dk|dv rows, like the forward's q|k|v */
        N * qw, c->ffn == TLM_FFN_SWIGLU ? N * ff * 2 : 0, /* else dff_h works in place */
        N * ff, c->dropout > 0.0f ? N * d : 0};
    float **ptrs[] = {&g->dres, &g->dtmp,  &g->dn,    &g->dqkv,
                      &g->datt, &g->dff_a, &g->dff_h, &g->ddrop};
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) total += (sizes[i] + 15) & ~15ul;
    x->gbase = core_big_alloc(total * sizeof(float));
    if (!x->gbase) return core_err(TLM_ERR_NOMEM, "out of memory for gradients of activations");
    size_t off = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        *ptrs[i] = sizes[i] ? x->gbase + off : NULL;
        off += (sizes[i] + 15) & ~15ul;
    }
    x->gfloats = total;
    x->gB = B;
    x->gT = T;
    return TLM_OK;
}

tlm_status mdl_ctx_forward_backward_whole(tlm_train_ctx *x, const int32_t *ids,
                                          const int32_t *targets, int B, int T, int pos0,
                                          float *grads, int accumulate, int divisor, float *loss,
                                          int *counted_out) {
    const tlm_model *m = x->m;
    const tlm_config *c = &m->c;
    tlm_status s = mdl_ctx_forward(x, ids, B, T, pos0, 1);
    if (s) return s;
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
    int acc = accumulate, N = B * T, counted = 0;
    double l = k_cross_entropy_fwd_bwd(x->logits, targets, N, c->vocab_size, divisor, &counted);
    if (loss) *loss = (float)l;
    if (counted_out) *counted_out = counted;
    mdl_head_bwd(m, &x->pass, x->x_final, x->xn, x->xn_mean, x->xn_rstd, x->logits, &x->g, grads, N,
                 acc);
    for (int li = c->n_layers - 1; li >= 0; li--)
        mdl_block_bwd(m, li, &x->pass, &x->layer[li], &x->g, grads, acc);
    if (!x->pass.frozen) mdl_embed_bwd(m, &x->pass, ids, &x->g, grads, acc);
    return TLM_OK;
}
