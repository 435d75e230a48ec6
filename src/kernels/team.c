/* Work shared by stealing: each thread of the team starts on an equal share of the units (as
 * schedule(static) would give it, in one contiguous run), front to back a chunk at a time; a
 * thread done with its own takes chunks from the back of the others'. The two vCPUs of this
 * project's machines run the same share at speeds up to 25% apart, and which is slower changes
 * from run to run, so with fixed shares the faster thread waited at every barrier (decode: about
 * 50 per token; a prompt's products: about 10 per layer). Fixed chunks handed out in turn
 * (schedule(dynamic)) lose each thread's run of neighbouring units (0.6x on 110M decode).
 *
 * Where the calling thread asked for it (k_team_pool: decode steps) the team is this file's own
 * pool of threads, not an OpenMP region: a libgomp region costs about 3.1 us from fork to join on a
 * 2-vCPU virtual machine even with its threads spinning, an `if (0)` region still 1.3-1.5 us, and a
 * token of a small model has products of a few microseconds each. The pool's fork and join are one
 * store and one load of a cache line each way (0.6 us round trip between two vCPUs). Its threads
 * spin a while for the next job, then sleep on a futex, as libgomp's do (GOMP_SPINCOUNT and
 * OMP_WAIT_POLICY set how long, read once). Calls from inside an OpenMP region, or while another
 * thread of the process holds the pool, take an OpenMP team. */
#define _GNU_SOURCE
#include <limits.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#define HAVE_POOL 1
#else
#define HAVE_POOL 0
#endif

#include "core/core.h"
#include "kernels.h"

#define K_STEAL_MAX 64

/* A share: the first unit not yet taken (low 32 bits) and one past the last (high 32 bits). */
typedef struct {
    _Alignas(64) _Atomic uint64_t fb;
} share;

/* Takes up to `chunk` units from the front of the share (back: from its back) into [*a, *b);
 * 0 when none are left. Relaxed order: a claim only has to be exclusive, and the results are
 * published by the join (the region's closing barrier, or the pool's count of threads done). */
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

/* Thread `id`'s part of a job of `shares` shares: its own share, then the others'. A team
 * smaller than the shares (OMP_THREAD_LIMIT, OMP_DYNAMIC) leaves shares without an
 * owner: the threads there steal them whole. */
static void run_share(share *sh, int shares, int id, long chunk, k_units_fn fn, void *ctx) {
    long a, b;
    if (id < shares)
        while (claim(&sh[id], chunk, 0, &a, &b)) fn(ctx, a, b);
    for (int k = 1; k <= shares; k++) {
        share *v = &sh[(id + k) % shares];
        while (claim(v, chunk, 1, &a, &b)) fn(ctx, a, b);
    }
}

static _Thread_local int g_team_id = -1; /* a pool thread's place in the team */
static _Thread_local int g_use_pool;     /* k_team_pool */

int k_team_pool(int on) {
    int was = g_use_pool;
    g_use_pool = on;
    return was;
}

/* Inside a job of the pool too (its threads, and the caller while it runs its share): work there
 * stays on its thread. */
int k_team_pooled(void) { return g_use_pool || g_team_id >= 0; }

int k_team_thread(void) { return g_team_id >= 0 ? g_team_id : omp_get_thread_num(); }

/* The versioned loops' cap (kernels.h), beside the other settings of how loops run. */
_Atomic int k_vec_limit = K_ISA_COUNT;

void k_vec_cap(int isa) { k_vec_limit = isa; }

#if HAVE_POOL
/* A pool thread's slot: its job and the word it waits on, one cache line, so that a fork costs
 * one transfer of it per thread (about 0.3 us between two vCPUs), and a job wakes only
 * the threads it needs (a team that shrinks leaves the others asleep, not spinning at each job).
 * The job is written by the calling thread while the slot's thread does not read it (before
 * bumping `gen`, after the thread counted itself off `pending`). */
typedef struct {
    _Alignas(64) _Atomic uint32_t gen; /* bumped once per job; the futex word */
    _Atomic int sleeping;              /* the thread is asleep (or about to be) on gen */
    int shares;
    k_units_fn fn;
    void *ctx;
    share *sh;
    long chunk;
} slot;

static struct {
    slot slots[K_STEAL_MAX];               /* slots[i] for pool thread i (1..threads) */
    _Alignas(64) _Atomic uint32_t pending; /* threads of the current job still working */
    _Atomic int master_sleeps;
    _Alignas(64) atomic_flag busy; /* held by the thread running a job */
    int threads;                   /* pool threads started (ids 1..threads) */
    int spin;                      /* rounds of waiting before sleeping */
    int off; /* libgomp spins too long (pool_init), or a thread could not be started: OpenMP */
} g_pool = {.busy = ATOMIC_FLAG_INIT};

static long futex(_Atomic uint32_t *w, int op, uint32_t v) {
    return syscall(SYS_futex, (uint32_t *)w, op, v, NULL, NULL, 0);
}

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* A fork()ed child has only the thread that forked: it starts a pool of its own. */
static void pool_forget(void) {
    g_pool.threads = 0;
    atomic_flag_clear(&g_pool.busy);
}

/* libgomp's spin before it sleeps, in rounds, as it reads its environment; -1: for ever. */
static long gomp_spin(int *set) {
    const char *p = getenv("OMP_WAIT_POLICY"), *c = getenv("GOMP_SPINCOUNT");
    *set = 1;
    if (c && *c) {
        if (!strncasecmp(c, "infinit", 7)) return -1;
        char *end;
        long n = strtol(c, &end, 10), mul = 1;
        if (*end == 'k' || *end == 'K') mul = 1000;
        if (*end == 'M') mul = 1000000;
        if (*end == 'G' || *end == 'T') return -1;
        if (end != c && n >= 0) return n > LONG_MAX / mul ? -1 : n * mul;
    }
    if (p && !strcasecmp(p, "active")) return -1;
    if (p && !strcasecmp(p, "passive")) return 0;
    *set = 0;
    return 300000;
}

