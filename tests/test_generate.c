/* Generation: the KV-cache invariant (incremental decoding and every prefill/decode split give the
 * logits of one full forward pass) over every config variant, batched decoding, the limits of the
 * cache, the samplers' distributions (seeded chi-square tests) and the generation loop. The cache
 * tests run on an F32 cache (to 1e-5), again on an F16 one (keys and values rounded to halves:
 * to TOL_F16, where a cache read or written wrong is off by far more), and on each of llama.cpp's
 * other cache types (tol(): about three times the largest error seen), whose models, for the block
 * types, have a head size of 32 (base_d 128 over 4 heads): their rows are whole blocks. What a Q8_0
 * cache, and each other type's, stores is checked byte for byte against its reference quantizer. */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "harness.h"
#include "kernels/qdot.h"
#include "tlm.h"

/* The cache type of the session tests (main runs them with each). */
static tlm_dtype kv_type = TLM_DTYPE_F32;
#define TOL_F16 2e-3
#define TOL_BF16 1.5e-2
#define TOL_Q8_0 2e-2
#define TOL_Q5 0.2
#define TOL_Q4 0.4
/* The values' type of the session tests (kv_type's unless a run sets it apart). */
static tlm_dtype v_type = TLM_DTYPE_F32;
static double tol_of(tlm_dtype t) {
    switch (t) {
    case TLM_DTYPE_F16: return TOL_F16;
    case TLM_DTYPE_BF16: return TOL_BF16;
    case TLM_DTYPE_Q8_0: return TOL_Q8_0;
    case TLM_DTYPE_Q5_0:
    case TLM_DTYPE_Q5_1: return TOL_Q5;
    case TLM_DTYPE_Q4_0:
    case TLM_DTYPE_Q4_1:
    case TLM_DTYPE_IQ4_NL: return TOL_Q4;
    default: return 1e-5;
    }
}
static double tol(void) { return fmax(tol_of(kv_type), tol_of(v_type)); }
#define TOL tol()
/* The models' width where a variant does not set it: 32 (head size 8), or 128 (head size 32) for
 * the Q8_0 cache. */
static int base_d = 32;

static tlm_status new_session(const tlm_model *m, int batch, int capacity, tlm_session **out) {
    tlm_session_opts o = {.batch = batch,
                          .capacity = capacity,
                          .kv_type = kv_type,
                          .v_type_set = v_type != kv_type,
                          .v_type = v_type};
    tlm_status st = tlm_session_new(m, &o, out);
    if (!st)
        CHECK(tlm_session_kv_type(*out) == kv_type && tlm_session_v_type(*out) == v_type,
              "cache types");
    return st;
}

/* max|a-b| / max|b| per row of width V over n rows: the worst row. */
static double rel_err(const float *a, const float *b, int n, int V) {
    double worst = 0;
    for (int r = 0; r < n; r++) {
        double e = 0, mag = 0;
        for (int j = 0; j < V; j++) {
            size_t i = (size_t)r * V + j;
            e = fmax(e, fabs((double)a[i] - b[i]));
            mag = fmax(mag, fabs((double)b[i]));
        }
        worst = fmax(worst, e / (mag > 0 ? mag : 1));
    }
    return worst;
}

typedef struct {
    const char *name;
    const char *json;    /* fields beyond the base */
    int d, heads, vocab; /* 0: base value */
} variant;

static const variant variants[] = {
    {"modern (rmsnorm pre swiglu rope-half tied)", "", 0, 0, 0},
    {"layernorm bias gelu", "\"norm\":\"layernorm\",\"bias\":true,\"ffn\":\"gelu\"", 0, 0, 0},
    {"post-norm relu learned",
     "\"norm_position\":\"post\",\"ffn\":\"relu\",\"position\":\"learned\"", 0, 0, 0},
    {"post layernorm bias gelu_tanh",
     "\"norm_position\":\"post\",\"norm\":\"layernorm\",\"bias\":true,\"ffn\":\"gelu_tanh\"", 0, 0,
     0},
    {"sinusoidal untied gelu_tanh",
     "\"position\":\"sinusoidal\",\"tie_embeddings\":false,\"ffn\":\"gelu_tanh\"", 0, 0, 0},
    {"no position", "\"position\":\"none\"", 0, 0, 0},
    {"rope interleaved", "\"rope_pairing\":\"interleaved\"", 0, 0, 0},
    {"GQA 4/2", "\"n_kv_heads\":2", 0, 0, 0},
    {"MQA 4/1 bias untied", "\"n_kv_heads\":1,\"bias\":true,\"tie_embeddings\":false", 0, 0, 0},
    {"odd sizes d=36 h=3 ff=50 V=101", "\"d_ff\":50", 36, 3, 101},
    {"GQA 6/3 interleaved layernorm bias",
     "\"n_kv_heads\":3,\"rope_pairing\":\"interleaved\",\"bias\":true,\"norm\":\"layernorm\"", 48,
     6, 0},
    /* head size 32: decode attention takes k_attend_row where the CPU has AVX-512 (the others'
     * head sizes take the plain loops) */
    {"head size 32, GQA 4/2", "\"n_kv_heads\":2", 128, 4, 0},
    /* a head size no vector kernel takes: the plain loops, over a widened F16 or Q8_0 cache */
    {"head size 160", "", 320, 2, 0},
    /* sliding windows shorter than the context: decoding past them reads only the window */
    {"sliding window 5, every layer, GQA 4/2", "\"n_kv_heads\":2,\"sliding_window\":5", 0, 0, 0},
    {"window 7 then global, head size 32",
     "\"n_kv_heads\":2,\"sliding_window\":7,\"sliding_window_pattern\":2", 128, 4, 0},
    /* Gemma 2's layer features: capped scores take the plain loops (no vector kernel caps) */
    {"attn_softcap 1.5, head size 32", "\"attn_softcap\":1.5", 128, 4, 0},
    {"attn_softcap 2, GQA 4/2", "\"attn_softcap\":2,\"n_kv_heads\":2", 0, 0, 0},
    {"attn_scale 0.3, head size 32", "\"attn_scale\":0.3", 128, 4, 0},
    {"final_softcap 10", "\"final_softcap\":10", 0, 0, 0},
    {"embed_scale 5.6, untied", "\"embed_scale\":5.6,\"tie_embeddings\":false", 0, 0, 0},
    {"post_norms layernorm bias", "\"post_norms\":true,\"norm\":\"layernorm\",\"bias\":true", 0, 0,
     0},
    {"geglu", "\"ffn\":\"geglu\"", 0, 0, 0},
    {"gemma2-like, head size 32",
     "\"n_kv_heads\":2,\"sliding_window\":7,\"sliding_window_pattern\":2,\"attn_softcap\":"
     "2,\"final_softcap\":4,\"embed_scale\":11.3,\"attn_scale\":0.125,\"post_norms\":true,"
     "\"ffn\":\"geglu\"",
     128, 4, 0},
    /* mixtures of experts: decode computes a token's chosen experts, prefill each chosen expert
     * over the rows that chose it */
    {"experts top 2 of 4, renormalised",
     "\"n_experts\":4,\"n_experts_used\":2,\"expert_d_ff\":24,\"expert_weights_norm\":true", 0, 0,
     0},
    {"experts top 2 of 8, shared expert, geglu, GQA 4/2",
     "\"n_experts\":8,\"n_experts_used\":2,\"expert_d_ff\":16,\"n_shared_experts\":2,"
     "\"ffn\":\"geglu\",\"n_kv_heads\":2",
     0, 0, 0},
    {"experts 3 of 4, post-norm, window 5",
     "\"n_experts\":4,\"n_experts_used\":3,\"expert_d_ff\":16,\"norm_position\":\"post\","
     "\"sliding_window\":5",
     0, 0, 0},
};

/* Base: vocab 97, context 24, d 32, 2 layers, 4 heads, plus the variant's fields. */
static tlm_model *make_model_v(const variant *v, uint64_t seed) {
    char buf[1024];
    snprintf(buf, sizeof buf,
             "{\"vocab_size\":%d,\"context_length\":24,\"d_model\":%d,\"n_layers\":2,"
             "\"n_heads\":%d%s%s}",
             v->vocab ? v->vocab : 97, v->d ? v->d : base_d, v->heads ? v->heads : 4,
             v->json[0] ? "," : "", v->json);
    tlm_config c;
    tlm_model *m = NULL;
    if (tlm_config_from_json(buf, &c) || tlm_model_new(&c, &m)) return NULL;
    if (tlm_model_init(m, seed, TLM_INIT_XAVIER)) {
        tlm_model_free(m);
        return NULL;
    }
    return m;
}

static tlm_model *make_model(const char *json, uint64_t seed) {
    variant v = {"", json, 0, 0, 0};
    return make_model_v(&v, seed);
}

