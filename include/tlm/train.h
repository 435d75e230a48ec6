/* tlm/train.h: batched passes over a model (training contexts, forward, backward), AdamW, the
 * learning-rate schedule and clipping, token datasets and the trainer. Part of tlm.h, which is what
 * programs include. */
#ifndef TLM_TRAIN_H
#define TLM_TRAIN_H

#include "base.h"
#include "lora.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- batched passes and gradients ------------------------------------------------------------ */

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

/* Applies n LoRA adapters (each made for this context's model) to every later pass, adapter i's
 * products multiplied by scales[i] (scales NULL: 1); n = 0 removes them. The adapters must outlive
 * their use. With exactly one attached, tlm_train_ctx_forward_backward trains it. */
tlm_status tlm_train_ctx_set_loras(tlm_train_ctx *x, const tlm_lora *const *loras,
                                   const float *scales, int n);

typedef struct {
    const int32_t *targets; /* [B*T] or NULL; negative targets are ignored in the loss */
    int pos_offset;         /* position of the first token (pos_offset + T <= context_length) */
    int want_probs;         /* also compute softmax probabilities */
    const int32_t *pos;     /* [B*T] or NULL: each token's position, as tlm_batch_opts.pos */
} tlm_forward_opts;

/* Every field 0: no targets, position 0, no probabilities. */
void tlm_forward_opts_defaults(tlm_forward_opts *o);

typedef struct {
    const float *logits; /* [B, T, V], owned by the context, valid until its next pass */
    const float *probs;  /* [B, T, V] if want_probs, else NULL */
    float loss;          /* mean cross-entropy over counted targets, or NAN without targets */
} tlm_forward_out;

/* Forward pass over ids [B, T] (row-major). opts may be NULL. */
tlm_status tlm_train_ctx_forward(tlm_train_ctx *x, const int32_t *ids, int B, int T,
                                 const tlm_forward_opts *opts, tlm_forward_out *out);

/* Training step core: forward over ids [B, T] at positions pos0.., mean cross-entropy against
 * targets (negative = ignored) into *loss, and the gradient of that loss for every parameter into
 * grads (the flat layout, tlm_model_num_params floats; written over unless accumulate, which adds
 * to it). Needs every weight in F32 (any model tlm_model_new makes or TLM_LOAD_WRITABLE
 * loads), unless an adapter is attached (tlm_train_ctx_set_loras): then the model is frozen, in any
 * type, and grads is the adapter's (tlm_lora_num_params floats, tlm_lora_params' layout). */
tlm_status tlm_train_ctx_forward_backward(tlm_train_ctx *x, const int32_t *ids,
                                          const int32_t *targets, int B, int T, int pos0,
                                          float *grads, int accumulate, float *loss);

/* What a batch of examples adds to plain windows of text (instruction tuning). */
typedef struct {
    /* [B*T] each token's position, or NULL: pos0, pos0 + 1, ... in every row. A token at position
     * p in column t of its row attends to the min(p, t) tokens before it and itself: examples
     * packed into one row, their positions starting again from 0 at each, see nothing of one
     * another (a block-diagonal causal mask), exactly as if each had a row of its own. */
    const int32_t *pos;
    int pos0;
    /* > 0: the loss is the sum of the counted targets' cross-entropy divided by this (and so its
     * gradient), not their mean: a micro-step or a process passes the whole optimizer step's
     * count (its share of it), so the gradients of the parts add up to the mean over the step's
     * every counted target, however many each part holds. <= 0: the batch's own count. */
    double divisor;
} tlm_batch_opts;

/* Every field 0. */
void tlm_batch_opts_defaults(tlm_batch_opts *o);
/* tlm_train_ctx_forward_backward with o's positions and divisor (o NULL: the defaults). */
tlm_status tlm_train_ctx_forward_backward_opts(tlm_train_ctx *x, const int32_t *ids,
                                               const int32_t *targets, int B, int T,
                                               const tlm_batch_opts *o, float *grads,
                                               int accumulate, float *loss);

/* A mixture-of-experts model's router losses in the last tlm_train_ctx_forward_backward(_opts)
 * (0 for a dense one): the load-balancing loss and the z-loss without their coefficients (the
 * loss holds router_aux_loss_coef * aux + router_z_loss_coef * z), each over the pass's rows and
 * layers; a pass with a divisor weighs them by its share of it, as its loss does. */
void tlm_train_ctx_router_losses(const tlm_train_ctx *x, double *aux, double *z);

/* Losses that are not a plain mean of the targets' cross-entropy (preference tuning) in two
 * halves. The first: a training forward of the batch (kept in the context) and each target's
 * log-probability into logp [B*T] (0 where the target is negative). ids and targets must stay
 * unchanged until the second half; any other pass of the context in between discards the first. */
