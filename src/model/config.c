#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/core.h"

void tlm_config_defaults(tlm_config *c) {
    memset(c, 0, sizeof *c);
    c->vocab_size = 256;
    c->context_length = 256;
    c->d_model = 128;
    c->n_layers = 4;
    c->n_heads = 4;
    c->n_kv_heads = 0;
    c->d_ff = 0;
    c->norm = TLM_NORM_RMSNORM;
    c->norm_eps = 1e-5f;
    c->norm_position = TLM_NORM_PRE;
    c->ffn = TLM_FFN_SWIGLU;
    c->position = TLM_POS_ROPE;
    c->rope_theta = 10000.0f;
    c->rope_pairing = TLM_ROPE_HALF;
    c->tie_embeddings = 1;
    c->bias = 0;
    c->qkv_bias = 0;
    c->dropout = 0.0f;
}

float tlm_config_attn_scale(const tlm_config *c) {
    return c->attn_scale > 0.0f ? c->attn_scale : 1.0f / sqrtf((float)(c->d_model / c->n_heads));
}

int tlm_config_layer_windowed(const tlm_config *c, int l) {
    int p = c->sliding_window_pattern;
    return c->sliding_window > 0 && (p == 0 || (l + 1) % p != 0);
}

/* Enum tables: index = enum value. */
static const char *const norm_names[] = {"rmsnorm", "layernorm"};
static const char *const normpos_names[] = {"pre", "post"};
static const char *const ffn_names[] = {"swiglu", "gelu", "gelu_tanh", "relu", "geglu"};
static const char *const pos_names[] = {"rope", "learned", "sinusoidal", "none"};
static const char *const pairing_names[] = {"half", "interleaved"};
#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

static const char *enum_name(const char *const *names, int n, int v) {
    return v >= 0 && v < n ? names[v] : "?";
}
const char *tlm_norm_name(tlm_norm_kind k) { return enum_name(norm_names, COUNT(norm_names), k); }
const char *tlm_norm_position_name(tlm_norm_position k) {
    return enum_name(normpos_names, COUNT(normpos_names), k);
}
const char *tlm_ffn_name(tlm_ffn_kind k) { return enum_name(ffn_names, COUNT(ffn_names), k); }
const char *tlm_position_name(tlm_position_kind k) {
    return enum_name(pos_names, COUNT(pos_names), k);
}
const char *tlm_rope_pairing_name(tlm_rope_pairing k) {
    return enum_name(pairing_names, COUNT(pairing_names), k);
}

/* Size arithmetic that saturates instead of wrapping: a saturated result is above every limit,
 * so it is refused like any other oversized product. The field limits keep every product here
 * below 2^63 today; the checks keep it that way if a limit is ever raised. */
static size_t sat_mul(size_t a, size_t b) {
    size_t r;
    return core_mul_ok(a, b, &r) ? r : SIZE_MAX;
}

/* The mixture-of-experts fields: all zero for a dense config; else within their limits, on a gated
 * FFN without biases (the experts' tensors have none). */
