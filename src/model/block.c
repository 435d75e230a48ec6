/* One transformer block over rows, forward and backward side by side, sub-layer by sub-layer. */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdatomic.h>
#include <string.h>

#include "core/dtype.h"
#include "kernels/kernels.h"
#include "kernels/matvec.h"
#include "model/block.h"

int mdl_qkv_width(const tlm_config *c) {
    int hd = c->d_model / c->n_heads;
    return (c->n_heads + 2 * c->n_kv_heads) * hd;
}

static int dropping(const tlm_model *m, const mdl_pass *p) {
    return p->training && m->c.dropout > 0.0f;
}

uint64_t mdl_drop_key(const mdl_pass *p, int layer, int which) {
    /* Sites: the embedding sum, then per layer the attention probabilities, the attention output
     * and the FFN output. */
    uint64_t site = layer < 0 ? 0 : 1 + 3 * (uint64_t)layer + (uint64_t)which;
    return k_dropout_key(p->drop_seed, p->drop_step, site);
}

/* ---- norms ---------------------------------------------------------------------------------- */

static void norm_fwd(const tlm_config *c, float *y, float *mean, float *rstd, const float *x,
                     const float *g, const float *b, int N) {
    if (c->norm == TLM_NORM_RMSNORM)
        k_rmsnorm_fwd(y, rstd, x, g, N, c->d_model, c->norm_eps);
    else
        k_layernorm_fwd(y, mean, rstd, x, g, b, N, c->d_model, c->norm_eps);
}

/* dx from dy through the norm whose gain (bias) lives at flat offsets gw (gb). */
/* G NULL: the gain is frozen, dx alone. */
static void norm_bwd(const tlm_config *c, float *dx, float *G, size_t gw, size_t gb, const float *g,
                     const float *dy, const float *x, const float *mean, const float *rstd, int N,
                     int acc) {
    float *dg = G ? G + gw : NULL, *db = G ? mdl_at(G, gb) : NULL;
    if (c->norm == TLM_NORM_RMSNORM)
        k_rmsnorm_bwd(dx, dg, dy, x, g, rstd, N, c->d_model, acc);
    else
        k_layernorm_bwd(dx, dg, db, dy, x, g, mean, rstd, N, c->d_model, acc);
}

/* Gradient through a dropout mask (into g->ddrop), or dy itself without dropout. */
static const float *undrop(const tlm_model *m, const mdl_pass *p, const mdl_block_grads *g,
                           const float *dy, int layer, int which) {
    if (!dropping(m, p)) return dy;
    k_dropout(g->ddrop, dy, (size_t)p->N * m->c.d_model, m->c.dropout,
              mdl_drop_key(p, layer, which));
    return g->ddrop;
}

/* ---- matrix products in the pass's precision ----------------------------------------------- */

/* The F32 data of a view the bf16 products can take (contiguous F32 rows), else NULL. */
static const float *bf16_weight(const mdl_pass *p, const tlm_weight *w) {
    if (!p->bf16 || !w->data || w->dtype != TLM_DTYPE_F32 || w->row_bytes != (size_t)w->cols * 4)
        return NULL;
    return w->data;
}

static void linear(const mdl_pass *p, float *y, int ldy, const float *x, int N, const tlm_weight *w,
                   const float *b) {
    const float *wf = bf16_weight(p, w);
    if (wf)
        k_bf16_linear_fwd(p->bf16, y, ldy, x, wf, b, N, (int)w->cols, (int)w->rows);
    else
        k_linear(y, ldy, x, N, w, b);
}

/* k_linear_parts in the pass's precision: one product over the stacked view when the biases stack
 * too, else one per part. */
static void linear_parts(const mdl_pass *p, float *y, int ldy, const float *x, int N,
                         const tlm_weight *const *w, const float *const *b, int n,
                         const tlm_weight *fused) {
    int all = 1;
    for (int i = 0; i < n; i++) all &= bf16_weight(p, w[i]) != NULL;
    if (!all) {
        k_linear_parts(y, ldy, x, N, w, b, n, fused);
        return;
    }
    int stacked = fused && bf16_weight(p, fused);
    const float *next = b[0];
    for (int i = 0; i < n && stacked; i++) {
        stacked = b[i] == next;
        if (next) next += w[i]->rows;
    }
    if (stacked) {
        k_bf16_linear_fwd(p->bf16, y, ldy, x, fused->data, b[0], N, (int)fused->cols,
                          (int)fused->rows);
        return;
    }
    int col = 0;
    for (int i = 0; i < n; i++) {
        k_bf16_linear_fwd(p->bf16, y + col, ldy, x, w[i]->data, b[i], N, (int)w[i]->cols,
                          (int)w[i]->rows);
        col += (int)w[i]->rows;
    }
}

static void linear_bwd(const mdl_pass *p, float *dx, float *dw, float *db, const float *dy,
                       const float *x, const float *w, int N, int in, int out, int acc) {
    if (p->bf16)
        k_bf16_linear_bwd(p->bf16, dx, dw, db, dy, x, w, N, in, out, acc);
    else
        k_linear_bwd(dx, dw, db, dy, x, w, N, in, out, acc);
}

/* Parameter and input gradients of stacked linear parts (q|k|v, gate|up). The gradients' flat
 * layout always stacks them; the weights may not be (parts of a file), then dx sums the parts'
 * products. */
static void parts_bwd(const mdl_pass *p, float *dx, float *dW, float *db, const float *dy,
                      const float *x, const tlm_weight *fused, const tlm_weight *const *w, int n,
                      int N, int in, int out, int acc) {
    if (fused->data) {
        linear_bwd(p, dx, dW, db, dy, x, fused->data, N, in, out, acc);
        return;
    }
    linear_bwd(p, NULL, dW, db, dy, x, NULL, N, in, out, acc);
    int col = 0;
    for (int i = 0; i < n; i++) {
        if (p->bf16)
            k_bf16_linear_bwd_dx(p->bf16, dx, dy + col, out, w[i]->data, N, in, (int)w[i]->rows,
                                 i ? 1.0f : 0.0f);
        else
            k_linear_bwd_dx(dx, dy + col, out, w[i]->data, N, in, (int)w[i]->rows, i ? 1.0f : 0.0f);
        col += (int)w[i]->rows;
    }
}

/* ---- frozen weights (LoRA training) --------------------------------------------------------- */

/* dx = dy W + beta dx through a frozen weight in its own type, never widened whole: in a bf16 pass
 * the bf16 products (other types widened and rounded a tile at a time), else F32 rows to sgemm
 * and other types widened a tile at a time. The context reserved the fp32 tile before the pass
 * (mdl_ctx_forward_backward_whole); the bf16 path falls back to it without memory. */
static void frozen_dx(const mdl_pass *p, float *dx, const float *dy, int ldy, const tlm_weight *w,
                      int N, float beta) {
    const float *wf = bf16_weight(p, w);
    if (wf)
        k_bf16_linear_bwd_dx(p->bf16, dx, dy, ldy, wf, N, (int)w->cols, (int)w->rows, beta);
    else if (p->bf16)
        (void)k_bf16_linear_bwd_dx_frozen(p->bf16, dx, dy, ldy, w, N, beta);
    else
        (void)k_linear_bwd_dx_frozen(dx, dy, ldy, w, N, beta);
}

