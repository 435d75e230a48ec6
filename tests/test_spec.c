/* Speculative decoding: greedy ids equal tlm_session_generate's over many prompts (a draft model
 * that rarely agrees, the target itself as its draft, n-gram lookup, every option shape, penalties,
 * and each stop), sampled ids follow the target's distribution (chi-square tests of the second and
 * third ids against their exact marginals, each checked to have the power to catch a rule that
 * accepts every proposal), tlm_sampler_probs against tlm_sampler_sample's draws, and bad inputs
 * refused by name. */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "harness.h"
#include "tlm.h"

static tlm_model *model(const char *json, uint64_t seed) {
    tlm_config c;
    if (tlm_config_from_json(json, &c)) {
        CHECK(0, "config: %s", tlm_last_error());
        return NULL;
    }
    return t_model(&c, seed, TLM_INIT_XAVIER);
}

static void random_ids(int32_t *ids, int n, int V, core_rng *r) {
    for (int i = 0; i < n; i++) ids[i] = (int32_t)core_rng_below(r, (uint32_t)V);
}

#define MAX_IDS 512

typedef struct {
    int32_t ids[MAX_IDS];
    int n;
    int stop_at; /* > 0: the callback stops after this many ids */
} sink;

static int take(void *user, int seq, int32_t id) {
    sink *k = user;
    (void)seq;
    if (k->n < MAX_IDS) k->ids[k->n] = id;
    k->n++;
    return k->stop_at > 0 && k->n >= k->stop_at;
}

/* Plain and speculative generation of one prompt: 1 when they give the same ids and stop reason.
 * st (may be NULL) receives the speculative run's stats. */
static int same_as_plain(tlm_session *t, tlm_session *d, const int32_t *prompt, int n,
                         const tlm_generate_opts *base, const tlm_spec_opts *sp,
                         tlm_generate_stats *st, const char *what) {
    sink a = {.stop_at = 0}, b = {.stop_at = 0};
    tlm_generate_opts o = *base;
    sink *stop_src = base->user;
    a.stop_at = b.stop_at = stop_src ? stop_src->stop_at : 0;
    o.on_token = take;
    o.user = &a;
    tlm_stop_reason ra = TLM_STOP_NONE, rb = TLM_STOP_NONE;
    tlm_status e1 = tlm_session_generate(t, &prompt, &n, 1, &o, &ra, NULL);
    CHECK(e1 == TLM_OK, "%s: plain: %s", what, tlm_last_error());
    o.user = &b;
    tlm_generate_stats s = {0};
    tlm_status e2 = tlm_session_generate_spec(t, d, prompt, n, &o, sp, &rb, &s);
    CHECK(e2 == TLM_OK, "%s: speculative: %s", what, tlm_last_error());
    if (st) *st = s;
    if (e1 || e2) return 0;
    int same = a.n == b.n && ra == rb && s.new_tokens == b.n &&
               !memcmp(a.ids, b.ids, sizeof(int32_t) * (size_t)(a.n < MAX_IDS ? a.n : MAX_IDS));
    if (!same) {
        int at = 0;
        while (at < a.n && at < b.n && a.ids[at] == b.ids[at]) at++;
        CHECK(0, "%s: plain %d ids (stop %d), speculative %d (stop %d), first difference at %d",
              what, a.n, (int)ra, b.n, (int)rb, at);
    }
    CHECK(s.accepted >= 0 && s.accepted <= s.drafted, "%s: accepted %d of %d", what, s.accepted,
          s.drafted);
    return same;
}

/* ---- greedy: the ids of plain decoding ---- */

static const char *TARGET = "{\"vocab_size\":64,\"context_length\":128,\"d_model\":32,"
                            "\"n_layers\":2,\"n_heads\":4,\"n_kv_heads\":2}";
/* untied: a random tied model leans to repeating the last id, and so would agree with the target */
static const char *DRAFT = "{\"vocab_size\":64,\"context_length\":128,\"d_model\":16,"
                           "\"n_layers\":1,\"n_heads\":2,\"tie_embeddings\":false}";

/* Prompt i of the set: random ids, or (odd i) a random run repeated, which lookup feeds on. */
static int make_prompt(int i, int32_t *p, int V) {
    core_rng r;
    core_rng_seed(&r, 100 + (uint64_t)i, 3);
    int n = 1 + (int)core_rng_below(&r, 24);
    if (i % 2 == 0) {
        random_ids(p, n, V, &r);
        return n;
    }
    int run = 2 + (int)core_rng_below(&r, 6), reps = 2 + (int)core_rng_below(&r, 3);
    random_ids(p, run, V, &r);
    for (int k = run; k < run * reps; k++) p[k] = p[k - run];
    return run * reps;
}

