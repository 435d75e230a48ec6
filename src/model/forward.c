/* Training contexts and the batched forward pass: the activation arena, the attention core of a
 * batch of whole sequences, and tlm_train_ctx_forward. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "kernels/kernels.h"
#include "model/ctx.h"

tlm_status tlm_train_ctx_new(const tlm_model *m, tlm_train_ctx **out) {
    if (!out) return core_err(TLM_ERR_ARG, "train_ctx: out must not be NULL");
    *out = NULL;
    if (!m) return core_err(TLM_ERR_ARG, "train_ctx: model must not be NULL");
    tlm_train_ctx *x = calloc(1, sizeof *x);
    if (!x) return core_err(TLM_ERR_NOMEM, "out of memory");
    x->m = m;
    x->data_parallel = -1;
    *out = x;
    return TLM_OK;
}

static void arena_free(tlm_train_ctx *x) {
    core_big_free(x->base, x->floats * sizeof(float));
    free(x->layer);
    free(x->probs);
    free(x->run);
    free(x->pos);
    free(x->lo);
    free(x->lo_win);
    x->base = NULL;
    x->layer = NULL;
    x->run = NULL;
    x->probs = NULL;
    x->pos = NULL;
    x->lo = NULL;
    x->lo_win = NULL;
    x->floats = 0;
    x->B = x->T = 0;
}

void tlm_train_ctx_free(tlm_train_ctx *x) {
    if (!x) return;
    mdl_ctx_free_replicas(x);
    k_bf16_free(x->bf16);
    arena_free(x);
    mdl_ctx_free_grads(x);
    core_big_free(x->att_scratch, x->att_floats * sizeof(float));
    core_big_free(x->lora_saved, x->lora_saved_floats * sizeof(float));
    core_big_free(x->lora_scratch, x->lora_scratch_floats * sizeof(float));
    free(x->lora_use);
    free(x->moe_count);
    free(x);
}

size_t mdl_ctx_grad_floats(const tlm_train_ctx *x) {
    return x->n_lora ? x->lora_use[0].a->n_params : x->m->n_params;
}

tlm_status tlm_train_ctx_set_loras(tlm_train_ctx *x, const tlm_lora *const *loras,
                                   const float *scales, int n) {
    if (!x) return core_err(TLM_ERR_ARG, "set_loras: context must not be NULL");
    if (n < 0 || (n > 0 && !loras)) return core_err(TLM_ERR_ARG, "set_loras: %d adapters", n);
    for (int i = 0; i < n; i++) {
        if (!loras[i]) return core_err(TLM_ERR_ARG, "set_loras: adapter %d is NULL", i);
        tlm_status s = mdl_lora_check(loras[i], x->m);
        if (s) return s;
    }
    mdl_lora_use *use = n ? calloc((size_t)n, sizeof *use) : NULL;
    if (n && !use) return core_err(TLM_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) use[i] = (mdl_lora_use){loras[i], scales ? scales[i] : 1.0f, NULL};
    free(x->lora_use);
    x->lora_use = use;
    x->n_lora = n;
    for (int r = 0; r < x->n_replicas; r++) {
        tlm_status s = tlm_train_ctx_set_loras(x->replicas[r], loras, scales, n);
        if (s) return s;
    }
    return TLM_OK;
}

/* Grows a 2 MiB-page buffer to at least want floats. */
static tlm_status grow(float **buf, size_t *have, size_t want) {
    if (*have >= want) return TLM_OK;
    core_big_free(*buf, *have * sizeof(float));
    *have = 0;
    if (!(*buf = core_big_alloc(want * sizeof(float))))
        return core_err(TLM_ERR_NOMEM, "out of memory for LoRA activations");
    *have = want;
    return TLM_OK;
}

