#include <math.h>
#include <string.h>

#include "fastmath.h"
#include "kernels.h"

/* log-sum-exp with the max subtracted first, so exp never sees a large argument. */
K_INLINE float row_lse(const float *x, int V) {
    float mx = x[0];
    for (int j = 1; j < V; j++) mx = x[j] > mx ? x[j] : mx;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int j = 0; j < V; j++) s += k_expf(x[j] - mx);
    return mx + logf(s);
}

/* Row i's loss term (0 when untargeted), its probabilities written when probs is not NULL. */
K_INLINE double ce_row(const float *logits, const int *targets, float *probs, int i, int V) {
    const float *x = logits + (size_t)i * V;
    float lse = row_lse(x, V);
    if (probs) {
        float *p = probs + (size_t)i * V;
        for (int j = 0; j < V; j++) p[j] = k_expf(x[j] - lse);
    }
    return targets && targets[i] >= 0 ? (double)(lse - x[targets[i]]) : 0.0;
}

/* The loss terms of rows [r0, r1) summed in order into *total. */
K_INLINE void ce_rows(const float *logits, const int *targets, float *probs, int V, long r0,
                      long r1, double *total) {
    double t = 0.0;
    for (long i = r0; i < r1; i++) t += ce_row(logits, targets, probs, (int)i, V);
    *total = t;
}
K_VERSIONS(ce_rows,
           (const float *logits, const int *targets, float *probs, int V, long r0, long r1,
            double *total),
           (logits, targets, probs, V, r0, r1, total))

double k_cross_entropy_fwd(const float *logits, const int *targets, float *probs, int N, int V,
                           int *count) {
    double total = 0.0;
    int n = 0;
    if (targets)
        for (int i = 0; i < N; i++) n += targets[i] >= 0;
    ce_rows_fn *f = ce_rows_pick();
    /* In a replica's thread a region of one would only add libgomp's cost (k_fork). */
    if (!k_fork((long)N * V)) {
        f(logits, targets, probs, V, 0, N, &total);
    } else {
#pragma omp parallel reduction(+ : total)
        {
            long r0, r1;
            double part = 0.0;
            k_share(N, &r0, &r1);
            if (r0 < r1) f(logits, targets, probs, V, r0, r1, &part);
            total += part;
        }
    }
    if (count) *count = n;
    return n ? total / n : NAN;
}

/* The row's loss term, its logits replaced by their gradient (scaled by inv). */
K_INLINE double ce_grad_row(float *x, int target, int V, float inv) {
    if (target < 0) {
        memset(x, 0, (size_t)V * sizeof(float));
        return 0.0;
    }
    float lse = row_lse(x, V);
    double loss = (double)(lse - x[target]);
    for (int j = 0; j < V; j++) x[j] = k_expf(x[j] - lse) * inv;
    x[target] -= inv;
    return loss;
}

/* Rows [r0, r1): their loss terms summed in order into *total. */
K_INLINE void ce_grad_rows(float *logits, const int *targets, int V, float inv, long r0, long r1,
                           double *total) {
    double t = 0.0;
    for (long i = r0; i < r1; i++) t += ce_grad_row(logits + (size_t)i * V, targets[i], V, inv);
    *total = t;
}
K_VERSIONS(ce_grad_rows,
           (float *logits, const int *targets, int V, float inv, long r0, long r1, double *total),
           (logits, targets, V, inv, r0, r1, total))

double k_cross_entropy_fwd_bwd(float *logits, const int *targets, int N, int V, double divisor,
                               int *count) {
    int n = 0;
    for (int i = 0; i < N; i++) n += targets[i] >= 0;
    double total = 0.0;
    if (divisor <= 0) divisor = n;
    /* a count's reciprocal in float, as before divisors could be fractions (a share of a step) */
    float inv = divisor == 0                        ? 0.0f
                : (double)(float)divisor == divisor ? 1.0f / (float)divisor
                                                    : (float)(1.0 / divisor);
    ce_grad_rows_fn *f = ce_grad_rows_pick();
    if (!k_fork((long)N * V)) {
        f(logits, targets, V, inv, 0, N, &total);
    } else {
#pragma omp parallel reduction(+ : total)
        {
            long r0, r1;
            double part = 0.0;
            k_share(N, &r0, &r1);
            if (r0 < r1) f(logits, targets, V, inv, r0, r1, &part);
            total += part;
        }
    }
    if (count) *count = n;
    return n ? total / n : NAN;
}

/* Rows [r0, r1): each row's loss term into row_loss (0 for ignored targets). */
K_INLINE void ce_each_rows(const float *logits, const int *targets, float *row_loss, int V, long r0,
                           long r1) {
    for (long i = r0; i < r1; i++) row_loss[i] = (float)ce_row(logits, targets, NULL, (int)i, V);
}
K_VERSIONS(ce_each_rows,
           (const float *logits, const int *targets, float *row_loss, int V, long r0, long r1),
           (logits, targets, row_loss, V, r0, r1))

void k_cross_entropy_rows(const float *logits, const int *targets, float *row_loss, int N, int V) {
    ce_each_rows_fn *f = ce_each_rows_pick();
    if (!k_fork((long)N * V)) {
        f(logits, targets, row_loss, V, 0, N);
        return;
    }
#pragma omp parallel
    {
        long r0, r1;
        k_share(N, &r0, &r1);
        if (r0 < r1) f(logits, targets, row_loss, V, r0, r1);
    }
}

/* Rows [r0, r1) replaced by the gradient of w[i] times their loss term; the weighted terms summed
 * in order into *total. */
K_INLINE void ce_wgrad_rows(float *logits, const int *targets, const float *w, int V, long r0,
                            long r1, double *total) {
    double t = 0.0;
    for (long i = r0; i < r1; i++) {
        double l = ce_grad_row(logits + (size_t)i * V, targets[i], V, w[i]);
        if (targets[i] >= 0) t += l * w[i];
    }
    *total = t;
}
K_VERSIONS(ce_wgrad_rows,
           (float *logits, const int *targets, const float *w, int V, long r0, long r1,
            double *total),
           (logits, targets, w, V, r0, r1, total))

double k_cross_entropy_bwd_weighted(float *logits, const int *targets, const float *w, int N,
                                    int V) {
    double total = 0.0;
    ce_wgrad_rows_fn *f = ce_wgrad_rows_pick();
    if (!k_fork((long)N * V)) {
        f(logits, targets, w, V, 0, N, &total);
    } else {
#pragma omp parallel reduction(+ : total)
        {
            long r0, r1;
            double part = 0.0;
            k_share(N, &r0, &r1);
            if (r0 < r1) f(logits, targets, w, V, r0, r1, &part);
            total += part;
        }
    }
    return total;
}
