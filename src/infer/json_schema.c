/* JSON Schema into GBNF, in the manner of llama.cpp's json-schema-to-grammar: one rule per
 * schema, objects with their required properties first (in the order of "properties") and the
 * optional ones after them in the same order, additional properties only where
 * additionalProperties allows them (absent counts as false, as llama.cpp has it). Whitespace is
 * bounded (one optional space, or a newline and up to 20 spaces or tabs, between tokens) so that
 * a model cannot loop on it forever. Every keyword is either applied, an annotation (title,
 * description, ...) or refused by name: a schema is never followed only in part without saying
 * so. */
#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "infer/grammar.h"

#define JS_MAX_DEPTH 64
#define JS_MAX_COUNT 10000
#define JS_MAX_OUT ((size_t)8 << 20)

/* The rules every schema may use. Values never end in whitespace: the containers put `space`
 * after each of theirs. */
static const char *js_builtin =
    "space ::= | \" \" | \"\\n\" [ \\t]{0,20}\n"
    "value ::= object | array | string | number | boolean | null\n"
    "object ::= \"{\" space ( member ( \",\" space member )* )? \"}\"\n"
    "member ::= string space \":\" space value space\n"
    "array ::= \"[\" space ( value space ( \",\" space value space )* )? \"]\"\n"
    "string ::= \"\\\"\" char* \"\\\"\"\n"
    "char ::= [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} )\n"
    "number ::= \"-\"? integral-part ( \".\" decimal-part )? ( [eE] [-+]? integral-part )?\n"
    "integer ::= \"-\"? integral-part\n"
    "integral-part ::= \"0\" | [1-9] [0-9]{0,15}\n"
    "decimal-part ::= [0-9]{1,16}\n"
    "boolean ::= \"true\" | \"false\"\n"
    "null ::= \"null\"\n";

typedef struct {
    char *s;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + n + 1) c *= 2;
        char *q = c <= JS_MAX_OUT * 2 ? realloc(b->s, c) : NULL;
        if (!q) {
            b->oom = 1;
            return;
        }
        b->s = q;
        b->cap = c;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

static void sb_str(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

static void sb_fmt(sbuf *b, const char *fmt, ...) CORE_PRINTF(2, 3);
static void sb_fmt(sbuf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0) sb_add(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

typedef struct {
    char *ref;
    int rule;
} js_ref;

typedef struct {
    const cJSON *root;
    sbuf out;
    int n_rules;
    js_ref *refs;
    int n_refs, cap_refs;
    int depth;
    char path[256];
    tlm_status st;
} conv;

static int js_fail(conv *c, tlm_status st, const char *fmt, ...) CORE_PRINTF(3, 4);
static int js_fail(conv *c, tlm_status st, const char *fmt, ...) {
    if (c->st) return -1;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->st = core_err(st, "JSON schema%s%s: %s", c->path[0] ? " at " : "", c->path, msg);
    return -1;
}

/* A literal of GBNF for UTF-8 text (escaping what GBNF would read otherwise). */
static void sb_literal(sbuf *b, const char *s, size_t n) {
    sb_str(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\') {
            char e[2] = {'\\', (char)ch};
            sb_add(b, e, 2);
        } else if (ch < 0x20 || ch == 0x7F) {
            sb_fmt(b, "\\x%02X", ch);
        } else {
            sb_add(b, (const char *)&ch, 1);
        }
    }
    sb_str(b, "\"");
}

/* The value as JSON text, as a GBNF literal. */
static int sb_const(conv *c, sbuf *b, const cJSON *v) {
    char *t = cJSON_PrintUnformatted(v);
    if (!t) return js_fail(c, TLM_ERR_NOMEM, "out of memory");
    sb_literal(b, t, strlen(t));
    free(t);
    return 0;
}

/* Emits "rN ::= body" and returns N. */
static int emit(conv *c, int rule, const sbuf *body) {
    sb_fmt(&c->out, "r%d ::= ", rule);
    sb_add(&c->out, body->s ? body->s : "", body->n);
    sb_str(&c->out, "\n");
    if (c->out.n > JS_MAX_OUT)
        return js_fail(c, TLM_ERR_RANGE, "the grammar grows past %zu bytes", JS_MAX_OUT);
    return c->out.oom ? js_fail(c, TLM_ERR_NOMEM, "out of memory") : 0;
}

static int visit(conv *c, const cJSON *s, char *name, size_t name_len);

static const char *const js_annotations[] = {"title",    "description", "default",  "examples",
                                             "$schema",  "$id",         "$comment", "deprecated",
                                             "readOnly", "writeOnly",   "$defs",    "definitions"};
static const char *const js_supported[] = {
    "type",      "properties", "required", "additionalProperties",
    "enum",      "const",      "items",    "minItems",
    "maxItems",  "anyOf",      "oneOf",    "$ref",
    "minLength", "maxLength"};

static int in_list(const char *k, const char *const *list, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(k, list[i])) return 1;
    return 0;
}

