/* Hugging Face model directories: config.json + model.safetensors, or shards listed by
 * model.safetensors.index.json. Two architectures:
 *  - LlamaForCausalLM: names model.layers.N.self_attn.q_proj ...; HF rotates halves in RoPE (its
 *    converter permuted Meta's q/k rows to match), which is tlm's `half` pairing, so the weights
 *    load as they are. GQA via num_key_value_heads; tied or separate lm_head. Qwen2ForCausalLM
 *    is the same with q_proj, k_proj and v_proj biases (tlm's qkv_bias).
 *  - GPT2LMHeadModel: Conv1D weights are stored [in, out] (transposed here), c_attn fuses q, k, v
 *    along the output, names may carry a `transformer.` prefix, and the causal-mask buffers
 *    attn.bias / attn.masked_bias are ignored. Activation gelu_new = tanh approximation. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "formats/formats.h"
#include "io/safetensors.h"

#define HF_MAX_SHARDS 256
#define FMT_HF_MAX_FACTORS 4096 /* head_dim / 2 of a model with rope_scaling */

typedef enum { HF_LLAMA, HF_GPT2, HF_GEMMA2 } hf_arch;

/* A tensor of some shard, in the name index that spans all shards. */
typedef struct {
    const char *name;
    int file;
    const io_st_tensor *t;
} hf_entry;

typedef struct {
    const char *dir;
    io_st_file files[HF_MAX_SHARDS];
    char *file_names[HF_MAX_SHARDS];
    int n_files;
    hf_entry *index; /* every shard's tensors sorted by name */
    size_t n_index;
    const char *prefix; /* GPT-2: "" or "transformer." */
} hf_dir;

static int exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* A shard name from the index must stay inside the directory. */
static int safe_name(const char *s) {
    return s[0] && !strchr(s, '/') && !strchr(s, '\\') && strcmp(s, ".") && strcmp(s, "..");
}

static tlm_status open_file(hf_dir *h, const char *name) {
    if (h->n_files >= HF_MAX_SHARDS)
        return core_err(TLM_ERR_FORMAT, "%s: more than %d shards", h->dir, HF_MAX_SHARDS);
    char *p = core_path_join(h->dir, name);
    if (!p) return core_err(TLM_ERR_NOMEM, "out of memory");
    tlm_status s = io_st_open(&h->files[h->n_files], p);
    free(p);
    if (s) return s;
    h->file_names[h->n_files] = strdup(name);
    h->n_files++;
    return h->file_names[h->n_files - 1] ? TLM_OK : core_err(TLM_ERR_NOMEM, "out of memory");
}

static int cmp_entry_name(const void *a, const void *b) {
    return strcmp(((const hf_entry *)a)->name, ((const hf_entry *)b)->name);
}

static int cmp_entry(const void *a, const void *b) {
    const hf_entry *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->file > y->file) - (x->file < y->file);
}

/* One sorted index over every shard, so that each lookup is a binary search; a name in two
 * shards is an error, as it would be inside one file. */
static tlm_status index_tensors(hf_dir *h) {
    size_t n = 0;
    for (int i = 0; i < h->n_files; i++) n += (size_t)h->files[i].n;
    h->index = malloc((n ? n : 1) * sizeof *h->index);
    if (!h->index) return core_err(TLM_ERR_NOMEM, "out of memory");
    for (int i = 0; i < h->n_files; i++)
        for (int k = 0; k < h->files[i].n; k++)
            h->index[h->n_index++] =
                (hf_entry){h->files[i].tensors[k].name, i, &h->files[i].tensors[k]};
    qsort(h->index, n, sizeof *h->index, cmp_entry);
    for (size_t k = 1; k < n; k++)
        if (!strcmp(h->index[k - 1].name, h->index[k].name))
            return core_err(TLM_ERR_FORMAT, "%s: tensor '%s' is in both %s and %s", h->dir,
                            h->index[k].name, h->file_names[h->index[k - 1].file],
                            h->file_names[h->index[k].file]);
    return TLM_OK;
}

/* A shard name of the weight map and where it first appears. */
typedef struct {
    const char *name;
    size_t first;
} shard_ref;

static int cmp_ref_name(const void *a, const void *b) {
    const shard_ref *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->first > y->first) - (x->first < y->first);
}

static int cmp_ref_first(const void *a, const void *b) {
    const shard_ref *x = a, *y = b;
    return (x->first > y->first) - (x->first < y->first);
}

static tlm_status open_tensors(hf_dir *h) {
    char *idx = core_path_join(h->dir, "model.safetensors.index.json");
    if (!idx) return core_err(TLM_ERR_NOMEM, "out of memory");
    if (!exists(idx)) {
        free(idx);
        char *single = core_path_join(h->dir, "model.safetensors");
        int ok = single && exists(single);
        free(single);
        if (!ok)
            return core_err(TLM_ERR_FORMAT,
                            "%s: no model.safetensors or model.safetensors.index.json (only "
                            "safetensors weights are supported)",
                            h->dir);
        tlm_status s = open_file(h, "model.safetensors");
        return s ? s : index_tensors(h);
    }
    char *text;
    tlm_status s = core_read_file(idx, &text, NULL);
    if (s) {
        free(idx);
        return s;
    }
    cJSON *j = cJSON_Parse(text);
    free(text);
    cJSON *map = cJSON_GetObjectItemCaseSensitive(j, "weight_map");
    if (!cJSON_IsObject(map)) {
        cJSON_Delete(j);
        s = core_err(TLM_ERR_FORMAT, "%s: no weight_map object", idx);
        free(idx);
        return s;
    }
    /* Distinct shard names in order of first appearance: sorted by name, the first of each run
     * kept, then back in map order (a map has an entry per tensor, so no pairwise scan). */
    size_t n_refs = 0;
    shard_ref *refs = malloc(((size_t)cJSON_GetArraySize(map) + 1) * sizeof *refs);
    if (!refs) s = core_err(TLM_ERR_NOMEM, "out of memory");
    cJSON *e;
    cJSON_ArrayForEach(e, map) {
        if (s) break;
        if (!cJSON_IsString(e) || !safe_name(e->valuestring)) {
            s = core_err(TLM_ERR_FORMAT, "%s: bad shard name for '%s'", idx, e->string);
            break;
        }
        refs[n_refs] = (shard_ref){e->valuestring, n_refs};
        n_refs++;
    }
    size_t n = 0;
    if (!s) {
        qsort(refs, n_refs, sizeof *refs, cmp_ref_name);
        for (size_t i = 0; i < n_refs; i++)
            if (i == 0 || strcmp(refs[i - 1].name, refs[i].name)) refs[n++] = refs[i];
        qsort(refs, n, sizeof *refs, cmp_ref_first);
        if (n > HF_MAX_SHARDS)
            s = core_err(TLM_ERR_FORMAT, "%s: more than %d shards", idx, HF_MAX_SHARDS);
    }
    for (size_t i = 0; i < n && !s; i++) s = open_file(h, refs[i].name);
    if (!s) s = index_tensors(h);
    free(refs);
    cJSON_Delete(j);
    free(idx);
    return s;
}

static void close_dir(hf_dir *h) {
    for (int i = 0; i < h->n_files; i++) {
        io_st_close(&h->files[i]);
        free(h->file_names[i]);
    }
    h->n_files = 0;
    free(h->index);
    h->index = NULL;
    h->n_index = 0;
}

