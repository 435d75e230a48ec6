/* bf16 GEMM candidates against fp32 sgemm on the products a training step runs, plus the peak
 * rates of vdpbf16ps and of fp32 FMA on this CPU. Candidates alternate within each repetition
 * (sgemm, oneDNN, libxsmm, OpenBLAS sbgemm) so that drift on a shared host hits them alike; the
 * table reports medians. Build and run with bench/bf16/run.sh.
 *
 * usage: bench_bf16 [REPS] [FILTER]   (FILTER: only shapes whose config name contains it) */
#define _GNU_SOURCE
#include <cblas.h>
#include <dlfcn.h>
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <oneapi/dnnl/dnnl.h>
#ifdef HAVE_XSMM
#include <libxsmm.h>
#endif

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- peaks ------------------------------------------------------------------------------- */

/* Twelve independent accumulators in registers hide the instruction latency behind two ports. */
#define ACC12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define DECL(i) __m512 a##i = _mm512_set1_ps((float)(i));
#define SUM(i) s = _mm512_add_ps(s, a##i);
__attribute__((target("avx512f,avx512bf16"))) static double bf16_peak_loop(long iters) {
    ACC12(DECL)
    __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x3c00);
    for (long it = 0; it < iters; it++) {
#define STEP(i) a##i = _mm512_dpbf16_ps(a##i, x, y);
        ACC12(STEP)
#undef STEP
        __asm__ volatile("" : "+v"(x), "+v"(y));
    }
    __m512 s = _mm512_setzero_ps();
    ACC12(SUM)
    return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx512f"))) static double fma_peak_loop(long iters) {
    ACC12(DECL)
    __m512 x = _mm512_set1_ps(1.0f), y = _mm512_set1_ps(1e-7f);
    for (long it = 0; it < iters; it++) {
#define STEP(i) a##i = _mm512_fmadd_ps(x, y, a##i);
        ACC12(STEP)
#undef STEP
        __asm__ volatile("" : "+v"(x), "+v"(y));
    }
    __m512 s = _mm512_setzero_ps();
    ACC12(SUM)
    return _mm512_reduce_add_ps(s);
}

/* GFLOP/s of all threads together: a vdpbf16ps is 16 lanes x 2 products x 2 flops, an FMA 16 x 2.
 */
static double peak(int bf16, int threads) {
    const long iters = 20000000;
    double best = 0, sink = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
        sink += bf16 ? bf16_peak_loop(iters) : fma_peak_loop(iters);
        double dt = now() - t0;
        double gf = (double)iters * 12 * threads * (bf16 ? 64 : 32) / dt * 1e-9;
        if (gf > best) best = gf;
    }
    if (sink == 12345.0) printf(" ");
    return best;
}

/* ---- conversion -------------------------------------------------------------------------- */

/* Round to nearest even, as vcvtneps2bf16 does (NaN handling does not matter for these data). */
static void to_bf16(uint16_t *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &src[i], 4);
        u += 0x7fff + ((u >> 16) & 1);
        dst[i] = (uint16_t)(u >> 16);
    }
}

/* ---- the products ------------------------------------------------------------------------- */

/* Row-major C[M, N] (+)= op(A) op(B) with the three layouts of a linear layer:
 * fwd NT: y[N, out] = x[N, in] W[out, in]^T; dx NN: dx[N, in] = dy[N, out] W[out, in];
 * dW TN: dW[out, in] = dy[N, out]^T x[N, in]. */
typedef struct {
    const char *cfg, *layer, *kind;
    int M, N, K, ta, tb;
} shape;

typedef struct {
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c;
} dnnl_mm;

static dnnl_engine_t eng;
static dnnl_stream_t strm;

static void dnnl_check(dnnl_status_t s, const char *what) {
    if (s != dnnl_success) {
        fprintf(stderr, "oneDNN: %s failed (%d)\n", what, (int)s);
        exit(1);
    }
}

static dnnl_mm dnnl_make(const shape *s, void *A, void *B, float *C) {
    dnnl_mm r;
    dnnl_memory_desc_t amd, bmd, cmd;
    dnnl_dims_t ad = {s->M, s->K}, bd = {s->K, s->N}, cd = {s->M, s->N};
    /* A stored [M, K] or, transposed, [K, M]; B stored [K, N] or [N, K]. */
    dnnl_dims_t as = {s->ta ? 1 : s->K, s->ta ? s->M : 1};
    dnnl_dims_t bs = {s->tb ? 1 : s->N, s->tb ? s->K : 1};
    dnnl_dims_t cs = {s->N, 1};
    dnnl_check(dnnl_memory_desc_init_by_strides(&amd, 2, ad, dnnl_bf16, as), "md a");
    dnnl_check(dnnl_memory_desc_init_by_strides(&bmd, 2, bd, dnnl_bf16, bs), "md b");
    dnnl_check(dnnl_memory_desc_init_by_strides(&cmd, 2, cd, dnnl_f32, cs), "md c");
    dnnl_matmul_desc_t md;
    dnnl_check(dnnl_matmul_desc_init(&md, &amd, &bmd, NULL, &cmd), "matmul desc");
    dnnl_primitive_desc_t pd;
    dnnl_check(dnnl_primitive_desc_create(&pd, &md, NULL, eng, NULL), "primitive desc");
    const char *impl = NULL;
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
    static int shown;
    if (!shown++) printf("# oneDNN matmul implementation: %s\n", impl ? impl : "?");
    dnnl_check(dnnl_primitive_create(&r.prim, pd), "primitive");
    dnnl_primitive_desc_destroy(pd);
    dnnl_check(dnnl_memory_create(&r.a, &amd, eng, A), "mem a");
    dnnl_check(dnnl_memory_create(&r.b, &bmd, eng, B), "mem b");
    dnnl_check(dnnl_memory_create(&r.c, &cmd, eng, C), "mem c");
    return r;
}

