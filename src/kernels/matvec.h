/* Matrix-vector products for the decode step. With one (or a few) rows of input, sgemm spends
 * more time packing than multiplying; here every weight row is streamed from memory exactly once
 * and reused from L1 for all input rows, so decoding runs at memory bandwidth. */
#ifndef TLM_KERNELS_MATVEC_H
#define TLM_KERNELS_MATVEC_H

#include <stddef.h>

/* Largest M that the matrix-vector path handles well; above it sgemm's blocking (or, for block
 * types, the repacked 8-bit GEMM) wins. F32 and F16 weights: where k_fgemm runs (AVX-512), it
 * takes F32 from 3 rows and F16 at 6-8 rows and from 11 (k_linear_parts; 110M, 2 threads, tlm bench
 * tg, medians of 4 alternating runs: F32 at 8 rows 311 -> 511 tok/s, at 16 rows 428 -> 789);
 * elsewhere they stay here up to 16 rows, as sgemm re-packs every weight per call and reads it at a
 * fraction of the rate (12 rows 220 tok/s through sgemm, 390-405 here). */
#define K_MATVEC_MAX_ROWS 8
#define K_MATVEC_MAX_ROWS_FLOAT 16

#include "tlm.h"

/* One weight [out, in] of a k_matvec_parts call, in any type k_linear_takes, and where its
 * outputs go. */
typedef struct {
    const void *w;
    const float *b;   /* may be NULL */
    int out;          /* rows of w */
    size_t row_bytes; /* bytes between rows of w */
    tlm_dtype dtype;
    int col; /* first output column in y */
} k_matvec_part;

/* y[m, part.col + j] = x[m, :in] . part.w[j] (+ part.b[j]) for every part (n <=
 * K_LINEAR_MAX_PARTS), M rows of x (stride in) and y (stride ldy), in one parallel region over the
 * output rows of all parts. Parts of other types than F32 meet x as their type wants it (qdot.h):
 * quantized once per call, before the region. */
void k_matvec_parts(float *y, int ldy, const float *x, int M, int in, const k_matvec_part *parts,
                    int n);

#endif
