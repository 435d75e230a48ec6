/* Vocabularies inside GGUF files: tokenizer.ggml.model "gpt2" (tokens + merges) or "llama"
 * (tokens + scores + token types), with their special ids. */
#include <stdlib.h>
#include <string.h>

#include "formats/gguf.h"
#include "tok_internal.h"

static tlm_status opt_id(const tlm_gguf *g, const char *key, int32_t n, int32_t *out) {
    int64_t v;
    tlm_status s = tlm_gguf_get_int(g, key, &v);
    if (s == TLM_ERR_RANGE) return TLM_OK; /* absent */
    if (s) return s;
    if (v == -1 || v == 0xFFFFFFFFll) return TLM_OK; /* "none" as some converters write it */
    if (v < 0 || v >= n)
        return tlm_err(TLM_ERR_FORMAT, "GGUF key '%s' = %lld is not a token id (vocabulary %ld)",
                       key, (long long)v, (long)n);
    *out = (int32_t)v;
    return TLM_OK;
}

tlm_status tok_load_gguf(const char *path, tlm_tokenizer **out) {
    *out = NULL;
    tlm_gguf *g;
    tlm_status s = tlm_gguf_open(path, &g);
    if (s) return s;
    const char **toks = NULL, **merges = NULL;
    size_t *tlens = NULL, *mlens = NULL;
    int32_t *types = NULL;
    float *scores = NULL;
    tlm_tokenizer *t = NULL;
    const char *model;
    size_t ml;
    const tlm_gguf_kv *tk, *tt = NULL;
    s = tlm_gguf_get_str(g, "tokenizer.ggml.model", &model, &ml);
    if (s == TLM_ERR_RANGE) {
        s = tlm_err(TLM_ERR_FORMAT, "'%s' has no vocabulary (no tokenizer.ggml.model)", path);
        goto done;
    }
    if (s || (s = tlm_gguf_get_array(g, "tokenizer.ggml.tokens", TLM_GGUF_STRING, &tk))) goto done;
    if (tk->len == 0 || tk->len > TOK_MAX_VOCAB) {
        s = tlm_err(TLM_ERR_FORMAT, "'%s': %llu tokens is out of range", path,
                    (unsigned long long)tk->len);
        goto done;
    }
    int32_t n = (int32_t)tk->len;
    toks = malloc((size_t)n * sizeof *toks);
    tlens = malloc((size_t)n * sizeof *tlens);
    if (!toks || !tlens) {
        s = tlm_err(TLM_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int32_t i = 0; i < n; i++) tlm_gguf_arr_str(tk, (uint64_t)i, &toks[i], &tlens[i]);
    tlm_status ts = tlm_gguf_get_array(g, "tokenizer.ggml.token_type", TLM_GGUF_I64, &tt);
    if (ts == TLM_OK) {
        if (tt->len != (uint64_t)n) {
            s = tlm_err(TLM_ERR_FORMAT, "'%s': %llu token types for %ld tokens", path,
                        (unsigned long long)tt->len, (long)n);
            goto done;
        }
        types = malloc((size_t)n * sizeof *types);
        if (!types) {
            s = tlm_err(TLM_ERR_NOMEM, "out of memory");
            goto done;
        }
        for (int32_t i = 0; i < n; i++) {
            int64_t v = 0;
            tlm_gguf_arr_int(tt, (uint64_t)i, &v);
            types[i] = (int32_t)v;
        }
    } else if (ts != TLM_ERR_RANGE) {
        s = ts;
        goto done;
    }
    if (ml == 4 && !memcmp(model, "gpt2", 4)) {
        const char *pre;
        size_t pl;
        tlm_status ps = tlm_gguf_get_str(g, "tokenizer.ggml.pre", &pre, &pl);
        if (ps == TLM_OK && !(pl == 5 && !memcmp(pre, "gpt-2", 5)) &&
            !(pl == 7 && !memcmp(pre, "default", 7))) {
            s = tlm_err(TLM_ERR_UNSUPPORTED,
                        "'%s': pre-tokenizer '%.*s' is not supported (only GPT-2's pattern)", path,
                        (int)(pl > 40 ? 40 : pl), pre);
            goto done;
        }
        const tlm_gguf_kv *mk;
        if ((s = tlm_gguf_get_array(g, "tokenizer.ggml.merges", TLM_GGUF_STRING, &mk))) goto done;
        if (mk->len > INT32_MAX) {
            s = tlm_err(TLM_ERR_FORMAT, "'%s': too many merges", path);
            goto done;
        }
        merges = malloc(((size_t)mk->len + 1) * sizeof *merges);
        mlens = malloc(((size_t)mk->len + 1) * sizeof *mlens);
        if (!merges || !mlens) {
            s = tlm_err(TLM_ERR_NOMEM, "out of memory");
            goto done;
        }
        for (uint64_t i = 0; i < mk->len; i++) tlm_gguf_arr_str(mk, i, &merges[i], &mlens[i]);
        s = tok_build_bpe(toks, tlens, n, merges, mlens, (int32_t)mk->len, types, &t);
        if (s) goto done;
        t->bos = t->eos = -1;
    } else if (ml == 5 && !memcmp(model, "llama", 5)) {
        const tlm_gguf_kv *sk;
        if ((s = tlm_gguf_get_array(g, "tokenizer.ggml.scores", TLM_GGUF_F64, &sk))) goto done;
        if (sk->len != (uint64_t)n) {
            s = tlm_err(TLM_ERR_FORMAT, "'%s': %llu scores for %ld tokens", path,
                        (unsigned long long)sk->len, (long)n);
            goto done;
        }
        scores = malloc((size_t)n * sizeof *scores);
        if (!scores) {
            s = tlm_err(TLM_ERR_NOMEM, "out of memory");
            goto done;
        }
        for (int32_t i = 0; i < n; i++) {
            double v = 0;
            tlm_gguf_arr_float(sk, (uint64_t)i, &v);
            scores[i] = (float)v;
        }
        if ((s = tok_build_spm(toks, tlens, scores, n, types, 1, &t))) goto done;
        int prefix = 1;
        tlm_status ps = tlm_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &prefix);
        if (ps && ps != TLM_ERR_RANGE) {
            s = ps;
            goto done;
        }
        t->add_prefix = prefix;
        if ((s = opt_id(g, "tokenizer.ggml.unknown_token_id", n, &t->unk))) goto done;
    } else {
        s = tlm_err(TLM_ERR_UNSUPPORTED,
                    "'%s': tokenizer model '%.*s' is not supported (gpt2 and llama are)", path,
                    (int)(ml > 40 ? 40 : ml), model);
        goto done;
    }
    if ((s = opt_id(g, "tokenizer.ggml.bos_token_id", n, &t->bos)) ||
        (s = opt_id(g, "tokenizer.ggml.eos_token_id", n, &t->eos)))
        goto done;
done:
    if (s) {
        tlm_err_context(s, "loading the vocabulary of '%s'", path);
        tlm_tokenizer_free(t);
        t = NULL;
    }
    *out = t;
    free(toks);
    free(tlens);
    free(merges);
    free(mlens);
    free(types);
    free(scores);
    tlm_gguf_close(g);
    return s;
}
