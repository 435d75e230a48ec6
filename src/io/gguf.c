/* GGUF reader. Layout (little-endian): "GGUF", u32 version, n_tensors, n_kv (u64; u32 in v1),
 * n_kv key/value pairs, n_tensors tensor infos, padding to general.alignment, tensor data.
 * Strings are a length (u64; u32 in v1) and bytes; arrays an element type, a count and the
 * elements. */
#include "io/gguf.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const uint8_t *p;
    size_t size, pos;
    uint32_t version;
    const char *name;
} cursor;

static tlm_status truncated(const cursor *c, const char *what) {
    return core_err(TLM_ERR_FORMAT, "'%s': truncated while reading %s at byte %zu (file has %zu)",
                    c->name, what, c->pos, c->size);
}

static int need(const cursor *c, uint64_t n) { return n <= c->size - c->pos; }

static tlm_status rd(cursor *c, void *out, size_t n, const char *what) {
    if (!need(c, n)) return truncated(c, what);
    memcpy(out, c->p + c->pos, n);
    c->pos += n;
    return TLM_OK;
}

/* A count or length: u64 from version 2 on, u32 in version 1. */
static tlm_status rd_count(cursor *c, uint64_t *v, const char *what) {
    if (c->version == 1) {
        uint32_t x = 0;
        tlm_status s = rd(c, &x, 4, what);
        *v = x;
        return s;
    }
    return rd(c, v, 8, what);
}

static tlm_status rd_str(cursor *c, const uint8_t **s, uint64_t *len, const char *what) {
    tlm_status st = rd_count(c, len, what);
    if (st) return st;
    if (!need(c, *len))
        return core_err(TLM_ERR_FORMAT,
                        "'%s': %s of %llu bytes at byte %zu runs past the end of the file", c->name,
                        what, (unsigned long long)*len, c->pos);
    *s = c->p + c->pos;
    c->pos += (size_t)*len;
    return TLM_OK;
}

static size_t scalar_size(io_gguf_type t) {
    switch (t) {
    case IO_GGUF_U8:
    case IO_GGUF_I8:
    case IO_GGUF_BOOL: return 1;
    case IO_GGUF_U16:
    case IO_GGUF_I16: return 2;
    case IO_GGUF_U32:
    case IO_GGUF_I32:
    case IO_GGUF_F32: return 4;
    case IO_GGUF_U64:
    case IO_GGUF_I64:
    case IO_GGUF_F64: return 8;
    default: return 0;
    }
}

const char *io_gguf_type_name(io_gguf_type t) {
    static const char *const names[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                        "bool", "string", "array", "u64", "i64", "f64"};
    return (unsigned)t < IO_GGUF_TYPE_COUNT ? names[t] : "unknown";
}

int io_ggml_type_info(uint32_t type, const char **name, uint32_t *block_elems,
                      uint32_t *block_bytes) {
    static const struct {
        uint32_t id;
        const char *name;
        uint32_t be, bb;
    } T[] = {
        {0, "F32", 1, 4},         {1, "F16", 1, 2},         {2, "Q4_0", 32, 18},
        {3, "Q4_1", 32, 20},      {6, "Q5_0", 32, 22},      {7, "Q5_1", 32, 24},
        {8, "Q8_0", 32, 34},      {9, "Q8_1", 32, 36},      {10, "Q2_K", 256, 84},
        {11, "Q3_K", 256, 110},   {12, "Q4_K", 256, 144},   {13, "Q5_K", 256, 176},
        {14, "Q6_K", 256, 210},   {15, "Q8_K", 256, 292},   {16, "IQ2_XXS", 256, 66},
        {17, "IQ2_XS", 256, 74},  {18, "IQ3_XXS", 256, 98}, {19, "IQ1_S", 256, 50},
        {20, "IQ4_NL", 32, 18},   {21, "IQ3_S", 256, 110},  {22, "IQ2_S", 256, 82},
        {23, "IQ4_XS", 256, 136}, {24, "I8", 1, 1},         {25, "I16", 1, 2},
        {26, "I32", 1, 4},        {27, "I64", 1, 8},        {28, "F64", 1, 8},
        {29, "IQ1_M", 256, 56},   {30, "BF16", 1, 2},       {34, "TQ1_0", 256, 54},
        {35, "TQ2_0", 256, 66},   {39, "MXFP4", 32, 17},
    };
    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++)
        if (T[i].id == type) {
            if (name) *name = T[i].name;
            if (block_elems) *block_elems = T[i].be;
            if (block_bytes) *block_bytes = T[i].bb;
            return 1;
        }
    return 0;
}

