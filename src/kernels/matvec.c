#include "matvec.h"

#include <omp.h>
#include <stdint.h>

#include "core/dtype.h"
#include "kernels.h"
#include "qdot.h"
#include "traits.h"

/* Without memory for the activation rows: w_row widened a chunk at a time on the stack. */
static float widen_dot(tlm_dtype t, const uint8_t *w, const float *x, int in) {
    float buf[256], acc = 0.0f;
    const core_dtype_info *d = core_dtype_get(t);
    for (int i = 0; i < in; i += 256) {
        int n = in - i < 256 ? in - i : 256;
        core_dtype_to_f32(t, w + (size_t)(i / (int)d->block_elems) * d->block_bytes, buf,
                          (size_t)n);
        for (int k = 0; k < n; k++) acc += buf[k] * x[i + k];
    }
    return acc;
}

/* Below these many multiply-adds a fork/join costs more than it saves: a decode step's typed rows
 * cost a few ns each, and waking the team costs far more, which only the larger products repay.
 * Typed rows fork from 2^17 on Intel's CPUs, the stacked q|k|v and the FFN's products of 15M
 * included, and from 2^19 on AMD's (Zen 5), where each line crossing between the two vCPUs cost
 * about 0.3 us and a split 256 x 768 product took longer than one thread's (tlm bench tg at one
 * and two threads, bench/quant/run.sh's 15M models, show both). */
#define K_F32_PAR_MIN (1L << 16)
#define K_TYPED_PAR_MIN_AMD (1L << 19)
#define K_TYPED_PAR_MIN (1L << 17)

/* From which row length one sequence's rows of a type go one at a time rather than four at once
 * (k_vdot_w4): traits.c's single_row_from. The four-row kernels share the activation's work, but
 * they read four streams a row apart, which the hardware prefetchers follow badly on AMD's cores
 * (a software prefetch of the unit ahead only partly makes up for it); one row at a time reads the
 * matrix as one sequential stream. Where a type's one-row kernel is cheap enough (Q8_0 from 512
 * columns, Q4_0 and Q6_K from 2048 there), that wins on long rows; Intel's cores follow the four
 * streams well, and the block types go four rows at a time at every length there. F16 rows of up
 * to 512 columns gain from four at a time on both (the horizontal sums of short rows overlap) and
 * longer ones lose (build/bench_matvec, one row against four, from memory; tlm bench tg). */
static int one_row_from(const k_type_traits *tr, int amd) {
    return amd ? tr->single_row_from_amd : tr->single_row_from;
}

/* The lines of [p, p + bytes) asked for at once (a unit after next, k_matvec_parts), and with far,
 * the same lines that much further on into L2 (as the x4 kernels' prefetch_upto does,
 * x86/vec_dot_x86.h). */
static inline void prefetch_lines(const char *p, size_t bytes, size_t far) {
    for (size_t o = 0; o < bytes; o += 64) {
        __builtin_prefetch(p + o, 0, 3);
        if (far) __builtin_prefetch(p + o + far, 0, 2);
    }
}

