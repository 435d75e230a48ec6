/* Training's causal attention, forward and backward, with fp32 products (one OpenBLAS sgemm per
 * head and block of queries) against bf16 products (tlm's own kernels, one head per task with its
 * operands in cache, k_bf16_attention_*), at the shapes of the bench recipes, on the threads OpenMP
 * gives (2 here). "shakespeare/thread" is what each thread runs when tlm train splits the
 * Shakespeare recipe's batch across two threads (its default there): half the batch on one thread.
 * "sft" is bench/sft/sft.sh's model on rows of 256, each one sequence ("whole") or packed with
 * examples of 40 to 200 rows ("packed": the kernels leave out the keys before a block's example;
 * the same work counted, so its GFLOP/s show the saving).
 * The two sides alternate; best of REPS. GFLOP/s count the products' unmasked causal work.
 *   bench_attn_train [REPS=20]   (bf16 needs avx512_bf16) */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kernels/kernels.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct {
    const char *name;
    int B, T, H, hd, threads, packed;
} shape;

int main(int argc, char **argv) {
    static const shape shapes[] = {
        {"shakespeare/thread", 6, 64, 4, 32, 1, 0}, {"shakespeare", 12, 64, 4, 32, 0, 0},
        {"gpt2-124M-like", 4, 256, 12, 64, 0, 0},   {"small", 8, 256, 16, 32, 0, 0},
        {"nanoGPT-char", 64, 256, 6, 64, 0, 0},     {"sft whole", 16, 256, 8, 32, 0, 0},
        {"sft packed", 16, 256, 8, 32, 0, 1},
    };
    int reps = argc > 1 ? atoi(argv[1]) : 20;
    if (reps < 1) reps = 1;
    if (!k_bf16_supported()) {
        printf("bench_attn_train: no avx512_bf16 on this CPU\n");
        return 0;
    }
    k_bf16 *k = k_bf16_new();
    if (!k) return 1;
    int team = omp_get_max_threads();
    printf("training attention, forward + backward; best of %d\n", reps);
    printf("%-20s %3s | %10s %7s | %10s %7s | %6s\n", "shape", "thr", "fp32 ms", "GFLOP/s",
           "bf16 ms", "GFLOP/s", "ratio");
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        shape s = shapes[si];
        int thr = s.threads ? s.threads : team, ld = 3 * s.H * s.hd, ow = s.H * s.hd;
        omp_set_num_threads(thr);
        size_t N = (size_t)s.B * s.T, TT = (size_t)s.T * s.T;
        float *qkv = malloc(N * ld * sizeof(float)), *dqkv = malloc(N * ld * sizeof(float));
        float *out = malloc(N * ow * sizeof(float)), *dout = malloc(N * ow * sizeof(float));
        float *probs = malloc((size_t)s.B * s.H * TT * sizeof(float));
        float sc = 1.0f / sqrtf((float)s.hd);
        float *scr = malloc(k_attention_scratch_floats(s.T, 0.0f, 0.0f, thr) * sizeof(float));
        int *lo = s.packed ? malloc(N * sizeof *lo) : NULL;
        if (!qkv || !dqkv || !out || !dout || !probs || !scr || (s.packed && !lo)) return 1;
        srand(1);
        for (int b = 0; lo && b < s.B; b++) /* examples of 40 to 200 rows, the last cut at T */
            for (int t = 0, start = 0, len = 40 + rand() % 161; t < s.T; t++) {
                if (t - start == len) start = t, len = 40 + rand() % 161;
                lo[(size_t)b * s.T + t] = start;
            }
        for (size_t i = 0; i < N * ld; i++) qkv[i] = (float)rand() / (float)RAND_MAX - 0.5f;
        for (size_t i = 0; i < N * ow; i++) dout[i] = (float)rand() / (float)RAND_MAX - 0.5f;
        double best[2] = {1e30, 1e30};
        for (int r = 0; r < reps; r++)
            for (int bf = 0; bf < 2; bf++) {
                double t = now();
                if (bf) {
                    if (!k_bf16_attention_fwd(k, out, probs, qkv, ld, s.B, s.T, s.H, s.H, s.hd, sc,
                                              0.0f, lo, 0.0f) ||
                        !k_bf16_attention_bwd(k, dqkv, dout, qkv, ld, probs, s.B, s.T, s.H, s.H,
                                              s.hd, sc, 0.0f, lo, 0.0f)) {
                        printf("bf16 attention refused %s\n", s.name);
                        return 1;
                    }
                } else {
                    k_attention_fwd(out, probs, qkv, qkv + ow, qkv + 2 * ow, ld, ld, s.B, s.T, s.H,
                                    s.H, s.hd, sc, 0.0f, lo, 0.0f, 0, scr);
                    k_attention_bwd(dqkv, dqkv + ow, dqkv + 2 * ow, dout, qkv, qkv + ow,
                                    qkv + 2 * ow, ld, ld, probs, s.B, s.T, s.H, s.H, s.hd, sc, 0.0f,
                                    lo, 0.0f, 0, scr);
                }
                t = now() - t;
                if (t < best[bf]) best[bf] = t;
            }
        /* 6 products of B*H*hd*(causal pairs) multiply-adds: 2 forward, 4 backward. */
        double flop = 6.0 * 2.0 * s.B * s.H * s.hd * ((double)s.T * (s.T + 1) / 2);
        printf("%-20s %3d | %10.3f %7.0f | %10.3f %7.0f | %5.2fx\n", s.name, thr, best[0] * 1e3,
               flop / best[0] * 1e-9, best[1] * 1e3, flop / best[1] * 1e-9, best[0] / best[1]);
        free(qkv), free(dqkv), free(out), free(dout), free(probs), free(scr), free(lo);
    }
    k_bf16_free(k);
    return 0;
}
