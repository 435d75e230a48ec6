/* Finding and loading a tokenizer from a path, and writing tlm tokenizer directories. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tok_internal.h"

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static char *dirname_of(const char *path) {
    const char *sl = strrchr(path, '/');
    if (!sl) {
        char *d = malloc(2);
        if (d) strcpy(d, ".");
        return d;
    }
    size_t n = sl == path ? 1 : (size_t)(sl - path);
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, path, n);
    d[n] = 0;
    return d;
}

static const char *basename_of(const char *path) {
    const char *sl = strrchr(path, '/');
    return sl ? sl + 1 : path;
}

static tlm_status load_gpt2_dir(const char *dir, tlm_tokenizer **out) {
    char *e = core_path_join(dir, "encoder.json"), *v = core_path_join(dir, "vocab.bpe");
    tlm_status s = e && v ? tok_load_gpt2(e, v, out) : core_err(TLM_ERR_NOMEM, "out of memory");
    free(e);
    free(v);
    return s;
}

/* Marks the listed texts as specials of a loaded BPE (tlm-trained directories record them): each
 * is the lowest id with exactly its bytes, found in a sorted table of every piece. */
static tlm_status mark_specials(tlm_tokenizer *t, cJSON *arr, const char *path) {
    if (!arr) return TLM_OK;
    if (!cJSON_IsArray(arr))
        return core_err(TLM_ERR_FORMAT, "'%s': \"specials\" must be an array of strings", path);
    tok_str *all = malloc((size_t)t->n * sizeof *all);
    if (!all) return core_err(TLM_ERR_NOMEM, "out of memory");
    for (int32_t i = 0; i < t->n; i++) {
        all[i].p = tok_piece(t, i, &all[i].len);
        all[i].id = i;
    }
    tok_strs_sort(all, (size_t)t->n);
    tlm_status s = TLM_OK;
    for (cJSON *it = arr->child; it && !s; it = it->next) {
        if (!cJSON_IsString(it)) {
            s = core_err(TLM_ERR_FORMAT, "'%s': \"specials\" must be an array of strings", path);
            break;
        }
        const char *v = it->valuestring;
        ptrdiff_t k = tok_strs_find(all, (size_t)t->n, (const uint8_t *)v, strlen(v));
        if (k < 0)
            s = core_err(TLM_ERR_FORMAT, "'%s': special token '%.60s' is not in the vocabulary",
                         path, v);
        else
            t->attr[all[k].id] = TOK_SPECIAL;
    }
    free(all);
    return s ? s : tok_finish(t);
}

static int json_id(cJSON *root, const char *key, int32_t n, int32_t *out) {
    cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) return 1;
    if (!cJSON_IsNumber(v) || v->valuedouble < -1 || v->valuedouble >= n ||
        v->valuedouble != (double)(int)v->valuedouble)
        return 0;
    *out = (int32_t)v->valuedouble;
    return 1;
}

