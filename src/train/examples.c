/* Instruction and preference data: JSON Lines of plain text, prompt/completion pairs, chat
 * conversations or preference pairs, tokenized once into examples whose tokens carry a flag: the
 * loss predicts them or not. Chats are rendered by tlm serve's templates, so training sees the
 * tokens serving will (tlm_chat_render). The batches a trainer draws from them are rows of whole
 * examples, one to a row or packed several to a row (trn_plan). */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "tlm.h"
#include "train/train.h"

struct tlm_examples {
    int32_t *ids;     /* every example's tokens, back to back */
    uint8_t *trained; /* [n_tokens]: 1 where the loss predicts the token */
    size_t *start;    /* [n + 1]: where each example begins */
    size_t n, n_tokens, cap_tokens, cap_n;
    int pairs; /* preference pairs: example 2i is chosen, 2i + 1 rejected */
};

static const char *const format_names[] = {"auto", "text", "completion", "chat", "dpo"};
static const char *const loss_on_names[] = {"default", "all", "assistant", "completion"};

const char *tlm_data_format_name(tlm_data_format f) {
    return (unsigned)f <= TLM_FORMAT_DPO ? format_names[f] : "?";
}

tlm_status tlm_data_format_parse(const char *name, tlm_data_format *out) {
    for (int i = 0; i <= TLM_FORMAT_DPO; i++)
        if (!strcmp(name, format_names[i])) {
            *out = (tlm_data_format)i;
            return TLM_OK;
        }
    return core_err(TLM_ERR_ARG, "data format '%s': expected text, completion, chat or dpo", name);
}

tlm_status tlm_loss_on_parse(const char *name, tlm_loss_on *out) {
    for (int i = 1; i <= TLM_LOSS_ON_COMPLETION; i++)
        if (!strcmp(name, loss_on_names[i])) {
            *out = (tlm_loss_on)i;
            return TLM_OK;
        }
    return core_err(TLM_ERR_ARG, "loss-on '%s': expected all, assistant or completion", name);
}

void tlm_examples_opts_defaults(tlm_examples_opts *o) {
    memset(o, 0, sizeof *o);
    o->max_len = 512;
}

void tlm_examples_free(tlm_examples *e) {
    if (!e) return;
    free(e->ids);
    free(e->trained);
    free(e->start);
    free(e);
}

size_t tlm_examples_count(const tlm_examples *e) { return e->n; }
int tlm_examples_pairs(const tlm_examples *e) { return e->pairs; }

int tlm_examples_get(const tlm_examples *e, size_t i, const int32_t **ids,
                     const uint8_t **trained) {
    if (i >= e->n) return 0;
    if (ids) *ids = e->ids + e->start[i];
    if (trained) *trained = e->trained + e->start[i];
    return (int)(e->start[i + 1] - e->start[i]);
}

/* ---- one example being built: its tokens and flags ------------------------------------------ */

typedef struct {
    int32_t *ids;
    uint8_t *trained;
    size_t n, cap;
} seq;

static int seq_push(seq *s, const int32_t *ids, size_t n, int trained) {
    if (s->n + n > s->cap) {
        size_t cap = (s->n + n) * 2 + 16;
        int32_t *a = realloc(s->ids, cap * sizeof *a);
        if (a) s->ids = a;
        uint8_t *b = realloc(s->trained, cap);
        if (b) s->trained = b;
        if (!a || !b) return 0;
        s->cap = cap;
    }
    memcpy(s->ids + s->n, ids, n * sizeof *ids);
    memset(s->trained + s->n, trained, n);
    s->n += n;
    return 1;
}

static void seq_free(seq *s) {
    free(s->ids);
    free(s->trained);
    memset(s, 0, sizeof *s);
}

/* What one line is turned into, and why not. */
typedef struct {
    const tlm_tokenizer *tok;
    const tlm_examples_opts *o;
    tlm_chat_template tpl;
    char why[256];
} loader;

/* Appends text, tokenized (special tokens read as such when special), with the flag. */
static tlm_status add_text(loader *L, seq *s, const char *text, size_t len, int special,
                           int trained) {
    if (!len) return TLM_OK;
    int32_t *ids = NULL;
    size_t n = 0;
    tlm_status st =
        tlm_tokenizer_encode(L->tok, text, len, special ? TLM_ENCODE_ALLOW_SPECIAL : 0, &ids, &n);
    if (st) return st;
    int ok = seq_push(s, ids, n, trained);
    free(ids);
    return ok ? TLM_OK : core_err(TLM_ERR_NOMEM, "out of memory");
}