static const io_st_tensor *find(const hf_dir *h, const char *name, int *file) {
    char full[256];
    snprintf(full, sizeof full, "%s%s", h->prefix, name);
    hf_entry key = {full, -1, NULL};
    const hf_entry *e =
        h->index ? bsearch(&key, h->index, h->n_index, sizeof key, cmp_entry_name) : NULL;
    if (!e) return NULL;
    *file = e->file;
    return e->t;
}

/* Reads tensor `name` of shape [d0] or [d0, d1] into dst (floats). */
static tlm_status read_tensor(const hf_dir *h, const char *name, int64_t d0, int64_t d1,
                              float *dst) {
    int fi;
    const io_st_tensor *t = find(h, name, &fi);
    if (!t) return core_err(TLM_ERR_FORMAT, "%s: missing tensor '%s%s'", h->dir, h->prefix, name);
    int ndim = d1 > 0 ? 2 : 1;
    if (t->ndim != ndim || t->shape[0] != d0 || (ndim == 2 && t->shape[1] != d1))
        return core_err(TLM_ERR_FORMAT,
                        "%s: tensor '%s%s' has shape [%lld%s%lld], expected [%lld%s%lld]", h->dir,
                        h->prefix, name, (long long)t->shape[0], t->ndim > 1 ? ", " : "",
                        t->ndim > 1 ? (long long)t->shape[1] : 0LL, (long long)d0,
                        ndim > 1 ? ", " : "", ndim > 1 ? (long long)d1 : 0LL);
    if (!dst) return TLM_OK; /* validation pass */
    tlm_status s = io_st_read_f32(&h->files[fi], t, dst, t->numel);
    if (s) return core_err_context(s, "%s: '%s'", h->dir, name);
    return TLM_OK;
}

/* Reads an [in, out] Conv1D weight into dst as [out, in]. */
static tlm_status read_conv1d(const hf_dir *h, const char *name, int64_t in, int64_t out,
                              float *dst, float *tmp) {
    tlm_status s = read_tensor(h, name, in, out, dst ? tmp : NULL);
    if (s || !dst) return s;
    for (int64_t i = 0; i < in; i++)
        for (int64_t o = 0; o < out; o++) dst[o * in + i] = tmp[i * out + o];
    return TLM_OK;
}

/* Integer config value; def when absent (def < 0: required). */
static tlm_status cfg_int(const cJSON *j, const char *key, long def, long lo, long hi, long *out,
                          const char *path) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!v || cJSON_IsNull(v)) {
        if (def < 0) return core_err(TLM_ERR_FORMAT, "%s: config.json lacks '%s'", path, key);
        *out = def;
        return TLM_OK;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo ||
        v->valuedouble > hi)
        return core_err(TLM_ERR_FORMAT, "%s: config.json '%s' must be an integer in %ld..%ld", path,
                        key, lo, hi);
    *out = (long)v->valuedouble;
    return TLM_OK;
}

static tlm_status cfg_float(const cJSON *j, const char *key, double def, double *out,
                            const char *path) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!v || cJSON_IsNull(v)) {
        *out = def;
        return TLM_OK;
    }
    if (!cJSON_IsNumber(v) || !(v->valuedouble > 0) || !isfinite(v->valuedouble))
        return core_err(TLM_ERR_FORMAT, "%s: config.json '%s' must be a positive number", path,
                        key);
    *out = v->valuedouble;
    return TLM_OK;
}

static int cfg_bool(const cJSON *j, const char *key, int def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (cJSON_IsBool(v)) return cJSON_IsTrue(v);
    return def;
}

static const char *cfg_str(const cJSON *j, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* Llama 3.1's rope_scaling (rope_type llama3) as one factor per frequency, computed as
 * llama.cpp's converter writes rope_freqs.weight: wavelengths shorter than the original context /
 * high_freq_factor keep theirs, those longer than it / low_freq_factor are divided by factor, and
 * those between are interpolated. */
static tlm_status llama3_factors(const cJSON *rs, const char *path, double theta, int hd,
                                 float *out) {
    double f = 0, lo = 0, hi = 0, old = 0;
    const cJSON *v;
    double *dst[4] = {&f, &lo, &hi, &old};
    static const char *const keys[4] = {"factor", "low_freq_factor", "high_freq_factor",
                                        "original_max_position_embeddings"};
    for (int k = 0; k < 4; k++) {
        v = cJSON_GetObjectItemCaseSensitive(rs, keys[k]);
        if (!cJSON_IsNumber(v) || !(v->valuedouble > 0) || !isfinite(v->valuedouble))
            return core_err(TLM_ERR_FORMAT, "%s: rope_scaling.%s must be a positive number", path,
                            keys[k]);
        *dst[k] = v->valuedouble;
    }
    if (!(hi > lo))
        return core_err(TLM_ERR_FORMAT,
                        "%s: rope_scaling's high_freq_factor must exceed its low_freq_factor",
                        path);
    double lo_wave = old / lo, hi_wave = old / hi;
    for (int i = 0; i < hd / 2; i++) {
        double freq = 1.0 / pow(theta, 2.0 * i / hd), wave = 2 * 3.14159265358979323846 / freq;
        if (wave < hi_wave)
            out[i] = 1.0f;
        else if (wave > lo_wave)
            out[i] = (float)f;
        else {
            double smooth = (old / wave - lo) / (hi - lo);
            out[i] = (float)(1.0 / ((1 - smooth) / f + smooth));
        }
    }
    return TLM_OK;
}

/* A soft-cap: absent takes Gemma2Config's default, null turns it off. */
static tlm_status cfg_cap(const cJSON *j, const char *key, double def, float *out,
                          const char *path) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    double x = def;
    if (v && cJSON_IsNull(v)) {
        *out = 0.0f;
        return TLM_OK;
    }
    tlm_status s = cfg_float(j, key, def, &x, path);
    *out = (float)x;
    return s;
}

/* Gemma 2's windows: layer_types ("sliding_attention" / "full_attention" a layer) as tlm's
 * window and pattern, which must describe it; without layer_types every second layer is global,
 * as Gemma2Config has it. */
static tlm_status gemma2_windows(const cJSON *j, const char *path, tlm_config *c) {
    long win = 0;
    tlm_status s = cfg_int(j, "sliding_window", 4096, 1, 1 << 24, &win, path);
    if (s) return s;
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(j, "layer_types");
    if (!lt || cJSON_IsNull(lt)) {
        c->sliding_window = (int)win;
        c->sliding_window_pattern = 2;
        return TLM_OK;
    }
    int n = cJSON_GetArraySize(lt), first_full = -1, n_sliding = 0;
    if (!cJSON_IsArray(lt) || n != c->n_layers)
        return core_err(TLM_ERR_FORMAT, "%s: config.json 'layer_types' must list %d layers", path,
                        c->n_layers);
    for (int l = 0; l < n; l++) {
        const cJSON *e = cJSON_GetArrayItem(lt, l);
        const char *t = cJSON_IsString(e) ? e->valuestring : "";
        if (!strcmp(t, "sliding_attention"))
            n_sliding++;
        else if (strcmp(t, "full_attention"))
            return core_err(TLM_ERR_FORMAT, "%s: config.json 'layer_types' %d is '%s'", path, l, t);
        else if (first_full < 0)
            first_full = l;
    }
    c->sliding_window = n_sliding ? (int)win : 0;
    c->sliding_window_pattern = n_sliding && first_full >= 0 ? first_full + 1 : 0;
    for (int l = 0; l < n; l++) {
        int sliding = !strcmp(cJSON_GetArrayItem(lt, l)->valuestring, "sliding_attention");
        if (sliding != tlm_config_layer_windowed(c, l))
            return core_err(TLM_ERR_UNSUPPORTED,
                            "%s: config.json 'layer_types' are not a repeating pattern of windowed "
                            "layers each followed by one global layer",
                            path);
    }
    return TLM_OK;
}

