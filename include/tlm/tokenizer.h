/* tlm/tokenizer.h: tokenizers (byte-level BPE, SentencePiece-style, char-level): loading, encoding,
 * decoding, saving and training. Part of tlm.h, which is what programs include. */
#ifndef TLM_TOKENIZER_H
#define TLM_TOKENIZER_H

#include "base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One interface over every vocabulary kind: byte-level BPE (GPT-2 encoder.json + vocab.bpe, GGUF
 * `gpt2`, tlm-trained), SentencePiece-style (llama2.c tokenizer.bin, GGUF `llama`) and char-level.
 * Ids are int32. Decoding is lossless: decode(encode(x)) == x for any byte string (for vocabularies
 * that can represent every byte, which all but char-level can). Immutable once made: any number of
 * threads may share one. */
typedef struct tlm_tokenizer tlm_tokenizer;

typedef enum {
    TLM_TOKENIZER_BPE = 0, /* byte-level BPE, GPT-2 pre-tokenization, merges by rank */
    TLM_TOKENIZER_SPM,     /* scores, best-score merges, byte fallback, dummy-prefix space */
    TLM_TOKENIZER_CHAR     /* one id per distinct character of the training text */
} tlm_tokenizer_kind;

/* Flags of tlm_tokenizer_encode, or'ed. */
typedef enum {
    /* special tokens in the text are encoded atomically (longest match wins); otherwise they are
     * plain text */
    TLM_ENCODE_ALLOW_SPECIAL = 1,
    TLM_ENCODE_ADD_BOS = 2, /* prepend BOS (error if the vocabulary has none) */
    TLM_ENCODE_ADD_EOS = 4  /* append EOS (error if the vocabulary has none) */
} tlm_encode_flags;
/* Flags of tlm_tokenizer_decode and tlm_decoder_new. */
typedef enum {
    TLM_DECODE_SKIP_SPECIAL = 1 /* special tokens (BOS, EOS, <|endoftext|> ...) produce nothing */
} tlm_decode_flags;

/* Largest text tlm_tokenizer_encode accepts, in bytes. */
#define TLM_TOKENIZER_MAX_INPUT ((size_t)0x7FFFFFFF)

/* Loads TOKENIZER, detecting its kind: a llama2.c tokenizer.bin, a .gguf with a vocabulary, a
 * directory with encoder.json + vocab.bpe (GPT-2 or tlm-trained BPE), a tlm tokenizer directory
 * (tokenizer.json), or a tokenizer.json / encoder.json / vocab.bpe file inside such a directory. */
tlm_status tlm_tokenizer_load(const char *path, tlm_tokenizer **out);
/* Loads GPT-2's pair of files given separately. */
tlm_status tlm_tokenizer_load_gpt2(const char *encoder_json, const char *vocab_bpe,
                                   tlm_tokenizer **out);
void tlm_tokenizer_free(tlm_tokenizer *t);

tlm_tokenizer_kind tlm_tokenizer_get_kind(const tlm_tokenizer *t);
const char *tlm_tokenizer_kind_name(tlm_tokenizer_kind k);
int32_t tlm_tokenizer_vocab_size(const tlm_tokenizer *t);
/* Special ids, -1 when the vocabulary has none. */
int32_t tlm_tokenizer_bos(const tlm_tokenizer *t);
int32_t tlm_tokenizer_eos(const tlm_tokenizer *t);
/* 1 if texts start with BOS for this vocabulary (as llama.cpp adds it): a GGUF vocabulary's
 * tokenizer.ggml.add_bos_token where it has one (Llama 3's: on), else SentencePiece ones with a
 * BOS; 0 where there is no BOS. */
int tlm_tokenizer_add_bos(const tlm_tokenizer *t);
/* 1 if generating id ends a generation, as llama.cpp's end-of-generation set has it: EOS, a GGUF
 * vocabulary's end-of-turn and end-of-message ids, and tokens whose text is one of the chat
 * formats' ends (<|eot_id|>, <|end_of_text|>, <|im_end|>, <|endoftext|>, <end_of_turn>, </s>,
 * ...). */
int tlm_tokenizer_is_eog(const tlm_tokenizer *t, int32_t id);
/* 1 if id is a special (control) token. */
int tlm_tokenizer_is_special(const tlm_tokenizer *t, int32_t id);
/* The bytes token id stands for (byte-fallback tokens give their byte; specials their text).
 * Points into the tokenizer. TLM_ERR_RANGE for an unknown id. */
tlm_status tlm_tokenizer_piece(const tlm_tokenizer *t, int32_t id, const char **bytes, size_t *len);
/* Id whose piece is exactly these bytes (specials included), or -1. */
int32_t tlm_tokenizer_find(const tlm_tokenizer *t, const void *bytes, size_t len);
/* Longest piece in bytes. */
size_t tlm_tokenizer_max_piece(const tlm_tokenizer *t);

/* Encodes len bytes into *ids (malloc'd, free with free(); NULL when *n is 0). */
tlm_status tlm_tokenizer_encode(const tlm_tokenizer *t, const void *text, size_t len,
                                unsigned flags, int32_t **ids, size_t *n);
/* Decodes ids into *text (malloc'd, NUL-terminated, *len excludes the NUL). SentencePiece-style
 * vocabularies drop the dummy-prefix space at the start and after a special token (BOS). */