static void random_ids(int32_t *ids, int n, int V, uint64_t seed) {
    core_rng r;
    core_rng_seed(&r, seed, 7);
    for (int i = 0; i < n; i++) ids[i] = (int32_t)core_rng_below(&r, (uint32_t)V);
}

/* Full-pass logits [T, V] of ids (a copy: the model's buffer is reused by the next call). */
static float *full_logits(tlm_model *m, const int32_t *ids, int T) {
    int V = tlm_model_config(m)->vocab_size;
    tlm_forward_out out;
    if (t_forward(m, ids, 1, T, NULL, &out)) return NULL;
    float *f = malloc((size_t)T * V * sizeof *f);
    memcpy(f, out.logits, (size_t)T * V * sizeof *f);
    return f;
}

/* Prefill chunks of the given sizes (all rows), then decode the rest one at a time. Returns the
 * worst relative error against want. */
static double run_split(tlm_session *s, const int32_t *ids, int T, const int *chunks, int n_chunks,
                        const float *want, int V) {
    float *got = malloc((size_t)T * V * sizeof *got);
    tlm_session_reset(s, -1);
    int at = 0;
    for (int i = 0; i < n_chunks; i++) {
        CHECK_OK(tlm_session_prefill(s, 0, ids + at, chunks[i], got + (size_t)at * V, 1));
        at += chunks[i];
    }
    for (; at < T; at++) CHECK_OK(tlm_session_decode_one(s, ids[at], got + (size_t)at * V));
    CHECK(tlm_session_length(s, 0) == T, "length %d after %d tokens", tlm_session_length(s, 0), T);
    double e = rel_err(got, want, T, V);
    free(got);
    return e;
}

/* few: the first variant, GQA and the plain loops only */
static void test_invariant(int few) {
    printf("KV-cache invariant (max over rows of max|a-b|/max|b|):\n");
    int nv = (int)(sizeof variants / sizeof variants[0]);
    for (int vi = 0; vi < nv; vi++) {
        if (few && vi && vi != 7 && vi != nv - 1) continue;
        tlm_model *m = make_model_v(&variants[vi], 100 + (uint64_t)vi);
        CHECK(m != NULL, "%s: %s", variants[vi].name, tlm_last_error());
        if (!m) continue;
        const tlm_config *c = tlm_model_config(m);
        int hd = c->d_model / c->n_heads;
        /* A block type's cache moves a router's logits enough to change a close choice of
         * experts, a jump no tolerance bounds: mixtures are held to the float caches. */
        int lossy =
            core_dtype_get(kv_type)->block_elems > 1 || core_dtype_get(v_type)->block_elems > 1;
        if (c->n_experts > 0 && lossy) {
            tlm_model_free(m);
            continue;
        }
        if (hd % (int)core_dtype_get(kv_type)->block_elems ||
            hd % (int)core_dtype_get(v_type)->block_elems) {
            tlm_model_free(m); /* a head size a block type's cache refuses (test_kv_types) */
            continue;
        }
        int V = c->vocab_size, T = c->context_length;
        int32_t ids[64];
        random_ids(ids, T, V, 1000 + (uint64_t)vi);
        float *want = full_logits(m, ids, T);
        /* The full-pass logits must be peaked enough that a wrong cache shows up. */
        double mag = 0;
        for (size_t i = 0; i < (size_t)T * V; i++) mag = fmax(mag, fabs(want[i]));
        CHECK(mag > 1.0, "%s: logits too flat (%g)", variants[vi].name, mag);
        tlm_session *s = NULL;
        CHECK_OK(new_session(m, 1, 0, &s));
        CHECK(tlm_session_capacity(s) == T, "capacity %d", tlm_session_capacity(s));
        const int splits[][4] = {{1}, {5}, {T / 2}, {T - 1}, {T}, {3, 7}, {1, 1, 9}, {2, 11, 11}};
        const int n_chunks[] = {1, 1, 1, 1, 1, 2, 3, 3};
        double worst = 0, token_by_token = 0;
        for (int k = 0; k < (int)(sizeof n_chunks / sizeof n_chunks[0]); k++) {
            double e = run_split(s, ids, T, splits[k], n_chunks[k], want, V);
            if (k == 0) token_by_token = e;
            CHECK(e <= TOL, "%s: split %d: rel err %.3g", variants[vi].name, k, e);
            worst = fmax(worst, e);
        }
        /* The cache is full: one more token is refused, never written. */
        float row[128];
        CHECK(tlm_session_decode_one(s, 0, row) == TLM_ERR_RANGE, "decode past capacity");
        CHECK(tlm_session_prefill(s, 0, ids, 1, row, 0) == TLM_ERR_RANGE, "prefill past capacity");
        printf("  %-50s token-by-token %.2e  worst split %.2e\n", variants[vi].name, token_by_token,
               worst);
        tlm_session_free(s);
        free(want);
        tlm_model_free(m);
    }
}

/* Prefill longer than one attention chunk (128 queries) after a cached prefix, and a session
 * capacity below the context length; with a sliding window (chunks start past it) or soft-capped
 * scores (chunks on the plain products), the same. */
static void test_long_prefill(int window, float cap) {
    tlm_config c;
    tlm_config_defaults(&c);
    c.vocab_size = 61;
    c.context_length = 300;
    c.d_model = base_d;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.sliding_window = window;
    c.attn_softcap = cap;
    tlm_model *m = t_model(&c, 5, TLM_INIT_XAVIER);
    int T = 290, V = c.vocab_size;
    int32_t *ids = malloc(sizeof(int32_t) * T);
    random_ids(ids, T, V, 55);
    float *want = full_logits(m, ids, T);
    tlm_session *s = NULL;
    CHECK_OK(new_session(m, 1, 0, &s));
    int chunks[] = {5, 270};
    double e = run_split(s, ids, T, chunks, 2, want, V);
    CHECK(e <= TOL, "long prefill rel err %.3g", e);
    printf("  %-50s %.2e\n",
           window ? "window 50: prefill 5 + 270 + decode 15"
           : cap  ? "attn_softcap 1: prefill 5 + 270 + decode 15"
                  : "prefill 5 + 270 (3 query chunks) + decode 15",
           e);
    tlm_session_free(s);
    CHECK(new_session(m, 1, 301, &s) == TLM_ERR_ARG, "capacity > context");
    CHECK_OK(new_session(m, 1, 10, &s));
    CHECK(tlm_session_prefill(s, 0, ids, 11, NULL, 0) == TLM_ERR_RANGE,
          "prefill past a small capacity");
    CHECK(tlm_session_length(s, 0) == 0, "failed prefill left length %d", tlm_session_length(s, 0));
    CHECK_OK(tlm_session_prefill(s, 0, ids, 10, NULL, 0));
    CHECK(tlm_session_decode_one(s, 1, want) == TLM_ERR_RANGE, "decode past a small capacity");
    tlm_session_free(s);
    free(want);
    free(ids);
    tlm_model_free(m);
}

/* Batched decode: three sequences at different lengths step together, some paused, and each row
 * equals its own full pass. */
static void test_batch_decode(void) {
    tlm_model *m = make_model("\"n_kv_heads\":2,\"bias\":true", 9);
    CHECK(m != NULL, "%s", tlm_last_error());
    if (!m) return;
    int V = tlm_model_config(m)->vocab_size, T = tlm_model_config(m)->context_length;
    enum { NB = 3 };
    int32_t ids[NB][24];
    float *want[NB];
    for (int b = 0; b < NB; b++) {
        random_ids(ids[b], T, V, 300 + (uint64_t)b);
        want[b] = full_logits(m, ids[b], T);
    }
    tlm_session *s = NULL;
    CHECK_OK(new_session(m, NB, 0, &s));
    float *got = malloc((size_t)NB * V * sizeof *got);
    int len[NB] = {2, 5, 9};
    double worst = 0;
    for (int b = 0; b < NB; b++) {
        CHECK_OK(tlm_session_prefill(s, b, ids[b], len[b], got + (size_t)b * V, 0));
        worst = fmax(worst, rel_err(got + (size_t)b * V, want[b] + (size_t)(len[b] - 1) * V, 1, V));
    }
    for (int step = 0; step < 14; step++) {
        uint8_t active[NB] = {1, (uint8_t)(step % 3 != 1), (uint8_t)(step % 2)};
        int32_t next[NB];
        for (int b = 0; b < NB; b++) next[b] = active[b] ? ids[b][len[b]] : -5;
        CHECK_OK(tlm_session_decode(s, next, active, got));
        for (int b = 0; b < NB; b++) {
            if (!active[b]) continue;
            worst = fmax(worst, rel_err(got + (size_t)b * V, want[b] + (size_t)len[b] * V, 1, V));
            len[b]++;
            CHECK(tlm_session_length(s, b) == len[b], "seq %d length", b);
        }
    }
    CHECK(worst <= TOL, "batched decode rel err %.3g", worst);
    printf("  %-50s %.2e\n", "batch of 3, staggered, partly paused", worst);
    int32_t bad[NB] = {0, V, 0};
    CHECK(tlm_session_decode(s, bad, NULL, got) == TLM_ERR_RANGE, "id outside vocab");
    CHECK(tlm_session_prefill(s, 3, ids[0], 1, NULL, 0) == TLM_ERR_ARG, "seq outside batch");
    CHECK(tlm_session_prefill(s, 0, ids[0], 0, NULL, 0) == TLM_ERR_ARG, "empty prefill");
    tlm_session_reset(s, 1);
    CHECK(tlm_session_length(s, 1) == 0 && tlm_session_length(s, 0) == len[0], "reset one");
    tlm_session_free(s);
    free(got);
    for (int b = 0; b < NB; b++) free(want[b]);
    tlm_model_free(m);
}

