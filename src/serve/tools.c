/* Tool calls in chat completions. In the Hermes format that Qwen2.5 and most ChatML models are
 * trained on, the functions' signatures go in the system message between <tools> tags, the model
 * answers a call as <tool_call>{"name": ..., "arguments": {...}}</tool_call>, and a tool's result
 * comes back in a user turn between <tool_response> tags. In Meta's Llama 3.1+ format (its
 * template's default, tools in the user message) the signatures open the first user message, the
 * model answers a JSON object {"name": ..., "parameters": {...}} (after <|python_tag|> or alone),
 * and a result comes back in an ipython turn. In Mistral's (Nemo's tekken template) the signatures
 * go in an [AVAILABLE_TOOLS] block before the last user message, the model answers
 * [TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}] and a result comes back as
 * [TOOL_RESULTS]{"content": ..., "call_id": ...}[/TOOL_RESULTS], each call tied to its result by
 * an id of 9 letters and digits. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "serve/serve.h"

static int fail(srv_error *e, const char *param, const char *msg) {
    e->status = 400;
    snprintf(e->param, sizeof e->param, "%s", param);
    snprintf(e->message, sizeof e->message, "%s", msg);
    return -1;
}

/* A growing string. */
typedef struct {
    char *s;
    size_t n, cap;
    int oom;
} sbuf;

static void put(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = (b->n + n + 1) * 2;
        char *q = realloc(b->s, cap);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->s = q;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}
static void puts_(sbuf *b, const char *s) { put(b, s, strlen(s)); }

void srv_messages_free(srv_message *m, int n) {
    for (int i = 0; m && i < n; i++) {
        free(m[i].role);
        free(m[i].content);
        free(m[i].tool_calls);
        free(m[i].tool_call_id);
    }
    free(m);
}

static char *dup_s(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* The system message's tool block (Qwen2.5's wording, which its models were trained on). */
static void tools_block(sbuf *b, const cJSON *tools) {
    puts_(b, "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
             "You are provided with function signatures within <tools></tools> XML tags:\n"
             "<tools>");
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        char *s = cJSON_PrintUnformatted(t);
        puts_(b, "\n");
        if (s) puts_(b, s);
        free(s);
    }
    puts_(b, "\n</tools>\n\nFor each function call, return a json object with function name and "
             "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
             "<function-name>, \"arguments\": <args-json-object>}\n</tool_call>");
}

/* An assistant's calls as the model writes them: arguments (a JSON string in OpenAI's shape)
 * embedded as the object they hold. */
static void calls_text(sbuf *b, const char *calls_json) {
    cJSON *calls = cJSON_Parse(calls_json);
    const cJSON *c;
    cJSON_ArrayForEach(c, calls) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", cJSON_IsString(name) ? name->valuestring : "");
        cJSON *a = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : NULL;
        if (!a) a = args && !cJSON_IsString(args) ? cJSON_Duplicate(args, 1) : cJSON_CreateObject();
        cJSON_AddItemToObject(o, "arguments", a);
        char *s = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        if (b->n) puts_(b, "\n");
        puts_(b, "<tool_call>\n");
        if (s) puts_(b, s);
        puts_(b, "\n</tool_call>");
        free(s);
    }
    cJSON_Delete(calls);
}

int srv_tools_format(tlm_chat_template t) {
    return t == TLM_CHAT_CHATML         ? SRV_TOOLFMT_HERMES
           : t == TLM_CHAT_LLAMA3       ? SRV_TOOLFMT_LLAMA3
           : t == TLM_CHAT_MISTRAL_NEMO ? SRV_TOOLFMT_MISTRAL
                                        : -1;
}

/* JSON as Python's json.dumps writes it (Jinja's tojson in Meta's template): ", " and ": "
 * between items inline (indent < 0), or each item on a line of its own, indent spaces a level. */
