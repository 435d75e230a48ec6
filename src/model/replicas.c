/* Data parallelism for small models: the batch is split across threads, each running a replica
 * context (the shared model, its own activations and gradient buffer) single-threaded through
 * whole layers. Used by training passes and by evaluation. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "model/ctx.h"

enum { MAXR = 64 };

void mdl_ctx_free_replicas(tlm_train_ctx *x) {
    for (int r = 0; r < x->n_replicas; r++) {
        tlm_train_ctx_free(x->replicas[r]);
        core_big_free(x->replica_grads[r], x->replica_grad_floats * sizeof(float));
    }
    free(x->replicas);
    free(x->replica_grads);
    x->replicas = NULL;
    x->replica_grads = NULL;
    x->n_replicas = 0;
}

static tlm_status make_replicas(tlm_train_ctx *x, int R) {
    size_t gn = mdl_ctx_grad_floats(x);
    if (x->n_replicas == R && x->replica_grad_floats == gn) return TLM_OK;
    mdl_ctx_free_replicas(x);
    x->replica_grad_floats = gn;
    x->replicas = calloc((size_t)R, sizeof *x->replicas);
    x->replica_grads = calloc((size_t)R, sizeof *x->replica_grads);
    if (!x->replicas || !x->replica_grads) {
        free(x->replicas);
        free(x->replica_grads);
        x->replicas = NULL;
        x->replica_grads = NULL;
        return core_err(TLM_ERR_NOMEM, "out of memory");
    }
    x->n_replicas = R;
    for (int r = 0; r < R; r++) {
        /* replica 0 writes into the caller's gradient buffer */
        if (tlm_train_ctx_new(x->m, &x->replicas[r]) != TLM_OK ||
            (r && !(x->replica_grads[r] = core_big_alloc(gn * sizeof(float))))) {
            mdl_ctx_free_replicas(x);
            return core_err(TLM_ERR_NOMEM, "out of memory for data-parallel replicas");
        }
        x->replicas[r]->is_replica = 1;
        x->replicas[r]->data_parallel = 0;
    }
    /* The replicas apply the caller's adapters (setting them again passes them on). */
    if (x->n_lora) {
        const tlm_lora *a[MAXR];
        float sc[MAXR];
        int n = x->n_lora < MAXR ? x->n_lora : MAXR;
        for (int i = 0; i < n; i++) {
            a[i] = x->lora_use[i].a;
            sc[i] = x->lora_use[i].scale;
        }
        tlm_status s = tlm_train_ctx_set_loras(x, a, sc, n);
        if (s) return s;
    }
    return tlm_train_ctx_set_precision(x, x->precision);
}

/* Splitting the batch across threads, each running whole layers single-threaded, beats putting
 * both threads on every small operation when operations are small: their fork/join and the
 * small-matrix inefficiency of a shared sgemm dominate there. Large layers keep both threads on
 * each product (and need no second copy of the activations or gradients). Sets *R to the number
 * of slices (1: run the batch whole) and makes their replicas. */
static tlm_status split_batch(tlm_train_ctx *x, int B, int *R) {
    int threads = omp_get_max_threads();
    *R = 1;
    if (threads < 2 || B < 2 || x->is_replica || omp_in_parallel() || x->data_parallel == 0)
        return TLM_OK;
    int n = threads < B ? threads : B;
    if (n > MAXR) n = MAXR;
    if (x->data_parallel != 1 && !(x->m->c.d_model <= 512 && x->m->n_params <= (size_t)64 << 20))
        return TLM_OK;
    *R = n;
    return make_replicas(x, n);
}

/* Slice r of R of a batch of B sequences: sequences [*b0, *b1). */
static void slice(int B, int r, int R, int *b0, int *b1) {
    *b0 = B * r / R;
    *b1 = B * (r + 1) / R;
}

