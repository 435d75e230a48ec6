#include <stdio.h>
#include <string.h>

#include "core/core.h"

typedef struct {
    tlm_tensor_info *out;
    int cap;
    int n;
    size_t offset;
    tlm_param_count *count; /* optional: per-component totals */
} builder;

/* A tensor of shape [d0], [d0, d1] or [d0, d1, d2] (trailing dims 0 when absent). */
static void add3(builder *b, const char *name, int layer, tlm_component comp, int64_t d0,
                 int64_t d1, int64_t d2, int decay, int embedding) {
    tlm_tensor_info t;
    memset(&t, 0, sizeof t);
    if (layer >= 0)
        snprintf(t.name, sizeof t.name, "blk.%d.%.40s", layer, name); /* names are short */
    else
        snprintf(t.name, sizeof t.name, "%s", name);
    t.ndim = d2 > 0 ? 3 : d1 > 0 ? 2 : 1;
    t.shape[0] = d0;
    t.shape[1] = d1 > 0 ? d1 : 0;
    t.shape[2] = d2 > 0 ? d2 : 0;
    t.numel = (size_t)d0 * (size_t)(d1 > 0 ? d1 : 1) * (size_t)(d2 > 0 ? d2 : 1);
    t.offset = b->offset;
    t.layer = layer;
    t.component = comp;
    t.decay = decay;
    t.embedding = embedding;
    if (b->out && b->n < b->cap) b->out[b->n] = t;
    if (b->count) {
        b->count->per_component[comp] += t.numel;
        if (!embedding) b->count->non_embedding += t.numel;
    }
    b->n++;
    b->offset += t.numel;
}

static void add(builder *b, const char *name, int layer, tlm_component comp, int64_t d0, int64_t d1,
                int decay, int embedding) {
    add3(b, name, layer, comp, d0, d1, 0, decay, embedding);
}

/* Linear layers that read the same input: their weights [out_i, in] (which decay) come first and
 * back to back, then their biases [out_i] (which don't), so the forward and backward passes treat
 * the group as one stacked matrix: one sgemm instead of several small ones (q/k/v, gate/up). */
static void linears(builder *b, const char *const *names, const int64_t *outs, int n, int layer,
                    tlm_component comp, int64_t in, int bias) {
    char nm[TLM_NAME_MAX];
    for (int i = 0; i < n; i++) {
        snprintf(nm, sizeof nm, "%s.weight", names[i]);
        add(b, nm, layer, comp, outs[i], in, 1, 0);
    }
    for (int i = 0; bias && i < n; i++) {
        snprintf(nm, sizeof nm, "%s.bias", names[i]);
        add(b, nm, layer, comp, outs[i], 0, 0, 0);
    }
}

static void linear(builder *b, const char *name, int layer, tlm_component comp, int64_t out,
                   int64_t in, int bias) {
    linears(b, &name, &out, 1, layer, comp, in, bias);
}

static void norm(builder *b, const tlm_config *c, const char *name, int layer, tlm_component comp) {
    char n[TLM_NAME_MAX];
    snprintf(n, sizeof n, "%s.weight", name);
    add(b, n, layer, comp, c->d_model, 0, 0, 0);
    if (c->norm == TLM_NORM_LAYERNORM && c->bias) {
        snprintf(n, sizeof n, "%s.bias", name);
        add(b, n, layer, comp, c->d_model, 0, 0, 0);
    }
}

static void walk(builder *b, const tlm_config *c);

/* A mixture-of-experts FFN under GGUF's names: the router, each expert's gate, up and down
 * stacked [n_experts, out, in], then the shared expert (gate|up back to back, so one product
 * computes both) and its gate vector. */
