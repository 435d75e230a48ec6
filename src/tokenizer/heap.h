/* A binary heap over an array of fixed-size elements, shared by the tokenizers' best-first loops
 * (BPE merge candidates, SentencePiece candidates, BPE training's pair counts). The order is a
 * function before(x, y, ctx): true when x must leave the heap before y. The functions are always
 * inlined, so at each call the element size and the comparator are constants: the copies become
 * plain moves and the comparator is inlined, as in a heap written for the element type. */
#ifndef TLM_TOKENIZER_HEAP_H
#define TLM_TOKENIZER_HEAP_H

#include <stddef.h>
#include <string.h>

typedef int (*tok_heap_before)(const void *x, const void *y, const void *ctx);

/* Adds the element at e to the heap of *n elements of `size` bytes at h; h has room for one
 * more (the caller's to ensure). */
static inline __attribute__((always_inline)) void tok_heap_push(void *h, size_t *n, size_t size,
                                                                const void *e,
                                                                tok_heap_before before,
                                                                const void *ctx) {
    char *b = h;
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!before(e, b + p * size, ctx)) break;
        memcpy(b + i * size, b + p * size, size);
        i = p;
    }
    memcpy(b + i * size, e, size);
}

/* Moves the first element of the non-empty heap at h into top. */
static inline __attribute__((always_inline)) void
tok_heap_pop(void *h, size_t *n, size_t size, void *top, tok_heap_before before, const void *ctx) {
    char *b = h;
    size_t m = --*n, i = 0;
    memcpy(top, b, size);
    /* The last element, at index m (outside the heap now, and never written below), sinks from
     * the root to its place. */
    const char *last = b + m * size;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= m) break;
        if (c + 1 < m && before(b + (c + 1) * size, b + c * size, ctx)) c++;
        if (!before(b + c * size, last, ctx)) break;
        memcpy(b + i * size, b + c * size, size);
        i = c;
    }
    if (m) memcpy(b + i * size, last, size);
}

#endif
