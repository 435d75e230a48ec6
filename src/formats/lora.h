/* LoRA adapters in memory, and in the two files people exchange them in: llama.cpp's GGUF adapter
 * (general.type = adapter) and a PEFT directory (adapter_config.json + adapter_model.safetensors).
 *
 * An adapter adds s * B * (A * x) to the output of a base matrix W [out, in] (y = W x), with
 * s = alpha / rank, or alpha / sqrt(rank) under rsLoRA. A is [rank, in] and B is [out, rank],
 * row-major float, exactly PEFT's lora_A.weight and lora_B.weight. Matrices are keyed by the base
 * tensor's GGUF name (blk.N.attn_q.weight ... output.weight), the names tlm's model uses.
 *
 * Query and key rows. A Llama GGUF stores attn_q/attn_k rows in the interleaved order of Meta's
 * RoPE, Hugging Face in the half order (its converter permuted them; see fmt_permute_qk). B's rows
 * are the base's output rows, so B of q and k moves with them (llama.cpp's convert_lora_to_gguf.py
 * permutes lora_b likewise); A, whose rows are the rank, never does. qk_interleaved records which
 * order an adapter's q/k B rows are in: the GGUF reader sets it for architecture llama, the PEFT
 * reader clears it, and each writer converts a copy to its file's order given the head dimension.
 * A model wiring an adapter in calls fmt_lora_set_qk_order with its own rope_pairing. */
#ifndef TLM_FORMATS_LORA_H
#define TLM_FORMATS_LORA_H

#include <stdint.h>

#include "core/core.h"

#define FMT_LORA_NAME_MAX 64

typedef struct {
    char name[FMT_LORA_NAME_MAX]; /* base tensor, GGUF name: blk.N.attn_q.weight, output.weight */
    int64_t in, out;              /* the base's columns and rows */
    float *a;                     /* [rank, in] */
    float *b;                     /* [out, rank] */
} fmt_lora_mat;

typedef struct {
    char arch[32];        /* GGUF architecture of the base: llama, qwen2 */
    char base_model[256]; /* PEFT's base_model_name_or_path; "" when unknown */
    int rank;             /* one rank for every matrix (PEFT's r; rank_pattern is refused) */
    float alpha;
    float dropout;      /* PEFT's lora_dropout (training only; GGUF does not keep it) */
    int use_rslora;     /* s = alpha / sqrt(rank) */
    int qk_interleaved; /* q/k B rows in interleaved (Llama GGUF) order, else half (HF) order */
    int n;
    fmt_lora_mat *m;
} fmt_lora;

/* A base tensor an adapter may target: its GGUF name and shape [out, in]. */
typedef struct {
    const char *name;
    int64_t in, out;
} fmt_lora_base;

/* Frees the matrices and zeroes *a (an all-zero fmt_lora is an empty adapter). */
void fmt_lora_free(fmt_lora *a);
/* Appends a matrix for base tensor name [out, in] with a->rank; A and B are copied (NULL: zeros).
 * The name must be one fmt_lora_known_target accepts, and not there already. */
tlm_status fmt_lora_add(fmt_lora *a, const char *name, int64_t in, int64_t out, const float *A,
                        const float *B);
const fmt_lora_mat *fmt_lora_find(const fmt_lora *a, const char *name);
/* alpha / rank, or alpha / sqrt(rank) under rsLoRA. */
float fmt_lora_scale(const fmt_lora *a);
/* 1 if name is a base tensor adapters may target: blk.N.{attn_q,attn_k,attn_v,attn_output,
 * ffn_gate,ffn_up,ffn_down}.weight or output.weight. */
int fmt_lora_known_target(const char *name);
/* Rank, alpha, names, shapes, every value finite; what names the adapter in messages. */
tlm_status fmt_lora_validate(const fmt_lora *a, const char *what);
/* Refuses an adapter for another architecture (arch may be NULL to skip that), a target the base
 * lacks, or a shape that differs from the base's. */
tlm_status fmt_lora_check_base(const fmt_lora *a, const char *arch, const fmt_lora_base *base,
                               int n_base);
/* Puts q/k B rows in the interleaved (1) or half (0) order; head_dim is the model's (needed only
 * when rows move). */
tlm_status fmt_lora_set_qk_order(fmt_lora *a, int interleaved, int head_dim);

/* llama.cpp's GGUF LoRA adapter. Reads F32, F16, BF16 and Q8_0 tensors; writes F32, atomically.
 * GGUF has no rsLoRA flag: the writer folds sqrt(rank) into alpha so that llama.cpp's alpha / rank
 * is the same scale, and such a file reads back as plain LoRA. head_dim: for q/k rows (see above);
 * 0 when the adapter has no q/k matrices or is already in the file's order. Readers
 * validate everything (fmt_lora_validate) and leave *out empty on failure; free it with
 * fmt_lora_free after success. */
tlm_status fmt_lora_read_gguf(const char *path, fmt_lora *out);
tlm_status fmt_lora_write_gguf(const char *path, const fmt_lora *a, int head_dim);

/* A PEFT directory. PEFT does not name the architecture: the reader takes it (NULL: llama). The
 * writer makes dir if it is missing and writes F32 tensors and the config, each atomically. */
tlm_status fmt_lora_read_peft(const char *dir, const char *arch, fmt_lora *out);
tlm_status fmt_lora_write_peft(const char *dir, const fmt_lora *a, int head_dim);

#endif
