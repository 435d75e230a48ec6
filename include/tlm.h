/* tlm: a decoder-only Transformer language model in C.
 *
 * Public API. Every fallible call returns a tlm_status; on failure a one-line message naming the
 * problem is available from tlm_last_error() (per thread). The library never prints or exits. */
#ifndef TLM_H
#define TLM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TLM_VERSION "0.1.0"

/* ---- errors ------------------------------------------------------------------------------- */

typedef enum {
    TLM_OK = 0,
    TLM_ERR_ARG,         /* invalid argument (shape, range, null) */
    TLM_ERR_CONFIG,      /* impossible or malformed config */
    TLM_ERR_IO,          /* file could not be opened, read or written */
    TLM_ERR_FORMAT,      /* malformed or unsupported file content */
    TLM_ERR_NOMEM,       /* allocation failed */
    TLM_ERR_RANGE,       /* id or index out of range */
    TLM_ERR_UNSUPPORTED, /* valid request that this build does not support */
    TLM_ERR_NUMERIC,     /* NaN or Inf where a finite number was needed */
    TLM_ERR_INTERRUPTED, /* stopped on request (signal, callback) */
} tlm_status;

/* Message of the last failed call on this thread ("" if none). */
const char *tlm_last_error(void);
/* Short name of a status code, e.g. "config error". */
const char *tlm_status_name(tlm_status s);

/* ---- runtime ------------------------------------------------------------------------------ */

/* The instruction sets the kernels use on this CPU, as picked at run time from cpuid and the
 * environment (TLM_ISA, TLM_AMX), e.g. "avx512 vnni bf16 amx-int8 amx-bf16", "avx2" or "ref" (the
 * plain C references). The string stays valid until the calling thread's next call. */
const char *tlm_cpu_kernels(void);

/* Sets the thread count for both OpenMP loops and BLAS; n <= 0 means all cores. Capped at
 * OMP_THREAD_LIMIT. */
void tlm_set_threads(int n);
int tlm_get_threads(void);

/* ---- element types ------------------------------------------------------------------------ */

/* The one element-type enum of the library: weights, files and kernels all use it. F32, F16,
 * BF16 and the ggml block types (Q8_0 ... Q6_K, laid out as in GGUF files: see src/core/quant.h)
 * are weight types; F64 and the integer types appear only in files (safetensors). New values are
 * appended, so the numbers stay stable. */
typedef enum {
    TLM_DTYPE_F32 = 0,
    TLM_DTYPE_F16,
    TLM_DTYPE_BF16,
    TLM_DTYPE_Q8_0,
    TLM_DTYPE_F64,
    TLM_DTYPE_I64,
    TLM_DTYPE_I32,
    TLM_DTYPE_I16,
    TLM_DTYPE_I8,
    TLM_DTYPE_U8,
    TLM_DTYPE_BOOL,
    TLM_DTYPE_Q4_0,
    TLM_DTYPE_Q4_1,
    TLM_DTYPE_Q5_0,
    TLM_DTYPE_Q5_1,
    TLM_DTYPE_Q4_K,
    TLM_DTYPE_Q5_K,
    TLM_DTYPE_Q6_K,
    TLM_DTYPE_Q2_K,
    TLM_DTYPE_Q3_K,
    TLM_DTYPE_IQ4_NL,
    TLM_DTYPE_IQ4_XS,
    TLM_DTYPE_COUNT
} tlm_dtype;

/* "F32", "F16", "BF16", "Q8_0", ... ("?" outside the enum). */
const char *tlm_dtype_name(tlm_dtype t);

/* ---- config ------------------------------------------------------------------------------- */

typedef enum { TLM_NORM_RMSNORM = 0, TLM_NORM_LAYERNORM } tlm_norm_kind;
typedef enum { TLM_NORM_PRE = 0, TLM_NORM_POST } tlm_norm_position;
typedef enum { TLM_FFN_SWIGLU = 0, TLM_FFN_GELU, TLM_FFN_GELU_TANH, TLM_FFN_RELU } tlm_ffn_kind;
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
 * value may make a size computation wrap or make tlm_model_create allocate absurd fixed tables.
 * Each limit admits every published model we know of (Llama 3 405B: vocab 128256, d_model 16384,
 * 126 layers, 128 heads, d_ff 53248; million-token contexts at head dim 128). */
#define TLM_MAX_VOCAB_SIZE (1 << 24)
#define TLM_MAX_CONTEXT_LENGTH (1 << 24)
#define TLM_MAX_D_MODEL (1 << 16)
#define TLM_MAX_N_LAYERS (1 << 12)
#define TLM_MAX_N_HEADS (1 << 12)
#define TLM_MAX_D_FF (1 << 20)
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
    int d_ff; /* 1 .. TLM_MAX_D_FF; 0 = derived: swiglu 8/3*d rounded up to 64, else 4*d */
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
} tlm_config;

/* The modern defaults (pre-norm, rmsnorm, swiglu, rope, tied, no bias) with a small size. */
void tlm_config_default(tlm_config *c);
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

/* ---- tensor schema ------------------------------------------------------------------------ */

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
    int ndim;                /* 1 or 2 */
    int64_t shape[2];        /* PyTorch order: [out, in] for matrices */
    size_t offset;           /* in floats, into the flat parameter buffer */
    size_t numel;
    int layer; /* block index, -1 outside blocks */
    tlm_component component;
    int decay;     /* AdamW weight decay applies (matrices, embeddings) */
    int embedding; /* excluded from the non-embedding count */
} tlm_tensor_info;

/* Enumerates every tensor of a (finalized) config. Writes up to cap entries into out (may be NULL)
 * and returns the total number of tensors; *n_params receives the total float count. */
int tlm_schema(const tlm_config *c, tlm_tensor_info *out, int cap, size_t *n_params);
const char *tlm_component_name(tlm_component k);

typedef struct {
    size_t total;
    size_t non_embedding;
    size_t per_component[TLM_COMP_COUNT];
} tlm_param_count;

void tlm_count_params(const tlm_config *c, tlm_param_count *out);

/* ---- model -------------------------------------------------------------------------------- */

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
 * take in the file's own type), or into memory the model owns (tensors widened at load). */
typedef struct {
    tlm_dtype dtype;
    const void *data;
    int64_t rows, cols;
    size_t row_bytes;
} tlm_weight;

/* Creates a writable model with zeroed parameters in one flat F32 buffer (the schema's offsets;
 * gradients and AdamW moments use the same layout). The config is finalized (copied). */
tlm_status tlm_model_create(const tlm_config *c, tlm_model **out);
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
/* Bytes of weights the model maps from files and bytes it owns (flat buffer, widened copies,
 * tables, and the repacked copies of block-type weights that prompts of more than 8 tokens made,
 * about 1.25 bytes per weight). */