static void py_json(sbuf *b, const cJSON *v, int indent, int depth) {
    int obj = cJSON_IsObject(v);
    if (!obj && !cJSON_IsArray(v)) {
        char *s = cJSON_PrintUnformatted(v);
        puts_(b, s ? s : "null");
        free(s);
        return;
    }
    if (!v->child) {
        puts_(b, obj ? "{}" : "[]");
        return;
    }
    puts_(b, obj ? "{" : "[");
    for (const cJSON *c = v->child; c; c = c->next) {
        if (indent >= 0) {
            puts_(b, "\n");
            for (int i = 0; i < (depth + 1) * indent; i++) puts_(b, " ");
        }
        if (obj) {
            cJSON *k = cJSON_CreateString(c->string ? c->string : "");
            char *s = k ? cJSON_PrintUnformatted(k) : NULL;
            puts_(b, s ? s : "\"\"");
            puts_(b, ": ");
            free(s);
            cJSON_Delete(k);
        }
        py_json(b, c, indent, depth + 1);
        if (c->next) puts_(b, indent >= 0 ? "," : ", ");
    }
    if (indent >= 0) {
        puts_(b, "\n");
        for (int i = 0; i < depth * indent; i++) puts_(b, " ");
    }
    puts_(b, obj ? "}" : "]");
}

/* An assistant's calls as Llama 3.1 writes one: {"name": "f", "parameters": {...}}; several (which
 * Meta's template refuses) one a line. */
static void llama3_calls(sbuf *b, const char *calls_json) {
    cJSON *calls = cJSON_Parse(calls_json);
    const cJSON *c;
    cJSON_ArrayForEach(c, calls) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        cJSON *a = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : NULL;
        if (!a) a = args && !cJSON_IsString(args) ? cJSON_Duplicate(args, 1) : cJSON_CreateObject();
        cJSON *nm = cJSON_CreateString(cJSON_IsString(name) ? name->valuestring : "");
        if (b->n) puts_(b, "\n");
        puts_(b, "{\"name\": ");
        py_json(b, nm, -1, 0);
        puts_(b, ", \"parameters\": ");
        py_json(b, a, -1, 0);
        puts_(b, "}");
        cJSON_Delete(nm);
        cJSON_Delete(a);
    }
    cJSON_Delete(calls);
}

/* Meta's Llama 3.1 template with tools in the user message: a system turn with the ipython
 * environment and its dates, the signatures before the first user message, calls as JSON, results
 * in ipython turns. */
static int llama3_messages(const srv_request *r, const cJSON *tools, srv_message **out, int *n,
                           srv_error *e) {
    int i0 = r->n_messages &&
             (!strcmp(r->messages[0].role, "system") || !strcmp(r->messages[0].role, "developer"));
    if (tools && (i0 >= r->n_messages || strcmp(r->messages[i0].role, "user")))
        return fail(e, "messages",
                    "Llama 3's tools go in the first user message, and the conversation has none "
                    "after its system message");
    srv_message *m = calloc((size_t)r->n_messages + 1, sizeof *m);
    if (!m) return fail(e, "messages", "out of memory");
    int k = 0, oom = 0;
    sbuf b = {0};
    if (tools) puts_(&b, "Environment: ipython\n");
    puts_(&b, "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n");
    if (i0 && r->messages[0].content) puts_(&b, r->messages[0].content);
    m[k].role = dup_s("system");
    m[k++].content = b.s;
    oom |= b.oom || !b.s || !m[0].role;
    for (int i = i0; i < r->n_messages; i++) {
        const srv_message *s = &r->messages[i];
        sbuf c = {0};
        const char *role = !strcmp(s->role, "tool") ? "ipython" : s->role;
        if (i == i0 && tools) {
            puts_(&c, "Given the following functions, please respond with a JSON for a function "
                      "call with its proper arguments that best answers the given prompt.\n\n"
                      "Respond in the format {\"name\": function name, \"parameters\": dictionary "
                      "of argument name and its value}.Do not use variables.\n\n");
            const cJSON *t;
            cJSON_ArrayForEach(t, tools) {
                py_json(&c, t, 4, 0);
                puts_(&c, "\n\n");
            }
        }
        if (s->tool_calls)
            llama3_calls(&c, s->tool_calls);
        else
            puts_(&c, s->content ? s->content : "");
        m[k].role = dup_s(role);
        m[k++].content = c.s;
        oom |= c.oom || !c.s || !m[k - 1].role;
    }
    if (oom) {
        srv_messages_free(m, k);
        return fail(e, "messages", "out of memory");
    }
    *out = m;
    *n = k;
    return 0;
}