/* A sequence's saved prefix loaded into another sequence (and another session) continues exactly
 * as the original: the next token's logits are bit for bit the same. Bad arguments are refused. */
static void test_prefix_save_load(void) {
    tlm_model *m = make_model("\"n_kv_heads\":2", 11);
    CHECK(m != NULL, "%s", tlm_last_error());
    if (!m) return;
    int V = tlm_model_config(m)->vocab_size;
    int32_t ids[12];
    random_ids(ids, 12, V, 77);
    tlm_session *s = NULL, *t = NULL;
    CHECK_OK(new_session(m, 2, 0, &s));
    CHECK_OK(new_session(m, 3, 16, &t));
    float *a = malloc((size_t)V * sizeof *a), *b = malloc((size_t)V * sizeof *b);
    CHECK_OK(tlm_session_prefill(s, 0, ids, 10, NULL, 0));
    size_t bytes = tlm_session_prefix_bytes(s, 10);
    CHECK(bytes == tlm_session_prefix_bytes(t, 10) && bytes > 0, "prefix bytes %zu", bytes);
    void *buf = malloc(bytes);
    CHECK_OK(tlm_session_save_prefix(s, 0, 10, buf));
    CHECK(tlm_session_save_prefix(s, 0, 11, buf) == TLM_ERR_RANGE, "saving past the length");
    CHECK(tlm_session_save_prefix(s, 2, 1, buf) == TLM_ERR_RANGE, "sequence outside the batch");
    CHECK(tlm_session_load_prefix(t, 0, buf, 10, 11) == TLM_ERR_RANGE, "loading past the saved");
    CHECK(tlm_session_load_prefix(t, 0, NULL, 10, 5) == TLM_ERR_ARG, "NULL buffer");
    /* the first 8 of the 10 into sequence 2 of the other session, which held something else */
    CHECK_OK(tlm_session_prefill(t, 2, ids + 4, 3, NULL, 0));
    CHECK_OK(tlm_session_load_prefix(t, 2, buf, 10, 8));
    CHECK(tlm_session_length(t, 2) == 8, "length after loading: %d", tlm_session_length(t, 2));
    CHECK_OK(tlm_session_truncate(s, 0, 8));
    CHECK_OK(tlm_session_prefill(s, 0, ids + 8, 2, a, 0));
    CHECK_OK(tlm_session_prefill(t, 2, ids + 8, 2, b, 0));
    CHECK(!memcmp(a, b, (size_t)V * sizeof *a), "continuing from the loaded prefix");
    free(buf);
    free(a);
    free(b);
    tlm_session_free(s);
    tlm_session_free(t);
    tlm_model_free(m);
}

/* Mixed steps (tlm_session_step): each pass gives some sequences one id, others a run of several,
 * skips the rest, and asks for logits of only some; every asked row equals its own full pass and
 * the rows not asked for are left untouched. Runs of more than one id go through the prefill
 * attention inside the same pass as the single ids. */
static void test_mixed_step(void) {
    tlm_model *m = make_model("\"n_kv_heads\":2", 13);
    CHECK(m != NULL, "%s", tlm_last_error());
    if (!m) return;
    int V = tlm_model_config(m)->vocab_size, T = tlm_model_config(m)->context_length;
    enum { NB = 4 };
    int32_t ids[NB][24];
    float *want[NB];
    for (int b = 0; b < NB; b++) {
        random_ids(ids[b], T, V, 700 + (uint64_t)b);
        want[b] = full_logits(m, ids[b], T);
    }
    tlm_session *s = NULL;
    CHECK_OK(new_session(m, NB, 0, &s));
    float *got = malloc((size_t)NB * V * sizeof *got);
    int len[NB] = {0, 0, 0, 0}, checked = 0;
    /* n[step][b]: a prompt of 5 for sequence 0 while 1 waits, then all kinds of mixes. */
    static const int plan[][NB] = {{5, 0, 3, 1}, {1, 4, 1, 2}, {1, 1, 0, 6}, {2, 1, 3, 1},
                                   {1, 0, 1, 1}, {3, 2, 2, 0}, {1, 1, 1, 1}};
    int nsteps = (int)(sizeof plan / sizeof plan[0]);
    double worst = 0;
    for (int st = 0; st < nsteps; st++) {
        int32_t flat[NB * 24];
        int at = 0;
        uint8_t ask[NB];
        for (int b = 0; b < NB; b++) {
            for (int i = 0; i < plan[st][b]; i++) flat[at++] = ids[b][len[b] + i];
            ask[b] = (uint8_t)((st + b) % 3 != 2);
        }
        for (size_t i = 0; i < (size_t)NB * V; i++) got[i] = -1234.0f;
        CHECK_OK(tlm_session_step(s, flat, plan[st], ask, got));
        for (int b = 0; b < NB; b++) {
            len[b] += plan[st][b];
            CHECK(tlm_session_length(s, b) == len[b], "step %d seq %d length %d", st, b,
                  tlm_session_length(s, b));
            if (plan[st][b] && ask[b]) {
                worst = fmax(
                    worst, rel_err(got + (size_t)b * V, want[b] + (size_t)(len[b] - 1) * V, 1, V));
                checked++;
            } else {
                int untouched = 1;
                for (int i = 0; i < V; i++) untouched &= got[(size_t)b * V + i] == -1234.0f;
                CHECK(untouched, "step %d seq %d: a row not asked for was written", st, b);
            }
        }
    }
    CHECK(checked >= 14, "only %d rows checked", checked);
    CHECK(worst <= TOL, "mixed step rel err %.3g", worst);
    printf("  %-50s %.2e\n", "mixed steps: single ids and runs in one pass", worst);
    int bad_n[NB] = {0, -1, 0, 0}, big[NB] = {0, 0, T - len[2] + 1, 0}, none[NB] = {0};
    CHECK(tlm_session_step(s, ids[0], bad_n, NULL, got) == TLM_ERR_ARG, "negative count");
    CHECK(tlm_session_step(s, ids[0], big, NULL, got) == TLM_ERR_RANGE, "past the capacity");
    int32_t out_of_vocab[2] = {0, V};
    int two[NB] = {2, 0, 0, 0};
    CHECK(tlm_session_step(s, out_of_vocab, two, NULL, got) == TLM_ERR_RANGE, "id outside vocab");
    CHECK_OK(tlm_session_step(s, NULL, none, NULL, got));
    for (int b = 0; b < NB; b++)
        CHECK(tlm_session_length(s, b) == len[b], "a refused step changed seq %d", b);
    tlm_session_free(s);
    free(got);
    for (int b = 0; b < NB; b++) free(want[b]);
    tlm_model_free(m);
}

/* Sliding-window layers' rings (tlm_session_opts.step_max 5, window 8: a ring of 12 positions
 * and a mirror of 11 rows, in a context of 160): every layer windowed, then windowed and global
 * layers in turn. Generation far past the window equals the full pass under the window mask
 * token by token, after prefills in chunks shorter than the window and longer than it (several
 * passes of 5), in mixed steps of batched sequences (a run split into passes, logits of some of
 * its rows), after a cut of rejected rows; the cache's bytes are the ring's. */
