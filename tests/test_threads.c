/* One model shared by several callers: two generation sessions (and two training contexts) on the
 * same model in two threads give bit-identical results to running them one after the other. The
 * model is read-only once loaded; everything a pass writes belongs to the caller's session or
 * context. Run under ThreadSanitizer by .ci/run (make tsan). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "tlm.h"

enum { PROMPT = 9, STEPS = 20 };

typedef struct {
    const tlm_model *m;
    int32_t prompt[PROMPT];
    float *out; /* [(STEPS + 1) * V] logits after the prompt and after every decode step */
    int32_t ids[STEPS];
    tlm_status st;
    char err[256];
} gen_job;

static void *gen_run(void *arg) {
    gen_job *j = arg;
    const tlm_config *c = tlm_model_config(j->m);
    size_t V = (size_t)c->vocab_size;
    tlm_session *s = NULL;
    j->st = tlm_session_new(j->m, NULL, &s);
    if (!j->st) j->st = tlm_session_prefill(s, 0, j->prompt, PROMPT, j->out, 0);
    for (int t = 0; t < STEPS && !j->st; t++) {
        /* greedy: the argmax of the last logits */
        const float *l = j->out + (size_t)t * V;
        int32_t best = 0;
        for (size_t i = 1; i < V; i++)
            if (l[i] > l[best]) best = (int32_t)i;
        j->ids[t] = best;
        j->st = tlm_session_decode_one(s, best, j->out + (size_t)(t + 1) * V);
    }
    if (j->st) snprintf(j->err, sizeof j->err, "%s", tlm_last_error());
    tlm_session_free(s);
    return NULL;
}

typedef struct {
    const tlm_model *m;
    int32_t ids[2 * 16], tg[2 * 16];
    float *grads;
    float loss, eval_loss;
    tlm_status st;
    char err[256];
} train_job;

static void *train_run(void *arg) {
    train_job *j = arg;
    tlm_train_ctx *x = NULL;
    j->st = tlm_train_ctx_new(j->m, &x);
    if (!j->st)
        j->st = tlm_train_ctx_forward_backward(x, j->ids, j->tg, 2, 16, 0, j->grads, 0, &j->loss);
    tlm_forward_opts o = {.targets = j->tg};
    tlm_forward_out out;
    if (!j->st) j->st = tlm_train_ctx_forward(x, j->ids, 2, 16, &o, &out);
    if (!j->st) j->eval_loss = out.loss;
    if (j->st) snprintf(j->err, sizeof j->err, "%s", tlm_last_error());
    tlm_train_ctx_free(x);
    return NULL;
}

/* Runs fn on a and b in two threads, one after the other (seq) or at the same time. */
static void run_two(void *(*fn)(void *), void *a, void *b, int seq) {
    pthread_t ta, tb;
    pthread_create(&ta, NULL, fn, a);
    if (seq) pthread_join(ta, NULL);
    pthread_create(&tb, NULL, fn, b);
    if (!seq) pthread_join(ta, NULL);
    pthread_join(tb, NULL);
}

static void test_sessions(const tlm_model *m, const char *what) {
    size_t V = (size_t)tlm_model_config(m)->vocab_size, n = (STEPS + 1) * V;
    gen_job a[2], b[2];
    for (int k = 0; k < 2; k++) {
        memset(&a[k], 0, sizeof a[k]);
        memset(&b[k], 0, sizeof b[k]);
        a[k].m = b[k].m = m;
        for (int i = 0; i < PROMPT; i++) {
            a[k].prompt[i] = (int32_t)((i * 31 + 5) % (int)V);
            b[k].prompt[i] = (int32_t)((i * 17 + 2) % (int)V);
        }
        a[k].out = calloc(n, sizeof(float));
        b[k].out = calloc(n, sizeof(float));
    }
    run_two(gen_run, &a[0], &b[0], 1);
    run_two(gen_run, &a[1], &b[1], 0);
    for (int k = 0; k < 2; k++) {
        CHECK(a[k].st == TLM_OK && b[k].st == TLM_OK, "%s: %s %s", what, a[k].err, b[k].err);
    }
    CHECK(!memcmp(a[0].out, a[1].out, n * sizeof(float)) &&
              !memcmp(a[0].ids, a[1].ids, sizeof a[0].ids),
          "%s: session A differs when B runs beside it", what);
    CHECK(!memcmp(b[0].out, b[1].out, n * sizeof(float)) &&
              !memcmp(b[0].ids, b[1].ids, sizeof b[0].ids),
          "%s: session B differs when A runs beside it", what);
    /* The two prompts lead to different text: the comparison above is not of equal streams. */
    CHECK(memcmp(a[0].ids, b[0].ids, sizeof a[0].ids) != 0, "%s: A and B generated the same", what);
    printf("  %s: two sessions in two threads == one after the other (%d tokens each)\n", what,
           STEPS);
    for (int k = 0; k < 2; k++) {
        free(a[k].out);
        free(b[k].out);
    }
}

