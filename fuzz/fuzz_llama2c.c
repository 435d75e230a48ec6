/* llama2.c model files (legacy and v1 headers). */
#include "fuzz_common.h"
#include "tlm.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *p = fuzz_file(".bin", data, size);
    tlm_model *m = NULL;
    if (tlm_model_load_llama2c(p, &m) == TLM_OK) tlm_model_free(m);
    remove(p);
    return 0;
}
