#!/usr/bin/env bash
# Regenerates the committed seed corpus (fuzz/corpus/<target>/) with tlm itself and Python: tiny
# but complete files of every format, so the fuzzer starts from valid structure. Reproducers of
# fixed bugs (crash-*) are kept. tests/test_fuzz_corpus.c requires every other file to load.
# Usage: bash fuzz/make_corpus.sh [path/to/tlm]
set -euo pipefail
cd "$(dirname "$0")"
TLM=$(realpath "${1:-../build/tlm}")
C=corpus
mkdir -p "$C"/{safetensors,gguf,llama2c,tokenizer_bin,gpt2_bpe,model_load,tokenizer_load,request,imatrix,lora,examples,grammar}
find "$C" -type f ! -name 'crash-*' -delete
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
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
printf 'the cat sat on the mat. the dog sat on the log.\n%.0s' {1..40} >"$W/text.txt"
"$TLM" tokenizer train -i "$W/text.txt" --vocab-size 262 --special '<|endoftext|>' -o "$W/tok" >/dev/null 2>&1
echo '{"context_length": 8, "d_model": 8, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "d_ff": 16}' >"$W/cfg.json"
echo '{"context_length": 8, "d_model": 8, "n_layers": 1, "n_heads": 2, "d_ff": 16, "norm": "layernorm",
  "bias": true, "position": "learned", "ffn": "gelu_tanh"}' >"$W/gpt2.json"
train() { # CONFIG OUT TOKENIZER-ARGS...
  local cfg=$1 out=$2
  shift 2
  "$TLM" train -c "$cfg" --data "$W/text.txt" "$@" -o "$out" --steps 1 --batch 1 --warmup 0 \
    --eval-interval 100 -t 1 >/dev/null 2>&1
}
train "$W/cfg.json" "$W/run" -z "$W/tok"
train "$W/cfg.json" "$W/run_spm" -z "$C/tokenizer_bin/tiny.bin"
train "$W/cfg.json" "$W/run_char" --char
train "$W/gpt2.json" "$W/run_gpt2" -z "$W/tok"
# Qwen2's layout (q, k and v biases, RoPE on halves): GGUF arch qwen2
echo '{"context_length": 8, "d_model": 8, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "d_ff": 16,
  "qkv_bias": true}' >"$W/qwen2.json"
train "$W/qwen2.json" "$W/run_qwen2" -z "$W/tok"
"$TLM" convert "$W/run_qwen2" "$C/gguf/tiny_qwen2.gguf" --to gguf 2>/dev/null
"$TLM" convert "$W/run" "$C/gguf/tiny_bpe.gguf" --to gguf 2>/dev/null
"$TLM" convert "$W/run" "$C/gguf/tiny_f16.gguf" --to gguf --dtype f16 2>/dev/null
"$TLM" convert "$W/run_spm" "$W/spm_f16.gguf" --to gguf --dtype f16 2>/dev/null
"$TLM" convert "$W/run" "$C/llama2c/tiny_legacy.bin" --to llama2c 2>/dev/null
"$TLM" convert "$W/run" "$C/llama2c/tiny_v1.bin" --to llama2c --llama2c-version 1 2>/dev/null
"$TLM" convert "$W/run" "$C/safetensors/tiny_tlm.safetensors" --to safetensors 2>/dev/null
# an importance matrix of the tiny model in GGUF, and the same entries in the legacy .dat layout
echo '{"context_length": 16, "d_model": 8, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "d_ff": 16}' >"$W/cfg16.json"
train "$W/cfg16.json" "$W/run16" -z "$W/tok"
"$TLM" imatrix -m "$W/run16" -f "$W/text.txt" -c 16 --chunks 2 -o "$C/imatrix/tiny.gguf" 2>/dev/null
# a LoRA adapter of the tiny model (rank 2, every linear layer of its block), in llama.cpp's GGUF form
"$TLM" finetune -m "$W/run16" --data "$W/text.txt" -o "$W/ft16" --steps 2 --batch 2 --seq-len 8 \
    --lora-rank 2 --eval-interval 0 2>/dev/null
cp "$W/ft16/adapter.gguf" "$C/lora/tiny_adapter.gguf"
/usr/bin/python3 - "$C/imatrix/tiny.dat" <<'PY'
import struct, sys
out = struct.pack("<i", 2)
for name, vals in (("blk.0.attn_q.weight", [0.5, 1.5, 2.0, 0.25]), ("output.weight", [1.0, 3.0])):
    out += struct.pack("<i", len(name)) + name.encode() + struct.pack("<ii", 3, len(vals))
    out += struct.pack("<%df" % len(vals), *vals)
