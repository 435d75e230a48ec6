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

/* Whether a chat's answers are read for tool calls. */
static int tools_on(const srv_request *r) {
    return r->chat && r->tools && r->tool_choice != SRV_TOOLS_NONE;
}

/* The ids of choice i's calls: unique per response. */
static unsigned long long call_seed(const srv_response *g, int i) {
    unsigned long long h = 1469598103934665603ull;
    for (const char *p = g->id; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    return (h ^ (unsigned long long)i) & 0xffffffffffffull;
}

/* A chat choice with tools, streamed once it is done (the calls are known only then): the role
 * and content, each call whole (OpenAI's delta shape, index by index), then the finish reason. */
static int tools_stream_choice(srv_response *g, int i);

/* The whole answer, once every job is done (lock held). */
static cJSON *final_json(srv_response *g) {
    cJSON *r = envelope(g, g->req->chat ? "chat.completion" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(r, "choices");
    for (int i = 0; i < g->n_jobs; i++) {
        srv_job *j = g->jobs[i];
        cJSON *c = cJSON_CreateObject();
        cJSON_AddNumberToObject(c, "index", i);
        srv_tool_parse tp = {0};
        if (tools_on(g->req))
            srv_tools_parse_as(g->req->tool_format, j->text ? j->text : "", j->text_len,
                               call_seed(g, i), &tp);
        if (g->req->chat && tools_on(g->req)) {
            cJSON *m = cJSON_AddObjectToObject(c, "message");
            cJSON_AddStringToObject(m, "role", "assistant");
            if (tp.content)
                cJSON_AddStringToObject(m, "content", tp.content);
            else
                cJSON_AddNullToObject(m, "content");
            if (tp.calls) cJSON_AddItemToObject(m, "tool_calls", cJSON_Parse(tp.calls));
        } else if (g->req->chat) {
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
        cJSON_AddStringToObject(
            c, "finish_reason",
            tp.n_calls && j->finish == SRV_FINISH_STOP ? "tool_calls" : finish_name(j->finish));
        srv_tool_parse_free(&tp);
        cJSON_AddItemToArray(choices, c);
    }
    cJSON_AddItemToObject(r, "usage", usage_json(g));
    return r;
}

/* ---- llama-server's /completion ---------------------------------------------------------- */

/* completion_probabilities of tokens [from, to): each {id, token, bytes, logprob, top_logprobs}. */
static cJSON *native_probs(srv_response *g, const srv_job *j, int from, int to) {
    cJSON *a = cJSON_CreateArray();
    for (int t = from; t < to; t++) {
        const srv_token_lp *x = &j->lps[t];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "id", x->id);
        piece_json(g->tok, x->id, e, 1);
        cJSON_AddNumberToObject(e, "logprob", x->logprob);
        cJSON *tops = cJSON_AddArrayToObject(e, "top_logprobs");
        for (int k = 0; k < x->n_top; k++) {
            cJSON *te = cJSON_CreateObject();
            cJSON_AddNumberToObject(te, "id", x->top_id[k]);
            piece_json(g->tok, x->top_id[k], te, 1);
            cJSON_AddNumberToObject(te, "logprob", x->top_lp[k]);
            cJSON_AddItemToArray(tops, te);
        }
        cJSON_AddItemToArray(a, e);
    }
    return a;
}

static cJSON *ids_json(const srv_job *j, int from, int to) {
    cJSON *a = cJSON_CreateArray();
    for (int t = from; t < to; t++) cJSON_AddItemToArray(a, cJSON_CreateNumber(j->out_ids[t]));
    return a;
}

/* The prompt as text: as given, or the pieces of its ids. */
static void add_prompt(srv_response *g, cJSON *o, const srv_job *j) {
    if (g->req->prompt) {
        cJSON_AddStringToObject(o, "prompt", g->req->prompt);
        return;
    }
    size_t len = 0;
    for (int i = 0; i < j->n_ids; i++) {
        const char *b;
        size_t n = 0;
        tlm_tokenizer_piece(g->tok, j->ids[i], &b, &n);
        len += n;
    }
    char *s = malloc(len + 1), *w = s;
    for (int i = 0; s && i < j->n_ids; i++) {
        const char *b = "";
        size_t n = 0;
        tlm_tokenizer_piece(g->tok, j->ids[i], &b, &n);
        memcpy(w, b, n);
        w += n;
    }
    if (s) add_fixed(o, "prompt", s, len);
    free(s);
}

/* Everything llama-server's final answer holds but the content and its tokens. */
static void native_tail(srv_response *g, cJSON *o, const srv_job *j) {
    const srv_request *r = g->req;
    cJSON_AddStringToObject(o, "model", r->model ? r->model : g->model_id);
    cJSON_AddNumberToObject(o, "tokens_predicted", j->completion_tokens);
    cJSON_AddNumberToObject(o, "tokens_evaluated", j->n_ids);
    cJSON *gs = cJSON_AddObjectToObject(o, "generation_settings");
    cJSON_AddNumberToObject(gs, "n_predict", r->max_tokens);
    cJSON_AddNumberToObject(gs, "seed", (double)r->sampling.seed);
    cJSON_AddNumberToObject(gs, "temperature", r->sampling.temperature);
    cJSON_AddNumberToObject(gs, "top_k", r->sampling.top_k);
    cJSON_AddNumberToObject(gs, "top_p", r->sampling.top_p);
    cJSON_AddNumberToObject(gs, "min_p", r->sampling.min_p);
    cJSON_AddNumberToObject(gs, "repeat_penalty",
                            r->sampling.repeat_penalty ? r->sampling.repeat_penalty : 1.0);
    cJSON_AddNumberToObject(gs, "repeat_last_n",
                            r->sampling.penalty_last_n ? r->sampling.penalty_last_n : 64);
    cJSON_AddNumberToObject(gs, "presence_penalty", r->sampling.presence_penalty);
    cJSON_AddNumberToObject(gs, "frequency_penalty", r->sampling.frequency_penalty);
    cJSON_AddNumberToObject(gs, "n_probs", r->logprobs ? r->top_logprobs : 0);
    cJSON_AddBoolToObject(gs, "ignore_eos", r->ignore_eos);
    cJSON_AddBoolToObject(gs, "stream", r->stream);
    cJSON *stop = cJSON_AddArrayToObject(gs, "stop");
    for (int i = 0; i < r->n_stop; i++) cJSON_AddItemToArray(stop, cJSON_CreateString(r->stop[i]));
    if (g->n_ctx) cJSON_AddNumberToObject(gs, "n_ctx", g->n_ctx);
    add_prompt(g, o, j);
    cJSON_AddBoolToObject(o, "has_new_line", j->text_len && memchr(j->text, '\n', j->text_len));
    cJSON_AddBoolToObject(o, "truncated", g->n_ctx && j->n_ids + j->completion_tokens >= g->n_ctx);
    const char *type = j->eos || (j->finish == SRV_FINISH_STOP && j->stop_word < 0) ? "eos"
                       : j->stop_word >= 0                                          ? "word"
                       : j->finish == SRV_FINISH_LENGTH                             ? "limit"
                                                                                    : "none";
    cJSON_AddStringToObject(o, "stop_type", type);
    cJSON_AddStringToObject(o, "stopping_word",
                            j->stop_word >= 0 && j->stop_word < j->n_stop ? j->stop[j->stop_word]
                                                                          : "");
    cJSON_AddNumberToObject(o, "tokens_cached", j->cached_tokens);
    cJSON *t = cJSON_AddObjectToObject(o, "timings");
    int pn = j->n_ids - j->cached_tokens, dn = j->completion_tokens;
    double pms = j->t_first > j->t_submit ? (j->t_first - j->t_submit) * 1e3 : 0;
    double dms = j->t_done > j->t_first && j->t_first ? (j->t_done - j->t_first) * 1e3 : 0;
    cJSON_AddNumberToObject(t, "cache_n", j->cached_tokens);
    cJSON_AddNumberToObject(t, "prompt_n", pn);
    cJSON_AddNumberToObject(t, "prompt_ms", pms);
    cJSON_AddNumberToObject(t, "prompt_per_token_ms", pn ? pms / pn : 0);
    cJSON_AddNumberToObject(t, "prompt_per_second", pms > 0 ? pn * 1e3 / pms : 0);
    cJSON_AddNumberToObject(t, "predicted_n", dn);
    cJSON_AddNumberToObject(t, "predicted_ms", dms);
    cJSON_AddNumberToObject(t, "predicted_per_token_ms", dn ? dms / dn : 0);
    cJSON_AddNumberToObject(t, "predicted_per_second", dms > 0 ? dn * 1e3 / dms : 0);
    if (j->n_drafted > 0) { /* llama-server's, present only where something was drafted */
        cJSON_AddNumberToObject(t, "draft_n", j->n_drafted);
        cJSON_AddNumberToObject(t, "draft_n_accepted", j->n_accepted);
    }
}

/* The whole answer of job i (done): llama-server's /completion object. */
static cJSON *native_final(srv_response *g, int i) {
    const srv_job *j = g->jobs[i];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "index", i);
    add_fixed(o, "content", j->text ? j->text : "", j->text_len);
    cJSON_AddItemToObject(
        o, "tokens", g->req->return_tokens ? ids_json(j, 0, j->n_out_ids) : cJSON_CreateArray());
    cJSON_AddNumberToObject(o, "id_slot", j->slot_used);
    cJSON_AddBoolToObject(o, "stop", 1);
    native_tail(g, o, j);
    if (g->req->logprobs)
        cJSON_AddItemToObject(o, "completion_probabilities", native_probs(g, j, 0, j->n_lps));
    return o;
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

/* llama-server's stream: {content, tokens, stop: false, ...} per step, then the final object with
 * stop: true; no [DONE]. */
static int native_stream(srv_response *g) {
    srv_job *j = g->jobs[0];
    if (g->finished[0]) return 1;
    if (j->finish == SRV_FINISH_ERROR) {
        out_event(g, error_obj(500, NULL, j->error));
        g->finished[0] = 1;
        return 1;
    }
    int new_text = j->text_len > g->sent_text[0], new_ids = j->n_out_ids > g->sent_ids[0];
    if (new_text || new_ids) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "index", 0);
        add_fixed(o, "content", j->text ? j->text + g->sent_text[0] : "",
                  j->text_len - g->sent_text[0]);
        cJSON_AddItemToObject(o, "tokens", ids_json(j, g->sent_ids[0], j->n_out_ids));
        cJSON_AddBoolToObject(o, "stop", 0);
        cJSON_AddNumberToObject(o, "id_slot", -1);
        cJSON_AddNumberToObject(o, "tokens_predicted", j->completion_tokens);
        cJSON_AddNumberToObject(o, "tokens_evaluated", j->n_ids);
        if (g->req->logprobs && j->n_lps > g->sent_lps[0])
            cJSON_AddItemToObject(o, "completion_probabilities",
                                  native_probs(g, j, g->sent_lps[0], j->n_lps));
        out_event(g, o);
        g->sent_text[0] = j->text_len;
        g->sent_ids[0] = j->n_out_ids;
        g->sent_lps[0] = j->n_lps;
    }
    if (!j->done) return 0;
    cJSON *f = cJSON_CreateObject();
    cJSON_AddNumberToObject(f, "index", 0);
    cJSON_AddStringToObject(f, "content", "");
    cJSON_AddItemToObject(f, "tokens", cJSON_CreateArray());
    cJSON_AddNumberToObject(f, "id_slot", j->slot_used);
    cJSON_AddBoolToObject(f, "stop", 1);
    native_tail(g, f, j);
    out_event(g, f);
    g->finished[0] = 1;
    return 1;
}

