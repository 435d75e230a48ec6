/* LoRA adapters on a session: every sequence may weigh each adapter differently (tlm serve's
 * per-request scales), so a pass whose rows disagree gives the block per-row factors. */
#include <stdlib.h>
#include <string.h>

#include "infer/infer.h"

void infer_lora_free(tlm_session *s) {
    free(s->lora_use);
    free(s->lora);
    free(s->lora_seq_scale);
    free(s->lora_row_scale);
    core_big_free(s->lora_scratch, s->lora_scratch_floats * sizeof(float));
    s->lora_use = NULL;
    s->lora = NULL;
    s->lora_seq_scale = s->lora_row_scale = s->lora_scratch = NULL;
    s->lora_scratch_floats = 0;
    s->lora_rows = 0;
    s->n_lora = 0;
}

tlm_status infer_lora_reserve(tlm_session *s) {
    if (!s->n_lora || s->lora_rows >= s->rows) return TLM_OK;
    int rows = s->rows;
    size_t want = mdl_lora_scratch_floats(s->lora_use, s->n_lora, rows);
    float *rs = malloc((size_t)rows * (size_t)s->n_lora * sizeof(float));
    float *sc = want > s->lora_scratch_floats ? core_big_alloc(want * sizeof(float)) : NULL;
    if (!rs || (want > s->lora_scratch_floats && !sc)) {
        free(rs);
        core_big_free(sc, want * sizeof(float));
        return core_err(TLM_ERR_NOMEM, "out of memory for LoRA rows");
    }
    if (sc) {
        core_big_free(s->lora_scratch, s->lora_scratch_floats * sizeof(float));
        s->lora_scratch = sc;
        s->lora_scratch_floats = want;
    }
    free(s->lora_row_scale);
    s->lora_row_scale = rs;
    s->lora_rows = rows;
    return TLM_OK;
}

tlm_status tlm_session_set_loras(tlm_session *s, const tlm_lora *const *loras, const float *scales,
                                 int n) {
    if (!s) return core_err(TLM_ERR_ARG, "set_loras: session must not be NULL");
    if (n < 0 || (n > 0 && !loras)) return core_err(TLM_ERR_ARG, "set_loras: %d adapters", n);
    for (int i = 0; i < n; i++) {
        if (!loras[i]) return core_err(TLM_ERR_ARG, "set_loras: adapter %d is NULL", i);
        tlm_status st = mdl_lora_check(loras[i], s->m);
        if (st) return st;
    }
    infer_lora_free(s);
    if (!n) return TLM_OK;
    s->lora_use = calloc((size_t)n, sizeof *s->lora_use);
    s->lora = calloc((size_t)n, sizeof *s->lora);
    s->lora_seq_scale = malloc((size_t)n * (size_t)s->B * sizeof(float));
    if (!s->lora_use || !s->lora || !s->lora_seq_scale) {
        infer_lora_free(s);
        return core_err(TLM_ERR_NOMEM, "out of memory");
    }
    s->n_lora = n;
    for (int i = 0; i < n; i++) {
        s->lora[i] = loras[i];
        s->lora_use[i] = (mdl_lora_use){loras[i], 1.0f, NULL};
        for (int b = 0; b < s->B; b++)
            s->lora_seq_scale[(size_t)b * n + i] = scales ? scales[i] : 1.0f;
    }
    tlm_status st = infer_lora_reserve(s);
    if (st) infer_lora_free(s);
    return st;
}

tlm_status tlm_session_set_seq_lora_scales(tlm_session *s, int seq, const float *scales) {
    if (!s || !scales) return core_err(TLM_ERR_ARG, "set_seq_lora_scales: NULL argument");
    if (seq < 0 || seq >= s->B)
        return core_err(TLM_ERR_ARG, "set_seq_lora_scales: sequence %d outside the batch of %d",
                        seq, s->B);
    if (!s->n_lora)
        return core_err(TLM_ERR_ARG, "set_seq_lora_scales: the session has no adapters");
    memcpy(s->lora_seq_scale + (size_t)seq * s->n_lora, scales, (size_t)s->n_lora * sizeof(float));
    return TLM_OK;
}

int tlm_session_num_loras(const tlm_session *s) { return s ? s->n_lora : 0; }

const mdl_lora_pass *infer_lora_pass(tlm_session *s, int N, const int *seqs, int seq) {
    if (!s->n_lora) return NULL;
    int n = s->n_lora;
    for (int i = 0; i < n; i++) {
        mdl_lora_use *u = &s->lora_use[i];
        float first = s->lora_seq_scale[(size_t)(seqs ? seqs[0] : seq) * n + i];
        int same = 1;
        for (int r = 1; r < N && seqs && same; r++)
            same = s->lora_seq_scale[(size_t)seqs[r] * n + i] == first;
        if (same) {
            u->scale = first;
            u->row_scale = NULL;
            continue;
        }
        float *rs = s->lora_row_scale + (size_t)i * s->lora_rows;
        for (int r = 0; r < N; r++) rs[r] = s->lora_seq_scale[(size_t)seqs[r] * n + i];
        u->scale = 1.0f;
        u->row_scale = rs;
    }
    s->lora_pass = (mdl_lora_pass){n, s->lora_use, NULL, s->lora_scratch, NULL, 0};
    return &s->lora_pass;
}
