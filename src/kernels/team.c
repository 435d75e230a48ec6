/* Work shared by stealing: each thread of the team starts on an equal share of the units (as
 * schedule(static) would give it, in one contiguous run), front to back a chunk at a time; a
 * thread done with its own takes chunks from the back of the others'. The two vCPUs of this
 * project's machines run the same share at speeds up to 25% apart, and which is slower changes
 * from run to run, so with fixed shares the faster thread waited at every barrier (decode: about
 * 50 per token; a prompt's products: about 10 per layer). Fixed chunks handed out in turn
 * (schedule(dynamic)) lose each thread's run of neighbouring units (0.6x on 110M decode). */
#include <omp.h>
#include <stdatomic.h>
#include <stdint.h>

#include "kernels.h"

#define K_STEAL_MAX 64

/* A share: the first unit not yet taken (low 32 bits) and one past the last (high 32 bits). */
typedef struct {
    _Alignas(64) _Atomic uint64_t fb;
} share;

/* Takes up to `chunk` units from the front of the share (back: from its back) into [*a, *b);
 * 0 when none are left. Relaxed order: a claim only has to be exclusive, and the results are
 * published by the region's closing barrier. */
static int claim(share *sh, long chunk, int back, long *a, long *b) {
    uint64_t old = atomic_load_explicit(&sh->fb, memory_order_relaxed);
    for (;;) {
        uint32_t f = (uint32_t)old, e = (uint32_t)(old >> 32);
        if (f >= e) return 0;
        uint32_t k = e - f < (uint64_t)chunk ? e - f : (uint32_t)chunk;
        uint64_t nw =
            back ? (uint64_t)f | (uint64_t)(e - k) << 32 : (uint64_t)(f + k) | (uint64_t)e << 32;
        if (atomic_compare_exchange_weak_explicit(&sh->fb, &old, nw, memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *a = back ? e - k : f;
            *b = back ? e : f + k;
            return 1;
        }
    }
}

void k_team_units(long units, int par, long chunk, k_units_fn fn, void *ctx) {
    if (units <= 0) return;
    int shares = par ? omp_get_max_threads() : 1;
    if (shares < 2) {
        fn(ctx, 0, units);
        return;
    }
    /* Past these a share's bounds no longer fit its word, or its array the stack: fixed shares,
     * a unit at a time. No machine here comes near either. */
    if (shares > K_STEAL_MAX || units >= (1L << 31)) {
#pragma omp parallel for schedule(static)
        for (long u = 0; u < units; u++) fn(ctx, u, u + 1);
        return;
    }
    if (chunk <= 0) chunk = units / shares / 16 > 1 ? units / shares / 16 : 1;
    share sh[K_STEAL_MAX];
    for (int i = 0; i < shares; i++)
        atomic_init(&sh[i].fb, (uint64_t)(units * i / shares) | (uint64_t)(units * (i + 1) / shares)
                                                                    << 32);
#pragma omp parallel
    {
        /* A team smaller than asked (nested regions, OMP_THREAD_LIMIT) leaves shares without
         * an owner: the threads there steal them whole. */
        int id = omp_get_thread_num();
        long a, b;
        if (id < shares)
            while (claim(&sh[id], chunk, 0, &a, &b)) fn(ctx, a, b);
        for (int k = 1; k <= shares; k++) {
            share *v = &sh[(id + k) % shares];
            while (claim(v, chunk, 1, &a, &b)) fn(ctx, a, b);
        }
    }
}