static int is_arch(const char *a0, const char *mt, const char *cls, const char *type) {
    return a0 ? !strcmp(a0, cls) : mt && !strcmp(mt, type);
}

static tlm_status parse_config(const cJSON *j, const char *path, hf_arch *arch, tlm_config *c,
                               float *rope_factors, int *n_factors) {
    const char *mt = cfg_str(j, "model_type");
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(j, "architectures");
    const char *a0 = cJSON_IsArray(archs) && cJSON_IsString(cJSON_GetArrayItem(archs, 0))
                         ? cJSON_GetArrayItem(archs, 0)->valuestring
                         : NULL;
    int qwen2 = is_arch(a0, mt, "Qwen2ForCausalLM", "qwen2");
    int mistral = is_arch(a0, mt, "MistralForCausalLM", "mistral");
    if (is_arch(a0, mt, "Gemma3ForCausalLM", "gemma3_text") ||
        is_arch(a0, mt, "Gemma3ForConditionalGeneration", "gemma3"))
        return core_err(TLM_ERR_UNSUPPORTED,
                        "%s: Gemma 3 is not supported: its per-head q and k norms and the local "
                        "layers' RoPE base are not in tlm's config",
                        path);
    if (qwen2 || mistral || is_arch(a0, mt, "LlamaForCausalLM", "llama"))
        *arch = HF_LLAMA;
    else if (is_arch(a0, mt, "Gemma2ForCausalLM", "gemma2"))
        *arch = HF_GEMMA2;
    else if (is_arch(a0, mt, "GPT2LMHeadModel", "gpt2"))
        *arch = HF_GPT2;
    else
        return core_err(TLM_ERR_UNSUPPORTED,
                        "%s: architecture '%s' is not supported (LlamaForCausalLM, "
                        "MistralForCausalLM, Qwen2ForCausalLM, Gemma2ForCausalLM, "
                        "GPT2LMHeadModel)",
                        path,
                        a0   ? a0
                        : mt ? mt
                             : "?");
    long v[8];
    double eps = 0, theta = 0;
    tlm_status s;
    static const char *const moe_keys[] = {"num_local_experts", "num_experts", "n_routed_experts"};
    for (int i = 0; i < 3; i++) {
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, moe_keys[i]);
        if (cJSON_IsNumber(e) && e->valuedouble > 0)
            return core_err(TLM_ERR_UNSUPPORTED,
                            "%s: a mixture of experts (%s %g) is not supported in Hugging Face "
                            "files",
                            path, moe_keys[i], e->valuedouble);
    }
    tlm_config_defaults(c);
    c->dropout = 0.0f;
    int gemma2 = *arch == HF_GEMMA2;
    if (*arch != HF_GPT2) {
        if ((s = cfg_int(j, "hidden_size", -1, 1, 1 << 20, &v[0], path)) ||
            (s = cfg_int(j, "intermediate_size", -1, 1, 1 << 24, &v[1], path)) ||
            (s = cfg_int(j, "num_hidden_layers", -1, 1, 1 << 12, &v[2], path)) ||
            (s = cfg_int(j, "num_attention_heads", -1, 1, 1 << 12, &v[3], path)) ||
            (s = cfg_int(j, "num_key_value_heads", v[3], 1, 1 << 12, &v[4], path)) ||
            (s = cfg_int(j, "vocab_size", -1, 1, 1 << 24, &v[5], path)) ||
            (s = cfg_int(j, "max_position_embeddings", 2048, 1, 1 << 24, &v[6], path)) ||
            (s = cfg_int(j, "head_dim",
                         gemma2     ? 256
                         : v[3] > 0 ? v[0] / v[3]
                                    : 0,
                         1, 1 << 16, &v[7], path)) ||
            (s = cfg_float(j, "rms_norm_eps", 1e-6, &eps, path)) ||
            (s = cfg_float(j, "rope_theta", 10000.0, &theta, path)))
            return s;
        /* Gemma2Config reads hidden_activation (its hidden_act is the older name) */
        const char *act = gemma2 && cfg_str(j, "hidden_activation")
                              ? cfg_str(j, "hidden_activation")
                              : cfg_str(j, "hidden_act");
        const char *want = gemma2 ? "gelu_pytorch_tanh" : "silu";
        if (act && strcmp(act, want))
            return core_err(TLM_ERR_UNSUPPORTED, "%s: hidden activation '%s' (only %s)", path, act,
                            want);
        if (v[7] * v[3] != v[0])
            return core_err(TLM_ERR_UNSUPPORTED, "%s: head_dim %ld x %ld heads != hidden_size %ld",
                            path, v[7], v[3], v[0]);
        const cJSON *rs = cJSON_GetObjectItemCaseSensitive(j, "rope_scaling");
        if (rs && !cJSON_IsNull(rs) && gemma2)
            return core_err(TLM_ERR_UNSUPPORTED, "%s: Gemma 2 with rope_scaling", path);
        if (rs && !cJSON_IsNull(rs)) {
            const char *rt = cJSON_IsObject(rs) ? cfg_str(rs, "rope_type") : NULL;
            if (!rt && cJSON_IsObject(rs)) rt = cfg_str(rs, "type");
            if (!rt || strcmp(rt, "llama3"))
                return core_err(TLM_ERR_UNSUPPORTED,
                                "%s: rope_scaling '%s' is not supported (llama3 is)", path,
                                rt ? rt : "?");
            if (v[7] / 2 > FMT_HF_MAX_FACTORS)
                return core_err(TLM_ERR_UNSUPPORTED, "%s: head_dim %ld with rope_scaling", path,
                                v[7]);
            if ((s = llama3_factors(rs, path, theta, (int)v[7], rope_factors))) return s;
            *n_factors = (int)v[7] / 2;
        }
        int ab = cfg_bool(j, "attention_bias", 0), mb = cfg_bool(j, "mlp_bias", 0);
        if (ab || mb)
            return core_err(TLM_ERR_UNSUPPORTED, "%s: Llama with attention_bias/mlp_bias", path);
        /* Qwen2: biases on q, k and v; a sliding window (its long-context option) tlm lacks */
        if (qwen2 && cfg_bool(j, "use_sliding_window", 0))
            return core_err(TLM_ERR_UNSUPPORTED, "%s: Qwen2 with use_sliding_window", path);
        c->qkv_bias = qwen2;
        /* MistralConfig's window covers every layer; null is none */
        long win = 0;
        if (mistral && (s = cfg_int(j, "sliding_window", 0, 1, 1 << 24, &win, path))) return s;
        c->sliding_window = (int)win;
        c->d_model = (int)v[0];
        c->d_ff = (int)v[1];
        c->n_layers = (int)v[2];
        c->n_heads = (int)v[3];
        c->n_kv_heads = (int)v[4];
        c->vocab_size = (int)v[5];
        c->context_length = (int)v[6];
        c->norm = TLM_NORM_RMSNORM;
        c->norm_eps = (float)eps;
        c->norm_position = TLM_NORM_PRE;
        c->ffn = TLM_FFN_SWIGLU;
        c->position = TLM_POS_ROPE;
        c->rope_theta = (float)theta;
        c->rope_pairing = TLM_ROPE_HALF;
        c->bias = 0;
        /* LlamaConfig's default is untied, Gemma2Config's tied. */
        c->tie_embeddings = cfg_bool(j, "tie_word_embeddings", gemma2);
        if (gemma2) {
            double qpas;
            c->ffn = TLM_FFN_GEGLU;
            c->post_norms = 1;
            /* Gemma2Model scales the embeddings by sqrt(hidden_size) in its code */
            c->embed_scale = sqrtf((float)c->d_model);
            if ((s = cfg_float(j, "query_pre_attn_scalar", 256.0, &qpas, path)) ||
                (s = cfg_cap(j, "attn_logit_softcapping", 50.0, &c->attn_softcap, path)) ||
                (s = cfg_cap(j, "final_logit_softcapping", 30.0, &c->final_softcap, path)) ||
                (s = gemma2_windows(j, path, c)))
                return s;
            c->attn_scale = (float)(1.0 / sqrt(qpas));
        }
    } else {
        if ((s = cfg_int(j, "n_embd", 768, 1, 1 << 20, &v[0], path)) ||
            (s = cfg_int(j, "n_layer", 12, 1, 1 << 12, &v[2], path)) ||
            (s = cfg_int(j, "n_head", 12, 1, 1 << 12, &v[3], path)) ||
            (s = cfg_int(j, "vocab_size", 50257, 1, 1 << 24, &v[5], path)) ||
            (s = cfg_int(j, "n_positions", 1024, 1, 1 << 24, &v[6], path)) ||
            (s = cfg_int(j, "n_inner", 4 * v[0], 1, 1 << 24, &v[1], path)) ||
            (s = cfg_float(j, "layer_norm_epsilon", 1e-5, &eps, path)))
            return s;
        const char *act = cfg_str(j, "activation_function");
        if (act && strcmp(act, "gelu_new") && strcmp(act, "gelu_pytorch_tanh") &&
            strcmp(act, "gelu") && strcmp(act, "relu"))
            return core_err(TLM_ERR_UNSUPPORTED, "%s: activation_function '%s'", path, act);
        if (cfg_bool(j, "scale_attn_by_inverse_layer_idx", 0) ||
            !cfg_bool(j, "scale_attn_weights", 1))
            return core_err(TLM_ERR_UNSUPPORTED, "%s: non-standard GPT-2 attention scaling", path);
        c->d_model = (int)v[0];
        c->d_ff = (int)v[1];
        c->n_layers = (int)v[2];
        c->n_heads = (int)v[3];
        c->n_kv_heads = (int)v[3];
        c->vocab_size = (int)v[5];
        c->context_length = (int)v[6];
        c->norm = TLM_NORM_LAYERNORM;
        c->norm_eps = (float)eps;
        c->norm_position = TLM_NORM_PRE;
        c->ffn = !act || strcmp(act, "gelu") ? TLM_FFN_GELU_TANH : TLM_FFN_GELU;
        if (act && !strcmp(act, "relu")) c->ffn = TLM_FFN_RELU;
        c->position = TLM_POS_LEARNED;
        c->bias = 1;
        c->tie_embeddings = cfg_bool(j, "tie_word_embeddings", 1);
    }
    s = tlm_config_finalize(c);
    if (s) return core_err_context(s, "%s: config.json", path);
    return TLM_OK;
}