static void test_contexts(const tlm_model *m, const char *what) {
    size_t np = tlm_model_num_params(m);
    int V = tlm_model_config(m)->vocab_size;
    train_job a[2], b[2];
    for (int k = 0; k < 2; k++) {
        memset(&a[k], 0, sizeof a[k]);
        memset(&b[k], 0, sizeof b[k]);
        a[k].m = b[k].m = m;
        for (int i = 0; i < 32; i++) {
            a[k].ids[i] = (i * 7 + 1) % V;
            a[k].tg[i] = (i * 5 + 3) % V;
            b[k].ids[i] = (i * 11 + 2) % V;
            b[k].tg[i] = (i * 3 + 4) % V;
        }
        a[k].grads = malloc(np * sizeof(float));
        b[k].grads = malloc(np * sizeof(float));
    }
    run_two(train_run, &a[0], &b[0], 1);
    run_two(train_run, &a[1], &b[1], 0);
    for (int k = 0; k < 2; k++)
        CHECK(a[k].st == TLM_OK && b[k].st == TLM_OK, "%s: %s %s", what, a[k].err, b[k].err);
    CHECK(a[0].loss == a[1].loss && a[0].eval_loss == a[1].eval_loss &&
              !memcmp(a[0].grads, a[1].grads, np * sizeof(float)),
          "%s: context A differs when B runs beside it", what);
    CHECK(b[0].loss == b[1].loss && b[0].eval_loss == b[1].eval_loss &&
              !memcmp(b[0].grads, b[1].grads, np * sizeof(float)),
          "%s: context B differs when A runs beside it", what);
    CHECK(a[0].loss != b[0].loss, "%s: A and B computed the same loss", what);
    printf("  %s: two training contexts in two threads == one after the other\n", what);
    for (int k = 0; k < 2; k++) {
        free(a[k].grads);
        free(b[k].grads);
    }
}

int main(void) {
    printf("one model, two callers:\n");
    tlm_config c;
    CHECK_OK(tlm_config_from_json("{\"vocab_size\":97,\"context_length\":48,\"d_model\":64,"
                                  "\"n_layers\":2,\"n_heads\":4,\"n_kv_heads\":2,\"dropout\":0.1}",
                                  &c));
    tlm_model *m = NULL;
    CHECK_OK(tlm_model_new(&c, &m));
    if (m) {
        CHECK_OK(tlm_model_init(m, 5, TLM_INIT_XAVIER));
        test_sessions(m, "created model");
        test_contexts(m, "created model");
        tlm_model_free(m);
    }
    /* A model used in place from its file (read-only memory map). */
    const char *dir = t_shared_data();
    CHECK(dir != NULL, "../shared/data is missing (needed for stories260K.bin)");
    if (dir) {
        tlm_model *f = NULL;
        CHECK_OK(tlm_model_load(t_path(dir, "models/stories260K.bin"), 0, &f));
        if (f) {
            size_t mapped = 0, owned = 0;
            tlm_model_memory(f, &mapped, &owned);
            CHECK(tlm_model_params(f) == NULL && mapped == tlm_model_num_params(f) * 4,
                  "stories260K.bin is used in place (mapped %zu bytes)", mapped);
            test_sessions(f, "mapped stories260K.bin");
            test_contexts(f, "mapped stories260K.bin");
            tlm_model_free(f);
        }
    }
    return t_finish("test_threads");
}
