/* tlm serve's engine without HTTP: chat templates, OpenAI request parsing into plain structs, stop
 * strings, and the continuous-batching scheduler. Only the public API (tlm.h) and core are used, so
 * every piece is testable without a socket (tests/test_serve.c); src/cli/serve_http.c is the
 * libmicrohttpd layer over it. */
#ifndef TLM_SERVE_H
#define TLM_SERVE_H

#include <stddef.h>
#include <stdint.h>

#include "core/core.h"
#include "tlm.h"

/* ---- chat templates (tlm_chat_render) ---------------------------------------------------- */

/* A request's message, owned by the request. */
typedef struct {
    char *role; /* system, user, assistant, tool (developer is read as system) */
    char *content;
    char *tool_calls;   /* an assistant's "tool_calls" (their JSON text), NULL: none */
    char *tool_call_id; /* a tool result's "tool_call_id", NULL: none */
} srv_message;

/* Renders the conversation and opens the assistant's turn. *out is malloc'd, NUL-terminated. */
tlm_status srv_template_apply(tlm_chat_template t, const srv_message *msgs, int n, char **out);

/* ---- requests ----------------------------------------------------------------------------- */

#define SRV_MAX_STOP 16
#define SRV_MAX_TOP_LOGPROBS 20
#define SRV_MAX_N 64
#define SRV_MAX_LORA 32
#define SRV_MAX_BIAS 1024

/* The request shapes srv_request_parse reads. */
enum {
    SRV_COMPLETIONS = 0, /* OpenAI's POST /v1/completions */
    SRV_CHAT = 1,        /* OpenAI's POST /v1/chat/completions */
    SRV_NATIVE = 2,      /* llama-server's POST /completion: its fields, defaults and answer */
};

/* A piece of a llama-server prompt given as an array: token ids and text, in order. */
typedef struct {
    int32_t id; /* -1: text */
    char *text;
} srv_prompt_piece;

/* logit_bias: one entry per token id, or per text (each token of its tokenization). */
typedef struct {
    int32_t id; /* -1: text */
    char *text;
    float bias; /* -INFINITY: never (llama-server's false) */
} srv_bias;

typedef struct {
    int chat;
    int native;          /* llama-server's /completion (SRV_NATIVE) */
    char *prompt;        /* completion text, NULL when given as ids */
    int32_t *prompt_ids; /* completion given as token ids */
    int n_prompt_ids;
    srv_message *messages; /* chat */
    int n_messages;
    int max_tokens; /* -1: until EOS or the context is full */
    tlm_sampler_opts sampling;
    int seed_given;
    char *stop[SRV_MAX_STOP];
    int n_stop;
    int logprobs;     /* 0/1 */
    int top_logprobs; /* 0 .. SRV_MAX_TOP_LOGPROBS */
    int n;            /* choices, 1 .. SRV_MAX_N */
    int stream;
    int include_usage;
    int echo; /* completions: the prompt text starts each choice */
    char *model;
    /* llama-server's "lora": [{"id", "scale"}]: this request's adapter scales (the adapters not
     * listed at 0) in place of the server's; ids are checked against the server's adapters by the
     * caller (srv_lora_scales). */
    int lora_given, n_lora;
    int lora_id[SRV_MAX_LORA];
    float lora_scale[SRV_MAX_LORA];
    /* Structured output: OpenAI's response_format (json_object, json_schema), or llama-server's
     * json_schema (a schema) or grammar (GBNF text); NULL: free text. */
    tlm_grammar *grammar;
    /* llama-server's prompt as a mixed array of ids and text (prompt and prompt_ids unset) */
    srv_prompt_piece *pieces;
    int n_pieces;
    srv_bias *bias; /* logit_bias (both APIs) */
    int n_bias;
    int ignore_eos;    /* the vocabulary's ends of generation are never sampled */
    int return_tokens; /* native: the generated ids in "tokens" */
    /* Chat tools: "tools" (the JSON text of the array), "tool_choice" and
     * "parallel_tool_calls". With tools (and a choice other than none) the answer's tool calls are
     * parsed out of the text; with required or a named function a grammar makes the model call. */
    char *tools;
    int n_tools;
    int tool_choice;    /* SRV_TOOLS_ */
    char *tool_name;    /* the function tool_choice names */
    int parallel_tools; /* several calls in one answer (default 1) */
    int tool_format; /* SRV_TOOLFMT_: how the model writes tools and calls (srv_tools_set_format) */
    /* llama-server's speculative.n_max, speculative.n_min, speculative.p_min; -1: the server's */
    int spec_n_max, spec_n_min;
    float spec_p_min;
} srv_request;

