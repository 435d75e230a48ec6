/* Minimal test harness: CHECK macros count passes and failures; t_finish() prints the totals and
 * returns the exit status. */
#ifndef TLM_TEST_HARNESS_H
#define TLM_TEST_HARNESS_H

#include <math.h>
#include <stdio.h>

extern int t_passed, t_failed;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (cond) {                                                                                \
            t_passed++;                                                                            \
        } else {                                                                                   \
            t_failed++;                                                                            \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                        \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
        }                                                                                          \
    } while (0)

/* Checks a tlm call returned TLM_OK, printing tlm_last_error() otherwise. */
#define CHECK_OK(expr)                                                                             \
    do {                                                                                           \
        tlm_status s_ = (expr);                                                                    \
        CHECK(s_ == TLM_OK, "status %d: %s", (int)s_, tlm_last_error());                           \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                                      \
    CHECK(fabs((double)(a) - (double)(b)) <= (tol), "%.9g vs %.9g (tol %g)", (double)(a),          \
          (double)(b), (double)(tol))

/* Prints "N passed, N failed" and returns the process exit status. */
int t_finish(const char *name);
/* Directory of the shared test data (../shared/data next to the repository), or NULL. */
const char *t_shared_data(void);
/* Joins a directory and a name into a static buffer (rotating among a few). */
const char *t_path(const char *dir, const char *name);

#endif