static tlm_status add_eos(loader *L, seq *s, int trained) {
    int32_t eos = tlm_tokenizer_eos(L->tok);
    if (eos < 0) return TLM_OK;
    return seq_push(s, &eos, 1, trained) ? TLM_OK : core_err(TLM_ERR_NOMEM, "out of memory");
}

/* The vocabulary's BOS first where its models expect one (as tlm serve and generate add it). */
static tlm_status add_bos(loader *L, seq *s) {
    int32_t bos = tlm_tokenizer_bos(L->tok);
    if (bos < 0 || !tlm_tokenizer_add_bos(L->tok) || (s->n && s->ids[0] == bos)) return TLM_OK;
    if (!seq_push(s, &bos, 1, 0)) return core_err(TLM_ERR_NOMEM, "out of memory");
    memmove(s->ids + 1, s->ids, (s->n - 1) * sizeof *s->ids);
    memmove(s->trained + 1, s->trained, s->n - 1);
    s->ids[0] = bos;
    s->trained[0] = 0;
    return TLM_OK;
}

static int bad(loader *L, const char *msg) {
    snprintf(L->why, sizeof L->why, "%s", msg);
    return 0;
}

/* A message's content: a string, or OpenAI's list of parts of which the text ones count. Returns
 * a malloc'd string, or NULL (L->why says why). */
static char *content_of(loader *L, const cJSON *c, int i) {
    char msg[128];
    if (cJSON_IsString(c)) return strdup(c->valuestring);
    if (cJSON_IsArray(c)) {
        size_t len = 0;
        const cJSON *p;
        cJSON_ArrayForEach(p, c) {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "text");
            if (cJSON_IsString(t)) len += strlen(t->valuestring);
        }
        char *s = malloc(len + 1), *w = s;
        if (!s) return NULL;
        cJSON_ArrayForEach(p, c) {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "text");
            if (!cJSON_IsString(t)) continue;
            size_t k = strlen(t->valuestring);
            memcpy(w, t->valuestring, k);
            w += k;
        }
        *w = 0;
        return s;
    }
    snprintf(msg, sizeof msg, "message %d: 'content' must be a string or a list of text parts", i);
    bad(L, msg);
    return NULL;
}

static void free_messages(tlm_chat_message *m, int n) {
    for (int i = 0; i < n; i++) { /* the strings are the loader's own copies */
        free((char *)m[i].role);
        free((char *)m[i].content);
    }
    free(m);
}

/* Appends the messages of a JSON list to *msgs (growing it); 0 with L->why when malformed. */
static int read_messages(loader *L, const cJSON *list, const char *key, tlm_chat_message **msgs,
                         int *n) {
    char msg[160];
    if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) == 0) {
        snprintf(msg, sizeof msg, "'%s' must be a non-empty list of messages", key);
        return bad(L, msg);
    }
    int k = cJSON_GetArraySize(list);
    tlm_chat_message *m = realloc(*msgs, (size_t)(*n + k) * sizeof *m);
    if (!m) return bad(L, "out of memory");
    *msgs = m;
    const cJSON *it;
    int i = 0;
    cJSON_ArrayForEach(it, list) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(it, "role");
        if (!cJSON_IsString(role)) {
            snprintf(msg, sizeof msg, "%s[%d] has no string 'role'", key, i);
            return bad(L, msg);
        }
        const char *r = role->valuestring;
        if (strcmp(r, "system") && strcmp(r, "developer") && strcmp(r, "user") &&
            strcmp(r, "assistant") && strcmp(r, "tool")) {
            snprintf(msg, sizeof msg,
                     "%s[%d]: role '%.40s' is not system, developer, user, assistant or tool", key,
                     i, r);
            return bad(L, msg);
        }
        char *content = content_of(L, cJSON_GetObjectItemCaseSensitive(it, "content"), i);
        if (!content) return 0;
        m[*n].role = strdup(r);
        m[*n].content = content;
        ++*n;
        if (!m[*n - 1].role) return bad(L, "out of memory");
        i++;
    }
    return 1;
}

