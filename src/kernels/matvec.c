#include "matvec.h"

#include <limits.h>
#include <omp.h>
#include <stdint.h>

#include "core/dtype.h"
#include "kernels.h"
#include "qdot.h"

/* Without memory for the activation rows: w_row widened a chunk at a time on the stack. */
static float widen_dot(tlm_dtype t, const uint8_t *w, const float *x, int in) {
    float buf[256], acc = 0.0f;
    const tlm_dtype_info *d = tlm_dtype_get(t);
    for (int i = 0; i < in; i += 256) {
        int n = in - i < 256 ? in - i : 256;
        tlm_dtype_to_f32(t, w + (size_t)(i / (int)d->block_elems) * d->block_bytes, buf, (size_t)n);
        for (int k = 0; k < n; k++) acc += buf[k] * x[i + k];
    }
    return acc;
}

/* Below these many multiply-adds a fork/join costs more than it saves: a decode step's typed rows
 * cost a few ns each, and waking the team (passive waits: a futex per thread) costs tens of
 * microseconds, which only the larger products repay. Typed rows on AMD's CPUs (Zen 5 VM, where
 * a line crossing between the two vCPUs cost about 0.3 us) fork from 2^19: 15M's 256 x 768
 * products split over the pool took 6.2 us against 4.6 on one thread, and forking those past
 * 2^17 gave 0.94x. On Intel's (a 2-vCPU Xeon) they fork from 2^17, the stacked q|k|v and the
 * FFN's products of 15M included: 15M decode at two threads, tg128, 2^19 -> 2^17, tok/s: Q4_0
 * 2619-2680 -> 3435-3470, Q8_0 2131-2206 -> 2858-2925, Q4_K_M 2680-2701 -> 3411-3421, Q6_K
 * 2440-2447 -> 3227-3307, F16 1350-1376 -> 1819-1842, BF16 1335-1361 -> 1848-1853 (2^16, which
 * adds the 256 x 256 output product, was level or lower). */
#define K_F32_PAR_MIN (1L << 16)
#define K_TYPED_PAR_MIN_AMD (1L << 19)
#define K_TYPED_PAR_MIN (1L << 17)

/* The row length (columns) from which one sequence's weight rows of a type go one at a time
 * rather than four at once (k_vdot_w4), on AMD's CPUs (the figures below: Zen 5). The four-row
 * kernels share the activation's work, but they read four streams a row apart, a few dozen lines
 * each, which the hardware prefetchers follow badly; a software prefetch of the unit ahead only
 * partly makes up for it. One row at a time reads the matrix as one sequential stream, which they
 * follow well, with no software prefetch. Where a type's one-row kernel is cheap enough, that wins
 * on long rows. Timed one product at a time, alternating in one process, from memory, 1 and 2
 * threads (G weight bytes per s, four rows -> one row): Q8_0 768 x 2048 22 -> 26 and 38 -> 45, 2048
 * x 768 21 -> 29 and 34 -> 42, 768 x 32000 22 -> 26 and 41 -> 50; 288 columns lose (18 -> 16.5).
 *   Q4_0 2048 x 768 20 -> 24 and 33 -> 38; 768 columns lose (21 -> 20, 36 -> 33).
 *   Q6_K 2048 x 768 17 -> 22.5 and 28 -> 34; 768 columns about even.
 *   Q4_K loses everywhere (30 -> 20); F32 too (31 -> 27). F16: see below.
 *   Q5_K loses too (alternating builds, one thread: 768 x 2048 22-28 -> 18-21, 2048 x 768
 *   25-33 -> 20-23), so it has no entry.
 *
 * On Intel's (a 2-vCPU Xeon with AVX-512 and AMX, 110M decode, tg64, alternating, tok/s, one
 * row -> four rows for the block types): Q8_0 100 -> 128-140 at one thread and 155 -> 365-381
 * at two; Q4_0 316 -> 362 and 606 -> 656; Q6_K 105 -> 254; Q4_K_M 288 -> 315. There the four
 * rows' streams are followed well, so the block types go four rows at a time at every length.
 * F16 keeps one row past 512 columns on both (110M, Intel: 64 -> 58 at one thread, 116 -> 123
 * at two). */
