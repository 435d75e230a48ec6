/* The typed dot products (src/kernels/traits.h lists them): each type's reference against the
 * widened weights (core_dtype_to_f32, ggml's dequantization) times the widened activations, every
 * vector kernel of every instruction set this CPU runs (one row, several activation rows, three
 * and four weight rows, the activation quantizers, the row conversions) against the reference, on
 * random blocks with odd tails, extreme and zero scales and the largest magnitudes; then
 * k_matvec_parts and k_linear on typed weights (decode and prefill paths) against the same
 * products on the widened F32 weight. */
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/dtype.h"
#include "core/half.h"
#include "core/quant.h"
#include "harness.h"
#include "kernels/kernels.h"
#include "kernels/matvec.h"
#include "kernels/qdot.h"
#include "kernels/qgemm.h"
#include "kernels/traits.h"

static const tlm_dtype types[] = {TLM_DTYPE_F16,    TLM_DTYPE_BF16,  TLM_DTYPE_Q8_0, TLM_DTYPE_Q4_0,
                                  TLM_DTYPE_Q4_1,   TLM_DTYPE_Q5_0,  TLM_DTYPE_Q5_1, TLM_DTYPE_Q2_K,
                                  TLM_DTYPE_Q3_K,   TLM_DTYPE_Q4_K,  TLM_DTYPE_Q5_K, TLM_DTYPE_Q6_K,
                                  TLM_DTYPE_IQ4_NL, TLM_DTYPE_IQ4_XS};
#define NTYPES (int)(sizeof types / sizeof types[0])

/* Offsets of the f16 scales in each block (the rest of a block is random bytes). */
static int scale_offsets(tlm_dtype t, int off[2]) {
    switch (t) {
    case TLM_DTYPE_Q8_0:
    case TLM_DTYPE_Q4_0:
    case TLM_DTYPE_Q5_0: off[0] = 0; return 1;
    case TLM_DTYPE_Q4_1:
    case TLM_DTYPE_Q5_1:
    case TLM_DTYPE_Q4_K:
    case TLM_DTYPE_Q5_K: off[0] = 0, off[1] = 2; return 2;
    case TLM_DTYPE_Q6_K: off[0] = 208; return 1;
    case TLM_DTYPE_Q2_K: off[0] = 80, off[1] = 82; return 2;
    case TLM_DTYPE_Q3_K: off[0] = 108; return 1;
    case TLM_DTYPE_IQ4_NL:
    case TLM_DTYPE_IQ4_XS: off[0] = 0; return 1;
    default: return 0;
    }
}

/* mode 0: random; 1: extreme scales (tiny and large, alternating blocks); 2: all zero;
 * 3: largest magnitudes (every quant byte 0xFF or 0x80, scales at 1). */
static void fill_weights(tlm_dtype t, uint8_t *w, int n, int mode) {
    const core_dtype_info *d = core_dtype_get(t);
    size_t bytes = core_dtype_bytes(t, (uint64_t)n);
    if (mode == 2) {
        memset(w, 0, bytes);
        return;
    }
    if (d->block_elems == 1) {
        for (int i = 0; i < n; i++) {
            float v =
                mode == 3 ? (i % 2 ? -60000.0f : 60000.0f) : t_unif() * (mode == 1 ? 1e-3f : 2);
            uint16_t h = t == TLM_DTYPE_F16 ? core_f32_to_f16(v) : core_f32_to_bf16(v);
            memcpy(w + 2 * i, &h, 2);
        }
        return;
    }
    for (size_t i = 0; i < bytes; i++)
        w[i] = mode == 3 ? ((i & 1) ? 0xFF : 0x80) : (uint8_t)t_rnd();
    int off[2], ns = scale_offsets(t, off);
    for (size_t b = 0; b < bytes / d->block_bytes; b++)
        for (int k = 0; k < ns; k++) {
            float v = mode == 3   ? 1.0f
                      : mode == 1 ? (b % 2 ? 3e-6f : 900.0f) * (1 + t_unif() / 2)
                                  : t_unif() * 0.05f;
            uint16_t h = core_f32_to_f16(v);
            memcpy(w + b * d->block_bytes + off[k], &h, 2);
        }
}

/* The activation row as the kernels see it, widened back to floats. */
static void act_widen(k_act_kind kind, const void *xq, float *x, int n) {
    if (kind == K_ACT_F32) {
        memcpy(x, xq, (size_t)n * sizeof(float));
    } else if (kind == K_ACT_BF16) {
        core_dtype_to_f32(TLM_DTYPE_BF16, xq, x, (size_t)n);
    } else if (kind == K_ACT_Q8_0) {
        core_dtype_to_f32(TLM_DTYPE_Q8_0, xq, x, (size_t)n);
    } else {
        const k_block_q8_k *b = xq;
        for (int i = 0; i < n; i++) x[i] = b[i / 256].d * (float)b[i / 256].qs[i % 256];
    }
}

