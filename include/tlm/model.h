/* tlm/model.h: configs, tensor schemas, models, and the model files they load from and save to
 * (tlm safetensors, GGUF, llama2.c, Hugging Face). Part of tlm.h, which is what programs include.
 */
#ifndef TLM_MODEL_H
#define TLM_MODEL_H

#include "base.h"
#include "tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- config ---------------------------------------------------------------------------------- */

typedef enum { TLM_NORM_RMSNORM = 0, TLM_NORM_LAYERNORM } tlm_norm_kind;
typedef enum { TLM_NORM_PRE = 0, TLM_NORM_POST } tlm_norm_position;
/* geglu: GELU-tanh(gate) * up, then down (Gemma), shaped like swiglu. */
typedef enum {
    TLM_FFN_SWIGLU = 0,
    TLM_FFN_GELU,
    TLM_FFN_GELU_TANH,
    TLM_FFN_RELU,
    TLM_FFN_GEGLU
} tlm_ffn_kind;
typedef enum {
    TLM_POS_ROPE = 0,
    TLM_POS_LEARNED,
    TLM_POS_SINUSOIDAL,
    TLM_POS_NONE
} tlm_position_kind;
/* half: x[i] rotates with x[i + d/2] (Hugging Face); interleaved: x[2i] with x[2i+1] (llama2.c,
 * GGUF, Meta's original). */
typedef enum { TLM_ROPE_HALF = 0, TLM_ROPE_INTERLEAVED } tlm_rope_pairing;

/* Upper limits that tlm_config_finalize enforces. A file header alone can set a config, so no
 * value may make a size computation wrap or make tlm_model_new allocate absurd fixed tables.
 * Each limit admits every published model we know of (Llama 3 405B: vocab 128256, d_model 16384,
 * 126 layers, 128 heads, d_ff 53248; million-token contexts at head dim 128). */
#define TLM_MAX_VOCAB_SIZE (1 << 24)
#define TLM_MAX_CONTEXT_LENGTH (1 << 24)
#define TLM_MAX_D_MODEL (1 << 16)
#define TLM_MAX_N_LAYERS (1 << 12)
#define TLM_MAX_N_HEADS (1 << 12)
#define TLM_MAX_D_FF (1 << 20)
/* Experts per mixture-of-experts layer (DeepSeek-V3: 256). */
#define TLM_MAX_N_EXPERTS (1 << 10)
/* Floats in the parameter buffer (4 TiB; 2.7x Llama 3 405B). */
#define TLM_MAX_PARAMS ((int64_t)1 << 40)
/* Floats in each fixed table a model builds at creation (256 MiB; a million-token context at
 * head dim 128): RoPE's cos and sin tables [context_length, head_dim/2], the sinusoid table
 * [context_length, d_model]. A file's header alone sets these, so they stay far below memory. */
#define TLM_MAX_TABLE_FLOATS (1 << 26)

