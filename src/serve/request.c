/* OpenAI request bodies into srv_request: every field the server uses is type- and range-checked
 * here, so the scheduler and the HTTP layer only ever see valid values. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "serve/serve.h"

int srv_utf8_valid(const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int k;
        unsigned cp, min;
        if ((c & 0xE0) == 0xC0) {
            k = 1, cp = c & 0x1F, min = 0x80;
        } else if ((c & 0xF0) == 0xE0) {
            k = 2, cp = c & 0x0F, min = 0x800;
        } else if ((c & 0xF8) == 0xF0) {
            k = 3, cp = c & 0x07, min = 0x10000;
        } else {
            return 0;
        }
        if (n - i <= (size_t)k) return 0;
        for (int j = 1; j <= k; j++) {
            if ((s[i + j] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + j] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        i += (size_t)k + 1;
    }
    return 1;
}

int srv_fail(srv_error *e, const char *param, const char *fmt, ...) {
    e->status = 400;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

/* The field, or NULL when absent or null (OpenAI clients send explicit nulls for defaults). */
static const cJSON *field(const cJSON *o, const char *name) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, name);
    return f && !cJSON_IsNull(f) ? f : NULL;
}

static int get_number(const cJSON *o, const char *name, double lo, double hi, double *out,
                      srv_error *e) {
    const cJSON *f = field(o, name);
    if (!f) return 0;
    if (!cJSON_IsNumber(f)) return srv_fail(e, name, "'%s' must be a number", name);
    double v = f->valuedouble;
    if (!(v >= lo && v <= hi))
        return srv_fail(e, name, "'%s' is %g; it must be between %g and %g", name, v, lo, hi);
    *out = v;
    return 1;
}

static int get_int(const cJSON *o, const char *name, double lo, double hi, long long *out,
                   srv_error *e) {
    const cJSON *f = field(o, name);
    if (!f) return 0;
    if (!cJSON_IsNumber(f) || f->valuedouble != floor(f->valuedouble))
        return srv_fail(e, name, "'%s' must be an integer", name);
    double v = f->valuedouble;
    if (!(v >= lo && v <= hi))
        return srv_fail(e, name, "'%s' is %.17g; it must be between %.17g and %.17g", name, v, lo,
                        hi);
    *out = (long long)v;
    return 1;
}

static int get_bool(const cJSON *o, const char *name, int *out, srv_error *e) {
    const cJSON *f = field(o, name);
    if (!f) return 0;
    if (!cJSON_IsBool(f)) return srv_fail(e, name, "'%s' must be true or false", name);
    *out = cJSON_IsTrue(f);
    return 1;
}

static char *dup_checked(const char *s, const char *param, srv_error *e) {
    size_t n = strlen(s);
    if (!srv_utf8_valid(s, n)) {
        srv_fail(e, param, "'%s' is not valid UTF-8", param);
        return NULL;
    }
    char *d = malloc(n + 1);
    if (!d) {
        srv_fail(e, param, "out of memory");
        e->status = 500;
        return NULL;
    }
    memcpy(d, s, n + 1);
    return d;
}

/* Message content: a string, or an array of parts of which the text ones are joined. */
static char *content_text(const cJSON *c, srv_error *e) {
    if (!c) return dup_checked("", "messages", e);
    if (cJSON_IsString(c)) return dup_checked(c->valuestring, "messages", e);
    if (!cJSON_IsArray(c)) {
        srv_fail(e, "messages", "a message's 'content' must be a string or an array of parts");
        return NULL;
    }
    size_t total = 1;
    const cJSON *p;
    cJSON_ArrayForEach(p, c) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(text)) {
            srv_fail(e, "messages", "content parts must be {\"type\": \"text\", \"text\": ...}");
            return NULL;
        }
        total += strlen(text->valuestring);
    }
    char *out = malloc(total), *w = out;
    if (!out) {
        srv_fail(e, "messages", "out of memory");
        return NULL;
    }
    cJSON_ArrayForEach(p, c) {
        const char *t = cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring;
        size_t n = strlen(t);
        memcpy(w, t, n);
        w += n;
    }
    *w = 0;
    if (!srv_utf8_valid(out, (size_t)(w - out))) {
        free(out);
        srv_fail(e, "messages", "'messages' is not valid UTF-8");
        return NULL;
    }
    return out;
}

