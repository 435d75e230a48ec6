/* Dot products of one weight row in its file type (F16, BF16, the ggml block types) with one row
 * of activations prepared for that type, as llama.cpp computes them: the 32-element block types
 * meet activations quantized to Q8_0 blocks, the K types Q8_K blocks (256 int8 and a float scale,
 * plus sums of 16), BF16 meets activations rounded to BF16, F16 meets F32. Each type has a plain C
 * reference (ref/); AVX2 and AVX-512 (VNNI vpdpbusd, BF16 vdpbf16ps) versions (x86/) are compiled
 * with target attributes and chosen at run time from the CPU's features, so one binary runs on any
 * x86-64. This is the callers' view; traits.h says where each type's kernels are chosen and how a
 * type is added. */
#ifndef TLM_KERNELS_QDOT_H
#define TLM_KERNELS_QDOT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cpu.h"
#include "tlm.h"

/* How a type wants its activations (K_ACT_NONE: the type is not computed on). */
typedef enum { K_ACT_NONE, K_ACT_F32, K_ACT_BF16, K_ACT_Q8_0, K_ACT_Q8_K, K_ACT_COUNT } k_act_kind;

/* llama.cpp's block_q8_K: x = d * q; bsums[j] = sum of q[16j .. 16j + 15]. */
typedef struct {
    float d;
    int8_t qs[256];
    int16_t bsums[16];
} k_block_q8_k;

/* ---- activation rows ----------------------------------------------------------------------- */

k_act_kind k_act_of(tlm_dtype t);
/* A K_ACT_Q8_0 row of n elements: n / 32 core_block_q8_0 as llama.cpp's, then, from the next
 * 64-byte boundary of the row, n / 32 floats: each block's scale d, widened. The vector kernels
 * load four of them at once instead of widening four f16 scattered 34 bytes apart; the references
 * read only the blocks. */
static inline size_t k_act_q8_0_aux_at(int n) { return ((size_t)(n / 32) * 34 + 63) & ~(size_t)63; }
static inline const float *k_act_q8_0_aux(const void *xq, int n) {
    return (const float *)(const void *)((const uint8_t *)xq + k_act_q8_0_aux_at(n));
}
/* Then, from the next 64-byte boundary, per group of four blocks (n / 128 groups, K_ACT_NIB_BYTES
 * each): the four blocks' elements 0-15 (16 bytes per block), their elements 16-31, and 16 int32:
 * -8 times the sum of the 8 activations that each 32-bit lane of a VNNI product over the two
 * vectors meets (lane 4k + l: elements 4l .. 4l + 3 and 16 + 4l .. 19 + 4l of block k). A Q4_0
 * byte holds elements j and 16 + j of its block, so four weight blocks' nibbles meet these as
 * they lie, with no shuffle per activation row. */
#define K_ACT_NIB_BYTES 192
static inline size_t k_act_q8_0_nib_at(int n) {
    return (k_act_q8_0_aux_at(n) + (size_t)(n / 32) * sizeof(float) + 63) & ~(size_t)63;
}
static inline const uint8_t *k_act_q8_0_nib(const void *xq, int n) {
    return (const uint8_t *)xq + k_act_q8_0_nib_at(n);
}

/* A K_ACT_Q8_K row of n elements: n / 256 k_block_q8_k as llama.cpp's, then, from the next
 * 64-byte boundary, per block its 256 qs again with the 32-element runs in the order 0 2 1 3 4 6
 * 5 7. A 64-byte load of Q4_K's qs holds runs 4h and 4h + 2 in its low nibbles and 4h + 1 and
 * 4h + 3 in its high ones, so the weights meet these as they lie, with no shuffle per activation
 * row; the references read only the blocks. */
static inline size_t k_act_q8_k_nib_at(int n) {
    return ((size_t)(n / 256) * sizeof(k_block_q8_k) + 63) & ~(size_t)63;
}
static inline const int8_t *k_act_q8_k_nib(const void *xq, int n) {
    return (const int8_t *)(const void *)((const uint8_t *)xq + k_act_q8_k_nib_at(n));
}
/* Block b's copy there (g at its 256 bytes): its 32-byte runs in the order 0 2 1 3 4 6 5 7. */
static inline void k_act_q8_k_nib_fill(int8_t *g, const int8_t *qs) {
    static const int order[8] = {0, 2, 1, 3, 4, 6, 5, 7};
    for (int r = 0; r < 8; r++)
        for (int i = 0; i < 32; i++) g[32 * r + i] = qs[32 * order[r] + i];
}

