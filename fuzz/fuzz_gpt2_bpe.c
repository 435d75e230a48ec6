/* GPT-2 encoder.json + vocab.bpe, split at the first NUL byte. The work is fuzz_gpt2_bpe in
 * fuzz_entries.h (tests/test_fuzz_corpus.c replays the corpus through it). */
#include "fuzz_entries.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_gpt2_bpe(data, size);
    return 0;
}
