#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "core/core.h"

// clang-format off
static const char *eval_help =
    "usage: tlm eval -m MODEL [-z TOKENIZER] --data TEXT [--batch B] [-t THREADS] [--json]\n"
    "                [--mmap|--no-mmap] [--precision auto|fp32|bf16] [--cache-type T]\n"
    "                [--llama-ppl] [--kl-ref BASE]\n\n"
    "Mean next-token cross-entropy of the model over the whole text: the tokens are cut into\n"
    "consecutive windows of context_length (+1 for the targets), every token is predicted once.\n"
    "Prints loss, perplexity and bits per byte.\n\n"
    "  -m, --model PATH      model (tlm checkpoint directory, .safetensors, .gguf, llama2.c .bin,\n"
    "                        Hugging Face directory)\n"
    "  -z, --tokenizer PATH  tokenizer (default: the model's own)\n"
    "  --data FILE           text to evaluate\n"
    "  --batch B             windows per forward pass (default 8; one with --cache-type)\n"
    "  -t, --threads N       threads (default: all cores)\n"
    "  --json                print {\"loss\", \"perplexity\", \"bits_per_byte\", \"tokens\"}\n"
    CLI_MMAP_HELP
    CLI_PRECISION_HELP
    CLI_LORA_HELP
    "  --cache-type T        score through a generation session whose KV cache has this type\n"
    "                        (tlm generate's: f16, q8_0, q4_0, ...; -ctk T -ctv T too), each\n"
    "                        window one prefill that reads its keys and values back from the\n"
    "                        cache, as llama-perplexity's -ctk/-ctv do: the cache's effect on\n"
    "                        accuracy. Without it the windows go through the training forward\n"
    "                        pass, which keeps them in floats\n"
    "  --llama-ppl           score as llama.cpp's llama-perplexity does (to compare the two):\n"
    "                        the text's tokens (after a BOS where the vocabulary adds one) cut\n"
    "                        into chunks of context_length, each chunk's first token replaced\n"
    "                        by BOS, only the second half of each chunk predicted; a last\n"
    "                        partial chunk is left out; special tokens in the text are plain\n"
    "                        text\n"
    "  --kl-ref BASE         also run BASE (the model before quantization, the same vocabulary)\n"
    "                        over the same windows and compare, as llama-perplexity\n"
    "                        --kl-divergence does: PPL(Q)/PPL(base), the KL divergence of the\n"
    "                        model's next-token distribution from BASE's (mean, percentiles,\n"
    "                        maximum), the RMS change of the target's probability, and how often\n"
    "                        both put the same token on top\n";
// clang-format on

/* llama-perplexity --kl-divergence's statistics of a quantized model (q) against its base, over
 * the scored positions. */
typedef struct {
    double nll, nll_base, kld, kld2, dp, dp2;
    size_t same_top, count, cap;
    float *klds; /* each position's, for the percentiles */
} kl_stats;

