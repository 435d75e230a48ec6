/* The ggml block types as they lie in GGUF files (little-endian, no padding), so that a mapped
 * file is an array of these structs. Every type stores a run of consecutive elements of one row:
 * 32 for the simple types, 256 (a "super-block") for the K types, whose sub-blocks of 16 or 32
 * carry their own small scales multiplied by the block's f16 scale. The reference widening of
 * each type is core_dtype_to_f32 (src/core/dtype.c); kernels in src/kernels compute on them. */
#ifndef TLM_CORE_QUANT_H
#define TLM_CORE_QUANT_H

#include <stdint.h>

#define CORE_QK 32    /* elements per block of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 */
#define CORE_QK_K 256 /* elements per super-block of the K types */

/* x = d * q, q in [-128, 127] */
typedef struct {
    uint16_t d; /* f16 */
    int8_t qs[CORE_QK];
} core_block_q8_0;

/* x = d * (q - 8); byte j holds element j (low nibble) and element j + 16 (high nibble) */
typedef struct {
    uint16_t d;
    uint8_t qs[CORE_QK / 2];
} core_block_q4_0;

/* x = d * q + m, nibbles as in Q4_0 */
typedef struct {
    uint16_t d, m;
    uint8_t qs[CORE_QK / 2];
} core_block_q4_1;

/* x = d * (q - 16); the fifth bit of element j is bit j of qh (a little-endian uint32) */
typedef struct {
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[CORE_QK / 2];
} core_block_q5_0;

/* x = d * q + m, bits as in Q5_0 */
typedef struct {
    uint16_t d, m;
    uint8_t qh[4];
    uint8_t qs[CORE_QK / 2];
} core_block_q5_1;

/* Eight sub-blocks of 32: x = d * sc[j] * q - dmin * mn[j], with 6-bit sc and mn packed in 12
 * bytes (core_q4k_scale_min). qs: 4 groups of 32 bytes; group g holds sub-block 2g in the low
 * nibbles and 2g + 1 in the high ones. */
typedef struct {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qs[CORE_QK_K / 2];
} core_block_q4_k;

/* Q4_K plus a fifth bit: bit 2g (sub-block 2g) and 2g + 1 (sub-block 2g + 1) of qh[l] belong to
 * the l-th element of those sub-blocks. */
typedef struct {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qh[CORE_QK_K / 8];
    uint8_t qs[CORE_QK_K / 2];
} core_block_q5_k;

/* Sixteen sub-blocks of 16: x = d * sc[j] * (q - 32), q 6 bits: low 4 in ql, high 2 in qh. */
typedef struct {
    uint8_t ql[CORE_QK_K / 2];
    uint8_t qh[CORE_QK_K / 4];
    int8_t scales[CORE_QK_K / 16];
    uint16_t d;
} core_block_q6_k;

/* Sixteen sub-blocks of 16: x = d * (sc[j] & 15) * q - dmin * (sc[j] >> 4), q 2 bits. Each half
 * h of the block (128 elements) has 32 bytes of qs: element 32i + l (i = 0..3, l = 0..31) of the
 * half is bits 2i, 2i + 1 of qs[32h + l], in sub-block 8h + 2i + l / 16. */
typedef struct {
    uint8_t scales[CORE_QK_K / 16];
    uint8_t qs[CORE_QK_K / 4];
    uint16_t d, dmin;
} core_block_q2_k;

/* Sixteen sub-blocks of 16: x = d * (sc[j] - 32) * (q - 4 + 4 * hbit), q 2 bits laid out as
 * Q2_K's, hbit of element 32i + l of half h bit 4h + i of hmask[l], sc 6 bits packed in 12 bytes
 * (core_q3k_scale). */
typedef struct {
    uint8_t hmask[CORE_QK_K / 8];
    uint8_t qs[CORE_QK_K / 4];
    uint8_t scales[12];
    uint16_t d;
} core_block_q3_k;

/* IQ4_NL: 32 values as 4-bit indices into a fixed non-linear table (core_iq4nl_values), in
 * Q4_0's layout (low nibbles of qs elements 0-15, high ones 16-31): x = d * values[idx]. */
typedef struct {
    uint16_t d;
    uint8_t qs[CORE_QK / 2];
} core_block_iq4_nl;

