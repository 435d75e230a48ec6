#!/usr/bin/env bash
# Accuracy of the KV cache's types, as llama-perplexity -ctk/-ctv measures it: on the model that
# bench/quant/accuracy.sh trains (OUT/f32.gguf: F32 weights, so that only the cache is rounded;
# head size 64) and its held-out text, the perplexity with each cache type by tlm eval --cache-type
# and by llama.cpp's llama-perplexity (flash attention on, which it needs for a quantized V cache),
# the same chunks (tlm eval --llama-ppl), their ratio and each type's change against F32's.
#
#   bash bench/quant/accuracy.sh first (it trains the model), then
#   LLAMA_BIN=/path/to/llama.cpp/build/bin bash bench/quant/kv_accuracy.sh
#
# Settings (environment): TLM (build/tlm), LLAMA_BIN (/work/llama.cpp/build/bin), OUT
# (bench/out/quant), MODEL (OUT/f32.gguf), THREADS (2), TYPES (f32 f16 bf16 q8_0 q5_1 q5_0 iq4_nl
# q4_1 q4_0). The table goes to stdout and OUT/kv_accuracy.md.
set -euo pipefail
unset OPENBLAS_CORETYPE
cd "$(dirname "$0")/../.."
TLM=${TLM:-build/tlm}
LLAMA_BIN=${LLAMA_BIN:-/work/llama.cpp/build/bin}
OUT=${OUT:-bench/out/quant}
MODEL=${MODEL:-$OUT/f32.gguf}
THREADS=${THREADS:-2}
TYPES=${TYPES:-"f32 f16 bf16 q8_0 q5_1 q5_0 iq4_nl q4_1 q4_0"}
for f in "$TLM" "$LLAMA_BIN/llama-perplexity" "$MODEL" "$OUT/held.txt"; do
  [ -e "$f" ] || { echo "kv_accuracy.sh: $f not found (bench/quant/accuracy.sh writes the model)" >&2; exit 1; }
done
CTX=$("$TLM" info -m "$MODEL" | awk '$1 == "context_length" { print $2 }')
{
  echo "| cache | tlm ppl | llama.cpp ppl | tlm / llama.cpp | tlm vs F32 cache | llama.cpp vs F32 cache |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: |"
} | tee "$OUT/kv_accuracy.md"
base_a="" base_b=""
for t in $TYPES; do
  a=$("$TLM" eval -m "$MODEL" --data "$OUT/held.txt" --llama-ppl --json -t "$THREADS" \
    --cache-type "$t" | /usr/bin/python3 -c "import json,sys; print('%.4f' % json.load(sys.stdin)['perplexity'])")
  # as accuracy.sh: llama.cpp's last log lines are sometimes lost at exit; run it again then
  b=""
  for attempt in 1 2 3; do
    "$LLAMA_BIN/llama-perplexity" -m "$MODEL" -f "$OUT/held.txt" -c "$CTX" -b "$CTX" \
      -t "$THREADS" -fa on -ctk "$t" -ctv "$t" </dev/null >"$OUT/kv_$t.perplexity.log" 2>&1 || true
    b=$(sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p' "$OUT/kv_$t.perplexity.log")
    [ -n "$b" ] && break
  done
  [ -n "$b" ] || { echo "llama-perplexity failed with -ctk $t:" >&2; tail -5 "$OUT/kv_$t.perplexity.log" >&2; exit 1; }
  [ -z "$base_a" ] && base_a=$a base_b=$b
  awk -v t="$t" -v a="$a" -v b="$b" -v fa="$base_a" -v fb="$base_b" \
    'BEGIN { printf "| %s | %s | %s | %.4f | %+.3f%% | %+.3f%% |\n", t, a, b, a / b,
             100 * (a / fa - 1), 100 * (b / fb - 1) }' | tee -a "$OUT/kv_accuracy.md"
done
