/* Math over raw float arrays with explicit sizes. Each kernel's forward and backward live side by
 * side in one file. Rows are parallelized with OpenMP; matrix products go to OpenBLAS sgemm. */
#ifndef TLM_KERNELS_H
#define TLM_KERNELS_H

#include <omp.h>
#include <stddef.h>
#include <stdint.h>

#include "cpu.h"
#include "tlm.h"

/* Elementwise work below this many floats runs on the calling thread: a fork/join costs
 * microseconds (far more with passive waits), more than the work itself in decode steps. */
#define K_PAR_MIN 16384

/* Whether a loop of `work` floats should start a team: not below K_PAR_MIN, and not inside a
 * parallel region (a data-parallel replica's thread), where the region would run on this thread
 * alone and still cost libgomp a futex wake at its end (about 3.5 us here, even as `if (0)`):
 * some 200 such regions per replica and step were 7% of the Shakespeare recipe. */
int k_team_pooled(void);
/* Nor in a pass on team.c's pool (k_team_pool: decode steps), where a region would run beside
 * the pool's spinning threads; a decode step's elementwise loops are short even at 16 rows. */
static inline int k_fork(long work) {
    return work >= K_PAR_MIN && !omp_in_parallel() && !k_team_pooled();
}

/* for (long i = 0; i < n; i++) { body } across a new team (static schedule) when k_fork(work),
 * else on this thread. The body must not depend on how [0, n) is split. */
#define K_FOR(i, n, work, ...)                                                                     \
    do {                                                                                           \
        long n_ = (long)(n);                                                                       \
        if (k_fork((long)(work))) {                                                                \
            _Pragma("omp parallel for schedule(static)") for (long i = 0; i < n_; i++) {           \
                __VA_ARGS__;                                                                       \
            }                                                                                      \
        } else {                                                                                   \
            for (long i = 0; i < n_; i++) {                                                        \
                __VA_ARGS__;                                                                       \
            }                                                                                      \
        }                                                                                          \
    } while (0)

/* [*a, *b): the calling thread's share of [0, n) in its team, as schedule(static) divides it. */
static inline void k_share(long n, long *a, long *b) {
    long t = omp_get_thread_num(), T = omp_get_num_threads(), q = n / T, r = n % T;
    *a = t * q + (t < r ? t : r);
    *b = *a + q + (t < r);
}

/* K_FOR for a body that takes a range: { body } once per thread of a new team with [a, b) its
 * share of [0, n) (static schedule) when k_fork(work), else once with [0, n) on this thread;
 * never with an empty range. */
#define K_RANGES(a, b, n, work, ...)                                                               \
    do {                                                                                           \
        long n_ = (long)(n);                                                                       \
        if (k_fork((long)(work))) {                                                                \
            _Pragma("omp parallel") {                                                              \
                long a, b;                                                                         \
                k_share(n_, &a, &b);                                                               \
                if (a < b) {                                                                       \
                    __VA_ARGS__;                                                                   \
                }                                                                                  \
            }                                                                                      \
        } else if (n_ > 0) {                                                                       \
            long a = 0, b = n_;                                                                    \
            __VA_ARGS__;                                                                           \
        }                                                                                          \
    } while (0)

/* ---- loops compiled for several instruction sets ----
 * A build for any x86-64 (cmake -DTLM_NATIVE=OFF, no -march) would run the loops the compiler
 * vectorizes (norms, activations, softmaxes, the optimizer...) on SSE2 alone, at a fraction of
 * what the CPU runs. So each such loop is written once, as a K_INLINE function, and
 * K_VERSIONS(name, (parameters), (arguments)) compiles it for AVX-512 and for AVX2 with FMA (the
 * target attributes of x86/simd.h, as the quantized kernels) beside the build's own baseline:
 * name_pick() returns the version for this CPU (k_vec_isa), as a name_fn pointer, and callers
 * pick once per call of a kernel, then call it from each thread. No team is started inside a
 * version: clang compiles OpenMP's outlined bodies without their function's target attribute. A
 * build whose baseline has AVX-512 (-march=native on such a CPU) compiles the one version. */
