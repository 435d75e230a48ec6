#!/usr/bin/env bash
# `tlm train --data` on token shards: llm.c's format (written here the way llm.c's
# dev/data/data_common.py writes it), a directory, a glob, --val-data, tlm's own tokens.bin, and
# clear one-line errors for malformed shards.
set -u
TLM=${TLM:-build/tlm}
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
expect() { local d=$1; shift; if "$@"; then ok; else bad "$d"; fi; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/shards"
# A learnable stream over 13 ids (each id is followed by the next, with a little noise), in three
# training shards and one validation shard.
/usr/bin/python3 - "$tmp/shards" <<'PY'
import sys, numpy as np
rng = np.random.default_rng(1)
def write(path, toks):
    head = np.zeros(256, dtype=np.int32)
    head[0], head[1], head[2] = 20240520, 1, len(toks)
    with open(path, "wb") as f:
        f.write(head.tobytes())
        f.write(np.asarray(toks, dtype=np.uint16).tobytes())
def stream(n):
    return (np.arange(n) + 5 * (rng.random(n) < 0.1)) % 13
for i in range(3):
    write(f"{sys.argv[1]}/train_{i:06d}.bin", stream(3000))
write(f"{sys.argv[1]}/../val_000000.bin", stream(1000))
PY
cat >"$tmp/cfg.json" <<'JSON'
{"context_length": 16, "d_model": 32, "n_layers": 2, "n_heads": 2, "vocab_size": 13}
JSON
echo '{"context_length": 16, "d_model": 32, "n_layers": 2, "n_heads": 2}' >"$tmp/cfg_text.json"
common=(-c "$tmp/cfg.json" --batch 4 --lr 3e-3 --warmup 2 --eval-interval 15 --eval-batches 2
        --log-interval 1 -t 1 --steps 30)

$TLM train "${common[@]}" --data "$tmp/shards" --val-data "$tmp/val_000000.bin" -o "$tmp/dir" 2>"$tmp/dir.err"; rc=$?
expect "a directory of llm.c shards trains (got $rc: $(tail -2 "$tmp/dir.err"))" test $rc -eq 0
expect "9000 training tokens, 1000 validation" grep -q "9000 training / 1000 validation tokens" "$tmp/dir.err"
expect "no tokenizing" test ! -e "$tmp/dir/tokens.bin"
first=$(sed -n '1s/.*"train_loss": \([0-9.]*\).*/\1/p' "$tmp/dir/log.jsonl")
val=$(sed -n 's/.*"step": 30,.*"val_loss": \([0-9.]*\).*/\1/p' "$tmp/dir/log.jsonl")
expect "it learns: first loss $first, validation $val at the end" awk -v a="$first" -v b="$val" 'BEGIN { exit !(b != "" && b < a - 0.5) }'

$TLM train "${common[@]}" --data "$tmp/shards/train_*.bin" -o "$tmp/glob" 2>"$tmp/glob.err"; rc=$?
expect "a glob of shards trains (got $rc)" test $rc -eq 0
expect "glob: held-out tenth of 9000" grep -q "8100 training / 900 validation tokens" "$tmp/glob.err"
$TLM train "${common[@]}" --data "$tmp/shards/train_000001.bin" -o "$tmp/one" 2>/dev/null; rc=$?
expect "one shard trains (got $rc)" test $rc -eq 0
$TLM train "${common[@]}" --data "$tmp/shards" --val-data "$tmp/val_000000.bin" -o "$tmp/dir" --resume --steps 30 2>/dev/null; rc=$?
expect "resume without a tokenizer (got $rc)" test $rc -eq 0

# tlm's own token file from a text run is a shard too.
for i in $(seq 1 200); do echo "the cat sat on the mat. $((i % 5))"; done >"$tmp/text.txt"
$TLM train -c "$tmp/cfg_text.json" --data "$tmp/text.txt" --char --steps 2 --warmup 0 -t 1 -o "$tmp/text" 2>/dev/null
$TLM train "${common[@]}" -c "$tmp/cfg_text.json" --data "$tmp/text/tokens.bin" -z "$tmp/text/tokenizer" -o "$tmp/tok" 2>"$tmp/tok.err"; rc=$?
expect "tlm tokens.bin as --data (got $rc: $(tail -1 "$tmp/tok.err"))" test $rc -eq 0

chk_err() { # description, expected text, args...
    local d=$1 want=$2; shift 2
    local err rc
    err=$($TLM train "$@" 2>&1 >/dev/null); rc=$?
    expect "$d: non-zero exit" test $rc -ne 0
    expect "$d: says '$want' (got: $err)" grep -q -- "$want" <<<"$err"
    expect "$d: one line" test "$(printf '%s\n' "$err" | wc -l)" -eq 1
}
cp "$tmp/shards/train_000000.bin" "$tmp/trunc.bin"
truncate -s 2000 "$tmp/trunc.bin"
chk_err "truncated shard" "header says 3000 tokens" "${common[@]}" --data "$tmp/trunc.bin" -o "$tmp/e"
/usr/bin/python3 -c "
import numpy as np; h = np.zeros(256, np.int32); h[0], h[1], h[2] = 20240520, 2, 0
open('$tmp/v2.bin', 'wb').write(h.tobytes())"
chk_err "unknown shard version" "version 2" "${common[@]}" --data "$tmp/v2.bin" -o "$tmp/e"
chk_err "glob without matches" "matches no file" "${common[@]}" --data "$tmp/none_*.bin" -o "$tmp/e"
mkdir -p "$tmp/empty"
chk_err "directory without shards" "holds no .bin token shards" "${common[@]}" --data "$tmp/empty" -o "$tmp/e"
cp "$tmp/text.txt" "$tmp/shards/notes.bin"
chk_err "a text file among the shards" "notes.bin' is not a token shard" "${common[@]}" --data "$tmp/shards" -o "$tmp/e"
rm "$tmp/shards/notes.bin"
chk_err "--char with shards" "--char builds its vocabulary from text" "${common[@]}" --data "$tmp/shards" --char -o "$tmp/e"
echo '{"context_length": 16, "d_model": 32, "n_layers": 2, "n_heads": 2, "vocab_size": 10}' >"$tmp/small.json"
err=$($TLM train -c "$tmp/small.json" --data "$tmp/shards" --steps 2 --warmup 0 -t 1 -o "$tmp/e" 2>&1 >/dev/null); rc=$?
expect "ids past the model's vocabulary: fails (got $rc)" test $rc -ne 0
expect "... naming the id ($err)" grep -q "outside the vocabulary (10)" <<<"$err"

# tlm tokenize -o: shards written in parallel chunks hold exactly the ids of the whole text.
SHARED=${TLM_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}/../shared/data
G=$SHARED/tokenizers/gpt2 T=$SHARED/text/tinystories_2MiB.txt
if [ -f "$T" ] && [ -f "$G/encoder.json" ]; then
    $TLM tokenize -z "$G" -o "$tmp/ts" --chunk-kib 64 --shard-tokens 100000 -t 2 "$T" "$T" 2>"$tmp/ts.err"; rc=$?
    expect "tokenize -o exits 0 (got $rc: $(tail -1 "$tmp/ts.err"))" test $rc -eq 0
    expect "11 shards of up to 100000 tokens" test "$(ls "$tmp/ts" | wc -l)" -eq 11
    expect "progress with MB/s and ETA" grep -q "MB/s | ETA" "$tmp/ts.err"
    $TLM tokenize -z "$G" <"$T" >"$tmp/whole.txt"
    same=$(/usr/bin/python3 - "$tmp/ts" "$tmp/whole.txt" <<'PY'
import glob, sys, numpy as np
got = np.concatenate([np.fromfile(f, np.uint16, offset=32) for f in sorted(glob.glob(sys.argv[1] + "/*.bin"))])
one = np.array(open(sys.argv[2]).read().split(), dtype=np.int64)
want = np.concatenate([one, one])
print("same" if len(got) == len(want) and (got == want).all() else f"differ: {len(got)} vs {len(want)}")
PY
)
    expect "64 KiB chunks on 2 threads give the whole text's ids ($same)" test "$same" = same
    echo '{"context_length": 16, "d_model": 16, "n_layers": 1, "n_heads": 2}' >"$tmp/gpt2tiny.json"
    $TLM train -c "$tmp/gpt2tiny.json" -z "$G" --data "$tmp/ts" --steps 2 --warmup 0 --batch 2 -t 1 \
        --eval-batches 1 -o "$tmp/tsrun" 2>"$tmp/tsrun.err"; rc=$?
    expect "train on tokenize -o's directory (got $rc: $(tail -1 "$tmp/tsrun.err"))" test $rc -eq 0
else
    bad "missing $T or $G (../shared/data)"
fi
err=$($TLM tokenize -z "$tmp/text/tokenizer" "$tmp/text.txt" 2>&1 </dev/null); rc=$?
expect "tokenize FILE without -o is refused: $err" grep -q "files are read with -o DIR" <<<"$err"
err=$($TLM tokenize -z "$tmp/text/tokenizer" -o "$tmp/x" --bos "$tmp/text.txt" 2>&1); rc=$?
expect "tokenize -o --bos is refused: $err" grep -q "do not apply" <<<"$err"

echo "shards_cli: $pass passed, $fail failed"
[ $fail -eq 0 ]
