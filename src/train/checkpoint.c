#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "model/model.h"
#include "train/train.h"

tlm_status tlm_checkpoint_save(const char *path, const tlm_model *m, const tlm_adamw *opt,
                               const tlm_train_state *st) {
    if (!m->st.params || opt->begin != 0 || opt->n != m->n_params)
        return tlm_err(TLM_ERR_ARG, "checkpoint: needs a writable model and the whole optimizer");
    int n = m->n_tensors;
    st_out_tensor *t = calloc((size_t)n + 2, sizeof *t);
    char *cfg = tlm_config_to_json(&m->c);
    if (!t || !cfg) {
        free(t);
        free(cfg);
        return tlm_err(TLM_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < n; i++) {
        const tlm_tensor_info *ti = &m->tensors[i];
        t[i] = (st_out_tensor){ti->name,
                               TLM_DTYPE_F32,
                               ti->ndim,
                               {ti->shape[0], ti->shape[1]},
                               m->st.params + ti->offset};
    }
    t[n] = (st_out_tensor){"optimizer.m", TLM_DTYPE_F32, 1, {(int64_t)opt->n}, opt->m};
    t[n + 1] = (st_out_tensor){"optimizer.v", TLM_DTYPE_F32, 1, {(int64_t)opt->n}, opt->v};
    char step[32], adam_step[32], state[32], inc[32], seed[32];
    snprintf(step, sizeof step, "%ld", st->step);
    snprintf(adam_step, sizeof adam_step, "%ld", opt->step);
    snprintf(state, sizeof state, "%" PRIu64, st->rng.state);
    snprintf(inc, sizeof inc, "%" PRIu64, st->rng.inc);
    snprintf(seed, sizeof seed, "%" PRIu64, st->seed);
    const char *keys[] = {"format",    "tlm_config", "step", "adam_step",
                          "rng_state", "rng_inc",    "seed"};
    const char *vals[] = {"tlm-checkpoint", cfg, step, adam_step, state, inc, seed};
    tlm_status s = st_write(path, t, n + 2, keys, vals, 7);
    free(t);
    free(cfg);
    return s;
}

static int meta_u64(const st_file *f, const char *key, uint64_t *out) {
    const char *v = st_meta(f, key);
    if (!v || !*v) return 0;
    char *end;
    unsigned long long x = strtoull(v, &end, 10);
    if (*end) return 0;
    *out = (uint64_t)x;
    return 1;
}

tlm_status tlm_checkpoint_load(const char *path, tlm_model *m, tlm_adamw *opt,
                               tlm_train_state *st) {
    if (!m->st.params || opt->begin != 0 || opt->n != m->n_params)
        return tlm_err(TLM_ERR_ARG, "checkpoint: needs a writable model and the whole optimizer");
    st_file f;
    tlm_status s = st_open(&f, path);
    if (s) return s;
    const char *fmt = st_meta(&f, "format"), *cfg = st_meta(&f, "tlm_config");
    uint64_t step = 0, adam_step = 0, state = 0, inc = 0, seed = 0;
    tlm_config c;
    if (!fmt || strcmp(fmt, "tlm-checkpoint") != 0 || !cfg || !meta_u64(&f, "step", &step) ||
        !meta_u64(&f, "adam_step", &adam_step) || !meta_u64(&f, "rng_state", &state) ||
        !meta_u64(&f, "rng_inc", &inc) || !meta_u64(&f, "seed", &seed)) {
        s = tlm_err(TLM_ERR_FORMAT, "%s: not a tlm training checkpoint", path);
    } else if ((s = tlm_config_from_json(cfg, &c)) != TLM_OK) {
        tlm_err_context(s, "%s", path);
    } else if (memcmp(&c, &m->c, sizeof c) != 0) {
        s = tlm_err(TLM_ERR_CONFIG, "%s: checkpoint config differs from the model's", path);
    }
    const st_tensor *tm = s ? NULL : st_find(&f, "optimizer.m");
    const st_tensor *tv = s ? NULL : st_find(&f, "optimizer.v");
    if (!s && (!tm || !tv)) s = tlm_err(TLM_ERR_FORMAT, "%s: optimizer state missing", path);
    if (!s) s = st_read_f32(&f, tm, opt->m, opt->n);
    if (!s) s = st_read_f32(&f, tv, opt->v, opt->n);
    st_close(&f);
    if (!s) s = tlm_model_load_safetensors(m, path);
    if (s) return s;
    st->step = (long)step;
    opt->step = (long)adam_step;
    st->rng.state = state;
    st->rng.inc = inc;
    st->seed = seed;
    return TLM_OK;
}
