/* tlm serve: an OpenAI-compatible HTTP server over the scheduler in src/serve/. HTTP is
 * libmicrohttpd's (one thread per connection, so a handler may wait for its tokens); this file
 * maps routes to the engine and formats OpenAI's JSON and Server-Sent Events. */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "core/knob.h"
#include "io/gguf.h"
#include "serve/serve.h"

// clang-format off
static const char *serve_help =
    "usage: tlm serve -m MODEL [-z TOKENIZER] [--host 127.0.0.1] [--port 8080] [--parallel N]\n"
    "                 [--ctx T] [--api-key KEY] [-t THREADS] [--chat-template NAME]\n"
    "                 [--queue N] [--max-body BYTES] [--timeout S] [--precision auto|fp32|bf16]\n"
    "                 [--cache-type T | -ctk T -ctv T] [--mmap|--no-mmap]\n"
    "                 [-md DRAFT [--draft-max N] [--draft-min N] [--draft-p-min P] | --lookup]\n"
    "\n"
    "Serves the OpenAI API (POST /v1/completions, /v1/chat/completions, /v1/embeddings,\n"
    "GET /v1/models), llama-server's own (POST /completion, /embeddings, /tokenize,\n"
    "/detokenize, /apply-template, /lora-adapters, GET /props, /health, /metrics) and a chat\n"
    "page at /: docs/serving.md.\n"
    "Requests may constrain their output with response_format (json_object, json_schema),\n"
    "json_schema or grammar (GBNF): docs/structured-output.md.\n\n"
    "  -m, --model PATH      model\n"
    "  -z, --tokenizer PATH  tokenizer; default: the model's own\n"
    "  --host ADDR           IPv4 address to bind (default 127.0.0.1: this machine only)\n"
    "  --port N              TCP port (default 8080; 0 picks a free one)\n"
    "  --parallel N          sequences decoded together, one slot each (default 4)\n"
    "  --ctx T               positions per slot (default: the model's context_length)\n"
    "  --queue N             requests waiting beyond the slots before 429 (default 4 x parallel)\n"
    "  --cache-ram MIB       memory for the prompt cache (default 1024; 0: none): a slot taken\n"
    "                        over by another request keeps its prefix there for a later request\n"
    "                        that starts the same way (the next turn of a chat)\n"
    "  --api-key KEY         require 'Authorization: Bearer KEY' on the API\n"
    "  --chat-template NAME  chatml, llama2, llama3, mistral, gemma, phi3 or mistral-nemo\n"
    "                        (default: the GGUF's tokenizer.chat_template when recognised,\n"
    "                        else chatml)\n"
    "  --alias NAME, -a NAME the model's name in answers (default: the file's name)\n"
    "  --temp, --top-k, --top-p, --min-p, --seed, --repeat-penalty, --repeat-last-n,\n"
    "  --presence-penalty, --frequency-penalty, --n-predict (-n)\n"
    "                        the requests' defaults where they give none (llama-server's)\n"
    "  --no-webui            no chat page at /\n"
    "  --slot-save-path DIR  where POST /slots/ID?action=save|restore writes and reads slots\n"
    "  --ctx-size N          --ctx; llama-server's flags that mean nothing here (-ngl,\n"
    "                        --batch-size, --flash-attn, --metrics, --slots, --jinja, ...) are\n"
    "                        accepted and ignored\n"
    "  --embeddings          answer POST /v1/embeddings and /embeddings (the final hidden\n"
    "                        states, after the output norm) besides generating\n"
    "  --pooling P           none, mean, cls or last (default: the GGUF's pooling_type, else\n"
    "                        none, as llama-server)\n"
    "  --embd-normalize N    pooled embeddings' norm: -1 none, 0 max absolute (int16), 2\n"
    "                        Euclidean (default), p: p-norm\n"
    "  --max-body BYTES      largest request body (default 1048576; larger get 413)\n"
    "  --timeout S, -to S    seconds a client has to send its whole request, and the longest\n"
    "                        silence on a connection, before it is closed (default 30)\n"
    "  -t, --threads N       threads (default: all cores)\n"
    "  --mmap, --no-mmap     map the file, or read it into memory on 2 MiB pages: the default\n"
    "                        where it takes at most half the memory available (loads in about\n"
    "                        0.3 s per GiB; memory-bound decoding 10-25% faster)\n"
    CLI_PRECISION_HELP
    CLI_CACHE_TYPE_HELP
    CLI_LORA_HELP
    "  --lora-init-without-apply  load the adapters at scale 0 (set them with POST\n"
    "                        /lora-adapters, or per request)\n"
    "\n"
    "Speculative decoding (docs/serving.md): a cheap proposer guesses ids that the model checks\n"
    "several at a time, in the same step as the other slots' tokens. Every id is the one plain\n"
    "decoding would sample (greedy or not, with grammars, biases and penalties). Requests may\n"
    "set speculative.n_max (0: off), speculative.n_min and speculative.p_min.\n"
    "  -md, --model-draft F  draft model sharing the model's vocabulary (an F16 cache of its own\n"
    "                        per slot, no LoRA)\n"
    "  --draft-max N, --draft-n N  ids proposed per step at most (default 16)\n"
    "  --draft-min N         a shorter proposal is dropped for a plain step (default 0)\n"
    "  --draft-p-min P       the draft stops at an id it gives less probability (default 0.75)\n"
    "  --lookup              propose by n-gram lookup over the prompt and the output so far\n"
    "                        (no draft model): for output that repeats its input\n"
    "\n"
    "LoRA adapters (llama-server's API): GET /lora-adapters lists them with their scales; POST\n"
    "/lora-adapters [{\"id\": 0, \"scale\": 0.5}] sets the scales (adapters not listed: 0); a\n"
    "request's \"lora\": [{\"id\", \"scale\"}] gives its own. Requests with different\n"
    "adapters or scales are decoded together in the same steps.\n"
    "\n"
    "SIGINT or SIGTERM stops taking requests, finishes the running ones and exits 0; a second\n"
    "SIGINT quits at once.\n";
// clang-format on

extern const unsigned char tlm_web_index[];
extern const size_t tlm_web_index_len;

typedef struct {
    srv_sched *sched;
    const tlm_tokenizer *tok;
    tlm_chat_template tpl;
    const char *model_id;
    const char *model_path;
    const char *api_key;
    srv_defaults defaults; /* the requests' defaults from the command line */
    const char *slot_dir;  /* --slot-save-path: where slots are saved and restored from */
    int webui;             /* the chat page at / (--no-webui: off) */
    size_t max_body;
    /* Request bodies being received, in all (allocated bytes), and their budget: clients that
     * send slowly cannot make the server hold more than this, however many they are. */
    _Atomic size_t buffered;
    size_t max_buffered;
    int timeout; /* seconds to receive a whole request */
    int ctx, parallel;
    int conn_nice; /* nice value of connection threads (10; TLM_SERVE_NICE in benchmark builds) */
    time_t created;
    _Atomic int draining;
    _Atomic int active; /* generation requests not yet answered in full */
    pthread_mutex_t mu;
    unsigned long long by_status[600];
    srv_lora_set lora;  /* the adapters and their scales for requests without their own (mu) */
    tlm_spec_opts spec; /* speculative decoding's limits for requests without their own */
    int embeddings;     /* --embeddings: POST /v1/embeddings and /embeddings answer */
    srv_pooling pooling;
    int embd_normalize; /* --embd-normalize: the requests' default */
    int d_model;
} server;

/* ---- small helpers ------------------------------------------------------------------------ */

static void count_status(server *sv, int status) {
    pthread_mutex_lock(&sv->mu);
    if (status >= 0 && status < 600) sv->by_status[status]++;
    pthread_mutex_unlock(&sv->mu);
}

static enum MHD_Result send_body(server *sv, struct MHD_Connection *c, int status, const char *type,
                                 const char *body, size_t len, int copy) {
    struct MHD_Response *r = MHD_create_response_from_buffer(
        len, (void *)body, copy ? MHD_RESPMEM_MUST_COPY : MHD_RESPMEM_MUST_FREE);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
    if (status == 429 || status == 503) MHD_add_response_header(r, "Retry-After", "1");
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    count_status(sv, status);
    return ok;
}

static void add_fixed(cJSON *o, const char *name, const char *s, size_t n) {
    char *f = srv_utf8_fix(s, n);
    cJSON_AddStringToObject(o, name, f ? f : "");
    free(f);
}

static enum MHD_Result send_json(server *sv, struct MHD_Connection *c, int status, cJSON *j) {
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!s) return MHD_NO;
    return send_body(sv, c, status, "application/json", s, strlen(s), 0);
}

static enum MHD_Result send_error(server *sv, struct MHD_Connection *c, int status,
                                  const char *param, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    char *body = srv_error_json(status, param, msg);
    if (!body) return MHD_NO;
    return send_body(sv, c, status, "application/json", body, strlen(body), 0);
}

/* The client went away: the socket reads end-of-file (checked without consuming anything). */
static int client_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    char b;
    ssize_t r = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* ---- generation --------------------------------------------------------------------------- */

typedef struct {
    server *sv;
    struct MHD_Connection *conn;
    srv_request req;
    char *stops[SRV_MAX_STOP + 1];
    int n_stops;
    srv_job *jobs[SRV_MAX_N];
    int n_jobs;
    srv_response resp;
    size_t out_pos; /* bytes of resp.out already handed to the library */
    int done;
    int32_t *bias_id; /* the request's logit_bias, resolved to token ids */
    float *bias;
    int n_bias;
} gen;

