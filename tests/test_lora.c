/* LoRA adapters on a model: logits, loss and the gradient of every A and B (the base frozen)
 * against PyTorch with PEFT's LoRA layers (fixtures from tests/reference/gen_lora.py); the input
 * gradient through frozen F16, BF16 and block-type weights against the same adapter on the
 * widened weights; a new adapter reproduces the base; merged equals unmerged; sessions apply
 * adapters per sequence; files round-trip; adapters for another model are refused. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "io/safetensors.h"
#include "model/ctx.h"
#include "tlm.h"

#define LORA_FIXTURES TLM_BUILD_DIR "/fixtures/lora"

/* Largest |a - b| / (atol + rtol |b|) over n values. */
static double worst(const float *a, const float *b, size_t n, double atol, double rtol) {
    double w = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]) / (atol + rtol * fabs((double)b[i]));
        if (!(e <= w)) w = isnan(e) ? INFINITY : e;
    }
    return w;
}

/* ||a - b|| / ||b|| */
static double rel_norm(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

static float *read_tensor(const io_st_file *f, const char *name, size_t n) {
    const io_st_tensor *t = io_st_find(f, name);
    CHECK(t != NULL, "fixture lacks %s", name);
    float *v = calloc(n ? n : 1, sizeof *v);
    if (t) CHECK_OK(io_st_read_f32(f, t, v, n));
    return v;
}

/* Logits of one forward pass of m with adapters (n of them) on a fresh context, malloc'd. */
static float *logits_of(const tlm_model *m, const tlm_lora *const *a, const float *sc, int n,
                        const int32_t *ids, int B, int T) {
    tlm_train_ctx *x = NULL;
    CHECK_OK(tlm_train_ctx_new(m, &x));
    CHECK_OK(tlm_train_ctx_set_loras(x, a, sc, n));
    tlm_forward_out out;
    size_t V = (size_t)tlm_model_config(m)->vocab_size, N = (size_t)B * T;
    float *l = malloc(N * V * sizeof *l);
    CHECK_OK(tlm_train_ctx_forward(x, ids, B, T, NULL, &out));
    memcpy(l, out.logits, N * V * sizeof *l);
    tlm_train_ctx_free(x);
    return l;
}

static void parity_case(const char *name) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", LORA_FIXTURES, name);
    tlm_config c;
    tlm_model *m = NULL;
    io_st_file io, lf;
    CHECK_OK(tlm_config_load(t_path(dir, "config.json"), &c));
    CHECK_OK(tlm_model_new(&c, &m));
    CHECK_OK(tlm_model_read_safetensors(m, t_path(dir, "model.safetensors")));
    CHECK_OK(io_st_open(&io, t_path(dir, "io.safetensors")));
    CHECK_OK(io_st_open(&lf, t_path(dir, "lora.safetensors")));
    int B = atoi(io_st_meta(&io, "B")), T = atoi(io_st_meta(&io, "T"));
    size_t N = (size_t)B * T, V = (size_t)c.vocab_size;
    tlm_lora_opts o;
    tlm_lora_opts_defaults(&o);
    o.rank = atoi(io_st_meta(&lf, "rank"));
    o.alpha = (float)atof(io_st_meta(&lf, "alpha"));
    o.rslora = atoi(io_st_meta(&lf, "rslora"));
    CHECK_OK(tlm_lora_targets_parse(io_st_meta(&lf, "targets"), &o.targets));
    tlm_lora *a = NULL;
    CHECK_OK(tlm_lora_new(m, &o, &a));
    if (!a) return;
    int nt;
    const tlm_tensor_info *ts = tlm_lora_tensors(a, &nt);
    CHECK(nt == lf.n, "%s: %d tensors, the reference %d", name, nt, lf.n);
    float *P = tlm_lora_params_mut(a);
    for (int i = 0; i < nt; i++) {
        float *v = read_tensor(&lf, ts[i].name, ts[i].numel);
        memcpy(P + ts[i].offset, v, ts[i].numel * sizeof *v);
        free(v);
    }
    int32_t *ids = malloc(N * sizeof *ids), *tg = malloc(N * sizeof *tg);
    CHECK_OK(io_st_read_i32(&io, io_st_find(&io, "ids"), ids, N));
    CHECK_OK(io_st_read_i32(&io, io_st_find(&io, "targets"), tg, N));
    float loss_want, *logits_want = read_tensor(&io, "logits", N * V);
    CHECK_OK(io_st_read_f32(&io, io_st_find(&io, "loss"), &loss_want, 1));
    const tlm_lora *one[1] = {a};

    /* Logits of the adapted model. */
    float *lg = logits_of(m, one, NULL, 1, ids, B, T);
    double wl = worst(lg, logits_want, N * V, 1e-5, 1e-4);
    CHECK(wl <= 1, "%s: logits off the reference (worst error / tolerance %.3g)", name, wl);

    /* Gradients of every A and B: the batch whole, split over threads (replicas), and whole with
     * the logits and the head's backward three rows at a time. */
    size_t np = tlm_lora_num_params(a);
    float *g = malloc(np * sizeof *g);
    for (int dp = 0; dp <= 2; dp++) {
        tlm_train_ctx *x = NULL;
        CHECK_OK(tlm_train_ctx_new(m, &x));
        tlm_train_ctx_set_data_parallel(x, dp == 1);
        mdl_ctx_head_rows_max(dp == 2 ? 3 : 0);
        CHECK_OK(tlm_train_ctx_set_loras(x, one, NULL, 1));
        for (size_t i = 0; i < np; i++) g[i] = 77.0f; /* written over, not added to */
        float loss = NAN;
        CHECK_OK(tlm_train_ctx_forward_backward(x, ids, tg, B, T, 0, g, 0, &loss));
        CHECK_NEAR(loss, loss_want, 2e-5);
        double w = 0;
        const char *wn = "";
        for (int i = 0; i < nt; i++) {
            char key[TLM_NAME_MAX + 8];
            snprintf(key, sizeof key, "grad.%s", ts[i].name);
            float *want = read_tensor(&io, key, ts[i].numel);
            double e = worst(g + ts[i].offset, want, ts[i].numel, 1e-5, 1e-3);
            if (e > w) w = e, wn = ts[i].name;
            free(want);
        }
        printf("  %-18s %s: loss %.6f, gradients worst error / tolerance %.3f (%s)\n", name,
               dp == 1 ? "batch split"
               : dp    ? "head by 3 rows"
                       : "batch whole",
               (double)loss, w, wn);
        CHECK(w <= 1, "%s: LoRA gradients off the reference (%.3g, %s)", name, w, wn);
        /* Accumulating doubles every value. */
        float *g2 = malloc(np * sizeof *g2);
        memcpy(g2, g, np * sizeof *g2);
        CHECK_OK(tlm_train_ctx_forward_backward(x, ids, tg, B, T, 0, g2, 1, &loss));
        for (size_t i = 0; i < np; i++) g[i] *= 2;
        CHECK(worst(g2, g, np, 1e-6, 1e-5) <= 1, "%s: accumulate does not add", name);
        free(g2);
        tlm_train_ctx_free(x);
        mdl_ctx_head_rows_max(0);
    }

    /* DPO against the reference's pairs: the base's log-probabilities (the adapter at scale 0),
     * then the loss and every A and B gradient, the batch whole and split over threads. */
    io_st_file dp;
    CHECK_OK(io_st_open(&dp, t_path(dir, "dpo.safetensors")));
    int NP = atoi(io_st_meta(&dp, "P")), DT = atoi(io_st_meta(&dp, "T"));
    tlm_dpo_opts dopt = {atof(io_st_meta(&dp, "beta")), atof(io_st_meta(&dp, "label_smoothing")),
                         atof(io_st_meta(&dp, "rpo_alpha"))};
    size_t DN = (size_t)2 * NP * DT;
    int32_t *dids = malloc(DN * sizeof *dids), *dtg = malloc(DN * sizeof *dtg);
    CHECK_OK(io_st_read_i32(&dp, io_st_find(&dp, "ids"), dids, DN));
    CHECK_OK(io_st_read_i32(&dp, io_st_find(&dp, "targets"), dtg, DN));
    float *rf = read_tensor(&dp, "ref_logp", (size_t)2 * NP), dloss;
    CHECK_OK(io_st_read_f32(&dp, io_st_find(&dp, "loss"), &dloss, 1));
    double *ref = malloc((size_t)2 * NP * sizeof *ref);
    float *tok = malloc(DN * sizeof *tok);
    for (int dpar = 0; dpar <= 1; dpar++) {
        tlm_train_ctx *x = NULL;
        CHECK_OK(tlm_train_ctx_new(m, &x));
        tlm_train_ctx_set_data_parallel(x, dpar);
        float zero = 0.0f;
        CHECK_OK(tlm_train_ctx_set_loras(x, one, &zero, 1));
        CHECK_OK(tlm_train_ctx_token_logp(x, dids, dtg, 2 * NP, DT, NULL, tok));
        double wr = 0;
        for (int r = 0; r < 2 * NP; r++) {
            double sum = 0;
            for (int t = 0; t < DT; t++) sum += tok[(size_t)r * DT + t];
            wr = fmax(wr, fabs(sum - rf[r]) / (1e-4 + 1e-4 * fabs(rf[r])));
            ref[r] = rf[r];
        }
        CHECK(wr <= 1, "%s: the base's log-probabilities off the reference (%.3g)", name, wr);
        CHECK_OK(tlm_train_ctx_set_loras(x, one, NULL, 1));
        for (size_t i = 0; i < np; i++) g[i] = 77.0f;
        tlm_dpo_stats st;
        CHECK_OK(tlm_train_ctx_dpo(x, dids, dtg, NP, DT, NULL, ref, &dopt, 0, g, 0, &st));
        CHECK_NEAR(st.loss / NP, dloss, 2e-5);
        double w = 0;
        for (int i = 0; i < nt; i++) {
            char key[TLM_NAME_MAX + 8];
            snprintf(key, sizeof key, "grad.%s", ts[i].name);
            float *want = read_tensor(&dp, key, ts[i].numel);
            w = fmax(w, worst(g + ts[i].offset, want, ts[i].numel, 1e-5, 1e-3));
            free(want);
        }
        printf("  %-18s DPO %s: loss %.6f (reference %.6f), gradients worst error / tolerance "
               "%.3f\n",
               name, dpar ? "batch split" : "batch whole", st.loss / NP, (double)dloss, w);
        CHECK(w <= 1, "%s: DPO gradients off the reference (%.3g)", name, w);
        tlm_train_ctx_free(x);
    }
    free(dids);
    free(dtg);
    free(rf);
    free(ref);
    free(tok);
    io_st_close(&dp);

    /* The merged model computes what the adapter on the base does. */
    tlm_model *merged = NULL;
    CHECK_OK(tlm_lora_merge(m, one, NULL, 1, &merged));
    float *lm = logits_of(merged, NULL, NULL, 0, ids, B, T);
    double wm = worst(lm, lg, N * V, 1e-5, 1e-4);
    CHECK(wm <= 1, "%s: merged logits differ from the adapter's (%.3g)", name, wm);
    /* Half the scale merged equals half the scale applied. */
    float half = 0.5f;
    tlm_model *merged_half = NULL;
    CHECK_OK(tlm_lora_merge(m, one, &half, 1, &merged_half));
    float *lmh = logits_of(merged_half, NULL, NULL, 0, ids, B, T);
    float *lh = logits_of(m, one, &half, 1, ids, B, T);
    CHECK(worst(lmh, lh, N * V, 1e-5, 1e-4) <= 1, "%s: scale 0.5 merged vs applied", name);

    /* A session with the adapter gives the same logits (prefill of each sequence). */
    tlm_session *s = NULL;
    CHECK_OK(tlm_session_new(m, NULL, &s));
    CHECK_OK(tlm_session_set_loras(s, one, NULL, 1));
    float *sl = malloc(T * V * sizeof *sl);
    CHECK_OK(tlm_session_prefill(s, 0, ids, T, sl, 1));
    CHECK(worst(sl, lg, (size_t)T * V, 1e-4, 1e-4) <= 1, "%s: session logits with the adapter",
          name);
    tlm_session_free(s);

    /* Files: GGUF adapter and PEFT directory read back to the same matrices. */
    tlm_lora *back = NULL;
    CHECK_OK(tlm_lora_save(a, "adapter.gguf"));
    CHECK_OK(tlm_lora_load(m, "adapter.gguf", &back));
    if (back) {
        CHECK(tlm_lora_num_params(back) == np, "%s: GGUF adapter size", name);
        CHECK(!memcmp(tlm_lora_params(back), P, np * sizeof(float)), "%s: GGUF round trip", name);
        CHECK_NEAR(tlm_lora_scale(back), tlm_lora_scale(a), 1e-6);
    }
    tlm_lora_free(back);
    back = NULL;
    CHECK_OK(tlm_lora_save_peft(a, "peft"));
    CHECK_OK(tlm_lora_load(m, "peft", &back));
    if (back) {
        CHECK(!memcmp(tlm_lora_params(back), P, np * sizeof(float)), "%s: PEFT round trip", name);
        CHECK_NEAR(tlm_lora_scale(back), tlm_lora_scale(a), 1e-6);
    }
    tlm_lora_free(back);

    free(lg);
    free(lm);
    free(lmh);
    free(lh);
    free(sl);
    free(g);
    free(ids);
    free(tg);
    free(logits_want);
    tlm_model_free(merged);
    tlm_model_free(merged_half);
    tlm_lora_free(a);
    io_st_close(&io);
    io_st_close(&lf);
    tlm_model_free(m);
}