static tlm_status check_experts(tlm_config *c) {
    struct {
        const char *name;
        float v;
    } coefs[] = {{"router_aux_loss_coef", c->router_aux_loss_coef},
                 {"router_z_loss_coef", c->router_z_loss_coef}};
    for (int i = 0; i < COUNT(coefs); i++)
        if (!(coefs[i].v >= 0.0f) || !isfinite(coefs[i].v))
            return core_err(TLM_ERR_CONFIG, "%s must be >= 0 and finite (got %g)", coefs[i].name,
                            (double)coefs[i].v);
    if (c->n_experts < 0 || c->n_experts > TLM_MAX_N_EXPERTS)
        return core_err(TLM_ERR_CONFIG, "n_experts %d must be in [0, %d] (0: a dense FFN)",
                        c->n_experts, TLM_MAX_N_EXPERTS);
    if (c->n_experts == 0) {
        struct {
            const char *name;
            int set;
        } moe[] = {{"n_experts_used", c->n_experts_used != 0},
                   {"expert_d_ff", c->expert_d_ff != 0},
                   {"expert_weights_norm", c->expert_weights_norm != 0},
                   {"n_shared_experts", c->n_shared_experts != 0},
                   {"router_aux_loss_coef", c->router_aux_loss_coef != 0.0f},
                   {"router_z_loss_coef", c->router_z_loss_coef != 0.0f}};
        for (int i = 0; i < COUNT(moe); i++)
            if (moe[i].set)
                return core_err(TLM_ERR_CONFIG, "%s needs n_experts > 0 (a mixture of experts)",
                                moe[i].name);
        return TLM_OK;
    }
    if (c->n_experts_used < 1 || c->n_experts_used > c->n_experts)
        return core_err(TLM_ERR_CONFIG, "n_experts_used %d must be in [1, n_experts %d]",
                        c->n_experts_used, c->n_experts);
    if (c->expert_d_ff < 0 || c->expert_d_ff > TLM_MAX_D_FF)
        return core_err(TLM_ERR_CONFIG, "expert_d_ff %d must be in [0, %d] (0: d_ff)",
                        c->expert_d_ff, TLM_MAX_D_FF);
    if (c->expert_d_ff == 0) c->expert_d_ff = c->d_ff;
    if (c->expert_weights_norm != 0 && c->expert_weights_norm != 1)
        return core_err(TLM_ERR_CONFIG, "expert_weights_norm must be true or false");
    if (c->n_shared_experts < 0 ||
        (int64_t)c->n_shared_experts * c->expert_d_ff > (int64_t)TLM_MAX_D_FF)
        return core_err(TLM_ERR_CONFIG,
                        "n_shared_experts %d x expert_d_ff %d must be in [0, %d] (the shared "
                        "expert's width)",
                        c->n_shared_experts, c->expert_d_ff, TLM_MAX_D_FF);
    if (c->ffn != TLM_FFN_SWIGLU && c->ffn != TLM_FFN_GEGLU)
        return core_err(TLM_ERR_CONFIG,
                        "n_experts needs a gated ffn (swiglu or geglu) for its experts; got %s",
                        tlm_ffn_name(c->ffn));
    if (c->bias)
        return core_err(TLM_ERR_CONFIG, "n_experts: the experts and the router have no biases; "
                                        "set bias false");
    return TLM_OK;
}

