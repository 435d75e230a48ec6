/* Chat requests' messages through the library's templates (tlm_chat_render). */
#include <stdlib.h>

#include "core/core.h"
#include "serve/serve.h"

tlm_status srv_template_apply(tlm_chat_template t, const srv_message *msgs, int n, char **out) {
    tlm_chat_message *m = malloc((size_t)(n > 0 ? n : 1) * sizeof *m);
    if (!m) return core_err(TLM_ERR_NOMEM, "out of memory rendering a chat");
    for (int i = 0; i < n; i++) m[i] = (tlm_chat_message){msgs[i].role, msgs[i].content};
    tlm_status s = tlm_chat_render(t, m, n, 1, out, NULL, NULL);
    free(m);
    return s;
}