static void check_type(tlm_dtype t, int n, int mode) {
    const char *name = tlm_dtype_name(t);
    size_t wb = core_dtype_bytes(t, (uint64_t)n);
    uint8_t *w = malloc(wb);
    float *x = malloc((size_t)n * sizeof(float)), *wf = malloc((size_t)n * sizeof(float));
    float *xf = malloc((size_t)n * sizeof(float));
    void *xq = malloc(k_act_row_bytes(t, n) + 64);
    fill_weights(t, w, n, mode);
    for (int i = 0; i < n; i++) x[i] = mode == 3 ? (i % 3 ? 1e4f : -1e4f) : t_unif() * 3;
    if (mode == 1 && n > 1) x[n / 2] = 1e-30f; /* a tiny element in one activation block */
    k_act_kind kind = k_act_of(t);
    k_act_quantize(kind, x, xq, n);
    act_widen(kind, xq, xf, n);
    CHECK_OK(core_dtype_to_f32(t, w, wf, (size_t)n));
    /* the prefill's row widening is the reference's, bit for bit */
    float *ww = malloc((size_t)n * sizeof(float));
    k_widen_row(t, w, ww, n);
    CHECK(!memcmp(ww, wf, (size_t)n * sizeof(float)), "%s n=%d: k_widen_row", name, n);
    free(ww);
    double exact = 0, mag = 0;
    for (int i = 0; i < n; i++) {
        exact += (double)wf[i] * xf[i];
        mag += fabs((double)wf[i] * xf[i]);
    }
    /* The integer sums are exact; what differs is float rounding of scales and partial sums. */
    double tol = 2e-5 * mag + 1e-30;
    float ref = -1;
    k_vdot_get(t, K_ISA_REF)(n, &ref, w, xq);
    CHECK(fabs(ref - exact) <= tol, "%s n=%d mode %d: reference %.9g, widened %.9g", name, n, mode,
          ref, exact);
    if (mode == 2) CHECK(ref == 0.0f, "%s all-zero blocks give %g", name, ref);
    for (int isa = K_ISA_AVX2; isa < K_ISA_COUNT; isa++) {
        k_vdot_fn f = k_vdot_get(t, isa);
        if (!f) continue;
        float got = -1;
        f(n, &got, w, xq);
        CHECK(fabs(got - ref) <= tol, "%s isa %d n=%d mode %d: %.9g vs reference %.9g", name, isa,
              n, mode, got, ref);
    }
    /* The activation quantization itself: every element within half a step of x. */
    if (kind == K_ACT_Q8_0 || kind == K_ACT_Q8_K) {
        int bad = 0, blk = kind == K_ACT_Q8_0 ? 32 : 256;
        /* Q8_0 keeps its step as f16: up to 127 steps of its rounding (2^-11) more */
        float half = kind == K_ACT_Q8_0 ? 0.5f + 127.0f / 2048 : 0.5f;
        for (int b = 0; b < n / blk; b++) {
            float amax = 0;
            for (int i = 0; i < blk; i++) amax = fmaxf(amax, fabsf(x[b * blk + i]));
            for (int i = 0; i < blk; i++)
                if (fabsf(xf[b * blk + i] - x[b * blk + i]) > amax / 127 * half * 1.001f + 1e-30f)
                    bad++;
        }
        CHECK(bad == 0, "%s: %d activations off by more than half a step", name, bad);
    }
    free(w);
    free(x);
    free(wf);
    free(xf);
    free(xq);
}

/* One weight row against M activation rows (k_vdot_rows_fn, M = 1..K_VDOT_MAX_ROWS) at every
 * instruction set that has a version: each row's sum against the one-row reference, with the
 * activation rows at the padded stride the decode uses. */
static void check_rows(tlm_dtype t, int n) {
    const char *name = tlm_dtype_name(t);
    size_t wb = core_dtype_bytes(t, (uint64_t)n);
    size_t rb = (k_act_row_bytes(t, n) + 63) & ~(size_t)63;
    uint8_t *w = malloc(wb), *xq = malloc(rb * K_VDOT_MAX_ROWS);
    float *x = malloc(sizeof(float) * n), *wf = malloc(sizeof(float) * n);
    double mag[K_VDOT_MAX_ROWS];
    float ref[K_VDOT_MAX_ROWS];
    if (t == TLM_DTYPE_F32)
        for (int i = 0; i < n; i++) ((float *)(void *)w)[i] = t_unif();
    else
        fill_weights(t, w, n, 0);
    CHECK_OK(core_dtype_to_f32(t, w, wf, (size_t)n));
    for (int m = 0; m < K_VDOT_MAX_ROWS; m++) {
        /* rows of different magnitudes, so that a sum landing in the wrong row shows */
        mag[m] = 0;
        for (int i = 0; i < n; i++) {
            x[i] = t_unif() * (float)(1 + 3 * m);
            mag[m] += fabs((double)wf[i] * x[i]);
        }
        k_act_quantize(k_act_of(t), x, xq + m * rb, n);
        k_vdot_get(t, K_ISA_REF)(n, &ref[m], w, xq + m * rb);
    }
    CHECK(k_vdot_rows_get(t, K_ISA_REF) == NULL, "%s: the references are one row each", name);
    for (int isa = K_ISA_AVX2; isa < K_ISA_COUNT; isa++) {
        k_vdot_rows_fn f = k_vdot_rows_get(t, isa);
        if (!f) continue;
        for (int M = 1; M <= K_VDOT_MAX_ROWS; M++) {
            float got[K_VDOT_MAX_ROWS + 1];
            got[M] = 12345.0f; /* the element after the last row stays untouched */
            f(n, M, got, w, xq, rb);
            for (int m = 0; m < M; m++)
                CHECK(fabs(got[m] - ref[m]) <= 2e-5 * mag[m] + 1e-30,
                      "%s rows isa %d n=%d M=%d row %d: %.9g vs reference %.9g", name, isa, n, M, m,
                      got[m], ref[m]);
            CHECK(got[M] == 12345.0f, "%s rows isa %d n=%d M=%d wrote past its rows", name, isa, n,
                  M);
        }
    }
    free(w);
    free(xq);
    free(x);
    free(wf);
}

/* Four weight rows against one activation row (k_vdot_w4_fn, where the type has one): each sum
 * bit for bit what the one-row product gives that row (the several-row kernel with M = 1 where
 * the type has one), which the batched decode
 * uses (so one sequence's tokens do not depend on whether it was batched), the rows at a stride
 * with a gap between them, nothing written past the fourth; and a run of groups of four in one
 * call equal to a call per group. */
/* n weights of type t at w: random floats for F32, else fill_weights's blocks. */
static void fill_weights_any(tlm_dtype t, uint8_t *w, int n) {
    if (t == TLM_DTYPE_F32)
        for (int i = 0; i < n; i++) ((float *)(void *)w)[i] = t_unif();
    else
        fill_weights(t, w, n, 0);
}

