#!/usr/bin/env bash
# What fine-tuning learns and forgets: a model tlm pretrains on TinyStories, then adapted to Tiny
# Shakespeare three ways (--full, LoRA on the F32 base, QLoRA on its Q4_K_M quantization) with the
# same steps, batch and data. For each: the loss on held-out Shakespeare (what was learned), the loss
# on held-out TinyStories (what was forgotten), wall time and peak memory, in one table.
# Output: bench/out/finetune_learn/ and, with README=1 (default), the table in bench/README.md
# between <!-- learn:begin --> and <!-- learn:end -->.
# Env: PRETRAIN_STEPS (1500), STEPS (300), THREADS (2).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$ROOT/bench/out/finetune_learn
W=$OUT/work
PRETRAIN_STEPS=${PRETRAIN_STEPS:-1500} STEPS=${STEPS:-300} THREADS=${THREADS:-2}
README=${README:-1}
DATA=${TLM_SHARED_DATA:-$ROOT/../shared/data}
TLM=$ROOT/build/tlm
make -C "$ROOT" >/dev/null
mkdir -p "$W"

# Held-out text: the last tenth of each file, which neither training run sees (both hold out their
# last tenth for validation).
split_tail() { # FILE OUT_TRAIN OUT_VAL
  local n
  n=$(wc -c <"$1")
  head -c $((n * 9 / 10)) "$1" >"$2"
  tail -c $((n - n * 9 / 10)) "$1" >"$3"
}
split_tail "$DATA/text/tinystories_2MiB.txt" "$W/stories.txt" "$W/stories_val.txt"
split_tail "$DATA/text/tinyshakespeare.txt" "$W/shakespeare.txt" "$W/shakespeare_val.txt"

# Pretraining: a small Llama (rows whole K-quant blocks) on llama2.c's 512-token vocabulary.
cat >"$W/cfg.json" <<'JSON'
{"context_length": 256, "d_model": 256, "n_layers": 6, "n_heads": 8, "n_kv_heads": 4, "d_ff": 768,
 "norm": "rmsnorm", "ffn": "swiglu", "position": "rope", "tie_embeddings": false, "bias": false}
JSON
if [ ! -f "$W/base/model.safetensors" ]; then
  echo "pretraining on TinyStories ($PRETRAIN_STEPS steps) ..." >&2
  "$TLM" train -c "$W/cfg.json" --data "$W/stories.txt" -z "$DATA/models/tok512.bin" -o "$W/base" \
    --steps "$PRETRAIN_STEPS" --batch 16 --lr 2e-3 --eval-interval 500 -t "$THREADS" 2>"$OUT/pretrain.log"
fi
[ -f "$W/base-q4km.gguf" ] || "$TLM" quantize "$W/base" "$W/base-q4km.gguf" --type q4_k_m 2>/dev/null

loss() { # MODEL TEXT [ARGS...]: tlm eval's mean loss
  local m=$1 text=$2
  shift 2
  "$TLM" eval -m "$m" --data "$text" --json -t "$THREADS" "$@" 2>/dev/null |
    /usr/bin/python3 -c 'import json,sys; print("%.4f" % json.load(sys.stdin)["loss"])'
}
# finetune NAME BASE ARGS...: wall seconds and peak MiB into $W/NAME.cost
finetune() {
  local name=$1 base=$2 t0 t1
  shift 2
  rm -rf "$W/$name"
  t0=$(date +%s.%N)
  /usr/bin/time -f "%M" -o "$W/$name.rss" "$TLM" finetune -m "$base" --data "$W/shakespeare.txt" \
    -o "$W/$name" --steps "$STEPS" --batch 16 --seq-len 256 --eval-interval 100 -t "$THREADS" \
    "$@" 2>"$OUT/$name.log"
  t1=$(date +%s.%N)
  echo "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }') $(($(cat "$W/$name.rss") / 1024))" >"$W/$name.cost"
}
echo "adapting to Shakespeare: --full, LoRA, QLoRA ($STEPS steps each) ..." >&2
finetune full "$W/base" --full --lr 3e-4
finetune lora "$W/base" --lr 2e-3
finetune qlora "$W/base-q4km.gguf" --lr 2e-3

rows=()
row() { # NAME MODEL COST [ARGS...]
  local name=$1 m=$2 cost=$3
  shift 3
  rows+=("$name|$(loss "$m" "$W/shakespeare_val.txt" "$@")|$(loss "$m" "$W/stories_val.txt" "$@")|$cost")
}
row "base (pretrained on TinyStories)" "$W/base" "- -"
row "--full" "$W/full" "$(cat "$W/full.cost")"
row "LoRA (F32 base)" "$W/base" "$(cat "$W/lora.cost")" --lora "$W/lora/adapter.gguf"
row "QLoRA (Q4_K_M base)" "$W/base-q4km.gguf" "$(cat "$W/qlora.cost")" --lora "$W/qlora/adapter.gguf"
row "base in Q4_K_M, no adapter" "$W/base-q4km.gguf" "- -"

{
  echo "Measured by \`bash bench/finetune/learn.sh\` on $(date -u '+%Y-%m-%d %H:%M') UTC, tlm \`$(git -C "$ROOT" rev-parse --short HEAD)\`:"
  echo "a 6-layer, d 256 Llama (vocabulary 512) pretrained by tlm on TinyStories for $PRETRAIN_STEPS"
  echo "steps, then adapted to Tiny Shakespeare for $STEPS steps of 16 x 256 tokens each way;"
  echo "losses on held-out text (the last tenth of each file), $THREADS threads."
  echo
  echo "| model | Shakespeare loss (learned) | TinyStories loss (forgotten) | fine-tuning wall s | peak RSS MiB |"
  echo "| --- | ---: | ---: | ---: | ---: |"
  for r in "${rows[@]}"; do
    IFS='|' read -r name a b cost <<<"$r"
    read -r secs mib <<<"$cost"
    [ "$secs" = - ] || secs=$(printf '%.0f' "$secs")
    echo "| $name | $a | $b | $secs | $mib |"
  done
} >"$OUT/results.md"
cat "$OUT/results.md"
if [ "$README" = 1 ]; then
  /usr/bin/python3 "$ROOT/bench/readme_section.py" learn "$OUT/results.md"
  echo "rewrote bench/README.md's learning table" >&2
fi
