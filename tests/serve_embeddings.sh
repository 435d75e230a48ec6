#!/usr/bin/env bash
# tlm serve --embeddings: POST /v1/embeddings (OpenAI's shape: strings, arrays of them, token ids,
# base64) and llama-server's /embeddings (per-token rows with pooling none), their normalizations
# and refusals; the vectors against llama-server's on the same GGUF for pooling mean, last and
# none, when llama-server is at $LLAMA_SERVER (else those comparisons are skipped); and the
# official openai client's embeddings.create.
. "$(dirname "$0")/lib.sh"
M=$DATA/models/stories260K.gguf
need "$M"
LLAMA_SERVER=${LLAMA_SERVER:-/work/llama.cpp/build/bin/llama-server}

# start NAME COMMAND...: a server in the background; its URL in $URL once it listens
start() {
    local name=$1
    shift
    "$@" >"$TMP/$name.out" 2>"$TMP/$name.err" &
    PID=$!
    T_PIDS+=("$PID")
}
stop() { kill "$PID" 2>/dev/null; wait "$PID" 2>/dev/null; }
tlm_up() { URL=$(sed -n 's/^listening on \(http:[^ ]*\)\/$/\1/p' "$TMP/$1.out" 2>/dev/null); [ -n "$URL" ]; }
tlm_serve() { # NAME ARGS...: tlm serve on a free port
    local name=$1
    shift
    start "$name" "$TLM" serve -m "$M" --port 0 -t 1 --parallel 2 --ctx 256 "$@"
    wait_until 10 tlm_up "$name" || { cat "$TMP/$name.err" >&2; die "tlm serve ($name) did not start"; }
}
post() { # URL PATH BODY [OUT]: the answer in OUT ($TMP/body), the status printed
    curl -s -o "${4:-$TMP/body}" -w '%{http_code}' -X POST "$1$2" -H "Content-Type: application/json" -d "$3"
}
j() { json_get "$1" "$TMP/body"; }
# close A B TOL: the embeddings of two answers (either shape) agree within TOL, elementwise. Against
# llama-server the tolerance is its rounding: its attention products round queries and
# probabilities to F16 against the F16 cache (with flash attention or without), where tlm widens
# the cache to floats; about 6e-4 of the largest magnitude in the rows, 2e-4 in unit vectors.
close() {
    /usr/bin/python3 - "$1" "$2" "$3" <<'PY'
import json, sys
def vecs(p):
    j = json.load(open(p))
    rows = [e["embedding"] for e in j["data"]] if isinstance(j, dict) else [e["embedding"] for e in j]
    flat = []
    for r in rows:
        flat.extend(x for v in (r if isinstance(r[0], list) else [r]) for x in v)
    return flat
a, b = vecs(sys.argv[1]), vecs(sys.argv[2])
d = max((abs(x - y) for x, y in zip(a, b)), default=float("inf"))
# "rel:T": T times the largest magnitude (rows that are not normalized)
t = sys.argv[3]
tol = float(t[4:]) * max(abs(x) for x in a) if t.startswith("rel:") else float(t)
ok = len(a) == len(b) and len(a) > 0 and d <= tol
print(f"{len(a)} and {len(b)} values, largest difference {d:.3g}", file=sys.stderr)
sys.exit(0 if ok else 1)
PY
}

TEXT='Once upon a time, there was a little girl named Lily.'
INPUTS="[\"$TEXT\", \"The cat sat on the mat.\", \"\"]"

# Without --embeddings: 501, as llama-server
tlm_serve plain
expect "no --embeddings: /v1/embeddings is 501" [ "$(post "$URL" /v1/embeddings '{"input": "a"}')" = 501 ]
expect "... naming the flag" grep -q -- "--embeddings" "$TMP/body"
expect "no --embeddings: /embeddings is 501" [ "$(post "$URL" /embeddings '{"content": "a"}')" = 501 ]
stop

