/* Llama weights from GGUF (arch `llama`, `qwen2`, `gemma2`), on top of the general reader in
 * gguf.c, which has already checked every count, string, shape product and tensor byte range
 * against the file. Here: the llama.* keys become a config, each schema tensor must be present with
 * ggml dims [in, out] (innermost first, i.e. tlm's [out, in] row-major), and F32 / F16 / BF16 /
 * Q8_0 data is converted to floats. llama.cpp's `llama` rotates adjacent pairs, which is tlm's
 * interleaved pairing, and `qwen2` and `gemma2` halves, tlm's half, so q/k rows load unchanged.
 * Gemma 2's norm weights hold 1 + w (llama.cpp's converter adds the 1), which is what tlm's norms
 * multiply by. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "formats/formats.h"
#include "io/gguf.h"

static tlm_status get_dim(const io_gguf *g, const char *key, int64_t def, int64_t hi,
                          const char *path, int *out) {
    int64_t v;
    tlm_status s = io_gguf_get_int(g, key, &v);
    if (s == TLM_ERR_RANGE && def >= 0) {
        v = def;
    } else if (s) {
        return core_err_context(s, "%s", path);
    }
    if (v <= 0 || v > hi)
        return core_err(TLM_ERR_FORMAT, "%s: %s = %lld (expected 1..%lld)", path, key, (long long)v,
                        (long long)hi);
    *out = (int)v;
    return TLM_OK;
}

static tlm_status get_pos_float(const io_gguf *g, const char *key, double def, const char *path,
                                float *out) {
    double v;
    tlm_status s = io_gguf_get_float(g, key, &v);
    if (s == TLM_ERR_RANGE) {
        v = def;
    } else if (s) {
        return core_err_context(s, "%s", path);
    }
    if (!(v > 0) || !isfinite(v) || v > 1e30)
        return core_err(TLM_ERR_FORMAT, "%s: %s = %g (expected a positive number)", path, key, v);
    *out = (float)v;
    return TLM_OK;
}

static tlm_status llama_config(const io_gguf *g, const char *path, tlm_config *c) {
    const char *arch;
    size_t alen;
    tlm_status s = io_gguf_get_str(g, "general.architecture", &arch, &alen);
    if (s) return core_err_context(s, "%s", path);
    /* Qwen2 is Llama with biases on q, k and v, rotating halves (llama.cpp's NEOX RoPE: its q and
     * k rows are stored as trained, not permuted) */
    int qwen2 = alen == 5 && !memcmp(arch, "qwen2", 5);
    int gemma2 = alen == 6 && !memcmp(arch, "gemma2", 6);
    if (alen == 6 && !memcmp(arch, "gemma3", 6))
        return core_err(TLM_ERR_UNSUPPORTED,
                        "%s: GGUF architecture 'gemma3' is not supported: its per-head q and k "
                        "norms and the local layers' RoPE base are not in tlm's config",
                        path);
    if (!qwen2 && !gemma2 && (alen != 5 || memcmp(arch, "llama", 5)))
        return core_err(TLM_ERR_UNSUPPORTED,
                        "%s: GGUF architecture '%.*s' is not supported (llama, qwen2, gemma2)",
                        path, (int)(alen > 40 ? 40 : alen), arch);
    const char *pfx = gemma2 ? "gemma2" : qwen2 ? "qwen2" : "llama";
    /* the arch's keys: each is read before the next is made */
    char key[96];
