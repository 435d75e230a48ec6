#!/usr/bin/env bash
# Where a training step's time goes, by CPU samples (perf): bench_model train runs twice, with
# ITERS_A and ITERS_B timed steps, and the difference of the two profiles is ITERS_B - ITERS_A
# steady steps (model init, the first steps' page faults and oneDNN's JIT are in both runs and
# cancel). Samples count only while our threads run, so the shares hold on a loaded machine where
# wall times do not. Categories: oneDNN's matmul kernels (JIT code), OpenBLAS sgemm (attention and
# the fp32 products), rounding to bf16, the optimizer (AdamW, clipping), the kernel (page faults,
# futex wake-ups), OpenMP runtime, then the other tlm functions one by one (norms, softmax, ...).
# usage: bench/bf16/profile.sh [CONFIG] [PRECISION]   (configs: gpt2 small char; bf16 or fp32)
# Env: THREADS (2), ITERS_A (2), ITERS_B (6), TOP (12 functions listed). Needs perf (Debian
# linux-perf). OPENBLAS_CORETYPE is unset (OpenBLAS's own detection) unless KEEP_CORETYPE=1.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-build}
NAME=${1:-gpt2}
PREC=${2:-bf16}
THREADS=${THREADS:-2}
A=${ITERS_A:-2}
B=${ITERS_B:-6}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
if [ -z "${KEEP_CORETYPE:-}" ]; then unset OPENBLAS_CORETYPE; fi
command -v perf >/dev/null || { echo "profile.sh: needs perf (apt-get install linux-perf)" >&2; exit 2; }
[ -x "$ROOT/$BUILD/bench_model" ] || make -C "$ROOT" BUILD="$BUILD" >/dev/null
case $NAME in
gpt2) BT="4 256" json='{"vocab_size":50257,"context_length":256,"d_model":768,"n_layers":12,"n_heads":12,"d_ff":2048}' ;;
small) BT="8 256" json='{"vocab_size":10000,"context_length":256,"d_model":512,"n_layers":4,"n_heads":16,"d_ff":1344}' ;;
char) BT="64 256" json='{"vocab_size":65,"context_length":256,"d_model":384,"n_layers":6,"n_heads":6,"norm":"layernorm","position":"learned","ffn":"gelu","tie_embeddings":true}' ;;
*) echo "unknown config $NAME (gpt2 small char)" >&2; exit 2 ;;
esac
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for n in $A $B; do
    # shellcheck disable=SC2086
    PRECISION=$PREC perf record -q -o "$tmp/p$n.data" "$ROOT/$BUILD/bench_model" train "$json" $BT "$n" \
        "$THREADS" >"$tmp/out$n.json" 2>/dev/null
    # One line per (category, function): samples.
    perf report -i "$tmp/p$n.data" --stdio --sort dso,symbol -F sample,dso,sym -t '|' 2>/dev/null |
        grep -v '^#' | awk -F'|' -v n="$n" '
        NF >= 3 {
            s = $1 + 0; dso = $2; sym = $3
            gsub(/^ +| +$/, "", dso); sub(/^\[[.k]\] +/, "", sym); gsub(/ +-? *-? *$/, "", sym)
            if (dso ~ /^\[JIT\]/ || dso ~ /libdnnl/) c = "oneDNN matmul (bf16 products)"
            else if (dso ~ /openblas/) c = "OpenBLAS sgemm (fp32 products, attention)"
            else if (dso ~ /kernel/) c = "kernel (page faults, wake-ups)"
            else if (dso ~ /libgomp/) c = "OpenMP runtime"
            else if (dso ~ /^libc/) c = "libc (memset, memcpy, malloc)"
            else if (dso ~ /^libm/ || sym ~ /rng_normal|model_init/)
                c = "model init (cancels; what is left is sampling noise)"
            else if (sym ~ /f32_to_bf16/) c = "rounding to bf16"
            else if (sym ~ /adamw|sumsq|clip/) c = "optimizer (AdamW, clipping)"
            else { sub(/\._omp_fn\.[0-9]+$/, "", sym); c = "tlm: " sym }
            t[c] += s
        }
        END { for (c in t) printf "%s|%d\n", c, t[c] }' >"$tmp/c$n.txt"
done
echo "# $NAME $PREC, $THREADS threads: steady-step profile from $((B - A)) steps (perf samples," \
     "runs of $A and $B steps differenced); load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%FT%TZ)"
awk -F'|' -v top="${TOP:-12}" -v steps=$((B - A)) '
    FNR == NR { a[$1] = $2; next }
    { d = $2 - a[$1]; if (d > 0) { v[$1] = d; tot += d } }
    END {
        n = 0
        for (c in v) if (c !~ /^tlm: /) printf "%6.1f%%  %s\n", 100 * v[c] / tot, c
        # the tlm functions, largest first, the rest summed
        for (c in v) if (c ~ /^tlm: /) { k[++n] = c }
        for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (v[k[j]] > v[k[i]]) { x = k[i]; k[i] = k[j]; k[j] = x }
        rest = 0
        for (i = 1; i <= n; i++) if (i <= top) printf "%6.1f%%  %s\n", 100 * v[k[i]] / tot, k[i]; else rest += v[k[i]]
        if (rest > 0) printf "%6.1f%%  tlm: the other functions\n", 100 * rest / tot
        printf "(%d samples per step)\n", tot / steps
    }' "$tmp/c$A.txt" "$tmp/c$B.txt" | sort -t'%' -k1,1 -g -r
