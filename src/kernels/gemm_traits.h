/* The prompt-sized products' kernels and the per-type record that picks them (qgemm.h has the
 * entry points). Where a kernel goes:
 *   ref/gemm_ref.c            the integer form's plain C reference: the pack of each block type,
 *                             the activation quantizer, the micro-kernel
 *   ref/fgemm_ref.c           the float tiles' plain C references (BF16, F32/F16)
 *   x86/gemm_pack_avx512.c    the integer form's pack of whole groups in AVX-512, per block type
 *   x86/gemm_vnni_avx512.c    AVX-512 VNNI micro-kernel and activation quantizer
 *   x86/gemm_avx2.c           AVX2 micro-kernels (maddubs; AVX-VNNI) and activation quantizer
 *   x86/gemm_bf16_avx512.c    vdpbf16ps tiles on BF16 weights
 *   x86/fgemm_avx512.c        fp32 tiles on F32/F16 weights
 *   x86/amx.c                 AMX tiles: BF16 products, and the int8 micro-kernel
 *   gemm_traits.c             the table below, one record per block type
 *   gemm_cache.c              the registry of weights repacked once for a model's life
 *   qgemm.c, fgemm.c          the drivers: the plan of a call, its team split, its dispatch
 * A new block type adds its scalar pack (and, if measured worth it, its AVX-512 pack) and one
 * record in gemm_traits.c; a new instruction set adds a micro-kernel with k_qgemm_micro_fn's
 * contract (bit for bit the reference's) and its branch in qgemm.c's plan.
 *
 * Kernel names: k_<product>_<role>[_<shape>][_<types>]_<isa>; the product qgemm (the repacked
 * integer form), bf16_gemm or fgemm (float weights); the isa ref (plain C), avx2, avxvnni,
 * avx512, avx512vnni, avx512bf16 or amxint8 (x86/simd.h's K_TARGET_*); the shape weight rows x
 * activation rows of one call's register tile:
 *   qgemm_micro_16x8     16 repacked weight rows x up to 8 activation rows, one accumulator
 *                        vector per activation row (AVX-512: 16 lanes = the 16 weight rows)
 *   qgemm_micro_16x3     16 weight rows (two vectors of 8) x 3 activation rows at a time, for
 *                        AVX2's 16 registers; called with up to 8 rows, it loops in threes
 *   qgemm_micro_16x16    16 weight rows x 16 activation rows, one AMX tile of int32 sums
 *   qgemm_pack16         a whole group of 16 weight rows into the integer form
 *   *_tile_8x48          up to 8 weight rows x up to 3 tiles of 16 activation rows (24
 *                        accumulators), activations interleaved by column in 16-row tiles
 *   fgemm_tile_8x8_pairs up to 8 weight rows x up to 8 activation rows, a vector holding two
 *                        columns of the 8 rows (batched decode)
 *   interleave16         activation rows into 16-row tiles interleaved by column
 * A _ref kernel is the plain C reference of the contract its vector versions share. */
#ifndef TLM_KERNELS_GEMM_TRAITS_H
#define TLM_KERNELS_GEMM_TRAITS_H

#include <stddef.h>
#include <stdint.h>

#include "tlm.h"

#if defined(__x86_64__) || defined(__i386__)
#define K_GEMM_X86 1
#else
#define K_GEMM_X86 0
#endif

#define K_QG_ROWS 16 /* weight rows per interleaved group */
#define K_QG_ACTS 8  /* activation rows per call of the 16x8 and 16x3 micro-kernels */

typedef struct k_gemm_ops k_gemm_ops;

/* One weight row's nb blocks at blk as row r (< K_QG_ROWS) of a group: its bytes into lane r of
 * q[n / 4][16][4], its sub-blocks' scales and offsets into s[j * 16 + r] and m[j * 16 + r]. */
typedef void k_qgemm_pack_row_fn(tlm_dtype t, const uint8_t *blk, int nb, int r, uint8_t *q,
                                 float *s, float *m);
/* Rows r0 .. r0 + 15 of w (all present) as one group, the same bytes and floats as the rows'
 * k_qgemm_pack_row_fn. */
