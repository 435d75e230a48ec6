#!/usr/bin/env bash
# Structured output end to end on a random-weight model with Llama 2's 32000-token vocabulary
# (../shared/data/models/llama-2-tiny-random.gguf: at temperature 1 it would emit anything):
# tlm generate --json-schema and --grammar, and tlm serve's response_format, json_schema and
# grammar fields, 200 samples in all, every one parsed and validated against its schema by an
# independent validator (Debian's python3-jsonschema); refusals name what they refuse.
. "$(dirname "$0")/lib.sh"
M=$DATA/models/llama-2-tiny-random.gguf
need "$M"
/usr/bin/python3 -c 'import jsonschema' 2>/dev/null || die "python3-jsonschema is missing (scripts/setup.sh)"

# Schemas with bounded strings and arrays, so that every sample ends well within max_tokens.
cat >"$TMP/person.json" <<'EOF'
{"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
 "age": {"type": "integer"}, "email": {"type": "string", "minLength": 3, "maxLength": 10},
 "tags": {"type": "array", "items": {"enum": ["a", "b", "c\u00e9"]}, "maxItems": 4}},
 "required": ["name", "age"]}
EOF
cat >"$TMP/points.json" <<'EOF'
{"type": "array", "minItems": 1, "maxItems": 3, "items": {"type": "object",
 "properties": {"x": {"type": "number"}, "ok": {"type": ["boolean", "null"]}},
 "required": ["x"], "additionalProperties": false}}
EOF
cat >"$TMP/choice.json" <<'EOF'
{"$defs": {"pt": {"type": "object", "properties": {"kind": {"const": "pt"}, "v": {"type": "integer"}},
 "required": ["kind", "v"]}},
 "anyOf": [{"$ref": "#/$defs/pt"}, {"type": "string", "minLength": 1, "maxLength": 4},
           {"enum": [1, 2, "three", null]}]}
EOF
cat >"$TMP/one.json" <<'EOF'
{"oneOf": [{"type": "integer"}, {"type": "boolean"}, {"const": {"k": [1, 2]}}]}
EOF

# validate SCHEMA FILE: every line of FILE is a JSON text that the schema accepts; properties not
# declared are refused too (additionalProperties absent means none, as in llama.cpp). Prints the
# count of lines checked.
validate() {
    /usr/bin/python3 - "$1" "$2" <<'EOF'
import json, sys, jsonschema
schema = json.load(open(sys.argv[1]))
def strict(s):
    if isinstance(s, dict):
        s = {k: strict(v) for k, v in s.items()}
        if "properties" in s and "additionalProperties" not in s:
            s["additionalProperties"] = False
    elif isinstance(s, list):
        s = [strict(v) for v in s]
    return s
schema = strict(schema)
n = 0
for line in open(sys.argv[2], encoding="utf-8"):
    text = json.loads(line)  # each line is the sample as a JSON string
    value = json.loads(text)
    jsonschema.validate(value, schema)
    n += 1
print(n)
EOF
}

# ---- tlm generate ----
: >"$TMP/gen_person.txt"
fails=0
for seed in 1 2 3 4 5 6 7 8 9 10; do
    "$TLM" generate -m "$M" -n 400 --temp 1 --top-k 0 --top-p 1 --seed $seed -t 1 \
        --json-schema "$TMP/person.json" >"$TMP/out" 2>"$TMP/err" || fails=$((fails + 1))
    /usr/bin/python3 -c 'import json,sys; print(json.dumps(open(sys.argv[1], encoding="utf-8").read()))' \
        "$TMP/out" >>"$TMP/gen_person.txt"
done
expect "generate --json-schema: 10 runs exit 0 ($fails failed)" [ "$fails" = 0 ]
n=$(validate "$TMP/person.json" "$TMP/gen_person.txt" 2>"$TMP/verr")
expect "generate --json-schema: 10 outputs valid ($n; $(tail -1 "$TMP/verr"))" [ "$n" = 10 ]

printf 'root ::= answer ( ", " answer ){0,2}\n# a comment\nanswer ::= "yes" | "no" | [0-9]{2,3} | "\\u00e9t\\u00e9"\n' >"$TMP/g.gbnf"
bad_out=0
for seed in 1 2 3 4 5; do
    out=$("$TLM" generate -m "$M" -n 100 --temp 1 --top-k 0 --seed $seed -t 1 --grammar "$TMP/g.gbnf" 2>/dev/null)
    [[ $out =~ ^(yes|no|[0-9]{2,3}|été)(, (yes|no|[0-9]{2,3}|été)){0,2}$ ]] || {
        bad_out=$((bad_out + 1))
        echo "grammar output: '$out'" >&2
    }
done
expect "generate --grammar: 5 outputs match ($bad_out do not)" [ "$bad_out" = 0 ]

printf '{"type": "string", "pattern": "^a+$"}' >"$TMP/pattern.json"
refuses "--json-schema with pattern" "unsupported keyword 'pattern'" "$TLM" generate -m "$M" --json-schema "$TMP/pattern.json"
printf 'root ::= "a"\nx ::= ( "b"\n' >"$TMP/bad.gbnf"
refuses "malformed grammar" "bad.gbnf: grammar: line 3, column 1: expected ')'" "$TLM" generate -m "$M" --grammar "$TMP/bad.gbnf"
refuses "both flags" "not both" "$TLM" generate -m "$M" --grammar "$TMP/g.gbnf" --json-schema "$TMP/person.json"