enum { SRV_TOOLS_AUTO = 0, SRV_TOOLS_NONE, SRV_TOOLS_REQUIRED, SRV_TOOLS_NAMED };
/* The tool-call formats: Hermes (ChatML models: Qwen2.5, Hermes), Meta's Llama 3.1+ (the tools
 * in the first user message, a call as {"name", "parameters"}, results in ipython turns) and
 * Mistral's (Nemo: [AVAILABLE_TOOLS], [TOOL_CALLS] and [TOOL_RESULTS] blocks). */
enum { SRV_TOOLFMT_HERMES = 0, SRV_TOOLFMT_LLAMA3, SRV_TOOLFMT_MISTRAL };

typedef struct {
    int status;        /* HTTP status: 400 for everything the parser refuses */
    char message[256]; /* for the client */
    char param[48];    /* the offending field, "" when none */
} srv_error;

/* Parses a body of the given shape (SRV_COMPLETIONS, SRV_CHAT or SRV_NATIVE). Types and ranges
 * are checked; unknown fields are ignored (clients send many), and llama-server's samplers that
 * tlm lacks are refused when set to anything but their neutral value; strings must be valid
 * UTF-8. Returns 0, or -1 with *e filled (and r freed). */
int srv_request_parse(const char *body, size_t len, int shape, srv_request *r, srv_error *e);
/* e as a 400 about param (NULL: none) with a formatted message; returns -1, the parsers' failure.
 */
int srv_fail(srv_error *e, const char *param, const char *fmt, ...) CORE_PRINTF(3, 4);

/* The server's own defaults (llama-server's --temp, --top-k, --top-p, --min-p, --seed,
 * --repeat-penalty, --repeat-last-n, --presence-penalty, --frequency-penalty, --n-predict): each
 * field marked in `set` replaces the API's default, and a request's own value replaces it. */
enum {
    SRV_SET_TEMP = 1 << 0,
    SRV_SET_TOP_K = 1 << 1,
    SRV_SET_TOP_P = 1 << 2,
    SRV_SET_MIN_P = 1 << 3,
    SRV_SET_SEED = 1 << 4,
    SRV_SET_REPEAT = 1 << 5, /* repeat_penalty */
    SRV_SET_LAST_N = 1 << 6,
    SRV_SET_PRESENCE = 1 << 7,
    SRV_SET_FREQUENCY = 1 << 8,
    SRV_SET_N_PREDICT = 1 << 9,
};
typedef struct {
    unsigned set;
    tlm_sampler_opts sampling;
    int max_tokens;
} srv_defaults;
/* srv_request_parse with the server's defaults d (NULL: none). */
int srv_request_parse_with(const char *body, size_t len, int shape, const srv_defaults *d,
                           srv_request *r, srv_error *e);

/* ---- tool calls (src/serve/tools.c): Hermes (ChatML) and Llama 3.1+ ---------------------------
 */

/* The tool format of a chat template's family, -1 when tlm writes no tools for it. */
int srv_tools_format(tlm_chat_template t);
/* Sets r's tool format (srv_request_parse leaves Hermes) and remakes the grammar of a required or
 * named call in it. 0, or -1 with *e. */
int srv_tools_set_format(srv_request *r, int format, srv_error *e);

/* The messages a chat with tools renders in r's format. Hermes: the tools' signatures in the
 * system message, assistant tool calls as <tool_call> blocks, tool results as <tool_response>
 * blocks in a user turn. Llama 3: a system turn with the ipython environment, the signatures
 * before the first user message, calls as JSON objects, results in ipython turns.
 * *out (and every string in it) malloc'd; free with srv_messages_free. */
