/* The driver of the products on float weights (qgemm.h): F32 and F16 (k_fgemm) and BF16 (which
 * k_qgemm sends here), in register tiles of 8 weight rows by 3 x 16 activation rows: the
 * activation rows interleaved once per call, the weight in blocks of 8 rows shared by
 * k_team_units, the activation rows taken in chunks that stay in L2. Which tiles run is chosen
 * once per call (the plans below); the tiles are in ref/ and x86/ (gemm_traits.h). */
#include <stdatomic.h>
#include <string.h>

#include "kernels/gemm_traits.h"
#include "kernels/kernels.h"
#include "kernels/qdot.h"
#include "kernels/qgemm.h"

/* Tiles of 16 activation rows per chunk (in threes): a chunk of tile_bytes each stays in L2 while
 * every weight block passes over it (prompts and training's products have hundreds to thousands
 * of rows). */
static int tiles_per_chunk(size_t tile_bytes) {
    int chunk = (int)((512u << 10) / tile_bytes) / 3 * 3;
    return chunk < 3 ? 3 : chunk;
}

/* T tiles of sums tile[t][r][a] (8 weight rows r, 16 activation rows a) into y: activation rows
 * from t0 * 16 (those below N), columns r0..r0+R-1, plus b (may be NULL). */
static void store_tiles(float *y, int ldy, const float *tile, int t0, int T, int N, int r0, int R,
                        const float *b) {
    for (int t = t0; t < t0 + T; t++) {
        const float *tt = tile + (t - t0) * 8 * 16;
        int na = N - t * 16 < 16 ? N - t * 16 : 16;
        for (int a = 0; a < na; a++) {
            float *yr = y + (size_t)(t * 16 + a) * ldy + r0;
            for (int r = 0; r < R; r++) yr[r] = tt[r * 16 + a] + (b ? b[r0 + r] : 0.0f);
        }
    }
}

/* ---- BF16 weights ------------------------------------------------------------------------- */

typedef struct {
    k_bf16_round_row_fn *round_row;
    k_bf16_tile_fn *tile;
} bf16_plan;

static const bf16_plan bf16_ref = {k_bf16_round_row_ref, k_bf16_gemm_tile_8x48_ref};
#if K_GEMM_X86
static const bf16_plan bf16_avx512 = {k_bf16_round_row_avx512bf16,
                                      k_bf16_gemm_tile_8x48_avx512bf16};
#endif

/* k_bf16_gemm's product, shared by its two loops: tiles [a, b) of the activation rows into xt,
 * then weight blocks [a, b) against tiles c0..c1-1. */
typedef struct {
    float *y;
    const float *x, *b;
    const tlm_weight *w;
    const bf16_plan *plan;
    uint32_t *xt;
    size_t tile_words;
    int ldy, N, c0, c1;
} bf16_ctx;

static void bf16_tiles(void *ctx, long ta, long tb) {
    const bf16_ctx *c = ctx;
    int n = (int)c->w->cols, N = c->N;
    for (long t = ta; t < tb; t++) {
        uint32_t *dst = c->xt + (size_t)t * c->tile_words;
        uint16_t row[64];
        for (int a = 0; a < 16; a++) {
            long i = t * 16 + a;
            for (int k0 = 0; k0 < n; k0 += 64) {
                int len = n - k0 < 64 ? n - k0 : 64;
                if (i >= N)
                    memset(row, 0, sizeof row);
                else
                    c->plan->round_row(c->x + (size_t)i * n + k0, len, row);
                for (int kp = 0; kp < len / 2; kp++)
                    memcpy(dst + (size_t)(k0 / 2 + kp) * 16 + a, row + 2 * kp, 4);
            }
        }
    }
}

static void bf16_blocks(void *ctx, long ba, long bb) {
    const bf16_ctx *c = ctx;
    const tlm_weight *w = c->w;
    int n = (int)w->cols, out = (int)w->rows;
    for (long bl = ba; bl < bb; bl++) {
        int r0 = (int)bl * 8, R = out - r0 < 8 ? out - r0 : 8;
        const uint8_t *wr = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;
        float tile[3 * 8 * 16];
        for (int t0 = c->c0; t0 < c->c1; t0 += 3) {
            int T = c->c1 - t0 < 3 ? c->c1 - t0 : 3;
            c->plan->tile(R, T, n, wr, w->row_bytes, c->xt + (size_t)t0 * c->tile_words,
                          c->tile_words, tile);
            store_tiles(c->y, c->ldy, tile, t0, T, c->N, r0, R, c->b);
        }
    }
}