static void check_w4(tlm_dtype t, int n) {
    k_vdot_w4_fn f = k_vdot_w4(t);
    if (!f) return;
    k_vdot_rows_fn rows = k_vdot_rows(t);
    k_vdot_fn one = k_vdot(t);
    size_t wb = core_dtype_bytes(t, (uint64_t)n), ws = wb + 64;
    size_t rb = (k_act_row_bytes(t, n) + 63) & ~(size_t)63;
    uint8_t *w = calloc(4, ws), *xq = malloc(rb);
    float *x = malloc(sizeof(float) * n);
    for (int r = 0; r < 4; r++) fill_weights_any(t, w + r * ws, n);
    for (int i = 0; i < n; i++) x[i] = t_unif() * 3;
    k_act_quantize(k_act_of(t), x, xq, n);
    float got[5], want, nopf[4];
    got[4] = 12345.0f;
    f(n, got, w, ws, xq, w + ws, 1);
    f(n, nopf, w, ws, xq, NULL, 1);
    CHECK(!memcmp(got, nopf, sizeof nopf), "%s w4 n=%d: the prefetch changed the sums",
          tlm_dtype_name(t), n);
    for (int r = 0; r < 4; r++) {
        if (rows)
            rows(n, 1, &want, w + r * ws, xq, rb);
        else
            one(n, &want, w + r * ws, xq);
        CHECK(!memcmp(&got[r], &want, sizeof want), "%s w4 n=%d row %d: %.9g vs one row %.9g",
              tlm_dtype_name(t), n, r, got[r], want);
    }
    CHECK(got[4] == 12345.0f, "%s w4 n=%d wrote past its rows", tlm_dtype_name(t), n);
    /* a run of three groups in one call equals three calls, each group with its own prefetch */
    uint8_t *w12 = calloc(12, ws);
    float run[13], each[12];
    for (int r = 0; r < 12; r++) memcpy(w12 + r * ws, w + (r * 5 % 4) * ws, wb);
    for (int r = 0; r < 12; r += 5) fill_weights_any(t, w12 + r * ws, n);
    run[12] = 12345.0f;
    f(n, run, w12, ws, xq, w12 + ws, 3);
    for (int u = 0; u < 3; u++) f(n, each + 4 * u, w12 + 4 * u * ws, ws, xq, NULL, 1);
    CHECK(!memcmp(run, each, sizeof each), "%s w4 n=%d: a run of three groups equals three calls",
          tlm_dtype_name(t), n);
    CHECK(run[12] == 12345.0f, "%s w4 n=%d: a run wrote past its rows", tlm_dtype_name(t), n);
    free(w12);
    free(w);
    free(xq);
    free(x);
}

/* k_matvec_parts over M rows of x (11: a group of 8 and one of 3; 6: F32 three weight rows at a
 * time; 2: block types through the four-row kernels once per row, on Intel's CPUs) and two parts
 * (19 and 6 output rows: units of four, or of three for F32 and F16 past 8 rows, with a tail; the
 * second part's columns after the first's, one with a bias) against M one-row calls: every row's
 * sums are computed alike whatever M is, so bit for bit. */
static void check_matvec_rows(tlm_dtype t, int in, int M) {
    enum { O1 = 19, O2 = 6 };
    size_t rb = core_dtype_bytes(t, (uint64_t)in);
    uint8_t *w = malloc(rb * (O1 + O2));
    float *x = malloc(sizeof(float) * in * M), *b = malloc(sizeof(float) * O2);
    float *y = malloc(sizeof(float) * (O1 + O2) * M), *y1 = malloc(sizeof(float) * (O1 + O2) * M);
    if (t == TLM_DTYPE_F32)
        for (int i = 0; i < in * (O1 + O2); i++) ((float *)(void *)w)[i] = t_unif();
    else
        fill_weights(t, w, in * (O1 + O2), 0);
    for (int i = 0; i < in * M; i++) x[i] = t_unif() * (1 + i / in);
    for (int i = 0; i < O2; i++) b[i] = t_unif();
    k_matvec_part parts[2] = {{w, NULL, O1, rb, t, 0}, {w + rb * O1, b, O2, rb, t, O1}};
    k_matvec_parts(y, O1 + O2, x, M, in, parts, 2);
    for (int m = 0; m < M; m++)
        k_matvec_parts(y1 + m * (O1 + O2), O1 + O2, x + m * in, 1, in, parts, 2);
    CHECK(!memcmp(y, y1, sizeof(float) * (O1 + O2) * M),
          "%s k_matvec_parts: %d rows at once equal %d one-row products", tlm_dtype_name(t), M, M);
    /* and near the reference dot products */
    size_t ab = (k_act_row_bytes(t, in) + 63) & ~(size_t)63;
    uint8_t *xq = malloc(ab);
    double worst = 0, scale = 0;
    for (int m = 0; m < M; m++) {
        k_act_quantize(k_act_of(t), x + m * in, xq, in);
        for (int j = 0; j < O1 + O2; j++) {
            float r;
            k_vdot_get(t, K_ISA_REF)(in, &r, w + rb * j, xq);
            if (j >= O1) r += b[j - O1];
            worst = fmax(worst, fabs(r - y[m * (O1 + O2) + j]));
            scale = fmax(scale, fabs(r));
        }
    }
    CHECK(worst <= 1e-5 * scale, "%s k_matvec_parts: %g from the reference (of %g)",
          tlm_dtype_name(t), worst, scale);
    free(xq);
    free(w);
    free(x);
    free(b);
    free(y);
    free(y1);
}

/* k_team_units itself: every unit run once, and k_team_thread() (the index of per-thread scratch)
 * below the team's size and never held by two threads at once; on the pool and on OpenMP, by
 * teams of 2, 3 and 7. */
enum { TEAM_UNITS = 5000 };
typedef struct {
    _Atomic int ran[TEAM_UNITS];
    _Atomic int busy[8];
    _Atomic int bad;
    int team;
} team_probe;

static void team_probe_fn(void *ctx, long a, long b) {
    team_probe *p = ctx;
    int id = k_team_thread();
    if (id < 0 || id >= p->team) {
        atomic_store(&p->bad, 1);
        return;
    }
    if (atomic_fetch_add(&p->busy[id], 1)) atomic_store(&p->bad, 1);
    for (long u = a; u < b; u++) {
        volatile double z = 1.0;
        for (int i = 0; i < 200; i++)
            z = z * 1.0000001 + 1e-9; /* long enough for others to steal */
        atomic_fetch_add(&p->ran[u], 1);
    }
    atomic_fetch_sub(&p->busy[id], 1);
}

static int team_probe_run(int team, int pool) {
    static team_probe p;
    memset(&p, 0, sizeof p);
    p.team = team;
    omp_set_num_threads(team);
    int was = k_team_pool(pool);
    k_team_units(TEAM_UNITS, 1, 0, team_probe_fn, &p);
    k_team_pool(was);
    int ok = !atomic_load(&p.bad);
    for (int u = 0; u < TEAM_UNITS; u++) ok &= atomic_load(&p.ran[u]) == 1;
    return ok;
}

