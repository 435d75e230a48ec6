/* GGUF v3 writer for Llama-style models (arch `llama`), the layout llama.cpp loads:
 *   "GGUF" u32 version=3, u64 tensor count, u64 metadata count, metadata (key string, u32 type,
 *   value), tensor infos (name, u32 n_dims, u64 dims innermost first, u32 ggml type, u64 offset
 *   from the data start), padding to general.alignment, then the tensor data, each aligned.
 * Strings are u64 length + bytes. Matrices are [out, in] row-major in tlm, which is ggml's layout
 * with ne0 = in, so the data is written as it is. llama.cpp rotates adjacent pairs for `llama`,
 * so half-pairing q/k rows are reordered. The vocabulary goes in tokenizer.ggml.*: SentencePiece
 * style as `llama` (spaces as U+2581, byte tokens <0xNN>, scores), byte-level BPE as `gpt2`
 * (GPT-2's bytes-to-unicode text and merges). */
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/half.h"
#include "formats/formats.h"
#include "tokenizer/tok_internal.h"

#define GGUF_ALIGN 32

enum {
    GV_UINT8 = 0,
    GV_INT8,
    GV_UINT16,
    GV_INT16,
    GV_UINT32,
    GV_INT32,
    GV_FLOAT32,
    GV_BOOL,
    GV_STRING,
    GV_ARRAY,
    GV_UINT64,
    GV_INT64,
    GV_FLOAT64
};
enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER = 4, TT_UNUSED = 5, TT_BYTE = 6 };

/* The whole header is built in memory (the vocabulary makes it a few MB at most), then the data
 * is streamed tensor by tensor. */
typedef struct {
    uint8_t *p;
    size_t n, cap;
    int oom;
    uint64_t n_kv;
} buf;

static void put(buf *b, const void *d, size_t n) {
    if (b->oom) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n) cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}

static void put_u32(buf *b, uint32_t v) {
    uint8_t x[4];
    for (int i = 0; i < 4; i++) x[i] = (uint8_t)(v >> (8 * i));
    put(b, x, 4);
}

static void put_u64(buf *b, uint64_t v) {
    uint8_t x[8];
    for (int i = 0; i < 8; i++) x[i] = (uint8_t)(v >> (8 * i));
    put(b, x, 8);
}

static void put_f32(buf *b, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    put_u32(b, u);
}

static void put_str(buf *b, const void *s, size_t n) {
    put_u64(b, n);
    put(b, s, n);
}

static void key(buf *b, const char *k, uint32_t type) {
    put_str(b, k, strlen(k));
    put_u32(b, type);
    b->n_kv++;
}

static void kv_u32(buf *b, const char *k, uint32_t v) {
    key(b, k, GV_UINT32);
    put_u32(b, v);
}

static void kv_f32(buf *b, const char *k, float v) {
    key(b, k, GV_FLOAT32);
    put_f32(b, v);
}

static void kv_bool(buf *b, const char *k, int v) {
    key(b, k, GV_BOOL);
    uint8_t x = (uint8_t)(v != 0);
    put(b, &x, 1);
}

static void kv_str(buf *b, const char *k, const char *v) {
    key(b, k, GV_STRING);
    put_str(b, v, strlen(v));
}

static void array_head(buf *b, const char *k, uint32_t elem, uint64_t n) {
    key(b, k, GV_ARRAY);
    put_u32(b, elem);
    put_u64(b, n);
}

/* tokenizer.ggml.* for SentencePiece-style and byte-level BPE vocabularies. */
static tlm_status put_vocab(buf *b, const tlm_tokenizer *t) {
    int32_t n = t->n;
    tok_bytes tmp = {0};
    tlm_status s = TLM_OK;
    int spm = t->kind == TLM_TOKENIZER_SPM;
    if (t->kind == TLM_TOKENIZER_CHAR)
        return tlm_err(TLM_ERR_UNSUPPORTED,
                       "GGUF has no char-level vocabulary type (use a BPE tokenizer)");
    kv_str(b, "tokenizer.ggml.model", spm ? "llama" : "gpt2");
    if (!spm) kv_str(b, "tokenizer.ggml.pre", "gpt-2");
    array_head(b, "tokenizer.ggml.tokens", GV_STRING, (uint64_t)n);
    for (int32_t i = 0; i < n && !s; i++) {
        size_t len;
        const uint8_t *p = tok_piece(t, i, &len);
        tmp.n = 0;
        if (t->attr[i] == TOK_SPECIAL) {
            s = tok_bytes_put(&tmp, p, len);
        } else if (spm && t->attr[i] == TOK_BYTE) {
            char hex[8];
            snprintf(hex, sizeof hex, "<0x%02X>", p[0]);
            s = tok_bytes_put(&tmp, hex, 6);
        } else if (spm) {
            for (size_t k = 0; k < len && !s; k++)
                s = p[k] == ' ' ? tok_bytes_put(&tmp, "\xE2\x96\x81", 3)
                                : tok_bytes_put(&tmp, p + k, 1);
        } else {
            s = tok_gpt2_map(&tmp, p, len);
        }
        if (!s) put_str(b, tmp.p, tmp.n);
    }
    if (spm && !s) {
        array_head(b, "tokenizer.ggml.scores", GV_FLOAT32, (uint64_t)n);
        for (int32_t i = 0; i < n; i++) put_f32(b, t->scores ? t->scores[i] : 0.0f);
    }
    array_head(b, "tokenizer.ggml.token_type", GV_INT32, (uint64_t)n);
    for (int32_t i = 0; i < n; i++) {
        uint32_t tt = TT_NORMAL;
        if (t->attr[i] == TOK_SPECIAL) tt = i == t->unk ? TT_UNKNOWN : TT_CONTROL;
        if (t->attr[i] == TOK_BYTE) tt = TT_BYTE;
        if (t->attr[i] == TOK_UNUSED) tt = TT_UNUSED;
        put_u32(b, tt);
    }
    if (!spm && !s) {
        array_head(b, "tokenizer.ggml.merges", GV_STRING, (uint64_t)t->n_merges);
        for (int32_t r = 0; r < t->n_merges && !s; r++) {
            size_t la, lb;
            const uint8_t *pa = tok_piece(t, t->merge_list[r][0], &la);
            const uint8_t *pb = tok_piece(t, t->merge_list[r][1], &lb);
            tmp.n = 0;
            s = tok_gpt2_map(&tmp, pa, la);
            if (!s) s = tok_bytes_put(&tmp, " ", 1);
            if (!s) s = tok_gpt2_map(&tmp, pb, lb);
            if (!s) put_str(b, tmp.p, tmp.n);
        }
    }
    if (t->bos >= 0) kv_u32(b, "tokenizer.ggml.bos_token_id", (uint32_t)t->bos);
    if (t->eos >= 0) kv_u32(b, "tokenizer.ggml.eos_token_id", (uint32_t)t->eos);
    if (t->unk >= 0) kv_u32(b, "tokenizer.ggml.unknown_token_id", (uint32_t)t->unk);
    /* SentencePiece models start from BOS; byte-level BPE ones (GPT-2 style) do not. */
    kv_bool(b, "tokenizer.ggml.add_bos_token", spm && t->bos >= 0);
    kv_bool(b, "tokenizer.ggml.add_eos_token", 0);
    free(tmp.p);
    return s;
}