static void test_ring(int pattern) {
    enum {
        W = 8,
        STEP = 5,
        CTX = 160,
        T = 130,
        RING = W + STEP - 1,
        ROWS = RING + W - 1 + STEP - 1
    };
    tlm_config c;
    tlm_config_defaults(&c);
    c.vocab_size = 61;
    c.context_length = CTX;
    c.d_model = base_d;
    c.n_layers = 3;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.sliding_window = W;
    c.sliding_window_pattern = pattern;
    tlm_model *m = t_model(&c, 21 + (uint64_t)pattern, TLM_INIT_XAVIER);
    int V = c.vocab_size, hd = c.d_model / c.n_heads;
    int32_t ids[2][T];
    float *want[2];
    for (int b = 0; b < 2; b++) {
        random_ids(ids[b], T, V, 90 + (uint64_t)b);
        want[b] = full_logits(m, ids[b], T);
    }
    tlm_session_opts o = {.batch = 2,
                          .capacity = 0,
                          .kv_type = kv_type,
                          .v_type_set = 1,
                          .v_type = v_type,
                          .step_max = STEP};
    tlm_session *s = NULL, *full = NULL;
    CHECK_OK(tlm_session_new(m, &o, &s));
    o.step_max = CTX; /* a ring no smaller than the context: every layer keeps CTX positions */
    CHECK_OK(tlm_session_new(m, &o, &full));
    size_t row =
        core_dtype_get(kv_type)->block_bytes * (size_t)hd / core_dtype_get(kv_type)->block_elems +
        core_dtype_get(v_type)->block_bytes * (size_t)hd / core_dtype_get(v_type)->block_elems;
    int windowed = 0;
    for (int l = 0; l < c.n_layers; l++) windowed += tlm_config_layer_windowed(&c, l);
    CHECK(windowed == (pattern ? 2 : 3), "%d windowed layers", windowed);
    size_t per_seq_head = (size_t)windowed * ROWS + (size_t)(c.n_layers - windowed) * CTX;
    CHECK(tlm_session_kv_bytes(s) == 2 * 2 * per_seq_head * row, "ring cache %zu bytes, want %zu",
          tlm_session_kv_bytes(s), 2 * 2 * per_seq_head * row);
    CHECK(tlm_session_kv_bytes(full) == 2 * 2 * (size_t)c.n_layers * CTX * row,
          "full cache %zu bytes", tlm_session_kv_bytes(full));
    /* prefills: token by token, shorter than the window, longer (passes of STEP), mixed */
    const int splits[][3] = {{1}, {3}, {W + 12}, {2, 37, 50}};
    const int n_chunks[] = {1, 1, 1, 3};
    double worst = 0;
    for (int k = 0; k < 4; k++) {
        double e = run_split(s, ids[0], T, splits[k], n_chunks[k], want[0], V);
        CHECK(e <= TOL, "ring, pattern %d, split %d: rel err %.3g", pattern, k, e);
        worst = fmax(worst, e);
    }
    /* a step of 5 drafted rows, 3 of them wrong, cut back to the 2 right ones */
    float *got = malloc((size_t)(T + 2) * V * sizeof *got);
    tlm_session_reset(s, -1);
    CHECK_OK(tlm_session_prefill(s, 0, ids[0], 40, NULL, 0));
    int32_t draft[STEP] = {ids[0][40], ids[0][41], (ids[0][42] + 1) % V, 5, 6};
    int n5[2] = {STEP, 0}, r5[2] = {STEP, 0};
    CHECK_OK(tlm_session_step_rows(s, draft, n5, r5, got));
    worst = fmax(worst, rel_err(got, want[0] + (size_t)40 * V, 2, V));
    CHECK(tlm_session_truncate(s, 0, 10) == TLM_ERR_RANGE, "a cut past the ring");
    CHECK(tlm_session_length(s, 0) == 45, "refused cut left %d", tlm_session_length(s, 0));
    CHECK(tlm_session_save_prefix(s, 0, 45, got) == TLM_ERR_RANGE, "saving an overwritten prefix");
    CHECK_OK(tlm_session_truncate(s, 0, 42));
    for (int t = 42; t < T; t++) {
        CHECK_OK(tlm_session_decode_one(s, ids[0][t], got));
        worst = fmax(worst, rel_err(got, want[0] + (size_t)t * V, 1, V));
    }
    /* batched: sequence 0 decodes while 1 takes runs of 30 (six passes), then some of the rows
     * of the next run */
    tlm_session_reset(s, -1);
    CHECK_OK(tlm_session_prefill(s, 0, ids[0], 30, NULL, 0));
    int32_t flat[1 + 30];
    flat[0] = ids[0][30];
    memcpy(flat + 1, ids[1], 30 * sizeof(int32_t));
    int n[2] = {1, 30};
    CHECK_OK(tlm_session_step(s, flat, n, NULL, got));
    worst = fmax(worst, rel_err(got, want[0] + (size_t)30 * V, 1, V));
    worst = fmax(worst, rel_err(got + V, want[1] + (size_t)29 * V, 1, V));
    flat[0] = ids[0][31];
    memcpy(flat + 1, ids[1] + 30, 30 * sizeof(int32_t));
    int rows[2] = {1, 12};
    CHECK_OK(tlm_session_step_rows(s, flat, n, rows, got));
    worst = fmax(worst, rel_err(got, want[0] + (size_t)31 * V, 1, V));
    worst = fmax(worst, rel_err(got + V, want[1] + (size_t)48 * V, 12, V));
    for (int t = 60; t < T; t++) {
        int32_t pair[2] = {ids[0][t - 28], ids[1][t]};
        CHECK_OK(tlm_session_decode(s, pair, NULL, got));
        worst = fmax(worst, rel_err(got, want[0] + (size_t)(t - 28) * V, 1, V));
        worst = fmax(worst, rel_err(got + V, want[1] + (size_t)t * V, 1, V));
    }
    /* 60 positions saved from the session without a ring, loaded into the ring */
    CHECK_OK(tlm_session_prefill(full, 0, ids[1], 60, NULL, 0));
    void *buf = malloc(tlm_session_prefix_bytes(full, 60));
    CHECK_OK(tlm_session_save_prefix(full, 0, 60, buf));
    CHECK_OK(tlm_session_load_prefix(s, 1, buf, 60, 57));
    CHECK(tlm_session_length(s, 1) == 57, "loaded length %d", tlm_session_length(s, 1));
    int one[2] = {0, 1};
    for (int t = 57; t < T; t++) {
        CHECK_OK(tlm_session_step(s, &ids[1][t], one, NULL, got));
        worst = fmax(worst, rel_err(got + V, want[1] + (size_t)t * V, 1, V));
    }
    free(buf);
    CHECK(worst <= TOL, "ring, pattern %d: rel err %.3g", pattern, worst);
    printf("  %-50s %.2e\n", pattern ? "ring: windowed and global layers" : "ring: every layer",
           worst);
    free(got);
    tlm_session_free(s);
    tlm_session_free(full);
    for (int b = 0; b < 2; b++) free(want[b]);
    tlm_model_free(m);
}

/* ---- samplers ---- */

#define DRAWS 20000

static void softmax_t(const float *l, int n, double T, double *p) {
    double mx = -1e300, s = 0;
    for (int i = 0; i < n; i++) mx = fmax(mx, l[i]);
    for (int i = 0; i < n; i++) s += p[i] = exp((l[i] - mx) / T);
    for (int i = 0; i < n; i++) p[i] /= s;
}

/* Pearson chi-square of counts against probabilities p (cells with p = 0 must be empty: any
 * count there returns infinity). */
static double chi2(const int *count, const double *p, int n, int draws) {
    double x = 0;
    for (int i = 0; i < n; i++) {
        if (p[i] == 0) {
            if (count[i]) return INFINITY;
            continue;
        }
        double e = p[i] * draws;
        x += (count[i] - e) * (count[i] - e) / e;
    }
    return x;
}

/* Each call draws from a fresh seed, so the checks do not share one random sequence. */
static void draw_counts(const tlm_sampler_opts *o, const float *l, int n, int *count) {
    static uint64_t calls = 0;
    tlm_sampler_opts so = *o;
    so.seed = 1000 + calls++;
    tlm_sampler *s = NULL;
    CHECK_OK(tlm_sampler_new(&so, n, &s));
    memset(count, 0, sizeof(int) * (size_t)n);
    for (int i = 0; i < DRAWS && s; i++) {
        int32_t id = -1;
        CHECK_OK(tlm_sampler_sample(s, l, &id));
        if (id < 0 || id >= n) {
            CHECK(0, "id %d outside [0, %d)", id, n);
            break;
        }
        count[id]++;
    }
    tlm_sampler_free(s);
}

/* Chi-square critical values at significance 0.001 by degrees of freedom 1..9. */
static const double CRIT[] = {0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12, 27.88};

