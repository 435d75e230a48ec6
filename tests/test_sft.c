/* Instruction tuning's batches: examples packed into one row (positions restarting at each) give
 * the loss and every gradient of the same examples in rows of their own, in fp32 and bf16, full
 * and LoRA training, the batch whole or split over threads; masked targets add exactly nothing;
 * a divisor makes micro-steps add up to the whole step's mean. JSON Lines examples: the loss is on
 * exactly the tokens asked for (a chat's assistant turns with their end markers, a completion),
 * malformed lines are named, long examples cut as told; a trainer's step over packed rows equals
 * the same step over unpacked ones, and with micro-steps. The attention kernels on packed rows
 * equal a double reference of their mask. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "kernels/kernels.h"
#include "tlm.h"
#include "train/train.h"

enum { T = 40, NEX = 3 };
static const int lens[NEX] = {9, 14, 17}; /* packed: exactly one row of T */

/* Largest |a - b| / (atol + rtol |b|). */
static double worst(const float *a, const float *b, size_t n, double atol, double rtol) {
    double w = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]) / (atol + rtol * fabs((double)b[i]));
        if (!(e <= w)) w = isnan(e) ? INFINITY : e;
    }
    return w;
}

static tlm_config config(int learned) {
    tlm_config c;
    tlm_config_defaults(&c);
    c.vocab_size = 61;
    c.context_length = 64;
    c.d_model = 64;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = learned ? 4 : 2;
    if (learned) { /* GPT-2's layout: learned positions, LayerNorm, GELU */
        c.norm = TLM_NORM_LAYERNORM;
        c.position = TLM_POS_LEARNED;
        c.ffn = TLM_FFN_GELU;
        c.bias = 1;
    }
    CHECK_OK(tlm_config_finalize(&c));
    return c;
}

/* The examples: ids, targets (the next token; the first two of each example masked as a prompt,
 * the last with nothing after it masked). Unpacked: one per row of T, padded with pad ids and
 * masked targets. Packed: one row, positions from 0 at each example. */
typedef struct {
    int32_t ids[NEX * T], tg[NEX * T]; /* unpacked [NEX, T] */
    int32_t pids[T], ptg[T], ppos[T];  /* packed [1, T] */
} batch;

static void make_batch(batch *b, int pad) {
    int at = 0;
    for (int e = 0; e < NEX; e++) {
        int32_t ex[T];
        for (int i = 0; i < lens[e]; i++) ex[i] = (int32_t)(t_rnd() % 61);
        for (int i = 0; i < T; i++) {
            int in = i < lens[e];
            b->ids[e * T + i] = in ? ex[i] : pad;
            b->tg[e * T + i] = in && i >= 2 && i + 1 < lens[e] ? ex[i + 1] : -1;
        }
        for (int i = 0; i < lens[e]; i++, at++) {
            b->pids[at] = ex[i];
            b->ptg[at] = b->tg[e * T + i];
            b->ppos[at] = i;
        }
    }
}

static float *grads_of(tlm_train_ctx *x, size_t n, const int32_t *ids, const int32_t *tg, int B,
                       const int32_t *pos, double divisor, float *loss) {
    float *g = malloc(n * sizeof *g);
    tlm_batch_opts o;
    tlm_batch_opts_defaults(&o);
    o.pos = pos;
    o.divisor = divisor;
    CHECK_OK(tlm_train_ctx_forward_backward_opts(x, ids, tg, B, T, &o, g, 0, loss));
    return g;
}