/* A llama-shaped random model whose rows are whole K-quant blocks. */
static tlm_config quant_config(void) {
    tlm_config c;
    tlm_config_defaults(&c);
    c.vocab_size = 256;
    c.context_length = 32;
    c.d_model = 256;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.d_ff = 512;
    c.norm = TLM_NORM_RMSNORM;
    c.ffn = TLM_FFN_SWIGLU;
    c.position = TLM_POS_ROPE;
    c.rope_pairing = TLM_ROPE_INTERLEAVED;
    c.tie_embeddings = 0;
    CHECK_OK(tlm_config_finalize(&c));
    return c;
}

/* The adapter's gradients on a base frozen in type `type` against the same adapter on that
 * base's weights widened to F32 (which the PyTorch cases above cover). The forward products of
 * block types quantize their activations (as llama.cpp's do), so the two differ by that rounding;
 * the input gradient goes through the exact widened weights. */
static void frozen_type(const tlm_model *f32, const char *type, const int32_t *ids,
                        const int32_t *tg, int B, int T) {
    char path[64];
    snprintf(path, sizeof path, "base-%s.gguf", type);
    tlm_ftype ft;
    CHECK_OK(tlm_ftype_parse(type, &ft));
    if (ft == TLM_FTYPE_F16 || ft == TLM_FTYPE_BF16) {
        CHECK_OK(tlm_model_save_gguf(f32, NULL, path,
                                     ft == TLM_FTYPE_F16 ? TLM_DTYPE_F16 : TLM_DTYPE_BF16));
    } else {
        tlm_quantize_opts qo;
        tlm_quantize_opts_defaults(&qo);
        qo.ftype = ft;
        qo.pure = 1;
        CHECK_OK(tlm_model_quantize_gguf(f32, NULL, path, &qo));
    }
    tlm_model *q = NULL, *wide = NULL;
    CHECK_OK(tlm_model_load(path, 0, &q));
    if (!q) return;
    CHECK_OK(tlm_lora_merge(q, NULL, NULL, 0, &wide)); /* no adapter: the weights widened */
    tlm_lora_opts o;
    tlm_lora_opts_defaults(&o);
    o.rank = 8;
    o.targets = TLM_LORA_ALL;
    tlm_lora *a = NULL;
    CHECK_OK(tlm_lora_new(q, &o, &a));
    /* B random too, so that gradients flow through every adapter into the inputs. */
    int nt;
    const tlm_tensor_info *ts = tlm_lora_tensors(a, &nt);
    float *P = tlm_lora_params_mut(a);
    t_seed(7);
    for (int i = 0; i < nt; i++)
        if (strstr(ts[i].name, "lora_b"))
            for (size_t j = 0; j < ts[i].numel; j++) P[ts[i].offset + j] = 0.05f * t_unif();
    size_t np = tlm_lora_num_params(a);
    float *gq = calloc(np, sizeof *gq), *gw = calloc(np, sizeof *gw), lq = 0, lw = 0;
    const tlm_lora *one[1] = {a};
    tlm_train_ctx *xq = NULL, *xw = NULL;
    CHECK_OK(tlm_train_ctx_new(q, &xq));
    CHECK_OK(tlm_train_ctx_new(wide, &xw));
    CHECK_OK(tlm_train_ctx_set_loras(xq, one, NULL, 1));
    CHECK_OK(tlm_train_ctx_set_loras(xw, one, NULL, 1));
    CHECK_OK(tlm_train_ctx_forward_backward(xq, ids, tg, B, T, 0, gq, 0, &lq));
    CHECK_OK(tlm_train_ctx_forward_backward(xw, ids, tg, B, T, 0, gw, 0, &lw));
    /* Layer 0's A gradients come through every later layer's frozen input gradient. */
    double e = rel_norm(gq, gw, np), e0 = 0;
    for (int i = 0; i < nt; i++)
        if (ts[i].layer == 0) {
            double ei = rel_norm(gq + ts[i].offset, gw + ts[i].offset, ts[i].numel);
            if (ei > e0) e0 = ei;
        }
    /* F16 products widen the weights; BF16's round the activations to bf16. */
    int plain = ft == TLM_FTYPE_F16;
    double tol = plain ? 1e-4 : 3e-2;
    printf("  frozen %-5s loss %.6f vs %.6f widened; gradient error %.2e (layer 0: %.2e)\n", type,
           (double)lq, (double)lw, e, e0);
    CHECK(e <= tol && e0 <= tol, "%s: frozen-base LoRA gradients off the widened base's by %.3g",
          type, e > e0 ? e : e0);
    CHECK_NEAR(lq, lw, plain ? 1e-5 : 2e-2);
    if (tlm_bf16_supported()) {
        /* bf16 products: the frozen weights' tiles rounded to bf16 for the input gradient. */
        CHECK_OK(tlm_train_ctx_set_precision(xq, TLM_PRECISION_BF16));
        CHECK_OK(tlm_train_ctx_forward_backward(xq, ids, tg, B, T, 0, gq, 0, &lq));
        double eb = rel_norm(gq, gw, np);
        printf("  frozen %-5s bf16 products: gradient error %.2e\n", type, eb);
        CHECK(eb <= 2.5e-2, "%s: bf16 LoRA gradients off the widened base's by %.3g", type, eb);
    }
    tlm_train_ctx_free(xq);
    tlm_train_ctx_free(xw);
    free(gq);
    free(gw);
    tlm_lora_free(a);
    tlm_model_free(wide);
    tlm_model_free(q);
    remove(path);
}

