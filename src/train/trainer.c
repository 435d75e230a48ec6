/* The training loop: batches, forward/backward, clipping, AdamW, evaluation, logs, checkpoints. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "model/ctx.h"
#include "model/lora.h"
#include "model/model.h"
#include "train/train.h"

void tlm_train_opts_defaults(tlm_train_opts *o) {
    memset(o, 0, sizeof *o);
    o->steps = 1000;
    o->batch = 16;
    o->seq_len = 0;
    o->lr = 1e-3;
    o->min_lr = 1e-4;
    o->warmup = 100;
    tlm_adamw_opts_defaults(&o->adam);
    o->clip = 1.0;
    o->eval_interval = 250;
    o->eval_batches = 100; /* the figure then varies by ~0.008 between seeds on Shakespeare-char */
    o->log_interval = 10;
    o->seed = 1337;
    tlm_dpo_opts_defaults(&o->dpo);
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
    if (!buf) return core_err(TLM_ERR_NOMEM, "out of memory");
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
                    return core_err(TLM_ERR_NOMEM, "out of memory");
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
    tlm_status s = core_write_file_atomic(path, buf, len);
    free(buf);
    return s;
}

/* TRL's DPO figures, means over the pairs. */
static void log_dpo(FILE *f, const char *prefix, const tlm_dpo_stats *s, int rpo) {
    double n = s->pairs > 0 ? s->pairs : 1;
    fprintf(f,
            ", \"%srewards/chosen\": %.6g, \"%srewards/rejected\": %.6g, \"%srewards/margins\": "
            "%.6g, \"%srewards/accuracies\": %.6g, \"%slogps/chosen\": %.6g, \"%slogps/rejected\": "
            "%.6g",
            prefix, s->chosen_reward / n, prefix, s->rejected_reward / n, prefix,
            (s->chosen_reward - s->rejected_reward) / n, prefix, s->correct / n, prefix,
            s->chosen_logp / n, prefix, s->rejected_logp / n);
    if (rpo) fprintf(f, ", \"%snll_loss\": %.6g", prefix, s->nll / n);
}

/* On resume the log keeps only the steps the checkpoint covers; the history is rebuilt from it. */
static tlm_status reload_log(const char *path, long upto, history *h) {
    char *text;
    size_t len;
    if (core_read_file(path, &text, &len) != TLM_OK) return TLM_OK; /* no log yet */
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
    tlm_status s = core_write_file_atomic(path, text, keep);
    free(text);
    return s;
}

/* The stream of evaluation windows: apart from every training step's. */
#define EVAL_STREAM UINT64_MAX

/* Chunks rank, rank + world, ... of `chunks` chunks of B windows of the evaluation stream: the sum
 * of their mean losses into *sum. */
static tlm_status eval_chunks(tlm_train_ctx *x, const tlm_dataset *d, tlm_split split, int B, int T,
                              long chunks, uint64_t seed, int rank, int world, int32_t *ids,
                              int32_t *tg, double *sum) {
    *sum = 0;
    for (long i = rank; i < chunks; i += world) {
        double loss;
        tlm_status s = trn_dataset_windows(d, split, seed, EVAL_STREAM, (uint64_t)i * (uint64_t)B,
                                           B, T, ids, tg);
        if (!s) s = mdl_ctx_batch_loss(x, ids, tg, B, T, NULL, &loss, NULL);
        if (s) return s;
        *sum += loss;
    }
    return TLM_OK;
}

double tlm_train_ctx_evaluate(tlm_train_ctx *x, const tlm_dataset *d, tlm_split split, int B, int T,
                              int batches, uint64_t seed) {
    CORE_FP_FLUSH_SCOPE();
    size_t N = (size_t)B * T;
    int32_t *ids = malloc(N * sizeof *ids), *tg = malloc(N * sizeof *tg);
    double sum = 0;
    /* The same windows every evaluation, so successive figures differ only by the model. */
    tlm_status s = ids && tg && batches > 0
                       ? eval_chunks(x, d, split, B, T, batches, seed, 0, 1, ids, tg, &sum)
                       : TLM_ERR_ARG;
    free(ids);
    free(tg);
    return s ? NAN : sum / batches;
}

struct tlm_trainer {
    tlm_model *m;
    const tlm_dataset *d;
    tlm_train_opts o;
    int B, T;
    int K, rank, world, b; /* micro-steps, this process among world, sequences per micro-step */
    tlm_train_ctx *x;
    tlm_lora *lora; /* trained in place of the model's parameters when set */
    trn_params P;   /* what the optimizer updates: the model's or the adapter's */
    float *grads;
    tlm_adamw *opt;
    trn_state st;
    tlm_schedule sched;
    int32_t *ids, *tg, *pos;
    char *ckpt, *model_path, *peft_path; /* adapters: adapter.gguf and peft/ */
    /* examples (tlm_train_opts.examples): the rows of training and validation */
    trn_plan plan, vplan;
    long step_tokens; /* the last step's tokens (of examples, not padding; windows: B x T) */
    /* DPO: rows per optimizer step and per pass (2 a pair), the reference's context (ref_model;
     * NULL with an adapter: the trained context at scale 0), precomputed reference sums per
     * sequence of the training and validation examples, the last step's and evaluation's sums */
    int pairs, rows_b;
    tlm_train_ctx *ref;
    double *ref_logp, *vref_logp, *row_ref;
    float *tok_logp;
    uint32_t *row_ex;
    tlm_dpo_stats dpo_st, val_dpo_st;
    /* A mixture of experts: the last step's load-balancing and z losses (without their
     * coefficients), as the loss holds them, averaged over the processes */
    double router[2];
};

