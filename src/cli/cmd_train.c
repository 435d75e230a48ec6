#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "core/core.h"

static const char *train_help =
    "usage: tlm train -c CONFIG.json --data TEXT [-z TOKENIZER | --char] -o OUTDIR [options]\n\n"
    "Trains a model on a text file. The text is tokenized once into OUTDIR/tokens.bin; the last\n"
    "--val-fraction of it is held out for validation. OUTDIR receives model.safetensors,\n"
    "checkpoint.safetensors (with optimizer state), config.json, tokenizer/, log.jsonl, "
    "loss.svg.\n\n"
    "  -c, --config FILE      model config (JSON); without vocab_size the tokenizer's is used\n"
    "  --data FILE            training text\n"
    "  -z, --tokenizer PATH   tokenizer (tokenizer.bin, encoder.json+vocab.bpe dir, .gguf, tlm "
    "dir)\n"
    "  --char                 character-level vocabulary built from the text\n"
    "  -o, --out DIR          output directory\n"
    "  --steps N              optimizer steps (default 1000)\n"
    "  --batch B              sequences per step (default 16)\n"
    "  --seq-len T            tokens per sequence (default: context_length)\n"
    "  --lr LR                peak learning rate (default 1e-3)\n"
    "  --min-lr LR            final learning rate (default lr/10)\n"
    "  --warmup N             linear warmup steps (default 100)\n"
    "  --weight-decay W       AdamW decoupled weight decay (default 0.1)\n"
    "  --beta1 B1, --beta2 B2 AdamW betas (default 0.9, 0.95)\n"
    "  --clip C               clip the global gradient norm at C; 0 = off (default 1.0)\n"
    "  --val-fraction F       held-out fraction of the tokens (default 0.1)\n"
    "  --eval-interval N      evaluate every N steps (default 250)\n"
    "  --eval-batches N       validation batches per evaluation (default 100)\n"
    "  --log-interval N       log.jsonl line every N steps (default 10)\n"
    "  --init default|gpt2    initialization scheme (default: default)\n"
    "  --seed S               seed for init, batches and dropout (default 1337)\n"
    "  -t, --threads N        threads (default: all cores)\n"
    "  --precision P          fp32 or bf16: matrix products on bf16 operands with fp32\n"
    "                         accumulation (needs AVX-512 BF16; default fp32)\n"
    "  --resume               continue from OUTDIR/checkpoint.safetensors, bit for bit\n";

static volatile int g_stop = 0;
static void on_sigint(int sig) {
    (void)sig;
    g_stop = 1;
}

typedef struct {
    int tty;
    long last_printed;
} progress_state;

static int on_progress(void *user, const tlm_train_progress *p) {
    progress_state *ps = user;
    int show = ps->tty || p->step == p->total || p->step % 10 == 0 || !isnan(p->val_loss);
    if (!show) return 0;
    double rate = p->steps_this_run > 0 ? p->elapsed_s / (double)p->steps_this_run : 0;
    long eta = (long)(rate * (double)(p->total - p->step));
    char val[32] = "";
    if (!isnan(p->val_loss)) snprintf(val, sizeof val, " | val %.4f", (double)p->val_loss);
    fprintf(stderr,
            "%sstep %ld/%ld | loss %.4f%s | lr %.2e | norm %.3f | %.0f tok/s | ETA %ld:%02ld",
            ps->tty ? "\r\033[K" : "", p->step, p->total, (double)p->train_loss, val, p->lr,
            p->grad_norm, p->tokens_per_s, eta / 60, eta % 60);
    if (!ps->tty || !isnan(p->val_loss) || p->step == p->total) fputc('\n', stderr);
    fflush(stderr);
    ps->last_printed = p->step;
    return 0;
}

static int config_has_key(const char *path, const char *key) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    cJSON *o = cJSON_Parse(buf);
    int has = o && cJSON_GetObjectItemCaseSensitive(o, key) != NULL;
    cJSON_Delete(o);
    return has;
}

