/* Forward pass parity with the PyTorch reference (fixtures written by
 * tests/reference/gen_fixtures.py), plus forward-pass argument errors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "io/safetensors.h"
#include "tlm.h"

static void parity_case(t_parity *p, void *user) {
    (void)user;
    tlm_model *m = p->m;
    int B = p->B, T = p->T;
    size_t N = (size_t)B * T, V = (size_t)tlm_model_config(m)->vocab_size;
    float *want = malloc(N * V * sizeof *want);
    CHECK_OK(io_st_read_f32(&p->io, io_st_find(&p->io, "logits"), want, N * V));
    tlm_forward_opts o = {.targets = p->targets, .pos_offset = p->pos, .want_probs = 1};
    tlm_forward_out out;
    CHECK_OK(tlm_train_ctx_forward(p->x, p->ids, B, T, &o, &out));
    double err = 0, mag = 0, perr = 0;
    for (size_t i = 0; i < N * V; i++) {
        double e = fabs((double)out.logits[i] - want[i]);
        err = e > err ? e : err;
        mag = fabs(want[i]) > mag ? fabs(want[i]) : mag;
    }
    /* Probabilities are the softmax of the reference logits. */
    for (size_t r = 0; r < N; r++) {
        double mx = -1e30, s = 0;
        for (size_t j = 0; j < V; j++) mx = want[r * V + j] > mx ? want[r * V + j] : mx;
        for (size_t j = 0; j < V; j++) s += exp(want[r * V + j] - mx);
        for (size_t j = 0; j < V; j++) {
            double e = fabs(out.probs[r * V + j] - exp(want[r * V + j] - mx) / s);
            perr = e > perr ? e : perr;
        }
    }
    printf("  %-28s B=%d T=%-3d pos=%-3d max|logit| %6.2f  max err %.2e  loss %.6f vs %.6f\n",
           p->name, B, T, p->pos, mag, err, out.loss, p->loss);
    CHECK(err <= 1e-4, "%s: logits max abs error %.3g", p->name, err);
    CHECK(perr <= 1e-5, "%s: probabilities max abs error %.3g", p->name, perr);
    CHECK(mag >= 1.0, "%s: fixture logits too small (%g) to be a meaningful check", p->name, mag);
    CHECK_NEAR(out.loss, p->loss, 1e-5);
    free(want);
}

static void test_parity(void) {
    printf("forward parity with PyTorch:\n");
    int n = t_parity_each(parity_case, NULL);
    CHECK(n >= 10, "only %d parity cases", n);
}

/* tlm_imatrix_collect against the reference's forward pre-hooks on every nn.Linear (the
 * fixture's imatrix.NAME: each input column's squared activations summed over the B*T rows of a
 * pass from position 0): every matrix the reference has, q, k and v, gate and up sharing their
 * inputs, output.weight with output set. Cases of any architecture: names the reference gives a
 * matrix that tlm's schema has are all collected. */
static void imatrix_case(t_parity *p, void *user) {
    int *checked = user;
    tlm_imatrix *im = NULL;
    CHECK_OK(tlm_imatrix_new(&im));
    const float *lg = NULL;
    tlm_status s = tlm_imatrix_collect(im, p->x, p->ids, p->B, p->T, 1, &lg);
    int nt;
    const tlm_tensor_info *ts = tlm_model_tensors(p->m, &nt);
    int entries = 0, missing = 0;
    double worst = 0;
    size_t N = (size_t)p->B * p->T;
    for (int i = 0; !s && i < nt; i++) {
        char key[160];
        snprintf(key, sizeof key, "imatrix.%s", ts[i].name);
        const io_st_tensor *t = io_st_find(&p->io, key);
        if (!t) continue;
        size_t n = 0;
        const float *w = tlm_imatrix_find(im, ts[i].name, &n);
        if (!w) {
            missing++;
            continue;
        }
        float *want = malloc(sizeof(float) * n);
        CHECK_OK(io_st_read_f32(&p->io, t, want, n));
        for (size_t j = 0; j < n; j++) {
            double ref = want[j] / (double)N, e = fabs(w[j] - ref) / (fabs(ref) + 1e-6);
            worst = e > worst ? e : worst;
        }
        free(want);
        entries++;
    }
    if (s == TLM_ERR_UNSUPPORTED) { /* no matrix with llama.cpp's names: GPT-2 style */
        tlm_imatrix_free(im);
        return;
    }
    CHECK_OK(s);
    CHECK(lg != NULL, "%s: no logits", p->name);
    CHECK(missing == 0, "%s: %d matrices the reference has are not in the imatrix", p->name,
          missing);
    CHECK(entries == tlm_imatrix_entries(im), "%s: %d entries, %d checked", p->name,
          tlm_imatrix_entries(im), entries);
    CHECK(worst <= 2e-4, "%s: imatrix means off by %.3g (relative)", p->name, worst);
    printf("  %-28s %2d imatrix entries, max rel err %.2e\n", p->name, entries, worst);
    *checked += entries > 0;
    tlm_imatrix_free(im);
}

