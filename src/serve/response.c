/* OpenAI's response shapes from the scheduler's jobs: the whole answer (chat.completion,
 * text_completion) and the Server-Sent Events of a stream (chat.completion.chunk), with usage and
 * logprobs; and the error object. Only text: the HTTP layer sends it. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "serve/serve.h"

char *srv_utf8_fix(const char *s, size_t n) {
    char *out = malloc(n * 3 + 1), *w = out;
    if (!out) return NULL;
    size_t i = 0;
    while (i < n) {
        size_t k = 1;
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x80)
            k = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
        if (i + k <= n && srv_utf8_valid(s + i, k) && !(c >= 0x80 && k == 1)) {
            memcpy(w, s + i, k);
            w += k;
            i += k;
        } else {
            memcpy(w, "\xEF\xBF\xBD", 3);
            w += 3;
            i++;
        }
    }
    *w = 0;
    return out;
}

static void add_fixed(cJSON *o, const char *name, const char *s, size_t n) {
    char *f = srv_utf8_fix(s, n);
    cJSON_AddStringToObject(o, name, f ? f : "");
    free(f);
}

static const char *error_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 413: return "invalid_request_error";
    case 429: return "rate_limit_error";
    case 503: return "server_unavailable_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

static cJSON *error_obj(int status, const char *param, const char *msg) {
    cJSON *root = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddStringToObject(e, "type", error_type(status));
    if (param && *param)
        cJSON_AddStringToObject(e, "param", param);
    else
        cJSON_AddNullToObject(e, "param");
    cJSON_AddNullToObject(e, "code");
    return root;
}

static const char *finish_name(srv_finish f) {
    return f == SRV_FINISH_LENGTH ? "length" : f == SRV_FINISH_ERROR ? "error" : "stop";
}

static cJSON *piece_json(const tlm_tokenizer *tok, int32_t id, cJSON *obj, int with_bytes) {
    const char *b = "";
    size_t n = 0;
    tlm_tokenizer_piece(tok, id, &b, &n);
    add_fixed(obj, "token", b, n);
    if (with_bytes) {
        cJSON *arr = cJSON_AddArrayToObject(obj, "bytes");
        for (size_t i = 0; i < n; i++)
            cJSON_AddItemToArray(arr, cJSON_CreateNumber((unsigned char)b[i]));
    }
    return obj;
}

/* Logprobs of tokens [from, to) of job j in the chat shape ({"content": [...]}) or the legacy
 * completions shape. */
