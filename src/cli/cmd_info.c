#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli.h"

static const char *info_help =
    "usage: tlm info (-m MODEL | -c CONFIG.json) [--json]\n\n"
    "Shows the architecture and the exact parameter counts, per component, total and\n"
    "non-embedding (total minus the token and learned position embeddings).\n\n"
    "  -c, --config FILE   a config JSON (keys: the config field names)\n"
    "  -m, --model PATH    a model (tlm checkpoint directory or .safetensors)\n"
    "  --json              print JSON (keys include parameters, non_embedding_parameters)\n";

static void print_json(const tlm_config *c, const tlm_param_count *pc) {
    cJSON *o = cJSON_CreateObject();
    char *cfg = tlm_config_to_json(c);
    cJSON_AddItemToObject(o, "config", cJSON_Parse(cfg));
    free(cfg);
    cJSON_AddNumberToObject(o, "parameters", (double)pc->total);
    cJSON_AddNumberToObject(o, "non_embedding_parameters", (double)pc->non_embedding);
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
    printf(
        "  n_layers        %d\n  n_heads         %d\n  n_kv_heads      %d\n  d_ff            %d\n",
        c->n_layers, c->n_heads, c->n_kv_heads, c->d_ff);
    printf("  norm            %s (eps %g, %s)\n", tlm_norm_name(c->norm), (double)c->norm_eps,
           tlm_norm_position_name(c->norm_position));
    printf("  ffn             %s\n", tlm_ffn_name(c->ffn));
    printf("  position        %s", tlm_position_name(c->position));
    if (c->position == TLM_POS_ROPE)
        printf(" (theta %g, %s pairs)", (double)c->rope_theta,
               tlm_rope_pairing_name(c->rope_pairing));
    printf("\n  tie_embeddings  %s\n  bias            %s\n  dropout         %g\n",
           c->tie_embeddings ? "true" : "false", c->bias ? "true" : "false", (double)c->dropout);
    printf("\nparameters\n");
    for (int k = 0; k < TLM_COMP_COUNT; k++)
        if (pc->per_component[k])
            printf("  %-20s %15zu\n", tlm_component_name((tlm_component)k), pc->per_component[k]);
    printf("  %-20s %15zu\n", "total", pc->total);
    printf("  %-20s %15zu\n", "non-embedding", pc->non_embedding);
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
        return cli_fail("info: -m is not supported yet for '%s'", model);
    }
    tlm_param_count pc;
    tlm_count_params(&c, &pc);
    if (json)
        print_json(&c, &pc);
    else
        print_table(&c, &pc);
    return 0;
}
