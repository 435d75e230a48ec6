/* Backward pass parity: gradients of every parameter tensor against PyTorch autograd on the
 * reference model (fixtures from tests/reference/gen_fixtures.py). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "io/safetensors.h"
#include "model/ctx.h"
#include "tlm.h"

/* A mixture of experts' router losses of the last pass against the reference's. */
static void router_losses_check(t_parity *p) {
    const io_st_tensor *ta = io_st_find(&p->io, "router_aux"), *tz = io_st_find(&p->io, "router_z");
    double aux, z;
    tlm_train_ctx_router_losses(p->x, &aux, &z);
    if (!ta || !tz) {
        CHECK(aux == 0 && z == 0, "%s: router losses %g, %g of a dense model", p->name, aux, z);
        return;
    }
    float want_aux, want_z;
    CHECK_OK(io_st_read_f32(&p->io, ta, &want_aux, 1));
    CHECK_OK(io_st_read_f32(&p->io, tz, &want_z, 1));
    CHECK(fabs(aux - want_aux) <= 1e-5 * (1 + fabs(want_aux)),
          "%s: load-balancing loss %.7f vs %.7f", p->name, aux, (double)want_aux);
    CHECK(fabs(z - want_z) <= 1e-5 * (1 + fabs(want_z)), "%s: z-loss %.7f vs %.7f", p->name, z,
          (double)want_z);
}