tlm_status tok_load_tlm_dir(const char *dir, tlm_tokenizer **out) {
    *out = NULL;
    char *path = core_path_join(dir, "tokenizer.json");
    if (!path) return core_err(TLM_ERR_NOMEM, "out of memory");
    char *txt = NULL;
    size_t n;
    cJSON *root = NULL;
    tlm_tokenizer *t = NULL;
    int32_t *types = NULL;
    tlm_status s = core_read_file(path, &txt, &n);
    if (s) goto done;
    root = cJSON_ParseWithLength(txt, n);
    cJSON *type = root ? cJSON_GetObjectItemCaseSensitive(root, "type") : NULL;
    if (!root || !cJSON_IsObject(root)) {
        s = core_err(TLM_ERR_FORMAT, "'%s' is not valid JSON", path);
        goto done;
    }
    if (!cJSON_IsString(type)) {
        s = core_err(TLM_ERR_FORMAT,
                     "'%s' has no \"type\" (a Hugging Face tokenizer.json is not supported; "
                     "give encoder.json + vocab.bpe instead)",
                     path);
        goto done;
    }
    if (!strcmp(type->valuestring, "bpe")) {
        s = load_gpt2_dir(dir, &t);
        if (!s) s = mark_specials(t, cJSON_GetObjectItemCaseSensitive(root, "specials"), path);
    } else if (!strcmp(type->valuestring, "char")) {
        cJSON *chars = cJSON_GetObjectItemCaseSensitive(root, "chars");
        int nc = cJSON_IsArray(chars) ? cJSON_GetArraySize(chars) : 0;
        if (nc <= 0) {
            s = core_err(TLM_ERR_FORMAT, "'%s': \"chars\" must be a non-empty array", path);
            goto done;
        }
        const uint8_t **units = malloc((size_t)nc * sizeof *units);
        size_t *lens = malloc((size_t)nc * sizeof *lens);
        uint8_t *bytes = malloc((size_t)nc);
        if (!units || !lens || !bytes) {
            s = core_err(TLM_ERR_NOMEM, "out of memory");
        } else {
            int k = 0;
            for (cJSON *it = chars->child; it && !s; it = it->next, k++) {
                if (cJSON_IsString(it)) {
                    units[k] = (const uint8_t *)it->valuestring;
                    lens[k] = strlen(it->valuestring);
                } else if (cJSON_IsNumber(it) && it->valuedouble >= 0 && it->valuedouble <= 255 &&
                           it->valuedouble == (double)(int)it->valuedouble) {
                    bytes[k] = (uint8_t)it->valueint; /* a byte that is not UTF-8 */
                    units[k] = &bytes[k];
                    lens[k] = 1;
                } else {
                    s = core_err(TLM_ERR_FORMAT, "'%s': chars[%d] is neither a string nor a byte",
                                 path, k);
                }
            }
            if (!s) s = tok_build_char(units, lens, nc, &t);
        }
        free(units);
        free(lens);
        free(bytes);
    } else if (!strcmp(type->valuestring, "spm")) {
        char *bin = core_path_join(dir, "tokenizer.bin");
        cJSON *tarr = cJSON_GetObjectItemCaseSensitive(root, "token_types");
        int nt = cJSON_IsArray(tarr) ? cJSON_GetArraySize(tarr) : 0;
        if (!bin || (nt > 0 && !(types = malloc((size_t)nt * sizeof *types))))
            s = core_err(TLM_ERR_NOMEM, "out of memory");
        int k = 0;
        for (cJSON *it = nt > 0 ? tarr->child : NULL; it && !s; it = it->next, k++) {
            /* GGUF token types (0 undefined .. 6 byte); checked before the cast, which a value
             * outside int's range would make undefined */
            if (!cJSON_IsNumber(it) || !(it->valuedouble >= 0 && it->valuedouble <= 6) ||
                it->valuedouble != (double)(int)it->valuedouble)
                s = core_err(TLM_ERR_FORMAT, "'%s': token_types[%d] is not a token type (0-6)",
                             path, k);
            else
                types[k] = (int32_t)it->valuedouble;
        }
        if (!s) s = tok_load_llama2c_typed(bin, nt > 0 ? types : NULL, nt, &t);
        free(bin);
    } else {
        s = core_err(TLM_ERR_FORMAT, "'%s': unknown tokenizer type '%.40s' (bpe, spm, char)", path,
                     type->valuestring);
    }
    if (!s && (!json_id(root, "bos", t->n, &t->bos) || !json_id(root, "eos", t->n, &t->eos)))
        s = core_err(TLM_ERR_FORMAT, "'%s': bos/eos must be token ids", path);
    cJSON *pre = root ? cJSON_GetObjectItemCaseSensitive(root, "pre") : NULL;
    cJSON *add_bos = root ? cJSON_GetObjectItemCaseSensitive(root, "add_bos") : NULL;
    if (!s && pre &&
        (t->kind != TLM_TOKENIZER_BPE || !cJSON_IsString(pre) ||
         !tok_pre_named(pre->valuestring, strlen(pre->valuestring), &t->pre, &t->merge_known)))
        s = core_err(TLM_ERR_FORMAT, "'%s': \"pre\" names no pre-tokenizer of a bpe tokenizer",
                     path);
    if (!s && add_bos) {
        if (!cJSON_IsBool(add_bos))
            s = core_err(TLM_ERR_FORMAT, "'%s': \"add_bos\" must be true or false", path);
        else
            t->add_bos = cJSON_IsTrue(add_bos);
    }
done:
    if (s) {
        tlm_tokenizer_free(t);
        t = NULL;
    }
    *out = t;
    free(types);
    cJSON_Delete(root);
    free(txt);
    free(path);
    return s;
}

