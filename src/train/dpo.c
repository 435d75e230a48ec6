/* Direct preference optimisation over a context's passes: the policy's log-probabilities of each
 * answer from a training forward, the pairs' losses and their derivatives in double, and the
 * backward with each answer token's weight (tlm_train_ctx_backward_weighted). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train/train.h"

void tlm_dpo_opts_defaults(tlm_dpo_opts *o) {
    o->beta = 0.1;
    o->label_smoothing = 0;
    o->rpo_alpha = 0;
}

/* log sigmoid(z), without overflow either way. */
static double log_sigmoid(double z) { return z >= 0 ? -log1p(exp(-z)) : z - log1p(exp(z)); }
static double sigmoid(double z) { return z >= 0 ? 1 / (1 + exp(-z)) : exp(z) / (1 + exp(z)); }

tlm_status tlm_train_ctx_dpo(tlm_train_ctx *x, const int32_t *ids, const int32_t *targets, int P,
                             int T, const int32_t *pos, const double *ref_logp,
                             const tlm_dpo_opts *d, double divisor, float *grads, int accumulate,
                             tlm_dpo_stats *st) {
    tlm_dpo_opts dflt;
    if (!d) {
        tlm_dpo_opts_defaults(&dflt);
        d = &dflt;
    }
    if (!x || !ids || !targets || !ref_logp || P <= 0 || T <= 0)
        return core_err(TLM_ERR_ARG, "dpo: context, %d pairs of %d tokens and ref_logp needed", P,
                        T);
    if (!(d->beta > 0) || !(d->label_smoothing >= 0 && d->label_smoothing < 0.5) ||
        !(d->rpo_alpha >= 0))
        return core_err(TLM_ERR_ARG,
                        "dpo: beta %g must be > 0, label smoothing %g in [0, 0.5), rpo_alpha %g "
                        ">= 0",
                        d->beta, d->label_smoothing, d->rpo_alpha);
    size_t N = (size_t)2 * P * T;
    float *logp = malloc(N * sizeof *logp), *w = grads ? malloc(N * sizeof *w) : NULL;
    tlm_status s = TLM_OK;
    if (!logp || (grads && !w)) s = core_err(TLM_ERR_NOMEM, "out of memory");
    tlm_batch_opts o = {pos, 0, 0};
    if (!s)
        s = grads ? tlm_train_ctx_forward_logp(x, ids, targets, 2 * P, T, &o, logp)
                  : tlm_train_ctx_token_logp(x, ids, targets, 2 * P, T, pos, logp);
    tlm_dpo_stats acc = {0};
    acc.pairs = P;
    double eps = d->label_smoothing, beta = d->beta, div = divisor > 0 ? divisor : P;
    /* RPO: the chosen answers' mean cross-entropy over this batch's chosen tokens, added to every
     * pair's loss (so alpha times it to the pairs' mean) */
    long chosen_tokens = 0;
    for (int i = 0; i < P; i++)
        for (int t = 0; t < T; t++) chosen_tokens += targets[(size_t)2 * i * T + t] >= 0;
    double rpo = d->rpo_alpha > 0 && chosen_tokens ? d->rpo_alpha / (double)chosen_tokens : 0;
    for (int i = 0; i < P && !s; i++) {
        double lp[2] = {0, 0};
        for (int k = 0; k < 2; k++) {
            size_t r = (size_t)(2 * i + k) * T;
            for (int t = 0; t < T; t++)
                if (targets[r + t] >= 0) lp[k] += logp[r + t];
        }
        double rw = beta * (lp[0] - ref_logp[2 * i]), rl = beta * (lp[1] - ref_logp[2 * i + 1]);
        double z = rw - rl;
        acc.loss += -(1 - eps) * log_sigmoid(z) - eps * log_sigmoid(-z);
        acc.chosen_reward += rw;
        acc.rejected_reward += rl;
        acc.chosen_logp += lp[0];
        acc.rejected_logp += lp[1];
        acc.correct += rw > rl;
        /* -lp[0] / chosen_tokens is this pair's share of the batch's mean cross-entropy; P of
         * them make a pair's nll term, whose pairs' mean is the batch's */
        acc.nll += -lp[0] * P / (double)(chosen_tokens ? chosen_tokens : 1);
        acc.loss += rpo * -lp[0] * P;
        if (!grads) continue;
        /* dloss/dz, then dz/dlog pi(w) = beta, dz/dlog pi(l) = -beta; the backward takes
         * -dL/dlogp per token */
        double g = (-(1 - eps) * sigmoid(-z) + eps * sigmoid(z)) / div;
        for (int k = 0; k < 2; k++) {
            /* the RPO term: alpha * P / chosen_tokens per chosen token, over div */
            float wk = (float)(-(k ? -beta : beta) * g + (k ? 0 : rpo * P / div));
            size_t r = (size_t)(2 * i + k) * T;
            for (int t = 0; t < T; t++) w[r + t] = targets[r + t] >= 0 ? wk : 0.0f;
        }
    }
    if (!s && grads) s = tlm_train_ctx_backward_weighted(x, w, grads, accumulate, NULL);
    free(logp);
    free(w);
    if (!s && st) *st = acc;
    return s;
}
