/* Helpers shared by the model-format readers and writers. */
#include "formats/formats.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

tlm_status fmt_permute_qk(float *w, float *bias, int rows, int cols, int hd, int to_interleaved) {
    if (hd <= 0 || hd % 2 || rows % hd)
        return core_err(TLM_ERR_ARG, "cannot permute %d rows with head dim %d", rows, hd);
    int half = hd / 2;
    size_t row_bytes = (size_t)cols * sizeof(float);
    float *tmp = malloc((size_t)hd * row_bytes);
    float btmp[1024];
    if (!tmp) return core_err(TLM_ERR_NOMEM, "out of memory");
    if (bias && hd > 1024) {
        free(tmp);
        return core_err(TLM_ERR_UNSUPPORTED, "head dim %d too large", hd);
    }
    for (int h = 0; h < rows / hd; h++) {
        float *blk = w + (size_t)h * hd * cols;
        float *b = bias ? bias + (size_t)h * hd : NULL;
        for (int i = 0; i < half; i++)
            for (int j = 0; j < 2; j++) {
                /* half order: row j*half + i; interleaved order: row 2i + j */
                int hrow = j * half + i, irow = 2 * i + j;
                int dst = to_interleaved ? irow : hrow, src = to_interleaved ? hrow : irow;
                memcpy(tmp + (size_t)dst * cols, blk + (size_t)src * cols, row_bytes);
                if (b) btmp[dst] = b[src];
            }
        memcpy(blk, tmp, (size_t)hd * row_bytes);
        if (b) memcpy(b, btmp, (size_t)hd * sizeof(float));
    }
    free(tmp);
    return TLM_OK;
}

const char *fmt_gemma_field(const tlm_config *c) {
    return c->attn_softcap > 0.0f    ? "attn_softcap"
           : c->final_softcap > 0.0f ? "final_softcap"
           : c->embed_scale > 0.0f   ? "embed_scale"
           : c->attn_scale > 0.0f    ? "attn_scale"
           : c->post_norms           ? "post_norms"
                                     : NULL;
}

int fmt_is_llama_style(const tlm_config *c, int qwen2_ok, int window_ok, char *why,
                       size_t why_len) {
    const char *bad = NULL, *gemma = fmt_gemma_field(c);
    char buf[160];
    if (c->norm != TLM_NORM_RMSNORM)
        bad = "norm is not rmsnorm";
    else if (c->norm_position != TLM_NORM_PRE)
        bad = "norm_position is not pre";
    else if (c->ffn != TLM_FFN_SWIGLU)
        bad = "ffn is not swiglu";
    else if (c->position != TLM_POS_ROPE)
        bad = "position is not rope";
    else if (c->bias)
        bad = "the model has biases";
    else if (c->qkv_bias && !qwen2_ok)
        bad = "the model has q, k and v biases (Qwen2's layout: GGUF and Hugging Face hold it)";
    else if (c->sliding_window && !window_ok)
        bad = "the model attends through a sliding window (sliding_window), which this format "
              "does not hold";
    else if (c->sliding_window && c->sliding_window_pattern)
        bad = "the model windows some layers only (sliding_window_pattern), which Llama's layout "
              "does not hold (Gemma 2's does)";
    else if (gemma) {
        snprintf(buf, sizeof buf,
                 "the model sets %s, which Llama's layout does not hold (Gemma 2's does)", gemma);
        bad = buf;
    }
    if (bad && why) snprintf(why, why_len, "%s", bad);
    return bad == NULL;
}

int fmt_is_gemma2_style(const tlm_config *c, int for_gguf, char *why, size_t why_len) {
    const char *bad = NULL;
    int hd = c->d_model / c->n_heads;
    float es = sqrtf((float)c->d_model), as = 1.0f / sqrtf((float)hd);
    if (c->norm != TLM_NORM_RMSNORM)
        bad = "norm is not rmsnorm";
    else if (c->norm_position != TLM_NORM_PRE || !c->post_norms)
        bad = "the norms are not pre-norm with post_norms";
    else if (c->ffn != TLM_FFN_GEGLU)
        bad = "ffn is not geglu";
    else if (c->position != TLM_POS_ROPE)
        bad = "position is not rope";
    else if (c->bias || c->qkv_bias)
        bad = "the model has biases";
    else if (!c->tie_embeddings)
        bad = "the head is not tied to the embedding";
    else if (fabsf(c->embed_scale - es) > 1e-6f * es)
        bad = "embed_scale is not sqrt(d_model)";
    else if (for_gguf && (c->attn_softcap <= 0.0f || c->final_softcap <= 0.0f))
        bad = "attn_softcap or final_softcap is 0 (llama.cpp's gemma2 caps both)";
    else if (for_gguf && c->attn_scale > 0.0f && fabsf(c->attn_scale - as) > 1e-6f * as)
        bad = "attn_scale is not 1 / sqrt(head_dim) (llama.cpp's gemma2 has no key for it)";
    if (bad && why) snprintf(why, why_len, "%s", bad);
    return bad == NULL;
}

tlm_status fmt_model_new(const tlm_config *c, const char *path, int writable, tlm_model **out) {
    *out = NULL;
    tlm_status s = mdl_new(c, writable, out);
    if (s) return core_err_context(s, "%s", path);
    return TLM_OK;
}

float *fmt_tensor(tlm_model *m, const char *name) {
    if (!m || !tlm_model_params(m)) return NULL;
    const tlm_tensor_info *t = tlm_model_find(m, name);
    return t ? tlm_model_params(m) + t->offset : NULL;
}

const float *fmt_tensor_c(const tlm_model *m, const char *name) {
    int i = mdl_index(m, name);
    return i < 0 ? NULL : mdl_wf(&m->w[i]);
}

float *fmt_layer_tensor(tlm_model *m, int layer, const char *name) {
    if (!m) return NULL;
    char n[TLM_NAME_MAX];
    snprintf(n, sizeof n, "blk.%d.%s", layer, name);
    return fmt_tensor(m, n);
}

const float *fmt_layer_tensor_c(const tlm_model *m, int layer, const char *name) {
    char n[TLM_NAME_MAX];
    snprintf(n, sizeof n, "blk.%d.%s", layer, name);
    return fmt_tensor_c(m, n);
}

tlm_status fmt_no_rope_factors(const tlm_model *m, const char *what) {
    if (!m->rope_factors) return TLM_OK;
    return core_err(TLM_ERR_UNSUPPORTED,
                    "%s: the model scales RoPE's frequencies (rope_freqs.weight, Llama 3.1's "
                    "scaling), which only GGUF holds: write GGUF",
                    what);
}

tlm_status fmt_no_experts(const tlm_model *m, const char *what) {
    if (m->c.n_experts <= 0) return TLM_OK;
    return core_err(TLM_ERR_UNSUPPORTED,
                    "%s: a mixture of experts (n_experts %d) is not supported in this format; "
                    "tlm's own safetensors (tlm train's model.safetensors) holds it",
                    what, m->c.n_experts);
}

tlm_status fmt_need_f32(const tlm_model *m, const char *what) {
    for (int i = 0; i < m->n_tensors; i++)
        if (m->w[i].dtype != TLM_DTYPE_F32)
            return core_err(TLM_ERR_UNSUPPORTED, "%s: tensor '%s' is %s; writing needs F32 weights",
                            what, m->tensors[i].name, tlm_dtype_name(m->w[i].dtype));
    return TLM_OK;
}
