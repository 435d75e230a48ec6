#include <cblas.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/knob.h"
#include "kernels.h"
#include "matvec.h"
#include "qdot.h"
#include "qgemm.h"

int k_linear_takes(tlm_dtype t) { return k_act_of(t) != K_ACT_NONE; }

void k_linear_fwd(float *y, int ldy, const float *x, const float *w, const float *b, int N, int in,
                  int out) {
    float beta = 0.0f;
    if (b) {
        /* Start from the bias and let sgemm accumulate: one pass over y instead of two. */
        K_FOR(i, N, (long)N * out, memcpy(y + (size_t)i * ldy, b, (size_t)out * sizeof *b));
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, out, in, 1.0f, x, in, w, in, beta, y,
                ldy);
}

void k_linear(float *y, int ldy, const float *x, int N, const tlm_weight *w, const float *b) {
    k_linear_parts(y, ldy, x, N, &w, &b, 1, NULL);
}

/* The biases of n parts as one vector: NULL when there are none, the first when they are stacked
 * back to back like the weights, else `split` (a per-part bias is needed). */
static const float *stacked_bias(const tlm_weight *const *w, const float *const *b, int n,
                                 int *split) {
    *split = 0;
    if (!b || !b[0]) {
        for (int i = 1; b && i < n; i++)
            if (b[i]) *split = 1;
        return NULL;
    }
    const float *next = b[0] + w[0]->rows;
    for (int i = 1; i < n; i++) {
        if (b[i] != next) *split = 1;
        next += w[i]->rows;
    }
    return b[0];
}

/* How many rows of a weight are computed. F32 and F16 rows: k_fgemm's register tiles where the CPU
 * has AVX-512 (F16 rows widened a block at a time into L1), else sgemm (F16 on widened tiles).
 * Block types: the repacked 8-bit products (qgemm.c) where the CPU has AVX-512 VNNI, else widened
 * tiles and sgemm. BF16 weights meet activations rounded to BF16 on vdpbf16ps where the CPU has
 * AVX512_BF16, as their decode kernel and llama.cpp do (faster than the widened tiles, and about
 * 1e-3 from fp32 logits: TLM_LOAD_FP32 widens them at load for exact products). k_linear_prefill
 * (tests) or, in a benchmark build, TLM_QPREFILL=sgemm|int8|qgemm (bench/quant/prefill_paths.sh)
 * chooses another path for comparisons. */
enum { PREFILL_SGEMM, PREFILL_FLOAT, PREFILL_QGEMM, PREFILL_INT8 };
static _Atomic int prefill_override = K_PREFILL_DEFAULT; /* k_linear_prefill */

k_prefill_path k_linear_prefill(k_prefill_path path) {
    return atomic_exchange(&prefill_override, path);
}

static int prefill_path(tlm_dtype t) {
    int want = atomic_load_explicit(&prefill_override, memory_order_relaxed);
    /* once per product of many rows: negligible */
    const char *e = want == K_PREFILL_DEFAULT ? core_bench_knob("TLM_QPREFILL") : NULL;
    if (want == K_PREFILL_SGEMM || (e && !strcmp(e, "sgemm"))) return PREFILL_SGEMM;
    if (k_act_of(t) == K_ACT_F32) return PREFILL_FLOAT;
    if (want == K_PREFILL_INT8 || (e && !strcmp(e, "int8"))) return PREFILL_INT8;
    return k_qgemm_takes(t) ? PREFILL_QGEMM : PREFILL_SGEMM;
}

/* Many rows of x against one weight: sgemm, on F32 tiles of the weight widened from its type
 * (4 MiB at a time, so the tile stays in the last-level cache while sgemm reads it). */
static void linear_rows(float *y, int ldy, const float *x, int N, const tlm_weight *w,
                        const float *b) {
    int in = (int)w->cols, out = (int)w->rows;
    int path = prefill_path(w->dtype);
    /* k_fgemm beats widened tiles + sgemm on F16 rows everywhere, and sgemm on F32 rows from 512
     * columns (faster on prompts, level on training's long products) and on batched decode's few
     * rows, but is slower on the short rows of training's many (build/bench_fgemm). */
    if (path == PREFILL_FLOAT && (w->dtype == TLM_DTYPE_F16 || in >= 512 || N < 256) &&
        !k_fgemm(y, ldy, x, N, w, b))
        return;
    if (w->dtype == TLM_DTYPE_F32) {
        k_linear_fwd(y, ldy, x, w->data, b, N, in, out);
        return;
    }
    if (path == PREFILL_QGEMM && !k_qgemm(y, ldy, x, N, w, b, k_qgemm_isa(w->dtype))) return;
    int tile = (int)((4u << 20) / ((size_t)in * sizeof(float)));
    tile = tile < 16 ? 16 : tile > out ? out : tile;
    float *buf = path == PREFILL_INT8 ? NULL : k_scratch(1, (size_t)tile * in * sizeof(float));
    if (!buf) {
        /* The integer path, or no memory for a tile: the matrix-vector kernels over all N rows
         * (each weight row read once, against every activation row). */
        k_matvec_part part = {w->data, b, out, w->row_bytes, w->dtype, 0};
        k_matvec_parts(y, ldy, x, N, in, &part, 1);
        return;
    }
    for (int r0 = 0; r0 < out; r0 += tile) {
        int rows = out - r0 < tile ? out - r0 : tile;
        K_FOR(r, rows, (long)rows * in,
              k_widen_row(w->dtype, (const char *)w->data + (size_t)(r0 + r) * w->row_bytes,
                          buf + (size_t)r * in, in));
        k_linear_fwd(y + r0, ldy, x, buf, b ? b + r0 : NULL, N, in, rows);
    }
}