/* The input gradient of stacked parts (q|k|v, gate|up) through frozen weights. */
static void frozen_parts_dx(const mdl_pass *p, float *dx, const float *dy, int ldy,
                            const tlm_weight *fused, const tlm_weight *const *w, int n, int N) {
    if (fused->data) {
        frozen_dx(p, dx, dy, ldy, fused, N, 0.0f);
        return;
    }
    int col = 0;
    for (int i = 0; i < n; i++) {
        frozen_dx(p, dx, dy + col, ldy, w[i], N, i ? 1.0f : 0.0f);
        col += (int)w[i]->rows;
    }
}

/* ---- LoRA ----------------------------------------------------------------------------------- */

/* The dropout key of a LoRA site's input: apart from the model's own sites. */
static uint64_t lora_drop_key(const mdl_pass *p, int layer, int t) {
    return k_dropout_key(p->drop_seed, p->drop_step,
                         ((uint64_t)1 << 40) + (uint64_t)(layer + 1) * MDL_LORA_SITES +
                             (uint64_t)t);
}

/* C = op(A) op(B) (+ C when add) in the pass's precision: bf16 operands with fp32 accumulation in
 * a bf16 pass (the adapter's products as PyTorch's autocast runs them), else sgemm. */
static void lora_gemm(const mdl_pass *p, int M, int N, int K, const float *A, int ta, int lda,
                      const float *B, int tb, int ldb, float *C, int ldc, int add) {
    if (p->bf16 && k_bf16_matmul(p->bf16, M, N, K, A, ta, lda, B, tb, ldb, C, ldc, add)) return;
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
                K, 1.0f, A, lda, B, ldb, add ? 1.0f : 0.0f, C, ldc);
}

/* dst[n, :] = src[n, :] * f * (row_scale ? row_scale[n] : 1) for n rows of r values. */
static void scale_rows(float *dst, const float *src, int n, int r, float f,
                       const float *row_scale) {
    for (int i = 0; i < n; i++) {
        float g = row_scale ? f * row_scale[i] : f;
        for (int j = 0; j < r; j++) dst[(size_t)i * r + j] = src[(size_t)i * r + j] * g;
    }
}

/* y[N, out] (row stride ldy) += scale * s * B (A drop(x)) for every adapter of the pass at site
 * (layer, t); x is [N, in]. Training keeps A drop(x) for the backward pass. */
static void lora_fwd(const mdl_pass *p, int layer, int t, float *y, int ldy, const float *x) {
    const mdl_lora_pass *lp = p->lora;
    if (!lp) return;
    int N = p->N;
    for (int i = 0; i < lp->n; i++) {
        const mdl_lora_use *u = &lp->use[i];
        const mdl_lora_site *s = mdl_lora_site_at(u->a, layer, t);
        if (!s->a || u->scale == 0.0f) continue;
        int r = s->rank, in = s->in, R = u->a->max_rank;
        float *ax = lp->saved && i == 0 ? lp->saved + (size_t)N * s->rank_before : lp->scratch;
        float *scaled = lp->scratch + (size_t)N * R, *xd = scaled + (size_t)N * R;
        const float *xin = x;
        if (p->training && u->a->dropout > 0.0f) {
            k_dropout(xd, x, (size_t)N * in, u->a->dropout, lora_drop_key(p, layer, t));
            xin = xd;
        }
        lora_gemm(p, N, r, in, xin, 0, in, s->a, 1, in, ax, r, 0);
        scale_rows(scaled, ax, N, r, s->s * u->scale, u->row_scale);
        lora_gemm(p, N, s->out, r, scaled, 0, r, s->b, 1, r, y, ldy, 1);
    }
}

/* The backward pass of the trained adapter (the pass's first) at site (layer, t): gradients of A
 * and B into the adapter's gradient buffer, and its share of the input gradient added to dx. dy
 * [N, out] (stride ldy) is the gradient at the product's output, x [N, in] its input. */
static void lora_bwd(const mdl_pass *p, int layer, int t, float *dx, const float *dy, int ldy,
                     const float *x) {
    const mdl_lora_pass *lp = p->lora;
    if (!lp || !lp->grads || lp->n < 1) return;
    const mdl_lora_use *u = &lp->use[0];
    const mdl_lora_site *s = mdl_lora_site_at(u->a, layer, t);
    if (!s->a) return;
    int N = p->N, r = s->rank, in = s->in, out = s->out, R = u->a->max_rank;
    const float *ax = lp->saved + (size_t)N * s->rank_before;
    float *du = lp->scratch, *fax = du + (size_t)N * R, *xd = fax + (size_t)N * R;
    float *fb = xd + (size_t)N * u->a->max_in; /* [out, r]: f B */
    float f = s->s * u->scale;
    int acc = lp->acc, drop = p->training && u->a->dropout > 0.0f;
    uint64_t key = lora_drop_key(p, layer, t);
    /* dB = dy^T (f A x); d(A x) = dy (f B); dA = d(A x)^T drop(x); dx += drop'(d(A x) A) */
    scale_rows(fax, ax, N, r, f, NULL);
    lora_gemm(p, out, r, N, dy, 1, ldy, fax, 0, r, lp->grads + s->off_b, r, acc);
    scale_rows(fb, s->b, out, r, f, NULL);
    lora_gemm(p, N, r, out, dy, 0, ldy, fb, 0, r, du, r, 0);
    const float *xin = x;
    if (drop) {
        k_dropout(xd, x, (size_t)N * in, u->a->dropout, key);
        xin = xd;
    }
    lora_gemm(p, r, in, N, du, 1, r, xin, 0, in, lp->grads + s->off_a, in, acc);
    if (!dx) return;
    if (drop) {
        lora_gemm(p, N, in, r, du, 0, r, s->a, 0, in, xd, in, 0);
        k_dropout(xd, xd, (size_t)N * in, u->a->dropout, key);
        k_acc(dx, xd, (size_t)N * in);
    } else {
        lora_gemm(p, N, in, r, du, 0, r, s->a, 0, in, dx, in, 1);
    }
}

/* LoRA at the stacked parts of one product: parts t0, t0 + 1, ... of widths w[i]->rows. */
static void lora_parts_fwd(const mdl_pass *p, int layer, int t0, const tlm_weight *const *w, int n,
                           float *y, int ldy, const float *x) {
    if (!p->lora) return;
    int col = 0;
    for (int i = 0; i < n; i++) {
        lora_fwd(p, layer, t0 + i, y + col, ldy, x);
        col += (int)w[i]->rows;
    }
}

static void lora_parts_bwd(const mdl_pass *p, int layer, int t0, const tlm_weight *const *w, int n,
                           float *dx, const float *dy, int ldy, const float *x) {
    if (!p->lora) return;
    int col = 0;
    for (int i = 0; i < n; i++) {
        lora_bwd(p, layer, t0 + i, dx, dy + col, ldy, x);
        col += (int)w[i]->rows;
    }
}

/* ---- attention ------------------------------------------------------------------------------ */

static void rope(const tlm_model *m, const mdl_pass *p, float *qkv, int ld, int bwd) {
    const tlm_config *c = &m->c;
    if (c->position != TLM_POS_ROPE) return;
    int hd = c->d_model / c->n_heads, il = c->rope_pairing == TLM_ROPE_INTERLEAVED;
    void (*f)(float *, int, int, const int *, int, int, const float *, const float *, int) =
        bwd ? k_rope_bwd : k_rope_fwd;
    f(qkv, ld, p->N, p->pos, c->n_heads, hd, m->rope_cos, m->rope_sin, il);
    f(qkv + c->n_heads * hd, ld, p->N, p->pos, c->n_kv_heads, hd, m->rope_cos, m->rope_sin, il);
}

