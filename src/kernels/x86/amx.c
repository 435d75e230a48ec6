/* AMX tiles (gemm_traits.h has the contracts): the tile configuration of a thread's share, BF16
 * products (k_bf16_gemm_amx: its own loop, as tiles take 32 weight rows and 32 activation rows at
 * a time), and the repacked integer GEMM's 16 x 16 micro-kernel. Each thread loads its tile
 * configuration at the start of its share and releases the tiles at the end, so no thread keeps
 * AMX state between products. */
#include <stdatomic.h>
#include <string.h>

#include "kernels/gemm_traits.h"
#include "kernels/kernels.h"
#include "kernels/qdot.h"

#if K_GEMM_X86
#include "kernels/x86/simd.h"

#define AMX_ROWS 32                  /* weight rows, and activation rows, per block */
#define AMX_CHUNK (8 * AMX_ROWS)     /* activation rows per pass over the weight */
#define AMX_PAIR_BYTES (2 * 16 * 64) /* the two weight tiles of one step of 32 columns */

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_config;

/* Loads the calling thread's tile configuration: tile t has rows[t] rows of colsb[t] bytes. */
K_TARGET_AMX_INT8 static void amx_config_load(const uint8_t rows[8], const uint16_t colsb[8]) {
    _Alignas(64) amx_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = rows[t];
        cfg.colsb[t] = colsb[t];
    }
    /* GCC 12's _tile_loadconfig tells the compiler it reads 8 bytes of cfg, which then drops the
     * stores of rows and colsb as dead where it inlines this function: all 64 are read here. */
    __asm__ volatile("" : : "m"(cfg));
    _tile_loadconfig(&cfg);
}

K_TARGET_AMX_INT8 void k_amx_end(void) { _tile_release(); }

/* BF16 products: eight tiles of 16 rows x 64 bytes: 0-3 the sums, 4-5 activations, 6-7
 * weights. */
static void amx_bf16_config(void) {
    static const uint8_t rows[8] = {16, 16, 16, 16, 16, 16, 16, 16};
    static const uint16_t colsb[8] = {64, 64, 64, 64, 64, 64, 64, 64};
    amx_config_load(rows, colsb);
}

/* ---- BF16 weights -------------------------------------------------------------------------
 * One tdpbf16ps multiplies 16 activation rows by 16 weight rows over 32 columns (8192 products)
 * where vdpbf16ps does 16 x 2. The activations are rounded to BF16 rows (zero past n to a multiple
 * of 32 and past N to a multiple of 32), the weight is taken 32 rows at a time and transposed into
 * tdpbf16ps's pair layout (tile row k: the 32-bit pair of columns 2k, 2k + 1 of each of 16 weight
 * rows) in a per-thread buffer, and four accumulator tiles hold 32 x 32 sums while two activation
 * tiles and two weight tiles stream by. Every sum runs over k in order in pairs, as the vdpbf16ps
 * kernel's do (AMX multiplies the even column first; vdpbf16ps the odd one: results agree to
 * rounding, not bit for bit). */

/* Weight rows r0 .. r0 + 31 (zero past the last row and past n) as nk steps of two tiles. */
K_TARGET_AMX_BF16 static void amx_bf16_pack(const tlm_weight *w, int r0, int nk, uint8_t *pb) {
    int n = (int)w->cols, out = (int)w->rows;
    for (int h = 0; h < 2; h++)
        for (int s = 0; s < nk; s++) {
            int k0 = 32 * s, len = n - k0 < 32 ? n - k0 : 32;
            __mmask32 m = len == 32 ? ~(__mmask32)0 : ((__mmask32)1 << len) - 1;
            __m512i r[16];
            for (int j = 0; j < 16; j++) {
                int row = r0 + 16 * h + j;
                r[j] = row < out ? _mm512_maskz_loadu_epi16(m, (const uint8_t *)w->data +
                                                                   (size_t)row * w->row_bytes +
                                                                   2 * (size_t)k0)
                                 : _mm512_setzero_si512();
            }
            k_transpose16x16(r);
            uint8_t *dst = pb + (size_t)s * AMX_PAIR_BYTES + (size_t)h * 1024;
            for (int j = 0; j < 16; j++) _mm512_storeu_si512(dst + 64 * j, r[j]);
        }
}

/* Activation blocks [m0, m1) of 32 rows (row stride lda bytes) against one packed group: y rows
 * below N, columns r0 .. r0 + R - 1, plus b. */
