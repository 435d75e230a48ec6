/* safetensors: an 8-byte little-endian header length, a JSON header naming each tensor's dtype,
 * shape and byte range, then the raw data. Every field is validated against the file before use. */
#ifndef TLM_SAFETENSORS_H
#define TLM_SAFETENSORS_H

#include <cjson/cJSON.h>

#include "core/core.h"
#include "core/dtype.h"

#define ST_MAX_DIMS 8

typedef struct {
    char *name;
    tlm_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    size_t numel;
    size_t begin, end; /* byte range inside the data section */
} io_st_tensor;

typedef struct {
    const char *name;
    int i; /* index into tensors */
} io_st_name;

typedef struct {
    core_mmap map;
    io_st_tensor *tensors;
    int n;
    io_st_name *by_name; /* tensors sorted by name: io_st_find is a binary search */
    cJSON *metadata;     /* the __metadata__ object, or NULL */
    const uint8_t *data;
    size_t data_len;
} io_st_file;

/* Opens and validates a file: every entry's dtype, shape and byte range, no two tensors
 * overlapping, no name twice. */
tlm_status io_st_open(io_st_file *f, const char *path);
void io_st_close(io_st_file *f);
const io_st_tensor *io_st_find(const io_st_file *f, const char *name);
/* A string value from __metadata__, or NULL. */
const char *io_st_meta(const io_st_file *f, const char *key);
/* Converts a float tensor (F32, F16, BF16, F64) into n floats; n must equal its element count. */
tlm_status io_st_read_f32(const io_st_file *f, const io_st_tensor *t, float *dst, size_t n);
/* Reads an integer tensor (I32, I64) into n int32 values. */
tlm_status io_st_read_i32(const io_st_file *f, const io_st_tensor *t, int32_t *dst, size_t n);

typedef struct {
    const char *name;
    tlm_dtype dtype; /* of the file; data is float32 when dtype is F32/F16/BF16 and converted */
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data; /* float* for float dtypes, int32_t* for I32 */
} io_st_out_tensor;

/* Writes tensors (in the given order) and string metadata pairs (keys[i] -> values[i]) atomically.
 */
tlm_status io_st_write(const char *path, const io_st_out_tensor *t, int n, const char *const *keys,
                       const char *const *values, int n_meta);

#endif
