/* GGUF: the general reader, then the llama model loader and the vocabulary loader. The work is
 * fuzz_gguf in fuzz_entries.h (tests/test_fuzz_corpus.c replays the corpus through it). */
#include "fuzz_entries.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_gguf(data, size);
    return 0;
}