static size_t pad_to(size_t n) { return (n + GGUF_ALIGN - 1) / GGUF_ALIGN * GGUF_ALIGN; }

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
    if (tok && tok->n != c->vocab_size)
        return tlm_err(TLM_ERR_ARG, "tokenizer has %d tokens but the model's vocab_size is %d",
                       (int)tok->n, c->vocab_size);
    int hd = c->d_model / c->n_heads;
    buf kv = {0}, ti = {0};
    kv_str(&kv, "general.architecture", "llama");
    kv_str(&kv, "general.name", "tlm");
    kv_u32(&kv, "general.alignment", GGUF_ALIGN);
    kv_u32(&kv, "general.file_type", dtype == TLM_DTYPE_F32 ? 0 : dtype == TLM_DTYPE_F16 ? 1 : 32);
    kv_u32(&kv, "llama.context_length", (uint32_t)c->context_length);
    kv_u32(&kv, "llama.embedding_length", (uint32_t)c->d_model);
    kv_u32(&kv, "llama.block_count", (uint32_t)c->n_layers);
    kv_u32(&kv, "llama.feed_forward_length", (uint32_t)c->d_ff);
    kv_u32(&kv, "llama.attention.head_count", (uint32_t)c->n_heads);
    kv_u32(&kv, "llama.attention.head_count_kv", (uint32_t)c->n_kv_heads);
    kv_f32(&kv, "llama.attention.layer_norm_rms_epsilon", c->norm_eps);
    kv_f32(&kv, "llama.rope.freq_base", c->rope_theta);
    kv_u32(&kv, "llama.rope.dimension_count", (uint32_t)hd);
    kv_u32(&kv, "llama.vocab_size", (uint32_t)c->vocab_size);
    tlm_status s = tok ? put_vocab(&kv, tok) : TLM_OK;
    if (s) {
        free(kv.p);
        return s;
    }
    /* Tensor infos in schema order; offsets from the data start. */
    size_t off = 0, max_numel = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const tlm_tensor_info *t = &m->tensors[i];
        put_str(&ti, t->name, strlen(t->name));
        put_u32(&ti, (uint32_t)t->ndim);
        if (t->ndim == 2) {
            put_u64(&ti, (uint64_t)t->shape[1]);
            put_u64(&ti, (uint64_t)t->shape[0]);
        } else {
            put_u64(&ti, (uint64_t)t->shape[0]);
        }
        tlm_dtype ty = tensor_type(t, dtype);
        put_u32(&ti, (uint32_t)tlm_dtype_get(ty)->ggml);
        put_u64(&ti, off);
        off = pad_to(off + t->numel * type_size(ty));
        if (t->numel > max_numel) max_numel = t->numel;
    }
    buf head = {0};
    put(&head, "GGUF", 4);
    put_u32(&head, 3);
    put_u64(&head, (uint64_t)m->n_tensors);
    put_u64(&head, kv.n_kv);
    put(&head, kv.p, kv.n);
    put(&head, ti.p, ti.n);
    size_t hpad = pad_to(head.n) - head.n;
    static const uint8_t zeros[GGUF_ALIGN];
    put(&head, zeros, hpad);
    free(kv.p);
    free(ti.p);
    float *scratch = malloc(max_numel * sizeof(float));
    uint16_t *half = malloc(max_numel * sizeof(uint16_t));
    if (head.oom || kv.oom || ti.oom || !scratch || !half) {
        free(head.p);
        free(scratch);
        free(half);
        return tlm_err(TLM_ERR_NOMEM, "out of memory");
    }
    tlm_atomic_file a;
    s = tlm_atomic_open(&a, path);
    if (!s) s = tlm_atomic_write(&a, head.p, head.n);
    free(head.p);
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
        if (!s && pad_to(bytes) > bytes) s = tlm_atomic_write(&a, zeros, pad_to(bytes) - bytes);
    }
    free(scratch);
    free(half);
    if (s) {
        tlm_atomic_abort(&a);
        return tlm_err_context(s, "writing %s", path);
    }
    return tlm_atomic_commit(&a);
}