#define K_INLINE static inline __attribute__((always_inline))

/* The K_ISA_ level of the versions picked: the quantized kernels' (k_isa in qdot.h: the CPU's,
 * under a benchmark build's TLM_ISA), capped by k_vec_cap. */
int k_isa(void);
extern _Atomic int k_vec_limit;
static inline int k_vec_isa(void) {
    int isa = k_isa(), cap = k_vec_limit;
    return isa < cap ? isa : cap;
}
/* Runs the versioned loops as a CPU of K_ISA_ level isa would (tests); K_ISA_COUNT: no cap. */
void k_vec_cap(int isa);

#if (defined(__x86_64__) || defined(__i386__)) && !defined(__AVX512F__)
#include "kernels/x86/simd.h"
#define K_VERSIONS(name, params, args)                                                             \
    typedef void name##_fn params;                                                                 \
    K_TARGET_AVX512 static void name##_avx512 params { name args; }                                \
    K_TARGET_AVX2 static void name##_avx2 params { name args; }                                    \
    static void name##_base params { name args; }                                                  \
    static name##_fn *name##_pick(void) {                                                          \
        int isa = k_vec_isa();                                                                     \
        return isa >= K_ISA_AVX512 ? name##_avx512                                                 \
               : isa >= K_ISA_AVX2 ? name##_avx2                                                   \
                                   : name##_base;                                                  \
    }
#else
#define K_VERSIONS(name, params, args)                                                             \
    typedef void name##_fn params;                                                                 \
    static void name##_base params { name args; }                                                  \
    static name##_fn *name##_pick(void) { return name##_base; }
#endif

/* ---- dropout.c: masks derived from (key, element index), regenerated in the backward pass ---- */
uint64_t k_dropout_key(uint64_t seed, uint64_t step, uint64_t site);
/* 1/(1-p) if element i is kept, else 0. */
float k_dropout_keep(uint64_t key, uint64_t i, float p);
/* y = x * keep(i) elementwise (y may be x); the same call is its own backward. */
void k_dropout(float *y, const float *x, size_t n, float p, uint64_t key);

/* ---- linear.c: y = x W^T (+ b) for a weight W [out, in] ---- */
/* 1 if k_linear computes on weights of this type (the loaders widen the others). */
int k_linear_takes(tlm_dtype t);
#define K_LINEAR_MAX_PARTS 8
/* y[N, out] (row stride ldy >= out) = x[N, in] W^T + b (b may be NULL). A few rows stream W once
 * (matrix-vector products, decode); more go through sgemm. */
void k_linear(float *y, int ldy, const float *x, int N, const tlm_weight *w, const float *b);
/* Products of the same x with n <= K_LINEAR_MAX_PARTS weights (same `in`) into consecutive column
 * blocks of y: q|k|v or gate|up. fused, when not NULL, is the n weights as one stacked view (then
 * one product does it when the biases are stacked too); otherwise decode still covers every part in
 * one parallel region. */
void k_linear_parts(float *y, int ldy, const float *x, int N, const tlm_weight *const *w,
                    const float *const *b, int n, const tlm_weight *fused);
/* The F32 sgemm behind k_linear: y[N, ldy] = x[N, in] w[out, in]^T (+ b). */
void k_linear_fwd(float *y, int ldy, const float *x, const float *w, const float *b, int N, int in,
                  int out);
/* dx = dy W (dx may be NULL); dW = dy^T x and db = column sums of dy (db may be NULL), added to
 * what dW and db hold when acc, else written over it: the first gradient a step writes needs no
 * zeroed buffer. */
void k_linear_bwd(float *dx, float *dw, float *db, const float *dy, const float *x, const float *w,
                  int N, int in, int out, int acc);
/* dx[N, in] = dy[N, out] (row stride ldy) w[out, in] + beta * dx: one part's share of the input
 * gradient when stacked weights lie apart. */
void k_linear_bwd_dx(float *dx, const float *dy, int ldy, const float *w, int N, int in, int out,
                     float beta);

