/* The training loop: batches, forward/backward, clipping, AdamW, evaluation, logs, checkpoints. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "model/model.h"
#include "train/train.h"

void tlm_train_defaults(tlm_train_opts *o) {
    memset(o, 0, sizeof *o);
    o->steps = 1000;
    o->batch = 16;
    o->seq_len = 0;
    o->lr = 1e-3;
    o->min_lr = 1e-4;
    o->warmup = 100;
    tlm_adamw_defaults(&o->adam);
    o->clip = 1.0;
    o->eval_interval = 250;
    o->eval_batches = 100; /* sd of the figure ~0.008 on Shakespeare-char (bench/README.md) */
    o->log_interval = 10;
    o->seed = 1337;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct {
    long step;
    float train, val;
} point;

typedef struct {
    point *p;
    size_t n, cap;
} history;

static int hist_add(history *h, long step, float train, float val) {
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 256;
        point *np = realloc(h->p, cap * sizeof *np);
        if (!np) return 0;
        h->p = np;
        h->cap = cap;
    }
    h->p[h->n++] = (point){step, train, val};
    return 1;
}

/* Loss curve as SVG: train loss (blue) and validation loss (orange) against steps. */
static tlm_status write_svg(const char *path, const history *h, long total) {
    size_t cap = 4096 + h->n * 64, len = 0;
    char *buf = malloc(cap);
    if (!buf) return tlm_err(TLM_ERR_NOMEM, "out of memory");
    float lo = INFINITY, hi = -INFINITY;
    for (size_t i = 0; i < h->n; i++) {
        float v[2] = {h->p[i].train, h->p[i].val};
        for (int k = 0; k < 2; k++)
            if (isfinite(v[k])) {
                lo = v[k] < lo ? v[k] : lo;
                hi = v[k] > hi ? v[k] : hi;
            }
    }
    if (!(hi > lo)) {
        lo = isfinite(lo) ? lo - 1 : 0;
        hi = lo + 2;
    }
    const double W = 800, H = 480, L = 60, R = 20, T = 20, Bm = 50;
    double xs = (W - L - R) / (double)(total > 1 ? total : 1), ys = (H - T - Bm) / (hi - lo);
#define OUT(...) len += (size_t)snprintf(buf + len, cap - len, __VA_ARGS__)
    OUT("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%g\" height=\"%g\" "
        "font-family=\"sans-serif\" font-size=\"12\">\n",
        W, H);
    OUT("<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    OUT("<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"black\"/>\n", L, H - Bm, W - R,
        H - Bm);
    OUT("<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"black\"/>\n", L, T, L, H - Bm);
    for (int k = 0; k <= 4; k++) {
        double v = lo + (hi - lo) * k / 4, y = H - Bm - (v - lo) * ys;
        OUT("<text x=\"%g\" y=\"%g\" text-anchor=\"end\">%.3f</text>\n", L - 5, y + 4, v);
        double s = (double)total * k / 4, x = L + s * xs;
        OUT("<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">%.0f</text>\n", x, H - Bm + 18, s);
    }
    OUT("<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">step</text>\n", (L + W - R) / 2, H - 10);
    for (int series = 0; series < 2; series++) {
        OUT("<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"",
            series ? "#e6550d" : "#3182bd");
        for (size_t i = 0; i < h->n; i++) {
            float v = series ? h->p[i].val : h->p[i].train;
            if (!isfinite(v)) continue;
            if (cap - len < 64) {
                char *nb = realloc(buf, cap * 2);
                if (!nb) {
                    free(buf);
                    return tlm_err(TLM_ERR_NOMEM, "out of memory");
                }
                buf = nb;
                cap *= 2;
            }
            OUT("%.1f,%.1f ", L + (double)h->p[i].step * xs, H - Bm - (v - lo) * ys);
        }
        OUT("\"/>\n");
    }
    OUT("<text x=\"%g\" y=\"%g\" fill=\"#3182bd\">train loss</text>\n", W - 180, T + 12);
    OUT("<text x=\"%g\" y=\"%g\" fill=\"#e6550d\">validation loss</text>\n", W - 180, T + 28);
    OUT("</svg>\n");
#undef OUT
    tlm_status s = tlm_write_file_atomic(path, buf, len);
    free(buf);
    return s;
}

/* On resume the log keeps only the steps the checkpoint covers; the history is rebuilt from it. */
static tlm_status reload_log(const char *path, long upto, history *h) {
    char *text;
    size_t len;
    if (tlm_read_file(path, &text, &len) != TLM_OK) return TLM_OK; /* no log yet */
    size_t keep = 0;
    for (char *line = text; *line;) {
        char *end = strchr(line, '\n');
        size_t n = end ? (size_t)(end - line) + 1 : strlen(line);
        cJSON *o = cJSON_ParseWithLength(line, n);
        const cJSON *st = o ? cJSON_GetObjectItemCaseSensitive(o, "step") : NULL;
        if (cJSON_IsNumber(st) && (long)st->valuedouble <= upto) {
            const cJSON *tr = cJSON_GetObjectItemCaseSensitive(o, "train_loss");
            const cJSON *va = cJSON_GetObjectItemCaseSensitive(o, "val_loss");
            hist_add(h, (long)st->valuedouble, cJSON_IsNumber(tr) ? (float)tr->valuedouble : NAN,
                     cJSON_IsNumber(va) ? (float)va->valuedouble : NAN);
            memmove(text + keep, line, n);
            keep += n;
        }
        cJSON_Delete(o);
        line += n;
    }
    tlm_status s = tlm_write_file_atomic(path, text, keep);
    free(text);
    return s;
}

double tlm_evaluate(tlm_model *m, const tlm_dataset *d, int split, int B, int T, int batches,
                    uint64_t seed) {
    size_t N = (size_t)B * T;
    int32_t *ids = malloc(N * sizeof *ids), *tg = malloc(N * sizeof *tg);
    double sum = 0;
    int n = 0;
    tlm_rng rng;
    /* The same windows every evaluation, so successive figures differ only by the model. */
    tlm_rng_seed(&rng, seed, 0x5eed);
    for (int i = 0; ids && tg && i < batches; i++) {
        double loss;
        if (tlm_dataset_batch(d, split, &rng, B, T, ids, tg) ||
            tlm_batch_loss(m, ids, tg, B, T, &loss))
            break;
        sum += loss;
        n++;
    }
    free(ids);
    free(tg);
    return n == batches && n > 0 ? sum / n : NAN;
}

tlm_status tlm_train_run(tlm_model *m, const tlm_dataset *d, const tlm_train_opts *o) {
    const tlm_config *c = &m->c;
    int B = o->batch, T = o->seq_len ? o->seq_len : c->context_length;
    if (B <= 0 || T <= 0 || T > c->context_length)
        return tlm_err(TLM_ERR_ARG, "batch %d x sequence %d invalid for context %d", B, T,
                       c->context_length);
    if (o->steps <= 0) return tlm_err(TLM_ERR_ARG, "steps must be positive");
    if (tlm_dataset_vocab_size(d) > c->vocab_size)
        return tlm_err(TLM_ERR_CONFIG, "data has vocabulary %d but the model only %d",
                       tlm_dataset_vocab_size(d), c->vocab_size);
    if (tlm_dataset_size(d, TLM_SPLIT_TRAIN) < (size_t)T + 1)
        return tlm_err(TLM_ERR_ARG, "training split has %zu tokens; a window needs %d",
                       tlm_dataset_size(d, TLM_SPLIT_TRAIN), T + 1);
    int do_eval = o->eval_interval > 0 && o->eval_batches > 0 &&
                  tlm_dataset_size(d, TLM_SPLIT_VAL) >= (size_t)T + 1;
    if (o->eval_interval > 0 && o->eval_batches > 0 && !do_eval &&
        tlm_dataset_size(d, TLM_SPLIT_VAL) > 0)
        return tlm_err(TLM_ERR_ARG, "validation split has %zu tokens; a window needs %d",
                       tlm_dataset_size(d, TLM_SPLIT_VAL), T + 1);
    char *ckpt = tlm_path_join(o->out_dir, "checkpoint.safetensors");
    char *model_path = tlm_path_join(o->out_dir, "model.safetensors");
    char *log_path = tlm_path_join(o->out_dir, "log.jsonl");
    char *svg_path = tlm_path_join(o->out_dir, "loss.svg");
    size_t N = (size_t)B * T;
    int32_t *ids = malloc(N * sizeof *ids), *tg = malloc(N * sizeof *tg);
    float *grads = tlm_big_alloc(m->n_params * sizeof(float));
    tlm_adamw *opt = NULL;
    history hist = {0};
    FILE *log = NULL;
    tlm_status s = TLM_OK;
    if (!ckpt || !model_path || !log_path || !svg_path || !ids || !tg || !grads) {
        s = tlm_err(TLM_ERR_NOMEM, "out of memory");
        goto done;
    }
    mkdir(o->out_dir, 0755);
    if ((s = tlm_adamw_create(m, &opt)) != TLM_OK) goto done;
    tlm_train_state st = {0, {0, 0}, o->seed};
    tlm_rng_seed(&st.rng, o->seed, 1);
    if (o->resume) {
        if ((s = tlm_checkpoint_load(ckpt, m, opt, &st)) != TLM_OK) goto done;
        if ((s = reload_log(log_path, st.step, &hist)) != TLM_OK) goto done;
    } else {
        remove(log_path);
    }
    log = fopen(log_path, "a");
    if (!log) {
        s = tlm_err(TLM_ERR_IO, "cannot open '%s' for writing", log_path);
        goto done;
    }
    if ((s = tlm_model_reserve(m, B, T)) != TLM_OK) goto done;
    tlm_schedule sched = {o->lr, o->min_lr, o->warmup, o->steps};
    double t_start = now_s();
    long first = st.step;
    for (long step = st.step; step < o->steps; step++) {
        double t0 = now_s();
        double lr = tlm_lr_at(&sched, step);
        float loss;
        if ((s = tlm_dataset_batch(d, TLM_SPLIT_TRAIN, &st.rng, B, T, ids, tg)) != TLM_OK) break;
        tlm_model_set_dropout_seed(m, st.seed, (uint64_t)step);
        if ((s = tlm_forward_backward(m, ids, tg, B, T, 0, grads, 0, &loss)) != TLM_OK) break;
        double norm = tlm_grad_norm(grads, m->n_params);
        if (!isfinite(loss) || !isfinite(norm)) {
            s = tlm_err(TLM_ERR_NUMERIC,
                        "step %ld: loss %g, gradient norm %g; stopped, the last checkpoint is "
                        "kept (try a lower --lr)",
                        step + 1, (double)loss, norm);
            break;
        }
        tlm_adamw_step_scaled(opt, m, grads, tlm_clip_coef(norm, o->clip), lr, &o->adam);
        st.step = step + 1;
        double dt = now_s() - t0;
        int last = st.step == o->steps;
        int evaluate = do_eval && (st.step % o->eval_interval == 0 || last);
        float val = NAN;
        if (evaluate) {
            val = (float)tlm_evaluate(m, d, TLM_SPLIT_VAL, B, T, o->eval_batches, o->seed);
        }
        tlm_train_progress p = {st.step,        o->steps,          loss,           val, lr, norm,
                                (double)N / dt, now_s() - t_start, st.step - first};
        if (evaluate || last || (o->log_interval > 0 && st.step % o->log_interval == 0) ||
            st.step == 1) {
            fprintf(log, "{\"step\": %ld, \"train_loss\": %.6f", st.step, (double)loss);
            if (evaluate) fprintf(log, ", \"val_loss\": %.6f", (double)val);
            fprintf(log, ", \"lr\": %.6g, \"grad_norm\": %.6g, \"tokens_per_s\": %.1f}\n", lr, norm,
                    p.tokens_per_s);
            fflush(log);
            hist_add(&hist, st.step, loss, val);
        }
        int stop = o->stop && *o->stop;
        if (o->on_progress && o->on_progress(o->user, &p)) stop = 1;
        int save = last || stop || evaluate ||
                   (o->checkpoint_interval > 0 && st.step % o->checkpoint_interval == 0);
        if (save) {
            if ((s = tlm_checkpoint_save(ckpt, m, opt, &st)) != TLM_OK) break;
            if ((s = tlm_model_save_safetensors(m, model_path)) != TLM_OK) break;
            if ((s = write_svg(svg_path, &hist, o->steps)) != TLM_OK) break;
        }
        if (stop && !last) {
            s = tlm_err(TLM_ERR_INTERRUPTED,
                        "stopped at step %ld; checkpoint saved (resume with "
                        "--resume)",
                        st.step);
            break;
        }
    }
done:
    if (log) fclose(log);
    tlm_adamw_free(opt);
    tlm_big_free(grads, m->n_params * sizeof(float));
    free(hist.p);
    free(ids);
    free(tg);
    free(ckpt);
    free(model_path);
    free(log_path);
    free(svg_path);
    return s;
}
