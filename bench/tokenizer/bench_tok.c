/* Tokenizer benchmark driver (built by bench/tokenizer/run.sh against libtlm.a).
 *   bench_tok encode TOKENIZER FILE REPS [IDS_OUT]  -> best-of-REPS encode time, MB/s
 *   bench_tok train FILE VOCAB [SPECIAL]            -> seconds to train a BPE
 * Prints one JSON object per run on stdout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tlm.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)sz + 1);
    *n = fread(buf, 1, (size_t)sz, f);
    fclose(f);
    return buf;
}

int main(int argc, char **argv) {
    if (argc >= 5 && !strcmp(argv[1], "encode")) {
        tlm_tokenizer *t;
        double t0 = now();
        if (tlm_tokenizer_load(argv[2], &t)) {
            fprintf(stderr, "bench_tok: %s\n", tlm_last_error());
            return 1;
        }
        double load_s = now() - t0;
        size_t n;
        char *text = slurp(argv[3], &n);
        if (!text) return 1;
        int reps = atoi(argv[4]);
        double best = 1e30;
        int32_t *ids = NULL;
        size_t k = 0;
        for (int r = 0; r < reps; r++) {
            free(ids);
            double s = now();
            if (tlm_tokenizer_encode(t, text, n, TLM_ENCODE_ALLOW_SPECIAL, &ids, &k)) {
                fprintf(stderr, "bench_tok: %s\n", tlm_last_error());
                return 1;
            }
            double e = now() - s;
            if (e < best) best = e;
        }
        if (argc >= 6) {
            FILE *f = fopen(argv[5], "w");
            for (size_t i = 0; i < k; i++) fprintf(f, i ? " %d" : "%d", ids[i]);
            fputc('\n', f);
            fclose(f);
        }
        printf("{\"impl\": \"tlm\", \"bytes\": %zu, \"tokens\": %zu, \"seconds\": %.6f, "
               "\"mb_per_s\": %.2f, \"load_seconds\": %.4f}\n",
               n, k, best, (double)n / 1e6 / best, load_s);
        free(ids);
        free(text);
        tlm_tokenizer_free(t);
        return 0;
    }
    if (argc >= 4 && !strcmp(argv[1], "train")) {
        const char *sp[1] = {argc >= 5 ? argv[4] : NULL};
        tlm_bpe_train_opts o = {0};
        o.vocab_size = atoi(argv[3]);
        o.specials = sp;
        o.n_specials = argc >= 5;
        const char *files[1] = {argv[2]};
        tlm_tokenizer *t;
        double s = now();
        if (tlm_tokenizer_train_bpe(files, 1, &o, &t)) {
            fprintf(stderr, "bench_tok: %s\n", tlm_last_error());
            return 1;
        }
        double e = now() - s;
        size_t n;
        char *text = slurp(argv[2], &n);
        printf("{\"impl\": \"tlm\", \"task\": \"train\", \"bytes\": %zu, \"vocab\": %d, "
               "\"threads\": %d, \"seconds\": %.4f, \"mb_per_s\": %.2f}\n",
               n, tlm_tokenizer_vocab_size(t), tlm_threads_get(), e, (double)n / 1e6 / e);
        free(text);
        tlm_tokenizer_free(t);
        return 0;
    }
    fprintf(stderr, "usage: bench_tok encode TOKENIZER FILE REPS [IDS_OUT] | train FILE VOCAB "
                    "[SPECIAL]\n");
    return 2;
}
