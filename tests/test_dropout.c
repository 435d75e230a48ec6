/* Dropout: mask statistics, determinism, and the backward pass with dropout against finite
 * differences of the (deterministic, seeded) training loss. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "kernels/kernels.h"
#include "tlm.h"

static void test_masks(void) {
    size_t n = 1000000;
    float *x = malloc(n * 4), *y = malloc(n * 4), *z = malloc(n * 4);
    for (size_t i = 0; i < n; i++) x[i] = 1.0f;
    float p = 0.2f;
    k_dropout(y, x, n, p, k_dropout_key(7, 3, 1));
    size_t zeros = 0, scaled = 0;
    for (size_t i = 0; i < n; i++) {
        zeros += y[i] == 0.0f;
        scaled += fabsf(y[i] - 1.25f) < 1e-6f;
    }
    CHECK(zeros + scaled == n, "values are 0 or 1/(1-p)");
    /* Binomial(1e6, 0.2): sd 400; 5 sd is 0.002. */
    CHECK(fabs((double)zeros / n - p) < 0.002, "dropped fraction %.4f", (double)zeros / n);
    k_dropout(z, x, n, p, k_dropout_key(7, 3, 1));
    CHECK(memcmp(y, z, n * 4) == 0, "same key, same mask");
    k_dropout(z, x, n, p, k_dropout_key(7, 4, 1));
    size_t same = 0;
    for (size_t i = 0; i < n; i++) same += y[i] == z[i];
    /* Independent masks agree with probability 0.8^2 + 0.2^2 = 0.68. */
    CHECK(fabs((double)same / n - 0.68) < 0.003, "another step gives another mask (%.4f)",
          (double)same / n);
    free(x);
    free(y);
    free(z);
}

static float loss_at(tlm_train_ctx *x, const int32_t *ids, const int32_t *tg, int T, float *grads) {
    float loss;
    tlm_train_ctx_set_dropout_seed(x, 5, 11);
    CHECK_OK(tlm_train_ctx_forward_backward(x, ids, tg, 2, T, 0, grads, 0, &loss));
    return loss;
}

/* T > 64 runs attention in several query blocks (see attention.c). */
static void test_gradients(tlm_norm_position pos, int T) {
    tlm_config c;
    tlm_config_defaults(&c);
    c.vocab_size = 11;
    c.context_length = T;
    c.d_model = 16;
    c.n_layers = 2;
    c.n_heads = 2;
    c.dropout = 0.3f;
    c.norm_position = pos;
    c.position = TLM_POS_LEARNED;
    tlm_model *m = t_model(&c, 3, TLM_INIT_XAVIER);
    tlm_train_ctx *x = NULL;
    CHECK_OK(tlm_train_ctx_new(m, &x));
    int32_t ids[2 * 128], tg[2 * 128];
    for (int i = 0; i < 2 * T; i++) {
        ids[i] = (i * 7 + 3) % 11;
        tg[i] = (i * 5 + 1) % 11;
    }
    size_t np = tlm_model_num_params(m);
    float *g = malloc(np * 4), *scratch = malloc(np * 4), *P = tlm_model_params(m);
    float l0 = loss_at(x, ids, tg, T, g);
    /* Dropout changes the training loss but not evaluation. */
    tlm_forward_opts o = {.targets = tg};
    tlm_forward_out out;
    CHECK_OK(tlm_train_ctx_forward(x, ids, 2, T, &o, &out));
    CHECK(fabs(out.loss - l0) > 1e-3, "dropout has no effect on the training loss");
    int checked = 0, bad = 0;
    for (size_t k = 0; k < np; k += np / 60 + 1) {
        float keep = P[k];
        double eps = 1e-2;
        P[k] = keep + (float)eps;
        double lp = loss_at(x, ids, tg, T, scratch);
        P[k] = keep - (float)eps;
        double lm = loss_at(x, ids, tg, T, scratch);
        P[k] = keep;
        double fd = (lp - lm) / (2 * eps);
        if (fabs(fd - g[k]) > 2e-3 + 0.05 * fabs(fd)) {
            if (bad < 5) fprintf(stderr, "  param %zu: analytic %g, numeric %g\n", k, g[k], fd);
            bad++;
        }
        checked++;
    }
    CHECK(bad == 0, "%d of %d gradients disagree with finite differences (%s-norm, T %d)", bad,
          checked, pos == TLM_NORM_PRE ? "pre" : "post", T);
    free(g);
    free(scratch);
    tlm_train_ctx_free(x);
    tlm_model_free(m);
}

/* The dropout scratch of attention is per thread: a context first used with one thread and then
 * with more must grow it (it once kept the size of its first pass and wrote past it; ASan's
 * build sees such a write). The results equal a fresh context's. */
static void test_more_threads(void) {
    tlm_config c;
    tlm_config_defaults(&c);
    c.vocab_size = 19;
    c.context_length = 64;
    c.d_model = 32;
    c.n_layers = 1;
    c.n_heads = 4;
    c.dropout = 0.2f;
    tlm_model *m = t_model(&c, 2, TLM_INIT_XAVIER);
    tlm_train_ctx *x = NULL, *y = NULL;
    CHECK_OK(tlm_train_ctx_new(m, &x));
    CHECK_OK(tlm_train_ctx_new(m, &y));
    /* every thread on each operation: the attention kernel is where the scratch is shared out */
    tlm_train_ctx_set_data_parallel(x, 0);
    tlm_train_ctx_set_data_parallel(y, 0);
    int32_t ids[4 * 64], tg[4 * 64];
    for (int i = 0; i < 4 * 64; i++) {
        ids[i] = (i * 7 + 3) % 19;
        tg[i] = (i * 5 + 1) % 19;
    }
    size_t np = tlm_model_num_params(m);
    float *g1 = malloc(np * 4), *g2 = malloc(np * 4), l1, l2;
    tlm_threads_set(1);
    tlm_train_ctx_set_dropout_seed(x, 1, 1);
    CHECK_OK(tlm_train_ctx_forward_backward(x, ids, tg, 4, 64, 0, g1, 0, &l1));
    tlm_threads_set(2);
    tlm_train_ctx_set_dropout_seed(x, 1, 2);
    tlm_train_ctx_set_dropout_seed(y, 1, 2);
    CHECK_OK(tlm_train_ctx_forward_backward(x, ids, tg, 4, 64, 0, g1, 0, &l1));
    CHECK_OK(tlm_train_ctx_forward_backward(y, ids, tg, 4, 64, 0, g2, 0, &l2));
    CHECK(l1 == l2 && !memcmp(g1, g2, np * 4),
          "a context that gained threads differs from a fresh one (%g vs %g)", l1, l2);
    free(g1);
    free(g2);
    tlm_train_ctx_free(x);
    tlm_train_ctx_free(y);
    tlm_model_free(m);
}

int main(void) {
    tlm_threads_set(2);
    test_masks();
    test_more_threads();
    test_gradients(TLM_NORM_PRE, 8);
    test_gradients(TLM_NORM_POST, 8);
    test_gradients(TLM_NORM_PRE, 100);
    return t_finish("test_dropout");
}
