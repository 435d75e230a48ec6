/* GPT-2 encoder.json + vocab.bpe. The input is split at the first NUL byte: the part before is
 * encoder.json, the rest vocab.bpe. */
#include <string.h>

#include "fuzz_common.h"
#include "tlm.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *z = memchr(data, 0, size);
    size_t a = z ? (size_t)(z - data) : size;
    const char *enc = fuzz_file(".json", data, a);
    const char *bpe = fuzz_file(".bpe", z ? z + 1 : data, z ? size - a - 1 : 0);
    tlm_tokenizer *t = NULL;
    if (tlm_tokenizer_load_gpt2(enc, bpe, &t) == TLM_OK) {
        const char *text = "Hello world, it's 2024! \xC3\xA9\xF0\x9F\x98\x80 <|endoftext|>";
        int32_t *ids = NULL;
        size_t n = 0;
        if (tlm_tokenizer_encode(t, text, strlen(text), TLM_ENCODE_ALLOW_SPECIAL, &ids, &n) ==
            TLM_OK) {
            char *out = NULL;
            size_t len = 0;
            if (tlm_tokenizer_decode(t, ids, n, 0, &out, &len) == TLM_OK) free(out);
            free(ids);
        }
        tlm_tokenizer_free(t);
    }
    remove(enc);
    remove(bpe);
    return 0;
}
