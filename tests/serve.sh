#!/usr/bin/env bash
# tlm serve end to end on the pretrained stories260K (../shared/data): curl for the HTTP edges
# (health, metrics, 404, 401, 413, malformed bodies, 429 with Retry-After, SIGTERM draining the
# running streams and exiting 0), then the official `openai` npm package and a bounded load test
# with every kind of request in the mix (tests/node/serve_clients.mjs), and the page at / in
# headless Chromium (tests/node/serve_page.mjs).
. "$(dirname "$0")/lib.sh"
M=$DATA/models/stories260K.gguf
need "$M"

# start NAME ARGS...: runs tlm serve on a free port; sets URL and PID.
start() {
    local name=$1
    shift
    "$TLM" serve -m "$M" --port 0 -t 1 "$@" >"$TMP/$name.out" 2>"$TMP/$name.err" &
    PID=$!
    T_PIDS+=("$PID")
    URL=
    listening() {
        URL=$(sed -n 's/^listening on \(http:[^ ]*\)\/$/\1/p' "$TMP/$name.out")
        [ -n "$URL" ]
    }
    wait_until 10 listening || { cat "$TMP/$name.err" >&2; die "$name did not start"; }
}
# status METHOD PATH [curl args...]: prints the HTTP status; the body goes to $TMP/body.
status() {
    local method=$1 path=$2; shift 2
    curl -s -o "$TMP/body" -w '%{http_code}' -X "$method" "$URL$path" "$@"
}
is_error_body() { # an OpenAI-style error object
    [ "$(json_get 'bool(j["error"]["message"] and j["error"]["type"])' "$TMP/body")" = true ]
}

# Refusals at start-up: one line naming the problem, exit 1.
serve_refuses() { # DESCRIPTION PATTERN ARGS...
    local d=$1 pat=$2
    shift 2
    refuses "$d" "$pat" "$TLM" serve "$@"
    expect "$d: exit 1" [ "$RC" = 1 ]
}
serve_refuses "unknown template" "is not one of chatml" -m "$M" --chat-template vicuna
serve_refuses "not an address" "IPv4 address" -m "$M" --host localhost:80
serve_refuses "ctx beyond the model" "exceeds the model" -m "$M" --ctx 1000000 --port 0
serve_refuses "bad parallel" "parallel" -m "$M" --parallel 0
serve_refuses "bad cache-ram" "cache-ram" -m "$M" --cache-ram -5
serve_refuses "no model" "MODEL is required" --port 0
serve_refuses "bad cache type" "cache-type must be one of f16, f32" -m "$M" --cache-type q4_k

KEY=sekrit
start main --parallel 4 --ctx 640 --api-key "$KEY" --max-body 65536
AUTH=(-H "Authorization: Bearer $KEY")
# stories260K: 5 layers x 2 x 4 kv heads x 8 x 640 positions x 4 slots, halves
expect "start-up line: the F16 cache and its size ($(head -1 "$TMP/main.out"))" \
    grep -q "4 slots of 640 positions, KV cache f16 (1.6 MiB)" "$TMP/main.out"