void tlm_model_memory(const tlm_model *m, size_t *mapped, size_t *owned);
/* Needs a writable model. */
tlm_status tlm_model_init(tlm_model *m, uint64_t seed, tlm_init_scheme scheme);

/* ---- batched passes and gradients --------------------------------------------------------- */

/* The working state of full-sequence passes over a model: the activation arena, gradient scratch,
 * dropout state and data-parallel replicas. One per caller (thread); many may share a model. The
 * model must outlive it. */
typedef struct tlm_train_ctx tlm_train_ctx;

tlm_status tlm_train_ctx_new(const tlm_model *m, tlm_train_ctx **out);
void tlm_train_ctx_free(tlm_train_ctx *x);
const tlm_model *tlm_train_ctx_model(const tlm_train_ctx *x);
/* Reserves the activation arena for batches up to B x T so that later passes of that size never
 * allocate. Called implicitly by the passes when needed. */
tlm_status tlm_train_ctx_reserve(tlm_train_ctx *x, int B, int T);
/* Dropout masks of the next training passes derive from (seed, step); the trainer sets them every
 * step so that a resumed run draws the same masks. */
void tlm_train_ctx_set_dropout_seed(tlm_train_ctx *x, uint64_t seed, uint64_t step);
/* How passes over a batch use several threads: 1 splits the batch across threads, each running
 * a replica (its own activations, the shared model) single-threaded (best for small layers); 0
 * puts every thread on each operation; -1 (default) picks by model size. Results differ only by
 * float summation order. */
void tlm_train_ctx_set_data_parallel(tlm_train_ctx *x, int mode);

/* The arithmetic of the matrix products of batched passes (forward, backward, evaluation). BF16:
 * both operands rounded to bfloat16, products accumulated in fp32 (mixed precision, like PyTorch's
 * autocast to bfloat16); weights, gradients, the optimizer, norms, softmax and the loss stay fp32.
 * Needs a CPU with AVX-512 BF16 (tlm_bf16_supported). */
typedef enum { TLM_PRECISION_FP32 = 0, TLM_PRECISION_BF16 } tlm_precision;
/* 1 if this CPU runs bf16 dot products (avx512_bf16), else 0. */
int tlm_bf16_supported(void);
/* "fp32" / "bf16" <-> tlm_precision; the parser returns TLM_ERR_ARG for other names. */
const char *tlm_precision_name(tlm_precision p);
tlm_status tlm_precision_parse(const char *name, tlm_precision *out);
/* TLM_ERR_UNSUPPORTED for BF16 on a CPU without avx512_bf16. Results are bit-reproducible for a
 * given precision and thread count. */
tlm_status tlm_train_ctx_set_precision(tlm_train_ctx *x, tlm_precision p);
tlm_precision tlm_train_ctx_precision(const tlm_train_ctx *x);

typedef struct {
    const int32_t *targets; /* [B*T] or NULL; negative targets are ignored in the loss */
    int pos_offset;         /* position of the first token (KV cache continuation) */
    int want_probs;         /* also compute softmax probabilities */
} tlm_forward_opts;

/* Every field 0: no targets, position 0, no probabilities. */
void tlm_forward_opts_defaults(tlm_forward_opts *o);

typedef struct {
    const float *logits; /* [B, T, V], owned by the context, valid until its next pass */
    const float *probs;  /* [B, T, V] if want_probs, else NULL */
    float loss;          /* mean cross-entropy over counted targets, or NAN without targets */
} tlm_forward_out;

/* Forward pass over ids [B, T] (row-major). opts may be NULL. */
tlm_status tlm_forward(tlm_train_ctx *x, const int32_t *ids, int B, int T,
                       const tlm_forward_opts *opts, tlm_forward_out *out);

/* Training step core: forward over ids [B, T] at positions pos0.., mean cross-entropy against
 * targets (negative = ignored) into *loss, and the gradient of that loss for every parameter into
 * grads (the flat layout, tlm_model_num_params floats; written over unless accumulate, which adds
 * to it). Needs every weight in F32 (any model tlm_model_create makes or TLM_LOAD_WRITABLE
 * loads). */
tlm_status tlm_forward_backward(tlm_train_ctx *x, const int32_t *ids, const int32_t *targets, int B,
                                int T, int pos0, float *grads, int accumulate, float *loss);

/* ---- training ---------------------------------------------------------------------------- */

/* Doubles, like the Python scalars PyTorch computes its step with. */
typedef struct {
    double beta1, beta2, eps, weight_decay;
} tlm_adamw_opts;

/* AdamW state over a range [begin, begin + n) of the flat parameter layout (the whole buffer,
 * or one process's shard): first and second moments for that range, and the step count. */
typedef struct tlm_adamw tlm_adamw;

/* beta1 0.9, beta2 0.95, eps 1e-8, weight decay 0.1. */
void tlm_adamw_defaults(tlm_adamw_opts *h);
/* Moments for the whole flat buffer. */
tlm_status tlm_adamw_create(const tlm_model *m, tlm_adamw **out);
/* Moments for params [begin, end) only (end <= tlm_model_num_params). */
tlm_status tlm_adamw_create_range(const tlm_model *m, size_t begin, size_t end, tlm_adamw **out);
void tlm_adamw_free(tlm_adamw *o);
/* The range of the flat layout the optimizer updates: params [*begin, *begin + *n). */
void tlm_adamw_range(const tlm_adamw *o, size_t *begin, size_t *n);
/* The first and second moments of the range (n floats each, owned by the optimizer), to save or
 * restore them. */
void tlm_adamw_moments(tlm_adamw *o, float **m, float **v);
/* Steps taken (the bias corrections' t); set it when restoring saved moments. */
long tlm_adamw_steps(const tlm_adamw *o);
void tlm_adamw_set_steps(tlm_adamw *o, long steps);
/* One AdamW step over the optimizer's range with torch.optim.AdamW's semantics (bias correction,
 * decoupled decay lr*wd*p); decay applies only to tensors whose schema entry says so (matrices,
 * embeddings). m must be writable; grads has the flat layout (only the range is read). */
tlm_status tlm_adamw_step(tlm_adamw *o, tlm_model *m, const float *grads, double lr,
                          const tlm_adamw_opts *h);
/* The same step on grads * grad_scale, without writing the scaled gradient: clipping folded
 * into the update (pass tlm_clip_coef) saves a pass over the gradient and gives the same bits. */
tlm_status tlm_adamw_step_scaled(tlm_adamw *o, tlm_model *m, const float *grads, float grad_scale,
                                 double lr, const tlm_adamw_opts *h);

/* Linear warmup to max_lr over `warmup` steps, cosine decay to min_lr at the last step
 * (total_steps - 1), min_lr after. Steps count from 0. */
typedef struct {
    double max_lr, min_lr;
    long warmup, total_steps;
} tlm_schedule;
double tlm_lr_at(const tlm_schedule *s, long step);

