#define _GNU_SOURCE
#include <stdint.h>
#include <sys/mman.h>

#include "core.h"

void *tlm_big_alloc(size_t bytes) {
    if (bytes == 0) bytes = 1;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
    if (bytes >= (size_t)2 << 20) madvise(p, bytes, MADV_HUGEPAGE);
#endif
    return p;
}

void tlm_big_free(void *p, size_t bytes) {
    if (p) munmap(p, bytes ? bytes : 1);
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
