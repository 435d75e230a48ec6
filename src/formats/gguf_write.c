/* GGUF v3 writer for Llama-style models (arch `llama`, `qwen2`) and Gemma 2 (`gemma2`), the
 * layouts llama.cpp loads:
 *   "GGUF" u32 version=3, u64 tensor count, u64 metadata count, metadata (key string, u32 type,
 *   value), tensor infos (name, u32 n_dims, u64 dims innermost first, u32 ggml type, u64 offset
 *   from the data start), padding to general.alignment, then the tensor data, each aligned.
 * Strings are u64 length + bytes. Matrices are [out, in] row-major in tlm, which is ggml's layout
 * with ne0 = in, so the data is written as it is. llama.cpp rotates adjacent pairs for `llama`
 * and halves for `qwen2` and `gemma2`, so q/k rows of the other pairing are reordered. Gemma's
 * norms scale by 1 + w, which llama.cpp's converter stores as one weight: tlm's norm weight. The
 * vocabulary goes in tokenizer.ggml.*, written by the tokenizer (tokenizer/tok_gguf.h); the
 * container itself by io/gguf_writer.h.
 *
 * Quantized files (tlm_model_quantize_gguf) follow llama-quantize: its per-tensor types, its
 * tensor order and its keys, so that quantizing a tlm-written F32 GGUF with either tool gives the
 * same file. The metadata is always tlm's own: from a GGUF written elsewhere, keys tlm does not
 * model (chat templates, names) are not carried over, unlike llama-quantize, which copies them. */
#include <errno.h>
#include <regex.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "formats/formats.h"
#include "io/gguf_writer.h"
#include "kernels/qdot.h"
#include "tokenizer/tok_gguf.h"

#define GGUF_ALIGN 32
#define GGML_QNT_VERSION 2 /* general.quantization_version of the current block layouts */

/* What a GGUF file holds beyond the model: each schema tensor's type, the order the tensors are
 * written in, and how general.file_type is recorded. */
typedef struct {
    const tlm_dtype *types; /* [n_tensors] in schema order */
    const int *order;       /* [n_tensors] schema indices in file order */
    uint32_t file_type;
    /* llama-quantize's key layout: general.file_type moves to the end, after
     * general.quantization_version (it removes and re-appends the keys it sets). */
    int quantized_layout;
    const tlm_quantize_opts *progress; /* may be NULL */
    int n_order;                       /* tensors written: order[0 .. n_order) */
    const int *new_layer; /* NULL, or per layer its number in the file, -1 where pruned */
    int n_layers;         /* the file's block count */
} gguf_plan;

static int tensor_layer(const char *name);
static int llama_before(const char *a, const char *b);

#define ROPE_FREQS "rope_freqs.weight"

/* Where rope_freqs.weight (a model's RoPE frequency factors, Llama 3.1's scaling) goes among the
 * tensors written, in llama.cpp's order; -1 for a model without one. */
static int rope_slot(const tlm_model *m, const gguf_plan *plan) {
    if (!m->rope_factors) return -1;
    int k = 0;
    while (k < plan->n_order && !llama_before(ROPE_FREQS, m->tensors[plan->order[k]].name)) k++;
    return k;
}

/* A block tensor's name with its layer renumbered as plan->new_layer says (llama-quantize
 * --prune-layers); other names as they are. */
static const char *file_name(const gguf_plan *plan, const char *name, char *buf, size_t cap) {
    int l = tensor_layer(name);
    if (!plan->new_layer || l < 0 || plan->new_layer[l] == l) return name;
    snprintf(buf, cap, "blk.%d%s", plan->new_layer[l], strchr(name + 4, '.'));
    return buf;
}

tlm_status tlm_kv_override_parse(const char *spec, tlm_kv_override *out) {
    memset(out, 0, sizeof *out);
    const char *eq = spec ? strchr(spec, '=') : NULL;
    if (!eq || eq == spec || eq - spec >= (ptrdiff_t)sizeof out->key)
        return core_err(TLM_ERR_ARG,
                        "override '%s': want KEY=TYPE:VALUE with a key of 1 to 127 bytes "
                        "(TYPE int, float, bool or str)",
                        spec ? spec : "");
    memcpy(out->key, spec, (size_t)(eq - spec));
    const char *v = eq + 1;
    char *end = NULL;
    if (!strncmp(v, "int:", 4)) {
        out->type = TLM_KV_INT;
        errno = 0;
        long long x = strtoll(v + 4, &end, 10);
        if (end == v + 4 || *end || errno)
            return core_err(TLM_ERR_ARG, "override '%s': '%s' is not an integer", spec, v + 4);
        out->i = x;
    } else if (!strncmp(v, "float:", 6)) {
        out->type = TLM_KV_FLOAT;
        out->f = strtod(v + 6, &end);
        if (end == v + 6 || *end)
            return core_err(TLM_ERR_ARG, "override '%s': '%s' is not a number", spec, v + 6);
    } else if (!strncmp(v, "bool:", 5)) {
        out->type = TLM_KV_BOOL;
        if (strcmp(v + 5, "true") && strcmp(v + 5, "false"))
            return core_err(TLM_ERR_ARG, "override '%s': a bool is true or false", spec);
        out->b = !strcmp(v + 5, "true");
    } else if (!strncmp(v, "str:", 4)) {
        out->type = TLM_KV_STR;
        if (strlen(v + 4) >= sizeof out->str)
            return core_err(TLM_ERR_ARG, "override '%s': a string holds at most 127 bytes", spec);
        strcpy(out->str, v + 4);
    } else {
        return core_err(TLM_ERR_ARG, "override '%s': TYPE must be int, float, bool or str", spec);
    }
    return TLM_OK;
}

