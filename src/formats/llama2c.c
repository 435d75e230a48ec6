/* llama2.c model files (karpathy/llama2.c).
 *
 * Legacy: 7 int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len), then fp32
 * tensors grouped by kind across layers: token embedding, attention norms, wq, wk, wv, wo, ffn
 * norms, w1 (gate), w2 (down), w3 (up), final norm, two RoPE tables [seq_len, head_size/2] that
 * readers skip, and the classifier when vocab_size is negative (unshared).
 * Version 1: uint32 magic "ak42", int32 version, the same 7 int32, a shared_classifier byte, zero
 * padding to 256 bytes; then norms first (attention, ffn, final), the embedding, wq..w3 by kind,
 * and the classifier when not shared, with no RoPE tables.
 * Both store matrices [out, in] like tlm, and rotate adjacent pairs in RoPE (theta 10000). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "formats/formats.h"

#define L2C_MAGIC 0x616b3432u
#define L2C_V1_HEADER 256

typedef enum {
    K_EMB,
    K_ATTN_NORM,
    K_Q,
    K_K,
    K_V,
    K_O,
    K_FFN_NORM,
    K_GATE,
    K_DOWN,
    K_UP,
    K_NORM,
    K_ROPE,
    K_CLS
} l2c_kind;

static const char *const kind_tensor[] = {
    "token_embd.weight", "attn_norm.weight",   "attn_q.weight",      "attn_k.weight",
    "attn_v.weight",     "attn_output.weight", "ffn_norm.weight",    "ffn_gate.weight",
    "ffn_down.weight",   "ffn_up.weight",      "output_norm.weight", NULL,
    "output.weight"};

static const l2c_kind legacy_order[] = {K_EMB,  K_ATTN_NORM, K_Q,  K_K,    K_V,    K_O,  K_FFN_NORM,
                                        K_GATE, K_DOWN,      K_UP, K_NORM, K_ROPE, K_CLS};
static const l2c_kind v1_order[] = {K_ATTN_NORM, K_FFN_NORM, K_NORM, K_EMB,  K_Q,  K_K,
                                    K_V,         K_O,        K_GATE, K_DOWN, K_UP, K_CLS};

static int per_layer(l2c_kind k) { return k != K_EMB && k != K_NORM && k != K_ROPE && k != K_CLS; }

static int32_t rd_i32(const uint8_t *p) {
    uint32_t v = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    int32_t r;
    memcpy(&r, &v, 4);
    return r;
}

/* Floats of one tensor of kind k (per layer for per-layer kinds). */
static size_t kind_numel(const tlm_config *c, l2c_kind k) {
    size_t d = (size_t)c->d_model, hd = d / (size_t)c->n_heads, kv = hd * (size_t)c->n_kv_heads;
    size_t ff = (size_t)c->d_ff, v = (size_t)c->vocab_size;
    switch (k) {
    case K_EMB:
    case K_CLS: return v * d;
    case K_ATTN_NORM:
    case K_FFN_NORM:
    case K_NORM: return d;
    case K_Q:
    case K_O: return d * d;
    case K_K:
    case K_V: return kv * d;
    case K_GATE:
    case K_DOWN:
    case K_UP: return ff * d;
    case K_ROPE: return (size_t)c->context_length * hd; /* cos and sin, hd/2 each */
    }
    return 0;
}

/* Reads the header into a config. Counts are checked here so that every later size product is
 * bounded (tlm_config_finalize caps the total parameter count). */
