#include "tok_internal.h"
tlm_status tlm_tokenizer_train_bpe_texts(const char *const *texts, const size_t *lens, int n_texts,
                                         const tlm_bpe_train_opts *opts, tlm_tokenizer **out) {
    *out = NULL;
    return tlm_err(TLM_ERR_UNSUPPORTED, "not yet");
}
tlm_status tlm_tokenizer_train_bpe(const char *const *files, int n_files,
                                   const tlm_bpe_train_opts *opts, tlm_tokenizer **out) {
    *out = NULL;
    return tlm_err(TLM_ERR_UNSUPPORTED, "not yet");
}