static int one_row_from(tlm_dtype t, int amd) {
    switch (t) {
    case TLM_DTYPE_Q8_0: return amd ? 512 : INT_MAX;
    case TLM_DTYPE_Q4_0:
    case TLM_DTYPE_Q6_K: return amd ? 2048 : INT_MAX;
    /* F16 rows of up to 512 columns gain from four at a time (the horizontal sums of short
     * rows overlap); longer ones lose (one thread, G weights/s from memory, one row against
     * four: 288 x 32000 21 -> 28, 384 x 4096 23 -> 31; 1024 x 4096 29 -> 27, 2048 x 768
     * 30 -> 24). Whole 15M F16 decode, alternating runs: 1.02-1.09x at one thread,
     * 1.15-1.20x at two; four at a time for 110M's rows (768, 2048) cost it 5-10%. On Intel's
     * CPUs too, with the one-row kernel's prefetch 2 KiB ahead (qdot_x86.c's fr5; 110M, tg64:
     * 75-77 tok/s at one thread and 133-135 at two, four rows 60-63 and 124-130). */
    case TLM_DTYPE_F16: return 513;
    default: return INT_MAX;
    }
}

/* The lines of [p, p + bytes) asked for at once (a unit after next, k_matvec_parts), and with far,
 * the same lines that much further on into L2 (as qdot_x86.c's pf_upto does for the block types).
 */
static inline void prefetch_lines(const char *p, size_t bytes, size_t far) {
    for (size_t o = 0; o < bytes; o += 64) {
        __builtin_prefetch(p + o, 0, 3);
        if (far) __builtin_prefetch(p + o + far, 0, 2);
    }
}

