/* LoRA adapters in memory: their layout over a model's matrices, PEFT's initialisation, and the
 * merge into a model's weights. Files are read and written in src/formats/lora_model.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "core/dtype.h"
#include "kernels/kernels.h"
#include "model/lora.h"

static const char *const site_names[MDL_LORA_SITES] = {
    "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
static const char *const target_names[MDL_LORA_SITES + 1] = {"q",    "k",  "v",    "o",
                                                             "gate", "up", "down", "head"};

void tlm_lora_opts_defaults(tlm_lora_opts *o) {
    memset(o, 0, sizeof *o);
    o->rank = 16;
    o->targets = TLM_LORA_BLOCKS;
    o->seed = 1;
}

tlm_status tlm_lora_targets_parse(const char *list, unsigned *targets) {
    if (!list || !targets) return core_err(TLM_ERR_ARG, "LoRA targets: NULL argument");
    unsigned bits = 0;
    const char *p = list;
    while (*p) {
        size_t n = strcspn(p, ",");
        int found = 0;
        if (n == 3 && !strncmp(p, "all", 3)) {
            bits |= TLM_LORA_ALL;
            found = 1;
        }
        for (int t = 0; t <= MDL_LORA_SITES && !found; t++)
            if (strlen(target_names[t]) == n && !strncmp(p, target_names[t], n)) {
                bits |= 1u << t;
                found = 1;
            }
        if (!found)
            return core_err(TLM_ERR_ARG,
                            "LoRA target '%.*s' unknown (q, k, v, o, gate, up, down, head or all)",
                            (int)n, p);
        p += n;
        if (*p == ',') p++;
    }
    if (!bits) return core_err(TLM_ERR_ARG, "LoRA targets: none given");
    *targets = bits;
    return TLM_OK;
}

void mdl_lora_base_name(int layer, int t, char *out, size_t cap) {
    if (layer < 0)
        snprintf(out, cap, "output.weight");
    else
        snprintf(out, cap, "blk.%d.%s.weight", layer, site_names[t]);
}

const tlm_weight *mdl_lora_base_weight(const tlm_model *m, int layer, int t) {
    if (layer < 0) return m->c.tie_embeddings ? NULL : m->out_w;
    const mdl_layer_weights *W = &m->lw[layer];
    const tlm_weight *w[MDL_LORA_SITES] = {W->wq, W->wk, W->wv, W->wo, W->wgate, W->wup, W->wdown};
    return w[t];
}

/* [out, in] of a site's base matrix from the config alone (0 rows when absent). */
static void site_shape(const tlm_config *c, int layer, int t, int *in, int *out) {
    int d = c->d_model, hd = d / c->n_heads, qw = c->n_heads * hd, kw = c->n_kv_heads * hd;
    if (layer < 0) {
        *in = d;
        *out = c->tie_embeddings ? 0 : c->vocab_size;
        return;
    }
    switch (t) {
    case MDL_LORA_Q: *in = d, *out = qw; break;
    case MDL_LORA_K:
    case MDL_LORA_V: *in = d, *out = kw; break;
    case MDL_LORA_O: *in = qw, *out = d; break;
    case MDL_LORA_GATE: *in = d, *out = mdl_gated(c) ? c->d_ff : 0; break;
    case MDL_LORA_UP: *in = d, *out = c->d_ff; break;
    default: *in = c->d_ff, *out = d; break;
    }
}

static int n_sites(const tlm_config *c) { return c->n_layers * MDL_LORA_SITES + 1; }

void tlm_lora_free(tlm_lora *a) {
    if (!a) return;
    core_big_free(a->params, a->n_params * sizeof(float));
    free(a->tensors);
    free(a->site);
    free(a);
}

