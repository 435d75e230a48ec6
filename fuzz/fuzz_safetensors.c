/* safetensors header parsing and float conversion of every tensor. The work is fuzz_safetensors in
 * fuzz_entries.h (tests/test_fuzz_corpus.c replays the corpus through it). */
#include "fuzz_entries.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_safetensors(data, size);
    return 0;
}
