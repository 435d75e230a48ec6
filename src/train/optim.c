/* AdamW with PyTorch's semantics, the learning-rate schedule and gradient clipping. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

tlm_status tlm_adamw_create(const tlm_model *m, tlm_adamw **out) {
    return tlm_adamw_create_range(m, 0, m->n_params, out);
}

tlm_status tlm_adamw_create_range(const tlm_model *m, size_t begin, size_t end, tlm_adamw **out) {
    *out = NULL;
    if (begin >= end || end > m->n_params)
        return tlm_err(TLM_ERR_ARG, "optimizer range [%zu, %zu) is not inside the %zu parameters",
                       begin, end, m->n_params);
    tlm_adamw *o = calloc(1, sizeof *o);
    if (!o) return tlm_err(TLM_ERR_NOMEM, "out of memory");
    o->begin = begin;
    o->n = end - begin;
    o->m = tlm_big_alloc(o->n * sizeof(float));
    o->v = tlm_big_alloc(o->n * sizeof(float));
    if (!o->m || !o->v) {
        tlm_adamw_free(o);
        return tlm_err(TLM_ERR_NOMEM, "out of memory for optimizer state");
    }
    *out = o;
    return TLM_OK;
}

void tlm_adamw_free(tlm_adamw *o) {
    if (!o) return;
    tlm_big_free(o->m, o->n * sizeof(float));
    tlm_big_free(o->v, o->n * sizeof(float));
    free(o);
}

/* Double literals: PyTorch's hyperparameters are Python floats, and 0.9f would be 0.89999998. */
void tlm_adamw_defaults(tlm_adamw_opts *h) {
    h->beta1 = 0.9;
    h->beta2 = 0.95;
    h->eps = 1e-8;
    h->weight_decay = 0.1;
}

tlm_status tlm_adamw_step(tlm_adamw *o, tlm_model *m, const float *grads, double lr,
                          const tlm_adamw_opts *h) {
    return tlm_adamw_step_scaled(o, m, grads, 1.0f, lr, h);
}

tlm_status tlm_adamw_step_scaled(tlm_adamw *o, tlm_model *m, const float *grads, float grad_scale,
                                 double lr, const tlm_adamw_opts *h) {
    FP_FLUSH_SCOPE();
    if (o->begin + o->n > m->n_params)
        return tlm_err(TLM_ERR_ARG, "optimizer does not match the model");
    if (!m->st.params)
        return tlm_err(TLM_ERR_ARG, "optimizer: the model is read-only (load it with "
                                    "TLM_LOAD_WRITABLE)");
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
    /* One parallel region for all tensors: most tensors of a small model are too small to be
     * worth a fork/join each, and `nowait` lets threads run ahead into the next tensor. Tensors
     * are clipped to the optimizer's range (a shard may start or end inside one). */
#pragma omp parallel
    for (int t = 0; t < m->n_tensors; t++) {
        const tlm_tensor_info *ti = &m->tensors[t];
        size_t lo = ti->offset > lo_all ? ti->offset : lo_all;
        size_t hi = ti->offset + ti->numel < hi_all ? ti->offset + ti->numel : hi_all;
        if (lo >= hi) continue;
        float *p = m->st.params + lo, *mm = o->m + (lo - o->begin), *vv = o->v + (lo - o->begin);
        const float *g = grads + lo;
        float dec = ti->decay ? decay : 1.0f;
        long n = (long)(hi - lo);
#pragma omp for schedule(static) nowait
        for (long i = 0; i < n; i++) {
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
    return TLM_OK;
}

double tlm_lr_at(const tlm_schedule *s, long step) {
    if (s->warmup > 0 && step < s->warmup)
        return s->max_lr * (double)(step + 1) / (double)s->warmup;
    long span = s->total_steps - 1 - s->warmup;
    if (span <= 0 || step >= s->total_steps - 1) return s->min_lr;
    double ratio = (double)(step - s->warmup) / (double)span;
    double coeff = 0.5 * (1.0 + cos(3.14159265358979323846 * ratio));
    return s->min_lr + coeff * (s->max_lr - s->min_lr);
}

double tlm_grad_norm(const float *grads, size_t n) { return sqrt(tlm_grad_sumsq(grads, n)); }

double tlm_grad_sumsq(const float *grads, size_t n) {
    FP_FLUSH_SCOPE();
    /* Fixed chunks summed in a fixed order: the norm (and so clipping) is bit-for-bit the same
     * whatever the thread count or scheduling, which exact resumption relies on. */
    enum { CHUNKS = 256 };
    double part[CHUNKS];
    size_t per = (n + CHUNKS - 1) / CHUNKS;
#pragma omp parallel for schedule(static)
    for (int c = 0; c < CHUNKS; c++) {
        size_t lo = (size_t)c * per, hi = lo + per < n ? lo + per : n;
        double ss = 0.0;
        /* A fixed vector-lane order per chunk: still the same result on every run. */
#pragma omp simd reduction(+ : ss)
        for (size_t i = lo; i < hi; i++) ss += (double)grads[i] * grads[i];
        part[c] = ss;
    }
    double ss = 0.0;
    for (int c = 0; c < CHUNKS; c++) ss += part[c];
    return ss;
}

float tlm_clip_coef(double norm, double max_norm) {
    /* torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) only when below 1. */
    if (max_norm <= 0 || !isfinite(norm)) return 1.0f;
    double coef = max_norm / (norm + 1e-6);
    return coef < 1.0 ? (float)coef : 1.0f;
}

double tlm_clip_grad_norm(float *grads, size_t n, double max_norm) {
    FP_FLUSH_SCOPE();
    double norm = tlm_grad_norm(grads, n);
    float c = tlm_clip_coef(norm, max_norm);
    if (c != 1.0f) {
        long nn = (long)n;
#pragma omp parallel for schedule(static)
        for (long i = 0; i < nn; i++) grads[i] *= c;
    }
    return norm;
}
