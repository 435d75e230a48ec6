/* Building a GGUF v3 file (the layout io/gguf.h reads): typed metadata, tensor infos, and the
 * data section's aligned layout. Metadata and infos are kept in memory (a vocabulary makes them a
 * few MB at most); the caller writes the header this returns, then each tensor's bytes followed
 * by io_gguf_writer_pad() zero bytes, in the order the tensors were declared.
 *
 * Calls record the first failure (out of memory, or misuse such as an array given the wrong
 * number of elements) and return it from then on, so a caller may issue a run of calls and check
 * the status once; io_gguf_writer_header() reports it too. */
#ifndef TLM_IO_GGUF_WRITER_H
#define TLM_IO_GGUF_WRITER_H

#include <stddef.h>
#include <stdint.h>

#include "core/core.h"
#include "io/gguf.h"

typedef struct {
    uint8_t *p;
    size_t n, cap;
} io_gguf_bytes;

typedef struct {
    io_gguf_bytes kv, infos;
    uint64_t n_kv, n_tensors;
    uint32_t alignment;
    uint64_t data_size;      /* data section so far, each tensor padded to the alignment */
    io_gguf_type array_type; /* element type of the open array */
    uint64_t array_left;     /* elements it still expects */
    tlm_status err;
} io_gguf_writer;

/* alignment: a power of two (the caller also records it as general.alignment when it is not
 * the default 32, which readers assume otherwise). */
void io_gguf_writer_init(io_gguf_writer *w, uint32_t alignment);
void io_gguf_writer_free(io_gguf_writer *w);

tlm_status io_gguf_write_u32(io_gguf_writer *w, const char *key, uint32_t v);
tlm_status io_gguf_write_f32(io_gguf_writer *w, const char *key, float v);
tlm_status io_gguf_write_bool(io_gguf_writer *w, const char *key, int v);
tlm_status io_gguf_write_str(io_gguf_writer *w, const char *key, const char *v);

/* Opens an array of n elements of type elem (string, f32 or i32 here); exactly n element calls
 * of that type must follow before the next key. */
tlm_status io_gguf_write_array(io_gguf_writer *w, const char *key, io_gguf_type elem, uint64_t n);
tlm_status io_gguf_write_elem_str(io_gguf_writer *w, const void *s, size_t len);
tlm_status io_gguf_write_elem_f32(io_gguf_writer *w, float v);
tlm_status io_gguf_write_elem_i32(io_gguf_writer *w, int32_t v);

/* Removes the key written earlier under k, with its value, as ggml's gguf_remove_key does (a
 * key set again then moves to the end: llama-quantize's overrides); 1 if there was one. */
int io_gguf_writer_remove(io_gguf_writer *w, const char *k);

/* Declares the next tensor of the data section: dims innermost first (ggml's order), a ggml
 * type id and its size in bytes. */
tlm_status io_gguf_write_tensor(io_gguf_writer *w, const char *name, uint32_t n_dims,
                                const uint64_t *dims, uint32_t ggml_type, uint64_t n_bytes);

/* Everything before the data section: magic, version 3, counts, metadata, tensor infos, zero
 * padding to the alignment. *out is malloc'd. Fails with the first recorded error, or when an
 * array is still open. */
tlm_status io_gguf_writer_header(io_gguf_writer *w, uint8_t **out, size_t *len);

/* Zero bytes that follow a tensor of n bytes (at most alignment - 1). */
size_t io_gguf_writer_pad(const io_gguf_writer *w, uint64_t n);

#endif