static int parse_messages(const cJSON *root, srv_request *r, srv_error *e) {
    const cJSON *ms = field(root, "messages");
    if (!ms) return srv_fail(e, "messages", "'messages' is required");
    if (!cJSON_IsArray(ms) || cJSON_GetArraySize(ms) == 0)
        return srv_fail(e, "messages", "'messages' must be a non-empty array");
    int n = cJSON_GetArraySize(ms);
    r->messages = calloc((size_t)n, sizeof *r->messages);
    if (!r->messages) return srv_fail(e, "messages", "out of memory");
    const cJSON *m;
    cJSON_ArrayForEach(m, ms) {
        if (!cJSON_IsObject(m)) return srv_fail(e, "messages", "each message must be an object");
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsString(role))
            return srv_fail(e, "messages", "each message needs a 'role' string");
        const char *ro = role->valuestring;
        if (strcmp(ro, "system") && strcmp(ro, "developer") && strcmp(ro, "user") &&
            strcmp(ro, "assistant") && strcmp(ro, "tool"))
            return srv_fail(e, "messages",
                            "role '%.40s' is not one of system, developer, user, assistant, tool",
                            ro);
        srv_message *dst = &r->messages[r->n_messages++];
        if (!(dst->role = dup_checked(ro, "messages", e))) return -1;
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (c && cJSON_IsNull(c)) c = NULL;
        if (!c && strcmp(ro, "assistant"))
            return srv_fail(e, "messages", "a %s message needs 'content'", ro);
        if (!(dst->content = content_text(c, e))) return -1;
        const cJSON *id = field(m, "tool_call_id");
        if (id && !strcmp(ro, "tool")) {
            if (!cJSON_IsString(id))
                return srv_fail(e, "messages", "'tool_call_id' must be a string");
            if (!(dst->tool_call_id = dup_checked(id->valuestring, "messages", e))) return -1;
        }
        const cJSON *tc = field(m, "tool_calls");
        if (tc && !strcmp(ro, "assistant")) {
            if (!cJSON_IsArray(tc)) return srv_fail(e, "messages", "'tool_calls' must be an array");
            const cJSON *call;
            cJSON_ArrayForEach(call, tc) {
                const cJSON *fn = cJSON_IsObject(call) ? field(call, "function") : NULL;
                if (!cJSON_IsObject(fn) || !cJSON_IsString(field(fn, "name")))
                    return srv_fail(e, "messages",
                                    "each tool call needs \"function\": {\"name\", \"arguments\"}");
            }
            if (!(dst->tool_calls = cJSON_PrintUnformatted(tc)))
                return srv_fail(e, "messages", "out of memory");
        }
    }
    return 0;
}

static int parse_prompt(const cJSON *root, srv_request *r, srv_error *e) {
    const cJSON *p = field(root, "prompt");
    if (!p) return srv_fail(e, "prompt", "'prompt' is required");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && cJSON_IsString(p->child)) p = p->child;
    if (cJSON_IsString(p)) {
        r->prompt = dup_checked(p->valuestring, "prompt", e);
        return r->prompt ? 0 : -1;
    }
    if (!cJSON_IsArray(p) || cJSON_GetArraySize(p) == 0)
        return srv_fail(e, "prompt", "'prompt' must be a string, or an array of token ids");
    int n = cJSON_GetArraySize(p);
    const cJSON *x;
    int texts = 0;
    cJSON_ArrayForEach(x, p) texts += cJSON_IsString(x);
    if (r->native && texts) { /* llama-server's mixed prompt: ids and text in one sequence */
        r->pieces = calloc((size_t)n, sizeof *r->pieces);
        if (!r->pieces) return srv_fail(e, "prompt", "out of memory");
        cJSON_ArrayForEach(x, p) {
            srv_prompt_piece *pc = &r->pieces[r->n_pieces++];
            pc->id = -1;
            if (cJSON_IsString(x)) {
                if (!(pc->text = dup_checked(x->valuestring, "prompt", e))) return -1;
            } else if (cJSON_IsNumber(x) && x->valuedouble == floor(x->valuedouble) &&
                       x->valuedouble >= 0 && x->valuedouble < TLM_MAX_VOCAB_SIZE) {
                pc->id = (int32_t)x->valuedouble;
            } else {
                return srv_fail(e, "prompt",
                                "'prompt' as an array holds token ids and strings (one prompt; "
                                "several prompts in one request are not supported)");
            }
        }
        return 0;
    }
    r->prompt_ids = malloc((size_t)n * sizeof *r->prompt_ids);
    if (!r->prompt_ids) return srv_fail(e, "prompt", "out of memory");
    cJSON_ArrayForEach(x, p) {
        if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) ||
            !(x->valuedouble >= 0 && x->valuedouble < TLM_MAX_VOCAB_SIZE))
            return srv_fail(
                e, "prompt",
                "'prompt' as an array holds token ids (integers >= 0); several prompts in "
                "one request are not supported");
        r->prompt_ids[r->n_prompt_ids++] = (int32_t)x->valuedouble;
    }
    return 0;
}

