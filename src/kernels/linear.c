#include <cblas.h>

#include "kernels.h"

void k_linear_fwd(float *y, const float *x, const float *w, const float *b, int N, int in,
                  int out) {
    float beta = 0.0f;
    if (b) {
        /* Start from the bias and let sgemm accumulate: one pass over y instead of two. */
#pragma omp parallel for schedule(static)
        for (int i = 0; i < N; i++)
            for (int j = 0; j < out; j++) y[(size_t)i * out + j] = b[j];
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, out, in, 1.0f, x, in, w, in, beta, y,
                out);
}
