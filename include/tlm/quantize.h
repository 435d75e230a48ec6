/* tlm/quantize.h: quantized GGUF files as llama-quantize writes them, and importance matrices as
 * llama-imatrix writes them. Part of tlm.h, which is what programs include. */
#ifndef TLM_QUANTIZE_H
#define TLM_QUANTIZE_H

#include "base.h"
#include "model.h"
#include "tokenizer.h"
#include "train.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- quantized files and importance matrices ------------------------------------------------- */

/* Quantized GGUF, as llama.cpp's llama-quantize writes it (with or without an importance matrix
 * and its per-tensor overrides, tlm_quantize_opts): the same type for each tensor (the _M and _L
 * mixes and Q2_K give some attn_v, attn_output and ffn_down layers and output.weight more bits;
 * 1-D tensors stay F32; rows that are not whole blocks fall back to Q4_0, Q5_0, Q5_1, Q8_0 or
 * F16) and the same bytes (ggml's reference quantizers; tensors in llama.cpp's order). The values
 * are llama.cpp's general.file_type. */
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

#ifdef __cplusplus
}
#endif
#endif