/* Keys of s other than annotations and those in allowed. */
static const char *other_key(const cJSON *s, const char *const *allowed, size_t n) {
    const cJSON *k;
    cJSON_ArrayForEach(k, s) {
        if (in_list(k->string, js_annotations, sizeof js_annotations / sizeof *js_annotations))
            continue;
        if (!in_list(k->string, allowed, n)) return k->string;
    }
    return NULL;
}

static int get_count(conv *c, const cJSON *s, const char *key, long *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, key);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble != (double)(long)v->valuedouble || v->valuedouble < 0)
        return js_fail(c, TLM_ERR_FORMAT, "'%s' must be an integer >= 0", key);
    if (v->valuedouble > JS_MAX_COUNT)
        return js_fail(c, TLM_ERR_UNSUPPORTED, "'%s' above %d is not supported", key, JS_MAX_COUNT);
    *out = (long)v->valuedouble;
    return 1;
}

/* "{m,n}" (n < 0: unbounded) for GBNF. */
static void sb_rep(sbuf *b, long m, long n) {
    if (n < 0)
        sb_fmt(b, "{%ld,}", m);
    else
        sb_fmt(b, "{%ld,%ld}", m, n);
}

/* Code points of UTF-8 text (valid: it came from cJSON). */
static int decode_cps(const char *s, uint32_t *out, int max) {
    int n = 0;
    const unsigned char *p = (const unsigned char *)s;
    while (*p && n < max) {
        uint32_t cp = *p;
        int k = cp < 0x80 ? 0 : cp < 0xE0 ? 1 : cp < 0xF0 ? 2 : 3;
        if (k) cp &= 0x3Fu >> k;
        p++;
        for (int i = 0; i < k && *p; i++) cp = (cp << 6) | (*p++ & 0x3Fu);
        out[n++] = cp;
    }
    return n;
}

/* A key that is none of the names: a rule per node of the trie of their JSON-escaped forms. At a
 * node, a key may end (unless a name ends there), go on down the trie, or leave it with any
 * other character and then be anything. An escape sequence leaves the trie too, so a key that
 * spells a name with escapes (\u0061 for a) is not caught. */
