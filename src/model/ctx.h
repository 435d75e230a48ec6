/* Internal view of a training context: everything a batched pass writes, owned by one caller. */
#ifndef TLM_MODEL_CTX_H
#define TLM_MODEL_CTX_H

#include "model/block.h"

struct tlm_train_ctx {
    const tlm_model *m;

    /* Activation arena, carved for the reserved shape (B, T); a smaller batch uses prefixes. */
    int B, T;
    float *base;
    size_t floats;
    mdl_block_bufs *layer; /* [n_layers]: each block's own buffers */
    mdl_block_bufs *run;   /* [n_layers]: those the pass running now uses (mdl_fwd_mode) */
    float **probs;         /* [n_layers] attention probabilities [B, H, T, T] (keys by queries) */
    float *x_final;        /* [N, d] the last block's output */
    float *xn, *xn_mean, *xn_rstd; /* the output norm */
    float *logits, *softmax;       /* [N, V] */
    int *pos;                      /* [N] */
    int *lo;     /* [N] each query's first visible key in its row (packed rows: its example's) */
    int packed;  /* lo applies: the pass's positions restart within some row */
    int *lo_win; /* [N] lo narrowed to the sliding window, for the windowed layers */

    /* Backward scratch, sized like the arena. */
    float *gbase;
    size_t gfloats;
    int gB, gT;
    mdl_block_grads g;

    /* Attention scratch: grows with the thread count and T at every pass (both can change between
     * passes: tlm_threads_set). */
    float *att_scratch;
    size_t att_floats;

    /* Mixed precision: bf16 is the products' state (NULL in fp32). */
    tlm_precision precision;
    struct k_bf16 *bf16;

    /* LoRA adapters applied to every pass (tlm_train_ctx_set_loras): with one, forward_backward
     * trains it and the model is frozen. Buffers for A x kept by training and scratch, sized by the
     * last pass. */
    mdl_lora_use *lora_use;
    int n_lora;
    mdl_lora_pass lora;
    float *lora_saved, *lora_scratch;
    size_t lora_saved_floats, lora_scratch_floats;

    /* Mixture of experts: the router statistics of the last training pass (moe_count holds
     * count | psum), and its router losses times the pass's share of the step, as they entered
     * its loss (a split batch: the slices' sum). */
    mdl_moe_stats moe;
    double *moe_count;
    double moe_aux, moe_z;
    /* A slice of a split batch: the statistics are the whole batch's (merged after every slice's
     * forward), share the losses' weight in the batch's loss and part this slice's fraction of
     * it; moe_share < 0 otherwise (the pass's own). */
    double moe_share, moe_part;

    /* The pass running now. */
    mdl_pass pass;
    int curB, curT;
    uint64_t drop_seed, drop_step;

    /* Data parallelism for small models: replicas are contexts of their own over the same model,
     * each with a gradient buffer (replica 0 writes into the caller's). */
    int data_parallel; /* -1 auto, 0 off, 1 on */
    int n_replicas;
    struct tlm_train_ctx **replicas;
    float **replica_grads;
    /* The batch of the last tlm_train_ctx_forward_logp, whose backward is still to run. */
    const int32_t *held_ids, *held_targets;
    int held_B, held_T, held_R;
    size_t replica_grad_floats; /* of each buffer: the model's or the trained adapter's params */
    int is_replica;
};

/* Targets must be below the vocabulary size (negative ones are ignored by the loss). */
tlm_status mdl_ctx_check_targets(const tlm_config *c, const int32_t *targets, int B, int T);
/* What a forward pass leaves in the arena. ALL: every layer's buffers and the logits [N, V] at
 * x->logits. TRAIN: what the backward pass reads (with dropout; no logits: mdl_ctx_head_loss);
 * in frozen passes (an adapter trained) the norms' outputs and the gated hidden are one layer's
 * scratch, which the backward pass computes again. LOSS: the last block's output only (every
 * layer runs in the first's buffers; no logits: mdl_ctx_head_loss). */
typedef enum { MDL_FWD_ALL, MDL_FWD_TRAIN, MDL_FWD_LOSS } mdl_fwd_mode;
/* pos [B*T] (NULL: pos0 + t): positions restarting within a row pack several examples into it,
 * none attending to another (tlm_batch_opts). */
tlm_status mdl_ctx_forward(tlm_train_ctx *x, const int32_t *ids, int B, int T, int pos0,
                           const int32_t *pos, mdl_fwd_mode mode);
/* After a forward without the head: the mean loss over the N rows' targets (>= 0; with a divisor
 * > 0 their sum over it), the logits computed a slice of rows at a time in x->logits. With grads,
 * the backward pass of the head too, slice by slice (leaving the gradient at the last block's
 * output in x->g.dres), the gradient of the loss summed and divided by divisor (<= 0: the count)
 * added to grads (acc) or written; with weights [N] as well, of sum_i weights[i] loss_i instead
 * (*loss that sum). Without grads, row_loss [N] (may be NULL) receives each row's loss. */
void mdl_ctx_head_loss(tlm_train_ctx *x, const int32_t *targets, int N, double divisor,
                       const float *weights, float *row_loss, float *grads, int acc, double *loss,
                       int *counted_out);
/* The most rows of logits mdl_ctx_head_loss computes at a time (0: its own choice), for tests
 * that make small batches take several slices. Returns the previous setting. */
int mdl_ctx_head_rows_max(int rows);
/* Targets >= 0 among n. */
int mdl_ctx_count_targets(const int32_t *targets, size_t n);
/* One forward + backward over the whole batch with every thread on each operation. *counted_out
 * receives the number of targets the mean loss is over; the gradient is of the loss summed over
 * them and divided by divisor (<= 0: by their count, i.e. of the mean loss). */
tlm_status mdl_ctx_forward_backward_whole(tlm_train_ctx *x, const int32_t *ids,
                                          const int32_t *targets, int B, int T, int pos0,
                                          const int32_t *pos, float *grads, int accumulate,
                                          double divisor, float *loss, int *counted_out);
/* A training forward of the whole batch (activations kept for mdl_ctx_backward_whole) and each
 * target's log-probability into logp [B*T] (0 where ignored). */
tlm_status mdl_ctx_forward_logp(tlm_train_ctx *x, const int32_t *ids, const int32_t *targets, int B,
                                int T, const int32_t *pos, float *logp);
/* The backward pass over the last training forward's batch (ids and targets as given to it):
 * the loss as mdl_ctx_head_loss computes it (divisor, or weights), its gradient into grads. */
tlm_status mdl_ctx_backward_whole(tlm_train_ctx *x, const int32_t *ids, const int32_t *targets,
                                  float *grads, int accumulate, double divisor,
                                  const float *weights, float *loss, int *counted_out);
/* Mean loss of a batch (forward only; pos as mdl_ctx_forward's) and the targets it is over,
 * split across the data-parallel replicas when training would split it: evaluation then runs as
 * fast per token as training does. */
tlm_status mdl_ctx_batch_loss(tlm_train_ctx *x, const int32_t *ids, const int32_t *targets, int B,
                              int T, const int32_t *pos, double *loss, long *count);
void mdl_ctx_free_replicas(tlm_train_ctx *x);
void mdl_ctx_free_grads(tlm_train_ctx *x);
/* Floats of a gradient of this context's backward pass: the trained adapter's parameters with one
 * attached, else the model's. */
size_t mdl_ctx_grad_floats(const tlm_train_ctx *x);

#endif