tlm_status tlm_config_finalize(tlm_config *c) {
    struct {
        const char *name;
        int v, max;
    } sizes[] = {{"vocab_size", c->vocab_size, TLM_MAX_VOCAB_SIZE},
                 {"context_length", c->context_length, TLM_MAX_CONTEXT_LENGTH},
                 {"d_model", c->d_model, TLM_MAX_D_MODEL},
                 {"n_layers", c->n_layers, TLM_MAX_N_LAYERS},
                 {"n_heads", c->n_heads, TLM_MAX_N_HEADS}};
    for (int i = 0; i < COUNT(sizes); i++) {
        if (sizes[i].v <= 0)
            return core_err(TLM_ERR_CONFIG, "%s must be > 0 (got %d)", sizes[i].name, sizes[i].v);
        if (sizes[i].v > sizes[i].max)
            return core_err(TLM_ERR_CONFIG, "%s %d exceeds the limit of %d", sizes[i].name,
                            sizes[i].v, sizes[i].max);
    }
    if (c->n_kv_heads < 0)
        return core_err(TLM_ERR_CONFIG, "n_kv_heads must be >= 0 (0: n_heads; got %d)",
                        c->n_kv_heads);
    if (c->d_ff < 0)
        return core_err(TLM_ERR_CONFIG, "d_ff must be >= 0 (0: derived; got %d)", c->d_ff);
    if (c->d_ff > TLM_MAX_D_FF)
        return core_err(TLM_ERR_CONFIG, "d_ff %d exceeds the limit of %d", c->d_ff, TLM_MAX_D_FF);
    if (c->n_kv_heads == 0) c->n_kv_heads = c->n_heads;
    /* Derived from a d_model within its limit, d_ff stays within its own (174784 at most). */
    if (c->d_ff == 0) {
        if (c->ffn == TLM_FFN_SWIGLU || c->ffn == TLM_FFN_GEGLU) {
            /* 8/3 d rounded up to a multiple of 64, in integers: ceil(8d/3), then up to 64. */
            int ff = (8 * c->d_model + 2) / 3;
            c->d_ff = (ff + 63) / 64 * 64;
        } else {
            c->d_ff = 4 * c->d_model;
        }
    }
    if ((unsigned)c->norm >= (unsigned)COUNT(norm_names))
        return core_err(TLM_ERR_CONFIG, "unknown norm %d", (int)c->norm);
    if ((unsigned)c->norm_position >= (unsigned)COUNT(normpos_names))
        return core_err(TLM_ERR_CONFIG, "unknown norm_position %d", (int)c->norm_position);
    if ((unsigned)c->ffn >= (unsigned)COUNT(ffn_names))
        return core_err(TLM_ERR_CONFIG, "unknown ffn %d", (int)c->ffn);
    if ((unsigned)c->position >= (unsigned)COUNT(pos_names))
        return core_err(TLM_ERR_CONFIG, "unknown position %d", (int)c->position);
    if ((unsigned)c->rope_pairing >= (unsigned)COUNT(pairing_names))
        return core_err(TLM_ERR_CONFIG, "unknown rope_pairing %d", (int)c->rope_pairing);
    if (c->d_model % c->n_heads != 0)
        return core_err(TLM_ERR_CONFIG, "d_model %d is not divisible by n_heads %d", c->d_model,
                        c->n_heads);
    if (c->n_kv_heads > c->n_heads || c->n_heads % c->n_kv_heads != 0)
        return core_err(TLM_ERR_CONFIG, "n_heads %d is not divisible by n_kv_heads %d", c->n_heads,
                        c->n_kv_heads);
    int hd = c->d_model / c->n_heads;
    if (c->position == TLM_POS_ROPE && hd % 2 != 0)
        return core_err(TLM_ERR_CONFIG, "rope needs an even head dim (d_model/n_heads = %d)", hd);
    if (!(c->norm_eps > 0.0f) || !isfinite(c->norm_eps))
        return core_err(TLM_ERR_CONFIG, "norm_eps must be > 0 (got %g)", (double)c->norm_eps);
    if (c->position == TLM_POS_ROPE && (!(c->rope_theta > 0.0f) || !isfinite(c->rope_theta)))
        return core_err(TLM_ERR_CONFIG, "rope_theta must be > 0 (got %g)", (double)c->rope_theta);
    if (!(c->dropout >= 0.0f && c->dropout < 1.0f))
        return core_err(TLM_ERR_CONFIG, "dropout must be in [0, 1) (got %g)", (double)c->dropout);
    if (c->tie_embeddings != 0 && c->tie_embeddings != 1)
        return core_err(TLM_ERR_CONFIG, "tie_embeddings must be true or false");
    if (c->bias != 0 && c->bias != 1) return core_err(TLM_ERR_CONFIG, "bias must be true or false");
    if (c->qkv_bias != 0 && c->qkv_bias != 1)
        return core_err(TLM_ERR_CONFIG, "qkv_bias must be true or false");
    if (c->sliding_window < 0 || c->sliding_window > TLM_MAX_CONTEXT_LENGTH)
        return core_err(TLM_ERR_CONFIG, "sliding_window %d must be in [0, %d] (0: none)",
                        c->sliding_window, TLM_MAX_CONTEXT_LENGTH);
    if (c->sliding_window_pattern < 0 || c->sliding_window_pattern > TLM_MAX_N_LAYERS)
        return core_err(TLM_ERR_CONFIG, "sliding_window_pattern %d must be in [0, %d]",
                        c->sliding_window_pattern, TLM_MAX_N_LAYERS);
    if (c->sliding_window_pattern && !c->sliding_window)
        return core_err(TLM_ERR_CONFIG, "sliding_window_pattern %d needs a sliding_window",
                        c->sliding_window_pattern);
    struct {
        const char *name;
        float v;
    } scalars[] = {{"attn_softcap", c->attn_softcap},
                   {"final_softcap", c->final_softcap},
                   {"embed_scale", c->embed_scale},
                   {"attn_scale", c->attn_scale}};
    for (int i = 0; i < COUNT(scalars); i++)
        if (!(scalars[i].v >= 0.0f) || !isfinite(scalars[i].v))
            return core_err(TLM_ERR_CONFIG, "%s must be >= 0 and finite (0: off; got %g)",
                            scalars[i].name, (double)scalars[i].v);
    if (c->post_norms != 0 && c->post_norms != 1)
        return core_err(TLM_ERR_CONFIG, "post_norms must be true or false");
    if (c->post_norms && c->norm_position != TLM_NORM_PRE)
        return core_err(TLM_ERR_CONFIG,
                        "post_norms needs norm_position pre (a post-norm block normalizes after "
                        "each residual add already)");
    tlm_status ms = check_experts(c);
    if (ms) return ms;
    /* tlm_model_new builds these tables eagerly; a file header that asks for a huge context
     * must be refused here, not after minutes of filling gigabytes. */
    size_t ctx = (size_t)c->context_length;
    if (c->position == TLM_POS_ROPE && sat_mul(ctx, (size_t)hd / 2) > TLM_MAX_TABLE_FLOATS)
        return core_err(TLM_ERR_CONFIG,
                        "context_length %d x head_dim/2 %d = %zu floats per RoPE table exceeds "
                        "the limit of %d",
                        c->context_length, hd / 2, sat_mul(ctx, (size_t)hd / 2),
                        TLM_MAX_TABLE_FLOATS);
    if (c->position == TLM_POS_SINUSOIDAL &&
        sat_mul(ctx, (size_t)c->d_model) > TLM_MAX_TABLE_FLOATS)
        return core_err(TLM_ERR_CONFIG,
                        "context_length %d x d_model %d = %zu floats of the sinusoid table exceeds "
                        "the limit of %d",
                        c->context_length, c->d_model, sat_mul(ctx, (size_t)c->d_model),
                        TLM_MAX_TABLE_FLOATS);
    /* Within the field limits above every tensor has fewer than 2^47 elements (an expert tensor:
     * n_experts x expert_d_ff x d_model) and the whole model fewer than 2^62, so the schema's own
     * count cannot overflow: it is the one formula. */
    tlm_param_count pc;
    tlm_config_count_params(c, &pc);
    size_t total = pc.total,
           per_block = (pc.per_component[TLM_COMP_ATTN_NORM] + pc.per_component[TLM_COMP_ATTN] +
                        pc.per_component[TLM_COMP_FFN_NORM] + pc.per_component[TLM_COMP_FFN]) /
                       (size_t)c->n_layers;
    if (total > (uint64_t)TLM_MAX_PARAMS) {
        char pos[96] = "";
        if (c->position == TLM_POS_LEARNED)
            snprintf(pos, sizeof pos, ", position table context_length %d x d_model %d",
                     c->context_length, c->d_model);
        return core_err(TLM_ERR_CONFIG,
                        "the model needs %zu parameters, above the limit of %lld: token "
                        "embedding vocab_size %d x d_model %d%s%s, n_layers %d blocks of %zu",
                        total, (long long)TLM_MAX_PARAMS, c->vocab_size, c->d_model,
                        c->tie_embeddings ? "" : " (twice: untied head)", pos, c->n_layers,
                        per_block);
    }
    return TLM_OK;
}

