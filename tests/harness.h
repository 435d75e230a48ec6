/* Minimal test harness: CHECK macros count passes and failures; t_finish() prints the totals and
 * returns the exit status. Every test runs in a directory of its own under the build directory
 * (t_out_dir), whatever directory it was started from. */
#ifndef TLM_TEST_HARNESS_H
#define TLM_TEST_HARNESS_H

#include <math.h>
#include <stdio.h>
#include <string.h>

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

/* Checks that tlm_last_error() contains needle: an error names what went wrong. */
#define CHECK_ERROR_HAS(needle)                                                                    \
    CHECK(strstr(tlm_last_error(), (needle)) != NULL, "error '%s' lacks '%s'", tlm_last_error(),   \
          (needle))

#define CHECK_NEAR(a, b, tol)                                                                      \
    CHECK(fabs((double)(a) - (double)(b)) <= (tol), "%.9g vs %.9g (tol %g)", (double)(a),          \
          (double)(b), (double)(tol))

/* Test data: xorshift64, one stream per process, seeded with t_seed (default 0x9E3779B97F4A7C15).
 * t_rnd: 32 random bits; t_unif: uniform in [-1, 1). */
#include <stdint.h>
void t_seed(uint64_t seed);
uint32_t t_rnd(void);
float t_unif(void);

/* Prints "N passed, N failed" and returns the process exit status. */
int t_finish(const char *name);
/* Directory of the shared test data ($TLM_SHARED_DATA, else ../shared/data next to the
 * repository), or NULL when it is not there. */
const char *t_shared_data(void);
/* The same, as a requirement: when the directory is missing, a failed check naming the path
 * (CI and every machine set up by scripts/setup.sh have it), and NULL. */
const char *t_require_shared_data(void);
/* Joins a directory and a name into a static buffer (rotating among a few). */
const char *t_path(const char *dir, const char *name);
/* Writes n bytes to path; 1 on success. */
int t_write_file(const char *path, const void *p, size_t n);
/* The JSON document in path (cJSON_Delete it), or NULL and a failed check naming the file. */
struct cJSON;
struct cJSON *t_read_json(const char *path);
/* The test's own directory, TLM_BUILD_DIR/test-output/<program>: the harness makes it the working
 * directory before main, so relative paths are written there. This absolute path is for the
 * commands a test runs from elsewhere (node in tests/node). */
const char *t_out_dir(void);

/* A PyTorch parity case (tests/reference/gen_fixtures.py): the model with the reference's weights,
 * the batch, and the open io.safetensors holding the expected outputs. */
#include "io/safetensors.h"
#include "tlm.h"

/* tlm_train_ctx_forward through a context of the harness's own: the logits stay valid for the next
 * three calls (so two models' outputs can be compared). t_finish frees the contexts. */
tlm_status t_forward(const tlm_model *m, const int32_t *ids, int B, int T,
                     const tlm_forward_opts *o, tlm_forward_out *out);

/* A model of config c with weights from tlm_model_init(seed, scheme); NULL (a failed check) when
 * it cannot be made. */
tlm_model *t_model(const tlm_config *c, uint64_t seed, tlm_init_scheme scheme);

/* Every weight of m widened to F32 in the flat layout (malloc'd), whether the model is writable,
 * mapped or holds other types. */
float *t_flat(const tlm_model *m);

typedef struct {
    const char *name;
    tlm_model *m;
    tlm_train_ctx *x; /* a context over m */
    io_st_file io;
    int B, T, pos;
    int32_t *ids, *targets; /* [B*T] */
    float loss;             /* the reference's mean loss */
    float loss_train;       /* what training minimises: loss plus a mixture's router losses */
} t_parity;

/* Calls fn for every case listed in the fixtures' cases.txt; returns how many ran. A case that
 * cannot be opened is a failed check and is skipped. */
int t_parity_each(void (*fn)(t_parity *p, void *user), void *user);

#endif
