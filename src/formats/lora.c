/* LoRA adapters in memory: building, checking, and moving q/k rows between RoPE orders. */
#include "formats/lora.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/formats.h"

void fmt_lora_free(fmt_lora *a) {
    if (!a) return;
    for (int i = 0; i < a->n; i++) {
        free(a->m[i].a);
        free(a->m[i].b);
    }
    free(a->m);
    memset(a, 0, sizeof *a);
}

int fmt_lora_known_target(const char *name) {
    if (!strcmp(name, "output.weight")) return 1;
    if (strncmp(name, "blk.", 4)) return 0;
    const char *p = name + 4;
    if (*p < '0' || *p > '9' || (*p == '0' && p[1] != '.')) return 0;
    int digits = 0;
    while (*p >= '0' && *p <= '9') p++, digits++;
    if (digits > 6 || *p != '.') return 0;
    p++;
    static const char *const kinds[] = {"attn_q",   "attn_k", "attn_v",  "attn_output",
                                        "ffn_gate", "ffn_up", "ffn_down"};
    for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++) {
        size_t l = strlen(kinds[i]);
        if (!strncmp(p, kinds[i], l) && !strcmp(p + l, ".weight")) return 1;
    }
    return 0;
}

const fmt_lora_mat *fmt_lora_find(const fmt_lora *a, const char *name) {
    for (int i = 0; i < a->n; i++)
        if (!strcmp(a->m[i].name, name)) return &a->m[i];
    return NULL;
}

tlm_status fmt_lora_add(fmt_lora *a, const char *name, int64_t in, int64_t out, const float *A,
                        const float *B) {
    if (!fmt_lora_known_target(name))
        return core_err(TLM_ERR_FORMAT, "LoRA target '%.80s' is not a tensor adapters may adapt",
                        name);
    if (fmt_lora_find(a, name))
        return core_err(TLM_ERR_FORMAT, "LoRA target '%s' appears twice", name);
    if (a->rank <= 0 || in <= 0 || out <= 0 || in > (int64_t)1 << 31 || out > (int64_t)1 << 31)
        return core_err(TLM_ERR_ARG, "%s: LoRA shape [%lld, %lld] with rank %d is not valid", name,
                        (long long)out, (long long)in, a->rank);
    size_t na = (size_t)a->rank * (size_t)in, nb = (size_t)out * (size_t)a->rank;
    fmt_lora_mat *m = realloc(a->m, sizeof *m * (size_t)(a->n + 1));
    if (!m) return core_err(TLM_ERR_NOMEM, "out of memory");
    a->m = m;
    fmt_lora_mat *e = &m[a->n];
    memset(e, 0, sizeof *e);
    e->a = calloc(na, sizeof(float));
    e->b = calloc(nb, sizeof(float));
    if (!e->a || !e->b) {
        free(e->a);
        free(e->b);
        return core_err(TLM_ERR_NOMEM, "out of memory");
    }
    snprintf(e->name, sizeof e->name, "%s", name);
    e->in = in;
    e->out = out;
    if (A) memcpy(e->a, A, na * sizeof(float));
    if (B) memcpy(e->b, B, nb * sizeof(float));
    a->n++;
    return TLM_OK;
}

float fmt_lora_scale(const fmt_lora *a) {
    if (a->rank <= 0) return 0.0f;
    return a->use_rslora ? a->alpha / sqrtf((float)a->rank) : a->alpha / (float)a->rank;
}

/* Index of the first value that is not finite, or -1. */
static long first_bad(const float *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(p[i])) return (long)i;
    return -1;
}

