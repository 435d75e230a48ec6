#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (-fsanitize=fuzzer,address,undefined) and runs each for
# a bounded time over its committed seed corpus (fuzz/corpus/<target>/, read-only: new inputs go
# to a scratch directory). Usage: bash fuzz/run.sh [SECONDS_PER_TARGET] [TARGET ...]
# Objects, programs and a crash's reproducer go to build-fuzz/ (a crash also fails the script).
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-20}
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(safetensors gguf llama2c tokenizer_bin gpt2_bpe model_load tokenizer_load request imatrix lora)
OUT=build-fuzz
mkdir -p "$OUT"
CC=${CC:-clang}
FLAGS=(-std=c11 -D_POSIX_C_SOURCE=200809L -g -O1 -fsanitize=fuzzer,address,undefined
       -fno-sanitize-recover=undefined -Iinclude -Isrc -Ifuzz)
# The library without OpenMP pragmas mattering (BLAS and OpenMP still link for the model code).
LIBSRC=$(find src -name '*.c' ! -path 'src/cli/*' | sort)
LIBS=(-lopenblas -ldnnl -lcjson -lm -fopenmp)
# Objects once (without -fsanitize=fuzzer's main), then one link per target.
OBJ=$OUT/obj
mkdir -p "$OBJ"
objs=()
for f in $LIBSRC; do
  o=$OBJ/$(echo "$f" | tr / _).o
  if [ ! -f "$o" ] || [ "$f" -nt "$o" ]; then
    $CC "${FLAGS[@]/-fsanitize=fuzzer,address,undefined/-fsanitize=fuzzer-no-link,address,undefined}" \
      -fopenmp -c "$f" -o "$o"
  fi
  objs+=("$o")
done
status=0
for t in "${TARGETS[@]}"; do
  bin=$OUT/fuzz_$t
  $CC "${FLAGS[@]}" "fuzz/fuzz_$t.c" "${objs[@]}" "${LIBS[@]}" -o "$bin"
  scratch=$(mktemp -d)
  echo "== fuzz_$t: ${SECS}s"
  if ! (cd "$OUT" && OMP_NUM_THREADS=1 ./fuzz_"$t" -max_total_time="$SECS" -rss_limit_mb=2048 \
        -malloc_limit_mb=1536 -timeout=10 -print_final_stats=1 -artifact_prefix="fuzz_$t-" \
        "$scratch" "../fuzz/corpus/$t" 2>&1 | tail -n 12); then
    echo "fuzz_$t FAILED (reproducer in $OUT)"
    status=1
  fi
  rm -rf "$scratch"
done
exit $status