/* The LoRA state of a pass over N rows (training keeps the first adapter's A x). */
static tlm_status lora_setup(tlm_train_ctx *x, int N, int training) {
    if (!x->n_lora) return TLM_OK;
    size_t saved = training ? (size_t)N * x->lora_use[0].a->total_rank : 0;
    tlm_status s = grow(&x->lora_saved, &x->lora_saved_floats, saved);
    if (!s)
        s = grow(&x->lora_scratch, &x->lora_scratch_floats,
                 mdl_lora_scratch_floats(x->lora_use, x->n_lora, N));
    if (s) return s;
    x->lora = (mdl_lora_pass){x->n_lora,       x->lora_use, training ? x->lora_saved : NULL,
                              x->lora_scratch, NULL,        0};
    return TLM_OK;
}

const tlm_model *tlm_train_ctx_model(const tlm_train_ctx *x) { return x->m; }

void tlm_train_ctx_set_dropout_seed(tlm_train_ctx *x, uint64_t seed, uint64_t step) {
    x->drop_seed = seed;
    x->drop_step = step;
}

void tlm_train_ctx_set_data_parallel(tlm_train_ctx *x, int mode) { x->data_parallel = mode; }

int tlm_bf16_supported(void) { return k_bf16_supported(); }

const char *tlm_precision_name(tlm_precision p) {
    return p == TLM_PRECISION_BF16 ? "bf16" : "fp32";
}

tlm_status tlm_precision_parse(const char *name, tlm_precision *out) {
    if (name && !strcmp(name, "fp32")) {
        *out = TLM_PRECISION_FP32;
        return TLM_OK;
    }
    if (name && !strcmp(name, "bf16")) {
        *out = TLM_PRECISION_BF16;
        return TLM_OK;
    }
    return core_err(TLM_ERR_ARG, "unknown precision '%s' (fp32 or bf16)", name ? name : "(null)");
}

tlm_status tlm_train_ctx_set_precision(tlm_train_ctx *x, tlm_precision p) {
    if (!x) return core_err(TLM_ERR_ARG, "set_precision: context must not be NULL");
    if (p != TLM_PRECISION_FP32 && p != TLM_PRECISION_BF16)
        return core_err(TLM_ERR_ARG, "set_precision: unknown precision %d", (int)p);
    if (p == TLM_PRECISION_BF16 && !x->bf16) {
        /* No emulation: rounding in software would make bf16 slower than fp32, for nothing. */
        if (!k_bf16_supported())
            return core_err(TLM_ERR_UNSUPPORTED,
                            "bf16 precision needs a CPU with AVX-512 BF16 (avx512_bf16); this one "
                            "has none: use fp32");
        if (!(x->bf16 = k_bf16_new()))
            return core_err(TLM_ERR_NOMEM, "bf16: could not set up oneDNN's CPU engine");
    }
    x->precision = p;
    for (int r = 0; r < x->n_replicas; r++) {
        tlm_status s = tlm_train_ctx_set_precision(x->replicas[r], p);
        if (s) return s;
    }
    return TLM_OK;
}

tlm_precision tlm_train_ctx_precision(const tlm_train_ctx *x) { return x->precision; }