/* What each slice's thread reports: the library's error message is per thread. */
typedef struct {
    tlm_status st;
    char msg[256];
} slice_status;

static void slice_report(slice_status *s, tlm_status st) {
    s->st = st;
    snprintf(s->msg, sizeof s->msg, "%s", st ? tlm_last_error() : "");
}

/* The router statistics of every slice's forward pass summed into each slice's (the caller's
 * moe_count as the sum's room), and each slice's part of the batch's router losses: all of them
 * (weighed by a given divisor's share, as a whole batch's pass weighs them) spread over the
 * slices by their rows, so that the slices' losses add up to the batch's. */
static void merge_router_stats(tlm_train_ctx *x, const slice_status *st, int R, int B, int total,
                               double divisor) {
    for (int r = 0; r < R; r++)
        if (st[r].st) return; /* the pass fails: nothing to merge */
    int E = x->m->c.n_experts;
    double *sum = x->moe_count, zsum = 0;
    long rows = 0;
    memset(sum, 0, 2 * (size_t)E * sizeof *sum);
    for (int r = 0; r < R; r++) {
        const mdl_moe_stats *m = &x->replicas[r]->moe;
        for (int e = 0; e < E; e++) {
            sum[e] += m->count[e];
            sum[E + e] += m->psum[e];
        }
        zsum += m->zsum;
        rows += m->rows;
    }
    double share = divisor > 0 ? total / divisor : 1.0;
    for (int r = 0; r < R; r++) {
        tlm_train_ctx *rep = x->replicas[r];
        int b0, b1;
        slice(B, r, R, &b0, &b1);
        memcpy(rep->moe.count, sum, (size_t)E * sizeof *sum);
        memcpy(rep->moe.psum, sum + E, (size_t)E * sizeof *sum);
        rep->moe.zsum = zsum;
        rep->moe.rows = rows;
        rep->moe_share = share;
        rep->moe_part = (double)(b1 - b0) / B;
    }
}

/* Thread tid of team's share of the n gradient floats: replicas 1 .. R - 1 added into grads
 * (replica 0 wrote there itself), after every slice is done (a barrier before). */
static void add_slices(float *grads, float *const *g, const slice_status *st, int R, long n,
                       int tid, int team) {
    long lo = n * tid / team, hi = n * (tid + 1) / team;
    for (int q = 1; q < R; q++) {
        /* one stream at a time: a plain vectorized add (the runtime replica count in an inner
         * loop kept the compiler from vectorizing), on this thread (k_fork) */
        if (st[q].st || hi <= lo) continue;
        k_acc(grads + lo, g[q] + lo, (size_t)(hi - lo));
    }
}

static tlm_status slices_result(const slice_status *s, int R) {
    for (int r = 0; r < R; r++)
        if (s[r].st) return core_err(s[r].st, "%s", s[r].msg);
    return TLM_OK;
}

/* The checks every training pass makes. */
static tlm_status check_training(tlm_train_ctx *x, const int32_t *targets, int B, int T,
                                 const char *what) {
    if (!x) return core_err(TLM_ERR_ARG, "%s: context must not be NULL", what);
    if (x->n_lora > 1)
        return core_err(TLM_ERR_UNSUPPORTED, "%s: %d adapters attached; training takes one", what,
                        x->n_lora);
    if (!x->m->all_f32 && !x->n_lora)
        return core_err(TLM_ERR_UNSUPPORTED,
                        "%s: gradients need F32 weights (load the model with "
                        "TLM_LOAD_WRITABLE)",
                        what);
    return mdl_ctx_check_targets(&x->m->c, targets, B, T);
}

void tlm_batch_opts_defaults(tlm_batch_opts *o) { *o = (tlm_batch_opts){0}; }

tlm_status tlm_train_ctx_forward_backward(tlm_train_ctx *x, const int32_t *ids,
                                          const int32_t *targets, int B, int T, int pos0,
                                          float *grads, int accumulate, float *loss) {
    tlm_batch_opts o = {NULL, pos0, 0};
    return tlm_train_ctx_forward_backward_opts(x, ids, targets, B, T, &o, grads, accumulate, loss);
}