int srv_tools_messages(const srv_request *r, srv_message **out, int *n, srv_error *e);
/* Mistral's format (mistral-nemo) puts its markers outside the [INST] turns, so the whole prompt
 * is written here: [AVAILABLE_TOOLS] before the last user message, calls as [TOOL_CALLS][...]</s>
 * (ids of 9 letters and digits), results as [TOOL_RESULTS]{"content": ..., "call_id": ...}
 * [/TOOL_RESULTS]. *out is malloc'd; a message the format cannot hold is a 400. */
int srv_tools_prompt(const srv_request *r, char **out, srv_error *e);
void srv_messages_free(srv_message *m, int n);
/* The grammar that makes the answer tool calls in r's format (required, or the named function):
 * each call's arguments follow its function's parameters schema. */
int srv_tools_grammar(const srv_request *r, tlm_grammar **out, srv_error *e);
/* The tool calls in a generated text: the text before the first call (trimmed; NULL when empty)
 * and a JSON array of OpenAI tool_calls (NULL when none parsed). Malformed blocks stay text. */
typedef struct {
    char *content;
    char *calls; /* JSON text */
    int n_calls;
} srv_tool_parse;
int srv_tools_parse(const char *text, size_t len, unsigned long long id_seed, srv_tool_parse *out);
/* The same for a format (SRV_TOOLFMT_); srv_tools_parse reads Hermes. */
int srv_tools_parse_as(int format, const char *text, size_t len, unsigned long long id_seed,
                       srv_tool_parse *out);
void srv_tool_parse_free(srv_tool_parse *p);
void srv_request_free(srv_request *r);
/* 1 if the bytes are valid UTF-8 (no overlongs, surrogates or code points past U+10FFFF). */
int srv_utf8_valid(const char *s, size_t n);

/* ---- embeddings (src/serve/embed.c) ------------------------------------------------------- */

/* How a prompt's hidden rows become its embedding (llama-server's --pooling): none keeps every
 * token's row; cls takes the first, last the last, mean their average. llama.cpp's numbers. */
typedef enum { SRV_POOL_NONE = 0, SRV_POOL_MEAN, SRV_POOL_CLS, SRV_POOL_LAST } srv_pooling;
/* The pooling a name (none, mean, cls, last) gives, -1 for any other. */
int srv_pooling_parse(const char *s);
const char *srv_pooling_name(srv_pooling p);

#define SRV_MAX_EMBED_INPUTS 2048

/* One input: text (to tokenize) or token ids. */
typedef struct {
    char *text;
    int32_t *ids;
    int n_ids;
} srv_embed_input;

typedef struct {
    int oai; /* OpenAI's answer (POST /v1/embeddings with "input"), else llama-server's list */
    srv_embed_input *inputs;
    int n_inputs;
    int base64;    /* encoding_format "base64" */
    int normalize; /* embd_normalize: -1 none, 0 max absolute (int16 range), 2 Euclidean, p > 0
                    * the p-norm */
    char *model;   /* the request's "model", NULL when absent */
} srv_embed_request;

/* Parses an embeddings body: "input" (or llama-server's "content", which answers in its own
 * shape) as a string, an array of ids, or an array of strings and arrays of ids;
 * encoding_format; embd_normalize (default `normalize`). oai: the request came to
 * /v1/embeddings. 0, or -1 with *e (400) filled. */
int srv_embed_parse(const char *body, size_t len, int oai, int normalize, srv_embed_request *r,
                    srv_error *e);
void srv_embed_request_free(srv_embed_request *r);
/* out [d] = pooled hidden [n, d] (p other than none). */
void srv_embed_pool(srv_pooling p, const float *hidden, int n, int d, float *out);
/* v [d] divided by its norm (srv_embed_request.normalize; -1 leaves it; a zero vector stays). */
void srv_embed_normalize(float *v, int d, int norm);
/* The answer (malloc'd JSON): vecs[i] the embedding of input i of n_rows[i] tokens ([n_rows[i], d]
 * with pooling none, else [d]). */
char *srv_embed_response(const srv_embed_request *r, srv_pooling pool, float *const *vecs,
                         const int *n_rows, int d, const char *model_id);