static void frozen_types(void) {
    tlm_config c = quant_config();
    tlm_model *m = t_model(&c, 11, TLM_INIT_GPT2);
    if (!m) return;
    int B = 2, T = 16;
    int32_t ids[32], tg[32];
    t_seed(3);
    for (int i = 0; i < B * T; i++) {
        ids[i] = (int32_t)(t_rnd() % 256);
        tg[i] = (int32_t)(t_rnd() % 256);
    }
    const char *types[] = {"F16", "BF16", "Q8_0", "Q4_0", "Q4_K_S", "Q6_K"};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++)
        frozen_type(m, types[i], ids, tg, B, T);
    tlm_model_free(m);
}

/* A new adapter (B zero) leaves the model as it is, bit for bit; a session mixes sequences with
 * and without the adapter in one step. */
static void identity_and_sequences(void) {
    tlm_config c = quant_config();
    tlm_model *m = t_model(&c, 5, TLM_INIT_GPT2);
    if (!m) return;
    int T = 8;
    int32_t ids[8] = {1, 7, 3, 200, 9, 31, 4, 100};
    tlm_lora_opts o;
    tlm_lora_opts_defaults(&o);
    tlm_lora *a = NULL;
    CHECK_OK(tlm_lora_new(m, &o, &a));
    if (!a) return;
    CHECK(tlm_lora_num_matrices(a) == 14, "default targets: %d matrices, want 7 x 2 layers",
          tlm_lora_num_matrices(a));
    CHECK_NEAR(tlm_lora_scale(a), 2.0, 0); /* alpha 2r by default */
    const tlm_lora *one[1] = {a};
    float *base = logits_of(m, NULL, NULL, 0, ids, 1, T);
    float *with = logits_of(m, one, NULL, 1, ids, 1, T);
    size_t V = 256;
    CHECK(!memcmp(base, with, T * V * sizeof(float)), "a new adapter changes the logits");
    /* Make the adapter do something, then run two sequences in one session, one without it. */
    int nt;
    const tlm_tensor_info *ts = tlm_lora_tensors(a, &nt);
    float *P = tlm_lora_params_mut(a);
    t_seed(9);
    for (int i = 0; i < nt; i++)
        for (size_t j = 0; j < ts[i].numel; j++) P[ts[i].offset + j] = 0.05f * t_unif();
    float *adapted = logits_of(m, one, NULL, 1, ids, 1, T);
    tlm_session_opts so;
    tlm_session_opts_defaults(&so);
    so.batch = 2;
    tlm_session *s = NULL;
    CHECK_OK(tlm_session_new(m, &so, &s));
    float zero = 0.0f;
    CHECK_OK(tlm_session_set_loras(s, one, NULL, 1));
    CHECK_OK(tlm_session_set_seq_lora_scales(s, 1, &zero));
    float *l0 = malloc(2 * V * sizeof *l0);
    CHECK_OK(tlm_session_prefill(s, 0, ids, T - 1, NULL, 0));
    CHECK_OK(tlm_session_prefill(s, 1, ids, T - 1, NULL, 0));
    int32_t last[2] = {ids[T - 1], ids[T - 1]};
    CHECK_OK(tlm_session_decode(s, last, NULL, l0));
    double w0 = worst(l0, adapted + (size_t)(T - 1) * V, V, 1e-4, 1e-4);
    double w1 = worst(l0 + V, base + (size_t)(T - 1) * V, V, 1e-4, 1e-4);
    CHECK(w0 <= 1, "sequence with the adapter: %.3g", w0);
    CHECK(w1 <= 1, "sequence without the adapter: %.3g", w1);
    CHECK(worst(adapted, base, T * V, 1e-3, 0) > 1, "the adapter changes nothing (test is void)");
    tlm_session_free(s);
    free(l0);
    free(base);
    free(with);
    free(adapted);
    tlm_lora_free(a);
    tlm_model_free(m);
}