/* Carves the arena: first pass (base == NULL) only counts floats, second pass assigns pointers. */
static size_t carve(tlm_train_ctx *x, int B, int T, float *base) {
    const tlm_config *c = &x->m->c;
    size_t N = (size_t)B * T, d = (size_t)c->d_model, ff = (size_t)c->d_ff;
    size_t qw = (size_t)c->n_heads * (d / (size_t)c->n_heads), ld = (size_t)mdl_qkv_width(c);
    size_t off = 0;
    int ln = c->norm == TLM_NORM_LAYERNORM, pn = c->post_norms;
#define TAKE(ptr, count)                                                                           \
    do {                                                                                           \
        size_t n_ = (count);                                                                       \
        if (base) ptr = n_ ? base + off : NULL;                                                    \
        off += (n_ + 15) & ~(size_t)15; /* keep every buffer 64-byte aligned */                    \
    } while (0)
    float *attn_out = NULL, *post = NULL;
    for (int l = 0; l < c->n_layers; l++) {
        mdl_block_bufs dummy, *L = base ? &x->layer[l] : &dummy;
        TAKE(L->x, N * d);
        TAKE(L->n1, N * d);
        TAKE(L->n1_mean, ln ? N : 0);
        TAKE(L->n1_rstd, N);
        TAKE(L->qkv, N * ld);
        TAKE(L->att, N * qw);
        TAKE(L->h, N * d);
        TAKE(L->n2, N * d);
        TAKE(L->n2_mean, ln ? N : 0);
        TAKE(L->n2_rstd, N);
        int moe = c->n_experts > 0;
        TAKE(L->ff_a, moe ? 0 : N * ff * (mdl_gated(c) ? 2 : 1)); /* gate|up rows */
        TAKE(L->ff_h, moe ? 0 : N * ff);
        /* the experts' rows padded for the bf16 products whatever the precision: a context
         * changes precision between passes */
        float *moe_base = NULL;
        TAKE(moe_base, mdl_moe_floats(c, (int)N, 1));
        if (base && moe) mdl_moe_carve(c, (int)N, 1, moe_base, L);
        TAKE(L->y, N * d);
        /* the post norms' backward reads their inputs: the attention's projection too */
        TAKE(L->attn_out, pn ? N * d : 0);
        TAKE(L->pa_mean, pn && ln ? N : 0);
        TAKE(L->pa_rstd, pn ? N : 0);
        TAKE(L->pf_mean, pn && ln ? N : 0);
        TAKE(L->pf_rstd, pn ? N : 0);
        float *probs = NULL;
        TAKE(probs, (size_t)B * c->n_heads * T * T);
        if (base) x->probs[l] = probs;
    }
    TAKE(x->x_final, N * d);
    TAKE(x->xn, N * d);
    TAKE(x->xn_mean, ln ? N : 0);
    TAKE(x->xn_rstd, N);
    TAKE(x->logits, N * (size_t)c->vocab_size);
    TAKE(x->softmax, N * (size_t)c->vocab_size);
    /* The attention projection is scratch without post norms: nothing in the backward pass reads
     * it then; so are the post norms' outputs. */
    TAKE(attn_out, pn ? 0 : N * d);
    TAKE(post, pn ? N * d : 0);
#undef TAKE
    if (base)
        for (int l = 0; l < c->n_layers; l++) {
            if (!pn) x->layer[l].attn_out = attn_out;
            x->layer[l].post = post;
            x->layer[l].out = l + 1 < c->n_layers ? x->layer[l + 1].x : x->x_final;
        }
    return off;
}

tlm_status tlm_train_ctx_reserve(tlm_train_ctx *x, int B, int T) {
    const tlm_config *c = &x->m->c;
    if (B <= 0 || T <= 0) return core_err(TLM_ERR_ARG, "batch shape %dx%d must be positive", B, T);
    if (T > c->context_length)
        return core_err(TLM_ERR_ARG, "sequence length %d exceeds context_length %d", T,
                        c->context_length);
    if (x->base && B <= x->B && T <= x->T) return TLM_OK;
    int nb = B > x->B ? B : x->B, nt = T > x->T ? T : x->T;
    arena_free(x);
    size_t rows;
    if (!core_mul_ok((size_t)nb, (size_t)nt, &rows) || rows > INT32_MAX)
        return core_err(TLM_ERR_ARG, "batch %dx%d has too many rows", nb, nt);
    size_t floats = carve(x, nb, nt, NULL), bytes;
    if (!core_mul_ok(floats, sizeof(float), &bytes) || bytes > ((size_t)1 << 40))
        return core_err(TLM_ERR_NOMEM, "activations for batch %dx%d too large", nb, nt);
    x->layer = calloc((size_t)c->n_layers, sizeof *x->layer);
    x->run = calloc((size_t)c->n_layers, sizeof *x->run);
    x->probs = calloc((size_t)c->n_layers, sizeof *x->probs);
    x->pos = malloc(rows * sizeof *x->pos);
    x->lo = malloc(rows * sizeof *x->lo);
    x->lo_win = malloc(rows * sizeof *x->lo_win);
    x->base = core_big_alloc(bytes);
    if (!x->layer || !x->run || !x->probs || !x->pos || !x->lo || !x->lo_win || !x->base) {
        core_big_free(x->base, bytes);
        x->base = NULL;
        arena_free(x);
        return core_err(TLM_ERR_NOMEM, "out of memory for activations (%zu MiB)", bytes >> 20);
    }
    carve(x, nb, nt, x->base);
    x->floats = floats;
    x->B = nb;
    x->T = nt;
    return TLM_OK;
}

