#include <omp.h>

#include "core.h"

/* OpenBLAS exports this; declared here to avoid depending on its cblas.h variant. */
void openblas_set_num_threads(int n);

static int g_threads = 0;

void tlm_set_threads(int n) {
    if (n <= 0) n = omp_get_num_procs();
    g_threads = n;
    omp_set_num_threads(n);
    openblas_set_num_threads(n);
}

int tlm_get_threads(void) { return g_threads > 0 ? g_threads : omp_get_max_threads(); }
