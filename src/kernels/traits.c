/* Each type's kernels chosen for this CPU (traits.h): the instruction set the kernels run at
 * (qdot.h's k_isa and its caps), the types' records, and the choice from the instruction sets'
 * tables, made once and again when a cap changes. */
#include "traits.h"

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "core/dtype.h"
#include "core/knob.h"
#include "gemm_traits.h"
#include "qdot_simd.h"

/* What each computed type is, apart from its kernels. The row lengths past which one sequence's
 * rows go one at a time (single_row_from: 0 for never) were measured per type (matvec.c says
 * how): four rows at a time won for the block types at every length on Intel's CPUs. */
static const struct {
    k_act_kind act;
    int single_row_from, single_row_from_amd;
} types[TLM_DTYPE_COUNT] = {
    [TLM_DTYPE_F32] = {K_ACT_F32, 0, 0},      [TLM_DTYPE_F16] = {K_ACT_F32, 513, 513},
    [TLM_DTYPE_BF16] = {K_ACT_BF16, 0, 0},    [TLM_DTYPE_Q8_0] = {K_ACT_Q8_0, 0, 512},
    [TLM_DTYPE_Q4_0] = {K_ACT_Q8_0, 0, 2048}, [TLM_DTYPE_Q4_1] = {K_ACT_Q8_0, 0, 0},
    [TLM_DTYPE_Q5_0] = {K_ACT_Q8_0, 0, 0},    [TLM_DTYPE_Q5_1] = {K_ACT_Q8_0, 0, 0},
    [TLM_DTYPE_IQ4_NL] = {K_ACT_Q8_0, 0, 0},  [TLM_DTYPE_Q2_K] = {K_ACT_Q8_K, 0, 0},
    [TLM_DTYPE_Q3_K] = {K_ACT_Q8_K, 0, 0},    [TLM_DTYPE_Q4_K] = {K_ACT_Q8_K, 0, 0},
    [TLM_DTYPE_Q5_K] = {K_ACT_Q8_K, 0, 0},    [TLM_DTYPE_Q6_K] = {K_ACT_Q8_K, 0, 2048},
    [TLM_DTYPE_IQ4_XS] = {K_ACT_Q8_K, 0, 0},
};

/* ---- the instruction set ------------------------------------------------------------------- */

static int isa_level = -1, isa_avxvnni;
static pthread_once_t isa_once = PTHREAD_ONCE_INIT;

/* TLM_ISA=avx2 runs as a CPU with AVX2 alone would (Haswell to Zen 3), =avxvnni as one with AVX2
 * and AVX-VNNI (Intel's client cores since Alder Lake), =ref the plain C references: a benchmark
 * build's comparisons (bench/quant/run.sh); the product reads no such variable. */
static void isa_detect(void) {
    int lvl = k_cpu()->isa;
    const char *cap = core_bench_knob("TLM_ISA");
    int vnni = k_cpu()->avxvnni;
    if (cap && !strcmp(cap, "ref")) lvl = K_ISA_REF;
    if (cap && !strcmp(cap, "avx2")) vnni = 0;
    if (cap && (!strcmp(cap, "avx2") || !strcmp(cap, "avxvnni")) && lvl > K_ISA_AVX2)
        lvl = K_ISA_AVX2;
    isa_level = lvl;
    isa_avxvnni = vnni && lvl >= K_ISA_AVX2;
}

int k_isa(void) {
    pthread_once(&isa_once, isa_detect);
    return isa_level;
}

static _Atomic int avxvnni_cap = 1; /* k_avxvnni_cap */

int k_avxvnni(void) {
    pthread_once(&isa_once, isa_detect);
    return isa_avxvnni && atomic_load_explicit(&avxvnni_cap, memory_order_relaxed);
}

int k_cpu_amd(void) { return k_cpu()->amd; }

static int isa_cap = K_ISA_COUNT; /* k_isa_cap */

/* The instruction set the kernels are chosen at: the CPU's (TLM_ISA capped), under k_isa_cap. */
static int isa_top(void) { return k_isa() < isa_cap ? k_isa() : isa_cap; }

/* ---- choosing ------------------------------------------------------------------------------ */

/* Fields of `over` that are set replace those of `k`. */
static void overlay(k_type_kernels *k, const k_type_kernels *over) {
    if (over->vec_dot) k->vec_dot = over->vec_dot;
    if (over->vec_dot_m8) k->vec_dot_m8 = over->vec_dot_m8;
    if (over->vec_dot_x3m4) k->vec_dot_x3m4 = over->vec_dot_x3m4;
    if (over->vec_dot_x4) k->vec_dot_x4 = over->vec_dot_x4;
    if (over->widen) k->widen = over->widen;
    if (over->narrow) k->narrow = over->narrow;
    if (over->quantize) k->quantize = over->quantize;
}

/* The level's table as this CPU runs it (none past the CPU's level): AVX2's with AVX-VNNI's
 * kernels over it where k_avxvnni(), AVX-512's with AVX512_BF16's where the CPU has it. */