#define N_PROMPTS 30

static void test_greedy(void) {
    tlm_model *mt = model(TARGET, 11), *md = model(DRAFT, 12);
    if (!mt || !md) goto out_models;
    int V = tlm_model_config(mt)->vocab_size;
    tlm_session *t = NULL, *self = NULL, *d = NULL, *dsmall = NULL;
    CHECK_OK(tlm_session_new(mt, NULL, &t));
    CHECK_OK(tlm_session_new(mt, NULL, &self));
    CHECK_OK(tlm_session_new(md, NULL, &d));
    /* a draft with less room than the target: it stops proposing where it is full */
    CHECK_OK(tlm_session_new(md, &(tlm_session_opts){.batch = 1, .capacity = 40}, &dsmall));
    if (!t || !self || !d || !dsmall) goto out;

    tlm_generate_opts o;
    tlm_generate_opts_defaults(&o);
    o.max_new_tokens = 48;
    o.sampling = (tlm_sampler_opts){.temperature = 0.0f, .top_p = 1.0f};
    tlm_spec_opts def;
    tlm_spec_opts_defaults(&def);
    CHECK(def.draft_max == 16 && def.draft_min == 0 && def.draft_p_min == 0.75f && !def.lookup &&
              def.lookup_ngram_min == 1 && def.lookup_ngram_max == 4 && def.adaptive,
          "defaults");

    struct {
        const char *name;
        tlm_session *draft;
        tlm_spec_opts sp;
    } cases[] = {
        {"random draft, defaults", d, def},
        {"random draft, p_min 0", d, def},
        {"random draft, p_min 0, fixed length 5", d, def},
        {"random draft, p_min 0, draft_min 3", d, def},
        {"random draft, p_min 0, draft_max 1", d, def},
        {"random draft, draft_max 0", d, def},
        {"small draft cache, p_min 0", dsmall, def},
        {"target as draft, p_min 0", self, def},
        {"target as draft, fixed 16", self, def},
        {"lookup", NULL, def},
        {"lookup, n-grams 2..3, fixed 8", NULL, def},
        {"lookup, draft_min 2", NULL, def},
    };
    cases[1].sp.draft_p_min = 0;
    cases[2].sp.draft_p_min = 0, cases[2].sp.draft_max = 5, cases[2].sp.adaptive = 0;
    cases[3].sp.draft_p_min = 0, cases[3].sp.draft_min = 3;
    cases[4].sp.draft_p_min = 0, cases[4].sp.draft_max = 1;
    cases[5].sp.draft_max = 0;
    cases[6].sp.draft_p_min = 0;
    cases[7].sp.draft_p_min = 0;
    cases[8].sp.draft_p_min = 0, cases[8].sp.adaptive = 0;
    cases[9].sp.lookup = 1;
    cases[10].sp.lookup = 1, cases[10].sp.lookup_ngram_min = 2, cases[10].sp.lookup_ngram_max = 3;
    cases[10].sp.draft_max = 8, cases[10].sp.adaptive = 0;
    cases[11].sp.lookup = 1, cases[11].sp.draft_min = 2;

    int n_cases = (int)(sizeof cases / sizeof cases[0]);
    for (int c = 0; c < n_cases; c++) {
        int ok = 0, drafted = 0, accepted = 0, steps = 0, made = 0;
        for (int i = 0; i < N_PROMPTS; i++) {
            int32_t p[128];
            int n = make_prompt(i, p, V);
            tlm_generate_stats st;
            char what[160];
            snprintf(what, sizeof what, "%s, prompt %d", cases[c].name, i);
            ok += same_as_plain(t, cases[c].draft, p, n, &o, &cases[c].sp, &st, what);
            drafted += st.drafted;
            accepted += st.accepted;
            steps += st.decode_steps;
            made += st.new_tokens;
        }
        printf("%-40s %2d/%d prompts the same; %5d drafted, %5d accepted; %4d passes for %4d ids\n",
               cases[c].name, ok, N_PROMPTS, drafted, accepted, steps, made);
        CHECK(ok == N_PROMPTS, "%s: %d of %d prompts the same", cases[c].name, ok, N_PROMPTS);
        if (cases[c].sp.draft_max == 0) CHECK(drafted == 0, "draft_max 0 drafted %d", drafted);
        if (cases[c].draft == self)
            /* the target agrees with itself: every proposal kept, several ids per pass */
            CHECK(accepted == drafted && drafted > made / 2 && steps * 3 < made,
                  "%s: %d of %d accepted, %d passes for %d ids", cases[c].name, accepted, drafted,
                  steps, made);
        if (cases[c].sp.lookup)
            CHECK(accepted > 0 && steps < made, "%s: lookup accepted %d", cases[c].name, accepted);
        if (c == 1)
            /* a random draft is rarely right; the adaptive length keeps what it costs small */
            CHECK(drafted > 0 && accepted * 2 < drafted && drafted < made / 2,
                  "poor draft: %d drafted, %d accepted for %d ids", drafted, accepted, made);
        if (c == 2)
            CHECK(drafted > made, "fixed length drafts every step: %d for %d ids", drafted, made);
    }

    /* Penalties at temperature 0: the target's argmax over the penalized logits, with the
     * proposal in the window as plain decoding would have it. */
    tlm_generate_opts op = o;
    op.sampling.repeat_penalty = 1.5f;
    op.sampling.presence_penalty = 0.3f;
    op.sampling.frequency_penalty = 0.2f;
    op.sampling.penalty_last_n = 6;
    tlm_spec_opts s0 = def;
    s0.draft_p_min = 0;
    tlm_spec_opts lk = def;
    lk.lookup = 1;
    for (int i = 0; i < 10; i++) {
        int32_t p[128];
        int n = make_prompt(i, p, V);
        same_as_plain(t, self, p, n, &op, &s0, NULL, "penalties, target as draft");
        same_as_plain(t, d, p, n, &op, &s0, NULL, "penalties, random draft");
        same_as_plain(t, NULL, p, n, &op, &lk, NULL, "penalties, lookup");
    }

    /* Stops: every limit and EOS where plain decoding stops. */
    int32_t p[128];
    int n = make_prompt(3, p, V);
    sink ref = {.stop_at = 0};
    tlm_generate_opts oc = o;
    oc.on_token = take;
    oc.user = &ref;
    CHECK_OK(tlm_session_generate(t, &(const int32_t *){p}, &n, 1, &oc, NULL, NULL));
    for (int e = 0; e < 6 && e < ref.n; e++) {
        tlm_generate_opts oe = o;
        oe.eos_id = ref.ids[e * 5 % ref.n];
        tlm_generate_stats st;
        same_as_plain(t, self, p, n, &oe, &s0, &st, "eos, target as draft");
        same_as_plain(t, NULL, p, n, &oe, &lk, NULL, "eos, lookup");
        same_as_plain(t, d, p, n, &oe, &s0, NULL, "eos, random draft");
    }
    for (int m = 1; m <= 9; m++) {
        tlm_generate_opts om = o;
        om.max_new_tokens = m;
        same_as_plain(t, self, p, n, &om, &s0, NULL, "max_new_tokens, target as draft");
        same_as_plain(t, NULL, p, n, &om, &lk, NULL, "max_new_tokens, lookup");
    }
    tlm_generate_opts oz = o;
    oz.max_new_tokens = 0;
    same_as_plain(t, self, p, n, &oz, &s0, NULL, "max_new_tokens 0");
    sink stopper = {.stop_at = 7};
    tlm_generate_opts os = o;
    os.user = &stopper; /* same_as_plain reads stop_at from it */
    same_as_plain(t, self, p, n, &os, &s0, NULL, "callback stop, target as draft");
    same_as_plain(t, NULL, p, n, &os, &lk, NULL, "callback stop, lookup");
    /* capacity: the context fills before max_new_tokens, plain and speculative at the same id */
    tlm_session *t30 = NULL;
    CHECK_OK(tlm_session_new(mt, &(tlm_session_opts){.batch = 1, .capacity = 30}, &t30));
    if (t30) {
        tlm_generate_opts ou = o;
        ou.max_new_tokens = -1;
        for (int i = 0; i < 8; i++) {
            int32_t q[128];
            int nq = make_prompt(i, q, V);
            tlm_stop_reason why = TLM_STOP_NONE;
            tlm_generate_stats st;
            same_as_plain(t30, self, q, nq, &ou, &s0, &st, "capacity, target as draft");
            same_as_plain(t30, d, q, nq, &ou, &s0, NULL, "capacity, random draft");
            same_as_plain(t30, NULL, q, nq, &ou, &lk, NULL, "capacity, lookup");
            CHECK_OK(tlm_session_generate_spec(t30, NULL, q, nq, &ou, &lk, &why, &st));
            CHECK(why == TLM_STOP_CONTEXT && nq + st.new_tokens == 30, "capacity: stop %d, %d+%d",
                  (int)why, nq, st.new_tokens);
        }
        /* a prompt that fills the cache generates nothing */
        int32_t full[30] = {0};
        tlm_stop_reason why = TLM_STOP_NONE;
        tlm_generate_stats st;
        CHECK_OK(tlm_session_generate_spec(t30, NULL, full, 30, &ou, &lk, &why, &st));
        CHECK(why == TLM_STOP_CONTEXT && st.new_tokens == 0, "full prompt: %d, %d ids", (int)why,
              st.new_tokens);
    }
    tlm_session_free(t30);
out:
    tlm_session_free(t);
    tlm_session_free(self);
    tlm_session_free(d);
    tlm_session_free(dsmall);
out_models:
    tlm_model_free(mt);
    tlm_model_free(md);
}

