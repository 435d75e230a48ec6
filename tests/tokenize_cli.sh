#!/usr/bin/env bash
# Command-line contract of `tlm tokenize` and `tlm tokenizer train`: exact stdin, ids on one line,
# errors as one line on stderr with a non-zero exit.
. "$(dirname "$0")/lib.sh"
need "$DATA"
GPT2=$DATA/tokenizers/gpt2
check() { # name, got, want
  if [ "$2" == "$3" ]; then ok; else bad "$1: got [$2] want [$3]"; fi
}
fails() { # name, command...: must exit non-zero with one stderr line and empty stdout
  local name=$1; shift
  refuses "$name" "" "$@"
  expect "$name: nothing on stdout ($(head -c 200 <<<"$OUT"))" test -z "$OUT"
}

check "hello" "$(printf 'Hello, world!' | "$TLM" tokenize -z "$GPT2")" "15496 11 995 0"
check "exact stdin" "$(printf 'a\n' | "$TLM" tokenize -z "$GPT2")" "64 198"
check "empty" "$(printf '' | "$TLM" tokenize -z "$GPT2")" ""
check "special as text" "$(printf '<|endoftext|>' | "$TLM" tokenize -z "$GPT2")" "27 91 437 1659 5239 91 29"
check "special allowed" "$(printf 'a<|endoftext|>' | "$TLM" tokenize -z "$GPT2" --allow-special)" "64 50256"
check "pieces" "$(printf 'Hi\n' | "$TLM" tokenize -z "$GPT2" --pieces)" "$(printf '17250\tHi\n198\t\\n')"
check "llama2.c bos" "$(printf 'Once upon a time' | "$TLM" tokenize -z "$DATA/models/tok512.bin" --bos)" "1 403 407 261 378"
check "gguf" "$(printf 'Hello world' | "$TLM" tokenize -z "$DATA/tokenizers/ggml-vocab-llama-spm.gguf")" "15043 3186"
# a Hugging Face layout: vocab.json + merges.txt next to a tokenizer.json of HF's own format
mkdir -p "$TMP/hf" && cp "$GPT2/encoder.json" "$TMP/hf/vocab.json" && cp "$GPT2/vocab.bpe" "$TMP/hf/merges.txt"
echo '{"version": "1.0", "model": {"type": "BPE"}}' >"$TMP/hf/tokenizer.json"
check "hf layout" "$(printf 'Hello, world!' | "$TLM" tokenize -z "$TMP/hf")" "15496 11 995 0"
# decode round trip of bytes that are not UTF-8
head -c 3000 /dev/urandom >"$TMP/rand"
for z in "$GPT2" "$DATA/models/tok512.bin" "$DATA/tokenizers/ggml-vocab-gpt-2.gguf"; do
  "$TLM" tokenize -z "$z" <"$TMP/rand" | "$TLM" tokenize -z "$z" --decode >"$TMP/back"
  expect "round trip $z" cmp -s "$TMP/rand" "$TMP/back"
done
expect "--help" "$TLM" tokenize --help >/dev/null
fails "no -z" "$TLM" tokenize
fails "missing tokenizer" "$TLM" tokenize -z "$TMP/nope.bin"
printf 'garbage!' >"$TMP/bad.bin"
fails "malformed tokenizer.bin" "$TLM" tokenize -z "$TMP/bad.bin"
fails "unknown id" sh -c "echo '1 2 99999' | '$TLM' tokenize -z '$GPT2' --decode"
fails "not an id" sh -c "echo '1 x' | '$TLM' tokenize -z '$GPT2' --decode"
fails "unknown option" "$TLM" tokenize -z "$GPT2" --frobnicate
fails "train without input" "$TLM" tokenizer train --vocab-size 300 -o "$TMP/t"
fails "train small vocab" "$TLM" tokenizer train -i "$DATA/text/cs336/corpus.en" --vocab-size 10 -o "$TMP/t"

# training reproduces the reference merges and writes a directory the encoder loads
"$TLM" tokenizer train -q -i "$DATA/text/cs336/corpus.en" --vocab-size 500 --special '<|endoftext|>' -o "$TMP/bpe"
expect "trained merges are the reference's" \
  diff <(grep -v '^#version' "$TMP/bpe/vocab.bpe") "$DATA/text/cs336/train-bpe-reference-merges.txt" >/dev/null
check "trained special" "$(printf 'the<|endoftext|>' | "$TLM" tokenize -z "$TMP/bpe" --allow-special | awk '{print $NF}')" "0"
finish
