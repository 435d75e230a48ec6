/* AdamW, schedule and clipping against torch.optim.AdamW, the reference schedule and
 * torch.nn.utils.clip_grad_norm_ (fixture from tests/reference/gen_optim.py). */
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "io/safetensors.h"
#include "tlm.h"

#define DIR TLM_BUILD_DIR "/fixtures/optim"

static int read_named(io_st_file *f, const char *prefix, const tlm_tensor_info *t, float *dst) {
    char key[256];
    snprintf(key, sizeof key, "%s%s", prefix, t->name);
    const io_st_tensor *s = io_st_find(f, key);
    CHECK(s != NULL, "fixture lacks %s", key);
    return s && io_st_read_f32(f, s, dst, t->numel) == TLM_OK;
}

static void test_adamw(void) {
    tlm_config c;
    CHECK_OK(tlm_config_load(DIR "/config.json", &c));
    tlm_model *m = NULL;
    CHECK_OK(tlm_model_new(&c, &m));
    io_st_file f;
    tlm_status s = io_st_open(&f, DIR "/optim.safetensors");
    CHECK_OK(s);
    if (s || !m) return;
    int n, steps = atoi(io_st_meta(&f, "steps"));
    const tlm_tensor_info *ts = tlm_model_tensors(m, &n);
    size_t np = tlm_model_num_params(m);
    float *P = tlm_model_params(m), *G = malloc(np * 4), *want = malloc(np * 4);
    float lr_want[16], norm_want[16];
    CHECK_OK(io_st_read_f32(&f, io_st_find(&f, "lr"), lr_want, (size_t)steps));
    CHECK_OK(io_st_read_f32(&f, io_st_find(&f, "norm"), norm_want, (size_t)steps));
    for (int i = 0; i < n; i++) read_named(&f, "init.", &ts[i], P + ts[i].offset);
    tlm_adamw *opt = NULL;
    CHECK_OK(tlm_adamw_new(m, &opt));
    /* A twin model steps through the fused path (norm, then clipping folded into the update),
     * which must give the same bits as clipping in place. */
    tlm_model *m2 = NULL;
    CHECK_OK(tlm_model_new(&c, &m2));
    tlm_adamw *opt2 = NULL;
    CHECK_OK(tlm_adamw_new(m2, &opt2));
    float *P2 = tlm_model_params(m2), *G2 = malloc(np * 4);
    memcpy(P2, P, np * 4);
    int fused_same = 1;
    tlm_adamw_opts h = {atof(io_st_meta(&f, "beta1")), atof(io_st_meta(&f, "beta2")),
                        atof(io_st_meta(&f, "eps")), atof(io_st_meta(&f, "weight_decay"))};
    tlm_schedule sched = {atof(io_st_meta(&f, "max_lr")), atof(io_st_meta(&f, "min_lr")),
                          atol(io_st_meta(&f, "warmup")), atol(io_st_meta(&f, "total"))};
    double clip = atof(io_st_meta(&f, "clip"));
    double worst = 0;
    int clipped = 0;
    for (int k = 0; k < steps; k++) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "grad.%d.", k);
        for (int i = 0; i < n; i++) read_named(&f, prefix, &ts[i], G + ts[i].offset);
        memcpy(G2, G, np * 4);
        double norm = tlm_grad_clip(G, np, clip);
        clipped += norm > clip;
        CHECK(fabs(norm - norm_want[k]) <= 1e-5 * norm_want[k], "step %d norm %.8g vs %.8g", k,
              norm, norm_want[k]);
        double lr = tlm_schedule_lr(&sched, k);
        CHECK(fabs(lr - lr_want[k]) <= 1e-7 * lr_want[k], "step %d lr %.9g vs %.9g", k, lr,
              lr_want[k]);
        CHECK_OK(tlm_adamw_step(opt, m, G, lr, &h));
        double norm2 = tlm_grad_norm(G2, np);
        CHECK_OK(tlm_adamw_step_scaled(opt2, m2, G2, tlm_grad_clip_coef(norm2, clip), lr, &h));
        fused_same &= norm2 == norm && memcmp(P, P2, np * 4) == 0;
        snprintf(prefix, sizeof prefix, "after.%d.", k);
        for (int i = 0; i < n; i++) read_named(&f, prefix, &ts[i], want + ts[i].offset);
        for (size_t j = 0; j < np; j++) {
            /* float32 rounding of the last few operations: within 1e-6 relative, or 1e-7 absolute
             * for parameters near zero */
            double e = fabs((double)P[j] - want[j]) / (1e-7 + 1e-6 * fabs(want[j]));
            if (e > worst && getenv("TLM_DEBUG"))
                fprintf(stderr, "step %d elem %zu: %.9g vs %.9g\n", k, j, P[j], want[j]);
            worst = e > worst ? e : worst;
        }
    }
    printf("AdamW vs torch over %d steps (%d clipped): worst error / tolerance %.3g\n", steps,
           clipped, worst);
    CHECK(clipped >= 3 && clipped <= steps - 3, "fixture should mix clipped and unclipped steps");
    CHECK(worst <= 1.0, "AdamW parameters differ from torch: error / tolerance %.3g", worst);
    CHECK(tlm_adamw_steps(opt) == steps, "step count %ld", tlm_adamw_steps(opt));
    CHECK(fused_same, "clipping folded into AdamW differs from clipping in place");
    tlm_adamw_free(opt);
    tlm_adamw_free(opt2);
    tlm_model_free(m2);
    free(G2);
    free(G);
    free(want);
    io_st_close(&f);
    tlm_model_free(m);
}