static void grad_case(t_parity *p, int data_parallel) {
    tlm_model *m = p->m;
    const char *name = p->name;
    const io_st_file *io = &p->io;
    int B = p->B, T = p->T, pos = p->pos;
    tlm_train_ctx_set_data_parallel(p->x, data_parallel);
    size_t np = tlm_model_num_params(m);
    const int32_t *ids = p->ids, *tg = p->targets;
    float *grads = malloc(np * sizeof *grads), loss_want = p->loss_train, loss;
    /* Garbage in the buffer must be overwritten when not accumulating. */
    for (size_t i = 0; i < np; i++) grads[i] = 123.0f;
    CHECK_OK(tlm_train_ctx_forward_backward(p->x, ids, tg, B, T, pos, grads, 0, &loss));
    CHECK_NEAR(loss, loss_want, 1e-5);
    router_losses_check(p);
    int n;
    const tlm_tensor_info *ts = tlm_model_tensors(m, &n);
    double worst = 0;
    const char *worst_name = "";
    int bad = 0;
    for (int i = 0; i < n; i++) {
        char key[TLM_NAME_MAX + 8];
        snprintf(key, sizeof key, "grad.%s", ts[i].name);
        const io_st_tensor *t = io_st_find(io, key);
        CHECK(t != NULL, "%s: fixture lacks %s", name, key);
        if (!t) continue;
        float *want = malloc(ts[i].numel * sizeof *want);
        CHECK_OK(io_st_read_f32(io, t, want, ts[i].numel));
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
    CHECK_OK(tlm_train_ctx_forward_backward(p->x, ids, tg, B, T, pos, grads, 1, &loss));
    size_t off = 0;
    for (size_t i = 0; i < np; i++)
        off += fabsf(grads[i] - 2 * once[i]) > 1e-6f + 1e-5f * fabsf(once[i]);
    CHECK(off == 0, "%s: %zu elements are not twice the gradient after accumulating", name, off);
    free(once);
    free(grads);
}

/* bf16's significand has 8 bits: rounding an operand moves it by at most u = 2^-8 of itself, so
 * a product over rounded operands is off by at most about 2u of its size. A gradient is the end of
 * a chain of such products: forward through every layer (6: q|k|v, the attention's scores and
 * weighted sum, output, two FFN) and the head, then back again, so its error is at most 2u per
 * product on the chain, 2u * 2(6L + 1) (linear growth, the worst case; independent errors grow
 * slower). The loss, one forward, is held to 2u.
 * The floor (u/64) checks that the products really ran in bf16: fp32 stays below 1e-6. */
#define BF16_U (1.0 / 256)

static void grad_case_bf16(t_parity *p, int data_parallel) {
    tlm_model *m = p->m;
    tlm_train_ctx_set_data_parallel(p->x, data_parallel);
    CHECK_OK(tlm_train_ctx_set_precision(p->x, TLM_PRECISION_BF16));
    size_t np = tlm_model_num_params(m);
    float *grads = malloc(np * sizeof *grads), loss;
    CHECK_OK(tlm_train_ctx_forward_backward(p->x, p->ids, p->targets, p->B, p->T, p->pos, grads, 0,
                                            &loss));
    CHECK(fabs(loss - p->loss_train) <= 2 * BF16_U * fabs(p->loss_train), "%s bf16: loss %g vs %g",
          p->name, loss, p->loss_train);
    int n;
    const tlm_tensor_info *ts = tlm_model_tensors(m, &n);
    double *d2 = calloc((size_t)n, sizeof *d2), *w2 = calloc((size_t)n, sizeof *w2);
    double all_d = 0, all_w = 0;
    for (int i = 0; i < n; i++) {
        char key[TLM_NAME_MAX + 8];
        snprintf(key, sizeof key, "grad.%s", ts[i].name);
        const io_st_tensor *t = io_st_find(&p->io, key);
        CHECK(t != NULL, "%s: fixture lacks %s", p->name, key);
        if (!t) continue;
        float *want = malloc(ts[i].numel * sizeof *want);
        CHECK_OK(io_st_read_f32(&p->io, t, want, ts[i].numel));
        const float *got = grads + ts[i].offset;
        for (size_t j = 0; j < ts[i].numel; j++) {
            double e = (double)got[j] - want[j];
            d2[i] += e * e;
            w2[i] += (double)want[j] * want[j];
        }
        all_d += d2[i];
        all_w += w2[i];
        free(want);
    }
    /* Relative to the tensor's norm, or, for gradients that vanish by cancellation (a key bias
     * shifts every score of a query alike: softmax ignores it), to the norm a tensor of its size
     * has at the model's RMS gradient. */
    double rms = sqrt(all_w / (double)np), worst = 0;
    const char *worst_name = "";
    for (int i = 0; i < n; i++) {
        double scale = sqrt(w2[i]) + rms * sqrt((double)ts[i].numel) * 1e-2;
        double rel = sqrt(d2[i]) / scale;
        if (rel > worst) {
            worst = rel;
            worst_name = ts[i].name;
        }
    }
    printf("  %-28s bf16, %s: worst tensor error %.2fu (%s), all %.2fu\n", p->name,
           data_parallel ? "batch split" : "threads on each op", worst / BF16_U, worst_name,
           sqrt(all_d / all_w) / BF16_U);
    double bound = 2 * BF16_U * 2 * (6 * tlm_model_config(m)->n_layers + 1);
    CHECK(worst <= bound, "%s bf16: %s off by %.2fu > %.0fu", p->name, worst_name, worst / BF16_U,
          bound / BF16_U);
    CHECK(sqrt(all_d / all_w) >= BF16_U / 64, "%s bf16: error %g: the products did not round",
          p->name, sqrt(all_d / all_w));
    free(d2);
    free(w2);
    /* Accumulating (oneDNN's sum post-op) adds the same bf16 gradient a second time. */
    float *once = malloc(np * sizeof *once);
    memcpy(once, grads, np * sizeof *once);
    CHECK_OK(tlm_train_ctx_forward_backward(p->x, p->ids, p->targets, p->B, p->T, p->pos, grads, 1,
                                            &loss));
    size_t off = 0;
    for (size_t i = 0; i < np; i++)
        off += fabsf(grads[i] - 2 * once[i]) > 1e-6f + 1e-5f * fabsf(once[i]);
    CHECK(off == 0, "%s bf16: %zu elements are not twice the gradient after accumulating", p->name,
          off);
    free(once);
    CHECK_OK(tlm_train_ctx_set_precision(p->x, TLM_PRECISION_FP32));
    free(grads);
}

/* The evaluation loss (the blocks in one layer's buffers, the logits a slice of rows at a time)
 * equals the reference's. */
static void eval_loss_case(t_parity *p) {
    double l = NAN;
    tlm_train_ctx_set_data_parallel(p->x, 0);
    CHECK_OK(mdl_ctx_batch_loss(p->x, p->ids, p->targets, p->B, p->T, NULL, &l, NULL));
    CHECK(fabs(l - p->loss) <= 1e-5 + 1e-5 * fabs(p->loss), "%s: evaluation loss %.7f vs %.7f",
          p->name, l, (double)p->loss);
}

static void both_ways(t_parity *p, void *user) {
    int bf16 = *(int *)user;
    grad_case(p, 0);
    grad_case(p, 1);
    /* The head's logits and backward three rows at a time: the same gradients. */
    mdl_ctx_head_rows_max(3);
    grad_case(p, 0);
    if (!p->pos) eval_loss_case(p);
    mdl_ctx_head_rows_max(0);
    if (bf16) {
        grad_case_bf16(p, 0);
        grad_case_bf16(p, 1);
    }
}

int main(void) {
    tlm_threads_set(2);
    printf("gradient parity with PyTorch autograd:\n");
    int bf16 = tlm_bf16_supported();
    if (!bf16) {
        /* Without avx512_bf16 the precision is refused with a clear error, not emulated. */
        tlm_model *m = NULL;
        tlm_train_ctx *x = NULL;
        tlm_config c;
        CHECK_OK(tlm_config_from_json("{\"vocab_size\": 16, \"context_length\": 8, "
                                      "\"d_model\": 8, \"n_layers\": 1, \"n_heads\": 2}",
                                      &c));
        CHECK_OK(tlm_model_new(&c, &m));
        CHECK_OK(tlm_train_ctx_new(m, &x));
        CHECK(tlm_train_ctx_set_precision(x, TLM_PRECISION_BF16) == TLM_ERR_UNSUPPORTED,
              "bf16 accepted on a CPU without avx512_bf16");
        printf("  (no avx512_bf16 on this CPU: bf16 parity skipped, the precision is refused)\n");
        tlm_train_ctx_free(x);
        tlm_model_free(m);
    }
    int n = t_parity_each(both_ways, &bf16);
    CHECK(n >= 10, "only %d cases", n);
    return t_finish("test_backward");
}
