/* Training loop: token files, exact resumption, NaN handling, logs, and that loss goes down. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "tlm.h"
#include "train/train.h"

static tlm_config tiny(void) {
    tlm_config c;
    tlm_config_defaults(&c);
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
    CHECK_OK(tlm_dataset_write_tokens(path, ids, n, 13));
    free(ids);
}

static void test_tokens(void) {
    int32_t ids[5] = {0, 1, 65535, 2, 70000};
    CHECK(tlm_dataset_write_tokens("tt.bin", ids, 5, 65536) == TLM_ERR_RANGE,
          "id >= vocab rejected");
    CHECK_OK(tlm_dataset_write_tokens("tt.bin", ids, 4, 65536));
    struct stat st;
    stat("tt.bin", &st);
    CHECK(st.st_size == 32 + 8, "uint16 tokens: %lld bytes", (long long)st.st_size);
    CHECK_OK(tlm_dataset_write_tokens("tt4.bin", ids, 5, 70001));
    stat("tt4.bin", &st);
    CHECK(st.st_size == 32 + 20, "uint32 tokens: %lld bytes", (long long)st.st_size);
    tlm_dataset *d = NULL;
    CHECK_OK(tlm_dataset_load("tt4.bin", 0.4, &d));
    CHECK(d && tlm_dataset_size(d, TLM_SPLIT_TRAIN) == 3 && tlm_dataset_size(d, TLM_SPLIT_VAL) == 2,
          "split sizes");
    tlm_dataset_free(d);
    FILE *f = fopen("tt4.bin", "r+b");
    fseek(f, 16, SEEK_SET);
    fputc(99, f); /* count no longer matches the size */
    fclose(f);
    CHECK(tlm_dataset_load("tt4.bin", 0.1, &d) == TLM_ERR_FORMAT, "corrupt header rejected");
    f = fopen("tt4.bin", "wb");
    fputs("hello", f);
    fclose(f);
    CHECK(tlm_dataset_load("tt4.bin", 0.1, &d) == TLM_ERR_FORMAT, "not a token file");
    remove("tt.bin");
    remove("tt4.bin");
}

