/* The loops compiled once per instruction set (K_VERSIONS, src/kernels/kernels.h) give the same
 * results at every level this CPU runs: the build's baseline, AVX2 and AVX-512 (k_vec_cap picks
 * the level). The versions differ only in vector width and fused multiply-adds, so their results
 * agree to rounding, and exactly where the operations are exact (bf16 rounding, ReLU, products of
 * one multiplication). A whole training step and an AdamW step are compared the same way. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "kernels/kernels.h"
#include "tlm.h"

static int levels[K_ISA_COUNT], n_levels;

/* Largest |a - b| / (|b| + floor) over n values; NaN where one is NaN and the other is not. */
static double rel_diff(const float *a, const float *b, size_t n, double floor) {
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) != isnan(b[i])) return NAN;
        if (isnan(a[i])) continue;
        double d = fabs((double)a[i] - b[i]) / (fabs((double)b[i]) + floor);
        worst = d > worst ? d : worst;
    }
    return worst;
}

static float *rnd(size_t n, float scale) {
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = scale * t_unif();
    return x;
}

static float *copy(const float *x, size_t n) {
    float *y = malloc(n * sizeof *y);
    memcpy(y, x, n * sizeof *y);
    return y;
}

/* Each elementwise kernel at every level against the top level; N elements, enough for a team. */
static void check_elementwise(void) {
    enum { N = 40000 };
    float *x = rnd(N, 6.0f), *z = rnd(N, 2.0f), *ref = malloc(N * sizeof *ref),
          *refy = malloc(N * sizeof *refy), *refg = malloc(N * sizeof *refg),
          *y = malloc(N * sizeof *y);
    x[7] = NAN;
    x[8] = 0.0f;
    x[9] = -100.0f;
    x[10] = 100.0f;
    for (int act = K_ACT_GELU; act <= K_ACT_SILU; act++) {
        for (int l = n_levels - 1; l >= 0; l--) {
            k_vec_cap(levels[l]);
            float *g = copy(x, N);
            k_act_fwd(y, x, N, (k_act)act);
            if (l == n_levels - 1) memcpy(ref, y, N * sizeof *y);
            /* activations are O(1): differences near zero are measured against 1 */
            double e = rel_diff(y, ref, N, 1.0);
            CHECK(act == K_ACT_RELU ? e == 0.0 : e < 2e-5, "act %d forward at level %d: %g", act,
                  levels[l], e);
            k_act_fwd_grad(y, g, N, (k_act)act);
            if (l == n_levels - 1) {
                memcpy(refy, y, N * sizeof *y);
                memcpy(refg, g, N * sizeof *g);
            }
            e = rel_diff(y, refy, N, 1.0);
            double eg = rel_diff(g, refg, N, 1.0);
            CHECK(act == K_ACT_RELU ? e == 0.0 && eg == 0.0 : e < 2e-5 && eg < 2e-5,
                  "act %d forward with gradient at level %d: %g, %g", act, levels[l], e, eg);
            free(g);
        }
    }
    x[7] = 1.0f;
    /* one operation each: the same bits at every level */
    for (int l = 0; l < n_levels; l++) {
        k_vec_cap(levels[l]);
        k_add(y, x, z, N);
        int ok = 1;
        for (int i = 0; i < N; i++) ok &= y[i] == x[i] + z[i];
        k_mul(y, x, z, N);
        for (int i = 0; i < N; i++) ok &= y[i] == x[i] * z[i];
        memcpy(y, z, N * sizeof *y);
        k_acc(y, x, N);
        for (int i = 0; i < N; i++) ok &= y[i] == z[i] + x[i];
        CHECK(ok, "add, mul, acc at level %d", levels[l]);
        /* bf16 rounding: the plain versions round as vcvtne2ps2bf16 does */
        uint16_t *h = malloc(N * sizeof *h);
        float s[4] = {NAN, INFINITY, 1e-40f, -0.0f};
        memcpy(y, x, N * sizeof *y);
        memcpy(y + 100, s, sizeof s);
        k_f32_to_bf16(h, y, N);
        int same = 1;
        for (int i = 0; i < N; i++) {
            uint32_t u;
            memcpy(&u, &y[i], 4);
            uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
            r = (u & 0x7f800000u) ? r : (u >> 16) & 0x8000u;
            r = (u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : r;
            same &= h[i] == (uint16_t)r;
        }
        CHECK(same, "bf16 rounding at level %d", levels[l]);
        free(h);
        /* dropout: the mask is the same function of (key, index) */
        k_dropout(y, x, N, 0.25f, 12345);
        ok = 1;
        for (int i = 0; i < N; i++) ok &= y[i] == x[i] * k_dropout_keep(12345, (uint64_t)i, 0.25f);
        CHECK(ok, "dropout at level %d", levels[l]);
    }
    free(x);
    free(z);
    free(ref);
    free(refy);
    free(refg);
    free(y);
}

/* Row kernels (norms, SwiGLU, RoPE, cross-entropy) at every level against the top level. */
static void check_rows(void) {
    enum { R = 96, D = 384, FF = 200, V = 500 };
    float *x = rnd((size_t)R * D, 3.0f), *g = rnd(D, 1.0f), *bias = rnd(D, 0.5f);
    float *dy = rnd((size_t)R * D, 1.0f), *a = rnd((size_t)R * 2 * FF, 4.0f);
    float *dsw = rnd((size_t)R * FF, 1.0f), *logits = rnd((size_t)R * V, 8.0f);
    int *tg = malloc(R * sizeof *tg), pos[R];
    for (int r = 0; r < R; r++) {
        tg[r] = r % 7 == 3 ? -1 : (int)(t_rnd() % V);
        pos[r] = (r * 37) % 64;
    }
    float cs[64 * 32], sn[64 * 32];
    for (int p = 0; p < 64; p++)
        for (int i = 0; i < 32; i++) {
            cs[p * 32 + i] = cosf(p * powf(10000.0f, -i / 32.0f));
            sn[p * 32 + i] = sinf(p * powf(10000.0f, -i / 32.0f));
        }
    /* outputs per kernel: [0] at the top level, [1] at the level checked */
    enum { OUTS = 12 };
    size_t sizes[OUTS] = {(size_t)R * D,
                          R,
                          (size_t)R * D,
                          R,
                          R,
                          (size_t)R * D,
                          D,
                          D,
                          (size_t)R * FF,
                          (size_t)R * 2 * FF,
                          (size_t)R * D,
                          (size_t)R * V};
    const char *names[OUTS] = {
        "rmsnorm",        "rmsnorm rstd",     "layernorm",     "mean",
        "layernorm rstd", "norm backward dx", "gain gradient", "bias gradient",
        "swiglu",         "swiglu backward",  "rope",          "softmax"};
    float *out[2][OUTS];
    double loss[2][2];
    for (int k = 0; k < OUTS; k++)
        for (int w = 0; w < 2; w++) out[w][k] = calloc(sizes[k], sizeof(float));
    for (int l = n_levels - 1; l >= 0; l--) {
        k_vec_cap(levels[l]);
        float **o = out[l == n_levels - 1 ? 0 : 1];
        double *ls = loss[l == n_levels - 1 ? 0 : 1];
        int cnt;
        k_rmsnorm_fwd(o[0], o[1], x, g, R, D, 1e-5f);
        k_layernorm_fwd(o[2], o[3], o[4], x, g, bias, R, D, 1e-5f);
        k_layernorm_bwd(o[5], o[6], o[7], dy, x, g, o[3], o[4], R, D, 0);
        /* the RMS norm's backward added to the layer norm's: both checked through one output */
        float *dx = calloc((size_t)R * D, sizeof *dx);
        k_rmsnorm_bwd(dx, o[6], dy, x, g, o[1], R, D, 1);
        k_acc(o[5], dx, (size_t)R * D);
        free(dx);
        k_swiglu_rows_fwd(o[8], a, R, FF);
        k_swiglu_rows_bwd(o[9], dsw, a, R, FF);
        memcpy(o[10], x, (size_t)R * D * sizeof(float));
        k_rope_fwd(o[10], D, R, pos, D / 64, 64, cs, sn, 1);
        k_rope_fwd(o[10], D, R, pos, D / 64, 64, cs, sn, 0);
        k_rope_bwd(o[10], D, R, pos, 2, 64, cs, sn, 0);
        ls[0] = k_cross_entropy_fwd(logits, tg, o[11], R, V, &cnt);
        float *lg = copy(logits, (size_t)R * V);
        ls[1] = k_cross_entropy_fwd_bwd(lg, tg, R, V, 0, &cnt);
        /* the gradient is softmax - onehot, over the count: added to the probabilities checked */
        k_acc(o[11], lg, (size_t)R * V);
        free(lg);
        if (l == n_levels - 1) continue;
        for (int k = 0; k < OUTS; k++) {
            /* the gain and bias gradients are sums over the R rows */
            double e = rel_diff(out[1][k], out[0][k], sizes[k], 1e-2);
            CHECK(e < (k == 6 || k == 7 ? 1e-4 : 2e-5), "%s at level %d: %g", names[k], levels[l],
                  e);
        }
        CHECK_NEAR(loss[1][0], loss[0][0], 1e-5 * fabs(loss[0][0]));
        CHECK_NEAR(loss[1][1], loss[0][1], 1e-5 * fabs(loss[0][1]));
    }
    for (int k = 0; k < OUTS; k++)
        for (int w = 0; w < 2; w++) free(out[w][k]);
    free(x);
    free(g);
    free(bias);
    free(dy);
    free(a);
    free(dsw);
    free(logits);
    free(tg);
}

/* Training attention, with and without dropout, at every level against the top level. */
static void check_attention(void) {
    enum { B = 2, T = 70, H = 4, KVH = 2, HD = 16 };
    int qw = H * HD, kw = KVH * HD, ld = qw + 2 * kw;
    size_t nq = (size_t)B * T * ld, no = (size_t)B * T * qw, np = (size_t)B * H * T * T;
    float *qkv = rnd(nq, 2.0f), *dout = rnd(no, 1.0f);
    float *scratch =
        malloc(k_attention_scratch_floats(T, 0.1f, 0.0f, omp_get_max_threads()) * sizeof(float));
    for (int drop = 0; drop < 2; drop++) {
        float p = drop ? 0.1f : 0.0f, *o[2] = {0}, *pr[2] = {0}, *d[2] = {0};
        for (int l = n_levels - 1; l >= 0; l--) {
            int w = l == n_levels - 1 ? 0 : 1;
            k_vec_cap(levels[l]);
            o[w] = malloc(no * sizeof(float));
            pr[w] = malloc(np * sizeof(float));
            d[w] = malloc(nq * sizeof(float));
            memset(d[w], 0, nq * sizeof(float));
            k_attention_fwd(o[w], pr[w], qkv, qkv + qw, qkv + qw + kw, ld, ld, B, T, H, KVH, HD,
                            1.0f / sqrtf((float)HD), 0.0f, NULL, p, 99, scratch);
            k_attention_bwd(d[w], d[w] + qw, d[w] + qw + kw, dout, qkv, qkv + qw, qkv + qw + kw, ld,
                            ld, pr[w], B, T, H, KVH, HD, 1.0f / sqrtf((float)HD), 0.0f, NULL, p, 99,
                            scratch);
            if (w == 0) continue;
            double eo = rel_diff(o[1], o[0], no, 1e-2), ep = rel_diff(pr[1], pr[0], np, 1e-3);
            double ed = rel_diff(d[1], d[0], nq, 1e-2);
            CHECK(eo < 2e-5 && ep < 2e-5 && ed < 1e-4,
                  "attention (dropout %g) at level %d: out %g, probs %g, grads %g", p, levels[l],
                  eo, ep, ed);
            free(o[1]);
            free(pr[1]);
            free(d[1]);
        }
        free(o[0]);
        free(pr[0]);
        free(d[0]);
    }
    free(qkv);
    free(dout);
    free(scratch);
}

/* A training step (forward and backward, then clipping and AdamW) of two small models at every
 * level against the top level: the embedding, norms, activations, attention, RoPE, loss and
 * optimizer loops. The optimizer takes the top level's gradient at every level: where a gradient
 * is near AdamW's eps, the step magnifies the gradient's rounding differences. */
static void check_step(int modern) {
    tlm_config c;
    tlm_config_defaults(&c);
    c.vocab_size = 300;
    c.context_length = 48;
    c.d_model = 64;
    c.n_layers = 2;
    c.n_heads = 4;
    if (!modern) {
        c.norm = TLM_NORM_LAYERNORM;
        c.ffn = TLM_FFN_GELU;
        c.position = TLM_POS_LEARNED;
        c.bias = 1;
        c.tie_embeddings = 0;
    }
    enum { B = 3, T = 40 };
    int32_t ids[B * T], tg[B * T];
    for (int i = 0; i < B * T; i++) {
        ids[i] = (int32_t)(t_rnd() % 300);
        tg[i] = (int32_t)(t_rnd() % 300);
    }
    const char *name = modern ? "rmsnorm/swiglu/rope" : "layernorm/gelu/learned";
    float *grads[2] = {0}, *params[2] = {0}, loss[2] = {0};
    double norm[2] = {0};
    for (int l = n_levels - 1; l >= 0; l--) {
        int w = l == n_levels - 1 ? 0 : 1;
        k_vec_cap(levels[l]);
        tlm_model *m;
        tlm_train_ctx *x;
        tlm_adamw *opt;
        tlm_adamw_opts h;
        tlm_adamw_opts_defaults(&h);
        CHECK_OK(tlm_model_new(&c, &m));
        CHECK_OK(tlm_model_init(m, 7, TLM_INIT_GPT2));
        CHECK_OK(tlm_train_ctx_new(m, &x));
        CHECK_OK(tlm_adamw_new(m, &opt));
        size_t n = tlm_model_num_params(m);
        grads[w] = malloc(n * sizeof(float));
        params[w] = malloc(n * sizeof(float));
        CHECK_OK(tlm_train_ctx_forward_backward(x, ids, tg, B, T, 0, grads[w], 0, &loss[w]));
        float *g = copy(grads[0], n);
        norm[w] = tlm_grad_clip(g, n, 0.5);
        CHECK_OK(tlm_adamw_step(opt, m, g, 1e-3, &h));
        memcpy(params[w], tlm_model_params(m), n * sizeof(float));
        free(g);
        tlm_adamw_free(opt);
        tlm_train_ctx_free(x);
        tlm_model_free(m);
        if (w == 0) continue;
        CHECK_NEAR(loss[1], loss[0], 1e-5 * fabs(loss[0]));
        double eg = rel_diff(grads[1], grads[0], n, 1e-3);
        CHECK(eg < 1e-4, "%s: gradients at level %d: %g", name, levels[l], eg);
        CHECK_NEAR(norm[1], norm[0], 1e-9 * norm[0]);
        double ep = rel_diff(params[1], params[0], n, 1e-2);
        CHECK(ep < 1e-6, "%s: parameters after a step at level %d: %g", name, levels[l], ep);
        free(grads[1]);
        free(params[1]);
    }
    free(grads[0]);
    free(params[0]);
}

int main(void) {
    for (int isa = K_ISA_REF; isa <= k_isa(); isa++) levels[n_levels++] = isa;
    printf("levels compared: %d (the CPU runs up to K_ISA %d)\n", n_levels, k_isa());
    check_elementwise();
    check_rows();
    check_attention();
    check_step(1);
    check_step(0);
    k_vec_cap(K_ISA_COUNT);
    CHECK(k_vec_isa() == k_isa(), "the cap lifted: %d", k_vec_isa());
    return t_finish("test_vec_levels");
}
