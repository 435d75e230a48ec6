#!/usr/bin/env bash
# Forward and training throughput of tlm against the PyTorch reference (tests/reference/model.py)
# in the same run: same configs, batch, threads and OpenBLAS. Prints a table of medians.
# usage: bench/run_model.sh [forward|train|all] [ITERS]
# Env: THREADS (default 2), OMP_WAIT_POLICY (default passive for both sides), CONFIGS (the
# training configs: "tiny nanoGPT-char small gpt2-124M-like"), JSON=FILE (also write the rows as
# a JSON array there). OPENBLAS_CORETYPE is unset (OpenBLAS's own detection,
# for both sides: PyTorch uses the same OpenBLAS) unless KEEP_CORETYPE=1; OpenBLAS 0.3.21 picks
# its Prescott kernels on CPUs it does not know (OPENBLAS_VERBOSE=2 prints the core).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-build}
WHAT=${1:-all}
ITERS=${2:-5}
THREADS=${THREADS:-2}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
if [ -z "${KEEP_CORETYPE:-}" ]; then unset OPENBLAS_CORETYPE; fi
[ -x "$ROOT/$BUILD/bench_model" ] || make -C "$ROOT" BUILD="$BUILD" >/dev/null
PY=/usr/bin/python3
echo "# $(nproc) cores; threads $THREADS; OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset};" \
     "OMP_WAIT_POLICY=$OMP_WAIT_POLICY; load $(cut -d' ' -f1-3 /proc/loadavg)"
printf "%-16s %-8s %5s %5s %12s %12s %7s\n" config mode B T tlm_tok/s torch_tok/s ratio
run() { # name mode B T json
    local name=$1 mode=$2 B=$3 T=$4 cfg=$5 it=$ITERS
    local a b
    if [ "$mode" = train ] && [[ " ${CONFIGS:-tiny nanoGPT-char small gpt2-124M-like} " != *" $name "* ]]; then
        return 0
    fi
    a=$("$ROOT/$BUILD/bench_model" "$mode" "$cfg" "$B" "$T" "$it" "$THREADS" | sed 's/.*"tokens_per_s": \([0-9.]*\).*/\1/')
    b=$($PY "$ROOT/bench/torch_model.py" "$mode" "$cfg" "$B" "$T" "$it" "$THREADS" | sed 's/.*"tokens_per_s": \([0-9.]*\).*/\1/')
    printf "%-16s %-8s %5s %5s %12.0f %12.0f %6.2fx\n" "$name" "$mode" "$B" "$T" "$a" "$b" \
        "$(awk -v a="$a" -v b="$b" 'BEGIN { print a / b }')"
    rows+=("{\"config\": \"$name\", \"mode\": \"$mode\", \"B\": $B, \"T\": $T, \"threads\": $THREADS, \"tlm_tok_s\": $a, \"torch_tok_s\": $b}")
}
rows=()
GPT2LIKE='{"vocab_size":50257,"context_length":256,"d_model":768,"n_layers":12,"n_heads":12,"d_ff":2048}'
TINY='{"vocab_size":65,"context_length":64,"d_model":128,"n_layers":4,"n_heads":4,"norm":"layernorm","position":"learned","ffn":"gelu","tie_embeddings":true}'
CHAR='{"vocab_size":65,"context_length":256,"d_model":384,"n_layers":6,"n_heads":6,"norm":"layernorm","position":"learned","ffn":"gelu","tie_embeddings":true}'
SMALL='{"vocab_size":10000,"context_length":256,"d_model":512,"n_layers":4,"n_heads":16,"d_ff":1344}'
if [ "$WHAT" = forward ] || [ "$WHAT" = all ]; then
    run gpt2-124M-like forward 4 256 "$GPT2LIKE"
fi
if [ "$WHAT" = train ] || [ "$WHAT" = all ]; then
    run tiny train 12 64 "$TINY"
    run nanoGPT-char train 64 256 "$CHAR"
    run small train 8 256 "$SMALL"
    run gpt2-124M-like train 4 256 "$GPT2LIKE"
fi
if [ -n "${JSON:-}" ]; then (IFS=,; echo "[${rows[*]}]") >"$JSON"; fi