/* The token cache is reused when its sidecar names the same text (size, mtime) and vocabulary. */
static int cache_matches(const char *meta_path, const char *expect) {
    FILE *f = fopen(meta_path, "rb");
    if (!f) return 0;
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return strcmp(buf, expect) == 0;
}

static int prepare_tokens(const char *data, const char *out_dir, tlm_tokenizer *tok,
                          char **tokens_path) {
    struct stat st;
    if (stat(data, &st) != 0) return cli_fail("train: cannot read data file '%s'", data);
    char expect[4096];
    snprintf(expect, sizeof expect,
             "{\"source\": \"%s\", \"size\": %lld, \"mtime\": %lld, "
             "\"vocab_size\": %d, \"kind\": \"%s\"}\n",
             data, (long long)st.st_size, (long long)st.st_mtime, tlm_tokenizer_vocab_size(tok),
             tlm_tokenizer_kind_name(tlm_tokenizer_get_kind(tok)));
    char *path = tlm_path_join(out_dir, "tokens.bin"),
         *meta = tlm_path_join(out_dir, "tokens.json");
    *tokens_path = path;
    if (cache_matches(meta, expect) && access(path, R_OK) == 0) {
        free(meta);
        return 0;
    }
    FILE *f = fopen(data, "rb");
    if (!f) {
        free(meta);
        return cli_fail("train: cannot read data file '%s'", data);
    }
    char *text = malloc((size_t)st.st_size + 1);
    size_t len = text ? fread(text, 1, (size_t)st.st_size, f) : 0;
    fclose(f);
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = 0;
    fprintf(stderr, "tokenizing %s (%zu bytes)...\n", data, len);
    if (!text)
        rc = cli_fail("train: out of memory reading '%s'", data);
    else if (tlm_tokenizer_encode(tok, text, len, TLM_ENCODE_ALLOW_SPECIAL, &ids, &n))
        rc = cli_fail_status("train: tokenizing the data");
    else if (tlm_tokens_write(path, ids, n, tlm_tokenizer_vocab_size(tok)))
        rc = cli_fail_status("train: writing tokens");
    else if (tlm_write_file_atomic(meta, expect, strlen(expect)))
        rc = cli_fail_status("train: writing token cache metadata");
    else
        fprintf(stderr, "%zu tokens (%.2f bytes per token)\n", n, n ? (double)len / n : 0.0);
    free(text);
    free(ids);
    free(meta);
    return rc;
}

