/* AdamW with PyTorch's semantics, the learning-rate schedule and gradient clipping. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "model/model.h"
#include "train/train.h"

tlm_status tlm_adamw_new(const tlm_model *m, tlm_adamw **out) {
    return tlm_adamw_new_range(m, 0, m->n_params, out);
}

tlm_status tlm_adamw_new_range(const tlm_model *m, size_t begin, size_t end, tlm_adamw **out) {
    *out = NULL;
    if (begin >= end || end > m->n_params)
        return core_err(TLM_ERR_ARG, "optimizer range [%zu, %zu) is not inside the %zu parameters",
                        begin, end, m->n_params);
    return trn_adamw_alloc(begin, end, out);
}

tlm_status trn_adamw_alloc(size_t begin, size_t end, tlm_adamw **out) {
    *out = NULL;
    tlm_adamw *o = calloc(1, sizeof *o);
    if (!o) return core_err(TLM_ERR_NOMEM, "out of memory");
    o->begin = begin;
    o->n = end - begin;
    o->m = core_big_alloc(o->n * sizeof(float));
    o->v = core_big_alloc(o->n * sizeof(float));
    if (!o->m || !o->v) {
        tlm_adamw_free(o);
        return core_err(TLM_ERR_NOMEM, "out of memory for optimizer state");
    }
    *out = o;
    return TLM_OK;
}

void tlm_adamw_free(tlm_adamw *o) {
    if (!o) return;
    core_big_free(o->m, o->n * sizeof(float));
    core_big_free(o->v, o->n * sizeof(float));
    free(o);
}

void tlm_adamw_range(const tlm_adamw *o, size_t *begin, size_t *n) {
    *begin = o->begin;
    *n = o->n;
}

void tlm_adamw_moments(tlm_adamw *o, float **m, float **v) {
    *m = o->m;
    *v = o->v;
}

long tlm_adamw_steps(const tlm_adamw *o) { return o->step; }

void tlm_adamw_set_steps(tlm_adamw *o, long steps) { o->step = steps; }

/* Double literals: PyTorch's hyperparameters are Python floats, and 0.9f would be 0.89999998. */
void tlm_adamw_opts_defaults(tlm_adamw_opts *h) {
    h->beta1 = 0.9;
    h->beta2 = 0.95;
    h->eps = 1e-8;
    h->weight_decay = 0.1;
}

tlm_status tlm_adamw_step(tlm_adamw *o, tlm_model *m, const float *grads, double lr,
                          const tlm_adamw_opts *h) {
    return tlm_adamw_step_scaled(o, m, grads, 1.0f, lr, h);
}

/* The update's scalars, the same for every element of a tensor. */
typedef struct {
    float dec, grad_scale, b1, a1, b2, a2, bc2_sqrt, eps, step_size;
} adamw_consts;

/* Elements [a, b) of one tensor. */
K_INLINE void adamw_span(float *p, float *mm, float *vv, const float *g, const adamw_consts *k,
                         long a, long b) {
    float dec = k->dec, grad_scale = k->grad_scale, b1 = k->b1, a1 = k->a1, b2 = k->b2, a2 = k->a2;
    float bc2_sqrt = k->bc2_sqrt, eps = k->eps, step_size = k->step_size;
    for (long i = a; i < b; i++) {
        float pi = p[i] * dec;
        float gi = g[i] * grad_scale; /* the same product clipping in place would make */
        float mi = mm[i] * b1 + a1 * gi;
        float vi = vv[i] * b2 + a2 * gi * gi;
        mm[i] = mi;
        vv[i] = vi;
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        p[i] = pi - step_size * (mi / denom);
    }
}
K_VERSIONS(adamw_span,
           (float *p, float *mm, float *vv, const float *g, const adamw_consts *k, long a, long b),
           (p, mm, vv, g, k, a, b))

tlm_status tlm_adamw_step_scaled(tlm_adamw *o, tlm_model *m, const float *grads, float grad_scale,
                                 double lr, const tlm_adamw_opts *h) {
    if (o->begin + o->n > m->n_params)
        return core_err(TLM_ERR_ARG, "optimizer does not match the model");
    if (!m->st.params)
        return core_err(TLM_ERR_ARG, "optimizer: the model is read-only (load it with "
                                     "TLM_LOAD_WRITABLE)");
    trn_params ps = {m->st.params, m->n_params, m->tensors, m->n_tensors};
    trn_adamw_update(o, &ps, grads, grad_scale, lr, h);
    return TLM_OK;
}