/* Global L2 norm of the gradient. */
double tlm_grad_norm(const float *grads, size_t n);
/* Sum of squares of n gradient values, in a fixed order (the same bits for any thread count):
 * tlm_grad_norm(g, n) == sqrt(tlm_grad_sumsq(g, n)). Shards sum their ranges' parts. */
double tlm_grad_sumsq(const float *grads, size_t n);
/* torch.nn.utils.clip_grad_norm_: scales by max_norm / (norm + 1e-6) when that is below 1;
 * returns the norm before clipping. max_norm <= 0 only measures. */
double tlm_clip_grad_norm(float *grads, size_t n, double max_norm);
/* The factor tlm_clip_grad_norm scales by for a given norm (1 when no clipping applies). */
float tlm_clip_coef(double norm, double max_norm);

/* Token files (tokenized once, memory-mapped while training). */
typedef struct tlm_dataset tlm_dataset;
typedef enum { TLM_SPLIT_TRAIN = 0, TLM_SPLIT_VAL = 1 } tlm_split;
/* Writes ids atomically as uint16 when vocab_size <= 65536, else uint32, after a small header. */
tlm_status tlm_tokens_write(const char *path, const int32_t *ids, size_t n, int32_t vocab_size);
/* Maps a token file; the last val_fraction of the tokens is the validation split. */
tlm_status tlm_dataset_open(const char *path, double val_fraction, tlm_dataset **out);
/* Maps token files (tlm token files, or llm.c shards: a header of 256 int32 with magic 20240520,
 * version 1 and the token count, then uint16 tokens) as one stream of training tokens, windows
 * crossing from one file into the next like documents in one file. Validation is the val files
 * when n_val > 0, else the last val_fraction of the stream. Malformed files are refused by name.
 * tlm_dataset_vocab_size is 0 when no file names its vocabulary (llm.c shards). */
tlm_status tlm_dataset_open_files(const char *const *train, int n_train, const char *const *val,
                                  int n_val, double val_fraction, tlm_dataset **out);
void tlm_dataset_free(tlm_dataset *d);
size_t tlm_dataset_size(const tlm_dataset *d, tlm_split split);
int32_t tlm_dataset_vocab_size(const tlm_dataset *d);

/* Start of window `index` of the windows of T + 1 tokens of a split that the stream `stream`
 * (e.g. a training step) of the run seeded `seed` draws: a hash of (seed, stream, index). */
size_t tlm_dataset_window(const tlm_dataset *d, tlm_split split, uint64_t seed, uint64_t stream,
                          uint64_t index, int T);

/* Mean loss over `batches` fixed random windows (B x T) of a split; NAN if it cannot be computed.
 */
double tlm_evaluate(tlm_train_ctx *x, const tlm_dataset *d, tlm_split split, int B, int T,
                    int batches, uint64_t seed);

typedef struct {
    long step, total; /* steps completed, steps in the run */
    float train_loss; /* of this step's batch */
    float val_loss;   /* NAN unless evaluated at this step */
    double lr, grad_norm, tokens_per_s, elapsed_s;
    long steps_this_run; /* since start or resume */
} tlm_train_progress;

/* The seam of a training step between the backward pass and the optimizer, where training over
 * several processes plugs in. Every hook may be NULL; each returns TLM_OK or stops the run with its
 * status. */
typedef struct {
    /* After the backward pass: grads (the flat layout, n floats) hold this process's gradient of
     * its batch's mean loss, *loss that loss. Reduce them across processes here (at least over
     * the optimizer's range [begin, end)), and make *loss the global mean. */
    tlm_status (*reduce_grads)(void *user, float *grads, size_t n, float *loss);
    /* *sumsq holds the sum of squares of the gradient over [begin, end): make it the sum over
     * every process's range, so clipping uses the global norm. */
    tlm_status (*reduce_sumsq)(void *user, double *sumsq);
    /* After AdamW updated params [begin, end): gather the other processes' ranges. */
    tlm_status (*after_update)(void *user, float *params, size_t n);
    void *user;
    /* The range of the flat buffer this process's optimizer updates and keeps moments for;
     * end 0: the whole buffer. */
    size_t begin, end;
    /* This process's place among `world` processes (world 0 or 1: alone). Rank r of N trains on
     * its N-th of every step's windows; only rank 0 writes logs, the curve and checkpoints. */
    int rank, world;
    /* Sums n doubles element-wise across processes, the result on every process (evaluation
     * losses, the stop request, a save's outcome). Needed when world > 1. */
    tlm_status (*reduce_sum)(void *user, double *vals, int n);
    /* Gathers every process's optimizer range [begin, begin + n) of a vector of `total` floats
     * into whole on rank 0 (whole is NULL on the others). Needed to save a checkpoint when the
     * range is not the whole buffer. */
    tlm_status (*gather)(void *user, const float *part, size_t begin, size_t n, float *whole,
                         size_t total);
} tlm_train_hooks;

typedef struct {
    const char *out_dir; /* checkpoint.safetensors, model.safetensors, log.jsonl, loss.svg */
    long steps;
    int batch;      /* sequences per optimizer step, over all processes and micro-steps */
    int grad_accum; /* micro-steps per optimizer step (0 or 1: one); divides batch / world */
    int seq_len;    /* 0: context_length */
    double lr, min_lr;
    long warmup;
    tlm_adamw_opts adam;
    double clip; /* <= 0: no clipping */
    long eval_interval;
    int eval_batches;
    long log_interval;
    long checkpoint_interval; /* 0: at evaluations and at the end */
    uint64_t seed;
    int resume;              /* continue from out_dir/checkpoint.safetensors */
    tlm_precision precision; /* of the matrix products (default fp32); checkpoints are the same */
    /* Called after every step; returning non-zero stops (after saving a checkpoint). */
    int (*on_progress)(void *user, const tlm_train_progress *p);
    void *user;
    volatile int *stop; /* checked after every step (e.g. set by a SIGINT handler) */
    tlm_train_hooks hooks;
} tlm_train_opts;

void tlm_train_defaults(tlm_train_opts *o);
/* Trains m (writable) on d: a loop of the steps below with evaluation, logs and checkpoints. A
 * non-finite loss stops with TLM_ERR_NUMERIC, keeping the last checkpoint; a stop request saves
 * and returns TLM_ERR_INTERRUPTED. */
tlm_status tlm_train_run(tlm_model *m, const tlm_dataset *d, const tlm_train_opts *o);

/* One training run's state: the model it updates, a batch context, the gradient buffer, AdamW
 * over the hooks' range, the data order and the step count. tlm_train_run is
 *   tlm_trainer_backward -> hooks.reduce_grads -> tlm_trainer_clip -> tlm_trainer_update
 * per step, plus evaluation, logging and checkpoints. */
typedef struct tlm_trainer tlm_trainer;
/* With o->resume, continues from o->out_dir/checkpoint.safetensors (model and optimizer). */
tlm_status tlm_trainer_new(tlm_model *m, const tlm_dataset *d, const tlm_train_opts *o,
                           tlm_trainer **out);