int k_bf16_gemm(float *y, int ldy, const float *x, int N, const tlm_weight *w, const float *b,
                int isa) {
    int n = (int)w->cols, out = (int)w->rows;
    if (n % 2 || N <= 0 || (isa != K_ISA_REF && !(k_gemm_isa_ok(isa) && k_qgemm_bf16_ok())))
        return -1;
    const bf16_plan *plan = &bf16_ref;
#if K_GEMM_X86
    if (isa == K_ISA_AVX512 && k_qgemm_amx_ok()) return k_bf16_gemm_amx(y, ldy, x, N, w, b);
    if (isa == K_ISA_AVX512) plan = &bf16_avx512;
#endif
    int tiles = (N + 15) / 16;
    /* slot 1 of the calling thread: the activation rows in BF16, then interleaved by tiles of 16
     * rows, a pair of columns of each row per 32-bit word (rows past N are zero) */
    size_t tile_words = (size_t)n / 2 * 16;
    uint32_t *xt = k_scratch(1, (size_t)tiles * tile_words * 4 + (size_t)n * 2 * 16);
    if (!xt) return -1;
    /* Both loops through k_team_units (not OpenMP regions), so that a decode step of many
     * sequences on the pool (k_team_pool) opens no OpenMP region. */
    bf16_ctx c = {y, x, b, w, plan, xt, tile_words, ldy, N, 0, 0};
    k_team_units(tiles, (long)N * n >= K_PAR_MIN, 0, bf16_tiles, &c);
    int blocks = (out + 7) / 8, chunk = tiles_per_chunk(tile_words * 4);
    for (c.c0 = 0; c.c0 < tiles; c.c0 += chunk) {
        c.c1 = tiles - c.c0 < chunk ? tiles : c.c0 + chunk;
        k_team_units(blocks, (long)N * out >= K_PAR_MIN / 16, 0, bf16_blocks, &c);
    }
    return 0;
}

/* ---- F32 and F16 weights ------------------------------------------------------------------ */

typedef struct {
    k_fgemm_interleave_fn *interleave;
    k_fgemm_tile_fn *tile;
    k_fgemm_pairs_fn *pairs;
} fgemm_plan;

static const fgemm_plan fgemm_ref = {k_fgemm_interleave16_ref, k_fgemm_tile_8x48_ref,
                                     k_fgemm_tile_8x8_pairs_ref};
#if K_GEMM_X86
static const fgemm_plan fgemm_avx512 = {k_fgemm_interleave16_avx512, k_fgemm_tile_8x48_avx512,
                                        k_fgemm_tile_8x8_pairs_avx512};
#endif

int k_fgemm_ok(void) { return K_GEMM_X86 && k_isa() >= K_ISA_AVX512; }

/* The calling thread's buffer for 8 widened F16 rows (NULL for F32 weights; on failure sets
 * *failed). */
static float *widen_buf(const tlm_weight *w, int *failed) {
    if (w->dtype != TLM_DTYPE_F16) return NULL;
    float *wf = k_scratch(0, (size_t)8 * w->cols * sizeof(float));
    if (!wf) {
#pragma omp atomic write
        *failed = 1;
    }
    return wf;
}

/* Rows r0 .. r0 + R - 1 of w as floats, row stride *ldw: F32 rows in place, F16 rows widened into
 * wf. */
static const float *block_rows(const tlm_weight *w, int r0, int R, float *wf, size_t *ldw) {
    const char *wb = (const char *)w->data + (size_t)r0 * w->row_bytes;
    if (w->dtype != TLM_DTYPE_F16) {
        *ldw = w->row_bytes / sizeof(float);
        return (const float *)wb;
    }
    for (int r = 0; r < R; r++)
        k_widen_row(w->dtype, wb + (size_t)r * w->row_bytes, wf + (size_t)r * w->cols,
                    (int)w->cols);
    *ldw = (size_t)w->cols;
    return wf;
}

/* k_fgemm's product, shared by its loops. */
typedef struct {
    float *y, *xt;
    const float *x, *b;
    const tlm_weight *w;
    const fgemm_plan *plan;
    size_t tile_floats;
    int ldy, N, blocks, pairs, c0, c1; /* c0, c1: the tiles of this pass (fg_blocks) */
    _Atomic int failed;
} fg_ctx;

/* More rows: tiles [a, e) of 16 activation rows interleaved by column into xt. */
static void fg_tiles(void *ctx, long a, long e) {
    fg_ctx *c = ctx;
    int n = (int)c->w->cols;
    for (long t = a; t < e; t++) {
        int rows = c->N - (int)t * 16 < 16 ? c->N - (int)t * 16 : 16;
        c->plan->interleave(c->x + (size_t)t * 16 * n, n, rows, c->xt + (size_t)t * c->tile_floats);
    }
}

/* Weight blocks [a, e) of 8 rows against tiles c0..c1-1, in register tiles of 8 x 3 x 16 (pairs:
 * against the pair-interleaved rows). */