static void gen_free(gen *g) {
    if (!g) return;
    g->sv->active--;
    for (int i = 0; i < g->n_jobs; i++) {
        srv_sched_release(g->sv->sched, g->jobs[i]);
        srv_job_free(g->jobs[i]);
    }
    srv_request_free(&g->req);
    srv_response_free(&g->resp);
    free(g->bias_id);
    free(g->bias);
    free(g);
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    gen *g = cls;
    for (;;) {
        srv_response *r = &g->resp;
        if (g->out_pos < r->out_len) {
            size_t n = r->out_len - g->out_pos;
            if (n > max) n = max;
            memcpy(buf, r->out + g->out_pos, n);
            g->out_pos += n;
            if (g->out_pos == r->out_len) g->out_pos = r->out_len = 0;
            return (ssize_t)n;
        }
        if (g->done) return MHD_CONTENT_READER_END_OF_STREAM;
        if (client_gone(g->conn)) return MHD_CONTENT_READER_END_WITH_ERROR;
        srv_sched_lock(g->sv->sched);
        g->done = srv_response_stream(r);
        if (!g->done && r->out_len == 0) srv_sched_wait(g->sv->sched, 100);
        srv_sched_unlock(g->sv->sched);
    }
}

static void stream_free(void *cls) { gen_free(cls); }

/* Prompt ids for the request: the template and tokenizer for chat, the text or ids given for
 * completions. SentencePiece vocabularies start with BOS, as their models were trained. */
/* llama-server's mixed prompt: ids as they are, text tokenized (the first piece, when text, after
 * a BOS where the vocabulary adds one). */
static int pieces_ids(gen *g, int32_t **ids, size_t *n, char *err, size_t errlen) {
    server *sv = g->sv;
    const srv_request *r = &g->req;
    int32_t bos = tlm_tokenizer_bos(sv->tok), *out = NULL;
    size_t len = 0, cap = 0;
    int ok = 1;
    if (r->pieces[0].id < 0 && bos >= 0 && tlm_tokenizer_add_bos(sv->tok)) {
        out = malloc(16 * sizeof *out);
        cap = 16;
        if (out) out[len++] = bos;
        ok = out != NULL;
    }
    for (int i = 0; ok && i < r->n_pieces; i++) {
        int32_t *v = NULL, one = r->pieces[i].id;
        size_t nv = 1;
        if (one < 0 && tlm_tokenizer_encode(sv->tok, r->pieces[i].text, strlen(r->pieces[i].text),
                                            0, &v, &nv)) {
            free(out);
            return snprintf(err, errlen, "tokenizing the prompt: %s", tlm_last_error()), -1;
        }
        if (len + nv > cap) {
            cap = (len + nv) * 2;
            int32_t *q = realloc(out, cap * sizeof *out);
            if (!q)
                ok = 0;
            else
                out = q;
        }
        if (ok) memcpy(out + len, v ? v : &one, nv * sizeof *out);
        if (ok) len += nv;
        free(v);
    }
    if (!ok || !len) {
        free(out);
        return snprintf(err, errlen, ok ? "the prompt is empty" : "out of memory"), -1;
    }
    *ids = out;
    *n = len;
    return 0;
}

/* logit_bias into token ids: an id as it is, text as each token of its tokenization. */
static int resolve_bias(gen *g, char *err, size_t errlen) {
    const srv_request *r = &g->req;
    int V = tlm_tokenizer_vocab_size(g->sv->tok), cap = 0;
    for (int i = 0; i < r->n_bias; i++) {
        const srv_bias *b = &r->bias[i];
        int32_t *v = NULL, one = b->id;
        size_t nv = 1;
        if (b->id < 0 && tlm_tokenizer_encode(g->sv->tok, b->text, strlen(b->text), 0, &v, &nv))
            return snprintf(err, errlen, "tokenizing a logit_bias text: %s", tlm_last_error()), -1;
        if (b->id >= V) {
            free(v);
            return snprintf(err, errlen, "logit_bias: token id %d is outside the vocabulary (%d)",
                            b->id, V),
                   -1;
        }
        if (g->n_bias + (int)nv > cap) {
            cap = (g->n_bias + (int)nv) * 2;
            int32_t *qi = realloc(g->bias_id, (size_t)cap * sizeof *qi);
            if (qi) g->bias_id = qi;
            float *qb = realloc(g->bias, (size_t)cap * sizeof *qb);
            if (qb) g->bias = qb;
            if (!qi || !qb) {
                free(v);
                return snprintf(err, errlen, "out of memory"), -1;
            }
        }
        for (size_t k = 0; k < nv; k++) {
            g->bias_id[g->n_bias] = v ? v[k] : one;
            g->bias[g->n_bias++] = b->bias;
        }
        free(v);
    }
    return 0;
}

static int prompt_ids(gen *g, int32_t **ids, size_t *n, char *err, size_t errlen) {
    server *sv = g->sv;
    const srv_request *r = &g->req;
    *ids = NULL;
    *n = 0;
    if (r->pieces) return pieces_ids(g, ids, n, err, errlen);
    if (r->prompt_ids) {
        *ids = malloc((size_t)r->n_prompt_ids * sizeof **ids);
        if (!*ids) return snprintf(err, errlen, "out of memory"), -1;
        memcpy(*ids, r->prompt_ids, (size_t)r->n_prompt_ids * sizeof **ids);
        *n = (size_t)r->n_prompt_ids;
        return 0;
    }
    char *text = NULL;
    unsigned flags = 0;
    if (r->chat) {
        /* tools, calls and their results in the format of the template's family */
        int tools = r->tools && r->tool_choice != SRV_TOOLS_NONE;
        for (int i = 0; i < r->n_messages; i++)
            tools |= !strcmp(r->messages[i].role, "tool") || r->messages[i].tool_calls;
        srv_message *msgs = r->messages;
        int n_msgs = r->n_messages;
        srv_error e;
        int format = srv_tools_format(sv->tpl);
        if (tools && format < 0)
            return snprintf(err, errlen,
                            "tools are written in the Hermes format of ChatML models (Qwen2.5, "
                            "Hermes), in Llama 3.1's and in Mistral Nemo's (mistral-nemo); this "
                            "server's template is %s",
                            tlm_chat_template_name(sv->tpl)),
                   -1;
        /* the answer is parsed, and a required call made, in the template's format */
        if (tools && srv_tools_set_format(&g->req, format, &e))
            return snprintf(err, errlen, "%s", e.message), -1;
        if (tools && format == SRV_TOOLFMT_MISTRAL) {
            if (srv_tools_prompt(r, &text, &e)) return snprintf(err, errlen, "%s", e.message), -1;
        } else if (tools && srv_tools_messages(r, &msgs, &n_msgs, &e))
            return snprintf(err, errlen, "%s", e.message), -1;
        tlm_status ts = text ? TLM_OK : srv_template_apply(sv->tpl, msgs, n_msgs, &text);
        if (msgs != r->messages) srv_messages_free(msgs, n_msgs);
        if (ts) return snprintf(err, errlen, "%s", tlm_last_error()), -1;
        flags |= TLM_ENCODE_ALLOW_SPECIAL;
    }
    const char *src = r->chat ? text : r->prompt;
    int32_t bos = tlm_tokenizer_bos(sv->tok);
    int32_t *v = NULL;
    size_t nv = 0;
    if (tlm_tokenizer_encode(sv->tok, src, strlen(src), flags, &v, &nv)) {
        free(text);
        return snprintf(err, errlen, "tokenizing the prompt: %s", tlm_last_error()), -1;
    }
    free(text);
    int add_bos = bos >= 0 && (nv == 0 || (tlm_tokenizer_add_bos(sv->tok) && v[0] != bos));
    if (add_bos) {
        int32_t *w = malloc((nv + 1) * sizeof *w);
        if (!w) {
            free(v);
            return snprintf(err, errlen, "out of memory"), -1;
        }
        w[0] = bos;
        if (nv) memcpy(w + 1, v, nv * sizeof *w);
        free(v);
        v = w;
        nv++;
    }
    if (nv == 0) {
        free(v);
        return snprintf(err, errlen, "the prompt is empty and the vocabulary has no BOS"), -1;
    }
    *ids = v;
    *n = nv;
    return 0;
}