#define KEY(k) (snprintf(key, sizeof key, "%s.%s", pfx, k), key)
    const char *st;
    size_t sl;
    if (!io_gguf_get_str(g, KEY("rope.scaling.type"), &st, &sl) &&
        !(sl == 4 && !memcmp(st, "none", 4)))
        return core_err(TLM_ERR_UNSUPPORTED, "%s: RoPE scaling '%.*s' is not supported", path,
                        (int)(sl > 40 ? 40 : sl), st);
    int64_t experts = 0;
    if (!io_gguf_get_int(g, KEY("expert_count"), &experts) && experts > 0)
        return core_err(TLM_ERR_UNSUPPORTED,
                        "%s: a mixture of experts (%s.expert_count %lld) is not supported in GGUF "
                        "files",
                        path, pfx, (long long)experts);
    tlm_config_defaults(c);
    int heads = 0, rope_dims = 0, vocab_guess = 0;
    /* The vocabulary size: llama.vocab_size, else the token list, else the embedding's rows. */
    const io_gguf_tensor *emb = io_gguf_find_tensor(g, "token_embd.weight");
    const io_gguf_kv *toks = io_gguf_find(g, "tokenizer.ggml.tokens");
    if (toks && toks->type == IO_GGUF_ARRAY && toks->len <= (1u << 24))
        vocab_guess = (int)toks->len;
    else if (emb && emb->n_dims == 2 && emb->dims[1] <= (1u << 24))
        vocab_guess = (int)emb->dims[1];
    if ((s = get_dim(g, KEY("embedding_length"), -1, 1 << 20, path, &c->d_model)) ||
        (s = get_dim(g, KEY("block_count"), -1, 1 << 12, path, &c->n_layers)) ||
        (s = get_dim(g, KEY("feed_forward_length"), -1, 1 << 24, path, &c->d_ff)) ||
        (s = get_dim(g, KEY("attention.head_count"), -1, 1 << 12, path, &heads)) ||
        (s = get_dim(g, KEY("attention.head_count_kv"), heads, 1 << 12, path, &c->n_kv_heads)) ||
        (s = get_dim(g, KEY("context_length"), 2048, 1 << 24, path, &c->context_length)) ||
        (s = get_dim(g, KEY("vocab_size"), vocab_guess ? vocab_guess : -1, 1 << 24, path,
                     &c->vocab_size)) ||
        (s = get_dim(g, KEY("rope.dimension_count"), c->d_model / heads, 1 << 16, path,
                     &rope_dims)) ||
        (s = get_pos_float(g, KEY("attention.layer_norm_rms_epsilon"), 1e-5, path, &c->norm_eps)) ||
        (s = get_pos_float(g, KEY("rope.freq_base"), 10000.0, path, &c->rope_theta)))
        return s;
    int64_t win = 0, pattern = 0, head_k = c->d_model / heads, head_v = head_k;
    double base_swa = c->rope_theta;
    if (((s = io_gguf_get_int(g, KEY("attention.sliding_window"), &win)) && s != TLM_ERR_RANGE) ||
        ((s = io_gguf_get_int(g, KEY("attention.key_length"), &head_k)) && s != TLM_ERR_RANGE) ||
        ((s = io_gguf_get_int(g, KEY("attention.value_length"), &head_v)) && s != TLM_ERR_RANGE))
        return core_err_context(s, "%s", path);
    /* compared, not multiplied: the file's values may be anything */
    if (head_k != c->d_model / heads || head_v != head_k)
        return core_err(TLM_ERR_UNSUPPORTED,
                        "%s: attention key/value length %lld/%lld is not d_model / heads %d (tlm's "
                        "heads are d_model / heads wide)",
                        path, (long long)head_k, (long long)head_v, c->d_model / heads);
    if (gemma2) {
        /* llama.cpp's defaults where a key is absent: window 4096, every second layer global,
         * caps 50 and 30 */
        double cap_a = 50.0, cap_f = 30.0;
        if (!io_gguf_find(g, KEY("attention.sliding_window"))) win = 4096;
        pattern = 2;
        if (io_gguf_find(g, KEY("attention.sliding_window_pattern")) &&
            (s = io_gguf_get_int(g, key, &pattern)))
            return core_err_context(s, "%s: sliding_window_pattern (tlm reads one number)", path);
        if ((s = get_pos_float(g, KEY("attn_logit_softcapping"), cap_a, path, &c->attn_softcap)) ||
            (s = get_pos_float(g, KEY("final_logit_softcapping"), cap_f, path, &c->final_softcap)))
            return s;
        if ((s = io_gguf_get_float(g, KEY("rope.freq_base_swa"), &base_swa)) && s != TLM_ERR_RANGE)
            return core_err_context(s, "%s", path);
        if (base_swa != (double)c->rope_theta)
            return core_err(TLM_ERR_UNSUPPORTED,
                            "%s: rope.freq_base_swa %g differs from rope.freq_base %g (tlm has one "
                            "RoPE base)",
                            path, base_swa, (double)c->rope_theta);
        if (win <= 0 || win > (1 << 24) || pattern < 0 || pattern > (1 << 12))
            return core_err(TLM_ERR_FORMAT, "%s: sliding window %lld, pattern %lld", path,
                            (long long)win, (long long)pattern);
        /* pattern 1: every layer global */
        if (pattern == 1) win = pattern = 0;
        c->embed_scale = sqrtf((float)c->d_model);
        c->attn_scale = 1.0f / sqrtf((float)(c->d_model / heads));
        c->post_norms = 1;
    } else if (qwen2) {
        win = 0; /* llama.cpp's qwen2 has no window */
    } else if (win < 0 || win > (1 << 24)) {
        return core_err(TLM_ERR_FORMAT, "%s: %s = %lld", path, KEY("attention.sliding_window"),
                        (long long)win);
    }
