/* Internal view of a LoRA adapter (include/tlm/lora.h) and its products inside a pass. The block
 * (block.c) calls mdl_lora_fwd after each base product it adapts and mdl_lora_bwd beside that
 * product's input gradient; sites are (layer, target) pairs, the head being layer -1. */
#ifndef TLM_MODEL_LORA_H
#define TLM_MODEL_LORA_H

#include "model/model.h"

/* The targets of a block, in the order of the flat layout and of tlm_lora_target's bits. */
enum {
    MDL_LORA_Q,
    MDL_LORA_K,
    MDL_LORA_V,
    MDL_LORA_O,
    MDL_LORA_GATE,
    MDL_LORA_UP,
    MDL_LORA_DOWN,
    MDL_LORA_SITES
};

typedef struct {
    float *a, *b;        /* A [rank, in], B [out, rank] inside params; a NULL: no adapter here */
    int rank, in, out;   /* in, out: the base matrix's columns and rows */
    float s;             /* alpha / rank (rsLoRA: alpha / sqrt(rank)) */
    size_t off_a, off_b; /* offsets of A and B in params (and in the gradient) */
    size_t rank_before;  /* ranks of the sites before this one (where training keeps A x) */
} mdl_lora_site;

struct tlm_lora {
    tlm_config c;  /* the base's config: what the adapter was made for */
    char arch[32]; /* GGUF architecture of the base (llama, qwen2) */
    int rank;      /* the rank asked for (files: the first matrix's) */
    float alpha, dropout;
    int rslora;
    unsigned targets;
    float *params; /* every A and B */
    size_t n_params;
    tlm_tensor_info *tensors; /* one per A and B, GGUF names <base>.lora_a / .lora_b */
    int n_tensors;
    mdl_lora_site *site; /* [n_layers * MDL_LORA_SITES + 1]: the head last */
    size_t total_rank;   /* sum of every site's rank */
    int max_rank, max_in, max_out;
};

/* The site of (layer, target); layer -1 is the head. */
static inline mdl_lora_site *mdl_lora_site_at(const struct tlm_lora *a, int layer, int t) {
    return &a->site[layer < 0 ? a->c.n_layers * MDL_LORA_SITES : layer * MDL_LORA_SITES + t];
}

/* GGUF name of the base tensor of a site: blk.L.attn_q.weight ... output.weight. */
void mdl_lora_base_name(int layer, int t, char *out, size_t cap);
/* The base view a site adapts (NULL if the model has none). */
const tlm_weight *mdl_lora_base_weight(const tlm_model *m, int layer, int t);

/* An empty adapter over config c: sites and tensors laid out for the ranks rank_of[site] (0: no
 * adapter there), params zeroed. */
tlm_status mdl_lora_alloc(const tlm_config *c, const int *rank_of, float alpha, int rslora,
                          struct tlm_lora **out);
/* Refuses an adapter whose config or shapes differ from m's. */
tlm_status mdl_lora_check(const struct tlm_lora *a, const tlm_model *m);

/* Adapters applied during a pass. */
typedef struct {
    const struct tlm_lora *a;
    float scale;            /* the user's scale */
    const float *row_scale; /* [N] per-row factors (0: the row without this adapter), or NULL */
} mdl_lora_use;

typedef struct {
    int n;
    const mdl_lora_use *use;
    /* Training (one adapter): A x of every site of the pass, N * total_rank floats, for the
     * backward pass; NULL otherwise. */
    float *saved;
    /* At least mdl_lora_scratch_floats(N) floats. */
    float *scratch;
    /* The backward pass writes the adapter's gradients here (its params' layout), adding if acc. */
    float *grads;
    int acc;
} mdl_lora_pass;

/* Scratch floats a pass over N rows needs with these adapters. */
size_t mdl_lora_scratch_floats(const mdl_lora_use *use, int n, int N);

#endif
