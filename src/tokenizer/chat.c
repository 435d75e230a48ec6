/* Chat templates: the common families written out in C instead of a Jinja interpreter. A GGUF's
 * tokenizer.chat_template is only read to recognise which family it is. */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "tlm.h"

static const char *const names[TLM_CHAT_COUNT] = {"chatml", "llama2", "llama3",      "mistral",
                                                  "gemma",  "phi3",   "mistral-nemo"};
static const char *const ends[TLM_CHAT_COUNT] = {"<|im_end|>",    "</s>",    "<|eot_id|>", "</s>",
                                                 "<end_of_turn>", "<|end|>", "</s>"};

const char *tlm_chat_template_name(tlm_chat_template t) {
    return (unsigned)t < TLM_CHAT_COUNT ? names[t] : "?";
}
const char *tlm_chat_template_end(tlm_chat_template t) {
    return (unsigned)t < TLM_CHAT_COUNT ? ends[t] : "";
}

int tlm_chat_template_from_name(const char *name, tlm_chat_template *t) {
    for (int i = 0; i < TLM_CHAT_COUNT; i++)
        if (!strcmp(name, names[i])) {
            *t = (tlm_chat_template)i;
            return 1;
        }
    return 0;
}

int tlm_chat_template_detect(const char *j, tlm_chat_template *t) {
    if (!j) return 0;
    /* Most specific markers first: Llama 2's [INST] also appears in Mistral's templates, which
     * lack <<SYS>>. */
    if (strstr(j, "<|im_start|>"))
        *t = TLM_CHAT_CHATML;
    else if (strstr(j, "<|start_header_id|>"))
        *t = TLM_CHAT_LLAMA3;
    else if (strstr(j, "<start_of_turn>"))
        *t = TLM_CHAT_GEMMA;
    else if (strstr(j, "<|user|>") && strstr(j, "<|end|>"))
        *t = TLM_CHAT_PHI3;
    else if (strstr(j, "[INST]") && strstr(j, "<<SYS>>"))
        *t = TLM_CHAT_LLAMA2;
    else if (strstr(j, "[INST]") && !strstr(j, "[INST] "))
        *t = TLM_CHAT_MISTRAL_NEMO; /* tekken: nothing between [INST] and the text */
    else if (strstr(j, "[INST]"))
        *t = TLM_CHAT_MISTRAL;
    else
        return 0;
    return 1;
}

typedef struct {
    char *p;
    size_t len, cap;
    int failed;
    tlm_chat_span *spans; /* the assistant turns' text, when asked for */
    int n_spans, cap_spans, want_spans;
} sbuf;

static void put(sbuf *b, const char *s) {
    size_t n = strlen(s);
    if (b->failed) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = (b->len + n + 1) * 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->failed = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n + 1);
    b->len += n;
}

/* An assistant turn's text (what a model generates: the answer and its end-of-turn marker) is
 * put between span_open and span_close. */
static void span_open(sbuf *b, int msg) {
    if (!b->want_spans || b->failed) return;
    if (b->n_spans == b->cap_spans) {
        int cap = b->cap_spans ? 2 * b->cap_spans : 8;
        tlm_chat_span *q = realloc(b->spans, (size_t)cap * sizeof *q);
        if (!q) {
            b->failed = 1;
            return;
        }
        b->spans = q;
        b->cap_spans = cap;
    }
    b->spans[b->n_spans++] = (tlm_chat_span){b->len, b->len, msg};
}

static void span_close(sbuf *b) {
    if (b->want_spans && !b->failed && b->n_spans) b->spans[b->n_spans - 1].end = b->len;
}

static int is_system(const tlm_chat_message *m) {
    return !strcmp(m->role, "system") || !strcmp(m->role, "developer");
}
static int is_assistant(const tlm_chat_message *m) { return !strcmp(m->role, "assistant"); }

/* Message i's content and the marker that ends its turn; an assistant's are its span. */
static void turn(sbuf *b, const tlm_chat_message *msgs, int i, const char *end) {
    int a = is_assistant(&msgs[i]);
    if (a) span_open(b, i);
    put(b, msgs[i].content);
    put(b, end);
    if (a) span_close(b);
}

/* Families without a system role fold the system messages into the first user turn. */
static void system_text(const tlm_chat_message *msgs, int n, sbuf *sys) {
    for (int i = 0; i < n; i++)
        if (is_system(&msgs[i])) {
            if (sys->len) put(sys, "\n\n");
            put(sys, msgs[i].content);
        }
}