/* ---- LoRA adapters ------------------------------------------------------------------------ */

/* The adapters a server applies (llama-server's /lora-adapters): their paths and the scales every
 * request gets unless it names its own. Guarded by the caller. */
typedef struct {
    int n;
    const char *path[SRV_MAX_LORA];
    float scale[SRV_MAX_LORA];
} srv_lora_set;

/* GET /lora-adapters: [{"id", "path", "scale"}, ...], malloc'd. */
char *srv_lora_list_json(const srv_lora_set *s);
/* POST /lora-adapters: a body [{"id", "scale"}, ...] sets those scales and every other adapter's
 * to 0 (as llama-server). 0, or -1 with *e filled and s unchanged. */
int srv_lora_post(srv_lora_set *s, const char *body, size_t len, srv_error *e);
/* A request's scales into out[s->n]: its own "lora" list (others 0), else the server's. 0, or -1
 * with *e for an id that names no adapter. */
int srv_lora_scales(const srv_lora_set *s, const srv_request *r, float *out, srv_error *e);

/* ---- stop strings ------------------------------------------------------------------------- */

/* Scans text not yet sent. Returns how many bytes may be sent now: with *hit = 1 + the index of
 * the first stop string (which ends generation) the text up to it, otherwise (*hit = 0) all but
 * the longest tail that could still grow into a stop string. */
size_t srv_stop_scan(const char *buf, size_t len, char *const *stops, int n_stops, int *hit);

/* ---- the scheduler ------------------------------------------------------------------------ */

typedef struct {
    int32_t id;
    float logprob;
    int n_top;
    int32_t top_id[SRV_MAX_TOP_LOGPROBS];
    float top_lp[SRV_MAX_TOP_LOGPROBS];
} srv_token_lp;

typedef enum {
    SRV_FINISH_NONE = 0,
    SRV_FINISH_STOP,
    SRV_FINISH_LENGTH,
    SRV_FINISH_ERROR
} srv_finish;

/* One sequence to generate. The submitter fills the inputs, then reads the outputs only while
 * holding the scheduler's lock (srv_sched_lock) or after done. */
typedef struct srv_job {
    /* inputs */
    int32_t *ids; /* prompt, owned by the job (freed by srv_job_free) */
    int n_ids;
    int max_tokens; /* -1: until the context is full */
    tlm_sampler_opts sampling;
    char *const *stop; /* borrowed: must outlive the job */
    int n_stop;
    int32_t end_id; /* an extra end-of-turn id, -1: none */
    int logprobs, top_logprobs;
    float lora_scale[SRV_MAX_LORA]; /* of the scheduler's adapters (srv_sched_opts.loras) */
    const tlm_grammar *grammar;     /* borrowed, NULL: none; the job's output follows it */
    const int32_t *bias_id;         /* borrowed: logit biases added before sampling */
    const float *bias;
    int n_bias;
    int ignore_eos; /* ends of generation never sampled */
    int keep_ids;   /* record the generated ids in out_ids */
    /* Speculative decoding (llama-server's speculative.n_max, n_min, p_min), where the scheduler
     * has a draft model or lookup: < 0 takes the server's value; n_max 0 turns it off. */
    int spec_n_max, spec_n_min;
    float spec_p_min;

    /* outputs */
    char *text; /* sent-safe text so far */
    size_t text_len, text_cap;
    srv_token_lp *lps;
    int n_lps;
    size_t lps_cap;
    int prompt_tokens, cached_tokens, completion_tokens;
    int n_drafted, n_accepted; /* ids proposed by speculation, and accepted by the model */
    int32_t *out_ids;          /* keep_ids: every generated id */
    int n_out_ids;
    size_t out_ids_cap;
    int stop_word;                    /* the index in stop of the string that ended it, -1: none */
    int slot_used;                    /* the slot it ran in */
    int eos;                          /* ended by an end-of-generation token */
    double t_submit, t_first, t_done; /* seconds (monotonic) */
    int done;
    srv_finish finish;
    char error[200];

    /* scheduler-private */
    int cancelled, queued, slot;
    char *pend; /* decoded, held back for stop strings */
    size_t pend_len, pend_cap;
    struct srv_job *next;
} srv_job;

