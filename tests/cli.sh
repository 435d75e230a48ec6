#!/usr/bin/env bash
# Command-line contract: help, version, one-line errors with non-zero exit, info counts.
set -u
TLM=${TLM:-build/tlm}
SRC=${TLM_SOURCE_DIR:-.}
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
expect() { # expect DESCRIPTION CONDITION...
    local d=$1; shift
    if "$@"; then ok; else bad "$d"; fi
}

out=$($TLM --version) && [[ $out == "tlm "* ]] && ok || bad "--version"
$TLM --help | grep -q "commands:" && ok || bad "--help lists commands"
$TLM info --help | grep -q "usage: tlm info" && ok || bad "info --help"

err=$($TLM frobnicate 2>&1 >/dev/null); rc=$?
expect "unknown command exits non-zero" test $rc -ne 0
expect "unknown command: one line" test "$(printf '%s\n' "$err" | wc -l)" -eq 1
expect "unknown command named" grep -q "frobnicate" <<<"$err"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo '{"d_model": 100, "n_heads": 3}' >"$tmp/bad.json"
err=$($TLM info -c "$tmp/bad.json" 2>&1 >/dev/null); rc=$?
expect "bad config exits non-zero" test $rc -ne 0
expect "bad config error names the problem" grep -q "not divisible by n_heads" <<<"$err"
echo '{"d_model": 64, "n_heads": 4, "wat": 1}' >"$tmp/unk.json"
err=$($TLM info -c "$tmp/unk.json" 2>&1 >/dev/null)
expect "unknown key named" grep -q "unknown config key 'wat'" <<<"$err"
err=$($TLM info -c "$tmp/missing.json" 2>&1 >/dev/null); rc=$?
expect "missing file" test $rc -ne 0
err=$($TLM info --bogus 2>&1 >/dev/null); rc=$?
expect "unknown flag" test $rc -ne 0

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
printf "\\x$(printf %02x ${#hdr})\\0\\0\\0\\0\\0\\0\\0%s" "$hdr" >"$tmp/huge_ctx.safetensors"
expect "forged header file is 94 bytes" test "$(stat -c %s "$tmp/huge_ctx.safetensors")" -eq 94
err=$(timeout 5 $TLM info -m "$tmp/huge_ctx.safetensors" 2>&1 >/dev/null); rc=$?
expect "huge context_length refused in time (rc $rc)" test $rc -ne 0 -a $rc -ne 124
expect "huge context_length named: $err" grep -q "context_length" <<<"$err"

echo "cli: $pass passed, $fail failed"
[ $fail -eq 0 ]
