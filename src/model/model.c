#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "kernels/kernels.h"
#include "kernels/qgemm.h"
#include "model/model.h"

/* Lookups by name go through an index sorted by name: loaders resolve every tensor of the schema,
 * and a linear search each time would make that quadratic in the (header-controlled) layer count.
 */
static int cmp_name(const void *a, const void *b) {
    return strcmp(((const mdl_name_index *)a)->name, ((const mdl_name_index *)b)->name);
}

int mdl_index(const tlm_model *m, const char *name) {
    int lo = 0, hi = m->n_tensors - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(m->sorted[mid].name, name);
        if (c == 0) return m->sorted[mid].index;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

const tlm_tensor_info *tlm_model_find(const tlm_model *m, const char *name) {
    int i = mdl_index(m, name);
    return i < 0 ? NULL : &m->tensors[i];
}

static size_t find_off(const tlm_model *m, const char *name) {
    const tlm_tensor_info *t = tlm_model_find(m, name);
    return t ? t->offset : MDL_NO_TENSOR;
}

static size_t find_layer_off(const tlm_model *m, int l, const char *name) {
    char n[TLM_NAME_MAX];
    snprintf(n, sizeof n, "blk.%d.%s", l, name);
    return find_off(m, n);
}

static void resolve_offsets(tlm_model *m) {
    mdl_offsets *o = &m->off;
    o->tok_emb = find_off(m, "token_embd.weight");
    o->pos_emb = find_off(m, "position_embd.weight");
    o->out_norm_w = find_off(m, "output_norm.weight");
    o->out_norm_b = find_off(m, "output_norm.bias");
    o->out_w = m->c.tie_embeddings ? o->tok_emb : find_off(m, "output.weight");
    for (int l = 0; l < m->c.n_layers; l++) {
        mdl_layer_offsets *L = &o->layer[l];
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
        L->post_attn_norm_w = find_layer_off(m, l, "post_attention_norm.weight");
        L->post_attn_norm_b = find_layer_off(m, l, "post_attention_norm.bias");
        L->post_ffn_norm_w = find_layer_off(m, l, "post_ffw_norm.weight");
        L->post_ffn_norm_b = find_layer_off(m, l, "post_ffw_norm.bias");
        L->wgate = find_layer_off(m, l, "ffn_gate.weight");
        L->bgate = find_layer_off(m, l, "ffn_gate.bias");
        L->wup = find_layer_off(m, l, "ffn_up.weight");
        L->bup = find_layer_off(m, l, "ffn_up.bias");
        L->wdown = find_layer_off(m, l, "ffn_down.weight");
        L->bdown = find_layer_off(m, l, "ffn_down.bias");
        L->router = find_layer_off(m, l, "ffn_gate_inp.weight");
        L->gate_exps = find_layer_off(m, l, "ffn_gate_exps.weight");
        L->up_exps = find_layer_off(m, l, "ffn_up_exps.weight");
        L->down_exps = find_layer_off(m, l, "ffn_down_exps.weight");
        L->gate_sh = find_layer_off(m, l, "ffn_gate_shexp.weight");
        L->up_sh = find_layer_off(m, l, "ffn_up_shexp.weight");
        L->down_sh = find_layer_off(m, l, "ffn_down_shexp.weight");
        L->sh_gate = find_layer_off(m, l, "ffn_gate_inp_shexp.weight");
    }
}

/* The view of the tensor at flat offset off (MDL_NO_TENSOR: none). Offsets are unique, and the
 * schema lists tensors in offset order, so a binary search over it finds the entry. */
static const tlm_weight *view_at(const tlm_model *m, size_t off) {
    if (off == MDL_NO_TENSOR) return NULL;
    int lo = 0, hi = m->n_tensors - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        size_t o = m->tensors[mid].offset;
        if (o == off) return &m->w[mid];
        if (o < off)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

static const float *vec_at(const tlm_model *m, size_t off) { return mdl_wf(view_at(m, off)); }

/* parts[0..n) as one stacked view when they lie back to back with one type and row stride. */
static tlm_weight fuse(const tlm_weight *const *parts, int n) {
    tlm_weight f = *parts[0];
    for (int i = 1; i < n; i++) {
        const tlm_weight *p = parts[i], *q = parts[i - 1];
        const char *end = (const char *)q->data + (size_t)q->rows * q->row_bytes;
        if (p->dtype != f.dtype || p->cols != f.cols || p->row_bytes != f.row_bytes ||
            (const char *)p->data != end) {
            memset(&f, 0, sizeof f);
            return f;
        }
        f.rows += p->rows;
    }
    return f;
}

/* Points the per-layer handles at the views once they are bound. */
static void resolve_views(tlm_model *m) {
    const mdl_offsets *o = &m->off;
    m->tok_emb = view_at(m, o->tok_emb);
    m->pos_emb = view_at(m, o->pos_emb);
    m->out_w = view_at(m, o->out_w);
    m->out_norm_w = vec_at(m, o->out_norm_w);
    m->out_norm_b = vec_at(m, o->out_norm_b);
    m->all_f32 = 1;
    for (int i = 0; i < m->n_tensors; i++)
        if (m->w[i].dtype != TLM_DTYPE_F32) m->all_f32 = 0;
    for (int l = 0; l < m->c.n_layers; l++) {
        const mdl_layer_offsets *L = &o->layer[l];
        mdl_layer_weights *W = &m->lw[l];
        W->attn_norm_w = vec_at(m, L->attn_norm_w);
        W->attn_norm_b = vec_at(m, L->attn_norm_b);
        W->ffn_norm_w = vec_at(m, L->ffn_norm_w);
        W->ffn_norm_b = vec_at(m, L->ffn_norm_b);
        W->post_attn_norm_w = vec_at(m, L->post_attn_norm_w);
        W->post_attn_norm_b = vec_at(m, L->post_attn_norm_b);
        W->post_ffn_norm_w = vec_at(m, L->post_ffn_norm_w);
        W->post_ffn_norm_b = vec_at(m, L->post_ffn_norm_b);
        W->wq = view_at(m, L->wq);
        W->wk = view_at(m, L->wk);
        W->wv = view_at(m, L->wv);
        W->wo = view_at(m, L->wo);
        W->wgate = view_at(m, L->wgate);
        W->wup = view_at(m, L->wup);
        W->wdown = view_at(m, L->wdown);
        W->bq = vec_at(m, L->bq);
        W->bk = vec_at(m, L->bk);
        W->bv = vec_at(m, L->bv);
        W->bo = vec_at(m, L->bo);
        W->bgate = vec_at(m, L->bgate);
        W->bup = vec_at(m, L->bup);
        W->bdown = vec_at(m, L->bdown);
        const tlm_weight *qkv[3] = {W->wq, W->wk, W->wv};
        W->qkv = fuse(qkv, 3);
        if (W->wgate) {
            const tlm_weight *gu[2] = {W->wgate, W->wup};
            W->gate_up = fuse(gu, 2);
        } else {
            memset(&W->gate_up, 0, sizeof W->gate_up);
        }
        W->router = view_at(m, L->router);
        W->gate_exps = view_at(m, L->gate_exps);
        W->up_exps = view_at(m, L->up_exps);
        W->down_exps = view_at(m, L->down_exps);
        W->gate_sh = view_at(m, L->gate_sh);
        W->up_sh = view_at(m, L->up_sh);
        W->down_sh = view_at(m, L->down_sh);
        W->sh_gate = vec_at(m, L->sh_gate);
        if (W->gate_sh) {
            const tlm_weight *gu[2] = {W->gate_sh, W->up_sh};
            W->gate_up_sh = fuse(gu, 2);
        } else {
            memset(&W->gate_up_sh, 0, sizeof W->gate_up_sh);
        }
    }
}

/* Fixed tables computed in double precision so every position is as exact as float allows.
 * tlm_config_finalize has bounded their sizes. */
static tlm_status build_tables(tlm_model *m) {
    const tlm_config *c = &m->c;
    int hd = c->d_model / c->n_heads, half = hd / 2;
    size_t ctx = (size_t)c->context_length;
    if (c->position == TLM_POS_ROPE) {
        if (!m->rope_cos) m->rope_cos = malloc(ctx * half * sizeof(float));
        if (!m->rope_sin) m->rope_sin = malloc(ctx * half * sizeof(float));
        if (!m->rope_cos || !m->rope_sin) return core_err(TLM_ERR_NOMEM, "out of memory");
        for (size_t p = 0; p < ctx; p++)
            for (int i = 0; i < half; i++) {
                double freq = pow((double)c->rope_theta, -2.0 * i / hd);
                if (m->rope_factors) freq /= (double)m->rope_factors[i];
                double a = (double)p * freq;
                m->rope_cos[p * half + i] = (float)cos(a);
                m->rope_sin[p * half + i] = (float)sin(a);
            }
    } else if (c->position == TLM_POS_SINUSOIDAL) {
        int d = c->d_model;
        m->sinus = malloc(ctx * d * sizeof(float));
        if (!m->sinus) return core_err(TLM_ERR_NOMEM, "out of memory");
        for (size_t p = 0; p < ctx; p++)
            for (int i = 0; 2 * i < d; i++) {
                double a = (double)p / pow(10000.0, 2.0 * i / d);
                m->sinus[p * d + 2 * i] = (float)sin(a);
                if (2 * i + 1 < d) m->sinus[p * d + 2 * i + 1] = (float)cos(a);
            }
    }
    return TLM_OK;
}

/* w as an F32 view of t's floats at data (matrices [out, in]; vectors one row; experts' stacked
 * matrices [E, out, in] as [E * out, in]). */
static void f32_view(tlm_weight *w, const tlm_tensor_info *t, const float *data) {
    w->dtype = TLM_DTYPE_F32;
    w->data = data;
    w->rows = t->ndim == 3 ? t->shape[0] * t->shape[1] : t->ndim == 2 ? t->shape[0] : 1;
    w->cols = t->shape[t->ndim - 1];
    w->row_bytes = (size_t)w->cols * sizeof(float);
}

/* Every view as an F32 window of the flat buffer. */
static void point_into_params(tlm_model *m) {
    for (int i = 0; i < m->n_tensors; i++)
        f32_view(&m->w[i], &m->tensors[i], m->st.params + m->tensors[i].offset);
}

/* Bytes a widened copy of t takes in the owned block (each copy 64-byte aligned). */
static size_t copy_bytes(const tlm_tensor_info *t) {
    return (t->numel * sizeof(float) + 63) & ~(size_t)63;
}

tlm_status mdl_new(const tlm_config *cfg, int writable, tlm_model **out) {
    *out = NULL;
    core_threads_check();
    tlm_config c = *cfg;
    tlm_status s = tlm_config_finalize(&c);
    if (s) return s;
    tlm_model *m = calloc(1, sizeof *m);
    if (!m) return core_err(TLM_ERR_NOMEM, "out of memory");
    m->c = c;
    m->n_tensors = tlm_config_tensors(&c, NULL, 0, &m->n_params);
    m->tensors = calloc((size_t)m->n_tensors, sizeof *m->tensors);
    m->w = calloc((size_t)m->n_tensors, sizeof *m->w);
    m->sorted = calloc((size_t)m->n_tensors, sizeof *m->sorted);
    m->off.layer = calloc((size_t)c.n_layers, sizeof *m->off.layer);
    m->lw = calloc((size_t)c.n_layers, sizeof *m->lw);
    if (writable) m->st.params = core_big_alloc(m->n_params * sizeof(float));
    if (!m->tensors || !m->w || !m->sorted || !m->off.layer || !m->lw ||
        (writable && !m->st.params)) {
        size_t n = m->n_params;
        tlm_model_free(m);
        return core_err(TLM_ERR_NOMEM, "out of memory for %zu parameters", n);
    }
    tlm_config_tensors(&c, m->tensors, m->n_tensors, NULL);
    for (int i = 0; i < m->n_tensors; i++) m->sorted[i] = (mdl_name_index){m->tensors[i].name, i};
    qsort(m->sorted, (size_t)m->n_tensors, sizeof *m->sorted, cmp_name);
    resolve_offsets(m);
    if (writable) {
        point_into_params(m);
        resolve_views(m);
    }
    s = build_tables(m);
    if (s) {
        tlm_model_free(m);
        return s;
    }
    *out = m;
    return TLM_OK;
}

tlm_status tlm_model_new(const tlm_config *c, tlm_model **out) { return mdl_new(c, 1, out); }

static tlm_status mdl_bind_views(tlm_model *m, const mdl_bind_src *src, core_mmap *maps,
                                 int n_maps);

/* Whether the pages of a source that was copied may be dropped: those of a file mapping come back
 * from the file if touched again; a copy read into memory (TLM_LOAD_READ) keeps them, since
 * dropping its pages would leave zeros where the weights were. */
static int drops_copied(const tlm_model *m) {
    for (int k = 0; k < m->st.n_maps; k++)
        if (m->st.maps[k].copy) return 0;
    return m->st.n_maps > 0;
}

/* Whether tensor i can be used in place in the type and at the address a file has it. Matrix
 * products take what k_linear_takes (F32, F16, BF16 and the ggml block types); a token embedding
 * widens one row at a time wherever it is read. Vectors (norms, biases) and learned position
 * tables are read as floats. */
static int used_in_place(const tlm_model *m, int i, const mdl_bind_src *src) {
    tlm_dtype t = src->dtype;
    const void *data = src->data;
    if (src->add != 0.0f) return 0;
    const core_dtype_info *d = core_dtype_get(t);
    /* plain types need their natural alignment; block types are read bytewise */
    size_t align = d->block_elems == 1 ? d->block_bytes : 1;
    if ((uintptr_t)data % align) return 0;
    const tlm_tensor_info *ti = &m->tensors[i];
    if (ti->ndim >= 2 && core_dtype_bytes(t, (uint64_t)ti->shape[ti->ndim - 1]) == 0) return 0;
    if (t == TLM_DTYPE_F32) return 1;
    if (m->c.position == TLM_POS_LEARNED && ti->offset == m->off.pos_emb) return 0;
    return ti->ndim >= 2 && k_linear_takes(t);
}

tlm_status mdl_bind(tlm_model *m, const mdl_bind_src *src, core_mmap *maps, int n_maps) {
    tlm_status s = mdl_bind_views(m, src, maps, n_maps);
    /* A writable model has copied everything: the files need not stay mapped. */
    if (m->st.params) {
        for (int i = 0; i < m->st.n_maps; i++) core_mmap_close(&m->st.maps[i]);
        free(m->st.maps);
        m->st.maps = NULL;
        m->st.n_maps = 0;
    }
    /* Block-type weights in the files may keep their repacked prompt-sized form (TLM_QCACHE=on). */
    for (int i = 0; i < m->st.n_maps; i++) k_qgemm_register(m->st.maps[i].data, m->st.maps[i].size);
    return s;
}

static tlm_status mdl_bind_views(tlm_model *m, const mdl_bind_src *src, core_mmap *maps,
                                 int n_maps) {
    if (n_maps > 0) {
        m->st.maps = calloc((size_t)n_maps, sizeof *m->st.maps);
        if (!m->st.maps) {
            for (int i = 0; i < n_maps; i++) core_mmap_close(&maps[i]);
            return core_err(TLM_ERR_NOMEM, "out of memory");
        }
        memcpy(m->st.maps, maps, (size_t)n_maps * sizeof *maps);
        m->st.n_maps = n_maps;
    }
    for (int i = 0; i < m->n_tensors; i++)
        if (!src[i].data)
            return core_err(TLM_ERR_ARG, "tensor '%s' has no data", m->tensors[i].name);
    /* Which tensors need a converted copy, and how much memory those copies take. */
    size_t owned = 0;
    for (int i = 0; i < m->n_tensors && !m->st.params; i++)
        if (!used_in_place(m, i, &src[i])) owned += copy_bytes(&m->tensors[i]);
    if (owned) {
        m->st.owned = core_big_alloc(owned);
        if (!m->st.owned)
            return core_err(TLM_ERR_NOMEM, "out of memory for %zu MiB of converted weights",
                            owned >> 20);
        m->st.owned_bytes = owned;
    }
    char *next = m->st.owned;
    for (int i = 0; i < m->n_tensors; i++) {
        const tlm_tensor_info *t = &m->tensors[i];
        tlm_weight *w = &m->w[i];
        float *dst = NULL;
        if (m->st.params) {
            dst = m->st.params + t->offset;
        } else if (used_in_place(m, i, &src[i])) {
            f32_view(w, t, NULL); /* the shape; then the file's own type and bytes */
            w->dtype = src[i].dtype;
            w->data = src[i].data;
            w->row_bytes = core_dtype_bytes(src[i].dtype, (uint64_t)w->cols);
            continue;
        } else {
            dst = (float *)next;
            next += copy_bytes(t);
        }
        tlm_status s = core_dtype_to_f32(src[i].dtype, src[i].data, dst, t->numel);
        if (s) return core_err_context(s, "tensor '%s'", t->name);
        if (src[i].add != 0.0f)
            for (size_t k = 0; k < t->numel; k++) dst[k] += src[i].add;
        if (drops_copied(m))
            core_mmap_release(src[i].data, core_dtype_bytes(src[i].dtype, t->numel));
        f32_view(w, t, dst);
    }
    resolve_views(m);
    return TLM_OK;
}

/* Whether a bound view is a matrix that mdl_retype gives type to (to F32: from BF16; to
 * BF16: from F32 and F16). Learned position tables are read as floats and stay. */
static int retyped_to(const tlm_model *m, int i, tlm_dtype to) {
    const tlm_tensor_info *t = &m->tensors[i];
    if (t->ndim < 2 || (m->c.position == TLM_POS_LEARNED && t->offset == m->off.pos_emb)) return 0;
    tlm_dtype from = m->w[i].dtype;
    return to == TLM_DTYPE_F32 ? from == TLM_DTYPE_BF16
                               : from == TLM_DTYPE_F32 || from == TLM_DTYPE_F16;
}

tlm_status mdl_retype(tlm_model *m, tlm_precision p) {
    /* (A model whose loader copied it into the flat buffer, such as GPT-2's transposed weights,
     * keeps its vectors there; the matrices move: such a model no longer trains or writes.) */
    if (m->st.retyped) return core_err(TLM_ERR_ARG, "the model's weights were retyped already");
    tlm_dtype to = p == TLM_PRECISION_BF16 ? TLM_DTYPE_BF16 : TLM_DTYPE_F32;
    size_t esz = to == TLM_DTYPE_BF16 ? 2 : 4, bytes = 0;
    for (int i = 0; i < m->n_tensors; i++)
        if (retyped_to(m, i, to)) bytes += (m->tensors[i].numel * esz + 63) & ~(size_t)63;
    if (!bytes) return TLM_OK;
    char *next = core_big_alloc(bytes);
    if (!next)
        return core_err(TLM_ERR_NOMEM, "out of memory for %zu MiB of %s weights", bytes >> 20,
                        core_dtype_get(to)->name);
    m->st.retyped = next;
    m->st.retyped_bytes = bytes;
    /* In schema order, as the loaders bind them, so that q|k|v and gate|up stay adjacent where the
     * rows' bytes keep them so (and fuse into one product). */
    for (int i = 0; i < m->n_tensors; i++) {
        if (!retyped_to(m, i, to)) continue;
        tlm_weight *w = &m->w[i];
        size_t rb = (size_t)w->cols * esz, tb = (size_t)w->rows * rb;
        char *dst = next;
        next += (tb + 63) & ~(size_t)63;
        int fail = 0;
        /* To BF16 through an F32 row (exact for F32 and F16 sources), then the quantizer's
         * rounding: the bytes `tlm quantize --type bf16` writes. */
#pragma omp parallel reduction(| : fail) if (tb >= (1u << 20))
        {
            float *row = to == TLM_DTYPE_F32 ? NULL : malloc((size_t)w->cols * sizeof(float));
            fail |= to != TLM_DTYPE_F32 && !row;
#pragma omp for schedule(static)
            for (long r = 0; r < (long)w->rows; r++) {
                const char *src = (const char *)w->data + (size_t)r * w->row_bytes;
                void *out = dst + (size_t)r * rb;
                if (!row)
                    fail |= to != TLM_DTYPE_F32 ||
                            core_dtype_to_f32(w->dtype, src, out, w->cols) != TLM_OK;
                else
                    fail |= core_dtype_to_f32(w->dtype, src, row, w->cols) != TLM_OK ||
                            core_dtype_from_f32(to, row, out, w->cols) != TLM_OK;
            }
            free(row);
        }
        /* (rows of F32, F16 and BF16 always convert: only a row buffer can be missing) */
        if (fail)
            return core_err(TLM_ERR_NOMEM, "tensor '%s': out of memory converting it to %s",
                            m->tensors[i].name, core_dtype_get(to)->name);
        if (drops_copied(m)) core_mmap_release(w->data, (size_t)w->rows * w->row_bytes);
        w->dtype = to;
        w->data = dst;
        w->row_bytes = rb;
    }
    resolve_views(m);
    return TLM_OK;
}

void tlm_model_free(tlm_model *m) {
    if (!m) return;
    core_big_free(m->st.params, m->n_params * sizeof(float));
    core_big_free(m->st.retyped, m->st.retyped_bytes);
    core_big_free(m->st.owned, m->st.owned_bytes);
    for (int i = 0; i < m->st.n_maps; i++) {
        k_qgemm_forget(m->st.maps[i].data, m->st.maps[i].size);
        core_mmap_close(&m->st.maps[i]);
    }
    free(m->st.maps);
    free(m->tensors);
    free(m->w);
    free(m->sorted);
    free(m->off.layer);
    free(m->lw);
    free(m->rope_cos);
    free(m->rope_sin);
    free(m->rope_factors);
    free(m->sinus);
    free(m);
}

tlm_status mdl_set_rope_factors(tlm_model *m, const float *f, int n) {
    const tlm_config *c = &m->c;
    int half = c->d_model / c->n_heads / 2;
    if (c->position != TLM_POS_ROPE)
        return core_err(TLM_ERR_ARG, "RoPE frequency factors for a model without RoPE");
    if (n != half)
        return core_err(TLM_ERR_FORMAT, "%d RoPE frequency factors for a head of %d pairs", n,
                        half);
    for (int i = 0; i < n; i++)
        if (!(f[i] > 0) || !isfinite(f[i]))
            return core_err(TLM_ERR_FORMAT, "RoPE frequency factor %d is %g (positive, finite)", i,
                            (double)f[i]);
    float *k = malloc(sizeof *k * (size_t)n);
    if (!k) return core_err(TLM_ERR_NOMEM, "out of memory");
    memcpy(k, f, sizeof *k * (size_t)n);
    free(m->rope_factors);
    m->rope_factors = k;
    return build_tables(m);
}

const tlm_config *tlm_model_config(const tlm_model *m) { return &m->c; }
float *tlm_model_params(tlm_model *m) { return m->st.params; }
size_t tlm_model_num_params(const tlm_model *m) { return m->n_params; }

const tlm_tensor_info *tlm_model_tensors(const tlm_model *m, int *n) {
    if (n) *n = m->n_tensors;
    return m->tensors;
}

const tlm_weight *tlm_model_weight(const tlm_model *m, int i) {
    return i >= 0 && i < m->n_tensors ? &m->w[i] : NULL;
}

void tlm_model_memory(const tlm_model *m, size_t *mapped, size_t *owned) {
    size_t map = 0, own = m->st.owned_bytes + m->st.retyped_bytes;
    if (m->st.params) own += m->n_params * sizeof(float);
    for (int i = 0; i < m->n_tensors; i++) {
        const tlm_weight *w = &m->w[i];
        for (int k = 0; k < m->st.n_maps; k++) {
            const uint8_t *b = m->st.maps[k].data;
            if ((const uint8_t *)w->data >= b && (const uint8_t *)w->data < b + m->st.maps[k].size)
                map += (size_t)w->rows * w->row_bytes;
        }
    }
    size_t ctx = (size_t)m->c.context_length, hd = (size_t)(m->c.d_model / m->c.n_heads);
    if (m->rope_cos) own += 2 * ctx * (hd / 2) * sizeof(float);
    if (m->sinus) own += ctx * (size_t)m->c.d_model * sizeof(float);
    /* repacked copies made by prompt-sized products so far */
    for (int k = 0; k < m->st.n_maps; k++)
        own += k_qgemm_cached_bytes(m->st.maps[k].data, m->st.maps[k].size);
    if (mapped) *mapped = map;
    if (owned) *owned = own;
}

static int is_block_output_proj(const tlm_tensor_info *t) {
    return strstr(t->name, ".attn_output.weight") || strstr(t->name, ".ffn_down.weight") ||
           strstr(t->name, ".ffn_down_exps.weight") || strstr(t->name, ".ffn_down_shexp.weight");
}

tlm_status tlm_model_init(tlm_model *m, uint64_t seed, tlm_init_scheme scheme) {
    if (scheme != TLM_INIT_GPT2 && scheme != TLM_INIT_XAVIER)
        return core_err(TLM_ERR_ARG, "unknown init scheme %d", (int)scheme);
    if (!m->st.params)
        return core_err(TLM_ERR_ARG,
                        "init: the model is read-only (load it with TLM_LOAD_WRITABLE)");
    for (int i = 0; i < m->n_tensors; i++) {
        const tlm_tensor_info *t = &m->tensors[i];
        float *p = m->st.params + t->offset;
        /* One RNG stream per tensor: a tensor's values don't depend on which others exist. */
        core_rng r;
        core_rng_seed(&r, seed, (uint64_t)i + 1);
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
            for (size_t j = 0; j < t->numel; j++) p[j] = (float)(core_rng_normal(&r) * sigma);
        } else {
            /* fan out + fan in of one matrix (an expert's, for the stacked ones) */
            int64_t fans = t->ndim == 3 ? t->shape[1] + t->shape[2] : t->shape[0] + t->shape[1];
            sigma = t->embedding ? 1.0 : sqrt(2.0 / (double)fans);
            for (size_t j = 0; j < t->numel; j++)
                p[j] = (float)core_rng_trunc_normal(&r, sigma, 3.0);
        }
    }
    return TLM_OK;
}