static void dnnl_run(dnnl_mm *r) {
    dnnl_exec_arg_t args[3] = {
        {DNNL_ARG_SRC, r->a}, {DNNL_ARG_WEIGHTS, r->b}, {DNNL_ARG_DST, r->c}};
    dnnl_check(dnnl_primitive_execute(r->prim, strm, 3, args), "execute");
    dnnl_stream_wait(strm);
}

static void dnnl_free(dnnl_mm *r) {
    dnnl_memory_destroy(r->a);
    dnnl_memory_destroy(r->b);
    dnnl_memory_destroy(r->c);
    dnnl_primitive_destroy(r->prim);
}

#ifdef HAVE_XSMM
/* The rate of libxsmm's JIT bf16 kernel (bf16 in, fp32 out) on one in-cache 64x64x64 tile, one
 * thread: an upper bound for a blocked GEMM built around it (libxsmm_bsgemm itself only covers
 * small matrices). */
static const char *xsmm_kernel_rate(void) {
    static char msg[128];
    libxsmm_blasint n = 64;
    float one = 1.0f;
    libxsmm_bsmmfunction k = libxsmm_bsmmdispatch(n, n, n, &n, &n, &n, &one, &one, NULL, NULL);
    if (!k) return "no JIT bf16 kernel for 64x64x64";
    libxsmm_bfloat16 *a = calloc(64 * 64, 2), *b = calloc(64 * 64, 2);
    float *c = calloc(64 * 64, 4);
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now();
        for (int i = 0; i < 20000; i++) k(a, b, c);
        double gf = 2.0 * 64 * 64 * 64 * 20000 / (now() - t0) * 1e-9;
        if (gf > best) best = gf;
    }
    snprintf(msg, sizeof msg, "JIT bf16 kernel 64x64x64 in cache: %.0f GFLOP/s (1 thread)", best);
    free(a);
    free(b);
    free(c);
    return msg;
}
#endif

typedef void (*sbgemm_fn)(int, int, int, int, int, int, float, const uint16_t *, int,
                          const uint16_t *, int, float, float *, int);

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 5;
    const char *filter = argc > 2 ? argv[2] : "";
    int threads = omp_get_max_threads();
    if (reps < 1) reps = 1;

    printf("# threads %d; OPENBLAS_CORETYPE=%s; OpenBLAS core: %s\n", threads,
           getenv("OPENBLAS_CORETYPE") ? getenv("OPENBLAS_CORETYPE") : "unset",
           openblas_get_corename());
    int has_bf16 = __builtin_cpu_supports("avx512bf16");
    printf("# avx512_bf16: %s\n", has_bf16 ? "yes" : "no");
    printf("# peak fp32 FMA: %.0f GFLOP/s (1 thread), %.0f (%d threads)\n", peak(0, 1),
           peak(0, threads), threads);
    double bpk1 = 0, bpk = 0;
    if (has_bf16) {
        bpk1 = peak(1, 1);
        bpk = peak(1, threads);
        printf("# peak vdpbf16ps: %.0f GFLOP/s (1 thread), %.0f (%d threads)\n", bpk1, bpk,
               threads);
    }
    sbgemm_fn sbgemm = (sbgemm_fn)dlsym(RTLD_DEFAULT, "cblas_sbgemm");
    printf("# OpenBLAS cblas_sbgemm: %s\n",
           sbgemm ? "exported" : "not exported by this libopenblas (built without BFLOAT16)");
#ifdef HAVE_XSMM
    libxsmm_init();
    printf("# libxsmm target: %s; %s\n", libxsmm_get_target_arch(), xsmm_kernel_rate());
#else
    printf("# libxsmm: not built in (no libxsmm.h)\n");
