#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "model/lora.h"
#include "model/model.h"
#include "train/train.h"

tlm_status trn_checkpoint_save(const char *path, const tlm_model *m, const tlm_adamw *opt,
                               const trn_state *st) {
    if (!m->st.params || opt->begin != 0 || opt->n != m->n_params)
        return core_err(TLM_ERR_ARG, "checkpoint: needs a writable model and the whole optimizer");
    int n = m->n_tensors;
    io_st_out_tensor *t = calloc((size_t)n + 2, sizeof *t);
    char *cfg = tlm_config_to_json(&m->c);
    if (!t || !cfg) {
        free(t);
        free(cfg);
        return core_err(TLM_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < n; i++) {
        const tlm_tensor_info *ti = &m->tensors[i];
        t[i] = (io_st_out_tensor){ti->name,
                                  TLM_DTYPE_F32,
                                  ti->ndim,
                                  {ti->shape[0], ti->shape[1], ti->shape[2]},
                                  m->st.params + ti->offset};
    }
    t[n] = (io_st_out_tensor){"optimizer.m", TLM_DTYPE_F32, 1, {(int64_t)opt->n}, opt->m};
    t[n + 1] = (io_st_out_tensor){"optimizer.v", TLM_DTYPE_F32, 1, {(int64_t)opt->n}, opt->v};
    char step[32], adam_step[32], state[32], inc[32], seed[32];
    snprintf(step, sizeof step, "%ld", st->step);
    snprintf(adam_step, sizeof adam_step, "%ld", opt->step);
    snprintf(state, sizeof state, "%" PRIu64, st->rng.state);
    snprintf(inc, sizeof inc, "%" PRIu64, st->rng.inc);
    snprintf(seed, sizeof seed, "%" PRIu64, st->seed);
    const char *keys[] = {"format",    "tlm_config", "step", "adam_step",
                          "rng_state", "rng_inc",    "seed"};
    const char *vals[] = {"tlm-checkpoint", cfg, step, adam_step, state, inc, seed};
    tlm_status s = io_st_write(path, t, n + 2, keys, vals, 7);
    free(t);
    free(cfg);
    return s;
}

static int meta_u64(const io_st_file *f, const char *key, uint64_t *out) {
    const char *v = io_st_meta(f, key);
    if (!v || !*v) return 0;
    char *end;
    unsigned long long x = strtoull(v, &end, 10);
    if (*end) return 0;
    *out = (uint64_t)x;
    return 1;
}

tlm_status trn_checkpoint_load(const char *path, tlm_model *m, tlm_adamw *opt, trn_state *st) {
    if (!m->st.params || opt->begin != 0 || opt->n != m->n_params)
        return core_err(TLM_ERR_ARG, "checkpoint: needs a writable model and the whole optimizer");
    io_st_file f;
    tlm_status s = io_st_open(&f, path);
    if (s) return s;
    const char *fmt = io_st_meta(&f, "format"), *cfg = io_st_meta(&f, "tlm_config");
    uint64_t step = 0, adam_step = 0, state = 0, inc = 0, seed = 0;
    tlm_config c;
    if (!fmt || strcmp(fmt, "tlm-checkpoint") != 0 || !cfg || !meta_u64(&f, "step", &step) ||
        !meta_u64(&f, "adam_step", &adam_step) || !meta_u64(&f, "rng_state", &state) ||
        !meta_u64(&f, "rng_inc", &inc) || !meta_u64(&f, "seed", &seed)) {
        s = core_err(TLM_ERR_FORMAT, "%s: not a tlm training checkpoint", path);
    } else if ((s = tlm_config_from_json(cfg, &c)) != TLM_OK) {
        core_err_context(s, "%s", path);
    } else if (memcmp(&c, &m->c, sizeof c) != 0) {
        s = core_err(TLM_ERR_CONFIG, "%s: checkpoint config differs from the model's", path);
    }
    const io_st_tensor *tm = s ? NULL : io_st_find(&f, "optimizer.m");
    const io_st_tensor *tv = s ? NULL : io_st_find(&f, "optimizer.v");
    if (!s && (!tm || !tv)) s = core_err(TLM_ERR_FORMAT, "%s: optimizer state missing", path);
    if (!s) s = io_st_read_f32(&f, tm, opt->m, opt->n);
    if (!s) s = io_st_read_f32(&f, tv, opt->v, opt->n);
    io_st_close(&f);
    if (!s) s = tlm_model_read_safetensors(m, path);
    if (s) return s;
    st->step = (long)step;
    opt->step = (long)adam_step;
    st->rng.state = state;
    st->rng.inc = inc;
    st->seed = seed;
    return TLM_OK;
}

/* The adapter's options as one string: a resumed run must ask for the same adapter. */
static void lora_desc(const tlm_lora *a, char *out, size_t cap) {
    tlm_lora_opts o;
    tlm_lora_get_opts(a, &o);
    snprintf(out, cap,
             "{\"rank\": %d, \"alpha\": %.9g, \"dropout\": %.9g, \"rslora\": %d, "
             "\"targets\": %u}",
             o.rank, (double)o.alpha, (double)o.dropout, o.rslora, o.targets);
}

tlm_status trn_lora_checkpoint_save(const char *path, const tlm_lora *a, const tlm_adamw *opt,
                                    const trn_state *st) {
    int n;
    const tlm_tensor_info *ts = tlm_lora_tensors(a, &n);
    size_t np = tlm_lora_num_params(a);
    if (opt->begin != 0 || opt->n != np)
        return core_err(TLM_ERR_ARG, "checkpoint: needs the whole optimizer");
    io_st_out_tensor *t = calloc((size_t)n + 2, sizeof *t);
    char *cfg = tlm_config_to_json(&a->c);
    if (!t || !cfg) {
        free(t);
        free(cfg);
        return core_err(TLM_ERR_NOMEM, "out of memory");
    }
    const float *P = tlm_lora_params(a);
    for (int i = 0; i < n; i++)
        t[i] = (io_st_out_tensor){
            ts[i].name, TLM_DTYPE_F32, 2, {ts[i].shape[0], ts[i].shape[1]}, P + ts[i].offset};
    t[n] = (io_st_out_tensor){"optimizer.m", TLM_DTYPE_F32, 1, {(int64_t)opt->n}, opt->m};
    t[n + 1] = (io_st_out_tensor){"optimizer.v", TLM_DTYPE_F32, 1, {(int64_t)opt->n}, opt->v};
    char step[32], adam_step[32], state[32], inc[32], seed[32], lora[256];
    snprintf(step, sizeof step, "%ld", st->step);
    snprintf(adam_step, sizeof adam_step, "%ld", opt->step);
    snprintf(state, sizeof state, "%" PRIu64, st->rng.state);
    snprintf(inc, sizeof inc, "%" PRIu64, st->rng.inc);
    snprintf(seed, sizeof seed, "%" PRIu64, st->seed);
    lora_desc(a, lora, sizeof lora);
    const char *keys[] = {"format",    "tlm_config", "lora",    "step",
                          "adam_step", "rng_state",  "rng_inc", "seed"};
    const char *vals[] = {"tlm-lora-checkpoint", cfg, lora, step, adam_step, state, inc, seed};
    tlm_status s = io_st_write(path, t, n + 2, keys, vals, 8);
    free(t);
    free(cfg);
    return s;
}

tlm_status trn_lora_checkpoint_load(const char *path, tlm_lora *a, tlm_adamw *opt, trn_state *st) {
    size_t np = tlm_lora_num_params(a);
    if (opt->begin != 0 || opt->n != np)
        return core_err(TLM_ERR_ARG, "checkpoint: needs the whole optimizer");
    io_st_file f;
    tlm_status s = io_st_open(&f, path);
    if (s) return s;
    const char *fmt = io_st_meta(&f, "format"), *cfg = io_st_meta(&f, "tlm_config");
    const char *lora = io_st_meta(&f, "lora");
    uint64_t step = 0, adam_step = 0, state = 0, inc = 0, seed = 0;
    char want[256];
    lora_desc(a, want, sizeof want);
    tlm_config c;
    if (!fmt || strcmp(fmt, "tlm-lora-checkpoint") != 0 || !cfg || !lora ||
        !meta_u64(&f, "step", &step) || !meta_u64(&f, "adam_step", &adam_step) ||
        !meta_u64(&f, "rng_state", &state) || !meta_u64(&f, "rng_inc", &inc) ||
        !meta_u64(&f, "seed", &seed)) {
        s = core_err(TLM_ERR_FORMAT, "%s: not a tlm LoRA training checkpoint", path);
    } else if ((s = tlm_config_from_json(cfg, &c)) != TLM_OK) {
        core_err_context(s, "%s", path);
    } else if (memcmp(&c, &a->c, sizeof c) != 0) {
        s = core_err(TLM_ERR_CONFIG, "%s: checkpoint of an adapter for another base model", path);
    } else if (strcmp(lora, want) != 0) {
        s = core_err(TLM_ERR_CONFIG, "%s: checkpoint adapter %s, asked for %s", path, lora, want);
    }
    int n;
    const tlm_tensor_info *ts = tlm_lora_tensors(a, &n);
    float *P = tlm_lora_params_mut(a);
    for (int i = 0; i < n && !s; i++) {
        const io_st_tensor *t = io_st_find(&f, ts[i].name);
        if (!t) s = core_err(TLM_ERR_FORMAT, "%s: %s missing", path, ts[i].name);
        if (!s) s = io_st_read_f32(&f, t, P + ts[i].offset, ts[i].numel);
    }
    const io_st_tensor *tm = s ? NULL : io_st_find(&f, "optimizer.m");
    const io_st_tensor *tv = s ? NULL : io_st_find(&f, "optimizer.v");
    if (!s && (!tm || !tv)) s = core_err(TLM_ERR_FORMAT, "%s: optimizer state missing", path);
    if (!s) s = io_st_read_f32(&f, tm, opt->m, opt->n);
    if (!s) s = io_st_read_f32(&f, tv, opt->v, opt->n);
    io_st_close(&f);
    if (s) return s;
    st->step = (long)step;
    opt->step = (long)adam_step;
    st->rng.state = state;
    st->rng.inc = inc;
    st->seed = seed;
    return TLM_OK;
}