typedef struct {
    int vocab_size;     /* 1 .. TLM_MAX_VOCAB_SIZE */
    int context_length; /* 1 .. TLM_MAX_CONTEXT_LENGTH, and the tables' limit */
    int d_model;        /* 1 .. TLM_MAX_D_MODEL, a multiple of n_heads */
    int n_layers;       /* 1 .. TLM_MAX_N_LAYERS */
    int n_heads;        /* 1 .. TLM_MAX_N_HEADS; rope needs an even d_model / n_heads */
    int n_kv_heads;     /* 0 = n_heads; else a divisor of n_heads */
    int d_ff; /* 1 .. TLM_MAX_D_FF; 0 = derived: swiglu, geglu 8/3*d rounded up to 64, else 4*d */
    tlm_norm_kind norm;
    float norm_eps; /* > 0, finite */
    tlm_norm_position norm_position;
    tlm_ffn_kind ffn;
    tlm_position_kind position;
    float rope_theta; /* > 0, finite (rope only) */
    tlm_rope_pairing rope_pairing;
    int tie_embeddings; /* 0/1 */
    int bias;           /* 0/1: biases on every Linear (not the LM head) and on LayerNorm */
    int qkv_bias;       /* 0/1: biases on the q, k and v projections only (Qwen2); bias has them */
    float dropout;      /* [0, 1) */
    /* Sliding-window attention (Mistral, Gemma 2 and 3): a windowed layer's query at position p
     * sees the keys at p - sliding_window + 1 .. p only; 0: every layer sees the whole context.
     * sliding_window_pattern (llama.cpp's and Gemma's): 0 windows every layer, P > 0 makes every
     * P-th layer (layer l with (l + 1) % P == 0) global and the others windowed. */
    int sliding_window;
    int sliding_window_pattern;
    /* Gemma 2's layer features; each 0 leaves the layer as it is without it.
     * attn_softcap: attention scores s (after the scale) become cap tanh(s / cap) before the mask
     * and softmax. final_softcap: the logits become cap tanh(logits / cap). embed_scale: the token
     * embedding is multiplied by it before the first block (Gemma: sqrt(d_model)); a tied head
     * reads the table unscaled. attn_scale: the scores' scale (0: 1 / sqrt(head_dim); Gemma 2:
     * 1 / sqrt(query_pre_attn_scalar)). post_norms (pre-norm only): a norm of its own on the
     * attention output and on the FFN output before each residual add, Gemma 2's four norms:
     * h = x + post_attn_norm(attn(attn_norm(x))), out = h + post_ffn_norm(ffn(ffn_norm(h))). */
    float attn_softcap;  /* >= 0, finite */
    float final_softcap; /* >= 0, finite */
    float embed_scale;   /* >= 0, finite */
    float attn_scale;    /* >= 0, finite */
    int post_norms;      /* 0/1 */
    /* Mixture of experts (Mixtral, OLMoE, Qwen2-MoE, Qwen3-MoE): with n_experts > 0 every layer's
     * FFN is a router [n_experts, d_model] whose softmax over the experts picks the n_experts_used
     * most probable ones per token (ties: the lower index); the output is the sum of their gated
     * FFNs (the config's ffn, swiglu or geglu, width expert_d_ff, no biases) weighted by their
     * probabilities, renormalised to sum 1 over the chosen ones with expert_weights_norm.
     * n_shared_experts > 0 adds Qwen2-MoE's shared expert: one gated FFN of width
     * n_shared_experts * expert_d_ff that every token takes, times sigmoid(x . w) of a gate vector
     * w [d_model]. Training adds router_aux_loss_coef times the load-balancing loss and
     * router_z_loss_coef times the router z-loss to the loss (docs/model-configs.md). */
    int n_experts;              /* 0 (dense) .. TLM_MAX_N_EXPERTS */
    int n_experts_used;         /* 1 .. n_experts (0 when dense) */
    int expert_d_ff;            /* 1 .. TLM_MAX_D_FF; 0 = d_ff */
    int expert_weights_norm;    /* 0/1 */
    int n_shared_experts;       /* 0 .. ; n_shared_experts * expert_d_ff <= TLM_MAX_D_FF */
    float router_aux_loss_coef; /* >= 0, finite */
    float router_z_loss_coef;   /* >= 0, finite */
} tlm_config;

/* The scale of layer scores q.k: attn_scale, or 1 / sqrt(head_dim) when it is 0. */
float tlm_config_attn_scale(const tlm_config *c);

/* Whether layer l of a finalized config attends through the sliding window. */
int tlm_config_layer_windowed(const tlm_config *c, int l);

/* The modern defaults (pre-norm, rmsnorm, swiglu, rope, tied, no bias) with a small size. */
void tlm_config_defaults(tlm_config *c);
/* Fills derived fields (n_kv_heads, d_ff when 0) and validates every field against the limits
 * above, and the parameter count (TLM_MAX_PARAMS) and fixed tables (TLM_MAX_TABLE_FLOATS) the
 * config implies; the error message names the offending field and its limit. */
tlm_status tlm_config_finalize(tlm_config *c);
/* Parses JSON text: keys are the field names; unknown keys or enum values are errors. Fields not
 * given keep the defaults. The result is finalized. */
tlm_status tlm_config_from_json(const char *json, tlm_config *c);
tlm_status tlm_config_load(const char *path, tlm_config *c);
/* JSON text of every field (malloc'd; free with free()). NULL on allocation failure. */
char *tlm_config_to_json(const tlm_config *c);
tlm_status tlm_config_save(const tlm_config *c, const char *path);