tlm_status tlm_tokenizer_decode(const tlm_tokenizer *t, const int32_t *ids, size_t n,
                                unsigned flags, char **text, size_t *len);

/* Streaming decoder for generation: emits only complete UTF-8 characters (bytes that can never
 * complete a character are emitted as they are, so nothing is lost). */
typedef struct tlm_decoder tlm_decoder;
tlm_status tlm_decoder_new(const tlm_tokenizer *t, unsigned flags, tlm_decoder **out);
void tlm_decoder_free(tlm_decoder *d);
/* Feeds one id; bytes and len receive what can be printed now (valid until the next call). */
tlm_status tlm_decoder_push(tlm_decoder *d, int32_t id, const char **bytes, size_t *len);
/* Emits whatever is still held back (an incomplete character at the end). */
void tlm_decoder_flush(tlm_decoder *d, const char **bytes, size_t *len);

/* Char-level vocabulary from training text: its distinct UTF-8 characters sorted by code point
 * (a byte that is not valid UTF-8 counts as a character of its own). */
tlm_status tlm_tokenizer_new_char(const void *text, size_t len, tlm_tokenizer **out);

/* Writes a tlm tokenizer directory (created if missing): tokenizer.json always; BPE adds
 * encoder.json + vocab.bpe (GPT-2 format), SentencePiece-style adds tokenizer.bin (llama2.c
 * format). tlm_tokenizer_load reads it back. */
tlm_status tlm_tokenizer_save(const tlm_tokenizer *t, const char *dir);

typedef struct {
    int32_t vocab_size;          /* specials + 256 bytes + merges */
    const char *const *specials; /* NUL-terminated special tokens, ids 0.. in this order */
    int n_specials;
    int threads; /* pre-tokenization threads; <= 0: tlm_threads_get() */
    /* Optional progress: called now and then with merges done and total; non-zero stops. */
    int (*progress)(void *user, int32_t done, int32_t total);
    void *user;
} tlm_bpe_train_opts;

/* GPT-2's layout: vocab_size 50257 with the one special token <|endoftext|> (id 0), every core,
 * no progress callback. */
void tlm_bpe_train_opts_defaults(tlm_bpe_train_opts *o);

/* Trains a byte-level BPE on the concatenation of the files (GPT-2 pre-tokenization; special
 * tokens split the text and never merge; ties go to the lexicographically greater pair). */
tlm_status tlm_tokenizer_train_bpe(const char *const *files, int n_files,
                                   const tlm_bpe_train_opts *opts, tlm_tokenizer **out);
/* Same over texts in memory. */
tlm_status tlm_tokenizer_train_bpe_texts(const char *const *texts, const size_t *lens, int n_texts,
                                         const tlm_bpe_train_opts *opts, tlm_tokenizer **out);

/* ---- chat templates -------------------------------------------------------------------------- */

/* The common families written out in C (no Jinja interpreter): what tlm serve renders chats with,
 * and tlm finetune its training chats, so both see the same tokens. */
typedef enum {
    TLM_CHAT_CHATML = 0,
    TLM_CHAT_LLAMA2,
    TLM_CHAT_LLAMA3,
    TLM_CHAT_MISTRAL,
    TLM_CHAT_GEMMA,
    TLM_CHAT_PHI3,
    TLM_CHAT_MISTRAL_NEMO, /* Mistral's tekken style (Nemo): [INST]user[/INST]answer</s> */
    TLM_CHAT_COUNT
} tlm_chat_template;

typedef struct {
    const char *role; /* system, user, assistant, tool (developer is read as system) */
    const char *content;
} tlm_chat_message;

/* Where an assistant turn's generated text lies in a rendering: bytes [begin, end) (the answer
 * and the marker ending the turn, as a model emits them after the turn's header), and which
 * message it is. */
typedef struct {
    size_t begin, end;
    int msg;
} tlm_chat_span;

/* "chatml", "llama2", "llama3", "mistral", "gemma", "phi3", "mistral-nemo". */
const char *tlm_chat_template_name(tlm_chat_template t);
/* 1 and *t set when name is one of tlm_chat_template_name's; 0 otherwise. */
int tlm_chat_template_from_name(const char *name, tlm_chat_template *t);
/* Recognises the family of a Jinja chat template (GGUF tokenizer.chat_template) by the markers its
 * text must contain; 0 when none matches (the caller falls back to ChatML and says so). */
int tlm_chat_template_detect(const char *jinja, tlm_chat_template *t);
/* The text that ends an assistant turn in this family ("<|im_end|>", "<|eot_id|>", ...): a stop
 * string for chat requests, and an end-of-turn id when the vocabulary has it as one token. */
const char *tlm_chat_template_end(tlm_chat_template t);
/* Renders the messages; open_turn opens the assistant's turn at the end (a prompt). *out is
 * malloc'd, NUL-terminated; with spans, *spans (malloc'd, *n_spans of them) receives every
 * assistant turn's, in order. */
tlm_status tlm_chat_render(tlm_chat_template t, const tlm_chat_message *msgs, int n, int open_turn,
                           char **out, tlm_chat_span **spans, int *n_spans);

#ifdef __cplusplus
}
#endif
#endif