int srv_tools_messages(const srv_request *r, srv_message **out, int *n, srv_error *e) {
    *out = NULL;
    *n = 0;
    cJSON *tools = r->tools && r->tool_choice != SRV_TOOLS_NONE ? cJSON_Parse(r->tools) : NULL;
    if (r->tool_format == SRV_TOOLFMT_LLAMA3) {
        int rc = llama3_messages(r, tools, out, n, e);
        cJSON_Delete(tools);
        return rc;
    }
    int has_system = r->n_messages && (!strcmp(r->messages[0].role, "system") ||
                                       !strcmp(r->messages[0].role, "developer"));
    srv_message *m = calloc((size_t)r->n_messages + 1, sizeof *m);
    if (!m) {
        cJSON_Delete(tools);
        return fail(e, "messages", "out of memory");
    }
    int k = 0, oom = 0;
    if (tools && !has_system) { /* Qwen2.5's default system line, then the tools */
        sbuf b = {0};
        puts_(&b, "You are a helpful assistant.");
        tools_block(&b, tools);
        m[k].role = dup_s("system");
        m[k++].content = b.s;
        oom |= b.oom || !b.s;
    }
    for (int i = 0; i < r->n_messages; i++) {
        const srv_message *s = &r->messages[i];
        sbuf b = {0};
        const char *role = s->role;
        if (!strcmp(role, "tool")) {
            /* consecutive results share one user turn */
            int first = i == 0 || strcmp(r->messages[i - 1].role, "tool");
            if (!first) {
                sbuf *prev = &(sbuf){m[k - 1].content, strlen(m[k - 1].content), 0, 0};
                prev->cap = prev->n + 1;
                puts_(prev, "\n<tool_response>\n");
                puts_(prev, s->content);
                puts_(prev, "\n</tool_response>");
                m[k - 1].content = prev->s;
                oom |= prev->oom;
                continue;
            }
            role = "user";
            puts_(&b, "<tool_response>\n");
            puts_(&b, s->content);
            puts_(&b, "\n</tool_response>");
        } else {
            puts_(&b, s->content ? s->content : "");
            if (i == 0 && has_system && tools) tools_block(&b, tools);
            if (s->tool_calls) calls_text(&b, s->tool_calls);
        }
        if (!b.s) puts_(&b, "");
        m[k].role = dup_s(role);
        m[k++].content = b.s;
        oom |= b.oom || !b.s || !m[k - 1].role;
    }
    cJSON_Delete(tools);
    if (oom) {
        srv_messages_free(m, k);
        return fail(e, "messages", "out of memory");
    }
    *out = m;
    *n = k;
    return 0;
}

/* Mistral's ids: 9 letters and digits (its template refuses any other). */
static int mistral_id(const char *s) {
    if (!s || strlen(s) != 9) return 0;
    for (int i = 0; i < 9; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
              (s[i] >= '0' && s[i] <= '9')))
            return 0;
    return 1;
}

/* The id of call i of an answer, 9 letters and digits drawn from the answer's seed. */
static void mistral_make_id(char id[10], unsigned long long seed, int i) {
    static const char A[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    unsigned long long x = seed * 0x9e3779b97f4a7c15ull + (unsigned long long)i + 1;
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    for (int k = 0; k < 9; k++, x /= 62) id[k] = A[x % 62];
    id[9] = 0;
}

/* [AVAILABLE_TOOLS][{"type": "function", "function": {...}}, ...][/AVAILABLE_TOOLS]: each
 * function's keys in the request's order but "return", the values as Python's json.dumps writes
 * them. */
static void mistral_tools(sbuf *b, const cJSON *tools) {
    puts_(b, "[AVAILABLE_TOOLS][");
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        if (t != tools->child) puts_(b, ", ");
        puts_(b, "{\"type\": \"function\", \"function\": {");
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        int first = 1;
        for (const cJSON *f = fn ? fn->child : NULL; f; f = f->next) {
            if (!strcmp(f->string, "return")) continue;
            if (!first) puts_(b, ", ");
            first = 0;
            cJSON *k = cJSON_CreateString(f->string);
            py_json(b, k, -1, 0);
            cJSON_Delete(k);
            puts_(b, ": ");
            py_json(b, f, -1, 0);
        }
        puts_(b, "}}");
    }
    puts_(b, "][/AVAILABLE_TOOLS]");
}