static char *dup_n(const uint8_t *s, uint64_t n) {
    char *p = malloc((size_t)n + 1);
    if (!p) return NULL;
    memcpy(p, s, (size_t)n);
    p[n] = 0;
    return p;
}

/* Skips (and validates) one value of type t; depth bounds nested arrays. For arrays of strings
 * at the top level, kv receives the element table. */
static tlm_status parse_value(cursor *c, io_gguf_type t, int depth, io_gguf_kv *kv,
                              const char *key) {
    if ((unsigned)t >= IO_GGUF_TYPE_COUNT)
        return core_err(TLM_ERR_FORMAT, "'%s': key '%s' has unknown value type %u", c->name, key,
                        (unsigned)t);
    if (t == IO_GGUF_STRING) {
        const uint8_t *s;
        uint64_t len;
        tlm_status st = rd_str(c, &s, &len, "a string value");
        if (kv) kv->data = s, kv->len = len;
        return st;
    }
    if (t != IO_GGUF_ARRAY) {
        size_t n = scalar_size(t);
        if (!need(c, n)) return truncated(c, "a value");
        if (kv) kv->data = c->p + c->pos, kv->len = 1;
        if (t == IO_GGUF_BOOL && c->p[c->pos] > 1)
            return core_err(TLM_ERR_FORMAT, "'%s': key '%s' has bool value %u", c->name, key,
                            c->p[c->pos]);
        c->pos += n;
        return TLM_OK;
    }
    if (depth >= 8)
        return core_err(TLM_ERR_FORMAT, "'%s': key '%s' nests arrays too deeply", c->name, key);
    uint32_t et = 0;
    uint64_t count;
    tlm_status st = rd(c, &et, 4, "an array type");
    if (!st) st = rd_count(c, &count, "an array length");
    if (st) return st;
    if (et >= IO_GGUF_TYPE_COUNT)
        return core_err(TLM_ERR_FORMAT, "'%s': array '%s' has unknown element type %u", c->name,
                        key, et);
    if (kv) {
        kv->elem_type = (io_gguf_type)et;
        kv->len = count;
        kv->data = c->p + c->pos;
    }
    size_t es = scalar_size((io_gguf_type)et);
    if (es) {
        if (count > (c->size - c->pos) / es)
            return core_err(TLM_ERR_FORMAT,
                            "'%s': array '%s' of %llu %s elements runs past the end of the file",
                            c->name, key, (unsigned long long)count, io_gguf_type_name(et));
        c->pos += (size_t)(count * es);
        return TLM_OK;
    }
    /* strings and nested arrays take at least 4 bytes each: bound the count before allocating */
    if (count > (c->size - c->pos) / 4)
        return core_err(TLM_ERR_FORMAT,
                        "'%s': array '%s' claims %llu elements, more than the file holds", c->name,
                        key, (unsigned long long)count);
    if (kv && et == IO_GGUF_STRING) {
        kv->strs = malloc((size_t)(count ? count : 1) * sizeof *kv->strs);
        kv->str_lens = malloc((size_t)(count ? count : 1) * sizeof *kv->str_lens);
        if (!kv->strs || !kv->str_lens) return core_err(TLM_ERR_NOMEM, "out of memory");
    }
    for (uint64_t i = 0; i < count; i++) {
        if (et == IO_GGUF_STRING) {
            const uint8_t *s;
            uint64_t len;
            st = rd_str(c, &s, &len, "an array string");
            if (st)
                return core_err_context(st, "array '%s' element %llu", key, (unsigned long long)i);
            if (kv) kv->strs[i] = s, kv->str_lens[i] = len;
        } else {
            st = parse_value(c, (io_gguf_type)et, depth + 1, NULL, key);
            if (st) return st;
        }
    }
    return TLM_OK;
}

static int cmp_name(const void *a, const void *b) {
    const io_gguf_name *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    if (c) return c;
    return x->i < y->i ? -1 : x->i > y->i;
}

