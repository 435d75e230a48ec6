#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "core/dtype.h"

/* The weights' size and bits per weight, and how many tensors of each type (llama.cpp prints the
 * same when it loads a file: "type q4_K: 72 tensors", "file size = ... (5.76 BPW)"). */
static void print_types(const tlm_file_tensor *ft, int nt) {
    int count[TLM_DTYPE_COUNT] = {0};
    double bytes = 0, elems = 0;
    for (int i = 0; i < nt; i++) {
        tlm_dtype d;
        if (!core_dtype_from_name(ft[i].dtype, &d)) continue;
        uint64_t n = 1;
        for (int k = 0; k < ft[i].ndim; k++) n *= (uint64_t)ft[i].shape[k];
        count[d]++;
        bytes += (double)core_dtype_bytes(d, n);
        elems += (double)n;
    }
    if (elems <= 0) return;
    printf("\nweights           %.2f MiB, %.2f bits per weight (", bytes / 1048576.0,
           8.0 * bytes / elems);
    const char *sep = "";
    for (int t = 0; t < TLM_DTYPE_COUNT; t++)
        if (count[t]) {
            printf("%s%s %d", sep, tlm_dtype_name((tlm_dtype)t), count[t]);
            sep = ", ";
        }
    printf(")\n");
}

static const char *info_help =
    "usage: tlm info (-m MODEL | -c CONFIG.json) [--json]\n\n"
    "Shows the architecture and the exact parameter counts, per component, total and\n"
    "non-embedding (total minus the token and learned position embeddings).\n\n"
    "  -c, --config FILE   a config JSON (keys: the config field names)\n"
    "  -m, --model PATH    a model: tlm checkpoint (directory or .safetensors), llama2.c .bin,\n"
    "                      .gguf, Hugging Face directory; adds its format, the tensors it\n"
    "                      stores (name, dtype, shape outermost first) and its tokenizer\n"
    "  --json              print JSON (keys include parameters, non_embedding_parameters)\n";

static void print_json(const tlm_config *c, const tlm_param_count *pc, cJSON *extra) {
    cJSON *o = extra ? extra : cJSON_CreateObject();
    char *cfg = tlm_config_to_json(c);
    cJSON_AddItemToObject(o, "config", cJSON_Parse(cfg));
    free(cfg);
    cJSON_AddNumberToObject(o, "parameters", (double)pc->total);
    cJSON_AddNumberToObject(o, "non_embedding_parameters", (double)pc->non_embedding);
    cJSON_AddNumberToObject(o, "active_parameters", (double)tlm_config_active_params(c));
    cJSON *comp = cJSON_AddObjectToObject(o, "components");
    for (int k = 0; k < TLM_COMP_COUNT; k++)
        if (pc->per_component[k])
            cJSON_AddNumberToObject(comp, tlm_component_name((tlm_component)k),
                                    (double)pc->per_component[k]);
    char *s = cJSON_Print(o);
    puts(s);
    free(s);
    cJSON_Delete(o);
}

static void print_table(const tlm_config *c, const tlm_param_count *pc) {
    printf("architecture\n");
    printf("  vocab_size      %d\n  context_length  %d\n  d_model         %d\n", c->vocab_size,
           c->context_length, c->d_model);
    printf("  n_layers        %d\n  n_heads         %d\n  n_kv_heads      %d\n", c->n_layers,
           c->n_heads, c->n_kv_heads);
    /* a mixture's FFN is its experts' (their width below); d_ff is then unused */
    if (!c->n_experts) printf("  d_ff            %d\n", c->d_ff);
    printf("  norm            %s (eps %g, %s)\n", tlm_norm_name(c->norm), (double)c->norm_eps,
           tlm_norm_position_name(c->norm_position));
    printf("  ffn             %s\n", tlm_ffn_name(c->ffn));
    printf("  position        %s", tlm_position_name(c->position));
    if (c->position == TLM_POS_ROPE)
        printf(" (theta %g, %s pairs)", (double)c->rope_theta,
               tlm_rope_pairing_name(c->rope_pairing));
    printf("\n  tie_embeddings  %s\n  bias            %s\n", c->tie_embeddings ? "true" : "false",
           c->bias       ? "true"
           : c->qkv_bias ? "q, k and v"
                         : "false");
    printf("  dropout         %g\n", (double)c->dropout);
    if (c->sliding_window) {
        int n = 0;
        for (int l = 0; l < c->n_layers; l++) n += tlm_config_layer_windowed(c, l);
        printf("  sliding_window  %d (%d of %d layers", c->sliding_window, n, c->n_layers);
        if (c->sliding_window_pattern) printf("; every %d-th global", c->sliding_window_pattern);
        printf(")\n");
    }
    if (c->attn_softcap > 0.0f) printf("  attn_softcap    %g\n", (double)c->attn_softcap);
    if (c->final_softcap > 0.0f) printf("  final_softcap   %g\n", (double)c->final_softcap);
    if (c->embed_scale > 0.0f) printf("  embed_scale     %g\n", (double)c->embed_scale);
    if (c->attn_scale > 0.0f) printf("  attn_scale      %g\n", (double)c->attn_scale);
    if (c->post_norms) printf("  post_norms      true (after attention and after the ffn)\n");
    if (c->n_experts > 0) {
        printf("  experts         %d, %d used per token (width %d; weights %s)\n", c->n_experts,
               c->n_experts_used, c->expert_d_ff,
               c->expert_weights_norm ? "renormalised over the chosen" : "softmax probabilities");
        if (c->n_shared_experts)
            printf("  shared expert   width %d x %d, sigmoid-gated\n", c->n_shared_experts,
                   c->expert_d_ff);
        if (c->router_aux_loss_coef > 0.0f || c->router_z_loss_coef > 0.0f)
            printf("  router losses   load balancing x %g, z-loss x %g\n",
                   (double)c->router_aux_loss_coef, (double)c->router_z_loss_coef);
    }
    printf("\nparameters\n");
    for (int k = 0; k < TLM_COMP_COUNT; k++)
        if (pc->per_component[k])
            printf("  %-20s %15zu\n", tlm_component_name((tlm_component)k), pc->per_component[k]);
    printf("  %-20s %15zu\n", "total", pc->total);
    printf("  %-20s %15zu\n", "non-embedding", pc->non_embedding);
    if (c->n_experts > 0)
        printf("  %-20s %15zu\n", "active per token", tlm_config_active_params(c));
}

