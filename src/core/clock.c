#include <time.h>

#include "core.h"

static double seconds(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double core_now_s(void) { return seconds(CLOCK_MONOTONIC); }

double core_cpu_s(void) { return seconds(CLOCK_PROCESS_CPUTIME_ID); }