/* Decode's q|k|v product and attention in one job of kv heads (mdl_attend's fwd_group): each
 * unit computes its kv head's rows of q, k and v, rotates them and attends, so the attention runs
 * on every thread of the product and the threads meet once instead of twice. The same kernels on
 * the same rows as the product alone, so the same numbers bit for bit. */
typedef struct {
    const tlm_model *m;
    const mdl_pass *p;
    const mdl_block_bufs *b;
    const k_matvec_plan *pl;
    int l, ld;
} qkv_attend_ctx;

static void qkv_attend_units(void *ctx, long g0, long g1) {
    const qkv_attend_ctx *x = ctx;
    const tlm_config *c = &x->m->c;
    int hd = c->d_model / c->n_heads, group = c->n_heads / c->n_kv_heads, qw = c->n_heads * hd;
    int kw = c->n_kv_heads * hd, il = c->rope_pairing == TLM_ROPE_INTERLEAVED;
    for (long gl = g0; gl < g1; gl++) {
        int g = (int)gl;
        k_matvec_plan_cols(x->pl, g * group * hd, (g + 1) * group * hd);
        k_matvec_plan_cols(x->pl, qw + g * hd, qw + (g + 1) * hd);
        k_matvec_plan_cols(x->pl, qw + kw + g * hd, qw + kw + (g + 1) * hd);
        float *qkv = x->b->qkv;
        if (c->position == TLM_POS_ROPE) {
            k_rope_fwd(qkv + (size_t)g * group * hd, x->ld, x->p->N, x->p->pos, group, hd,
                       x->m->rope_cos, x->m->rope_sin, il);
            k_rope_fwd(qkv + qw + (size_t)g * hd, x->ld, x->p->N, x->p->pos, 1, hd, x->m->rope_cos,
                       x->m->rope_sin, il);
        }
        x->p->attend.fwd_group(x->p->attend.user, x->l, qkv, x->ld, x->b->att, x->p->N, g);
    }
}

static _Atomic int g_fuse = 1;
static _Atomic long g_fused;

int mdl_block_fuse_attend(int on) { return atomic_exchange(&g_fuse, on); }
long mdl_block_fused_runs(void) { return atomic_load_explicit(&g_fused, memory_order_relaxed); }

/* Whether decode's q|k|v product, prepared as *pl, runs fused with attention: where it is shared
 * among threads with two kv heads or more a thread (they are the job's units: one kv head would put
 * the whole product on one thread) and each head's rows fall on the product's units. On one thread
 * the heads' row ranges would only break the product's stream of rows, for no gain. */
static int fusable(const tlm_config *c, const mdl_pass *p) {
    int team = omp_get_max_threads();
    return p->attend.fwd_group && !p->bf16 && !p->training && !p->lora &&
           atomic_load_explicit(&g_fuse, memory_order_relaxed) && team >= 2 &&
           c->n_kv_heads >= 2 * team;
}

static void attn_fwd(const tlm_model *m, int l, const mdl_pass *p, const mdl_block_bufs *b,
                     const float *in) {
    const tlm_config *c = &m->c;
    const mdl_layer_weights *W = &m->lw[l];
    int N = p->N, ld = mdl_qkv_width(c), hd = c->d_model / c->n_heads;
    const tlm_weight *w[3] = {W->wq, W->wk, W->wv};
    const float *bias[3] = {W->bq, W->bk, W->bv};
    const tlm_weight *fused = W->qkv.data ? &W->qkv : NULL;
    k_matvec_plan pl;
    int planned = fusable(c, p) && k_linear_parts_plan(&pl, b->qkv, ld, in, N, w, bias, 3, fused);
    int fuse = planned && pl.parallel && hd % pl.unit_rows == 0;
    for (int k = 0; fuse && k < pl.n; k++) fuse = pl.parts[k].col % pl.unit_rows == 0;
    if (fuse) {
        qkv_attend_ctx x = {m, p, b, &pl, l, ld};
        k_team_units(c->n_kv_heads, 1, 1, qkv_attend_units, &x);
        atomic_fetch_add_explicit(&g_fused, 1, memory_order_relaxed);
    } else {
        if (planned)
            k_matvec_plan_run(&pl); /* made already: not the product again */
        else
            linear_parts(p, b->qkv, ld, in, N, w, bias, 3, fused);
        lora_parts_fwd(p, l, MDL_LORA_Q, w, 3, b->qkv, ld, in);
        rope(m, p, b->qkv, ld, 0);
        p->attend.fwd(p->attend.user, l, b->qkv, ld, b->att, N);
    }
    linear(p, b->attn_out, c->d_model, b->att, N, W->wo, W->bo);
    lora_fwd(p, l, MDL_LORA_O, b->attn_out, c->d_model, b->att);
    /* with post norms the mask falls on the norm's output (mdl_block_fwd) */
    if (dropping(m, p) && !c->post_norms)
        k_dropout(b->attn_out, b->attn_out, (size_t)N * c->d_model, c->dropout,
                  mdl_drop_key(p, l, 1));
}

static void attn_bwd(const tlm_model *m, int l, const mdl_pass *p, const mdl_block_bufs *b,
                     const float *in, const float *dout, float *din, const mdl_block_grads *g,
                     float *G, int acc) {
    const tlm_config *c = &m->c;
    const mdl_layer_weights *W = &m->lw[l];
    const mdl_layer_offsets *o = &m->off.layer[l];
    int N = p->N, d = c->d_model, qw = c->n_heads * (d / c->n_heads), ld = mdl_qkv_width(c);
    if (!c->post_norms) dout = undrop(m, p, g, dout, l, 1);
    if (p->frozen)
        frozen_dx(p, g->datt, dout, d, W->wo, N, 0.0f);
    else
        linear_bwd(p, g->datt, G + o->wo, mdl_at(G, o->bo), dout, b->att, W->wo->data, N, qw, d,
                   acc);
    lora_bwd(p, l, MDL_LORA_O, g->datt, dout, d, b->att);
    p->attend.bwd(p->attend.user, l, b->qkv, ld, g->datt, g->dqkv, N);
    rope(m, p, g->dqkv, ld, 1);
    const tlm_weight *w[3] = {W->wq, W->wk, W->wv};
    if (p->frozen)
        frozen_parts_dx(p, din, g->dqkv, ld, &W->qkv, w, 3, N);
    else
        parts_bwd(p, din, G + o->wq, mdl_at(G, o->bq), g->dqkv, in, &W->qkv, w, 3, N, d, ld, acc);
    lora_parts_bwd(p, l, MDL_LORA_Q, w, 3, din, g->dqkv, ld, in);
}

/* ---- feed-forward --------------------------------------------------------------------------- */

/* The gated hidden rows h [N, ff] from gate|up rows a [N, 2 ff]. */
static void gated_rows_fwd(const tlm_config *c, float *h, const float *a, int N, int ff) {
    if (c->ffn == TLM_FFN_GEGLU)
        k_geglu_rows_fwd(h, a, N, ff);
    else
        k_swiglu_rows_fwd(h, a, N, ff);
}

static void gated_rows_bwd(const tlm_config *c, float *da, const float *dh, const float *a, int N,
                           int ff) {
    if (c->ffn == TLM_FFN_GEGLU)
        k_geglu_rows_bwd(da, dh, a, N, ff);
    else
        k_swiglu_rows_bwd(da, dh, a, N, ff);
}

static void gated_fwd(const tlm_config *c, float *h, const float *a, int N) {
    gated_rows_fwd(c, h, a, N, c->d_ff);
}