void tlm_trainer_free(tlm_trainer *t);
long tlm_trainer_step(const tlm_trainer *t); /* steps completed */
tlm_train_ctx *tlm_trainer_ctx(tlm_trainer *t);
/* The gradient buffer (flat layout, tlm_model_num_params floats). */
float *tlm_trainer_grads(tlm_trainer *t);
/* This process's part of the step's batch through forward and backward into the gradient buffer,
 * in grad_accum micro-steps; *loss receives its mean loss. The windows of a step are a function of
 * (seed, step) alone (tlm_dataset_window), divided over the processes and micro-steps, so a resumed
 * run, or one split differently, sees the same data. */
tlm_status tlm_trainer_backward(tlm_trainer *t, float *loss);
/* The gradient's global norm over the optimizer's range (hooks.reduce_sumsq makes it global) and
 * the factor clipping scales it by. TLM_ERR_NUMERIC for a non-finite norm. */
tlm_status tlm_trainer_clip(tlm_trainer *t, double *norm, float *scale);
/* AdamW over the range with the gradient times scale at the schedule's learning rate (returned in
 * *lr), then hooks.after_update; counts the step. */
tlm_status tlm_trainer_update(tlm_trainer *t, float scale, double *lr);
/* Writes the checkpoint (model, optimizer, data order) and model.safetensors into out_dir. */
tlm_status tlm_trainer_save(tlm_trainer *t);

/* ---- safetensors (tlm checkpoints and test fixtures) --------------------------------------- */

/* Writes every tensor of the model as F32 plus the config under __metadata__ "tlm_config". Writes
 * to a temporary file and renames it into place. */
tlm_status tlm_model_save_safetensors(const tlm_model *m, const char *path);
/* Loads parameters by canonical name into a model whose config matches; every schema tensor must
 * be present with the right shape. */
tlm_status tlm_model_load_safetensors(tlm_model *m, const char *path);

/* ---- formats ------------------------------------------------------------------------------ */

/* Real model files: llama2.c .bin (legacy and version 1), GGUF v3 (arch llama), Hugging Face
 * directories (config.json + *.safetensors: LlamaForCausalLM, GPT2LMHeadModel) and tlm's own
 * checkpoints. Every reader validates the file against its length before touching memory. */

typedef struct tlm_tokenizer tlm_tokenizer;

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

/* Opens a model from any supported path (see tlm_model_detect), creating it with the config the
 * file describes. Tensors stored in a type the kernels take (F32), suitably aligned and laid out
 * as tlm needs them, are used in place from a read-only memory map of the file: loading takes no
 * time proportional to the model and the weights cost no memory beyond the page cache. Others are
 * converted into memory the model owns (F16, BF16, Q8_0 are widened to F32; GPT-2's transposed
 * Conv1D weights are transposed). Such a model is read-only: tlm_model_params is NULL. */
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
/* flags: TLM_LOAD_* or'ed, 0 for the defaults. */
tlm_status tlm_model_load(const char *path, unsigned flags, tlm_model **out);

/* llama2.c: version 0 = legacy (7 x int32 header, negative vocab = separate classifier; what
 * run.c reads), 1 = "ak42" 256-byte header. Writing needs a Llama-style model (rmsnorm, swiglu,
 * rope theta 10000, eps 1e-5, no bias); half-pairing q/k rows are reordered to adjacent pairs. */
tlm_status tlm_model_load_llama2c(const char *path, tlm_model **out);
tlm_status tlm_model_save_llama2c(const tlm_model *m, const char *path, int version);

/* Hugging Face directory (config.json + model.safetensors, or shards with
 * model.safetensors.index.json) of LlamaForCausalLM or GPT2LMHeadModel. Export writes
 * LlamaForCausalLM for Llama-style models (q/k rows in HF's half order) and GPT2LMHeadModel for
 * GPT-2-style ones (layernorm with biases, learned positions, gelu); the directory is created. */
tlm_status tlm_model_load_hf(const char *dir, tlm_model **out);
tlm_status tlm_model_save_hf(const tlm_model *m, const char *dir, tlm_dtype dtype);

/* GGUF v3. Reading: arch `llama` (F32, F16, BF16, Q8_0 tensors); the vocabulary inside loads with
 * tlm_tokenizer_load(path). Writing: Llama-style models as arch `llama`, loadable by llama.cpp
 * (q/k rows in adjacent-pair order, vectors kept F32), with tok's vocabulary when tok is given. */
tlm_status tlm_model_load_gguf(const char *path, tlm_model **out);
tlm_status tlm_model_save_gguf(const tlm_model *m, const tlm_tokenizer *tok, const char *path,
                               tlm_dtype dtype);

/* Quantized GGUF, as llama.cpp's llama-quantize writes it (with or without an importance matrix
 * and its per-tensor overrides, tlm_quantize_opts): the same
 * type for each tensor (the _M and _L mixes and Q2_K give some attn_v, attn_output and ffn_down
 * layers and output.weight more bits; 1-D tensors stay F32; rows that are not whole blocks fall
 * back to Q4_0, Q5_0, Q5_1, Q8_0 or F16)
 * and the same bytes (ggml's reference quantizers; tensors in llama.cpp's order). The values are
 * llama.cpp's general.file_type. */
typedef enum {
    TLM_FTYPE_F32 = 0,
    TLM_FTYPE_F16 = 1,
    TLM_FTYPE_Q4_0 = 2,
    TLM_FTYPE_Q4_1 = 3,
    TLM_FTYPE_Q8_0 = 7,
    TLM_FTYPE_Q5_0 = 8,
    TLM_FTYPE_Q5_1 = 9,
    TLM_FTYPE_Q2_K = 10,
    TLM_FTYPE_Q3_K_S = 11,
    TLM_FTYPE_Q3_K_M = 12,
    TLM_FTYPE_Q3_K_L = 13,
    TLM_FTYPE_Q4_K_S = 14,
    TLM_FTYPE_Q4_K_M = 15,
    TLM_FTYPE_Q5_K_S = 16,
    TLM_FTYPE_Q5_K_M = 17,
    TLM_FTYPE_Q6_K = 18,
    TLM_FTYPE_IQ4_NL = 25,
    TLM_FTYPE_IQ4_XS = 30,
    TLM_FTYPE_BF16 = 32
} tlm_ftype;

/* "q4_k_m", "Q8_0", "f16", ... (case-insensitive); TLM_ERR_ARG for other names. */
tlm_status tlm_ftype_parse(const char *name, tlm_ftype *out);
/* Lower-case name, "?" for a value outside the enum. */
const char *tlm_ftype_name(tlm_ftype f);