/* One llama-quantize override: the key removed, then set again at the end, in the types that
 * llama_model_quantize gives them (an int as U32 of its magnitude: llama.cpp PR 14182). */
static tlm_status put_override(io_gguf_writer *w, const tlm_kv_override *o) {
    io_gguf_writer_remove(w, o->key);
    switch (o->type) {
    case TLM_KV_INT:
        return io_gguf_write_u32(w, o->key,
                                 (uint32_t)(o->i < 0 ? -(uint64_t)o->i : (uint64_t)o->i));
    case TLM_KV_FLOAT: return io_gguf_write_f32(w, o->key, (float)o->f);
    case TLM_KV_BOOL: return io_gguf_write_bool(w, o->key, o->b);
    default: return io_gguf_write_str(w, o->key, o->str);
    }
}

static tlm_status write_gguf(const tlm_model *m, const tlm_tokenizer *tok, const char *path,
                             const gguf_plan *plan) {
    const tlm_config *c = &m->c;
    char why[160];
    /* Llama's layout (with Mistral's window), Qwen2's (Llama with q, k and v biases, rotating
     * halves as trained) or Gemma 2's */
    int gemma2 = fmt_is_gemma2_style(c, 1, NULL, 0);
    if (!gemma2 && fmt_gemma_field(c)) {
        fmt_is_gemma2_style(c, 1, why, sizeof why);
        return core_err(TLM_ERR_UNSUPPORTED, "GGUF export as gemma2: %s", why);
    }
    if (!gemma2 && !fmt_is_llama_style(c, 1, 1, why, sizeof why))
        return core_err(TLM_ERR_UNSUPPORTED,
                        "GGUF export supports Llama-style and Gemma 2-style models: %s", why);
    int qwen2 = !gemma2 && c->qkv_bias; /* no other bias past the checks */
    if (qwen2 && c->rope_pairing != TLM_ROPE_HALF)
        return core_err(TLM_ERR_UNSUPPORTED,
                        "GGUF export: a model with q, k and v biases is written as qwen2, which "
                        "rotates halves (rope_pairing half), not interleaved pairs");
    if (qwen2 && c->sliding_window)
        return core_err(TLM_ERR_UNSUPPORTED,
                        "GGUF export: qwen2 with a sliding window (llama.cpp's qwen2 has none)");
    const char *arch = gemma2 ? "gemma2" : qwen2 ? "qwen2" : "llama";
    /* llama.cpp rotates halves (NEOX) for qwen2 and gemma2, adjacent pairs for llama */
    int neox = qwen2 || gemma2;
    char key[96];
#define ARCH_KEY(k) (snprintf(key, sizeof key, "%s.%s", arch, k), key)
    tlm_status fs = fmt_no_experts(m, "GGUF export");
    if (!fs) fs = fmt_need_f32(m, "GGUF export");
    if (fs) return fs;
    if (tok && tlm_tokenizer_vocab_size(tok) != c->vocab_size)
        return core_err(TLM_ERR_ARG, "tokenizer has %d tokens but the model's vocab_size is %d",
                        (int)tlm_tokenizer_vocab_size(tok), c->vocab_size);
    int hd = c->d_model / c->n_heads;
    io_gguf_writer w;
    io_gguf_writer_init(&w, GGUF_ALIGN);
    io_gguf_write_str(&w, "general.architecture", arch);
    io_gguf_write_str(&w, "general.name", "tlm");
    io_gguf_write_u32(&w, "general.alignment", GGUF_ALIGN);
    if (!plan->quantized_layout) io_gguf_write_u32(&w, "general.file_type", plan->file_type);
    io_gguf_write_u32(&w, ARCH_KEY("context_length"), (uint32_t)c->context_length);
    io_gguf_write_u32(&w, ARCH_KEY("embedding_length"), (uint32_t)c->d_model);
    io_gguf_write_u32(&w, ARCH_KEY("block_count"), (uint32_t)plan->n_layers);
    io_gguf_write_u32(&w, ARCH_KEY("feed_forward_length"), (uint32_t)c->d_ff);
    io_gguf_write_u32(&w, ARCH_KEY("attention.head_count"), (uint32_t)c->n_heads);
    io_gguf_write_u32(&w, ARCH_KEY("attention.head_count_kv"), (uint32_t)c->n_kv_heads);
    io_gguf_write_f32(&w, ARCH_KEY("attention.layer_norm_rms_epsilon"), c->norm_eps);
    io_gguf_write_f32(&w, ARCH_KEY("rope.freq_base"), c->rope_theta);
    io_gguf_write_u32(&w, ARCH_KEY("rope.dimension_count"), (uint32_t)hd);
    tlm_status s = io_gguf_write_u32(&w, ARCH_KEY("vocab_size"), (uint32_t)c->vocab_size);
    if (gemma2) {
        io_gguf_write_u32(&w, ARCH_KEY("attention.key_length"), (uint32_t)hd);
        io_gguf_write_u32(&w, ARCH_KEY("attention.value_length"), (uint32_t)hd);
        io_gguf_write_f32(&w, ARCH_KEY("attn_logit_softcapping"), c->attn_softcap);
        io_gguf_write_f32(&w, ARCH_KEY("final_logit_softcapping"), c->final_softcap);
        /* llama.cpp reads a missing window as 4096 and a missing pattern as 2; a pattern of 1
         * makes every layer global */
        int win = c->sliding_window ? c->sliding_window : c->context_length;
        io_gguf_write_u32(&w, ARCH_KEY("attention.sliding_window"), (uint32_t)win);
        s = io_gguf_write_u32(&w, ARCH_KEY("attention.sliding_window_pattern"),
                              c->sliding_window ? (uint32_t)c->sliding_window_pattern : 1u);
    } else if (c->sliding_window) {
        /* Mistral's window: llama.cpp's llama ignores the key (it attends over the whole
         * context), tlm reads it back */
        s = io_gguf_write_u32(&w, ARCH_KEY("attention.sliding_window"),
                              (uint32_t)c->sliding_window);
    }
    if (!s && tok) s = tok_gguf_write_vocab(&w, tok);
    const tlm_imatrix *im = plan->progress ? plan->progress->imatrix : NULL;
    if (!s && plan->quantized_layout) {
        io_gguf_write_u32(&w, "general.quantization_version", GGML_QNT_VERSION);
        s = io_gguf_write_u32(&w, "general.file_type", plan->file_type);
        const tlm_quantize_opts *qo = plan->progress;
        for (int k = 0; !s && k < qo->n_kv_overrides; k++)
            s = put_override(&w, &qo->kv_overrides[k]);
        /* llama-quantize --imatrix records it in these keys (its kv overrides after the user's,
         * in this order) */
        if (!s && im && tlm_imatrix_entries(im)) {
            tlm_kv_override o[4];
            int n = 0;
            memset(o, 0, sizeof o);
            /* its overrides hold at most 127 bytes of each string */
            snprintf(o[n].key, sizeof o[n].key, "quantize.imatrix.file");
            o[n].type = TLM_KV_STR;
            snprintf(o[n++].str, sizeof o->str, "%s", tlm_imatrix_path(im));
            if (tlm_imatrix_dataset(im)) {
                snprintf(o[n].key, sizeof o[n].key, "quantize.imatrix.dataset");
                o[n].type = TLM_KV_STR;
                snprintf(o[n++].str, sizeof o->str, "%s", tlm_imatrix_dataset(im));
            }
            snprintf(o[n].key, sizeof o[n].key, "quantize.imatrix.entries_count");
            o[n].type = TLM_KV_INT;
            o[n++].i = tlm_imatrix_entries(im);
            if (tlm_imatrix_chunks(im) > 0) {
                snprintf(o[n].key, sizeof o[n].key, "quantize.imatrix.chunks_count");
                o[n].type = TLM_KV_INT;
                o[n++].i = tlm_imatrix_chunks(im);
            }
            for (int k = 0; !s && k < n; k++) s = put_override(&w, &o[k]);
        }
        /* set last by llama-quantize, so moved to the end */
        if (!s && qo->n_prune_layers) {
            io_gguf_writer_remove(&w, ARCH_KEY("block_count"));
            s = io_gguf_write_u32(&w, key, (uint32_t)plan->n_layers);
        }
    }
    size_t max_numel = 0;
    char fname[160];
    int rope_at = rope_slot(m, plan), half = c->d_model / c->n_heads / 2;
    for (int k = 0; k <= plan->n_order && !s; k++) {
        if (k == rope_at) {
            uint64_t rd[1] = {(uint64_t)half};
            s = io_gguf_write_tensor(&w, ROPE_FREQS, 1, rd, 0 /* F32 */, sizeof(float) * half);
        }
        if (k == plan->n_order || s) break;
        int i = plan->order[k];
        const tlm_tensor_info *t = &m->tensors[i];
        uint64_t dims[2] = {(uint64_t)t->shape[t->ndim - 1], (uint64_t)t->shape[0]};
        tlm_dtype ty = plan->types[i];
        size_t bytes = core_dtype_bytes(ty, t->numel);
        if (!bytes)
            s = core_err(TLM_ERR_ARG, "tensor '%s': %zu columns are not whole %s blocks", t->name,
                         (size_t)dims[0], tlm_dtype_name(ty));
        else
            s = io_gguf_write_tensor(&w, file_name(plan, t->name, fname, sizeof fname),
                                     (uint32_t)t->ndim, dims, (uint32_t)core_dtype_get(ty)->ggml,
                                     bytes);
        if (t->numel > max_numel) max_numel = t->numel;
    }
    uint8_t *head = NULL;
    size_t head_len = 0;
    if (!s) s = io_gguf_writer_header(&w, &head, &head_len);
    if (s) {
        io_gguf_writer_free(&w);
        return s;
    }
    /* Every type is at most 4 bytes an element, so one F32-sized buffer holds any output. */
    float *scratch = malloc(max_numel * sizeof(float));
    uint8_t *out = malloc(max_numel * sizeof(float));
    if (!scratch || !out) {
        io_gguf_writer_free(&w);
        free(head);
        free(scratch);
        free(out);
        return core_err(TLM_ERR_NOMEM, "out of memory");
    }
    core_atomic_file a;
    s = core_atomic_open(&a, path);
    if (!s) s = core_atomic_write(&a, head, head_len);
    free(head);
    const tlm_quantize_opts *p = plan->progress;
    int n_out = plan->n_order + (rope_at >= 0);
    static const uint8_t zeros[GGUF_ALIGN];
    for (int k = 0; k <= plan->n_order && !s; k++) {
        if (k == rope_at) {
            size_t bytes = sizeof(float) * (size_t)half, pad = io_gguf_writer_pad(&w, bytes);
            if (p && p->progress) p->progress(p->user, k, n_out, ROPE_FREQS, TLM_DTYPE_F32, bytes);
            s = core_atomic_write(&a, m->rope_factors, bytes);
            if (!s && pad) s = core_atomic_write(&a, zeros, pad);
        }
        if (k == plan->n_order || s) break;
        int i = plan->order[k];
        const tlm_tensor_info *t = &m->tensors[i];
        const float *src = mdl_wf(&m->w[i]);
        int is_q = strstr(t->name, ".attn_q.weight") != NULL;
        int is_k = strstr(t->name, ".attn_k.weight") != NULL;
        if ((is_q || is_k) && (c->rope_pairing == TLM_ROPE_HALF) != neox) {
            memcpy(scratch, src, t->numel * sizeof(float));
            s = fmt_permute_qk(scratch, NULL, (int)t->shape[0], (int)t->shape[1], hd, !neox);
            src = scratch;
        }
        tlm_dtype ty = plan->types[i];
        size_t bytes = core_dtype_bytes(ty, t->numel);
        if (p && p->progress)
            p->progress(p->user, k + (rope_at >= 0 && k >= rope_at), n_out,
                        file_name(plan, t->name, fname, sizeof fname), ty, bytes);
        if (!s && ty == TLM_DTYPE_F32) {
            s = core_atomic_write(&a, src, bytes);
        } else if (!s) {
            /* Rows are independent and the quantizers pure: threads change nothing in the bytes. */
            size_t rows = t->ndim == 2 ? (size_t)t->shape[0] : 1, cols = t->numel / rows;
            size_t row_bytes = bytes / rows;
            tlm_status rs = TLM_OK;
            size_t nw = 0;
            const float *qw = tlm_imatrix_find(im, t->name, &nw);
            if (qw && nw != cols) {
                /* llama-quantize fails here too (a mismatched matrix would quantize most of the
                 * model without one, unnoticed); a token embedding's entry it ignores */
                if (strcmp(t->name, "token_embd.weight")) {
                    s = core_err(TLM_ERR_ARG,
                                 "the importance matrix has %zu values for '%s', which has %zu "
                                 "columns",
                                 nw, t->name, cols);
                    break;
                }
                qw = NULL;
            }
#pragma omp parallel for schedule(dynamic, 16) if (t->numel >= 65536)
            for (size_t r = 0; r < rows; r++) {
                /* the kernels' vector quantizers where they have one (IQ4), the same bytes */
                tlm_status e =
                    k_quantize_rows(ty, src + r * cols, out + r * row_bytes, 1, cols, qw);
                if (e) {
#pragma omp critical
                    rs = e;
                }
            }
            s = rs ? core_err_context(rs, "tensor '%s'", t->name) : TLM_OK;
            if (!s) s = core_atomic_write(&a, out, bytes);
        }
        size_t pad = io_gguf_writer_pad(&w, bytes);
        if (!s && pad) s = core_atomic_write(&a, zeros, pad);
    }
    io_gguf_writer_free(&w);
    free(scratch);
    free(out);
    if (s) {
        core_atomic_abort(&a);
        return core_err_context(s, "writing %s", path);
    }
    return core_atomic_commit(&a);
}

