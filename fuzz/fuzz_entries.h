/* What each libFuzzer target does with one input, shared by the targets (fuzz/fuzz_<name>.c) and
 * by tests/test_fuzz_corpus.c, which replays every committed corpus file through the same
 * functions under make test and make asan. Each returns 1 when the input loaded, 0 when it was
 * refused (the test requires seeds to load; crash-* reproducers may do either).
 *
 * The two top-level targets take the first byte as the format and the rest as its bytes; inputs
 * made of several files (a Hugging Face directory, a tokenizer directory) are split at
 * FUZZ_SPLIT, the last file taking whatever follows the last split. */
#ifndef TLM_FUZZ_ENTRIES_H
#define TLM_FUZZ_ENTRIES_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "formats/formats.h"
#include "formats/lora.h"
#include "fuzz_common.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "serve/serve.h"
#include "tlm.h"
#include "tokenizer/tok_internal.h"
#include "train/train.h"

#define FUZZ_SPLIT "<<tlm-fuzz-split>>"
#define FUZZ_MAX_FILES 4

/* Cuts data at the first n - 1 FUZZ_SPLITs into parts (missing ones are empty). */
static inline void fuzz_split(const uint8_t *data, size_t size, int n, const uint8_t **part,
                              size_t *len) {
    const size_t m = sizeof FUZZ_SPLIT - 1;
    size_t start = 0, i = 0;
    int k = 0;
    while (k < n - 1 && i + m <= size) {
        if (memcmp(data + i, FUZZ_SPLIT, m) == 0) {
            part[k] = data + start;
            len[k++] = i - start;
            i += m;
            start = i;
        } else {
            i++;
        }
    }
    part[k] = data + start;
    len[k++] = size - start;
    for (; k < n; k++) part[k] = data + size, len[k] = 0;
}

/* Writes the parts as the named files of a fresh per-process directory, returned. */
static inline const char *fuzz_dir(const char *const *names, int n, const uint8_t *data,
                                   size_t size) {
    static char dir[128];
    const uint8_t *part[FUZZ_MAX_FILES];
    size_t len[FUZZ_MAX_FILES];
    snprintf(dir, sizeof dir, "/tmp/tlm_fuzz_%ld_dir", (long)getpid());
    if (mkdir(dir, 0700) != 0 && access(dir, W_OK) != 0) abort();
    fuzz_split(data, size, n, part, len);
    for (int i = 0; i < n; i++) {
        char p[256];
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        FILE *f = fopen(p, "wb");
        if (!f || (len[i] && fwrite(part[i], 1, len[i], f) != len[i])) abort();
        fclose(f);
    }
    return dir;
}

static inline void fuzz_dir_remove(const char *dir, const char *const *names, int n) {
    for (int i = 0; i < n; i++) {
        char p[256];
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        remove(p);
    }
    rmdir(dir);
}

/* ---- top-level entry points ------------------------------------------------------------- */

/* tlm_model_load on every model format; a model that loads runs one token through a session. */
static inline int fuzz_model_load(const uint8_t *data, size_t size) {
    static const char *const hf[] = {"config.json", "model.safetensors"};
    static const char *const sharded[] = {"config.json", "model.safetensors.index.json",
                                          "model-00001-of-00002.safetensors",
                                          "model-00002-of-00002.safetensors"};
    static const char *const tlm_dir[] = {"model.safetensors"};
    if (size < 1) return 0;
    unsigned kind = data[0] % 6;
    data++, size--;
    const char *const *names = NULL;
    int n = 0;
    const char *path;
    switch (kind) {
    case 0: path = fuzz_file(".gguf", data, size); break;
    case 1: path = fuzz_file(".bin", data, size); break;
    case 2: path = fuzz_file(".safetensors", data, size); break;
    case 3: names = hf, n = 2; break;
    case 4: names = sharded, n = 4; break;
    default: names = tlm_dir, n = 1; break;
    }
    if (names) path = fuzz_dir(names, n, data, size);
    tlm_model *m = NULL;
    int ok = tlm_model_load(path, 0, &m) == TLM_OK;
    if (ok) {
        tlm_session *s = NULL;
        if (tlm_session_new(m, &(tlm_session_opts){.batch = 1, .capacity = 1}, &s) == TLM_OK) {
            int32_t id = 0;
            tlm_session_prefill(s, 0, &id, 1, NULL, 0);
            tlm_session_free(s);
        }
        tlm_model_free(m);
    }
    if (names)
        fuzz_dir_remove(path, names, n);
    else
        remove(path);
    return ok;
}