static tlm_train_opts opts(const char *dir, long steps) {
    tlm_train_opts o;
    tlm_train_opts_defaults(&o);
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
    CHECK_OK(tlm_dataset_load("train_tokens.bin", 0.1, &d));
    tlm_config c = tiny();
    mkdir("run_a", 0755);
    mkdir("run_b", 0755);
    /* Run A: 12 steps straight. */
    tlm_model *a = t_model(&c, 99, TLM_INIT_XAVIER);
    tlm_train_opts o = opts("run_a", 12);
    CHECK_OK(tlm_train_run(a, d, &o));
    /* Run B: stopped after 7 steps, then resumed in a fresh model. */
    tlm_model *b = t_model(&c, 99, TLM_INIT_XAVIER);
    o = opts("run_b", 12);
    long stop = 7;
    o.on_progress = stop_after;
    o.user = &stop;
    CHECK(tlm_train_run(b, d, &o) == TLM_ERR_INTERRUPTED, "stop request interrupts");
    tlm_model_free(b);
    CHECK_OK(tlm_model_new(&c, &b));
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
    double v0 = tlm_train_ctx_evaluate(xa, d, TLM_SPLIT_VAL, 4, 16, 8, 1);
    CHECK(v0 < 2.4, "val loss after 12 steps %.3f (uniform is 2.565)", v0);
    /* Evaluation split across replicas gives the loss of the whole batches. */
    tlm_train_ctx_set_data_parallel(xa, 0);
    double whole = tlm_train_ctx_evaluate(xa, d, TLM_SPLIT_VAL, 4, 16, 8, 1);
    tlm_train_ctx_set_data_parallel(xa, 1);
    double split = tlm_train_ctx_evaluate(xa, d, TLM_SPLIT_VAL, 4, 16, 8, 1);
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

/* The seam of a training step: hooks see every step, and a run split into two optimizer ranges
 * whose hooks exchange what MPI would (sum of squares, updated ranges) equals one whole run. */
typedef struct {
    int grads, sumsq, updates, fail_at;
    size_t n;
    double other;    /* the other "process's" partial sum of squares */
    tlm_model *peer; /* where after_update copies this range */
    size_t begin, end;
} seam;

static tlm_status on_grads(void *user, float *grads, size_t n, float *loss) {
    seam *h = user;
    h->grads++;
    if (!grads || n != h->n || !(*loss > 0)) return core_err(TLM_ERR_ARG, "bad hook arguments");
    return h->grads == h->fail_at ? core_err(TLM_ERR_IO, "reduction failed") : TLM_OK;
}

static tlm_status on_sumsq(void *user, double *ss) {
    seam *h = user;
    h->sumsq++;
    *ss += h->other;
    return TLM_OK;
}

static tlm_status on_update(void *user, float *params, size_t n) {
    seam *h = user;
    h->updates++;
    if (h->peer)
        memcpy(tlm_model_params(h->peer) + h->begin, params + h->begin,
               (h->end - h->begin) * sizeof(float));
    return n == h->n ? TLM_OK : core_err(TLM_ERR_ARG, "bad size");
}

static void test_seam(void) {
    write_tokens("seam_tokens.bin", 4000);
    tlm_dataset *d = NULL;
    CHECK_OK(tlm_dataset_load("seam_tokens.bin", 0.1, &d));
    tlm_config c = tiny();
    tlm_model *a = NULL, *b = NULL;
    CHECK_OK(tlm_model_new(&c, &a));
    CHECK_OK(tlm_model_new(&c, &b));
    CHECK_OK(tlm_model_init(a, 7, TLM_INIT_XAVIER));
    CHECK_OK(tlm_model_init(b, 7, TLM_INIT_XAVIER));
    size_t n = tlm_model_num_params(a);
    mkdir("seam_a", 0755);
    mkdir("seam_b", 0755);
    /* Hooks that change nothing leave the run bit for bit as it is, and see every step. */
    tlm_train_opts o = opts("seam_a", 6);
    CHECK_OK(tlm_train_run(a, d, &o));
    seam h = {0};
    h.n = n;
    o = opts("seam_b", 6);
    o.hooks = (tlm_train_hooks){
        .reduce_grads = on_grads, .reduce_sumsq = on_sumsq, .after_update = on_update, .user = &h};
    CHECK_OK(tlm_train_run(b, d, &o));
    CHECK(h.grads == 6 && h.sumsq == 6 && h.updates == 6, "hooks ran %d/%d/%d times", h.grads,
          h.sumsq, h.updates);
    CHECK(!memcmp(tlm_model_params(a), tlm_model_params(b), n * 4), "no-op hooks changed the run");
    /* A hook's error stops the run with it. */
    h = (seam){.n = n, .fail_at = 3};
    o.hooks.user = &h;
    CHECK(tlm_train_run(b, d, &o) == TLM_ERR_IO && strstr(tlm_last_error(), "reduction"),
          "a failing hook stops training: %s", tlm_last_error());

    /* Two optimizer ranges, [0, k) on model A and [k, n) on model B, exchanging partial sums of
     * squares and updated ranges, against one trainer over everything on model W. Without
     * clipping every update is bitwise the whole run's. */
    tlm_model *w = t_model(&c, 11, TLM_INIT_XAVIER);
    CHECK_OK(tlm_model_init(a, 11, TLM_INIT_XAVIER));
    CHECK_OK(tlm_model_init(b, 11, TLM_INIT_XAVIER));
    size_t k = n / 3 + 5; /* inside a tensor */
    seam ha = {.n = n, .peer = b, .begin = 0, .end = k};
    seam hb = {.n = n, .peer = a, .begin = k, .end = n};
    tlm_train_opts ow = opts("seam_a", 5), oa = ow, ob = ow;
    ow.clip = oa.clip = ob.clip = 0;
    oa.hooks = (tlm_train_hooks){
        .reduce_sumsq = on_sumsq, .after_update = on_update, .user = &ha, .begin = 0, .end = k};
    ob.hooks = (tlm_train_hooks){
        .reduce_sumsq = on_sumsq, .after_update = on_update, .user = &hb, .begin = k, .end = n};
    tlm_trainer *tw = NULL, *ta = NULL, *tb = NULL;
    CHECK_OK(tlm_trainer_new(w, d, &ow, &tw));
    CHECK_OK(tlm_trainer_new(a, d, &oa, &ta));
    CHECK_OK(tlm_trainer_new(b, d, &ob, &tb));
    int same_norm = 1;
    for (int step = 0; tw && ta && tb && step < 5; step++) {
        float lw, la, lb, sw, sa, sb;
        double nw, na, nb, lr;
        CHECK_OK(tlm_trainer_backward(tw, &lw));
        CHECK_OK(tlm_trainer_backward(ta, &la));
        CHECK_OK(tlm_trainer_backward(tb, &lb));
        ha.other = tlm_grad_sumsq(tlm_trainer_grads(tb) + k, n - k);
        hb.other = tlm_grad_sumsq(tlm_trainer_grads(ta), k);
        CHECK_OK(tlm_trainer_clip(tw, &nw, &sw));
        CHECK_OK(tlm_trainer_clip(ta, &na, &sa));
        CHECK_OK(tlm_trainer_clip(tb, &nb, &sb));
        same_norm &= la == lw && lb == lw && fabs(na - nw) <= 1e-6 * nw && nb == na;
        CHECK_OK(tlm_trainer_update(tw, sw, &lr));
        CHECK_OK(tlm_trainer_update(ta, sa, &lr));
        CHECK_OK(tlm_trainer_update(tb, sb, &lr));
    }
    CHECK(same_norm, "split run: losses and global norms match the whole run's");
    CHECK(tw && tlm_trainer_steps(tw) == 5 && tlm_trainer_steps(ta) == 5, "steps counted");
    CHECK(!memcmp(tlm_model_params(w), tlm_model_params(a), n * 4) &&
              !memcmp(tlm_model_params(w), tlm_model_params(b), n * 4),
          "two optimizer ranges with gathered updates differ from one whole optimizer");
    CHECK(tlm_trainer_save(ta) == TLM_ERR_UNSUPPORTED,
          "a shard without a gather hook cannot write a whole checkpoint");
    /* Ranges outside the buffer, and resuming a shard, are refused. */
    tlm_trainer *tx = NULL;
    tlm_train_opts ox = oa;
    ox.hooks.begin = k, ox.hooks.end = k;
    CHECK(tlm_trainer_new(a, d, &ox, &tx) == TLM_ERR_ARG && !tx, "empty range");
    ox.hooks.begin = 0, ox.hooks.end = n + 1;
    CHECK(tlm_trainer_new(a, d, &ox, &tx) == TLM_ERR_ARG && !tx, "range past the buffer");
    ox.hooks.end = k;
    ox.resume = 1;
    /* A shard resumes from a whole checkpoint (seam_a's, of 6 steps), keeping its range. */
    CHECK_OK(tlm_trainer_new(a, d, &ox, &tx));
    CHECK(tx && tlm_trainer_steps(tx) == 6, "a shard resumes the whole checkpoint's step");
    tlm_trainer_free(tx);
    tx = NULL;
    ox.resume = 0;
    ox.hooks.world = 2;
    CHECK(tlm_trainer_new(a, d, &ox, &tx) == TLM_ERR_ARG && !tx, "two processes, no reduce_sum");
    ox.batch = 3;
    ox.hooks.world = 1;
    ox.grad_accum = 2;
    CHECK(tlm_trainer_new(a, d, &ox, &tx) == TLM_ERR_ARG && !tx &&
              strstr(tlm_last_error(), "--grad-accum"),
          "a batch the micro-steps do not divide: %s", tlm_last_error());
    tlm_adamw *opt = NULL;
    CHECK(tlm_adamw_new_range(a, 3, 2, &opt) == TLM_ERR_ARG && !opt, "backwards AdamW range");
    tlm_trainer_free(tw);
    tlm_trainer_free(ta);
    tlm_trainer_free(tb);
    tlm_model_free(w);
    tlm_model_free(a);
    tlm_model_free(b);
    tlm_dataset_free(d);
    remove("seam_tokens.bin");
}

static tlm_status sum_alone(void *user, double *v, int n) { return TLM_OK; }

/* The windows of a step depend on (seed, step) alone: one batch of 8 in one pass, in 2
 * accumulated micro-steps, and as two "processes" of 4 whose gradients are averaged (what MPI
 * does) follow the same loss curve up to summation order. */
static void test_split(void) {
    write_tokens("split_tokens.bin", 4000);
    tlm_dataset *d = NULL;
    CHECK_OK(tlm_dataset_load("split_tokens.bin", 0.1, &d));
    tlm_config c = tiny();
    enum { RUNS = 4, STEPS = 40 };
    tlm_model *m[RUNS];
    tlm_trainer *t[RUNS] = {0};
    size_t n = 0;
    for (int r = 0; r < RUNS; r++) {
        m[r] = t_model(&c, 5, TLM_INIT_XAVIER);
        n = tlm_model_num_params(m[r]);
        tlm_train_opts o = opts("split_run", STEPS);
        o.batch = 8;
        o.grad_accum = r == 1 ? 2 : 1;
        if (r >= 2) o.hooks = (tlm_train_hooks){.rank = r - 2, .world = 2, .reduce_sum = sum_alone};
        CHECK_OK(tlm_trainer_new(m[r], d, &o, &t[r]));
    }
    double worst_k = 0, worst_n = 0;
    float first = 0, last = 0;
    for (int step = 0; t[0] && t[1] && t[2] && t[3] && step < STEPS; step++) {
        float l[RUNS], sc[RUNS];
        double norm[RUNS], lr;
        for (int r = 0; r < RUNS; r++) CHECK_OK(tlm_trainer_backward(t[r], &l[r]));
        float *g2 = tlm_trainer_grads(t[2]), *g3 = tlm_trainer_grads(t[3]);
        for (size_t i = 0; i < n; i++) g2[i] = g3[i] = (g2[i] + g3[i]) * 0.5f;
        l[2] = l[3] = (l[2] + l[3]) * 0.5f;
        for (int r = 0; r < RUNS; r++) CHECK_OK(tlm_trainer_clip(t[r], &norm[r], &sc[r]));
        for (int r = 0; r < RUNS; r++) CHECK_OK(tlm_trainer_update(t[r], sc[r], &lr));
        worst_k = fmax(worst_k, fabs((double)l[1] - l[0]));
        worst_n = fmax(worst_n, fabs((double)l[2] - l[0]));
        if (step == 0) first = l[0];
        last = l[0];
    }
    CHECK(worst_k <= 1e-3, "batch 8 vs 2 micro-steps of 4: |dloss| up to %g", worst_k);
    CHECK(worst_n <= 1e-3, "batch 8 vs 2 processes of 4: |dloss| up to %g", worst_n);
    CHECK(last < first - 0.3f, "the runs learn: loss %.3f -> %.3f", first, last);
    CHECK(!memcmp(tlm_model_params(m[2]), tlm_model_params(m[3]), n * 4),
          "averaged gradients keep the two processes' models identical");
    for (int r = 0; r < RUNS; r++) {
        tlm_trainer_free(t[r]);
        tlm_model_free(m[r]);
    }
    tlm_dataset_free(d);
    remove("split_tokens.bin");
}

/* llm.c's shard layout (dev/data/data_common.py write_datafile): 256 int32 header (magic, version,
 * token count), then uint16 tokens. */
static void write_llmc(const char *path, int n, int magic, int version, int claim, int extra) {
    int32_t head[256] = {0};
    head[0] = magic;
    head[1] = version;
    head[2] = claim;
    FILE *f = fopen(path, "wb");
    fwrite(head, 4, 256, f);
    for (int i = 0; i < n + extra; i++) {
        uint16_t t = (uint16_t)(i % 13);
        fwrite(&t, 2, 1, f);
    }
    fclose(f);
}

static void test_shards(void) {
    write_llmc("llmc_a.bin", 300, 20240520, 1, 300, 0);
    write_llmc("llmc_b.bin", 100, 20240520, 1, 100, 0);
    write_tokens("llmc_t.bin", 200);
    tlm_dataset *d = NULL;
    CHECK_OK(tlm_dataset_load("llmc_a.bin", 0.1, &d));
    CHECK(d && tlm_dataset_size(d, TLM_SPLIT_TRAIN) == 270 &&
              tlm_dataset_size(d, TLM_SPLIT_VAL) == 30,
          "llm.c shard split sizes");
    CHECK(d && tlm_dataset_vocab_size(d) == 0, "an llm.c shard names no vocabulary");
    int32_t ids[4 * 8], tg[4 * 8];
    int counting = 1;
    for (int step = 0; d && step < 20; step++) {
        CHECK_OK(trn_dataset_windows(d, TLM_SPLIT_TRAIN, 1, (uint64_t)step, 0, 4, 8, ids, tg));
        for (int i = 0; i < 32; i++) counting &= tg[i] == (ids[i] + 1) % 13;
    }
    CHECK(counting, "llm.c shard tokens read back as written (each target is its id + 1 mod 13)");
    tlm_dataset_free(d);
    /* Several files are one stream; validation files replace the held-out fraction. */
    const char *train[] = {"llmc_a.bin", "llmc_t.bin"}, *val[] = {"llmc_b.bin"};
    CHECK_OK(tlm_dataset_load_files(train, 2, val, 1, 0.5, &d));
    CHECK(d && tlm_dataset_size(d, TLM_SPLIT_TRAIN) == 500 &&
              tlm_dataset_size(d, TLM_SPLIT_VAL) == 100,
          "train files 300 + 200, validation file 100");
    CHECK(d && tlm_dataset_vocab_size(d) == 13, "the tlm file's vocabulary");
    int in_range = 1, val_counting = 1;
    for (int step = 0; d && step < 50; step++) {
        CHECK_OK(trn_dataset_windows(d, TLM_SPLIT_TRAIN, 2, (uint64_t)step, 0, 4, 8, ids, tg));
        for (int i = 0; i < 32; i++) in_range &= ids[i] >= 0 && ids[i] < 13;
        CHECK_OK(trn_dataset_windows(d, TLM_SPLIT_VAL, 2, (uint64_t)step, 0, 4, 8, ids, tg));
        for (int i = 0; i < 32; i++) val_counting &= tg[i] == (ids[i] + 1) % 13;
    }
    CHECK(in_range && val_counting, "windows over two files, validation from the third");
    tlm_dataset_free(d);
    d = NULL;
    /* Malformed shards: refused with the file's name and the reason. */
    struct {
        int magic, version, claim, extra;
        const char *why;
    } bad[] = {{20240520, 2, 50, 0, "version 2"},
               {20240520, 1, 60, 0, "header says 60 tokens"},
               {20240520, 1, 50, 7, "header says 50 tokens"},
               {20240521, 1, 50, 0, "not a tlm token file or an llm.c shard"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_llmc("llmc_bad.bin", 50, bad[i].magic, bad[i].version, bad[i].claim, bad[i].extra);
        CHECK(tlm_dataset_load("llmc_bad.bin", 0.1, &d) == TLM_ERR_FORMAT && !d &&
                  strstr(tlm_last_error(), bad[i].why) && strstr(tlm_last_error(), "llmc_bad.bin"),
              "malformed shard %zu: %s", i, tlm_last_error());
    }
    FILE *f = fopen("llmc_bad.bin", "wb");
    int32_t head[3] = {20240520, 1, 0};
    fwrite(head, 4, 3, f);
    fclose(f);
    CHECK(tlm_dataset_load("llmc_bad.bin", 0.1, &d) == TLM_ERR_FORMAT &&
              strstr(tlm_last_error(), "shorter than its 1024-byte header"),
          "short header: %s", tlm_last_error());
    const char *none[] = {"llmc_a.bin", "missing.bin"};
    CHECK(tlm_dataset_load_files(none, 2, NULL, 0, 0.1, &d) != TLM_OK && !d, "a missing shard");
    remove("llmc_a.bin");
    remove("llmc_b.bin");
    remove("llmc_t.bin");
    remove("llmc_bad.bin");
}

/* The default init starts a wide model with a tied embedding (GPT-2's vocabulary and width) near
 * the loss of a uniform guess, ln(vocab); the xavier scheme's unit-variance embedding tied to the
 * head starts it hundreds of nats above (the reason it is not the default). */
static void test_init_loss(void) {
    tlm_config c;
    tlm_config_defaults(&c);
    c.vocab_size = 50257;
    c.context_length = 32;
    c.d_model = 768;
    c.n_layers = 2;
    c.n_heads = 12;
    c.d_ff = 2048;
    CHECK_OK(tlm_config_finalize(&c));
    CHECK(c.tie_embeddings, "the config ties its embedding to the head");
    tlm_model *m = NULL;
    CHECK_OK(tlm_model_new(&c, &m));
    if (!m) return;
    enum { B = 2, T = 32 };
    int32_t ids[B * T], targets[B * T];
    t_seed(11);
    for (int i = 0; i < B * T; i++) ids[i] = (int32_t)(t_rnd() % 50257);
    for (int i = 0; i < B * T; i++) targets[i] = (int32_t)(t_rnd() % 50257);
    tlm_forward_opts fo = {.targets = targets};
    tlm_forward_out out;
    double uniform = log(50257.0);
    tlm_init_scheme def;
    memset(&def, 0, sizeof def);
    CHECK(def == TLM_INIT_GPT2, "the zero scheme (the default) is gpt2");
    CHECK_OK(tlm_model_init(m, 5, def));
    CHECK_OK(t_forward(m, ids, B, T, &fo, &out));
    CHECK(fabs(out.loss - uniform) < 0.25, "default init: loss %.3f, ln(vocab) %.3f", out.loss,
          uniform);
    CHECK_OK(tlm_model_init(m, 5, TLM_INIT_XAVIER));
    CHECK_OK(t_forward(m, ids, B, T, &fo, &out));
    CHECK(out.loss > 10 * uniform, "xavier init: loss %.3f", out.loss);
    CHECK(tlm_model_init(m, 5, (tlm_init_scheme)7) == TLM_ERR_ARG, "an unknown scheme");
    tlm_model_free(m);
}

int main(void) {
    tlm_threads_set(2);
    test_init_loss();
    test_tokens();
    test_resume();
    test_seam();
    test_split();
    test_shards();
    return t_finish("test_train");
}