tlm_status tlm_chat_render(tlm_chat_template t, const tlm_chat_message *msgs, int n, int open_turn,
                           char **out, tlm_chat_span **spans, int *n_spans) {
    *out = NULL;
    if (spans) *spans = NULL;
    if (n_spans) *n_spans = 0;
    if ((unsigned)t >= TLM_CHAT_COUNT) return core_err(TLM_ERR_ARG, "chat template %d unknown", t);
    sbuf b = {0}, sys = {0};
    b.want_spans = spans != NULL;
    put(&b, "");
    switch (t) {
    case TLM_CHAT_CHATML:
        for (int i = 0; i < n; i++) {
            put(&b, "<|im_start|>");
            put(&b, is_system(&msgs[i]) ? "system" : msgs[i].role);
            put(&b, "\n");
            turn(&b, msgs, i, "<|im_end|>");
            put(&b, "\n");
        }
        if (open_turn) put(&b, "<|im_start|>assistant\n");
        break;
    case TLM_CHAT_LLAMA3:
        put(&b, "<|begin_of_text|>");
        for (int i = 0; i < n; i++) {
            put(&b, "<|start_header_id|>");
            put(&b, is_system(&msgs[i]) ? "system" : msgs[i].role);
            put(&b, "<|end_header_id|>\n\n");
            turn(&b, msgs, i, "<|eot_id|>");
        }
        if (open_turn) put(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    case TLM_CHAT_PHI3:
        for (int i = 0; i < n; i++) {
            put(&b, is_system(&msgs[i])      ? "<|system|>\n"
                    : is_assistant(&msgs[i]) ? "<|assistant|>\n"
                                             : "<|user|>\n");
            turn(&b, msgs, i, "<|end|>");
            put(&b, "\n");
        }
        if (open_turn) put(&b, "<|assistant|>\n");
        break;
    case TLM_CHAT_GEMMA: {
        system_text(msgs, n, &sys);
        int first = 1;
        put(&b, "<bos>");
        for (int i = 0; i < n; i++) {
            if (is_system(&msgs[i])) continue;
            put(&b, is_assistant(&msgs[i]) ? "<start_of_turn>model\n" : "<start_of_turn>user\n");
            if (first && !is_assistant(&msgs[i]) && sys.len) {
                put(&b, sys.p);
                put(&b, "\n\n");
            }
            if (!is_assistant(&msgs[i])) first = 0;
            turn(&b, msgs, i, "<end_of_turn>");
            put(&b, "\n");
        }
        if (open_turn) put(&b, "<start_of_turn>model\n");
        break;
    }
    case TLM_CHAT_LLAMA2:
    case TLM_CHAT_MISTRAL: {
        /* <s>[INST] user [/INST] answer</s><s>[INST] ... ; Llama 2 puts the system prompt in a
         * <<SYS>> block inside the first instruction, Mistral prepends it to that instruction. */
        system_text(msgs, n, &sys);
        int first = 1;
        for (int i = 0; i < n; i++) {
            if (is_system(&msgs[i])) continue;
            if (is_assistant(&msgs[i])) {
                /* the model answers " answer</s>" after [/INST] */
                span_open(&b, i);
                put(&b, " ");
                put(&b, msgs[i].content);
                put(&b, "</s>");
                span_close(&b);
                continue;
            }
            put(&b, "<s>[INST] ");
            if (first && sys.len) {
                if (t == TLM_CHAT_LLAMA2) {
                    put(&b, "<<SYS>>\n");
                    put(&b, sys.p);
                    put(&b, "\n<</SYS>>\n\n");
                } else {
                    put(&b, sys.p);
                    put(&b, "\n\n");
                }
            }
            first = 0;
            put(&b, msgs[i].content);
            put(&b, " [/INST]");
        }
        break;
    }
    case TLM_CHAT_MISTRAL_NEMO: {
        /* <s>[INST]user[/INST]answer</s>[INST]...: one BOS, no spaces; the system prompt opens
         * the last user message, where Mistral's tokenizer puts it (the Jinja template, which
         * puts it there only when that message ends the chat, agrees on every prompt serve
         * renders). */
        system_text(msgs, n, &sys);
        int last_user = -1;
        for (int i = 0; i < n; i++)
            if (!is_system(&msgs[i]) && !is_assistant(&msgs[i])) last_user = i;
        put(&b, "<s>");
        for (int i = 0; i < n; i++) {
            if (is_system(&msgs[i])) continue;
            if (is_assistant(&msgs[i])) {
                turn(&b, msgs, i, "</s>");
                continue;
            }
            put(&b, "[INST]");
            if (i == last_user && sys.len) {
                put(&b, sys.p);
                put(&b, "\n\n");
            }
            put(&b, msgs[i].content);
            put(&b, "[/INST]");
        }
        break;
    }
    default: break;
    }
    free(sys.p);
    if (b.failed) {
        free(b.p);
        free(b.spans);
        return core_err(TLM_ERR_NOMEM, "out of memory rendering a chat");
    }
    *out = b.p;
    if (spans) *spans = b.spans;
    if (n_spans) *n_spans = b.n_spans;
    return TLM_OK;
}