/* Round to nearest, ties to even, for |f| < 2^22 (llama.cpp's nearest_int): the activation
 * quantizers' reference and the IQ4 search. */
static inline int k_nearest_int(float f) {
    float v = f + 12582912.0f;
    int32_t i;
    memcpy(&i, &v, 4);
    return (i & 0x007fffff) - 0x00400000;
}

/* Bytes of one activation row of n elements for a type (0: type not computed on). */
size_t k_act_row_bytes(tlm_dtype t, int n);
/* x[n] to the activation form the type wants (n a whole number of its blocks). */
void k_act_quantize(k_act_kind kind, const float *x, void *xq, int n);
/* The same in plain C, which the vector version (AVX-512 or AVX2, chosen as the dot products are)
 * matches byte for byte. */
void k_act_quantize_ref(k_act_kind kind, const float *x, void *xq, int n);
/* n floats (a multiple of 32) into n / 32 Q8_0 blocks as llama.cpp's CPU backend stores a q8_0 KV
 * cache (its x86 quantize_row_q8_0: K_ACT_Q8_0's blocks without what follows them), which rounds
 * ties to even where `tlm quantize` (quantize_row_q8_0_ref, as GGUF files are written) rounds them
 * away from zero. The vector version (AVX-512) matches the reference byte for byte. */
void k_q8_0_blocks(const float *x, void *y, int n);
void k_q8_0_blocks_ref(const float *x, void *y, int n);
/* core_quantize_rows with the kernels' vector versions where they exist, byte for byte the same
 * (IQ4_NL and IQ4_XS's search on AVX-512 lanes). tlm quantize's tensors and (through
 * k_narrow_row) the KV cache's stores go through it. */
tlm_status k_quantize_rows(tlm_dtype t, const float *x, void *y, size_t rows, size_t cols,
                           const float *qw);

/* ---- instruction sets ---------------------------------------------------------------------- */

/* The best instruction set this CPU runs (in a benchmark build, TLM_ISA=ref|avx2|avxvnni caps it,
 * for comparisons: src/core/knob.h). */
int k_isa(void);
/* 1 where the CPU has AVX-VNNI and k_isa() is at least K_ISA_AVX2 (not under TLM_ISA=avx2): the
 * 256-bit vpdpbusd that K_ISA_AVX2 kernels may use. */
int k_avxvnni(void);
/* 0: as if the CPU had no AVX-VNNI from now on (for tests: the AVX2 kernels without it); 1: back.
 * Call it while no product runs. */
void k_avxvnni_cap(int on);
/* 1 on AMD's x86 CPUs (cpuid's vendor), for choices that measured differently there. */
int k_cpu_amd(void);
/* Caps the instruction set the dot products and activation quantizers are chosen at from now on
 * (K_ISA_REF: the references). For tests and comparisons; call it while no product runs. */
void k_isa_cap(int isa);

/* ---- the kernels' shapes (traits.h's legend names them) ------------------------------------ */

/* s = w . x over n elements (a whole number of w's blocks); xq is the activation row in
 * k_act_of(type)'s form. */
typedef void k_vdot_kernel(int n, float *s, const void *w, const void *xq);
typedef k_vdot_kernel *k_vdot_fn;

/* Most activation rows a k_vdot_rows_fn takes in one call. */
#define K_VDOT_MAX_ROWS 8
/* s[m] = w . xq_m for m < M (1 <= M <= K_VDOT_MAX_ROWS), xq_m = xq + m * xstride bytes: one
 * weight row against several activation rows, each weight load and unpacking shared by all of
 * them (decode of several sequences at once). Defined as the type's k_vdot per row; the vector
 * versions sum in another order. */
typedef void k_vdot_rows_kernel(int n, int M, float *s, const void *w, const void *xq,
                                size_t xstride);
typedef k_vdot_rows_kernel *k_vdot_rows_fn;

/* Most activation rows a k_vdot_rows3_fn takes in one call. */
#define K_VDOT3_MAX_ROWS 4
/* Three weight rows (w, w + wstride, w + 2 wstride bytes) against M activation rows (1 <= M <=
 * K_VDOT3_MAX_ROWS): s[r * M + m] = w_r . xq_m, each bit for bit what k_vdot_rows gives for that
 * pair. Each activation vector loaded serves three weight rows: more than 8 activation rows (tlm
 * serve's batched decode) no longer fit in L1, and the loads from L2 then bound the one-row
 * kernel. F32 and F16 (AVX-512); NULL elsewhere. */