/* shape: SRV_COMPLETIONS, SRV_CHAT or SRV_NATIVE (llama-server's /completion) */
static enum MHD_Result handle_generate(server *sv, struct MHD_Connection *c, const char *body,
                                       size_t len, int shape) {
    int chat = shape == SRV_CHAT;
    if (sv->draining) return send_error(sv, c, 503, NULL, "the server is shutting down");
    gen *g = calloc(1, sizeof *g);
    if (!g) return send_error(sv, c, 500, NULL, "out of memory");
    sv->active++;
    g->sv = sv;
    g->conn = c;
    srv_error e;
    if (srv_request_parse_with(body, len, shape, &sv->defaults, &g->req, &e)) {
        gen_free(g);
        return send_error(sv, c, e.status, e.param, "%s", e.message);
    }
    srv_request *r = &g->req;
    if (r->n > sv->parallel) {
        int n = r->n;
        gen_free(g);
        return send_error(sv, c, 400, "n",
                          "'n' is %d but the server decodes at most %d sequences at once "
                          "(--parallel)",
                          n, sv->parallel);
    }
    int32_t *ids = NULL;
    size_t n_ids = 0;
    char err[256];
    if (prompt_ids(g, &ids, &n_ids, err, sizeof err)) {
        gen_free(g);
        return send_error(sv, c, 400, chat ? "messages" : "prompt", "%s", err);
    }
    if (resolve_bias(g, err, sizeof err)) {
        free(ids);
        gen_free(g);
        return send_error(sv, c, 400, "logit_bias", "%s", err);
    }
    if (n_ids > (size_t)sv->ctx) {
        free(ids);
        gen_free(g);
        return send_error(sv, c, 400, chat ? "messages" : "prompt",
                          "the prompt has %zu tokens but the context holds %d", n_ids, sv->ctx);
    }
    float lora_scale[SRV_MAX_LORA] = {0};
    pthread_mutex_lock(&sv->mu);
    int bad_lora = srv_lora_scales(&sv->lora, r, lora_scale, &e);
    pthread_mutex_unlock(&sv->mu);
    if (bad_lora) {
        free(ids);
        gen_free(g);
        return send_error(sv, c, e.status, e.param, "%s", e.message);
    }
    for (int i = 0; i < r->n_stop; i++) g->stops[g->n_stops++] = r->stop[i];
    int32_t end_id = -1;
    if (chat) {
        const char *end = tlm_chat_template_end(sv->tpl);
        g->stops[g->n_stops++] = (char *)end;
        end_id = tlm_tokenizer_find(sv->tok, end, strlen(end));
        if (end_id >= 0 && !tlm_tokenizer_is_special(sv->tok, end_id)) end_id = -1;
    }
    uint64_t seed =
        r->seed_given ? r->sampling.seed : (uint64_t)time(NULL) ^ ((uint64_t)(uintptr_t)g << 16);
    for (int i = 0; i < r->n; i++) {
        srv_job *j = srv_job_new(ids, (int)n_ids);
        if (!j) break;
        j->max_tokens = r->max_tokens;
        j->sampling = r->sampling;
        j->sampling.seed = seed;
        j->sampling.stream = (uint64_t)i;
        j->stop = g->stops;
        j->n_stop = g->n_stops;
        j->end_id = end_id;
        j->logprobs = r->logprobs;
        j->top_logprobs = r->top_logprobs;
        memcpy(j->lora_scale, lora_scale, sizeof j->lora_scale);
        j->grammar = r->grammar;
        j->spec_n_max = r->spec_n_max;
        j->spec_n_min = r->spec_n_min;
        j->spec_p_min = r->spec_p_min;
        j->bias_id = g->bias_id;
        j->bias = g->bias;
        j->n_bias = g->n_bias;
        j->ignore_eos = r->ignore_eos;
        j->keep_ids = r->native;
        g->jobs[g->n_jobs++] = j;
    }
    free(ids);
    if (g->n_jobs != r->n) {
        gen_free(g);
        return send_error(sv, c, 500, NULL, "out of memory");
    }
    time_t created = time(NULL);
    static unsigned long long counter;
    pthread_mutex_lock(&sv->mu);
    unsigned long long k = ++counter;
    pthread_mutex_unlock(&sv->mu);
    char id[48];
    snprintf(id, sizeof id, "%s-%llx%llx", chat ? "chatcmpl" : "cmpl", (unsigned long long)created,
             k);
    if (srv_response_init(&g->resp, sv->tok, sv->model_id, &g->req, g->jobs, g->n_jobs, id,
                          (long long)created)) {
        gen_free(g);
        return send_error(sv, c, 500, NULL, "out of memory");
    }
    g->resp.n_ctx = sv->ctx;
    tlm_status st = srv_sched_submit(sv->sched, g->jobs, g->n_jobs);
    if (st) {
        /* Never queued: nothing to release. */
        int status = st == TLM_ERR_RANGE && strstr(tlm_last_error(), "queue") ? 429
                     : st == TLM_ERR_INTERRUPTED                              ? 503
                                                                              : 400;
        char msg[256];
        snprintf(msg, sizeof msg, "%s", tlm_last_error());
        for (int i = 0; i < g->n_jobs; i++) srv_job_free(g->jobs[i]);
        g->n_jobs = 0;
        gen_free(g);
        return send_error(sv, c, status, NULL, "%s", msg);
    }
    if (r->stream) {
        struct MHD_Response *resp = MHD_create_response_from_callback(
            MHD_SIZE_UNKNOWN, 4096, stream_reader, g, stream_free);
        if (!resp) {
            gen_free(g);
            return send_error(sv, c, 500, NULL, "out of memory");
        }
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        MHD_add_response_header(resp, "Access-Control-Allow-Origin", "*");
        enum MHD_Result ok = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        count_status(sv, 200);
        return ok;
    }
    /* Not streamed: this connection's thread waits for the answer, watching the socket so that a
     * client that gives up frees its slots at once. */
    srv_sched_lock(sv->sched);
    for (;;) {
        int done = 1;
        for (int i = 0; i < g->n_jobs; i++) done &= g->jobs[i]->done;
        if (done) break;
        srv_sched_wait(sv->sched, 100);
        srv_sched_unlock(sv->sched);
        int gone = client_gone(c);
        srv_sched_lock(sv->sched);
        if (gone) {
            srv_sched_unlock(sv->sched);
            gen_free(g);
            count_status(sv, 499);
            return MHD_NO;
        }
    }
    for (int i = 0; i < g->n_jobs; i++)
        if (g->jobs[i]->finish == SRV_FINISH_ERROR) {
            char msg[256];
            snprintf(msg, sizeof msg, "%s", g->jobs[i]->error);
            srv_sched_unlock(sv->sched);
            gen_free(g);
            return send_error(sv, c, 500, NULL, "%s", msg);
        }
    char *out = srv_response_final(&g->resp);
    srv_sched_unlock(sv->sched);
    gen_free(g);
    if (!out) return send_error(sv, c, 500, NULL, "out of memory");
    return send_body(sv, c, 200, "application/json", out, strlen(out), 0);
}

/* ---- the other endpoints ------------------------------------------------------------------ */

/* One input's ids: its ids as given, or its text tokenized as llama-server does (special tokens
 * parsed, BOS where the vocabulary adds one). */
static int embed_ids(server *sv, const srv_embed_input *in, int32_t **ids, int *n, char *err,
                     size_t errlen) {
    *ids = NULL;
    *n = 0;
    if (!in->text) {
        for (int i = 0; i < in->n_ids; i++)
            if (in->ids[i] >= tlm_tokenizer_vocab_size(sv->tok))
                return snprintf(err, errlen, "token id %d is outside the vocabulary (%d)",
                                in->ids[i], (int)tlm_tokenizer_vocab_size(sv->tok)),
                       -1;
        if (!(*ids = malloc((size_t)in->n_ids * sizeof **ids)))
            return snprintf(err, errlen, "out of memory"), -1;
        memcpy(*ids, in->ids, (size_t)in->n_ids * sizeof **ids);
        *n = in->n_ids;
        return 0;
    }
    unsigned flags = TLM_ENCODE_ALLOW_SPECIAL;
    if (tlm_tokenizer_add_bos(sv->tok) && tlm_tokenizer_bos(sv->tok) >= 0)
        flags |= TLM_ENCODE_ADD_BOS;
    size_t nv = 0;
    if (tlm_tokenizer_encode(sv->tok, in->text, strlen(in->text), flags, ids, &nv))
        return snprintf(err, errlen, "tokenizing the input: %s", tlm_last_error()), -1;
    if (nv == 0) return snprintf(err, errlen, "an input is empty (no tokens)"), -1;
    *n = (int)nv;
    return 0;
}

/* With pooling none a request's answer holds every token's row: a bound on them keeps one request
 * from holding gigabytes (64M floats, 256 MiB, and several times that as JSON text). */
#define EMBED_MAX_ROW_FLOATS (64 << 20)

/* POST /v1/embeddings (oai) and llama-server's /embeddings and /embedding. */
static enum MHD_Result handle_embeddings(server *sv, struct MHD_Connection *c, const char *body,
                                         size_t len, int oai) {
    if (!sv->embeddings)
        return send_error(sv, c, 501, NULL,
                          "This server does not support embeddings. Start it with `--embeddings`");
    if (oai && sv->pooling == SRV_POOL_NONE)
        return send_error(sv, c, 400, NULL,
                          "Pooling type 'none' is not OAI compatible. Please use a different "
                          "pooling type");
    srv_embed_request r;
    srv_error e;
    if (srv_embed_parse(body, len, oai, sv->embd_normalize, &r, &e))
        return send_error(sv, c, e.status, e.param, "%s", e.message);
    int d = sv->d_model, n = r.n_inputs, status = 200;
    long long total = 0;
    float **vecs = calloc((size_t)n, sizeof *vecs);
    int *rows = calloc((size_t)n, sizeof *rows);
    char err[300] = "";
    if (!vecs || !rows) {
        snprintf(err, sizeof err, "out of memory");
        status = 500;
    }
    for (int i = 0; i < n && status == 200; i++) {
        int32_t *ids = NULL;
        if (embed_ids(sv, &r.inputs[i], &ids, &rows[i], err, sizeof err)) {
            status = 400;
            break;
        }
        total += rows[i];
        if (sv->pooling == SRV_POOL_NONE && total * d > EMBED_MAX_ROW_FLOATS) {
            snprintf(
                err, sizeof err,
                "the per-token embeddings of these inputs exceed %d values (%lld tokens of %d); "
                "send fewer inputs per request",
                EMBED_MAX_ROW_FLOATS, total, d);
            free(ids);
            status = 400;
            break;
        }
        if (rows[i] > sv->ctx) {
            snprintf(err, sizeof err,
                     "input %d is %d tokens, more than the context of %d positions (--ctx)", i,
                     rows[i], sv->ctx);
            free(ids);
            status = 400;
            break;
        }
        float *hidden = malloc((size_t)rows[i] * (size_t)d * sizeof *hidden);
        srv_embed_op op = {.ids = ids, .n = rows[i], .hidden = hidden};
        if (!hidden) {
            snprintf(err, sizeof err, "out of memory");
            status = 500;
        } else if (srv_sched_embed(sv->sched, &op)) {
            snprintf(err, sizeof err, "%s", tlm_last_error());
            status = 503;
        } else if (op.status) {
            snprintf(err, sizeof err, "%s", op.error);
            status = op.status;
        }
        free(ids);
        if (status != 200) {
            free(hidden);
            break;
        }
        if (sv->pooling == SRV_POOL_NONE) {
            vecs[i] = hidden;
            continue;
        }
        /* pooled rows are normalized (embd_normalize), every token's rows are not */
        srv_embed_pool(sv->pooling, hidden, rows[i], d, hidden);
        srv_embed_normalize(hidden, d, r.normalize);
        /* only the pooled vector is kept while the other inputs run */
        float *v = realloc(hidden, (size_t)d * sizeof *v);
        vecs[i] = v ? v : hidden;
    }
    char *out =
        status == 200 ? srv_embed_response(&r, sv->pooling, vecs, rows, d, sv->model_id) : NULL;
    for (int i = 0; vecs && i < n; i++) free(vecs[i]);
    free(vecs);
    free(rows);
    srv_embed_request_free(&r);
    if (status != 200) return send_error(sv, c, status, "input", "%s", err);
    if (!out) return send_error(sv, c, 500, NULL, "out of memory");
    return send_body(sv, c, 200, "application/json", out, strlen(out), 0);
}

