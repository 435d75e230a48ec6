/* tlm's own model files: every schema tensor as F32 under its canonical name, and the config JSON
 * in the metadata. */
#include <stdlib.h>
#include <string.h>

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

tlm_status tlm_model_load_safetensors(tlm_model *m, const char *path) {
    st_file f;
    tlm_status s = st_open(&f, path);
    if (s) return s;
    for (int i = 0; i < m->n_tensors && !s; i++) {
        const tlm_tensor_info *ti = &m->tensors[i];
        const st_tensor *t = st_find(&f, ti->name);
        if (!t) {
            s = tlm_err(TLM_ERR_FORMAT, "%s: missing tensor '%s'", path, ti->name);
            break;
        }
        if (t->ndim != ti->ndim || t->shape[0] != ti->shape[0] ||
            (ti->ndim == 2 && t->shape[1] != ti->shape[1])) {
            s = tlm_err(TLM_ERR_FORMAT, "%s: tensor '%s' has the wrong shape for this config", path,
                        ti->name);
            break;
        }
        s = st_read_f32(&f, t, m->params + ti->offset, ti->numel);
        if (s) tlm_err_context(s, "%s", path);
    }
    st_close(&f);
    return s;
}
