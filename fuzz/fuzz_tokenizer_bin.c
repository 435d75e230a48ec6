/* llama2.c tokenizer.bin, then encoding and decoding a fixed text with whatever loaded. */
#include <string.h>

#include "fuzz_common.h"
#include "tokenizer/tok_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *p = fuzz_file(".bin", data, size);
    tlm_tokenizer *t = NULL;
    if (tok_load_llama2c(p, &t) == TLM_OK) {
        const char *text = "Once upon a time \xE2\x96\x81 caf\xC3\xA9 \xFF!";
        int32_t *ids = NULL;
        size_t n = 0;
        if (tlm_tokenizer_encode(t, text, strlen(text), 0, &ids, &n) == TLM_OK) {
            char *out = NULL;
            size_t len = 0;
            if (tlm_tokenizer_decode(t, ids, n, 0, &out, &len) == TLM_OK) free(out);
            free(ids);
        }
        tlm_tokenizer_free(t);
    }
    remove(p);
    return 0;
}
