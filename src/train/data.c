/* Token files: a 32-byte header ("TLMTOKS1", u32 version, u32 bytes per token, u64 count,
 * u64 vocab size; little-endian) and the ids as uint16 when the vocabulary fits, else uint32.
 * Training memory-maps them, and llm.c's shards, as one stream; the windows of a step are a hash
 * of (seed, step, index). */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

#define TOK_MAGIC "TLMTOKS1"
#define TOK_HEADER 32

/* One mapped file of tokens. */
typedef struct {
    core_mmap map;
    const uint8_t *tokens;
    int width;
    size_t n;
} tok_file;

/* The files as one stream: the training files, then the validation files (or the tail of the
 * stream when a fraction is held out). Validation is [n_train, n). */
struct tlm_dataset {
    tok_file *files;
    size_t *start; /* [n_files + 1]: where each file begins in the stream */
    int n_files;
    size_t n, n_train;
    int32_t vocab_size; /* largest vocabulary a header names; 0: none does (llm.c shards) */
};

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

tlm_status tlm_dataset_write_tokens(const char *path, const int32_t *ids, size_t n,
                                    int32_t vocab_size) {
    if (vocab_size <= 0) return core_err(TLM_ERR_ARG, "vocab size must be positive");
    int width = vocab_size <= 65536 ? 2 : 4;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab_size)
            return core_err(TLM_ERR_RANGE, "token %d at %zu outside the vocabulary (%d)", ids[i], i,
                            vocab_size);
    uint8_t head[TOK_HEADER] = {0};
    memcpy(head, TOK_MAGIC, 8);
    put_u32(head + 8, 1);
    put_u32(head + 12, (uint32_t)width);
    put_u64(head + 16, n);
    put_u64(head + 24, (uint64_t)vocab_size);
    core_atomic_file a;
    tlm_status s = core_atomic_open(&a, path);
    if (s) return s;
    s = core_atomic_write(&a, head, sizeof head);
    uint8_t buf[8192];
    for (size_t i = 0; i < n && !s;) {
        size_t k = 0;
        for (; i < n && k + 4 <= sizeof buf; i++, k += (size_t)width) {
            uint32_t v = (uint32_t)ids[i];
            buf[k] = (uint8_t)v;
            buf[k + 1] = (uint8_t)(v >> 8);
            if (width == 4) {
                buf[k + 2] = (uint8_t)(v >> 16);
                buf[k + 3] = (uint8_t)(v >> 24);
            }
        }
        s = core_atomic_write(&a, buf, k);
    }
    if (s) {
        core_atomic_abort(&a);
        return s;
    }
    return core_atomic_commit(&a);
}

/* llm.c's shards (dev/data/data_common.py): 256 little-endian int32 (magic, version 1, token
 * count, unused), then the tokens as uint16. */
#define LLMC_MAGIC 20240520
#define LLMC_HEADER (256 * 4)

static tlm_status open_file(const char *path, tok_file *f, int32_t *vocab) {
    tlm_status s = core_mmap_open(&f->map, path);
    if (s) return s;
    const uint8_t *p = f->map.data;
    size_t size = f->map.size, bytes;
    *vocab = 0;
    if (size >= TOK_HEADER && memcmp(p, TOK_MAGIC, 8) == 0) {
        if (get_u32(p + 8) != 1 || (get_u32(p + 12) != 2 && get_u32(p + 12) != 4)) {
            s = core_err(TLM_ERR_FORMAT, "'%s': unsupported token file version or width", path);
        } else {
            f->width = (int)get_u32(p + 12);
            f->n = (size_t)get_u64(p + 16);
            uint64_t vs = get_u64(p + 24);
            if (vs == 0 || vs > INT32_MAX || !core_mul_ok(f->n, (size_t)f->width, &bytes) ||
                bytes != size - TOK_HEADER)
                s = core_err(TLM_ERR_FORMAT, "'%s': header does not match the file size", path);
            *vocab = (int32_t)vs;
            f->tokens = p + TOK_HEADER;
        }
    } else if (size >= 4 && get_u32(p) == LLMC_MAGIC) {
        if (size < LLMC_HEADER) {
            s = core_err(TLM_ERR_FORMAT, "'%s': llm.c shard shorter than its %d-byte header", path,
                         LLMC_HEADER);
        } else if (get_u32(p + 4) != 1) {
            s = core_err(TLM_ERR_FORMAT,
                         "'%s': llm.c shard version %u; only version 1 (uint16 tokens) is known",
                         path, get_u32(p + 4));
        } else {
            f->width = 2;
            f->n = get_u32(p + 8);
            if ((size - LLMC_HEADER) % 2 != 0 || (size - LLMC_HEADER) / 2 != f->n)
                s = core_err(TLM_ERR_FORMAT,
                             "'%s': llm.c shard header says %zu tokens, the file holds %zu bytes "
                             "of tokens (truncated or not a shard)",
                             path, f->n, size - LLMC_HEADER);
            f->tokens = p + LLMC_HEADER;
        }
    } else {
        s = core_err(TLM_ERR_FORMAT, "'%s' is not a tlm token file or an llm.c shard", path);
    }
    if (s) core_mmap_close(&f->map);
    return s;
}

