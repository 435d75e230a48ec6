/* Kernels inside OpenMP parallel regions run on worker threads whose stacks are small
 * (OMP_STACKSIZE, a few MiB by default), so nothing sized by the sequence length may live on the
 * stack. ctest runs this with OMP_STACKSIZE=88K (libgomp reads it at start-up), which leaves the
 * kernels about 28 KiB, and takes a training step at T = 4096, where one T-float array is 16 KiB:
 * a worker's stack overflow kills the process. The step must also give the loss and gradients of
 * the same step on one thread. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "tlm.h"

enum { T = 4096, B = 2 };

static tlm_model *make_model(void) {
    tlm_config c;
    tlm_config_defaults(&c);
    c.vocab_size = 11;
    c.context_length = T;
    c.d_model = 16;
    c.n_layers = 1;
    c.n_heads = 1;
    c.d_ff = 32;
    return t_model(&c, 5, TLM_INIT_XAVIER);
}

/* One training step's loss and gradient with the given threads and data-parallel mode. */
static float step(tlm_train_ctx *x, int threads, int data_parallel, const int32_t *ids,
                  const int32_t *tg, float *grads) {
    tlm_threads_set(threads);
    tlm_train_ctx_set_data_parallel(x, data_parallel);
    float loss = NAN;
    CHECK_OK(tlm_train_ctx_forward_backward(x, ids, tg, B, T, 0, grads, 0, &loss));
    return loss;
}

int main(void) {
    const char *ss = getenv("OMP_STACKSIZE");
    fprintf(stderr, "OMP_STACKSIZE=%s, T=%d\n", ss ? ss : "(unset)", T);
    tlm_model *m = make_model();
    if (!m) return t_finish("test_omp_stack");
    size_t n = tlm_model_num_params(m);
    tlm_train_ctx *x = NULL;
    CHECK_OK(tlm_train_ctx_new(m, &x));
    int32_t *ids = malloc(sizeof(int32_t) * B * T), *tg = malloc(sizeof(int32_t) * B * T);
    float *g1 = malloc(n * sizeof(float)), *g2 = malloc(n * sizeof(float));
    for (int i = 0; i < B * T; i++) {
        ids[i] = (i * 7 + i / 13) % 11;
        tg[i] = (i * 5 + 3) % 11;
    }
    float want = step(x, 1, 0, ids, tg, g1);
    CHECK(isfinite(want), "single-thread loss %g", (double)want);
    /* 0: every kernel parallel over rows or heads; 1: the batch split across replicas, each
     * running whole layers on its own thread. */
    for (int dp = 0; dp <= 1; dp++) {
        float got = step(x, 2, dp, ids, tg, g2);
        CHECK_NEAR(got, want, 1e-5);
        double worst = 0;
        for (size_t i = 0; i < n; i++) {
            double e = fabs((double)g2[i] - g1[i]) / (1e-6 + fabs((double)g1[i]));
            if (e > worst) worst = e;
        }
        CHECK(worst < 1e-3, "data_parallel %d: gradient relative error %g", dp, worst);
    }
    free(ids);
    free(tg);
    free(g1);
    free(g2);
    tlm_train_ctx_free(x);
    tlm_model_free(m);
    return t_finish("test_omp_stack");
}