/* A conversation rendered with the template, its assistant turns from message `from` on trained
 * (all: every token; last_only: the last turn alone). */
static tlm_status add_chat(loader *L, seq *s, const tlm_chat_message *msgs, int n, int from,
                           int last_only) {
    char *text = NULL;
    tlm_chat_span *sp = NULL;
    int ns = 0;
    tlm_status st = tlm_chat_render(L->tpl, msgs, n, 0, &text, &sp, &ns);
    if (st) return st;
    int all = L->o->loss_on == TLM_LOSS_ON_ALL;
    size_t at = 0;
    for (int i = 0; i < ns && !st; i++) {
        int train = sp[i].msg >= from && (!last_only || i == ns - 1);
        if (!train) continue;
        st = add_text(L, s, text + at, sp[i].begin - at, 1, all);
        if (!st) st = add_text(L, s, text + sp[i].begin, sp[i].end - sp[i].begin, 1, 1);
        at = sp[i].end;
    }
    if (!st) st = add_text(L, s, text + at, strlen(text) - at, 1, all);
    free(text);
    free(sp);
    return st;
}

/* The side of a preference pair, or a prompt: a string, or messages. */
static const cJSON *field(const cJSON *o, const char *key) {
    return cJSON_GetObjectItemCaseSensitive(o, key);
}

/* One sequence of a line (the line itself, or one side of a preference pair): 1 made, 0
 * malformed (L->why), -1 failed (status in *st). */
static int build(loader *L, const cJSON *o, tlm_data_format f, const char *side, seq *s,
                 tlm_status *st) {
    tlm_loss_on on = L->o->loss_on;
    char msg[160];
    *st = TLM_OK;
    if (f == TLM_FORMAT_TEXT) {
        const cJSON *t = field(o, "text");
        if (!cJSON_IsString(t)) return bad(L, "'text' must be a string");
        *st = add_text(L, s, t->valuestring, strlen(t->valuestring), 0, 1);
        if (!*st) *st = add_eos(L, s, 1);
    } else if (f == TLM_FORMAT_CHAT) {
        tlm_chat_message *m = NULL;
        int n = 0;
        if (!read_messages(L, field(o, "messages"), "messages", &m, &n)) {
            free_messages(m, n);
            return 0;
        }
        *st = add_chat(L, s, m, n, 0, on == TLM_LOSS_ON_COMPLETION);
        free_messages(m, n);
    } else {
        /* completion, or a side of a pair: a prompt and what follows it */
        const char *key = f == TLM_FORMAT_DPO ? side : "completion";
        const cJSON *p = field(o, "prompt"), *c = field(o, key);
        if (cJSON_IsString(p) && cJSON_IsString(c)) {
            *st = add_text(L, s, p->valuestring, strlen(p->valuestring), 0, on == TLM_LOSS_ON_ALL);
            if (!*st) *st = add_text(L, s, c->valuestring, strlen(c->valuestring), 0, 1);
            if (!*st) *st = add_eos(L, s, 1);
        } else if (cJSON_IsArray(p) && cJSON_IsArray(c)) {
            tlm_chat_message *m = NULL;
            int n = 0;
            int ok = read_messages(L, p, "prompt", &m, &n);
            int from = n;
            if (ok) ok = read_messages(L, c, key, &m, &n);
            for (int i = from; ok && i < n; i++)
                if (strcmp(m[i].role, "assistant")) {
                    snprintf(msg, sizeof msg, "%s[%d] must be an assistant message", key, i - from);
                    ok = bad(L, msg);
                }
            if (ok) *st = add_chat(L, s, m, n, from, 0);
            free_messages(m, n);
            if (!ok) return 0;
        } else {
            snprintf(msg, sizeof msg,
                     "'prompt' and '%s' must both be strings or both lists of messages", key);
            return bad(L, msg);
        }
    }
    if (!*st) *st = add_bos(L, s);
    return *st ? -1 : 1;
}

/* Cuts a sequence to max_len tokens as told; 1 if it was cut. */
static int truncate_seq(seq *s, int max_len, int keep_end) {
    if (s->n <= (size_t)max_len) return 0;
    if (keep_end) {
        size_t cut = s->n - (size_t)max_len;
        memmove(s->ids, s->ids + cut, (size_t)max_len * sizeof *s->ids);
        memmove(s->trained, s->trained + cut, (size_t)max_len);
    }
    s->n = (size_t)max_len;
    return 1;
}