static enum MHD_Result handle_tokenize(server *sv, struct MHD_Connection *c, const char *body,
                                       size_t len) {
    cJSON *root = cJSON_ParseWithLength(body, len);
    const cJSON *content = root ? cJSON_GetObjectItemCaseSensitive(root, "content") : NULL;
    if (!cJSON_IsString(content)) {
        cJSON_Delete(root);
        return send_error(sv, c, 400, "content", "the body must be {\"content\": \"text\"}");
    }
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(root, "add_special");
    const cJSON *parse = cJSON_GetObjectItemCaseSensitive(root, "parse_special");
    const char *text = content->valuestring;
    if (!srv_utf8_valid(text, strlen(text))) {
        cJSON_Delete(root);
        return send_error(sv, c, 400, "content", "'content' is not valid UTF-8");
    }
    /* llama-server's defaults: special tokens parsed unless parse_special is false */
    unsigned flags = cJSON_IsFalse(parse) ? 0 : TLM_ENCODE_ALLOW_SPECIAL;
    int pieces = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "with_pieces"));
    if (cJSON_IsTrue(add) && tlm_tokenizer_bos(sv->tok) >= 0) flags |= TLM_ENCODE_ADD_BOS;
    int32_t *ids = NULL;
    size_t n = 0;
    if (tlm_tokenizer_encode(sv->tok, text, strlen(text), flags, &ids, &n)) {
        cJSON_Delete(root);
        return send_error(sv, c, 400, "content", "%s", tlm_last_error());
    }
    cJSON_Delete(root);
    cJSON *out = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(out, "tokens");
    for (size_t i = 0; i < n; i++) {
        if (!pieces) {
            cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
            continue;
        }
        /* with_pieces: {"id", "piece"}, the piece a string when it is whole UTF-8, else its
         * bytes */
        const char *b = "";
        size_t bn = 0;
        tlm_tokenizer_piece(sv->tok, ids[i], &b, &bn);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "id", ids[i]);
        char *s = srv_utf8_valid(b, bn) ? malloc(bn + 1) : NULL;
        if (s) {
            memcpy(s, b, bn);
            s[bn] = 0;
            cJSON_AddStringToObject(o, "piece", s);
            free(s);
        } else {
            cJSON *bytes = cJSON_AddArrayToObject(o, "piece");
            for (size_t k = 0; k < bn; k++)
                cJSON_AddItemToArray(bytes, cJSON_CreateNumber((unsigned char)b[k]));
        }
        cJSON_AddItemToArray(arr, o);
    }
    free(ids);
    return send_json(sv, c, 200, out);
}

static enum MHD_Result handle_detokenize(server *sv, struct MHD_Connection *c, const char *body,
                                         size_t len) {
    cJSON *root = cJSON_ParseWithLength(body, len);
    const cJSON *toks = root ? cJSON_GetObjectItemCaseSensitive(root, "tokens") : NULL;
    if (!cJSON_IsArray(toks)) {
        cJSON_Delete(root);
        return send_error(sv, c, 400, "tokens", "the body must be {\"tokens\": [ids]}");
    }
    int n = cJSON_GetArraySize(toks), i = 0;
    int32_t *ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
    const cJSON *x;
    int32_t V = tlm_tokenizer_vocab_size(sv->tok);
    cJSON_ArrayForEach(x, toks) {
        if (!ids || !cJSON_IsNumber(x) || x->valuedouble != (int32_t)x->valuedouble ||
            x->valuedouble < 0 || x->valuedouble >= V) {
            free(ids);
            cJSON_Delete(root);
            return send_error(sv, c, 400, "tokens", "'tokens' must hold ids in [0, %d)", (int)V);
        }
        ids[i++] = (int32_t)x->valuedouble;
    }
    cJSON_Delete(root);
    char *text = NULL;
    size_t tl = 0;
    tlm_status st =
        tlm_tokenizer_decode(sv->tok, ids, (size_t)n, TLM_DECODE_SKIP_SPECIAL, &text, &tl);
    free(ids);
    if (st) return send_error(sv, c, 400, "tokens", "%s", tlm_last_error());
    cJSON *out = cJSON_CreateObject();
    add_fixed(out, "content", text, tl);
    free(text);
    return send_json(sv, c, 200, out);
}

/* llama-server's adapter list: GET lists them with their scales, POST sets the scales. */
static enum MHD_Result handle_lora(server *sv, struct MHD_Connection *c, int post, const char *body,
                                   size_t len) {
    srv_error e;
    pthread_mutex_lock(&sv->mu);
    int bad = post ? srv_lora_post(&sv->lora, body, len, &e) : 0;
    char *out = bad ? NULL : srv_lora_list_json(&sv->lora);
    pthread_mutex_unlock(&sv->mu);
    if (bad) return send_error(sv, c, e.status, e.param, "%s", e.message);
    if (!out) return send_error(sv, c, 500, NULL, "out of memory");
    if (post) {
        free(out);
        out = strdup("{\"success\": true}");
        if (!out) return send_error(sv, c, 500, NULL, "out of memory");
    }
    return send_body(sv, c, 200, "application/json", out, strlen(out), 0);
}

/* llama-server's GET /props: the defaults a /completion gets, the slots, the model and template. */
static enum MHD_Result handle_props(server *sv, struct MHD_Connection *c) {
    cJSON *out = cJSON_CreateObject();
    cJSON *d = cJSON_AddObjectToObject(out, "default_generation_settings");
    cJSON_AddNumberToObject(d, "n_ctx", sv->ctx);
    cJSON *p = cJSON_AddObjectToObject(d, "params");
    /* what a /completion without sampling fields gets */
    srv_request r;
    srv_error e;
    const char *none = "{\"prompt\": \"\"}";
    if (!srv_request_parse_with(none, strlen(none), SRV_NATIVE, &sv->defaults, &r, &e)) {
        const tlm_sampler_opts *so = &r.sampling;
        cJSON_AddNumberToObject(p, "n_predict", r.max_tokens);
        cJSON_AddNumberToObject(p, "temperature", so->temperature);
        cJSON_AddNumberToObject(p, "top_k", so->top_k);
        cJSON_AddNumberToObject(p, "top_p", so->top_p);
        cJSON_AddNumberToObject(p, "min_p", so->min_p);
        cJSON_AddNumberToObject(p, "repeat_penalty", so->repeat_penalty ? so->repeat_penalty : 1);
        cJSON_AddNumberToObject(p, "repeat_last_n", so->penalty_last_n ? so->penalty_last_n : 64);
        cJSON_AddNumberToObject(p, "presence_penalty", so->presence_penalty);
        cJSON_AddNumberToObject(p, "frequency_penalty", so->frequency_penalty);
        cJSON_AddNumberToObject(p, "seed", r.seed_given ? (double)so->seed : -1);
        cJSON_AddNumberToObject(p, "speculative.n_max", sv->spec.draft_max);
        cJSON_AddNumberToObject(p, "speculative.n_min", sv->spec.draft_min);
        cJSON_AddNumberToObject(p, "speculative.p_min", sv->spec.draft_p_min);
        srv_request_free(&r);
    }
    cJSON_AddNumberToObject(out, "total_slots", sv->parallel);
    cJSON_AddStringToObject(out, "model_alias", sv->model_id);
    cJSON_AddStringToObject(out, "model_path", sv->model_path);
    cJSON_AddStringToObject(out, "chat_template", tlm_chat_template_name(sv->tpl));
    cJSON_AddStringToObject(out, "build_info", "tlm " TLM_VERSION);
    cJSON *mod = cJSON_AddObjectToObject(out, "modalities");
    cJSON_AddBoolToObject(mod, "vision", 0);
    cJSON_AddBoolToObject(mod, "audio", 0);
    return send_json(sv, c, 200, out);
}

/* llama-server's GET /slots: each slot's state. */
static enum MHD_Result handle_slots(server *sv, struct MHD_Connection *c) {
    cJSON *out = cJSON_CreateArray();
    for (int b = 0; b < sv->parallel; b++) {
        srv_slot_info in;
        srv_sched_slot_info(sv->sched, b, &in);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "id", b);
        cJSON_AddNumberToObject(o, "n_ctx", sv->ctx);
        cJSON_AddBoolToObject(o, "is_processing", in.busy);
        cJSON_AddNumberToObject(o, "n_tokens", in.n_tokens);
        cJSON_AddNumberToObject(o, "n_prompt_tokens", in.prompt_tokens);
        cJSON *nt = cJSON_AddObjectToObject(o, "next_token");
        cJSON_AddBoolToObject(nt, "has_next_token", in.busy);
        cJSON_AddNumberToObject(nt, "n_decoded", in.decoded);
        cJSON_AddItemToArray(out, o);
    }
    return send_json(sv, c, 200, out);
}

