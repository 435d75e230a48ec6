/* Generation speed of libtlm on a random model of a given config: prefill tok/s (one batched pass
 * over a prompt) and decode tok/s (one token per step through the KV cache), plus the machine's
 * read bandwidth measured here, which bounds decoding: every step streams all the weights.
 *
 * usage: bench_gen CONFIG_JSON THREADS PROMPT_LEN DECODE_STEPS REPS */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/core.h"
#include "tlm.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Read bandwidth of the decode step's access pattern: a buffer the size of the weights, read
 * again and again by the same threads, each thread reading four streams at once (as k_matvec reads
 * four weight rows), in huge pages like the weights. A buffer of the weights' size (rather than
 * one far larger than the caches) keeps whatever part of the weights the last-level cache retains
 * between steps in the bound as well as in the measurement. */
static float *bw_buf;
static size_t bw_floats;

static double read_bandwidth(void) {
    double t0 = now_s();
    float total = 0;
#pragma omp parallel reduction(+ : total)
    {
        int nt = omp_get_num_threads(), me = omp_get_thread_num();
        size_t per = bw_floats / (size_t)nt / 64 * 64, len = per / 4;
        const float *a = bw_buf + per * (size_t)me;
        float acc[4][16] = {{0}};
        for (size_t i = 0; i + 16 <= len; i += 16)
            for (int k = 0; k < 4; k++)
#pragma omp simd
                for (int j = 0; j < 16; j++) acc[k][j] += a[k * len + i + j];
        for (int k = 0; k < 4; k++)
            for (int j = 0; j < 16; j++) total += acc[k][j];
    }
    double dt = now_s() - t0;
    static volatile float sink;
    sink = total;
    return (double)bw_floats * sizeof(float) / dt;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: bench_gen CONFIG_JSON THREADS PROMPT_LEN DECODE_STEPS REPS\n");
        return 2;
    }
    int threads = atoi(argv[2]), plen = atoi(argv[3]), steps = atoi(argv[4]), reps = atoi(argv[5]);
    tlm_threads_set(threads);
    tlm_config c;
    tlm_model *m = NULL;
    tlm_session *s = NULL;
    if (tlm_config_load(argv[1], &c) || tlm_model_new(&c, &m) ||
        tlm_model_init(m, 1, TLM_INIT_GPT2) || tlm_session_new(m, NULL, &s)) {
        fprintf(stderr, "bench_gen: %s\n", tlm_last_error());
        return 1;
    }
    if (plen + 1 > c.context_length || 1 + steps > c.context_length) {
        fprintf(stderr, "bench_gen: prompt or steps exceed context_length %d\n", c.context_length);
        return 1;
    }
    size_t V = (size_t)c.vocab_size, n_params = tlm_model_num_params(m);
    float *logits = malloc(V * sizeof(float));
    int32_t *ids = malloc((size_t)plen * sizeof(int32_t));
    for (int i = 0; i < plen; i++) ids[i] = (int32_t)((i * 7919) % c.vocab_size);

    bw_floats = (n_params + 4095) / 4096 * 4096;
    bw_buf = core_big_alloc(bw_floats * sizeof(float));
    if (!bw_buf) return 1;
    for (size_t i = 0; i < bw_floats; i++) bw_buf[i] = (float)(i & 7);
    /* Bandwidth is sampled in every rep, next to the timings it bounds: on a shared machine both
     * see the same load. */
    double bw = 0, best_prefill = 0, best_decode = 0;
    for (int r = 0; r < reps + 1; r++) { /* first rep warms pages and threads, not counted */
        tlm_session_reset(s, -1);
        double t0 = now_s();
        if (tlm_session_prefill(s, 0, ids, plen, logits, 0)) {
            fprintf(stderr, "bench_gen: %s\n", tlm_last_error());
            return 1;
        }
        double tp = now_s() - t0;
        tlm_session_reset(s, -1);
        if (tlm_session_prefill(s, 0, ids, 1, logits, 0)) return 1;
        int32_t id = ids[0];
        t0 = now_s();
        for (int k = 0; k < steps; k++) {
            /* Greedy feedback keeps the work real without sampler cost. */
            int32_t best = 0;
            for (size_t j = 1; j < V; j++) best = logits[j] > logits[best] ? (int32_t)j : best;
            id = best;
            if (tlm_session_decode_one(s, id, logits)) {
                fprintf(stderr, "bench_gen: %s\n", tlm_last_error());
                return 1;
            }
        }
        double td = now_s() - t0;
        if (r == 0) continue;
        for (int k = 0; k < 3; k++) {
            double b = read_bandwidth();
            bw = b > bw ? b : bw;
        }
        if (plen / tp > best_prefill) best_prefill = plen / tp;
        if (steps / td > best_decode) best_decode = steps / td;
    }
    double bytes = (double)n_params * sizeof(float);
    double bound = bw / bytes;
    printf("tlm  params %.1fM  weights %.0f MB  read bandwidth %.1f GB/s (%d threads)  "
           "decode bound %.1f tok/s\n",
           n_params / 1e6, bytes / 1e6, bw / 1e9, threads, bound);
    printf("tlm  prefill %d tokens: %.1f tok/s   decode %d steps: %.1f tok/s (%.0f%% of bound)\n",
           plen, best_prefill, steps, best_decode, 100.0 * best_decode / bound);
    printf("RESULT tlm prefill=%.2f decode=%.2f bandwidth=%.3e bound=%.2f\n", best_prefill,
           best_decode, bw, bound);
    core_big_free(bw_buf, bw_floats * sizeof(float));
    free(ids);
    free(logits);
    tlm_session_free(s);
    tlm_model_free(m);
    return 0;
}