/* ---- sampling: the target's distribution ---- */

/* Chi-square critical values at significance 0.001 by degrees of freedom 1..9. */
static const double CRIT[] = {0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12, 27.88};

/* Pearson chi-square of counts against p over n cells; *dof receives the cells with p > 0 less
 * one. A count where p is 0 gives infinity. */
static double chi2(const int *count, const double *p, int n, int draws, int *dof) {
    double x = 0;
    int cells = 0;
    *dof = 0;
    for (int i = 0; i < n; i++) {
        if (p[i] == 0) {
            if (count[i]) {
                *dof = cells;
                return INFINITY;
            }
            continue;
        }
        cells++;
        double e = p[i] * draws;
        x += (count[i] - e) * (count[i] - e) / e;
    }
    *dof = cells - 1;
    return x;
}

#define SV 8 /* the vocabulary of the sampling tests */
#define RUNS 8000

/* The sampler's distribution after prompt + path (its penalty window as generation would have it),
 * from the last logits of one prefill. */
static void next_probs(tlm_session *s, const tlm_sampler_opts *so, const int32_t *prompt, int n,
                       const int32_t *path, int k, double *out) {
    int32_t ids[64];
    memcpy(ids, prompt, sizeof(int32_t) * (size_t)n);
    if (k) memcpy(ids + n, path, sizeof(int32_t) * (size_t)k);
    float l[SV], pr[SV];
    tlm_sampler *sm = NULL;
    tlm_session_reset(s, 0);
    CHECK_OK(tlm_session_prefill(s, 0, ids, n + k, l, 0));
    CHECK_OK(tlm_sampler_new(so, SV, &sm));
    for (int i = 0; i < n + k; i++) tlm_sampler_accept(sm, ids[i]);
    CHECK_OK(tlm_sampler_probs(sm, l, pr));
    tlm_sampler_free(sm);
    for (int v = 0; v < SV; v++) out[v] = pr[v];
}