void tlm_dataset_free(tlm_dataset *d) {
    if (!d) return;
    for (int i = 0; i < d->n_files; i++) core_mmap_close(&d->files[i].map);
    free(d->files);
    free(d->start);
    free(d);
}

tlm_status tlm_dataset_load_files(const char *const *train, int n_train, const char *const *val,
                                  int n_val, double val_fraction, tlm_dataset **out) {
    *out = NULL;
    if (n_train < 1 || n_val < 0 || (n_val > 0 && !val))
        return core_err(TLM_ERR_ARG, "a dataset needs at least one training file");
    if (n_val > 0) val_fraction = 0;
    if (!(val_fraction >= 0.0 && val_fraction < 1.0))
        return core_err(TLM_ERR_ARG, "validation fraction %g must be in [0, 1)", val_fraction);
    tlm_dataset *d = calloc(1, sizeof *d);
    int total = n_train + n_val;
    if (d) {
        d->files = calloc((size_t)total, sizeof *d->files);
        d->start = calloc((size_t)total + 1, sizeof *d->start);
    }
    if (!d || !d->files || !d->start) {
        tlm_dataset_free(d);
        return core_err(TLM_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < total; i++) {
        int32_t vocab;
        tlm_status s = open_file(i < n_train ? train[i] : val[i - n_train], &d->files[i], &vocab);
        if (s) {
            tlm_dataset_free(d);
            return s;
        }
        d->n_files++;
        d->vocab_size = vocab > d->vocab_size ? vocab : d->vocab_size;
        d->start[i + 1] = d->start[i] + d->files[i].n;
        if (i + 1 == n_train) d->n_train = d->start[i + 1];
    }
    d->n = d->start[total];
    if (n_val == 0) d->n_train = d->n - (size_t)((double)d->n * val_fraction);
    *out = d;
    return TLM_OK;
}

tlm_status tlm_dataset_load(const char *path, double val_fraction, tlm_dataset **out) {
    return tlm_dataset_load_files(&path, 1, NULL, 0, val_fraction, out);
}

size_t tlm_dataset_size(const tlm_dataset *d, tlm_split split) {
    return split == TLM_SPLIT_TRAIN ? d->n_train : d->n - d->n_train;
}

int32_t tlm_dataset_vocab_size(const tlm_dataset *d) { return d->vocab_size; }

static int32_t token_at(const tlm_dataset *d, size_t i) {
    const tok_file *f = d->files;
    if (d->n_files > 1) {
        /* The file holding token i: the last start at or before it. */
        int lo = 0, hi = d->n_files - 1;
        while (lo < hi) {
            int mid = (lo + hi + 1) / 2;
            if (d->start[mid] <= i)
                lo = mid;
            else
                hi = mid - 1;
        }
        f += lo;
        i -= d->start[lo];
    }
    const uint8_t *p = f->tokens + i * (size_t)f->width;
    return f->width == 2 ? (int32_t)(p[0] | p[1] << 8) : (int32_t)get_u32(p);
}

size_t tlm_dataset_window(const tlm_dataset *d, tlm_split split, uint64_t seed, uint64_t stream,
                          uint64_t index, int T) {
    size_t n = tlm_dataset_size(d, split);
    if (T < 1 || n < (size_t)T + 1) return 0;
    /* Counter-based: any process can draw any window of any step without drawing the others, and
     * 64 bits make the modulo's bias negligible for any corpus. */
    const uint64_t golden = 0x9E3779B97F4A7C15ull; /* keeps zero seeds and counters off 0 */
    uint64_t h = core_mix64(core_mix64(core_mix64(seed + golden) ^ stream) + golden * (index + 1));
    return (size_t)(h % (uint64_t)(n - (size_t)T));
}

tlm_status trn_dataset_windows(const tlm_dataset *d, tlm_split split, uint64_t seed,
                               uint64_t stream, uint64_t first, int B, int T, int32_t *ids,
                               int32_t *targets) {
    size_t lo = split == TLM_SPLIT_TRAIN ? 0 : d->n_train;
    size_t n = tlm_dataset_size(d, split);
    if (n < (size_t)T + 1)
        return core_err(TLM_ERR_ARG, "the %s split has %zu tokens, fewer than a window of %d + 1",
                        split == TLM_SPLIT_TRAIN ? "training" : "validation", n, T);
    for (int b = 0; b < B; b++) {
        size_t start = lo + tlm_dataset_window(d, split, seed, stream, first + (uint64_t)b, T);
        for (int t = 0; t < T; t++) {
            ids[b * T + t] = token_at(d, start + t);
            targets[b * T + t] = token_at(d, start + t + 1);
        }
    }
    return TLM_OK;
}
