/* Matrix products with bf16 operands and fp32 accumulation (mixed-precision training) through
 * oneDNN's matmul, which runs them on vdpbf16ps where the CPU has avx512_bf16: on this Zen 5 about
 * twice sgemm's rate on the products of a training step (bench/bf16). The operands are rounded to
 * bf16 (nearest even) at each product; a weight is rounded once per pass (k_bf16_next_pass) and
 * reused by the backward pass. Results are fp32, added to what C holds where the fp32 kernels add.
 */
#include <stdlib.h>
#include <string.h>

#include <cblas.h>
#include <immintrin.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include "core/core.h"
#include "fastmath.h"
#include "kernels.h"
#include "qdot.h"

int k_bf16_supported(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512f");
#else
    return 0;
#endif
}

/* ---- rounding to bf16 ---------------------------------------------------------------------- */

/* vcvtne2ps2bf16 rounds to nearest even like k_bf16_bits (NaNs stay NaNs, denormals become 0). */
__attribute__((target("avx512f,avx512bf16"))) static void
to_bf16_avx512(uint16_t *dst, const float *src, size_t n) {
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + i + 16), _mm512_loadu_ps(src + i));
        _mm512_storeu_si512((void *)(dst + i), (__m512i)v);
    }
    for (; i < n; i++) dst[i] = k_bf16_bits(src[i]);
}

/* Without vcvtne2ps2bf16: the same rounding in plain C, which vectorizes. */
K_INLINE void to_bf16_plain(uint16_t *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = k_bf16_bits(src[i]);
}
K_VERSIONS(to_bf16_plain, (uint16_t * dst, const float *src, size_t n), (dst, src, n))

typedef void round_fn(uint16_t *dst, const float *src, size_t n);

static round_fn *rounding(void) {
    return k_bf16_supported() && k_vec_isa() >= K_ISA_AVX512 ? to_bf16_avx512
                                                             : to_bf16_plain_pick();
}

void k_f32_to_bf16(uint16_t *dst, const float *src, size_t n) {
    round_fn *f = rounding();
    /* Chunks of 4096 floats keep every thread on whole cache lines of both arrays. */
    long chunks = (long)((n + 4095) / 4096);
    K_FOR(c, chunks, (long)(n / 4),
          f(dst + (size_t)c * 4096, src + (size_t)c * 4096,
            n - (size_t)c * 4096 < 4096 ? n - (size_t)c * 4096 : 4096));
}

/* Rows of cols floats ld apart into contiguous rows, in one parallel region: a k_f32_to_bf16 call
 * per row is too short to split, so every row ran on one thread while the others waited (the dX
 * products of q, k and v of a model whose parts lie apart in its file: 3 x N rows per layer). */
static void round_rows(uint16_t *dst, const float *src, size_t ld, int rows, int cols) {
    round_fn *f = rounding();
    K_FOR(i, rows, (long)rows * cols / 4,
          f(dst + (size_t)i * (size_t)cols, src + (size_t)i * ld, (size_t)cols));
}

float k_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- the context --------------------------------------------------------------------------- */

/* A product: C[M, N] (+)= op(A)[M, K] op(B)[K, N], row-major; A transposed is stored [K, M], B
 * transposed [N, K] (ta, tb: the strides say so, no copy). nthr: a primitive divides its work
 * among the threads oneDNN counted when it was made, and runs each share on the thread of that
 * number in the team. */
typedef struct {
    int M, N, K, ta, lda, tb, ldb, ldc, add, pack, nthr;
} mm_key;

/* One matmul primitive per key. A packed one takes B as fp32 and has oneDNN round it into the
 * blocked layout its kernels read (`pack`, a reorder into `pbuf`) before the product. */
typedef struct {
    mm_key key;
    dnnl_primitive_t prim, pack;
    dnnl_memory_t a, b, c, bsrc;
    void *pbuf;
    size_t pbytes;
} mm;

/* An activation's rounded copy, made by a forward product and valid for the backward of the same
 * pass (the backward's dW = dy^T x needs x rounded exactly as the forward did). */
typedef struct {
    const float *src;
    size_t n;
    uint16_t *bf;
    unsigned pass;
} acopy;

