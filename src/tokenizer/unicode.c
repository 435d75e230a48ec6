#include "unicode.h"

size_t tok_utf8_put(uint32_t cp, uint8_t *out) {
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | (cp >> 6));
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | (cp >> 12));
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | (cp >> 18));
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

int tok_uni_class(uint32_t cp) {
    if (cp == TOK_UTF8_INVALID) return TOK_UNI_OTHER;
    int lo = 0, hi = tok_uni_n_ranges - 1;
    while (lo <= hi) {
        int mid = (lo + hi) >> 1;
        if (cp < tok_uni_ranges[mid].lo)
            hi = mid - 1;
        else if (cp > tok_uni_ranges[mid].hi)
            lo = mid + 1;
        else
            return (int)tok_uni_ranges[mid].cls;
    }
    return TOK_UNI_OTHER;
}

/* ASCII classes, the hot path of every English text. */
static const uint8_t ascii_cls[128] = {
    0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 3, 3, 3, 3, 0, 0, /* \t \n \v \f \r */
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, /* */
    3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, /* space, punctuation */
    2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, /* digits */
    0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, /* @ A-O */
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, /* P-Z */
    0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, /* ` a-o */
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, /* p-z */
};

static inline int cls_at(const uint8_t *s, size_t n, size_t i, size_t *len) {
    uint8_t c = s[i];
    if (c < 0x80) {
        *len = 1;
        return ascii_cls[c];
    }
    uint32_t cp;
    *len = tok_utf8_next(s + i, n - i, &cp);
    return tok_uni_class(cp);
}

size_t tok_pretok_next(const uint8_t *s, size_t n, size_t i) {
    /* The contractions come first in the alternation, so they win even inside a word. */
    if (s[i] == '\'' && i + 1 < n) {
        uint8_t c1 = s[i + 1];
        if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return i + 2;
        if (i + 2 < n && ((c1 == 'r' && s[i + 2] == 'e') || (c1 == 'v' && s[i + 2] == 'e') ||
                          (c1 == 'l' && s[i + 2] == 'l')))
            return i + 3;
    }
    size_t l;
    int target = cls_at(s, n, i, &l);
    size_t j = i;
    if (s[i] == ' ' && i + 1 < n) {
        int c2 = cls_at(s, n, i + 1, &l);
        if (c2 != TOK_UNI_SPACE) {
            target = c2;
            j = i + 1;
        }
    }
    if (target != TOK_UNI_SPACE) {
        while (j < n) {
            if (cls_at(s, n, j, &l) != target) break;
            j += l;
        }
        return j;
    }
    /* \s+(?!\S): the whole run if it reaches the end, else the run minus its last character
     * (which then starts the next pre-token); a single space before a non-space is \s+. */
    size_t last = i;
    while (j < n) {
        if (cls_at(s, n, j, &l) != TOK_UNI_SPACE) break;
        last = j;
        j += l;
    }
    if (j == n || last == i) return j;
    return last;
}

/* ASCII lower case of the byte (contractions compare ASCII letters only: no other code point
 * lower-cases to one of s, t, m, d, r, e, v, l). */
static inline uint8_t lower(uint8_t c) { return c >= 'A' && c <= 'Z' ? (uint8_t)(c + 32) : c; }

size_t tok_pretok_next_llama3(const uint8_t *s, size_t n, size_t i, int max_digits) {
    if (s[i] == '\'' && i + 1 < n) {
        uint8_t c1 = lower(s[i + 1]);
        if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return i + 2;
        if (i + 2 < n) {
            uint8_t c2 = lower(s[i + 2]);
            if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l'))
                return i + 3;
        }
    }
    size_t l, l2;
    int cls = cls_at(s, n, i, &l);
    int next = i + l < n ? cls_at(s, n, i + l, &l2) : -1; /* -1: past the end */
    int newline = s[i] == '\r' || s[i] == '\n';
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    if (!newline && cls != TOK_UNI_NUMBER && (cls == TOK_UNI_LETTER || next == TOK_UNI_LETTER)) {
        size_t j = i + l;
        while (j < n && cls_at(s, n, j, &l2) == TOK_UNI_LETTER) j += l2;
        return j;
    }
    /* \p{N}{1,max_digits} */
    if (cls == TOK_UNI_NUMBER) {
        size_t j = i;
        for (int d = 0; d < max_digits && j < n && cls_at(s, n, j, &l2) == TOK_UNI_NUMBER; d++)
            j += l2;
        return j;
    }
    /* ' ?[^\s\p{L}\p{N}]+[\r\n]*': a space, then at least one character of none of the three
     * classes; a lone space at the end is taken here too (the same piece as \s+ would give) */
    int c2 = s[i] == ' ' ? next : cls;
    if (c2 != TOK_UNI_SPACE && c2 != TOK_UNI_LETTER && c2 != TOK_UNI_NUMBER) {
        size_t j = i + (s[i] == ' ');
        while (j < n) {
            int c = cls_at(s, n, j, &l2);
            if (c == TOK_UNI_SPACE || c == TOK_UNI_LETTER || c == TOK_UNI_NUMBER) break;
            j += l2;
        }
        while (j < n && (s[j] == '\r' || s[j] == '\n')) j++;
        return j;
    }
    /* the run of whitespace from i: up to its last \r or \n if it has one (\s*[\r\n]+), else
     * all of it but its last character when more follows (\s+(?!\S)), else all of it (\s+) */
    size_t j = i, last = i, end_rn = 0, count = 0;
    while (j < n && cls_at(s, n, j, &l2) == TOK_UNI_SPACE) {
        if (s[j] == '\r' || s[j] == '\n') end_rn = j + 1;
        last = j;
        j += l2;
        count++;
    }
    if (end_rn) return end_rn;
    if (count > 1 && j < n) return last;
    if (count) return j;
    return i + l;
}