static cJSON *logprobs_json(srv_response *g, const srv_job *j, int from, int to) {
    const tlm_tokenizer *tok = g->tok;
    cJSON *lp = cJSON_CreateObject();
    if (g->req->chat) {
        cJSON *content = cJSON_AddArrayToObject(lp, "content");
        for (int t = from; t < to; t++) {
            const srv_token_lp *x = &j->lps[t];
            cJSON *e = piece_json(tok, x->id, cJSON_CreateObject(), 1);
            cJSON_AddNumberToObject(e, "logprob", x->logprob);
            cJSON *tops = cJSON_AddArrayToObject(e, "top_logprobs");
            for (int k = 0; k < x->n_top; k++) {
                cJSON *te = piece_json(tok, x->top_id[k], cJSON_CreateObject(), 1);
                cJSON_AddNumberToObject(te, "logprob", x->top_lp[k]);
                cJSON_AddItemToArray(tops, te);
            }
            cJSON_AddItemToArray(content, e);
        }
        return lp;
    }
    cJSON *tokens = cJSON_AddArrayToObject(lp, "tokens");
    cJSON *tlp = cJSON_AddArrayToObject(lp, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(lp, "top_logprobs");
    cJSON *offs = cJSON_AddArrayToObject(lp, "text_offset");
    size_t off = 0;
    for (int t = 0; t < from; t++) {
        const char *b;
        size_t n = 0;
        tlm_tokenizer_piece(tok, j->lps[t].id, &b, &n);
        off += n;
    }
    for (int t = from; t < to; t++) {
        const srv_token_lp *x = &j->lps[t];
        const char *b = "";
        size_t n = 0;
        tlm_tokenizer_piece(tok, x->id, &b, &n);
        char *f = srv_utf8_fix(b, n);
        cJSON_AddItemToArray(tokens, cJSON_CreateString(f ? f : ""));
        free(f);
        cJSON_AddItemToArray(tlp, cJSON_CreateNumber(x->logprob));
        cJSON *d = cJSON_CreateObject();
        for (int k = 0; k < x->n_top; k++) {
            const char *tb = "";
            size_t tn = 0;
            tlm_tokenizer_piece(tok, x->top_id[k], &tb, &tn);
            char *tf = srv_utf8_fix(tb, tn);
            if (tf && !cJSON_GetObjectItemCaseSensitive(d, tf))
                cJSON_AddNumberToObject(d, tf, x->top_lp[k]);
            free(tf);
        }
        cJSON_AddItemToArray(tops, d);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        off += n;
    }
    return lp;
}

static cJSON *usage_json(srv_response *g) {
    cJSON *u = cJSON_CreateObject();
    int completion = 0;
    for (int i = 0; i < g->n_jobs; i++) completion += g->jobs[i]->completion_tokens;
    int prompt = g->jobs[0]->n_ids;
    cJSON_AddNumberToObject(u, "prompt_tokens", prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", completion);
    cJSON_AddNumberToObject(u, "total_tokens", prompt + completion);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", g->jobs[0]->cached_tokens);
    return u;
}

static cJSON *envelope(srv_response *g, const char *object) {
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "id", g->id);
    cJSON_AddStringToObject(r, "object", object);
    cJSON_AddNumberToObject(r, "created", (double)g->created);
    cJSON_AddStringToObject(r, "model", g->model_id);
    cJSON_AddStringToObject(r, "system_fingerprint", "tlm-" TLM_VERSION);
    return r;
}

/* The whole answer, once every job is done (lock held). */
static cJSON *final_json(srv_response *g) {
    cJSON *r = envelope(g, g->req->chat ? "chat.completion" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(r, "choices");
    for (int i = 0; i < g->n_jobs; i++) {
        srv_job *j = g->jobs[i];
        cJSON *c = cJSON_CreateObject();
        cJSON_AddNumberToObject(c, "index", i);
        if (g->req->chat) {
            cJSON *m = cJSON_AddObjectToObject(c, "message");
            cJSON_AddStringToObject(m, "role", "assistant");
            add_fixed(m, "content", j->text ? j->text : "", j->text_len);
        } else if (g->req->echo && g->req->prompt) {
            size_t pl = strlen(g->req->prompt);
            char *both = malloc(pl + j->text_len + 1);
            if (both) {
                memcpy(both, g->req->prompt, pl);
                if (j->text_len) memcpy(both + pl, j->text, j->text_len);
                add_fixed(c, "text", both, pl + j->text_len);
                free(both);
            }
        } else {
            add_fixed(c, "text", j->text ? j->text : "", j->text_len);
        }
        if (g->req->logprobs)
            cJSON_AddItemToObject(c, "logprobs", logprobs_json(g, j, 0, j->n_lps));
        else
            cJSON_AddNullToObject(c, "logprobs");
        cJSON_AddStringToObject(c, "finish_reason", finish_name(j->finish));
        cJSON_AddItemToArray(choices, c);
    }
    cJSON_AddItemToObject(r, "usage", usage_json(g));
    return r;
}

static int out_put(srv_response *g, const char *s, size_t n) {
    if (g->out_len + n > g->out_cap) {
        size_t cap = (g->out_len + n) * 2 + 256;
        char *q = realloc(g->out, cap);
        if (!q) return 0;
        g->out = q;
        g->out_cap = cap;
    }
    memcpy(g->out + g->out_len, s, n);
    g->out_len += n;
    return 1;
}

static void out_event(srv_response *g, cJSON *j) {
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!s) return;
    out_put(g, "data: ", 6);
    out_put(g, s, strlen(s));
    out_put(g, "\n\n", 2);
    free(s);
}

/* Chunks for whatever the jobs produced since the last call (lock held). Returns 1 once the
 * stream is complete. */
int srv_response_stream(srv_response *g) {
    int all_done = 1;
    for (int i = 0; i < g->n_jobs; i++) {
        srv_job *j = g->jobs[i];
        if (g->finished[i]) continue;
        int new_text = j->text_len > g->sent_text[i], new_lps = j->n_lps > g->sent_lps[i];
        /* The first chunk of a choice carries the chat role, or the echoed prompt. */
        int echo = !g->req->chat && g->req->echo && g->req->prompt;
        int first = (g->req->chat || echo) && !g->role_sent[i];
        if (new_text || new_lps || first || j->done) {
            if (j->finish == SRV_FINISH_ERROR) {
                out_event(g, error_obj(500, NULL, j->error));
                g->finished[i] = 1;
                continue;
            }
            cJSON *r = envelope(g, g->req->chat ? "chat.completion.chunk" : "text_completion");
            cJSON *choices = cJSON_AddArrayToObject(r, "choices");
            cJSON *c = cJSON_CreateObject();
            cJSON_AddNumberToObject(c, "index", i);
            const char *t = j->text ? j->text + g->sent_text[i] : "";
            size_t tn = j->text_len - g->sent_text[i];
            if (g->req->chat) {
                cJSON *d = cJSON_AddObjectToObject(c, "delta");
                if (first) {
                    cJSON_AddStringToObject(d, "role", "assistant");
                    g->role_sent[i] = 1;
                }
                if (tn || first) add_fixed(d, "content", t, tn);
            } else if (first) {
                size_t pl = strlen(g->req->prompt);
                char *both = malloc(pl + tn + 1);
                if (both) {
                    memcpy(both, g->req->prompt, pl);
                    if (tn) memcpy(both + pl, t, tn);
                    add_fixed(c, "text", both, pl + tn);
                    free(both);
                }
                g->role_sent[i] = 1;
            } else {
                add_fixed(c, "text", t, tn);
            }
            if (g->req->logprobs && new_lps)
                cJSON_AddItemToObject(c, "logprobs", logprobs_json(g, j, g->sent_lps[i], j->n_lps));
            else
                cJSON_AddNullToObject(c, "logprobs");
            /* The finish reason goes in a chunk of its own after the last text, as OpenAI's. */
            if (j->done && !tn && !new_lps && !first) {
                cJSON_AddStringToObject(c, "finish_reason", finish_name(j->finish));
                g->finished[i] = 1;
            } else {
                cJSON_AddNullToObject(c, "finish_reason");
            }
            cJSON_AddItemToArray(choices, c);
            out_event(g, r);
            g->sent_text[i] = j->text_len;
            g->sent_lps[i] = j->n_lps;
        }
        if (!g->finished[i]) all_done = 0;
    }
    if (!all_done) return 0;
    if (g->req->include_usage && !g->usage_sent) {
        cJSON *r = envelope(g, g->req->chat ? "chat.completion.chunk" : "text_completion");
        cJSON_AddArrayToObject(r, "choices");
        cJSON_AddItemToObject(r, "usage", usage_json(g));
        out_event(g, r);
        g->usage_sent = 1;
    }
    out_put(g, "data: [DONE]\n\n", 14);
    return 1;
}

char *srv_error_json(int status, const char *param, const char *msg) {
    cJSON *o = error_obj(status, param, msg);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

int srv_response_init(srv_response *g, const tlm_tokenizer *tok, const char *model_id,
                      const srv_request *req, srv_job *const *jobs, int n_jobs, const char *id,
                      long long created) {
    memset(g, 0, sizeof *g);
    g->tok = tok;
    g->model_id = model_id;
    g->req = req;
    g->jobs = jobs;
    g->n_jobs = n_jobs;
    snprintf(g->id, sizeof g->id, "%s", id);
    g->created = created;
    g->sent_text = calloc((size_t)n_jobs, sizeof *g->sent_text);
    g->sent_lps = calloc((size_t)n_jobs, sizeof *g->sent_lps);
    g->finished = calloc((size_t)n_jobs, 1);
    g->role_sent = calloc((size_t)n_jobs, 1);
    if (g->sent_text && g->sent_lps && g->finished && g->role_sent) return 0;
    srv_response_free(g);
    return -1;
}

void srv_response_free(srv_response *g) {
    free(g->sent_text);
    free(g->sent_lps);
    free(g->finished);
    free(g->role_sent);
    free(g->out);
    memset(g, 0, sizeof *g);
}

char *srv_response_final(srv_response *g) {
    cJSON *r = final_json(g);
    char *s = cJSON_PrintUnformatted(r);
    cJSON_Delete(r);
    return s;
}