static void test_imatrix(void) {
    printf("imatrix statistics against PyTorch:\n");
    int checked = 0;
    t_parity_each(imatrix_case, &checked);
    CHECK(checked >= 5, "only %d cases checked", checked);
}

static void test_errors(void) {
    tlm_config c;
    tlm_config_defaults(&c);
    c.vocab_size = 10;
    c.context_length = 8;
    c.d_model = 16;
    c.n_layers = 1;
    c.n_heads = 2;
    tlm_model *m = t_model(&c, 1, TLM_INIT_XAVIER);
    tlm_train_ctx *x = NULL;
    CHECK_OK(tlm_train_ctx_new(m, &x));
    int32_t ids[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5, 6};
    tlm_forward_out out;
    CHECK(tlm_train_ctx_forward(x, ids, 1, 9, NULL, &out) == TLM_ERR_ARG,
          "T > context is an error");
    CHECK(strstr(tlm_last_error(), "context_length") != NULL, "%s", tlm_last_error());
    tlm_forward_opts o = {.pos_offset = 5};
    CHECK(tlm_train_ctx_forward(x, ids, 1, 4, &o, &out) == TLM_ERR_RANGE, "offset past context");
    int32_t bad[2] = {3, 10};
    CHECK(tlm_train_ctx_forward(x, bad, 1, 2, NULL, &out) == TLM_ERR_RANGE, "id >= vocab");
    CHECK(strstr(tlm_last_error(), "token id 10") != NULL, "%s", tlm_last_error());
    bad[1] = -1;
    CHECK(tlm_train_ctx_forward(x, bad, 1, 2, NULL, &out) == TLM_ERR_RANGE, "negative id");
    CHECK(tlm_train_ctx_forward(x, ids, 0, 2, NULL, &out) == TLM_ERR_ARG, "empty batch");
    /* Batch rows are independent: row 1 of a B=2 batch equals the same row alone. */
    CHECK_OK(tlm_train_ctx_forward(x, ids, 2, 8, NULL, &out));
    float row1[8 * 10];
    memcpy(row1, out.logits + 80, sizeof row1);
    CHECK_OK(tlm_train_ctx_forward(x, ids + 8, 1, 8, NULL, &out));
    double e = 0;
    for (int i = 0; i < 80; i++) e = fmax(e, fabs(row1[i] - out.logits[i]));
    CHECK(e < 1e-5, "batch row independence %g", e);
    /* Causality: changing a later token leaves earlier logits unchanged. */
    float first[4 * 10];
    memcpy(first, out.logits, sizeof first);
    int32_t alt[8];
    memcpy(alt, ids + 8, sizeof alt);
    alt[5] = (alt[5] + 1) % 10;
    CHECK_OK(tlm_train_ctx_forward(x, alt, 1, 8, NULL, &out));
    e = 0;
    for (int i = 0; i < 40; i++) e = fmax(e, fabs(first[i] - out.logits[i]));
    CHECK(e == 0, "future token changed past logits by %g", e);
    tlm_train_ctx_free(x);
    tlm_model_free(m);
}

int main(void) {
    tlm_threads_set(2);
    test_errors();
    test_parity();
    test_imatrix();
    return t_finish("test_forward");
}