static int parse_stop(const cJSON *root, srv_request *r, srv_error *e) {
    const cJSON *s = field(root, "stop");
    if (!s) return 0;
    if (cJSON_IsString(s)) {
        if (!*s->valuestring) return 0;
        return (r->stop[r->n_stop++] = dup_checked(s->valuestring, "stop", e)) ? 0 : -1;
    }
    if (!cJSON_IsArray(s))
        return srv_fail(e, "stop", "'stop' must be a string or an array of them");
    if (cJSON_GetArraySize(s) > SRV_MAX_STOP)
        return srv_fail(e, "stop", "'stop' holds at most %d strings", SRV_MAX_STOP);
    const cJSON *x;
    cJSON_ArrayForEach(x, s) {
        if (!cJSON_IsString(x)) return srv_fail(e, "stop", "'stop' must hold strings");
        if (!*x->valuestring) continue;
        if (!(r->stop[r->n_stop++] = dup_checked(x->valuestring, "stop", e))) return -1;
    }
    return 0;
}

/* [{"id": int, "scale": number}, ...] (llama-server's form) into ids and scales. */
static int parse_lora_list(const cJSON *l, int *ids, float *scales, int *n, const char *param,
                           srv_error *e) {
    if (!cJSON_IsArray(l))
        return srv_fail(e, param, "'%s' must be a list of {\"id\", \"scale\"}", param);
    *n = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, l) {
        const cJSON *id = cJSON_IsObject(x) ? cJSON_GetObjectItemCaseSensitive(x, "id") : NULL;
        const cJSON *sc = cJSON_IsObject(x) ? cJSON_GetObjectItemCaseSensitive(x, "scale") : NULL;
        if (!cJSON_IsNumber(id) || id->valuedouble != (int)id->valuedouble || id->valuedouble < 0)
            return srv_fail(e, param, "each '%s' entry needs an integer \"id\" >= 0", param);
        if (!cJSON_IsNumber(sc) || !(sc->valuedouble >= -100 && sc->valuedouble <= 100))
            return srv_fail(e, param, "each '%s' entry needs a \"scale\" in [-100, 100]", param);
        if (*n == SRV_MAX_LORA)
            return srv_fail(e, param, "'%s' lists more than %d adapters", param, SRV_MAX_LORA);
        ids[*n] = (int)id->valuedouble;
        scales[*n] = (float)sc->valuedouble;
        (*n)++;
    }
    return 0;
}

static int parse_lora(const cJSON *root, srv_request *r, srv_error *e) {
    const cJSON *l = field(root, "lora");
    if (!l) return 0;
    r->lora_given = 1;
    return parse_lora_list(l, r->lora_id, r->lora_scale, &r->n_lora, "lora", e);
}

char *srv_lora_list_json(const srv_lora_set *s) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < s->n; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "id", i);
        cJSON_AddStringToObject(o, "path", s->path[i]);
        cJSON_AddNumberToObject(o, "scale", s->scale[i]);
        cJSON_AddItemToArray(a, o);
    }
    char *out = a ? cJSON_PrintUnformatted(a) : NULL;
    cJSON_Delete(a);
    return out;
}

int srv_lora_post(srv_lora_set *s, const char *body, size_t len, srv_error *e) {
    memset(e, 0, sizeof *e);
    cJSON *root = cJSON_ParseWithLength(body, len);
    int ids[SRV_MAX_LORA], n = 0;
    float sc[SRV_MAX_LORA];
    int rc = root ? parse_lora_list(root, ids, sc, &n, "body", e)
                  : srv_fail(e, NULL, "the body is not valid JSON");
    cJSON_Delete(root);
    for (int i = 0; !rc && i < n; i++)
        if (ids[i] >= s->n)
            rc = srv_fail(e, "id", "no adapter %d (the server has %d)", ids[i], s->n);
    if (rc) return rc;
    for (int i = 0; i < s->n; i++) s->scale[i] = 0.0f;
    for (int i = 0; i < n; i++) s->scale[ids[i]] = sc[i];
    return 0;
}

int srv_lora_scales(const srv_lora_set *s, const srv_request *r, float *out, srv_error *e) {
    memset(e, 0, sizeof *e);
    if (!r->lora_given) {
        for (int i = 0; i < s->n; i++) out[i] = s->scale[i];
        return 0;
    }
    for (int i = 0; i < s->n; i++) out[i] = 0.0f;
    for (int i = 0; i < r->n_lora; i++) {
        if (r->lora_id[i] >= s->n)
            return srv_fail(e, "lora", "no adapter %d (the server has %d: GET /lora-adapters)",
                            r->lora_id[i], s->n);
        out[r->lora_id[i]] = r->lora_scale[i];
    }
    return 0;
}

