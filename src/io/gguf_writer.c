/* GGUF v3 writer. Layout (little-endian): "GGUF", u32 version 3, u64 tensor count, u64 metadata
 * count, metadata (u64-length key, u32 type, value), tensor infos (name, u32 n_dims, u64 dims
 * innermost first, u32 ggml type, u64 offset from the data start), zero padding to the
 * alignment, then the tensor data, each tensor padded to the alignment. */
#include "io/gguf_writer.h"

#include <stdlib.h>
#include <string.h>

static tlm_status fail_nomem(io_gguf_writer *w) {
    if (!w->err) w->err = core_err(TLM_ERR_NOMEM, "out of memory while building a GGUF header");
    return w->err;
}

static tlm_status misuse(io_gguf_writer *w, const char *what, const char *key) {
    if (!w->err)
        w->err = core_err(TLM_ERR_ARG, "GGUF writer: %s%s%s%s", what, key ? " ('" : "",
                          key ? key : "", key ? "')" : "");
    return w->err;
}

static tlm_status put(io_gguf_writer *w, io_gguf_bytes *b, const void *d, size_t n) {
    if (w->err) return w->err;
    if (n > b->cap - b->n) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap - b->n < n) {
            if (cap > SIZE_MAX / 2) return fail_nomem(w);
            cap *= 2;
        }
        uint8_t *p = realloc(b->p, cap);
        if (!p) return fail_nomem(w);
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, d, n);
    b->n += n;
    return TLM_OK;
}

static tlm_status put_u32(io_gguf_writer *w, io_gguf_bytes *b, uint32_t v) {
    uint8_t x[4];
    for (int i = 0; i < 4; i++) x[i] = (uint8_t)(v >> (8 * i));
    return put(w, b, x, 4);
}

static tlm_status put_u64(io_gguf_writer *w, io_gguf_bytes *b, uint64_t v) {
    uint8_t x[8];
    for (int i = 0; i < 8; i++) x[i] = (uint8_t)(v >> (8 * i));
    return put(w, b, x, 8);
}

static tlm_status put_str(io_gguf_writer *w, io_gguf_bytes *b, const void *s, size_t n) {
    put_u64(w, b, n);
    return put(w, b, s, n);
}

void io_gguf_writer_init(io_gguf_writer *w, uint32_t alignment) {
    memset(w, 0, sizeof *w);
    w->alignment = alignment;
}

void io_gguf_writer_free(io_gguf_writer *w) {
    free(w->kv.p);
    free(w->infos.p);
    memset(w, 0, sizeof *w);
}

static tlm_status key(io_gguf_writer *w, const char *k, io_gguf_type type) {
    if (w->err) return w->err;
    if (w->array_left) return misuse(w, "key written before the open array was complete", k);
    put_str(w, &w->kv, k, strlen(k));
    put_u32(w, &w->kv, (uint32_t)type);
    w->n_kv++;
    return w->err;
}

tlm_status io_gguf_write_u32(io_gguf_writer *w, const char *k, uint32_t v) {
    if (key(w, k, IO_GGUF_U32)) return w->err;
    return put_u32(w, &w->kv, v);
}

tlm_status io_gguf_write_f32(io_gguf_writer *w, const char *k, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    if (key(w, k, IO_GGUF_F32)) return w->err;
    return put_u32(w, &w->kv, u);
}

tlm_status io_gguf_write_bool(io_gguf_writer *w, const char *k, int v) {
    uint8_t x = (uint8_t)(v != 0);
    if (key(w, k, IO_GGUF_BOOL)) return w->err;
    return put(w, &w->kv, &x, 1);
}

tlm_status io_gguf_write_str(io_gguf_writer *w, const char *k, const char *v) {
    if (key(w, k, IO_GGUF_STRING)) return w->err;
    return put_str(w, &w->kv, v, strlen(v));
}

tlm_status io_gguf_write_array(io_gguf_writer *w, const char *k, io_gguf_type elem, uint64_t n) {
    if (elem != IO_GGUF_STRING && elem != IO_GGUF_F32 && elem != IO_GGUF_I32)
        return misuse(w, "arrays hold strings, f32 or i32", k);
    if (key(w, k, IO_GGUF_ARRAY)) return w->err;
    put_u32(w, &w->kv, (uint32_t)elem);
    w->array_type = elem;
    w->array_left = n;
    return put_u64(w, &w->kv, n);
}

/* Counts one element of the open array against its declared length and type. */
static tlm_status elem(io_gguf_writer *w, io_gguf_type t) {
    if (w->err) return w->err;
    if (!w->array_left) return misuse(w, "more array elements than declared", NULL);
    if (w->array_type != t) return misuse(w, "array element of another type", NULL);
    w->array_left--;
    return TLM_OK;
}

