#!/usr/bin/env bash
# `tlm finetune` on JSON Lines: chats with the loss on the assistant turns learn; the counts of
# what was read are printed before training; a step's loss is the mean over its trained tokens
# whatever the micro-steps and processes; malformed lines are named or skipped and counted. DPO on
# preference pairs: ln 2 at the first step, TRL's figures logged, the margin grows; the reference
# precomputed or not, the same run.
. "$(dirname "$0")/lib.sh"

BASE="$DATA/models/stories260K.gguf"
[ -f "$BASE" ] || die "missing $BASE"
names=(Tom Lily Ben Sue Max Anna)
things=("a red ball" "a big dog" "a little cat" "a blue car" "a tall tree")
for i in $(seq 0 59); do
    n=${names[i % 6]} t=${things[i % 5]}
    printf '{"messages": [{"role": "user", "content": "What did %s see?"}, {"role": "assistant", "content": "%s saw %s."}]}\n' "$n" "$n" "$t"
done >"$TMP/chat.jsonl"
echo '{"messages": [{"role": "user", "content": "Nothing to answer."}]}' >>"$TMP/chat.jsonl"

common=(-m "$BASE" --batch 8 --lr 3e-3 --eval-interval 10 --eval-batches 1 --log-interval 1 -t 1
        --precision fp32 --seq-len 256)
$TLM finetune "${common[@]}" --data "$TMP/chat.jsonl" -o "$TMP/a" --steps 20 2>"$TMP/a.err"
expect "finetune on chats exits 0 ($(tail -2 "$TMP/a.err"))" test $? -eq 0
expect "counts printed" grep -q "examples: 60 kept of 61 lines (chat; loss on the assistant turns): 0 malformed skipped, 0 cut to 256 tokens, 1 with nothing to learn skipped" "$TMP/a.err"
expect "the template named" grep -q "chat template: chatml" "$TMP/a.err"
expect "split and packing reported" grep -q "54 training examples, 6 validation; .* packing on" "$TMP/a.err"
expect "validation loss logged" grep -q '"val_loss"' "$TMP/a/log.jsonl"
expect "adapter written" test -s "$TMP/a/adapter.gguf"
first=$(log_col "$TMP/a" train_loss | head -1 | cut -d' ' -f2)
last=$(log_col "$TMP/a" train_loss | tail -1 | cut -d' ' -f2)
expect "loss falls ($first -> $last)" holds 'b < a - 0.5' a="$first" b="$last"

# A step's loss is the mean over its trained tokens: unpacked rows in 2 micro-steps, or packed
# rows, hold them differently and give the first step's loss alike.
step1() { log_col "$1" train_loss | head -1 | cut -d' ' -f2; }
one=(--data "$TMP/chat.jsonl" --steps 1 --no-pack --val-fraction 0)
$TLM finetune "${common[@]}" "${one[@]}" -o "$TMP/k1" 2>/dev/null
$TLM finetune "${common[@]}" "${one[@]}" -o "$TMP/k2" --grad-accum 2 2>/dev/null
expect "micro-steps: the same step loss ($(step1 "$TMP/k1") vs $(step1 "$TMP/k2"))" \
    holds 'd < 1e-5 && d > -1e-5' d="$(awk -v a="$(step1 "$TMP/k1")" -v b="$(step1 "$TMP/k2")" 'BEGIN { print a - b }')"
if command -v mpirun >/dev/null 2>&1 && ldd "$TLM" 2>/dev/null | grep -q libmpi; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
    export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
    timeout 120 mpirun -np 2 --mca pml ob1 $TLM finetune "${common[@]}" "${one[@]}" -o "$TMP/n2" 2>/dev/null
    expect "2 processes: the same step loss ($(step1 "$TMP/k1") vs $(step1 "$TMP/n2"))" \
        holds 'd < 1e-5 && d > -1e-5' d="$(awk -v a="$(step1 "$TMP/k1")" -v b="$(step1 "$TMP/n2")" 'BEGIN { print a - b }')"
fi

# Completions, cut to --max-len from the end.
for i in $(seq 0 19); do
    printf '{"prompt": "Q: What did %s see?\\nA:", "completion": " %s saw %s."}\n' "${names[i % 6]}" "${names[i % 6]}" "${things[i % 5]}"
done >"$TMP/comp.jsonl"
$TLM finetune "${common[@]}" --data "$TMP/comp.jsonl" -o "$TMP/c" --steps 2 --max-len 20 \
    --truncate keep-end 2>"$TMP/c.err"
expect "completions train ($(tail -1 "$TMP/c.err"))" test $? -eq 0
expect "completions cut and counted" grep -q "(completion; loss on the completions): 0 malformed skipped, 20 cut to 20 tokens" "$TMP/c.err"