tlm_status tlm_train_ctx_forward_backward_opts(tlm_train_ctx *x, const int32_t *ids,
                                               const int32_t *targets, int B, int T,
                                               const tlm_batch_opts *o, float *grads,
                                               int accumulate, float *loss) {
    CORE_FP_FLUSH_SCOPE();
    static const tlm_batch_opts none = {0};
    if (!o) o = &none;
    if (!targets || !grads)
        return core_err(TLM_ERR_ARG, "forward_backward: targets and grads needed");
    tlm_status s = check_training(x, targets, B, T, "forward_backward");
    if (s) return s;
    x->held_ids = NULL; /* this pass overwrites what a backward_weighted would read */
    int R;
    s = split_batch(x, B, &R);
    if (s) return s;
    const int32_t *pos = o->pos;
    int pos0 = o->pos0;
    if (R <= 1)
        return mdl_ctx_forward_backward_whole(x, ids, targets, B, T, pos0, pos, grads, accumulate,
                                              o->divisor, loss, NULL);
    /* Every slice divides its loss gradient by the whole batch's target count (or the divisor),
     * so the batch's gradient is the plain sum of the slices': replica 0 writes (or accumulates)
     * straight into grads and only the others need buffers of their own. */
    int total = mdl_ctx_count_targets(targets, (size_t)B * T);
    double divisor = o->divisor > 0 ? o->divisor : total;
    slice_status st[MAXR];
    float losses[MAXR];
    int counts[MAXR];
    long n = (long)mdl_ctx_grad_floats(x);
    float *const *g = x->replica_grads;
    /* A mixture's router losses are functions of the whole batch's routing (each expert's share
     * of it), not sums over rows: every slice's backward reads the statistics of all of them,
     * so the slices' gradients add up to the whole batch's. */
    const tlm_config *c = &x->m->c;
    int moe = c->n_experts > 0;
    if (moe && !x->moe_count) {
        x->moe_count = calloc(2 * (size_t)c->n_experts, sizeof(double));
        if (!x->moe_count) return core_err(TLM_ERR_NOMEM, "out of memory");
    }
    /* The runtime may deliver fewer threads than asked (OMP_DYNAMIC, a thread limit): each thread
     * takes slices r, r + team, ... so every slice runs whatever the team size. */
#pragma omp parallel num_threads(R)
    {
        int team = omp_get_num_threads(), tid = omp_get_thread_num();
        for (int r = tid; r < R; r += team) {
            int b0, b1;
            slice(B, r, R, &b0, &b1);
            tlm_train_ctx *rep = x->replicas[r];
            rep->drop_seed = x->drop_seed;
            /* Each replica draws its own masks: same (seed, step), different stream per slice. */
            rep->drop_step = x->drop_step * (uint64_t)R + (uint64_t)r;
            slice_report(&st[r], mdl_ctx_forward(rep, ids + (size_t)b0 * T, b1 - b0, T, pos0,
                                                 pos ? pos + (size_t)b0 * T : NULL, MDL_FWD_TRAIN));
        }
#pragma omp barrier
        if (moe) {
#pragma omp single
            merge_router_stats(x, st, R, B, total, o->divisor);
        }
        for (int r = tid; r < R; r += team) {
            int b0, b1;
            slice(B, r, R, &b0, &b1);
            if (!st[r].st)
                slice_report(&st[r], mdl_ctx_backward_whole(x->replicas[r], ids + (size_t)b0 * T,
                                                            targets + (size_t)b0 * T,
                                                            r ? g[r] : grads, r ? 0 : accumulate,
                                                            divisor, NULL, &losses[r], &counts[r]));
        }
#pragma omp barrier
        add_slices(grads, g, st, R, n, tid, team);
    }
    if ((s = slices_result(st, R)) != TLM_OK) return s;
    /* Each slice's loss is its sum over the batch's divisor: they add up. */
    double lsum = 0;
    for (int r = 0; r < R; r++)
        if (counts[r]) lsum += (double)losses[r];
    if (loss) *loss = total || o->divisor > 0 ? (float)lsum : NAN;
    x->moe_aux = x->moe_z = 0;
    for (int r = 0; r < R; r++) {
        x->moe_aux += x->replicas[r]->moe_aux;
        x->moe_z += x->replicas[r]->moe_z;
    }
    return TLM_OK;
}