/* Whether the loss has anything to predict: a trained token after the first. */
static int learnable(const seq *s) {
    for (size_t i = 1; i < s->n; i++)
        if (s->trained[i]) return 1;
    return 0;
}

static tlm_status append(tlm_examples *e, const seq *s) {
    if (e->n + 2 > e->cap_n) {
        size_t cap = e->cap_n ? e->cap_n * 2 : 256;
        size_t *p = realloc(e->start, (cap + 1) * sizeof *p);
        if (!p) return core_err(TLM_ERR_NOMEM, "out of memory");
        e->start = p;
        e->cap_n = cap;
    }
    if (e->n_tokens + s->n > e->cap_tokens) {
        size_t cap = (e->n_tokens + s->n) * 2;
        int32_t *a = realloc(e->ids, cap * sizeof *a);
        if (a) e->ids = a;
        uint8_t *b = realloc(e->trained, cap);
        if (b) e->trained = b;
        if (!a || !b) return core_err(TLM_ERR_NOMEM, "out of memory");
        e->cap_tokens = cap;
    }
    memcpy(e->ids + e->n_tokens, s->ids, s->n * sizeof *s->ids);
    memcpy(e->trained + e->n_tokens, s->trained, s->n);
    e->n_tokens += s->n;
    e->start[0] = 0;
    e->start[++e->n] = e->n_tokens;
    return TLM_OK;
}

static tlm_data_format detect(const cJSON *o) {
    if (field(o, "chosen") && field(o, "rejected")) return TLM_FORMAT_DPO;
    if (field(o, "messages")) return TLM_FORMAT_CHAT;
    if (field(o, "prompt") && field(o, "completion")) return TLM_FORMAT_COMPLETION;
    if (field(o, "text")) return TLM_FORMAT_TEXT;
    return TLM_FORMAT_AUTO;
}

/* One line: 1 kept, 0 malformed (L->why), 2 skipped with nothing to learn; < 0 failed. */
static int line_examples(loader *L, tlm_examples *e, const cJSON *o, tlm_data_format f,
                         tlm_examples_stats *stats, tlm_status *st) {
    seq s[2] = {{0}, {0}};
    int sides = f == TLM_FORMAT_DPO ? 2 : 1, r = 1, cut = 0;
    for (int k = 0; k < sides && r == 1; k++) {
        r = build(L, o, f, k ? "rejected" : "chosen", &s[k], st);
        if (r == 1) cut |= truncate_seq(&s[k], L->o->max_len, L->o->truncate_keep_end);
    }
    if (r == 1) {
        stats->truncated += cut;
        if (!learnable(&s[0]) || (sides == 2 && !learnable(&s[1]))) r = 2;
        for (int k = 0; k < sides && r == 1 && !*st; k++) *st = append(e, &s[k]);
        if (*st) r = -1;
    }
    seq_free(&s[0]);
    seq_free(&s[1]);
    return r;
}