/* ---- mixture of experts --------------------------------------------------------------------- */

/* The bf16 products' primitives are cached by shape: each expert's group of rows is padded (with
 * zero rows) to a multiple of this, so a run meets few shapes however the tokens are routed. */
#define MOE_PAD 32

static size_t moe_slots(const tlm_config *c, int N, int padded) {
    return (size_t)N * c->n_experts_used + (padded ? (size_t)c->n_experts * (MOE_PAD - 1) : 0);
}

#define MOE_ALIGN(n) (((n) + 15) & ~(size_t)15)

/* One layout for counting and carving: base NULL only counts. */
static size_t moe_layout(const tlm_config *c, int N, int padded, float *base, mdl_block_bufs *b) {
    if (c->n_experts <= 0) return 0;
    size_t n = (size_t)N, d = (size_t)c->d_model, E = (size_t)c->n_experts;
    size_t K = (size_t)c->n_experts_used, F = (size_t)c->expert_d_ff;
    size_t S = moe_slots(c, N, padded), SF = (size_t)c->n_shared_experts * F, off = 0;
    /* the int arrays take floats' room (one size), used as ints only */
    struct {
        float **f;
        int **i;
        size_t n;
    } parts[] = {{&b->r_logits, NULL, n * E}, {&b->r_probs, NULL, n * E},
                 {&b->r_w, NULL, n * K},      {NULL, &b->r_sel, n * K},
                 {NULL, &b->r_slot, S},       {NULL, &b->r_off, E + 1},
                 {NULL, &b->r_pos, n * K},    {&b->e_x, NULL, S * d},
                 {&b->e_a, NULL, S * 2 * F},  {&b->e_h, NULL, S * F},
                 {&b->e_y, NULL, S * d},      {&b->sh_a, NULL, n * 2 * SF},
                 {&b->sh_h, NULL, n * SF},    {&b->sh_y, NULL, SF ? n * d : 0},
                 {&b->sh_g, NULL, SF ? n : 0}};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        float *at = base && parts[i].n ? base + off : NULL;
        if (base && parts[i].f) *parts[i].f = at;
        if (base && parts[i].i) *parts[i].i = (int *)at;
        off += MOE_ALIGN(parts[i].n);
    }
    return off;
}

size_t mdl_moe_floats(const tlm_config *c, int N, int padded) {
    mdl_block_bufs dummy;
    return moe_layout(c, N, padded, NULL, &dummy);
}

void mdl_moe_carve(const tlm_config *c, int N, int padded, float *base, mdl_block_bufs *b) {
    moe_layout(c, N, padded, base, b);
}

/* The backward scratch: the slots' gradients at the experts' outputs, hidden, gate|up (then
 * gate and up apart, each group's gate rows before its up rows) and inputs; the router's
 * gradients at its probabilities and logits [N, E] and at the weights [N, K]; the shared
 * expert's at its output, hidden and gate|up, and its input gradient [N, d]. */
typedef struct {
    float *dey, *deh, *dea, *dsplit, *dex, *dp, *dlog, *dw, *dsy, *dsh, *dsa, *dsx;
} moe_grads;

static size_t moe_grad_layout(const tlm_config *c, int N, int padded, float *base, moe_grads *g) {
    if (c->n_experts <= 0) return 0;
    size_t n = (size_t)N, d = (size_t)c->d_model, E = (size_t)c->n_experts;
    size_t K = (size_t)c->n_experts_used, F = (size_t)c->expert_d_ff;
    size_t S = moe_slots(c, N, padded), SF = (size_t)c->n_shared_experts * F, off = 0;
    struct {
        float **ptr;
        size_t n;
    } parts[] = {{&g->dey, S * d},        {&g->deh, S * F},      {&g->dea, S * 2 * F},
                 {&g->dsplit, S * 2 * F}, {&g->dex, S * d},      {&g->dp, n * E},
                 {&g->dlog, n * E},       {&g->dw, n * K},       {&g->dsy, SF ? n * d : 0},
                 {&g->dsh, n * SF},       {&g->dsa, n * 2 * SF}, {&g->dsx, SF ? n * d : 0}};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        if (base) *parts[i].ptr = parts[i].n ? base + off : NULL;
        off += MOE_ALIGN(parts[i].n);
    }
    return off;
}

size_t mdl_moe_grad_floats(const tlm_config *c, int N, int padded) {
    moe_grads dummy;
    return moe_grad_layout(c, N, padded, NULL, &dummy);
}

void mdl_moe_losses(const tlm_config *c, const mdl_moe_stats *st, double *aux, double *z) {
    *aux = *z = 0;
    if (c->n_experts <= 0 || !st || st->rows <= 0) return;
    double T = (double)st->rows, sum = 0;
    for (int e = 0; e < c->n_experts; e++) sum += (st->count[e] / T) * (st->psum[e] / T);
    *aux = c->n_experts * sum;
    *z = st->zsum / T;
}

/* Softmax of a row of n logits, and its logsumexp. */
static double softmax_row(float *p, const float *x, int n) {
    float mx = x[0];
    for (int i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    double sum = 0;
    for (int i = 0; i < n; i++) sum += (p[i] = expf(x[i] - mx));
    float inv = (float)(1.0 / sum);
    for (int i = 0; i < n; i++) p[i] *= inv;
    return (double)mx + log(sum);
}

/* The router: softmax over the experts, the K most probable (a tie goes to the lower index) and
 * their weights, the slots grouped by expert (in row order within a group, so every sum over them
 * has one order), and the statistics of a training pass. */
static void moe_route(const tlm_config *c, const mdl_pass *p, const mdl_block_bufs *b, int padded) {
    int N = p->N, E = c->n_experts, K = c->n_experts_used;
    mdl_moe_stats *st = p->moe;
    int *sel = b->r_sel, *off = b->r_off;
    memset(off, 0, (size_t)(E + 1) * sizeof *off);
    for (int r = 0; r < N; r++) {
        const float *lg = b->r_logits + (size_t)r * E;
        float *pr = b->r_probs + (size_t)r * E, *w = b->r_w + (size_t)r * K;
        double lse = softmax_row(pr, lg, E);
        int *sr = sel + (size_t)r * K;
        float sum = 0;
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int j = 0; j < k; j++) taken |= sr[j] == e;
                if (!taken && (best < 0 || pr[e] > pr[best])) best = e;
            }
            sr[k] = best;
            w[k] = pr[best];
            sum += w[k];
            off[best + 1]++;
        }
        if (c->expert_weights_norm)
            for (int k = 0; k < K; k++) w[k] /= sum;
        if (st) {
            for (int e = 0; e < E; e++) st->psum[e] += pr[e];
            for (int k = 0; k < K; k++) st->count[sr[k]] += 1;
            st->zsum += lse * lse;
        }
    }
    if (st) st->rows += N;
    for (int e = 0; e < E; e++) {
        int n = off[e + 1];
        if (padded) n = (n + MOE_PAD - 1) / MOE_PAD * MOE_PAD;
        off[e + 1] = off[e] + n;
    }
    /* each group filled in row order, then its padding marked */
    int fill[TLM_MAX_N_EXPERTS];
    for (int e = 0; e < E; e++) fill[e] = off[e];
    for (int r = 0; r < N; r++)
        for (int k = 0; k < K; k++) {
            int e = sel[(size_t)r * K + k], at = fill[e]++;
            b->r_slot[at] = r * K + k;
            b->r_pos[(size_t)r * K + k] = at;
        }
    for (int e = 0; e < E; e++)
        for (int at = fill[e]; at < off[e + 1]; at++) b->r_slot[at] = -1;
}

