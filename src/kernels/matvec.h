/* Matrix-vector products for the decode step. With one (or a few) rows of input, sgemm spends
 * more time packing than multiplying; here every weight row is streamed from memory exactly once
 * and reused from L1 for all input rows, so decoding runs at memory bandwidth. */
#ifndef TLM_KERNELS_MATVEC_H
#define TLM_KERNELS_MATVEC_H

/* Largest M that k_matvec handles well; above it sgemm's blocking wins. */
#define K_MATVEC_MAX_ROWS 8

/* y[M,out] = x[M,in] W[out,in]^T (+ b[out]); b may be NULL. OpenMP over output rows. */
void k_matvec(float *y, const float *x, const float *w, const float *b, int M, int in, int out);

/* Same product, picking k_matvec for small M and sgemm (k_linear_fwd) otherwise. */
void k_linear_auto(float *y, const float *x, const float *w, const float *b, int M, int in,
                   int out);

#endif