/* An assistant's calls: [TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}, ...]. The
 * arguments (a JSON string in OpenAI's shape) are written as the object they hold, as the model
 * writes them. */
static int mistral_calls(sbuf *b, const char *calls_json, srv_error *e) {
    cJSON *calls = cJSON_Parse(calls_json);
    puts_(b, "[TOOL_CALLS][");
    const cJSON *c;
    int ok = 1;
    cJSON_ArrayForEach(c, calls) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(c, "id");
        if (!cJSON_IsString(id) || !mistral_id(id->valuestring)) {
            ok = 0;
            break;
        }
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        cJSON *a = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : NULL;
        if (!a) a = args && !cJSON_IsString(args) ? cJSON_Duplicate(args, 1) : cJSON_CreateObject();
        cJSON *nm = cJSON_CreateString(cJSON_IsString(name) ? name->valuestring : "");
        if (c != calls->child) puts_(b, ", ");
        puts_(b, "{\"name\": ");
        py_json(b, nm, -1, 0);
        puts_(b, ", \"arguments\": ");
        py_json(b, a, -1, 0);
        puts_(b, ", \"id\": \"");
        puts_(b, id->valuestring);
        puts_(b, "\"}");
        cJSON_Delete(nm);
        cJSON_Delete(a);
    }
    cJSON_Delete(calls);
    puts_(b, "]</s>");
    return ok ? 0
              : fail(e, "messages",
                     "Mistral's tool calls need an 'id' of 9 letters and digits, as the ids of "
                     "this server's answers are");
}

int srv_tools_prompt(const srv_request *r, char **out, srv_error *e) {
    *out = NULL;
    int i0 = r->n_messages &&
             (!strcmp(r->messages[0].role, "system") || !strcmp(r->messages[0].role, "developer"));
    int last_user = -1;
    for (int i = i0; i < r->n_messages; i++) {
        const char *ro = r->messages[i].role;
        if (!strcmp(ro, "system") || !strcmp(ro, "developer"))
            return fail(e, "messages", "Mistral's template takes one system message, the first");
        if (!strcmp(ro, "user")) last_user = i;
    }
    cJSON *tools = r->tools && r->tool_choice != SRV_TOOLS_NONE ? cJSON_Parse(r->tools) : NULL;
    sbuf b = {0};
    int rc = 0;
    puts_(&b, "<s>");
    for (int i = i0; i < r->n_messages && !rc; i++) {
        const srv_message *s = &r->messages[i];
        if (!strcmp(s->role, "user")) {
            if (tools && i == last_user) mistral_tools(&b, tools);
            puts_(&b, "[INST]");
            /* the system prompt opens the last user message, as Mistral's tokenizer has it */
            if (i0 && i == last_user) {
                puts_(&b, r->messages[0].content ? r->messages[0].content : "");
                puts_(&b, "\n\n");
            }
            puts_(&b, s->content ? s->content : "");
            puts_(&b, "[/INST]");
        } else if (!strcmp(s->role, "tool")) {
            if (!mistral_id(s->tool_call_id)) {
                rc = fail(e, "messages",
                          "Mistral's tool results need a 'tool_call_id' of 9 letters and digits");
                break;
            }
            /* the content as it is, unquoted: the template's shape */
            puts_(&b, "[TOOL_RESULTS]{\"content\": ");
            puts_(&b, s->content ? s->content : "");
            puts_(&b, ", \"call_id\": \"");
            puts_(&b, s->tool_call_id);
            puts_(&b, "\"}[/TOOL_RESULTS]");
        } else if (s->tool_calls && strcmp(s->tool_calls, "[]")) {
            rc = mistral_calls(&b, s->tool_calls, e);
        } else { /* an empty tool_calls, which clients send, is an answer without calls */
            puts_(&b, s->content ? s->content : "");
            puts_(&b, "</s>");
        }
    }
    cJSON_Delete(tools);
    if (!rc && (b.oom || !b.s)) rc = fail(e, "messages", "out of memory");
    if (rc) {
        free(b.s);
        return rc;
    }
    *out = b.s;
    return 0;
}

