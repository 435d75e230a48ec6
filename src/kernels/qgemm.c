/* The driver of the repacked 8-bit products on block-type weights (qgemm.h): the kernels a call
 * runs (its plan, chosen once per call from the type's record and the CPU), the quantization of
 * the activation rows, and the team split of the weight's 16-row groups; and the switches that
 * pick instruction sets. The kernels are in ref/ and x86/ (gemm_traits.h lists them); float
 * weights' products in fgemm.c, the pack cache in gemm_cache.c. */
#include "qgemm.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "core/dtype.h"
#include "core/knob.h"
#include "kernels/cpu.h"
#include "kernels/gemm_traits.h"
#include "kernels/kernels.h"
#include "kernels/qdot.h"

int k_qgemm_sub(tlm_dtype t) {
    const k_gemm_ops *ops = k_gemm_ops_of(t);
    return ops ? ops->sub : 0;
}

int k_qgemm_covers(tlm_dtype t) { return k_gemm_ops_of(t) != NULL; }

int k_qgemm_takes(tlm_dtype t) { return k_qgemm_isa(t) >= 0; }

int k_qgemm_bf16_ok(void) { return K_GEMM_X86 && k_cpu()->avx512bf16; }

int k_gemm_isa_ok(int isa) {
    if (isa == K_ISA_REF) return 1;
    if (isa == K_ISA_AVX2) return K_GEMM_X86 && k_cpu()->isa >= K_ISA_AVX2;
    return K_GEMM_X86 && isa == K_ISA_AVX512 && k_cpu()->isa >= K_ISA_AVX512;
}

/* ---- the switches ------------------------------------------------------------------------- */

static atomic_int avxvnni_on = 1;

void k_qgemm_avxvnni_enable(int on) { atomic_store(&avxvnni_on, on); }

int k_qgemm_avxvnni_ok(void) { return K_GEMM_X86 && atomic_load(&avxvnni_on) && k_avxvnni(); }

/* AMX is on where the CPU has it unless turned off: k_qgemm_amx_enable(0), or TLM_AMX=off in a
 * benchmark build (bench/quant/prefill_paths.sh run both ways compares them). */
static atomic_int amx_state = -1; /* -1: not read yet; 0: off; 1: on where the CPU has it */

static int amx_switch(void) {
    int st = atomic_load_explicit(&amx_state, memory_order_relaxed);
    if (st < 0) {
        const char *e = core_bench_knob("TLM_AMX");
        st = !(e && !strcmp(e, "off"));
        atomic_store_explicit(&amx_state, st, memory_order_relaxed);
    }
    return st;
}

int k_qgemm_amx_ok(void) {
    return amx_switch() && K_GEMM_X86 && k_cpu()->amx_bf16 && k_isa() >= K_ISA_AVX512;
}

int k_qgemm_amx_int8_ok(void) {
    return amx_switch() && K_GEMM_X86 && k_cpu()->amx_int8 && k_isa() >= K_ISA_AVX512;
}

void k_qgemm_amx_enable(int on) {
    atomic_store_explicit(&amx_state, on ? 1 : 0, memory_order_relaxed);
}

/* Whether AVX2's level takes the type: every covered type with AVX-VNNI, else those whose bytes
 * fit maddubs. */
static int avx2_takes(const k_gemm_ops *ops) {
    return K_GEMM_X86 && (k_qgemm_avxvnni_ok() || ops->maddubs_max);
}

/* The instruction set k_qgemm runs the type at on this CPU (TLM_ISA capped), or -1. */
int k_qgemm_isa(tlm_dtype t) {
    if (t == TLM_DTYPE_BF16)
        return k_isa() >= K_ISA_AVX512 && k_qgemm_bf16_ok() ? K_ISA_AVX512 : -1;
    const k_gemm_ops *ops = k_gemm_ops_of(t);
    if (!ops) return -1;
    if (k_isa() >= K_ISA_AVX512) return K_ISA_AVX512;
    if (k_isa() >= K_ISA_AVX2 && avx2_takes(ops)) return K_ISA_AVX2;
    return -1;
}

/* ---- the plan of a call ------------------------------------------------------------------- */

/* The kernels of one product, chosen once per call. */
typedef struct {
    const k_gemm_ops *ops;
    k_qgemm_quantize_fn *quantize; /* the activation rows */
    k_qgemm_pack16_fn *pack16;     /* whole groups; NULL: k_qgemm_pack */
    k_qgemm_micro_fn *micro;
    int acts; /* activation rows per micro-kernel call */
    int pad;  /* 16: the micro-kernel reads all 16 rows, so the rows are padded with zero rows */
    void (*begin)(int sub), (*end)(void); /* around a thread's share (AMX's tiles) */
} qgemm_plan;

