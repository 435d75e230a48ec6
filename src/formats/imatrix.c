/* Importance matrices as llama.cpp's llama-imatrix writes them, read as llama-quantize reads them
 * (common/imatrix-loader.cpp and tools/quantize): per weight tensor, the squared activations that
 * met each of its input columns, summed over the calibration tokens, and how many tokens that
 * was. Two layouts:
 *   GGUF (llama-imatrix's default): tensors "<weight>.in_sum2" (F32, one per column, times the
 *     experts) and "<weight>.counts" (F32, one per expert), keys imatrix.datasets (strings),
 *     imatrix.chunk_count and imatrix.chunk_size (u32);
 *   legacy .dat: i32 entries, then per entry i32 name length, name, i32 ncall, i32 nval, nval
 *     floats (the mean times ncall); optionally i32 chunk count, i32 length, dataset name.
 * The quantizers take the mean: sums / count (a column group with no tokens weighs 1). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/formats.h"
#include "io/gguf.h"
#include "io/gguf_writer.h"
#include "tlm.h"

typedef struct {
    char *name;
    float *w; /* the means the quantizers take */
    size_t n;
    float *sums; /* as stored (GGUF layout: raw sums) */
    float *counts;
    size_t n_counts;
    int64_t tokens; /* collected here: counted exactly, stored as llama-imatrix does (F32) */
} im_entry;

static char *dup_n(const char *s, size_t n);

struct tlm_imatrix {
    im_entry *e;
    int n, cap;
    char *path;
    char **ds; /* the datasets named, in order */
    int n_ds;
    int chunks, chunk_size, legacy;
};

static int add_dataset(tlm_imatrix *im, const char *s, size_t n) {
    char **d = realloc(im->ds, sizeof *d * (size_t)(im->n_ds + 1));
    if (!d) return 0;
    im->ds = d;
    if (!(d[im->n_ds] = dup_n(s, n))) return 0;
    im->n_ds++;
    return 1;
}

