/* Internal helpers shared by every layer of the library: errors, memory, RNG, files. */
#ifndef TLM_CORE_H
#define TLM_CORE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "tlm.h"

#if defined(__GNUC__)
#define CORE_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define CORE_PRINTF(a, b)
#endif

/* Records a message for tlm_last_error() and returns s, so callers can `return core_err(...)`. */
tlm_status core_err(tlm_status s, const char *fmt, ...) CORE_PRINTF(2, 3);
/* Prefixes the current message with context ("loading x.safetensors: ..."). Returns s. */
tlm_status core_err_context(tlm_status s, const char *fmt, ...) CORE_PRINTF(2, 3);

/* Large, 64-byte aligned, zeroed allocations backed by mmap with transparent huge pages; first
 * touch of 4 KiB pages is expensive on our machines, so big buffers are allocated once and reused.
 */
void *core_big_alloc(size_t bytes);
/* Makes a core_big_alloc buffer read-only (under AddressSanitizer, whose buffers come from the
 * heap, it stays writable). */
void core_big_seal(void *p, size_t bytes);
/* Frees a core_big_alloc buffer of the size it was asked for; NULL is ignored. */
void core_big_free(void *p, size_t bytes);

/* Seconds on the monotonic clock, and of CPU time used by all the process's threads
 * (src/core/clock.c). */
double core_now_s(void);
double core_cpu_s(void);

/* Called before the first computation (model creation): caps OpenBLAS's thread count at
 * OMP_THREAD_LIMIT even when tlm_threads_set was never called. */
void core_threads_check(void);
/* Called at the start of every computing entry point: caps the calling thread's OpenMP thread
 * count (which OpenBLAS follows) at OMP_THREAD_LIMIT. */
void core_threads_enter(void);

/* Subnormal floats flushed to zero and read as zero (src/core/fpenv.c says why) in a computing
 * entry point: CORE_FP_FLUSH_SCOPE() at its start sets the mode on the calling thread until the
 * function returns (the caller's own mode comes back then) and for good on its OpenMP workers;
 * team.c's pool threads call core_fp_flush_thread when they start. */
typedef struct {
    unsigned saved;
} core_fp_flush_scope;
void core_fp_flush_begin(core_fp_flush_scope *s);
void core_fp_flush_end(core_fp_flush_scope *s);
void core_fp_flush_thread(void);
#define CORE_FP_FLUSH_SCOPE()                                                                      \
    core_fp_flush_scope fp_scope_ __attribute__((cleanup(core_fp_flush_end)));                     \
    core_fp_flush_begin(&fp_scope_)

/* Overflow-checked size arithmetic: return 0 on overflow. */
int core_mul_ok(size_t a, size_t b, size_t *out);
int core_add_ok(size_t a, size_t b, size_t *out);

/* splitmix64's finalizer: a full 64-bit mix, for counter-based randomness (dropout masks) and
 * for hashing keys with a seed (tokenizer tables). */
static inline uint64_t core_mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 31;
    return x;
}

/* Deterministic RNG (PCG32 stream), same sequence on every platform. */
typedef struct {
    uint64_t state;
    uint64_t inc;
} core_rng;

void core_rng_seed(core_rng *r, uint64_t seed, uint64_t stream);
uint32_t core_rng_u32(core_rng *r);
/* Uniform in [0, 1) with 24 bits. */
float core_rng_float(core_rng *r);
/* Uniform in (0, 1), 53 bits. */
double core_rng_double_open(core_rng *r);
double core_rng_normal(core_rng *r);
/* Normal(0, sigma) truncated to [-cut*sigma, cut*sigma] by rejection. */
double core_rng_trunc_normal(core_rng *r, double sigma, double cut);
/* Uniform integer in [0, n). */
uint32_t core_rng_below(core_rng *r, uint32_t n);

/* "dir/name" in a new malloc'd string (NULL when out of memory). */
char *core_path_join(const char *dir, const char *name);

/* Reads a whole file (NUL-terminated for convenience; *len excludes the NUL). */
tlm_status core_read_file(const char *path, char **data, size_t *len);

/* Crash-safe writes: data goes to "PATH.tmp.PID", is fsynced, then renamed over PATH, and PATH's
 * directory is fsynced so that the rename itself is durable. */
typedef struct {
    FILE *f;
    char *path;
    char *tmp;
} core_atomic_file;

tlm_status core_atomic_open(core_atomic_file *a, const char *path);
tlm_status core_atomic_write(core_atomic_file *a, const void *data, size_t n);
/* Flushes, fsyncs, renames, fsyncs the directory; a failure before the rename removes the
 * temporary file, a failure to sync the directory after it is reported (TLM_ERR_IO) with the new
 * file in place. */
tlm_status core_atomic_commit(core_atomic_file *a);
void core_atomic_abort(core_atomic_file *a);
tlm_status core_write_file_atomic(const char *path, const void *data, size_t n);

/* Read-only memory map of a whole file. */
typedef struct {
    const uint8_t *data;
    size_t size;
    int copy; /* 1: the file read into a core_big_alloc buffer (TLM_LOAD_READ); 0: mapped */
} core_mmap;

tlm_status core_mmap_open(core_mmap *m, const char *path);
/* While on (this thread only), core_mmap_open reads the whole file into read-only memory on huge
 * pages instead of mapping it (TLM_LOAD_READ); core_mmap_close frees either. */
void core_mmap_read_mode(int on);
void core_mmap_close(core_mmap *m);
/* Drops a read-only mapping's pages inside [p, p + n) from this process (they stay in the page
 * cache; touching them maps them again): a copy made from a mapping then does not hold both. */
void core_mmap_release(const void *p, size_t n);

#endif