/* llama-server's POST /slots/{id}?action=save|restore|erase, files by name under --slot-save-path.
 */
static enum MHD_Result handle_slot_action(server *sv, struct MHD_Connection *c, const char *url,
                                          const char *body, size_t len) {
    char *end;
    long id = strtol(url + strlen("/slots/"), &end, 10);
    if (end == url + strlen("/slots/") || *end || id < 0 || id >= sv->parallel)
        return send_error(sv, c, 400, "id_slot", "no slot '%.40s' (the server has %d)",
                          url + strlen("/slots/"), sv->parallel);
    const char *action = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "action");
    srv_slot_op op = {.slot = (int)id};
    if (action && !strcmp(action, "save"))
        op.action = SRV_SLOT_SAVE;
    else if (action && !strcmp(action, "restore"))
        op.action = SRV_SLOT_RESTORE;
    else if (action && !strcmp(action, "erase"))
        op.action = SRV_SLOT_ERASE;
    else
        return send_error(sv, c, 400, "action", "'action' must be save, restore or erase");
    char path[4096], name[256] = "";
    if (op.action != SRV_SLOT_ERASE) {
        if (!sv->slot_dir)
            return send_error(sv, c, 501, NULL, "slots are saved only with --slot-save-path DIR");
        cJSON *root = cJSON_ParseWithLength(body, len);
        const cJSON *f = root ? cJSON_GetObjectItemCaseSensitive(root, "filename") : NULL;
        const char *fn = cJSON_IsString(f) ? f->valuestring : "";
        /* a plain name inside the directory, as llama-server requires */
        int ok = *fn && strlen(fn) < sizeof name && !strchr(fn, '/') && !strchr(fn, '\\') &&
                 strcmp(fn, ".") && strcmp(fn, "..") && srv_utf8_valid(fn, strlen(fn));
        if (ok) snprintf(name, sizeof name, "%s", fn);
        cJSON_Delete(root);
        if (!ok)
            return send_error(sv, c, 400, "filename",
                              "the body must be {\"filename\": NAME}, a file name without a "
                              "directory");
        snprintf(path, sizeof path, "%s/%s", sv->slot_dir, name);
        op.path = path;
    }
    if (srv_sched_slot_op(sv->sched, &op))
        return send_error(sv, c, 400, NULL, "%s", tlm_last_error());
    if (op.status) return send_error(sv, c, op.status, NULL, "%s", op.error);
    cJSON *out = cJSON_CreateObject();
    cJSON_AddNumberToObject(out, "id_slot", (double)id);
    if (op.action == SRV_SLOT_ERASE) {
        cJSON_AddNumberToObject(out, "n_erased", op.n_tokens);
        return send_json(sv, c, 200, out);
    }
    int save = op.action == SRV_SLOT_SAVE;
    cJSON_AddStringToObject(out, "filename", name);
    cJSON_AddNumberToObject(out, save ? "n_saved" : "n_restored", op.n_tokens);
    cJSON_AddNumberToObject(out, save ? "n_written" : "n_read", (double)op.bytes);
    cJSON *t = cJSON_AddObjectToObject(out, "timings");
    cJSON_AddNumberToObject(t, save ? "save_ms" : "restore_ms", op.seconds * 1e3);
    return send_json(sv, c, 200, out);
}

/* llama-server's POST /apply-template: {"messages": [...]} rendered as the chat prompt. */
static enum MHD_Result handle_apply_template(server *sv, struct MHD_Connection *c, const char *body,
                                             size_t len) {
    srv_request r;
    srv_error e;
    if (srv_request_parse(body, len, SRV_CHAT, &r, &e))
        return send_error(sv, c, e.status, e.param, "%s", e.message);
    char *text = NULL;
    tlm_status st = srv_template_apply(sv->tpl, r.messages, r.n_messages, &text);
    srv_request_free(&r);
    if (st) return send_error(sv, c, 400, "messages", "%s", tlm_last_error());
    cJSON *out = cJSON_CreateObject();
    cJSON_AddStringToObject(out, "prompt", text);
    free(text);
    return send_json(sv, c, 200, out);
}

static enum MHD_Result handle_models(server *sv, struct MHD_Connection *c) {
    cJSON *out = cJSON_CreateObject();
    cJSON_AddStringToObject(out, "object", "list");
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", sv->model_id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)sv->created);
    cJSON_AddStringToObject(m, "owned_by", "tlm");
    cJSON *meta = cJSON_AddObjectToObject(m, "meta");
    cJSON_AddNumberToObject(meta, "n_ctx", sv->ctx);
    cJSON_AddNumberToObject(meta, "n_vocab", tlm_tokenizer_vocab_size(sv->tok));
    cJSON_AddNumberToObject(meta, "parallel", sv->parallel);
    cJSON_AddStringToObject(meta, "chat_template", tlm_chat_template_name(sv->tpl));
    cJSON_AddItemToArray(cJSON_AddArrayToObject(out, "data"), m);
    return send_json(sv, c, 200, out);
}

static enum MHD_Result handle_metrics(server *sv, struct MHD_Connection *c) {
    srv_stats st;
    srv_sched_stats(sv->sched, &st);
    size_t cap = 8192, len = 0;
    char *b = malloc(cap);
    if (!b) return MHD_NO;
#define EMIT(...) len += (size_t)snprintf(b + len, len < cap ? cap - len : 0, __VA_ARGS__)
    EMIT("# HELP tlm_requests_total HTTP requests answered, by status.\n"
         "# TYPE tlm_requests_total counter\n");
    pthread_mutex_lock(&sv->mu);
    for (int s = 100; s < 600; s++)
        if (sv->by_status[s]) EMIT("tlm_requests_total{status=\"%d\"} %llu\n", s, sv->by_status[s]);
    pthread_mutex_unlock(&sv->mu);
    EMIT("# HELP tlm_prompt_tokens_total Prompt tokens prefilled.\n"
         "# TYPE tlm_prompt_tokens_total counter\ntlm_prompt_tokens_total %llu\n"
         "# HELP tlm_prompt_tokens_cached_total Prompt tokens reused from a slot's cache or the "
         "prompt cache.\n"
         "# TYPE tlm_prompt_tokens_cached_total counter\ntlm_prompt_tokens_cached_total %llu\n"
         "# HELP tlm_completion_tokens_total Tokens generated.\n"
         "# TYPE tlm_completion_tokens_total counter\ntlm_completion_tokens_total %llu\n",
         (unsigned long long)st.prompt_tokens, (unsigned long long)st.cached_tokens,
         (unsigned long long)st.completion_tokens);
    EMIT("# HELP tlm_decode_steps_total Batched decode steps.\n"
         "# TYPE tlm_decode_steps_total counter\ntlm_decode_steps_total %llu\n"
         "# HELP tlm_decode_tokens_per_second Tokens generated per second of decoding so far.\n"
         "# TYPE tlm_decode_tokens_per_second gauge\ntlm_decode_tokens_per_second %.3f\n"
         "# HELP tlm_prefill_seconds_total Seconds spent prefilling prompts.\n"
         "# TYPE tlm_prefill_seconds_total counter\ntlm_prefill_seconds_total %.6f\n",
         (unsigned long long)st.decode_steps,
         st.decode_seconds > 0 ? (double)st.completion_tokens / st.decode_seconds : 0.0,
         st.prefill_seconds);
    EMIT("# HELP tlm_queue_depth Requests waiting for a slot.\n"
         "# TYPE tlm_queue_depth gauge\ntlm_queue_depth %d\n"
         "# HELP tlm_slots_busy Slots generating.\n# TYPE tlm_slots_busy gauge\ntlm_slots_busy %d\n"
         "# HELP tlm_slots_total Slots (--parallel).\n"
         "# TYPE tlm_slots_total gauge\ntlm_slots_total %d\n",
         st.queued, st.busy, st.slots);
    EMIT("# HELP tlm_prompt_cache_hits_total Requests that continued from a prefix kept in the "
         "prompt cache.\n# TYPE tlm_prompt_cache_hits_total counter\n"
         "tlm_prompt_cache_hits_total %llu\n"
         "# HELP tlm_prompt_cache_bytes Memory held by the prompt cache.\n"
         "# TYPE tlm_prompt_cache_bytes gauge\ntlm_prompt_cache_bytes %zu\n"
         "# HELP tlm_prompt_cache_entries Prefixes in the prompt cache.\n"
         "# TYPE tlm_prompt_cache_entries gauge\ntlm_prompt_cache_entries %d\n",
         (unsigned long long)st.cache_hits, st.cache_bytes, st.cache_entries);
    /* llama-server's names for the same counts, so that its dashboards read tlm too; busy slots
     * per decode is the tokens a decode step produced on average */
    EMIT("# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.\n"
         "# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total %llu\n"
         "# HELP llamacpp:prompt_seconds_total Prompt process time.\n"
         "# TYPE llamacpp:prompt_seconds_total counter\nllamacpp:prompt_seconds_total %.6f\n"
         "# HELP llamacpp:prompt_tokens_seconds Average prompt throughput in tokens/s.\n"
         "# TYPE llamacpp:prompt_tokens_seconds gauge\nllamacpp:prompt_tokens_seconds %.3f\n",
         (unsigned long long)st.prompt_tokens, st.prefill_seconds,
         st.prefill_seconds > 0 ? (double)st.prompt_tokens / st.prefill_seconds : 0.0);
    EMIT("# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.\n"
         "# TYPE llamacpp:tokens_predicted_total counter\nllamacpp:tokens_predicted_total %llu\n"
         "# HELP llamacpp:tokens_predicted_seconds_total Predict process time.\n"
         "# TYPE llamacpp:tokens_predicted_seconds_total counter\n"
         "llamacpp:tokens_predicted_seconds_total %.6f\n"
         "# HELP llamacpp:predicted_tokens_seconds Average generation throughput in tokens/s.\n"
         "# TYPE llamacpp:predicted_tokens_seconds gauge\nllamacpp:predicted_tokens_seconds %.3f\n",
         (unsigned long long)st.completion_tokens, st.decode_seconds,
         st.decode_seconds > 0 ? (double)st.completion_tokens / st.decode_seconds : 0.0);
    EMIT("# HELP llamacpp:requests_processing Number of requests processing.\n"
         "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing %d\n"
         "# HELP llamacpp:requests_deferred Number of requests deferred.\n"
         "# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred %d\n"
         "# HELP llamacpp:n_decode_total Total number of decode calls.\n"
         "# TYPE llamacpp:n_decode_total counter\nllamacpp:n_decode_total %llu\n"
         "# HELP llamacpp:n_busy_slots_per_decode Average number of busy slots per decode call.\n"
         "# TYPE llamacpp:n_busy_slots_per_decode gauge\nllamacpp:n_busy_slots_per_decode %.3f\n",
         st.busy, st.queued, (unsigned long long)st.decode_steps,
         st.decode_steps ? (double)st.completion_tokens / (double)st.decode_steps : 0.0);
    EMIT("# HELP tlm_draft_tokens_total Ids proposed by speculative decoding.\n"
         "# TYPE tlm_draft_tokens_total counter\ntlm_draft_tokens_total %llu\n"
         "# HELP tlm_draft_tokens_accepted_total Proposed ids the model accepted.\n"
         "# TYPE tlm_draft_tokens_accepted_total counter\ntlm_draft_tokens_accepted_total %llu\n",
         (unsigned long long)st.drafted, (unsigned long long)st.accepted);
#undef EMIT
    if (len >= cap) len = cap - 1;
    return send_body(sv, c, 200, "text/plain; version=0.0.4", b, len, 0);
}