# Pooling none (the default for a GGUF without pooling_type): per-token rows, unnormalized
tlm_serve none --embeddings
expect "the default pooling of a generative model is none" grep -q "pooling none" "$TMP/none.out"
expect "pooling none: /v1/embeddings refused" [ "$(post "$URL" /v1/embeddings '{"input": "a"}')" = 400 ]
expect "... saying why" grep -q "not OAI compatible" "$TMP/body"
expect "/embeddings" [ "$(post "$URL" /embeddings "{\"content\": \"$TEXT\"}" "$TMP/tlm_none.json")" = 200 ]
cp "$TMP/tlm_none.json" "$TMP/body"
n_tok=$(post "$URL" /tokenize "{\"content\": \"$TEXT\", \"add_special\": true}" >/dev/null; j 'len(j["tokens"])')
cp "$TMP/tlm_none.json" "$TMP/body"
expect "one row per token ($n_tok)" [ "$(j 'len(j[0]["embedding"])')" = "$n_tok" ]
expect "rows of d_model (64) values" [ "$(j 'sorted(set(len(r) for r in j[0]["embedding"]))')" = "[64]" ]
expect "rows are not normalized" [ "$(j 'any(abs(sum(x * x for x in r) - 1) > 0.1 for r in j[0]["embedding"])')" = true ]
expect "the per-token rows as token ids give the same rows" \
    [ "$(post "$URL" /embeddings "{\"content\": $(post "$URL" /tokenize "{\"content\": \"$TEXT\", \"add_special\": true}" >/dev/null; j 'j["tokens"]')}" "$TMP/ids.json")" = 200 ]
expect "... equal" close "$TMP/ids.json" "$TMP/tlm_none.json" 0
stop

# Pooling mean and last: OpenAI's shape, L2-normalized
for pool in mean last; do
    tlm_serve "$pool" --embeddings --pooling "$pool"
    expect "$pool: /v1/embeddings of 3 inputs" [ "$(post "$URL" /v1/embeddings "{\"input\": $INPUTS, \"model\": \"m\"}" "$TMP/tlm_$pool.json")" = 200 ]
    cp "$TMP/tlm_$pool.json" "$TMP/body"
    expect "$pool: object list, model echoed" [ "$(j '[j["object"], j["model"]]')" = '["list", "m"]' ]
    expect "$pool: data in order" [ "$(j '[(d["object"], d["index"], len(d["embedding"])) for d in j["data"]]')" = \
        '[["embedding", 0, 64], ["embedding", 1, 64], ["embedding", 2, 64]]' ]
    expect "$pool: unit length" [ "$(j 'all(abs(sum(x * x for x in d["embedding"]) - 1) < 1e-5 for d in j["data"])')" = true ]
    expect "$pool: usage counts every input's tokens" [ "$(j 'j["usage"]["prompt_tokens"] == j["usage"]["total_tokens"] and j["usage"]["prompt_tokens"] > 14')" = true ]
    expect "$pool: inputs differ" [ "$(j 'j["data"][0]["embedding"] != j["data"][1]["embedding"]')" = true ]
    # the same input alone, and as llama-server's content: the same vector
    post "$URL" /embeddings "{\"content\": \"$TEXT\"}" >/dev/null
    expect "$pool: /embeddings nests the one pooled vector" [ "$(j 'len(j[0]["embedding"]), len(j[0]["embedding"][0])')" = '[1, 64]' ]
    /usr/bin/python3 -c 'import json,sys; a=json.load(open(sys.argv[1])); json.dump({"data":[a["data"][0]]}, open(sys.argv[2],"w"))' "$TMP/tlm_$pool.json" "$TMP/first.json"
    expect "$pool: an input alone gives the vector it has among others" close "$TMP/body" "$TMP/first.json" 1e-6
    # embd_normalize: -1 leaves it unnormalized, 1 the taxicab norm
    post "$URL" /embeddings "{\"content\": \"$TEXT\", \"embd_normalize\": 1}" >/dev/null
    expect "$pool: embd_normalize 1 (taxicab)" [ "$(j 'abs(sum(abs(x) for x in j[0]["embedding"][0]) - 1) < 1e-5')" = true ]
    post "$URL" /embeddings "{\"content\": \"$TEXT\", \"embd_normalize\": -1}" >/dev/null
    expect "$pool: embd_normalize -1 (none)" [ "$(j 'abs(sum(x * x for x in j[0]["embedding"][0]) - 1) > 0.01')" = true ]
    # base64: the same floats, little-endian
    post "$URL" /v1/embeddings "{\"input\": \"$TEXT\", \"encoding_format\": \"base64\"}" >/dev/null
    expect "$pool: base64 decodes to the float vector" [ "$(/usr/bin/python3 -c '
import base64, json, struct, sys
a = json.load(open(sys.argv[1]))["data"][0]
b = json.load(open(sys.argv[2]))["data"][0]["embedding"]
v = struct.unpack("<64f", base64.b64decode(a["embedding"]))
print(a["encoding_format"] == "base64" and max(abs(x - y) for x, y in zip(v, b)) < 1e-6)' "$TMP/body" "$TMP/first.json")" = True ]
    if [ "$pool" = mean ]; then
        # refusals: 400 naming the problem, and the server still answers after them
        for bad in '{}' '{"input": 5}' '{"input": []}' '{"input": [[]]}' '{"input": [1, "a"]}' \
            '{"input": [99999]}' '{"input": [-1]}' '{"input": [1.5]}' '{"input": "a", "encoding_format": "x"}' \
            '{"input": "a", "embd_normalize": "2"}' '{"input": {"a": 1}}' '[1]' 'not json' \
            "{\"input\": \"$(printf 'word %.0s' $(seq 1 400))\"}"; do
            code=$(post "$URL" /v1/embeddings "$bad")
            expect "refused with 400: $(head -c 60 <<<"$bad") (got $code)" [ "$code" = 400 ]
            expect "... with a message" [ -n "$(j 'j["error"]["message"]')" ]
        done
        expect "too long: names the context" grep -q "context" "$TMP/body"
        expect "still serving" [ "$(post "$URL" /v1/embeddings '{"input": "a"}')" = 200 ]
        # generation goes on beside embeddings
        expect "completions with --embeddings" [ "$(post "$URL" /v1/completions '{"prompt": "Once", "max_tokens": 4}')" = 200 ]
        if [ -d "$SRC/tests/node/node_modules/openai" ]; then
            expect "the openai client's embeddings.create" node_run serve_embeddings.mjs "$URL" "$TMP/tlm_mean.json"
        else
            echo "no tests/node/node_modules/openai (scripts/setup.sh installs it): the client check is skipped"
        fi
    fi
    stop
done

# The same vectors as llama-server's on the same file
if [ -x "$LLAMA_SERVER" ]; then
    port=$((20000 + RANDOM % 20000))
    for pool in mean last none; do
        start "llama_$pool" "$LLAMA_SERVER" -m "$M" --embeddings --pooling "$pool" --port "$port" -t 1 -c 256 -np 1
        ls_up() { curl -sf "http://127.0.0.1:$port/health" >/dev/null; }
        wait_until 30 ls_up || { cat "$TMP/llama_$pool.err" >&2; die "llama-server did not start"; }
        if [ "$pool" = none ]; then
            post "http://127.0.0.1:$port" /embeddings "{\"content\": \"$TEXT\"}" "$TMP/ls_none.json" >/dev/null
            expect "llama-server's per-token rows: as tlm's" close "$TMP/ls_none.json" "$TMP/tlm_none.json" rel:1e-3
        else
            for i in 0 1 2; do
                post "http://127.0.0.1:$port" /v1/embeddings "{\"input\": $(/usr/bin/python3 -c 'import json,sys; print(json.dumps(json.loads(sys.argv[1])[int(sys.argv[2])]))' "$INPUTS" "$i")}" "$TMP/ls_$pool.$i.json" >/dev/null
                /usr/bin/python3 -c 'import json,sys; a=json.load(open(sys.argv[1])); json.dump({"data":[a["data"][int(sys.argv[3])]]}, open(sys.argv[2],"w"))' "$TMP/tlm_$pool.json" "$TMP/tlm_$pool.$i.json" "$i"
                expect "pooling $pool, input $i: llama-server's vector" close "$TMP/ls_$pool.$i.json" "$TMP/tlm_$pool.$i.json" 5e-4
            done
        fi
        stop
    done
else
    echo "no llama-server at $LLAMA_SERVER: the comparisons with it are skipped"
fi
finish
