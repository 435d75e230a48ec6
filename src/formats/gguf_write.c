/* GGUF v3 writer for Llama-style models (arch `llama`), the layout llama.cpp loads:
 *   "GGUF" u32 version=3, u64 tensor count, u64 metadata count, metadata (key string, u32 type,
 *   value), tensor infos (name, u32 n_dims, u64 dims innermost first, u32 ggml type, u64 offset
 *   from the data start), padding to general.alignment, then the tensor data, each aligned.
 * Strings are u64 length + bytes. Matrices are [out, in] row-major in tlm, which is ggml's layout
 * with ne0 = in, so the data is written as it is. llama.cpp rotates adjacent pairs for `llama`,
 * so half-pairing q/k rows are reordered. The vocabulary goes in tokenizer.ggml.*, written by the
 * tokenizer (tokenizer/tok_gguf.h); the container itself by io/gguf_writer.h. */
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/half.h"
#include "formats/formats.h"
#include "io/gguf_writer.h"
#include "tokenizer/tok_gguf.h"

#define GGUF_ALIGN 32

/* Element type a tensor is written with: vectors stay F32 (llama.cpp's converters keep norms
 * F32 and its CPU kernels expect them so). */
static tlm_dtype tensor_type(const tlm_tensor_info *ti, tlm_dtype dt) {
    return ti->ndim == 1 ? TLM_DTYPE_F32 : dt;
}

static size_t type_size(tlm_dtype t) { return tlm_dtype_get(t)->block_bytes; }

tlm_status tlm_model_save_gguf(const tlm_model *m, const tlm_tokenizer *tok, const char *path,
                               tlm_dtype dtype) {
    const tlm_config *c = &m->c;
    char why[96];
    if (!fmt_is_llama_style(c, why, sizeof why))
        return tlm_err(TLM_ERR_UNSUPPORTED, "GGUF export supports Llama-style models: %s", why);
    tlm_status fs = fmt_need_f32(m, "GGUF export");
    if (fs) return fs;
    if (dtype != TLM_DTYPE_F32 && dtype != TLM_DTYPE_F16 && dtype != TLM_DTYPE_BF16)
        return tlm_err(TLM_ERR_UNSUPPORTED, "GGUF export writes F32, F16 or BF16, not %s",
                       tlm_dtype_name(dtype));
    if (tok && tlm_tokenizer_vocab_size(tok) != c->vocab_size)
        return tlm_err(TLM_ERR_ARG, "tokenizer has %d tokens but the model's vocab_size is %d",
                       (int)tlm_tokenizer_vocab_size(tok), c->vocab_size);
    int hd = c->d_model / c->n_heads;
    tlm_gguf_writer w;
    tlm_gguf_writer_init(&w, GGUF_ALIGN);
    tlm_gguf_write_str(&w, "general.architecture", "llama");
    tlm_gguf_write_str(&w, "general.name", "tlm");
    tlm_gguf_write_u32(&w, "general.alignment", GGUF_ALIGN);
    tlm_gguf_write_u32(&w, "general.file_type",
                       dtype == TLM_DTYPE_F32   ? 0
                       : dtype == TLM_DTYPE_F16 ? 1
                                                : 32);
    tlm_gguf_write_u32(&w, "llama.context_length", (uint32_t)c->context_length);
    tlm_gguf_write_u32(&w, "llama.embedding_length", (uint32_t)c->d_model);
    tlm_gguf_write_u32(&w, "llama.block_count", (uint32_t)c->n_layers);
    tlm_gguf_write_u32(&w, "llama.feed_forward_length", (uint32_t)c->d_ff);
    tlm_gguf_write_u32(&w, "llama.attention.head_count", (uint32_t)c->n_heads);
    tlm_gguf_write_u32(&w, "llama.attention.head_count_kv", (uint32_t)c->n_kv_heads);
    tlm_gguf_write_f32(&w, "llama.attention.layer_norm_rms_epsilon", c->norm_eps);
    tlm_gguf_write_f32(&w, "llama.rope.freq_base", c->rope_theta);
    tlm_gguf_write_u32(&w, "llama.rope.dimension_count", (uint32_t)hd);
    tlm_status s = tlm_gguf_write_u32(&w, "llama.vocab_size", (uint32_t)c->vocab_size);
    if (!s && tok) s = tok_gguf_write_vocab(&w, tok);
    /* Tensor infos in schema order. */
    size_t max_numel = 0;
    for (int i = 0; i < m->n_tensors && !s; i++) {
        const tlm_tensor_info *t = &m->tensors[i];
        uint64_t dims[2] = {(uint64_t)t->shape[t->ndim - 1], (uint64_t)t->shape[0]};
        tlm_dtype ty = tensor_type(t, dtype);
        s = tlm_gguf_write_tensor(&w, t->name, (uint32_t)t->ndim, dims,
                                  (uint32_t)tlm_dtype_get(ty)->ggml, t->numel * type_size(ty));
        if (t->numel > max_numel) max_numel = t->numel;
    }
    uint8_t *head = NULL;
    size_t head_len = 0;
    if (!s) s = tlm_gguf_writer_header(&w, &head, &head_len);
    if (s) {
        tlm_gguf_writer_free(&w);
        return s;
    }
    float *scratch = malloc(max_numel * sizeof(float));
    uint16_t *half = malloc(max_numel * sizeof(uint16_t));
    if (!scratch || !half) {
        tlm_gguf_writer_free(&w);
        free(head);
        free(scratch);
        free(half);
        return tlm_err(TLM_ERR_NOMEM, "out of memory");
    }
    tlm_atomic_file a;
    s = tlm_atomic_open(&a, path);
    if (!s) s = tlm_atomic_write(&a, head, head_len);
    free(head);
    for (int i = 0; i < m->n_tensors && !s; i++) {
        const tlm_tensor_info *t = &m->tensors[i];
        const float *src = tlm_wf(&m->w[i]);
        int is_q = strstr(t->name, ".attn_q.weight") != NULL;
        int is_k = strstr(t->name, ".attn_k.weight") != NULL;
        if ((is_q || is_k) && c->rope_pairing == TLM_ROPE_HALF) {
            memcpy(scratch, src, t->numel * sizeof(float));
            s = fmt_permute_qk(scratch, NULL, (int)t->shape[0], (int)t->shape[1], hd, 1);
            src = scratch;
        }
        tlm_dtype ty = tensor_type(t, dtype);
        size_t bytes = t->numel * type_size(ty);
        if (!s && ty == TLM_DTYPE_F32) s = tlm_atomic_write(&a, src, bytes);
        if (!s && ty != TLM_DTYPE_F32) {
            for (size_t k = 0; k < t->numel; k++)
                half[k] = ty == TLM_DTYPE_F16 ? tlm_f32_to_f16(src[k]) : tlm_f32_to_bf16(src[k]);
            s = tlm_atomic_write(&a, half, bytes);
        }
        static const uint8_t zeros[GGUF_ALIGN];
        size_t pad = tlm_gguf_writer_pad(&w, bytes);
        if (!s && pad) s = tlm_atomic_write(&a, zeros, pad);
    }
    tlm_gguf_writer_free(&w);
    free(scratch);
    free(half);
    if (s) {
        tlm_atomic_abort(&a);
        return tlm_err_context(s, "writing %s", path);
    }
    return tlm_atomic_commit(&a);
}