static tlm_status parse_header(const uint8_t *p, size_t n, const char *path, tlm_config *c,
                               int *version, size_t *data_off) {
    const uint8_t *h;
    int shared;
    if (n >= 8 && (uint32_t)rd_i32(p) == L2C_MAGIC) {
        int32_t ver = rd_i32(p + 4);
        if (ver != 1)
            return core_err(TLM_ERR_UNSUPPORTED,
                            "%s: llama2.c version %d is not supported (only the legacy format and "
                            "version 1 fp32)",
                            path, (int)ver);
        if (n < L2C_V1_HEADER)
            return core_err(TLM_ERR_FORMAT, "%s: truncated llama2.c v1 header (%zu bytes)", path,
                            n);
        h = p + 8;
        if (p[36] > 1)
            return core_err(TLM_ERR_FORMAT, "%s: shared_classifier byte is %d", path, p[36]);
        shared = p[36];
        *version = 1;
        *data_off = L2C_V1_HEADER;
    } else {
        if (n < 28)
            return core_err(TLM_ERR_FORMAT, "%s: too short for a llama2.c header (%zu bytes)", path,
                            n);
        h = p;
        *version = 0;
        *data_off = 28;
        shared = rd_i32(h + 20) > 0;
    }
    int32_t v[7];
    for (int i = 0; i < 7; i++) v[i] = rd_i32(h + 4 * i);
    if (*version == 0 && v[5] < 0 && v[5] != INT32_MIN) v[5] = -v[5];
    static const char *const names[7] = {"dim",        "hidden_dim", "n_layers", "n_heads",
                                         "n_kv_heads", "vocab_size", "seq_len"};
    static const int32_t limits[7] = {1 << 16, 1 << 20, 1 << 12, 1 << 12,
                                      1 << 12, 1 << 24, 1 << 24};
    for (int i = 0; i < 7; i++)
        if (v[i] <= 0 || v[i] > limits[i])
            return core_err(TLM_ERR_FORMAT,
                            "%s: not a llama2.c model: header %s = %d (expected 1..%d)", path,
                            names[i], (int)v[i], (int)limits[i]);
    tlm_config_defaults(c);
    c->d_model = v[0];
    c->d_ff = v[1];
    c->n_layers = v[2];
    c->n_heads = v[3];
    c->n_kv_heads = v[4];
    c->vocab_size = v[5];
    c->context_length = v[6];
    c->norm = TLM_NORM_RMSNORM;
    c->norm_eps = 1e-5f;
    c->norm_position = TLM_NORM_PRE;
    c->ffn = TLM_FFN_SWIGLU;
    c->position = TLM_POS_ROPE;
    c->rope_theta = 10000.0f;
    c->rope_pairing = TLM_ROPE_INTERLEAVED;
    c->tie_embeddings = shared;
    c->bias = 0;
    c->dropout = 0.0f;
    tlm_status s = tlm_config_finalize(c);
    if (s) return core_err_context(s, "%s: llama2.c header", path);
    return TLM_OK;
}

/* Total bytes the header implies; overflow-checked although the config caps make it small. */
static tlm_status expected_size(const tlm_config *c, int version, size_t data_off, size_t *out) {
    const l2c_kind *order = version ? v1_order : legacy_order;
    size_t n =
        version ? sizeof v1_order / sizeof *v1_order : sizeof legacy_order / sizeof *legacy_order;
    size_t total = data_off;
    for (size_t i = 0; i < n; i++) {
        l2c_kind k = order[i];
        if (k == K_CLS && c->tie_embeddings) continue;
        size_t cnt = kind_numel(c, k), bytes;
        if (per_layer(k) && !core_mul_ok(cnt, (size_t)c->n_layers, &cnt))
            return core_err(TLM_ERR_FORMAT, "size overflow");
        if (!core_mul_ok(cnt, sizeof(float), &bytes) || !core_add_ok(total, bytes, &total))
            return core_err(TLM_ERR_FORMAT, "size overflow");
    }
    *out = total;
    return TLM_OK;
}

