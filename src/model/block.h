/* The transformer block over rows, written once: training forward, prefill and decode all run
 * mdl_block_fwd (they differ in where the rows' buffers are and in the attention core), and the
 * backward pass mdl_block_bwd walks the same sub-layers in reverse. Also the embedding and the
 * output head that come before and after the blocks. */
#ifndef TLM_MODEL_BLOCK_H
#define TLM_MODEL_BLOCK_H

#include "model/lora.h"
#include "model/model.h"

/* The rows' buffers of one block. A training pass gives every layer its own (the backward pass
 * reads them); generation points several at the same scratch, which the block allows: it works
 * in place where the names below coincide (h == x, out == x, n1 == x for post-norm, n2 == n1).
 * mean/rstd may be NULL when nothing will read them. */
typedef struct {
    float *x;                      /* [N, d] block input (residual stream) */
    float *n1, *n1_mean, *n1_rstd; /* pre-norm: norm1(x); post-norm: norm1(x + attn) */
    float *qkv;                    /* [N, ld]: q | k | v of each row, after RoPE */
    float *att;                    /* [N, H*hd] attention output before its projection */
    float *attn_out;               /* [N, d] the projection */
    /* post_norms: the post-norms' statistics (of attn_out and y), and post [N, d], where their
     * outputs go before the residual adds (may be attn_out or y where nothing reads those). */
    float *pa_mean, *pa_rstd, *pf_mean, *pf_rstd, *post;
    float *h;                      /* [N, d] pre-norm: x + attn; post-norm: x + attn before norm1 */
    float *n2, *n2_mean, *n2_rstd; /* pre-norm: norm2(h); post-norm: stats of norm2 */
    float *ff_a; /* swiglu, geglu [N, 2*d_ff] gate|up; else [N, d_ff] up (training: act') */
    float *ff_h; /* [N, d_ff] activated hidden */
    float *y;    /* [N, d] FFN output (post-norm: n1 + ffn, norm2's input) */
    float *out;  /* [N, d] block output */
    /* Mixture of experts (mdl_moe_carve; E experts, K used, expert width F, S slots): the router's
     * logits and softmax [N, E], each row's chosen experts and their weights [N, K], the slots
     * (row * K + k) grouped by expert, -1 where an expert's group is padded (r_slot [S]; r_off
     * [E + 1] each group's first slot; r_pos [N * K] each slot's place), the experts' gathered
     * inputs [S, d], gate|up [S, 2F], hidden [S, F] and outputs [S, d]; the shared expert's
     * gate|up [N, 2 n_shared F], hidden [N, n_shared F], output [N, d] and gate [N]. */
    float *r_logits, *r_probs, *r_w;
    int *r_sel, *r_slot, *r_off, *r_pos;
    float *e_x, *e_a, *e_h, *e_y;
    float *sh_a, *sh_h, *sh_y, *sh_g;
} mdl_block_bufs;

/* Router statistics of a training pass over all its layers, for the load-balancing and z losses
 * (HF's load_balancing_loss_func and Switch Transformer's router_z_loss over every layer's rows
 * concatenated): slots routed to each expert, router probabilities summed per expert, the sum of
 * logsumexp(logits)^2, and the rows counted (rows x layers). scale: the factor the backward pass
 * gives both losses' gradients (the pass's share of the step). */
typedef struct {
    double *count, *psum; /* [n_experts] */
    double zsum;
    long rows;
    float scale;
} mdl_moe_stats;

/* Floats of one layer's mixture-of-experts buffers over N rows (0 for a dense config); padded:
 * each expert's group of rows rounded up for the bf16 products. */
size_t mdl_moe_floats(const tlm_config *c, int N, int padded);
/* Points b's mixture-of-experts buffers into base (mdl_moe_floats(c, N, padded) floats). */
void mdl_moe_carve(const tlm_config *c, int N, int padded, float *base, mdl_block_bufs *b);
/* Floats of the backward pass's mixture-of-experts scratch (mdl_block_grads.moe). */
size_t mdl_moe_grad_floats(const tlm_config *c, int N, int padded);
/* The load-balancing loss (n_experts sum_i f_i P_i) and z-loss of the statistics, unweighted. */
void mdl_moe_losses(const tlm_config *c, const mdl_moe_stats *st, double *aux, double *z);

/* The attention core: from the q|k|v rows (stride ld, after RoPE) of a pass, the attention output
 * rows att [N, H*hd]. Training attends within each sequence of the batch and keeps the
 * probabilities; generation appends k and v to the KV cache and attends over it. bwd (training
 * only) computes dq|dk|dv (stride ld, before un-rotating) from datt. */
