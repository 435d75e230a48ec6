#!/usr/bin/env bash
# Model formats end to end through the command line: llama2.c's own greedy run reproduced from the
# .bin and the .gguf, conversions between every format, and llama.cpp (node-llama-cpp, a real
# client) continuing tlm-written GGUF files exactly like `tlm generate`: converted stories260K and
# a model trained by `tlm train` with a BPE tokenizer.
. "$(dirname "$0")/lib.sh"
set -eo pipefail
need "$DATA/models"
M=$DATA/models

# --- 1. stories260K: llama2.c's greedy vector ------------------------------------------------
want_ids=$(json_get '" ".join(map(str, j["cases"][0]["tokens"]))' "$DATA/vectors/stories260K_greedy.json")
for model in "$M/stories260K.bin -z $M/tok512.bin" "$M/stories260K.gguf"; do
  # shellcheck disable=SC2086
  ids=$("$TLM" generate -m $model -p "Once upon a time" -n 200 --temp 0 --print-ids -t 2 2>/dev/null)
  [ "${ids:0:${#want_ids}}" = "$want_ids" ] || die "ids of $model differ from llama2.c's"
  # shellcheck disable=SC2086
  "$TLM" generate -m $model -p "Once upon a time" -n 200 --temp 0 -t 2 >"$TMP/text" 2>/dev/null
  /usr/bin/python3 - "$TMP/text" <<PY || die "text of $model is not llama2.c's"
import sys
got = open(sys.argv[1], encoding="utf-8").read()
want = open("$DATA/vectors/stories260K_greedy.json") and __import__("json").load(open("$DATA/vectors/stories260K_greedy.json"))["cases"][0]["text"]
# run.c printed its 200 steps; ours continues further, so its text is a prefix of ours
sys.exit(0 if got.startswith(want.rstrip("\n")) else 1)
PY
  ok
done
"$TLM" generate -m "$M/llama-2-tiny-random.gguf" -p "Hello" -n 8 --temp 0 -t 2 >/dev/null 2>&1 ||
  die "llama-2-tiny-random.gguf does not generate"
ok

# --- 2. conversions keep the greedy ids ---------------------------------------------------------
ref=$("$TLM" generate -m "$M/stories260K.bin" --ids "1 403 407 261 378" -n 40 --temp 0 --print-ids -t 2 2>/dev/null)
"$TLM" convert "$M/stories260K.bin" "$TMP/s.gguf" --to gguf -z "$M/tok512.bin" 2>/dev/null
"$TLM" convert "$M/stories260K.gguf" "$TMP/hf" --to hf 2>/dev/null
"$TLM" convert "$TMP/hf" "$TMP/l2c_v1.bin" --to llama2c --llama2c-version 1 2>/dev/null
"$TLM" convert "$TMP/l2c_v1.bin" "$TMP/ckpt" --to safetensors -z "$M/tok512.bin" 2>/dev/null
for m in "$TMP/s.gguf" "$TMP/hf" "$TMP/l2c_v1.bin" "$TMP/ckpt"; do
  got=$("$TLM" generate -m "$m" --ids "1 403 407 261 378" -n 40 --temp 0 --print-ids -t 2 2>/dev/null)
  [ "$got" = "$ref" ] || die "greedy ids change after conversion to $m"
  ok
done
"$TLM" convert "$M/stories260K.bin" "$TMP/x" --to onnx 2>"$TMP/err" && die "accepted --to onnx"
grep -q "gguf, safetensors, hf or llama2c" "$TMP/err" || die "unclear error: $(cat "$TMP/err")"
ok

# --- tlm info -m on every format ---------------------------------------------------------------
"$TLM" info -m "$M/stories260K.bin" >"$TMP/info" && grep -q "format            llama2.c" "$TMP/info" &&
  grep -q "total                         260032" "$TMP/info" || die "info -m .bin: $(cat "$TMP/info")"
"$TLM" info -m "$M/llama-2-tiny-random.gguf" --json >"$TMP/info.json"
/usr/bin/python3 - "$TMP/info.json" <<'PY' || die "info -m .gguf --json"
import json, sys
o = json.load(open(sys.argv[1]))
t = {e["name"]: e for e in o["tensors"]}
assert o["format"] == "gguf" and o["config"]["vocab_size"] == 32000, o["config"]
assert t["token_embd.weight"]["dtype"] == "F16" and t["token_embd.weight"]["shape"] == [32000, 8]
assert t["output_norm.weight"]["dtype"] == "F32"
assert o["tokenizer"]["kind"] == "spm" and o["tokenizer"]["vocab_size"] == 32000
PY
"$TLM" info -m "$TMP/hf" | grep -Eq "model.layers.4.self_attn.k_proj.weight +F32 +\[32, 64\]" ||
  die "info -m hf"
