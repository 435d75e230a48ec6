/* Model throughput: forward tokens/s or training-step tokens/s on random tokens, for a config
 * given as JSON text. Prints one JSON line; the median of the timed iterations is reported. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/core.h"
#include "tlm.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: bench_model forward|train CONFIG_JSON B T ITERS THREADS\n");
        return 2;
    }
    const char *mode = argv[1];
    int B = atoi(argv[3]), T = atoi(argv[4]), iters = atoi(argv[5]), threads = atoi(argv[6]);
    tlm_threads_set(threads);
    tlm_config c;
    if (tlm_config_from_json(argv[2], &c)) {
        fprintf(stderr, "config: %s\n", tlm_last_error());
        return 1;
    }
    tlm_model *m;
    if (tlm_model_new(&c, &m) || tlm_model_init(m, 1, TLM_INIT_GPT2)) {
        fprintf(stderr, "%s\n", tlm_last_error());
        return 1;
    }
    tlm_train_ctx *x = NULL;
    if (tlm_train_ctx_new(m, &x)) {
        fprintf(stderr, "%s\n", tlm_last_error());
        return 1;
    }
    /* TLM_DATA_PARALLEL=0|1 overrides the automatic choice, to compare the two. */
    const char *dp = getenv("TLM_DATA_PARALLEL");
    if (dp) tlm_train_ctx_set_data_parallel(x, atoi(dp));
    /* PRECISION=fp32|bf16 (default fp32): the products' arithmetic (tlm train --precision). */
    tlm_precision prec = TLM_PRECISION_FP32;
    const char *ps = getenv("PRECISION");
    if ((ps && tlm_precision_parse(ps, &prec)) || tlm_train_ctx_set_precision(x, prec)) {
        fprintf(stderr, "%s\n", tlm_last_error());
        return 1;
    }
    size_t N = (size_t)B * T, np = tlm_model_num_params(m);
    int32_t *ids = malloc(N * 4), *tg = malloc(N * 4);
    srand(1);
    for (size_t i = 0; i < N; i++) {
        ids[i] = rand() % c.vocab_size;
        tg[i] = rand() % c.vocab_size;
    }
    int train = !strcmp(mode, "train");
    /* tlm train's own allocator (zeroed, on 2 MiB pages): from calloc's 4 KiB pages the
     * backward's dW products and AdamW ran slower here than in tlm train. */
    size_t gbytes = np * sizeof(float);
    float *grads = train ? core_big_alloc(gbytes) : NULL;
    tlm_adamw *opt = NULL;
    tlm_adamw_opts h;
    tlm_adamw_opts_defaults(&h);
    if (train) tlm_adamw_new(m, &opt);
    double *t = malloc((size_t)(iters + 2) * sizeof *t);
    for (int i = 0; i < iters + 2; i++) {
        double t0 = now_s();
        float loss;
        tlm_status s;
        if (train) {
            s = tlm_train_ctx_forward_backward(x, ids, tg, B, T, 0, grads, 0, &loss);
            /* As tlm train steps: the clipping factor goes into the update (one pass over the
             * gradient fewer than clipping in place). */
            float scale = s ? 1.0f : tlm_grad_clip_coef(tlm_grad_norm(grads, np), 1.0);
            if (!s) s = tlm_adamw_step_scaled(opt, m, grads, scale, 1e-4, &h);
        } else {
            tlm_forward_opts o = {.targets = tg};
            tlm_forward_out out;
            s = tlm_train_ctx_forward(x, ids, B, T, &o, &out);
        }
        if (s) {
            fprintf(stderr, "%s\n", tlm_last_error());
            return 1;
        }
        t[i] = now_s() - t0;
    }
    /* The first two iterations warm caches and page tables; they are not reported. */
    qsort(t + 2, (size_t)iters, sizeof *t, cmp);
    double med = t[2 + iters / 2];
    printf("{\"impl\": \"tlm\", \"mode\": \"%s\", \"tokens_per_s\": %.1f, \"median_s\": %.5f, "
           "\"params\": %zu, \"threads\": %d, \"precision\": \"%s\"}\n",
           mode, (double)N / med, med, np, threads, tlm_precision_name(prec));
    tlm_adamw_free(opt);
    tlm_train_ctx_free(x);
    core_big_free(grads, gbytes);
    free(ids);
    free(tg);
    free(t);
    tlm_model_free(m);
    return 0;
}
