/* Read bandwidth for the decode bound of bench/quant/run.sh: a buffer of BYTES (the weights' size,
 * so that what the last-level cache keeps between steps counts in the bound as it does in
 * decoding), read again and again by THREADS threads, four streams each (as the matrix-vector
 * kernels read four weight rows). Prints the best of REPS passes in bytes per second.
 *   readbw BYTES THREADS REPS */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: readbw BYTES THREADS REPS\n");
        return 2;
    }
    size_t n = (size_t)atoll(argv[1]) / sizeof(float);
    int threads = atoi(argv[2]), reps = atoi(argv[3]);
    float *buf = malloc(n * sizeof(float));
    if (!buf) return 1;
    for (size_t i = 0; i < n; i++) buf[i] = (float)(i & 7);
    omp_set_num_threads(threads);
    double best = 0;
    float sink = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        float total = 0;
#pragma omp parallel reduction(+ : total)
        {
            int nt = omp_get_num_threads(), me = omp_get_thread_num();
            size_t per = n / (size_t)nt / 64 * 64, len = per / 4;
            const float *a = buf + per * (size_t)me;
            float acc[4][16] = {{0}};
            for (size_t i = 0; i + 16 <= len; i += 16)
                for (int k = 0; k < 4; k++)
#pragma omp simd
                    for (int j = 0; j < 16; j++) acc[k][j] += a[k * len + i + j];
            for (int k = 0; k < 4; k++)
                for (int j = 0; j < 16; j++) total += acc[k][j];
        }
        double bw = (double)n * sizeof(float) / (now_s() - t0);
        best = bw > best ? bw : best;
        sink += total;
    }
    printf("%.6e\n", best);
    free(buf);
    return sink == -1.0f; /* keeps the sums alive */
}