/* 1 if N rows of x against F32 (f16: some F16) weights go to the matrix-vector loop. Where k_fgemm
 * runs it is faster from 3 rows of F32; F16 rows, half the bytes, stay on the loop up to 5 rows
 * and at 9-10 (between its pair layout, up to 8 rows, and its 16-row tiles), as measured on 110M
 * at 2 threads (tlm bench tg -b). */
static int float_rows_matvec(int N, int f16) {
    if (!k_fgemm_ok()) return N <= K_MATVEC_MAX_ROWS_FLOAT;
    return f16 ? N <= 5 || (N >= 9 && N <= 10) : N <= 2;
}

int k_linear_parts_plan(k_matvec_plan *pl, float *y, int ldy, const float *x, int N,
                        const tlm_weight *const *w, const float *const *b, int n,
                        const tlm_weight *fused) {
    int in = (int)w[0]->cols, split;
    const float *fb = stacked_bias(w, b, n, &split);
    int floats = 1, f16 = 0;
    for (int i = 0; i < n; i++) {
        if (w[i]->dtype != TLM_DTYPE_F32 && w[i]->dtype != TLM_DTYPE_F16) floats = 0;
        if (w[i]->dtype == TLM_DTYPE_F16) f16 = 1;
    }
    if (!(floats ? float_rows_matvec(N, f16) : N <= K_MATVEC_MAX_ROWS)) return 0;
    k_matvec_part parts[K_LINEAR_MAX_PARTS];
    int np = 0, col = 0;
    if (fused && !split) {
        parts[np++] =
            (k_matvec_part){fused->data, fb, (int)fused->rows, fused->row_bytes, fused->dtype, 0};
    } else {
        for (int i = 0; i < n && np < K_LINEAR_MAX_PARTS; i++) {
            parts[np++] = (k_matvec_part){w[i]->data,      b ? b[i] : NULL, (int)w[i]->rows,
                                          w[i]->row_bytes, w[i]->dtype,     col};
            col += (int)w[i]->rows;
        }
    }
    k_matvec_plan_init(pl, y, ldy, x, N, in, parts, np);
    return 1;
}

void k_linear_parts(float *y, int ldy, const float *x, int N, const tlm_weight *const *w,
                    const float *const *b, int n, const tlm_weight *fused) {
    k_matvec_plan pl;
    if (k_linear_parts_plan(&pl, y, ldy, x, N, w, b, n, fused)) {
        k_matvec_plan_run(&pl);
        return;
    }
    int split;
    const float *fb = stacked_bias(w, b, n, &split);
    if (fused && !split) {
        linear_rows(y, ldy, x, N, fused, fb);
        return;
    }
    int col = 0;
    for (int i = 0; i < n; i++) {
        linear_rows(y + col, ldy, x, N, w[i], b ? b[i] : NULL);
        col += (int)w[i]->rows;
    }
}

/* Columns [j0, j0 + 16) (or to n) of dy's column sums, the rows in order. */
static void colsum_block(float *db, const float *dy, int N, int n, int acc, int j0) {
    int j1 = j0 + 16 < n ? j0 + 16 : n;
    float sums[16] = {0};
    for (int i = 0; i < N; i++) {
        const float *row = dy + (size_t)i * n;
        for (int j = j0; j < j1; j++) sums[j - j0] += row[j];
    }
    for (int j = j0; j < j1; j++) db[j] = (acc ? db[j] : 0.0f) + sums[j - j0];
}

void k_colsum(float *db, const float *dy, int N, int n, int acc) {
    K_FOR(bl, (n + 15) / 16, (long)N * n, colsum_block(db, dy, N, n, acc, (int)bl * 16));
}

void k_linear_bwd(float *dx, float *dw, float *db, const float *dy, const float *x, const float *w,
                  int N, int in, int out, int acc) {
    if (dx)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, in, out, 1.0f, dy, out, w, in,
                    0.0f, dx, in);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, N, 1.0f, dy, out, x, in,
                acc ? 1.0f : 0.0f, dw, in);
    if (db) k_colsum(db, dy, N, out, acc);
}

void k_linear_bwd_dx(float *dx, const float *dy, int ldy, const float *w, int N, int in, int out,
                     float beta) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, in, out, 1.0f, dy, ldy, w, in, beta,
                dx, in);
}