typedef void k_qgemm_pack16_fn(const tlm_weight *w, int r0, uint8_t *q, float *s, float *m);
/* One activation row x[n] as int8 q[n], scales d[n / 32] and d * (sum of q) per sub-block
 * ds[n / sub]: every version gives the reference's (k_qgemm_quantize) bytes and floats. */
typedef void k_qgemm_quantize_fn(const float *x, int n, int sub, int8_t *q, float *d, float *ds);
/* out[a][16] = one packed group of the type ops (q, s, m) . activation rows a < na; activation row
 * a starts at xq + a * n, xd + a * n / 32, xs + a * n / sub. Every version gives the reference's
 * floats bit for bit (the same integer sums, then the same fp32 operations in the same order). */
typedef void k_qgemm_micro_fn(const k_gemm_ops *ops, int n, const uint8_t *q, const float *s,
                              const float *m, const int8_t *xq, const float *xd, const float *xs,
                              int na, float *out);

/* What a block type's integer form is, and which kernels take it. */
struct k_gemm_ops {
    int sub; /* sub-block length: 32, or 16 where the type's scales change every 16 elements */
    /* The largest byte of the integer form where AVX2's maddubs kernel takes it, else 0: maddubs
     * adds pairs of unsigned weight x signed activation products into int16, which saturates past
     * 32767, so bytes up to 63 fit (2 * 63 * 127); Q8_0's and the IQ4 types' w + 128 do not. */
    int maddubs_max;
    /* 1 where AMX int8 tiles run its products: sub-blocks of 16 give each tdpbsud half the work
     * for the same scaling, and Q6_K ran slower than on vpdpbusd (bench/quant/prefill_paths.sh). */
    int amx_int8;
    k_qgemm_pack_row_fn *pack_row;    /* the plain C pack, one row at a time */
    k_qgemm_pack16_fn *pack16_avx512; /* whole groups in AVX-512; NULL: the plain C pack */
};

/* The type's record; NULL where it has no integer form (the float types). */
const k_gemm_ops *k_gemm_ops_of(tlm_dtype t);

/* BF16: R (<= 8) weight rows (row_bytes apart) x T (<= 3) tiles of 16 activation rows, each tile
 * a pair of columns of its 16 rows per 32-bit word (tile_words apart): out[t][r][a] (rows past R
 * unused). */
typedef void k_bf16_tile_fn(int R, int T, int n, const uint8_t *w, size_t row_bytes,
                            const uint32_t *xt, size_t tile_words, float *out);
/* A row of n floats to BF16, rounded to nearest even (core_f32_to_bf16's results). */
typedef void k_bf16_round_row_fn(const float *x, int n, uint16_t *y);
/* F32: R (<= 8) weight rows (ldw floats apart) x T (<= 3) tiles of 16 activation rows
 * interleaved by column (tile_floats apart): out[t][r][a]. pf, if not NULL: prefetch
 * pf + k * pf_step at column k. Each sum is fmaf over k in order from 0. */
typedef void k_fgemm_tile_fn(int R, int T, int n, const float *w, size_t ldw, const float *xt,
                             size_t tile_floats, float *out, const char *pf, size_t pf_step);
/* F32, up to 8 activation rows: xt[p * 16 + 2a + j] = x[a][2p + j], n even; out[r * 8 + a] = the
 * even columns' fmaf sum + the odd columns'. */
typedef void k_fgemm_pairs_fn(int R, int n, const float *w, size_t ldw, const float *xt, float *out,
                              const char *pf, size_t pf_step);
/* Rows 0 .. rows - 1 of x (row stride n; rows past them zero) interleaved by column:
 * dst[k * 16 + a] = x[a][k]. */
typedef void k_fgemm_interleave_fn(const float *x, int n, int rows, float *dst);

/* ---- between the drivers ---- */
/* 1 if this CPU runs the kernels of instruction set isa (K_ISA_REF always). */
int k_gemm_isa_ok(int isa);
/* k_qgemm on BF16 weights (fgemm.c). */
int k_bf16_gemm(float *y, int ldy, const float *x, int N, const tlm_weight *w, const float *b,
                int isa);