/* The most bytes of activation copies kept (beyond them the backward rounds x again): a pass's
 * copies take half the bytes of the products' fp32 inputs. */
#define K_BF16_KEEP_MAX ((size_t)2 << 30)

/* A weight's rounded copy, valid for the weights' generation it was made in (a pass, or every pass
 * while the weights are frozen). */
typedef struct {
    const float *src;
    size_t n;
    uint16_t *bf;
    unsigned pass;
} wcopy;

/* The rounded copies, the packed operands and the scratch are core_big_alloc buffers, on 2 MiB
 * pages where the kernel gives them: from the heap's 4 KiB pages, rounding the 327 M elements of
 * a gpt2-124M-like step took 2-3x as long (0.18-0.29 s of a 1.7 s step), the largest (the head's
 * weight and its logits' gradient) at a quarter of the memory's speed. A copy of n elements
 * takes bf_bytes(n), which core_big_free is given back. */
static size_t bf_bytes(size_t n) { return n * 2; }

struct k_bf16 {
    dnnl_engine_t eng;
    dnnl_stream_t strm;
    mm *mms;
    int n_mms, cap_mms;
    wcopy *w;
    int n_w, cap_w;
    acopy *a;
    int n_a, cap_a;
    size_t a_bytes;
    unsigned pass;
    unsigned wgen; /* the weights' generation: the pass, unless frozen */
    int frozen;
    /* Scratch: rounded activations (slots 0 and 1, the operands of a product), and the
     * attention's operands (k_bf16_scratch). */
    void *buf[K_BF16_SLOTS];
    size_t buf_bytes[K_BF16_SLOTS];
    long fallbacks;
};

k_bf16 *k_bf16_new(void) {
    k_bf16 *k = calloc(1, sizeof *k);
    if (!k) return NULL;
    if (dnnl_engine_create(&k->eng, dnnl_cpu, 0) != dnnl_success) {
        free(k);
        return NULL;
    }
    if (dnnl_stream_create(&k->strm, k->eng, dnnl_stream_default_flags) != dnnl_success) {
        dnnl_engine_destroy(k->eng);
        free(k);
        return NULL;
    }
    k->pass = 1;
    return k;
}

void k_bf16_free(k_bf16 *k) {
    if (!k) return;
    for (int i = 0; i < k->n_mms; i++) {
        dnnl_memory_destroy(k->mms[i].a);
        dnnl_memory_destroy(k->mms[i].b);
        dnnl_memory_destroy(k->mms[i].c);
        dnnl_primitive_destroy(k->mms[i].prim);
        if (k->mms[i].pack) {
            dnnl_memory_destroy(k->mms[i].bsrc);
            dnnl_primitive_destroy(k->mms[i].pack);
        }
        core_big_free(k->mms[i].pbuf, k->mms[i].pbytes);
    }
    free(k->mms);
    for (int i = 0; i < k->n_w; i++) core_big_free(k->w[i].bf, bf_bytes(k->w[i].n));
    free(k->w);
    for (int i = 0; i < k->n_a; i++) core_big_free(k->a[i].bf, bf_bytes(k->a[i].n));
    free(k->a);
    for (int i = 0; i < K_BF16_SLOTS; i++) core_big_free(k->buf[i], k->buf_bytes[i]);
    dnnl_stream_destroy(k->strm);
    dnnl_engine_destroy(k->eng);
    free(k);
}

void k_bf16_next_pass(k_bf16 *k) {
    k->pass++;
    if (!k->frozen) k->wgen = k->pass;
}

void k_bf16_set_frozen(k_bf16 *k, int frozen) {
    if (k->frozen && !frozen) k->wgen = k->pass + 1; /* the weights may change from now on */
    k->frozen = frozen;
}

long k_bf16_fallbacks(const k_bf16 *k) { return k->fallbacks; }

void *k_bf16_scratch(k_bf16 *k, int slot, size_t bytes) {
    if (slot < 0 || slot >= K_BF16_SLOTS) return NULL;
    if (k->buf_bytes[slot] < bytes) {
        core_big_free(k->buf[slot], k->buf_bytes[slot]);
        k->buf[slot] = core_big_alloc(bytes);
        k->buf_bytes[slot] = k->buf[slot] ? bytes : 0;
    }
    return k->buf[slot];
}