void tlm_trainer_free(tlm_trainer *t) {
    if (!t) return;
    tlm_train_ctx_free(t->x);
    tlm_adamw_free(t->opt);
    core_big_free(t->grads, t->P.n * sizeof(float));
    free(t->ids);
    free(t->tg);
    free(t->pos);
    trn_plan_free(&t->plan);
    trn_plan_free(&t->vplan);
    tlm_train_ctx_free(t->ref);
    free(t->ref_logp);
    free(t->vref_logp);
    free(t->row_ref);
    free(t->tok_logp);
    free(t->row_ex);
    free(t->ckpt);
    free(t->model_path);
    free(t->peft_path);
    free(t);
}

/* Checkpoints hold every moment, whatever the number of processes that wrote them: a process
 * with a range of the optimizer reads them whole and keeps its range (so a run may resume with a
 * different number of processes). */
static tlm_status load_checkpoint(tlm_trainer *t, tlm_adamw *opt) {
    return t->lora ? trn_lora_checkpoint_load(t->ckpt, t->lora, opt, &t->st)
                   : trn_checkpoint_load(t->ckpt, t->m, opt, &t->st);
}

static tlm_status resume(tlm_trainer *t) {
    if (t->opt->begin == 0 && t->opt->n == t->P.n) return load_checkpoint(t, t->opt);
    tlm_adamw *whole = NULL;
    tlm_status s = trn_adamw_alloc(0, t->P.n, &whole);
    if (!s) s = load_checkpoint(t, whole);
    if (!s) {
        memcpy(t->opt->m, whole->m + t->opt->begin, t->opt->n * sizeof(float));
        memcpy(t->opt->v, whole->v + t->opt->begin, t->opt->n * sizeof(float));
        t->opt->step = whole->step;
    }
    tlm_adamw_free(whole);
    return s;
}

/* The reference's sums of rows [first, first + rows) of a plan (in order when shuffle is 0), whose
 * ids and targets are in t->ids, t->tg: precomputed ones by the rows' examples, else a pass of
 * the reference. */
static tlm_status ref_sums(tlm_trainer *t, trn_plan *p, const double *pre, int shuffle,
                           uint64_t first, int rows, int T, double *out) {
    if (pre) {
        tlm_status s = trn_plan_row_examples(p, t->st.seed, shuffle, first, rows, t->row_ex);
        for (int r = 0; r < rows && !s; r++) out[r] = pre[t->row_ex[r]];
        return s;
    }
    tlm_train_ctx *x = t->ref ? t->ref : t->x;
    const tlm_lora *one[1] = {t->lora};
    float zero = 0.0f;
    /* with an adapter the reference is the base: the same context, the adapter's scale 0 */
    tlm_status s = t->ref ? TLM_OK : tlm_train_ctx_set_loras(x, one, &zero, 1);
    if (!s) s = tlm_train_ctx_token_logp(x, t->ids, t->tg, rows, T, t->pos, t->tok_logp);
    tlm_status r = t->ref ? TLM_OK : tlm_train_ctx_set_loras(x, one, NULL, 1);
    if (s || r) return s ? s : r;
    for (int i = 0; i < rows; i++) {
        double sum = 0;
        for (int k = 0; k < T; k++)
            if (t->tg[(size_t)i * T + k] >= 0) sum += t->tok_logp[(size_t)i * T + k];
        out[i] = sum;
    }
    return TLM_OK;
}

/* Every sequence's reference sum, rows_b rows a pass, indexed by example. */
static tlm_status precompute(tlm_trainer *t, trn_plan *p, double **out) {
    size_t n = p->rows;
    *out = malloc((n ? n : 1) * sizeof **out);
    if (!*out) return core_err(TLM_ERR_NOMEM, "out of memory");
    tlm_status s = TLM_OK;
    for (size_t r0 = 0; r0 < n && !s; r0 += (size_t)t->rows_b) {
        int rows = n - r0 < (size_t)t->rows_b ? (int)(n - r0) : t->rows_b, T;
        long tk, ck;
        s = trn_plan_rows(p, 0, 0, r0, rows, t->ids, t->tg, t->pos, &T, &tk, &ck);
        if (!s) s = ref_sums(t, p, NULL, 0, r0, rows, T, t->row_ref);
        if (!s) s = trn_plan_row_examples(p, 0, 0, r0, rows, t->row_ex);
        for (int r = 0; r < rows && !s; r++) (*out)[t->row_ex[r]] = t->row_ref[r];
    }
    return s;
}

