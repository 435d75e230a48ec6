/* tlm's own model files: every schema tensor as F32 under its canonical name, and the config JSON
 * in the metadata. */
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "formats/formats.h"
#include "io/safetensors.h"
#include "model/model.h"

tlm_status tlm_model_save_safetensors(const tlm_model *m, const char *path) {
    st_out_tensor *t = calloc((size_t)m->n_tensors, sizeof *t);
    char *cfg = tlm_config_to_json(&m->c);
    if (!t || !cfg) {
        free(t);
        free(cfg);
        return tlm_err(TLM_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < m->n_tensors; i++) {
        const tlm_tensor_info *ti = &m->tensors[i];
        t[i].name = ti->name;
        t[i].dtype = TLM_DTYPE_F32;
        t[i].ndim = ti->ndim;
        t[i].shape[0] = ti->shape[0];
        t[i].shape[1] = ti->shape[1];
        t[i].data = m->params + ti->offset;
    }
    const char *keys[] = {"format", "tlm_config"};
    const char *vals[] = {"tlm", cfg};
    tlm_status s = st_write(path, t, m->n_tensors, keys, vals, 2);
    free(t);
    free(cfg);
    return s;
}

/* Every schema tensor is in f with its shape and a float dtype: checked before a model is
 * allocated or anything is read, so a header cannot make us allocate what its file lacks. */
static tlm_status check_tensors(const st_file *f, const tlm_tensor_info *ti, int n,
                                const char *path) {
    for (int i = 0; i < n; i++) {
        const st_tensor *t = st_find(f, ti[i].name);
        if (!t) return tlm_err(TLM_ERR_FORMAT, "%s: missing tensor '%s'", path, ti[i].name);
        if (t->ndim != ti[i].ndim || t->shape[0] != ti[i].shape[0] ||
            (ti[i].ndim == 2 && t->shape[1] != ti[i].shape[1]))
            return tlm_err(TLM_ERR_FORMAT, "%s: tensor '%s' has the wrong shape for this config",
                           path, ti[i].name);
        if (!tlm_dtype_get(t->dtype)->is_float)
            return tlm_err(TLM_ERR_FORMAT, "%s: tensor '%s' has dtype %s, expected a float type",
                           path, ti[i].name, tlm_dtype_name(t->dtype));
    }
    return TLM_OK;
}

static tlm_status read_tensors(const st_file *f, const tlm_tensor_info *ti, int n, float *params,
                               const char *path) {
    tlm_status s = TLM_OK;
    for (int i = 0; i < n && !s; i++) {
        s = st_read_f32(f, st_find(f, ti[i].name), params + ti[i].offset, ti[i].numel);
        if (s) tlm_err_context(s, "%s", path);
    }
    return s;
}

tlm_status tlm_model_load_safetensors(tlm_model *m, const char *path) {
    st_file f;
    tlm_status s = st_open(&f, path);
    if (s) return s;
    s = check_tensors(&f, m->tensors, m->n_tensors, path);
    if (!s) s = read_tensors(&f, m->tensors, m->n_tensors, m->params, path);
    st_close(&f);
    return s;
}

tlm_status fmt_safetensors_load_model(const char *path, tlm_model **out) {
    *out = NULL;
    st_file f;
    tlm_status s = st_open(&f, path);
    if (s) return s;
    tlm_config c;
    tlm_tensor_info *ti = NULL;
    int n = 0;
    const char *cfg = st_meta(&f, "tlm_config");
    if (!cfg) {
        s = tlm_err(TLM_ERR_FORMAT, "%s: no tlm_config in the metadata", path);
    } else if ((s = tlm_config_from_json(cfg, &c))) {
        tlm_err_context(s, "%s: config in metadata", path);
    } else {
        n = tlm_schema(&c, NULL, 0, NULL);
        ti = calloc((size_t)n, sizeof *ti);
        if (!ti) s = tlm_err(TLM_ERR_NOMEM, "out of memory");
    }
    if (!s) {
        tlm_schema(&c, ti, n, NULL);
        s = check_tensors(&f, ti, n, path);
    }
    tlm_model *m = NULL;
    if (!s) s = fmt_model_create(&c, path, &m);
    if (!s) s = read_tensors(&f, m->tensors, m->n_tensors, m->params, path);
    free(ti);
    st_close(&f);
    if (s) {
        tlm_model_free(m);
        return s;
    }
    *out = m;
    return TLM_OK;
}
