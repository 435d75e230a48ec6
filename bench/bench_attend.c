/* Decode attention over the KV cache: one query per head against S cached positions, for all 144
 * heads of a 110M llama2.c model (12 layers x 12 heads, head size 64), that is one token's
 * attention, on one thread. k_attend_row on an F16 cache (halves widened as they are loaded) and
 * on a Q8_0 one (bytes widened and scaled) against the same kernel on an F32 cache; the caches are
 * 10-151 MiB, so past a few hundred positions they stream from memory. Best of REPS passes,
 * alternating; GB/s of cache read.
 *   bench_attend [REPS=9]   (needs AVX-512: k_attend_row refuses elsewhere) */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kernels/kernels.h"
#include "kernels/qdot.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    enum { H = 144, HD = 64 };
    static const int lens[] = {128, 512, 1024, 2048};
    int reps = argc > 1 ? atoi(argv[1]) : 9;
    if (reps < 1) reps = 1;
    printf("one token of 110M (144 heads, hd 64), 1 thread, best of %d\n", reps);
    printf("%6s | %10s %6s | %10s %6s %6s | %10s %6s %6s\n", "S", "F32 ms/tok", "GB/s",
           "F16 ms/tok", "GB/s", "x F32", "Q8_0 ms", "GB/s", "x F32");
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        int S = lens[li];
        size_t n = (size_t)H * S * HD;
        float *K = malloc(n * sizeof(float)), *V = malloc(n * sizeof(float));
        uint16_t *Kh = malloc(n * 2), *Vh = malloc(n * 2);
        size_t qb = n / 32 * 34; /* Q8_0: 34 bytes per 32 elements */
        uint8_t *Kq = malloc(qb), *Vq = malloc(qb);
        float *p = malloc((size_t)S * sizeof(float)), q[HD], o[HD];
        if (!K || !V || !Kh || !Vh || !Kq || !Vq || !p) return 1;
        srand(1);
        for (size_t i = 0; i < n; i++) {
            K[i] = (float)((double)rand() / RAND_MAX) - 0.5f;
            V[i] = (float)((double)rand() / RAND_MAX) - 0.5f;
        }
        for (int i = 0; i < HD; i++) q[i] = 0.05f * (float)(i % 11);
        k_narrow_row(TLM_DTYPE_F16, K, Kh, (int)n);
        k_narrow_row(TLM_DTYPE_F16, V, Vh, (int)n);
        k_narrow_row(TLM_DTYPE_Q8_0, K, Kq, (int)n);
        k_narrow_row(TLM_DTYPE_Q8_0, V, Vq, (int)n);
        double best[3] = {1e30, 1e30, 1e30};
        for (int r = 0; r < reps; r++)
            for (int kind = 0; kind < 3; kind++) { /* alternating */
                double t = now();
                for (int h = 0; h < H; h++) {
                    size_t off = (size_t)h * S * HD, qo = off / 32 * 34;
                    int rc = kind == K_KV_Q8_0
                                 ? k_attend_row(q, Kq + qo, Vq + qo, kind, S, HD, 0.125f, p, o)
                             : kind == K_KV_F16
                                 ? k_attend_row(q, Kh + off, Vh + off, kind, S, HD, 0.125f, p, o)
                                 : k_attend_row(q, K + off, V + off, kind, S, HD, 0.125f, p, o);
                    if (rc) {
                        printf("k_attend_row refused (no AVX-512 on this CPU)\n");
                        return 1;
                    }
                }
                t = now() - t;
                if (t < best[kind]) best[kind] = t;
            }
        printf("%6d | %10.3f %6.1f | %10.3f %6.1f %6.2f | %10.3f %6.1f %6.2f\n", S, best[0] * 1e3,
               (double)n * 8 / best[0] * 1e-9, best[1] * 1e3, (double)n * 4 / best[1] * 1e-9,
               best[0] / best[1], best[2] * 1e3, (double)qb * 2 / best[2] * 1e-9,
               best[0] / best[2]);
        free(K), free(V), free(Kh), free(Vh), free(Kq), free(Vq), free(p);
    }
    return 0;
}