/* One position: the rows of logits of q and of the base, the target y. */
static int kl_add(kl_stats *k, const float *q, const float *b, int V, int y) {
    double mq = q[0], mb = b[0], zq = 0, zb = 0;
    int tq = 0, tb = 0;
    for (int j = 1; j < V; j++) {
        if (q[j] > mq) mq = q[j], tq = j;
        if (b[j] > mb) mb = b[j], tb = j;
    }
    for (int j = 0; j < V; j++) zq += exp(q[j] - mq), zb += exp(b[j] - mb);
    double lq = mq + log(zq), lb = mb + log(zb), kld = 0;
    for (int j = 0; j < V; j++) {
        double pb = b[j] - lb; /* log p_base */
        kld += exp(pb) * (pb - (q[j] - lq));
    }
    if (kld < 0) kld = 0; /* rounding, where the two are equal */
    double nq = lq - q[y], nb = lb - b[y], dp = exp(-nq) - exp(-nb);
    k->nll += nq;
    k->nll_base += nb;
    k->kld += kld;
    k->kld2 += kld * kld;
    k->dp += dp;
    k->dp2 += dp * dp;
    k->same_top += tq == tb;
    if (k->count == k->cap) {
        size_t cap = k->cap ? 2 * k->cap : 4096;
        float *n = realloc(k->klds, cap * sizeof *n);
        if (!n) return 0;
        k->klds = n;
        k->cap = cap;
    }
    k->klds[k->count++] = (float)kld;
    return 1;
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* llama-perplexity's percentile: linear between the sorted values. */
static double kl_pct(const kl_stats *k, double f) {
    double p = f * (double)(k->count - 1);
    size_t i = (size_t)p;
    p -= (double)i;
    return (1 - p) * k->klds[i] + p * k->klds[i + 1 < k->count ? i + 1 : i];
}

static void kl_print(kl_stats *k, int json) {
    qsort(k->klds, k->count, sizeof *k->klds, cmp_float);
    double n = (double)k->count, mean = k->kld / n;
    double var = k->kld2 / n - mean * mean; /* rounding can take it just below 0 */
    double unc = k->count > 1 && var > 0 ? sqrt(var / (n - 1)) : 0;
    double ppl = exp(k->nll / n), ppl_base = exp(k->nll_base / n);
    double same = (double)k->same_top / n, rms = sqrt(k->dp2 / n);
    double med = kl_pct(k, 0.5);
    if (json) {
        printf("{\"ppl\": %.6f, \"ppl_base\": %.6f, \"ppl_ratio\": %.6f, \"kld_mean\": %.6g, "
               "\"kld_mean_unc\": %.3g, \"kld_max\": %.6g, \"kld_99_9\": %.6g, \"kld_99\": %.6g, "
               "\"kld_95\": %.6g, \"kld_90\": %.6g, \"kld_median\": %.6g, \"dp_mean\": %.6g, "
               "\"dp_rms\": %.6g, \"same_top\": %.6f, \"tokens\": %zu}\n",
               ppl, ppl_base, ppl / ppl_base, mean, unc, (double)k->klds[k->count - 1],
               kl_pct(k, 0.999), kl_pct(k, 0.99), kl_pct(k, 0.95), kl_pct(k, 0.9), med, k->dp / n,
               rms, same, k->count);
        return;
    }
    printf("PPL(Q) %.4f  PPL(base) %.4f  PPL(Q)/PPL(base) %.6f  (%zu tokens predicted)\n", ppl,
           ppl_base, ppl / ppl_base, k->count);
    printf(
        "KL divergence: mean %.6f +- %.6f  max %.6f  99.9%% %.6f  99%% %.6f  95%% %.6f  90%% %.6f"
        "  median %.6f\n",
        mean, unc, (double)k->klds[k->count - 1], kl_pct(k, 0.999), kl_pct(k, 0.99),
        kl_pct(k, 0.95), kl_pct(k, 0.9), med);
    printf("target probability: mean change %+.3f%%  RMS change %.3f%%;  same top token %.3f%%\n",
           100 * k->dp / n, 100 * rms, 100 * same);
}

/* Summed negative log-likelihood of the targets y[t] >= 0 under the T rows of logits. */
static double window_nll(const float *logits, int V, const int32_t *y, int T) {
    double sum = 0;
    for (int t = 0; t < T; t++) {
        if (y[t] < 0) continue;
        const float *r = logits + (size_t)t * V;
        double mx = r[0], z = 0;
        for (int j = 1; j < V; j++) mx = r[j] > mx ? r[j] : mx;
        for (int j = 0; j < V; j++) z += exp((double)r[j] - mx);
        sum += mx + log(z) - r[y[t]];
    }
    return sum;
}

static int eval_main(int argc, char **argv, cli_lora *lora) {
    const char *model = NULL, *tokenizer = NULL, *data = NULL, *precision = NULL, *kl_ref = NULL;
    int json = 0, map_mode = CLI_MAP_AUTO, llama_ppl = 0, ck, cached = 0;
    long batch = 8, threads = 0;
    cli_cache cache = CLI_CACHE_DEFAULT;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(eval_help, stdout);
            return 0;
        } else if ((ck = cli_lora_flag("eval", argc, argv, &i, lora)) != 0) {
            if (ck < 0) return 1;
        } else if (cli_flag_value(argc, argv, &i, "-m", "--model", &v)) {
            if (!v) return cli_fail("eval: %s needs a value", argv[i]);
            model = v;
        } else if (cli_flag_value(argc, argv, &i, "-z", "--tokenizer", &v)) {
            if (!v) return cli_fail("eval: %s needs a value", argv[i]);
            tokenizer = v;
        } else if (cli_flag_value(argc, argv, &i, "--data", NULL, &v)) {
            if (!v) return cli_fail("eval: %s needs a value", argv[i]);
            data = v;
        } else if (cli_flag_value(argc, argv, &i, "--precision", NULL, &v)) {
            if (!v) return cli_fail("eval: --precision needs a value");
            precision = v;
        } else if (cli_flag_value(argc, argv, &i, "--batch", NULL, &v)) {
            if (!cli_parse_int(v, &batch) || batch < 1)
                return cli_fail("eval: --batch must be a positive integer");
        } else if (cli_flag_value(argc, argv, &i, "-t", "--threads", &v)) {
            if (!cli_parse_int(v, &threads) || threads < 1)
                return cli_fail("eval: --threads must be a positive integer");
        } else if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (cli_map_flag(argv[i], &map_mode)) {
            /* map_mode is set */
        } else if (cli_flag_value(argc, argv, &i, "--kl-ref", NULL, &v)) {
            if (!v) return cli_fail("eval: --kl-ref needs a model");
            kl_ref = v;
        } else if (!strcmp(argv[i], "--llama-ppl")) {
            llama_ppl = 1;
        } else if ((ck = cli_cache_flag("eval", argc, argv, &i, &cache)) != 0) {
            if (ck < 0) return 1;
            cached = 1;
        } else {
            return cli_fail("eval: unknown option '%s' (see tlm eval --help)", argv[i]);
        }
    }
    if (!model) return cli_fail("eval: -m MODEL is required");
    if (kl_ref && cached)
        return cli_fail("eval: --kl-ref compares the forward passes: no --cache-type");
    if (!data) return cli_fail("eval: --data TEXT is required");
    tlm_threads_set((int)threads);
    tlm_model *m = NULL;
    tlm_tokenizer *tok = NULL;
    char *text = NULL;
    int32_t *ids = NULL;
    size_t len = 0, n = 0;
    int rc = 0;
    unsigned lf;
    if (!cli_load_flags("eval", map_mode == CLI_MAP_READ, precision, &lf)) return 1;
    if (tlm_model_load(model, lf, &m)) return cli_fail_status("eval");
    if (lora->n && cli_lora_load("eval", lora, m)) {
        tlm_model_free(m);
        return 1;
    }
    const tlm_lora *const *loras = (const tlm_lora *const *)lora->lora;
    tlm_model *base = NULL;
    if (kl_ref) {
        if (tlm_model_load(kl_ref, lf, &base)) {
            tlm_model_free(m);
            return cli_fail_status("eval: --kl-ref");
        }
        tlm_config a = *tlm_model_config(m), b = *tlm_model_config(base);
        if (a.vocab_size != b.vocab_size || a.context_length != b.context_length) {
            tlm_model_free(m);
            tlm_model_free(base);
            return cli_fail("eval: --kl-ref %s has a vocabulary of %d and a context of %d, the "
                            "model %d and %d: not the same model",
                            kl_ref, b.vocab_size, b.context_length, a.vocab_size, a.context_length);
        }
    }
    if (tokenizer) {
        if (tlm_tokenizer_load(tokenizer, &tok)) rc = cli_fail_status("eval: loading tokenizer");
    } else if (cli_model_tokenizer(model, &tok)) {
        rc = cli_fail_status("eval: loading the model's tokenizer");
    } else if (!tok) {
        rc = cli_fail("eval: no tokenizer travels with '%s'; give -z TOKENIZER", model);
    }
    if (!rc && core_read_file(data, &text, &len)) rc = cli_fail_status("eval");
    /* llama-perplexity adds BOS where the GGUF vocabulary says so (tokenizer.ggml.add_bos_token,
     * which tlm writes for SentencePiece vocabularies with a BOS), and reads special tokens in the
     * text as plain text. */
    int add_bos = llama_ppl && tok && tlm_tokenizer_add_bos(tok);
    int bos = tok ? tlm_tokenizer_bos(tok) : -1;
    unsigned enc = llama_ppl ? (add_bos ? TLM_ENCODE_ADD_BOS : 0u) : TLM_ENCODE_ALLOW_SPECIAL;
    if (!rc && tlm_tokenizer_encode(tok, text, len, enc, &ids, &n))
        rc = cli_fail_status("eval: tokenizing");
    const tlm_config *c = rc ? NULL : tlm_model_config(m);
    if (!rc && n < 2) rc = cli_fail("eval: the text has fewer than 2 tokens");
    if (!rc) {
        for (size_t i = 0; i < n; i++)
            if (ids[i] >= c->vocab_size) {
                rc = cli_fail("eval: token %d is outside the model's vocabulary (%d)", ids[i],
                              c->vocab_size);
                break;
            }
    }
    if (!rc && llama_ppl && n < 2 * (size_t)c->context_length)
        rc = cli_fail("eval: --llama-ppl needs at least 2 chunks of %d tokens; the text has %zu",
                      c->context_length, n);
    if (!rc) {
        /* Consecutive windows: window w predicts tokens w*T+1 .. (w+1)*T from the ones before.
         * With --llama-ppl, chunk w is tokens w*T .. (w+1)*T - 1 and predicts its second half. */
        int T = c->context_length;
        size_t windows = llama_ppl ? n / (size_t)T : (n - 1 + (size_t)T - 1) / (size_t)T;
        int B = cached ? 1 : (int)batch; /* a session takes one window at a time */
        int32_t *x = malloc((size_t)B * T * sizeof *x), *y = malloc((size_t)B * T * sizeof *y);
        tlm_train_ctx *ctx = NULL, *bctx = NULL;
        kl_stats kl = {0};
        tlm_session *sess = NULL;
        float *logits = NULL;
        double total = 0;
        size_t counted = 0;
        if (cached) {
            /* one window at a time through a session: its logits at every position */
            tlm_session_opts so = {.batch = 1, .capacity = T};
            cli_cache_opts(&cache, &so);
            if (tlm_session_new(m, &so, &sess) ||
                tlm_session_set_loras(sess, loras, lora->scale, lora->n))
                rc = cli_fail_status("eval");
            logits = malloc((size_t)T * c->vocab_size * sizeof *logits);
            if (!rc && !logits) rc = cli_fail("eval: out of memory");
        }
        for (size_t w0 = 0; w0 < windows && !rc; w0 += (size_t)B) {
            int nb = (int)(windows - w0 < (size_t)B ? windows - w0 : (size_t)B);
            for (int b = 0; b < nb; b++)
                for (int t = 0; t < T; t++) {
                    size_t i = (w0 + (size_t)b) * T + (size_t)t;
                    /* The last window is padded: padding predicts nothing (target -1). */
                    x[b * T + t] = i < n ? ids[i] : 0;
                    y[b * T + t] = i + 1 < n ? ids[i + 1] : -1;
                    if (llama_ppl) {
                        if (t == 0 && add_bos) x[b * T] = bos;
                        y[b * T + t] = t >= T / 2 && t < T - 1 ? ids[i + 1] : -1;
                    }
                }
            int cnt = 0;
            for (int i = 0; i < nb * T; i++) cnt += y[i] >= 0;
            if (sess) {
                tlm_session_reset(sess, -1);
                if (tlm_session_prefill(sess, 0, x, T, logits, 1)) {
                    rc = cli_fail_status("eval");
                    break;
                }
                total += window_nll(logits, c->vocab_size, y, T);
                counted += (size_t)cnt;
                continue;
            }
            tlm_forward_opts o = {.targets = y};
            tlm_forward_out out;
            if (!ctx && (tlm_train_ctx_new(m, &ctx) ||
                         tlm_train_ctx_set_loras(ctx, loras, lora->scale, lora->n))) {
                rc = cli_fail_status("eval");
                break;
            }
            if (tlm_train_ctx_forward(ctx, x, nb, T, &o, &out)) {
                rc = cli_fail_status("eval");
                break;
            }
            total += (double)out.loss * cnt;
            counted += (size_t)cnt;
            if (base) {
                tlm_forward_out bo;
                if ((!bctx && tlm_train_ctx_new(base, &bctx)) ||
                    tlm_train_ctx_forward(bctx, x, nb, T, &o, &bo)) {
                    rc = cli_fail_status("eval: --kl-ref");
                    break;
                }
                int V = c->vocab_size;
                for (int i = 0; i < nb * T && !rc; i++)
                    if (y[i] >= 0 && !kl_add(&kl, out.logits + (size_t)i * V,
                                             bo.logits + (size_t)i * V, V, y[i]))
                        rc = cli_fail("eval: out of memory");
            }
        }
        free(x);
        free(y);
        free(logits);
        tlm_session_free(sess);
        tlm_train_ctx_free(ctx);
        tlm_train_ctx_free(bctx);
        if (!rc && base && kl.count) {
            kl_print(&kl, json);
        } else if (!rc) {
            double loss = total / (double)counted;
            double bpb = loss * (double)counted / ((double)len * log(2.0));
            if (json)
                printf("{\"loss\": %.6f, \"perplexity\": %.4f, \"bits_per_byte\": %.4f, "
                       "\"tokens\": %zu}\n",
                       loss, exp(loss), bpb, counted);
            else
                printf("loss %.6f  perplexity %.4f  bits/byte %.4f  (%zu tokens predicted)\n", loss,
                       exp(loss), bpb, counted);
        }
        free(kl.klds);
    }
    free(ids);
    free(text);
    tlm_tokenizer_free(tok);
    tlm_model_free(m);
    tlm_model_free(base);
    return rc;
}

int cmd_eval(int argc, char **argv) {
    cli_lora lora = {0};
    int rc = eval_main(argc, argv, &lora);
    cli_lora_free(&lora);
    return rc;
}
