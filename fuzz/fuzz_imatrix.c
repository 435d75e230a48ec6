/* Importance matrix files (GGUF and legacy .dat). The work is fuzz_imatrix in fuzz_entries.h
 * (tests/test_fuzz_corpus.c replays the corpus through it). */
#include "fuzz_entries.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_imatrix(data, size);
    return 0;
}