static int not_names(conv *c, const cJSON *props, int *rule_out) {
    enum { MAXC = 1024 };
    int n_names = cJSON_GetArraySize(props);
    uint32_t **names = calloc((size_t)n_names, sizeof *names);
    int *lens = calloc((size_t)n_names, sizeof *lens);
    int rc = 0;
    if (!names || !lens) {
        free(names), free(lens);
        return js_fail(c, TLM_ERR_NOMEM, "out of memory");
    }
    const cJSON *p;
    int i = 0;
    cJSON_ArrayForEach(p, props) {
        cJSON *str = cJSON_CreateString(p->string);
        char *t = str ? cJSON_PrintUnformatted(str) : NULL;
        cJSON_Delete(str);
        names[i] = malloc(MAXC * sizeof **names);
        if (!t || !names[i]) {
            free(t);
            rc = js_fail(c, TLM_ERR_NOMEM, "out of memory");
            break;
        }
        size_t tl = strlen(t);
        t[tl - 1] = 0; /* drop the quotes */
        lens[i] = decode_cps(t + 1, names[i], MAXC);
        if (lens[i] == MAXC)
            rc = js_fail(c, TLM_ERR_UNSUPPORTED, "a property name over %d characters", MAXC - 1);
        free(t);
        i++;
        if (rc) break;
    }
    /* The trie's nodes are the distinct prefixes; each is visited as (name index, length) of its
     * first occurrence, in a depth-first order driven by a work stack. */
    int *stack_name = NULL, *stack_len = NULL, *stack_rule = NULL, sp = 0;
    if (!rc) {
        int total = 1;
        for (int k = 0; k < n_names; k++) total += lens[k];
        stack_name = malloc((size_t)total * sizeof *stack_name);
        stack_len = malloc((size_t)total * sizeof *stack_len);
        stack_rule = malloc((size_t)total * sizeof *stack_rule);
        if (!stack_name || !stack_len || !stack_rule)
            rc = js_fail(c, TLM_ERR_NOMEM, "out of memory");
    }
    if (!rc) {
        *rule_out = c->n_rules++;
        stack_name[0] = -1; /* the root: the empty prefix */
        stack_len[0] = 0;
        stack_rule[0] = c->n_rules++;
        sp = 1;
        sbuf head = {0};
        sb_fmt(&head, "\"\\\"\" r%d", stack_rule[0]);
        rc = emit(c, *rule_out, &head);
        free(head.s);
    }
    while (!rc && sp) {
        sp--;
        int nm = stack_name[sp], len = stack_len[sp], rule = stack_rule[sp];
        const uint32_t *prefix = nm >= 0 ? names[nm] : NULL;
        sbuf body = {0}, other = {0};
        int ends = 0, first = 1, has_backslash = 0;
        sb_str(&other, "[^\"\\\\\\x00-\\x1F\\x7F");
        /* children: the next characters of the names with this prefix, each once */
        for (int k = 0; k < n_names; k++) {
            if (lens[k] < len || (len && memcmp(names[k], prefix, (size_t)len * sizeof *prefix)))
                continue;
            if (lens[k] == len) {
                ends = 1;
                continue;
            }
            uint32_t ch = names[k][len];
            int seen = 0;
            for (int j = 0; j < k && !seen; j++)
                seen = lens[j] > len && names[j][len] == ch &&
                       (!len || !memcmp(names[j], prefix, (size_t)len * sizeof *prefix));
            if (seen) continue;
            if (ch == '\\') has_backslash = 1;
            int child = c->n_rules++;
            sb_fmt(&body, "%s[\\U%08X] r%d", first ? "" : " | ", ch, child);
            sb_fmt(&other, "\\U%08X", ch);
            first = 0;
            stack_name[sp] = k;
            stack_len[sp] = len + 1;
            stack_rule[sp] = child;
            sp++;
        }
        sb_str(&other, "] char* \"\\\"\"");
        if (!ends) {
            sb_str(&body, first ? "\"\\\"\"" : " | \"\\\"\"");
            first = 0;
        }
        sb_str(&body, first ? "" : " | ");
        sb_add(&body, other.s, other.n);
        if (!has_backslash)
            sb_str(&body, " | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} ) char* \"\\\"\"");
        if (body.oom || other.oom) rc = js_fail(c, TLM_ERR_NOMEM, "out of memory");
        if (!rc) rc = emit(c, rule, &body);
        free(body.s);
        free(other.s);
    }
    for (int k = 0; k < n_names; k++) free(names[k]);
    free(names);
    free(lens);
    free(stack_name);
    free(stack_len);
    free(stack_rule);
    return rc;
}

/* Path segments for messages (truncated where they would overflow). */
static size_t path_push(conv *c, const char *seg) {
    size_t at = strlen(c->path);
    snprintf(c->path + at, sizeof c->path - at, "/%s", seg);
    return at;
}

