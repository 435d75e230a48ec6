/* Writing tlm tokenizer directories. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tok_internal.h"

tlm_status tok_json_string(tok_bytes *b, const uint8_t *p, size_t n) {
    tlm_status s = tok_bytes_put(b, "\"", 1);
    for (size_t i = 0; i < n && !s; i++) {
        uint8_t c = p[i];
        if (c == '"' || c == '\\') {
            uint8_t e[2] = {'\\', c};
            s = tok_bytes_put(b, e, 2);
        } else if (c < 0x20 || c == 0x7F) {
            char e[8];
            snprintf(e, sizeof e, "\\u%04x", c);
            s = tok_bytes_put(b, e, 6);
        } else {
            s = tok_bytes_put(b, &c, 1);
        }
    }
    if (!s) s = tok_bytes_put(b, "\"", 1);
    return s;
}

static tlm_status put_str(tok_bytes *b, const char *s) { return tok_bytes_put(b, s, strlen(s)); }

static tlm_status write_file(const char *dir, const char *name, const tok_bytes *b) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (!p) return core_err(TLM_ERR_NOMEM, "out of memory");
    snprintf(p, n, "%s/%s", dir, name);
    tlm_status s = core_write_file_atomic(p, b->p ? (const void *)b->p : "", b->n);
    free(p);
    return s;
}

static tlm_status save_bpe(const tlm_tokenizer *t, const char *dir, tok_bytes *meta) {
    tok_bytes e = {0}, v = {0};
    tlm_status s = put_str(&e, "{");
    for (int32_t i = 0; i < t->n && !s; i++) {
        size_t len;
        const uint8_t *p = tok_piece(t, i, &len);
        tok_bytes m = {0};
        s = tok_gpt2_map(&m, p, len);
        if (!s) s = put_str(&e, i ? ",\n" : "\n");
        if (!s) s = tok_json_string(&e, m.p ? m.p : (const uint8_t *)"", m.n);
        free(m.p);
        char num[32];
        snprintf(num, sizeof num, ": %ld", (long)i);
        if (!s) s = put_str(&e, num);
    }
    if (!s) s = put_str(&e, "\n}\n");
    if (!s) s = put_str(&v, "#version: 0.2\n");
    for (int32_t r = 0; r < t->n_merges && !s; r++) {
        for (int k = 0; k < 2 && !s; k++) {
            size_t len;
            const uint8_t *p = tok_piece(t, t->merge_list[r][k], &len);
            s = tok_gpt2_map(&v, p, len);
            if (!s) s = put_str(&v, k ? "\n" : " ");
        }
    }
    if (!s) s = put_str(meta, ", \"specials\": [");
    int first = 1;
    for (int32_t i = 0; i < t->n && !s; i++) {
        if (t->attr[i] != TOK_SPECIAL) continue;
        size_t len;
        const uint8_t *p = tok_piece(t, i, &len);
        if (!first) s = put_str(meta, ", ");
        if (!s) s = tok_json_string(meta, p, len);
        first = 0;
    }
    if (!s) s = put_str(meta, "]");
    if (!s) s = write_file(dir, "encoder.json", &e);
    if (!s) s = write_file(dir, "vocab.bpe", &v);
    free(e.p);
    free(v.p);
    return s;
}

static tlm_status save_spm(const tlm_tokenizer *t, const char *dir, tok_bytes *meta) {
    tok_bytes b = {0};
    uint32_t maxlen = (uint32_t)(t->max_piece < 6 ? 6 : t->max_piece + 2);
    tlm_status s = tok_bytes_put(&b, &maxlen, 4);
    if (!s) s = put_str(meta, ", \"token_types\": [");
    for (int32_t i = 0; i < t->n && !s; i++) {
        size_t len;
        const uint8_t *p = tok_piece(t, i, &len);
        char tmp[16];
        int type = 1;
        if (t->attr[i] == TOK_BYTE) {
            snprintf(tmp, sizeof tmp, "<0x%02X>", p[0]);
            p = (const uint8_t *)tmp;
            len = 6;
            type = 6;
        } else if (t->attr[i] == TOK_SPECIAL) {
            type = i == t->unk ? 2 : 3;
        } else if (t->attr[i] == TOK_UNUSED) {
            type = 5;
        }
        int32_t l = (int32_t)len;
        s = tok_bytes_put(&b, &t->scores[i], 4);
        if (!s) s = tok_bytes_put(&b, &l, 4);
        if (!s) s = tok_bytes_put(&b, p, len);
        snprintf(tmp, sizeof tmp, "%s%d", i ? "," : "", type);
        if (!s) s = put_str(meta, tmp);
    }
    if (!s) s = put_str(meta, "]");
    if (!s) s = write_file(dir, "tokenizer.bin", &b);
    free(b.p);
    return s;
}

static tlm_status save_char(const tlm_tokenizer *t, tok_bytes *meta) {
    tlm_status s = put_str(meta, ", \"chars\": [");
    for (int32_t i = 0; i < t->n && !s; i++) {
        size_t len;
        const uint8_t *p = tok_piece(t, i, &len);
        if (i) s = put_str(meta, ", ");
        if (s) break;
        if (len == 1 && p[0] >= 0x80) { /* not UTF-8 on its own: JSON cannot hold it as text */
            char num[8];
            snprintf(num, sizeof num, "%u", p[0]);
            s = put_str(meta, num);
        } else {
            s = tok_json_string(meta, p, len);
        }
    }
    if (!s) s = put_str(meta, "]");
    return s;
}

tlm_status tlm_tokenizer_save(const tlm_tokenizer *t, const char *dir) {
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return core_err(TLM_ERR_IO, "cannot create directory '%s': %s", dir, strerror(errno));
    tok_bytes meta = {0};
    char head[160];
    snprintf(head, sizeof head,
             "{\"type\": \"%s\", \"vocab_size\": %ld, \"bos\": %ld, \"eos\": %ld",
             tlm_tokenizer_kind_name(t->kind), (long)t->n, (long)t->bos, (long)t->eos);
    tlm_status s = put_str(&meta, head);
    /* Llama 3's and Qwen2's patterns, and a vocabulary's own word on BOS (absent: GPT-2's, and
     * BOS as the kind goes) */
    if (!s && t->kind == TLM_TOKENIZER_BPE && t->pre != TOK_PRE_GPT2) {
        snprintf(head, sizeof head, ", \"pre\": \"%s\"", tok_pre_name(t->pre));
        s = put_str(&meta, head);
    }
    if (!s && t->add_bos >= 0)
        s = put_str(&meta, t->add_bos ? ", \"add_bos\": true" : ", \"add_bos\": false");
    if (!s) {
        if (t->kind == TLM_TOKENIZER_BPE)
            s = save_bpe(t, dir, &meta);
        else if (t->kind == TLM_TOKENIZER_SPM)
            s = save_spm(t, dir, &meta);
        else
            s = save_char(t, &meta);
    }
    if (!s) s = put_str(&meta, "}\n");
    if (!s) s = write_file(dir, "tokenizer.json", &meta);
    free(meta.p);
    if (s) core_err_context(s, "saving tokenizer to '%s'", dir);
    return s;
}