static void test_samplers(void) {
    const float l[8] = {1.0f, 2.5f, 0.3f, 2.0f, -1.0f, 1.7f, 0.0f, 2.2f};
    int count[8];
    double p[8], q[8];
    tlm_sampler_opts o = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 1};
    tlm_sampler *s = NULL;
    /* Greedy: the argmax, lowest id among ties. */
    CHECK_OK(tlm_sampler_new(&o, 8, &s));
    int32_t id = -1;
    CHECK_OK(tlm_sampler_sample(s, l, &id));
    CHECK(id == 1, "greedy picked %d", id);
    const float tie[4] = {0.5f, 3.0f, -2.0f, 3.0f};
    tlm_sampler_free(s);
    CHECK_OK(tlm_sampler_new(&o, 4, &s));
    CHECK_OK(tlm_sampler_sample(s, tie, &id));
    CHECK(id == 1, "greedy tie picked %d", id);
    const float bad[4] = {0.5f, NAN, 1.0f, 0.0f};
    CHECK(tlm_sampler_sample(s, bad, &id) == TLM_ERR_NUMERIC, "NaN logits");
    const float none[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    CHECK(tlm_sampler_sample(s, none, &id) == TLM_ERR_NUMERIC, "all -inf");
    tlm_sampler_free(s);

    /* Temperature: frequencies follow softmax(l / T), and the test can tell T from 1. */
    o.temperature = 0.7f;
    draw_counts(&o, l, 8, count);
    softmax_t(l, 8, 0.7, p);
    softmax_t(l, 8, 1.0, q);
    double x = chi2(count, p, 8, DRAWS), xw = chi2(count, q, 8, DRAWS);
    printf("sampler chi-square (crit at 0.001): T=0.7 %.2f (%.2f), against T=1 %.1f\n", x, CRIT[7],
           xw);
    CHECK(x < CRIT[7], "temperature chi2 %.2f", x);
    CHECK(xw > 10 * CRIT[7], "the test cannot tell T=0.7 from T=1 (%.2f)", xw);
    o.temperature = 1.0f;
    draw_counts(&o, l, 8, count);
    x = chi2(count, q, 8, DRAWS);
    printf("  T=1 %.2f\n", x);
    CHECK(x < CRIT[7], "T=1 chi2 %.2f", x);

    /* -inf logits are masked: never drawn. */
    float masked[8];
    memcpy(masked, l, sizeof masked);
    masked[1] = -INFINITY;
    draw_counts(&o, masked, 8, count);
    CHECK(count[1] == 0, "masked id drawn %d times", count[1]);

    /* Top-k: only the k largest (ids 1, 7, 3), renormalized. */
    o.top_k = 3;
    o.temperature = 1.3f;
    draw_counts(&o, l, 8, count);
    softmax_t(l, 8, 1.3, p);
    double kept = p[1] + p[7] + p[3];
    for (int i = 0; i < 8; i++) q[i] = (i == 1 || i == 7 || i == 3) ? p[i] / kept : 0;
    x = chi2(count, q, 8, DRAWS);
    printf("  top-k 3 %.2f (%.2f)\n", x, CRIT[2]);
    CHECK(x < CRIT[2], "top-k chi2 %.2f (inf: drew outside the top 3)", x);

    /* Top-p: probabilities 0.4 0.3 0.15 0.1 0.05 (ids permuted). p=0.8 keeps the three largest
     * (0.85), p=0.5 the two largest (0.7), p=0.3 only the largest. */
    const double probs5[5] = {0.1, 0.4, 0.05, 0.3, 0.15};
    float l5[5];
    for (int i = 0; i < 5; i++) l5[i] = (float)log(probs5[i]);
    const double ps[3] = {0.8, 0.5, 0.3};
    const int keep[3][5] = {{0, 1, 0, 1, 1}, {0, 1, 0, 1, 0}, {0, 1, 0, 0, 0}};
    o.top_k = 0;
    o.temperature = 1.0f;
    for (int k = 0; k < 3; k++) {
        o.top_p = (float)ps[k];
        draw_counts(&o, l5, 5, count);
        double mass = 0, q5[5];
        for (int i = 0; i < 5; i++) mass += keep[k][i] ? probs5[i] : 0;
        for (int i = 0; i < 5; i++) q5[i] = keep[k][i] ? probs5[i] / mass : 0;
        int dof = -1;
        for (int i = 0; i < 5; i++) dof += keep[k][i];
        x = chi2(count, q5, 5, DRAWS);
        printf("  top-p %.1f %.2f\n", ps[k], x);
        CHECK(dof == 0 ? x == 0 : x < CRIT[dof], "top-p %.1f chi2 %.2f", ps[k], x);
    }
    /* Top-k applies first and top-p sees its renormalized probabilities: alone, p=0.72 needs
     * three ids (0.4 + 0.3 < 0.72); after k=4 (mass 0.95) the two largest hold 0.7/0.95 = 0.737. */
    o.top_k = 4;
    o.top_p = 0.72f;
    draw_counts(&o, l5, 5, count);
    double q5[5] = {0, 0.4 / 0.7, 0, 0.3 / 0.7, 0};
    x = chi2(count, q5, 5, DRAWS);
    CHECK(x < CRIT[1], "top-k + top-p chi2 %.2f", x);

    /* Top-p over a large vocabulary: every draw lies in the nucleus computed by a full sort. */
    enum { BIGV = 50000 };
    float *big = malloc(sizeof(float) * BIGV);
    core_rng r;
    core_rng_seed(&r, 77, 0);
    for (int i = 0; i < BIGV; i++) big[i] = (float)(3.0 * core_rng_normal(&r));
    double *pb = malloc(sizeof(double) * BIGV);
    softmax_t(big, BIGV, 1.0, pb);
    /* Rank by probability (selection by repeated max is fine for a test: nucleus is small). */
    char *in = calloc(BIGV, 1);
    double acc = 0;
    int nuc = 0;
    while (acc < 0.6) {
        int bi = -1;
        for (int i = 0; i < BIGV; i++)
            if (!in[i] && (bi < 0 || pb[i] > pb[bi])) bi = i;
        in[bi] = 1;
        acc += pb[bi];
        nuc++;
    }
    o.top_k = 0;
    o.top_p = 0.6f;
    CHECK_OK(tlm_sampler_new(&o, BIGV, &s));
    int outside = 0, distinct = 0;
    char *seen = calloc(BIGV, 1);
    for (int i = 0; i < 5000; i++) {
        CHECK_OK(tlm_sampler_sample(s, big, &id));
        outside += !in[id];
        distinct += !seen[id];
        seen[id] = 1;
    }
    printf("  top-p 0.6 over %d ids: nucleus %d, drew %d distinct, %d outside\n", BIGV, nuc,
           distinct, outside);
    CHECK(outside == 0, "%d draws outside the nucleus", outside);
    CHECK(distinct == nuc || distinct > nuc / 2, "drew only %d of %d nucleus ids", distinct, nuc);
    tlm_sampler_free(s);
    free(seen);
    free(in);
    free(pb);
    free(big);

    /* Reproducible: same seed, same ids; another seed or stream, other ids. */
    o.top_k = 0;
    o.top_p = 0.95f;
    o.temperature = 1.0f;
    int32_t seq[4][200];
    uint64_t seeds[4] = {42, 42, 43, 42}, streams[4] = {0, 0, 0, 1};
    for (int k = 0; k < 4; k++) {
        o.seed = seeds[k];
        o.stream = streams[k];
        CHECK_OK(tlm_sampler_new(&o, 8, &s));
        for (int i = 0; i < 200; i++) CHECK_OK(tlm_sampler_sample(s, l, &seq[k][i]));
        tlm_sampler_free(s);
    }
    CHECK(memcmp(seq[0], seq[1], sizeof seq[0]) == 0, "same seed differs");
    CHECK(memcmp(seq[0], seq[2], sizeof seq[0]) != 0, "another seed repeats");
    CHECK(memcmp(seq[0], seq[3], sizeof seq[0]) != 0, "another stream repeats");

    o.temperature = -1.0f;
    CHECK(tlm_sampler_new(&o, 8, &s) == TLM_ERR_ARG, "negative temperature");
    o.temperature = 1.0f;
    o.top_p = 0.0f;
    CHECK(tlm_sampler_new(&o, 8, &s) == TLM_ERR_ARG, "top_p 0");
    o.top_p = 1.0f;
    o.top_k = -2;
    CHECK(tlm_sampler_new(&o, 8, &s) == TLM_ERR_ARG, "negative top_k");
}

/* ---- the generation loop ---- */

typedef struct {
    int32_t ids[4][64];
    int n[4];
} collected;

static int collect(void *user, int seq, int32_t id) {
    collected *c = user;
    c->ids[seq][c->n[seq]++] = id;
    return 0;
}