/* Encodes and decodes a text that has specials, multi-byte and invalid UTF-8 in it, whole and
 * through the streaming decoder. */
static inline void fuzz_exercise_tokenizer(const tlm_tokenizer *t) {
    static const char text[] = "Hello world, it's 2024! <|endoftext|><s></s> caf\xC3\xA9 "
                               "\xE2\x96\x81\xF0\x9F\x98\x80 \xFF\xC3 x\n\n  ";
    unsigned flags =
        TLM_ENCODE_ALLOW_SPECIAL | (tlm_tokenizer_bos(t) >= 0 ? TLM_ENCODE_ADD_BOS : 0);
    int32_t *ids = NULL;
    size_t n = 0;
    if (tlm_tokenizer_encode(t, text, sizeof text - 1, flags, &ids, &n) == TLM_OK) {
        char *out = NULL;
        size_t len = 0;
        if (tlm_tokenizer_decode(t, ids, n, 0, &out, &len) == TLM_OK) free(out);
        if (tlm_tokenizer_decode(t, ids, n, TLM_DECODE_SKIP_SPECIAL, &out, &len) == TLM_OK)
            free(out);
        tlm_decoder *d = NULL;
        if (tlm_decoder_new(t, 0, &d) == TLM_OK) {
            const char *b;
            size_t bl;
            for (size_t i = 0; i < n; i++) tlm_decoder_push(d, ids[i], &b, &bl);
            tlm_decoder_flush(d, &b, &bl);
            tlm_decoder_free(d);
        }
        free(ids);
    }
    /* the last token's own bytes find it back (or an earlier id with the same piece) */
    const char *p;
    size_t pl;
    int32_t last = tlm_tokenizer_vocab_size(t) - 1;
    if (tlm_tokenizer_piece(t, last, &p, &pl) == TLM_OK) tlm_tokenizer_find(t, p, pl);
}

/* tlm_tokenizer_load on every tokenizer format, then fuzz_exercise_tokenizer. */
static inline int fuzz_tokenizer_load(const uint8_t *data, size_t size) {
    static const char *const gpt2[] = {"encoder.json", "vocab.bpe"};
    static const char *const tlm_bpe[] = {"tokenizer.json", "encoder.json", "vocab.bpe"};
    static const char *const tlm_spm[] = {"tokenizer.json", "tokenizer.bin"};
    static const char *const tlm_char[] = {"tokenizer.json"};
    if (size < 1) return 0;
    unsigned kind = data[0] % 6;
    data++, size--;
    const char *const *names = NULL;
    int n = 0;
    const char *path = NULL;
    switch (kind) {
    case 0: path = fuzz_file(".gguf", data, size); break;
    case 1: path = fuzz_file(".bin", data, size); break;
    case 2: names = gpt2, n = 2; break;
    case 3: names = tlm_bpe, n = 3; break;
    case 4: names = tlm_spm, n = 2; break;
    default: names = tlm_char, n = 1; break;
    }
    if (names) path = fuzz_dir(names, n, data, size);
    tlm_tokenizer *t = NULL;
    int ok = tlm_tokenizer_load(path, &t) == TLM_OK;
    if (ok) {
        fuzz_exercise_tokenizer(t);
        tlm_tokenizer_free(t);
    }
    if (names)
        fuzz_dir_remove(path, names, n);
    else
        remove(path);
    return ok;
}

/* ---- single-reader entry points --------------------------------------------------------- */

/* Importance matrices: llama-imatrix's GGUF layout or its legacy .dat one, then every entry read
 * back through the lookup the quantizer uses. */