static uint16_t *scratch(k_bf16 *k, int which, size_t n) { return k_bf16_scratch(k, which, n * 2); }

static const uint16_t *round_to(k_bf16 *k, int which, const float *src, size_t n) {
    uint16_t *d = scratch(k, which, n);
    if (d) k_f32_to_bf16(d, src, n);
    return d;
}

/* A buffer for x's rounded copy, registered as made in this pass (the caller fills it); NULL when
 * none can be kept. Any other copy of bytes x overlaps is dropped: they were overwritten since. */
static uint16_t *keep(k_bf16 *k, const float *x, size_t n) {
    acopy *e = NULL;
    for (int i = 0; i < k->n_a; i++) {
        acopy *c = &k->a[i];
        if (c->src == x && c->n == n)
            e = c;
        else if (c->src < x + n && x < c->src + c->n)
            c->pass = 0;
    }
    if (!e) {
        size_t bytes = bf_bytes(n);
        if (k->a_bytes + bytes > K_BF16_KEEP_MAX) return NULL;
        if (k->n_a == k->cap_a) {
            int cap = k->cap_a ? 2 * k->cap_a : 32;
            acopy *na = realloc(k->a, (size_t)cap * sizeof *na);
            if (!na) return NULL;
            k->a = na;
            k->cap_a = cap;
        }
        uint16_t *bf = core_big_alloc(bytes);
        if (!bf) return NULL;
        e = &k->a[k->n_a++];
        *e = (acopy){x, n, bf, 0};
        k->a_bytes += bytes;
    }
    e->pass = k->pass;
    return e->bf;
}

static const uint16_t *kept(const k_bf16 *k, const float *x, size_t n) {
    for (int i = 0; i < k->n_a; i++)
        if (k->a[i].src == x && k->a[i].n == n && k->a[i].pass == k->pass) return k->a[i].bf;
    return NULL;
}

/* x rounded for a forward product, kept for the backward of this pass (whose dW reads it; with
 * frozen weights there is none). */
static const uint16_t *act_fwd(k_bf16 *k, const float *x, size_t n) {
    uint16_t *bf = k->frozen ? NULL : keep(k, x, n);
    if (!bf) return round_to(k, 0, x, n);
    k_f32_to_bf16(bf, x, n);
    return bf;
}

/* x rounded for a backward product: the forward's copy when this pass made one, else afresh. */
static const uint16_t *act_bwd(k_bf16 *k, const float *x, size_t n) {
    const uint16_t *bf = kept(k, x, n);
    return bf ? bf : round_to(k, 1, x, n);
}

/* Room for one more weight copy. */
static int grow_w(k_bf16 *k) {
    if (k->n_w < k->cap_w) return 1;
    int cap = k->cap_w ? 2 * k->cap_w : 32;
    wcopy *nw = realloc(k->w, (size_t)cap * sizeof *nw);
    if (!nw) return 0;
    k->w = nw;
    k->cap_w = cap;
    return 1;
}

/* The copy of the n elements at src, if one was made. */
static wcopy *find_w(k_bf16 *k, const float *src, size_t n) {
    for (int i = 0; i < k->n_w; i++)
        if (k->w[i].src == src && k->w[i].n == n) return &k->w[i];
    return NULL;
}

/* The weight's copy for this pass: rounded at its first use in the pass. */
static const uint16_t *weight(k_bf16 *k, const float *w, size_t n) {
    wcopy *e = find_w(k, w, n);
    if (!e) {
        if (!grow_w(k)) return NULL;
        uint16_t *bf = core_big_alloc(bf_bytes(n));
        if (!bf) return NULL;
        e = &k->w[k->n_w++];
        *e = (wcopy){w, n, bf, k->wgen - 1}; /* not yet rounded */
    }
    if (e->pass != k->wgen) {
        k_f32_to_bf16(e->bf, w, n);
        e->pass = k->wgen;
    }
    return e->bf;
}