static void fg_blocks(void *ctx, long a, long e) {
    fg_ctx *c = ctx;
    const tlm_weight *w = c->w;
    int n = (int)w->cols, out = (int)w->rows, fail = 0;
    float *wf = widen_buf(w, &fail);
    if (fail) {
        atomic_store(&c->failed, 1);
        return;
    }
    for (long bl = a; bl < e; bl++) {
        int r0 = (int)bl * 8, R = out - r0 < 8 ? out - r0 : 8;
        const char *wb = (const char *)w->data + (size_t)r0 * w->row_bytes;
        size_t ldw;
        const float *wr = block_rows(w, r0, R, wf, &ldw);
        /* the first pass brings the next block's rows in, spread over its columns: eight
         * interleaved streams are followed poorly by the hardware prefetchers here */
        int next = bl + 1 < c->blocks ? (out - r0 - 8 < 8 ? out - r0 - 8 : 8) : 0;
        const char *pf = next ? wb + 8 * w->row_bytes : NULL;
        size_t steps = (size_t)(c->pairs ? n / 2 : n);
        size_t pf_step = ((size_t)next * w->row_bytes + steps - 1) / steps;
        float tile[3 * 8 * 16];
        if (c->pairs) {
            /* up to 8 activation rows (batched decode): pairs of columns of 8 rows, one pass */
            c->plan->pairs(R, n, wr, ldw, c->xt, tile, pf, pf_step);
            for (int i = 0; i < c->N; i++) {
                float *yr = c->y + (size_t)i * c->ldy + r0;
                for (int r = 0; r < R; r++) yr[r] = tile[r * 8 + i] + (c->b ? c->b[r0 + r] : 0.0f);
            }
            continue;
        }
        for (int t0 = c->c0; t0 < c->c1; t0 += 3) {
            int T = c->c1 - t0 < 3 ? c->c1 - t0 : 3;
            c->plan->tile(R, T, n, wr, ldw, c->xt + (size_t)t0 * c->tile_floats, c->tile_floats,
                          tile, t0 == c->c0 ? pf : NULL, pf_step);
            store_tiles(c->y, c->ldy, tile, t0, T, c->N, r0, R, c->b);
        }
    }
}

int k_fgemm(float *y, int ldy, const float *x, int N, const tlm_weight *w, const float *b) {
    return k_fgemm_at(y, ldy, x, N, w, b, K_ISA_AVX512);
}

int k_fgemm_at(float *y, int ldy, const float *x, int N, const tlm_weight *w, const float *b,
               int isa) {
    int n = (int)w->cols, out = (int)w->rows;
    if (N <= 0 || n <= 0 || (isa != K_ISA_REF && !(isa == K_ISA_AVX512 && k_fgemm_ok())) ||
        (w->dtype != TLM_DTYPE_F32 && w->dtype != TLM_DTYPE_F16) ||
        (w->dtype == TLM_DTYPE_F32 && w->row_bytes % sizeof(float)))
        return -1;
    const fgemm_plan *plan = &fgemm_ref;
#if K_GEMM_X86
    if (isa == K_ISA_AVX512) plan = &fgemm_avx512;
#endif
    int pairs = N <= 8 && n % 2 == 0, tiles = pairs ? 1 : (N + 15) / 16;
    size_t tile_floats = (size_t)n * 16;
    float *xt = k_scratch(1, (size_t)tiles * tile_floats * sizeof(float));
    if (!xt) return -1;
    int blocks = (out + 7) / 8;
    fg_ctx c = {y, xt, x, b, w, plan, tile_floats, ldy, N, blocks, pairs, 0, tiles, 0};
    if (pairs) {
        for (int p = 0; p < n / 2; p++)
            for (int a = 0; a < 8; a++)
                for (int j = 0; j < 2; j++)
                    xt[(size_t)p * 16 + 2 * a + j] = a < N ? x[(size_t)a * n + 2 * p + j] : 0.0f;
        /* small products stay on this thread, as k_matvec_parts's do */
        k_team_units(blocks, (long)N * n * out >= (1L << 16), 0, fg_blocks, &c);
        return atomic_load(&c.failed) ? -1 : 0;
    }
    /* Both loops through k_team_units (not OpenMP regions), so that a decode step of many
     * sequences on the pool (k_team_pool) opens no OpenMP region. */
    k_team_units(tiles, (long)N * n >= K_PAR_MIN, 0, fg_tiles, &c);
    int chunk = tiles_per_chunk(tile_floats * sizeof(float));
    for (c.c0 = 0; c.c0 < tiles; c.c0 += chunk) {
        c.c1 = tiles - c.c0 < chunk ? tiles : c.c0 + chunk;
        k_team_units(blocks, 1, 0, fg_blocks, &c);
    }
    return atomic_load(&c.failed) ? -1 : 0;
}
