/* llama.cpp's GGUF LoRA adapter (src/llama-adapter.cpp reads it): general.type = "adapter",
 * adapter.type = "lora", adapter.lora.alpha, and per base tensor W (ggml ne = {in, out}) the pair
 * W.lora_a with ne = {in, rank} and W.lora_b with ne = {rank, out}. In row-major terms these are
 * PEFT's A [rank, in] and B [out, rank] unchanged; llama.cpp checks a.ne[0] == W.ne[0],
 * b.ne[1] == W.ne[1] and a.ne[1] == b.ne[0]. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/half.h"
#include "formats/lora.h"
#include "io/gguf.h"
#include "io/gguf_writer.h"

enum { GGML_F32 = 0, GGML_F16 = 1, GGML_Q8_0 = 8, GGML_BF16 = 30 };

static int is_qk(const char *name) {
    const char *p = strstr(name, ".attn_");
    return p && (!strcmp(p, ".attn_q.weight") || !strcmp(p, ".attn_k.weight"));
}

/* Converts tensor t (n elements) into dst. */
static tlm_status to_f32(const char *path, const io_gguf_tensor *t, float *dst, size_t n) {
    const uint8_t *p = t->data;
    if (!p || t->n_elements != n)
        return core_err(TLM_ERR_FORMAT, "%s: %s has no readable data", path, t->name);
    switch (t->type) {
    case GGML_F32: memcpy(dst, p, n * sizeof(float)); return TLM_OK;
    case GGML_F16:
    case GGML_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h = (uint16_t)(p[2 * i] | p[2 * i + 1] << 8);
            dst[i] = t->type == GGML_F16 ? core_f16_to_f32(h) : core_bf16_to_f32(h);
        }
        return TLM_OK;
    case GGML_Q8_0:
        /* blocks of 32: an f16 scale, then 32 int8 */
        if (n % 32) break;
        for (size_t b = 0; b < n / 32; b++) {
            const uint8_t *q = p + b * 34;
            float d = core_f16_to_f32((uint16_t)(q[0] | q[1] << 8));
            for (int j = 0; j < 32; j++) dst[b * 32 + (size_t)j] = d * (float)(int8_t)q[2 + j];
        }
        return TLM_OK;
    default: break;
    }
    const char *tn = NULL;
    io_ggml_type_info(t->type, &tn, NULL, NULL);
    return core_err(TLM_ERR_UNSUPPORTED, "%s: %s has type %s (LoRA tensors: F32, F16, BF16, Q8_0)",
                    path, t->name, tn ? tn : "unknown");
}

/* The string value of key, or an error naming it. */
static tlm_status want_str(const io_gguf *g, const char *path, const char *key, const char *want,
                           char *out, size_t cap) {
    const char *s;
    size_t len;
    tlm_status st = io_gguf_get_str(g, key, &s, &len);
    if (st) return core_err_context(st, "%s: not a LoRA adapter", path);
    if (want && (len != strlen(want) || memcmp(s, want, len)))
        return core_err(TLM_ERR_FORMAT, "%s: %s is '%.*s', a LoRA adapter has '%s'", path, key,
                        (int)(len > 40 ? 40 : len), s, want);
    if (out) {
        if (len >= cap || memchr(s, 0, len))
            return core_err(TLM_ERR_FORMAT, "%s: %s is not a valid name", path, key);
        memcpy(out, s, len);
        out[len] = 0;
    }
    return TLM_OK;
}

/* The base name of a .lora_a / .lora_b tensor into base; 'a', 'b' or 0 when it is neither. */
static int split_name(const char *name, char *base, size_t cap) {
    size_t l = strlen(name);
    if (l < 8 || l - 7 >= cap) return 0;
    if (strcmp(name + l - 7, ".lora_a") && strcmp(name + l - 7, ".lora_b")) return 0;
    memcpy(base, name, l - 7);
    base[l - 7] = 0;
    return name[l - 1];
}