/* Where tensor `name` (of shape [d0] or [d0, d1]) lies in the shards: src of the schema tensor
 * tlm_name of m. With m NULL, only checks it is there with its shape (before allocating). */
static tlm_status source(const hf_dir *h, const char *name, int64_t d0, int64_t d1,
                         const tlm_model *m, const char *tlm_name, mdl_bind_src *src, float add) {
    tlm_status s = read_tensor(h, name, d0, d1, NULL);
    if (s || !m) return s;
    int fi, ti = mdl_index(m, tlm_name);
    const io_st_tensor *t = find(h, name, &fi);
    if (ti < 0)
        return core_err(TLM_ERR_FORMAT, "%s: no tensor '%s' in this config", h->dir, tlm_name);
    if (!core_dtype_get(t->dtype)->is_float)
        return core_err(TLM_ERR_FORMAT, "%s: tensor '%s' has dtype %s, expected a float type",
                        h->dir, name, tlm_dtype_name(t->dtype));
    src[ti] = (mdl_bind_src){t->dtype, h->files[fi].data + t->begin, add};
    return TLM_OK;
}

/* Llama weights need no reordering (HF's half pairing is tlm's `half`): they bind in place.
 * Gemma 2 names its four norms after where they sit and stores w for a norm that scales by
 * 1 + w: those are copies with the 1 added. */
static tlm_status load_llama(hf_dir *h, const tlm_config *c, int gemma2, const tlm_model *m,
                             mdl_bind_src *src) {
    int64_t d = c->d_model, hd = d / c->n_heads, kv = hd * c->n_kv_heads, ff = c->d_ff;
    float one = gemma2 ? 1.0f : 0.0f;
    tlm_status s =
        source(h, "model.embed_tokens.weight", c->vocab_size, d, m, "token_embd.weight", src, 0);
    typedef struct {
        const char *hf, *tlm;
        int kind; /* 0 norm, 1 q/o [d,d], 2 k/v [kv,d], 3 gate/up [ff,d], 4 down [d,ff] */
    } name_map;
    static const name_map llama_map[] = {
        {"input_layernorm", "attn_norm", 0},    {"self_attn.q_proj", "attn_q", 1},
        {"self_attn.k_proj", "attn_k", 2},      {"self_attn.v_proj", "attn_v", 2},
        {"self_attn.o_proj", "attn_output", 1}, {"post_attention_layernorm", "ffn_norm", 0},
        {"mlp.gate_proj", "ffn_gate", 3},       {"mlp.up_proj", "ffn_up", 3},
        {"mlp.down_proj", "ffn_down", 4}};
    static const name_map gemma2_map[] = {{"input_layernorm", "attn_norm", 0},
                                          {"self_attn.q_proj", "attn_q", 1},
                                          {"self_attn.k_proj", "attn_k", 2},
                                          {"self_attn.v_proj", "attn_v", 2},
                                          {"self_attn.o_proj", "attn_output", 1},
                                          {"post_attention_layernorm", "post_attention_norm", 0},
                                          {"pre_feedforward_layernorm", "ffn_norm", 0},
                                          {"mlp.gate_proj", "ffn_gate", 3},
                                          {"mlp.up_proj", "ffn_up", 3},
                                          {"mlp.down_proj", "ffn_down", 4},
                                          {"post_feedforward_layernorm", "post_ffw_norm", 0}};
    const name_map *map = gemma2 ? gemma2_map : llama_map;
    size_t n_map =
        gemma2 ? sizeof gemma2_map / sizeof *gemma2_map : sizeof llama_map / sizeof *llama_map;
    for (int l = 0; l < c->n_layers && !s; l++)
        for (size_t i = 0; i < n_map && !s; i++) {
            char hn[128], tn[64];
            snprintf(hn, sizeof hn, "model.layers.%d.%s.weight", l, map[i].hf);
            snprintf(tn, sizeof tn, "blk.%d.%s.weight", l, map[i].tlm);
            int64_t shp[5][2] = {{d, 0}, {d, d}, {kv, d}, {ff, d}, {d, ff}};
            s = source(h, hn, shp[map[i].kind][0], shp[map[i].kind][1], m, tn, src,
                       map[i].kind ? 0.0f : one);
            if (!s && c->qkv_bias && (map[i].kind == 2 || i == 1)) { /* q, k, v biases */
                snprintf(hn, sizeof hn, "model.layers.%d.%s.bias", l, map[i].hf);
                snprintf(tn, sizeof tn, "blk.%d.%s.bias", l, map[i].tlm);
                s = source(h, hn, shp[map[i].kind][0], 0, m, tn, src, 0);
            }
        }
    if (!s) s = source(h, "model.norm.weight", d, 0, m, "output_norm.weight", src, one);
    if (!s && !c->tie_embeddings)
        s = source(h, "lm_head.weight", c->vocab_size, d, m, "output.weight", src, 0);
    return s;
}