/* ---- linear_frozen.c: the input gradient through a frozen weight (LoRA and QLoRA bases) ---- */
/* dx[N, in] = dy[N, out] (row stride ldy >= out) W[out, in] + beta * dx, for W of any type
 * k_linear_takes, in its own type: F32 rows go to sgemm as they are, other types are widened a
 * tile of rows at a time (the calling thread's scratch) and each tile's product added by sgemm.
 * No weight gradient. TLM_ERR_ARG for a type or shape it cannot take, TLM_ERR_NOMEM without memory
 * for one widened row; dx is untouched then. */
tlm_status k_linear_bwd_dx_frozen(float *dx, const float *dy, int ldy, const tlm_weight *w, int N,
                                  float beta);
/* The same with tile rows per widened tile (0: the default, 4 MiB of floats; out or more: the whole
 * matrix at once), for tests and benchmarks. */
tlm_status k_linear_bwd_dx_frozen_tiles(float *dx, const float *dy, int ldy, const tlm_weight *w,
                                        int N, float beta, int tile);
/* db[j] (+)= sum_i dy[i, j] over N rows of width n; deterministic, cache-line blocked. */
void k_colsum(float *db, const float *dy, int N, int n, int acc);

/* ---- bf16.c: linear layers with bf16 operands and fp32 accumulation (mixed precision) ---- */
/* 1 if the CPU runs bf16 dot products (avx512_bf16) and the OS saves AVX-512 state. */
int k_bf16_supported(void);
/* dst[i] = src[i] rounded to bf16 (nearest even; NaN stays NaN; denormals flush to zero, as the
 * AVX-512 BF16 conversion does). */
void k_f32_to_bf16(uint16_t *dst, const float *src, size_t n);
float k_bf16_to_f32(uint16_t h);
/* Per-caller state of the bf16 products: oneDNN primitives by shape, rounded weights, scratch.
 * NULL from k_bf16_new when out of memory or oneDNN has no CPU engine. */
typedef struct k_bf16 k_bf16;
k_bf16 *k_bf16_new(void);
void k_bf16_free(k_bf16 *k);
/* Weights may have changed since the last pass: their rounded copies are made again at first use.
 * A forward product's rounded input is kept for the backward of the same pass, which must then see
 * it unchanged (as the fp32 backward needs anyway); a new pass drops it. */
void k_bf16_next_pass(k_bf16 *k);
/* Frozen weights (LoRA training): their rounded copies serve every later pass, and forward
 * products keep no rounded input for a dW that no backward computes. Unfreezing makes the copies
 * again at their next use. */
void k_bf16_set_frozen(k_bf16 *k, int frozen);
/* Products oneDNN refused and sgemm did in fp32 instead (0 on a CPU k_bf16_supported accepts). */
long k_bf16_fallbacks(const k_bf16 *k);
/* k_linear_fwd, k_linear_bwd and k_linear_bwd_dx with both operands of every product rounded to
 * bf16; accumulation, outputs, biases and their gradients stay fp32. */
void k_bf16_linear_fwd(k_bf16 *k, float *y, int ldy, const float *x, const float *w, const float *b,
                       int N, int in, int out);
void k_bf16_linear_bwd(k_bf16 *k, float *dx, float *dw, float *db, const float *dy, const float *x,
                       const float *w, int N, int in, int out, int acc);
void k_bf16_linear_bwd_dx(k_bf16 *k, float *dx, const float *dy, int ldy, const float *w, int N,
                          int in, int out, float beta);
/* k_linear_bwd_dx_frozen with bf16 products: tiles of a frozen block-type, F16 or BF16 weight
 * widened and rounded to bf16 (4 MiB at a time) meet dy rounded to bf16, fp32 accumulation.
 * F32 weights and other betas than 0 and 1 take the fp32 path. */
tlm_status k_bf16_linear_bwd_dx_frozen(k_bf16 *k, float *dx, const float *dy, int ldy,
                                       const tlm_weight *w, int N, float beta);
/* The same through a copy of the whole weight widened to bf16 once and kept while the weights are
 * frozen (k_bf16_set_frozen; else as k_bf16_linear_bwd_dx_frozen): for a weight whose input
 * gradient a pass computes many times (the head, a slice of rows at a time), at 2 bytes a
 * parameter. */
