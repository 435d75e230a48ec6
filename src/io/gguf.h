/* A general GGUF reader (versions 1-3, little-endian): header, typed metadata, tensor infos.
 * Everything is checked against the file size before use; the file is memory-mapped and values
 * point into it. Used by the tokenizer (vocabularies) and the weight loader. */
#ifndef TLM_GGUF_H
#define TLM_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "core/core.h"

typedef enum {
    IO_GGUF_U8 = 0,
    IO_GGUF_I8 = 1,
    IO_GGUF_U16 = 2,
    IO_GGUF_I16 = 3,
    IO_GGUF_U32 = 4,
    IO_GGUF_I32 = 5,
    IO_GGUF_F32 = 6,
    IO_GGUF_BOOL = 7,
    IO_GGUF_STRING = 8,
    IO_GGUF_ARRAY = 9,
    IO_GGUF_U64 = 10,
    IO_GGUF_I64 = 11,
    IO_GGUF_F64 = 12,
    IO_GGUF_TYPE_COUNT
} io_gguf_type;

#define IO_GGUF_MAX_DIMS 4
#define IO_GGUF_DEFAULT_ALIGNMENT 32
/* Shards of a split model (gguf-split) a loader opens at most. */
#define IO_GGUF_MAX_SPLITS 256

typedef struct {
    char *key; /* NUL-terminated copy */
    io_gguf_type type;
    const uint8_t *data;    /* scalar: the value; string: its bytes; array: its first element */
    uint64_t len;           /* string: bytes; array: element count; scalar: 1 */
    io_gguf_type elem_type; /* arrays */
    const uint8_t **strs;   /* arrays of strings: start of each element's bytes */
    uint64_t *str_lens;     /* arrays of strings: each element's length */
} io_gguf_kv;

typedef struct {
    char *name; /* NUL-terminated copy */
    uint32_t n_dims;
    uint64_t dims[IO_GGUF_MAX_DIMS]; /* innermost first: dims[0] is the row length; unused = 1 */
    uint32_t type;                   /* ggml type */
    uint64_t offset;                 /* from the start of the data section */
    uint64_t n_elements;
    uint64_t n_bytes;    /* 0 when the type is unknown to this reader */
    const uint8_t *data; /* NULL when the type is unknown */
} io_gguf_tensor;

typedef struct {
    const char *name;
    uint64_t i; /* index into kv or tensors */
} io_gguf_name;

typedef struct {
    core_mmap map;
    int owns_map;
    const uint8_t *base;
    size_t size;
    uint32_t version;
    uint64_t n_kv, n_tensors;
    io_gguf_kv *kv;
    io_gguf_tensor *tensors;
    /* kv and tensors by name (sorted, ties in file order): lookups are binary searches, so a
     * loader that looks up every tensor of a file does O(n log n) work, not O(n^2) */
    io_gguf_name *kv_by_key, *tensor_by_name;
    uint64_t alignment;
    uint64_t data_offset; /* start of the data section in the file */
} io_gguf;

tlm_status io_gguf_open(const char *path, io_gguf **out);
/* Parses a buffer that the caller keeps alive (tests of malformed input use this). name is used
 * in error messages. */
tlm_status io_gguf_open_memory(const void *data, size_t size, const char *name, io_gguf **out);
void io_gguf_close(io_gguf *g);

const char *io_gguf_type_name(io_gguf_type t);
/* ggml tensor type: name, elements per block and bytes per block; 0 if unknown. */
int io_ggml_type_info(uint32_t type, const char **name, uint32_t *block_elems,
                      uint32_t *block_bytes);

const io_gguf_kv *io_gguf_find(const io_gguf *g, const char *key);
const io_gguf_tensor *io_gguf_find_tensor(const io_gguf *g, const char *name);

/* Typed lookups: TLM_OK, TLM_ERR_RANGE when the key is absent (message names it), TLM_ERR_FORMAT
 * when it has another type or the value does not fit. Integers accept every integer type. */
tlm_status io_gguf_get_int(const io_gguf *g, const char *key, int64_t *out);
tlm_status io_gguf_get_float(const io_gguf *g, const char *key, double *out);
tlm_status io_gguf_get_bool(const io_gguf *g, const char *key, int *out);
tlm_status io_gguf_get_str(const io_gguf *g, const char *key, const char **s, size_t *len);
/* An array with the given element type (any integer type for IO_GGUF_I64, F32/F64 for
 * IO_GGUF_F64); *kv receives it. */
tlm_status io_gguf_get_array(const io_gguf *g, const char *key, io_gguf_type elem,
                             const io_gguf_kv **kv);

/* Element i of an array (i < kv->len, checked). */
tlm_status io_gguf_arr_int(const io_gguf_kv *kv, uint64_t i, int64_t *out);
tlm_status io_gguf_arr_float(const io_gguf_kv *kv, uint64_t i, double *out);
tlm_status io_gguf_arr_str(const io_gguf_kv *kv, uint64_t i, const char **s, size_t *len);

#endif
