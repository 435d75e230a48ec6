/* Training loop: token files, exact resumption, NaN handling, logs, and that loss goes down. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "tlm.h"

static tlm_config tiny(void) {
    tlm_config c;
    tlm_config_default(&c);
    c.vocab_size = 13;
    c.context_length = 16;
    c.d_model = 32;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.norm = TLM_NORM_LAYERNORM;
    c.bias = 1;
    c.position = TLM_POS_LEARNED;
    c.ffn = TLM_FFN_GELU;
    c.tie_embeddings = 0;
    CHECK_OK(tlm_config_finalize(&c));
    return c;
}

/* A learnable stream: a noisy counter modulo 13. */
static void write_tokens(const char *path, size_t n) {
    int32_t *ids = malloc(n * sizeof *ids);
    uint32_t x = 12345;
    for (size_t i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        ids[i] = (int32_t)((i + ((x >> 16) % 7 == 0 ? 5 : 0)) % 13);
    }
    CHECK_OK(tlm_tokens_write(path, ids, n, 13));
    free(ids);
}

static void test_tokens(void) {
    int32_t ids[5] = {0, 1, 65535, 2, 70000};
    CHECK(tlm_tokens_write("tt.bin", ids, 5, 65536) == TLM_ERR_RANGE, "id >= vocab rejected");
    CHECK_OK(tlm_tokens_write("tt.bin", ids, 4, 65536));
    struct stat st;
    stat("tt.bin", &st);
    CHECK(st.st_size == 32 + 8, "uint16 tokens: %lld bytes", (long long)st.st_size);
    CHECK_OK(tlm_tokens_write("tt4.bin", ids, 5, 70001));
    stat("tt4.bin", &st);
    CHECK(st.st_size == 32 + 20, "uint32 tokens: %lld bytes", (long long)st.st_size);
    tlm_dataset *d = NULL;
    CHECK_OK(tlm_dataset_open("tt4.bin", 0.4, &d));
    CHECK(d && tlm_dataset_size(d, TLM_SPLIT_TRAIN) == 3 && tlm_dataset_size(d, TLM_SPLIT_VAL) == 2,
          "split sizes");
    tlm_dataset_free(d);
    FILE *f = fopen("tt4.bin", "r+b");
    fseek(f, 16, SEEK_SET);
    fputc(99, f); /* count no longer matches the size */
    fclose(f);
    CHECK(tlm_dataset_open("tt4.bin", 0.1, &d) == TLM_ERR_FORMAT, "corrupt header rejected");
    f = fopen("tt4.bin", "wb");
    fputs("hello", f);
    fclose(f);
    CHECK(tlm_dataset_open("tt4.bin", 0.1, &d) == TLM_ERR_FORMAT, "not a token file");
    remove("tt.bin");
    remove("tt4.bin");
}

static tlm_train_opts opts(const char *dir, long steps) {
    tlm_train_opts o;
    tlm_train_defaults(&o);
    o.out_dir = dir;
    o.steps = steps;
    o.batch = 4;
    o.lr = 3e-3;
    o.min_lr = 3e-4;
    o.warmup = 3;
    o.eval_interval = 5;
    o.eval_batches = 4;
    o.log_interval = 1;
    o.seed = 99;
    return o;
}

static int stop_after(void *user, const tlm_train_progress *p) { return p->step >= *(long *)user; }

static size_t read_all(const char *path, char **buf) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    *buf = malloc((size_t)n + 1); /* NUL-terminated so the logs can be searched as strings */
    size_t got = fread(*buf, 1, (size_t)n, f);
    (*buf)[got] = 0;
    fclose(f);
    return got;
}

