#include <dirent.h>
#include <glob.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "core/core.h"
#include "dist/dist.h"

static const char *train_help =
    "usage: tlm train -c CONFIG.json --data TEXT|SHARDS [-z TOKENIZER | --char] -o OUTDIR "
    "[options]\n\n"
    "Trains a model on a text file. The text is tokenized once into OUTDIR/tokens.bin; the last\n"
    "--val-fraction of it is held out for validation. OUTDIR receives model.safetensors,\n"
    "checkpoint.safetensors (with optimizer state), config.json, tokenizer/, log.jsonl, "
    "loss.svg.\n\n"
    "  -c, --config FILE      model config (JSON); without vocab_size the tokenizer's is used\n"
    "  --data PATH            training text, or token shards: a shard file (tlm's tokens.bin or\n"
    "                         llm.c's .bin), a directory of .bin shards, or a quoted glob\n"
    "  --val-data PATH        validation text or shards (default: --val-fraction of --data)\n"
    "  -z, --tokenizer PATH   tokenizer (tokenizer.bin, encoder.json+vocab.bpe dir, .gguf, tlm "
    "dir)\n"
    "  --char                 character-level vocabulary built from the text\n"
    "  -o, --out DIR          output directory\n"
    "  --steps N              optimizer steps (default 1000)\n"
    "  --batch B              sequences per optimizer step, over all processes (default 16)\n"
    "  --grad-accum K         micro-steps per optimizer step: B / (processes x K) sequences a\n"
    "                         pass, the same data and loss curve as one pass (default 1)\n"
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
    "  --init gpt2|xavier     initialization (default gpt2): gpt2 is N(0, 0.02) with the block\n"
    "                         output projections / sqrt(2 n_layers), as GPT-2, nanoGPT and llm.c;\n"
    "                         xavier is truncated normal of variance 2/(fan_in+fan_out) with\n"
    "                         unit-variance embeddings (starts far above ln(vocab) when tied)\n"
    "  --seed S               seed for init, batches and dropout (default 1337)\n"
    "  -t, --threads N        threads (default: all cores)\n"
    "  --precision P          auto, fp32 or bf16: bf16 runs the matrix products on bf16\n"
    "                         operands with fp32 accumulation (needs AVX-512 BF16); auto\n"
    "                         (default) is bf16 where the CPU has it, else fp32\n"
    "  --resume               continue from OUTDIR/checkpoint.safetensors, bit for bit (also\n"
    "                         with a different number of processes or another precision)\n\n"
    "Under mpirun (mpirun -np N tlm train ...) the N processes train one model: each takes its\n"
    "share of every batch, gradients are reduce-scattered, each process updates its 1/N of the\n"
    "parameters with its 1/N of the AdamW moments, and the parameters are all-gathered.\n";

static const char *finetune_help =
    "usage: tlm finetune -m BASE --data TEXT|SHARDS [-z TOKENIZER] -o OUTDIR [options]\n\n"
    "Adapts a model to a text: LoRA by default (BASE frozen in its own type, GGUF of any type tlm\n"
    "computes on, safetensors, Hugging Face or llama2.c; a quantized BASE makes it QLoRA), or "
    "every\n"
    "parameter with --full. OUTDIR receives adapter.gguf (llama.cpp's --lora) and peft/ (PEFT's\n"
    "adapter_config.json and adapter_model.safetensors), or with --full model.safetensors and\n"
    "config.json; and checkpoint.safetensors, log.jsonl, loss.svg, tokenizer/.\n\n"
    "  -m, --model BASE       the model to adapt; its tokenizer is used unless -z gives one\n"
    "  --lora-rank R          rank of each adapter matrix (default 16)\n"
    "  --lora-alpha A         scale numerator: s = A / R (default 2R)\n"
    "  --lora-dropout P       dropout on each adapter's input (default 0)\n"
    "  --rslora               s = A / sqrt(R) (rank-stabilized LoRA)\n"
    "  --lora-targets LIST    q,k,v,o,gate,up,down (default: every linear layer of the blocks);\n"
    "                         all adds the output head\n"
    "  --full                 train every parameter, starting from BASE's weights\n\n"
    "Instruction data: --data (and --val-data) may be JSON Lines, one example a line, as TRL\n"
    "reads them: {\"text\"}, {\"prompt\", \"completion\"}, {\"messages\": [{\"role\", "
    "\"content\"}]}\n"
    "(a .jsonl file, or any file whose first character is '{'). Examples are whole rows: one a\n"
    "row, or packed several to a row of --seq-len tokens, none attending to another.\n"
    "  --format F             text, completion, chat or dpo (default: from the first line)\n"
    "  --loss-on L            all, assistant or completion: the tokens the loss is on (default:\n"
    "                         a completion; a chat's assistant turns and their end-of-turn)\n"
    "  --chat-template NAME   chatml, llama2, llama3, mistral, gemma, phi3 or mistral-nemo,\n"
    "                         as tlm serve renders them (default: BASE's GGUF template if\n"
    "                         recognised, else chatml)\n"
    "  --max-len N            tokens per example; longer ones are cut (default: --seq-len)\n"
    "  --truncate keep-start|keep-end  which end of a long example to keep (default keep-start)\n"
    "  --skip-bad             count malformed lines and go on (default: stop, naming the line)\n"
    "  --pack, --no-pack      pack examples into rows (default: on when the median example is at\n"
    "                         most half a row)\n"
    "Preference pairs, {\"prompt\", \"chosen\", \"rejected\"} (strings or lists of messages), "
    "train\n"
    "with DPO (TRL's sigmoid loss); --batch counts pairs; the reference is BASE (LoRA: the\n"
    "adapter switched off, no second copy; --full: BASE loaded again, frozen):\n"
    "  --beta B               DPO's beta (default 0.1)\n"
    "  --label-smoothing E    the chance a pair's preference is wrong (default 0)\n"
    "  --rpo-alpha A          add A x the chosen answers' cross-entropy (TRL's rpo_alpha; 0: off)\n"
    "  --precompute-ref       the reference's log-probabilities once, before training\n"
    "DPO's default --lr is 5e-5 with LoRA, 1e-6 (TRL's) with --full.\n\n"
    "Defaults that differ from tlm train: --lr 2e-4 (LoRA) or 2e-5 (--full), --warmup 0\n"
    "(a tenth of --steps, at most 100), --weight-decay 0, --beta2 0.999 (PEFT and Hugging Face's\n"
    "trainer), --seq-len min(context_length, 512). Every other option is tlm train's:\n\n";