#undef ARCH_KEY

tlm_status tlm_model_save_gguf(const tlm_model *m, const tlm_tokenizer *tok, const char *path,
                               tlm_dtype dtype) {
    if (dtype != TLM_DTYPE_F32 && dtype != TLM_DTYPE_F16 && dtype != TLM_DTYPE_BF16)
        return core_err(TLM_ERR_UNSUPPORTED,
                        "GGUF export writes F32, F16 or BF16, not %s (tlm_model_quantize_gguf "
                        "writes quantized types)",
                        tlm_dtype_name(dtype));
    tlm_dtype *types = malloc(sizeof *types * (size_t)m->n_tensors);
    int *order = malloc(sizeof *order * (size_t)m->n_tensors);
    if (!types || !order) {
        free(types);
        free(order);
        return core_err(TLM_ERR_NOMEM, "out of memory");
    }
    /* Vectors stay F32 (llama.cpp's converters keep norms F32 and its CPU kernels expect them so);
     * tensors go in schema order, which keeps q, k, v adjacent for stacked views. */
    for (int i = 0; i < m->n_tensors; i++) {
        types[i] = m->tensors[i].ndim == 1 ? TLM_DTYPE_F32 : dtype;
        order[i] = i;
    }
    gguf_plan plan = {
        types, order,        dtype == TLM_DTYPE_F32 ? 0 : dtype == TLM_DTYPE_F16 ? 1 : 32,
        0,     NULL,         m->n_tensors,
        NULL,  m->c.n_layers};
    tlm_status s = write_gguf(m, tok, path, &plan);
    free(types);
    free(order);
    return s;
}

