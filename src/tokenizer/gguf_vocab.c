#include "tok_internal.h"
tlm_status tok_load_gguf(const char *path, tlm_tokenizer **out) {
    *out = NULL;
    return tlm_err(TLM_ERR_UNSUPPORTED, "'%s': GGUF vocabularies not yet", path);
}