/* The exact marginals of the 2nd and 3rd generated ids under model s's sampler. */
static void marginals(tlm_session *s, const tlm_sampler_opts *so, const int32_t *prompt, int n,
                      double *m2, double *m3) {
    double p1[SV], p2[SV], p3[SV];
    next_probs(s, so, prompt, n, NULL, 0, p1);
    memset(m2, 0, sizeof(double) * SV);
    memset(m3, 0, sizeof(double) * SV);
    for (int a = 0; a < SV; a++) {
        if (p1[a] == 0) continue;
        int32_t path[2] = {a, 0};
        next_probs(s, so, prompt, n, path, 1, p2);
        for (int b = 0; b < SV; b++) {
            m2[b] += p1[a] * p2[b];
            if (p2[b] == 0) continue;
            path[1] = b;
            next_probs(s, so, prompt, n, path, 2, p3);
            for (int c = 0; c < SV; c++) m3[c] += p1[a] * p2[b] * p3[c];
        }
    }
}

/* The statistic a sample of `draws` from q would give against p, in expectation beyond the
 * degrees of freedom: the power of the test against an id drawn from q instead of p. */
static double noncentrality(const double *q, const double *p, int draws) {
    double x = 0;
    for (int i = 0; i < SV; i++)
        if (p[i] > 0)
            x += (q[i] - p[i]) * (q[i] - p[i]) / p[i] * draws;
        else if (q[i] > 0)
            return INFINITY;
    return x;
}

