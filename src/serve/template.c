/* Chat templates: the common families written out in C instead of a Jinja interpreter. A GGUF's
 * tokenizer.chat_template is only read to recognise which family it is. */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "serve/serve.h"

static const char *const names[SRV_TPL_COUNT] = {"chatml",  "llama2", "llama3",
                                                 "mistral", "gemma",  "phi3"};
static const char *const ends[SRV_TPL_COUNT] = {"<|im_end|>", "</s>",          "<|eot_id|>",
                                                "</s>",       "<end_of_turn>", "<|end|>"};

const char *srv_template_name(srv_template t) {
    return (unsigned)t < SRV_TPL_COUNT ? names[t] : "?";
}
const char *srv_template_end(srv_template t) { return (unsigned)t < SRV_TPL_COUNT ? ends[t] : ""; }

int srv_template_from_name(const char *name, srv_template *t) {
    for (int i = 0; i < SRV_TPL_COUNT; i++)
        if (!strcmp(name, names[i])) {
            *t = (srv_template)i;
            return 1;
        }
    return 0;
}

int srv_template_detect(const char *j, srv_template *t) {
    if (!j) return 0;
    /* Most specific markers first: Llama 2's [INST] also appears in Mistral's templates, which
     * lack <<SYS>>. */
    if (strstr(j, "<|im_start|>"))
        *t = SRV_TPL_CHATML;
    else if (strstr(j, "<|start_header_id|>"))
        *t = SRV_TPL_LLAMA3;
    else if (strstr(j, "<start_of_turn>"))
        *t = SRV_TPL_GEMMA;
    else if (strstr(j, "<|user|>") && strstr(j, "<|end|>"))
        *t = SRV_TPL_PHI3;
    else if (strstr(j, "[INST]") && strstr(j, "<<SYS>>"))
        *t = SRV_TPL_LLAMA2;
    else if (strstr(j, "[INST]"))
        *t = SRV_TPL_MISTRAL;
    else
        return 0;
    return 1;
}

typedef struct {
    char *p;
    size_t len, cap;
    int failed;
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

static int is_system(const srv_message *m) {
    return !strcmp(m->role, "system") || !strcmp(m->role, "developer");
}
static int is_assistant(const srv_message *m) { return !strcmp(m->role, "assistant"); }

/* Families without a system role fold the system messages into the first user turn. */
static void system_text(const srv_message *msgs, int n, sbuf *sys) {
    for (int i = 0; i < n; i++)
        if (is_system(&msgs[i])) {
            if (sys->len) put(sys, "\n\n");
            put(sys, msgs[i].content);
        }
}

tlm_status srv_template_apply(srv_template t, const srv_message *msgs, int n, char **out) {
    *out = NULL;
    if ((unsigned)t >= SRV_TPL_COUNT) return core_err(TLM_ERR_ARG, "chat template %d unknown", t);
    sbuf b = {0}, sys = {0};
    put(&b, "");
    switch (t) {
    case SRV_TPL_CHATML:
        for (int i = 0; i < n; i++) {
            put(&b, "<|im_start|>");
            put(&b, is_system(&msgs[i]) ? "system" : msgs[i].role);
            put(&b, "\n");
            put(&b, msgs[i].content);
            put(&b, "<|im_end|>\n");
        }
        put(&b, "<|im_start|>assistant\n");
        break;
    case SRV_TPL_LLAMA3:
        put(&b, "<|begin_of_text|>");
        for (int i = 0; i < n; i++) {
            put(&b, "<|start_header_id|>");
            put(&b, is_system(&msgs[i]) ? "system" : msgs[i].role);
            put(&b, "<|end_header_id|>\n\n");
            put(&b, msgs[i].content);
            put(&b, "<|eot_id|>");
        }
        put(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    case SRV_TPL_PHI3:
        for (int i = 0; i < n; i++) {
            put(&b, is_system(&msgs[i])      ? "<|system|>\n"
                    : is_assistant(&msgs[i]) ? "<|assistant|>\n"
                                             : "<|user|>\n");
            put(&b, msgs[i].content);
            put(&b, "<|end|>\n");
        }
        put(&b, "<|assistant|>\n");
        break;
    case SRV_TPL_GEMMA: {
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
            put(&b, msgs[i].content);
            put(&b, "<end_of_turn>\n");
        }
        put(&b, "<start_of_turn>model\n");
        break;
    }
    case SRV_TPL_LLAMA2:
    case SRV_TPL_MISTRAL: {
        /* <s>[INST] user [/INST] answer</s><s>[INST] ... ; Llama 2 puts the system prompt in a
         * <<SYS>> block inside the first instruction, Mistral prepends it to that instruction. */
        system_text(msgs, n, &sys);
        int first = 1;
        for (int i = 0; i < n; i++) {
            if (is_system(&msgs[i])) continue;
            if (is_assistant(&msgs[i])) {
                put(&b, " ");
                put(&b, msgs[i].content);
                put(&b, "</s>");
                continue;
            }
            put(&b, "<s>[INST] ");
            if (first && sys.len) {
                if (t == SRV_TPL_LLAMA2) {
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
    default: break;
    }
    free(sys.p);
    if (b.failed) {
        free(b.p);
        return core_err(TLM_ERR_NOMEM, "out of memory rendering a chat");
    }
    *out = b.p;
    return TLM_OK;
}
