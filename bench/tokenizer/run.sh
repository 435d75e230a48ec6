#!/usr/bin/env bash
# Tokenizer benchmarks: BPE training time and encode speed against tiktoken / js-tiktoken, all in
# one run. Needs `make` (BUILD=... to pick the build directory) and `npm install` in bench/.
# usage: bench/tokenizer/run.sh [REPS]
# Env: JSON=FILE also writes every result line (tlm's and the peers') there as a JSON array, each
# with a "bench" field (train_10k, train_32k_corpus, train_32k_big, train_32k_big8, encode).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-build}
DATA=${TLM_SHARED_DATA:-$ROOT/../shared/data}
OUT=${OUT:-$ROOT/bench/out/tokenizer}
REPS=${1:-5}
mkdir -p "$OUT"
[ -f "$ROOT/$BUILD/libtlm.a" ] || { echo "build first: make BUILD=$BUILD" >&2; exit 1; }
[ -d "$ROOT/bench/node_modules/tiktoken" ] || (cd "$ROOT/bench" && npm install --no-audit --no-fund >&2)
cc -O2 -std=c11 -D_POSIX_C_SOURCE=200809L -fopenmp -I"$ROOT/include" \
  "$ROOT/bench/tokenizer/bench_tok.c" "$ROOT/$BUILD/libtlm.a" -lopenblas -ldnnl -lcjson -lm \
  -o "$OUT/bench_tok"
TS=$DATA/text/tinystories_2MiB.txt
echo "# machine: $(nproc) cores, $(uname -m); load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# BPE training: tinystories_2MiB.txt -> vocab 10000 (target < 2 s)"
rows=()
run() { # TAG COMMAND...: prints the command's JSON lines and keeps them, tagged
  local tag=$1 line
  shift
  while IFS= read -r line; do
    echo "$line"
    case $line in "{"*) rows+=("{\"bench\": \"$tag\", ${line#\{}") ;; esac
  done < <("$@")
}
run train_10k "$OUT/bench_tok" train "$TS" 10000 '<|endoftext|>'
echo "# BPE training: larger inputs -> vocab 32000"
BIG=$OUT/big.txt
: >"$BIG"
for k in 1 2 3 4; do cat "$TS" "$DATA/text/tinyshakespeare.txt" "$DATA/text/cs336/corpus.en" >>"$BIG"; done
run train_32k_corpus "$OUT/bench_tok" train "$DATA/text/cs336/corpus.en" 32000 '<|endoftext|>'
run train_32k_big "$OUT/bench_tok" train "$BIG" 32000 '<|endoftext|>'
for k in 1 2 3; do cat "$BIG" "$BIG" >"$BIG.2" && mv "$BIG.2" "$BIG"; done
run train_32k_big8 "$OUT/bench_tok" train "$BIG" 32000 '<|endoftext|>'
rm -f "$BIG"
echo "# encode: tinystories_2MiB.txt with GPT-2's vocabulary, best of $REPS (target: tlm >= tiktoken)"
run encode "$OUT/bench_tok" encode "$DATA/tokenizers/gpt2" "$TS" "$REPS" "$OUT/tlm_ids.txt"
run encode node "$ROOT/bench/tokenizer/encode_peers.js" "$TS" "$REPS" "$OUT/tlm_ids.txt"
if [ -n "${JSON:-}" ]; then (IFS=,; echo "[${rows[*]}]") >"$JSON"; fi