static void sample_case(const char *name, tlm_session *t, tlm_session *d, tlm_session *dref,
                        const tlm_sampler_opts *so, const tlm_spec_opts *sp, const int32_t *prompt,
                        int n) {
    double m2[SV], m3[SV];
    marginals(t, so, prompt, n, m2, m3);
    int c2[SV] = {0}, c3[SV] = {0}, drafted = 0, accepted = 0;
    tlm_generate_opts o;
    tlm_generate_opts_defaults(&o);
    o.max_new_tokens = 4; /* the first pass then checks two proposed ids: the 2nd and 3rd */
    o.sampling = *so;
    o.on_token = take;
    for (int r = 0; r < RUNS; r++) {
        sink k = {.stop_at = 0};
        o.user = &k;
        o.sampling.seed = 5000 + (uint64_t)r;
        tlm_generate_stats st;
        tlm_status e = tlm_session_generate_spec(t, d, prompt, n, &o, sp, NULL, &st);
        if (e || k.n != 4) {
            CHECK(0, "%s: run %d: %s, %d ids", name, r, tlm_last_error(), k.n);
            return;
        }
        c2[k.ids[1]]++;
        c3[k.ids[2]]++;
        drafted += st.drafted;
        accepted += st.accepted;
    }
    int f2, f3;
    double x2 = chi2(c2, m2, SV, RUNS, &f2), x3 = chi2(c3, m3, SV, RUNS, &f3);
    printf("%-44s chi2 %.1f (%d dof), %.1f (%d dof); %d drafted, %d accepted\n", name, x2, f2, x3,
           f3, drafted, accepted);
    CHECK(f2 >= 1 && x2 < CRIT[f2], "%s: 2nd id chi2 %.1f, %d dof", name, x2, f2);
    CHECK(f3 >= 1 && x3 < CRIT[f3], "%s: 3rd id chi2 %.1f, %d dof", name, x3, f3);
    /* the rule was exercised both ways */
    CHECK(accepted > RUNS / 10 && drafted - accepted > RUNS / 10, "%s: %d drafted, %d accepted",
          name, drafted, accepted);
    if (dref) {
        /* Accepting every proposal would give the draft's marginals: the test must see that. */
        double q2[SV], q3[SV];
        marginals(dref, so, prompt, n, q2, q3);
        double lam = noncentrality(q2, m2, RUNS);
        CHECK(lam > 5 * CRIT[f2], "%s: the draft is too close to the target to test (%.1f)", name,
              lam);
        (void)q3;
    }
}

static void test_sampling(void) {
    /* untied: a random tied model puts nearly all its mass on repeating the last id, which
     * leaves nothing to count */
    const char *j = "{\"vocab_size\":8,\"context_length\":32,\"d_model\":16,\"n_layers\":2,"
                    "\"n_heads\":2,\"tie_embeddings\":false}";
    /* seed 36: a draft the target accepts about half the time */
    tlm_model *mt = model(j, 31), *md = model(j, 36);
    tlm_session *t = NULL, *d = NULL, *dref = NULL, *self = NULL;
    if (!mt || !md) goto out;
    CHECK_OK(tlm_session_new(mt, NULL, &t));
    CHECK_OK(tlm_session_new(md, NULL, &d));
    CHECK_OK(tlm_session_new(md, NULL, &dref));
    CHECK_OK(tlm_session_new(mt, NULL, &self));
    if (!t || !d || !dref || !self) goto out;
    tlm_spec_opts sp;
    tlm_spec_opts_defaults(&sp);
    sp.draft_p_min = 0; /* a random draft is never confident: propose regardless */
    sp.draft_max = 3;
    sp.adaptive = 0;
    int32_t prompt[4] = {1, 5, 2, 7};
    tlm_sampler_opts full = {.temperature = 1.0f, .top_p = 1.0f};
    sample_case("draft, temperature 1", t, d, dref, &full, &sp, prompt, 4);
    /* each filter removes ids on some paths: p and q are the distributions after them */
    tlm_sampler_opts cut = {.temperature = 2.0f, .top_k = 5, .top_p = 0.97f, .min_p = 0.05f};
    sample_case("draft, T 2 top-k 5 top-p 0.97 min-p 0.05", t, d, dref, &cut, &sp, prompt, 4);
    tlm_sampler_opts pen = {.temperature = 1.0f,
                            .top_p = 1.0f,
                            .repeat_penalty = 1.3f,
                            .presence_penalty = 0.5f,
                            .penalty_last_n = 3};
    sample_case("draft, penalties", t, d, dref, &pen, &sp, prompt, 4);
    /* lookup proposes with certainty (q is one id): the same rule with q = 1 there */
    tlm_spec_opts lk = sp;
    lk.lookup = 1;
    int32_t rep[6] = {3, 6, 3, 6, 3, 6};
    sample_case("lookup, temperature 1", t, NULL, NULL, &full, &lk, rep, 6);
    /* the adaptive length and p_min change what is proposed, never the distribution */
    tlm_spec_opts ad;
    tlm_spec_opts_defaults(&ad);
    ad.draft_p_min = 0.2f;
    sample_case("draft, adaptive, p_min 0.2", t, d, NULL, &full, &ad, prompt, 4);
    /* reproducible by seed */
    tlm_generate_opts o;
    tlm_generate_opts_defaults(&o);
    o.max_new_tokens = 12;
    o.sampling = full;
    o.sampling.seed = 77;
    o.on_token = take;
    sink a = {.stop_at = 0}, b = {.stop_at = 0};
    o.user = &a;
    CHECK_OK(tlm_session_generate_spec(t, d, prompt, 4, &o, &sp, NULL, NULL));
    o.user = &b;
    CHECK_OK(tlm_session_generate_spec(t, d, prompt, 4, &o, &sp, NULL, NULL));
    CHECK(a.n == 12 && b.n == 12 && !memcmp(a.ids, b.ids, sizeof(int32_t) * 12),
          "same seed, other ids");
out:
    tlm_session_free(t);
    tlm_session_free(d);
    tlm_session_free(dref);
    tlm_session_free(self);
    tlm_model_free(mt);
    tlm_model_free(md);
}