static tlm_status load_gpt2(hf_dir *h, const tlm_config *c, tlm_model *m) {
    int64_t d = c->d_model, ff = c->d_ff;
    int fi;
    h->prefix = "";
    h->prefix = find(h, "wte.weight", &fi) ? "" : "transformer.";
    size_t big = (size_t)(ff > 3 * d ? ff : 3 * d) * (size_t)d;
    float *tmp = NULL, *qkv = NULL, *qkvb = NULL;
    tlm_status s = TLM_OK;
    if (m) { /* scratch only when reading (the validation pass has checked the shapes) */
        tmp = malloc(big * sizeof(float));
        qkv = malloc((size_t)3 * d * d * sizeof(float));
        qkvb = malloc((size_t)3 * d * sizeof(float));
        if (!tmp || !qkv || !qkvb) s = core_err(TLM_ERR_NOMEM, "out of memory");
    }
    if (!s) s = read_tensor(h, "wte.weight", c->vocab_size, d, fmt_tensor(m, "token_embd.weight"));
    if (!s)
        s = read_tensor(h, "wpe.weight", c->context_length, d,
                        fmt_tensor(m, "position_embd.weight"));
    for (int l = 0; l < c->n_layers && !s; l++) {
        char n[128];
#define P(x) (snprintf(n, sizeof n, "h.%d.%s", l, x), n)
        if ((s = read_tensor(h, P("ln_1.weight"), d, 0,
                             fmt_layer_tensor(m, l, "attn_norm.weight"))) ||
            (s = read_tensor(h, P("ln_1.bias"), d, 0, fmt_layer_tensor(m, l, "attn_norm.bias"))) ||
            (s = read_conv1d(h, P("attn.c_attn.weight"), d, 3 * d, m ? qkv : NULL, tmp)) ||
            (s = read_tensor(h, P("attn.c_attn.bias"), 3 * d, 0, m ? qkvb : NULL)))
            break;
        /* After the transpose, rows 0..d-1 are q, d..2d-1 k, 2d..3d-1 v. */
        static const char *const qkv_names[3] = {"attn_q", "attn_k", "attn_v"};
        for (int p = 0; p < 3 && m; p++) {
            char w[64], b[64];
            snprintf(w, sizeof w, "%s.weight", qkv_names[p]);
            snprintf(b, sizeof b, "%s.bias", qkv_names[p]);
            memcpy(fmt_layer_tensor(m, l, w), qkv + (size_t)p * d * d,
                   (size_t)(d * d) * sizeof(float));
            memcpy(fmt_layer_tensor(m, l, b), qkvb + (size_t)p * d, (size_t)d * sizeof(float));
        }
        if ((s = read_conv1d(h, P("attn.c_proj.weight"), d, d,
                             fmt_layer_tensor(m, l, "attn_output.weight"), tmp)) ||
            (s = read_tensor(h, P("attn.c_proj.bias"), d, 0,
                             fmt_layer_tensor(m, l, "attn_output.bias"))) ||
            (s = read_tensor(h, P("ln_2.weight"), d, 0,
                             fmt_layer_tensor(m, l, "ffn_norm.weight"))) ||
            (s = read_tensor(h, P("ln_2.bias"), d, 0, fmt_layer_tensor(m, l, "ffn_norm.bias"))) ||
            (s = read_conv1d(h, P("mlp.c_fc.weight"), d, ff,
                             fmt_layer_tensor(m, l, "ffn_up.weight"), tmp)) ||
            (s = read_tensor(h, P("mlp.c_fc.bias"), ff, 0,
                             fmt_layer_tensor(m, l, "ffn_up.bias"))) ||
            (s = read_conv1d(h, P("mlp.c_proj.weight"), ff, d,
                             fmt_layer_tensor(m, l, "ffn_down.weight"), tmp)) ||
            (s = read_tensor(h, P("mlp.c_proj.bias"), d, 0,
                             fmt_layer_tensor(m, l, "ffn_down.bias"))))
            break;
#undef P
    }
    if (!s) s = read_tensor(h, "ln_f.weight", d, 0, fmt_tensor(m, "output_norm.weight"));
    if (!s) s = read_tensor(h, "ln_f.bias", d, 0, fmt_tensor(m, "output_norm.bias"));
    if (!s && !c->tie_embeddings) {
        /* lm_head sits outside the transformer. prefix. */
        const char *saved = h->prefix;
        h->prefix = "";
        s = read_tensor(h, "lm_head.weight", c->vocab_size, d, fmt_tensor(m, "output.weight"));
        h->prefix = saved;
    }
    free(tmp);
    free(qkv);
    free(qkvb);
    return s;
}

tlm_status fmt_load_hf(const char *dir, int writable, tlm_model **out) {
    *out = NULL;
    char *cp = core_path_join(dir, "config.json"), *text;
    if (!cp) return core_err(TLM_ERR_NOMEM, "out of memory");
    tlm_status s = core_read_file(cp, &text, NULL);
    free(cp);
    if (s) return s;
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return core_err(TLM_ERR_FORMAT, "%s: config.json is not a JSON object", dir);
    }
    hf_arch arch = HF_LLAMA;
    tlm_config c;
    float factors[FMT_HF_MAX_FACTORS];
    int n_factors = 0;
    s = parse_config(j, dir, &arch, &c, factors, &n_factors);
    cJSON_Delete(j);
    if (s) return s;
    hf_dir *h = calloc(1, sizeof *h);
    if (!h) return core_err(TLM_ERR_NOMEM, "out of memory");
    h->dir = dir;
    h->prefix = "";
    tlm_model *m = NULL;
    mdl_bind_src *src = NULL;
    s = open_tensors(h);
    /* First check every tensor against the files, then allocate and read. GPT-2's Conv1D weights
     * are stored transposed and its q, k, v fused: those models are always copied. */
    int gemma2 = arch == HF_GEMMA2;
    if (!s) s = arch == HF_GPT2 ? load_gpt2(h, &c, NULL) : load_llama(h, &c, gemma2, NULL, NULL);
    if (!s) s = fmt_model_new(&c, dir, writable || arch == HF_GPT2, &m);
    if (!s && arch == HF_GPT2) s = load_gpt2(h, &c, m);
    if (!s && arch != HF_GPT2) {
        src = calloc((size_t)m->n_tensors, sizeof *src);
        core_mmap *maps = calloc((size_t)h->n_files + 1, sizeof *maps);
        s = src && maps ? load_llama(h, &c, gemma2, m, src)
                        : core_err(TLM_ERR_NOMEM, "out of memory");
        if (!s) {
            /* The model keeps the shards mapped while its views point into them. */
            for (int i = 0; i < h->n_files; i++) {
                maps[i] = h->files[i].map;
                h->files[i].map = (core_mmap){0};
            }
            s = mdl_bind(m, src, maps, h->n_files);
        }
        free(maps);
    }
    if (!s && n_factors) s = mdl_set_rope_factors(m, factors, n_factors);
    free(src);
    close_dir(h);
    free(h);
    if (s) {
        tlm_model_free(m);
        return s;
    }
    *out = m;
    return TLM_OK;
}

