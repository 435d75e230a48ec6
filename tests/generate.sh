#!/usr/bin/env bash
# tlm generate: flags, --ids / --print-ids, limits (-n, context), seeding, errors, and real text
# from the pretrained llama2.c stories260K model in ../shared/data (a failure when it is missing).
. "$(dirname "$0")/lib.sh"

# A tiny random tlm checkpoint (vocab 50, context 16), written without torch; the second argument
# is its heads (4: head size 8; 1: head size 32, which a Q8_0 cache takes), the third (optional)
# the seed of its weights.
tiny() {
python3 - "$1" "$2" "${3:-1}" <<'EOF'
import json, random, struct, sys
cfg = {"vocab_size": 50, "context_length": 16, "d_model": 32, "n_layers": 2,
       "n_heads": int(sys.argv[2])}
d, V, ff = 32, 50, 128  # swiglu d_ff: ceil(8*32/3)=86 -> 128
shapes = [("token_embd.weight", (V, d))]
for l in range(2):
    p = f"blk.{l}."
    shapes += [(p + "attn_norm.weight", (d,)), (p + "attn_q.weight", (d, d)),
               (p + "attn_k.weight", (d, d)), (p + "attn_v.weight", (d, d)),
               (p + "attn_output.weight", (d, d)), (p + "ffn_norm.weight", (d,)),
               (p + "ffn_gate.weight", (ff, d)), (p + "ffn_up.weight", (ff, d)),
               (p + "ffn_down.weight", (d, ff))]
shapes.append(("output_norm.weight", (d,)))
rng = random.Random(int(sys.argv[3]))
header, blobs, off = {"__metadata__": {"tlm_config": json.dumps(cfg)}}, [], 0
for name, shape in shapes:
    n = 1
    for s in shape:
        n *= s
    if name.endswith("norm.weight"):
        vals = [1.0] * n
    else:
        std = 1.0 if name == "token_embd.weight" else (2.0 / sum(shape)) ** 0.5
        vals = [rng.gauss(0, std) for _ in range(n)]
    b = struct.pack(f"<{n}f", *vals)
    header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [off, off + len(b)]}
    blobs.append(b)
    off += len(b)
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
EOF
}
tiny "$TMP/tiny.safetensors" 4
M=$TMP/tiny.safetensors

$TLM generate --help | grep -q "usage: tlm generate" && ok || bad "--help"
$TLM --help | grep -q "generate" && ok || bad "tlm --help lists generate"