/* The attention scratch for sequences of T at the current thread count. */
static tlm_status att_scratch(tlm_train_ctx *x, int T) {
    size_t need =
        k_attention_scratch_floats(T, x->m->c.dropout, x->m->c.attn_softcap, omp_get_max_threads());
    if (need <= x->att_floats) return TLM_OK;
    core_big_free(x->att_scratch, x->att_floats * sizeof(float));
    x->att_scratch = core_big_alloc(need * sizeof(float));
    x->att_floats = x->att_scratch ? need : 0;
    if (!x->att_scratch)
        return core_err(TLM_ERR_NOMEM, "out of memory for attention scratch (%zu MiB)",
                        need * sizeof(float) >> 20);
    return TLM_OK;
}

/* Where layer l's attention probabilities go: its own buffer when a full training pass's backward
 * reads them; else the first layer's, as scratch. Full training keeps them for speed (computing
 * them again slowed its step by a few percent, bench/finetune/finetune.sh's --full); frozen passes,
 * whose users come for the memory, compute them again (batch_attend_bwd). */
static float *layer_probs(const tlm_train_ctx *x, int l) {
    return x->pass.training && !x->pass.recompute ? x->probs[l] : x->probs[0];
}

/* Each query's first visible key in layer l: its example's (packed rows), narrowed to the window in
 * windowed layers; NULL when every query sees its row from the start. */
static const int *layer_lo(const tlm_train_ctx *x, int l) {
    if (tlm_config_layer_windowed(&x->m->c, l)) return x->lo_win;
    return x->packed ? x->lo : NULL;
}

/* The attention core of a batch of whole sequences: causal attention within each of the curB
 * sequences of curT rows, its probabilities in layer_probs. */
static void batch_attend_fwd(void *user, int l, float *qkv, int ld, float *att, int N) {
    (void)N;
    tlm_train_ctx *x = user;
    const tlm_config *c = &x->m->c;
    int hd = c->d_model / c->n_heads, qw = c->n_heads * hd, kw = c->n_kv_heads * hd;
    int drop = x->pass.training && c->dropout > 0.0f;
    float *probs = layer_probs(x, l), scale = tlm_config_attn_scale(c), cap = c->attn_softcap;
    const int *lo = layer_lo(x, l);
    if (k_bf16_attention_fwd(x->pass.bf16, att, probs, qkv, ld, x->curB, x->curT, c->n_heads,
                             c->n_kv_heads, hd, scale, cap, lo, drop ? c->dropout : 0.0f))
        return;
    k_attention_fwd(att, probs, qkv, qkv + qw, qkv + qw + kw, ld, ld, x->curB, x->curT, c->n_heads,
                    c->n_kv_heads, hd, scale, cap, lo, drop ? c->dropout : 0.0f,
                    drop ? mdl_drop_key(&x->pass, l, 0) : 0, x->att_scratch);
}

static void batch_attend_bwd(void *user, int l, const float *qkv, int ld, const float *datt,
                             float *dqkv, int N) {
    (void)N;
    tlm_train_ctx *x = user;
    const tlm_config *c = &x->m->c;
    int hd = c->d_model / c->n_heads, qw = c->n_heads * hd, kw = c->n_kv_heads * hd;
    int drop = c->dropout > 0.0f;
    float *probs = layer_probs(x, l), scale = tlm_config_attn_scale(c), cap = c->attn_softcap;
    /* Frozen passes compute the probabilities again, exactly as the forward pass made them: the
     * bf16 kernel one head at a time, else a layer at a time (dropout masks come from the layer's
     * key), the output into the scratch nothing reads. */
    if (k_bf16_attention_bwd(x->pass.bf16, dqkv, datt, qkv, ld, x->pass.recompute ? NULL : probs,
                             x->curB, x->curT, c->n_heads, c->n_kv_heads, hd, scale, cap,
                             layer_lo(x, l), drop ? c->dropout : 0.0f))
        return;
    if (x->pass.recompute) batch_attend_fwd(user, l, (float *)qkv, ld, x->run[l].attn_out, N);
    k_attention_bwd(dqkv, dqkv + qw, dqkv + qw + kw, datt, qkv, qkv + qw, qkv + qw + kw, ld, ld,
                    probs, x->curB, x->curT, c->n_heads, c->n_kv_heads, hd, scale, cap,
                    layer_lo(x, l), drop ? c->dropout : 0.0f,
                    drop ? mdl_drop_key(&x->pass, l, 0) : 0, x->att_scratch);
}