tlm_status mdl_lora_alloc(const tlm_config *c, const int *rank_of, float alpha, int rslora,
                          tlm_lora **out) {
    *out = NULL;
    int S = n_sites(c);
    tlm_lora *a = calloc(1, sizeof *a);
    if (!a) return core_err(TLM_ERR_NOMEM, "out of memory");
    a->c = *c;
    snprintf(a->arch, sizeof a->arch, "%s", c->qkv_bias ? "qwen2" : "llama");
    a->alpha = alpha;
    a->rslora = rslora;
    a->site = calloc((size_t)S, sizeof *a->site);
    a->tensors = calloc((size_t)S * 2, sizeof *a->tensors);
    if (!a->site || !a->tensors) {
        tlm_lora_free(a);
        return core_err(TLM_ERR_NOMEM, "out of memory");
    }
    size_t off = 0, ranks = 0;
    for (int i = 0; i < S; i++) {
        int layer = i == S - 1 ? -1 : i / MDL_LORA_SITES, t = i == S - 1 ? 0 : i % MDL_LORA_SITES;
        int r = rank_of[i], in, o;
        if (r <= 0) continue;
        site_shape(c, layer, t, &in, &o);
        if (o <= 0) {
            tlm_lora_free(a);
            return core_err(TLM_ERR_ARG, "LoRA: the model has no %s matrix to adapt",
                            layer < 0 ? "head (its head is the token embedding)" : site_names[t]);
        }
        mdl_lora_site *s = &a->site[i];
        *s = (mdl_lora_site){NULL, NULL,
                             r,    in,
                             o,    rslora ? alpha / sqrtf((float)r) : alpha / (float)r,
                             off,  off + (size_t)r * in,
                             ranks};
        char base[TLM_NAME_MAX];
        mdl_lora_base_name(layer, t, base, sizeof base);
        for (int k = 0; k < 2; k++) {
            tlm_tensor_info *ti = &a->tensors[a->n_tensors++];
            snprintf(ti->name, sizeof ti->name, "%.50s.lora_%c", base, k ? 'b' : 'a');
            ti->ndim = 2;
            ti->shape[0] = k ? o : r;
            ti->shape[1] = k ? r : in;
            ti->offset = k ? s->off_b : s->off_a;
            ti->numel = (size_t)r * (size_t)(k ? o : in);
            ti->layer = layer;
            ti->decay = 1;
        }
        off += (size_t)r * ((size_t)in + (size_t)o);
        ranks += (size_t)r;
        if (r > a->max_rank) a->max_rank = r;
        if (in > a->max_in) a->max_in = in;
        if (o > a->max_out) a->max_out = o;
        a->targets |= 1u << (layer < 0 ? MDL_LORA_SITES : t);
        if (!a->rank) a->rank = r;
    }
    if (!off) {
        tlm_lora_free(a);
        return core_err(TLM_ERR_ARG, "LoRA: no matrix to adapt");
    }
    a->n_params = off;
    a->total_rank = ranks;
    a->params = core_big_alloc(off * sizeof(float));
    if (!a->params) {
        tlm_lora_free(a);
        return core_err(TLM_ERR_NOMEM, "out of memory for %zu LoRA parameters", off);
    }
    for (int i = 0; i < S; i++) {
        mdl_lora_site *s = &a->site[i];
        if (!s->rank) continue;
        s->a = a->params + s->off_a;
        s->b = a->params + s->off_b;
    }
    *out = a;
    return TLM_OK;
}

