/* A PEFT LoRA directory: adapter_config.json and adapter_model.safetensors, whose tensors are
 * base_model.model.<HF module>.lora_A.weight [r, in] and .lora_B.weight [out, r], with Llama's and
 * Qwen2's module names (model.layers.N.self_attn.q_proj ..., lm_head). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "formats/lora.h"
#include "io/safetensors.h"

/* GGUF block tensor kind -> HF module under model.layers.N. */
static const struct {
    const char *gguf, *hf, *target;
} kinds[] = {
    {"attn_q", "self_attn.q_proj", "q_proj"},   {"attn_k", "self_attn.k_proj", "k_proj"},
    {"attn_v", "self_attn.v_proj", "v_proj"},   {"attn_output", "self_attn.o_proj", "o_proj"},
    {"ffn_gate", "mlp.gate_proj", "gate_proj"}, {"ffn_up", "mlp.up_proj", "up_proj"},
    {"ffn_down", "mlp.down_proj", "down_proj"},
};
#define N_KINDS (int)(sizeof kinds / sizeof *kinds)
#define PEFT_PREFIX "base_model.model."

/* HF module path ("model.layers.3.self_attn.q_proj", "lm_head") of a GGUF name; *kind gets the
 * index into kinds, or N_KINDS for lm_head. */
static int gguf_to_hf(const char *name, char *hf, size_t cap, int *kind) {
    if (!strcmp(name, "output.weight")) {
        *kind = N_KINDS;
        return snprintf(hf, cap, "lm_head") < (int)cap;
    }
    int layer;
    char rest[40];
    if (sscanf(name, "blk.%d.%39[a-z_]", &layer, rest) != 2) return 0;
    for (int k = 0; k < N_KINDS; k++)
        if (!strcmp(rest, kinds[k].gguf)) {
            *kind = k;
            return snprintf(hf, cap, "model.layers.%d.%s", layer, kinds[k].hf) < (int)cap;
        }
    return 0;
}

/* The GGUF name of an HF module path; 0 if it is not one adapters may target. */
static int hf_to_gguf(const char *hf, char *name, size_t cap, int *kind) {
    if (!strcmp(hf, "lm_head")) {
        *kind = N_KINDS;
        return snprintf(name, cap, "output.weight") < (int)cap;
    }
    const char *p = hf;
    if (strncmp(p, "model.layers.", 13)) return 0;
    p += 13;
    char *end;
    long layer = strtol(p, &end, 10);
    if (end == p || *p < '0' || *p > '9' || *end != '.' || layer > 999999) return 0;
    for (int k = 0; k < N_KINDS; k++)
        if (!strcmp(end + 1, kinds[k].hf)) {
            *kind = k;
            snprintf(name, cap, "blk.%ld.%s.weight", layer, kinds[k].gguf);
            return fmt_lora_known_target(name);
        }
    return 0;
}

static int json_empty(const cJSON *j) {
    return !j || cJSON_IsNull(j) || ((cJSON_IsObject(j) || cJSON_IsArray(j)) && !j->child);
}

