#!/usr/bin/env bash
# Importance matrices against llama.cpp's, on accuracy.sh's model (run that first: it trains the
# model and cuts the text). For a calibration slice of the training text:
#   - tlm imatrix and llama-imatrix each compute a matrix (same chunks of CTX tokens);
#   - every type is quantized with each matrix by tlm quantize --imatrix and by llama-quantize
#     --imatrix: the files must be byte for byte the same (tlm's bytes = llama.cpp's);
#   - perplexity on the held-out text (tlm eval --llama-ppl, and llama-perplexity on the file
#     quantized with tlm's matrix) without a matrix, with tlm's and with llama.cpp's.
#
#   LLAMA_BIN=/work/llama.cpp/build-noamx/bin bash bench/quant/imatrix.sh
#
# Settings (environment): TLM (build/tlm), LLAMA_BIN (needs llama-imatrix, llama-quantize and
# llama-perplexity), OUT (bench/out/quant: accuracy.sh's), CTX (256, the model's context),
# CALIB_BYTES (300000 bytes of the training text), THREADS (2), TYPES. The table goes to stdout
# and OUT/imatrix.md.
set -euo pipefail
unset OPENBLAS_CORETYPE
cd "$(dirname "$0")/../.."
TLM=${TLM:-build/tlm}
LLAMA_BIN=${LLAMA_BIN:-/work/llama.cpp/build/bin}
OUT=${OUT:-bench/out/quant}
CTX=${CTX:-256} CALIB_BYTES=${CALIB_BYTES:-300000} THREADS=${THREADS:-2}
TYPES=${TYPES:-"q2_k q3_k_s q3_k_m q4_0 q4_1 q4_k_s q4_k_m iq4_nl iq4_xs q5_0 q5_k_m q6_k"}
for f in "$TLM" "$LLAMA_BIN/llama-imatrix" "$LLAMA_BIN/llama-quantize" \
  "$LLAMA_BIN/llama-perplexity" "$OUT/f32.gguf" "$OUT/train.txt" "$OUT/held.txt"; do
  [ -e "$f" ] || { echo "imatrix.sh: $f not found (run accuracy.sh first)" >&2; exit 1; }
done
export LD_LIBRARY_PATH="$LLAMA_BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
head -c "$CALIB_BYTES" "$OUT/train.txt" >"$OUT/calib.txt"

t0=$(date +%s.%N)
"$TLM" imatrix -m "$OUT/f32.gguf" -f "$OUT/calib.txt" -o "$OUT/im_tlm.gguf" -c "$CTX" \
  -t "$THREADS" 2>"$OUT/im_tlm.log"
t1=$(date +%s.%N)
"$LLAMA_BIN/llama-imatrix" -m "$OUT/f32.gguf" -f "$OUT/calib.txt" -o "$OUT/im_llama.gguf" \
  -c "$CTX" -t "$THREADS" </dev/null >"$OUT/im_llama.log" 2>&1
t2=$(date +%s.%N)
echo "imatrix: tlm $(tail -1 "$OUT/im_tlm.log") in $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}') s;" \
  "llama-imatrix $(awk -v a="$t1" -v b="$t2" 'BEGIN{printf "%.1f", b-a}') s" >&2

ppl_tlm() { # FILE -> tlm's perplexity on the held-out text, llama-perplexity's chunks
  "$TLM" eval -m "$1" --data "$OUT/held.txt" --llama-ppl --json -t "$THREADS" |
    /usr/bin/python3 -c "import json,sys; print('%.4f' % json.load(sys.stdin)['perplexity'])"
}
ppl_llama() { # FILE -> llama-perplexity's
  local log=$OUT/imatrix.perplexity.log v=""
  for attempt in 1 2 3; do # its last lines are now and then lost at exit: run it again then
    "$LLAMA_BIN/llama-perplexity" -m "$1" -f "$OUT/held.txt" -c "$CTX" -b "$CTX" -t "$THREADS" \
      </dev/null >"$log" 2>&1 || true
    v=$(sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p' "$log")
    [ -n "$v" ] && break
  done
  echo "${v:-?}"
}

f32=$(ppl_tlm "$OUT/f32.gguf")
{
  echo "| type | no imatrix | tlm's imatrix | llama.cpp's imatrix | llama-perplexity, tlm's imatrix | bytes = llama-quantize |"
  echo "| --- | ---: | ---: | ---: | ---: | --- |"
} | tee "$OUT/imatrix.md"
for t in $TYPES; do
  same=yes
  for im in tlm llama; do
    "$TLM" quantize "$OUT/f32.gguf" "$OUT/$t.im_$im.gguf" --type "$t" \
      --imatrix "$OUT/im_$im.gguf" 2>/dev/null
    "$LLAMA_BIN/llama-quantize" --imatrix "$OUT/im_$im.gguf" "$OUT/f32.gguf" \
      "$OUT/$t.im_$im.llama.gguf" "$t" "$THREADS" >/dev/null 2>&1
    cmp -s "$OUT/$t.im_$im.gguf" "$OUT/$t.im_$im.llama.gguf" || same="NO ($im's matrix)"
    rm -f "$OUT/$t.im_$im.llama.gguf"
  done
  "$TLM" quantize "$OUT/f32.gguf" "$OUT/$t.gguf" --type "$t" 2>/dev/null
  p0=$(ppl_tlm "$OUT/$t.gguf")
  pt=$(ppl_tlm "$OUT/$t.im_tlm.gguf")
  pl=$(ppl_tlm "$OUT/$t.im_llama.gguf")
  ll=$(ppl_llama "$OUT/$t.im_tlm.gguf")
  awk -v t="$t" -v p0="$p0" -v pt="$pt" -v pl="$pl" -v ll="$ll" -v f="$f32" -v s="$same" \
    'BEGIN { printf "| %s | %s (%+.2f%%) | %s (%+.2f%%) | %s (%+.2f%%) | %s | %s |\n", t, p0,
             100 * (p0 / f - 1), pt, 100 * (pt / f - 1), pl, 100 * (pl / f - 1), ll, s }' |
    tee -a "$OUT/imatrix.md"
  rm -f "$OUT/$t.im_llama.gguf"
done
echo "F32: $f32 (percentages: perplexity against it)" | tee -a "$OUT/imatrix.md"