/* An importance matrix, as llama.cpp's llama-imatrix writes it (GGUF, or the legacy .dat
 * layout) and llama-quantize --imatrix reads it: per weight tensor, the mean squared activation
 * that met each input column over a calibration text. With one, the quantizers weigh each
 * column's error by it (ggml's quantize_*_impl), as llama-quantize does. */
typedef struct tlm_imatrix tlm_imatrix;
/* Non-finite values, missing metadata (GGUF: imatrix.datasets, imatrix.chunk_count and
 * imatrix.chunk_size, as llama-quantize requires) and malformed files are refused. */
tlm_status tlm_imatrix_load(const char *path, tlm_imatrix **out);
void tlm_imatrix_free(tlm_imatrix *im);
/* The weights for a weight tensor's name ("blk.0.attn_q.weight"), *n of them (columns times
 * experts); NULL where the matrix has no entry. */
const float *tlm_imatrix_find(const tlm_imatrix *im, const char *name, size_t *n);
int tlm_imatrix_entries(const tlm_imatrix *im);
int tlm_imatrix_chunks(const tlm_imatrix *im);
const char *tlm_imatrix_dataset(const tlm_imatrix *im); /* the first dataset named, or NULL */
const char *tlm_imatrix_path(const tlm_imatrix *im);    /* as given to tlm_imatrix_load */
/* Collecting one (tlm imatrix): an empty matrix; `tokens` rows' squared activations summed per
 * column (n of them) added to entry `name`; written as llama-imatrix writes GGUF (its keys,
 * tensors <name>.in_sum2 and <name>.counts sorted by name), which llama-quantize reads. */
tlm_status tlm_imatrix_new(tlm_imatrix **out);
tlm_status tlm_imatrix_accumulate(tlm_imatrix *im, const char *name, const float *sum2, size_t n,
                                  int64_t tokens);
tlm_status tlm_imatrix_save(const tlm_imatrix *im, const char *path, const char *dataset,
                            int chunks, int chunk_size);
/* Adds src's sums and counts to dst (llama-imatrix --in-file): GGUF matrices as they are, legacy
 * ones (means times a call count) times chunk_size; src's datasets are appended to dst's. */
tlm_status tlm_imatrix_merge(tlm_imatrix *dst, const tlm_imatrix *src, int chunk_size);
/* The most tokens any entry counts (chunks = this / the chunk size). */
int64_t tlm_imatrix_tokens(const tlm_imatrix *im);
/* llama-imatrix --output-format dat: the legacy layout (per entry the mean times the call count
 * rounded up, then the chunk count and a dataset name: dataset, else the last one merged). */
tlm_status tlm_imatrix_save_legacy(const tlm_imatrix *im, const char *path, const char *dataset,
                                   int chunks, int chunk_size);
/* rows activation rows (cols values each, ld apart) into entry name: each squared and summed
 * into it row by row, as llama-imatrix sums a product's rows; rows tokens counted. */
tlm_status tlm_imatrix_add_rows(tlm_imatrix *im, const char *name, const float *x, size_t rows,
                                size_t cols, size_t ld);
/* One batched forward pass of B sequences of T ids (positions from 0) through ctx's model, every
 * matrix input of its blocks added to im under the weight's name (blk.L.attn_q.weight, ...: the
 * q, k and v products share theirs, as gate and up do), and output.weight's too when `output`
 * (llama-imatrix --process-output; a tied embedding has none). *logits (may be NULL) receives the
 * pass's [B, T, V] logits, the context's until its next pass. tlm imatrix runs the chunks of a
 * text through this. */
tlm_status tlm_imatrix_collect(tlm_imatrix *im, tlm_train_ctx *ctx, const int32_t *ids, int B,
                               int T, int output, const float **logits);

/* llama-imatrix --show-statistics for one tensor of a matrix: over its mean squared activations
 * (sums / token counts) their sum, min, max, mean, standard deviation, the share above 1e-5
 * (active), the entropy of their distribution (bits; entropy_norm: percent of log2 of their
 * number), the share more than one deviation above the mean (zd), and the cosine similarity of
 * its raw sums with the same tensor's one layer down (0 where there is none). */
typedef struct {
    char name[128];  /* blk.3.attn_q.weight */
    char layer[16];  /* "3", or "-" outside the blocks */
    char tensor[64]; /* attn_q */
    int elements;
    float sum, min, max, mean, stddev, active, entropy, entropy_norm, zd, cossim;
} tlm_imatrix_stat;
/* One per entry with tokens, sorted as llama-imatrix lists them (by tensor, then by sum, the
 * largest first); every float figure computed in its order of float operations. A legacy matrix's
 * values are taken as llama-imatrix reads them for chunks of chunk_size tokens. *out is malloc'd.
 */
tlm_status tlm_imatrix_statistics(const tlm_imatrix *im, int chunk_size, tlm_imatrix_stat **out,
                                  int *n);

/* Keeps only the entries whose name contains one of names[0..n) (keep != 0), or drops those
 * (keep == 0): llama-quantize's --include-weights / --exclude-weights. Matrices without an entry
 * are quantized without one; a matrix left with no entries counts as none. */
void tlm_imatrix_filter(tlm_imatrix *im, const char *const *names, int n, int keep);

/* A metadata override for tlm_quantize_opts.kv_overrides (llama-quantize --override-kv
 * KEY=TYPE:VALUE). */
typedef enum { TLM_KV_INT, TLM_KV_FLOAT, TLM_KV_BOOL, TLM_KV_STR } tlm_kv_type;
typedef struct tlm_kv_override {
    char key[128];
    tlm_kv_type type;
    int64_t i; /* TLM_KV_INT */
    double f;  /* TLM_KV_FLOAT */
    int b;     /* TLM_KV_BOOL */
    char str[128];
} tlm_kv_override;
/* "KEY=TYPE:VALUE", TYPE int, float, bool (true or false) or str, as llama.cpp parses it: a key
 * of 1 to 127 bytes, a string of at most 127; numbers must be whole. */
tlm_status tlm_kv_override_parse(const char *spec, tlm_kv_override *out);

/* A per-tensor type for tlm_quantize_opts.tensor_types: "attn_v", "blk\\.[0-3]\\.ffn_down" ... */
typedef struct tlm_tensor_type {
    const char *pattern;
    tlm_dtype type;
} tlm_tensor_type;

