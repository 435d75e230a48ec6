#include <cblas.h>

#include "kernels.h"

void k_linear_fwd(float *y, const float *x, const float *w, const float *b, int N, int in,
                  int out) {
    float beta = 0.0f;
    if (b) {
        /* Start from the bias and let sgemm accumulate: one pass over y instead of two. */
#pragma omp parallel for schedule(static) if ((long)N * out >= K_PAR_MIN)
        for (int i = 0; i < N; i++)
            for (int j = 0; j < out; j++) y[(size_t)i * out + j] = b[j];
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, out, in, 1.0f, x, in, w, in, beta, y,
                out);
}

void k_colsum(float *db, const float *dy, int N, int n, int acc) {
    int blocks = (n + 15) / 16;
#pragma omp parallel for schedule(static) if ((long)N * n >= K_PAR_MIN)
    for (int bl = 0; bl < blocks; bl++) {
        int j0 = bl * 16, j1 = j0 + 16 < n ? j0 + 16 : n;
        float sums[16] = {0};
        for (int i = 0; i < N; i++) {
            const float *row = dy + (size_t)i * n;
            for (int j = j0; j < j1; j++) sums[j - j0] += row[j];
        }
        for (int j = j0; j < j1; j++) db[j] = (acc ? db[j] : 0.0f) + sums[j - j0];
    }
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