/* Chunks for whatever the jobs produced since the last call (lock held). Returns 1 once the
 * stream is complete. */
int srv_response_stream(srv_response *g) {
    if (g->req->native) return native_stream(g);
    int all_done = 1;
    if (tools_on(g->req)) {
        for (int i = 0; i < g->n_jobs; i++) all_done &= tools_stream_choice(g, i);
        if (!all_done) return 0;
        if (g->req->include_usage && !g->usage_sent) {
            cJSON *r = envelope(g, "chat.completion.chunk");
            cJSON_AddArrayToObject(r, "choices");
            cJSON_AddItemToObject(r, "usage", usage_json(g));
            out_event(g, r);
            g->usage_sent = 1;
        }
        out_put(g, "data: [DONE]\n\n", 14);
        return 1;
    }
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

/* One chat chunk of choice i: its delta (taken) and finish reason (NULL: none yet). */
static void chunk_event(srv_response *g, int i, cJSON *delta, const char *finish) {
    cJSON *r = envelope(g, "chat.completion.chunk"), *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", i);
    cJSON_AddItemToObject(c, "delta", delta);
    cJSON_AddNullToObject(c, "logprobs");
    if (finish)
        cJSON_AddStringToObject(c, "finish_reason", finish);
    else
        cJSON_AddNullToObject(c, "finish_reason");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(r, "choices"), c);
    out_event(g, r);
}