/* tlm_sampler_probs is the distribution tlm_sampler_sample draws from. */
static void test_sampler_probs(void) {
    const float l[8] = {1.0f, 2.5f, 0.3f, 2.0f, -1.0f, 1.7f, 0.0f, 2.2f};
    tlm_sampler_opts cases[] = {
        {.temperature = 1.0f, .top_p = 1.0f},
        {.temperature = 0.6f, .top_k = 5, .top_p = 0.8f},
        {.temperature = 1.3f, .top_p = 1.0f, .min_p = 0.2f},
        {.temperature = 1.0f, .top_p = 1.0f, .repeat_penalty = 2.0f, .frequency_penalty = 0.5f},
    };
    for (int c = 0; c < 4; c++) {
        tlm_sampler *s = NULL;
        CHECK_OK(tlm_sampler_new(&cases[c], 8, &s));
        if (!s) continue;
        tlm_sampler_accept(s, 1);
        tlm_sampler_accept(s, 1);
        float pr[8];
        CHECK_OK(tlm_sampler_probs(s, l, pr));
        double p[8], sum = 0;
        for (int i = 0; i < 8; i++) sum += p[i] = pr[i];
        CHECK_NEAR(sum, 1.0, 1e-5);
        int count[8] = {0};
        const int draws = 20000;
        for (int i = 0; i < draws; i++) {
            int32_t id = -1;
            CHECK_OK(tlm_sampler_sample(s, l, &id));
            if (id >= 0 && id < 8) count[id]++;
        }
        int dof;
        double x = chi2(count, p, 8, draws, &dof);
        CHECK(dof >= 1 && x < CRIT[dof], "case %d: chi2 %.1f (%d dof)", c, x, dof);
        tlm_sampler_free(s);
    }
    /* greedy: a one at the argmax, ties to the lowest id */
    const float tie[4] = {0.5f, 3.0f, 3.0f, -1.0f};
    tlm_sampler *g = NULL;
    CHECK_OK(tlm_sampler_new(&(tlm_sampler_opts){.temperature = 0.0f, .top_p = 1.0f}, 4, &g));
    float pg[4];
    CHECK_OK(tlm_sampler_probs(g, tie, pg));
    CHECK(pg[0] == 0 && pg[1] == 1 && pg[2] == 0 && pg[3] == 0, "greedy probs %g %g %g %g",
          (double)pg[0], (double)pg[1], (double)pg[2], (double)pg[3]);
    const float bad[4] = {0.5f, NAN, 1.0f, 0.0f};
    CHECK(tlm_sampler_probs(g, bad, pg) == TLM_ERR_NUMERIC, "NaN logits");
    CHECK(tlm_sampler_probs(g, NULL, pg) == TLM_ERR_ARG, "NULL logits");
    tlm_sampler_free(g);
}

/* ---- bad inputs ---- */

