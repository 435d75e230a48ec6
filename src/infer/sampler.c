/* Sampling ids from logits: penalties, greedy, temperature, top-k, min-p, top-p. The work per draw
 * is O(V) plus a sort of the few ids that can matter: top-k keeps a k-heap, and top-p first drops
 * every id whose probability is below (1 - p) / n, which no id of the nucleus can be (if the
 * smallest member s of the nucleus were below it, the ids outside the nucleus minus s, at most n of
 * them each no likelier than s, would hold less than 1 - p, so the nucleus without s would already
 * reach p). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "infer/infer.h"

typedef struct {
    double w;
    int32_t id;
} cand;

struct tlm_sampler {
    tlm_sampler_opts o;
    int V;
    core_rng rng;
    int32_t *idx; /* [V] candidate ids */
    double *w;    /* [V] their unnormalized probabilities, same order as idx */
    cand *c;      /* [V] top-p sorting space */
    int penalize;
    float *pl;     /* [V] penalized logits (penalize only) */
    int32_t *hist; /* [penalty_last_n] ring of accepted ids */
    int n_hist, hist_pos;
};

void tlm_sampler_opts_defaults(tlm_sampler_opts *o) {
    /* every field: the ones added later (min_p, the penalties) are off at zero */
    *o = (tlm_sampler_opts){.temperature = 0.8f, .top_k = 40, .top_p = 0.95f};
}

tlm_status tlm_sampler_new(const tlm_sampler_opts *o, int vocab_size, tlm_sampler **out) {
    if (!out) return core_err(TLM_ERR_ARG, "sampler: out must not be NULL");
    *out = NULL;
    tlm_sampler_opts def;
    if (!o) {
        tlm_sampler_opts_defaults(&def);
        o = &def;
    }
    if (vocab_size <= 0)
        return core_err(TLM_ERR_ARG, "sampler: vocab_size %d must be positive", vocab_size);
    if (!(o->temperature >= 0.0f) || isinf(o->temperature))
        return core_err(TLM_ERR_ARG, "sampler: temperature %g must be finite and >= 0",
                        (double)o->temperature);
    if (!(o->top_p > 0.0f))
        return core_err(TLM_ERR_ARG, "sampler: top_p %g must be > 0 (1 disables it)",
                        (double)o->top_p);
    if (o->top_k < 0) return core_err(TLM_ERR_ARG, "sampler: top_k %d must be >= 0", o->top_k);
    if (!(o->min_p >= 0.0f && o->min_p <= 1.0f))
        return core_err(TLM_ERR_ARG, "sampler: min_p %g must be in [0, 1]", (double)o->min_p);
    if (!(o->repeat_penalty >= 0.0f) || isinf(o->repeat_penalty))
        return core_err(TLM_ERR_ARG, "sampler: repeat_penalty %g must be finite and >= 0",
                        (double)o->repeat_penalty);
    if (!isfinite(o->presence_penalty) || !isfinite(o->frequency_penalty))
        return core_err(TLM_ERR_ARG, "sampler: presence and frequency penalties must be finite");
    if (o->penalty_last_n < 0 || o->penalty_last_n > (1 << 20))
        return core_err(TLM_ERR_ARG, "sampler: penalty_last_n %d must be in [0, 2^20]",
                        o->penalty_last_n);
    tlm_sampler *s = calloc(1, sizeof *s);
    if (!s) return core_err(TLM_ERR_NOMEM, "out of memory");
    s->o = *o;
    s->V = vocab_size;
    s->idx = malloc((size_t)vocab_size * sizeof *s->idx);
    s->w = malloc((size_t)vocab_size * sizeof *s->w);
    s->c = malloc((size_t)vocab_size * sizeof *s->c);
    s->penalize = (o->repeat_penalty != 0.0f && o->repeat_penalty != 1.0f) ||
                  o->presence_penalty != 0.0f || o->frequency_penalty != 0.0f;
    int last_n = o->penalty_last_n ? o->penalty_last_n : 64;
    if (s->penalize) {
        s->pl = malloc((size_t)vocab_size * sizeof *s->pl);
        s->hist = malloc((size_t)last_n * sizeof *s->hist);
        s->o.penalty_last_n = last_n;
    }
    if (!s->idx || !s->w || !s->c || (s->penalize && (!s->pl || !s->hist))) {
        tlm_sampler_free(s);
        return core_err(TLM_ERR_NOMEM, "out of memory for a sampler over %d ids", vocab_size);
    }
    core_rng_seed(&s->rng, o->seed, o->stream);
    *out = s;
    return TLM_OK;
}

