/* Decode attention over the KV cache: one query per head against S cached positions, for all 144
 * heads of a 110M llama2.c model (12 layers x 12 heads, head size 64), that is one token's
 * attention, on one thread. k_attend_row on caches of each type (F16 and BF16 widened as they are
 * loaded, the block types widened and scaled) against the same kernel on an F32 cache; the caches
 * are 5-151 MiB, so past a few hundred positions they stream from memory. Best of REPS passes, the
 * types alternating; ms per token, and for each type its speed against F32's.
 *   bench_attend [REPS=9]   (needs AVX-512: k_attend_row refuses elsewhere) */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "core/dtype.h"
#include "kernels/kernels.h"
#include "kernels/qdot.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    enum { H = 144, HD = 64, NT = 7 };
    static const int lens[] = {128, 512, 1024, 2048};
    static const tlm_dtype types[NT] = {TLM_DTYPE_F32,   TLM_DTYPE_F16,  TLM_DTYPE_BF16,
                                        TLM_DTYPE_Q8_0,  TLM_DTYPE_Q5_1, TLM_DTYPE_Q4_0,
                                        TLM_DTYPE_IQ4_NL};
    int reps = argc > 1 ? atoi(argv[1]) : 9;
    if (reps < 1) reps = 1;
    printf("one token of 110M (144 heads, hd 64), 1 thread, best of %d: ms per token (x F32)\n",
           reps);
    printf("%6s |", "S");
    for (int t = 0; t < NT; t++) printf(" %14s", tlm_dtype_name(types[t]));
    printf("\n");
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        int S = lens[li];
        size_t n = (size_t)H * S * HD;
        float *K = malloc(n * sizeof(float)), *V = malloc(n * sizeof(float));
        float *p = malloc((size_t)S * sizeof(float)), q[HD], o[HD];
        void *Kc[NT], *Vc[NT];
        size_t row[NT];
        if (!K || !V || !p) return 1;
        srand(1);
        for (size_t i = 0; i < n; i++) {
            K[i] = (float)((double)rand() / RAND_MAX) - 0.5f;
            V[i] = (float)((double)rand() / RAND_MAX) - 0.5f;
        }
        for (int i = 0; i < HD; i++) q[i] = 0.05f * (float)(i % 11);
        for (int t = 0; t < NT; t++) {
            const core_dtype_info *d = core_dtype_get(types[t]);
            size_t bytes = n / d->block_elems * d->block_bytes;
            row[t] = (size_t)S * HD / d->block_elems * d->block_bytes; /* one head's */
            Kc[t] = malloc(bytes), Vc[t] = malloc(bytes);
            if (!Kc[t] || !Vc[t]) return 1;
            core_dtype_from_f32(types[t], K, Kc[t], n);
            core_dtype_from_f32(types[t], V, Vc[t], n);
        }
        double best[NT];
        for (int t = 0; t < NT; t++) best[t] = 1e30;
        for (int r = 0; r < reps; r++)
            for (int t = 0; t < NT; t++) { /* alternating */
                int kind = k_kv_kind(types[t]);
                double t0 = now();
                for (int h = 0; h < H; h++) {
                    const char *kh = (const char *)Kc[t] + h * row[t],
                               *vh = (const char *)Vc[t] + h * row[t];
                    if (k_attend_row(q, kh, vh, kind, kind, S, HD, 0.125f, p, o)) {
                        printf("k_attend_row refused (no AVX-512 on this CPU)\n");
                        return 1;
                    }
                }
                t0 = now() - t0;
                if (t0 < best[t]) best[t] = t0;
            }
        printf("%6d |", S);
        for (int t = 0; t < NT; t++) printf(" %7.3f (%4.2f)", best[t] * 1e3, best[0] / best[t]);
        printf("\n");
        for (int t = 0; t < NT; t++) free(Kc[t]), free(Vc[t]);
        free(K), free(V), free(p);
    }
    return 0;
}