static int visit_object(conv *c, const cJSON *s, sbuf *body) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (props && !cJSON_IsObject(props))
        return js_fail(c, TLM_ERR_FORMAT, "'properties' must be an object");
    if (req && !cJSON_IsArray(req))
        return js_fail(c, TLM_ERR_FORMAT, "'required' must be an array");
    const cJSON *r;
    cJSON_ArrayForEach(r, req) {
        if (!cJSON_IsString(r)) return js_fail(c, TLM_ERR_FORMAT, "'required' must hold strings");
        if (!props || !cJSON_GetObjectItemCaseSensitive(props, r->valuestring))
            return js_fail(c, TLM_ERR_UNSUPPORTED,
                           "required property '%.60s' is not in 'properties' (give it a schema "
                           "there)",
                           r->valuestring);
    }
    if (add && !cJSON_IsBool(add) && !cJSON_IsObject(add))
        return js_fail(c, TLM_ERR_FORMAT, "'additionalProperties' must be a boolean or a schema");
    int n_props = props ? cJSON_GetArraySize(props) : 0;
    if (!n_props && (!add || cJSON_IsTrue(add))) {
        sb_str(body, "object");
        return 0;
    }
    /* kv rules, required first */
    int n_kv = n_props + 1, n_req = 0, n_opt = 0;
    int *kv = malloc((size_t)n_kv * sizeof *kv), *opt = malloc((size_t)n_kv * sizeof *opt);
    int *reqd = malloc((size_t)n_kv * sizeof *reqd);
    if (!kv || !opt || !reqd) {
        free(kv), free(opt), free(reqd);
        return js_fail(c, TLM_ERR_NOMEM, "out of memory");
    }
    int rc = 0, i = 0, add_kv = -1;
    const cJSON *p;
    cJSON_ArrayForEach(p, props) {
        char vname[32];
        size_t at = path_push(c, "properties");
        path_push(c, p->string);
        rc = visit(c, p, vname, sizeof vname);
        c->path[at] = 0;
        if (rc) break;
        sbuf b = {0};
        cJSON *str = cJSON_CreateString(p->string);
        if (!str || sb_const(c, &b, str)) rc = js_fail(c, TLM_ERR_NOMEM, "out of memory");
        cJSON_Delete(str);
        sb_fmt(&b, " space \":\" space %s", vname);
        kv[i] = c->n_rules++;
        if (!rc) rc = emit(c, kv[i], &b);
        free(b.s);
        if (rc) break;
        int is_req = 0;
        cJSON_ArrayForEach(r, req) is_req |= !strcmp(r->valuestring, p->string);
        if (is_req)
            reqd[n_req++] = kv[i];
        else
            opt[n_opt++] = kv[i];
        i++;
    }
    if (!rc && add && !cJSON_IsFalse(add)) {
        char vname[32] = "value";
        if (cJSON_IsObject(add)) {
            size_t at = path_push(c, "additionalProperties");
            rc = visit(c, add, vname, sizeof vname);
            c->path[at] = 0;
        }
        int key = -1;
        if (!rc && n_props) rc = not_names(c, props, &key);
        sbuf b = {0};
        if (key >= 0)
            sb_fmt(&b, "r%d space \":\" space %s", key, vname);
        else
            sb_fmt(&b, "string space \":\" space %s", vname);
        add_kv = c->n_rules++;
        if (!rc) rc = emit(c, add_kv, &b);
        free(b.s);
    }
    if (!rc) {
        sb_str(body, "\"{\" space");
        for (int k = 0; k < n_req; k++)
            sb_fmt(body, "%s r%d space", k ? " \",\" space" : "", reqd[k]);
        if (n_req) {
            for (int k = 0; k < n_opt; k++) sb_fmt(body, " ( \",\" space r%d space )?", opt[k]);
            if (add_kv >= 0) sb_fmt(body, " ( \",\" space r%d space )*", add_kv);
        } else if (n_opt || add_kv >= 0) {
            /* The first member present takes no comma: one alternative per choice of it, each
             * followed by the members that may come after it. */
            sb_str(body, " (");
            for (int k = 0; k <= n_opt; k++) {
                if (k == n_opt && add_kv < 0) break;
                int first = k < n_opt ? opt[k] : add_kv;
                sb_fmt(body, "%s r%d space", k ? " |" : "", first);
                for (int j = k + 1; j < n_opt; j++)
                    sb_fmt(body, " ( \",\" space r%d space )?", opt[j]);
                if (add_kv >= 0) sb_fmt(body, " ( \",\" space r%d space )*", add_kv);
            }
            sb_str(body, " )?");
        }
        sb_str(body, " \"}\"");
    }
    free(kv);
    free(opt);
    free(reqd);
    return rc;
}

