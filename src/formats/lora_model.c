/* tlm_lora to and from the adapter files (formats/lora.h): a model's adapter as llama.cpp's GGUF
 * adapter or a PEFT directory, and either read back for a given model. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "formats/lora.h"
#include "model/lora.h"

/* Sites in the flat layout's order: the blocks' then the head. */
static int site_count(const tlm_config *c) { return c->n_layers * MDL_LORA_SITES + 1; }
static void site_of(const tlm_config *c, int i, int *layer, int *t) {
    int last = i == site_count(c) - 1;
    *layer = last ? -1 : i / MDL_LORA_SITES;
    *t = last ? 0 : i % MDL_LORA_SITES;
}

static int head_dim(const tlm_config *c) { return c->d_model / c->n_heads; }

/* The q/k row order of the model's own matrices: what its RoPE pairs (no RoPE: any, so the
 * order files keep is left as it is). */
static int model_interleaved(const tlm_config *c, int file_order) {
    return c->position == TLM_POS_ROPE ? c->rope_pairing == TLM_ROPE_INTERLEAVED : file_order;
}

static tlm_status to_fmt(const tlm_lora *a, int file_interleaved, fmt_lora *f) {
    memset(f, 0, sizeof *f);
    snprintf(f->arch, sizeof f->arch, "%s", a->arch);
    f->rank = a->rank;
    f->alpha = a->alpha;
    f->dropout = a->dropout;
    f->use_rslora = a->rslora;
    f->qk_interleaved = model_interleaved(&a->c, file_interleaved);
    int S = site_count(&a->c);
    for (int i = 0; i < S; i++) {
        const mdl_lora_site *s = &a->site[i];
        if (!s->a) continue;
        if (s->rank != a->rank) {
            fmt_lora_free(f);
            return core_err(TLM_ERR_UNSUPPORTED,
                            "LoRA files keep one rank; this adapter has ranks %d and %d", a->rank,
                            s->rank);
        }
        int layer, t;
        site_of(&a->c, i, &layer, &t);
        char name[TLM_NAME_MAX];
        mdl_lora_base_name(layer, t, name, sizeof name);
        tlm_status st = fmt_lora_add(f, name, s->in, s->out, s->a, s->b);
        if (st) {
            fmt_lora_free(f);
            return st;
        }
    }
    return TLM_OK;
}

tlm_status tlm_lora_save(const tlm_lora *a, const char *path) {
    if (!a || !path) return core_err(TLM_ERR_ARG, "lora_save: NULL argument");
    fmt_lora f;
    /* A Llama GGUF keeps q/k rows interleaved (lora_gguf.c converts as the arch asks). */
    tlm_status s = to_fmt(a, !strcmp(a->arch, "llama"), &f);
    if (!s) s = fmt_lora_write_gguf(path, &f, head_dim(&a->c));
    fmt_lora_free(&f);
    return s;
}

tlm_status tlm_lora_save_peft(const tlm_lora *a, const char *dir) {
    if (!a || !dir) return core_err(TLM_ERR_ARG, "lora_save_peft: NULL argument");
    fmt_lora f;
    tlm_status s = to_fmt(a, 0, &f);
    if (!s) s = fmt_lora_write_peft(dir, &f, head_dim(&a->c));
    fmt_lora_free(&f);
    return s;
}

tlm_status tlm_lora_load(const tlm_model *m, const char *path, tlm_lora **out) {
    if (!out) return core_err(TLM_ERR_ARG, "lora_load: out must not be NULL");
    *out = NULL;
    if (!m || !path) return core_err(TLM_ERR_ARG, "lora_load: model and path needed");
    const tlm_config *c = &m->c;
    const char *arch = c->qkv_bias ? "qwen2" : "llama";
    struct stat st;
    int dir = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
    fmt_lora f;
    tlm_status s = dir ? fmt_lora_read_peft(path, arch, &f) : fmt_lora_read_gguf(path, &f);
    if (s) return s;
    /* What the model has to adapt: every base matrix a site names. */
    int S = site_count(c), nb = 0;
    fmt_lora_base *base = calloc((size_t)S, sizeof *base);
    char(*names)[TLM_NAME_MAX] = calloc((size_t)S, sizeof *names);
    int *rank_of = calloc((size_t)S, sizeof *rank_of);
    if (!base || !names || !rank_of) s = core_err(TLM_ERR_NOMEM, "out of memory");
    for (int i = 0; i < S && !s; i++) {
        int layer, t;
        site_of(c, i, &layer, &t);
        const tlm_weight *w = mdl_lora_base_weight(m, layer, t);
        if (!w) continue;
        mdl_lora_base_name(layer, t, names[i], sizeof names[i]);
        base[nb++] = (fmt_lora_base){names[i], w->cols, w->rows};
        if (fmt_lora_find(&f, names[i])) rank_of[i] = f.rank;
    }
    if (!s) s = fmt_lora_check_base(&f, arch, base, nb);
    if (!s && c->position == TLM_POS_ROPE)
        s = fmt_lora_set_qk_order(&f, c->rope_pairing == TLM_ROPE_INTERLEAVED, head_dim(c));
    tlm_lora *a = NULL;
    if (!s) s = mdl_lora_alloc(c, rank_of, f.alpha, f.use_rslora, &a);
    if (!s) {
        a->rank = f.rank;
        a->dropout = f.dropout;
        for (int i = 0; i < S; i++) {
            mdl_lora_site *ls = &a->site[i];
            if (!ls->a) continue;
            const fmt_lora_mat *fm = fmt_lora_find(&f, names[i]);
            memcpy(ls->a, fm->a, (size_t)ls->rank * ls->in * sizeof(float));
            memcpy(ls->b, fm->b, (size_t)ls->out * ls->rank * sizeof(float));
        }
    }
    if (s) core_err_context(s, "%s", path);
    free(base);
    free(names);
    free(rank_of);
    fmt_lora_free(&f);
    if (s) {
        tlm_lora_free(a);
        return s;
    }
    *out = a;
    return TLM_OK;
}
