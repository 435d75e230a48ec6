/* tlm/lora.h: LoRA adapters over a model's linear layers (low-rank adaptation, as PEFT defines
 * it), made for training or read from the files people exchange them in. Part of tlm.h, which is
 * what programs include.
 *
 * An adapter adds s * B (A x) to the output y = W x of each matrix W [out, in] it targets: A is
 * [rank, in], B is [out, rank], s = alpha / rank (rsLoRA: alpha / sqrt(rank)). The model stays as
 * it is, in its own types: the same model runs with and without adapters, and with several at
 * once (each with a scale of its own). Attach adapters to a session (tlm_session_set_loras) or a
 * training context (tlm_train_ctx_set_loras); a training context with one adapter attached trains
 * that adapter alone (tlm_train_ctx_forward_backward, tlm_train_opts.lora). */
#ifndef TLM_LORA_H
#define TLM_LORA_H

#include "base.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tlm_lora tlm_lora;

/* The matrices an adapter may target: the blocks' projections and the output head. */
typedef enum {
    TLM_LORA_Q = 1 << 0,
    TLM_LORA_K = 1 << 1,
    TLM_LORA_V = 1 << 2,
    TLM_LORA_O = 1 << 3,
    TLM_LORA_GATE = 1 << 4,
    TLM_LORA_UP = 1 << 5,
    TLM_LORA_DOWN = 1 << 6,
    TLM_LORA_HEAD = 1 << 7
} tlm_lora_target;
/* Every linear layer of the blocks (those the model has: gate only with a gated FFN). */
#define TLM_LORA_BLOCKS 0x7fu
#define TLM_LORA_ALL 0xffu

typedef struct {
    int rank;         /* r (default 16) */
    float alpha;      /* 0: 2 * rank */
    float dropout;    /* on each adapter's input while training (default 0) */
    int rslora;       /* s = alpha / sqrt(rank) (default 0: alpha / rank) */
    unsigned targets; /* tlm_lora_target bits (default TLM_LORA_BLOCKS) */
    uint64_t seed;    /* A's initial values (default 1) */
} tlm_lora_opts;

void tlm_lora_opts_defaults(tlm_lora_opts *o);
/* "q,k,v,o,gate,up,down" (any of them, comma-separated) or "all" (those and the head) into
 * tlm_lora_target bits; TLM_ERR_ARG naming an unknown name. */
tlm_status tlm_lora_targets_parse(const char *list, unsigned *targets);

/* A new adapter for m, initialised as PEFT does: A Kaiming-uniform (a = sqrt(5), that is
 * U(-1/sqrt(in), 1/sqrt(in))), B zero, so that the model with it computes what m computes.
 * Explicitly asked targets the model lacks (gate without a gated FFN, the head of a model whose
 * head is its token embedding) are TLM_ERR_ARG naming them; TLM_LORA_BLOCKS takes those it has. */
tlm_status tlm_lora_new(const tlm_model *m, const tlm_lora_opts *o, tlm_lora **out);
/* A GGUF LoRA adapter (llama.cpp's: general.type = adapter) or a PEFT directory
 * (adapter_config.json + adapter_model.safetensors), checked against m: an adapter for another
 * architecture, a target m lacks, a shape that differs or a non-finite value is refused by name. */
tlm_status tlm_lora_load(const tlm_model *m, const char *path, tlm_lora **out);
/* Writes the adapter as a GGUF LoRA adapter file (F32 tensors <base tensor>.lora_a / .lora_b,
 * adapter.lora.alpha), atomically. */
tlm_status tlm_lora_save(const tlm_lora *a, const char *path);
/* Writes the adapter as a PEFT directory (made if missing; Hugging Face tensor names). */
tlm_status tlm_lora_save_peft(const tlm_lora *a, const char *dir);
void tlm_lora_free(tlm_lora *a);

/* Rank, alpha, dropout, rsLoRA and targets of the adapter (seed 0). */
void tlm_lora_get_opts(const tlm_lora *a, tlm_lora_opts *o);
/* The scale s of the adapter's products (alpha / rank, or alpha / sqrt(rank)). */
float tlm_lora_scale(const tlm_lora *a);
/* Trainable floats (every A and B) and matrices adapted. */
size_t tlm_lora_num_params(const tlm_lora *a);
int tlm_lora_num_matrices(const tlm_lora *a);
/* The parameters, laid out per matrix as A then B, matrices in layer order (q, k, v, o, gate, up,
 * down), the head last; the layout of the gradients tlm_train_ctx_forward_backward writes. The
 * writable pointer is for optimizers. */
const float *tlm_lora_params(const tlm_lora *a);
float *tlm_lora_params_mut(tlm_lora *a);
/* One entry per A and B (named <base tensor>.lora_a / .lora_b, e.g. blk.0.attn_q.weight.lora_a,
 * shapes [rank, in] / [out, rank], offsets into the parameters), owned by the adapter. */
const tlm_tensor_info *tlm_lora_tensors(const tlm_lora *a, int *n);

/* The merged weights: m's matrices widened, plus scale * s * B A of each adapter, into the F32
 * model *out (writable, the same config; untargeted tensors copied). Quantize or save it as any
 * other model. */
tlm_status tlm_lora_merge(const tlm_model *m, const tlm_lora *const *loras, const float *scales,
                          int n, tlm_model **out);

#ifdef __cplusplus
}
#endif
#endif