static void experts(builder *b, const tlm_config *c, int l) {
    int64_t d = c->d_model, E = c->n_experts, F = c->expert_d_ff;
    add(b, "ffn_gate_inp.weight", l, TLM_COMP_FFN, E, d, 1, 0);
    add3(b, "ffn_gate_exps.weight", l, TLM_COMP_FFN, E, F, d, 1, 0);
    add3(b, "ffn_up_exps.weight", l, TLM_COMP_FFN, E, F, d, 1, 0);
    add3(b, "ffn_down_exps.weight", l, TLM_COMP_FFN, E, d, F, 1, 0);
    if (c->n_shared_experts > 0) {
        static const char *const sh[] = {"ffn_gate_shexp", "ffn_up_shexp"};
        int64_t S = (int64_t)c->n_shared_experts * F, sh_out[] = {S, S};
        linears(b, sh, sh_out, 2, l, TLM_COMP_FFN, d, 0);
        linear(b, "ffn_down_shexp", l, TLM_COMP_FFN, d, S, 0);
        add(b, "ffn_gate_inp_shexp.weight", l, TLM_COMP_FFN, d, 0, 1, 0);
    }
}

int tlm_config_tensors(const tlm_config *c, tlm_tensor_info *out, int cap, size_t *n_params) {
    builder b = {out, cap, 0, 0, NULL};
    walk(&b, c);
    if (n_params) *n_params = b.offset;
    return b.n;
}

static void walk(builder *b, const tlm_config *c) {
    int64_t d = c->d_model, hd = c->d_model / c->n_heads;
    add(b, "token_embd.weight", -1, TLM_COMP_EMBEDDING, c->vocab_size, d, 1, 1);
    if (c->position == TLM_POS_LEARNED)
        add(b, "position_embd.weight", -1, TLM_COMP_POSITION, c->context_length, d, 1, 1);
    for (int l = 0; l < c->n_layers; l++) {
        norm(b, c, "attn_norm", l, TLM_COMP_ATTN_NORM);
        static const char *const qkv[] = {"attn_q", "attn_k", "attn_v"};
        int64_t qkv_out[] = {c->n_heads * hd, c->n_kv_heads * hd, c->n_kv_heads * hd};
        linears(b, qkv, qkv_out, 3, l, TLM_COMP_ATTN, d, c->bias || c->qkv_bias);
        linear(b, "attn_output", l, TLM_COMP_ATTN, d, c->n_heads * hd, c->bias);
        if (c->post_norms) norm(b, c, "post_attention_norm", l, TLM_COMP_ATTN_NORM);
        norm(b, c, "ffn_norm", l, TLM_COMP_FFN_NORM);
        static const char *const gate_up[] = {"ffn_gate", "ffn_up"};
        int64_t ff_out[] = {c->d_ff, c->d_ff};
        if (c->n_experts > 0) {
            experts(b, c, l);
        } else {
            if (c->ffn == TLM_FFN_SWIGLU || c->ffn == TLM_FFN_GEGLU)
                linears(b, gate_up, ff_out, 2, l, TLM_COMP_FFN, d, c->bias);
            else
                linear(b, "ffn_up", l, TLM_COMP_FFN, c->d_ff, d, c->bias);
            linear(b, "ffn_down", l, TLM_COMP_FFN, d, c->d_ff, c->bias);
        }
        if (c->post_norms) norm(b, c, "post_ffw_norm", l, TLM_COMP_FFN_NORM);
    }
    /* Post-norm blocks end normalized already, so only pre-norm models have a final norm. */
    if (c->norm_position == TLM_NORM_PRE) norm(b, c, "output_norm", -1, TLM_COMP_OUTPUT_NORM);
    if (!c->tie_embeddings) add(b, "output.weight", -1, TLM_COMP_OUTPUT, c->vocab_size, d, 1, 0);
}

const char *tlm_component_name(tlm_component k) {
    static const char *const names[TLM_COMP_COUNT] = {
        "token embedding", "position embedding", "attention norms", "attention", "ffn norms", "ffn",
        "output norm",     "output head"};
    return (unsigned)k < TLM_COMP_COUNT ? names[k] : "?";
}

void tlm_config_count_params(const tlm_config *c, tlm_param_count *out) {
    memset(out, 0, sizeof *out);
    builder b = {NULL, 0, 0, 0, out};
    walk(&b, c);
    out->total = b.offset;
}

size_t tlm_config_active_params(const tlm_config *c) {
    tlm_param_count pc;
    tlm_config_count_params(c, &pc);
    if (c->n_experts <= 0) return pc.total;
    size_t per_expert = 3 * (size_t)c->expert_d_ff * (size_t)c->d_model;
    return pc.total - (size_t)c->n_layers * (size_t)(c->n_experts - c->n_experts_used) * per_expert;
}