/* The pool waits as long as libgomp was told to (a user's GOMP_SPINCOUNT or OMP_WAIT_POLICY),
 * else as long as the CLI tells libgomp (TLM_SPINCOUNT in main.c: 3000 rounds, about 60 us
 * here). Where libgomp spins longer than its default (300000 rounds, about 6 ms) the pool stays
 * off: an OpenMP thread left spinning by the prompt's pass would take a core from the pool's
 * for the whole decode (OMP_WAIT_POLICY=active, 110M decode at 2 threads: 487 -> 146 tok/s). */
static void pool_init(void) {
    int set;
    long l = gomp_spin(&set);
    g_pool.off = l < 0 || l > 300000;
    g_pool.spin = !set ? 3000 : l < 0 || l > 300000 ? 0 : (int)l;
    pthread_atfork(NULL, NULL, pool_forget);
}

/* Waits until *w differs from v; returns the new value. */
static uint32_t wait_change(_Atomic uint32_t *w, uint32_t v, _Atomic int *sleeping) {
    uint32_t now;
    for (int i = 0; i < g_pool.spin; i++) {
        if ((now = atomic_load_explicit(w, memory_order_acquire)) != v) return now;
        relax();
    }
    for (;;) {
        atomic_fetch_add(sleeping, 1);
        if ((now = atomic_load(w)) == v) futex(w, FUTEX_WAIT_PRIVATE, v);
        atomic_fetch_sub(sleeping, 1);
        if ((now = atomic_load_explicit(w, memory_order_acquire)) != v) return now;
    }
}

static void *pool_thread(void *arg) {
    g_team_id = (int)(uintptr_t)arg;
    core_fp_flush_thread();
    slot *me = &g_pool.slots[g_team_id];
    uint32_t seen = 0;
    for (;;) {
        seen = wait_change(&me->gen, seen, &me->sleeping);
        run_share(me->sh, me->shares, g_team_id, me->chunk, me->fn, me->ctx);
        if (atomic_fetch_sub(&g_pool.pending, 1) == 1 && atomic_load(&g_pool.master_sleeps))
            futex(&g_pool.pending, FUTEX_WAKE_PRIVATE, INT_MAX);
    }
    return NULL;
}

static pthread_once_t g_pool_once = PTHREAD_ONCE_INIT;

/* Runs the job on the pool with `shares` threads, the caller as thread 0; 0 where the pool is
 * held by another thread or cannot grow. */
static int pool_run(share *sh, int shares, long chunk, k_units_fn fn, void *ctx) {
    if (atomic_flag_test_and_set_explicit(&g_pool.busy, memory_order_acquire)) return 0;
    pthread_once(&g_pool_once, pool_init);
    while (!g_pool.off && g_pool.threads < shares - 1) {
        pthread_attr_t at;
        pthread_t th;
        int ok = !pthread_attr_init(&at);
        ok = ok && !pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        slot *sl = &g_pool.slots[g_pool.threads + 1];
        atomic_store(&sl->gen, 0);
        atomic_store(&sl->sleeping, 0);
        ok = ok && !pthread_create(&th, &at, pool_thread, (void *)(uintptr_t)(g_pool.threads + 1));
        pthread_attr_destroy(&at);
        if (ok)
            g_pool.threads++;
        else
            g_pool.off = 1;
    }
    if (g_pool.off) {
        atomic_flag_clear_explicit(&g_pool.busy, memory_order_release);
        return 0;
    }
    atomic_store_explicit(&g_pool.pending, (uint32_t)(shares - 1), memory_order_relaxed);
    for (int i = 1; i < shares; i++) {
        slot *sl = &g_pool.slots[i];
        sl->shares = shares, sl->fn = fn, sl->ctx = ctx, sl->sh = sh, sl->chunk = chunk;
        atomic_fetch_add(&sl->gen, 1);
        if (atomic_load(&sl->sleeping)) futex(&sl->gen, FUTEX_WAKE_PRIVATE, 1);
    }
    int me = g_team_id;
    g_team_id = 0;
    run_share(sh, shares, 0, chunk, fn, ctx);
    g_team_id = me;
    uint32_t left = 1;
    for (int i = 0; i < g_pool.spin && left; i++) {
        left = atomic_load_explicit(&g_pool.pending, memory_order_acquire);
        if (left) relax();
    }
    while (left) {
        atomic_store(&g_pool.master_sleeps, 1);
        if ((left = atomic_load(&g_pool.pending)) != 0)
            futex(&g_pool.pending, FUTEX_WAIT_PRIVATE, left);
        atomic_store(&g_pool.master_sleeps, 0);
        left = atomic_load_explicit(&g_pool.pending, memory_order_acquire);
    }
    atomic_flag_clear_explicit(&g_pool.busy, memory_order_release);
    return 1;
}
#endif

void k_team_units(long units, int par, long chunk, k_units_fn fn, void *ctx) {
    if (units <= 0) return;
    /* Inside a parallel region (a data-parallel replica's thread) a region would be a team of
     * one and still cost a futex wake at its end, as k_fork says: the calling thread runs all. */
    int shares = par && !omp_in_parallel() ? omp_get_max_threads() : 1;
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
#if HAVE_POOL
    if (g_use_pool && pool_run(sh, shares, chunk, fn, ctx)) return;
#endif
#pragma omp parallel
    run_share(sh, shares, omp_get_thread_num(), chunk, fn, ctx);
}