/* The reorder that rounds fp32 B (layout bmd's dims with strides bs) into the layout the matmul
 * chose for its weights, and that layout's buffer. */
static int make_pack(k_bf16 *k, mm *r, const dnnl_dims_t bd, const dnnl_dims_t bs,
                     const_dnnl_primitive_desc_t pd) {
    const dnnl_memory_desc_t *wmd = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    dnnl_memory_desc_t fmd;
    dnnl_primitive_desc_t rpd = NULL;
    size_t bytes = wmd ? dnnl_memory_desc_get_size(wmd) : 0;
    r->pbytes = bytes;
    int ok =
        bytes && (r->pbuf = core_big_alloc(bytes)) &&
        dnnl_memory_desc_init_by_strides(&fmd, 2, bd, dnnl_f32, bs) == dnnl_success &&
        dnnl_reorder_primitive_desc_create(&rpd, &fmd, k->eng, wmd, k->eng, NULL) == dnnl_success &&
        dnnl_primitive_create(&r->pack, rpd) == dnnl_success &&
        dnnl_memory_create(&r->bsrc, &fmd, k->eng, DNNL_MEMORY_NONE) == dnnl_success &&
        dnnl_memory_create(&r->b, wmd, k->eng, r->pbuf) == dnnl_success;
    if (rpd) dnnl_primitive_desc_destroy(rpd);
    return ok;
}

static mm *primitive(k_bf16 *k, const mm_key *key) {
    for (int i = 0; i < k->n_mms; i++)
        if (!memcmp(&k->mms[i].key, key, sizeof *key)) return &k->mms[i];
    if (k->n_mms == k->cap_mms) {
        int cap = k->cap_mms ? 2 * k->cap_mms : 16;
        mm *n = realloc(k->mms, (size_t)cap * sizeof *n);
        if (!n) return NULL;
        k->mms = n;
        k->cap_mms = cap;
    }
    dnnl_memory_desc_t amd, bmd, cmd;
    dnnl_matmul_desc_t md;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    mm r = {.key = *key};
    dnnl_dims_t ad = {key->M, key->K}, bd = {key->K, key->N}, cd = {key->M, key->N};
    dnnl_dims_t as = {key->ta ? 1 : key->lda, key->ta ? key->lda : 1};
    dnnl_dims_t bs = {key->tb ? 1 : key->ldb, key->tb ? key->ldb : 1}, cs = {key->ldc, 1};
    int ok = dnnl_memory_desc_init_by_strides(&amd, 2, ad, dnnl_bf16, as) == dnnl_success &&
             (key->pack
                  ? dnnl_memory_desc_init_by_tag(&bmd, 2, bd, dnnl_bf16, dnnl_format_tag_any)
                  : dnnl_memory_desc_init_by_strides(&bmd, 2, bd, dnnl_bf16, bs)) == dnnl_success &&
             dnnl_memory_desc_init_by_strides(&cmd, 2, cd, dnnl_f32, cs) == dnnl_success &&
             dnnl_matmul_desc_init(&md, &amd, &bmd, NULL, &cmd) == dnnl_success &&
             dnnl_primitive_attr_create(&attr) == dnnl_success;
    if (ok && key->add)
        ok = dnnl_post_ops_create(&po) == dnnl_success &&
             dnnl_post_ops_append_sum(po, 1.0f) == dnnl_success &&
             dnnl_primitive_attr_set_post_ops(attr, po) == dnnl_success;
    ok = ok && dnnl_primitive_desc_create(&pd, &md, attr, k->eng, NULL) == dnnl_success &&
         dnnl_primitive_create(&r.prim, pd) == dnnl_success &&
         dnnl_memory_create(&r.a, &amd, k->eng, DNNL_MEMORY_NONE) == dnnl_success &&
         (key->pack ? make_pack(k, &r, bd, bs, pd)
                    : dnnl_memory_create(&r.b, &bmd, k->eng, DNNL_MEMORY_NONE) == dnnl_success) &&
         dnnl_memory_create(&r.c, &cmd, k->eng, DNNL_MEMORY_NONE) == dnnl_success;
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (!ok) {
        if (r.a) dnnl_memory_destroy(r.a);
        if (r.b) dnnl_memory_destroy(r.b);
        if (r.c) dnnl_memory_destroy(r.c);
        if (r.bsrc) dnnl_memory_destroy(r.bsrc);
        if (r.pack) dnnl_primitive_destroy(r.pack);
        if (r.prim) dnnl_primitive_destroy(r.prim);
        core_big_free(r.pbuf, r.pbytes);
        return NULL;
    }
    k->mms[k->n_mms] = r;
    return &k->mms[k->n_mms++];
}