/* Units u0 .. u1 - 1 of ur output rows, numbered across the parts. */
static void mv_units(const k_matvec_plan *c, long u0, long u1) {
    float *y = c->y;
    int ldy = c->ldy, M = c->M, in = c->in, ur = c->ur;
    const float *x = c->x;
    int p = 0;
    for (long u = u0; u < u1; u++) {
        while (u >= c->first[p + 1]) p++;
        const k_matvec_part *P = &c->parts[p];
        int j = (int)(u - c->first[p]) * ur, rows = P->out - j < ur ? P->out - j : ur;
        k_vdot_fn dot = c->dots[p];
        k_vdot_rows_fn rdot = c->rdots[p];
        const uint8_t *a = c->acts[p];
        size_t rb = c->rbs[p];
        const uint8_t *w0 = (const uint8_t *)P->w + (size_t)j * P->row_bytes;
        /* The rows of the unit after next: the kernels read a unit's rows several at once, or
         * each several times, which the hardware prefetchers here follow worse than one stream.
         * Past the part's end this asks for bytes the product does not read, which a prefetch
         * may: it never faults. */
        const char *pf = c->pfs[p] ? (const char *)w0 + 2 * (size_t)ur * P->row_bytes : NULL;
        int w4 = rows == 4 && a && c->w4s[p];
        if (pf && !(w4 && c->spreads[p])) prefetch_lines(pf, (size_t)ur * P->row_bytes, 0);
        if (ur == 3 && rows == 3 && a) {
            float r3[3 * K_VDOT3_MAX_ROWS];
            for (int m0 = 0; m0 < M; m0 += K_VDOT3_MAX_ROWS) {
                int mm = M - m0 < K_VDOT3_MAX_ROWS ? M - m0 : K_VDOT3_MAX_ROWS;
                c->r3s[p](in, mm, r3, w0, P->row_bytes, a + m0 * rb, rb);
                for (int m = 0; m < mm; m++) {
                    float *ym = y + (size_t)(m0 + m) * ldy + P->col + j;
                    for (int k = 0; k < 3; k++)
                        ym[k] = P->b ? r3[k * mm + m] + P->b[j + k] : r3[k * mm + m];
                }
            }
            continue; /* next unit */
        }
        if (w4) {
            /* This part's whole units from here on in one run: the steps above cost a tenth of
             * the time of the 15M classifier's 8000 units of 840 bytes (one thread, from L3:
             * 29.5-31.4 -> 36.4-41.8 G bytes/s; 15M decode 1.13-1.17x). Kernels that spread
             * their prefetch take the run in one call; the others get each unit's lines asked
             * for before it, as above. Straight into y: four floats stored one by one and read
             * back as wider words cannot be forwarded from the stores, and the load waits for
             * them to retire. */
            k_vdot_w4_fn w4f = c->w4s[p];
            long last = c->first[p + 1] - (P->out % 4 ? 1 : 0), end = u1 < last ? u1 : last;
            int nu = (int)(end - u), spread = c->spreads[p];
            size_t step = 4 * P->row_bytes;
            float *ym = y + P->col + j;
            if (M >= 2) {
                /* unit by unit, each activation row in turn: the second finds the rows in L1 */
                for (int k = 0; k < nu; k++)
                    for (int m = 0; m < M; m++)
                        w4f(in, ym + (size_t)m * ldy + 4 * k, w0 + k * step, P->row_bytes,
                            a + m * rb, m || !pf ? NULL : pf + k * step, 1);
            } else if (!pf || spread) {
                w4f(in, ym, w0, P->row_bytes, a, pf, nu);
            } else {
                for (int k = 0; k < nu; k++) {
                    if (k) prefetch_lines(pf + k * step, step, 0);
                    w4f(in, ym + 4 * k, w0 + k * step, P->row_bytes, a, NULL, 1);
                }
            }
            if (P->b)
                for (int m = 0; m < M; m++)
                    for (int k = 0; k < 4 * nu; k++) ym[(size_t)m * ldy + k] += P->b[j + k];
            u = end - 1;
            continue; /* next unit */
        }
        /* Each weight row once against up to K_VDOT_MAX_ROWS activation rows: the unit's four
         * rows stay in L1 for the next group of activation rows, if any. */
        for (int m0 = 0; m0 < M; m0 += K_VDOT_MAX_ROWS) {
            int mm = M - m0 < K_VDOT_MAX_ROWS ? M - m0 : K_VDOT_MAX_ROWS;
            float r[4][K_VDOT_MAX_ROWS];
            for (int k = 0; k < rows; k++) {
                const uint8_t *wr = w0 + (size_t)k * P->row_bytes;
                if (c->rpfs[p] && m0 == 0)
                    prefetch_lines((const char *)wr + 2 * (size_t)ur * P->row_bytes, P->row_bytes,
                                   c->fars[p]);
                if (a && rdot) {
                    rdot(in, mm, r[k], wr, a + m0 * rb, rb);
                } else {
                    for (int m = 0; m < mm; m++) {
                        if (a)
                            dot(in, &r[k][m], wr, a + (m0 + m) * rb);
                        else
                            r[k][m] = widen_dot(P->dtype, wr, x + (size_t)(m0 + m) * in, in);
                    }
                }
            }
            for (int m = 0; m < mm; m++) {
                float *ym = y + (size_t)(m0 + m) * ldy + P->col + j;
                for (int k = 0; k < rows; k++) ym[k] = P->b ? r[k][m] + P->b[j + k] : r[k][m];
            }
        }
    }
}

static void mv_units_fn(void *c, long u0, long u1) { mv_units(c, u0, u1); }

