#!/usr/bin/env bash
# Prompt processing (pp128, tok/s) of tlm's three paths for block-type weights against llama.cpp,
# in the same run, alternating: the repacked 8-bit GEMM (qgemm, the default on AVX-512 VNNI; for
# BF16 the qgemm column is the default, vdpbf16ps on BF16-rounded activations),
# widened F32 tiles through OpenBLAS sgemm (TLM_QPREFILL=sgemm) and the integer decode kernels
# over all rows (TLM_QPREFILL=int8), each timed by `tlm bench` (warm-up, then REPS runs; qgemm
# repacks each 16-row group as it reaches it; TLM_QCACHE=on would keep the copy, and TLM_AMX=off
# keep AMX's tiles out, with TLM a benchmark build, cmake -DTLM_BENCH_KNOBS=ON, the only build that
# reads them); llama-bench -p 128.
# The GGUF files are those bench/quant/run.sh makes (run it once first, or set DIR).
#
# Usage: bash bench/quant/prefill_paths.sh [THREADS=2] [REPS=3]
#   env: LLAMA_BIN (default /work/llama.cpp/build/bin), MODEL (110M), TYPES ("Q8_0 Q4_0 Q4_K_M"),
#        DIR (bench/out/quant), TLM: a benchmark build (cmake -DTLM_BENCH_KNOBS=ON), the only kind
#        that reads TLM_QPREFILL (src/core/knob.h); without TLM, one is built in build-bench.
# OPENBLAS_CORETYPE is unset (OpenBLAS's own detection) unless KEEP_CORETYPE=1. Run on an
# otherwise idle machine. Writes bench/out/quant/prefill.json.
set -euo pipefail
if [ -z "${KEEP_CORETYPE:-}" ]; then unset OPENBLAS_CORETYPE; fi
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
if [ -z "${TLM:-}" ]; then
  cmake -S "$ROOT" -B "$ROOT/build-bench" -DCMAKE_BUILD_TYPE=Release -DTLM_BENCH_KNOBS=ON >/dev/null
  cmake --build "$ROOT/build-bench" -j "$(nproc)" --target tlm_cli >/dev/null
  TLM=$ROOT/build-bench/tlm
fi
LLAMA_BIN=${LLAMA_BIN:-/work/llama.cpp/build/bin}
T=${1:-2}
REPS=${2:-3}
MODEL=${MODEL:-110M}
TYPES=${TYPES:-"Q8_0 Q4_0 Q4_K_M BF16"}
DIR=${DIR:-$ROOT/bench/out/quant}
[ -x "$TLM" ] || { echo "build tlm first (a benchmark build: cmake -DTLM_BENCH_KNOBS=ON)"; exit 1; }

tlm_pp() { # FILE MODE -> tok/s
  TLM_QPREFILL=$2 "$TLM" bench -m "$1" -p 128 -n 0 -t "$T" -r "$REPS" -o json 2>/dev/null |
    /usr/bin/python3 -c "import json,sys; r=json.load(sys.stdin); print(r[0]['avg_ts'])"
}
llama_pp() {
  [ -x "$LLAMA_BIN/llama-bench" ] || { echo 0; return; }
  "$LLAMA_BIN/llama-bench" -m "$1" -p 128 -n 0 -t "$T" -r "$REPS" -o json 2>/dev/null |
    /usr/bin/python3 -c "import json,sys; r=json.load(sys.stdin); print(r[0]['avg_ts'])"
}

printf '%-8s %9s %9s %9s %9s | %7s %7s\n' type qgemm sgemm int8 llama "q/llama" "q/sgemm"
out=()
for type in $TYPES; do
  f=$DIR/$MODEL-$type.gguf
  [ -f "$f" ] || { echo "missing $f (run bench/quant/run.sh first)"; exit 1; }
  q=$(tlm_pp "$f" qgemm) s=$(tlm_pp "$f" sgemm) i=$(tlm_pp "$f" int8) l=$(llama_pp "$f")
  rl=$(/usr/bin/python3 -c "print(round($q / max($l, 1e-9), 3))")
  rs=$(/usr/bin/python3 -c "print(round($q / max($s, 1e-9), 3))")
  printf '%-8s %9.1f %9.1f %9.1f %9.1f | %7s %7s\n' "$type" "$q" "$s" "$i" "$l" "$rl" "$rs"
  out+=("{\"model\": \"$MODEL\", \"type\": \"$type\", \"threads\": $T, \"qgemm\": $q, \"sgemm\": $s, \"int8\": $i, \"llamacpp\": $l}")
done
mkdir -p "$ROOT/bench/out/quant"
(IFS=,; echo "[${out[*]}]") >"$ROOT/bench/out/quant/prefill.json"
echo "wrote bench/out/quant/prefill.json"