/* One logit_bias entry: key an id (a number, or a string of digits in the object form) or text. */
static int add_bias(srv_request *r, const cJSON *key, const char *key_text, const cJSON *v,
                    srv_error *e) {
    if (r->n_bias == SRV_MAX_BIAS)
        return srv_fail(e, "logit_bias", "'logit_bias' holds at most %d entries", SRV_MAX_BIAS);
    srv_bias *b = &r->bias[r->n_bias];
    b->id = -1;
    if (cJSON_IsFalse(v)) {
        b->bias = -INFINITY;
    } else if (cJSON_IsNumber(v) && isfinite(v->valuedouble)) {
        b->bias = (float)v->valuedouble;
    } else {
        return srv_fail(e, "logit_bias", "a 'logit_bias' value must be a number (or false: never)");
    }
    const char *digits = key_text;
    if (key && cJSON_IsNumber(key)) {
        if (key->valuedouble != floor(key->valuedouble) || !(key->valuedouble >= 0) ||
            key->valuedouble >= TLM_MAX_VOCAB_SIZE)
            return srv_fail(e, "logit_bias", "a 'logit_bias' token id must be an integer >= 0");
        b->id = (int32_t)key->valuedouble;
    } else if (key && cJSON_IsString(key)) {
        digits = NULL;
        if (!(b->text = dup_checked(key->valuestring, "logit_bias", e))) return -1;
    } else if (!key && digits) {
        char *end;
        long long id = strtoll(digits, &end, 10);
        if (*digits && !*end && id >= 0 && id < TLM_MAX_VOCAB_SIZE) {
            b->id = (int32_t)id;
        } else if (!(b->text = dup_checked(digits, "logit_bias", e))) {
            return -1;
        }
    } else {
        return srv_fail(e, "logit_bias", "'logit_bias' entries are [token id or text, bias] pairs");
    }
    r->n_bias++;
    return 0;
}

/* OpenAI's {"id": bias}, llama-server's [[id or text, bias or false], ...] (or the object). */
static int parse_bias(const cJSON *root, srv_request *r, srv_error *e) {
    const cJSON *lb = field(root, "logit_bias");
    if (!lb) return 0;
    if (!cJSON_IsObject(lb) && !cJSON_IsArray(lb))
        return srv_fail(e, "logit_bias", "'logit_bias' must be an object or an array of pairs");
    int n = cJSON_GetArraySize(lb);
    if (n > SRV_MAX_BIAS)
        return srv_fail(e, "logit_bias", "'logit_bias' holds at most %d entries", SRV_MAX_BIAS);
    r->bias = calloc((size_t)(n > 0 ? n : 1), sizeof *r->bias);
    if (!r->bias) return srv_fail(e, "logit_bias", "out of memory");
    const cJSON *x;
    cJSON_ArrayForEach(x, lb) {
        if (cJSON_IsObject(lb)) {
            if (add_bias(r, NULL, x->string, x, e)) return -1;
        } else {
            if (!cJSON_IsArray(x) || cJSON_GetArraySize(x) != 2)
                return srv_fail(e, "logit_bias",
                                "'logit_bias' entries are [token id or text, bias] pairs");
            if (add_bias(r, cJSON_GetArrayItem(x, 0), NULL, cJSON_GetArrayItem(x, 1), e)) return -1;
        }
    }
    return 0;
}

/* llama-server's /completion fields: n_probs, return_tokens, its samplers list, and the samplers
 * tlm lacks, accepted only at the values that leave them off. */