static inline int fuzz_imatrix(const uint8_t *data, size_t size) {
    const char *p = fuzz_file(".imatrix", data, size);
    tlm_imatrix *im = NULL;
    int ok = tlm_imatrix_load(p, &im) == TLM_OK;
    if (ok) {
        static const char *const names[] = {"blk.0.attn_q.weight", "blk.0.ffn_down.weight",
                                            "output.weight"};
        float sum = 0;
        for (int i = 0; i < 3; i++) {
            size_t n = 0;
            const float *w = tlm_imatrix_find(im, names[i], &n);
            for (size_t j = 0; w && j < n; j++) sum += w[j];
        }
        ok += sum != sum; /* every value read (the loader refuses non-finite ones: adds 0) */
        (void)tlm_imatrix_entries(im);
        (void)tlm_imatrix_dataset(im);
        /* --show-statistics's figures and the entry filters on whatever was read */
        tlm_imatrix_stat *st = NULL;
        int ns = 0;
        if (tlm_imatrix_statistics(im, 512, &st, &ns) == TLM_OK) {
            for (int i = 0; i < ns; i++) ok += st[i].elements < 0;
            free(st);
        }
        static const char *const words[] = {"ffn"};
        tlm_imatrix_filter(im, words, 1, 0);
        (void)tlm_imatrix_find(im, names[1], NULL);
        tlm_imatrix_free(im);
    }
    remove(p);
    return ok;
}

/* GGUF: the general reader, then the llama model loader and the vocabulary loader on top. */
static inline int fuzz_gguf(const uint8_t *data, size_t size) {
    io_gguf *g = NULL;
    if (io_gguf_open_memory(data, size, "fuzz.gguf", &g) != TLM_OK) return 0;
    tlm_model *m = NULL;
    if (fmt_gguf_load_model(g, "fuzz.gguf", 0, &m) == TLM_OK) tlm_model_free(m);
    io_gguf_close(g);
    /* the vocabulary loader reads from a path */
    const char *p = fuzz_file(".gguf", data, size);
    tlm_tokenizer *t = NULL;
    if (tlm_tokenizer_load(p, &t) == TLM_OK) tlm_tokenizer_free(t);
    remove(p);
    return 1;
}

/* safetensors header parsing and float conversion of every tensor. */
static inline int fuzz_safetensors(const uint8_t *data, size_t size) {
    const char *p = fuzz_file(".safetensors", data, size);
    io_st_file f;
    int ok = io_st_open(&f, p) == TLM_OK;
    if (ok) {
        for (int i = 0; i < f.n; i++) {
            const io_st_tensor *t = &f.tensors[i];
            if (t->numel > (1u << 20)) continue;
            float *buf = malloc((t->numel ? t->numel : 1) * sizeof(float));
            io_st_read_f32(&f, t, buf, t->numel);
            free(buf);
        }
        io_st_find(&f, "token_embd.weight");
        io_st_meta(&f, "tlm_config");
        io_st_close(&f);
    }
    remove(p);
    return ok;
}

/* llama2.c model files (legacy and v1 headers). */
static inline int fuzz_llama2c(const uint8_t *data, size_t size) {
    const char *p = fuzz_file(".bin", data, size);
    tlm_model *m = NULL;
    int ok = tlm_model_load_llama2c(p, &m) == TLM_OK;
    tlm_model_free(m);
    remove(p);
    return ok;
}

/* llama2.c tokenizer.bin, then encoding and decoding a fixed text with whatever loaded. */
static inline int fuzz_tokenizer_bin(const uint8_t *data, size_t size) {
    const char *p = fuzz_file(".bin", data, size);
    tlm_tokenizer *t = NULL;
    int ok = tok_load_llama2c(p, &t) == TLM_OK;
    if (ok) {
        const char *text = "Once upon a time \xE2\x96\x81 caf\xC3\xA9 \xFF!";
        int32_t *ids = NULL;
        size_t n = 0;
        if (tlm_tokenizer_encode(t, text, strlen(text), 0, &ids, &n) == TLM_OK) {
            char *out = NULL;
            size_t len = 0;
            if (tlm_tokenizer_decode(t, ids, n, 0, &out, &len) == TLM_OK) free(out);
            free(ids);
        }
        tlm_tokenizer_free(t);
    }
    remove(p);
    return ok;
}