# Malformed lines: an error naming the line, or skipped and counted.
{ head -3 "$TMP/comp.jsonl"; echo '{"prompt": "x"}'; echo 'not json'; tail -3 "$TMP/comp.jsonl"; } >"$TMP/bad.jsonl"
$TLM finetune "${common[@]}" --data "$TMP/bad.jsonl" -o "$TMP/b" --steps 1 2>"$TMP/b.err"
expect "a malformed line fails the run" test $? -ne 0
expect "the error names line 4" grep -q "line 4: 'prompt' and 'completion' must both be strings" "$TMP/b.err"
$TLM finetune "${common[@]}" --data "$TMP/bad.jsonl" -o "$TMP/b" --steps 1 --skip-bad 2>"$TMP/b.err"
expect "--skip-bad goes on" test $? -eq 0
expect "--skip-bad counts them" grep -q "examples: 6 kept of 8 lines (completion; loss on the completions): 2 malformed skipped" "$TMP/b.err"
$TLM finetune "${common[@]}" --data "$TMP/comp.jsonl" -o "$TMP/b" --max-len 300 2>"$TMP/b.err"
expect "--max-len above the rows is refused" grep -q "max-len 300 exceeds the rows of 256" "$TMP/b.err"
$TLM finetune "${common[@]}" --data "$TMP/comp.jsonl" -o "$TMP/b" --format chat 2>"$TMP/b.err"
expect "a format the lines do not have names the line" grep -q "line 1: 'messages' must be a non-empty list" "$TMP/b.err"
$TLM finetune "${common[@]}" --data "$TMP/comp.jsonl" -o "$TMP/b" --loss-on everything 2>"$TMP/b.err"
expect "an unknown --loss-on is refused" grep -q "expected all, assistant or completion" "$TMP/b.err"
# DPO: the adapter starts at the base, so the first step's loss is ln 2 and its rewards 0.
for i in $(seq 0 39); do
    n=${names[i % 6]}
    printf '{"prompt": "Q: What did %s see?\\nA:", "chosen": " %s saw %s.", "rejected": " I do not know."}\n' "$n" "$n" "${things[i % 5]}"
done >"$TMP/pairs.jsonl"
dpo=(-m "$BASE" --data "$TMP/pairs.jsonl" --batch 4 --eval-interval 5 --eval-batches 1
     --log-interval 1 -t 1 --precision fp32 --seq-len 64 --steps 10)
$TLM finetune "${dpo[@]}" -o "$TMP/d" --lr 1e-3 2>"$TMP/d.err"
expect "DPO runs ($(tail -1 "$TMP/d.err"))" test $? -eq 0
expect "pairs counted" grep -q "36 training pairs, 4 validation" "$TMP/d.err"
expect "the reference named" grep -q "DPO: beta 0.1, label smoothing 0, rpo alpha 0, the reference BASE (the adapter switched off)" "$TMP/d.err"
expect "step 1: loss ln 2" grep -q '"step": 1, "train_loss": 0.693147, "rewards/chosen": 0, "rewards/rejected": 0' "$TMP/d/log.jsonl"
expect "TRL's figures logged" grep -q '"val_rewards/accuracies": 1' "$TMP/d/log.jsonl"
margins() { grep -o '"rewards/margins": [-0-9.e]*' "$1/log.jsonl" | cut -d' ' -f2; }
m1=$(margins "$TMP/d" | head -1)
m2=$(margins "$TMP/d" | tail -1)
expect "the reward margin grows ($m1 -> $m2)" holds 'b > a + 0.5' a="$m1" b="$m2"
# --full against a frozen copy of the base, live or precomputed: the same run.
$TLM finetune "${dpo[@]}" -o "$TMP/f1" --full --lr 1e-4 2>/dev/null
$TLM finetune "${dpo[@]}" -o "$TMP/f2" --full --lr 1e-4 --precompute-ref 2>/dev/null
expect "--precompute-ref gives the same run" test "$(log_col "$TMP/f1" train_loss)" = "$(log_col "$TMP/f2" train_loss)"
expect "--full DPO learns" holds 'b < a' a=0.693147 b="$(log_col "$TMP/f1" train_loss | tail -1 | cut -d' ' -f2)"
# --rpo-alpha adds the chosen answers' NLL: step 1's loss is ln 2 plus alpha times it.
$TLM finetune "${dpo[@]}" -o "$TMP/r" --steps 1 --rpo-alpha 0.5 2>/dev/null
nll=$(grep -o '"nll_loss": [-0-9.e]*' "$TMP/r/log.jsonl" | head -1 | cut -d' ' -f2)
expect "rpo: loss ln 2 + 0.5 nll ($nll)" holds 'l - (0.693147 + 0.5 * n) < 1e-4 && (0.693147 + 0.5 * n) - l < 1e-4' \
    n="${nll:-0}" l="$(log_col "$TMP/r" train_loss | head -1 | cut -d' ' -f2)"
$TLM finetune "${dpo[@]}" -o "$TMP/b" --pack 2>"$TMP/b.err"
expect "pairs are not packed" grep -q "preference pairs are not packed" "$TMP/b.err"
finish