/* A unit's record of where it ran: in a region nested below the caller's, or not. */
static void team_level_fn(void *ctx, long a, long b) {
    _Atomic int *deeper = ctx;
    for (long u = a; u < b; u++)
        if (omp_get_level() > 1) atomic_store(deeper, 1);
}

static void check_team(void) {
    /* Inside an active parallel region k_team_units runs the call on the calling thread (a
     * nested region would be a team of one and still cost a futex wake), and K_FOR opens no
     * region while the pool is on (its region would run beside the pool's spinning threads). */
    omp_set_num_threads(2);
    _Atomic int deeper = 0, active = 0, inner = 0;
#pragma omp parallel num_threads(2)
    {
        if (omp_in_parallel()) atomic_store(&active, 1);
        k_team_units(1000, 1, 0, team_level_fn, &deeper);
    }
    CHECK(!atomic_load(&active) || !atomic_load(&deeper),
          "k_team_units inside an active region runs on the calling thread");
    for (int pool = 0; pool < 2; pool++) {
        int was = k_team_pool(pool);
        atomic_store(&inner, 0);
        K_FOR(i, 4, K_PAR_MIN, {
            (void)i;
            if (omp_in_parallel()) atomic_store(&inner, 1);
        });
        k_team_pool(was);
        CHECK(atomic_load(&inner) == (!pool && omp_get_thread_limit() > 1),
              "K_FOR past K_PAR_MIN %s with the pool %s",
              pool ? "opens no region" : "opens a region", pool ? "on" : "off");
    }
    const int teams[] = {2, 3, 7};
    for (int pool = 0; pool < 2; pool++)
        for (int k = 0; k < 3; k++)
            CHECK(team_probe_run(teams[k], pool),
                  "k_team_units (%s, %d threads): every unit once, thread ids apart",
                  pool ? "pool" : "OpenMP", teams[k]);
#if defined(__SANITIZE_THREAD__)
#define TEAM_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TEAM_TSAN 1
#endif
#endif
#ifndef TEAM_TSAN
    /* A child of fork() has only the thread that forked, not the pool's: it must start its own
     * rather than wait for threads that are not there. (ThreadSanitizer refuses threads after a
     * fork, so not under it.) */
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(20);
        _exit(team_probe_run(2, 1) && team_probe_run(3, 1) ? 0 : 1);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
              WEXITSTATUS(status) == 0,
          "k_team_units on the pool in a fork()ed child");
#endif
    tlm_threads_set(2);
}

/* A thread of its own calling k_matvec_parts with the pool asked for. */
typedef struct {
    float *y;
    const float *x;
    const k_matvec_part *parts;
    int ldy, M, in;
} two_callers;

static void *two_callers_run(void *arg) {
    two_callers *c = arg;
    omp_set_num_threads(2);
    k_team_pool(1);
    for (int r = 0; r < 50; r++) k_matvec_parts(c->y, c->ldy, c->x, c->M, c->in, c->parts, 2);
    return NULL;
}

/* k_matvec_parts on a product big enough to go to the team, by teams of 2, 3 and 7 threads (7 on
 * fewer cores: threads are often off their core, so others take chunks of their shares), on
 * OpenMP and on the pool, by two callers at once, and from inside a parallel region (which runs
 * the call on its own thread, or under OMP_THREAD_LIMIT=1 starts a team itself), against one
 * thread: which thread runs a unit must not change its sums, and every unit must be run once. */
static void check_matvec_teams(tlm_dtype t, int M) {
    enum { O1 = 1003, O2 = 97 };
    int in = t == TLM_DTYPE_F32 ? 200 : 512; /* work * M * in past K_*_PAR_MIN (matvec.c) */
    size_t rb = core_dtype_bytes(t, (uint64_t)in), ny = (size_t)(O1 + O2) * M;
    uint8_t *w = malloc(rb * (O1 + O2));
    float *x = malloc(sizeof(float) * in * M), *b = malloc(sizeof(float) * O2);
    float *y1 = malloc(sizeof(float) * ny), *y = malloc(sizeof(float) * 2 * ny);
    if (t == TLM_DTYPE_F32)
        for (int i = 0; i < in * (O1 + O2); i++) ((float *)(void *)w)[i] = t_unif();
    else
        fill_weights(t, w, in * (O1 + O2), 0);
    for (int i = 0; i < in * M; i++) x[i] = t_unif();
    for (int i = 0; i < O2; i++) b[i] = t_unif();
    k_matvec_part parts[2] = {{w, NULL, O1, rb, t, 0}, {w + rb * O1, b, O2, rb, t, O1}};
    omp_set_num_threads(1);
    k_matvec_parts(y1, O1 + O2, x, M, in, parts, 2);
    const int teams[] = {2, 3, 7};
    for (int pool = 0; pool < 2; pool++) {
        int was = k_team_pool(pool);
        for (int k = 0; k < 3; k++) {
            omp_set_num_threads(teams[k]);
            memset(y, 0xff, sizeof(float) * ny); /* NaN: a unit left out shows */
            k_matvec_parts(y, O1 + O2, x, M, in, parts, 2);
            CHECK(!memcmp(y, y1, sizeof(float) * ny),
                  "%s k_matvec_parts, M %d: %d threads (%s) equal one", tlm_dtype_name(t), M,
                  teams[k], pool ? "pool" : "OpenMP");
        }
        k_team_pool(was);
    }
    /* Two callers on the pool at once: one gets it, the other an OpenMP team. */
    omp_set_num_threads(2);
    two_callers tc[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        tc[i] = (two_callers){y + (size_t)i * ny, x, parts, O1 + O2, M, in};
        memset(tc[i].y, 0xff, sizeof(float) * ny);
    }
    int started = 0;
    for (int i = 0; i < 2; i++) started += !pthread_create(&th[i], NULL, two_callers_run, &tc[i]);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    CHECK(started == 2 && !memcmp(y, y1, sizeof(float) * ny) &&
              !memcmp(y + ny, y1, sizeof(float) * ny),
          "%s k_matvec_parts, M %d: two threads calling at once equal one", tlm_dtype_name(t), M);
    int levels = omp_get_max_active_levels();
    omp_set_max_active_levels(1);
    omp_set_num_threads(3);
    memset(y, 0xff, sizeof(float) * 2 * ny);
    int outer = 1; /* the outer team itself is one thread under OMP_THREAD_LIMIT=1 (make tsan) */
#pragma omp parallel num_threads(2)
    {
        if (omp_get_thread_num() == 0) outer = omp_get_num_threads();
        k_matvec_parts(y + (size_t)omp_get_thread_num() * ny, O1 + O2, x, M, in, parts, 2);
    }
    CHECK(!memcmp(y, y1, sizeof(float) * ny) &&
              (outer < 2 || !memcmp(y + ny, y1, sizeof(float) * ny)),
          "%s k_matvec_parts, M %d: nested one-thread teams equal one thread", tlm_dtype_name(t),
          M);
    omp_set_max_active_levels(levels);
    tlm_threads_set(2);
    free(w);
    free(x);
    free(b);
    free(y1);
    free(y);
}

