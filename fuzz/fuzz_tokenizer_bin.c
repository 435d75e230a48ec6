/* llama2.c tokenizer.bin, then encoding and decoding a fixed text. The work is fuzz_tokenizer_bin
 * in fuzz_entries.h (tests/test_fuzz_corpus.c replays the corpus through it). */
#include "fuzz_entries.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_tokenizer_bin(data, size);
    return 0;
}