out=$($TLM generate -m "$M" --ids "1 2 3" -n 5 --temp 0 --print-ids -t 2 2>"$TMP/err"); rc=$?
expect "ids run exits 0" test $rc -eq 0
read -ra a <<<"$out"
expect "prompt + 5 new ids ($out)" test ${#a[@]} -eq 8
expect "ids start with the prompt" test "${a[*]:0:3}" = "1 2 3"
expect "one line of ids" test "$(printf '%s\n' "$out" | wc -l)" -eq 1
expect "timings on stderr" grep -q "prompt: 3 tokens.*generation: 5 tokens.*tok/s" "$TMP/err"
for id in "${a[@]}"; do
    if ! [[ $id =~ ^[0-9]+$ ]] || ((id >= 50)); then bad "id '$id' outside the vocabulary"; fi
done

again=$($TLM generate -m "$M" --ids "1,2,3" -n 5 --temp 0 --print-ids 2>/dev/null)
expect "greedy is deterministic (commas too)" test "$out" = "$again"
s1=$($TLM generate -m "$M" --ids 7 -n 12 --temp 1.5 --top-k 0 --top-p 1 --seed 5 --print-ids 2>/dev/null)
s2=$($TLM generate -m "$M" --ids 7 -n 12 --temp 1.5 --top-k 0 --top-p 1 --seed 5 --print-ids 2>/dev/null)
s3=$($TLM generate -m "$M" --ids 7 -n 12 --temp 1.5 --top-k 0 --top-p 1 --seed 6 --print-ids 2>/dev/null)
expect "same seed, same ids" test "$s1" = "$s2"
expect "another seed, other ids" test "$s1" != "$s3"
read -ra a <<<"$s1"
expect "sampled 12 ids" test ${#a[@]} -eq 13

# Context limit: 10 prompt ids + at most 6 new in a context of 16, with a notice.
out=$($TLM generate -m "$M" --ids "1 2 3 4 5 6 7 8 9 10" -n 100 --temp 0 --print-ids 2>"$TMP/err")
read -ra a <<<"$out"
expect "stops at context_length (${#a[@]} ids)" test ${#a[@]} -eq 16
expect "context notice" grep -q "reached context_length 16" "$TMP/err"
out=$($TLM generate -m "$M" --ids "1 2 3" -n -1 --temp 0 --print-ids 2>/dev/null)
read -ra a <<<"$out"
expect "-n -1 runs to the context (${#a[@]} ids)" test ${#a[@]} -eq 16
out=$($TLM generate -m "$M" --ids "4 5" -n 0 --print-ids 2>/dev/null)
expect "-n 0 prints the prompt only" test "$out" = "4 5"
out=$($TLM generate -m "$M" --ids "4 5" -n 3 --temp 0 2>"$TMP/err")
read -ra a <<<"$out"
expect "no tokenizer: ids instead of text" test ${#a[@]} -eq 5
expect "no tokenizer: notice" grep -q "no tokenizer" "$TMP/err"

one_line_error() { # DESCRIPTION PATTERN ARGS...
    local d=$1 pat=$2
    shift 2
    refuses "$d" "$pat" $TLM generate "$@"
}
one_line_error "no model" "-m MODEL" --ids 1
one_line_error "missing model file" "no such" -m "$TMP/none.safetensors" --ids 1
one_line_error "id outside vocab" "outside the vocabulary" -m "$M" --ids "1 50" --print-ids
one_line_error "prompt past context" "more than context_length" -m "$M" --print-ids \
    --ids "$(seq -s ' ' 1 17)"
one_line_error "bad ids" "--ids wants" -m "$M" --ids "1 x" --print-ids
one_line_error "no prompt, no tokenizer" "give" -m "$M" --print-ids
one_line_error "both prompts" "not both" -m "$M" -p hi --ids 1
one_line_error "bad temp" "--temp" -m "$M" --ids 1 --temp -1
one_line_error "bad top-p" "--top-p" -m "$M" --ids 1 --top-p 0
one_line_error "bad -n" "-n wants" -m "$M" --ids 1 -n abc
one_line_error "unknown flag" "unknown option" -m "$M" --ids 1 --frobnicate
one_line_error "missing value" "needs a value" -m "$M" --ids
one_line_error "bad cache type" "cache-type must be one of f16, f32, bf16, q8_0" -m "$M" --ids 1 --cache-type q8
one_line_error "values' Q8_0, head size 8" "multiple of 32" -m "$M" --ids 1 --print-ids -ctv q8_0
one_line_error "Q8_0 cache, head size 8" "multiple of 32" -m "$M" --ids 1 --print-ids --cache-type q8_0
# the block types on head size 32 (-ctk/-ctv as llama.cpp's flags)
tiny "$TMP/tiny1.safetensors" 1
for ct in q8_0 q4_0 iq4_nl "-ctk q5_1 -ctv q5_1" "-ctk q8_0" "-ctk q8_0 -ctv q4_0" f32; do
    [[ $ct == -* ]] || ct="--cache-type $ct"
    out=$($TLM generate -m "$TMP/tiny1.safetensors" --ids "1 2 3" -n 5 --temp 0 --print-ids -t 2 \
        $ct 2>"$TMP/err"); rc=$?
    read -ra a <<<"$out"
    expect "$ct: prompt + 5 new ids ($out, $(cat "$TMP/err"))" test $rc -eq 0 -a ${#a[@]} -eq 8
done

# Speculative decoding: greedy ids as plain decoding gives them, with the model as its own draft
# (everything accepted), a draft of other weights, and lookup; the counts on stderr.
tiny "$TMP/tiny_draft.safetensors" 2 7
plain=$($TLM generate -m "$M" --ids "3 9 3 9 3" -n 11 --temp 0 --print-ids 2>/dev/null)
for sp in "-md $M --draft-p-min 0" "--model-draft $TMP/tiny_draft.safetensors --draft-p-min 0" \
    "-md $TMP/tiny_draft.safetensors --draft-max 3 --draft-min 2" "--lookup" "--lookup --draft 2"; do
    # shellcheck disable=SC2086
    out=$($TLM generate -m "$M" --ids "3 9 3 9 3" -n 11 --temp 0 --print-ids $sp 2>"$TMP/err")
    expect "$sp: the greedy ids of plain decoding ($out vs $plain)" test "$out" = "$plain"
    expect "$sp: counts on stderr" grep -q "speculative (.*): [0-9]* ids proposed, [0-9]* accepted" \
        "$TMP/err"
done
$TLM generate -m "$M" --ids "3 9 3 9 3" -n 11 --temp 0 --print-ids -md "$M" --draft-p-min 0 \
    2>"$TMP/err" >/dev/null
expect "own draft: everything accepted ($(cat "$TMP/err"))" grep -q "ids proposed, \([0-9]*\) accepted (100.0%)" "$TMP/err"
s1=$($TLM generate -m "$M" --ids 7 -n 12 --temp 1 --seed 5 --print-ids -md "$TMP/tiny_draft.safetensors" 2>/dev/null)
s2=$($TLM generate -m "$M" --ids 7 -n 12 --temp 1 --seed 5 --print-ids -md "$TMP/tiny_draft.safetensors" 2>/dev/null)
read -ra a <<<"$s1"
expect "speculative sampling: 12 ids, reproducible by seed" test ${#a[@]} -eq 13 -a "$s1" = "$s2"
echo 'root ::= "a"' >"$TMP/a.gbnf"
one_line_error "draft and lookup" "not both" -m "$M" --ids 1 -md "$M" --lookup
one_line_error "lookup with a grammar" "does not take --grammar" -m "$M" --ids 1 --lookup \
    --grammar "$TMP/a.gbnf"
one_line_error "bad --draft-p-min" "--draft-p-min wants" -m "$M" --ids 1 --lookup --draft-p-min 2
one_line_error "bad --draft-max" "--draft-max wants" -m "$M" --ids 1 --lookup --draft-max -1
one_line_error "draft-min over draft-max" "more than --draft-max" -m "$M" --ids 1 --lookup \
    --draft-max 2 --draft-min 3
one_line_error "missing draft file" "draft model" -m "$M" --ids 1 -md "$TMP/none.safetensors"

# The pretrained llama2.c stories260K: greedy decoding gives llama2.c's documented story.
if [[ -f $DATA/models/stories260K.bin && -f $DATA/models/tok512.bin ]]; then
    D=$DATA/models
    out=$($TLM generate -m "$D/stories260K.bin" -z "$D/tok512.bin" -p "Once upon a time" -n 40 \
        --temp 0 -t 2 2>"$TMP/err"); rc=$?
    expect "stories260K exits 0 ($(cat "$TMP/err"))" test $rc -eq 0
    expect "stories260K greedy story ($out)" grep -q \
        "^Once upon a time, there was a little girl named Lily. She loved to play outside" <<<"$out"
    # the default F16 cache and an F32 one tell the same greedy story
    f32=$($TLM generate -m "$D/stories260K.bin" -z "$D/tok512.bin" -p "Once upon a time" -n 40 \
        --temp 0 -t 2 --cache-type f32 2>/dev/null)
    expect "stories260K, F32 cache: the same story" test "$out" = "$f32"
    ids=$($TLM generate -m "$D/stories260K.bin" -z "$D/tok512.bin" -p "Once upon a time" -n 40 \
        --temp 0 --print-ids 2>/dev/null)
    read -ra a <<<"$ids"
    expect "stories260K: BOS first, 40 new ids" test "${a[0]}" = 1 -a ${#a[@]} -eq 45
    # Starting from BOS (no prompt) with sampling: text comes out, seeded runs agree.
    t1=$($TLM generate -m "$D/stories260K.bin" -z "$D/tok512.bin" -n 30 --seed 9 2>/dev/null)
    t2=$($TLM generate -m "$D/stories260K.bin" -z "$D/tok512.bin" -n 30 --seed 9 2>/dev/null)
    expect "BOS start gives text" test ${#t1} -gt 20
    expect "BOS start reproducible" test "$t1" = "$t2"
    # The penalties change greedy text (the story repeats "Lily"); neutral values do not.
    g=(-m "$D/stories260K.bin" -z "$D/tok512.bin" -p "Once upon a time" -n 60 --temp 0)
    plain=$($TLM generate "${g[@]}" 2>/dev/null)
    same=$($TLM generate "${g[@]}" --repeat-penalty 1 --presence-penalty 0 --min-p 0 2>/dev/null)
    expect "neutral sampler flags keep greedy text" test "$plain" = "$same"
    for f in "--repeat-penalty 1.5" "--presence-penalty 1" "--frequency-penalty 0.5"; do
        # shellcheck disable=SC2086
        pen=$($TLM generate "${g[@]}" $f 2>/dev/null)
        expect "$f changes greedy text" test -n "$pen" -a "$pen" != "$plain"
    done
    # speculative decoding tells the same story: the model as its draft (another format of it),
    # and lookup
    for sp in "-md $D/stories260K.gguf" "--lookup"; do
        # shellcheck disable=SC2086
        out=$($TLM generate "${g[@]}" $sp 2>"$TMP/err")
        expect "stories260K, $sp: the same story ($(tail -1 "$TMP/err"))" test "$out" = "$plain"
    done
    one_line_error "draft of another vocabulary" "has 50 ids in its vocabulary, the model 512" \
        "${g[@]}" -md "$M"
    one_line_error "min-p out of range" "min-p" "${g[@]}" --min-p 1.5
    one_line_error "repeat-penalty 0" "repeat-penalty" "${g[@]}" --repeat-penalty 0
else
    bad "the shared test data is missing: no $DATA/models/stories260K.bin and tok512.bin"
fi

finish