/* ---- tlm_model_quantize_gguf: llama-quantize's choices (src/llama-quant.cpp) --------------- */

static const struct {
    const char *name;
    tlm_ftype ftype;
    tlm_dtype base; /* the type of most matrices */
} ftypes[] = {
    {"f32", TLM_FTYPE_F32, TLM_DTYPE_F32},          {"f16", TLM_FTYPE_F16, TLM_DTYPE_F16},
    {"bf16", TLM_FTYPE_BF16, TLM_DTYPE_BF16},       {"q8_0", TLM_FTYPE_Q8_0, TLM_DTYPE_Q8_0},
    {"q4_0", TLM_FTYPE_Q4_0, TLM_DTYPE_Q4_0},       {"q4_1", TLM_FTYPE_Q4_1, TLM_DTYPE_Q4_1},
    {"q5_0", TLM_FTYPE_Q5_0, TLM_DTYPE_Q5_0},       {"q5_1", TLM_FTYPE_Q5_1, TLM_DTYPE_Q5_1},
    {"q2_k", TLM_FTYPE_Q2_K, TLM_DTYPE_Q2_K},       {"q3_k_s", TLM_FTYPE_Q3_K_S, TLM_DTYPE_Q3_K},
    {"q3_k_m", TLM_FTYPE_Q3_K_M, TLM_DTYPE_Q3_K},   {"q3_k_l", TLM_FTYPE_Q3_K_L, TLM_DTYPE_Q3_K},
    {"q4_k_s", TLM_FTYPE_Q4_K_S, TLM_DTYPE_Q4_K},   {"q4_k_m", TLM_FTYPE_Q4_K_M, TLM_DTYPE_Q4_K},
    {"q5_k_s", TLM_FTYPE_Q5_K_S, TLM_DTYPE_Q5_K},   {"q5_k_m", TLM_FTYPE_Q5_K_M, TLM_DTYPE_Q5_K},
    {"q6_k", TLM_FTYPE_Q6_K, TLM_DTYPE_Q6_K},       {"iq4_nl", TLM_FTYPE_IQ4_NL, TLM_DTYPE_IQ4_NL},
    {"iq4_xs", TLM_FTYPE_IQ4_XS, TLM_DTYPE_IQ4_XS},
};
#define N_FTYPES (int)(sizeof ftypes / sizeof *ftypes)

