/* Subnormal floats cost nothing in tlm's computations: they are flushed to zero (results) and read
 * as zero (inputs), as TensorFlow and JAX run by default and PyTorch after
 * torch.set_flush_denormal(True). On x86 a product or sum with a subnormal operand or result takes
 * a microcode assist of about a hundred cycles, and a saturated softmax's tiny probabilities and
 * gradients fill whole matrices with them: an fp32 training step of the gpt2-124M-like bench config
 * ran 25-90x slower with them in its OpenBLAS products (bench/train_subnormal.sh). Values that
 * small are far below anything a model's outputs or a float32 gradient step can see. */
#include <omp.h>

#include "core.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
/* MXCSR's flush-to-zero (bit 15) and denormals-are-zero (bit 6) */
#define FLUSH_BITS 0x8040u
static unsigned get_mode(void) { return _mm_getcsr(); }
static void set_mode(unsigned m) { _mm_setcsr(m); }
#else
#define FLUSH_BITS 0u
static unsigned get_mode(void) { return 0; }
static void set_mode(unsigned m) { (void)m; }
#endif

/* The most OpenMP threads this thread's teams have had flushing set, so that each new worker of
 * its pool gets it once. Workers keep the mode for good: they run only what teams give them. */
static _Thread_local int g_primed;

void core_fp_flush_thread(void) { set_mode(get_mode() | FLUSH_BITS); }

void core_fp_flush_begin(core_fp_flush_scope *s) {
    s->saved = get_mode();
    if ((s->saved & FLUSH_BITS) != FLUSH_BITS) set_mode(s->saved | FLUSH_BITS);
    /* OpenBLAS's and oneDNN's products run on the same libgomp workers as tlm's own regions, and
     * a worker started before (by the caller's own OpenMP code) would not have the mode: set it
     * in every worker of this thread's team once, and again when the team grows. */
    int n = omp_get_max_threads();
    if (FLUSH_BITS && n > g_primed && !omp_in_parallel()) {
#pragma omp parallel num_threads(n)
        core_fp_flush_thread();
        g_primed = n;
    }
}

void core_fp_flush_end(core_fp_flush_scope *s) {
    if ((s->saved & FLUSH_BITS) != FLUSH_BITS) set_mode(get_mode() & ~FLUSH_BITS);
}
