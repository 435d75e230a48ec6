#!/usr/bin/env bash
# What speculative decoding buys one stream: decode tokens/s of plain decoding against a draft
# model and against n-gram lookup, in tlm generate, tlm serve and llama-server (llama.cpp's
# speculative decoding: -md with --spec-type draft-simple, and --spec-type ngram-simple over
# n-grams of 4 as tlm's lookup starts from, proposing up to 16 as tlm's --draft-max), on the
# same GGUF files, greedy. The target (d 512, 8 layers) and the draft (d 128, 2 layers) are
# trained by tlm on the same text with the same tokenizer (llama's 32000 ids), briefly: enough for
# them to agree on much of what they write. Two prompts: a story start (the draft's case) and a
# text to copy out (lookup's case: the output repeats the input). Rounds alternate the sides;
# figures are medians, with the acceptance (accepted / drafted ids) of the last round. Output:
# bench/out/speculative/ and, with README=1 (default), the table in bench/README.md between
# <!-- speculative:begin --> and <!-- speculative:end -->.
# The draft proposes at any confidence (--draft-p-min P_MIN, 0 as llama-server's default): briefly
# trained over 32000 ids, it is seldom 75% sure of an id, and at tlm's default of 0.75 it would
# propose nothing.
# Env: ROUNDS (3), N (128 tokens), THREADS (2), STEPS (training steps of each model: 100), P_MIN.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$ROOT/bench/out/speculative
W=$OUT/work
ROUNDS=${ROUNDS:-3} N=${N:-128} THREADS=${THREADS:-2} README=${README:-1} STEPS=${STEPS:-100}
P_MIN=${P_MIN:-0}
DATA=${TLM_SHARED_DATA:-$ROOT/../shared/data}
TLM=$ROOT/build/tlm
. "$ROOT/bench/lib.sh"
LLAMA=${LLAMA_BIN:-/work/llama.cpp/build/bin}
PY=/usr/bin/python3
make -C "$ROOT" >/dev/null
mkdir -p "$W"
unset OPENBLAS_CORETYPE # both sides: OpenBLAS's own choice of kernels
[ -x "$LLAMA/llama-server" ] || { echo "no llama-server in $LLAMA (set LLAMA_BIN)" >&2; exit 1; }

TOK=$DATA/tokenizers/ggml-vocab-llama-spm.gguf
TEXT=$DATA/text/tinystories_2MiB.txt
model() { # NAME D LAYERS HEADS: trained and written as GGUF once, kept in $W
  local name=$1 d=$2 layers=$3 heads=$4
  [ -f "$W/$name.gguf" ] && return
  echo "training the $name (d $d, $layers layers, $STEPS steps) ..." >&2
  cat >"$W/$name.json" <<CFG
{"vocab_size": 32000, "context_length": 1024, "d_model": $d, "n_layers": $layers,
 "n_heads": $heads, "n_kv_heads": $heads, "d_ff": $((d * 8 / 3 / 64 * 64 + 64)), "norm": "rmsnorm",
 "ffn": "swiglu", "position": "rope", "rope_pairing": "interleaved", "tie_embeddings": false,
 "bias": false}
CFG
  "$TLM" train -c "$W/$name.json" --data "$TEXT" -z "$TOK" -o "$W/$name" --steps "$STEPS" \
    --batch 8 --seq-len 64 --lr 2e-3 --warmup 20 --eval-interval 0 -t "$THREADS" \
    2>"$OUT/$name.train.log"
  "$TLM" convert "$W/$name" "$W/$name.gguf" --to gguf -z "$TOK" 2>>"$OUT/$name.train.log"
}
model target 512 8 8
model draft 128 2 2
T=$W/target.gguf D=$W/draft.gguf

# The prompts: a story's start, and a passage with the request to write it out again.
story="Once upon a time, there was a little girl named Lily. She loved to play outside."
passage=$(head -c 1200 "$TEXT" | tr '\n' ' ' | sed 's/"//g; s/\\//g' | cut -c 1-600)
copy="$passage Here is the same story again: ${passage:0:60}"

# tlm generate: the decode rate (ids after the first per second) and, speculating, the counts.
gen() { # NAME PROMPT ARGS...
  local name=$1 prompt=$2
  shift 2
  "$TLM" generate -m "$T" -p "$prompt" -n "$N" --temp 0 -t "$THREADS" "$@" 2>"$W/$name.err" \
    >/dev/null
  sed -n 's/.*generation: [0-9]* tokens, [0-9]* decode steps in [0-9.]* s (\([0-9.]*\) tok\/s).*/\1/p' \
    "$W/$name.err" >>"$W/$name.rates"
  sed -n 's/.*: \([0-9]*\) ids proposed, \([0-9]*\) accepted.*/\2 \1/p' "$W/$name.err" \
    >"$W/$name.acc"
}

