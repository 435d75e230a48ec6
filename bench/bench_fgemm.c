/* Prefill's products on F32 and F16 weights: k_fgemm (register tiles, F16 rows widened a block at
 * a time) against OpenBLAS sgemm (F16 through widened tiles, as before k_fgemm), on the shapes of
 * a 110M llama2.c model's prompt chunks and of training steps. Best of REPS, GFLOP/s.
 *   bench_fgemm [THREADS=2] [REPS=12]   (unset OPENBLAS_CORETYPE for OpenBLAS's AVX-512 kernels) */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "core/half.h"
#include "kernels/kernels.h"
#include "kernels/matvec.h"
#include "kernels/qdot.h"
#include "kernels/qgemm.h"
#include "tlm.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    static const int shapes[][3] = {{128, 768, 2304}, {128, 2048, 768},  {128, 768, 32000},
                                    {512, 768, 2048}, {2048, 768, 2304}, {8192, 768, 768},
                                    {768, 512, 128},  {768, 128, 384}};
    int threads = argc > 1 ? atoi(argv[1]) : 2, reps = argc > 2 ? atoi(argv[2]) : 12;
    tlm_threads_set(threads);
    const char *core = getenv("OPENBLAS_CORETYPE");
    printf("threads %d, GFLOP/s (best of %d), OPENBLAS_CORETYPE=%s\n", threads, reps,
           core ? core : "unset");
    printf("    N    in   out | F32 sgemm  fgemm ratio | F16 tiles+sgemm  fgemm ratio\n");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int N = shapes[s][0], in = shapes[s][1], out = shapes[s][2];
        float *x = malloc(sizeof(float) * N * in), *y = malloc(sizeof(float) * N * out);
        float *w = malloc(sizeof(float) * in * out);
        uint16_t *h = malloc(2 * (size_t)in * out);
        if (!x || !y || !w || !h) return 1;
        for (long i = 0; i < (long)N * in; i++) x[i] = (float)((double)rand() / RAND_MAX) - 0.5f;
        for (long i = 0; i < (long)in * out; i++) {
            w[i] = (float)((double)rand() / RAND_MAX) - 0.5f;
            h[i] = core_f32_to_f16(w[i]);
        }
        tlm_weight tf = {.dtype = TLM_DTYPE_F32,
                         .data = w,
                         .rows = out,
                         .cols = in,
                         .row_bytes = 4 * (size_t)in};
        tlm_weight th = {.dtype = TLM_DTYPE_F16,
                         .data = h,
                         .rows = out,
                         .cols = in,
                         .row_bytes = 2 * (size_t)in};
        double best[4] = {1e9, 1e9, 1e9, 1e9};
        for (int r = 0; r < reps; r++)
            for (int m = 0; m < 4; m++) {
                double t0 = now();
                if (m == 0) k_linear_fwd(y, out, x, w, NULL, N, in, out);
                if (m == 1 && k_fgemm(y, out, x, N, &tf, NULL)) return 1;
                if (m == 2) { /* k_linear's path before k_fgemm, as K_PREFILL_SGEMM keeps it */
                    k_prefill_path was = k_linear_prefill(K_PREFILL_SGEMM);
                    k_linear(y, out, x, N, &th, NULL);
                    k_linear_prefill(was);
                }
                if (m == 3 && k_fgemm(y, out, x, N, &th, NULL)) return 1;
                double t = now() - t0;
                best[m] = t < best[m] ? t : best[m];
            }
        double g = 2.0 * N * in * out / 1e9;
        printf("%5d %5d %5d | %9.1f %6.1f %5.2f | %15.1f %6.1f %5.2f\n", N, in, out, g / best[0],
               g / best[1], best[0] / best[1], g / best[2], g / best[3], best[2] / best[3]);
        free(x), free(y), free(w), free(h);
    }
    return 0;
}