static void test_resume(void) {
    write_tokens("train_tokens.bin", 4000);
    tlm_dataset *d = NULL;
    CHECK_OK(tlm_dataset_open("train_tokens.bin", 0.1, &d));
    tlm_config c = tiny();
    mkdir("run_a", 0755);
    mkdir("run_b", 0755);
    /* Run A: 12 steps straight. */
    tlm_model *a = NULL;
    CHECK_OK(tlm_model_create(&c, &a));
    CHECK_OK(tlm_model_init(a, 99, TLM_INIT_DEFAULT));
    tlm_train_opts o = opts("run_a", 12);
    CHECK_OK(tlm_train_run(a, d, &o));
    /* Run B: stopped after 7 steps, then resumed in a fresh model. */
    tlm_model *b = NULL;
    CHECK_OK(tlm_model_create(&c, &b));
    CHECK_OK(tlm_model_init(b, 99, TLM_INIT_DEFAULT));
    o = opts("run_b", 12);
    long stop = 7;
    o.on_progress = stop_after;
    o.user = &stop;
    CHECK(tlm_train_run(b, d, &o) == TLM_ERR_INTERRUPTED, "stop request interrupts");
    tlm_model_free(b);
    CHECK_OK(tlm_model_create(&c, &b));
    o = opts("run_b", 12);
    o.resume = 1;
    CHECK_OK(tlm_train_run(b, d, &o));
    CHECK(memcmp(tlm_model_params(a), tlm_model_params(b), tlm_model_num_params(a) * 4) == 0,
          "12 steps straight and 7 + 5 with a resume give different parameters");
    char *fa = NULL, *fb = NULL;
    size_t na = read_all("run_a/model.safetensors", &fa),
           nb = read_all("run_b/model.safetensors", &fb);
    CHECK(na > 0 && na == nb && memcmp(fa, fb, na) == 0, "model files differ byte-wise");
    free(fa);
    free(fb);
    na = read_all("run_a/log.jsonl", &fa);
    nb = read_all("run_b/log.jsonl", &fb);
    CHECK(na > 0 && nb > 0, "logs written");
    int lines = 0, vals = 0;
    for (size_t i = 0; i < nb; i++) lines += fb[i] == '\n';
    for (char *p = fb; (p = strstr(p, "val_loss")); p++) vals++;
    CHECK(lines == 12, "resumed log has one line per step, got %d", lines);
    CHECK(vals == 3, "evaluations at steps 5, 10, 12: %d", vals);
    CHECK(strstr(fb, "\"tokens_per_s\"") && strstr(fb, "\"grad_norm\"") && strstr(fb, "\"lr\""),
          "log fields");
    free(fa);
    free(fb);
    CHECK(access("run_b/loss.svg", R_OK) == 0, "loss curve written");
    /* The loss went down: the stream is mostly predictable. */
    tlm_train_ctx *xa = NULL;
    CHECK_OK(tlm_train_ctx_new(a, &xa));
    double v0 = tlm_evaluate(xa, d, TLM_SPLIT_VAL, 4, 16, 8, 1);
    CHECK(v0 < 2.4, "val loss after 12 steps %.3f (uniform is 2.565)", v0);
    /* Evaluation split across replicas gives the loss of the whole batches. */
    tlm_train_ctx_set_data_parallel(xa, 0);
    double whole = tlm_evaluate(xa, d, TLM_SPLIT_VAL, 4, 16, 8, 1);
    tlm_train_ctx_set_data_parallel(xa, 1);
    double split = tlm_evaluate(xa, d, TLM_SPLIT_VAL, 4, 16, 8, 1);
    tlm_train_ctx_free(xa);
    CHECK(fabs(whole - split) <= 1e-5 * whole, "evaluation whole %.7f vs split %.7f", whole, split);
    /* A NaN parameter stops training with a clear error and leaves the checkpoint as it was. */
    char *before = NULL, *after = NULL;
    size_t n0 = read_all("run_a/checkpoint.safetensors", &before);
    tlm_model_params(a)[0] = NAN;
    o = opts("run_a", 20);
    CHECK(tlm_train_run(a, d, &o) == TLM_ERR_NUMERIC, "NaN stops training");
    CHECK(strstr(tlm_last_error(), "loss") != NULL, "%s", tlm_last_error());
    size_t n1 = read_all("run_a/checkpoint.safetensors", &after);
    CHECK(n0 == n1 && memcmp(before, after, n0) == 0, "checkpoint untouched after NaN");
    free(before);
    free(after);
    tlm_model_free(a);
    tlm_model_free(b);
    tlm_dataset_free(d);
    remove("train_tokens.bin");
}

int main(void) {
    tlm_set_threads(2);
    test_tokens();
    test_resume();
    return t_finish("test_train");
}