static void test_generate_loop(void) {
    tlm_model *m = make_model("\"n_kv_heads\":2", 21);
    CHECK(m != NULL, "%s", tlm_last_error());
    if (!m) return;
    int V = tlm_model_config(m)->vocab_size, ctx = tlm_model_config(m)->context_length;
    tlm_session *s = NULL;
    CHECK_OK(tlm_session_new(m, &(tlm_session_opts){.batch = 3, .capacity = 0}, &s));
    int32_t p0[3] = {5, 17, 33}, p1[6] = {1, 2, 3, 4, 5, 6}, p2[21];
    random_ids(p2, 21, V, 4);
    const int32_t *prompts[3] = {p0, p1, p2};
    int lens[3] = {3, 6, 21};
    collected got = {0};
    tlm_generate_opts o = {.max_new_tokens = 8, .eos_id = -1, .on_token = collect, .user = &got};
    o.sampling = (tlm_sampler_opts){.temperature = 0.0f, .top_p = 1.0f};
    tlm_stop_reason why[3];
    tlm_generate_stats st;
    CHECK_OK(tlm_session_generate(s, prompts, lens, 3, &o, why, &st));
    CHECK(why[0] == TLM_STOP_LENGTH && got.n[0] == 8, "seq 0: reason %d, %d ids", why[0], got.n[0]);
    CHECK(why[1] == TLM_STOP_LENGTH && got.n[1] == 8, "seq 1: reason %d, %d ids", why[1], got.n[1]);
    /* 21 prompt tokens + 3 new ones fill the context of 24: stop there. */
    CHECK(why[2] == TLM_STOP_CONTEXT && got.n[2] == ctx - 21, "seq 2: reason %d, %d ids", why[2],
          got.n[2]);
    CHECK(st.prompt_tokens == 30 && st.new_tokens == 19, "stats %d %d", st.prompt_tokens,
          st.new_tokens);
    CHECK(st.decode_steps == 7, "decode steps %d", st.decode_steps);
    /* Greedy ids are the argmax of the full pass over prompt + generated prefix. */
    for (int b = 0; b < 3; b++) {
        int32_t seq[64];
        memcpy(seq, prompts[b], sizeof(int32_t) * lens[b]);
        memcpy(seq + lens[b], got.ids[b], sizeof(int32_t) * got.n[b]);
        int T = lens[b] + got.n[b] - 1;
        float *f = full_logits(m, seq, T);
        int bad_at = -1;
        for (int i = 0; i < got.n[b] && bad_at < 0; i++) {
            const float *row = f + (size_t)(lens[b] - 1 + i) * V;
            int best = 0;
            for (int j = 1; j < V; j++) best = row[j] > row[best] ? j : best;
            if (best != got.ids[b][i]) bad_at = i;
        }
        CHECK(bad_at < 0, "seq %d: greedy id %d is not the full-pass argmax", b, bad_at);
        free(f);
    }
    /* EOS: make the first greedy id of sequence 0 the EOS; it is reported, then stops. */
    int32_t first = got.ids[0][0];
    memset(&got, 0, sizeof got);
    o.eos_id = first;
    CHECK_OK(tlm_session_generate(s, prompts, lens, 1, &o, why, NULL));
    CHECK(why[0] == TLM_STOP_EOS && got.n[0] == 1 && got.ids[0][0] == first, "eos: %d, %d ids",
          why[0], got.n[0]);
    /* Sampling in a batch equals sampling each prompt alone (its own stream). */
    o.eos_id = -1;
    o.sampling = (tlm_sampler_opts){.temperature = 1.0f, .top_p = 0.9f, .top_k = 20, .seed = 3};
    memset(&got, 0, sizeof got);
    CHECK_OK(tlm_session_generate(s, prompts, lens, 3, &o, why, NULL));
    collected batch = got;
    tlm_session *one = NULL;
    CHECK_OK(tlm_session_new(m, NULL, &one));
    for (int b = 0; b < 3; b++) {
        memset(&got, 0, sizeof got);
        tlm_generate_opts ob = o;
        ob.sampling.stream = (uint64_t)b;
        CHECK_OK(tlm_session_generate(one, &prompts[b], &lens[b], 1, &ob, why, NULL));
        CHECK(got.n[0] == batch.n[b] &&
                  memcmp(got.ids[0], batch.ids[b], sizeof(int32_t) * got.n[0]) == 0,
              "seq %d: batch and alone differ", b);
    }
    /* No options: the defaults (256 new ids at most, sampled), so the context stops it. */
    CHECK_OK(tlm_session_generate(one, &prompts[0], &lens[0], 1, NULL, why, &st));
    CHECK(why[0] == TLM_STOP_CONTEXT && st.new_tokens == ctx - lens[0], "defaults: %d, %d ids",
          why[0], st.new_tokens);
    /* A prompt that fills the context generates nothing. */
    int32_t full[24];
    random_ids(full, 24, V, 8);
    const int32_t *pf = full;
    int lf = 24;
    memset(&got, 0, sizeof got);
    CHECK_OK(tlm_session_generate(one, &pf, &lf, 1, &o, why, NULL));
    CHECK(why[0] == TLM_STOP_CONTEXT && got.n[0] == 0, "full prompt: %d, %d ids", why[0], got.n[0]);
    lf = 25;
    int32_t longer[25] = {0};
    pf = longer;
    CHECK(tlm_session_generate(one, &pf, &lf, 1, &o, why, NULL) == TLM_ERR_RANGE,
          "prompt > context");
    tlm_session_free(one);
    tlm_session_free(s);
    tlm_model_free(m);
}

/* Cache types other than llama.cpp's are refused by name, and a block type where a head's row
 * would not be whole blocks (head size 8 here). */
static void test_kv_types(void) {
    tlm_model *m = make_model("", 3);
    CHECK(m != NULL, "%s", tlm_last_error());
    if (!m) return;
    tlm_session *s = (tlm_session *)&s; /* not NULL: a refusal must set it to NULL */
    tlm_session_opts o = {.batch = 1, .kv_type = TLM_DTYPE_Q4_K};
    CHECK(tlm_session_new(m, &o, &s) == TLM_ERR_ARG && s == NULL, "Q4_K cache refused");
    CHECK(strstr(tlm_last_error(), "Q4_K") != NULL, "error names the type: %s", tlm_last_error());
    static const tlm_dtype blocks[] = {TLM_DTYPE_Q8_0, TLM_DTYPE_Q4_0, TLM_DTYPE_IQ4_NL};
    for (int k = 0; k < 3; k++) {
        s = (tlm_session *)&s;
        o.kv_type = blocks[k];
        CHECK(tlm_session_new(m, &o, &s) == TLM_ERR_ARG && s == NULL, "%s with head size 8",
              tlm_dtype_name(blocks[k]));
        CHECK(strstr(tlm_last_error(), "multiple of 32") && strstr(tlm_last_error(), "is 8"),
              "error says why: %s", tlm_last_error());
    }
    /* the values' own type, checked as the keys' */
    o = (tlm_session_opts){
        .batch = 1, .kv_type = TLM_DTYPE_F16, .v_type_set = 1, .v_type = TLM_DTYPE_Q2_K};
    CHECK(tlm_session_new(m, &o, &s) == TLM_ERR_ARG && strstr(tlm_last_error(), "Q2_K"),
          "values' Q2_K refused: %s", tlm_last_error());
    o.v_type = TLM_DTYPE_Q8_0;
    CHECK(tlm_session_new(m, &o, &s) == TLM_ERR_ARG && strstr(tlm_last_error(), "multiple of 32"),
          "values' Q8_0 with head size 8: %s", tlm_last_error());
    o.v_type = TLM_DTYPE_F32;
    CHECK_OK(tlm_session_new(m, &o, &s));
    CHECK(tlm_session_kv_type(s) == TLM_DTYPE_F16 && tlm_session_v_type(s) == TLM_DTYPE_F32,
          "F16 keys, F32 values");
    tlm_session *f32 = NULL;
    CHECK_OK(tlm_session_new(m, NULL, &f32));
    CHECK(tlm_session_prefix_bytes(s, 7) * 4 == tlm_session_prefix_bytes(f32, 7) * 3,
          "F16 keys and F32 values: three quarters of F32's prefix bytes");
    tlm_session_free(f32);
    tlm_session_free(s);
    o = (tlm_session_opts){.batch = 1};
    CHECK(tlm_session_new(NULL, &o, &s) == TLM_ERR_ARG && s == NULL, "NULL model");
    /* NULL options are the defaults: one sequence over the whole context, F32 keys and values */
    tlm_session_opts d;
    memset(&d, 0xAB, sizeof d);
    tlm_session_opts_defaults(&d);
    CHECK(d.batch == 1 && d.capacity == 0 && d.kv_type == TLM_DTYPE_F32 && !d.v_type_set &&
              d.v_type == TLM_DTYPE_F32,
          "session defaults");
    CHECK_OK(tlm_session_new(m, NULL, &s));
    CHECK(tlm_session_batch(s) == 1 &&
              tlm_session_capacity(s) == tlm_model_config(m)->context_length &&
              tlm_session_kv_type(s) == TLM_DTYPE_F32 && tlm_session_v_type(s) == TLM_DTYPE_F32,
          "NULL options: batch %d, capacity %d", tlm_session_batch(s), tlm_session_capacity(s));
    tlm_session_free(s);
    o.kv_type = TLM_DTYPE_F16;
    CHECK_OK(tlm_session_new(m, &o, &s));
    tlm_session *f = NULL;
    CHECK_OK(tlm_session_new(m, NULL, &f));
    /* half the bytes of the F32 cache's prefix */
    CHECK(tlm_session_prefix_bytes(s, 7) * 2 == tlm_session_prefix_bytes(f, 7), "F16 prefix bytes");
    CHECK(tlm_session_kv_type(f) == TLM_DTYPE_F32, "tlm_session_new is F32");
    tlm_session_free(s);
    tlm_session_free(f);
    tlm_model_free(m);
}