#undef KEY
    c->sliding_window = (int)win;
    c->sliding_window_pattern = (int)pattern;
    c->n_heads = heads;
    if (rope_dims * heads != c->d_model)
        return core_err(TLM_ERR_UNSUPPORTED,
                        "%s: rope.dimension_count %d is not the head dim %d (partial RoPE is not "
                        "supported)",
                        path, rope_dims, c->d_model / heads);
    c->norm = TLM_NORM_RMSNORM;
    c->norm_position = TLM_NORM_PRE;
    c->ffn = gemma2 ? TLM_FFN_GEGLU : TLM_FFN_SWIGLU;
    c->position = TLM_POS_ROPE;
    c->rope_pairing = qwen2 || gemma2 ? TLM_ROPE_HALF : TLM_ROPE_INTERLEAVED;
    c->bias = 0;
    c->qkv_bias = qwen2;
    c->dropout = 0.0f;
    c->tie_embeddings = io_gguf_find_tensor(g, "output.weight") == NULL;
    s = tlm_config_finalize(c);
    if (s) return core_err_context(s, "%s: %s.* keys", path, pfx);
    return TLM_OK;
}

/* The weight type of tensor t, which must hold n elements of a type the loader binds (the reader
 * checked its bytes against the file). */
static tlm_status tensor_type(const io_gguf_tensor *t, size_t n, const char *path, tlm_dtype *dt) {
    if (t->n_elements != n)
        return core_err(TLM_ERR_FORMAT, "%s: tensor '%s' has %llu elements, expected %zu", path,
                        t->name, (unsigned long long)t->n_elements, n);
    if (!t->data)
        return core_err(TLM_ERR_UNSUPPORTED, "%s: tensor '%s' has unknown ggml type %u", path,
                        t->name, t->type);
    if (core_dtype_from_ggml(t->type, dt) && core_dtype_get(*dt)->is_float) return TLM_OK;
    const char *name = "?";
    io_ggml_type_info(t->type, &name, NULL, NULL);
    return core_err(TLM_ERR_UNSUPPORTED,
                    "%s: unsupported tensor type: tensor '%s' is %s; supported: F32, F16, BF16, "
                    "Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS",
                    path, t->name, name);
}

/* The model in n GGUF files (gguf-split's shards; n = 1 for a whole file): the config from the
 * first, each tensor from whichever holds it. */
static tlm_status load_model_shards(io_gguf **gs, int n_files, const char *path, int writable,
                                    tlm_model **out) {
    *out = NULL;
    io_gguf *g = gs[0];
    tlm_config c;
    tlm_status s = llama_config(g, path, &c);
    if (s) return s;
    /* Every tensor is checked before the model is allocated, so a header cannot make us allocate
     * more than the file's tensors hold. */
    int n = tlm_config_tensors(&c, NULL, 0, NULL);
    tlm_tensor_info *ti = calloc((size_t)n, sizeof *ti);
    mdl_bind_src *src = calloc((size_t)n, sizeof *src);
    if (!ti || !src) {
        free(ti);
        free(src);
        return core_err(TLM_ERR_NOMEM, "out of memory");
    }
    tlm_config_tensors(&c, ti, n, NULL);
    for (int i = 0; i < n && !s; i++) {
        const io_gguf_tensor *t = NULL;
        for (int f = 0; f < n_files && !t; f++) t = io_gguf_find_tensor(gs[f], ti[i].name);
        if (!t) {
            s = core_err(TLM_ERR_FORMAT, "%s: missing tensor '%s'%s", path, ti[i].name,
                         n_files > 1 ? " (in every shard)" : "");
            break;
        }
        int ok = ti[i].ndim == 2 ? t->n_dims == 2 && t->dims[0] == (uint64_t)ti[i].shape[1] &&
                                       t->dims[1] == (uint64_t)ti[i].shape[0]
                                 : t->n_dims == 1 && t->dims[0] == (uint64_t)ti[i].shape[0];
        if (!ok) {
            s = core_err(TLM_ERR_FORMAT,
                         "%s: tensor '%s' has ggml dims [%llu, %llu] (%u-d), expected [%lld, %lld]",
                         path, t->name, (unsigned long long)t->dims[0],
                         (unsigned long long)t->dims[1], t->n_dims,
                         (long long)(ti[i].ndim == 2 ? ti[i].shape[1] : ti[i].shape[0]),
                         (long long)(ti[i].ndim == 2 ? ti[i].shape[0] : 1));
            break;
        }
        tlm_dtype dt;
        if ((s = tensor_type(t, ti[i].numel, path, &dt)) == TLM_OK)
            src[i] = (mdl_bind_src){dt, t->data, 0.0f};
    }
    free(ti);
    tlm_model *m = NULL;
    if (!s) s = fmt_model_new(&c, path, writable, &m);
    if (!s) {
        /* The model keeps the files mapped while its views point into them. */
        core_mmap maps[IO_GGUF_MAX_SPLITS];
        int given = 0;
        for (int f = 0; f < n_files; f++)
            if (gs[f]->owns_map) {
                maps[given++] = gs[f]->map;
                gs[f]->owns_map = 0;
            }
        s = mdl_bind(m, src, maps, given);
        if (s) core_err_context(s, "%s", path);
    }
    /* Llama 3.1's RoPE scaling, as llama.cpp's converter stores it: one factor per frequency */
    const io_gguf_tensor *rf = NULL;
    for (int f = 0; f < n_files && !rf && !s; f++)
        rf = io_gguf_find_tensor(gs[f], "rope_freqs.weight");
    if (rf) {
        int half = c.d_model / c.n_heads / 2;
        if (rf->type != 0 /* F32 */ || rf->n_dims != 1 || rf->dims[0] != (uint64_t)half ||
            !rf->data)
            s = core_err(TLM_ERR_FORMAT, "%s: rope_freqs.weight must be %d F32 values", path, half);
        else {
            float *fk = malloc(sizeof *fk * (size_t)half); /* the file's bytes may be unaligned */
            if (!fk) {
                s = core_err(TLM_ERR_NOMEM, "out of memory");
            } else {
                memcpy(fk, rf->data, sizeof *fk * (size_t)half);
                s = mdl_set_rope_factors(m, fk, half);
                free(fk);
            }
        }
        if (s) core_err_context(s, "%s", path);
    }
    free(src);
    if (s) {
        tlm_model_free(m);
        return s;
    }
    *out = m;
    return TLM_OK;
}

