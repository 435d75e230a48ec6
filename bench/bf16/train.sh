#!/usr/bin/env bash
# Mixed-precision training throughput: tlm bf16 against tlm fp32 and PyTorch 1.13 under
# torch.autocast("cpu", dtype=torch.bfloat16), in the same run, same configs as run_model.sh
# (gpt2-124M-like B4 T256, small B8 T256, nanoGPT-char B64 T256), same threads. The three
# alternate within each round (host drift hits them alike); medians over ROUNDS rounds of ITERS
# timed steps each. GFLOP/s count 6 * params + 12 * layers * d_model * T per token (the usual
# estimate of a training step's matrix arithmetic, attention included), against the vdpbf16ps
# peak that bench/bf16/run.sh measures.
# usage: bench/bf16/train.sh [ROUNDS] [ITERS] [CONFIG...]   (configs: gpt2 small char)
# Env: THREADS (default 2), TORCH_FP32=1 adds PyTorch fp32, JSON=FILE also writes the medians
# there as a JSON array. OPENBLAS_CORETYPE is unset (OpenBLAS's own detection) unless
# KEEP_CORETYPE=1; OMP_WAIT_POLICY defaults to passive.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-build}
ROUNDS=${1:-3}
ITERS=${2:-3}
shift $(( $# > 2 ? 2 : $# )) || true
CONFIGS=("$@")
[ ${#CONFIGS[@]} -gt 0 ] || CONFIGS=(gpt2 small char)
THREADS=${THREADS:-2}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
if [ -z "${KEEP_CORETYPE:-}" ]; then unset OPENBLAS_CORETYPE; fi
[ -x "$ROOT/$BUILD/bench_model" ] || make -C "$ROOT" BUILD="$BUILD" >/dev/null
PY=/usr/bin/python3
echo "# $(nproc) cores; threads $THREADS; OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset};" \
     "OMP_WAIT_POLICY=$OMP_WAIT_POLICY; load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%FT%TZ)"
cfg() {
    case $1 in
    gpt2) echo '4 256 {"vocab_size":50257,"context_length":256,"d_model":768,"n_layers":12,"n_heads":12,"d_ff":2048}' ;;
    small) echo '8 256 {"vocab_size":10000,"context_length":256,"d_model":512,"n_layers":4,"n_heads":16,"d_ff":1344}' ;;
    char) echo '64 256 {"vocab_size":65,"context_length":256,"d_model":384,"n_layers":6,"n_heads":6,"norm":"layernorm","position":"learned","ffn":"gelu","tie_embeddings":true}' ;;
    *) echo "unknown config $1" >&2; exit 2 ;;
    esac
}
field() { sed "s/.*\"$1\": \([0-9.]*\).*/\1/"; }
med() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
printf "%-8s %10s %10s %10s %10s | %8s %8s | %s\n" config tlm_fp32 tlm_bf16 torch_bf16 \
    "${TORCH_FP32:+torch_fp32}" bf16/fp32 bf16/torch "tok/s (median); tlm bf16 GFLOP/s"
rows=()
for name in "${CONFIGS[@]}"; do
    read -r B T json <<<"$(cfg "$name")"
    a=() b=() c=() d=() params=0
    for _ in $(seq 1 "$ROUNDS"); do
        out=$(PRECISION=fp32 "$ROOT/$BUILD/bench_model" train "$json" "$B" "$T" "$ITERS" "$THREADS")
        a+=("$(field tokens_per_s <<<"$out")")
        out=$(PRECISION=bf16 "$ROOT/$BUILD/bench_model" train "$json" "$B" "$T" "$ITERS" "$THREADS")
        b+=("$(field tokens_per_s <<<"$out")")
        params=$(field params <<<"$out")
        out=$(PRECISION=bf16 $PY "$ROOT/bench/torch_model.py" train "$json" "$B" "$T" "$ITERS" "$THREADS")
        c+=("$(field tokens_per_s <<<"$out")")
        if [ -n "${TORCH_FP32:-}" ]; then
            out=$(PRECISION=fp32 $PY "$ROOT/bench/torch_model.py" train "$json" "$B" "$T" "$ITERS" "$THREADS")
            d+=("$(field tokens_per_s <<<"$out")")
        fi
    done
    ma=$(printf '%s\n' "${a[@]}" | med) mb=$(printf '%s\n' "${b[@]}" | med)
    mc=$(printf '%s\n' "${c[@]}" | med) md=""
    [ ${#d[@]} -eq 0 ] || md=$(printf '%s\n' "${d[@]}" | med)
    L=$(sed 's/.*"n_layers":\([0-9]*\).*/\1/' <<<"$json") D=$(sed 's/.*"d_model":\([0-9]*\).*/\1/' <<<"$json")
    rows+=("{\"config\": \"$name\", \"B\": $B, \"T\": $T, \"threads\": $THREADS, \"tlm_fp32\": $ma, \"tlm_bf16\": $mb, \"torch_bf16\": $mc, \"torch_fp32\": ${md:-null}}")
    printf "%-8s %10.0f %10.0f %10.0f %10s | %7.2fx %7.2fx | %.0f\n" "$name" "$ma" "$mb" "$mc" "$md" \
        "$(awk -v x="$mb" -v y="$ma" 'BEGIN { print x / y }')" \
        "$(awk -v x="$mb" -v y="$mc" 'BEGIN { print x / y }')" \
        "$(awk -v t="$mb" -v p="$params" -v l="$L" -v d="$D" -v T="$T" 'BEGIN { print t * (6 * p + 12 * l * d * T) * 1e-9 }')"
done
if [ -n "${JSON:-}" ]; then (IFS=,; echo "[${rows[*]}]") >"$JSON"; fi
