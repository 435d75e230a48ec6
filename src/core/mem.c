#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core.h"

/* Under AddressSanitizer big buffers come from the instrumented heap instead of mmap, so that a
 * write past an arena's end is caught rather than landing silently in the rest of a page. */
#if defined(__SANITIZE_ADDRESS__)
#define TLM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TLM_ASAN 1
#endif
#endif

void *tlm_big_alloc(size_t bytes) {
    if (bytes == 0) bytes = 1;
#ifdef TLM_ASAN
    void *q = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (q) memset(q, 0, bytes);
    return q;
#else
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
    if (bytes >= (size_t)2 << 20) madvise(p, bytes, MADV_HUGEPAGE);
#endif
    return p;
#endif
}

void tlm_big_free(void *p, size_t bytes) {
#ifdef TLM_ASAN
    (void)bytes;
    free(p);
#else
    if (p) munmap(p, bytes ? bytes : 1);
#endif
}

int tlm_mul_ok(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > SIZE_MAX / a) return 0;
    *out = a * b;
    return 1;
}

int tlm_add_ok(size_t a, size_t b, size_t *out) {
    if (b > SIZE_MAX - a) return 0;
    *out = a + b;
    return 1;
}
