/* GBNF (llama.cpp's grammar format) into the pushdown automaton of grammar.h. Repetitions become
 * rules of their own (x* is R ::= x R | empty, x{2,4} is x x (x (x)?)?), so the automaton knows
 * only sequences, alternatives and references. After parsing, one pass over the rules finds which
 * can match the empty string and refuses left recursion (a rule reaching itself before reading a
 * character, which would make the automaton's expansion endless), and another refuses a root
 * that matches no string at all. Sizes, counts and nesting are bounded so that hostile text is
 * refused quickly rather than exhausting memory or the stack. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "infer/grammar.h"

#define GP_MAX_TEXT ((size_t)16 << 20)
#define GP_MAX_ELEMENTS (1 << 22)
#define GP_MAX_RULES (1 << 20)
#define GP_MAX_REPEAT 100000
#define GP_MAX_NEST 200
#define GP_MAX_NAME 256

typedef struct {
    infer_gram_el *v;
    int n, cap;
} gvec;

typedef struct {
    char *name; /* NULL: a rule made for a group or a repetition */
    gvec el;    /* alternatives, each closed by INFER_G_ALT, the last by INFER_G_END */
    int defined;
    size_t ref_at; /* where it was first referred to (undefined rules are reported there) */
} grule;

typedef struct {
    const char *src, *p, *end;
    grule *rules;
    int n_rules, cap_rules;
    int32_t *hash; /* open addressing over named rules: rule index + 1, 0 empty */
    int hash_cap;
    uint32_t *rng; /* pairs, sets appended as parsed and normalized */
    int n_rng, cap_rng;
    int32_t *set_off;
    int n_sets, cap_sets;
    long total; /* elements over all rules */
    int depth;
    int failed;
    tlm_status st;
} gparser;

static void where(const gparser *ps, const char *at, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (const char *q = ps->src; q < at && q < ps->end; q++) {
        if (*q == '\n') {
            ++*line;
            *col = 1;
        } else if (((unsigned char)*q & 0xC0) != 0x80) {
            ++*col;
        }
    }
}

static int fail_at(gparser *ps, const char *at, const char *fmt, ...) CORE_PRINTF(3, 4);
static int fail_at(gparser *ps, const char *at, const char *fmt, ...) {
    if (ps->failed) return -1;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line, col;
    where(ps, at, &line, &col);
    ps->st = core_err(TLM_ERR_FORMAT, "grammar: line %d, column %d: %s", line, col, msg);
    ps->failed = 1;
    return -1;
}

static int nomem(gparser *ps) {
    if (!ps->failed) ps->st = core_err(TLM_ERR_NOMEM, "grammar: out of memory");
    ps->failed = 1;
    return -1;
}

static int grow(void **p, int *cap, int need, size_t elem) {
    if (need <= *cap) return 0;
    int c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * elem);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

static int push(gparser *ps, int rule, uint32_t type, uint32_t v) {
    if (++ps->total > GP_MAX_ELEMENTS)
        return fail_at(ps, ps->p, "the grammar grows past %d elements", GP_MAX_ELEMENTS);
    gvec *e = &ps->rules[rule].el;
    if (grow((void **)&e->v, &e->cap, e->n + 1, sizeof *e->v)) return nomem(ps);
    e->v[e->n++] = (infer_gram_el){type, v};
    return 0;
}

static int new_rule(gparser *ps) {
    if (ps->n_rules >= GP_MAX_RULES)
        return fail_at(ps, ps->p, "the grammar grows past %d rules", GP_MAX_RULES);
    if (grow((void **)&ps->rules, &ps->cap_rules, ps->n_rules + 1, sizeof *ps->rules))
        return nomem(ps);
    memset(&ps->rules[ps->n_rules], 0, sizeof *ps->rules);
    return ps->n_rules++;
}

