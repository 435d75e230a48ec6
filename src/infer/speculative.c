/* Speculative decoding of one sequence: a proposer (a draft model or n-gram lookup) guesses the
 * next ids, the target scores [last id, guesses...] in one batched pass, and the longest prefix it
 * agrees with is kept together with one id of the target's own. Greedy agreement is the target's
 * argmax; sampling keeps the target's distribution exactly by the rejection rule of Leviathan et
 * al. and Chen et al. (2023). Both caches are cut back to what was kept; the draft is given the
 * ids it missed at its next proposal. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "infer/infer.h"

/* Plain steps between one-id probes of a proposer that keeps missing: the gap doubles with each
 * failed probe, so the probes' cost falls to a fraction of a percent of decoding. */
#define GAP_MIN 8
#define GAP_MAX 256
#define START_LEN 4
/* Bounds on the options, far past any useful value, so that buffers stay small. */
#define DRAFT_MAX_LIMIT 256
#define NGRAM_LIMIT 64

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void tlm_spec_opts_defaults(tlm_spec_opts *o) {
    *o = (tlm_spec_opts){.draft_max = 16,
                         .draft_min = 0,
                         .draft_p_min = 0.75f,
                         .lookup_ngram_min = 1,
                         .lookup_ngram_max = 4,
                         .adaptive = 1};
}

typedef struct {
    tlm_session *t, *d;
    const tlm_generate_opts *o;
    tlm_spec_opts sp;
    int V, cap, greedy;
    int32_t *toks; /* [cap] the prompt, then every id emitted */
    int n;         /* ids in toks; the last is not yet in the target's cache */
    int count;     /* ids emitted */
    float *tl;     /* [draft_max + 1, V] the target's logits of one pass */
    float *dl;     /* [V] the draft's logits */
    float *q;      /* [draft_max, V] the distributions the draft drew from (sampling) */
    float *p, *r;  /* [V] the target's distribution and the residual max(0, p - q) */
    int32_t *prop; /* [draft_max] the proposal */
    /* samp: the sequence's sampler (the ids emitted in its penalty window, its stream the one
     * every verification draw comes from); vsamp: scratch for the target's rows, its window
     * extended by the proposed ids; dsamp: the draft's own sampler and stream. */
    tlm_sampler *samp, *vsamp, *dsamp;
    int d_len; /* positions of the draft's cache that hold toks[0..d_len) */
    tlm_stop_reason why;
    tlm_generate_stats st;
} spec;

/* Draws an id with probability w[id] / sum(w) from s's stream; -1 when w is all zero. */
static int32_t draw(tlm_sampler *s, const float *w, int V) {
    double total = 0.0;
    for (int v = 0; v < V; v++) total += w[v];
    if (!(total > 0.0)) return -1;
    double u = infer_sampler_uniform(s) * total, acc = 0.0;
    int32_t last = -1;
    for (int v = 0; v < V; v++) {
        if (!(w[v] > 0.0f)) continue;
        acc += w[v];
        last = v;
        if (u < acc) return v;
    }
    return last; /* u in the rounding slack at the top */
}

/* The continuation of the latest earlier occurrence of the last g ids (g from gmax down to gmin)
 * of t[0..n): at most kmax ids into out; 0 when nothing matches. A continuation that reaches the
 * end of t goes on through the ids it has just proposed (as an LZ77 copy may overlap itself), so
 * that text repeating with a short period yields a long proposal. */
int tlm_spec_lookup(const int32_t *t, int n, int gmin, int gmax, int kmax, int32_t *out) {
    if (!t || !out || gmin < 1) return 0;
    for (int g = gmax; g >= gmin; g--) {
        if (g >= n) continue;
        const int32_t *tail = t + n - g;
        for (int j = n - g - 1; j >= 0; j--) {
            if (t[j] != tail[0] || memcmp(t + j, tail, (size_t)g * sizeof *t)) continue;
            int k = 0;
            for (int i = j + g; k < kmax; i++) out[k++] = i < n ? t[i] : out[i - n];
            return k;
        }
    }
    return 0;
}

