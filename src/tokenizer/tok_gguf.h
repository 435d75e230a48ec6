/* A tokenizer's vocabulary as GGUF metadata (tokenizer.ggml.*): the writing half of
 * gguf_vocab.c, for the model writers in formats/ (the reading half is tlm_tokenizer_load). */
#ifndef TLM_TOK_GGUF_H
#define TLM_TOK_GGUF_H

#include "io/gguf_writer.h"
#include "tlm.h"

/* Appends the tokenizer.ggml.* keys: SentencePiece-style vocabularies as llama.cpp's `llama`
 * model (spaces as U+2581, byte tokens <0xNN>, scores), byte-level BPE as `gpt2` (GPT-2's
 * bytes-to-unicode text and merges), then the special ids and add_bos/add_eos flags.
 * TLM_ERR_UNSUPPORTED for char-level vocabularies, which GGUF cannot describe. */
tlm_status tok_gguf_write_vocab(io_gguf_writer *w, const tlm_tokenizer *t);

#endif