const char *tlm_norm_name(tlm_norm_kind k);
const char *tlm_norm_position_name(tlm_norm_position k);
const char *tlm_ffn_name(tlm_ffn_kind k);
const char *tlm_position_name(tlm_position_kind k);
const char *tlm_rope_pairing_name(tlm_rope_pairing k);

/* ---- tensor schema --------------------------------------------------------------------------- */

typedef enum {
    TLM_COMP_EMBEDDING = 0, /* token embedding */
    TLM_COMP_POSITION,      /* learned position table */
    TLM_COMP_ATTN_NORM,
    TLM_COMP_ATTN,
    TLM_COMP_FFN_NORM,
    TLM_COMP_FFN,
    TLM_COMP_OUTPUT_NORM,
    TLM_COMP_OUTPUT, /* untied LM head */
    TLM_COMP_COUNT
} tlm_component;

#define TLM_NAME_MAX 64

typedef struct {
    char name[TLM_NAME_MAX]; /* canonical GGUF-style name, e.g. "blk.3.attn_q.weight" */
    int ndim;                /* 1, 2, or 3 (experts' matrices [n_experts, out, in]) */
    int64_t shape[3];        /* PyTorch order: [out, in] for matrices; unused dims 0 */
    size_t offset;           /* in floats, into the flat parameter buffer */
    size_t numel;
    int layer; /* block index, -1 outside blocks */
    tlm_component component;
    int decay;     /* AdamW weight decay applies (matrices, embeddings) */
    int embedding; /* excluded from the non-embedding count */
} tlm_tensor_info;

/* Enumerates every tensor of a (finalized) config. Writes up to cap entries into out (may be NULL)
 * and returns the total number of tensors; *n_params receives the total float count. */
int tlm_config_tensors(const tlm_config *c, tlm_tensor_info *out, int cap, size_t *n_params);
const char *tlm_component_name(tlm_component k);

typedef struct {
    size_t total;
    size_t non_embedding;
    size_t per_component[TLM_COMP_COUNT];
} tlm_param_count;

void tlm_config_count_params(const tlm_config *c, tlm_param_count *out);
/* Parameters one token computes with: every parameter but the experts it is not routed to (the
 * total for a dense config). */
size_t tlm_config_active_params(const tlm_config *c);

/* ---- model ----------------------------------------------------------------------------------- */

/* A model is immutable once created or loaded: config, schema, weights and fixed tables (RoPE,
 * sinusoids). Any number of threads may share one; everything a pass writes lives in objects the
 * caller owns (a tlm_train_ctx for batched passes and training, a tlm_session for generation).
 * The one exception is a writable model's flat parameter buffer, which its owner (the optimizer,
 * tlm_model_init, a loader) updates while nothing else runs on the model. */
typedef struct tlm_model tlm_model;

/* Both set norm gains to 1 and biases to 0. */
typedef enum {
    TLM_INIT_GPT2 = 0, /* the default (GPT-2's, as nanoGPT and llm.c): matrices and embeddings
                          N(0, 0.02), block output projections (attention output, FFN down) scaled
                          by 1 / sqrt(2 n_layers); starts near ln(vocab) at every size */
    TLM_INIT_XAVIER    /* matrices trunc normal of variance 2 / (fan_in + fan_out) cut at 3 sigma,
                          embeddings trunc N(0, 1) cut at 3: a unit-variance embedding tied to the
                          head starts far above ln(vocab) on wide models */
} tlm_init_scheme;

/* How the model holds one tensor of its schema: element type, data and shape. Matrices are
 * [rows, cols] = [out, in] with row_bytes between rows; vectors are one row of `cols`. data points
 * into the flat parameter buffer (writable models), into a memory-mapped file (tensors the kernels
 * take in the file's own type), or into memory the model owns (tensors converted at load, the
 * copies TLM_LOAD_BF16 and TLM_LOAD_FP32 make, the file image TLM_LOAD_READ reads). */
typedef struct {
    tlm_dtype dtype;
    const void *data;
    int64_t rows, cols;
    size_t row_bytes;
} tlm_weight;