/* ---- dispatch ----------------------------------------------------------------------------- */

typedef struct {
    char *body;
    size_t len, cap;
    int too_big, over_budget;
    double start; /* when its headers had arrived */
} upload;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int path_is(const char *url, const char *a) {
    return !strcmp(url, a) || (!strncmp(a, "/v1/", 4) && !strcmp(url, a + 3));
}

static int authorized(server *sv, struct MHD_Connection *c) {
    if (!sv->api_key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    size_t kl = strlen(sv->api_key);
    return h && !strncmp(h, "Bearer ", 7) && strlen(h + 7) == kl && !memcmp(h + 7, sv->api_key, kl);
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url,
                               const char *method, const char *version, const char *data,
                               size_t *data_size, void **con_cls) {
    (void)version;
    server *sv = cls;
    upload *u = *con_cls;
    if (!u) {
        /* Connection threads (one per client) wake at every decode step to stream its tokens; at
         * the same priority they preempt the decode's OpenMP team on a small machine, and one
         * preempted team member stalls a whole parallel region. A lower priority lets them run
         * in the team's gaps instead. Linux gives each thread its own nice value (who = 0: this
         * thread); elsewhere it lowers the process, harmlessly. */
        static _Thread_local int niced;
        if (!niced && sv->conn_nice) setpriority(PRIO_PROCESS, 0, sv->conn_nice);
        niced = 1;
        u = calloc(1, sizeof *u);
        if (!u) return MHD_NO;
        u->start = now_s();
        *con_cls = u;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > sv->max_body) u->too_big = 1;
        return MHD_YES;
    }
    if (*data_size) {
        /* A body that takes longer than --timeout to arrive closes its connection: a client
         * sending a byte at a time would otherwise hold its thread for as long as it likes. */
        if (now_s() - u->start > sv->timeout) return MHD_NO;
        if (!u->too_big && u->len + *data_size > sv->max_body) u->too_big = 1;
        if (!u->too_big && !u->over_budget) {
            if (u->len + *data_size + 1 > u->cap) {
                size_t cap = (u->len + *data_size + 1) * 2;
                if (cap > sv->max_body + 1) cap = sv->max_body + 1;
                size_t held = atomic_fetch_add(&sv->buffered, cap - u->cap) + (cap - u->cap);
                if (held > sv->max_buffered) {
                    atomic_fetch_sub(&sv->buffered, cap - u->cap);
                    u->over_budget = 1;
                    *data_size = 0;
                    return MHD_YES;
                }
                char *q = realloc(u->body, cap);
                if (!q) {
                    atomic_fetch_sub(&sv->buffered, cap - u->cap);
                    return MHD_NO;
                }
                u->body = q;
                u->cap = cap;
            }
            memcpy(u->body + u->len, data, *data_size);
            u->len += *data_size;
            u->body[u->len] = 0;
        }
        *data_size = 0;
        return MHD_YES;
    }
    if (u->too_big)
        return send_error(sv, c, 413, NULL, "the request body exceeds %zu bytes (--max-body)",
                          sv->max_body);
    if (u->over_budget)
        return send_error(sv, c, 503, NULL,
                          "the server holds %zu MiB of request bodies still arriving; retry",
                          sv->max_buffered >> 20);
    int get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
    if (!strcmp(method, "OPTIONS")) {
        struct MHD_Response *r =
            MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
        MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        MHD_add_response_header(r, "Access-Control-Allow-Headers", "Content-Type, Authorization");
        enum MHD_Result ok = MHD_queue_response(c, 204, r);
        MHD_destroy_response(r);
        count_status(sv, 204);
        return ok;
    }
    if (get && sv->webui && (!strcmp(url, "/") || !strcmp(url, "/index.html")))
        return send_body(sv, c, 200, "text/html; charset=utf-8", (const char *)tlm_web_index,
                         tlm_web_index_len, 1);
    if (get && (!strcmp(url, "/health") || !strcmp(url, "/v1/health"))) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "status", sv->draining ? "shutting down" : "ok");
        return send_json(sv, c, sv->draining ? 503 : 200, o);
    }
    if (!authorized(sv, c))
        return send_error(sv, c, 401, NULL,
                          "missing or wrong API key: send 'Authorization: Bearer KEY'");
    const char *body = u->body ? u->body : "";
    if (get && !strcmp(url, "/metrics")) return handle_metrics(sv, c);
    if (get && path_is(url, "/v1/models")) return handle_models(sv, c);
    if (get && !strcmp(url, "/props")) return handle_props(sv, c);
    if (get && !strcmp(url, "/slots")) return handle_slots(sv, c);
    if (post && !strncmp(url, "/slots/", 7)) return handle_slot_action(sv, c, url, body, u->len);
    if (post && !strcmp(url, "/apply-template")) return handle_apply_template(sv, c, body, u->len);
    /* llama-server's own /completion (and /completions), then OpenAI's under /v1 */
    if (post && (!strcmp(url, "/completion") || !strcmp(url, "/completions")))
        return handle_generate(sv, c, body, u->len, SRV_NATIVE);
    if (post && !strcmp(url, "/v1/completions"))
        return handle_generate(sv, c, body, u->len, SRV_COMPLETIONS);
    if (post && path_is(url, "/v1/chat/completions"))
        return handle_generate(sv, c, body, u->len, SRV_CHAT);
    if (post && !strcmp(url, "/v1/embeddings")) return handle_embeddings(sv, c, body, u->len, 1);
    if (post && (!strcmp(url, "/embeddings") || !strcmp(url, "/embedding")))
        return handle_embeddings(sv, c, body, u->len, 0);
    if (post && !strcmp(url, "/tokenize")) return handle_tokenize(sv, c, body, u->len);
    if ((get || post) && !strcmp(url, "/lora-adapters"))
        return handle_lora(sv, c, post, body, post ? u->len : 0);
    if (post && !strcmp(url, "/detokenize")) return handle_detokenize(sv, c, body, u->len);
    return send_error(sv, c, 404, NULL, "Invalid URL (%s %.200s)", method, url);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe) {
    (void)c, (void)toe;
    server *sv = cls;
    upload *u = *con_cls;
    if (u) {
        atomic_fetch_sub(&sv->buffered, u->cap);
        free(u->body);
        free(u);
    }
    *con_cls = NULL;
}

/* ---- the command -------------------------------------------------------------------------- */

static int stop_pipe[2] = {-1, -1};

static void on_signal(int sig) {
    char b = (char)sig;
    ssize_t r = write(stop_pipe[1], &b, 1);
    (void)r;
}

