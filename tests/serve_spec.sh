#!/usr/bin/env bash
# Speculative decoding in tlm serve: with the model as its own draft (every proposal accepted), a
# draft of random weights (most rejected, so the cache is cut back often) and n-gram lookup, each
# answer is the one the server without speculation gives: greedy text and ids over several
# prompts, requests running together in the slots, seeded sampling, a grammar, n_probs,
# logit_bias and stop words. Also llama-server's timings draft_n / draft_n_accepted, the
# per-request speculative.* fields, /metrics' counts and the command line's refusals.
. "$(dirname "$0")/lib.sh"
M=$DATA/models/stories260K.gguf
need "$M"

# A draft over the model's vocabulary of 512 ids, random weights (seed 7): it drafts at every step
# (--draft-min 1) and is mostly rejected.
python3 - "$TMP/draft.safetensors" <<'EOF'
import json, random, struct, sys
d, V, ff, L = 32, 512, 128, 2
cfg = {"vocab_size": V, "context_length": 512, "d_model": d, "n_layers": L, "n_heads": 2}
shapes = [("token_embd.weight", (V, d))]
for l in range(L):
    p = f"blk.{l}."
    shapes += [(p + "attn_norm.weight", (d,)), (p + "attn_q.weight", (d, d)),
               (p + "attn_k.weight", (d, d)), (p + "attn_v.weight", (d, d)),
               (p + "attn_output.weight", (d, d)), (p + "ffn_norm.weight", (d,)),
               (p + "ffn_gate.weight", (ff, d)), (p + "ffn_up.weight", (ff, d)),
               (p + "ffn_down.weight", (d, ff))]
shapes.append(("output_norm.weight", (d,)))
rng = random.Random(7)
header, blobs, off = {"__metadata__": {"tlm_config": json.dumps(cfg)}}, [], 0
for name, shape in shapes:
    n = shape[0] * (shape[1] if len(shape) > 1 else 1)
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

start() { # NAME FLAGS...: a server; its URL in U_NAME
    local name=$1
    shift
    "$TLM" serve -m "$M" --port 0 -t 1 --parallel 3 --ctx 512 "$@" >"$TMP/$name.out" \
        2>"$TMP/$name.err" &
    T_PIDS+=("$!")
}
url() { sed -n 's/^listening on \(http:[^ ]*\)\/$/\1/p' "$TMP/$1.out"; }
start plain
start own -md "$M" --draft-p-min 0
start rand -md "$TMP/draft.safetensors" --draft-p-min 0 --draft-max 4 --draft-min 1
start lookup --lookup
for s in plain own rand lookup; do
    listening() { [ -n "$(url "$s")" ]; }
    wait_until 20 listening || { cat "$TMP/$s.err" >&2; die "the server '$s' did not start"; }
done
post() { # SERVER PATH BODY OUT: the answer in OUT, the status printed
    curl -s -m 120 -o "$4" -w '%{http_code}' -X POST "$(url "$1")$2" -H "Content-Type: application/json" \
        -d "$3"
}

prompts=("Once upon a time" "Lily and Ben went to the park. Lily and Ben went to the park. Lily"
    "One day, a little dog" "The cat sat on the mat. The cat sat on the mat. The cat sat")
bodies=()
for p in "${prompts[@]}"; do
    bodies+=("{\"prompt\": \"$p\", \"n_predict\": 40, \"temperature\": 0, \"return_tokens\": true}")
done
bodies+=('{"prompt": "Once upon a time", "n_predict": 40, "temperature": 0.9, "seed": 42, "return_tokens": true}'
    '{"prompt": "Once upon a time", "n_predict": 30, "temperature": 0, "return_tokens": true, "grammar": "root ::= [a-z ]+ \".\""}'
    '{"prompt": "Once upon a time", "n_predict": 12, "temperature": 0, "n_probs": 3, "return_tokens": true}'
    '{"prompt": "Once upon a time", "n_predict": 40, "temperature": 0, "return_tokens": true, "logit_bias": [[279, false], [304, -2]]}'
    '{"prompt": "Once upon a time", "n_predict": 40, "temperature": 0, "return_tokens": true, "stop": ["her"]}')
names=(greedy0 greedy1 greedy2 greedy3 seeded grammar n_probs bias stop)
# What an answer must agree on: the text, the ids, how it stopped, and n_probs' ids.
fields='[j["content"], j["tokens"], j["stop_type"], j["stopping_word"], [[p["id"], [t["id"] for t in p["top_logprobs"]]] for p in j.get("completion_probabilities", [])]]'

# One request at a time, then all of them at once (the slots decode together, prompts prefill
# beside decoding slots).
for s in plain own rand lookup; do
    for i in "${!bodies[@]}"; do
        post "$s" /completion "${bodies[$i]}" "$TMP/$s.seq.$i" >"$TMP/$s.seq.$i.code"
    done
    pids=()
    for i in "${!bodies[@]}"; do
        post "$s" /completion "${bodies[$i]}" "$TMP/$s.par.$i" >"$TMP/$s.par.$i.code" &
        pids+=("$!")
    done
    wait "${pids[@]}"
