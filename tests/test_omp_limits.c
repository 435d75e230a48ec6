/* Training and evaluation when OpenMP gives a parallel region fewer threads than asked for:
 * OMP_THREAD_LIMIT, OMP_DYNAMIC (fewer threads while the machine is loaded), nesting.
 *
 * Two places assume the whole team arrives. (1) model/replicas.c splits a batch across R replicas
 * in `#pragma omp parallel num_threads(R)`, one slice per thread number: with fewer threads,
 * slices are skipped and their unwritten status and loss are read. (2) OpenBLAS (OpenMP build)
 * partitions an sgemm for openblas_set_num_threads() threads and its parts wait for each other:
 * with fewer threads it spins forever (OpenMathLib/OpenBLAS#4418); tlm_threads_set(2) then hangs
 * the first large product of a whole-batch pass.
 *
 * Meant to run with OMP_THREAD_LIMIT=1 (deterministic: every region gets one thread while
 * omp_get_max_threads() still says 2) and with OMP_DYNAMIC=true (short teams only under load);
 * without either it passes, which checks the test itself. The reference is the whole batch on one
 * thread; the same step split across replicas, and the whole batch on two threads, must equal it
 * up to float summation order. An alarm turns a hang into a failure.
 *
 * Not registered with ctest yet (the file name keeps it out of tests/test_*.c): it fails until
 * both are handled. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "tlm.h"

enum { B = 4, T = 16, V = 29 };

static tlm_model *make_model(void) {
    tlm_config c;
    tlm_config_defaults(&c);
    c.vocab_size = V;
    c.context_length = T;
    c.d_model = 32;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    return t_model(&c, 11, TLM_INIT_XAVIER);
}

/* Largest |a - b| relative to the largest |b|. */
static double rel_diff(const float *a, const float *b, size_t n) {
    double worst = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        worst = e > worst ? e : worst;
        scale = fabs((double)b[i]) > scale ? fabs((double)b[i]) : scale;
    }
    return scale > 0 ? worst / scale : worst;
}

static void on_alarm(int sig) {
    static const char msg[] = "FAIL: hung for 60 s (a parallel region waiting for threads that "
                              "never came?)\n";
    (void)sig;
    ssize_t r = write(2, msg, sizeof msg - 1);
    (void)r;
    _exit(2);
}

/* Loss and gradient of one training step with the given threads and data-parallel mode. */
static tlm_status step(tlm_train_ctx *x, int threads, int mode, const int32_t *ids,
                       const int32_t *tg, float *grads, float *loss) {
    tlm_threads_set(threads);
    tlm_train_ctx_set_data_parallel(x, mode);
    size_t n = tlm_model_num_params(tlm_train_ctx_model(x));
    for (size_t i = 0; i < n; i++) grads[i] = NAN; /* a slice left out shows */
    *loss = NAN;
    return tlm_train_ctx_forward_backward(x, ids, tg, B, T, 0, grads, 0, loss);
}

static void test_step(tlm_train_ctx *m, const int32_t *ids, const int32_t *tg) {
    size_t n = tlm_model_num_params(tlm_train_ctx_model(m));
    float *whole = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
    float want, loss;
    CHECK_OK(step(m, 1, 0, ids, tg, whole, &want));
    CHECK(isfinite(want), "whole-batch loss on one thread %g", (double)want);
    /* Replicas first (1: always split; -1: the library's choice, which splits a model this
     * small), then the whole batch on two threads: the one that can hang. */
    const int modes[] = {1, -1, 0};
    for (int k = 0; k < 3; k++) {
        tlm_status s = step(m, 2, modes[k], ids, tg, got, &loss);
        CHECK(s == TLM_OK, "data_parallel %d: status %d: %s", modes[k], (int)s, tlm_last_error());
        CHECK(fabs((double)loss - want) <= 1e-5 * fabs((double)want),
              "data_parallel %d: loss %.9g, whole batch on one thread %.9g", modes[k], (double)loss,
              (double)want);
        double e = rel_diff(got, whole, n);
        CHECK(e <= 1e-5, "data_parallel %d: gradient differs from the one-thread step's by %g",
              modes[k], e);
    }
    free(whole);
    free(got);
}

/* Evaluation splits its batches across the same replicas. */
static void test_eval(tlm_train_ctx *m) {
    enum { N = 4096 };
    int32_t *toks = malloc(N * sizeof(int32_t));
    for (int i = 0; i < N; i++) toks[i] = (i * 7 + i / 5) % V;
    CHECK_OK(tlm_dataset_write_tokens("test_omp_limits.bin", toks, N, V));
    free(toks);
    tlm_dataset *d = NULL;
    CHECK_OK(tlm_dataset_load("test_omp_limits.bin", 0.5, &d));
    if (!d) return;
    tlm_threads_set(1);
    tlm_train_ctx_set_data_parallel(m, 0);
    double want = tlm_train_ctx_evaluate(m, d, TLM_SPLIT_VAL, B, T, 3, 5);
    CHECK(isfinite(want), "whole-batch evaluation %g", want);
    tlm_threads_set(2);
    tlm_train_ctx_set_data_parallel(m, 1);
    double got = tlm_train_ctx_evaluate(m, d, TLM_SPLIT_VAL, B, T, 3, 5);
    CHECK(fabs(got - want) <= 1e-5 * fabs(want), "split evaluation %.9g, whole batch %.9g", got,
          want);
    tlm_dataset_free(d);
    remove("test_omp_limits.bin");
}

int main(void) {
    const char *lim = getenv("OMP_THREAD_LIMIT"), *dyn = getenv("OMP_DYNAMIC");
    fprintf(stderr, "OMP_THREAD_LIMIT=%s OMP_DYNAMIC=%s\n", lim ? lim : "(unset)",
            dyn ? dyn : "(unset)");
    signal(SIGALRM, on_alarm);
    alarm(60);
    tlm_model *m = make_model();
    if (!m) return t_finish("test_omp_limits");
    int32_t ids[B * T], tg[B * T];
    for (int i = 0; i < B * T; i++) {
        ids[i] = (i * 5 + i / 7) % V;
        tg[i] = (i * 3 + 1) % V;
    }
    tlm_train_ctx *x = NULL;
    CHECK_OK(tlm_train_ctx_new(m, &x));
    if (x) {
        test_eval(x);
        test_step(x, ids, tg);
    }
    tlm_train_ctx_free(x);
    tlm_model_free(m);
    return t_finish("test_omp_limits");
}
