/* qdot.h's functions for the kernels' callers: lookups of each type's kernels as traits.c chose
 * them, the row conversions with their references behind them, and the kernels' scratch. */
#include "qdot.h"

#include <limits.h>
#include <pthread.h>
#include <stdlib.h>

#include "core/dtype.h"
#include "qdot_simd.h"
#include "traits.h"

/* ---- activation rows ------------------------------------------------------------------------ */

k_act_kind k_act_of(tlm_dtype t) { return k_traits(t)->act; }

size_t k_act_row_bytes(tlm_dtype t, int n) {
    switch (k_act_of(t)) {
    case K_ACT_F32: return (size_t)n * sizeof(float);
    case K_ACT_BF16: return (size_t)n * sizeof(uint16_t);
    case K_ACT_Q8_0: return k_act_q8_0_nib_at(n) + (size_t)(n / 128) * K_ACT_NIB_BYTES;
    case K_ACT_Q8_K: return k_act_q8_k_nib_at(n) + (size_t)(n / 256) * 256;
    default: return 0;
    }
}

void k_act_quantize(k_act_kind kind, const float *x, void *xq, int n) {
    k_act_quantize_kernel *f = k_act_quantizer(kind);
    if (f) f(x, xq, n);
}

void k_act_quantize_ref(k_act_kind kind, const float *x, void *xq, int n) {
    if ((unsigned)kind < K_ACT_COUNT && k_kernels_ref.act_quantize[kind])
        k_kernels_ref.act_quantize[kind](x, xq, n);
}

void k_q8_0_blocks(const float *x, void *y, int n) { k_q8_0_blocks_kernel()(x, y, n); }

/* ---- dot products --------------------------------------------------------------------------- */

k_vdot_fn k_vdot_get(tlm_dtype t, int isa) {
    return isa < 0 || isa >= K_ISA_COUNT ? NULL : k_kernels_at(t, isa).vec_dot;
}

k_vdot_fn k_vdot(tlm_dtype t) { return k_traits(t)->vec_dot; }

k_vdot_rows_fn k_vdot_rows_get(tlm_dtype t, int isa) {
    return isa < 0 || isa >= K_ISA_COUNT ? NULL : k_kernels_at(t, isa).vec_dot_m8;
}

k_vdot_rows_fn k_vdot_rows(tlm_dtype t) { return k_traits(t)->vec_dot_m8; }
k_vdot_rows3_fn k_vdot_rows3(tlm_dtype t) { return k_traits(t)->vec_dot_x3m4; }
k_vdot_w4_fn k_vdot_w4(tlm_dtype t) { return k_traits(t)->vec_dot_x4; }

/* ---- row conversions ------------------------------------------------------------------------ */

void k_widen_row(tlm_dtype t, const void *src, float *dst, int n) {
    k_widen_kernel *f = k_traits(t)->widen;
    if (f)
        f(src, dst, n);
    else
        core_dtype_to_f32(t, src, dst, (size_t)n);
}

tlm_status k_quantize_rows(tlm_dtype t, const float *x, void *y, size_t rows, size_t cols,
                           const float *qw) {
    k_quantize_kernel *f = k_traits(t)->quantize;
    size_t rb = f && cols <= INT_MAX ? core_dtype_bytes(t, cols) : 0;
    if (!rb && (!f || cols > INT_MAX || rows)) return core_quantize_rows(t, x, y, rows, cols, qw);
    for (size_t r = 0; r < rows; r++) f(x + r * cols, (uint8_t *)y + r * rb, (int)cols, qw);
    return TLM_OK;
}

void k_narrow_row(tlm_dtype t, const float *src, void *dst, int n) {
    k_narrow_kernel *f = k_traits(t)->narrow;
    if (f)
        f(src, dst, n);
    else
        k_quantize_rows(t, src, dst, 1, (size_t)n, NULL);
}

/* ---- scratch -------------------------------------------------------------------------------- */

#define K_SCRATCH_SLOTS 2
typedef struct {
    void *p[K_SCRATCH_SLOTS];
    size_t n[K_SCRATCH_SLOTS];
} scratch_set;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static int scratch_ok;

static void scratch_free(void *v) {
    scratch_set *s = v;
    for (int i = 0; i < K_SCRATCH_SLOTS; i++) free(s->p[i]);
    free(s);
}

static void scratch_init(void) { scratch_ok = pthread_key_create(&scratch_key, scratch_free) == 0; }

void *k_scratch(int slot, size_t bytes) {
    pthread_once(&scratch_once, scratch_init);
    if (!scratch_ok || slot < 0 || slot >= K_SCRATCH_SLOTS) return NULL;
    scratch_set *s = pthread_getspecific(scratch_key);
    if (!s) {
        s = calloc(1, sizeof *s);
        if (!s || pthread_setspecific(scratch_key, s)) {
            free(s);
            return NULL;
        }
    }
    if (s->n[slot] < bytes) {
        /* 64-byte aligned so that vector loads of activation rows never split a line needlessly */
        size_t want = (bytes + 63) & ~(size_t)63;
        void *p = NULL;
        if (posix_memalign(&p, 64, want)) return NULL;
        free(s->p[slot]);
        s->p[slot] = p;
        s->n[slot] = want;
    }
    return s->p[slot];
}