typedef struct {
    tlm_ftype ftype;
    /* With an importance matrix (may be NULL): each matrix it has an entry for is quantized with
     * its weights, the type choices that llama.cpp makes with one apply (Q4_0 and Q5_0 files: the
     * first eighth of the ffn_down layers Q4_1 / Q5_1; IQ4_NL and IQ4_XS: those layers keep the
     * base type), and the file records it as llama-quantize does (quantize.imatrix.*). An entry
     * whose size is not the matrix's columns is an error (the token embedding's is ignored). */
    const tlm_imatrix *imatrix;
    /* Called before each tensor is written (i of n, in file order) with its type and size; may be
     * NULL. Runs on the calling thread. */
    void (*progress)(void *user, int i, int n, const char *name, tlm_dtype type, size_t bytes);
    void *user;
    /* llama-quantize's overrides; zeroed options leave each off. pure (--pure): every matrix the
     * base type, no mix (rows that are not whole blocks still fall back). leave_output
     * (--leave-output-tensor): output.weight stays F32. output_type / embd_type, where their
     * _set flag is on (--output-tensor-type, --token-embedding-type): output.weight's and
     * token_embd.weight's type, taken as given (a tied embedding follows output_type under the
     * mix unless embd_type is set). tensor_types (--tensor-type; n_tensor_types of them): the
     * first whose POSIX extended regular expression matches a matrix's name (anywhere in it)
     * gives its type in place of the mix's (then the fallbacks). Types: F32, F16, BF16 and the
     * block types. */
    int pure, leave_output;
    int output_type_set, embd_type_set;
    tlm_dtype output_type, embd_type;
    const struct tlm_tensor_type *tensor_types;
    int n_tensor_types;
    /* --dry-run: every tensor's type and size through progress, nothing written */
    int dry_run;
    /* --override-kv: each key removed where it was and written after general.file_type, in
     * order (before the importance matrix's keys), as llama-quantize sets them: ints as U32 of
     * their magnitude, floats as F32. general.alignment cannot be overridden (it would move the
     * data). Only the file's metadata changes; the weights and their types do not. */
    const tlm_kv_override *kv_overrides;
    int n_kv_overrides;
    /* --prune-layers: these blocks are left out and the rest renumbered from 0 in order
     * (llama.block_count follows); the mixes count the attn_v tensors left but keep the
     * model's layer count for ffn_down, as llama-quantize does. Each must be a layer of m. */
    const int *prune_layers;
    int n_prune_layers;
} tlm_quantize_opts;

/* Q8_0, no importance matrix, no progress callback, none of the overrides. */
void tlm_quantize_opts_defaults(tlm_quantize_opts *o);

/* Writes m (F32 weights: load with TLM_LOAD_WRITABLE) as a GGUF of file type o->ftype to path
 * (a temporary file renamed into place), with tok's vocabulary when tok is given. */
tlm_status tlm_model_quantize_gguf(const tlm_model *m, const tlm_tokenizer *tok, const char *path,
                                   const tlm_quantize_opts *o);

/* One tensor as a model file stores it, for `tlm info -m`. */
typedef struct {
    char name[128]; /* the file's own name (llama2.c files have none: canonical names) */
    char dtype[16]; /* "F32", "F16", "BF16", "Q8_0", ... */
    int ndim;
    int64_t shape[4]; /* row-major order, outermost first (GGUF's innermost-first dims reversed) */
} tlm_file_tensor;

/* Lists the tensors stored at a MODEL path (every shard of a directory). *out is malloc'd. */
tlm_status tlm_model_file_tensors(const char *path, tlm_file_tensor **out, int *n);

/* ---- generation --------------------------------------------------------------------------- */

/* A session holds the KV cache of `batch` independent sequences over one model (which must outlive
 * it and may be shared by several sessions). Each layer caches n_kv_heads keys and values per
 * position, after RoPE, so cached keys are never rotated again. Prompts are prefilled in one
 * batched pass (sgemm); each later token goes through a matrix-vector path that streams the
 * weights once per step. Nothing is allocated per decode step. The cache holds at most
 * `capacity` positions (<= context_length); there is no sliding window: a sequence that is full
 * refuses more tokens with TLM_ERR_RANGE. */
typedef struct tlm_session tlm_session;

typedef struct {
    int batch;    /* independent sequences (>= 1) */
    int capacity; /* positions per sequence; <= 0: context_length */
    /* The type of cached keys and values: TLM_DTYPE_F32 (0) or any of llama.cpp's cache types,
     * F16, BF16, Q8_0, Q5_1, Q5_0, IQ4_NL, Q4_1, Q4_0 (other types: TLM_ERR_ARG). F16: rounded to
     * IEEE half precision as they are cached (llama.cpp's default cache type), for half the memory
     * and half the traffic of attention over long contexts; logits then move by about 1e-4 to
     * 4e-4 of their largest magnitude against the F32 cache's. The block types quantize each
     * head's row of a position in GGUF blocks of 32, as llama.cpp's CPU backend stores them: Q8_0
     * takes 34 bytes per 32 values (53% of F16), logits moving by about 2e-3 to 7e-3; Q4_0 18
     * bytes (28%), about 2e-2 to 1e-1 (tests/test_generate.c, random models). The block types
     * need a head size that is a multiple of 32 (TLM_ERR_ARG otherwise). */
    tlm_dtype kv_type;
    /* Values in a type of their own (llama.cpp's -ctv apart from -ctk: keys in kv_type), where
     * v_type_set is nonzero: v_type, any of kv_type's. Otherwise kv_type for both. */
    int v_type_set;
    tlm_dtype v_type;
} tlm_session_opts;

/* batch 1, capacity 0 (context_length), F32 keys and values. */
void tlm_session_opts_defaults(tlm_session_opts *o);
/* A session over m with options o (NULL: the defaults). */
tlm_status tlm_session_new(const tlm_model *m, const tlm_session_opts *o, tlm_session **out);
void tlm_session_free(tlm_session *s);
/* Faults in the KV cache's memory now. It is mapped lazily, so otherwise the first tokens of each
 * sequence pay for the kernel zeroing its pages (a large batch's cache is GiBs): a server calls
 * this at start-up so that no request waits on it in the middle of a decode step. */
void tlm_session_prefault(tlm_session *s);
/* Empties sequence seq's cache (seq < 0: every sequence). */
void tlm_session_reset(tlm_session *s, int seq);
int tlm_session_batch(const tlm_session *s);
/* The cache's type for keys (kv_type) and for values (v_type, or kv_type). */
tlm_dtype tlm_session_kv_type(const tlm_session *s);
tlm_dtype tlm_session_v_type(const tlm_session *s);
int tlm_session_capacity(const tlm_session *s);
/* Positions cached so far for sequence seq (its next token's position). */
int tlm_session_length(const tlm_session *s, int seq);
/* Keeps only the first n cached positions of sequence seq (no-op when it holds n or fewer): the
 * next token goes to position n. Prefix reuse: a prompt sharing n tokens with what a sequence
 * holds continues from there instead of prefilling them again. */
tlm_status tlm_session_truncate(tlm_session *s, int seq, int n);
/* Saving a sequence's cached prefix outside the session, to load it later into any sequence of a
 * session of the same model (a server's prompt cache: a slot taken over by another request keeps
 * its keys and values in memory for a later request that starts the same way). The saved form
 * is the model's n_layers x 2 x n_kv_heads blocks of n positions x head_dim elements of the
 * session's cache types: load it only into a session with the same kv_type and v_type. */