static tlm_status dpo_setup(tlm_trainer *t) {
    size_t N = (size_t)t->rows_b * t->T;
    t->row_ref = malloc((size_t)t->rows_b * sizeof *t->row_ref);
    t->tok_logp = malloc(N * sizeof *t->tok_logp);
    t->row_ex = malloc((size_t)t->rows_b * sizeof *t->row_ex);
    if (!t->row_ref || !t->tok_logp || !t->row_ex) return core_err(TLM_ERR_NOMEM, "out of memory");
    tlm_status s = TLM_OK;
    if (!t->lora) {
        s = tlm_train_ctx_new(t->o.ref_model, &t->ref);
        if (!s) s = tlm_train_ctx_set_precision(t->ref, t->o.precision);
        if (s) return s;
    }
    if (t->o.precompute_ref) {
        s = precompute(t, &t->plan, &t->ref_logp);
        if (!s && t->o.val_examples) s = precompute(t, &t->vplan, &t->vref_logp);
        /* nothing reads the reference again */
        tlm_train_ctx_free(t->ref);
        t->ref = NULL;
    }
    return s;
}

static void dpo_add(tlm_dpo_stats *a, const tlm_dpo_stats *b) {
    a->pairs += b->pairs;
    a->loss += b->loss;
    a->chosen_reward += b->chosen_reward;
    a->rejected_reward += b->rejected_reward;
    a->chosen_logp += b->chosen_logp;
    a->rejected_logp += b->rejected_logp;
    a->correct += b->correct;
    a->nll += b->nll;
}

/* The sums of every process (reduce_sum), on each. */
static tlm_status dpo_reduce(tlm_trainer *t, tlm_dpo_stats *st) {
    if (t->world <= 1) return TLM_OK;
    const tlm_train_hooks *h = &t->o.hooks;
    double v[8] = {st->pairs,       st->loss,          st->chosen_reward, st->rejected_reward,
                   st->chosen_logp, st->rejected_logp, st->correct,       st->nll};
    tlm_status s = h->reduce_sum(h->user, v, 8);
    if (s) return s;
    *st = (tlm_dpo_stats){(int)v[0], v[1], v[2], v[3], v[4], v[5], (int)v[6], v[7]};
    return TLM_OK;
}