/* k_linear on a typed [out, in] weight against the widened F32 weight: M <= 8 rows (decode,
 * activations quantized: within the quantization's error) and N > 8 (prefill: widened tiles and
 * sgemm, the same sums). */
static void check_linear(tlm_dtype t, int in, int out) {
    size_t rb = core_dtype_bytes(t, (uint64_t)in);
    uint8_t *w = malloc(rb * out);
    float *wf = malloc(sizeof(float) * in * out);
    int N = 37;
    float *x = malloc(sizeof(float) * in * N), *y = malloc(sizeof(float) * out * N),
          *yf = malloc(sizeof(float) * out * N), *b = malloc(sizeof(float) * out);
    fill_weights(t, w, in * out, 0);
    CHECK_OK(core_dtype_to_f32(t, w, wf, (size_t)in * out));
    for (int i = 0; i < in * N; i++) x[i] = t_unif();
    for (int i = 0; i < out; i++) b[i] = t_unif();
    tlm_weight tw = {.dtype = t, .data = w, .rows = out, .cols = in, .row_bytes = rb};
    tlm_weight fw = {.dtype = TLM_DTYPE_F32,
                     .data = wf,
                     .rows = out,
                     .cols = in,
                     .row_bytes = sizeof(float) * in};
    /* Many rows: the default path (the repacked 8-bit products where the CPU runs them), then
     * K_PREFILL_INT8 (the integer decode kernels), K_PREFILL_SGEMM (widened tiles) and the
     * default again. */
    const int rows[] = {1, 8, N, N, N, N};
    const k_prefill_path mode[] = {K_PREFILL_DEFAULT, K_PREFILL_DEFAULT, K_PREFILL_DEFAULT,
                                   K_PREFILL_INT8,    K_PREFILL_SGEMM,   K_PREFILL_DEFAULT};
    for (int c = 0; c < 6; c++) {
        int M = rows[c], blocks = k_act_of(t) != K_ACT_F32 && k_act_of(t) != K_ACT_BF16;
        /* (BF16 goes through qgemm.c by default, activations rounded to BF16 as decode does) */
        int int8 = ((blocks || t == TLM_DTYPE_BF16) && c == 3) ||
                   ((c == 2 || c == 5) && (blocks || t == TLM_DTYPE_BF16) && k_qgemm_takes(t));
        k_prefill_path was = k_linear_prefill(mode[c]);
        k_linear(y, out, x, M, &tw, b);
        k_linear_prefill(was);
        k_linear(yf, out, x, M, &fw, b);
        double worst = 0, scale = 0;
        for (int i = 0; i < M * out; i++) {
            worst = fmax(worst, fabs(y[i] - yf[i]));
            scale = fmax(scale, fabs(yf[i]));
        }
        /* Quantized activations carry ~1/254 of each block's largest element as error. */
        double tol = (M <= 8 || int8) && k_act_of(t) != K_ACT_F32 ? 0.02 * scale : 1e-4 * scale;
        CHECK(worst <= tol, "%s k_linear M=%d: worst difference %g (scale %g)", tlm_dtype_name(t),
              M, worst, scale);
    }
    free(w);
    free(wf);
    free(x);
    free(y);
    free(yf);
    free(b);
}

/* An x whose product with scale s rounds, as a float, to exactly k + 0.5 while the exact product
 * is not k + 0.5 (where one exists near (k + 0.5) / s): a quantizer that skips the product's
 * rounding (a fused multiply-add into the rounding step) lands on the other side of the tie. */
static float half_step(int k, float s) {
    float t = (float)k + 0.5f, x0 = t / s, x = x0;
    for (int d = 0; d < 16; d++) {
        volatile float p = x * s; /* rounded to a float, whatever the build contracts */
        if (p == t && (double)x * s != (double)t) return x;
        x = d % 2 ? nextafterf(x0, INFINITY) : nextafterf(x0, -INFINITY);
        for (int e = 0; e < d / 2; e++)
            x = d % 2 ? nextafterf(x, INFINITY) : nextafterf(x, -INFINITY);
    }
    return x0;
}

/* k_act_quantize (the vector version where this CPU has one), and each instruction set's quantizer
 * of the kind (k_act_quantizer_at), against k_act_quantize_ref, byte for byte over the whole row
 * (blocks, scales, the kernels' rearranged copies), on rows of n elements: random, with zero
 * blocks, with ties half-way between two steps, with the largest element first negative then
 * positive at equal magnitude, at the extremes of float, and at products that round to exact ties
 * (half_step; Q8_K's scale is the negative of Q8_0's, so there too). */
