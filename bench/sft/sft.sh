#!/usr/bin/env bash
# Instruction tuning end to end on a model tlm pretrained: SFT on chats about invented people (the
# notes in the prompt hold the facts; the base cannot know them, and the held-out questions are
# about new names), then DPO between two styles of answer ("The notes say X lives in Y." preferred
# to "X lives in Y."). Held-out accuracy (the answer names the right value) and the share in the
# preferred style before and after each stage, asked through `tlm serve` (the chat API, greedy);
# the DPO reward margin; a held-out question on the chat page of `tlm serve --lora` (headless
# Chromium, as tests/node/serve_page.mjs drives it). Speed, alternating the two
# sides, medians of the runs' median tokens/s: SFT packed against unpacked; a DPO step against
# SFT over the same sequences (a DPO step of B pairs is two SFT steps of B sequences).
# Output: bench/out/sft/ and, with README=1 (default), the table in bench/README.md between
# <!-- sft:begin --> and <!-- sft:end -->.
# Env: PRETRAIN_STEPS (1000), SFT_STEPS (400), DPO_STEPS (150), ROUNDS (3), THREADS (2).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$ROOT/bench/out/sft
W=$OUT/work
PRETRAIN_STEPS=${PRETRAIN_STEPS:-1000} SFT_STEPS=${SFT_STEPS:-400} DPO_STEPS=${DPO_STEPS:-150}
ROUNDS=${ROUNDS:-3} THREADS=${THREADS:-2} README=${README:-1}
DATA=${TLM_SHARED_DATA:-$ROOT/../shared/data}
TLM=$ROOT/build/tlm
. "$ROOT/bench/lib.sh"
PY=/usr/bin/python3
make -C "$ROOT" >/dev/null
mkdir -p "$W"
$PY "$ROOT/bench/sft/make_data.py" "$W/data"
D=$W/data

# The base: learn.sh's recipe, a small Llama pretrained on TinyStories.
cat >"$W/cfg.json" <<'JSON'
{"context_length": 256, "d_model": 256, "n_layers": 6, "n_heads": 8, "n_kv_heads": 4, "d_ff": 768,
 "norm": "rmsnorm", "ffn": "swiglu", "position": "rope", "tie_embeddings": false, "bias": false}
JSON
if [ ! -f "$W/base/model.safetensors" ]; then
  echo "pretraining on TinyStories ($PRETRAIN_STEPS steps) ..." >&2
  "$TLM" train -c "$W/cfg.json" --data "$DATA/text/tinystories_2MiB.txt" -z "$DATA/models/tok512.bin" \
    -o "$W/base" --steps "$PRETRAIN_STEPS" --batch 16 --lr 2e-3 --eval-interval 500 \
    -t "$THREADS" 2>"$OUT/pretrain.log"
fi