tlm_status tlm_trainer_new(tlm_model *m, const tlm_dataset *d, const tlm_train_opts *o,
                           tlm_trainer **out) {
    *out = NULL;
    const tlm_config *c = &m->c;
    int B = o->batch, T = o->seq_len ? o->seq_len : c->context_length;
    if (!m->st.params && !o->lora)
        return core_err(TLM_ERR_ARG,
                        "train: the model is read-only (load it with TLM_LOAD_WRITABLE)");
    if (o->lora) {
        tlm_status ls = mdl_lora_check(o->lora, m);
        if (ls) return ls;
    }
    trn_params P = {m->st.params, m->n_params, m->tensors, m->n_tensors};
    if (o->lora) {
        int nt;
        P.tensors = tlm_lora_tensors(o->lora, &nt);
        P.n_tensors = nt;
        P.params = tlm_lora_params_mut(o->lora);
        P.n = tlm_lora_num_params(o->lora);
    }
    if (B <= 0 || T <= 0 || T > c->context_length)
        return core_err(TLM_ERR_ARG, "batch %d x sequence %d invalid for context %d", B, T,
                        c->context_length);
    if (o->steps <= 0) return core_err(TLM_ERR_ARG, "steps must be positive");
    const tlm_examples *ex[2] = {o->examples, o->val_examples};
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; ex[k] && i < tlm_examples_count(ex[k]); i++) {
            const int32_t *ids;
            int len = tlm_examples_get(ex[k], i, &ids, NULL);
            for (int j = 0; j < len; j++)
                if (ids[j] < 0 || ids[j] >= c->vocab_size)
                    return core_err(TLM_ERR_RANGE,
                                    "%s example %zu: token %d outside the model's vocabulary (%d)",
                                    k ? "validation" : "training", i, ids[j], c->vocab_size);
        }
    int pairs = o->examples && tlm_examples_pairs(o->examples);
    if (pairs && !o->lora && !o->ref_model)
        return core_err(TLM_ERR_ARG,
                        "DPO without an adapter needs the reference model (ref_model)");
    if (pairs && o->val_examples && !tlm_examples_pairs(o->val_examples))
        return core_err(TLM_ERR_ARG, "DPO validation data must be preference pairs too");
    if (!o->examples && !d) return core_err(TLM_ERR_ARG, "train: no data (dataset or examples)");
    if (!o->examples && tlm_dataset_vocab_size(d) > c->vocab_size)
        return core_err(TLM_ERR_CONFIG, "data has vocabulary %d but the model only %d",
                        tlm_dataset_vocab_size(d), c->vocab_size);
    if (!o->examples && tlm_dataset_size(d, TLM_SPLIT_TRAIN) < (size_t)T + 1)
        return core_err(TLM_ERR_ARG, "training split has %zu tokens; a window needs %d",
                        tlm_dataset_size(d, TLM_SPLIT_TRAIN), T + 1);
    size_t begin = o->hooks.begin, end = o->hooks.end ? o->hooks.end : P.n;
    if (begin >= end || end > P.n)
        return core_err(TLM_ERR_ARG, "optimizer range [%zu, %zu) is not inside the %zu parameters",
                        begin, end, P.n);
    int K = o->grad_accum > 1 ? o->grad_accum : 1;
    int world = o->hooks.world > 1 ? o->hooks.world : 1, rank = world > 1 ? o->hooks.rank : 0;
    if (rank < 0 || rank >= world)
        return core_err(TLM_ERR_ARG, "rank %d outside the %d processes", rank, world);
    if (world > 1 && !o->hooks.reduce_sum)
        return core_err(TLM_ERR_ARG, "training over %d processes needs hooks.reduce_sum", world);
    if (B % ((long)world * K) != 0)
        return core_err(
            TLM_ERR_ARG,
            "--batch %d does not divide into %d process%s x %d micro-step%s (--grad-accum)", B,
            world, world > 1 ? "es" : "", K, K > 1 ? "s" : "");
    tlm_trainer *t = calloc(1, sizeof *t);
    if (!t) return core_err(TLM_ERR_NOMEM, "out of memory");
    t->m = m;
    t->d = d;
    t->o = *o;
    t->lora = o->lora;
    t->P = P;
    t->B = B;
    t->T = T;
    t->K = K;
    t->rank = rank;
    t->world = world;
    t->b = B / (world * K);
    t->pairs = pairs;
    t->rows_b = pairs ? 2 * t->b : t->b;
    size_t N = (size_t)t->rows_b * T;
    t->ids = malloc(N * sizeof *t->ids);
    t->tg = malloc(N * sizeof *t->tg);
    t->pos = o->examples ? malloc(N * sizeof *t->pos) : NULL;
    t->grads = core_big_alloc(P.n * sizeof(float));
    t->ckpt = core_path_join(o->out_dir, "checkpoint.safetensors");
    t->model_path = core_path_join(o->out_dir, o->lora ? "adapter.gguf" : "model.safetensors");
    t->peft_path = o->lora ? core_path_join(o->out_dir, "peft") : NULL;
    tlm_status s = TLM_OK;
    if (!t->ids || !t->tg || !t->grads || !t->ckpt || !t->model_path ||
        (o->lora && !t->peft_path) || (o->examples && !t->pos))
        s = core_err(TLM_ERR_NOMEM, "out of memory");
    if (!s && o->examples) s = trn_plan_make(o->examples, T, o->pack, &t->plan);
    if (!s && o->val_examples) s = trn_plan_make(o->val_examples, T, o->pack, &t->vplan);

    if (!s) s = tlm_train_ctx_new(m, &t->x);
    if (!s) s = tlm_train_ctx_set_precision(t->x, o->precision);
    const tlm_lora *one[1] = {o->lora};
    if (!s && o->lora) s = tlm_train_ctx_set_loras(t->x, one, NULL, 1);
    if (!s) s = trn_adamw_alloc(begin, end, &t->opt);
    t->st = (trn_state){0, {0, 0}, o->seed};
    core_rng_seed(&t->st.rng, o->seed, 1);
    if (!s && o->resume) s = resume(t);
    if (!s) s = tlm_train_ctx_reserve(t->x, t->rows_b, T);
    if (!s && pairs) s = dpo_setup(t);
    t->sched = (tlm_schedule){o->lr, o->min_lr, o->warmup, o->steps};
    if (s) {
        tlm_trainer_free(t);
        return s;
    }
    *out = t;
    return TLM_OK;
}

long tlm_trainer_steps(const tlm_trainer *t) { return t->st.step; }
tlm_train_ctx *tlm_trainer_ctx(tlm_trainer *t) { return t->x; }
float *tlm_trainer_grads(tlm_trainer *t) { return t->grads; }

/* The step's rows of examples: every process counts the whole step's trained tokens (the rows are
 * a function of seed and step), so that each part's gradient is of its sum over the step's count
 * (a share of it per process, whose gradients the reduction averages) and the parts add up to the
 * step's mean, however the tokens fall into parts. */
/* Micro-step k's router losses, times w, into the step's (the first writes them). */
static void add_router_losses(tlm_trainer *t, int k, double w) {
    double aux, z;
    tlm_train_ctx_router_losses(t->x, &aux, &z);
    if (k == 0) t->router[0] = t->router[1] = 0;
    t->router[0] += w * aux;
    t->router[1] += w * z;
}