static tlm_status check_ids(const tlm_config *c, const int32_t *ids, size_t n, const char *what) {
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab_size)
            return core_err(TLM_ERR_RANGE, "%s id %d at index %zu is outside the vocabulary (%d)",
                            what, ids[i], i, c->vocab_size);
    return TLM_OK;
}

tlm_status mdl_ctx_check_targets(const tlm_config *c, const int32_t *targets, int B, int T) {
    for (int i = 0; B > 0 && T > 0 && i < B * T; i++)
        if (targets[i] >= c->vocab_size)
            return core_err(TLM_ERR_RANGE,
                            "target id %d at index %d is outside the vocabulary (%d)", targets[i],
                            i, c->vocab_size);
    return TLM_OK;
}

/* The buffers each layer of a pass in this mode uses (mdl_fwd_mode); the arena's pages that no
 * pass touches are never made resident. */
static void run_bufs(tlm_train_ctx *x, mdl_fwd_mode mode) {
    const tlm_config *c = &x->m->c;
    int L = c->n_layers, pre = c->norm_position == TLM_NORM_PRE;
    const mdl_block_bufs *z = &x->layer[0];
    for (int l = 0; l < L; l++) {
        mdl_block_bufs *b = &x->run[l];
        *b = x->layer[l];
        if (mode == MDL_FWD_LOSS) {
            /* in place: the block allows out == x */
            *b = *z;
            b->out = l + 1 < L ? z->x : x->x_final;
            continue;
        }
        /* Pre-norm's backward never reads the FFN's output (but a post norm's does). */
        if (mode == MDL_FWD_TRAIN && pre && !c->post_norms) b->y = z->y;
        /* Frozen passes keep no rounded copies of the products' inputs (nothing computes a weight
         * gradient), so the inputs can be computed again; full training's bf16 copies are found
         * by the input's address, which must then hold that layer's rows. */
        if (x->pass.recompute) {
            b->n1 = z->n1;
            if (pre) b->n2 = z->n2;
            if (mdl_gated(c)) b->ff_h = z->ff_h;
        }
    }
}

/* Positions pos0 + t, or the given ones; a packed row's queries see keys from their example's
 * first row, t - pos[t], on (x->lo). */
static tlm_status set_positions(tlm_train_ctx *x, int B, int T, int pos0, const int32_t *pos) {
    int N = B * T, ctx = x->m->c.context_length, W = x->m->c.sliding_window;
    x->packed = 0;
    if (!pos) {
        if (pos0 < 0 || pos0 > ctx - T)
            return core_err(TLM_ERR_RANGE, "positions %d..%d exceed context_length %d", pos0,
                            pos0 + T - 1, ctx);
        for (int r = 0; r < N; r++) x->pos[r] = pos0 + r % T;
    } else {
        for (int r = 0; r < N; r++) {
            int t = r % T, p = pos[r];
            if (p < 0 || p >= ctx)
                return core_err(TLM_ERR_RANGE, "position %d at index %d outside the context (%d)",
                                p, r, ctx);
            x->pos[r] = p;
            x->lo[r] = p < t ? t - p : 0;
            x->packed |= p < t;
        }
    }
    /* the window counts rows: within a row (or an example) positions advance with the rows */
    for (int r = 0; W && r < N; r++) {
        int t = r % T, lo = x->packed ? x->lo[r] : 0;
        x->lo_win[r] = t - W + 1 > lo ? t - W + 1 : lo;
    }
    return TLM_OK;
}