/* Units u0 .. u1 - 1 of ur output rows, numbered across the parts. */
static void mv_units(const k_matvec_plan *c, long u0, long u1) {
    float *y = c->y;
    int ldy = c->ldy, M = c->M, in = c->in, ur = c->unit_rows;
    const float *x = c->x;
    int p = 0;
    for (long u = u0; u < u1; u++) {
        while (u >= c->first_unit[p + 1]) p++;
        const k_matvec_part *P = &c->parts[p];
        int j = (int)(u - c->first_unit[p]) * ur, rows = P->out - j < ur ? P->out - j : ur;
        k_vdot_fn dot = c->dot[p];
        k_vdot_rows_fn rdot = c->dot_m8[p];
        const uint8_t *a = c->act[p];
        size_t rb = c->act_stride[p];
        const uint8_t *w0 = (const uint8_t *)P->w + (size_t)j * P->row_bytes;
        /* The rows of the unit after next: the kernels read a unit's rows several at once, or
         * each several times, which the hardware prefetchers here follow worse than one stream.
         * Past the part's end this asks for bytes the product does not read, which a prefetch
         * may: it never faults. */
        const char *pf =
            c->prefetch_ahead[p] ? (const char *)w0 + 2 * (size_t)ur * P->row_bytes : NULL;
        int w4 = rows == 4 && a && c->dot_x4[p];
        if (pf && !(w4 && c->prefetch_spread[p])) prefetch_lines(pf, (size_t)ur * P->row_bytes, 0);
        if (ur == 3 && rows == 3 && a) {
            float r3[3 * K_VDOT3_MAX_ROWS];
            for (int m0 = 0; m0 < M; m0 += K_VDOT3_MAX_ROWS) {
                int mm = M - m0 < K_VDOT3_MAX_ROWS ? M - m0 : K_VDOT3_MAX_ROWS;
                c->dot_x3m4[p](in, mm, r3, w0, P->row_bytes, a + m0 * rb, rb);
                for (int m = 0; m < mm; m++) {
                    float *ym = y + (size_t)(m0 + m) * ldy + P->col + j;
                    for (int k = 0; k < 3; k++)
                        ym[k] = P->b ? r3[k * mm + m] + P->b[j + k] : r3[k * mm + m];
                }
            }
            continue; /* next unit */
        }
        if (w4) {
            /* This part's whole units from here on in one run: the steps above, per unit, cost a
             * tenth of the time of short rows such as 15M's classifier (build/bench_matvec from
             * L3). Kernels that spread their prefetch take the run in one call; the others get
             * each unit's lines asked for before it, as above. Straight into y: four floats stored
             * one by one and read back as wider words cannot be forwarded from the stores, and
             * the load waits for them to retire. */
            k_vdot_w4_fn w4f = c->dot_x4[p];
            long last = c->first_unit[p + 1] - (P->out % 4 ? 1 : 0), end = u1 < last ? u1 : last;
            int nu = (int)(end - u), spread = c->prefetch_spread[p];
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
                if (c->row_prefetch[p] && m0 == 0)
                    prefetch_lines((const char *)wr + 2 * (size_t)ur * P->row_bytes, P->row_bytes,
                                   c->row_prefetch_far[p]);
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
     * go three rows at a time through the x3m4 kernel, which loads each activation vector once for
     * the three; F32 past four rows already (build/bench_matvec F32 and F16 at 5-16 rows). */
    k_vdot_rows3_fn *dot_x3m4 = pl->dot_x3m4;
    k_vdot_w4_fn *dot_x4 = pl->dot_x4;
    int *prefetch_ahead = pl->prefetch_ahead, *prefetch_spread = pl->prefetch_spread;
    int all_f32 = 1;
    for (int p = 0; p < n; p++) all_f32 &= parts[p].dtype == TLM_DTYPE_F32;
    int ur = M > (all_f32 ? 4 : K_VDOT_MAX_ROWS) ? 3 : 4;
    for (int p = 0; p < n; p++) {
        dot_x3m4[p] = ur == 3 ? k_traits(parts[p].dtype)->vec_dot_x3m4 : NULL;
        if (!dot_x3m4[p]) ur = 4;
    }
    /* Units of ur output rows, numbered across the parts, so that one parallel region covers
     * every part (q, k and v of one layer), not one region each. */
    long *first = pl->first_unit, work = 0;
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
    /* What each part's rows need, worked out once here rather than per unit or per row. Each
     * choice below was timed both ways (build/bench_matvec from memory and from cache at 1 and 2
     * threads, tlm bench tg -b 1..8 on 15M, 110M and 400M-parameter models, bench/quant/run.sh),
     * on Intel's (a 2-vCPU Xeon with AVX-512) and AMD's (Zen 5) cores where they differ. */
    k_vdot_fn *dot = pl->dot;
    k_vdot_rows_fn *dot_m8 = pl->dot_m8;
    const uint8_t **acts = pl->act;
    size_t *act_stride = pl->act_stride;
    for (int p = 0; p < n; p++) {
        const k_type_traits *tr = k_traits(parts[p].dtype);
        k_act_kind kind = tr->act;
        dot[p] = tr->vec_dot;
        dot_m8[p] = tr->vec_dot_m8;
        /* Two activation rows of a block type (two sequences decoded at once) go through the
         * four-row kernels too, once per activation row, unit by unit, on Intel's CPUs: the m8
         * kernels' one weight row against both activation rows cost as much arithmetic, but read
         * the matrix without the four-row kernels' prefetch. From three rows the m8 kernels'
         * shared weight decoding wins in cache more than the prefetch gains from memory. */
        int blocks = core_dtype_get(parts[p].dtype)->block_elems > 1,
            far = !amd && in > K_PF_FAR_MIN_COLS;
        int packed = blocks || parts[p].dtype == TLM_DTYPE_BF16; /* and BF16 (below) */
        /* Without an m8 kernel at this level (AVX2's block types; BF16 keeps its one-row kernel
         * with the row prefetch below), more activation rows go through the four-row kernel once
         * each too, rather than the one-row kernel per weight row and activation row. */
        int w4_rows = M == 1 || (M == 2 && !amd && packed) || (blocks && !dot_m8[p]);
        dot_x4[p] = w4_rows && ur == 4 && in < one_row_from(tr, amd) ? tr->vec_dot_x4 : NULL;
        /* Prefetching the unit after next pays for the four-row units of one sequence and for F32
         * and F16 weights against more than four activation rows; with one F32/F16 weight row
         * against up to four activation rows it costs, and for block types past one row it is
         * within noise. On AMD's cores four rows of at most 256 bytes are one run of a few lines
         * that continues into the next unit's, one stream the hardware follows, and go without;
         * Intel's cores want it on those too, and not on F32's four-row units, whose four streams
         * their hardware follows (the burst of prefetches held the loads back there). */
        int f32_nopf = parts[p].dtype == TLM_DTYPE_F32 && !amd;
        prefetch_ahead[p] = (dot_x4[p] && (parts[p].row_bytes > 256 || !amd) && !f32_nopf) ||
                            (M > 4 && kind == K_ACT_F32);
        /* The four-row kernels of the block types take that prefetch a share per step of their
         * loop (k_vdot_w4_fn's pf) rather than all the unit's lines at the start; F32 and BF16
         * lose with it, except BF16's rows past 256 columns on Intel's CPUs, which then also take
         * the L2 prefetch (x86/vec_dot_x86.h's prefetch_far); shorter BF16 rows, in L3, keep the
         * burst. */
        prefetch_spread[p] = dot_x4[p] && (blocks || (parts[p].dtype == TLM_DTYPE_BF16 && far));
        /* Three activation rows or more of a block type or BF16 (sequences decoded together) go
         * through the m8 kernels, one weight row against them all, and so do all rows where the
         * CPU has no four-row kernel; on Intel's CPUs each weight row then asks for the same row
         * of the unit after next into L1 before it, and (past 256 columns) the one four units
         * further on into L2, a row at a time rather than a unit's burst. Without it the m8
         * kernels read the matrix with no prefetch, and two or three sequences decoded together
         * made fewer tokens than one. */
        pl->row_prefetch[p] = !dot_x4[p] && M <= K_VDOT_MAX_ROWS && !amd && packed;
        pl->row_prefetch_far[p] =
            pl->row_prefetch[p] && far ? K_PF_FAR_ROWS * parts[p].row_bytes : 0;
        act_stride[p] = (k_act_row_bytes(parts[p].dtype, in) + 63) & ~(size_t)63;
        acts[p] = kind == K_ACT_F32 ? (const uint8_t *)x : act ? act + off[kind] : NULL;
        if (kind == K_ACT_F32) act_stride[p] = (size_t)in * sizeof(float);
    }
    pl->y = y, pl->ldy = ldy, pl->x = x, pl->M = M, pl->in = in, pl->n = n, pl->unit_rows = ur;
    pl->parallel = par;
    pl->units = first[n];
    for (int p = 0; p < n; p++) pl->parts[p] = parts[p];
}

void k_matvec_plan_run(const k_matvec_plan *pl) {
    k_team_units(pl->units, pl->parallel, 0, mv_units_fn, (void *)(uintptr_t)pl);
}

void k_matvec_plan_rows(const k_matvec_plan *pl, int p, int r0, int r1) {
    if (r1 <= r0) return;
    mv_units(pl, pl->first_unit[p] + r0 / pl->unit_rows,
             pl->first_unit[p] + (r1 + pl->unit_rows - 1) / pl->unit_rows);
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