tlm_status tlm_train_ctx_forward_logp(tlm_train_ctx *x, const int32_t *ids, const int32_t *targets,
                                      int B, int T, const tlm_batch_opts *o, float *logp);
/* The second: the gradient of L = -sum_t weights[t] logp[t] (weights [B*T], those of ignored
 * targets unused) into grads (written, or added to with accumulate) — the chain rule's dL/dlogp
 * at each target, negated — and *loss (may be NULL) the sum of weights[t] times the targets'
 * cross-entropy. */
tlm_status tlm_train_ctx_backward_weighted(tlm_train_ctx *x, const float *weights, float *grads,
                                           int accumulate, float *loss);
/* Each target's log-probability under the model as it is (no dropout, nothing kept), into logp
 * [B*T] (0 where ignored); pos may be NULL (as tlm_batch_opts.pos). */
tlm_status tlm_train_ctx_token_logp(tlm_train_ctx *x, const int32_t *ids, const int32_t *targets,
                                    int B, int T, const int32_t *pos, float *logp);

/* Direct preference optimisation (Rafailov et al. 2023, TRL's DPOTrainer with loss_type
 * "sigmoid"): for a pair with chosen answer w and rejected answer l after the same prompt,
 *   z = beta [(log pi(w) - log ref(w)) - (log pi(l) - log ref(l))]
 *   loss = -(1 - eps) log sigmoid(z) - eps log sigmoid(-z)   (eps: label smoothing),
 * log pi(w) the sum of the answer's tokens' log-probabilities. rpo_alpha > 0 adds alpha times the
 * chosen answers' mean cross-entropy over the batch (TRL's rpo_alpha, "Iterative Reasoning
 * Preference Optimization"): it keeps the chosen answers likely while the pair's gap grows. */
typedef struct {
    double beta;            /* default 0.1 */
    double label_smoothing; /* default 0 */
    double rpo_alpha;       /* default 0: off */
} tlm_dpo_opts;
void tlm_dpo_opts_defaults(tlm_dpo_opts *o);

/* Sums over a batch's pairs (divide by pairs for TRL's means). */
typedef struct {
    int pairs;
    double loss;
    double chosen_reward, rejected_reward; /* beta (log pi - log ref) */
    double chosen_logp, rejected_logp;     /* log pi */
    int correct;                           /* pairs whose chosen reward is above the rejected's */
    double nll;                            /* the chosen answers' mean cross-entropy, times pairs */
} tlm_dpo_stats;

/* One DPO pass over P pairs: rows 2i (chosen) and 2i + 1 (rejected) of ids [2P, T], their targets
 * negative but on the answers, pos as tlm_batch_opts.pos (NULL: 0..T-1); ref_logp [2P] the
 * reference's sums for the rows (tlm_train_ctx_token_logp of the reference: the same context with
 * its adapter's scale 0, or a frozen copy of the model). With grads, the gradient of the pairs'
 * summed loss divided by divisor (<= 0: P) into grads (written, or added with accumulate);
 * without, a forward only (evaluation). st (may be NULL) receives the pairs' sums. */
tlm_status tlm_train_ctx_dpo(tlm_train_ctx *x, const int32_t *ids, const int32_t *targets, int P,
                             int T, const int32_t *pos, const double *ref_logp,
                             const tlm_dpo_opts *d, double divisor, float *grads, int accumulate,
                             tlm_dpo_stats *st);

/* ---- training -------------------------------------------------------------------------------- */

/* Doubles, like the Python scalars PyTorch computes its step with. */
typedef struct {
    double beta1, beta2, eps, weight_decay;
} tlm_adamw_opts;

/* AdamW state over a range [begin, begin + n) of the flat parameter layout (the whole buffer,
 * or one process's shard): first and second moments for that range, and the step count. */
typedef struct tlm_adamw tlm_adamw;

/* beta1 0.9, beta2 0.95, eps 1e-8, weight decay 0.1. */
void tlm_adamw_opts_defaults(tlm_adamw_opts *h);
/* Moments for the whole flat buffer. */
tlm_status tlm_adamw_new(const tlm_model *m, tlm_adamw **out);
/* Moments for params [begin, end) only (end <= tlm_model_num_params). */
tlm_status tlm_adamw_new_range(const tlm_model *m, size_t begin, size_t end, tlm_adamw **out);
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
 * into the update (pass tlm_grad_clip_coef) saves a pass over the gradient and gives the same bits.
 */
tlm_status tlm_adamw_step_scaled(tlm_adamw *o, tlm_model *m, const float *grads, float grad_scale,
                                 double lr, const tlm_adamw_opts *h);

/* Linear warmup to max_lr over `warmup` steps, cosine decay to min_lr at the last step
 * (total_steps - 1), min_lr after. Steps count from 0. */