/* The activation quantizer of isa where this CPU runs it, else the reference. */
static k_qgemm_quantize_fn *quantizer_of(int isa) {
#if K_GEMM_X86
    if (isa == K_ISA_AVX512 && k_gemm_isa_ok(isa)) return k_qgemm_quantize_avx512;
    if (isa == K_ISA_AVX2 && k_gemm_isa_ok(isa)) return k_qgemm_quantize_avx2;
#endif
    return k_qgemm_quantize;
}

/* The kernels of a product on the type ops with instruction set isa; 0 where this CPU or isa does
 * not take the type. */
static int plan_qgemm(const k_gemm_ops *ops, int isa, qgemm_plan *p) {
    *p = (qgemm_plan){ops, quantizer_of(isa), NULL, k_qgemm_micro_16x8_ref, K_QG_ACTS, 1, NULL,
                      NULL};
    if (!k_gemm_isa_ok(isa)) return 0;
#if K_GEMM_X86
    if (isa == K_ISA_AVX512) {
        p->pack16 = ops->pack16_avx512;
        p->micro = k_qgemm_micro_16x8_avx512vnni;
        if (ops->amx_int8 && k_qgemm_amx_int8_ok()) {
            p->micro = k_qgemm_micro_16x16_amxint8;
            p->acts = p->pad = 16;
            p->begin = k_qgemm_amx_int8_begin;
            p->end = k_amx_end;
        }
    } else if (isa == K_ISA_AVX2) {
        if (!avx2_takes(ops)) return 0;
        p->micro = k_qgemm_avxvnni_ok() ? k_qgemm_micro_16x3_avxvnni : k_qgemm_micro_16x3_avx2;
    }
#endif
    return 1;
}

/* Rows r0 .. r0 + nr - 1 of w as one group: by pack16 where it has one and the group is whole. */
static void pack_group(k_qgemm_pack16_fn *pack16, const tlm_weight *w, int r0, int nr, uint8_t *q,
                       float *s, float *m) {
    if (pack16 && nr == K_QG_ROWS)
        pack16(w, r0, q, s, m);
    else
        k_qgemm_pack(w, r0, nr, q, s, m);
}

void k_qgemm_pack_isa(int isa, const tlm_weight *w, int r0, int nrows, uint8_t *q, float *s,
                      float *m) {
    const k_gemm_ops *ops = k_gemm_ops_of(w->dtype);
    int vec = isa == K_ISA_AVX512 && k_gemm_isa_ok(isa);
    pack_group(vec ? ops->pack16_avx512 : NULL, w, r0, nrows, q, s, m);
}

void k_qgemm_quantize_isa(int isa, const float *x, int n, int sub, int8_t *q, float *d, float *ds) {
    quantizer_of(isa)(x, n, sub, q, d, ds);
}

/* ---- the product -------------------------------------------------------------------------- */

typedef struct {
    const float *x;
    int8_t *xq;
    float *xd, *xs;
    k_qgemm_quantize_fn *quantize;
    int n, sub;
} quant_ctx;

static void quantize_some(void *ctx, long a, long b) {
    const quant_ctx *c = ctx;
    size_t n = (size_t)c->n, nb32 = n / 32, nsb = n / (size_t)c->sub;
    for (long i = a; i < b; i++)
        c->quantize(c->x + i * n, c->n, c->sub, c->xq + i * n, c->xd + i * nb32, c->xs + i * nsb);
}

/* Rows by k_team_units, as every loop of these products: a decode step of many sequences
 * (tlm serve) runs them on the pool, and so opens no OpenMP region (kernels.h, k_team_pool). */
static void quantize_rows(const qgemm_plan *p, const float *x, int N, int n, int8_t *xq, float *xd,
                          float *xs) {
    quant_ctx c = {x, xq, xd, xs, p->quantize, n, p->ops->sub};
    k_team_units(N, (long)N * n >= K_PAR_MIN, 0, quantize_some, &c);
}

typedef struct {
    float *y;
    int ldy, N;
    const tlm_weight *w;
    const float *b;
    const qgemm_plan *plan;
    int n, out;
    size_t nb32, nsb;
    const int8_t *xq;
    const float *xd, *xs;
    const char *cache;
    size_t pack_bytes;
    _Atomic int failed;
} qg_ctx;

/* Groups [g0, g1) of K_QG_ROWS weight rows: repacked (or taken from the cache), then their
 * products with every activation row. */
