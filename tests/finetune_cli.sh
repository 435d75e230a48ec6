#!/usr/bin/env bash
# `tlm finetune` from the command line: LoRA on a GGUF base writes the adapter as llama.cpp's GGUF
# adapter and a PEFT directory beside the checkpoint; Ctrl-C then --resume is bit for bit the run
# never stopped; --full trains every parameter; flags are checked before any work.
. "$(dirname "$0")/lib.sh"

BASE="$DATA/models/stories260K.gguf"
[ -f "$BASE" ] || die "missing $BASE"
toy_text "$TMP/text.txt"
common=(-m "$BASE" --data "$TMP/text.txt" --batch 4 --seq-len 32 --lr 3e-3 --eval-interval 5
        --eval-batches 2 --log-interval 1 -t 1 --lora-dropout 0.1)

$TLM finetune "${common[@]}" -o "$TMP/a" --steps 10 2>"$TMP/a.err"; rc=$?
expect "finetune exits 0" test $rc -eq 0
for f in adapter.gguf peft/adapter_config.json peft/adapter_model.safetensors \
         checkpoint.safetensors log.jsonl loss.svg tokenizer/tokenizer.json; do
    expect "finetune writes $f" test -s "$TMP/a/$f"
done
expect "no model.safetensors for LoRA" test ! -e "$TMP/a/model.safetensors"
expect "LoRA summary" grep -q "LoRA: rank 16, alpha 32 (scale 2), 35 matrices" "$TMP/a.err"
expect "log has 10 lines" test "$(wc -l <"$TMP/a/log.jsonl")" -eq 10
expect "PEFT config names r and alpha" grep -q '"r":[[:space:]]*16' "$TMP/a/peft/adapter_config.json"
expect "PEFT config's targets" grep -q 'q_proj' "$TMP/a/peft/adapter_config.json"
# The loss falls: the adapter learns.
first=$(head -1 "$TMP/a/log.jsonl" | sed 's/.*"train_loss": \([0-9.]*\).*/\1/')
last=$(tail -1 "$TMP/a/log.jsonl" | sed 's/.*"train_loss": \([0-9.]*\).*/\1/')
expect "loss falls ($first -> $last)" awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }'

# The adapter everywhere else, unmerged: generate, eval, bench take --lora FILE[:SCALE] (GGUF or
# PEFT directory); scale 0 is the base.
gen=(-m "$BASE" -p "Once upon a time" -n 24 --temp 0 -t 1)
base_out=$($TLM generate "${gen[@]}" 2>/dev/null)
lora_out=$($TLM generate "${gen[@]}" --lora "$TMP/a/adapter.gguf" 2>/dev/null)
peft_out=$($TLM generate "${gen[@]}" --lora "$TMP/a/peft" 2>/dev/null)
zero_out=$($TLM generate "${gen[@]}" --lora "$TMP/a/adapter.gguf:0" 2>/dev/null)
expect "generate --lora changes the text" test "$base_out" != "$lora_out"
expect "the GGUF adapter and the PEFT directory generate the same" test "$lora_out" = "$peft_out"
expect "scale 0 is the base" test "$zero_out" = "$base_out"
ev=(-m "$BASE" --data "$TMP/text.txt" --json -t 1)
lb=$($TLM eval "${ev[@]}" 2>/dev/null | sed 's/.*"loss": *\([0-9.]*\).*/\1/')
la=$($TLM eval "${ev[@]}" --lora "$TMP/a/adapter.gguf" 2>/dev/null | sed 's/.*"loss": *\([0-9.]*\).*/\1/')
expect "eval --lora: the adapted model fits the text better ($lb -> $la)" \
    awk -v a="$lb" -v b="$la" 'BEGIN { exit !(b < a) }'
$TLM bench -m "$BASE" -p 16 -n 4 -r 1 -t 1 --lora "$TMP/a/adapter.gguf" >/dev/null 2>&1
expect "bench --lora runs" test $? -eq 0
$TLM generate "${gen[@]}" --lora "$TMP/none.gguf" 2>"$TMP/g.err"
expect "a missing adapter is an error naming it" grep -q "none.gguf" "$TMP/g.err"

# export-lora: the adapter merged into the base, as llama-export-lora; an F32 base stays F32 and
# continues as the unmerged adapter does.
$TLM export-lora -m "$BASE" --lora "$TMP/a/adapter.gguf" -o "$TMP/merged.gguf" 2>"$TMP/x.err"
expect "export-lora exits 0" test $? -eq 0
expect "export-lora keeps the base's F32" grep -q "merged (F32)" "$TMP/x.err"
merged_out=$($TLM generate -m "$TMP/merged.gguf" -p "Once upon a time" -n 24 --temp 0 -t 1 2>/dev/null)
expect "the merged model continues as the adapter" test "$merged_out" = "$lora_out"
$TLM export-lora -m "$BASE" --lora "$TMP/a/peft:0.5" -o "$TMP/merged8.gguf" --type q8_0 2>/dev/null
expect "export-lora --type q8_0" test -s "$TMP/merged8.gguf"
$TLM export-lora -m "$BASE" -o "$TMP/none.gguf" 2>"$TMP/x.err"
expect "export-lora without --lora fails" grep -q "at least one --lora" "$TMP/x.err"

