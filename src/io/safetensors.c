#include "io/safetensors.h"

#include <stdlib.h>
#include <string.h>

#include "core/half.h"

#define ST_MAX_HEADER ((size_t)100 << 20)

static int parse_dtype(const char *s, tlm_dtype *out) {
    /* safetensors has no block types */
    return core_dtype_from_name(s, out) && core_dtype_get(*out)->block_elems == 1;
}

void io_st_close(io_st_file *f) {
    for (int i = 0; i < f->n; i++) free(f->tensors[i].name);
    free(f->tensors);
    free(f->by_name);
    cJSON_Delete(f->metadata);
    core_mmap_close(&f->map);
    memset(f, 0, sizeof *f);
}

static int cmp_begin(const void *a, const void *b) {
    const io_st_tensor *x = *(const io_st_tensor *const *)a, *y = *(const io_st_tensor *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static int cmp_name(const void *a, const void *b) {
    const io_st_name *x = a, *y = b;
    return strcmp(x->name, y->name);
}

static tlm_status parse_entry(const cJSON *e, io_st_tensor *t, size_t data_len) {
    if (!cJSON_IsObject(e)) return core_err(TLM_ERR_FORMAT, "entry is not an object");
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *of = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt) || !parse_dtype(dt->valuestring, &t->dtype))
        return core_err(TLM_ERR_FORMAT, "missing or unknown dtype");
    if (!cJSON_IsArray(sh)) return core_err(TLM_ERR_FORMAT, "missing shape");
    int nd = cJSON_GetArraySize(sh);
    if (nd > ST_MAX_DIMS)
        return core_err(TLM_ERR_FORMAT, "%d dimensions (at most %d)", nd, ST_MAX_DIMS);
    t->ndim = nd;
    size_t numel = 1;
    int i = 0;
    for (const cJSON *d = sh->child; d; d = d->next, i++) {
        if (!cJSON_IsNumber(d) || d->valuedouble < 0 || d->valuedouble > 9e15 ||
            d->valuedouble != (double)(int64_t)d->valuedouble)
            return core_err(TLM_ERR_FORMAT, "bad dimension in shape");
        t->shape[i] = (int64_t)d->valuedouble;
        if (!core_mul_ok(numel, (size_t)t->shape[i], &numel))
            return core_err(TLM_ERR_FORMAT, "shape overflows");
    }
    t->numel = numel;
    if (!cJSON_IsArray(of) || cJSON_GetArraySize(of) != 2)
        return core_err(TLM_ERR_FORMAT, "data_offsets must be [begin, end]");
    double b = of->child->valuedouble, en = of->child->next->valuedouble;
    if (!cJSON_IsNumber(of->child) || !cJSON_IsNumber(of->child->next) || b < 0 || en < b ||
        en > (double)data_len || b != (double)(size_t)b || en != (double)(size_t)en)
        return core_err(TLM_ERR_FORMAT, "data_offsets [%.0f, %.0f] outside the %zu data bytes", b,
                        en, data_len);
    t->begin = (size_t)b;
    t->end = (size_t)en;
    size_t bytes;
    if (!core_mul_ok(numel, (size_t)core_dtype_get(t->dtype)->block_bytes, &bytes) ||
        bytes != t->end - t->begin)
        return core_err(TLM_ERR_FORMAT, "%s x shape is not the %zu bytes of its data_offsets",
                        tlm_dtype_name(t->dtype), t->end - t->begin);
    return TLM_OK;
}