static const k_isa_kernels *level_tables(int isa, const k_isa_kernels **over) {
    *over = NULL;
    if (isa == K_ISA_REF) return &k_kernels_ref;
#if defined(__x86_64__) || defined(__i386__)
    if (isa > k_cpu()->isa) return NULL;
    if (isa == K_ISA_AVX2) {
        if (k_avxvnni()) *over = &k_kernels_avxvnni;
        return &k_kernels_avx2;
    }
    if (isa == K_ISA_AVX512) {
        if (k_cpu()->avx512bf16) *over = &k_kernels_avx512bf16;
        return &k_kernels_avx512;
    }
#endif
    return NULL;
}

k_type_kernels k_kernels_at(tlm_dtype t, int isa) {
    k_type_kernels k = {0};
    const k_isa_kernels *over, *base = level_tables(isa, &over);
    if ((unsigned)t >= TLM_DTYPE_COUNT || !base) return k;
    k = base->type[t];
    if (over) overlay(&k, &over->type[t]);
    return k;
}

k_act_quantize_kernel *k_act_quantizer_at(k_act_kind kind, int isa) {
    const k_isa_kernels *over;
    for (int i = isa < K_ISA_COUNT ? isa : K_ISA_COUNT - 1; i > K_ISA_REF; i--) {
        const k_isa_kernels *base = level_tables(i, &over);
        if (base && base->act_quantize[kind]) return base->act_quantize[kind];
    }
    return k_kernels_ref.act_quantize[kind];
}

/* The record with the dot products chosen at `top` and the conversions at `conv` (traits.h). */
static void choose(tlm_dtype t, int top, int conv, k_type_traits *o) {
    memset(o, 0, sizeof *o);
    o->type = t;
    if ((unsigned)t >= TLM_DTYPE_COUNT || types[t].act == K_ACT_NONE) return;
    o->gemm = k_gemm_ops_of(t);
    o->act = types[t].act;
    o->single_row_from = types[t].single_row_from ? types[t].single_row_from : INT_MAX;
    o->single_row_from_amd = types[t].single_row_from_amd ? types[t].single_row_from_amd : INT_MAX;
    o->vec_dot = k_kernels_ref.type[t].vec_dot;
    for (int isa = top; isa > K_ISA_REF; isa--) {
        k_type_kernels k = k_kernels_at(t, isa);
        if (k.vec_dot) {
            o->vec_dot = k.vec_dot;
            break;
        }
    }
    for (int isa = top; isa > K_ISA_REF; isa--) {
        k_type_kernels k = k_kernels_at(t, isa);
        o->vec_dot_m8 = k.vec_dot_m8;
        if (k.vec_dot_m8 || k.vec_dot) break;
    }
    if (top >= K_ISA_AVX512) o->vec_dot_x3m4 = k_kernels_at(t, K_ISA_AVX512).vec_dot_x3m4;
    if (top >= K_ISA_AVX2) o->vec_dot_x4 = k_kernels_at(t, top).vec_dot_x4;
    for (int isa = conv; isa > K_ISA_REF; isa--) {
        k_type_kernels k = k_kernels_at(t, isa);
        if (!o->widen) o->widen = k.widen;
        if (!o->narrow) o->narrow = k.narrow;
        if (!o->quantize) o->quantize = k.quantize;
    }
}

static k_type_traits traits[TLM_DTYPE_COUNT], no_type;
static k_act_quantize_kernel *act_quantizer[K_ACT_COUNT], *q8_0_blocks;
static pthread_once_t fill_once = PTHREAD_ONCE_INIT;

static void fill(void) {
    int top = isa_top();
    for (int t = 0; t < TLM_DTYPE_COUNT; t++) choose((tlm_dtype)t, top, k_isa(), &traits[t]);
    for (int k = 0; k < K_ACT_COUNT; k++) act_quantizer[k] = k_act_quantizer_at((k_act_kind)k, top);
    q8_0_blocks = k_kernels_ref.q8_0_blocks;
    for (int isa = k_isa(); isa > K_ISA_REF; isa--) {
        const k_isa_kernels *over, *base = level_tables(isa, &over);
        if (base && base->q8_0_blocks) {
            q8_0_blocks = base->q8_0_blocks;
            break;
        }
    }
}

const k_type_traits *k_traits(tlm_dtype t) {
    pthread_once(&fill_once, fill);
    return (unsigned)t < TLM_DTYPE_COUNT ? &traits[t] : &no_type;
}

k_type_traits k_traits_at(tlm_dtype t, int isa) {
    k_type_traits o;
    choose(t, isa, isa, &o);
    return o;
}

k_act_quantize_kernel *k_act_quantizer(k_act_kind kind) {
    pthread_once(&fill_once, fill);
    return (unsigned)kind < K_ACT_COUNT ? act_quantizer[kind] : NULL;
}

k_act_quantize_kernel *k_q8_0_blocks_kernel(void) {
    pthread_once(&fill_once, fill);
    return q8_0_blocks;
}

void k_isa_cap(int isa) {
    pthread_once(&fill_once, fill);
    isa_cap = isa;
    fill();
}

void k_avxvnni_cap(int on) {
    pthread_once(&fill_once, fill);
    atomic_store(&avxvnni_cap, on);
    fill();
}
