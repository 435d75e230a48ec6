/* Backward pass parity: gradients of every parameter tensor against PyTorch autograd on the
 * reference model (fixtures from tests/reference/gen_fixtures.py). */
#include <stdlib.h>
#include <string.h>

#include "formats/safetensors.h"
#include "harness.h"
#include "tlm.h"

#define FIXTURES TLM_BUILD_DIR "/fixtures/parity"

static void grad_case(const char *name, int data_parallel) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", FIXTURES, name);
    tlm_config c;
    CHECK_OK(tlm_config_load(t_path(dir, "config.json"), &c));
    tlm_model *m = NULL;
    CHECK_OK(tlm_model_create(&c, &m));
    if (!m) return;
    CHECK_OK(tlm_model_load_safetensors(m, t_path(dir, "model.safetensors")));
    tlm_model_set_data_parallel(m, data_parallel);
    st_file io;
    if (st_open(&io, t_path(dir, "io.safetensors")) != TLM_OK) {
        CHECK(0, "%s", tlm_last_error());
        tlm_model_free(m);
        return;
    }
    int B = atoi(st_meta(&io, "B")), T = atoi(st_meta(&io, "T"));
    int pos = atoi(st_meta(&io, "pos_offset"));
    size_t N = (size_t)B * T, np = tlm_model_num_params(m);
    int32_t *ids = malloc(N * sizeof *ids), *tg = malloc(N * sizeof *tg);
    float *grads = malloc(np * sizeof *grads), loss_want, loss;
    CHECK_OK(st_read_i32(&io, st_find(&io, "ids"), ids, N));
    CHECK_OK(st_read_i32(&io, st_find(&io, "targets"), tg, N));
    CHECK_OK(st_read_f32(&io, st_find(&io, "loss"), &loss_want, 1));
    /* Garbage in the buffer must be overwritten when not accumulating. */
    for (size_t i = 0; i < np; i++) grads[i] = 123.0f;
    CHECK_OK(tlm_forward_backward(m, ids, tg, B, T, pos, grads, 0, &loss));
    CHECK_NEAR(loss, loss_want, 1e-5);
    int n;
    const tlm_tensor_info *ts = tlm_model_tensors(m, &n);
    double worst = 0;
    const char *worst_name = "";
    int bad = 0;
    for (int i = 0; i < n; i++) {
        char key[TLM_NAME_MAX + 8];
        snprintf(key, sizeof key, "grad.%s", ts[i].name);
        const st_tensor *t = st_find(&io, key);
        CHECK(t != NULL, "%s: fixture lacks %s", name, key);
        if (!t) continue;
        float *want = malloc(ts[i].numel * sizeof *want);
        CHECK_OK(st_read_f32(&io, t, want, ts[i].numel));
        const float *got = grads + ts[i].offset;
        for (size_t j = 0; j < ts[i].numel; j++) {
            double e = fabs((double)got[j] - want[j]), tol = 1e-5 + 1e-3 * fabs(want[j]);
            if (e > tol) {
                if (bad < 5)
                    fprintf(stderr, "  %s %s[%zu]: %g vs %g\n", name, ts[i].name, j, got[j],
                            want[j]);
                bad++;
            }
            double rel = e / (1e-5 + 1e-3 * fabs(want[j]));
            if (rel > worst) {
                worst = rel;
                worst_name = ts[i].name;
            }
        }
        free(want);
    }
    printf("  %-28s %s worst error / tolerance %.3f (%s)\n", name,
           data_parallel ? "batch split over threads" : "threads on each operation", worst,
           worst_name);
    CHECK(bad == 0, "%s: %d gradient elements outside |a-b| <= 1e-5 + 1e-3|b|", name, bad);
    /* Accumulation adds a second copy of the same gradient. */
    float probe = grads[ts[0].offset];
    CHECK_OK(tlm_forward_backward(m, ids, tg, B, T, pos, grads, 1, &loss));
    CHECK_NEAR(grads[ts[0].offset], 2 * probe, 1e-6 + 1e-5 * fabs(probe));
    free(ids);
    free(tg);
    free(grads);
    st_close(&io);
    tlm_model_free(m);
}

int main(void) {
    tlm_set_threads(2);
    FILE *f = fopen(FIXTURES "/cases.txt", "r");
    CHECK(f != NULL, "missing %s", FIXTURES "/cases.txt");
    if (!f) return t_finish("test_backward");
    char line[256];
    int n = 0;
    printf("gradient parity with PyTorch autograd:\n");
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = 0;
        if (!line[0]) continue;
        grad_case(line, 0);
        grad_case(line, 1);
        n++;
    }
    fclose(f);
    CHECK(n >= 10, "only %d cases", n);
    return t_finish("test_backward");
}
