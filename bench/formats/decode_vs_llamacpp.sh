#!/usr/bin/env bash
# Decode tok/s of tlm against llama.cpp (node-llama-cpp's prebuilt CPU build) on the same F32
# GGUF, in the same run: random-weight llama2.c-shaped "15M" (dim 288, hidden 768, 6 layers,
# 6 heads) and "110M" (dim 768, hidden 2048, 12 layers, 12 heads), vocab 32000 (Llama's SPM
# vocabulary from ../shared/data), converted .bin -> .gguf by `tlm convert`.
# Usage: bash bench/formats/decode_vs_llamacpp.sh [THREADS="2"] [TOKENS=64]   (THREADS may list
# several counts, e.g. "1 2"). Note: ggml's worker threads spin while waiting, so on a machine
# whose cores are busy with other work llama.cpp's multi-thread figures collapse; compare on an
# idle machine.
# Prints a table and writes bench/out/decode_vs_llamacpp.json.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TLM=${TLM:-$ROOT/build/tlm}
THREADS_LIST=${1:-2}
N=${2:-64}
DATA=${TLM_SHARED_DATA:-$ROOT/../shared/data}
VOCAB=$DATA/tokenizers/ggml-vocab-llama-spm.gguf
OUT=$ROOT/bench/out
W=$OUT/decode_models
mkdir -p "$W"
[ -d "$ROOT/tests/node/node_modules/node-llama-cpp" ] || { echo "run scripts/setup.sh first"; exit 1; }
results=()
for spec in "15M 288 768 6 6 256" "110M 768 2048 12 12 1024"; do
  read -r name dim hidden layers heads seq <<<"$spec"
  gguf=$W/$name.gguf
  if [ ! -f "$gguf" ]; then
    /usr/bin/python3 "$ROOT/bench/formats/random_llama2c.py" "$W/$name.bin" "$dim" "$hidden" \
      "$layers" "$heads" 32000 "$seq"
    "$TLM" convert "$W/$name.bin" "$gguf" --to gguf -z "$VOCAB" 2>/dev/null
    rm -f "$W/$name.bin"
  fi
  for THREADS in $THREADS_LIST; do
  # tlm: the "decode steps" rate of tlm generate (one-token prompt, greedy, N new tokens)
  best_tlm=0
  best_lc=0
  for rep in 1 2 3; do
    line=$("$TLM" generate -m "$gguf" --ids 1 -n "$N" --temp 0 -t "$THREADS" --print-ids 2>&1 >/dev/null |
      grep -o 'decode steps in [0-9.]* s ([0-9.]* tok/s)' || true)
    r=$(echo "$line" | sed -E 's/.*\(([0-9.]+) tok\/s\).*/\1/')
    best_tlm=$(/usr/bin/python3 -c "print(max($best_tlm, ${r:-0}))")
    lc=$(cd "$ROOT/tests/node" && NODE_LLAMA_CPP_SKIP_DOWNLOAD=true node llama_decode_bench.mjs "$gguf" "$N" "$THREADS" |
      /usr/bin/python3 -c "import json,sys; print(json.load(sys.stdin)['tok_per_s'])")
    best_lc=$(/usr/bin/python3 -c "print(max($best_lc, $lc))")
  done
  ratio=$(/usr/bin/python3 -c "print(round($best_tlm / $best_lc, 3))")
  printf '%-5s tlm %8.1f tok/s   llama.cpp %8.1f tok/s   ratio %s  (F32, %s threads, best of 3)\n' \
    "$name" "$best_tlm" "$best_lc" "$ratio" "$THREADS"
  results+=("{\"model\": \"$name\", \"threads\": $THREADS, \"tokens\": $N, \"tlm_tok_s\": $best_tlm, \"llamacpp_tok_s\": $best_lc, \"ratio\": $ratio}")
  done
done
(IFS=,; echo "[${results[*]}]") >"$OUT/decode_vs_llamacpp.json"