static int parse_native(const cJSON *root, srv_request *r, srv_error *e) {
    long long iv;
    double dv = 0;
    int got, flag = 0;
    if ((got = get_int(root, "n_probs", 0, 1 << 20, &iv, e)) < 0) return -1;
    if (got && iv > 0) {
        r->logprobs = 1;
        r->top_logprobs = iv < SRV_MAX_TOP_LOGPROBS ? (int)iv : SRV_MAX_TOP_LOGPROBS;
    }
    if (get_bool(root, "return_tokens", &r->return_tokens, e) < 0) return -1;
    /* accepted: tlm always reuses a cached prefix, and picks its own slot */
    if (get_bool(root, "cache_prompt", &flag, e) < 0) return -1;
    if (get_int(root, "id_slot", -1, 1 << 20, &iv, e) < 0) return -1;
    if (get_int(root, "n_keep", -1, TLM_MAX_CONTEXT_LENGTH, &iv, e) < 0) return -1;
    if ((got = get_int(root, "n_cmpl", 1, 1, &iv, e)) < 0) return -1;
    static const struct {
        const char *name;
        double off;
    } neutral[] = {{"mirostat", 0},         {"typical_p", 1},       {"dynatemp_range", 0},
                   {"dry_multiplier", 0},   {"xtc_probability", 0}, {"n_indent", 0},
                   {"t_max_predict_ms", 0}, {"top_n_sigma", -1}};
    for (size_t i = 0; i < sizeof neutral / sizeof neutral[0]; i++) {
        if ((got = get_number(root, neutral[i].name, -1e9, 1e9, &dv, e)) < 0) return -1;
        if (got && dv != neutral[i].off)
            return srv_fail(e, neutral[i].name, "'%s' is not supported by tlm serve (only %g: off)",
                            neutral[i].name, neutral[i].off);
    }
    int post = 0;
    if (get_bool(root, "post_sampling_probs", &post, e) < 0) return -1;
    if (post)
        return srv_fail(
            e, "post_sampling_probs",
            "'post_sampling_probs' is not supported by tlm serve (n_probs gives logprobs)");
    const cJSON *sm = field(root, "samplers");
    if (sm) {
        /* which of tlm's samplers run: those listed (tlm applies them in its own order) */
        if (!cJSON_IsArray(sm))
            return srv_fail(e, "samplers", "'samplers' must be an array of names");
        int top_k = 0, top_p = 0, min_p = 0, temp = 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, sm) {
            if (!cJSON_IsString(x)) return srv_fail(e, "samplers", "'samplers' holds names");
            const char *s = x->valuestring;
            if (!strcmp(s, "top_k") || !strcmp(s, "k"))
                top_k = 1;
            else if (!strcmp(s, "top_p") || !strcmp(s, "p"))
                top_p = 1;
            else if (!strcmp(s, "min_p") || !strcmp(s, "m"))
                min_p = 1;
            else if (!strcmp(s, "temperature") || !strcmp(s, "t"))
                temp = 1;
            else if (strcmp(s, "dry") && strcmp(s, "typ_p") && strcmp(s, "typical_p") &&
                     strcmp(s, "xtc") && strcmp(s, "penalties") && strcmp(s, "infill") &&
                     strcmp(s, "top_n_sigma") && strcmp(s, "d") && strcmp(s, "y") &&
                     strcmp(s, "x") && strcmp(s, "e") && strcmp(s, "i") && strcmp(s, "s"))
                return srv_fail(e, "samplers", "'samplers': unknown sampler '%.40s'", s);
        }
        if (!top_k) r->sampling.top_k = 0;
        if (!top_p) r->sampling.top_p = 1.0f;
        if (!min_p) r->sampling.min_p = 0.0f;
        if (!temp && r->sampling.temperature > 0.0f) r->sampling.temperature = 1.0f;
    }
    return 0;
}

/* tools, tool_choice and parallel_tool_calls (chat). */
static int parse_tools(const cJSON *root, srv_request *r, srv_error *e) {
    r->parallel_tools = 1;
    const cJSON *tools = field(root, "tools"), *choice = field(root, "tool_choice");
    if (get_bool(root, "parallel_tool_calls", &r->parallel_tools, e) < 0) return -1;
    if (!tools) {
        if (choice && !(cJSON_IsString(choice) && !strcmp(choice->valuestring, "none")) &&
            !(cJSON_IsString(choice) && !strcmp(choice->valuestring, "auto")))
            return srv_fail(e, "tool_choice", "'tool_choice' needs 'tools'");
        return 0;
    }
    if (!cJSON_IsArray(tools)) return srv_fail(e, "tools", "'tools' must be an array");
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *type = cJSON_IsObject(t) ? field(t, "type") : NULL;
        const cJSON *fn = cJSON_IsObject(t) ? field(t, "function") : NULL;
        const cJSON *name = fn ? field(fn, "name") : NULL,
                    *params = fn ? field(fn, "parameters") : NULL;
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") || !cJSON_IsObject(fn))
            return srv_fail(e, "tools",
                            "each tool must be {\"type\": \"function\", \"function\": {...}}");
        if (!cJSON_IsString(name) || !*name->valuestring || strlen(name->valuestring) > 64 ||
            strspn(name->valuestring, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                      "0123456789_-") != strlen(name->valuestring))
            return srv_fail(e, "tools",
                            "a function's 'name' must be 1 to 64 of a-z, A-Z, 0-9, _ and -");
        if (params && !cJSON_IsObject(params))
            return srv_fail(e, "tools", "a function's 'parameters' must be a JSON Schema object");
        r->n_tools++;
    }
    if (!r->n_tools) return 0;
    if (!(r->tools = cJSON_PrintUnformatted(tools))) return srv_fail(e, "tools", "out of memory");
    if (!choice) return 0;
    if (cJSON_IsString(choice)) {
        const char *c = choice->valuestring;
        r->tool_choice = !strcmp(c, "auto")       ? SRV_TOOLS_AUTO
                         : !strcmp(c, "none")     ? SRV_TOOLS_NONE
                         : !strcmp(c, "required") ? SRV_TOOLS_REQUIRED
                                                  : -1;
        if (r->tool_choice < 0)
            return srv_fail(e, "tool_choice",
                            "'tool_choice' must be auto, none, required or a function");
        return 0;
    }
    const cJSON *fn = cJSON_IsObject(choice) ? field(choice, "function") : NULL;
    const cJSON *name = fn ? field(fn, "name") : NULL;
    if (!cJSON_IsString(name))
        return srv_fail(
            e, "tool_choice",
            "'tool_choice' names a function as {\"type\": \"function\", \"function\": {\"name\"}}");
    int found = 0;
    cJSON_ArrayForEach(t, tools) found |=
        !strcmp(field(field(t, "function"), "name")->valuestring, name->valuestring);
    if (!found)
        return srv_fail(e, "tool_choice",
                        "'tool_choice' names '%.64s', which 'tools' does not have",
                        name->valuestring);
    r->tool_choice = SRV_TOOLS_NAMED;
    if (!(r->tool_name = dup_checked(name->valuestring, "tool_choice", e))) return -1;
    return 0;
}