static void packed_case(int learned, tlm_precision prec, int lora, int split) {
    tlm_config c = config(learned);
    tlm_model *m = t_model(&c, 7, TLM_INIT_GPT2);
    if (!m) return;
    tlm_lora *a = NULL;
    if (lora) {
        tlm_lora_opts lo;
        tlm_lora_opts_defaults(&lo);
        lo.rank = 4;
        CHECK_OK(tlm_lora_new(m, &lo, &a));
        /* B nonzero, so the adapter changes the outputs and every A has a gradient */
        float *P = tlm_lora_params_mut(a);
        for (size_t i = 0; i < tlm_lora_num_params(a); i++) P[i] = 0.05f * t_unif();
    }
    const char *name = learned ? "gpt2" : "llama";
    tlm_train_ctx *x = NULL;
    CHECK_OK(tlm_train_ctx_new(m, &x));
    CHECK_OK(tlm_train_ctx_set_precision(x, prec));
    tlm_train_ctx_set_data_parallel(x, split);
    const tlm_lora *one[1] = {a};
    if (a) CHECK_OK(tlm_train_ctx_set_loras(x, one, NULL, 1));
    size_t n = a ? tlm_lora_num_params(a) : tlm_model_num_params(m);
    batch b;
    make_batch(&b, 5);
    float lu, lp;
    float *gu = grads_of(x, n, b.ids, b.tg, NEX, NULL, 0, &lu);
    float *gp = grads_of(x, n, b.pids, b.ptg, 1, b.ppos, 0, &lp);
    int bf = prec == TLM_PRECISION_BF16;
    double w = worst(gp, gu, n, bf ? 1e-4 : 1e-6, bf ? 2e-2 : 1e-4);
    printf("  %-5s %s %-4s %-5s: loss unpacked %.6f packed %.6f; gradients worst error / "
           "tolerance %.3f\n",
           name, bf ? "bf16" : "fp32", a ? "LoRA" : "full", split ? "split" : "whole", (double)lu,
           (double)lp, w);
    CHECK_NEAR(lp, lu, bf ? 2e-3 : 2e-6);
    CHECK(w <= 1, "%s: packed gradients differ from unpacked (%.3g)", name, w);

    /* Logits: each packed example's equal its own row's. */
    tlm_forward_opts fo;
    tlm_forward_opts_defaults(&fo);
    fo.pos = b.ppos;
    tlm_forward_out out;
    size_t V = (size_t)c.vocab_size;
    float *lgp = malloc((size_t)T * V * sizeof *lgp), *lgu = malloc(NEX * (size_t)T * V * 4);
    CHECK_OK(tlm_train_ctx_forward(x, b.pids, 1, T, &fo, &out));
    memcpy(lgp, out.logits, (size_t)T * V * sizeof *lgp);
    CHECK_OK(tlm_train_ctx_forward(x, b.ids, NEX, T, NULL, &out));
    memcpy(lgu, out.logits, NEX * (size_t)T * V * sizeof *lgu);
    double wl = 0;
    for (int e = 0, at = 0; e < NEX; at += lens[e], e++) {
        double we = worst(lgp + (size_t)at * V, lgu + (size_t)e * T * V, (size_t)lens[e] * V,
                          bf ? 1e-2 : 1e-5, bf ? 1e-2 : 1e-4);
        wl = we > wl ? we : wl;
    }
    CHECK(wl <= 1, "%s: packed logits differ from unpacked (%.3g)", name, wl);

    if (!bf && !split) {
        /* Padding after an example changes nothing, bit for bit. */
        batch b2 = b;
        for (int i = 0; i < NEX * T; i++)
            if (i % T >= lens[i / T]) b2.ids[i] = 17;
        float l2;
        float *g2 = grads_of(x, n, b2.ids, b2.tg, NEX, NULL, 0, &l2);
        CHECK(l2 == lu && !memcmp(g2, gu, n * sizeof *g2), "%s: padding ids changed the result",
              name);
        free(g2);
        /* Masked targets add nothing: with divisor 1 (sums), the gradient of every target equals
         * the gradients of two disjoint halves of them added. */
        int32_t h1[NEX * T], h2[NEX * T];
        for (int i = 0; i < NEX * T; i++) {
            h1[i] = i % 2 ? b.tg[i] : -1;
            h2[i] = i % 2 ? -1 : b.tg[i];
        }
        float ls, l1, l2b;
        float *gs = grads_of(x, n, b.ids, b.tg, NEX, NULL, 1, &ls);
        float *g1 = grads_of(x, n, b.ids, h1, NEX, NULL, 1, &l1);
        float *g2b = grads_of(x, n, b.ids, h2, NEX, NULL, 1, &l2b);
        for (size_t i = 0; i < n; i++) g1[i] += g2b[i];
        CHECK(worst(g1, gs, n, 1e-6, 1e-4) <= 1, "%s: the halves' gradients do not add up", name);
        CHECK_NEAR(l1 + l2b, ls, 1e-4 * fabs(ls));
        int cnt = 0;
        for (int i = 0; i < NEX * T; i++) cnt += b.tg[i] >= 0;
        CHECK_NEAR(ls / cnt, lu, 1e-5);
        /* A divisor: two micro-steps (examples 0 | 1, 2), each dividing by the step's count, add
         * up to the step's mean gradient. */
        float la, lb;
        float *ga = grads_of(x, n, b.ids, b.tg, 1, NULL, cnt, &la);
        float *gb = malloc(n * sizeof *gb);
        memcpy(gb, ga, n * sizeof *gb);
        tlm_batch_opts o;
        tlm_batch_opts_defaults(&o);
        o.divisor = cnt;
        CHECK_OK(tlm_train_ctx_forward_backward_opts(x, b.ids + T, b.tg + T, 2, T, &o, gb, 1, &lb));
        CHECK(worst(gb, gu, n, 1e-6, 1e-4) <= 1, "%s: micro-steps with the step's divisor", name);
        CHECK_NEAR(la + lb, lu, 1e-5);
        free(gs);
        free(g1);
        free(g2b);
        free(ga);
        free(gb);
    }
    free(lgp);
    free(lgu);
    free(gu);
    free(gp);
    tlm_train_ctx_free(x);
    tlm_lora_free(a);
    tlm_model_free(m);
}

