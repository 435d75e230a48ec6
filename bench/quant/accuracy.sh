#!/usr/bin/env bash
# Accuracy of the quantized types, as llama.cpp's quantization table reports it: for a model
# trained here with tlm (every matrix dimension a multiple of 256, so the K types apply without
# fallbacks), each type's file size, bits per weight and perplexity on held-out text, by tlm eval
# and by llama.cpp's llama-perplexity on the same file and text (same chunks: tlm eval
# --llama-ppl), with their ratio (target: within 0.5%).
#
#   bash bench/quant/accuracy.sh                  # the real run (a few minutes of training)
#   STEPS=10 D=256 DFF=256 LAYERS=1 CTX=64 VOCAB=300 HELD_BYTES=20000 TYPES="f32 q8_0 q4_k_m" \
#     bash bench/quant/accuracy.sh                # end-to-end check in about a minute
#
# Settings (environment): TLM (build/tlm), LLAMA_BIN (/work/llama.cpp/build/bin: a native
# llama.cpp build with llama-perplexity), DATA (../shared/data/text/tinystories_2MiB.txt), OUT
# (bench/out/quant), STEPS (300: about 5 minutes on 2 cores), D (256), DFF (768), LAYERS (4),
# HEADS (4), CTX (256), VOCAB (1024), HELD_BYTES (held-out tail of DATA: 100000), THREADS (2),
# TYPES (all of tlm quantize's). A trained model is reused (OUT/f32.gguf) until deleted. The
# table goes to stdout and OUT/accuracy.md. OPENBLAS_CORETYPE is unset (OpenBLAS's own detection)
# unless KEEP_CORETYPE=1.
set -euo pipefail
if [ -z "${KEEP_CORETYPE:-}" ]; then unset OPENBLAS_CORETYPE; fi
cd "$(dirname "$0")/../.."
TLM=${TLM:-build/tlm}
LLAMA_BIN=${LLAMA_BIN:-/work/llama.cpp/build/bin}
DATA=${DATA:-../shared/data/text/tinystories_2MiB.txt}
OUT=${OUT:-bench/out/quant}
STEPS=${STEPS:-300} D=${D:-256} DFF=${DFF:-768} LAYERS=${LAYERS:-4} HEADS=${HEADS:-4}
CTX=${CTX:-256} VOCAB=${VOCAB:-1024} HELD_BYTES=${HELD_BYTES:-100000} THREADS=${THREADS:-2}
TYPES=${TYPES:-"f32 f16 bf16 q8_0 q6_k q5_k_m q5_k_s q5_1 q5_0 q4_k_m q4_k_s q4_1 q4_0 iq4_xs iq4_nl q3_k_l q3_k_m q3_k_s q2_k"}
for f in "$TLM" "$LLAMA_BIN/llama-perplexity" "$DATA"; do
  [ -e "$f" ] || { echo "accuracy.sh: $f not found" >&2; exit 1; }
done
mkdir -p "$OUT"

# Held-out text: the tail of DATA, which training never sees.
total=$(stat -c %s "$DATA")
head -c $((total - HELD_BYTES)) "$DATA" >"$OUT/train.txt"
tail -c "$HELD_BYTES" "$DATA" >"$OUT/held.txt"

if [ ! -f "$OUT/f32.gguf" ]; then
  echo "training: d $D, d_ff $DFF, $LAYERS layers, context $CTX, vocab $VOCAB, $STEPS steps" >&2
  "$TLM" tokenizer train -i "$OUT/train.txt" --vocab-size "$VOCAB" --special "<|endoftext|>" \
    -o "$OUT/tok" >/dev/null
  cat >"$OUT/config.json" <<JSON
{"context_length": $CTX, "d_model": $D, "n_layers": $LAYERS, "n_heads": $HEADS, "d_ff": $DFF,
 "tie_embeddings": false}