# Ctrl-C saves a checkpoint and exits 130; --resume then finishes the run, bit for bit.
long=(--steps 200)
$TLM finetune "${common[@]}" "${long[@]}" -o "$TMP/s" 2>/dev/null
$TLM finetune "${common[@]}" "${long[@]}" -o "$TMP/c" 2>"$TMP/c.err" &
pid=$!
wait_until 10 grep -q "step" "$TMP/c.err" 2>/dev/null
kill -INT $pid
wait $pid; rc=$?
expect "SIGINT exits 130 (got $rc)" test $rc -eq 130
$TLM finetune "${common[@]}" "${long[@]}" -o "$TMP/c" --resume 2>/dev/null; rc=$?
expect "resume exits 0" test $rc -eq 0
expect "stop + resume is bit for bit" cmp -s "$TMP/s/adapter.gguf" "$TMP/c/adapter.gguf"
expect "resumed log has 200 lines" test "$(wc -l <"$TMP/c/log.jsonl")" -eq 200
# A resumed run must ask for the same adapter.
$TLM finetune "${common[@]}" "${long[@]}" -o "$TMP/c" --resume --lora-rank 8 2>"$TMP/r.err"
expect "resume with another rank fails" test $? -ne 0
expect "names the adapter's options" grep -q "checkpoint adapter" "$TMP/r.err"

# --full: every parameter, from the base's weights.
$TLM finetune "${common[@]}" -o "$TMP/f" --steps 5 --full 2>"$TMP/f.err"; rc=$?
expect "finetune --full exits 0" test $rc -eq 0
expect "--full writes model.safetensors" test -s "$TMP/f/model.safetensors"
expect "--full writes config.json" test -s "$TMP/f/config.json"

# --full is tlm train started from the base's weights: a tlm train run resumed from a checkpoint
# that holds those weights, zero moments and step 0 ends with the same bytes as finetune --full
# with the same options.
"$TLM" convert "$BASE" "$TMP/base_dir" --to safetensors 2>/dev/null
mkdir -p "$TMP/r"
cp -r "$TMP/base_dir/tokenizer" "$TMP/r/tokenizer" 2>/dev/null || cp -r "$TMP/a/tokenizer" "$TMP/r/tokenizer"
PYTHONPATH="$SRC/tests/reference" /usr/bin/python3 - "$TMP/base_dir/model.safetensors" "$TMP/r" <<'PY'
import json, sys
import numpy as np
from safetensors_io import read_safetensors, write_safetensors
t, meta = read_safetensors(sys.argv[1])
cfg = meta["tlm_config"]
open(sys.argv[2] + "/config.json", "w").write(cfg)
n = sum(v.size for v in t.values())
items = [(k, v.astype(np.float32)) for k, v in t.items()]
items += [("optimizer.m", np.zeros(n, np.float32)), ("optimizer.v", np.zeros(n, np.float32))]
write_safetensors(sys.argv[2] + "/checkpoint.safetensors", items, metadata={
    "format": "tlm-checkpoint", "tlm_config": cfg, "step": "0", "adam_step": "0",
    "rng_state": "0", "rng_inc": "1", "seed": "1337"})
PY
same=(--data "$TMP/text.txt" --steps 6 --batch 4 --seq-len 32 --lr 1e-3 --min-lr 1e-4 --warmup 2
      --weight-decay 0.05 --beta2 0.99 --eval-interval 3 --eval-batches 2 --precision fp32 -t 1)
"$TLM" train "${same[@]}" -o "$TMP/r" --resume 2>"$TMP/r.err"
expect "tlm train resumes from the base's weights" test $? -eq 0
"$TLM" finetune -m "$TMP/base_dir" "${same[@]}" -o "$TMP/ff" --full 2>"$TMP/ff.err"
expect "finetune --full from the same weights" test $? -eq 0
expect "--full equals tlm train from the same weights, bit for bit" \
    cmp -s "$TMP/r/model.safetensors" "$TMP/ff/model.safetensors"

# Flags are checked before any work.
chk_err() { # NAME NEEDLE ARGS...
    local name=$1 needle=$2
    shift 2
    $TLM finetune "$@" 2>"$TMP/e.err" && { bad "$name: exit 0"; return; }
    expect "$name names the problem" grep -q -- "$needle" "$TMP/e.err"
}
chk_err "no base" "-m BASE is required" --data "$TMP/text.txt" -o "$TMP/e"
chk_err "unknown target" "LoRA target 'qq' unknown" "${common[@]}" -o "$TMP/e" --lora-targets q,qq
chk_err "rank 0" "lora-rank" "${common[@]}" -o "$TMP/e" --lora-rank 0
chk_err "dropout 1" "lora-dropout" "${common[@]}" -o "$TMP/e" --lora-dropout 1
chk_err "missing base" "loading the base model" "${common[@]/$BASE/$TMP/none.gguf}" -o "$TMP/e"
chk_err "-c is train's" "unknown option '-c'" "${common[@]}" -o "$TMP/e" -c x.json
$TLM export-lora -m "$DATA/models/llama-2-tiny-random.gguf" --lora "$TMP/a/adapter.gguf" \
    -o "$TMP/e.gguf" 2>"$TMP/e.err"
expect "export-lora with another model's adapter fails" test $? -ne 0
expect "names the adapter" grep -q "LoRA adapter" "$TMP/e.err"
expect "nothing written" test ! -e "$TMP/e.gguf"
finish