static void bad_positions(void) {
    tlm_config c = config(0);
    tlm_model *m = t_model(&c, 7, TLM_INIT_GPT2);
    if (!m) return;
    tlm_train_ctx *x = NULL;
    CHECK_OK(tlm_train_ctx_new(m, &x));
    batch b;
    make_batch(&b, 0);
    b.ppos[3] = 64; /* == context_length */
    float *g = malloc(tlm_model_num_params(m) * sizeof *g), loss;
    tlm_batch_opts o = {b.ppos, 0, 0};
    CHECK(tlm_train_ctx_forward_backward_opts(x, b.pids, b.ptg, 1, T, &o, g, 0, &loss) ==
              TLM_ERR_RANGE,
          "a position past the context is refused");
    CHECK_ERROR_HAS("position 64");
    b.ppos[3] = -1;
    CHECK(tlm_train_ctx_forward_backward_opts(x, b.pids, b.ptg, 1, T, &o, g, 0, &loss) ==
              TLM_ERR_RANGE,
          "a negative position is refused");
    /* The two halves of a weighted pass: refused out of order, or on no context. */
    float w[T] = {0}, lp[T];
    CHECK(tlm_train_ctx_backward_weighted(x, w, g, 0, NULL) == TLM_ERR_ARG,
          "a backward with no forward_logp before it is refused");
    CHECK_ERROR_HAS("no tlm_train_ctx_forward_logp");
    CHECK(tlm_train_ctx_forward_logp(NULL, b.pids, b.ptg, 1, T, NULL, lp) == TLM_ERR_ARG,
          "no context");
    CHECK_OK(tlm_train_ctx_forward_logp(x, b.pids, b.ptg, 1, T, NULL, lp));
    CHECK_OK(tlm_train_ctx_token_logp(x, b.pids, b.ptg, 1, T, NULL, lp)); /* another pass */
    CHECK(tlm_train_ctx_backward_weighted(x, w, g, 0, NULL) == TLM_ERR_ARG,
          "another pass in between discards the forward");
    free(g);
    tlm_train_ctx_free(x);
    tlm_model_free(m);
}

/* ---- JSON Lines examples -------------------------------------------------------------------- */

static tlm_tokenizer *g_tok;

static void write_text(const char *path, const char *text) {
    CHECK(t_write_file(path, text, strlen(text)), "writing %s", path);
}

