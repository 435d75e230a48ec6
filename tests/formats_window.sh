#!/usr/bin/env bash
# Gemma 2 and Mistral's sliding window through GGUF and Hugging Face files, end to end: models
# trained by `tlm train` (a real vocabulary, llama2.c's tok512, so that greedy continuations do
# not collapse into one token) continue a prompt longer than their window with the same ids from
# the checkpoint, the GGUF and the HF directory; without the window they continue otherwise (the
# window is seen). llama.cpp (node-llama-cpp) on the gemma2 GGUF continues exactly like
# `tlm generate`; on Mistral's, llama.cpp's llama has no window and continues like tlm without
# one (the gap docs/formats.md names). The llama.cpp part is skipped without node-llama-cpp.
. "$(dirname "$0")/lib.sh"
set -eo pipefail
need "$DATA/models/tok512.bin" "$DATA/text/tinystories_2MiB.txt"
TOK=$DATA/models/tok512.bin
head -c 300000 "$DATA/text/tinystories_2MiB.txt" >"$TMP/text.txt"

# The same checkpoint with its config's window removed (the header's tlm_config rewritten).
no_window() { # IN.safetensors OUT.safetensors
    /usr/bin/python3 - "$1" "$2" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
c = json.loads(h["__metadata__"]["tlm_config"])
c["sliding_window"] = c["sliding_window_pattern"] = 0
h["__metadata__"]["tlm_config"] = json.dumps(c)
hb = json.dumps(h).encode()
hb += b" " * (-len(hb) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(hb)) + hb + b[8 + n:])
PY
}
gen() { # MODEL "IDS" -> the 32 ids after the prompt
    local all
    all=$("$TLM" generate -m "$1" -z "$TMP/run_g2/tokenizer" --ids "$2" -n 32 --temp 0 --print-ids \
        -t 2 2>/dev/null)
    cut -d' ' -f"$(($(wc -w <<<"$2") + 1))"- <<<"$all"
}
have_node=1
[ -d "$SRC/tests/node/node_modules/node-llama-cpp" ] || have_node=0
llamacpp() { # GGUF "IDS" -> llama.cpp's 32 ids
    node_run llama_greedy.mjs "$1" "$2" 32 | json_get '" ".join(map(str, j["ids"]))'
}

train() { # NAME CONFIG-JSON STEPS
    printf '%s\n' "$2" >"$TMP/$1.json"
    "$TLM" train -c "$TMP/$1.json" --data "$TMP/text.txt" -z "$TOK" -o "$TMP/run_$1" --steps "$3" \
        --batch 8 --lr 1e-2 --warmup 10 --eval-interval 10000 -t 2 >/dev/null 2>&1 ||
        die "tlm train $1 failed"
    "$TLM" convert "$TMP/run_$1" "$TMP/$1.gguf" --to gguf 2>/dev/null || die "$1 to GGUF"
    "$TLM" convert "$TMP/run_$1" "$TMP/$1_hf" --to hf 2>/dev/null || die "$1 to HF"
    no_window "$TMP/run_$1/model.safetensors" "$TMP/$1_nowin.safetensors"
}

# --- Gemma 2: windows of 8 on every other layer, soft-caps, post norms, GeGLU ------------------
train g2 '{"context_length": 128, "d_model": 64, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2,
  "d_ff": 128, "ffn": "geglu", "post_norms": true, "embed_scale": 8.0, "attn_softcap": 5.0,
  "final_softcap": 10.0, "sliding_window": 8, "sliding_window_pattern": 2}' 400
