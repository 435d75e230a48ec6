/* tlm's own model files: every schema tensor as F32 under its canonical name, and the config JSON
 * in the metadata. */
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "formats/formats.h"
#include "io/safetensors.h"
#include "model/model.h"

tlm_status tlm_model_save_safetensors(const tlm_model *m, const char *path) {
    tlm_status fs = fmt_need_f32(m, path);
    if (!fs) fs = fmt_no_rope_factors(m, path);
    if (fs) return fs;
    io_st_out_tensor *t = calloc((size_t)m->n_tensors, sizeof *t);
    char *cfg = tlm_config_to_json(&m->c);
    if (!t || !cfg) {
        free(t);
        free(cfg);
        return core_err(TLM_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < m->n_tensors; i++) {
        const tlm_tensor_info *ti = &m->tensors[i];
        t[i].name = ti->name;
        t[i].dtype = TLM_DTYPE_F32;
        t[i].ndim = ti->ndim;
        for (int k = 0; k < ti->ndim; k++) t[i].shape[k] = ti->shape[k];
        t[i].data = m->w[i].data;
    }
    const char *keys[] = {"format", "tlm_config"};
    const char *vals[] = {"tlm", cfg};
    tlm_status s = io_st_write(path, t, m->n_tensors, keys, vals, 2);
    free(t);
    free(cfg);
    return s;
}

/* Every schema tensor is in f with its shape and a float dtype: checked before a model is
 * allocated or anything is read, so a header cannot make us allocate what its file lacks. */
static tlm_status check_tensors(const io_st_file *f, const tlm_tensor_info *ti, int n,
                                const char *path) {
    for (int i = 0; i < n; i++) {
        const io_st_tensor *t = io_st_find(f, ti[i].name);
        if (!t) return core_err(TLM_ERR_FORMAT, "%s: missing tensor '%s'", path, ti[i].name);
        int same = t->ndim == ti[i].ndim;
        for (int k = 0; same && k < ti[i].ndim; k++) same = t->shape[k] == ti[i].shape[k];
        if (!same)
            return core_err(TLM_ERR_FORMAT, "%s: tensor '%s' has the wrong shape for this config",
                            path, ti[i].name);
        if (!core_dtype_get(t->dtype)->is_float)
            return core_err(TLM_ERR_FORMAT, "%s: tensor '%s' has dtype %s, expected a float type",
                            path, ti[i].name, tlm_dtype_name(t->dtype));
    }
    return TLM_OK;
}

tlm_status tlm_model_read_safetensors(tlm_model *m, const char *path) {
    if (!m->st.params) return core_err(TLM_ERR_ARG, "%s: loading into a read-only model", path);
    io_st_file f;
    tlm_status s = io_st_open(&f, path);
    if (s) return s;
    s = check_tensors(&f, m->tensors, m->n_tensors, path);
    for (int i = 0; i < m->n_tensors && !s; i++) {
        const tlm_tensor_info *ti = &m->tensors[i];
        s = io_st_read_f32(&f, io_st_find(&f, ti->name), m->st.params + ti->offset, ti->numel);
        if (s) core_err_context(s, "%s", path);
    }
    io_st_close(&f);
    return s;
}

tlm_status fmt_load_tlm_file(const char *path, int writable, tlm_model **out) {
    *out = NULL;
    io_st_file f;
    tlm_status s = io_st_open(&f, path);
    if (s) return s;
    tlm_config c;
    tlm_tensor_info *ti = NULL;
    int n = 0;
    const char *cfg = io_st_meta(&f, "tlm_config");
    if (!cfg) {
        s = core_err(TLM_ERR_FORMAT, "%s: no tlm_config in the metadata", path);
    } else if ((s = tlm_config_from_json(cfg, &c))) {
        core_err_context(s, "%s: config in metadata", path);
    } else {
        n = tlm_config_tensors(&c, NULL, 0, NULL);
        ti = calloc((size_t)n, sizeof *ti);
        if (!ti) s = core_err(TLM_ERR_NOMEM, "out of memory");
    }
    if (!s) {
        tlm_config_tensors(&c, ti, n, NULL);
        s = check_tensors(&f, ti, n, path);
    }
    free(ti);
    tlm_model *m = NULL;
    if (!s) s = fmt_model_new(&c, path, writable, &m);
    mdl_bind_src *src = NULL;
    if (!s && !(src = calloc((size_t)m->n_tensors, sizeof *src)))
        s = core_err(TLM_ERR_NOMEM, "out of memory");
    for (int i = 0; !s && i < m->n_tensors; i++) {
        const io_st_tensor *t = io_st_find(&f, m->tensors[i].name);
        src[i] = (mdl_bind_src){t->dtype, f.data + t->begin, 0.0f};
    }
    if (!s) {
        /* The model keeps the file mapped while its views point into it. */
        core_mmap map = f.map;
        f.map = (core_mmap){0};
        s = mdl_bind(m, src, &map, 1);
        if (s) core_err_context(s, "%s", path);
    }
    free(src);
    io_st_close(&f);
    if (s) {
        tlm_model_free(m);
        return s;
    }
    *out = m;
    return TLM_OK;
}
