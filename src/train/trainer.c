/* The training loop: batches, forward/backward, clipping, AdamW, evaluation, logs, checkpoints. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "model/ctx.h"
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

double tlm_evaluate(tlm_train_ctx *x, const tlm_dataset *d, int split, int B, int T, int batches,
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
            tlm_ctx_batch_loss(x, ids, tg, B, T, &loss))
            break;
        sum += loss;
        n++;
    }
    free(ids);
    free(tg);
    return n == batches && n > 0 ? sum / n : NAN;
}

struct tlm_trainer {
    tlm_model *m;
    const tlm_dataset *d;
    tlm_train_opts o;
    int B, T;
    tlm_train_ctx *x;
    float *grads;
    tlm_adamw *opt;
    tlm_train_state st;
    tlm_schedule sched;
    int32_t *ids, *tg;
    char *ckpt, *model_path;
};

void tlm_trainer_free(tlm_trainer *t) {
    if (!t) return;
    tlm_train_ctx_free(t->x);
    tlm_adamw_free(t->opt);
    tlm_big_free(t->grads, t->m->n_params * sizeof(float));
    free(t->ids);
    free(t->tg);
    free(t->ckpt);
    free(t->model_path);
    free(t);
}

tlm_status tlm_trainer_new(tlm_model *m, const tlm_dataset *d, const tlm_train_opts *o,
                           tlm_trainer **out) {
    *out = NULL;
    const tlm_config *c = &m->c;
    int B = o->batch, T = o->seq_len ? o->seq_len : c->context_length;
    if (!m->st.params)
        return tlm_err(TLM_ERR_ARG,
                       "train: the model is read-only (load it with TLM_LOAD_WRITABLE)");
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
    size_t begin = o->hooks.begin, end = o->hooks.end ? o->hooks.end : m->n_params;
    if (begin >= end || end > m->n_params)
        return tlm_err(TLM_ERR_ARG, "optimizer range [%zu, %zu) is not inside the %zu parameters",
                       begin, end, m->n_params);
    if (o->resume && (begin != 0 || end != m->n_params))
        return tlm_err(TLM_ERR_UNSUPPORTED,
                       "resuming needs the optimizer over the whole buffer (checkpoints hold "
                       "every moment)");
    tlm_trainer *t = calloc(1, sizeof *t);
    if (!t) return tlm_err(TLM_ERR_NOMEM, "out of memory");
    t->m = m;
    t->d = d;
    t->o = *o;
    t->B = B;
    t->T = T;
    size_t N = (size_t)B * T;
    t->ids = malloc(N * sizeof *t->ids);
    t->tg = malloc(N * sizeof *t->tg);
    t->grads = tlm_big_alloc(m->n_params * sizeof(float));
    t->ckpt = tlm_path_join(o->out_dir, "checkpoint.safetensors");
    t->model_path = tlm_path_join(o->out_dir, "model.safetensors");
    tlm_status s = TLM_OK;
    if (!t->ids || !t->tg || !t->grads || !t->ckpt || !t->model_path)
        s = tlm_err(TLM_ERR_NOMEM, "out of memory");
    if (!s) s = tlm_train_ctx_new(m, &t->x);
    if (!s) s = tlm_train_ctx_set_precision(t->x, o->precision);
    if (!s) s = tlm_adamw_create_range(m, begin, end, &t->opt);
    t->st = (tlm_train_state){0, {0, 0}, o->seed};
    tlm_rng_seed(&t->st.rng, o->seed, 1);
    if (!s && o->resume) s = tlm_checkpoint_load(t->ckpt, m, t->opt, &t->st);
    if (!s) s = tlm_train_ctx_reserve(t->x, B, T);
    t->sched = (tlm_schedule){o->lr, o->min_lr, o->warmup, o->steps};
    if (s) {
        tlm_trainer_free(t);
        return s;
    }
    *out = t;
    return TLM_OK;
}

long tlm_trainer_step(const tlm_trainer *t) { return t->st.step; }
tlm_train_ctx *tlm_trainer_ctx(tlm_trainer *t) { return t->x; }
float *tlm_trainer_grads(tlm_trainer *t) { return t->grads; }

tlm_status tlm_trainer_backward(tlm_trainer *t, float *loss) {
    tlm_status s = tlm_dataset_batch(t->d, TLM_SPLIT_TRAIN, &t->st.rng, t->B, t->T, t->ids, t->tg);
    if (s) return s;
    tlm_train_ctx_set_dropout_seed(t->x, t->st.seed, (uint64_t)t->st.step);
    return tlm_forward_backward(t->x, t->ids, t->tg, t->B, t->T, 0, t->grads, 0, loss);
}

tlm_status tlm_trainer_clip(tlm_trainer *t, double *norm, float *scale) {
    const tlm_train_hooks *h = &t->o.hooks;
    double ss = tlm_grad_sumsq(t->grads + t->opt->begin, t->opt->n);
    if (h->reduce_sumsq) {
        tlm_status s = h->reduce_sumsq(h->user, &ss);
        if (s) return s;
    }
    *norm = sqrt(ss);
    *scale = tlm_clip_coef(*norm, t->o.clip);
    if (!isfinite(*norm))
        return tlm_err(TLM_ERR_NUMERIC, "step %ld: gradient norm %g", t->st.step + 1, *norm);
    return TLM_OK;
}

tlm_status tlm_trainer_update(tlm_trainer *t, float scale, double *lr) {
    const tlm_train_hooks *h = &t->o.hooks;
    double rate = tlm_lr_at(&t->sched, t->st.step);
    tlm_status s = tlm_adamw_step_scaled(t->opt, t->m, t->grads, scale, rate, &t->o.adam);
    if (!s && h->after_update) s = h->after_update(h->user, t->m->st.params, t->m->n_params);
    if (s) return s;
    t->st.step++;
    if (lr) *lr = rate;
    return TLM_OK;
}

tlm_status tlm_trainer_save(tlm_trainer *t) {
    if (t->opt->begin != 0 || t->opt->n != t->m->n_params)
        return tlm_err(TLM_ERR_UNSUPPORTED,
                       "checkpoints need the optimizer over the whole buffer (this process holds "
                       "[%zu, %zu))",
                       t->opt->begin, t->opt->begin + t->opt->n);
    tlm_status s = tlm_checkpoint_save(t->ckpt, t->m, t->opt, &t->st);
    if (!s) s = tlm_model_save_safetensors(t->m, t->model_path);
    return s;
}

tlm_status tlm_train_run(tlm_model *m, const tlm_dataset *d, const tlm_train_opts *o) {
    int T = o->seq_len ? o->seq_len : m->c.context_length;
    int do_eval = o->eval_interval > 0 && o->eval_batches > 0 &&
                  tlm_dataset_size(d, TLM_SPLIT_VAL) >= (size_t)T + 1;
    if (o->eval_interval > 0 && o->eval_batches > 0 && !do_eval &&
        tlm_dataset_size(d, TLM_SPLIT_VAL) > 0)
        return tlm_err(TLM_ERR_ARG, "validation split has %zu tokens; a window needs %d",
                       tlm_dataset_size(d, TLM_SPLIT_VAL), T + 1);
    char *log_path = tlm_path_join(o->out_dir, "log.jsonl");
    char *svg_path = tlm_path_join(o->out_dir, "loss.svg");
    tlm_trainer *t = NULL;
    history hist = {0};
    FILE *log = NULL;
    tlm_status s = TLM_OK;
    if (!log_path || !svg_path) {
        s = tlm_err(TLM_ERR_NOMEM, "out of memory");
        goto done;
    }
    mkdir(o->out_dir, 0755);
    if ((s = tlm_trainer_new(m, d, o, &t)) != TLM_OK) goto done;
    if (o->resume) {
        if ((s = reload_log(log_path, t->st.step, &hist)) != TLM_OK) goto done;
    } else {
        remove(log_path);
    }
    log = fopen(log_path, "a");
    if (!log) {
        s = tlm_err(TLM_ERR_IO, "cannot open '%s' for writing", log_path);
        goto done;
    }
    size_t N = (size_t)t->B * t->T;
    double t_start = now_s();
    long first = t->st.step;
    const tlm_train_hooks *hk = &o->hooks;
    while (t->st.step < o->steps) {
        double t0 = now_s(), lr, norm;
        float loss, scale;
        /* The step: forward/backward -> gradient reduction (hook) -> clip -> AdamW. */
        if ((s = tlm_trainer_backward(t, &loss)) != TLM_OK) break;
        if (hk->reduce_grads &&
            (s = hk->reduce_grads(hk->user, t->grads, m->n_params, &loss)) != TLM_OK)
            break;
        s = tlm_trainer_clip(t, &norm, &scale);
        if (s == TLM_ERR_NUMERIC || (!s && !isfinite(loss))) {
            s = tlm_err(TLM_ERR_NUMERIC,
                        "step %ld: loss %g, gradient norm %g; stopped, the last checkpoint is "
                        "kept (try a lower --lr)",
                        t->st.step + 1, (double)loss, norm);
            break;
        }
        if (s) break;
        if ((s = tlm_trainer_update(t, scale, &lr)) != TLM_OK) break;
        long step = t->st.step;
        double dt = now_s() - t0;
        int last = step == o->steps;
        int evaluate = do_eval && (step % o->eval_interval == 0 || last);
        float val = NAN;
        if (evaluate)
            val = (float)tlm_evaluate(t->x, d, TLM_SPLIT_VAL, t->B, t->T, o->eval_batches, o->seed);
        tlm_train_progress p = {step,           o->steps,          loss,        val, lr, norm,
                                (double)N / dt, now_s() - t_start, step - first};
        if (evaluate || last || (o->log_interval > 0 && step % o->log_interval == 0) || step == 1) {
            fprintf(log, "{\"step\": %ld, \"train_loss\": %.6f", step, (double)loss);
            if (evaluate) fprintf(log, ", \"val_loss\": %.6f", (double)val);
            fprintf(log, ", \"lr\": %.6g, \"grad_norm\": %.6g, \"tokens_per_s\": %.1f}\n", lr, norm,
                    p.tokens_per_s);
            fflush(log);
            hist_add(&hist, step, loss, val);
        }
        int stop = o->stop && *o->stop;
        if (o->on_progress && o->on_progress(o->user, &p)) stop = 1;
        int save = last || stop || evaluate ||
                   (o->checkpoint_interval > 0 && step % o->checkpoint_interval == 0);
        if (save) {
            if ((s = tlm_trainer_save(t)) != TLM_OK) break;
            if ((s = write_svg(svg_path, &hist, o->steps)) != TLM_OK) break;
        }
        if (stop && !last) {
            s = tlm_err(TLM_ERR_INTERRUPTED,
                        "stopped at step %ld; checkpoint saved (resume with "
                        "--resume)",
                        step);
            break;
        }
    }
done:
    if (log) fclose(log);
    tlm_trainer_free(t);
    free(hist.p);
    free(log_path);
    free(svg_path);
    return s;
}