static void qg_groups(void *ctx, long g0, long g1) {
    qg_ctx *c = ctx;
    const qgemm_plan *p = c->plan;
    const tlm_weight *w = c->w;
    int N = c->N, n = c->n, out = c->out, step = p->acts;
    size_t nb32 = c->nb32, nsb = c->nsb;
    if (p->begin) p->begin(p->ops->sub);
    for (long g = g0; g < g1; g++) {
        float *ps = c->cache ? (float *)(c->cache + (size_t)g * c->pack_bytes)
                             : k_scratch(0, c->pack_bytes);
        if (!ps) {
            atomic_store_explicit(&c->failed, 1, memory_order_relaxed);
            break;
        }
        float *pm = ps + nsb * K_QG_ROWS;
        uint8_t *pq = (uint8_t *)(pm + nsb * K_QG_ROWS);
        int r0 = (int)g * K_QG_ROWS, nr = out - r0 < K_QG_ROWS ? out - r0 : K_QG_ROWS;
        if (!c->cache) {
            pack_group(p->pack16, w, r0, nr, pq, ps, pm);
            /* The next group's rows, while this one's products run: a small model's rows are a
             * few cache lines each, too short a stream for the hardware to fetch ahead, and the
             * repacking waits for them otherwise (a profile of bench/quant/prefill_paths.sh on
             * 15M Q4_0, one thread). */
            int next = out - r0 - nr < K_QG_ROWS ? out - r0 - nr : K_QG_ROWS;
            const char *nx = (const char *)w->data + (size_t)(r0 + nr) * w->row_bytes;
            for (size_t at = 0; at < (size_t)next * w->row_bytes; at += 64)
                __builtin_prefetch(nx + at, 0, 2);
        }
        float tile[16 * K_QG_ROWS];
        for (int a0 = 0; a0 < N; a0 += step) {
            int na = N - a0 < step ? N - a0 : step;
            const int8_t *xq = c->xq + (size_t)a0 * n;
            const float *xd = c->xd + (size_t)a0 * nb32, *xs = c->xs + (size_t)a0 * nsb;
            p->micro(p->ops, n, pq, ps, pm, xq, xd, xs, na, tile);
            for (int a = 0; a < na; a++) {
                float *yr = c->y + (size_t)(a0 + a) * c->ldy + r0;
                for (int r = 0; r < nr; r++)
                    yr[r] = tile[a * K_QG_ROWS + r] + (c->b ? c->b[r0 + r] : 0.0f);
            }
        }
    }
    if (p->end) p->end();
}

int k_qgemm(float *y, int ldy, const float *x, int N, const tlm_weight *w, const float *b,
            int isa) {
    if (w->dtype == TLM_DTYPE_BF16) return k_bf16_gemm(y, ldy, x, N, w, b, isa);
    const k_gemm_ops *ops = k_gemm_ops_of(w->dtype);
    int n = (int)w->cols, out = (int)w->rows;
    qgemm_plan p;
    if (!ops || N <= 0 || n <= 0 || n % (int)core_dtype_get(w->dtype)->block_elems ||
        !plan_qgemm(ops, isa, &p))
        return -1;
    int sub = ops->sub;
    size_t nb32 = (size_t)n / 32, nsb = (size_t)n / sub;
    int Np = (N + p.pad - 1) / p.pad * p.pad;
    /* The calling thread's slot 1 holds the quantized activations, which every thread reads; each
     * thread's slot 0 holds the group of weight rows it is working on. */
    float *xd = k_scratch(1, (size_t)Np * ((nb32 + nsb) * sizeof(float) + (size_t)n));
    if (!xd) return -1;
    float *xs = xd + (size_t)Np * nb32;
    int8_t *xq = (int8_t *)(xs + (size_t)Np * nsb);
    quantize_rows(&p, x, N, n, xq, xd, xs);
    if (Np > N) {
        memset(xd + (size_t)N * nb32, 0, (size_t)(Np - N) * nb32 * sizeof(float));
        memset(xs + (size_t)N * nsb, 0, (size_t)(Np - N) * nsb * sizeof(float));
        memset(xq + (size_t)N * n, 0, (size_t)(Np - N) * n);
    }
    size_t pack_bytes = k_qgemm_group_bytes(n, sub);
    qg_ctx c = {y, ldy, N, w, b, &p, n, out, nb32, nsb, xq, xd, xs, NULL, pack_bytes, 0};
    c.cache = k_qgemm_cache_get(w, pack_bytes, isa);
    /* a group at a time: a group is 16 rows by every activation row, microseconds of work */
    k_team_units((out + K_QG_ROWS - 1) / K_QG_ROWS, (long)N * out >= K_PAR_MIN / 16, 1, qg_groups,
                 &c);
    return atomic_load_explicit(&c.failed, memory_order_relaxed) ? -1 : 0;
}

const char *tlm_cpu_kernels(void) {
    int isa = k_isa();
    if (isa < K_ISA_AVX2) return "ref";
    if (isa < K_ISA_AVX512) return k_qgemm_avxvnni_ok() ? "avx2 avx-vnni" : "avx2";
    static _Thread_local char name[64];
    snprintf(name, sizeof name, "avx512 vnni%s%s%s", k_qgemm_bf16_ok() ? " bf16" : "",
             k_qgemm_amx_int8_ok() ? " amx-int8" : "", k_qgemm_amx_ok() ? " amx-bf16" : "");
    return name;
}