done
for i in "${!bodies[@]}"; do
    n=${names[$i]}
    expect "plain $n: 200" [ "$(cat "$TMP/plain.seq.$i.code")" = 200 ]
    want=$(json_get "$fields" "$TMP/plain.seq.$i")
    for s in own rand lookup; do
        for mode in seq par; do
            expect "$s $mode $n: 200" [ "$(cat "$TMP/$s.$mode.$i.code")" = 200 ]
            got=$(json_get "$fields" "$TMP/$s.$mode.$i")
            expect "$s $mode $n: the answer without speculation (got $got, want $want)" \
                [ "$got" = "$want" ]
        done
    done
done
expect "the grammar's answer follows it" \
    [ "$(json_get '__import__("re").fullmatch("[a-z ]+[.]", j["content"]) is not None' "$TMP/plain.seq.5")" = true ]
expect "the stop word ended an answer" [ "$(json_get 'j["stop_type"]' "$TMP/plain.seq.8")" = word ]

# timings: llama-server's draft counts where something was drafted, none without speculation
expect "no draft_n without speculation" \
    [ "$(json_get '"draft_n" in j["timings"]' "$TMP/plain.seq.0")" = false ]
tm='[j["timings"].get("draft_n", 0), j["timings"].get("draft_n_accepted", -1)]'
own=$(json_get "$tm" "$TMP/own.seq.0")
expect "own draft: proposals, all accepted ($own)" \
    [ "$(json_get 'j[0] > 0 and j[0] == j[1]' <<<"$own")" = true ]
rand=$(json_get "$tm" "$TMP/rand.seq.0")
expect "random draft: proposals, few accepted ($rand)" \
    [ "$(json_get 'j[0] > 0 and j[1] < j[0]' <<<"$rand")" = true ]
look=$(json_get "$tm" "$TMP/lookup.seq.3")
expect "lookup on a repeating prompt: accepted proposals ($look)" \
    [ "$(json_get 'j[0] > 0 and j[1] > 0' <<<"$look")" = true ]

# speculative.n_max 0: none for that request; other values bounded like llama-server's
post own /completion '{"prompt": "Once upon a time", "n_predict": 20, "temperature": 0, "speculative.n_max": 0}' \
    "$TMP/off" >/dev/null
expect "speculative.n_max 0: nothing drafted" [ "$(json_get '"draft_n" in j["timings"]' "$TMP/off")" = false ]
post plain /completion '{"prompt": "Once upon a time", "n_predict": 20, "temperature": 0}' "$TMP/off.plain" >/dev/null
expect "speculative.n_max 0: the same text" \
    [ "$(json_get 'j["content"]' "$TMP/off")" = "$(json_get 'j["content"]' "$TMP/off.plain")" ]
post own /completion '{"prompt": "Once upon a time", "n_predict": 20, "temperature": 0, "speculative.n_max": 2, "speculative.n_min": 2, "speculative.p_min": 0}' \
    "$TMP/two" >/dev/null
expect "speculative.n_max 2, n_min 2: drafts of 2" \
    [ "$(json_get 'j["timings"]["draft_n"] > 0 and j["timings"]["draft_n"] % 2 == 0' "$TMP/two")" = true ]
expect "speculative.p_min 2 is refused" \
    [ "$(post own /completion '{"prompt": "a", "speculative.p_min": 2}' "$TMP/bad")" = 400 ]
expect "the refusal names the field" grep -q 'speculative.p_min' "$TMP/bad"

# /props: the server's limits, as llama-server shows them
curl -s "$(url rand)/props" >"$TMP/props"
expect "/props: speculative.n_max, n_min, p_min" [ "$(json_get '[j["default_generation_settings"]["params"]["speculative." + k] for k in ("n_max", "n_min", "p_min")]' "$TMP/props")" = "[4, 1, 0]" ]

# /metrics: the server's counts
curl -s "$(url own)/metrics" >"$TMP/metrics"
expect "metrics: ids drafted" grep -q '^tlm_draft_tokens_total [1-9]' "$TMP/metrics"
expect "metrics: ids accepted" grep -q '^tlm_draft_tokens_accepted_total [1-9]' "$TMP/metrics"

# The command line
"$TLM" serve -m "$M" --port 0 -md "$M" --lookup >/dev/null 2>"$TMP/err"
expect "-md with --lookup: refused" grep -q "not both" "$TMP/err"
"$TLM" serve -m "$M" --port 0 --lookup --draft-max 2 --draft-min 3 >/dev/null 2>"$TMP/err"
expect "--draft-min over --draft-max: refused" grep -q "more than --draft-max" "$TMP/err"
"$TLM" serve -m "$M" --port 0 -md "$TMP/none.gguf" >/dev/null 2>"$TMP/err"
expect "a missing draft: refused" grep -q "draft model" "$TMP/err"
"$TLM" serve -m "$M" --port 0 --lookup --draft-p-min 2 >/dev/null 2>"$TMP/err"
expect "--draft-p-min 2: refused" grep -q "draft-p-min wants" "$TMP/err"
finish
