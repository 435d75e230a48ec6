#!/usr/bin/env bash
# The cost of subnormal floats in fp32 training: `tlm train --precision fp32` on the gpt2-124M-like
# config (GPT-2 tokenizer, Shakespeare, batch 4, T 256, 2 threads) from --init xavier, whose
# unit-variance embedding tied to the head starts at a loss near 300 (a saturated softmax: tiny
# probabilities and gradients), against --init gpt2 in the same run, alternately, ROUNDS rounds.
# tlm flushes subnormals to zero (src/core/fpenv.c), so the two should train at the same rate;
# without it the xavier run was 25-90x slower (its OpenBLAS products on subnormal operands).
# Prints each run's tokens/s (the median of its steps after the first) and the ratio of medians.
#
# usage: bash bench/train_subnormal.sh [STEPS=4] [ROUNDS=2]     (BUILD=build, THREADS=2)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-build}
DATA=${TLM_SHARED_DATA:-$ROOT/../shared/data}
OUT=$ROOT/bench/out/train_subnormal
STEPS=${1:-4}
ROUNDS=${2:-2}
THREADS=${THREADS:-2}
if [ -z "${KEEP_CORETYPE:-}" ]; then unset OPENBLAS_CORETYPE; fi
mkdir -p "$OUT"
cat >"$OUT/config.json" <<'JSON'
{"vocab_size":50257,"context_length":256,"d_model":768,"n_layers":12,"n_heads":12,"d_ff":2048}
JSON
declare -A RATES
for round in $(seq 1 "$ROUNDS"); do
  for init in xavier gpt2; do
    rm -rf "$OUT/$init"
    "$ROOT/$BUILD/tlm" train -c "$OUT/config.json" --data "$DATA/text/tinyshakespeare.txt" \
      -z "$DATA/tokenizers/gpt2" -o "$OUT/$init" --steps "$STEPS" --batch 4 --warmup 1 \
      --eval-interval 1000000 --log-interval 1 --precision fp32 --init "$init" -t "$THREADS" \
      2>"$OUT/$init.log"
    r=$(/usr/bin/python3 -c 'import json,statistics,sys
rates=[json.loads(l)["tokens_per_s"] for l in open(sys.argv[1])][1:]
print(statistics.median(rates))' "$OUT/$init/log.jsonl")
    loss=$(head -1 "$OUT/$init/log.jsonl" | sed 's/.*"train_loss": \([0-9.]*\).*/\1/')
    printf 'round %d  --init %-6s  first loss %9s  %8.1f tok/s\n' "$round" "$init" "$loss" "$r"
    RATES[$init]="${RATES[$init]:-} $r"
  done
done
/usr/bin/python3 - "${RATES[xavier]}" "${RATES[gpt2]}" <<'PY'
import statistics, sys
x, g = (statistics.median(map(float, a.split())) for a in sys.argv[1:])
print(f"median tok/s: xavier {x:.1f}, gpt2 {g:.1f}; xavier / gpt2 = {x / g:.3f}")
PY