tlm_status tlm_examples_load(const char *path, const tlm_tokenizer *tok, const tlm_examples_opts *o,
                             tlm_examples **out, tlm_examples_stats *stats) {
    *out = NULL;
    tlm_examples_opts dflt;
    if (!o) {
        tlm_examples_opts_defaults(&dflt);
        o = &dflt;
    }
    tlm_examples_stats none;
    if (!stats) stats = &none;
    memset(stats, 0, sizeof *stats);
    if (!tok) return core_err(TLM_ERR_ARG, "examples: a tokenizer is needed");
    if (o->max_len < 2) return core_err(TLM_ERR_ARG, "examples: max_len %d below 2", o->max_len);
    loader L = {tok, o, TLM_CHAT_CHATML, ""};
    if (o->chat_template && !tlm_chat_template_from_name(o->chat_template, &L.tpl))
        return core_err(TLM_ERR_ARG,
                        "chat template '%s' unknown (chatml, llama2, llama3, mistral, gemma, phi3)",
                        o->chat_template);
    char *text;
    size_t len;
    tlm_status st = core_read_file(path, &text, &len);
    if (st) return st;
    tlm_examples *e = calloc(1, sizeof *e);
    if (!e) {
        free(text);
        return core_err(TLM_ERR_NOMEM, "out of memory");
    }
    tlm_data_format f = o->format;
    long lineno = 0;
    for (size_t at = 0; at < len && !st;) {
        char *nl = memchr(text + at, '\n', len - at);
        size_t end = nl ? (size_t)(nl - text) : len, n = end - at;
        const char *line = text + at;
        at = end + 1;
        lineno++;
        size_t k = 0;
        while (k < n && (line[k] == ' ' || line[k] == '\t' || line[k] == '\r')) k++;
        if (k == n) continue; /* blank */
        stats->lines++;
        cJSON *obj = cJSON_ParseWithLength(line, n);
        int r;
        if (!cJSON_IsObject(obj)) {
            r = bad(&L, obj ? "not a JSON object" : "not valid JSON");
        } else {
            tlm_data_format lf = detect(obj);
            if (f == TLM_FORMAT_AUTO) f = lf;
            if (f == TLM_FORMAT_AUTO)
                r = bad(&L, "no 'text', 'prompt' + 'completion', 'messages' or 'prompt' + "
                            "'chosen' + 'rejected' keys");
            else
                r = line_examples(&L, e, obj, f, stats, &st);
        }
        cJSON_Delete(obj);
        if (r == 2) stats->empty++;
        if (r == 0 && o->skip_bad) {
            stats->bad++;
        } else if (r == 0) {
            st = core_err(TLM_ERR_FORMAT, "'%s' line %ld: %s (--skip-bad skips such lines)", path,
                          lineno, L.why);
        } else if (r < 0 && !st) {
            st = core_err(TLM_ERR_IO, "'%s' line %ld: failed", path, lineno);
        } else if (r < 0) {
            st = core_err(st, "'%s' line %ld: %s", path, lineno, tlm_last_error());
        }
    }
    free(text);
    e->pairs = f == TLM_FORMAT_DPO;
    stats->format = f;
    stats->examples = (long)(e->pairs ? e->n / 2 : e->n);
    for (size_t i = 0; i < e->n_tokens; i++) stats->trained_tokens += e->trained[i];
    stats->tokens = (long)e->n_tokens;
    if (!st && e->n == 0)
        st = core_err(TLM_ERR_FORMAT,
                      "'%s': no example to train on (%ld lines, %ld malformed, %ld with nothing "
                      "to learn)",
                      path, stats->lines, stats->bad, stats->empty);
    if (st) {
        tlm_examples_free(e);
        return st;
    }
    *out = e;
    return TLM_OK;
}

tlm_status tlm_examples_split(tlm_examples *e, double fraction, tlm_examples **tail) {
    *tail = NULL;
    if (!(fraction >= 0 && fraction < 1))
        return core_err(TLM_ERR_ARG, "validation fraction %g must be in [0, 1)", fraction);
    size_t unit = e->pairs ? 2 : 1, groups = e->n / unit;
    size_t k = (size_t)((double)groups * fraction) * unit;
    if (k == 0) return TLM_OK;
    if (k >= e->n) return core_err(TLM_ERR_ARG, "no example would be left to train on");
    tlm_examples *t = calloc(1, sizeof *t);
    size_t first = e->n - k, base = e->start[first], nt = e->n_tokens - base;
    if (t) {
        t->ids = malloc(nt * sizeof *t->ids);
        t->trained = malloc(nt);
        t->start = malloc((k + 1) * sizeof *t->start);
    }
    if (!t || !t->ids || !t->trained || !t->start) {
        tlm_examples_free(t);
        return core_err(TLM_ERR_NOMEM, "out of memory");
    }
    memcpy(t->ids, e->ids + base, nt * sizeof *t->ids);
    memcpy(t->trained, e->trained + base, nt);
    for (size_t i = 0; i <= k; i++) t->start[i] = e->start[first + i] - base;
    t->n = t->cap_n = k;
    t->n_tokens = t->cap_tokens = nt;
    t->pairs = e->pairs;
    e->n = first;
    e->n_tokens = base;
    *tail = t;
    return TLM_OK;
}

/* ---- rows ------------------------------------------------------------------------------------ */

void trn_plan_free(trn_plan *p) {
    free(p->first);
    free(p->ex);
    free(p->perm);
    memset(p, 0, sizeof *p);
}

/* Longer first, then in file order. */
static int before(uint32_t x, uint32_t y, const int *len) {
    return len[x] != len[y] ? len[x] > len[y] : x < y;
}