static tlm_status examples_backward(tlm_trainer *t, float *loss) {
    uint64_t row0 = (uint64_t)t->st.step * (uint64_t)t->B;
    long tokens, counted;
    int T;
    tlm_status s =
        trn_plan_rows(&t->plan, t->st.seed, 1, row0, t->B, NULL, NULL, NULL, &T, &tokens, &counted);
    if (s) return s;
    t->step_tokens = tokens;
    tlm_batch_opts o = {t->pos, 0, counted > 0 ? (double)counted / t->world : 1.0};
    double sum = 0;
    for (int k = 0; k < t->K; k++) {
        int part = t->rank * t->K + k;
        float l;
        long tk, ck;
        s = trn_plan_rows(&t->plan, t->st.seed, 1, row0 + (uint64_t)part * (uint64_t)t->b, t->b,
                          t->ids, t->tg, t->pos, &T, &tk, &ck);
        if (s) return s;
        uint64_t parts = (uint64_t)t->world * (uint64_t)t->K;
        tlm_train_ctx_set_dropout_seed(t->x, t->st.seed, (uint64_t)t->st.step * parts + part);
        s = tlm_train_ctx_forward_backward_opts(t->x, t->ids, t->tg, t->b, T, &o, t->grads, k > 0,
                                                &l);
        if (s) return s;
        if (ck) sum += l;
        add_router_losses(t, k, 1.0);
    }
    *loss = (float)sum;
    return TLM_OK;
}

/* DPO: the step's B pairs (2B rows), each part's b; every pair's loss divided by the step's pairs
 * (this process's share of them), so the parts add up to the mean over the step. */
static tlm_status dpo_backward(tlm_trainer *t, float *loss) {
    uint64_t row0 = (uint64_t)t->st.step * (uint64_t)t->B * 2;
    long tokens, counted;
    int T;
    tlm_status s = trn_plan_rows(&t->plan, t->st.seed, 1, row0, 2 * t->B, NULL, NULL, NULL, &T,
                                 &tokens, &counted);
    if (s) return s;
    t->step_tokens = tokens;
    double divisor = (double)t->B / t->world;
    tlm_dpo_stats all = {0};
    for (int k = 0; k < t->K; k++) {
        int part = t->rank * t->K + k;
        uint64_t first = row0 + (uint64_t)part * (uint64_t)t->rows_b;
        long tk, ck;
        tlm_dpo_stats st;
        s = trn_plan_rows(&t->plan, t->st.seed, 1, first, t->rows_b, t->ids, t->tg, t->pos, &T, &tk,
                          &ck);
        if (!s) s = ref_sums(t, &t->plan, t->ref_logp, 1, first, t->rows_b, T, t->row_ref);
        if (s) return s;
        uint64_t parts = (uint64_t)t->world * (uint64_t)t->K;
        tlm_train_ctx_set_dropout_seed(t->x, t->st.seed, (uint64_t)t->st.step * parts + part);
        s = tlm_train_ctx_dpo(t->x, t->ids, t->tg, t->b, T, t->pos, t->row_ref, &t->o.dpo, divisor,
                              t->grads, k > 0, &st);
        if (s) return s;
        dpo_add(&all, &st);
    }
    /* this process's part of the step's mean; the gradient reduction averages the losses */
    *loss = (float)(all.loss / divisor);
    t->dpo_st = all;
    return dpo_reduce(t, &t->dpo_st);
}

tlm_status tlm_trainer_backward(tlm_trainer *t, float *loss) {
    CORE_FP_FLUSH_SCOPE();
    if (t->pairs) return dpo_backward(t, loss);
    if (t->o.examples) return examples_backward(t, loss);
    t->step_tokens = (long)t->B * t->T;
    double sum = 0;
    for (int k = 0; k < t->K; k++) {
        /* Windows of the step in order: rank r's micro-step k holds the (r K + k)-th b of them. */
        int part = t->rank * t->K + k;
        float l;
        tlm_status s =
            trn_dataset_windows(t->d, TLM_SPLIT_TRAIN, t->st.seed, (uint64_t)t->st.step,
                                (uint64_t)part * (uint64_t)t->b, t->b, t->T, t->ids, t->tg);
        if (s) return s;
        /* One dropout stream per part (with one process and K = 1, the step's own). */
        uint64_t parts = (uint64_t)t->world * (uint64_t)t->K;
        tlm_train_ctx_set_dropout_seed(t->x, t->st.seed, (uint64_t)t->st.step * parts + part);
        s = tlm_train_ctx_forward_backward(t->x, t->ids, t->tg, t->b, t->T, 0, t->grads, k > 0, &l);
        if (s) return s;
        sum += l;
        add_router_losses(t, k, 1.0 / t->K);
    }
    if (t->K > 1) {
        /* Every part has b x T targets, so the batch's mean is the mean of the parts' means. */
        float inv = 1.0f / (float)t->K;
        long n = (long)t->P.n;
        float *g = t->grads;
#pragma omp parallel for schedule(static)
        for (long i = 0; i < n; i++) g[i] *= inv;
    }
    *loss = (float)(sum / t->K);
    return TLM_OK;
}