size_t tlm_session_prefix_bytes(const tlm_session *s, int n);
/* Copies positions 0..n-1 of sequence seq (n <= its length) into buf of
 * tlm_session_prefix_bytes(s, n) bytes. */
tlm_status tlm_session_save_prefix(const tlm_session *s, int seq, int n, void *buf);
/* Loads the first n positions of a prefix of n_saved positions saved by tlm_session_save_prefix
 * into sequence seq (n <= n_saved, n <= capacity), which then holds exactly those n. */
tlm_status tlm_session_load_prefix(tlm_session *s, int seq, const void *buf, int n_saved, int n);

/* Appends n tokens to sequence seq in one batched pass. logits (may be NULL) receives [n, V]
 * logits when all_rows, else only the last token's [V]. */
tlm_status tlm_prefill(tlm_session *s, int seq, const int32_t *ids, int n, float *logits,
                       int all_rows);
/* Appends one token to each sequence b with active[b] != 0 (active NULL: all of them) in one step;
 * logits [batch, V] receives the rows of the active sequences (others are left untouched). */
tlm_status tlm_decode(tlm_session *s, const int32_t *ids, const uint8_t *active, float *logits);
/* Appends one token to sequence 0; logits receives [V]. */
tlm_status tlm_decode_step(tlm_session *s, int32_t id, float *logits);
/* One pass over new tokens of any of the sequences: n[b] >= 0 ids for sequence b, given
 * concatenated in ids (sequence 0's, then 1's, ...). Decoding one token of some sequences while
 * prefilling prompt chunks of others (or several prompts at once) then reads each weight once for
 * all of them, where separate tlm_prefill and tlm_decode calls read them once each. logits (may be
 * NULL) [batch, V] receives, for each sequence with n[b] > 0 and want[b] != 0 (want NULL: all),
 * the logits after its last new id; other rows are left untouched. */
tlm_status tlm_session_step(tlm_session *s, const int32_t *ids, const int *n, const uint8_t *want,
                            float *logits);

typedef struct {
    float temperature; /* 0: greedy (argmax, lowest id on ties); else logits / temperature */
    int top_k;         /* keep the k most likely ids; <= 0 keeps all */
    float top_p;       /* keep the smallest set of most likely ids with mass >= top_p; >= 1 all */
    uint64_t seed;
    uint64_t stream; /* independent streams for the same seed (e.g. one per batch member) */
    /* The rest is off when zero, so older initializers keep their meaning. */
    float min_p; /* drop ids whose probability is below min_p times the likeliest one's */
    /* Penalties over the last penalty_last_n ids given to tlm_sampler_accept (llama.cpp's rules):
     * a logit l of an id seen there becomes l / repeat_penalty (l > 0) or l * repeat_penalty, then
     * l - count * frequency_penalty - presence_penalty. repeat_penalty 0 or 1: off. */
    float repeat_penalty;
    float presence_penalty;
    float frequency_penalty;
    int penalty_last_n; /* 0: 64 */
} tlm_sampler_opts;

/* Defaults (llama.cpp's): temperature 0.8, top_k 40, top_p 0.95, seed 0, stream 0; every other
 * field 0 (min_p and the penalties off). */
void tlm_sampler_opts_default(tlm_sampler_opts *o);

/* Draws ids from logits. Reproducible: the same options and logits give the same ids. Neither
 * top-k nor top-p sorts the vocabulary (a k-heap, and a sort of only the ids that can be in the
 * nucleus). */
typedef struct tlm_sampler tlm_sampler;
tlm_status tlm_sampler_new(const tlm_sampler_opts *o, int vocab_size, tlm_sampler **out);
void tlm_sampler_free(tlm_sampler *s);
/* TLM_ERR_NUMERIC when the logits hold a NaN or no finite value. */
tlm_status tlm_sample(tlm_sampler *s, const float *logits, int32_t *id);
/* Records an id (of the prompt or generated) in the penalty window; a no-op without penalties.
 * tlm_generate accepts every prompt id and every sampled id. */
void tlm_sampler_accept(tlm_sampler *s, int32_t id);

typedef enum {
    TLM_STOP_NONE = 0,
    TLM_STOP_LENGTH,   /* max_new_tokens generated */
    TLM_STOP_EOS,      /* the end-of-sequence id was generated (it is reported to on_token) */
    TLM_STOP_CONTEXT,  /* prompt + generated reached the cache capacity (context_length) */
    TLM_STOP_CALLBACK, /* on_token asked to stop */
} tlm_stop_reason;

typedef struct {
    int max_new_tokens; /* per sequence; 0: none (prefill only), < 0: until EOS or capacity */
    int32_t eos_id;     /* < 0: none */
    tlm_sampler_opts sampling;
    /* Called with each new id as it is sampled; non-zero stops that sequence. May be NULL. */
    int (*on_token)(void *user, int seq, int32_t id);
    void *user;
} tlm_generate_opts;

/* max_new_tokens 256, no EOS id, the sampler's defaults, no callback. */
void tlm_generate_opts_defaults(tlm_generate_opts *o);

typedef struct {
    int prompt_tokens; /* over all sequences */
    int new_tokens;    /* ids sampled, over all sequences */
    int decode_steps;  /* tlm_decode calls */
    double prefill_seconds;
    double decode_seconds; /* decode steps plus sampling */
} tlm_generate_stats;

/* Generates from n_prompts (<= batch) prompts at once, after resetting the session: each prompt
 * is prefilled, then all unfinished sequences advance together one token per step until each has
 * stopped. A sequence never exceeds the capacity: prompt + new ids <= capacity. stops (may be
 * NULL) receives each sequence's reason; stats may be NULL. Sequence b samples with stream
 * sampling.stream + b, so its ids do not depend on the other prompts. o NULL: the defaults. */
tlm_status tlm_generate(tlm_session *s, const int32_t *const *prompts, const int *prompt_lens,
                        int n_prompts, const tlm_generate_opts *o, tlm_stop_reason *stops,
                        tlm_generate_stats *stats);

/* ---- tokenizer ---------------------------------------------------------------------------- */

/* One interface over every vocabulary kind: byte-level BPE (GPT-2 encoder.json + vocab.bpe, GGUF
 * `gpt2`, tlm-trained), SentencePiece-style (llama2.c tokenizer.bin, GGUF `llama`) and char-level.
 * Ids are int32. Decoding is lossless: decode(encode(x)) == x for any byte string (for vocabularies
 * that can represent every byte, which all but char-level can). The type tlm_tokenizer is declared
 * with the model files' functions above, which take one. */

typedef enum {
    TLM_TOKENIZER_BPE = 0, /* byte-level BPE, GPT-2 pre-tokenization, merges by rank */
    TLM_TOKENIZER_SPM,     /* scores, best-score merges, byte fallback, dummy-prefix space */
    TLM_TOKENIZER_CHAR     /* one id per distinct character of the training text */
} tlm_tokenizer_kind;