static tlm_status read_gguf(const io_gguf *g, const char *path, fmt_lora *out) {
    tlm_status s = want_str(g, path, "general.type", "adapter", NULL, 0);
    if (!s) s = want_str(g, path, "adapter.type", "lora", NULL, 0);
    if (!s) s = want_str(g, path, "general.architecture", NULL, out->arch, sizeof out->arch);
    if (s) return s;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const io_gguf_tensor *t = &g->tensors[i];
        char base[FMT_LORA_NAME_MAX], other[FMT_LORA_NAME_MAX + 8];
        int ab = split_name(t->name, base, sizeof base);
        if (!ab)
            return core_err(TLM_ERR_FORMAT,
                            "%s: tensor '%.80s' is neither a .lora_a nor a .lora_b tensor", path,
                            t->name);
        if (!fmt_lora_known_target(base))
            return core_err(TLM_ERR_FORMAT, "%s: unknown LoRA target '%s'", path, base);
        snprintf(other, sizeof other, "%s.lora_%c", base, ab == 'a' ? 'b' : 'a');
        const io_gguf_tensor *o = io_gguf_find_tensor(g, other);
        if (!o) return core_err(TLM_ERR_FORMAT, "%s: %s has no matching %s", path, t->name, other);
        if (ab == 'b') continue; /* read with its lora_a */
        for (int d = 2; d < IO_GGUF_MAX_DIMS; d++)
            if (t->dims[d] != 1 || o->dims[d] != 1)
                return core_err(TLM_ERR_FORMAT, "%s: %s or %s has more than two dimensions", path,
                                t->name, other);
        /* a: ne {in, rank}; b: ne {rank, out} */
        uint64_t in = t->dims[0], rank = t->dims[1], rank_b = o->dims[0], outr = o->dims[1];
        if (rank != rank_b)
            return core_err(TLM_ERR_FORMAT,
                            "%s: %s has rank %llu but %s has rank %llu (lora_a ne = {in, rank}, "
                            "lora_b ne = {rank, out})",
                            path, t->name, (unsigned long long)rank, other,
                            (unsigned long long)rank_b);
        /* a type whose size io_gguf does not know was not checked against the file: refused
         * before anything is allocated for it */
        if (!t->data || !o->data)
            return core_err(TLM_ERR_UNSUPPORTED, "%s: %s or %s has a tensor type tlm cannot read",
                            path, t->name, other);
        if (rank == 0 || rank > 65536 || in == 0 || outr == 0 || in > (1ull << 31) ||
            outr > (1ull << 31))
            return core_err(TLM_ERR_FORMAT, "%s: %s has shape {%llu, %llu}", path, t->name,
                            (unsigned long long)in, (unsigned long long)rank);
        if (!out->rank)
            out->rank = (int)rank;
        else if ((uint64_t)out->rank != rank)
            return core_err(TLM_ERR_UNSUPPORTED,
                            "%s: %s has rank %llu but earlier tensors rank %d (one rank per "
                            "adapter)",
                            path, t->name, (unsigned long long)rank, out->rank);
        s = fmt_lora_add(out, base, (int64_t)in, (int64_t)outr, NULL, NULL);
        fmt_lora_mat *e = &out->m[out->n - 1];
        if (!s) s = to_f32(path, t, e->a, (size_t)(rank * in));
        if (!s) s = to_f32(path, o, e->b, (size_t)(outr * rank));
        if (s) return core_err_context(s, "%s", path);
    }
    if (!out->n) return core_err(TLM_ERR_FORMAT, "%s: the adapter has no LoRA tensors", path);
    /* llama.cpp: without alpha the scale is 1 (alpha = rank) */
    double alpha = (double)out->rank;
    if (io_gguf_find(g, "adapter.lora.alpha")) {
        s = io_gguf_get_float(g, "adapter.lora.alpha", &alpha);
        if (s) return core_err_context(s, "%s", path);
        if (alpha == 0) alpha = (double)out->rank;
    }
    out->alpha = (float)alpha;
    out->qk_interleaved = !strcmp(out->arch, "llama");
    return fmt_lora_validate(out, path);
}

tlm_status fmt_lora_read_gguf(const char *path, fmt_lora *out) {
    memset(out, 0, sizeof *out);
    io_gguf *g = NULL;
    tlm_status s = io_gguf_open(path, &g);
    if (s) return s;
    s = read_gguf(g, path, out);
    io_gguf_close(g);
    if (s) fmt_lora_free(out);
    return s;
}

