#!/usr/bin/env bash
# tlm serve end to end on the pretrained stories260K (../shared/data): curl for the HTTP edges
# (health, metrics, 404, 401, 413, malformed bodies, 429 with Retry-After, SIGTERM draining the
# running streams and exiting 0), then the official `openai` npm package and a bounded load test
# (tests/node/serve_clients.mjs), and the page at / in headless Chromium (tests/node/serve_page.mjs).
set -u
TLM=${TLM:-build/tlm}
SRC=${TLM_SOURCE_DIR:-.}
DATA=${TLM_SHARED_DATA:-$SRC/../shared/data}
M=$DATA/models/stories260K.gguf
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
expect() { # expect DESCRIPTION CONDITION...
    local d=$1; shift
    if "$@"; then ok; else bad "$d"; fi
}
[ -f "$M" ] || { echo "FAIL: $M is missing" >&2; exit 1; }
tmp=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    [ -n "${KEEP_TMP:-}" ] && cp -r "$tmp" /tmp/srv_keep; rm -rf "$tmp"
}
trap cleanup EXIT

# start NAME ARGS...: runs tlm serve on a free port; sets URL and PID.
start() {
    local name=$1; shift
    "$TLM" serve -m "$M" --port 0 -t 1 "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" &
    PID=$!
    pids+=("$PID")
    URL=
    for _ in $(seq 100); do
        URL=$(sed -n 's/^listening on \(http:[^ ]*\)\/$/\1/p' "$tmp/$name.out")
        [ -n "$URL" ] && break
        sleep 0.1
    done
    [ -n "$URL" ] || { cat "$tmp/$name.err" >&2; bad "$name did not start"; exit 1; }
}
# status METHOD PATH [curl args...]: prints the HTTP status; the body goes to $tmp/body.
status() {
    local method=$1 path=$2; shift 2
    curl -s -o "$tmp/body" -w '%{http_code}' -X "$method" "$URL$path" "$@"
}
is_error_body() { # an OpenAI-style error object
    /usr/bin/python3 -c "import json,sys; e=json.load(open(sys.argv[1]))['error']; sys.exit(0 if e['message'] and e['type'] else 1)" "$tmp/body"
}

# Refusals at start-up: one line naming the problem, exit 1.
refuses() { # DESCRIPTION PATTERN ARGS...
    local d=$1 pat=$2 err rc; shift 2
    err=$("$TLM" serve "$@" 2>&1 >/dev/null); rc=$?
    expect "$d: exit 1" [ "$rc" = 1 ]
    expect "$d: names the problem ($err)" grep -q -- "$pat" <<<"$err"
}
refuses "unknown template" "is not one of chatml" -m "$M" --chat-template vicuna
refuses "not an address" "IPv4 address" -m "$M" --host localhost:80
refuses "ctx beyond the model" "exceeds the model" -m "$M" --ctx 1000000 --port 0
refuses "bad parallel" "parallel" -m "$M" --parallel 0
refuses "bad cache-ram" "cache-ram" -m "$M" --cache-ram -5
refuses "no model" "MODEL is required" --port 0
refuses "bad cache type" "cache-type must be one of f16, f32" -m "$M" --cache-type q4_k

KEY=sekrit
start main --parallel 4 --ctx 256 --api-key "$KEY" --max-body 65536
AUTH=(-H "Authorization: Bearer $KEY")
# stories260K: 5 layers x 2 x 4 kv heads x 8 x 256 positions x 4 slots, halves
expect "start-up line: the F16 cache and its size ($(head -1 "$tmp/main.out"))" \
    grep -q "4 slots of 256 positions, KV cache f16 (0.6 MiB)" "$tmp/main.out"