/* The probability of id under a softmax of logits at temperature 1: the draft's confidence. */
static float softmax_at(const float *l, int V, int32_t id) {
    float mx = l[0];
    for (int v = 1; v < V; v++) mx = l[v] > mx ? l[v] : mx;
    double z = 0.0;
    for (int v = 0; v < V; v++) z += exp((double)l[v] - mx);
    return (float)(exp((double)l[id] - mx) / z);
}

/* Up to kmax ids from the draft model into prop (*k of them). The draft first takes the ids it
 * has not seen, in one batched pass; its cache then runs ahead by the proposal, to be cut back
 * to what the target accepts. */
static tlm_status draft_propose(spec *s, int kmax, int *k) {
    *k = 0;
    /* The draft holds n - 1 + kmax positions before its last proposal. */
    int room = tlm_session_capacity(s->d) - s->n + 1;
    if (kmax > room) kmax = room;
    if (kmax <= 0) return TLM_OK;
    tlm_status err = tlm_session_truncate(s->d, 0, s->d_len);
    if (!err) err = tlm_session_prefill(s->d, 0, s->toks + s->d_len, s->n - s->d_len, s->dl, 0);
    if (err) return err;
    s->d_len = s->n;
    infer_sampler_copy_window(s->dsamp, s->samp);
    for (int i = 0; i < kmax; i++) {
        if (i > 0 && (err = tlm_session_decode_one(s->d, s->prop[i - 1], s->dl)) != TLM_OK)
            return err;
        int32_t id;
        float conf;
        if (s->greedy) {
            if ((err = tlm_sampler_sample(s->dsamp, s->dl, &id)) != TLM_OK) return err;
            conf = softmax_at(s->dl, s->V, id);
        } else {
            float *q = s->q + (size_t)i * s->V;
            if ((err = tlm_sampler_probs(s->dsamp, s->dl, q)) != TLM_OK) return err;
            id = draw(s->dsamp, q, s->V);
            if (id < 0) return core_err(TLM_ERR_NUMERIC, "speculative: the draft's q is empty");
            conf = q[id];
        }
        if (conf < s->sp.draft_p_min) break;
        if (!s->greedy && s->sp.draft_p_min > 0.0f) {
            /* An id is proposed only where q gives it at least p_min, so what the draft proposes
             * follows q cut to those ids and renormalized: the q the rejection rule must use. */
            float *q = s->q + (size_t)i * s->V;
            double kept = 0.0;
            for (int v = 0; v < s->V; v++) {
                if (q[v] < s->sp.draft_p_min) q[v] = 0.0f;
                kept += q[v];
            }
            for (int v = 0; v < s->V; v++) q[v] = (float)(q[v] / kept);
        }
        s->prop[i] = id;
        tlm_sampler_accept(s->dsamp, id);
        *k = i + 1;
    }
    return TLM_OK;
}

/* One pass of the target over [toks[n-1], prop[0..k)]; out receives the ids to emit (the *a
 * proposed ids accepted, then the target's own): *a + 1 of them. */