tlm_status mdl_ctx_forward(tlm_train_ctx *x, const int32_t *ids, int B, int T, int pos0,
                           const int32_t *pos, mdl_fwd_mode mode) {
    int training = mode == MDL_FWD_TRAIN;
    const tlm_model *m = x->m;
    const tlm_config *c = &m->c;
    if (!ids) return core_err(TLM_ERR_ARG, "forward: ids must not be NULL");
    core_threads_enter();
    tlm_status s = tlm_train_ctx_reserve(x, B, T);
    if (s) return s;
    if ((s = set_positions(x, B, T, pos0, pos)) != TLM_OK) return s;
    int N = B * T;
    if ((s = check_ids(c, ids, (size_t)N, "token")) != TLM_OK) return s;
    if ((s = att_scratch(x, T)) != TLM_OK) return s;
    x->curB = B;
    x->curT = T;
    k_bf16 *bf = x->precision == TLM_PRECISION_BF16 ? x->bf16 : NULL;
    /* The weights may have changed since the last pass (an optimizer step). */
    if (bf) {
        /* With an adapter attached the model is frozen: its rounded weights stay valid. */
        k_bf16_set_frozen(bf, x->n_lora > 0);
        k_bf16_next_pass(bf);
    }
    if ((s = lora_setup(x, N, training)) != TLM_OK) return s;
    x->pass = (mdl_pass){N,
                         x->pos,
                         training,
                         x->drop_seed,
                         x->drop_step,
                         {batch_attend_fwd, batch_attend_bwd, x, NULL},
                         bf,
                         x->n_lora ? &x->lora : NULL,
                         0,
                         training && x->n_lora,
                         NULL};
    if (training && c->n_experts > 0) {
        if (!x->moe_count) {
            x->moe_count = calloc(2 * (size_t)c->n_experts, sizeof(double));
            if (!x->moe_count) return core_err(TLM_ERR_NOMEM, "out of memory");
        }
        memset(x->moe_count, 0, 2 * (size_t)c->n_experts * sizeof(double));
        x->moe = (mdl_moe_stats){x->moe_count, x->moe_count + c->n_experts, 0, 0, 0.0f};
        x->pass.moe = &x->moe;
        x->moe_share = -1;
    }
    run_bufs(x, mode);
    mdl_embed_fwd(m, &x->pass, ids, x->run[0].x);
    for (int l = 0; l < c->n_layers; l++) mdl_block_fwd(m, l, &x->pass, &x->run[l]);
    if (mode == MDL_FWD_ALL)
        mdl_head_fwd_pass(m, &x->pass, x->x_final, x->xn, x->xn_mean, x->xn_rstd, x->logits, N);
    return TLM_OK;
}

void tlm_forward_opts_defaults(tlm_forward_opts *o) { *o = (tlm_forward_opts){0}; }

tlm_status tlm_train_ctx_forward(tlm_train_ctx *x, const int32_t *ids, int B, int T,
                                 const tlm_forward_opts *opts, tlm_forward_out *out) {
    CORE_FP_FLUSH_SCOPE();
    static const tlm_forward_opts none = {0};
    if (!x) return core_err(TLM_ERR_ARG, "forward: context must not be NULL");
    x->held_ids = NULL; /* the activations a tlm_train_ctx_backward_weighted would read */
    if (!opts) opts = &none;
    const tlm_config *c = &x->m->c;
    if (!out) return core_err(TLM_ERR_ARG, "forward: out must not be NULL");
    tlm_status s = opts->targets ? mdl_ctx_check_targets(c, opts->targets, B, T) : TLM_OK;
    if (!s) s = mdl_ctx_forward(x, ids, B, T, opts->pos_offset, opts->pos, MDL_FWD_ALL);
    if (s) return s;
    int N = B * T;
    int counted = 0;
    double loss = NAN;
    if (opts->targets || opts->want_probs)
        loss = k_cross_entropy_fwd(x->logits, opts->targets, opts->want_probs ? x->softmax : NULL,
                                   N, c->vocab_size, &counted);
    out->logits = x->logits;
    out->probs = opts->want_probs ? x->softmax : NULL;
    out->loss = (float)loss;
    return TLM_OK;
}