tlm_status tlm_lora_new(const tlm_model *m, const tlm_lora_opts *o, tlm_lora **out) {
    if (!out) return core_err(TLM_ERR_ARG, "lora_new: out must not be NULL");
    *out = NULL;
    if (!m || !o) return core_err(TLM_ERR_ARG, "lora_new: model and options needed");
    if (m->c.n_experts > 0)
        return core_err(TLM_ERR_UNSUPPORTED,
                        "LoRA on a mixture-of-experts model (n_experts %d) is not supported",
                        m->c.n_experts);
    if (o->rank <= 0 || o->rank > 65536)
        return core_err(TLM_ERR_ARG, "LoRA rank %d: must be 1 to 65536", o->rank);
    float alpha = o->alpha > 0 ? o->alpha : 2.0f * (float)o->rank;
    if (!isfinite(o->alpha) || o->alpha < 0)
        return core_err(TLM_ERR_ARG, "LoRA alpha %g: must be positive", (double)o->alpha);
    if (!(o->dropout >= 0 && o->dropout < 1))
        return core_err(TLM_ERR_ARG, "LoRA dropout %g: must be in [0, 1)", (double)o->dropout);
    if (!o->targets || (o->targets & ~TLM_LORA_ALL))
        return core_err(TLM_ERR_ARG, "LoRA targets 0x%x: none, or unknown bits", o->targets);
    const tlm_config *c = &m->c;
    int S = n_sites(c);
    int *rank_of = calloc((size_t)S, sizeof *rank_of);
    if (!rank_of) return core_err(TLM_ERR_NOMEM, "out of memory");
    /* Blocks' targets asked by the default set are taken where the model has them; a target
     * named alone must exist. */
    int only_defaults = (o->targets & TLM_LORA_BLOCKS) == TLM_LORA_BLOCKS;
    tlm_status s = TLM_OK;
    for (int i = 0; i < S && !s; i++) {
        int layer = i == S - 1 ? -1 : i / MDL_LORA_SITES, t = i == S - 1 ? 0 : i % MDL_LORA_SITES;
        int bit = layer < 0 ? MDL_LORA_SITES : t;
        if (!(o->targets & (1u << bit))) continue;
        int in, out_rows;
        site_shape(c, layer, t, &in, &out_rows);
        if (out_rows > 0 && mdl_lora_base_weight(m, layer, t))
            rank_of[i] = o->rank;
        else if (layer >= 0 && only_defaults && t == MDL_LORA_GATE)
            continue;
        else
            s = core_err(TLM_ERR_ARG, "LoRA target %s: %s", target_names[bit],
                         layer < 0 ? "the model's head is its token embedding (tied)"
                                   : "the model has no such matrix (no gated FFN)");
    }
    tlm_lora *a = NULL;
    if (!s) s = mdl_lora_alloc(c, rank_of, alpha, o->rslora, &a);
    free(rank_of);
    if (s) return s;
    a->rank = o->rank;
    a->dropout = o->dropout;
    /* PEFT: A as nn.Linear's reset_parameters with a = sqrt(5), U(-1/sqrt(in), 1/sqrt(in)); B
     * zero, so the adapted model starts as the base. One stream per matrix: a matrix's values do
     * not depend on which others are adapted. */
    for (int i = 0; i < S; i++) {
        mdl_lora_site *st = &a->site[i];
        if (!st->a) continue;
        core_rng r;
        core_rng_seed(&r, o->seed, (uint64_t)i + 1);
        float bound = 1.0f / sqrtf((float)st->in);
        size_t n = (size_t)st->rank * st->in;
        for (size_t j = 0; j < n; j++)
            st->a[j] = (float)((2.0 * core_rng_double_open(&r) - 1.0) * bound);
        memset(st->b, 0, (size_t)st->out * st->rank * sizeof(float));
    }
    *out = a;
    return TLM_OK;
}

void tlm_lora_get_opts(const tlm_lora *a, tlm_lora_opts *o) {
    memset(o, 0, sizeof *o);
    o->rank = a->rank;
    o->alpha = a->alpha;
    o->dropout = a->dropout;
    o->rslora = a->rslora;
    o->targets = a->targets;
}

float tlm_lora_scale(const tlm_lora *a) {
    return a->rslora ? a->alpha / sqrtf((float)a->rank) : a->alpha / (float)a->rank;
}
size_t tlm_lora_num_params(const tlm_lora *a) { return a->n_params; }
int tlm_lora_num_matrices(const tlm_lora *a) { return a->n_tensors / 2; }
const float *tlm_lora_params(const tlm_lora *a) { return a->params; }
float *tlm_lora_params_mut(tlm_lora *a) { return a->params; }
const tlm_tensor_info *tlm_lora_tensors(const tlm_lora *a, int *n) {
    *n = a->n_tensors;
    return a->tensors;
}

tlm_status mdl_lora_check(const tlm_lora *a, const tlm_model *m) {
    const tlm_config *c = &m->c;
    if (c->n_experts > 0)
        return core_err(TLM_ERR_UNSUPPORTED,
                        "LoRA on a mixture-of-experts model (n_experts %d) is not supported",
                        c->n_experts);
    if (a->c.n_layers != c->n_layers || a->c.d_model != c->d_model || a->c.n_heads != c->n_heads ||
        a->c.n_kv_heads != c->n_kv_heads || a->c.d_ff != c->d_ff ||
        a->c.vocab_size != c->vocab_size || a->c.ffn != c->ffn)
        return core_err(TLM_ERR_CONFIG,
                        "LoRA adapter made for another model (%d layers, d_model %d, d_ff %d; this "
                        "one: %d, %d, %d)",
                        a->c.n_layers, a->c.d_model, a->c.d_ff, c->n_layers, c->d_model, c->d_ff);
    int S = n_sites(c);
    for (int i = 0; i < S; i++) {
        const mdl_lora_site *s = &a->site[i];
        if (!s->a) continue;
        int layer = i == S - 1 ? -1 : i / MDL_LORA_SITES, t = i == S - 1 ? 0 : i % MDL_LORA_SITES;
        const tlm_weight *w = mdl_lora_base_weight(m, layer, t);
        char name[TLM_NAME_MAX];
        mdl_lora_base_name(layer, t, name, sizeof name);
        if (!w)
            return core_err(TLM_ERR_CONFIG, "LoRA adapter targets %s, which the model lacks", name);
        if (w->rows != s->out || w->cols != s->in)
            return core_err(TLM_ERR_CONFIG,
                            "LoRA adapter's %s is %d x %d; the model's is %lld x %lld", name,
                            s->out, s->in, (long long)w->rows, (long long)w->cols);
    }
    return TLM_OK;
}