/* The trained tokens of example i, as text. */
static void trained_text(const tlm_examples *e, size_t i, char *out, size_t cap) {
    const int32_t *ids;
    const uint8_t *tr;
    int n = tlm_examples_get(e, i, &ids, &tr);
    size_t len = 0;
    for (int k = 0; k < n; k++) {
        const char *p;
        size_t pl;
        if (!tr[k] || tlm_tokenizer_piece(g_tok, ids[k], &p, &pl) || len + pl + 1 > cap) continue;
        memcpy(out + len, p, pl);
        len += pl;
    }
    out[len] = 0;
}

static tlm_examples *load(const char *path, tlm_data_format f, tlm_loss_on on, const char *tpl,
                          tlm_examples_stats *st) {
    tlm_examples_opts o;
    tlm_examples_opts_defaults(&o);
    o.format = f;
    o.loss_on = on;
    o.chat_template = tpl;
    tlm_examples *e = NULL;
    CHECK_OK(tlm_examples_load(path, g_tok, &o, &e, st));
    return e;
}

static void examples_masks(void) {
    const char *chat = "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, "
                       "{\"role\": \"user\", \"content\": \"Hi?\"}, {\"role\": \"assistant\", "
                       "\"content\": \"Hello.\"}, {\"role\": \"user\", \"content\": \"Why?\"}, "
                       "{\"role\": \"assistant\", \"content\": \"Because.\"}]}\n"
                       "\n"
                       "{\"messages\": [{\"role\": \"user\", \"content\": \"Only me.\"}]}\n";
    write_text("chat.jsonl", chat);
    tlm_examples_stats st;
    char got[512];
    tlm_examples *e = load("chat.jsonl", TLM_FORMAT_AUTO, TLM_LOSS_ON_DEFAULT, NULL, &st);
    if (e) {
        CHECK(st.format == TLM_FORMAT_CHAT && st.lines == 2 && st.examples == 1 && st.empty == 1,
              "chat: format %d, %ld lines, %ld kept, %ld empty", st.format, st.lines, st.examples,
              st.empty);
        trained_text(e, 0, got, sizeof got);
        CHECK(!strcmp(got, "Hello.<|im_end|>Because.<|im_end|>"), "chatml assistant turns: '%s'",
              got);
    }
    tlm_examples_free(e);
    e = load("chat.jsonl", TLM_FORMAT_CHAT, TLM_LOSS_ON_COMPLETION, "llama3", &st);
    if (e) {
        trained_text(e, 0, got, sizeof got);
        CHECK(!strcmp(got, "Because.<|eot_id|>"), "llama3 last turn: '%s'", got);
    }
    tlm_examples_free(e);
    e = load("chat.jsonl", TLM_FORMAT_CHAT, TLM_LOSS_ON_ALL, NULL, &st);
    if (e) {
        trained_text(e, 0, got, sizeof got);
        CHECK(!strncmp(got, "<|im_start|>system\nBe brief.<|im_end|>", 38) &&
                  strstr(got, "Because.<|im_end|>\n") && st.examples == 2,
              "all: '%s', %ld kept", got, st.examples);
    }
    tlm_examples_free(e);

    write_text("comp.jsonl",
               "{\"prompt\": \"Why? \", \"completion\": \"Because.\"}\n"
               "{\"prompt\": \"Why? \", \"completion\": \"Because of a long story.\"}\n");
    e = load("comp.jsonl", TLM_FORMAT_AUTO, TLM_LOSS_ON_DEFAULT, NULL, &st);
    if (e) {
        trained_text(e, 0, got, sizeof got);
        CHECK(!strcmp(got, "Because.") && st.format == TLM_FORMAT_COMPLETION, "completion: '%s'",
              got);
    }
    tlm_examples_free(e);
    /* cut to 10 tokens: keep-start keeps the prompt, keep-end the completion's end */
    tlm_examples_opts o;
    tlm_examples_opts_defaults(&o);
    o.max_len = 10;
    CHECK_OK(tlm_examples_load("comp.jsonl", g_tok, &o, &e, &st));
    CHECK(st.truncated == 2 && st.examples == 2, "keep-start: %ld cut", st.truncated);
    if (e) CHECK(tlm_examples_get(e, 1, NULL, NULL) == 10, "cut to 10");
    if (e) trained_text(e, 1, got, sizeof got);
    CHECK(!strcmp(got, "Becau"), "keep-start keeps the start: '%s'", got);
    tlm_examples_free(e);
    o.truncate_keep_end = 1;
    CHECK_OK(tlm_examples_load("comp.jsonl", g_tok, &o, &e, &st));
    if (e) trained_text(e, 1, got, sizeof got);
    CHECK(!strcmp(got, "ong story."), "keep-end keeps the end: '%s'", got);
    tlm_examples_free(e);

    /* malformed lines: named, or skipped and counted */
    write_text("bad.jsonl", "{\"text\": \"one\"}\n{\"text\": 5}\n[1]\n{\"text\": \"two\"}\n");
    tlm_examples_opts_defaults(&o);
    CHECK(tlm_examples_load("bad.jsonl", g_tok, &o, &e, &st) == TLM_ERR_FORMAT && !e,
          "a malformed line stops the load");
    CHECK_ERROR_HAS("line 2: 'text' must be a string");
    o.skip_bad = 1;
    CHECK_OK(tlm_examples_load("bad.jsonl", g_tok, &o, &e, &st));
    CHECK(st.bad == 2 && st.examples == 2, "skip-bad: %ld bad, %ld kept", st.bad, st.examples);
    tlm_examples_free(e);
    write_text("msgs.jsonl", "{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}\n");
    o.skip_bad = 0;
    CHECK(tlm_examples_load("msgs.jsonl", g_tok, &o, &e, &st) == TLM_ERR_FORMAT,
          "an unknown role is refused");
    CHECK_ERROR_HAS("line 1: messages[0]: role 'robot'");
}