static void moe_fwd(const tlm_model *m, int l, const mdl_pass *p, const mdl_block_bufs *b,
                    const float *in) {
    const tlm_config *c = &m->c;
    const mdl_layer_weights *W = &m->lw[l];
    int N = p->N, d = c->d_model, E = c->n_experts, K = c->n_experts_used, F = c->expert_d_ff;
    int padded = p->bf16 != NULL;
    /* The router's product stays fp32 in a bf16 pass: bf16's rounding of the logits (2^-8 of
     * their size) would decide close choices between experts. */
    mdl_pass fp32 = *p;
    fp32.bf16 = NULL;
    linear(&fp32, b->r_logits, E, in, N, W->router, NULL);
    moe_route(c, p, b, padded);
    for (int e = 0; e < E; e++) {
        int s0 = b->r_off[e], n = b->r_off[e + 1] - s0;
        if (!n) continue;
        float *x = b->e_x + (size_t)s0 * d, *a = b->e_a + (size_t)s0 * 2 * F;
        float *h = b->e_h + (size_t)s0 * F, *y = b->e_y + (size_t)s0 * d;
        for (int i = 0; i < n; i++) {
            int slot = b->r_slot[s0 + i];
            if (slot < 0)
                memset(x + (size_t)i * d, 0, (size_t)d * sizeof(float));
            else
                memcpy(x + (size_t)i * d, in + (size_t)(slot / K) * d, (size_t)d * sizeof(float));
        }
        tlm_weight wg = mdl_expert_view(W->gate_exps, E, e), wu = mdl_expert_view(W->up_exps, E, e);
        tlm_weight wd = mdl_expert_view(W->down_exps, E, e);
        linear(p, a, 2 * F, x, n, &wg, NULL);
        linear(p, a + F, 2 * F, x, n, &wu, NULL);
        gated_rows_fwd(c, h, a, n, F);
        linear(p, y, d, h, n, &wd, NULL);
    }
    int SF = c->n_shared_experts * F;
    if (SF) {
        const tlm_weight *w[2] = {W->gate_sh, W->up_sh};
        const float *bias[2] = {NULL, NULL};
        linear_parts(p, b->sh_a, 2 * SF, in, N, w, bias, 2,
                     W->gate_up_sh.data ? &W->gate_up_sh : NULL);
        gated_rows_fwd(c, b->sh_h, b->sh_a, N, SF);
        linear(p, b->sh_y, d, b->sh_h, N, W->down_sh, NULL);
        for (int r = 0; r < N; r++) {
            const float *xr = in + (size_t)r * d;
            float z = 0;
            for (int j = 0; j < d; j++) z += xr[j] * W->sh_gate[j];
            b->sh_g[r] = 1.0f / (1.0f + expf(-z));
        }
    }
    /* each row's sum in the order of its choices, then the shared expert */
    for (int r = 0; r < N; r++) {
        float *yr = b->y + (size_t)r * d;
        memset(yr, 0, (size_t)d * sizeof(float));
        for (int k = 0; k < K; k++) {
            float w = b->r_w[(size_t)r * K + k];
            const float *ey = b->e_y + (size_t)b->r_pos[(size_t)r * K + k] * d;
            for (int j = 0; j < d; j++) yr[j] += w * ey[j];
        }
        if (SF) {
            float g = b->sh_g[r];
            const float *sy = b->sh_y + (size_t)r * d;
            for (int j = 0; j < d; j++) yr[j] += g * sy[j];
        }
    }
}

/* dx = dy W + beta dx in the pass's precision. */
static void bwd_dx(const mdl_pass *p, float *dx, const float *dy, int ldy, const float *w, int N,
                   int in, int out, float beta) {
    if (p->bf16)
        k_bf16_linear_bwd_dx(p->bf16, dx, dy, ldy, w, N, in, out, beta);
    else
        k_linear_bwd_dx(dx, dy, ldy, w, N, in, out, beta);
}