static int visit_array(conv *c, const cJSON *s, sbuf *body) {
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    long lo = 0, hi = -1;
    if (get_count(c, s, "minItems", &lo) < 0 || get_count(c, s, "maxItems", &hi) < 0) return -1;
    if (hi >= 0 && hi < lo) return js_fail(c, TLM_ERR_FORMAT, "maxItems is below minItems");
    char iname[32] = "value";
    if (items) {
        if (cJSON_IsArray(items))
            return js_fail(c, TLM_ERR_UNSUPPORTED, "'items' as a list (tuples) is not supported");
        size_t at = path_push(c, "items");
        int rc = visit(c, items, iname, sizeof iname);
        c->path[at] = 0;
        if (rc) return rc;
    }
    if (hi == 0) {
        sb_str(body, "\"[\" space \"]\"");
    } else if (lo == 0) {
        sb_fmt(body, "\"[\" space ( %s space ( \",\" space %s space )", iname, iname);
        sb_rep(body, 0, hi < 0 ? -1 : hi - 1);
        sb_str(body, " )? \"]\"");
    } else {
        sb_fmt(body, "\"[\" space %s space ( \",\" space %s space )", iname, iname);
        sb_rep(body, lo - 1, hi < 0 ? -1 : hi - 1);
        sb_str(body, " \"]\"");
    }
    return 0;
}

static int visit_string(conv *c, const cJSON *s, sbuf *body) {
    long lo = 0, hi = -1;
    int g1 = get_count(c, s, "minLength", &lo), g2 = get_count(c, s, "maxLength", &hi);
    if (g1 < 0 || g2 < 0) return -1;
    if (hi >= 0 && hi < lo) return js_fail(c, TLM_ERR_FORMAT, "maxLength is below minLength");
    if (!g1 && !g2) {
        sb_str(body, "string");
        return 0;
    }
    sb_str(body, "\"\\\"\" char");
    sb_rep(body, lo, hi);
    sb_str(body, " \"\\\"\"");
    return 0;
}

static int visit_type(conv *c, const cJSON *s, const char *type, sbuf *body) {
    if (!strcmp(type, "object")) return visit_object(c, s, body);
    if (!strcmp(type, "array")) return visit_array(c, s, body);
    if (!strcmp(type, "string")) return visit_string(c, s, body);
    if (!strcmp(type, "number") || !strcmp(type, "integer") || !strcmp(type, "boolean") ||
        !strcmp(type, "null")) {
        sb_str(body, type);
        return 0;
    }
    return js_fail(c, TLM_ERR_UNSUPPORTED, "unknown type '%.40s'", type);
}

static int visit_ref(conv *c, const char *ref, char *name, size_t name_len) {
    for (int i = 0; i < c->n_refs; i++)
        if (!strcmp(c->refs[i].ref, ref)) {
            snprintf(name, name_len, "r%d", c->refs[i].rule);
            return 0;
        }
    const char *key = NULL, *prefixes[] = {"#/$defs/", "#/definitions/"};
    const cJSON *defs = NULL;
    for (int k = 0; k < 2 && !key; k++) {
        size_t pl = strlen(prefixes[k]);
        if (!strncmp(ref, prefixes[k], pl)) {
            key = ref + pl;
            defs = cJSON_GetObjectItemCaseSensitive(c->root, k ? "definitions" : "$defs");
        }
    }
    if (!key)
        return js_fail(c, TLM_ERR_UNSUPPORTED,
                       "$ref '%.80s': only #/$defs/NAME and #/definitions/NAME are supported", ref);
    if (strchr(key, '/') || strchr(key, '~'))
        return js_fail(c, TLM_ERR_UNSUPPORTED,
                       "$ref '%.80s': nested or escaped paths are not supported", ref);
    const cJSON *target = cJSON_IsObject(defs) ? cJSON_GetObjectItemCaseSensitive(defs, key) : NULL;
    if (!target) return js_fail(c, TLM_ERR_FORMAT, "$ref '%.80s' names no definition", ref);
    if (c->n_refs == c->cap_refs) {
        int cap = c->cap_refs ? 2 * c->cap_refs : 16;
        js_ref *nr = realloc(c->refs, (size_t)cap * sizeof *nr);
        if (!nr) return js_fail(c, TLM_ERR_NOMEM, "out of memory");
        c->refs = nr;
        c->cap_refs = cap;
    }
    int rule = c->n_rules++;
    char *copy = malloc(strlen(ref) + 1);
    if (!copy) return js_fail(c, TLM_ERR_NOMEM, "out of memory");
    strcpy(copy, ref);
    c->refs[c->n_refs++] = (js_ref){copy, rule};
    /* recorded before its schema is visited, so that a recursive schema refers to this rule */
    char tname[32];
    char saved[sizeof c->path];
    memcpy(saved, c->path, sizeof saved);
    snprintf(c->path, sizeof c->path, "%s", ref + 1);
    int rc = visit(c, target, tname, sizeof tname);
    memcpy(c->path, saved, sizeof saved);
    if (rc) return rc;
    sbuf b = {0};
    sb_str(&b, tname);
    rc = emit(c, rule, &b);
    free(b.s);
    snprintf(name, name_len, "r%d", rule);
    return rc;
}

