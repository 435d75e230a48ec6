#!/usr/bin/env bash
# `tlm train` from the command line: outputs, resume, Ctrl-C, flag errors before any work, and
# that the trained model generates.
. "$(dirname "$0")/lib.sh"

toy_text "$TMP/text.txt"
cat >"$TMP/cfg.json" <<'JSON'
{"context_length": 32, "d_model": 32, "n_layers": 2, "n_heads": 2, "dropout": 0.1}
JSON
common=(-c "$TMP/cfg.json" --data "$TMP/text.txt" --char --batch 4 --lr 3e-3 --warmup 2
        --eval-interval 5 --eval-batches 4 --log-interval 1 -t 1)

$TLM train "${common[@]}" -o "$TMP/a" --steps 10 2>"$TMP/a.err"; rc=$?
expect "train exits 0" test $rc -eq 0
for f in model.safetensors checkpoint.safetensors config.json log.jsonl loss.svg tokenizer/tokenizer.json tokens.bin; do
    expect "train writes $f" test -s "$TMP/a/$f"
done
expect "progress on stderr" grep -q "step 10/10 | loss" "$TMP/a.err"
expect "log has 10 lines" test "$(wc -l <"$TMP/a/log.jsonl")" -eq 10
expect "log has val_loss" grep -q '"val_loss"' "$TMP/a/log.jsonl"
expect "config vocab from the tokenizer" grep -q '"vocab_size":[[:space:]]*2[0-9],' "$TMP/a/config.json"
expect "svg" grep -q "<svg" "$TMP/a/loss.svg"

# Ctrl-C saves a checkpoint and exits 130; --resume then finishes the run, bit for bit the same
# as a run that was never stopped (same --steps, so the same schedule; dropout masks included).
long=(--steps 400 --batch 16)
$TLM train "${common[@]}" "${long[@]}" -o "$TMP/s" 2>/dev/null
$TLM train "${common[@]}" "${long[@]}" -o "$TMP/c" 2>"$TMP/c.err" &
pid=$!
wait_until 10 grep -q "step" "$TMP/c.err" 2>/dev/null
kill -INT $pid
wait $pid; rc=$?
expect "SIGINT exits 130 (got $rc)" test $rc -eq 130
expect "SIGINT leaves a checkpoint" test -s "$TMP/c/checkpoint.safetensors"
expect "SIGINT message" grep -q "resume with --resume" "$TMP/c.err"
$TLM train "${common[@]}" "${long[@]}" -o "$TMP/c" --resume 2>/dev/null; rc=$?
expect "resume exits 0" test $rc -eq 0
expect "stop + resume is bit for bit" cmp -s "$TMP/s/model.safetensors" "$TMP/c/model.safetensors"
expect "resumed log has 400 lines" test "$(wc -l <"$TMP/c/log.jsonl")" -eq 400

# The trained model generates from its own tokenizer.
out=$($TLM generate -m "$TMP/a" -p "the cat" -n 10 --temp 0 2>/dev/null); rc=$?
expect "generate after train" test $rc -eq 0
expect "generated text starts with the prompt" test "${out:0:7}" = "the cat"

# tlm eval: the loss over the whole text, as JSON; after 400 steps it is well below log(vocab).
json=$($TLM eval -m "$TMP/s" --data "$TMP/text.txt" --json 2>/dev/null); rc=$?
expect "eval exits 0" test $rc -eq 0
loss=$(sed 's/.*"loss": \([0-9.]*\).*/\1/' <<<"$json")
expect "eval JSON keys" grep -q '"perplexity".*"bits_per_byte".*"tokens"' <<<"$json"
expect "eval counts every next token" grep -q "\"tokens\": $(( $(wc -c <"$TMP/text.txt") - 1 ))" <<<"$json"
expect "trained loss $loss below log(vocab)" awk -v l="$loss" 'BEGIN { exit !(l > 0 && l < 3.0) }'
err=$($TLM eval -m "$TMP/a" 2>&1 >/dev/null); rc=$?
expect "eval without data fails" test $rc -ne 0
expect "eval names the missing flag" grep -q -- "--data" <<<"$err"

# The default init is GPT-2's (the same model as --init gpt2, bit for bit); --init xavier is the
# other scheme, and --help says which is which.
$TLM train "${common[@]}" -o "$TMP/i0" --steps 3 2>/dev/null
$TLM train "${common[@]}" -o "$TMP/i1" --steps 3 --init gpt2 2>/dev/null
$TLM train "${common[@]}" -o "$TMP/i2" --steps 3 --init xavier 2>/dev/null
expect "default init is gpt2" test -s "$TMP/i0/model.safetensors" -a -z "$(cmp "$TMP/i0/model.safetensors" "$TMP/i1/model.safetensors" 2>&1)"
expect "xavier init differs" test -s "$TMP/i2/model.safetensors" -a -n "$(cmp "$TMP/i0/model.safetensors" "$TMP/i2/model.safetensors" 2>&1)"
help=$($TLM train --help)
expect "help names the default init" grep -q -- "--init gpt2|xavier .*default gpt2" <<<"$help"

# Flag and config errors come before any work, as one line.
chk_err() { # description, expected text, args...
    local d=$1 want=$2
    shift 2
    refuses "$d" "$want" $TLM train "$@"
}
chk_err "missing -o" "-o OUTDIR is required" -c "$TMP/cfg.json" --data "$TMP/text.txt" --char
chk_err "bad steps" "--steps must be" "${common[@]}" -o "$TMP/d" --steps 0
chk_err "bad lr" "--lr must be" "${common[@]}" -o "$TMP/d" --lr abc
chk_err "batch vs micro-steps" "--grad-accum 3" "${common[@]}" -o "$TMP/d" --grad-accum 3
chk_err "unknown init" "--init must be gpt2 or xavier" "${common[@]}" -o "$TMP/d" --init default
chk_err "unknown flag" "unknown option '--frob'" "${common[@]}" -o "$TMP/d" --frob
chk_err "no data" "cannot read data file" -c "$TMP/cfg.json" --data "$TMP/none.txt" --char -o "$TMP/d"
chk_err "resume without checkpoint" "does not exist" "${common[@]}" -o "$TMP/e" --resume
echo '{"d_model": 30, "n_heads": 4}' >"$TMP/bad.json"
chk_err "bad config" "not divisible" -c "$TMP/bad.json" --data "$TMP/text.txt" --char -o "$TMP/d"
chk_err "window too long" "exceeds the model's context_length" -c "$TMP/cfg.json" --data "$TMP/text.txt" --char -o "$TMP/d" --seq-len 64
expect "no work done on errors" test ! -e "$TMP/d/tokens.bin"

finish