/* A schema (object or boolean) compiled into r->grammar. */
static int compile_schema(const cJSON *schema, srv_request *r, const char *param, srv_error *e) {
    char *text = cJSON_PrintUnformatted(schema);
    if (!text) return srv_fail(e, param, "out of memory");
    tlm_status st = tlm_grammar_from_json_schema(text, strlen(text), &r->grammar);
    free(text);
    if (st) return srv_fail(e, param, "'%s': %s", param, tlm_last_error());
    return 0;
}

/* response_format (OpenAI), json_schema and grammar (llama-server): at most one of them. */
static int parse_structured(const cJSON *root, srv_request *r, srv_error *e) {
    const cJSON *rf = field(root, "response_format"), *js = field(root, "json_schema");
    const cJSON *gr = field(root, "grammar");
    const cJSON *rf_type = rf ? cJSON_GetObjectItemCaseSensitive(rf, "type") : NULL;
    if (rf && (!cJSON_IsObject(rf) || !cJSON_IsString(rf_type)))
        return srv_fail(e, "response_format", "'response_format' must be an object with a 'type'");
    /* {"type": "text"} asks for what comes without it */
    if (rf && !strcmp(rf_type->valuestring, "text")) rf = NULL;
    if (gr && cJSON_IsString(gr) && !*gr->valuestring) gr = NULL; /* llama-server's "" is none */
    if ((rf != NULL) + (js != NULL) + (gr != NULL) > 1)
        return srv_fail(e, rf ? "response_format" : "json_schema",
                        "give one of 'response_format', 'json_schema' and 'grammar'");
    if (gr) {
        if (!cJSON_IsString(gr)) return srv_fail(e, "grammar", "'grammar' must be a string (GBNF)");
        if (tlm_grammar_parse(gr->valuestring, strlen(gr->valuestring), &r->grammar))
            return srv_fail(e, "grammar", "'grammar': %s", tlm_last_error());
        return 0;
    }
    if (js) {
        if (!cJSON_IsObject(js) && !cJSON_IsBool(js))
            return srv_fail(e, "json_schema", "'json_schema' must be a JSON Schema (an object)");
        return compile_schema(js, r, "json_schema", e);
    }
    if (!rf) return 0;
    const char *type = rf_type->valuestring;
    if (!strcmp(type, "json_object")) {
        /* llama-server takes a schema here too */
        const cJSON *schema = field(rf, "schema");
        if (schema) return compile_schema(schema, r, "response_format", e);
        if (tlm_grammar_json(&r->grammar))
            return srv_fail(e, "response_format", "'response_format': %s", tlm_last_error());
        return 0;
    }
    if (!strcmp(type, "json_schema")) {
        const cJSON *w = field(rf, "json_schema");
        if (!cJSON_IsObject(w))
            return srv_fail(e, "response_format",
                            "'response_format' of type json_schema needs 'json_schema': {\"name\", "
                            "\"schema\"}");
        const cJSON *schema = field(w, "schema"), *strict = field(w, "strict");
        if (strict && !cJSON_IsBool(strict))
            return srv_fail(e, "response_format", "'json_schema.strict' must be true or false");
        if (!schema) { /* a name alone: any JSON object */
            if (tlm_grammar_json(&r->grammar))
                return srv_fail(e, "response_format", "'response_format': %s", tlm_last_error());
            return 0;
        }
        return compile_schema(schema, r, "response_format", e);
    }
    return srv_fail(
        e, "response_format",
        "'response_format.type' is '%.40s'; it must be text, json_object or json_schema", type);
}