/* Bytes of one repacked group of n columns: s and m [n / sub][16] floats, then q [n / 4][16][4]. */
static inline size_t k_qgemm_group_bytes(int n, int sub) {
    return 2 * ((size_t)n / sub) * K_QG_ROWS * sizeof(float) + (size_t)n * K_QG_ROWS;
}
/* The whole weight repacked at isa (groups of k_qgemm_group_bytes, back to back), kept from an
 * earlier call or built now, where the pack cache is on and w lies in a registered range; NULL
 * otherwise or without memory for it (gemm_cache.c). */
const char *k_qgemm_cache_get(const tlm_weight *w, size_t pack_bytes, int isa);

/* ---- ref/gemm_ref.c ---- */
k_qgemm_pack_row_fn k_qgemm_pack_row_q8_0_q4_q5_ref; /* Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 */
k_qgemm_pack_row_fn k_qgemm_pack_row_q4_K_q5_K_ref;
k_qgemm_pack_row_fn k_qgemm_pack_row_q6_K_ref;
k_qgemm_pack_row_fn k_qgemm_pack_row_q2_K_q3_K_ref;
k_qgemm_pack_row_fn k_qgemm_pack_row_iq4_nl_xs_ref;
k_qgemm_micro_fn k_qgemm_micro_16x8_ref;
/* ---- ref/fgemm_ref.c ---- */
k_bf16_tile_fn k_bf16_gemm_tile_8x48_ref;
k_bf16_round_row_fn k_bf16_round_row_ref;
k_fgemm_tile_fn k_fgemm_tile_8x48_ref;
k_fgemm_pairs_fn k_fgemm_tile_8x8_pairs_ref;
k_fgemm_interleave_fn k_fgemm_interleave16_ref;

#if K_GEMM_X86
/* ---- x86/gemm_pack_avx512.c ---- */
k_qgemm_pack16_fn k_qgemm_pack16_q8_0_q4_0_avx512;
k_qgemm_pack16_fn k_qgemm_pack16_q2_K_q3_K_avx512;
k_qgemm_pack16_fn k_qgemm_pack16_q4_K_q5_K_avx512;
k_qgemm_pack16_fn k_qgemm_pack16_q6_K_avx512;
k_qgemm_pack16_fn k_qgemm_pack16_iq4_nl_avx512;
k_qgemm_pack16_fn k_qgemm_pack16_iq4_xs_avx512;
/* ---- x86/gemm_vnni_avx512.c ---- */
k_qgemm_micro_fn k_qgemm_micro_16x8_avx512vnni;
k_qgemm_quantize_fn k_qgemm_quantize_avx512;
/* ---- x86/gemm_avx2.c ---- */
k_qgemm_micro_fn k_qgemm_micro_16x3_avx2; /* types with maddubs_max only */
k_qgemm_micro_fn k_qgemm_micro_16x3_avxvnni;
k_qgemm_quantize_fn k_qgemm_quantize_avx2;
/* ---- x86/gemm_bf16_avx512.c ---- */
k_bf16_tile_fn k_bf16_gemm_tile_8x48_avx512bf16;
k_bf16_round_row_fn k_bf16_round_row_avx512bf16;
/* ---- x86/fgemm_avx512.c ---- */
k_fgemm_tile_fn k_fgemm_tile_8x48_avx512;
k_fgemm_pairs_fn k_fgemm_tile_8x8_pairs_avx512;
k_fgemm_interleave_fn k_fgemm_interleave16_avx512;
/* ---- x86/amx.c ---- */
/* y[N, out] (row stride ldy) = x W^T + b for BF16 weights on AMX tiles (k_qgemm_amx_ok). 0, or
 * -1 when out of memory. */
int k_bf16_gemm_amx(float *y, int ldy, const float *x, int N, const tlm_weight *w, const float *b);
/* The calling thread's tiles for k_qgemm_micro_16x16_amxint8 on sub-blocks of sub, and their
 * release at the end of its share (no thread keeps AMX state between products). */
void k_qgemm_amx_int8_begin(int sub);
void k_amx_end(void);
/* na is 16 here: the activation rows are padded with zero rows to a multiple of 16. */
k_qgemm_micro_fn k_qgemm_micro_16x16_amxint8;
#endif

#endif