tlm_status tlm_trainer_clip(tlm_trainer *t, double *norm, float *scale) {
    CORE_FP_FLUSH_SCOPE();
    const tlm_train_hooks *h = &t->o.hooks;
    double ss = tlm_grad_sumsq(t->grads + t->opt->begin, t->opt->n);
    if (h->reduce_sumsq) {
        tlm_status s = h->reduce_sumsq(h->user, &ss);
        if (s) return s;
    }
    *norm = sqrt(ss);
    *scale = tlm_grad_clip_coef(*norm, t->o.clip);
    if (!isfinite(*norm))
        return core_err(TLM_ERR_NUMERIC, "step %ld: gradient norm %g", t->st.step + 1, *norm);
    return TLM_OK;
}

tlm_status tlm_trainer_update(tlm_trainer *t, float scale, double *lr) {
    CORE_FP_FLUSH_SCOPE();
    const tlm_train_hooks *h = &t->o.hooks;
    double rate = tlm_schedule_lr(&t->sched, t->st.step);
    trn_adamw_update(t->opt, &t->P, t->grads, scale, rate, &t->o.adam);
    tlm_status s = h->after_update ? h->after_update(h->user, t->P.params, t->P.n) : TLM_OK;
    if (s) return s;
    t->st.step++;
    if (lr) *lr = rate;
    return TLM_OK;
}

/* The whole moments on rank 0 from every process's range (NULL whole on the others). */
static tlm_status gather_moments(tlm_trainer *t, tlm_adamw *whole) {
    const tlm_train_hooks *h = &t->o.hooks;
    size_t n = t->P.n;
    if (!h->gather)
        return core_err(TLM_ERR_UNSUPPORTED,
                        "checkpoints need the optimizer over the whole buffer or hooks.gather "
                        "(this process holds [%zu, %zu))",
                        t->opt->begin, t->opt->begin + t->opt->n);
    tlm_status s =
        h->gather(h->user, t->opt->m, t->opt->begin, t->opt->n, whole ? whole->m : NULL, n);
    if (!s) s = h->gather(h->user, t->opt->v, t->opt->begin, t->opt->n, whole ? whole->v : NULL, n);
    if (!s && whole) whole->step = t->opt->step;
    return s;
}

tlm_status tlm_trainer_save(tlm_trainer *t) {
    const tlm_train_hooks *h = &t->o.hooks;
    int sharded = t->opt->begin != 0 || t->opt->n != t->P.n;
    tlm_adamw *whole = NULL;
    tlm_status s = TLM_OK;
    if (sharded && t->rank == 0) s = trn_adamw_alloc(0, t->P.n, &whole);
    if (sharded && t->world > 1) {
        /* The gathers are collective: all processes skip them if rank 0 has nowhere to put them. */
        double no_room = s != TLM_OK;
        tlm_status r = h->reduce_sum(h->user, &no_room, 1);
        if (r || no_room > 0) {
            tlm_adamw_free(whole);
            return r   ? r
                   : s ? s
                       : core_err(TLM_ERR_NOMEM, "rank 0 is out of memory for the checkpoint");
        }
    }
    if (sharded && !s) s = gather_moments(t, whole);
    if (!s && t->rank == 0 && t->lora) {
        /* The adapter as llama.cpp and PEFT load it, beside the checkpoint. */
        s = trn_lora_checkpoint_save(t->ckpt, t->lora, sharded ? whole : t->opt, &t->st);
        if (!s) s = tlm_lora_save(t->lora, t->model_path);
        if (!s) s = tlm_lora_save_peft(t->lora, t->peft_path);
    } else if (!s && t->rank == 0) {
        s = trn_checkpoint_save(t->ckpt, t->m, sharded ? whole : t->opt, &t->st);
        if (!s) s = tlm_model_save_safetensors(t->m, t->model_path);
    }
    tlm_adamw_free(whole);
    if (t->world > 1) {
        /* Everyone learns whether the checkpoint exists, so no process goes on alone. */
        double failed = s != TLM_OK;
        tlm_status r = h->reduce_sum(h->user, &failed, 1);
        if (r) return r;
        if (!s && failed > 0)
            return core_err(TLM_ERR_IO, "another process could not save the checkpoint (see its "
                                        "error)");
    }
    return s;
}

/* The validation loss of eval_batches batches of B windows, in parts of b windows spread over the
 * processes: the mean of the parts' means, whatever the split. */
/* Validation examples: up to eval_batches x batch rows in order, b rows a pass, the passes spread
 * over the processes; the mean over every trained token. */
