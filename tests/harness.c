/* program_invocation_short_name names the test's directory. */
#define _GNU_SOURCE
#include "harness.h"

#include "core/core.h"
#include "core/dtype.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int t_passed = 0, t_failed = 0;

static char t_dir[4096];

/* Before main: into TLM_BUILD_DIR/test-output/<program>/, so that the relative paths a test writes
 * land there from whatever directory it was started (ctest's build/, or the repository by hand),
 * never in the source tree. The directory is not emptied: ctest runs some programs twice. */
__attribute__((constructor)) static void t_enter_own_dir(void) {
    int n = snprintf(t_dir, sizeof t_dir, "%s/test-output", TLM_BUILD_DIR);
    int ok = n > 0 && (size_t)n < sizeof t_dir && (mkdir(t_dir, 0777) == 0 || errno == EEXIST);
    n = snprintf(t_dir, sizeof t_dir, "%s/test-output/%s", TLM_BUILD_DIR,
                 program_invocation_short_name);
    ok = ok && n > 0 && (size_t)n < sizeof t_dir && (mkdir(t_dir, 0777) == 0 || errno == EEXIST);
    if (!ok || chdir(t_dir) != 0) {
        fprintf(stderr, "FAIL: cannot work in %s: %s\n", t_dir, strerror(errno));
        exit(1);
    }
}

const char *t_out_dir(void) { return t_dir; }

tlm_model *t_model(const tlm_config *c, uint64_t seed, tlm_init_scheme scheme) {
    tlm_model *m = NULL;
    CHECK_OK(tlm_model_new(c, &m));
    if (m) CHECK_OK(tlm_model_init(m, seed, scheme));
    return m;
}

float *t_flat(const tlm_model *m) {
    int n;
    const tlm_tensor_info *ts = tlm_model_tensors(m, &n);
    float *flat = malloc(tlm_model_num_params(m) * sizeof(float));
    for (int i = 0; flat && i < n; i++) {
        const tlm_weight *w = tlm_model_weight(m, i);
        for (int64_t r = 0; r < w->rows; r++)
            core_dtype_to_f32(w->dtype, (const char *)w->data + (size_t)r * w->row_bytes,
                              flat + ts[i].offset + (size_t)r * w->cols, (size_t)w->cols);
    }
    return flat;
}

static tlm_train_ctx *g_ring[4];
static int g_next;

static void forward_cleanup(void) {
    for (int i = 0; i < 4; i++) {
        tlm_train_ctx_free(g_ring[i]);
        g_ring[i] = NULL;
    }
}

tlm_status t_forward(const tlm_model *m, const int32_t *ids, int B, int T,
                     const tlm_forward_opts *o, tlm_forward_out *out) {
    int k = g_next++ & 3;
    tlm_train_ctx_free(g_ring[k]);
    g_ring[k] = NULL;
    tlm_status s = tlm_train_ctx_new(m, &g_ring[k]);
    return s ? s : tlm_train_ctx_forward(g_ring[k], ids, B, T, o, out);
}

int t_finish(const char *name) {
    forward_cleanup();
    printf("%s: %d passed, %d failed\n", name, t_passed, t_failed);
    return t_failed == 0 && t_passed > 0 ? 0 : 1;
}

static const char *shared_data_path(void) {
    static char buf[4096];
    const char *env = getenv("TLM_SHARED_DATA");
    if (env) return env;
    snprintf(buf, sizeof buf, "%s/../shared/data", TLM_SOURCE_DIR);
    return buf;
}

const char *t_shared_data(void) {
    const char *p = shared_data_path();
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode) ? p : NULL;
}

const char *t_require_shared_data(void) {
    const char *d = t_shared_data();
    CHECK(d != NULL, "the shared test data is missing: no directory %s", shared_data_path());
    return d;
}

const char *t_path(const char *dir, const char *name) {
    static char bufs[8][4096];
    static int i = 0;
    char *b = bufs[i++ & 7];
    snprintf(b, 4096, "%s/%s", dir, name);
    return b;
}

int t_write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    size_t w = fwrite(p, 1, n, f);
    return fclose(f) == 0 && w == n;
}

cJSON *t_read_json(const char *path) {
    char *txt;
    size_t n;
    if (core_read_file(path, &txt, &n) != TLM_OK) {
        CHECK(0, "cannot read %s: %s", path, tlm_last_error());
        return NULL;
    }
    cJSON *j = cJSON_ParseWithLength(txt, n);
    free(txt);
    CHECK(j != NULL, "%s is not JSON", path);
    return j;
}

#define T_FIXTURES TLM_BUILD_DIR "/fixtures/parity"

static int parity_open(const char *name, t_parity *p) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", T_FIXTURES, name);
    memset(p, 0, sizeof *p);
    p->name = name;
    tlm_config c;
    if (tlm_config_load(t_path(dir, "config.json"), &c) || tlm_model_new(&c, &p->m) ||
        tlm_model_read_safetensors(p->m, t_path(dir, "model.safetensors")) ||
        io_st_open(&p->io, t_path(dir, "io.safetensors")) || tlm_train_ctx_new(p->m, &p->x)) {
        CHECK(0, "%s: %s", name, tlm_last_error());
        tlm_model_free(p->m);
        return 0;
    }
    p->B = atoi(io_st_meta(&p->io, "B"));
    p->T = atoi(io_st_meta(&p->io, "T"));
    p->pos = atoi(io_st_meta(&p->io, "pos_offset"));
    size_t N = (size_t)p->B * p->T;
    p->ids = malloc(N * sizeof *p->ids);
    p->targets = malloc(N * sizeof *p->targets);
    CHECK_OK(io_st_read_i32(&p->io, io_st_find(&p->io, "ids"), p->ids, N));
    CHECK_OK(io_st_read_i32(&p->io, io_st_find(&p->io, "targets"), p->targets, N));
    CHECK_OK(io_st_read_f32(&p->io, io_st_find(&p->io, "loss"), &p->loss, 1));
    const io_st_tensor *lt = io_st_find(&p->io, "loss_train");
    p->loss_train = p->loss;
    if (lt) CHECK_OK(io_st_read_f32(&p->io, lt, &p->loss_train, 1));
    return 1;
}

static void parity_close(t_parity *p) {
    tlm_train_ctx_free(p->x);
    free(p->ids);
    free(p->targets);
    io_st_close(&p->io);
    tlm_model_free(p->m);
}

int t_parity_each(void (*fn)(t_parity *p, void *user), void *user) {
    FILE *f = fopen(T_FIXTURES "/cases.txt", "r");
    CHECK(f != NULL, "missing %s (run tests/reference/gen_fixtures.py)", T_FIXTURES "/cases.txt");
    if (!f) return 0;
    char line[256];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = 0;
        if (!line[0]) continue;
        t_parity p;
        if (!parity_open(line, &p)) continue;
        fn(&p, user);
        parity_close(&p);
        n++;
    }
    fclose(f);
    return n;
}

static uint64_t t_rng = 0x9E3779B97F4A7C15ull;
void t_seed(uint64_t seed) { t_rng = seed; }
uint32_t t_rnd(void) {
    t_rng ^= t_rng << 13;
    t_rng ^= t_rng >> 7;
    t_rng ^= t_rng << 17;
    return (uint32_t)(t_rng >> 16);
}
float t_unif(void) { return (float)(t_rnd() & 0xFFFFFF) / 16777216.0f * 2.0f - 1.0f; }