/* The tokenizer a model path carries: itself (GGUF, tlm tokenizer dir) or DIR/tokenizer. */
static tlm_tokenizer *model_tokenizer(const char *path) {
    tlm_tokenizer *t = NULL;
    if (tlm_tokenizer_load(path, &t) == TLM_OK) return t;
    char sub[4096];
    snprintf(sub, sizeof sub, "%s/tokenizer", path);
    if (tlm_tokenizer_load(sub, &t) == TLM_OK) return t;
    return NULL;
}

static void shape_str(const tlm_file_tensor *t, char *buf, size_t n) {
    size_t o = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < t->ndim && o < n; d++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

static int model_info(const char *path, int json) {
    tlm_model_format f;
    if (tlm_model_detect(path, &f)) return cli_fail_status("info");
    tlm_model *m;
    if (tlm_model_load(path, 0, &m)) return cli_fail_status("info");
    tlm_config c = *tlm_model_config(m);
    tlm_model_free(m);
    tlm_file_tensor *ft = NULL;
    int nt = 0;
    if (tlm_model_file_tensors(path, &ft, &nt)) return cli_fail_status("info");
    tlm_tokenizer *tok = model_tokenizer(path);
    tlm_param_count pc;
    tlm_config_count_params(&c, &pc);
    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "format", tlm_model_format_name(f));
        cJSON *arr = cJSON_AddArrayToObject(o, "tensors");
        for (int i = 0; i < nt; i++) {
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "name", ft[i].name);
            cJSON_AddStringToObject(e, "dtype", ft[i].dtype);
            cJSON *sh = cJSON_AddArrayToObject(e, "shape");
            for (int d = 0; d < ft[i].ndim; d++)
                cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)ft[i].shape[d]));
            cJSON_AddItemToArray(arr, e);
        }
        if (tok) {
            cJSON *t = cJSON_AddObjectToObject(o, "tokenizer");
            cJSON_AddStringToObject(t, "kind",
                                    tlm_tokenizer_kind_name(tlm_tokenizer_get_kind(tok)));
            cJSON_AddNumberToObject(t, "vocab_size", tlm_tokenizer_vocab_size(tok));
            cJSON_AddNumberToObject(t, "bos", tlm_tokenizer_bos(tok));
            cJSON_AddNumberToObject(t, "eos", tlm_tokenizer_eos(tok));
        } else {
            cJSON_AddNullToObject(o, "tokenizer");
        }
        print_json(&c, &pc, o);
    } else {
        printf("format            %s\n\n", tlm_model_format_name(f));
        print_table(&c, &pc);
        print_types(ft, nt);
        printf("\ntensors (%d)%s\n", nt,
               f == TLM_FORMAT_LLAMA2C ? ", unnamed fp32 arrays in the file" : "");
        size_t w = 4;
        for (int i = 0; i < nt; i++)
            if (strlen(ft[i].name) > w) w = strlen(ft[i].name);
        for (int i = 0; i < nt; i++) {
            char sh[96];
            shape_str(&ft[i], sh, sizeof sh);
            printf("  %-*s  %-5s %s\n", (int)w, ft[i].name, ft[i].dtype, sh);
        }
        printf("\ntokenizer\n");
        if (tok) {
            printf("  kind            %s\n  vocab_size      %d\n  bos, eos        %d, %d\n",
                   tlm_tokenizer_kind_name(tlm_tokenizer_get_kind(tok)),
                   (int)tlm_tokenizer_vocab_size(tok), (int)tlm_tokenizer_bos(tok),
                   (int)tlm_tokenizer_eos(tok));
        } else {
            printf("  none in this model (give -z TOKENIZER to generate text)\n");
        }
    }
    free(ft);
    tlm_tokenizer_free(tok);
    return 0;
}

int cmd_info(int argc, char **argv) {
    const char *config = NULL, *model = NULL;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(info_help, stdout);
            return 0;
        } else if (cli_flag_value(argc, argv, &i, "-c", "--config", &v)) {
            if (!v) return cli_fail("info: %s needs a value", argv[i]);
            config = v;
        } else if (cli_flag_value(argc, argv, &i, "-m", "--model", &v)) {
            if (!v) return cli_fail("info: %s needs a value", argv[i]);
            model = v;
        } else if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else {
            return cli_fail("info: unknown option '%s' (see tlm info --help)", argv[i]);
        }
    }
    if (!config == !model) return cli_fail("info: give exactly one of -c CONFIG or -m MODEL");
    tlm_config c;
    if (config) {
        if (tlm_config_load(config, &c)) return cli_fail_status("info");
    } else {
        return model_info(model, json);
    }
    tlm_param_count pc;
    tlm_config_count_params(&c, &pc);
    if (json)
        print_json(&c, &pc, NULL);
    else
        print_table(&c, &pc);
    return 0;
}