/* A cache of each of llama.cpp's types holds what llama.cpp's CPU backend would store of the keys
 * and values an F32 cache holds: for Q8_0 k_q8_0_blocks's reference (its x86 quantize_row_q8_0),
 * for the others the reference quantizers (core_dtype_from_f32, byte for byte ggml's: test_quant).
 * Layer 0's, which both sessions compute from the same embeddings with the same kernels, compared
 * through the saved prefixes (a prompt, then decode steps, so that both the prefill and the decode
 * stores are seen); the prefix takes the type's bytes per element. */
static void test_block_stores(void) {
    variant v = {"", "\"n_kv_heads\":2", 128, 4, 0};
    tlm_model *m = make_model_v(&v, 31);
    CHECK(m != NULL, "%s", tlm_last_error());
    if (!m) return;
    const tlm_config *c = tlm_model_config(m);
    int V = c->vocab_size, n = 9, hd = c->d_model / c->n_heads;
    int32_t ids[9];
    random_ids(ids, n, V, 32);
    /* layer 0: keys then values, each kv head's n positions */
    size_t elems = (size_t)2 * c->n_kv_heads * n * hd;
    float *f32 = NULL, *back = malloc(elems * sizeof *back);
    static const tlm_dtype types[] = {TLM_DTYPE_F32,  TLM_DTYPE_Q8_0,  TLM_DTYPE_BF16,
                                      TLM_DTYPE_Q4_0, TLM_DTYPE_Q4_1,  TLM_DTYPE_Q5_0,
                                      TLM_DTYPE_Q5_1, TLM_DTYPE_IQ4_NL};
    size_t f32_bytes = 0;
    for (int k = 0; k < 8; k++) {
        tlm_dtype t = types[k];
        const core_dtype_info *di = core_dtype_get(t);
        tlm_session_opts o = {.batch = 1, .kv_type = t};
        tlm_session *s = NULL;
        CHECK_OK(tlm_session_new(m, &o, &s));
        if (!s) break;
        CHECK_OK(tlm_session_prefill(s, 0, ids, 6, NULL, 0));
        for (int i = 6; i < n; i++) CHECK_OK(tlm_session_decode_one(s, ids[i], NULL));
        size_t bytes = tlm_session_prefix_bytes(s, n);
        uint8_t *buf = malloc(bytes);
        CHECK_OK(tlm_session_save_prefix(s, 0, n, buf));
        tlm_session_free(s);
        if (!k) {
            f32 = (float *)buf, f32_bytes = bytes;
            continue;
        }
        CHECK(bytes * di->block_elems * 4 == f32_bytes * di->block_bytes, "%s prefix bytes %zu",
              tlm_dtype_name(t), bytes);
        size_t qbytes = elems / di->block_elems * di->block_bytes;
        uint8_t *want = malloc(qbytes);
        if (t == TLM_DTYPE_Q8_0)
            k_q8_0_blocks_ref(f32, want, (int)elems);
        else
            core_dtype_from_f32(t, f32, want, elems);
        CHECK(!memcmp(want, buf, qbytes), "layer 0's %s keys and values differ from the reference",
              tlm_dtype_name(t));
        /* and they are the F32 cache's values rounded: widened back, close but not equal */
        core_dtype_to_f32(t, buf, back, elems);
        double worst = 0;
        for (size_t i = 0; i < elems; i++) worst = fmax(worst, fabs(back[i] - f32[i]));
        CHECK(worst > 0 && worst < 1.0, "%s rounding %g", tlm_dtype_name(t), worst);
        printf("%s cache: layer 0 stored as the reference quantizer's bytes (%zu), rounding "
               "%.2e\n",
               tlm_dtype_name(t), qbytes, worst);
        free(want);
        free(buf);
    }
    /* keys and values of two types: Q8_0 keys, Q4_0 values, each as its own reference */
    if (f32) {
        tlm_session_opts o = {
            .batch = 1, .kv_type = TLM_DTYPE_Q8_0, .v_type_set = 1, .v_type = TLM_DTYPE_Q4_0};
        tlm_session *s = NULL;
        CHECK_OK(tlm_session_new(m, &o, &s));
        if (s) {
            CHECK_OK(tlm_session_prefill(s, 0, ids, n, NULL, 0));
            size_t bytes = tlm_session_prefix_bytes(s, n), half = elems / 2;
            CHECK(bytes * 256 == f32_bytes * (34 + 18), "Q8_0 / Q4_0 prefix bytes %zu", bytes);
            uint8_t *buf = malloc(bytes), *want = malloc(half / 32 * (34 + 18));
            CHECK_OK(tlm_session_save_prefix(s, 0, n, buf));
            k_q8_0_blocks_ref(f32, want, (int)half);
            core_dtype_from_f32(TLM_DTYPE_Q4_0, f32 + half, want + half / 32 * 34, half);
            CHECK(!memcmp(want, buf, half / 32 * (34 + 18)),
                  "layer 0's Q8_0 keys and Q4_0 values differ from the references");
            free(buf);
            free(want);
            tlm_session_free(s);
        }
    }
    free(f32);
    free(back);
    tlm_model_free(m);
}

/* tlm_sampler_opts_defaults sets every field, the later ones (min_p, penalties) off: it used to
 * leave them as they were, so a sampler made from a stack struct (or tlm_sampler_new(NULL, ...))
 * read garbage penalties. */
static void test_sampler_defaults(void) {
    tlm_sampler_opts o;
    memset(&o, 0x5a, sizeof o);
    tlm_sampler_opts_defaults(&o);
    CHECK(o.temperature == 0.8f && o.top_k == 40 && o.top_p == 0.95f && o.seed == 0 &&
              o.stream == 0 && o.min_p == 0.0f && o.repeat_penalty == 0.0f &&
              o.presence_penalty == 0.0f && o.frequency_penalty == 0.0f && o.penalty_last_n == 0,
          "default sampler options");
    tlm_sampler *s = NULL;
    CHECK_OK(tlm_sampler_new(NULL, 10, &s));
    tlm_sampler_free(s);
    tlm_generate_opts g;
    memset(&g, 0x5a, sizeof g);
    tlm_generate_opts_defaults(&g);
    CHECK(g.max_new_tokens == 256 && g.eos_id == -1 && g.on_token == NULL && g.user == NULL &&
              g.sampling.temperature == 0.8f && g.sampling.top_k == 40 &&
              g.sampling.top_p == 0.95f && g.sampling.penalty_last_n == 0,
          "default generation options");
    tlm_forward_opts f;
    memset(&f, 0x5a, sizeof f);
    tlm_forward_opts_defaults(&f);
    CHECK(f.targets == NULL && f.pos_offset == 0 && f.want_probs == 0, "default forward options");
}

/* Values past a half's range (65504) become infinities in an F16 cache: the logits are then not
 * finite and sampling refuses them with TLM_ERR_NUMERIC (README: "--cache-type f32 is then the
 * way"), while an F32 cache holds the same values and gives finite logits. */