void tlm_sampler_free(tlm_sampler *s) {
    if (!s) return;
    free(s->idx);
    free(s->w);
    free(s->c);
    free(s->pl);
    free(s->hist);
    free(s);
}

/* a ranks before b: larger logit, then lower id. A strict total order keeps ties reproducible. */
static inline int before(const float *logits, int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
}

/* Min-heap (by `before`, root = the worst kept id) of the k best ids. */
static void sift_down(const float *logits, int32_t *h, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && before(logits, h[w], h[l])) w = l;
        if (r < n && before(logits, h[w], h[r])) w = r;
        if (w == i) return;
        int32_t t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

static int top_k_ids(const float *logits, int V, int k, int32_t *h) {
    for (int i = 0; i < k; i++) h[i] = i;
    for (int i = k / 2 - 1; i >= 0; i--) sift_down(logits, h, k, i);
    for (int32_t id = k; id < V; id++)
        if (before(logits, id, h[0])) {
            h[0] = id;
            sift_down(logits, h, k, 0);
        }
    return k;
}

static int cand_cmp(const void *pa, const void *pb) {
    const cand *a = pa, *b = pb;
    if (a->w != b->w) return a->w > b->w ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

/* Reorders the n candidates so that the nucleus comes first; returns its size. total is the sum
 * of w. Candidates below the cutoff are set aside before sorting (see the top of the file). */
static int nucleus(cand *c, int32_t *idx, double *w, int n, double total, double p) {
    double cutoff = (1.0 - p) / n * total;
    int m = 0;
    for (int i = 0; i < n; i++)
        if (w[i] >= cutoff) c[m++] = (cand){w[i], idx[i]};
    for (int pass = 0; pass < 2; pass++) {
        qsort(c, (size_t)m, sizeof *c, cand_cmp);
        double acc = 0.0, need = p * total;
        for (int i = 0; i < m; i++) {
            acc += c[i].w;
            if (acc >= need) {
                for (int j = 0; j <= i; j++) {
                    idx[j] = c[j].id;
                    w[j] = c[j].w;
                }
                return i + 1;
            }
        }
        /* Rounding kept the filtered mass just under p: sort everything once. */
        m = 0;
        for (int i = 0; i < n; i++) c[m++] = (cand){w[i], idx[i]};
    }
    return n;
}

void tlm_sampler_accept(tlm_sampler *s, int32_t id) {
    if (!s || !s->penalize || id < 0 || id >= s->V) return;
    s->hist[s->hist_pos] = id;
    s->hist_pos = (s->hist_pos + 1) % s->o.penalty_last_n;
    if (s->n_hist < s->o.penalty_last_n) s->n_hist++;
}

/* Copies the logits with the penalties of the ids in the window applied; each distinct id once. */
static const float *penalized(tlm_sampler *s, const float *logits) {
    memcpy(s->pl, logits, (size_t)s->V * sizeof *s->pl);
    float rp = s->o.repeat_penalty == 0.0f ? 1.0f : s->o.repeat_penalty;
    for (int i = 0; i < s->n_hist; i++) {
        int32_t id = s->hist[i], count = 0, first = 1;
        for (int j = 0; j < s->n_hist; j++) {
            if (s->hist[j] != id) continue;
            if (j < i) first = 0;
            count++;
        }
        if (!first) continue;
        float l = s->pl[id];
        l = l > 0 ? l / rp : l * rp;
        s->pl[id] = l - (float)count * s->o.frequency_penalty - s->o.presence_penalty;
    }
    return s->pl;
}

/* The candidates tlm_sampler_sample draws from: *best receives the id greedy decoding returns;
 * with a temperature, idx[0..*n) and w[0..*n) the ids kept and their unnormalized probabilities,
 * summing to *total. */
static tlm_status prepare(tlm_sampler *s, const float *logits, int32_t *best_out, int *n_out,
                          double *total_out) {
    int V = s->V;
    if (s->penalize && s->n_hist) logits = penalized(s, logits);
    /* The first index of the largest logit above -inf: a branch-free pass for the maximum (and
     * whether any logit is NaN), then the first index holding it. */
    int32_t best = -1;
    float top = -INFINITY;
    int nan = 0;
    for (int32_t i = 0; i < V; i++) {
        float l = logits[i];
        nan |= l != l;
        top = l > top ? l : top;
    }
    if (nan)
        for (int32_t i = 0; i < V; i++)
            if (isnan(logits[i])) return core_err(TLM_ERR_NUMERIC, "sample: logit %d is NaN", i);
    if (top > -INFINITY)
        for (best = 0; logits[best] != top; best++) {
        }
    if (best < 0 || isinf(logits[best]))
        return core_err(TLM_ERR_NUMERIC, "sample: the logits hold no finite maximum");
    *best_out = best;
    *n_out = 0;
    *total_out = 0.0;
    if (s->o.temperature == 0.0f) return TLM_OK;
    int n = V;
    if (s->o.top_k > 0 && s->o.top_k < V) {
        n = top_k_ids(logits, V, s->o.top_k, s->idx);
    } else {
        for (int32_t i = 0; i < V; i++) s->idx[i] = i;
    }
    double inv_t = 1.0 / s->o.temperature, mx = logits[best], total = 0.0;
    for (int i = 0; i < n; i++) {
        s->w[i] = exp(((double)logits[s->idx[i]] - mx) * inv_t);
        total += s->w[i];
    }
    if (s->o.min_p > 0.0f) {
        /* The likeliest id has weight 1 (its logit is mx), so min_p compares weights directly. */
        int m = 0;
        total = 0.0;
        for (int i = 0; i < n; i++)
            if (s->w[i] >= s->o.min_p) {
                s->idx[m] = s->idx[i];
                s->w[m] = s->w[i];
                total += s->w[m++];
            }
        n = m;
    }
    if (s->o.top_p < 1.0f) {
        n = nucleus(s->c, s->idx, s->w, n, total, s->o.top_p);
        total = 0.0;
        for (int i = 0; i < n; i++) total += s->w[i];
    }
    *n_out = n;
    *total_out = total;
    return TLM_OK;
}

tlm_status tlm_sampler_sample(tlm_sampler *s, const float *logits, int32_t *id) {
    CORE_FP_FLUSH_SCOPE();
    if (!s || !logits || !id) return core_err(TLM_ERR_ARG, "sample: NULL argument");
    int32_t best;
    int n;
    double total;
    tlm_status st = prepare(s, logits, &best, &n, &total);
    if (st) return st;
    if (s->o.temperature == 0.0f) {
        *id = best;
        return TLM_OK;
    }
    double u = core_rng_double_open(&s->rng) * total, acc = 0.0;
    for (int i = 0; i < n; i++) {
        acc += s->w[i];
        if (u < acc) {
            *id = s->idx[i];
            return TLM_OK;
        }
    }
    *id = s->idx[n - 1]; /* u landed in the rounding slack at the very top */
    return TLM_OK;
}

tlm_status tlm_sampler_probs(tlm_sampler *s, const float *logits, float *probs) {
    CORE_FP_FLUSH_SCOPE();
    if (!s || !logits || !probs) return core_err(TLM_ERR_ARG, "sampler probs: NULL argument");
    int32_t best;
    int n;
    double total;
    tlm_status st = prepare(s, logits, &best, &n, &total);
    if (st) return st;
    memset(probs, 0, (size_t)s->V * sizeof *probs);
    if (s->o.temperature == 0.0f) {
        probs[best] = 1.0f;
        return TLM_OK;
    }
    for (int i = 0; i < n; i++) probs[s->idx[i]] = (float)(s->w[i] / total);
    return TLM_OK;
}

double infer_sampler_uniform(tlm_sampler *s) { return core_rng_double_open(&s->rng); }

void infer_sampler_copy_window(tlm_sampler *dst, const tlm_sampler *src) {
    if (!dst->penalize || !src->penalize || dst->o.penalty_last_n != src->o.penalty_last_n) return;
    memcpy(dst->hist, src->hist, (size_t)src->o.penalty_last_n * sizeof *dst->hist);
    dst->n_hist = src->n_hist;
    dst->hist_pos = src->hist_pos;
}
