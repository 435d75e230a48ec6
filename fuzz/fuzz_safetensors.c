/* safetensors header parsing and float conversion of every tensor. */
#include "fuzz_common.h"
#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *p = fuzz_file(".safetensors", data, size);
    st_file f;
    if (st_open(&f, p) == TLM_OK) {
        for (int i = 0; i < f.n; i++) {
            const st_tensor *t = &f.tensors[i];
            if (t->numel > (1u << 20)) continue;
            float *buf = malloc((t->numel ? t->numel : 1) * sizeof(float));
            st_read_f32(&f, t, buf, t->numel);
            free(buf);
        }
        st_find(&f, "token_embd.weight");
        st_meta(&f, "tlm_config");
        st_close(&f);
    }
    remove(p);
    return 0;
}