static tlm_status evaluate_examples(tlm_trainer *t, float *val) {
    const tlm_train_hooks *h = &t->o.hooks;
    long rows = (long)t->o.eval_batches * t->B;
    if ((size_t)rows > t->vplan.rows) rows = (long)t->vplan.rows;
    double r[3] = {0, 0, 0}; /* loss sum, targets, failed */
    tlm_status s = TLM_OK;
    for (long c = t->rank; !s && c * t->b < rows; c += t->world) {
        int nb = rows - c * t->b < t->b ? (int)(rows - c * t->b) : t->b, T;
        long tk, ck, cnt;
        double loss;
        s = trn_plan_rows(&t->vplan, 0, 0, (uint64_t)c * t->b, nb, t->ids, t->tg, t->pos, &T, &tk,
                          &ck);
        if (!s) s = mdl_ctx_batch_loss(t->x, t->ids, t->tg, nb, T, t->pos, &loss, &cnt);
        if (!s && cnt) {
            r[0] += loss * (double)cnt;
            r[1] += (double)cnt;
        }
    }
    r[2] = s != TLM_OK;
    if (t->world > 1) {
        tlm_status e = h->reduce_sum(h->user, r, 3);
        if (e) return e;
        if (!s && r[2] > 0) return core_err(TLM_ERR_IO, "evaluation failed on another process");
    }
    if (s) return s;
    *val = r[1] > 0 ? (float)(r[0] / r[1]) : NAN;
    return TLM_OK;
}

/* DPO validation: up to eval_batches x batch pairs in order; their mean loss (and sums). */
static tlm_status evaluate_dpo(tlm_trainer *t, float *val) {
    long pairs = (long)t->o.eval_batches * t->B, have = (long)t->vplan.rows / 2;
    if (pairs > have) pairs = have;
    tlm_dpo_stats all = {0};
    tlm_status s = TLM_OK;
    for (long c = t->rank; !s && c * t->b < pairs; c += t->world) {
        int np = pairs - c * t->b < t->b ? (int)(pairs - c * t->b) : t->b, T;
        long tk, ck;
        uint64_t first = (uint64_t)c * (uint64_t)t->rows_b;
        tlm_dpo_stats st;
        s = trn_plan_rows(&t->vplan, 0, 0, first, 2 * np, t->ids, t->tg, t->pos, &T, &tk, &ck);
        if (!s) s = ref_sums(t, &t->vplan, t->vref_logp, 0, first, 2 * np, T, t->row_ref);
        if (!s)
            s = tlm_train_ctx_dpo(t->x, t->ids, t->tg, np, T, t->pos, t->row_ref, &t->o.dpo, 0,
                                  NULL, 0, &st);
        if (!s) dpo_add(&all, &st);
    }
    if (t->world > 1) {
        /* a failure anywhere fails every process (the sums below are collective) */
        double failed = s != TLM_OK;
        tlm_status e = t->o.hooks.reduce_sum(t->o.hooks.user, &failed, 1);
        if (e) return e;
        if (!s && failed > 0) return core_err(TLM_ERR_IO, "evaluation failed on another process");
    }
    if (!s) s = dpo_reduce(t, &all);
    if (s) return s;
    t->val_dpo_st = all;
    *val = all.pairs ? (float)(all.loss / all.pairs) : NAN;
    return TLM_OK;
}

static tlm_status evaluate_split(tlm_trainer *t, float *val) {
    const tlm_train_hooks *h = &t->o.hooks;
    if (t->pairs) return evaluate_dpo(t, val);
    if (t->o.examples) return evaluate_examples(t, val);
    long parts = (long)t->o.eval_batches * t->world * t->K;
    double r[2] = {0, 0};
    tlm_status s = eval_chunks(t->x, t->d, TLM_SPLIT_VAL, t->b, t->T, parts, t->o.seed, t->rank,
                               t->world, t->ids, t->tg, &r[0]);
    r[1] = s != TLM_OK;
    if (t->world > 1) {
        tlm_status e = h->reduce_sum(h->user, r, 2);
        if (e) return e;
        if (!s && r[1] > 0) return core_err(TLM_ERR_IO, "evaluation failed on another process");
    }
    if (s) return s;
    *val = (float)(r[0] / (double)parts);
    return TLM_OK;
}