/* B is bf16 (rounded by us) or, for a packed primitive, the fp32 source. */
static int run(k_bf16 *k, const mm_key *key, const uint16_t *A, const void *B, float *C) {
    mm *p = primitive(k, key);
    if (!p) return 0;
    if (key->pack) {
        dnnl_exec_arg_t pargs[2] = {{DNNL_ARG_FROM, p->bsrc}, {DNNL_ARG_TO, p->b}};
        if (dnnl_memory_set_data_handle(p->bsrc, (void *)B) != dnnl_success ||
            dnnl_primitive_execute(p->pack, k->strm, 2, pargs) != dnnl_success)
            return 0;
    } else if (dnnl_memory_set_data_handle(p->b, (void *)B) != dnnl_success) {
        return 0;
    }
    if (dnnl_memory_set_data_handle(p->a, (void *)A) != dnnl_success ||
        dnnl_memory_set_data_handle(p->c, C) != dnnl_success)
        return 0;
    dnnl_exec_arg_t args[3] = {
        {DNNL_ARG_SRC, p->a}, {DNNL_ARG_WEIGHTS, p->b}, {DNNL_ARG_DST, p->c}};
    if (dnnl_primitive_execute(p->prim, k->strm, 3, args) != dnnl_success) return 0;
    return dnnl_stream_wait(k->strm) == dnnl_success;
}

/* The product of key on rounded operands; 0 when oneDNN could not do it. A team shorter than the
 * count a primitive was made for would leave the missing threads' shares undone (OMP_THREAD_LIMIT,
 * dynamic teams), so the calling thread's count is capped and its teams fixed around the call. */
static int product(k_bf16 *k, mm_key *key, const uint16_t *A, const void *B, float *C) {
    if (!A || !B) return 0;
    int dyn = omp_get_dynamic(), n = omp_get_max_threads(), limit = omp_get_thread_limit();
    if (dyn) omp_set_dynamic(0);
    if (limit > 0 && n > limit) omp_set_num_threads(limit);
    key->nthr = omp_in_parallel() ? 1 : omp_get_max_threads();
    int ok = run(k, key, A, B, C);
    if (limit > 0 && n > limit) omp_set_num_threads(n);
    if (dyn) omp_set_dynamic(1);
    return ok;
}

static int gemm_b(k_bf16 *k, int M, int N, int K, const uint16_t *A, int ta, int lda, const void *B,
                  int tb, int ldb, float *C, int ldc, int add, int pack) {
    mm_key key = {M, N, K, ta, lda, tb, ldb, ldc, add, pack, 0};
    return product(k, &key, A, B, C);
}

static int gemm(k_bf16 *k, int M, int N, int K, const uint16_t *A, int ta, int lda,
                const uint16_t *B, int tb, int ldb, float *C, int ldc, int add) {
    return gemm_b(k, M, N, K, A, ta, lda, B, tb, ldb, C, ldc, add, 0);
}

/* ---- the linear layer ---------------------------------------------------------------------- */

void k_bf16_linear_fwd(k_bf16 *k, float *y, int ldy, const float *x, const float *w, const float *b,
                       int N, int in, int out) {
    if (b) {
        K_FOR(i, N, (long)N * out, memcpy(y + (size_t)i * ldy, b, (size_t)out * sizeof *b));
    }
    /* Kept for the backward's dW unless that takes x in fp32 (the packed layout, below). */
    const uint16_t *xb =
        out >= 4 * in ? round_to(k, 0, x, (size_t)N * in) : act_fwd(k, x, (size_t)N * in);
    const uint16_t *wb = weight(k, w, (size_t)out * in);
    if (gemm(k, N, out, in, xb, 0, in, wb, 1, in, y, ldy, b != NULL)) return;
    k->fallbacks++;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, out, in, 1.0f, x, in, w, in,
                b ? 1.0f : 0.0f, y, ldy);
}