/* The PEFT directory tlm writes, applied by PyTorch to tlm's Hugging Face export of the base (each
 * adapted HF weight W giving W x + s B (A x), tests/reference/hf_layouts.py), gives tlm's logits
 * with the adapter: for a model in GGUF's interleaved q/k order, whose B rows of q and k move to
 * HF's halves on the way out, and for one in HF's own order; rsLoRA's scale too. */
static void peft_on_hf_export(int interleaved) {
    tlm_config c;
    tlm_config_defaults(&c);
    c.vocab_size = 40;
    c.context_length = 12;
    c.d_model = 32;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.d_ff = 48;
    c.tie_embeddings = 0;
    c.rope_pairing = interleaved ? TLM_ROPE_INTERLEAVED : TLM_ROPE_HALF;
    CHECK_OK(tlm_config_finalize(&c));
    tlm_model *m = t_model(&c, 21, TLM_INIT_GPT2);
    if (!m) return;
    tlm_lora_opts o;
    tlm_lora_opts_defaults(&o);
    o.rank = 4;
    o.alpha = 6;
    o.rslora = !interleaved;
    o.targets = TLM_LORA_ALL;
    tlm_lora *a = NULL;
    CHECK_OK(tlm_lora_new(m, &o, &a));
    if (!a) return;
    int nt;
    const tlm_tensor_info *ts = tlm_lora_tensors(a, &nt);
    float *P = tlm_lora_params_mut(a);
    t_seed(31 + (uint64_t)interleaved);
    for (int i = 0; i < nt; i++)
        if (strstr(ts[i].name, "lora_b"))
            for (size_t j = 0; j < ts[i].numel; j++) P[ts[i].offset + j] = 0.2f * t_unif();
    int32_t ids[12] = {0, 39, 5, 9, 1, 17, 17, 2, 30, 4, 8, 11};
    int T = 12, V = c.vocab_size;
    const tlm_lora *one[1] = {a};
    float *mine = logits_of(m, one, NULL, 1, ids, 1, T);
    char dir[64], peft[96], exp[128], cmd[1024];
    snprintf(dir, sizeof dir, "hf_base_%s", interleaved ? "interleaved" : "half");
    snprintf(peft, sizeof peft, "%s_peft", dir);
    snprintf(exp, sizeof exp, "%s.tlm_logits.safetensors", dir);
    CHECK_OK(tlm_model_save_hf(m, dir, TLM_DTYPE_F32));
    CHECK_OK(tlm_lora_save_peft(a, peft));
    io_st_out_tensor tt[2] = {{"ids", TLM_DTYPE_I32, 1, {T}, ids},
                              {"logits", TLM_DTYPE_F32, 2, {T, V}, mine}};
    CHECK_OK(io_st_write(exp, tt, 2, NULL, NULL, 0));
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/tests/reference/hf_layouts.py check %s %s %s",
             TLM_SOURCE_DIR, dir, exp, peft);
    CHECK(system(cmd) == 0, "PyTorch with tlm's PEFT directory on the HF export (%s) differs", dir);
    /* The adapter matters: without it the reference is far from these logits. */
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 %s/tests/reference/hf_layouts.py check %s %s >/dev/null",
             TLM_SOURCE_DIR, dir, exp);
    CHECK(system(cmd) != 0, "the adapter changes nothing (%s): the check is void", dir);
    free(mine);
    tlm_lora_free(a);
    tlm_model_free(m);
}

