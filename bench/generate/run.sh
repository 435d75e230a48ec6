#!/usr/bin/env bash
# Generation speed, batch 1: tlm (KV cache, sgemm prefill, matrix-vector decode) against the
# PyTorch reference model with its KV cache, measured in the same run with the same thread count
# and BLAS setting, on the "small" and "gpt2-124M-like" configs. Also measures the read bandwidth
# that bounds decoding (all weights are streamed once per token).
# usage: bench/generate/run.sh [THREADS] [REPS]      (BUILD=build by default)
# Env: JSON=FILE also writes each config's figures there as a JSON array; CONFIGS picks configs
# ("small gpt2-124m-like"); OPENBLAS_CORETYPE is used as set, for both sides.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-build}
OUT=${OUT:-$ROOT/bench/out/generate}
THREADS=${1:-2}
REPS=${2:-3}
PY=${PYTHON:-/usr/bin/python3}
mkdir -p "$OUT"
[ -f "$ROOT/$BUILD/libtlm.a" ] || { echo "build first: make BUILD=$BUILD" >&2; exit 1; }
cc -O2 -std=c11 -D_DEFAULT_SOURCE -fopenmp -march=native -I"$ROOT/include" -I"$ROOT/src" \
  "$ROOT/bench/generate/bench_gen.c" "$ROOT/$BUILD/libtlm.a" -lopenblas -ldnnl -lcjson \
  -lm -o "$OUT/bench_gen"
echo "# machine: $(nproc) cores, $(uname -m); load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# threads: $THREADS (tlm and torch); OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-<unset>} for both"
export OMP_NUM_THREADS=$THREADS
summary=()
for cfg in ${CONFIGS:-small gpt2-124m-like}; do
  case $cfg in
    small) plen=255 steps=128 ;;       # context 256: the prompt plus one token fits
    gpt2-124m-like) plen=256 steps=64 ;;
  esac
  echo "## $cfg: $(tr -d '\n' <"$ROOT/bench/generate/$cfg.json")"
  t=$("$OUT/bench_gen" "$ROOT/bench/generate/$cfg.json" "$THREADS" $plen $steps "$REPS")
  echo "$t" | grep -v '^RESULT'
  p=$("$PY" "$ROOT/bench/generate/torch_peer.py" "$ROOT/bench/generate/$cfg.json" "$THREADS" \
      $plen $steps "$REPS")
  echo "$p" | grep -v '^RESULT'
  summary+=("$cfg $(echo "$t" | grep '^RESULT') $(echo "$p" | grep '^RESULT')")
done
echo "## summary (targets: decode >= 3x torch and >= 90% of the bandwidth bound; prefill >= 1.5x torch)"
rows=()
for line in "${summary[@]}"; do
  name=${line%% *}
  tp=$(sed -E 's/.*RESULT tlm prefill=([0-9.]+).*/\1/' <<<"$line")
  td=$(sed -E 's/.*RESULT tlm prefill=[0-9.]+ decode=([0-9.]+).*/\1/' <<<"$line")
  bound=$(sed -E 's/.*bound=([0-9.]+).*/\1/' <<<"$line")
  pp=$(sed -E 's/.*RESULT torch prefill=([0-9.]+).*/\1/' <<<"$line")
  pd=$(sed -E 's/.*RESULT torch prefill=[0-9.]+ decode=([0-9.]+).*/\1/' <<<"$line")
  awk -v n="$name" -v tp="$tp" -v td="$td" -v b="$bound" -v pp="$pp" -v pd="$pd" 'BEGIN {
    printf "%-16s decode %7.1f tok/s = %4.1fx torch (%5.1f), %3.0f%% of bound %.1f | prefill %7.1f tok/s = %4.2fx torch (%6.1f)\n",
      n, td, td / pd, pd, 100 * td / b, b, tp, tp / pp, pp }'
  rows+=("{\"config\": \"$name\", \"threads\": $THREADS, \"tlm_prefill\": $tp, \"tlm_decode\": $td, \"decode_bound\": $bound, \"torch_prefill\": $pp, \"torch_decode\": $pd}")
done
if [ -n "${JSON:-}" ]; then (IFS=,; echo "[${rows[*]}]") >"$JSON"; fi
