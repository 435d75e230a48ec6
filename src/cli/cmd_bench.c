/* tlm bench: prompt-processing and generation speed of a model, measured the way llama-bench
 * measures them (a warm-up pass, then repetitions on a fresh cache; mean and standard deviation of
 * the rates), so that the two tools' figures compare directly. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli.h"

static const char *bench_help =
    "usage: tlm bench -m MODEL [-p N,...] [-n N,...] [-d D,...] [-t T,...] [-b B,...] [-r REPS]\n"
    "                 [-o md|json]\n\n"
    "Measures prompt processing (ppN: one prefill of N tokens) and generation (tgN: N decode\n"
    "steps of one token each, from an empty cache) as llama-bench does: one warm-up run, then "
    "REPS\n"
    "runs, each on a fresh cache with random token ids; reports the mean rate and its standard\n"
    "deviation. Lists are comma-separated; every combination runs.\n\n"
    "  -m, --model PATH       a model tlm reads (GGUF of any supported type, checkpoint, ...)\n"
    "  -p, --n-prompt N,...   prompt lengths (default 512; 0 skips prompt tests)\n"
    "  -n, --n-gen N,...      generated tokens (default 128; 0 skips generation tests)\n"
    "  -d, --n-depth D,...    tokens already in the cache when each test starts (default 0):\n"
    "                         a prefill of D random ids into every sequence, not timed, as\n"
    "                         llama-bench's -d (tests read 'tg128 @ d512'; json: n_depth)\n"
    "  -t, --threads T,...    thread counts (default: tlm's default)\n"
    "  -b, --batch B,...      sequences decoded together in tgN (default 1; B > 1 is what\n"
    "                         tlm serve's continuous batching does: the rate is B*N / time)\n"
    "  -r, --repetitions R    runs per test after the warm-up (default 5)\n"
    "  -o, --output FMT       md (a table, default) or json\n"
    "  --mmap / --no-mmap     map the file, or read it into memory on 2 MiB pages (the\n"
    "                         default, as tlm serve does, where it takes at most half the\n"
    "                         memory available; json: use_mmap)\n"
    "  --precision P          auto, fp32 or bf16: the type of the products (as tlm generate)\n"
    "  --cache-type T         the KV cache's type: f16 (default), f32, bf16, q8_0, q5_1, q5_0,\n"
    "                         iq4_nl, q4_1, q4_0 (as tlm generate; -ctk and -ctv, equal, "
    "too)\n" CLI_LORA_HELP;

#define MAX_LIST 16

typedef struct {
    uint64_t s;
} rng64;

static int32_t rand_id(rng64 *r, int vocab) {
    r->s = r->s * 6364136223846793005ull + 1442695040888963407ull;
    return (int32_t)((r->s >> 33) % (uint64_t)vocab);
}

/* A fresh cache holding `depth` random ids in each of the session's sequences (not timed). */
static tlm_status fill(tlm_session *s, int depth, int vocab, rng64 *r, int32_t *ids) {
    tlm_session_reset(s, -1);
    for (int b = 0; b < tlm_session_batch(s) && depth > 0; b++) {
        for (int i = 0; i < depth; i++) ids[i] = rand_id(r, vocab);
        tlm_status st = tlm_session_prefill(s, b, ids, depth, NULL, 0);
        if (st) return st;
    }
    return TLM_OK;
}

/* One prompt-processing run: seconds for a prefill of n random ids after `depth` cached ones. */
static tlm_status run_pp(tlm_session *s, int n, int depth, int vocab, rng64 *r, int32_t *ids,
                         float *logits, double *sec) {
    tlm_status st = fill(s, depth, vocab, r, ids);
    if (st) return st;
    for (int i = 0; i < n; i++) ids[i] = rand_id(r, vocab);
    double t = cli_now();
    st = tlm_session_prefill(s, 0, ids, n, logits, 0);
    *sec = cli_now() - t;
    return st;
}

/* One generation run: seconds for n decode steps of every sequence after `depth` cached ids. */
static tlm_status run_tg(tlm_session *s, int n, int depth, int batch, int vocab, rng64 *r,
                         int32_t *ids, float *logits, double *sec) {
    tlm_status st = fill(s, depth, vocab, r, ids);
    if (st) return st;
    double t = cli_now();
    for (int k = 0; k < n; k++) {
        for (int b = 0; b < batch; b++) ids[b] = rand_id(r, vocab);
        if ((st = tlm_session_decode(s, ids, NULL, logits))) return st;
    }
    *sec = cli_now() - t;
    return TLM_OK;
}

