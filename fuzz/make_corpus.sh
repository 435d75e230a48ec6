#!/usr/bin/env bash
# Regenerates the committed seed corpus (fuzz/corpus/) from scratch with tlm itself and Python:
# tiny but complete files of every format, so the fuzzer starts from valid structure.
# Usage: bash fuzz/make_corpus.sh [path/to/tlm]
set -euo pipefail
cd "$(dirname "$0")"
TLM=$(realpath "${1:-../build/tlm}")
C=corpus
rm -rf "$C" && mkdir -p "$C"/{safetensors,gguf,llama2c,tokenizer_bin,gpt2_bpe}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
printf 'the cat sat on the mat. the dog sat on the log.\n%.0s' {1..40} >"$W/text.txt"
"$TLM" tokenizer train -i "$W/text.txt" --vocab-size 262 -o "$W/tok" >/dev/null 2>&1
echo '{"context_length": 8, "d_model": 8, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "d_ff": 16}' >"$W/cfg.json"
"$TLM" train -c "$W/cfg.json" --data "$W/text.txt" -z "$W/tok" -o "$W/run" --steps 1 --batch 1 --warmup 0 \
  --eval-interval 100 -t 1 >/dev/null 2>&1
"$TLM" convert "$W/run" "$C/gguf/tiny_bpe.gguf" --to gguf 2>/dev/null
"$TLM" convert "$W/run" "$C/gguf/tiny_f16.gguf" --to gguf --dtype f16 2>/dev/null
"$TLM" convert "$W/run" "$C/llama2c/tiny_legacy.bin" --to llama2c 2>/dev/null
"$TLM" convert "$W/run" "$C/llama2c/tiny_v1.bin" --to llama2c --llama2c-version 1 2>/dev/null
"$TLM" convert "$W/run" "$C/safetensors/tiny_tlm.safetensors" --to safetensors 2>/dev/null
"$TLM" convert "$W/run" "$W/hf" --to hf --dtype bf16 2>/dev/null
cp "$W/hf/model.safetensors" "$C/safetensors/tiny_hf_bf16.safetensors"
/usr/bin/python3 - "$C" <<'PY'
import json, struct, sys
c = sys.argv[1]
# llama2.c tokenizer.bin: u32 max_token_length, then per token f32 score, i32 length, bytes.
toks = [(b"<unk>", 0.0), (b"\n<s>\n", 0.0), (b"\n</s>\n", 0.0)]
toks += [(b"<0x%02X>" % i, 0.0) for i in range(256)]
toks += [(b" the", -1.0), (b" cat", -2.0), (b"at", -3.0), (b" c", -4.0), (b"th", -5.0), (b" t", -6.0)]
with open(f"{c}/tokenizer_bin/tiny.bin", "wb") as f:
    f.write(struct.pack("<I", max(len(t) for t, _ in toks)))
    for t, s in toks:
        f.write(struct.pack("<fi", s, len(t)) + t)
# GPT-2 encoder.json NUL vocab.bpe, bytes-to-unicode alphabet.
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
alpha = [chr(x) for x in cs]
enc = {a: i for i, a in enumerate(alpha)}
merges = ["\u0120 t", "h e", "\u0120t he", "a t", "c at"]
for m in merges:
    enc[m.replace(" ", "")] = len(enc)
enc["<|endoftext|>"] = len(enc)
blob = json.dumps(enc).encode() + b"\0" + ("#version: 0.2\n" + "\n".join(merges) + "\n").encode()
open(f"{c}/gpt2_bpe/tiny", "wb").write(blob)
PY
ls -la "$C"/*