tlm_status fmt_gguf_load_model(io_gguf *g, const char *path, int writable, tlm_model **out) {
    return load_model_shards(&g, 1, path, writable, out);
}

/* gguf-split's shards (llama.cpp's llama-gguf-split, and what large downloads come as): the first,
 * PREFIX-00001-of-0000N.gguf, holds the metadata and split.count; each shard split.no and some of
 * the tensors. Given the first, the others are opened by their names. */
tlm_status fmt_gguf_open_shards(io_gguf *first, const char *path, io_gguf **gs, int *n_out) {
    int64_t count = 1, no = 0;
    *n_out = 1;
    gs[0] = first;
    if (io_gguf_get_int(first, "split.count", &count) || count <= 1) return TLM_OK;
    if (count > IO_GGUF_MAX_SPLITS)
        return core_err(TLM_ERR_UNSUPPORTED, "%s: split.count %lld (tlm reads up to %d shards)",
                        path, (long long)count, IO_GGUF_MAX_SPLITS);
    if (io_gguf_get_int(first, "split.no", &no) || no != 0)
        return core_err(
            TLM_ERR_ARG,
            "%s is shard %lld of a split model: give the first one (-00001-of-%05lld.gguf)", path,
            (long long)no + 1, (long long)count);
    char suffix[40];
    snprintf(suffix, sizeof suffix, "-%05d-of-%05d.gguf", 1, (int)count);
    size_t len = strlen(path), sl = strlen(suffix);
    if (len < sl || strcmp(path + len - sl, suffix))
        return core_err(TLM_ERR_FORMAT,
                        "%s: a split model's first shard must be named PREFIX%s (gguf-split's "
                        "names) for the others to be found",
                        path, suffix);
    char *name = malloc(len + 1);
    if (!name) return core_err(TLM_ERR_NOMEM, "out of memory");
    tlm_status s = TLM_OK;
    for (int k = 1; k < count && !s; k++) {
        memcpy(name, path, len - sl);
        snprintf(name + len - sl, sl + 1, "-%05d-of-%05d.gguf", k + 1, (int)count);
        s = io_gguf_open(name, &gs[k]);
        if (s) {
            core_err_context(s, "%s: shard %d of %d", path, k + 1, (int)count);
            break;
        }
        *n_out = k + 1;
        int64_t kn = -1, kc = -1;
        if (io_gguf_get_int(gs[k], "split.no", &kn) || kn != k ||
            io_gguf_get_int(gs[k], "split.count", &kc) || kc != count)
            s = core_err(TLM_ERR_FORMAT, "%s: split.no %lld / split.count %lld, expected %d / %d",
                         name, (long long)kn, (long long)kc, k, (int)count);
    }
    free(name);
    return s;
}

tlm_status fmt_load_gguf(const char *path, int writable, tlm_model **out) {
    *out = NULL;
    io_gguf *gs[IO_GGUF_MAX_SPLITS] = {0};
    int n = 1;
    tlm_status s = io_gguf_open(path, &gs[0]);
    if (s) return s;
    s = fmt_gguf_open_shards(gs[0], path, gs, &n);
    if (!s) s = load_model_shards(gs, n, path, writable, out);
    for (int k = 0; k < n; k++) io_gguf_close(gs[k]);
    return s;
}

tlm_status tlm_model_load_gguf(const char *path, tlm_model **out) {
    return fmt_load_gguf(path, 0, out);
}