/* Creates a writable model with zeroed parameters in one flat F32 buffer (the schema's offsets;
 * gradients and AdamW moments use the same layout). The config is finalized (copied). */
tlm_status tlm_model_new(const tlm_config *c, tlm_model **out);
void tlm_model_free(tlm_model *m);
const tlm_config *tlm_model_config(const tlm_model *m);
/* The flat parameter buffer of a writable model; NULL for a read-only (memory-mapped) one. */
float *tlm_model_params(tlm_model *m);
/* Parameter count (floats of the flat layout, whether or not the model has the buffer). */
size_t tlm_model_num_params(const tlm_model *m);
/* The schema entries of this model (owned by the model) and their number. */
const tlm_tensor_info *tlm_model_tensors(const tlm_model *m, int *n);
/* Finds a tensor by canonical name; NULL if absent. */
const tlm_tensor_info *tlm_model_find(const tlm_model *m, const char *name);
/* The weight of schema entry i (0 <= i < tensor count), or NULL. */
const tlm_weight *tlm_model_weight(const tlm_model *m, int i);
/* Bytes of weights the model maps from files (or read into memory: TLM_LOAD_READ) and bytes it
 * owns: the flat buffer, converted copies, the fixed tables, and with TLM_QCACHE=on the repacked
 * copies of block-type weights that prompt-sized products made (about 1.25 bytes per weight). */
void tlm_model_memory(const tlm_model *m, size_t *mapped, size_t *owned);
/* Random initial weights (deterministic for a seed). Needs a writable model. */
tlm_status tlm_model_init(tlm_model *m, uint64_t seed, tlm_init_scheme scheme);

/* ---- model files ----------------------------------------------------------------------------- */

/* Real model files: llama2.c .bin (legacy and version 1), GGUF v3 (arch llama, qwen2 and gemma2),
 * Hugging Face directories (config.json + *.safetensors: LlamaForCausalLM, MistralForCausalLM,
 * Qwen2ForCausalLM, Gemma2ForCausalLM, GPT2LMHeadModel) and tlm's own checkpoints. Every reader
 * validates the file against its length before touching memory. Every writer needs F32 weights (a
 * writable model, or one whose files hold F32), and only GGUF holds Llama 3.1's RoPE frequency
 * factors (rope_freqs.weight). */

typedef enum {
    TLM_FORMAT_UNKNOWN = 0,
    TLM_FORMAT_TLM,     /* tlm checkpoint directory or tlm .safetensors */
    TLM_FORMAT_LLAMA2C, /* llama2.c .bin */
    TLM_FORMAT_GGUF,
    TLM_FORMAT_HF /* Hugging Face directory */
} tlm_model_format;

const char *tlm_model_format_name(tlm_model_format f);
/* Identifies a MODEL path by its content (magic, header sanity) and layout. */
tlm_status tlm_model_detect(const char *path, tlm_model_format *fmt);

/* How tlm_model_load keeps the weights (or'ed; 0: read-only, each tensor where it lies in the
 * file when the kernels take it there). */
typedef enum {
    /* Copy every tensor into one flat writable F32 buffer (training, conversion, editing, or not
     * keeping the file mapped). */
    TLM_LOAD_WRITABLE = 1,
    /* Products in bf16: F32 and F16 matrices are rounded (to nearest even) into BF16 copies the
     * model owns, so decoding reads half the bytes of F32 and prompts run on vdpbf16ps where the
     * CPU has AVX512_BF16; activations meet them rounded to BF16, as on BF16 files. */
    TLM_LOAD_BF16 = 2,
    /* Products in fp32 throughout: BF16 matrices are widened into F32 copies (without it, BF16
     * weights meet activations rounded to BF16, as llama.cpp computes them). */
    TLM_LOAD_FP32 = 4,
    /* Read the file into read-only memory the model owns, on 2 MiB pages, instead of mapping it
     * (llama.cpp's --no-mmap): the weights keep the file's types and are used where they lie, as
     * from a mapping. Loading then costs a copy of the file (about 0.3 s per GiB here), and
     * decoding, which reads every weight per token, runs faster: a file mapping gets 4 KiB pages,
     * whose TLB walks and prefetch stops cost memory-bound decoding 10-25% of its speed.
     * tlm_model_memory counts the copy as mapped bytes (the file's image); sources of converted
     * tensors keep their pages. Not with TLM_LOAD_WRITABLE (a copy already). */
    TLM_LOAD_READ = 8
} tlm_load_flags;
/* Opens a model from any supported path (see tlm_model_detect), creating it with the config the
 * file describes; flags are tlm_load_flags or'ed (0: the defaults). By default tensors are used
 * in place from a read-only memory map of the file where they are suitably aligned and laid out
 * as tlm needs them and of a type the kernels take: matrices (and the token embedding) in F32,
 * F16, BF16 or any of the ggml block types, vectors in F32. Loading then takes no time
 * proportional to those tensors and they cost no memory beyond the page cache. The others are
 * converted into memory the model owns (vectors and learned position tables widened to F32,
 * GPT-2's Conv1D weights transposed). Such a model is read-only: tlm_model_params is NULL. */
