/* UTF-8 decoding and the Unicode classes used by the GPT-2 pre-tokenizer. */
#ifndef TLM_TOK_UNICODE_H
#define TLM_TOK_UNICODE_H

#include <stddef.h>
#include <stdint.h>

enum { TOK_UNI_OTHER = 0, TOK_UNI_LETTER = 1, TOK_UNI_NUMBER = 2, TOK_UNI_SPACE = 3 };

#define TOK_UTF8_INVALID 0xFFFFFFFFu

typedef struct {
    uint32_t lo, hi, cls;
} tok_uni_range;

extern const tok_uni_range tok_uni_ranges[];
extern const int tok_uni_n_ranges;
extern const char tok_uni_version[];

/* Decodes one strict UTF-8 sequence at s (n >= 1 bytes available). Returns its length; *cp is the
 * code point, or TOK_UTF8_INVALID with length 1 for a byte that does not start a well-formed
 * sequence (overlong, surrogate, out of range, truncated). */
static inline size_t tok_utf8_next(const uint8_t *s, size_t n, uint32_t *cp) {
    uint8_t c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t len;
    uint32_t v, min;
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2, v = c & 0x1F, min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3, v = c & 0x0F, min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4, v = c & 0x07, min = 0x10000;
    } else {
        *cp = TOK_UTF8_INVALID;
        return 1;
    }
    if (len > n) {
        *cp = TOK_UTF8_INVALID;
        return 1;
    }
    for (size_t k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80) {
            *cp = TOK_UTF8_INVALID;
            return 1;
        }
        v = (v << 6) | (s[k] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
        *cp = TOK_UTF8_INVALID;
        return 1;
    }
    *cp = v;
    return len;
}

/* Writes the UTF-8 form of cp (<= 0x10FFFF) into out; returns its length. */
size_t tok_utf8_put(uint32_t cp, uint8_t *out);

/* TOK_UNI_* class of a code point (invalid bytes count as OTHER). */
int tok_uni_class(uint32_t cp);

/* End (exclusive) of the GPT-2 pre-token that starts at s[i], i < n:
 * 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * Bytes that are not well-formed UTF-8 count as single "other" characters. */
size_t tok_pretok_next(const uint8_t *s, size_t n, size_t i);

/* The same for Llama 3's pattern (max_digits 3; Qwen2's: 1), as llama.cpp splits it:
 * (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
 * \s*[\r\n]+|\s+(?!\S)|\s+ */
size_t tok_pretok_next_llama3(const uint8_t *s, size_t n, size_t i, int max_digits);

#endif