static tlm_status parse_enum(const cJSON *item, const char *key, const char *const *names, int n,
                             int *out) {
    if (!cJSON_IsString(item)) return core_err(TLM_ERR_CONFIG, "'%s' must be a string", key);
    for (int i = 0; i < n; i++)
        if (!strcmp(item->valuestring, names[i])) {
            *out = i;
            return TLM_OK;
        }
    char allowed[256] = "";
    for (int i = 0; i < n; i++) {
        strncat(allowed, names[i], sizeof allowed - strlen(allowed) - 1);
        if (i + 1 < n) strncat(allowed, "|", sizeof allowed - strlen(allowed) - 1);
    }
    return core_err(TLM_ERR_CONFIG, "unknown %s '%s' (expected %s)", key, item->valuestring,
                    allowed);
}

static tlm_status parse_int(const cJSON *item, const char *key, int *out) {
    if (!cJSON_IsNumber(item)) return core_err(TLM_ERR_CONFIG, "'%s' must be a number", key);
    double v = item->valuedouble;
    if (v != floor(v) || v < -2147483648.0 || v > 2147483647.0)
        return core_err(TLM_ERR_CONFIG, "'%s' must be an integer (got %g)", key, v);
    *out = (int)v;
    return TLM_OK;
}

static tlm_status parse_float(const cJSON *item, const char *key, float *out) {
    if (!cJSON_IsNumber(item)) return core_err(TLM_ERR_CONFIG, "'%s' must be a number", key);
    *out = (float)item->valuedouble;
    return TLM_OK;
}

static tlm_status parse_bool(const cJSON *item, const char *key, int *out) {
    if (cJSON_IsBool(item)) {
        *out = cJSON_IsTrue(item) ? 1 : 0;
        return TLM_OK;
    }
    if (cJSON_IsNumber(item) && (item->valuedouble == 0 || item->valuedouble == 1)) {
        *out = (int)item->valuedouble;
        return TLM_OK;
    }
    return core_err(TLM_ERR_CONFIG, "'%s' must be true or false", key);
}