/* llama-server's flags for the requests' defaults: 1 taken, 0 not one of them, -1 a bad value. */
static int default_flag(int argc, char **argv, int *i, srv_defaults *d) {
    static const struct {
        const char *name, *alt;
        unsigned set;
        double lo, hi;
    } f[] = {{"--temp", NULL, SRV_SET_TEMP, 0, 100},
             {"--top-k", NULL, SRV_SET_TOP_K, 0, TLM_MAX_VOCAB_SIZE},
             {"--top-p", NULL, SRV_SET_TOP_P, 0, 1},
             {"--min-p", NULL, SRV_SET_MIN_P, 0, 1},
             {"--seed", "-s", SRV_SET_SEED, -1, 9007199254740991.0},
             {"--repeat-penalty", NULL, SRV_SET_REPEAT, 0, 10},
             {"--repeat-last-n", NULL, SRV_SET_LAST_N, 0, 1 << 20},
             {"--presence-penalty", NULL, SRV_SET_PRESENCE, -2, 2},
             {"--frequency-penalty", NULL, SRV_SET_FREQUENCY, -2, 2},
             {"--n-predict", "-n", SRV_SET_N_PREDICT, -1, TLM_MAX_CONTEXT_LENGTH}};
    for (size_t k = 0; k < sizeof f / sizeof f[0]; k++) {
        const char *v;
        if (!cli_flag_value(argc, argv, i, f[k].name, f[k].alt, &v)) continue;
        char *end;
        double x = v ? strtod(v, &end) : 0;
        if (!v || end == v || *end || !(x >= f[k].lo && x <= f[k].hi))
            return cli_fail("serve: %s wants a number in [%g, %g], got '%s'", f[k].name, f[k].lo,
                            f[k].hi, v ? v : ""),
                   -1;
        tlm_sampler_opts *s = &d->sampling;
        switch (f[k].set) {
        case SRV_SET_TEMP: s->temperature = (float)x; break;
        case SRV_SET_TOP_K: s->top_k = (int)x; break;
        case SRV_SET_TOP_P: s->top_p = x > 0 ? (float)x : 1e-6f; break;
        case SRV_SET_MIN_P: s->min_p = (float)x; break;
        case SRV_SET_SEED: s->seed = (uint64_t)x; break;
        case SRV_SET_REPEAT: s->repeat_penalty = (float)x; break;
        case SRV_SET_LAST_N: s->penalty_last_n = x > 0 ? (int)x : 64; break;
        case SRV_SET_PRESENCE: s->presence_penalty = (float)x; break;
        case SRV_SET_FREQUENCY: s->frequency_penalty = (float)x; break;
        default: d->max_tokens = (int)x; break;
        }
        /* --seed -1 is llama-server's random seed: no default */
        if (!(f[k].set == SRV_SET_SEED && x < 0)) d->set |= f[k].set;
        return 1;
    }
    return 0;
}

/* llama-server's flags that mean nothing for tlm (GPU layers, batch sizes, HTTP threads, flash
 * attention, ...), accepted so that its command lines run: 1 taken, 0 not one of them. */
static int noop_flag(int argc, char **argv, int *i) {
    static const char *const with_value[] = {"--batch-size",
                                             "-b",
                                             "--ubatch-size",
                                             "-ub",
                                             "--n-gpu-layers",
                                             "-ngl",
                                             "--gpu-layers",
                                             "--threads-batch",
                                             "-tb",
                                             "--threads-http",
                                             "--cache-reuse",
                                             "--keep",
                                             "--split-mode",
                                             "-sm",
                                             "--main-gpu",
                                             "-mg",
                                             "--device",
                                             "-dev",
                                             "--numa",
                                             "--log-file",
                                             "--n-cpu-moe",
                                             "-ncmoe"};
    static const char *const alone[] = {
        "--metrics",      "--slots",    "--no-slots",      "--cont-batching", "-cb",
        "--jinja",        "--no-jinja", "--mlock",         "--log-disable",   "--no-warmup",
        "--cache-prompt", "--no-perf",  "--no-kv-offload", "-nkvo",           "--props"};
    const char *a = argv[*i];
    for (size_t k = 0; k < sizeof alone / sizeof alone[0]; k++)
        if (!strcmp(a, alone[k])) return 1;
    for (size_t k = 0; k < sizeof with_value / sizeof with_value[0]; k++) {
        const char *v;
        if (cli_flag_value(argc, argv, i, with_value[k], NULL, &v)) {
            if (!v) return cli_fail("serve: %s needs a value", a), -1;
            return 1;
        }
    }
    /* --flash-attn and -fa: alone, or with on, off or auto */
    if (!strcmp(a, "--flash-attn") || !strcmp(a, "-fa")) {
        if (*i + 1 < argc && (!strcmp(argv[*i + 1], "on") || !strcmp(argv[*i + 1], "off") ||
                              !strcmp(argv[*i + 1], "auto")))
            (*i)++;
        return 1;
    }
    return 0;
}

