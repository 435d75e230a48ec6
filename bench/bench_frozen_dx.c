/* The input gradient through a frozen weight (k_linear_bwd_dx_frozen, LoRA and QLoRA bases) on the
 * 110M llama2.c model's shapes: widened tiles of the default size, widening the whole matrix then
 * one sgemm (tile = out), sgemm on weights already in F32 (the floor, no widening), and the bf16
 * products of a bf16 pass (k_bf16_linear_bwd_dx_frozen: tiles widened and rounded to bf16; F32
 * weights: k_bf16_linear_bwd_dx). Best of REPS, milliseconds and GFLOP/s.
 *   bench_frozen_dx [THREADS=2] [REPS=5] [N=512] [TILE=0: the default tile rows] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/dtype.h"
#include "kernels/kernels.h"
#include "tlm.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Best time of reps calls with the given tile rows (-1: k_linear_bwd_dx on the F32 weight). */
static double best(float *dx, const float *dy, const tlm_weight *w, const float *wf, int N,
                   int tile, int reps, k_bf16 *bf) {
    double b = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        if (bf && w->dtype == TLM_DTYPE_F32)
            k_bf16_linear_bwd_dx(bf, dx, dy, (int)w->rows, wf, N, (int)w->cols, (int)w->rows, 0.0f);
        else if (bf) {
            if (k_bf16_linear_bwd_dx_frozen(bf, dx, dy, (int)w->rows, w, N, 0.0f)) return -1;
        } else if (tile < 0)
            k_linear_bwd_dx(dx, dy, (int)w->rows, wf, N, (int)w->cols, (int)w->rows, 0.0f);
        else if (k_linear_bwd_dx_frozen_tiles(dx, dy, (int)w->rows, w, N, 0.0f, tile))
            return -1;
        double t = now() - t0;
        if (t < b) b = t;
    }
    return b;
}

int main(int argc, char **argv) {
    static const int shapes[][2] = {{768, 768}, {2048, 768}, {768, 2048}}; /* out, in */
    static const tlm_dtype types[] = {TLM_DTYPE_F32,  TLM_DTYPE_F16,  TLM_DTYPE_BF16,
                                      TLM_DTYPE_Q8_0, TLM_DTYPE_Q4_0, TLM_DTYPE_Q4_K,
                                      TLM_DTYPE_Q5_K, TLM_DTYPE_Q6_K};
    int threads = argc > 1 ? atoi(argv[1]) : 2, reps = argc > 2 ? atoi(argv[2]) : 5;
    int N = argc > 3 ? atoi(argv[3]) : 512, tile = argc > 4 ? atoi(argv[4]) : 0;
    if (threads < 1 || reps < 1 || N < 1 || tile < 0) return 2;
    tlm_threads_set(threads);
    printf("threads %d, N %d, tile rows %d (0: default), best of %d: ms (GFLOP/s)\n", threads, N,
           tile, reps);
    k_bf16 *bf = k_bf16_supported() ? k_bf16_new() : NULL;
    printf("  out    in type   | tiles            | whole+sgemm      | F32 sgemm        | bf16 "
           "tiles\n");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int out = shapes[s][0], in = shapes[s][1];
        float *wf = malloc(sizeof(float) * (size_t)out * in);
        float *dy = malloc(sizeof(float) * (size_t)N * out);
        float *dx = malloc(sizeof(float) * (size_t)N * in);
        if (!wf || !dy || !dx) return 1;
        for (long i = 0; i < (long)out * in; i++) wf[i] = (float)((double)rand() / RAND_MAX) - 0.5f;
        for (long i = 0; i < (long)N * out; i++) dy[i] = (float)((double)rand() / RAND_MAX) - 0.5f;
        double flops = 2.0 * N * in * out;
        for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
            size_t rb = core_dtype_bytes(types[t], (uint64_t)in);
            void *q = malloc(rb * (size_t)out);
            if (!q) return 1;
            if (types[t] == TLM_DTYPE_F32)
                memcpy(q, wf, rb * (size_t)out);
            else if (core_quantize_rows(types[t], wf, q, (size_t)out, (size_t)in, NULL))
                return 1;
            tlm_weight w = {types[t], q, out, in, rb};
            double a = best(dx, dy, &w, wf, N, tile, reps, NULL);
            double b = best(dx, dy, &w, wf, N, out, reps, NULL);
            double c = best(dx, dy, &w, wf, N, -1, reps, NULL);
            double d = bf ? best(dx, dy, &w, wf, N, 0, reps, bf) : 0;
            printf("%5d %5d %-6s | %7.3f (%6.1f) | %7.3f (%6.1f) | %7.3f (%6.1f) | %7.3f (%6.1f)\n",
                   out, in, core_dtype_get(types[t])->name, a * 1e3, flops / a * 1e-9, b * 1e3,
                   flops / b * 1e-9, c * 1e3, flops / c * 1e-9, d * 1e3,
                   d > 0 ? flops / d * 1e-9 : 0);
            free(q);
        }
        free(wf);
        free(dy);
        free(dx);
    }
    k_bf16_free(bf);
    return 0;
}
