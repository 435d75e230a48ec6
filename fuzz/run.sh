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
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(safetensors gguf llama2c tokenizer_bin gpt2_bpe model_load tokenizer_load request imatrix lora examples grammar)
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
todo=()
# an object is stale when its source or any header changed since (a struct's layout may have)
newest_h=$(find src include fuzz -name '*.h' -printf '%T@ %p\n' | sort -n | tail -1 | cut -d' ' -f2-)
for f in $LIBSRC; do
  o=$OBJ/$(echo "$f" | tr / _).o
  { [ ! -f "$o" ] || [ "$f" -nt "$o" ] || [ "$newest_h" -nt "$o" ]; } && todo+=("$f")
  objs+=("$o")
done
# The objects on every core (a new file's object is built once; a failed compile fails the run).
CFLAGS_OBJ=("${FLAGS[@]/-fsanitize=fuzzer,address,undefined/-fsanitize=fuzzer-no-link,address,undefined}" -fopenmp)
if [ ${#todo[@]} -gt 0 ]; then
  printf '%s\n' "${todo[@]}" |
    xargs -P "$(nproc)" -I{} sh -c 'o="$1/$(echo "$2" | tr / _).o"; shift 2; '"$CC"' "$@" -c "$0" -o "$o"' \
      {} "$OBJ" {} "${CFLAGS_OBJ[@]}"
fi
# One target: link, then fuzz for SECS seconds; its report in OUT/fuzz_T.log.
fuzz_one() {
  local t=$1 bin=$OUT/fuzz_$1 scratch rc=0
  $CC "${FLAGS[@]}" "fuzz/fuzz_$t.c" "${objs[@]}" "${LIBS[@]}" -o "$bin" || return 1
  scratch=$(mktemp -d)
  (cd "$OUT" && OMP_NUM_THREADS=1 ./fuzz_"$t" -max_total_time="$SECS" -rss_limit_mb=2048 \
     -malloc_limit_mb=1536 -timeout=10 -print_final_stats=1 -artifact_prefix="fuzz_$t-" \
     "$scratch" "../fuzz/corpus/$t" >"fuzz_$t.log" 2>&1) || rc=1
  rm -rf "$scratch"
  return $rc
}
# As many targets at once as there are cores, each on one thread.
status=0
jobs_max=$(nproc)
pids=() names=()
report() { # INDEX: waits for that target and prints its report
  local rc=0
  wait "${pids[$1]}" || rc=1
  echo "== fuzz_${names[$1]}: ${SECS}s"
  tail -n 12 "$OUT/fuzz_${names[$1]}.log" 2>/dev/null || true
  if [ $rc != 0 ]; then
    echo "fuzz_${names[$1]} FAILED (reproducer in $OUT)"
    status=1
  fi
}
done_upto=0
for t in "${TARGETS[@]}"; do
  fuzz_one "$t" &
  pids+=($!)
  names+=("$t")
  if [ $((${#pids[@]} - done_upto)) -ge "$jobs_max" ]; then
    report $done_upto
    done_upto=$((done_upto + 1))
  fi
done
while [ $done_upto -lt ${#pids[@]} ]; do
  report $done_upto
  done_upto=$((done_upto + 1))
done
exit $status