/* Binds the model's tensors to their bytes in the mapped file (which the model takes over). */
static tlm_status load_mapped(core_mmap *map, const char *path, int writable, tlm_model **out) {
    const uint8_t *p = map->data;
    size_t n = map->size;
    tlm_config c;
    int version;
    size_t off, need;
    tlm_status s = parse_header(p, n, path, &c, &version, &off);
    if (!s) {
        s = expected_size(&c, version, off, &need);
        if (s) core_err_context(s, "%s", path);
    }
    if (!s && n != need)
        s = core_err(TLM_ERR_FORMAT,
                     "%s: file is %zu bytes but its llama2.c header (dim %d, hidden %d, %d "
                     "layers, vocab %d, seq_len %d) implies %zu",
                     path, n, c.d_model, c.d_ff, c.n_layers, c.vocab_size, c.context_length, need);
    tlm_model *m = NULL;
    if (!s) s = fmt_model_new(&c, path, writable, &m);
    mdl_bind_src *src = NULL;
    if (!s && !(src = calloc((size_t)m->n_tensors, sizeof *src)))
        s = core_err(TLM_ERR_NOMEM, "out of memory");
    if (s) {
        core_mmap_close(map);
        tlm_model_free(m);
        return s;
    }
    const l2c_kind *order = version ? v1_order : legacy_order;
    size_t n_kinds =
        version ? sizeof v1_order / sizeof *v1_order : sizeof legacy_order / sizeof *legacy_order;
    for (size_t i = 0; i < n_kinds; i++) {
        l2c_kind k = order[i];
        if (k == K_CLS && c.tie_embeddings) continue;
        size_t cnt = kind_numel(&c, k);
        int reps = per_layer(k) ? c.n_layers : 1;
        for (int l = 0; l < reps; l++) {
            if (k != K_ROPE) {
                char name[TLM_NAME_MAX];
                if (per_layer(k))
                    snprintf(name, sizeof name, "blk.%d.%s", l, kind_tensor[k]);
                else
                    snprintf(name, sizeof name, "%s", kind_tensor[k]);
                int ti = mdl_index(m, name);
                if (ti >= 0) src[ti] = (mdl_bind_src){TLM_DTYPE_F32, p + off, 0.0f};
            }
            off += cnt * sizeof(float);
        }
    }
    s = mdl_bind(m, src, map, 1);
    free(src);
    if (s) {
        tlm_model_free(m);
        return core_err_context(s, "%s", path);
    }
    *out = m;
    return TLM_OK;
}

tlm_status fmt_load_llama2c(const char *path, int writable, tlm_model **out) {
    *out = NULL;
    core_mmap map;
    tlm_status s = core_mmap_open(&map, path);
    if (s) return s;
    return load_mapped(&map, path, writable, out);
}

tlm_status tlm_model_load_llama2c(const char *path, tlm_model **out) {
    return fmt_load_llama2c(path, 0, out);
}

int fmt_llama2c_sniff(const uint8_t *p, size_t n) {
    if (n >= 8 && (uint32_t)rd_i32(p) == L2C_MAGIC) return 1;
    if (n < 28) return 0;
    tlm_config c;
    int version;
    size_t off, need;
    /* A legacy file has no magic: accept it when its header predicts its exact size. */
    tlm_status s = parse_header(p, n, "", &c, &version, &off);
    if (s || expected_size(&c, version, off, &need)) return 0;
    return need == n;
}

static tlm_status put_floats(core_atomic_file *a, const float *x, size_t n) {
    return core_atomic_write(a, x, n * sizeof(float));
}

static tlm_status put_i32(core_atomic_file *a, int32_t v) {
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    return core_atomic_write(a, b, 4);
}

/* Writes one kind (all layers). q and k rows of a half-pairing model are reordered into the
 * adjacent pairs that llama2.c's RoPE rotates. */