tlm_status tlm_config_from_json(const char *json, tlm_config *c) {
    tlm_config_defaults(c);
    cJSON *root = cJSON_Parse(json);
    if (!root) return core_err(TLM_ERR_CONFIG, "config is not valid JSON");
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return core_err(TLM_ERR_CONFIG, "config must be a JSON object");
    }
    tlm_status s = TLM_OK;
    int e;
    for (cJSON *it = root->child; it && s == TLM_OK; it = it->next) {
        const char *k = it->string;
        if (!strcmp(k, "vocab_size"))
            s = parse_int(it, k, &c->vocab_size);
        else if (!strcmp(k, "context_length"))
            s = parse_int(it, k, &c->context_length);
        else if (!strcmp(k, "d_model"))
            s = parse_int(it, k, &c->d_model);
        else if (!strcmp(k, "n_layers"))
            s = parse_int(it, k, &c->n_layers);
        else if (!strcmp(k, "n_heads"))
            s = parse_int(it, k, &c->n_heads);
        else if (!strcmp(k, "n_kv_heads"))
            s = parse_int(it, k, &c->n_kv_heads);
        else if (!strcmp(k, "d_ff"))
            s = parse_int(it, k, &c->d_ff);
        else if (!strcmp(k, "norm_eps"))
            s = parse_float(it, k, &c->norm_eps);
        else if (!strcmp(k, "rope_theta"))
            s = parse_float(it, k, &c->rope_theta);
        else if (!strcmp(k, "dropout"))
            s = parse_float(it, k, &c->dropout);
        else if (!strcmp(k, "tie_embeddings"))
            s = parse_bool(it, k, &c->tie_embeddings);
        else if (!strcmp(k, "bias"))
            s = parse_bool(it, k, &c->bias);
        else if (!strcmp(k, "qkv_bias"))
            s = parse_bool(it, k, &c->qkv_bias);
        else if (!strcmp(k, "sliding_window"))
            s = parse_int(it, k, &c->sliding_window);
        else if (!strcmp(k, "sliding_window_pattern"))
            s = parse_int(it, k, &c->sliding_window_pattern);
        else if (!strcmp(k, "attn_softcap"))
            s = parse_float(it, k, &c->attn_softcap);
        else if (!strcmp(k, "final_softcap"))
            s = parse_float(it, k, &c->final_softcap);
        else if (!strcmp(k, "embed_scale"))
            s = parse_float(it, k, &c->embed_scale);
        else if (!strcmp(k, "attn_scale"))
            s = parse_float(it, k, &c->attn_scale);
        else if (!strcmp(k, "post_norms"))
            s = parse_bool(it, k, &c->post_norms);
        else if (!strcmp(k, "n_experts"))
            s = parse_int(it, k, &c->n_experts);
        else if (!strcmp(k, "n_experts_used"))
            s = parse_int(it, k, &c->n_experts_used);
        else if (!strcmp(k, "expert_d_ff"))
            s = parse_int(it, k, &c->expert_d_ff);
        else if (!strcmp(k, "expert_weights_norm"))
            s = parse_bool(it, k, &c->expert_weights_norm);
        else if (!strcmp(k, "n_shared_experts"))
            s = parse_int(it, k, &c->n_shared_experts);
        else if (!strcmp(k, "router_aux_loss_coef"))
            s = parse_float(it, k, &c->router_aux_loss_coef);
        else if (!strcmp(k, "router_z_loss_coef"))
            s = parse_float(it, k, &c->router_z_loss_coef);
        else if (!strcmp(k, "norm")) {
            if (!(s = parse_enum(it, k, norm_names, COUNT(norm_names), &e))) c->norm = e;
        } else if (!strcmp(k, "norm_position")) {
            if (!(s = parse_enum(it, k, normpos_names, COUNT(normpos_names), &e)))
                c->norm_position = e;
        } else if (!strcmp(k, "ffn")) {
            if (!(s = parse_enum(it, k, ffn_names, COUNT(ffn_names), &e))) c->ffn = e;
        } else if (!strcmp(k, "position")) {
            if (!(s = parse_enum(it, k, pos_names, COUNT(pos_names), &e))) c->position = e;
        } else if (!strcmp(k, "rope_pairing")) {
            if (!(s = parse_enum(it, k, pairing_names, COUNT(pairing_names), &e)))
                c->rope_pairing = e;
        } else
            s = core_err(TLM_ERR_CONFIG, "unknown config key '%s'", k);
    }
    cJSON_Delete(root);
    if (s) return s;
    return tlm_config_finalize(c);
}

