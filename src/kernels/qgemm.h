/* Prompt-sized products (many activation rows against one weight): on the ggml block types in
 * 8-bit integers (k_qgemm), as ik_llama.cpp computes them, and on float weights in fp32 register
 * tiles (k_fgemm; BF16 through k_qgemm). Each block-type weight row becomes unsigned bytes u with
 * w = s * u + m per sub-block of 32 (16 for Q2_K, Q3_K, Q6_K), s and m in fp32; sixteen rows are
 * interleaved four bytes at a time, so that one vpdpbusd multiplies 16 rows x 4 columns by a
 * broadcast group of four int8 activations (rows quantized in blocks of 32 with an fp32 scale).
 * The repacking is done per group of 16 rows, in a small per-thread buffer, right before that
 * group meets every activation row, or, for weights in a range a model registered (its mapped
 * file) with the pack cache on, once for the model's life. gemm_traits.h has the kernels, the
 * per-type record that picks them, and the legend of their names. */
#ifndef TLM_KERNELS_QGEMM_H
#define TLM_KERNELS_QGEMM_H

#include <stddef.h>
#include <stdint.h>

#include "tlm.h"

/* 1 if the type has an integer form (all block types), else 0. */
int k_qgemm_covers(tlm_dtype t);
/* 1 if k_qgemm will compute a product on this type: covered, and the CPU runs the AVX-512 VNNI
 * micro-kernel (k_isa() == K_ISA_AVX512), or AVX2's for the types whose integer form it takes
 * (weights up to 63: Q2_K to Q6_K, Q4_0 to Q5_1; with AVX-VNNI all of them); BF16 when the CPU
 * also has AVX512_BF16. */
int k_qgemm_takes(tlm_dtype t);
/* The instruction set to pass k_qgemm for a type here (K_ISA_AVX512 or K_ISA_AVX2), or -1 where
 * it takes none (k_qgemm_takes). */
int k_qgemm_isa(tlm_dtype t);
/* 1 if K_ISA_AVX2's products run on AVX-VNNI's 256-bit vpdpbusd (the CPU has it, k_avxvnni, and
 * k_qgemm_avxvnni_enable has not turned it off): then every block type, Q8_0 and IQ4 included. */
int k_qgemm_avxvnni_ok(void);
/* For tests and comparisons: 0 keeps AVX2's maddubs kernel on a CPU with AVX-VNNI. */
void k_qgemm_avxvnni_enable(int on);
/* 1 if the CPU runs vdpbf16ps (and the rest of the AVX-512 set k_qgemm uses). */
int k_qgemm_bf16_ok(void);
/* y[N, out] (row stride ldy) = x[N, in] W^T + b (b may be NULL) on W's integer form, with the
 * kernels of instruction set isa (K_ISA_REF: the plain C references; K_ISA_AVX512; K_ISA_AVX2 for
 * the types k_qgemm_takes names). BF16 weights (k_qgemm_takes, not k_qgemm_covers; linear.c sends
 * them here by default) take another kernel: activations rounded to BF16 (as decode does),
 * interleaved by 16 rows, and vdpbf16ps against the weight rows as they are, so nothing is
 * repacked or kept for them. Returns 0, or -1 (nothing written) when out of memory or the
 * type/instruction set is not available. */
int k_qgemm(float *y, int ldy, const float *x, int N, const tlm_weight *w, const float *b, int isa);
/* 1 if k_qgemm's BF16 products run on AMX tiles (amx-tile and amx-bf16 here, granted by the OS,
 * and not turned off by k_qgemm_amx_enable(0) or, in a benchmark build, TLM_AMX=off); isa
 * K_ISA_AVX512 then means AMX for BF16 weights. */
int k_qgemm_amx_ok(void);
/* 1 if k_qgemm's block-type products run on AMX int8 tiles (amx-tile and amx-int8, the same
 * switches; not Q2_K, Q3_K, Q6_K: k_gemm_ops.amx_int8); isa K_ISA_AVX512 then means AMX for them,
 * with the same results bit for bit. */
int k_qgemm_amx_int8_ok(void);
/* Turns the AMX path on (where the CPU has it) or off, for tests and comparisons; call it while
 * no product runs. */
void k_qgemm_amx_enable(int on);
/* 1 if k_fgemm computes products here (AVX-512, not capped by TLM_ISA). */
int k_fgemm_ok(void);
/* y[N, out] (row stride ldy) = x[N, in] W^T + b (b may be NULL) for F32 and F16 weights, fp32
 * arithmetic: register tiles of 8 weight rows x 48 activation rows, or with up to 8 activation rows
 * (batched decode) and an even row length, 8 weight rows against pairs of columns of the 8 (F16
 * rows widened a block at a time). A row's sums do not depend on the other rows within either
 * form. Returns 0; -1 with nothing written for other types or without AVX-512; -1 with y
 * incomplete when out of memory. */
int k_fgemm(float *y, int ldy, const float *x, int N, const tlm_weight *w, const float *b);

/* With the pack cache on (k_qgemm_cache_enable(1), or TLM_QCACHE=on in a benchmark build),
 * weights with data in [base, base + len) (a read-only model's mapped file) are repacked once and
 * kept (about 1.25 bytes per weight: a byte, plus two floats per sub-block) until
 * k_qgemm_forget(base, len), which the model calls before it unmaps the file. */
void k_qgemm_register(const void *base, size_t len);
void k_qgemm_forget(const void *base, size_t len);
/* Bytes of repacked copies kept for weights in [base, base + len). */
size_t k_qgemm_cached_bytes(const void *base, size_t len);
/* Turns the pack cache on or off (off unless turned on), for tests and comparisons; call it while
 * no product runs. */
void k_qgemm_cache_enable(int on);

/* ---- the pieces, for tests ---- */
/* Sub-block length of the type's integer form (32 or 16; 0: not covered). */
int k_qgemm_sub(tlm_dtype t);
/* Rows r0 .. r0 + nrows - 1 (nrows <= 16) of W in the interleaved form, the plain C reference:
 * q[in / 4][16][4] bytes, s and m [in / sub][16] floats; rows past nrows are zero. */
void k_qgemm_pack(const tlm_weight *w, int r0, int nrows, uint8_t *q, float *s, float *m);
/* The same, in AVX-512 where isa asks for it and the CPU has it (whole groups of the types with
 * k_gemm_ops.pack16_avx512), with the same bytes and floats; k_qgemm_pack otherwise. */
void k_qgemm_pack_isa(int isa, const tlm_weight *w, int r0, int nrows, uint8_t *q, float *s,
                      float *m);
/* One activation row x[n] as int8 q[n], scales d[n / 32] and d * (sum of q) per sub-block
 * ds[n / sub]: the plain C reference. */
void k_qgemm_quantize(const float *x, int n, int sub, int8_t *q, float *d, float *ds);
/* The same at instruction set isa where the CPU has it (K_ISA_AVX512, K_ISA_AVX2), with the same
 * bytes and floats; k_qgemm_quantize otherwise. */
void k_qgemm_quantize_isa(int isa, const float *x, int n, int sub, int8_t *q, float *d, float *ds);
/* k_fgemm with the kernels of isa: K_ISA_REF (the plain C tiles, equal to the AVX-512 ones bit for
 * bit) or K_ISA_AVX512 (where k_fgemm_ok). */
int k_fgemm_at(float *y, int ldy, const float *x, int N, const tlm_weight *w, const float *b,
               int isa);

#endif