prompt="1 $("$TLM" tokenize -z "$TOK" <<<"Once upon a time, there was a little girl named Lily. \
She loved to play outside in the park with her friends." | tr '\n' ' ' | sed 's/ *$//')"
[ "$(wc -w <<<"$prompt")" -gt 16 ] || die "the prompt is not longer than the window"
grep -q '"architectures":	\["Gemma2ForCausalLM"\]' "$TMP/g2_hf/config.json" || die "HF config"
ref=$(gen "$TMP/run_g2" "$prompt")
[ "$(wc -w <<<"$ref")" -eq 32 ] || die "tlm generated '$ref'"
expect "gemma2 GGUF continues as the checkpoint" test "$(gen "$TMP/g2.gguf" "$prompt")" = "$ref"
expect "Gemma2ForCausalLM continues as the checkpoint" test "$(gen "$TMP/g2_hf" "$prompt")" = "$ref"
expect "the window changes the continuation" test "$(gen "$TMP/g2_nowin.safetensors" "$prompt")" != "$ref"
if [ "$have_node" = 1 ]; then
    theirs=$(llamacpp "$TMP/g2.gguf" "$prompt")
    expect "llama.cpp on gemma2: '$theirs' vs tlm '$ref'" test "$theirs" = "$ref"
    echo "llama.cpp == tlm on gemma2: $theirs"
fi
# llama.cpp's own converter on tlm's Gemma2ForCausalLM export (its +1 on the norms, its keys):
# the GGUF it writes continues as the checkpoint. Its source is LLAMA_CPP_DIR (else ../llama.cpp
# next to the repository); without one this check is left out.
LLAMA_SRC=${LLAMA_CPP_DIR:-$SRC/../llama.cpp}
if [ -f "$LLAMA_SRC/conversion/gemma.py" ]; then
    PYTHONPATH="$SRC/tests/reference/llama_converter:$LLAMA_SRC/gguf-py:$LLAMA_SRC" \
        /usr/bin/python3 "$SRC/tests/reference/llama_converter/run_novocab.py" "$LLAMA_SRC" \
        "$LLAMA_SRC/convert_hf_to_gguf.py" "$TMP/g2_hf" --outfile "$TMP/g2_conv.gguf" \
        --outtype f32 >"$TMP/conv.log" 2>&1 || die "convert_hf_to_gguf.py: $(tail -3 "$TMP/conv.log")"
    expect "llama.cpp's converter's gemma2 GGUF continues as the checkpoint" \
        test "$(gen "$TMP/g2_conv.gguf" "$prompt")" = "$ref"
else
    echo "no llama.cpp source at $LLAMA_SRC: its converter not run"
fi

# --- Mistral: a window of 8 on every layer (arch llama, MistralForCausalLM) ---------------------
train mistral '{"context_length": 128, "d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
  "d_ff": 128, "sliding_window": 8}' 200
grep -q '"sliding_window":	8' "$TMP/mistral_hf/config.json" || die "Mistral's HF config"
ref=$(gen "$TMP/run_mistral" "$prompt")
nowin=$(gen "$TMP/mistral_nowin.safetensors" "$prompt")
expect "llama GGUF with a window continues as the checkpoint" test "$(gen "$TMP/mistral.gguf" "$prompt")" = "$ref"
expect "MistralForCausalLM continues as the checkpoint" test "$(gen "$TMP/mistral_hf" "$prompt")" = "$ref"
expect "the window changes Mistral's continuation" test "$nowin" != "$ref"
if [ "$have_node" = 1 ]; then
    theirs=$(llamacpp "$TMP/mistral.gguf" "$prompt")
    expect "llama.cpp on llama with a window: '$theirs' vs tlm without it '$nowin'" \
        test "$theirs" = "$nowin"
fi

# --- refusals by name ---------------------------------------------------------------------------
set +e # the refused command fails
/usr/bin/python3 - "$TMP/g2.gguf" "$TMP/g3.gguf" <<'PY'
import sys
b = open(sys.argv[1], "rb").read()
# the architecture's value, "gemma2" -> "gemma3" (same length, so offsets hold)
i = b.index(b"general.architecture") + len("general.architecture") + 4 + 8
assert b[i:i + 6] == b"gemma2"
open(sys.argv[2], "wb").write(b[:i] + b"gemma3" + b[i + 6:])
PY
refuses "gemma3 GGUF" "'gemma3' is not supported: its per-head q and k norms" \
    "$TLM" generate -m "$TMP/g3.gguf" --ids 1 -n 1
if [ "$have_node" = 0 ]; then
    finish
    skip "node-llama-cpp is not installed in $SRC/tests/node/node_modules (bash scripts/setup.sh): llama.cpp not compared"
fi
finish