/* qsort_r is a GNU extension; a small merge sort keeps the order defined everywhere. */
static void sort_ex(uint32_t *v, uint32_t *tmp, size_t n, const int *lens) {
    if (n < 2) return;
    size_t h = n / 2;
    sort_ex(v, tmp, h, lens);
    sort_ex(v + h, tmp, n - h, lens);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) tmp[k++] = before(v[j], v[i], lens) ? v[j++] : v[i++];
    while (i < h) tmp[k++] = v[i++];
    while (j < n) tmp[k++] = v[j++];
    memcpy(v, tmp, n * sizeof *v);
}

tlm_status trn_plan_make(const tlm_examples *e, int T, int pack, trn_plan *p) {
    memset(p, 0, sizeof *p);
    size_t n = e->n;
    p->T = T;
    p->pack = pack;
    p->e = e;
    p->epoch = -1;
    p->ex = malloc((n ? n : 1) * sizeof *p->ex);
    p->first = malloc((n + 1) * sizeof *p->first);
    if (!p->ex || !p->first) {
        trn_plan_free(p);
        return core_err(TLM_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++)
        if (e->start[i + 1] - e->start[i] > (size_t)T) {
            trn_plan_free(p);
            return core_err(TLM_ERR_ARG, "example %zu has %zu tokens, more than a row of %d", i,
                            e->start[i + 1] - e->start[i], T);
        }
    if (!pack || e->pairs) {
        /* One example a row (a pair's two sides are rows 2i and 2i + 1, kept together). */
        for (size_t i = 0; i < n; i++) {
            p->ex[i] = (uint32_t)i;
            p->first[i] = i;
        }
        p->first[n] = n;
        p->rows = n;
        p->unit = e->pairs ? 2 : 1;
        return TLM_OK;
    }
    /* Best fit, longest first: each example into the row with the least room that holds it.
     * Rows are listed by their room (0..T), so a fit is found by looking up at most T lists. */
    int *lens = calloc(n ? n : 1, sizeof *lens);
    uint32_t *order = malloc(n * sizeof *order), *tmp = malloc(n * sizeof *tmp);
    uint32_t *row_of = malloc(n * sizeof *row_of);       /* example -> row */
    int *room = malloc(n * sizeof *room);                /* row -> room left */
    long *head = malloc(((size_t)T + 1) * sizeof *head); /* room -> last row with it */
    long *prev = malloc(n * sizeof *prev), *next = malloc(n * sizeof *next);
    tlm_status st = TLM_OK;
    if (!lens || !order || !tmp || !row_of || !room || !head || !prev || !next) {
        st = core_err(TLM_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        lens[i] = (int)(e->start[i + 1] - e->start[i]);
        order[i] = (uint32_t)i;
    }
    sort_ex(order, tmp, n, lens);
    for (int r = 0; r <= T; r++) head[r] = -1;
    size_t rows = 0;
    for (size_t k = 0; k < n; k++) {
        uint32_t i = order[k];
        long row = -1;
        for (int r = lens[i]; r <= T && row < 0; r++) row = head[r];
        if (row < 0) { /* a new row */
            row = (long)rows++;
            room[row] = T;
        } else { /* off its list */
            int r = room[row];
            if (prev[row] >= 0) next[prev[row]] = next[row];
            if (next[row] >= 0) prev[next[row]] = prev[row];
            if (head[r] == row) head[r] = prev[row];
        }
        room[row] -= lens[i];
        row_of[i] = (uint32_t)row;
        int r = room[row];
        prev[row] = head[r];
        next[row] = -1;
        if (head[r] >= 0) next[head[r]] = row;
        head[r] = row;
    }
    /* rows' examples in file order, by a counting sort on the row */
    for (size_t r = 0; r <= rows; r++) p->first[r] = 0;
    for (size_t i = 0; i < n; i++) p->first[row_of[i] + 1]++;
    for (size_t r = 0; r < rows; r++) p->first[r + 1] += p->first[r];
    for (size_t r = 0; r < rows; r++) tmp[r] = (uint32_t)p->first[r];
    for (size_t i = 0; i < n; i++) p->ex[tmp[row_of[i]]++] = (uint32_t)i;
    p->rows = rows;
    p->unit = 1;
done:
    free(lens);
    free(order);
    free(tmp);
    free(row_of);
    free(room);
    free(head);
    free(prev);
    free(next);
    if (st) trn_plan_free(p);
    return st;
}

/* The order of the plan's units (rows, or pairs of rows) in an epoch: a shuffle seeded by (seed,
 * epoch), so any step's rows are known without drawing the others. */
static tlm_status epoch_order(trn_plan *p, uint64_t seed, long epoch) {
    if (p->epoch == epoch) return TLM_OK;
    size_t units = p->rows / (size_t)p->unit;
    if (!p->perm) p->perm = malloc((units ? units : 1) * sizeof *p->perm);
    if (!p->perm) return core_err(TLM_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < units; i++) p->perm[i] = (uint32_t)i;
    core_rng r;
    core_rng_seed(&r, seed, 0x5f0ull + (uint64_t)epoch);
    for (size_t i = units; i > 1; i--) {
        size_t j = (size_t)core_rng_below(&r, (uint32_t)i);
        uint32_t t = p->perm[i - 1];
        p->perm[i - 1] = p->perm[j];
        p->perm[j] = t;
    }
    p->epoch = epoch;
    return TLM_OK;
}

/* Row g of the run's stream of rows (epochs one after another; in order when seed is 0). */
static tlm_status row_at(trn_plan *p, uint64_t seed, int shuffle, uint64_t g, size_t *row) {
    size_t unit = (size_t)p->unit, units = p->rows / unit;
    uint64_t u = g / unit;
    long epoch = (long)(u / units);
    size_t k = (size_t)(u % units);
    if (shuffle) {
        tlm_status st = epoch_order(p, seed, epoch);
        if (st) return st;
        k = p->perm[k];
    }
    *row = k * unit + (size_t)(g % unit);
    return TLM_OK;
}

tlm_status trn_plan_rows(trn_plan *p, uint64_t seed, int shuffle, uint64_t first, int B,
                         int32_t *ids, int32_t *tg, int32_t *pos, int *T_out, long *tokens,
                         long *counted) {
    const tlm_examples *e = p->e;
    size_t rows[4096];
    if (B > 4096) return core_err(TLM_ERR_ARG, "%d rows a pass; at most 4096", B);
    /* Unpacked rows are as long as the longest example among them (padding costs nothing more) */
    int T = p->pack ? p->T : 1;
    for (int b = 0; b < B; b++) {
        tlm_status st = row_at(p, seed, shuffle, first + (uint64_t)b, &rows[b]);
        if (st) return st;
        if (!p->pack) {
            size_t i = p->ex[p->first[rows[b]]];
            int len = (int)(e->start[i + 1] - e->start[i]);
            T = len > T ? len : T;
        }
    }
    *tokens = 0;
    *counted = 0;
    for (int b = 0; b < B; b++) {
        int t = 0;
        for (size_t k = p->first[rows[b]]; k < p->first[rows[b] + 1]; k++) {
            size_t i = p->ex[k], s = e->start[i];
            int len = (int)(e->start[i + 1] - s);
            for (int j = 1; j < len; j++) *counted += e->trained[s + j];
            *tokens += len;
            if (!ids) continue; /* counting only */
            int32_t *I = ids + (size_t)b * T, *G = tg + (size_t)b * T, *P = pos + (size_t)b * T;
            for (int j = 0; j < len; j++, t++) {
                I[t] = e->ids[s + j];
                G[t] = j + 1 < len && e->trained[s + j + 1] ? e->ids[s + j + 1] : -1;
                P[t] = j;
            }
        }
        if (!ids) continue;
        int32_t *I = ids + (size_t)b * T, *G = tg + (size_t)b * T, *P = pos + (size_t)b * T;
        /* padding: masked; packed, an example of its own (nothing sees it either way) */
        for (int j = 0; t < T; t++, j++) {
            I[t] = 0;
            G[t] = -1;
            P[t] = p->pack ? j : t;
        }
    }
    *T_out = T;
    return TLM_OK;
}

tlm_status trn_plan_row_examples(trn_plan *p, uint64_t seed, int shuffle, uint64_t first, int B,
                                 uint32_t *ex) {
    for (int b = 0; b < B; b++) {
        size_t row;
        tlm_status st = row_at(p, seed, shuffle, first + (uint64_t)b, &row);
        if (st) return st;
        ex[b] = p->ex[p->first[row]];
    }
    return TLM_OK;
}
