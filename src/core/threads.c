#include <omp.h>
#include <pthread.h>

#include "core.h"

/* OpenBLAS exports these; declared here to avoid depending on its cblas.h variant. */
void openblas_set_num_threads(int n);
int openblas_get_num_threads(void);

static int g_threads = 0;

/* OpenBLAS's threaded sgemm splits a product among the workers it was told of and has them wait
 * for each other: when the OpenMP runtime delivers fewer (OMP_THREAD_LIMIT, OMP_DYNAMIC) it spins
 * forever. So its count never exceeds what a team can have, and teams are not resized. */
static int capped(int n) {
    int limit = omp_get_thread_limit();
    return limit > 0 && n > limit ? limit : n;
}

void tlm_threads_set(int n) {
    if (n <= 0) n = omp_get_num_procs();
    n = capped(n);
    g_threads = n;
    omp_set_dynamic(0);
    omp_set_num_threads(n);
    openblas_set_num_threads(n);
}

int tlm_threads_get(void) { return g_threads > 0 ? g_threads : omp_get_max_threads(); }

static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void check_once(void) {
    /* OpenBLAS took its count from OMP_NUM_THREADS or the core count at start-up. */
    int n = openblas_get_num_threads();
    if (capped(n) != n) openblas_set_num_threads(capped(n));
}

void core_threads_check(void) { pthread_once(&g_once, check_once); }

void core_threads_enter(void) {
    /* OpenBLAS sizes its teams by the calling thread's OpenMP thread count, which a thread that
     * never called omp_set_num_threads takes from OMP_NUM_THREADS or the core count. */
    int n = omp_get_max_threads();
    if (capped(n) != n) omp_set_num_threads(capped(n));
}
