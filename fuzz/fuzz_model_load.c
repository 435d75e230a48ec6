/* tlm_model_load on every model format (first byte: the format), then one token through a
 * session. The work is fuzz_model_load in fuzz_entries.h (tests/test_fuzz_corpus.c replays the
 * corpus through it). */
#include "fuzz_entries.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_model_load(data, size);
    return 0;
}