/* The rule for schema s: its name into name (a built-in's, or rN). */
static int visit(conv *c, const cJSON *s, char *name, size_t name_len) {
    if (c->st) return -1;
    if (cJSON_IsTrue(s) || (cJSON_IsObject(s) && !s->child)) {
        snprintf(name, name_len, "value");
        return 0;
    }
    if (cJSON_IsFalse(s)) return js_fail(c, TLM_ERR_FORMAT, "the schema false matches nothing");
    if (!cJSON_IsObject(s))
        return js_fail(c, TLM_ERR_FORMAT, "a schema must be an object or a boolean");
    if (++c->depth > JS_MAX_DEPTH)
        return js_fail(c, TLM_ERR_RANGE, "schemas nested deeper than %d", JS_MAX_DEPTH);
    const char *bad = other_key(s, js_supported, sizeof js_supported / sizeof *js_supported);
    if (bad) {
        c->depth--;
        return js_fail(c, TLM_ERR_UNSUPPORTED, "unsupported keyword '%.60s'", bad);
    }
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
    const cJSON *one = cJSON_GetObjectItemCaseSensitive(s, "oneOf");
    const cJSON *cst = cJSON_GetObjectItemCaseSensitive(s, "const");
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    int rc = 0;
    sbuf body = {0};
    if (ref) {
        static const char *const alone[] = {"$ref"};
        if (!cJSON_IsString(ref))
            rc = js_fail(c, TLM_ERR_FORMAT, "'$ref' must be a string");
        else if ((bad = other_key(s, alone, 1)))
            rc = js_fail(c, TLM_ERR_UNSUPPORTED, "'%.60s' beside '$ref' is not supported", bad);
        else
            rc = visit_ref(c, ref->valuestring, name, name_len);
        c->depth--;
        return rc;
    }
    if (any || one) {
        static const char *const alone[] = {"anyOf", "oneOf"};
        const cJSON *list = any ? any : one;
        const char *kw = any ? "anyOf" : "oneOf";
        if (any && one)
            rc = js_fail(c, TLM_ERR_UNSUPPORTED, "'anyOf' and 'oneOf' together are not supported");
        else if ((bad = other_key(s, alone, 2)))
            rc = js_fail(c, TLM_ERR_UNSUPPORTED, "'%.60s' beside '%s' is not supported", bad, kw);
        else if (!cJSON_IsArray(list) || !cJSON_GetArraySize(list))
            rc = js_fail(c, TLM_ERR_FORMAT, "'%s' must be a non-empty array of schemas", kw);
        int k = 0;
        const cJSON *alt;
        cJSON_ArrayForEach(alt, list) {
            if (rc) break;
            char aname[32], idx[16];
            snprintf(idx, sizeof idx, "%d", k);
            size_t at = path_push(c, kw);
            path_push(c, idx);
            rc = visit(c, alt, aname, sizeof aname);
            c->path[at] = 0;
            sb_fmt(&body, "%s%s", k++ ? " | " : "", aname);
        }
    } else if (cst) {
        rc = sb_const(c, &body, cst);
    } else if (en) {
        if (!cJSON_IsArray(en) || !cJSON_GetArraySize(en))
            rc = js_fail(c, TLM_ERR_FORMAT, "'enum' must be a non-empty array");
        const cJSON *v;
        int k = 0;
        cJSON_ArrayForEach(v, en) {
            if (rc) break;
            if (k++) sb_str(&body, " | ");
            rc = sb_const(c, &body, v);
        }
    } else if (type) {
        if (cJSON_IsString(type)) {
            rc = visit_type(c, s, type->valuestring, &body);
        } else if (cJSON_IsArray(type) && cJSON_GetArraySize(type)) {
            const cJSON *t;
            int k = 0;
            cJSON_ArrayForEach(t, type) {
                if (rc) break;
                if (!cJSON_IsString(t)) {
                    rc = js_fail(c, TLM_ERR_FORMAT, "'type' must hold strings");
                    break;
                }
                sbuf one_type = {0};
                rc = visit_type(c, s, t->valuestring, &one_type);
                sb_fmt(&body, "%s( ", k++ ? " | " : "");
                if (one_type.s) sb_add(&body, one_type.s, one_type.n);
                sb_str(&body, " )");
                free(one_type.s);
            }
        } else {
            rc = js_fail(c, TLM_ERR_FORMAT, "'type' must be a string or a non-empty array");
        }
    } else if (cJSON_GetObjectItemCaseSensitive(s, "properties") ||
               cJSON_GetObjectItemCaseSensitive(s, "required") ||
               cJSON_GetObjectItemCaseSensitive(s, "additionalProperties")) {
        rc = visit_type(c, s, "object", &body);
    } else if (cJSON_GetObjectItemCaseSensitive(s, "items") ||
               cJSON_GetObjectItemCaseSensitive(s, "minItems") ||
               cJSON_GetObjectItemCaseSensitive(s, "maxItems")) {
        rc = visit_type(c, s, "array", &body);
    } else if (cJSON_GetObjectItemCaseSensitive(s, "minLength") ||
               cJSON_GetObjectItemCaseSensitive(s, "maxLength")) {
        rc = visit_type(c, s, "string", &body);
    } else {
        sb_str(&body, "value");
    }
    c->depth--;
    if (!rc && body.oom) rc = js_fail(c, TLM_ERR_NOMEM, "out of memory");
    if (!rc) {
        int rule = c->n_rules++;
        rc = emit(c, rule, &body);
        snprintf(name, name_len, "r%d", rule);
    }
    free(body.s);
    return rc;
}