tlm_status io_gguf_write_elem_str(io_gguf_writer *w, const void *s, size_t len) {
    if (elem(w, IO_GGUF_STRING)) return w->err;
    return put_str(w, &w->kv, s, len);
}

tlm_status io_gguf_write_elem_f32(io_gguf_writer *w, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    if (elem(w, IO_GGUF_F32)) return w->err;
    return put_u32(w, &w->kv, u);
}

tlm_status io_gguf_write_elem_i32(io_gguf_writer *w, int32_t v) {
    if (elem(w, IO_GGUF_I32)) return w->err;
    return put_u32(w, &w->kv, (uint32_t)v);
}

static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Bytes of one value of type t at p (an array's elements included); the writer made them, so
 * they are whole. */
static size_t value_bytes(const uint8_t *p, uint32_t t) {
    static const uint8_t fixed[IO_GGUF_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    if (t == IO_GGUF_STRING) return 8 + (size_t)get_u64(p);
    if (t != IO_GGUF_ARRAY) return fixed[t];
    uint32_t et =
        (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    uint64_t n = get_u64(p + 4);
    size_t at = 12;
    if (et != IO_GGUF_STRING) return at + (size_t)n * fixed[et];
    for (uint64_t i = 0; i < n; i++) at += 8 + (size_t)get_u64(p + at);
    return at;
}

int io_gguf_writer_remove(io_gguf_writer *w, const char *k) {
    if (w->err || w->array_left) return 0;
    size_t kl = strlen(k);
    for (size_t at = 0; at < w->kv.n;) {
        uint8_t *e = w->kv.p + at;
        size_t len = (size_t)get_u64(e);
        uint32_t t = (uint32_t)e[8 + len] | (uint32_t)e[9 + len] << 8 |
                     (uint32_t)e[10 + len] << 16 | (uint32_t)e[11 + len] << 24;
        size_t n = 12 + len + value_bytes(e + 12 + len, t);
        if (len == kl && !memcmp(e + 8, k, kl)) {
            memmove(e, e + n, w->kv.n - at - n);
            w->kv.n -= n;
            w->n_kv--;
            return 1;
        }
        at += n;
    }
    return 0;
}

size_t io_gguf_writer_pad(const io_gguf_writer *w, uint64_t n) {
    return (size_t)((w->alignment - n % w->alignment) % w->alignment);
}

tlm_status io_gguf_write_tensor(io_gguf_writer *w, const char *name, uint32_t n_dims,
                                const uint64_t *dims, uint32_t ggml_type, uint64_t n_bytes) {
    if (w->err) return w->err;
    if (n_dims < 1 || n_dims > IO_GGUF_MAX_DIMS)
        return misuse(w, "a tensor has 1 to 4 dimensions", name);
    uint64_t padded = n_bytes + io_gguf_writer_pad(w, n_bytes);
    if (padded < n_bytes || padded > UINT64_MAX - w->data_size)
        return misuse(w, "the data section overflows", name);
    put_str(w, &w->infos, name, strlen(name));
    put_u32(w, &w->infos, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) put_u64(w, &w->infos, dims[d]);
    put_u32(w, &w->infos, ggml_type);
    put_u64(w, &w->infos, w->data_size);
    w->data_size += padded;
    w->n_tensors++;
    return w->err;
}

tlm_status io_gguf_writer_header(io_gguf_writer *w, uint8_t **out, size_t *len) {
    *out = NULL;
    *len = 0;
    if (w->err) return w->err;
    if (w->array_left)
        return misuse(w, "header requested before the open array was complete", NULL);
    if (!w->alignment || (w->alignment & (w->alignment - 1)))
        return misuse(w, "the alignment must be a power of two", NULL);
    io_gguf_bytes h = {0};
    put(w, &h, "GGUF", 4);
    put_u32(w, &h, 3);
    put_u64(w, &h, w->n_tensors);
    put_u64(w, &h, w->n_kv);
    put(w, &h, w->kv.p, w->kv.n);
    put(w, &h, w->infos.p, w->infos.n);
    static const uint8_t zeros[256];
    for (size_t pad = io_gguf_writer_pad(w, h.n); pad && !w->err;) {
        size_t k = pad < sizeof zeros ? pad : sizeof zeros;
        put(w, &h, zeros, k);
        pad -= k;
    }
    if (w->err) {
        free(h.p);
        return w->err;
    }
    *out = h.p;
    *len = h.n;
    return TLM_OK;
}
