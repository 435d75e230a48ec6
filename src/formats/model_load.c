/* Opening a model from any supported path. Format detection lives here so that every command
 * (info, generate, eval, convert) accepts the same MODEL argument. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "formats/formats.h"
#include "io/safetensors.h"
#include "model/model.h"

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

const char *tlm_model_format_name(tlm_model_format f) {
    switch (f) {
    case TLM_FORMAT_TLM: return "tlm";
    case TLM_FORMAT_LLAMA2C: return "llama2.c";
    case TLM_FORMAT_GGUF: return "gguf";
    case TLM_FORMAT_HF: return "huggingface";
    default: return "unknown";
    }
}

static int dir_has(const char *dir, const char *name) {
    char *p = core_path_join(dir, name);
    int r = p && file_exists(p);
    free(p);
    return r;
}

tlm_status tlm_model_detect(const char *path, tlm_model_format *fmt) {
    *fmt = TLM_FORMAT_UNKNOWN;
    if (is_dir(path)) {
        /* tlm writes model.safetensors with its config inside; Hugging Face keeps config.json. */
        if (dir_has(path, "model.safetensors") && !dir_has(path, "config.json"))
            *fmt = TLM_FORMAT_TLM;
        else if (dir_has(path, "config.json"))
            *fmt = TLM_FORMAT_HF;
        else
            return core_err(TLM_ERR_FORMAT,
                            "'%s' is a directory with neither model.safetensors (tlm checkpoint) "
                            "nor config.json (Hugging Face model)",
                            path);
        if (*fmt == TLM_FORMAT_TLM || !dir_has(path, "model.safetensors")) return TLM_OK;
        /* Both present: a tlm checkpoint directory also holds tlm's config.json. */
        io_st_file f;
        char *p = core_path_join(path, "model.safetensors");
        if (!p) return core_err(TLM_ERR_NOMEM, "out of memory");
        tlm_status s = io_st_open(&f, p);
        free(p);
        if (s) return s;
        if (io_st_meta(&f, "tlm_config")) *fmt = TLM_FORMAT_TLM;
        io_st_close(&f);
        return TLM_OK;
    }
    if (!file_exists(path))
        return core_err(TLM_ERR_IO, "no such model file or directory '%s'", path);
    size_t n = strlen(path);
    if (n >= 12 && !strcmp(path + n - 12, ".safetensors")) {
        *fmt = TLM_FORMAT_TLM;
        return TLM_OK;
    }
    core_mmap map;
    tlm_status s = core_mmap_open(&map, path);
    if (s) return s;
    if (map.size >= 4 && !memcmp(map.data, "GGUF", 4))
        *fmt = TLM_FORMAT_GGUF;
    else if (fmt_llama2c_sniff(map.data, map.size))
        *fmt = TLM_FORMAT_LLAMA2C;
    core_mmap_close(&map);
    if (*fmt == TLM_FORMAT_UNKNOWN)
        return core_err(TLM_ERR_FORMAT,
                        "'%s': unrecognized model format (not GGUF, not a llama2.c .bin whose "
                        "header matches its size, not .safetensors)",
                        path);
    return TLM_OK;
}

tlm_status fmt_load_tlm(const char *path, int writable, tlm_model **out) {
    if (!is_dir(path)) return fmt_load_tlm_file(path, writable, out);
    char *p = core_path_join(path, "model.safetensors");
    if (!p) return core_err(TLM_ERR_NOMEM, "out of memory");
    tlm_status s = fmt_load_tlm_file(p, writable, out);
    free(p);
    return s;
}

tlm_status tlm_model_load(const char *path, unsigned flags, tlm_model **out) {
    *out = NULL;
    if (flags & ~(unsigned)(TLM_LOAD_WRITABLE | TLM_LOAD_BF16 | TLM_LOAD_FP32 | TLM_LOAD_READ))
        return core_err(TLM_ERR_ARG, "unknown load flags 0x%x", flags);
    if ((flags & TLM_LOAD_READ) && (flags & TLM_LOAD_WRITABLE))
        return core_err(TLM_ERR_ARG, "load flags: TLM_LOAD_READ and TLM_LOAD_WRITABLE exclude each "
                                     "other (a writable model is a copy already)");
    unsigned prec = flags & (TLM_LOAD_BF16 | TLM_LOAD_FP32);
    if (prec == (TLM_LOAD_BF16 | TLM_LOAD_FP32))
        return core_err(TLM_ERR_ARG,
                        "load flags: TLM_LOAD_BF16 and TLM_LOAD_FP32 exclude each other");
    if (prec && (flags & TLM_LOAD_WRITABLE))
        return core_err(TLM_ERR_ARG, "load flags: a writable model keeps F32 weights; the "
                                     "precision of products is chosen on read-only loads");
    int w = (flags & TLM_LOAD_WRITABLE) != 0;
    tlm_model_format f;
    tlm_status s = tlm_model_detect(path, &f);
    if (s) return s;
    core_mmap_read_mode((flags & TLM_LOAD_READ) != 0);
    switch (f) {
    case TLM_FORMAT_TLM: s = fmt_load_tlm(path, w, out); break;
    case TLM_FORMAT_LLAMA2C: s = fmt_load_llama2c(path, w, out); break;
    case TLM_FORMAT_HF: s = fmt_load_hf(path, w, out); break;
    case TLM_FORMAT_GGUF: s = fmt_load_gguf(path, w, out); break;
    default:
        core_mmap_read_mode(0);
        return core_err(TLM_ERR_UNSUPPORTED, "'%s': %s models are not supported yet", path,
                        tlm_model_format_name(f));
    }
    core_mmap_read_mode(0);
    if (s || !prec) return s;
    s = mdl_retype(*out, prec == TLM_LOAD_BF16 ? TLM_PRECISION_BF16 : TLM_PRECISION_FP32);
    if (s) {
        tlm_model_free(*out);
        *out = NULL;
    }
    return s;
}