/* Sorts a name table; returns a name that appears twice, or NULL. */
static const char *sort_names(io_gguf_name *t, uint64_t n) {
    qsort(t, (size_t)n, sizeof *t, cmp_name);
    for (uint64_t i = 1; i < n; i++)
        if (!strcmp(t[i - 1].name, t[i].name)) return t[i].name;
    return NULL;
}

/* The entry of the first name equal to name in a sorted table (the earliest in the file), or -1. */
static int64_t find_name(const io_gguf_name *t, uint64_t n, const char *name) {
    uint64_t lo = 0, hi = n;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (strcmp(t[mid].name, name) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && !strcmp(t[lo].name, name) ? (int64_t)t[lo].i : -1;
}

void io_gguf_close(io_gguf *g) {
    if (!g) return;
    for (uint64_t i = 0; g->kv && i < g->n_kv; i++) {
        free(g->kv[i].key);
        free(g->kv[i].strs);
        free(g->kv[i].str_lens);
    }
    for (uint64_t i = 0; g->tensors && i < g->n_tensors; i++) free(g->tensors[i].name);
    free(g->kv);
    free(g->tensors);
    free(g->kv_by_key);
    free(g->tensor_by_name);
    if (g->owns_map) core_mmap_close(&g->map);
    free(g);
}

static tlm_status parse(io_gguf *g, const char *name) {
    cursor c = {g->base, g->size, 0, 0, name};
    char magic[4];
    if (g->size < 8 || memcmp(g->base, "GGUF", 4) != 0)
        return core_err(TLM_ERR_FORMAT, "'%s' is not a GGUF file (no GGUF magic)", name);
    rd(&c, magic, 4, "the magic");
    tlm_status s = rd(&c, &g->version, 4, "the version");
    if (s) return s;
    if (g->version == 0x03000000 || g->version == 0x02000000)
        return core_err(TLM_ERR_UNSUPPORTED, "'%s' is a big-endian GGUF, which is not supported",
                        name);
    if (g->version < 1 || g->version > 3)
        return core_err(TLM_ERR_UNSUPPORTED, "'%s': GGUF version %u is not supported (1-3)", name,
                        g->version);
    c.version = g->version;
    uint64_t nt, nkv;
    if ((s = rd_count(&c, &nt, "the tensor count")) || (s = rd_count(&c, &nkv, "the key count")))
        return s;
    /* each key/value takes at least 12 bytes and each tensor info at least 20: reject counts the
     * file cannot hold before allocating for them */
    if (nkv > (g->size - c.pos) / 12 || nt > (g->size - c.pos) / 20)
        return core_err(TLM_ERR_FORMAT,
                        "'%s' claims %llu keys and %llu tensors, more than its %zu bytes hold",
                        name, (unsigned long long)nkv, (unsigned long long)nt, g->size);
    g->kv = calloc((size_t)(nkv ? nkv : 1), sizeof *g->kv);
    g->tensors = calloc((size_t)(nt ? nt : 1), sizeof *g->tensors);
    if (!g->kv || !g->tensors) return core_err(TLM_ERR_NOMEM, "out of memory");
    g->alignment = IO_GGUF_DEFAULT_ALIGNMENT;
    for (uint64_t i = 0; i < nkv; i++) {
        io_gguf_kv *kv = &g->kv[i];
        const uint8_t *k;
        uint64_t kl;
        uint32_t type = 0;
        if ((s = rd_str(&c, &k, &kl, "a key"))) return s;
        if (!(kv->key = dup_n(k, kl))) return core_err(TLM_ERR_NOMEM, "out of memory");
        g->n_kv = i + 1; /* owned from here on */
        if (strlen(kv->key) != kl)
            return core_err(TLM_ERR_FORMAT, "'%s': key %llu contains a NUL byte", name,
                            (unsigned long long)i);
        if ((s = rd(&c, &type, 4, "a value type"))) return s;
        kv->type = (io_gguf_type)type;
        if ((s = parse_value(&c, kv->type, 0, kv, kv->key))) return s;
    }
    g->n_kv = nkv;
    if (!(g->kv_by_key = malloc((size_t)(nkv ? nkv : 1) * sizeof *g->kv_by_key)))
        return core_err(TLM_ERR_NOMEM, "out of memory");
    for (uint64_t i = 0; i < nkv; i++) g->kv_by_key[i] = (io_gguf_name){g->kv[i].key, i};
    const char *dup = sort_names(g->kv_by_key, nkv);
    if (dup) return core_err(TLM_ERR_FORMAT, "'%s': key '%s' appears twice", name, dup);
    const io_gguf_kv *al = io_gguf_find(g, "general.alignment");
    if (al) {
        uint32_t a = 0;
        if (al->type == IO_GGUF_U32) memcpy(&a, al->data, 4);
        if (al->type != IO_GGUF_U32 || a == 0 || (a & (a - 1)))
            return core_err(TLM_ERR_FORMAT, "'%s': general.alignment must be a u32 power of two",
                            name);
        g->alignment = a;
    }
    for (uint64_t i = 0; i < nt; i++) {
        io_gguf_tensor *t = &g->tensors[i];
        const uint8_t *nm;
        uint64_t nl;
        if ((s = rd_str(&c, &nm, &nl, "a tensor name"))) return s;
        if (!(t->name = dup_n(nm, nl))) return core_err(TLM_ERR_NOMEM, "out of memory");
        g->n_tensors = i + 1;
        if ((s = rd(&c, &t->n_dims, 4, "a tensor rank"))) return s;
        if (t->n_dims < 1 || t->n_dims > IO_GGUF_MAX_DIMS)
            return core_err(TLM_ERR_FORMAT, "'%s': tensor '%s' has %u dimensions (1-%d)", name,
                            t->name, t->n_dims, IO_GGUF_MAX_DIMS);
        t->n_elements = 1;
        for (uint32_t d = 0; d < IO_GGUF_MAX_DIMS; d++) {
            t->dims[d] = 1;
            if (d >= t->n_dims) continue;
            if ((s = rd_count(&c, &t->dims[d], "a tensor dimension"))) return s;
            if (t->dims[d] == 0 || t->dims[d] > INT64_MAX / t->n_elements)
                return core_err(TLM_ERR_FORMAT, "'%s': tensor '%s' has an invalid shape", name,
                                t->name);
            t->n_elements *= t->dims[d];
        }
        if ((s = rd(&c, &t->type, 4, "a tensor type")) ||
            (s = rd(&c, &t->offset, 8, "a tensor offset")))
            return s;
    }
    g->n_tensors = nt;
    if (!(g->tensor_by_name = malloc((size_t)(nt ? nt : 1) * sizeof *g->tensor_by_name)))
        return core_err(TLM_ERR_NOMEM, "out of memory");
    for (uint64_t i = 0; i < nt; i++) g->tensor_by_name[i] = (io_gguf_name){g->tensors[i].name, i};
    if ((dup = sort_names(g->tensor_by_name, nt)))
        return core_err(TLM_ERR_FORMAT, "'%s': tensor '%s' appears twice", name, dup);
    uint64_t pos = c.pos;
    g->data_offset = (pos + g->alignment - 1) / g->alignment * g->alignment;
    for (uint64_t i = 0; i < nt; i++) {
        io_gguf_tensor *t = &g->tensors[i];
        uint32_t be, bb;
        const char *tn;
        if (t->offset % g->alignment)
            return core_err(TLM_ERR_FORMAT, "'%s': tensor '%s' offset %llu is not aligned to %llu",
                            name, t->name, (unsigned long long)t->offset,
                            (unsigned long long)g->alignment);
        if (!io_ggml_type_info(t->type, &tn, &be, &bb)) continue; /* size unknown: left to users */
        if (t->dims[0] % be)
            return core_err(TLM_ERR_FORMAT,
                            "'%s': tensor '%s' row of %llu is not a multiple of the %s block (%u)",
                            name, t->name, (unsigned long long)t->dims[0], tn, be);
        uint64_t blocks = t->n_elements / be;
        if (blocks > UINT64_MAX / bb)
            return core_err(TLM_ERR_FORMAT, "'%s': tensor '%s' is too large", name, t->name);
        t->n_bytes = blocks * bb;
        if (g->data_offset > g->size || t->offset > g->size - g->data_offset ||
            t->n_bytes > g->size - g->data_offset - t->offset)
            return core_err(
                TLM_ERR_FORMAT,
                "'%s': tensor '%s' (%llu bytes at data offset %llu) runs past the end of the file",
                name, t->name, (unsigned long long)t->n_bytes, (unsigned long long)t->offset);
        t->data = g->base + g->data_offset + t->offset;
    }
    return TLM_OK;
}

tlm_status io_gguf_open_memory(const void *data, size_t size, const char *name, io_gguf **out) {
    *out = NULL;
    io_gguf *g = calloc(1, sizeof *g);
    if (!g) return core_err(TLM_ERR_NOMEM, "out of memory");
    g->base = data;
    g->size = size;
    tlm_status s = parse(g, name ? name : "(memory)");
    if (s) {
        io_gguf_close(g);
        return s;
    }
    *out = g;
    return TLM_OK;
}

tlm_status io_gguf_open(const char *path, io_gguf **out) {
    *out = NULL;
    core_mmap m;
    tlm_status s = core_mmap_open(&m, path);
    if (s) return s;
    io_gguf *g = calloc(1, sizeof *g);
    if (!g) {
        core_mmap_close(&m);
        return core_err(TLM_ERR_NOMEM, "out of memory");
    }
    g->map = m;
    g->owns_map = 1;
    g->base = m.data;
    g->size = m.size;
    s = parse(g, path);
    if (s) {
        io_gguf_close(g);
        return s;
    }
    *out = g;
    return TLM_OK;
}

const io_gguf_kv *io_gguf_find(const io_gguf *g, const char *key) {
    if (!g->kv_by_key) return NULL; /* only while parsing */
    int64_t i = find_name(g->kv_by_key, g->n_kv, key);
    return i < 0 ? NULL : &g->kv[i];
}

const io_gguf_tensor *io_gguf_find_tensor(const io_gguf *g, const char *name) {
    if (!g->tensor_by_name) return NULL;
    int64_t i = find_name(g->tensor_by_name, g->n_tensors, name);
    return i < 0 ? NULL : &g->tensors[i];
}

static int is_int(io_gguf_type t) {
    return t == IO_GGUF_U8 || t == IO_GGUF_I8 || t == IO_GGUF_U16 || t == IO_GGUF_I16 ||
           t == IO_GGUF_U32 || t == IO_GGUF_I32 || t == IO_GGUF_U64 || t == IO_GGUF_I64;
}

static int read_int(io_gguf_type t, const uint8_t *p, int64_t *out) {
    switch (t) {
    case IO_GGUF_U8: *out = p[0]; return 1;
    case IO_GGUF_I8: *out = (int8_t)p[0]; return 1;
    case IO_GGUF_U16: {
        uint16_t v;
        memcpy(&v, p, 2);
        *out = v;
        return 1;
    }
    case IO_GGUF_I16: {
        int16_t v;
        memcpy(&v, p, 2);
        *out = v;
        return 1;
    }
    case IO_GGUF_U32: {
        uint32_t v;
        memcpy(&v, p, 4);
        *out = v;
        return 1;
    }
    case IO_GGUF_I32: {
        int32_t v;
        memcpy(&v, p, 4);
        *out = v;
        return 1;
    }
    case IO_GGUF_U64: {
        uint64_t v;
        memcpy(&v, p, 8);
        if (v > INT64_MAX) return 0;
        *out = (int64_t)v;
        return 1;
    }
    case IO_GGUF_I64: {
        int64_t v;
        memcpy(&v, p, 8);
        *out = v;
        return 1;
    }
    default: return 0;
    }
}

static int read_float(io_gguf_type t, const uint8_t *p, double *out) {
    if (t == IO_GGUF_F32) {
        float v;
        memcpy(&v, p, 4);
        *out = v;
        return 1;
    }
    if (t == IO_GGUF_F64) {
        memcpy(out, p, 8);
        return 1;
    }
    return 0;
}

static tlm_status lookup(const io_gguf *g, const char *key, const io_gguf_kv **kv) {
    *kv = io_gguf_find(g, key);
    return *kv ? TLM_OK : core_err(TLM_ERR_RANGE, "GGUF key '%s' is missing", key);
}

static tlm_status wrong_type(const io_gguf_kv *kv, const char *want) {
    return core_err(TLM_ERR_FORMAT, "GGUF key '%s' is %s%s%s, expected %s", kv->key,
                    io_gguf_type_name(kv->type), kv->type == IO_GGUF_ARRAY ? " of " : "",
                    kv->type == IO_GGUF_ARRAY ? io_gguf_type_name(kv->elem_type) : "", want);
}

tlm_status io_gguf_get_int(const io_gguf *g, const char *key, int64_t *out) {
    const io_gguf_kv *kv;
    tlm_status s = lookup(g, key, &kv);
    if (s) return s;
    return read_int(kv->type, kv->data, out) ? TLM_OK : wrong_type(kv, "an integer");
}

tlm_status io_gguf_get_float(const io_gguf *g, const char *key, double *out) {
    const io_gguf_kv *kv;
    tlm_status s = lookup(g, key, &kv);
    if (s) return s;
    return read_float(kv->type, kv->data, out) ? TLM_OK : wrong_type(kv, "a float");
}

tlm_status io_gguf_get_bool(const io_gguf *g, const char *key, int *out) {
    const io_gguf_kv *kv;
    tlm_status s = lookup(g, key, &kv);
    if (s) return s;
    if (kv->type != IO_GGUF_BOOL) return wrong_type(kv, "a bool");
    *out = kv->data[0];
    return TLM_OK;
}

tlm_status io_gguf_get_str(const io_gguf *g, const char *key, const char **str, size_t *len) {
    const io_gguf_kv *kv;
    tlm_status s = lookup(g, key, &kv);
    if (s) return s;
    if (kv->type != IO_GGUF_STRING) return wrong_type(kv, "a string");
    *str = (const char *)kv->data;
    *len = (size_t)kv->len;
    return TLM_OK;
}

tlm_status io_gguf_get_array(const io_gguf *g, const char *key, io_gguf_type elem,
                             const io_gguf_kv **out) {
    const io_gguf_kv *kv;
    tlm_status s = lookup(g, key, &kv);
    if (s) return s;
    int ok = kv->type == IO_GGUF_ARRAY;
    if (ok && elem == IO_GGUF_I64)
        ok = is_int(kv->elem_type);
    else if (ok && elem == IO_GGUF_F64)
        ok = kv->elem_type == IO_GGUF_F32 || kv->elem_type == IO_GGUF_F64;
    else if (ok)
        ok = kv->elem_type == elem;
    if (!ok) {
        char want[48];
        snprintf(want, sizeof want, "an array of %s",
                 elem == IO_GGUF_I64   ? "integers"
                 : elem == IO_GGUF_F64 ? "floats"
                                       : io_gguf_type_name(elem));
        return wrong_type(kv, want);
    }
    *out = kv;
    return TLM_OK;
}

static tlm_status arr_check(const io_gguf_kv *kv, uint64_t i) {
    if (kv->type != IO_GGUF_ARRAY || i >= kv->len)
        return core_err(TLM_ERR_RANGE, "GGUF array '%s': index %llu out of range (%llu elements)",
                        kv->key, (unsigned long long)i, (unsigned long long)kv->len);
    return TLM_OK;
}

tlm_status io_gguf_arr_int(const io_gguf_kv *kv, uint64_t i, int64_t *out) {
    tlm_status s = arr_check(kv, i);
    if (s) return s;
    size_t es = scalar_size(kv->elem_type);
    if (!es || !read_int(kv->elem_type, kv->data + i * es, out))
        return wrong_type(kv, "an array of integers");
    return TLM_OK;
}

tlm_status io_gguf_arr_float(const io_gguf_kv *kv, uint64_t i, double *out) {
    tlm_status s = arr_check(kv, i);
    if (s) return s;
    size_t es = scalar_size(kv->elem_type);
    if (!es || !read_float(kv->elem_type, kv->data + i * es, out))
        return wrong_type(kv, "an array of floats");
    return TLM_OK;
}

tlm_status io_gguf_arr_str(const io_gguf_kv *kv, uint64_t i, const char **str, size_t *len) {
    tlm_status s = arr_check(kv, i);
    if (s) return s;
    if (kv->elem_type != IO_GGUF_STRING || !kv->strs) return wrong_type(kv, "an array of strings");
    *str = (const char *)kv->strs[i];
    *len = (size_t)kv->str_lens[i];
    return TLM_OK;
}