void k_matvec_plan_init(k_matvec_plan *pl, float *y, int ldy, const float *x, int M, int in,
                        const k_matvec_part *parts, int n) {
    /* Past K_VDOT_MAX_ROWS activation rows (which then no longer fit in L1), F32 and F16 weights
     * go three rows at a time through k_vdot_rows3, which loads each activation vector once for
     * the three (110M F32, 16 rows from memory: 1.2-1.35x one row at a time); F32 past four rows
     * already (768 x 2048, 5-8 rows, 2 threads, alternating: 10% less time; F16 within noise). */
    k_vdot_rows3_fn *r3s = pl->r3s;
    k_vdot_w4_fn *w4s = pl->w4s;
    int *pfs = pl->pfs, *spreads = pl->spreads;
    int all_f32 = 1;
    for (int p = 0; p < n; p++) all_f32 &= parts[p].dtype == TLM_DTYPE_F32;
    int ur = M > (all_f32 ? 4 : K_VDOT_MAX_ROWS) ? 3 : 4;
    for (int p = 0; p < n; p++) {
        r3s[p] = ur == 3 ? k_vdot_rows3(parts[p].dtype) : NULL;
        if (!r3s[p]) ur = 4;
    }
    /* Units of ur output rows, numbered across the parts, so that one parallel region covers
     * every part (q, k and v of one layer), not one region each. */
    long *first = pl->first, work = 0;
    int typed = 0;
    first[0] = 0;
    for (int p = 0; p < n; p++) {
        first[p + 1] = first[p] + (parts[p].out + ur - 1) / ur;
        work += (long)parts[p].out;
        if (parts[p].dtype != TLM_DTYPE_F32) typed = 1;
    }
    int amd = k_cpu_amd();
    long typed_min = amd ? K_TYPED_PAR_MIN_AMD : K_TYPED_PAR_MIN;
    int par = work * M * in >= (typed ? typed_min : K_F32_PAR_MIN);
    /* The activation rows in each form the parts' types want, prepared once per kind. */
    size_t off[K_ACT_COUNT], total = 0;
    for (int k = 0; k < K_ACT_COUNT; k++) off[k] = (size_t)-1;
    for (int p = 0; p < n; p++) {
        k_act_kind kind = k_act_of(parts[p].dtype);
        if (kind == K_ACT_F32 || off[kind] != (size_t)-1) continue;
        off[kind] = total;
        total += (size_t)M * ((k_act_row_bytes(parts[p].dtype, in) + 63) & ~(size_t)63);
    }
    uint8_t *act = total ? k_scratch(0, total) : NULL;
    if (total && act) {
        for (int k = 0; k < K_ACT_COUNT; k++) {
            if (off[k] == (size_t)-1) continue;
            size_t rb = 0;
            for (int p = 0; p < n && !rb; p++)
                if ((int)k_act_of(parts[p].dtype) == k) rb = k_act_row_bytes(parts[p].dtype, in);
            rb = (rb + 63) & ~(size_t)63;
            for (int m = 0; m < M; m++)
                k_act_quantize((k_act_kind)k, x + (size_t)m * in, act + off[k] + m * rb, in);
        }
    }
    /* What each part's rows need, worked out once here rather than per unit or per row. */
    k_vdot_fn *dots = pl->dots;
    k_vdot_rows_fn *rdots = pl->rdots;
    const uint8_t **acts = pl->acts;
    size_t *rbs = pl->rbs;
    for (int p = 0; p < n; p++) {
        k_act_kind kind = k_act_of(parts[p].dtype);
        dots[p] = k_vdot(parts[p].dtype);
        rdots[p] = k_vdot_rows(parts[p].dtype);
        /* Two activation rows of a block type (two sequences decoded at once) go through the
         * four-row kernels too, once per activation row, unit by unit, on Intel's CPUs: the rows
         * kernels' one weight row against both activation rows cost as much arithmetic, but read
         * the matrix without the four-row kernels' prefetch (from memory, bench_matvec 1024 x
         * 2816, one thread, ms, medians of 3 alternating: Q4_0 0.240 -> 0.139, Q4_K 0.239 ->
         * 0.166, Q6_K 0.253 -> 0.205, Q8_0 0.314 -> 0.241; two threads Q4_K 0.128 -> 0.080; 256 x
         * 768 from L3 Q4_0 0.0109 -> 0.0085; in L2 level). From three rows the rows kernels' shared
         * weight decoding wins in cache (1024 x 2816 in L2, Q4_K: three rows 0.142 -> 0.173, four
         * 0.172 -> 0.229) more than the prefetch gains from memory (three rows 0.270 -> 0.226). */
        int blocks = tlm_dtype_get(parts[p].dtype)->block_elems > 1,
            far = !amd && in > K_PF_FAR_MIN_COLS;
        int packed = blocks || parts[p].dtype == TLM_DTYPE_BF16; /* and BF16 (figures below) */
        /* Without a several-row kernel at this level (AVX2's block types; BF16 keeps its one-row
         * kernel with the row prefetch below, as measured), more activation rows go through the
         * four-row kernel once each too, rather than the one-row kernel per weight row and
         * activation row (not measured on AMD's AVX2 cores, where the same calls are saved). */
        int w4_rows = M == 1 || (M == 2 && !amd && packed) || (blocks && !rdots[p]);
        w4s[p] = w4_rows && ur == 4 && in < one_row_from(parts[p].dtype, amd)
                     ? k_vdot_w4(parts[p].dtype)
                     : NULL;
        /* Prefetching ahead pays (alternating runs, 2 threads, 768 columns): for the four-row
         * units of one sequence (110M Q4_0, 1 thread: 256 -> 302 tok/s with them, about 270
         * without; Q6_K rows: qdot_x86.c), and for F32 and F16 weights against more than
         * four activation rows (8-16 rows: 8-15% less time). With one F32/F16 weight row against
         * up to four activation rows it costs (1 thread: 1.16 -> 1.35 ms for 8192 rows), and for
         * block types past one row it is within noise. Four rows of at most 256 bytes are one
         * run of a few lines, and the next unit's continues it: one stream, which the hardware
         * follows (15M's 256-column Q6_K classifier from L3, one thread: 31-32 -> 33.5-34.5 G
         * bytes/s without; 15M decode, alternating, medians: Q4_0 1.02x and Q4_K_M 1.03x at one
         * thread, 1.03x and 1.06x at two). On Intel's CPUs F32 rows four at a time go without
         * it: there the hardware follows their four streams, and the burst of prefetches ahead
         * held the loads back (2-vCPU Xeon, 110M F32, tg64: 31.7-32.3 -> 36.1-37.0 tok/s at one
         * thread, 62-64 -> 70.7-71.3 at two; the block types lose a third without theirs, BF16
         * 5-10%). There the short rows of the block types want it too (15M, 256 columns: q|k|v,
         * gate|up and the Q6_K classifier; tg128, alternating medians, without -> with: Q4_0
         * 2437 -> 2612 tok/s at one thread and 3993 -> 4336 at two, Q6_K 2230 -> 2334 and 3765
         * -> 3941, Q4_K_M 2380 -> 2432 and 4107 -> 4153, Q5_K_M at two 3792 -> 3867; further
         * ahead, 4 units 2584 and 4314, 8 units 4179 at two). */
        int f32_nopf = parts[p].dtype == TLM_DTYPE_F32 && !amd;
        pfs[p] = (w4s[p] && (parts[p].row_bytes > 256 || !amd) && !f32_nopf) ||
                 (M > 4 && kind == K_ACT_F32);
        /* The four-row kernels of the block types take that prefetch a share per step of their
         * loop (k_vdot_w4_fn's pf) rather than all the unit's lines at the start: alternating in
         * one process, 1 thread, G bytes/s, burst -> spread: Q4_K 768 x 2048 27 -> 30, 2048 x 768
         * 26 -> 30; Q6_K 768 x 2048 18 -> 21; Q4_0 768 x 2048 17.7 -> 22.4 in one phase of the
         * host, 20.6 -> 20.8 in another. F32 and BF16 lose with it (F32 768 x 2048 26 -> 21). */
        spreads[p] = w4s[p] && (blocks || (parts[p].dtype == TLM_DTYPE_BF16 && far));
        /* BF16's four-row units past 256 columns on Intel's CPUs take it spread too (and so the
         * L2 prefetch, qdot_x86.c's pf_far), where the burst at each unit's start had read them
         * from memory at 12.9 G bytes/s and the burst with the L2 prefetch at 15.8 (bench_matvec
         * 1024 x 2816, one thread, medians of 5 alternating): spread 14.1 -> 15.6 against that
         * burst alone, 768 x 2048 from L3 25.4 -> 27.0; 256 columns in L3 lose (28.2 -> 24.9) and
         * keep the burst. F32 there reads best with no prefetch at all (16.8; 15.4 with both). */
        /* Three activation rows or more of a block type (sequences decoded together) go through
         * the rows kernels, one weight row against them all, and so do all rows where the CPU has
         * no four-row kernel (AVX2: 400M Q4_K_M at one thread 22 -> 42 tok/s with what follows,
         * 400M Q8_0 at two 31 -> 57, 15M level); on Intel's CPUs each weight row asks
         * for the same row of the unit after next into L1 before it, and (past 256 columns) the
         * one four units further on into L2, a row at a time rather than a unit's burst. From
         * memory, bench_matvec 1024 x 2816, one thread, ms, medians of 3 alternating: Q8_0 three
         * rows 0.420 -> 0.300, four 0.456 -> 0.345; Q4_K 0.273 -> 0.182 and 0.300 -> 0.204; Q6_K
         * four 0.337 -> 0.244; Q4_0 eight 0.393 -> 0.292; in L2 (Q4_K, three and eight rows)
         * 2-4% slower, 256 x 768 from L3 level. BF16 likewise, two rows through its four-row
         * kernel and more with this prefetch (tlm bench -b 2, 3, 4, 8, two threads, tok/s: 110M
         * 169 -> 276, 205 -> 288, 270 -> 340, 393 -> 484; 400M 57 -> 69, 76 -> 85, 86 -> 94, 106
         * -> 125; 15M b2 2800 -> 3410, the others level). */
        pl->rpfs[p] = !w4s[p] && M <= K_VDOT_MAX_ROWS && !amd && packed;
        pl->fars[p] = pl->rpfs[p] && far ? K_PF_FAR_ROWS * parts[p].row_bytes : 0;
        rbs[p] = (k_act_row_bytes(parts[p].dtype, in) + 63) & ~(size_t)63;
        acts[p] = kind == K_ACT_F32 ? (const uint8_t *)x : act ? act + off[kind] : NULL;
        if (kind == K_ACT_F32) rbs[p] = (size_t)in * sizeof(float);
    }
    pl->y = y, pl->ldy = ldy, pl->x = x, pl->M = M, pl->in = in, pl->n = n, pl->ur = ur;
    pl->par = par;
    pl->units = first[n];
    for (int p = 0; p < n; p++) pl->parts[p] = parts[p];
}

void k_matvec_plan_run(const k_matvec_plan *pl) {
    k_team_units(pl->units, pl->par, 0, mv_units_fn, (void *)(uintptr_t)pl);
}

void k_matvec_plan_rows(const k_matvec_plan *pl, int p, int r0, int r1) {
    if (r1 <= r0) return;
    mv_units(pl, pl->first[p] + r0 / pl->ur, pl->first[p] + (r1 + pl->ur - 1) / pl->ur);
}

void k_matvec_plan_cols(const k_matvec_plan *pl, int c0, int c1) {
    for (int p = 0; p < pl->n; p++) {
        const k_matvec_part *P = &pl->parts[p];
        int a = c0 > P->col ? c0 - P->col : 0, b = c1 - P->col < P->out ? c1 - P->col : P->out;
        k_matvec_plan_rows(pl, p, a, b);
    }
}

void k_matvec_parts(float *y, int ldy, const float *x, int M, int in, const k_matvec_part *parts,
                    int n) {
    k_matvec_plan pl;
    k_matvec_plan_init(&pl, y, ldy, x, M, in, parts, n);
    k_matvec_plan_run(&pl);
}
