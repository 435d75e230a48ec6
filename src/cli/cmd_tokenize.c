#include "cli.h"

/* Placeholders until the tokenizer module lands. */
int cmd_tokenize(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return cli_fail("tokenize: not implemented yet");
}

int cmd_tokenizer(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return cli_fail("tokenizer: not implemented yet");
}