/* GPT-2 encoder.json + vocab.bpe, split at the first NUL byte. */
static inline int fuzz_gpt2_bpe(const uint8_t *data, size_t size) {
    const uint8_t *z = memchr(data, 0, size);
    size_t a = z ? (size_t)(z - data) : size;
    const char *enc = fuzz_file(".json", data, a);
    const char *bpe = fuzz_file(".bpe", z ? z + 1 : data, z ? size - a - 1 : 0);
    tlm_tokenizer *t = NULL;
    int ok = tlm_tokenizer_load_gpt2(enc, bpe, &t) == TLM_OK;
    if (ok) {
        const char *text = "Hello world, it's 2024! \xC3\xA9\xF0\x9F\x98\x80 <|endoftext|>";
        int32_t *ids = NULL;
        size_t n = 0;
        if (tlm_tokenizer_encode(t, text, strlen(text), TLM_ENCODE_ALLOW_SPECIAL, &ids, &n) ==
            TLM_OK) {
            char *out = NULL;
            size_t len = 0;
            if (tlm_tokenizer_decode(t, ids, n, 0, &out, &len) == TLM_OK) free(out);
            free(ids);
        }
        tlm_tokenizer_free(t);
    }
    remove(enc);
    remove(bpe);
    return ok;
}

/* tlm serve's request parser: the first byte modulo 3 picks the shape (completions, chat,
 * llama-server's /completion); a parsed chat is rendered through every template, with its tools
 * in their messages (Hermes and Llama 3.1) and in Mistral's whole prompt. The same bytes are read
 * as a model's answer for tool calls in the three formats and as an embeddings body. */
static inline int fuzz_request(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    srv_tool_parse tp;
    srv_tools_parse((const char *)data + 1, size - 1, 1, &tp);
    srv_tool_parse_free(&tp);
    srv_tools_parse_as(SRV_TOOLFMT_LLAMA3, (const char *)data + 1, size - 1, 1, &tp);
    srv_tool_parse_free(&tp);
    srv_tools_parse_as(SRV_TOOLFMT_MISTRAL, (const char *)data + 1, size - 1, 1, &tp);
    srv_tool_parse_free(&tp);
    srv_embed_request er;
    srv_error ee;
    if (!srv_embed_parse((const char *)data + 1, size - 1, data[0] & 1, 2, &er, &ee))
        srv_embed_request_free(&er);
    srv_request r;
    srv_error e;
    if (srv_request_parse((const char *)data + 1, size - 1, data[0] % 3, &r, &e)) return 0;
    srv_message *tm = NULL;
    int tn = 0;
    if (r.chat && !srv_tools_messages(&r, &tm, &tn, &e)) srv_messages_free(tm, tn);
    if (r.chat && !srv_tools_set_format(&r, SRV_TOOLFMT_LLAMA3, &e) &&
        !srv_tools_messages(&r, &tm, &tn, &e))
        srv_messages_free(tm, tn);
    char *mp = NULL;
    if (r.chat && !srv_tools_set_format(&r, SRV_TOOLFMT_MISTRAL, &e) &&
        !srv_tools_prompt(&r, &mp, &e))
        free(mp);
    for (int t = 0; r.chat && t < TLM_CHAT_COUNT; t++) {
        char *out = NULL;
        if (srv_template_apply((tlm_chat_template)t, r.messages, r.n_messages, &out) == TLM_OK)
            free(out);
    }
    srv_request_free(&r);
    return 1;
}

/* Instruction data (tlm_examples_load) over arbitrary JSON Lines, with a character vocabulary of
 * printable ASCII and newline. The first byte picks the options (format, loss-on, template,
 * skip-bad, truncation end, packing, max_len); what loads is split and laid out in rows, which are
 * drawn as a trainer draws them. */