size_t mdl_lora_scratch_floats(const mdl_lora_use *use, int n, int N) {
    size_t r = 0, in = 0, out = 0;
    for (int i = 0; i < n; i++) {
        if ((size_t)use[i].a->max_rank > r) r = (size_t)use[i].a->max_rank;
        if ((size_t)use[i].a->max_in > in) in = (size_t)use[i].a->max_in;
        if ((size_t)use[i].a->max_out > out) out = (size_t)use[i].a->max_out;
    }
    /* A x and its scaled copy (backward: d(A x) and f A x), a dropped-out input or input gradient,
     * and the backward's f B. The scratch of one adapter's site at a time. */
    return (size_t)N * (2 * r + in) + out * r + 64;
}

tlm_status tlm_lora_merge(const tlm_model *m, const tlm_lora *const *loras, const float *scales,
                          int n, tlm_model **out) {
    if (!out) return core_err(TLM_ERR_ARG, "lora_merge: out must not be NULL");
    *out = NULL;
    if (!m || n < 0 || (n > 0 && !loras))
        return core_err(TLM_ERR_ARG, "lora_merge: a model and n >= 0 adapters needed");
    for (int k = 0; k < n; k++) {
        if (!loras[k]) return core_err(TLM_ERR_ARG, "lora_merge: adapter %d is NULL", k);
        tlm_status s = mdl_lora_check(loras[k], m);
        if (s) return s;
    }
    CORE_FP_FLUSH_SCOPE();
    tlm_model *w = NULL;
    tlm_status s = mdl_new(&m->c, 1, &w);
    if (s) return s;
    for (int i = 0; i < m->n_tensors; i++) {
        const tlm_weight *src = &m->w[i];
        const tlm_tensor_info *ti = &m->tensors[i];
        float *dst = w->st.params + ti->offset;
        int64_t rows = ti->ndim == 2 ? ti->shape[0] : 1,
                cols = ti->ndim == 2 ? ti->shape[1] : ti->shape[0];
        for (int64_t r = 0; r < rows; r++)
            core_dtype_to_f32(src->dtype, (const char *)src->data + (size_t)r * src->row_bytes,
                              dst + (size_t)r * cols, (size_t)cols);
    }
    if (m->rope_factors)
        s = mdl_set_rope_factors(w, m->rope_factors, m->c.d_model / m->c.n_heads / 2);
    int S = n_sites(&m->c);
    for (int k = 0; k < n && !s; k++) {
        const tlm_lora *a = loras[k];
        float scale = scales ? scales[k] : 1.0f;
        for (int i = 0; i < S; i++) {
            const mdl_lora_site *st = &a->site[i];
            if (!st->a) continue;
            int layer = i == S - 1 ? -1 : i / MDL_LORA_SITES,
                t = i == S - 1 ? 0 : i % MDL_LORA_SITES;
            char name[TLM_NAME_MAX];
            mdl_lora_base_name(layer, t, name, sizeof name);
            int idx = mdl_index(w, name);
            if (idx < 0) {
                s = core_err(TLM_ERR_CONFIG, "lora_merge: the model has no %s", name);
                break;
            }
            /* W += scale * s * B A */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, st->out, st->in, st->rank,
                        scale * st->s, st->b, st->rank, st->a, st->in, 1.0f,
                        w->st.params + w->tensors[idx].offset, st->in);
        }
    }
    if (s) {
        tlm_model_free(w);
        return s;
    }
    *out = w;
    return TLM_OK;
}