static void test_refusals(void) {
    tlm_model *mt = model(TARGET, 11);
    tlm_model *m50 = model("{\"vocab_size\":50,\"context_length\":32,\"d_model\":16,"
                           "\"n_layers\":1,\"n_heads\":2}",
                           3);
    tlm_session *t = NULL, *d50 = NULL, *self = NULL;
    tlm_grammar *g = NULL;
    if (!mt || !m50) goto out;
    CHECK_OK(tlm_session_new(mt, NULL, &t));
    CHECK_OK(tlm_session_new(mt, NULL, &self));
    CHECK_OK(tlm_session_new(m50, NULL, &d50));
    if (!t || !d50 || !self) goto out;
    int32_t p[3] = {1, 2, 3};
    tlm_spec_opts lk;
    tlm_spec_opts_defaults(&lk);
    lk.lookup = 1;
    tlm_spec_opts none;
    tlm_spec_opts_defaults(&none);

    CHECK(tlm_session_generate_spec(NULL, NULL, p, 3, NULL, &lk, NULL, NULL) == TLM_ERR_ARG,
          "NULL target");
    CHECK(tlm_session_generate_spec(t, NULL, NULL, 3, NULL, &lk, NULL, NULL) == TLM_ERR_ARG,
          "NULL prompt");
    CHECK(tlm_session_generate_spec(t, NULL, p, 0, NULL, &lk, NULL, NULL) == TLM_ERR_ARG,
          "empty prompt");
    CHECK_ERROR_HAS("empty");
    int32_t longp[129] = {0};
    CHECK(tlm_session_generate_spec(t, NULL, longp, 129, NULL, &lk, NULL, NULL) == TLM_ERR_RANGE,
          "prompt past the context");
    CHECK_ERROR_HAS("129 tokens");
    CHECK(tlm_session_generate_spec(t, NULL, p, 3, NULL, &none, NULL, NULL) == TLM_ERR_ARG,
          "no proposer");
    CHECK_ERROR_HAS("nothing proposes");
    CHECK(tlm_session_generate_spec(t, NULL, p, 3, NULL, NULL, NULL, NULL) == TLM_ERR_ARG,
          "no proposer (default options)");
    CHECK(tlm_session_generate_spec(t, self, p, 3, NULL, &lk, NULL, NULL) == TLM_ERR_ARG,
          "draft and lookup");
    CHECK_ERROR_HAS("not both");
    CHECK(tlm_session_generate_spec(t, t, p, 3, NULL, &none, NULL, NULL) == TLM_ERR_ARG,
          "the target as its own draft session");
    CHECK_ERROR_HAS("session of its own");
    CHECK(tlm_session_generate_spec(t, d50, p, 3, NULL, &none, NULL, NULL) == TLM_ERR_ARG,
          "vocabularies differ");
    CHECK_ERROR_HAS("50 ids, the target's 64");

    struct {
        const char *what, *needle;
        tlm_spec_opts o;
    } bad[] = {{"draft_max -1", "draft_max -1", lk},
               {"draft_max 1000", "draft_max 1000", lk},
               {"draft_min 5 > max 4", "draft_min 5", lk},
               {"draft_min -1", "draft_min -1", lk},
               {"p_min 1.5", "draft_p_min 1.5", lk},
               {"p_min NaN", "draft_p_min", lk},
               {"ngram min 0", "n-grams from 0", lk},
               {"ngram max < min", "from 3 to 2", lk},
               {"ngram max 65", "to 65", lk}};
    bad[0].o.draft_max = -1;
    bad[1].o.draft_max = 1000;
    bad[2].o.draft_max = 4, bad[2].o.draft_min = 5;
    bad[3].o.draft_min = -1;
    bad[4].o.draft_p_min = 1.5f;
    bad[5].o.draft_p_min = NAN;
    bad[6].o.lookup_ngram_min = 0;
    bad[7].o.lookup_ngram_min = 3, bad[7].o.lookup_ngram_max = 2;
    bad[8].o.lookup_ngram_max = 65;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(tlm_session_generate_spec(t, NULL, p, 3, NULL, &bad[i].o, NULL, NULL) == TLM_ERR_ARG,
              "%s accepted", bad[i].what);
        CHECK_ERROR_HAS(bad[i].needle);
    }
    /* a grammar is refused, not ignored */
    const char *gbnf = "root ::= \"a\"";
    CHECK_OK(tlm_grammar_parse(gbnf, strlen(gbnf), &g));
    tlm_generate_opts o;
    tlm_generate_opts_defaults(&o);
    o.grammar = g;
    CHECK(tlm_session_generate_spec(t, NULL, p, 3, &o, &lk, NULL, NULL) == TLM_ERR_UNSUPPORTED,
          "grammar");
    CHECK_ERROR_HAS("grammar");
    /* the sampler's own checks */
    tlm_generate_opts_defaults(&o);
    o.sampling.temperature = -1;
    CHECK(tlm_session_generate_spec(t, NULL, p, 3, &o, &lk, NULL, NULL) == TLM_ERR_ARG,
          "negative temperature");
    CHECK_ERROR_HAS("temperature");
    /* an id outside the vocabulary: the target's prefill names it */
    int32_t outside[2] = {1, 64};
    CHECK(tlm_session_generate_spec(t, NULL, outside, 2, NULL, &lk, NULL, NULL) == TLM_ERR_RANGE,
          "id outside the vocabulary");
    CHECK_ERROR_HAS("outside the vocabulary");
