#!/usr/bin/env bash
# `tlm train --data` on token shards: llm.c's format (written here the way llm.c's
# dev/data/data_common.py writes it), a directory, a glob, --val-data, tlm's own tokens.bin, and
# clear one-line errors for malformed shards.
. "$(dirname "$0")/lib.sh"

mkdir -p "$TMP/shards"
# A learnable stream over 13 ids (each id is followed by the next, with a little noise), in three
# training shards and one validation shard.
/usr/bin/python3 - "$TMP/shards" <<'PY'
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
cat >"$TMP/cfg.json" <<'JSON'
{"context_length": 16, "d_model": 32, "n_layers": 2, "n_heads": 2, "vocab_size": 13}
JSON
echo '{"context_length": 16, "d_model": 32, "n_layers": 2, "n_heads": 2}' >"$TMP/cfg_text.json"
common=(-c "$TMP/cfg.json" --batch 4 --lr 3e-3 --warmup 2 --eval-interval 15 --eval-batches 2
        --log-interval 1 -t 1 --steps 30)

$TLM train "${common[@]}" --data "$TMP/shards" --val-data "$TMP/val_000000.bin" -o "$TMP/dir" 2>"$TMP/dir.err"; rc=$?
expect "a directory of llm.c shards trains (got $rc: $(tail -2 "$TMP/dir.err"))" test $rc -eq 0
expect "9000 training tokens, 1000 validation" grep -q "9000 training / 1000 validation tokens" "$TMP/dir.err"
expect "no tokenizing" test ! -e "$TMP/dir/tokens.bin"
first=$(log_col "$TMP/dir" train_loss | head -1 | cut -d' ' -f2)
val=$(log_col "$TMP/dir" val_loss | sed -n 's/^30 //p')
expect "it learns: first loss $first, validation $val at the end" holds 'b != "" && b < a - 0.5' a="$first" b="$val"

$TLM train "${common[@]}" --data "$TMP/shards/train_*.bin" -o "$TMP/glob" 2>"$TMP/glob.err"; rc=$?
expect "a glob of shards trains (got $rc)" test $rc -eq 0
expect "glob: held-out tenth of 9000" grep -q "8100 training / 900 validation tokens" "$TMP/glob.err"
$TLM train "${common[@]}" --data "$TMP/shards/train_000001.bin" -o "$TMP/one" 2>/dev/null; rc=$?
expect "one shard trains (got $rc)" test $rc -eq 0
$TLM train "${common[@]}" --data "$TMP/shards" --val-data "$TMP/val_000000.bin" -o "$TMP/dir" --resume --steps 30 2>/dev/null; rc=$?
expect "resume without a tokenizer (got $rc)" test $rc -eq 0

# tlm's own token file from a text run is a shard too.
for i in $(seq 1 200); do echo "the cat sat on the mat. $((i % 5))"; done >"$TMP/text.txt"
$TLM train -c "$TMP/cfg_text.json" --data "$TMP/text.txt" --char --steps 2 --warmup 0 -t 1 -o "$TMP/text" 2>/dev/null
$TLM train "${common[@]}" -c "$TMP/cfg_text.json" --data "$TMP/text/tokens.bin" -z "$TMP/text/tokenizer" -o "$TMP/tok" 2>"$TMP/tok.err"; rc=$?
expect "tlm tokens.bin as --data (got $rc: $(tail -1 "$TMP/tok.err"))" test $rc -eq 0