expect "health" [ "$(status GET /health)" = 200 ]
expect "page at /" [ "$(status GET /)" = 200 ]
expect "the page is the embedded one" grep -q "<title>tlm" "$TMP/body"
expect "401 without the key" [ "$(status GET /v1/models)" = 401 ]
is_error_body && ok || bad "401 body"
expect "models with the key" [ "$(status GET /v1/models "${AUTH[@]}")" = 200 ]
expect "404" [ "$(status GET /v2/nothing "${AUTH[@]}")" = 404 ]
is_error_body && ok || bad "404 body"
expect "malformed JSON" [ "$(status POST /v1/completions "${AUTH[@]}" -d '{"prompt": ')" = 400 ]
is_error_body && ok || bad "400 body"
expect "wrong type" [ "$(status POST /v1/chat/completions "${AUTH[@]}" -d '{"messages": "hi"}')" = 400 ]
printf '{"prompt": "\xff\xfe"}' >"$TMP/bad_utf8"
expect "invalid UTF-8" [ "$(status POST /v1/completions "${AUTH[@]}" --data-binary @"$TMP/bad_utf8")" = 400 ]
head -c 100000 /dev/zero | tr '\0' 'a' >"$TMP/big"
expect "413 for a body over --max-body" [ "$(status POST /v1/completions "${AUTH[@]}" --data-binary @"$TMP/big")" = 413 ]
expect "huge max_tokens" [ "$(status POST /v1/completions "${AUTH[@]}" -d '{"prompt":"a","max_tokens":1e12}')" = 400 ]
expect "n beyond --parallel" [ "$(status POST /v1/completions "${AUTH[@]}" -d '{"prompt":"a","n":5}')" = 400 ]
expect "tokenize" [ "$(status POST /tokenize "${AUTH[@]}" -d '{"content":"Once upon a time","add_special":true}')" = 200 ]
ids=$(json_get 'j["tokens"]' "$TMP/body")
want=$("$TLM" generate -m "$M" -p "Once upon a time" -n 0 --print-ids 2>/dev/null | tr ' ' ',')
expect "tokenize gives tlm generate's ids ($ids vs [$want])" [ "$ids" = "[${want//,/, }]" ]
expect "detokenize" [ "$(status POST /detokenize "${AUTH[@]}" -d "{\"tokens\":$ids}")" = 200 ]
expect "detokenize round trip" grep -q '"content":"Once upon a time"' "$TMP/body"
expect "stream ends with [DONE]" [ "$(status POST /v1/completions "${AUTH[@]}" -d '{"prompt":"Once","max_tokens":5,"stream":true}')" = 200 ]
expect "SSE body" [ "$(tail -c 14 "$TMP/body")" = 'data: [DONE]' ]

# The official client and the load test.
"$TLM" generate -m "$M" -p "Once upon a time" -n 40 --temp 0 2>/dev/null | tail -c +17 >"$TMP/greedy"
slack=8192
ldd "$TLM" 2>/dev/null | grep -q -e libasan -e libtsan && slack=1048576 # sanitizer quarantines
expect "openai client tests" node_run serve_clients.mjs "$URL" "$KEY" "$PID" "$TMP/greedy" "$slack"
expect "the page in Chromium" node_run serve_page.mjs "$URL" "$KEY"
expect "the server still answers" [ "$(status GET /health)" = 200 ]
kill -TERM "$PID"
wait "$PID"
expect "SIGTERM exits 0" [ $? = 0 ]

# A full queue answers 429 with Retry-After; SIGTERM lets running streams finish. One slot and a
# queue of one: of three requests sent at once, whichever comes third is refused while the first
# still generates (up to the whole context: seconds).
start small --parallel 1 --queue 1
body='{"prompt":"Once upon a time","temperature":0,"stream":true}'
cpids=()
for k in 1 2 3; do
    curl -sN -D "$TMP/h$k" -o "$TMP/s$k" -w '%{http_code}' "$URL/v1/completions" -d "$body" \
        >"$TMP/code$k" &
    cpids+=($!)
done
sleep 0.5
kill -TERM "$PID"
wait "$PID"
expect "SIGTERM while streaming exits 0" [ $? = 0 ]
wait "${cpids[@]}"
refused=0 finished=0
for k in 1 2 3; do
    code=$(cat "$TMP/code$k")
    if [ "$code" = 429 ]; then
        refused=$((refused + 1))
        expect "Retry-After on 429" grep -qi '^Retry-After: 1' "$TMP/h$k"
        cp "$TMP/s$k" "$TMP/body"
        is_error_body && ok || bad "429 body"
    elif [ "$code" = 200 ] && [ "$(tail -c 14 "$TMP/s$k")" = 'data: [DONE]' ]; then
        finished=$((finished + 1))
    fi
done
expect "one request refused with 429 ($refused)" [ "$refused" = 1 ]
expect "the running and the queued stream finished after SIGTERM ($finished)" [ "$finished" = 2 ]

finish