out:
    tlm_grammar_free(g);
    tlm_session_free(t);
    tlm_session_free(self);
    tlm_session_free(d50);
    tlm_model_free(mt);
    tlm_model_free(m50);
}

/* ---- the serve scheduler's pieces: several rows per sequence in one step, lookup alone ---- */

/* tlm_session_step_rows against each sequence by itself (prefill with all rows, batch 1): the
 * rows of drafted ids of several sequences scored in one pass. */
static void test_step_rows(void) {
    tlm_model *m = model(TARGET, 21);
    if (!m) return;
    size_t V = (size_t)tlm_model_config(m)->vocab_size;
    tlm_session *s = NULL, *one = NULL;
    CHECK_OK(tlm_session_new(m, &(tlm_session_opts){.batch = 3}, &s));
    CHECK_OK(tlm_session_new(m, NULL, &one));
    float *got = malloc(8 * V * sizeof(float)), *want = malloc(8 * V * sizeof(float));
    if (!s || !one || !got || !want) goto out;
    /* histories of 5, 0 and 2 ids; then 3, 1 and 4 new ids, the last 3, 1 and 2 rows asked for */
    int32_t hist[3][5] = {{3, 9, 27, 17, 51}, {0}, {8, 2}};
    int hn[3] = {5, 0, 2};
    int32_t ids[8] = {4, 5, 6, 7, 40, 41, 42, 43};
    int n[3] = {3, 1, 4}, rows[3] = {3, 1, 2};
    for (int b = 0; b < 3; b++)
        if (hn[b]) CHECK_OK(tlm_session_prefill(s, b, hist[b], hn[b], NULL, 0));
    CHECK_OK(tlm_session_step_rows(s, ids, n, rows, got));
    int off = 0, row = 0;
    float worst = 0.0f;
    for (int b = 0; b < 3; b++) {
        CHECK(tlm_session_length(s, b) == hn[b] + n[b], "sequence %d holds %d", b,
              tlm_session_length(s, b));
        tlm_session_reset(one, 0);
        if (hn[b]) CHECK_OK(tlm_session_prefill(one, 0, hist[b], hn[b], NULL, 0));
        CHECK_OK(tlm_session_prefill(one, 0, ids + off, n[b], want, 1));
        for (int r = 0; r < rows[b]; r++, row++) {
            const float *w = want + (size_t)(n[b] - rows[b] + r) * V, *g = got + (size_t)row * V;
            for (size_t v = 0; v < V; v++) {
                float d = g[v] > w[v] ? g[v] - w[v] : w[v] - g[v];
                worst = d > worst ? d : worst;
            }
        }
        off += n[b];
    }
    CHECK(worst < 1e-4f, "step_rows against one sequence at a time: largest difference %g",
          (double)worst);
    int bad[3] = {1, 2, 0};
    CHECK(tlm_session_step_rows(s, ids, n, bad, got) == TLM_ERR_ARG, "more rows than ids");
    CHECK_ERROR_HAS("rows of logits");
out:
    free(got);
    free(want);
    tlm_session_free(s);
    tlm_session_free(one);
    tlm_model_free(m);
}

static void test_lookup(void) {
    int32_t t[] = {1, 2, 3, 4, 1, 2}, out[8] = {0};
    /* "1 2" occurred at 0: its continuation, through the ids it proposes itself */
    CHECK(tlm_spec_lookup(t, 6, 1, 4, 5, out) == 5, "a match of 2 ids gives 5");
    int32_t want[5] = {3, 4, 1, 2, 3};
    CHECK(!memcmp(out, want, sizeof want), "continuation %d %d %d %d %d", out[0], out[1], out[2],
          out[3], out[4]);
    CHECK(tlm_spec_lookup(t, 6, 3, 4, 5, out) == 0, "no match of 3 or more ids");
    CHECK(tlm_spec_lookup(t, 6, 0, 4, 5, out) == 0, "n-grams of 0 ids: nothing");
    CHECK(tlm_spec_lookup(t, 6, 1, 4, 2, out) == 2 && out[0] == 3 && out[1] == 4, "kmax 2");
}

int main(void) {
    tlm_threads_set(2);
    test_step_rows();
    test_lookup();
    test_sampler_probs();
    test_refusals();
    test_greedy();
    test_sampling();
    return t_finish("test_spec");
}
