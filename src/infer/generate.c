/* The generation loop over a batch of prompts: prefill each, then advance every unfinished
 * sequence together, one token per step, until each has stopped for its own reason. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "infer/infer.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void tlm_generate_opts_defaults(tlm_generate_opts *o) {
    *o = (tlm_generate_opts){.max_new_tokens = 256, .eos_id = -1};
    tlm_sampler_opts_defaults(&o->sampling);
}

tlm_status tlm_session_generate(tlm_session *s, const int32_t *const *prompts,
                                const int *prompt_lens, int n_prompts, const tlm_generate_opts *o,
                                tlm_stop_reason *stops, tlm_generate_stats *stats) {
    CORE_FP_FLUSH_SCOPE();
    if (!s || !prompts || !prompt_lens) return core_err(TLM_ERR_ARG, "generate: NULL argument");
    tlm_generate_opts defaults;
    if (!o) {
        tlm_generate_opts_defaults(&defaults);
        o = &defaults;
    }
    if (n_prompts <= 0 || n_prompts > s->B)
        return core_err(TLM_ERR_ARG, "generate: %d prompts for a session batch of %d", n_prompts,
                        s->B);
    for (int b = 0; b < n_prompts; b++) {
        if (prompt_lens[b] <= 0 || !prompts[b])
            return core_err(TLM_ERR_ARG, "generate: prompt %d is empty (start from BOS)", b);
        if (prompt_lens[b] > s->cap)
            return core_err(TLM_ERR_RANGE,
                            "generate: prompt %d has %d tokens, more than the context of %d", b,
                            prompt_lens[b], s->cap);
    }
    int B = s->B;
    size_t V = (size_t)s->m->c.vocab_size;
    tlm_generate_stats st = {0};
    tlm_sampler **samp = calloc((size_t)B, sizeof *samp);
    float *logits = malloc((size_t)B * V * sizeof(float));
    int32_t *next = calloc((size_t)B, sizeof *next);
    int *count = calloc((size_t)B, sizeof *count);
    uint8_t *active = calloc((size_t)B, 1);
    tlm_stop_reason *why = calloc((size_t)B, sizeof *why);
    tlm_grammar_state **gs = o->grammar ? calloc((size_t)B, sizeof *gs) : NULL;
    tlm_status err = TLM_OK;
    if (o->grammar && !o->grammar_vocab) {
        err = core_err(TLM_ERR_ARG, "generate: a grammar needs its vocabulary (grammar_vocab)");
        goto done;
    }
    if (!samp || !logits || !next || !count || !active || !why || (o->grammar && !gs)) {
        err = core_err(TLM_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int b = 0; b < n_prompts && !err; b++) {
        tlm_sampler_opts so = o->sampling;
        so.stream += (uint64_t)b;
        err = tlm_sampler_new(&so, (int)V, &samp[b]);
        for (int i = 0; !err && i < prompt_lens[b]; i++) tlm_sampler_accept(samp[b], prompts[b][i]);
        if (!err && gs) err = tlm_grammar_state_new(o->grammar, o->grammar_vocab, &gs[b]);
    }
    if (err) goto done;

    tlm_session_reset(s, -1);
    double t0 = now_s();
    for (int b = 0; b < n_prompts; b++) {
        err = tlm_session_prefill(s, b, prompts[b], prompt_lens[b], logits + (size_t)b * V, 0);
        if (err) goto done;
        st.prompt_tokens += prompt_lens[b];
        if (o->max_new_tokens == 0)
            why[b] = TLM_STOP_LENGTH;
        else if (prompt_lens[b] >= s->cap)
            why[b] = TLM_STOP_CONTEXT;
        else
            active[b] = 1;
    }
    double t1 = now_s();
    st.prefill_seconds = t1 - t0;
    for (;;) {
        int any = 0;
        for (int b = 0; b < n_prompts; b++) {
            if (!active[b]) continue;
            if (gs) {
                /* masked before any sampler sees the logits: every sampler works over the ids the
                 * grammar allows */
                int n_ok = 0;
                err = tlm_grammar_state_mask(gs[b], logits + (size_t)b * V, (int)V, &n_ok);
                if (err) goto done;
                if (!n_ok) {
                    if (!tlm_grammar_state_complete(gs[b])) {
                        err = core_err(TLM_ERR_RANGE,
                                       "generate: no token of the vocabulary can continue the "
                                       "grammar (sequence %d)",
                                       b);
                        goto done;
                    }
                    why[b] = TLM_STOP_GRAMMAR;
                    active[b] = 0;
                    continue;
                }
            }
            err = tlm_sampler_sample(samp[b], logits + (size_t)b * V, &next[b]);
            if (err) goto done;
            if (gs && (err = tlm_grammar_state_accept(gs[b], next[b])) != TLM_OK) goto done;
            tlm_sampler_accept(samp[b], next[b]);
            count[b]++;
            st.new_tokens++;
            int total = prompt_lens[b] + count[b];
            if (o->on_token && o->on_token(o->user, b, next[b]))
                why[b] = TLM_STOP_CALLBACK;
            else if (o->eos_id >= 0 && next[b] == o->eos_id)
                why[b] = TLM_STOP_EOS;
            else if (o->max_new_tokens > 0 && count[b] >= o->max_new_tokens)
                why[b] = TLM_STOP_LENGTH;
            else if (total >= s->cap)
                /* The last id is not fed back: its logits would need a position past the end. */
                why[b] = TLM_STOP_CONTEXT;
            if (why[b])
                active[b] = 0;
            else
                any = 1;
        }
        if (!any) break;
        err = tlm_session_decode(s, next, active, logits);
        if (err) goto done;
        st.decode_steps++;
    }
    st.decode_seconds = now_s() - t1;
done:
    if (stops)
        for (int b = 0; b < n_prompts; b++) stops[b] = why ? why[b] : TLM_STOP_NONE;
    if (stats) *stats = st;
    if (samp)
        for (int b = 0; b < B; b++) tlm_sampler_free(samp[b]);
    free(samp);
    if (gs)
        for (int b = 0; b < B; b++) tlm_grammar_state_free(gs[b]);
    free(gs);
    free(logits);
    free(next);
    free(count);
    free(active);
    free(why);
    return err;
}
