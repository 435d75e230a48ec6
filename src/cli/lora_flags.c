/* The --lora flags that generate, eval, bench and serve share. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static int add(const char *cmd, cli_lora *l, const char *path, char *owned, float scale) {
    if (l->n == CLI_LORA_MAX) {
        free(owned);
        cli_fail("%s: at most %d adapters", cmd, CLI_LORA_MAX);
        return -1;
    }
    l->path[l->n] = owned ? owned : path;
    l->owned[l->n] = owned;
    l->scale[l->n] = scale;
    l->lora[l->n] = NULL;
    l->n++;
    return 1;
}

int cli_lora_flag(const char *cmd, int argc, char **argv, int *i, cli_lora *l) {
    const char *v;
    if (cli_flag_value(argc, argv, i, "--lora", NULL, &v)) {
        if (!v) {
            cli_fail("%s: --lora needs a file", cmd);
            return -1;
        }
        /* FILE:SCALE when what follows the last ':' is a number (a path may hold ':' too). */
        const char *colon = strrchr(v, ':');
        double x;
        if (colon && colon[1] && cli_parse_float(colon + 1, &x)) {
            if (!(x >= -100 && x <= 100)) {
                cli_fail("%s: --lora scale %s is outside [-100, 100]", cmd, colon + 1);
                return -1;
            }
            char *p = strndup(v, (size_t)(colon - v));
            if (!p) {
                cli_fail("%s: out of memory", cmd);
                return -1;
            }
            return add(cmd, l, NULL, p, (float)x);
        }
        return add(cmd, l, v, NULL, 1.0f);
    }
    if (!strcmp(argv[*i], "--lora-scaled")) {
        double x;
        if (*i + 2 >= argc) {
            cli_fail("%s: --lora-scaled needs a file and a scale", cmd);
            return -1;
        }
        if (!cli_parse_float(argv[*i + 2], &x) || !(x >= -100 && x <= 100)) {
            cli_fail("%s: --lora-scaled scale must be a number in [-100, 100] (got '%s')", cmd,
                     argv[*i + 2]);
            return -1;
        }
        *i += 2;
        return add(cmd, l, argv[*i - 1], NULL, (float)x);
    }
    return 0;
}

int cli_lora_load(const char *cmd, cli_lora *l, const tlm_model *m) {
    for (int k = 0; k < l->n; k++)
        if (tlm_lora_load(m, l->path[k], &l->lora[k]))
            return cli_fail("%s: LoRA adapter %s: %s", cmd, l->path[k], tlm_last_error());
    return 0;
}

void cli_lora_free(cli_lora *l) {
    for (int k = 0; k < l->n; k++) {
        tlm_lora_free(l->lora[k]);
        free(l->owned[k]);
    }
    memset(l, 0, sizeof *l);
}