static int ftype_index(tlm_ftype f) {
    for (int i = 0; i < N_FTYPES; i++)
        if (ftypes[i].ftype == f) return i;
    return -1;
}

tlm_status tlm_ftype_parse(const char *name, tlm_ftype *out) {
    if (!name || !out) return core_err(TLM_ERR_ARG, "ftype: NULL argument");
    for (int i = 0; i < N_FTYPES; i++) {
        const char *a = ftypes[i].name, *b = name;
        while (*a && *b && (*b == *a || *b == *a - 'a' + 'A')) a++, b++;
        if (!*a && !*b) {
            *out = ftypes[i].ftype;
            return TLM_OK;
        }
    }
    return core_err(TLM_ERR_ARG, "unknown file type '%s' (q8_0, q4_k_m, f16, ...: see tlm_ftype)",
                    name);
}

const char *tlm_ftype_name(tlm_ftype f) {
    int i = ftype_index(f);
    return i < 0 ? "?" : ftypes[i].name;
}

static int is_quantized(tlm_dtype t) { return core_dtype_get(t)->block_elems > 1; }

/* The types a file's matrices may be given (F32, F16, BF16 and the block types). */
static tlm_status quantizable_type(tlm_dtype t, const char *what) {
    const core_dtype_info *d = core_dtype_get(t);
    if (!d || !d->is_float || t == TLM_DTYPE_F64)
        return core_err(TLM_ERR_ARG, "%s type must be F32, F16, BF16 or a block type, not %s", what,
                        d ? d->name : "an unknown type");
    return TLM_OK;
}

