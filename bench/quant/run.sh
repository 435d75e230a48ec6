#!/usr/bin/env bash
# Decode and prefill speed of tlm on quantized and half-precision GGUF files against llama.cpp
# built natively (llama-bench), in the same run, alternating the two, at 1 and 2 threads.
#
# Models: random-weight llama2.c-shaped "15M" (dim 256, hidden 768, 6 layers, 8 heads: dims
# multiples of 256 so that Q4_K_M needs no fallback types) and "110M" (dim 768, hidden 2048,
# 12 layers, 12 heads), vocab 32000 (Llama's SPM vocabulary from ../shared/data), written by
# bench/formats/random_llama2c.py and `tlm convert`, then quantized by llama-quantize (no importance
# matrix) to F16, BF16, Q8_0, Q4_0 and Q4_K_M.
#
# Per model, type and thread count: decode tok/s (tgN: N steps of one token from an empty cache)
# and prefill tok/s of a 128-token prompt (pp128), both measured the same way on both sides
# (`tlm bench` and `llama-bench`: a warm-up run, then one timed run), best of REPS, and the decode bound: read bandwidth measured here
# (bench/quant/readbw.c, a buffer of the weights' size; the better of a measure before and one after
# the cell's runs) / the weights' bytes, the "model_size" that both llama-bench and tlm bench report
# (every weight is read once per token; a tied head counts once; the file's metadata, 0.7 MB of
# vocabulary here, is not read per token and does not count).
#
# Usage: bash bench/quant/run.sh [THREADS="1 2"] [N=32] [REPS=2]
#   env: LLAMA_BIN (default /work/llama.cpp/build/bin; bench/results.sh builds llama.cpp from the
#        source node-llama-cpp carries; on a virtual Xeon with AMX its native build died with
#        SIGILL in its AMX kernels, so there it is built with -mno-amx-tile -mno-amx-int8
#        -mno-amx-bf16 in CMAKE_C_FLAGS and CMAKE_CXX_FLAGS), MODELS
#        ("15M 110M"; "400M": dim 1024, hidden 2816, 24 layers, read from memory), TYPES
#        ("F32 F16 BF16 Q8_0 Q4_0 Q4_K_M"), TLM (default build/tlm).
# Each side runs with its defaults: tlm bench reads the model into 2 MiB pages (as tlm serve does;
# TLM="build/tlm ... --mmap" wrappers time the mapped file), llama-bench maps it.
# tlm's prefill of block types is its repacked 8-bit GEMM (src/kernels/qgemm.c) on CPUs with AVX-512
# VNNI; in a build with -DTLM_BENCH_KNOBS=ON, TLM_QPREFILL=sgemm (widened tiles) or =int8 (the
# decode kernels) in the environment times another path (bench/quant/prefill_paths.sh compares
# all three in one run).
# OPENBLAS_CORETYPE is unset (OpenBLAS's own detection) unless KEEP_CORETYPE=1. Run on an
# otherwise idle machine: llama.cpp's worker threads spin.
# One-thread runs of both sides (and of the bandwidth measure) are pinned to one CPU, PIN1
# (default 0; PIN1= leaves them to the scheduler): two vCPUs of a virtual machine can differ by a
# quarter on arithmetic-bound kernels, so unpinned one-thread figures depend on where a run lands.
# ISA=avx2: both sides as on a CPU without AVX-512 (what an AVX2 machine, Zen 3 or an Intel client
# core, runs): tlm with TLM_ISA=avx2 and TLM_AMX=off, built for x86-64-v3 with the benchmark
# switches so that no AVX-512 is compiled in either (cmake -S . -B build-v3 -DTLM_NATIVE=OFF
# -DTLM_BENCH_KNOBS=ON -DCMAKE_C_FLAGS=-march=x86-64-v3; TLM=build-v3/tlm), OpenBLAS on its
# Haswell kernels, and LLAMA_BIN a llama.cpp built without AVX-512 (bench/README.md gives its CMake
# flags); results-avx2.json. ISA=avxvnni: the same as a CPU with AVX2 and AVX-VNNI (Intel's client
# cores since Alder Lake; llama.cpp with -DGGML_AVX_VNNI=ON too); results-avxvnni.json.
# Prints a table and writes bench/out/quant/results.json.
set -euo pipefail
if [ -z "${KEEP_CORETYPE:-}" ]; then unset OPENBLAS_CORETYPE; fi
SUFFIX=
if [ "${ISA:-}" = avx2 ] || [ "${ISA:-}" = avxvnni ]; then
  export TLM_ISA=$ISA TLM_AMX=off OPENBLAS_CORETYPE=Haswell
  SUFFIX=-$ISA
fi
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TLM=${TLM:-$ROOT/build/tlm}
LLAMA_BIN=${LLAMA_BIN:-/work/llama.cpp/build/bin}
THREADS_LIST=${1:-"1 2"}
N=${2:-32}
REPS=${3:-2}
MODELS=${MODELS:-"15M 110M"}
TYPES=${TYPES:-"F32 F16 BF16 Q8_0 Q4_0 Q4_K_M"}
DATA=${TLM_SHARED_DATA:-$ROOT/../shared/data}
VOCAB=$DATA/tokenizers/ggml-vocab-llama-spm.gguf
OUT=$ROOT/bench/out/quant
mkdir -p "$OUT"
[ -x "$LLAMA_BIN/llama-bench" ] || { echo "no llama-bench in $LLAMA_BIN (set LLAMA_BIN)"; exit 1; }
[ -x "$TLM" ] || { echo "build tlm first (make)"; exit 1; }
gcc -O3 -march=native -fopenmp "$ROOT/bench/quant/readbw.c" -o "$OUT/readbw"