JSON
  rm -rf "$OUT/run"
  "$TLM" train -c "$OUT/config.json" --data "$OUT/train.txt" -z "$OUT/tok" -o "$OUT/run" \
    --steps "$STEPS" --batch 16 --lr 2e-3 --warmup $((STEPS / 10 + 1)) --eval-interval 100000 \
    -t "$THREADS" >/dev/null
  "$TLM" convert "$OUT/run" "$OUT/f32.gguf" --to gguf 2>/dev/null
else
  echo "reusing $OUT/f32.gguf (delete it to train again)" >&2
fi

# Bits per weight from the file's tensor list (tlm info -m): bytes of every tensor's blocks over
# its elements.
bpw() {
  "$TLM" info -m "$1" | awk '
    BEGIN { b["F32"]=4; b["F16"]=2; b["BF16"]=2; b["Q8_0"]=34/32; b["Q4_0"]=18/32;
            b["Q4_1"]=20/32; b["Q5_0"]=22/32; b["Q5_1"]=24/32; b["Q4_K"]=144/256;
            b["Q5_K"]=176/256; b["Q6_K"]=210/256; b["Q2_K"]=84/256; b["Q3_K"]=110/256;
            b["IQ4_NL"]=18/32; b["IQ4_XS"]=136/256 }
    /^tensors/ { on = 1; next }
    on && $3 ~ /^\[/ {
      shape = $0; sub(/.*\[/, "", shape); sub(/\].*/, "", shape)
      n = split(shape, d, /, */); e = 1; for (i = 1; i <= n; i++) e *= d[i]
      if (!($2 in b)) { print "unknown type " $2 > "/dev/stderr"; exit 1 }
      bytes += e * b[$2]; elems += e
    }
    END { printf "%.3f", 8 * bytes / elems }'
}

{
  echo "| type | file MiB | bits/weight | tlm ppl | llama.cpp ppl | tlm / llama.cpp | ppl vs F32 |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
} | tee "$OUT/accuracy.md"
f32_ppl=""
for t in $TYPES; do
  f="$OUT/$t.gguf"
  [ "$t" = f32 ] && cp "$OUT/f32.gguf" "$f.tmp" && mv "$f.tmp" "$f" ||
    "$TLM" quantize "$OUT/f32.gguf" "$f" --type "$t" 2>/dev/null
  mib=$(awk -v s="$(stat -c %s "$f")" 'BEGIN { printf "%.2f", s / 1048576 }')
  ours=$("$TLM" eval -m "$f" --data "$OUT/held.txt" --llama-ppl --json -t "$THREADS" |
    /usr/bin/python3 -c "import json,sys; print('%.4f' % json.load(sys.stdin)['perplexity'])")
  # llama.cpp logs from a thread of its own, and under load its last lines (the final estimate)
  # are sometimes lost at exit with status 0: run it again then.
  theirs="" rc=0
  for attempt in 1 2 3; do
    rc=0
    "$LLAMA_BIN/llama-perplexity" -m "$f" -f "$OUT/held.txt" -c "$CTX" -b "$CTX" -t "$THREADS" \
      </dev/null >"$OUT/$t.perplexity.log" 2>&1 || rc=$?
    theirs=$(sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p' "$OUT/$t.perplexity.log")
    [ -n "$theirs" ] && break
  done
  if [ -z "$theirs" ]; then
    echo "llama-perplexity failed on $f (exit status $rc):" >&2
    tail -5 "$OUT/$t.perplexity.log" >&2
    exit 1
  fi
  [ -z "$f32_ppl" ] && f32_ppl=$ours
  awk -v t="$t" -v mib="$mib" -v bpw="$(bpw "$f")" -v a="$ours" -v b="$theirs" -v f="$f32_ppl" \
    'BEGIN { printf "| %s | %s | %s | %s | %s | %.4f | %+.2f%% |\n", t, mib, bpw, a, b, a / b,
             100 * (a / f - 1) }' | tee -a "$OUT/accuracy.md"
done