static void mean_sd(const double *x, int n, double *mean, double *sd) {
    double m = 0, v = 0;
    for (int i = 0; i < n; i++) m += x[i];
    m /= n;
    for (int i = 0; i < n; i++) v += (x[i] - m) * (x[i] - m);
    *mean = m;
    *sd = n > 1 ? sqrt(v / (n - 1)) : 0.0;
}

static const char *base_name(const char *p) {
    const char *s = strrchr(p, '/');
    /* A directory given with a trailing slash keeps its last component. */
    if (s && s[1] == '\0') {
        while (s > p && s[-1] != '/') s--;
        return s;
    }
    return s ? s + 1 : p;
}

static int bench_main(int argc, char **argv, cli_lora *lora) {
    const char *model_path = NULL, *fmt = "md", *precision = NULL;
    cli_cache cache = CLI_CACHE_DEFAULT;
    int ck;
    long pp[MAX_LIST] = {512}, tg[MAX_LIST] = {128}, th[MAX_LIST] = {0}, bs[MAX_LIST] = {1};
    long dp[MAX_LIST] = {0};
    int n_pp = 1, n_tg = 1, n_th = 1, n_bs = 1, n_dp = 1, map_mode = CLI_MAP_AUTO;
    long reps = 5;
    for (int i = 1; i < argc; i++) {
        const char *v, *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(bench_help, stdout);
            return 0;
        } else if (cli_map_flag(a, &map_mode)) {
            continue;
        }
        if (cli_flag_value(argc, argv, &i, "-m", "--model", &v)) {
            if (!v) return cli_fail("bench: %s needs a value", a);
            model_path = v;
        } else if (cli_flag_value(argc, argv, &i, "-p", "--n-prompt", &v)) {
            if (!v || !(n_pp = cli_parse_int_list(v, 0, 1 << 20, pp, MAX_LIST)))
                return cli_fail("bench: -p wants counts >= 0 separated by commas, got '%s'",
                                v ? v : "");
        } else if (cli_flag_value(argc, argv, &i, "-n", "--n-gen", &v)) {
            if (!v || !(n_tg = cli_parse_int_list(v, 0, 1 << 20, tg, MAX_LIST)))
                return cli_fail("bench: -n wants counts >= 0 separated by commas, got '%s'",
                                v ? v : "");
        } else if (cli_flag_value(argc, argv, &i, "-d", "--n-depth", &v)) {
            if (!v || !(n_dp = cli_parse_int_list(v, 0, 1 << 20, dp, MAX_LIST)))
                return cli_fail("bench: -d wants depths >= 0 separated by commas, got '%s'",
                                v ? v : "");
        } else if (cli_flag_value(argc, argv, &i, "-t", "--threads", &v)) {
            if (!v || !(n_th = cli_parse_int_list(v, 1, 4096, th, MAX_LIST)))
                return cli_fail("bench: -t wants thread counts >= 1 separated by commas, got '%s'",
                                v ? v : "");
        } else if (cli_flag_value(argc, argv, &i, "-b", "--batch", &v)) {
            if (!v || !(n_bs = cli_parse_int_list(v, 1, 4096, bs, MAX_LIST)))
                return cli_fail("bench: -b wants batch sizes >= 1 separated by commas, got '%s'",
                                v ? v : "");
        } else if (cli_flag_value(argc, argv, &i, "-r", "--repetitions", &v)) {
            if (!v || !cli_parse_int(v, &reps) || reps < 1 || reps > 100000)
                return cli_fail("bench: -r wants a count >= 1, got '%s'", v ? v : "");
        } else if (cli_flag_value(argc, argv, &i, "--precision", NULL, &v)) {
            if (!v) return cli_fail("bench: --precision needs a value");
            precision = v;
        } else if ((ck = cli_cache_flag("bench", argc, argv, &i, &cache)) != 0) {
            if (ck < 0) return 1;
        } else if ((ck = cli_lora_flag("bench", argc, argv, &i, lora)) != 0) {
            if (ck < 0) return 1;
        } else if (cli_flag_value(argc, argv, &i, "-o", "--output", &v)) {
            if (!v || (strcmp(v, "md") && strcmp(v, "json")))
                return cli_fail("bench: -o wants md or json, got '%s'", v ? v : "");
            fmt = v;
        } else {
            return cli_fail("bench: unknown option '%s' (see tlm bench --help)", a);
        }
    }
    if (!model_path) return cli_fail("bench: -m MODEL is required (see tlm bench --help)");

    tlm_model *m = NULL;
    unsigned lf;
    int read = cli_read_mode(model_path, map_mode);
    if (!cli_load_flags("bench", read, precision, &lf)) return 1;
    if (tlm_model_load(model_path, lf, &m)) return cli_fail_status("bench");
    if (lora->n && cli_lora_load("bench", lora, m)) {
        tlm_model_free(m);
        return 1;
    }
    const tlm_config *c = tlm_model_config(m);
    int max_len = 1, max_b = 1, max_d = 0;
    for (int i = 0; i < n_pp; i++) max_len = pp[i] > max_len ? (int)pp[i] : max_len;
    for (int i = 0; i < n_tg; i++) max_len = tg[i] > max_len ? (int)tg[i] : max_len;
    for (int i = 0; i < n_dp; i++) max_d = dp[i] > max_d ? (int)dp[i] : max_d;
    max_len += max_d;
    for (int i = 0; i < n_bs; i++) max_b = bs[i] > max_b ? (int)bs[i] : max_b;
    if (max_len > c->context_length) {
        int ctx = c->context_length; /* c belongs to m */
        tlm_model_free(m);
        return cli_fail("bench: a test needs %d positions, the model's context is %d", max_len,
                        ctx);
    }
    /* Weight bytes as the model holds them (the file's types), and the parameter count. */
    size_t bytes = 0, params = 0;
    int nt = 0;
    tlm_model_tensors(m, &nt);
    for (int i = 0; i < nt; i++) {
        const tlm_weight *w = tlm_model_weight(m, i);
        if (!w || !w->data) continue;
        bytes += (size_t)w->rows * w->row_bytes;
        params += (size_t)(w->rows * w->cols);
    }

    int rc = 1;
    int32_t *ids = malloc((size_t)(max_len > max_b ? max_len : max_b) * sizeof *ids);
    float *logits = malloc((size_t)max_b * (size_t)c->vocab_size * sizeof *logits);
    double *rate = malloc((size_t)reps * sizeof *rate);
    tlm_session *sess[2] = {NULL, NULL}; /* batch 1 for prompts, reused per batch size */
    cJSON *json = strcmp(fmt, "json") ? NULL : cJSON_CreateArray();
    rng64 r = {0x9e3779b97f4a7c15ull};
    if (!ids || !logits || !rate) {
        cli_fail("bench: out of memory");
        goto done;
    }
    /* a cache type other than the default gets llama-bench's type_k and type_v columns */
    int kvcols = cache.k != TLM_DTYPE_F16 || cache.v != TLM_DTYPE_F16;
    if (!json) {
        printf("| %-24s | %10s | %8s | %7s | %5s |%s %16s | %20s |\n", "model", "size", "params",
               "threads", "batch", kvcols ? " type_k | type_v |" : "", "test", "t/s");
        printf("| %.24s | %.10s | %.8s | %.7s | %.5s |%s %.16s | %.20s |\n",
               "-------------------------", "-----------", "---------", "--------", "------",
               kvcols ? " -----: | -----: |" : "", "-----------------", "---------------------");
        fflush(stdout);
    }
    for (int ti_ = 0; ti_ < n_th; ti_++) {
        if (th[ti_]) tlm_threads_set((int)th[ti_]);
        int threads = tlm_threads_get();
        /* Tests: prompts at batch 1, then generation at each batch size. */
        for (int kind = 0; kind < 2; kind++) {
            int n_len = kind ? n_tg : n_pp;
            for (int bi = 0; bi < (kind ? n_bs : 1); bi++) {
                int B = kind ? (int)bs[bi] : 1;
                for (int li = 0; li < n_len * n_dp; li++) {
                    int n = (int)(kind ? tg[li / n_dp] : pp[li / n_dp]), depth = (int)dp[li % n_dp];
                    if (n == 0) continue;
                    tlm_session **sp = &sess[kind];
                    if (*sp && tlm_session_batch(*sp) != B) {
                        tlm_session_free(*sp);
                        *sp = NULL;
                    }
                    tlm_session_opts so = {.batch = B, .capacity = max_len};
                    cli_cache_opts(&cache, &so);
                    if (!*sp && (tlm_session_new(m, &so, sp) ||
                                 tlm_session_set_loras(*sp, (const tlm_lora *const *)lora->lora,
                                                       lora->scale, lora->n))) {
                        cli_fail_status("bench: session");
                        goto done;
                    }
                    double sec;
                    /* The warm-up touches the cache, the scratch and the weights' pages once. */
                    int V = c->vocab_size;
                    tlm_status st =
                        kind ? run_tg(*sp, n < 4 ? n : 4, depth, B, V, &r, ids, logits, &sec)
                             : run_pp(*sp, n, depth, V, &r, ids, logits, &sec);
                    for (long k = 0; !st && k < reps; k++) {
                        st = kind ? run_tg(*sp, n, depth, B, V, &r, ids, logits, &sec)
                                  : run_pp(*sp, n, depth, V, &r, ids, logits, &sec);
                        rate[k] = (double)n * B / (sec > 0 ? sec : 1e-9);
                    }
                    if (st) {
                        cli_fail_status("bench");
                        goto done;
                    }
                    double mean, sd;
                    mean_sd(rate, (int)reps, &mean, &sd);
                    char test[48];
                    if (depth)
                        snprintf(test, sizeof test, "%s%d @ d%d", kind ? "tg" : "pp", n, depth);
                    else
                        snprintf(test, sizeof test, "%s%d", kind ? "tg" : "pp", n);
                    if (json) {
                        cJSON *o = cJSON_CreateObject();
                        cJSON_AddStringToObject(o, "model", model_path);
                        cJSON_AddNumberToObject(o, "model_size", (double)bytes);
                        cJSON_AddNumberToObject(o, "model_n_params", (double)params);
                        cJSON_AddNumberToObject(o, "n_threads", threads);
                        cJSON_AddNumberToObject(o, "n_batch_seqs", B);
                        /* llama-bench's names for the cache's types */
                        cJSON_AddStringToObject(o, "type_k", cli_cache_type_name(cache.k));
                        cJSON_AddStringToObject(o, "type_v", cli_cache_type_name(cache.v));
                        cJSON_AddBoolToObject(o, "use_mmap", !read);
                        cJSON_AddNumberToObject(o, "n_prompt", kind ? 0 : n);
                        cJSON_AddNumberToObject(o, "n_gen", kind ? n : 0);
                        cJSON_AddNumberToObject(o, "n_depth", depth);
                        cJSON_AddStringToObject(o, "cpu_kernels", tlm_cpu_kernels());
                        cJSON_AddNumberToObject(o, "avg_ts", mean);
                        cJSON_AddNumberToObject(o, "stddev_ts", sd);
                        cJSON *all = cJSON_AddArrayToObject(o, "samples_ts");
                        for (long k = 0; k < reps; k++)
                            cJSON_AddItemToArray(all, cJSON_CreateNumber(rate[k]));
                        cJSON_AddItemToArray(json, o);
                    } else {
                        char size[32], np[32], ts[48];
                        snprintf(size, sizeof size, "%.2f MiB", bytes / 1048576.0);
                        snprintf(np, sizeof np, "%.2f M", params / 1e6);
                        snprintf(ts, sizeof ts, "%.2f ± %.2f", mean, sd);
                        char kv[40] = "";
                        if (kvcols)
                            snprintf(kv, sizeof kv, " %6s | %6s |", cli_cache_type_name(cache.k),
                                     cli_cache_type_name(cache.v));
                        printf("| %-24.24s | %10s | %8s | %7d | %5d |%s %16s | %20s |\n",
                               base_name(model_path), size, np, threads, B, kv, test, ts);
                        fflush(stdout);
                    }
                }
            }
        }
    }
    if (json) {
        char *s = cJSON_Print(json);
        puts(s);
        free(s);
    } else {
        printf("\nkernels: %s\n", tlm_cpu_kernels()); /* as llama-bench's closing lines */
    }
    rc = 0;
done:
    cJSON_Delete(json);
    tlm_session_free(sess[0]);
    tlm_session_free(sess[1]);
    free(ids);
    free(logits);
    free(rate);
    tlm_model_free(m);
    return rc;
}

int cmd_bench(int argc, char **argv) {
    cli_lora lora = {0};
    int rc = bench_main(argc, argv, &lora);
    cli_lora_free(&lora);
    return rc;
}