/* llama.cpp's choice of extra bits for some layers of the _M mixes: the first and last eighth and
 * every third layer between. */
static int use_more_bits(int i_layer, int n_layers) {
    return i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 ||
           (i_layer - n_layers / 8) % 3 == 2;
}

static int ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && !strcmp(s + n - k, suf);
}

/* llama.cpp's tensor order in files it writes: by layer (tensors outside the blocks first), then
 * by name. */
static int tensor_layer(const char *name) {
    int l = -1;
    if (!strncmp(name, "blk.", 4)) {
        char *end;
        long v = strtol(name + 4, &end, 10);
        if (end != name + 4 && *end == '.') l = (int)v;
    }
    return l;
}

/* 1 if tensor a goes before b in llama.cpp's order. */
static int llama_before(const char *a, const char *b) {
    int la = tensor_layer(a), lb = tensor_layer(b);
    return la != lb ? la < lb : strcmp(a, b) < 0;
}

/* Types for every tensor in file order, as llama_tensor_get_type decides them for arch llama
 * without overrides, with an importance matrix or without. */
static tlm_status choose_types(const tlm_model *m, const int *order, int n,
                               const tlm_quantize_opts *o, tlm_dtype base, tlm_dtype *types) {
    tlm_ftype ftype = o->ftype;
    int imatrix = o->imatrix && tlm_imatrix_entries(o->imatrix) > 0;
    regex_t *re = NULL;
    if (o->n_tensor_types > 0) {
        re = calloc((size_t)o->n_tensor_types, sizeof *re);
        if (!re) return core_err(TLM_ERR_NOMEM, "out of memory");
    }
    tlm_status s = TLM_OK;
    int compiled = 0;
    for (; compiled < o->n_tensor_types && !s; compiled++) {
        const tlm_tensor_type *tt = &o->tensor_types[compiled];
        if (!tt->pattern || regcomp(&re[compiled], tt->pattern, REG_EXTENDED | REG_NOSUB)) {
            s = core_err(TLM_ERR_ARG, "tensor type pattern '%s' is not a regular expression",
                         tt->pattern ? tt->pattern : "(null)");
            break;
        }
        if ((s = quantizable_type(tt->type, "a --tensor-type")) != TLM_OK) {
            compiled++;
            break;
        }
    }
    if (!s && o->output_type_set) s = quantizable_type(o->output_type, "--output-tensor-type");
    if (!s && o->embd_type_set) s = quantizable_type(o->embd_type, "--token-embedding-type");
    if (s) {
        for (int k = 0; k < compiled; k++) regfree(&re[k]);
        free(re);
        return s;
    }
    const tlm_config *c = &m->c;
    /* Over the tensors written (pruned layers left out) but, for ffn_down, the model's layer
     * count: llama.cpp counts the attn_v tensors it writes and takes n_layer from the input. */
    int n_attn_v = 0, i_attn_v = 0, i_ffn_down = 0, tied = 1;
    for (int k = 0; k < n; k++) {
        if (strstr(m->tensors[order[k]].name, "attn_v.weight")) n_attn_v++;
        if (!strcmp(m->tensors[order[k]].name, "output.weight")) tied = 0;
    }
    /* llama.cpp calls an 80-layer llama with grouped-query attention "70B" and gives its small
     * attn_v more bits. */
    int is_70b = c->n_layers == 80 && c->n_heads != c->n_kv_heads;
    for (int k = 0; k < n; k++) {
        int i = order[k];
        const tlm_tensor_info *t = &m->tensors[i];
        const char *name = t->name;
        tlm_dtype ty = base;
        int is_output = !strcmp(name, "output.weight");
        int is_embd = !strcmp(name, "token_embd.weight");
        if (t->ndim < 2 || !ends_with(name, "weight") || strstr(name, "_norm.weight") ||
            (is_output && o->leave_output)) {
            types[i] = TLM_DTYPE_F32; /* as the F32 source holds it: llama.cpp copies these */
            continue;
        }
        /* llama_tensor_get_type: the two overrides taken as given, before anything else */
        if (is_embd && o->embd_type_set) {
            types[i] = o->embd_type;
            continue;
        }
        if (is_output && o->output_type_set) {
            types[i] = o->output_type;
            continue;
        }
        if (!is_quantized(base)) {
            types[i] = base;
            continue;
        }
        int64_t ncols = t->shape[1];
        int manual = 0;
        for (int r = 0; r < o->n_tensor_types && !manual; r++)
            if (!regexec(&re[r], name, 0, NULL, 0)) {
                ty = o->tensor_types[r].type;
                manual = 1;
            }
        if (manual || o->pure) {
            /* the mix (and its layer counts) skipped for this tensor, as llama.cpp does */
        } else if (is_output || (tied && is_embd)) {
            if (o->output_type_set)
                ty = o->output_type; /* a tied embedding, under the mix */
            else if (ncols % core_dtype_get(base)->block_elems)
                ty = TLM_DTYPE_Q8_0;
            else if (base != TLM_DTYPE_Q8_0)
                ty = TLM_DTYPE_Q6_K;
        } else if (is_embd) {
            /* the base type */
        } else if (strstr(name, "attn_v.weight")) {
            if (ftype == TLM_FTYPE_Q2_K)
                ty = c->n_heads / c->n_kv_heads >= 4 ? TLM_DTYPE_Q4_K : TLM_DTYPE_Q3_K;
            else if (ftype == TLM_FTYPE_Q3_K_M)
                ty = i_attn_v < 2 ? TLM_DTYPE_Q5_K : TLM_DTYPE_Q4_K;
            else if (ftype == TLM_FTYPE_Q3_K_L)
                ty = TLM_DTYPE_Q5_K;
            else if ((ftype == TLM_FTYPE_IQ4_NL || ftype == TLM_FTYPE_IQ4_XS) &&
                     c->n_heads / c->n_kv_heads >= 4)
                ty = TLM_DTYPE_Q5_K;
            else if ((ftype == TLM_FTYPE_Q4_K_M || ftype == TLM_FTYPE_Q5_K_M) &&
                     use_more_bits(i_attn_v, n_attn_v))
                ty = TLM_DTYPE_Q6_K;
            else if (ftype == TLM_FTYPE_Q4_K_S && i_attn_v < 4)
                ty = TLM_DTYPE_Q5_K;
            if (is_70b && (ty == TLM_DTYPE_Q3_K || ty == TLM_DTYPE_Q4_K)) ty = TLM_DTYPE_Q5_K;
            i_attn_v++;
        } else if (strstr(name, "ffn_down")) {
            int nl = c->n_layers;
            if (ftype == TLM_FTYPE_Q2_K)
                ty = TLM_DTYPE_Q3_K;
            else if (ftype == TLM_FTYPE_Q3_K_M)
                ty = i_ffn_down < nl / 16 ? TLM_DTYPE_Q5_K : TLM_DTYPE_Q4_K;
            else if (ftype == TLM_FTYPE_Q3_K_L)
                ty = TLM_DTYPE_Q5_K;
            else if ((ftype == TLM_FTYPE_Q4_K_M || ftype == TLM_FTYPE_Q5_K_M) &&
                     use_more_bits(i_ffn_down, nl))
                ty = TLM_DTYPE_Q6_K;
            else if ((ftype == TLM_FTYPE_IQ4_NL || ftype == TLM_FTYPE_IQ4_XS) &&
                     i_ffn_down < nl / 8 && !imatrix)
                ty = TLM_DTYPE_Q5_K;
            else if (ftype == TLM_FTYPE_Q4_K_S && i_ffn_down < nl / 8)
                ty = TLM_DTYPE_Q5_K;
            else if ((ftype == TLM_FTYPE_Q4_0 || ftype == TLM_FTYPE_Q5_0) && imatrix &&
                     i_ffn_down < nl / 8)
                /* llama.cpp's guard for the first ffn_down layers, with a matrix only */
                ty = ftype == TLM_FTYPE_Q4_0 ? TLM_DTYPE_Q4_1 : TLM_DTYPE_Q5_1;
            i_ffn_down++;
        } else if (strstr(name, "attn_output.weight")) {
            if (ftype == TLM_FTYPE_Q2_K)
                ty = TLM_DTYPE_Q3_K;
            else if (ftype == TLM_FTYPE_Q3_K_M)
                ty = TLM_DTYPE_Q4_K;
            else if (ftype == TLM_FTYPE_Q3_K_L)
                ty = TLM_DTYPE_Q5_K;
        }
        /* Rows that are not whole blocks of the choice fall back to a 32-element type, then F16. */
        if (ncols % core_dtype_get(ty)->block_elems) {
            ty = ty == TLM_DTYPE_IQ4_XS                         ? TLM_DTYPE_IQ4_NL
                 : ty == TLM_DTYPE_Q2_K || ty == TLM_DTYPE_Q3_K ? TLM_DTYPE_Q4_0
                 : ty == TLM_DTYPE_Q4_K                         ? TLM_DTYPE_Q5_0
                 : ty == TLM_DTYPE_Q5_K                         ? TLM_DTYPE_Q5_1
                 : ty == TLM_DTYPE_Q6_K                         ? TLM_DTYPE_Q8_0
                                                                : ty;
            if (ncols % core_dtype_get(ty)->block_elems) ty = TLM_DTYPE_F16;
        }
        types[i] = ty;
    }
    for (int k = 0; k < o->n_tensor_types; k++) regfree(&re[k]);
    free(re);
    return TLM_OK;
}

