/* Helpers shared by the model-format readers and writers (llama2.c, GGUF, Hugging Face). */
#ifndef TLM_FORMATS_H
#define TLM_FORMATS_H

#include "core/core.h"
#include "model/model.h"

/* Reorders the rows of a q or k projection [rows, cols] head by head between the two RoPE pairings.
 * Half pairing rotates row i with row i + hd/2, interleaved rotates 2i with 2i+1; the same rows
 * in the other order give the same attention scores, so a model converts losslessly.
 * to_interleaved: half-order rows -> interleaved order; otherwise the inverse. bias may be a
 * [rows] vector (or NULL) that moves with its rows. */
tlm_status fmt_permute_qk(float *w, float *bias, int rows, int cols, int hd, int to_interleaved);

/* The first of Gemma 2's layer fields (attn_softcap, final_softcap, embed_scale, attn_scale,
 * post_norms) the config sets, or NULL. */
const char *fmt_gemma_field(const tlm_config *c);
/* 1 if the config is the Llama shape that llama2.c and GGUF `llama` describe: pre-norm RMSNorm,
 * SwiGLU, RoPE, no bias; with qwen2_ok, q, k and v biases too (Qwen2's layout, which GGUF and
 * Hugging Face hold); with window_ok, a sliding window on every layer (Mistral's). Otherwise
 * writes the first difference into why. */
int fmt_is_llama_style(const tlm_config *c, int qwen2_ok, int window_ok, char *why, size_t why_len);
/* 1 if the config is Gemma 2's shape: pre-norm RMSNorm with post_norms, GeGLU, RoPE, no bias, a
 * tied head, embed_scale sqrt(d_model) (Gemma's models scale their embeddings by it in code, not
 * by a setting), and a sliding window on none or on a pattern of the layers. Files in llama.cpp's
 * layout (for_gguf) also need both soft-caps, which its graph always applies, and the attention
 * scale 1 / sqrt(head_dim), the only one it computes for the heads tlm has. Otherwise writes the
 * first difference into why. */
int fmt_is_gemma2_style(const tlm_config *c, int for_gguf, char *why, size_t why_len);

/* Creates a model from c (mdl_new: writable, or views to bind), with a context message on
 * failure ("<path>: ..."). */
tlm_status fmt_model_new(const tlm_config *c, const char *path, int writable, tlm_model **out);

/* Pointer to a writable model's floats of a tensor by canonical name (NULL if the model lacks it,
 * or m is NULL). */
float *fmt_tensor(tlm_model *m, const char *name);
float *fmt_layer_tensor(tlm_model *m, int layer, const char *name);
/* A tensor's floats for writers: every weight must be F32 (see fmt_need_f32). */
const float *fmt_tensor_c(const tlm_model *m, const char *name);
const float *fmt_layer_tensor_c(const tlm_model *m, int layer, const char *name);
/* Writers read F32 weights; TLM_ERR_UNSUPPORTED naming the first other one otherwise. */
tlm_status fmt_need_f32(const tlm_model *m, const char *what);
/* Refuses a mixture-of-experts model in a writer of a format without expert tensors. */
tlm_status fmt_no_experts(const tlm_model *m, const char *what);
/* Refuses a model with RoPE frequency factors (a GGUF's rope_freqs.weight) for a format that has
 * no place for them: written without, the file would hold another model. */
tlm_status fmt_no_rope_factors(const tlm_model *m, const char *what);

/* Loaders behind tlm_model_load: writable asks for the flat F32 copy (TLM_LOAD_WRITABLE). */
tlm_status fmt_load_llama2c(const char *path, int writable, tlm_model **out);
tlm_status fmt_load_gguf(const char *path, int writable, tlm_model **out);
tlm_status fmt_load_hf(const char *dir, int writable, tlm_model **out);
tlm_status fmt_load_tlm(const char *path, int writable, tlm_model **out);
/* One tlm .safetensors file (its config in the metadata). */
tlm_status fmt_load_tlm_file(const char *path, int writable, tlm_model **out);

/* GGUF (gguf_model.c): a model from an opened file. */
#include "io/gguf.h"
/* The model in an opened GGUF. The model takes over the file's mapping (g->owns_map) when it
 * keeps tensors in place. */
tlm_status fmt_gguf_load_model(io_gguf *g, const char *path, int writable, tlm_model **out);
/* A split model's shards (gguf-split: PREFIX-0000k-of-0000N.gguf) found from its first, opened
 * g as gs[0]: gs[0 .. *n) (1 for a whole file); the caller closes gs[1..] even on an error. */
tlm_status fmt_gguf_open_shards(io_gguf *first, const char *path, io_gguf **gs, int *n);

/* llama2.c: 1 if the bytes look like a llama2.c model (v1 magic, or a legacy header that predicts
 * the size exactly). */
int fmt_llama2c_sniff(const uint8_t *p, size_t n);

#endif