static uint64_t name_hash(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

/* The rule named s[0, n), made (undefined) on first sight. */
static int named_rule(gparser *ps, const char *s, size_t n) {
    if (ps->hash_cap == 0 || 2 * (ps->n_rules + 1) > ps->hash_cap) {
        int cap = ps->hash_cap ? 2 * ps->hash_cap : 256;
        while (cap < 2 * (ps->n_rules + 1)) cap *= 2;
        int32_t *h = calloc((size_t)cap, sizeof *h);
        if (!h) return nomem(ps);
        for (int i = 0; i < ps->hash_cap; i++) {
            if (!ps->hash[i]) continue;
            const char *nm = ps->rules[ps->hash[i] - 1].name;
            size_t k = name_hash(nm, strlen(nm)) & (size_t)(cap - 1);
            while (h[k]) k = (k + 1) & (size_t)(cap - 1);
            h[k] = ps->hash[i];
        }
        free(ps->hash);
        ps->hash = h;
        ps->hash_cap = cap;
    }
    size_t k = name_hash(s, n) & (size_t)(ps->hash_cap - 1);
    while (ps->hash[k]) {
        const char *nm = ps->rules[ps->hash[k] - 1].name;
        if (strlen(nm) == n && !memcmp(nm, s, n)) return ps->hash[k] - 1;
        k = (k + 1) & (size_t)(ps->hash_cap - 1);
    }
    int r = new_rule(ps);
    if (r < 0) return r;
    char *nm = malloc(n + 1);
    if (!nm) return nomem(ps);
    memcpy(nm, s, n);
    nm[n] = 0;
    ps->rules[r].name = nm;
    ps->rules[r].ref_at = (size_t)(s - ps->src);
    ps->hash[k] = r + 1;
    return r;
}

static int is_word(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

/* Spaces, tabs and # comments; newlines too where the rule cannot end (inside a group, after
 * '|' or '::='). */
static void skip_space(gparser *ps, int newlines) {
    while (ps->p < ps->end) {
        char c = *ps->p;
        if (c == ' ' || c == '\t' || (newlines && (c == '\n' || c == '\r'))) {
            ps->p++;
        } else if (c == '#') {
            while (ps->p < ps->end && *ps->p != '\n') ps->p++;
        } else {
            break;
        }
    }
}

static int hex_digits(gparser *ps, int n, uint32_t *out) {
    uint32_t v = 0;
    for (int i = 0; i < n; i++) {
        if (ps->p >= ps->end) return fail_at(ps, ps->p, "expected %d hex digits", n);
        char c = *ps->p;
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) return fail_at(ps, ps->p, "expected a hex digit, got '%c'", c);
        v = v * 16 + (uint32_t)d;
        ps->p++;
    }
    *out = v;
    return 0;
}

/* One character of a literal or class: an escape or one UTF-8 encoded code point. */
static int read_char(gparser *ps, uint32_t *cp) {
    const char *at = ps->p;
    if (ps->p >= ps->end) return fail_at(ps, at, "unexpected end of the grammar");
    unsigned char c = (unsigned char)*ps->p;
    if (c == '\\') {
        ps->p++;
        if (ps->p >= ps->end) return fail_at(ps, at, "unexpected end after '\\'");
        char e = *ps->p++;
        switch (e) {
        case 'x': return hex_digits(ps, 2, cp);
        case 'u': return hex_digits(ps, 4, cp);
        case 'U':
            if (hex_digits(ps, 8, cp)) return -1;
            if (*cp > 0x10FFFF) return fail_at(ps, at, "code point U+%X is past U+10FFFF", *cp);
            return 0;
        case 't': *cp = '\t'; return 0;
        case 'r': *cp = '\r'; return 0;
        case 'n': *cp = '\n'; return 0;
        case '\\':
        case '"':
        case '[':
        case ']':
        case '-':
        case '^': *cp = (unsigned char)e; return 0;
        default: return fail_at(ps, at, "unknown escape '\\%c'", e);
        }
    }
    int k;
    uint32_t v, min;
    if (c < 0x80) {
        ps->p++;
        *cp = c;
        return 0;
    } else if ((c & 0xE0) == 0xC0) {
        k = 1, v = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
        k = 2, v = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
        k = 3, v = c & 0x07, min = 0x10000;
    } else {
        return fail_at(ps, at, "invalid UTF-8");
    }
    if (ps->end - ps->p <= k) return fail_at(ps, at, "invalid UTF-8");
    for (int j = 1; j <= k; j++) {
        unsigned char b = (unsigned char)ps->p[j];
        if ((b & 0xC0) != 0x80) return fail_at(ps, at, "invalid UTF-8");
        v = (v << 6) | (b & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
        return fail_at(ps, at, "invalid UTF-8");
    ps->p += k + 1;
    *cp = v;
    return 0;
}

static int range_cmp(const void *a, const void *b) {
    const uint32_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* Appends a set from ranges rng[from..] (pairs, in ps->rng): sorted, merged, complemented when
 * negated. Returns its index. */
static int finish_set(gparser *ps, int from, int negated) {
    int n = ps->n_rng - from, m = 0;
    /* an empty class ("[]") has no ranges, and maybe no array yet */
    uint32_t *r = n > 0 ? ps->rng + 2 * (size_t)from : NULL;
    if (n > 0) qsort(r, (size_t)n, 2 * sizeof *r, range_cmp);
    for (int i = 0; i < n; i++) {
        if (m && r[2 * i] <= r[2 * (m - 1) + 1] + 1) {
            if (r[2 * i + 1] > r[2 * (m - 1) + 1]) r[2 * (m - 1) + 1] = r[2 * i + 1];
        } else {
            r[2 * m] = r[2 * i];
            r[2 * m + 1] = r[2 * i + 1];
            m++;
        }
    }
    if (negated) {
        /* at most m + 1 ranges */
        if (grow((void **)&ps->rng, &ps->cap_rng, from + 2 * m + 1, 2 * sizeof *ps->rng))
            return nomem(ps);
        r = ps->rng + 2 * (size_t)from;
        uint32_t *c = r + 2 * (size_t)m, next = 0;
        int k = 0;
        for (int i = 0; i < m; i++) {
            if (r[2 * i] > next) {
                c[2 * k] = next;
                c[2 * k + 1] = r[2 * i] - 1;
                k++;
            }
            next = r[2 * i + 1] + 1;
        }
        if (next <= 0x10FFFF) {
            c[2 * k] = next;
            c[2 * k + 1] = 0x10FFFF;
            k++;
        }
        memmove(r, c, (size_t)k * 2 * sizeof *r);
        m = k;
    }
    ps->n_rng = from + m;
    if (grow((void **)&ps->set_off, &ps->cap_sets, ps->n_sets + 2, sizeof *ps->set_off))
        return nomem(ps);
    ps->set_off[ps->n_sets] = from;
    ps->set_off[ps->n_sets + 1] = ps->n_rng;
    return ps->n_sets++;
}

static int add_range(gparser *ps, uint32_t lo, uint32_t hi) {
    if (grow((void **)&ps->rng, &ps->cap_rng, ps->n_rng + 1, 2 * sizeof *ps->rng)) return nomem(ps);
    ps->rng[2 * ps->n_rng] = lo;
    ps->rng[2 * ps->n_rng + 1] = hi;
    ps->n_rng++;
    return 0;
}

static int push_char(gparser *ps, int rule, uint32_t lo, uint32_t hi, int negated) {
    int from = ps->n_rng;
    if (add_range(ps, lo, hi)) return -1;
    int set = finish_set(ps, from, negated);
    return set < 0 ? -1 : push(ps, rule, INFER_G_SET, (uint32_t)set);
}

static int parse_alternates(gparser *ps, int rule, int nested);

/* The last symbol, elements [start, n) of rule, repeated min..max times (max < 0: unbounded). */
static int repeat(gparser *ps, int rule, int start, long min, long max) {
    gvec *e = &ps->rules[rule].el;
    if (e->n - start > 1) { /* a literal of several characters: one rule of its own */
        int sub = new_rule(ps);
        if (sub < 0) return -1;
        e = &ps->rules[rule].el;
        for (int i = start; i < e->n; i++)
            if (push(ps, sub, e->v[i].type, e->v[i].v)) return -1;
        if (push(ps, sub, INFER_G_END, 0)) return -1;
        e = &ps->rules[rule].el;
        ps->total -= e->n - start;
        e->n = start;
        if (push(ps, rule, INFER_G_REF, (uint32_t)sub)) return -1;
        e = &ps->rules[rule].el;
    }
    infer_gram_el sym = e->v[start];
    ps->total--;
    e->n = start;
    for (long i = 0; i < min; i++)
        if (push(ps, rule, sym.type, sym.v)) return -1;
    if (max < 0) {
        int r = new_rule(ps);
        if (r < 0 || push(ps, r, sym.type, sym.v) || push(ps, r, INFER_G_REF, (uint32_t)r) ||
            push(ps, r, INFER_G_ALT, 0) || push(ps, r, INFER_G_END, 0))
            return -1;
        return push(ps, rule, INFER_G_REF, (uint32_t)r);
    }
    int prev = -1;
    for (long i = min; i < max; i++) {
        int r = new_rule(ps);
        if (r < 0 || push(ps, r, sym.type, sym.v)) return -1;
        if (prev >= 0 && push(ps, r, INFER_G_REF, (uint32_t)prev)) return -1;
        if (push(ps, r, INFER_G_ALT, 0) || push(ps, r, INFER_G_END, 0)) return -1;
        prev = r;
    }
    return prev >= 0 ? push(ps, rule, INFER_G_REF, (uint32_t)prev) : 0;
}

static int read_count(gparser *ps, long *v) {
    const char *at = ps->p;
    long x = 0;
    if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9')
        return fail_at(ps, at, "expected a number in {}");
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
        x = x * 10 + (*ps->p++ - '0');
        if (x > GP_MAX_REPEAT) return fail_at(ps, at, "a repetition count above %d", GP_MAX_REPEAT);
    }
    *v = x;
    return 0;
}

/* Symbols up to '|', ')', the end of the line (outside groups) or of the text. */
static int parse_sequence(gparser *ps, int rule, int nested) {
    int last = -1; /* where the last symbol starts, -1 before the first */
    for (;;) {
        skip_space(ps, nested);
        if (ps->p >= ps->end) return 0;
        const char *at = ps->p;
        char c = *ps->p;
        int start = ps->rules[rule].el.n;
        if (c == '"') {
            ps->p++;
            for (;;) {
                if (ps->p >= ps->end || *ps->p == '\n')
                    return fail_at(ps, at, "unterminated literal");
                if (*ps->p == '"') break;
                uint32_t cp;
                if (read_char(ps, &cp) || push_char(ps, rule, cp, cp, 0)) return -1;
            }
            ps->p++;
            /* "" matches the empty string: no symbol to repeat */
            last = ps->rules[rule].el.n > start ? start : -1;
        } else if (c == '[') {
            ps->p++;
            int negated = 0, from = ps->n_rng;
            if (ps->p < ps->end && *ps->p == '^') {
                negated = 1;
                ps->p++;
            }
            for (;;) {
                if (ps->p >= ps->end || *ps->p == '\n')
                    return fail_at(ps, at, "unterminated character class");
                if (*ps->p == ']') break;
                const char *ch = ps->p;
                uint32_t lo, hi;
                if (read_char(ps, &lo)) return -1;
                hi = lo;
                if (ps->p + 1 < ps->end && *ps->p == '-' && ps->p[1] != ']') {
                    ps->p++;
                    if (read_char(ps, &hi)) return -1;
                    if (hi < lo) return fail_at(ps, ch, "range end below its start");
                }
                if (add_range(ps, lo, hi)) return -1;
            }
            ps->p++;
            int set = finish_set(ps, from, negated);
            if (set < 0 || push(ps, rule, INFER_G_SET, (uint32_t)set)) return -1;
            last = start;
        } else if (c == '.') {
            ps->p++;
            if (push_char(ps, rule, 0, 0x10FFFF, 0)) return -1;
            last = start;
        } else if (is_word(c)) {
            const char *s = ps->p;
            while (ps->p < ps->end && is_word(*ps->p)) ps->p++;
            if (ps->p - s > GP_MAX_NAME)
                return fail_at(ps, s, "a rule name over %d bytes", GP_MAX_NAME);
            int r = named_rule(ps, s, (size_t)(ps->p - s));
            if (r < 0 || push(ps, rule, INFER_G_REF, (uint32_t)r)) return -1;
            last = start;
        } else if (c == '(') {
            ps->p++;
            if (++ps->depth > GP_MAX_NEST)
                return fail_at(ps, at, "groups nested deeper than %d", GP_MAX_NEST);
            int sub = new_rule(ps);
            if (sub < 0 || parse_alternates(ps, sub, 1)) return -1;
            ps->depth--;
            skip_space(ps, 1);
            if (ps->p >= ps->end || *ps->p != ')') return fail_at(ps, ps->p, "expected ')'");
            ps->p++;
            if (push(ps, rule, INFER_G_REF, (uint32_t)sub)) return -1;
            last = start;
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            if (last < 0) return fail_at(ps, at, "'%c' has nothing before it to repeat", c);
            ps->p++;
            long min = 0, max = -1;
            if (c == '+') min = 1;
            if (c == '?') max = 1;
            if (c == '{') {
                skip_space(ps, 0);
                if (read_count(ps, &min)) return -1;
                skip_space(ps, 0);
                max = min;
                if (ps->p < ps->end && *ps->p == ',') {
                    ps->p++;
                    skip_space(ps, 0);
                    max = -1;
                    if (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
                        if (read_count(ps, &max)) return -1;
                        if (max < min)
                            return fail_at(ps, at, "{%ld,%ld}: the maximum is below the minimum",
                                           min, max);
                    }
                    skip_space(ps, 0);
                }
                if (ps->p >= ps->end || *ps->p != '}') return fail_at(ps, ps->p, "expected '}'");
                ps->p++;
            }
            if (repeat(ps, rule, last, min, max)) return -1;
            last = -1; /* x** and x*? would repeat a repetition: GBNF refuses them too */
        } else {
            return 0;
        }
    }
}

static int parse_alternates(gparser *ps, int rule, int nested) {
    for (;;) {
        if (parse_sequence(ps, rule, nested)) return -1;
        skip_space(ps, nested);
        if (ps->p < ps->end && *ps->p == '|') {
            ps->p++;
            skip_space(ps, 1);
            if (push(ps, rule, INFER_G_ALT, 0)) return -1;
            continue;
        }
        return push(ps, rule, INFER_G_END, 0);
    }
}

static int parse_rules(gparser *ps) {
    for (;;) {
        skip_space(ps, 1);
        if (ps->p >= ps->end) return 0;
        const char *at = ps->p, *s = ps->p;
        while (ps->p < ps->end && is_word(*ps->p)) ps->p++;
        if (ps->p == s) return fail_at(ps, at, "expected a rule name, got '%c'", *at);
        if (ps->p - s > GP_MAX_NAME)
            return fail_at(ps, s, "a rule name over %d bytes", GP_MAX_NAME);
        int r = named_rule(ps, s, (size_t)(ps->p - s));
        if (r < 0) return -1;
        if (ps->rules[r].defined)
            return fail_at(ps, at, "rule '%s' is defined twice", ps->rules[r].name);
        ps->rules[r].defined = 1;
        skip_space(ps, 0);
        if (ps->end - ps->p < 3 || memcmp(ps->p, "::=", 3))
            return fail_at(ps, ps->p, "expected '::=' after the rule name '%s'", ps->rules[r].name);
        ps->p += 3;
        skip_space(ps, 1);
        if (parse_alternates(ps, r, 0)) return -1;
        if (ps->p < ps->end && *ps->p != '\n' && *ps->p != '\r')
            return fail_at(ps, ps->p, "unexpected '%c'", *ps->p);
    }
}

/* Which rules match the empty string, refusing left recursion: a depth-first walk (explicit stack)
 * over the edges from a rule to the references it can reach before any character. A reference
 * back to a rule still on the walk's stack is such a cycle. */
static int check_left_recursion(gparser *ps, const struct tlm_grammar *g, uint8_t *nullable) {
    int n = g->n_rules;
    uint8_t *state = calloc((size_t)n, 1); /* 0 unseen, 1 on the stack, 2 done */
    int32_t *stk = malloc((size_t)n * sizeof *stk), *cur = malloc((size_t)n * sizeof *cur);
    if (!state || !stk || !cur) {
        free(state), free(stk), free(cur);
        return nomem(ps);
    }
    int rc = 0;
    for (int r0 = 0; r0 < n && !rc; r0++) {
        if (state[r0]) continue;
        int sp = 0;
        stk[sp] = r0;
        cur[sp++] = g->alt_off[r0]; /* the alternative being walked, by index in alt_pos */
        state[r0] = 1;
        while (sp && !rc) {
            int r = stk[sp - 1], a = cur[sp - 1];
            if (a >= g->alt_off[r + 1]) {
                state[r] = 2;
                sp--;
                continue;
            }
            /* Walk alternative a from its start past nullable references; descend into the first
             * unseen one and resume the same alternative when it is done. */
            uint32_t pos = (uint32_t)g->alt_pos[a];
            int descended = 0;
            for (;; pos++) {
                const infer_gram_el *e = &g->el[pos];
                if (e->type <= INFER_G_ALT) {
                    nullable[r] = 1;
                    break;
                }
                if (e->type == INFER_G_SET) break;
                int x = (int)e->v;
                if (state[x] == 1) {
                    /* Groups and repetitions have no name: the cycle is reported at the nearest
                     * named rule on it. */
                    int named = x;
                    for (int i = sp - 1; i >= 0 && !ps->rules[named].name; i--) named = stk[i];
                    const grule *nr = &ps->rules[named];
                    rc = fail_at(ps, ps->src + nr->ref_at,
                                 "rule '%s' is left-recursive (it can reach itself before reading "
                                 "a character); write the repetition with * or + instead",
                                 nr->name ? nr->name : "?");
                    break;
                }
                if (state[x] == 0) {
                    stk[sp] = x;
                    cur[sp++] = g->alt_off[x];
                    state[x] = 1;
                    descended = 1;
                    break;
                }
                if (!nullable[x]) break;
            }
            if (!descended && !rc) cur[sp - 1]++;
        }
    }
    free(state);
    free(stk);
    free(cur);
    return rc;
}

/* 1 when the root matches some string: the least fixed point of "some alternative has only
 * productive symbols", computed with a count of unproductive symbols per alternative and a
 * worklist of rules found productive. */
static int root_productive(gparser *ps, const struct tlm_grammar *g, int *ok) {
    int n = g->n_rules, n_alts = g->alt_off[n];
    int32_t *missing = calloc((size_t)n_alts, sizeof *missing);
    int32_t *alt_rule = malloc((size_t)n_alts * sizeof *alt_rule);
    int32_t *uses_off = calloc((size_t)n + 1, sizeof *uses_off), *uses = NULL;
    uint8_t *prod = calloc((size_t)n, 1);
    int32_t *work = malloc((size_t)n * sizeof *work);
    int rc = 0;
    if (!missing || !alt_rule || !uses_off || !prod || !work) goto oom;
    long n_uses = 0;
    for (int r = 0; r < n; r++)
        for (int a = g->alt_off[r]; a < g->alt_off[r + 1]; a++) {
            alt_rule[a] = r;
            for (uint32_t p = (uint32_t)g->alt_pos[a]; !infer_gram_at_end(g, p); p++)
                if (g->el[p].type == INFER_G_REF) {
                    uses_off[g->el[p].v]++;
                    n_uses++;
                }
        }
    uses = malloc((size_t)(n_uses ? n_uses : 1) * sizeof *uses);
    if (!uses) goto oom;
    for (int r = 0, acc = 0; r <= n; r++) {
        int c = r < n ? uses_off[r] : 0;
        uses_off[r] = acc;
        acc += c;
    }
    int nw = 0;
    for (int a = 0; a < n_alts; a++) {
        for (uint32_t p = (uint32_t)g->alt_pos[a]; !infer_gram_at_end(g, p); p++) {
            const infer_gram_el *e = &g->el[p];
            if (e->type == INFER_G_REF) {
                uses[uses_off[e->v]++] = a;
                missing[a]++;
            } else if (g->set_off[e->v] == g->set_off[e->v + 1]) {
                missing[a] = -(1 << 30); /* an empty set: never productive */
            }
        }
    }
    for (int r = n; r > 0; r--) uses_off[r] = uses_off[r - 1];
    uses_off[0] = 0;
    for (int a = 0; a < n_alts; a++)
        if (missing[a] == 0 && !prod[alt_rule[a]]) {
            prod[alt_rule[a]] = 1;
            work[nw++] = alt_rule[a];
        }
    while (nw) {
        int r = work[--nw];
        for (int u = uses_off[r]; u < uses_off[r + 1]; u++) {
            int a = uses[u];
            if (--missing[a] == 0 && !prod[alt_rule[a]]) {
                prod[alt_rule[a]] = 1;
                work[nw++] = alt_rule[a];
            }
        }
    }
    *ok = prod[g->root];
    goto done;
oom:
    rc = nomem(ps);
done:
    free(missing);
    free(alt_rule);
    free(uses_off);
    free(uses);
    free(prod);
    free(work);
    return rc;
}

void tlm_grammar_free(tlm_grammar *g) {
    if (!g) return;
    free(g->el);
    free(g->alt_off);
    free(g->alt_pos);
    free(g->rng);
    free(g->set_off);
    free(g);
}

/* The parsed rules laid out one after another, with each alternative's start indexed. */
static int flatten(gparser *ps, struct tlm_grammar *g) {
    long n_el = 0, n_alts = 0;
    for (int r = 0; r < ps->n_rules; r++) {
        n_el += ps->rules[r].el.n;
        for (int i = 0; i < ps->rules[r].el.n; i++)
            n_alts += ps->rules[r].el.v[i].type <= INFER_G_ALT;
    }
    g->n_rules = ps->n_rules;
    g->el = malloc((size_t)(n_el ? n_el : 1) * sizeof *g->el);
    g->alt_off = malloc(((size_t)ps->n_rules + 1) * sizeof *g->alt_off);
    g->alt_pos = malloc((size_t)(n_alts ? n_alts : 1) * sizeof *g->alt_pos);
    if (!g->el || !g->alt_off || !g->alt_pos) return nomem(ps);
    int at = 0, na = 0;
    for (int r = 0; r < ps->n_rules; r++) {
        const gvec *e = &ps->rules[r].el;
        g->alt_off[r] = na;
        g->alt_pos[na++] = at;
        for (int i = 0; i < e->n; i++) {
            g->el[at + i] = e->v[i];
            if (e->v[i].type == INFER_G_ALT) g->alt_pos[na++] = at + i + 1;
        }
        at += e->n;
    }
    g->alt_off[ps->n_rules] = na;
    g->n_el = at;
    /* rule references become element positions only at run time (alt_pos), so nothing else moves */
    g->rng = ps->rng;
    g->set_off = ps->set_off;
    g->n_sets = ps->n_sets;
    ps->rng = NULL;
    ps->set_off = NULL;
    return 0;
}

tlm_status tlm_grammar_parse(const char *text, size_t len, tlm_grammar **out) {
    if (!out) return core_err(TLM_ERR_ARG, "grammar: out must not be NULL");
    *out = NULL;
    if (!text) return core_err(TLM_ERR_ARG, "grammar: NULL text");
    if (len > GP_MAX_TEXT)
        return core_err(TLM_ERR_FORMAT, "grammar: %zu bytes, more than the %zu allowed", len,
                        GP_MAX_TEXT);
    gparser ps = {.src = text, .p = text, .end = text + len};
    struct tlm_grammar *g = calloc(1, sizeof *g);
    uint8_t *nullable = NULL;
    tlm_status st = TLM_OK;
    if (!g) {
        nomem(&ps);
        goto done;
    }
    if (parse_rules(&ps)) goto done;
    int root = -1;
    for (int r = 0; r < ps.n_rules; r++) {
        if (ps.rules[r].name && !ps.rules[r].defined) {
            fail_at(&ps, ps.src + ps.rules[r].ref_at, "undefined rule '%s'", ps.rules[r].name);
            goto done;
        }
        if (ps.rules[r].name && !strcmp(ps.rules[r].name, "root")) root = r;
    }
    if (root < 0) {
        ps.st =
            core_err(TLM_ERR_FORMAT, "grammar: no rule named 'root' (where the grammar starts)");
        ps.failed = 1;
        goto done;
    }
    if (flatten(&ps, g)) goto done;
    g->root = root;
    nullable = calloc((size_t)g->n_rules, 1);
    if (!nullable) {
        nomem(&ps);
        goto done;
    }
    if (check_left_recursion(&ps, g, nullable)) goto done;
    int ok = 0;
    if (root_productive(&ps, g, &ok)) goto done;
    if (!ok) {
        ps.st = core_err(TLM_ERR_FORMAT, "grammar: 'root' matches no string at all");
        ps.failed = 1;
    }
done:
    st = ps.failed ? ps.st : TLM_OK;
    for (int r = 0; r < ps.n_rules; r++) {
        free(ps.rules[r].name);
        free(ps.rules[r].el.v);
    }
    free(ps.rules);
    free(ps.hash);
    free(ps.rng);
    free(ps.set_off);
    free(nullable);
    if (st) {
        tlm_grammar_free(g);
        return st;
    }
    *out = g;
    return TLM_OK;
}