void tlm_quantize_opts_defaults(tlm_quantize_opts *o) {
    *o = (tlm_quantize_opts){
        .ftype = TLM_FTYPE_Q8_0, .output_type = TLM_DTYPE_F32, .embd_type = TLM_DTYPE_F32};
}

tlm_status tlm_model_quantize_gguf(const tlm_model *m, const tlm_tokenizer *tok, const char *path,
                                   const tlm_quantize_opts *o) {
    int fi = ftype_index(o->ftype);
    if (fi < 0) return core_err(TLM_ERR_ARG, "unknown file type %d (see tlm_ftype)", (int)o->ftype);
    tlm_status fs = fmt_no_experts(m, "GGUF export");
    if (fs) return fs;
    int nl = m->c.n_layers;
    tlm_dtype *types = malloc(sizeof *types * (size_t)m->n_tensors);
    int *order = malloc(sizeof *order * (size_t)m->n_tensors);
    int *new_layer = malloc(sizeof *new_layer * (size_t)nl);
    if (!types || !order || !new_layer) {
        free(types);
        free(order);
        free(new_layer);
        return core_err(TLM_ERR_NOMEM, "out of memory");
    }
    tlm_status s = TLM_OK;
    /* --prune-layers: the blocks left keep their order, numbered from 0 (llama-quantize's
     * remap_layer) */
    for (int l = 0; l < nl; l++) new_layer[l] = l;
    for (int k = 0; k < o->n_prune_layers && !s; k++) {
        int l = o->prune_layers[k];
        if (l < 0 || l >= nl)
            s = core_err(TLM_ERR_ARG, "--prune-layers: the model has layers 0 to %d, not %d",
                         nl - 1, l);
        else
            new_layer[l] = -1;
    }
    int kept = 0;
    for (int l = 0; l < nl; l++)
        if (new_layer[l] >= 0) new_layer[l] = kept++;
    if (!s && !kept) s = core_err(TLM_ERR_ARG, "--prune-layers: every layer pruned");
    /* Insertion sort: a few hundred names, and qsort would need a global for the model. */
    int n_order = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        int l = tensor_layer(m->tensors[i].name);
        if (l >= 0 && l < nl && new_layer[l] < 0) continue;
        int j = n_order++;
        for (; j > 0 && llama_before(m->tensors[i].name, m->tensors[order[j - 1]].name); j--)
            order[j] = order[j - 1];
        order[j] = i;
    }
    for (int k = 0; k < o->n_kv_overrides && !s; k++) {
        const tlm_kv_override *v = &o->kv_overrides[k];
        if (!v->key[0] || !memchr(v->key, 0, sizeof v->key) || !memchr(v->str, 0, sizeof v->str) ||
            (unsigned)v->type > TLM_KV_STR)
            s = core_err(TLM_ERR_ARG,
                         "metadata override %d: an empty or unterminated key or string, "
                         "or an unknown type",
                         k);
        else if (!strcmp(v->key, "general.alignment"))
            s = core_err(TLM_ERR_ARG, "metadata override of general.alignment: the data's layout "
                                      "follows it (tlm writes 32)");
    }
    if (!s) s = choose_types(m, order, n_order, o, ftypes[fi].base, types);
    gguf_plan plan = {types, order, (uint32_t)o->ftype, 1, o, n_order, new_layer, kept};
    if (!s && o->dry_run) {
        /* llama-quantize --dry-run: the sizes the file would have, nothing written */
        char fname[160];
        int rope_at = rope_slot(m, &plan), n_out = n_order + (rope_at >= 0);
        for (int k = 0; k <= n_order && !s; k++) {
            if (k == rope_at && o->progress)
                o->progress(o->user, k, n_out, ROPE_FREQS, TLM_DTYPE_F32,
                            sizeof(float) * (size_t)(m->c.d_model / m->c.n_heads / 2));
            if (k == n_order) break;
            const tlm_tensor_info *t = &m->tensors[order[k]];
            size_t bytes = core_dtype_bytes(types[order[k]], t->numel);
            if (!bytes)
                s = core_err(TLM_ERR_ARG, "tensor '%s': %lld columns are not whole %s blocks",
                             t->name, (long long)t->shape[t->ndim - 1],
                             tlm_dtype_name(types[order[k]]));
            else if (o->progress)
                o->progress(o->user, k + (rope_at >= 0 && k >= rope_at), n_out,
                            file_name(&plan, t->name, fname, sizeof fname), types[order[k]], bytes);
        }
    } else if (!s) {
        s = write_gguf(m, tok, path, &plan);
    }
    free(types);
    free(order);
    free(new_layer);
    return s;
}