static tlm_status verify(spec *s, int k, int32_t *out, int *a) {
    size_t V = (size_t)s->V;
    int32_t *batch = out; /* out has room for k + 1 ids and is filled only after the pass */
    batch[0] = s->toks[s->n - 1];
    memcpy(batch + 1, s->prop, (size_t)k * sizeof *batch);
    tlm_status err = k == 0 ? tlm_session_decode_one(s->t, batch[0], s->tl)
                            : tlm_session_prefill(s->t, 0, batch, k + 1, s->tl, 1);
    if (err) return err;
    infer_sampler_copy_window(s->vsamp, s->samp);
    int lookup_q = s->d == NULL; /* lookup proposes with certainty: q is 1 at its id */
    for (int i = 0;; i++) {      /* row k accepts nothing, so the loop ends there at the latest */
        const float *row = s->tl + (size_t)i * V;
        int32_t id;
        if (s->greedy) {
            if ((err = tlm_sampler_sample(s->vsamp, row, &id)) != TLM_OK) return err;
            if (i < k && id == s->prop[i]) {
                tlm_sampler_accept(s->vsamp, id);
                out[i] = id;
                continue;
            }
        } else {
            if ((err = tlm_sampler_probs(s->vsamp, row, s->p)) != TLM_OK) return err;
            if (i < k) {
                int32_t d = s->prop[i];
                const float *q = lookup_q ? NULL : s->q + (size_t)i * V;
                double pd = s->p[d], qd = q ? q[d] : 1.0;
                /* min(1, p/q) without a draw where the answer is certain */
                if (pd >= qd || (pd > 0.0 && infer_sampler_uniform(s->samp) * qd < pd)) {
                    tlm_sampler_accept(s->vsamp, d);
                    out[i] = d;
                    continue;
                }
                for (size_t v = 0; v < V; v++) {
                    float qv = q ? q[v] : (int32_t)v == d ? 1.0f : 0.0f;
                    s->r[v] = s->p[v] > qv ? s->p[v] - qv : 0.0f;
                }
                id = draw(s->samp, s->r, s->V);
                /* p <= q everywhere only by rounding (p(d) < q(d) puts mass above q elsewhere) */
                if (id < 0) id = draw(s->samp, s->p, s->V);
            } else {
                id = draw(s->samp, s->p, s->V);
            }
            if (id < 0) return core_err(TLM_ERR_NUMERIC, "speculative: the target's p is empty");
        }
        out[i] = id;
        *a = i;
        return TLM_OK;
    }
}

/* Appends an emitted id and stops where tlm_session_generate would. */
static void emit(spec *s, int32_t id) {
    const tlm_generate_opts *o = s->o;
    s->toks[s->n++] = id;
    tlm_sampler_accept(s->samp, id);
    s->count++;
    s->st.new_tokens++;
    if (o->on_token && o->on_token(o->user, 0, id))
        s->why = TLM_STOP_CALLBACK;
    else if (o->eos_id >= 0 && id == o->eos_id)
        s->why = TLM_STOP_EOS;
    else if (o->max_new_tokens > 0 && s->count >= o->max_new_tokens)
        s->why = TLM_STOP_LENGTH;
    else if (s->n >= s->cap)
        s->why = TLM_STOP_CONTEXT;
}

static tlm_status check_opts(const tlm_spec_opts *sp) {
    if (sp->draft_max < 0 || sp->draft_max > DRAFT_MAX_LIMIT)
        return core_err(TLM_ERR_ARG, "speculative: draft_max %d must be in [0, %d]", sp->draft_max,
                        DRAFT_MAX_LIMIT);
    if (sp->draft_min < 0 || sp->draft_min > sp->draft_max)
        return core_err(TLM_ERR_ARG, "speculative: draft_min %d must be in [0, draft_max %d]",
                        sp->draft_min, sp->draft_max);
    if (!(sp->draft_p_min >= 0.0f && sp->draft_p_min <= 1.0f))
        return core_err(TLM_ERR_ARG, "speculative: draft_p_min %g must be in [0, 1]",
                        (double)sp->draft_p_min);
    if (sp->lookup && (sp->lookup_ngram_min < 1 || sp->lookup_ngram_max < sp->lookup_ngram_min ||
                       sp->lookup_ngram_max > NGRAM_LIMIT))
        return core_err(TLM_ERR_ARG,
                        "speculative: lookup n-grams from %d to %d: want 1 <= min <= max <= %d",
                        sp->lookup_ngram_min, sp->lookup_ngram_max, NGRAM_LIMIT);
    return TLM_OK;
}