static void check_act_quantize(k_act_kind kind, int n) {
    tlm_dtype t = kind == K_ACT_Q8_0   ? TLM_DTYPE_Q8_0
                  : kind == K_ACT_Q8_K ? TLM_DTYPE_Q6_K
                                       : TLM_DTYPE_BF16;
    size_t rb = k_act_row_bytes(t, n);
    float *x = malloc((size_t)n * sizeof(float));
    uint8_t *a = malloc(rb), *b = malloc(rb);
    for (int mode = 0; mode < 7; mode++) {
        for (int i = 0; i < n; i++) {
            float u = t_unif() * 4;
            switch (mode) {
            case 0: x[i] = u; break;
            case 1: x[i] = (i / 32) % 3 == 1 ? 0.0f : u; break; /* whole zero blocks */
            case 2: x[i] = i % 32 == 0 ? 127.0f : (float)(i % 7) - 3.5f; break; /* ties */
            case 3: x[i] = i % 64 == 5 ? -8.0f : i % 64 == 9 ? 8.0f : u; break;
            case 4: x[i] = i % 3 ? 3e38f * (u > 0 ? 1 : -1) : 1e-38f * u; break;
            case 5: x[i] = i % 5 ? 1e-40f * u : -1e-30f; break; /* subnormals, tiny scales */
            default: x[i] = i % 32 ? half_step(i % 100 - 50, 127.0f / 100.3f) : 100.3f; break;
            }
        }
        if (kind == K_ACT_BF16 && n > 3) {
            uint32_t nan = 0x7fa00001u, inf = 0x7f800000u;
            memcpy(&x[1], &nan, 4);
            memcpy(&x[2], &inf, 4);
        }
        memset(b, 0xA5, rb);
        k_act_quantize_ref(kind, x, b, n);
        for (int isa = K_ISA_REF; isa <= k_isa() + 1; isa++) {
            /* each set's quantizer, then (isa past the CPU's) the one k_act_quantize runs */
            memset(a, 0xA5, rb);
            if (isa <= k_isa())
                k_act_quantizer_at(kind, isa)(x, a, n);
            else
                k_act_quantize(kind, x, a, n);
            size_t at = 0;
            while (at < rb && a[at] == b[at]) at++;
            CHECK(at == rb,
                  "activation kind %d isa %d n=%d mode %d: byte %zu of %zu differs (%02x vs %02x)",
                  kind, isa, n, mode, at, rb, at < rb ? a[at] : 0, at < rb ? b[at] : 0);
        }
    }
    free(x);
    free(a);
    free(b);
}

/* Every kernel of a type at one instruction set (k_traits_at, the record as chosen there) against
 * the reference on n columns: the one-row kernel within the reference's tolerance; the m8 kernel
 * too, for M = 1..8 rows at the decode's padded stride, each row bit for bit its own M = 1 call
 * and nothing written past the last; x3m4 (three weight rows a stride apart, M = 1..4) and x4 (a
 * run of two units of four, with a prefetch pointer and without) bit for bit what the record's
 * m8 kernel (else its one-row kernel) gives each pair. */
static void check_set_dots(tlm_dtype t, const k_type_traits *tr, int isa, int n) {
    const char *name = tlm_dtype_name(t);
    size_t wb = core_dtype_bytes(t, (uint64_t)n), ws = wb + 64;
    size_t rb = (k_act_row_bytes(t, n) + 63) & ~(size_t)63;
    enum { R = 8 }; /* weight rows */
    uint8_t *w = calloc(R, ws), *xq = calloc(K_VDOT_MAX_ROWS, rb);
    float *x = malloc(sizeof(float) * n), *wf = malloc(sizeof(float) * n);
    float ref[R][K_VDOT_MAX_ROWS], one[R][K_VDOT_MAX_ROWS];
    double mag[R][K_VDOT_MAX_ROWS];
    for (int r = 0; r < R; r++) fill_weights_any(t, w + r * ws, n);
    for (int m = 0; m < K_VDOT_MAX_ROWS; m++) {
        for (int i = 0; i < n; i++) x[i] = t_unif() * (float)(1 + 3 * m);
        k_act_quantize_ref(tr->act, x, xq + m * rb, n);
    }
    for (int r = 0; r < R; r++) {
        CHECK_OK(core_dtype_to_f32(t, w + r * ws, wf, (size_t)n));
        for (int m = 0; m < K_VDOT_MAX_ROWS; m++) {
            float *xf = x;
            act_widen(tr->act, xq + m * rb, xf, n);
            mag[r][m] = 0;
            for (int i = 0; i < n; i++) mag[r][m] += fabs((double)wf[i] * xf[i]);
            k_vdot_get(t, K_ISA_REF)(n, &ref[r][m], w + r * ws, xq + m * rb);
            tr->vec_dot(n, &one[r][m], w + r * ws, xq + m * rb);
            CHECK(fabs(one[r][m] - ref[r][m]) <= 2e-5 * mag[r][m] + 1e-30,
                  "%s isa %d n=%d: one-row %.9g vs reference %.9g", name, isa, n, one[r][m],
                  ref[r][m]);
        }
    }
    /* what the record's x3m4 and x4 kernels must equal: its m8 kernel's sums, else its one row's */
    float want[R][K_VDOT_MAX_ROWS];
    memcpy(want, one, sizeof want);
    if (tr->vec_dot_m8) {
        for (int r = 0; r < R; r++)
            for (int m = 0; m < K_VDOT_MAX_ROWS; m++)
                tr->vec_dot_m8(n, 1, &want[r][m], w + r * ws, xq + m * rb, rb);
        for (int M = 1; M <= K_VDOT_MAX_ROWS; M++) {
            float got[K_VDOT_MAX_ROWS + 1];
            got[M] = 12345.0f;
            tr->vec_dot_m8(n, M, got, w, xq, rb);
            for (int m = 0; m < M; m++) {
                CHECK(fabs(got[m] - ref[0][m]) <= 2e-5 * mag[0][m] + 1e-30,
                      "%s m8 isa %d n=%d M=%d row %d: %.9g vs reference %.9g", name, isa, n, M, m,
                      got[m], ref[0][m]);
                CHECK(!memcmp(&got[m], &want[0][m], sizeof(float)),
                      "%s m8 isa %d n=%d M=%d row %d: %.9g vs the row alone %.9g", name, isa, n, M,
                      m, got[m], want[0][m]);
            }
            CHECK(got[M] == 12345.0f, "%s m8 isa %d n=%d M=%d wrote past its rows", name, isa, n,
                  M);
        }
    }
    if (tr->vec_dot_x3m4) {
        CHECK(tr->vec_dot_m8 != NULL, "%s isa %d: x3m4 without m8", name, isa);
        for (int M = 1; M <= K_VDOT3_MAX_ROWS; M++) {
            float got[3 * K_VDOT3_MAX_ROWS + 1];
            got[3 * M] = 12345.0f;
            tr->vec_dot_x3m4(n, M, got, w + ws, ws, xq, rb);
            for (int k = 0; k < 3; k++)
                for (int m = 0; m < M; m++)
                    CHECK(!memcmp(&got[k * M + m], &want[1 + k][m], sizeof(float)),
                          "%s x3m4 isa %d n=%d M=%d (%d, %d): %.9g vs m8 %.9g", name, isa, n, M, k,
                          m, got[k * M + m], want[1 + k][m]);
            CHECK(got[3 * M] == 12345.0f, "%s x3m4 isa %d n=%d M=%d wrote past its rows", name, isa,
                  n, M);
        }
    }
    if (tr->vec_dot_x4) {
        for (int pf = 0; pf < 2; pf++) {
            float got[R + 1];
            got[R] = 12345.0f;
            tr->vec_dot_x4(n, got, w, ws, xq + 2 * rb, pf ? w + 4 * ws : NULL, 2);
            for (int r = 0; r < R; r++)
                CHECK(!memcmp(&got[r], &want[r][2], sizeof(float)),
                      "%s x4 isa %d n=%d%s row %d: %.9g vs one row %.9g", name, isa, n,
                      pf ? " (prefetching)" : "", r, got[r], want[r][2]);
            CHECK(got[R] == 12345.0f, "%s x4 isa %d n=%d wrote past its rows", name, isa, n);
        }
    }
    free(w), free(xq), free(x), free(wf);
}