tlm_status io_st_open(io_st_file *f, const char *path) {
    memset(f, 0, sizeof *f);
    tlm_status s = core_mmap_open(&f->map, path);
    if (s) return s;
    const uint8_t *p = f->map.data;
    size_t size = f->map.size;
    if (size < 8) {
        io_st_close(f);
        return core_err(TLM_ERR_FORMAT, "%s: too short for safetensors (%zu bytes)", path, size);
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | p[i];
    if (hlen > ST_MAX_HEADER || hlen > size - 8) {
        io_st_close(f);
        return core_err(TLM_ERR_FORMAT, "%s: header length %llu is larger than %s", path,
                        (unsigned long long)hlen, hlen > ST_MAX_HEADER ? "100 MB" : "the file");
    }
    cJSON *root = cJSON_ParseWithLength((const char *)p + 8, (size_t)hlen);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        io_st_close(f);
        return core_err(TLM_ERR_FORMAT, "%s: header is not a JSON object", path);
    }
    f->data = p + 8 + hlen;
    f->data_len = size - 8 - (size_t)hlen;
    int count = 0;
    for (cJSON *e = root->child; e; e = e->next)
        if (strcmp(e->string, "__metadata__") != 0) count++;
    f->tensors = calloc((size_t)count + 1, sizeof *f->tensors);
    io_st_tensor **order = calloc((size_t)count + 1, sizeof *order);
    if (!f->tensors || !order) {
        free(order);
        cJSON_Delete(root);
        io_st_close(f);
        return core_err(TLM_ERR_NOMEM, "out of memory");
    }
    for (cJSON *e = root->child; e; e = e->next) {
        if (!strcmp(e->string, "__metadata__")) {
            if (!cJSON_IsObject(e)) {
                s = core_err(TLM_ERR_FORMAT, "__metadata__ is not an object");
                break;
            }
            continue;
        }
        io_st_tensor *t = &f->tensors[f->n];
        s = parse_entry(e, t, f->data_len);
        if (s) {
            core_err_context(s, "tensor '%s'", e->string);
            break;
        }
        t->name = strdup(e->string);
        if (!t->name) {
            s = core_err(TLM_ERR_NOMEM, "out of memory");
            break;
        }
        order[f->n] = t;
        f->n++;
    }
    if (!s) {
        qsort(order, (size_t)f->n, sizeof *order, cmp_begin);
        for (int i = 1; i < f->n; i++)
            if (order[i]->begin < order[i - 1]->end) {
                s = core_err(TLM_ERR_FORMAT, "tensors '%s' and '%s' overlap", order[i - 1]->name,
                             order[i]->name);
                break;
            }
    }
    free(order);
    /* cJSON keeps both members of a repeated key; a name must say which tensor it is */
    if (!s && !(f->by_name = malloc(((size_t)f->n + 1) * sizeof *f->by_name)))
        s = core_err(TLM_ERR_NOMEM, "out of memory");
    if (!s) {
        for (int i = 0; i < f->n; i++) f->by_name[i] = (io_st_name){f->tensors[i].name, i};
        qsort(f->by_name, (size_t)f->n, sizeof *f->by_name, cmp_name);
        for (int i = 1; i < f->n && !s; i++)
            if (!strcmp(f->by_name[i - 1].name, f->by_name[i].name))
                s = core_err(TLM_ERR_FORMAT, "tensor '%s' appears twice", f->by_name[i].name);
    }
    if (!s) {
        cJSON *meta = cJSON_DetachItemFromObjectCaseSensitive(root, "__metadata__");
        f->metadata = meta;
    }
    cJSON_Delete(root);
    if (s) {
        io_st_close(f);
        return core_err_context(s, "%s", path);
    }
    return TLM_OK;
}

const io_st_tensor *io_st_find(const io_st_file *f, const char *name) {
    io_st_name key = {name, 0};
    const io_st_name *e =
        f->by_name ? bsearch(&key, f->by_name, (size_t)f->n, sizeof key, cmp_name) : NULL;
    return e ? &f->tensors[e->i] : NULL;
}