chk_err() { # description, expected text, args...
    local d=$1 want=$2
    shift 2
    refuses "$d" "$want" $TLM train "$@"
}
cp "$TMP/shards/train_000000.bin" "$TMP/trunc.bin"
truncate -s 2000 "$TMP/trunc.bin"
chk_err "truncated shard" "header says 3000 tokens" "${common[@]}" --data "$TMP/trunc.bin" -o "$TMP/e"
/usr/bin/python3 -c "
import numpy as np; h = np.zeros(256, np.int32); h[0], h[1], h[2] = 20240520, 2, 0
open('$TMP/v2.bin', 'wb').write(h.tobytes())"
chk_err "unknown shard version" "version 2" "${common[@]}" --data "$TMP/v2.bin" -o "$TMP/e"
chk_err "glob without matches" "matches no file" "${common[@]}" --data "$TMP/none_*.bin" -o "$TMP/e"
mkdir -p "$TMP/empty"
chk_err "directory without shards" "holds no .bin token shards" "${common[@]}" --data "$TMP/empty" -o "$TMP/e"
cp "$TMP/text.txt" "$TMP/shards/notes.bin"
chk_err "a text file among the shards" "notes.bin' is not a token shard" "${common[@]}" --data "$TMP/shards" -o "$TMP/e"
rm "$TMP/shards/notes.bin"
chk_err "--char with shards" "--char builds its vocabulary from text" "${common[@]}" --data "$TMP/shards" --char -o "$TMP/e"
echo '{"context_length": 16, "d_model": 32, "n_layers": 2, "n_heads": 2, "vocab_size": 10}' >"$TMP/small.json"
capture $TLM train -c "$TMP/small.json" --data "$TMP/shards" --steps 2 --warmup 0 -t 1 -o "$TMP/e"
expect "ids past the model's vocabulary: fails (got $RC)" test $RC -ne 0
expect "... naming the id ($ERR)" grep -q "outside the vocabulary (10)" <<<"$ERR"

# tlm tokenize -o: shards written in parallel chunks hold exactly the ids of the whole text.
G=$DATA/tokenizers/gpt2 T=$DATA/text/tinystories_2MiB.txt
if [ -f "$T" ] && [ -f "$G/encoder.json" ]; then
    $TLM tokenize -z "$G" -o "$TMP/ts" --chunk-kib 64 --shard-tokens 100000 -t 2 "$T" "$T" 2>"$TMP/ts.err"; rc=$?
    expect "tokenize -o exits 0 (got $rc: $(tail -1 "$TMP/ts.err"))" test $rc -eq 0
    expect "11 shards of up to 100000 tokens" test "$(ls "$TMP/ts" | wc -l)" -eq 11
    expect "progress with MB/s and ETA" grep -q "MB/s | ETA" "$TMP/ts.err"
    $TLM tokenize -z "$G" <"$T" >"$TMP/whole.txt"
    same=$(/usr/bin/python3 - "$TMP/ts" "$TMP/whole.txt" <<'PY'
import glob, sys, numpy as np
got = np.concatenate([np.fromfile(f, np.uint16, offset=32) for f in sorted(glob.glob(sys.argv[1] + "/*.bin"))])
one = np.array(open(sys.argv[2]).read().split(), dtype=np.int64)
want = np.concatenate([one, one])
print("same" if len(got) == len(want) and (got == want).all() else f"differ: {len(got)} vs {len(want)}")
PY
)
    expect "64 KiB chunks on 2 threads give the whole text's ids ($same)" test "$same" = same
    echo '{"context_length": 16, "d_model": 16, "n_layers": 1, "n_heads": 2}' >"$TMP/gpt2tiny.json"
    $TLM train -c "$TMP/gpt2tiny.json" -z "$G" --data "$TMP/ts" --steps 2 --warmup 0 --batch 2 -t 1 \
        --eval-batches 1 -o "$TMP/tsrun" 2>"$TMP/tsrun.err"; rc=$?
    expect "train on tokenize -o's directory (got $rc: $(tail -1 "$TMP/tsrun.err"))" test $rc -eq 0
else
    bad "missing $T or $G (../shared/data)"
fi
err=$($TLM tokenize -z "$TMP/text/tokenizer" "$TMP/text.txt" 2>&1 </dev/null); rc=$?
expect "tokenize FILE without -o is refused: $err" grep -q "files are read with -o DIR" <<<"$err"
err=$($TLM tokenize -z "$TMP/text/tokenizer" -o "$TMP/x" --bos "$TMP/text.txt" 2>&1); rc=$?
expect "tokenize -o --bos is refused: $err" grep -q "do not apply" <<<"$err"

finish
