#!/usr/bin/env bash
# Command-line contract: help, version, one-line errors with non-zero exit, info counts.
. "$(dirname "$0")/lib.sh"

out=$($TLM --version) && [[ $out == "tlm "* ]] && ok || bad "--version"
$TLM --help | grep -q "commands:" && ok || bad "--help lists commands"
$TLM info --help | grep -q "usage: tlm info" && ok || bad "info --help"

refuses "unknown command" "frobnicate" $TLM frobnicate

echo '{"d_model": 100, "n_heads": 3}' >"$TMP/bad.json"
refuses "bad config" "not divisible by n_heads" $TLM info -c "$TMP/bad.json"
echo '{"d_model": 64, "n_heads": 4, "wat": 1}' >"$TMP/unk.json"
capture $TLM info -c "$TMP/unk.json"
expect "unknown key named" grep -q "unknown config key 'wat'" <<<"$ERR"
capture $TLM info -c "$TMP/missing.json"
expect "missing file" test $RC -ne 0
capture $TLM info --bogus
expect "unknown flag" test $RC -ne 0

json=$($TLM info -c "$SRC/configs/gpt2-small.json" --json)
expect "gpt2-small count" grep -q '"parameters":[[:space:]]*124439808' <<<"$json"
json=$($TLM info -c "$SRC/configs/modern-124m.json" --json)
expect "modern count" grep -q '"parameters":[[:space:]]*123551232' <<<"$json"
expect "modern non-embedding" grep -q '"non_embedding_parameters":[[:space:]]*84953856' <<<"$json"
table=$($TLM info -c "$SRC/configs/modern-124m.json")
expect "table total" grep -q "total .*123551232" <<<"$table"

# A tlm .safetensors is a length, a JSON header and tensor data; this one (94 bytes) is only a
# header whose config asks for 2e9 positions at head dim 2. The model would build RoPE tables of
# 2e9 floats before reading any tensor: it must be refused at once, naming the field.
cfg='{\"context_length\":2e9,\"d_model\":2,\"n_heads\":1}'
hdr="{\"__metadata__\":{\"tlm_config\":\"$cfg\"}}"
# the header's length (86) as a little-endian u64, then the header
printf "\\x$(printf %02x ${#hdr})\\0\\0\\0\\0\\0\\0\\0%s" "$hdr" >"$TMP/huge_ctx.safetensors"
expect "forged header file is 94 bytes" test "$(stat -c %s "$TMP/huge_ctx.safetensors")" -eq 94
capture timeout 5 $TLM info -m "$TMP/huge_ctx.safetensors"
expect "huge context_length refused in time (rc $RC)" test $RC -ne 0 -a $RC -ne 124
expect "huge context_length named: $ERR" grep -q "context_length" <<<"$ERR"

finish