typedef struct {
    double max_lr, min_lr;
    long warmup, total_steps;
} tlm_schedule;
double tlm_schedule_lr(const tlm_schedule *s, long step);

/* Global L2 norm of the gradient. */
double tlm_grad_norm(const float *grads, size_t n);
/* Sum of squares of n gradient values, in a fixed order (the same bits for any thread count):
 * tlm_grad_norm(g, n) == sqrt(tlm_grad_sumsq(g, n)). Shards sum their ranges' parts. */
double tlm_grad_sumsq(const float *grads, size_t n);
/* torch.nn.utils.clip_grad_norm_: scales by max_norm / (norm + 1e-6) when that is below 1;
 * returns the norm before clipping. max_norm <= 0 only measures. */
double tlm_grad_clip(float *grads, size_t n, double max_norm);
/* The factor tlm_grad_clip scales by for a given norm (1 when no clipping applies). */
float tlm_grad_clip_coef(double norm, double max_norm);

/* Token files (tokenized once, memory-mapped while training). */
typedef struct tlm_dataset tlm_dataset;
typedef enum { TLM_SPLIT_TRAIN = 0, TLM_SPLIT_VAL = 1 } tlm_split;
/* Writes ids atomically as uint16 when vocab_size <= 65536, else uint32, after a small header. */
tlm_status tlm_dataset_write_tokens(const char *path, const int32_t *ids, size_t n,
                                    int32_t vocab_size);
/* Maps a token file; the last val_fraction of the tokens is the validation split. */
tlm_status tlm_dataset_load(const char *path, double val_fraction, tlm_dataset **out);
/* Maps token files (tlm token files, or llm.c shards: a header of 256 int32 with magic 20240520,
 * version 1 and the token count, then uint16 tokens) as one stream of training tokens, windows
 * crossing from one file into the next like documents in one file. Validation is the val files
 * when n_val > 0, else the last val_fraction of the stream. Malformed files are refused by name.
 * tlm_dataset_vocab_size is 0 when no file names its vocabulary (llm.c shards). */
tlm_status tlm_dataset_load_files(const char *const *train, int n_train, const char *const *val,
                                  int n_val, double val_fraction, tlm_dataset **out);
void tlm_dataset_free(tlm_dataset *d);
size_t tlm_dataset_size(const tlm_dataset *d, tlm_split split);
int32_t tlm_dataset_vocab_size(const tlm_dataset *d);

/* Start of window `index` of the windows of T + 1 tokens of a split that the stream `stream`
 * (e.g. a training step) of the run seeded `seed` draws: a hash of (seed, stream, index). */
size_t tlm_dataset_window(const tlm_dataset *d, tlm_split split, uint64_t seed, uint64_t stream,
                          uint64_t index, int T);

/* ---- instruction and preference data --------------------------------------------------------- */

/* JSON Lines, one example a line: {"text"}, {"prompt", "completion"}, {"messages": [{"role",
 * "content"}, ...]} or {"prompt", "chosen", "rejected"} (strings, or lists of messages), as
 * Hugging Face TRL reads them. AUTO: from the first line's keys. */
typedef enum {
    TLM_FORMAT_AUTO = 0,
    TLM_FORMAT_TEXT,
    TLM_FORMAT_COMPLETION,
    TLM_FORMAT_CHAT,
    TLM_FORMAT_DPO
} tlm_data_format;
/* Which tokens the loss predicts. DEFAULT: text everywhere; completions (and a pair's chosen and
 * rejected sides) alone; chats their assistant turns. ALL: every token. ASSISTANT: the assistant
 * turns, each with the marker ending it. COMPLETION: a chat's last assistant turn alone. */
typedef enum {
    TLM_LOSS_ON_DEFAULT = 0,
    TLM_LOSS_ON_ALL,
    TLM_LOSS_ON_ASSISTANT,
    TLM_LOSS_ON_COMPLETION
} tlm_loss_on;
const char *tlm_data_format_name(tlm_data_format f);
/* "auto", "text", "completion", "chat", "dpo" / "all", "assistant", "completion". */
tlm_status tlm_data_format_parse(const char *name, tlm_data_format *out);
tlm_status tlm_loss_on_parse(const char *name, tlm_loss_on *out);

typedef struct {
    tlm_data_format format;
    tlm_loss_on loss_on;
    /* Chats are rendered as tlm serve renders them: chatml, llama2, llama3, mistral, gemma or
     * phi3 (NULL: chatml); the trained turns are tokenized on their own, as a model generates
     * them after the prompt. */
    const char *chat_template;
    int max_len;           /* tokens; a longer example is cut to it (default 512) */
    int truncate_keep_end; /* cut from the start, keeping the end (default: keep the start) */
    int skip_bad;          /* count malformed lines and go on (default: stop at the first) */
} tlm_examples_opts;