K_TARGET_AMX_BF16 static void amx_bf16_blocks(const uint8_t *xa, size_t lda, int m0, int m1, int N,
                                              int nk, const uint8_t *pb, float *y, int ldy, int r0,
                                              int R, const float *b) {
    _Alignas(64) float ct[AMX_ROWS * AMX_ROWS];
    __mmask16 lo = R >= 16 ? 0xFFFF : (__mmask16)((1u << R) - 1);
    __mmask16 hi = R >= 32 ? 0xFFFF : R <= 16 ? 0 : (__mmask16)((1u << (R - 16)) - 1);
    __m512 b0 = b ? _mm512_maskz_loadu_ps(lo, b + r0) : _mm512_setzero_ps();
    __m512 b1 = b ? _mm512_maskz_loadu_ps(hi, b + r0 + 16) : _mm512_setzero_ps();
    for (int mb = m0; mb < m1; mb++) {
        const uint8_t *a0 = xa + (size_t)mb * AMX_ROWS * lda, *a1 = a0 + 16 * lda;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int s = 0; s < nk; s++) {
            const uint8_t *p = pb + (size_t)s * AMX_PAIR_BYTES;
            _tile_loadd(4, a0 + 64 * (size_t)s, lda);
            _tile_loadd(6, p, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_loadd(7, p + 1024, 64);
            _tile_dpbf16ps(1, 4, 7);
            _tile_loadd(5, a1 + 64 * (size_t)s, lda);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
        _tile_stored(0, ct, 4 * AMX_ROWS);
        _tile_stored(1, ct + 16, 4 * AMX_ROWS);
        _tile_stored(2, ct + 16 * AMX_ROWS, 4 * AMX_ROWS);
        _tile_stored(3, ct + 16 * AMX_ROWS + 16, 4 * AMX_ROWS);
        for (int a = 0; a < AMX_ROWS && mb * AMX_ROWS + a < N; a++) {
            float *yr = y + (size_t)(mb * AMX_ROWS + a) * ldy + r0;
            _mm512_mask_storeu_ps(yr, lo, _mm512_add_ps(_mm512_load_ps(ct + a * AMX_ROWS), b0));
            if (hi)
                _mm512_mask_storeu_ps(yr + 16, hi,
                                      _mm512_add_ps(_mm512_load_ps(ct + a * AMX_ROWS + 16), b1));
        }
    }
}
typedef struct {
    float *y;
    const float *x, *b;
    const tlm_weight *w;
    uint8_t *xa;
    size_t lda;
    int ldy, N, n32, m0, m1;
    _Atomic int failed;
} amx_bf16_ctx;

/* Activation rows [a, b) (of the padded count) to BF16 rows of n32 columns. */
static void amx_bf16_rows(void *ctx, long a, long b) {
    amx_bf16_ctx *c = ctx;
    int n = (int)c->w->cols;
    for (long i = a; i < b; i++) {
        uint16_t *row = (uint16_t *)(void *)(c->xa + (size_t)i * c->lda);
        int done = 0;
        if (i < c->N) {
            k_bf16_round_row_avx512bf16(c->x + (size_t)i * n, n, row);
            done = n;
        }
        memset(row + done, 0, (size_t)(c->n32 - done) * 2);
    }
}

K_TARGET_AMX_BF16 static void amx_bf16_groups(void *ctx, long ga, long gb) {
    amx_bf16_ctx *c = ctx;
    int nk = c->n32 / 32, out = (int)c->w->rows;
    uint8_t *pb = k_scratch(0, (size_t)nk * AMX_PAIR_BYTES);
    if (!pb) {
        atomic_store(&c->failed, 1);
        return;
    }
    amx_bf16_config();
    for (long g = ga; g < gb; g++) {
        int r0 = (int)g * AMX_ROWS, R = out - r0 < AMX_ROWS ? out - r0 : AMX_ROWS;
        amx_bf16_pack(c->w, r0, nk, pb);
        amx_bf16_blocks(c->xa, c->lda, c->m0, c->m1, c->N, nk, pb, c->y, c->ldy, r0, R, c->b);
    }
    k_amx_end();
}

int k_bf16_gemm_amx(float *y, int ldy, const float *x, int N, const tlm_weight *w, const float *b) {
    int n = (int)w->cols, out = (int)w->rows, n32 = (n + 31) & ~31;
    int mblocks = (N + AMX_ROWS - 1) / AMX_ROWS;
    /* a line more than the row, so that a tile's 16 rows do not all fall in one L1 set */
    size_t lda = (size_t)n32 * 2 + 64;
    uint8_t *xa = k_scratch(1, (size_t)mblocks * AMX_ROWS * lda);
    if (!xa) return -1;
    amx_bf16_ctx c = {y, x, b, w, xa, lda, ldy, N, n32, 0, 0, 0};
    k_team_units((long)mblocks * AMX_ROWS, (long)N * n >= K_PAR_MIN, 0, amx_bf16_rows, &c);
    long groups = (out + AMX_ROWS - 1) / AMX_ROWS;
    for (c.m0 = 0; c.m0 < mblocks; c.m0 += AMX_CHUNK / AMX_ROWS) {
        c.m1 = mblocks - c.m0 < AMX_CHUNK / AMX_ROWS ? mblocks : c.m0 + AMX_CHUNK / AMX_ROWS;
        k_team_units(groups, (long)N * out >= K_PAR_MIN / 16, 1, amx_bf16_groups, &c);
    }
    return atomic_load(&c.failed) ? -1 : 0;
}

/* ---- block types: the repacked integer GEMM's micro-kernel ---------------------------------
 * The 16 repacked weight rows of a group are already a tdpbsud B tile (q[k / 4][16][4]: sub / 4
 * rows of 64 bytes per sub-block), and 16 quantized activation rows at a sub-block's columns are
 * its A tile (16 rows of sub bytes, row stride n). One tdpbsud gives the sub-block's 16 x 16 int32
 * sums (signed activations by unsigned weight bytes, exact as vpdpbusd's); they are scaled and
 * added in the reference's operations and order (sums times s, fma with the activation's scale,
 * fma of m with its sum), so the products equal the VNNI kernel's and the reference's bit for bit.
 * Activation rows are padded with zero rows to a multiple of 16 (k_qgemm allocates and clears
 * them). */

/* Tiles 0-1: sums (16 x 16 int32); 2-3: activations (16 x sub bytes); 4-5: weights (sub / 4 rows
 * of 64 bytes). */
void k_qgemm_amx_int8_begin(int sub) {
    const uint8_t rows[8] = {16, 16, 16, 16, (uint8_t)(sub / 4), (uint8_t)(sub / 4)};
    const uint16_t colsb[8] = {64, 64, (uint16_t)sub, (uint16_t)sub, 64, 64};
    amx_config_load(rows, colsb);
}

/* The scaling stays unrolled, the 16 sums in registers: with them in memory the products ran
 * slower (bench/quant/prefill_paths.sh). */
K_TARGET_AMX_INT8 static inline __attribute__((always_inline)) void
amx_int8_scale(const int32_t *ct, const float *s, const float *m, const float *xd, size_t nb32,
               const float *xs, size_t nsb, __m512 acc[16]) {
    __m512 sv = _mm512_loadu_ps(s), mv = _mm512_loadu_ps(m);
#pragma GCC unroll 16
    for (int a = 0; a < 16; a++) {
        __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(ct + 16 * a)), sv);
        acc[a] = _mm512_fmadd_ps(t, _mm512_set1_ps(xd[a * nb32]), acc[a]);
        acc[a] = _mm512_fmadd_ps(mv, _mm512_set1_ps(xs[a * nsb]), acc[a]);
    }
}

