/* tlm_imatrix_collect: the inputs of every matrix product of a batched forward pass, squared and
 * summed per column into an importance matrix, under the names llama.cpp gives the weights (what
 * llama-imatrix records and llama-quantize looks up). The pass keeps each layer's buffers in the
 * context's arena (the backward pass reads them), so the inputs are read from there after it:
 * q, k and v read the attention's norm, the output projection the heads' outputs, gate and up
 * the FFN's norm, down the activated hidden units. */
#include <stdio.h>

#include "model/ctx.h"
#include "model/model.h"
#include "tlm.h"

static tlm_status add(tlm_imatrix *im, const tlm_model *m, int l, const char *what, const float *x,
                      size_t rows, int *found) {
    char name[96];
    if (l >= 0)
        snprintf(name, sizeof name, "blk.%d.%s.weight", l, what);
    else
        snprintf(name, sizeof name, "%s.weight", what);
    const tlm_tensor_info *t = tlm_model_find(m, name);
    if (!t || t->ndim != 2) return TLM_OK; /* the architecture has no such matrix */
    ++*found;
    size_t cols = (size_t)t->shape[1];
    return tlm_imatrix_add_rows(im, name, x, rows, cols, cols);
}

tlm_status tlm_imatrix_collect(tlm_imatrix *im, tlm_train_ctx *ctx, const int32_t *ids, int B,
                               int T, int output, const float **logits) {
    CORE_FP_FLUSH_SCOPE();
    tlm_status s = mdl_ctx_forward(ctx, ids, B, T, 0, NULL, MDL_FWD_ALL);
    if (s) return s;
    if (logits) *logits = ctx->logits;
    const tlm_model *m = ctx->m;
    const tlm_config *c = &m->c;
    size_t N = (size_t)B * T;
    int pre = c->norm_position == TLM_NORM_PRE, found = 0;
    for (int l = 0; l < c->n_layers && !s; l++) {
        const mdl_block_bufs *b = &ctx->layer[l];
        /* what mdl_block_fwd hands each sub-layer: pre-norm the norms, post-norm the stream */
        const float *attn_in = pre ? b->n1 : b->x, *ffn_in = pre ? b->n2 : b->n1;
        static const char *const attn[] = {"attn_q", "attn_k", "attn_v"};
        for (int k = 0; k < 3 && !s; k++) s = add(im, m, l, attn[k], attn_in, N, &found);
        if (!s) s = add(im, m, l, "attn_output", b->att, N, &found);
        if (!s) s = add(im, m, l, "ffn_gate", ffn_in, N, &found);
        if (!s) s = add(im, m, l, "ffn_up", ffn_in, N, &found);
        if (!s) s = add(im, m, l, "ffn_down", b->ff_h, N, &found);
    }
    /* the head reads the final norm, or (post-norm) the last block's normalized output */
    if (!s && output) s = add(im, m, -1, "output", pre ? ctx->xn : ctx->x_final, N, &found);
    if (!s && !found)
        s = core_err(
            TLM_ERR_UNSUPPORTED,
            "the model has no matrices named as llama.cpp names them (blk.N.attn_q.weight, "
            "...): an importance matrix is for Llama-style models");
    return s;
}
