/* What a model file stores, tensor by tensor, for `tlm info -m`. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "formats/formats.h"
#include "io/gguf.h"
#include "io/safetensors.h"

tlm_status fmt_safetensors_list(const io_st_file *f, tlm_file_tensor **out, int *n);
tlm_status fmt_hf_list(const char *dir, tlm_file_tensor **out, int *n);

static tlm_status list_gguf(const char *path, tlm_file_tensor **out, int *n) {
    io_gguf *gs[IO_GGUF_MAX_SPLITS] = {0};
    int files = 1;
    tlm_status s = io_gguf_open(path, &gs[0]);
    if (s) return s;
    /* a split model's tensors from all its shards */
    s = fmt_gguf_open_shards(gs[0], path, gs, &files);
    uint64_t total = 0;
    for (int f = 0; f < files; f++) total += gs[f]->n_tensors;
    if (!s && total > (1u << 20)) s = core_err(TLM_ERR_FORMAT, "%s: too many tensors", path);
    if (!s && !(*out = calloc((size_t)total + 1, sizeof **out)))
        s = core_err(TLM_ERR_NOMEM, "out of memory");
    int k = 0;
    for (int f = 0; f < files && !s; f++)
        for (uint64_t i = 0; i < gs[f]->n_tensors; i++) {
            const io_gguf_tensor *t = &gs[f]->tensors[i];
            tlm_file_tensor *e = &(*out)[k++];
            const char *tn = NULL;
            snprintf(e->name, sizeof e->name, "%s", t->name);
            if (io_ggml_type_info(t->type, &tn, NULL, NULL))
                snprintf(e->dtype, sizeof e->dtype, "%s", tn);
            else
                snprintf(e->dtype, sizeof e->dtype, "type%u", t->type);
            e->ndim = (int)t->n_dims;
            for (int d = 0; d < e->ndim; d++) e->shape[d] = (int64_t)t->dims[e->ndim - 1 - d];
        }
    if (!s) *n = k;
    for (int f = 0; f < files; f++) io_gguf_close(gs[f]);
    return s;
}

/* llama2.c arrays are unnamed: list the schema of the loaded model as F32. */
static tlm_status list_schema(const char *path, tlm_file_tensor **out, int *n) {
    tlm_model *m;
    tlm_status s = tlm_model_load(path, 0, &m);
    if (s) return s;
    int nt;
    const tlm_tensor_info *ti = tlm_model_tensors(m, &nt);
    *out = calloc((size_t)nt + 1, sizeof **out);
    if (!*out) {
        tlm_model_free(m);
        return core_err(TLM_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < nt; i++) {
        tlm_file_tensor *e = &(*out)[i];
        snprintf(e->name, sizeof e->name, "%s", ti[i].name);
        snprintf(e->dtype, sizeof e->dtype, "F32");
        e->ndim = ti[i].ndim;
        for (int k = 0; k < ti[i].ndim; k++) e->shape[k] = ti[i].shape[k];
    }
    *n = nt;
    tlm_model_free(m);
    return TLM_OK;
}

tlm_status tlm_model_file_tensors(const char *path, tlm_file_tensor **out, int *n) {
    *out = NULL;
    *n = 0;
    tlm_model_format f;
    tlm_status s = tlm_model_detect(path, &f);
    if (s) return s;
    switch (f) {
    case TLM_FORMAT_GGUF: s = list_gguf(path, out, n); break;
    case TLM_FORMAT_LLAMA2C: s = list_schema(path, out, n); break;
    case TLM_FORMAT_HF: s = fmt_hf_list(path, out, n); break;
    case TLM_FORMAT_TLM: {
        struct stat st;
        char *p = NULL;
        if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
            size_t len = strlen(path) + 32;
            p = malloc(len);
            if (!p) return core_err(TLM_ERR_NOMEM, "out of memory");
            snprintf(p, len, "%s/model.safetensors", path);
        }
        io_st_file sf;
        s = io_st_open(&sf, p ? p : path);
        free(p);
        if (!s) {
            s = fmt_safetensors_list(&sf, out, n);
            io_st_close(&sf);
        }
        break;
    }
    default: s = core_err(TLM_ERR_FORMAT, "'%s': unknown format", path);
    }
    if (s) {
        free(*out);
        *out = NULL;
        *n = 0;
    }
    return s;
}