const char *io_st_meta(const io_st_file *f, const char *key) {
    if (!f->metadata) return NULL;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(f->metadata, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

tlm_status io_st_read_f32(const io_st_file *f, const io_st_tensor *t, float *dst, size_t n) {
    if (n != t->numel)
        return core_err(TLM_ERR_FORMAT, "tensor '%s' has %zu elements, expected %zu", t->name,
                        t->numel, n);
    const uint8_t *p = f->data + t->begin;
    if (!core_dtype_get(t->dtype)->is_float)
        return core_err(TLM_ERR_FORMAT, "tensor '%s' has dtype %s, expected a float type", t->name,
                        tlm_dtype_name(t->dtype));
    return core_dtype_to_f32(t->dtype, p, dst, n);
}

tlm_status io_st_read_i32(const io_st_file *f, const io_st_tensor *t, int32_t *dst, size_t n) {
    if (n != t->numel)
        return core_err(TLM_ERR_FORMAT, "tensor '%s' has %zu elements, expected %zu", t->name,
                        t->numel, n);
    const uint8_t *p = f->data + t->begin;
    if (t->dtype == TLM_DTYPE_I32) {
        memcpy(dst, p, n * 4);
        return TLM_OK;
    }
    if (t->dtype == TLM_DTYPE_I64) {
        for (size_t i = 0; i < n; i++) {
            int64_t v;
            memcpy(&v, p + 8 * i, 8);
            if (v < INT32_MIN || v > INT32_MAX)
                return core_err(TLM_ERR_RANGE, "tensor '%s' value %lld exceeds int32", t->name,
                                (long long)v);
            dst[i] = (int32_t)v;
        }
        return TLM_OK;
    }
    return core_err(TLM_ERR_FORMAT, "tensor '%s' has dtype %s, expected I32 or I64", t->name,
                    tlm_dtype_name(t->dtype));
}

tlm_status io_st_write(const char *path, const io_st_out_tensor *t, int n, const char *const *keys,
                       const char *const *values, int n_meta) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return core_err(TLM_ERR_NOMEM, "out of memory");
    if (n_meta > 0) {
        cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
        for (int i = 0; meta && i < n_meta; i++) cJSON_AddStringToObject(meta, keys[i], values[i]);
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        size_t numel = 1;
        cJSON *e = cJSON_AddObjectToObject(root, t[i].name);
        cJSON *shape = cJSON_AddArrayToObject(e, "shape");
        for (int d = 0; d < t[i].ndim; d++) {
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t[i].shape[d]));
            numel *= (size_t)t[i].shape[d];
        }
        cJSON_AddStringToObject(e, "dtype", tlm_dtype_name(t[i].dtype));
        size_t bytes = numel * core_dtype_get(t[i].dtype)->block_bytes;
        cJSON *offs = cJSON_AddArrayToObject(e, "data_offsets");
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(off + bytes)));
        off += bytes;
    }
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!json) return core_err(TLM_ERR_NOMEM, "out of memory");
    size_t hlen = strlen(json), padded = (hlen + 7) & ~(size_t)7;
    uint8_t head[8];
    for (int i = 0; i < 8; i++) head[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    core_atomic_file a;
    tlm_status s = core_atomic_open(&a, path);
    if (s) {
        free(json);
        return s;
    }
    s = core_atomic_write(&a, head, 8);
    if (!s) s = core_atomic_write(&a, json, hlen);
    if (!s) s = core_atomic_write(&a, "        ", padded - hlen);
    free(json);
    uint16_t buf[4096];
    for (int i = 0; i < n && !s; i++) {
        size_t numel = 1;
        for (int d = 0; d < t[i].ndim; d++) numel *= (size_t)t[i].shape[d];
        if (t[i].dtype == TLM_DTYPE_F16 || t[i].dtype == TLM_DTYPE_BF16) {
            const float *src = t[i].data;
            for (size_t j = 0; j < numel && !s; j += 4096) {
                size_t m = numel - j < 4096 ? numel - j : 4096;
                for (size_t k = 0; k < m; k++)
                    buf[k] = t[i].dtype == TLM_DTYPE_F16 ? core_f32_to_f16(src[j + k])
                                                         : core_f32_to_bf16(src[j + k]);
                s = core_atomic_write(&a, buf, m * 2);
            }
        } else {
            s = core_atomic_write(&a, t[i].data, numel * core_dtype_get(t[i].dtype)->block_bytes);
        }
    }
    if (s) {
        core_atomic_abort(&a);
        return s;
    }
    return core_atomic_commit(&a);
}