tlm_status k_bf16_linear_bwd_dx_kept(k_bf16 *k, float *dx, const float *dy, int ldy,
                                     const tlm_weight *w, int N, float beta);
/* C [M, N] (row stride ldc) = op(A) op(B) (+ C when add) with both fp32 operands rounded to bf16
 * and fp32 accumulation: A is [M, K] (ta: stored [K, M]) and B [K, N] (tb: stored [N, K]), rows
 * lda and ldb apart. 0 when oneDNN could not (the caller computes it in fp32). */
int k_bf16_matmul(k_bf16 *k, int M, int N, int K, const float *A, int ta, int lda, const float *B,
                  int tb, int ldb, float *C, int ldc, int add);
/* Buffers of the bf16 state reused across calls: slots 0 and 1 hold the linear products' rounded
 * operands, K_BF16_ATT_SLOT the attention's per-thread operands. NULL when out of memory. */
enum { K_BF16_ATT_SLOT = 2, K_BF16_SLOTS = 3 };
void *k_bf16_scratch(k_bf16 *k, int slot, size_t bytes);

/* ---- norm.c ---- */
/* y = x / sqrt(mean(x^2) + eps) * g; saves rstd[N] (may be NULL). */
void k_rmsnorm_fwd(float *y, float *rstd, const float *x, const float *g, int N, int d, float eps);
/* y = (x - mean) / sqrt(var + eps) * g + b (b may be NULL); saves mean, rstd [N] (may be NULL). */
void k_layernorm_fwd(float *y, float *mean, float *rstd, const float *x, const float *g,
                     const float *b, int N, int d, float eps);

/* dx = d/dx of the norm given dy (overwrites dx); dg (and db) accumulate when acc, else are
 * overwritten. x is the norm's input. */
void k_rmsnorm_bwd(float *dx, float *dg, const float *dy, const float *x, const float *g,
                   const float *rstd, int N, int d, int acc);
void k_layernorm_bwd(float *dx, float *dg, float *db, const float *dy, const float *x,
                     const float *g, const float *mean, const float *rstd, int N, int d, int acc);

/* ---- act.c ---- */
typedef enum { K_ACT_GELU, K_ACT_GELU_TANH, K_ACT_RELU, K_ACT_SILU } k_act;
/* y = act(x) elementwise over n. */
void k_act_fwd(float *y, const float *x, size_t n, k_act act);
/* Rows of a fused gate|up buffer a [N, 2*ff]: y[i, j] = silu(a[i, j]) * a[i, ff + j]. */
void k_swiglu_rows_fwd(float *y, const float *a, int N, int ff);
/* da [N, 2*ff] (gate|up halves) from dy [N, ff]. */
void k_swiglu_rows_bwd(float *da, const float *dy, const float *a, int N, int ff);
/* The same with gelu_tanh(gate) in place of silu(gate) (GEGLU). */
void k_geglu_rows_fwd(float *y, const float *a, int N, int ff);
void k_geglu_rows_bwd(float *da, const float *dy, const float *a, int N, int ff);
/* Soft cap (Gemma 2's logits): y = cap tanh(y / cap) in place, cap > 0. */
void k_softcap_fwd(float *y, size_t n, float cap);
/* dy *= the cap's derivative 1 - tanh^2, from the capped values y. */
void k_softcap_bwd(float *dy, const float *y, size_t n, float cap);
/* Training's forward: y = act(x), and x is overwritten with act'(x) for the backward pass. */
void k_act_fwd_grad(float *y, float *x, size_t n, k_act act);

/* ---- rope.c ---- */
/* Rotates x in place: N rows of stride ld (q or k may be a column block of a fused q|k|v buffer),
 * row r at position pos[r], n_heads heads of hd. cos/sin are tables [positions, hd/2].
 * interleaved pairs (2i, 2i+1), else (i, i + hd/2). */
void k_rope_fwd(float *x, int ld, int N, const int *pos, int n_heads, int hd, const float *cos_t,
                const float *sin_t, int interleaved);