tlm_status tlm_model_load_hf(const char *dir, tlm_model **out) { return fmt_load_hf(dir, 0, out); }

/* ---- export ---------------------------------------------------------------------------------- */

/* 1 if the config is GPT-2's shape: pre-norm LayerNorm with biases, learned positions, gelu, every
 * layer seeing the whole context. */
static int is_gpt2_style(const tlm_config *c) {
    return c->norm == TLM_NORM_LAYERNORM && c->norm_position == TLM_NORM_PRE && c->bias &&
           !c->sliding_window && !fmt_gemma_field(c) && c->position == TLM_POS_LEARNED &&
           c->n_kv_heads == c->n_heads &&
           (c->ffn == TLM_FFN_GELU_TANH || c->ffn == TLM_FFN_GELU || c->ffn == TLM_FFN_RELU);
}

typedef struct {
    io_st_out_tensor *t;
    int n, cap;
    float **owned; /* converted copies to free */
    int n_owned;
} out_list;

static tlm_status push(out_list *o, const char *name, tlm_dtype dt, int64_t d0, int64_t d1,
                       const float *data) {
    if (o->n == o->cap) {
        int cap = o->cap ? 2 * o->cap : 64;
        io_st_out_tensor *t = realloc(o->t, (size_t)cap * sizeof *t);
        float **ow = realloc(o->owned, (size_t)cap * sizeof *ow);
        if (ow) o->owned = ow;
        if (!t || !ow) {
            if (t) o->t = t;
            return core_err(TLM_ERR_NOMEM, "out of memory");
        }
        o->t = t;
        o->cap = cap;
    }
    io_st_out_tensor *t = &o->t[o->n++];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    if (!t->name) return core_err(TLM_ERR_NOMEM, "out of memory");
    t->dtype = dt;
    t->ndim = d1 > 0 ? 2 : 1;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->data = data;
    return TLM_OK;
}

static float *own(out_list *o, size_t n) {
    float *p = malloc(n * sizeof(float));
    if (p) o->owned[o->n_owned++] = p;
    return p;
}

static tlm_status own_push(out_list *o, const char *name, tlm_dtype dt, int64_t d0, int64_t d1,
                           float **p) {
    /* grow first so that owned has room */
    tlm_status s = push(o, name, dt, d0, d1, NULL);
    if (s) return s;
    *p = own(o, (size_t)d0 * (size_t)(d1 > 0 ? d1 : 1));
    if (!*p) return core_err(TLM_ERR_NOMEM, "out of memory");
    o->t[o->n - 1].data = *p;
    return TLM_OK;
}

static void free_list(out_list *o) {
    for (int i = 0; i < o->n; i++) free((char *)o->t[i].name);
    for (int i = 0; i < o->n_owned; i++) free(o->owned[i]);
    free(o->t);
    free(o->owned);
}

static void transpose(const float *src, int64_t rows, int64_t cols, float *dst) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t k = 0; k < cols; k++) dst[k * rows + r] = src[r * cols + k];
}

/* A norm's weight; Gemma's scale by 1 + w, so w is the weight less 1. */
static tlm_status push_norm(out_list *o, const char *name, tlm_dtype dt, int64_t d, const float *w,
                            int gemma2) {
    if (!gemma2) return push(o, name, dt, d, 0, w);
    float *p;
    tlm_status s = own_push(o, name, dt, d, 0, &p);
    for (int64_t i = 0; i < d && !s; i++) p[i] = w[i] - 1.0f;
    return s;
}

/* Llama's layout, Mistral's (a window on every layer), Qwen2's (q, k and v biases) or Gemma 2's
 * (four norms a layer, GeGLU, soft-caps, a tied head). */