/* The name `root` in GBNF text, outside literals and classes, renamed to `to`. */
static void rename_root(sbuf *b, const char *g, const char *to) {
    for (const char *p = g; *p;) {
        if (*p == '"' || *p == '[') { /* a literal or a class, escapes included */
            char close = *p == '"' ? '"' : ']';
            const char *q = p + 1;
            while (*q && *q != close) q += q[0] == '\\' && q[1] ? 2 : 1;
            if (*q) q++;
            put(b, p, (size_t)(q - p));
            p = q;
        } else if (!strncmp(p, "root", 4) &&
                   (p == g ||
                    !(p[-1] == '-' || p[-1] == '_' || (p[-1] >= 'a' && p[-1] <= 'z') ||
                      (p[-1] >= 'A' && p[-1] <= 'Z') || (p[-1] >= '0' && p[-1] <= '9'))) &&
                   !(p[4] == '-' || p[4] == '_' || (p[4] >= 'a' && p[4] <= 'z') ||
                     (p[4] >= 'A' && p[4] <= 'Z') || (p[4] >= '0' && p[4] <= '9'))) {
            puts_(b, to);
            p += 4;
        } else {
            put(b, p, 1);
            p++;
        }
    }
}

int srv_tools_grammar(const srv_request *r, tlm_grammar **out, srv_error *e) {
    *out = NULL;
    cJSON *tools = cJSON_Parse(r->tools);
    /* the call object: one of the functions (or the named one), its arguments by its schema */
    cJSON *schema = cJSON_CreateObject(), *any = cJSON_AddArrayToObject(schema, "anyOf");
    int llama3 = r->tool_format == SRV_TOOLFMT_LLAMA3;
    int mistral = r->tool_format == SRV_TOOLFMT_MISTRAL;
    const char *key = llama3 ? "parameters" : "arguments";
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const char *name = cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring;
        if (r->tool_choice == SRV_TOOLS_NAMED && strcmp(name, r->tool_name)) continue;
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "type", "object");
        cJSON *props = cJSON_AddObjectToObject(o, "properties");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(props, "name"), "const", name);
        cJSON_AddItemToObject(props, key,
                              params ? cJSON_Duplicate(params, 1) : cJSON_CreateObject());
        cJSON *req = cJSON_AddArrayToObject(o, "required");
        cJSON_AddItemToArray(req, cJSON_CreateString("name"));
        cJSON_AddItemToArray(req, cJSON_CreateString(key));
        cJSON_AddItemToArray(any, o);
    }
    char *text = cJSON_PrintUnformatted(schema), *gbnf = NULL;
    cJSON_Delete(schema);
    cJSON_Delete(tools);
    if (!text) return fail(e, "tools", "out of memory");
    tlm_status st = tlm_json_schema_to_gbnf(text, strlen(text), &gbnf);
    free(text);
    if (st) {
        char msg[sizeof e->message];
        snprintf(msg, sizeof msg, "a tool's parameters: %s", tlm_last_error());
        return fail(e, "tools", msg);
    }
    sbuf b = {0};
    rename_root(&b, gbnf, "tool-call-object");
    free(gbnf);
    if (llama3) /* one call: Meta's template takes one back */
        puts_(&b, "\nroot ::= tool-call-object\n");
    else if (mistral) /* [TOOL_CALLS] is a control token, which no grammar takes: the array, its
                       * calls without ids (schemas here cannot hold one to letters and digits,
                       * and the parser gives each call one) */
        puts_(&b, r->parallel_tools
                      ? "\nroot ::= \"[\" tool-call-object (\", \" tool-call-object)* \"]\"\n"
                      : "\nroot ::= \"[\" tool-call-object \"]\"\n");
    else
        puts_(&b, r->parallel_tools ? "\nroot ::= tool-call (\"\\n\" tool-call)*\n"
                                    : "\nroot ::= tool-call\n");
    if (!llama3 && !mistral)
        puts_(&b, "tool-call ::= \"<tool_call>\\n\" tool-call-object \"\\n</tool_call>\"\n");
    if (b.oom) {
        free(b.s);
        return fail(e, "tools", "out of memory");
    }
    st = tlm_grammar_parse(b.s, b.n, out);
    free(b.s);
    if (st) {
        char msg[sizeof e->message];
        snprintf(msg, sizeof msg, "the tools' grammar: %s", tlm_last_error());
        return fail(e, "tools", msg);
    }
    return 0;
}

