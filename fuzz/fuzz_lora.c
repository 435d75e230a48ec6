/* LoRA adapter files (llama.cpp's GGUF adapters). The work is fuzz_lora in fuzz_entries.h
 * (tests/test_fuzz_corpus.c replays the corpus through it). */
#include "fuzz_entries.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_lora(data, size);
    return 0;
}