static void moe_bwd(const tlm_model *m, int l, const mdl_pass *p, const mdl_block_bufs *b,
                    const float *in, const float *dout, float *din, const mdl_block_grads *gr,
                    float *G, int acc) {
    const tlm_config *c = &m->c;
    const mdl_layer_weights *W = &m->lw[l];
    const mdl_layer_offsets *o = &m->off.layer[l];
    int N = p->N, d = c->d_model, E = c->n_experts, K = c->n_experts_used, F = c->expert_d_ff;
    int padded = p->bf16 != NULL, SF = c->n_shared_experts * F;
    moe_grads g;
    moe_grad_layout(c, N, padded, gr->moe, &g);
    /* the weights' and the slots' gradients */
    for (int r = 0; r < N; r++) {
        const float *dy = dout + (size_t)r * d;
        for (int k = 0; k < K; k++) {
            int at = b->r_pos[(size_t)r * K + k];
            const float *ey = b->e_y + (size_t)at * d;
            float *de = g.dey + (size_t)at * d, w = b->r_w[(size_t)r * K + k], dot = 0;
            for (int j = 0; j < d; j++) {
                dot += dy[j] * ey[j];
                de[j] = w * dy[j];
            }
            g.dw[(size_t)r * K + k] = dot;
        }
    }
    size_t fd = (size_t)F * d;
    for (int e = 0; e < E; e++) {
        int s0 = b->r_off[e], n = b->r_off[e + 1] - s0;
        float *dWg = G + o->gate_exps + e * fd, *dWu = G + o->up_exps + e * fd;
        float *dWd = G + o->down_exps + e * fd;
        if (!n) {
            /* no rows: the expert's gradient is zero, written when not accumulating */
            if (!acc) {
                memset(dWg, 0, fd * sizeof(float));
                memset(dWu, 0, fd * sizeof(float));
                memset(dWd, 0, fd * sizeof(float));
            }
            continue;
        }
        for (int i = 0; i < n; i++)
            if (b->r_slot[s0 + i] < 0) memset(g.dey + (size_t)(s0 + i) * d, 0, (size_t)d * 4);
        const float *x = b->e_x + (size_t)s0 * d, *a = b->e_a + (size_t)s0 * 2 * F;
        const float *h = b->e_h + (size_t)s0 * F;
        float *dey = g.dey + (size_t)s0 * d, *deh = g.deh + (size_t)s0 * F;
        float *dea = g.dea + (size_t)s0 * 2 * F, *dex = g.dex + (size_t)s0 * d;
        float *dg = g.dsplit + (size_t)s0 * 2 * F, *du = dg + (size_t)n * F;
        tlm_weight wg = mdl_expert_view(W->gate_exps, E, e), wu = mdl_expert_view(W->up_exps, E, e);
        tlm_weight wd = mdl_expert_view(W->down_exps, E, e);
        linear_bwd(p, deh, dWd, NULL, dey, h, wd.data, n, F, d, acc);
        gated_rows_bwd(c, dea, deh, a, n, F);
        for (int i = 0; i < n; i++) {
            memcpy(dg + (size_t)i * F, dea + (size_t)i * 2 * F, (size_t)F * sizeof(float));
            memcpy(du + (size_t)i * F, dea + (size_t)i * 2 * F + F, (size_t)F * sizeof(float));
        }
        linear_bwd(p, dex, dWg, NULL, dg, x, wg.data, n, d, F, acc);
        linear_bwd(p, NULL, dWu, NULL, du, x, NULL, n, d, F, acc);
        bwd_dx(p, dex, du, F, wu.data, n, d, F, 1.0f);
    }
    /* the router: through the weights (and their renormalisation), the load-balancing loss (its
     * f_i are constants), the softmax, and the z-loss at the logits */
    const mdl_moe_stats *st = p->moe;
    double T = st && st->rows > 0 ? (double)st->rows : 1;
    float scale = st ? st->scale : 0.0f;
    float aux = scale * c->router_aux_loss_coef, zc = scale * c->router_z_loss_coef;
    for (int r = 0; r < N; r++) {
        const float *pr = b->r_probs + (size_t)r * E, *w = b->r_w + (size_t)r * K;
        const float *dw = g.dw + (size_t)r * K;
        const int *sr = b->r_sel + (size_t)r * K;
        float *dp = g.dp + (size_t)r * E, *dl = g.dlog + (size_t)r * E;
        for (int e = 0; e < E; e++)
            dp[e] = st && aux != 0.0f ? (float)(aux * E * st->count[e] / (T * T)) : 0.0f;
        if (c->expert_weights_norm) {
            float sum = 0, wdw = 0;
            for (int k = 0; k < K; k++) {
                sum += pr[sr[k]];
                wdw += w[k] * dw[k];
            }
            for (int k = 0; k < K; k++) dp[sr[k]] += (dw[k] - wdw) / sum;
        } else {
            for (int k = 0; k < K; k++) dp[sr[k]] += dw[k];
        }
        float pdp = 0;
        for (int e = 0; e < E; e++) pdp += pr[e] * dp[e];
        float zg = 0;
        if (st && zc != 0.0f) {
            const float *lg = b->r_logits + (size_t)r * E;
            float mx = lg[0];
            for (int e = 1; e < E; e++) mx = lg[e] > mx ? lg[e] : mx;
            double sum = 0;
            for (int e = 0; e < E; e++) sum += exp((double)(lg[e] - mx));
            zg = (float)(zc * 2.0 * ((double)mx + log(sum)) / T);
        }
        for (int e = 0; e < E; e++) dl[e] = pr[e] * (dp[e] - pdp) + zg * pr[e];
    }
    k_linear_bwd(din, G + o->router, NULL, g.dlog, in, W->router->data, N, d, E, acc);
    /* the experts' input gradients, each row's in the order of its choices */
    for (int r = 0; r < N; r++) {
        float *dx = din + (size_t)r * d;
        for (int k = 0; k < K; k++) {
            const float *de = g.dex + (size_t)b->r_pos[(size_t)r * K + k] * d;
            for (int j = 0; j < d; j++) dx[j] += de[j];
        }
    }
    if (!SF) return;
    float *dgate = G + o->sh_gate;
    if (!acc) memset(dgate, 0, (size_t)d * sizeof(float));
    for (int r = 0; r < N; r++) {
        const float *dy = dout + (size_t)r * d, *sy = b->sh_y + (size_t)r * d;
        const float *xr = in + (size_t)r * d;
        float gv = b->sh_g[r], dot = 0, *ds = g.dsy + (size_t)r * d, *dx = din + (size_t)r * d;
        for (int j = 0; j < d; j++) {
            dot += dy[j] * sy[j];
            ds[j] = gv * dy[j];
        }
        float dz = dot * gv * (1.0f - gv);
        for (int j = 0; j < d; j++) {
            dgate[j] += dz * xr[j];
            dx[j] += dz * W->sh_gate[j];
        }
    }
    linear_bwd(p, g.dsh, G + o->down_sh, NULL, g.dsy, b->sh_h, W->down_sh->data, N, SF, d, acc);
    gated_rows_bwd(c, g.dsa, g.dsh, b->sh_a, N, SF);
    const tlm_weight *w[2] = {W->gate_sh, W->up_sh};
    parts_bwd(p, g.dsx, G + o->gate_sh, NULL, g.dsa, in, &W->gate_up_sh, w, 2, N, d, 2 * SF, acc);
    k_acc(din, g.dsx, (size_t)N * d);
}

static void ffn_fwd(const tlm_model *m, int l, const mdl_pass *p, const mdl_block_bufs *b,
                    const float *in) {
    const tlm_config *c = &m->c;
    const mdl_layer_weights *W = &m->lw[l];
    int N = p->N, d = c->d_model, ff = c->d_ff;
    if (c->n_experts > 0) {
        moe_fwd(m, l, p, b, in);
    } else if (mdl_gated(c)) {
        const tlm_weight *w[2] = {W->wgate, W->wup};
        const float *bias[2] = {W->bgate, W->bup};
        linear_parts(p, b->ff_a, 2 * ff, in, N, w, bias, 2, W->gate_up.data ? &W->gate_up : NULL);
        lora_parts_fwd(p, l, MDL_LORA_GATE, w, 2, b->ff_a, 2 * ff, in);
        gated_fwd(c, b->ff_h, b->ff_a, N);
    } else {
        linear(p, b->ff_a, ff, in, N, W->wup, W->bup);
        lora_fwd(p, l, MDL_LORA_UP, b->ff_a, ff, in);
        static const k_act forms[] = {K_ACT_SILU, K_ACT_GELU, K_ACT_GELU_TANH, K_ACT_RELU};
        /* Training keeps act' (in place of the pre-activations) for the backward pass. */
        if (p->training)
            k_act_fwd_grad(b->ff_h, b->ff_a, (size_t)N * ff, forms[c->ffn]);
        else
            k_act_fwd(b->ff_h, b->ff_a, (size_t)N * ff, forms[c->ffn]);
    }
    if (c->n_experts <= 0) {
        linear(p, b->y, d, b->ff_h, N, W->wdown, W->bdown);
        lora_fwd(p, l, MDL_LORA_DOWN, b->y, d, b->ff_h);
    }
    if (dropping(m, p) && !c->post_norms)
        k_dropout(b->y, b->y, (size_t)N * d, c->dropout, mdl_drop_key(p, l, 2));
}

static void ffn_bwd(const tlm_model *m, int l, const mdl_pass *p, const mdl_block_bufs *b,
                    const float *in, const float *dout, float *din, const mdl_block_grads *g,
                    float *G, int acc) {
    const tlm_config *c = &m->c;
    const mdl_layer_weights *W = &m->lw[l];
    const mdl_layer_offsets *o = &m->off.layer[l];
    int N = p->N, d = c->d_model, ff = c->d_ff;
    if (c->n_experts > 0) {
        moe_bwd(m, l, p, b, in, dout, din, g, G, acc);
        return;
    }
    if (p->frozen)
        frozen_dx(p, g->dff_h, dout, d, W->wdown, N, 0.0f);
    else
        linear_bwd(p, g->dff_h, G + o->wdown, mdl_at(G, o->bdown), dout, b->ff_h, W->wdown->data, N,
                   ff, d, acc);
    lora_bwd(p, l, MDL_LORA_DOWN, g->dff_h, dout, d, b->ff_h);
    if (mdl_gated(c)) {
        if (c->ffn == TLM_FFN_GEGLU)
            k_geglu_rows_bwd(g->dff_a, g->dff_h, b->ff_a, N, ff);
        else
            k_swiglu_rows_bwd(g->dff_a, g->dff_h, b->ff_a, N, ff);
        const tlm_weight *w[2] = {W->wgate, W->wup};
        if (p->frozen)
            frozen_parts_dx(p, din, g->dff_a, 2 * ff, &W->gate_up, w, 2, N);
        else
            parts_bwd(p, din, G + o->wgate, mdl_at(G, o->bgate), g->dff_a, in, &W->gate_up, w, 2, N,
                      d, 2 * ff, acc);
        lora_parts_bwd(p, l, MDL_LORA_GATE, w, 2, din, g->dff_a, 2 * ff, in);
    } else {
        k_mul(g->dff_h, g->dff_h, b->ff_a, (size_t)N * ff); /* the forward left act'(a) in ff_a */
        if (p->frozen)
            frozen_dx(p, din, g->dff_h, ff, W->wup, N, 0.0f);
        else
            linear_bwd(p, din, G + o->wup, mdl_at(G, o->bup), g->dff_h, in, W->wup->data, N, d, ff,
                       acc);
        lora_bwd(p, l, MDL_LORA_UP, din, g->dff_h, ff, in);
    }
}