tlm_status tlm_session_generate_spec(tlm_session *target, tlm_session *draft, const int32_t *prompt,
                                     int prompt_len, const tlm_generate_opts *o,
                                     const tlm_spec_opts *spec_o, tlm_stop_reason *stop,
                                     tlm_generate_stats *stats) {
    CORE_FP_FLUSH_SCOPE();
    if (stop) *stop = TLM_STOP_NONE;
    if (stats) *stats = (tlm_generate_stats){0};
    if (!target || !prompt) return core_err(TLM_ERR_ARG, "speculative: NULL target or prompt");
    tlm_generate_opts go;
    if (!o) {
        tlm_generate_opts_defaults(&go);
        o = &go;
    }
    spec s = {.t = target, .d = draft, .o = o, .why = TLM_STOP_NONE};
    if (spec_o)
        s.sp = *spec_o;
    else
        tlm_spec_opts_defaults(&s.sp);
    tlm_status err = check_opts(&s.sp);
    if (err) return err;
    if (draft == target)
        return core_err(TLM_ERR_ARG, "speculative: the draft must be a session of its own, not "
                                     "the target's");
    if (!draft && !s.sp.lookup)
        return core_err(TLM_ERR_ARG, "speculative: nothing proposes ids: give a draft session "
                                     "or set lookup");
    if (draft && s.sp.lookup)
        return core_err(TLM_ERR_ARG, "speculative: give a draft session or lookup, not both");
    s.V = target->m->c.vocab_size;
    if (draft && draft->m->c.vocab_size != s.V)
        return core_err(TLM_ERR_ARG,
                        "speculative: the draft model's vocabulary has %d ids, the target's %d "
                        "(they must share one)",
                        draft->m->c.vocab_size, s.V);
    if (o->grammar)
        return core_err(TLM_ERR_UNSUPPORTED,
                        "speculative: a grammar is not supported with speculative decoding "
                        "(generate without a draft or lookup)");
    s.cap = target->cap;
    if (prompt_len <= 0)
        return core_err(TLM_ERR_ARG, "speculative: the prompt is empty (start from BOS)");
    if (prompt_len > s.cap)
        return core_err(TLM_ERR_RANGE,
                        "speculative: the prompt has %d tokens, more than the context of %d",
                        prompt_len, s.cap);
    s.greedy = o->sampling.temperature == 0.0f;
    int kbuf = s.sp.draft_max;
    size_t V = (size_t)s.V;
    s.toks = malloc((size_t)s.cap * sizeof *s.toks);
    s.tl = malloc((size_t)(kbuf + 1) * V * sizeof *s.tl);
    s.dl = malloc(V * sizeof *s.dl);
    s.q = draft && !s.greedy ? malloc((size_t)(kbuf ? kbuf : 1) * V * sizeof *s.q) : NULL;
    s.p = malloc(V * sizeof *s.p);
    s.r = malloc(V * sizeof *s.r);
    s.prop = malloc((size_t)(kbuf + 1) * sizeof *s.prop);
    int32_t *out = malloc((size_t)(kbuf + 1) * sizeof *out);
    if (!s.toks || !s.tl || !s.dl || (draft && !s.greedy && !s.q) || !s.p || !s.r || !s.prop ||
        !out) {
        err = core_err(TLM_ERR_NOMEM, "out of memory");
        goto done;
    }
    err = tlm_sampler_new(&o->sampling, s.V, &s.samp);
    if (!err) err = tlm_sampler_new(&o->sampling, s.V, &s.vsamp);
    if (!err && draft) {
        tlm_sampler_opts dso = o->sampling;
        dso.stream ^= 0x9e3779b97f4a7c15ull; /* the draft's draws apart from the target's */
        err = tlm_sampler_new(&dso, s.V, &s.dsamp);
    }
    if (err) goto done;
    for (int i = 0; i < prompt_len; i++) tlm_sampler_accept(s.samp, prompt[i]);
    memcpy(s.toks, prompt, (size_t)prompt_len * sizeof *s.toks);
    s.n = prompt_len;

    tlm_session_reset(target, 0);
    if (draft) tlm_session_reset(draft, 0);
    double t0 = now_s();
    if ((err = tlm_session_prefill(target, 0, prompt, prompt_len, s.tl, 0)) != TLM_OK) goto done;
    if (draft && prompt_len <= tlm_session_capacity(draft)) {
        if ((err = tlm_session_prefill(draft, 0, prompt, prompt_len, NULL, 0)) != TLM_OK) goto done;
        s.d_len = prompt_len;
    }
    s.st.prompt_tokens = prompt_len;
    double t1 = now_s();
    s.st.prefill_seconds = t1 - t0;
    if (o->max_new_tokens == 0) {
        s.why = TLM_STOP_LENGTH;
        goto done;
    }
    if (prompt_len >= s.cap) {
        s.why = TLM_STOP_CONTEXT;
        goto done;
    }
    int32_t first;
    if ((err = tlm_sampler_sample(s.samp, s.tl, &first)) != TLM_OK) goto done;
    emit(&s, first);

    /* The adaptive length: k_cur ids a round, starting short (a poor draft then costs little, a
     * good one reaches draft_max after two doublings); `pause`: rounds without a proposal left
     * before a probe. */
    int k_cur = START_LEN > s.sp.draft_min ? START_LEN : s.sp.draft_min;
    int pause = 0, gap = GAP_MIN, misses = 0, probing = 0;
    while (!s.why) {
        if (k_cur > s.sp.draft_max) k_cur = s.sp.draft_max;
        int kmax = s.sp.adaptive ? (pause > 0 ? 0 : k_cur) : s.sp.draft_max;
        if (o->max_new_tokens > 0 && kmax > o->max_new_tokens - s.count - 1)
            kmax = o->max_new_tokens - s.count - 1; /* ids past the limit would be thrown away */
        if (kmax > s.cap - s.n) kmax = s.cap - s.n; /* the target holds n + k positions */
        int k = 0;
        if (kmax > 0) {
            if (draft)
                err = draft_propose(&s, kmax, &k);
            else
                k = tlm_spec_lookup(s.toks, s.n, s.sp.lookup_ngram_min, s.sp.lookup_ngram_max, kmax,
                                    s.prop);
            if (err) goto done;
            if (k < s.sp.draft_min) k = 0; /* too short to be worth the pass (llama.cpp's rule) */
        }
        int a = 0;
        if ((err = verify(&s, k, out, &a)) != TLM_OK) goto done;
        s.st.decode_steps++;
        s.st.drafted += k;
        s.st.accepted += a;
        /* Both caches keep the ids before the target's own: toks[0..n) and the accepted ones. */
        int keep = s.n + a;
        if ((err = tlm_session_truncate(target, 0, keep)) != TLM_OK) goto done;
        if (draft) {
            /* what it holds of toks and the proposal, up to the last accepted id */
            int held = tlm_session_length(draft, 0);
            s.d_len = held < keep ? held : keep;
            if ((err = tlm_session_truncate(draft, 0, s.d_len)) != TLM_OK) goto done;
        }
        for (int i = 0; i <= a && !s.why; i++) emit(&s, out[i]);

        if (!s.sp.adaptive) continue;
        if (pause > 0) {
            if (--pause == 0) {
                k_cur = s.sp.draft_min > 1 ? s.sp.draft_min : 1;
                probing = 1;
            }
            continue;
        }
        /* A draft model that proposes nothing still paid a step for it; a lookup without a
         * match paid nothing. */
        int missed = k > 0 ? a == 0 : draft != NULL && kmax > 0;
        if (!missed) {
            misses = 0;
            probing = 0;
            gap = GAP_MIN;
            if (k > 0 && a == k && k >= k_cur)
                k_cur = k_cur * 2 < s.sp.draft_max ? k_cur * 2 : s.sp.draft_max;
            else if (k > 0 && a < k)
                k_cur = a + 1 > s.sp.draft_min ? a + 1 : s.sp.draft_min;
            if (k_cur < 1) k_cur = 1;
            continue;
        }
        misses++;
        if (s.sp.draft_min == 0 && (probing || misses >= 2)) {
            pause = gap;
            gap = gap * 2 < GAP_MAX ? gap * 2 : GAP_MAX;
            misses = 0;
            probing = 0;
        } else if (k > 0) {
            k_cur = s.sp.draft_min > 1 ? s.sp.draft_min : 1;
        }
    }
    s.st.decode_seconds = now_s() - t1;
done:
    if (stop) *stop = s.why;
    if (stats) *stats = s.st;
    tlm_sampler_free(s.samp);
    tlm_sampler_free(s.vsamp);
    tlm_sampler_free(s.dsamp);
    free(s.toks);
    free(s.tl);
    free(s.dl);
    free(s.q);
    free(s.p);
    free(s.r);
    free(s.prop);
    free(out);
    return err;
}