expect "health" [ "$(status GET /health)" = 200 ]
expect "page at /" [ "$(status GET /)" = 200 ]
expect "the page is the embedded one" grep -q "<title>tlm" "$tmp/body"
expect "401 without the key" [ "$(status GET /v1/models)" = 401 ]
is_error_body && ok || bad "401 body"
expect "models with the key" [ "$(status GET /v1/models "${AUTH[@]}")" = 200 ]
expect "404" [ "$(status GET /v2/nothing "${AUTH[@]}")" = 404 ]
is_error_body && ok || bad "404 body"
expect "malformed JSON" [ "$(status POST /v1/completions "${AUTH[@]}" -d '{"prompt": ')" = 400 ]
is_error_body && ok || bad "400 body"
expect "wrong type" [ "$(status POST /v1/chat/completions "${AUTH[@]}" -d '{"messages": "hi"}')" = 400 ]
printf '{"prompt": "\xff\xfe"}' >"$tmp/bad_utf8"
expect "invalid UTF-8" [ "$(status POST /v1/completions "${AUTH[@]}" --data-binary @"$tmp/bad_utf8")" = 400 ]
head -c 100000 /dev/zero | tr '\0' 'a' >"$tmp/big"
expect "413 for a body over --max-body" [ "$(status POST /v1/completions "${AUTH[@]}" --data-binary @"$tmp/big")" = 413 ]
expect "huge max_tokens" [ "$(status POST /v1/completions "${AUTH[@]}" -d '{"prompt":"a","max_tokens":1e12}')" = 400 ]
expect "n beyond --parallel" [ "$(status POST /v1/completions "${AUTH[@]}" -d '{"prompt":"a","n":5}')" = 400 ]
expect "tokenize" [ "$(status POST /tokenize "${AUTH[@]}" -d '{"content":"Once upon a time","add_special":true}')" = 200 ]
ids=$(/usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['tokens'])" "$tmp/body")
want=$("$TLM" generate -m "$M" -p "Once upon a time" -n 0 --print-ids 2>/dev/null | tr ' ' ',')
expect "tokenize gives tlm generate's ids ($ids vs [$want])" [ "$ids" = "[${want//,/, }]" ]
expect "detokenize" [ "$(status POST /detokenize "${AUTH[@]}" -d "{\"tokens\":$ids}")" = 200 ]
expect "detokenize round trip" grep -q '"content":"Once upon a time"' "$tmp/body"
expect "stream ends with [DONE]" [ "$(status POST /v1/completions "${AUTH[@]}" -d '{"prompt":"Once","max_tokens":5,"stream":true}')" = 200 ]
expect "SSE body" [ "$(tail -c 14 "$tmp/body")" = 'data: [DONE]' ]

# The official client and the load test.
"$TLM" generate -m "$M" -p "Once upon a time" -n 40 --temp 0 2>/dev/null | tail -c +17 >"$tmp/greedy"
slack=8192
ldd "$TLM" 2>/dev/null | grep -q -e libasan -e libtsan && slack=1048576 # sanitizer quarantines
if (cd "$SRC/tests/node" && node serve_clients.mjs "$URL" "$KEY" "$PID" "$tmp/greedy" "$slack"); then ok; else bad "openai client tests"; fi
if (cd "$SRC/tests/node" && node serve_page.mjs "$URL" "$KEY"); then ok; else bad "the page in Chromium"; fi
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
    curl -sN -D "$tmp/h$k" -o "$tmp/s$k" -w '%{http_code}' "$URL/v1/completions" -d "$body" \
        >"$tmp/code$k" &
    cpids+=($!)
done
sleep 0.5
kill -TERM "$PID"
wait "$PID"
expect "SIGTERM while streaming exits 0" [ $? = 0 ]
wait "${cpids[@]}"
refused=0 finished=0
for k in 1 2 3; do
    code=$(cat "$tmp/code$k")
    if [ "$code" = 429 ]; then
        refused=$((refused + 1))
        expect "Retry-After on 429" grep -qi '^Retry-After: 1' "$tmp/h$k"
        cp "$tmp/s$k" "$tmp/body"
        is_error_body && ok || bad "429 body"
    elif [ "$code" = 200 ] && [ "$(tail -c 14 "$tmp/s$k")" = 'data: [DONE]' ]; then
        finished=$((finished + 1))
    fi
done
expect "one request refused with 429 ($refused)" [ "$refused" = 1 ]
expect "the running and the queued stream finished after SIGTERM ($finished)" [ "$finished" = 2 ]

echo "serve.sh: $pass passed, $fail failed"
[ "$fail" = 0 ]
