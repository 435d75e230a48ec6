#!/usr/bin/env bash
# tlm loads the adapter that llama.cpp's own converter (convert_lora_to_gguf.py, from the source
# that node-llama-cpp carries) makes from the PEFT directory tlm finetune wrote, over the Hugging
# Face export of the base: the same loss and greedy text as tlm's own GGUF adapter and PEFT
# directory. The converter runs unchanged under tests/reference/llama_converter/run.py, which
# stands in for the Python packages Debian lacks.
. "$(dirname "$0")/lib.sh"

BASE="$DATA/models/stories260K.gguf"
BUNDLE="$SRC/tests/node/node_modules/node-llama-cpp/llama/gitRelease.bundle"
[ -f "$BASE" ] || die "missing $BASE"
[ -f "$BUNDLE" ] || die "no llama.cpp source bundle at $BUNDLE (scripts/setup.sh installs it)"
toy_text "$TMP/text.txt"

# An adapter that has moved away from the base (a high learning rate, a few steps).
$TLM finetune -m "$BASE" --data "$TMP/text.txt" -o "$TMP/ft" --batch 4 --seq-len 32 --lr 1e-2 \
    --steps 12 --eval-interval 0 -t 1 2>"$TMP/ft.err"
expect "finetune exits 0" test $? -eq 0
$TLM convert "$BASE" "$TMP/hf" --to hf >/dev/null 2>"$TMP/hf.err"
expect "the base exported to Hugging Face" test -s "$TMP/hf/config.json"

# The converter and its gguf-py, at the bundle's commit.
git init -q --bare "$TMP/llama.git"
rev=$(git -C "$TMP/llama.git" bundle unbundle "$BUNDLE" 2>/dev/null | head -1 | cut -d' ' -f1)
mkdir -p "$TMP/llama"
git -C "$TMP/llama.git" archive "$rev" convert_lora_to_gguf.py conversion gguf-py |
    tar -x -C "$TMP/llama"
expect "the converter is in the bundle" test -f "$TMP/llama/convert_lora_to_gguf.py"
PYTHONPATH="$SRC/tests/reference/llama_converter:$TMP/llama/gguf-py:$TMP/llama" \
    /usr/bin/python3 "$SRC/tests/reference/llama_converter/run.py" \
    "$TMP/llama/convert_lora_to_gguf.py" --base "$TMP/hf" --outtype f32 \
    --outfile "$TMP/converted.gguf" "$TMP/ft/peft" >"$TMP/convert.log" 2>&1
expect "llama.cpp's converter makes a GGUF adapter (see convert.log)" test -s "$TMP/converted.gguf"
[ -s "$TMP/converted.gguf" ] || { tail -5 "$TMP/convert.log" >&2; finish; }

loss() { $TLM eval -m "$BASE" --data "$TMP/text.txt" --json -t 1 "$@" 2>/dev/null |
    sed 's/.*"loss": *\([0-9.]*\).*/\1/'; }
lb=$(loss) lc=$(loss --lora "$TMP/converted.gguf") lg=$(loss --lora "$TMP/ft/adapter.gguf")
lp=$(loss --lora "$TMP/ft/peft")
expect "the adapter changes the loss ($lb -> $lg)" test "$lb" != "$lg"
expect "the converted adapter's loss is tlm's GGUF adapter's ($lc, $lg)" test "$lc" = "$lg"
expect "and the PEFT directory's ($lc, $lp)" test "$lc" = "$lp"
gen=(-m "$BASE" -p "Once upon a time" -n 32 --temp 0 -t 1)
out_c=$($TLM generate "${gen[@]}" --lora "$TMP/converted.gguf" 2>/dev/null)
out_g=$($TLM generate "${gen[@]}" --lora "$TMP/ft/adapter.gguf" 2>/dev/null)
expect "the converted adapter continues greedily as tlm's" test -n "$out_c" -a "$out_c" = "$out_g"
finish