tlm_status fmt_lora_validate(const fmt_lora *a, const char *what) {
    if (a->rank <= 0) return core_err(TLM_ERR_FORMAT, "%s: LoRA rank %d", what, a->rank);
    if (!isfinite(a->alpha)) return core_err(TLM_ERR_NUMERIC, "%s: LoRA alpha is not finite", what);
    if (a->n <= 0) return core_err(TLM_ERR_FORMAT, "%s: the adapter has no LoRA tensors", what);
    for (int i = 0; i < a->n; i++) {
        const fmt_lora_mat *e = &a->m[i];
        if (!fmt_lora_known_target(e->name))
            return core_err(TLM_ERR_FORMAT, "%s: unknown LoRA target '%s'", what, e->name);
        for (int j = 0; j < i; j++)
            if (!strcmp(a->m[j].name, e->name))
                return core_err(TLM_ERR_FORMAT, "%s: LoRA target '%s' appears twice", what,
                                e->name);
        if (e->in <= 0 || e->out <= 0 || !e->a || !e->b)
            return core_err(TLM_ERR_FORMAT, "%s: %s has no valid LoRA matrices", what, e->name);
        long k = first_bad(e->a, (size_t)a->rank * (size_t)e->in);
        if (k >= 0)
            return core_err(TLM_ERR_NUMERIC, "%s: %s lora_a holds %s at element %ld", what, e->name,
                            isnan(e->a[k]) ? "NaN" : "Inf", k);
        k = first_bad(e->b, (size_t)e->out * (size_t)a->rank);
        if (k >= 0)
            return core_err(TLM_ERR_NUMERIC, "%s: %s lora_b holds %s at element %ld", what, e->name,
                            isnan(e->b[k]) ? "NaN" : "Inf", k);
    }
    return TLM_OK;
}

tlm_status fmt_lora_check_base(const fmt_lora *a, const char *arch, const fmt_lora_base *base,
                               int n_base) {
    if (arch && strcmp(arch, a->arch))
        return core_err(TLM_ERR_FORMAT,
                        "the LoRA adapter is for architecture '%s' but the model is '%s'", a->arch,
                        arch);
    for (int i = 0; i < a->n; i++) {
        const fmt_lora_mat *e = &a->m[i];
        const fmt_lora_base *b = NULL;
        for (int j = 0; j < n_base && !b; j++)
            if (base[j].name && !strcmp(base[j].name, e->name)) b = &base[j];
        if (!b)
            return core_err(TLM_ERR_FORMAT,
                            "the LoRA adapter targets %s, which the model does not have", e->name);
        if (b->in != e->in || b->out != e->out)
            return core_err(TLM_ERR_FORMAT,
                            "LoRA %s is for a [%lld, %lld] matrix but the model's is [%lld, %lld]",
                            e->name, (long long)e->out, (long long)e->in, (long long)b->out,
                            (long long)b->in);
    }
    return TLM_OK;
}

static int is_qk(const char *name) {
    const char *p = strstr(name, ".attn_");
    return p && (!strcmp(p, ".attn_q.weight") || !strcmp(p, ".attn_k.weight"));
}

tlm_status fmt_lora_set_qk_order(fmt_lora *a, int interleaved, int head_dim) {
    interleaved = !!interleaved;
    if (a->qk_interleaved == interleaved) return TLM_OK;
    for (int i = 0; i < a->n; i++) {
        fmt_lora_mat *e = &a->m[i];
        if (!is_qk(e->name)) continue;
        if (head_dim <= 0)
            return core_err(TLM_ERR_ARG,
                            "%s: moving LoRA q/k rows between RoPE orders needs the head dimension",
                            e->name);
        if (e->out % head_dim || head_dim % 2)
            return core_err(TLM_ERR_FORMAT, "%s: %lld rows are not whole heads of %d", e->name,
                            (long long)e->out, head_dim);
    }
    for (int i = 0; i < a->n; i++) {
        fmt_lora_mat *e = &a->m[i];
        if (!is_qk(e->name)) continue;
        tlm_status s = fmt_permute_qk(e->b, NULL, (int)e->out, a->rank, head_dim, interleaved);
        if (s) return s;
    }
    a->qk_interleaved = interleaved;
    return TLM_OK;
}