/* Gradient through the rotation: rotates dx in place by the negative angle. */
void k_rope_bwd(float *dx, int ld, int N, const int *pos, int n_heads, int hd, const float *cos_t,
                const float *sin_t, int interleaved);

/* ---- attention.c ---- */
/* Causal attention. q rows have stride ldq, k and v rows stride ldkv (they may be column blocks of
 * one fused q|k|v buffer); out [B*T, H*hd]; probs [B, H, T, T] keeps the softmax (before dropout)
 * for the backward pass, transposed: keys by queries. Scores are scale q.k, soft-capped to
 * cap tanh(s / cap) when cap > 0 (Gemma 2). With p > 0 the probabilities are dropped out (element
 * index (b*H + h)*T*T + t*T + j under key). scratch: k_attention_scratch_floats. lo [B*T] (NULL:
 * every 0) is each query's first visible key within its sequence (packed examples: the example's
 * first row). */
void k_attention_fwd(float *out, float *probs, const float *q, const float *k, const float *v,
                     int ldq, int ldkv, int B, int T, int H, int KVH, int hd, float scale,
                     float cap, const int *lo, float p, uint64_t key, float *scratch);
/* dq, dk, dv (same strides as q, k, v) are overwritten. scale, cap: the forward's (a cap's
 * derivative needs the scores, which are computed again a head at a time into scratch). lo: the
 * forward's (the probabilities carry its mask; the products use it only to leave out the keys no
 * query of a block sees). */
void k_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q,
                     const float *k, const float *v, int ldq, int ldkv, const float *probs, int B,
                     int T, int H, int KVH, int hd, float scale, float cap, const int *lo, float p,
                     uint64_t key, float *scratch);

/* Floats of scratch k_attention_fwd and k_attention_bwd need for sequences of T with dropout p and
 * soft cap cap when `threads` threads may run them (omp_get_max_threads() at the time of the
 * call): T * T a thread, once more with dropout, once more with a cap. */
size_t k_attention_scratch_floats(int T, float p, float cap, int threads);
/* The same attention of a fused q|k|v buffer (rows ld apart) with its matrix products on bf16
 * operands and fp32 accumulation, softmaxes in fp32 (attention_bf16.c). Returns 0 where it does
 * not apply (no k, no avx512_bf16, dropout, H not a multiple of KVH, a head size not a multiple of
 * 16) or its buffers could not be had: the caller runs the fp32 kernels, which overwrite
 * everything these write. dqkv (rows ld apart: q | k | v of H, KVH and KVH heads) is overwritten;
 * a key/value head's dK and dV sum its query heads' in their order. The backward's probs may be
 * NULL: each head's are then computed again as the forward did, in the thread's buffers (no [B, H,
 * T, T] kept), with lo's mask. scale, cap, lo: as k_attention_fwd's (with a cap the backward
 * computes each head's scores again for the cap's derivative). */
int k_bf16_attention_fwd(k_bf16 *k, float *out, float *probs, const float *qkv, int ld, int B,
                         int T, int H, int KVH, int hd, float scale, float cap, const int *lo,
                         float p);
int k_bf16_attention_bwd(k_bf16 *k, float *dqkv, const float *dout, const float *qkv, int ld,
                         const float *probs, int B, int T, int H, int KVH, int hd, float scale,
                         float cap, const int *lo, float p);

/* ---- loss.c ---- */
/* Mean cross-entropy over rows whose target >= 0 (NAN if none); writes softmax probabilities to
 * probs when not NULL. Returns the number of counted rows in *count. */
double k_cross_entropy_fwd(const float *logits, const int *targets, float *probs, int N, int V,
                           int *count);
/* Training: returns the mean loss over counted rows and replaces logits in place with
 * d(loss)/d(logits) = (softmax - onehot) / divisor (zero rows for ignored targets). divisor <= 0
 * means the rows' own count; a slice of a batch passes the whole batch's count, so the slices'
 * gradients simply add up (a micro-step or a process, its share of a whole step's count). */
