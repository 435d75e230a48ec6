/* Vocabularies inside GGUF files: tokenizer.ggml.model "gpt2" (tokens + merges) or "llama"
 * (tokens + scores + token types), with their special ids; reading, and writing for the model
 * writers (tok_gguf.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/gguf.h"
#include "tok_gguf.h"
#include "tok_internal.h"

int tok_pre_named(const char *p, size_t n, int *type, int *merge_known) {
    static const struct {
        const char *name;
        int type, merge_known;
    } known[] = {{"gpt-2", TOK_PRE_GPT2, 0},       {"default", TOK_PRE_GPT2, 0},
                 {"llama-bpe", TOK_PRE_LLAMA3, 0}, {"llama3", TOK_PRE_LLAMA3, 0},
                 {"llama-v3", TOK_PRE_LLAMA3, 0},  {"falcon3", TOK_PRE_LLAMA3, 0},
                 {"qwen2", TOK_PRE_QWEN2, 1},      {"deepseek-r1-qwen", TOK_PRE_QWEN2, 1}};
    for (size_t k = 0; k < sizeof known / sizeof *known; k++)
        if (strlen(known[k].name) == n && !memcmp(known[k].name, p, n)) {
            *type = known[k].type;
            *merge_known = known[k].merge_known;
            return 1;
        }
    return 0;
}

const char *tok_pre_name(int type) {
    return type == TOK_PRE_LLAMA3 ? "llama-bpe" : type == TOK_PRE_QWEN2 ? "qwen2" : "gpt-2";
}

static tlm_status opt_id(const io_gguf *g, const char *key, int32_t n, int32_t *out) {
    int64_t v;
    tlm_status s = io_gguf_get_int(g, key, &v);
    if (s == TLM_ERR_RANGE) return TLM_OK; /* absent */
    if (s) return s;
    if (v == -1 || v == 0xFFFFFFFFll) return TLM_OK; /* "none" as some converters write it */
    if (v < 0 || v >= n)
        return core_err(TLM_ERR_FORMAT, "GGUF key '%s' = %lld is not a token id (vocabulary %ld)",
                        key, (long long)v, (long)n);
    *out = (int32_t)v;
    return TLM_OK;
}

