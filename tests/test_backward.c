/* Backward pass parity: gradients of every parameter tensor against PyTorch autograd on the
 * reference model (fixtures from tests/reference/gen_fixtures.py). */
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "io/safetensors.h"
#include "tlm.h"

static void grad_case(t_parity *p, int data_parallel) {
    tlm_model *m = p->m;
    const char *name = p->name;
    const st_file *io = &p->io;
    int B = p->B, T = p->T, pos = p->pos;
    tlm_train_ctx_set_data_parallel(p->x, data_parallel);
    size_t np = tlm_model_num_params(m);
    const int32_t *ids = p->ids, *tg = p->targets;
    float *grads = malloc(np * sizeof *grads), loss_want = p->loss, loss;
    /* Garbage in the buffer must be overwritten when not accumulating. */
    for (size_t i = 0; i < np; i++) grads[i] = 123.0f;
    CHECK_OK(tlm_forward_backward(p->x, ids, tg, B, T, pos, grads, 0, &loss));
    CHECK_NEAR(loss, loss_want, 1e-5);
    int n;
    const tlm_tensor_info *ts = tlm_model_tensors(m, &n);
    double worst = 0;
    const char *worst_name = "";
    int bad = 0;
    for (int i = 0; i < n; i++) {
        char key[TLM_NAME_MAX + 8];
        snprintf(key, sizeof key, "grad.%s", ts[i].name);
        const st_tensor *t = st_find(io, key);
        CHECK(t != NULL, "%s: fixture lacks %s", name, key);
        if (!t) continue;
        float *want = malloc(ts[i].numel * sizeof *want);
        CHECK_OK(st_read_f32(io, t, want, ts[i].numel));
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
    /* Accumulation adds a second copy of the same gradient to every element (the internal
     * buffers of a batch split hold the last call's gradients: they too must be written over). */
    float *once = malloc(np * sizeof *once);
    memcpy(once, grads, np * sizeof *once);
    CHECK_OK(tlm_forward_backward(p->x, ids, tg, B, T, pos, grads, 1, &loss));
    size_t off = 0;
    for (size_t i = 0; i < np; i++)
        off += fabsf(grads[i] - 2 * once[i]) > 1e-6f + 1e-5f * fabsf(once[i]);
    CHECK(off == 0, "%s: %zu elements are not twice the gradient after accumulating", name, off);
    free(once);
    free(grads);
}

static void both_ways(t_parity *p, void *user) {
    (void)user;
    grad_case(p, 0);
    grad_case(p, 1);
}

int main(void) {
    tlm_set_threads(2);
    printf("gradient parity with PyTorch autograd:\n");
    int n = t_parity_each(both_ways, NULL);
    CHECK(n >= 10, "only %d cases", n);
    return t_finish("test_backward");
}