out += struct.pack("<i", 2) + struct.pack("<i", 8) + b"text.txt"
open(sys.argv[1], "wb").write(out)
PY
"$TLM" convert "$W/run" "$W/hf" --to hf --dtype bf16 2>/dev/null
"$TLM" convert "$W/run_gpt2" "$W/hf_gpt2" --to hf 2>/dev/null
cp "$W/hf/model.safetensors" "$C/safetensors/tiny_hf_bf16.safetensors"

# The top-level targets: a format byte, then the file, or a directory's files joined by the split
# marker of fuzz_entries.h.
/usr/bin/python3 - "$C" "$W" <<'PY'
import json, struct, sys
c, w = sys.argv[1], sys.argv[2]
SPLIT = b"<<tlm-fuzz-split>>"
def rd(p):
    return open(p, "rb").read()
def seed(target, name, kind, *files):
    open(f"{c}/{target}/{name}", "wb").write(bytes([kind]) + SPLIT.join(files))

# A Hugging Face model in two shards with an index, from the single-file export.
st = rd(f"{w}/hf/model.safetensors")
hlen = struct.unpack("<Q", st[:8])[0]
head = json.loads(st[8:8 + hlen])
data = st[8 + hlen:]
meta = head.pop("__metadata__", None)
names = sorted(head)
shards, weight_map = [], {}
for k, part in enumerate((names[: len(names) // 2], names[len(names) // 2:])):
    fname = "model-%05d-of-00002.safetensors" % (k + 1)
    h, blob = {}, b""
    for n in part:
        b, e = head[n]["data_offsets"]
        h[n] = dict(head[n], data_offsets=[len(blob), len(blob) + e - b])
        blob += data[b:e]
        weight_map[n] = fname
    if meta:
        h["__metadata__"] = meta
    hj = json.dumps(h).encode()
    hj += b" " * (-len(hj) % 8)
    shards.append(struct.pack("<Q", len(hj)) + hj + blob)
index = json.dumps({"metadata": {"total_size": len(data)}, "weight_map": weight_map}).encode()

seed("model_load", "gguf_bpe", 0, rd(f"{c}/gguf/tiny_bpe.gguf"))
seed("model_load", "gguf_spm_f16", 0, rd(f"{w}/spm_f16.gguf"))
seed("model_load", "llama2c_legacy", 1, rd(f"{c}/llama2c/tiny_legacy.bin"))
seed("model_load", "llama2c_v1", 1, rd(f"{c}/llama2c/tiny_v1.bin"))
seed("model_load", "tlm_safetensors", 2, rd(f"{c}/safetensors/tiny_tlm.safetensors"))
seed("model_load", "hf_llama_bf16", 3, rd(f"{w}/hf/config.json"), st)
seed("model_load", "hf_gpt2", 3, rd(f"{w}/hf_gpt2/config.json"), rd(f"{w}/hf_gpt2/model.safetensors"))
seed("model_load", "hf_sharded", 4, rd(f"{w}/hf/config.json"), index, *shards)
seed("model_load", "tlm_dir", 5, rd(f"{w}/run/model.safetensors"))

seed("tokenizer_load", "gguf_bpe", 0, rd(f"{c}/gguf/tiny_bpe.gguf"))
seed("tokenizer_load", "gguf_spm", 0, rd(f"{w}/spm_f16.gguf"))
seed("tokenizer_load", "tokenizer_bin", 1, rd(f"{c}/tokenizer_bin/tiny.bin"))
seed("tokenizer_load", "gpt2_dir", 2, rd(f"{w}/run/tokenizer/encoder.json"),
     rd(f"{w}/run/tokenizer/vocab.bpe"))
seed("tokenizer_load", "tlm_bpe_dir", 3, rd(f"{w}/run/tokenizer/tokenizer.json"),
     rd(f"{w}/run/tokenizer/encoder.json"), rd(f"{w}/run/tokenizer/vocab.bpe"))
seed("tokenizer_load", "tlm_spm_dir", 4, rd(f"{w}/run_spm/tokenizer/tokenizer.json"),
     rd(f"{w}/run_spm/tokenizer/tokenizer.bin"))
seed("tokenizer_load", "tlm_char_dir", 5, rd(f"{w}/run_char/tokenizer/tokenizer.json"))
PY
# tlm serve's request bodies: the first byte picks the endpoint (0 completions, 1 chat, 2
# llama-server's /completion).
/usr/bin/python3 - "$C/request" <<'PY'
import json, sys
d = sys.argv[1]
def seed(name, chat, body):
    open(f"{d}/{name}", "wb").write(bytes([chat]) + json.dumps(body).encode())
seed("completion", 0, {"model": "m", "prompt": "Once upon a time", "max_tokens": 16,
                       "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 3,
                       "stop": ["\n", "END"], "logprobs": 2, "echo": True, "stream": True,
                       "stream_options": {"include_usage": True}})
seed("completion_ids", 0, {"prompt": [1, 2, 3], "max_completion_tokens": 4, "n": 2,
                           "presence_penalty": 0.5, "frequency_penalty": -0.5,
                           "repeat_penalty": 1.1, "repeat_last_n": 32})
seed("chat", 1, {"model": "m", "messages": [
    {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi \u00e9"},
    {"role": "assistant", "content": None},
    {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
    "logprobs": True, "top_logprobs": 3, "stop": "x", "user": "ignored"})
seed("chat_schema", 1, {"messages": [{"role": "user", "content": "Name?"}], "response_format": {
    "type": "json_schema", "json_schema": {"name": "n", "strict": True, "schema": {
        "type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}}})
seed("completion_grammar", 0, {"prompt": "x", "grammar": 'root ::= "yes" | "no"'})
seed("tools", 1, {"messages": [{"role": "user", "content": "W?"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function",
        "function": {"name": "w", "arguments": "{\"city\": \"P\"}"}}]},
    {"role": "tool", "tool_call_id": "c", "content": "21"}],
    "tools": [{"type": "function", "function": {"name": "w", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
    "tool_choice": "required", "parallel_tool_calls": False})
seed("tools_mistral", 1, {"messages": [{"role": "system", "content": "Be brief."},
    {"role": "user", "content": "W?"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "abcDEF123", "type": "function",
        "function": {"name": "w", "arguments": "{\"city\": \"P\"}"}}]},
    {"role": "tool", "tool_call_id": "abcDEF123", "content": "21"},
    {"role": "user", "content": "[TOOL_CALLS][{\"name\": \"w\", \"arguments\": {}}]"}],
    "tools": [{"type": "function", "function": {"name": "w", "description": "d", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]})
seed("native", 2, {"prompt": [1, "Once", 5], "n_predict": 4, "n_probs": 2, "return_tokens": True,
                   "logit_bias": [[3, False], ["cat", -1.5]], "ignore_eos": True, "mirostat": 0,
                   "samplers": ["top_k", "temperature"], "seed": -1, "cache_prompt": True})
PY
# Instruction data (JSON Lines): the first byte picks the options (fuzz_examples).
/usr/bin/python3 - "$C/examples" <<'PY'
import json, sys
d = sys.argv[1]
def seed(name, opt, lines):
    open(f"{d}/{name}", "wb").write(bytes([opt]) + "".join(json.dumps(l) + "\n" for l in lines).encode())
seed("text", 56, [{"text": "the cat sat."}, {"text": "a dog ran to the log and sat."}])
seed("completion", 52, [{"prompt": "Q: why? A:", "completion": " because."},
                            {"prompt": "Q: who? A:", "completion": " the cat, who sat."}])
seed("chat", 168, [{"messages": [{"role": "system", "content": "Be brief."},
                                     {"role": "user", "content": "Hi?"},
                                     {"role": "assistant", "content": "Hello."}]},
                       {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]},
                                     {"role": "assistant", "content": "b"}]},
                       {"messages": "not a list"}])
seed("dpo", 109, [{"prompt": "Q: why?", "chosen": " because.", "rejected": " no."},
                     {"prompt": [{"role": "user", "content": "Hi"}],
                      "chosen": [{"role": "assistant", "content": "Hello."}],
                      "rejected": [{"role": "assistant", "content": "Go."}]}])
PY
# Grammars: the first byte picks GBNF (even) or JSON Schema (odd); text to follow after the split.
/usr/bin/python3 - "$C/grammar" <<'PY'
import json, sys
d = sys.argv[1]
split = b"<<tlm-fuzz-split>>"
def seed(name, opt, text, follow):
    open(f"{d}/{name}", "wb").write(bytes([opt]) + text.encode() + split + follow.encode())
seed("gbnf", 0, 'root ::= greeting (" " name)? "!"\ngreeting ::= "hi" | "hello"\n'
     'name ::= [A-Z] [a-z]{1,8} # a capitalised name\n', "hello Ada!hi!")
seed("gbnf_classes", 2, 'root ::= item+\nitem ::= [^,\\n]* ("," | "\\n")\n', "a,b\nc,")
seed("schema", 1, json.dumps({
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 5},
                   "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
                   "n": {"type": ["integer", "null"]}, "ok": {"const": True},
                   "p": {"$ref": "#/$defs/pt"}},
    "required": ["name", "n"],
    "$defs": {"pt": {"anyOf": [{"type": "number"}, {"type": "boolean"}]}}}),
    '{"name": "x", "n": 3, "tags": ["a"]}')
PY
ls -la "$C"/*