tlm_status tlm_config_load(const char *path, tlm_config *c) {
    char *text;
    tlm_status s = core_read_file(path, &text, NULL);
    if (s) return s;
    s = tlm_config_from_json(text, c);
    free(text);
    if (s) return core_err_context(s, "%s", path);
    return TLM_OK;
}

/* The shortest decimal that reads back as the same float, so 1e-5 prints as 1e-05. */
static double short_float(float f) {
    char buf[32];
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, (double)f);
        if ((float)strtod(buf, NULL) == f) break;
    }
    return strtod(buf, NULL);
}

char *tlm_config_to_json(const tlm_config *c) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddNumberToObject(o, "vocab_size", c->vocab_size);
    cJSON_AddNumberToObject(o, "context_length", c->context_length);
    cJSON_AddNumberToObject(o, "d_model", c->d_model);
    cJSON_AddNumberToObject(o, "n_layers", c->n_layers);
    cJSON_AddNumberToObject(o, "n_heads", c->n_heads);
    cJSON_AddNumberToObject(o, "n_kv_heads", c->n_kv_heads);
    cJSON_AddNumberToObject(o, "d_ff", c->d_ff);
    cJSON_AddStringToObject(o, "norm", tlm_norm_name(c->norm));
    cJSON_AddNumberToObject(o, "norm_eps", short_float(c->norm_eps));
    cJSON_AddStringToObject(o, "norm_position", tlm_norm_position_name(c->norm_position));
    cJSON_AddStringToObject(o, "ffn", tlm_ffn_name(c->ffn));
    cJSON_AddStringToObject(o, "position", tlm_position_name(c->position));
    cJSON_AddNumberToObject(o, "rope_theta", short_float(c->rope_theta));
    cJSON_AddStringToObject(o, "rope_pairing", tlm_rope_pairing_name(c->rope_pairing));
    cJSON_AddBoolToObject(o, "tie_embeddings", c->tie_embeddings);
    cJSON_AddBoolToObject(o, "bias", c->bias);
    if (c->qkv_bias) cJSON_AddBoolToObject(o, "qkv_bias", c->qkv_bias);
    cJSON_AddNumberToObject(o, "dropout", short_float(c->dropout));
    if (c->sliding_window) {
        cJSON_AddNumberToObject(o, "sliding_window", c->sliding_window);
        cJSON_AddNumberToObject(o, "sliding_window_pattern", c->sliding_window_pattern);
    }
    if (c->attn_softcap > 0.0f)
        cJSON_AddNumberToObject(o, "attn_softcap", short_float(c->attn_softcap));
    if (c->final_softcap > 0.0f)
        cJSON_AddNumberToObject(o, "final_softcap", short_float(c->final_softcap));
    if (c->embed_scale > 0.0f)
        cJSON_AddNumberToObject(o, "embed_scale", short_float(c->embed_scale));
    if (c->attn_scale > 0.0f) cJSON_AddNumberToObject(o, "attn_scale", short_float(c->attn_scale));
    if (c->post_norms) cJSON_AddBoolToObject(o, "post_norms", c->post_norms);
    if (c->n_experts) {
        cJSON_AddNumberToObject(o, "n_experts", c->n_experts);
        cJSON_AddNumberToObject(o, "n_experts_used", c->n_experts_used);
        cJSON_AddNumberToObject(o, "expert_d_ff", c->expert_d_ff);
        cJSON_AddBoolToObject(o, "expert_weights_norm", c->expert_weights_norm);
        cJSON_AddNumberToObject(o, "n_shared_experts", c->n_shared_experts);
        cJSON_AddNumberToObject(o, "router_aux_loss_coef", short_float(c->router_aux_loss_coef));
        cJSON_AddNumberToObject(o, "router_z_loss_coef", short_float(c->router_z_loss_coef));
    }
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    return s;
}

tlm_status tlm_config_save(const tlm_config *c, const char *path) {
    char *s = tlm_config_to_json(c);
    if (!s) return core_err(TLM_ERR_NOMEM, "out of memory");
    size_t n = strlen(s);
    s[n] = '\n'; /* cJSON's buffer has the NUL we overwrite; write n+1 bytes */
    tlm_status st = core_write_file_atomic(path, s, n + 1);
    free(s);
    return st;
}