tlm_status tlm_train_run(tlm_model *m, const tlm_dataset *d, const tlm_train_opts *o) {
    CORE_FP_FLUSH_SCOPE();
    int T = o->seq_len ? o->seq_len : m->c.context_length;
    int do_eval = o->eval_interval > 0 && o->eval_batches > 0 &&
                  (o->examples ? o->val_examples != NULL
                               : d && tlm_dataset_size(d, TLM_SPLIT_VAL) >= (size_t)T + 1);
    if (o->eval_interval > 0 && o->eval_batches > 0 && !do_eval && !o->examples && d &&
        tlm_dataset_size(d, TLM_SPLIT_VAL) > 0)
        return core_err(TLM_ERR_ARG, "validation split has %zu tokens; a window needs %d",
                        tlm_dataset_size(d, TLM_SPLIT_VAL), T + 1);
    char *log_path = core_path_join(o->out_dir, "log.jsonl");
    char *svg_path = core_path_join(o->out_dir, "loss.svg");
    tlm_trainer *t = NULL;
    history hist = {0};
    FILE *log = NULL;
    tlm_status s = TLM_OK;
    if (!log_path || !svg_path) {
        s = core_err(TLM_ERR_NOMEM, "out of memory");
        goto done;
    }
    mkdir(o->out_dir, 0755);
    if ((s = tlm_trainer_new(m, d, o, &t)) != TLM_OK) goto done;
    /* Rank 0 alone writes files; the others keep only what the reductions need. */
    int writer = t->rank == 0;
    if (writer && o->resume) {
        if ((s = reload_log(log_path, t->st.step, &hist)) != TLM_OK) goto done;
    } else if (writer) {
        remove(log_path);
    }
    log = writer ? fopen(log_path, "a") : NULL;
    if (writer && !log) {
        s = core_err(TLM_ERR_IO, "cannot open '%s' for writing", log_path);
        goto done;
    }
    double t_start = core_now_s();
    long first = t->st.step;
    const tlm_train_hooks *hk = &o->hooks;
    while (t->st.step < o->steps) {
        double t0 = core_now_s(), lr, norm;
        float loss, scale;
        /* The step: forward/backward -> gradient reduction (hook) -> clip -> AdamW. */
        if ((s = tlm_trainer_backward(t, &loss)) != TLM_OK) break;
        if (hk->reduce_grads && (s = hk->reduce_grads(hk->user, t->grads, t->P.n, &loss)) != TLM_OK)
            break;
        int moe = t->m->c.n_experts > 0 && !t->pairs;
        if (moe && t->world > 1) {
            if ((s = hk->reduce_sum(hk->user, t->router, 2)) != TLM_OK) break;
            t->router[0] /= t->world;
            t->router[1] /= t->world;
        }
        s = tlm_trainer_clip(t, &norm, &scale);
        if (s == TLM_ERR_NUMERIC || (!s && !isfinite(loss))) {
            s = core_err(TLM_ERR_NUMERIC,
                         "step %ld: loss %g, gradient norm %g; stopped, the last checkpoint is "
                         "kept (try a lower --lr)",
                         t->st.step + 1, (double)loss, norm);
            break;
        }
        if (s) break;
        if ((s = tlm_trainer_update(t, scale, &lr)) != TLM_OK) break;
        long step = t->st.step;
        double dt = core_now_s() - t0;
        int last = step == o->steps;
        int evaluate = do_eval && (step % o->eval_interval == 0 || last);
        float val = NAN;
        if (evaluate && (s = evaluate_split(t, &val)) != TLM_OK) break;
        tlm_train_progress p = {step,
                                o->steps,
                                loss,
                                val,
                                lr,
                                norm,
                                (double)t->step_tokens / dt,
                                core_now_s() - t_start,
                                step - first,
                                t->pairs ? &t->dpo_st : NULL,
                                t->pairs && evaluate ? &t->val_dpo_st : NULL};
        if (writer && (evaluate || last || (o->log_interval > 0 && step % o->log_interval == 0) ||
                       step == 1)) {
            fprintf(log, "{\"step\": %ld, \"train_loss\": %.6f", step, (double)loss);
            if (evaluate) fprintf(log, ", \"val_loss\": %.6f", (double)val);
            if (moe)
                fprintf(log, ", \"router_aux_loss\": %.6g, \"router_z_loss\": %.6g", t->router[0],
                        t->router[1]);
            if (p.dpo) log_dpo(log, "", p.dpo, o->dpo.rpo_alpha > 0);
            if (p.val_dpo) log_dpo(log, "val_", p.val_dpo, o->dpo.rpo_alpha > 0);
            fprintf(log, ", \"lr\": %.6g, \"grad_norm\": %.6g, \"tokens_per_s\": %.1f}\n", lr, norm,
                    p.tokens_per_s);
            fflush(log);
            hist_add(&hist, step, loss, val);
        }
        int stop = o->stop && *o->stop;
        if (o->on_progress && o->on_progress(o->user, &p)) stop = 1;
        if (t->world > 1) {
            /* A stop request on any process (a signal reaches only one) stops them all, after
             * the same save. */
            double any = stop;
            if ((s = hk->reduce_sum(hk->user, &any, 1)) != TLM_OK) break;
            stop = any > 0;
        }
        int save = last || stop || evaluate ||
                   (o->checkpoint_interval > 0 && step % o->checkpoint_interval == 0);
        if (save) {
            if ((s = tlm_trainer_save(t)) != TLM_OK) break;
            if (writer && (s = write_svg(svg_path, &hist, o->steps)) != TLM_OK) break;
        }
        if (stop && !last) {
            s = core_err(TLM_ERR_INTERRUPTED,
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