tlm_status tok_load_gguf(const char *path, tlm_tokenizer **out) {
    *out = NULL;
    io_gguf *g;
    tlm_status s = io_gguf_open(path, &g);
    if (s) return s;
    const char **toks = NULL, **merges = NULL;
    size_t *tlens = NULL, *mlens = NULL;
    int32_t *types = NULL;
    float *scores = NULL;
    tlm_tokenizer *t = NULL;
    const char *model;
    size_t ml;
    const io_gguf_kv *tk, *tt = NULL;
    s = io_gguf_get_str(g, "tokenizer.ggml.model", &model, &ml);
    if (s == TLM_ERR_RANGE) {
        s = core_err(TLM_ERR_FORMAT, "'%s' has no vocabulary (no tokenizer.ggml.model)", path);
        goto done;
    }
    if (s || (s = io_gguf_get_array(g, "tokenizer.ggml.tokens", IO_GGUF_STRING, &tk))) goto done;
    if (tk->len == 0 || tk->len > TOK_MAX_VOCAB) {
        s = core_err(TLM_ERR_FORMAT, "'%s': %llu tokens is out of range", path,
                     (unsigned long long)tk->len);
        goto done;
    }
    int32_t n = (int32_t)tk->len;
    toks = malloc((size_t)n * sizeof *toks);
    tlens = malloc((size_t)n * sizeof *tlens);
    if (!toks || !tlens) {
        s = core_err(TLM_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int32_t i = 0; i < n; i++) io_gguf_arr_str(tk, (uint64_t)i, &toks[i], &tlens[i]);
    tlm_status ts = io_gguf_get_array(g, "tokenizer.ggml.token_type", IO_GGUF_I64, &tt);
    if (ts == TLM_OK) {
        if (tt->len != (uint64_t)n) {
            s = core_err(TLM_ERR_FORMAT, "'%s': %llu token types for %ld tokens", path,
                         (unsigned long long)tt->len, (long)n);
            goto done;
        }
        types = malloc((size_t)n * sizeof *types);
        if (!types) {
            s = core_err(TLM_ERR_NOMEM, "out of memory");
            goto done;
        }
        for (int32_t i = 0; i < n; i++) {
            int64_t v = 0;
            io_gguf_arr_int(tt, (uint64_t)i, &v);
            types[i] = (int32_t)v;
        }
    } else if (ts != TLM_ERR_RANGE) {
        s = ts;
        goto done;
    }
    if (ml == 4 && !memcmp(model, "gpt2", 4)) {
        const char *pre;
        size_t pl;
        tlm_status ps = io_gguf_get_str(g, "tokenizer.ggml.pre", &pre, &pl);
        int pre_type = TOK_PRE_GPT2, merge_known = 0;
        if (ps == TLM_OK && !tok_pre_named(pre, pl, &pre_type, &merge_known)) {
            s = core_err(TLM_ERR_UNSUPPORTED,
                         "'%s': pre-tokenizer '%.*s' is not supported (GPT-2's, Llama 3's: "
                         "llama-bpe, llama3; Qwen2's: qwen2)",
                         path, (int)(pl > 40 ? 40 : pl), pre);
            goto done;
        }
        const io_gguf_kv *mk;
        if ((s = io_gguf_get_array(g, "tokenizer.ggml.merges", IO_GGUF_STRING, &mk))) goto done;
        if (mk->len > INT32_MAX) {
            s = core_err(TLM_ERR_FORMAT, "'%s': too many merges", path);
            goto done;
        }
        merges = malloc(((size_t)mk->len + 1) * sizeof *merges);
        mlens = malloc(((size_t)mk->len + 1) * sizeof *mlens);
        if (!merges || !mlens) {
            s = core_err(TLM_ERR_NOMEM, "out of memory");
            goto done;
        }
        for (uint64_t i = 0; i < mk->len; i++) io_gguf_arr_str(mk, i, &merges[i], &mlens[i]);
        s = tok_build_bpe(toks, tlens, n, merges, mlens, (int32_t)mk->len, types, &t);
        if (s) goto done;
        t->bos = t->eos = -1;
        t->pre = pre_type;
        t->merge_known = merge_known;
    } else if (ml == 5 && !memcmp(model, "llama", 5)) {
        const io_gguf_kv *sk;
        if ((s = io_gguf_get_array(g, "tokenizer.ggml.scores", IO_GGUF_F64, &sk))) goto done;
        if (sk->len != (uint64_t)n) {
            s = core_err(TLM_ERR_FORMAT, "'%s': %llu scores for %ld tokens", path,
                         (unsigned long long)sk->len, (long)n);
            goto done;
        }
        scores = malloc((size_t)n * sizeof *scores);
        if (!scores) {
            s = core_err(TLM_ERR_NOMEM, "out of memory");
            goto done;
        }
        for (int32_t i = 0; i < n; i++) {
            double v = 0;
            io_gguf_arr_float(sk, (uint64_t)i, &v);
            scores[i] = (float)v;
        }
        if ((s = tok_build_spm(toks, tlens, scores, n, types, 1, &t))) goto done;
        int prefix = 1;
        tlm_status ps = io_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &prefix);
        if (ps && ps != TLM_ERR_RANGE) {
            s = ps;
            goto done;
        }
        t->add_prefix = prefix;
        if ((s = opt_id(g, "tokenizer.ggml.unknown_token_id", n, &t->unk))) goto done;
    } else {
        s = core_err(TLM_ERR_UNSUPPORTED,
                     "'%s': tokenizer model '%.*s' is not supported (gpt2 and llama are)", path,
                     (int)(ml > 40 ? 40 : ml), model);
        goto done;
    }
    if ((s = opt_id(g, "tokenizer.ggml.bos_token_id", n, &t->bos)) ||
        (s = opt_id(g, "tokenizer.ggml.eos_token_id", n, &t->eos)) ||
        (s = opt_id(g, "tokenizer.ggml.eot_token_id", n, &t->eot)) ||
        (s = opt_id(g, "tokenizer.ggml.eom_token_id", n, &t->eom)))
        goto done;
    {
        int add = 0;
        tlm_status bs = io_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add);
        if (bs && bs != TLM_ERR_RANGE) {
            s = bs;
            goto done;
        }
        /* llama.cpp's defaults where the key is missing: on for Llama 3's vocabularies */
        if (!bs)
            t->add_bos = add;
        else if (t->kind == TLM_TOKENIZER_BPE && t->pre == TOK_PRE_LLAMA3)
            t->add_bos = 1;
    }
done:
    if (s) {
        core_err_context(s, "loading the vocabulary of '%s'", path);
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
    io_gguf_close(g);
    return s;
}

/* GGUF token types (llama.cpp's llama_token_type). */
enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER = 4, TT_UNUSED = 5, TT_BYTE = 6 };

