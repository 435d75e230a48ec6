#!/usr/bin/env bash
# Model formats end to end through the command line: llama2.c's own greedy run reproduced from the
# .bin and the .gguf, conversions between every format, and llama.cpp (node-llama-cpp, a real
# client) continuing tlm-written GGUF files exactly like `tlm generate`: converted stories260K and
# a model trained by `tlm train` with a BPE tokenizer.
set -euo pipefail
TLM=${TLM:-build/tlm}
SRC=${TLM_SOURCE_DIR:-.}
DATA=${TLM_SHARED_DATA:-$SRC/../shared/data}
W=$(mktemp -d "$PWD/formats_cli.XXXXXX")
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
pass=0
ok() { pass=$((pass + 1)); }
[ -d "$DATA/models" ] || fail "the shared test data is missing: no directory $DATA/models"
M=$DATA/models

# --- 1. stories260K: llama2.c's greedy vector ------------------------------------------------
want_ids=$(/usr/bin/python3 -c "import json,sys; print(' '.join(map(str, json.load(open(sys.argv[1]))['cases'][0]['tokens'])))" "$DATA/vectors/stories260K_greedy.json")
want_text=$(/usr/bin/python3 -c "import json,sys; sys.stdout.write(json.load(open(sys.argv[1]))['cases'][0]['text'])" "$DATA/vectors/stories260K_greedy.json")
for model in "$M/stories260K.bin -z $M/tok512.bin" "$M/stories260K.gguf"; do
  # shellcheck disable=SC2086
  ids=$("$TLM" generate -m $model -p "Once upon a time" -n 200 --temp 0 --print-ids -t 2 2>/dev/null)
  [ "${ids:0:${#want_ids}}" = "$want_ids" ] || fail "ids of $model differ from llama2.c's"
  # shellcheck disable=SC2086
  "$TLM" generate -m $model -p "Once upon a time" -n 200 --temp 0 -t 2 >"$W/text" 2>/dev/null
  /usr/bin/python3 - "$W/text" <<PY || fail "text of $model is not llama2.c's"
import sys
got = open(sys.argv[1], encoding="utf-8").read()
want = open("$DATA/vectors/stories260K_greedy.json") and __import__("json").load(open("$DATA/vectors/stories260K_greedy.json"))["cases"][0]["text"]
# run.c printed its 200 steps; ours continues further, so its text is a prefix of ours
sys.exit(0 if got.startswith(want.rstrip("\n")) else 1)
PY
  ok
done
"$TLM" generate -m "$M/llama-2-tiny-random.gguf" -p "Hello" -n 8 --temp 0 -t 2 >/dev/null 2>&1 ||
  fail "llama-2-tiny-random.gguf does not generate"
ok

# --- 2. conversions keep the greedy ids ---------------------------------------------------------
ref=$("$TLM" generate -m "$M/stories260K.bin" --ids "1 403 407 261 378" -n 40 --temp 0 --print-ids -t 2 2>/dev/null)
"$TLM" convert "$M/stories260K.bin" "$W/s.gguf" --to gguf -z "$M/tok512.bin" 2>/dev/null
"$TLM" convert "$M/stories260K.gguf" "$W/hf" --to hf 2>/dev/null
"$TLM" convert "$W/hf" "$W/l2c_v1.bin" --to llama2c --llama2c-version 1 2>/dev/null
"$TLM" convert "$W/l2c_v1.bin" "$W/ckpt" --to safetensors -z "$M/tok512.bin" 2>/dev/null
for m in "$W/s.gguf" "$W/hf" "$W/l2c_v1.bin" "$W/ckpt"; do
  got=$("$TLM" generate -m "$m" --ids "1 403 407 261 378" -n 40 --temp 0 --print-ids -t 2 2>/dev/null)
  [ "$got" = "$ref" ] || fail "greedy ids change after conversion to $m"
  ok
done
"$TLM" convert "$M/stories260K.bin" "$W/x" --to onnx 2>"$W/err" && fail "accepted --to onnx"
grep -q "gguf, safetensors, hf or llama2c" "$W/err" || fail "unclear error: $(cat "$W/err")"
ok

# --- tlm info -m on every format ---------------------------------------------------------------
"$TLM" info -m "$M/stories260K.bin" >"$W/info" && grep -q "format            llama2.c" "$W/info" &&
  grep -q "total                         260032" "$W/info" || fail "info -m .bin: $(cat "$W/info")"
"$TLM" info -m "$M/llama-2-tiny-random.gguf" --json >"$W/info.json"
/usr/bin/python3 - "$W/info.json" <<'PY' || fail "info -m .gguf --json"
import json, sys
o = json.load(open(sys.argv[1]))
t = {e["name"]: e for e in o["tensors"]}
assert o["format"] == "gguf" and o["config"]["vocab_size"] == 32000, o["config"]
assert t["token_embd.weight"]["dtype"] == "F16" and t["token_embd.weight"]["shape"] == [32000, 8]
assert t["output_norm.weight"]["dtype"] == "F32"
assert o["tokenizer"]["kind"] == "spm" and o["tokenizer"]["vocab_size"] == 32000
PY
"$TLM" info -m "$W/hf" | grep -Eq "model.layers.4.self_attn.k_proj.weight +F32 +\[32, 64\]" ||
  fail "info -m hf"