static volatile int g_stop = 0;
/* MPI state of a run under mpirun; every process reaches dist_finish through cmd_train. */
static dist_state *g_dist = NULL;
static int g_rank = 0;
static int g_agreed = 0; /* every process knows of the failure and returns with it */
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
    if (g_rank != 0) return 0;
    int show = ps->tty || p->step == p->total || p->step % 10 == 0 || !isnan(p->val_loss);
    if (!show) return 0;
    double rate = p->steps_this_run > 0 ? p->elapsed_s / (double)p->steps_this_run : 0;
    long eta = (long)(rate * (double)(p->total - p->step));
    char val[32] = "";
    if (!isnan(p->val_loss)) snprintf(val, sizeof val, " | val %.4f", (double)p->val_loss);
    char pref[96] = "";
    const tlm_dpo_stats *d = p->val_dpo ? p->val_dpo : p->dpo;
    if (d && d->pairs)
        snprintf(pref, sizeof pref, " | %sreward acc %.2f margin %.3f", p->val_dpo ? "val " : "",
                 (double)d->correct / d->pairs, (d->chosen_reward - d->rejected_reward) / d->pairs);
    fprintf(stderr,
            "%sstep %ld/%ld | loss %.4f%s%s | lr %.2e | norm %.3f | %.0f tok/s | ETA %ld:%02ld",
            ps->tty ? "\r\033[K" : "", p->step, p->total, (double)p->train_loss, val, pref, p->lr,
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

/* Where the tokens come from: one text file (tokenized into OUTDIR), or token files used as they
 * are. */
typedef struct {
    char **paths;
    int n;
    int tokens; /* token files (tlm or llm.c), not text */
} data_src;

static data_src g_train_src, g_val_src; /* freed by cmd_train on every way out */

static void data_src_free(data_src *d) {
    for (int i = 0; i < d->n; i++) free(d->paths[i]);
    free(d->paths);
    memset(d, 0, sizeof *d);
}

static int data_src_add(data_src *d, const char *path) {
    char **np = realloc(d->paths, ((size_t)d->n + 1) * sizeof *np);
    if (!np) return 0;
    d->paths = np;
    d->paths[d->n] = strdup(path);
    return d->paths[d->n++] != NULL;
}

static int is_token_file(const char *path) {
    unsigned char head[8] = {0};
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(head, 1, sizeof head, f) : 0;
    if (f) fclose(f);
    if (n == 8 && !memcmp(head, "TLMTOKS1", 8)) return 1;
    uint32_t magic = (uint32_t)head[0] | (uint32_t)head[1] << 8 | (uint32_t)head[2] << 16 |
                     (uint32_t)head[3] << 24;
    return n >= 4 && magic == 20240520u; /* llm.c */
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A text file, one token file, every .bin file of a directory (sorted), or a glob's matches. */
static int resolve_data(const char *flag, const char *spec, data_src *d) {
    struct stat st;
    if (strpbrk(spec, "*?[") && stat(spec, &st) != 0) {
        glob_t g;
        int r = glob(spec, 0, NULL, &g);
        for (size_t i = 0; r == 0 && i < g.gl_pathc; i++)
            if (!data_src_add(d, g.gl_pathv[i])) r = -1;
        if (r == 0) globfree(&g);
        if (r != 0 || d->n == 0) return cli_fail("train: %s '%s' matches no file", flag, spec);
    } else if (stat(spec, &st) == 0 && S_ISDIR(st.st_mode)) {
        DIR *dir = opendir(spec);
        if (!dir) return cli_fail("train: cannot read directory '%s'", spec);
        for (struct dirent *e; (e = readdir(dir));) {
            size_t len = strlen(e->d_name);
            if (len < 5 || strcmp(e->d_name + len - 4, ".bin")) continue;
            char *path = core_path_join(spec, e->d_name);
            int ok = path && data_src_add(d, path);
            free(path);
            if (!ok) break;
        }
        closedir(dir);
        if (d->n == 0) return cli_fail("train: %s '%s' holds no .bin token shards", flag, spec);
        qsort(d->paths, (size_t)d->n, sizeof *d->paths, cmp_str);
    } else {
        if (access(spec, R_OK) != 0) return cli_fail("train: cannot read data file '%s'", spec);
        if (!data_src_add(d, spec)) return cli_fail("train: out of memory");
        d->tokens = is_token_file(spec);
        return 0;
    }
    for (int i = 0; i < d->n; i++)
        if (!is_token_file(d->paths[i]))
            return cli_fail("train: %s: '%s' is not a token shard (tlm's tokens.bin or llm.c's "
                            "format)",
                            flag, d->paths[i]);
    d->tokens = 1;
    return 0;
}

static int prepare_tokens(const char *data, const char *out_dir, const char *name,
                          tlm_tokenizer *tok, char **tokens_path) {
    struct stat st;
    if (stat(data, &st) != 0) return cli_fail("train: cannot read data file '%s'", data);
    char expect[4096];
    snprintf(expect, sizeof expect,
             "{\"source\": \"%s\", \"size\": %lld, \"mtime\": %lld, "
             "\"vocab_size\": %d, \"kind\": \"%s\"}\n",
             data, (long long)st.st_size, (long long)st.st_mtime, tlm_tokenizer_vocab_size(tok),
             tlm_tokenizer_kind_name(tlm_tokenizer_get_kind(tok)));
    char file[64];
    snprintf(file, sizeof file, "%s.bin", name);
    char *path = core_path_join(out_dir, file);
    snprintf(file, sizeof file, "%s.json", name);
    char *meta = core_path_join(out_dir, file);
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
    else if (tlm_dataset_write_tokens(path, ids, n, tlm_tokenizer_vocab_size(tok)))
        rc = cli_fail_status("train: writing tokens");
    else if (core_write_file_atomic(meta, expect, strlen(expect)))
        rc = cli_fail_status("train: writing token cache metadata");
    else
        fprintf(stderr, "%zu tokens (%.2f bytes per token)\n", n, n ? (double)len / n : 0.0);
    free(text);
    free(ids);
    free(meta);
    return rc;
}

static double peak_rss_mib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kib = strtod(line + 6, NULL);
    if (f) fclose(f);
    return kib / 1024.0;
}

/* What tlm finetune adds to tlm train's options. */
typedef struct {
    int on;           /* tlm finetune */
    const char *base; /* -m */
    int full;
    tlm_lora_opts lora;
    int lr_set, warmup_set, wd_set, beta2_set;
    tlm_examples_opts ex; /* JSON Lines data */
    int format_set, max_len_set;
    tlm_dpo_opts dpo;
    int precompute_ref;
    int pack; /* -1: by the examples' lengths */
} finetune_opts;

/* JSON Lines: a .jsonl or .json name, or a first character '{'. */
static int is_jsonl(const char *path) {
    size_t n = strlen(path);
    if ((n > 6 && !strcmp(path + n - 6, ".jsonl")) || (n > 5 && !strcmp(path + n - 5, ".json")))
        return 1;
    FILE *f = fopen(path, "rb");
    int c = ' ';
    while (f && (c == ' ' || c == '\n' || c == '\r' || c == '\t')) c = fgetc(f);
    if (f) fclose(f);
    return c == '{';
}

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* The examples' median length in tokens. */
static int median_len(const tlm_examples *e) {
    size_t n = tlm_examples_count(e);
    int *l = malloc((n ? n : 1) * sizeof *l);
    if (!l) return 0;
    for (size_t i = 0; i < n; i++) l[i] = tlm_examples_get(e, i, NULL, NULL);
    qsort(l, n, sizeof *l, cmp_int);
    int m = n ? l[n / 2] : 0;
    free(l);
    return m;
}

static const char *loss_on_text(const tlm_examples_opts *o, tlm_data_format f) {
    if (f == TLM_FORMAT_DPO) return "the chosen and rejected answers";
    if (o->loss_on == TLM_LOSS_ON_ALL || f == TLM_FORMAT_TEXT) return "every token";
    if (f == TLM_FORMAT_CHAT && o->loss_on == TLM_LOSS_ON_COMPLETION)
        return "the last assistant turn";
    if (f == TLM_FORMAT_CHAT) return "the assistant turns";
    return "the completions";
}

/* --data / --val-data as examples (rank 0 reports what it read); 1 on failure. */
static int load_examples(const finetune_opts *ft, const char *data, const char *val_data,
                         double val_fraction, const tlm_tokenizer *tok, int T, int rank,
                         tlm_examples **ex, tlm_examples **vex, int *pack) {
    tlm_examples_stats st, vst;
    if (!tok) return cli_fail("finetune: JSON Lines data needs a tokenizer (-z)");
    if (tlm_examples_load(data, tok, &ft->ex, ex, &st)) return cli_fail_status("finetune");
    if (val_data && tlm_examples_load(val_data, tok, &ft->ex, vex, &vst))
        return cli_fail_status("finetune: --val-data");
    if (!val_data && tlm_examples_split(*ex, val_fraction, vex)) return cli_fail_status("finetune");
    int med = median_len(*ex), pairs = tlm_examples_pairs(*ex);
    if (pairs && ft->pack == 1)
        return cli_fail("finetune: preference pairs are not packed (drop --pack)");
    *pack = pairs ? 0 : ft->pack >= 0 ? ft->pack : med * 2 <= T;
    if (rank != 0) return 0;
    fprintf(stderr,
            "examples: %ld kept of %ld lines (%s; loss on %s): %ld malformed skipped, %ld cut to "
            "%d tokens, %ld with nothing to learn skipped\n",
            st.examples, st.lines, tlm_data_format_name(st.format),
            loss_on_text(&ft->ex, st.format), st.bad, st.truncated, ft->ex.max_len, st.empty);
    if (st.format == TLM_FORMAT_CHAT || st.format == TLM_FORMAT_DPO)
        fprintf(stderr, "chat template: %s\n", ft->ex.chat_template);
    size_t per = pairs ? 2 : 1, nv = *vex ? tlm_examples_count(*vex) / per : 0;
    fprintf(stderr,
            "%zu training %s, %zu validation%s; %ld tokens, %ld trained; packing %s "
            "(median %s %d tokens, rows of %d)\n",
            tlm_examples_count(*ex) / per, pairs ? "pairs" : "examples", nv,
            val_data ? " (--val-data)" : "", st.tokens, st.trained_tokens, *pack ? "on" : "off",
            pairs ? "sequence" : "example", med, T);
    if (pairs)
        fprintf(stderr, "DPO: beta %g, label smoothing %g, rpo alpha %g, the reference %s%s\n",
                ft->dpo.beta, ft->dpo.label_smoothing, ft->dpo.rpo_alpha,
                ft->full ? "a frozen copy of BASE" : "BASE (the adapter switched off)",
                ft->precompute_ref ? ", its log-probabilities computed once" : "");
    return 0;
}

static int train_main(int argc, char **argv, int finetune) {
    const char *config = NULL, *data = NULL, *val_data = NULL, *tokenizer = NULL, *out = NULL,
               *init = "gpt2";
    const char *cmd = finetune ? "finetune" : "train";
    int use_char = 0, threads = 0;
    double val_fraction = 0.1, min_lr = -1;
    tlm_train_opts o;
    tlm_train_opts_defaults(&o);
    finetune_opts ft = {0};
    ft.on = finetune;
    ft.pack = -1;
    tlm_lora_opts_defaults(&ft.lora);
    tlm_examples_opts_defaults(&ft.ex);
    tlm_dpo_opts_defaults(&ft.dpo);
    int precision_set = 0, seq_set = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        double x;
        long k;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            if (finetune) fputs(finetune_help, stdout);
            fputs(train_help, stdout);
            return 0;
        }
#define NEED()                                                                                     \
    do {                                                                                           \
        if (!v) return cli_fail("%s: %s needs a value", cmd, a);                                   \
    } while (0)
#define INT_FLAG(name, alt, dst, minv)                                                             \
    if (cli_flag_value(argc, argv, &i, name, alt, &v)) {                                           \
        NEED();                                                                                    \
        if (!cli_parse_int(v, &k) || k < (minv))                                                   \
            return cli_fail("%s: %s must be an integer >= %d (got '%s')", cmd, a, (int)(minv), v); \
        dst = k;                                                                                   \
        continue;                                                                                  \
    }
#define FLOAT_FLAG(name, dst, lo, hi)                                                              \
    if (cli_flag_value(argc, argv, &i, name, NULL, &v)) {                                          \
        NEED();                                                                                    \
        if (!cli_parse_float(v, &x) || !(x >= (lo) && x <= (hi)))                                  \
            return cli_fail("%s: %s must be a number in [%g, %g] (got '%s')", cmd, a,              \
                            (double)(lo), (double)(hi), v);                                        \
        dst = x;                                                                                   \
        continue;                                                                                  \
    }
        if (!finetune && cli_flag_value(argc, argv, &i, "-c", "--config", &v)) {
            NEED();
            config = v;
            continue;
        }
        if (finetune && cli_flag_value(argc, argv, &i, "-m", "--model", &v)) {
            NEED();
            ft.base = v;
            continue;
        }
        if (finetune && !strcmp(a, "--full")) {
            ft.full = 1;
            continue;
        }
        if (finetune && !strcmp(a, "--rslora")) {
            ft.lora.rslora = 1;
            continue;
        }
        if (finetune && cli_flag_value(argc, argv, &i, "--lora-targets", NULL, &v)) {
            NEED();
            if (tlm_lora_targets_parse(v, &ft.lora.targets)) return cli_fail_status("finetune");
            continue;
        }
        if (finetune && cli_flag_value(argc, argv, &i, "--lora-rank", NULL, &v)) {
            NEED();
            if (!cli_parse_int(v, &k) || k < 1 || k > 65536)
                return cli_fail("finetune: --lora-rank must be an integer in [1, 65536] (got '%s')",
                                v);
            ft.lora.rank = (int)k;
            continue;
        }
        if (finetune && cli_flag_value(argc, argv, &i, "--lora-alpha", NULL, &v)) {
            NEED();
            if (!cli_parse_float(v, &x) || !(x > 0 && x <= 1e6))
                return cli_fail("finetune: --lora-alpha must be a positive number (got '%s')", v);
            ft.lora.alpha = (float)x;
            continue;
        }
        if (finetune && cli_flag_value(argc, argv, &i, "--lora-dropout", NULL, &v)) {
            NEED();
            if (!cli_parse_float(v, &x) || !(x >= 0 && x < 1))
                return cli_fail("finetune: --lora-dropout must be in [0, 1) (got '%s')", v);
            ft.lora.dropout = (float)x;
            continue;
        }
        if (finetune && cli_flag_value(argc, argv, &i, "--format", NULL, &v)) {
            NEED();
            if (tlm_data_format_parse(v, &ft.ex.format)) return cli_fail_status("finetune");
            ft.format_set = 1;
            continue;
        }
        if (finetune && cli_flag_value(argc, argv, &i, "--loss-on", NULL, &v)) {
            NEED();
            if (tlm_loss_on_parse(v, &ft.ex.loss_on)) return cli_fail_status("finetune");
            continue;
        }
        if (finetune && cli_flag_value(argc, argv, &i, "--chat-template", NULL, &v)) {
            NEED();
            tlm_chat_template tp;
            if (!tlm_chat_template_from_name(v, &tp))
                return cli_fail("finetune: --chat-template '%s' is not one of chatml, llama2, "
                                "llama3, mistral, gemma, phi3, mistral-nemo",
                                v);
            ft.ex.chat_template = v;
            continue;
        }
        if (finetune && cli_flag_value(argc, argv, &i, "--truncate", NULL, &v)) {
            NEED();
            if (strcmp(v, "keep-start") && strcmp(v, "keep-end"))
                return cli_fail("finetune: --truncate must be keep-start or keep-end (got '%s')",
                                v);
            ft.ex.truncate_keep_end = !strcmp(v, "keep-end");
            continue;
        }
        if (finetune && cli_flag_value(argc, argv, &i, "--max-len", NULL, &v)) {
            NEED();
            if (!cli_parse_int(v, &k) || k < 2 || k > 1 << 24)
                return cli_fail("finetune: --max-len must be an integer >= 2 (got '%s')", v);
            ft.ex.max_len = (int)k;
            ft.max_len_set = 1;
            continue;
        }
        if (finetune && !strcmp(a, "--precompute-ref")) {
            ft.precompute_ref = 1;
            continue;
        }
        if (finetune && cli_flag_value(argc, argv, &i, "--beta", NULL, &v)) {
            NEED();
            if (!cli_parse_float(v, &x) || !(x > 0 && x <= 1000))
                return cli_fail("finetune: --beta must be a positive number (got '%s')", v);
            ft.dpo.beta = x;
            continue;
        }
        if (finetune && cli_flag_value(argc, argv, &i, "--rpo-alpha", NULL, &v)) {
            NEED();
            if (!cli_parse_float(v, &x) || !(x >= 0 && x <= 1000))
                return cli_fail("finetune: --rpo-alpha must be a number >= 0 (got '%s')", v);
            ft.dpo.rpo_alpha = x;
            continue;
        }
        if (finetune && cli_flag_value(argc, argv, &i, "--label-smoothing", NULL, &v)) {
            NEED();
            if (!cli_parse_float(v, &x) || !(x >= 0 && x < 0.5))
                return cli_fail("finetune: --label-smoothing must be in [0, 0.5) (got '%s')", v);
            ft.dpo.label_smoothing = x;
            continue;
        }
        if (finetune && !strcmp(a, "--skip-bad")) {
            ft.ex.skip_bad = 1;
            continue;
        }
        if (finetune && (!strcmp(a, "--pack") || !strcmp(a, "--no-pack"))) {
            ft.pack = !strcmp(a, "--pack");
            continue;
        }
        if (finetune) {
            /* Which of the defaults that differ from tlm train's the user set. */
            if (!strcmp(a, "--lr") || !strncmp(a, "--lr=", 5)) ft.lr_set = 1;
            if (!strcmp(a, "--warmup") || !strncmp(a, "--warmup=", 9)) ft.warmup_set = 1;
            if (!strcmp(a, "--weight-decay") || !strncmp(a, "--weight-decay=", 15)) ft.wd_set = 1;
            if (!strcmp(a, "--beta2") || !strncmp(a, "--beta2=", 8)) ft.beta2_set = 1;
            if (!strcmp(a, "--seq-len") || !strncmp(a, "--seq-len=", 10)) seq_set = 1;
        }
        if (cli_flag_value(argc, argv, &i, "--data", NULL, &v)) {
            NEED();
            data = v;
            continue;
        }
        if (cli_flag_value(argc, argv, &i, "--val-data", NULL, &v)) {
            NEED();
            val_data = v;
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
        if (!finetune && cli_flag_value(argc, argv, &i, "--init", NULL, &v)) {
            NEED();
            if (strcmp(v, "gpt2") && strcmp(v, "xavier"))
                return cli_fail("train: --init must be gpt2 or xavier (got '%s')", v);
            init = v;
            continue;
        }
        if (!strcmp(a, "--char")) {
            use_char = 1;
            continue;
        }
        if (cli_flag_value(argc, argv, &i, "--precision", NULL, &v)) {
            NEED();
            precision_set = 1;
            if (!strcmp(v, "auto")) {
                precision_set = 0;
                continue;
            }
            if (tlm_precision_parse(v, &o.precision) != TLM_OK)
                return cli_fail("train: --precision must be auto, fp32 or bf16 (got '%s')", v);
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
        INT_FLAG("--grad-accum", NULL, o.grad_accum, 1)
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
        return cli_fail("%s: unknown option '%s' (see tlm %s --help)", cmd, a, cmd);
#undef NEED
#undef INT_FLAG
#undef FLOAT_FLAG
    }
    if (finetune) {
        if (!ft.lr_set) o.lr = ft.full ? 2e-5 : 2e-4;
        if (!ft.warmup_set) o.warmup = o.steps / 10 < 100 ? o.steps / 10 : 100;
        if (!ft.wd_set) o.adam.weight_decay = 0;
        if (!ft.beta2_set) o.adam.beta2 = 0.999;
    }
    o.min_lr = min_lr >= 0 ? min_lr : o.lr / 10;
    /* auto: bf16 reaches fp32's validation loss on the bench's recipes in less time
     * (bench/bf16/shakespeare.sh, bench/bf16/train.sh), so it is the default where the CPU has
     * it. */
    if (!precision_set)
        o.precision = tlm_bf16_supported() ? TLM_PRECISION_BF16 : TLM_PRECISION_FP32;
    if (!out) return cli_fail("train: -o OUTDIR is required");
    if (!data) return cli_fail("train: --data TEXT is required");
    if (use_char && tokenizer) return cli_fail("train: give -z TOKENIZER or --char, not both");
    data_src *src = &g_train_src, *vsrc = &g_val_src;
    if (resolve_data("--data", data, src)) return 1;
    if (val_data && resolve_data("--val-data", val_data, vsrc)) return 1;
    if (use_char && (src->tokens || vsrc->tokens))
        return cli_fail("train: --char builds its vocabulary from text, and --data%s holds tokens",
                        src->tokens ? "" : " --val-data");
    int jsonl = finetune && src->n == 1 && (ft.format_set || (!src->tokens && is_jsonl(data)));
    if (jsonl && use_char) return cli_fail("finetune: --char is for plain text, not JSON Lines");
    if (jsonl && val_data && (vsrc->n != 1 || vsrc->tokens))
        return cli_fail("finetune: --val-data must be JSON Lines like --data");
    if (o.batch % (o.grad_accum > 1 ? o.grad_accum : 1) != 0)
        return cli_fail("train: --batch %d does not divide into --grad-accum %d micro-steps",
                        o.batch, o.grad_accum);
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
    if (!config && o.resume && !finetune) config = cfg_copy;
    if (!config && !finetune) return cli_fail("train: -c CONFIG is required");
    if (finetune && !ft.base) return cli_fail("finetune: -m BASE is required");
    int shards_only = src->tokens && (!val_data || vsrc->tokens);
    if (!finetune && !tokenizer && !use_char && !o.resume &&
        !(shards_only && config_has_key(config, "vocab_size")))
        return cli_fail("train: give -z TOKENIZER or --char%s",
                        shards_only ? " (or vocab_size in the config, for token shards)" : "");
    /* MPI only when a launcher started us: a plain run pays nothing and prints nothing more. */
    int world = 1, rank = 0;
    if (dist_launched(&world, &rank)) {
        if (!dist_available()) {
            /* Rank 0 alone says why and fails the job; the others end quietly, so that mpirun
             * cannot kill rank 0 for their failure before it has printed the reason. */
            if (rank != 0) return 0;
            return cli_fail("train: started by an MPI launcher (%d processes), but this tlm was "
                            "built without MPI; install libopenmpi-dev (scripts/setup.sh) and "
                            "rebuild, or run tlm train without mpirun",
                            world);
        }
        if (o.batch % (world * (o.grad_accum > 1 ? o.grad_accum : 1)) != 0) {
            if (rank != 0) return 0; /* as above: rank 0 fails the job */
            return cli_fail("train: --batch %d does not divide into %d processes x --grad-accum %d",
                            o.batch, world, o.grad_accum > 1 ? o.grad_accum : 1);
        }
        if (dist_init(&g_dist)) return cli_fail_status("train");
        world = dist_world(g_dist);
        rank = g_rank = dist_rank(g_dist);
        /* The processes on one host share its cores. */
        if (!threads) {
            int per = (int)sysconf(_SC_NPROCESSORS_ONLN) / dist_local_size();
            threads = per > 0 ? per : 1;
        }
    }
    tlm_threads_set(threads);

    tlm_config c;
    tlm_model *m = NULL;
    if (finetune) {
        /* LoRA keeps BASE where it lies (mapped, in its own type); --full trains an F32 copy. */
        if (tlm_model_load(ft.base, ft.full ? TLM_LOAD_WRITABLE : 0, &m))
            return cli_fail_status("finetune: loading the base model");
        c = *tlm_model_config(m);
        if (!seq_set && c.context_length > 512) o.seq_len = 512;
        /* JSON Lines: rows as long as the longest example allowed, unless told */
        if (jsonl && ft.max_len_set && !seq_set)
            o.seq_len = ft.ex.max_len < c.context_length ? ft.ex.max_len : c.context_length;
    } else if (tlm_config_load(config, &c)) {
        return cli_fail_status("train");
    }
    if (o.seq_len > c.context_length)
        return cli_fail("train: --seq-len %d exceeds the model's context_length %d", o.seq_len,
                        c.context_length);
    int row_len = o.seq_len ? o.seq_len : c.context_length;
    if (jsonl && !ft.max_len_set) ft.ex.max_len = row_len;
    if (jsonl && ft.ex.max_len > row_len)
        return cli_fail("finetune: --max-len %d exceeds the rows of %d tokens (--seq-len)",
                        ft.ex.max_len, row_len);
    if (jsonl && !ft.ex.chat_template) {
        tlm_chat_template tp = TLM_CHAT_CHATML;
        int present = 0;
        if (!cli_gguf_template(ft.base, &tp, &present) && present && rank == 0)
            fprintf(stderr, "tlm: finetune: the model's chat template is not one tlm knows; "
                            "using chatml (choose with --chat-template)\n");
        ft.ex.chat_template = tlm_chat_template_name(tp);
    }
    tlm_tokenizer *tok = NULL;
    if (finetune && !tokenizer && !use_char) {
        /* The base's own vocabulary (GGUF, tlm and Hugging Face directories); token shards need
         * none. */
        if (cli_model_tokenizer(ft.base, &tok)) {
            tlm_model_free(m);
            return cli_fail_status("finetune: the base's tokenizer");
        }
        if (!tok && !shards_only) {
            tlm_model_free(m);
            return cli_fail("finetune: no tokenizer found with '%s': give it with -z", ft.base);
        }
    } else if (o.resume && !tokenizer && !use_char) {
        /* Token shards with the config's vocab_size may have trained without one. */
        if (!(shards_only && access(tok_dir, R_OK) != 0) && tlm_tokenizer_load(tok_dir, &tok))
            return cli_fail_status("train: loading tokenizer");
    } else if (tokenizer) {
        if (tlm_tokenizer_load(tokenizer, &tok)) return cli_fail_status("train: loading tokenizer");
    } else if (use_char) {
        char *text;
        size_t len;
        if (core_read_file(data, &text, &len)) return cli_fail_status("train");
        tlm_status s = tlm_tokenizer_new_char(text, len, &tok);
        free(text);
        if (s) return cli_fail_status("train: building the character vocabulary");
    }
    int32_t tv = tok ? tlm_tokenizer_vocab_size(tok) : 0;
    if (!finetune && !config_has_key(config, "vocab_size")) {
        c.vocab_size = tv;
    } else if (c.vocab_size < tv) {
        tlm_tokenizer_free(tok);
        tlm_model_free(m);
        return cli_fail("%s: the model's vocab_size %d is smaller than the tokenizer's %d", cmd,
                        c.vocab_size, tv);
    }
    if (!finetune && tlm_config_finalize(&c)) {
        tlm_tokenizer_free(tok);
        return cli_fail_status("train");
    }
    /* Rank 0 tokenizes text; the others wait for its verdict and map the same files. */
    int prep = 0;
    data_src *srcs[2] = {src, vsrc};
    const char *names[2] = {"tokens", "val_tokens"};
    for (int k = 0; k < 2 && !prep; k++) {
        if (srcs[k]->n == 0 || srcs[k]->tokens || jsonl) continue;
        char *path = NULL, *text = srcs[k]->paths[0];
        if (rank == 0)
            prep = prepare_tokens(text, out, names[k], tok, &path);
        else {
            char file[64];
            snprintf(file, sizeof file, "%s.bin", names[k]);
            path = core_path_join(out, file);
        }
        free(srcs[k]->paths[0]);
        srcs[k]->paths[0] = path;
        if (!path && !prep) prep = cli_fail("train: out of memory");
    }
    if (g_dist && dist_any(g_dist, prep) != 0) prep = g_agreed = 1;
    if (prep) {
        tlm_tokenizer_free(tok);
        tlm_model_free(m);
        return 1;
    }
    int rc = 0;
    tlm_dataset *ds = NULL;
    tlm_lora *lora = NULL;
    tlm_examples *ex = NULL, *vex = NULL;
    tlm_model *ref = NULL;
    if (jsonl &&
        load_examples(&ft, data, val_data, val_fraction, tok, row_len, rank, &ex, &vex, &o.pack))
        rc = 1;
    else if (ex && tlm_examples_pairs(ex) && ft.full && tlm_model_load(ft.base, 0, &ref))
        rc = cli_fail_status("finetune: loading the DPO reference");
    else if (!jsonl &&
             tlm_dataset_load_files((const char *const *)src->paths, src->n,
                                    (const char *const *)vsrc->paths, vsrc->n, val_fraction, &ds))
        rc = cli_fail_status(cmd);
    else if (!finetune && tlm_model_new(&c, &m))
        rc = cli_fail_status("train");
    else if (!finetune &&
             tlm_model_init(m, o.seed, strcmp(init, "xavier") ? TLM_INIT_GPT2 : TLM_INIT_XAVIER))
        rc = cli_fail_status("train");
    else if (finetune && !ft.full && tlm_lora_new(m, &ft.lora, &lora))
        rc = cli_fail_status("finetune");
    else if (rank == 0 && (!finetune || ft.full) && tlm_config_save(&c, cfg_copy))
        rc = cli_fail_status("train: saving config");
    else if (rank == 0 && tok && tlm_tokenizer_save(tok, tok_dir))
        rc = cli_fail_status("train: saving tokenizer");
    o.lora = lora;
    o.examples = ex;
    o.val_examples = vex;
    o.ref_model = ref;
    o.dpo = ft.dpo;
    o.precompute_ref = ft.precompute_ref;
    if (ex && tlm_examples_pairs(ex) && !ft.lr_set) {
        /* DPO moves a model a little: TRL's default for full training, more for an adapter */
        o.lr = ft.full ? 1e-6 : 5e-5;
        if (min_lr < 0) o.min_lr = o.lr / 10;
    }
    size_t trained = lora ? tlm_lora_num_params(lora) : m ? tlm_model_num_params(m) : 0;
    if (!rc && g_dist && dist_hooks(g_dist, trained, &o.hooks)) rc = cli_fail_status(cmd);
    if (!rc && rank == 0) {
        tlm_param_count pc;
        tlm_config_count_params(&c, &pc);
        if (ds)
            fprintf(stderr,
                    "model: %zu parameters (%zu non-embedding); %zu training / %zu validation "
                    "tokens; %d threads\n",
                    pc.total, pc.non_embedding, tlm_dataset_size(ds, TLM_SPLIT_TRAIN),
                    tlm_dataset_size(ds, TLM_SPLIT_VAL), tlm_threads_get());
        else
            fprintf(stderr, "model: %zu parameters (%zu non-embedding); %d threads\n", pc.total,
                    pc.non_embedding, tlm_threads_get());
        if (lora) {
            tlm_lora_opts lo;
            tlm_lora_get_opts(lora, &lo);
            fprintf(stderr,
                    "LoRA: rank %d, alpha %g (scale %g), %d matrices, %zu trainable parameters "
                    "(%.3f%% of the model); the base stays frozen\n",
                    lo.rank, (double)lo.alpha, (double)tlm_lora_scale(lora),
                    tlm_lora_num_matrices(lora), trained,
                    100.0 * (double)trained / (double)pc.total);
        }
        fprintf(stderr, "precision: %s\n",
                o.precision == TLM_PRECISION_BF16
                    ? "bf16 matrix products, fp32 accumulation, weights and optimizer"
                    : "fp32");
        size_t n = trained, mine = o.hooks.end ? o.hooks.end - o.hooks.begin : n;
        int K = o.grad_accum > 1 ? o.grad_accum : 1;
        double mib = 1.0 / (1 << 20);
        fprintf(stderr,
                "%d process%s x %d micro-step%s of %d sequences; memory per process: parameters "
                "%.1f MiB, gradients %.1f MiB, AdamW moments %.1f MiB (%zu of %zu parameters)\n",
                world, world > 1 ? "es" : "", K, K > 1 ? "s" : "", o.batch / (world * K),
                (double)n * 4 * mib, (double)n * 4 * mib, (double)mine * 8 * mib, mine, n);
    }
    if (!rc) {
        progress_state ps = {isatty(2), 0};
        o.out_dir = out;
        o.on_progress = on_progress;
        o.user = &ps;
        o.stop = &g_stop;
        signal(SIGINT, on_sigint);
        signal(SIGTERM, on_sigint);
        double t0 = cli_now();
        tlm_status s = tlm_train_run(m, ds, &o);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        if (g_dist && (s == TLM_OK || s == TLM_ERR_INTERRUPTED)) {
            /* Every process reached the same end: report memory and communication. */
            double rss[4096], comm = dist_comm_seconds(g_dist), wall = cli_now() - t0;
            if (world <= 4096 && !dist_gather_double(g_dist, peak_rss_mib(), rss) && rank == 0) {
                fprintf(stderr, "peak memory (RSS) per process, MiB:");
                for (int r = 0; r < world; r++) fprintf(stderr, " %.1f", rss[r]);
                fputc('\n', stderr);
                fprintf(stderr, "communication: %.3f s of %.3f s (%.1f%%) on rank 0\n", comm, wall,
                        wall > 0 ? 100 * comm / wall : 0.0);
            }
        }
        if (s == TLM_ERR_INTERRUPTED) {
            if (rank == 0) fprintf(stderr, "\ntlm: %s\n", tlm_last_error());
            rc = 130;
        } else if (s) {
            if (ps.tty) fputc('\n', stderr);
            rc = cli_fail_status("train");
        } else if (rank == 0 && lora) {
            fprintf(stderr, "saved %s/adapter.gguf and %s/peft/\n", out, out);
        } else if (rank == 0) {
            fprintf(stderr, "saved %s/model.safetensors\n", out);
        }
    }
    tlm_lora_free(lora);
    tlm_model_free(m);
    tlm_dataset_free(ds);
    tlm_examples_free(ex);
    tlm_examples_free(vex);
    tlm_model_free(ref);
    tlm_tokenizer_free(tok);
    return rc;
}

static int train_or_finetune(int argc, char **argv, int finetune) {
    int rc = train_main(argc, argv, finetune);
    /* 0 and 130 (a stop every process agreed on) end MPI normally; any other failure may have
     * left the other processes inside a collective, so it aborts the whole job. */
    dist_finish(g_dist, rc == 0 || rc == 130 || g_agreed, rc);
    g_dist = NULL;
    data_src_free(&g_train_src);
    data_src_free(&g_val_src);
    return rc;
}

int cmd_train(int argc, char **argv) { return train_or_finetune(argc, argv, 0); }
int cmd_finetune(int argc, char **argv) { return train_or_finetune(argc, argv, 1); }