double k_cross_entropy_fwd_bwd(float *logits, const int *targets, int N, int V, double divisor,
                               int *count);
/* Each row's cross-entropy into row_loss [N] (0 where the target is ignored). */
void k_cross_entropy_rows(const float *logits, const int *targets, float *row_loss, int N, int V);
/* The gradient of sum_i w[i] * loss_i: each row replaced by w[i] (softmax - onehot) (zeros where
 * the target is ignored); returns that sum. */
double k_cross_entropy_bwd_weighted(float *logits, const int *targets, const float *w, int N,
                                    int V);

/* ---- the team's share of a loop (team.c) ---- */
/* fn(ctx, a, b) over units [a, b) covering [0, units) once, across a team of
 * omp_get_max_threads() when par (else on the calling thread): equal shares to start, then
 * stealing (team.c says why). The team is an OpenMP region, or team.c's own pool of threads where
 * the calling thread asked for it (k_team_pool). chunk: units per claim, or 0 for a sixteenth of
 * a share. Results must not depend on which thread runs a unit. */
typedef void (*k_units_fn)(void *ctx, long a, long b);
void k_team_units(long units, int par, long chunk, k_units_fn fn, void *ctx);
/* The calling thread's place in the team running the current k_team_units job (0 for the
 * thread that called it), or omp_get_thread_num() outside one: an index for per-thread scratch. */
int k_team_thread(void);
/* Whether this thread's k_team_units calls go to the pool (on) or to OpenMP regions (off, the
 * default); returns the setting before. For passes made only of short products and no OpenMP
 * region (decode steps): the pool's fork and join cost a fifth of a region's, but its threads
 * spin for the next job as libgomp's do, and two teams spinning on the same cores starve each
 * other (a prompt's pass with both: 0.43x). */
int k_team_pool(int on);

/* ---- decode attention (attend_row.c) ---- */
/* The element types of a KV cache's rows, as the attention kernels take them: floats, IEEE
 * halves, bfloat16s, or GGUF's blocks of 32 elements (llama.cpp's other cache types; hd a multiple
 * of 32, so that each cached row is whole blocks). k_kv_kind: a type's kind, -1 for the others. */
enum {
    K_KV_F32 = 0,
    K_KV_F16,
    K_KV_Q8_0,
    K_KV_BF16,
    K_KV_Q4_0,
    K_KV_Q4_1,
    K_KV_Q5_0,
    K_KV_Q5_1,
    K_KV_IQ4_NL
};
int k_kv_kind(tlm_dtype t);

/* One query q[hd] over S cached keys K[S, hd] and values V[S, hd] (rows of kinds kk and kv, each a
 * K_KV_): o[hd] = softmax(scale q.K) V, with p[0..S) as scratch. Returns -1, computing nothing,
 * where no vector version applies (the CPU, hd, a block kind's hd); the caller then runs its plain
 * loops. */
int k_attend_row(const float *q, const void *K, const void *V, int kk, int kv, int S, int hd,
                 float scale, float *p, float *o);

/* Prefill's causal attention of one head: T consecutive queries q[T][ldq], query t at position
 * first + t, over the cached keys and values of positions 0..first+T-1 (K, V as in k_attend_row;
 * query t sees keys 0..first+t). o[t][ldo] = softmax(scale q_t.K) V. Scratch: kt holds
 * hd x K_CAUSAL_SPAN(first + T) floats, p 8 x K_CAUSAL_SPAN(first + T). Returns -1, computing
 * nothing, where no vector version applies (the CPU, hd). */
#define K_CAUSAL_SPAN(S) (((size_t)(S) + 63) & ~(size_t)63)
int k_attend_causal(const float *q, size_t ldq, const void *K, const void *V, int kk, int kv, int T,
                    int first, int hd, float scale, float *kt, float *p, float *o, size_t ldo);

/* ---- misc ---- */
void k_add(float *y, const float *a, const float *b, size_t n); /* y = a + b */
void k_acc(float *y, const float *a, size_t n);                 /* y += a */
void k_mul(float *y, const float *a, const float *b, size_t n); /* y = a * b */

#endif