int cmd_train(int argc, char **argv) {
    const char *config = NULL, *data = NULL, *tokenizer = NULL, *out = NULL, *init = "default";
    int use_char = 0, threads = 0;
    double val_fraction = 0.1, min_lr = -1;
    tlm_train_opts o;
    tlm_train_defaults(&o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        double x;
        long k;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(train_help, stdout);
            return 0;
        }
#define NEED()                                                                                     \
    do {                                                                                           \
        if (!v) return cli_fail("train: %s needs a value", a);                                     \
    } while (0)
#define INT_FLAG(name, alt, dst, minv)                                                             \
    if (cli_flag_value(argc, argv, &i, name, alt, &v)) {                                           \
        NEED();                                                                                    \
        if (!cli_parse_int(v, &k) || k < (minv))                                                   \
            return cli_fail("train: %s must be an integer >= %d (got '%s')", a, (int)(minv), v);   \
        dst = k;                                                                                   \
        continue;                                                                                  \
    }
#define FLOAT_FLAG(name, dst, lo, hi)                                                              \
    if (cli_flag_value(argc, argv, &i, name, NULL, &v)) {                                          \
        NEED();                                                                                    \
        if (!cli_parse_float(v, &x) || !(x >= (lo) && x <= (hi)))                                  \
            return cli_fail("train: %s must be a number in [%g, %g] (got '%s')", a, (double)(lo),  \
                            (double)(hi), v);                                                      \
        dst = x;                                                                                   \
        continue;                                                                                  \
    }
        if (cli_flag_value(argc, argv, &i, "-c", "--config", &v)) {
            NEED();
            config = v;
            continue;
        }
        if (cli_flag_value(argc, argv, &i, "--data", NULL, &v)) {
            NEED();
            data = v;
            continue;
        }
        if (cli_flag_value(argc, argv, &i, "-z", "--tokenizer", &v)) {
            NEED();
            tokenizer = v;
            continue;
        }
        if (cli_flag_value(argc, argv, &i, "-o", "--out", &v)) {
            NEED();
            out = v;
            continue;
        }
        if (cli_flag_value(argc, argv, &i, "--init", NULL, &v)) {
            NEED();
            if (strcmp(v, "default") && strcmp(v, "gpt2"))
                return cli_fail("train: --init must be default or gpt2 (got '%s')", v);
            init = v;
            continue;
        }
        if (!strcmp(a, "--char")) {
            use_char = 1;
            continue;
        }
        if (cli_flag_value(argc, argv, &i, "--precision", NULL, &v)) {
            NEED();
            if (tlm_precision_parse(v, &o.precision) != TLM_OK)
                return cli_fail("train: --precision must be fp32 or bf16 (got '%s')", v);
            if (o.precision == TLM_PRECISION_BF16 && !tlm_bf16_supported())
                return cli_fail("train: --precision bf16 needs a CPU with AVX-512 BF16 "
                                "(avx512_bf16); this one has none: use fp32");
            continue;
        }
        if (!strcmp(a, "--resume")) {
            o.resume = 1;
            continue;
        }
        INT_FLAG("--steps", NULL, o.steps, 1)
        INT_FLAG("--batch", NULL, o.batch, 1)
        INT_FLAG("--seq-len", NULL, o.seq_len, 1)
        INT_FLAG("--warmup", NULL, o.warmup, 0)
        INT_FLAG("--eval-interval", NULL, o.eval_interval, 0)
        INT_FLAG("--eval-batches", NULL, o.eval_batches, 0)
        INT_FLAG("--log-interval", NULL, o.log_interval, 0)
        INT_FLAG("-t", "--threads", threads, 1)
        if (cli_flag_value(argc, argv, &i, "--seed", NULL, &v)) {
            NEED();
            if (!cli_parse_int(v, &k) || k < 0)
                return cli_fail("train: --seed must be a non-negative integer (got '%s')", v);
            o.seed = (uint64_t)k;
            continue;
        }
        FLOAT_FLAG("--lr", o.lr, 0, 10)
        FLOAT_FLAG("--min-lr", min_lr, 0, 10)
        FLOAT_FLAG("--weight-decay", o.adam.weight_decay, 0, 10)
        FLOAT_FLAG("--beta1", o.adam.beta1, 0, 0.999999)
        FLOAT_FLAG("--beta2", o.adam.beta2, 0, 0.999999999)
        FLOAT_FLAG("--clip", o.clip, 0, 1e9)
        FLOAT_FLAG("--val-fraction", val_fraction, 0, 0.9)
        return cli_fail("train: unknown option '%s' (see tlm train --help)", a);
#undef NEED
#undef INT_FLAG
#undef FLOAT_FLAG
    }
    o.min_lr = min_lr >= 0 ? min_lr : o.lr / 10;
    if (!out) return cli_fail("train: -o OUTDIR is required");
    if (!data) return cli_fail("train: --data TEXT is required");
    if (use_char && tokenizer) return cli_fail("train: give -z TOKENIZER or --char, not both");
    if (access(data, R_OK) != 0) return cli_fail("train: cannot read data file '%s'", data);
    if (o.warmup >= o.steps && o.warmup > 0)
        return cli_fail("train: --warmup %ld must be below --steps %ld", o.warmup, o.steps);
    if (mkdir(out, 0755) != 0 && access(out, W_OK) != 0)
        return cli_fail("train: cannot create output directory '%s'", out);
    char cfg_copy[4096], tok_dir[4096], ckpt[4096];
    snprintf(cfg_copy, sizeof cfg_copy, "%s/config.json", out);
    snprintf(tok_dir, sizeof tok_dir, "%s/tokenizer", out);
    snprintf(ckpt, sizeof ckpt, "%s/checkpoint.safetensors", out);
    if (o.resume && access(ckpt, R_OK) != 0)
        return cli_fail("train: --resume but '%s' does not exist", ckpt);
    if (!config && o.resume) config = cfg_copy;
    if (!config) return cli_fail("train: -c CONFIG is required");
    if (!tokenizer && !use_char && !o.resume) return cli_fail("train: give -z TOKENIZER or --char");
    tlm_set_threads(threads);

    tlm_config c;
    if (tlm_config_load(config, &c)) return cli_fail_status("train");
    if (o.seq_len > c.context_length)
        return cli_fail("train: --seq-len %d exceeds the model's context_length %d", o.seq_len,
                        c.context_length);
    tlm_tokenizer *tok = NULL;
    if (o.resume && !tokenizer && !use_char) {
        if (tlm_tokenizer_load(tok_dir, &tok)) return cli_fail_status("train: loading tokenizer");
    } else if (tokenizer) {
        if (tlm_tokenizer_load(tokenizer, &tok)) return cli_fail_status("train: loading tokenizer");
    } else {
        char *text;
        size_t len;
        if (tlm_read_file(data, &text, &len)) return cli_fail_status("train");
        tlm_status s = tlm_tokenizer_char_from_text(text, len, &tok);
        free(text);
        if (s) return cli_fail_status("train: building the character vocabulary");
    }
    int32_t tv = tlm_tokenizer_vocab_size(tok);
    if (!config_has_key(config, "vocab_size")) {
        c.vocab_size = tv;
    } else if (c.vocab_size < tv) {
        tlm_tokenizer_free(tok);
        return cli_fail("train: config vocab_size %d is smaller than the tokenizer's %d",
                        c.vocab_size, tv);
    }
    if (tlm_config_finalize(&c)) {
        tlm_tokenizer_free(tok);
        return cli_fail_status("train");
    }
    char *tokens_path = NULL;
    if (prepare_tokens(data, out, tok, &tokens_path)) {
        tlm_tokenizer_free(tok);
        return 1;
    }
    int rc = 0;
    tlm_dataset *ds = NULL;
    tlm_model *m = NULL;
    if (tlm_dataset_open(tokens_path, val_fraction, &ds))
        rc = cli_fail_status("train");
    else if (tlm_model_create(&c, &m))
        rc = cli_fail_status("train");
    else if (tlm_model_init(m, o.seed, strcmp(init, "gpt2") ? TLM_INIT_DEFAULT : TLM_INIT_GPT2))
        rc = cli_fail_status("train");
    else if (tlm_config_save(&c, cfg_copy))
        rc = cli_fail_status("train: saving config");
    else if (tlm_tokenizer_save(tok, tok_dir))
        rc = cli_fail_status("train: saving tokenizer");
    if (!rc) {
        tlm_param_count pc;
        tlm_count_params(&c, &pc);
        fprintf(stderr,
                "model: %zu parameters (%zu non-embedding); %zu training / %zu validation tokens; "
                "%d threads\n",
                pc.total, pc.non_embedding, tlm_dataset_size(ds, TLM_SPLIT_TRAIN),
                tlm_dataset_size(ds, TLM_SPLIT_VAL), tlm_get_threads());
        if (o.precision == TLM_PRECISION_BF16)
            fprintf(stderr, "precision: bf16 matrix products, fp32 accumulation, weights and "
                            "optimizer\n");
        progress_state ps = {isatty(2), 0};
        o.out_dir = out;
        o.on_progress = on_progress;
        o.user = &ps;
        o.stop = &g_stop;
        signal(SIGINT, on_sigint);
        tlm_status s = tlm_train_run(m, ds, &o);
        signal(SIGINT, SIG_DFL);
        if (s == TLM_ERR_INTERRUPTED) {
            fprintf(stderr, "\ntlm: %s\n", tlm_last_error());
            rc = 130;
        } else if (s) {
            if (ps.tty) fputc('\n', stderr);
            rc = cli_fail_status("train");
        } else {
            fprintf(stderr, "saved %s/model.safetensors\n", out);
        }
    }
    tlm_model_free(m);
    tlm_dataset_free(ds);
    tlm_tokenizer_free(tok);
    free(tokens_path);
    return rc;
}
