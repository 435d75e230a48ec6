#include <string.h>

#include "cli.h"

typedef struct {
    const char *name;
    int (*fn)(int, char **);
    const char *summary;
} command;

static const command commands[] = {
    {"info", cmd_info, "show a model's architecture and parameter counts"},
    {"train", cmd_train, "train a model on a text file (AdamW, checkpoints, --resume)"},
    {"generate", cmd_generate, "sample text from a model (KV cache, streaming)"},
    {"tokenize", cmd_tokenize, "text on stdin -> token ids on stdout"},
    {"tokenizer", cmd_tokenizer, "tokenizer tools: `tlm tokenizer train`"},
    {"convert", cmd_convert, "convert a model between formats (gguf, safetensors, hf, llama2c)"},
};

static void usage(FILE *f) {
    fprintf(f, "tlm %s: a decoder-only Transformer language model in C\n\n", TLM_VERSION);
    fprintf(f, "usage: tlm COMMAND [options]   (tlm COMMAND --help for its options)\n\n");
    fprintf(f, "commands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 1;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-v")) {
        printf("tlm %s\n", TLM_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    return cli_fail("unknown command '%s' (see tlm --help)", argv[1]);
}