/* ---- the block ------------------------------------------------------------------------------ */

void mdl_block_fwd(const tlm_model *m, int l, const mdl_pass *p, const mdl_block_bufs *b) {
    const tlm_config *c = &m->c;
    const mdl_layer_weights *W = &m->lw[l];
    int N = p->N;
    size_t nd = (size_t)N * c->d_model;
    if (c->norm_position == TLM_NORM_PRE && c->post_norms) {
        norm_fwd(c, b->n1, b->n1_mean, b->n1_rstd, b->x, W->attn_norm_w, W->attn_norm_b, N);
        attn_fwd(m, l, p, b, b->n1);
        norm_fwd(c, b->post, b->pa_mean, b->pa_rstd, b->attn_out, W->post_attn_norm_w,
                 W->post_attn_norm_b, N);
        if (dropping(m, p)) k_dropout(b->post, b->post, nd, c->dropout, mdl_drop_key(p, l, 1));
        k_add(b->h, b->x, b->post, nd);
        norm_fwd(c, b->n2, b->n2_mean, b->n2_rstd, b->h, W->ffn_norm_w, W->ffn_norm_b, N);
        ffn_fwd(m, l, p, b, b->n2);
        norm_fwd(c, b->post, b->pf_mean, b->pf_rstd, b->y, W->post_ffn_norm_w, W->post_ffn_norm_b,
                 N);
        if (dropping(m, p)) k_dropout(b->post, b->post, nd, c->dropout, mdl_drop_key(p, l, 2));
        k_add(b->out, b->h, b->post, nd);
    } else if (c->norm_position == TLM_NORM_PRE) {
        norm_fwd(c, b->n1, b->n1_mean, b->n1_rstd, b->x, W->attn_norm_w, W->attn_norm_b, N);
        attn_fwd(m, l, p, b, b->n1);
        k_add(b->h, b->x, b->attn_out, nd);
        norm_fwd(c, b->n2, b->n2_mean, b->n2_rstd, b->h, W->ffn_norm_w, W->ffn_norm_b, N);
        ffn_fwd(m, l, p, b, b->n2);
        k_add(b->out, b->h, b->y, nd);
    } else {
        attn_fwd(m, l, p, b, b->x);
        k_add(b->h, b->x, b->attn_out, nd);
        norm_fwd(c, b->n1, b->n1_mean, b->n1_rstd, b->h, W->attn_norm_w, W->attn_norm_b, N);
        ffn_fwd(m, l, p, b, b->n1);
        k_add(b->y, b->n1, b->y, nd);
        norm_fwd(c, b->out, b->n2_mean, b->n2_rstd, b->y, W->ffn_norm_w, W->ffn_norm_b, N);
    }
}

void mdl_block_bwd(const tlm_model *m, int l, const mdl_pass *p, const mdl_block_bufs *b,
                   const mdl_block_grads *g, float *G, int acc) {
    const tlm_config *c = &m->c;
    const mdl_layer_weights *W = &m->lw[l];
    const mdl_layer_offsets *o = &m->off.layer[l];
    int N = p->N;
    size_t nd = (size_t)N * c->d_model;
    /* Exactly the forward's values: the same kernels on the same rows (the statistics they write
     * again are the same too). */
    if (p->recompute) {
        if (c->norm_position == TLM_NORM_PRE) {
            norm_fwd(c, b->n1, b->n1_mean, b->n1_rstd, b->x, W->attn_norm_w, W->attn_norm_b, N);
            norm_fwd(c, b->n2, b->n2_mean, b->n2_rstd, b->h, W->ffn_norm_w, W->ffn_norm_b, N);
        } else {
            norm_fwd(c, b->n1, b->n1_mean, b->n1_rstd, b->h, W->attn_norm_w, W->attn_norm_b, N);
        }
        if (mdl_gated(c) && c->n_experts <= 0) gated_fwd(c, b->ff_h, b->ff_a, N);
    }
    float *GN = p->frozen ? NULL : G; /* the norms' gains: frozen in LoRA passes */
    if (c->norm_position == TLM_NORM_PRE && c->post_norms) {
        /* each post norm's backward first, into dtmp, which the sub-layer's reads before the
         * pre norm's backward writes it again */
        norm_bwd(c, g->dtmp, GN, o->post_ffn_norm_w, o->post_ffn_norm_b, W->post_ffn_norm_w,
                 undrop(m, p, g, g->dres, l, 2), b->y, b->pf_mean, b->pf_rstd, N, acc);
        ffn_bwd(m, l, p, b, b->n2, g->dtmp, g->dn, g, G, acc);
        norm_bwd(c, g->dtmp, GN, o->ffn_norm_w, o->ffn_norm_b, W->ffn_norm_w, g->dn, b->h,
                 b->n2_mean, b->n2_rstd, N, acc);
        k_acc(g->dres, g->dtmp, nd);
        norm_bwd(c, g->dtmp, GN, o->post_attn_norm_w, o->post_attn_norm_b, W->post_attn_norm_w,
                 undrop(m, p, g, g->dres, l, 1), b->attn_out, b->pa_mean, b->pa_rstd, N, acc);
        attn_bwd(m, l, p, b, b->n1, g->dtmp, g->dn, g, G, acc);
        norm_bwd(c, g->dtmp, GN, o->attn_norm_w, o->attn_norm_b, W->attn_norm_w, g->dn, b->x,
                 b->n1_mean, b->n1_rstd, N, acc);
        k_acc(g->dres, g->dtmp, nd);
    } else if (c->norm_position == TLM_NORM_PRE) {
        ffn_bwd(m, l, p, b, b->n2, undrop(m, p, g, g->dres, l, 2), g->dn, g, G, acc);
        norm_bwd(c, g->dtmp, p->frozen ? NULL : G, o->ffn_norm_w, o->ffn_norm_b, W->ffn_norm_w,
                 g->dn, b->h, b->n2_mean, b->n2_rstd, N, acc);
        k_acc(g->dres, g->dtmp, nd);
        attn_bwd(m, l, p, b, b->n1, g->dres, g->dn, g, G, acc);
        norm_bwd(c, g->dtmp, p->frozen ? NULL : G, o->attn_norm_w, o->attn_norm_b, W->attn_norm_w,
                 g->dn, b->x, b->n1_mean, b->n1_rstd, N, acc);
        k_acc(g->dres, g->dtmp, nd);
    } else {
        norm_bwd(c, g->dtmp, p->frozen ? NULL : G, o->ffn_norm_w, o->ffn_norm_b, W->ffn_norm_w,
                 g->dres, b->y, b->n2_mean, b->n2_rstd, N, acc);
        ffn_bwd(m, l, p, b, b->n1, undrop(m, p, g, g->dtmp, l, 2), g->dn, g, G, acc);
        k_acc(g->dn, g->dtmp, nd);
        norm_bwd(c, g->dres, p->frozen ? NULL : G, o->attn_norm_w, o->attn_norm_b, W->attn_norm_w,
                 g->dn, b->h, b->n1_mean, b->n1_rstd, N, acc);
        attn_bwd(m, l, p, b, b->x, g->dres, g->dtmp, g, G, acc);
        k_acc(g->dres, g->dtmp, nd);
    }
}