"$TLM" info -m "$W/ckpt" | grep -q "kind            spm" || fail "info -m tlm checkpoint"
ok

# --- 3. llama.cpp on tlm-written GGUF -----------------------------------------------------------
NODE_DIR=$SRC/tests/node
[ -d "$NODE_DIR/node_modules/node-llama-cpp" ] ||
  fail "node-llama-cpp is not installed in $NODE_DIR/node_modules: run bash scripts/setup.sh"
llamacpp() { # MODEL "IDS" N -> generated ids, space separated
  (cd "$NODE_DIR" && NODE_LLAMA_CPP_SKIP_DOWNLOAD=true node llama_greedy.mjs "$1" "$2" "$3") |
    /usr/bin/python3 -c "import json,sys; print(' '.join(map(str, json.load(sys.stdin)['ids'])))"
}
check_llamacpp() { # GGUF "PROMPT IDS" N
  local mine theirs
  mine=$("$TLM" generate -m "$1" --ids "$2" -n "$3" --temp 0 --print-ids -t 2 2>/dev/null)
  theirs=$(llamacpp "$1" "$2" "$3")
  [ "$mine" = "$2 $theirs" ] || fail "llama.cpp on $1: '$theirs' vs tlm '$mine'"
  echo "llama.cpp == tlm on $(basename "$1"): $theirs" | cut -c1-150
  ok
}
"$TLM" convert "$M/stories260K.bin" "$W/s16.gguf" --to gguf --dtype f16 -z "$M/tok512.bin" 2>/dev/null
check_llamacpp "$W/s.gguf" "1 403 407 261 378" 100
check_llamacpp "$W/s16.gguf" "1 403 407 261 378" 100

# A model trained by tlm train with a byte-level BPE tokenizer (tlm's default half RoPE pairing,
# tied embeddings), converted to GGUF.
head -c 200000 "$DATA/text/tinyshakespeare.txt" >"$W/shake.txt"
"$TLM" tokenizer train -i "$W/shake.txt" --vocab-size 320 --special "<|endoftext|>" -o "$W/tok" >/dev/null 2>&1
cat >"$W/cfg.json" <<'JSON'
{"context_length": 64, "d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "d_ff": 128}
JSON
"$TLM" train -c "$W/cfg.json" --data "$W/shake.txt" -z "$W/tok" -o "$W/run" --steps 150 --batch 8 \
  --lr 1e-2 --warmup 10 --eval-interval 1000 -t 2 >/dev/null 2>&1 || fail "tlm train failed"
"$TLM" convert "$W/run" "$W/trained.gguf" --to gguf 2>/dev/null
prompt=$("$TLM" tokenize -z "$W/run/tokenizer" <<<"ROMEO:" | tr '\n' ' ' | sed 's/ *$//')
check_llamacpp "$W/trained.gguf" "$prompt" 40
# Split GGUF (llama-gguf-split --split-max-tensors: tests/reference/gguf_split.py writes the
# same bytes as it): given the first shard, tlm finds the others and generates as from the whole
# file; the tokenizer comes from the first; a later shard or a missing one is refused by name.
/usr/bin/python3 "$SRC/tests/reference/gguf_split.py" "$W/s.gguf" "$W/split" 12
[ -f "$W/split-00004-of-00004.gguf" ] || fail "gguf_split.py wrote $(ls "$W" | grep split)"
whole=$("$TLM" generate -m "$W/s.gguf" --ids "1 403 407 261 378" -n 40 --temp 0 --print-ids -t 2 2>/dev/null)
parts=$("$TLM" generate -m "$W/split-00001-of-00004.gguf" --ids "1 403 407 261 378" -n 40 --temp 0 \
  --print-ids -t 2 2>/dev/null)
[ -n "$whole" ] && [ "$whole" = "$parts" ] || fail "split model: '$parts' vs '$whole'"
"$TLM" generate -m "$W/split-00001-of-00004.gguf" -p "Once upon" -n 8 --seed 2 >/dev/null 2>&1 ||
  fail "a split model with its tokenizer"
if "$TLM" generate -m "$W/split-00002-of-00004.gguf" -n 2 >"$W/out" 2>&1; then fail "shard 2 loaded"; fi
grep -q "shard 2 of a split model: give the first one" "$W/out" || fail "shard 2: $(cat "$W/out")"
rm "$W/split-00003-of-00004.gguf"
if "$TLM" generate -m "$W/split-00001-of-00004.gguf" -n 2 >"$W/out" 2>&1; then fail "a missing shard"; fi
grep -q "split-00003-of-00004.gguf" "$W/out" || fail "a missing shard: $(cat "$W/out")"
ok
echo "formats_cli: $pass passed"