/* IQ4_XS: eight sub-blocks of 32, each in IQ4_NL's layout (16 bytes of qs), with a 6-bit scale
 * (core_iq4xs_scale): x = d * (ls - 32) * values[idx]. */
typedef struct {
    uint16_t d;
    uint16_t scales_h; /* the top two bits of sub-block j's scale at bit 2j */
    uint8_t
        scales_l[CORE_QK_K / 64]; /* the low four: sub-block j's in nibble j % 2 of byte j / 2 */
    uint8_t qs[CORE_QK_K / 2];
} core_block_iq4_xs;

/* The sixteen levels of IQ4_NL and IQ4_XS (dtype.c). */
extern const int8_t core_iq4nl_values[16];

/* IQ4_XS sub-block ib's 6-bit scale l (stored + 32) into its block: the low four bits in a nibble
 * of scales_l, the top two in bits 2 ib of scales_h (the quantizers zero scales_h first). */
static inline void core_iq4xs_put_scale(int ib, int l, uint16_t *scales_h, uint8_t *scales_l) {
    uint8_t l_l = (uint8_t)(l & 0xf), l_h = (uint8_t)(l >> 4);
    if (ib % 2 == 0)
        scales_l[ib / 2] = l_l;
    else
        scales_l[ib / 2] |= (uint8_t)(l_l << 4);
    *scales_h |= (uint16_t)(l_h << 2 * (ib % 8));
}

/* Sub-block j's scale of an IQ4_XS block (0..63; the value is this - 32). */
static inline int core_iq4xs_scale(int j, const uint8_t *blk) {
    int h = blk[2] | blk[3] << 8;
    return ((blk[4 + j / 2] >> (4 * (j % 2))) & 15) | ((h >> (2 * j)) & 3) << 4;
}

_Static_assert(sizeof(core_block_iq4_nl) == 18, "IQ4_NL block");
_Static_assert(sizeof(core_block_iq4_xs) == 136, "IQ4_XS block");
_Static_assert(sizeof(core_block_q2_k) == 84, "Q2_K block");
_Static_assert(sizeof(core_block_q3_k) == 110, "Q3_K block");
_Static_assert(sizeof(core_block_q8_0) == 34, "Q8_0 block");
_Static_assert(sizeof(core_block_q4_0) == 18, "Q4_0 block");
_Static_assert(sizeof(core_block_q4_1) == 20, "Q4_1 block");
_Static_assert(sizeof(core_block_q5_0) == 22, "Q5_0 block");
_Static_assert(sizeof(core_block_q5_1) == 24, "Q5_1 block");
_Static_assert(sizeof(core_block_q4_k) == 144, "Q4_K block");
_Static_assert(sizeof(core_block_q5_k) == 176, "Q5_K block");
_Static_assert(sizeof(core_block_q6_k) == 210, "Q6_K block");

/* Sub-block j's (0..7) 6-bit scale and min from the 12 packed bytes of Q4_K and Q5_K: bytes 0-3
 * hold the scales of 0-3 and 4-7 their mins (low 6 bits); sub-blocks 4-7 keep their low 4 bits
 * in bytes 8-11 and their top 2 bits in the spare top bits of bytes 0-7. */
static inline void core_q4k_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *mn = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* Sub-block j's scale of a Q3_K block (0..63; the value is this - 32): the low four bits from
 * byte j (j < 8) or the high ones of byte j - 8, the top two from byte 8 + j % 4 at bit 2 (j / 4).
 */
static inline int core_q3k_scale(int j, const uint8_t *q) {
    int lo = j < 8 ? q[j] & 15 : q[j - 8] >> 4;
    return lo | ((q[8 + (j & 3)] >> (2 * (j >> 2))) & 3) << 4;
}

/* Element e (0..255) of a Q2_K or Q3_K block: its 2-bit level (plane (e % 128) / 32 of byte
 * 32 (e / 128) + e % 32 of qs), Q3_K's (hmask not NULL) less 4 where its third bit (bit e / 32 of
 * hmask[e % 32]) is clear. */
static inline int core_q23k_level(const uint8_t *qs, const uint8_t *hmask, int e) {
    int q = (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
    return hmask && !((hmask[e % 32] >> (e / 32)) & 1) ? q - 4 : q;
}

#endif