typedef struct {
    void (*fwd)(void *user, int layer, float *qkv, int ld, float *att, int N);
    void (*bwd)(void *user, int layer, const float *qkv, int ld, const float *datt, float *dqkv,
                int N);
    void *user;
    /* Optional (decode steps): fwd for the key/value head g alone (its q heads' outputs, its keys
     * and values stored), on whichever thread calls it, opening no parallel region; then the block
     * computes each kv head's rows of q|k|v in the same job that attends with them, one join per
     * layer fewer and the attention on every thread. */
    void (*fwd_group)(void *user, int layer, float *qkv, int ld, float *att, int N, int g);
} mdl_attend;

struct k_bf16;
/* What a pass over N rows is: their positions, whether it trains (keeps act' for the backward
 * pass and applies dropout with masks from (seed, step)), its attention core, when bf16 is not
 * NULL the state that runs its matrix products on bf16 operands (mixed precision; F32 weights),
 * and the LoRA adapters applied (NULL: none). frozen: the backward pass computes no gradient of
 * the model's own parameters (G may be NULL), only the input gradients through its weights in
 * their own types, and the adapter's gradients (LoRA training). recompute: the block's n1, n2
 * and (gated FFNs) ff_h are scratch shared by the layers, which its backward pass computes again
 * from x, h and ff_a before reading them. */
typedef struct {
    int N;
    const int *pos; /* [N] */
    int training;
    uint64_t drop_seed, drop_step;
    mdl_attend attend;
    struct k_bf16 *bf16;
    const mdl_lora_pass *lora;
    int frozen;
    int recompute;
    mdl_moe_stats *moe; /* training a mixture of experts: its router statistics, else NULL */
} mdl_pass;

/* Decode's q|k|v product and attention in one job (mdl_attend's fwd_group) where 1 (the default);
 * 0 keeps them apart, for tests comparing the two. Returns the previous setting. */
int mdl_block_fuse_attend(int on);
/* Layers run fused so far (all threads, all models): tests check the fused path ran. */
long mdl_block_fused_runs(void);

/* Row stride of the fused q|k|v buffers: H*hd + 2*KVH*hd. */
int mdl_qkv_width(const tlm_config *c);
/* The dropout key of a site: layer -1 is the embedding; which 0 the attention probabilities, 1 the
 * attention output, 2 the FFN output. */
uint64_t mdl_drop_key(const mdl_pass *p, int layer, int which);

/* x[N, d] = token embedding (+ position) of ids at p->pos (+ dropout when training). */
void mdl_embed_fwd(const tlm_model *m, const mdl_pass *p, const int32_t *ids, float *x);
void mdl_block_fwd(const tlm_model *m, int layer, const mdl_pass *p, const mdl_block_bufs *b);
/* logits [N, V] of rows x [N, d] (the output norm into xn first for pre-norm models; xn may be x
 * when nothing needs x afterwards), soft-capped where final_softcap is set. */
void mdl_head_fwd(const tlm_model *m, const float *x, float *xn, float *xn_mean, float *xn_rstd,
                  float *logits, int N);
/* xn [N, d]: rows x as the output product reads them (the output norm of pre-norm models; post-norm
 * blocks end normalized, so a copy). xn may be x. */
void mdl_head_norm(const tlm_model *m, const float *x, float *xn, int N);
/* The same with the pass's precision (p->bf16). */
void mdl_head_fwd_pass(const tlm_model *m, const mdl_pass *p, const float *x, float *xn,
                       float *xn_mean, float *xn_rstd, float *logits, int N);

/* Scratch of the backward pass, [N, ...] rows like the activations. */
typedef struct {
    float *dres, *dtmp, *dn; /* [N, d] */
    float *dqkv;             /* [N, ld] */
    float *datt;             /* [N, H*hd] */
    float *dff_a;            /* swiglu, geglu [N, 2*d_ff]; unused otherwise */
    float *dff_h;            /* [N, d_ff] */
    float *ddrop;            /* [N, d] gradient through a dropout mask (dropout > 0) */
    float *moe;              /* mdl_moe_grad_floats (mixture of experts) */
} mdl_block_grads;

/* Gradients are written into G (the flat layout) at the model's offsets: added when acc, else
 * written over. On entry g->dres holds the gradient at the block's output; on return, at its
 * input. b is what the forward pass left. */
void mdl_block_bwd(const tlm_model *m, int layer, const mdl_pass *p, const mdl_block_bufs *b,
                   const mdl_block_grads *g, float *G, int acc);
/* The head's backward: dlogits [N, V] (at the logits before any soft cap) -> g->dres (gradient at
 * the head's input x). */
void mdl_head_bwd(const tlm_model *m, const mdl_pass *p, const float *x, const float *xn,
                  const float *xn_mean, const float *xn_rstd, const float *dlogits,
                  const mdl_block_grads *g, float *G, int N, int acc);
/* Embedding gradients from g->dres (rows of ids at p->pos). */
void mdl_embed_bwd(const tlm_model *m, const mdl_pass *p, const int32_t *ids,
                   const mdl_block_grads *g, float *G, int acc);

#endif
