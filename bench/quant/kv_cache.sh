#!/usr/bin/env bash
# Decode over a long context by the KV cache's type: tlm's F16 (default), Q8_0 and Q4_0 caches against
# llama.cpp's (llama-bench -ctk/-ctv, flash attention on, which llama.cpp needs for a quantized V
# cache and which is also its faster F16 path here), in the same run, alternating the two sides.
#
#   LLAMA_BIN=/path/to/llama.cpp/build/bin bash bench/quant/kv_cache.sh [THREADS] [ROUNDS]
#
# Model: bench/out/quant/110M-Q4_K_M.gguf (run.sh writes it; head size 64, context 1024). Per cache
# type and depth D (0, 512, 896): tgN after D cached positions (llama-bench's -d; tlm bench -d), the
# median over ROUNDS (default 3) of one warm-up plus three timed runs each. The cache's bytes per
# token of context: F16 36 KiB, Q8_0 19.1 KiB, Q4_0 10.1 KiB (110M: 12 layers, 2 x 768 values each). Prints a table
# and writes bench/out/quant/kv_cache.json.
set -euo pipefail
unset OPENBLAS_CORETYPE
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TLM=${TLM:-$ROOT/build/tlm}
LLAMA_BIN=${LLAMA_BIN:-/work/llama.cpp/build/bin}
T=${1:-2}
ROUNDS=${2:-3}
N=${N:-32}
DEPTHS=${DEPTHS:-"0 512 896"}
TYPES=${TYPES:-"f16 q8_0 q4_0"}
M=${MODEL:-$ROOT/bench/out/quant/110M-Q4_K_M.gguf}
OUT=$ROOT/bench/out/quant
[ -f "$M" ] || { echo "no $M (bench/quant/run.sh writes it)"; exit 1; }
[ -x "$LLAMA_BIN/llama-bench" ] || { echo "no llama-bench in $LLAMA_BIN (set LLAMA_BIN)"; exit 1; }
[ -x "$TLM" ] || { echo "build tlm first (make)"; exit 1; }
py() { /usr/bin/python3 -c "$1"; }
rate() { # SIDE TYPE DEPTH -> tok/s
  local d=$3
  if [ "$1" = tlm ]; then
    "$TLM" bench -m "$M" -p 0 -n "$N" -d "$d" -t "$T" -r 3 --cache-type "$2" -o json 2>/dev/null
  else
    "$LLAMA_BIN/llama-bench" -m "$M" -p 0 -n "$N" -d "$d" -t "$T" -r 3 -fa 1 -ctk "$2" -ctv "$2" \
      -o json 2>/dev/null
  fi | py "import json,sys; print(json.load(sys.stdin)[0]['avg_ts'])"
}
declare -A got
for r in $(seq "$ROUNDS"); do
  for d in $DEPTHS; do
    for ct in $TYPES; do
      for side in tlm llama; do got[$side,$ct,$d]+="$(rate $side $ct $d) "; done
    done
  done
done
med() { py "import statistics; print(round(statistics.median([float(x) for x in '$1'.split()]), 1))"; }
printf '%-6s %5s | %9s %9s %6s\n' cache depth "tlm t/s" "llama t/s" ratio
json="["
for ct in $TYPES; do
  for d in $DEPTHS; do
    a=$(med "${got[tlm,$ct,$d]}"); b=$(med "${got[llama,$ct,$d]}")
    ratio=$(py "print(round($a / max($b, 1e-9), 2))")
    printf '%-6s %5s | %9s %9s %6s\n' "$ct" "$d" "$a" "$b" "$ratio"
    json+="{\"cache\": \"$ct\", \"depth\": $d, \"threads\": $T, \"tlm\": $a, \"llamacpp\": $b},"
  done
done
echo "${json%,}]" >"$OUT/kv_cache.json"