static inline int fuzz_examples(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    char alphabet[128];
    int k = 0;
    for (int c = 32; c < 127; c++) alphabet[k++] = (char)c;
    alphabet[k++] = '\n';
    tlm_tokenizer *tok = NULL;
    if (tlm_tokenizer_new_char(alphabet, (size_t)k, &tok)) return 0;
    uint8_t o0 = data[0];
    tlm_examples_opts o;
    tlm_examples_opts_defaults(&o);
    o.format = (tlm_data_format)(o0 % 5);
    o.loss_on = (tlm_loss_on)((o0 / 5) % 4);
    o.chat_template = tlm_chat_template_name((tlm_chat_template)((o0 / 20) % TLM_CHAT_COUNT));
    o.skip_bad = (o0 >> 7) & 1;
    o.truncate_keep_end = (o0 >> 6) & 1;
    o.max_len = 8 + (int)(o0 % 57);
    const char *p = fuzz_file(".jsonl", data + 1, size - 1);
    tlm_examples *e = NULL, *tail = NULL;
    tlm_examples_stats st;
    int ok = tlm_examples_load(p, tok, &o, &e, &st) == TLM_OK;
    if (ok && tlm_examples_split(e, 0.5, &tail) == TLM_OK) {
        int32_t ids[4 * 64], tg[4 * 64], pos[4 * 64];
        uint32_t ex[4];
        for (int pack = 0; pack <= 1; pack++) {
            trn_plan plan;
            if (trn_plan_make(e, 64, pack, &plan)) continue;
            int T;
            long tokens, counted;
            for (uint64_t first = 0; first < 12; first += 4)
                if (!trn_plan_rows(&plan, 7, 1, first, 4, ids, tg, pos, &T, &tokens, &counted))
                    (void)trn_plan_row_examples(&plan, 7, 1, first, 4, ex);
            trn_plan_free(&plan);
        }
    }
    tlm_examples_free(tail);
    tlm_examples_free(e);
    tlm_tokenizer_free(tok);
    remove(p);
    return ok;
}

/* LoRA adapters in llama.cpp's GGUF form: read and validated, then their q/k rows moved to the
 * other RoPE order and back, and the scale computed (what tlm_lora_load does before binding). */
static inline int fuzz_lora(const uint8_t *data, size_t size) {
    const char *p = fuzz_file(".gguf", data, size);
    fmt_lora a;
    int ok = fmt_lora_read_gguf(p, &a) == TLM_OK;
    if (ok) {
        (void)fmt_lora_scale(&a);
        if (fmt_lora_set_qk_order(&a, !a.qk_interleaved, 8) == TLM_OK)
            (void)fmt_lora_set_qk_order(&a, !a.qk_interleaved, 8);
        fmt_lora_free(&a);
    }
    unlink(p);
    return ok;
}

/* Structured output's untrusted inputs (a request's grammar or schema): the first byte picks GBNF
 * (even) or JSON Schema (odd); the text runs to FUZZ_SPLIT, and what follows is fed to the
 * grammar as generated text, through a character vocabulary's masks and then as bytes. */
static inline int fuzz_grammar(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const uint8_t *part[2];
    size_t len[2];
    fuzz_split(data + 1, size - 1, 2, part, len);
    const char *text = (const char *)part[0], *in = (const char *)part[1];
    size_t tlen = len[0], in_len = len[1] < 256 ? len[1] : 256;
    tlm_grammar *g = NULL;
    tlm_status s = data[0] & 1 ? tlm_grammar_from_json_schema(text, tlen, &g)
                               : tlm_grammar_parse(text, tlen, &g);
    if (s) return 0;
    char alphabet[96];
    int k = 0;
    for (int c = 32; c < 127; c++) alphabet[k++] = (char)c;
    alphabet[k++] = '\n';
    tlm_tokenizer *tok = NULL;
    tlm_grammar_vocab *v = NULL;
    tlm_grammar_state *st = NULL;
    if (!tlm_tokenizer_new_char(alphabet, (size_t)k, &tok) &&
        !tlm_grammar_vocab_new(tok, tlm_tokenizer_vocab_size(tok) + 2, &v) &&
        !tlm_grammar_state_new(g, v, &st)) {
        int n = tlm_tokenizer_vocab_size(tok) + 2;
        float *logits = calloc((size_t)n, sizeof *logits);
        /* a token at a time: the masks must allow exactly what accept takes */
        for (size_t i = 0; logits && i < in_len / 2; i++) {
            int32_t id = (int32_t)(uint8_t)in[i] % n;
            memset(logits, 0, (size_t)n * sizeof *logits);
            if (tlm_grammar_state_mask(st, logits, n, NULL)) break;
            tlm_status a = tlm_grammar_state_accept(st, id);
            if ((a == TLM_OK) != (logits[id] == 0.0f)) abort();
        }
        tlm_grammar_state_reset(st);
        (void)tlm_grammar_state_accept_bytes(st, in + in_len / 2, in_len - in_len / 2);
        (void)tlm_grammar_state_complete(st);
        free(logits);
    }
    tlm_grammar_state_free(st);
    tlm_grammar_vocab_free(v);
    tlm_tokenizer_free(tok);
    tlm_grammar_free(g);
    return 1;
}

#endif
