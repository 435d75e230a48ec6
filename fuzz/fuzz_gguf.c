/* GGUF: the general reader, then the llama model loader and the vocabulary loader on top. */
#include "formats/formats.h"
#include "fuzz_common.h"
#include "io/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tlm_gguf *g = NULL;
    if (tlm_gguf_open_memory(data, size, "fuzz.gguf", &g) == TLM_OK) {
        tlm_model *m = NULL;
        if (fmt_gguf_load_model(g, "fuzz.gguf", &m) == TLM_OK) tlm_model_free(m);
        tlm_gguf_close(g);
        /* the vocabulary loader reads from a path */
        const char *p = fuzz_file(".gguf", data, size);
        tlm_tokenizer *t = NULL;
        if (tlm_tokenizer_load(p, &t) == TLM_OK) tlm_tokenizer_free(t);
        remove(p);
    }
    return 0;
}