tlm_status tok_gguf_write_vocab(io_gguf_writer *w, const tlm_tokenizer *t) {
    int32_t n = t->n;
    tok_bytes tmp = {0};
    tlm_status s = TLM_OK;
    int spm = t->kind == TLM_TOKENIZER_SPM;
    if (t->kind == TLM_TOKENIZER_CHAR)
        return core_err(TLM_ERR_UNSUPPORTED,
                        "GGUF has no char-level vocabulary type (use a BPE tokenizer)");
    io_gguf_write_str(w, "tokenizer.ggml.model", spm ? "llama" : "gpt2");
    if (!spm) io_gguf_write_str(w, "tokenizer.ggml.pre", tok_pre_name(t->pre));
    s = io_gguf_write_array(w, "tokenizer.ggml.tokens", IO_GGUF_STRING, (uint64_t)n);
    for (int32_t i = 0; i < n && !s; i++) {
        size_t len;
        const uint8_t *p = tok_piece(t, i, &len);
        tmp.n = 0;
        if (t->attr[i] == TOK_SPECIAL) {
            s = tok_bytes_put(&tmp, p, len);
        } else if (spm && t->attr[i] == TOK_BYTE) {
            char hex[8];
            snprintf(hex, sizeof hex, "<0x%02X>", p[0]);
            s = tok_bytes_put(&tmp, hex, 6);
        } else if (spm) {
            for (size_t k = 0; k < len && !s; k++)
                s = p[k] == ' ' ? tok_bytes_put(&tmp, "\xE2\x96\x81", 3)
                                : tok_bytes_put(&tmp, p + k, 1);
        } else {
            s = tok_gpt2_map(&tmp, p, len);
        }
        if (!s) s = io_gguf_write_elem_str(w, tmp.p, tmp.n);
    }
    if (spm && !s) {
        s = io_gguf_write_array(w, "tokenizer.ggml.scores", IO_GGUF_F32, (uint64_t)n);
        for (int32_t i = 0; i < n && !s; i++)
            s = io_gguf_write_elem_f32(w, t->scores ? t->scores[i] : 0.0f);
    }
    if (!s) s = io_gguf_write_array(w, "tokenizer.ggml.token_type", IO_GGUF_I32, (uint64_t)n);
    for (int32_t i = 0; i < n && !s; i++) {
        int32_t tt = TT_NORMAL;
        if (t->attr[i] == TOK_SPECIAL) tt = i == t->unk ? TT_UNKNOWN : TT_CONTROL;
        if (t->attr[i] == TOK_BYTE) tt = TT_BYTE;
        if (t->attr[i] == TOK_UNUSED) tt = TT_UNUSED;
        s = io_gguf_write_elem_i32(w, tt);
    }
    if (!spm && !s) {
        s = io_gguf_write_array(w, "tokenizer.ggml.merges", IO_GGUF_STRING, (uint64_t)t->n_merges);
        for (int32_t r = 0; r < t->n_merges && !s; r++) {
            size_t la, lb;
            const uint8_t *pa = tok_piece(t, t->merge_list[r][0], &la);
            const uint8_t *pb = tok_piece(t, t->merge_list[r][1], &lb);
            tmp.n = 0;
            s = tok_gpt2_map(&tmp, pa, la);
            if (!s) s = tok_bytes_put(&tmp, " ", 1);
            if (!s) s = tok_gpt2_map(&tmp, pb, lb);
            if (!s) s = io_gguf_write_elem_str(w, tmp.p, tmp.n);
        }
    }
    free(tmp.p);
    if (s) return s;
    if (t->bos >= 0) io_gguf_write_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)t->bos);
    if (t->eos >= 0) io_gguf_write_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)t->eos);
    if (t->unk >= 0) io_gguf_write_u32(w, "tokenizer.ggml.unknown_token_id", (uint32_t)t->unk);
    if (t->eot >= 0) io_gguf_write_u32(w, "tokenizer.ggml.eot_token_id", (uint32_t)t->eot);
    if (t->eom >= 0) io_gguf_write_u32(w, "tokenizer.ggml.eom_token_id", (uint32_t)t->eom);
    /* SentencePiece models start from BOS, GPT-2's byte-level BPE does not, Llama 3's does. */
    io_gguf_write_bool(w, "tokenizer.ggml.add_bos_token", tlm_tokenizer_add_bos(t));
    return io_gguf_write_bool(w, "tokenizer.ggml.add_eos_token", 0);
}