static int tools_stream_choice(srv_response *g, int i) {
    srv_job *j = g->jobs[i];
    if (g->finished[i]) return 1;
    if (!j->done) return 0;
    if (j->finish == SRV_FINISH_ERROR) {
        out_event(g, error_obj(500, NULL, j->error));
        g->finished[i] = 1;
        return 1;
    }
    srv_tool_parse tp = {0};
    srv_tools_parse_as(g->req->tool_format, j->text ? j->text : "", j->text_len, call_seed(g, i),
                       &tp);
    cJSON *d = cJSON_CreateObject();
    cJSON_AddStringToObject(d, "role", "assistant");
    if (tp.content)
        cJSON_AddStringToObject(d, "content", tp.content);
    else
        cJSON_AddNullToObject(d, "content");
    chunk_event(g, i, d, NULL);
    cJSON *calls = tp.calls ? cJSON_Parse(tp.calls) : NULL;
    int k = 0;
    for (cJSON *call = calls ? calls->child : NULL; call; call = call->next, k++) {
        d = cJSON_CreateObject();
        cJSON *one = cJSON_Duplicate(call, 1);
        cJSON_AddNumberToObject(one, "index", k);
        cJSON_AddItemToArray(cJSON_AddArrayToObject(d, "tool_calls"), one);
        chunk_event(g, i, d, NULL);
    }
    cJSON_Delete(calls);
    chunk_event(g, i, cJSON_CreateObject(),
                tp.n_calls && j->finish == SRV_FINISH_STOP ? "tool_calls" : finish_name(j->finish));
    srv_tool_parse_free(&tp);
    g->finished[i] = 1;
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
    g->sent_ids = calloc((size_t)n_jobs, sizeof *g->sent_ids);
    g->finished = calloc((size_t)n_jobs, 1);
    g->role_sent = calloc((size_t)n_jobs, 1);
    if (g->sent_text && g->sent_lps && g->sent_ids && g->finished && g->role_sent) return 0;
    srv_response_free(g);
    return -1;
}

void srv_response_free(srv_response *g) {
    free(g->sent_text);
    free(g->sent_lps);
    free(g->sent_ids);
    free(g->finished);
    free(g->role_sent);
    free(g->out);
    memset(g, 0, sizeof *g);
}

char *srv_response_final(srv_response *g) {
    cJSON *r = g->req->native ? native_final(g, 0) : final_json(g);
    char *s = cJSON_PrintUnformatted(r);
    cJSON_Delete(r);
    return s;
}