# Servers (tlm serve and llama-server), one slot each: each started for its turn alone and stopped
# after it (an idle server beside a measured one slows it on 2 cores).
SPID=
cleanup() { [ -z "$SPID" ] || kill "$SPID" 2>/dev/null || true; }
trap cleanup EXIT
LS=("$LLAMA/llama-server" -m "$T" -t "$THREADS" -tb "$THREADS" -np 1 -c 1024 --no-webui)
server() { # NAME: its command line
  case $1 in
    tlm_plain) echo "$TLM serve -m $T -t $THREADS --parallel 1 --ctx 1024" ;;
    tlm_draft) echo "$TLM serve -m $T -t $THREADS --parallel 1 --ctx 1024 -md $D --draft-p-min $P_MIN" ;;
    tlm_lookup) echo "$TLM serve -m $T -t $THREADS --parallel 1 --ctx 1024 --lookup" ;;
    lc_plain) echo "${LS[*]}" ;;
    lc_draft) echo "${LS[*]} -md $D --spec-type draft-simple --spec-draft-n-max 16 --spec-draft-p-min $P_MIN -td $THREADS" ;;
    lc_lookup) echo "${LS[*]} --spec-type ngram-simple --spec-ngram-simple-size-n 4 --spec-ngram-simple-size-m 16" ;;
  esac
}
# One server's turn: started, both prompts posted (predicted_per_second, and draft_n_accepted
# draft_n where given), stopped.
turn() { # NAME
  local name=$1 url=http://127.0.0.1:18471
  # shellcheck disable=SC2046 # the command line is words (paths without spaces)
  $(server "$name") --port 18471 >"$W/$name.srv.log" 2>&1 &
  SPID=$!
  for _ in $(seq 1 300); do
    curl -sf "$url/health" >/dev/null 2>&1 && break
    sleep 1
  done
  curl -sf "$url/health" >/dev/null || { cat "$W/$name.srv.log" >&2; exit 1; }
  for p in story copy; do
    prompt=$story
    [ $p = copy ] && prompt=$copy
    $PY - "$url/completion" "$prompt" "$N" "$W/${name}_$p.rates" "$W/${name}_$p.acc" <<'PY'
import json, sys, urllib.request
url, prompt, n, rates, acc = sys.argv[1:6]
body = json.dumps({"prompt": prompt, "n_predict": int(n), "temperature": 0, "cache_prompt": False,
                   "ignore_eos": True}).encode()
r = json.load(urllib.request.urlopen(urllib.request.Request(
    url, body, {"Content-Type": "application/json"}), timeout=3600))
t = r["timings"]
open(rates, "a").write(f'{t["predicted_per_second"]}\n')
open(acc, "w").write(f'{t.get("draft_n_accepted", 0)} {t.get("draft_n", 0)}\n')
PY
  done
  kill "$SPID"
  wait "$SPID" 2>/dev/null || true
  SPID=
}

rm -f "$W"/*.rates "$W"/*.acc
echo "$ROUNDS alternated rounds ..." >&2
for _ in $(seq 1 "$ROUNDS"); do
  for p in story copy; do
    prompt=$story
    [ $p = copy ] && prompt=$copy
    gen "gen_plain_$p" "$prompt"
    gen "gen_draft_$p" "$prompt" -md "$D" --draft-p-min "$P_MIN"
    gen "gen_lookup_$p" "$prompt" --lookup
  done
  for s in tlm_plain tlm_draft tlm_lookup lc_plain lc_draft lc_lookup; do turn $s; done
done
rate() { printf '%.1f' "$(median <"$1")"; } # FILE: the median of its rates, to one decimal
acc() { awk '{ if ($2 > 0) printf "%.0f%%", 100 * $1 / $2; else printf "-" }' "$1"; }
{
  echo "Measured by \`bash bench/speculative/spec.sh\` on $(date -u '+%Y-%m-%d %H:%M') UTC, tlm \`$(git -C "$ROOT" rev-parse --short HEAD)\`:"
  echo "target d 512 / 8 layers, draft d 128 / 2 layers (vocabulary 32000, F32 GGUF, $STEPS steps each"
  echo "on TinyStories), greedy, $N tokens, one stream, $THREADS threads, draft p-min $P_MIN, median"
  echo "decode tokens/s of $ROUNDS alternated rounds (acceptance: accepted / drafted ids, last round)."
  echo
  echo "| prompt | engine | plain | draft model | (accepted) | x plain | lookup | (accepted) | x plain |"
  echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
  for p in story copy; do
    for e in gen tlm lc; do
      label="tlm generate"
      [ $e = tlm ] && label="tlm serve"
      [ $e = lc ] && label="llama-server"
      pl=$(rate "$W/${e}_plain_$p.rates") dr=$(rate "$W/${e}_draft_$p.rates")
      lk=$(rate "$W/${e}_lookup_$p.rates")
      echo "| $p | $label | $pl | $dr | $(acc "$W/${e}_draft_$p.acc") | $(ratio "$dr" "$pl") |" \
        "$lk | $(acc "$W/${e}_lookup_$p.acc") | $(ratio "$lk" "$pl") |"
    done
  done
} >"$OUT/results.md"
cat "$OUT/results.md"
if [ "$README" = 1 ]; then
  $PY "$ROOT/bench/readme_section.py" speculative "$OUT/results.md"
  echo "rewrote bench/README.md's speculative table" >&2
fi