/* One trainer step's loss and gradient over examples (all rows in one step). */
static float *step_grads(tlm_model *m, const tlm_examples *e, int pack, int K, float *loss,
                         size_t *n) {
    trn_plan p;
    CHECK_OK(trn_plan_make(e, T, pack, &p));
    int rows = (int)p.rows;
    trn_plan_free(&p);
    tlm_train_opts o;
    tlm_train_opts_defaults(&o);
    o.out_dir = ".";
    o.batch = rows;
    o.grad_accum = K;
    o.seq_len = T;
    o.examples = e;
    o.pack = pack;
    o.steps = 1;
    tlm_trainer *t = NULL;
    CHECK(rows % K == 0, "%d rows into %d micro-steps", rows, K);
    CHECK_OK(tlm_trainer_new(m, NULL, &o, &t));
    if (!t) return NULL;
    tlm_train_ctx_set_data_parallel(tlm_trainer_ctx(t), 0);
    CHECK_OK(tlm_trainer_backward(t, loss));
    *n = tlm_model_num_params(m);
    float *g = malloc(*n * sizeof *g);
    memcpy(g, tlm_trainer_grads(t), *n * sizeof *g);
    tlm_trainer_free(t);
    return g;
}

static void trainer_packing(void) {
    /* 6 completions of different lengths */
    FILE *f = fopen("six.jsonl", "w");
    for (int i = 0; i < 6; i++)
        fprintf(f, "{\"prompt\": \"Why %d? \", \"completion\": \"Because%.*s.\"}\n", i, 3 * i,
                " of a long story that goes on");
    fclose(f);
    tlm_examples *e = load("six.jsonl", TLM_FORMAT_AUTO, TLM_LOSS_ON_DEFAULT, NULL, NULL);
    tlm_config c = config(0);
    c.vocab_size = tlm_tokenizer_vocab_size(g_tok);
    CHECK_OK(tlm_config_finalize(&c));
    tlm_model *m = t_model(&c, 3, TLM_INIT_GPT2);
    if (!e || !m) return;
    float lu, lp, lk;
    size_t n;
    float *gu = step_grads(m, e, 0, 1, &lu, &n);
    float *gp = step_grads(m, e, 1, 1, &lp, &n);
    float *gk = step_grads(m, e, 0, 2, &lk, &n);
    if (gu && gp && gk) {
        printf("  trainer step: loss unpacked %.6f, packed %.6f, 2 micro-steps %.6f\n", (double)lu,
               (double)lp, (double)lk);
        CHECK_NEAR(lp, lu, 1e-5);
        CHECK_NEAR(lk, lu, 1e-5);
        CHECK(worst(gp, gu, n, 1e-6, 1e-4) <= 1, "packed step's gradient");
        CHECK(worst(gk, gu, n, 1e-6, 1e-4) <= 1, "micro-steps' gradient");
    }
    free(gu);
    free(gp);
    free(gk);
    tlm_model_free(m);
    tlm_examples_free(e);
}

