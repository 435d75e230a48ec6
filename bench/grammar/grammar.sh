#!/usr/bin/env bash
# What structured output costs: tlm generate's decode tokens/s with a JSON Schema against without
# one, same model, prompt, seed and sampler (temperature 1: a random-weight model wants to emit
# anything, the hardest case for the masks), on an otherwise idle machine. The model is llama2.c's
# stories110M shape (d 768, 12 layers, vocab 32000: a real vocabulary's trie) with random weights
# in Q4_K_M, made as bench/finetune/finetune.sh makes it. Two schemas: an object of free strings
# (nearly every token allowed inside them: the masks' worst case) and one of enums and integers.
# Rounds alternate the sides; figures are medians. Output: bench/out/grammar/ and, with README=1
# (default), the table in bench/README.md between <!-- grammar:begin --> and <!-- grammar:end -->.
# Env: ROUNDS (3), N (96 tokens), THREADS (2).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$ROOT/bench/out/grammar
W=$OUT/work
ROUNDS=${ROUNDS:-3} N=${N:-96} THREADS=${THREADS:-2} README=${README:-1}
DATA=${TLM_SHARED_DATA:-$ROOT/../shared/data}
TLM=$ROOT/build/tlm
. "$ROOT/bench/lib.sh"
PY=/usr/bin/python3
make -C "$ROOT" >/dev/null
mkdir -p "$W"
unset OPENBLAS_CORETYPE # both sides: OpenBLAS's own choice of kernels

TOK=$DATA/tokenizers/ggml-vocab-llama-spm.gguf
M=$W/base-q4km.gguf
if [ ! -f "$M" ]; then
  echo "making the 110M base ..." >&2
  cat >"$W/cfg.json" <<'CFG'
{"vocab_size": 32000, "context_length": 1024, "d_model": 768, "n_layers": 12, "n_heads": 12,
 "n_kv_heads": 12, "d_ff": 2048, "norm": "rmsnorm", "ffn": "swiglu", "position": "rope",
 "rope_pairing": "interleaved", "tie_embeddings": false, "bias": false}
CFG
  "$TLM" train -c "$W/cfg.json" --data "$DATA/text/tinystories_2MiB.txt" -z "$TOK" -o "$W/base" \
    --steps 1 --batch 1 --seq-len 64 --warmup 0 --eval-interval 0 -t "$THREADS" 2>"$OUT/base.log"
  "$TLM" quantize "$W/base" "$M" --type q4_k_m -z "$TOK" 2>>"$OUT/base.log"
fi
cat >"$W/strings.json" <<'S'
{"type": "object", "properties": {"notes": {"type": "array", "items": {"type": "string"},
 "minItems": 40}}, "required": ["notes"]}
S
cat >"$W/enums.json" <<'S'
{"type": "object", "properties": {"rows": {"type": "array", "minItems": 40, "items": {"type":
 "object", "properties": {"color": {"enum": ["red", "green", "blue"]}, "n": {"type": "integer"}},
 "required": ["color", "n"]}}}, "required": ["rows"]}
S

# One run: decode tokens/s from tlm generate's timing line (the generation part), appended to
# $W/NAME.rates.
run() { # NAME ARGS...
  local name=$1
  shift
  "$TLM" generate -m "$M" -p "Here is the data:" -n "$N" --temp 1 --seed 7 -t "$THREADS" "$@" \
    2>"$W/$name.err" >"$W/$name.out"
  sed -n 's/.*generation: [0-9]* tokens, [0-9]* decode steps in [0-9.]* s (\([0-9.]*\) tok\/s).*/\1/p' \
    "$W/$name.err" >>"$W/$name.rates"
}
rm -f "$W"/*.rates
echo "$ROUNDS alternated rounds ..." >&2
for _ in $(seq 1 "$ROUNDS"); do
  run plain
  run strings --json-schema "$W/strings.json"
  run enums --json-schema "$W/enums.json"
done
p=$(median <"$W/plain.rates") s=$(median <"$W/strings.rates") e=$(median <"$W/enums.rates")
# the outputs parse as JSON (the schemas' own checks are tests/grammar.sh's)
for k in strings enums; do
  $PY -c 'import json,sys; json.loads(open(sys.argv[1]).read().split("Here is the data:",1)[-1])' \
    "$W/$k.out" 2>/dev/null || echo "note: the $k output was cut at $N tokens (not whole JSON)" >&2
done
{
  echo "Measured by \`bash bench/grammar/grammar.sh\` on $(date -u '+%Y-%m-%d %H:%M') UTC, tlm \`$(git -C "$ROOT" rev-parse --short HEAD)\`:"
  echo "stories110M-shaped random model in Q4_K_M (vocabulary 32000), $N tokens at temperature 1,"
  echo "$THREADS threads, median decode tokens/s of $ROUNDS alternated runs."
  echo
  echo "| schema | tokens/s | against no schema |"
  echo "| --- | ---: | ---: |"
  echo "| none | $p | 1.00 |"
  echo "| object of free strings | $s | $(ratio "$s" "$p") |"
  echo "| enums and integers | $e | $(ratio "$e" "$p") |"
} >"$OUT/results.md"
cat "$OUT/results.md"
if [ "$README" = 1 ]; then
  $PY "$ROOT/bench/readme_section.py" grammar "$OUT/results.md"
  echo "rewrote bench/README.md's grammar table" >&2
fi