/* A job for these prompt ids (copied). */
srv_job *srv_job_new(const int32_t *ids, int n);
void srv_job_free(srv_job *j);

typedef struct srv_sched srv_sched;

typedef struct {
    int parallel;      /* sequences decoded together (slots) */
    int ctx;           /* positions per slot; <= 0: the model's context_length */
    int queue_max;     /* jobs waiting beyond the slots; <= 0: 4 * parallel */
    int prefill_chunk; /* prompt tokens per prefill pass while others decode; <= 0: 64 */
    int step_max;      /* tlm_session_opts.step_max: a sliding-window layer's ring is its window
                        * plus step_max - 1 positions; <= 0: the session's default */
    long cache_mib;    /* prompt cache in memory (MiB; <= 0: none): a slot taken over by another
                        * request keeps its keys and values here for a later request that starts
                        * the same way (llama-server's --cache-ram) */
    tlm_dtype kv_type; /* the KV cache's type for keys (tlm_session_opts.kv_type) */
    tlm_dtype v_type;  /* and for values */
    /* LoRA adapters over the model (each job gives their scales; sequences with different scales
     * share steps). They must outlive the scheduler. */
    const tlm_lora *const *loras;
    int n_lora;
    /* A session of one sequence of ctx positions for embeddings (srv_sched_embed); 0: none. */
    int embeddings;
    /* Speculative decoding: a draft model over the same vocabulary (must outlive the scheduler;
     * one cache sequence of its own per slot) or, with spec.lookup, n-gram lookup; NULL and
     * lookup 0: off. spec: draft_max, draft_min, draft_p_min, lookup and its n-grams (adaptive
     * is always on). */
    const tlm_model *draft;
    tlm_spec_opts spec;
} srv_sched_opts;

typedef struct {
    int slots, busy, queued;
    uint64_t prompt_tokens, cached_tokens, completion_tokens, decode_steps, jobs_done;
    uint64_t cache_hits;        /* admissions that loaded a prefix from the prompt cache */
    uint64_t drafted, accepted; /* speculative decoding's proposed ids, and those accepted */
    size_t cache_bytes;         /* held by the prompt cache */
    int cache_entries;
    double decode_seconds, prefill_seconds;
} srv_stats;

/* Starts the scheduler thread over one session of `parallel` sequences. The model and tokenizer
 * must outlive it. All of the server's arithmetic runs in parallel regions of that thread: a
 * caller whose own thread has an OpenMP team should release it first (omp_pause_resource_all),
 * because libgomp nearly stops spinning at barriers while it manages more threads than there are
 * CPUs, and every region then waits on a futex (cmd_serve.c). */
tlm_status srv_sched_new(const tlm_model *m, const tlm_tokenizer *tok, const srv_sched_opts *o,
                         srv_sched **out);
/* Finishes every accepted job, stops the thread and frees. */
void srv_sched_free(srv_sched *s);
int srv_sched_ctx(const srv_sched *s);
/* The KV cache of all the slots: its bytes and element type. */
size_t srv_sched_kv_bytes(const srv_sched *s);
tlm_dtype srv_sched_kv_type(const srv_sched *s);
tlm_dtype srv_sched_v_type(const srv_sched *s);
int srv_sched_parallel(const srv_sched *s);
/* Queues n jobs at once, or none: TLM_ERR_RANGE when the queue lacks room for them (the server
 * answers 429), TLM_ERR_INTERRUPTED once draining. */
tlm_status srv_sched_submit(srv_sched *s, srv_job *const *jobs, int n);
void srv_sched_lock(srv_sched *s);
void srv_sched_unlock(srv_sched *s);
/* With the lock held: waits until some job made progress or timeout_ms passed. */
void srv_sched_wait(srv_sched *s, int timeout_ms);
/* Takes a job back (cancelling it if it still runs) and waits until the scheduler has let go of
 * it; the caller then frees it. Call without the lock. */
void srv_sched_release(srv_sched *s, srv_job *j);
/* Refuses new jobs from now on (draining). */
void srv_sched_close(srv_sched *s);
void srv_sched_stats(srv_sched *s, srv_stats *st);