static char *dup_n(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

static void entry_free(im_entry *e) {
    free(e->name);
    free(e->w);
    free(e->sums);
    free(e->counts);
}

void tlm_imatrix_free(tlm_imatrix *im) {
    if (!im) return;
    for (int i = 0; i < im->n; i++) entry_free(&im->e[i]);
    free(im->e);
    free(im->path);
    for (int i = 0; i < im->n_ds; i++) free(im->ds[i]);
    free(im->ds);
    free(im);
}

static im_entry *add_entry(tlm_imatrix *im, const char *name, size_t len) {
    for (int i = 0; i < im->n; i++)
        if (strlen(im->e[i].name) == len && !memcmp(im->e[i].name, name, len))
            return NULL; /* a name twice: the caller reports it */
    if (im->n == im->cap) {
        int cap = im->cap ? 2 * im->cap : 64;
        im_entry *e = realloc(im->e, sizeof *e * (size_t)cap);
        if (!e) return NULL;
        im->e = e;
        im->cap = cap;
    }
    im_entry *e = &im->e[im->n];
    memset(e, 0, sizeof *e);
    e->name = dup_n(name, len);
    if (!e->name) return NULL;
    im->n++;
    return e;
}

static im_entry *find_entry(const tlm_imatrix *im, const char *name) {
    for (int i = 0; im && i < im->n; i++)
        if (!strcmp(im->e[i].name, name)) return &im->e[i];
    return NULL;
}

static tlm_status check_finite(const tlm_imatrix *im, const char *path) {
    for (int i = 0; i < im->n; i++)
        for (size_t j = 0; j < im->e[i].n; j++)
            if (!isfinite(im->e[i].w[j]))
                return core_err(TLM_ERR_FORMAT, "%s: entry '%s' holds a non-finite value (%g)",
                                path, im->e[i].name, (double)im->e[i].w[j]);
    return TLM_OK;
}

static tlm_status load_gguf(io_gguf *g, const char *path, tlm_imatrix *im) {
    const io_gguf_kv *ds = io_gguf_find(g, "imatrix.datasets");
    int64_t v;
    int has_count = !io_gguf_get_int(g, "imatrix.chunk_count", &v);
    im->chunks = has_count ? (int)v : 0;
    int has_size = !io_gguf_get_int(g, "imatrix.chunk_size", &v);
    im->chunk_size = has_size ? (int)v : 0;
    if (!ds || !has_count || !has_size)
        return core_err(TLM_ERR_FORMAT,
                        "%s: missing imatrix metadata (imatrix.datasets, imatrix.chunk_count, "
                        "imatrix.chunk_size), as llama-quantize requires",
                        path);
    if (ds->type == IO_GGUF_ARRAY && ds->elem_type == IO_GGUF_STRING)
        for (uint64_t i = 0; i < ds->len; i++)
            if (!add_dataset(im, (const char *)ds->strs[i], ds->str_lens[i]))
                return core_err(TLM_ERR_NOMEM, "out of memory");
    static const char sum_suf[] = ".in_sum2", cnt_suf[] = ".counts";
    for (uint64_t t = 0; t < g->n_tensors; t++) {
        const io_gguf_tensor *s = &g->tensors[t];
        size_t len = strlen(s->name);
        if (len <= strlen(sum_suf) || strcmp(s->name + len - strlen(sum_suf), sum_suf)) continue;
        size_t base = len - strlen(sum_suf);
        char *cname = malloc(base + sizeof cnt_suf);
        if (!cname) return core_err(TLM_ERR_NOMEM, "out of memory");
        memcpy(cname, s->name, base);
        memcpy(cname + base, cnt_suf, sizeof cnt_suf);
        const io_gguf_tensor *c = io_gguf_find_tensor(g, cname);
        free(cname);
        if (!c)
            return core_err(TLM_ERR_FORMAT, "%s: '%s' has no matching counts tensor", path,
                            s->name);
        if (s->type != 0 || c->type != 0 || !s->data || !c->data)
            return core_err(TLM_ERR_FORMAT, "%s: sums and counts of '%.*s' must be F32", path,
                            (int)base, s->name);
        size_t nval = (size_t)s->n_elements, ncnt = (size_t)c->n_elements;
        if (!nval || !ncnt || nval % ncnt)
            return core_err(TLM_ERR_FORMAT,
                            "%s: '%.*s' has %zu sums for %zu counts (a whole number of columns per "
                            "count expected)",
                            path, (int)base, s->name, nval, ncnt);
        im_entry *e = add_entry(im, s->name, base);
        if (!e) return core_err(TLM_ERR_FORMAT, "%s: entry '%.*s' twice", path, (int)base, s->name);
        e->n = nval;
        e->n_counts = ncnt;
        e->w = malloc(sizeof(float) * nval);
        e->sums = malloc(sizeof(float) * nval);
        e->counts = malloc(sizeof(float) * ncnt);
        if (!e->w || !e->sums || !e->counts) return core_err(TLM_ERR_NOMEM, "out of memory");
        memcpy(e->sums, s->data, sizeof(float) * nval);
        memcpy(e->counts, c->data, sizeof(float) * ncnt);
        size_t ne0 = nval / ncnt;
        for (size_t j = 0; j < ncnt; j++) {
            /* llama.cpp rounds the stored count to an integer, then divides by it as a float */
            float count = (float)lroundf(e->counts[j]);
            for (size_t i = 0; i < ne0; i++)
                e->w[j * ne0 + i] = count > 0.0f ? e->sums[j * ne0 + i] / count : 1.0f;
        }
    }
    if (!im->n) return core_err(TLM_ERR_FORMAT, "%s: no imatrix entries (*.in_sum2)", path);
    return TLM_OK;
}

/* Reads exactly n bytes at *pos of buf[0, size). */
static int take(const uint8_t *buf, size_t size, size_t *pos, void *out, size_t n) {
    if (n > size - *pos) return 0;
    memcpy(out, buf + *pos, n);
    *pos += n;
    return 1;
}

static tlm_status load_legacy(const uint8_t *buf, size_t size, const char *path, tlm_imatrix *im) {
    size_t pos = 0;
    int32_t n_entries;
    if (!take(buf, size, &pos, &n_entries, 4) || n_entries < 1)
        return core_err(TLM_ERR_FORMAT,
                        "%s: not an importance matrix (GGUF or llama.cpp's legacy "
                        ".dat layout): no entries",
                        path);
    for (int32_t i = 0; i < n_entries; i++) {
        int32_t len, ncall, nval;
        if (!take(buf, size, &pos, &len, 4) || len < 1 || (size_t)len > size - pos)
            return core_err(TLM_ERR_FORMAT, "%s: entry %d: bad name length", path, i + 1);
        const char *name = (const char *)buf + pos;
        pos += (size_t)len;
        if (!take(buf, size, &pos, &ncall, 4) || !take(buf, size, &pos, &nval, 4) || nval < 1 ||
            (size_t)nval > (size - pos) / 4)
            return core_err(TLM_ERR_FORMAT, "%s: entry %d ('%.*s'): bad value count", path, i + 1,
                            len, name);
        im_entry *e = add_entry(im, name, (size_t)len);
        if (!e)
            return core_err(TLM_ERR_FORMAT, "%s: entry '%.*s' twice (or out of memory)", path, len,
                            name);
        e->n = (size_t)nval;
        e->w = malloc(sizeof(float) * e->n);
        e->sums = malloc(sizeof(float) * e->n);
        e->counts = malloc(sizeof(float));
        if (!e->w || !e->sums || !e->counts) return core_err(TLM_ERR_NOMEM, "out of memory");
        take(buf, size, &pos, e->sums, 4 * e->n);
        e->n_counts = 1;
        e->counts[0] = (float)ncall;
        for (size_t j = 0; j < e->n; j++) e->w[j] = ncall > 0 ? e->sums[j] / ncall : e->sums[j];
    }
    int32_t chunks, len;
    if (take(buf, size, &pos, &chunks, 4)) {
        im->chunks = chunks;
        if (take(buf, size, &pos, &len, 4) && len > 0 && (size_t)len <= size - pos)
            if (!add_dataset(im, (const char *)buf + pos, (size_t)len))
                return core_err(TLM_ERR_NOMEM, "out of memory");
    }
    im->legacy = 1;
    return TLM_OK;
}

tlm_status tlm_imatrix_load(const char *path, tlm_imatrix **out) {
    *out = NULL;
    tlm_imatrix *im = calloc(1, sizeof *im);
    if (!im || !(im->path = dup_n(path, strlen(path)))) {
        free(im);
        return core_err(TLM_ERR_NOMEM, "out of memory");
    }
    core_mmap map;
    tlm_status s = core_mmap_open(&map, path);
    if (s) {
        tlm_imatrix_free(im);
        return s;
    }
    const uint8_t *buf = map.data;
    if (map.size >= 4 && !memcmp(buf, "GGUF", 4)) {
        io_gguf *g;
        s = io_gguf_open_memory(map.data, map.size, path, &g);
        if (!s) {
            s = load_gguf(g, path, im);
            io_gguf_close(g);
        }
    } else {
        s = load_legacy(buf, map.size, path, im);
    }
    core_mmap_close(&map);
    if (!s) s = check_finite(im, path);
    if (s) {
        tlm_imatrix_free(im);
        return s;
    }
    *out = im;
    return TLM_OK;
}

const float *tlm_imatrix_find(const tlm_imatrix *im, const char *name, size_t *n) {
    const im_entry *e = find_entry(im, name);
    if (n) *n = e ? e->n : 0;
    return e ? e->w : NULL;
}

/* llama-imatrix's process_tensor_name: the part after "blk" and the one before "weight". */
static void split_name(const char *name, char *layer, size_t ln, char *tensor, size_t tn) {
    snprintf(layer, ln, "-");
    snprintf(tensor, tn, "%s", name);
    const char *blk = strstr(name, "blk.");
    if (blk && (blk == name || blk[-1] == '.')) {
        const char *a = blk + 4, *b = strchr(a, '.');
        snprintf(layer, ln, "%.*s", (int)(b ? b - a : (ptrdiff_t)strlen(a)), a);
    }
    for (const char *w = strstr(name, ".weight"); w; w = strstr(w + 1, ".weight")) {
        if (w[7] && w[7] != '.') continue;
        const char *a = w;
        while (a > name && a[-1] != '.') a--;
        if (a < w) snprintf(tensor, tn, "%.*s", (int)(w - a), a);
        break;
    }
}

static int stat_before(const tlm_imatrix_stat *a, const tlm_imatrix_stat *b) {
    int c = strcmp(a->tensor, b->tensor);
    return c < 0 || (c == 0 && a->sum > b->sum);
}

tlm_status tlm_imatrix_statistics(const tlm_imatrix *im, int chunk_size, tlm_imatrix_stat **out,
                                  int *n) {
    *out = NULL;
    *n = 0;
    tlm_imatrix_stat *st = calloc((size_t)im->n + 1, sizeof *st);
    float *act = NULL;
    size_t cap = 0;
    int ns = 0;
    if (!st) return core_err(TLM_ERR_NOMEM, "out of memory");
    /* the values as llama-imatrix loads them: GGUF's raw sums, a legacy file's means times its
     * call count times the chunk size */
    float k = im->legacy ? (float)chunk_size : 1.0f;
    for (int i = 0; i < im->n; i++) {
        const im_entry *e = &im->e[i];
        if (!e->n_counts || e->n % e->n_counts) continue;
        size_t row = e->n / e->n_counts, na = 0;
        if (e->n > cap) {
            float *p = realloc(act, sizeof *p * e->n);
            if (!p) {
                free(act);
                free(st);
                return core_err(TLM_ERR_NOMEM, "out of memory");
            }
            act = p, cap = e->n;
        }
        for (size_t m = 0; m < e->n_counts; m++) {
            /* llama-imatrix keeps counts as integers (a count the file cannot have had, not
             * finite or past int64, counts as none here) */
            float c = e->counts[m] * k;
            int64_t cnt = c > -9.2e18f && c < 9.2e18f ? (int64_t)c : 0;
            if (!cnt) continue;
            for (size_t j = 0; j < row; j++) act[na++] = e->sums[m * row + j] * k / (float)cnt;
        }
        if (!na) continue;
        tlm_imatrix_stat *t = &st[ns++];
        snprintf(t->name, sizeof t->name, "%s", e->name);
        split_name(e->name, t->layer, sizeof t->layer, t->tensor, sizeof t->tensor);
        float total = 0, sq = 0, mx = act[0], mn = act[0];
        for (size_t j = 0; j < na; j++) {
            total += act[j];
            sq += act[j] * act[j];
            if (act[j] > mx) mx = act[j];
            if (act[j] < mn) mn = act[j];
        }
        float mean = total / (float)na, var = sq / (float)na - mean * mean;
        float dev = sqrtf(var > 0.0f ? var : 0.0f);
        size_t inactive = 0, above = 0;
        float entropy = 0;
        for (size_t j = 0; j < na; j++) {
            inactive += fabsf(act[j]) <= 1e-5f;
            if (total > 0) {
                float p = act[j] / total;
                if (p > 0) entropy -= p * log2f(p);
            }
            if (dev > 0.0f && (act[j] - mean) / dev > 1) above++;
        }
        t->elements = (int)na;
        t->sum = total, t->min = mn, t->max = mx, t->mean = mean, t->stddev = dev;
        t->active = 1 - (float)inactive / (float)na;
        t->entropy = entropy;
        t->entropy_norm = (float)(100.0f * (entropy / log2((double)na)));
        t->zd = (float)above / (float)na;
    }
    free(act);
    /* the same tensor one layer down: its raw values' cosine */
    for (int i = 0; i < ns; i++) {
        const char *blk = strstr(st[i].name, "blk.");
        char *end;
        long l = blk ? strtol(blk + 4, &end, 10) : -1;
        if (!blk || end == blk + 4 || *end != '.') continue;
        char prev[160];
        snprintf(prev, sizeof prev, "%.*s%ld%s", (int)(blk + 4 - st[i].name), st[i].name, l - 1,
                 end);
        const im_entry *a = find_entry(im, st[i].name), *b = find_entry(im, prev);
        if (!b || b->n != a->n) continue;
        float dp = 0, ma = 0, mb = 0;
        for (size_t j = 0; j < a->n; j++) dp += a->sums[j] * k * (b->sums[j] * k);
        for (size_t j = 0; j < a->n; j++) ma += a->sums[j] * k * (a->sums[j] * k);
        for (size_t j = 0; j < a->n; j++) mb += b->sums[j] * k * (b->sums[j] * k);
        st[i].cossim = dp / (sqrtf(ma) * sqrtf(mb));
    }
    /* insertion sort: a few hundred entries */
    for (int i = 1; i < ns; i++) {
        tlm_imatrix_stat t = st[i];
        int j = i;
        for (; j > 0 && stat_before(&t, &st[j - 1]); j--) st[j] = st[j - 1];
        st[j] = t;
    }
    *out = st;
    *n = ns;
    return TLM_OK;
}

void tlm_imatrix_filter(tlm_imatrix *im, const char *const *names, int n, int keep) {
    if (!im) return;
    int j = 0;
    for (int i = 0; i < im->n; i++) {
        int hit = 0;
        for (int k = 0; k < n && !hit; k++) hit = strstr(im->e[i].name, names[k]) != NULL;
        if (hit == !!keep)
            im->e[j++] = im->e[i];
        else
            entry_free(&im->e[i]);
    }
    im->n = j;
}

int tlm_imatrix_entries(const tlm_imatrix *im) { return im ? im->n : 0; }
int tlm_imatrix_chunks(const tlm_imatrix *im) { return im ? im->chunks : 0; }
const char *tlm_imatrix_dataset(const tlm_imatrix *im) { return im && im->n_ds ? im->ds[0] : NULL; }
const char *tlm_imatrix_path(const tlm_imatrix *im) { return im ? im->path : NULL; }

/* ---- collecting and writing (tlm imatrix) ---------------------------------------------------- */

/* What the quantizers take of a collected entry, as llama-quantize computes it from the file
 * (no tokens yet: 1, as for a column group no token reached). */
static void means(im_entry *e) {
    for (size_t j = 0; j < e->n; j++) e->w[j] = e->tokens > 0 ? e->sums[j] / e->counts[0] : 1.0f;
}

tlm_status tlm_imatrix_new(tlm_imatrix **out) {
    *out = calloc(1, sizeof **out);
    return *out ? TLM_OK : core_err(TLM_ERR_NOMEM, "out of memory");
}

/* The entry to collect into for name, made (empty) where it is new. */
static tlm_status collect_entry(tlm_imatrix *im, const char *name, size_t n, im_entry **out) {
    im_entry *e = find_entry(im, name);
    if (!e) {
        if (!(e = add_entry(im, name, strlen(name))))
            return core_err(TLM_ERR_NOMEM, "out of memory");
        e->n = n;
        e->n_counts = 1;
        e->w = calloc(n, sizeof(float));
        e->sums = calloc(n, sizeof(float));
        e->counts = calloc(1, sizeof(float));
        if (!e->w || !e->sums || !e->counts) return core_err(TLM_ERR_NOMEM, "out of memory");
    }
    if (e->n != n || e->n_counts != 1)
        return core_err(TLM_ERR_ARG, "imatrix entry '%s' has %zu columns, not %zu", name, e->n, n);
    if (!e->tokens && e->counts[0] > 0) e->tokens = (int64_t)llroundf(e->counts[0]); /* loaded */
    *out = e;
    return TLM_OK;
}

tlm_status tlm_imatrix_accumulate(tlm_imatrix *im, const char *name, const float *sum2, size_t n,
                                  int64_t tokens) {
    im_entry *e = NULL;
    tlm_status s = collect_entry(im, name, n, &e);
    if (s) return s;
    for (size_t j = 0; j < n; j++) e->sums[j] += sum2[j];
    e->tokens += tokens;
    e->counts[0] = (float)e->tokens;
    means(e);
    return TLM_OK;
}

static int by_name(const void *a, const void *b) {
    return strcmp((*(const im_entry *const *)a)->name, (*(const im_entry *const *)b)->name);
}

tlm_status tlm_imatrix_save(const tlm_imatrix *im, const char *path, const char *dataset,
                            int chunks, int chunk_size) {
    if (!im->n) return core_err(TLM_ERR_ARG, "the importance matrix has no entries");
    const im_entry **order = malloc(sizeof *order * (size_t)im->n);
    if (!order) return core_err(TLM_ERR_NOMEM, "out of memory");
    for (int i = 0; i < im->n; i++) order[i] = &im->e[i];
    qsort(order, (size_t)im->n, sizeof *order, by_name); /* llama-imatrix's order */
    io_gguf_writer w;
    io_gguf_writer_init(&w, IO_GGUF_DEFAULT_ALIGNMENT);
    io_gguf_write_str(&w, "general.type", "imatrix");
    /* the merged matrices' datasets, then this text's, as llama-imatrix lists them */
    io_gguf_write_array(&w, "imatrix.datasets", IO_GGUF_STRING,
                        (uint64_t)im->n_ds + (dataset ? 1 : 0));
    for (int i = 0; i < im->n_ds; i++) io_gguf_write_elem_str(&w, im->ds[i], strlen(im->ds[i]));
    if (dataset) io_gguf_write_elem_str(&w, dataset, strlen(dataset));
    io_gguf_write_u32(&w, "imatrix.chunk_count", (uint32_t)chunks);
    io_gguf_write_u32(&w, "imatrix.chunk_size", (uint32_t)chunk_size);
    for (int i = 0; i < im->n; i++) {
        const im_entry *e = order[i];
        char nm[512];
        uint64_t dims[2] = {e->n / e->n_counts, e->n_counts}, cdims[2] = {1, e->n_counts};
        /* [columns, experts] and [1, experts], trailing dimensions of 1 left out as ggml does */
        uint32_t nd = e->n_counts > 1 ? 2 : 1;
        snprintf(nm, sizeof nm, "%s.in_sum2", e->name);
        io_gguf_write_tensor(&w, nm, nd, dims, 0, sizeof(float) * e->n);
        snprintf(nm, sizeof nm, "%s.counts", e->name);
        io_gguf_write_tensor(&w, nm, nd, cdims, 0, sizeof(float) * e->n_counts);
    }
    uint8_t *head = NULL;
    size_t head_len = 0;
    tlm_status s = io_gguf_writer_header(&w, &head, &head_len);
    core_atomic_file a;
    if (!s) s = core_atomic_open(&a, path);
    if (!s) {
        static const uint8_t zeros[IO_GGUF_DEFAULT_ALIGNMENT];
        s = core_atomic_write(&a, head, head_len);
        for (int i = 0; i < im->n && !s; i++) {
            const im_entry *e = order[i];
            s = core_atomic_write(&a, e->sums, sizeof(float) * e->n);
            size_t pad = io_gguf_writer_pad(&w, sizeof(float) * e->n);
            if (!s && pad) s = core_atomic_write(&a, zeros, pad);
            if (!s) s = core_atomic_write(&a, e->counts, sizeof(float) * e->n_counts);
            pad = io_gguf_writer_pad(&w, sizeof(float) * e->n_counts);
            if (!s && pad) s = core_atomic_write(&a, zeros, pad);
        }
        if (s)
            core_atomic_abort(&a);
        else
            s = core_atomic_commit(&a);
    }
    free(head);
    free(order);
    io_gguf_writer_free(&w);
    return s ? core_err_context(s, "writing %s", path) : TLM_OK;
}

tlm_status tlm_imatrix_add_rows(tlm_imatrix *im, const char *name, const float *x, size_t rows,
                                size_t cols, size_t ld) {
    if (im->legacy)
        return core_err(TLM_ERR_ARG,
                        "%s holds means (the legacy layout): collect into a new matrix",
                        im->path ? im->path : "the matrix");
    im_entry *e = NULL;
    tlm_status s = collect_entry(im, name, cols, &e);
    if (s) return s;
    /* a running sum row by row, as llama-imatrix adds each matrix product's rows */
    for (size_t r = 0; r < rows; r++) {
        const float *xr = x + r * ld;
        for (size_t j = 0; j < cols; j++) e->sums[j] += xr[j] * xr[j];
    }
    e->tokens += (int64_t)rows;
    e->counts[0] = (float)e->tokens;
    means(e);
    return TLM_OK;
}

tlm_status tlm_imatrix_merge(tlm_imatrix *dst, const tlm_imatrix *src, int chunk_size) {
    if (dst->legacy)
        return core_err(TLM_ERR_ARG, "%s holds means (the legacy layout): merge into a new matrix",
                        dst->path ? dst->path : "the matrix");
    for (int i = 0; i < src->n; i++) {
        const im_entry *e = &src->e[i];
        if (e->n_counts != 1)
            return core_err(TLM_ERR_UNSUPPORTED,
                            "imatrix entry '%s' has per-expert counts, which tlm does not merge",
                            e->name);
        /* llama-imatrix's reading for more data: GGUF's raw sums and counts as they are, the
         * legacy layout's means times its call count times the chunk size */
        float k = src->legacy ? (float)chunk_size : 1.0f;
        int64_t tokens = (int64_t)llroundf(e->counts[0] * k);
        float *raw = malloc(sizeof(float) * e->n);
        if (!raw) return core_err(TLM_ERR_NOMEM, "out of memory");
        for (size_t j = 0; j < e->n; j++) raw[j] = e->sums[j] * k;
        tlm_status s = tlm_imatrix_accumulate(dst, e->name, raw, e->n, tokens);
        free(raw);
        if (s) return s;
    }
    for (int i = 0; i < src->n_ds; i++)
        if (!add_dataset(dst, src->ds[i], strlen(src->ds[i])))
            return core_err(TLM_ERR_NOMEM, "out of memory");
    return TLM_OK;
}

int64_t tlm_imatrix_tokens(const tlm_imatrix *im) {
    int64_t most = 0;
    for (int i = 0; im && i < im->n; i++) {
        int64_t t = im->e[i].tokens ? im->e[i].tokens : (int64_t)llroundf(im->e[i].counts[0]);
        if (t > most) most = t;
    }
    return most;
}

tlm_status tlm_imatrix_save_legacy(const tlm_imatrix *im, const char *path, const char *dataset,
                                   int chunks, int chunk_size) {
    if (!im->n) return core_err(TLM_ERR_ARG, "the importance matrix has no entries");
    if (chunk_size < 1) return core_err(TLM_ERR_ARG, "chunk size %d", chunk_size);
    const im_entry **order = malloc(sizeof *order * (size_t)im->n);
    size_t cap = 64;
    for (int i = 0; i < im->n; i++) cap += 16 + strlen(im->e[i].name) + 4 * im->e[i].n;
    cap += dataset ? strlen(dataset) : im->n_ds ? strlen(im->ds[im->n_ds - 1]) : 0;
    uint8_t *buf = malloc(cap);
    if (!order || !buf) {
        free(order);
        free(buf);
        return core_err(TLM_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < im->n; i++) order[i] = &im->e[i];
    qsort(order, (size_t)im->n, sizeof *order, by_name);
    size_t pos = 0;
#define PUT(p, n) (memcpy(buf + pos, (p), (n)), pos += (n))
    int32_t v = im->n;
    PUT(&v, 4);
    for (int i = 0; i < im->n; i++) {
        const im_entry *e = order[i];
        int64_t tokens = e->tokens ? e->tokens : (int64_t)llroundf(e->counts[0]);
        /* llama-imatrix: the call count rounded up, so that a short last chunk is not zero */
        int32_t len = (int32_t)strlen(e->name),
                ncall = (int32_t)((tokens + chunk_size - 1) / chunk_size), nval = (int32_t)e->n;
        PUT(&len, 4);
        PUT(e->name, (size_t)len);
        PUT(&ncall, 4);
        PUT(&nval, 4);
        for (size_t j = 0; j < e->n; j++) {
            float count = e->counts[0], value = e->sums[j];
            if (count == 0.0f) value = count = 1.0f; /* "store 1 for partial data" */
            float x = (value / count) * (float)ncall;
            PUT(&x, 4);
        }
    }
    v = chunks;
    PUT(&v, 4);
    const char *d = dataset ? dataset : im->n_ds ? im->ds[im->n_ds - 1] : "";
    v = (int32_t)strlen(d);
    PUT(&v, 4);
    PUT(d, strlen(d));
#undef PUT
    tlm_status s = core_write_file_atomic(path, buf, pos);
    free(buf);
    free(order);
    return s ? core_err_context(s, "writing %s", path) : TLM_OK;
}