void k_bf16_linear_bwd(k_bf16 *k, float *dx, float *dw, float *db, const float *dy, const float *x,
                       const float *w, int N, int in, int out, int acc) {
    const uint16_t *dyb = round_to(k, 0, dy, (size_t)N * out);
    if (dx) {
        const uint16_t *wb = weight(k, w, (size_t)out * in);
        if (!gemm(k, N, in, out, dyb, 0, out, wb, 0, in, dx, in, 0)) {
            k->fallbacks++;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, in, out, 1.0f, dy, out, w, in,
                        0.0f, dx, in);
        }
    }
    /* dW = dy^T x. With B = x in the plain layout, oneDNN copies B's blocks into its own layout
     * again for every block of dW's rows: with many more rows than columns (the head: vocabulary
     * x d_model) rounding x straight into that layout once (a reorder) is 1.3-1.4x faster. */
    int ok;
    if (out >= 4 * in) {
        ok = gemm_b(k, out, in, N, dyb, 1, out, x, 0, in, dw, in, acc, 1);
    } else {
        const uint16_t *xb = act_bwd(k, x, (size_t)N * in);
        ok = gemm(k, out, in, N, dyb, 1, out, xb, 0, in, dw, in, acc);
    }
    if (!ok) {
        k->fallbacks++;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, N, 1.0f, dy, out, x, in,
                    acc ? 1.0f : 0.0f, dw, in);
    }
    if (db) k_colsum(db, dy, N, out, acc);
}

void k_bf16_linear_bwd_dx(k_bf16 *k, float *dx, const float *dy, int ldy, const float *w, int N,
                          int in, int out, float beta) {
    /* dy is a column block of a wider gradient (one part of stacked weights lying apart). */
    uint16_t *dyb = scratch(k, 0, (size_t)N * out);
    if (dyb) round_rows(dyb, dy, (size_t)ldy, N, out);
    const uint16_t *wb = weight(k, w, (size_t)out * in);
    if (beta == 0.0f || beta == 1.0f) {
        if (gemm(k, N, in, out, dyb, 0, out, wb, 0, in, dx, in, beta == 1.0f)) return;
    }
    k->fallbacks++;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, in, out, 1.0f, dy, ldy, w, in, beta,
                dx, in);
}

/* Widened bf16 rows per tile of a frozen weight: 4 MiB, as the fp32 tiles of linear_frozen.c. */
#define FROZEN_TILE_BYTES (4u << 20)

tlm_status k_bf16_linear_bwd_dx_frozen(k_bf16 *k, float *dx, const float *dy, int ldy,
                                       const tlm_weight *w, int N, float beta) {
    int in = (int)w->cols, out = (int)w->rows;
    if (w->dtype == TLM_DTYPE_F32 || (beta != 0.0f && beta != 1.0f) || N == 0 || out == 0)
        return k_linear_bwd_dx_frozen(dx, dy, ldy, w, N, beta);
    if (!k_linear_takes(w->dtype) || w->cols <= 0 || w->rows <= 0 || ldy < out)
        return k_linear_bwd_dx_frozen(dx, dy, ldy, w, N, beta); /* which names the problem */
    long rows = (long)(FROZEN_TILE_BYTES / ((size_t)in * 2)) / 16 * 16;
    if (rows < 16) rows = 16;
    if (rows > out) rows = out;
    uint16_t *dyb = scratch(k, 0, (size_t)N * out);
    uint16_t *tb = scratch(k, 1, (size_t)rows * in);
    float *tf = k_scratch(1, (size_t)rows * in * sizeof(float));
    if (!dyb || !tb || !tf) return k_linear_bwd_dx_frozen(dx, dy, ldy, w, N, beta);
    round_rows(dyb, dy, (size_t)ldy, N, out);
    /* dx = dy[:, tile] W[tile] summed over the tiles, each widened to fp32 then rounded to bf16
     * (the bf16 products' operands), beta applied by the first. */
    for (int r0 = 0; r0 < out; r0 += (int)rows) {
        int n = out - r0 < rows ? out - r0 : (int)rows;
        const char *src = (const char *)w->data + (size_t)r0 * w->row_bytes;
        K_FOR(r, n, (long)n * in,
              k_widen_row(w->dtype, src + (size_t)r * w->row_bytes, tf + (size_t)r * in, in));
        k_f32_to_bf16(tb, tf, (size_t)n * in);
        int add = r0 > 0 || beta == 1.0f;
        if (!gemm(k, N, in, n, dyb + r0, 0, out, tb, 0, in, dx, in, add)) {
            k->fallbacks++;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, in, n, 1.0f, dy + r0, ldy, tf,
                        in, add ? 1.0f : 0.0f, dx, in);
        }
    }
    return TLM_OK;
}