tlm_status tlm_json_schema_to_gbnf(const char *schema, size_t len, char **out) {
    if (!out) return core_err(TLM_ERR_ARG, "JSON schema: out must not be NULL");
    *out = NULL;
    if (!schema) return core_err(TLM_ERR_ARG, "JSON schema: NULL text");
    cJSON *root = cJSON_ParseWithLength(schema, len);
    if (!root) return core_err(TLM_ERR_FORMAT, "JSON schema: not valid JSON");
    conv c = {.root = root};
    char name[32];
    int rc = visit(&c, root, name, sizeof name);
    if (!rc) {
        sb_fmt(&c.out, "root ::= %s\n", name);
        sb_str(&c.out, js_builtin);
        if (c.out.oom) rc = js_fail(&c, TLM_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < c.n_refs; i++) free(c.refs[i].ref);
    free(c.refs);
    cJSON_Delete(root);
    if (rc) {
        free(c.out.s);
        return c.st ? c.st : TLM_ERR_FORMAT;
    }
    *out = c.out.s;
    return TLM_OK;
}

tlm_status tlm_grammar_from_json_schema(const char *schema, size_t len, tlm_grammar **out) {
    if (out) *out = NULL;
    char *gbnf = NULL;
    tlm_status st = tlm_json_schema_to_gbnf(schema, len, &gbnf);
    if (st) return st;
    st = tlm_grammar_parse(gbnf, strlen(gbnf), out);
    if (st) core_err_context(st, "JSON schema");
    free(gbnf);
    return st;
}

tlm_status tlm_grammar_json(tlm_grammar **out) {
    static const char schema[] = "{\"type\": \"object\"}";
    return tlm_grammar_from_json_schema(schema, sizeof schema - 1, out);
}
