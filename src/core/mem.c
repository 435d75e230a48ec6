#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core.h"

/* Under AddressSanitizer big buffers come from the instrumented heap instead of mmap, so that a
 * write past an arena's end is caught rather than landing silently in the rest of a page. */
#if defined(__SANITIZE_ADDRESS__)
#define CORE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CORE_ASAN 1
#endif
#endif

void *core_big_alloc(size_t bytes) {
    if (bytes == 0) bytes = 1;
#ifdef CORE_ASAN
    void *q = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (q) memset(q, 0, bytes);
    return q;
#else
    size_t huge = (size_t)2 << 20;
    if (bytes < huge) {
        void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        return p == MAP_FAILED ? NULL : p;
    }
    /* A start on a 2 MiB boundary, so that every whole 2 MiB of the buffer can be one huge page:
     * map 2 MiB more and give back the ends (core_big_free then unmaps exactly what is left). */
    uint8_t *r =
        mmap(NULL, bytes + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r == MAP_FAILED) return NULL;
    uint8_t *a = (uint8_t *)(((uintptr_t)r + huge - 1) & ~(uintptr_t)(huge - 1));
    size_t page = (size_t)sysconf(_SC_PAGESIZE),
           end = ((size_t)(a - r) + bytes + page - 1) & ~(page - 1);
    if (a > r) munmap(r, (size_t)(a - r));
    if (end < bytes + huge) munmap(r + end, bytes + huge - end);
#ifdef MADV_HUGEPAGE
    madvise(a, bytes, MADV_HUGEPAGE);
#endif
    return a;
#endif
}

void core_big_seal(void *p, size_t bytes) {
#ifdef CORE_ASAN
    (void)p, (void)bytes; /* heap memory: not whole pages of its own */
#else
    if (p) mprotect(p, bytes ? bytes : 1, PROT_READ);
#endif
}

void core_big_free(void *p, size_t bytes) {
#ifdef CORE_ASAN
    (void)bytes;
    free(p);
#else
    if (p) munmap(p, bytes ? bytes : 1);
#endif
}

int core_mul_ok(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > SIZE_MAX / a) return 0;
    *out = a * b;
    return 1;
}

int core_add_ok(size_t a, size_t b, size_t *out) {
    if (b > SIZE_MAX - a) return 0;
    *out = a + b;
    return 1;
}