typedef void k_vdot_rows3_kernel(int n, int M, float *s, const void *w, size_t wstride,
                                 const void *xq, size_t xstride);
typedef k_vdot_rows3_kernel *k_vdot_rows3_fn;

/* Four weight rows (w + r * wstride bytes, r < 4) against one activation row: s[r] = w_r . xq,
 * each bit for bit what the type's one-row product gives (k_vdot_rows with M = 1 where the type
 * has it, else k_vdot). The activation's loads and preparation are shared and four rows'
 * reductions overlap, which is what bounds cache-resident or compute-heavy rows; long rows of
 * types with a cheap one-row kernel go one at a time instead, one sequential stream
 * (k_matvec_parts). AVX-512 (every type with a several-row kernel, and BF16 with AVX512_BF16) and
 * AVX2 (F32, F16 and the block types but Q4_1, Q5_0 and Q5_1); NULL elsewhere. Unless pf is NULL,
 * the block types' kernels also prefetch the 4 * wstride bytes from pf (the unit after next), a
 * share per step of their loop; pf may point past the weights' end. The F32, F16 and BF16 kernels
 * ignore pf: k_matvec_parts asks for their units' lines all at once, which measured faster.
 * A call runs `units` such groups of four rows one after another: group u is rows 4u .. 4u + 3
 * into s[4u .. 4u + 3], prefetching from pf + 4u * wstride. */
typedef void k_vdot_w4_kernel(int n, float *s, const void *w, size_t wstride, const void *xq,
                              const void *pf, int units);
typedef k_vdot_w4_kernel *k_vdot_w4_fn;

/* An activation row's quantizer: x[n] into the row xq (k_act_quantize's kinds; or Q8_0 blocks
 * alone, k_q8_0_blocks). */
typedef void k_act_quantize_kernel(const float *x, void *xq, int n);
/* Row conversions: n elements of a float type to floats, n floats to a float type, and n floats
 * (whole blocks) to a block type with an importance matrix's weights qw (or NULL). */
typedef void k_widen_kernel(const void *src, float *dst, int n);
typedef void k_narrow_kernel(const float *src, void *dst, int n);
typedef void k_quantize_kernel(const float *x, void *y, int n, const float *qw);

/* ---- the kernels of a type ----------------------------------------------------------------- */

/* The dot product of a type at one instruction set; NULL when that set has no version of its own
 * for the type or the CPU lacks it. k_vdot: the best available (never NULL for a computed type). */
k_vdot_fn k_vdot_get(tlm_dtype t, int isa);
k_vdot_fn k_vdot(tlm_dtype t);
/* The several-row version at one instruction set (NULL where it has none: callers then call the
 * one-row dot per row); k_vdot_rows: the best available under the cap, or NULL. */
k_vdot_rows_fn k_vdot_rows_get(tlm_dtype t, int isa);
k_vdot_rows_fn k_vdot_rows(tlm_dtype t);
k_vdot_rows3_fn k_vdot_rows3(tlm_dtype t);
k_vdot_w4_fn k_vdot_w4(tlm_dtype t);

/* The decode kernels' L2 prefetch on Intel's CPUs (x86/vec_dot_x86.h's prefetch_far says why):
 * this many weight rows past the L1 prefetch, for rows of more than K_PF_FAR_MIN_COLS columns
 * (shorter ones belong to models small enough to sit in L3, where it cost). */
#define K_PF_FAR_ROWS 16
#define K_PF_FAR_MIN_COLS 256

/* One weight row of n elements to floats (core_dtype_to_f32, vectorized where it matters). */
void k_widen_row(tlm_dtype t, const void *src, float *dst, int n);
/* n floats to one row of a float type (core_dtype_from_f32's bits, vectorized for F16): the F16 KV
 * cache's stores. */
void k_narrow_row(tlm_dtype t, const float *src, void *dst, int n);

/* Thread-local scratch (one buffer per slot and thread, kept and grown): NULL when out of
 * memory. Callers must not hold it across calls that may use the same slot. */
void *k_scratch(int slot, size_t bytes);

#endif
