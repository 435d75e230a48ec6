/* A/B switches for benchmark builds. Some choices of the kernels and the scheduler were measured
 * against their alternatives (bench/ scripts time both sides in one run); the alternatives stay
 * reachable in a build made for that, `cmake -DTLM_BENCH_KNOBS=ON`, where core_bench_knob() reads
 * the environment. The product's builds read none of them: the only settings a user has are the
 * documented ones (docs/environment.md). Tests switch such paths through the functions the
 * modules export for it, never through the environment. */
#ifndef TLM_CORE_KNOB_H
#define TLM_CORE_KNOB_H

#include <stdlib.h>

/* The environment's value of name in a benchmark build; NULL otherwise. */
static inline const char *core_bench_knob(const char *name) {
#ifdef TLM_BENCH_KNOBS
    return getenv(name);
#else
    (void)name;
    return NULL;
#endif
}

#endif
