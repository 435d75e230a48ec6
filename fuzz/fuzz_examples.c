/* Instruction data (JSON Lines) through tlm_examples_load and the trainer's rows. The work is
 * fuzz_examples in fuzz_entries.h (tests/test_fuzz_corpus.c replays the corpus through it). */
#include "fuzz_entries.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_examples(data, size);
    return 0;
}
