#!/usr/bin/env bash
# Whether two tlm processes sharing the cores collapse: decode tok/s of one `tlm generate` alone,
# then of two at once (their sum), under several OpenMP wait settings: tlm's default (a bounded
# spin before sleeping, GOMP_SPINCOUNT=3000, set by src/cli/main.c), passive waits, other spin
# lengths (GOMP_SPINCOUNT=N; tlm keeps a user's setting) and active waits. A setting is safe when
# the two together keep about the rate of one alone. Decode steps fall back to one thread while
# the cores look shared (src/infer/share.c); TLM_SHARED_CORES=ignore in the environment times the
# same settings without that, with TLM pointing at a benchmark build (cmake -DTLM_BENCH_KNOBS=ON),
# the only build that reads it.
#
# Usage: bash bench/quant/two_decoders.sh MODEL.gguf [THREADS=2] [N=64] [SPINS="300 3000 30000"]
# OPENBLAS_CORETYPE is unset (see bench/quant/run.sh). Run on an otherwise idle machine.
set -euo pipefail
unset OPENBLAS_CORETYPE
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TLM=${TLM:-$ROOT/build/tlm}
MODEL=${1:?usage: two_decoders.sh MODEL.gguf [THREADS] [N] [SPINS]}
T=${2:-2}
N=${3:-64}
SPINS=${4:-"300 3000 30000"}

rate() { # env... -> decode tok/s of one run
  env "$@" "$TLM" generate -m "$MODEL" --ids 1 -n "$N" --temp 0 -t "$T" --print-ids 2>&1 >/dev/null |
    sed -nE 's/.*decode steps in [0-9.]+ s \(([0-9.]+) tok\/s\).*/\1/p'
}

run() { # label env...
  local label=$1
  shift
  local one a b tmp
  one=$(rate "$@")
  tmp=$(mktemp -d)
  rate "$@" >"$tmp/a" &
  rate "$@" >"$tmp/b" &
  wait
  a=$(cat "$tmp/a") b=$(cat "$tmp/b")
  rm -rf "$tmp"
  /usr/bin/python3 -c "
one, a, b = float('${one:-0}'), float('${a:-0}'), float('${b:-0}')
print(f'{\"$label\":<22} one alone {one:8.1f} tok/s   two at once {a:8.1f} + {b:8.1f} = {a + b:8.1f}'
      f'   ({(a + b) / max(one, 1e-9):.2f}x of one)')"
}

run "default (spin 3000)"
run "OMP_WAIT_POLICY=passive" OMP_WAIT_POLICY=passive
for s in $SPINS; do run "GOMP_SPINCOUNT=$s" GOMP_SPINCOUNT="$s"; done
run "OMP_WAIT_POLICY=active" OMP_WAIT_POLICY=active