"$TLM" info -m "$TMP/ckpt" | grep -q "kind            spm" || die "info -m tlm checkpoint"
ok

# --- 3. llama.cpp on tlm-written GGUF -----------------------------------------------------------
[ -d "$SRC/tests/node/node_modules/node-llama-cpp" ] ||
  die "node-llama-cpp is not installed in $SRC/tests/node/node_modules: run bash scripts/setup.sh"
llamacpp() { # MODEL "IDS" N -> generated ids, space separated
  node_run llama_greedy.mjs "$1" "$2" "$3" | json_get '" ".join(map(str, j["ids"]))'
}
check_llamacpp() { # GGUF "PROMPT IDS" N
  local mine theirs
  mine=$("$TLM" generate -m "$1" --ids "$2" -n "$3" --temp 0 --print-ids -t 2 2>/dev/null)
  theirs=$(llamacpp "$1" "$2" "$3")
  [ "$mine" = "$2 $theirs" ] || die "llama.cpp on $1: '$theirs' vs tlm '$mine'"
  echo "llama.cpp == tlm on $(basename "$1"): $theirs" | cut -c1-150
  ok
}
"$TLM" convert "$M/stories260K.bin" "$TMP/s16.gguf" --to gguf --dtype f16 -z "$M/tok512.bin" 2>/dev/null
check_llamacpp "$TMP/s.gguf" "1 403 407 261 378" 100
check_llamacpp "$TMP/s16.gguf" "1 403 407 261 378" 100

# A model trained by tlm train with a byte-level BPE tokenizer (tlm's default half RoPE pairing,
# tied embeddings), converted to GGUF.
head -c 200000 "$DATA/text/tinyshakespeare.txt" >"$TMP/shake.txt"
"$TLM" tokenizer train -i "$TMP/shake.txt" --vocab-size 320 --special "<|endoftext|>" -o "$TMP/tok" >/dev/null 2>&1
cat >"$TMP/cfg.json" <<'JSON'
{"context_length": 64, "d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "d_ff": 128}
JSON
"$TLM" train -c "$TMP/cfg.json" --data "$TMP/shake.txt" -z "$TMP/tok" -o "$TMP/run" --steps 150 --batch 8 \
  --lr 1e-2 --warmup 10 --eval-interval 1000 -t 2 >/dev/null 2>&1 || die "tlm train failed"
"$TLM" convert "$TMP/run" "$TMP/trained.gguf" --to gguf 2>/dev/null
prompt=$("$TLM" tokenize -z "$TMP/run/tokenizer" <<<"ROMEO:" | tr '\n' ' ' | sed 's/ *$//')
check_llamacpp "$TMP/trained.gguf" "$prompt" 40
# Split GGUF (llama-gguf-split --split-max-tensors: tests/reference/gguf_split.py writes the
# same bytes as it): given the first shard, tlm finds the others and generates as from the whole
# file; the tokenizer comes from the first; a later shard or a missing one is refused by name.
/usr/bin/python3 "$SRC/tests/reference/gguf_split.py" "$TMP/s.gguf" "$TMP/split" 12
[ -f "$TMP/split-00004-of-00004.gguf" ] || die "gguf_split.py wrote $(ls "$TMP" | grep split)"
whole=$("$TLM" generate -m "$TMP/s.gguf" --ids "1 403 407 261 378" -n 40 --temp 0 --print-ids -t 2 2>/dev/null)
parts=$("$TLM" generate -m "$TMP/split-00001-of-00004.gguf" --ids "1 403 407 261 378" -n 40 --temp 0 \
  --print-ids -t 2 2>/dev/null)
[ -n "$whole" ] && [ "$whole" = "$parts" ] || die "split model: '$parts' vs '$whole'"
"$TLM" generate -m "$TMP/split-00001-of-00004.gguf" -p "Once upon" -n 8 --seed 2 >/dev/null 2>&1 ||
  die "a split model with its tokenizer"
if "$TLM" generate -m "$TMP/split-00002-of-00004.gguf" -n 2 >"$TMP/out" 2>&1; then die "shard 2 loaded"; fi
grep -q "shard 2 of a split model: give the first one" "$TMP/out" || die "shard 2: $(cat "$TMP/out")"
rm "$TMP/split-00003-of-00004.gguf"
if "$TLM" generate -m "$TMP/split-00001-of-00004.gguf" -n 2 >"$TMP/out" 2>&1; then die "a missing shard"; fi
grep -q "split-00003-of-00004.gguf" "$TMP/out" || die "a missing shard: $(cat "$TMP/out")"
ok
finish