static tlm_status read_config(const char *path, fmt_lora *out, cJSON **targets) {
    char *text = NULL;
    size_t len = 0;
    tlm_status s = core_read_file(path, &text, &len);
    if (s) return s;
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return core_err(TLM_ERR_FORMAT, "%s: not a JSON object", path);
    }
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "peft_type");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "r");
    const cJSON *al = cJSON_GetObjectItemCaseSensitive(j, "lora_alpha");
    if (v && !(cJSON_IsString(v) && !strcmp(v->valuestring, "LORA")))
        s = core_err(TLM_ERR_UNSUPPORTED, "%s: peft_type is not LORA", path);
    else if (!cJSON_IsNumber(r) || r->valuedouble < 1 || r->valuedouble > 65536 ||
             r->valuedouble != (double)(int)r->valuedouble)
        s = core_err(TLM_ERR_FORMAT, "%s: r is missing or not a positive integer", path);
    else if (!cJSON_IsNumber(al))
        s = core_err(TLM_ERR_FORMAT, "%s: lora_alpha is missing or not a number", path);
    else if (!json_empty(cJSON_GetObjectItemCaseSensitive(j, "rank_pattern")))
        s = core_err(TLM_ERR_UNSUPPORTED,
                     "%s: rank_pattern (a rank per module) is not supported: one r per adapter",
                     path);
    else if (!json_empty(cJSON_GetObjectItemCaseSensitive(j, "alpha_pattern")))
        s = core_err(TLM_ERR_UNSUPPORTED,
                     "%s: alpha_pattern (an alpha per module) is not supported: one lora_alpha per "
                     "adapter",
                     path);
    else if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "fan_in_fan_out")))
        s = core_err(TLM_ERR_UNSUPPORTED, "%s: fan_in_fan_out (Conv1D bases) is not supported",
                     path);
    else if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "use_dora")))
        s = core_err(TLM_ERR_UNSUPPORTED, "%s: use_dora (DoRA) is not supported", path);
    else if (!json_empty(cJSON_GetObjectItemCaseSensitive(j, "modules_to_save")))
        s = core_err(TLM_ERR_UNSUPPORTED,
                     "%s: modules_to_save (fully trained modules) is not "
                     "supported",
                     path);
    if (!s) {
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(j, "bias");
        if (b && !(cJSON_IsString(b) && !strcmp(b->valuestring, "none")))
            s = core_err(TLM_ERR_UNSUPPORTED, "%s: bias other than \"none\" is not supported",
                         path);
    }
    if (s) {
        cJSON_Delete(j);
        return s;
    }
    out->rank = (int)r->valuedouble;
    out->alpha = (float)al->valuedouble;
    out->use_rslora = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "use_rslora"));
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(j, "lora_dropout");
    out->dropout = cJSON_IsNumber(d) ? (float)d->valuedouble : 0.0f;
    const cJSON *bm = cJSON_GetObjectItemCaseSensitive(j, "base_model_name_or_path");
    if (cJSON_IsString(bm))
        snprintf(out->base_model, sizeof out->base_model, "%s", bm->valuestring);
    cJSON *t = cJSON_DetachItemFromObjectCaseSensitive(j, "target_modules");
    cJSON_Delete(j);
    *targets = t;
    return TLM_OK;
}

/* 1 if target_modules allows module kind k: a list naming it (or its full path ending), a string
 * (a regular expression PEFT matches, which this reader does not evaluate), or none at all. */
static int target_allowed(const cJSON *targets, int k) {
    if (!cJSON_IsArray(targets)) return 1;
    const char *want = k == N_KINDS ? "lm_head" : kinds[k].target;
    const cJSON *e;
    cJSON_ArrayForEach(e, targets) {
        if (cJSON_IsString(e) &&
            (!strcmp(e->valuestring, want) || !strcmp(e->valuestring, "all-linear")))
            return 1;
    }
    return 0;
}

