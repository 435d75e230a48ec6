/* Internal view of a model: the config, its schema, one weight view per tensor, per-layer handles
 * on those views and on their offsets in the flat layout (gradients and optimizer moments use the
 * same offsets), the fixed tables, and whatever backs the views (a flat buffer, mapped files,
 * widened copies). Nothing here changes after loading. */
#ifndef TLM_MODEL_INTERNAL_H
#define TLM_MODEL_INTERNAL_H

#include "core/core.h"

#define MDL_NO_TENSOR ((size_t)-1)

/* Offsets (in floats) of a block's tensors in the flat layout; MDL_NO_TENSOR when the config has
 * no such tensor. Gradients are written at these offsets. */
typedef struct {
    size_t attn_norm_w, attn_norm_b;
    size_t wq, bq, wk, bk, wv, bv, wo, bo;
    size_t ffn_norm_w, ffn_norm_b;
    size_t post_attn_norm_w, post_attn_norm_b, post_ffn_norm_w, post_ffn_norm_b; /* post_norms */
    size_t wgate, bgate, wup, bup, wdown, bdown;
    /* mixture of experts: the router, the experts' stacked matrices, the shared expert */
    size_t router, gate_exps, up_exps, down_exps, gate_sh, up_sh, down_sh, sh_gate;
} mdl_layer_offsets;

typedef struct {
    size_t tok_emb, pos_emb, out_norm_w, out_norm_b, out_w;
    mdl_layer_offsets *layer; /* [n_layers] */
} mdl_offsets;

/* A block's weights. Vectors (norm gains, biases) are always F32 and given as float pointers
 * (NULL when absent); matrices are views. qkv and gate_up are the stacked matrices [q; k; v] and
 * [gate; up] as one view when the three (two) are back to back in memory with one type and row
 * stride (always in the flat buffer; in files when they were written in that order), else NULL:
 * then the block multiplies by each part. */
typedef struct {
    const float *attn_norm_w, *attn_norm_b, *ffn_norm_w, *ffn_norm_b;
    const float *post_attn_norm_w, *post_attn_norm_b, *post_ffn_norm_w, *post_ffn_norm_b;
    const tlm_weight *wq, *wk, *wv, *wo, *wgate, *wup, *wdown;
    const float *bq, *bk, *bv, *bo, *bgate, *bup, *bdown;
    tlm_weight qkv, gate_up; /* data NULL when not fused */
    /* Mixture of experts: the router [E, d]; the experts' matrices as [E * out, in] views, expert
     * e's rows e * out .. (mdl_expert_view); the shared expert's matrices (gate_up_sh stacked as
     * gate_up is) and its gate vector [d]. NULL for a dense FFN. */
    const tlm_weight *router, *gate_exps, *up_exps, *down_exps, *gate_sh, *up_sh, *down_sh;
    const float *sh_gate;
    tlm_weight gate_up_sh;
} mdl_layer_weights;

/* What keeps the weights' memory alive. */
typedef struct {
    float *params; /* flat writable F32 buffer (writable models), else NULL */
    void *owned;   /* tensors converted at load (read-only models) */
    size_t owned_bytes;
    void *retyped; /* matrices given another type after binding (mdl_retype) */
    size_t retyped_bytes;
    core_mmap *maps; /* files the views point into */
    int n_maps;
} mdl_storage;

typedef struct {
    const char *name;
    int index;
} mdl_name_index;

struct tlm_model {
    tlm_config c;
    tlm_tensor_info *tensors;
    int n_tensors;
    size_t n_params;
    tlm_weight *w; /* [n_tensors] */
    mdl_offsets off;
    mdl_layer_weights *lw; /* [n_layers] */
    const tlm_weight *tok_emb, *pos_emb, *out_w;
    const float *out_norm_w, *out_norm_b;
    float *rope_cos, *rope_sin; /* [context_length, hd/2] */
    float *rope_factors;        /* [hd/2] or NULL: each frequency divided by its factor (Llama
                                   3.1's RoPE scaling, GGUF rope_freqs.weight) */
    float *sinus;               /* [context_length, d] */
    int all_f32;                /* every weight F32: the backward pass can run */
    mdl_storage st;
    mdl_name_index *sorted; /* [n_tensors] by name, for lookups */
};

/* Creates a model whose views are not bound yet (loaders bind them with mdl_bind); with
 * writable, the flat buffer is allocated (zeroed) and every view points into it. */
tlm_status mdl_new(const tlm_config *c, int writable, tlm_model **out);

/* Where a loader found one schema tensor: its type and bytes (rows back to back, no padding).
 * Loaders check the bytes are inside the file first. */
typedef struct {
    tlm_dtype dtype;
    const void *data;
    /* Added to every element, which makes the view a copy: Gemma's Hugging Face norms store w
     * and scale by 1 + w, where tlm's norms scale by their weight. */
    float add;
} mdl_bind_src;

/* Binds every view of a model made by mdl_new: writable models get the data converted into
 * the flat buffer; read-only ones use it in place when the kernels take its type and it is
 * aligned, else a converted copy. The model takes ownership of maps (the files the data lies in;
 * n_maps may be 0) whether or not this succeeds. */
tlm_status mdl_bind(tlm_model *m, const mdl_bind_src *src, core_mmap *maps, int n_maps);

/* Gives the matrices of a read-only model the type of the products asked for (TLM_LOAD_BF16,
 * TLM_LOAD_FP32): copies the model owns from then on; the file pages they came from are dropped. */
tlm_status mdl_retype(tlm_model *m, tlm_precision p);

/* The float data of a view known to be F32 with contiguous rows (vectors, or any weight of a model
 * with all_f32), or NULL. */
static inline const float *mdl_wf(const tlm_weight *w) {
    return w && w->data && w->dtype == TLM_DTYPE_F32 ? (const float *)w->data : NULL;
}

/* Divides RoPE's frequency i by f[i] (n = head dim / 2 factors, each positive and finite), as
 * llama.cpp applies a GGUF's rope_freqs.weight, and rebuilds the tables; for loaders, before the
 * model is shared. */
tlm_status mdl_set_rope_factors(tlm_model *m, const float *f, int n);

/* Whether the FFN is gated (gate|up rows: swiglu, geglu). */
static inline int mdl_gated(const tlm_config *c) {
    return c->ffn == TLM_FFN_SWIGLU || c->ffn == TLM_FFN_GEGLU;
}

/* Expert e's matrix out of a stacked [E * out, in] view: its out rows. */
static inline tlm_weight mdl_expert_view(const tlm_weight *w, int E, int e) {
    tlm_weight v = *w;
    v.rows = w->rows / E;
    v.data = (const char *)w->data + (size_t)e * (size_t)v.rows * w->row_bytes;
    return v;
}

/* Index of a tensor by canonical name, -1 if absent. */
int mdl_index(const tlm_model *m, const char *name);

static inline float *mdl_at(float *base, size_t off) {
    return off == MDL_NO_TENSOR ? NULL : base + off;
}

#endif