void srv_tool_parse_free(srv_tool_parse *p) {
    free(p->content);
    free(p->calls);
    memset(p, 0, sizeof *p);
}

static const char OPEN[] = "<tool_call>", CLOSE[] = "</tool_call>";

int srv_tools_set_format(srv_request *r, int format, srv_error *e) {
    if (r->tool_format == format) return 0;
    r->tool_format = format;
    if (!r->tools || r->tool_choice < SRV_TOOLS_REQUIRED) return 0;
    /* the request's grammar is its call's (a response format excludes a required call) */
    tlm_grammar_free(r->grammar);
    r->grammar = NULL;
    return srv_tools_grammar(r, &r->grammar, e);
}

/* Appends an OpenAI tool call to calls; 0 when name or args are not a call's. */
static int add_call_id(cJSON *calls, const cJSON *name, const cJSON *args, const char *id) {
    if (!cJSON_IsString(name) || !args) return 0;
    char *a = cJSON_IsString(args) ? NULL : cJSON_PrintUnformatted(args);
    cJSON *call = cJSON_CreateObject();
    cJSON_AddStringToObject(call, "id", id);
    cJSON_AddStringToObject(call, "type", "function");
    cJSON *fn = cJSON_AddObjectToObject(call, "function");
    cJSON_AddStringToObject(fn, "name", name->valuestring);
    cJSON_AddStringToObject(fn, "arguments", a ? a : args->valuestring);
    free(a);
    cJSON_AddItemToArray(calls, call);
    return 1;
}

static int add_call(cJSON *calls, const cJSON *name, const cJSON *args, unsigned long long seed) {
    char id[40];
    snprintf(id, sizeof id, "call_%llx%02x", seed, (unsigned)cJSON_GetArraySize(calls));
    return add_call_id(calls, name, args, id);
}