static tlm_status read_tensors(const char *path, const io_st_file *f, const cJSON *targets,
                               fmt_lora *out) {
    for (int i = 0; i < f->n; i++) {
        const char *nm = f->tensors[i].name;
        size_t l = strlen(nm);
        const char *p = nm;
        if (!strncmp(p, PEFT_PREFIX, strlen(PEFT_PREFIX))) p += strlen(PEFT_PREFIX);
        size_t pl = strlen(p);
        int isa = pl > 14 && !strcmp(p + pl - 14, ".lora_A.weight");
        int isb = pl > 14 && !strcmp(p + pl - 14, ".lora_B.weight");
        if (!isa && !isb)
            return core_err(TLM_ERR_FORMAT,
                            "%s: tensor '%.100s' is neither a lora_A nor a lora_B weight", path,
                            nm);
        char mod[160], gname[FMT_LORA_NAME_MAX];
        int kind;
        if (pl - 14 >= sizeof mod)
            return core_err(TLM_ERR_FORMAT, "%s: unknown LoRA target '%.100s'", path, nm);
        memcpy(mod, p, pl - 14);
        mod[pl - 14] = 0;
        if (!hf_to_gguf(mod, gname, sizeof gname, &kind))
            return core_err(TLM_ERR_FORMAT, "%s: unknown LoRA target '%s'", path, mod);
        if (!target_allowed(targets, kind))
            return core_err(TLM_ERR_FORMAT, "%s: %s is not among the config's target_modules", path,
                            mod);
        char other[200];
        snprintf(other, sizeof other, "%.*s.lora_%c.weight", (int)(l - 14), nm, isa ? 'B' : 'A');
        const io_st_tensor *o = io_st_find(f, other);
        if (!o) return core_err(TLM_ERR_FORMAT, "%s: %s has no matching %s", path, nm, other);
        if (isb) continue;
        const io_st_tensor *ta = &f->tensors[i];
        if (ta->ndim != 2 || o->ndim != 2)
            return core_err(TLM_ERR_FORMAT, "%s: %s or %s is not a matrix", path, nm, other);
        /* A [r, in], B [out, r] */
        if (ta->shape[0] != out->rank || o->shape[1] != out->rank)
            return core_err(TLM_ERR_FORMAT,
                            "%s: %s is [%lld, %lld] and %s [%lld, %lld]: rank does not match "
                            "the config's r = %d",
                            path, nm, (long long)ta->shape[0], (long long)ta->shape[1], other,
                            (long long)o->shape[0], (long long)o->shape[1], out->rank);
        tlm_status s = fmt_lora_add(out, gname, ta->shape[1], o->shape[0], NULL, NULL);
        if (s) return core_err_context(s, "%s", path);
        fmt_lora_mat *e = &out->m[out->n - 1];
        s = io_st_read_f32(f, ta, e->a, (size_t)out->rank * (size_t)e->in);
        if (!s) s = io_st_read_f32(f, o, e->b, (size_t)out->rank * (size_t)e->out);
        if (s) return core_err_context(s, "%s", path);
    }
    if (!out->n) return core_err(TLM_ERR_FORMAT, "%s: the adapter has no LoRA tensors", path);
    return TLM_OK;
}

tlm_status fmt_lora_read_peft(const char *dir, const char *arch, fmt_lora *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->arch, sizeof out->arch, "%s", arch ? arch : "llama");
    char *cfg = core_path_join(dir, "adapter_config.json");
    char *st = core_path_join(dir, "adapter_model.safetensors");
    cJSON *targets = NULL;
    tlm_status s = cfg && st ? TLM_OK : core_err(TLM_ERR_NOMEM, "out of memory");
    if (!s) s = read_config(cfg, out, &targets);
    io_st_file f;
    memset(&f, 0, sizeof f);
    if (!s && access(st, F_OK) != 0) {
        char *bin = core_path_join(dir, "adapter_model.bin");
        s = bin && access(bin, F_OK) == 0
                ? core_err(TLM_ERR_UNSUPPORTED,
                           "%s: adapter_model.bin (a PyTorch pickle) is not read: save the adapter "
                           "with safe_serialization (adapter_model.safetensors)",
                           dir)
                : core_err(TLM_ERR_IO, "%s: no adapter_model.safetensors", dir);
        free(bin);
    }
    if (!s) s = io_st_open(&f, st);
    if (!s) {
        s = read_tensors(st, &f, targets, out);
        io_st_close(&f);
    }
    if (!s) s = fmt_lora_validate(out, st);
    cJSON_Delete(targets);
    free(cfg);
    free(st);
    if (s) fmt_lora_free(out);
    return s;
}

static int is_qk(const char *name) {
    const char *p = strstr(name, ".attn_");
    return p && (!strcmp(p, ".attn_q.weight") || !strcmp(p, ".attn_k.weight"));
}