/* The attention kernels on packed rows against a double reference of the mask lo[t] <= j <= t:
 * long enough that blocks of queries start inside examples (the products then leave out the keys
 * before the block's first visible one), one row of sorted examples and one whose lo is not
 * sorted (positions may restart and then run on from an earlier row), grouped heads. Masked
 * probabilities must be exact zeros. */
static double rel_err(const float *got, const double *want, size_t n) {
    double e = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - want[i];
        e += d * d;
        r += want[i] * want[i];
    }
    return isnan(e) ? INFINITY : sqrt(e / (r > 0 ? r : 1));
}

static void packed_attention(void) {
    enum { B = 2, TA = 150, H = 4, KVH = 2, HD = 16 };
    int qw = H * HD, kw = KVH * HD, ld = qw + 2 * kw, group = H / KVH;
    size_t N = (size_t)B * TA, TT = (size_t)TA * TA;
    int lo[B * TA];
    static const int seg[] = {37, 1, 50, 62};
    for (int s = 0, t = 0; s < 4; t += seg[s], s++)
        for (int i = 0; i < seg[s]; i++) lo[t + i] = t;
    for (int t = 0; t < TA; t++) /* row 1: examples from 0 and 70, then rows seeing all before */
        lo[TA + t] = t < 70 ? 0 : t < 100 ? 70 : t < 120 ? 0 : t;
    float *qkv = malloc(N * ld * 4), *dout = malloc(N * qw * 4), *out = malloc(N * qw * 4);
    float *probs = malloc(B * H * TT * 4), *dqkv = malloc(N * ld * 4);
    double *ro = calloc(N * qw, 8), *rd = calloc(N * ld, 8), *rp = calloc(B * H * TT, 8);
    double *P = malloc(TA * 8), *dP = malloc(TA * 8);
    for (size_t i = 0; i < N * ld; i++) qkv[i] = 1.5f * t_unif();
    for (size_t i = 0; i < N * qw; i++) dout[i] = t_unif();
    double scale = 1.0 / sqrt((double)HD);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            int g = h / group;
            const float *r = qkv + (size_t)b * TA * ld;
#define QR(t) (r + (size_t)(t)*ld + h * HD)
#define KR(t) (r + (size_t)(t)*ld + qw + g * HD)
#define VR(t) (r + (size_t)(t)*ld + qw + kw + g * HD)
            for (int t = 0; t < TA; t++) {
                int l = lo[b * TA + t];
                double mx = -1e300, sum = 0, dot = 0;
                for (int j = l; j <= t; j++) {
                    double v = 0;
                    for (int d = 0; d < HD; d++) v += (double)QR(t)[d] * KR(j)[d];
                    P[j] = v * scale;
                    mx = P[j] > mx ? P[j] : mx;
                }
                for (int j = l; j <= t; j++) sum += (P[j] = exp(P[j] - mx));
                const float *go = dout + ((size_t)b * TA + t) * qw + h * HD;
                double *o = ro + ((size_t)b * TA + t) * qw + h * HD;
                for (int j = l; j <= t; j++) {
                    P[j] /= sum;
                    rp[((size_t)b * H + h) * TT + (size_t)j * TA + t] = P[j];
                    dP[j] = 0;
                    for (int d = 0; d < HD; d++) {
                        o[d] += P[j] * VR(j)[d];
                        dP[j] += (double)go[d] * VR(j)[d];
                    }
                    dot += P[j] * dP[j];
                }
                double *dq = rd + ((size_t)b * TA + t) * ld + h * HD;
                for (int j = l; j <= t; j++) {
                    double ds = P[j] * (dP[j] - dot) * scale;
                    double *dk = rd + ((size_t)b * TA + j) * ld + qw + g * HD, *dv = dk + kw;
                    for (int d = 0; d < HD; d++) {
                        dq[d] += ds * KR(j)[d];
                        dk[d] += ds * QR(t)[d];
                        dv[d] += P[j] * go[d];
                    }
                }
            }
#undef QR
#undef KR
#undef VR
        }
    k_bf16 *kb = tlm_bf16_supported() ? k_bf16_new() : NULL;
    float sc = 1.0f / sqrtf((float)HD);
    float *scratch = malloc(k_attention_scratch_floats(TA, 0.0f, 0.0f, omp_get_max_threads()) * 4);
    for (int bf = 0; bf <= (kb != NULL); bf++) {
        memset(probs, 0x7f, B * H * TT * 4); /* huge values wherever nothing is written */
        memset(dqkv, 0xff, N * ld * 4);
        if (bf) {
            CHECK(k_bf16_attention_fwd(kb, out, probs, qkv, ld, B, TA, H, KVH, HD, sc, 0.0f, lo,
                                       0.0f) &&
                      k_bf16_attention_bwd(kb, dqkv, dout, qkv, ld, probs, B, TA, H, KVH, HD, sc,
                                           0.0f, lo, 0.0f),
                  "bf16 attention refused");
        } else {
            k_attention_fwd(out, probs, qkv, qkv + qw, qkv + qw + kw, ld, ld, B, TA, H, KVH, HD, sc,
                            0.0f, lo, 0.0f, 0, scratch);
            k_attention_bwd(dqkv, dqkv + qw, dqkv + qw + kw, dout, qkv, qkv + qw, qkv + qw + kw, ld,
                            ld, probs, B, TA, H, KVH, HD, sc, 0.0f, lo, 0.0f, 0, scratch);
        }
        long masked_nonzero = 0;
        for (size_t i = 0; i < B * H * TT; i++) masked_nonzero += rp[i] == 0 && probs[i] != 0.0f;
        double eo = rel_err(out, ro, N * qw), ep = rel_err(probs, rp, B * H * TT),
               ed = rel_err(dqkv, rd, N * ld), tol = bf ? 1e-2 : 1e-5;
        printf("  packed attention %s: relative error out %.2g, probs %.2g, gradients %.2g\n",
               bf ? "bf16" : "fp32", eo, ep, ed);
        CHECK(masked_nonzero == 0, "%ld masked probabilities are not zero", masked_nonzero);
        CHECK(eo < tol && ep < tol && ed < tol, "packed attention (%s) differs from the reference",
              bf ? "bf16" : "fp32");
        if (bf) { /* the backward computing each head's probabilities again: bit for bit */
            float *again = malloc(N * ld * 4);
            memset(again, 0xff, N * ld * 4);
            CHECK(k_bf16_attention_bwd(kb, again, dout, qkv, ld, NULL, B, TA, H, KVH, HD, sc, 0.0f,
                                       lo, 0.0f),
                  "bf16 attention backward refused without probs");
            CHECK(!memcmp(again, dqkv, N * ld * 4), "recomputed probabilities change dQ, dK, dV");
            free(again);
        }
    }
    k_bf16_free(kb);
    free(scratch);
    free(qkv);
    free(dout);
    free(out);
    free(probs);
    free(dqkv);
    free(ro);
    free(rd);
    free(rp);
    free(P);
    free(dP);
}

int main(void) {
    t_seed(11);
    tlm_threads_set(2);
    for (int learned = 0; learned <= 1; learned++)
        for (int bf = 0; bf <= tlm_bf16_supported(); bf++)
            for (int lora = 0; lora <= 1; lora++)
                for (int split = 0; split <= 1; split++)
                    packed_case(learned, bf ? TLM_PRECISION_BF16 : TLM_PRECISION_FP32, lora, split);
    bad_positions();
    packed_attention();
    const char *chars =
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,?!:<>|_\n";
    CHECK_OK(tlm_tokenizer_new_char(chars, strlen(chars), &g_tok));
    if (g_tok) {
        examples_masks();
        trainer_packing();
    }
    tlm_tokenizer_free(g_tok);
    return t_finish("test_sft");
}