tlm_status tlm_tokenizer_load_gpt2(const char *encoder_json, const char *vocab_bpe,
                                   tlm_tokenizer **out) {
    return tok_load_gpt2(encoder_json, vocab_bpe, out);
}

tlm_status tlm_tokenizer_load(const char *path, tlm_tokenizer **out) {
    *out = NULL;
    if (!path || !*path) return core_err(TLM_ERR_ARG, "no tokenizer path given");
    tlm_status s;
    if (is_dir(path)) {
        /* A tlm tokenizer.json first; Hugging Face directories also carry a tokenizer.json (of
         * another format) next to GPT-2's files under the names vocab.json + merges.txt. */
        const char *names[] = {"tokenizer.json", "encoder.json", "vocab.bpe",
                               "vocab.json",     "merges.txt",   "tokenizer.bin"};
        char *p[6];
        int have[6], nomem = 0;
        for (int i = 0; i < 6; i++) {
            p[i] = core_path_join(path, names[i]);
            nomem |= !p[i];
            have[i] = p[i] && is_file(p[i]);
        }
        int tlm_json = 0;
        if (!nomem && have[0]) {
            char *txt;
            size_t n;
            if (core_read_file(p[0], &txt, &n) == TLM_OK) {
                cJSON *j = cJSON_ParseWithLength(txt, n);
                tlm_json = j && cJSON_IsString(cJSON_GetObjectItemCaseSensitive(j, "type"));
                cJSON_Delete(j);
                free(txt);
            }
        }
        if (nomem)
            s = core_err(TLM_ERR_NOMEM, "out of memory");
        else if (tlm_json)
            s = tok_load_tlm_dir(path, out);
        else if (have[1] && have[2])
            s = tok_load_gpt2(p[1], p[2], out);
        else if (have[3] && have[4])
            s = tok_load_gpt2(p[3], p[4], out);
        else if (have[5])
            s = tok_load_llama2c(p[5], out);
        else if (have[0])
            s = tok_load_tlm_dir(path, out); /* explains what is wrong with it */
        else
            s = core_err(TLM_ERR_IO,
                         "'%s' holds no tokenizer (expected tokenizer.json, encoder.json + "
                         "vocab.bpe, vocab.json + merges.txt, or tokenizer.bin)",
                         path);
        for (int i = 0; i < 6; i++) free(p[i]);
        return s;
    }
    if (!is_file(path))
        return core_err(TLM_ERR_IO, "cannot open tokenizer '%s': %s", path, strerror(errno));
    FILE *f = fopen(path, "rb");
    char magic[4] = {0};
    if (!f) return core_err(TLM_ERR_IO, "cannot open tokenizer '%s': %s", path, strerror(errno));
    size_t got = fread(magic, 1, 4, f);
    fclose(f);
    if (got == 4 && memcmp(magic, "GGUF", 4) == 0) return tok_load_gguf(path, out);
    const char *base = basename_of(path);
    if (!strcmp(base, "tokenizer.json") || !strcmp(base, "encoder.json") ||
        !strcmp(base, "vocab.bpe")) {
        char *dir = dirname_of(path);
        if (!dir) return core_err(TLM_ERR_NOMEM, "out of memory");
        s = !strcmp(base, "tokenizer.json") ? tok_load_tlm_dir(dir, out) : load_gpt2_dir(dir, out);
        free(dir);
        return s;
    }
    return tok_load_llama2c(path, out);
}