static tlm_status write_config(const char *path, const fmt_lora *a) {
    int used[N_KINDS + 1] = {0};
    for (int i = 0; i < a->n; i++) {
        char hf[160];
        int k;
        if (gguf_to_hf(a->m[i].name, hf, sizeof hf, &k)) used[k] = 1;
    }
    cJSON *j = cJSON_CreateObject(), *t = cJSON_CreateArray();
    if (!j || !t) {
        cJSON_Delete(j);
        cJSON_Delete(t);
        return core_err(TLM_ERR_NOMEM, "out of memory");
    }
    for (int k = 0; k <= N_KINDS; k++)
        if (used[k])
            cJSON_AddItemToArray(t, cJSON_CreateString(k == N_KINDS ? "lm_head" : kinds[k].target));
    cJSON_AddStringToObject(j, "peft_type", "LORA");
    cJSON_AddStringToObject(j, "task_type", "CAUSAL_LM");
    if (a->base_model[0])
        cJSON_AddStringToObject(j, "base_model_name_or_path", a->base_model);
    else
        cJSON_AddNullToObject(j, "base_model_name_or_path");
    cJSON_AddNumberToObject(j, "r", a->rank);
    cJSON_AddNumberToObject(j, "lora_alpha", (double)a->alpha);
    cJSON_AddNumberToObject(j, "lora_dropout", (double)a->dropout);
    cJSON_AddItemToObject(j, "target_modules", t);
    cJSON_AddBoolToObject(j, "use_rslora", a->use_rslora);
    cJSON_AddStringToObject(j, "bias", "none");
    cJSON_AddBoolToObject(j, "fan_in_fan_out", 0);
    cJSON_AddBoolToObject(j, "inference_mode", 1);
    cJSON_AddBoolToObject(j, "init_lora_weights", 1);
    cJSON_AddItemToObject(j, "rank_pattern", cJSON_CreateObject());
    cJSON_AddItemToObject(j, "alpha_pattern", cJSON_CreateObject());
    cJSON_AddNullToObject(j, "modules_to_save");
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    if (!text) return core_err(TLM_ERR_NOMEM, "out of memory");
    tlm_status s = core_write_file_atomic(path, text, strlen(text));
    free(text);
    return s;
}

tlm_status fmt_lora_write_peft(const char *dir, const fmt_lora *a, int head_dim) {
    tlm_status s = fmt_lora_validate(a, dir);
    if (s) return s;
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return core_err(TLM_ERR_IO, "cannot create %s: %s", dir, strerror(errno));
    int n = 2 * a->n;
    io_st_out_tensor *t = calloc((size_t)n, sizeof *t);
    char *names = calloc((size_t)n, 200);
    float **bs = calloc((size_t)a->n, sizeof *bs);
    fmt_lora_mat *ms = malloc(sizeof *ms * (size_t)a->n);
    if (!t || !names || !bs || !ms) s = core_err(TLM_ERR_NOMEM, "out of memory");
    /* PEFT keeps HF's half order: q/k B rows of an interleaved adapter move back */
    for (int i = 0; i < a->n && !s; i++) {
        ms[i] = a->m[i];
        if (!a->qk_interleaved || !is_qk(a->m[i].name)) continue;
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
        fmt_lora tmp = *a;
        tmp.m = ms;
        s = fmt_lora_set_qk_order(&tmp, 0, head_dim);
    }
    for (int i = 0; i < a->n && !s; i++) {
        char hf[160];
        int k;
        if (!gguf_to_hf(ms[i].name, hf, sizeof hf, &k)) {
            s = core_err(TLM_ERR_FORMAT, "unknown LoRA target '%s'", ms[i].name);
            break;
        }
        for (int ab = 0; ab < 2; ab++) {
            io_st_out_tensor *o = &t[2 * i + ab];
            char *nm = names + (size_t)(2 * i + ab) * 200;
            snprintf(nm, 200, PEFT_PREFIX "%s.lora_%c.weight", hf, ab ? 'B' : 'A');
            o->name = nm;
            o->dtype = TLM_DTYPE_F32;
            o->ndim = 2;
            o->shape[0] = ab ? ms[i].out : a->rank;
            o->shape[1] = ab ? a->rank : ms[i].in;
            o->data = ab ? ms[i].b : ms[i].a;
        }
    }
    char *st = s ? NULL : core_path_join(dir, "adapter_model.safetensors");
    char *cfg = s ? NULL : core_path_join(dir, "adapter_config.json");
    if (!s && (!st || !cfg)) s = core_err(TLM_ERR_NOMEM, "out of memory");
    static const char *const keys[] = {"format"}, *const vals[] = {"pt"};
    if (!s) s = io_st_write(st, t, n, keys, vals, 1);
    if (!s) s = write_config(cfg, a);
    for (int i = 0; bs && i < a->n; i++) free(bs[i]);
    free(bs);
    free(ms);
    free(t);
    free(names);
    free(st);
    free(cfg);
    return s ? core_err_context(s, "writing %s", dir) : TLM_OK;
}