/* Monotonic seconds. */
double srv_now(void);

/* One slot as llama-server's GET /slots shows it. */
typedef struct {
    int busy;          /* a request is generating in it */
    int n_tokens;      /* positions its cache holds */
    int prompt_tokens; /* the request's (busy) */
    int decoded;       /* tokens the request generated so far (busy) */
} srv_slot_info;
/* Slot b's state (0 <= b < parallel). */
void srv_sched_slot_info(srv_sched *s, int b, srv_slot_info *out);

/* llama-server's slot actions on an idle slot: its cache written to a file, read back from one
 * (the same model, cache types and adapters), or forgotten. Run by the scheduler between steps;
 * the caller waits. */
typedef enum { SRV_SLOT_SAVE, SRV_SLOT_RESTORE, SRV_SLOT_ERASE } srv_slot_action;
typedef struct srv_slot_op {
    /* in */
    srv_slot_action action;
    int slot;
    const char *path; /* save, restore */
    /* out */
    int n_tokens;   /* saved, restored or erased */
    size_t bytes;   /* written or read */
    double seconds; /* the action's own time */
    int status;     /* 0, or the HTTP status of a refusal (400: busy slot, bad file) */
    char error[256];
    /* scheduler-private */
    int done;
    struct srv_slot_op *next;
} srv_slot_op;
/* Queues op and waits until the scheduler ran it. TLM_OK even when op->status refuses it. */
tlm_status srv_sched_slot_op(srv_sched *s, srv_slot_op *op);

/* A prompt's hidden rows (tlm_session_prefill_hidden) computed by the scheduler thread in a
 * session of its own (srv_sched_opts.embeddings), between steps. */
typedef struct srv_embed_op {
    /* in */
    const int32_t *ids;
    int n;
    float *hidden; /* [n, d_model], the caller's */
    /* out */
    int status; /* 0, or 400 with error */
    char error[256];
    /* scheduler-private */
    int done;
    struct srv_embed_op *next;
} srv_embed_op;
/* Queues op and waits until the scheduler ran it: TLM_OK even when op->status refuses it;
 * TLM_ERR_ARG without srv_sched_opts.embeddings, TLM_ERR_INTERRUPTED once draining. */
tlm_status srv_sched_embed(srv_sched *s, srv_embed_op *op);

/* ---- responses ---------------------------------------------------------------------------- */

/* One request's answer in OpenAI's shapes (or llama-server's, for a native request), built from
 * its jobs. Read the jobs only with the scheduler's lock held (or once they are done). */
typedef struct {
    const tlm_tokenizer *tok;
    const char *model_id;
    int n_ctx; /* positions per slot (llama-server's "truncated"); 0: unknown */
    const srv_request *req;
    srv_job *const *jobs;
    int n_jobs;
    char id[48];
    long long created;
    /* streaming state */
    size_t *sent_text;
    int *sent_lps;
    int *sent_ids;
    char *finished, *role_sent;
    int usage_sent;
    char *out; /* SSE bytes produced and not yet taken (the caller consumes and resets out_len) */
    size_t out_len, out_cap;
} srv_response;

int srv_response_init(srv_response *g, const tlm_tokenizer *tok, const char *model_id,
                      const srv_request *req, srv_job *const *jobs, int n_jobs, const char *id,
                      long long created);
void srv_response_free(srv_response *g);
/* The whole answer as JSON (malloc'd); every job must be done. */
char *srv_response_final(srv_response *g);
/* Appends to out the events for what the jobs produced since the last call: chunks of new text
 * (and logprobs), each choice's finish_reason, the usage chunk when asked, then data: [DONE].
 * Returns 1 once [DONE] is out. */
int srv_response_stream(srv_response *g);
/* {"error": {"message", "type", "param", "code"}} (malloc'd); the type follows the status. */
char *srv_error_json(int status, const char *param, const char *msg);
/* Bytes as valid UTF-8 for JSON: each byte of an invalid sequence becomes U+FFFD (malloc'd). */
char *srv_utf8_fix(const char *s, size_t n);

#endif