tlm_status fmt_lora_write_gguf(const char *path, const fmt_lora *a, int head_dim) {
    tlm_status s = fmt_lora_validate(a, path);
    if (s) return s;
    if (!a->arch[0]) return core_err(TLM_ERR_ARG, "%s: the adapter names no architecture", path);
    /* a Llama GGUF's q/k rows are interleaved; every other architecture keeps HF's order */
    int want = !strcmp(a->arch, "llama");
    float **bs = calloc((size_t)a->n, sizeof *bs);
    if (!bs) return core_err(TLM_ERR_NOMEM, "out of memory");
    fmt_lora tmp = *a; /* borrows a's matrices; only q/k B rows are replaced by copies */
    fmt_lora_mat *ms = malloc(sizeof *ms * (size_t)a->n);
    if (!ms) s = core_err(TLM_ERR_NOMEM, "out of memory");
    for (int i = 0; i < a->n && !s; i++) {
        ms[i] = a->m[i];
        if (want == a->qk_interleaved || !is_qk(a->m[i].name)) continue;
        size_t nb = (size_t)a->m[i].out * (size_t)a->rank;
        bs[i] = malloc(nb * sizeof(float));
        if (!bs[i]) {
            s = core_err(TLM_ERR_NOMEM, "out of memory");
            break;
        }
        memcpy(bs[i], a->m[i].b, nb * sizeof(float));
        ms[i].b = bs[i];
    }
    if (!s) {
        tmp.m = ms;
        s = fmt_lora_set_qk_order(&tmp, want, head_dim);
    }
    io_gguf_writer w;
    io_gguf_writer_init(&w, IO_GGUF_DEFAULT_ALIGNMENT);
    /* llama.cpp has no rsLoRA: alpha' / rank = alpha / sqrt(rank) */
    float alpha = a->use_rslora ? a->alpha * sqrtf((float)a->rank) : a->alpha;
    io_gguf_write_str(&w, "general.architecture", a->arch);
    io_gguf_write_str(&w, "general.type", "adapter");
    io_gguf_write_str(&w, "adapter.type", "lora");
    io_gguf_write_f32(&w, "adapter.lora.alpha", alpha);
    for (int i = 0; i < a->n; i++) {
        const fmt_lora_mat *e = &a->m[i];
        char nm[FMT_LORA_NAME_MAX + 8];
        uint64_t da[2] = {(uint64_t)e->in, (uint64_t)a->rank};
        uint64_t db[2] = {(uint64_t)a->rank, (uint64_t)e->out};
        snprintf(nm, sizeof nm, "%s.lora_a", e->name);
        io_gguf_write_tensor(&w, nm, 2, da, GGML_F32, sizeof(float) * da[0] * da[1]);
        snprintf(nm, sizeof nm, "%s.lora_b", e->name);
        io_gguf_write_tensor(&w, nm, 2, db, GGML_F32, sizeof(float) * db[0] * db[1]);
    }
    uint8_t *head = NULL;
    size_t head_len = 0;
    if (!s) s = io_gguf_writer_header(&w, &head, &head_len);
    core_atomic_file f;
    if (!s) s = core_atomic_open(&f, path);
    if (!s) {
        static const uint8_t zeros[IO_GGUF_DEFAULT_ALIGNMENT];
        s = core_atomic_write(&f, head, head_len);
        for (int i = 0; i < a->n && !s; i++) {
            const float *pa = ms[i].a, *pb = ms[i].b;
            size_t na = sizeof(float) * (size_t)a->rank * (size_t)ms[i].in;
            size_t nb = sizeof(float) * (size_t)a->rank * (size_t)ms[i].out;
            s = core_atomic_write(&f, pa, na);
            size_t pad = io_gguf_writer_pad(&w, na);
            if (!s && pad) s = core_atomic_write(&f, zeros, pad);
            if (!s) s = core_atomic_write(&f, pb, nb);
            pad = io_gguf_writer_pad(&w, nb);
            if (!s && pad) s = core_atomic_write(&f, zeros, pad);
        }
        if (s)
            core_atomic_abort(&f);
        else
            s = core_atomic_commit(&f);
    }
    free(head);
    io_gguf_writer_free(&w);
    for (int i = 0; i < a->n; i++) free(bs[i]);
    free(bs);
    free(ms);
    return s ? core_err_context(s, "writing %s", path) : TLM_OK;
}