/* Adapters for another model, targets a model lacks, bad options. */
static void refusals(void) {
    tlm_config c = quant_config(), c2 = quant_config();
    c2.d_ff = 768;
    CHECK_OK(tlm_config_finalize(&c2));
    tlm_model *m = t_model(&c, 1, TLM_INIT_GPT2), *m2 = t_model(&c2, 1, TLM_INIT_GPT2);
    tlm_lora_opts o;
    tlm_lora_opts_defaults(&o);
    tlm_lora *a = NULL, *b = NULL;
    CHECK_OK(tlm_lora_new(m, &o, &a));
    tlm_train_ctx *x = NULL;
    CHECK_OK(tlm_train_ctx_new(m2, &x));
    const tlm_lora *one[1] = {a};
    CHECK(tlm_train_ctx_set_loras(x, one, NULL, 1) == TLM_ERR_CONFIG, "adapter for another model");
    CHECK_ERROR_HAS("another model");
    CHECK_OK(tlm_lora_save(a, "other.gguf"));
    CHECK(tlm_lora_load(m2, "other.gguf", &b) != TLM_OK && !b, "GGUF adapter for another model");
    CHECK_ERROR_HAS("ffn_gate");
    o.rank = 0;
    CHECK(tlm_lora_new(m, &o, &b) == TLM_ERR_ARG, "rank 0");
    CHECK_ERROR_HAS("rank");
    unsigned t;
    CHECK(tlm_lora_targets_parse("q,x", &t) == TLM_ERR_ARG, "unknown target");
    CHECK_ERROR_HAS("'x'");
    /* The head of a tied model is its embedding; gate of a model without a gated FFN. */
    tlm_config ct = quant_config();
    ct.tie_embeddings = 1;
    ct.ffn = TLM_FFN_GELU;
    CHECK_OK(tlm_config_finalize(&ct));
    tlm_model *mt = t_model(&ct, 1, TLM_INIT_GPT2);
    tlm_lora_opts_defaults(&o);
    o.targets = TLM_LORA_HEAD;
    CHECK(tlm_lora_new(mt, &o, &b) == TLM_ERR_ARG, "head of a tied model");
    CHECK_ERROR_HAS("tied");
    o.targets = TLM_LORA_GATE;
    CHECK(tlm_lora_new(mt, &o, &b) == TLM_ERR_ARG, "gate without a gated FFN");
    CHECK_ERROR_HAS("gate");
    o.targets = TLM_LORA_BLOCKS; /* the blocks' layers it has */
    CHECK_OK(tlm_lora_new(mt, &o, &b));
    if (b)
        CHECK(tlm_lora_num_matrices(b) == 12, "gelu blocks: %d matrices", tlm_lora_num_matrices(b));
    tlm_lora_free(b);
    remove("other.gguf");
    tlm_train_ctx_free(x);
    tlm_lora_free(a);
    tlm_model_free(m);
    tlm_model_free(m2);
    tlm_model_free(mt);
}

int main(void) {
    FILE *f = fopen(LORA_FIXTURES "/cases.txt", "r");
    CHECK(f != NULL, "missing %s (tests/reference/gen_fixtures.py)", LORA_FIXTURES "/cases.txt");
    char line[256];
    while (f && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = 0;
        if (line[0]) parity_case(line);
    }
    if (f) fclose(f);
    identity_and_sequences();
    peft_on_hf_export(1);
    peft_on_hf_export(0);
    frozen_types();
    refusals();
    return t_finish("test_lora");
}