static tlm_status export_llama(const tlm_model *m, tlm_dtype dt, int gemma2, out_list *o,
                               cJSON *cfg) {
    const tlm_config *c = &m->c;
    int64_t d = c->d_model, hd = d / c->n_heads, kv = hd * c->n_kv_heads, ff = c->d_ff;
    tlm_status s = push(o, "model.embed_tokens.weight", dt, c->vocab_size, d,
                        fmt_tensor_c(m, "token_embd.weight"));
    for (int l = 0; l < c->n_layers && !s; l++) {
        char n[128];
#define N(x) (snprintf(n, sizeof n, "model.layers.%d.%s.weight", l, x), n)
        s = push_norm(o, N("input_layernorm"), dt, d, fmt_layer_tensor_c(m, l, "attn_norm.weight"),
                      gemma2);
        for (int qk = 0; qk < 2 && !s; qk++) {
            const float *src = fmt_layer_tensor_c(m, l, qk ? "attn_k.weight" : "attn_q.weight");
            const float *bsrc =
                c->qkv_bias ? fmt_layer_tensor_c(m, l, qk ? "attn_k.bias" : "attn_q.bias") : NULL;
            int64_t rows = qk ? kv : d;
            char bn[128];
            snprintf(bn, sizeof bn, "model.layers.%d.self_attn.%s.bias", l,
                     qk ? "k_proj" : "q_proj");
            if (c->rope_pairing == TLM_ROPE_HALF) {
                s = push(o, N(qk ? "self_attn.k_proj" : "self_attn.q_proj"), dt, rows, d, src);
                if (!s && bsrc) s = push(o, bn, dt, rows, 0, bsrc);
            } else {
                /* HF rotates halves: reorder adjacent-pair rows (and their biases) into half
                 * order. */
                float *p, *pb = NULL;
                s = own_push(o, N(qk ? "self_attn.k_proj" : "self_attn.q_proj"), dt, rows, d, &p);
                if (!s) memcpy(p, src, (size_t)(rows * d) * sizeof(float));
                if (!s && bsrc) s = own_push(o, bn, dt, rows, 0, &pb);
                if (!s && pb) memcpy(pb, bsrc, (size_t)rows * sizeof(float));
                if (!s) s = fmt_permute_qk(p, pb, (int)rows, (int)d, (int)hd, 0);
            }
        }
        if (!s)
            s = push(o, N("self_attn.v_proj"), dt, kv, d,
                     fmt_layer_tensor_c(m, l, "attn_v.weight"));
        if (!s && c->qkv_bias) {
            char bn[128];
            snprintf(bn, sizeof bn, "model.layers.%d.self_attn.v_proj.bias", l);
            s = push(o, bn, dt, kv, 0, fmt_layer_tensor_c(m, l, "attn_v.bias"));
        }
        if (!s)
            s = push(o, N("self_attn.o_proj"), dt, d, d,
                     fmt_layer_tensor_c(m, l, "attn_output.weight"));
        if (!s && gemma2)
            s = push_norm(o, N("post_attention_layernorm"), dt, d,
                          fmt_layer_tensor_c(m, l, "post_attention_norm.weight"), 1);
        if (!s)
            s = push_norm(o, N(gemma2 ? "pre_feedforward_layernorm" : "post_attention_layernorm"),
                          dt, d, fmt_layer_tensor_c(m, l, "ffn_norm.weight"), gemma2);
        if (!s)
            s = push(o, N("mlp.gate_proj"), dt, ff, d, fmt_layer_tensor_c(m, l, "ffn_gate.weight"));
        if (!s) s = push(o, N("mlp.up_proj"), dt, ff, d, fmt_layer_tensor_c(m, l, "ffn_up.weight"));
        if (!s)
            s = push(o, N("mlp.down_proj"), dt, d, ff, fmt_layer_tensor_c(m, l, "ffn_down.weight"));
        if (!s && gemma2)
            s = push_norm(o, N("post_feedforward_layernorm"), dt, d,
                          fmt_layer_tensor_c(m, l, "post_ffw_norm.weight"), 1);
#undef N
    }
    if (!s)
        s = push_norm(o, "model.norm.weight", dt, d, fmt_tensor_c(m, "output_norm.weight"), gemma2);
    if (!s && !c->tie_embeddings)
        s = push(o, "lm_head.weight", dt, c->vocab_size, d, fmt_tensor_c(m, "output.weight"));
    /* q, k and v biases alone are Qwen2's layout (transformers' Qwen2ForCausalLM) */
    int mistral = !gemma2 && c->sliding_window;
    const char *arch = gemma2        ? "Gemma2ForCausalLM"
                       : c->qkv_bias ? "Qwen2ForCausalLM"
                       : mistral     ? "MistralForCausalLM"
                                     : "LlamaForCausalLM";
    cJSON_AddItemToObject(cfg, "architectures", cJSON_CreateStringArray(&arch, 1));
    cJSON_AddStringToObject(cfg, "model_type",
                            gemma2        ? "gemma2"
                            : c->qkv_bias ? "qwen2"
                            : mistral     ? "mistral"
                                          : "llama");
    cJSON_AddNumberToObject(cfg, "hidden_size", (double)d);
    cJSON_AddNumberToObject(cfg, "intermediate_size", (double)ff);
    cJSON_AddNumberToObject(cfg, "num_hidden_layers", c->n_layers);
    cJSON_AddNumberToObject(cfg, "num_attention_heads", c->n_heads);
    cJSON_AddNumberToObject(cfg, "num_key_value_heads", c->n_kv_heads);
    cJSON_AddNumberToObject(cfg, "head_dim", (double)hd);
    cJSON_AddNumberToObject(cfg, "vocab_size", c->vocab_size);
    cJSON_AddNumberToObject(cfg, "max_position_embeddings", c->context_length);
    cJSON_AddNumberToObject(cfg, "rms_norm_eps", (double)c->norm_eps);
    cJSON_AddNumberToObject(cfg, "rope_theta", (double)c->rope_theta);
    cJSON_AddNullToObject(cfg, "rope_scaling");
    if (gemma2) {
        /* Gemma2Config's names; its attention scale is query_pre_attn_scalar ** -0.5 */
        double sc = tlm_config_attn_scale(c);
        cJSON_AddStringToObject(cfg, "hidden_activation", "gelu_pytorch_tanh");
        cJSON_AddNumberToObject(cfg, "query_pre_attn_scalar", 1.0 / (sc * sc));
        if (c->attn_softcap > 0.0f)
            cJSON_AddNumberToObject(cfg, "attn_logit_softcapping", (double)c->attn_softcap);
        else
            cJSON_AddNullToObject(cfg, "attn_logit_softcapping");
        if (c->final_softcap > 0.0f)
            cJSON_AddNumberToObject(cfg, "final_logit_softcapping", (double)c->final_softcap);
        else
            cJSON_AddNullToObject(cfg, "final_logit_softcapping");
        cJSON_AddNumberToObject(cfg, "sliding_window",
                                c->sliding_window ? c->sliding_window : c->context_length);
        cJSON *lt = cJSON_AddArrayToObject(cfg, "layer_types");
        for (int l = 0; l < c->n_layers && lt; l++)
            cJSON_AddItemToArray(lt, cJSON_CreateString(tlm_config_layer_windowed(c, l)
                                                            ? "sliding_attention"
                                                            : "full_attention"));
        cJSON_AddBoolToObject(cfg, "attention_bias", 0);
    } else {
        cJSON_AddStringToObject(cfg, "hidden_act", "silu");
    }
    if (mistral) cJSON_AddNumberToObject(cfg, "sliding_window", c->sliding_window);
    if (c->qkv_bias) {
        cJSON_AddBoolToObject(cfg, "use_sliding_window", 0);
    } else if (!gemma2) {
        cJSON_AddBoolToObject(cfg, "attention_bias", 0);
        cJSON_AddBoolToObject(cfg, "mlp_bias", 0);
    }
    cJSON_AddBoolToObject(cfg, "tie_word_embeddings", c->tie_embeddings);
    return s;
}

