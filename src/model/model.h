/* Internal view of a model: the config, its schema, the flat parameter buffer, per-layer offsets
 * into it (the same offsets index the gradient and optimizer buffers), fixed tables and the
 * activation arena. */
#ifndef TLM_MODEL_INTERNAL_H
#define TLM_MODEL_INTERNAL_H

#include "core/core.h"

#define TLM_NO_TENSOR ((size_t)-1)

/* Offsets (in floats) of a block's tensors; TLM_NO_TENSOR when the config has no such tensor. */
typedef struct {
    size_t attn_norm_w, attn_norm_b;
    size_t wq, bq, wk, bk, wv, bv, wo, bo;
    size_t ffn_norm_w, ffn_norm_b;
    size_t wgate, bgate, wup, bup, wdown, bdown;
} tlm_layer_offsets;

typedef struct {
    size_t tok_emb, pos_emb, out_norm_w, out_norm_b, out_w;
    tlm_layer_offsets *layer; /* [n_layers] */
} tlm_offsets;

/* Activations of one layer, kept for the backward pass. Rows are B*T tokens. */
typedef struct {
    float *x;         /* [N, d] block input (residual stream) */
    float *n1;        /* [N, d] pre-norm: norm1(x) (attention input); post-norm: norm1(x + attn) */
    float *n1_mean;   /* [N] layernorm only */
    float *n1_rstd;   /* [N] */
    float *q, *k, *v; /* column blocks of one [N, H*hd + 2*KVH*hd] buffer, after RoPE */
    float *probs;     /* [B, H, T, T] */
    float *att;       /* [N, H*hd] attention output before the projection */
    float *h;         /* [N, d] residual after attention (pre-norm) / x + attn (post-norm) */
    float *n2;        /* [N, d] pre-norm: norm2(h) (ffn input); post-norm: norm2(n1 + ffn) */
    float *n2_mean, *n2_rstd;
    float *ff_a; /* swiglu: [N, 2*d_ff] gate|up rows; else [N, d_ff] up pre-activation (after a
                  * training forward: the activation's derivative there) */
    float *ff_h; /* [N, d_ff] activated hidden */
    float *y;    /* [N, d] block output before the next residual (post-norm: pre-norm2 sum) */
} tlm_layer_acts;

typedef struct {
    int B, T;
    float *base;
    size_t floats;
    tlm_layer_acts *layer; /* [n_layers] */
    float *x_final;        /* [N, d] final residual stream */
    float *xn;             /* [N, d] after the output norm (or = x_final for post-norm) */
    float *xn_mean, *xn_rstd;
    float *logits;       /* [N, V] */
    float *probs;        /* [N, V] */
    float *attn_tmp;     /* [N, d] projection output scratch */
    float *drop_scratch; /* [threads, T, T] dropped attention probabilities (dropout > 0) */
} tlm_arena;

/* Scratch for the backward pass, sized like the activation arena. */
typedef struct {
    int B, T, threads;
    float *base;
    size_t floats;
    float *dres, *dtmp, *dn; /* [N, d] */
    float *dq;               /* [N, H*hd + 2*KVH*hd]: dq|dk|dv rows */
    float *datt;             /* [N, H*hd] */
    float *dff_a;            /* swiglu: [N, 2*d_ff] gate|up; unused otherwise */
    float *dff_h;            /* [N, d_ff] */
    float *att_scratch;      /* [threads, T, T], twice that with dropout */
    float *ddrop;            /* [N, d] gradient through a dropout mask */
} tlm_grad_arena;

struct tlm_model {
    tlm_config c;
    tlm_tensor_info *tensors;
    int n_tensors;
    float *params;
    size_t n_params;
    tlm_offsets off;
    float *rope_cos, *rope_sin; /* [context_length, hd/2] */
    float *sinus;               /* [context_length, d] */
    tlm_arena arena;
    tlm_grad_arena garena;
    /* Dropout runs only in training passes (tlm_forward_backward); masks derive from these. */
    int training;
    uint64_t drop_seed, drop_step;
    /* Data-parallel training passes: replicas share the parameters (and everything read-only)
     * but own their arenas and gradient buffers; each thread runs one on a slice of the batch.
     * is_replica marks such a shallow copy. */
    int data_parallel; /* -1 auto, 0 off, 1 on */
    int n_replicas;
    struct tlm_model **replicas;
    float **replica_grads;
    int is_replica;
};

/* Dropout sites: the embedding sum, then per layer the attention probabilities, the attention
 * output and the FFN output. */
static inline uint64_t tlm_drop_site(int layer, int which) {
    return 1 + 3 * (uint64_t)layer + which;
}

void tlm_arena_free(tlm_arena *a);
void tlm_grad_arena_free(tlm_grad_arena *g);
uint64_t drop_key(const tlm_model *m, int layer, int which);
void tlm_model_free_replicas(tlm_model *m);
/* A block's FFN over N rows: a receives the up (swiglu: gate|up) pre-activations, h the activated
 * hidden rows, out the result. Shared by the forward pass and the generation path. */
void tlm_ffn_rows(const tlm_model *m, int layer, const float *in, float *a, float *h, float *out,
                  int N);
/* One forward + backward over the whole batch with every thread on each operation (backward.c;
 * tlm_forward_backward splits small models' batches over replicas running this). *counted_out
 * receives the number of targets the mean loss is over; the gradient is of the loss summed over
 * them and divided by divisor (<= 0: by their count, i.e. of the mean loss). */
tlm_status tlm_forward_backward_whole(tlm_model *m, const int32_t *ids, const int32_t *targets,
                                      int B, int T, int pos0, float *grads, int accumulate,
                                      int divisor, float *loss, int *counted_out);
/* Mean loss of a batch (forward only), split across the data-parallel replicas when training
 * would split it: evaluation then runs as fast per token as training does. */
tlm_status tlm_batch_loss(tlm_model *m, const int32_t *ids, const int32_t *targets, int B, int T,
                          double *loss);
/* Runs the forward pass into the arena (no loss). */
tlm_status tlm_forward_internal(tlm_model *m, const int32_t *ids, int B, int T, int pos0);

static inline float *tlm_at(float *base, size_t off) {
    return off == TLM_NO_TENSOR ? NULL : base + off;
}

#endif