tlm_status k_bf16_linear_bwd_dx_kept(k_bf16 *k, float *dx, const float *dy, int ldy,
                                     const tlm_weight *w, int N, float beta) {
    int in = (int)w->cols, out = (int)w->rows;
    if (!k->frozen || w->dtype == TLM_DTYPE_F32 || (beta != 0.0f && beta != 1.0f) || N == 0 ||
        out == 0 || !k_linear_takes(w->dtype) || in <= 0 || ldy < out)
        return k_bf16_linear_bwd_dx_frozen(k, dx, dy, ldy, w, N, beta);
    /* The widened copy is found by the weight's bytes, made once while the weights stay frozen. */
    size_t n = (size_t)out * in;
    const float *key = (const float *)w->data;
    wcopy *e = find_w(k, key, n);
    if (!e) {
        uint16_t *bf = core_big_alloc(bf_bytes(n));
        if (!bf || !grow_w(k)) {
            core_big_free(bf, bf_bytes(n));
            return k_bf16_linear_bwd_dx_frozen(k, dx, dy, ldy, w, N, beta);
        }
        e = &k->w[k->n_w++];
        *e = (wcopy){key, n, bf, k->wgen - 1};
    }
    if (e->pass != k->wgen) {
        float *tf = k_scratch(1, (size_t)in * sizeof(float) * 16);
        if (!tf) return k_bf16_linear_bwd_dx_frozen(k, dx, dy, ldy, w, N, beta);
        for (int r0 = 0; r0 < out; r0 += 16) {
            int m = out - r0 < 16 ? out - r0 : 16;
            for (int r = 0; r < m; r++)
                k_widen_row(w->dtype, (const char *)w->data + (size_t)(r0 + r) * w->row_bytes,
                            tf + (size_t)r * in, in);
            k_f32_to_bf16(e->bf + (size_t)r0 * in, tf, (size_t)m * in);
        }
        e->pass = k->wgen;
    }
    uint16_t *dyb = scratch(k, 0, (size_t)N * out);
    if (!dyb) return k_bf16_linear_bwd_dx_frozen(k, dx, dy, ldy, w, N, beta);
    round_rows(dyb, dy, (size_t)ldy, N, out);
    if (!gemm(k, N, in, out, dyb, 0, out, e->bf, 0, in, dx, in, beta == 1.0f))
        return k_bf16_linear_bwd_dx_frozen(k, dx, dy, ldy, w, N, beta);
    return TLM_OK;
}

int k_bf16_matmul(k_bf16 *k, int M, int N, int K, const float *A, int ta, int lda, const float *B,
                  int tb, int ldb, float *C, int ldc, int add) {
    /* Each operand rounded into a contiguous copy: A as [M, K] (or [K, M] when ta), B as [K, N]
     * (or [N, K] when tb). */
    int ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    uint16_t *a = scratch(k, 0, (size_t)ar * ac), *b = scratch(k, 1, (size_t)br * bc);
    if (!a || !b) return 0;
    round_rows(a, A, (size_t)lda, ar, ac);
    round_rows(b, B, (size_t)ldb, br, bc);
    return gemm(k, M, N, K, a, ta, ac, b, tb, bc, C, ldc, add);
}
