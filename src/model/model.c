#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

static size_t find_off(const tlm_model *m, const char *name) {
    const tlm_tensor_info *t = tlm_model_find(m, name);
    return t ? t->offset : TLM_NO_TENSOR;
}

static size_t find_layer_off(const tlm_model *m, int l, const char *name) {
    char n[TLM_NAME_MAX];
    snprintf(n, sizeof n, "blk.%d.%s", l, name);
    return find_off(m, n);
}

static void resolve_offsets(tlm_model *m) {
    tlm_offsets *o = &m->off;
    o->tok_emb = find_off(m, "token_embd.weight");
    o->pos_emb = find_off(m, "position_embd.weight");
    o->out_norm_w = find_off(m, "output_norm.weight");
    o->out_norm_b = find_off(m, "output_norm.bias");
    o->out_w = m->c.tie_embeddings ? o->tok_emb : find_off(m, "output.weight");
    for (int l = 0; l < m->c.n_layers; l++) {
        tlm_layer_offsets *L = &o->layer[l];
        L->attn_norm_w = find_layer_off(m, l, "attn_norm.weight");
        L->attn_norm_b = find_layer_off(m, l, "attn_norm.bias");
        L->wq = find_layer_off(m, l, "attn_q.weight");
        L->bq = find_layer_off(m, l, "attn_q.bias");
        L->wk = find_layer_off(m, l, "attn_k.weight");
        L->bk = find_layer_off(m, l, "attn_k.bias");
        L->wv = find_layer_off(m, l, "attn_v.weight");
        L->bv = find_layer_off(m, l, "attn_v.bias");
        L->wo = find_layer_off(m, l, "attn_output.weight");
        L->bo = find_layer_off(m, l, "attn_output.bias");
        L->ffn_norm_w = find_layer_off(m, l, "ffn_norm.weight");
        L->ffn_norm_b = find_layer_off(m, l, "ffn_norm.bias");
        L->wgate = find_layer_off(m, l, "ffn_gate.weight");
        L->bgate = find_layer_off(m, l, "ffn_gate.bias");
        L->wup = find_layer_off(m, l, "ffn_up.weight");
        L->bup = find_layer_off(m, l, "ffn_up.bias");
        L->wdown = find_layer_off(m, l, "ffn_down.weight");
        L->bdown = find_layer_off(m, l, "ffn_down.bias");
    }
}

/* Fixed tables computed in double precision so every position is as exact as float allows. */
static tlm_status build_tables(tlm_model *m) {
    const tlm_config *c = &m->c;
    int hd = c->d_model / c->n_heads, half = hd / 2;
    size_t ctx = (size_t)c->context_length;
    if (c->position == TLM_POS_ROPE) {
        m->rope_cos = malloc(ctx * half * sizeof(float));
        m->rope_sin = malloc(ctx * half * sizeof(float));
        if (!m->rope_cos || !m->rope_sin) return tlm_err(TLM_ERR_NOMEM, "out of memory");
        for (size_t p = 0; p < ctx; p++)
            for (int i = 0; i < half; i++) {
                double freq = pow((double)c->rope_theta, -2.0 * i / hd);
                double a = (double)p * freq;
                m->rope_cos[p * half + i] = (float)cos(a);
                m->rope_sin[p * half + i] = (float)sin(a);
            }
    } else if (c->position == TLM_POS_SINUSOIDAL) {
        int d = c->d_model;
        m->sinus = malloc(ctx * d * sizeof(float));
        if (!m->sinus) return tlm_err(TLM_ERR_NOMEM, "out of memory");
        for (size_t p = 0; p < ctx; p++)
            for (int i = 0; 2 * i < d; i++) {
                double a = (double)p / pow(10000.0, 2.0 * i / d);
                m->sinus[p * d + 2 * i] = (float)sin(a);
                if (2 * i + 1 < d) m->sinus[p * d + 2 * i + 1] = (float)cos(a);
            }
    }
    return TLM_OK;
}