int srv_request_parse(const char *body, size_t len, int shape, srv_request *r, srv_error *e) {
    return srv_request_parse_with(body, len, shape, NULL, r, e);
}

static void apply_defaults(const srv_defaults *d, srv_request *r) {
    const tlm_sampler_opts *s = &d->sampling;
    tlm_sampler_opts *o = &r->sampling;
    if (d->set & SRV_SET_TEMP) o->temperature = s->temperature;
    if (d->set & SRV_SET_TOP_K) o->top_k = s->top_k;
    if (d->set & SRV_SET_TOP_P) o->top_p = s->top_p;
    if (d->set & SRV_SET_MIN_P) o->min_p = s->min_p;
    if (d->set & SRV_SET_REPEAT) o->repeat_penalty = s->repeat_penalty;
    if (d->set & SRV_SET_LAST_N) o->penalty_last_n = s->penalty_last_n;
    if (d->set & SRV_SET_PRESENCE) o->presence_penalty = s->presence_penalty;
    if (d->set & SRV_SET_FREQUENCY) o->frequency_penalty = s->frequency_penalty;
    if (d->set & SRV_SET_N_PREDICT) r->max_tokens = d->max_tokens;
    if (d->set & SRV_SET_SEED) {
        o->seed = s->seed;
        r->seed_given = 1;
    }
}