typedef struct {
    tlm_data_format format; /* the one read */
    long lines;             /* not blank */
    long examples;          /* kept (pairs for DPO) */
    long bad;               /* malformed, skipped (skip_bad) */
    long truncated;         /* cut to max_len (kept) */
    long empty;             /* nothing left to learn after masking: skipped */
    long tokens, trained_tokens;
} tlm_examples_stats;

/* Tokenized examples: each a sequence of ids, a flag per token saying whether the loss predicts
 * it. Texts and completions end with EOS (trained) where the vocabulary has one; BOS starts every
 * example where the vocabulary's models expect it (tlm_tokenizer_add_bos). */
typedef struct tlm_examples tlm_examples;

void tlm_examples_opts_defaults(tlm_examples_opts *o);
/* Reads a JSON Lines file. A malformed line is an error naming the file, its line number and what
 * is wrong, unless skip_bad. stats (may be NULL) receives the counts. */
tlm_status tlm_examples_load(const char *path, const tlm_tokenizer *tok, const tlm_examples_opts *o,
                             tlm_examples **out, tlm_examples_stats *stats);
void tlm_examples_free(tlm_examples *e);
/* Sequences held (a preference pair is two: chosen at 2i, rejected at 2i + 1). */
size_t tlm_examples_count(const tlm_examples *e);
int tlm_examples_pairs(const tlm_examples *e);
/* Sequence i's tokens and flags (owned by e); returns its length, 0 past the end. */
int tlm_examples_get(const tlm_examples *e, size_t i, const int32_t **ids, const uint8_t **trained);
/* Moves the last fraction of the examples (whole pairs) into *tail (NULL when none). */
tlm_status tlm_examples_split(tlm_examples *e, double fraction, tlm_examples **tail);

/* Mean loss over `batches` fixed random windows (B x T) of a split; NAN if it cannot be computed.
 */
double tlm_train_ctx_evaluate(tlm_train_ctx *x, const tlm_dataset *d, tlm_split split, int B, int T,
                              int batches, uint64_t seed);

typedef struct {
    long step, total;                              /* steps completed, steps in the run */
    float train_loss;                              /* of this step's batch */
    float val_loss;                                /* NAN unless evaluated at this step */
    double lr, grad_norm, tokens_per_s, elapsed_s; /* tokens: of examples, not padding */
    long steps_this_run;                           /* since start or resume */
    /* DPO: the step's pairs' sums (NULL otherwise); val_dpo those of the evaluation (NULL unless
     * evaluated at this step). */
    const tlm_dpo_stats *dpo, *val_dpo;
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
    /* Fine-tuning with LoRA: trains this adapter (made for m) in place of m's parameters; m stays
     * frozen, read-only, in any type. Checkpoints hold the adapter and its moments; out_dir gets
     * adapter.gguf (llama.cpp's GGUF adapter) and peft/ (a PEFT directory) in place of
     * model.safetensors. NULL: m's parameters are trained. */
    tlm_lora *lora;
    /* Instruction tuning: rows of whole examples in place of the dataset's windows (the dataset
     * may then be NULL). Each step takes `batch` rows of an epoch's shuffled order (epochs follow
     * one another); a row holds one example (padded to the longest of its pass) or, with pack,
     * several (positions restarting at each: tlm_batch_opts.pos), seq_len tokens. The loss is the
     * mean over the step's trained tokens, whatever the micro-steps and processes. Validation:
     * val_examples (NULL: none), up to eval_batches x batch rows of them in order. */
    const tlm_examples *examples, *val_examples;
    int pack;
    /* Preference pairs (tlm_examples_pairs) train with DPO: `batch` counts pairs, the loss is the
     * mean of the step's pairs' (tlm_train_ctx_dpo). The reference: with lora, m itself (the
     * adapter's scale 0, no second copy); else ref_model (the frozen base, needed then). With
     * precompute_ref its log-probabilities are computed once, before the first step. */
    tlm_dpo_opts dpo;
    const tlm_model *ref_model;
    int precompute_ref;
    /* Called after every step; returning non-zero stops (after saving a checkpoint). */
    int (*on_progress)(void *user, const tlm_train_progress *p);
    void *user;
    volatile int *stop; /* checked after every step (e.g. set by a SIGINT handler) */
    tlm_train_hooks hooks;
} tlm_train_opts;

void tlm_train_opts_defaults(tlm_train_opts *o);
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
long tlm_trainer_steps(const tlm_trainer *t); /* steps completed */
tlm_train_ctx *tlm_trainer_ctx(tlm_trainer *t);
/* The gradient buffer (flat layout, tlm_model_num_params floats; an adapter's layout with
 * tlm_train_opts.lora). */
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

#ifdef __cplusplus
}
#endif
#endif