void trn_adamw_update(tlm_adamw *o, const trn_params *ps, const float *grads, float grad_scale,
                      double lr, const tlm_adamw_opts *h) {
    CORE_FP_FLUSH_SCOPE();
    o->step++;
    /* The scalars follow torch.optim.AdamW (single-tensor path): bias corrections in double,
     * then float tensor arithmetic in the same order. */
    double bc1 = 1.0 - pow(h->beta1, (double)o->step);
    double bc2 = 1.0 - pow(h->beta2, (double)o->step);
    float step_size = (float)(lr / bc1);
    float bc2_sqrt = (float)sqrt(bc2);
    float b1 = (float)h->beta1, b2 = (float)h->beta2, eps = (float)h->eps;
    float a1 = (float)(1.0 - h->beta1), a2 = (float)(1.0 - h->beta2);
    float decay = (float)(1.0 - lr * h->weight_decay);
    size_t lo_all = o->begin, hi_all = o->begin + o->n;
    adamw_span_fn *f = adamw_span_pick();
    /* One parallel region for all tensors: most tensors of a small model are too small to be
     * worth a fork/join each, and with no barrier between tensors threads run ahead into the
     * next one. Each thread takes its static share of every tensor. Tensors are clipped to the
     * optimizer's range (a shard may start or end inside one). */
#pragma omp parallel
    for (int t = 0; t < ps->n_tensors; t++) {
        const tlm_tensor_info *ti = &ps->tensors[t];
        size_t lo = ti->offset > lo_all ? ti->offset : lo_all;
        size_t hi = ti->offset + ti->numel < hi_all ? ti->offset + ti->numel : hi_all;
        if (lo >= hi) continue;
        adamw_consts k = {
            ti->decay ? decay : 1.0f, grad_scale, b1, a1, b2, a2, bc2_sqrt, eps, step_size};
        long a, b;
        k_share((long)(hi - lo), &a, &b);
        if (a < b)
            f(ps->params + lo, o->m + (lo - o->begin), o->v + (lo - o->begin), grads + lo, &k, a,
              b);
    }
}

double tlm_schedule_lr(const tlm_schedule *s, long step) {
    if (s->warmup > 0 && step < s->warmup)
        return s->max_lr * (double)(step + 1) / (double)s->warmup;
    long span = s->total_steps - 1 - s->warmup;
    if (span <= 0 || step >= s->total_steps - 1) return s->min_lr;
    double ratio = (double)(step - s->warmup) / (double)span;
    double coeff = 0.5 * (1.0 + cos(3.14159265358979323846 * ratio));
    return s->min_lr + coeff * (s->max_lr - s->min_lr);
}

double tlm_grad_norm(const float *grads, size_t n) { return sqrt(tlm_grad_sumsq(grads, n)); }

/* The sum of squares of g[0, n) in a fixed vector-lane order: the same result on every run. */
K_INLINE void sumsq_span(const float *g, size_t n, double *out) {
    double ss = 0.0;
#pragma omp simd reduction(+ : ss)
    for (size_t i = 0; i < n; i++) ss += (double)g[i] * g[i];
    *out = ss;
}
K_VERSIONS(sumsq_span, (const float *g, size_t n, double *out), (g, n, out))

double tlm_grad_sumsq(const float *grads, size_t n) {
    CORE_FP_FLUSH_SCOPE();
    /* Fixed chunks summed in a fixed order: the norm (and so clipping) is bit-for-bit the same
     * whatever the thread count or scheduling, which exact resumption relies on. */
    enum { CHUNKS = 256 };
    double part[CHUNKS];
    size_t per = (n + CHUNKS - 1) / CHUNKS;
    sumsq_span_fn *f = sumsq_span_pick();
#pragma omp parallel for schedule(static)
    for (int c = 0; c < CHUNKS; c++) {
        size_t lo = (size_t)c * per, hi = lo + per < n ? lo + per : n;
        part[c] = 0.0;
        if (lo < hi) f(grads + lo, hi - lo, &part[c]);
    }
    double ss = 0.0;
    for (int c = 0; c < CHUNKS; c++) ss += part[c];
    return ss;
}

float tlm_grad_clip_coef(double norm, double max_norm) {
    /* torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) only when below 1. */
    if (max_norm <= 0 || !isfinite(norm)) return 1.0f;
    double coef = max_norm / (norm + 1e-6);
    return coef < 1.0 ? (float)coef : 1.0f;
}

K_INLINE void scale_span(float *g, float c, long a, long b) {
    for (long i = a; i < b; i++) g[i] *= c;
}
K_VERSIONS(scale_span, (float *g, float c, long a, long b), (g, c, a, b))

double tlm_grad_clip(float *grads, size_t n, double max_norm) {
    CORE_FP_FLUSH_SCOPE();
    double norm = tlm_grad_norm(grads, n);
    float c = tlm_grad_clip_coef(norm, max_norm);
    if (c != 1.0f) {
        scale_span_fn *f = scale_span_pick();
#pragma omp parallel
        {
            long a, b;
            k_share((long)n, &a, &b);
            if (a < b) f(grads, c, a, b);
        }
    }
    return norm;
}