K_TARGET_AMX_INT8 void k_qgemm_micro_16x16_amxint8(const k_gemm_ops *ops, int n, const uint8_t *q,
                                                   const float *s, const float *m, const int8_t *xq,
                                                   const float *xd, const float *xs, int na,
                                                   float *out) {
    int sub = ops->sub;
    size_t nsb = (size_t)n / sub, nb32 = (size_t)n / 32;
    _Alignas(64) int32_t ct[2][256];
    __m512 acc[16];
#pragma GCC unroll 16
    for (int a = 0; a < 16; a++) acc[a] = _mm512_setzero_ps();
#define AMX_I8_DP(T, A, B, b)                                                                      \
    do {                                                                                           \
        _tile_zero(T);                                                                             \
        _tile_loadd(A, xq + (b)*sub, n);                                                           \
        _tile_loadd(B, q + (b)*sub * 16, 64);                                                      \
        _tile_dpbsud(T, A, B);                                                                     \
    } while (0)
#define AMX_I8_SCALE(T, b)                                                                         \
    do {                                                                                           \
        _tile_stored(T, ct[T], 64);                                                                \
        amx_int8_scale(ct[T], s + (b)*16, m + (b)*16, xd + (b)*sub / 32, nb32, xs + (b), nsb,      \
                       acc);                                                                       \
    } while (0)
    /* Sub-block b goes to tile b % 2; b + 1's tdpbsud is issued before b's sums are stored and
     * scaled, so the two overlap (storing a tile right after its tdpbsud waits for it). */
    AMX_I8_DP(0, 2, 4, 0);
    for (size_t b = 0; b < nsb; b += 2) {
        if (b + 1 < nsb) AMX_I8_DP(1, 3, 5, b + 1);
        AMX_I8_SCALE(0, b);
        if (b + 2 < nsb) AMX_I8_DP(0, 2, 4, b + 2);
        if (b + 1 < nsb) AMX_I8_SCALE(1, b + 1);
    }
#undef AMX_I8_DP
#undef AMX_I8_SCALE
#pragma GCC unroll 16
    for (int a = 0; a < 16; a++) _mm512_storeu_ps(out + 16 * a, acc[a]);
}

#endif
