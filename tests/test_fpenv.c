/* Subnormal floats flushed to zero in tlm's computations (src/core/fpenv.c): on the calling thread
 * during a call (its own mode restored after), on the OpenMP workers that tlm's, OpenBLAS's and
 * oneDNN's products run on (even workers the caller's own OpenMP code started first), and on the
 * decode pool's threads. */
#include <omp.h>
#include <string.h>

#include "core/core.h"
#include "harness.h"
#include "kernels/kernels.h"
#include "tlm.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>

#define FLUSH 0x8040u /* MXCSR's FTZ and DAZ */

static void clear_mode(void) { _mm_setcsr(_mm_getcsr() & ~FLUSH); }

/* Each of the two units records its thread's mode and waits (up to a few seconds) for the other
 * to start, so that thread 0 cannot take both. */
static unsigned pool_mode[4];
static _Atomic int started;
static void record_mode(void *ctx, long a, long b) {
    (void)ctx, (void)a, (void)b;
    int t = k_team_thread();
    if (t >= 0 && t < 4) pool_mode[t] = _mm_getcsr();
    started++;
    double t0 = omp_get_wtime();
    while (started < 2 && omp_get_thread_limit() >= 2 && omp_get_wtime() - t0 < 5) {
    }
}

/* Every tensor zero, then: embedding rows of ones, norm gains one, the output norm's gain and the
 * head 1e-20. The blocks add nothing (their matrices are zero), so each logit is d_model products
 * 1e-20 x 1e-20 = 1e-40, a subnormal sum without flushing and exactly zero with it. */
static tlm_model *tiny_model(void) {
    tlm_config c;
    tlm_config_defaults(&c);
    c.vocab_size = 8;
    c.context_length = 16;
    c.d_model = 16;
    c.n_layers = 1;
    c.n_heads = 2;
    c.tie_embeddings = 0;
    CHECK_OK(tlm_config_finalize(&c));
    tlm_model *m = NULL;
    CHECK_OK(tlm_model_new(&c, &m));
    if (!m) return NULL;
    float *p = tlm_model_params(m);
    int n = 0;
    const tlm_tensor_info *t = tlm_model_tensors(m, &n);
    for (int i = 0; i < n; i++) {
        float v = 0.0f;
        if (!strcmp(t[i].name, "token_embd.weight")) v = 1.0f;
        if (strstr(t[i].name, "_norm.weight")) v = 1.0f;
        if (!strcmp(t[i].name, "output_norm.weight") || !strcmp(t[i].name, "output.weight"))
            v = 1e-20f;
        for (size_t j = 0; j < t[i].numel; j++) p[t[i].offset + j] = v;
    }
    return m;
}

/* LLVM's libomp (clang's OpenMP) hands the caller's MXCSR to its workers at every region
 * (KMP_INHERIT_FP_CONTROL): there a worker flushes exactly while the caller does, and keeps
 * nothing between regions. libgomp's workers keep their own mode, which tlm sets once. */
static int workers_inherit_mode(void) {
    unsigned saved = _mm_getcsr(), worker = 0;
    int team = 1;
    _mm_setcsr(saved | FLUSH);
#pragma omp parallel num_threads(2)
    {
        if (omp_get_thread_num() == 1) worker = _mm_getcsr();
        if (omp_get_thread_num() == 0) team = omp_get_num_threads();
    }
    _mm_setcsr(saved);
    return team == 2 && (worker & FLUSH) == FLUSH;
}

int main(void) {
    tlm_threads_set(2);
    /* The caller's own OpenMP code starts the workers first, without the mode. */
    clear_mode();
#pragma omp parallel num_threads(2)
    clear_mode();
    int inherit = workers_inherit_mode();
    unsigned before = _mm_getcsr();

    tlm_model *m = tiny_model();
    tlm_train_ctx *x = NULL;
    if (m) CHECK_OK(tlm_train_ctx_new(m, &x));
    if (x) {
        int32_t ids[16] = {0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7};
        tlm_forward_out out;
        CHECK_OK(tlm_train_ctx_forward(x, ids, 2, 8, NULL, &out));
        int zero = 0;
        for (int i = 0; i < 16 * 8; i++) zero += out.logits[i] == 0.0f;
        CHECK(zero == 16 * 8, "logits of products 1e-20 x 1e-20 flushed to zero: %d of %d (%g)",
              zero, 16 * 8, (double)out.logits[0]);
        /* the control bits (the low six are exception flags the products raise) */
        CHECK((_mm_getcsr() & ~0x3fu) == (before & ~0x3fu),
              "the caller's mode comes back: %#x, was %#x", _mm_getcsr(), before);
        unsigned worker = 0;
        int team = 1;
#pragma omp parallel num_threads(2)
        {
            if (omp_get_thread_num() == 1) worker = _mm_getcsr();
            if (omp_get_thread_num() == 0) team = omp_get_num_threads();
        }
        if (team == 2 && inherit)
            CHECK((worker & FLUSH) == 0, "the OpenMP worker has the caller's mode back: %#x",
                  worker);
        else if (team == 2)
            CHECK((worker & FLUSH) == FLUSH, "the OpenMP worker flushes: mode %#x", worker);
        else
            printf("no OpenMP worker under OMP_THREAD_LIMIT=%d: its check is skipped\n",
                   omp_get_thread_limit());
    }

    /* Decode's own pool: its threads set the mode when they start, whoever starts them. */
    clear_mode();
    int was = k_team_pool(1);
    k_team_units(2, 1, 1, record_mode, NULL);
    k_team_pool(was);
    if (omp_get_thread_limit() >= 2)
        CHECK((pool_mode[1] & FLUSH) == FLUSH, "the pool's thread flushes: mode %#x", pool_mode[1]);

    /* A session's decode step flushes too: the same model through the KV cache path. */
    tlm_session *s = NULL;
    if (m) CHECK_OK(tlm_session_new(m, NULL, &s));
    if (s) {
        float logits[8];
        CHECK_OK(tlm_session_prefill(s, 0, (const int32_t[]){1, 2, 3}, 3, logits, 0));
        CHECK_OK(tlm_session_decode_one(s, 4, logits));
        int zero = 0;
        for (int i = 0; i < 8; i++) zero += logits[i] == 0.0f;
        CHECK(zero == 8, "decode's logits flushed: %d of 8 (%g)", zero, (double)logits[0]);
        CHECK((_mm_getcsr() & FLUSH) == 0, "the caller's mode comes back after decode: %#x",
              _mm_getcsr());
    }
    tlm_session_free(s);
    tlm_train_ctx_free(x);
    tlm_model_free(m);
    return t_finish("test_fpenv");
}
#else
int main(void) { return t_finish("test_fpenv"); }
#endif