tlm_status tlm_train_ctx_forward_logp(tlm_train_ctx *x, const int32_t *ids, const int32_t *targets,
                                      int B, int T, const tlm_batch_opts *o, float *logp) {
    CORE_FP_FLUSH_SCOPE();
    static const tlm_batch_opts none = {0};
    if (!o) o = &none;
    if (!targets || !logp || !ids)
        return core_err(TLM_ERR_ARG, "forward_logp: ids, targets and logp needed");
    if (o->pos0) return core_err(TLM_ERR_ARG, "forward_logp: pos0 must be 0 (give pos)");
    tlm_status s = check_training(x, targets, B, T, "forward_logp");
    if (s) return s;
    x->held_ids = NULL;
    int R = 1;
    if ((s = split_batch(x, B, &R)) != TLM_OK) return s;
    if (R <= 1) {
        s = mdl_ctx_forward_logp(x, ids, targets, B, T, o->pos, logp);
    } else {
        slice_status st[MAXR];
#pragma omp parallel num_threads(R)
        {
            int team = omp_get_num_threads();
            for (int r = omp_get_thread_num(); r < R; r += team) {
                int b0, b1;
                slice(B, r, R, &b0, &b1);
                tlm_train_ctx *rep = x->replicas[r];
                rep->drop_seed = x->drop_seed;
                rep->drop_step = x->drop_step * (uint64_t)R + (uint64_t)r;
                size_t at = (size_t)b0 * T;
                slice_report(&st[r], mdl_ctx_forward_logp(rep, ids + at, targets + at, b1 - b0, T,
                                                          o->pos ? o->pos + at : NULL, logp + at));
            }
        }
        s = slices_result(st, R);
    }
    if (s) return s;
    x->held_ids = ids;
    x->held_targets = targets;
    x->held_B = B;
    x->held_T = T;
    x->held_R = R;
    return TLM_OK;
}

tlm_status tlm_train_ctx_backward_weighted(tlm_train_ctx *x, const float *weights, float *grads,
                                           int accumulate, float *loss) {
    CORE_FP_FLUSH_SCOPE();
    if (!x || !weights || !grads)
        return core_err(TLM_ERR_ARG, "backward_weighted: context, weights and grads needed");
    if (!x->held_ids)
        return core_err(TLM_ERR_ARG, "backward_weighted: no tlm_train_ctx_forward_logp to follow");
    const int32_t *ids = x->held_ids, *targets = x->held_targets;
    int B = x->held_B, T = x->held_T, R = x->held_R;
    x->held_ids = NULL;
    if (R <= 1)
        return mdl_ctx_backward_whole(x, ids, targets, grads, accumulate, 0, weights, loss, NULL);
    slice_status st[MAXR];
    float losses[MAXR];
    long n = (long)mdl_ctx_grad_floats(x);
    float *const *g = x->replica_grads;
#pragma omp parallel num_threads(R)
    {
        int team = omp_get_num_threads(), tid = omp_get_thread_num();
        for (int r = tid; r < R; r += team) {
            int b0, b1;
            slice(B, r, R, &b0, &b1);
            size_t at = (size_t)b0 * T;
            slice_report(&st[r], mdl_ctx_backward_whole(x->replicas[r], ids + at, targets + at,
                                                        r ? g[r] : grads, r ? 0 : accumulate, 0,
                                                        weights + at, &losses[r], NULL));
        }
#pragma omp barrier
        add_slices(grads, g, st, R, n, tid, team);
    }
    tlm_status s = slices_result(st, R);
    if (s) return s;
    double sum = 0;
    for (int r = 0; r < R; r++) sum += losses[r];
    if (loss) *loss = (float)sum;
    return TLM_OK;
}

