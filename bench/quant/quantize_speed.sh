#!/usr/bin/env bash
# Quantizing speed: tlm quantize (its default: every core) against llama-quantize given the same
# thread count (THREADS, default every core), on the same F32 GGUF, every type, alternating, median of REPS wall times. The two files must be the same bytes
# (checked). Uses run.sh's random 110M model (bench/out/quant/110M-F32.gguf; run run.sh first).
#
#   LLAMA_BIN=/work/llama.cpp/build-noamx/bin bash bench/quant/quantize_speed.sh [THREADS] [REPS]
set -euo pipefail
unset OPENBLAS_CORETYPE
cd "$(dirname "$0")/../.."
THREADS=${1:-$(nproc)} REPS=${2:-3}
TLM=${TLM:-build/tlm}
LLAMA_BIN=${LLAMA_BIN:-/work/llama.cpp/build/bin}
SRC=${SRC:-bench/out/quant/110M-F32.gguf}
TYPES=${TYPES:-"q8_0 q6_k q5_k_m q4_k_m q4_0 iq4_xs q3_k_m q2_k"}
for f in "$TLM" "$LLAMA_BIN/llama-quantize" "$SRC"; do
  [ -e "$f" ] || { echo "quantize_speed.sh: $f not found" >&2; exit 1; }
done
export LD_LIBRARY_PATH="$LLAMA_BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
secs() { local t0 t1; t0=$(date +%s.%N); "$@" >/dev/null 2>&1; t1=$(date +%s.%N); echo "$t1 - $t0" | bc; }
med() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
echo "| type | tlm quantize s | llama-quantize s | ratio | same bytes |"
echo "| --- | ---: | ---: | ---: | --- |"
for t in $TYPES; do
  ts=() ls=()
  for r in $(seq "$REPS"); do
    ts+=("$(secs "$TLM" quantize "$SRC" "$W/t.gguf" --type "$t")")
    ls+=("$(secs "$LLAMA_BIN/llama-quantize" "$SRC" "$W/l.gguf" "$t" "$THREADS")")
  done
  a=$(med "${ts[@]}") b=$(med "${ls[@]}")
  same=$(cmp -s "$W/t.gguf" "$W/l.gguf" && echo yes || echo NO)
  awk -v t="$t" -v a="$a" -v b="$b" -v s="$same" \
    'BEGIN { printf "| %s | %.2f | %.2f | %.2f | %s |\n", t, a, b, b / a, s }'
done