/* The opaque optimizer's accessors: its range, the moments one step leaves (grad 1 everywhere:
 * m = 1 - beta1, v = 1 - beta2), the step count and restoring it. */
static void test_adamw_state(void) {
    tlm_config c;
    tlm_config_defaults(&c);
    c.vocab_size = 16;
    c.d_model = 16;
    c.n_heads = 2;
    c.n_layers = 1;
    c.context_length = 8;
    tlm_model *m = NULL;
    CHECK_OK(tlm_model_new(&c, &m));
    if (!m) return;
    size_t np = tlm_model_num_params(m);
    tlm_adamw *opt = NULL;
    CHECK_OK(tlm_adamw_new_range(m, 3, 10, &opt));
    if (!opt) {
        tlm_model_free(m);
        return;
    }
    size_t begin = 0, n = 0;
    tlm_adamw_range(opt, &begin, &n);
    CHECK(begin == 3 && n == 7, "range [%zu, +%zu)", begin, n);
    float *mom1 = NULL, *mom2 = NULL;
    tlm_adamw_moments(opt, &mom1, &mom2);
    CHECK(mom1 && mom2 && mom1[0] == 0 && mom2[6] == 0, "moments start at zero");
    float *g = malloc(np * sizeof *g);
    for (size_t i = 0; i < np; i++) g[i] = 1.0f;
    tlm_adamw_opts h = {0.9, 0.95, 1e-8, 0.0};
    CHECK(tlm_adamw_steps(opt) == 0, "no steps yet");
    CHECK_OK(tlm_adamw_step(opt, m, g, 1e-3, &h));
    CHECK(tlm_adamw_steps(opt) == 1, "one step: %ld", tlm_adamw_steps(opt));
    for (size_t i = 0; i < n; i++) {
        CHECK_NEAR(mom1[i], 0.1, 1e-7);
        CHECK_NEAR(mom2[i], 0.05, 1e-7);
    }
    /* params start at zero: only the range moved */
    const float *p = tlm_model_params(m);
    CHECK(p[2] == 0 && p[10] == 0 && p[3] != 0 && p[9] != 0, "only [3, 10) updated");
    tlm_adamw_set_steps(opt, 41);
    CHECK(tlm_adamw_steps(opt) == 41, "restored step count %ld", tlm_adamw_steps(opt));
    free(g);
    tlm_adamw_free(opt);
    tlm_model_free(m);
}