/* The mean loss of a slice, its logits a slice of rows at a time (mdl_ctx_head_loss); with
 * row_loss, each row's loss too. */
static tlm_status slice_loss(tlm_train_ctx *x, const int32_t *ids, const int32_t *targets, int B,
                             int T, const int32_t *pos, double *loss, int *counted,
                             float *row_loss) {
    CORE_FP_FLUSH_SCOPE();
    if (counted) *counted = 0;
    tlm_status s = mdl_ctx_check_targets(&x->m->c, targets, B, T);
    if (!s) s = mdl_ctx_forward(x, ids, B, T, 0, pos, MDL_FWD_LOSS);
    if (!s) mdl_ctx_head_loss(x, targets, B * T, 0, NULL, row_loss, NULL, 0, loss, counted);
    return s;
}

static tlm_status batch_loss(tlm_train_ctx *x, const int32_t *ids, const int32_t *targets, int B,
                             int T, const int32_t *pos, double *loss, long *count,
                             float *row_loss) {
    x->held_ids = NULL; /* any pass overwrites the activations a backward would read */
    *loss = NAN;
    if (count) *count = 0;
    int R;
    tlm_status s = split_batch(x, B, &R);
    if (s) return s;
    if (R <= 1) {
        int n = 0;
        s = slice_loss(x, ids, targets, B, T, pos, loss, &n, row_loss);
        if (count) *count = n;
        return s;
    }
    slice_status st[MAXR];
    double sums[MAXR];
    int counts[MAXR];
#pragma omp parallel num_threads(R)
    {
        int team = omp_get_num_threads();
        for (int r = omp_get_thread_num(); r < R; r += team) {
            int b0, b1;
            slice(B, r, R, &b0, &b1);
            double l = 0;
            tlm_status sr =
                slice_loss(x->replicas[r], ids + (size_t)b0 * T, targets + (size_t)b0 * T, b1 - b0,
                           T, pos ? pos + (size_t)b0 * T : NULL, &l, &counts[r],
                           row_loss ? row_loss + (size_t)b0 * T : NULL);
            sums[r] = !sr && counts[r] ? l * counts[r] : 0.0;
            slice_report(&st[r], sr);
        }
    }
    if ((s = slices_result(st, R)) != TLM_OK) return s;
    double sum = 0;
    long total = 0;
    for (int r = 0; r < R; r++) {
        sum += sums[r];
        total += counts[r];
    }
    *loss = total ? sum / (double)total : NAN;
    if (count) *count = total;
    return TLM_OK;
}

tlm_status mdl_ctx_batch_loss(tlm_train_ctx *x, const int32_t *ids, const int32_t *targets, int B,
                              int T, const int32_t *pos, double *loss, long *count) {
    return batch_loss(x, ids, targets, B, T, pos, loss, count, NULL);
}

tlm_status tlm_train_ctx_token_logp(tlm_train_ctx *x, const int32_t *ids, const int32_t *targets,
                                    int B, int T, const int32_t *pos, float *logp) {
    if (!x || !ids || !targets || !logp)
        return core_err(TLM_ERR_ARG, "token_logp: context, ids, targets and logp needed");
    double loss;
    tlm_status s = batch_loss(x, ids, targets, B, T, pos, &loss, NULL, logp);
    if (s) return s;
    for (size_t i = 0; i < (size_t)B * T; i++) logp[i] = -logp[i];
    return TLM_OK;
}