/* The record's row conversions at one instruction set against their references in src/core, on
 * rows with tails and special values: widen bit for bit core_dtype_to_f32, narrow and quantize
 * (with an importance matrix and without) byte for byte core_dtype_from_f32 / core_quantize_rows.
 */
static void check_set_conversions(tlm_dtype t, const k_type_traits *tr, int isa) {
    const char *name = tlm_dtype_name(t);
    int be = (int)core_dtype_get(t)->block_elems, n = be == 1 ? 16 * 37 + 7 : be * 37;
    size_t bytes = core_dtype_bytes(t, (uint64_t)n);
    float *x = malloc(sizeof(float) * n), *qw = malloc(sizeof(float) * n);
    float *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n);
    uint8_t *qa = malloc(bytes), *qb = malloc(bytes);
    for (int i = 0; i < n; i++) {
        x[i] = (2.0f * t_unif() - 1.0f) * ldexpf(1.0f, (int)(t_unif() * 40.0f) - 24);
        qw[i] = i % 11 == 3 ? 0.0f : ldexpf(t_unif() + 1.0f, (int)(t_unif() * 10.0f) - 5);
    }
    static const float special[] = {0.0f,           -0.0f,    65504.0f,  65520.0f, 1e-8f,
                                    1.00048828125f, INFINITY, -INFINITY, 3e38f};
    for (int i = 0; i < (int)(sizeof special / sizeof special[0]) && 19 * i + 5 < n; i++)
        x[19 * i + 5] = special[i];
    if (tr->widen) {
        fill_weights_any(t, qa, n);
        tr->widen(qa, a, n);
        CHECK_OK(core_dtype_to_f32(t, qa, b, (size_t)n));
        CHECK(!memcmp(a, b, sizeof(float) * n), "%s widen isa %d differs from core_dtype_to_f32",
              name, isa);
    }
    if (tr->narrow) {
        tr->narrow(x, qa, n);
        CHECK_OK(core_dtype_from_f32(t, x, qb, (size_t)n));
        CHECK(!memcmp(qa, qb, bytes), "%s narrow isa %d differs from core_dtype_from_f32", name,
              isa);
    }
    for (int weighted = 0; tr->quantize && weighted < 2; weighted++) {
        tr->quantize(x, qa, n, weighted ? qw : NULL);
        CHECK_OK(core_quantize_rows(t, x, qb, 1, (size_t)n, weighted ? qw : NULL));
        CHECK(!memcmp(qa, qb, bytes), "%s quantize isa %d%s differs from core_quantize_rows", name,
              isa, weighted ? " (importance matrix)" : "");
    }
    free(x), free(qw), free(a), free(b), free(qa), free(qb);
}

/* Every instruction set this CPU runs, AVX2 with and without AVX-VNNI: the type's record there and
 * each of its kernels against the reference. The references' own record has the reference's one
 * row alone. */
static void check_every_set(tlm_dtype t) {
    int be = (int)core_dtype_get(t)->block_elems;
    static const int counts[] = {1, 3, 8, 33}, fn[] = {768, 32 * 7 + 5, 16 * 3 + 9, 11};
    for (int isa = K_ISA_REF; isa <= k_isa(); isa++)
        for (int vnni = 0; vnni < 2; vnni++) {
            k_avxvnni_cap(vnni);
            if (vnni && (isa != K_ISA_AVX2 || !k_avxvnni())) continue;
            k_type_traits tr = k_traits_at(t, isa);
            CHECK(tr.type == t && tr.act == k_act_of(t) && tr.vec_dot,
                  "%s isa %d: a record with a dot product", tlm_dtype_name(t), isa);
            if (isa == K_ISA_REF)
                CHECK(tr.vec_dot == k_vdot_get(t, K_ISA_REF) && !tr.vec_dot_m8 &&
                          !tr.vec_dot_x3m4 && !tr.vec_dot_x4 && !tr.widen && !tr.narrow &&
                          !tr.quantize,
                      "%s: the references' record is the reference's one row", tlm_dtype_name(t));
            for (int c = 0; c < 4; c++)
                check_set_dots(t, &tr, isa, be == 1 ? fn[c] : counts[c] * be);
            check_set_conversions(t, &tr, isa);
        }
    k_avxvnni_cap(1);
}

/* k_q8_0_blocks (a Q8_0 KV cache's stores; AVX-512 where the CPU has it) against its reference. */
static void check_q8_0_blocks(void) {
    enum { N = 32 * 13 };
    float x[N];
    uint8_t a[N / 32 * 34], b[N / 32 * 34];
    for (int i = 0; i < N; i++) x[i] = t_unif() * ldexpf(1.0f, i / 32 - 6);
    for (int i = 0; i < 32; i++) x[64 + i] = i == 0 ? 127.0f : (float)(i % 16) + 0.5f; /* ties */
    k_q8_0_blocks(x, a, N);
    k_q8_0_blocks_ref(x, b, N);
    CHECK(!memcmp(a, b, sizeof a), "k_q8_0_blocks differs from its reference");
}

