/* Matrix-vector products for the decode step. With one (or a few) rows of input, sgemm spends
 * more time packing than multiplying; here every weight row is streamed from memory exactly once
 * and reused from L1 for all input rows, so decoding runs at memory bandwidth. */
#ifndef TLM_KERNELS_MATVEC_H
#define TLM_KERNELS_MATVEC_H

#include <stddef.h>

/* Largest M that the matrix-vector path handles well; above it sgemm's blocking (or, for block
 * types, the repacked 8-bit GEMM) wins. F32 and F16 weights: where k_fgemm runs (AVX-512), it
 * takes F32 from 3 rows and F16 at 6-8 rows and from 11 (linear.c's float_rows_matvec); elsewhere
 * they stay here up to 16 rows, as sgemm re-packs every weight per call and reads it at a fraction
 * of the rate (tlm bench tg -b on 110M shows both). */
#define K_MATVEC_MAX_ROWS 8
#define K_MATVEC_MAX_ROWS_FLOAT 16

#include "kernels.h"
#include "qdot.h"
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

/* The same product prepared once (k_matvec_plan_init: x quantized as the parts want it, each part's
 * kernels chosen) and then run whole (k_matvec_plan_run) or by ranges of a part's output rows from
 * any thread (k_matvec_plan_rows): decode's q|k|v product computes each head's rows in the job that
 * then attends with them (block.c). The quantized rows live in the preparing thread's scratch
 * (k_scratch slot 0) until its next product. */
typedef struct {
    float *y;
    int ldy;
    const float *x;
    int M, in, n;
    int unit_rows; /* output rows per unit of work (4, or 3 with the x3m4 kernels) */
    int parallel;  /* large enough to share among threads */
    long units;
    k_matvec_part parts[K_LINEAR_MAX_PARTS];
    long first_unit[K_LINEAR_MAX_PARTS + 1];
    /* Per part, chosen once (traits.h's shapes): */
    k_vdot_rows3_fn dot_x3m4[K_LINEAR_MAX_PARTS]; /* three weight rows at a time, or NULL */
    k_vdot_w4_fn dot_x4[K_LINEAR_MAX_PARTS];      /* four weight rows at a time, or NULL */
    /* the unit after next asked for ahead of each unit, and by the x4 kernel a share per step
     * of its loop (k_vdot_w4_fn's pf) rather than all at once */
    int prefetch_ahead[K_LINEAR_MAX_PARTS], prefetch_spread[K_LINEAR_MAX_PARTS];
    int row_prefetch[K_LINEAR_MAX_PARTS]; /* the m8 kernel's weight rows prefetched one by one */
    size_t row_prefetch_far[K_LINEAR_MAX_PARTS]; /* and their L2 prefetch's distance, or 0 */
    k_vdot_fn dot[K_LINEAR_MAX_PARTS];
    k_vdot_rows_fn dot_m8[K_LINEAR_MAX_PARTS]; /* one weight row at a time, or NULL */
    const uint8_t *act[K_LINEAR_MAX_PARTS];    /* the activation rows in the part's form */
    size_t act_stride[K_LINEAR_MAX_PARTS];     /* bytes from one activation row to the next */
} k_matvec_plan;

void k_matvec_plan_init(k_matvec_plan *pl, float *y, int ldy, const float *x, int M, int in,
                        const k_matvec_part *parts, int n);
void k_matvec_plan_run(const k_matvec_plan *pl);
/* Output rows [r0, r1) of part p; r0 a multiple of pl->unit_rows, r1 one too or the part's end.
 */
void k_matvec_plan_rows(const k_matvec_plan *pl, int p, int r0, int r1);
/* Output columns [c0, c1) of y, across parts; where they meet a part, its rows there must start
 * and end on units of pl->unit_rows rows (or at its end), as for k_matvec_plan_rows. */
void k_matvec_plan_cols(const k_matvec_plan *pl, int c0, int c1);
/* How k_linear computes products of more rows than the matrix-vector path takes (prompts):
 * K_PREFILL_DEFAULT chooses by type and CPU (linear.c's prefill_path), K_PREFILL_SGEMM widens every
 * type to F32 tiles for sgemm (F32 straight), K_PREFILL_INT8 runs the decode kernels over all rows
 * (types other than F32 and F16). For tests and comparisons; call it while no product runs.
 * Returns the path it replaces. */
typedef enum { K_PREFILL_DEFAULT, K_PREFILL_SGEMM, K_PREFILL_INT8 } k_prefill_path;
k_prefill_path k_linear_prefill(k_prefill_path path);

/* k_linear_parts's product as a plan where it takes the matrix-vector path (a decode step's few
 * rows): 1 with *pl ready; 0 where it goes another way (sgemm, the 8-bit GEMM). */
int k_linear_parts_plan(k_matvec_plan *pl, float *y, int ldy, const float *x, int N,
                        const tlm_weight *const *w, const float *const *b, int n,
                        const tlm_weight *fused);

#endif