static tlm_status put_kind(core_atomic_file *a, const tlm_model *m, l2c_kind k, float *scratch) {
    const tlm_config *c = &m->c;
    int hd = c->d_model / c->n_heads;
    if (k == K_ROPE) {
        /* Written only for old readers that expect them; llama2.c's run.c skips them. */
        int half = hd / 2;
        for (int t = 0; t < 2; t++)
            for (int pos = 0; pos < c->context_length; pos++) {
                for (int i = 0; i < half; i++) {
                    float f = 1.0f / powf(10000.0f, (float)(2 * i) / (float)hd);
                    float ang = (float)pos * f;
                    scratch[i] = t == 0 ? cosf(ang) : sinf(ang);
                }
                tlm_status s = put_floats(a, scratch, (size_t)half);
                if (s) return s;
            }
        return TLM_OK;
    }
    if (k == K_CLS && c->tie_embeddings) return TLM_OK;
    size_t cnt = kind_numel(c, k);
    int reps = per_layer(k) ? c->n_layers : 1;
    for (int l = 0; l < reps; l++) {
        const float *src = per_layer(k) ? fmt_layer_tensor_c(m, l, kind_tensor[k])
                                        : fmt_tensor_c(m, kind_tensor[k]);
        if ((k == K_Q || k == K_K) && c->rope_pairing == TLM_ROPE_HALF) {
            memcpy(scratch, src, cnt * sizeof(float));
            tlm_status s =
                fmt_permute_qk(scratch, NULL, (int)(cnt / (size_t)c->d_model), c->d_model, hd, 1);
            if (s) return s;
            src = scratch;
        }
        tlm_status s = put_floats(a, src, cnt);
        if (s) return s;
    }
    return TLM_OK;
}

tlm_status tlm_model_save_llama2c(const tlm_model *m, const char *path, int version) {
    const tlm_config *c = &m->c;
    char why[160];
    tlm_status fs = fmt_no_experts(m, "llama2.c export");
    if (!fs) fs = fmt_need_f32(m, "llama2.c export");
    if (!fs) fs = fmt_no_rope_factors(m, "llama2.c export");
    if (fs) return fs;
    if (version != 0 && version != 1)
        return core_err(TLM_ERR_ARG, "llama2.c version must be 0 (legacy) or 1, not %d", version);
    if (!fmt_is_llama_style(c, 0, 0, why, sizeof why))
        return core_err(TLM_ERR_UNSUPPORTED, "llama2.c cannot hold this model: %s", why);
    /* run.c hard-codes these; a model that differs would silently compute something else. */
    if (c->rope_theta != 10000.0f || fabsf(c->norm_eps - 1e-5f) > 1e-9f)
        return core_err(TLM_ERR_UNSUPPORTED,
                        "llama2.c fixes rope_theta 10000 and norm_eps 1e-5 (model has %g, %g)",
                        (double)c->rope_theta, (double)c->norm_eps);
    size_t scratch_n = (size_t)c->d_model * (size_t)c->d_model;
    if ((size_t)c->d_model > scratch_n) scratch_n = (size_t)c->d_model;
    float *scratch = malloc(scratch_n * sizeof(float));
    if (!scratch) return core_err(TLM_ERR_NOMEM, "out of memory");
    core_atomic_file a;
    tlm_status s = core_atomic_open(&a, path);
    if (s) {
        free(scratch);
        return s;
    }
    int32_t hdr[7] = {c->d_model,    c->d_ff,       c->n_layers,      c->n_heads,
                      c->n_kv_heads, c->vocab_size, c->context_length};
    if (version == 0) {
        if (!c->tie_embeddings) hdr[5] = -hdr[5];
        for (int i = 0; i < 7 && !s; i++) s = put_i32(&a, hdr[i]);
    } else {
        uint8_t h[L2C_V1_HEADER];
        memset(h, 0, sizeof h);
        uint32_t magic = L2C_MAGIC;
        for (int i = 0; i < 4; i++) h[i] = (uint8_t)(magic >> (8 * i));
        h[4] = 1;
        for (int j = 0; j < 7; j++)
            for (int i = 0; i < 4; i++) h[8 + 4 * j + i] = (uint8_t)((uint32_t)hdr[j] >> (8 * i));
        h[36] = (uint8_t)c->tie_embeddings;
        s = core_atomic_write(&a, h, sizeof h);
    }
    const l2c_kind *order = version ? v1_order : legacy_order;
    size_t n_kinds =
        version ? sizeof v1_order / sizeof *v1_order : sizeof legacy_order / sizeof *legacy_order;
    for (size_t i = 0; i < n_kinds && !s; i++) s = put_kind(&a, m, order[i], scratch);
    free(scratch);
    if (s) {
        core_atomic_abort(&a);
        return core_err_context(s, "writing %s", path);
    }
    return core_atomic_commit(&a);
}
