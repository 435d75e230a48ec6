/* llama2.c model files (legacy and v1 headers). The work is fuzz_llama2c in fuzz_entries.h
 * (tests/test_fuzz_corpus.c replays the corpus through it). */
#include "fuzz_entries.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_llama2c(data, size);
    return 0;
}