py() { /usr/bin/python3 -c "$1"; }
PIN1=${PIN1-0}
pin() { # THREADS -> the command prefix that pins a one-thread run, or nothing
  if [ "$1" = 1 ] && [ -n "$PIN1" ]; then echo "taskset -c $PIN1"; fi
}

tlm_rate() { # FILE THREADS -> "decode prefill" (tlm bench: warm-up, then one timed run, as below)
  $(pin "$2") "$TLM" bench -m "$1" -p 128 -n "$N" -t "$2" -r 1 -o json 2>/dev/null |
    py "import json,sys
r = json.load(sys.stdin)
d = [x['avg_ts'] for x in r if x['n_gen'] > 0]
p = [x['avg_ts'] for x in r if x['n_prompt'] > 0]
print(d[0] if d else 0, p[0] if p else 0)"
}

llama_rate() { # FILE THREADS -> "decode prefill"
  $(pin "$2") "$LLAMA_BIN/llama-bench" -m "$1" -p 128 -n "$N" -t "$2" -r 1 -o json 2>/dev/null |
    py "import json,sys
r = json.load(sys.stdin)
d = [x['avg_ts'] for x in r if x['n_gen'] > 0]
p = [x['avg_ts'] for x in r if x['n_prompt'] > 0]
print(d[0] if d else 0, p[0] if p else 0)"
}

weight_bytes() { # FILE -> the bytes of its tensors (tlm bench's model_size, as llama-bench's)
  "$TLM" bench -m "$1" -p 0 -n 1 -t 1 -r 1 -o json 2>/dev/null |
    py "import json,sys; print(json.load(sys.stdin)[0]['model_size'])"
}

results=()
printf '%-5s %-7s %2s | %9s %9s %6s %9s %5s | %9s %9s %6s\n' model type t "tlm dec" "llama dec" ratio bound "%bnd" \
  "tlm pp128" "llama pp" ratio
for name in $MODELS; do
  case $name in
    15M) spec="256 768 6 8 256" ;;
    110M) spec="768 2048 12 12 1024" ;;
    # not in the default list: a model larger than the caches (Q4_K_M 200 MB, F16 680 MB), read
    # from memory at every token as real downloads are
    400M) spec="1024 2816 24 16 1024" ;;
    *) echo "unknown model $name"; exit 1 ;;
  esac
  read -r dim hidden layers heads seq <<<"$spec"
  f32=$OUT/$name-F32.gguf
  if [ ! -f "$f32" ]; then
    /usr/bin/python3 "$ROOT/bench/formats/random_llama2c.py" "$OUT/$name.bin" "$dim" "$hidden" \
      "$layers" "$heads" 32000 "$seq"
    "$TLM" convert "$OUT/$name.bin" "$f32" --to gguf -z "$VOCAB" >/dev/null 2>&1
    rm -f "$OUT/$name.bin"
  fi
  for type in $TYPES; do
    f=$OUT/$name-$type.gguf
    [ -f "$f" ] || "$LLAMA_BIN/llama-quantize" "$f32" "$f" "$type" 2 >/dev/null 2>&1
    bytes=$(weight_bytes "$f")
    for T in $THREADS_LIST; do
      bt_d=0 bt_p=0 bl_d=0 bl_p=0
      # the read rate before and after the cell's runs, the better of the two: now and then the
      # host holds back one of two vCPUs for a whole measurement (a tenth of the rate)
      bw0=$($(pin "$T") "$OUT/readbw" "$bytes" "$T" 5)
      for _ in $(seq "$REPS"); do
        read -r d p <<<"$(tlm_rate "$f" "$T")"
        bt_d=$(py "print(max($bt_d, $d))") bt_p=$(py "print(max($bt_p, $p))")
        read -r d p <<<"$(llama_rate "$f" "$T")"
        bl_d=$(py "print(max($bl_d, $d))") bl_p=$(py "print(max($bl_p, $p))")
      done
      bw=$($(pin "$T") "$OUT/readbw" "$bytes" "$T" 5)
      bw=$(py "print(max($bw0, $bw))")
      bound=$(py "print(round($bw / $bytes, 1))")
      rd=$(py "print(round($bt_d / max($bl_d, 1e-9), 3))")
      rp=$(py "print(round($bt_p / max($bl_p, 1e-9), 3))")
      pb=$(py "print(round(100 * $bt_d / max($bound, 1e-9)))")
      printf '%-5s %-7s %2s | %9.1f %9.1f %6s %9.1f %5s | %9.1f %9.1f %6s\n' "$name" "$type" "$T" \
        "$bt_d" "$bl_d" "$rd" "$bound" "$pb" "$bt_p" "$bl_p" "$rp"
      results+=("{\"model\": \"$name\", \"type\": \"$type\", \"threads\": $T, \"weight_bytes\": $bytes, \"read_bw\": $bw, \"decode_bound\": $bound, \"tlm_decode\": $bt_d, \"llamacpp_decode\": $bl_d, \"decode_ratio\": $rd, \"tlm_pp128\": $bt_p, \"llamacpp_pp128\": $bl_p, \"pp128_ratio\": $rp}")
    done
  done
done
(IFS=,; echo "[${results[*]}]") >"$OUT/results$SUFFIX.json"
echo "wrote $OUT/results$SUFFIX.json"