/* ---- embedding and head --------------------------------------------------------------------- */

/* Rows [r0, r1) of x: the rows of their token ids times scale, plus their positions' rows when
 * pos is not NULL. */
K_INLINE void embed_rows(float *x, const tlm_weight *E, const int32_t *ids, const float *pos,
                         const int *at, int d, float scale, long r0, long r1) {
    for (long r = r0; r < r1; r++) {
        float *xr = x + (size_t)r * d;
        /* Only a row is read: any type the model holds widens here. */
        core_dtype_to_f32(E->dtype, (const char *)E->data + (size_t)ids[r] * E->row_bytes, xr,
                          (size_t)d);
        if (scale != 1.0f)
            for (int j = 0; j < d; j++) xr[j] *= scale;
        if (pos) {
            const float *pr = pos + (size_t)at[r] * d;
            for (int j = 0; j < d; j++) xr[j] += pr[j];
        }
    }
}
K_VERSIONS(embed_rows,
           (float *x, const tlm_weight *E, const int32_t *ids, const float *pos, const int *at,
            int d, float scale, long r0, long r1),
           (x, E, ids, pos, at, d, scale, r0, r1))

/* The token embedding's factor before the first block (embed_scale; 1 when unset). */
static float embed_scale(const tlm_config *c) {
    return c->embed_scale > 0.0f ? c->embed_scale : 1.0f;
}

void mdl_embed_fwd(const tlm_model *m, const mdl_pass *p, const int32_t *ids, float *x) {
    const tlm_config *c = &m->c;
    int d = c->d_model, N = p->N;
    const float *pos = c->position == TLM_POS_LEARNED      ? mdl_wf(m->pos_emb)
                       : c->position == TLM_POS_SINUSOIDAL ? m->sinus
                                                           : NULL;
    embed_rows_fn *f = embed_rows_pick();
    float scale = embed_scale(c);
    K_RANGES(r0, r1, N, (long)N * d, f(x, m->tok_emb, ids, pos, p->pos, d, scale, r0, r1));
    if (dropping(m, p)) k_dropout(x, x, (size_t)N * d, c->dropout, mdl_drop_key(p, -1, 0));
}

/* Row at[r] of table += row r of src, for r in order: rows can repeat within a batch, so this
 * scatter-add runs on one thread. */
K_INLINE void scatter_add(float *table, const int *at, const float *src, int N, int d) {
    for (int r = 0; r < N; r++) {
        float *dst = table + (size_t)at[r] * d;
        const float *sr = src + (size_t)r * d;
        for (int j = 0; j < d; j++) dst[j] += sr[j];
    }
}
K_VERSIONS(scatter_add, (float *table, const int *at, const float *src, int N, int d),
           (table, at, src, N, d))

void mdl_embed_bwd(const tlm_model *m, const mdl_pass *p, const int32_t *ids,
                   const mdl_block_grads *g, float *G, int acc) {
    const tlm_config *c = &m->c;
    int d = c->d_model, N = p->N;
    size_t nd = (size_t)N * d;
    if (dropping(m, p)) k_dropout(g->dres, g->dres, nd, c->dropout, mdl_drop_key(p, -1, 0));
    /* A tied table already holds the head's gradient; an untied one starts from zero. */
    scatter_add_fn *add = scatter_add_pick();
    float *dE = G + m->off.tok_emb;
    if (c->position == TLM_POS_LEARNED) {
        float *dPos = G + m->off.pos_emb;
        if (!acc) memset(dPos, 0, (size_t)c->context_length * d * sizeof(float));
        add(dPos, p->pos, g->dres, N, d);
    }
    /* the table's rows were scaled, the positions' not: dres is read no more after this */
    float scale = embed_scale(c);
    if (scale != 1.0f)
        for (size_t i = 0; i < nd; i++) g->dres[i] *= scale;
    if (!acc && !c->tie_embeddings) memset(dE, 0, (size_t)c->vocab_size * d * sizeof(float));
    add(dE, ids, g->dres, N, d);
}

void mdl_head_fwd(const tlm_model *m, const float *x, float *xn, float *xn_mean, float *xn_rstd,
                  float *logits, int N) {
    mdl_pass fp32 = {0};
    mdl_head_fwd_pass(m, &fp32, x, xn, xn_mean, xn_rstd, logits, N);
}

void mdl_head_norm(const tlm_model *m, const float *x, float *xn, int N) {
    const tlm_config *c = &m->c;
    if (c->norm_position == TLM_NORM_PRE)
        norm_fwd(c, xn, NULL, NULL, x, m->out_norm_w, m->out_norm_b, N);
    else if (xn != x)
        memcpy(xn, x, (size_t)N * (size_t)c->d_model * sizeof(float));
}

void mdl_head_fwd_pass(const tlm_model *m, const mdl_pass *p, const float *x, float *xn,
                       float *xn_mean, float *xn_rstd, float *logits, int N) {
    const tlm_config *c = &m->c;
    const float *in = x;
    /* Post-norm blocks end normalized already; only pre-norm models have a final norm. */
    if (c->norm_position == TLM_NORM_PRE) {
        norm_fwd(c, xn, xn_mean, xn_rstd, x, m->out_norm_w, m->out_norm_b, N);
        in = xn;
    }
    linear(p, logits, c->vocab_size, in, N, m->out_w, NULL);
    lora_fwd(p, -1, 0, logits, c->vocab_size, in);
    if (c->final_softcap > 0.0f) k_softcap_fwd(logits, (size_t)N * c->vocab_size, c->final_softcap);
}

void mdl_head_bwd(const tlm_model *m, const mdl_pass *p, const float *x, const float *xn,
                  const float *xn_mean, const float *xn_rstd, const float *dlogits,
                  const mdl_block_grads *g, float *G, int N, int acc) {
    const tlm_config *c = &m->c;
    int pre = c->norm_position == TLM_NORM_PRE;
    /* The gradient at the head's input goes to dres directly for post-norm, else via the norm. */
    float *dhead = pre ? g->dtmp : g->dres;
    /* The loss takes the head a slice of rows at a time: its weight widened once, not per slice. */
    if (p->frozen && p->bf16 && !bf16_weight(p, m->out_w))
        (void)k_bf16_linear_bwd_dx_kept(p->bf16, dhead, dlogits, c->vocab_size, m->out_w, N, 0.0f);
    else if (p->frozen)
        frozen_dx(p, dhead, dlogits, c->vocab_size, m->out_w, N, 0.0f);
    else
        linear_bwd(p, dhead, G + m->off.out_w, NULL, dlogits, pre ? xn : x, m->out_w->data, N,
                   c->d_model, c->vocab_size, acc);
    lora_bwd(p, -1, 0, dhead, dlogits, c->vocab_size, pre ? xn : x);
    if (pre)
        norm_bwd(c, g->dres, p->frozen ? NULL : G, m->off.out_norm_w, m->off.out_norm_b,
                 m->out_norm_w, g->dtmp, x, xn_mean, xn_rstd, N, acc);
}
