#!/usr/bin/env bash
# A mixture-of-experts config from the command line: `tlm train` end to end (the router losses in
# log.jsonl, Ctrl-C and --resume bit for bit), `tlm generate` and `tlm info` on the trained model,
# and the formats without expert tensors refusing it by name.
. "$(dirname "$0")/lib.sh"

toy_text "$TMP/text.txt"
cat >"$TMP/moe.json" <<'JSON'
{"context_length": 32, "d_model": 32, "n_layers": 2, "n_heads": 2, "n_experts": 4,
 "n_experts_used": 2, "expert_d_ff": 32, "expert_weights_norm": true, "n_shared_experts": 1,
 "router_aux_loss_coef": 0.01, "router_z_loss_coef": 0.001}
JSON
common=(-c "$TMP/moe.json" --data "$TMP/text.txt" --char --batch 8 --lr 3e-3 --warmup 5
        --eval-interval 50 --eval-batches 4 --log-interval 1 -t 2)

$TLM train "${common[@]}" -o "$TMP/a" --steps 150 2>"$TMP/a.err"; rc=$?
expect "train exits 0 ($(tail -1 "$TMP/a.err"))" test $rc -eq 0
for f in model.safetensors checkpoint.safetensors config.json log.jsonl; do
    expect "train writes $f" test -s "$TMP/a/$f"
done
expect "log has 150 lines" test "$(wc -l <"$TMP/a/log.jsonl")" -eq 150
expect "log has the router losses" grep -q '"router_aux_loss": [0-9.e+-]*, "router_z_loss": [0-9.e+-]*' "$TMP/a/log.jsonl"
# The load-balancing loss n_experts sum f_i P_i is k = 2 at perfect balance (a little below where
# the probabilities lean away from the choices); a collapsed router (every token to the same two
# experts, with all the probability) makes it 4.
aux=$(tail -1 "$TMP/a/log.jsonl" | sed 's/.*"router_aux_loss": \([0-9.e+-]*\).*/\1/')
expect "load-balancing loss $aux in [1.9, 3)" awk -v a="$aux" 'BEGIN { exit !(a >= 1.9 && a < 3) }'
first=$(head -1 "$TMP/a/log.jsonl" | sed 's/.*"train_loss": \([0-9.]*\).*/\1/')
last=$(tail -1 "$TMP/a/log.jsonl" | sed 's/.*"train_loss": \([0-9.]*\).*/\1/')
expect "training lowers the loss ($first -> $last)" awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 1) }'
expect "config keeps the expert fields" grep -q '"n_experts":[[:space:]]*4' "$TMP/a/config.json"

info=$($TLM info -m "$TMP/a" 2>&1); rc=$?
expect "info exits 0" test $rc -eq 0
expect "info shows the experts" grep -q "experts *4, 2 used per token" <<<"$info"
expect "info shows the active count" grep -q "active per token" <<<"$info"
expect "info lists the 3-D expert tensors" grep -q "blk.0.ffn_up_exps.weight.*\[4, 32, 32\]" <<<"$info"

out=$($TLM generate -m "$TMP/a" -p "the cat" -n 12 --temp 0 2>/dev/null); rc=$?
expect "generate after train" test $rc -eq 0
expect "generated text starts with the prompt" test "${out:0:7}" = "the cat"
out2=$($TLM generate -m "$TMP/a/model.safetensors" -z "$TMP/a/tokenizer" -p "the cat" -n 12 --temp 0 2>/dev/null)
expect "the same from the model file" test "$out" = "$out2"

# Ctrl-C saves a checkpoint; --resume finishes the run bit for bit as one never stopped.
long=(--steps 400)
$TLM train "${common[@]}" "${long[@]}" -o "$TMP/s" 2>/dev/null
$TLM train "${common[@]}" "${long[@]}" -o "$TMP/c" 2>"$TMP/c.err" &
pid=$!
wait_until 20 grep -q "step" "$TMP/c.err" 2>/dev/null
kill -INT $pid
wait $pid; rc=$?
expect "SIGINT exits 130 (got $rc)" test $rc -eq 130
$TLM train "${common[@]}" "${long[@]}" -o "$TMP/c" --resume 2>/dev/null; rc=$?
expect "resume exits 0" test $rc -eq 0
expect "stop + resume is bit for bit" cmp -s "$TMP/s/model.safetensors" "$TMP/c/model.safetensors"

# Formats without expert tensors refuse the model, naming why.
for to in gguf hf llama2c; do
    err=$($TLM convert "$TMP/a" "$TMP/out.$to" --to $to 2>&1 >/dev/null); rc=$?
    expect "convert --to $to refuses" test $rc -ne 0
    expect "convert --to $to names the experts ($err)" grep -q "mixture of experts (n_experts 4)" <<<"$err"
done
err=$($TLM convert "$TMP/a" "$TMP/q.gguf" --type q8_0 2>&1 >/dev/null); rc=$?
expect "quantize refuses" test $rc -ne 0
expect "quantize names the experts" grep -q "mixture of experts" <<<"$err"
$TLM convert "$TMP/a" "$TMP/copy" --to safetensors 2>/dev/null; rc=$?
expect "tlm's own safetensors holds it" test $rc -eq 0
out3=$($TLM generate -m "$TMP/copy" -p "the cat" -n 12 --temp 0 2>/dev/null)
expect "the copy generates the same" test "$out" = "$out3"

# LoRA on experts is refused by name.
err=$($TLM finetune -m "$TMP/a" --data "$TMP/text.txt" -o "$TMP/ft" --steps 2 2>&1 >/dev/null); rc=$?
expect "finetune (LoRA) refuses" test $rc -ne 0
expect "finetune names the experts ($err)" grep -q "LoRA on a mixture-of-experts model" <<<"$err"

finish