field() { $PY -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$W/$1.json" "$2"; }

# ask NAME MODEL [--lora FILE]: held-out answers through tlm serve into $W/NAME.json; with
# PAGE=1 also the first question on the chat page in headless Chromium ($W/NAME.page.json and a
# screenshot $OUT/chat_page.png)
ask() {
  local name=$1 model=$2 pid url="" q
  shift 2
  "$TLM" serve -m "$model" --port 0 -t "$THREADS" --parallel 4 "$@" >"$W/serve.out" 2>"$W/serve.err" &
  pid=$!
  for _ in $(seq 1 100); do
    url=$(sed -n 's/^listening on \(http:[^ ]*\)\/$/\1/p' "$W/serve.out")
    [ -n "$url" ] && break
    sleep 0.1
  done
  [ -n "$url" ] || { cat "$W/serve.err" >&2; kill "$pid"; exit 1; }
  $PY "$ROOT/bench/sft/ask.py" "$url" "$D/heldout.jsonl" 4 >"$W/$name.json"
  if [ "${PAGE:-0}" = 1 ] && [ -x /usr/bin/chromium ]; then
    q=$(field "$name" question)
    (cd "$ROOT/tests/node" && node chat_page.mjs "$url" "$q" "$OUT/chat_page.png") >"$W/$name.page.json" ||
      rm -f "$W/$name.page.json"
  fi
  kill "$pid"
  wait "$pid" 2>/dev/null || true
}

echo "SFT ($SFT_STEPS steps), then DPO ($DPO_STEPS steps) ..." >&2
ft=(--batch 16 --seq-len 256 -t "$THREADS" --eval-interval 100 --eval-batches 4)
"$TLM" finetune -m "$W/base" --data "$D/sft_train.jsonl" --val-data "$D/sft_val.jsonl" -o "$W/sft" \
  --steps "$SFT_STEPS" --lr 2e-3 --pack "${ft[@]}" 2>"$OUT/sft.log"
"$TLM" export-lora -m "$W/base" --lora "$W/sft/adapter.gguf" -o "$W/sft.gguf" 2>/dev/null
"$TLM" finetune -m "$W/sft.gguf" --data "$D/dpo_train.jsonl" --val-data "$D/dpo_val.jsonl" \
  -o "$W/dpo" --steps "$DPO_STEPS" --lr 2e-4 --rpo-alpha 1 --batch 8 --seq-len 256 -t "$THREADS" \
  --eval-interval 50 --eval-batches 4 2>"$OUT/dpo.log"
ask base "$W/base"
ask sft "$W/base" --lora "$W/sft/adapter.gguf"
PAGE=1 ask dpo "$W/sft.gguf" --lora "$W/dpo/adapter.gguf"
last_val() { grep '"val_loss"' "$1/log.jsonl" | tail -1; }
margin=$(last_val "$W/dpo" | $PY -c 'import json,sys; print("%.2f" % json.load(sys.stdin)["val_rewards/margins"])')
racc=$(last_val "$W/dpo" | $PY -c 'import json,sys; print("%.2f" % json.load(sys.stdin)["val_rewards/accuracies"])')

# Speed: median tokens/s of a run's steps after the first; runs alternate.
rate() { # DIR
  $PY -c 'import json,statistics,sys
v=[json.loads(l)["tokens_per_s"] for l in open(sys.argv[1]+"/log.jsonl")][1:]
print("%.0f" % statistics.median(v))' "$1"
}
speed() { # NAME ARGS...: one run of 30 steps, its rate appended to $W/NAME.rates
  local name=$1
  shift
  rm -rf "$W/s_$name"
  "$TLM" finetune -m "$W/base" -o "$W/s_$name" --steps 30 --log-interval 1 --eval-interval 0 \
    --val-fraction 0 --seq-len 256 -t "$THREADS" "$@" 2>"$W/s_$name.log"
  rate "$W/s_$name" >>"$W/$name.rates"
}
# SFT over the DPO pairs' sequences (prompt and answer, each side an example), for the DPO ratio
$PY - "$D/dpo_train.jsonl" "$D/pairs_as_sft.jsonl" <<'PY'
import json, sys
with open(sys.argv[2], "w") as f:
    for line in open(sys.argv[1]):
        p = json.loads(line)
        for side in ("chosen", "rejected"):
            f.write(json.dumps({"messages": p["prompt"] + p[side]}) + "\n")
PY
echo "speed: $ROUNDS alternated rounds ..." >&2
rm -f "$W"/*.rates
unset OPENBLAS_CORETYPE # both sides: OpenBLAS's own choice of kernels
for _ in $(seq 1 "$ROUNDS"); do
  speed packed --data "$D/sft_train.jsonl" --batch 16 --pack
  speed unpacked --data "$D/sft_train.jsonl" --batch 16 --no-pack
  speed mixed_packed --data "$D/mixed.jsonl" --batch 16 --pack
  speed mixed_unpacked --data "$D/mixed.jsonl" --batch 16 --no-pack
  speed dpo --data "$D/dpo_train.jsonl" --batch 8
  speed dpo_pre --data "$D/dpo_train.jsonl" --batch 8 --precompute-ref
  speed sft_pairs --data "$D/pairs_as_sft.jsonl" --batch 16 --no-pack
done
for n in packed unpacked mixed_packed mixed_unpacked dpo dpo_pre sft_pairs; do eval "r_$n=$(median <"$W/$n.rates")"; done
# the mixed chats' median length, as tlm finetune reports it
mixed_lengths() { sed -n 's/.*(median example \([0-9]*\) tokens.*/median \1 tokens/p' "$W/s_mixed_packed.log"; }

pct() { awk -v x="$(field "$1" "$2")" 'BEGIN { printf "%.0f%%", 100 * x }'; }
{
  echo "Measured by \`bash bench/sft/sft.sh\` on $(date -u '+%Y-%m-%d %H:%M') UTC, tlm \`$(git -C "$ROOT" rev-parse --short HEAD)\`:"
  echo "learn.sh's 6-layer, d 256 Llama pretrained by tlm on TinyStories ($PRETRAIN_STEPS steps); LoRA"
  echo "SFT on 3000 chats (notes about one to three invented people, a question about one; $SFT_STEPS steps of"
  echo "16 rows of 256, packed), then DPO on 1000 pairs preferring \"The notes say ...\" answers"
  echo "($DPO_STEPS steps of 8 pairs, --rpo-alpha 1, on the SFT adapter merged with export-lora). Held out: 200"
  echo "questions about people no training example names, asked through \`tlm serve\` (greedy). $THREADS threads."
  echo
  echo "| model | held-out accuracy | answers in the preferred style | word for word |"
  echo "| --- | ---: | ---: | ---: |"
  echo "| base | $(pct base accuracy) | $(pct base cited) | $(pct base exact) |"
  echo "| + SFT adapter | $(pct sft accuracy) | $(pct sft cited) | $(pct sft exact) |"
  echo "| SFT merged + DPO adapter | $(pct dpo accuracy) | $(pct dpo cited) | $(pct dpo exact) |"
  echo
  echo "DPO on held-out pairs: reward margin $margin, reward accuracy $racc. Asked \"$(field dpo question)\","
  if [ -f "$W/dpo.page.json" ]; then
    echo "the chat page of \`tlm serve --lora\` (DPO; headless Chromium, screenshot bench/out/sft/chat_page.png)"
    echo "answers \"$(field dpo.page answer)\"."
  else
    echo "\`tlm serve --lora\` (DPO) answers \"$(field dpo answer)\"."
  fi
  echo
  echo "| speed (median tokens/s of $ROUNDS alternated runs) | tokens/s | ratio |"
  echo "| --- | ---: | ---: |"
  echo "| SFT packed / unpacked (16 rows a step), the chats above | $r_packed / $r_unpacked | $(ratio "$r_packed" "$r_unpacked") |"
  echo "| SFT packed / unpacked, long-tailed lengths (1 to 12 notes, $(mixed_lengths)) | $r_mixed_packed / $r_mixed_unpacked | $(ratio "$r_mixed_packed" "$r_mixed_unpacked") |"
  echo "| DPO step / SFT over the same sequences (time per token) | $r_dpo / $r_sft_pairs | $(ratio "$r_sft_pairs" "$r_dpo") |"
  echo "| DPO with --precompute-ref / SFT over the same sequences | $r_dpo_pre / $r_sft_pairs | $(ratio "$r_sft_pairs" "$r_dpo_pre") |"
} >"$OUT/results.md"
cat "$OUT/results.md"
if [ "$README" = 1 ]; then
  $PY "$ROOT/bench/readme_section.py" sft "$OUT/results.md"
  echo "rewrote bench/README.md's SFT table" >&2
fi