tlm_status tlm_model_create(const tlm_config *cfg, tlm_model **out) {
    *out = NULL;
    tlm_config c = *cfg;
    tlm_status s = tlm_config_finalize(&c);
    if (s) return s;
    tlm_model *m = calloc(1, sizeof *m);
    if (!m) return tlm_err(TLM_ERR_NOMEM, "out of memory");
    m->c = c;
    m->data_parallel = -1;
    m->n_tensors = tlm_schema(&c, NULL, 0, &m->n_params);
    m->tensors = calloc((size_t)m->n_tensors, sizeof *m->tensors);
    m->off.layer = calloc((size_t)c.n_layers, sizeof *m->off.layer);
    m->params = tlm_big_alloc(m->n_params * sizeof(float));
    if (!m->tensors || !m->off.layer || !m->params) {
        size_t n = m->n_params;
        tlm_model_free(m);
        return tlm_err(TLM_ERR_NOMEM, "out of memory for %zu parameters", n);
    }
    tlm_schema(&c, m->tensors, m->n_tensors, NULL);
    resolve_offsets(m);
    s = build_tables(m);
    if (s) {
        tlm_model_free(m);
        return s;
    }
    *out = m;
    return TLM_OK;
}

void tlm_model_free(tlm_model *m) {
    if (!m) return;
    tlm_model_free_replicas(m);
    tlm_arena_free(&m->arena);
    tlm_grad_arena_free(&m->garena);
    tlm_big_free(m->params, m->n_params * sizeof(float));
    free(m->tensors);
    free(m->off.layer);
    free(m->rope_cos);
    free(m->rope_sin);
    free(m->sinus);
    free(m);
}

const tlm_config *tlm_model_config(const tlm_model *m) { return &m->c; }
float *tlm_model_params(tlm_model *m) { return m->params; }
size_t tlm_model_num_params(const tlm_model *m) { return m->n_params; }

const tlm_tensor_info *tlm_model_tensors(const tlm_model *m, int *n) {
    if (n) *n = m->n_tensors;
    return m->tensors;
}

const tlm_tensor_info *tlm_model_find(const tlm_model *m, const char *name) {
    for (int i = 0; i < m->n_tensors; i++)
        if (!strcmp(m->tensors[i].name, name)) return &m->tensors[i];
    return NULL;
}

static int is_block_output_proj(const tlm_tensor_info *t) {
    return strstr(t->name, ".attn_output.weight") || strstr(t->name, ".ffn_down.weight");
}

tlm_status tlm_model_init(tlm_model *m, uint64_t seed, tlm_init_scheme scheme) {
    if (scheme != TLM_INIT_DEFAULT && scheme != TLM_INIT_GPT2)
        return tlm_err(TLM_ERR_ARG, "unknown init scheme %d", (int)scheme);
    for (int i = 0; i < m->n_tensors; i++) {
        const tlm_tensor_info *t = &m->tensors[i];
        float *p = m->params + t->offset;
        /* One RNG stream per tensor: a tensor's values don't depend on which others exist. */
        tlm_rng r;
        tlm_rng_seed(&r, seed, (uint64_t)i + 1);
        int is_norm = t->component == TLM_COMP_ATTN_NORM || t->component == TLM_COMP_FFN_NORM ||
                      t->component == TLM_COMP_OUTPUT_NORM;
        int is_weight = strstr(t->name, ".weight") != NULL;
        if (is_norm || !is_weight) {
            float v = is_norm && is_weight ? 1.0f : 0.0f;
            for (size_t j = 0; j < t->numel; j++) p[j] = v;
            continue;
        }
        double sigma;
        if (scheme == TLM_INIT_GPT2) {
            sigma = 0.02;
            if (is_block_output_proj(t)) sigma /= sqrt(2.0 * m->c.n_layers);
            for (size_t j = 0; j < t->numel; j++) p[j] = (float)(tlm_rng_normal(&r) * sigma);
        } else {
            sigma = t->embedding ? 1.0 : sqrt(2.0 / (double)(t->shape[0] + t->shape[1]));
            for (size_t j = 0; j < t->numel; j++)
                p[j] = (float)tlm_rng_trunc_normal(&r, sigma, 3.0);
        }
    }
    return TLM_OK;
}

void tlm_model_set_dropout_seed(tlm_model *m, uint64_t seed, uint64_t step) {
    m->drop_seed = seed;
    m->drop_step = step;
}