static void test_f16_overflow(void) {
    tlm_model *m = make_model("", 21);
    CHECK(m != NULL, "%s", tlm_last_error());
    if (!m) return;
    const tlm_tensor_info *v = tlm_model_find(m, "blk.0.attn_v.weight");
    CHECK(v != NULL, "blk.0.attn_v.weight");
    if (!v) return;
    float *w = tlm_model_params(m) + v->offset;
    for (size_t i = 0; i < v->numel; i++) w[i] *= 1e6f; /* values of about 1e6 */
    int V = tlm_model_config(m)->vocab_size;
    int32_t ids[6];
    random_ids(ids, 6, V, 5);
    float *logits = malloc((size_t)V * sizeof *logits);
    tlm_sampler_opts so;
    tlm_sampler_opts_defaults(&so);
    so.temperature = 0.0f;
    tlm_sampler *smp = NULL;
    CHECK_OK(tlm_sampler_new(&so, V, &smp));
    for (int f16 = 0; f16 < 2; f16++) {
        tlm_session_opts o = {.batch = 1, .kv_type = f16 ? TLM_DTYPE_F16 : TLM_DTYPE_F32};
        tlm_session *s = NULL;
        CHECK_OK(tlm_session_new(m, &o, &s));
        CHECK_OK(tlm_session_prefill(s, 0, ids, 6, logits, 0));
        int finite = 1;
        for (int i = 0; i < V; i++) finite &= isfinite(logits[i]) != 0;
        CHECK(finite == !f16, "%s cache: logits %s", f16 ? "F16" : "F32",
              finite ? "finite" : "not finite");
        int32_t id = -1;
        tlm_status st = tlm_sampler_sample(smp, logits, &id);
        CHECK(f16 ? st == TLM_ERR_NUMERIC : st == TLM_OK, "%s cache: sampling gave %d (%s)",
              f16 ? "F16" : "F32", (int)st, tlm_last_error());
        tlm_session_free(s);
    }
    tlm_sampler_free(smp);
    free(logits);
    tlm_model_free(m);
}

/* Decode steps fall back to one thread while the cores look shared with another process
 * (session.c, shared_team), which assumes what this checks: a prompt and decode steps give the
 * same logits bit for bit on one thread as on two, on a model whose products are big enough to be
 * split among threads (256 x 768 F32: past k_matvec_parts's threshold for a team). */
static void test_team_invariant(void) {
    variant v = {"", "\"d_ff\":768", 256, 4, 512};
    tlm_model *m = make_model_v(&v, 77);
    CHECK(m != NULL, "team model: %s", tlm_last_error());
    if (!m) return;
    int V = 512, steps = 6;
    int32_t ids[8];
    random_ids(ids, 8, V, 78);
    float *got[2];
    for (int t = 0; t < 2; t++) {
        tlm_threads_set(t ? 1 : 2);
        got[t] = malloc(sizeof(float) * V * (steps + 1));
        tlm_session *s = NULL;
        CHECK_OK(new_session(m, 1, 0, &s));
        if (!s || !got[t]) return;
        CHECK_OK(tlm_session_prefill(s, 0, ids, 4, got[t], 0));
        for (int k = 0; k < steps; k++)
            CHECK_OK(tlm_session_decode_one(s, ids[4 + k % 4], got[t] + (size_t)V * (k + 1)));
        tlm_session_free(s);
    }
    CHECK(!memcmp(got[0], got[1], sizeof(float) * V * (steps + 1)),
          "logits on one thread differ from two");
    printf("team invariant: prompt and %d decode steps bit for bit on 1 and 2 threads\n", steps);
    tlm_threads_set(2);
    free(got[0]);
    free(got[1]);
    tlm_model_free(m);
}

/* tlm_session_prefill_hidden: each row is its token's state whatever follows it (the row of a
 * shorter prompt's last token), the ids enter the cache as tlm_session_prefill's do (the next
 * logits are the same), and bad arguments are refused. */
static void test_prefill_hidden(void) {
    tlm_model *m = make_model("\"n_kv_heads\":2", 17);
    CHECK(m != NULL, "%s", tlm_last_error());
    if (!m) return;
    int V = tlm_model_config(m)->vocab_size, d = tlm_model_config(m)->d_model;
    int32_t ids[12];
    random_ids(ids, 12, V, 5);
    tlm_session *s = NULL, *t = NULL;
    CHECK_OK(new_session(m, 2, 16, &s));
    CHECK_OK(new_session(m, 1, 16, &t));
    float *h = malloc(12 * (size_t)d * sizeof *h), *one = malloc(12 * (size_t)d * sizeof *one);
    float *a = malloc((size_t)V * sizeof *a);
    CHECK_OK(tlm_session_prefill_hidden(s, 1, ids, 12, h));
    CHECK(tlm_session_length(s, 1) == 12 && tlm_session_length(s, 0) == 0, "lengths");
    double worst = 0, scale = 0;
    for (int k = 1; k <= 12; k++) {
        tlm_session_reset(t, 0);
        CHECK_OK(tlm_session_prefill_hidden(t, 0, ids, k, one));
        for (int j = 0; j < d; j++) {
            double x = h[(size_t)(k - 1) * d + j], y = one[(size_t)(k - 1) * d + j];
            worst = fmax(worst, fabs(x - y));
            scale = fmax(scale, fabs(x));
        }
    }
    /* a pre-norm model's rows are normalized: magnitudes about 1; sums in other orders (row
     * blocks, attention chunks) as test_invariant allows */
    CHECK(scale > 0.1 && worst <= 1e-4 * scale, "rows against shorter prompts: %g (scale %g)",
          worst, scale);
    tlm_session_reset(t, 0);
    CHECK_OK(tlm_session_prefill(t, 0, ids, 12, NULL, 0));
    CHECK_OK(tlm_session_decode_one(t, ids[3], a));
    int32_t step[2] = {0, ids[3]};
    uint8_t act[2] = {0, 1};
    float *ab = malloc(2 * (size_t)V * sizeof *ab);
    CHECK_OK(tlm_session_decode(s, step, act, ab));
    CHECK(!memcmp(a, ab + V, (size_t)V * sizeof *a), "the cache as tlm_session_prefill leaves it");
    CHECK(tlm_session_prefill_hidden(s, 1, ids, 4, h) == TLM_ERR_RANGE, "past the capacity");
    CHECK(tlm_session_prefill_hidden(s, 2, ids, 1, h) == TLM_ERR_ARG, "no sequence 2");
    CHECK(tlm_session_prefill_hidden(s, 0, ids, 1, NULL) == TLM_ERR_ARG, "NULL rows");
    CHECK(tlm_session_prefill_hidden(s, 0, ids, 0, h) == TLM_ERR_ARG, "no ids");
    int32_t far = V;
    CHECK(tlm_session_prefill_hidden(s, 0, &far, 1, h) == TLM_ERR_RANGE, "an id outside");
    CHECK(tlm_session_length(s, 0) == 0, "nothing cached by refusals");
    free(ab);
    free(a);
    free(h);
    free(one);
    tlm_session_free(s);
    tlm_session_free(t);
    tlm_model_free(m);
}

int main(void) {
    tlm_threads_set(2);
    test_team_invariant();
    /* keys' and values' types; all: every test, else the invariant on a few variants (the other
     * types share the plumbing of the first, and their kernels are test_qgemm's) */
    static const struct {
        tlm_dtype k, v;
        int all;
    } runs[] = {{TLM_DTYPE_F32, TLM_DTYPE_F32, 1},      {TLM_DTYPE_F16, TLM_DTYPE_F16, 1},
                {TLM_DTYPE_BF16, TLM_DTYPE_BF16, 1},    {TLM_DTYPE_Q8_0, TLM_DTYPE_Q8_0, 1},
                {TLM_DTYPE_Q8_0, TLM_DTYPE_Q4_0, 1},    {TLM_DTYPE_F16, TLM_DTYPE_Q5_1, 0},
                {TLM_DTYPE_Q5_1, TLM_DTYPE_Q5_1, 0},    {TLM_DTYPE_Q5_0, TLM_DTYPE_Q5_0, 0},
                {TLM_DTYPE_Q4_1, TLM_DTYPE_Q4_1, 0},    {TLM_DTYPE_Q4_0, TLM_DTYPE_Q4_0, 0},
                {TLM_DTYPE_IQ4_NL, TLM_DTYPE_IQ4_NL, 0}};
    for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
        kv_type = runs[k].k, v_type = runs[k].v;
        int blocks =
            core_dtype_get(kv_type)->block_elems > 1 || core_dtype_get(v_type)->block_elems > 1;
        base_d = blocks ? 128 : 32;
        if (kv_type == v_type)
            printf("---- %s cache ----\n", tlm_dtype_name(kv_type));
        else
            printf("---- %s keys, %s values ----\n", tlm_dtype_name(kv_type),
                   tlm_dtype_name(v_type));
        test_invariant(!runs[k].all);
        if (!runs[k].all) continue;
        test_long_prefill(0, 0.0f);
        test_long_prefill(50, 0.0f);
        test_long_prefill(0, 1.0f);
        test_batch_decode();
        test_prefix_save_load();
        test_prefill_hidden();
        test_mixed_step();
        test_ring(0);
        test_ring(2);
    }
    base_d = 32;
    kv_type = v_type = TLM_DTYPE_F32;
    test_kv_types();
    test_block_stores();
    test_f16_overflow();
    test_sampler_defaults();
    test_samplers();
    test_generate_loop();
    return t_finish("test_generate");
}
