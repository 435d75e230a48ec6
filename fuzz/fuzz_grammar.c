/* GBNF grammars and JSON Schemas (a request's response_format, json_schema or grammar) compiled,
 * then followed over arbitrary text. The work is fuzz_grammar in fuzz_entries.h
 * (tests/test_fuzz_corpus.c replays the corpus through it). */
#include "fuzz_entries.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_grammar(data, size);
    return 0;
}
