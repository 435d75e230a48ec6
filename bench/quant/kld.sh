#!/usr/bin/env bash
# KL divergence of each quantized type from the F32 model, on accuracy.sh's model and held-out
# text (run that first): tlm eval --kl-ref against llama.cpp's llama-perplexity
# --kl-divergence on the same files and chunks (mean KLD, its 99th percentile, how often the top
# token is the same, PPL(Q)/PPL(base)).
#
#   LLAMA_BIN=/work/llama.cpp/build-noamx/bin bash bench/quant/kld.sh
#
# Settings (environment): TLM (build/tlm), LLAMA_BIN (with llama-perplexity), OUT
# (bench/out/quant: accuracy.sh's), CTX (256, the model's context), THREADS (2), TYPES. The
# table goes to stdout and OUT/kld.md.
set -euo pipefail
unset OPENBLAS_CORETYPE
cd "$(dirname "$0")/../.."
TLM=${TLM:-build/tlm}
LLAMA_BIN=${LLAMA_BIN:-/work/llama.cpp/build/bin}
OUT=${OUT:-bench/out/quant}
CTX=${CTX:-256} THREADS=${THREADS:-2}
TYPES=${TYPES:-"q8_0 q6_k q5_k_m q5_0 q4_k_m q4_0 iq4_xs q3_k_m q2_k"}
for f in "$TLM" "$LLAMA_BIN/llama-perplexity" "$OUT/f32.gguf" "$OUT/held.txt"; do
  [ -e "$f" ] || { echo "kld.sh: $f not found (run accuracy.sh first)" >&2; exit 1; }
done
export LD_LIBRARY_PATH="$LLAMA_BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# llama-perplexity keeps the base model's log-probabilities in a file, then compares with it
"$LLAMA_BIN/llama-perplexity" -m "$OUT/f32.gguf" -f "$OUT/held.txt" -c "$CTX" -b "$CTX" \
  -t "$THREADS" --kl-divergence-base "$OUT/f32.kld" </dev/null >"$OUT/kld_base.log" 2>&1

llama_kld() { # FILE -> "mean_kld kld_99 same_top_percent ppl_ratio"
  local log=$OUT/kld_q.log v=""
  for attempt in 1 2 3; do # its last lines are now and then lost at exit: run it again then
    "$LLAMA_BIN/llama-perplexity" -m "$1" -f "$OUT/held.txt" -c "$CTX" -b "$CTX" -t "$THREADS" \
      --kl-divergence-base "$OUT/f32.kld" --kl-divergence </dev/null >"$log" 2>&1 || true
    v=$(sed -n 's/^Same top p: *\([0-9.]*\).*/\1/p' "$log")
    [ -n "$v" ] && break
  done
  echo "$(sed -n 's/^Mean    KLD: *\([0-9.]*\).*/\1/p' "$log")" \
    "$(sed -n 's/^99.0%   KLD: *\([0-9.]*\).*/\1/p' "$log")" "${v:-?}" \
    "$(sed -n 's/^Mean PPL(Q)\/PPL(base) *: *\([0-9.]*\).*/\1/p' "$log")"
}

{
  echo "| type | tlm mean KLD | llama.cpp mean KLD | tlm 99% KLD | llama.cpp 99% KLD | tlm same top | llama.cpp same top | tlm PPL(Q)/PPL(base) | llama.cpp |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
} | tee "$OUT/kld.md"
for t in $TYPES; do
  f=$OUT/$t.gguf
  "$TLM" quantize "$OUT/f32.gguf" "$f" --type "$t" 2>/dev/null
  ours=$("$TLM" eval -m "$f" --data "$OUT/held.txt" --llama-ppl --json -t "$THREADS" \
    --kl-ref "$OUT/f32.gguf")
  read -r lk l99 lsame lratio <<<"$(llama_kld "$f")"
  /usr/bin/python3 - "$t" "$ours" "$lk" "$l99" "$lsame" "$lratio" <<'PY' | tee -a "$OUT/kld.md"
import json, sys
t, ours, lk, l99, lsame, lratio = sys.argv[1:]
o = json.loads(ours)
print("| %s | %.6f | %s | %.6f | %s | %.3f%% | %s%% | %.6f | %s |" % (
    t, o["kld_mean"], lk, o["kld_99"], l99, 100 * o["same_top"], lsame, o["ppl_ratio"], lratio))
PY
done
