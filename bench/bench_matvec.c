/* Decode's matrix-vector products alone: k_matvec_parts on weights of one type, M = 1..MAXM
 * activation rows (several sequences decoded at once, as `tlm serve` batches them), against M
 * separate one-row products, and for M > 8 against k_linear (widened tiles and sgemm, where
 * decode sends 9 rows or more). The weights are copies of one [OUT, IN] matrix filling about 512
 * MiB (on 2 MiB pages, as tlm serve and tlm bench read a model), cycled through, so that every
 * product reads its weight from memory as decoding does.
 * Prints one JSON line per M: median ms per product and weight GB/s, and the median CPU time of
 * the process per product (all threads; on a shared machine it leaves out time spent waiting for
 * a core, so A/B comparisons of kernels at one thread stay readable under load).
 *   bench_matvec TYPE IN OUT MAXM REPS THREADS [MIB]   (TYPE: F32 F16 BF16 Q8_0 Q4_0 Q4_K Q6_K ...)
 * MIB (default 512) sets the bytes of weights cycled through: 1 keeps one copy hot in L2, which
 * times the kernels' arithmetic without the wait for memory. Products run on team.c's pool, as
 * decode steps run them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/core.h"
#include "core/dtype.h"
#include "kernels/kernels.h"
#include "kernels/matvec.h"
#include "tlm.h"

static double clock_s(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc != 7 && argc != 8) {
        fprintf(stderr, "usage: bench_matvec TYPE IN OUT MAXM REPS THREADS [MIB]\n");
        return 2;
    }
    tlm_dtype t;
    if (!core_dtype_from_name(argv[1], &t) || !k_linear_takes(t)) {
        fprintf(stderr, "bench_matvec: '%s' is not a type the kernels compute on\n", argv[1]);
        return 2;
    }
    int in = atoi(argv[2]), out = atoi(argv[3]), maxm = atoi(argv[4]), reps = atoi(argv[5]);
    long mib = argc == 8 ? atol(argv[7]) : 512;
    if (in <= 0 || out <= 0 || maxm <= 0 || reps <= 0 || maxm > 64 || mib <= 0 || mib > 8192) {
        fprintf(stderr, "bench_matvec: IN, OUT, REPS > 0, 0 < MAXM <= 64, 0 < MIB <= 8192\n");
        return 2;
    }
    tlm_threads_set(atoi(argv[6]));
    /* on team.c's pool, as a decode step runs its products (an OpenMP region costs ~3 us) */
    k_team_pool(1);
    size_t rb = core_dtype_bytes(t, (uint64_t)in), wbytes = rb * (size_t)out;
    int copies = (int)(((size_t)mib << 20) / wbytes);
    if (copies < 1) copies = 1;
    float *wf = malloc(sizeof(float) * (size_t)in * out);
    uint8_t *w = core_big_alloc(wbytes * (size_t)copies);
    float *x = malloc(sizeof(float) * (size_t)in * maxm), *y = malloc(sizeof(float) * out * maxm);
    double *ms = malloc(sizeof(double) * reps), *cpu = malloc(sizeof(double) * reps);
    if (!wf || !w || !x || !y || !ms || !cpu) {
        fprintf(stderr, "bench_matvec: out of memory\n");
        return 1;
    }
    uint32_t s = 12345;
    for (size_t i = 0; i < (size_t)in * out; i++) {
        s = s * 1664525u + 1013904223u;
        wf[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * 0.1f;
    }
    for (int i = 0; i < in * maxm; i++) x[i] = (float)((i * 7) % 13) / 13.0f - 0.5f;
    if (core_dtype_from_f32(t, wf, w, (size_t)in * out)) {
        fprintf(stderr, "bench_matvec: cannot convert to %s\n", argv[1]);
        return 1;
    }
    for (int c = 1; c < copies; c++) memcpy(w + wbytes * c, w, wbytes);
    int next = 0;
    for (int M = 1; M <= maxm; M++) {
        /* mode 0: M rows in one product; 1: M one-row products; 2: k_linear (M > 8 only) */
        for (int mode = 0; mode < (M > K_MATVEC_MAX_ROWS ? 3 : 2); mode++) {
            if (mode == 1 && M == 1) continue;
            for (int r = -2; r < reps; r++) {
                const uint8_t *wc = w + wbytes * next;
                next = (next + 1) % copies;
                k_matvec_part part = {wc, NULL, out, rb, t, 0};
                tlm_weight tw = {
                    .dtype = t, .data = (void *)wc, .rows = out, .cols = in, .row_bytes = rb};
                double t0 = clock_s(CLOCK_MONOTONIC), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
                if (mode == 0)
                    k_matvec_parts(y, out, x, M, in, &part, 1);
                else if (mode == 1)
                    for (int m = 0; m < M; m++)
                        k_matvec_parts(y + (size_t)m * out, out, x + (size_t)m * in, 1, in, &part,
                                       1);
                else
                    k_linear(y, out, x, M, &tw, NULL);
                if (r >= 0) {
                    ms[r] = (clock_s(CLOCK_MONOTONIC) - t0) * 1e3;
                    cpu[r] = (clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0) * 1e3;
                }
            }
            qsort(ms, reps, sizeof *ms, cmp);
            qsort(cpu, reps, sizeof *cpu, cmp);
            double med = ms[reps / 2];
            static const char *names[] = {"rows", "separate", "k_linear"};
            printf("{\"type\": \"%s\", \"in\": %d, \"out\": %d, \"M\": %d, \"how\": \"%s\", "
                   "\"ms\": %.4f, \"weight_GBps\": %.2f, \"ms_per_row\": %.4f, \"cpu_ms\": %.4f}\n",
                   argv[1], in, out, M, names[mode], med, wbytes / (med * 1e-3) / 1e9, med / M,
                   cpu[reps / 2]);
        }
    }
    free(wf);
    core_big_free(w, wbytes * (size_t)copies);
    free(x);
    free(y);
    free(ms);
    free(cpu);
    return 0;
}