int srv_request_parse_with(const char *body, size_t len, int shape, const srv_defaults *d,
                           srv_request *r, srv_error *e) {
    memset(r, 0, sizeof *r);
    memset(e, 0, sizeof *e);
    int chat = shape == SRV_CHAT;
    r->chat = chat;
    r->native = shape == SRV_NATIVE;
    r->max_tokens = -1;
    r->n = 1;
    r->spec_n_max = r->spec_n_min = -1;
    r->spec_p_min = -1.0f;
    tlm_sampler_opts_defaults(&r->sampling);
    if (r->native) { /* llama-server's defaults */
        r->sampling.min_p = 0.05f;
    } else { /* OpenAI's */
        r->sampling.temperature = 1.0f;
        r->sampling.top_k = 0;
        r->sampling.top_p = 1.0f;
    }
    if (d) apply_defaults(d, r);
    cJSON *root = cJSON_ParseWithLength(body, len);
    int rc = -1;
    if (!root) {
        srv_fail(e, NULL, "the body is not valid JSON");
        goto done;
    }
    if (!cJSON_IsObject(root)) {
        srv_fail(e, NULL, "the body must be a JSON object");
        goto done;
    }
    if (chat ? parse_messages(root, r, e) : parse_prompt(root, r, e)) goto done;
    long long iv;
    double dv;
    int got;
    const cJSON *model = field(root, "model");
    if (model) {
        if (!cJSON_IsString(model)) {
            srv_fail(e, "model", "'model' must be a string");
            goto done;
        }
        if (!(r->model = dup_checked(model->valuestring, "model", e))) goto done;
    }
    /* max_completion_tokens is the newer name; either may come. */
    const char *mt_names[] = {"max_tokens", "max_completion_tokens", "n_predict"};
    for (int i = 0; i < 3; i++) {
        if ((got = get_int(root, mt_names[i], -1, TLM_MAX_CONTEXT_LENGTH, &iv, e)) < 0) goto done;
        if (got) r->max_tokens = (int)iv;
    }
    if ((got = get_number(root, "temperature", 0, 100, &dv, e)) < 0) goto done;
    if (got) r->sampling.temperature = (float)dv;
    if ((got = get_number(root, "top_p", 0, 1, &dv, e)) < 0) goto done;
    if (got) r->sampling.top_p = dv > 0 ? (float)dv : 1e-6f;
    if ((got = get_int(root, "top_k", 0, TLM_MAX_VOCAB_SIZE, &iv, e)) < 0) goto done;
    if (got) r->sampling.top_k = (int)iv;
    if ((got = get_number(root, "min_p", 0, 1, &dv, e)) < 0) goto done;
    if (got) r->sampling.min_p = (float)dv;
    if ((got = get_number(root, "presence_penalty", -2, 2, &dv, e)) < 0) goto done;
    if (got) r->sampling.presence_penalty = (float)dv;
    if ((got = get_number(root, "frequency_penalty", -2, 2, &dv, e)) < 0) goto done;
    if (got) r->sampling.frequency_penalty = (float)dv;
    if ((got = get_number(root, "repeat_penalty", 0, 10, &dv, e)) < 0) goto done;
    if (got) r->sampling.repeat_penalty = (float)dv;
    if ((got = get_int(root, "repeat_last_n", 1, 1 << 20, &iv, e)) < 0) goto done;
    if (got) r->sampling.penalty_last_n = (int)iv;
    if ((got = get_int(root, "seed", -9007199254740991.0, 9007199254740991.0, &iv, e)) < 0)
        goto done;
    if (got && r->native && iv == -1) { /* llama-server's -1: a random seed */
        r->seed_given = 0;
    } else if (got) {
        r->sampling.seed = (uint64_t)iv;
        r->seed_given = 1;
    }
    if ((got = get_int(root, "n", 1, SRV_MAX_N, &iv, e)) < 0) goto done;
    if (got && !r->native) r->n = (int)iv; /* not a /completion field: one answer */
    if (parse_stop(root, r, e)) goto done;
    if (get_bool(root, "stream", &r->stream, e) < 0) goto done;
    if (get_bool(root, "echo", &r->echo, e) < 0) goto done;
    if (r->echo && (chat || r->native)) {
        srv_fail(e, "echo", "'echo' is for /v1/completions");
        goto done;
    }
    const cJSON *so = field(root, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so)) {
            srv_fail(e, "stream_options", "'stream_options' must be an object");
            goto done;
        }
        if (get_bool(so, "include_usage", &r->include_usage, e) < 0) goto done;
    }
    /* Chat: logprobs is a boolean and top_logprobs a count; completions: logprobs is the count;
     * llama-server's: n_probs. */
    if (r->native) {
        if (parse_native(root, r, e)) goto done;
    } else if (chat) {
        if (get_bool(root, "logprobs", &r->logprobs, e) < 0) goto done;
        if ((got = get_int(root, "top_logprobs", 0, SRV_MAX_TOP_LOGPROBS, &iv, e)) < 0) goto done;
        if (got) {
            if (!r->logprobs) {
                srv_fail(e, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
                goto done;
            }
            r->top_logprobs = (int)iv;
        }
    } else {
        if ((got = get_int(root, "logprobs", 0, SRV_MAX_TOP_LOGPROBS, &iv, e)) < 0) goto done;
        if (got) {
            r->logprobs = 1;
            r->top_logprobs = (int)iv;
        }
    }
    if (parse_lora(root, r, e)) goto done;
    if (parse_structured(root, r, e)) goto done;
    if (parse_bias(root, r, e)) goto done;
    if (chat && parse_tools(root, r, e)) goto done;
    if (chat && r->tools && r->tool_choice >= SRV_TOOLS_REQUIRED) {
        if (r->grammar) {
            srv_fail(e, "tool_choice",
                     "a required tool call and a response format exclude each other");
            goto done;
        }
        if (srv_tools_grammar(r, &r->grammar, e)) goto done;
    }
    if (get_bool(root, "ignore_eos", &r->ignore_eos, e) < 0) goto done;
    /* llama-server's speculative decoding fields (a server without a draft model or lookup
     * ignores them, as llama-server does); n_max 0 turns speculation off for the request */
    if ((got = get_int(root, "speculative.n_max", 0, 1 << 20, &iv, e)) < 0) goto done;
    if (got) r->spec_n_max = (int)iv;
    if ((got = get_int(root, "speculative.n_min", 0, 1 << 20, &iv, e)) < 0) goto done;
    if (got) r->spec_n_min = (int)iv;
    if ((got = get_number(root, "speculative.p_min", 0, 1, &dv, e)) < 0) goto done;
    if (got) r->spec_p_min = (float)dv;
    rc = 0;
done:
    cJSON_Delete(root);
    if (rc) srv_request_free(r);
    return rc;
}

void srv_request_free(srv_request *r) {
    if (!r) return;
    free(r->prompt);
    free(r->prompt_ids);
    srv_messages_free(r->messages, r->n_messages);
    free(r->tools);
    free(r->tool_name);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->model);
    tlm_grammar_free(r->grammar);
    for (int i = 0; i < r->n_pieces; i++) free(r->pieces[i].text);
    free(r->pieces);
    for (int i = 0; i < r->n_bias; i++) free(r->bias[i].text);
    free(r->bias);
    memset(r, 0, sizeof *r);
}