static tlm_status export_gpt2(const tlm_model *m, tlm_dtype dt, out_list *o, cJSON *cfg) {
    const tlm_config *c = &m->c;
    int64_t d = c->d_model, ff = c->d_ff;
    tlm_status s = push(o, "transformer.wte.weight", dt, c->vocab_size, d,
                        fmt_tensor_c(m, "token_embd.weight"));
    if (!s)
        s = push(o, "transformer.wpe.weight", dt, c->context_length, d,
                 fmt_tensor_c(m, "position_embd.weight"));
    for (int l = 0; l < c->n_layers && !s; l++) {
        char n[128];
        float *p;
#define N(x) (snprintf(n, sizeof n, "transformer.h.%d.%s", l, x), n)
#define T(x) fmt_layer_tensor_c(m, l, x)
        if ((s = push(o, N("ln_1.weight"), dt, d, 0, T("attn_norm.weight"))) ||
            (s = push(o, N("ln_1.bias"), dt, d, 0, T("attn_norm.bias"))) ||
            (s = own_push(o, N("attn.c_attn.weight"), dt, d, 3 * d, &p)))
            break;
        /* Conv1D [in, out]: column block p of the fused output is q, k, v. */
        static const char *const qn[3] = {"attn_q", "attn_k", "attn_v"};
        for (int part = 0; part < 3; part++) {
            char w[64];
            snprintf(w, sizeof w, "%s.weight", qn[part]);
            const float *src = T(w);
            for (int64_t r = 0; r < d; r++)
                for (int64_t k = 0; k < d; k++) p[k * 3 * d + part * d + r] = src[r * d + k];
        }
        if ((s = own_push(o, N("attn.c_attn.bias"), dt, 3 * d, 0, &p))) break;
        for (int part = 0; part < 3; part++) {
            char b[64];
            snprintf(b, sizeof b, "%s.bias", qn[part]);
            memcpy(p + part * d, T(b), (size_t)d * sizeof(float));
        }
        if ((s = own_push(o, N("attn.c_proj.weight"), dt, d, d, &p))) break;
        transpose(T("attn_output.weight"), d, d, p);
        if ((s = push(o, N("attn.c_proj.bias"), dt, d, 0, T("attn_output.bias"))) ||
            (s = push(o, N("ln_2.weight"), dt, d, 0, T("ffn_norm.weight"))) ||
            (s = push(o, N("ln_2.bias"), dt, d, 0, T("ffn_norm.bias"))) ||
            (s = own_push(o, N("mlp.c_fc.weight"), dt, d, ff, &p)))
            break;
        transpose(T("ffn_up.weight"), ff, d, p);
        if ((s = push(o, N("mlp.c_fc.bias"), dt, ff, 0, T("ffn_up.bias"))) ||
            (s = own_push(o, N("mlp.c_proj.weight"), dt, ff, d, &p)))
            break;
        transpose(T("ffn_down.weight"), d, ff, p);
        if ((s = push(o, N("mlp.c_proj.bias"), dt, d, 0, T("ffn_down.bias")))) break;
#undef N
#undef T
    }
    if (!s) s = push(o, "transformer.ln_f.weight", dt, d, 0, fmt_tensor_c(m, "output_norm.weight"));
    if (!s) s = push(o, "transformer.ln_f.bias", dt, d, 0, fmt_tensor_c(m, "output_norm.bias"));
    if (!s && !c->tie_embeddings)
        s = push(o, "lm_head.weight", dt, c->vocab_size, d, fmt_tensor_c(m, "output.weight"));
    cJSON_AddItemToObject(cfg, "architectures",
                          cJSON_CreateStringArray((const char *[]){"GPT2LMHeadModel"}, 1));
    cJSON_AddStringToObject(cfg, "model_type", "gpt2");
    cJSON_AddNumberToObject(cfg, "n_embd", (double)d);
    cJSON_AddNumberToObject(cfg, "n_layer", c->n_layers);
    cJSON_AddNumberToObject(cfg, "n_head", c->n_heads);
    cJSON_AddNumberToObject(cfg, "n_inner", (double)ff);
    cJSON_AddNumberToObject(cfg, "n_positions", c->context_length);
    cJSON_AddNumberToObject(cfg, "n_ctx", c->context_length);
    cJSON_AddNumberToObject(cfg, "vocab_size", c->vocab_size);
    cJSON_AddNumberToObject(cfg, "layer_norm_epsilon", (double)c->norm_eps);
    cJSON_AddStringToObject(cfg, "activation_function",
                            c->ffn == TLM_FFN_GELU   ? "gelu"
                            : c->ffn == TLM_FFN_RELU ? "relu"
                                                     : "gelu_new");
    cJSON_AddBoolToObject(cfg, "scale_attn_weights", 1);
    cJSON_AddBoolToObject(cfg, "tie_word_embeddings", c->tie_embeddings);
    return s;
}

tlm_status tlm_model_save_hf(const tlm_model *m, const char *dir, tlm_dtype dtype) {
    const tlm_config *c = &m->c;
    tlm_status fs = fmt_no_experts(m, "Hugging Face export");
    if (!fs) fs = fmt_need_f32(m, "Hugging Face export");
    if (!fs) fs = fmt_no_rope_factors(m, "Hugging Face export");
    if (fs) return fs;
    if (dtype != TLM_DTYPE_F32 && dtype != TLM_DTYPE_F16 && dtype != TLM_DTYPE_BF16)
        return core_err(TLM_ERR_UNSUPPORTED, "Hugging Face export writes F32, F16 or BF16, not %s",
                        tlm_dtype_name(dtype));
    tlm_dtype dt = dtype;
    char why[160];
    int gemma2 = fmt_is_gemma2_style(c, 0, why, sizeof why);
    if (!gemma2 && fmt_gemma_field(c))
        return core_err(TLM_ERR_UNSUPPORTED, "Hugging Face export as Gemma2ForCausalLM: %s", why);
    int llama = gemma2 || fmt_is_llama_style(c, 1, 1, NULL, 0);
    if (!llama && !is_gpt2_style(c))
        return core_err(TLM_ERR_UNSUPPORTED,
                        "Hugging Face export supports Llama-style (rmsnorm, swiglu, rope, no bias "
                        "or q/k/v biases: Qwen2; a sliding window: Mistral), Gemma 2-style and "
                        "GPT-2-style (layernorm with bias, learned positions, gelu) models");
    if (llama && !gemma2 && c->qkv_bias && c->sliding_window)
        return core_err(TLM_ERR_UNSUPPORTED,
                        "Hugging Face export: q, k and v biases with a sliding window (Qwen2's "
                        "use_sliding_window, which tlm does not write)");
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return core_err(TLM_ERR_IO, "cannot create directory '%s': %s", dir, strerror(errno));
    out_list o = {0};
    cJSON *cfg = cJSON_CreateObject();
    if (!cfg) return core_err(TLM_ERR_NOMEM, "out of memory");
    tlm_status s = llama ? export_llama(m, dt, gemma2, &o, cfg) : export_gpt2(m, dt, &o, cfg);
    cJSON_AddStringToObject(cfg, "torch_dtype",
                            dt == TLM_DTYPE_F16    ? "float16"
                            : dt == TLM_DTYPE_BF16 ? "bfloat16"
                                                   : "float32");
    char *p = NULL, *json = NULL;
    if (!s) {
        const char *k[] = {"format"}, *v[] = {"pt"};
        p = core_path_join(dir, "model.safetensors");
        s = p ? io_st_write(p, o.t, o.n, k, v, 1) : core_err(TLM_ERR_NOMEM, "out of memory");
        free(p);
    }
    if (!s) {
        json = cJSON_Print(cfg);
        p = core_path_join(dir, "config.json");
        s = p && json ? core_write_file_atomic(p, json, strlen(json))
                      : core_err(TLM_ERR_NOMEM, "out of memory");
        free(p);
        free(json);
    }
    cJSON_Delete(cfg);
    free_list(&o);
    return s;
}

/* ---- listing (tlm info) ---------------------------------------------------------------------- */

tlm_status fmt_safetensors_list(const io_st_file *f, tlm_file_tensor **out, int *n) {
    tlm_file_tensor *t = realloc(*out, (size_t)(*n + f->n + 1) * sizeof *t);
    if (!t) return core_err(TLM_ERR_NOMEM, "out of memory");
    *out = t;
    for (int i = 0; i < f->n; i++) {
        tlm_file_tensor *e = &t[(*n)++];
        memset(e, 0, sizeof *e);
        snprintf(e->name, sizeof e->name, "%s", f->tensors[i].name);
        snprintf(e->dtype, sizeof e->dtype, "%s", tlm_dtype_name(f->tensors[i].dtype));
        e->ndim = f->tensors[i].ndim > 4 ? 4 : f->tensors[i].ndim;
        for (int d = 0; d < e->ndim; d++) e->shape[d] = f->tensors[i].shape[d];
    }
    return TLM_OK;
}

tlm_status fmt_hf_list(const char *dir, tlm_file_tensor **out, int *n) {
    hf_dir *h = calloc(1, sizeof *h);
    if (!h) return core_err(TLM_ERR_NOMEM, "out of memory");
    h->dir = dir;
    h->prefix = "";
    tlm_status s = open_tensors(h);
    for (int i = 0; i < h->n_files && !s; i++) s = fmt_safetensors_list(&h->files[i], out, n);
    close_dir(h);
    free(h);
    return s;
}