/* The text trimmed into a malloc'd string, NULL when nothing is left. */
static char *trimmed(const char *s, size_t n) {
    size_t b = 0, e = n;
    while (b < e && s[b] && strchr(" \t\r\n", s[b])) b++;
    while (e > b && s[e - 1] && strchr(" \t\r\n", s[e - 1])) e--;
    if (e <= b) return NULL;
    char *o = malloc(e - b + 1);
    if (o) {
        memcpy(o, s + b, e - b);
        o[e - b] = 0;
    }
    return o;
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

/* Llama 3.1: the whole answer is calls, {"name", "parameters"} objects (or "arguments", which
 * fine-tunes write), after an optional <|python_tag|>, separated by newlines or semicolons;
 * anything else is text. */
static int llama3_parse(const char *text, size_t len, unsigned long long seed,
                        srv_tool_parse *out) {
    static const char TAG[] = "<|python_tag|>";
    cJSON *calls = cJSON_CreateArray();
    size_t at = 0;
    while (at < len && is_space(text[at])) at++;
    if (len - at >= sizeof TAG - 1 && !memcmp(text + at, TAG, sizeof TAG - 1)) at += sizeof TAG - 1;
    int ok = calls != NULL;
    while (ok) {
        while (at < len && (is_space(text[at]) || (text[at] == ';' && cJSON_GetArraySize(calls))))
            at++;
        if (at == len) break;
        const char *end = NULL;
        cJSON *j = text[at] == '{' ? cJSON_ParseWithLengthOpts(text + at, len - at, &end, 0) : NULL;
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(j, "parameters");
        if (!args) args = cJSON_GetObjectItemCaseSensitive(j, "arguments");
        ok = cJSON_IsObject(j) && cJSON_IsObject(args) && end &&
             add_call(calls, cJSON_GetObjectItemCaseSensitive(j, "name"), args, seed);
        cJSON_Delete(j);
        if (ok) at = (size_t)(end - text);
    }
    out->n_calls = ok ? cJSON_GetArraySize(calls) : 0;
    if (out->n_calls) out->calls = cJSON_PrintUnformatted(calls);
    cJSON_Delete(calls);
    if (!out->n_calls) out->content = trimmed(text, len);
    return out->n_calls && !out->calls ? -1 : 0;
}

/* One call object of Mistral's array at text[*at]: added to calls and *at moved past it, or 0. */
static int mistral_call(const char *text, size_t len, size_t *at, unsigned long long seed,
                        cJSON *calls) {
    const char *end = NULL;
    cJSON *c = text[*at] == '{' ? cJSON_ParseWithLengthOpts(text + *at, len - *at, &end, 0) : NULL;
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(c, "arguments");
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(c, "id");
    char made[10];
    int own = cJSON_IsString(id) && mistral_id(id->valuestring);
    if (!own) mistral_make_id(made, seed, cJSON_GetArraySize(calls));
    int ok = cJSON_IsObject(c) && cJSON_IsObject(args) && end &&
             add_call_id(calls, cJSON_GetObjectItemCaseSensitive(c, "name"), args,
                         own ? id->valuestring : made);
    cJSON_Delete(c);
    if (ok) *at = (size_t)(end - text);
    return ok;
}

/* Mistral: text, then [TOOL_CALLS] and a JSON array of {"name", "arguments", "id"} objects. The
 * marker is a control token, which decoding leaves out, so an answer that opens with such an array
 * is calls too. Each whole call of the array is one, as far as they go: an answer cut off in its
 * array keeps the calls before the cut, and what follows the last call (a cut-off or malformed
 * one, more text) joins the content. A call keeps the model's id when it is one of 9 letters and
 * digits. */
static int mistral_parse(const char *text, size_t len, unsigned long long seed,
                         srv_tool_parse *out) {
    static const char TAG[] = "[TOOL_CALLS]";
    const size_t tn = sizeof TAG - 1;
    size_t at = 0, pre = 0;
    while (at < len && is_space(text[at])) at++;
    for (size_t i = at; i + tn <= len; i++)
        if (!memcmp(text + i, TAG, tn)) {
            pre = i;
            at = i + tn;
            break;
        }
    cJSON *calls = cJSON_CreateArray();
    if (!calls) return -1;
    while (at < len && is_space(text[at])) at++;
    size_t rest = at; /* where the text after the calls begins */
    while (at < len && text[at] == '[') {
        size_t p = at + 1;
        int closed = 0;
        for (;;) {
            while (p < len && is_space(text[p])) p++;
            if (p >= len || !mistral_call(text, len, &p, seed, calls)) break;
            rest = p;
            while (p < len && is_space(text[p])) p++;
            if (p < len && text[p] == ']') {
                rest = at = p + 1;
                closed = 1;
                break;
            }
            if (p >= len || text[p] != ',') break;
            p++;
            while (p < len && is_space(text[p])) p++;
            rest = p; /* a broken call is text from its start */
        }
        if (!closed) break;
        /* another marker and array may follow */
        while (at < len && is_space(text[at])) at++;
        if (at + tn <= len && !memcmp(text + at, TAG, tn)) at += tn;
        while (at < len && is_space(text[at])) at++;
    }
    out->n_calls = cJSON_GetArraySize(calls);
    if (out->n_calls) out->calls = cJSON_PrintUnformatted(calls);
    cJSON_Delete(calls);
    if (!out->n_calls) {
        out->content = trimmed(text, len);
    } else {
        /* the text before the marker and after the calls, a space between */
        while (pre && is_space(text[pre - 1])) pre--;
        size_t n = pre + 1 + (len - rest);
        char *c = malloc(n + 1);
        if (!c) return -1;
        memcpy(c, text, pre);
        c[pre] = ' ';
        memcpy(c + pre + 1, text + rest, len - rest);
        c[n] = 0;
        out->content = trimmed(c, n);
        free(c);
    }
    return out->n_calls && !out->calls ? -1 : 0;
}

int srv_tools_parse_as(int format, const char *text, size_t len, unsigned long long id_seed,
                       srv_tool_parse *out) {
    if (format != SRV_TOOLFMT_LLAMA3 && format != SRV_TOOLFMT_MISTRAL)
        return srv_tools_parse(text, len, id_seed, out);
    memset(out, 0, sizeof *out);
    return format == SRV_TOOLFMT_LLAMA3 ? llama3_parse(text, len, id_seed, out)
                                        : mistral_parse(text, len, id_seed, out);
}

int srv_tools_parse(const char *text, size_t len, unsigned long long id_seed, srv_tool_parse *out) {
    memset(out, 0, sizeof *out);
    cJSON *calls = cJSON_CreateArray();
    sbuf content = {0};
    size_t at = 0;
    while (at < len) {
        const char *o = NULL;
        for (size_t i = at; i + sizeof OPEN - 1 <= len; i++)
            if (!memcmp(text + i, OPEN, sizeof OPEN - 1)) {
                o = text + i;
                break;
            }
        const char *c = NULL, *body = o ? o + sizeof OPEN - 1 : NULL;
        for (const char *q = body; q && q + sizeof CLOSE - 1 <= text + len; q++)
            if (!memcmp(q, CLOSE, sizeof CLOSE - 1)) {
                c = q;
                break;
            }
        cJSON *j = c ? cJSON_ParseWithLength(body, (size_t)(c - body)) : NULL;
        const cJSON *name = j ? cJSON_GetObjectItemCaseSensitive(j, "name") : NULL;
        const cJSON *args = j ? cJSON_GetObjectItemCaseSensitive(j, "arguments") : NULL;
        if (!cJSON_IsString(name) || !args) { /* no well-formed call: the rest is text */
            cJSON_Delete(j);
            put(&content, text + at, len - at);
            break;
        }
        if (!cJSON_GetArraySize(calls)) put(&content, text + at, (size_t)(o - text) - at);
        char *a = cJSON_IsString(args) ? NULL : cJSON_PrintUnformatted(args);
        cJSON *call = cJSON_CreateObject();
        char id[40];
        snprintf(id, sizeof id, "call_%llx%02x", id_seed, (unsigned)cJSON_GetArraySize(calls));
        cJSON_AddStringToObject(call, "id", id);
        cJSON_AddStringToObject(call, "type", "function");
        cJSON *fn = cJSON_AddObjectToObject(call, "function");
        cJSON_AddStringToObject(fn, "name", name->valuestring);
        cJSON_AddStringToObject(fn, "arguments", a ? a : args->valuestring);
        free(a);
        cJSON_AddItemToArray(calls, call);
        cJSON_Delete(j);
        at = (size_t)(c - text) + sizeof CLOSE - 1;
    }
    out->n_calls = cJSON_GetArraySize(calls);
    if (out->n_calls) out->calls = cJSON_PrintUnformatted(calls);
    cJSON_Delete(calls);
    /* the content without the whitespace around it; none at all is null */
    size_t b = 0, e = content.n;
    while (b < e && content.s[b] && strchr(" \t\r\n", content.s[b])) b++;
    while (e > b && content.s[e - 1] && strchr(" \t\r\n", content.s[e - 1])) e--;
    if (e > b) {
        out->content = malloc(e - b + 1);
        if (out->content) {
            memcpy(out->content, content.s + b, e - b);
            out->content[e - b] = 0;
        }
    }
    free(content.s);
    return (out->n_calls && !out->calls) || content.oom ? -1 : 0;
}
