#!/usr/bin/env bash
# tlm serve with LoRA adapters, as llama-server's API has them: GET/POST /lora-adapters, a
# request's own "lora" scales, and requests with different adapters decoded in the same steps,
# each continuing as tlm generate does with the same adapter and scale.
. "$(dirname "$0")/lib.sh"
M=$DATA/models/stories260K.gguf
need "$M"
toy_text "$TMP/text.txt"
"$TLM" finetune -m "$M" --data "$TMP/text.txt" -o "$TMP/ft" --steps 20 --batch 4 --seq-len 32 \
    --lr 5e-3 --eval-interval 0 -t 1 2>/dev/null || die "finetune failed"
A=$TMP/ft/adapter.gguf

"$TLM" serve -m "$M" --port 0 -t 1 --parallel 3 --lora "$A" >"$TMP/s.out" 2>"$TMP/s.err" &
PID=$!
T_PIDS+=("$PID")
URL=
listening() {
    URL=$(sed -n 's/^listening on \(http:[^ ]*\)\/$/\1/p' "$TMP/s.out")
    [ -n "$URL" ]
}
wait_until 10 listening || { cat "$TMP/s.err" >&2; die "serve did not start"; }

code() { curl -s -o "$TMP/body" -w '%{http_code}' "$@"; }
expect "GET /lora-adapters" [ "$(code "$URL/lora-adapters")" = 200 ]
expect "one adapter, scale 1, its path" \
    [ "$(json_get '[(a["id"], a["scale"], a["path"].endswith("adapter.gguf")) for a in j]' "$TMP/body")" = "[[0, 1, true]]" ]

P="Once upon a time"
complete() { # [LORA_JSON]: the greedy completion's text
    local extra=${1:+, \"lora\": $1}
    curl -s "$URL/v1/completions" -d "{\"prompt\": \"$P\", \"max_tokens\": 20, \"temperature\": 0$extra}" |
        json_get 'j["choices"][0]["text"]'
}
gen() { # generate's continuation (its output less the prompt)
    local out
    out=$("$TLM" generate -m "$M" -p "$P" -n 20 --temp 0 -t 1 "$@" 2>/dev/null)
    printf '%s' "${out#"$P"}"
}
want_lora=$(gen --lora "$A")
want_base=$(gen)
want_half=$(gen --lora "$A:0.5")
expect "the adapter changes the continuation" [ "$want_lora" != "$want_base" ]
got=$(complete)
expect "default: the adapter at scale 1, as generate --lora ('$got')" [ "$got" = "$want_lora" ]
got=$(complete '[{"id": 0, "scale": 0}]')
expect "a request's scale 0 is the base ('$got')" [ "$got" = "$want_base" ]
got=$(complete '[]')
expect "an empty list turns adapters off" [ "$got" = "$want_base" ]
got=$(complete '[{"id": 0, "scale": 0.5}]')
expect "a request's scale 0.5, as generate --lora A:0.5" [ "$got" = "$want_half" ]

# Three requests with three scales at once: batched in the same steps, each as alone.
curls=()
for s in 0 0.5 1; do
    curl -s "$URL/v1/completions" -d "{\"prompt\": \"$P\", \"max_tokens\": 20, \"temperature\": 0, \"lora\": [{\"id\": 0, \"scale\": $s}]}" >"$TMP/c$s.json" &
    curls+=($!)
done
wait "${curls[@]}"
expect "concurrent scale 0" [ "$(json_get 'j["choices"][0]["text"]' "$TMP/c0.json")" = "$want_base" ]
expect "concurrent scale 0.5" [ "$(json_get 'j["choices"][0]["text"]' "$TMP/c0.5.json")" = "$want_half" ]
expect "concurrent scale 1" [ "$(json_get 'j["choices"][0]["text"]' "$TMP/c1.json")" = "$want_lora" ]

# POST sets the scales of requests without their own; unlisted adapters go to 0.
expect "POST /lora-adapters" [ "$(code "$URL/lora-adapters" -d '[{"id": 0, "scale": 0.5}]')" = 200 ]
expect "POST answers success" grep -q '"success"' "$TMP/body"
code "$URL/lora-adapters" >/dev/null
expect "GET shows the new scale" [ "$(json_get '[a["scale"] for a in j]' "$TMP/body")" = "[0.5]" ]
got=$(complete)
expect "requests follow the new scale" [ "$got" = "$want_half" ]
code "$URL/lora-adapters" -d '[]' >/dev/null
got=$(complete)
expect "POST [] turns it off" [ "$got" = "$want_base" ]
got=$(complete '[{"id": 0, "scale": 1}]')
expect "a request still picks its own" [ "$got" = "$want_lora" ]

# Refusals name the problem.
expect "unknown id in a request: 400" [ "$(code "$URL/v1/completions" -d '{"prompt": "a", "lora": [{"id": 3, "scale": 1}]}')" = 400 ]
expect "names the id" grep -q "no adapter 3" "$TMP/body"
expect "unknown id in POST: 400" [ "$(code "$URL/lora-adapters" -d '[{"id": 1, "scale": 1}]')" = 400 ]
expect "not a list: 400" [ "$(code "$URL/lora-adapters" -d '{"id": 0}')" = 400 ]
expect "scale not a number: 400" [ "$(code "$URL/v1/completions" -d '{"prompt": "a", "lora": [{"id": 0, "scale": "x"}]}')" = 400 ]
kill -TERM "$PID"
wait "$PID"
expect "serve exits 0" [ $? = 0 ]

# An adapter for another model is refused at start-up.
"$TLM" serve -m "$DATA/models/llama-2-tiny-random.gguf" --port 0 --lora "$A" >/dev/null 2>"$TMP/bad.err"
expect "adapter for another model: exit 1" [ $? = 1 ]
expect "says so" grep -q "LoRA adapter" "$TMP/bad.err"
finish
