/* tlm_tokenizer_load on every tokenizer format (first byte: the format), then encoding
 * and decoding. The work is fuzz_tokenizer_load in fuzz_entries.h (tests/test_fuzz_corpus.c replays
 * the corpus through it). */
#include "fuzz_entries.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_tokenizer_load(data, size);
    return 0;
}