/* Flags of tlm_tokenizer_encode, or'ed. */
typedef enum {
    /* special tokens in the text are encoded atomically (longest match wins); otherwise they are
     * plain text */
    TLM_ENCODE_ALLOW_SPECIAL = 1,
    TLM_ENCODE_ADD_BOS = 2, /* prepend BOS (error if the vocabulary has none) */
    TLM_ENCODE_ADD_EOS = 4  /* append EOS (error if the vocabulary has none) */
} tlm_encode_flags;
/* Flags of tlm_tokenizer_decode and tlm_decoder_new. */
typedef enum {
    TLM_DECODE_SKIP_SPECIAL = 1 /* special tokens (BOS, EOS, <|endoftext|> ...) produce nothing */
} tlm_decode_flags;

/* Largest text tlm_tokenizer_encode accepts, in bytes. */
#define TLM_TOKENIZER_MAX_INPUT ((size_t)0x7FFFFFFF)

/* Loads TOKENIZER, detecting its kind: a llama2.c tokenizer.bin, a .gguf with a vocabulary, a
 * directory with encoder.json + vocab.bpe (GPT-2 or tlm-trained BPE), a tlm tokenizer directory
 * (tokenizer.json), or a tokenizer.json / encoder.json / vocab.bpe file inside such a directory. */
tlm_status tlm_tokenizer_load(const char *path, tlm_tokenizer **out);
/* Loads GPT-2's pair of files given separately. */
tlm_status tlm_tokenizer_load_gpt2(const char *encoder_json, const char *vocab_bpe,
                                   tlm_tokenizer **out);
void tlm_tokenizer_free(tlm_tokenizer *t);

tlm_tokenizer_kind tlm_tokenizer_get_kind(const tlm_tokenizer *t);
const char *tlm_tokenizer_kind_name(tlm_tokenizer_kind k);
int32_t tlm_tokenizer_vocab_size(const tlm_tokenizer *t);
/* Special ids, -1 when the vocabulary has none. */
int32_t tlm_tokenizer_bos(const tlm_tokenizer *t);
int32_t tlm_tokenizer_eos(const tlm_tokenizer *t);
/* 1 if texts start with BOS for this vocabulary (as llama.cpp adds it): a GGUF vocabulary's
 * tokenizer.ggml.add_bos_token where it has one (Llama 3's: on), else SentencePiece ones with a
 * BOS; 0 where there is no BOS. */
int tlm_tokenizer_add_bos(const tlm_tokenizer *t);
/* 1 if generating id ends a generation, as llama.cpp's end-of-generation set has it: EOS, a GGUF
 * vocabulary's end-of-turn and end-of-message ids, and tokens whose text is one of the chat
 * formats' ends (<|eot_id|>, <|end_of_text|>, <|im_end|>, <|endoftext|>, <end_of_turn>, </s>,
 * ...). */
int tlm_tokenizer_is_eog(const tlm_tokenizer *t, int32_t id);
/* 1 if id is a special (control) token. */
int tlm_tokenizer_is_special(const tlm_tokenizer *t, int32_t id);
/* The bytes token id stands for (byte-fallback tokens give their byte; specials their text).
 * Points into the tokenizer. TLM_ERR_RANGE for an unknown id. */
tlm_status tlm_tokenizer_piece(const tlm_tokenizer *t, int32_t id, const char **bytes, size_t *len);
/* Id whose piece is exactly these bytes (specials included), or -1. */
int32_t tlm_tokenizer_find(const tlm_tokenizer *t, const void *bytes, size_t len);
/* Longest piece in bytes. */
size_t tlm_tokenizer_max_piece(const tlm_tokenizer *t);

/* Encodes len bytes into *ids (malloc'd, free with free(); NULL when *n is 0). */
tlm_status tlm_tokenizer_encode(const tlm_tokenizer *t, const void *text, size_t len,
                                unsigned flags, int32_t **ids, size_t *n);
/* Decodes ids into *text (malloc'd, NUL-terminated, *len excludes the NUL). SentencePiece-style
 * vocabularies drop the dummy-prefix space at the start and after a special token (BOS). */
tlm_status tlm_tokenizer_decode(const tlm_tokenizer *t, const int32_t *ids, size_t n,
                                unsigned flags, char **text, size_t *len);

/* Streaming decoder for generation: emits only complete UTF-8 characters (bytes that can never
 * complete a character are emitted as they are, so nothing is lost). */
typedef struct tlm_decoder tlm_decoder;
tlm_status tlm_decoder_new(const tlm_tokenizer *t, unsigned flags, tlm_decoder **out);
void tlm_decoder_free(tlm_decoder *d);
/* Feeds one id; bytes and len receive what can be printed now (valid until the next call). */
tlm_status tlm_decoder_push(tlm_decoder *d, int32_t id, const char **bytes, size_t *len);
/* Emits whatever is still held back (an incomplete character at the end). */
void tlm_decoder_flush(tlm_decoder *d, const char **bytes, size_t *len);

/* Char-level vocabulary from training text: its distinct UTF-8 characters sorted by code point
 * (a byte that is not valid UTF-8 counts as a character of its own). */
tlm_status tlm_tokenizer_char_from_text(const void *text, size_t len, tlm_tokenizer **out);

/* Writes a tlm tokenizer directory (created if missing): tokenizer.json always; BPE adds
 * encoder.json + vocab.bpe (GPT-2 format), SentencePiece-style adds tokenizer.bin (llama2.c
 * format). tlm_tokenizer_load reads it back. */
tlm_status tlm_tokenizer_save(const tlm_tokenizer *t, const char *dir);

typedef struct {
    int32_t vocab_size;          /* specials + 256 bytes + merges */
    const char *const *specials; /* NUL-terminated special tokens, ids 0.. in this order */
    int n_specials;
    int threads; /* pre-tokenization threads; <= 0: tlm_get_threads() */
    /* Optional progress: called now and then with merges done and total; non-zero stops. */
    int (*progress)(void *user, int32_t done, int32_t total);
    void *user;
} tlm_bpe_train_opts;

/* GPT-2's layout: vocab_size 50257 with the one special token <|endoftext|> (id 0), every core,
 * no progress callback. */
void tlm_bpe_train_opts_defaults(tlm_bpe_train_opts *o);

/* Trains a byte-level BPE on the concatenation of the files (GPT-2 pre-tokenization; special
 * tokens split the text and never merge; ties go to the lexicographically greater pair). */
tlm_status tlm_tokenizer_train_bpe(const char *const *files, int n_files,
                                   const tlm_bpe_train_opts *opts, tlm_tokenizer **out);
/* Same over texts in memory. */
tlm_status tlm_tokenizer_train_bpe_texts(const char *const *texts, const size_t *lens, int n_texts,
                                         const tlm_bpe_train_opts *opts, tlm_tokenizer **out);

#ifdef __cplusplus
}
#endif
#endif