# ---- tlm serve: 8 rows at a time, each with its own grammar state ----
"$TLM" serve -m "$M" --port 0 -t 1 --parallel 8 --ctx 512 >"$TMP/serve.out" 2>"$TMP/serve.err" &
T_PIDS+=("$!")
URL=
listening() {
    URL=$(sed -n 's/^listening on \(http:[^ ]*\)\/$/\1/p' "$TMP/serve.out")
    [ -n "$URL" ]
}
wait_until 20 listening || { cat "$TMP/serve.err" >&2; die "tlm serve did not start"; }

# requests, then validation: 176 samples over HTTP (22 requests of n = 8)
/usr/bin/python3 - "$URL" "$TMP" <<'EOF' >"$TMP/serve.log" 2>&1
import json, sys, urllib.request, urllib.error
url, tmp = sys.argv[1], sys.argv[2]
def post(path, body):
    req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)
schemas = {k: json.load(open(f"{tmp}/{k}.json")) for k in ("person", "points", "choice", "one")}
out = {k: open(f"{tmp}/serve_{k}.txt", "w") for k in list(schemas) + ["object"]}
base = {"max_tokens": 400, "temperature": 1, "top_p": 1, "n": 8}
plan = []
for seed in range(4):
    plan.append(("person", "/v1/completions", {"prompt": "x", "response_format": {"type": "json_schema",
                 "json_schema": {"name": "person", "schema": schemas["person"], "strict": True}}}))
    plan.append(("points", "/v1/chat/completions", {"messages": [{"role": "user", "content": "points"}],
                 "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": schemas["points"]}}}))
    plan.append(("choice", "/v1/completions", {"prompt": "y", "json_schema": schemas["choice"]}))
    plan.append(("one", "/v1/chat/completions", {"messages": [{"role": "user", "content": "1"}],
                 "json_schema": schemas["one"], "min_p": 0.01, "top_k": 50, "presence_penalty": 1.5}))
    plan.append(("person", "/v1/completions", {"prompt": "z", "response_format": {"type": "json_object",
                 "schema": schemas["person"]}, "repeat_penalty": 1.3}))
plan.append(("object", "/v1/completions", {"prompt": "o", "grammar": "root ::= \"{\" [ ]? ( \"\\\"k\\\": \" [0-9] )? \"}\""}))
# Any object: its strings have no bound, and this model closes one about once in a few hundred
# tokens, so a sample may reach max_tokens first; those that stop are validated.
plan.append(("object", "/v1/chat/completions", {"messages": [{"role": "user", "content": "{}"}],
             "response_format": {"type": "json_object"}, "max_tokens": 300}))
n_ok = n_length = 0
for i, (kind, path, body) in enumerate(plan):
    st, r = post(path, {**base, **body, "seed": 100 + i})
    assert st == 200, (st, r)
    for c in r["choices"]:
        text = c["message"]["content"] if "message" in c else c["text"]
        if "response_format" in body and body["response_format"]["type"] == "json_object" \
                and "schema" not in body["response_format"] and c["finish_reason"] == "length":
            n_length += 1
            continue
        assert c["finish_reason"] == "stop", (kind, c["finish_reason"], text)
        out[kind].write(json.dumps(text) + "\n")
        n_ok += 1
assert n_length < 8, "every json_object sample reached max_tokens"
for f in out.values():
    f.close()
print("samples", n_ok + n_length)
print("objects stopped", 8 - n_length)
# refusals: 400 naming the problem
for body, needle in [
        ({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"name": "s",
          "schema": {"type": "string", "format": "email"}}}}, "unsupported keyword 'format'"),
        ({"prompt": "x", "json_schema": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 3}}}},
         "at /properties/a: unsupported keyword 'minimum'"),
        ({"prompt": "x", "grammar": "root ::= [a-"}, "line 1, column 10: unterminated character class"),
        ({"prompt": "x", "grammar": "root ::= root \"a\""}, "left-recursive"),
        ({"prompt": "x", "response_format": {"type": "xml"}}, "text, json_object or json_schema"),
        ({"prompt": "x", "grammar": "root ::= \"a\"", "json_schema": {}}, "give one of")]:
    st, r = post("/v1/completions", body)
    assert st == 400 and needle in r["error"]["message"], (st, r, needle)
print("refusals ok")
EOF
rc=$?
expect "serve: requests answered ($(tail -3 "$TMP/serve.log"))" [ $rc = 0 ]
expect "serve: 176 samples, all with schemas stopped by the grammar" grep -q "^samples 176$" "$TMP/serve.log"
expect "serve: 400s name the problem" grep -q "^refusals ok$" "$TMP/serve.log"
total=0
for k in person points choice one; do
    n=$(validate "$TMP/$k.json" "$TMP/serve_$k.txt" 2>"$TMP/verr")
    expect "serve: $k samples valid (${n:-0}; $(tail -1 "$TMP/verr"))" [ -n "$n" ] && [ "$n" -gt 0 ] 2>/dev/null
    total=$((total + ${n:-0}))
done
printf '{"type": "object"}' >"$TMP/object.json"
n=$(validate "$TMP/object.json" "$TMP/serve_object.txt" 2>"$TMP/verr")
stopped=$(sed -n 's/^objects stopped //p' "$TMP/serve.log")
expect "serve: json_object and grammar samples are objects (${n:-0}; $(tail -1 "$TMP/verr"))" \
    [ "${n:-0}" = $((8 + ${stopped:-0})) ]
total=$((total + ${n:-0}))
expect "serve: every sample that stopped validated ($total)" [ "$total" = $((168 + ${stopped:-0})) ]
finish