#endif
    dnnl_check(dnnl_engine_create(&eng, dnnl_cpu, 0), "engine");
    dnnl_check(dnnl_stream_create(&strm, eng, dnnl_stream_default_flags), "stream");

    /* Rows per product: gpt2-124M-like B4 T256, small B8 T256 (bench/run_model.sh) with every
     * thread on each product; nanoGPT-char B64 T256 runs as two replicas of 32 sequences, one
     * thread each: its row shows one replica's products (compare it with 1 thread). */
    struct {
        const char *cfg;
        int rows;
        const char *layer;
        int in, out;
    } L[] = {
        {"gpt2like", 1024, "qkv", 768, 2304},     {"gpt2like", 1024, "o", 768, 768},
        {"gpt2like", 1024, "gate_up", 768, 4096}, {"gpt2like", 1024, "down", 2048, 768},
        {"gpt2like", 1024, "head", 768, 50257},   {"small", 2048, "qkv", 512, 1536},
        {"small", 2048, "o", 512, 512},           {"small", 2048, "gate_up", 512, 2688},
        {"small", 2048, "down", 1344, 512},       {"small", 2048, "head", 512, 10000},
        {"char", 8192, "qkv", 384, 1152},         {"char", 8192, "o", 384, 384},
        {"char", 8192, "up", 384, 1536},          {"char", 8192, "down", 1536, 384},
    };
    printf("%-9s %-8s %-4s %6s %6s %6s | %8s %8s %8s %8s | %s\n", "config", "layer", "op", "M", "N",
           "K", "sgemm", "dnnl", "dnnl+cvt", "sbgemm", "GFLOP/s (median)");
    for (size_t li = 0; li < sizeof L / sizeof L[0]; li++) {
        if (!strstr(L[li].cfg, filter)) continue;
        int R = L[li].rows, in = L[li].in, out = L[li].out;
        shape S[3] = {{L[li].cfg, L[li].layer, "fwd", R, out, in, 0, 1},
                      {L[li].cfg, L[li].layer, "dx", R, in, out, 0, 0},
                      {L[li].cfg, L[li].layer, "dW", out, in, R, 1, 0}};
        for (int si = 0; si < 3; si++) {
            shape *s = &S[si];
            size_t na = (size_t)s->M * s->K, nb = (size_t)s->K * s->N, nc = (size_t)s->M * s->N;
            float *A = malloc(na * 4), *B = malloc(nb * 4), *C = malloc(nc * 4);
            uint16_t *Ah = malloc(na * 2), *Bh = malloc(nb * 2);
            if (!A || !B || !C || !Ah || !Bh) return 1;
            for (size_t i = 0; i < na; i++) A[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - .5f;
            for (size_t i = 0; i < nb; i++) B[i] = (float)((i * 40503u) % 997) * 1e-3f - .5f;
            to_bf16(Ah, A, na);
            to_bf16(Bh, B, nb);
            int lda = s->ta ? s->M : s->K, ldb = s->tb ? s->K : s->N;
            dnnl_mm dm = dnnl_make(s, Ah, Bh, C);
            double flop = 2.0 * s->M * s->N * s->K;
            double *t[5];
            for (int c = 0; c < 5; c++) t[c] = calloc((size_t)reps, sizeof(double));
            for (int rep = -1; rep < reps; rep++) { /* rep -1 warms every candidate up */
                double t0 = now();
                cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans,
                            s->tb ? CblasTrans : CblasNoTrans, s->M, s->N, s->K, 1.0f, A, lda, B,
                            ldb, 0.0f, C, s->N);
                double t1 = now();
                dnnl_run(&dm);
                double t2 = now();
                /* What a step pays when both operands change at every product. */
#pragma omp parallel for schedule(static)
                for (int p = 0; p < threads; p++) {
                    size_t a0 = na * p / threads, a1 = na * (p + 1) / threads;
                    size_t b0 = nb * p / threads, b1 = nb * (p + 1) / threads;
                    to_bf16(Ah + a0, A + a0, a1 - a0);
                    to_bf16(Bh + b0, B + b0, b1 - b0);
                }
                dnnl_run(&dm);
                double t3 = now();
                double t4 = t3, t5 = t3;
                /* libxsmm_bsgemm falls back to a reference loop past its small-matrix limit
                 * (~0.3 GFLOP/s on 768^3 here): only its JIT kernel's rate is measured, below. */
                if (sbgemm) {
                    sbgemm(101, s->ta ? 112 : 111, s->tb ? 112 : 111, s->M, s->N, s->K, 1.0f, Ah,
                           lda, Bh, ldb, 0.0f, C, s->N);
                }
                t5 = now();
                if (rep >= 0) {
                    t[0][rep] = t1 - t0;
                    t[1][rep] = t2 - t1;
                    t[2][rep] = t3 - t2;
                    t[3][rep] = t4 - t3;
                    t[4][rep] = t5 - t4;
                }
            }
            double g[5];
            for (int c = 0; c < 5; c++) g[c] = flop / median(t[c], reps) * 1e-9;
            if (!sbgemm) g[4] = 0;
            printf("%-9s %-8s %-4s %6d %6d %6d | %8.0f %8.0f %8.0f %8.0f | dnnl %.2fx sgemm",
                   s->cfg, s->layer, s->kind, s->M, s->N, s->K, g[0], g[1], g[2], g[4],
                   g[1] / g[0]);
            if (bpk > 0) printf(", %.0f%% of bf16 peak", 100.0 * g[1] / bpk);
            printf("\n");
            fflush(stdout);
            for (int c = 0; c < 5; c++) free(t[c]);
            dnnl_free(&dm);
            free(A);
            free(B);
            free(C);
            free(Ah);
            free(Bh);
        }
    }
    dnnl_stream_destroy(strm);
    dnnl_engine_destroy(eng);
    return 0;
}