static int serve_main(int argc, char **argv, cli_lora *lora) {
    const char *model_path = NULL, *tok_path = NULL, *host = "127.0.0.1", *api_key = NULL;
    const char *tpl_name = NULL, *precision = NULL;
    cli_cache cache = CLI_CACHE_DEFAULT;
    int ck;
    long port = 8080, parallel = 4, ctx = 0, threads = 0, queue = 0, max_body = 1 << 20,
         cache_mib = 1024, timeout = 30;
    int map_mode = CLI_MAP_AUTO, lora_off = 0, webui = 1;
    int embeddings = 0, pooling = -1;
    long embd_norm = 2;
    const char *alias = NULL, *slot_dir = NULL, *draft_path = NULL;
    srv_defaults defaults = {0};
    tlm_spec_opts spec;
    tlm_spec_opts_defaults(&spec);
    long draft_max = spec.draft_max, draft_min = spec.draft_min;
    for (int i = 1; i < argc; i++) {
        const char *v, *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(serve_help, stdout);
            return 0;
        }
        if (cli_map_flag(a, &map_mode)) continue;
        if (!strcmp(a, "--lora-init-without-apply")) {
            lora_off = 1;
            continue;
        }
        if (!strcmp(a, "--lookup")) {
            spec.lookup = 1;
            continue;
        }
        if ((ck = cli_lora_flag("serve", argc, argv, &i, lora)) != 0) {
            if (ck < 0) return 1;
            continue;
        }
        long *num = NULL;
        long lo = 0, hi = 0;
        if (cli_flag_value(argc, argv, &i, "-m", "--model", &v)) {
            model_path = v;
        } else if (cli_flag_value(argc, argv, &i, "-z", "--tokenizer", &v)) {
            tok_path = v;
        } else if (cli_flag_value(argc, argv, &i, "--host", NULL, &v)) {
            host = v;
        } else if (cli_flag_value(argc, argv, &i, "--api-key", NULL, &v)) {
            api_key = v;
        } else if (cli_flag_value(argc, argv, &i, "--chat-template", NULL, &v)) {
            tpl_name = v;
        } else if (cli_flag_value(argc, argv, &i, "--precision", NULL, &v)) {
            precision = v;
        } else if ((ck = cli_cache_flag("serve", argc, argv, &i, &cache)) != 0) {
            if (ck < 0) return 1;
        } else if (cli_flag_value(argc, argv, &i, "--port", NULL, &v)) {
            num = &port, lo = 0, hi = 65535;
        } else if (cli_flag_value(argc, argv, &i, "--parallel", "-np", &v)) {
            num = &parallel, lo = 1, hi = 256;
        } else if (cli_flag_value(argc, argv, &i, "--ctx", "-c", &v) ||
                   cli_flag_value(argc, argv, &i, "--ctx-size", NULL, &v)) {
            num = &ctx, lo = 1, hi = TLM_MAX_CONTEXT_LENGTH;
        } else if (cli_flag_value(argc, argv, &i, "--alias", "-a", &v)) {
            alias = v;
        } else if (cli_flag_value(argc, argv, &i, "--slot-save-path", NULL, &v)) {
            slot_dir = v;
        } else if (cli_flag_value(argc, argv, &i, "-md", "--model-draft", &v)) {
            draft_path = v;
        } else if (cli_flag_value(argc, argv, &i, "--draft-max", "--draft-n", &v) ||
                   cli_flag_value(argc, argv, &i, "--draft", NULL, &v)) {
            num = &draft_max, lo = 1, hi = 256;
        } else if (cli_flag_value(argc, argv, &i, "--draft-min", NULL, &v)) {
            num = &draft_min, lo = 0, hi = 256;
        } else if (cli_flag_value(argc, argv, &i, "--draft-p-min", NULL, &v)) {
            double p;
            if (v && (!cli_parse_float(v, &p) || !(p >= 0 && p <= 1)))
                return cli_fail("serve: --draft-p-min wants a number in [0, 1], got '%s'", v);
            if (v) spec.draft_p_min = (float)p;
        } else if ((ck = default_flag(argc, argv, &i, &defaults)) != 0) {
            if (ck < 0) return 1;
            continue;
        } else if ((ck = noop_flag(argc, argv, &i)) != 0) {
            if (ck < 0) return 1;
            continue;
        } else if (!strcmp(a, "--no-webui")) {
            webui = 0;
            continue;
        } else if (!strcmp(a, "--embeddings") || !strcmp(a, "--embedding")) {
            embeddings = 1;
            continue;
        } else if (cli_flag_value(argc, argv, &i, "--pooling", NULL, &v)) {
            if (v && (pooling = srv_pooling_parse(v)) < 0)
                return cli_fail("serve: --pooling wants none, mean, cls or last, got '%s'", v);
        } else if (cli_flag_value(argc, argv, &i, "--embd-normalize", NULL, &v)) {
            num = &embd_norm, lo = -1, hi = 64;
        } else if (cli_flag_value(argc, argv, &i, "--queue", NULL, &v)) {
            num = &queue, lo = 1, hi = 1 << 16;
        } else if (cli_flag_value(argc, argv, &i, "--cache-ram", "-cram", &v)) {
            num = &cache_mib, lo = 0, hi = 1 << 24;
        } else if (cli_flag_value(argc, argv, &i, "--max-body", NULL, &v)) {
            num = &max_body, lo = 1024, hi = 1 << 30;
        } else if (cli_flag_value(argc, argv, &i, "--timeout", "-to", &v)) {
            num = &timeout, lo = 1, hi = 86400;
        } else if (cli_flag_value(argc, argv, &i, "-t", "--threads", &v)) {
            num = &threads, lo = 1, hi = 4096;
        } else {
            return cli_fail("serve: unknown option '%s' (see tlm serve --help)", a);
        }
        if (!v) return cli_fail("serve: %s needs a value", a);
        if (num && (!cli_parse_int(v, num) || *num < lo || *num > hi))
            return cli_fail("serve: %s wants an integer in [%ld, %ld], got '%s'", a, lo, hi, v);
    }
    if (!model_path) return cli_fail("serve: -m MODEL is required (see tlm serve --help)");
    if (draft_path && spec.lookup) return cli_fail("serve: give -md or --lookup, not both");
    spec.draft_max = (int)draft_max;
    spec.draft_min = (int)draft_min;
    if (spec.draft_min > spec.draft_max)
        return cli_fail("serve: --draft-min %d is more than --draft-max %d", spec.draft_min,
                        spec.draft_max);
    struct sockaddr_in addr = {0};
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1)
        return cli_fail("serve: --host wants an IPv4 address such as 127.0.0.1, got '%s'", host);
    server sv = {0};
    sv.tpl = TLM_CHAT_CHATML;
    const char *nice_env = core_bench_knob("TLM_SERVE_NICE");
    sv.conn_nice = nice_env ? atoi(nice_env) : 10;
    if (tpl_name && !tlm_chat_template_from_name(tpl_name, &sv.tpl))
        return cli_fail("serve: --chat-template '%s' is not one of chatml, llama2, llama3, "
                        "mistral, gemma, phi3, mistral-nemo",
                        tpl_name);
    if (threads) tlm_threads_set((int)threads);
    unsigned lf;
    if (!cli_load_flags("serve", cli_read_mode(model_path, map_mode), precision, &lf)) return 1;

    int rc = 1;
    tlm_model *m = NULL, *md = NULL;
    tlm_tokenizer *tok = NULL;
    struct MHD_Daemon *d = NULL;
    if (tlm_model_load(model_path, lf, &m)) {
        rc = cli_fail_status("serve");
        goto done;
    }
    if (draft_path && tlm_model_load(draft_path, lf, &md)) {
        rc = cli_fail("serve: draft model %s: %s", draft_path, tlm_last_error());
        goto done;
    }
    const tlm_config *cfg = tlm_model_config(m);
    if (tok_path ? tlm_tokenizer_load(tok_path, &tok) : cli_model_tokenizer(model_path, &tok)) {
        rc = cli_fail_status("serve: tokenizer");
        goto done;
    }
    if (!tok) {
        rc = cli_fail("serve: no tokenizer for '%s': give -z TOKENIZER", model_path);
        goto done;
    }
    if (tlm_tokenizer_vocab_size(tok) > cfg->vocab_size) {
        rc = cli_fail("serve: the tokenizer has %d ids but the model only %d",
                      (int)tlm_tokenizer_vocab_size(tok), cfg->vocab_size);
        goto done;
    }
    if (ctx > cfg->context_length) {
        rc = cli_fail("serve: --ctx %ld exceeds the model's context_length %d", ctx,
                      cfg->context_length);
        goto done;
    }
    if (!tpl_name) {
        int present = 0;
        if (!cli_gguf_template(model_path, &sv.tpl, &present) && present)
            fprintf(stderr, "tlm: serve: the model's chat template is not one tlm knows; using "
                            "chatml (choose with --chat-template)\n");
    }
    if (lora->n && cli_lora_load("serve", lora, m)) goto done;
    sv.lora.n = lora->n;
    for (int k = 0; k < lora->n; k++) {
        sv.lora.path[k] = lora->path[k];
        sv.lora.scale[k] = lora_off ? 0.0f : lora->scale[k];
    }
    if (pooling < 0) {
        /* llama-server's default: the model's own pooling, else none (a generative model) */
        pooling = cli_gguf_pooling(model_path);
        if (pooling == 4) {
            rc = cli_fail("serve: the model pools for reranking (rank), which tlm serve lacks");
            goto done;
        }
        if (pooling < 0 || pooling > 3) pooling = SRV_POOL_NONE;
    }
    sv.embeddings = embeddings;
    sv.pooling = (srv_pooling)pooling;
    sv.embd_normalize = (int)embd_norm;
    sv.d_model = cfg->d_model;
    srv_sched_opts so = {.parallel = (int)parallel,
                         .ctx = (int)ctx,
                         .queue_max = (int)queue,
                         .cache_mib = cache_mib,
                         .kv_type = cache.k,
                         .v_type = cache.v,
                         .loras = (const tlm_lora *const *)lora->lora,
                         .n_lora = lora->n,
                         .embeddings = embeddings,
                         .draft = md,
                         .spec = spec};
    /* Loading may have run parallel regions on this thread, which leaves a team of OpenMP threads
     * parked here. With the scheduler thread's team beside it, libgomp manages more threads than
     * there are CPUs (on 2 cores) and cuts its spin before sleeping at a barrier from
     * GOMP_SPINCOUNT to about 100 rounds: every parallel region of a step then costs a futex
     * wake-up, which bench/serve/serve_vs_llamaserver.sh shows at 8 streams. This thread runs no
     * parallel region after this. */
    omp_pause_resource_all(omp_pause_soft);
    if (srv_sched_new(m, tok, &so, &sv.sched)) {
        rc = cli_fail_status("serve");
        goto done;
    }
    const char *base = strrchr(model_path, '/');
    sv.model_id = alias ? alias : base && base[1] ? base + 1 : model_path;
    sv.model_path = model_path;
    sv.defaults = defaults;
    sv.spec = spec;
    sv.webui = webui;
    sv.slot_dir = slot_dir;
    sv.tok = tok;
    sv.api_key = api_key;
    sv.max_body = (size_t)max_body;
    /* room for a few dozen largest bodies at once, and at least 64 MiB */
    sv.max_buffered =
        (size_t)max_body * 32 > ((size_t)64 << 20) ? (size_t)max_body * 32 : (size_t)64 << 20;
    sv.timeout = (int)timeout;
    sv.ctx = srv_sched_ctx(sv.sched);
    sv.parallel = (int)parallel;
    sv.created = time(NULL);
    pthread_mutex_init(&sv.mu, NULL);
    if (pipe(stop_pipe)) {
        rc = cli_fail("serve: pipe: %s", strerror(errno));
        goto done;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    /* A thread per connection, so that clients that send slowly (or not at all) never hold up
     * another's request: thousands of them may be open (poll, not select, past 1024 descriptors),
     * each closed after --timeout, and their bodies held within max_buffered. Generation
     * requests beyond the slots and the queue get 429 however many connections there are. */
    unsigned conn_limit = 4096;
    struct rlimit nofile;
    if (!getrlimit(RLIMIT_NOFILE, &nofile)) {
        if (nofile.rlim_cur < conn_limit + 256 && nofile.rlim_cur < nofile.rlim_max) {
            nofile.rlim_cur =
                nofile.rlim_max < conn_limit + 256 ? nofile.rlim_max : conn_limit + 256;
            setrlimit(RLIMIT_NOFILE, &nofile);
            getrlimit(RLIMIT_NOFILE, &nofile);
        }
        if (nofile.rlim_cur < conn_limit + 256)
            conn_limit = nofile.rlim_cur > 320 ? (unsigned)nofile.rlim_cur - 256 : 64;
    }
    d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL_INTERNAL_THREAD, 0, NULL,
                         NULL, handler, &sv, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                         MHD_OPTION_CONNECTION_LIMIT, conn_limit, MHD_OPTION_CONNECTION_TIMEOUT,
                         (unsigned)timeout, MHD_OPTION_NOTIFY_COMPLETED, completed, &sv,
                         MHD_OPTION_END);
    if (!d) {
        rc = cli_fail("serve: cannot listen on %s:%ld (in use, or not an address of this machine)",
                      host, port);
        goto done;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    /* llama-server reports its cache's size at start-up too */
    char kv_desc[48];
    tlm_dtype kt = srv_sched_kv_type(sv.sched), vt = srv_sched_v_type(sv.sched);
    if (kt == vt)
        snprintf(kv_desc, sizeof kv_desc, "%s", cli_cache_type_name(kt));
    else
        snprintf(kv_desc, sizeof kv_desc, "%s keys, %s values", cli_cache_type_name(kt),
                 cli_cache_type_name(vt));
    printf("tlm serve: %s, %d slots of %d positions, KV cache %s (%.1f MiB), chat template %s\n",
           sv.model_id, sv.parallel, sv.ctx, kv_desc,
           (double)srv_sched_kv_bytes(sv.sched) / 1048576.0, tlm_chat_template_name(sv.tpl));
    if (embeddings) printf("embeddings: pooling %s\n", srv_pooling_name(sv.pooling));
    printf("listening on http://%s:%u/\n", host, di ? di->port : (unsigned)port);
    fflush(stdout);
    char b;
    while (read(stop_pipe[0], &b, 1) < 0 && errno == EINTR) {
    }
    /* A second Ctrl-C ends the process at once. */
    signal(SIGINT, SIG_DFL);
    fprintf(stderr, "tlm: serve: stopping: finishing the running requests (Ctrl-C again to "
                    "quit now)\n");
    sv.draining = 1;
    srv_sched_close(sv.sched);
    for (;;) {
        srv_stats st;
        srv_sched_stats(sv.sched, &st);
        if (!st.busy && !st.queued && !sv.active) break;
        nanosleep(&(struct timespec){0, 20000000}, NULL);
    }
    MHD_stop_daemon(d);
    d = NULL;
    rc = 0;
done:
    if (d) MHD_stop_daemon(d);
    srv_sched_free(sv.sched);
    if (sv.sched) pthread_mutex_destroy(&sv.mu);
    tlm_tokenizer_free(tok);
    tlm_model_free(m);
    tlm_model_free(md);
    return rc;
}

int cmd_serve(int argc, char **argv) {
    cli_lora lora = {0};
    int rc = serve_main(argc, argv, &lora);
    cli_lora_free(&lora);
    return rc;
}