tlm_status tlm_model_load(const char *path, unsigned flags, tlm_model **out);

/* llama2.c: version 0 = legacy (7 x int32 header, negative vocab = separate classifier; what
 * run.c reads), 1 = "ak42" 256-byte header. Writing needs a Llama-style model (rmsnorm, swiglu,
 * rope theta 10000, eps 1e-5, no bias); half-pairing q/k rows are reordered to adjacent pairs. */
tlm_status tlm_model_load_llama2c(const char *path, tlm_model **out);
tlm_status tlm_model_save_llama2c(const tlm_model *m, const char *path, int version);

/* Hugging Face directory (config.json + model.safetensors, or shards with
 * model.safetensors.index.json) of LlamaForCausalLM, Qwen2ForCausalLM or GPT2LMHeadModel. Export
 * (dtype F32, F16 or BF16) writes LlamaForCausalLM for Llama-style models (q/k rows in HF's half
 * order; Qwen2ForCausalLM with q, k and v biases) and GPT2LMHeadModel for GPT-2-style ones
 * (layernorm with biases, learned positions, gelu); the directory is created. */
tlm_status tlm_model_load_hf(const char *dir, tlm_model **out);
tlm_status tlm_model_save_hf(const tlm_model *m, const char *dir, tlm_dtype dtype);

/* GGUF v3, one file or gguf-split's shards. Reading: arch `llama` or `qwen2`, tensors in F32, F16,
 * BF16 or any of the ggml block types (kept in their type as tlm_model_load says); the vocabulary
 * inside loads with tlm_tokenizer_load(path). Writing (dtype F32, F16 or BF16; quantized files:
 * tlm_model_quantize_gguf): Llama-style models as arch `llama` (`qwen2` with q, k and v biases),
 * loadable by llama.cpp (q/k rows in adjacent-pair order, vectors kept F32), with tok's
 * vocabulary when tok is given. */
tlm_status tlm_model_load_gguf(const char *path, tlm_model **out);
tlm_status tlm_model_save_gguf(const tlm_model *m, const tlm_tokenizer *tok, const char *path,
                               tlm_dtype dtype);

/* ---- safetensors (tlm checkpoints and test fixtures) ----------------------------------------- */

/* Writes every tensor of the model as F32 plus the config under __metadata__ "tlm_config". Writes
 * to a temporary file and renames it into place. */
tlm_status tlm_model_save_safetensors(const tlm_model *m, const char *path);
/* Reads parameters by canonical name into a writable model whose config matches; every schema
 * tensor must be present with the right shape. */
tlm_status tlm_model_read_safetensors(tlm_model *m, const char *path);

/* One tensor as a model file stores it, for `tlm info -m`. */
typedef struct {
    char name[128]; /* the file's own name (llama2.c files have none: canonical names) */
    char dtype[16]; /* "F32", "F16", "BF16", "Q8_0", ... */
    int ndim;
    int64_t shape[4]; /* row-major order, outermost first (GGUF's innermost-first dims reversed) */
} tlm_file_tensor;

/* Lists the tensors stored at a MODEL path (every shard of a directory). *out is malloc'd. */
tlm_status tlm_model_file_tensors(const char *path, tlm_file_tensor **out, int *n);

#ifdef __cplusplus
}
#endif
#endif
