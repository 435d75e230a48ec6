/* tlm serve's request parser over arbitrary bodies. The work is fuzz_request in fuzz_entries.h
 * (tests/test_fuzz_corpus.c replays the corpus through it). */
#include "fuzz_entries.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_request(data, size);
    return 0;
}
