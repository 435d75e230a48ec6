/* The input gradient through a frozen weight kept in its own type (LoRA and QLoRA bases): no
 * weight gradient, and no widened copy beyond one bounded tile per call. */
#include <cblas.h>

#include "core/core.h"
#include "core/dtype.h"
#include "kernels.h"
#include "qdot.h"

/* Widened rows per tile by default: 4 MiB of floats (a multiple of 16 rows), as k_linear's forward
 * tiles, so a tile stays in the last-level cache while sgemm reads it; each tile also costs a
 * hand-off between the widening team and OpenBLAS's threads, which smaller tiles pay more often. */
#define FROZEN_TILE_BYTES (4u << 20)

static int default_tile(int in, int out) {
    long rows = (long)(FROZEN_TILE_BYTES / ((size_t)in * sizeof(float))) / 16 * 16;
    if (rows < 16) rows = 16;
    return rows > out ? out : (int)rows;
}

tlm_status k_linear_bwd_dx_frozen_tiles(float *dx, const float *dy, int ldy, const tlm_weight *w,
                                        int N, float beta, int tile) {
    if (!dx || !dy || !w || !w->data || N < 0)
        return core_err(TLM_ERR_ARG, "frozen input gradient: %s",
                        !w || !w->data ? "no weight"
                        : N < 0        ? "negative row count"
                                       : "no gradient buffer");
    if (!k_linear_takes(w->dtype)) {
        const core_dtype_info *d = core_dtype_get(w->dtype);
        return core_err(TLM_ERR_ARG,
                        "frozen input gradient: no kernels compute on weights of type %s",
                        d ? d->name : "(unknown)");
    }
    if (w->rows < 0 || w->rows > INT32_MAX || w->cols <= 0 || w->cols > INT32_MAX)
        return core_err(TLM_ERR_ARG, "frozen input gradient: weight of %lld x %lld",
                        (long long)w->rows, (long long)w->cols);
    int in = (int)w->cols, out = (int)w->rows;
    size_t row_bytes = core_dtype_bytes(w->dtype, (uint64_t)in);
    if (!row_bytes || w->row_bytes < row_bytes)
        return core_err(TLM_ERR_ARG, "frozen input gradient: %d columns of %s in rows of %zu bytes",
                        in, core_dtype_get(w->dtype)->name, w->row_bytes);
    if (ldy < out)
        return core_err(TLM_ERR_ARG, "frozen input gradient: row stride %d below %d outputs", ldy,
                        out);
    if (N == 0) return TLM_OK;
    if (out == 0) {
        /* No product: sgemm with k = 0 need not scale C, so beta is applied here. */
        K_FOR(i, (long)N * in, (long)N * in, dx[i] = beta == 0.0f ? 0.0f : beta * dx[i]);
        return TLM_OK;
    }
    if (w->dtype == TLM_DTYPE_F32 && w->row_bytes % sizeof(float) == 0) {
        /* Already fp32: sgemm reads the rows where they are, at their stride. */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, in, out, 1.0f, dy, ldy, w->data,
                    (int)(w->row_bytes / sizeof(float)), beta, dx, in);
        return TLM_OK;
    }
    tile = tile <= 0 ? default_tile(in, out) : tile > out ? out : tile;
    /* The tile is the calling thread's scratch, kept between calls; with too little memory for a
     * full tile, fewer rows at a time. */
    float *buf = NULL;
    for (; tile >= 1 && !(buf = k_scratch(1, (size_t)tile * in * sizeof(float))); tile /= 2) {
    }
    if (!buf)
        return core_err(TLM_ERR_NOMEM, "frozen input gradient: no memory for a row of %d floats",
                        in);
    /* dx = dy[:, tile 0] W[tile 0] + beta dx, then the other tiles added: beta only once. */
    for (int r0 = 0; r0 < out; r0 += tile) {
        int rows = out - r0 < tile ? out - r0 : tile;
        const char *src = (const char *)w->data + (size_t)r0 * w->row_bytes;
        K_FOR(r, rows, (long)rows * in,
              k_widen_row(w->dtype, src + (size_t)r * w->row_bytes, buf + (size_t)r * in, in));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, in, rows, 1.0f, dy + r0, ldy, buf,
                    in, r0 == 0 ? beta : 1.0f, dx, in);
    }
    return TLM_OK;
}

tlm_status k_linear_bwd_dx_frozen(float *dx, const float *dy, int ldy, const tlm_weight *w, int N,
                                  float beta) {
    return k_linear_bwd_dx_frozen_tiles(dx, dy, ldy, w, N, beta, 0);
}