int main(void) {
    tlm_threads_set(2); /* also keeps OpenBLAS's team within OMP_THREAD_LIMIT (make tsan) */
    printf("vector instruction set: %d\n", k_isa());
    for (int ti = 0; ti < NTYPES; ti++) {
        tlm_dtype t = types[ti];
        int be = (int)core_dtype_get(t)->block_elems;
        CHECK(k_linear_takes(t), "%s computed on", tlm_dtype_name(t));
        CHECK(k_vdot(t) != NULL, "%s has a dot product", tlm_dtype_name(t));
        /* whole blocks in odd counts, so that the two-blocks-per-vector kernels see a tail */
        int counts[] = {1, 3, 7, 8, 33};
        for (int c = 0; c < 5; c++) {
            int n = be == 1 ? counts[c] * 17 : counts[c] * be;
            for (int mode = 0; mode < 4; mode++) check_type(t, n, mode);
        }
        check_linear(t, be == 256 ? 512 : 96, 19);
        for (int c = 0; c < 5; c++) check_rows(t, be == 1 ? counts[c] * 17 : counts[c] * be);
        for (int c = 0; c < 5; c++) check_w4(t, be == 1 ? counts[c] * 17 : counts[c] * be);
        check_matvec_rows(t, be == 1 ? 200 : 3 * be, 11);
        check_matvec_rows(t, be == 1 ? 200 : 3 * be, 6);
        check_matvec_rows(t, be == 1 ? 200 : 3 * be, 2); /* the four-row kernels per row */
        check_matvec_rows(t, be == 1 ? 200 : 3 * be, 3);
        check_matvec_teams(t, 1);
        check_matvec_teams(t, 3);
    }
    /* F32 rows: whole vectors, a tail of each width, shorter than one vector */
    const int f32n[] = {768, 32 * 7 + 5, 16 * 3 + 9, 11};
    for (int c = 0; c < 4; c++) check_rows(TLM_DTYPE_F32, f32n[c]);
    for (int c = 0; c < 4; c++) check_w4(TLM_DTYPE_F32, f32n[c]);
    check_matvec_rows(TLM_DTYPE_F32, 200, 11);
    check_matvec_rows(TLM_DTYPE_F32, 200, 6);
    check_matvec_teams(TLM_DTYPE_F32, 1);
    check_matvec_teams(TLM_DTYPE_F32, 3);
    check_team();
    for (int ti = 0; ti < NTYPES; ti++) check_every_set(types[ti]);
    check_every_set(TLM_DTYPE_F32);
    check_q8_0_blocks();
    const int qn[] = {32, 96, 128, 256, 288, 768, 2048}, kn[] = {256, 512, 768, 2048},
              bn[] = {16, 17, 768, 33};
    for (int i = 0; i < 7; i++) check_act_quantize(K_ACT_Q8_0, qn[i]);
    for (int i = 0; i < 4; i++) check_act_quantize(K_ACT_Q8_K, kn[i]);
    for (int i = 0; i < 4; i++) check_act_quantize(K_ACT_BF16, bn[i]);
    CHECK(!k_linear_takes(TLM_DTYPE_I32), "integers are not weights");
    if (k_isa() >= K_ISA_AVX512) {
        const tlm_dtype w4t[] = {TLM_DTYPE_F32,  TLM_DTYPE_F16,  TLM_DTYPE_Q8_0, TLM_DTYPE_Q4_0,
                                 TLM_DTYPE_Q4_K, TLM_DTYPE_Q5_K, TLM_DTYPE_Q6_K};
        for (int i = 0; i < 7; i++)
            CHECK(k_vdot_w4(w4t[i]) != NULL, "%s has a four-row kernel", tlm_dtype_name(w4t[i]));
    }
    /* The AVX2 four-row kernels (F32, F16, the block types but Q4_1, Q5_0, Q5_1) against AVX2's
     * one-row ones, and the products through them, on a CPU with AVX-512 too: the kernels chosen as
     * at AVX2. */
    for (int vnni = 0; vnni < 2 && k_isa() >= K_ISA_AVX2; vnni++) {
        /* first as a CPU without AVX-VNNI, then (where this one has it) with */
        k_avxvnni_cap(vnni);
        if (vnni && !k_avxvnni()) break;
        k_isa_cap(K_ISA_AVX2);
        const tlm_dtype w2t[] = {TLM_DTYPE_Q8_0,   TLM_DTYPE_Q4_0,   TLM_DTYPE_Q4_K, TLM_DTYPE_Q5_K,
                                 TLM_DTYPE_Q6_K,   TLM_DTYPE_IQ4_NL, TLM_DTYPE_Q2_K, TLM_DTYPE_Q3_K,
                                 TLM_DTYPE_IQ4_XS, TLM_DTYPE_F32,    TLM_DTYPE_F16};
        for (int i = 0; i < 11; i++) {
            tlm_dtype t = w2t[i];
            int be = (int)core_dtype_get(t)->block_elems;
            CHECK(k_vdot_w4(t) != NULL, "%s has an AVX2 four-row kernel", tlm_dtype_name(t));
            /* float rows: whole vectors, and tails of each width */
            const int counts[] = {1, 3, 7, 8, 33}, fn[] = {768, 32 * 7 + 5, 16 * 3 + 9, 11, 256};
            for (int c = 0; c < 5; c++) check_w4(t, be == 1 ? fn[c] : counts[c] * be);
            check_matvec_rows(t, be == 1 ? 200 : 3 * be, 1);
            check_matvec_rows(t, be == 1 ? 200 : 3 * be, 2);
            check_matvec_rows(t, be == 1 ? 200 : 3 * be, 3); /* batched decode's rows */
            check_matvec_rows(t, be == 1 ? 200 : 3 * be, 6);
            check_matvec_teams(t, 1);
        }
        for (int i = 0; i < 7; i++) check_act_quantize(K_ACT_Q8_0, qn[i]);
        for (int i = 0; i < 4; i++) check_act_quantize(K_ACT_Q8_K, kn[i]);
        k_isa_cap(K_ISA_COUNT);
    }
    k_avxvnni_cap(1);
    return t_finish("test_qk_kernels");
}