static void test_schedule(void) {
    tlm_schedule s = {1e-3, 1e-4, 100, 2000};
    CHECK_NEAR(tlm_schedule_lr(&s, 0), 1e-5, 1e-12);
    CHECK_NEAR(tlm_schedule_lr(&s, 49), 5e-4, 1e-12);
    CHECK_NEAR(tlm_schedule_lr(&s, 99), 1e-3, 1e-12);
    CHECK_NEAR(tlm_schedule_lr(&s, 100), 1e-3, 1e-12);
    /* Halfway through the decay the cosine is at its midpoint. */
    CHECK_NEAR(tlm_schedule_lr(&s, 100 + 1899 / 2.0), 5.5e-4, 1e-6);
    CHECK_NEAR(tlm_schedule_lr(&s, 1999), 1e-4, 1e-12);
    CHECK_NEAR(tlm_schedule_lr(&s, 5000), 1e-4, 1e-12);
    for (long k = 101; k < 2000; k++)
        if (tlm_schedule_lr(&s, k) > tlm_schedule_lr(&s, k - 1)) {
            CHECK(0, "lr increases at step %ld", k);
            break;
        }
    tlm_schedule none = {1e-3, 1e-3, 0, 10};
    CHECK_NEAR(tlm_schedule_lr(&none, 0), 1e-3, 1e-12);
}

static void test_clip(void) {
    float g[4] = {3, 4, 0, 0};
    double n = tlm_grad_clip(g, 4, 10.0);
    CHECK_NEAR(n, 5.0, 1e-12);
    CHECK(g[0] == 3 && g[1] == 4, "no clipping below the max");
    n = tlm_grad_clip(g, 4, 1.0);
    CHECK_NEAR(n, 5.0, 1e-12);
    CHECK_NEAR(g[0], 0.6, 1e-6);
    CHECK_NEAR(tlm_grad_norm(g, 4), 1.0, 1e-6);
    CHECK(tlm_grad_clip_coef(0.5, 1.0) == 1.0f, "no factor below the max");
    CHECK(tlm_grad_clip_coef(4.0, 0.0) == 1.0f, "max_norm 0 only measures");
    CHECK_NEAR(tlm_grad_clip_coef(4.0, 1.0), 1.0 / (4.0 + 1e-6), 1e-7);
}

/* PyTorch's hyperparameters are Python floats (doubles): a default written as 0.9f would be
 * 0.89999998, a different optimizer from the one `betas=(0.9, 0.95)` configures. */
static void test_defaults(void) {
    tlm_adamw_opts h;
    tlm_adamw_opts_defaults(&h);
    CHECK(h.beta1 == 0.9, "beta1 %.17g", h.beta1);
    CHECK(h.beta2 == 0.95, "beta2 %.17g", h.beta2);
    CHECK(h.eps == 1e-8, "eps %.17g", h.eps);
    CHECK(h.weight_decay == 0.1, "weight_decay %.17g", h.weight_decay);
    tlm_train_opts o;
    tlm_train_opts_defaults(&o);
    CHECK(o.adam.beta1 == 0.9 && o.adam.beta2 == 0.95 && o.adam.eps == 1e-8 &&
              o.adam.weight_decay == 0.1,
          "training defaults' AdamW: %.17g %.17g %.17g %.17g", o.adam.beta1, o.adam.beta2,
          o.adam.eps, o.adam.weight_decay);
    CHECK(o.lr == 1e-3 && o.min_lr == 1e-4 && o.clip == 1.0, "training defaults: %.17g %.17g %.17g",
          o.lr, o.min_lr, o.clip);
}

int main(void) {
    tlm_threads_set(2);
    test_defaults();
    test_schedule();
    test_clip();
    test_adamw();
    test_adamw_state();
    return t_finish("test_optim");
}
